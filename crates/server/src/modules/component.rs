//! External components (XEP-0114 1.6, Jabber Component Protocol, the
//! `jabber:component:accept` method): a gateway, a bot or a push app server
//! connects to a TCP port of its own (`listen`, loopback by default),
//! authenticates with a shared secret and then owns one domain: every
//! stanza for that domain or a JID in it goes to it, and it sends stanzas
//! into the server as if it were one of the server's own services.
//!
//! - **Stream** (§3): the component opens a stream in
//!   `jabber:component:accept` with `to` its domain; one that is not
//!   configured gets `<host-unknown/>`, no `to` `<improper-addressing/>`,
//!   another default namespace `<invalid-namespace/>` (each after our
//!   header, RFC 6120 §4.9.1.2). Our header carries a fresh stream id
//!   from the OS CSPRNG.
//! - **Handshake** (§3): `<handshake>` holds the lowercase hex SHA-1 of
//!   the stream id followed by the secret; it is compared in constant
//!   time. A wrong one gets `<not-authorized/>` and the stream closes; a
//!   right one `<handshake/>`. A domain already connected (on any node of
//!   a cluster) refuses the newcomer with `<conflict/>`, after its
//!   handshake — Prosody's default (`kick_new`); the connected one is not
//!   disturbed. Authentication must be done within
//!   `negotiation_timeout_secs` of the connection (`<connection-timeout/>`).
//! - **From the component** (§3, end): each stanza must have a `from` in
//!   the component's domain (`user@domain/resource`, `domain`…; another
//!   domain is `<invalid-from/>`, none or a malformed one
//!   `<improper-addressing/>`, both stream errors) and a `to` (none:
//!   `bad-request` back to it, as Prosody does). Then it is routed like
//!   the server's own stanzas (`Env::route`): to users (through their
//!   inbound rules: block lists, archive), to the server, to other
//!   services and components. Unknown top-level elements end the stream
//!   with `<unsupported-stanza-type/>`; malformed XML with the parser's
//!   condition; only that stream is affected.
//! - **To the component** (§4): a [`Service`] at the component's domain
//!   puts each stanza in the connection's bounded mailbox
//!   (`mailbox_size` stanzas, `mailbox_bytes` bytes; full:
//!   `resource-constraint` to the sender); the
//!   connection task writes it. While no component is connected, iq
//!   requests and messages get `service-unavailable` (RFC 6120 §10.4.3),
//!   presence and iq results are dropped; so are the stanzas still queued
//!   when the connection ends.
//! - **Disco**: a component under a served domain is listed in that
//!   domain's `disco#items` with its `name`; it answers `disco#info` on its
//!   domain itself (stanzas pass through).
//! - **Cluster**: the connected component is announced to every node as
//!   a session of its own (`<domain>/component`, never available, so no
//!   presence logic sees it) in the session registry; another node hands
//!   stanzas for it to its node with `Router::to_service_on`, which keeps
//!   messages until that node took them. The registry's rule for two binds
//!   of one JID (the later wins) settles two nodes accepting the same
//!   domain at the same moment: the loser gets `<conflict/>`.
//! - **Limits**: `max_stanza_bytes` (and the parser's depth and attribute
//!   limits), a read rate of `max_bytes_per_second` (reads pause past it),
//!   `write_timeout_secs` for a component that stops reading (the stream is
//!   dropped), 128 open connections to the port at most.
//! - Not built: XEP-0225 (component connections over TLS/SASL), the
//!   `jabber:component:connect` method, `<bind/>` of extra domains,
//!   TLS on the port (the specification has none: keep the listener on
//!   loopback or a private network).
//!
//! Hooks: a [`Service`] per component domain, `started` (opens the
//! listener once the environment exists), `shutdown` (closes the listener
//! and every component stream with `<system-shutdown/>`). Storage: none.
//! Config: `[modules.component]` enabled, listen, negotiation_timeout_secs,
//! max_stanza_bytes, max_bytes_per_second, mailbox_size, mailbox_bytes,
//! write_timeout_secs, components (`domain`, `secret` or `secret_file`,
//! `name`).

use crate::transport::connection::{Closing, Connection, Inbound, IoEnd, ReadLimits, XmlStream};
use crate::transport::gate::{Door, Gates, PerSource, Ticket};
use crate::transport::tcp::Transport;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde::Deserialize;
use starling_core::hooks::{
    HookRegistry, Service, ServiceAddress, ShutdownHandler, StartedHandler,
};
use starling_core::module::{ConfigProblem, Module, ModuleCtx};
use starling_core::SessionSendError;
use starling_core::{async_trait, mailbox, CloseReason, Env, Mailbox, SessionHandle, SessionMsg};
use starling_proto::{
    ns, random_id, BareJid, FullJid, Jid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind,
    StanzaParseError, StreamError, StreamErrorCondition,
};
use starling_xml::{Element, Limits, Node, StreamHeader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, Instant};

const NAME: &str = "component";
/// XEP-0114's namespace of the accept method: the stream's content.
pub const NS_COMPONENT_ACCEPT: &str = "jabber:component:accept";
/// The resource of the registry entry announcing a connected component.
const RESOURCE: &str = "component";
/// Open connections to the component port at most (authenticated or not).
const MAX_CONNECTIONS: usize = 128;
/// Stanzas written per flush at most when many wait.
const WRITE_BATCH: usize = 256;

/// `[modules.component]`: XEP-0114 external components.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ComponentConfig {
    /// Accept external components. Off by default: it opens a TCP port.
    pub enabled: bool,
    /// Where the component listener binds: an IP address and port. The
    /// protocol has no TLS: keep it on loopback (the default) or a
    /// private network.
    #[serde(deserialize_with = "socket_addr")]
    pub listen: SocketAddr,
    /// Seconds from the connection to a successful handshake, past which
    /// the stream is closed with `<connection-timeout/>`.
    pub negotiation_timeout_secs: u64,
    /// Largest stanza accepted from a component, in bytes (larger ones
    /// close its stream with `<policy-violation/>`).
    pub max_stanza_bytes: usize,
    /// Sustained bytes per second read from one component; faster ones
    /// are throttled (reads pause), not disconnected. 0: no limit.
    pub max_bytes_per_second: u64,
    /// Stanzas queued for one component before senders get
    /// `<resource-constraint/>`.
    pub mailbox_size: usize,
    /// Bytes of stanzas queued for one component (their parsed size)
    /// before senders get `<resource-constraint/>`.
    pub mailbox_bytes: usize,
    /// Seconds a write to a component may block before its stream is
    /// dropped (it stopped reading).
    pub write_timeout_secs: u64,
    /// The components: `{ domain = "gw.example.org", secret = "…" }` (or
    /// `secret_file = "/path"` instead of `secret`), optional `name` for
    /// service discovery.
    pub components: Vec<ComponentEntry>,
}

impl Default for ComponentConfig {
    fn default() -> Self {
        ComponentConfig {
            enabled: false,
            listen: "127.0.0.1:5347".parse().expect("literal address"),
            negotiation_timeout_secs: 30,
            max_stanza_bytes: 512 * 1024,
            max_bytes_per_second: 10 * 1024 * 1024,
            mailbox_size: 8192,
            mailbox_bytes: 64 * 1024 * 1024,
            write_timeout_secs: 30,
            components: Vec::new(),
        }
    }
}

/// One external component.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentEntry {
    /// The domain it owns (the `to` of its stream header).
    pub domain: String,
    /// The shared secret of the handshake. The configuration file then
    /// must not be readable by others; `secret_file` keeps it out of the
    /// file.
    #[serde(default)]
    pub secret: Option<String>,
    /// A file holding the secret (surrounding whitespace ignored), not
    /// readable by others; instead of `secret`.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// Its name in the server's `disco#items` (empty: none).
    #[serde(default)]
    pub name: String,
}

impl std::fmt::Debug for ComponentEntry {
    // The secret never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComponentEntry")
            .field("domain", &self.domain)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("secret_file", &self.secret_file)
            .field("name", &self.name)
            .finish()
    }
}

/// An `IP:port` string.
fn socket_addr<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(|_| {
        serde::de::Error::custom(format!(
            "{s:?} is not an IP address and port (host names are not resolved); \
             write e.g. \"127.0.0.1:5347\" (loopback only)"
        ))
    })
}

/// The normalised domain of `d`, if it is a domain JID.
pub fn normalized_domain(d: &str) -> Option<String> {
    match BareJid::new(d) {
        Ok(j) if j.node().is_none() => Some(j.domain().as_str().to_owned()),
        _ => None,
    }
}

/// Reads a secret file: its content without surrounding whitespace.
fn read_secret_file(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(secret.to_owned())
}

/// The component module.
pub struct Component;

impl Module for Component {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str =
        "XEP-0114 external components (gateways, bots) on their own domains (opens a TCP port)";
    type Config = ComponentConfig;

    fn claimed_domains(cfg: &Self::Config) -> (&'static str, Vec<String>) {
        let domains = cfg
            .components
            .iter()
            .filter_map(|c| normalized_domain(&c.domain))
            .collect();
        ("components", domains)
    }
    fn enabled(cfg: &ComponentConfig) -> bool {
        cfg.enabled
    }

    fn validate(cfg: &ComponentConfig, domains: &[String]) -> Result<(), ConfigProblem> {
        if cfg.negotiation_timeout_secs == 0 {
            return Err(ConfigProblem::new(
                "negotiation_timeout_secs",
                "must be at least 1",
            ));
        }
        if cfg.write_timeout_secs == 0 {
            return Err(ConfigProblem::new(
                "write_timeout_secs",
                "must be at least 1",
            ));
        }
        if cfg.max_stanza_bytes < 10_000 {
            return Err(ConfigProblem::new(
                "max_stanza_bytes",
                "RFC 6120 §13.12 requires accepting stanzas of at least 10000 bytes",
            ));
        }
        if cfg.mailbox_bytes < cfg.max_stanza_bytes {
            return Err(ConfigProblem::new(
                "mailbox_bytes",
                "must be at least max_stanza_bytes (or a component could be sent only one stanza at a time)",
            ));
        }
        if cfg.mailbox_size == 0 {
            return Err(ConfigProblem::new("mailbox_size", "must be at least 1"));
        }
        if cfg.enabled && cfg.components.is_empty() {
            return Err(ConfigProblem::new(
                "components",
                "no component configured: add components = [{ domain = \"gw.example.org\", secret = \"…\" }] or set enabled = false",
            ));
        }
        let served: Vec<String> = domains
            .iter()
            .map(|d| normalized_domain(d).unwrap_or_else(|| d.clone()))
            .collect();
        let mut seen = Vec::new();
        for c in &cfg.components {
            let Some(domain) = normalized_domain(&c.domain) else {
                return Err(ConfigProblem::new(
                    "components",
                    format!(
                        "{:?} is not a domain; give the component's domain, e.g. \"gw.example.org\"",
                        c.domain
                    ),
                ));
            };
            if served.contains(&domain) {
                return Err(ConfigProblem::new(
                    "components",
                    format!(
                        "{domain} is a served domain ([server] domains): a component needs a domain of its own, e.g. \"gw.{domain}\""
                    ),
                ));
            }
            if seen.contains(&domain) {
                return Err(ConfigProblem::new(
                    "components",
                    format!("{domain} is configured twice: keep one entry"),
                ));
            }
            match (&c.secret, &c.secret_file) {
                (Some(_), Some(_)) | (None, None) => {
                    return Err(ConfigProblem::new(
                        "components",
                        format!("{domain}: give exactly one of secret and secret_file"),
                    ))
                }
                (Some(s), None) if s.is_empty() => {
                    return Err(ConfigProblem::new(
                        "components",
                        format!("{domain}: the secret is empty; use a long random one (e.g. `openssl rand -hex 32`)"),
                    ))
                }
                (Some(_), None) => {}
                (None, Some(path)) => {
                    if let Err(e) = read_secret_file(path) {
                        return Err(ConfigProblem::new(
                            "components",
                            format!("{domain}: secret_file: {e}"),
                        ));
                    }
                    #[cfg(unix)]
                    {
                        use std::os::unix::fs::PermissionsExt as _;
                        let mode = std::fs::metadata(path)
                            .map(|m| m.permissions().mode())
                            .unwrap_or(0);
                        if mode & 0o004 != 0 {
                            return Err(ConfigProblem::new(
                                "components",
                                format!(
                                    "{domain}: secret_file {} is readable by every user (mode {:o}): chmod o-r it",
                                    path.display(),
                                    mode & 0o777
                                ),
                            ));
                        }
                    }
                }
            }
            seen.push(domain);
        }
        Ok(())
    }

    async fn start(cfg: &ComponentConfig, ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        let metrics = ComponentMetrics::default();
        ctx.metrics.with_registry(|r| metrics.register(r));
        let mut slots = Vec::new();
        for c in &cfg.components {
            let Some(domain) = normalized_domain(&c.domain) else {
                continue; // refused by validate
            };
            let secret = match (&c.secret, &c.secret_file) {
                (Some(s), _) => Some(s.clone()),
                (None, Some(path)) => match read_secret_file(path) {
                    Ok(s) => Some(s),
                    Err(e) => {
                        tracing::error!(module = NAME, domain = %domain, error = %e,
                            "no secret for this component: its handshakes are refused");
                        None
                    }
                },
                (None, None) => None,
            };
            let Ok(jid) = BareJid::new(&domain).and_then(|b| b.with_resource_str(RESOURCE)) else {
                continue;
            };
            slots.push(Arc::new(Slot {
                domain,
                jid,
                secret,
                local: Mutex::new(None),
            }));
        }
        let listener = match crate::listen::bind(cfg.listen, 128, "[modules.component] listen") {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::error!(module = NAME, address = %cfg.listen, error = %e,
                    "cannot listen for external components; stanzas to them get service-unavailable. Change [modules.component] listen");
                None
            }
        };
        let (stop, _) = watch::channel(false);
        let (tasks, tasks_done) = mpsc::channel::<()>(1);
        let gates = reg.provided::<Arc<Gates>>().cloned().unwrap_or_else(|| {
            Gates::unregistered(PerSource {
                max: 0,
                loopback: false,
            })
        });
        let hub = Arc::new(Hub {
            door: gates.gate(MAX_CONNECTIONS).door(NAME),
            slots,
            node: ctx.node_id,
            limits: Limits {
                max_stanza_bytes: cfg.max_stanza_bytes,
                ..Limits::default()
            },
            read_limits: ReadLimits::from_c2s(cfg.max_bytes_per_second, cfg.max_stanza_bytes, None),
            negotiation_timeout: Duration::from_secs(cfg.negotiation_timeout_secs),
            write_timeout: Duration::from_secs(cfg.write_timeout_secs),
            mailbox_size: cfg.mailbox_size,
            mailbox_bytes: cfg.mailbox_bytes,
            env: OnceLock::new(),
            listener: Mutex::new(listener),
            stop,
            tasks: Mutex::new(Some(tasks)),
            tasks_done: tokio::sync::Mutex::new(Some(tasks_done)),
            next_id: AtomicU64::new(1 << 48),
            metrics,
        });
        for slot in &hub.slots {
            let name = cfg
                .components
                .iter()
                .find(|c| normalized_domain(&c.domain).as_deref() == Some(slot.domain.as_str()))
                .map(|c| c.name.clone())
                .unwrap_or_default();
            reg.service(
                NAME,
                ServiceAddress::Domain(slot.domain.clone()),
                &name,
                Arc::new(ComponentService {
                    hub: hub.clone(),
                    slot: slot.clone(),
                }),
            );
        }
        reg.started(Arc::new(Starter(hub.clone())));
        reg.shutdown(NAME, 10, hub);
    }
}

/// The module's metrics (registered as `starling_component_*`).
#[derive(Clone, Default)]
struct ComponentMetrics {
    /// Components authenticated on this node now.
    connected: Gauge,
    /// Stanzas received from components.
    stanzas_in: Counter,
    /// Stanzas written to components.
    stanzas_out: Counter,
    /// Connections refused: unknown domain, wrong secret, conflict,
    /// timeout.
    refused: Counter,
}

impl ComponentMetrics {
    fn register(&self, r: &mut prometheus_client::registry::Registry) {
        r.register(
            "component_connected",
            "External components (XEP-0114) connected to this node",
            self.connected.clone(),
        );
        r.register(
            "component_stanzas_in",
            "Stanzas received from external components",
            self.stanzas_in.clone(),
        );
        r.register(
            "component_stanzas_out",
            "Stanzas written to external components",
            self.stanzas_out.clone(),
        );
        r.register(
            "component_refused",
            "External component connections refused (unknown domain, wrong secret, conflict, timeout)",
            self.refused.clone(),
        );
    }
}

/// One configured component.
struct Slot {
    /// Its normalised domain.
    domain: String,
    /// Its entry in the session registry while connected
    /// (`<domain>/component`).
    jid: FullJid,
    /// `None`: its secret file could not be read; every handshake fails.
    secret: Option<String>,
    /// The mailbox of its connection, when it is connected to this node.
    local: Mutex<Option<SessionHandle>>,
}

impl Slot {
    fn local(&self) -> Option<SessionHandle> {
        self.local.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// What the listener, the connections and the services share.
struct Hub {
    slots: Vec<Arc<Slot>>,
    node: u8,
    limits: Limits,
    read_limits: ReadLimits,
    negotiation_timeout: Duration,
    write_timeout: Duration,
    mailbox_size: usize,
    mailbox_bytes: usize,
    /// Set once started (a `Weak`: the environment holds the hooks, which
    /// hold this).
    env: OnceLock<Weak<Env>>,
    /// Bound at start, taken by the accept loop once the environment
    /// exists.
    listener: Mutex<Option<TcpListener>>,
    /// Admits connections: [`MAX_CONNECTIONS`] and `[server]
    /// max_connections_per_ip` (`transport::gate`).
    door: Door,
    stop: watch::Sender<bool>,
    /// Held by the accept loop and every connection task: `tasks_done`
    /// ends when all of them have.
    tasks: Mutex<Option<mpsc::Sender<()>>>,
    tasks_done: tokio::sync::Mutex<Option<mpsc::Receiver<()>>>,
    /// Registry ids of component connections (far above session ids, so
    /// logs tell them apart).
    next_id: AtomicU64,
    metrics: ComponentMetrics,
}

impl Hub {
    fn slot(&self, domain: &str) -> Option<&Arc<Slot>> {
        self.slots.iter().find(|s| s.domain == domain)
    }
}

/// Opens the listener once the environment exists (`started`).
struct Starter(Arc<Hub>);

impl StartedHandler for Starter {
    fn started(&self, env: &Arc<Env>) {
        let hub = &self.0;
        let _ = hub.env.set(Arc::downgrade(env));
        let listener = hub
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let tasks = hub.tasks.lock().unwrap_or_else(|e| e.into_inner()).take();
        let (Some(listener), Some(tasks)) = (listener, tasks) else {
            return;
        };
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(module = NAME, address = %addr, components = hub.slots.len(), "listening for external components");
        }
        tokio::spawn(accept_loop(hub.clone(), listener, tasks));
    }
}

#[async_trait]
impl ShutdownHandler for Hub {
    async fn shutdown(&self, _env: &Env) {
        // Stored even with no receiver yet: a task subscribing later sees it.
        self.stop.send_replace(true);
        // The accept loop never started: its sender is still here.
        self.tasks.lock().unwrap_or_else(|e| e.into_inner()).take();
        let rx = self.tasks_done.lock().await.take();
        if let Some(mut rx) = rx {
            if tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .is_err()
            {
                tracing::warn!(module = NAME, "component streams still closing after 5 s");
            }
        }
    }
}

/// The service at one component's domain: stanzas for it go to its
/// connection, on this node or the node it is connected to.
struct ComponentService {
    hub: Arc<Hub>,
    slot: Arc<Slot>,
}

#[async_trait]
impl Service for ComponentService {
    async fn handle(&self, env: &Env, stanza: Stanza) {
        self.dispatch(env, stanza, true).await
    }

    async fn handle_placed(&self, env: &Env, stanza: Stanza) {
        self.dispatch(env, stanza, false).await
    }
}

impl ComponentService {
    /// Queues `stanza` for the component's connection here; else hands it
    /// to the node the registry says it is connected to (`may_forward`:
    /// not for a stanza another node placed here); else answers for it.
    async fn dispatch(&self, env: &Env, stanza: Stanza, may_forward: bool) {
        let stanza = match self.slot.local() {
            Some(h) => match h.try_send(SessionMsg::Stanza(Box::new(stanza))) {
                Ok(()) => return,
                Err((SessionSendError::Full, SessionMsg::Stanza(s))) => {
                    env.metrics.mailbox_full.inc();
                    if let Some(suppressed) = h.full_warning() {
                        tracing::warn!(module = NAME, domain = %self.slot.domain, suppressed,
                            "component mailbox full; bouncing");
                    }
                    return bounce(
                        env,
                        &s,
                        StanzaError::new(StanzaErrorCondition::ResourceConstraint)
                            .with_text("the component is not reading its stanzas fast enough"),
                    )
                    .await;
                }
                Err((_, SessionMsg::Stanza(s))) => *s,
                Err(_) => return,
            },
            None => stanza,
        };
        if may_forward {
            if let Some(e) = env.sessions.get(&self.slot.jid) {
                if e.session.node != self.hub.node {
                    return env.router.to_service_on(env, e.session.node, stanza).await;
                }
            }
        }
        not_connected(env, &self.slot.domain, stanza).await
    }
}

/// Routes the error reply to `stanza` (never to an error).
async fn bounce(env: &Env, stanza: &Stanza, err: StanzaError) {
    if let Some(reply) = stanza.error_reply(err) {
        if reply.to().is_some() {
            env.route(reply).await;
        }
    }
}

/// A stanza for a component that is not connected: iq requests and
/// messages get `service-unavailable` (RFC 6120 §10.4.3 for a service
/// that is not there), presence and iq results are dropped.
async fn not_connected(env: &Env, domain: &str, stanza: Stanza) {
    let answer = match stanza.kind() {
        StanzaKind::Presence => false,
        StanzaKind::Iq => stanza.is_iq_request(),
        StanzaKind::Message => !stanza.is_error(),
    };
    if answer {
        let err = StanzaError::new(StanzaErrorCondition::ServiceUnavailable)
            .with_text(format!("the component {domain} is not connected"));
        bounce(env, &stanza, err).await;
    }
}

/// Our stream header (XEP-0114 §3, `jabber:component:accept`): `from` the
/// component's domain (none when its header named no domain we serve), no
/// `version`.
fn stream_header(id: &str, from: Option<&str>) -> String {
    // A configured domain; escaped all the same.
    let from = from
        .map(|f| {
            let f = f
                .replace('&', "&amp;")
                .replace('\'', "&apos;")
                .replace('<', "&lt;");
            format!(" from='{f}'")
        })
        .unwrap_or_default();
    format!(
        "<?xml version='1.0'?><stream:stream \
         xmlns:stream='http://etherx.jabber.org/streams' \
         xmlns='jabber:component:accept' id='{id}'{from}>"
    )
}

/// Accepts component connections until shutdown (`crate::listen`).
async fn accept_loop(hub: Arc<Hub>, listener: TcpListener, tasks: mpsc::Sender<()>) {
    let stop = hub.stop.subscribe();
    let keepalive = Some(Duration::from_secs(60));
    crate::listen::accept_loop(listener, NAME, &hub.door, keepalive, Some(stop), |conn| {
        // Over a limit the connection was closed at once, counted and
        // logged by the gate.
        let Ok(conn) = conn else { return };
        let Some(env) = hub.env.get().and_then(Weak::upgrade) else {
            return;
        };
        tokio::spawn(run(
            hub.clone(),
            env,
            conn.tcp,
            conn.peer,
            conn.ticket,
            tasks.clone(),
        ));
    })
    .await
}

/// How a component stream ends.
#[derive(Debug)]
enum Exit {
    /// With this stream error.
    Error(StreamError),
    /// The component closed its stream: ours is closed too.
    Closed,
    /// The connection is gone (closed, failed, or a write timed out).
    Io(IoEnd),
}

impl Exit {
    fn error(c: StreamErrorCondition, text: impl Into<String>) -> Exit {
        Exit::Error(StreamError::with_text(c, text))
    }

    /// The `reason` of the "component disconnected" log line.
    fn reason(&self) -> String {
        match self {
            Exit::Error(e) => e.condition.as_str().to_owned(),
            Exit::Closed => "closed by the component".into(),
            Exit::Io(IoEnd::WriteTimeout) => "write timeout: the component stopped reading".into(),
            Exit::Io(end) => format!("{end:?}"),
        }
    }
}

/// One component connection: its task owns the socket.
struct Link {
    hub: Arc<Hub>,
    env: Arc<Env>,
    conn: Connection,
    peer: SocketAddr,
    stream_id: String,
    /// The component named by the stream header.
    slot: Option<Arc<Slot>>,
    /// After a successful handshake: its registry id and its mailbox.
    live: Option<(u64, Mailbox)>,
}

/// What woke the connection task.
enum Wake {
    Stop,
    NegotiationTimeout,
    Mail(SessionMsg),
    Read(Result<(), IoEnd>),
    Governor,
}

/// Runs one component connection to its end.
async fn run(
    hub: Arc<Hub>,
    env: Arc<Env>,
    tcp: TcpStream,
    peer: SocketAddr,
    _ticket: Ticket,
    _task: mpsc::Sender<()>,
) {
    let conn = Connection::Stream(XmlStream::new(
        Transport::Plain(tcp),
        hub.limits,
        hub.read_limits,
    ));
    let mut stop = hub.stop.subscribe();
    let mut link = Box::new(Link {
        hub,
        env,
        conn,
        peer,
        stream_id: random_id(16),
        slot: None,
        live: None,
    });
    tracing::debug!(module = NAME, %peer, "component connection");
    let exit = link.serve(&mut stop).await;
    link.finish(exit).await;
}

impl Link {
    async fn serve(&mut self, stop: &mut watch::Receiver<bool>) -> Exit {
        let negotiation_deadline = Instant::now() + self.hub.negotiation_timeout;
        loop {
            // Everything read so far, in order.
            loop {
                match self.conn.next_event() {
                    Err(e) => return Exit::Error(e),
                    Ok(None) => break,
                    Ok(Some(ev)) => {
                        if let Err(exit) = self.on_event(ev).await {
                            return exit;
                        }
                    }
                }
            }
            if let Err(end) = self.conn.flush(self.hub.write_timeout).await {
                return Exit::Io(end);
            }
            let governor = self.conn.deadline().map(Instant::from_std);
            let can_read = self.conn.can_read();
            let wake = {
                let mail = async {
                    match &self.live {
                        Some((_, mb)) => mb.recv().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => Wake::Stop,
                    _ = sleep_until(negotiation_deadline), if self.live.is_none() => Wake::NegotiationTimeout,
                    m = mail => Wake::Mail(m),
                    r = self.conn.read(), if can_read => Wake::Read(r),
                    _ = sleep_until(governor.unwrap_or(negotiation_deadline)), if governor.is_some() => Wake::Governor,
                }
            };
            match wake {
                Wake::Stop => {
                    return Exit::error(
                        StreamErrorCondition::SystemShutdown,
                        "the server is shutting down",
                    )
                }
                Wake::NegotiationTimeout => {
                    return Exit::error(
                        StreamErrorCondition::ConnectionTimeout,
                        format!(
                            "no successful handshake within {} s",
                            self.hub.negotiation_timeout.as_secs()
                        ),
                    )
                }
                Wake::Mail(m) => {
                    if let Err(exit) = self.on_mail(m) {
                        return exit;
                    }
                    // Whatever else waits goes out with the same flush.
                    for _ in 1..WRITE_BATCH {
                        let Some(m) = self.live.as_ref().and_then(|(_, mb)| mb.try_recv()) else {
                            break;
                        };
                        if let Err(exit) = self.on_mail(m) {
                            return exit;
                        }
                    }
                }
                Wake::Read(Err(end)) => return Exit::Io(end),
                Wake::Read(Ok(())) => {}
                Wake::Governor => self.conn.on_deadline(std::time::Instant::now()),
            }
        }
    }

    async fn on_event(&mut self, ev: Inbound) -> Result<(), Exit> {
        match ev {
            Inbound::Open(h) => self.on_header(&h),
            Inbound::Close => Err(Exit::Closed),
            Inbound::Element(el) if el.is("error", ns::STREAMS) => {
                let domain = self.slot.as_ref().map(|s| &s.domain);
                let error = el.to_string_in(ns::STREAMS);
                if self.live.is_some() {
                    tracing::info!(module = NAME, peer = %self.peer, domain = ?domain, error = %error, "the component sent a stream error");
                } else {
                    starling_core::log_throttled!(info, module = NAME, peer = %self.peer, domain = ?domain, error = %error, "the component sent a stream error");
                }
                Err(Exit::Closed)
            }
            Inbound::Element(el) if self.live.is_none() => self.on_handshake(el).await,
            Inbound::Element(el) => self.on_stanza(el).await,
        }
    }

    /// XEP-0114 §3: the component's stream header names its domain.
    fn on_header(&mut self, h: &StreamHeader) -> Result<(), Exit> {
        let to = h.attr("to");
        let slot = to
            .and_then(normalized_domain)
            .and_then(|d| self.hub.slot(&d).cloned());
        // Our header whatever the outcome (RFC 6120 §4.9.1.2, XEP-0114 §3).
        let header = stream_header(&self.stream_id, slot.as_ref().map(|s| s.domain.as_str()));
        self.conn.open_stream_with(header.as_bytes());
        if h.default_ns.as_deref() != Some(NS_COMPONENT_ACCEPT) {
            return Err(Exit::error(
                StreamErrorCondition::InvalidNamespace,
                "a component stream's default namespace is jabber:component:accept",
            ));
        }
        let Some(to) = to else {
            return Err(Exit::error(
                StreamErrorCondition::ImproperAddressing,
                "the stream header needs a 'to' naming the component's domain",
            ));
        };
        let Some(slot) = slot else {
            return Err(Exit::error(
                StreamErrorCondition::HostUnknown,
                format!("{to} is not a configured component"),
            ));
        };
        self.slot = Some(slot);
        Ok(())
    }

    /// XEP-0114 §3: `<handshake>` with hex(SHA-1(stream id + secret)).
    async fn on_handshake(&mut self, el: Element) -> Result<(), Exit> {
        let slot = self.slot.clone().ok_or_else(|| {
            Exit::error(StreamErrorCondition::NotAuthorized, "stream header first")
        })?;
        if !el.is("handshake", NS_COMPONENT_ACCEPT) {
            return Err(Exit::error(
                StreamErrorCondition::NotAuthorized,
                "authenticate with <handshake/> first",
            ));
        }
        let supplied = el.text();
        let matches = el.children().next().is_none()
            && slot
                .secret
                .as_deref()
                .is_some_and(|s| handshake_matches(&self.stream_id, s, &supplied));
        if !matches {
            return Err(Exit::error(
                StreamErrorCondition::NotAuthorized,
                "the handshake does not match the secret",
            ));
        }
        // Prosody's default (kick_new): the connected component stays and
        // the newcomer is refused — after its handshake, so only a holder
        // of the secret learns that the component is connected.
        let id = self.hub.next_id.fetch_add(1, Ordering::Relaxed);
        let (handle, mb) = mailbox(id, self.hub.mailbox_size, self.hub.mailbox_bytes);
        {
            let mut local = slot.local.lock().unwrap_or_else(|e| e.into_inner());
            if local.is_some() {
                return Err(Exit::error(
                    StreamErrorCondition::Conflict,
                    format!("the component {} is already connected", slot.domain),
                ));
            }
            if let Some(e) = self.env.sessions.get(&slot.jid) {
                if e.session.node != self.hub.node {
                    return Err(Exit::error(
                        StreamErrorCondition::Conflict,
                        format!(
                            "the component {} is already connected (to cluster node {})",
                            slot.domain, e.session.node
                        ),
                    ));
                }
            }
            *local = Some(handle.clone());
        }
        // The registry entry: the conflict check above on every node, and
        // where the other nodes send its stanzas.
        // One JID per component: the per-account resource limit is moot.
        let _ = self
            .env
            .router
            .bind(&self.env, &slot.jid, handle, usize::MAX)
            .await;
        self.live = Some((id, mb));
        self.hub.metrics.connected.inc();
        self.conn
            .send(&Element::new("handshake", NS_COMPONENT_ACCEPT));
        tracing::info!(module = NAME, domain = %slot.domain, peer = %self.peer, session = id, "component connected");
        Ok(())
    }

    /// XEP-0114 §3: a stanza from the authenticated component.
    async fn on_stanza(&mut self, mut el: Element) -> Result<(), Exit> {
        let slot = self
            .slot
            .clone()
            .expect("authenticated: the header named it");
        if el.ns() != NS_COMPONENT_ACCEPT || !matches!(el.name(), "message" | "presence" | "iq") {
            if el.is("handshake", NS_COMPONENT_ACCEPT) {
                return Ok(()); // a second one: nothing to do
            }
            return Err(Exit::error(
                StreamErrorCondition::UnsupportedStanzaType,
                format!("unknown element {{{}}}{}", el.ns(), el.name()),
            ));
        }
        self.hub.metrics.stanzas_in.inc();
        // 'from' is required and in the component's domain; it may name
        // any JID there.
        let from = match el.attr("from").map(Jid::new) {
            None => {
                return Err(Exit::error(
                    StreamErrorCondition::ImproperAddressing,
                    "stanzas from a component need a 'from' (XEP-0114 §3)",
                ))
            }
            Some(Err(e)) => {
                return Err(Exit::error(
                    StreamErrorCondition::ImproperAddressing,
                    format!("malformed 'from': {e}"),
                ))
            }
            Some(Ok(j)) => j,
        };
        if from.domain().as_str() != slot.domain {
            return Err(Exit::error(
                StreamErrorCondition::InvalidFrom,
                format!("{from} is not in the component's domain {}", slot.domain),
            ));
        }
        to_client_ns(&mut el);
        let (name, id, ty) = (
            el.name().to_owned(),
            el.attr("id").map(str::to_owned),
            el.attr("type").map(str::to_owned),
        );
        if el.attr("to").is_none() {
            // As Prosody does: answered, the stream goes on.
            self.error_to_component(
                &name,
                id.as_deref(),
                ty.as_deref(),
                &from,
                StanzaError::new(StanzaErrorCondition::BadRequest)
                    .with_text("stanzas from a component need a 'to' (XEP-0114 §3)"),
            );
            return Ok(());
        }
        let stanza = match Stanza::from_element(el) {
            Ok(s) => s,
            Err(StanzaParseError::MalformedTo(why)) => {
                self.error_to_component(
                    &name,
                    id.as_deref(),
                    ty.as_deref(),
                    &from,
                    StanzaError::new(StanzaErrorCondition::JidMalformed).with_text(why),
                );
                return Ok(());
            }
            Err(StanzaParseError::BadIq) => {
                self.error_to_component(
                    &name,
                    id.as_deref(),
                    ty.as_deref(),
                    &from,
                    StanzaError::new(StanzaErrorCondition::BadRequest)
                        .with_text("an iq needs an id and a type of get, set, result or error"),
                );
                return Ok(());
            }
            Err(e) => {
                return Err(Exit::error(
                    StreamErrorCondition::ImproperAddressing,
                    e.to_string(),
                ))
            }
        };
        self.env.metrics.stanza_in(stanza.kind());
        self.env.route(stanza).await;
        Ok(())
    }

    /// Writes an error about a stanza that could not be routed back to
    /// the component (from the server's first domain), unless it was an
    /// error or an iq result.
    fn error_to_component(
        &mut self,
        name: &str,
        id: Option<&str>,
        ty: Option<&str>,
        to: &Jid,
        err: StanzaError,
    ) {
        if ty == Some("error") || (name == "iq" && ty == Some("result")) {
            return;
        }
        let mut reply = Element::new(name, ns::CLIENT);
        reply.set_attr("type", "error");
        if let Some(id) = id {
            reply.set_attr("id", id);
        }
        reply.set_attr("to", to.as_str());
        if let Some(server) = self.env.hosts.list().into_iter().next() {
            reply.set_attr("from", server);
        }
        reply.append_child(err.to_element());
        self.conn.send(&reply);
    }

    /// A message of the component's mailbox.
    fn on_mail(&mut self, msg: SessionMsg) -> Result<(), Exit> {
        match msg {
            SessionMsg::Stanza(s) => {
                self.conn.send_stanza(&s);
                self.hub.metrics.stanzas_out.inc();
                self.env.metrics.stanza_out(s.kind());
                Ok(())
            }
            // The registry settled two connections of one domain on two
            // nodes at once: this one lost.
            SessionMsg::Close(CloseReason::Replaced) => Err(Exit::error(
                StreamErrorCondition::Conflict,
                "another connection of this component replaced this one",
            )),
            SessionMsg::Close(CloseReason::Error(e)) => Err(Exit::Error(*e)),
            SessionMsg::Attach(_) | SessionMsg::Notify(_) => Ok(()),
        }
    }

    /// Leaves the registry (first: once the component sees its stream
    /// close, the domain is free for its next connection), closes the
    /// stream as `exit` says, and answers for what was still queued.
    async fn finish(mut self: Box<Self>, exit: Exit) {
        let close_timeout = self.hub.write_timeout.min(Duration::from_secs(5));
        let domain = self.slot.as_ref().map(|s| s.domain.clone());
        let was_live = self.live.is_some();
        let mut queued = None;
        if let (Some((id, mb)), Some(slot)) = (self.live.take(), self.slot.clone()) {
            {
                let mut local = slot.local.lock().unwrap_or_else(|e| e.into_inner());
                if local.as_ref().is_some_and(|h| h.id == id) {
                    *local = None;
                }
            }
            mb.close();
            self.env.sessions.unregister(&slot.jid, id);
            self.hub.metrics.connected.dec();
            tracing::info!(module = NAME, domain = %slot.domain, peer = %self.peer, session = id, reason = %exit.reason(), "component disconnected");
            queued = Some((slot, mb));
        }
        match &exit {
            Exit::Error(e) => {
                let header = stream_header(&self.stream_id, domain.as_deref());
                self.conn.open_stream_with(header.as_bytes());
                self.env.metrics.stream_errors.inc();
                if !was_live {
                    self.hub.metrics.refused.inc();
                }
                let text = e.text.as_deref().unwrap_or("");
                if was_live {
                    tracing::info!(module = NAME, peer = %self.peer, domain = ?domain,
                        condition = %e.condition, text, "closing component stream with error");
                } else {
                    // Before the handshake anyone who reaches the port
                    // can cause it: throttled, counted by the metric.
                    starling_core::log_throttled!(info, module = NAME, peer = %self.peer, domain = ?domain,
                        condition = %e.condition, text, "closing component stream with error");
                }
                self.conn.close(Closing::Error(e), close_timeout).await;
            }
            Exit::Closed => self.conn.close(Closing::Close, close_timeout).await,
            Exit::Io(_) => self.conn.discard_output(),
        }
        if let Some((slot, mb)) = queued {
            while let Some(msg) = mb.try_recv() {
                if let SessionMsg::Stanza(s) = msg {
                    not_connected(&self.env, &slot.domain, *s).await;
                }
            }
        }
    }
}

/// Moves the elements of `jabber:component:accept` in `el` (the stanza and
/// its core children: body, subject, thread, error…) to `jabber:client`,
/// the namespace the rest of the server reads stanzas in. Elements of
/// other namespaces (payloads, a forwarded `jabber:client` message) stay
/// as they are. The way out needs no such step: a `jabber:client` element
/// written into the component's stream carries no `xmlns` and so takes
/// the stream's default namespace.
fn to_client_ns(el: &mut Element) {
    if el.ns() == NS_COMPONENT_ACCEPT {
        let mut moved = Element::new(el.name(), ns::CLIENT);
        for (k, v) in el.attrs() {
            moved.set_attr(k, v);
        }
        *moved.nodes_mut() = std::mem::take(el.nodes_mut());
        *el = moved;
    }
    for n in el.nodes_mut() {
        if let Node::Element(child) = n {
            to_client_ns(child);
        }
    }
}

/// XEP-0114 §3: the handshake is the lowercase hex SHA-1 of the stream id
/// followed by the secret; compared in constant time (upper-case hex is
/// accepted, surrounding whitespace ignored).
fn handshake_matches(stream_id: &str, secret: &str, supplied: &str) -> bool {
    use sha1::Digest as _;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = sha1::Sha1::digest(format!("{stream_id}{secret}").as_bytes());
    let mut expected = [0u8; 40];
    for (i, b) in digest.iter().enumerate() {
        expected[2 * i] = HEX[usize::from(b >> 4)];
        expected[2 * i + 1] = HEX[usize::from(b & 0xf)];
    }
    let supplied = supplied.trim().to_ascii_lowercase();
    constant_time_eq(&expected, supplied.as_bytes())
}

/// Equal slices, in time that depends only on their lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// XEP-0114 §3's algorithm: hex SHA-1 of the id, then the secret.
    #[test]
    fn component_handshake_is_lowercase_hex_sha1_of_id_and_secret() {
        use sha1::Digest as _;
        let hex: String = sha1::Sha1::digest(b"abcsecret")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert!(handshake_matches("abc", "secret", &hex));
        assert!(handshake_matches("abc", "secret", &hex.to_uppercase()));
        assert!(handshake_matches("abc", "secret", &format!(" {hex}\n")));
        assert!(!handshake_matches("abd", "secret", &hex));
        assert!(!handshake_matches("abc", "secreT", &hex));
        assert!(!handshake_matches("abc", "secret", &hex[..39]));
        assert!(!handshake_matches("abc", "secret", ""));
    }

    #[test]
    fn component_elements_move_to_jabber_client_but_payloads_stay() {
        let mut m = Element::builder("message", NS_COMPONENT_ACCEPT)
            .attr("to", "a@b")
            .append(
                Element::builder("body", NS_COMPONENT_ACCEPT)
                    .text("hi")
                    .build(),
            )
            .append(
                Element::builder("forwarded", "urn:xmpp:forward:0")
                    .append(Element::new("message", ns::CLIENT))
                    .build(),
            )
            .build();
        to_client_ns(&mut m);
        assert!(m.is("message", ns::CLIENT));
        assert_eq!(m.attr("to"), Some("a@b"));
        assert_eq!(
            m.get_child("body", ns::CLIENT).map(|b| b.text()),
            Some("hi".into())
        );
        let fwd = m.get_child("forwarded", "urn:xmpp:forward:0").unwrap();
        assert!(fwd.has_child("message", ns::CLIENT));
        // Written into the component's stream: no xmlns on jabber:client.
        let out = m.to_string_in(ns::CLIENT);
        assert!(
            out.starts_with("<message to='a@b'><body>hi</body>"),
            "{out}"
        );
    }
}
