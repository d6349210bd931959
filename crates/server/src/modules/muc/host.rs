//! What the room services share (XEP-0045 rooms at `conference.<domain>`,
//! MUC Light rooms at `muclight.<domain>`): **one task per live room**
//! with a bounded queue, placement on a cluster, hand-off, the room
//! archive's write-behind queue, acknowledgements that wait for the rooms
//! a session wrote to, and shutdown.
//!
//! A [`Kind`] says what a room is (its state, how it is loaded, how a
//! stanza changes it); a [`Host`] runs the rooms of one service:
//!
//! - The service hands each stanza for a room to that room's queue and
//!   returns ([`Host::dispatch`]); the room's task ([`run_room`]) loads the
//!   room once, then applies its stanzas one at a time. A room is never
//!   changed by two tasks, and a flooded room answers `resource-constraint`
//!   without slowing any other room: a message is refused when the copies
//!   already waiting (messages queued × recipients) pass
//!   `max_queued_copies`.
//! - A room whose [`Kind::idle`] says it may unload ends its task after
//!   `idle_unload_secs` without stanzas (its stored state is loaded again
//!   on its next stanza).
//! - On a cluster a room lives on the node placement picks
//!   ([`starling_core::Router::placement`]); rooms a joining node wins are
//!   handed off every second ([`Kind::leave_all`] tells their users).
//! - An XEP-0198 acknowledgement of a session that sent messages to rooms
//!   waits until those rooms handled what was queued before it and the
//!   archive queue committed ([`DurabilityHandler::durable_for`]).
//! - The admin API reaches a room through its task too: a request of the
//!   server itself ([`Host::is_server_request`]: from the served domain's bare
//!   JID, which no client can send) carries a oneshot channel on which
//!   the room answers ([`Host::request`], [`Kind::process_admin`]), and
//!   [`Host::inspect`] runs a read of a live room's state in its task.

use crate::modules::common::write_behind::{BatchSink, WriteBehind, WriteBehindConfig};
use starling_core::hooks::{
    AccountRemovedHandler, Archived, DurabilityHandler, HookRegistry, Service, ServiceAddress,
    ShutdownHandler, StartedHandler, UserSendHandler,
};
use starling_core::module::{ConfigProblem, ModuleCtx};
use starling_core::storage::{
    ArchiveId, ArchiveIds, ArchiveRecord, ArchiveStore, Storage, StorageResult,
};
use starling_core::{async_trait, Env, Flow, HookResult, SessionCtx};
use starling_proto::{
    BareJid, ErrorType, Jid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind,
};
use starling_xml::Element;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// What a room service's rooms are.
#[async_trait]
pub(super) trait Kind: Sized + Send + Sync + 'static {
    /// The service's configuration (`[modules.…]`).
    type Config: Send + Sync + 'static;
    /// A live room's state, owned by its task.
    type Room: Send + 'static;
    /// The module's name (logs, metrics).
    const MODULE: &'static str;

    /// Loads a stored room; `None` if there is none.
    async fn load(host: &Arc<Host<Self>>, jid: &BareJid) -> StorageResult<Option<Self::Room>>;
    /// Applies one stanza to room `jid` (which may not exist yet): stores
    /// what must outlive it, then routes what it produced.
    async fn process(
        host: &Arc<Host<Self>>,
        env: &Env,
        jid: &BareJid,
        room: &mut Option<Self::Room>,
        st: Stanza,
    );
    /// The server's administrator's request to room `jid` ([`Host::request`],
    /// a stanza [`Host::is_server_request`] accepts): applied as
    /// [`Kind::process`] would, except that the answer to the requester
    /// is returned instead of routed (`None`: done, nothing to answer).
    /// Rooms that take no such request refuse it.
    async fn process_admin(
        _host: &Arc<Host<Self>>,
        _env: &Env,
        _jid: &BareJid,
        _room: &mut Option<Self::Room>,
        st: Stanza,
    ) -> Option<Stanza> {
        st.error_reply(error(
            StanzaErrorCondition::ServiceUnavailable,
            "this service takes no administrator requests",
        ))
    }
    /// A stanza to the service's own JID; the reply, if any.
    async fn service_stanza(host: &Arc<Host<Self>>, env: &Env, st: &Stanza) -> Option<Stanza>;
    /// The room stops running here (shutdown, hand-off to another node):
    /// the stanzas that tell its users.
    fn leave_all(room: &mut Self::Room) -> Vec<Stanza>;
    /// Whether the room's task may end after `idle_unload_secs` without
    /// stanzas.
    fn idle(room: &Self::Room) -> bool;
    /// What the service lists of the room without asking its task.
    fn listing(room: &Self::Room) -> Listing;
}

/// The settings every room service has.
#[derive(Clone, Debug)]
pub(super) struct Settings {
    /// The service's subdomain label.
    pub subdomain: String,
    /// Stanzas waiting for one room before senders get
    /// `resource-constraint`.
    pub room_queue: usize,
    /// Copies a room's waiting messages may add up to.
    pub max_queued_copies: usize,
    /// Seconds an idle room stays in memory.
    pub idle_unload_secs: u64,
    /// Days the rooms' archived messages are kept (0: forever).
    pub retention_days: u32,
}

/// Checks the keys every room service's configuration has.
pub(super) fn check_common(
    subdomain: &str,
    create_rooms: &str,
    admins: &[String],
    room_queue: usize,
) -> Result<(), ConfigProblem> {
    let label_ok = !subdomain.is_empty()
        && subdomain.len() <= 63
        && subdomain
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !label_ok {
        return Err(ConfigProblem::new(
            "subdomain",
            "must be one DNS label of lowercase letters, digits and '-', e.g. \"conference\"",
        ));
    }
    if !matches!(create_rooms, "local" | "admins") {
        return Err(ConfigProblem::new(
            "create_rooms",
            "must be \"local\" or \"admins\"",
        ));
    }
    for a in admins {
        if BareJid::new(a).is_err() {
            return Err(ConfigProblem::new(
                "admins",
                format!("{a} is not a bare JID"),
            ));
        }
    }
    if room_queue == 0 {
        return Err(ConfigProblem::new("room_queue", "must be at least 1"));
    }
    Ok(())
}

/// Whether `who` may create rooms: a service admin, or (`create_rooms =
/// "local"`) any account of a served domain.
pub(super) fn may_create(env: &Env, create_rooms: &str, admins: &[String], who: &BareJid) -> bool {
    admins.iter().any(|a| a == who.as_str())
        || (create_rooms == "local" && env.hosts.is_local(who.domain().as_str()))
}

/// What the service knows of a live room without asking its task.
#[derive(Clone, Debug, Default)]
pub(super) struct Listing {
    /// Natural-language name.
    pub name: String,
    /// Listed in the service's disco#items.
    pub public: bool,
    /// Not enterable yet (XEP-0045 §10.1).
    pub locked: bool,
    /// Recipients of a message to the room (occupants or members).
    pub occupants: usize,
    /// Kept when empty (stored).
    pub persistent: bool,
    /// Only members may enter.
    pub members_only: bool,
    /// The task holds a room (false while it loads, and once the room
    /// was destroyed while the task ends).
    pub loaded: bool,
}

struct RoomHandle<K: Kind> {
    tx: mpsc::Sender<RoomMsg<K>>,
    generation: u64,
    listing: Arc<Mutex<Listing>>,
    seq: Arc<RoomSeq>,
}

/// How far a room's task got through its queue: stanzas queued (counted
/// under the rooms lock, so in queue order) and handled. An
/// acknowledgement to a session that sent the room a message waits until
/// `processed` reaches what `queued` was then.
#[derive(Default)]
struct RoomSeq {
    queued: AtomicU64,
    processed: AtomicU64,
    moved: tokio::sync::Notify,
}

impl RoomSeq {
    fn advance(&self, to: Option<u64>) {
        match to {
            Some(n) => self.processed.store(n, Ordering::Release),
            None => {
                self.processed.fetch_add(1, Ordering::Release);
            }
        }
        self.moved.notify_waiters();
    }

    /// Waits (at most `limit`) until the stanzas queued so far are handled.
    async fn caught_up(&self, limit: Duration) {
        let target = self.queued.load(Ordering::Acquire);
        let wait = async {
            loop {
                let moved = self.moved.notified();
                tokio::pin!(moved);
                moved.as_mut().enable();
                if self.processed.load(Ordering::Acquire) >= target {
                    return;
                }
                moved.await;
            }
        };
        let _ = tokio::time::timeout(limit, wait).await;
    }
}

/// The task is gone: nothing it held is waited for any more.
struct SeqDone(Arc<RoomSeq>);

impl Drop for SeqDone {
    fn drop(&mut self) {
        self.0.advance(Some(u64::MAX));
    }
}

/// Per session and service: the rooms it sent messages to since its last
/// acknowledgement (at most [`MAX_TRACKED_ROOMS`]; past that, every room).
struct SentToRooms<K> {
    rooms: Vec<BareJid>,
    all: bool,
    _kind: std::marker::PhantomData<fn() -> K>,
}

impl<K> Default for SentToRooms<K> {
    fn default() -> Self {
        SentToRooms {
            rooms: Vec::new(),
            all: false,
            _kind: std::marker::PhantomData,
        }
    }
}

const MAX_TRACKED_ROOMS: usize = 256;

/// How long the admin API waits for a room's answer.
pub(super) const ADMIN_WAIT: Duration = Duration::from_secs(10);

/// Why an administrator's request got no answer from its room.
#[derive(Debug)]
pub(super) enum AdminFailure {
    /// The room's task ended or moved to another cluster node before
    /// answering (the request was not applied).
    Gone,
    /// No answer within [`ADMIN_WAIT`] (it may still be applied).
    Timeout,
}

/// A read of a room's state, run in its task (`None`: it holds no room).
type Look<K> = Box<dyn FnOnce(Option<&<K as Kind>::Room>) + Send>;

enum RoomMsg<K: Kind> {
    Stanza(Stanza),
    /// The server's administrator's request ([`Host::request`]): applied
    /// by [`Kind::process_admin`], whose answer goes back on the channel
    /// instead of being routed (not counted in [`RoomSeq`]).
    Admin(Stanza, oneshot::Sender<Option<Stanza>>),
    /// A look at the room's state ([`Host::inspect`]), run in its task.
    Inspect(Look<K>),
    Shutdown(oneshot::Sender<()>),
    /// Another cluster node owns the room now.
    Handoff,
    /// A stanza that waited for room in the queue (not counted in
    /// [`RoomSeq`]).
    Late(Stanza),
}

struct Sink(Arc<dyn ArchiveStore>);

#[async_trait]
impl BatchSink<ArchiveRecord> for Sink {
    async fn write(&self, batch: &[ArchiveRecord]) -> StorageResult<()> {
        self.0.append(batch).await
    }
}

/// Counts a room task while it runs.
struct LiveRoom(prometheus_client::metrics::gauge::Gauge);

impl Drop for LiveRoom {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Rooms that users created and that only memory holds (temporary rooms,
/// and rooms not stored yet: locked, or not configured persistent), by
/// creator: what `max_rooms_per_user` adds to the stored rooms a user
/// owns, and what `max_temporary_rooms` bounds for the whole service on
/// this node. A room holds its [`CreatedSlot`] while it lives; dropping
/// the room (destroyed, emptied, its task ended) frees the count.
#[derive(Default)]
pub(super) struct CreatedRooms(Arc<Mutex<CreatedCounts>>);

#[derive(Default)]
struct CreatedCounts {
    by_user: HashMap<BareJid, u32>,
    total: usize,
}

/// Why [`CreatedRooms::claim`] refused a new room.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum CreateRefused {
    /// The user holds `max_rooms_per_user` already.
    User,
    /// The service holds `max_temporary_rooms` already.
    Service,
}

/// One created room's place in [`CreatedRooms`]; freed on drop.
pub(super) struct CreatedSlot {
    counts: Arc<Mutex<CreatedCounts>>,
    user: BareJid,
}

impl Drop for CreatedSlot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.by_user.get_mut(&self.user) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.by_user.remove(&self.user);
            }
        }
    }
}

impl CreatedRooms {
    /// Takes a place for a room `user` creates, when the user has fewer
    /// than `user_room` such rooms (its limit less the rooms it owns in
    /// storage; `None`: no limit) and the service fewer than `max_total`
    /// (0: no limit). Checked and counted under one lock.
    pub fn claim(
        &self,
        user: &BareJid,
        user_room: Option<usize>,
        max_total: usize,
    ) -> Result<CreatedSlot, CreateRefused> {
        let mut c = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mine = c.by_user.get(user).copied().unwrap_or(0) as usize;
        if user_room.is_some_and(|room| mine >= room) {
            return Err(CreateRefused::User);
        }
        if max_total > 0 && c.total >= max_total {
            return Err(CreateRefused::Service);
        }
        c.total += 1;
        *c.by_user.entry(user.clone()).or_insert(0) += 1;
        Ok(CreatedSlot {
            counts: self.0.clone(),
            user: user.clone(),
        })
    }
}

/// The rooms of one service.
pub(super) struct Host<K: Kind> {
    /// The service's configuration.
    pub cfg: K::Config,
    /// Queueing and unloading.
    pub settings: Settings,
    env: OnceLock<Weak<Env>>,
    rooms: Mutex<HashMap<BareJid, RoomHandle<K>>>,
    /// Archive ids (one generator per node).
    pub ids: Arc<ArchiveIds>,
    /// The rooms' archive rows, written behind.
    pub archive: WriteBehind<ArchiveRecord>,
    /// The archive (and the rest of the shared storage).
    pub storage: Storage,
    /// Rooms and affiliations (the group-chat store, `store/`).
    pub store: Arc<dyn super::store::MucStore>,
    next_gen: AtomicU64,
    /// The full-queue warning, throttled (a flood must not flood the log).
    full_log: starling_core::throttle::LogThrottle,
    /// Rooms loaded on this node (`starling_<module>_rooms_live`).
    rooms_live: prometheus_client::metrics::gauge::Gauge,
    /// The module's bit in a domain's switch-off mask.
    module_bit: u64,
    /// Rooms users created that only memory holds (the per-user and
    /// per-service room limits).
    pub created: CreatedRooms,
}

/// The service's hooks: a [`Service`] at the subdomain, and what keeps
/// acknowledgements, cluster placement and shutdown right.
pub(super) struct RoomService<K: Kind>(pub Arc<Host<K>>);

impl<K: Kind> Host<K> {
    /// Starts the service: its archive queue, its `rooms_live` gauge, its
    /// hooks. `archive_queue` names the write-behind queue in metrics.
    pub fn start(
        cfg: K::Config,
        settings: Settings,
        display_name: &str,
        archive_queue: &'static str,
        ctx: &ModuleCtx<'_>,
        reg: &mut HookRegistry,
    ) -> Arc<Host<K>> {
        if settings.retention_days > 0 {
            let rules = ctx
                .domains
                .iter()
                .map(|d| {
                    (
                        format!("{}.{d}", settings.subdomain),
                        settings.retention_days,
                    )
                })
                .collect();
            tokio::spawn(crate::modules::common::archive_query::retention_task(
                ctx.storage.archive.clone(),
                rules,
                K::MODULE,
            ));
        }
        let archive = WriteBehind::spawn(
            archive_queue,
            Arc::new(Sink(ctx.storage.archive.clone())),
            WriteBehindConfig {
                capacity: 100_000,
                max_bytes: 64 << 20,
                max_batch: 500,
                max_delay: Duration::from_millis(5),
            },
            ctx.metrics.write_behind.queue(archive_queue),
            ctx.pressure.clone(),
        );
        let host = Arc::new(Host {
            cfg,
            settings,
            env: OnceLock::new(),
            rooms: Mutex::new(HashMap::new()),
            ids: ctx.archive_ids.clone(),
            archive,
            storage: ctx.storage.clone(),
            store: super::store::open_timed(ctx.storage, ctx.metrics),
            next_gen: AtomicU64::new(1),
            full_log: Default::default(),
            rooms_live: Default::default(),
            module_bit: starling_core::module::module_bit(K::MODULE),
            created: CreatedRooms::default(),
        });
        let live = host.rooms_live.clone();
        ctx.metrics.with_registry(|r| {
            r.register(
                format!("{}_rooms_live", K::MODULE),
                "Rooms of this service loaded on this node",
                live,
            )
        });
        // The label lives as long as the server (one per start).
        let label: &'static str = Box::leak(host.settings.subdomain.clone().into_boxed_str());
        let svc = Arc::new(RoomService(host.clone()));
        reg.service(
            K::MODULE,
            ServiceAddress::Subdomain(label),
            display_name,
            svc.clone(),
        );
        reg.started(svc.clone());
        // What the rooms queued for their archives counts for
        // read-your-writes (inbox and archive queries) and acks.
        reg.durability(svc.clone());
        reg.user_send(K::MODULE, 50, svc.clone());
        reg.account_removed(svc.clone());
        reg.shutdown(K::MODULE, 20, svc);
        host
    }

    /// The server's environment, once started.
    pub fn env(&self) -> Option<Arc<Env>> {
        self.env.get().and_then(Weak::upgrade)
    }

    /// Whether `domain` is this service under a served domain.
    pub fn is_service_domain(&self, env: &Env, domain: &str) -> bool {
        domain
            .strip_prefix(self.settings.subdomain.as_str())
            .and_then(|r| r.strip_prefix('.'))
            .and_then(|d| env.hosts.modules_off(d))
            .is_some_and(|off| off & self.module_bit == 0)
    }

    /// The live rooms' listings, by JID.
    pub fn listings(&self) -> Vec<(BareJid, Listing)> {
        self.rooms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(j, h)| {
                (
                    j.clone(),
                    h.listing.lock().unwrap_or_else(|e| e.into_inner()).clone(),
                )
            })
            .collect()
    }

    /// Queues a stanza for its room, starting the room's task if needed.
    /// Returns the error reply when the room's queue is full.
    pub fn dispatch(self: &Arc<Self>, room: BareJid, stanza: Stanza) -> Option<Stanza> {
        let mut rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        let handle = self.handle(&mut rooms, &room);
        // A message is refused when the copies already waiting would take
        // too long to send: the queue's bound in stanzas alone would let a
        // 1,000-occupant room hold a million copies (seconds of work).
        let busy = stanza.kind() == StanzaKind::Message && !stanza.is_error() && {
            let occupants = handle
                .listing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .occupants
                .max(1);
            let queued = self.settings.room_queue - handle.tx.capacity();
            (queued + 1).saturating_mul(occupants) > self.settings.max_queued_copies
        };
        // Leaving and error bounces are never refused (an occupant whose
        // unavailable presence was dropped would stay a ghost): they wait
        // for room in the queue.
        let must_arrive = stanza.is_error()
            || (stanza.kind() == StanzaKind::Presence && stanza.type_attr() == Some("unavailable"));
        let attempt = if busy && !must_arrive {
            Err(mpsc::error::TrySendError::Full(RoomMsg::Stanza(stanza)))
        } else {
            handle.tx.try_send(RoomMsg::Stanza(stanza))
        };
        if attempt.is_ok() {
            // Under the rooms lock: counted in queue order.
            handle.seq.queued.fetch_add(1, Ordering::AcqRel);
        }
        match attempt {
            Ok(()) => None,
            Err(mpsc::error::TrySendError::Full(RoomMsg::Stanza(s))) if must_arrive => {
                let tx = handle.tx.clone();
                tokio::spawn(async move {
                    let _ = tx.send(RoomMsg::Late(s)).await;
                });
                None
            }
            Err(mpsc::error::TrySendError::Full(RoomMsg::Stanza(s)))
            | Err(mpsc::error::TrySendError::Closed(RoomMsg::Stanza(s))) => {
                if let Some(suppressed) = self.full_log.check() {
                    tracing::warn!(module = K::MODULE, room = %room, suppressed, "room queue full; stanza refused with resource-constraint");
                }
                s.error_reply(
                    error(
                        StanzaErrorCondition::ResourceConstraint,
                        "this room is too busy, try again later",
                    )
                    .with_type(ErrorType::Wait),
                )
            }
            Err(_) => None,
        }
    }

    /// The room's handle, its task started if it has none.
    fn handle<'a>(
        self: &Arc<Self>,
        rooms: &'a mut HashMap<BareJid, RoomHandle<K>>,
        room: &BareJid,
    ) -> &'a mut RoomHandle<K> {
        rooms.entry(room.clone()).or_insert_with(|| {
            let (tx, rx) = mpsc::channel(self.settings.room_queue);
            let generation = self.next_gen.fetch_add(1, Ordering::Relaxed);
            let listing = Arc::new(Mutex::new(Listing::default()));
            let seq = Arc::new(RoomSeq::default());
            tokio::spawn(run_room(
                self.clone(),
                room.clone(),
                rx,
                generation,
                listing.clone(),
                seq.clone(),
            ));
            RoomHandle {
                seq,
                tx,
                generation,
                listing,
            }
        })
    }

    /// Whether `st` is a request of the server itself, acting as this
    /// service's administrator (the admin API): from the bare JID of the
    /// served domain the room's service is under (`example.org` for
    /// `room@conference.example.org`). No client can send that: sessions
    /// stamp their own full JID as `from`, and a component's stanzas must
    /// be from its own domain, which may not be a served one.
    pub fn is_server_request(&self, env: &Env, st: &Stanza) -> bool {
        let (Some(from), Some(to)) = (st.from(), st.to()) else {
            return false;
        };
        from.node().is_none()
            && from.resource().is_none()
            && to.node().is_some()
            && env.hosts.is_local(from.domain().as_str())
            && to
                .domain()
                .as_str()
                .strip_prefix(self.settings.subdomain.as_str())
                .and_then(|r| r.strip_prefix('.'))
                == Some(from.domain().as_str())
    }

    /// Hands the server's administrator's request (a stanza
    /// [`Host::is_server_request`] accepts) to its room on this node, starting
    /// the room's task if needed, and waits for the room's answer
    /// ([`Kind::process_admin`]; `None`: done, nothing to answer). It
    /// waits for room in a full queue rather than being refused, at most
    /// [`ADMIN_WAIT`] in all.
    pub async fn request(
        self: &Arc<Self>,
        room: &BareJid,
        stanza: Stanza,
    ) -> Result<Option<Stanza>, AdminFailure> {
        let (tx, rx) = oneshot::channel();
        let exchange = async {
            let mut msg = RoomMsg::Admin(stanza, tx);
            // A task that was ending when its queue was taken refuses the
            // request unapplied: the second try starts a new one.
            for _ in 0..2 {
                let queue = {
                    let mut rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
                    self.handle(&mut rooms, room).tx.clone()
                };
                match queue.send(msg).await {
                    Ok(()) => return rx.await.map_err(|_| AdminFailure::Gone),
                    Err(mpsc::error::SendError(m)) => msg = m,
                }
            }
            Err(AdminFailure::Gone)
        };
        tokio::time::timeout(ADMIN_WAIT, exchange)
            .await
            .map_err(|_| AdminFailure::Timeout)?
    }

    /// Runs `f` on the state of room `room` in the room's task, if the
    /// room is live on this node (`None` otherwise: nothing is loaded for
    /// it). `f` gets `None` when the task holds no room (it is ending).
    pub async fn inspect<R: Send + 'static>(
        &self,
        room: &BareJid,
        f: impl FnOnce(Option<&K::Room>) -> R + Send + 'static,
    ) -> Option<R> {
        let queue = self
            .rooms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(room)
            .map(|h| h.tx.clone())?;
        let (tx, rx) = oneshot::channel();
        let look: Look<K> = Box::new(move |r| {
            let _ = tx.send(f(r));
        });
        let exchange = async {
            queue.send(RoomMsg::Inspect(look)).await.ok()?;
            rx.await.ok()
        };
        tokio::time::timeout(ADMIN_WAIT, exchange)
            .await
            .ok()
            .flatten()
    }

    /// Removes the room's entry (its task is ending).
    fn forget(&self, room: &BareJid, generation: u64) {
        let mut rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        if rooms.get(room).is_some_and(|h| h.generation == generation) {
            rooms.remove(room);
        }
    }

    /// Removes the room's entry if its queue is empty (no stanza can be
    /// queued while the map is locked). Returns whether the task may end.
    fn unregister(&self, room: &BareJid, generation: u64, rx: &mpsc::Receiver<RoomMsg<K>>) -> bool {
        let mut rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        if !rx.is_empty() {
            return false;
        }
        if rooms.get(room).is_some_and(|h| h.generation == generation) {
            rooms.remove(room);
        }
        true
    }
}

/// XEP-0430: each of `members` gets an inbox row for each archived
/// message (id, sender, kind, the message) pointing into the room's
/// archive (one copy for everyone); the sender's row is outgoing.
pub(super) async fn to_inboxes(
    env: &Env,
    room: &BareJid,
    members: &[BareJid],
    items: Vec<(ArchiveId, BareJid, starling_proto::mam::Kind, Element)>,
) {
    for (id, sender, kind, el) in items {
        for m in members {
            env.hooks
                .archived(
                    env,
                    &Archived {
                        owner: m,
                        peer: room,
                        id,
                        outgoing: *m == sender,
                        kind,
                        element: &el,
                        shared: true,
                    },
                )
                .await;
        }
    }
}

/// A stanza error with a text.
/// The server's own request to a room: account `jid` is being deleted.
/// Only the server sends it (from a served domain's bare JID, which no
/// client can put in `from`: sessions stamp their own).
const NS_ACCOUNT_REMOVED: &str = "urn:x-starling:account-removed:0";

fn account_removed_request(jid: &BareJid, room: &BareJid) -> Stanza {
    let el = Element::builder("iq", starling_proto::ns::CLIENT)
        .attr("type", "set")
        .attr("id", starling_proto::random_id(12))
        .append(
            Element::builder("account-removed", NS_ACCOUNT_REMOVED)
                .attr("jid", jid.as_str())
                .build(),
        )
        .build();
    let from = Jid::new(jid.domain().as_str()).expect("a domain is a JID");
    Stanza::new(el, Some(from), Some(room.clone().into()))
}

/// If `st` is the server's request about a deleted account
/// ([`account_removed_request`]), the account.
pub(super) fn account_removed(env: &Env, st: &Stanza) -> Option<BareJid> {
    let from = st.from()?;
    if st.kind() != StanzaKind::Iq
        || st.type_attr() != Some("set")
        || from.node().is_some()
        || from.resource().is_some()
        || !env.hosts.is_local(from.domain().as_str())
    {
        return None;
    }
    let p = st
        .payload()
        .filter(|p| p.is("account-removed", NS_ACCOUNT_REMOVED))?;
    BareJid::new(p.attr("jid")?).ok()
}

pub(super) fn error(c: StanzaErrorCondition, text: &str) -> StanzaError {
    StanzaError::new(c).with_text(text)
}

#[async_trait]
impl<K: Kind> DurabilityHandler for RoomService<K> {
    async fn durable(&self, _env: &Env) {
        self.0.archive.committed_all().await;
    }

    /// The rooms this session sent messages to first handle what was
    /// queued for them (so its message's archive row is queued), then the
    /// archive queue commits: an acknowledged group-chat message is in the
    /// room's archive. (A room on another cluster node: the bus keeps the
    /// message until that node took it; see docs/durability.md.)
    async fn durable_for(&self, cx: &mut SessionCtx<'_>) {
        if let Some(sent) = cx.state.remove::<SentToRooms<K>>() {
            let seqs: Vec<Arc<RoomSeq>> = {
                let rooms = self.0.rooms.lock().unwrap_or_else(|e| e.into_inner());
                if sent.all {
                    rooms.values().map(|h| h.seq.clone()).collect()
                } else {
                    sent.rooms
                        .iter()
                        .filter_map(|r| rooms.get(r).map(|h| h.seq.clone()))
                        .collect()
                }
            };
            for s in seqs {
                s.caught_up(Duration::from_secs(5)).await;
            }
        }
        self.0.archive.committed_all().await;
    }
}

#[async_trait]
impl<K: Kind> AccountRemovedHandler for RoomService<K> {
    /// Every room of this service where the account has an affiliation
    /// removes it as its rules say (a MUC Light room: the member leaves,
    /// the others are told, an owner gets an heir; an XEP-0045 room: the
    /// affiliation becomes `none`). A room of this node is waited for (at
    /// most 5 s each), so it has let go before the stored rows go; a room
    /// on another cluster node gets the request over the bus.
    async fn account_removed(&self, env: &Env, jid: &BareJid) {
        let rooms = match self.0.store.rooms_of(jid).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(module = K::MODULE, user = %jid, error = %e, "listing the rooms of a deleted account failed");
                return;
            }
        };
        for (room, _) in rooms {
            if !self.0.is_service_domain(env, room.domain().as_str()) {
                continue;
            }
            let request = account_removed_request(jid, &room);
            if let Some(node) = env.router.placement(room.as_str()) {
                env.router.to_service_on(env, node, request).await;
                continue;
            }
            if self.0.dispatch(room.clone(), request).is_some() {
                tracing::warn!(module = K::MODULE, room = %room, user = %jid, "room queue full: the deleted account's membership is removed from storage only");
                continue;
            }
            let seq = {
                let rooms = self.0.rooms.lock().unwrap_or_else(|e| e.into_inner());
                rooms.get(&room).map(|h| h.seq.clone())
            };
            if let Some(seq) = seq {
                seq.caught_up(Duration::from_secs(5)).await;
            }
        }
    }
}

#[async_trait]
impl<K: Kind> UserSendHandler for RoomService<K> {
    /// Notes the rooms of this service a session sends messages to, for
    /// [`RoomService::durable_for`].
    async fn user_send(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        if stanza.kind() != StanzaKind::Message || stanza.stanza_type() != "groupchat" {
            return Ok(Flow::Continue);
        }
        let Some(to) = stanza.to() else {
            return Ok(Flow::Continue);
        };
        if to.node().is_some() && self.0.is_service_domain(cx.env, to.domain().as_str()) {
            let room = to.to_bare();
            let sent = cx.state.get_or_insert_with(SentToRooms::<K>::default);
            if !sent.all && !sent.rooms.contains(&room) {
                if sent.rooms.len() >= MAX_TRACKED_ROOMS {
                    sent.all = true;
                    sent.rooms.clear();
                } else {
                    sent.rooms.push(room);
                }
            }
        }
        Ok(Flow::Continue)
    }
}

impl<K: Kind> StartedHandler for RoomService<K> {
    fn started(&self, env: &Arc<Env>) {
        let _ = self.0.env.set(Arc::downgrade(env));
        tokio::spawn(handoff_task(Arc::downgrade(&self.0)));
    }
}

/// On a cluster, a node that comes or goes moves some rooms to another
/// node ([`starling_core::Router::placement`]). Every second, the live
/// rooms this node no longer owns are handed off: their users are told
/// ([`Kind::leave_all`]), the new owner loads a stored room from storage,
/// and stanzas still queued are routed again, to the new owner. On a
/// single node nothing moves.
async fn handoff_task<K: Kind>(host: Weak<Host<K>>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let Some(host) = host.upgrade() else { return };
        let Some(env) = host.env() else { return };
        let moved: Vec<mpsc::Sender<RoomMsg<K>>> = host
            .rooms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(jid, _)| env.router.placement(jid.as_str()).is_some())
            .map(|(_, h)| h.tx.clone())
            .collect();
        for tx in moved {
            let _ = tx.send(RoomMsg::Handoff).await;
        }
    }
}

#[async_trait]
impl<K: Kind> ShutdownHandler for RoomService<K> {
    async fn shutdown(&self, _env: &Env) {
        let senders: Vec<mpsc::Sender<RoomMsg<K>>> = self
            .0
            .rooms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|h| h.tx.clone())
            .collect();
        let mut acks = Vec::new();
        for tx in senders {
            let (ack, rx) = oneshot::channel();
            if tx.send(RoomMsg::Shutdown(ack)).await.is_ok() {
                acks.push(rx);
            }
        }
        let all = futures_util::future::join_all(acks);
        if tokio::time::timeout(Duration::from_secs(5), all)
            .await
            .is_err()
        {
            tracing::warn!(module = K::MODULE, "some rooms did not stop within 5 s");
        }
        self.0.archive.close().await;
    }
}

#[async_trait]
impl<K: Kind> Service for RoomService<K> {
    async fn handle(&self, env: &Env, stanza: Stanza) {
        let Some(to) = stanza.to().cloned() else {
            return;
        };
        // On a cluster a room runs on one node: the one placement picks.
        if to.node().is_some() {
            if let Some(node) = env.router.placement(to.to_bare().as_str()) {
                return env.router.to_service_on(env, node, stanza).await;
            }
        }
        self.handle_placed(env, stanza).await
    }

    async fn handle_placed(&self, env: &Env, stanza: Stanza) {
        let Some(to) = stanza.to().cloned() else {
            return;
        };
        let reply = if to.node().is_none() {
            K::service_stanza(&self.0, env, &stanza).await
        } else {
            self.0.dispatch(to.to_bare(), stanza)
        };
        if let Some(reply) = reply {
            env.route(reply).await;
        }
    }
}

/// A room's task: loads it, then applies its stanzas one at a time.
async fn run_room<K: Kind>(
    host: Arc<Host<K>>,
    jid: BareJid,
    mut rx: mpsc::Receiver<RoomMsg<K>>,
    generation: u64,
    listing: Arc<Mutex<Listing>>,
    seq: Arc<RoomSeq>,
) {
    let _done = SeqDone(seq.clone());
    host.rooms_live.inc();
    let _live = LiveRoom(host.rooms_live.clone());
    let idle = Duration::from_secs(host.settings.idle_unload_secs);
    let mut room = match K::load(&host, &jid).await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(module = K::MODULE, room = %jid, error = %e, "loading the room failed");
            // Answer what waits, then let the next stanza try again.
            loop {
                let msg = rx.try_recv();
                let Some(env) = host.env() else { break };
                match msg {
                    Ok(RoomMsg::Stanza(s) | RoomMsg::Late(s)) => {
                        if let Some(r) = s.error_reply(
                            error(
                                StanzaErrorCondition::InternalServerError,
                                "the room could not be loaded",
                            )
                            .with_type(ErrorType::Wait),
                        ) {
                            env.route(r).await;
                        }
                    }
                    Ok(RoomMsg::Admin(s, answer)) => {
                        let _ = answer.send(
                            s.error_reply(
                                error(
                                    StanzaErrorCondition::InternalServerError,
                                    "the room could not be loaded",
                                )
                                .with_type(ErrorType::Wait),
                            ),
                        );
                    }
                    Ok(RoomMsg::Shutdown(ack)) => {
                        let _ = ack.send(());
                    }
                    // Unanswered: the admin API says so.
                    Ok(RoomMsg::Handoff | RoomMsg::Inspect(_)) => {}
                    Err(_) => {
                        if host.unregister(&jid, generation, &rx) {
                            break;
                        }
                    }
                }
            }
            return;
        }
    };
    loop {
        let idle_now = room.as_ref().is_none_or(K::idle);
        let msg = if idle_now {
            match tokio::time::timeout(
                if room.is_none() { Duration::ZERO } else { idle },
                rx.recv(),
            )
            .await
            {
                Ok(m) => m,
                Err(_) => {
                    if host.unregister(&jid, generation, &rx) {
                        break;
                    }
                    continue;
                }
            }
        } else {
            rx.recv().await
        };
        let Some(msg) = msg else { break };
        let counted = matches!(msg, RoomMsg::Stanza(_));
        let Some(env) = host.env() else { break };
        match msg {
            RoomMsg::Shutdown(ack) => {
                if let Some(r) = &mut room {
                    for s in K::leave_all(r) {
                        env.route(s).await;
                    }
                }
                let _ = ack.send(());
                // Stay until the server is gone: stanzas still get answered.
            }
            RoomMsg::Handoff => {
                if env.router.placement(jid.as_str()).is_none() {
                    continue; // the membership changed back meanwhile
                }
                if let Some(r) = &mut room {
                    tracing::info!(module = K::MODULE, room = %jid, "room moves to another cluster node");
                    for s in K::leave_all(r) {
                        env.route(s).await;
                    }
                }
                // No stanza can be queued once the entry is gone; those
                // already queued go to the new owner (an administrator's
                // request is dropped unapplied: the admin API says so).
                host.forget(&jid, generation);
                while let Ok(m) = rx.try_recv() {
                    if let RoomMsg::Stanza(s) | RoomMsg::Late(s) = m {
                        env.route(s).await;
                    }
                }
                break;
            }
            RoomMsg::Stanza(st) | RoomMsg::Late(st) => {
                K::process(&host, &env, &jid, &mut room, st).await;
                if counted {
                    seq.advance(None);
                }
                *listing.lock().unwrap_or_else(|e| e.into_inner()) =
                    room.as_ref().map(K::listing).unwrap_or_default();
            }
            RoomMsg::Admin(st, answer) => {
                let reply = K::process_admin(&host, &env, &jid, &mut room, st).await;
                let _ = answer.send(reply);
                *listing.lock().unwrap_or_else(|e| e.into_inner()) =
                    room.as_ref().map(K::listing).unwrap_or_default();
            }
            RoomMsg::Inspect(look) => look(room.as_ref()),
        }
    }
}
