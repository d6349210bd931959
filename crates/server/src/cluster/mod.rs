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
//!
//! The files: this one the types, connecting and starting, and the
//! operations the router calls; `bus.rs` publishing (batches, the queue
//! limit) and receiving frames; `membership.rs` heartbeats, failure and
//! placement; `registry.rs` the replicated session registry (events,
//! snapshots, the table observer); `delivery.rs` deliveries with their
//! acknowledgements and retransmissions.

pub mod frame;

use crate::config::ClusterSection;
use crate::routing::sessions::{SessionTable, TableObserver};
use frame::{CloseWhy, Frame};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use starling_core::hooks::TimerKey;
use starling_core::{CloseReason, Env, SessionRef, SessionSendError};
use starling_proto::BareJid;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

mod bus;
mod delivery;
mod membership;
mod registry;

use delivery::{Pending, Taken};
pub use membership::{observe, ObservedNode};
use registry::Observer;

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

/// Frames that follow a publish this closely wait this long to be batched.
const LINGER_WHEN_BUSY: Duration = Duration::from_millis(1);

/// How long acknowledgements are gathered before they are sent.
const ACK_DELAY: Duration = Duration::from_millis(2);

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
}
