//! The admin API's session endpoints: list the sessions (with what only
//! this node's session tasks know, asked through `SessionProbe`), kick
//! one, and send a message from the server.

use super::{
    account, audit, bad, close_reason, default_domain, limit, query, served, ApiError, ApiResult,
    Body, OpResult,
};
use crate::admin::{json, Caller, SessionFacts, Shared, PROBE_MODULE};
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::Extension;
use serde::Deserialize;
use serde_json::{json as j, Value};
use starling_core::hooks::TimerKey;
use starling_core::SessionEntry;
use starling_proto::{Element, Jid, Stanza, StreamErrorCondition};
use std::collections::HashMap;
use std::time::Duration;

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
pub(super) async fn list_sessions(State(st): State<Shared>, RawQuery(raw): RawQuery) -> ApiResult {
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
pub(super) struct KickRequest {
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
pub(super) async fn kick(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Body(req): Body<KickRequest>,
) -> ApiResult {
    let v = session_kick(&st, &caller, &req.jid, req.reason).await?;
    Ok(json(StatusCode::OK, &v))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MessageRequest {
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
pub(super) async fn send_message(
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
