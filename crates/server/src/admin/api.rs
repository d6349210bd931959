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

use super::{error, json, rooms, Caller, SessionFacts, Shared, PROBE_MODULE};
use crate::accounts::{self, AccountError};
use crate::domains::{DomainError, DomainInfo, DomainSource};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{delete, get, patch, post, put, MethodRouter};
use axum::{Extension, Router};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json as j, Value};
use starling_core::hooks::TimerKey;
use starling_core::storage::{ArchiveId, DomainSettings, DomainState};
use starling_core::{CloseReason, SessionEntry};
use starling_proto::{BareJid, Element, Jid, Stanza, StreamError, StreamErrorCondition};
use std::collections::HashMap;
use std::time::Duration;

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
        ("get", "/api/v1/rooms", get(rooms::list_rooms)),
        ("post", "/api/v1/rooms", post(rooms::create_room)),
        ("get", "/api/v1/rooms/{jid}", get(rooms::get_room)),
        ("delete", "/api/v1/rooms/{jid}", delete(rooms::destroy_room)),
        (
            "put",
            "/api/v1/rooms/{jid}/affiliations/{user}",
            put(rooms::set_affiliation),
        ),
        (
            "post",
            "/api/v1/rooms/{jid}/messages",
            post(rooms::send_room_message),
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

/// What an operation answers: the JSON body, or an [`ApiError`].
pub(crate) type OpResult = Result<Value, ApiError>;

/// An error answer (small, unlike a `Response`, so `Result`s stay small).
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl axum::response::IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error(self.status, &self.message)
    }
}

pub(crate) fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, message)
}

pub(crate) fn storage_failed(e: impl std::fmt::Display) -> ApiError {
    tracing::error!(error = %e, "admin API: storage failed");
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "storage failed; see the server log",
    )
}

/// Logs a change made through the API: grep `admin action`.
fn audit(caller: &Caller, action: &str, target: &str) {
    tracing::info!(token = %caller.0, action, target, "admin action");
}

/// A JSON request body: 400 when it is not the expected object, 413 when
/// it is larger than `[admin] max_body_bytes`.
pub(crate) struct Body<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> axum::extract::FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            let status = e.status();
            let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
                "request body too large ([admin] max_body_bytes)".to_owned()
            } else {
                format!("cannot read the request body: {e}")
            };
            ApiError::new(status, message)
        })?;
        // An empty body is an empty object: every field is optional there.
        let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        serde_json::from_slice(bytes)
            .map(Body)
            .map_err(|e| bad(format!("the body is not the expected JSON object: {e}")))
    }
}

/// The query string's parameters, percent-decoded (`+` is a space).
pub(crate) fn query(raw: &Option<String>) -> Result<HashMap<String, String>, ApiError> {
    let mut out = HashMap::new();
    for pair in raw
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = percent_decode(k).ok_or_else(|| bad("malformed query string"))?;
        let v = percent_decode(v).ok_or_else(|| bad("malformed query string"))?;
        out.insert(k, v);
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// `limit` from the query: 1..=max, `default` when absent.
pub(crate) fn limit(q: &HashMap<String, String>, default: u32, max: u32) -> Result<u32, ApiError> {
    match q.get("limit") {
        None => Ok(default),
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| bad(format!("limit must be a number from 1 to {max}"))),
    }
}

/// An account's JID (`user@domain`, no resource).
pub(crate) fn account(s: &str) -> Result<BareJid, ApiError> {
    BareJid::new(s)
        .ok()
        .filter(|j| j.node().is_some())
        .ok_or_else(|| bad(format!("{s:?} is not an account JID (user@domain)")))
}

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

/// One page of a domain's accounts, by name (`domain` default: the first
/// configured); `next` is the `after` of the next page.
pub(crate) async fn users_page(
    st: &Shared,
    domain: Option<&str>,
    after: Option<&str>,
    limit: u32,
) -> OpResult {
    let domain = match domain {
        Some(d) => BareJid::new(d)
            .ok()
            .filter(|j| j.node().is_none())
            .map(|j| j.domain().as_str().to_owned())
            .ok_or_else(|| bad(format!("{d:?} is not a domain")))?,
        None => default_domain(st),
    };
    let after = after.filter(|a| !a.is_empty());
    let page = st
        .env
        .storage
        .accounts
        .list(&domain, after, limit)
        .await
        .map_err(storage_failed)?;
    let next = (page.len() == limit as usize)
        .then(|| page.last().cloned())
        .flatten();
    let users: Vec<String> = page.iter().map(|u| format!("{u}@{domain}")).collect();
    Ok(j!({ "domain": domain, "users": users, "next": next }))
}

/// `GET /api/v1/users?domain=&after=&limit=`.
async fn list_users(State(st): State<Shared>, RawQuery(raw): RawQuery) -> ApiResult {
    let q = query(&raw)?;
    let limit = limit(&q, 100, 1000)?;
    let v = users_page(
        &st,
        q.get("domain").map(String::as_str),
        q.get("after").map(String::as_str),
        limit,
    )
    .await?;
    Ok(json(StatusCode::OK, &v))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewUser {
    pub(crate) jid: String,
    pub(crate) password: Option<String>,
    #[serde(default)]
    pub(crate) force: bool,
}

/// The given password, or a generated one (then returned in the answer).
fn password_or_generated(given: Option<String>) -> Result<(String, bool), ApiError> {
    match given {
        Some(p) if p.is_empty() => Err(bad("empty password: leave it out to have one generated")),
        Some(p) => Ok((p, false)),
        None => Ok((starling_proto::random_id(20), true)),
    }
}

/// Creates an account of a served domain (configured, or added at run
/// time and enabled), or of any domain with `force`.
pub(crate) async fn user_create(st: &Shared, caller: &Caller, req: NewUser) -> OpResult {
    let jid = account(&req.jid)?;
    let domain = jid.domain().as_str();
    if !req.force && !served(st, domain) {
        let why = match st.domains.get(domain).await {
            Ok(d) if d.state == DomainState::Disabled => format!(
                "{domain} is disabled: enable it first (POST /api/v1/domains/{domain}/enable), or pass \"force\": true"
            ),
            Ok(d) if d.state == DomainState::Removing => format!("{domain} is being removed"),
            _ => format!(
                "{domain} is not served by this server (add it: POST /api/v1/domains, or [server] domains; or pass \"force\": true)"
            ),
        };
        return Err(bad(why));
    }
    let (password, generated) = password_or_generated(req.password)?;
    accounts::create(&st.env.storage, &jid, &password, st.iterations)
        .await
        .map_err(account_error)?;
    audit(caller, "user.create", jid.as_str());
    let mut body = j!({ "jid": jid.as_str() });
    if generated {
        body["password"] = j!(password);
    }
    Ok(body)
}

/// `POST /api/v1/users` `{"jid", "password"?, "force"?}`.
async fn create_user(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Body(req): Body<NewUser>,
) -> ApiResult {
    let v = user_create(&st, &caller, req).await?;
    Ok(json(StatusCode::CREATED, &v))
}

/// `GET /api/v1/users/{jid}`: whether it is banned, its sessions and its
/// offline queue's length.
pub(crate) async fn user_show(st: &Shared, jid: &str) -> OpResult {
    let jid = account(jid)?;
    existing(st, &jid).await?;
    let s = &st.env.storage;
    let disabled = s.accounts.is_disabled(&jid).await.map_err(storage_failed)?;
    let offline = s.offline.count(&jid).await.map_err(storage_failed)?;
    let sessions: Vec<String> = st
        .env
        .sessions
        .resources(&jid)
        .iter()
        .map(|e| e.jid().to_string())
        .collect();
    Ok(j!({
        "jid": jid.as_str(),
        "disabled": disabled,
        "sessions": sessions,
        "offline_messages": offline,
    }))
}

async fn get_user(State(st): State<Shared>, Path(jid): Path<String>) -> ApiResult {
    Ok(json(StatusCode::OK, &user_show(&st, &jid).await?))
}

/// Deletes an account through the running server (`Env::delete_account`:
/// rooms let go of the account first), then closes its sessions with
/// `<not-authorized/>`, as after an in-band cancellation (XEP-0077 §3.2).
pub(crate) async fn user_delete(st: &Shared, caller: &Caller, jid: &str) -> OpResult {
    let jid = account(jid)?;
    let existed = st.env.delete_account(&jid).await.map_err(storage_failed)?;
    if !existed {
        return Err(no_account(&jid));
    }
    audit(caller, "user.delete", jid.as_str());
    let reason = close_reason(
        StreamErrorCondition::NotAuthorized,
        "this account has been deleted",
    );
    let closed = close_all(st, &jid, reason).await;
    Ok(j!({ "jid": jid.as_str(), "deleted": true, "sessions_closed": closed }))
}

/// `DELETE /api/v1/users/{jid}`.
async fn delete_user(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(jid): Path<String>,
) -> ApiResult {
    Ok(json(
        StatusCode::OK,
        &user_delete(&st, &caller, &jid).await?,
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewPassword {
    password: Option<String>,
}

/// New SCRAM keys (and no FAST token survives it); open sessions stay.
/// Without a password one is generated and returned.
pub(crate) async fn user_password(
    st: &Shared,
    caller: &Caller,
    jid: &str,
    password: Option<String>,
) -> OpResult {
    let jid = account(jid)?;
    let (password, generated) = password_or_generated(password)?;
    accounts::set_password(&st.env.storage, &jid, &password, st.iterations)
        .await
        .map_err(account_error)?;
    audit(caller, "user.password", jid.as_str());
    let mut body = j!({ "jid": jid.as_str(), "password_changed": true });
    if generated {
        body["password"] = j!(password);
    }
    Ok(body)
}

/// `POST /api/v1/users/{jid}/password` `{"password"?}`.
async fn set_password(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(jid): Path<String>,
    Body(req): Body<NewPassword>,
) -> ApiResult {
    let v = user_password(&st, &caller, &jid, req.password).await?;
    Ok(json(StatusCode::OK, &v))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BanRequest {
    reason: Option<String>,
}

/// The account can no longer authenticate (`<account-disabled/>`, RFC
/// 6120 §6.5.1) and its sessions are closed with `<policy-violation/>`
/// (§4.9.3.14) and the reason.
pub(crate) async fn user_ban(
    st: &Shared,
    caller: &Caller,
    jid: &str,
    reason: Option<String>,
) -> OpResult {
    let jid = account(jid)?;
    set_disabled(st, &jid, true).await?;
    audit(caller, "user.ban", jid.as_str());
    let text = reason
        .filter(|r| !r.trim().is_empty())
        .unwrap_or_else(|| "this account has been disabled".to_owned());
    let closed = close_all(
        st,
        &jid,
        close_reason(StreamErrorCondition::PolicyViolation, &text),
    )
    .await;
    Ok(j!({ "jid": jid.as_str(), "disabled": true, "sessions_closed": closed }))
}

/// `POST /api/v1/users/{jid}/ban` `{"reason"?}`.
async fn ban(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(jid): Path<String>,
    Body(req): Body<BanRequest>,
) -> ApiResult {
    let v = user_ban(&st, &caller, &jid, req.reason).await?;
    Ok(json(StatusCode::OK, &v))
}

/// Lifts a ban.
pub(crate) async fn user_unban(st: &Shared, caller: &Caller, jid: &str) -> OpResult {
    let jid = account(jid)?;
    set_disabled(st, &jid, false).await?;
    audit(caller, "user.unban", jid.as_str());
    Ok(j!({ "jid": jid.as_str(), "disabled": false }))
}

/// `POST /api/v1/users/{jid}/unban`.
async fn unban(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(jid): Path<String>,
) -> ApiResult {
    Ok(json(StatusCode::OK, &user_unban(&st, &caller, &jid).await?))
}
/// `GET /api/v1/users/{jid}/offline?limit=`: the offline queue (XEP-0160),
/// oldest first, read without taking anything.
async fn offline(
    State(st): State<Shared>,
    Path(jid): Path<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult {
    let q = query(&raw)?;
    let jid = account(&jid)?;
    let limit = limit(&q, 100, 10_000)? as usize;
    existing(&st, &jid).await?;
    let all = st
        .env
        .storage
        .offline
        .fetch_all(&jid)
        .await
        .map_err(storage_failed)?;
    let messages: Vec<serde_json::Value> = all
        .iter()
        .take(limit)
        .map(|m| {
            j!({
                "id": m.id,
                "from": m.from,
                "stored_at": starling_proto::datetime::xep0082_datetime(
                    u128::try_from(m.stamp_millis).unwrap_or(0)),
                "stanza": m.stanza,
            })
        })
        .collect();
    Ok(json(
        StatusCode::OK,
        &j!({ "jid": jid.as_str(), "count": all.len(), "messages": messages }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PurgeRequest {
    before: Option<String>,
}

/// `POST /api/v1/users/{jid}/archive/purge` `{"before"?}`: deletes the
/// user's archived messages (all, or those before a XEP-0082 instant), as
/// `starling archive purge` does. Rows still in the write-behind queue
/// are written after it.
async fn purge_archive(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(jid): Path<String>,
    Body(req): Body<PurgeRequest>,
) -> ApiResult {
    let jid = account(&jid)?;
    let before = match req.before.as_deref() {
        None => None,
        Some(t) => {
            let micros = starling_proto::datetime::parse_xep0082(t).ok_or_else(|| {
                bad(format!(
                    "before {t:?} is not a XEP-0082 DateTime like 2026-01-31T00:00:00Z"
                ))
            })?;
            Some(ArchiveId::lower_bound(micros))
        }
    };
    let n = st
        .env
        .storage
        .archive
        .purge_user(&jid, before)
        .await
        .map_err(storage_failed)?;
    audit(&caller, "archive.purge", jid.as_str());
    Ok(json(
        StatusCode::OK,
        &j!({ "jid": jid.as_str(), "deleted": n }),
    ))
}

/// How long the session list waits for the sessions' own answers.
const PROBE_WAIT: Duration = Duration::from_millis(500);

/// Bound sessions by full JID after `after`, at most `limit`: this
/// node's, or (`user` given) that account's on every node.
pub(crate) async fn sessions_page(
    st: &Shared,
    user: Option<&str>,
    node: Option<u8>,
    after: &str,
    limit: usize,
) -> OpResult {
    let mut entries: Vec<(SessionEntry, Option<u64>)> = match user {
        Some(u) => {
            let jid = account(u)?;
            st.env
                .sessions
                .resources(&jid)
                .into_iter()
                .map(|e| (e, None))
                .collect()
        }
        // Every node's (this node's registry of the cluster is kept by
        // the bus's events), or one node's.
        None => st
            .table
            .sessions(node == Some(st.node))
            .into_iter()
            .map(|s| (s.entry, Some(s.bound_at)))
            .collect(),
    };
    entries.retain(|(e, _)| e.jid().as_str() > after && node.is_none_or(|n| e.session.node == n));
    entries.sort_by(|a, b| a.0.jid().as_str().cmp(b.0.jid().as_str()));
    let more = entries.len() > limit;
    entries.truncate(limit);
    // Ask this node's listed sessions for what only they know.
    let token = st.probe.open();
    let key = TimerKey {
        module: PROBE_MODULE,
        token,
    };
    let mut asked = 0;
    for (e, _) in &entries {
        if e.session.node == st.node && st.env.router.notify(&st.env, &e.session, key).await.is_ok()
        {
            asked += 1;
        }
    }
    let deadline = tokio::time::Instant::now() + PROBE_WAIT;
    while st.probe.answered(token) < asked && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let facts: HashMap<u64, SessionFacts> = st
        .probe
        .close(token)
        .into_iter()
        .map(|f| (f.id, f))
        .collect();
    let sessions: Vec<Value> = entries
        .iter()
        .map(|(e, bound_at)| {
            let mut v = j!({
                "jid": e.jid().as_str(),
                "node": e.session.node,
                "available": e.priority.is_some(),
                "priority": e.priority,
            });
            if let Some(us) = bound_at {
                v["since"] = j!(starling_proto::datetime::xep0082_datetime(u128::from(
                    us / 1000
                )));
            }
            if let Some(f) = (e.session.node == st.node)
                .then(|| facts.get(&e.session.id))
                .flatten()
            {
                v["ip"] = j!(f.peer.ip().to_string());
                v["port"] = j!(f.peer.port());
                v["tls"] = j!(f.secure);
                v["state"] = j!(f.state);
                v["transport"] = j!(f.transport);
                if let Some(s) = f.resumable_for_secs {
                    v["resumable_for_secs"] = j!(s);
                }
            }
            v
        })
        .collect();
    let next = more
        .then(|| entries.last().map(|(e, _)| e.jid().to_string()))
        .flatten();
    Ok(j!({ "node": st.node, "sessions": sessions, "next": next }))
}

/// `GET /api/v1/sessions?user=&after=&limit=`.
async fn list_sessions(State(st): State<Shared>, RawQuery(raw): RawQuery) -> ApiResult {
    let q = query(&raw)?;
    let limit = limit(&q, 100, 1000)? as usize;
    let after = q.get("after").map(String::as_str).unwrap_or_default();
    let node = match q.get("node").map(String::as_str) {
        None | Some("all") => None,
        Some("local") => Some(st.node),
        Some(n) => Some(
            n.parse::<u8>()
                .map_err(|_| bad(format!("node={n:?}: a node id (0-255), local or all")))?,
        ),
    };
    let v = sessions_page(&st, q.get("user").map(String::as_str), node, after, limit).await?;
    Ok(json(StatusCode::OK, &v))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KickRequest {
    jid: String,
    reason: Option<String>,
}

/// A full JID closes that session, a bare JID every session of the
/// account, with the stream error `<policy-violation/>` (RFC 6120
/// §4.9.3.14: the server's policy ends the stream; not `<reset/>`, which
/// asks the client to negotiate again at once) and the reason as its
/// text. The client may log in again; ban the account to keep it out.
pub(crate) async fn session_kick(
    st: &Shared,
    caller: &Caller,
    target: &str,
    reason: Option<String>,
) -> OpResult {
    let text = reason
        .filter(|r| !r.trim().is_empty())
        .unwrap_or_else(|| "closed by an administrator".to_owned());
    let reason = close_reason(StreamErrorCondition::PolicyViolation, &text);
    let not_a_jid = || {
        bad(format!(
            "{target:?} is not a session (user@domain/resource) or account JID"
        ))
    };
    let jid = Jid::new(target).map_err(|_| not_a_jid())?;
    let kicked: Vec<String> = match jid.try_into_full() {
        Ok(full) => match st.env.sessions.get(&full) {
            Some(e) if st.router.close_session(&e.session, reason) => vec![full.to_string()],
            _ => Vec::new(),
        },
        Err(bare) if bare.node().is_some() => {
            let list: Vec<String> = st
                .env
                .sessions
                .resources(&bare)
                .iter()
                .map(|e| e.jid().to_string())
                .collect();
            st.env.router.close_sessions(&st.env, &bare, reason).await;
            list
        }
        Err(_) => return Err(not_a_jid()),
    };
    if kicked.is_empty() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no session of {target} is bound"),
        ));
    }
    audit(caller, "session.kick", target);
    Ok(j!({ "kicked": kicked }))
}

/// `POST /api/v1/sessions/kick` `{"jid", "reason"?}`.
async fn kick(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Body(req): Body<KickRequest>,
) -> ApiResult {
    let v = session_kick(&st, &caller, &req.jid, req.reason).await?;
    Ok(json(StatusCode::OK, &v))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageRequest {
    to: String,
    body: String,
    #[serde(default = "chat")]
    r#type: String,
    subject: Option<String>,
}

fn chat() -> String {
    "chat".into()
}

/// `POST /api/v1/messages` `{"to", "body", "type"?, "subject"?}`: a message
/// from the server (its domain; the recipient's when that is served),
/// routed like any other (offline storage, archive, carbons apply).
/// `type` is `chat` (default), `normal` or `headline` (not stored
/// offline, RFC 6121 §5.2.2).
async fn send_message(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Body(req): Body<MessageRequest>,
) -> ApiResult {
    let to = Jid::new(&req.to).map_err(|_| bad(format!("{:?} is not a JID", req.to)))?;
    if !matches!(req.r#type.as_str(), "chat" | "normal" | "headline") {
        return Err(bad("type must be chat, normal or headline"));
    }
    if req.body.is_empty() {
        return Err(bad("empty body"));
    }
    let domain = if served(&st, to.domain().as_str()) {
        to.domain().as_str().to_owned()
    } else {
        default_domain(&st)
    };
    let from = Jid::new(&domain).map_err(|_| bad("no served domain"))?;
    let id = starling_proto::random_id(12);
    let mut el = Element::builder("message", starling_proto::ns::CLIENT)
        .attr("type", req.r#type.as_str())
        .attr("id", id.as_str())
        .build();
    if let Some(s) = req.subject.as_deref().filter(|s| !s.is_empty()) {
        el.append_child(
            Element::builder("subject", starling_proto::ns::CLIENT)
                .text(s)
                .build(),
        );
    }
    el.append_child(
        Element::builder("body", starling_proto::ns::CLIENT)
            .text(req.body.as_str())
            .build(),
    );
    st.env
        .route(Stanza::new(el, Some(from.clone()), Some(to.clone())))
        .await;
    audit(&caller, "message.send", to.as_str());
    Ok(json(
        StatusCode::ACCEPTED,
        &j!({ "to": to.as_str(), "from": from.as_str(), "id": id, "type": req.r#type }),
    ))
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

// ---- Domains (docs/domains.md), through `crate::domains::Domains`.

fn domain_error(e: DomainError) -> ApiError {
    let status = match &e {
        DomainError::InvalidName(..) | DomainError::BadSetting(_) => StatusCode::BAD_REQUEST,
        DomainError::Configured(_) | DomainError::Exists(_) | DomainError::Removing(_) => {
            StatusCode::CONFLICT
        }
        DomainError::NotFound(_) => StatusCode::NOT_FOUND,
        DomainError::Storage(e) => return storage_failed(e),
    };
    ApiError::new(status, e.to_string())
}

/// A domain as the API shows it.
fn domain_value(st: &Shared, d: &DomainInfo) -> Value {
    let mut v = j!({
        "name": d.name,
        "source": match d.source {
            DomainSource::Configured => "config",
            DomainSource::Stored => "stored",
        },
        "state": d.state.as_str(),
        "served": st.env.hosts.is_local(&d.name),
        "settings": d.settings,
        "created_at": d.created_at.map(|ms| starling_proto::datetime::xep0082_datetime(
            u128::try_from(ms).unwrap_or(0))),
    });
    if d.state == DomainState::Removing {
        // Progress of a removal this node runs (another node's is in its log).
        v["removal"] = j!({
            "running_here": st.domains.removal_progress(&d.name).is_some(),
            "accounts_deleted": st.domains.removal_progress(&d.name),
        });
    }
    v
}

/// Every domain: configured ones first, then stored ones by name, each
/// with its state and settings.
pub(crate) async fn domains_list(st: &Shared) -> OpResult {
    let list = st.domains.list().await.map_err(domain_error)?;
    let v: Vec<Value> = list.iter().map(|d| domain_value(st, d)).collect();
    Ok(j!({ "domains": v }))
}

/// `GET /api/v1/domains`.
async fn list_domains(State(st): State<Shared>) -> ApiResult {
    Ok(json(StatusCode::OK, &domains_list(&st).await?))
}

/// One domain (404 if neither configured nor stored).
pub(crate) async fn domain_show(st: &Shared, raw: &str) -> OpResult {
    let name = crate::domains::validate_name(raw).map_err(domain_error)?;
    let list = st.domains.list().await.map_err(domain_error)?;
    let d = list.iter().find(|d| d.name == name).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no domain {name} (GET /api/v1/domains lists them)"),
        )
    })?;
    Ok(domain_value(st, d))
}

/// `GET /api/v1/domains/{name}`.
async fn get_domain(State(st): State<Shared>, Path(name): Path<String>) -> ApiResult {
    Ok(json(StatusCode::OK, &domain_show(&st, &name).await?))
}

/// Applies a JSON object of settings to `s`, key by key, through
/// `domains::apply_setting` (as `starling domain set` does): `true`/`false`
/// are on/off, numbers and strings their text, `null` or `"default"`
/// remove the override.
pub(crate) fn apply_settings_json(
    s: &mut DomainSettings,
    given: &serde_json::Map<String, Value>,
) -> Result<(), ApiError> {
    for (key, value) in given {
        let text = match value {
            Value::Null => "default".to_owned(),
            Value::Bool(true) => "on".to_owned(),
            Value::Bool(false) => "off".to_owned(),
            Value::Number(n) => n.to_string(),
            Value::String(t) => t.clone(),
            // A list of names (disabled_modules): [] is "none".
            Value::Array(items) => {
                let names: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
                match names {
                    Some(n) if n.is_empty() => "none".to_owned(),
                    Some(n) => n.join(","),
                    None => {
                        return Err(bad(format!(
                            "setting {key:?}: a list of strings is expected"
                        )))
                    }
                }
            }
            _ => {
                return Err(bad(format!(
                "setting {key:?}: a string, number, boolean, list of strings or null is expected"
            )))
            }
        };
        crate::domains::apply_setting(s, &format!("{key}={text}")).map_err(domain_error)?;
    }
    Ok(())
}

/// A certificate named in settings must load (as the CLI checks).
async fn check_certificate(s: &DomainSettings) -> Result<(), ApiError> {
    if let Some((c, k)) = s.certificate_pair() {
        let (c, k) = (c.to_owned(), k.to_owned());
        tokio::task::spawn_blocking(move || crate::tls::TlsContext::load(&c, &k).map(|_| ()))
            .await
            .map_err(|e| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("checking the certificate failed: {e}"),
                )
            })?
            .map_err(|e| bad(format!("the certificate cannot be used: {e:#}")))?;
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewDomain {
    pub(crate) name: String,
    #[serde(default = "yes")]
    pub(crate) enabled: bool,
    #[serde(default)]
    pub(crate) settings: serde_json::Map<String, Value>,
}

fn yes() -> bool {
    true
}

/// Adds a domain (enabled unless `enabled` is false) with its settings;
/// this node serves it at once, the others within 2 s.
pub(crate) async fn domain_add(st: &Shared, caller: &Caller, req: NewDomain) -> OpResult {
    let name = crate::domains::validate_name(&req.name).map_err(domain_error)?;
    let mut settings = DomainSettings::default();
    apply_settings_json(&mut settings, &req.settings)?;
    check_certificate(&settings).await?;
    let d = st
        .domains
        .add(&name, req.enabled, settings)
        .await
        .map_err(domain_error)?;
    audit(caller, "domain.add", &d.name);
    domain_show(st, &d.name).await
}

/// `POST /api/v1/domains` `{"name", "enabled"?, "settings"?}`.
async fn add_domain(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Body(req): Body<NewDomain>,
) -> ApiResult {
    let v = domain_add(&st, &caller, req).await?;
    Ok(json(StatusCode::CREATED, &v))
}

/// Disables (`enable` false: its sessions close with `host-gone`, new
/// streams get `host-unknown`, its data stays) or enables a stored domain.
pub(crate) async fn domain_set_enabled(
    st: &Shared,
    caller: &Caller,
    raw: &str,
    enable: bool,
) -> OpResult {
    let name = crate::domains::validate_name(raw).map_err(domain_error)?;
    let (r, action) = if enable {
        (st.domains.enable(&name).await, "domain.enable")
    } else {
        (st.domains.disable(&name).await, "domain.disable")
    };
    r.map_err(domain_error)?;
    audit(caller, action, &name);
    domain_show(st, &name).await
}

/// `POST /api/v1/domains/{name}/disable`.
async fn disable_domain(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult {
    let v = domain_set_enabled(&st, &caller, &name, false).await?;
    Ok(json(StatusCode::OK, &v))
}

/// `POST /api/v1/domains/{name}/enable`.
async fn enable_domain(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult {
    let v = domain_set_enabled(&st, &caller, &name, true).await?;
    Ok(json(StatusCode::OK, &v))
}

/// Marks a stored domain `removing` (not served from now on) and lets the
/// server delete its data in the background; a configured domain is 409.
pub(crate) async fn domain_remove(st: &Shared, caller: &Caller, raw: &str) -> OpResult {
    let name = crate::domains::validate_name(raw).map_err(domain_error)?;
    st.domains.remove(&name).await.map_err(domain_error)?;
    audit(caller, "domain.remove", &name);
    Ok(j!({
        "name": name,
        "state": "removing",
        "status": format!("removal started: its sessions are closed and its data is deleted in the background; GET /api/v1/domains/{name} shows progress until it answers 404"),
    }))
}

/// `DELETE /api/v1/domains/{name}`: 202 Accepted.
async fn remove_domain(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult {
    let v = domain_remove(&st, &caller, &name).await?;
    Ok(json(StatusCode::ACCEPTED, &v))
}

/// Changes a stored domain's settings: `replace` sets exactly `given`
/// (every other key back to the default), else only the keys given
/// change (`null`/`"default"` removes one).
pub(crate) async fn domain_settings(
    st: &Shared,
    caller: &Caller,
    raw: &str,
    given: &serde_json::Map<String, Value>,
    replace: bool,
) -> OpResult {
    let name = crate::domains::validate_name(raw).map_err(domain_error)?;
    let mut s = if replace {
        DomainSettings::default()
    } else {
        st.domains.get(&name).await.map_err(domain_error)?.settings
    };
    apply_settings_json(&mut s, given)?;
    check_certificate(&s).await?;
    st.domains
        .set_settings(&name, s)
        .await
        .map_err(domain_error)?;
    audit(caller, "domain.settings", &name);
    domain_show(st, &name).await
}

/// `PUT /api/v1/domains/{name}/settings`: the whole settings object.
async fn replace_domain_settings(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Body(given): Body<serde_json::Map<String, Value>>,
) -> ApiResult {
    let v = domain_settings(&st, &caller, &name, &given, true).await?;
    Ok(json(StatusCode::OK, &v))
}

/// `PATCH /api/v1/domains/{name}/settings`: the keys to change.
async fn patch_domain_settings(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Body(given): Body<serde_json::Map<String, Value>>,
) -> ApiResult {
    let v = domain_settings(&st, &caller, &name, &given, false).await?;
    Ok(json(StatusCode::OK, &v))
}
