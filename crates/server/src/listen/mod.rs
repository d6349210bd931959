//! The listeners: the one layer that owns what accepts connections, above
//! the transports and below the sessions and services that serve them.
//!
//! ```text
//!   server.rs        the node: storage, modules, cluster, then these
//!   listen/          binds, accepts, admits through a gate, hands over:
//!     c2s.rs           [[listen]]       → c2s::session::run (TCP, TLS)
//!     http.rs          [[http.listen]]  → WebSocket / BOSH sessions,
//!                                         host-meta, web chat, module routes
//!     admin.rs         [admin] listen   → admin API, metrics, health
//!     (modules)        [modules.component] listen, [modules.proxy65] listen
//!                      → their own service, through [`bind`] and
//!                        [`accept_loop`] like the others
//!   transport/       bytes: TCP/TLS streams, WebSocket and BOSH framing,
//!                    HTTP serving, the XML stream (`Connection`), gates
//! ```
//!
//! Every listener is bound by [`bind`] (so a port in use says what to
//! change), accepts through [`accept_loop`] (back-off on accept errors,
//! admission through its gate's door — connection limits per listener and
//! per source — and socket options), and hands each admitted socket, with
//! its gate ticket, to the code that serves it. Transports never call a
//! session: the listener that accepted the bytes decides who gets them.
//! A new kind of listener (server-to-server is next) is a file here, or a
//! module that calls [`bind`] and [`accept_loop`].

pub(crate) mod admin;
pub(crate) mod c2s;
pub(crate) mod http;

use crate::transport::gate::{Door, Ticket};
use crate::transport::tcp::{accept, set_keepalive, AcceptBackoff};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A connection admitted by a listener's gate.
pub(crate) struct Accepted {
    /// The socket (`TCP_NODELAY` set).
    pub tcp: TcpStream,
    /// The peer (an IPv4 peer of a dual-stack listener as IPv4).
    pub peer: SocketAddr,
    /// Its place under the gate's limits: held for as long as the
    /// connection (or what it became) lives.
    pub ticket: Ticket,
}

/// Binds `addr` with a listen backlog of `backlog` (`[::]` on a host
/// without IPv6 falls back to `0.0.0.0` with a log line). The error says
/// what to do, naming the setting `key` (e.g. `[[listen]]`).
pub(crate) fn bind(addr: SocketAddr, backlog: u32, key: &str) -> anyhow::Result<TcpListener> {
    crate::transport::tcp::bind(addr, backlog).map_err(|(a, e)| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => format!(
                "another process (another Starling?) is listening on this port: stop it, or change the {key} address in the configuration"
            ),
            std::io::ErrorKind::PermissionDenied => {
                "ports below 1024 need privileges: use a higher port, or grant CAP_NET_BIND_SERVICE".to_owned()
            }
            _ => format!("check the {key} address in the configuration"),
        };
        anyhow::anyhow!("cannot listen on {a}: {e}; {hint}")
    })
}

/// Accepts connections on `listener` until `stop` turns true (without
/// one, until the task is aborted). Each is admitted through `door` —
/// over a limit it is closed at once, counted and logged by the gate, and
/// `serve` gets `Err(peer)` — or handed to `serve` with its ticket, with
/// `TCP_NODELAY` and, when given, TCP keepalive probes after `keepalive`
/// of silence. `serve` must not block: it spawns what serves the
/// connection. `label` names the listener in logs.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    label: &'static str,
    door: &Door,
    keepalive: Option<Duration>,
    stop: Option<watch::Receiver<bool>>,
    mut serve: impl FnMut(Result<Accepted, SocketAddr>),
) {
    let mut backoff = AcceptBackoff::default();
    let mut stop = stop;
    loop {
        let (tcp, peer) = tokio::select! {
            c = accept(&listener, &mut backoff, label) => c,
            _ = stopping(&mut stop) => return,
        };
        let Ok(ticket) = door.admit(peer) else {
            serve(Err(peer));
            continue;
        };
        let _ = tcp.set_nodelay(true);
        if let Some(idle) = keepalive {
            set_keepalive(&tcp, idle);
        }
        serve(Ok(Accepted { tcp, peer, ticket }));
    }
}

/// Returns once `stop` turns true (or its sender is gone); never without
/// one.
async fn stopping(stop: &mut Option<watch::Receiver<bool>>) {
    if let Some(rx) = stop {
        let _ = rx.wait_for(|s| *s).await;
        return;
    }
    std::future::pending().await
}
