//! The local session table: bare JID → bound resources, sharded so that
//! routing takes no global lock (DESIGN.md invariant 2). Locks are held
//! for a map operation only, never across an `.await`.

use starling_core::{SessionEntry, SessionHandle, SessionManager, SessionRef};
use starling_proto::{BareJid, FullJid};
use starling_xml::Element;
use std::collections::hash_map::{DefaultHasher, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

const SHARDS: usize = 64;

/// One bound resource: what modules see, and the mailbox only the router
/// uses.
struct Slot {
    entry: SessionEntry,
    handle: SessionHandle,
}

type Shard = RwLock<HashMap<BareJid, Vec<Slot>>>;

/// The sharded in-memory session table.
pub struct SessionTable {
    shards: Box<[Shard]>,
    count: AtomicUsize,
    node: u8,
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
        }
    }

    fn shard(&self, bare: &BareJid) -> &Shard {
        let mut h = DefaultHasher::new();
        bare.as_str().hash(&mut h);
        &self.shards[(h.finish() as usize) % SHARDS]
    }

    /// Binds `jid` to `handle`. If a session already holds this full JID it
    /// is replaced and its handle returned, so the router can tell it to
    /// close with `<conflict/>`.
    pub fn register(&self, jid: &FullJid, handle: SessionHandle) -> Option<SessionHandle> {
        let bare = jid.to_bare();
        let mut shard = self.shard(&bare).write().unwrap_or_else(|e| e.into_inner());
        // Most accounts have one or two resources: size exactly.
        let slots = shard.entry(bare).or_insert_with(|| Vec::with_capacity(1));
        let new = Slot {
            entry: SessionEntry {
                session: SessionRef {
                    jid: jid.clone(),
                    node: self.node,
                    id: handle.id,
                },
                priority: None,
                presence: None,
            },
            handle,
        };
        if let Some(slot) = slots.iter_mut().find(|s| s.entry.jid() == jid) {
            let old = std::mem::replace(slot, new);
            return Some(old.handle);
        }
        slots.push(new);
        self.count.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// The mailbox of exactly this session, if it is still bound.
    pub fn handle(&self, r: &SessionRef) -> Option<SessionHandle> {
        let bare = r.jid.to_bare();
        let shard = self.shard(&bare).read().unwrap_or_else(|e| e.into_inner());
        shard
            .get(&bare)?
            .iter()
            .find(|s| s.handle.id == r.id && s.entry.jid() == &r.jid)
            .map(|s| s.handle.clone())
    }

    /// The session bound to `jid`, with its mailbox.
    pub fn get_with_handle(&self, jid: &FullJid) -> Option<(SessionEntry, SessionHandle)> {
        let bare = jid.to_bare();
        let shard = self.shard(&bare).read().unwrap_or_else(|e| e.into_inner());
        shard
            .get(&bare)?
            .iter()
            .find(|s| s.entry.jid() == jid)
            .map(|s| (s.entry.clone(), s.handle.clone()))
    }

    /// Every bound resource of `bare`, with its mailbox.
    pub fn resources_with_handles(&self, bare: &BareJid) -> Vec<(SessionEntry, SessionHandle)> {
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
        let bare = jid.to_bare();
        let mut shard = self.shard(&bare).write().unwrap_or_else(|e| e.into_inner());
        if let Some(slots) = shard.get_mut(&bare) {
            let before = slots.len();
            slots.retain(|s| !(s.entry.jid() == jid && s.handle.id == session_id));
            if slots.len() < before {
                self.count.fetch_sub(1, Ordering::Relaxed);
            }
            if slots.is_empty() {
                shard.remove(&bare);
            }
        }
    }

    fn set_presence(&self, jid: &FullJid, session_id: u64, presence: Option<(i8, Arc<Element>)>) {
        let bare = jid.to_bare();
        let mut shard = self.shard(&bare).write().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = shard.get_mut(&bare).and_then(|v| {
            v.iter_mut()
                .find(|s| s.entry.jid() == jid && s.handle.id == session_id)
        }) {
            s.entry.priority = presence.as_ref().map(|(p, _)| *p);
            s.entry.presence = presence.map(|(_, el)| el);
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
        starling_core::mailbox(id, 1).0
    }

    #[test]
    fn register_same_full_jid_replaces_old_session() {
        // RFC 6120 §7.7.2.2: a new session with the same full JID replaces the old one.
        let t = SessionTable::new(0);
        let j = FullJid::new("a@x/r").unwrap();
        assert!(t.register(&j, handle(1)).is_none());
        let old = t.register(&j, handle(2)).expect("old session returned");
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
        t.register(&a, handle(1));
        t.register(&b, handle(2));
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
}
