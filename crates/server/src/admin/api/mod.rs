//! The admin API's endpoints, `/api/v1/…` (docs/admin.md; the OpenAPI
//! document in `openapi.rs` describes each). Handlers parse and check
//! their input first (JIDs through the `jid` crate, so a name that is no
//! JID is a 400 before anything reaches storage), then act through the
//! same paths as the rest of the server: `Env::delete_account`,
//! `accounts::create`/`set_password`, the router for kicks and messages.
//! Every change is logged at INFO as `admin action` with the token's name.
//!
//! Each endpoint is two functions: an operation (`user_create`,
//! `domain_remove`, …) that takes typed input and returns the answer's
//! JSON or an [`ApiError`], and a thin axum handler that extracts the
//! input and writes the answer. The web admin page (`web.rs`) calls the
//! same operations, so a change made there is checked, performed and
//! logged exactly as through the API.
//!
//! This file holds the route table, the errors and input helpers every
//! endpoint uses, and the server's statistics; the endpoints by resource:
//! `users.rs` (accounts, bans, offline messages, archives), `sessions.rs`
//! (sessions, kicks, messages from the server) and `domains.rs` (hosted
//! domains and their settings). Modules add theirs (the group-chat
//! rooms: `modules/muc/admin/api.rs`).

use super::{json, Shared};
use crate::accounts::AccountError;
pub(crate) use crate::modules::common::admin_api::{
    account, audit, bad, limit, query, storage_failed, ApiError, Body, OpResult,
};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{delete, get, patch, post, put, MethodRouter};
use axum::Router;
use serde_json::{json as j, Value};
use starling_core::CloseReason;
use starling_proto::{BareJid, StreamError, StreamErrorCondition};

mod domains;
mod sessions;
mod users;

use domains::{
    add_domain, disable_domain, enable_domain, get_domain, list_domains, patch_domain_settings,
    remove_domain, replace_domain_settings,
};
pub(crate) use domains::{domain_add, domain_remove, domain_set_enabled, domains_list, NewDomain};
use sessions::{kick, list_sessions, send_message};
pub(crate) use sessions::{session_kick, sessions_page};
use users::{
    ban, create_user, delete_user, get_user, list_users, offline, purge_archive, set_password,
    unban,
};
pub(crate) use users::{
    user_ban, user_create, user_delete, user_password, user_unban, users_page, NewUser,
};

/// Every route of the API: (method, path as written in the OpenAPI
/// document, handler). The router is built from this table, so the
/// OpenAPI test that walks it covers every route served.
pub(crate) fn table() -> Vec<(&'static str, &'static str, MethodRouter<Shared>)> {
    vec![
        ("get", "/api/v1/users", get(list_users)),
        ("post", "/api/v1/users", post(create_user)),
        ("get", "/api/v1/users/{jid}", get(get_user)),
        ("delete", "/api/v1/users/{jid}", delete(delete_user)),
        ("post", "/api/v1/users/{jid}/password", post(set_password)),
        ("post", "/api/v1/users/{jid}/ban", post(ban)),
        ("post", "/api/v1/users/{jid}/unban", post(unban)),
        ("get", "/api/v1/users/{jid}/offline", get(offline)),
        (
            "post",
            "/api/v1/users/{jid}/archive/purge",
            post(purge_archive),
        ),
        ("get", "/api/v1/sessions", get(list_sessions)),
        ("post", "/api/v1/sessions/kick", post(kick)),
        ("post", "/api/v1/messages", post(send_message)),
        ("get", "/api/v1/stats", get(stats)),
        ("get", "/api/v1/cluster", get(cluster)),
        ("get", "/api/v1/domains", get(list_domains)),
        ("post", "/api/v1/domains", post(add_domain)),
        ("get", "/api/v1/domains/{name}", get(get_domain)),
        ("delete", "/api/v1/domains/{name}", delete(remove_domain)),
        (
            "post",
            "/api/v1/domains/{name}/disable",
            post(disable_domain),
        ),
        ("post", "/api/v1/domains/{name}/enable", post(enable_domain)),
        (
            "put",
            "/api/v1/domains/{name}/settings",
            put(replace_domain_settings),
        ),
        (
            "patch",
            "/api/v1/domains/{name}/settings",
            patch(patch_domain_settings),
        ),
    ]
}

/// The API's router (the token check is layered on by [`super::routes`]).
pub(crate) fn routes() -> Router<Shared> {
    table()
        .into_iter()
        .fold(Router::new(), |r, (_, path, handler)| {
            r.route(path, handler)
        })
}

type ApiResult = Result<Response, ApiError>;

fn served(st: &Shared, domain: &str) -> bool {
    st.env.hosts.is_local(domain)
}

/// 404: there is no account `jid`.
fn no_account(jid: &BareJid) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("account {jid} does not exist"),
    )
}

/// Bans or unbans account `jid` in storage (404 if there is none).
async fn set_disabled(st: &Shared, jid: &BareJid, disabled: bool) -> Result<(), ApiError> {
    let found = st
        .env
        .storage
        .accounts
        .set_disabled(jid, disabled)
        .await
        .map_err(storage_failed)?;
    if found {
        Ok(())
    } else {
        Err(no_account(jid))
    }
}

/// The account must exist (404 otherwise).
async fn existing(st: &Shared, jid: &BareJid) -> Result<(), ApiError> {
    match st.env.storage.accounts.exists(jid).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(no_account(jid)),
        Err(e) => Err(storage_failed(e)),
    }
}

fn account_error(e: AccountError) -> ApiError {
    match e {
        AccountError::BadPassword | AccountError::Unstable(..) => bad(e.to_string()),
        AccountError::Exists(_) => ApiError::new(StatusCode::CONFLICT, e.to_string()),
        AccountError::NotFound(_) => ApiError::new(StatusCode::NOT_FOUND, e.to_string()),
        AccountError::Storage(e) => storage_failed(e),
    }
}

fn close_reason(condition: StreamErrorCondition, text: &str) -> CloseReason {
    CloseReason::Error(Box::new(StreamError::with_text(condition, text)))
}

/// Closes every session of `jid`; returns how many this node knew of.
async fn close_all(st: &Shared, jid: &BareJid, reason: CloseReason) -> usize {
    let n = st.env.sessions.resources(jid).len();
    st.env.router.close_sessions(&st.env, jid, reason).await;
    n
}

/// The default domain: the first configured.
fn default_domain(st: &Shared) -> String {
    st.configured.first().cloned().unwrap_or_default()
}

/// Version, node, uptime, domains, sessions, storage and its queues.
pub(crate) fn stats_value(st: &Shared) -> Value {
    let queues: serde_json::Map<String, Value> = st
        .env
        .metrics
        .write_behind
        .queues()
        .into_iter()
        .map(|(name, q)| {
            (
                name,
                j!({
                    "queued": q.queued.get(),
                    "written": q.written.get(),
                    "dropped": q.dropped.get(),
                }),
            )
        })
        .collect();
    j!({
        "version": env!("CARGO_PKG_VERSION"),
        "node": st.node,
        "uptime_secs": st.started.elapsed().as_secs(),
        "domains": st.env.hosts.list(),
        "sessions": {
            "this_node": st.table.local_count(),
            "all_nodes": st.env.sessions.count(),
        },
        "storage": st.env.storage.backend.describe(),
        "write_behind": queues,
        "pressure": st.env.pressure.is_high(),
        "cluster": st.cluster.is_some(),
    })
}

/// `GET /api/v1/stats`.
async fn stats(State(st): State<Shared>) -> ApiResult {
    Ok(json(StatusCode::OK, &stats_value(&st)))
}

/// The nodes this node knows (as `starling cluster status` shows them,
/// from this node's registry instead of listening to the bus), or
/// `{"enabled": false}` without `[cluster]`.
pub(crate) fn cluster_value(st: &Shared) -> Value {
    match &st.cluster {
        None => j!({ "enabled": false }),
        Some(c) => j!({
            "enabled": true,
            "this_node": c.node(),
            "nodes": c.status(),
            "unacknowledged_deliveries": c.pending_count(),
        }),
    }
}

/// `GET /api/v1/cluster`.
async fn cluster(State(st): State<Shared>) -> ApiResult {
    Ok(json(StatusCode::OK, &cluster_value(&st)))
}
