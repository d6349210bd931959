//! Group-chat rooms (XEP-0045) in the admin API, `/api/v1/rooms…`
//! (docs/admin.md), as ejabberd's `muc_online_rooms`, `get_room_*`,
//! `create_room`, `destroy_room`, `set_room_affiliation` and MongooseIM's
//! MUC admin API offer them, and the web admin's rooms page. The module
//! adds them to the admin listener when it starts
//! ([`AdminExtensions`](crate::modules::common::admin_api::AdminExtensions)):
//! the listener checks the token, this file the input. Without the module
//! (`[modules.muc] enabled = false`) none of them is served (404), and the
//! OpenAPI document does not list them.
//!
//! Changes go to the room's own task as requests of the server acting as
//! the service's administrator (`mod.rs`), so the room's rules, storage
//! and stanzas to occupants are those of an owner's XMPP request, and the
//! room's answer comes back to the handler. A room that runs on another
//! cluster node gets the request over the bus: the answer is then 202
//! with that node, and the outcome is in that node's log.
//!
//! Input is checked here first (JIDs through the `jid` crate: 400), and
//! every change is logged as `admin action` like the other endpoints.

use super::contract::{Applied, RoomAdmin, RoomChange, RoomError, RoomSummary};
use super::MucAdmin;
use crate::modules::common::admin_api::openapi::{err, limit, ok, op, query};
use crate::modules::common::admin_api::{
    self as api, bad, esc, json, ApiError, Body, Caller, OpResult,
};
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{delete, get, post, put, MethodRouter};
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, json as j, Value};
use starling_proto::BareJid;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

/// What the handlers reach: the service's administrator.
type Shared = Arc<MucAdmin>;

/// The endpoints, `(method, path)`, in the order of [`routes`].
pub(crate) const ROUTES: [(&str, &str); 6] = [
    ("get", "/api/v1/rooms"),
    ("post", "/api/v1/rooms"),
    ("get", "/api/v1/rooms/{jid}"),
    ("delete", "/api/v1/rooms/{jid}"),
    ("put", "/api/v1/rooms/{jid}/affiliations/{user}"),
    ("post", "/api/v1/rooms/{jid}/messages"),
];

/// The endpoints with their handlers, over `st`.
pub(super) fn routes(st: &Shared) -> Vec<(&'static str, &'static str, MethodRouter)> {
    let handlers: [MethodRouter<Shared>; 6] = [
        get(list_rooms),
        post(create_room),
        get(get_room),
        delete(destroy_room),
        put(set_affiliation),
        post(send_room_message),
    ];
    ROUTES
        .iter()
        .zip(handlers)
        .map(|(&(method, path), h)| (method, path, h.with_state(st.clone())))
        .collect()
}

fn room_error(e: RoomError) -> ApiError {
    match e {
        RoomError::NotFound(m) => ApiError::new(StatusCode::NOT_FOUND, m),
        RoomError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, m),
        RoomError::Invalid(m) => bad(m),
        RoomError::Unavailable(m) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, m),
    }
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
async fn rooms_page(
    st: &Shared,
    service_name: Option<&str>,
    after: Option<&str>,
    limit: usize,
) -> OpResult {
    let rooms = st;
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
async fn list_rooms(
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
async fn room_show(st: &Shared, raw: &str) -> OpResult {
    let rooms = st;
    let jid = room_jid(rooms.as_ref(), raw)?;
    match rooms.show(&jid).await.map_err(room_error)? {
        Some(d) => Ok(serde_json::to_value(d).unwrap_or_default()),
        None => Err(no_room(&jid)),
    }
}

/// `GET /api/v1/rooms/{jid}`.
async fn get_room(State(st): State<Shared>, Path(jid): Path<String>) -> Result<Response, ApiError> {
    Ok(json(StatusCode::OK, &room_show(&st, &jid).await?))
}

/// Logs a change to a room: grep `admin action`.
fn audit_room(caller: &Caller, action: &str, room: &BareJid, detail: &str) {
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
struct NewRoom {
    jid: String,
    owner: String,
    name: Option<String>,
    #[serde(default = "yes")]
    persistent: bool,
    public: Option<bool>,
    members_only: Option<bool>,
}

fn yes() -> bool {
    true
}

/// Creates an unlocked room owned by `owner` (an account of this
/// server), nobody in it, with the service's new-room defaults changed by
/// the options (ejabberd's `create_room`). 409 if it exists.
async fn room_create(
    st: &Shared,
    caller: &Caller,
    req: NewRoom,
) -> Result<(StatusCode, serde_json::Value), ApiError> {
    let rooms = st;
    let jid = room_jid(rooms.as_ref(), &req.jid)?;
    let owner = api::account(&req.owner)?;
    let env = st.env().map_err(room_error)?;
    if !env.hosts.is_local(owner.domain().as_str()) {
        return Err(bad(format!(
            "the owner {owner} is not an account of a domain this server serves"
        )));
    }
    match env.storage.accounts.exists(&owner).await {
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
    audit_room(caller, "room.create", &jid, &format!("owner={owner}"));
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
async fn create_room(
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
async fn room_destroy(
    st: &Shared,
    caller: &Caller,
    raw: &str,
    reason: Option<String>,
) -> Result<(StatusCode, serde_json::Value), ApiError> {
    let rooms = st;
    let jid = room_jid(rooms.as_ref(), raw)?;
    let reason = reason.filter(|r| !r.trim().is_empty());
    let a = rooms
        .change(&jid, RoomChange::Destroy { reason })
        .await
        .map_err(room_error)?;
    audit_room(caller, "room.destroy", &jid, "");
    Ok(applied(
        &jid,
        a,
        j!({ "room": jid.as_str(), "destroyed": true }),
    ))
}

/// `DELETE /api/v1/rooms/{jid}?reason=`.
async fn destroy_room(
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
struct AffiliationRequest {
    affiliation: String,
    reason: Option<String>,
}

/// Sets `user`'s affiliation (a bare JID, or a domain) as an owner's
/// `muc#admin` request does (§9–§10): occupants see the presence change,
/// an outcast is removed with status 301, a non-member of a members-only
/// room with 321. 409 when the room would keep no owner.
async fn room_affiliation(
    st: &Shared,
    caller: &Caller,
    raw: &str,
    user: &str,
    req: AffiliationRequest,
) -> Result<(StatusCode, serde_json::Value), ApiError> {
    let rooms = st;
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
    audit_room(
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
async fn set_affiliation(
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
struct RoomMessage {
    body: String,
}

/// A groupchat message from the room itself to its occupants (like its
/// status messages), archived when the room logs.
async fn room_message(
    st: &Shared,
    caller: &Caller,
    raw: &str,
    body: String,
) -> Result<(StatusCode, serde_json::Value), ApiError> {
    let rooms = st;
    let jid = room_jid(rooms.as_ref(), raw)?;
    if body.trim().is_empty() {
        return Err(bad("empty body"));
    }
    let a = rooms
        .change(&jid, RoomChange::Message { body })
        .await
        .map_err(room_error)?;
    audit_room(caller, "room.message", &jid, "");
    Ok(applied(&jid, a, j!({ "room": jid.as_str() })))
}

/// `POST /api/v1/rooms/{jid}/messages` `{"body"}`.
async fn send_room_message(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(jid): Path<String>,
    Body(req): Body<RoomMessage>,
) -> Result<Response, ApiError> {
    let (status, v) = room_message(&st, &caller, &jid, req.body).await?;
    Ok(json(status, &v))
}

/// The OpenAPI paths of the endpoints.
pub(crate) fn openapi() -> Value {
    let object = |props: Value| json!({ "type": "object", "properties": props });
    let summary = object(json!({
        "jid": { "type": "string" }, "name": { "type": "string" },
        "persistent": { "type": "boolean" }, "public": { "type": "boolean" },
        "members_only": { "type": "boolean" },
        "locked": { "type": "boolean", "description": "Not enterable until its owner configures it (XEP-0045 §10.1)." },
        "occupants": { "type": "integer", "description": "0 for a room not loaded on this node." },
        "loaded": { "type": "boolean", "description": "Loaded on this node." },
        "node": { "type": "integer", "description": "The cluster node that runs it." }
    }));
    let entry = object(json!({
        "jid": { "type": "string" }, "nick": { "type": "string", "nullable": true },
        "reason": { "type": "string", "nullable": true }
    }));
    let list = json!({ "type": "array", "items": entry });
    let details = object(json!({
        "jid": { "type": "string" }, "loaded": { "type": "boolean" }, "node": { "type": "integer" },
        "name": { "type": "string" }, "description": { "type": "string" }, "subject": { "type": "string" },
        "persistent": { "type": "boolean" }, "public": { "type": "boolean" },
        "members_only": { "type": "boolean" }, "moderated": { "type": "boolean" },
        "password_protected": { "type": "boolean" }, "logging": { "type": "boolean" },
        "locked": { "type": "boolean" }, "max_users": { "type": "integer" },
        "whois": { "type": "string", "enum": ["moderators", "anyone"] },
        "created_at": { "type": "string", "format": "date-time", "nullable": true },
        "affiliations": object(json!({ "owner": list.clone(), "admin": list.clone(), "member": list.clone(), "outcast": list })),
        "occupants": { "type": "array", "description": "Only when the room is loaded on this node.", "items": object(json!({
            "nick": { "type": "string" },
            "role": { "type": "string", "enum": ["moderator", "participant", "visitor"] },
            "affiliation": { "type": "string", "enum": ["owner", "admin", "member", "none"] },
            "jid": { "type": "string", "description": "The real JID (the session that joined last)." },
            "sessions": { "type": "array", "items": { "type": "string" } }
        })) }
    }));
    let room_param = json!({
        "name": "jid", "in": "path", "required": true,
        "description": "The room, name@service.",
        "schema": { "type": "string", "example": "lobby@conference.example.org" }
    });
    let forwarded = ok("The room runs on another cluster node, which got the request (its outcome is in that node's log).",
        object(json!({ "room": { "type": "string" }, "node": { "type": "integer" }, "status": { "type": "string" } })));
    let no_room = err("No such room, or group chat is disabled ([modules.muc] enabled = false).");
    json!({
        "/api/v1/rooms": {
            "get": op("Rooms of the group-chat service, by service then name, a page at a time: those loaded on this node and the stored (persistent) ones.",
                vec![
                    query("service", "Only this service (conference.<domain>); default: the service of every served domain.", json!({ "type": "string" })),
                    query("after", "Start after this room JID (the previous page's `next`).", json!({ "type": "string" })),
                    limit(100, 1000),
                ], None,
                json!({
                    "200": ok("One page.", object(json!({
                        "service": { "type": "string", "nullable": true },
                        "rooms": { "type": "array", "items": summary },
                        "next": { "type": "string", "nullable": true, "description": "The `after` of the next page; null on the last page." }
                    }))),
                    "404": no_room.clone()
                })),
            "post": op("Create a room owned by an account, unlocked, without anyone entering (like ejabberd's create_room); the service's new-room defaults apply to what is not given.", vec![],
                Some(json!({ "required": true, "content": { "application/json": { "schema": {
                    "type": "object", "required": ["jid", "owner"],
                    "properties": {
                        "jid": { "type": "string", "example": "lobby@conference.example.org" },
                        "owner": { "type": "string", "description": "An existing account of this server." },
                        "name": { "type": "string" },
                        "persistent": { "type": "boolean", "default": true, "description": "A temporary room waits idle_unload_secs for its first occupant and ends with its last." },
                        "public": { "type": "boolean" }, "members_only": { "type": "boolean" }
                    }
                } } } })),
                json!({
                    "201": ok("Created.", details.clone()),
                    "202": forwarded.clone(),
                    "404": no_room.clone(),
                    "409": err("The room exists.")
                }))
        },
        "/api/v1/rooms/{jid}": {
            "get": op("A room: configuration, affiliations, and occupants when it is loaded on this node.", vec![room_param.clone()], None,
                json!({ "200": ok("The room.", details), "404": no_room.clone() })),
            "delete": op("Destroy a room as its owner would (XEP-0045 §10.9): occupants get unavailable presence with <destroy/> and the reason; its stored data and archive are deleted.",
                vec![room_param.clone(), query("reason", "Given to the occupants.", json!({ "type": "string" }))], None,
                json!({
                    "200": ok("Destroyed.", object(json!({ "room": { "type": "string" }, "destroyed": { "type": "boolean" } }))),
                    "202": forwarded.clone(),
                    "404": no_room.clone()
                }))
        },
        "/api/v1/rooms/{jid}/affiliations/{user}": {
            "put": op("Set an affiliation as an owner's muc#admin request does (XEP-0045 §9–§10): occupants see the presence change; an outcast is removed (301), a non-member of a members-only room too (321).",
                vec![room_param.clone(), json!({
                    "name": "user", "in": "path", "required": true,
                    "description": "A bare JID (user@domain), or a domain.",
                    "schema": { "type": "string", "example": "bob@example.org" }
                })],
                Some(json!({ "required": true, "content": { "application/json": { "schema": {
                    "type": "object", "required": ["affiliation"],
                    "properties": {
                        "affiliation": { "type": "string", "enum": ["owner", "admin", "member", "outcast", "none"] },
                        "reason": { "type": "string" }
                    }
                } } } })),
                json!({
                    "200": ok("Set.", object(json!({ "room": { "type": "string" }, "jid": { "type": "string" }, "affiliation": { "type": "string" } }))),
                    "202": forwarded.clone(),
                    "404": no_room.clone(),
                    "409": err("The room would keep no owner.")
                }))
        },
        "/api/v1/rooms/{jid}/messages": {
            "post": op("Send a groupchat message from the room itself to its occupants (archived when the room logs).", vec![room_param],
                Some(json!({ "required": true, "content": { "application/json": { "schema": {
                    "type": "object", "required": ["body"], "properties": { "body": { "type": "string" } }
                } } } })),
                json!({
                    "200": ok("Sent.", object(json!({ "room": { "type": "string" }, "id": { "type": "string" } }))),
                    "202": forwarded,
                    "404": no_room
                }))
        }
    })
}

/// Rows per page of the web admin's rooms page.
const PAGE: usize = 50;

/// The web admin's rooms page, read only (changes: the API or `starling
/// ctl rooms`): rooms loaded on this node and stored ones, a page at a
/// time (`after`).
pub(super) async fn page(st: Shared, q: HashMap<String, String>) -> Result<String, String> {
    let v = rooms_page(&st, None, q.get("after").map(String::as_str), PAGE)
        .await
        .map_err(|e| e.message)?;
    let rooms = v["rooms"].as_array().cloned().unwrap_or_default();
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "—".to_owned(),
        other => other.to_string(),
    };
    let mut b = String::from(
        "<p>Rooms loaded on this node and stored ones. Changes: the API \
(<code>/api/v1/rooms</code>) or <code>starling ctl rooms</code>.</p>",
    );
    if rooms.is_empty() {
        b.push_str("<p id=\"no-rooms\">No rooms.</p>");
    } else {
        b.push_str("<table id=\"rooms\"><tr><th>room</th><th>name</th><th>kind</th><th>occupants</th><th>node</th></tr>");
        for r in &rooms {
            let jid = text(&r["jid"]);
            let flag = |k: &str, yes: &'static str, no: &'static str| {
                if r[k] == Value::Bool(true) {
                    yes
                } else {
                    no
                }
            };
            let _ = write!(
                b,
                "<tr data-jid=\"{}\"><td>{}</td><td>{}</td><td>{}, {}, {}{}</td><td>{}</td><td>{}</td></tr>",
                esc(&jid),
                esc(&jid),
                esc(&text(&r["name"])),
                flag("persistent", "persistent", "temporary"),
                flag("public", "public", "hidden"),
                flag("members_only", "members-only", "open"),
                flag("locked", ", locked", ""),
                esc(&text(&r["occupants"])),
                esc(&text(&r["node"])),
            );
        }
        b.push_str("</table>");
    }
    if let Some(n) = v["next"].as_str() {
        let _ = write!(
            b,
            "<p><a id=\"next\" href=\"/admin/rooms?after={}\">Next page</a></p>",
            esc(&api::percent_encode(n))
        );
    }
    Ok(b)
}
