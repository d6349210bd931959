//! The client HTTP listener (`[[http.listen]]`): XMPP over WebSocket
//! (RFC 7395) at `/xmpp-websocket`, BOSH (XEP-0124/0206) at `/http-bind`,
//! connection-method discovery (XEP-0156) at `/.well-known/host-meta` and
//! `/.well-known/host-meta.json`, the web chat, and the routes modules
//! mounted ([`HttpRoutes`]).
//!
//! Each accepted TCP connection is served by its own task (TLS first on a
//! `tls = true` listener) through the HTTP transport
//! ([`serve_connection`]); an upgraded WebSocket or a new BOSH session
//! becomes an ordinary c2s session ([`session::run_websocket`],
//! [`session::run_bosh`]) with the same negotiation, modules and shutdown
//! as a TCP one.
//!
//! Every connection is admitted through the client listeners' gate
//! (`transport::gate`) at accept and holds its ticket until the socket
//! closes; an upgraded WebSocket keeps the ticket of its connection (one
//! slot, not two), and a BOSH session takes one of its own (it outlives
//! its HTTP connections, and one connection could otherwise open any
//! number of them).
//!
//! Plain `ws:` connections count as encrypted for `[c2s] require_tls` only
//! from loopback addresses and only when `[http] secure_loopback` is on
//! (the default): a browser on the same machine, or a TLS-terminating proxy
//! in front of Starling. From anywhere else a plain WebSocket gets no SASL
//! mechanisms while TLS is required; use the `tls = true` listener.

use super::accept_loop;
use crate::c2s::{session, C2sShared};
use crate::config::HttpSection;
use crate::transport::bosh::{self, BoshRegistry, NS_HTTPBIND};
use crate::transport::gate::{Door, Gate, Ticket};
use crate::transport::http::{
    serve_connection, HttpRoutes, HttpTimeouts, BOSH_PATH, WEBSOCKET_PATH,
};
use crate::transport::tls::TlsAcceptor;
use crate::transport::websocket;
use axum::body::Body;
use axum::extract::Path as UrlPath;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use starling_proto::sasl::ChannelBindings;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

/// The time bounds of every HTTP listener (`[http]`; the admin
/// listener's too).
pub(crate) fn timeouts(http: &HttpSection) -> HttpTimeouts {
    HttpTimeouts {
        head: Duration::from_secs(http.request_head_timeout_secs),
        keepalive: Duration::from_secs(http.keepalive_timeout_secs),
        body: Duration::from_secs(http.body_timeout_secs),
        body_min_rate: http.body_min_bytes_per_sec,
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

/// What every client HTTP listener of the node shares.
#[derive(Clone)]
pub(crate) struct ClientHttp {
    /// What sessions share (WebSocket and BOSH sessions are c2s sessions).
    pub c2s: Arc<C2sShared>,
    /// Turns true when the server stops.
    pub shutdown: watch::Receiver<bool>,
    /// Held by every session; shutdown waits until all are dropped.
    pub done: mpsc::Sender<()>,
    /// The client listeners' gate (`[server] max_connections`, shared
    /// with the c2s listeners).
    pub gate: Gate,
    /// `[http]` time bounds.
    pub timeouts: HttpTimeouts,
    /// `[http] secure_loopback`.
    pub secure_loopback: bool,
    /// The web chat's files, when it is served.
    pub web_client: Option<Arc<WebClient>>,
    /// BOSH sessions by sid (one registry for every listener: a BOSH
    /// client may switch connections).
    pub bosh: Arc<BoshRegistry>,
    /// The routes modules mounted.
    pub routes: Arc<HttpRoutes>,
}

/// Serves one HTTP listener (HTTPS with `tls`) until the task is aborted.
pub(crate) async fn serve(listener: TcpListener, tls: Option<TlsAcceptor>, node: ClientHttp) {
    let door = node.gate.door("http");
    let state = HttpState {
        bosh: node.bosh,
        c2s: node.c2s,
        shutdown: node.shutdown,
        done: node.done,
        bosh_door: Arc::new(node.gate.door("bosh")),
        secure_loopback: node.secure_loopback,
        web_client: node.web_client,
    };
    let timeouts = node.timeouts;
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
    let router = node.routes.apply(router);
    accept_loop(listener, "http", &door, None, None, |conn| {
        let Ok(conn) = conn else { return };
        let peer = conn.peer;
        let secure = tls.is_some();
        let app = router
            .clone()
            .layer(Extension(ConnectInfo(peer)))
            .layer(Extension(Tls(secure)))
            .layer(Extension(ConnTicket(Arc::new(conn.ticket))));
        let tcp = conn.tcp;
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
    })
    .await
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
        serve_websocket(st, ws, peer, secure, bindings, ticket).await;
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

async fn serve_websocket(
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
