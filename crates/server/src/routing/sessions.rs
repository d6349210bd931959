//! The session table: bare JID → bound resources, sharded so that routing
//! takes no global lock (DESIGN.md invariant 2). Locks are held for a map
//! operation only, never across an `.await`.
//!
//! In a cluster (`crate::cluster`) the table also holds the sessions of the
//! other nodes, as their registry events describe them: a slot without a
//! mailbox, whose [`SessionRef`] names its node. Routing then finds every
//! resource of an account in one local lookup, wherever it is bound. The
//! table tells an observer (the cluster) of each change to its own
//! sessions. Two binds of one full JID on different nodes: the later bind
//! wins (ties: the higher node id), on every node alike.

use starling_core::{SessionEntry, SessionHandle, SessionManager, SessionRef, TooManyResources};
use starling_proto::{BareJid, FullJid};
use starling_xml::Element;
use std::collections::hash_map::{DefaultHasher, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

const SHARDS: usize = 64;

/// One bound resource: what modules see, and the mailbox only the router
/// uses (`None`: the session is on another node).
struct Slot {
    entry: SessionEntry,
    handle: Option<SessionHandle>,
    /// When it was bound (µs since the Unix epoch): which of two binds of
    /// one full JID on different nodes wins.
    bound_at: u64,
    /// Told to close to make room for a new resource of its account
    /// (`max_resources`): no longer counted against the limit, nor chosen
    /// again, while it finishes.
    evicted: bool,
}

impl Slot {
    /// A freshly bound session, not available yet.
    fn new(session: SessionRef, handle: Option<SessionHandle>, bound_at: u64) -> Slot {
        Slot {
            entry: SessionEntry {
                session,
                priority: None,
                presence: None,
            },
            handle,
            bound_at,
            evicted: false,
        }
    }
}

type Shard = RwLock<HashMap<BareJid, Vec<Slot>>>;

/// Told of every change to this node's own sessions (the cluster's
/// registry publisher). Called after the table changed, outside its locks.
pub trait TableObserver: Send + Sync + 'static {
    /// A session was bound here.
    fn bound(&self, session: &SessionRef, bound_at: u64);
    /// A session bound here ended.
    fn unbound(&self, session: &SessionRef);
    /// A session's availability changed.
    fn presence(&self, session: &SessionRef, presence: Option<(i8, Arc<Element>)>);
}

/// What a bind replaced.
#[derive(Debug)]
pub enum Replaced {
    /// A session of this node: tell it to close.
    Local(SessionHandle),
    /// A session of another node: ask that node to close it.
    Remote(SessionRef),
}

/// What a bind changed besides adding the session.
#[derive(Debug, Default)]
pub struct Registered {
    /// The session that held the same full JID.
    pub replaced: Option<Replaced>,
    /// The account's longest-detached session, which must close to make
    /// room (the account was at its `max_resources`).
    pub evicted: Option<SessionHandle>,
}

/// A session of this node as the registry describes it.
#[derive(Clone, Debug)]
pub struct LocalSession {
    /// The session and its availability.
    pub entry: SessionEntry,
    /// When it was bound (µs since the Unix epoch).
    pub bound_at: u64,
}

/// The sharded in-memory session table.
pub struct SessionTable {
    shards: Box<[Shard]>,
    /// Sessions of this node.
    count: AtomicUsize,
    node: u8,
    observer: std::sync::OnceLock<Arc<dyn TableObserver>>,
}

/// Microseconds since the Unix epoch.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Does a bind at (`a_at`, node `a_node`) win over one at (`b_at`, `b_node`)?
fn newer(a_at: u64, a_node: u8, b_at: u64, b_node: u8) -> bool {
    (a_at, a_node) > (b_at, b_node)
}

impl Default for SessionTable {
    fn default() -> Self {
        Self::new(0)
    }
}

impl SessionTable {
    /// An empty table of node `node`.
    pub fn new(node: u8) -> Self {
        SessionTable {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
            count: AtomicUsize::new(0),
            node,
            observer: std::sync::OnceLock::new(),
        }
    }

    /// This node's id.
    pub fn node(&self) -> u8 {
        self.node
    }

    /// Sessions bound on this node.
    pub fn local_count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Sets the observer of this node's session changes (once).
    pub fn set_observer(&self, o: Arc<dyn TableObserver>) {
        let _ = self.observer.set(o);
    }

    fn shard(&self, bare: &BareJid) -> &Shard {
        let mut h = DefaultHasher::new();
        bare.as_str().hash(&mut h);
        &self.shards[(h.finish() as usize) % SHARDS]
    }

    /// Binds `jid` to `handle`. If a session already holds this full JID it
    /// is replaced and returned, so the router can tell it to close with
    /// `<conflict/>`. A new resource of an account holding `max_resources`
    /// (counting the other nodes' sessions this table knows of) evicts the
    /// account's longest-detached local session, or is refused when none
    /// is detached. Checked and recorded under one shard lock, so two
    /// binds at once cannot both take the last place.
    pub fn register(
        &self,
        jid: &FullJid,
        handle: SessionHandle,
        max_resources: usize,
    ) -> Result<Registered, TooManyResources> {
        let bare = jid.to_bare();
        let bound_at = now_us();
        let session = SessionRef {
            jid: jid.clone(),
            node: self.node,
            id: handle.id,
        };
        let mut done = Registered::default();
        {
            let mut shard = self.shard(&bare).write().unwrap_or_else(|e| e.into_inner());
            // Most accounts have one or two resources: size exactly.
            let slots = shard.entry(bare).or_insert_with(|| Vec::with_capacity(1));
            let new = Slot::new(session.clone(), Some(handle), bound_at);
            match slots.iter_mut().find(|s| s.entry.jid() == jid) {
                Some(slot) => {
                    let old = std::mem::replace(slot, new);
                    done.replaced = Some(match old.handle {
                        Some(h) => Replaced::Local(h),
                        None => {
                            self.count.fetch_add(1, Ordering::Relaxed);
                            Replaced::Remote(old.entry.session)
                        }
                    });
                }
                None => {
                    let counted = slots.iter().filter(|s| !s.evicted).count();
                    if counted >= max_resources {
                        let oldest = slots
                            .iter_mut()
                            .filter(|s| !s.evicted)
                            .filter_map(|s| {
                                let at = s.handle.as_ref()?.detached_since()?;
                                Some((at, s))
                            })
                            .min_by_key(|(at, _)| *at);
                        let Some((_, victim)) = oldest else {
                            return Err(TooManyResources(max_resources));
                        };
                        victim.evicted = true;
                        done.evicted = victim.handle.clone();
                    }
                    self.count.fetch_add(1, Ordering::Relaxed);
                    slots.push(new);
                }
            }
        }
        if let Some(o) = self.observer.get() {
            o.bound(&session, bound_at);
        }
        Ok(done)
    }

    /// A session bound on another node (a registry event). If this node
    /// holds the same full JID from an earlier bind, that session loses
    /// and is returned (close it); a later local bind keeps its place and
    /// the remote one is not recorded.
    pub fn remote_bound(&self, session: &SessionRef, bound_at: u64) -> Option<SessionHandle> {
        let bare = session.jid.to_bare();
        let mut shard = self.shard(&bare).write().unwrap_or_else(|e| e.into_inner());
        let slots = shard.entry(bare).or_insert_with(|| Vec::with_capacity(1));
        let new = Slot::new(session.clone(), None, bound_at);
        match slots.iter_mut().find(|s| s.entry.jid() == &session.jid) {
            Some(slot) if slot.entry.session == *session => {
                // Already known (a snapshot and an event both said so).
                None
            }
            Some(slot) => {
                if !newer(
                    bound_at,
                    session.node,
                    slot.bound_at,
                    slot.entry.session.node,
                ) {
                    return None;
                }
                let old = std::mem::replace(slot, new);
                if old.handle.is_some() {
                    self.count.fetch_sub(1, Ordering::Relaxed);
                }
                old.handle
            }
            None => {
                slots.push(new);
                None
            }
        }
    }

    /// A session of another node ended (a registry event).
    pub fn remote_unbound(&self, session: &SessionRef) {
        if session.node == self.node {
            return;
        }
        self.remove_exact(session);
    }

    /// A remote session's availability (a registry event).
    pub fn remote_presence(&self, session: &SessionRef, presence: Option<(i8, Arc<Element>)>) {
        if session.node == self.node {
            return;
        }
        let bare = session.jid.to_bare();
        let mut shard = self.shard(&bare).write().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = shard
            .get_mut(&bare)
            .and_then(|v| v.iter_mut().find(|s| s.entry.session == *session))
        {
            s.entry.priority = presence.as_ref().map(|(p, _)| *p);
            s.entry.presence = presence.map(|(_, el)| el);
        }
    }

    /// Forgets every session of `node` (it left, died or restarted) and
    /// returns them.
    pub fn remove_node(&self, node: u8) -> Vec<SessionEntry> {
        if node == self.node {
            return Vec::new();
        }
        let mut gone = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.write().unwrap_or_else(|e| e.into_inner());
            shard.retain(|_, slots| {
                slots.retain(|s| {
                    let theirs = s.handle.is_none() && s.entry.session.node == node;
                    if theirs {
                        gone.push(s.entry.clone());
                    }
                    !theirs
                });
                !slots.is_empty()
            });
        }
        gone
    }

    /// This node's own sessions.
    pub fn local_sessions(&self) -> Vec<LocalSession> {
        self.sessions(true)
    }

    /// Every session this node knows of: its own, and with `local_only`
    /// false those of the other cluster nodes (the registry kept by the
    /// bus's events).
    pub fn sessions(&self, local_only: bool) -> Vec<LocalSession> {
        let mut out = Vec::with_capacity(self.count());
        for shard in self.shards.iter() {
            let shard = shard.read().unwrap_or_else(|e| e.into_inner());
            for s in shard
                .values()
                .flatten()
                .filter(|s| !local_only || s.handle.is_some())
            {
                out.push(LocalSession {
                    entry: s.entry.clone(),
                    bound_at: s.bound_at,
                });
            }
        }
        out
    }

    /// Sessions of other nodes, by node.
    pub fn remote_counts(&self) -> std::collections::BTreeMap<u8, usize> {
        let mut out = std::collections::BTreeMap::new();
        for shard in self.shards.iter() {
            let shard = shard.read().unwrap_or_else(|e| e.into_inner());
            for s in shard.values().flatten().filter(|s| s.handle.is_none()) {
                *out.entry(s.entry.session.node).or_insert(0) += 1;
            }
        }
        out
    }

    /// Removes the slot of exactly this session; true if it was there.
    fn remove_exact(&self, session: &SessionRef) -> bool {
        let bare = session.jid.to_bare();
        let mut shard = self.shard(&bare).write().unwrap_or_else(|e| e.into_inner());
        let Some(slots) = shard.get_mut(&bare) else {
            return false;
        };
        let before = slots.len();
        slots.retain(|s| s.entry.session != *session);
        let removed = slots.len() < before;
        if slots.is_empty() {
            shard.remove(&bare);
        }
        removed
    }

    /// The mailbox of exactly this session, if it is still bound.
    pub fn handle(&self, r: &SessionRef) -> Option<SessionHandle> {
        let bare = r.jid.to_bare();
        let shard = self.shard(&bare).read().unwrap_or_else(|e| e.into_inner());
        shard
            .get(&bare)?
            .iter()
            .find(|s| s.entry.session == *r)
            .and_then(|s| s.handle.clone())
    }

    /// True if `r` is bound (on any node, as far as this table knows).
    pub fn contains(&self, r: &SessionRef) -> bool {
        let bare = r.jid.to_bare();
        let shard = self.shard(&bare).read().unwrap_or_else(|e| e.into_inner());
        shard
            .get(&bare)
            .is_some_and(|v| v.iter().any(|s| s.entry.session == *r))
    }

    /// The session bound to `jid`, with its mailbox (`None` if remote).
    pub fn get_with_handle(&self, jid: &FullJid) -> Option<(SessionEntry, Option<SessionHandle>)> {
        let bare = jid.to_bare();
        let shard = self.shard(&bare).read().unwrap_or_else(|e| e.into_inner());
        shard
            .get(&bare)?
            .iter()
            .find(|s| s.entry.jid() == jid)
            .map(|s| (s.entry.clone(), s.handle.clone()))
    }

    /// Every bound resource of `bare`, with its mailbox (`None` if remote).
    pub fn resources_with_handles(
        &self,
        bare: &BareJid,
    ) -> Vec<(SessionEntry, Option<SessionHandle>)> {
        let shard = self.shard(bare).read().unwrap_or_else(|e| e.into_inner());
        shard
            .get(bare)
            .map(|v| {
                v.iter()
                    .map(|s| (s.entry.clone(), s.handle.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl SessionManager for SessionTable {
    fn unregister(&self, jid: &FullJid, session_id: u64) {
        let session = SessionRef {
            jid: jid.clone(),
            node: self.node,
            id: session_id,
        };
        if self.remove_exact(&session) {
            self.count.fetch_sub(1, Ordering::Relaxed);
            if let Some(o) = self.observer.get() {
                o.unbound(&session);
            }
        }
    }

    fn set_presence(&self, jid: &FullJid, session_id: u64, presence: Option<(i8, Arc<Element>)>) {
        let session = SessionRef {
            jid: jid.clone(),
            node: self.node,
            id: session_id,
        };
        let bare = jid.to_bare();
        let changed = {
            let mut shard = self.shard(&bare).write().unwrap_or_else(|e| e.into_inner());
            match shard
                .get_mut(&bare)
                .and_then(|v| v.iter_mut().find(|s| s.entry.session == session))
            {
                Some(s) => {
                    s.entry.priority = presence.as_ref().map(|(p, _)| *p);
                    s.entry.presence = presence.clone().map(|(_, el)| el);
                    true
                }
                None => false,
            }
        };
        if changed {
            if let Some(o) = self.observer.get() {
                o.presence(&session, presence);
            }
        }
    }

    fn get(&self, jid: &FullJid) -> Option<SessionEntry> {
        let bare = jid.to_bare();
        let shard = self.shard(&bare).read().unwrap_or_else(|e| e.into_inner());
        shard
            .get(&bare)?
            .iter()
            .find(|s| s.entry.jid() == jid)
            .map(|s| s.entry.clone())
    }

    fn resources(&self, bare: &BareJid) -> Vec<SessionEntry> {
        let shard = self.shard(bare).read().unwrap_or_else(|e| e.into_inner());
        shard
            .get(bare)
            .map(|v| v.iter().map(|s| s.entry.clone()).collect())
            .unwrap_or_default()
    }

    fn has_resources(&self, bare: &BareJid) -> bool {
        let shard = self.shard(bare).read().unwrap_or_else(|e| e.into_inner());
        shard.get(bare).is_some_and(|r| !r.is_empty())
    }

    fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn handle(id: u64) -> SessionHandle {
        // The receiver is dropped: these tests never deliver.
        starling_core::mailbox(id, 1, usize::MAX).0
    }

    fn reg(t: &SessionTable, j: &FullJid, h: SessionHandle) -> Registered {
        t.register(j, h, usize::MAX).expect("no limit")
    }

    #[test]
    fn register_beyond_max_resources_evicts_longest_detached_else_refuses() {
        let t = SessionTable::new(0);
        let jid = |r: &str| FullJid::new(&format!("a@x/{r}")).unwrap();
        let (h1, h2, h3) = (handle(1), handle(2), handle(3));
        t.register(&jid("1"), h1.clone(), 2).unwrap();
        t.register(&jid("2"), h2.clone(), 2).unwrap();
        // At the limit with every session connected: refused, unchanged.
        assert_eq!(
            t.register(&jid("3"), h3.clone(), 2).unwrap_err(),
            TooManyResources(2)
        );
        assert_eq!(t.resources(&jid("1").to_bare()).len(), 2);
        assert_eq!(t.count(), 2);
        // Rebinding a held full JID is a replacement, never refused.
        let h4 = handle(4);
        let again = t.register(&jid("2"), h4.clone(), 2).unwrap();
        assert!(matches!(again.replaced, Some(Replaced::Local(ref h)) if h.id == 2));
        // Two detached: the one detached longer goes first.
        h1.set_detached(true);
        // Detachment times are wall-clock microseconds with no way to set
        // them: the only way to make the second one later is to let time
        // pass.
        std::thread::sleep(std::time::Duration::from_millis(2));
        h4.set_detached(true);
        let h5 = handle(5);
        let r = t.register(&jid("5"), h5, 2).unwrap();
        assert_eq!(r.evicted.map(|h| h.id), Some(1));
        // The evicted one still finishes, but is not counted or chosen
        // again: the next bind takes the other detached one, then none.
        assert_eq!(t.resources(&jid("1").to_bare()).len(), 3);
        let r = t.register(&jid("6"), handle(6), 2).unwrap();
        assert_eq!(r.evicted.map(|h| h.id), Some(4));
        assert!(t.register(&jid("7"), h3, 2).is_err());
        t.unregister(&jid("1"), 1);
        t.unregister(&jid("2"), 4);
        assert_eq!(t.count(), 2);
    }

    #[test]
    fn register_same_full_jid_replaces_old_session() {
        // RFC 6120 §7.7.2.2: a new session with the same full JID replaces the old one.
        let t = SessionTable::new(0);
        let j = FullJid::new("a@x/r").unwrap();
        assert!(reg(&t, &j, handle(1)).replaced.is_none());
        let Some(Replaced::Local(old)) = reg(&t, &j, handle(2)).replaced else {
            panic!("old session returned")
        };
        assert_eq!(old.id, 1);
        assert_eq!(t.count(), 1);
        // The old session's unregister must not remove the new one.
        t.unregister(&j, 1);
        assert_eq!(t.get(&j).unwrap().session.id, 2);
        t.unregister(&j, 2);
        assert_eq!(t.count(), 0);
        assert!(t.resources(&j.to_bare()).is_empty());
    }

    #[test]
    fn resources_lists_all_and_priority_updates() {
        let t = SessionTable::new(0);
        let a = FullJid::new("a@x/1").unwrap();
        let b = FullJid::new("a@x/2").unwrap();
        reg(&t, &a, handle(1));
        reg(&t, &b, handle(2));
        t.set_presence(
            &b,
            2,
            Some((5, Arc::new(Element::new("presence", "jabber:client")))),
        );
        let r = t.resources(&a.to_bare());
        assert_eq!(r.len(), 2);
        assert!(t.has_resources(&a.to_bare()));
        assert!(!t.has_resources(&FullJid::new("b@x/1").unwrap().to_bare()));
        assert_eq!(r.iter().find(|e| e.jid() == &b).unwrap().priority, Some(5));
        assert_eq!(r.iter().find(|e| e.jid() == &a).unwrap().priority, None);
    }

    fn remote(jid: &str, node: u8, id: u64) -> SessionRef {
        SessionRef {
            jid: FullJid::new(jid).unwrap(),
            node,
            id,
        }
    }

    #[test]
    fn remote_sessions_are_listed_beside_local_ones_but_not_counted() {
        let t = SessionTable::new(1);
        let local = FullJid::new("a@x/here").unwrap();
        reg(&t, &local, handle(1));
        let far = remote("a@x/there", 2, 7);
        assert!(t.remote_bound(&far, now_us()).is_none());
        t.remote_presence(
            &far,
            Some((3, Arc::new(Element::new("presence", "jabber:client")))),
        );
        let r = t.resources(&local.to_bare());
        assert_eq!(r.len(), 2);
        let e = r.iter().find(|e| e.session == far).unwrap();
        assert_eq!(e.priority, Some(3));
        // Only this node's sessions count, and only they have a mailbox.
        assert_eq!(t.count(), 1);
        assert!(t.handle(&far).is_none() && t.contains(&far));
        assert_eq!(t.local_sessions().len(), 1);
        assert_eq!(t.remote_counts().get(&2), Some(&1));
        // An event about one of our own sessions changes nothing.
        t.remote_unbound(&remote("a@x/here", 1, 1));
        assert!(t.get(&local).is_some());
        // The node goes: its sessions are returned and forgotten.
        let gone = t.remove_node(2);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].session, far);
        assert_eq!(t.resources(&local.to_bare()).len(), 1);
    }

    #[test]
    fn the_later_of_two_binds_of_one_full_jid_wins_on_every_node() {
        // RFC 6120 §7.7.2.2 across nodes.
        let t = SessionTable::new(1);
        let j = FullJid::new("a@x/r").unwrap();
        reg(&t, &j, handle(1));
        // A bind on node 2 from before ours loses: not recorded.
        assert!(t.remote_bound(&remote("a@x/r", 2, 9), 1).is_none());
        assert_eq!(t.get(&j).unwrap().session.node, 1);
        // A later one wins: ours is handed back to be closed.
        let old = t
            .remote_bound(&remote("a@x/r", 2, 10), now_us() + 1_000_000)
            .expect("our session loses");
        assert_eq!(old.id, 1);
        assert_eq!(t.get(&j).unwrap().session, remote("a@x/r", 2, 10));
        assert_eq!(t.count(), 0);
        // A new local bind replaces the remote session: the router asks
        // node 2 to close it.
        let Some(Replaced::Remote(r)) = reg(&t, &j, handle(2)).replaced else {
            panic!("the remote session is replaced")
        };
        assert_eq!(r, remote("a@x/r", 2, 10));
        assert_eq!(t.count(), 1);
        // Same bind time: the higher node id wins, whichever node decides.
        let u = SessionTable::new(3);
        let k = FullJid::new("b@x/r").unwrap();
        reg(&u, &k, handle(5));
        let at = u.local_sessions()[0].bound_at;
        assert!(u.remote_bound(&remote("b@x/r", 2, 1), at).is_none());
        assert!(u.remote_bound(&remote("b@x/r", 4, 1), at).is_some());
    }
}
