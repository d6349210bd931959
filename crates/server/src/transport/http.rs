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
//! Plain `ws:` connections count as encrypted for `[c2s] require_tls` only
//! from loopback addresses and only when `[http] secure_loopback` is on
//! (the default): a browser on the same machine, or a TLS-terminating proxy
//! in front of Starling. From anywhere else a plain WebSocket gets no SASL
//! mechanisms while TLS is required; use the `tls = true` listener.

use super::bosh::{self, BoshRegistry, NS_HTTPBIND};
use super::tls::TlsAcceptor;
use crate::c2s::{session, C2sShared};
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::Path as UrlPath;
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use bytes::Bytes;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use starling_proto::sasl::ChannelBindings;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

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
    limit: Arc<Semaphore>,
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

/// Serves one HTTP listener until the task is aborted.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    c2s: Arc<C2sShared>,
    shutdown: watch::Receiver<bool>,
    done: mpsc::Sender<()>,
    limit: Arc<Semaphore>,
    secure_loopback: bool,
    web_client: Option<Arc<WebClient>>,
    bosh: Arc<BoshRegistry>,
    routes: Arc<HttpRoutes>,
) {
    let state = HttpState {
        bosh,
        c2s,
        shutdown,
        done,
        limit,
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
        let _ = tcp.set_nodelay(true);
        let secure = tls.is_some();
        let app = router
            .clone()
            .layer(Extension(ConnectInfo(peer)))
            .layer(Extension(Tls(secure)));
        let tls = tls.clone();
        let c2s = state.c2s.clone();
        let negotiation = state.c2s.negotiation_timeout;
        tokio::spawn(async move {
            let result = match tls {
                None => {
                    let app = app.layer(Extension(Bindings(None)));
                    serve_connection(tcp, app).await
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
                    serve_connection(stream, app).await
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
/// allowed) until the client closes it. Every HTTP listener (these and the
/// admin listener, `crate::admin`) serves its connections here.
pub(crate) async fn serve_connection<I>(io: I, app: Router) -> Result<(), hyper::Error>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    hyper::server::conn::http1::Builder::new()
        // hyper's read buffer grows to ~400 KiB by default while a request
        // body arrives faster than it is consumed: with 100 uploads in
        // flight that was most of +80 MiB (docs/benchmarks.md
        // 2026-11-26). Bodies are streamed anyway.
        .max_buf_size(HTTP_READ_BUFFER)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(app))
        .with_upgrades()
        .await
}

/// `GET /xmpp-websocket`: the RFC 7395 opening handshake. The client must
/// offer the `xmpp` subprotocol (§3.1).
async fn websocket(
    State(st): State<HttpState>,
    Extension(ConnectInfo(peer)): Extension<ConnectInfo<SocketAddr>>,
    Extension(Tls(tls)): Extension<Tls>,
    Extension(Bindings(bindings)): Extension<Bindings>,
    ws: WebSocketUpgrade,
) -> Response {
    let ws = ws.protocols(["xmpp"]);
    if ws.selected_protocol().is_none() {
        return (
            StatusCode::BAD_REQUEST,
            "XMPP over WebSocket needs the 'xmpp' subprotocol (Sec-WebSocket-Protocol: xmpp, RFC 7395 §3.1)\n",
        )
            .into_response();
    }
    if *st.shutdown.borrow() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down\n",
        )
            .into_response();
    }
    let Ok(permit) = st.limit.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many connections; try again later\n",
        )
            .into_response();
    };
    let secure = tls || (st.secure_loopback && peer.ip().is_loopback());
    let max = st.c2s.limits.max_stanza_bytes;
    // Small buffers: an idle session should not hold tungstenite's 128 KiB
    // defaults. Messages up to twice the stanza limit are read (and then
    // refused with <policy-violation/>); larger ones end the connection.
    ws.read_buffer_size(1024)
        .write_buffer_size(0)
        .max_message_size(max.saturating_mul(2))
        .max_frame_size(max.saturating_mul(2))
        .on_upgrade(move |socket| serve(st, socket, peer, secure, bindings, permit))
}

async fn serve(
    st: HttpState,
    socket: axum::extract::ws::WebSocket,
    peer: SocketAddr,
    secure: bool,
    bindings: Option<Arc<ChannelBindings>>,
    permit: OwnedSemaphorePermit,
) {
    session::run_websocket(st.c2s, socket, peer, secure, bindings, st.shutdown).await;
    drop(permit);
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
    body: Bytes,
) -> Response {
    let terminate = |c: &str| {
        bosh_reply(format!(
            "<body xmlns='{NS_HTTPBIND}' type='terminate' condition='{c}'/>"
        ))
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
    ) {
        Ok(x) => x,
        Err(t) => return bosh_reply(t),
    };
    let creation = start.is_some();
    if let Some(conn) = start {
        if *st.shutdown.borrow() {
            return terminate("system-shutdown");
        }
        let Ok(permit) = st.limit.clone().try_acquire_owned() else {
            return terminate("remote-connection-failed");
        };
        let (c2s, shutdown, done) = (st.c2s.clone(), st.shutdown.clone(), st.done.clone());
        tokio::spawn(async move {
            session::run_bosh(c2s, conn, peer, shutdown).await;
            drop(permit);
            drop(done);
        });
    }
    bosh_reply(bosh::respond(&session, rid, &el, body.len(), creation).await)
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
