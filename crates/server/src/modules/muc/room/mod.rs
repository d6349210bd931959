//! One room's state and the XEP-0045 rules applied to it. Everything here
//! is synchronous: a handler reads a stanza and appends what must happen to
//! an [`Out`] (stanzas to route, rows to store), which the room's task
//! carries out in order. Section numbers are XEP-0045's.
//!
//! This file holds the room's state and types (roles and affiliations,
//! §5), the helpers every part uses and the dispatch of a stanza
//! ([`Room::handle`], [`Room::handle_server`]). The rules live by section:
//!
//! - `occupants.rs`: entering (§7.2), presence changes (§7.7), nickname
//!   changes (§7.6), leaving (§7.14), removals, the presence broadcast;
//! - `messages.rs`: groupchat messages (§7.4), private messages (§7.5),
//!   invitations (§7.8), the subject (§8.1), the history (§7.2.13),
//!   the room's own announcements;
//! - `moderation.rs`: roles, kicks and voice (§8.2–§8.4), voice requests
//!   (§7.13, §8.6), moderated retractions (XEP-0425);
//! - `admin.rs`: `muc#admin` lists and changes of roles and affiliations
//!   (§8.5, §9, §10.3–§10.8: bans, member lists, admins, owners) and
//!   nickname registration (§7.10);
//! - `owner.rs`: configuration (§10.1–§10.2), destruction (§10.9), the
//!   room's vCard (XEP-0486);
//! - `iq.rs`: iq to the room and to its occupants (disco §6.4–§6.5,
//!   self-ping XEP-0410, forwarded requests).

use super::config::{RoomConfig, Whois};
use super::store::RoomAffiliation;
use super::{MucConfig, NS_MUC_ADMIN, NS_MUC_OWNER, NS_MUC_USER, NS_OCCUPANT_ID};
use starling_core::storage::{ArchiveId, ArchiveIds, ArchiveRecord};
use starling_proto::{
    ns, BareJid, FullJid, Jid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind,
};
use starling_xml::Element;
use std::collections::{BTreeMap, HashMap, VecDeque};

mod admin;
mod iq;
mod messages;
mod moderation;
mod occupants;
mod owner;

pub(super) use messages::{inbox_kind, is_archivable, origin_id};

/// An occupant's role (§5.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Not in the room.
    None,
    /// May not speak in a moderated room.
    Visitor,
    /// May speak.
    Participant,
    /// May kick and grant voice.
    Moderator,
}

impl Role {
    /// The protocol name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::None => "none",
            Role::Visitor => "visitor",
            Role::Participant => "participant",
            Role::Moderator => "moderator",
        }
    }

    fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "none" => Role::None,
            "visitor" => Role::Visitor,
            "participant" => Role::Participant,
            "moderator" => Role::Moderator,
            _ => return None,
        })
    }
}

/// A long-lived affiliation with the room (§5.2), ordered by rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Affiliation {
    /// Banned.
    Outcast,
    /// No affiliation.
    None,
    /// On the member list.
    Member,
    /// Room administrator.
    Admin,
    /// Room owner.
    Owner,
}

impl Affiliation {
    /// The protocol name.
    pub fn as_str(self) -> &'static str {
        match self {
            Affiliation::Outcast => "outcast",
            Affiliation::None => "none",
            Affiliation::Member => "member",
            Affiliation::Admin => "admin",
            Affiliation::Owner => "owner",
        }
    }

    /// Parses a protocol name.
    pub fn parse(s: &str) -> Option<Affiliation> {
        Some(match s {
            "outcast" => Affiliation::Outcast,
            "none" => Affiliation::None,
            "member" => Affiliation::Member,
            "admin" => Affiliation::Admin,
            "owner" => Affiliation::Owner,
            _ => return None,
        })
    }
}

/// A stored affiliation.
#[derive(Clone, Debug)]
pub struct Aff {
    /// The affiliation.
    pub affiliation: Affiliation,
    /// Registered nickname (§7.10).
    pub nick: Option<String>,
    /// Reason given.
    pub reason: Option<String>,
}

/// One occupant: a nickname held by one bare JID from one or more of its
/// sessions (multi-session nicks, as ejabberd and Prosody allow).
#[derive(Debug)]
pub struct Occupant {
    /// The room nickname.
    pub nick: String,
    /// The real bare JID.
    pub bare: BareJid,
    /// Each joined session with the presence it last sent.
    pub sessions: Vec<(FullJid, Element)>,
    /// Current role.
    pub role: Role,
    /// Its XEP-0421 occupant id (computed once).
    pub oid: String,
}

/// A message of the history sent on entering (§7.2.13).
#[derive(Clone, Debug)]
pub struct HistoryItem {
    /// Its archive id (time and `<stanza-id/>`).
    pub id: ArchiveId,
    /// The message as broadcast (no `to`).
    pub el: Element,
    /// Its size in characters, for `maxchars`.
    pub chars: usize,
}

/// What a handler asks the room's task to do, in order.
#[derive(Default)]
pub struct Out {
    /// Stanzas to route.
    pub stanzas: Vec<Stanza>,
    /// Store the room's configuration and subject.
    pub save: bool,
    /// Affiliation rows to store.
    pub affiliations: Vec<RoomAffiliation>,
    /// Archive rows to append.
    pub archive: Vec<ArchiveRecord>,
    /// The room was destroyed (delete it and stop).
    pub destroyed: bool,
    /// A moderator's retraction waiting for the archived message
    /// (XEP-0425): the task looks it up, then calls
    /// [`Room::finish_moderation`].
    pub moderation: Option<Moderation>,
    /// Archived messages the members' inboxes count (XEP-0430): id,
    /// sender, kind, the message.
    pub inbox: Vec<(ArchiveId, BareJid, starling_proto::mam::Kind, Element)>,
}

/// A moderation request whose message must be read from the archive.
pub struct Moderation {
    /// The moderator's iq.
    pub iq: Stanza,
    /// The message's stanza id (its archive id).
    pub id: ArchiveId,
    /// The moderator's occupant JID.
    pub by: Jid,
    /// The moderator's occupant id.
    pub by_occupant: Element,
    /// Why.
    pub reason: Option<String>,
}

/// What a handler needs besides the room.
pub struct Ctx<'a> {
    /// The service configuration.
    pub svc: &'a MucConfig,
    /// The node's archive ids.
    pub ids: &'a ArchiveIds,
}

/// A forwarded iq waiting for its answer (§6.5 / implementation notes).
struct PendingIq {
    requester: FullJid,
    id: String,
    target_nick: String,
    at: std::time::Instant,
}

/// A room.
pub struct Room {
    /// The room's JID.
    pub jid: BareJid,
    /// Its configuration.
    pub config: RoomConfig,
    /// Current subject and the nick that set it (empty: the room).
    pub subject: String,
    subject_by: String,
    /// Affiliations by bare JID (or domain).
    pub affiliations: BTreeMap<String, Aff>,
    /// Occupants by nickname.
    pub occupants: BTreeMap<String, Occupant>,
    by_jid: HashMap<FullJid, String>,
    /// Locked until its owner configures it (§10.1.1).
    pub locked: bool,
    /// Stored in the database.
    pub stored: bool,
    /// Creation time, ms since the epoch.
    pub created_at: i64,
    /// Recent messages (history on entering).
    pub history: VecDeque<HistoryItem>,
    pending_iq: HashMap<String, PendingIq>,
    next_iq: u64,
    /// Set while the presence that creates the room is handled (§10.1.1:
    /// status 201).
    pub creating: bool,
    /// Made by the administrator and nobody entered yet: a temporary room
    /// is not ended for being empty until its first occupant came (its
    /// task still ends after `idle_unload_secs` without anyone).
    pub waiting_for_first: bool,
    /// Its creator's place under `max_rooms_per_user` and the service's
    /// `max_temporary_rooms` while only memory holds it (given back when
    /// it is stored, or with the room).
    pub created: Option<super::host::CreatedSlot>,
}

fn err(c: StanzaErrorCondition, text: &str) -> StanzaError {
    StanzaError::new(c).with_text(text)
}

/// The error reply to `st`, from what it was sent to.
fn reply_error(st: &Stanza, e: StanzaError, out: &mut Out) {
    if let Some(r) = st.error_reply(e) {
        out.stanzas.push(r);
    }
}

fn status(code: u16) -> Element {
    Element::builder("status", NS_MUC_USER)
        .attr("code", code.to_string())
        .build()
}

/// Conditions of an error reply that mean the occupant's client is gone
/// (§ "Service removes user because of error response").
fn means_gone(st: &Stanza) -> bool {
    let Some(e) = st.element().get_child("error", ns::CLIENT) else {
        return false;
    };
    e.children().any(|c| {
        c.ns() == ns::STANZAS
            && matches!(
                c.name(),
                "gone"
                    | "item-not-found"
                    | "recipient-unavailable"
                    | "redirect"
                    | "remote-server-not-found"
                    | "remote-server-timeout"
                    | "service-unavailable"
                    | "malformed-jid"
                    | "jid-malformed"
            )
    })
}

/// Milliseconds since the Unix epoch.
pub fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Details of an `<item/>` in a `muc#user` payload.
#[derive(Default)]
struct ItemExtra<'a> {
    nick: Option<&'a str>,
    actor: Option<&'a str>,
    reason: Option<&'a str>,
}

impl Room {
    /// A room as loaded from storage (or new: `stored` false).
    pub fn new(jid: BareJid, config: RoomConfig, subject: String, created_at: i64) -> Room {
        let (subject, subject_by) = match subject.split_once('\n') {
            Some((by, text)) => (text.to_owned(), by.to_owned()),
            None => (subject, String::new()),
        };
        Room {
            jid,
            config,
            subject,
            subject_by,
            affiliations: BTreeMap::new(),
            occupants: BTreeMap::new(),
            by_jid: HashMap::new(),
            locked: false,
            stored: false,
            created_at,
            history: VecDeque::new(),
            pending_iq: HashMap::new(),
            next_iq: 0,
            creating: false,
            waiting_for_first: false,
            created: None,
        }
    }

    /// The subject as stored: the setter's nick, a newline, the text.
    pub fn stored_subject(&self) -> String {
        if self.subject_by.is_empty() && !self.subject.contains('\n') {
            self.subject.clone()
        } else {
            format!("{}\n{}", self.subject_by, self.subject)
        }
    }

    /// Whether nobody is in the room.
    pub fn is_empty(&self) -> bool {
        self.occupants.is_empty()
    }

    /// The occupant JID of a nick.
    fn occupant_jid(&self, nick: &str) -> Jid {
        self.jid
            .with_resource_str(nick)
            .map(Jid::from)
            .unwrap_or_else(|_| self.jid.clone().into())
    }

    /// `bare`'s affiliation: its own row, else its domain's.
    pub fn affiliation_of(&self, bare: &BareJid) -> Affiliation {
        if let Some(a) = self.affiliations.get(bare.as_str()) {
            return a.affiliation;
        }
        if bare.node().is_some() {
            if let Some(a) = self.affiliations.get(bare.domain().as_str()) {
                return a.affiliation;
            }
        }
        Affiliation::None
    }

    /// JIDs holding `a`.
    pub fn with_affiliation(&self, a: Affiliation) -> Vec<String> {
        self.affiliations
            .iter()
            .filter(|(_, v)| v.affiliation == a)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The role an affiliation enters with (§5.1.2).
    fn default_role(&self, a: Affiliation) -> Role {
        match a {
            Affiliation::Owner | Affiliation::Admin => Role::Moderator,
            Affiliation::Member => Role::Participant,
            Affiliation::None if self.config.moderated => Role::Visitor,
            Affiliation::None => Role::Participant,
            Affiliation::Outcast => Role::None,
        }
    }

    /// The bare JID that registered `nick`, if any.
    fn nick_owner(&self, nick: &str) -> Option<&str> {
        self.affiliations
            .iter()
            .find(|(_, a)| a.nick.as_deref() == Some(nick))
            .map(|(j, _)| j.as_str())
    }

    /// A stable occupant id (XEP-0421): a keyed hash of the real bare JID.
    fn occupant_id(&self, bare: &BareJid) -> String {
        use base64::Engine as _;
        use hmac::{KeyInit as _, Mac as _};
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(self.config.salt.as_bytes())
            .expect("HMAC takes any key length");
        mac.update(self.jid.as_str().as_bytes());
        mac.update(b"\0");
        mac.update(bare.as_str().as_bytes());
        base64::engine::general_purpose::STANDARD.encode(&mac.finalize().into_bytes()[..16])
    }

    fn occupant_id_el(&self, bare: &BareJid) -> Element {
        Element::builder("occupant-id", NS_OCCUPANT_ID)
            .attr("id", self.occupant_id(bare))
            .build()
    }

    /// Whether `viewer` may see real JIDs.
    fn sees_jids(&self, viewer: Role) -> bool {
        self.config.whois == Whois::Anyone || viewer == Role::Moderator
    }

    /// Handles one stanza addressed to the room or one of its occupants.
    pub fn handle(&mut self, cx: &Ctx<'_>, st: Stanza, out: &mut Out) {
        let Some(from) = st.from().and_then(|f| f.try_as_full().ok()).cloned() else {
            return; // users' sessions always stamp a full JID
        };
        let nick = st
            .to()
            .and_then(|t| t.resource())
            .map(|r| r.as_str().to_owned());
        match (st.kind(), nick) {
            (StanzaKind::Presence, nick) => self.on_presence(cx, &st, &from, nick.as_deref(), out),
            (StanzaKind::Message, None) => self.on_room_message(cx, &st, &from, out),
            (StanzaKind::Message, Some(n)) => self.on_private_message(&st, &from, &n, out),
            (StanzaKind::Iq, None) => self.on_room_iq(cx, &st, &from, out),
            (StanzaKind::Iq, Some(n)) => self.on_occupant_iq(&st, &from, &n, out),
        }
    }

    /// A request of the server itself acting as the service's
    /// administrator (the admin API; the host checked `from`): owner
    /// rights without being an occupant. Affiliation changes (`muc#admin`
    /// items, §9–§10, with their presence effects), destruction (§10.9)
    /// and a groupchat message the room sends as its own
    /// ([`Room::announce`]); a creation request for a room that exists is
    /// `conflict`.
    pub fn handle_server(&mut self, cx: &Ctx<'_>, st: Stanza, out: &mut Out) {
        match st.kind() {
            StanzaKind::Iq if st.type_attr() == Some("set") => {
                let answer = match st.payload() {
                    Some(q) if q.is("query", NS_MUC_ADMIN) => {
                        self.admin_items((Role::None, Affiliation::Owner, None), None, q, out)
                    }
                    Some(q) if q.is("query", NS_MUC_OWNER) => {
                        match q.get_child("destroy", NS_MUC_OWNER) {
                            Some(d) => {
                                self.destroy(d, out);
                                Ok(None)
                            }
                            None => Err(err(
                                StanzaErrorCondition::BadRequest,
                                "only destroy is taken from the server",
                            )),
                        }
                    }
                    Some(q) if q.is("create", super::NS_ADMIN) => Err(err(
                        StanzaErrorCondition::Conflict,
                        "this room exists already",
                    )),
                    _ => Err(err(
                        StanzaErrorCondition::BadRequest,
                        "not a request the room takes from the server",
                    )),
                };
                match answer {
                    Ok(p) => out.stanzas.push(st.iq_result(p)),
                    Err(e) => reply_error(&st, e, out),
                }
            }
            StanzaKind::Message if st.stanza_type() == "groupchat" => self.announce(cx, &st, out),
            // Answers and presence are nobody's request: no error for them.
            _ if st.is_iq_request() || (st.kind() == StanzaKind::Message && !st.is_error()) => {
                reply_error(
                    &st,
                    err(
                        StanzaErrorCondition::BadRequest,
                        "not a request the room takes from the server",
                    ),
                    out,
                )
            }
            _ => {}
        }
    }

    /// Members (affiliation member, admin or owner) with an account JID:
    /// whose inboxes list the room.
    pub fn members(&self) -> Vec<BareJid> {
        self.affiliations
            .iter()
            .filter(|(_, a)| a.affiliation >= Affiliation::Member)
            .filter_map(|(j, _)| BareJid::new(j).ok().filter(|b| b.node().is_some()))
            .collect()
    }

    /// A new room's creator becomes its owner (§10.1.1).
    pub fn make_owner(&mut self, creator: &BareJid, out: &mut Out) {
        self.set_affiliation(creator.as_str(), Affiliation::Owner, None, out);
    }

    /// Occupant count.
    pub fn occupant_count(&self) -> usize {
        self.occupants.len()
    }
}

#[cfg(test)]
mod tests;
