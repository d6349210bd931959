//! HTTP listeners: XMPP over WebSocket (RFC 7395) at `/xmpp-websocket` and
//! connection-method discovery (XEP-0156) at `/.well-known/host-meta` and
//! `/.well-known/host-meta.json`.
//!
//! The stack is axum on hyper (HTTP/1.1), chosen because later issues put
//! BOSH, metrics, the admin API and file upload on the same listeners
//! (ARCHITECTURE.md, "Dependency choices"). Each accepted TCP connection
//! is served by its own task (TLS first on a `tls = true` listener); an
//! upgraded WebSocket becomes an ordinary c2s session
//! ([`session::run_websocket`]) with the same negotiation, modules and
//! shutdown as a TCP one.
//!
//! Modules add routes of their own through [`HttpRoutes`] (file upload at
//! `/upload`; later the admin API and metrics): each mounts an axum
//! `Router` under a path prefix of its own while it starts, and every
//! listener serves it beside the built-in paths.
//!
//! Every connection is admitted through the client listeners' gate
//! ([`super::gate`]) at accept and holds its ticket until the socket
//! closes; an upgraded WebSocket keeps the ticket of its connection (one
//! slot, not two), and a BOSH session takes one of its own (it outlives
//! its HTTP connections, and one connection could otherwise open any
//! number of them). [`serve_connection`] bounds every HTTP listener's
//! connections in time (`[http]` request_head_timeout_secs,
//! keepalive_timeout_secs, body_timeout_secs): a BOSH long-poll and an
//! open WebSocket are not cut by them (the first is a request in flight,
//! the second is no longer HTTP).
//!
//! Plain `ws:` connections count as encrypted for `[c2s] require_tls` only
//! from loopback addresses and only when `[http] secure_loopback` is on
//! (the default): a browser on the same machine, or a TLS-terminating proxy
//! in front of Starling. From anywhere else a plain WebSocket gets no SASL
//! mechanisms while TLS is required; use the `tls = true` listener.

use super::bosh::{self, BoshRegistry, NS_HTTPBIND};
use super::gate::{Door, Ticket};
use super::tls::TlsAcceptor;
use super::websocket;
use crate::c2s::{session, C2sShared};
use axum::body::Body;
use axum::extract::Path as UrlPath;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use bytes::Bytes;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use starling_proto::sasl::ChannelBindings;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

/// The path of the WebSocket endpoint.
pub const WEBSOCKET_PATH: &str = "/xmpp-websocket";
/// The path of the BOSH endpoint (XEP-0206).
pub const BOSH_PATH: &str = "/http-bind";

/// Paths of the listener's own endpoints, which no module may mount under.
const RESERVED_PREFIXES: &[&str] = &[WEBSOCKET_PATH, BOSH_PATH, "/.well-known", "/converse"];

/// The extension point for HTTP routes of modules: the server provides one
/// to the modules while they start (`HookRegistry::provide`), a module
/// mounts its routes with [`HttpRoutes::mount`]
/// (`reg.provided::<HttpRoutes>()`), and every HTTP listener then serves
/// them. A module's router carries its own state (`Router::with_state`)
/// and sees paths below its prefix; requests have the `ConnectInfo` of
/// the peer as an extension.
///
/// A prefix belongs to one module, like a service address: a second mount
/// of the same prefix, or one under the listener's own paths, stops
/// start-up.
pub struct HttpRoutes {
    /// The bound listeners and whether each is HTTPS, in configuration
    /// order, for modules that derive their public URLs from them.
    listeners: Vec<(SocketAddr, bool)>,
    /// (module, prefix, routes) in mount order.
    mounts: Vec<(&'static str, String, Router)>,
}

impl HttpRoutes {
    /// An empty set of routes for these listeners.
    pub fn new(listeners: Vec<(SocketAddr, bool)>) -> HttpRoutes {
        HttpRoutes {
            listeners,
            mounts: Vec::new(),
        }
    }

    /// The HTTP listeners (actual addresses) and whether each is HTTPS;
    /// empty when `[http] listen` is.
    pub fn listeners(&self) -> &[(SocketAddr, bool)] {
        &self.listeners
    }

    /// Serves `routes` under `prefix` (`/name`, one or more segments of
    /// lowercase letters, digits, `-` and `_`) on every HTTP listener.
    ///
    /// # Panics
    /// If the prefix is malformed, lies under the listener's own paths or
    /// is already mounted: a configuration that cannot work.
    pub fn mount(&mut self, module: &'static str, prefix: &str, routes: Router) {
        let well_formed = prefix.len() > 1
            && prefix.starts_with('/')
            && prefix[1..].split('/').all(|seg| {
                !seg.is_empty()
                    && seg
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_".contains(&b))
            });
        assert!(
            well_formed,
            "module {module}: HTTP prefix {prefix:?} must be /name (lowercase letters, digits, '-', '_')"
        );
        let overlaps = |a: &str, b: &str| {
            let under = |x: &str, y: &str| x == y || x.starts_with(&format!("{y}/"));
            under(a, b) || under(b, a)
        };
        if let Some(r) = RESERVED_PREFIXES.iter().find(|r| overlaps(prefix, r)) {
            panic!("module {module}: HTTP prefix {prefix:?} overlaps the listener's own {r}");
        }
        if let Some((other, p, _)) = self.mounts.iter().find(|(_, p, _)| overlaps(prefix, p)) {
            panic!("modules {other} and {module} both claim the HTTP prefix {p:?} / {prefix:?}");
        }
        self.mounts.push((module, prefix.to_owned(), routes));
    }

    /// `router` with every mounted module's routes.
    fn apply(&self, mut router: Router) -> Router {
        for (_, prefix, routes) in &self.mounts {
            router = router.nest(prefix, routes.clone());
        }
        router
    }

    /// The mounted prefixes with their modules (for the start-up log).
    pub fn mounted(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.mounts.iter().map(|(m, p, _)| (*m, p.as_str()))
    }
}

/// What every HTTP request handler can reach.
#[derive(Clone)]
struct HttpState {
    c2s: Arc<C2sShared>,
    shutdown: watch::Receiver<bool>,
    /// Held by every session; shutdown waits until all are dropped.
    done: mpsc::Sender<()>,
    /// Where BOSH sessions take their tickets (the client gate).
    bosh_door: Arc<Door>,
    secure_loopback: bool,
    /// The web chat's files, when it is served.
    web_client: Option<Arc<WebClient>>,
    /// BOSH sessions by sid.
    bosh: Arc<BoshRegistry>,
}

/// The Converse.js web chat (`[http] web_client`).
pub(crate) struct WebClient {
    /// Converse.js's `dist` directory.
    pub dir: PathBuf,
    /// The domain its login form is locked to.
    pub domain: String,
}

/// Whether a request came over TLS (a per-connection request extension).
#[derive(Clone, Copy)]
struct Tls(bool);

/// The channel bindings of the request's TLS connection, if any.
#[derive(Clone)]
struct Bindings(Option<Arc<ChannelBindings>>);

/// The gate ticket of the request's connection: an upgraded WebSocket
/// keeps it for as long as it lives.
#[derive(Clone)]
struct ConnTicket(Arc<Ticket>);

/// The time bounds of every HTTP connection (`[http]`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct HttpTimeouts {
    /// From when a connection waits for a request to the end of its head.
    pub head: Duration,
    /// Idle between requests, after the first.
    pub keepalive: Duration,
    /// No byte of a request body while it is read; also the grace before
    /// `body_min_rate` applies.
    pub body: Duration,
    /// Bytes per second a request body must average, over the time spent
    /// waiting for it, beyond the `body` grace; 0: no minimum.
    pub body_min_rate: u64,
}

/// Serves one HTTP listener until the task is aborted.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    c2s: Arc<C2sShared>,
    shutdown: watch::Receiver<bool>,
    done: mpsc::Sender<()>,
    gate: super::gate::Gate,
    timeouts: HttpTimeouts,
    secure_loopback: bool,
    web_client: Option<Arc<WebClient>>,
    bosh: Arc<BoshRegistry>,
    routes: Arc<HttpRoutes>,
) {
    let door = gate.door("http");
    let state = HttpState {
        bosh,
        c2s,
        shutdown,
        done,
        bosh_door: Arc::new(gate.door("bosh")),
        secure_loopback,
        web_client,
    };
    let mut router = Router::new();
    if state.web_client.is_some() {
        router = router
            .route("/", get(web_index))
            .route("/converse/{*path}", get(web_file));
    }
    let router = router
        .route(WEBSOCKET_PATH, get(websocket))
        .route(
            BOSH_PATH,
            post(bosh_request).get(bosh_info).options(bosh_preflight),
        )
        .route("/.well-known/host-meta", get(host_meta_xml))
        .route("/.well-known/host-meta.json", get(host_meta_json))
        .with_state(state.clone());
    let router = routes.apply(router);
    let mut backoff = super::tcp::AcceptBackoff::default();
    loop {
        let (tcp, peer) = super::tcp::accept(&listener, &mut backoff, "http").await;
        let Ok(ticket) = door.admit(peer) else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let secure = tls.is_some();
        let app = router
            .clone()
            .layer(Extension(ConnectInfo(peer)))
            .layer(Extension(Tls(secure)))
            .layer(Extension(ConnTicket(Arc::new(ticket))));
        let tls = tls.clone();
        let c2s = state.c2s.clone();
        let negotiation = state.c2s.negotiation_timeout;
        let stop = state.shutdown.clone();
        tokio::spawn(async move {
            let result = match tls {
                None => {
                    let app = app.layer(Extension(Bindings(None)));
                    serve_connection(tcp, app, timeouts, Some(stop)).await
                }
                Some(acceptor) => {
                    let mut stream =
                        match tokio::time::timeout(negotiation, acceptor.accept(tcp)).await {
                            Ok(Ok(s)) => s,
                            _ => {
                                tracing::debug!(%peer, "HTTPS handshake failed or timed out");
                                return;
                            }
                        };
                    // This TLS connection's channel bindings: a WebSocket
                    // upgraded on it is one stream on one connection, so
                    // SCRAM -PLUS works there as on TCP (not for BOSH,
                    // whose requests may come over several connections).
                    let bindings = c2s.tls.as_ref().map(|t| Arc::new(t.bindings(&mut stream)));
                    let app = app.layer(Extension(Bindings(bindings)));
                    serve_connection(stream, app, timeouts, Some(stop)).await
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "HTTP connection ended with an error");
            }
        });
    }
}

/// The most an HTTP connection buffers of what it reads (hyper's
/// `max_buf_size`; its minimum is 8 KiB), and so the largest request head
/// accepted (request line and headers; larger ones get 431). An upload's
/// body is copied out of it into a shared write buffer
/// (`modules::upload`), so with many uploads at once this is most of what
/// each one holds: 64 KiB here made 100 uploads of 1 MiB at once grow the
/// RSS by +23 MiB instead of +12 (docs/benchmarks.md 2026-11-28).
const HTTP_READ_BUFFER: usize = 16 * 1024;

/// Serves one accepted connection with `app` (HTTP/1.1, upgrades
/// allowed) until the client closes it or a timeout ends it. Every HTTP
/// listener (these and the admin listener, `crate::admin`) serves its
/// connections here.
///
/// - `timeouts.head`: hyper's header read timer. In hyper 1.x it starts
///   whenever the connection waits for a request head (right after
///   accept, and again as soon as a response is written on a keep-alive
///   connection) and stops at the head's end; past it hyper closes the
///   connection. So it bounds an idle new connection and a slow head.
/// - `timeouts.keepalive`: between requests (once one was answered and
///   none is in flight, a response body still streaming counts as in
///   flight) the connection is shut down gracefully after this long. As
///   the head timer runs from the same moment, the shorter of the two
///   bounds an idle keep-alive connection.
/// - `timeouts.body`: [`BodyTimeout`] on every request body.
///
/// A BOSH long-poll is a request in flight (neither timer runs while its
/// handler waits); an upgraded WebSocket leaves hyper altogether.
///
/// When `shutdown` (if any) turns true the connection is shut down
/// gracefully at once: an idle one closes, a request in flight is answered first. (The
/// connection holds the listener's state, and the server's shutdown waits
/// for that: without this, an idle keep-alive connection held a stop for
/// up to `keepalive_timeout_secs`.)
pub(crate) async fn serve_connection<I>(
    io: I,
    app: Router,
    timeouts: HttpTimeouts,
    shutdown: Option<watch::Receiver<bool>>,
) -> Result<(), hyper::Error>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (activity, mut idle) = watch::channel(Activity::default());
    let activity = Arc::new(activity);
    let app = app.layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            let in_flight = InFlight::begin(&activity);
            async move {
                let req = req.map(|b| axum::body::Body::new(BodyTimeout::new(b, timeouts)));
                let resp = next.run(req).await;
                resp.map(|b| {
                    axum::body::Body::new(Tracked {
                        inner: b,
                        _in_flight: in_flight,
                    })
                })
            }
        },
    ));
    let conn = hyper::server::conn::http1::Builder::new()
        // hyper's read buffer grows to ~400 KiB by default while a request
        // body arrives faster than it is consumed: with 100 uploads in
        // flight that was most of +80 MiB (docs/benchmarks.md
        // 2026-11-26). Bodies are streamed anyway.
        .max_buf_size(HTTP_READ_BUFFER)
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.head)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(app))
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => return r,
        _ = idle_for(&mut idle, timeouts.keepalive) => {}
        _ = stopping(shutdown) => {}
    }
    // Idle keep-alive or the server stopping: closes now unless a request
    // is in flight or slipped in meanwhile, which is then answered first.
    conn.as_mut().graceful_shutdown();
    conn.await
}

/// Returns once `shutdown` turns true; never without a signal (or once
/// its sender is gone: no stop can be announced any more).
async fn stopping(shutdown: Option<watch::Receiver<bool>>) {
    if let Some(mut rx) = shutdown {
        if rx.wait_for(|stop| *stop).await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

/// What a connection is doing, for the keep-alive timer.
#[derive(Clone, Copy, Default)]
struct Activity {
    /// Requests whose response is not fully written.
    in_flight: usize,
    /// When the last one ended; `None` before the first.
    idle_since: Option<Instant>,
}

/// One request in flight until dropped (with its response body).
struct InFlight(Arc<watch::Sender<Activity>>);

impl InFlight {
    fn begin(activity: &Arc<watch::Sender<Activity>>) -> InFlight {
        activity.send_modify(|a| a.in_flight += 1);
        InFlight(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.send_modify(|a| {
            a.in_flight -= 1;
            if a.in_flight == 0 {
                a.idle_since = Some(Instant::now());
            }
        });
    }
}

/// Returns once the connection has been idle between requests for `limit`.
async fn idle_for(rx: &mut watch::Receiver<Activity>, limit: Duration) {
    loop {
        let a = *rx.borrow_and_update();
        match a.idle_since {
            Some(since) if a.in_flight == 0 => {
                tokio::select! {
                    _ = tokio::time::sleep_until(since + limit) => return,
                    r = rx.changed() => if r.is_err() { std::future::pending::<()>().await },
                }
            }
            _ => {
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await
                }
            }
        }
    }
}

/// A response body that keeps its request counted as in flight until it
/// is written (or dropped).
struct Tracked {
    inner: axum::body::Body,
    _in_flight: InFlight,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// The error a request body ends with when it is too slow
/// (`[http] body_timeout_secs`, `body_min_bytes_per_sec`).
#[derive(Debug)]
pub(crate) struct BodyTimedOut(HttpTimeouts);

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "request body too slow: no byte for {} s, or under {} bytes/s ([http] body_timeout_secs, body_min_bytes_per_sec)",
            self.0.body.as_secs(),
            self.0.body_min_rate
        )
    }
}

impl std::error::Error for BodyTimedOut {}

/// A request body that fails with [`BodyTimedOut`] when it is too slow:
/// no byte for `body`, or, past a grace of `body`, an average under
/// `body_min_rate` bytes per second (as Apache's `mod_reqtimeout`
/// `body=…,MinRate=…`: one byte every 2 s is progress, and must still
/// end). Only time spent waiting for the client counts: while the handler
/// does not poll the body (a slow disk, say), no timer runs.
struct BodyTimeout {
    inner: axum::body::Body,
    limits: HttpTimeouts,
    /// Data bytes received so far.
    received: u64,
    /// Time spent waiting for the client, before the current wait.
    waited: Duration,
    /// The current wait: since when, and its deadline.
    pending: Option<(Instant, Pin<Box<tokio::time::Sleep>>)>,
    timed_out: bool,
}

impl BodyTimeout {
    fn new(inner: axum::body::Body, limits: HttpTimeouts) -> BodyTimeout {
        BodyTimeout {
            inner,
            limits,
            received: 0,
            waited: Duration::ZERO,
            pending: None,
            timed_out: false,
        }
    }

    /// How long the client may still take before the next frame.
    fn allowance(&self) -> Duration {
        let stall = self.limits.body;
        if self.limits.body_min_rate == 0 {
            return stall;
        }
        let earned =
            Duration::from_secs_f64(self.received as f64 / self.limits.body_min_rate as f64);
        (stall + earned).saturating_sub(self.waited).min(stall)
    }
}

impl hyper::body::Body for BodyTimeout {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        if this.timed_out {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some((since, _)) = this.pending.take() {
                    this.waited += since.elapsed();
                }
                if let Some(Ok(f)) = &frame {
                    if let Some(d) = f.data_ref() {
                        this.received += d.len() as u64;
                    }
                }
                Poll::Ready(frame)
            }
            Poll::Pending => {
                if this.pending.is_none() {
                    let now = Instant::now();
                    let deadline = now + this.allowance();
                    this.pending = Some((now, Box::pin(tokio::time::sleep_until(deadline))));
                }
                let Some((_, sleep)) = this.pending.as_mut() else {
                    return Poll::Pending;
                };
                if std::future::Future::poll(sleep.as_mut(), cx).is_ready() {
                    this.timed_out = true;
                    this.pending = None;
                    return Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut(this.limits)))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.timed_out || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// `GET /xmpp-websocket`: the RFC 7395 opening handshake (RFC 6455 §4.2).
/// The client must offer the `xmpp` subprotocol (§3.1). The upgrade is
/// done here rather than by axum's `WebSocketUpgrade` so that the
/// WebSocket runs over [`websocket::WsIo`], which counts and limits every
/// byte read before tungstenite buffers it.
async fn websocket(
    State(st): State<HttpState>,
    Extension(ConnectInfo(peer)): Extension<ConnectInfo<SocketAddr>>,
    Extension(Tls(tls)): Extension<Tls>,
    Extension(Bindings(bindings)): Extension<Bindings>,
    Extension(ConnTicket(ticket)): Extension<ConnTicket>,
    mut req: Request,
) -> Response {
    let headers = req.headers();
    let has_token = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    if !has_token(header::CONNECTION, "upgrade") || !has_token(header::UPGRADE, "websocket") {
        return (
            StatusCode::UPGRADE_REQUIRED,
            [(header::UPGRADE, HeaderValue::from_static("websocket"))],
            "this is an XMPP over WebSocket endpoint (RFC 7395): connect with a WebSocket client\n",
        )
            .into_response();
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_none_or(|v| v.as_bytes() != b"13")
    {
        return (
            StatusCode::BAD_REQUEST,
            [(
                header::SEC_WEBSOCKET_VERSION,
                HeaderValue::from_static("13"),
            )],
            "WebSocket version 13 (RFC 6455) is needed\n",
        )
            .into_response();
    }
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY) else {
        return (StatusCode::BAD_REQUEST, "Sec-WebSocket-Key is missing\n").into_response();
    };
    if !has_token(header::SEC_WEBSOCKET_PROTOCOL, "xmpp") {
        return (
            StatusCode::BAD_REQUEST,
            "XMPP over WebSocket needs the 'xmpp' subprotocol (Sec-WebSocket-Protocol: xmpp, RFC 7395 §3.1)\n",
        )
            .into_response();
    }
    let accept = derive_accept_key(key.as_bytes());
    if *st.shutdown.borrow() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down\n",
        )
            .into_response();
    }
    let Some(on_upgrade) = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() else {
        return (
            StatusCode::BAD_REQUEST,
            "this connection cannot be upgraded\n",
        )
            .into_response();
    };
    // The WebSocket keeps its connection's gate ticket (one slot).
    let secure = tls || (st.secure_loopback && peer.ip().is_loopback());
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "WebSocket upgrade failed");
                return;
            }
        };
        let c2s = &st.c2s;
        let ws = websocket::server_stream(
            upgraded,
            c2s.read_limits(),
            c2s.preauth_stanza_bytes,
            c2s.limits.max_stanza_bytes,
            c2s.write_timeout,
        )
        .await;
        serve(st, ws, peer, secure, bindings, ticket).await;
    });
    (
        StatusCode::SWITCHING_PROTOCOLS,
        [
            (header::CONNECTION, HeaderValue::from_static("upgrade")),
            (header::UPGRADE, HeaderValue::from_static("websocket")),
            (
                header::SEC_WEBSOCKET_ACCEPT,
                HeaderValue::from_str(&accept).unwrap_or(HeaderValue::from_static("")),
            ),
            (
                header::SEC_WEBSOCKET_PROTOCOL,
                HeaderValue::from_static("xmpp"),
            ),
        ],
    )
        .into_response()
}

async fn serve(
    st: HttpState,
    socket: websocket::WsStream,
    peer: SocketAddr,
    secure: bool,
    bindings: Option<Arc<ChannelBindings>>,
    ticket: Arc<Ticket>,
) {
    session::run_websocket(st.c2s, socket, peer, secure, bindings, st.shutdown).await;
    drop(ticket);
    drop(st.done);
}

/// The WebSocket and BOSH URLs for a request, from its Host header
/// (XEP-0156 §3); `None` unless the host holds only host-name, IP-literal
/// and port characters (so the URLs need no escaping in XML or JSON).
pub(crate) fn endpoint_urls(headers: &HeaderMap, tls: bool) -> Option<(String, String)> {
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let ok = !host.is_empty()
        && host.len() <= 255
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b));
    let (ws, http) = if tls {
        ("wss", "https")
    } else {
        ("ws", "http")
    };
    ok.then(|| {
        (
            format!("{ws}://{host}{WEBSOCKET_PATH}"),
            format!("{http}://{host}{BOSH_PATH}"),
        )
    })
}

/// A cross-origin readable response with this content type.
fn public(content_type: &'static str, body: String) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                header::ACCESS_CONTROL_ALLOW_ORIGIN,
                HeaderValue::from_static("*"),
            ),
        ],
        body,
    )
        .into_response()
}

fn bad_host() -> Response {
    (StatusCode::BAD_REQUEST, "a valid Host header is needed\n").into_response()
}

/// `GET /.well-known/host-meta` (XEP-0156 §3, XRD).
async fn host_meta_xml(Extension(Tls(tls)): Extension<Tls>, headers: HeaderMap) -> Response {
    let Some((ws, bosh)) = endpoint_urls(&headers, tls) else {
        return bad_host();
    };
    public(
        "application/xrd+xml",
        format!(
            "<?xml version='1.0' encoding='utf-8'?>\n<XRD xmlns='http://docs.oasis-open.org/ns/xri/xrd-1.0'>\n  <Link rel='urn:xmpp:alt-connections:websocket' href='{ws}'/>\n  <Link rel='urn:xmpp:alt-connections:xbosh' href='{bosh}'/>\n</XRD>\n"
        ),
    )
}

/// `GET /.well-known/host-meta.json` (XEP-0156 §3, JRD).
async fn host_meta_json(Extension(Tls(tls)): Extension<Tls>, headers: HeaderMap) -> Response {
    let Some((ws, bosh)) = endpoint_urls(&headers, tls) else {
        return bad_host();
    };
    public(
        "application/json",
        format!(
            "{{\"links\":[{{\"rel\":\"urn:xmpp:alt-connections:websocket\",\"href\":\"{ws}\"}},{{\"rel\":\"urn:xmpp:alt-connections:xbosh\",\"href\":\"{bosh}\"}}]}}\n"
        ),
    )
}

/// `GET /`: the web chat page, configured for our domain and the
/// WebSocket of the listener the browser used.
async fn web_index(State(st): State<HttpState>) -> Response {
    let Some(web) = st.web_client.as_ref() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let html_headers = [
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        ),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    if !web.dir.join("converse.min.js").is_file() {
        let body = format!(
            "<!doctype html><meta charset='utf-8'><title>Starling</title><p>The web chat's files are not installed here ({}). Run <code>scripts/fetch-webclient.sh</code> (it needs npm) in the Starling source directory, or set <code>[http] web_client_dir</code>, then reload this page.</p>",
            html_escape(&web.dir.display().to_string())
        );
        return (StatusCode::SERVICE_UNAVAILABLE, html_headers, body).into_response();
    }
    // The domain is a validated JID domain (no quotes or markup).
    let domain = &web.domain;
    let body = format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Starling web chat — {domain}</title>
<link rel="stylesheet" href="/converse/converse.min.css">
<script type="module" src="/converse/converse.min.js"></script>
</head>
<body class="converse-fullscreen">
<noscript>The web chat needs JavaScript.</noscript>
<script type="module">
// WebSocket, or BOSH with "?bosh" in the address.
const endpoint = new URLSearchParams(location.search).has("bosh")
  ? {{ bosh_service_url: location.origin + "{BOSH_PATH}" }}
  : {{ websocket_url: (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "{WEBSOCKET_PATH}" }};
converse.initialize({{
  ...endpoint,
  assets_path: "/converse/",
  discover_connection_methods: false,
  locked_domain: "{domain}",
  view_mode: "fullscreen",
  allow_non_roster_messaging: true,
  auto_reconnect: true,
  theme: "dracula",
  loglevel: "warn"
}});
</script>
</body>
</html>
"#
    );
    (html_headers, body).into_response()
}

/// `GET /converse/…`: a file of Converse.js's `dist` directory. Only plain
/// path segments are accepted: no `..`, no hidden files, no backslashes.
async fn web_file(State(st): State<HttpState>, UrlPath(path): UrlPath<String>) -> Response {
    let Some(web) = st.web_client.as_ref() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let Some(rel) = safe_relative_path(&path) else {
        return (StatusCode::BAD_REQUEST, "bad path\n").into_response();
    };
    let file = web.dir.join(rel);
    match tokio::fs::read(&file).await {
        Ok(bytes) => (
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(content_type(&path)),
                ),
                (
                    header::CACHE_CONTROL,
                    HeaderValue::from_static("public, max-age=3600"),
                ),
            ],
            bytes,
        )
            .into_response(),
        Err(_) => (StatusCode::NOT_FOUND, "not found\n").into_response(),
    }
}

/// `path` (already percent-decoded) as a relative path of plain segments,
/// or `None` if any segment could leave the directory or is hidden.
pub(crate) fn safe_relative_path(path: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for seg in path.split('/') {
        let plain = !seg.is_empty() && !seg.starts_with('.') && !seg.contains(['\\', '\0', ':']);
        if !plain {
            return None;
        }
        out.push(seg);
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "html" => "text/html; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "woff" => "font/woff",
        "ttf" => "font/ttf",
        "wasm" => "application/wasm",
        "mp3" => "audio/mpeg",
        "ogg" => "audio/ogg",
        _ => "application/octet-stream",
    }
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn bosh_reply(body: String) -> Response {
    public("text/xml; charset=utf-8", body)
}

/// `POST /http-bind`: one BOSH request (XEP-0124, XEP-0206; see
/// `transport/bosh.rs`). Errors are `type='terminate'` bodies with their
/// condition (§17.2), over HTTP 200.
async fn bosh_request(
    State(st): State<HttpState>,
    Extension(ConnectInfo(peer)): Extension<ConnectInfo<SocketAddr>>,
    Extension(Tls(tls)): Extension<Tls>,
    body: Body,
) -> Response {
    let terminate = |c: &str| {
        bosh_reply(format!(
            "<body xmlns='{NS_HTTPBIND}' type='terminate' condition='{c}'/>"
        ))
    };
    // A body holds payloads of up to the stanza limit; some room for
    // several small ones.
    let limit = st.c2s.limits.max_stanza_bytes.saturating_mul(2);
    let body = match read_bosh_body(&st, body, limit).await {
        Ok(b) => b,
        Err(condition) => return terminate(condition),
    };
    let el = match bosh::parse_body(&body, st.c2s.limits) {
        Ok(el) => el,
        Err(condition) => return terminate(condition),
    };
    let secure = tls || (st.secure_loopback && peer.ip().is_loopback());
    let env = st.c2s.env.clone();
    let (session, rid, start) = match bosh::handle_request(
        &st.bosh,
        &el,
        |d| env.hosts.is_local(d),
        secure,
        st.c2s.read_limits(),
        st.c2s.bosh_max_pending_bytes,
    ) {
        Ok(x) => x,
        Err(t) => return bosh_reply(t),
    };
    let creation = start.is_some();
    if let Some(conn) = start {
        if *st.shutdown.borrow() {
            return terminate("system-shutdown");
        }
        let Ok(ticket) = st.bosh_door.admit(peer) else {
            return terminate("remote-connection-failed");
        };
        let (c2s, shutdown, done) = (st.c2s.clone(), st.shutdown.clone(), st.done.clone());
        tokio::spawn(async move {
            session::run_bosh(c2s, conn, peer, shutdown).await;
            drop(ticket);
            drop(done);
        });
    }
    bosh_reply(bosh::respond(&session, rid, &el, body.len(), creation).await)
}

/// Reads a BOSH request body: up to `[c2s] max_preauth_stanza_bytes`
/// unless it belongs to a session whose client has authenticated (its
/// `sid` is read from the `<body` start tag as soon as the body grows
/// past that), then up to `limit`. Past the limit in force the answer is
/// `policy-violation` (and an unauthenticated session ends): what an
/// unauthenticated request makes the server hold stays small, whatever
/// its Content-Length says.
async fn read_bosh_body(st: &HttpState, body: Body, limit: usize) -> Result<Vec<u8>, &'static str> {
    use futures_util::StreamExt;
    let mut allowed = st.c2s.preauth_stanza_bytes.min(limit);
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            return Err("bad-request");
        };
        buf.extend_from_slice(&chunk);
        if buf.len() <= allowed {
            continue;
        }
        let session = body_sid(&buf).and_then(|sid| st.bosh.get(sid));
        if allowed < limit && session.as_ref().is_some_and(|s| s.is_authenticated()) {
            allowed = limit;
        }
        if buf.len() > allowed {
            if let Some(s) = session.filter(|s| !s.is_authenticated()) {
                bosh::lose(&s, "policy-violation");
            }
            return Err("policy-violation");
        }
    }
    Ok(buf)
}

/// The `sid` attribute of the `<body` start tag at the head of a BOSH
/// request, once that tag is complete.
fn body_sid(buf: &[u8]) -> Option<&str> {
    let start = buf.windows(5).position(|w| w == b"<body")?;
    let tag = &buf[start..];
    let tag = &tag[..tag.iter().position(|&b| b == b'>')?];
    let mut i = 0;
    while let Some(at) = tag[i..].windows(3).position(|w| w == b"sid") {
        let at = i + at;
        i = at + 3;
        if !tag[at - 1].is_ascii_whitespace() {
            continue;
        }
        let rest = tag[i..].trim_ascii_start();
        let Some(rest) = rest.strip_prefix(b"=") else {
            continue;
        };
        let rest = rest.trim_ascii_start();
        let quote = *rest.first()?;
        if quote != b'\'' && quote != b'"' {
            return None;
        }
        let value = &rest[1..];
        let end = value.iter().position(|&b| b == quote)?;
        return std::str::from_utf8(&value[..end]).ok();
    }
    None
}

/// `GET /http-bind`: what this is, for a person who opens it.
async fn bosh_info() -> Response {
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"))],
        "This is Starling's BOSH endpoint (XEP-0124/XEP-0206): XMPP clients POST <body/> elements here.\n",
    )
        .into_response()
}

/// CORS preflight for browser clients on other origins.
async fn bosh_preflight() -> Response {
    (
        [
            (
                header::ACCESS_CONTROL_ALLOW_ORIGIN,
                HeaderValue::from_static("*"),
            ),
            (
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, OPTIONS"),
            ),
            (
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static("Content-Type"),
            ),
            (
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("86400"),
            ),
        ],
        "",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_prefixes_are_checked_when_mounted() {
        let mount = |prefixes: &[&str]| {
            let prefixes: Vec<String> = prefixes.iter().map(|p| p.to_string()).collect();
            std::panic::catch_unwind(move || {
                let mut routes = HttpRoutes::new(Vec::new());
                for p in &prefixes {
                    routes.mount("m", p, Router::new());
                }
                routes.mounted().count()
            })
            .ok()
        };
        assert_eq!(mount(&["/upload", "/admin/api", "/metrics"]), Some(3));
        for bad in [
            &["/"][..],
            &["upload"],
            &["/Upload"],
            &["/a//b"],
            &["/a/../b"],
            &["/http-bind"],
            &["/.well-known/x"],
            &["/converse"],
            &["/upload", "/upload"],
            &["/admin", "/admin/api"],
        ] {
            assert_eq!(mount(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn body_sid_reads_the_start_tag_only() {
        assert_eq!(
            body_sid(b"<body rid='1' xmlns='x' sid='abc'><message/>"),
            Some("abc")
        );
        assert_eq!(
            body_sid(b"<?xml version='1.0'?><body rid=\"1\"\nsid = \"a b\">"),
            Some("a b")
        );
        assert_eq!(body_sid(b"<body rid='1' xsid='a'>"), None);
        assert_eq!(body_sid(b"<body rid='1'><x sid='a'/>"), None);
        assert_eq!(body_sid(b"<body rid='1' sid='abc"), None);
        assert_eq!(body_sid(b"sid='a'"), None);
    }

    #[test]
    fn only_plain_relative_paths_are_served() {
        assert_eq!(
            safe_relative_path("webfonts/icons.woff2"),
            Some(PathBuf::from("webfonts/icons.woff2"))
        );
        for bad in [
            "../etc/passwd",
            "a/../../b",
            "./x",
            ".hidden",
            "a//b",
            "",
            "a\\..\\b",
            "/etc/passwd",
            "c:/x",
        ] {
            assert_eq!(safe_relative_path(bad), None, "{bad:?}");
        }
    }
}
