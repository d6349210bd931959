//! SOCKS5 Bytestreams proxy (XEP-0065 1.8.2, "mediated connection") at
//! `proxy.<domain>`: file transfers (XEP-0096 SI, XEP-0234/0260 Jingle)
//! between clients that cannot reach each other directly go through it.
//!
//! - **Discovery** (§4): the service is listed in the server's
//!   `disco#items`; its `disco#info` has the identity `proxy/bytestreams`
//!   and the feature `http://jabber.org/protocol/bytestreams`; a
//!   bytestreams `query` get returns its `<streamhost jid host port/>`
//!   (`forbidden` to users `allowed` excludes, `not-allowed` when the
//!   proxy is not listening or shutting down).
//! - **SOCKS5** (§6.3.2, §6.3.4, §10.2; RFC 1928) on a TCP port of its
//!   own (`listen`): "no authentication" only (other greetings get method
//!   `0xFF`), then CONNECT with ATYP DOMAINNAME whose value is
//!   SHA-1(SID + requester JID + target JID) in hex (40 characters) and
//!   port 0; anything else gets its RFC 1928 reply code and is closed. The
//!   first connection with a hash waits, the second pairs with it, a
//!   third is refused (§10.1: one target per bytestream). A connection
//!   not activated within `activation_timeout_secs` of its accept (a
//!   pair: of its first connection's) is closed, handshake or not. Bytes a client sends before activation are not read (they
//!   wait in the socket and are relayed once activated, as Prosody does).
//! - **Activation** (§6.3.5): the requester's iq set with `sid` and
//!   `<activate>target</activate>`; the hash is computed from the sid, the
//!   iq's stamped `from` (so nobody else can activate it) and the target
//!   JID. Unknown hash: `item-not-found`; one party connected, or already
//!   activated: `not-allowed`; no sid or no target: `bad-request`; a
//!   target that is not a JID: `jid-malformed`. Then the proxy relays
//!   both ways until both sides close, `max_transfer_bytes` (both
//!   directions together) is reached (the connections are cut), nothing
//!   moves for `idle_timeout_secs`, or the server shuts down; paced to
//!   `max_bytes_per_second` per transfer.
//! - Every connection and transfer runs in a task of its own; a malformed
//!   handshake reads at most 262 bytes and ends only its own connection.
//!   Beyond `max_connections` open connections, or `[server]
//!   max_connections_per_ip` from one source (`transport::gate`), new
//!   ones are closed at once. Metrics: `starling_proxy65_connections`,
//!   `starling_proxy65_transfers_live`, `starling_proxy65_transfers_total`,
//!   `starling_proxy65_relayed_bytes_total`,
//!   `starling_proxy65_refused_total`.
//! - On a cluster each node runs its own proxy and answers for the
//!   sessions on it: give each node its own `host`.
//! - Not built: UDP mode (§8), SOCKS5 authentication, per-user or per-IP
//!   quotas, TLS on the SOCKS5 port (the spec has none: encrypt end to
//!   end).
//!
//! Hooks: a [`Service`] at `<subdomain>.<each served domain>`, `shutdown`
//! (closes the listener and every connection). Storage: none.
//! Config: `[modules.proxy65]` enabled, subdomain, name, listen, host,
//! port, max_transfer_bytes, max_bytes_per_second, activation_timeout_secs,
//! idle_timeout_secs, max_connections, allowed.

use crate::transport::gate::{Door, Gates, PerSource, Ticket};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde::Deserialize;
use starling_core::hooks::{HookRegistry, Service, ServiceAddress, ShutdownHandler};
use starling_core::module::{ConfigProblem, Module, ModuleCtx};
use starling_core::Held;
use starling_core::{async_trait, Env};
use starling_proto::{ns, Jid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind};
use starling_xml::Element;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

const NAME: &str = "proxy65";
/// XEP-0065's namespace (its disco feature and payloads).
pub const NS_BYTESTREAMS: &str = "http://jabber.org/protocol/bytestreams";

/// Who may use the proxy (discover its address and activate transfers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Allowed {
    /// Accounts of the served domains.
    Local,
    /// Anyone whose stanzas reach the server.
    All,
}

/// `[modules.proxy65]`: XEP-0065.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Proxy65Config {
    /// Run the proxy. Off by default: it opens a TCP port (`listen`) and
    /// relays other people's traffic, which operators choose to do.
    pub enabled: bool,
    /// The service's subdomain of every served domain.
    pub subdomain: String,
    /// Its name in service discovery.
    pub name: String,
    /// Where the SOCKS5 listener binds: an IP address and port (port 0:
    /// any free port, advertised as bound). `[::]` is every address, IPv6
    /// and IPv4 (IPv4 only on a host without IPv6).
    #[serde(deserialize_with = "socket_addr")]
    pub listen: SocketAddr,
    /// The host clients are told to connect to (an IP address or a DNS
    /// name that resolves to this machine). Empty: `listen`'s IP if it
    /// names one, else the served domain the request came to.
    pub host: String,
    /// The port clients are told to connect to (behind port forwarding).
    /// 0: the bound port.
    pub port: u16,
    /// Bytes one transfer may relay, both directions together; past it
    /// both connections are cut. 0: no limit.
    pub max_transfer_bytes: u64,
    /// Bytes per second one transfer may relay, both directions together.
    /// 0: no limit.
    pub max_bytes_per_second: u64,
    /// Seconds from a connection's accept to its transfer's activation;
    /// a connection not activated by then is closed (at least 1).
    pub activation_timeout_secs: u64,
    /// Seconds an activated transfer may move no byte before it is closed.
    /// 0: never.
    pub idle_timeout_secs: u64,
    /// Open SOCKS5 connections at most (two per transfer); more are closed
    /// at once.
    pub max_connections: usize,
    /// Who may use the proxy: `local` (accounts of the served domains) or
    /// `all`.
    pub allowed: Allowed,
}

impl Default for Proxy65Config {
    fn default() -> Self {
        Proxy65Config {
            enabled: false,
            subdomain: "proxy".into(),
            name: "File transfer proxy".into(),
            listen: "[::]:7777".parse().expect("literal address"),
            host: String::new(),
            port: 0,
            max_transfer_bytes: 1 << 30,
            max_bytes_per_second: 0,
            activation_timeout_secs: 60,
            idle_timeout_secs: 300,
            max_connections: 1000,
            allowed: Allowed::Local,
        }
    }
}

/// An `IP:port` string.
fn socket_addr<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(|_| {
        serde::de::Error::custom(format!(
            "{s:?} is not an IP address and port (host names are not resolved); \
             write e.g. \"[::]:7777\" (every address) or \"192.0.2.1:7777\""
        ))
    })
}

/// The proxy65 module.
pub struct Proxy65;

impl Module for Proxy65 {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str =
        "XEP-0065 SOCKS5 Bytestreams proxy for file transfers at proxy.<domain> (opens a TCP port)";
    type Config = Proxy65Config;

    fn subdomain(cfg: &Self::Config) -> Option<&str> {
        Some(&cfg.subdomain)
    }
    fn enabled(cfg: &Proxy65Config) -> bool {
        cfg.enabled
    }

    fn validate(cfg: &Proxy65Config, _domains: &[String]) -> Result<(), ConfigProblem> {
        crate::modules::common::check_subdomain(&cfg.subdomain, "proxy")?;
        let host_ok = cfg.host.parse::<std::net::IpAddr>().is_ok()
            || (cfg.host.len() <= 253
                && cfg
                    .host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'));
        if !host_ok {
            return Err(ConfigProblem::new(
                "host",
                "must be empty, an IP address or a DNS name, e.g. \"proxy.example.org\"",
            ));
        }
        if cfg.activation_timeout_secs == 0 {
            return Err(ConfigProblem::new(
                "activation_timeout_secs",
                "must be at least 1",
            ));
        }
        if cfg.max_connections < 2 {
            return Err(ConfigProblem::new(
                "max_connections",
                "must be at least 2 (a transfer takes two)",
            ));
        }
        Ok(())
    }

    async fn start(cfg: &Proxy65Config, ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        let metrics = ProxyMetrics::default();
        ctx.metrics.with_registry(|r| metrics.register(r));
        let gates = reg.provided::<Arc<Gates>>().cloned().unwrap_or_else(|| {
            Gates::unregistered(PerSource {
                max: 0,
                loopback: false,
            })
        });
        let (stop, stop_rx) = watch::channel(false);
        let (tasks, tasks_done) = mpsc::channel::<()>(1);
        let listener = match crate::listen::bind(cfg.listen, 1024, "[modules.proxy65] listen") {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::error!(module = NAME, address = %cfg.listen, error = %e,
                    "cannot listen for SOCKS5 connections; the proxy answers address requests with not-allowed. Change [modules.proxy65] listen");
                None
            }
        };
        let bound = listener.as_ref().and_then(|l| l.local_addr().ok());
        let host = if !cfg.host.is_empty() {
            Some(cfg.host.clone())
        } else {
            bound
                .filter(|a| !a.ip().is_unspecified())
                .map(|a| a.ip().to_string())
        };
        let proxy = Arc::new(Proxy {
            subdomain: cfg.subdomain.clone(),
            name: cfg.name.clone(),
            allowed: cfg.allowed,
            host,
            port: bound.map(|a| if cfg.port != 0 { cfg.port } else { a.port() }),
            activation_timeout: Duration::from_secs(cfg.activation_timeout_secs),
            idle_timeout: Duration::from_secs(cfg.idle_timeout_secs),
            max_transfer_bytes: cfg.max_transfer_bytes,
            max_bytes_per_second: cfg.max_bytes_per_second,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            stop,
            tasks_done: Mutex::new(Some(tasks_done)),
            metrics,
        });
        if let (Some(listener), Some(addr)) = (listener, bound) {
            tracing::info!(module = NAME, address = %addr, "listening for SOCKS5 bytestreams");
            tokio::spawn(accept_loop(
                proxy.clone(),
                listener,
                gates.gate(cfg.max_connections).door(NAME),
                stop_rx,
                tasks,
            ));
        }
        // The label lives as long as the server (one per start).
        let label: &'static str = Box::leak(cfg.subdomain.clone().into_boxed_str());
        let svc = Arc::new(ProxyService(proxy));
        reg.service(
            NAME,
            ServiceAddress::Subdomain(label),
            &cfg.name,
            svc.clone(),
        );
        reg.shutdown(NAME, 10, svc);
    }
}

/// The proxy's metrics (registered as `starling_proxy65_*`).
#[derive(Clone, Default)]
struct ProxyMetrics {
    /// Open SOCKS5 connections.
    connections: Gauge,
    /// Activated transfers relaying now.
    transfers_live: Gauge,
    /// Transfers activated since start.
    transfers: Counter,
    /// Bytes relayed since start (both directions).
    bytes: Counter,
    /// Connections refused: bad handshakes, a third party for a hash,
    /// beyond `max_connections`.
    refused: Counter,
}

impl ProxyMetrics {
    fn register(&self, r: &mut prometheus_client::registry::Registry) {
        r.register(
            "proxy65_connections",
            "Open SOCKS5 bytestream connections",
            self.connections.clone(),
        );
        r.register(
            "proxy65_transfers_live",
            "Activated SOCKS5 bytestreams relaying now",
            self.transfers_live.clone(),
        );
        r.register(
            "proxy65_transfers",
            "SOCKS5 bytestreams activated",
            self.transfers.clone(),
        );
        r.register(
            "proxy65_relayed_bytes",
            "Bytes relayed by the SOCKS5 bytestreams proxy",
            self.bytes.clone(),
        );
        r.register(
            "proxy65_refused",
            "SOCKS5 connections refused",
            self.refused.clone(),
        );
    }
}

/// DST.ADDR of a bytestream: SHA-1(SID + requester JID + target JID) in
/// lowercase hex (§6.3.2).
type Hash = [u8; 40];

/// The hash of a bytestream (§6.3.2; the JIDs as the server normalised
/// them, which is their stringprep'd form).
fn stream_hash(sid: &str, requester: &str, target: &str) -> Hash {
    use sha1::Digest as _;
    let mut h = sha1::Sha1::new();
    h.update(sid.as_bytes());
    h.update(requester.as_bytes());
    h.update(target.as_bytes());
    let digest = h.finalize();
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 40];
    for (i, b) in digest.iter().enumerate() {
        out[2 * i] = HEX[usize::from(b >> 4)];
        out[2 * i + 1] = HEX[usize::from(b & 0x0f)];
    }
    out
}

/// Whether `from` may use the proxy.
fn may_use(allowed: Allowed, from: &Jid, is_local: impl Fn(&str) -> bool) -> bool {
    match allowed {
        Allowed::All => true,
        Allowed::Local => is_local(from.domain().as_str()),
    }
}

/// One accepted connection with what it holds while open.
struct Conn {
    stream: TcpStream,
    _ticket: Ticket,
    _open: Held,
}

/// The second connection of a pair, handed to the first one's task.
struct Joined {
    conn: Conn,
    /// DST.ADDR as the second client sent it (echoed in its reply).
    addr: Hash,
    /// Fires when the requester activates the pair.
    activate: oneshot::Receiver<()>,
}

/// A hash's connections. Every change happens under [`Proxy::pending`]'s
/// lock, and a task leaves only after checking its entry there, so a
/// connection handed over or an activation sent is never lost.
struct Entry {
    /// The task of the first connection, which owns the pair.
    id: u64,
    slot: Slot,
}

enum Slot {
    /// One connection waits for its partner.
    Waiting(oneshot::Sender<Joined>),
    /// Both are connected; the requester may activate.
    Paired(oneshot::Sender<()>),
    /// Relaying.
    Active,
}

/// The proxy's shared state.
struct Proxy {
    subdomain: String,
    name: String,
    allowed: Allowed,
    /// The advertised host; `None`: the served domain.
    host: Option<String>,
    /// The advertised port; `None`: not listening.
    port: Option<u16>,
    activation_timeout: Duration,
    idle_timeout: Duration,
    max_transfer_bytes: u64,
    max_bytes_per_second: u64,
    pending: Mutex<HashMap<Hash, Entry>>,
    next_id: AtomicU64,
    /// `true`: shutting down (the accept loop and every connection end).
    stop: watch::Sender<bool>,
    /// Closed when every task (accept loop, connections) has ended.
    tasks_done: Mutex<Option<mpsc::Receiver<()>>>,
    metrics: ProxyMetrics,
}

/// What pairing gave a connection.
enum Role {
    /// First with its hash: waits for the partner.
    First(oneshot::Receiver<Joined>),
    /// Second: handed over to the first's task.
    Second,
    /// A third, or a hash that is relaying already.
    Refused,
}

impl Proxy {
    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<Hash, Entry>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// Pairs a connection that asked for `key` (§6.3.2, §6.3.4).
    fn pair(&self, key: Hash, id: u64, conn: Conn, addr: Hash) -> (Role, Option<Conn>) {
        let mut map = self.pending();
        let Some(entry) = map.get_mut(&key) else {
            let (tx, rx) = oneshot::channel();
            map.insert(
                key,
                Entry {
                    id,
                    slot: Slot::Waiting(tx),
                },
            );
            return (Role::First(rx), Some(conn));
        };
        if !matches!(entry.slot, Slot::Waiting(_)) {
            return (Role::Refused, Some(conn));
        }
        let (activate_tx, activate) = oneshot::channel();
        let Slot::Waiting(join) = std::mem::replace(&mut entry.slot, Slot::Paired(activate_tx))
        else {
            unreachable!("checked above");
        };
        match join.send(Joined {
            conn,
            addr,
            activate,
        }) {
            Ok(()) => (Role::Second, None),
            Err(j) => {
                // The first task left without its entry: not expected.
                tracing::warn!(module = NAME, "a waiting bytestream connection vanished");
                map.remove(&key);
                (Role::Refused, Some(j.conn))
            }
        }
    }

    /// Removes `key`'s entry if it is still `id`'s.
    fn forget(&self, key: &Hash, id: u64) {
        let mut map = self.pending();
        if map.get(key).is_some_and(|e| e.id == id) {
            map.remove(key);
        }
    }

    /// A pair that was not activated leaves: `true` if it was activated
    /// meanwhile after all (the requester got its result: relay).
    fn leave_paired(&self, key: &Hash, id: u64) -> bool {
        let mut map = self.pending();
        match map.get(key) {
            Some(e) if e.id == id => {
                if matches!(e.slot, Slot::Active) && !self.stopping() {
                    return true;
                }
                map.remove(key);
                false
            }
            _ => false,
        }
    }

    /// Activates the pair of `key` (§6.3.5).
    fn activate(&self, key: &Hash) -> Result<(), StanzaError> {
        let mut map = self.pending();
        let Some(entry) = map.get_mut(key) else {
            return Err(StanzaError::new(StanzaErrorCondition::ItemNotFound)
                .with_text("no connection for this stream (sid, requester and target)"));
        };
        match entry.slot {
            Slot::Waiting(_) => Err(StanzaError::new(StanzaErrorCondition::NotAllowed)
                .with_text("only one party is connected to the proxy")),
            Slot::Active => Err(StanzaError::new(StanzaErrorCondition::NotAllowed)
                .with_text("the bytestream is activated already")),
            Slot::Paired(_) => {
                let Slot::Paired(tx) = std::mem::replace(&mut entry.slot, Slot::Active) else {
                    unreachable!("checked above");
                };
                // The pair's task keeps its receiver until it checked its
                // entry under this lock: the send fails only if it is gone.
                if tx.send(()).is_err() {
                    map.remove(key);
                    return Err(StanzaError::new(StanzaErrorCondition::NotAllowed)
                        .with_text("a party left the proxy"));
                }
                Ok(())
            }
        }
    }
}

/// Resolves when shutdown starts.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Resolves when the peer closed its side or the socket failed, never
/// when data arrived (that stays unread until the transfer relays it).
async fn closed(s: &TcpStream) {
    let mut b = [0u8; 1];
    match s.peek(&mut b).await {
        Ok(0) | Err(_) => {}
        Ok(_) => std::future::pending().await,
    }
}

/// Accepts SOCKS5 connections until shutdown (`crate::listen`: over a
/// limit a connection is closed at once and counted here too).
async fn accept_loop(
    proxy: Arc<Proxy>,
    listener: TcpListener,
    door: Door,
    stop: watch::Receiver<bool>,
    tasks: mpsc::Sender<()>,
) {
    let serving = stop.clone();
    crate::listen::accept_loop(listener, NAME, &door, None, Some(stop), |conn| {
        let conn = match conn {
            Ok(c) => c,
            Err(_) => {
                proxy.metrics.refused.inc();
                return;
            }
        };
        let peer = conn.peer;
        let conn = Conn {
            stream: conn.tcp,
            _ticket: conn.ticket,
            _open: Held::new(&proxy.metrics.connections),
        };
        tokio::spawn(serve(
            proxy.clone(),
            conn,
            peer,
            serving.clone(),
            tasks.clone(),
        ));
    })
    .await
}

/// One connection: handshake, pairing; the first of a pair then waits for
/// activation and relays.
async fn serve(
    proxy: Arc<Proxy>,
    mut conn: Conn,
    peer: SocketAddr,
    mut stop: watch::Receiver<bool>,
    _task: mpsc::Sender<()>,
) {
    let deadline = Instant::now() + proxy.activation_timeout;
    let request = tokio::select! {
        r = tokio::time::timeout_at(deadline, handshake(&mut conn.stream)) => r,
        _ = stopped(&mut stop) => return,
    };
    let (key, addr) = match request {
        Ok(Ok(r)) => r,
        Ok(Err(why)) => {
            proxy.metrics.refused.inc();
            tracing::debug!(module = NAME, %peer, reason = ?why, "SOCKS5 handshake refused");
            return;
        }
        Err(_) => {
            tracing::debug!(module = NAME, %peer, "SOCKS5 handshake timed out");
            return;
        }
    };
    let id = proxy.next_id.fetch_add(1, Ordering::Relaxed);
    let (role, conn) = proxy.pair(key, id, conn, addr);
    let mut rx = match role {
        Role::First(rx) => rx,
        Role::Second => return,
        Role::Refused => {
            proxy.metrics.refused.inc();
            tracing::debug!(module = NAME, %peer, "a third connection for a bytestream refused");
            if let Some(mut c) = conn {
                let _ = c.stream.write_all(&failure(REP_NOT_ALLOWED)).await;
            }
            return;
        }
    };
    let Some(mut conn) = conn else { return };
    if conn.stream.write_all(&success(&addr)).await.is_err() {
        proxy.forget(&key, id);
        return;
    }
    // Waiting for the partner.
    let joined = tokio::select! {
        j = &mut rx => j.ok(),
        _ = tokio::time::sleep_until(deadline) => None,
        _ = closed(&conn.stream) => None,
        _ = stopped(&mut stop) => None,
    };
    let Some(Joined {
        conn: mut other,
        addr: other_addr,
        mut activate,
    }) = joined
    else {
        // A partner that joined meanwhile is in `rx`: dropped with it.
        proxy.forget(&key, id);
        tracing::debug!(module = NAME, %peer, "bytestream connection closed before its partner came");
        return;
    };
    if other.stream.write_all(&success(&other_addr)).await.is_err() {
        proxy.forget(&key, id);
        return;
    }
    // Waiting for the activation (§6.3.5).
    let activated = tokio::select! {
        a = &mut activate => a.is_ok(),
        _ = tokio::time::sleep_until(deadline) => false,
        _ = closed(&conn.stream) => false,
        _ = closed(&other.stream) => false,
        _ = stopped(&mut stop) => false,
    };
    if !activated && !proxy.leave_paired(&key, id) {
        tracing::debug!(module = NAME, %peer, "bytestream pair closed before activation");
        return;
    }
    drop(activate);
    proxy.metrics.transfers.inc();
    let live = Held::new(&proxy.metrics.transfers_live);
    let started = Instant::now();
    let (end, bytes) = relay(&proxy, &mut conn.stream, &mut other.stream, &mut stop).await;
    drop(live);
    proxy.forget(&key, id);
    tracing::info!(module = NAME, bytes, millis = started.elapsed().as_millis() as u64, end = %end, "bytestream transfer ended");
}

// RFC 1928 §6 reply codes.
const REP_SUCCEEDED: u8 = 0x00;
const REP_GENERAL_FAILURE: u8 = 0x01;
const REP_NOT_ALLOWED: u8 = 0x02;
const REP_HOST_UNREACHABLE: u8 = 0x04;
const REP_COMMAND_NOT_SUPPORTED: u8 = 0x07;
const REP_ADDRESS_TYPE_NOT_SUPPORTED: u8 = 0x08;

/// The success reply: BND.ADDR and BND.PORT are DST.ADDR and DST.PORT
/// (§6.3.2).
fn success(addr: &Hash) -> [u8; 47] {
    let mut r = [0u8; 47];
    r[..5].copy_from_slice(&[5, REP_SUCCEEDED, 0, 3, 40]);
    r[5..45].copy_from_slice(addr);
    r
}

/// A failure reply (ATYP IPv4, address and port zero).
fn failure(code: u8) -> [u8; 10] {
    [5, code, 0, 1, 0, 0, 0, 0, 0, 0]
}

/// Why a SOCKS5 negotiation failed (any reply is written already).
#[derive(Debug, PartialEq, Eq)]
enum Refused {
    /// Not SOCKS version 5.
    Version(u8),
    /// No "no authentication" method offered.
    NoAcceptableMethod,
    /// A command other than CONNECT (UDP mode is not built).
    Command(u8),
    /// An address type other than DOMAINNAME.
    AddressType(u8),
    /// DST.ADDR is not 40 hexadecimal digits.
    NotAHash,
    /// DST.PORT is not 0.
    Port(u16),
    /// The connection failed or ended early.
    Io,
}

impl From<std::io::Error> for Refused {
    fn from(_: std::io::Error) -> Self {
        Refused::Io
    }
}

/// The SOCKS5 negotiation (RFC 1928 §3, §4; XEP-0065 §10.2): the method
/// selection, then the CONNECT request. Returns DST.ADDR lowercased (the
/// pairing key) and as sent; on a refusal its reply is written. Reads at
/// most 2 + 255 + 4 + 1 + 257 bytes, and nothing past the request.
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> Result<(Hash, Hash), Refused> {
    let mut head = [0u8; 2];
    s.read_exact(&mut head).await?;
    if head[0] != 5 {
        return Err(Refused::Version(head[0]));
    }
    let mut methods = [0u8; 255];
    let methods = &mut methods[..usize::from(head[1])];
    s.read_exact(methods).await?;
    if !methods.contains(&0) {
        s.write_all(&[5, 0xff]).await?;
        return Err(Refused::NoAcceptableMethod);
    }
    s.write_all(&[5, 0]).await?;
    let mut req = [0u8; 4];
    s.read_exact(&mut req).await?;
    let refuse = |code| failure(code);
    if req[0] != 5 {
        s.write_all(&refuse(REP_GENERAL_FAILURE)).await?;
        return Err(Refused::Version(req[0]));
    }
    if req[1] != 1 {
        s.write_all(&refuse(REP_COMMAND_NOT_SUPPORTED)).await?;
        return Err(Refused::Command(req[1]));
    }
    if req[3] != 3 {
        s.write_all(&refuse(REP_ADDRESS_TYPE_NOT_SUPPORTED)).await?;
        return Err(Refused::AddressType(req[3]));
    }
    let mut len = [0u8; 1];
    s.read_exact(&mut len).await?;
    let len = usize::from(len[0]);
    let mut rest = [0u8; 257];
    let rest = &mut rest[..len + 2];
    s.read_exact(rest).await?;
    let (host, port) = rest.split_at(len);
    let port = u16::from_be_bytes([port[0], port[1]]);
    let Ok(addr) = Hash::try_from(host) else {
        s.write_all(&refuse(REP_HOST_UNREACHABLE)).await?;
        return Err(Refused::NotAHash);
    };
    if !addr.iter().all(u8::is_ascii_hexdigit) {
        s.write_all(&refuse(REP_HOST_UNREACHABLE)).await?;
        return Err(Refused::NotAHash);
    }
    if port != 0 {
        s.write_all(&refuse(REP_NOT_ALLOWED)).await?;
        return Err(Refused::Port(port));
    }
    Ok((addr.map(|b| b.to_ascii_lowercase()), addr))
}

/// How a transfer ended.
enum End {
    /// Both sides closed.
    Done,
    /// `max_transfer_bytes` reached.
    Cut,
    /// `idle_timeout_secs` without a byte.
    Idle,
    /// Server shutdown.
    Stopped,
    /// A connection failed.
    Failed(std::io::ErrorKind),
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            End::Done => f.write_str("both sides closed"),
            End::Cut => f.write_str("max_transfer_bytes reached"),
            End::Idle => f.write_str("idle_timeout_secs without data"),
            End::Stopped => f.write_str("server shutdown"),
            End::Failed(kind) => write!(f, "connection failed: {kind}"),
        }
    }
}

/// Why a direction stopped early.
enum Stop {
    Cut,
    Io(std::io::Error),
}

/// What both directions of a transfer share: the byte budget, the pace,
/// the last activity.
struct Shared {
    base: Instant,
    max: u64,
    total: AtomicU64,
    /// Bytes per second (0: unpaced).
    rate: u64,
    /// When the pace lets the next bytes go, in ns after `base`.
    next_ns: AtomicU64,
    /// The last byte read or written, in ms after `base`.
    last_ms: AtomicU64,
    bytes: Counter,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn touch(&self) {
        let ms = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// How many of `n` bytes the budget lets through.
    fn take(&self, n: usize) -> usize {
        let before = self.total.fetch_add(n as u64, Ordering::Relaxed);
        if self.max == 0 {
            return n;
        }
        let left = self.max.saturating_sub(before);
        usize::try_from(left).map_or(n, |l| l.min(n))
    }

    /// Waits until the pace lets `n` bytes go.
    async fn pace(&self, n: usize) {
        if self.rate == 0 {
            return;
        }
        let cost =
            u64::try_from(n as u128 * 1_000_000_000 / u128::from(self.rate)).unwrap_or(u64::MAX);
        let now = self.now_ns();
        let prev = self
            .next_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
                Some(next.max(now).saturating_add(cost))
            })
            .unwrap_or_else(|v| v);
        let at = prev.max(now);
        if at > now {
            tokio::time::sleep_until(self.base + Duration::from_nanos(at)).await;
        }
    }
}

/// Copies `from` to `to` until `from` ends (then half-closes `to`: the
/// other direction goes on), the budget is spent or a socket fails.
async fn pump(
    mut from: tokio::net::tcp::ReadHalf<'_>,
    mut to: tokio::net::tcp::WriteHalf<'_>,
    shared: &Shared,
    chunk: usize,
) -> Result<(), Stop> {
    let mut buf = vec![0u8; chunk];
    loop {
        let n = from.read(&mut buf).await.map_err(Stop::Io)?;
        if n == 0 {
            return to.shutdown().await.map_err(Stop::Io);
        }
        shared.touch();
        let allowed = shared.take(n);
        if allowed > 0 {
            shared.pace(allowed).await;
            to.write_all(&buf[..allowed]).await.map_err(Stop::Io)?;
            shared.bytes.inc_by(allowed as u64);
            shared.touch();
        }
        if allowed < n {
            return Err(Stop::Cut);
        }
    }
}

/// Relays between an activated pair (§6.3.5) until it ends; returns how
/// and the bytes relayed.
async fn relay(
    proxy: &Proxy,
    a: &mut TcpStream,
    b: &mut TcpStream,
    stop: &mut watch::Receiver<bool>,
) -> (End, u64) {
    let shared = Shared {
        base: Instant::now(),
        max: proxy.max_transfer_bytes,
        total: AtomicU64::new(0),
        rate: proxy.max_bytes_per_second,
        next_ns: AtomicU64::new(0),
        last_ms: AtomicU64::new(0),
        bytes: proxy.metrics.bytes.clone(),
    };
    // Small reads at low rates, so pacing stays smooth.
    let chunk = match proxy.max_bytes_per_second {
        0 => 16 * 1024,
        r => usize::try_from(r / 8)
            .unwrap_or(usize::MAX)
            .clamp(1, 16 * 1024),
    };
    let (ar, aw) = a.split();
    let (br, bw) = b.split();
    let both =
        async { tokio::try_join!(pump(ar, bw, &shared, chunk), pump(br, aw, &shared, chunk)) };
    tokio::pin!(both);
    let idle = proxy.idle_timeout;
    let end = loop {
        let idle_at =
            shared.base + Duration::from_millis(shared.last_ms.load(Ordering::Relaxed)) + idle;
        tokio::select! {
            r = &mut both => break match r {
                Ok(_) => End::Done,
                Err(Stop::Cut) => End::Cut,
                Err(Stop::Io(e)) => End::Failed(e.kind()),
            },
            _ = tokio::time::sleep_until(idle_at), if !idle.is_zero() => {
                let last = shared.base + Duration::from_millis(shared.last_ms.load(Ordering::Relaxed));
                if last + idle <= Instant::now() {
                    break End::Idle;
                }
            }
            _ = stopped(stop) => break End::Stopped,
        }
    };
    let total = shared.total.load(Ordering::Relaxed);
    let relayed = if shared.max == 0 {
        total
    } else {
        total.min(shared.max)
    };
    (end, relayed)
}

/// The service at `<subdomain>.<domain>`.
struct ProxyService(Arc<Proxy>);

impl ProxyService {
    fn disco_info(&self) -> Element {
        let p = &self.0;
        let mut q = Element::new("query", ns::DISCO_INFO);
        q.append_child(
            Element::builder("identity", ns::DISCO_INFO)
                .attr("category", "proxy")
                .attr("type", "bytestreams")
                .attr("name", p.name.as_str())
                .build(),
        );
        for f in [NS_BYTESTREAMS, ns::DISCO_INFO, ns::DISCO_ITEMS] {
            q.append_child(
                Element::builder("feature", ns::DISCO_INFO)
                    .attr("var", f)
                    .build(),
            );
        }
        q
    }

    /// §4: the proxy's network address.
    fn streamhost(
        &self,
        env: &Env,
        from: &Jid,
        service: &str,
        q: &Element,
    ) -> Result<Option<Element>, StanzaError> {
        let p = &self.0;
        if !may_use(p.allowed, from, |d| env.hosts.is_local(d)) {
            return Err(StanzaError::new(StanzaErrorCondition::Forbidden));
        }
        let Some(port) = p.port.filter(|_| !p.stopping()) else {
            return Err(StanzaError::new(StanzaErrorCondition::NotAllowed)
                .with_text("the proxy is not listening"));
        };
        let host = match &p.host {
            Some(h) => h.clone(),
            None => service
                .strip_prefix(p.subdomain.as_str())
                .and_then(|d| d.strip_prefix('.'))
                .unwrap_or(service)
                .to_owned(),
        };
        let mut r = Element::new("query", NS_BYTESTREAMS);
        if let Some(sid) = q.attr("sid") {
            // Before version 1.8 the request carried a sid; echo it.
            r.set_attr("sid", sid);
        }
        r.append_child(
            Element::builder("streamhost", NS_BYTESTREAMS)
                .attr("jid", service)
                .attr("host", host)
                .attr("port", port.to_string())
                .build(),
        );
        Ok(Some(r))
    }

    /// §6.3.5: activation by the requester.
    fn activate(&self, env: &Env, from: &Jid, q: &Element) -> Result<Option<Element>, StanzaError> {
        let p = &self.0;
        let sid = q.attr("sid").filter(|s| !s.is_empty());
        let target = q
            .get_child("activate", NS_BYTESTREAMS)
            .map(|a| a.text().trim().to_owned())
            .filter(|t| !t.is_empty());
        let (Some(sid), Some(target)) = (sid, target) else {
            return Err(StanzaError::new(StanzaErrorCondition::BadRequest)
                .with_text("activation needs a sid and an <activate/> JID"));
        };
        let target =
            Jid::new(&target).map_err(|_| StanzaError::new(StanzaErrorCondition::JidMalformed))?;
        if !may_use(p.allowed, from, |d| env.hosts.is_local(d)) {
            return Err(StanzaError::new(StanzaErrorCondition::Forbidden));
        }
        let key = stream_hash(sid, from.as_str(), target.as_str());
        p.activate(&key)?;
        tracing::debug!(module = NAME, requester = %from, target = %target, "bytestream activated");
        Ok(None)
    }
}

#[async_trait]
impl Service for ProxyService {
    async fn handle(&self, env: &Env, st: Stanza) {
        let reply = self.reply(env, &st);
        if let Some(r) = reply {
            env.route(r).await;
        }
    }
}

impl ProxyService {
    /// The answer to a stanza for the service.
    fn reply(&self, env: &Env, st: &Stanza) -> Option<Stanza> {
        let to = st.to()?;
        let unavailable = || StanzaError::new(StanzaErrorCondition::ServiceUnavailable);
        match st.kind() {
            StanzaKind::Iq if st.is_iq_request() => {}
            StanzaKind::Message if !st.is_error() => return st.error_reply(unavailable()),
            _ => return None,
        }
        if to.node().is_some() || to.resource().is_some() {
            return st.error_reply(unavailable());
        }
        let from = st.from()?;
        let Some(q) = st.payload() else {
            return st.error_reply(StanzaError::new(StanzaErrorCondition::BadRequest));
        };
        let get = st.type_attr() == Some("get");
        let r = match (q.ns(), q.name(), get) {
            (ns::DISCO_INFO, "query", true) if q.attr("node").is_none() => {
                Ok(Some(self.disco_info()))
            }
            (ns::DISCO_ITEMS, "query", true) if q.attr("node").is_none() => {
                Ok(Some(Element::new("query", ns::DISCO_ITEMS)))
            }
            (NS_BYTESTREAMS, "query", true) => self.streamhost(env, from, to.domain().as_str(), q),
            (NS_BYTESTREAMS, "query", false) => self.activate(env, from, q),
            _ => Err(unavailable()),
        };
        match r {
            Ok(payload) => Some(st.iq_result(payload)),
            Err(e) => st.error_reply(e),
        }
    }
}

#[async_trait]
impl ShutdownHandler for ProxyService {
    /// Closes the listener and every connection, waiting (at most 5 s)
    /// for their tasks.
    async fn shutdown(&self, _env: &Env) {
        self.0.stop.send_replace(true);
        let done = self
            .0
            .tasks_done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(mut done) = done {
            if tokio::time::timeout(Duration::from_secs(5), done.recv())
                .await
                .is_err()
            {
                tracing::warn!(
                    module = NAME,
                    "some SOCKS5 connections did not close within 5 s"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// XEP-0065 §7's example: the DST.ADDR of sid `yia72g3v49j7` from
    /// `requester@example.com/foo` to `room@conference.example.net/Tget`.
    #[test]
    fn proxy65_stream_hash_matches_the_spec_example() {
        let h = stream_hash(
            "yia72g3v49j7",
            "requester@example.com/foo",
            "room@conference.example.net/Tget",
        );
        assert_eq!(&h, b"416781edf1ae50bad01cb8509ba35b43952bc345");
    }

    fn connect_request(addr: &[u8], port: u16) -> Vec<u8> {
        let mut r = vec![5, 1, 0, 3, addr.len() as u8];
        r.extend_from_slice(addr);
        r.extend_from_slice(&port.to_be_bytes());
        r
    }

    /// Runs the handshake against `input` (sent at once, then the client
    /// half closes); returns the result and every byte the proxy wrote.
    async fn run(input: Vec<u8>) -> (Result<(Hash, Hash), Refused>, Vec<u8>) {
        let (mut client, mut server) = tokio::io::duplex(4096);
        let t = tokio::spawn(async move {
            client.write_all(&input).await.unwrap();
            client.shutdown().await.unwrap();
            let mut out = Vec::new();
            client.read_to_end(&mut out).await.unwrap();
            out
        });
        let r = handshake(&mut server).await;
        drop(server);
        (r, t.await.unwrap())
    }

    const HASH: &[u8; 40] = b"416781EDF1AE50BAD01CB8509BA35B43952BC345";

    #[tokio::test]
    async fn proxy65_handshake_no_auth_connect_gives_the_lowercased_hash() {
        let mut input = vec![5, 2, 2, 0];
        input.extend(connect_request(HASH, 0));
        let (r, out) = run(input).await;
        let (key, addr) = r.unwrap();
        assert_eq!(&key, b"416781edf1ae50bad01cb8509ba35b43952bc345");
        assert_eq!(&addr, HASH, "echoed as sent");
        assert_eq!(out, [5, 0], "method 'no authentication' chosen");
        assert_eq!(success(&addr)[..5], [5, 0, 0, 3, 40]);
    }

    #[tokio::test]
    async fn proxy65_handshake_refusals_get_their_rfc1928_codes() {
        // Only username/password offered: no acceptable method.
        let (r, out) = run(vec![5, 1, 2]).await;
        assert_eq!(
            (r.unwrap_err(), out),
            (Refused::NoAcceptableMethod, vec![5, 0xff])
        );
        // No method at all.
        let (r, out) = run(vec![5, 0]).await;
        assert_eq!(
            (r.unwrap_err(), out),
            (Refused::NoAcceptableMethod, vec![5, 0xff])
        );
        let cases: Vec<(Vec<u8>, Refused, u8)> = vec![
            (
                vec![5, 3, 0, 3, 40],
                Refused::Command(3),
                REP_COMMAND_NOT_SUPPORTED,
            ),
            (
                vec![5, 1, 0, 1, 127, 0, 0, 1, 0, 0],
                Refused::AddressType(1),
                REP_ADDRESS_TYPE_NOT_SUPPORTED,
            ),
            (
                connect_request(b"example.org", 0),
                Refused::NotAHash,
                REP_HOST_UNREACHABLE,
            ),
            (
                connect_request(&[b'g'; 40], 0),
                Refused::NotAHash,
                REP_HOST_UNREACHABLE,
            ),
            (
                connect_request(HASH, 7777),
                Refused::Port(7777),
                REP_NOT_ALLOWED,
            ),
            (vec![4, 1, 0, 3], Refused::Version(4), REP_GENERAL_FAILURE),
        ];
        for (req, why, code) in cases {
            let mut input = vec![5, 1, 0];
            input.extend(req);
            let (r, out) = run(input).await;
            assert_eq!(r.unwrap_err(), why);
            assert_eq!(out[..2], [5, 0]);
            assert_eq!(out[2..], failure(code), "{why:?}");
        }
    }

    /// Cut anywhere, the handshake ends with `Io`, never a panic, and an
    /// oversized domain (255 bytes) is read and refused.
    #[tokio::test]
    async fn proxy65_handshake_truncated_or_oversized_input_is_refused() {
        let mut full = vec![5, 1, 0];
        full.extend(connect_request(HASH, 0));
        for cut in 0..full.len() {
            let (r, _) = run(full[..cut].to_vec()).await;
            assert!(r.is_err(), "cut at {cut}");
        }
        // Not SOCKS5 at all: closed without a reply.
        let (r, out) = run(b"GET / HTTP/1.1\r\n\r\n".to_vec()).await;
        assert_eq!((r.unwrap_err(), out), (Refused::Version(b'G'), vec![]));
        let mut big = vec![5, 255];
        big.extend([0u8; 255]);
        big.extend(connect_request(&[b'a'; 255], 0));
        let (r, out) = run(big).await;
        assert_eq!(r.unwrap_err(), Refused::NotAHash);
        assert_eq!(out[2..], failure(REP_HOST_UNREACHABLE));
    }

    #[test]
    fn proxy65_allowed_local_refuses_other_domains() {
        let local = |d: &str| d == "localhost";
        let alice = Jid::new("alice@localhost/a").unwrap();
        let mallory = Jid::new("mallory@elsewhere.example/x").unwrap();
        assert!(may_use(Allowed::Local, &alice, local));
        assert!(!may_use(Allowed::Local, &mallory, local));
        assert!(may_use(Allowed::All, &mallory, local));
    }

    #[test]
    fn proxy65_config_checks_its_values() {
        let ok = Proxy65Config::default();
        assert!(Proxy65::validate(&ok, &[]).is_ok());
        let bad = |f: fn(&mut Proxy65Config)| {
            let mut c = Proxy65Config::default();
            f(&mut c);
            Proxy65::validate(&c, &[]).unwrap_err().key
        };
        assert_eq!(bad(|c| c.subdomain = "Proxy.x".into()), "subdomain");
        assert_eq!(bad(|c| c.host = "a b".into()), "host");
        assert_eq!(
            bad(|c| c.activation_timeout_secs = 0),
            "activation_timeout_secs"
        );
        assert_eq!(bad(|c| c.max_connections = 1), "max_connections");
        let c: Proxy65Config =
            toml::from_str("listen = \"127.0.0.1:0\"\nallowed = \"all\"\nhost = \"::1\"").unwrap();
        assert_eq!((c.allowed, c.listen.port()), (Allowed::All, 0));
        assert!(Proxy65::validate(&c, &[]).is_ok());
        assert!(toml::from_str::<Proxy65Config>("allowed = \"friends\"").is_err());
        assert!(toml::from_str::<Proxy65Config>("listen = \"localhost:7777\"").is_err());
    }
}
