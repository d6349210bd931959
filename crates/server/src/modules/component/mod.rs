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
//!
//! Files: this one the configuration, the module, the hub of connections
//! and the service per domain; `link.rs` one connection (accept loop,
//! header, handshake, the connection task).

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

mod link;

use link::accept_loop;

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
