//! The admin surface (docs/admin.md): a plain HTTP listener of its own
//! (`[admin] listen`, `127.0.0.1:5290` by default) serving
//!
//! - `/api/v1/…`, the admin API (JSON; [`api`]; modules add theirs, the
//!   group-chat rooms, through `AdminExtensions`), behind bearer
//!   tokens ([`tokens`]; made offline by `starling admin token create`).
//!   Every change is logged at INFO as `admin action` with `token=`,
//!   `action=` and `target=`;
//! - `/api/openapi.json`, the OpenAPI 3.0 document of the API
//!   ([`openapi`], written by hand; a test checks it names every route);
//! - `/metrics`, the Prometheus text exposition of `Metrics::encode`;
//! - `/health/live` (200 while the process serves) and `/health/ready`
//!   (200 once start-up is complete, 503 while starting or shutting
//!   down), for load balancers and orchestrators;
//! - `/admin`, the web admin page ([`web`]: server-rendered HTML, a
//!   login with an admin token, then a session cookie), whose actions
//!   call the API's operations.
//!
//! The API is versioned under `/api/v1`; errors are `{"error", "status"}`
//! objects. Metrics, health and the OpenAPI document need no token, which
//! is why the listener is loopback by default (another address is allowed,
//! with a warning). `starling ctl` ([`ctl`]) is the API's command-line
//! client.
//!
//! The listener binds with the others (a port in use stops start-up) and
//! serves connections through the same helpers as the HTTP listeners
//! (`listen::admin`, `transport::http::serve_connection`). On
//! shutdown it stays up while the sessions close, answering
//! `/health/ready` with 503 and API requests with 503, and closes before
//! the storage queues drain.
//!
//! The session list shows what the session table knows (JID, node,
//! availability, when it was bound) and, for this node's sessions, what
//! only each session task knows (address, TLS, stream-management state):
//! the handler asks each listed session through `Router::notify` (a timer
//! of the `admin` pseudo-module, [`SessionProbe`]) and waits briefly for
//! the answers, so an idle session carries nothing extra for it.

pub(crate) mod api;
pub mod ctl;
pub(crate) mod openapi;
pub(crate) use crate::modules::common::admin_api::{error, json, AdminExtensions, Caller};
pub mod tokens;
pub(crate) mod web;

use crate::cluster::Cluster;
use crate::routing::router::LocalRouter;
use crate::routing::sessions::SessionTable;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use starling_core::hooks::{HookResult, SessionCtx, SessionState, TimerHandler};
use starling_core::storage::SCOPE_ADMIN;
use starling_core::{Env, Flow};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The name under which the session probe's timer handler is registered.
pub(crate) const PROBE_MODULE: &str = "admin";

/// Where the server is in its life, as `/health/ready` reports it.
#[derive(Debug, Default)]
pub struct Health(AtomicU8);

const STARTING: u8 = 0;
const READY: u8 = 1;
const STOPPING: u8 = 2;

impl Health {
    /// Start-up is complete: every listener accepts.
    pub(crate) fn set_ready(&self) {
        let _ = self
            .0
            .compare_exchange(STARTING, READY, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Shutdown began (called by `RunningServer::shutdown`; an embedding
    /// program may call it earlier, to take the node out of a load
    /// balancer before stopping it).
    pub fn set_stopping(&self) {
        self.0.store(STOPPING, Ordering::Release);
    }

    /// `None` when ready, else why not.
    pub fn not_ready(&self) -> Option<&'static str> {
        match self.0.load(Ordering::Acquire) {
            READY => None,
            STARTING => Some("starting"),
            _ => Some("shutting down"),
        }
    }
}

/// What a session task tells the admin API about itself.
#[derive(Clone, Debug)]
pub(crate) struct SessionFacts {
    pub id: u64,
    pub peer: SocketAddr,
    pub secure: bool,
    /// `established`, `detached`, `closing`…
    pub state: &'static str,
    /// Seconds a detached (XEP-0198) session waits to be resumed.
    pub resumable_for_secs: Option<u64>,
    /// `tcp`, `tls`, `websocket`, `bosh` or `detached`.
    pub transport: &'static str,
}

/// Collects [`SessionFacts`] from session tasks: a request registers a
/// token, notifies the sessions it lists with it, and takes what arrived.
#[derive(Default)]
pub(crate) struct SessionProbe {
    next: AtomicU64,
    pending: Mutex<HashMap<u64, Vec<SessionFacts>>>,
}

impl SessionProbe {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Vec<SessionFacts>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new collection.
    pub(crate) fn open(&self) -> u64 {
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(token, Vec::new());
        token
    }

    /// How many answers arrived so far.
    pub(crate) fn answered(&self, token: u64) -> usize {
        self.lock().get(&token).map_or(0, Vec::len)
    }

    /// Ends a collection, with what arrived.
    pub(crate) fn close(&self, token: u64) -> Vec<SessionFacts> {
        self.lock().remove(&token).unwrap_or_default()
    }
}

#[starling_core::async_trait]
impl TimerHandler for SessionProbe {
    async fn timer(&self, cx: &mut SessionCtx<'_>, token: u64) -> HookResult {
        let info = cx.info;
        let (state, resumable_for_secs) = match info.state {
            SessionState::PreAuth => ("pre-auth", None),
            SessionState::Authenticated => ("authenticated", None),
            SessionState::Established => ("established", None),
            SessionState::Detached { until } => (
                "detached",
                Some(until.saturating_duration_since(Instant::now()).as_secs()),
            ),
            SessionState::Closing => ("closing", None),
        };
        if let Some(v) = self.lock().get_mut(&token) {
            v.push(SessionFacts {
                id: info.id,
                peer: info.peer,
                secure: info.secure,
                state,
                resumable_for_secs,
                transport: info.transport.as_str(),
            });
        }
        Ok(Flow::Continue)
    }
}

/// What every admin request handler can reach.
pub(crate) struct AdminState {
    pub env: Arc<Env>,
    pub router: Arc<LocalRouter>,
    pub table: Arc<SessionTable>,
    pub cluster: Option<Arc<Cluster>>,
    pub probe: Arc<SessionProbe>,
    pub health: Arc<Health>,
    pub started: Instant,
    pub node: u8,
    /// PBKDF2 iterations for passwords set through the API.
    pub iterations: u32,
    /// The configured domains, normalised, first = default.
    pub configured: Vec<String>,
    /// Domains added at run time: the served set is `env.hosts`, changes
    /// go through this service (docs/domains.md).
    pub domains: Arc<crate::domains::Domains>,
    /// The web admin page's sessions and login limits ([`web`]).
    pub web: web::WebState,
    /// What modules added: endpoints (taken when the router is built),
    /// OpenAPI paths, web admin pages.
    pub extensions: AdminExtensions,
}

/// The admin listeners' shared state.
pub(crate) type Shared = Arc<AdminState>;

/// The router of the admin listener: health, metrics, the OpenAPI
/// document, and the token-protected API.
pub(crate) fn routes(mut state: AdminState, max_body: usize) -> Router {
    let added = std::mem::take(&mut state.extensions.routes);
    let pages: Vec<&'static str> = state.extensions.pages.iter().map(|p| p.path).collect();
    let state: Shared = Arc::new(state);
    let api = added
        .into_iter()
        .fold(api::routes(), |r, (_, path, handler)| {
            r.route(path, handler.with_state(()))
        })
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ));
    Router::new()
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics))
        .route(openapi::PATH, get(openapi_document))
        .merge(api)
        .merge(web::routes(&pages))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// How often a token's `last_used_at` is written at most, milliseconds.
const TOUCH_EVERY_MS: i64 = 60_000;

/// Checks `Authorization: Bearer <token>` against the stored tokens.
async fn authenticate(State(st): State<Shared>, mut req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    // A source that sent too many wrong tokens is refused further wrong
    // ones, but a valid token always passes: the lockout slows guessing
    // (pointless against 256-bit tokens anyway) and must never let a
    // local process keep the operator out (issue 31, item 10).
    let ip = peer.map(|p| p.ip());
    let locked = ip.is_some_and(|ip| !st.web.login_allowed(ip));
    let refuse = |why: &str| {
        st.env.metrics.admin_auth_failed("api");
        if locked {
            starling_core::log_throttled!(warn, peer = ?peer, "admin API: too many requests with a wrong token from this address; refused");
            error(
                StatusCode::TOO_MANY_REQUESTS,
                &format!(
                    "too many requests with a wrong token from this address; wait {} s (a valid token is still accepted)",
                    web::LOGIN_WINDOW.as_secs()
                ),
            )
        } else {
            unauthorized(why)
        }
    };
    let Some(given) = given.filter(|t| !t.is_empty()) else {
        return refuse("missing bearer token: send Authorization: Bearer <token> (tokens are made with `starling admin token create --name NAME`)");
    };
    let stored = match st.env.storage.admin_tokens.admin_tokens().await {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "admin API: cannot read the tokens");
            return error(StatusCode::SERVICE_UNAVAILABLE, "storage unavailable");
        }
    };
    let Some(token) = tokens::find(&stored, given) else {
        if let Some(ip) = ip {
            st.web.login_failed(ip);
        }
        // The token itself is never logged; a guessing client cannot
        // flood the log either (one line per 10 s, with a count).
        starling_core::log_throttled!(warn, peer = ?peer, "admin API: request with an unknown token refused");
        return refuse("invalid token (revoked, or never created on this deployment)");
    };
    if let Some(why) = st.health.not_ready() {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("the server is {why}"),
        );
    }
    let now = tokens::now_millis();
    if token.last_used_at.is_none_or(|t| now - t >= TOUCH_EVERY_MS) {
        let store = st.env.storage.admin_tokens.clone();
        let name = token.name.clone();
        tokio::spawn(async move {
            if let Err(e) = store.touch_admin_token(&name, now).await {
                tracing::debug!(error = %e, "admin API: cannot record a token's use");
            }
        });
    }
    let reads = matches!(
        *req.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    if token.scope != SCOPE_ADMIN && !reads {
        tracing::warn!(token = %token.name, scope = %token.scope, method = %req.method(), path = %req.uri().path(), "admin API: a change refused to a read-only token");
        return error(
            StatusCode::FORBIDDEN,
            &format!(
                "token {:?} has scope {:?}: it may only read (GET); changes need a token made with --scope admin",
                token.name, token.scope
            ),
        );
    }
    req.extensions_mut().insert(Caller(token.name.clone()));
    next.run(req).await
}

fn unauthorized(message: &str) -> Response {
    let mut r = error(StatusCode::UNAUTHORIZED, message);
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"starling-admin\""),
    );
    r
}

async fn not_found(State(st): State<Shared>, uri: axum::http::Uri) -> Response {
    let path = uri.path();
    let off = st.extensions.disabled.iter().find(|(prefix, _)| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    });
    match off {
        Some((_, module)) => error(
            StatusCode::NOT_FOUND,
            &format!("this endpoint is the {module} module's, which is off ([modules.{module}] enabled = false)"),
        ),
        None => error(
            StatusCode::NOT_FOUND,
            "no such endpoint (see /api/openapi.json)",
        ),
    }
}

/// `GET /health/live`: the process serves requests.
async fn live() -> Response {
    json(StatusCode::OK, &serde_json::json!({ "status": "live" }))
}

/// `GET /health/ready`: 200 once start-up is complete and until shutdown
/// begins; 503 with the reason otherwise.
async fn ready(State(st): State<Shared>) -> Response {
    match st.health.not_ready() {
        None => json(StatusCode::OK, &serde_json::json!({ "status": "ready" })),
        Some(why) => json(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({ "status": "not ready", "reason": why }),
        ),
    }
}

/// `GET /metrics`: the OpenMetrics text format, which `Metrics::encode`
/// writes (counter families named without `_total`, `# EOF` at the end):
/// served as such, Prometheus keeps the metric types.
async fn metrics(State(st): State<Shared>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        )],
        st.env.metrics.encode(),
    )
        .into_response()
}

/// `GET /api/openapi.json`.
async fn openapi_document(State(st): State<Shared>) -> Response {
    json(StatusCode::OK, &openapi::document(&st.extensions.openapi))
}
