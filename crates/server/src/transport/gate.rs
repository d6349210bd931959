//! The connection gate: every listener (c2s, HTTP, admin, components,
//! the SOCKS5 proxy, and the server-to-server listener to come) admits
//! each accepted connection here before it spends anything on it, and the
//! connection holds its [`Ticket`] until its socket is closed.
//!
//! A gate counts connections against two limits:
//!
//! - a total (`[server] max_connections` for the client listeners, which
//!   share one gate; the admin, component and proxy listeners have gates
//!   of their own with their own totals), so the process's descriptors
//!   cannot all be taken through one kind of listener;
//! - a limit per source (`[server] max_connections_per_ip`), where a
//!   source is one IPv4 address or one IPv6 /64 prefix (one host or one
//!   subscriber usually owns a whole /64, and an attacker gets 2^64
//!   addresses with it). Loopback addresses are not limited per source
//!   unless `[server] per_ip_limit_loopback` is on: a TLS-terminating
//!   proxy or the web chat on this machine connects from one of them for
//!   every client. Each loopback address is its own source (all of
//!   127.0.0.0/8 is loopback on Linux).
//!
//! Over a limit the connection is closed right after accept (nothing is
//! read or written), counted in `starling_connections_refused_total
//! {listener, reason}` and logged at most once per
//! [`starling_core::throttle::LOG_INTERVAL`] per gate and reason.
//! `starling_connections_open{listener}` counts the tickets held.
//!
//! Peer addresses are canonical by the time they get here
//! (`transport::tcp::accept` turns `::ffff:a.b.c.d` into `a.b.c.d`); the
//! gate canonicalises again so a caller cannot get it wrong.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use starling_core::throttle::LogThrottle;
use starling_core::Held;
use starling_core::Metrics;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

type Labels = Vec<(String, String)>;

/// The per-source limit shared by every gate (`[server]`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PerSource {
    /// Connections one source may hold on one gate; 0: no limit.
    pub max: usize,
    /// Whether loopback sources are limited too.
    pub loopback: bool,
}

/// What every gate shares: the per-source policy and the metric
/// families. Built once by the server and provided to the modules that
/// listen (`HookRegistry::provide`).
pub(crate) struct Gates {
    per_source: PerSource,
    open: Family<Labels, Gauge>,
    refused: Family<Labels, Counter>,
}

impl Gates {
    /// Registers the metrics of every gate.
    pub(crate) fn new(per_source: PerSource, metrics: &Metrics) -> Arc<Gates> {
        let gates = Gates {
            per_source,
            open: Family::default(),
            refused: Family::default(),
        };
        metrics.with_registry(|r| gates.register(r));
        Arc::new(gates)
    }

    fn register(&self, r: &mut prometheus_client::registry::Registry) {
        r.register(
            "connections_open",
            "Open connections by listener, counted from accept until the socket closes (a BOSH session counts as one while it lives)",
            self.open.clone(),
        );
        r.register(
            "connections_refused",
            "Connections closed right after accept by the connection gate, by listener and reason (total, per_ip)",
            self.refused.clone(),
        );
    }

    /// Gates whose metrics are not exported: for a module started without
    /// the server's gates (an embedding program's own registry), and tests.
    pub(crate) fn unregistered(per_source: PerSource) -> Arc<Gates> {
        Arc::new(Gates {
            per_source,
            open: Family::default(),
            refused: Family::default(),
        })
    }

    /// A gate of its own, with `max_total` connections at most (0: no
    /// total limit).
    pub(crate) fn gate(self: &Arc<Self>, max_total: usize) -> Gate {
        Gate(Arc::new(Inner {
            gates: self.clone(),
            max_total,
            counts: Mutex::new(Counts::default()),
            total_log: LogThrottle::default(),
            source_log: LogThrottle::default(),
        }))
    }
}

/// A set of listeners that share a total and per-source counts. Clones
/// share them.
#[derive(Clone)]
pub(crate) struct Gate(Arc<Inner>);

struct Inner {
    gates: Arc<Gates>,
    max_total: usize,
    counts: Mutex<Counts>,
    total_log: LogThrottle,
    source_log: LogThrottle,
}

#[derive(Default)]
struct Counts {
    total: usize,
    /// Sources holding at least one ticket (so the map's size is bounded
    /// by the total).
    by_source: HashMap<Source, usize>,
}

/// Whom a per-source limit counts: one IPv4 address, or one IPv6 /64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Source {
    V4(Ipv4Addr),
    V6Prefix(u64),
}

impl Source {
    fn of(ip: IpAddr) -> Source {
        match ip.to_canonical() {
            IpAddr::V4(a) => Source::V4(a),
            IpAddr::V6(a) => Source::V6Prefix((u128::from(a) >> 64) as u64),
        }
    }
}

/// Why a connection was refused (the `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The gate's total is reached.
    Total,
    /// The source holds its maximum.
    PerSource,
}

impl Gate {
    /// One listener's door into this gate: its metric handles, resolved
    /// once. `listener` names it in metrics and logs (`c2s`, `http`,
    /// `bosh`, `admin`, `component`, `proxy65`).
    pub(crate) fn door(&self, listener: &'static str) -> Door {
        let g = &self.0.gates;
        let lbl = |reason: &str| -> Labels {
            vec![
                ("listener".into(), listener.into()),
                ("reason".into(), reason.into()),
            ]
        };
        // One statement each: a family's guard lives to the end of its
        // statement, and a second get_or_create of a new label set in the
        // same statement waits for it forever.
        let open = g
            .open
            .get_or_create(&vec![("listener".into(), listener.into())])
            .clone();
        let refused_total = g.refused.get_or_create(&lbl("total")).clone();
        let refused_source = g.refused.get_or_create(&lbl("per_ip")).clone();
        Door {
            gate: self.clone(),
            listener,
            open,
            refused_total,
            refused_source,
        }
    }

    /// Counts a connection from `ip` if both limits allow it.
    fn take(&self, ip: IpAddr) -> Result<Option<Source>, Refused> {
        let policy = self.0.gates.per_source;
        let ip = ip.to_canonical();
        let source =
            (policy.max > 0 && (policy.loopback || !ip.is_loopback())).then(|| Source::of(ip));
        let mut c = self.0.counts.lock().unwrap_or_else(|e| e.into_inner());
        if self.0.max_total > 0 && c.total >= self.0.max_total {
            return Err(Refused::Total);
        }
        if let Some(s) = source {
            let n = c.by_source.entry(s).or_insert(0);
            if *n >= policy.max {
                return Err(Refused::PerSource);
            }
            *n += 1;
        }
        c.total += 1;
        Ok(source)
    }

    fn give_back(&self, source: Option<Source>) {
        let mut c = self.0.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(s) = source {
            if let Some(n) = c.by_source.get_mut(&s) {
                *n -= 1;
                if *n == 0 {
                    c.by_source.remove(&s);
                }
            }
        }
    }

    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let c = self.0.counts.lock().unwrap();
        (c.total, c.by_source.len())
    }
}

/// One listener's way into a [`Gate`].
pub(crate) struct Door {
    gate: Gate,
    listener: &'static str,
    open: Gauge,
    refused_total: Counter,
    refused_source: Counter,
}

impl Door {
    /// A ticket for a connection from `peer`, or why not (counted and,
    /// throttled, logged). The caller closes a refused connection at once.
    pub(crate) fn admit(&self, peer: SocketAddr) -> Result<Ticket, Refused> {
        match self.gate.take(peer.ip()) {
            Ok(source) => Ok(Ticket {
                gate: self.gate.clone(),
                source,
                _open: Held::new(&self.open),
            }),
            Err(why) => {
                let inner = &self.gate.0;
                match why {
                    Refused::Total => {
                        self.refused_total.inc();
                        if let Some(suppressed) = inner.total_log.check() {
                            tracing::warn!(listener = self.listener, %peer, max = inner.max_total, suppressed,
                                "connection limit reached; new connections are closed until some end (raise the listener's max_connections if the load is legitimate)");
                        }
                    }
                    Refused::PerSource => {
                        self.refused_source.inc();
                        if let Some(suppressed) = inner.source_log.check() {
                            tracing::warn!(listener = self.listener, %peer, max = inner.gates.per_source.max, suppressed,
                                "this address holds [server] max_connections_per_ip connections; new ones from it are closed (raise the limit if many clients share the address, e.g. behind a proxy)");
                        }
                    }
                }
                Err(why)
            }
        }
    }
}

/// One admitted connection: counted until dropped.
pub(crate) struct Ticket {
    gate: Gate,
    source: Option<Source>,
    _open: Held,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.gate.give_back(self.source);
    }
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("source", &self.source)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(s: &str) -> SocketAddr {
        SocketAddr::new(s.parse().unwrap(), 40000)
    }

    fn gate(max_total: usize, max: usize, loopback: bool) -> Door {
        Gates::unregistered(PerSource { max, loopback })
            .gate(max_total)
            .door("test")
    }

    #[test]
    fn gate_per_source_full_refuses_then_frees_on_drop() {
        let door = gate(100, 2, false);
        let a = door.admit(peer("192.0.2.1")).unwrap();
        let _b = door.admit(peer("192.0.2.1")).unwrap();
        assert_eq!(
            door.admit(peer("192.0.2.1")).unwrap_err(),
            Refused::PerSource
        );
        assert!(door.admit(peer("192.0.2.2")).is_ok(), "another address");
        drop(a);
        assert!(door.admit(peer("192.0.2.1")).is_ok(), "a slot freed");
    }

    #[test]
    fn gate_total_full_refuses_any_source() {
        let door = gate(2, 10, false);
        let _a = door.admit(peer("192.0.2.1")).unwrap();
        let b = door.admit(peer("192.0.2.2")).unwrap();
        assert_eq!(door.admit(peer("192.0.2.3")).unwrap_err(), Refused::Total);
        drop(b);
        assert!(door.admit(peer("192.0.2.3")).is_ok());
    }

    #[test]
    fn gate_mapped_ipv4_counts_as_ipv4() {
        let door = gate(100, 1, false);
        let _a = door.admit(peer("192.0.2.1")).unwrap();
        assert_eq!(
            door.admit(peer("::ffff:192.0.2.1")).unwrap_err(),
            Refused::PerSource
        );
    }

    #[test]
    fn gate_ipv6_counts_per_64_prefix() {
        let door = gate(100, 2, false);
        let _a = door.admit(peer("2001:db8:1:2::1")).unwrap();
        let _b = door.admit(peer("2001:db8:1:2:ffff::9")).unwrap();
        assert_eq!(
            door.admit(peer("2001:db8:1:2:abcd::1")).unwrap_err(),
            Refused::PerSource,
            "same /64"
        );
        assert!(door.admit(peer("2001:db8:1:3::1")).is_ok(), "next /64");
    }

    #[test]
    fn gate_loopback_exempt_unless_configured() {
        let door = gate(100, 1, false);
        let _held: Vec<_> = (0..5)
            .map(|_| door.admit(peer("127.0.0.1")).unwrap())
            .collect();
        let _v6: Vec<_> = (0..5).map(|_| door.admit(peer("::1")).unwrap()).collect();
        let door = gate(100, 1, true);
        let _a = door.admit(peer("127.0.0.1")).unwrap();
        assert_eq!(
            door.admit(peer("::ffff:127.0.0.1")).unwrap_err(),
            Refused::PerSource
        );
        assert!(
            door.admit(peer("127.0.0.2")).is_ok(),
            "each loopback address is its own source"
        );
    }

    #[test]
    fn gate_zero_means_no_limit() {
        let door = gate(0, 0, true);
        let held: Vec<_> = (0..1000)
            .map(|_| door.admit(peer("192.0.2.1")).unwrap())
            .collect();
        assert_eq!(door.gate.counts(), (1000, 0));
        drop(held);
        assert_eq!(door.gate.counts(), (0, 0));
    }

    #[test]
    fn gate_doors_share_counts_and_forget_empty_sources() {
        let gates = Gates::unregistered(PerSource {
            max: 2,
            loopback: false,
        });
        let g = gates.gate(10);
        let (c2s, http) = (g.door("c2s"), g.door("http"));
        let a = c2s.admit(peer("192.0.2.1")).unwrap();
        let b = http.admit(peer("192.0.2.1")).unwrap();
        assert_eq!(
            http.admit(peer("192.0.2.1")).unwrap_err(),
            Refused::PerSource
        );
        assert_eq!(g.counts(), (2, 1));
        drop((a, b));
        assert_eq!(g.counts(), (0, 0));
        let other = gates.gate(10).door("admin");
        let _c = other.admit(peer("192.0.2.1")).unwrap();
        let _d = other.admit(peer("192.0.2.1")).unwrap();
    }
}
