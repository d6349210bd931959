//! The admin API's account endpoints: list, create, show, delete, set a
//! password, ban and unban users; read and delete offline messages;
//! purge a user's archive.

use super::{
    account, account_error, audit, bad, close_all, close_reason, default_domain, existing, limit,
    no_account, query, served, set_disabled, storage_failed, ApiError, ApiResult, Body, OpResult,
};
use crate::accounts::{self};
use crate::admin::{json, Caller, Shared};
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::Extension;
use serde::Deserialize;
use serde_json::json as j;
use starling_core::storage::{ArchiveId, DomainState};
use starling_proto::{BareJid, StreamErrorCondition};

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
pub(super) async fn list_users(State(st): State<Shared>, RawQuery(raw): RawQuery) -> ApiResult {
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
pub(super) async fn create_user(
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

pub(super) async fn get_user(State(st): State<Shared>, Path(jid): Path<String>) -> ApiResult {
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
pub(super) async fn delete_user(
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
pub(super) struct NewPassword {
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
pub(super) async fn set_password(
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
pub(super) struct BanRequest {
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
pub(super) async fn ban(
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
pub(super) async fn unban(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(jid): Path<String>,
) -> ApiResult {
    Ok(json(StatusCode::OK, &user_unban(&st, &caller, &jid).await?))
}

/// `GET /api/v1/users/{jid}/offline?limit=`: the offline queue (XEP-0160),
/// oldest first, read without taking anything.
pub(super) async fn offline(
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
pub(super) struct PurgeRequest {
    before: Option<String>,
}

/// `POST /api/v1/users/{jid}/archive/purge` `{"before"?}`: deletes the
/// user's archived messages (all, or those before a XEP-0082 instant), as
/// `starling archive purge` does. Rows still in the write-behind queue
/// are written after it.
pub(super) async fn purge_archive(
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
