//! MUC Light (MongooseIM's presence-free group chat,
//! `reference/xeps/proto-muc-light.xml`) at `muclight.<domain>`
//! (`[modules.muc_light]`): app-style groups whose members are a stored
//! list, not occupants who come and go.
//!
//! - **Rooms** run on the same room tasks as XEP-0045 rooms (`host.rs`):
//!   one task per live room, bounded queue, placement on a cluster. A room
//!   is its configuration (the fields of `config_schema`, e.g. `roomname`
//!   and `subject`), its members (at most one owner; none with
//!   `equal_occupants`) and a version string that changes with each
//!   configuration or membership change. Everything is stored (`MucStore`,
//!   before the stanzas reporting a change are routed), so an idle room
//!   unloads and a room whose node dies is loaded by the next.
//! - **Messages** ("Sending a message to a room"): a member's groupchat
//!   message goes to every member's *bare JID*, the sender's too, from
//!   `room/sender-bare-jid`, with an XEP-0359 stanza id; every available
//!   resource gets it (the router's rule for groupchat from a local
//!   service). History is the room's archive (XEP-0313 on the room's JID,
//!   members only, as MongooseIM does, section "XEP-0313 Message Archive
//!   Management"): offline members read it there, and their inbox
//!   (XEP-0430) counts it (shared rows into the room's archive).
//! - **Operations**: create (with a chosen or a server-made name),
//!   destroy, configuration and affiliations get (versioned) and set, room
//!   info, leave, owner hand-over, blocking lists at the service, the
//!   member's rooms in the service's disco#items (with RSM).
//! - Not built: the XEP-0045 compatibility ("legacy") mode and rooms in
//!   rosters (both optional in the protocol).

use super::host::{self, error, Host, Kind, Listing, Settings};
use super::mam;
use super::room::{inbox_kind, is_archivable, now_millis, origin_id};
use serde::{Deserialize, Serialize};
use starling_core::hooks::HookRegistry;
use starling_core::module::{ConfigProblem, Module, ModuleCtx};
use starling_core::storage::{
    ArchiveRecord, RoomAffiliation, StorageResult, StoredRoom, FLAG_BODY,
};
use starling_core::{async_trait, Env};
use starling_proto::{
    ns, BareJid, ErrorType, FullJid, Jid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind,
};
use starling_xml::{Element, Node};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

const NAME: &str = "muc_light";
/// The protocol's base namespace (its disco feature).
pub const NS_LIGHT: &str = "urn:xmpp:muclight:0";
/// Room creation.
pub const NS_CREATE: &str = "urn:xmpp:muclight:0#create";
/// Room destruction.
pub const NS_DESTROY: &str = "urn:xmpp:muclight:0#destroy";
/// Room configuration.
pub const NS_CONFIGURATION: &str = "urn:xmpp:muclight:0#configuration";
/// Members.
pub const NS_AFFILIATIONS: &str = "urn:xmpp:muclight:0#affiliations";
/// Configuration and members together.
pub const NS_INFO: &str = "urn:xmpp:muclight:0#info";
/// Blocking lists.
pub const NS_BLOCKING: &str = "urn:xmpp:muclight:0#blocking";
const NS_RSM: &str = "http://jabber.org/protocol/rsm";

/// `[modules.muc_light]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MucLightConfig {
    /// Run the MUC Light service (off by default: a second `conference`
    /// service confuses XEP-0045 clients that pick the first one).
    pub enabled: bool,
    /// The service's subdomain of every served domain.
    pub subdomain: String,
    /// Its name in service discovery.
    pub name: String,
    /// Who may create rooms: `local` (any account of a served domain) or
    /// `admins` (only the JIDs in `admins`).
    pub create_rooms: String,
    /// Service administrators (bare JIDs): may always create rooms.
    pub admins: Vec<String>,
    /// Most members a room may have (the creator included).
    pub max_occupants: u32,
    /// Most rooms one user may be a member of (0: no limit).
    pub max_rooms_per_user: u32,
    /// No owners: every member is equal (the creator too).
    pub equal_occupants: bool,
    /// Members (not only the owner) may change the configuration.
    pub all_can_configure: bool,
    /// Members (not only the owner) may add members.
    pub all_can_invite: bool,
    /// Users may refuse being added to rooms (blocking lists).
    pub blocking: bool,
    /// Most items in one user's blocking list.
    pub max_blocking_items: u32,
    /// The configuration fields rooms have, with their defaults. A
    /// request naming another field is refused with `bad-request`.
    pub config_schema: BTreeMap<String, String>,
    /// Longest configuration value, in characters.
    pub max_value_len: u32,
    /// Stanzas waiting for one room before senders get
    /// `resource-constraint`.
    pub room_queue: usize,
    /// Copies a room's waiting messages may add up to (messages waiting ×
    /// members) before senders get `resource-constraint`.
    pub max_queued_copies: usize,
    /// Seconds a room without traffic stays in memory.
    pub idle_unload_secs: u64,
    /// Days rooms' archived messages are kept (0: forever).
    pub retention_days: u32,
}

impl Default for MucLightConfig {
    fn default() -> Self {
        MucLightConfig {
            enabled: false,
            subdomain: "muclight".into(),
            name: "Groups".into(),
            create_rooms: "local".into(),
            admins: Vec::new(),
            max_occupants: 250,
            max_rooms_per_user: 1000,
            equal_occupants: false,
            all_can_configure: false,
            all_can_invite: false,
            blocking: true,
            max_blocking_items: 1000,
            config_schema: BTreeMap::from([
                ("roomname".to_owned(), "Untitled".to_owned()),
                ("subject".to_owned(), String::new()),
            ]),
            max_value_len: 1024,
            room_queue: 1024,
            max_queued_copies: 50_000,
            idle_unload_secs: 60,
            retention_days: 0,
        }
    }
}

/// The MUC Light module.
pub struct MucLight;

impl Module for MucLight {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str =
        "MUC Light (MongooseIM's presence-free groups: members, versions, blocking, room archive, inbox) at muclight.<domain>";
    type Config = MucLightConfig;
    const STORAGE: &'static [&'static str] = &["muc", "archive"];

    fn subdomain(cfg: &Self::Config) -> Option<&str> {
        Some(&cfg.subdomain)
    }
    fn enabled(cfg: &MucLightConfig) -> bool {
        cfg.enabled
    }

    fn validate(cfg: &MucLightConfig, _domains: &[String]) -> Result<(), ConfigProblem> {
        host::check_common(
            &cfg.subdomain,
            &cfg.create_rooms,
            &cfg.admins,
            cfg.room_queue,
        )?;
        if cfg.max_occupants < 1 {
            return Err(ConfigProblem::new("max_occupants", "must be at least 1"));
        }
        for k in cfg.config_schema.keys() {
            let ok = !k.is_empty()
                && k.len() <= 64
                && k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !matches!(k.as_str(), "version" | "prev-version");
            if !ok {
                return Err(ConfigProblem::new(
                    "config_schema",
                    format!("{k:?}: field names are letters, digits, '-' and '_', and not version or prev-version"),
                ));
            }
        }
        Ok(())
    }

    async fn start(cfg: &MucLightConfig, ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        let settings = Settings {
            subdomain: cfg.subdomain.clone(),
            room_queue: cfg.room_queue,
            max_queued_copies: cfg.max_queued_copies,
            idle_unload_secs: cfg.idle_unload_secs,
            retention_days: cfg.retention_days,
        };
        Host::<LightKind>::start(
            cfg.clone(),
            settings,
            &cfg.name,
            "muclight_archive",
            ctx,
            reg,
        );
    }
}

/// A member's affiliation (`none` is the absence of one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LAff {
    Owner,
    Member,
}

impl LAff {
    fn as_str(self) -> &'static str {
        match self {
            LAff::Owner => "owner",
            LAff::Member => "member",
        }
    }

    fn parse(s: &str) -> Option<Option<LAff>> {
        match s {
            "owner" => Some(Some(LAff::Owner)),
            "member" => Some(Some(LAff::Member)),
            "none" => Some(None),
            _ => None,
        }
    }
}

fn aff_str(a: Option<LAff>) -> &'static str {
    a.map_or("none", LAff::as_str)
}

/// A live MUC Light room.
#[derive(Clone, Debug)]
pub(super) struct LightRoom {
    jid: BareJid,
    config: BTreeMap<String, String>,
    members: BTreeMap<BareJid, LAff>,
    version: String,
    created_at: i64,
}

/// The stored configuration (`StoredRoom::config`), versioned.
#[derive(Serialize, Deserialize)]
struct Stored {
    v: u32,
    kind: String,
    version: String,
    fields: BTreeMap<String, String>,
}

impl LightRoom {
    fn to_stored(&self) -> StoredRoom {
        StoredRoom {
            jid: self.jid.clone(),
            config: serde_json::to_string(&Stored {
                v: 1,
                kind: "muclight".into(),
                version: self.version.clone(),
                fields: self.config.clone(),
            })
            .unwrap_or_default(),
            subject: String::new(),
            created_at: self.created_at,
        }
    }

    fn member_list(&self) -> Vec<BareJid> {
        self.members.keys().cloned().collect()
    }

    fn users_el(&self, parent: &mut Element, ns: &str) {
        for (j, a) in &self.members {
            parent.append_child(user_el(ns, j, Some(*a)));
        }
    }

    fn config_els(&self, parent: &mut Element, ns: &str) {
        for (k, v) in &self.config {
            parent.append_child(Element::builder(k.as_str(), ns).text(v.as_str()).build());
        }
    }
}

fn user_el(ns: &str, jid: &BareJid, a: Option<LAff>) -> Element {
    Element::builder("user", ns)
        .attr("affiliation", aff_str(a))
        .text(jid.as_str())
        .build()
}

fn new_version() -> String {
    starling_proto::random_id(16)
}

/// MUC Light rooms, run by a [`Host`].
pub(super) struct LightKind;

type Inner = Host<LightKind>;

#[async_trait]
impl Kind for LightKind {
    type Config = MucLightConfig;
    type Room = LightRoom;
    const MODULE: &'static str = NAME;

    async fn load(host: &Arc<Inner>, jid: &BareJid) -> StorageResult<Option<LightRoom>> {
        let Some(stored) = host.storage.muc.room(jid).await? else {
            return Ok(None);
        };
        let Ok(s) = serde_json::from_str::<Stored>(&stored.config) else {
            tracing::error!(module = NAME, room = %jid, "stored room is not a MUC Light room; ignored");
            return Ok(None);
        };
        let mut members = BTreeMap::new();
        for a in host.storage.muc.affiliations(jid).await? {
            let aff = LAff::parse(&a.affiliation).flatten();
            if let (Some(aff), Ok(j)) = (aff, BareJid::new(&a.jid)) {
                members.insert(j, aff);
            }
        }
        Ok(Some(LightRoom {
            jid: jid.clone(),
            config: s.fields,
            members,
            version: s.version,
            created_at: stored.created_at,
        }))
    }

    async fn process(
        host: &Arc<Inner>,
        env: &Env,
        jid: &BareJid,
        room: &mut Option<LightRoom>,
        st: Stanza,
    ) {
        for s in handle(host, env, jid, room, st).await {
            env.route(s).await;
        }
    }

    async fn service_stanza(host: &Arc<Inner>, env: &Env, st: &Stanza) -> Option<Stanza> {
        service_stanza(host, env, st).await
    }

    fn leave_all(_room: &mut LightRoom) -> Vec<Stanza> {
        Vec::new() // no presence: members notice nothing
    }

    fn idle(_room: &LightRoom) -> bool {
        true // everything is stored
    }

    fn listing(r: &LightRoom) -> Listing {
        Listing {
            name: r.config.get("roomname").cloned().unwrap_or_default(),
            public: false,
            locked: false,
            occupants: r.members.len(),
            persistent: true,
            members_only: true,
            loaded: true,
        }
    }
}

type Reply = Result<Vec<Stanza>, StanzaError>;

fn bad(text: &str) -> StanzaError {
    error(StanzaErrorCondition::BadRequest, text)
}

fn not_allowed(text: &str) -> StanzaError {
    error(StanzaErrorCondition::NotAllowed, text)
}

fn internal(e: impl std::fmt::Display, what: &str) -> StanzaError {
    tracing::error!(module = NAME, error = %e, "{what} failed");
    StanzaError::new(StanzaErrorCondition::InternalServerError).with_type(ErrorType::Wait)
}

/// One stanza for room `jid`: what to route (after what must be stored is).
async fn handle(
    host: &Arc<Inner>,
    env: &Env,
    jid: &BareJid,
    room: &mut Option<LightRoom>,
    st: Stanza,
) -> Vec<Stanza> {
    // "Client sends a presence stanza to the service": ignored.
    if st.kind() == StanzaKind::Presence || st.is_error() {
        return Vec::new();
    }
    if st.kind() == StanzaKind::Iq && !st.is_iq_request() {
        return Vec::new();
    }
    if let Some(gone) = host::account_removed(env, &st) {
        return account_removed(host, env, room, &gone, &st).await;
    }
    let Some(from) = st.from().and_then(|f| f.try_as_full().ok()).cloned() else {
        return Vec::new();
    };
    let sender = from.to_bare();
    // XEP-0313 on the room's JID: members only, run beside the room.
    let st = match room.as_ref() {
        Some(r) if st.kind() == StanzaKind::Iq && r.members.contains_key(&sender) => {
            let floor = mam::Access::floor_of(r.created_at);
            let access = |f: &FullJid| {
                Ok(mam::Access {
                    bare: f.to_bare(),
                    sees_jids: true,
                    floor,
                })
            };
            match mam::serve(host, env, &r.jid.clone(), st, access, present).await {
                Some(st) => st,
                None => return Vec::new(),
            }
        }
        _ => st,
    };
    let create_iq =
        st.kind() == StanzaKind::Iq && st.payload().is_some_and(|q| q.is("query", NS_CREATE));
    let result = match room.as_mut() {
        None if create_iq && st.type_attr() == Some("set") => {
            let q = st.payload().expect("checked above");
            create(host, env, jid, &sender, &st, q)
                .await
                .map(|(r, out)| {
                    *room = Some(r);
                    out
                })
        }
        None if create_iq => Err(bad("room creation is an iq set")),
        None => Err(error(
            StanzaErrorCondition::ItemNotFound,
            "this room does not exist",
        )),
        Some(_) if create_iq => Err(error(
            StanzaErrorCondition::Conflict,
            "a room with this name exists; choose another",
        )),
        // General error cases: not an occupant.
        Some(r) if !r.members.contains_key(&sender) => Err(error(
            StanzaErrorCondition::ItemNotFound,
            "you are not a member of this room",
        )),
        Some(r) if st.kind() == StanzaKind::Message => message(host, env, r, &sender, &st).await,
        Some(r) => {
            let out = room_iq(host, env, r, &sender, &st).await;
            if matches!(&out, Ok(Done::Destroyed(_))) {
                let jid = r.jid.clone();
                *room = None;
                destroyed(host, &jid).await;
            }
            out.map(Done::into_stanzas)
        }
    };
    match result {
        Ok(out) => out,
        Err(e) => st.error_reply(e).into_iter().collect(),
    }
}

/// The server deletes account `gone`: it leaves the room as if it had
/// set its own affiliation to `none` (the others are told, an owner gets
/// an heir, the last member's leaving destroys the room), with nothing
/// sent to the deleted account and no answer to the server.
async fn account_removed(
    host: &Arc<Inner>,
    env: &Env,
    room: &mut Option<LightRoom>,
    gone: &BareJid,
    st: &Stanza,
) -> Vec<Stanza> {
    let Some(r) = room.as_mut().filter(|r| r.members.contains_key(gone)) else {
        return Vec::new();
    };
    let mut q = Element::new("query", NS_AFFILIATIONS);
    q.append_child(user_el(NS_AFFILIATIONS, gone, None));
    let out = match affiliations(host, env, r, gone, st, &q).await {
        Ok(out) => out,
        Err(e) => {
            tracing::error!(module = NAME, room = %r.jid, user = %gone, error = ?e, "removing a deleted account from the room failed");
            return Vec::new();
        }
    };
    tracing::info!(module = NAME, room = %r.jid, user = %gone, "deleted account removed from the room");
    if let Done::Destroyed(_) = &out {
        let jid = r.jid.clone();
        *room = None;
        destroyed(host, &jid).await;
    }
    out.into_stanzas()
        .into_iter()
        .filter(|s| {
            s.to()
                .is_some_and(|t| t.node().is_some() && &t.to_bare() != gone)
        })
        .collect()
}

/// Shows an archived message: no `to` (the protocol's MAM section).
fn present(
    _room: &BareJid,
    _m: &starling_core::storage::ArchivedMessage,
    mut el: Element,
    _sees: bool,
) -> Element {
    el.remove_attr("to");
    el
}

/// What an iq to a room did.
enum Done {
    Kept(Vec<Stanza>),
    Destroyed(Vec<Stanza>),
}

impl Done {
    fn into_stanzas(self) -> Vec<Stanza> {
        match self {
            Done::Kept(s) | Done::Destroyed(s) => s,
        }
    }
}

/// The room is gone: its stored state and its archive (after what is
/// still queued for it).
async fn destroyed(host: &Inner, jid: &BareJid) {
    if let Err(e) = host.storage.muc.delete_room(jid).await {
        tracing::error!(module = NAME, room = %jid, error = %e, "deleting the room failed");
    }
    host.archive.flush().await;
    if let Err(e) = host.storage.archive.purge_user(jid, None).await {
        tracing::error!(module = NAME, room = %jid, error = %e, "deleting the room's archive failed");
    }
    tracing::debug!(module = NAME, room = %jid, "room destroyed");
    starling_core::log_throttled!(info, module = NAME, room = %jid, "room destroyed");
}

/// "Sending a message to a room": a copy to every member's bare JID.
async fn message(
    host: &Arc<Inner>,
    env: &Env,
    r: &LightRoom,
    sender: &BareJid,
    st: &Stanza,
) -> Reply {
    if st.stanza_type() != "groupchat" {
        return Err(bad("messages to a room are of type groupchat"));
    }
    let el = st.element();
    let from: Jid = FullJid::new(&format!("{}/{}", r.jid, sender))
        .map(Jid::from)
        .unwrap_or_else(|_| r.jid.clone().into());
    let mut m = Element::new("message", ns::CLIENT);
    for (k, v) in el.attrs() {
        if k != "to" && k != "from" {
            m.set_attr(k, v);
        }
    }
    for node in el.nodes() {
        match node {
            // Only the room stamps its stanza ids.
            Node::Element(c)
                if c.is("stanza-id", ns::SID) && c.attr("by") == Some(r.jid.as_str()) => {}
            other => m.nodes_mut().push(other.clone()),
        }
    }
    m.set_attr("from", from.as_str());
    let id = host.ids.next();
    if is_archivable(el) {
        host.archive
            .push(ArchiveRecord {
                owner: r.jid.clone(),
                id,
                with_bare: sender.to_string(),
                remote: from.to_string(),
                outgoing: false,
                origin_id: origin_id(el),
                flags: if el.has_child("body", ns::CLIENT) {
                    FLAG_BODY
                } else {
                    0
                },
                stanza: m.to_string(),
            })
            .await;
        if let Some(kind) = inbox_kind(el) {
            if !env.hooks.archived.is_empty() {
                host::to_inboxes(
                    env,
                    &r.jid,
                    &r.member_list(),
                    vec![(id, sender.clone(), kind, m.clone())],
                )
                .await;
            }
        }
        m.append_child(
            Element::builder("stanza-id", ns::SID)
                .attr("id", id.encode())
                .attr("by", r.jid.as_str())
                .build(),
        );
    }
    Ok(crate::modules::common::copies(
        m,
        from,
        r.members.keys().map(|member| member.clone().into()),
    ))
}

/// A notification from the room's bare JID to `to` (a groupchat message
/// with an empty body, as the protocol's examples).
fn notification(room: &BareJid, to: &BareJid, id: &str, payloads: Vec<Element>) -> Stanza {
    let mut m = Element::builder("message", ns::CLIENT)
        .attr("type", "groupchat")
        .attr("id", id)
        .build();
    for p in payloads {
        m.append_child(p);
    }
    m.append_child(Element::new("body", ns::CLIENT));
    Stanza::new(m, Some(room.clone().into()), Some(to.clone().into()))
}

/// Archives a notification (from the room's bare JID, `<version/>` but no
/// `<prev-version/>`: the MAM section) and returns its stanza-id element.
async fn archive_notification(host: &Inner, r: &LightRoom, x: Element) -> (Element, Element) {
    let id = host.ids.next();
    let mut m = Element::builder("message", ns::CLIENT)
        .attr("type", "groupchat")
        .attr("from", r.jid.as_str())
        .build();
    m.append_child(x);
    m.append_child(Element::new("body", ns::CLIENT));
    host.archive
        .push(ArchiveRecord {
            owner: r.jid.clone(),
            id,
            with_bare: r.jid.to_string(),
            remote: r.jid.to_string(),
            outgoing: false,
            origin_id: None,
            flags: 0,
            stanza: m.to_string(),
        })
        .await;
    let sid = Element::builder("stanza-id", ns::SID)
        .attr("id", id.encode())
        .attr("by", r.jid.as_str())
        .build();
    (m, sid)
}

/// Parses `<user affiliation='…'>jid</user>` items.
fn parse_users(q: &Element, ns: &str) -> Result<Vec<(BareJid, Option<LAff>)>, StanzaError> {
    let mut seen = BTreeSet::new();
    let mut items = Vec::new();
    for c in q.children() {
        if !c.is("user", ns) {
            if c.name() == "version" && c.ns() == ns {
                continue;
            }
            return Err(bad(
                "only <user affiliation='…'>jid</user> items are allowed here",
            ));
        }
        let aff = c
            .attr("affiliation")
            .and_then(LAff::parse)
            .ok_or_else(|| bad("affiliation must be owner, member or none"))?;
        let text = c.text();
        let jid = BareJid::new(text.trim())
            .ok()
            .filter(|j| j.node().is_some())
            .ok_or_else(|| bad("a user item holds a user's bare JID"))?;
        if !seen.insert(jid.clone()) {
            return Err(bad("each user may appear once"));
        }
        items.push((jid, aff));
    }
    Ok(items)
}

/// Parses configuration fields against the schema.
fn parse_config(
    cfg: &MucLightConfig,
    parent: &Element,
    ns: &str,
) -> Result<Vec<(String, String)>, StanzaError> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for c in parent.children() {
        if c.ns() != ns {
            return Err(bad("configuration fields are in the query's namespace"));
        }
        let name = c.name();
        if name == "version" || name == "prev-version" {
            continue;
        }
        if !cfg.config_schema.contains_key(name) {
            return Err(bad(&format!(
                "unknown configuration field {name}; this service has: {}",
                cfg.config_schema
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let v = c.text();
        if v.chars().count() > cfg.max_value_len as usize {
            return Err(error(
                StanzaErrorCondition::NotAcceptable,
                &format!("{name} is longer than {} characters", cfg.max_value_len),
            ));
        }
        if !seen.insert(name.to_owned()) {
            return Err(bad("each field may appear once"));
        }
        out.push((name.to_owned(), v));
    }
    Ok(out)
}

/// Checks users about to become members: accounts of this server that
/// exist and are not in too many rooms. Returns those who refuse (their
/// blocking lists), to be skipped silently.
async fn check_newcomers(
    host: &Inner,
    env: &Env,
    room: &BareJid,
    by: &BareJid,
    newcomers: &[BareJid],
) -> Result<Vec<BareJid>, StanzaError> {
    for n in newcomers {
        if !env.hosts.is_local(n.domain().as_str()) {
            return Err(error(
                StanzaErrorCondition::NotAcceptable,
                &format!("{n} is not an account of this server (no server-to-server links)"),
            ));
        }
        if n != by {
            match env.storage.accounts.exists(n).await {
                Ok(true) => {}
                Ok(false) => {
                    return Err(error(
                        StanzaErrorCondition::ItemNotFound,
                        &format!("there is no account {n}"),
                    ))
                }
                Err(e) => return Err(internal(e, "account lookup")),
            }
        }
    }
    let refusing = if host.cfg.blocking {
        host.storage
            .muc
            .light_refusing(newcomers, room, by)
            .await
            .map_err(|e| internal(e, "reading blocking lists"))?
    } else {
        Vec::new()
    };
    if host.cfg.max_rooms_per_user > 0 {
        let service = room.domain().as_str();
        for n in newcomers.iter().filter(|n| !refusing.contains(n)) {
            let rooms = host
                .storage
                .muc
                .rooms_of(n)
                .await
                .map_err(|e| internal(e, "counting rooms"))?;
            let count = rooms
                .iter()
                .filter(|(j, _)| j.domain().as_str() == service)
                .count();
            if count >= host.cfg.max_rooms_per_user as usize {
                return Err(not_allowed(&format!(
                    "{n} is in as many rooms as this service allows ({})",
                    host.cfg.max_rooms_per_user
                )));
            }
        }
    }
    Ok(refusing)
}

/// "Creating a new room".
async fn create(
    host: &Arc<Inner>,
    env: &Env,
    jid: &BareJid,
    creator: &BareJid,
    st: &Stanza,
    q: &Element,
) -> Result<(LightRoom, Vec<Stanza>), StanzaError> {
    let cfg = &host.cfg;
    if !host::may_create(env, &cfg.create_rooms, &cfg.admins, creator) {
        return Err(not_allowed("you may not create rooms on this service"));
    }
    let mut config: BTreeMap<String, String> = cfg.config_schema.clone();
    let mut occupants = Vec::new();
    for c in q.children() {
        if c.is("configuration", NS_CREATE) {
            for (k, v) in parse_config(cfg, c, NS_CREATE)? {
                config.insert(k, v);
            }
        } else if c.is("occupants", NS_CREATE) {
            occupants = parse_users(c, NS_CREATE)?;
        } else {
            return Err(bad(
                "a create query holds <configuration/> and <occupants/>",
            ));
        }
    }
    let mut members: BTreeMap<BareJid, LAff> = BTreeMap::new();
    let mut owner_chosen = false;
    for (j, a) in &occupants {
        if j == creator {
            return Err(bad("the occupant list must not include the creator"));
        }
        match a {
            None => return Err(bad("'none' cannot be used when creating a room")),
            Some(LAff::Owner) if cfg.equal_occupants => {
                return Err(bad("rooms of this service have no owner"))
            }
            Some(LAff::Owner) if owner_chosen => return Err(bad("a room has at most one owner")),
            Some(LAff::Owner) => owner_chosen = true,
            Some(LAff::Member) => {}
        }
        members.insert(j.clone(), a.expect("checked above"));
    }
    let creator_aff = if cfg.equal_occupants || owner_chosen {
        LAff::Member
    } else {
        LAff::Owner
    };
    if members.len() + 1 > cfg.max_occupants as usize {
        return Err(not_allowed(&format!(
            "a room has at most {} members",
            cfg.max_occupants
        )));
    }
    let mut everyone: Vec<BareJid> = vec![creator.clone()];
    everyone.extend(members.keys().cloned());
    let refusing = check_newcomers(host, env, jid, creator, &everyone).await?;
    if refusing.contains(creator) {
        return Err(not_allowed("you block this room"));
    }
    for r in &refusing {
        members.remove(r);
    }
    members.insert(creator.clone(), creator_aff);
    let room = LightRoom {
        jid: jid.clone(),
        config,
        members,
        version: new_version(),
        created_at: now_millis(),
    };
    let rows: Vec<RoomAffiliation> = room.members.iter().map(|(j, a)| row(j, Some(*a))).collect();
    host.storage
        .muc
        .put_room(&room.to_stored())
        .await
        .map_err(|e| internal(e, "storing the room"))?;
    host.storage
        .muc
        .set_affiliations(jid, &rows)
        .await
        .map_err(|e| internal(e, "storing the room's members"))?;
    // A user can create and destroy groups in a loop: each at debug, at
    // info one line per 10 s with a count.
    tracing::debug!(module = NAME, room = %jid, creator = %creator, members = room.members.len(), "room created");
    starling_core::log_throttled!(info, module = NAME, room = %jid, creator = %creator, members = room.members.len(), "room created");
    // "Room creation is archived as an affiliation change that includes
    // ALL initial occupants."
    let mut x = Element::new("x", NS_AFFILIATIONS);
    x.append_child(
        Element::builder("version", NS_AFFILIATIONS)
            .text(room.version.as_str())
            .build(),
    );
    room.users_el(&mut x, NS_AFFILIATIONS);
    let (archived, sid) = archive_notification(host, &room, x).await;
    let iq_id = st.id().unwrap_or_default().to_owned();
    let mut out = Vec::new();
    for (j, a) in &room.members {
        // Each newcomer gets only their own affiliation, no prev-version.
        let mut x = Element::new("x", NS_AFFILIATIONS);
        x.append_child(
            Element::builder("version", NS_AFFILIATIONS)
                .text(room.version.as_str())
                .build(),
        );
        x.append_child(user_el(NS_AFFILIATIONS, j, Some(*a)));
        out.push(notification(&room.jid, j, &iq_id, vec![x, sid.clone()]));
    }
    if !env.hooks.archived.is_empty() {
        if let Some(id) = sid
            .attr("id")
            .and_then(starling_core::storage::ArchiveId::decode)
        {
            host::to_inboxes(
                env,
                &room.jid,
                &room.member_list(),
                vec![(
                    id,
                    creator.clone(),
                    starling_proto::mam::Kind::Instant,
                    archived,
                )],
            )
            .await;
        }
    }
    out.push(st.iq_result(None));
    Ok((room, out))
}

fn row(j: &BareJid, a: Option<LAff>) -> RoomAffiliation {
    RoomAffiliation {
        jid: j.to_string(),
        affiliation: aff_str(a).to_owned(),
        nick: None,
        reason: None,
    }
}

/// An iq from a member to the room.
async fn room_iq(
    host: &Arc<Inner>,
    env: &Env,
    r: &mut LightRoom,
    sender: &BareJid,
    st: &Stanza,
) -> Result<Done, StanzaError> {
    let Some(q) = st.payload() else {
        return Err(bad("an iq holds one query"));
    };
    let get = st.type_attr() == Some("get");
    let versioned = |ns: &str| {
        q.get_child("version", ns)
            .map(|v| v.text())
            .is_some_and(|v| v == r.version)
    };
    match (q.ns(), q.name(), get) {
        (NS_CONFIGURATION | NS_AFFILIATIONS | NS_INFO, "query", true) => {
            // "Requesting room information": empty when versions match.
            if versioned(q.ns()) {
                return Ok(Done::Kept(vec![st.iq_result(None)]));
            }
            let ns = q.ns();
            let mut a = Element::new("query", ns);
            a.append_child(
                Element::builder("version", ns)
                    .text(r.version.as_str())
                    .build(),
            );
            match ns {
                NS_CONFIGURATION => r.config_els(&mut a, ns),
                NS_AFFILIATIONS => r.users_el(&mut a, ns),
                _ => {
                    let mut c = Element::new("configuration", ns);
                    r.config_els(&mut c, ns);
                    let mut o = Element::new("occupants", ns);
                    r.users_el(&mut o, ns);
                    a.append_child(c);
                    a.append_child(o);
                }
            }
            Ok(Done::Kept(vec![st.iq_result(Some(a))]))
        }
        (NS_CONFIGURATION, "query", false) => configure(host, r, sender, st, q).await,
        (NS_AFFILIATIONS, "query", false) => affiliations(host, env, r, sender, st, q).await,
        (NS_DESTROY, "query", false) => {
            if r.members.get(sender) != Some(&LAff::Owner) {
                return Err(not_allowed("only the owner may destroy the room"));
            }
            let id = st.id().unwrap_or_default();
            let mut out: Vec<Stanza> = r
                .members
                .keys()
                .map(|m| {
                    let mut x = Element::new("x", NS_AFFILIATIONS);
                    x.append_child(user_el(NS_AFFILIATIONS, m, None));
                    notification(&r.jid, m, id, vec![x, Element::new("x", NS_DESTROY)])
                })
                .collect();
            out.push(st.iq_result(None));
            Ok(Done::Destroyed(out))
        }
        (ns::DISCO_INFO, "query", true) => {
            let mut a = Element::new("query", ns::DISCO_INFO);
            a.append_child(
                Element::builder("identity", ns::DISCO_INFO)
                    .attr("category", "conference")
                    .attr("type", "text")
                    .attr("name", r.config.get("roomname").map_or("", String::as_str))
                    .build(),
            );
            for f in [NS_LIGHT, ns::DISCO_INFO, starling_proto::mam::NS_MAM] {
                a.append_child(
                    Element::builder("feature", ns::DISCO_INFO)
                        .attr("var", f)
                        .build(),
                );
            }
            Ok(Done::Kept(vec![st.iq_result(Some(a))]))
        }
        _ => Err(error(
            StanzaErrorCondition::ServiceUnavailable,
            "this room does not answer this request",
        )),
    }
}

/// "Setting room configuration": a delta; every member is told.
async fn configure(
    host: &Inner,
    r: &mut LightRoom,
    sender: &BareJid,
    st: &Stanza,
    q: &Element,
) -> Result<Done, StanzaError> {
    if !host.cfg.all_can_configure && r.members.get(sender) != Some(&LAff::Owner) {
        return Err(not_allowed("only the owner may change the configuration"));
    }
    let fields = parse_config(&host.cfg, q, NS_CONFIGURATION)?;
    if fields.is_empty() {
        return Err(bad("name at least one configuration field"));
    }
    let prev = std::mem::replace(&mut r.version, new_version());
    for (k, v) in &fields {
        r.config.insert(k.clone(), v.clone());
    }
    if let Err(e) = host.storage.muc.put_room(&r.to_stored()).await {
        r.version = prev;
        return Err(internal(e, "storing the configuration"));
    }
    let mut x = Element::new("x", NS_CONFIGURATION);
    x.append_child(
        Element::builder("prev-version", NS_CONFIGURATION)
            .text(prev.as_str())
            .build(),
    );
    x.append_child(
        Element::builder("version", NS_CONFIGURATION)
            .text(r.version.as_str())
            .build(),
    );
    for (k, v) in &fields {
        x.append_child(
            Element::builder(k.as_str(), NS_CONFIGURATION)
                .text(v.as_str())
                .build(),
        );
    }
    let id = st.id().unwrap_or_default();
    let mut out: Vec<Stanza> = r
        .members
        .keys()
        .map(|m| notification(&r.jid, m, id, vec![x.clone()]))
        .collect();
    out.push(st.iq_result(None));
    Ok(Done::Kept(out))
}

/// The changes an affiliation request makes, after the protocol's rules
/// ("Changing the occupant list"), before blocking lists are applied.
/// `Err` is the error the requester gets.
pub(super) fn plan(
    cfg: &MucLightConfig,
    members: &BTreeMap<BareJid, LAff>,
    actor: &BareJid,
    items: &[(BareJid, Option<LAff>)],
) -> Result<Vec<(BareJid, Option<LAff>)>, StanzaError> {
    let actor_owner = members.get(actor) == Some(&LAff::Owner);
    let mut owners = 0;
    for (j, new) in items {
        let cur = members.get(j).copied();
        if cur == *new {
            return Err(bad(&format!(
                "{j} is already {}: every change must change something",
                aff_str(cur)
            )));
        }
        match new {
            Some(LAff::Owner) => {
                if cfg.equal_occupants {
                    return Err(bad("rooms of this service have no owner"));
                }
                if !actor_owner {
                    return Err(not_allowed("only the owner may choose an owner"));
                }
                owners += 1;
            }
            None if j != actor && !actor_owner => {
                return Err(not_allowed("only the owner may remove others"));
            }
            Some(LAff::Member) if cur.is_none() && !actor_owner && !cfg.all_can_invite => {
                return Err(not_allowed("only the owner may add members"));
            }
            Some(LAff::Member) if cur == Some(LAff::Owner) && !actor_owner => {
                return Err(not_allowed("only the owner may change an owner"));
            }
            _ => {}
        }
    }
    if owners > 1 {
        return Err(bad("a room has at most one owner"));
    }
    Ok(items.to_vec())
}

/// Completes a plan: a new owner demotes the old one; an owner who leaves
/// or steps down without naming one is replaced by the first remaining
/// member. Returns the full change list.
pub(super) fn complete(
    cfg: &MucLightConfig,
    members: &BTreeMap<BareJid, LAff>,
    mut changes: Vec<(BareJid, Option<LAff>)>,
) -> Vec<(BareJid, Option<LAff>)> {
    if cfg.equal_occupants {
        return changes;
    }
    let old_owner = members
        .iter()
        .find(|(_, a)| **a == LAff::Owner)
        .map(|(j, _)| j.clone());
    let new_owner = changes
        .iter()
        .find(|(_, a)| *a == Some(LAff::Owner))
        .map(|(j, _)| j.clone());
    match (old_owner, new_owner) {
        (Some(old), Some(_)) if !changes.iter().any(|(j, _)| *j == old) => {
            changes.push((old, Some(LAff::Member)));
        }
        (Some(old), None) => {
            let leaves = changes
                .iter()
                .any(|(j, a)| *j == old && *a != Some(LAff::Owner));
            if leaves {
                let mut after = members.clone();
                for (j, a) in &changes {
                    match a {
                        Some(a) => after.insert(j.clone(), *a),
                        None => after.remove(j),
                    };
                }
                let heir = after
                    .iter()
                    .find(|(j, a)| **a == LAff::Member && **j != old)
                    .map(|(j, _)| j.clone());
                if let Some(heir) = heir {
                    changes.retain(|(j, _)| *j != heir);
                    changes.push((heir, Some(LAff::Owner)));
                }
            }
        }
        _ => {}
    }
    changes
}

/// "Changing the occupant list".
async fn affiliations(
    host: &Inner,
    env: &Env,
    r: &mut LightRoom,
    sender: &BareJid,
    st: &Stanza,
    q: &Element,
) -> Result<Done, StanzaError> {
    let items = parse_users(q, NS_AFFILIATIONS)?;
    if items.is_empty() {
        return Err(bad("name at least one user"));
    }
    let mut changes = plan(&host.cfg, &r.members, sender, &items)?;
    let newcomers: Vec<BareJid> = changes
        .iter()
        .filter(|(j, a)| a.is_some() && !r.members.contains_key(j))
        .map(|(j, _)| j.clone())
        .collect();
    if !newcomers.is_empty() {
        // Those who block the room or the sender are skipped silently.
        let refusing = check_newcomers(host, env, &r.jid, sender, &newcomers).await?;
        changes.retain(|(j, _)| !refusing.contains(j));
    }
    let changes = complete(&host.cfg, &r.members, changes);
    let mut after = r.members.clone();
    for (j, a) in &changes {
        match a {
            Some(a) => after.insert(j.clone(), *a),
            None => after.remove(j),
        };
    }
    if after.len() > host.cfg.max_occupants as usize {
        return Err(not_allowed(&format!(
            "a room has at most {} members",
            host.cfg.max_occupants
        )));
    }
    let id = st.id().unwrap_or_default();
    let mut out = Vec::new();
    if changes.is_empty() {
        // Everyone named refuses: nothing changes.
        out.push(st.iq_result(None));
        return Ok(Done::Kept(out));
    }
    let removed: Vec<BareJid> = changes
        .iter()
        .filter(|(_, a)| a.is_none())
        .map(|(j, _)| j.clone())
        .collect();
    for j in &removed {
        let mut x = Element::new("x", NS_AFFILIATIONS);
        x.append_child(user_el(NS_AFFILIATIONS, j, None));
        out.push(notification(&r.jid, j, id, vec![x]));
    }
    if after.is_empty() {
        // "A room is automatically destroyed when its occupant list
        // becomes empty."
        out.push(st.iq_result(None));
        return Ok(Done::Destroyed(out));
    }
    let rows: Vec<RoomAffiliation> = changes.iter().map(|(j, a)| row(j, *a)).collect();
    host.storage
        .muc
        .set_affiliations(&r.jid, &rows)
        .await
        .map_err(|e| internal(e, "storing the room's members"))?;
    let prev = std::mem::replace(&mut r.version, new_version());
    let old = std::mem::replace(&mut r.members, after);
    if let Err(e) = host.storage.muc.put_room(&r.to_stored()).await {
        tracing::error!(module = NAME, room = %r.jid, error = %e, "storing the room's version failed");
    }
    let list = |parent: &mut Element| {
        for (j, a) in &changes {
            parent.append_child(user_el(NS_AFFILIATIONS, j, *a));
        }
    };
    let mut x = Element::new("x", NS_AFFILIATIONS);
    x.append_child(
        Element::builder("version", NS_AFFILIATIONS)
            .text(r.version.as_str())
            .build(),
    );
    list(&mut x);
    let (archived, sid) = archive_notification(host, r, x).await;
    let mut full = Element::new("x", NS_AFFILIATIONS);
    full.append_child(
        Element::builder("prev-version", NS_AFFILIATIONS)
            .text(prev.as_str())
            .build(),
    );
    full.append_child(
        Element::builder("version", NS_AFFILIATIONS)
            .text(r.version.as_str())
            .build(),
    );
    list(&mut full);
    let mut joined = Vec::new();
    for (j, a) in &r.members {
        if old.contains_key(j) {
            out.push(notification(&r.jid, j, id, vec![full.clone(), sid.clone()]));
        } else {
            // Newcomers: only their own affiliation, no prev-version.
            let mut x = Element::new("x", NS_AFFILIATIONS);
            x.append_child(
                Element::builder("version", NS_AFFILIATIONS)
                    .text(r.version.as_str())
                    .build(),
            );
            x.append_child(user_el(NS_AFFILIATIONS, j, Some(*a)));
            out.push(notification(&r.jid, j, id, vec![x, sid.clone()]));
            joined.push(j.clone());
        }
    }
    // Newcomers see the room in their inbox.
    if !joined.is_empty() && !env.hooks.archived.is_empty() {
        if let Some(aid) = sid
            .attr("id")
            .and_then(starling_core::storage::ArchiveId::decode)
        {
            host::to_inboxes(
                env,
                &r.jid,
                &joined,
                vec![(
                    aid,
                    sender.clone(),
                    starling_proto::mam::Kind::Instant,
                    archived,
                )],
            )
            .await;
        }
    }
    out.push(st.iq_result(None));
    Ok(Done::Kept(out))
}

/// Stanzas to the service's own JID.
async fn service_stanza(host: &Arc<Inner>, env: &Env, st: &Stanza) -> Option<Stanza> {
    if st.kind() != StanzaKind::Iq {
        if st.kind() == StanzaKind::Message && !st.is_error() {
            return st.error_reply(error(
                StanzaErrorCondition::ServiceUnavailable,
                "send messages to a room",
            ));
        }
        return None;
    }
    if !st.is_iq_request() {
        return None;
    }
    let from = st.from()?.to_bare();
    let q = st.payload()?;
    let get = st.type_attr() == Some("get");
    let reply = match (q.ns(), q.name(), get) {
        (ns::DISCO_INFO, "query", true) if q.attr("node").is_none() => {
            let mut r = Element::new("query", ns::DISCO_INFO);
            r.append_child(
                Element::builder("identity", ns::DISCO_INFO)
                    .attr("category", "conference")
                    .attr("name", host.cfg.name.as_str())
                    .attr("type", "text")
                    .build(),
            );
            let mut features = vec![NS_LIGHT, ns::DISCO_INFO, ns::DISCO_ITEMS, ns::PING];
            if host.cfg.blocking {
                features.push(NS_BLOCKING);
            }
            for f in features {
                r.append_child(
                    Element::builder("feature", ns::DISCO_INFO)
                        .attr("var", f)
                        .build(),
                );
            }
            Ok(Some(r))
        }
        (ns::DISCO_ITEMS, "query", true) if q.attr("node").is_none() => {
            my_rooms(host, st, &from).await
        }
        (NS_BLOCKING, "query", _) if host.cfg.blocking => blocking(host, &from, q, get).await,
        (NS_CREATE, "query", false) => {
            // "Requesting a new room with a unique name": the room's own
            // task creates it (on its node), answering from its JID.
            let service = st.to().map(|t| t.domain().as_str().to_owned())?;
            let name = starling_proto::random_id(20);
            let Ok(room) = BareJid::new(&format!("{name}@{service}")) else {
                return None;
            };
            let mut el = st.element().clone();
            el.set_attr("to", room.as_str());
            let fwd = Stanza::new(el, st.from().cloned(), Some(room.into()));
            env.route(fwd).await;
            return None;
        }
        (ns::PING, "ping", true) => Ok(None),
        _ => Err(StanzaError::new(StanzaErrorCondition::ServiceUnavailable)),
    };
    match reply {
        Ok(p) => Some(st.iq_result(p)),
        Err(e) => st.error_reply(e),
    }
}

/// "Discovering occupied rooms": the requester's rooms with name and
/// version, XEP-0059 paging (`max`, `after`).
async fn my_rooms(
    host: &Inner,
    st: &Stanza,
    who: &BareJid,
) -> Result<Option<Element>, StanzaError> {
    let service = st
        .to()
        .map(|t| t.domain().as_str().to_owned())
        .unwrap_or_default();
    let set = st.payload().and_then(|q| q.get_child("set", NS_RSM));
    let max = set
        .and_then(|s| s.get_child("max", NS_RSM))
        .and_then(|m| m.text().trim().parse::<usize>().ok())
        .unwrap_or(1000)
        .min(1000);
    let after = set
        .and_then(|s| s.get_child("after", NS_RSM))
        .map(|a| a.text());
    let mut rooms: Vec<BareJid> = host
        .storage
        .muc
        .rooms_of(who)
        .await
        .map_err(|e| internal(e, "listing rooms"))?
        .into_iter()
        .map(|(j, _)| j)
        .filter(|j| j.domain().as_str() == service)
        .collect();
    rooms.sort();
    let total = rooms.len();
    let page: Vec<BareJid> = rooms
        .into_iter()
        .filter(|j| after.as_ref().is_none_or(|a| j.as_str() > a.as_str()))
        .take(max)
        .collect();
    let mut q = Element::new("query", ns::DISCO_ITEMS);
    for j in &page {
        let stored = host
            .storage
            .muc
            .room(j)
            .await
            .map_err(|e| internal(e, "reading a room"))?;
        let Some(s) = stored.and_then(|s| serde_json::from_str::<Stored>(&s.config).ok()) else {
            continue;
        };
        q.append_child(
            Element::builder("item", ns::DISCO_ITEMS)
                .attr("jid", j.as_str())
                .attr("name", s.fields.get("roomname").map_or("", String::as_str))
                .attr("version", s.version.as_str())
                .build(),
        );
    }
    if set.is_some() || page.len() < total {
        let mut s = Element::new("set", NS_RSM);
        if let (Some(f), Some(l)) = (page.first(), page.last()) {
            s.append_child(
                Element::builder("first", NS_RSM)
                    .attr("index", (total - page.len()).min(total).to_string())
                    .text(f.as_str())
                    .build(),
            );
            s.append_child(Element::builder("last", NS_RSM).text(l.as_str()).build());
        }
        s.append_child(
            Element::builder("count", NS_RSM)
                .text(total.to_string())
                .build(),
        );
        q.append_child(s);
    }
    Ok(Some(q))
}

/// "Blocking functionality": the list, or changes to it.
async fn blocking(
    host: &Inner,
    who: &BareJid,
    q: &Element,
    get: bool,
) -> Result<Option<Element>, StanzaError> {
    if get {
        let list = host
            .storage
            .muc
            .light_blocking(who)
            .await
            .map_err(|e| internal(e, "reading a blocking list"))?;
        let mut r = Element::new("query", NS_BLOCKING);
        for (kind, jid) in list {
            r.append_child(
                Element::builder(kind.as_str(), NS_BLOCKING)
                    .attr("action", "deny")
                    .text(jid.as_str())
                    .build(),
            );
        }
        return Ok(Some(r));
    }
    let mut deny = Vec::new();
    let mut allow = Vec::new();
    for c in q.children() {
        let kind = match c.name() {
            "room" | "user" if c.ns() == NS_BLOCKING => c.name(),
            _ => return Err(bad("blocking items are <room/> or <user/>")),
        };
        let text = c.text();
        let jid = BareJid::new(text.trim())
            .ok()
            .filter(|j| j.node().is_some())
            .ok_or_else(|| bad("a blocking item holds a bare JID"))?;
        let item = (kind.to_owned(), jid);
        match c.attr("action") {
            Some("deny") => deny.push(item),
            Some("allow") => allow.push(item),
            _ => return Err(bad("action must be deny or allow")),
        }
    }
    if deny.is_empty() && allow.is_empty() {
        return Err(bad("name at least one room or user"));
    }
    if !deny.is_empty() {
        let now = host
            .storage
            .muc
            .light_blocking(who)
            .await
            .map_err(|e| internal(e, "reading a blocking list"))?;
        let added = deny.iter().filter(|d| !now.contains(d)).count();
        if now.len() + added > host.cfg.max_blocking_items as usize {
            return Err(error(
                StanzaErrorCondition::ResourceConstraint,
                &format!(
                    "a blocking list holds at most {} items",
                    host.cfg.max_blocking_items
                ),
            ));
        }
    }
    host.storage
        .muc
        .set_light_blocking(who, &deny, &allow)
        .await
        .map_err(|e| internal(e, "storing a blocking list"))?;
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn j(s: &str) -> BareJid {
        BareJid::new(s).unwrap()
    }

    fn room() -> BTreeMap<BareJid, LAff> {
        BTreeMap::from([
            (j("o@x"), LAff::Owner),
            (j("a@x"), LAff::Member),
            (j("b@x"), LAff::Member),
        ])
    }

    fn cond(e: StanzaError) -> StanzaErrorCondition {
        e.condition
    }

    #[test]
    fn members_may_only_leave_and_only_the_owner_changes_others() {
        let cfg = MucLightConfig::default();
        let r = room();
        // Changing the occupant list, rule 2: everyone may leave.
        assert!(plan(&cfg, &r, &j("a@x"), &[(j("a@x"), None)]).is_ok());
        // Rule 11: members cannot remove others, add (unless allowed), or
        // make an owner.
        for items in [
            vec![(j("b@x"), None)],
            vec![(j("c@x"), Some(LAff::Member))],
            vec![(j("a@x"), Some(LAff::Owner))],
        ] {
            assert_eq!(
                cond(plan(&cfg, &r, &j("a@x"), &items).unwrap_err()),
                StanzaErrorCondition::NotAllowed
            );
        }
        let open = MucLightConfig {
            all_can_invite: true,
            ..MucLightConfig::default()
        };
        assert!(plan(&open, &r, &j("a@x"), &[(j("c@x"), Some(LAff::Member))]).is_ok());
        // Rule 10: meaningless changes are bad requests.
        assert_eq!(
            cond(plan(&cfg, &r, &j("o@x"), &[(j("a@x"), Some(LAff::Member))]).unwrap_err()),
            StanzaErrorCondition::BadRequest
        );
        assert_eq!(
            cond(plan(&cfg, &r, &j("o@x"), &[(j("z@x"), None)]).unwrap_err()),
            StanzaErrorCondition::BadRequest
        );
        // Rule 6: at most one owner per request.
        assert_eq!(
            cond(
                plan(
                    &cfg,
                    &r,
                    &j("o@x"),
                    &[(j("a@x"), Some(LAff::Owner)), (j("b@x"), Some(LAff::Owner))]
                )
                .unwrap_err()
            ),
            StanzaErrorCondition::BadRequest
        );
    }

    #[test]
    fn a_new_owner_demotes_the_old_one_and_a_leaving_owner_gets_an_heir() {
        let cfg = MucLightConfig::default();
        let r = room();
        // Rule 6: giving someone 'owner' makes the current one a member.
        let c = complete(&cfg, &r, vec![(j("a@x"), Some(LAff::Owner))]);
        assert!(c.contains(&(j("o@x"), Some(LAff::Member))));
        // Rule 7: leaving and naming the heir in one request.
        let c = complete(
            &cfg,
            &r,
            vec![(j("o@x"), None), (j("b@x"), Some(LAff::Owner))],
        );
        assert_eq!(c.len(), 2);
        // Rule 5: the server picks one (the first remaining member).
        let c = complete(&cfg, &r, vec![(j("o@x"), None)]);
        assert_eq!(c, vec![(j("o@x"), None), (j("a@x"), Some(LAff::Owner))]);
        // With equal occupants there is no owner to hand over.
        let eq = MucLightConfig {
            equal_occupants: true,
            ..MucLightConfig::default()
        };
        assert_eq!(complete(&eq, &r, vec![(j("o@x"), None)]).len(), 1);
    }

    #[test]
    fn user_items_are_checked() {
        let q = |xml: &str| xml.parse::<Element>().unwrap();
        let ok = q("<query xmlns='urn:xmpp:muclight:0#affiliations'><user affiliation='member'>a@x</user><user affiliation='none'>b@x</user></query>");
        assert_eq!(parse_users(&ok, NS_AFFILIATIONS).unwrap().len(), 2);
        for bad in [
            "<query xmlns='urn:xmpp:muclight:0#affiliations'><item role='participant'>a@x</item></query>",
            "<query xmlns='urn:xmpp:muclight:0#affiliations'><user affiliation='admin'>a@x</user></query>",
            "<query xmlns='urn:xmpp:muclight:0#affiliations'><user affiliation='member'>a@x/r</user></query>",
            "<query xmlns='urn:xmpp:muclight:0#affiliations'><user affiliation='member'>x</user></query>",
            "<query xmlns='urn:xmpp:muclight:0#affiliations'><user affiliation='member'>a@x</user><user affiliation='none'>a@x</user></query>",
        ] {
            assert_eq!(
                cond(parse_users(&q(bad), NS_AFFILIATIONS).unwrap_err()),
                StanzaErrorCondition::BadRequest,
                "{bad}"
            );
        }
    }

    #[test]
    fn configuration_follows_the_schema() {
        let cfg = MucLightConfig::default();
        let q = |xml: &str| xml.parse::<Element>().unwrap();
        let ok = q("<query xmlns='urn:xmpp:muclight:0#configuration'><roomname>A</roomname><version>v</version></query>");
        assert_eq!(
            parse_config(&cfg, &ok, NS_CONFIGURATION).unwrap(),
            vec![("roomname".to_owned(), "A".to_owned())]
        );
        let unknown =
            q("<query xmlns='urn:xmpp:muclight:0#configuration'><colour>red</colour></query>");
        assert_eq!(
            cond(parse_config(&cfg, &unknown, NS_CONFIGURATION).unwrap_err()),
            StanzaErrorCondition::BadRequest
        );
        let long = format!(
            "<query xmlns='urn:xmpp:muclight:0#configuration'><subject>{}</subject></query>",
            "x".repeat(1025)
        );
        assert_eq!(
            cond(parse_config(&cfg, &q(&long), NS_CONFIGURATION).unwrap_err()),
            StanzaErrorCondition::NotAcceptable
        );
    }
}
