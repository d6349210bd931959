//! The group-chat service in the admin listener (docs/admin.md): its
//! rooms endpoints and web admin page (`api.rs`), which the module adds
//! when it starts ([`extend`]), over [`MucAdmin`], the server acting as
//! the service's administrator (this file; `contract.rs` the operations'
//! types).
//!
//! - **Changes** are stanzas of the server acting as the service's
//!   administrator: from the bare JID of the served domain the service is
//!   under (`example.org` for `conference.example.org`), which no client
//!   can send ([`Host::is_server_request`] checks it). They are the XEP-0045
//!   requests an owner would send — a `muc#admin` item (§9–§10), a
//!   `muc#owner` `<destroy/>` (§10.9) — plus a groupchat message the room
//!   sends as its own, and, for creation without anyone entering (which
//!   XEP-0045 has no request for), `<create/>` in [`NS_ADMIN`]. The room's
//!   task applies them with owner rights (`Room::handle_server`), so its
//!   rules, storage and stanzas to occupants are those of the XMPP
//!   request; the room's answer comes back on a oneshot channel
//!   ([`Host::request`]).
//! - **On a cluster** a room runs on the node placement picks: a change
//!   for a room of another node is handed to that node's service over the
//!   bus (`Router::to_service_on`) and answered 202 — the node applies it
//!   the same way and logs the outcome, since nothing carries the answer
//!   back.
//! - **Reads**: a room live on this node is read in its task
//!   ([`Host::inspect`]: occupants included); any other room from storage
//!   (stored rooms only, without occupants).

use super::config::{RoomConfig, Whois, MAX_NAME_CHARS};
use super::host::{AdminFailure, Host, Listing};
use super::room::Room;
use super::store::{RoomAffiliation, StoredRoom};
use super::{MucKind, NS_ADMIN, NS_MUC_ADMIN, NS_MUC_OWNER};
use crate::modules::common::admin_api::{AdminExtensions, AdminPage};
use contract::{
    AffiliationEntry, Affiliations, Applied, OccupantEntry, RoomAdmin, RoomChange, RoomDetails,
    RoomError, RoomSummary,
};
use starling_proto::{ns, BareJid, Jid, Stanza, StanzaKind};
use starling_xml::Element;
use std::collections::BTreeMap;
use std::sync::Arc;

mod api;
mod contract;

#[cfg(test)]
pub(crate) use api::{openapi, ROUTES};

/// Adds the rooms endpoints, their OpenAPI paths and the web admin's
/// rooms page to `ext`, over `admin`.
pub(super) fn extend(ext: &mut AdminExtensions, admin: Arc<MucAdmin>) {
    ext.routes.extend(api::routes(&admin));
    ext.openapi.push(api::openapi());
    ext.pages.push(AdminPage {
        path: "/admin/rooms",
        title: "Rooms",
        body: Arc::new(move |q| Box::pin(api::page(admin.clone(), q))),
    });
}

/// A creation request ([`create_request`]).
pub(super) struct CreateRequest {
    /// The room's owner.
    pub owner: BareJid,
    /// Natural-language name (may be empty).
    pub name: String,
    /// Stored, kept when empty.
    pub persistent: bool,
    /// Listed in disco#items (else the service default).
    pub public: Option<bool>,
    /// Only members may enter (else the service default).
    pub members_only: Option<bool>,
}

/// If `st` is a creation request (an iq set with `<create/>` in
/// [`NS_ADMIN`]): its values, or why they are refused. The caller checks
/// that it comes from the server.
pub(super) fn create_request(st: &Stanza) -> Option<Result<CreateRequest, String>> {
    if st.kind() != StanzaKind::Iq || st.type_attr() != Some("set") {
        return None;
    }
    let c = st.payload().filter(|p| p.is("create", NS_ADMIN))?;
    let flag = |name: &str| match c.attr(name) {
        None => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(v) => Err(format!("{name}={v:?}: true or false")),
    };
    Some((|| {
        let owner = c
            .attr("owner")
            .and_then(|o| BareJid::new(o).ok())
            .filter(|o| o.node().is_some())
            .ok_or("the owner must be an account JID")?;
        let name = c
            .get_child("name", NS_ADMIN)
            .map(|n| n.text())
            .unwrap_or_default();
        if name.chars().count() > MAX_NAME_CHARS {
            return Err(format!(
                "the name is longer than {MAX_NAME_CHARS} characters"
            ));
        }
        Ok(CreateRequest {
            owner,
            name,
            persistent: flag("persistent")?.unwrap_or(true),
            public: flag("public")?,
            members_only: flag("members-only")?,
        })
    })())
}

/// What an answer to the administrator says, for the log: `done`, or the
/// error's condition and text.
pub(super) fn outcome(answer: &Stanza) -> String {
    match refusal(answer) {
        None => "done".to_owned(),
        Some((condition, text)) => format!("refused: {condition} ({text})"),
    }
}

/// The condition and text of an error answer.
fn refusal(answer: &Stanza) -> Option<(String, String)> {
    if !answer.is_error() {
        return None;
    }
    let e = answer.element().get_child("error", ns::CLIENT)?;
    let condition = e
        .children()
        .find(|c| c.ns() == ns::STANZAS && c.name() != "text")
        .map_or("undefined-condition", |c| c.name())
        .to_owned();
    let text = e
        .get_child("text", ns::STANZAS)
        .map(|t| t.text())
        .unwrap_or_default();
    Some((condition, text))
}

/// The admin API's view of an error answer.
fn room_error(condition: &str, text: String) -> RoomError {
    let text = if text.is_empty() {
        condition.to_owned()
    } else {
        text
    };
    match condition {
        "item-not-found" => RoomError::NotFound(text),
        "conflict" => RoomError::Conflict(text),
        "bad-request" | "jid-malformed" | "not-acceptable" | "not-allowed" | "forbidden" => {
            RoomError::Invalid(text)
        }
        _ => RoomError::Unavailable(format!("the room answered {condition}: {text}")),
    }
}

fn storage_failed(e: impl std::fmt::Display) -> RoomError {
    tracing::error!(module = super::NAME, error = %e, "admin API: reading rooms failed");
    RoomError::Unavailable("storage failed; see the server log".into())
}

/// The admin API's access to the XEP-0045 service.
pub(super) struct MucAdmin {
    host: Arc<Host<MucKind>>,
    /// This node's id (where rooms with no other placement run).
    node: u8,
}

impl MucAdmin {
    pub(super) fn new(host: Arc<Host<MucKind>>, node: u8) -> MucAdmin {
        MucAdmin { host, node }
    }

    fn env(&self) -> Result<Arc<starling_core::Env>, RoomError> {
        self.host
            .env()
            .ok_or_else(|| RoomError::Unavailable("the server is starting".into()))
    }

    /// The node that runs `room`.
    fn node_of(&self, env: &starling_core::Env, room: &BareJid) -> u8 {
        env.router.placement(room.as_str()).unwrap_or(self.node)
    }

    /// The server's request to `room`: `el` (an iq set or a message) from
    /// the domain the room's service is under.
    fn request(&self, room: &BareJid, mut el: Element) -> Result<Stanza, RoomError> {
        let parent = room
            .domain()
            .as_str()
            .strip_prefix(self.host.settings.subdomain.as_str())
            .and_then(|r| r.strip_prefix('.'))
            .and_then(|d| Jid::new(d).ok())
            .ok_or_else(|| RoomError::Invalid(format!("{room} is not on this service")))?;
        if el.attr("id").is_none() {
            el.set_attr("id", starling_proto::random_id(12));
        }
        Ok(Stanza::new(el, Some(parent), Some(room.clone().into())))
    }
}

fn iq_set(payload: Element) -> Element {
    Element::builder("iq", ns::CLIENT)
        .attr("type", "set")
        .append(payload)
        .build()
}

fn flag(v: bool) -> &'static str {
    if v {
        "true"
    } else {
        "false"
    }
}

/// The request element of a change.
fn change_element(change: &RoomChange) -> Element {
    match change {
        RoomChange::Create {
            owner,
            name,
            persistent,
            public,
            members_only,
        } => {
            let mut c = Element::builder("create", NS_ADMIN)
                .attr("owner", owner.as_str())
                .attr("persistent", flag(*persistent))
                .build();
            if let Some(p) = public {
                c.set_attr("public", flag(*p));
            }
            if let Some(m) = members_only {
                c.set_attr("members-only", flag(*m));
            }
            if !name.is_empty() {
                c.append_child(
                    Element::builder("name", NS_ADMIN)
                        .text(name.as_str())
                        .build(),
                );
            }
            iq_set(c)
        }
        RoomChange::Destroy { reason } => {
            let mut d = Element::new("destroy", NS_MUC_OWNER);
            if let Some(r) = reason {
                d.append_child(
                    Element::builder("reason", NS_MUC_OWNER)
                        .text(r.as_str())
                        .build(),
                );
            }
            iq_set(Element::builder("query", NS_MUC_OWNER).append(d).build())
        }
        RoomChange::Affiliation {
            jid,
            affiliation,
            reason,
        } => {
            let mut item = Element::builder("item", NS_MUC_ADMIN)
                .attr("affiliation", *affiliation)
                .attr("jid", jid.as_str())
                .build();
            if let Some(r) = reason {
                item.append_child(
                    Element::builder("reason", NS_MUC_ADMIN)
                        .text(r.as_str())
                        .build(),
                );
            }
            iq_set(Element::builder("query", NS_MUC_ADMIN).append(item).build())
        }
        RoomChange::Message { body } => Element::builder("message", ns::CLIENT)
            .attr("type", "groupchat")
            .append(
                Element::builder("body", ns::CLIENT)
                    .text(body.as_str())
                    .build(),
            )
            .build(),
    }
}

fn datetime(ms: i64) -> Option<String> {
    u128::try_from(ms)
        .ok()
        .filter(|ms| *ms > 0)
        .map(starling_proto::datetime::xep0082_datetime)
}

fn whois(w: Whois) -> &'static str {
    match w {
        Whois::Moderators => "moderators",
        Whois::Anyone => "anyone",
    }
}

/// Affiliation rows (jid, affiliation, nick, reason) as the lists.
fn affiliation_lists<'a>(
    rows: impl Iterator<Item = (&'a str, &'a str, Option<&'a String>, Option<&'a String>)>,
) -> Affiliations {
    let mut a = Affiliations::default();
    for (jid, aff, nick, reason) in rows {
        let list = match aff {
            "owner" => &mut a.owner,
            "admin" => &mut a.admin,
            "member" => &mut a.member,
            "outcast" => &mut a.outcast,
            _ => continue,
        };
        list.push(AffiliationEntry {
            jid: jid.to_owned(),
            nick: nick.cloned(),
            reason: reason.cloned(),
        });
    }
    a
}

/// What the admin API shows of a room with this configuration.
fn details(jid: &BareJid, c: &RoomConfig, subject: &str, created_at: i64, node: u8) -> RoomDetails {
    RoomDetails {
        jid: jid.to_string(),
        loaded: false,
        node,
        name: c.name.clone(),
        description: c.description.clone(),
        subject: subject.to_owned(),
        persistent: c.persistent,
        public: c.public,
        members_only: c.members_only,
        moderated: c.moderated,
        password_protected: c.password_protected,
        logging: c.logging,
        locked: false,
        max_users: c.max_users,
        whois: whois(c.whois).to_owned(),
        created_at: datetime(created_at),
        affiliations: Affiliations::default(),
        occupants: Vec::new(),
    }
}

/// A live room, read in its task.
fn describe_live(r: &Room, node: u8) -> RoomDetails {
    let mut d = details(&r.jid, &r.config, &r.subject, r.created_at, node);
    d.loaded = true;
    d.locked = r.locked;
    d.affiliations = affiliation_lists(r.affiliations.iter().map(|(j, a)| {
        (
            j.as_str(),
            a.affiliation.as_str(),
            a.nick.as_ref(),
            a.reason.as_ref(),
        )
    }));
    d.occupants = r
        .occupants
        .values()
        .map(|o| OccupantEntry {
            nick: o.nick.clone(),
            role: o.role.as_str().to_owned(),
            affiliation: r.affiliation_of(&o.bare).as_str().to_owned(),
            jid: o
                .sessions
                .last()
                .map_or_else(|| o.bare.to_string(), |(j, _)| j.to_string()),
            sessions: o.sessions.iter().map(|(j, _)| j.to_string()).collect(),
        })
        .collect();
    d
}

/// A stored room (not loaded here).
fn describe_stored(stored: &StoredRoom, affs: &[RoomAffiliation], node: u8) -> RoomDetails {
    let c = RoomConfig::from_stored(&stored.config).unwrap_or_default();
    // The subject as stored: the setter's nick, a newline, the text.
    let subject = stored
        .subject
        .split_once('\n')
        .map_or(stored.subject.as_str(), |(_, t)| t);
    let mut d = details(&stored.jid, &c, subject, stored.created_at, node);
    d.persistent = true;
    d.affiliations = affiliation_lists(affs.iter().map(|a| {
        (
            a.jid.as_str(),
            a.affiliation.as_str(),
            a.nick.as_ref(),
            a.reason.as_ref(),
        )
    }));
    d
}

fn summary(jid: &BareJid, l: &Listing, loaded: bool, node: u8) -> RoomSummary {
    RoomSummary {
        jid: jid.to_string(),
        name: l.name.clone(),
        persistent: l.persistent,
        public: l.public,
        members_only: l.members_only,
        locked: l.locked,
        occupants: l.occupants,
        loaded,
        node,
    }
}

#[starling_core::async_trait]
impl RoomAdmin for MucAdmin {
    fn services(&self) -> Vec<String> {
        let Some(env) = self.host.env() else {
            return Vec::new();
        };
        let mut s: Vec<String> = env
            .hosts
            .list()
            .iter()
            .map(|d| format!("{}.{d}", self.host.settings.subdomain))
            .filter(|s| self.host.is_service_domain(&env, s))
            .collect();
        s.sort();
        s
    }

    fn is_service(&self, domain: &str) -> bool {
        self.host
            .env()
            .is_some_and(|env| self.host.is_service_domain(&env, domain))
    }

    async fn list(
        &self,
        service: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<RoomSummary>, RoomError> {
        let env = self.env()?;
        let name_of = |j: &BareJid| j.node().map(|n| n.as_str().to_owned()).unwrap_or_default();
        let mut rooms: BTreeMap<String, RoomSummary> = BTreeMap::new();
        // Stored rooms: the first `limit` after `after` are enough, since
        // the page is the first `limit` of stored and live together.
        let page = self
            .host
            .store
            .rooms(service, after, u32::try_from(limit).unwrap_or(u32::MAX))
            .await
            .map_err(storage_failed)?;
        for r in page {
            let c = RoomConfig::from_stored(&r.config).unwrap_or_default();
            let l = Listing {
                name: c.name,
                public: c.public,
                locked: false,
                occupants: 0,
                persistent: true,
                members_only: c.members_only,
                loaded: false,
            };
            let node = self.node_of(&env, &r.jid);
            rooms.insert(name_of(&r.jid), summary(&r.jid, &l, false, node));
        }
        for (jid, l) in self.host.listings() {
            let name = name_of(&jid);
            if !l.loaded
                || jid.domain().as_str() != service
                || after.is_some_and(|a| name.as_str() <= a)
            {
                continue;
            }
            rooms.insert(name, summary(&jid, &l, true, self.node));
        }
        Ok(rooms.into_values().take(limit).collect())
    }

    async fn show(&self, room: &BareJid) -> Result<Option<RoomDetails>, RoomError> {
        let env = self.env()?;
        let node = self.node_of(&env, room);
        if node == self.node {
            let live = self
                .host
                .inspect(room, move |r| r.map(|r| describe_live(r, node)))
                .await
                .flatten();
            if live.is_some() {
                return Ok(live);
            }
        }
        let storage = &self.host.store;
        let Some(stored) = storage.room(room).await.map_err(storage_failed)? else {
            return Ok(None);
        };
        let affs = storage.affiliations(room).await.map_err(storage_failed)?;
        Ok(Some(describe_stored(&stored, &affs, node)))
    }

    async fn change(&self, room: &BareJid, change: RoomChange) -> Result<Applied, RoomError> {
        let env = self.env()?;
        if let RoomChange::Create {
            persistent, name, ..
        } = &change
        {
            if *persistent && !self.host.cfg.allow_persistent {
                return Err(RoomError::Invalid(
                    "this service keeps no rooms ([modules.muc] allow_persistent = false): create it with \"persistent\": false".into(),
                ));
            }
            if name.chars().count() > MAX_NAME_CHARS {
                return Err(RoomError::Invalid(format!(
                    "the name is longer than {MAX_NAME_CHARS} characters"
                )));
            }
        }
        let request = self.request(room, change_element(&change))?;
        let id = request.id().map(str::to_owned);
        if let Some(node) = env.router.placement(room.as_str()) {
            env.router.to_service_on(&env, node, request).await;
            return Ok(Applied::Forwarded { node });
        }
        match self.host.request(room, request).await {
            Ok(answer) => match answer.as_ref().and_then(refusal) {
                Some((condition, text)) => Err(room_error(&condition, text)),
                None => Ok(Applied::Done {
                    id: id.filter(|_| matches!(change, RoomChange::Message { .. })),
                }),
            },
            Err(AdminFailure::Gone) => Err(RoomError::Unavailable(
                "the room stopped or moved to another cluster node before answering; nothing was changed: try again".into(),
            )),
            Err(AdminFailure::Timeout) => Err(RoomError::Unavailable(format!(
                "the room did not answer within {} s; the server log says whether the change was applied",
                super::host::ADMIN_WAIT.as_secs()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_server(el: Element) -> Stanza {
        Stanza::new(
            el,
            Some(Jid::new("example.org").unwrap()),
            Some(Jid::new("lobby@conference.example.org").unwrap()),
        )
    }

    #[test]
    fn a_creation_request_round_trips_and_bad_values_are_refused() {
        let change = RoomChange::Create {
            owner: BareJid::new("alice@example.org").unwrap(),
            name: "The Lobby".into(),
            persistent: false,
            public: None,
            members_only: Some(true),
        };
        let req = create_request(&from_server(change_element(&change)))
            .expect("a creation request")
            .expect("valid");
        assert_eq!(req.owner.as_str(), "alice@example.org");
        assert_eq!(req.name, "The Lobby");
        assert!(!req.persistent);
        assert_eq!((req.public, req.members_only), (None, Some(true)));
        let bad = iq_set(
            Element::builder("create", NS_ADMIN)
                .attr("owner", "example.org")
                .build(),
        );
        assert!(create_request(&from_server(bad)).unwrap().is_err());
        let bad = iq_set(
            Element::builder("create", NS_ADMIN)
                .attr("owner", "a@example.org")
                .attr("public", "yes")
                .build(),
        );
        assert!(create_request(&from_server(bad)).unwrap().is_err());
        let other = change_element(&RoomChange::Destroy { reason: None });
        assert!(create_request(&from_server(other)).is_none());
    }

    #[test]
    fn error_answers_map_to_api_errors() {
        let req = from_server(change_element(&RoomChange::Destroy { reason: None }));
        let answer = req
            .error_reply(
                starling_proto::StanzaError::new(starling_proto::StanzaErrorCondition::Conflict)
                    .with_text("the room must keep at least one owner"),
            )
            .unwrap();
        let (c, t) = refusal(&answer).unwrap();
        assert!(matches!(room_error(&c, t), RoomError::Conflict(m) if m.contains("owner")));
        assert_eq!(refusal(&req.iq_result(None)), None);
        assert!(outcome(&answer).starts_with("refused: conflict"));
    }
}
