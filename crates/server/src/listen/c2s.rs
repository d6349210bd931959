//! The client listeners (`[[listen]]`): XMPP over TCP, with STARTTLS
//! (RFC 6120 §5) or direct TLS (XEP-0368); each admitted connection
//! becomes a c2s session task ([`session::run`]).

use super::accept_loop;
use crate::c2s::{session, C2sShared};
use crate::config::TlsMode;
use crate::transport::gate::Door;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

/// Serves one client listener until the task is aborted. Every session
/// holds `done` (shutdown waits until all are dropped) and its gate
/// ticket until it ends.
pub(crate) async fn serve(
    listener: TcpListener,
    mode: TlsMode,
    shared: Arc<C2sShared>,
    shutdown: watch::Receiver<bool>,
    done: mpsc::Sender<()>,
    door: Arc<Door>,
    keepalive: Option<Duration>,
) {
    accept_loop(listener, "c2s", &door, keepalive, None, |conn| {
        // Over a limit the connection was closed at once (the client's
        // reconnect backoff retries later).
        let Ok(conn) = conn else { return };
        let (shared, shutdown, done) = (shared.clone(), shutdown.clone(), done.clone());
        tokio::spawn(async move {
            session::run(
                shared,
                conn.tcp,
                conn.peer,
                mode == TlsMode::Direct,
                shutdown,
            )
            .await;
            drop(conn.ticket);
            drop(done);
        });
    })
    .await
}
