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
//!
//! This file holds the service (its configuration and module), a room's
//! state, the room task's dispatch and the iq a member sends a room; the
//! rest by concern: `create.rs` (creating a room), `config.rs` (the
//! configuration schema and changes), `affiliations.rs` (the member list
//! and its changes), `messages.rs` (messages and notifications to the
//! members, the archive), `service.rs` (requests to the service: disco,
//! the member's rooms) and `blocking.rs` (blocking lists).

use super::host::{self, error, Host, Kind, Listing, Settings};
use super::mam;
use super::store::{RoomAffiliation, StoredRoom};
use serde::{Deserialize, Serialize};
use starling_core::hooks::HookRegistry;
use starling_core::module::{ConfigProblem, Module, ModuleCtx};
use starling_core::storage::StorageResult;
use starling_core::{async_trait, Env};
use starling_proto::{
    ns, BareJid, ErrorType, FullJid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind,
};
use starling_xml::Element;
use std::collections::BTreeMap;
use std::sync::Arc;

mod affiliations;
mod blocking;
mod config;
mod create;
mod messages;
mod service;

use affiliations::affiliations;
use config::configure;
use create::create;
use messages::{message, notification};
use service::service_stanza;

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
        let Some(stored) = host.store.room(jid).await? else {
            return Ok(None);
        };
        let Ok(s) = serde_json::from_str::<Stored>(&stored.config) else {
            tracing::error!(module = NAME, room = %jid, "stored room is not a MUC Light room; ignored");
            return Ok(None);
        };
        let mut members = BTreeMap::new();
        for a in host.store.affiliations(jid).await? {
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
    if let Err(e) = host.store.delete_room(jid).await {
        tracing::error!(module = NAME, room = %jid, error = %e, "deleting the room failed");
    }
    host.archive.flush().await;
    if let Err(e) = host.storage.archive.purge_user(jid, None).await {
        tracing::error!(module = NAME, room = %jid, error = %e, "deleting the room's archive failed");
    }
    tracing::debug!(module = NAME, room = %jid, "room destroyed");
    starling_core::log_throttled!(info, module = NAME, room = %jid, "room destroyed");
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
