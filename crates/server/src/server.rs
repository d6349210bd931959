//! Start-up and shutdown: opens storage, builds the hooks of enabled modules,
//! binds listeners and accepts connections; on shutdown tells every session
//! to close with `<system-shutdown/>`, waits for them, then closes storage.

use crate::c2s::{session, C2sShared};
use crate::cluster::Cluster;
use crate::config::{Config, TlsMode};
use crate::routing::router::LocalRouter;
use crate::routing::sessions::SessionTable;
use crate::tls::TlsContext;
use crate::transport::gate::Door;
use crate::transport::tcp::{accept, set_keepalive, AcceptBackoff};
use anyhow::Context;
use starling_core::storage::AuthCache;
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

/// Binds one configured listener. `[::]` on a host without IPv6 falls back
/// to `0.0.0.0` with a log line; a port in use is reported with what to do.
fn bind_listener(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    // A large backlog: connection storms must not overflow the accept queue.
    let result = crate::transport::tcp::bind(addr, 4096);
    result.map_err(|(a, e)| {
        let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
            "another process (another Starling?) is listening on this port: stop it, or change the [[listen]] (or [[http.listen]]) address in the configuration"
        } else if e.kind() == std::io::ErrorKind::PermissionDenied {
            "ports below 1024 need privileges: use a higher port, or grant CAP_NET_BIND_SERVICE"
        } else {
            "check the [[listen]] address in the configuration"
        };
        anyhow::anyhow!("cannot listen on {a}: {e}; {hint}")
    })
}

/// Starts a server from a validated configuration.
pub async fn start(cfg: Config) -> anyhow::Result<RunningServer> {
    start_with(cfg, |_| {}).await
}

/// Like [`start`], with `extra` registering handlers and services besides
/// the configured modules (for programs that embed Starling, and tests).
pub async fn start_with(
    cfg: Config,
    extra: impl FnOnce(&mut starling_core::hooks::HookRegistry),
) -> anyhow::Result<RunningServer> {
    let domains: Vec<String> = cfg
        .server
        .domains
        .iter()
        .map(|d| {
            starling_proto::BareJid::new(d)
                .map(|j| j.domain().as_str().to_owned())
                .unwrap_or_else(|_| d.clone())
        })
        .collect();
    // Listeners first: a port in use stops start-up before anything is
    // written to data_dir.
    let mut bound = Vec::new();
    for l in &cfg.listen {
        bound.push((bind_listener(l.address)?, l.tls));
    }
    let mut http_bound = Vec::new();
    for l in &cfg.http.listen {
        http_bound.push((bind_listener(l.address)?, l.tls));
    }
    let mut admin_bound = Vec::new();
    for a in &cfg.admin.listen {
        admin_bound.push(bind_listener(*a).map_err(|e| {
            anyhow::anyhow!("{e} (this is the [admin] listen address; [admin] listen = [] turns the admin listener off)")
        })?);
    }
    starling_storage::fsperm::create_private_dir_all(&cfg.server.data_dir).with_context(|| {
        format!(
            "cannot create data directory {}; set [server] data_dir to a writable place",
            cfg.server.data_dir.display()
        )
    })?;
    let storage = starling_storage::open(&cfg.backend_config())
        .await
        .context("opening storage")?;
    let tls = TlsContext::load_or_generate(
        cfg.tls.certificate.as_deref(),
        cfg.tls.private_key.as_deref(),
        &cfg.server.data_dir,
        &domains,
    )
    .context("setting up TLS")?;
    tracing::info!(certificate = %tls.source, "TLS ready");
    let metrics = Metrics::new();
    // Every storage call timed (starling_storage_latency_seconds).
    let mut storage = storage.timed(&metrics);
    // Credentials and disabled state cached in front of the (timed)
    // account store; kept coherent by the backend's change log, read
    // before the listeners accept and then every 2 s.
    let auth_cache = Arc::new(AuthCache::new(
        storage.accounts.clone(),
        cfg.auth.cache_accounts,
    ));
    auth_cache
        .sync()
        .await
        .context("reading the accounts change log")?;
    auth_cache.export(&metrics);
    storage.accounts = auth_cache.clone();
    let pressure = Arc::new(Pressure::new());
    // The connection gates (transport/gate.rs): one for the client
    // listeners (c2s and HTTP share [server] max_connections), one for the
    // admin listeners; the listening modules make their own from these.
    let gates = crate::transport::gate::Gates::new(
        crate::transport::gate::PerSource {
            max: cfg.server.max_connections_per_ip,
            loopback: cfg.server.per_ip_limit_loopback,
        },
        &metrics,
    );
    let client_gate = gates.gate(cfg.server.max_connections);
    let http_timeouts = cfg.http.timeouts();
    let mut http_listeners = Vec::new();
    for (listener, tls) in &http_bound {
        http_listeners.push((listener.local_addr()?, *tls));
    }
    // The admin API asks session tasks for their facts through a timer
    // handler of its own (admin/mod.rs, SessionProbe).
    let probe = Arc::new(crate::admin::SessionProbe::default());
    let admin_probe = probe.clone();
    // The group-chat module, when enabled, provides what the admin API's
    // rooms endpoints use (admin/rooms.rs); it is taken after the modules
    // started.
    let mut admin_rooms = None;
    let with_admin = |reg: &mut starling_core::hooks::HookRegistry| {
        reg.timer(crate::admin::PROBE_MODULE, admin_probe);
        admin_rooms = reg
            .take_provided::<crate::admin::rooms::Provided>()
            .map(|p| p.0);
        extra(reg);
    };
    let (hooks, http_routes) = crate::modules::build_hooks(
        &cfg,
        &storage,
        &metrics,
        &pressure,
        crate::transport::http::HttpRoutes::new(http_listeners),
        gates.clone(),
        with_admin,
    )
    .await;
    // Two services on one address (a component's domain that is another
    // service's subdomain): the router would pick one silently.
    for d in &domains {
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
    let http_routes = Arc::new(http_routes);
    let table = Arc::new(SessionTable::new(cfg.server.node_id));
    let router = Arc::new(LocalRouter::new(table.clone()));
    let cluster = match &cfg.cluster.nats_url {
        Some(url) => {
            let c = Cluster::connect(&cfg.cluster, cfg.server.node_id, table.clone())
                .await
                .context("joining the cluster")?;
            tracing::info!(nats = %url, node = cfg.server.node_id, "cluster bus connected");
            router.set_cluster(c.clone());
            Some(c)
        }
        None => None,
    };
    let local_router = router.clone();
    let env = Arc::new(Env {
        router,
        sessions: table.clone(),
        storage,
        hosts: Hosts::new(domains.clone()),
        hooks,
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
    let mut admin_addrs = Vec::new();
    let mut admin_listeners = Vec::new();
    if !admin_bound.is_empty() {
        let state = Arc::new(crate::admin::AdminState {
            env: env.clone(),
            router: local_router,
            table: table.clone(),
            cluster: cluster.clone(),
            probe,
            health: health.clone(),
            started: std::time::Instant::now(),
            node: cfg.server.node_id,
            iterations: cfg.auth.scram_iterations,
            configured: domains.clone(),
            domains: domain_service.clone(),
            web: crate::admin::web::WebState::default(),
            rooms: admin_rooms,
        });
        let app = crate::admin::routes(state, cfg.admin.max_body_bytes);
        let admin_door = Arc::new(gates.gate(cfg.admin.max_connections).door("admin"));
        for listener in admin_bound {
            let local = listener.local_addr()?;
            if local.ip().is_loopback() {
                tracing::info!(address = %local, url = %format!("http://{local}/api/v1"), "admin API, metrics and health listening");
            } else {
                tracing::warn!(address = %local, "admin API, metrics and health listening on a non-loopback address: /metrics and /health need no token there; restrict access (firewall) or use 127.0.0.1");
            }
            admin_addrs.push(local);
            admin_listeners.push(tokio::spawn(crate::admin::accept_loop(
                listener,
                app.clone(),
                admin_door.clone(),
                http_timeouts,
            )));
        }
    }
    let c2s_door = Arc::new(client_gate.door("c2s"));
    let keepalive = match cfg.c2s.tcp_keepalive_secs {
        0 => None,
        s => Some(Duration::from_secs(s)),
    };
    let mut c2s_addrs = Vec::new();
    let mut listeners = Vec::new();
    // Changes by other nodes and the CLI to the domains table and, for
    // the auth cache, to accounts.
    listeners.push(spawn_polls(
        domain_service.clone(),
        auth_cache,
        shutdown_rx.clone(),
    ));
    for (listener, tls) in bound {
        let local = listener.local_addr()?;
        tracing::info!(address = %local, tls = ?tls, "listening for clients");
        c2s_addrs.push((local, tls));
        listeners.push(tokio::spawn(accept_loop(
            listener,
            tls,
            shared.clone(),
            shutdown_rx.clone(),
            done_tx.clone(),
            c2s_door.clone(),
            keepalive,
        )));
    }
    let web_client = cfg.http.web_client.then(|| {
        Arc::new(crate::transport::http::WebClient {
            dir: cfg.http.web_client_dir.clone(),
            domain: domains.first().cloned().unwrap_or_default(),
        })
    });
    let bosh_sessions = Arc::new(crate::transport::bosh::BoshRegistry::default());
    let mut http_addrs = Vec::new();
    for (listener, tls) in http_bound {
        let local = listener.local_addr()?;
        let scheme = if tls { "wss" } else { "ws" };
        tracing::info!(address = %local, url = %format!("{scheme}://{local}{}", crate::transport::http::WEBSOCKET_PATH), "listening for WebSocket clients");
        http_addrs.push((local, tls));
        if let Some(web) = web_client.as_ref().filter(|_| !tls) {
            if web.dir.join("converse.min.js").is_file() {
                tracing::info!(url = %format!("http://{local}/"), "web chat (Converse.js) served");
            } else {
                tracing::warn!(dir = %web.dir.display(), "web chat files not found; run scripts/fetch-webclient.sh (needs npm) or set [http] web_client_dir");
            }
        }
        listeners.push(tokio::spawn(crate::transport::http::accept_loop(
            listener,
            tls.then(|| http_tls.clone()),
            shared.clone(),
            shutdown_rx.clone(),
            done_tx.clone(),
            client_gate.clone(),
            http_timeouts,
            cfg.http.secure_loopback,
            web_client.clone(),
            bosh_sessions.clone(),
            http_routes.clone(),
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

async fn accept_loop(
    listener: TcpListener,
    mode: TlsMode,
    shared: Arc<C2sShared>,
    shutdown: watch::Receiver<bool>,
    done: mpsc::Sender<()>,
    door: Arc<Door>,
    keepalive: Option<Duration>,
) {
    let mut backoff = AcceptBackoff::default();
    loop {
        let (tcp, peer) = accept(&listener, &mut backoff, "c2s").await;
        // Over a limit: closed at once (the client's reconnect backoff
        // retries later), counted and logged by the gate.
        let Ok(ticket) = door.admit(peer) else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        if let Some(idle) = keepalive {
            set_keepalive(&tcp, idle);
        }
        let shared = shared.clone();
        let shutdown = shutdown.clone();
        let done = done.clone();
        tokio::spawn(async move {
            session::run(shared, tcp, peer, mode == TlsMode::Direct, shutdown).await;
            drop(ticket);
            drop(done);
        });
    }
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
