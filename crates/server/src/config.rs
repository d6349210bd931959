//! Configuration: one TOML file, every key optional, every key documented in
//! `docs/configuration.md`. With no file at all Starling serves `localhost`
//! from `./data` on ports 5222 (STARTTLS) and 5223 (direct TLS).
//!
//! Unknown keys are errors (a typo must not silently fall back to a
//! default); `starling check-config FILE` reports them with line and column.

pub use crate::modules::ModulesSection;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The whole configuration file.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `[server]`
    pub server: ServerSection,
    /// `[log]`
    pub log: LogSection,
    /// `[tls]`
    pub tls: TlsSection,
    /// `[[listen]]`
    pub listen: Vec<Listener>,
    /// `[http]`: WebSocket and host-meta listeners
    pub http: HttpSection,
    /// `[c2s]`
    pub c2s: C2sSection,
    /// `[auth]`
    pub auth: AuthSection,
    /// `[storage]`
    pub storage: StorageSection,
    /// `[cluster]`: several nodes on one NATS bus (unset: one node).
    pub cluster: ClusterSection,
    /// `[admin]`: the admin API, metrics and health listener.
    pub admin: AdminSection,
    /// `[modules.*]`: one table per module, each documented beside its
    /// module (`crate::modules`).
    pub modules: ModulesSection,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            server: ServerSection::default(),
            log: LogSection::default(),
            tls: TlsSection::default(),
            listen: vec![
                Listener {
                    address: "[::]:5222".parse().expect("literal address"),
                    tls: TlsMode::Starttls,
                },
                Listener {
                    address: "[::]:5223".parse().expect("literal address"),
                    tls: TlsMode::Direct,
                },
            ],
            http: HttpSection::default(),
            c2s: C2sSection::default(),
            auth: AuthSection::default(),
            cluster: ClusterSection::default(),
            admin: AdminSection::default(),
            storage: StorageSection::default(),
            modules: ModulesSection::default(),
        }
    }
}

/// `[server]`: identity and data location.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSection {
    /// XMPP domains served by this deployment.
    pub domains: Vec<String>,
    /// Directory for the database, generated certificates and other state.
    pub data_dir: PathBuf,
    /// Seconds to wait for sessions to close on shutdown before going on
    /// to drain storage queues anyway.
    pub shutdown_timeout_secs: u64,
    /// Seconds to wait, after the sessions closed, for the write-behind
    /// queues (archive, inbox) to be written before storage is closed; past
    /// it, shutdown logs how many records each queue could not write.
    pub drain_timeout_secs: u64,
    /// Simultaneous client connections (c2s TCP/TLS, HTTP connections
    /// counted from accept, BOSH sessions); beyond it new connections are
    /// closed right after accept (`transport::gate`).
    pub max_connections: usize,
    /// Connections one source (an IPv4 address or an IPv6 /64) may hold on
    /// each listener's gate; more are closed right after accept. 0: no
    /// limit.
    pub max_connections_per_ip: usize,
    /// Whether `max_connections_per_ip` applies to loopback addresses too
    /// (off: a TLS-terminating proxy or web chat on this machine brings
    /// every client from one loopback address).
    pub per_ip_limit_loopback: bool,
    /// This node's number (0-255), part of every archive id it assigns;
    /// give each node of a cluster its own so ids stay unique across the
    /// deployment.
    pub node_id: u8,
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            domains: vec!["localhost".into()],
            data_dir: PathBuf::from("./data"),
            shutdown_timeout_secs: 10,
            drain_timeout_secs: 120,
            max_connections: 100_000,
            max_connections_per_ip: 100,
            per_ip_limit_loopback: false,
            node_id: 0,
        }
    }
}

/// `[log]`
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSection {
    /// A `tracing` filter such as `info` or `info,starling_server::c2s=debug`.
    /// The `RUST_LOG` environment variable overrides it.
    pub level: String,
    /// `text` (one human-readable line per event, coloured only when
    /// standard error is a terminal) or `json` (one JSON object per line,
    /// for log shippers).
    pub format: LogFormat,
}

impl Default for LogSection {
    fn default() -> Self {
        LogSection {
            level: "info".into(),
            format: LogFormat::Text,
        }
    }
}

/// How log lines are written to standard error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// `2026-01-31T12:00:00Z  INFO target: message key=value …`.
    #[default]
    Text,
    /// `{"timestamp":…,"level":"INFO","message":…,"key":value,…,"target":…}`.
    Json,
}

/// `[tls]`
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSection {
    /// PEM certificate chain. Unset: a self-signed certificate for the
    /// configured domains is generated under `data_dir/tls/` on first start
    /// and reused afterwards.
    pub certificate: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub private_key: Option<PathBuf>,
}

/// `[http]`: HTTP listeners for XMPP over WebSocket (RFC 7395, path
/// `/xmpp-websocket`) and XEP-0156 discovery (`/.well-known/host-meta`).
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSection {
    /// The listeners (`[[http.listen]]`); empty for none.
    pub listen: Vec<HttpListener>,
    /// Plain (`ws:`) connections from loopback addresses count as
    /// encrypted for `[c2s] require_tls`: a browser on this machine, or a
    /// TLS-terminating proxy in front of Starling.
    pub secure_loopback: bool,
    /// Serve the Converse.js web chat at `/`, configured for the first
    /// domain and this listener's WebSocket.
    pub web_client: bool,
    /// Where Converse.js's `dist` directory is (installed by
    /// `scripts/fetch-webclient.sh`), relative to the working directory
    /// unless absolute.
    pub web_client_dir: PathBuf,
    /// Seconds a connection may take, from when it starts waiting for a
    /// request (its accept or TLS handshake, or the previous response),
    /// to the end of the request's head; past it the connection is closed.
    pub request_head_timeout_secs: u64,
    /// Seconds a connection may stay idle between requests (after its
    /// first) before it is closed.
    pub keepalive_timeout_secs: u64,
    /// Seconds a request body may send no byte while it is being read;
    /// past it the request fails and its connection is closed.
    pub body_timeout_secs: u64,
    /// Bytes per second a request body must average (over the time spent
    /// waiting for it) once `body_timeout_secs` have passed; slower ones
    /// fail like a stalled body. 0: no minimum.
    pub body_min_bytes_per_sec: u64,
}

impl Default for HttpSection {
    fn default() -> Self {
        HttpSection {
            listen: vec![
                HttpListener {
                    address: "[::]:5280".parse().expect("literal address"),
                    tls: false,
                },
                HttpListener {
                    address: "[::]:5443".parse().expect("literal address"),
                    tls: true,
                },
            ],
            secure_loopback: true,
            web_client: true,
            web_client_dir: PathBuf::from("web/node_modules/converse.js/dist"),
            request_head_timeout_secs: 20,
            keepalive_timeout_secs: 15,
            body_timeout_secs: 30,
            body_min_bytes_per_sec: 500,
        }
    }
}

/// `[[http.listen]]`: one HTTP listener.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpListener {
    /// IP address and port.
    #[serde(deserialize_with = "socket_addr")]
    pub address: SocketAddr,
    /// HTTPS with the server's certificate (`wss:`) when true.
    #[serde(default)]
    pub tls: bool,
}

/// How a listener secures its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// Plain TCP, upgraded with STARTTLS (RFC 6120 §5).
    Starttls,
    /// TLS from the first byte (XEP-0368).
    Direct,
}

/// `[[listen]]`: one client listener.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listener {
    /// Address and port to bind: an IP address, never a host name.
    #[serde(deserialize_with = "socket_addr")]
    pub address: SocketAddr,
    /// `starttls` or `direct`.
    pub tls: TlsMode,
}

/// An `IP:port` string, with a message that shows the syntax when it is not.
fn socket_addr<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(|_| {
        serde::de::Error::custom(format!(
            "{s:?} is not an IP address and port (host names are not resolved); \
             write e.g. \"127.0.0.1:5222\" (IPv4 loopback), \"0.0.0.0:5222\" (all IPv4 \
             addresses) or \"[::]:5222\" (all addresses, IPv6 and IPv4)"
        ))
    })
}

/// A list of `IP:port` strings (see [`socket_addr`]).
fn socket_addrs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<SocketAddr>, D::Error> {
    #[derive(Deserialize)]
    struct One(#[serde(deserialize_with = "socket_addr")] SocketAddr);
    let v: Vec<One> = Vec::deserialize(d)?;
    Ok(v.into_iter().map(|One(a)| a).collect())
}

/// `[c2s]`: client stream limits and policies.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct C2sSection {
    /// Require STARTTLS before authentication. Set to false only for
    /// benchmarks on loopback: it allows SCRAM over plain TCP.
    pub require_tls: bool,
    /// Largest stanza accepted, in bytes (RFC 6120 §13.12). Larger ones
    /// close the stream with `<policy-violation/>`.
    pub max_stanza_bytes: usize,
    /// Largest element, WebSocket message or BOSH request body accepted
    /// before the client has authenticated. Larger ones close the
    /// connection with `<policy-violation/>`. Keeps what an
    /// unauthenticated connection can make the server hold small. Never
    /// more than `max_stanza_bytes` applies.
    pub max_preauth_stanza_bytes: usize,
    /// Deepest element nesting accepted inside a stanza.
    pub max_depth: usize,
    /// Most attributes accepted on one element.
    pub max_attributes: usize,
    /// Seconds a connection may take to authenticate and bind a resource
    /// before it is closed with `<connection-timeout/>`.
    pub negotiation_timeout_secs: u64,
    /// Failed SASL attempts allowed on one stream before it is closed with
    /// `<policy-violation/>` (RFC 6120 §6.4.5 asks for 2 to 5).
    pub max_auth_attempts: u32,
    /// Stanzas queued for one session before senders get
    /// `<resource-constraint/>`.
    pub mailbox_size: usize,
    /// Bytes of stanzas queued for one session (their parsed size) before
    /// senders get `<resource-constraint/>`, whatever `mailbox_size`
    /// says: bounds what a client that stops reading holds in memory. A
    /// single stanza is always taken by an empty mailbox.
    pub mailbox_bytes: usize,
    /// Bytes queued for a BOSH client between its requests, and the most
    /// one response carries (a larger single element goes alone). Past
    /// it the session stops taking stanzas from its mailbox, so senders
    /// get `<resource-constraint/>` once `mailbox_size` more are waiting.
    pub bosh_max_pending_bytes: usize,
    /// Resources (sessions) one account may have bound at once, across
    /// the cluster. A bind beyond it closes the account's longest-detached
    /// stream-management session, or with none detached is refused with
    /// `<resource-constraint/>` (RFC 6120 §7.6.2.1). Bounds each account's
    /// presence fan-out (own resources × contacts).
    pub max_resources_per_account: usize,
    /// Seconds a write to a client may block before the session is dropped.
    pub write_timeout_secs: u64,
    /// Seconds of TCP idleness before the kernel sends keepalive probes
    /// (0 disables TCP keepalive).
    pub tcp_keepalive_secs: u64,
    /// Sustained bytes per second read from one client; faster senders are
    /// throttled (reads pause), not disconnected. 0 disables the limit.
    pub max_bytes_per_second: u64,
    /// Seconds without input after which a session frees its XML parser
    /// state (~1.7 KB); the next input re-primes it in microseconds.
    /// 0 disables.
    pub hibernate_after_secs: u64,
}

impl Default for C2sSection {
    fn default() -> Self {
        C2sSection {
            require_tls: true,
            max_stanza_bytes: 256 * 1024,
            max_preauth_stanza_bytes: 16 * 1024,
            max_depth: 64,
            max_attributes: 64,
            negotiation_timeout_secs: 30,
            max_auth_attempts: 3,
            mailbox_size: 1024,
            mailbox_bytes: 8 * 1024 * 1024,
            bosh_max_pending_bytes: 1024 * 1024,
            max_resources_per_account: 10,
            write_timeout_secs: 30,
            tcp_keepalive_secs: 60,
            max_bytes_per_second: 1024 * 1024,
            hibernate_after_secs: 5,
        }
    }
}

/// `[auth]`
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSection {
    /// SASL mechanisms offered, by name. PLAIN is never offered without TLS;
    /// -PLUS variants only when a channel binding is available.
    pub mechanisms: Vec<String>,
    /// PBKDF2 iterations for newly stored SCRAM keys (RFC 7677 asks for at
    /// least 4096).
    pub scram_iterations: u32,
    /// Failed authentications allowed from one IP address within
    /// `failure_window_secs`; beyond, attempts from that address are refused
    /// with `<temporary-auth-failure/>` until the window passes.
    pub max_failures_per_ip: u32,
    /// Length of the per-IP failure window, in seconds.
    pub failure_window_secs: u64,
    /// Lifetime of XEP-0484 FAST tokens, in days (0: FAST is not offered).
    /// A token is replaced after half of it; the key they derive from is
    /// `data_dir/fast.key`.
    pub fast_token_days: u32,
    /// Accounts whose SCRAM credentials and disabled state are kept in
    /// memory after their first authentication, so that logins and
    /// stream resumptions do not read them from storage (about 0.4 KiB
    /// each, measured; 0: no cache). Bounded like ejabberd's auth cache
    /// (1,000 by default there): raise it towards the number of accounts
    /// that reconnect at once after a network outage. A password change,
    /// ban or deletion made anywhere — this node, another node, the
    /// offline CLI — reaches every node's cache within 2 s.
    pub cache_accounts: usize,
}

impl Default for AuthSection {
    fn default() -> Self {
        AuthSection {
            mechanisms: [
                "SCRAM-SHA-512-PLUS",
                "SCRAM-SHA-512",
                "SCRAM-SHA-256-PLUS",
                "SCRAM-SHA-256",
                "SCRAM-SHA-1-PLUS",
                "SCRAM-SHA-1",
                "PLAIN",
            ]
            .map(String::from)
            .to_vec(),
            scram_iterations: 4096,
            max_failures_per_ip: 20,
            failure_window_secs: 60,
            fast_token_days: 14,
            cache_accounts: 10_000,
        }
    }
}

/// `[storage]`
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageSection {
    /// `sqlite` (embedded, the default) or `postgres`.
    pub backend: String,
    /// SQLite database file; relative paths are under `data_dir`.
    pub path: PathBuf,
    /// PostgreSQL URL, `postgres://user[:password]@host[:port]/database`;
    /// when unset, the `STARLING_DATABASE_URL` environment variable.
    pub url: Option<String>,
    /// Database connections in the pool (SQLite: for reads; writes have
    /// one connection of their own).
    pub pool_size: u32,
}

impl Default for StorageSection {
    fn default() -> Self {
        StorageSection {
            backend: "sqlite".into(),
            path: PathBuf::from("starling.db"),
            url: None,
            pool_size: 4,
        }
    }
}

/// `[cluster]`: run this node as one of several identical nodes that share
/// a PostgreSQL database and a NATS server (docs/cluster.md). Without
/// `nats_url` the server is a single node and needs neither.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSection {
    /// The NATS server(s), e.g. `nats://10.0.0.5:4222`; several URLs
    /// separated by commas. Unset: no cluster.
    pub nats_url: Option<String>,
    /// Subject prefix on the bus: nodes with the same name form one
    /// cluster (several clusters can share a NATS server).
    pub name: String,
    /// How often a node announces itself, milliseconds.
    pub heartbeat_ms: u64,
    /// A node not heard from for this long is dead: its sessions leave the
    /// registry, their contacts get unavailable presence, and messages for
    /// them go to offline storage. Milliseconds.
    pub node_timeout_ms: u64,
    /// How long to wait for the NATS server at start, seconds.
    pub connect_timeout_secs: u64,
    /// Registry snapshots (sent to a node that joins) go in parts of about
    /// this many bytes; keep it well under the NATS server's
    /// `max_payload` (1 MiB by default).
    pub snapshot_part_bytes: usize,
    /// Most MiB of frames waiting for the bus (while NATS stalls or
    /// reconnects); beyond it frames are dropped and counted
    /// (`starling_cluster_frames_dropped_total`): kept messages are sent
    /// again once it drains, registry events are recovered by snapshots.
    pub max_queue_mib: usize,
}

impl ClusterSection {
    /// The NATS servers of `nats_url` (a comma-separated list), trimmed,
    /// empty entries dropped.
    pub fn servers(&self) -> Vec<String> {
        self.nats_url
            .as_deref()
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            nats_url: None,
            name: "starling".into(),
            heartbeat_ms: 1000,
            node_timeout_ms: 5000,
            connect_timeout_secs: 10,
            snapshot_part_bytes: 256 * 1024,
            max_queue_mib: 64,
        }
    }
}

/// `[admin]`: the admin HTTP listener (docs/admin.md): the admin API
/// under `/api/` (bearer tokens made by `starling admin token create`),
/// Prometheus metrics at `/metrics` and health checks at `/health/live`
/// and `/health/ready` (these two and the metrics need no token: keep the
/// listener on loopback or a private network).
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminSection {
    /// Addresses to listen on, plain HTTP (`IP:port`); empty turns the
    /// admin surface off. Loopback by default; any other address is
    /// allowed with a warning at start-up and in `check-config`.
    #[serde(deserialize_with = "socket_addrs")]
    pub listen: Vec<SocketAddr>,
    /// Largest request body accepted, in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Simultaneous connections to the admin listeners; more are closed
    /// right after accept.
    pub max_connections: usize,
}

impl Default for AdminSection {
    fn default() -> Self {
        AdminSection {
            listen: vec!["127.0.0.1:5290".parse().expect("literal address")],
            max_body_bytes: 64 * 1024,
            max_connections: 64,
        }
    }
}

impl AdminSection {
    /// The configured addresses that are not loopback (reachable from
    /// other machines: warned about).
    pub fn exposed(&self) -> Vec<SocketAddr> {
        self.listen
            .iter()
            .filter(|a| !a.ip().is_loopback())
            .copied()
            .collect()
    }
}

/// Environment variable holding the PostgreSQL URL when `[storage] url` is
/// unset (keeps a password out of the configuration file).
pub const DATABASE_URL_ENV: &str = "STARLING_DATABASE_URL";

/// A configuration problem, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read. (The I/O error is part of the message
    /// and deliberately not a `source`: error reports that print the chain
    /// would say it twice.)
    #[error("cannot read {path}: {error}; check the path given with --config")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// TOML syntax error, unknown key or wrong type.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line, column and the offending key.
        message: String,
    },
    /// A value is out of range or inconsistent.
    #[error("{path}: {key}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The dotted key.
        key: String,
        /// What is wrong and what to do.
        message: String,
    },
}

impl Config {
    /// Reads, parses and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_owned(),
            error,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates configuration text; `path` is used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// Checks values that types alone cannot.
    pub fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            path: path.to_owned(),
            key: key.into(),
            message,
        };
        if self.server.domains.is_empty() {
            return Err(invalid(
                "server.domains",
                "at least one domain is needed, e.g. domains = [\"example.org\"]".into(),
            ));
        }
        for d in &self.server.domains {
            match starling_proto::BareJid::new(d) {
                Ok(j) if j.node().is_none() => {}
                _ => {
                    return Err(invalid(
                        "server.domains",
                        format!("{d:?} is not a valid XMPP domain"),
                    ))
                }
            }
        }
        if let Err((key, message)) = self
            .modules
            .validate(&self.server.domains, !self.http.listen.is_empty())
        {
            return Err(invalid(&key, message));
        }
        if self.admin.max_body_bytes == 0 {
            return Err(invalid(
                "admin.max_body_bytes",
                "must be at least 1 (request bodies are small JSON objects; 65536 is the default)"
                    .into(),
            ));
        }
        for (key, v) in [
            (
                "http.request_head_timeout_secs",
                self.http.request_head_timeout_secs,
            ),
            (
                "http.keepalive_timeout_secs",
                self.http.keepalive_timeout_secs,
            ),
            ("http.body_timeout_secs", self.http.body_timeout_secs),
        ] {
            if v == 0 {
                return Err(invalid(
                    key,
                    "must be at least 1: without it an idle or slow HTTP client holds its connection forever".into(),
                ));
            }
        }
        for (key, v) in [
            ("server.max_connections", self.server.max_connections),
            ("admin.max_connections", self.admin.max_connections),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be at least 1".into()));
            }
        }
        if self.cluster.nats_url.is_some() {
            if self.storage.backend != "postgres" {
                return Err(invalid(
                    "cluster.nats_url",
                    "a cluster's nodes share one database: set [storage] backend = \"postgres\" (SQLite is a single node's)".into(),
                ));
            }
            let c = &self.cluster;
            let urls = c.servers();
            if urls.is_empty() {
                return Err(invalid(
                    "cluster.nats_url",
                    "empty: give the NATS server, e.g. \"nats://10.0.0.5:4222\"".into(),
                ));
            }
            for u in &urls {
                if let Err(e) = u.parse::<async_nats::ServerAddr>() {
                    return Err(invalid(
                        "cluster.nats_url",
                        format!("{u:?} is not a NATS server address ({e}); e.g. \"nats://10.0.0.5:4222\""),
                    ));
                }
            }
            if c.name.is_empty()
                || !c
                    .name
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_')
            {
                return Err(invalid(
                    "cluster.name",
                    format!(
                        "{:?}: use letters, digits, '-' and '_' (it prefixes NATS subjects)",
                        c.name
                    ),
                ));
            }
            // A stanza crosses the bus in one NATS message (1 MiB at most
            // by default), with its routing header.
            if self.c2s.max_stanza_bytes > 768 * 1024 {
                return Err(invalid(
                    "c2s.max_stanza_bytes",
                    format!(
                        "{} bytes: in a cluster a stanza must fit one NATS message (1 MiB by default); use at most 786432",
                        self.c2s.max_stanza_bytes
                    ),
                ));
            }
            if c.heartbeat_ms == 0 || c.node_timeout_ms < 2 * c.heartbeat_ms {
                return Err(invalid(
                    "cluster.node_timeout_ms",
                    format!(
                        "{} ms with heartbeat_ms = {}: a node must miss at least two heartbeats before it is declared dead",
                        c.node_timeout_ms, c.heartbeat_ms
                    ),
                ));
            }
        }
        if self.listen.is_empty() {
            return Err(invalid(
                "listen",
                "no listener: add a [[listen]] table with address and tls".into(),
            ));
        }
        if self.tls.certificate.is_some() != self.tls.private_key.is_some() {
            return Err(invalid(
                "tls",
                "set both certificate and private_key, or neither (for a generated self-signed certificate)".into(),
            ));
        }
        for (key, p) in [
            ("tls.certificate", &self.tls.certificate),
            ("tls.private_key", &self.tls.private_key),
        ] {
            if let Some(p) = p {
                if !p.exists() {
                    return Err(invalid(key, format!("{} does not exist", p.display())));
                }
            }
        }
        if self.c2s.max_stanza_bytes < 10_000 {
            return Err(invalid(
                "c2s.max_stanza_bytes",
                "RFC 6120 §13.12 requires accepting stanzas of at least 10000 bytes".into(),
            ));
        }
        if !(1..=64).contains(&self.c2s.max_auth_attempts) {
            return Err(invalid(
                "c2s.max_auth_attempts",
                "must be between 1 and 64 (RFC 6120 §6.4.5 suggests 2 to 5)".into(),
            ));
        }
        if self.c2s.mailbox_size == 0 {
            return Err(invalid("c2s.mailbox_size", "must be at least 1".into()));
        }
        if self.c2s.mailbox_bytes < self.c2s.max_stanza_bytes {
            return Err(invalid(
                "c2s.mailbox_bytes",
                format!(
                    "{} bytes is less than c2s.max_stanza_bytes ({}): a session could queue only one stanza at a time; use at least that",
                    self.c2s.mailbox_bytes, self.c2s.max_stanza_bytes
                ),
            ));
        }
        if self.c2s.max_preauth_stanza_bytes < 4096 {
            return Err(invalid(
                "c2s.max_preauth_stanza_bytes",
                format!(
                    "{} bytes: use at least 4096 (SASL and SASL2 exchanges need a few KB)",
                    self.c2s.max_preauth_stanza_bytes
                ),
            ));
        }
        if self.c2s.bosh_max_pending_bytes < 4096 {
            return Err(invalid(
                "c2s.bosh_max_pending_bytes",
                "must be at least 4096 (a BOSH response should hold more than one small stanza)"
                    .into(),
            ));
        }
        if self.c2s.max_resources_per_account == 0 {
            return Err(invalid(
                "c2s.max_resources_per_account",
                "must be at least 1 (10 is the default)".into(),
            ));
        }
        for m in &self.auth.mechanisms {
            if starling_proto::sasl::Mechanism::from_name(m).is_none() {
                return Err(invalid(
                    "auth.mechanisms",
                    format!("unknown mechanism {m:?}; known: SCRAM-SHA-1, SCRAM-SHA-256, SCRAM-SHA-512 (each also -PLUS) and PLAIN"),
                ));
            }
        }
        if self.auth.mechanisms.is_empty() {
            return Err(invalid(
                "auth.mechanisms",
                "no mechanism: nobody could log in".into(),
            ));
        }
        if self.auth.scram_iterations < 4096 {
            return Err(invalid(
                "auth.scram_iterations",
                "must be at least 4096 (RFC 7677 §4)".into(),
            ));
        }
        match self.storage.backend.as_str() {
            // A URL with the default backend was meant for PostgreSQL: say
            // so instead of quietly serving from a new SQLite file.
            "sqlite" if self.storage.url.is_some() => {
                return Err(invalid(
                    "storage.url",
                    "is for PostgreSQL, but backend is \"sqlite\": add backend = \"postgres\" to [storage], or remove url (SQLite uses path)".into(),
                ))
            }
            "sqlite" => {}
            "postgres" => match self.database_url() {
                None => {
                    return Err(invalid(
                        "storage.url",
                        format!("backend = \"postgres\" needs url = \"postgres://USER@HOST/DATABASE\" (or the {DATABASE_URL_ENV} environment variable)"),
                    ))
                }
                Some(url) => {
                    if let Err(e) = starling_storage::postgres::connect_options(&url) {
                        return Err(invalid("storage.url", e.to_string()));
                    }
                }
            },
            other => {
                return Err(invalid(
                    "storage.backend",
                    format!("unknown backend {other:?}; use \"sqlite\" or \"postgres\""),
                ))
            }
        }
        Ok(())
    }

    /// The PostgreSQL URL: `[storage] url`, else the
    /// [`DATABASE_URL_ENV`] environment variable; `None` if neither is set.
    pub fn database_url(&self) -> Option<String> {
        self.database_url_with(|k| std::env::var(k).ok())
    }

    fn database_url_with(&self, env: impl Fn(&str) -> Option<String>) -> Option<String> {
        self.storage
            .url
            .clone()
            .or_else(|| env(DATABASE_URL_ENV))
            .filter(|u| !u.trim().is_empty())
    }

    /// What `starling_storage::open` needs for the configured backend.
    pub fn backend_config(&self) -> starling_storage::BackendConfig {
        let pool_size = self.storage.pool_size;
        match self.storage.backend.as_str() {
            "postgres" => starling_storage::BackendConfig::Postgres {
                url: self.database_url().unwrap_or_default(),
                pool_size,
            },
            _ => starling_storage::BackendConfig::Sqlite {
                path: self.database_path(),
                pool_size,
            },
        }
    }

    /// The database for messages: the SQLite file, or the PostgreSQL URL
    /// without its password.
    pub fn storage_description(&self) -> String {
        match self.backend_config() {
            starling_storage::BackendConfig::Sqlite { path, .. } => path.display().to_string(),
            starling_storage::BackendConfig::Postgres { url, .. } => {
                starling_storage::postgres::redacted_url(&url)
            }
        }
    }

    /// The database path, resolved against `data_dir`.
    pub fn database_path(&self) -> PathBuf {
        if self.storage.path.is_absolute() {
            self.storage.path.clone()
        } else {
            self.server.data_dir.join(&self.storage.path)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_empty_file_gives_defaults() {
        let c = Config::parse("", Path::new("x.toml")).unwrap();
        assert_eq!(c.server.domains, ["localhost"]);
        assert_eq!(c.listen.len(), 2);
        assert!(c.c2s.require_tls);
        assert_eq!(c.c2s.max_stanza_bytes, 262_144);
    }

    #[test]
    fn config_unknown_key_names_key_and_line() {
        let err = Config::parse("[c2s]\nmax_stanza_bites = 5\n", Path::new("x.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_stanza_bites"), "{err}");
        assert!(err.contains("line 2"), "{err}");
    }

    #[test]
    fn a_storage_url_without_the_postgres_backend_is_refused() {
        let parse = |t: &str| Config::parse(t, Path::new("x.toml"));
        let err = parse("[storage]\nurl = \"postgres://u@127.0.0.1/db\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("storage.url"), "{err}");
        assert!(err.contains("backend = \"postgres\""), "{err}");
        parse("[storage]\nbackend = \"postgres\"\nurl = \"postgres://u@127.0.0.1/db\"\n")
            .expect("the two together");
    }

    /// Each module parses its own `[modules.<name>]` table into its own
    /// struct; unknown modules and unknown keys inside a module are refused
    /// with what is known; a module's checks and the modules it needs are
    /// enforced at load time.
    #[test]
    fn config_modules_are_parsed_and_checked_by_each_module() {
        use crate::modules::{Inbox, Mam, Roster};
        let parse = |t: &str| Config::parse(t, Path::new("x.toml"));
        let c = parse(
            "[modules.roster]
max_items = 7
[modules.inbox]
batch_size = 3
",
        )
        .unwrap();
        assert_eq!(c.modules.get::<Roster>().max_items, 7);
        assert!(
            c.modules.get::<Roster>().versioning,
            "other keys keep defaults"
        );
        assert_eq!(c.modules.get::<Inbox>().batch_size, 3);
        assert_eq!(c.modules.get::<Mam>().batch_size, 20_000);
        let err = parse(
            "[modules.rooster]
enabled = true
",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("unknown module `rooster`") && err.contains("roster"),
            "{err}"
        );
        let err = parse(
            "[modules.roster]
max_itemz = 1
",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("[modules.roster]") && err.contains("max_itemz"),
            "{err}"
        );
        let err = parse(
            "[modules.mam]
default_mode = \"sometimes\"
",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("modules.mam.default_mode"), "{err}");
        let err = parse(
            "[modules.mam]
enabled = false
",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("modules.inbox.enabled") && err.contains("needs the mam module"),
            "{err}"
        );
        parse(
            "[modules.mam]
enabled = false
[modules.inbox]
enabled = false
",
        )
        .unwrap();
    }

    /// `[modules.component]`: each entry a domain of its own (not served,
    /// not another service's address, not twice), one secret each; a
    /// secret file not readable by everyone; secrets never in Debug output.
    #[test]
    fn config_component_domains_and_secrets_checked() {
        use crate::modules::Component;
        let parse = |t: &str| Config::parse(t, Path::new("x.toml"));
        let with = |components: &str| {
            parse(&format!(
                "[modules.component]\nenabled = true\ncomponents = [{components}]\n"
            ))
        };
        let c = with("{ domain = \"gw.localhost\", secret = \"s3cret\", name = \"GW\" }").unwrap();
        let m = c.modules.get::<Component>();
        assert_eq!(
            m.listen.to_string(),
            "127.0.0.1:5347",
            "loopback by default"
        );
        assert_eq!(m.components[0].domain, "gw.localhost");
        assert!(!format!("{c:?}").contains("s3cret"), "secret redacted");
        let err = |components: &str| with(components).unwrap_err().to_string();
        let e = err("");
        assert!(e.contains("modules.component.components"), "{e}");
        let e = err("{ domain = \"localhost\", secret = \"s\" }");
        assert!(
            e.contains("modules.component.components") && e.contains("served domain"),
            "{e}"
        );
        let e = err("{ domain = \"gw.localhost\", secret = \"a\" }, { domain = \"GW.localhost\", secret = \"b\" }");
        assert!(e.contains("twice"), "{e}");
        let e = err("{ domain = \"gw.localhost\" }");
        assert!(e.contains("exactly one of secret and secret_file"), "{e}");
        let e = err("{ domain = \"gw.localhost\", secret = \"\" }");
        assert!(e.contains("empty"), "{e}");
        let e = err("{ domain = \"a@gw.localhost\", secret = \"s\" }");
        assert!(e.contains("not a domain"), "{e}");
        // The group-chat service's address (muc is on by default).
        let e = err("{ domain = \"conference.localhost\", secret = \"s\" }");
        assert!(
            e.contains("modules.component.components") && e.contains("[modules.muc] subdomain"),
            "{e}"
        );
        parse("[modules.muc]\nenabled = false\n[modules.component]\nenabled = true\ncomponents = [{ domain = \"conference.localhost\", secret = \"s\" }]\n").unwrap();
        // Disabled: entries are still checked, an empty list is fine.
        parse("[modules.component]\ncomponents = []\n").unwrap();
        // secret_file: read, and refused when every user may read it.
        let dir =
            std::env::temp_dir().join(format!("starling-cfg-{}", starling_proto::random_id(8)));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("gw.secret");
        std::fs::write(&file, "from-a-file\n").unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
            let e = err(&format!(
                "{{ domain = \"gw.localhost\", secret_file = {file:?} }}"
            ));
            assert!(e.contains("readable by every user"), "{e}");
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        with(&format!(
            "{{ domain = \"gw.localhost\", secret_file = {file:?} }}"
        ))
        .unwrap();
        let e = err(&format!(
            "{{ domain = \"gw.localhost\", secret_file = {:?} }}",
            dir.join("missing")
        ));
        assert!(e.contains("cannot read"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn config_bad_domain_rejected() {
        let err = Config::parse("[server]\ndomains = [\"a b\"]\n", Path::new("x.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("server.domains"), "{err}");
    }

    #[test]
    fn config_storage_backend_and_url_checked() {
        let parse = |t: &str| Config::parse(t, Path::new("x.toml"));
        let err = parse("[storage]\nbackend = \"mysql\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("storage.backend") && err.contains("postgres"),
            "{err}"
        );
        let err = parse("[storage]\nbackend = \"postgres\"\nurl = \"mysql://a@b/c\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("storage.url"), "{err}");
        let c = parse(
            "[storage]\nbackend = \"postgres\"\nurl = \"postgres://starling:pw@db:6543/xmpp\"\n",
        )
        .unwrap();
        assert_eq!(c.storage_description(), "postgres://starling@db:6543/xmpp");
        assert!(matches!(
            c.backend_config(),
            starling_storage::BackendConfig::Postgres { pool_size: 4, .. }
        ));
    }

    #[test]
    fn config_cluster_needs_postgres_a_subject_safe_name_and_a_sane_timeout() {
        let parse = |t: &str| Config::parse(t, Path::new("x.toml"));
        let pg = "[storage]\nbackend = \"postgres\"\nurl = \"postgres://a@b/c\"\n";
        let err = parse("[cluster]\nnats_url = \"nats://127.0.0.1:4222\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cluster.nats_url") && err.contains("postgres"),
            "{err}"
        );
        let err = parse(&format!(
            "{pg}[cluster]\nnats_url = \"nats://h:4222\"\nname = \"a.b\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("cluster.name"), "{err}");
        let err = parse(&format!(
            "{pg}[cluster]\nnats_url = \"nats://h:4222\"\nheartbeat_ms = 1000\nnode_timeout_ms = 1500\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("cluster.node_timeout_ms"), "{err}");
        let c = parse(&format!("{pg}[cluster]\nnats_url = \"nats://h:4222\"\n")).unwrap();
        assert_eq!(c.cluster.node_timeout_ms, 5000);
        let err = parse(&format!(
            "{pg}[c2s]\nmax_stanza_bytes = 2000000\n[cluster]\nnats_url = \"nats://h:4222\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("c2s.max_stanza_bytes"), "{err}");
        // Several servers, comma-separated; each must be an address.
        parse(&format!(
            "{pg}[cluster]\nnats_url = \"nats://a:4222, nats://b:4222\"\n"
        ))
        .unwrap();
        let err = parse(&format!(
            "{pg}[cluster]\nnats_url = \"nats://a:4222,http://[\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("cluster.nats_url"), "{err}");
        // No cluster: no requirement.
        assert!(Config::default().cluster.nats_url.is_none());
    }

    #[test]
    fn config_postgres_url_from_environment_when_unset() {
        let mut c = Config::default();
        c.storage.backend = "postgres".into();
        let env = |k: &str| (k == DATABASE_URL_ENV).then(|| "postgres://e@h/d".to_owned());
        assert_eq!(
            c.database_url_with(env).as_deref(),
            Some("postgres://e@h/d")
        );
        assert_eq!(c.database_url_with(|_| None), None);
        c.storage.url = Some("postgres://f@h/d".into());
        assert_eq!(
            c.database_url_with(env).as_deref(),
            Some("postgres://f@h/d"),
            "the file wins"
        );
    }

    /// Issue 9: the default listeners were IPv4 only (0.0.0.0).
    #[test]
    fn config_default_listeners_are_dual_stack() {
        let c = Config::default();
        let addrs: Vec<String> = c.listen.iter().map(|l| l.address.to_string()).collect();
        assert_eq!(addrs, ["[::]:5222", "[::]:5223"]);
    }

    /// Issue 9: `address = "localhost:5222"` said only "invalid socket
    /// address syntax".
    #[test]
    fn config_listener_host_name_suggests_an_ip_address() {
        let err = Config::parse(
            "[[listen]]\naddress = \"localhost:5222\"\ntls = \"starttls\"\n",
            Path::new("x.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("localhost:5222")
                && err.contains("127.0.0.1:5222")
                && err.contains("[::]:5222"),
            "{err}"
        );
        assert!(err.contains("line 2"), "{err}");
    }

    /// Issue 9: a missing file's reason was printed twice by `{:#}`.
    #[test]
    fn config_missing_file_reason_said_once() {
        let err = Config::load(Path::new("/nonexistent/starling.toml")).unwrap_err();
        let text = format!("{:#}", anyhow::Error::from(err));
        assert_eq!(text.matches("No such file").count(), 1, "{text}");
        assert!(text.contains("--config"), "{text}");
    }

    #[test]
    fn config_admin_listener_loopback_by_default_and_addresses_checked() {
        let c = Config::default();
        assert_eq!(c.admin.listen, ["127.0.0.1:5290".parse().unwrap()]);
        assert!(c.admin.exposed().is_empty());
        let parse = |t: &str| Config::parse(t, Path::new("x.toml"));
        let c = parse("[admin]\nlisten = []\n").unwrap();
        assert!(c.admin.listen.is_empty());
        let c = parse("[admin]\nlisten = [\"0.0.0.0:5290\", \"[::1]:5291\"]\n").unwrap();
        assert_eq!(c.admin.exposed(), ["0.0.0.0:5290".parse().unwrap()]);
        let err = parse("[admin]\nlisten = [\"localhost:5290\"]\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("127.0.0.1:5222") && err.contains("line 2"),
            "{err}"
        );
        let err = parse("[admin]\nmax_body_bytes = 0\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("admin.max_body_bytes"), "{err}");
    }

    #[test]
    fn config_listeners_override_defaults() {
        let c = Config::parse(
            "[[listen]]\naddress = \"127.0.0.1:15222\"\ntls = \"starttls\"\n",
            Path::new("x.toml"),
        )
        .unwrap();
        assert_eq!(c.listen.len(), 1);
        assert_eq!(c.listen[0].tls, TlsMode::Starttls);
    }
}
