//! The metrics registry and the handles the hot path increments.
//!
//! Handles are resolved once at start-up; incrementing one is a single
//! atomic operation. The registry is encoded by the HTTP exporter (a later
//! issue) or by `Metrics::encode` for tests and the admin CLI.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use starling_proto::StanzaKind;
use std::sync::Mutex;

/// Counters and gauges of the core server.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// Bound c2s sessions.
    pub sessions: Gauge,
    /// Open client connections (before and after authentication).
    pub connections: Gauge,
    /// Accepted client connections since start.
    pub connections_total: Counter,
    stanzas_in: [Counter; 3],
    stanzas_out: [Counter; 3],
    /// Successful SASL authentications.
    pub auth_success: Counter,
    /// Failed SASL authentications.
    pub auth_failures: Counter,
    /// Streams closed with a stream error we sent.
    pub stream_errors: Counter,
    /// Stanzas bounced because the recipient's mailbox was full.
    pub mailbox_full: Counter,
    /// Write-behind queues (archive, inbox), labelled by queue.
    pub write_behind: WriteBehindMetrics,
}

/// Metric families of the write-behind queues, labelled `queue`.
#[derive(Clone, Default)]
pub struct WriteBehindMetrics {
    /// Records waiting to be written.
    pub queued: Family<Vec<(String, String)>, Gauge>,
    /// Approximate bytes the waiting records hold.
    pub bytes: Family<Vec<(String, String)>, Gauge>,
    /// Records written.
    pub written: Family<Vec<(String, String)>, Counter>,
    /// Batches (transactions) written.
    pub batches: Family<Vec<(String, String)>, Counter>,
    /// Records dropped after the retries of their batch failed.
    pub dropped: Family<Vec<(String, String)>, Counter>,
    /// The queues created so far, by name (shutdown reports what each
    /// could not write).
    created: std::sync::Arc<std::sync::Mutex<Vec<(String, QueueMetrics)>>>,
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
}

impl WriteBehindMetrics {
    /// The handles of queue `name`.
    pub fn queue(&self, name: &str) -> QueueMetrics {
        let l = vec![("queue".to_owned(), name.to_owned())];
        let q = QueueMetrics {
            queued: self.queued.get_or_create(&l).clone(),
            bytes: self.bytes.get_or_create(&l).clone(),
            written: self.written.get_or_create(&l).clone(),
            batches: self.batches.get_or_create(&l).clone(),
            dropped: self.dropped.get_or_create(&l).clone(),
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

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers all core metrics under the `starling_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("starling");
        let sessions = Gauge::default();
        registry.register("c2s_sessions", "Bound client sessions", sessions.clone());
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
        let family_in = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "stanzas_in",
            "Stanzas received from clients",
            family_in.clone(),
        );
        let family_out = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "stanzas_out",
            "Stanzas written to clients",
            family_out.clone(),
        );
        let resolve = |fam: &Family<Vec<(String, String)>, Counter>| {
            [StanzaKind::Message, StanzaKind::Presence, StanzaKind::Iq].map(|k| {
                fam.get_or_create(&vec![("kind".into(), k.as_str().into())])
                    .clone()
            })
        };
        let stanzas_in = resolve(&family_in);
        let stanzas_out = resolve(&family_out);
        let auth_success = Counter::default();
        registry.register(
            "auth_success",
            "Successful SASL authentications",
            auth_success.clone(),
        );
        let auth_failures = Counter::default();
        registry.register(
            "auth_failures",
            "Failed SASL authentications",
            auth_failures.clone(),
        );
        let stream_errors = Counter::default();
        registry.register("stream_errors", "Stream errors sent", stream_errors.clone());
        let mailbox_full = Counter::default();
        registry.register(
            "mailbox_full",
            "Stanzas bounced because a recipient's mailbox was full",
            mailbox_full.clone(),
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
        Metrics {
            registry: Mutex::new(registry),
            write_behind,
            sessions,
            connections,
            connections_total,
            stanzas_in,
            stanzas_out,
            auth_success,
            auth_failures,
            stream_errors,
            mailbox_full,
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

    /// Lets another component register its metrics.
    pub fn with_registry<R>(&self, f: impl FnOnce(&mut Registry) -> R) -> R {
        f(&mut self.registry.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The Prometheus text exposition of all metrics.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        // Encoding into a String cannot fail.
        let _ = encode(&mut out, &reg);
        out
    }
}
