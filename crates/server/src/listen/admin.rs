//! The admin listener (`[admin] listen`, loopback by default): the admin
//! API, metrics and health (`crate::admin` builds the router).

use super::accept_loop;
use crate::transport::gate::Door;
use crate::transport::http::{serve_connection, HttpTimeouts};
use axum::{Extension, Router};
use std::sync::Arc;
use tokio::net::TcpListener;

/// Serves one admin listener until the task is aborted. Connections are
/// admitted through the admin gate (`[admin] max_connections`, and
/// `[server] max_connections_per_ip`) and bounded in time by the `[http]`
/// timeouts, like every HTTP listener's.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    door: Arc<Door>,
    timeouts: HttpTimeouts,
) {
    accept_loop(listener, "admin", &door, None, None, |conn| {
        let Ok(conn) = conn else { return };
        let peer = conn.peer;
        let app = app
            .clone()
            .layer(Extension(axum::extract::ConnectInfo(peer)));
        tokio::spawn(async move {
            // The admin listener outlives the sessions at shutdown (health
            // checks see "stopping"); it is aborted last, not signalled.
            if let Err(e) = serve_connection(conn.tcp, app, timeouts, None).await {
                tracing::debug!(%peer, error = %e, "admin HTTP connection ended with an error");
            }
            drop(conn.ticket);
        });
    })
    .await
}
