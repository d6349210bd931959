//! Start-up and shutdown: opens storage, builds the hooks of enabled modules,
//! binds listeners and accepts connections; on shutdown tells every session
//! to close with `<system-shutdown/>`, waits for them, then closes storage.

use crate::c2s::C2sShared;
use crate::cluster::Cluster;
use crate::config::{Config, TlsMode};
use crate::listen;
use crate::modules::common::admin_api::AdminExtensions;
use crate::routing::router::LocalRouter;
use crate::routing::sessions::SessionTable;
use crate::tls::TlsContext;
use crate::transport::gate::{Gates, PerSource};
use crate::transport::http::HttpRoutes;
use anyhow::Context;
use starling_core::hooks::{HookRegistry, Hooks};
use starling_core::module::ModuleCtx;
use starling_core::storage::{ArchiveIds, AuthCache, Storage};
use starling_core::{Env, Hosts, Metrics, Pressure};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// A started server.
pub struct RunningServer {
    /// The shared environment (for tests and the admin tools).
    pub env: Arc<Env>,
    /// Bound client listeners and their TLS mode (actual ports, also when
    /// the configuration asked for port 0).
    pub c2s_addrs: Vec<(SocketAddr, TlsMode)>,
    /// Bound HTTP listeners (WebSocket, host-meta) and whether they use TLS.
    pub http_addrs: Vec<(SocketAddr, bool)>,
    /// Bound admin listeners (`[admin] listen`: API, metrics, health).
    pub admin_addrs: Vec<SocketAddr>,
    /// What `/health/ready` reports.
    pub health: Arc<crate::admin::Health>,
    /// Domains added, disabled and removed at run time (docs/domains.md).
    pub domains: Arc<crate::domains::Domains>,
    /// The admin listeners: they close after the sessions, so
    /// `/health/ready` says "shutting down" meanwhile.
    admin_listeners: Vec<JoinHandle<()>>,
    shutdown_tx: watch::Sender<bool>,
    done_tx: Option<mpsc::Sender<()>>,
    done_rx: mpsc::Receiver<()>,
    listeners: Vec<JoinHandle<()>>,
    shutdown_timeout: Duration,
    drain_timeout: Duration,
    /// This node's side of the cluster bus (`[cluster] nats_url` set).
    pub cluster: Option<Arc<Cluster>>,
    cluster_tasks: Vec<JoinHandle<()>>,
}

impl RunningServer {
    /// The first listener with this TLS mode.
    pub fn addr(&self, mode: TlsMode) -> Option<SocketAddr> {
        self.c2s_addrs
            .iter()
            .find(|(_, m)| *m == mode)
            .map(|(a, _)| *a)
    }

    /// Graceful shutdown, in an order that loses nothing accepted:
    ///
    /// 1. the listeners stop accepting connections;
    /// 2. every session stops reading (no new stanza is accepted), closes
    ///    its stream with `<system-shutdown/>`, runs its `session_closed`
    ///    hooks and re-routes what is still in its mailbox (to offline
    ///    storage when nobody else can take it); storage is still open and
    ///    the write-behind writers still run, so none of this can fail for
    ///    lack of them. Sessions still closing after
    ///    `shutdown_timeout_secs` are logged and waited for;
    /// 3. the modules' shutdown hooks drain the write-behind queues into
    ///    storage. Steps 2 and 3 end by `drain_timeout_secs` after the
    ///    start; past it the log says how many sessions were still open
    ///    and how many records each queue could not write;
    /// 4. storage closes.
    pub async fn shutdown(mut self) {
        let started = std::time::Instant::now();
        self.health.set_stopping();
        tracing::info!(
            sessions = self.env.sessions.count(),
            "shutting down: closing listeners and every stream"
        );
        for l in &self.listeners {
            l.abort();
        }
        let _ = self.shutdown_tx.send(true);
        self.done_tx.take();
        // Sessions that are slow to close are still writing what they
        // accepted (their mailboxes to offline storage, their last
        // activity): storage stays open for them until the drain deadline.
        let deadline = tokio::time::Instant::now() + self.drain_timeout;
        let mut closed = tokio::time::timeout(self.shutdown_timeout, self.done_rx.recv())
            .await
            .is_ok();
        if !closed {
            tracing::warn!(
                sessions = self.env.sessions.count(),
                timeout_secs = self.shutdown_timeout.as_secs(),
                "sessions still closing after shutdown_timeout_secs; waiting for them until drain_timeout_secs"
            );
            closed = tokio::time::timeout_at(deadline, self.done_rx.recv())
                .await
                .is_ok();
        }
        for l in &self.admin_listeners {
            l.abort();
        }
        if let Some(c) = &self.cluster {
            // The sessions' Unbound events are queued: say goodbye after them,
            // then stop the bus tasks (their NATS connection closes with them).
            c.leave().await;
            for t in self.cluster_tasks.drain(..) {
                t.abort();
            }
        }
        if closed {
            tracing::info!(
                millis = started.elapsed().as_millis() as u64,
                "every session closed"
            );
        } else {
            tracing::error!(
                sessions = self.env.sessions.count(),
                timeout_secs = self.drain_timeout.as_secs(),
                "sessions still open at drain_timeout_secs; what they route after storage closes fails with errors"
            );
        }
        let drain = async {
            for (module, h) in self.env.hooks.shutdown.iter() {
                tracing::info!(module, "flushing module state");
                h.shutdown(&self.env).await;
            }
        };
        if tokio::time::timeout_at(deadline, drain).await.is_err() {
            for (queue, q) in self.env.metrics.write_behind.queues() {
                let left = q.queued.get();
                if left > 0 {
                    tracing::error!(
                        queue,
                        records = left,
                        timeout_secs = self.drain_timeout.as_secs(),
                        "write-behind drain timed out; these records were not written"
                    );
                }
            }
        } else {
            let written: u64 = self
                .env
                .metrics
                .write_behind
                .queues()
                .iter()
                .map(|(_, q)| q.written.get())
                .sum();
            tracing::info!(
                records_written_since_start = written,
                "storage queues drained"
            );
        }
        self.env.storage.backend.close().await;
        tracing::info!(
            millis = started.elapsed().as_millis() as u64,
            "shutdown complete"
        );
    }
}

/// The sockets of the node's own listeners, bound before anything else
/// happens: a port in use stops start-up before anything is written to
/// `data_dir`.
struct Bound {
    c2s: Vec<(TcpListener, TlsMode)>,
    http: Vec<(TcpListener, bool)>,
    admin: Vec<TcpListener>,
}

impl Bound {
    /// `[[listen]]`, `[[http.listen]]` and `[admin] listen`. A large
    /// backlog: connection storms must not overflow the accept queue.
    fn all(cfg: &Config) -> anyhow::Result<Bound> {
        let mut bound = Bound {
            c2s: Vec::new(),
            http: Vec::new(),
            admin: Vec::new(),
        };
        for l in &cfg.listen {
            bound
                .c2s
                .push((listen::bind(l.address, 4096, "[[listen]]")?, l.tls));
        }
        for l in &cfg.http.listen {
            bound
                .http
                .push((listen::bind(l.address, 4096, "[[http.listen]]")?, l.tls));
        }
        for a in &cfg.admin.listen {
            bound
                .admin
                .push(listen::bind(*a, 4096, "[admin] listen").map_err(|e| {
                    anyhow::anyhow!("{e} ([admin] listen = [] turns the admin listener off)")
                })?);
        }
        Ok(bound)
    }

    /// The HTTP listeners' actual addresses and whether each is HTTPS.
    fn http_addrs(&self) -> anyhow::Result<Vec<(SocketAddr, bool)>> {
        self.http
            .iter()
            .map(|(l, tls)| Ok((l.local_addr()?, *tls)))
            .collect()
    }
}

/// Starts a server from a validated configuration.
pub async fn start(cfg: Config) -> anyhow::Result<RunningServer> {
    start_with(cfg, |_| {}).await
}

/// Like [`start`], with `extra` registering handlers and services besides
/// the configured modules (for programs that embed Starling, and tests).
///
/// The node's parts, in the order they start: the listeners' sockets,
/// storage (with the auth cache in front), TLS, the modules (which build
/// the hooks), the environment and the cluster bus, the stored domains,
/// the admin listener, and last the client listeners.
pub async fn start_with(
    cfg: Config,
    extra: impl FnOnce(&mut HookRegistry),
) -> anyhow::Result<RunningServer> {
    let domains = configured_domains(&cfg);
    let bound = Bound::all(&cfg)?;
    let metrics = Metrics::new();
    let (storage, auth_cache) = open_storage(&cfg, &metrics).await?;
    let tls = TlsContext::load_or_generate(
        cfg.tls.certificate.as_deref(),
        cfg.tls.private_key.as_deref(),
        &cfg.server.data_dir,
        &domains,
    )
    .context("setting up TLS")?;
    tracing::info!(certificate = %tls.source, "TLS ready");
    let pressure = Arc::new(Pressure::new());
    // The connection gates (transport/gate.rs): one for the client
    // listeners (c2s and HTTP share [server] max_connections), one for the
    // admin listeners; the listening modules make their own from these.
    let gates = Gates::new(
        PerSource {
            max: cfg.server.max_connections_per_ip,
            loopback: cfg.server.per_ip_limit_loopback,
        },
        &metrics,
    );
    let modules = start_modules(
        &cfg,
        &domains,
        &storage,
        &metrics,
        &pressure,
        HttpRoutes::new(bound.http_addrs()?),
        gates.clone(),
        extra,
    )
    .await?;
    let table = Arc::new(SessionTable::new(cfg.server.node_id));
    let router = Arc::new(LocalRouter::new(table.clone()));
    let cluster = join_cluster(&cfg, &table, &router).await?;
    let env = Arc::new(Env {
        router: router.clone(),
        sessions: table.clone(),
        storage,
        hosts: Hosts::new(domains.clone()),
        hooks: modules.hooks,
        metrics,
        pressure,
        handover: Arc::new(starling_core::HandoverGate::new()),
    });
    // Stored domains (docs/domains.md) are served before anything starts
    // or accepts; the SNI resolver reads the served set.
    tls.resolver.set_env(&env);
    let domain_service = crate::domains::Domains::new(
        env.storage.clone(),
        domains.clone(),
        cfg.server.data_dir.clone(),
        Some(tls.resolver.clone()),
    );
    domain_service.attach(env.clone(), table.clone());
    domain_service
        .sync()
        .await
        .context("loading the stored domains")?;
    for h in &env.hooks.started {
        h.started(&env);
    }
    let http_tls = tls.http.clone();
    let shared = Arc::new(C2sShared::new(env.clone(), Some(tls), &cfg));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (done_tx, done_rx) = mpsc::channel(1);
    let mut cluster_tasks = Vec::new();
    if let Some(c) = &cluster {
        // Before the listeners: a session bound from now on is announced.
        cluster_tasks = c
            .start(&env, shutdown_rx.clone())
            .await
            .context("joining the cluster")?;
    }
    let health = Arc::new(crate::admin::Health::default());
    let admin = crate::admin::AdminState {
        env: env.clone(),
        router,
        table: table.clone(),
        cluster: cluster.clone(),
        probe: modules.probe,
        health: health.clone(),
        started: std::time::Instant::now(),
        node: cfg.server.node_id,
        iterations: cfg.auth.scram_iterations,
        configured: domains.clone(),
        domains: domain_service.clone(),
        web: crate::admin::web::WebState::default(),
        extensions: modules.admin,
    };
    let (admin_addrs, admin_listeners) = serve_admin(&cfg, bound.admin, admin, &gates)?;
    let client_gate = gates.gate(cfg.server.max_connections);
    let mut listeners = Vec::new();
    // Changes by other nodes and the CLI to the domains table and, for
    // the auth cache, to accounts.
    listeners.push(spawn_polls(
        domain_service.clone(),
        auth_cache,
        shutdown_rx.clone(),
    ));
    let c2s_door = Arc::new(client_gate.door("c2s"));
    let keepalive = match cfg.c2s.tcp_keepalive_secs {
        0 => None,
        s => Some(Duration::from_secs(s)),
    };
    let mut c2s_addrs = Vec::new();
    for (listener, tls) in bound.c2s {
        let local = listener.local_addr()?;
        tracing::info!(address = %local, tls = ?tls, "listening for clients");
        c2s_addrs.push((local, tls));
        listeners.push(tokio::spawn(listen::c2s::serve(
            listener,
            tls,
            shared.clone(),
            shutdown_rx.clone(),
            done_tx.clone(),
            c2s_door.clone(),
            keepalive,
        )));
    }
    let client_http = listen::http::ClientHttp {
        c2s: shared,
        shutdown: shutdown_rx,
        done: done_tx.clone(),
        gate: client_gate,
        timeouts: listen::http::timeouts(&cfg.http),
        secure_loopback: cfg.http.secure_loopback,
        web_client: cfg.http.web_client.then(|| {
            Arc::new(listen::http::WebClient {
                dir: cfg.http.web_client_dir.clone(),
                domain: domains.first().cloned().unwrap_or_default(),
            })
        }),
        bosh: Arc::new(crate::transport::bosh::BoshRegistry::default()),
        routes: Arc::new(modules.http_routes),
    };
    let mut http_addrs = Vec::new();
    for (listener, tls) in bound.http {
        let local = listener.local_addr()?;
        let scheme = if tls { "wss" } else { "ws" };
        tracing::info!(address = %local, url = %format!("{scheme}://{local}{}", crate::transport::http::WEBSOCKET_PATH), "listening for WebSocket clients");
        http_addrs.push((local, tls));
        if let Some(web) = client_http.web_client.as_ref().filter(|_| !tls) {
            if web.dir.join("converse.min.js").is_file() {
                tracing::info!(url = %format!("http://{local}/"), "web chat (Converse.js) served");
            } else {
                tracing::warn!(dir = %web.dir.display(), "web chat files not found; run scripts/fetch-webclient.sh (needs npm) or set [http] web_client_dir");
            }
        }
        listeners.push(tokio::spawn(listen::http::serve(
            listener,
            tls.then(|| http_tls.clone()),
            client_http.clone(),
        )));
    }
    tracing::info!(
        domains = ?domains,
        stored_domains = env.hosts.len().saturating_sub(domains.len()),
        storage = %env.storage.backend.describe(),
        "Starling is ready; add an account with: starling user add user@{}",
        domains.first().map(String::as_str).unwrap_or("localhost")
    );
    health.set_ready();
    Ok(RunningServer {
        env,
        c2s_addrs,
        http_addrs,
        admin_addrs,
        health,
        domains: domain_service,
        admin_listeners,
        shutdown_tx,
        done_tx: Some(done_tx),
        done_rx,
        listeners,
        shutdown_timeout: Duration::from_secs(cfg.server.shutdown_timeout_secs),
        drain_timeout: Duration::from_secs(cfg.server.drain_timeout_secs),
        cluster,
        cluster_tasks,
    })
}

/// `[server] domains`, normalised (the first is the default domain).
fn configured_domains(cfg: &Config) -> Vec<String> {
    cfg.server
        .domains
        .iter()
        .map(|d| {
            starling_proto::BareJid::new(d)
                .map(|j| j.domain().as_str().to_owned())
                .unwrap_or_else(|_| d.clone())
        })
        .collect()
}

/// Creates `data_dir` and opens the configured storage: every call timed
/// (`starling_storage_latency_seconds`), credentials and disabled state
/// cached in front of the account store. The cache is kept coherent by
/// the backend's change log, read here (before the listeners accept) and
/// then every 2 s ([`spawn_polls`]).
async fn open_storage(
    cfg: &Config,
    metrics: &Metrics,
) -> anyhow::Result<(Storage, Arc<AuthCache>)> {
    starling_storage::fsperm::create_private_dir_all(&cfg.server.data_dir).with_context(|| {
        format!(
            "cannot create data directory {}; set [server] data_dir to a writable place",
            cfg.server.data_dir.display()
        )
    })?;
    let storage = crate::modules::open_storage(&cfg.backend_config())
        .await
        .context("opening storage")?;
    let mut storage = storage.timed(metrics);
    let auth_cache = Arc::new(AuthCache::new(
        storage.accounts.clone(),
        cfg.auth.cache_accounts,
    ));
    auth_cache
        .sync()
        .await
        .context("reading the accounts change log")?;
    auth_cache.export(metrics);
    storage.accounts = auth_cache.clone();
    Ok((storage, auth_cache))
}

/// What starting the modules gives the rest of the node.
struct Started {
    hooks: Hooks,
    /// The routes modules mounted on the HTTP listeners.
    http_routes: HttpRoutes,
    /// The admin API's way to ask session tasks for their facts.
    probe: Arc<crate::admin::SessionProbe>,
    /// The admin endpoints, OpenAPI paths and web admin pages modules
    /// added (the group-chat module's rooms).
    admin: AdminExtensions,
}

/// The node's archive id generator, seeded above the greatest id in
/// storage (a restart after the clock stepped back repeats no id).
pub async fn archive_ids(storage: &Storage, node: u8) -> Arc<ArchiveIds> {
    let above = match storage.archive.max_id().await {
        Ok(id) => id,
        Err(e) => {
            tracing::error!(error = %e, "reading the greatest archive id failed; ids start from the clock");
            None
        }
    };
    Arc::new(ArchiveIds::new(node, above))
}

/// Starts every enabled module (in [`crate::modules::MODULES`] order) and
/// freezes the hooks. Modules with background writers (archive, inbox)
/// start them here, so this runs inside the Tokio runtime. `http` is lent
/// to the modules (and to `extra`) to mount HTTP routes in; `gates` is
/// provided to the modules that listen. Two services on one address (a
/// component's domain that is another service's subdomain) stop start-up:
/// the router would pick one silently.
#[allow(clippy::too_many_arguments)]
async fn start_modules(
    cfg: &Config,
    domains: &[String],
    storage: &Storage,
    metrics: &Metrics,
    pressure: &Arc<Pressure>,
    http: HttpRoutes,
    gates: Arc<Gates>,
    extra: impl FnOnce(&mut HookRegistry),
) -> anyhow::Result<Started> {
    let mut reg = HookRegistry::new();
    reg.provide(http);
    reg.provide(gates);
    reg.provide(AdminExtensions::default());
    let is_enabled = |name: &str| cfg.modules.is_enabled(name);
    let archive_ids = archive_ids(storage, cfg.server.node_id).await;
    let ctx = ModuleCtx {
        domains: &cfg.server.domains,
        data_dir: &cfg.server.data_dir,
        node_id: cfg.server.node_id,
        scram_iterations: cfg.auth.scram_iterations,
        storage,
        archive_ids: &archive_ids,
        metrics,
        pressure,
        is_enabled: &is_enabled,
    };
    for (m, c) in cfg.modules.iter() {
        if m.enabled(c) {
            reg.begin_module(m.name());
            m.start(c, &ctx, &mut reg).await;
        } else if let Some(ext) = reg.provided::<AdminExtensions>() {
            ext.disabled
                .extend(m.admin_paths().iter().map(|p| (*p, m.name())));
        }
    }
    reg.end_module();
    // The admin API asks session tasks for their facts through a timer
    // handler of its own (admin/mod.rs, SessionProbe); modules added
    // their endpoints and pages to the AdminExtensions provided above.
    let probe = Arc::new(crate::admin::SessionProbe::default());
    reg.timer(crate::admin::PROBE_MODULE, probe.clone());
    let admin = reg
        .take_provided::<AdminExtensions>()
        .expect("provided above; modules cannot take it");
    extra(&mut reg);
    let http_routes = reg
        .take_provided::<HttpRoutes>()
        .expect("provided above; modules cannot take it");
    let hooks = reg.build();
    for d in domains {
        let mut seen = std::collections::HashSet::new();
        for (jid, _) in hooks.services_of(d, 0) {
            if !seen.insert(jid.clone()) {
                anyhow::bail!(
                    "two services claim {jid}: change a module's subdomain, or the domain of the [modules.component] entry"
                );
            }
        }
    }
    for (module, prefix) in http_routes.mounted() {
        tracing::info!(module, prefix, "module HTTP routes mounted");
    }
    Ok(Started {
        hooks,
        http_routes,
        probe,
        admin,
    })
}

/// Connects to the cluster bus when `[cluster] nats_url` is set.
async fn join_cluster(
    cfg: &Config,
    table: &Arc<SessionTable>,
    router: &Arc<LocalRouter>,
) -> anyhow::Result<Option<Arc<Cluster>>> {
    let Some(url) = &cfg.cluster.nats_url else {
        return Ok(None);
    };
    let c = Cluster::connect(&cfg.cluster, cfg.server.node_id, table.clone())
        .await
        .context("joining the cluster")?;
    tracing::info!(nats = %url, node = cfg.server.node_id, "cluster bus connected");
    router.set_cluster(c.clone());
    Ok(Some(c))
}

/// Serves the admin API, metrics and health on the bound admin listeners.
fn serve_admin(
    cfg: &Config,
    bound: Vec<TcpListener>,
    state: crate::admin::AdminState,
    gates: &Arc<Gates>,
) -> anyhow::Result<(Vec<SocketAddr>, Vec<JoinHandle<()>>)> {
    let (mut addrs, mut tasks) = (Vec::new(), Vec::new());
    if bound.is_empty() {
        return Ok((addrs, tasks));
    }
    let app = crate::admin::routes(state, cfg.admin.max_body_bytes);
    let door = Arc::new(gates.gate(cfg.admin.max_connections).door("admin"));
    let timeouts = listen::http::timeouts(&cfg.http);
    for listener in bound {
        let local = listener.local_addr()?;
        if local.ip().is_loopback() {
            tracing::info!(address = %local, url = %format!("http://{local}/api/v1"), "admin API, metrics and health listening");
        } else {
            tracing::warn!(address = %local, "admin API, metrics and health listening on a non-loopback address: /metrics and /health need no token there; restrict access (firewall) or use 127.0.0.1");
        }
        addrs.push(local);
        tasks.push(tokio::spawn(listen::admin::serve(
            listener,
            app.clone(),
            door.clone(),
            timeouts,
        )));
    }
    Ok((addrs, tasks))
}

/// Every [`crate::domains::POLL_INTERVAL`], reads what other writers
/// (other nodes, the offline CLI) changed: the domains table
/// ([`crate::domains::Domains::sync`]) and the accounts change log for the
/// auth cache ([`AuthCache::sync`]). A failed read is retried at the next
/// tick (until then this node may miss a change made elsewhere).
fn spawn_polls(
    domains: Arc<crate::domains::Domains>,
    cache: Arc<AuthCache>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(crate::domains::POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            if let Err(e) = domains.sync().await {
                tracing::warn!(error = %e, "reading the domains table failed; retrying");
            }
            match cache.sync().await {
                Ok(Some(0)) => {}
                Ok(Some(n)) => tracing::debug!(accounts = n, "auth cache: accounts changed elsewhere forgotten"),
                Ok(None) => tracing::info!("auth cache: the accounts change log moved too far since the last read; cache emptied"),
                Err(e) => tracing::warn!(error = %e, "reading the accounts change log failed; retrying"),
            }
        }
    })
}
