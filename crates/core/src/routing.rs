//! Routing and the session table, as interfaces.
//!
//! The local implementations live in the server crate. A clustered
//! deployment implements [`Router`] by consulting the local table first and a
//! shared registry second, so modules never learn where a session lives.

use crate::hooks::TimerKey;
use crate::throttle::LogThrottle;
use crate::Env;
use async_trait::async_trait;
use starling_proto::{BareJid, FullJid, Stanza, StreamError};
use starling_xml::Element;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Routes stanzas to local sessions, local services or remote domains
/// (RFC 6120 §10, RFC 6121 §8).
///
/// It is the only way to reach a session: modules and session tasks never
/// hold another session's mailbox, so a clustered router can put the
/// session on any node.
#[async_trait]
pub trait Router: Send + Sync + 'static {
    /// Routes one stanza whose `from` is already set and trusted. Errors
    /// owed to the sender (service-unavailable and the like) are routed back
    /// by the router itself.
    async fn route(&self, env: &Env, stanza: Stanza);

    /// Routes a stanza that already passed the account's inbound rules but
    /// whose session ended before its client got it (the session closed
    /// with it queued, or a stream-management queue expired): a message
    /// goes to the account's other resources or to offline storage (RFC
    /// 6121 §8.5.3.2.1) without being archived twice, an iq request is
    /// answered `service-unavailable`, anything else is dropped.
    async fn reroute(&self, env: &Env, stanza: Stanza);

    /// Puts a stanza made by the server for exactly one session (a carbon
    /// copy, a roster or subscription push) in that session's queue,
    /// without the inbound rules and without any fallback. Best effort:
    /// the error says why it was not queued.
    async fn deliver(
        &self,
        env: &Env,
        to: &SessionRef,
        stanza: Stanza,
    ) -> Result<(), SessionSendError>;

    /// Asks session `to` to run the timer handler of `key.module` with
    /// `key.token` now, in the session's own task (a module reaching its
    /// own per-session state in another session, e.g. "the offline queue
    /// changed, read it again"). Best effort, like [`Router::deliver`].
    async fn notify(
        &self,
        env: &Env,
        to: &SessionRef,
        key: TimerKey,
    ) -> Result<(), SessionSendError>;

    /// Binds `session` to `jid`. A session already holding `jid` is closed
    /// with `<conflict/>` (RFC 6120 §7.7.2.2: the new one wins). A new
    /// resource of an account that already has `max_resources` bound (on
    /// any node this router knows of) takes the place of the account's
    /// longest-detached stream-management session, which is closed (its
    /// unacknowledged stanzas re-routed as when its resumption times
    /// out); with none detached the bind is refused and nothing changes.
    async fn bind(
        &self,
        env: &Env,
        jid: &FullJid,
        session: SessionHandle,
        max_resources: usize,
    ) -> Result<(), TooManyResources>;

    /// Closes every session of `account` (it was deleted, banned…).
    async fn close_sessions(&self, env: &Env, account: &BareJid, reason: CloseReason);

    /// Tells the other nodes of a cluster that `module`'s data under `key`
    /// changed, so they drop what they cached of it (their
    /// [`crate::hooks::CacheHandler`] runs). Nothing on a single node.
    fn invalidate(&self, _module: &'static str, _key: &str) {}

    /// The cluster node that runs the thing named `key` (a group-chat
    /// room, which must live on exactly one node): rendezvous hashing over
    /// the living nodes, so every node computes the same answer and only
    /// the keys of a node that comes or goes move. `None` when it is this
    /// node (always, on a single node).
    fn placement(&self, _key: &str) -> Option<u8> {
        None
    }

    /// Hands a stanza for a local service to the same service on `node`
    /// (the one [`Router::placement`] chose), where it arrives through
    /// [`crate::hooks::Service::handle_placed`]. Messages are kept until
    /// that node took them; if it dies first they are routed again here
    /// (so placed again). Nothing on a single node.
    async fn to_service_on(&self, _env: &Env, _node: u8, _stanza: Stanza) {}

    /// Waits until session `to`'s mailbox has room for `free` more
    /// stanzas (at most half its capacity), at most `max_wait`: a module that sends one session a
    /// burst of server-made stanzas (PEP's last items at login: up to
    /// thousands) paces itself to the session's reading instead of
    /// overflowing its mailbox, where they would be bounced. Returns at
    /// once for a session that is gone or on another node (the cluster
    /// bus applies its own flow control). False if the wait timed out.
    async fn wait_for_room(
        &self,
        _to: &SessionRef,
        _free: usize,
        _max_wait: std::time::Duration,
    ) -> bool {
        true
    }

    /// Hands a connection to session `to` (XEP-0198 resumption). Gives it
    /// back if that session is gone.
    async fn attach(
        &self,
        env: &Env,
        to: &SessionRef,
        handover: Box<Handover>,
    ) -> Result<(), Box<Handover>>;
}

/// A connection on its way from the session that accepted it to the
/// session that takes it over ([`Router::attach`]).
pub struct Handover {
    /// The connection (the server's connection type).
    pub conn: Box<dyn std::any::Any + Send>,
    /// The client's address.
    pub peer: std::net::SocketAddr,
    /// True if the connection is encrypted.
    pub secure: bool,
    /// The client's element that asked for it (e.g. `<resume/>`).
    pub request: Element,
    /// Resumption inline in SASL2 (XEP-0388, XEP-0198 "Inline Stream
    /// Resumption"): the `<success/>` to finish. The session that takes
    /// the connection adds its full JID as the authorization identifier
    /// and what its attach handlers answer (`<resumed/>`), writes it and
    /// the features, then the rest.
    pub sasl2_success: Option<Box<Element>>,
}

impl std::fmt::Debug for Handover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handover")
            .field("peer", &self.peer)
            .field("secure", &self.secure)
            .finish_non_exhaustive()
    }
}

/// Where a session lives, as the router knows it: the bound full JID, the
/// node and a process-unique id. All that modules keep of a session.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SessionRef {
    /// The bound full JID.
    pub jid: FullJid,
    /// The node that runs the session (`[server] node_id`).
    pub node: u8,
    /// The session's id on that node.
    pub id: u64,
}

/// Why a session is being closed by someone other than its own client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// Another session bound the same full JID (RFC 6120 §7.7.2.2): close
    /// with `<conflict/>`.
    Replaced,
    /// Close with this stream error (boxed: it is rare, and keeping
    /// [`SessionMsg`] small keeps every idle mailbox small).
    Error(Box<StreamError>),
}

/// A message to a session task's mailbox.
///
/// Kept at 16 bytes: it is what every queued delivery costs.
#[derive(Debug)]
pub enum SessionMsg {
    /// Deliver this stanza to the client (after the receive hooks).
    Stanza(Box<Stanza>),
    /// Close the session.
    Close(CloseReason),
    /// Take over this connection (XEP-0198 resumption).
    Attach(Box<Handover>),
    /// Run this module's timer handler now, as if its timer had fired
    /// ([`Router::notify`]). Boxed: rare, and the message stays 16 bytes.
    Notify(Box<TimerKey>),
}

/// Why a message could not be put in a session's mailbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionSendError {
    /// The mailbox is full: the client is not reading fast enough.
    Full,
    /// The session task has ended.
    Gone,
}

/// The address of a session task: its id and its bounded mailbox.
#[derive(Clone, Debug)]
pub struct SessionHandle {
    /// Process-unique session id.
    pub id: u64,
    inner: Arc<MailboxInner>,
}

/// A bounded, single-consumer queue: a mutex-guarded deque plus a
/// [`Notify`]. Much smaller than a tokio mpsc channel (which reserves a
/// cache-padded channel and a 32-slot block up front, about 1 KB) — and
/// every idle session owns one. The mutex is held only to push or pop.
struct MailboxInner {
    queue: Mutex<Queue>,
    notify: Notify,
    capacity: usize,
    /// Most bytes of stanzas queued at once ([`stanza_cost`]); a stanza
    /// is always taken by an empty mailbox, whatever its size.
    max_bytes: usize,
    closed: AtomicBool,
    /// When the session lost its connection and waits for a resumption
    /// (µs since the Unix epoch; 0: it has a connection). Set by the
    /// session itself; read by the router to pick which session a new
    /// resource beyond the account's limit replaces.
    detached_at: AtomicU64,
    /// Throttles the "mailbox full" warning of this session (16 bytes).
    full_log: LogThrottle,
}

impl std::fmt::Debug for MailboxInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox")
            .field("capacity", &self.capacity)
            .field("max_bytes", &self.max_bytes)
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish()
    }
}

/// The queued messages, each with what it counts against the byte bound,
/// and their sum.
#[derive(Default)]
struct Queue {
    items: VecDeque<(SessionMsg, u32)>,
    bytes: usize,
}

/// What a stanza counts against a mailbox's byte bound: the heap its
/// element tree holds (the copy this mailbox keeps), plus the box.
fn stanza_cost(msg: &SessionMsg) -> u32 {
    match msg {
        SessionMsg::Stanza(s) => {
            let n = std::mem::size_of::<Stanza>() + s.element().size_hint();
            u32::try_from(n).unwrap_or(u32::MAX)
        }
        _ => 0,
    }
}

/// Creates a session's mailbox holding at most `capacity` stanzas and at
/// most `max_bytes` of them (a single stanza larger than that is still
/// taken when the mailbox is empty). Control messages (close orders,
/// handovers, timers) count against neither.
pub fn mailbox(id: u64, capacity: usize, max_bytes: usize) -> (SessionHandle, Mailbox) {
    let inner = Arc::new(MailboxInner {
        queue: Mutex::new(Queue::default()),
        notify: Notify::new(),
        capacity: capacity.max(1),
        max_bytes,
        closed: AtomicBool::new(false),
        detached_at: AtomicU64::new(0),
        full_log: LogThrottle::default(),
    });
    (
        SessionHandle {
            id,
            inner: inner.clone(),
        },
        Mailbox { inner },
    )
}

impl SessionHandle {
    /// Puts a message in the mailbox without waiting: a router never blocks
    /// on a slow recipient. On failure the message is handed back. Only
    /// stanzas count against the capacity and the byte bound.
    pub fn try_send(&self, msg: SessionMsg) -> Result<(), (SessionSendError, SessionMsg)> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err((SessionSendError::Gone, msg));
        }
        // Measured outside the lock (a walk of the element tree).
        let cost = stanza_cost(&msg);
        {
            let mut q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            // A close order is never refused for lack of room: a session
            // that stopped reading must still learn that it is replaced.
            if matches!(msg, SessionMsg::Stanza(_))
                && (q.items.len() >= self.inner.capacity
                    || (q.bytes > 0 && q.bytes + cost as usize > self.inner.max_bytes))
            {
                return Err((SessionSendError::Full, msg));
            }
            q.bytes += cost as usize;
            q.items.push_back((msg, cost));
        }
        // Stores a permit if the session is not waiting right now.
        self.inner.notify.notify_one();
        Ok(())
    }

    /// How many stanzas the mailbox holds at most.
    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }

    /// How many more stanzas the mailbox takes now.
    pub fn room(&self) -> usize {
        let q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.bytes >= self.inner.max_bytes {
            return 0;
        }
        self.inner.capacity.saturating_sub(q.items.len())
    }

    /// Bytes of stanzas queued now (what counts against the byte bound).
    pub fn queued_bytes(&self) -> usize {
        let q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.bytes
    }

    /// Call when [`try_send`](Self::try_send) found the mailbox full:
    /// `Some(n)` when the warning should be logged now (with `n` earlier
    /// ones suppressed), `None` when it is throttled. At most one line per
    /// [`LOG_INTERVAL`](crate::throttle::LOG_INTERVAL) per session.
    pub fn full_warning(&self) -> Option<u64> {
        self.inner.full_log.check()
    }

    /// Marks the session detached (it lost its connection and waits for a
    /// stream-management resumption) or attached again.
    pub fn set_detached(&self, detached: bool) {
        let at = if detached {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| (d.as_micros() as u64).max(1))
        } else {
            0
        };
        self.inner.detached_at.store(at, Ordering::Release);
    }

    /// Since when the session is detached (µs since the Unix epoch), or
    /// `None` while it has a connection.
    pub fn detached_since(&self) -> Option<u64> {
        match self.inner.detached_at.load(Ordering::Acquire) {
            0 => None,
            at => Some(at),
        }
    }
}

/// [`Router::bind`] refused a new resource: the account already has this
/// many bound and none of them is detached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooManyResources(pub usize);

/// The receiving end, owned by the session task.
#[derive(Debug)]
pub struct Mailbox {
    inner: Arc<MailboxInner>,
}

impl Mailbox {
    /// Waits for the next message.
    pub async fn recv(&self) -> SessionMsg {
        loop {
            if let Some(m) = self.try_recv() {
                return m;
            }
            self.inner.notify.notified().await;
        }
    }

    /// The next message, if one is queued.
    pub fn try_recv(&self) -> Option<SessionMsg> {
        let mut q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        let (m, cost) = q.items.pop_front()?;
        q.bytes -= cost as usize;
        if q.items.is_empty() && q.items.capacity() > 16 {
            // A burst is over: do not keep its buffer while idle.
            q.items.shrink_to(0);
        }
        Some(m)
    }

    /// Refuses further messages; queued ones can still be taken.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
    }
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        self.close();
    }
}

/// One bound resource in the session table.
#[derive(Clone, Debug)]
pub struct SessionEntry {
    /// Where the session lives (its full JID, node and id).
    pub session: SessionRef,
    /// Presence priority; `None` while the resource is not available
    /// (no initial presence sent yet, or unavailable presence sent).
    pub priority: Option<i8>,
    /// The resource's last available presence as broadcast (with its
    /// `from`), for answering probes (RFC 6121 §4.3.2); `None` while not
    /// available.
    pub presence: Option<Arc<Element>>,
}

impl SessionEntry {
    /// The bound full JID.
    pub fn jid(&self) -> &FullJid {
        &self.session.jid
    }
}

/// The local session table: bare JID → bound resources.
///
/// Methods are synchronous and never block: implementations use short,
/// sharded locks that are never held across an `.await`.
///
/// Read-mostly: binding goes through [`Router::bind`], which owns the
/// mailboxes.
pub trait SessionManager: Send + Sync + 'static {
    /// Removes `jid` if it is still held by session `session_id`.
    fn unregister(&self, jid: &FullJid, session_id: u64);
    /// Records the resource's availability: priority and last presence
    /// (`None` = unavailable).
    fn set_presence(&self, jid: &FullJid, session_id: u64, presence: Option<(i8, Arc<Element>)>);
    /// The session holding exactly this full JID.
    fn get(&self, jid: &FullJid) -> Option<SessionEntry>;
    /// All bound resources of an account.
    fn resources(&self, bare: &BareJid) -> Vec<SessionEntry>;
    /// True if the account has a bound resource (no entries are copied).
    fn has_resources(&self, bare: &BareJid) -> bool {
        !self.resources(bare).is_empty()
    }
    /// Number of bound sessions on this node.
    fn count(&self) -> usize;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn mailbox_bounded_fifo_and_closed_when_dropped() {
        let (h, mb) = mailbox(7, 2, usize::MAX);
        let close = || SessionMsg::Close(CloseReason::Replaced);
        let stanza = || {
            let el = Element::new("message", "jabber:client");
            SessionMsg::Stanza(Box::new(Stanza::from_element(el).unwrap()))
        };
        assert!(h.try_send(stanza()).is_ok());
        assert!(h.try_send(stanza()).is_ok());
        assert!(matches!(
            h.try_send(stanza()),
            Err((SessionSendError::Full, _))
        ));
        // A close order still gets in, after what is queued.
        assert!(h.try_send(close()).is_ok());
        assert!(matches!(mb.recv().await, SessionMsg::Stanza(_)));
        assert!(matches!(mb.try_recv(), Some(SessionMsg::Stanza(_))));
        assert!(matches!(mb.try_recv(), Some(SessionMsg::Close(_))));
        assert!(mb.try_recv().is_none());
        // A waiting receiver is woken by a later send.
        let h2 = h.clone();
        let t = tokio::spawn(async move {
            tokio::task::yield_now().await;
            h2.try_send(SessionMsg::Close(CloseReason::Replaced))
                .unwrap();
        });
        assert!(matches!(mb.recv().await, SessionMsg::Close(_)));
        t.await.unwrap();
        drop(mb);
        assert!(matches!(
            h.try_send(close()),
            Err((SessionSendError::Gone, _))
        ));
    }

    #[test]
    fn mailbox_bounded_by_bytes() {
        let big = || {
            let mut el = Element::new("message", "jabber:client");
            el.append_child(
                Element::builder("body", "jabber:client")
                    .text("x".repeat(10_000))
                    .build(),
            );
            SessionMsg::Stanza(Box::new(Stanza::from_element(el).unwrap()))
        };
        // Room for one 10 KB stanza, not two; a single stanza larger than
        // the bound is still taken by an empty mailbox.
        let (h, mb) = mailbox(1, 100, 15_000);
        assert!(h.try_send(big()).is_ok());
        assert!(h.queued_bytes() > 10_000);
        assert_eq!(h.room(), 99);
        assert!(matches!(
            h.try_send(big()),
            Err((SessionSendError::Full, _))
        ));
        // Close orders are never refused for lack of bytes either.
        assert!(h.try_send(SessionMsg::Close(CloseReason::Replaced)).is_ok());
        assert!(matches!(mb.try_recv(), Some(SessionMsg::Stanza(_))));
        assert_eq!(h.queued_bytes(), 0);
        assert!(h.try_send(big()).is_ok());
        let (h, _mb) = mailbox(2, 100, 1_000);
        assert!(h.try_send(big()).is_ok());
        assert_eq!(h.room(), 0);
        assert!(matches!(
            h.try_send(big()),
            Err((SessionSendError::Full, _))
        ));
    }

    #[test]
    fn session_msg_stays_two_words() {
        assert!(
            std::mem::size_of::<SessionMsg>() <= 16,
            "{}",
            std::mem::size_of::<SessionMsg>()
        );
    }
}
