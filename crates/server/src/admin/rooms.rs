//! Group-chat rooms (XEP-0045) in the admin API, `/api/v1/rooms…`
//! (docs/admin.md), as ejabberd's `muc_online_rooms`, `get_room_*`,
//! `create_room`, `destroy_room`, `set_room_affiliation` and MongooseIM's
//! MUC admin API offer them.
//!
//! The admin knows no room internals: the group-chat module hands it a
//! [`RoomAdmin`] (`starling_core::admin`, the contract) when it starts, in the hook registry
//! (`reg.provide(Provided(…))`; the server takes it back after the modules
//! started, `server.rs`). Without the module (`[modules.muc] enabled =
//! false`) every endpoint here answers 404 saying so.
//!
//! Changes go to the room's own task as requests of the server acting as
//! the service's administrator (`modules/muc/admin.rs`), so the room's
//! rules, storage and stanzas to occupants are those of an owner's XMPP
//! request, and the room's answer comes back to the handler. A room that
//! runs on another cluster node gets the request over the bus: the answer
//! is then 202 with that node, and the outcome is in that node's log.
//!
//! Input is checked here first (JIDs through the `jid` crate: 400), and
//! every change is logged as `admin action` like the other endpoints.

use super::api::{self, bad, ApiError, Body, OpResult};
use super::{json, Caller, Shared};
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;
use serde_json::json as j;
use starling_core::admin::{Applied, RoomAdmin, RoomChange, RoomError, RoomSummary};
use starling_proto::BareJid;
use std::sync::Arc;

fn room_error(e: RoomError) -> ApiError {
    match e {
        RoomError::NotFound(m) => ApiError::new(StatusCode::NOT_FOUND, m),
        RoomError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, m),
        RoomError::Invalid(m) => bad(m),
        RoomError::Unavailable(m) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, m),
    }
}

/// The module, or 404 when group chat is disabled.
fn service(st: &Shared) -> Result<&Arc<dyn RoomAdmin>, ApiError> {
    st.rooms.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "group chat is disabled ([modules.muc] enabled = false)",
        )
    })
}

/// A room's JID: `name@` a service of this server.
fn room_jid(rooms: &dyn RoomAdmin, s: &str) -> Result<BareJid, ApiError> {
    let jid = BareJid::new(s)
        .ok()
        .filter(|j| j.node().is_some())
        .ok_or_else(|| bad(format!("{s:?} is not a room JID (room@service)")))?;
    if !rooms.is_service(jid.domain().as_str()) {
        return Err(bad(format!(
            "{jid} is not on this server's group-chat service ({})",
            rooms.services().join(", ")
        )));
    }
    Ok(jid)
}

/// 404 for a room that does not exist.
fn no_room(jid: &BareJid) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("room {jid} does not exist"))
}

/// One page of rooms by service then name: every service of every served
/// domain, or `service`. `after` is the previous page's `next` (a room
/// JID).
pub(crate) async fn rooms_page(
    st: &Shared,
    service_name: Option<&str>,
    after: Option<&str>,
    limit: usize,
) -> OpResult {
    let rooms = service(st)?;
    let services = match service_name.filter(|s| !s.is_empty()) {
        Some(s) => {
            let d = BareJid::new(s)
                .ok()
                .filter(|j| j.node().is_none())
                .map(|j| j.domain().as_str().to_owned())
                .ok_or_else(|| bad(format!("{s:?} is not a service domain")))?;
            if !rooms.is_service(&d) {
                return Err(bad(format!(
                    "{d} is not this server's group-chat service ({})",
                    rooms.services().join(", ")
                )));
            }
            vec![d]
        }
        None => rooms.services(),
    };
    let after = match after.filter(|a| !a.is_empty()) {
        Some(a) => {
            let j = BareJid::new(a)
                .ok()
                .filter(|j| j.node().is_some())
                .ok_or_else(|| bad(format!("after {a:?} is not a room JID")))?;
            let node = j.node().map(|n| n.as_str().to_owned()).unwrap_or_default();
            Some((j.domain().as_str().to_owned(), node))
        }
        None => None,
    };
    let mut page: Vec<RoomSummary> = Vec::new();
    for svc in &services {
        let from = match &after {
            Some((s, _)) if svc < s => continue,
            Some((s, name)) if svc == s => Some(name.as_str()),
            _ => None,
        };
        let more = rooms
            .list(svc, from, limit + 1 - page.len())
            .await
            .map_err(room_error)?;
        page.extend(more);
        if page.len() > limit {
            break;
        }
    }
    let next = (page.len() > limit).then(|| {
        page.truncate(limit);
        page.last().map(|r| r.jid.clone())
    });
    Ok(j!({
        "service": service_name,
        "rooms": page,
        "next": next.flatten(),
    }))
}

/// `GET /api/v1/rooms?service=&after=&limit=`.
pub(crate) async fn list_rooms(
    State(st): State<Shared>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = api::query(&raw)?;
    let limit = api::limit(&q, 100, 1000)? as usize;
    let v = rooms_page(
        &st,
        q.get("service").map(String::as_str),
        q.get("after").map(String::as_str),
        limit,
    )
    .await?;
    Ok(json(StatusCode::OK, &v))
}

/// One room: configuration, affiliations, and occupants when it is
/// loaded on this node.
pub(crate) async fn room_show(st: &Shared, raw: &str) -> OpResult {
    let rooms = service(st)?;
    let jid = room_jid(rooms.as_ref(), raw)?;
    match rooms.show(&jid).await.map_err(room_error)? {
        Some(d) => Ok(serde_json::to_value(d).unwrap_or_default()),
        None => Err(no_room(&jid)),
    }
}

/// `GET /api/v1/rooms/{jid}`.
pub(crate) async fn get_room(
    State(st): State<Shared>,
    Path(jid): Path<String>,
) -> Result<Response, ApiError> {
    Ok(json(StatusCode::OK, &room_show(&st, &jid).await?))
}

/// Logs a change to a room: grep `admin action`.
fn audit(caller: &Caller, action: &str, room: &BareJid, detail: &str) {
    tracing::info!(token = %caller.0, action, target = %room, detail, "admin action");
}

/// The answer to an applied change: 200 with `body`, or 202 when the
/// room runs on another cluster node.
fn applied(
    room: &BareJid,
    a: Applied,
    mut body: serde_json::Value,
) -> (StatusCode, serde_json::Value) {
    match a {
        Applied::Done { id } => {
            if let Some(id) = id {
                body["id"] = j!(id);
            }
            (StatusCode::OK, body)
        }
        Applied::Forwarded { node } => (
            StatusCode::ACCEPTED,
            j!({
                "room": room.as_str(),
                "node": node,
                "status": format!("the room runs on cluster node {node}: the request was handed to it; its outcome is in that node's log (`administrator request from another cluster node handled`)"),
            }),
        ),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewRoom {
    pub(crate) jid: String,
    pub(crate) owner: String,
    pub(crate) name: Option<String>,
    #[serde(default = "yes")]
    pub(crate) persistent: bool,
    pub(crate) public: Option<bool>,
    pub(crate) members_only: Option<bool>,
}

fn yes() -> bool {
    true
}

/// Creates an unlocked room owned by `owner` (an account of this
/// server), nobody in it, with the service's new-room defaults changed by
/// the options (ejabberd's `create_room`). 409 if it exists.
pub(crate) async fn room_create(
    st: &Shared,
    caller: &Caller,
    req: NewRoom,
) -> Result<(StatusCode, serde_json::Value), ApiError> {
    let rooms = service(st)?;
    let jid = room_jid(rooms.as_ref(), &req.jid)?;
    let owner = api::account(&req.owner)?;
    if !st.env.hosts.is_local(owner.domain().as_str()) {
        return Err(bad(format!(
            "the owner {owner} is not an account of a domain this server serves"
        )));
    }
    match st.env.storage.accounts.exists(&owner).await {
        Ok(true) => {}
        Ok(false) => return Err(bad(format!("the owner {owner} has no account"))),
        Err(e) => return Err(api::storage_failed(e)),
    }
    let change = RoomChange::Create {
        owner: owner.clone(),
        name: req.name.unwrap_or_default(),
        persistent: req.persistent,
        public: req.public,
        members_only: req.members_only,
    };
    let a = rooms.change(&jid, change).await.map_err(room_error)?;
    audit(caller, "room.create", &jid, &format!("owner={owner}"));
    let (status, body) = applied(&jid, a, j!({}));
    if status == StatusCode::OK {
        let shown = room_show(st, jid.as_str())
            .await
            .unwrap_or_else(|_| j!({ "jid": jid.as_str() }));
        return Ok((StatusCode::CREATED, shown));
    }
    Ok((status, body))
}

/// `POST /api/v1/rooms` `{"jid", "owner", "name"?, "persistent"?,
/// "public"?, "members_only"?}`: 201 with the room.
pub(crate) async fn create_room(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Body(req): Body<NewRoom>,
) -> Result<Response, ApiError> {
    let (status, v) = room_create(&st, &caller, req).await?;
    Ok(json(status, &v))
}

/// Destroys a room as its owner would (§10.9): its occupants get
/// unavailable presence with `<destroy/>` and the reason; its stored
/// configuration, affiliations and archive are deleted.
pub(crate) async fn room_destroy(
    st: &Shared,
    caller: &Caller,
    raw: &str,
    reason: Option<String>,
) -> Result<(StatusCode, serde_json::Value), ApiError> {
    let rooms = service(st)?;
    let jid = room_jid(rooms.as_ref(), raw)?;
    let reason = reason.filter(|r| !r.trim().is_empty());
    let a = rooms
        .change(&jid, RoomChange::Destroy { reason })
        .await
        .map_err(room_error)?;
    audit(caller, "room.destroy", &jid, "");
    Ok(applied(
        &jid,
        a,
        j!({ "room": jid.as_str(), "destroyed": true }),
    ))
}

/// `DELETE /api/v1/rooms/{jid}?reason=`.
pub(crate) async fn destroy_room(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(jid): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = api::query(&raw)?;
    let (status, v) = room_destroy(&st, &caller, &jid, q.get("reason").cloned()).await?;
    Ok(json(status, &v))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AffiliationRequest {
    pub(crate) affiliation: String,
    pub(crate) reason: Option<String>,
}

/// Sets `user`'s affiliation (a bare JID, or a domain) as an owner's
/// `muc#admin` request does (§9–§10): occupants see the presence change,
/// an outcast is removed with status 301, a non-member of a members-only
/// room with 321. 409 when the room would keep no owner.
pub(crate) async fn room_affiliation(
    st: &Shared,
    caller: &Caller,
    raw: &str,
    user: &str,
    req: AffiliationRequest,
) -> Result<(StatusCode, serde_json::Value), ApiError> {
    let rooms = service(st)?;
    let jid = room_jid(rooms.as_ref(), raw)?;
    let target = BareJid::new(user).map_err(|_| {
        bad(format!(
            "{user:?} is not a bare JID (user@domain, or a domain)"
        ))
    })?;
    let affiliation = ["owner", "admin", "member", "outcast", "none"]
        .into_iter()
        .find(|a| *a == req.affiliation)
        .ok_or_else(|| {
            bad(format!(
                "affiliation {:?}: owner, admin, member, outcast or none",
                req.affiliation
            ))
        })?;
    let reason = req.reason.filter(|r| !r.trim().is_empty());
    let a = rooms
        .change(
            &jid,
            RoomChange::Affiliation {
                jid: target.clone(),
                affiliation,
                reason,
            },
        )
        .await
        .map_err(room_error)?;
    audit(
        caller,
        "room.affiliation",
        &jid,
        &format!("{target}={affiliation}"),
    );
    Ok(applied(
        &jid,
        a,
        j!({ "room": jid.as_str(), "jid": target.as_str(), "affiliation": affiliation }),
    ))
}

/// `PUT /api/v1/rooms/{jid}/affiliations/{user}` `{"affiliation",
/// "reason"?}`.
pub(crate) async fn set_affiliation(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((jid, user)): Path<(String, String)>,
    Body(req): Body<AffiliationRequest>,
) -> Result<Response, ApiError> {
    let (status, v) = room_affiliation(&st, &caller, &jid, &user, req).await?;
    Ok(json(status, &v))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RoomMessage {
    pub(crate) body: String,
}

/// A groupchat message from the room itself to its occupants (like its
/// status messages), archived when the room logs.
pub(crate) async fn room_message(
    st: &Shared,
    caller: &Caller,
    raw: &str,
    body: String,
) -> Result<(StatusCode, serde_json::Value), ApiError> {
    let rooms = service(st)?;
    let jid = room_jid(rooms.as_ref(), raw)?;
    if body.trim().is_empty() {
        return Err(bad("empty body"));
    }
    let a = rooms
        .change(&jid, RoomChange::Message { body })
        .await
        .map_err(room_error)?;
    audit(caller, "room.message", &jid, "");
    Ok(applied(&jid, a, j!({ "room": jid.as_str() })))
}

/// `POST /api/v1/rooms/{jid}/messages` `{"body"}`.
pub(crate) async fn send_room_message(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(jid): Path<String>,
    Body(req): Body<RoomMessage>,
) -> Result<Response, ApiError> {
    let (status, v) = room_message(&st, &caller, &jid, req.body).await?;
    Ok(json(status, &v))
}
