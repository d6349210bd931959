//! XEP-0313 queries of a room's archive, on the room's bare JID (§3.3.2:
//! "A MUC service allowing MAM queries for a room MUST expose the MAM
//! archive on the room's bare JID"). Section numbers are XEP-0313's
//! (version 1.1.3).
//!
//! The room's task hands each iq `{urn:xmpp:mam:2}query` (get: the form,
//! set: a query) and `{urn:xmpp:mam:2}metadata` (get) to [`intercept`]
//! before the room's rules see it. The permission check reads the room's
//! state there, synchronously; the query itself runs in a task of its own,
//! which routes the `<result/>` messages and then the `<fin/>` iq to the
//! requester, from the room's bare JID, so a large page never holds up the
//! room. Parsing and rendering are [`crate::modules::common::archive_query`]'s, as for
//! users' own archives.
//!
//! - **Who may query** (§6.1.2, "the right to enter it at the time of the
//!   query"), as ejabberd does: nobody while the room is locked but its
//!   owner (`item-not-found`, as for entering); never an outcast
//!   (`forbidden`); in a members-only room only members, admins, owners and
//!   current occupants (`forbidden`); in an open room anyone else, even
//!   someone who never entered. Stricter than ejabberd and Prosody (which
//!   §6.1.2 allows): a password-protected room is treated like a
//!   members-only one, since the password is part of the right to enter.
//! - **Logging off** (`muc#roomconfig_enablelogging`): as Prosody does,
//!   queries are still answered from what was archived while it was on
//!   (nothing new is added); disco#info advertises `urn:xmpp:mam:2` (and
//!   `#extended`) only while it is on, so clients that look first do not
//!   query. (ejabberd answers from the room's in-memory history instead;
//!   ours carries no real JIDs, which `with` and the `<x/>` below need.)
//! - **An earlier room of the same name**: only messages archived since
//!   the room was created are visible; a temporary room destroyed and
//!   created again by someone else does not show the old conversation. Ids
//!   of older messages are `item-not-found`.
//! - **Real JIDs** (§6.1.2): the stored stanzas carry none; any
//!   `<x xmlns='…muc#user'/>` in them is removed (§8.4, a sender could have
//!   put one there), and requesters who may see real JIDs — everyone in a
//!   non-anonymous room, owners, admins and moderators in a semi-anonymous
//!   one — get `<x><item jid='sender@domain'/></x>` (the sender's bare
//!   JID, which is what the archive keeps, as Prosody shows it).
//! - **`with`** (§4.1.1, "the publisher of the item"): the sender's real
//!   bare JID — allowed to those who may see real JIDs, and to anyone for
//!   their own JID; otherwise `forbidden` (filtering by real JID in a
//!   semi-anonymous room would tell who said what). An occupant JID
//!   (`room@service/nick`), the room's JID or a real full JID gets
//!   `feature-not-implemented`: the archive is indexed by the sender's real
//!   bare JID, and a nickname names different people over time.
//! - Everything else as for users' archives: `start`/`end`, `before-id`/
//!   `after-id`/`ids`, RSM `max`/`after`/`before`, `<flip-page/>`, `max=0`
//!   counts, `<metadata/>` (§5); pages of at most [`MAX_PAGE`] messages,
//!   [`DEFAULT_PAGE`] without `<max/>`. The room's write-behind queue is
//!   flushed first, so a query finds what was just said.
//! - At most [`MAX_RUNNING`] queries of room archives run at once on a
//!   node (one limit for the process); more get `resource-constraint`
//!   (type `wait`) at once, so a flood of queries costs no database work.
//!
//! Results are routed like any stanza; they carry a `<no-store/>` hint
//! (XEP-0334) and stop if the requester's session is gone, so they never
//! end up in an offline queue.

use super::config::Whois;
use super::host::{Host, Kind};
use super::room::{Affiliation, Role, Room};
use super::{Inner, NS_MUC_USER};
use crate::modules::common::archive_query::{self, Request};
use starling_core::storage::{ArchiveId, ArchiveQuery, ArchivedMessage, WithFilter};
use starling_core::Env;
use starling_proto::mam::NS_MAM;
use starling_proto::{
    ns, BareJid, ErrorType, FullJid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind,
};
use starling_xml::Element;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Page size when a query gives no RSM `<max/>` (as `[modules.mam]`'s default).
pub const DEFAULT_PAGE: u32 = 50;
/// Largest page a query may ask for (as `[modules.mam]`'s default).
pub const MAX_PAGE: u32 = 250;
/// Room-archive queries running at once on this node.
pub const MAX_RUNNING: usize = 64;

static RUNNING: Semaphore = Semaphore::const_new(MAX_RUNNING);

fn err(c: StanzaErrorCondition, text: &str) -> StanzaError {
    StanzaError::new(c).with_text(text)
}

/// What a requester may see of a room's archive.
#[derive(Debug)]
pub(super) struct Access {
    /// The requester's bare JID.
    pub bare: BareJid,
    /// Senders' real JIDs are shown, and `with` may name anyone.
    pub sees_jids: bool,
    /// Exclusive lower bound: messages of an earlier room of this name
    /// are older.
    pub floor: ArchiveId,
}

impl Access {
    /// The floor for a room created at `created_at` (milliseconds).
    pub fn floor_of(created_at: i64) -> ArchiveId {
        ArchiveId(ArchiveId::lower_bound(created_at.saturating_mul(1000)).0 - 1)
    }
}

/// §6.1.2: may `from` read `room`'s archive now?
fn access(room: &Room, from: &FullJid) -> Result<Access, StanzaError> {
    let bare = from.to_bare();
    let aff = room.affiliation_of(&bare);
    if room.locked && aff != Affiliation::Owner {
        return Err(err(
            StanzaErrorCondition::ItemNotFound,
            "this room is locked until its owner configures it",
        ));
    }
    if aff == Affiliation::Outcast {
        return Err(err(
            StanzaErrorCondition::Forbidden,
            "you are banned from this room",
        ));
    }
    let occupant = room.occupants.values().find(|o| o.bare == bare);
    let admitted = aff >= Affiliation::Member || occupant.is_some();
    if room.config.members_only && !admitted {
        return Err(err(
            StanzaErrorCondition::Forbidden,
            "only members may query the archive of this room",
        ));
    }
    if room.config.password_protected && !admitted {
        return Err(err(
            StanzaErrorCondition::Forbidden,
            "only occupants and members may query the archive of a password-protected room",
        ));
    }
    let moderator =
        aff >= Affiliation::Admin || occupant.is_some_and(|o| o.role == Role::Moderator);
    Ok(Access {
        bare,
        sees_jids: room.config.whois == Whois::Anyone || moderator,
        floor: Access::floor_of(room.created_at),
    })
}

/// Applies the room's rules to a parsed query: `with` (see the module
/// documentation) and the floor.
fn restrict(req: &mut Request, room: &BareJid, a: &Access) -> Result<(), StanzaError> {
    if let Some(w) = &req.query.with {
        let (bare, full) = match w {
            WithFilter::Bare(b) => (b, false),
            WithFilter::Full { bare, .. } => (bare, true),
        };
        if bare == room.as_str() {
            return Err(err(
                StanzaErrorCondition::FeatureNotImplemented,
                "filtering a room's archive by occupant JID is not supported; 'with' may be the sender's real bare JID",
            ));
        }
        if full {
            return Err(err(
                StanzaErrorCondition::FeatureNotImplemented,
                "a room's archive keeps senders' bare JIDs only; 'with' must be a bare JID",
            ));
        }
        if !a.sees_jids && bare != a.bare.as_str() {
            return Err(err(
                StanzaErrorCondition::Forbidden,
                "only moderators may filter this semi-anonymous room's archive by real JID",
            ));
        }
    }
    if req.ids_to_check.iter().any(|id| *id <= a.floor) {
        return Err(err(
            StanzaErrorCondition::ItemNotFound,
            "no message with this id in the archive",
        ));
    }
    req.query.after = Some(req.query.after.map_or(a.floor, |x| x.max(a.floor)));
    Ok(())
}

/// A stored message of `room` as `sees_jids` shows it (§6.1.2, §8.4).
/// Messages the room itself sent (a moderator's retraction) name no
/// sender.
fn present(room: &BareJid, m: &ArchivedMessage, mut el: Element, sees_jids: bool) -> Element {
    el.remove_attr("to");
    el.remove_children("x", NS_MUC_USER);
    if sees_jids && m.with_bare != room.as_str() {
        el.append_child(
            Element::builder("x", NS_MUC_USER)
                .append(
                    Element::builder("item", NS_MUC_USER)
                        .attr("jid", m.with_bare.as_str())
                        .build(),
                )
                .build(),
        );
    }
    el
}

enum Asked {
    Form,
    Query,
    Metadata,
}

/// Takes a MAM request to an XEP-0045 room's bare JID and answers it
/// (the query in a task of its own); hands any other stanza back.
pub(super) async fn intercept(
    inner: &Arc<Inner>,
    env: &Env,
    room: &Room,
    st: Stanza,
) -> Option<Stanza> {
    serve(
        inner,
        env,
        &room.jid,
        st,
        |from| access(room, from),
        present,
    )
    .await
}

/// How a stored message is shown: the room, the stored message, its
/// element, whether real JIDs are shown.
pub(super) type Present = fn(&BareJid, &ArchivedMessage, Element, bool) -> Element;

/// Takes a MAM request to a room's bare JID and answers it (the query in
/// a task of its own) if `access` lets the requester read the archive;
/// hands any other stanza back.
pub(super) async fn serve<K: Kind>(
    inner: &Arc<Host<K>>,
    env: &Env,
    room_jid: &BareJid,
    st: Stanza,
    access: impl FnOnce(&FullJid) -> Result<Access, StanzaError>,
    present: Present,
) -> Option<Stanza> {
    if st.kind() != StanzaKind::Iq
        || !st.is_iq_request()
        || st.to().is_some_and(|t| t.resource().is_some())
    {
        return Some(st);
    }
    let asked = match st.payload() {
        Some(p) if p.ns() == NS_MAM => match (p.name(), st.type_attr()) {
            ("query", Some("get")) => Asked::Form,
            ("query", Some("set")) => Asked::Query,
            ("metadata", Some("get")) => Asked::Metadata,
            _ => return Some(st),
        },
        _ => return Some(st),
    };
    // Users' sessions always stamp a full JID (the room ignores others too).
    let from = st.from().and_then(|f| f.try_as_full().ok()).cloned()?;
    let prepared = match asked {
        Asked::Form => {
            env.route(st.iq_result(Some(archive_query::query_form())))
                .await;
            return None;
        }
        Asked::Query => access(&from).and_then(|a| {
            let q = st.payload().expect("matched above");
            let mut req = archive_query::parse(q, DEFAULT_PAGE, MAX_PAGE)?;
            restrict(&mut req, room_jid, &a)?;
            Ok((a, Some(req)))
        }),
        Asked::Metadata => access(&from).map(|a| (a, None)),
    };
    let refused = |e: StanzaError| st.error_reply(e);
    let (a, req) = match prepared {
        Ok(p) => p,
        Err(e) => {
            if let Some(r) = refused(e) {
                env.route(r).await;
            }
            return None;
        }
    };
    let Ok(permit) = RUNNING.try_acquire() else {
        if let Some(r) = refused(
            err(
                StanzaErrorCondition::ResourceConstraint,
                "too many archive queries at once, try again later",
            )
            .with_type(ErrorType::Wait),
        ) {
            env.route(r).await;
        }
        return None;
    };
    let inner = inner.clone();
    let room_jid = room_jid.clone();
    tokio::spawn(async move {
        let _permit = permit;
        inner.archive.flush().await;
        let store = inner.storage.archive.clone();
        let answer = match &req {
            Some(req) => {
                archive_query::answer(
                    store.as_ref(),
                    &room_jid,
                    &from,
                    &st,
                    req,
                    K::MODULE,
                    |m, el| present(&room_jid, m, el, a.sees_jids),
                )
                .await
            }
            None => metadata(&inner, &room_jid, a.floor)
                .await
                .map(|md| (Vec::new(), st.iq_result(Some(md)).into_element())),
        };
        let Some(env) = inner.env() else { return };
        let (results, fin) = match answer {
            Ok(r) => r,
            Err(e) => {
                if let Some(r) = st.error_reply(e) {
                    env.route(r).await;
                }
                return;
            }
        };
        for mut el in results {
            if env.sessions.get(&from).is_none() {
                tracing::debug!(module = K::MODULE, room = %room_jid, requester = %from, "requester gone; archive results dropped");
                return;
            }
            el.append_child(Element::new("no-store", ns::HINTS));
            env.route(Stanza::new(
                el,
                Some(room_jid.clone().into()),
                Some(from.clone().into()),
            ))
            .await;
        }
        env.route(Stanza::new(
            fin,
            Some(room_jid.clone().into()),
            Some(from.clone().into()),
        ))
        .await;
    });
    None
}

/// §5 for the room's archive since `floor`: two one-message reads, so an
/// earlier room's messages do not show.
async fn metadata<K: Kind>(
    inner: &Host<K>,
    room: &BareJid,
    floor: ArchiveId,
) -> Result<Element, StanzaError> {
    let store = &inner.storage.archive;
    let end = |from_end: bool| ArchiveQuery {
        after: Some(floor),
        limit: 1,
        from_end,
        ..ArchiveQuery::default()
    };
    let read = async {
        let first = store.query(room, &end(false)).await?;
        let last = store.query(room, &end(true)).await?;
        Ok::<_, starling_core::storage::StorageError>(
            first
                .messages
                .first()
                .zip(last.messages.first())
                .map(|(f, l)| (f.id, l.id)),
        )
    };
    match read.await {
        Ok(bounds) => Ok(archive_query::metadata(bounds)),
        Err(e) => {
            tracing::error!(module = K::MODULE, room = %room, error = %e, "room archive metadata failed");
            Err(StanzaErrorCondition::InternalServerError.into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::config::RoomConfig;
    use super::*;

    fn room(cfg: impl FnOnce(&mut RoomConfig)) -> Room {
        let mut c = RoomConfig::new_room(&super::super::MucConfig::default(), "salt".into());
        cfg(&mut c);
        let mut r = Room::new(
            BareJid::new("r@conference.x").unwrap(),
            c,
            String::new(),
            1_700_000_000_000,
        );
        for (j, a) in [
            ("owner@x", Affiliation::Owner),
            ("member@x", Affiliation::Member),
            ("banned@x", Affiliation::Outcast),
        ] {
            r.affiliations.insert(
                j.into(),
                super::super::room::Aff {
                    affiliation: a,
                    nick: None,
                    reason: None,
                },
            );
        }
        r
    }

    fn who(j: &str) -> FullJid {
        FullJid::new(&format!("{j}/res")).unwrap()
    }

    fn refused(r: &Room, j: &str) -> Option<StanzaErrorCondition> {
        access(r, &who(j)).err().map(|e| e.condition)
    }

    #[test]
    fn who_may_query_follows_who_may_enter() {
        use StanzaErrorCondition::*;
        let open = room(|_| {});
        assert_eq!(refused(&open, "anyone@x"), None);
        assert_eq!(refused(&open, "banned@x"), Some(Forbidden));
        let members = room(|c| c.members_only = true);
        assert_eq!(refused(&members, "anyone@x"), Some(Forbidden));
        assert_eq!(refused(&members, "member@x"), None);
        assert_eq!(refused(&members, "owner@x"), None);
        let secret = room(|c| c.password_protected = true);
        assert_eq!(refused(&secret, "anyone@x"), Some(Forbidden));
        assert_eq!(refused(&secret, "member@x"), None);
        let mut locked = room(|_| {});
        locked.locked = true;
        assert_eq!(refused(&locked, "anyone@x"), Some(ItemNotFound));
        assert_eq!(refused(&locked, "owner@x"), None);
    }

    #[test]
    fn real_jids_only_for_those_who_may_see_them() {
        let semi = room(|_| {});
        assert!(!access(&semi, &who("anyone@x")).unwrap().sees_jids);
        assert!(!access(&semi, &who("member@x")).unwrap().sees_jids);
        assert!(access(&semi, &who("owner@x")).unwrap().sees_jids);
        let open = room(|c| c.whois = Whois::Anyone);
        assert!(access(&open, &who("anyone@x")).unwrap().sees_jids);

        let a = access(&semi, &who("anyone@x")).unwrap();
        let with = |w: &str| {
            let q: Element = format!(
                "<query xmlns='urn:xmpp:mam:2'><x xmlns='jabber:x:data' type='submit'><field var='with'><value>{w}</value></field></x></query>"
            )
            .parse()
            .unwrap();
            let mut req = archive_query::parse(&q, DEFAULT_PAGE, MAX_PAGE).unwrap();
            restrict(&mut req, &semi.jid, &a).map(|_| req)
        };
        use StanzaErrorCondition::*;
        let c = |r: Result<Request, StanzaError>| r.err().map(|e| e.condition);
        assert_eq!(c(with("other@x")), Some(Forbidden));
        assert_eq!(c(with("anyone@x")), None, "one's own JID");
        assert_eq!(c(with("r@conference.x/nick")), Some(FeatureNotImplemented));
        assert_eq!(c(with("anyone@x/res")), Some(FeatureNotImplemented));
        let req = with("anyone@x").unwrap();
        assert_eq!(req.query.after, Some(a.floor), "nothing of an earlier room");

        let m = ArchivedMessage {
            id: ArchiveId(1),
            with_bare: "real@x".into(),
            outgoing: false,
            flags: 0,
            stanza: String::new(),
        };
        let stored: Element = "<message xmlns='jabber:client' from='r@conference.x/n' type='groupchat'><body>hi</body><x xmlns='http://jabber.org/protocol/muc#user'><item jid='forged@x'/></x></message>".parse().unwrap();
        let shown = present(&semi.jid, &m, stored.clone(), false);
        assert!(shown.get_child("x", NS_MUC_USER).is_none(), "{shown}");
        let shown = present(&semi.jid, &m, stored.clone(), true);
        let items: Vec<_> = shown
            .children()
            .filter(|c| c.is("x", NS_MUC_USER))
            .collect();
        assert_eq!(items.len(), 1, "{shown}");
        assert_eq!(
            items[0].get_child("item", NS_MUC_USER).unwrap().attr("jid"),
            Some("real@x")
        );
        let from_room = ArchivedMessage {
            with_bare: semi.jid.to_string(),
            ..m
        };
        let shown = present(&semi.jid, &from_room, stored, true);
        assert!(shown.get_child("x", NS_MUC_USER).is_none(), "{shown}");
    }
}
