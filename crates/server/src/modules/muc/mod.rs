//! Multi-User Chat (XEP-0045) at `conference.<domain>` (`[modules.muc]
//! subdomain`): a local service (DESIGN.md "Sessions, connections and
//! services") whose rooms run as tasks.
//!
//! - **One task per live room.** The service hands each stanza for a room
//!   or one of its occupants to that room's bounded queue and returns; the
//!   room's task applies the rules (`room/`, synchronous: a stanza in,
//!   stanzas to route and rows to store out), stores what must outlive it,
//!   then routes what it produced, in order. A room is never locked by two
//!   tasks, a stanza the room sends itself (an error bounced back to it)
//!   only queues, and a flooded room answers `resource-constraint` without
//!   slowing any other room. The task of an empty room ends after
//!   `idle_unload_secs` (a persistent room is loaded again from storage
//!   on its next stanza); a temporary room is destroyed when its last
//!   occupant leaves (§10.1 "temporary room").
//! - **Creation** (§10.1): an available presence to a room that does not
//!   exist creates it if `create_rooms` allows the sender (`local`: any
//!   account of a served domain; `admins`: the service admins), up to
//!   `max_rooms_per_user` rooms owned per user (stored ones plus the
//!   temporary or unconfigured ones the user created and that are alive)
//!   and `max_temporary_rooms` such rooms on the service. The room stays
//!   locked (entering gives `item-not-found`, §7.2.10) until the owner
//!   submits the configuration form, an empty one for an instant room
//!   (§10.1.2); cancelling it destroys the room.
//! - **Storage**: configuration, subject and affiliations (with registered
//!   nicknames) of persistent rooms in `MucStore` (written before the
//!   stanzas that report the change are routed); messages in the archive
//!   under the room's JID (through a write-behind queue of its own) when
//!   `muc#roomconfig_enablelogging` is on, which also keeps the history
//!   sent on entering across restarts (the last `muc#maxhistoryfetch`
//!   messages are loaded with the room).
//! - **Archive queries** (XEP-0313 on the room's bare JID, `mam.rs`):
//!   checked against the room's state in its task (locked, outcast,
//!   members-only and password-protected rooms: members and occupants
//!   only), run in a task of their own, results routed from the room;
//!   real JIDs only to those who may see them; messages of an earlier
//!   room of the same name never show. Advertised while logging is on.
//! - **Stanza ids and occupant ids**: every groupchat message gets a
//!   XEP-0359 `<stanza-id by='room'/>` (its archive id) and every
//!   presence and message an XEP-0421 `<occupant-id/>` (a keyed hash of
//!   the real bare JID with a random secret of the room); ones a client
//!   put there are removed.
//! - **Self-ping** (XEP-0410 with the optimization): a ping to one's own
//!   occupant JID is answered by the room.
//! - **Shutdown**: occupants get unavailable presence with status 332.
//!
//! The room tasks, queues, placement, hand-off, acknowledgements and
//! shutdown are `host.rs`, shared with MUC Light (`light.rs`); this file
//! is what XEP-0045 rooms add. Hooks: a service at the configured
//! subdomain (`host.rs`), disco identity and features of the service.
//! Storage: muc, archive.
//! Config: `[modules.muc]` ([`MucConfig`]).

mod admin;
pub mod cli;
mod config;
mod host;
pub mod light;
mod mam;
mod room;
pub mod store;

use crate::modules::common::admin_api::AdminExtensions;
#[cfg(test)]
pub(crate) use admin::{openapi as admin_openapi, ROUTES as ADMIN_ROUTES};

use config::RoomConfig;
use host::{error, CreateRefused, Host, Kind, Listing, Settings};
use room::{Ctx, Out, Room};
use serde::Deserialize;
use starling_core::hooks::HookRegistry;
use starling_core::module::{ConfigProblem, Module, ModuleCtx};
use starling_core::storage::{ArchiveQuery, StorageResult};
use starling_core::{async_trait, Env};
use starling_proto::{
    ns, BareJid, ErrorType, Stanza, StanzaError, StanzaErrorCondition, StanzaKind,
};
use starling_xml::Element;
use std::sync::Arc;
use store::StoredRoom;

const NAME: &str = "muc";
/// XEP-0045 namespaces.
pub const NS_MUC: &str = "http://jabber.org/protocol/muc";
/// `muc#user`.
pub const NS_MUC_USER: &str = "http://jabber.org/protocol/muc#user";
/// `muc#admin`.
pub const NS_MUC_ADMIN: &str = "http://jabber.org/protocol/muc#admin";
/// `muc#owner`.
pub const NS_MUC_OWNER: &str = "http://jabber.org/protocol/muc#owner";
/// `muc#request` (voice requests).
pub const NS_MUC_REQUEST: &str = "http://jabber.org/protocol/muc#request";
/// `muc#unique` (unique room names, from earlier versions of XEP-0045; clients still ask for them).
pub const NS_MUC_UNIQUE: &str = "http://jabber.org/protocol/muc#unique";
/// XEP-0421 occupant ids.
pub const NS_OCCUPANT_ID: &str = "urn:xmpp:occupant-id:0";
/// XEP-0425 moderated message retraction.
pub const NS_MODERATE: &str = "urn:xmpp:message-moderate:1";
/// XEP-0424 message retraction.
pub const NS_RETRACT: &str = "urn:xmpp:message-retract:1";
/// vcard-temp (room avatars, as XEP-0486 describes).
pub const NS_VCARD: &str = "vcard-temp";

/// The server's requests that XEP-0045 has no stanza for (creating a
/// room nobody entered). Taken only from the server ([`Host::is_server_request`]).
pub(crate) const NS_ADMIN: &str = "urn:x-starling:muc-admin:0";
/// XEP-0153 avatar hash in presence.
pub const NS_VCARD_UPDATE: &str = "vcard-temp:x:update";
/// XEP-0410 self-ping optimization.
pub const NS_SELF_PING_OPT: &str = "http://jabber.org/protocol/muc#self-ping-optimization";

/// `[modules.muc]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MucConfig {
    /// Run the group-chat service.
    pub enabled: bool,
    /// The service's subdomain of every served domain (`conference` gives
    /// `conference.example.org`).
    pub subdomain: String,
    /// Its name in service discovery.
    pub name: String,
    /// Who may create rooms: `local` (any account of a served domain) or
    /// `admins` (only the JIDs in `admins`).
    pub create_rooms: String,
    /// Service administrators (bare JIDs): may always create rooms.
    pub admins: Vec<String>,
    /// Most rooms one user may own (0: no limit): the stored rooms it is
    /// an owner of, plus the rooms it created that only memory holds
    /// (temporary, or not configured yet). Beyond it creating a room gets
    /// `<not-allowed/>`; destroying or emptying one frees its place.
    pub max_rooms_per_user: u32,
    /// Most rooms users created that only memory holds (temporary, or not
    /// configured yet), for the whole service on one node (0: no limit).
    /// Beyond it creating a room gets `<resource-constraint/>`; stored
    /// rooms still load.
    pub max_temporary_rooms: usize,
    /// Most occupants a room may be configured for.
    pub max_users: u32,
    /// A new room's occupant limit.
    pub default_max_users: u32,
    /// Most messages a room keeps for the history on entering.
    pub max_history: u32,
    /// A new room's `muc#maxhistoryfetch`.
    pub default_history: u32,
    /// Longest nickname, in characters.
    pub max_nick_len: u32,
    /// Longest subject, in characters.
    pub max_subject_len: u32,
    /// Largest room vCard (avatar included), bytes of XML.
    pub max_vcard_bytes: usize,
    /// Owners may make rooms persistent.
    pub allow_persistent: bool,
    /// New rooms' defaults (§10.1.2 instant rooms keep them).
    pub default_persistent: bool,
    /// See `default_persistent`.
    pub default_public: bool,
    /// See `default_persistent`.
    pub default_members_only: bool,
    /// See `default_persistent`.
    pub default_moderated: bool,
    /// See `default_persistent` (archive messages on the room's JID).
    pub default_logging: bool,
    /// Stanzas waiting for one room before senders get
    /// `resource-constraint`.
    pub room_queue: usize,
    /// Copies a room's waiting messages may add up to (messages waiting ×
    /// occupants) before senders get `resource-constraint`: bounds how
    /// late a message in a crowded room can be.
    pub max_queued_copies: usize,
    /// Seconds an empty persistent room stays in memory.
    pub idle_unload_secs: u64,
    /// Days rooms' archived messages are kept (0: forever); purged at
    /// start and hourly, for the service under every served domain.
    pub retention_days: u32,
}

impl Default for MucConfig {
    fn default() -> Self {
        MucConfig {
            enabled: true,
            subdomain: "conference".into(),
            name: "Chatrooms".into(),
            create_rooms: "local".into(),
            admins: Vec::new(),
            max_rooms_per_user: 100,
            max_temporary_rooms: 10_000,
            max_users: 5000,
            default_max_users: 200,
            max_history: 100,
            default_history: 20,
            max_nick_len: 64,
            max_subject_len: 1024,
            max_vcard_bytes: 256 * 1024,
            allow_persistent: true,
            default_persistent: false,
            default_public: true,
            default_members_only: false,
            default_moderated: false,
            default_logging: true,
            room_queue: 1024,
            max_queued_copies: 50_000,
            idle_unload_secs: 60,
            retention_days: 0,
        }
    }
}

/// The group-chat module.
pub struct Muc;

impl Module for Muc {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str =
        "XEP-0045 multi-user chat (with XEP-0359 stanza ids, XEP-0410 self-ping, XEP-0421 occupant ids) at conference.<domain>";
    type Config = MucConfig;
    const STORAGE: &'static [&'static str] = &["muc", "archive"];
    /// The group-chat store's tables, MUC Light's included (`store/`).
    const SCHEMA: &'static [starling_core::storage::SchemaStep] = store::SCHEMA;
    const STORE_SUITES: &'static [starling_core::storage::StoreSuite] = store::conformance::SUITES;
    const ADMIN_PATHS: &'static [&'static str] = &["/api/v1/rooms"];

    fn owned_data(
        storage: &starling_core::storage::Storage,
    ) -> Option<Arc<dyn starling_core::storage::OwnedData>> {
        Some(Arc::new(store::MucData::new(storage)))
    }
    fn subdomain(cfg: &Self::Config) -> Option<&str> {
        Some(&cfg.subdomain)
    }
    fn enabled(cfg: &MucConfig) -> bool {
        cfg.enabled
    }

    fn validate(cfg: &MucConfig, _domains: &[String]) -> Result<(), ConfigProblem> {
        host::check_common(
            &cfg.subdomain,
            &cfg.create_rooms,
            &cfg.admins,
            cfg.room_queue,
        )?;
        if cfg.max_users == 0 || cfg.default_max_users == 0 || cfg.default_max_users > cfg.max_users
        {
            return Err(ConfigProblem::new(
                "default_max_users",
                "must be between 1 and max_users",
            ));
        }
        if cfg.default_history > cfg.max_history {
            return Err(ConfigProblem::new(
                "default_history",
                "must be at most max_history",
            ));
        }
        Ok(())
    }

    async fn start(cfg: &MucConfig, ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        let settings = Settings {
            subdomain: cfg.subdomain.clone(),
            room_queue: cfg.room_queue,
            max_queued_copies: cfg.max_queued_copies,
            idle_unload_secs: cfg.idle_unload_secs,
            retention_days: cfg.retention_days,
        };
        let host =
            Host::<MucKind>::start(cfg.clone(), settings, &cfg.name, "muc_archive", ctx, reg);
        // The admin listener's rooms endpoints and page (admin/api.rs).
        if let Some(ext) = reg.provided::<AdminExtensions>() {
            admin::extend(ext, Arc::new(admin::MucAdmin::new(host, ctx.node_id)));
        }
    }
}

/// A room an administrator makes outside XMPP (`starling room create`):
/// what differs from the service's new-room defaults.
#[derive(Clone, Debug, Default)]
pub struct CliRoom {
    /// Natural-language name (`muc#roomconfig_roomname`); empty for none.
    pub name: String,
    /// Only members may enter (else the service default).
    pub members_only: bool,
    /// Not listed in the service's disco#items (else the service default).
    pub hidden: bool,
    /// Entering needs this password.
    pub password: Option<String>,
}

/// The stored configuration (`StoredRoom::config`) of a persistent,
/// unlocked room made by `starling room create`: the service's new-room
/// defaults (`max_users`, history, logging, …) changed by `room`, with a
/// fresh occupant-id secret. `Err` says which value the service refuses,
/// as the configuration form would.
pub fn stored_config_for_cli(svc: &MucConfig, room: &CliRoom) -> Result<String, String> {
    if !svc.allow_persistent {
        return Err(
            "this service keeps no rooms ([modules.muc] allow_persistent = false): set it to true first"
                .into(),
        );
    }
    if room.name.chars().count() > config::MAX_NAME_CHARS {
        return Err(format!(
            "the name is longer than {} characters",
            config::MAX_NAME_CHARS
        ));
    }
    let mut c = RoomConfig::new_room(svc, starling_proto::random_id(24));
    c.persistent = true;
    c.name = room.name.clone();
    c.members_only |= room.members_only;
    c.public &= !room.hidden;
    if let Some(p) = &room.password {
        if p.is_empty() || p.chars().count() > config::MAX_PASSWORD_CHARS {
            return Err(format!(
                "the password must have 1 to {} characters",
                config::MAX_PASSWORD_CHARS
            ));
        }
        c.password_protected = true;
        c.password = p.clone();
    }
    Ok(c.to_stored())
}

/// What `starling room list` shows of a stored room's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredConfigSummary {
    /// Natural-language name (may be empty).
    pub name: String,
    /// Listed in the service's disco#items.
    pub public: bool,
    /// Only members may enter.
    pub members_only: bool,
    /// Entering needs a password.
    pub password_protected: bool,
}

/// Reads a stored room configuration; `None` if it is not this module's.
pub fn stored_config_summary(stored: &str) -> Option<StoredConfigSummary> {
    RoomConfig::from_stored(stored).map(|c| StoredConfigSummary {
        name: c.name,
        public: c.public,
        members_only: c.members_only,
        password_protected: c.password_protected,
    })
}

/// XEP-0045 rooms, run by a [`Host`].
pub(super) struct MucKind;

type Inner = Host<MucKind>;

#[async_trait]
impl Kind for MucKind {
    type Config = MucConfig;
    type Room = Room;
    const MODULE: &'static str = NAME;

    async fn load(host: &Arc<Inner>, jid: &BareJid) -> StorageResult<Option<Room>> {
        host.load(jid).await
    }

    async fn process(
        host: &Arc<Inner>,
        env: &Env,
        jid: &BareJid,
        room: &mut Option<Room>,
        st: Stanza,
    ) {
        process(host, env, jid, room, st).await
    }

    async fn process_admin(
        host: &Arc<Inner>,
        env: &Env,
        jid: &BareJid,
        room: &mut Option<Room>,
        st: Stanza,
    ) -> Option<Stanza> {
        process_admin(host, env, jid, room, st).await
    }

    async fn service_stanza(host: &Arc<Inner>, env: &Env, st: &Stanza) -> Option<Stanza> {
        host.service_stanza(env, st).await
    }

    fn leave_all(room: &mut Room) -> Vec<Stanza> {
        let mut out = Out::default();
        room.shutdown(&mut out);
        out.stanzas
    }

    fn idle(room: &Room) -> bool {
        room.is_empty()
    }

    fn listing(r: &Room) -> Listing {
        Listing {
            name: r.config.name.clone(),
            public: r.config.public,
            locked: r.locked,
            occupants: r.occupant_count(),
            persistent: r.config.persistent,
            members_only: r.config.members_only,
            loaded: true,
        }
    }
}

impl Inner {
    /// Loads a stored room (with its affiliations and recent history).
    async fn load(&self, jid: &BareJid) -> StorageResult<Option<Room>> {
        let Some(stored) = self.store.room(jid).await? else {
            return Ok(None);
        };
        let config = RoomConfig::from_stored(&stored.config).unwrap_or_else(|| {
            tracing::error!(module = NAME, room = %jid, "stored room configuration unreadable; defaults used");
            RoomConfig::new_room(&self.cfg, starling_proto::random_id(24))
        });
        let mut room = Room::new(jid.clone(), config, stored.subject, stored.created_at);
        room.stored = true;
        for a in self.store.affiliations(jid).await? {
            if let Some(aff) = room::Affiliation::parse(&a.affiliation) {
                room.affiliations.insert(
                    a.jid,
                    room::Aff {
                        affiliation: aff,
                        nick: a.nick,
                        reason: a.reason,
                    },
                );
            }
        }
        let keep = room
            .config
            .history_size
            .max(self.cfg.default_history)
            .min(self.cfg.max_history);
        if room.config.logging && keep > 0 {
            let page = self
                .storage
                .archive
                .query(
                    jid,
                    &ArchiveQuery {
                        limit: keep,
                        from_end: true,
                        // Nothing from an earlier room of the same name.
                        after: Some(starling_core::storage::ArchiveId(
                            starling_core::storage::ArchiveId::lower_bound(
                                room.created_at.saturating_mul(1000),
                            )
                            .0
                            .saturating_sub(1),
                        )),
                        ..ArchiveQuery::default()
                    },
                )
                .await?;
            for m in page.messages {
                if let Ok(el) = m.stanza.parse::<Element>() {
                    let chars = el.size_hint();
                    room.history.push_back(room::HistoryItem {
                        id: m.id,
                        el,
                        chars,
                    });
                }
            }
        }
        Ok(Some(room))
    }

    /// Whether `who` may create a room.
    fn may_create(&self, env: &Env, who: &BareJid) -> bool {
        host::may_create(env, &self.cfg.create_rooms, &self.cfg.admins, who)
    }

    /// Stanzas to the service itself (§6.1–§6.3, and `muc#unique`).
    async fn service_stanza(&self, env: &Env, st: &Stanza) -> Option<Stanza> {
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
        let q = st.payload()?;
        let get = st.type_attr() == Some("get");
        let reply = match (q.ns(), q.name(), get) {
            (ns::DISCO_INFO, "query", true) if q.attr("node").is_none() => {
                let mut r = Element::new("query", ns::DISCO_INFO);
                r.append_child(
                    Element::builder("identity", ns::DISCO_INFO)
                        .attr("category", "conference")
                        .attr("name", self.cfg.name.as_str())
                        .attr("type", "text")
                        .build(),
                );
                for f in [
                    NS_MUC,
                    NS_MUC_UNIQUE,
                    ns::DISCO_INFO,
                    ns::DISCO_ITEMS,
                    ns::REGISTER,
                    NS_OCCUPANT_ID,
                    ns::PING,
                ] {
                    r.append_child(
                        Element::builder("feature", ns::DISCO_INFO)
                            .attr("var", f)
                            .build(),
                    );
                }
                Ok(Some(r))
            }
            (ns::DISCO_ITEMS, "query", true) if q.attr("node").is_none() => {
                self.room_list(env, st).await
            }
            (NS_MUC_UNIQUE, "unique", true) => Ok(Some(
                Element::builder("unique", NS_MUC_UNIQUE)
                    .text(starling_proto::random_id(16).to_lowercase())
                    .build(),
            )),
            (ns::PING, "ping", true) => Ok(None),
            _ => Err(StanzaError::new(StanzaErrorCondition::ServiceUnavailable)),
        };
        match reply {
            Ok(p) => Some(st.iq_result(p)),
            Err(e) => st.error_reply(e),
        }
    }

    /// §6.2: public rooms — live ones and stored persistent ones — with
    /// XEP-0059 paging (`max`, `after`).
    async fn room_list(&self, _env: &Env, st: &Stanza) -> Result<Option<Element>, StanzaError> {
        let service = st
            .to()
            .map(|t| t.domain().as_str().to_owned())
            .unwrap_or_default();
        let set = st
            .payload()
            .and_then(|q| q.get_child("set", "http://jabber.org/protocol/rsm"));
        let max = set
            .and_then(|s| s.get_child("max", "http://jabber.org/protocol/rsm"))
            .and_then(|m| m.text().trim().parse::<usize>().ok())
            .unwrap_or(1000)
            .min(1000);
        let after = set
            .and_then(|s| s.get_child("after", "http://jabber.org/protocol/rsm"))
            .map(|a| a.text());
        let mut rooms: std::collections::BTreeMap<String, String> =
            std::collections::BTreeMap::new();
        for (jid, l) in self.listings() {
            if jid.domain().as_str() == service && l.public && !l.locked && l.occupants > 0 {
                let name = if l.name.is_empty() {
                    jid.node()
                        .map(|n| n.as_str().to_owned())
                        .unwrap_or_default()
                } else {
                    l.name
                };
                rooms.insert(jid.to_string(), name);
            }
        }
        let mut cursor: Option<String> = after
            .as_ref()
            .and_then(|a| BareJid::new(a).ok())
            .and_then(|j| j.node().map(|n| n.as_str().to_owned()));
        // Stored rooms, a page at a time, until enough public ones.
        loop {
            let page = self
                .store
                .rooms(&service, cursor.as_deref(), 500)
                .await
                .map_err(|e| {
                    tracing::error!(module = NAME, error = %e, "listing rooms failed");
                    StanzaError::new(StanzaErrorCondition::InternalServerError)
                        .with_type(ErrorType::Wait)
                })?;
            let n = page.len();
            for r in page {
                cursor = r.jid.node().map(|n| n.as_str().to_owned());
                if let Some(c) = RoomConfig::from_stored(&r.config) {
                    if c.public {
                        let name = if c.name.is_empty() {
                            cursor.clone().unwrap_or_default()
                        } else {
                            c.name
                        };
                        rooms.entry(r.jid.to_string()).or_insert(name);
                    }
                }
            }
            if n < 500 || rooms.len() > max + 1000 {
                break;
            }
        }
        let mut q = Element::new("query", ns::DISCO_ITEMS);
        let mut first = None;
        let mut last = None;
        let total = rooms.len();
        for (jid, name) in rooms
            .into_iter()
            .filter(|(j, _)| after.as_ref().is_none_or(|a| j.as_str() > a.as_str()))
            .take(max)
        {
            first.get_or_insert_with(|| jid.clone());
            last = Some(jid.clone());
            q.append_child(
                Element::builder("item", ns::DISCO_ITEMS)
                    .attr("jid", jid)
                    .attr("name", name)
                    .build(),
            );
        }
        if set.is_some() {
            let rsm = "http://jabber.org/protocol/rsm";
            let mut s = Element::new("set", rsm);
            if let (Some(f), Some(l)) = (first, last) {
                s.append_child(Element::builder("first", rsm).text(f).build());
                s.append_child(Element::builder("last", rsm).text(l).build());
            }
            s.append_child(
                Element::builder("count", rsm)
                    .text(total.to_string())
                    .build(),
            );
            q.append_child(s);
        }
        Ok(Some(q))
    }

    /// How many rooms `who` owns (stored ones).
    async fn owned_rooms(&self, who: &BareJid) -> StorageResult<usize> {
        Ok(self
            .store
            .rooms_of(who)
            .await?
            .iter()
            .filter(|(_, a)| a.affiliation == "owner")
            .count())
    }

    /// Stores what a handler changed, before its stanzas are routed.
    async fn persist(&self, room: &mut Room, out: &mut Out) -> StorageResult<()> {
        if out.destroyed {
            if room.stored {
                self.store.delete_room(&room.jid).await?;
                room.stored = false;
            }
            return Ok(());
        }
        if room.config.persistent && !room.locked {
            if !room.stored || out.save {
                self.store
                    .put_room(&StoredRoom {
                        jid: room.jid.clone(),
                        config: room.config.to_stored(),
                        subject: room.stored_subject(),
                        created_at: room.created_at,
                    })
                    .await?;
            }
            // Stored: the owners' count of stored rooms holds it now.
            room.created = None;
            if !room.stored {
                // Newly persistent: every affiliation so far.
                let all: Vec<_> = room
                    .affiliations
                    .iter()
                    .map(|(j, a)| store::RoomAffiliation {
                        jid: j.clone(),
                        affiliation: a.affiliation.as_str().to_owned(),
                        nick: a.nick.clone(),
                        reason: a.reason.clone(),
                    })
                    .collect();
                self.store.set_affiliations(&room.jid, &all).await?;
                room.stored = true;
            } else if !out.affiliations.is_empty() {
                self.store
                    .set_affiliations(&room.jid, &out.affiliations)
                    .await?;
            }
        } else if room.stored && !room.config.persistent {
            // Made temporary: it lives on in memory until it empties.
            self.store.delete_room(&room.jid).await?;
            room.stored = false;
        }
        Ok(())
    }
}

/// One stanza for room `jid` (which may not exist yet), routed from a
/// user, the room itself or another cluster node.
async fn process(
    inner: &Arc<Inner>,
    env: &Env,
    jid: &BareJid,
    room: &mut Option<Room>,
    st: Stanza,
) {
    // The administrator's request forwarded by another cluster node (the
    // admin API there answered 202): its outcome goes to the log, since
    // the router would drop an answer to the server's domain.
    let admin = inner
        .is_server_request(env, &st)
        .then(|| st.from().cloned());
    for s in apply(inner, env, jid, room, st).await {
        match &admin {
            Some(from) if s.to() == from.as_ref() => {
                let outcome = admin::outcome(&s);
                tracing::info!(module = NAME, room = %jid, outcome, "administrator request from another cluster node handled");
            }
            _ => env.route(s).await,
        }
    }
}

/// The server's administrator's request ([`Host::request`]): applied
/// like any stanza, its answer returned instead of routed.
async fn process_admin(
    inner: &Arc<Inner>,
    env: &Env,
    jid: &BareJid,
    room: &mut Option<Room>,
    st: Stanza,
) -> Option<Stanza> {
    if !inner.is_server_request(env, &st) {
        return st.error_reply(error(
            StanzaErrorCondition::Forbidden,
            "not a request of the server",
        ));
    }
    let requester = st.from().cloned();
    let mut answer = None;
    for s in apply(inner, env, jid, room, st).await {
        if answer.is_none() && s.to() == requester.as_ref() {
            answer = Some(s);
        } else {
            env.route(s).await;
        }
    }
    answer
}

/// Applies one stanza to room `jid` (which may not exist yet): stores
/// what must outlive it; returns what to route, in order.
async fn apply(
    inner: &Arc<Inner>,
    env: &Env,
    jid: &BareJid,
    room: &mut Option<Room>,
    st: Stanza,
) -> Vec<Stanza> {
    let cx = Ctx {
        svc: &inner.cfg,
        ids: &inner.ids,
    };
    let mut out = Out::default();
    // The server's own requests: a deleted account leaves (no answer);
    // the service administrator (the admin API) acts as an owner.
    let gone = host::account_removed(env, &st);
    let by_server = gone.is_none() && inner.is_server_request(env, &st);
    match room {
        Some(r) if gone.is_some() => {
            r.account_removed(gone.as_ref().expect("matched"), &mut out);
        }
        None if gone.is_some() => return Vec::new(),
        Some(r) if by_server => r.handle_server(&cx, st, &mut out),
        None if by_server => match admin::create_request(&st) {
            None => {
                return st
                    .error_reply(error(
                        StanzaErrorCondition::ItemNotFound,
                        "this room does not exist",
                    ))
                    .into_iter()
                    .collect();
            }
            Some(Err(why)) => {
                return st
                    .error_reply(error(StanzaErrorCondition::BadRequest, &why))
                    .into_iter()
                    .collect();
            }
            Some(Ok(req)) => {
                if req.persistent && !inner.cfg.allow_persistent {
                    return st
                        .error_reply(error(
                            StanzaErrorCondition::NotAllowed,
                            "this service keeps no rooms ([modules.muc] allow_persistent = false)",
                        ))
                        .into_iter()
                        .collect();
                }
                let mut c = RoomConfig::new_room(&inner.cfg, starling_proto::random_id(24));
                c.persistent = req.persistent;
                c.name = req.name;
                c.public = req.public.unwrap_or(c.public);
                c.members_only = req.members_only.unwrap_or(c.members_only);
                let mut r = Room::new(jid.clone(), c, String::new(), room::now_millis());
                r.make_owner(&req.owner, &mut out);
                // Nobody entered: a temporary room waits for its first
                // occupant (at most idle_unload_secs).
                r.waiting_for_first = !req.persistent;
                out.stanzas.push(st.iq_result(None));
                tracing::info!(module = NAME, room = %jid, owner = %req.owner, "room created by the administrator");
                *room = Some(r);
            }
        },
        Some(r) => {
            // XEP-0313 queries of the room's archive run beside the room.
            let Some(st) = mam::intercept(inner, env, r, st).await else {
                return Vec::new();
            };
            r.handle(&cx, st, &mut out);
            if let Some(m) = out.moderation.take() {
                // XEP-0425: the message is read from the archive (after
                // what is still queued for it is written).
                inner.archive.flush().await;
                let original = match inner
                    .storage
                    .archive
                    .query(
                        jid,
                        &ArchiveQuery {
                            ids: vec![m.id],
                            limit: 1,
                            ..ArchiveQuery::default()
                        },
                    )
                    .await
                {
                    Ok(page) => page
                        .messages
                        .into_iter()
                        .next()
                        .filter(|a| a.id.micros() / 1000 >= r.created_at)
                        .and_then(|a| a.stanza.parse::<Element>().ok()),
                    Err(e) => {
                        tracing::error!(module = NAME, room = %jid, error = %e, "reading a message to moderate failed");
                        None
                    }
                };
                let id = m.id;
                if let Some(tomb) = r.finish_moderation(&cx, m, original, &mut out) {
                    if let Err(e) = inner.storage.archive.replace(jid, id, &tomb).await {
                        tracing::error!(module = NAME, room = %jid, error = %e, "storing a moderation tombstone failed");
                    }
                }
            }
        }
        None => {
            let creating = st.kind() == StanzaKind::Presence
                && st.type_attr().is_none()
                && st.to().is_some_and(|t| t.resource().is_some());
            let Some(from) = st.from().cloned() else {
                return Vec::new();
            };
            if !creating {
                if st.is_iq_request() || (st.kind() == StanzaKind::Message && !st.is_error()) {
                    return st
                        .error_reply(error(
                            StanzaErrorCondition::ItemNotFound,
                            "this room does not exist",
                        ))
                        .into_iter()
                        .collect();
                }
                return Vec::new();
            }
            let creator = from.to_bare();
            if !inner.may_create(env, &creator) {
                return st
                    .error_reply(error(
                        StanzaErrorCondition::NotAllowed,
                        "you may not create rooms on this service",
                    ))
                    .into_iter()
                    .collect();
            }
            // Rooms the creator owns: stored ones, plus the ones only
            // memory holds (temporary, or not configured yet).
            let user_room = match inner.cfg.max_rooms_per_user {
                0 => None,
                max => match inner.owned_rooms(&creator).await {
                    Ok(n) => Some((max as usize).saturating_sub(n)),
                    Err(e) => {
                        tracing::error!(module = NAME, error = %e, "counting owned rooms failed");
                        return st
                            .error_reply(error(
                                StanzaErrorCondition::InternalServerError,
                                "the rooms you own could not be counted; try again later",
                            ))
                            .into_iter()
                            .collect();
                    }
                },
            };
            let slot = match inner
                .created
                .claim(&creator, user_room, inner.cfg.max_temporary_rooms)
            {
                Ok(slot) => slot,
                Err(why) => {
                    env.metrics.limit_refused(match why {
                        CreateRefused::User => "muc.max_rooms_per_user",
                        CreateRefused::Service => "muc.max_temporary_rooms",
                    });
                    let e = match why {
                        // §7.2.1-style policy: waiting does not help, destroying one does.
                        CreateRefused::User => error(
                            StanzaErrorCondition::NotAllowed,
                            &format!(
                                "you own as many rooms as this service allows ({}); destroy one first",
                                inner.cfg.max_rooms_per_user
                            ),
                        ),
                        CreateRefused::Service => StanzaError::new(
                            StanzaErrorCondition::ResourceConstraint,
                        )
                        .with_text("this service holds as many rooms as it allows; try again later"),
                    };
                    return st.error_reply(e).into_iter().collect();
                }
            };
            let mut r = Room::new(
                jid.clone(),
                RoomConfig::new_room(&inner.cfg, starling_proto::random_id(24)),
                String::new(),
                room::now_millis(),
            );
            r.locked = true;
            r.created = Some(slot);
            r.make_owner(&creator, &mut out);
            r.creating = true;
            r.handle(&cx, st, &mut out);
            r.creating = false;
            if r.is_empty() {
                // The creator could not enter (a bad nickname): no room.
                out.affiliations.clear();
                out.stanzas.retain(|s| s.is_error());
            } else {
                // Any user can create and leave rooms in a loop: each at
                // debug, at info one line per 10 s with a count.
                tracing::debug!(module = NAME, room = %jid, owner = %creator, "room created");
                starling_core::log_throttled!(info, module = NAME, room = %jid, owner = %creator, "room created");
                *room = Some(r);
            }
        }
    }
    if let Some(r) = room.as_mut() {
        if let Err(e) = inner.persist(r, &mut out).await {
            tracing::error!(module = NAME, room = %jid, error = %e, "storing the room failed");
        }
        for rec in out.archive.drain(..) {
            inner.archive.push(rec).await;
        }
        // XEP-0430: members' inboxes list the room, pointing into its
        // archive (one copy for everyone).
        if !out.inbox.is_empty() && !env.hooks.archived.is_empty() {
            host::to_inboxes(env, &r.jid, &r.members(), std::mem::take(&mut out.inbox)).await;
        }
        // A temporary (or never configured) room ends with its last occupant.
        if out.destroyed
            || (r.is_empty() && (!r.config.persistent || r.locked) && !r.waiting_for_first)
        {
            if r.stored {
                if let Err(e) = inner.store.delete_room(&r.jid).await {
                    tracing::error!(module = NAME, room = %jid, error = %e, "deleting the room failed");
                }
            }
            // Its history goes with it (after what is still queued).
            inner.archive.flush().await;
            if let Err(e) = inner.storage.archive.purge_user(&r.jid, None).await {
                tracing::error!(module = NAME, room = %jid, error = %e, "deleting the room's archive failed");
            }
            if r.stored {
                tracing::info!(module = NAME, room = %jid, "room destroyed");
            } else {
                tracing::debug!(module = NAME, room = %jid, "room destroyed");
                starling_core::log_throttled!(info, module = NAME, room = %jid, "room destroyed");
            }
            *room = None;
        }
    }
    out.stanzas
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cli_room_is_persistent_with_the_service_defaults_and_a_random_salt() {
        let svc = MucConfig {
            default_max_users: 30,
            max_users: 40,
            default_moderated: true,
            ..MucConfig::default()
        };
        let room = CliRoom {
            name: "Lobby".into(),
            hidden: true,
            password: Some("s3cret".into()),
            ..CliRoom::default()
        };
        let a = RoomConfig::from_stored(&stored_config_for_cli(&svc, &room).unwrap()).unwrap();
        let b = RoomConfig::from_stored(&stored_config_for_cli(&svc, &room).unwrap()).unwrap();
        assert!(a.persistent && a.moderated && !a.public && !a.members_only);
        assert_eq!((a.max_users, a.name.as_str()), (30, "Lobby"));
        assert!(a.password_protected && a.password == "s3cret");
        assert_eq!(a.salt.len(), 24);
        assert_ne!(a.salt, b.salt);
        let s = stored_config_summary(&a.to_stored()).unwrap();
        assert_eq!(
            (s.name.as_str(), s.public, s.password_protected),
            ("Lobby", false, true)
        );
        let no_persistence = MucConfig {
            allow_persistent: false,
            ..MucConfig::default()
        };
        assert!(stored_config_for_cli(&no_persistence, &CliRoom::default()).is_err());
        let empty_password = CliRoom {
            password: Some(String::new()),
            ..CliRoom::default()
        };
        assert!(stored_config_for_cli(&svc, &empty_password).is_err());
    }
}
