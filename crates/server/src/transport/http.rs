//! The HTTP transport: one accepted connection served by hyper (HTTP/1.1,
//! upgrades allowed) within time bounds ([`serve_connection`],
//! [`HttpTimeouts`]), and the extension point through which modules mount
//! routes of their own ([`HttpRoutes`]).
//!
//! The stack is axum on hyper, chosen because BOSH, metrics, the admin API
//! and file upload share the listeners (ARCHITECTURE.md, "Dependency
//! choices"). What the listeners serve on it is above this layer: the
//! client HTTP listener (XMPP over WebSocket, BOSH, host-meta, the web
//! chat) in `listen::http`, the admin listener in `listen::admin`.
//!
//! [`serve_connection`] bounds every HTTP connection in time (`[http]`
//! request_head_timeout_secs, keepalive_timeout_secs, body_timeout_secs):
//! a BOSH long-poll and an open WebSocket are not cut by them (the first
//! is a request in flight, the second is no longer HTTP).

use axum::Router;
use bytes::Bytes;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

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
    pub(crate) fn apply(&self, mut router: Router) -> Router {
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
}
