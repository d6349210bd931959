//! The cluster: identical nodes on one NATS bus (issue 11, DESIGN.md
//! "Cluster", docs/cluster.md).
//!
//! Subjects, under the `[cluster] name` prefix `P`:
//!
//! | subject | carries |
//! |---|---|
//! | `P.all` | every node's heartbeats and registry events (broadcast) |
//! | `P.node.N` | frames for node N: stanzas for its sessions, acks, snapshots, close orders |
//!
//! **Registry.** Each node owns the entries of its own sessions and
//! announces every change on `P.all` with a per-node sequence number
//! (`Bound`, `Unbound`, `Presence`). Every node keeps all entries in its
//! session table ([`SessionTable`]), so routing looks up a recipient
//! locally, with no round trip. A node that sees a new node (or a new
//! incarnation of one), or a gap in its sequence numbers, asks it for a
//! snapshot and buffers that node's events until the snapshot arrives;
//! applying an event twice is harmless. Heartbeats carry the sender's last
//! sequence number, so a lost last event is noticed too.
//!
//! **Delivery.** The router picks the target session as on one node; a
//! session of node N gets a `Deliver` frame on `P.node.N`. Frames bound for
//! one node are batched into one NATS message while more are queued.
//! A message stanza is kept until N acknowledges it (N acks once the
//! stanza is in the session's queue, or handed to its own router when the
//! session was gone). If N is declared dead first, the kept messages are
//! routed again here: to another resource of the account or to offline
//! storage. So a message accepted by a node is not lost because the
//! recipient's node died before queueing it; one queued in a session on a
//! node that then dies is in the recipient's archive (as on a single node
//! killed with it queued, docs/durability.md).
//!
//! **Failure.** A node not heard from for `node_timeout_ms` is dead: its
//! entries leave the table on every node and the node with the lowest id
//! among the living runs the [`SessionLostHandler`]s (presence sends
//! unavailable to the lost sessions' contacts). A node that stops cleanly
//! closes its sessions (their `Unbound` events go out), then says
//! `Leaving`.
//!
//! [`SessionLostHandler`]: starling_core::hooks::SessionLostHandler

pub mod frame;

use crate::config::ClusterSection;
use crate::routing::sessions::{SessionTable, TableObserver};
use bytes::Bytes;
use frame::{CloseWhy, EntryState, Frame, Header, Writer};
use futures_util::StreamExt as _;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use starling_core::hooks::TimerKey;
use starling_core::{run_chain, CloseReason, Env, SessionMsg, SessionRef, SessionSendError};
use starling_proto::{BareJid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind};
use starling_xml::Element;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Most frames batched into one NATS message.
const MAX_BATCH_FRAMES: usize = 256;
/// Most bytes batched into one NATS message (NATS' default payload limit
/// is 1 MiB).
const MAX_BATCH_BYTES: usize = 512 * 1024;
/// NATS messages the client queues for writing (at most 32 MiB of
/// batches).
const CLIENT_CAPACITY: usize = 64;
/// NATS messages received and not yet handled, per subscription.
const SUBSCRIPTION_CAPACITY: usize = 1024;

/// Where a frame goes.
enum Dest {
    All,
    Node(u8),
}

/// What the publisher is asked to do.
enum Out {
    /// Batch and publish this encoded frame.
    Frame(Dest, Vec<u8>),
    /// Publish what is batched, flush the connection, then answer.
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// What the registry knows of another node.
struct Peer {
    incarnation: u64,
    last_seen: Instant,
    /// Its last registry event applied here.
    applied: u64,
    /// A snapshot was asked for: its events wait in `buffered`.
    awaiting: bool,
    buffered: Vec<(u64, Frame)>,
    /// Sessions, as its last heartbeat said.
    sessions: u32,
    /// Wall-clock time of its last heartbeat (for `cluster status`).
    last_heartbeat: std::time::SystemTime,
    /// This process was declared dead and is back (a partition): its
    /// sessions in the coming snapshot were announced as lost.
    returned: bool,
}

/// Where a registry event stands against what was applied of its node.
enum Order {
    /// Already applied (a snapshot covered it, or a duplicate).
    Stale,
    /// The next one: applied now.
    Next,
    /// One or more before it are missing: ask for a snapshot.
    Gap,
}

impl Peer {
    /// Places event `seq`; `Next` counts it as applied.
    fn order(&mut self, seq: u64) -> Order {
        if seq <= self.applied {
            Order::Stale
        } else if seq == self.applied + 1 {
            self.applied = seq;
            Order::Next
        } else {
            Order::Gap
        }
    }

    fn new(incarnation: u64) -> Peer {
        Peer {
            incarnation,
            last_seen: Instant::now(),
            applied: 0,
            awaiting: true,
            buffered: Vec::new(),
            sessions: 0,
            last_heartbeat: std::time::SystemTime::now(),
            returned: false,
        }
    }
}

/// A message stanza sent to another node, kept until it is acknowledged
/// (and sent again every retransmission interval until then).
struct Pending {
    /// The `Deliver` frame as sent (sent again as is; decoded only if the
    /// message must be routed again here).
    frame: Vec<u8>,
    sent_at: Instant,
    first_sent: Instant,
}

/// Which deliveries of one sender (one incarnation of a node) this node
/// has taken, so a retransmitted one is acknowledged again but delivered
/// once. Ids are numbered per destination node, so they arrive here in
/// order except where the bus lost some.
#[derive(Default)]
struct Taken {
    /// The highest id taken.
    max: u64,
    /// Ids below `max` never received (lost on the bus): a
    /// retransmission of one of them is new.
    missing: std::collections::BTreeSet<u64>,
}

/// Frames that follow a publish this closely wait this long to be batched.
const LINGER_WHEN_BUSY: Duration = Duration::from_millis(1);

/// How long acknowledgements are gathered before they are sent.
const ACK_DELAY: Duration = Duration::from_millis(2);

/// At most this many lost ids are remembered per sender.
const MAX_MISSING: usize = 100_000;

impl Taken {
    /// True if delivery `id` is new (and now taken).
    fn take(&mut self, id: u64) -> bool {
        if id > self.max {
            let from = (self.max + 1).max(id.saturating_sub(MAX_MISSING as u64));
            self.missing.extend(from..id);
            while self.missing.len() > MAX_MISSING {
                self.missing.pop_first();
            }
            self.max = id;
            true
        } else {
            self.missing.remove(&id)
        }
    }
}

/// One node as `starling cluster status` shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct NodeStatus {
    /// Its `node_id`.
    pub node: u8,
    /// True for the node answering.
    pub this_node: bool,
    /// Sessions bound on it (for another node: as its heartbeat said).
    pub sessions: u64,
    /// Its sessions in this node's registry.
    pub registry_entries: u64,
    /// Milliseconds since its last heartbeat (0 for this node).
    pub last_heartbeat_ms_ago: u64,
}

/// Bus traffic, registered in the metrics registry as `cluster_*`.
pub struct BusCounters {
    /// NATS messages (batches) published.
    pub messages_out: Counter,
    /// Frames published.
    pub frames_out: Counter,
    /// Bytes published.
    pub bytes_out: Counter,
    /// NATS messages received.
    pub messages_in: Counter,
    /// Frames received.
    pub frames_in: Counter,
    /// Bytes received.
    pub bytes_in: Counter,
    /// Messages that could not be read.
    pub bad_messages: Counter,
    /// Frames per published message.
    pub batch_frames: Histogram,
    /// Seconds from sending a message to another node to its
    /// acknowledgement (the cross-node hop, both ways).
    pub ack_seconds: Histogram,
    /// Messages sent again for want of an acknowledgement.
    pub retransmitted: Counter,
    /// Messages kept for a node declared dead or gone, routed again here.
    pub rerouted: Counter,
    /// Frames not queued for the bus because its queue held
    /// `[cluster] max_queue_mib` (NATS stalled): kept messages are sent
    /// again later, registry events are recovered by a snapshot, the rest
    /// (presence, iq, heartbeats) is lost as on a lost connection.
    pub dropped: Counter,
}

impl Default for BusCounters {
    fn default() -> Self {
        BusCounters::new()
    }
}

impl BusCounters {
    /// Fresh counters (a node registers its own when it joins).
    pub fn new() -> BusCounters {
        BusCounters {
            messages_out: Counter::default(),
            frames_out: Counter::default(),
            bytes_out: Counter::default(),
            messages_in: Counter::default(),
            frames_in: Counter::default(),
            bytes_in: Counter::default(),
            bad_messages: Counter::default(),
            batch_frames: Histogram::new(exponential_buckets(1.0, 2.0, 10)),
            ack_seconds: Histogram::new(exponential_buckets(0.000_1, 2.0, 16)),
            retransmitted: Counter::default(),
            rerouted: Counter::default(),
            dropped: Counter::default(),
        }
    }

    /// Registers the counters as `cluster_*` (in a registry that adds
    /// the `starling_` prefix: `Metrics::with_registry`).
    pub fn register(&self, r: &mut prometheus_client::registry::Registry) {
        let c = |r: &mut prometheus_client::registry::Registry, n: &str, h: &str, m: &Counter| {
            r.register(n, h, m.clone())
        };
        c(
            r,
            "cluster_messages_out",
            "NATS messages (batches of frames) published",
            &self.messages_out,
        );
        c(
            r,
            "cluster_frames_out",
            "Cluster bus frames published",
            &self.frames_out,
        );
        c(
            r,
            "cluster_bytes_out",
            "Cluster bus bytes published",
            &self.bytes_out,
        );
        c(
            r,
            "cluster_messages_in",
            "NATS messages received",
            &self.messages_in,
        );
        c(
            r,
            "cluster_frames_in",
            "Cluster bus frames received",
            &self.frames_in,
        );
        c(
            r,
            "cluster_bytes_in",
            "Cluster bus bytes received",
            &self.bytes_in,
        );
        c(
            r,
            "cluster_bad_messages",
            "Unreadable cluster bus messages dropped",
            &self.bad_messages,
        );
        c(
            r,
            "cluster_frames_dropped",
            "Frames not queued for the cluster bus because its queue was full ([cluster] max_queue_mib)",
            &self.dropped,
        );
        c(
            r,
            "cluster_retransmitted",
            "Cross-node messages sent again for want of an acknowledgement",
            &self.retransmitted,
        );
        c(
            r,
            "cluster_rerouted",
            "Cross-node messages routed again after their node died or left",
            &self.rerouted,
        );
        r.register(
            "cluster_batch_frames",
            "Frames per published NATS message",
            self.batch_frames.clone(),
        );
        r.register(
            "cluster_ack_seconds",
            "Cross-node message to its acknowledgement",
            self.ack_seconds.clone(),
        );
    }
}

/// This node's side of the cluster bus.
pub struct Cluster {
    node: u8,
    incarnation: u64,
    cfg: ClusterSection,
    all_subject: String,
    node_prefix: String,
    client: async_nats::Client,
    table: Arc<SessionTable>,
    env: std::sync::OnceLock<Weak<Env>>,
    /// Registry event numbering; held while an event is queued, so events
    /// leave in their numbers' order.
    seq: Mutex<u64>,
    out: mpsc::UnboundedSender<Out>,
    out_rx: Mutex<Option<mpsc::UnboundedReceiver<Out>>>,
    /// Bytes of frames in `out`, not yet taken by the publisher; at most
    /// `max_queue_bytes` (the channel is unbounded in count, bounded here
    /// in bytes, so a sender never waits).
    out_bytes: std::sync::atomic::AtomicUsize,
    max_queue_bytes: usize,
    /// The last delivery id used, per destination node.
    next_id: Mutex<HashMap<u8, u64>>,
    /// Kept messages by (destination node, id).
    pending: Mutex<BTreeMap<(u8, u64), Pending>>,
    /// Deliveries taken, per sending (node, incarnation).
    taken: Mutex<HashMap<(u8, u64), Taken>>,
    /// Acknowledgements to send, by node: gathered for up to
    /// [`ACK_DELAY`] so that one frame carries many (acks are not on a
    /// message's way to its recipient, only the sender's bookkeeping).
    acks: Mutex<BTreeMap<u8, Vec<u64>>>,
    acks_queued: tokio::sync::Notify,
    peers: Mutex<BTreeMap<u8, Peer>>,
    /// Nodes declared dead, with the incarnation that was.
    dead: Mutex<HashMap<u8, u64>>,
    /// Bus traffic.
    pub counters: BusCounters,
}

/// Why the cluster could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// NATS did not answer.
    #[error(
        "cannot reach the NATS server at {url} ({source}); start it, or check [cluster] nats_url"
    )]
    Connect {
        /// The configured URL.
        url: String,
        /// Why.
        source: async_nats::ConnectError,
    },
    /// A subscription failed.
    #[error("cannot subscribe on the NATS server: {0}")]
    Subscribe(#[from] async_nats::SubscribeError),
}

/// The [`SessionRef::id`] of a [`Frame::Deliver`] that carries a stanza
/// for a local service placed on the receiving node, not for a session
/// (session ids count up from 1 and never reach it).
pub const SERVICE_DELIVERY: u64 = u64::MAX;

/// The rendezvous weight of `node` for `key`: FNV-1a over the key and the
/// node, finished with SplitMix64's mixer (the same on every node and
/// build; std's hasher is randomly seeded per process).
pub fn rendezvous_score(key: &str, node: u8) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes().chain(std::iter::once(node)) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The node of `nodes` that runs `key` ([`Cluster::placement`]'s rule,
/// for tests and tools).
pub fn rendezvous(key: &str, nodes: &[u8]) -> Option<u8> {
    nodes
        .iter()
        .copied()
        .max_by_key(|n| (rendezvous_score(key, *n), *n))
}

/// Connects to the servers of `cfg.nats_url` with `options`, within
/// `connect_timeout_secs`.
async fn connect_client(
    cfg: &ClusterSection,
    options: async_nats::ConnectOptions,
) -> Result<async_nats::Client, ClusterError> {
    let url = cfg.nats_url.clone().unwrap_or_default();
    options
        .connection_timeout(Duration::from_secs(cfg.connect_timeout_secs.max(1)))
        .connect(cfg.servers())
        .await
        .map_err(|source| ClusterError::Connect { url, source })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Cluster {
    /// Connects to NATS. Nothing is sent before [`Cluster::start`].
    pub async fn connect(
        cfg: &ClusterSection,
        node: u8,
        table: Arc<SessionTable>,
    ) -> Result<Arc<Cluster>, ClusterError> {
        let options = async_nats::ConnectOptions::new()
            .name(format!("starling-node-{node}"))
            // The NATS client's own queues, in messages (a message is a
            // batch of at most MAX_BATCH_BYTES): what waits to be written
            // (default 2,048, up to 1 GiB of batches; past it our
            // publisher waits and `max_queue_mib` applies) and what was
            // received and not yet handled (default 65,536; past it NATS
            // drops as a slow consumer, which kept messages and registry
            // snapshots recover from).
            .client_capacity(CLIENT_CAPACITY)
            .subscription_capacity(SUBSCRIPTION_CAPACITY)
            .event_callback(move |event| async move {
                match event {
                    async_nats::Event::Connected => {
                        tracing::info!(node, "cluster bus (NATS) connected")
                    }
                    async_nats::Event::Disconnected => {
                        tracing::warn!(node, "cluster bus (NATS) disconnected; reconnecting (stanzas for other nodes wait)")
                    }
                    other => tracing::info!(node, event = %other, "cluster bus (NATS) event"),
                }
            });
        let client = connect_client(cfg, options).await?;
        let mut incarnation = [0u8; 8];
        getrandom::fill(&mut incarnation).expect("the OS random source works");
        let (out, out_rx) = mpsc::unbounded_channel();
        Ok(Arc::new(Cluster {
            node,
            incarnation: u64::from_le_bytes(incarnation),
            all_subject: format!("{}.all", cfg.name),
            node_prefix: format!("{}.node.", cfg.name),
            cfg: cfg.clone(),
            client,
            table,
            env: std::sync::OnceLock::new(),
            seq: Mutex::new(0),
            out,
            out_rx: Mutex::new(Some(out_rx)),
            out_bytes: std::sync::atomic::AtomicUsize::new(0),
            max_queue_bytes: cfg.max_queue_mib.max(1) * 1024 * 1024,
            next_id: Mutex::new(HashMap::new()),
            pending: Mutex::new(BTreeMap::new()),
            taken: Mutex::new(HashMap::new()),
            acks: Mutex::new(BTreeMap::new()),
            acks_queued: tokio::sync::Notify::new(),
            peers: Mutex::new(BTreeMap::new()),
            dead: Mutex::new(HashMap::new()),
            counters: BusCounters::new(),
        }))
    }

    /// Subscribes, starts the publisher and the heartbeat, and asks the
    /// other nodes for their sessions. Tasks end when `shutdown` turns true.
    pub async fn start(
        self: &Arc<Self>,
        env: &Arc<Env>,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Vec<tokio::task::JoinHandle<()>>, ClusterError> {
        let _ = self.env.set(Arc::downgrade(env));
        env.metrics.with_registry(|r| self.counters.register(r));
        let all = self.client.subscribe(self.all_subject.clone()).await?;
        let mine = self
            .client
            .subscribe(format!("{}{}", self.node_prefix, self.node))
            .await?;
        let mut tasks = Vec::new();
        if let Some(rx) = lock(&self.out_rx).take() {
            tasks.push(tokio::spawn(self.clone().publisher(rx)));
        }
        for sub in [all, mine] {
            tasks.push(tokio::spawn(self.clone().receiver(sub)));
        }
        tasks.push(tokio::spawn(self.clone().heartbeat(shutdown)));
        tasks.push(tokio::spawn(self.clone().ack_sender()));
        // Sessions bound from now on are announced.
        self.table
            .set_observer(Arc::new(Observer(Arc::downgrade(self))) as Arc<dyn TableObserver>);
        self.heartbeat_now();
        tracing::info!(
            node = self.node,
            cluster = %self.cfg.name,
            "joined the cluster"
        );
        Ok(tasks)
    }

    /// This node's id.
    pub fn node(&self) -> u8 {
        self.node
    }

    fn header(&self) -> Header {
        Header {
            node: self.node,
            incarnation: self.incarnation,
        }
    }

    fn send(&self, dest: Dest, frame: &Frame) {
        self.enqueue(dest, frame::encode_frame(frame));
    }

    /// Queues an encoded frame for the publisher, unless the queue holds
    /// `max_queue_bytes` already (the bus is stalled): then the frame is
    /// dropped and counted, and `false` returned. A kept message stays
    /// kept and is sent again by the retransmit timer; a lost registry
    /// event shows as a gap in its sequence numbers and the peers ask for
    /// a snapshot.
    fn enqueue(&self, dest: Dest, bytes: Vec<u8>) -> bool {
        use std::sync::atomic::Ordering;
        let n = bytes.len();
        if self.out_bytes.load(Ordering::Relaxed) + n > self.max_queue_bytes {
            self.counters.dropped.inc();
            starling_core::log_throttled!(
                warn,
                max_queue_mib = self.cfg.max_queue_mib,
                "cluster bus queue full (NATS is not taking frames); frames dropped: kept messages will be sent again"
            );
            return false;
        }
        self.out_bytes.fetch_add(n, Ordering::Relaxed);
        if self.out.send(Out::Frame(dest, bytes)).is_err() {
            self.out_bytes.fetch_sub(n, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Queues a registry event (numbered) or a heartbeat (carrying the
    /// last number).
    fn announce(&self, make: impl FnOnce(u64) -> Frame, numbered: bool) {
        let mut seq = lock(&self.seq);
        if numbered {
            *seq += 1;
        }
        let f = make(*seq);
        self.send(Dest::All, &f);
    }

    fn heartbeat_now(&self) {
        let sessions = self.table.local_count() as u32;
        self.announce(|seq| Frame::Heartbeat { seq, sessions }, false);
    }

    /// Sends a stanza to a session of another node (the router found it
    /// there). A message is kept until that node acknowledges it.
    pub fn deliver(&self, to: &SessionRef, stanza: Stanza) {
        if stanza.kind() != StanzaKind::Message {
            // Presence and iq: as on one node, not kept (an iq's sender
            // times out; presence is state, sent again on change).
            let _ = self.deliver_unacked(to, stanza);
            return;
        }
        // Serialized outside any lock; numbered and queued under the
        // pending lock, so ids leave in order.
        let mut frame = frame::encode_deliver(0, to, stanza.element());
        let mut pending = lock(&self.pending);
        let id = {
            let mut ids = lock(&self.next_id);
            let n = ids.entry(to.node).or_insert(0);
            *n += 1;
            *n
        };
        frame::set_deliver_id(&mut frame, id);
        // Kept even when the queue is full: the retransmit timer sends it.
        self.enqueue(Dest::Node(to.node), frame.clone());
        let now = Instant::now();
        pending.insert(
            (to.node, id),
            Pending {
                frame,
                sent_at: now,
                first_sent: now,
            },
        );
    }

    /// The node that runs `key` (a group-chat room): rendezvous hashing
    /// over the living nodes, this one included — every node computes the
    /// same owner from the same membership, and when a node comes or goes
    /// only the keys it wins or held move.
    pub fn placement(&self, key: &str) -> u8 {
        let mut best = (self.node, rendezvous_score(key, self.node));
        for n in lock(&self.peers).keys() {
            let s = rendezvous_score(key, *n);
            if s > best.1 || (s == best.1 && *n > best.0) {
                best = (*n, s);
            }
        }
        best.0
    }

    /// Hands a stanza for a local service (a room, an external component)
    /// to the same service on `node`
    /// ([`starling_core::Router::to_service_on`]): a [`Frame::Deliver`]
    /// marked [`SERVICE_DELIVERY`], so a message is kept until that node
    /// took it and placed again here if the node dies. The marker rides in
    /// a [`SessionRef`], whose JID the receiver does not read (it finds the
    /// service by the stanza's `to`): the sender's full JID, or for a
    /// sender without one (a bare JID's subscription presence, the
    /// server's own requests) `<the service's domain>/service`. Gives the
    /// stanza back (`Some`) if it has no `to` either.
    pub fn deliver_service(&self, node: u8, stanza: Stanza) -> Option<Stanza> {
        let carrier = stanza
            .from()
            .and_then(|f| f.try_as_full().ok())
            .cloned()
            .or_else(|| {
                let domain = stanza.to()?.domain().as_str().to_owned();
                BareJid::new(&domain)
                    .ok()?
                    .with_resource_str("service")
                    .ok()
            });
        let Some(jid) = carrier else {
            return Some(stanza);
        };
        let to = SessionRef {
            jid,
            node,
            id: SERVICE_DELIVERY,
        };
        self.deliver(&to, stanza);
        None
    }

    /// Sends again the kept messages older than `after` to nodes still
    /// alive (their delivery or its acknowledgement was lost on the bus).
    fn retransmit(&self, after: Duration) -> usize {
        let alive: Vec<u8> = lock(&self.peers).keys().copied().collect();
        let mut pending = lock(&self.pending);
        let mut n = 0;
        for ((node, _), p) in pending.iter_mut() {
            if p.sent_at.elapsed() < after || !alive.contains(node) {
                continue;
            }
            if !self.enqueue(Dest::Node(*node), p.frame.clone()) {
                // Still full: the rest waits for the next round.
                break;
            }
            p.sent_at = Instant::now();
            n += 1;
        }
        self.counters.retransmitted.inc_by(n as u64);
        n
    }

    /// A server-made stanza for exactly one session of another node
    /// ([`starling_core::Router::deliver`]): best effort, no fallback.
    pub fn deliver_unacked(&self, to: &SessionRef, stanza: Stanza) -> Result<(), SessionSendError> {
        self.send(
            Dest::Node(to.node),
            &Frame::Deliver {
                id: 0,
                to: to.clone(),
                stanza: stanza.into_element(),
            },
        );
        Ok(())
    }

    /// Runs a module's timer handler in a session of another node.
    pub fn notify(&self, to: &SessionRef, key: TimerKey) -> Result<(), SessionSendError> {
        self.send(
            Dest::Node(to.node),
            &Frame::Notify {
                to: to.clone(),
                module: key.module.to_owned(),
                token: key.token,
            },
        );
        Ok(())
    }

    /// Closes a session of another node.
    pub fn close(&self, to: &SessionRef, reason: &CloseReason) {
        self.send(
            Dest::Node(to.node),
            &Frame::Close {
                to: to.clone(),
                why: CloseWhy::from_reason(reason),
            },
        );
    }

    /// Tells every other node to drop `module`'s cache entry `key`.
    pub fn invalidate(&self, module: &str, key: &str) {
        self.send(
            Dest::All,
            &Frame::Invalidate {
                module: module.to_owned(),
                key: key.to_owned(),
            },
        );
    }

    /// Closes an account's sessions on every other node.
    pub fn close_account(&self, account: &BareJid, reason: &CloseReason) {
        self.send(
            Dest::All,
            &Frame::CloseAccount {
                account: account.clone(),
                why: CloseWhy::from_reason(reason),
            },
        );
    }

    /// Says goodbye (after this node's sessions closed) and waits until
    /// everything queued for the bus is on the NATS server (at most 2 s).
    pub async fn leave(&self) {
        self.announce(|_| Frame::Leaving, false);
        self.flush(Duration::from_secs(2)).await;
    }

    /// Waits until every frame queued so far is published and flushed.
    pub async fn flush(&self, within: Duration) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.out.send(Out::Flush(tx)).is_ok() {
            let _ = tokio::time::timeout(within, rx).await;
        }
    }

    /// Every node this one knows, itself first.
    pub fn status(&self) -> Vec<NodeStatus> {
        let counts = self.table.remote_counts();
        let mut out = vec![NodeStatus {
            node: self.node,
            this_node: true,
            sessions: self.table.local_count() as u64,
            registry_entries: self.table.local_count() as u64,
            last_heartbeat_ms_ago: 0,
        }];
        for (n, p) in lock(&self.peers).iter() {
            out.push(NodeStatus {
                node: *n,
                this_node: false,
                sessions: u64::from(p.sessions),
                registry_entries: counts.get(n).copied().unwrap_or(0) as u64,
                last_heartbeat_ms_ago: p.last_seen.elapsed().as_millis() as u64,
            });
        }
        out
    }

    /// Messages sent to other nodes and not acknowledged yet.
    pub fn pending_count(&self) -> usize {
        lock(&self.pending).len()
    }

    /// Batches queued frames by destination into NATS messages.
    async fn publisher(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<Out>) {
        let mut batches: BTreeMap<Option<u8>, Writer> = BTreeMap::new();
        let mut last_publish = Instant::now() - Duration::from_secs(1);
        while let Some(first) = rx.recv().await {
            // Under load (the previous batch left less than a millisecond
            // ago), wait for the next timer tick so that one NATS message
            // carries what queues meanwhile.
            if last_publish.elapsed() < LINGER_WHEN_BUSY {
                tokio::time::sleep(LINGER_WHEN_BUSY).await;
            }
            last_publish = Instant::now();
            let mut next = Some(first);
            let mut n = 0;
            let mut flushed = Vec::new();
            while let Some(item) = next.take() {
                let (dest, bytes) = match item {
                    Out::Frame(d, b) => {
                        self.out_bytes
                            .fetch_sub(b.len(), std::sync::atomic::Ordering::Relaxed);
                        (d, b)
                    }
                    Out::Flush(done) => {
                        flushed.push(done);
                        if n < 4 * MAX_BATCH_FRAMES {
                            next = rx.try_recv().ok();
                        }
                        continue;
                    }
                };
                let key = match dest {
                    Dest::All => None,
                    Dest::Node(k) => Some(k),
                };
                // A frame that would take the batch past its size goes in
                // the next one: a message stays under NATS' payload limit.
                if batches
                    .get(&key)
                    .is_some_and(|w| !w.is_empty() && w.len() + bytes.len() > MAX_BATCH_BYTES)
                {
                    let w = batches.remove(&key).expect("just seen");
                    self.publish(key, w).await;
                }
                let w = batches
                    .entry(key)
                    .or_insert_with(|| Writer::new(self.header()));
                w.push_encoded(&bytes);
                if w.frames() >= MAX_BATCH_FRAMES || w.len() >= MAX_BATCH_BYTES {
                    let w = batches.remove(&key).expect("just used");
                    self.publish(key, w).await;
                }
                n += 1;
                if n < 4 * MAX_BATCH_FRAMES {
                    next = rx.try_recv().ok();
                }
            }
            for (key, w) in std::mem::take(&mut batches) {
                self.publish(key, w).await;
            }
            if !flushed.is_empty() {
                let _ = self.client.flush().await;
                for done in flushed {
                    let _ = done.send(());
                }
            }
        }
    }

    async fn publish(&self, key: Option<u8>, w: Writer) {
        let frames = w.frames() as u64;
        let msg = w.finish();
        let subject = match key {
            None => self.all_subject.clone(),
            Some(n) => format!("{}{n}", self.node_prefix),
        };
        self.counters.messages_out.inc();
        self.counters.frames_out.inc_by(frames);
        self.counters.bytes_out.inc_by(msg.len() as u64);
        self.counters.batch_frames.observe(frames as f64);
        if let Err(e) = self.client.publish(subject, Bytes::from(msg)).await {
            // The client queues while reconnecting; this is a closed client
            // or an oversized message. Kept messages are re-routed if the
            // peer is declared dead meanwhile.
            tracing::warn!(error = %e, "cluster bus publish failed");
        }
    }

    async fn receiver(self: Arc<Self>, mut sub: async_nats::Subscriber) {
        while let Some(msg) = sub.next().await {
            self.counters.messages_in.inc();
            self.counters.bytes_in.inc_by(msg.payload.len() as u64);
            let (header, frames) = match frame::decode(&msg.payload) {
                Ok(x) => x,
                Err(e) => {
                    self.counters.bad_messages.inc();
                    tracing::warn!(subject = %msg.subject, error = %e, "unreadable cluster bus message dropped");
                    continue;
                }
            };
            if header.node == self.node {
                if header.incarnation != self.incarnation {
                    tracing::error!(node = self.node, "another process uses this node_id on the cluster bus: give every node its own [server] node_id");
                }
                continue;
            }
            self.counters.frames_in.inc_by(frames.len() as u64);
            let Some(env) = self.env.get().and_then(Weak::upgrade) else {
                return;
            };
            self.handle(&env, header, frames).await;
        }
    }

    async fn handle(&self, env: &Env, h: Header, frames: Vec<Frame>) {
        let mut acks = Vec::new();
        let mut lost = Vec::new();
        let mut found = Vec::new();
        for f in frames {
            match f {
                Frame::Heartbeat { seq, sessions } => {
                    lost.extend(self.on_heartbeat(h, seq, sessions));
                }
                f @ (Frame::Bound { .. } | Frame::Unbound { .. } | Frame::Presence { .. }) => {
                    lost.extend(self.on_event(h, f));
                }
                Frame::Snapshot {
                    seq,
                    entries,
                    first,
                    last,
                } => {
                    lost.extend(self.on_snapshot(h, seq, entries, first, last, &mut found));
                }
                Frame::SyncRequest => self.send_snapshot(h.node),
                Frame::Deliver { id, to, stanza } => {
                    let new = id == 0
                        || lock(&self.taken)
                            .entry((h.node, h.incarnation))
                            .or_default()
                            .take(id);
                    if new {
                        self.on_deliver(env, to, stanza).await;
                    }
                    if id != 0 {
                        acks.push(id);
                    }
                }
                Frame::Ack { ids } => {
                    let mut p = lock(&self.pending);
                    for id in ids {
                        if let Some(k) = p.remove(&(h.node, id)) {
                            self.counters
                                .ack_seconds
                                .observe(k.first_sent.elapsed().as_secs_f64());
                        }
                    }
                }
                Frame::Notify { to, module, token } => {
                    if let (Some(handle), Some(module)) =
                        (self.table.handle(&to), env.hooks.timer_module(&module))
                    {
                        let _ = handle
                            .try_send(SessionMsg::Notify(Box::new(TimerKey { module, token })));
                    }
                }
                Frame::Close { to, why } => {
                    if let Some(handle) = self.table.handle(&to) {
                        let _ = handle.try_send(SessionMsg::Close(why.into_reason()));
                    }
                }
                Frame::CloseAccount { account, why } => {
                    let reason = why.into_reason();
                    for (_, handle) in self.table.resources_with_handles(&account) {
                        if let Some(handle) = handle {
                            let _ = handle.try_send(SessionMsg::Close(reason.clone()));
                        }
                    }
                }
                Frame::Invalidate { module, key } => {
                    if let Some(h) = env.hooks.cache(&module) {
                        h.invalidate(&key);
                    }
                }
                Frame::Leaving => {
                    let removed = lock(&self.peers).remove(&h.node).is_some();
                    let gone = self.table.remove_node(h.node);
                    tracing::info!(
                        node = h.node,
                        left_sessions = gone.len(),
                        known = removed,
                        "node left the cluster"
                    );
                    self.reroute_pending(env, h.node).await;
                }
            }
        }
        if !acks.is_empty() {
            let first = {
                let mut all = lock(&self.acks);
                let was_empty = all.is_empty();
                all.entry(h.node).or_default().extend(acks);
                was_empty
            };
            if first {
                self.acks_queued.notify_one();
            }
        }
        if !lost.is_empty() {
            self.sessions_lost(env, lost).await;
        }
        if !found.is_empty() && self.lowest_alive() {
            for entry in found {
                let _ = run_chain!(env.hooks.session_lost, "session_returned", |h| h
                    .session_returned(env, &entry));
            }
        }
    }

    /// Returns the sessions lost if `h` is a new incarnation of a known node.
    fn on_heartbeat(&self, h: Header, seq: u64, sessions: u32) -> Vec<starling_core::SessionEntry> {
        let mut lost = Vec::new();
        let mut peers = lock(&self.peers);
        let peer = self.peer(&mut peers, h, &mut lost);
        peer.last_seen = Instant::now();
        peer.last_heartbeat = std::time::SystemTime::now();
        peer.sessions = sessions;
        if !peer.awaiting && seq > peer.applied {
            // Its last events never arrived.
            self.resync(peer, h.node);
        }
        lost
    }

    /// The peer of `h`, created (and asked for a snapshot) if new; a new
    /// incarnation replaces the old one, whose sessions are lost.
    fn peer<'a>(
        &self,
        peers: &'a mut BTreeMap<u8, Peer>,
        h: Header,
        lost: &mut Vec<starling_core::SessionEntry>,
    ) -> &'a mut Peer {
        let fresh = match peers.get(&h.node) {
            None => true,
            Some(p) if p.incarnation != h.incarnation => {
                tracing::warn!(
                    node = h.node,
                    "node restarted: forgetting its previous sessions"
                );
                lost.extend(self.table.remove_node(h.node));
                true
            }
            Some(_) => false,
        };
        if fresh {
            tracing::info!(
                node = h.node,
                "node joined the cluster; asking for its sessions"
            );
            let mut peer = Peer::new(h.incarnation);
            peer.returned = lock(&self.dead).remove(&h.node) == Some(h.incarnation);
            if peer.returned {
                tracing::warn!(
                    node = h.node,
                    "node declared dead is back (a partition ended); its sessions will be announced again"
                );
            }
            peers.insert(h.node, peer);
            self.send(Dest::Node(h.node), &Frame::SyncRequest);
        }
        peers.get_mut(&h.node).expect("inserted above")
    }

    fn on_event(&self, h: Header, f: Frame) -> Vec<starling_core::SessionEntry> {
        let seq = match &f {
            Frame::Bound { seq, .. } | Frame::Unbound { seq, .. } | Frame::Presence { seq, .. } => {
                *seq
            }
            _ => return Vec::new(),
        };
        let mut lost = Vec::new();
        let mut peers = lock(&self.peers);
        let peer = self.peer(&mut peers, h, &mut lost);
        peer.last_seen = Instant::now();
        if peer.awaiting {
            peer.buffered.push((seq, f));
            return lost;
        }
        match peer.order(seq) {
            Order::Stale => {}
            Order::Next => self.apply(f),
            Order::Gap => {
                peer.buffered.push((seq, f));
                self.resync(peer, h.node);
            }
        }
        lost
    }

    /// Asks `node` for a snapshot; its events wait for it.
    fn resync(&self, peer: &mut Peer, node: u8) {
        peer.awaiting = true;
        self.send(Dest::Node(node), &Frame::SyncRequest);
    }

    fn apply(&self, f: Frame) {
        match f {
            Frame::Bound {
                session, bound_at, ..
            } => {
                if let Some(old) = self.table.remote_bound(&session, bound_at) {
                    tracing::info!(jid = %session.jid, node = session.node, local_session = old.id, "resource conflict: bound again on another node; closing ours");
                    let _ = old.try_send(SessionMsg::Close(CloseReason::Replaced));
                }
            }
            Frame::Unbound { session, .. } => self.table.remote_unbound(&session),
            Frame::Presence { entry, .. } => self.table.remote_presence(
                &entry.session,
                entry.presence.map(|(p, el)| (p, Arc::new(el))),
            ),
            _ => {}
        }
    }

    fn on_snapshot(
        &self,
        h: Header,
        seq: u64,
        entries: Vec<EntryState>,
        first: bool,
        last: bool,
        found: &mut Vec<starling_core::SessionEntry>,
    ) -> Vec<starling_core::SessionEntry> {
        let mut lost = Vec::new();
        let mut peers = lock(&self.peers);
        let peer = self.peer(&mut peers, h, &mut lost);
        if peer.returned {
            found.extend(entries.iter().map(|e| starling_core::SessionEntry {
                session: e.session.clone(),
                priority: e.presence.as_ref().map(|(p, _)| *p),
                presence: e.presence.as_ref().map(|(_, el)| Arc::new(el.clone())),
            }));
            peer.returned = !last;
        }
        peer.last_seen = Instant::now();
        // The first part replaces what we knew of that node.
        let before = if first {
            self.table.remove_node(h.node)
        } else {
            Vec::new()
        };
        for e in &entries {
            if let Some(old) = self.table.remote_bound(&e.session, e.bound_at) {
                let _ = old.try_send(SessionMsg::Close(CloseReason::Replaced));
            }
            if let Some((p, el)) = &e.presence {
                self.table
                    .remote_presence(&e.session, Some((*p, Arc::new(el.clone()))));
            }
        }
        tracing::debug!(
            node = h.node,
            sessions = entries.len(),
            replaced = before.len(),
            seq,
            first,
            last,
            "registry snapshot part applied"
        );
        if !last {
            // Its events keep waiting for the rest.
            peer.awaiting = true;
            return lost;
        }
        peer.applied = seq;
        peer.awaiting = false;
        let mut buffered = std::mem::take(&mut peer.buffered);
        buffered.sort_by_key(|(s, _)| *s);
        for (s, f) in buffered {
            match peer.order(s) {
                Order::Stale => {}
                Order::Next => self.apply(f),
                Order::Gap => {
                    // The next snapshot is taken after these were sent.
                    self.resync(peer, h.node);
                    break;
                }
            }
        }
        lost
    }

    fn send_snapshot(&self, to: u8) {
        // As of event `seq` at least: every numbered event's change is in
        // the table before its number is taken. Changes made while the
        // entries are read may be in it too; their events come after `seq`
        // and applying them again is harmless. (The event lock is not held
        // while the table is read: binds go on meanwhile.)
        let seq = *lock(&self.seq);
        let entries: Vec<EntryState> = self
            .table
            .local_sessions()
            .into_iter()
            .map(|s| EntryState {
                bound_at: s.bound_at,
                presence: s.entry.priority.zip(s.entry.presence.as_deref().cloned()),
                session: s.entry.session,
            })
            .collect();
        for part in frame::snapshot_parts(seq, entries, self.cfg.snapshot_part_bytes.max(1)) {
            self.send(Dest::Node(to), &part);
        }
    }

    async fn on_deliver(&self, env: &Env, to: SessionRef, stanza: Element) {
        let Ok(stanza) = Stanza::from_element(stanza) else {
            return;
        };
        if to.id == SERVICE_DELIVERY {
            // A stanza another node placed on this one's service (a room).
            let service = stanza.to().and_then(|t| {
                env.hooks
                    .service_for(t.domain().as_str(), |d| env.hosts.modules_off(d))
                    .cloned()
            });
            if let Some(s) = service {
                s.handle_placed(env, stanza).await;
            }
            return;
        }
        let stanza = match self.table.handle(&to) {
            Some(handle) => match handle.try_send(SessionMsg::Stanza(Box::new(stanza))) {
                Ok(()) => return,
                Err((SessionSendError::Full, SessionMsg::Stanza(s))) => {
                    env.metrics.mailbox_full.inc();
                    if let Some(reply) = s.error_reply(
                        StanzaError::new(StanzaErrorCondition::ResourceConstraint)
                            .with_text("the recipient is not reading its messages fast enough"),
                    ) {
                        env.route(reply).await;
                    }
                    return;
                }
                Err((_, SessionMsg::Stanza(s))) => *s,
                Err(_) => return,
            },
            None => stanza,
        };
        // The session ended meanwhile: another resource, offline storage
        // or an error, as on one node (RFC 6121 §8.5.3.2).
        env.router.reroute(env, stanza).await;
    }

    /// Routes again the messages kept for `node` (it died or left).
    async fn reroute_pending(&self, env: &Env, node: u8) {
        lock(&self.taken).retain(|(n, _), _| *n != node);
        let kept: Vec<(Stanza, bool)> = {
            let mut p = lock(&self.pending);
            // In the order they were sent (the map is ordered by id).
            let ids: Vec<(u8, u64)> = p
                .range((node, 0)..=(node, u64::MAX))
                .map(|(k, _)| *k)
                .collect();
            ids.into_iter()
                .filter_map(|k| p.remove(&k))
                .filter_map(|v| match frame::decode_frame(&v.frame) {
                    Ok(Some(Frame::Deliver { stanza, to, .. })) => Stanza::from_element(stanza)
                        .ok()
                        .map(|s| (s, to.id == SERVICE_DELIVERY)),
                    _ => None,
                })
                .collect()
        };
        if !kept.is_empty() {
            self.counters.rerouted.inc_by(kept.len() as u64);
            tracing::info!(
                node,
                messages = kept.len(),
                "routing again messages the lost node never acknowledged"
            );
        }
        for (s, placed) in kept {
            if placed {
                // A room's stanza: placed again, on a living node.
                env.route(s).await;
            } else {
                env.router.reroute(env, s).await;
            }
        }
    }

    /// True if no living node has a lower id than this one.
    fn lowest_alive(&self) -> bool {
        lock(&self.peers).keys().all(|n| *n > self.node)
    }

    /// Runs the session-lost handlers, on the lowest living node only.
    async fn sessions_lost(&self, env: &Env, lost: Vec<starling_core::SessionEntry>) {
        if !self.lowest_alive() {
            return;
        }
        for entry in lost {
            let _ = run_chain!(env.hooks.session_lost, "session_lost", |h| h
                .session_lost(env, &entry));
        }
    }

    /// Sends the gathered acknowledgements, [`ACK_DELAY`] after the first.
    async fn ack_sender(self: Arc<Self>) {
        loop {
            self.acks_queued.notified().await;
            tokio::time::sleep(ACK_DELAY).await;
            let all = std::mem::take(&mut *lock(&self.acks));
            for (node, ids) in all {
                self.send(Dest::Node(node), &Frame::Ack { ids });
            }
        }
    }

    async fn heartbeat(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let every = Duration::from_millis(self.cfg.heartbeat_ms.max(1));
        let timeout = Duration::from_millis(self.cfg.node_timeout_ms);
        let retransmit_after = (2 * every).max(Duration::from_millis(500));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            self.heartbeat_now();
            let resent = self.retransmit(retransmit_after);
            if resent > 0 {
                tracing::debug!(
                    messages = resent,
                    "unacknowledged cross-node messages sent again"
                );
            }
            let dead: Vec<u8> = lock(&self.peers)
                .iter()
                .filter(|(_, p)| p.last_seen.elapsed() > timeout)
                .map(|(n, _)| *n)
                .collect();
            if dead.is_empty() {
                continue;
            }
            let Some(env) = self.env.get().and_then(Weak::upgrade) else {
                return;
            };
            for node in dead {
                if let Some(p) = lock(&self.peers).remove(&node) {
                    lock(&self.dead).insert(node, p.incarnation);
                }
                let lost = self.table.remove_node(node);
                tracing::warn!(
                    node,
                    sessions = lost.len(),
                    timeout_ms = timeout.as_millis() as u64,
                    "node not heard from: declared dead; its sessions are gone"
                );
                self.reroute_pending(&env, node).await;
                self.sessions_lost(&env, lost).await;
            }
        }
    }
}

/// A node as its heartbeats describe it (`starling cluster status`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct ObservedNode {
    /// Its `node_id`.
    pub node: u8,
    /// Sessions bound on it.
    pub sessions: u32,
    /// Its registry events so far.
    pub registry_events: u64,
    /// Its process incarnation (changes when it restarts).
    pub incarnation: String,
    /// Milliseconds since its last heartbeat, when the listening ended.
    pub last_heartbeat_ms_ago: u64,
}

/// Listens to the bus of the cluster `cfg` describes for `listen_for` and
/// reports every node heard (sorted by id). Sends nothing.
pub async fn observe(
    cfg: &ClusterSection,
    listen_for: Duration,
) -> Result<Vec<ObservedNode>, ClusterError> {
    let options = async_nats::ConnectOptions::new().name("starling-cluster-status");
    let client = connect_client(cfg, options).await?;
    let mut sub = client.subscribe(format!("{}.all", cfg.name)).await?;
    let mut seen: BTreeMap<u8, (ObservedNode, Instant)> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + listen_for;
    while let Ok(Some(msg)) = tokio::time::timeout_at(deadline, sub.next()).await {
        let Ok((h, frames)) = frame::decode(&msg.payload) else {
            continue;
        };
        for f in frames {
            if let Frame::Heartbeat { seq, sessions } = f {
                seen.insert(
                    h.node,
                    (
                        ObservedNode {
                            node: h.node,
                            sessions,
                            registry_events: seq,
                            incarnation: format!("{:016x}", h.incarnation),
                            last_heartbeat_ms_ago: 0,
                        },
                        Instant::now(),
                    ),
                );
            }
        }
    }
    Ok(seen
        .into_values()
        .map(|(mut n, at)| {
            n.last_heartbeat_ms_ago = at.elapsed().as_millis() as u64;
            n
        })
        .collect())
}

/// Publishes this node's session changes.
struct Observer(Weak<Cluster>);

impl TableObserver for Observer {
    fn bound(&self, session: &SessionRef, bound_at: u64) {
        if let Some(c) = self.0.upgrade() {
            c.announce(
                |seq| Frame::Bound {
                    seq,
                    session: session.clone(),
                    bound_at,
                },
                true,
            );
        }
    }

    fn unbound(&self, session: &SessionRef) {
        if let Some(c) = self.0.upgrade() {
            c.announce(
                |seq| Frame::Unbound {
                    seq,
                    session: session.clone(),
                },
                true,
            );
        }
    }

    fn presence(&self, session: &SessionRef, presence: Option<(i8, Arc<Element>)>) {
        if let Some(c) = self.0.upgrade() {
            c.announce(
                |seq| Frame::Presence {
                    seq,
                    entry: EntryState {
                        session: session.clone(),
                        bound_at: 0,
                        presence: presence.map(|(p, el)| (p, (*el).clone())),
                    },
                },
                true,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Taken;

    #[test]
    fn a_retransmitted_delivery_is_taken_once_and_a_lost_one_when_it_comes() {
        let mut t = Taken::default();
        assert!(t.take(1));
        assert!(t.take(2));
        assert!(!t.take(2), "a retransmission of a taken delivery");
        // 3 and 4 were lost on the bus.
        assert!(t.take(5));
        assert!(!t.take(5));
        assert!(t.take(4), "a lost one, sent again");
        assert!(!t.take(4));
        assert!(t.take(3));
        assert!(!t.take(1));
        assert!(t.missing.is_empty());
        // A huge gap keeps only the newest MAX_MISSING ids.
        assert!(t.take(10 * super::MAX_MISSING as u64));
        assert_eq!(t.missing.len(), super::MAX_MISSING);
    }
}
