//! One room's state and the XEP-0045 rules applied to it. Everything here
//! is synchronous: a handler reads a stanza and appends what must happen to
//! an [`Out`] (stanzas to route, rows to store), which the room's task
//! carries out in order. Section numbers are XEP-0045's.

use super::config::{AllowPm, FormProblem, RoomConfig, Whois};
use super::{
    MucConfig, NS_MODERATE, NS_MUC, NS_MUC_ADMIN, NS_MUC_OWNER, NS_MUC_REQUEST, NS_MUC_USER,
    NS_OCCUPANT_ID, NS_RETRACT, NS_SELF_PING_OPT, NS_VCARD, NS_VCARD_UPDATE,
};
use crate::modules::common::archive_query::NS_MAM_EXTENDED;
use starling_core::forms::{FormBuilder, Submitted};
use starling_core::storage::{ArchiveId, ArchiveIds, ArchiveRecord, RoomAffiliation, FLAG_BODY};
use starling_proto::{
    ns, BareJid, FullJid, Jid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind,
};
use starling_xml::{Element, Node};
use std::collections::{BTreeMap, HashMap, VecDeque};

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

/// A presence's children worth broadcasting: everything but MUC payloads
/// and occupant ids, which the room writes itself.
fn presence_payload(el: &Element) -> impl Iterator<Item = &Element> {
    el.children().filter(|c| {
        !(c.ns() == NS_MUC || c.ns() == NS_MUC_USER || c.is("occupant-id", NS_OCCUPANT_ID))
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

    /// The `muc#user` payload describing occupant `o` to a viewer.
    fn user_x(
        &self,
        o: &Occupant,
        real: Option<&FullJid>,
        role: Role,
        extra: &ItemExtra<'_>,
    ) -> Element {
        let aff = self.affiliation_of(&o.bare);
        let mut item = Element::builder("item", NS_MUC_USER)
            .attr("affiliation", aff.as_str())
            .attr("role", role.as_str())
            .build();
        if let Some(j) = real {
            item.set_attr("jid", j.as_str());
        }
        if let Some(n) = extra.nick {
            item.set_attr("nick", n);
        }
        if let Some(a) = extra.actor {
            item.append_child(
                Element::builder("actor", NS_MUC_USER)
                    .attr("nick", a)
                    .build(),
            );
        }
        if let Some(r) = extra.reason {
            item.append_child(Element::builder("reason", NS_MUC_USER).text(r).build());
        }
        Element::builder("x", NS_MUC_USER).append(item).build()
    }

    /// Sends occupant `nick`'s presence (available with its last presence,
    /// or unavailable) to every session in the room: `codes` for all,
    /// `self_codes` (after 110) for the occupant's own sessions. Presence
    /// of a role that is not broadcast goes to the occupant only.
    #[allow(clippy::too_many_arguments)]
    fn broadcast_presence(
        &self,
        o: &Occupant,
        unavailable: bool,
        role: Role,
        codes: &[u16],
        self_codes: &[u16],
        extra: &ItemExtra<'_>,
        destroy: Option<&Element>,
        out: &mut Out,
    ) {
        let broadcast =
            unavailable || RoomConfig::lists(&self.config.presence_broadcast, role.as_str());
        let from = self.occupant_jid(&o.nick);
        let base = o.sessions.last().map(|(_, p)| p);
        let shown_jid = o.sessions.last().map(|(j, _)| j);
        for viewer in self.occupants.values() {
            let me = viewer.nick == o.nick;
            if !me && !broadcast {
                continue;
            }
            for (to, _) in &viewer.sessions {
                let mut x = self.user_x(
                    o,
                    shown_jid.filter(|_| me || self.sees_jids(viewer.role)),
                    role,
                    extra,
                );
                if me {
                    x.append_child(status(110));
                    for c in self_codes {
                        x.append_child(status(*c));
                    }
                }
                for c in codes {
                    x.append_child(status(*c));
                }
                if let Some(d) = destroy {
                    x.append_child(d.clone());
                }
                out.stanzas
                    .push(self.presence_stanza(o, base, unavailable, x, &from, to));
            }
        }
    }

    fn presence_stanza(
        &self,
        o: &Occupant,
        base: Option<&Element>,
        unavailable: bool,
        x: Element,
        from: &Jid,
        to: &FullJid,
    ) -> Stanza {
        let mut el = Element::new("presence", ns::CLIENT);
        if unavailable {
            el.set_attr("type", "unavailable");
        }
        if let Some(b) = base {
            for c in presence_payload(b) {
                if !unavailable || c.is("status", ns::CLIENT) {
                    el.append_child(c.clone());
                }
            }
        }
        el.append_child(x);
        el.append_child(
            Element::builder("occupant-id", NS_OCCUPANT_ID)
                .attr("id", o.oid.as_str())
                .build(),
        );
        Stanza::new(el, Some(from.clone()), Some(to.clone().into()))
    }

    /// Sends occupant `o`'s current presence to one session.
    fn presence_to(&self, o: &Occupant, to: &FullJid, viewer: Role, out: &mut Out) {
        let real = o
            .sessions
            .last()
            .map(|(j, _)| j)
            .filter(|_| self.sees_jids(viewer));
        let x = self.user_x(o, real, o.role, &ItemExtra::default());
        let from = self.occupant_jid(&o.nick);
        out.stanzas.push(self.presence_stanza(
            o,
            o.sessions.last().map(|(_, p)| p),
            false,
            x,
            &from,
            to,
        ));
    }

    // ---------------------------------------------------------------
    // Dispatch
    // ---------------------------------------------------------------

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

    /// A groupchat message from the room's own JID (an announcement, like
    /// the room's status messages): its body goes to every occupant with
    /// a stanza id, and into the archive, the members' inboxes and the
    /// history when the room logs (`muc#roomconfig_enablelogging`).
    fn announce(&mut self, cx: &Ctx<'_>, st: &Stanza, out: &mut Out) {
        let Some(body) = st
            .element()
            .get_child("body", ns::CLIENT)
            .filter(|b| !b.text().is_empty())
        else {
            return reply_error(
                st,
                err(StanzaErrorCondition::BadRequest, "a body is required"),
                out,
            );
        };
        let from: Jid = self.jid.clone().into();
        let id = cx.ids.next();
        let msg_id = st
            .id()
            .map(str::to_owned)
            .unwrap_or_else(|| starling_proto::random_id(10));
        let m = Element::builder("message", ns::CLIENT)
            .attr("type", "groupchat")
            .attr("id", msg_id)
            .attr("from", self.jid.as_str())
            .append(body.clone())
            .append(
                Element::builder("stanza-id", ns::SID)
                    .attr("id", id.encode())
                    .attr("by", self.jid.as_str())
                    .build(),
            )
            .build();
        if self.config.logging {
            if let Some(kind) = inbox_kind(&m) {
                out.inbox.push((id, self.jid.clone(), kind, m.clone()));
            }
            out.archive.push(ArchiveRecord {
                owner: self.jid.clone(),
                id,
                with_bare: self.jid.to_string(),
                remote: self.jid.to_string(),
                outgoing: false,
                origin_id: None,
                flags: FLAG_BODY,
                stanza: m.to_string(),
            });
        }
        self.remember(cx, id, &m);
        self.to_everyone(&m, &from, out);
    }

    /// Keeps `m` (archive id `id`) in the history sent on entering, at
    /// most `max_history` messages.
    fn remember(&mut self, cx: &Ctx<'_>, id: ArchiveId, m: &Element) {
        self.history.push_back(HistoryItem {
            id,
            el: m.clone(),
            chars: m.size_hint(),
        });
        while self.history.len() > cx.svc.max_history as usize {
            self.history.pop_front();
        }
    }

    // ---------------------------------------------------------------
    // Presence: entering, changing, leaving (§7.2, §7.6, §7.7, §7.14)
    // ---------------------------------------------------------------

    fn on_presence(
        &mut self,
        cx: &Ctx<'_>,
        st: &Stanza,
        from: &FullJid,
        nick: Option<&str>,
        out: &mut Out,
    ) {
        match st.type_attr() {
            None => {}
            Some("unavailable") => {
                if self.by_jid.contains_key(from) {
                    self.leave(from, st.element(), out);
                }
                return;
            }
            Some("error") => {
                if self.by_jid.contains_key(from) && means_gone(st) {
                    self.remove_session(from, &[333], out);
                }
                return;
            }
            _ => return, // subscriptions and probes mean nothing to a room
        }
        let Some(raw) = nick else {
            // §7.2.1: entering needs a nickname.
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::JidMalformed,
                    "a room nickname is required",
                ),
                out,
            );
        };
        let nick = match self.jid.with_resource_str(raw) {
            Ok(j)
                if raw.trim() == raw
                    && !raw.is_empty()
                    && raw.chars().count() <= cx.svc.max_nick_len as usize =>
            {
                j.resource().as_str().to_owned()
            }
            _ => {
                return reply_error(
                    st,
                    err(
                        StanzaErrorCondition::JidMalformed,
                        "this nickname is not allowed",
                    ),
                    out,
                )
            }
        };
        match self.by_jid.get(from).cloned() {
            Some(cur) if cur == nick => self.update_presence(from, st, out),
            Some(cur) => self.change_nick(from, &cur, &nick, st, out),
            None => self.join(cx, from, &nick, st, self.creating, out),
        }
    }

    /// §7.2: enters `from` with `nick`. `created`: the room was just made
    /// for this presence (§10.1.1: status 201, the creator becomes owner).
    pub fn join(
        &mut self,
        _cx: &Ctx<'_>,
        from: &FullJid,
        nick: &str,
        st: &Stanza,
        created: bool,
        out: &mut Out,
    ) {
        let bare = from.to_bare();
        let aff = self.affiliation_of(&bare);
        let refuse = |c: StanzaErrorCondition, text: &str, out: &mut Out| {
            let mut e = st.error_reply(err(c, text));
            if let Some(e) = &mut e {
                e.element_mut().remove_children("x", NS_MUC);
                e.element_mut().append_child(Element::new("x", NS_MUC));
            }
            out.stanzas.extend(e);
        };
        if self.locked && aff != Affiliation::Owner {
            // §7.2.10
            return refuse(
                StanzaErrorCondition::ItemNotFound,
                "this room is locked until its owner configures it",
                out,
            );
        }
        if aff == Affiliation::Outcast {
            return refuse(
                StanzaErrorCondition::Forbidden,
                "you are banned from this room",
                out,
            ); // §7.2.7
        }
        if self.config.members_only && aff < Affiliation::Member {
            return refuse(
                StanzaErrorCondition::RegistrationRequired,
                "this room is for members only",
                out,
            ); // §7.2.6
        }
        let same_person = self.occupants.get(nick).map(|o| o.bare == bare);
        if same_person == Some(false) || self.nick_owner(nick).is_some_and(|o| o != bare.as_str()) {
            // §7.2.8
            return refuse(
                StanzaErrorCondition::Conflict,
                "this nickname is in use or registered by someone else",
                out,
            );
        }
        if same_person.is_none()
            && self.occupants.len() >= self.config.max_users as usize
            && aff < Affiliation::Admin
        {
            return refuse(
                StanzaErrorCondition::ServiceUnavailable,
                "this room is full",
                out,
            ); // §7.2.9
        }
        let x = st.element().get_child("x", NS_MUC);
        if self.config.password_protected {
            let given = x
                .and_then(|x| x.get_child("password", NS_MUC))
                .map(|p| p.text());
            if given.as_deref() != Some(self.config.password.as_str()) {
                return refuse(
                    StanzaErrorCondition::NotAuthorized,
                    "this room needs a password",
                    out,
                ); // §7.2.5
            }
        }
        let role = self.default_role(aff);
        let mut presence = st.element().clone();
        presence.remove_children("x", NS_MUC);
        self.waiting_for_first = false;
        self.by_jid.insert(from.clone(), nick.to_owned());
        match self.occupants.get_mut(nick) {
            Some(o) => o.sessions.push((from.clone(), presence)),
            None => {
                self.occupants.insert(
                    nick.to_owned(),
                    Occupant {
                        nick: nick.to_owned(),
                        oid: self.occupant_id(&bare),
                        bare: bare.clone(),
                        sessions: vec![(from.clone(), presence)],
                        role,
                    },
                );
            }
        }
        let me = &self.occupants[nick];
        // §7.2.3: the others' presence first…
        for o in self.occupants.values() {
            if o.nick != nick && RoomConfig::lists(&self.config.presence_broadcast, o.role.as_str())
            {
                self.presence_to(o, from, me.role, out);
            }
        }
        // …then the new presence to everyone, the occupant's own last.
        let mut self_codes = Vec::new();
        if self.config.whois == Whois::Anyone {
            self_codes.push(100); // §7.2.4
        }
        if self.config.logging {
            self_codes.push(170); // §7.2.12
        }
        if created {
            self_codes.push(201); // §10.1.1
        }
        let mut own = Vec::new();
        {
            let mut all = Out::default();
            self.broadcast_presence(
                me,
                false,
                me.role,
                &[],
                &self_codes,
                &ItemExtra::default(),
                None,
                &mut all,
            );
            let me_jid = Jid::from(from.clone());
            for s in all.stanzas {
                if s.to() == Some(&me_jid) {
                    own.push(s);
                } else {
                    out.stanzas.push(s);
                }
            }
        }
        out.stanzas.extend(own);
        // §7.2.13–§7.2.15: history, then the subject.
        self.send_history(x, from, out);
        let subject_from = if self.subject_by.is_empty() {
            Jid::from(self.jid.clone())
        } else {
            self.occupant_jid(&self.subject_by)
        };
        let subject = Element::builder("message", ns::CLIENT)
            .attr("type", "groupchat")
            .attr("id", starling_proto::random_id(10))
            .append(
                Element::builder("subject", ns::CLIENT)
                    .text(self.subject.as_str())
                    .build(),
            )
            .build();
        out.stanzas.push(Stanza::new(
            subject,
            Some(subject_from),
            Some(from.clone().into()),
        ));
    }

    /// §7.2.13–§7.2.14: the recent messages, filtered by the request.
    fn send_history(&self, x: Option<&Element>, to: &FullJid, out: &mut Out) {
        let h = x.and_then(|x| x.get_child("history", NS_MUC));
        let attr = |n: &str| h.and_then(|h| h.attr(n));
        let num = |n: &str| attr(n).and_then(|v| v.trim().parse::<u64>().ok());
        let mut max_stanzas = self.config.history_size as u64;
        if let Some(n) = num("maxstanzas") {
            max_stanzas = max_stanzas.min(n);
        }
        let max_chars = num("maxchars");
        let mut since =
            attr("since").and_then(|s| starling_proto::datetime::parse_xep0082(s.trim()));
        if let Some(secs) = num("seconds") {
            let t = now_millis() - (secs.min(i64::MAX as u64 / 2000) as i64) * 1000;
            since = Some(since.map_or(t, |s| s.max(t)));
        }
        let mut picked: Vec<&HistoryItem> = Vec::new();
        let mut chars = 0u64;
        for item in self.history.iter().rev() {
            if picked.len() as u64 >= max_stanzas {
                break;
            }
            if since.is_some_and(|s| item.id.micros() / 1000 < s) {
                break;
            }
            if let Some(m) = max_chars {
                chars += item.chars as u64;
                if chars > m {
                    break;
                }
            }
            picked.push(item);
        }
        for item in picked.into_iter().rev() {
            let mut el = item.el.clone();
            el.append_child(
                Element::builder("delay", ns::DELAY)
                    .attr("from", self.jid.as_str())
                    .attr("stamp", item.id.stamp())
                    .build(),
            );
            let from = el.attr("from").and_then(|f| Jid::new(f).ok());
            out.stanzas
                .push(Stanza::new(el, from, Some(to.clone().into())));
        }
    }

    /// §7.7: a new availability from a joined session.
    fn update_presence(&mut self, from: &FullJid, st: &Stanza, out: &mut Out) {
        let Some(nick) = self.by_jid.get(from).cloned() else {
            return;
        };
        let Some(o) = self.occupants.get_mut(&nick) else {
            return;
        };
        let mut p = st.element().clone();
        p.remove_children("x", NS_MUC);
        if let Some(i) = o.sessions.iter().position(|(j, _)| j == from) {
            let s = o.sessions.remove(i);
            o.sessions.push((s.0, p));
        }
        let o = &self.occupants[&nick];
        self.broadcast_presence(o, false, o.role, &[], &[], &ItemExtra::default(), None, out);
    }

    /// §7.6: a joined session asks for another nickname.
    fn change_nick(&mut self, from: &FullJid, cur: &str, new: &str, st: &Stanza, out: &mut Out) {
        let bare = from.to_bare();
        let taken = self.occupants.get(new).is_some_and(|o| o.bare != bare)
            || self.nick_owner(new).is_some_and(|o| o != bare.as_str());
        if taken {
            // §7.6.3
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::Conflict,
                    "this nickname is in use or registered by someone else",
                ),
                out,
            );
        }
        if self.occupants.contains_key(new) {
            // Another session of the same person holds it: join that nick.
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::NotAcceptable,
                    "leave the room before taking the nickname of your other session",
                ),
                out,
            );
        }
        let Some(o) = self.occupants.get(cur) else {
            return;
        };
        // Unavailable from the old nick with 303 and the new nick…
        let extra = ItemExtra {
            nick: Some(new),
            ..Default::default()
        };
        self.broadcast_presence(o, true, o.role, &[303], &[], &extra, None, out);
        let Some(mut o) = self.occupants.remove(cur) else {
            return;
        };
        // …then available from the new one (§7.6.2).
        let mut p = st.element().clone();
        p.remove_children("x", NS_MUC);
        if let Some(i) = o.sessions.iter().position(|(j, _)| j == from) {
            o.sessions[i].1 = p;
            let s = o.sessions.remove(i);
            o.sessions.push(s);
        }
        o.nick = new.to_owned();
        for (j, _) in &o.sessions {
            self.by_jid.insert(j.clone(), new.to_owned());
        }
        if self.subject_by == cur {
            self.subject_by = new.to_owned();
        }
        self.occupants.insert(new.to_owned(), o);
        let o = &self.occupants[new];
        self.broadcast_presence(o, false, o.role, &[], &[], &ItemExtra::default(), None, out);
    }

    /// §7.14: a session leaves (its last presence's status is kept).
    fn leave(&mut self, from: &FullJid, presence: &Element, out: &mut Out) {
        let Some(nick) = self.by_jid.remove(from) else {
            return;
        };
        let Some(o) = self.occupants.get_mut(&nick) else {
            return;
        };
        o.sessions.retain(|(j, _)| j != from);
        if !o.sessions.is_empty() {
            // Another session keeps the nick: only this one is told.
            let o = &self.occupants[&nick];
            let mut x = self.user_x(o, Some(from), Role::None, &ItemExtra::default());
            x.append_child(status(110));
            let mut el = Element::new("presence", ns::CLIENT);
            el.set_attr("type", "unavailable");
            el.append_child(x);
            let from_jid = self.occupant_jid(&nick);
            out.stanzas
                .push(Stanza::new(el, Some(from_jid), Some(from.clone().into())));
            return;
        }
        let mut p = presence.clone();
        p.remove_children("x", NS_MUC);
        o.sessions.push((from.clone(), p));
        let o = &self.occupants[&nick];
        self.broadcast_presence(
            o,
            true,
            Role::None,
            &[],
            &[],
            &ItemExtra::default(),
            None,
            out,
        );
        self.occupants.remove(&nick);
    }

    /// Removes one session (an error bounce, §11.1: status 333) or, with
    /// `codes` of a kick or ban, the whole occupant.
    fn remove_session(&mut self, from: &FullJid, codes: &[u16], out: &mut Out) {
        let Some(nick) = self.by_jid.get(from).cloned() else {
            return;
        };
        let o = &self.occupants[&nick];
        if o.sessions.len() > 1 {
            self.by_jid.remove(from);
            if let Some(o) = self.occupants.get_mut(&nick) {
                o.sessions.retain(|(j, _)| j != from);
            }
            return;
        }
        self.remove_occupant(&nick, Role::None, codes, &ItemExtra::default(), out);
    }

    /// Removes an occupant with an unavailable presence carrying `codes`
    /// (kick 307, ban 301, affiliation change 321, members-only 322,
    /// shutdown 332, error 333).
    fn remove_occupant(
        &mut self,
        nick: &str,
        role: Role,
        codes: &[u16],
        extra: &ItemExtra<'_>,
        out: &mut Out,
    ) {
        let Some(o) = self.occupants.get(nick) else {
            return;
        };
        self.broadcast_presence(o, true, role, codes, &[], extra, None, out);
        if let Some(o) = self.occupants.remove(nick) {
            for (j, _) in o.sessions {
                self.by_jid.remove(&j);
            }
        }
    }

    /// Every occupant leaves because the service stops (status 332).
    pub fn shutdown(&mut self, out: &mut Out) {
        let nicks: Vec<String> = self.occupants.keys().cloned().collect();
        for n in nicks {
            self.remove_occupant(&n, Role::None, &[332], &ItemExtra::default(), out);
        }
    }

    // ---------------------------------------------------------------
    // Messages (§7.4, §7.5, §7.8, §7.13, §8.1)
    // ---------------------------------------------------------------

    fn on_room_message(&mut self, cx: &Ctx<'_>, st: &Stanza, from: &FullJid, out: &mut Out) {
        match st.stanza_type() {
            "groupchat" => return self.on_groupchat(cx, st, from, out),
            "error" => {
                // A groupchat message bounced by an occupant's server.
                if self.by_jid.contains_key(from) && means_gone(st) {
                    self.remove_session(from, &[333], out);
                }
                return;
            }
            _ => {}
        }
        let el = st.element();
        if let Some(x) = el.get_child("x", NS_MUC_USER) {
            if x.children().any(|c| c.is("invite", NS_MUC_USER)) {
                return self.invite(st, from, x, out);
            }
            if let Some(d) = x.get_child("decline", NS_MUC_USER) {
                return self.decline(from, d, out);
            }
        }
        if let Some(form) = el.get_child("x", ns::DATA_FORMS) {
            let f = Submitted::parse(form);
            if f.form_type() == Some(NS_MUC_REQUEST) {
                return self.voice_request(st, from, &f, out);
            }
        }
        reply_error(
            st,
            err(
                StanzaErrorCondition::BadRequest,
                "send messages to a room with type groupchat",
            ),
            out,
        );
    }

    fn on_groupchat(&mut self, cx: &Ctx<'_>, st: &Stanza, from: &FullJid, out: &mut Out) {
        let Some(nick) = self.by_jid.get(from).cloned() else {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::NotAcceptable,
                    "only occupants may send messages to the room",
                ),
                out,
            );
        };
        let role = self.occupants[&nick].role;
        let bare = from.to_bare();
        if role < Role::Participant {
            // §7.4: visitors may not speak in a moderated room.
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::Forbidden,
                    "visitors may not speak in this room",
                ),
                out,
            );
        }
        let el = st.element();
        let subject = el.get_child("subject", ns::CLIENT);
        if subject.is_some() && el.get_child("body", ns::CLIENT).is_none() {
            // §8.1 (and §7.3 for participants when allowed).
            if role != Role::Moderator && !self.config.change_subject {
                return reply_error(
                    st,
                    err(
                        StanzaErrorCondition::Forbidden,
                        "you may not change the subject of this room",
                    ),
                    out,
                );
            }
            let text = subject.map(|s| s.text()).unwrap_or_default();
            if text.chars().count() > cx.svc.max_subject_len as usize {
                return reply_error(
                    st,
                    err(
                        StanzaErrorCondition::NotAcceptable,
                        "the subject is too long",
                    ),
                    out,
                );
            }
            self.subject = text;
            self.subject_by = nick.clone();
            out.save = true;
        }
        let mut m = Element::new("message", ns::CLIENT);
        for (k, v) in el.attrs() {
            if k != "to" && k != "from" {
                m.set_attr(k, v);
            }
        }
        for node in el.nodes() {
            match node {
                // A sender's own muc#user payload could claim a real JID.
                Node::Element(c)
                    if c.ns() == NS_MUC_USER
                        || c.is("occupant-id", NS_OCCUPANT_ID)
                        || (c.is("stanza-id", ns::SID)
                            && c.attr("by") == Some(self.jid.as_str())) => {}
                other => m.nodes_mut().push(other.clone()),
            }
        }
        m.append_child(self.occupant_id_el(&bare));
        let archived = self.config.logging && subject.is_none() && is_archivable(el);
        let id = cx.ids.next();
        if archived || subject.is_none() {
            m.append_child(
                Element::builder("stanza-id", ns::SID)
                    .attr("id", id.encode())
                    .attr("by", self.jid.as_str())
                    .build(),
            );
        }
        let from_jid = self.occupant_jid(&nick);
        m.set_attr("from", from_jid.as_str());
        if subject.is_none() && is_archivable(el) {
            if archived {
                if let Some(kind) = inbox_kind(el) {
                    out.inbox.push((id, bare.clone(), kind, m.clone()));
                }
                out.archive.push(ArchiveRecord {
                    owner: self.jid.clone(),
                    id,
                    with_bare: bare.to_string(),
                    remote: from_jid.to_string(),
                    outgoing: false,
                    origin_id: origin_id(el),
                    flags: if el.get_child("body", ns::CLIENT).is_some() {
                        FLAG_BODY
                    } else {
                        0
                    },
                    stanza: m.to_string(),
                });
            }
            self.remember(cx, id, &m);
        }
        self.to_everyone(&m, &from_jid, out);
    }

    /// Sends `el` from `from` to every session of every occupant.
    fn to_everyone(&self, el: &Element, from: &Jid, out: &mut Out) {
        let sessions: Vec<Jid> = self
            .occupants
            .values()
            .flat_map(|o| o.sessions.iter().map(|(to, _)| to.clone().into()))
            .collect();
        out.stanzas.extend(crate::modules::common::copies(
            el.clone(),
            from.clone(),
            sessions,
        ));
    }

    /// §7.5: a private message to an occupant.
    fn on_private_message(&mut self, st: &Stanza, from: &FullJid, target: &str, out: &mut Out) {
        if st.is_error() && self.by_jid.contains_key(from) && means_gone(st) {
            // A copy the room sent this occupant bounced (its session is
            // gone): §11.1, removed with 333 — not relayed to whoever the
            // copy was from.
            return self.remove_session(from, &[333], out);
        }
        let Some(nick) = self.by_jid.get(from).cloned() else {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::NotAcceptable,
                    "only occupants may send private messages",
                ),
                out,
            );
        };
        if st.stanza_type() == "groupchat" {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::BadRequest,
                    "groupchat messages go to the room, not to an occupant",
                ),
                out,
            );
        }
        let role = self.occupants[&nick].role;
        let allowed = match self.config.allow_pm {
            AllowPm::Anyone => true,
            AllowPm::Participants => role >= Role::Participant,
            AllowPm::Moderators => role == Role::Moderator,
            AllowPm::None => false,
        };
        if !allowed && st.stanza_type() != "error" {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::Forbidden,
                    "private messages are not allowed in this room",
                ),
                out,
            );
        }
        let Some(t) = self.occupants.get(target) else {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::ItemNotFound,
                    "no occupant has this nickname",
                ),
                out,
            );
        };
        let from_jid = self.occupant_jid(&nick);
        let mut m = st.element().clone();
        m.remove_children("occupant-id", NS_OCCUPANT_ID);
        if st.stanza_type() != "error" {
            m.remove_children("x", NS_MUC_USER);
            m.append_child(Element::new("x", NS_MUC_USER));
            m.append_child(self.occupant_id_el(&from.to_bare()));
        }
        for (to, _) in &t.sessions {
            out.stanzas.push(Stanza::new(
                m.clone(),
                Some(from_jid.clone()),
                Some(to.clone().into()),
            ));
        }
    }

    /// §7.8.2: mediated invitations.
    fn invite(&mut self, st: &Stanza, from: &FullJid, x: &Element, out: &mut Out) {
        let bare = from.to_bare();
        let aff = self.affiliation_of(&bare);
        if !self.by_jid.contains_key(from) && aff < Affiliation::Member {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::NotAcceptable,
                    "only occupants may invite",
                ),
                out,
            );
        }
        if self.config.members_only && !self.config.allow_invites && aff < Affiliation::Admin {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::Forbidden,
                    "only admins and owners may invite to this room",
                ),
                out,
            );
        }
        for inv in x.children().filter(|c| c.is("invite", NS_MUC_USER)) {
            let Some(to) = inv.attr("to").and_then(|t| Jid::new(t).ok()) else {
                return reply_error(
                    st,
                    err(
                        StanzaErrorCondition::JidMalformed,
                        "an invitation needs a valid 'to'",
                    ),
                    out,
                );
            };
            if self.config.members_only
                && aff >= Affiliation::Admin
                && self.affiliation_of(&to.to_bare()) == Affiliation::None
            {
                // The invitee may then enter (§7.8.2: MAY add to the member list).
                self.set_affiliation(&to.to_bare().to_string(), Affiliation::Member, None, out);
            }
            let reason = inv.get_child("reason", NS_MUC_USER).map(|r| r.text());
            let mut invite = Element::builder("invite", NS_MUC_USER)
                .attr("from", from.as_str())
                .build();
            if let Some(r) = &reason {
                invite.append_child(
                    Element::builder("reason", NS_MUC_USER)
                        .text(r.as_str())
                        .build(),
                );
            }
            let mut ux = Element::builder("x", NS_MUC_USER).append(invite).build();
            if self.config.password_protected {
                ux.append_child(
                    Element::builder("password", NS_MUC_USER)
                        .text(self.config.password.as_str())
                        .build(),
                );
            }
            let body = format!(
                "{} invites you to the room {}{}",
                bare,
                self.jid,
                reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            );
            let m = Element::builder("message", ns::CLIENT)
                .attr("id", starling_proto::random_id(10))
                .append(ux)
                .append(Element::builder("body", ns::CLIENT).text(body).build())
                .build();
            out.stanzas
                .push(Stanza::new(m, Some(self.jid.clone().into()), Some(to)));
        }
    }

    /// §7.8.2: an invitee declines; the inviter is told.
    fn decline(&mut self, from: &FullJid, d: &Element, out: &mut Out) {
        let Some(to) = d.attr("to").and_then(|t| Jid::new(t).ok()) else {
            return;
        };
        let mut decline = Element::builder("decline", NS_MUC_USER)
            .attr("from", from.to_bare().as_str())
            .build();
        if let Some(r) = d.get_child("reason", NS_MUC_USER) {
            decline.append_child(
                Element::builder("reason", NS_MUC_USER)
                    .text(r.text())
                    .build(),
            );
        }
        let m = Element::builder("message", ns::CLIENT)
            .attr("id", starling_proto::random_id(10))
            .append(Element::builder("x", NS_MUC_USER).append(decline).build())
            .build();
        out.stanzas
            .push(Stanza::new(m, Some(self.jid.clone().into()), Some(to)));
    }

    /// §7.13: a visitor asks for voice (forwarded to the moderators);
    /// §8.6: a moderator approves a request.
    fn voice_request(&mut self, st: &Stanza, from: &FullJid, f: &Submitted, out: &mut Out) {
        let Some(nick) = self.by_jid.get(from).cloned() else {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::NotAcceptable,
                    "only occupants may ask for voice",
                ),
                out,
            );
        };
        let role = self.occupants[&nick].role;
        if role == Role::Moderator
            && f.kind == "submit"
            && f.boolean("muc#request_allow").ok().flatten() == Some(true)
        {
            let target = f.single("muc#roomnick").ok().flatten().map(str::to_owned);
            if let Some(t) = target.filter(|t| {
                self.occupants
                    .get(t)
                    .is_some_and(|o| o.role == Role::Visitor)
            }) {
                self.set_role(&t, Role::Participant, &nick, None, out);
            }
            return;
        }
        if role != Role::Visitor {
            return; // already has voice
        }
        if !self.config.voice_requests {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::Forbidden,
                    "voice requests are disabled in this room",
                ),
                out,
            );
        }
        let form = FormBuilder::new("form", Some(NS_MUC_REQUEST))
            .title("Voice request")
            .instructions("To approve this request for voice, select the \"Grant voice to this person?\" checkbox and submit.")
            .field("muc#role", "list-single", Some("Requested role"), &["participant"])
            .field("muc#jid", "jid-single", Some("User ID"), &[from.to_bare().as_str()])
            .field("muc#roomnick", "text-single", Some("Room nickname"), &[&nick])
            .boolean("muc#request_allow", "Grant voice to this person?", false)
            .build();
        for o in self
            .occupants
            .values()
            .filter(|o| o.role == Role::Moderator)
        {
            for (to, _) in &o.sessions {
                let m = Element::builder("message", ns::CLIENT)
                    .attr("id", starling_proto::random_id(10))
                    .append(form.clone())
                    .build();
                out.stanzas.push(Stanza::new(
                    m,
                    Some(self.jid.clone().into()),
                    Some(to.clone().into()),
                ));
            }
        }
    }

    // ---------------------------------------------------------------
    // Iq
    // ---------------------------------------------------------------

    fn on_room_iq(&mut self, cx: &Ctx<'_>, st: &Stanza, from: &FullJid, out: &mut Out) {
        if !st.is_iq_request() {
            return;
        }
        let Some(q) = st.payload() else {
            return reply_error(st, StanzaErrorCondition::BadRequest.into(), out);
        };
        let get = st.type_attr() == Some("get");
        if q.is("moderate", NS_MODERATE) && !get {
            return self.moderate(st, from, q, out);
        }
        let answer = match (q.ns(), q.name(), get) {
            (ns::DISCO_INFO, "query", true) => self.disco_info(st, from, q),
            (ns::DISCO_ITEMS, "query", true) => Ok(Some(self.disco_items(from))),
            (NS_MUC_ADMIN, "query", true) => self.admin_get(from, q),
            (NS_MUC_ADMIN, "query", false) => self.admin_set(from, q, out),
            (NS_MUC_OWNER, "query", true) => self.owner_get(cx, from),
            (NS_MUC_OWNER, "query", false) => self.owner_set(cx, from, q, out),
            (ns::REGISTER, "query", true) => self.register_get(from),
            (ns::REGISTER, "query", false) => self.register_set(from, q, out),
            (ns::PING, "ping", true) => Ok(None),
            (NS_VCARD, "vCard", true) => Ok(Some(
                self.config
                    .vcard
                    .parse::<Element>()
                    .unwrap_or_else(|_| Element::new("vCard", NS_VCARD)),
            )),
            (NS_VCARD, "vCard", false) => self.set_vcard(cx, from, q, out),
            _ => Err(StanzaErrorCondition::ServiceUnavailable.into()),
        };
        match answer {
            Ok(p) => out.stanzas.push(st.iq_result(p)),
            Err(e) => reply_error(st, e, out),
        }
    }

    /// §6.4 (and §7.12 for the `x-roomuser-item` node).
    fn disco_info(
        &self,
        _st: &Stanza,
        from: &FullJid,
        q: &Element,
    ) -> Result<Option<Element>, StanzaError> {
        if q.attr("node") == Some("x-roomuser-item") {
            let mut r = Element::builder("query", ns::DISCO_INFO)
                .attr("node", "x-roomuser-item")
                .build();
            if let Some(n) = self
                .affiliations
                .get(from.to_bare().as_str())
                .and_then(|a| a.nick.as_deref())
            {
                r.append_child(
                    Element::builder("identity", ns::DISCO_INFO)
                        .attr("category", "conference")
                        .attr("name", n)
                        .attr("type", "text")
                        .build(),
                );
            }
            return Ok(Some(r));
        }
        if q.attr("node").is_some() {
            return Err(StanzaErrorCondition::ItemNotFound.into());
        }
        let c = &self.config;
        let mut r = Element::new("query", ns::DISCO_INFO);
        let name = if c.name.is_empty() {
            self.jid.node().map(|n| n.as_str()).unwrap_or("")
        } else {
            c.name.as_str()
        };
        r.append_child(
            Element::builder("identity", ns::DISCO_INFO)
                .attr("category", "conference")
                .attr("name", name)
                .attr("type", "text")
                .build(),
        );
        let features = [
            NS_MUC,
            if c.public { "muc_public" } else { "muc_hidden" },
            if c.persistent {
                "muc_persistent"
            } else {
                "muc_temporary"
            },
            if c.members_only {
                "muc_membersonly"
            } else {
                "muc_open"
            },
            if c.moderated {
                "muc_moderated"
            } else {
                "muc_unmoderated"
            },
            if c.whois == Whois::Anyone {
                "muc_nonanonymous"
            } else {
                "muc_semianonymous"
            },
            if c.password_protected {
                "muc_passwordprotected"
            } else {
                "muc_unsecured"
            },
            ns::REGISTER,
            NS_MUC_REQUEST,
            NS_OCCUPANT_ID,
            NS_SELF_PING_OPT,
            NS_MODERATE,
            NS_VCARD,
            // Reflected messages keep the sender's id.
            "http://jabber.org/protocol/muc#stable_id",
            ns::SID,
            ns::DISCO_INFO,
            ns::DISCO_ITEMS,
            ns::PING,
        ];
        // XEP-0313 §7: the room's archive (mam.rs), while it is kept.
        let archive = [starling_proto::mam::NS_MAM, NS_MAM_EXTENDED];
        let archive = if c.logging { &archive[..] } else { &[] };
        for f in features.iter().chain(archive) {
            r.append_child(
                Element::builder("feature", ns::DISCO_INFO)
                    .attr("var", *f)
                    .build(),
            );
        }
        r.append_child(c.info_form(self.occupants.len(), &self.subject).build());
        Ok(Some(r))
    }

    /// §6.5: occupants are listed to other occupants of a public room only.
    fn disco_items(&self, from: &FullJid) -> Element {
        let mut r = Element::new("query", ns::DISCO_ITEMS);
        if self.config.public && self.by_jid.contains_key(from) {
            for nick in self.occupants.keys() {
                r.append_child(
                    Element::builder("item", ns::DISCO_ITEMS)
                        .attr("jid", self.occupant_jid(nick).as_str())
                        .build(),
                );
            }
        }
        r
    }

    /// The actor's role and affiliation.
    fn standing(&self, from: &FullJid) -> (Role, Affiliation, Option<String>) {
        let aff = self.affiliation_of(&from.to_bare());
        match self.by_jid.get(from) {
            Some(n) => (self.occupants[n].role, aff, Some(n.clone())),
            None => (Role::None, aff, None),
        }
    }

    /// §8.5, §9.2, §9.5, §9.8, §10.5, §10.8: lists by role or affiliation.
    fn admin_get(&self, from: &FullJid, q: &Element) -> Result<Option<Element>, StanzaError> {
        let (role, aff, _) = self.standing(from);
        let item = q
            .get_child("item", NS_MUC_ADMIN)
            .ok_or_else(|| err(StanzaErrorCondition::BadRequest, "an item is required"))?;
        let mut r = Element::new("query", NS_MUC_ADMIN);
        if let Some(want) = item.attr("role") {
            let want = Role::parse(want)
                .ok_or_else(|| err(StanzaErrorCondition::BadRequest, "unknown role"))?;
            let allowed = match want {
                Role::Moderator => aff >= Affiliation::Admin,
                _ => role == Role::Moderator,
            };
            if !allowed {
                return Err(err(
                    StanzaErrorCondition::Forbidden,
                    "you may not see this list",
                ));
            }
            for o in self.occupants.values().filter(|o| o.role == want) {
                let mut i = Element::builder("item", NS_MUC_ADMIN)
                    .attr("affiliation", self.affiliation_of(&o.bare).as_str())
                    .attr("role", o.role.as_str())
                    .attr("nick", o.nick.as_str())
                    .build();
                if let Some((j, _)) = o.sessions.last() {
                    i.set_attr("jid", j.as_str());
                }
                r.append_child(i);
            }
            return Ok(Some(r));
        }
        let want = item
            .attr("affiliation")
            .and_then(Affiliation::parse)
            .filter(|a| *a != Affiliation::None)
            .ok_or_else(|| {
                err(
                    StanzaErrorCondition::BadRequest,
                    "an item needs a role or an affiliation",
                )
            })?;
        let allowed = match want {
            Affiliation::Member => {
                aff >= Affiliation::Admin
                    || RoomConfig::lists(&self.config.get_member_list, role.as_str())
                        && role != Role::None
            }
            _ => aff >= Affiliation::Admin,
        };
        if !allowed {
            return Err(err(
                StanzaErrorCondition::Forbidden,
                "you may not see this list",
            ));
        }
        for (j, a) in self
            .affiliations
            .iter()
            .filter(|(_, a)| a.affiliation == want)
        {
            let mut i = Element::builder("item", NS_MUC_ADMIN)
                .attr("affiliation", want.as_str())
                .attr("jid", j.as_str())
                .build();
            if let Some(n) = &a.nick {
                i.set_attr("nick", n.as_str());
            }
            if let Some(reason) = &a.reason {
                i.append_child(
                    Element::builder("reason", NS_MUC_ADMIN)
                        .text(reason.as_str())
                        .build(),
                );
            }
            r.append_child(i);
        }
        Ok(Some(r))
    }

    /// §8.2–§8.5, §9.1–§9.8, §10.3–§10.8: role and affiliation changes,
    /// all checked before any is applied.
    fn admin_set(
        &mut self,
        from: &FullJid,
        q: &Element,
        out: &mut Out,
    ) -> Result<Option<Element>, StanzaError> {
        let standing = self.standing(from);
        self.admin_items(standing, Some(&from.to_bare()), q, out)
    }

    /// The items of a `muc#admin` set by an actor of this standing (role,
    /// affiliation, nick) with this real JID (none: the server).
    fn admin_items(
        &mut self,
        (role, aff, actor_nick): (Role, Affiliation, Option<String>),
        actor: Option<&BareJid>,
        q: &Element,
        out: &mut Out,
    ) -> Result<Option<Element>, StanzaError> {
        enum Change {
            Role(String, Role, Option<String>),
            Aff(BareJid, Affiliation, Option<String>),
        }
        let mut changes = Vec::new();
        for item in q.children().filter(|c| c.is("item", NS_MUC_ADMIN)) {
            let reason = item.get_child("reason", NS_MUC_ADMIN).map(|r| r.text());
            if let Some(a) = item.attr("affiliation") {
                let a = Affiliation::parse(a)
                    .ok_or_else(|| err(StanzaErrorCondition::BadRequest, "unknown affiliation"))?;
                let target = match (item.attr("jid"), item.attr("nick")) {
                    (Some(j), _) => BareJid::new(j.split('/').next().unwrap_or(j))
                        .map_err(|_| err(StanzaErrorCondition::JidMalformed, "not a valid JID"))?,
                    (None, Some(n)) => {
                        self.occupants
                            .get(n)
                            .map(|o| o.bare.clone())
                            .ok_or_else(|| {
                                err(
                                    StanzaErrorCondition::ItemNotFound,
                                    "no occupant has this nickname",
                                )
                            })?
                    }
                    _ => {
                        return Err(err(
                            StanzaErrorCondition::BadRequest,
                            "an affiliation item needs a jid",
                        ))
                    }
                };
                let current = self
                    .affiliations
                    .get(target.as_str())
                    .map_or(Affiliation::None, |x| x.affiliation);
                // Owners change anything; admins only below admin, to below admin.
                let may = aff == Affiliation::Owner
                    || (aff == Affiliation::Admin
                        && current < Affiliation::Admin
                        && a < Affiliation::Admin);
                if !may {
                    return Err(err(
                        StanzaErrorCondition::NotAllowed,
                        "you may not change this affiliation",
                    ));
                }
                changes.push(Change::Aff(target, a, reason));
            } else if let Some(r) = item.attr("role") {
                let r = Role::parse(r)
                    .ok_or_else(|| err(StanzaErrorCondition::BadRequest, "unknown role"))?;
                let nick = item.attr("nick").ok_or_else(|| {
                    err(StanzaErrorCondition::BadRequest, "a role item needs a nick")
                })?;
                let target = self.occupants.get(nick).ok_or_else(|| {
                    err(
                        StanzaErrorCondition::ItemNotFound,
                        "no occupant has this nickname",
                    )
                })?;
                let target_aff = self.affiliation_of(&target.bare);
                if role != Role::Moderator {
                    return Err(err(
                        StanzaErrorCondition::Forbidden,
                        "only moderators change roles",
                    ));
                }
                // §8.2, §8.4, §9.7: nobody lowers the role of a higher (or
                // equal admin/owner) affiliation; moderator status is the
                // admins' to give and take.
                if (r < target.role
                    && target_aff >= Affiliation::Admin
                    && target_aff >= aff
                    && Some(&target.bare) != actor)
                    || (target_aff > aff && r < target.role)
                {
                    return Err(err(
                        StanzaErrorCondition::NotAllowed,
                        "you may not change the role of this occupant",
                    ));
                }
                if (r == Role::Moderator || target.role == Role::Moderator)
                    && aff < Affiliation::Admin
                    && r != target.role
                {
                    return Err(err(
                        StanzaErrorCondition::NotAllowed,
                        "only admins and owners grant or revoke moderator status",
                    ));
                }
                changes.push(Change::Role(nick.to_owned(), r, reason));
            } else {
                return Err(err(
                    StanzaErrorCondition::BadRequest,
                    "an item needs a role or an affiliation",
                ));
            }
        }
        if changes.is_empty() {
            return Err(err(StanzaErrorCondition::BadRequest, "no item"));
        }
        // §10.4: the room always keeps an owner.
        let mut owners: Vec<String> = self.with_affiliation(Affiliation::Owner);
        for c in &changes {
            if let Change::Aff(j, a, _) = c {
                owners.retain(|o| o != j.as_str());
                if *a == Affiliation::Owner {
                    owners.push(j.to_string());
                }
            }
        }
        if owners.is_empty() {
            return Err(err(
                StanzaErrorCondition::Conflict,
                "the room must keep at least one owner",
            ));
        }
        let actor = actor_nick.unwrap_or_default();
        for c in changes {
            match c {
                Change::Role(nick, r, reason) => {
                    self.set_role(&nick, r, &actor, reason.as_deref(), out)
                }
                Change::Aff(j, a, reason) => self.change_affiliation(&j, a, &actor, reason, out),
            }
        }
        Ok(None)
    }

    /// Changes an occupant's role and tells the room (§8.2 kick: 307).
    fn set_role(&mut self, nick: &str, r: Role, actor: &str, reason: Option<&str>, out: &mut Out) {
        let extra = ItemExtra {
            actor: Some(actor).filter(|a| !a.is_empty()),
            reason,
            nick: None,
        };
        if r == Role::None {
            return self.remove_occupant(nick, Role::None, &[307], &extra, out);
        }
        let Some(o) = self.occupants.get_mut(nick) else {
            return;
        };
        o.role = r;
        let o = &self.occupants[nick];
        self.broadcast_presence(o, false, r, &[], &[], &extra, None, out);
    }

    /// Stores an affiliation row (no presence effects).
    fn set_affiliation(
        &mut self,
        jid: &str,
        a: Affiliation,
        reason: Option<String>,
        out: &mut Out,
    ) {
        let nick = self.affiliations.get(jid).and_then(|x| x.nick.clone());
        if a == Affiliation::None {
            self.affiliations.remove(jid);
        } else {
            self.affiliations.insert(
                jid.to_owned(),
                Aff {
                    affiliation: a,
                    nick: nick.clone().filter(|_| a != Affiliation::Outcast),
                    reason: reason.clone(),
                },
            );
        }
        out.affiliations.push(RoomAffiliation {
            jid: jid.to_owned(),
            affiliation: a.as_str().to_owned(),
            nick: nick.filter(|_| a != Affiliation::Outcast),
            reason,
        });
    }

    /// The server deletes account `gone`: its affiliation (and the nick
    /// registered with it) goes, with the effects of an owner setting it
    /// to `none` (§9.4 in a members-only room: removed with 321). A room
    /// whose only owner it was keeps no owner; the service's `admins` can
    /// still manage it.
    pub fn account_removed(&mut self, gone: &BareJid, out: &mut Out) {
        if self.affiliations.contains_key(gone.as_str()) {
            self.change_affiliation(
                gone,
                Affiliation::None,
                "",
                Some("account deleted".to_owned()),
                out,
            );
            tracing::info!(module = super::NAME, room = %self.jid, user = %gone, "deleted account's affiliation removed");
        }
    }

    /// Changes an affiliation and its effect on occupants holding it:
    /// ban (§9.1: 301), membership lost in a members-only room (§9.4:
    /// 321), roles following the new affiliation (§9.3, §9.6, §10.3).
    fn change_affiliation(
        &mut self,
        j: &BareJid,
        a: Affiliation,
        actor: &str,
        reason: Option<String>,
        out: &mut Out,
    ) {
        self.set_affiliation(j.as_str(), a, reason.clone(), out);
        let nicks: Vec<String> = self
            .occupants
            .values()
            .filter(|o| &o.bare == j || (j.node().is_none() && o.bare.domain() == j.domain()))
            .map(|o| o.nick.clone())
            .collect();
        let extra = ItemExtra {
            actor: Some(actor).filter(|a| !a.is_empty()),
            reason: reason.as_deref(),
            nick: None,
        };
        for nick in nicks {
            if a == Affiliation::Outcast {
                self.remove_occupant(&nick, Role::None, &[301], &extra, out);
            } else if self.config.members_only && a < Affiliation::Member {
                self.remove_occupant(&nick, Role::None, &[321], &extra, out);
            } else {
                let cur = self.occupants[&nick].role;
                let role = match a {
                    Affiliation::Owner | Affiliation::Admin => Role::Moderator,
                    Affiliation::Member if cur < Role::Participant => Role::Participant,
                    _ if cur == Role::Moderator => self.default_role(a),
                    _ => cur,
                };
                if let Some(o) = self.occupants.get_mut(&nick) {
                    o.role = role;
                }
                let o = &self.occupants[&nick];
                self.broadcast_presence(o, false, role, &[], &[], &extra, None, out);
            }
        }
    }

    /// §10.1.3, §10.2: the configuration form, for owners.
    fn owner_get(&self, cx: &Ctx<'_>, from: &FullJid) -> Result<Option<Element>, StanzaError> {
        if self.affiliation_of(&from.to_bare()) != Affiliation::Owner {
            return Err(err(
                StanzaErrorCondition::Forbidden,
                "only owners may configure the room",
            ));
        }
        let form = self
            .config
            .form(
                cx.svc,
                &self.with_affiliation(Affiliation::Owner),
                &self.with_affiliation(Affiliation::Admin),
            )
            .build();
        Ok(Some(
            Element::builder("query", NS_MUC_OWNER).append(form).build(),
        ))
    }

    /// §10.1.2 (instant room), §10.1.3, §10.2 (configuration), §10.9
    /// (destroy).
    fn owner_set(
        &mut self,
        cx: &Ctx<'_>,
        from: &FullJid,
        q: &Element,
        out: &mut Out,
    ) -> Result<Option<Element>, StanzaError> {
        if self.affiliation_of(&from.to_bare()) != Affiliation::Owner {
            return Err(err(
                StanzaErrorCondition::Forbidden,
                "only owners may configure or destroy the room",
            ));
        }
        if let Some(d) = q.get_child("destroy", NS_MUC_OWNER) {
            self.destroy(d, out);
            return Ok(None);
        }
        let Some(x) = q.get_child("x", ns::DATA_FORMS) else {
            return Err(err(
                StanzaErrorCondition::BadRequest,
                "send a form or a destroy request",
            ));
        };
        let form = Submitted::parse(x);
        if form.kind == "cancel" {
            // §10.1.3: cancelling the first configuration destroys the room.
            if self.locked {
                self.destroy(&Element::new("destroy", NS_MUC_OWNER), out);
            }
            return Ok(None);
        }
        if form.kind != "submit" {
            return Err(err(
                StanzaErrorCondition::BadRequest,
                "the form must be of type submit or cancel",
            ));
        }
        let (new, lists) = self.config.apply(cx.svc, &form).map_err(|p| match p {
            FormProblem::Bad(t) => err(StanzaErrorCondition::BadRequest, &t),
            FormProblem::NotAcceptable(t) => err(StanzaErrorCondition::NotAcceptable, &t),
        })?;
        if lists.owners.as_ref().is_some_and(|o| o.is_empty()) {
            return Err(err(
                StanzaErrorCondition::Conflict,
                "the room must keep at least one owner",
            ));
        }
        let old = std::mem::replace(&mut self.config, new);
        let was_locked = std::mem::replace(&mut self.locked, false);
        out.save = true;
        for (list, a) in [
            (lists.owners, Affiliation::Owner),
            (lists.admins, Affiliation::Admin),
        ] {
            let Some(list) = list else { continue };
            for j in self.with_affiliation(a) {
                if !list.contains(&j) {
                    if let Ok(b) = BareJid::new(&j) {
                        self.change_affiliation(&b, Affiliation::None, "", None, out);
                    }
                }
            }
            for j in list {
                if self.affiliations.get(&j).map(|x| x.affiliation) != Some(a) {
                    if let Ok(b) = BareJid::new(&j) {
                        self.change_affiliation(&b, a, "", None, out);
                    }
                }
            }
        }
        // §10.2.1: tell the occupants what changed.
        let c = &self.config;
        let mut codes = Vec::new();
        if !was_locked {
            codes.push(104);
        }
        if c.logging != old.logging {
            codes.push(if c.logging { 170 } else { 171 });
        }
        if c.whois != old.whois {
            codes.push(if c.whois == Whois::Anyone { 172 } else { 173 });
        }
        if !codes.is_empty() {
            let mut x = Element::new("x", NS_MUC_USER);
            for code in codes {
                x.append_child(status(code));
            }
            let m = Element::builder("message", ns::CLIENT)
                .attr("type", "groupchat")
                .attr("id", starling_proto::random_id(10))
                .append(x)
                .build();
            self.to_everyone(&m, &self.jid.clone().into(), out);
        }
        // §9.4 / status 322: a room turned members-only loses non-members.
        if self.config.members_only && !old.members_only {
            let out_nicks: Vec<String> = self
                .occupants
                .values()
                .filter(|o| self.affiliation_of(&o.bare) < Affiliation::Member)
                .map(|o| o.nick.clone())
                .collect();
            for n in out_nicks {
                self.remove_occupant(&n, Role::None, &[322], &ItemExtra::default(), out);
            }
        }
        // Roles follow a change of moderation for unaffiliated occupants.
        if self.config.moderated != old.moderated {
            let nicks: Vec<String> = self.occupants.keys().cloned().collect();
            for n in nicks {
                let o = &self.occupants[&n];
                let aff = self.affiliation_of(&o.bare);
                let target = self.default_role(aff);
                if aff == Affiliation::None && o.role != Role::Moderator && o.role != target {
                    self.set_role(&n, target, "", None, out);
                }
            }
        }
        Ok(None)
    }

    /// §10.9: every occupant leaves with the `<destroy/>` (alternate venue
    /// and reason); the room is deleted.
    fn destroy(&mut self, d: &Element, out: &mut Out) {
        let mut destroy = Element::new("destroy", NS_MUC_USER);
        if let Some(j) = d.attr("jid") {
            destroy.set_attr("jid", j);
        }
        if let Some(r) = d.get_child("reason", NS_MUC_OWNER) {
            destroy.append_child(
                Element::builder("reason", NS_MUC_USER)
                    .text(r.text())
                    .build(),
            );
        }
        if let Some(p) = d.get_child("password", NS_MUC_OWNER) {
            destroy.append_child(
                Element::builder("password", NS_MUC_USER)
                    .text(p.text())
                    .build(),
            );
        }
        let nicks: Vec<String> = self.occupants.keys().cloned().collect();
        for n in &nicks {
            let o = &self.occupants[n];
            self.broadcast_presence(
                o,
                true,
                Role::None,
                &[],
                &[],
                &ItemExtra::default(),
                Some(&destroy),
                out,
            );
        }
        self.occupants.clear();
        self.by_jid.clear();
        out.destroyed = true;
    }

    /// §7.10: the registration form, or the registered nick.
    fn register_get(&self, from: &FullJid) -> Result<Option<Element>, StanzaError> {
        let bare = from.to_bare();
        if let Some(n) = self
            .affiliations
            .get(bare.as_str())
            .and_then(|a| a.nick.as_deref())
        {
            return Ok(Some(
                Element::builder("query", ns::REGISTER)
                    .append(Element::new("registered", ns::REGISTER))
                    .append(Element::builder("username", ns::REGISTER).text(n).build())
                    .build(),
            ));
        }
        if self.config.members_only && self.affiliation_of(&bare) < Affiliation::Member {
            return Err(err(
                StanzaErrorCondition::RegistrationRequired,
                "this room registers its members only",
            ));
        }
        let form = FormBuilder::new("form", Some("http://jabber.org/protocol/muc#register"))
            .title("Register with the room")
            .instructions("Reserve a nickname in this room.")
            .field(
                "muc#register_roomnick",
                "text-single",
                Some("Desired nickname"),
                &[],
            )
            .build();
        Ok(Some(
            Element::builder("query", ns::REGISTER)
                .append(
                    Element::builder("instructions", ns::REGISTER)
                        .text("Reserve a nickname in this room.")
                        .build(),
                )
                .append(form)
                .build(),
        ))
    }

    /// §7.10: registering a nickname makes the user a member; `<remove/>`
    /// gives both up.
    fn register_set(
        &mut self,
        from: &FullJid,
        q: &Element,
        out: &mut Out,
    ) -> Result<Option<Element>, StanzaError> {
        let bare = from.to_bare();
        let aff = self.affiliation_of(&bare);
        if q.get_child("remove", ns::REGISTER).is_some() {
            if let Some(a) = self.affiliations.get_mut(bare.as_str()) {
                a.nick = None;
                if a.affiliation == Affiliation::Member {
                    self.change_affiliation(&bare, Affiliation::None, "", None, out);
                } else {
                    let a = a.affiliation;
                    self.set_affiliation(bare.as_str(), a, None, out);
                }
            }
            return Ok(None);
        }
        if aff == Affiliation::Outcast {
            return Err(err(
                StanzaErrorCondition::Forbidden,
                "you are banned from this room",
            ));
        }
        if self.config.members_only && aff < Affiliation::Member {
            return Err(err(
                StanzaErrorCondition::RegistrationRequired,
                "this room registers its members only",
            ));
        }
        let form = q
            .get_child("x", ns::DATA_FORMS)
            .map(Submitted::parse)
            .ok_or_else(|| {
                err(
                    StanzaErrorCondition::BadRequest,
                    "submit the registration form",
                )
            })?;
        if form.kind == "cancel" {
            return Ok(None);
        }
        let raw = form
            .single("muc#register_roomnick")
            .ok()
            .flatten()
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                err(
                    StanzaErrorCondition::NotAcceptable,
                    "muc#register_roomnick is required",
                )
            })?;
        let nick = self
            .jid
            .with_resource_str(raw)
            .map(|j| j.resource().as_str().to_owned())
            .map_err(|_| {
                err(
                    StanzaErrorCondition::JidMalformed,
                    "this nickname is not allowed",
                )
            })?;
        if self.nick_owner(&nick).is_some_and(|o| o != bare.as_str())
            || self.occupants.get(&nick).is_some_and(|o| o.bare != bare)
        {
            return Err(err(
                StanzaErrorCondition::Conflict,
                "this nickname is registered by someone else",
            ));
        }
        let a = aff.max(Affiliation::Member);
        let reason = self
            .affiliations
            .get(bare.as_str())
            .and_then(|x| x.reason.clone());
        self.affiliations.insert(
            bare.to_string(),
            Aff {
                affiliation: a,
                nick: Some(nick.clone()),
                reason: reason.clone(),
            },
        );
        out.affiliations.push(RoomAffiliation {
            jid: bare.to_string(),
            affiliation: a.as_str().to_owned(),
            nick: Some(nick),
            reason,
        });
        if aff < Affiliation::Member {
            let nicks: Vec<String> = self
                .occupants
                .values()
                .filter(|o| o.bare == bare)
                .map(|o| o.nick.clone())
                .collect();
            for n in nicks {
                if let Some(o) = self.occupants.get_mut(&n) {
                    o.role = o.role.max(Role::Participant);
                }
                let o = &self.occupants[&n];
                self.broadcast_presence(
                    o,
                    false,
                    o.role,
                    &[],
                    &[],
                    &ItemExtra::default(),
                    None,
                    out,
                );
            }
        }
        Ok(None)
    }

    /// An iq to an occupant: a self-ping (XEP-0410) is answered here; other
    /// requests from occupants go to the occupant's client (§6.5 for
    /// disco; vCards and versions the same way) with the id rewritten, and
    /// the answer comes back the same way.
    fn on_occupant_iq(&mut self, st: &Stanza, from: &FullJid, target: &str, out: &mut Out) {
        if !st.is_iq_request() {
            // An answer to a forwarded request, from the target's client.
            let Some(p) = st.id().and_then(|id| self.pending_iq.remove(id)) else {
                return;
            };
            if self.by_jid.get(from).map(String::as_str) != Some(p.target_nick.as_str()) {
                return;
            }
            let mut el = st.element().clone();
            el.set_attr("id", p.id);
            let from_jid = self.occupant_jid(&p.target_nick);
            out.stanzas
                .push(Stanza::new(el, Some(from_jid), Some(p.requester.into())));
            return;
        }
        let Some(nick) = self.by_jid.get(from).cloned() else {
            let c = if st
                .payload()
                .is_some_and(|p| p.ns() == ns::DISCO_INFO || p.ns() == ns::DISCO_ITEMS)
            {
                StanzaErrorCondition::BadRequest // §6.5
            } else {
                StanzaErrorCondition::NotAcceptable // XEP-0410 §3
            };
            return reply_error(st, err(c, "you are not an occupant of this room"), out);
        };
        if nick == target && st.payload().is_some_and(|p| p.is("ping", ns::PING)) {
            return out.stanzas.push(st.iq_result(None)); // XEP-0410 §4
        }
        let Some(t) = self.occupants.get(target) else {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::ItemNotFound,
                    "no occupant has this nickname",
                ),
                out,
            );
        };
        let Some((to, _)) = t.sessions.last() else {
            return;
        };
        let to = to.clone();
        let now = std::time::Instant::now();
        self.pending_iq
            .retain(|_, p| now.duration_since(p.at).as_secs() < 60);
        if self.pending_iq.len() >= 1000 {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::ResourceConstraint,
                    "too many requests in flight",
                ),
                out,
            );
        }
        self.next_iq += 1;
        let id = format!("muc{}-{}", self.next_iq, starling_proto::random_id(6));
        self.pending_iq.insert(
            id.clone(),
            PendingIq {
                requester: from.clone(),
                id: st.id().unwrap_or("").to_owned(),
                target_nick: target.to_owned(),
                at: now,
            },
        );
        let mut el = st.element().clone();
        el.set_attr("id", id);
        out.stanzas.push(Stanza::new(
            el,
            Some(self.occupant_jid(&nick)),
            Some(to.into()),
        ));
    }

    /// XEP-0425 §3: a moderator asks to retract a message by its stanza
    /// id; the message itself is read from the archive by the task.
    fn moderate(&mut self, st: &Stanza, from: &FullJid, q: &Element, out: &mut Out) {
        let Some(nick) = self.by_jid.get(from).cloned() else {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::Forbidden,
                    "only moderators of the room may moderate messages",
                ),
                out,
            );
        };
        let o = &self.occupants[&nick];
        if o.role != Role::Moderator {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::Forbidden,
                    "only moderators are allowed to moderate other participants' messages",
                ),
                out,
            );
        }
        if !q.children().any(|c| c.is("retract", NS_RETRACT)) {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::FeatureNotImplemented,
                    "only retraction is supported",
                ),
                out,
            );
        }
        let Some(id) = q.attr("id").and_then(ArchiveId::decode) else {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::ItemNotFound,
                    "no message of this room has this id",
                ),
                out,
            );
        };
        out.moderation = Some(Moderation {
            iq: st.clone(),
            id,
            by: self.occupant_jid(&nick),
            by_occupant: self.occupant_id_el(&o.bare),
            reason: q.get_child("reason", NS_MODERATE).map(|r| r.text()),
        });
    }

    /// XEP-0425 §3–§4: with the archived message (`None`: not found), tells
    /// everyone of the retraction (archived too, for clients catching up),
    /// answers the moderator and returns the tombstone that replaces the
    /// message in the archive (and in the history).
    pub fn finish_moderation(
        &mut self,
        cx: &Ctx<'_>,
        m: Moderation,
        original: Option<Element>,
        out: &mut Out,
    ) -> Option<String> {
        let Some(original) = original
            .filter(|o| o.name() == "message" && o.get_child("retracted", NS_RETRACT).is_none())
        else {
            reply_error(
                &m.iq,
                err(
                    StanzaErrorCondition::ItemNotFound,
                    "no message of this room has this id",
                ),
                out,
            );
            return None;
        };
        let moderated = |el_name: &str| {
            let mut x = Element::builder(el_name, NS_RETRACT).build();
            let mut md = Element::builder("moderated", NS_MODERATE)
                .attr("by", m.by.as_str())
                .build();
            md.append_child(m.by_occupant.clone());
            x.append_child(md);
            if let Some(r) = &m.reason {
                x.append_child(
                    Element::builder("reason", NS_RETRACT)
                        .text(r.as_str())
                        .build(),
                );
            }
            x
        };
        let mut retract = moderated("retract");
        retract.set_attr("id", m.id.encode());
        let id = cx.ids.next();
        let mut msg = Element::builder("message", ns::CLIENT)
            .attr("type", "groupchat")
            .attr("id", starling_proto::random_id(10))
            .append(retract)
            .append(
                Element::builder("stanza-id", ns::SID)
                    .attr("id", id.encode())
                    .attr("by", self.jid.as_str())
                    .build(),
            )
            .build();
        msg.set_attr("from", self.jid.as_str());
        if self.config.logging {
            out.archive.push(ArchiveRecord {
                owner: self.jid.clone(),
                id,
                with_bare: self.jid.to_string(),
                remote: self.jid.to_string(),
                outgoing: false,
                origin_id: None,
                flags: 0,
                stanza: msg.to_string(),
            });
        }
        self.to_everyone(&msg, &self.jid.clone().into(), out);
        // The tombstone keeps who sent it (and when), nothing of what.
        let mut tomb = Element::new("message", ns::CLIENT);
        for (k, v) in original.attrs() {
            tomb.set_attr(k, v);
        }
        for c in original.children() {
            if c.is("occupant-id", NS_OCCUPANT_ID) || c.is("stanza-id", ns::SID) {
                tomb.append_child(c.clone());
            }
        }
        let mut retracted = moderated("retracted");
        retracted.set_attr(
            "stamp",
            starling_proto::datetime::xep0082_datetime(now_millis().max(0) as u128),
        );
        tomb.append_child(retracted);
        if let Some(h) = self.history.iter_mut().find(|h| h.id == m.id) {
            h.el = tomb.clone();
        }
        out.stanzas.push(m.iq.iq_result(None));
        Some(tomb.to_string())
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

    /// Room avatars (vcard-temp on the room's JID, as XEP-0486 describes):
    /// owners set the vCard; when its photo changes, occupants get
    /// presence from the room's JID with the XEP-0153 hash.
    fn set_vcard(
        &mut self,
        cx: &Ctx<'_>,
        from: &FullJid,
        q: &Element,
        out: &mut Out,
    ) -> Result<Option<Element>, StanzaError> {
        if self.affiliation_of(&from.to_bare()) != Affiliation::Owner {
            return Err(err(
                StanzaErrorCondition::Forbidden,
                "only owners may change the room's vCard",
            ));
        }
        let xml = q.to_string();
        if xml.len() > cx.svc.max_vcard_bytes {
            return Err(err(
                StanzaErrorCondition::NotAcceptable,
                "the vCard is too large",
            ));
        }
        let photo = q
            .get_child("PHOTO", NS_VCARD)
            .and_then(|p| p.get_child("BINVAL", NS_VCARD))
            .map(|b| b.text().split_whitespace().collect::<String>());
        let hash = match photo {
            None => String::new(),
            Some(b64) => {
                use base64::Engine as _;
                use sha1::Digest as _;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(b64.as_bytes())
                    .map_err(|_| {
                        err(
                            StanzaErrorCondition::BadRequest,
                            "PHOTO/BINVAL is not base64",
                        )
                    })?;
                sha1::Sha1::digest(&bytes)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect()
            }
        };
        self.config.vcard = if q.children().next().is_some() {
            xml
        } else {
            String::new()
        };
        out.save = true;
        if hash != self.config.avatar_hash {
            self.config.avatar_hash = hash;
            let mut x = Element::new("x", NS_VCARD_UPDATE);
            let mut photo = Element::new("photo", NS_VCARD_UPDATE);
            if !self.config.avatar_hash.is_empty() {
                photo.append_text(self.config.avatar_hash.as_str());
            }
            x.append_child(photo);
            let p = Element::builder("presence", ns::CLIENT).append(x).build();
            self.to_everyone(&p, &self.jid.clone().into(), out);
        }
        Ok(None)
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

/// Whether a groupchat message belongs in the archive and the history:
/// it has a body, an encrypted payload, a retraction or reactions — not
/// chat states or receipts alone.
pub(super) fn is_archivable(el: &Element) -> bool {
    el.children().any(|c| {
        c.is("body", ns::CLIENT)
            || c.name() == "encrypted"
            || c.is("retract", "urn:xmpp:message-retract:1")
            || c.is("reactions", "urn:xmpp:reactions:0")
            || c.is("apply-to", "urn:xmpp:fasten:0")
    })
}

/// How a member's inbox (XEP-0430) counts a message to a room: a new
/// message, a correction, or (`None`) not at all.
pub(super) fn inbox_kind(el: &Element) -> Option<starling_proto::mam::Kind> {
    match (
        el.has_child("body", ns::CLIENT),
        el.has_child("replace", "urn:xmpp:message-correct:0"),
    ) {
        (true, false) => Some(starling_proto::mam::Kind::Instant),
        (true, true) => Some(starling_proto::mam::Kind::Correction),
        _ => None,
    }
}

/// The sender's id of a message (XEP-0359 origin-id, else its id).
pub(super) fn origin_id(el: &Element) -> Option<String> {
    el.get_child("origin-id", ns::SID)
        .and_then(|o| o.attr("id"))
        .or_else(|| el.attr("id"))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn presence_to(room: &str, nick: &str, from: &str) -> Stanza {
        let el: Element = format!(
            "<presence xmlns='jabber:client' from='{from}' to='{room}/{nick}'><x xmlns='{NS_MUC}'><history maxstanzas='0'/></x></presence>"
        )
        .parse()
        .unwrap();
        Stanza::from_element(el).unwrap()
    }

    fn groupchat(room: &str, from: &str, body: &str) -> Stanza {
        let el: Element = format!(
            "<message xmlns='jabber:client' from='{from}' to='{room}' type='groupchat'><body>{body}</body></message>"
        )
        .parse()
        .unwrap();
        Stanza::from_element(el).unwrap()
    }

    /// A room of `n` occupants (user0 the owner), unlocked, with the
    /// service limits raised as an operator would for big rooms.
    fn big_room(n: usize, svc: &MucConfig, ids: &ArchiveIds) -> Room {
        let jid = BareJid::new("big@conference.example.org").unwrap();
        let mut config = RoomConfig::new_room(svc, "salt".into());
        config.max_users = n as u32;
        let mut room = Room::new(jid, config, String::new(), 0);
        let cx = Ctx { svc, ids };
        let mut out = Out::default();
        room.make_owner(&BareJid::new("user0@example.org").unwrap(), &mut out);
        for i in 0..n {
            let mut out = Out::default();
            room.handle(
                &cx,
                presence_to(
                    "big@conference.example.org",
                    &format!("u{i}"),
                    &format!("user{i}@example.org/r"),
                ),
                &mut out,
            );
            // §7.2.3: the i occupants already there, then the newcomer's
            // presence to each of them and to itself, then the subject.
            let presences = out
                .stanzas
                .iter()
                .filter(|s| s.kind() == StanzaKind::Presence)
                .count();
            assert_eq!(presences, i + (i + 1), "join {i}");
            let last_presence = out
                .stanzas
                .iter()
                .rfind(|s| s.kind() == StanzaKind::Presence)
                .unwrap();
            assert_eq!(
                last_presence.to().unwrap().as_str(),
                format!("user{i}@example.org/r")
            );
        }
        room
    }

    #[test]
    fn a_thousand_occupant_room_fans_out_once_per_occupant() {
        let svc = MucConfig::default();
        let ids = ArchiveIds::new(1, None);
        let mut room = big_room(1000, &svc, &ids);
        assert_eq!(room.occupant_count(), 1000);
        let cx = Ctx {
            svc: &svc,
            ids: &ids,
        };
        let mut out = Out::default();
        room.handle(
            &cx,
            groupchat(
                "big@conference.example.org",
                "user7@example.org/r",
                "hello all",
            ),
            &mut out,
        );
        assert_eq!(
            out.stanzas.len(),
            1000,
            "one copy per occupant, the sender included"
        );
        assert_eq!(out.archive.len(), 1, "archived once for the room");
        let mut to: Vec<&str> = out
            .stanzas
            .iter()
            .map(|s| s.to().unwrap().as_str())
            .collect();
        to.sort();
        to.dedup();
        assert_eq!(to.len(), 1000);
        assert!(out
            .stanzas
            .iter()
            .all(|s| s.from().unwrap().as_str() == "big@conference.example.org/u7"));
        // The room is full: one more (not an admin) is refused (§7.2.9).
        let mut out = Out::default();
        room.handle(
            &cx,
            presence_to("big@conference.example.org", "late", "late@example.org/r"),
            &mut out,
        );
        assert_eq!(out.stanzas.len(), 1);
        assert!(out.stanzas[0].is_error());
        assert!(out.stanzas[0]
            .element()
            .to_string()
            .contains("service-unavailable"));
        // The owner still enters past the limit (§7.2.9).
        let mut out = Out::default();
        room.handle(
            &cx,
            presence_to(
                "big@conference.example.org",
                "boss",
                "user0@example.org/other",
            ),
            &mut out,
        );
        assert!(!out.stanzas.iter().any(|s| s.is_error()));
    }

    #[test]
    fn history_filters_by_count_and_characters() {
        let svc = MucConfig::default();
        let ids = ArchiveIds::new(1, None);
        let mut room = big_room(1, &svc, &ids);
        let cx = Ctx {
            svc: &svc,
            ids: &ids,
        };
        for i in 0..30 {
            let mut out = Out::default();
            room.handle(
                &cx,
                groupchat(
                    "big@conference.example.org",
                    "user0@example.org/r",
                    &format!("m{i}"),
                ),
                &mut out,
            );
        }
        assert_eq!(room.history.len(), 30);
        let x: Element = format!("<x xmlns='{NS_MUC}'><history maxstanzas='5'/></x>")
            .parse()
            .unwrap();
        let to = FullJid::new("a@example.org/r").unwrap();
        let mut out = Out::default();
        room.send_history(Some(&x), &to, &mut out);
        let bodies: Vec<String> = out
            .stanzas
            .iter()
            .map(|s| s.element().get_child("body", ns::CLIENT).unwrap().text())
            .collect();
        assert_eq!(bodies, ["m25", "m26", "m27", "m28", "m29"]);
        // Without a request: the room's muc#maxhistoryfetch (20).
        let mut out = Out::default();
        room.send_history(None, &to, &mut out);
        assert_eq!(out.stanzas.len(), 20);
        // maxchars: only what fits.
        let one = room.history.back().unwrap().chars;
        let x: Element = format!(
            "<x xmlns='{NS_MUC}'><history maxchars='{}'/></x>",
            one * 2 + 1
        )
        .parse()
        .unwrap();
        let mut out = Out::default();
        room.send_history(Some(&x), &to, &mut out);
        assert_eq!(out.stanzas.len(), 2);
    }
}
