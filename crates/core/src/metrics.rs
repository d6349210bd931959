//! The metrics registry and the handles the hot path increments.
//!
//! Handles are resolved once at start-up; incrementing one is a single
//! atomic operation, and nothing on the way of a stanza takes a lock or
//! allocates for metrics: label values a stanza picks (its kind, the
//! transport of a session) index arrays of handles resolved here, and
//! [`LatencyHistogram`] is lock-free (prometheus-client's histogram
//! takes a mutex per observation). `Metrics::encode` gives the text
//! exposition that the admin listener serves at `/metrics`; every metric,
//! its labels and its meaning are listed in `docs/metrics.md`.
//!
//! Names follow Prometheus conventions: everything Starling's own is
//! prefixed `starling_`, counters end in `_total` (prometheus-client adds
//! the suffix), durations are in seconds and sizes in bytes. The process
//! metrics (`process_*`, read from `/proc/self` at scrape time) keep the
//! unprefixed names every Prometheus client library uses, so standard
//! dashboards and alerts work unchanged.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use starling_proto::sasl::ht::HtMechanism;
use starling_proto::sasl::Mechanism;
use starling_proto::StanzaKind;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Label sets of the metric families: `(name, value)` pairs.
type Labels = Vec<(String, String)>;

/// The `limit` label values of `starling_limit_refusals_total`: the
/// configuration keys of the per-account and per-session limits.
pub const LIMITS: [&str; 6] = [
    "max_resources_per_account",
    "offline.max_messages_per_user",
    "muc.max_rooms_per_user",
    "muc.max_temporary_rooms",
    "pep.max_bytes_per_user",
    "pubsub.max_bytes_per_owner",
];

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Counters and gauges of the core server.
pub struct Metrics {
    /// The root registry: the process collector, then everything of
    /// Starling's in sub-registries prefixed `starling_`.
    registry: Mutex<Registry>,
    /// Bound c2s sessions (detached stream-management sessions included).
    pub sessions: Gauge,
    /// Bound sessions by transport, indexed by [`SessionTransport`].
    sessions_by_transport: [Gauge; SessionTransport::ALL.len()],
    /// Bound sessions by domain.
    sessions_by_domain: Family<Labels, Gauge>,
    /// Open client connections (before and after authentication).
    pub connections: Gauge,
    /// Accepted client connections since start.
    pub connections_total: Counter,
    stanzas_in: [Counter; 3],
    stanzas_out: [Counter; 3],
    /// Successful SASL authentications by mechanism (the last entry is
    /// for a name not in the list).
    auth_success: Vec<(&'static str, Counter)>,
    /// Failed SASL authentications by RFC 6120 §6.5 condition (the last
    /// entry is for a condition not in the list).
    auth_failures: Vec<(&'static str, Counter)>,
    /// Streams closed with a stream error we sent.
    pub stream_errors: Counter,
    /// Stanzas bounced because the recipient's mailbox was full.
    pub mailbox_full: Counter,
    /// Requests refused because an account or session reached one of
    /// its limits, by `limit` (see [`Metrics::limit_refused`]).
    limit_refusals: Family<Labels, Counter>,
    /// Admin requests and web logins with a wrong or missing token,
    /// labelled `surface` (`api`, `web`).
    admin_auth_failures: Family<Labels, Counter>,
    /// Router entry to delivery, by stanza kind.
    routing: [LatencyHistogram; 3],
    /// Storage call durations, labelled `store` and `op`.
    storage: Family<Labels, LatencyHistogram>,
    /// Write-behind queues (archive, inbox, rooms' archives), labelled by
    /// queue.
    pub write_behind: WriteBehindMetrics,
}

/// How a bound session reaches its client, for
/// `starling_c2s_sessions_by_transport`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionTransport {
    /// An XML stream over plain TCP.
    Tcp,
    /// An XML stream over TLS (STARTTLS or direct TLS).
    Tls,
    /// RFC 7395 WebSocket (`ws:` or `wss:`).
    WebSocket,
    /// XEP-0124/0206 BOSH.
    Bosh,
    /// No connection: a XEP-0198 session kept for resumption.
    Detached,
}

impl SessionTransport {
    /// Every transport, in the order of the gauges.
    pub const ALL: [SessionTransport; 5] = [
        SessionTransport::Tcp,
        SessionTransport::Tls,
        SessionTransport::WebSocket,
        SessionTransport::Bosh,
        SessionTransport::Detached,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionTransport::Tcp => "tcp",
            SessionTransport::Tls => "tls",
            SessionTransport::WebSocket => "websocket",
            SessionTransport::Bosh => "bosh",
            SessionTransport::Detached => "detached",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The class of a storage call, the `op` label of
/// `starling_storage_latency_seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageOp {
    /// A call that only reads.
    Read,
    /// A call that writes (insert, update, delete, take-and-delete).
    Write,
}

impl StorageOp {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            StorageOp::Read => "read",
            StorageOp::Write => "write",
        }
    }
}

/// Metric families of the write-behind queues, labelled `queue`.
#[derive(Clone, Default)]
pub struct WriteBehindMetrics {
    /// Records waiting to be written.
    pub queued: Family<Labels, Gauge>,
    /// Approximate bytes the waiting records hold.
    pub bytes: Family<Labels, Gauge>,
    /// Records written.
    pub written: Family<Labels, Counter>,
    /// Batches (transactions) written.
    pub batches: Family<Labels, Counter>,
    /// Records dropped after the retries of their batch failed.
    pub dropped: Family<Labels, Counter>,
    /// Duration of each committed batch's write.
    pub commit_seconds: Family<Labels, LatencyHistogram>,
    /// The queues created so far, by name (shutdown reports what each
    /// could not write).
    created: Arc<Mutex<Vec<(String, QueueMetrics)>>>,
}

/// The handles of one write-behind queue.
#[derive(Clone, Debug, Default)]
pub struct QueueMetrics {
    /// Records waiting to be written.
    pub queued: Gauge,
    /// Approximate bytes the records not yet taken by the writer hold.
    pub bytes: Gauge,
    /// Records written.
    pub written: Counter,
    /// Batches written.
    pub batches: Counter,
    /// Records dropped after failed retries.
    pub dropped: Counter,
    /// How long each committed batch took to write.
    pub commit_seconds: LatencyHistogram,
}

impl WriteBehindMetrics {
    /// The handles of queue `name`.
    pub fn queue(&self, name: &str) -> QueueMetrics {
        let l = labels(&[("queue", name)]);
        let q = QueueMetrics {
            queued: self.queued.get_or_create(&l).clone(),
            bytes: self.bytes.get_or_create(&l).clone(),
            written: self.written.get_or_create(&l).clone(),
            batches: self.batches.get_or_create(&l).clone(),
            dropped: self.dropped.get_or_create(&l).clone(),
            commit_seconds: self.commit_seconds.get_or_create(&l).clone(),
        };
        let mut created = self.created.lock().unwrap_or_else(|e| e.into_inner());
        if !created.iter().any(|(n, _)| n == name) {
            created.push((name.to_owned(), q.clone()));
        }
        q
    }

    /// Every queue created through [`WriteBehindMetrics::queue`], by name.
    pub fn queues(&self) -> Vec<(String, QueueMetrics)> {
        self.created
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

fn kind_index(kind: StanzaKind) -> usize {
    match kind {
        StanzaKind::Message => 0,
        StanzaKind::Presence => 1,
        StanzaKind::Iq => 2,
    }
}

const KINDS: [StanzaKind; 3] = [StanzaKind::Message, StanzaKind::Presence, StanzaKind::Iq];

/// The SASL conditions (RFC 6120 §6.5) a failed authentication is counted
/// under; `aborted` is not a failure.
const FAILURE_REASONS: [&str; 10] = [
    "not-authorized",
    "account-disabled",
    "credentials-expired",
    "encryption-required",
    "incorrect-encoding",
    "invalid-authzid",
    "invalid-mechanism",
    "malformed-request",
    "mechanism-too-weak",
    "temporary-auth-failure",
];

/// The label value for a name no list here knows.
const OTHER: &str = "other";

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers all core metrics under the `starling_` prefix,
    /// plus the `process_*` collector and `starling_build_info`.
    pub fn new() -> Self {
        let mut root = Registry::default();
        root.register_collector(Box::new(ProcessCollector));
        let registry = root.sub_registry_with_prefix("starling");

        let build_info = Family::<Labels, Gauge>::default();
        build_info
            .get_or_create(&labels(&[("version", env!("CARGO_PKG_VERSION"))]))
            .set(1);
        registry.register(
            "build_info",
            "Starling's version (the value is always 1)",
            build_info,
        );

        let sessions = Gauge::default();
        registry.register(
            "c2s_sessions",
            "Bound client sessions, detached stream-management sessions included",
            sessions.clone(),
        );
        let by_transport = Family::<Labels, Gauge>::default();
        registry.register(
            "c2s_sessions_by_transport",
            "Bound client sessions by transport (tcp, tls, websocket, bosh; detached: kept for XEP-0198 resumption, no connection)",
            by_transport.clone(),
        );
        let sessions_by_transport = SessionTransport::ALL.map(|t| {
            by_transport
                .get_or_create(&labels(&[("transport", t.as_str())]))
                .clone()
        });
        let sessions_by_domain = Family::<Labels, Gauge>::default();
        registry.register(
            "c2s_sessions_by_domain",
            "Bound client sessions by the domain of their account",
            sessions_by_domain.clone(),
        );
        let connections = Gauge::default();
        registry.register(
            "c2s_connections",
            "Open client connections",
            connections.clone(),
        );
        let connections_total = Counter::default();
        registry.register(
            "c2s_connections_accepted",
            "Client connections accepted",
            connections_total.clone(),
        );
        let family_in = Family::<Labels, Counter>::default();
        registry.register(
            "stanzas_in",
            "Stanzas received from clients and components, by kind",
            family_in.clone(),
        );
        let family_out = Family::<Labels, Counter>::default();
        registry.register(
            "stanzas_out",
            "Stanzas written to clients and components, by kind",
            family_out.clone(),
        );
        let resolve = |fam: &Family<Labels, Counter>| {
            KINDS.map(|k| fam.get_or_create(&labels(&[("kind", k.as_str())])).clone())
        };
        let stanzas_in = resolve(&family_in);
        let stanzas_out = resolve(&family_out);

        let success = Family::<Labels, Counter>::default();
        registry.register(
            "auth_success",
            "Successful SASL authentications, by mechanism",
            success.clone(),
        );
        let auth_success = Mechanism::ALL
            .iter()
            .map(|m| m.name())
            .chain(HtMechanism::ALL.iter().map(|m| m.name()))
            .chain([OTHER])
            .map(|m| {
                (
                    m,
                    success.get_or_create(&labels(&[("mechanism", m)])).clone(),
                )
            })
            .collect();
        let failures = Family::<Labels, Counter>::default();
        registry.register(
            "auth_failures",
            "Failed SASL authentications, by reason (the RFC 6120 §6.5 condition sent)",
            failures.clone(),
        );
        let auth_failures = FAILURE_REASONS
            .iter()
            .copied()
            .chain([OTHER])
            .map(|r| (r, failures.get_or_create(&labels(&[("reason", r)])).clone()))
            .collect();

        let stream_errors = Counter::default();
        registry.register("stream_errors", "Stream errors sent", stream_errors.clone());
        let mailbox_full = Counter::default();
        registry.register(
            "mailbox_full",
            "Stanzas bounced because a recipient's mailbox was full",
            mailbox_full.clone(),
        );
        let limit_refusals = Family::<Labels, Counter>::default();
        // Exported from the start (at 0), so dashboards see every limit.
        for limit in LIMITS {
            let _ = limit_refusals.get_or_create(&labels(&[("limit", limit)]));
        }
        registry.register(
            "limit_refusals",
            "Requests refused because an account or session reached a configured limit, by limit",
            limit_refusals.clone(),
        );
        let admin_auth_failures = Family::<Labels, Counter>::default();
        registry.register(
            "admin_auth_failures",
            "Admin API requests and admin web logins refused for a wrong or missing token, by surface (api, web)",
            admin_auth_failures.clone(),
        );

        let routing_family =
            Family::<Labels, LatencyHistogram, fn() -> LatencyHistogram>::new_with_constructor(
                LatencyHistogram::routing,
            );
        registry.register(
            "routing_latency_seconds",
            "Time from a stanza entering the router to its delivery into a mailbox, the cluster bus or the offline store, by kind",
            routing_family.clone(),
        );
        let routing = KINDS.map(|k| {
            routing_family
                .get_or_create(&labels(&[("kind", k.as_str())]))
                .clone()
        });
        let storage = Family::<Labels, LatencyHistogram>::default();
        registry.register(
            "storage_latency_seconds",
            "Duration of storage calls, by store and operation class (read, write)",
            storage.clone(),
        );

        let write_behind = WriteBehindMetrics::default();
        registry.register(
            "write_behind_queued",
            "Records waiting in a write-behind queue",
            write_behind.queued.clone(),
        );
        registry.register(
            "write_behind_bytes",
            "Approximate bytes held by the records waiting in a write-behind queue",
            write_behind.bytes.clone(),
        );
        registry.register(
            "write_behind_written",
            "Records written by a write-behind queue",
            write_behind.written.clone(),
        );
        registry.register(
            "write_behind_batches",
            "Batches (transactions) written by a write-behind queue",
            write_behind.batches.clone(),
        );
        registry.register(
            "write_behind_dropped",
            "Records dropped after their batch failed every retry",
            write_behind.dropped.clone(),
        );
        registry.register(
            "write_behind_commit_seconds",
            "Duration of a write-behind queue's successful batch writes",
            write_behind.commit_seconds.clone(),
        );
        Metrics {
            registry: Mutex::new(root),
            write_behind,
            sessions,
            sessions_by_transport,
            sessions_by_domain,
            connections,
            connections_total,
            stanzas_in,
            stanzas_out,
            auth_success,
            auth_failures,
            stream_errors,
            mailbox_full,
            limit_refusals,
            admin_auth_failures,
            routing,
            storage,
        }
    }

    /// Counts a stanza received from a client.
    pub fn stanza_in(&self, kind: StanzaKind) {
        self.stanzas_in[kind_index(kind)].inc();
    }

    /// Counts a stanza written to a client.
    pub fn stanza_out(&self, kind: StanzaKind) {
        self.stanzas_out[kind_index(kind)].inc();
    }

    /// Records how long the router took to hand a stanza of `kind` to its
    /// recipient (mailbox, cluster bus or offline store).
    pub fn routed(&self, kind: StanzaKind, took: Duration) {
        self.routing[kind_index(kind)].observe(took);
    }

    /// Counts one request refused at the per-account or per-session limit
    /// `limit` (its configuration key, e.g. `max_resources_per_account`).
    /// These refusals are caused by clients, so they are counted here
    /// instead of logged.
    pub fn limit_refused(&self, limit: &'static str) {
        debug_assert!(LIMITS.contains(&limit), "add {limit} to LIMITS");
        self.limit_refusals
            .get_or_create(&labels(&[("limit", limit)]))
            .inc();
    }

    /// The gauge of bound sessions on `transport`.
    pub fn sessions_on(&self, transport: SessionTransport) -> &Gauge {
        &self.sessions_by_transport[transport.index()]
    }

    /// The gauge of bound sessions of `domain` (a map lookup: for binding
    /// and closing sessions, not for stanzas).
    pub fn sessions_of_domain(&self, domain: &str) -> Gauge {
        self.sessions_by_domain
            .get_or_create(&labels(&[("domain", domain)]))
            .clone()
    }

    /// Drops the per-domain series of a domain no longer served.
    pub fn forget_domain(&self, domain: &str) {
        self.sessions_by_domain
            .remove(&labels(&[("domain", domain)]));
    }

    /// Counts a successful authentication with `mechanism` (its IANA name).
    pub fn auth_succeeded(&self, mechanism: &str) {
        find(&self.auth_success, mechanism).inc();
    }

    /// Counts an admin request (`surface` `api`) or web login (`web`)
    /// refused for a wrong or missing token.
    pub fn admin_auth_failed(&self, surface: &str) {
        self.admin_auth_failures
            .get_or_create(&labels(&[("surface", surface)]))
            .inc();
    }

    /// Counts a failed authentication answered with SASL condition
    /// `reason` (RFC 6120 §6.5, e.g. `not-authorized`).
    pub fn auth_failed(&self, reason: &str) {
        find(&self.auth_failures, reason).inc();
    }

    /// The histogram of `store`'s calls of class `op` (resolved once, by
    /// whoever wraps the store; see `storage::timed`).
    pub fn storage_latency(&self, store: &str, op: StorageOp) -> LatencyHistogram {
        self.storage
            .get_or_create(&labels(&[("store", store), ("op", op.as_str())]))
            .clone()
    }

    /// Lets another component register its metrics (names get the
    /// `starling_` prefix).
    pub fn with_registry<R>(&self, f: impl FnOnce(&mut Registry) -> R) -> R {
        let mut root = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        f(root.sub_registry_with_prefix("starling"))
    }

    /// The Prometheus text exposition of all metrics (OpenMetrics text
    /// format, ending in `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        // Encoding into a String cannot fail.
        let _ = encode(&mut out, &reg);
        out
    }
}

/// The entry named `name`, else the last one (`other`).
fn find<'a>(list: &'a [(&'static str, Counter)], name: &str) -> &'a Counter {
    let i = list
        .iter()
        .position(|(n, _)| *n == name)
        .unwrap_or(list.len() - 1);
    &list[i].1
}

/// One unit of a gauge for as long as this lives: a connection open, a
/// transfer relaying, an upload receiving. Dropped on every way out,
/// including a future cancelled mid-way.
pub struct Held(Gauge);

impl Held {
    /// Adds one to `gauge` until the returned value is dropped.
    pub fn new(gauge: &Gauge) -> Held {
        gauge.inc();
        Held(gauge.clone())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A lock-free histogram of durations with doubling bucket bounds:
/// `first`, `2·first`, `4·first`, … (`buckets` of them), then `+Inf`.
///
/// An observation is two relaxed atomic additions (its bucket and the sum
/// in nanoseconds); the bucket index is computed, not searched. The count
/// is the sum of the buckets, so a scrape always sees count = `+Inf`
/// bucket. The nanosecond sum wraps after 584 years of accumulated time.
/// Clones share the counts.
#[derive(Clone, Debug)]
pub struct LatencyHistogram(Arc<HistogramInner>);

#[derive(Debug)]
struct HistogramInner {
    first_ns: u64,
    /// One per finite bound, then `+Inf`; not cumulative.
    counts: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

impl Default for LatencyHistogram {
    /// The storage layout: 10 µs to 5.2 s (20 buckets).
    fn default() -> Self {
        LatencyHistogram::new(Duration::from_micros(10), 20)
    }
}

impl LatencyHistogram {
    /// Bounds `first · 2^k` for `k` in `0..buckets`, then `+Inf`.
    pub fn new(first: Duration, buckets: usize) -> LatencyHistogram {
        let first_ns = u64::try_from(first.as_nanos()).unwrap_or(u64::MAX).max(1);
        let buckets = buckets.min(63);
        LatencyHistogram(Arc::new(HistogramInner {
            first_ns,
            counts: (0..=buckets).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }))
    }

    /// The routing layout: 1 µs to 8.4 s (24 buckets).
    pub fn routing() -> LatencyHistogram {
        LatencyHistogram::new(Duration::from_micros(1), 24)
    }

    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let h = &self.0;
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        // The smallest k with ns <= first·2^k: ceil(log2(ceil(ns / first))).
        let q = ns.div_ceil(h.first_ns);
        let k = if q <= 1 {
            0
        } else {
            (u64::BITS - (q - 1).leading_zeros()) as usize
        };
        let i = k.min(h.counts.len() - 1);
        h.counts[i].fetch_add(1, Ordering::Relaxed);
        h.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.0
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// Sum of the observations.
    pub fn sum(&self) -> Duration {
        Duration::from_nanos(self.0.sum_ns.load(Ordering::Relaxed))
    }

    /// `(upper bound in seconds, observations in that bucket)`, not
    /// cumulative, the last bound `+Inf`.
    fn buckets(&self) -> Vec<(f64, u64)> {
        let h = &self.0;
        let last = h.counts.len() - 1;
        h.counts
            .iter()
            .enumerate()
            .map(|(k, c)| {
                let bound = if k == last {
                    f64::INFINITY
                } else {
                    (h.first_ns << k) as f64 / 1e9
                };
                (bound, c.load(Ordering::Relaxed))
            })
            .collect()
    }
}

impl TypedMetric for LatencyHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let buckets = self.buckets();
        let count = buckets.iter().map(|(_, c)| c).sum();
        let sum = self.0.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// The standard `process_*` metrics, read from `/proc/self` at each
/// scrape (nothing runs between scrapes). Elsewhere than on Linux it
/// exports nothing.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(p) = ProcessStats::read() else {
            return Ok(());
        };
        let counter = ConstCounter::new(p.cpu_seconds);
        counter.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            counter.metric_type(),
        )?)?;
        let mut gauge = |name: &str, help: &str, v: f64| -> Result<(), std::fmt::Error> {
            let g = ConstGauge::new(v);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
        };
        gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            p.resident_bytes as f64,
        )?;
        gauge(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            p.virtual_bytes as f64,
        )?;
        gauge(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            p.start_time_seconds,
        )?;
        gauge(
            "process_open_fds",
            "Number of open file descriptors",
            p.open_fds as f64,
        )?;
        if let Some(max) = p.max_fds {
            gauge(
                "process_max_fds",
                "Maximum number of open file descriptors",
                max as f64,
            )?;
        }
        gauge(
            "process_threads",
            "Number of OS threads in the process",
            p.threads as f64,
        )?;
        Ok(())
    }
}

/// What `/proc/self` says about this process.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident set size, in bytes.
    pub resident_bytes: u64,
    /// Virtual memory size, in bytes.
    pub virtual_bytes: u64,
    /// Start of the process, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft limit on open file descriptors (`None`: unlimited).
    pub max_fds: Option<u64>,
    /// OS threads.
    pub threads: u64,
}

/// `/proc/self/auxv` keys (see getauxval(3)).
const AT_PAGESZ: u64 = 6;
const AT_CLKTCK: u64 = 17;

impl ProcessStats {
    /// Reads this process's statistics (`None` where there is no
    /// `/proc`).
    pub fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let auxv = std::fs::read("/proc/self/auxv").unwrap_or_default();
        let clk_tck = auxv_value(&auxv, AT_CLKTCK)
            .filter(|&v| v > 0)
            .unwrap_or(100);
        let page_size = auxv_value(&auxv, AT_PAGESZ)
            .filter(|&v| v > 0)
            .unwrap_or(4096);
        let btime = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| parse_btime(&s))
            .unwrap_or(0);
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .map(|d| d.count() as u64)
            .unwrap_or(0);
        let max_fds = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|s| parse_max_fds(&s));
        let mut p = parse_stat(&stat, clk_tck, page_size, btime)?;
        p.open_fds = open_fds;
        p.max_fds = max_fds;
        Some(p)
    }
}

/// The value of `key` in an auxiliary vector (native-endian word pairs).
fn auxv_value(auxv: &[u8], key: u64) -> Option<u64> {
    const W: usize = std::mem::size_of::<usize>();
    auxv.chunks_exact(2 * W).find_map(|pair| {
        let word = |b: &[u8]| -> u64 {
            let mut a = [0u8; W];
            a.copy_from_slice(b);
            usize::from_ne_bytes(a) as u64
        };
        (word(&pair[..W]) == key).then(|| word(&pair[W..]))
    })
}

/// `btime` (boot time, seconds since the epoch) from `/proc/stat`.
fn parse_btime(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft "Max open files" limit from `/proc/self/limits`.
fn parse_max_fds(limits: &str) -> Option<u64> {
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|soft| soft.parse().ok())
}

/// CPU, memory, threads and start time from `/proc/self/stat` (proc(5));
/// the fields counted after the command name, which may hold spaces and
/// parentheses.
fn parse_stat(stat: &str, clk_tck: u64, page_size: u64, btime: u64) -> Option<ProcessStats> {
    let after = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // f[0] is field 3 (state): field n is f[n - 3].
    let field = |n: usize| -> Option<u64> { f.get(n - 3)?.parse().ok() };
    let ticks = clk_tck as f64;
    Some(ProcessStats {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        threads: field(20)?,
        start_time_seconds: btime as f64 + field(22)? as f64 / ticks,
        virtual_bytes: field(23)?,
        resident_bytes: field(24)? * page_size,
        open_fds: 0,
        max_fds: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_stat_reads_the_fields_after_a_command_with_spaces_and_parens() {
        // proc(5): pid (comm) state ppid … utime(14) stime(15) … num_threads(20)
        // itrealvalue(21) starttime(22) vsize(23) rss(24) …
        let stat = "4242 (star ling) (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    250 50 0 0 20 0 7 0 123456 104857600 2560 18446744073709551615";
        let p = parse_stat(stat, 100, 4096, 1_700_000_000).unwrap();
        assert_eq!(p.cpu_seconds, 3.0);
        assert_eq!(p.threads, 7);
        assert_eq!(p.start_time_seconds, 1_700_000_000.0 + 1234.56);
        assert_eq!(p.virtual_bytes, 104_857_600);
        assert_eq!(p.resident_bytes, 2560 * 4096);
    }

    #[test]
    fn parse_stat_truncated_is_none() {
        assert_eq!(parse_stat("1 (x) S 1 2 3", 100, 4096, 0), None);
        assert_eq!(parse_stat("garbage", 100, 4096, 0), None);
    }

    #[test]
    fn parse_btime_and_limits_find_their_lines() {
        let stat = "cpu  1 2 3\nintr 5\nbtime 1712345678\nprocesses 9\n";
        assert_eq!(parse_btime(stat), Some(1_712_345_678));
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_max_fds(unlimited), None);
    }

    #[test]
    fn auxv_value_finds_a_key_among_word_pairs() {
        let mut auxv = Vec::new();
        for (k, v) in [(AT_PAGESZ, 4096u64), (AT_CLKTCK, 100), (0, 0)] {
            auxv.extend_from_slice(&(k as usize).to_ne_bytes());
            auxv.extend_from_slice(&(v as usize).to_ne_bytes());
        }
        assert_eq!(auxv_value(&auxv, AT_CLKTCK), Some(100));
        assert_eq!(auxv_value(&auxv, AT_PAGESZ), Some(4096));
        assert_eq!(auxv_value(&auxv, 99), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn process_stats_read_this_process() {
        // Burn a little CPU so the counter cannot be 0 ticks… mostly.
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let p = ProcessStats::read().expect("/proc/self is readable");
        assert!(p.resident_bytes > 1 << 20, "{p:?}");
        assert!(p.virtual_bytes >= p.resident_bytes, "{p:?}");
        assert!(p.open_fds >= 3, "{p:?}");
        assert!(p.threads >= 1, "{p:?}");
        assert!(p.cpu_seconds >= 0.0, "{p:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // The test binary started within the last hour, not in the future.
        assert!(p.start_time_seconds <= now + 1.0, "{p:?} now {now}");
        assert!(p.start_time_seconds > now - 3600.0, "{p:?} now {now}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn encode_exports_process_metrics_and_build_info() {
        let text = Metrics::new().encode();
        for name in [
            "# TYPE process_cpu_seconds counter",
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_start_time_seconds ",
            "process_open_fds ",
            "process_threads ",
        ] {
            assert!(text.contains(name), "{name} missing in:\n{text}");
        }
        let info = format!(
            "starling_build_info{{version=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&info), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn latency_histogram_buckets_are_inclusive_upper_bounds() {
        let h = LatencyHistogram::new(Duration::from_micros(1), 4); // 1, 2, 4, 8 µs, +Inf
        for ns in [0, 1, 1000, 1001, 2000, 2001, 8000, 8001, u64::MAX] {
            h.observe(Duration::from_nanos(ns));
        }
        let counts: Vec<u64> = h.buckets().iter().map(|(_, c)| *c).collect();
        // ≤1µs: 0, 1, 1000; ≤2µs: 1001, 2000; ≤4µs: 2001; ≤8µs: 8000; +Inf: 8001, max.
        assert_eq!(counts, vec![3, 2, 1, 1, 2]);
        assert_eq!(h.count(), 9);
        let bounds: Vec<f64> = h.buckets().iter().map(|(b, _)| *b).collect();
        assert_eq!(bounds[..4], [1e-6, 2e-6, 4e-6, 8e-6]);
        assert!(bounds[4].is_infinite());
    }

    #[test]
    fn latency_histogram_encodes_cumulative_buckets_sum_and_count() {
        let m = Metrics::new();
        m.routed(StanzaKind::Message, Duration::from_micros(3));
        m.routed(StanzaKind::Message, Duration::from_millis(2));
        let text = m.encode();
        assert!(
            text.contains("# TYPE starling_routing_latency_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains("starling_routing_latency_seconds_count{kind=\"message\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "starling_routing_latency_seconds_bucket{le=\"0.000004\",kind=\"message\"} 1\n"
            ) || text.contains(
                "starling_routing_latency_seconds_bucket{kind=\"message\",le=\"0.000004\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("starling_routing_latency_seconds_sum{kind=\"message\"} 0.002003\n"),
            "{text}"
        );
        assert!(
            text.contains("starling_routing_latency_seconds_count{kind=\"iq\"} 0\n"),
            "{text}"
        );
    }

    #[test]
    fn auth_counters_are_labelled_and_unknown_names_count_as_other() {
        let m = Metrics::new();
        m.auth_succeeded("SCRAM-SHA-256");
        m.auth_succeeded("HT-SHA-256-NONE");
        m.auth_succeeded("X-UNKNOWN");
        m.auth_failed("not-authorized");
        m.auth_failed("account-disabled");
        m.auth_failed("who-knows");
        let text = m.encode();
        for line in [
            "starling_auth_success_total{mechanism=\"SCRAM-SHA-256\"} 1\n",
            "starling_auth_success_total{mechanism=\"HT-SHA-256-NONE\"} 1\n",
            "starling_auth_success_total{mechanism=\"other\"} 1\n",
            "starling_auth_success_total{mechanism=\"PLAIN\"} 0\n",
            "starling_auth_failures_total{reason=\"not-authorized\"} 1\n",
            "starling_auth_failures_total{reason=\"account-disabled\"} 1\n",
            "starling_auth_failures_total{reason=\"other\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
    }

    #[test]
    fn with_registry_metrics_get_the_prefix() {
        let m = Metrics::new();
        let c = Counter::<u64>::default();
        c.inc();
        m.with_registry(|r| r.register("things", "Things", c.clone()));
        assert!(m.encode().contains("starling_things_total 1\n"));
    }
}
