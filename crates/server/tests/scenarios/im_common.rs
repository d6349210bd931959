//! Helpers shared by the roster and presence scenario tests.
#![allow(dead_code)]

use starling_core::storage::{RosterItem, Subscription};
use starling_testkit::stanza::presence;
use starling_testkit::starling_xml::Element;
use starling_testkit::{ns, Client, TestServer};

pub use starling_testkit::roster::{bare, get as roster_get, set_item, ROSTER};

/// Everything the server sends `c` until a ping round trip completes
/// ([`Client::barrier`]). The session serves its mailbox before reading
/// the socket, so whatever was queued for it before the ping arrives
/// comes first.
pub async fn sync(c: &mut Client) -> Vec<Element> {
    c.barrier().await
}

/// Logs in, requests the roster (becoming an interested resource) and
/// drains what arrives.
pub async fn login_full(server: &TestServer, user: &str) -> Client {
    let mut c = server.login(user).await;
    roster_get(&mut c).await;
    sync(&mut c).await;
    c
}

/// Roster pushes among `els`.
pub fn pushes(els: &[Element]) -> Vec<&Element> {
    els.iter()
        .filter(|e| {
            e.name() == "iq"
                && e.attr("type") == Some("set")
                && e.get_child("query", ROSTER).is_some()
        })
        .collect()
}

/// The item of a push.
pub fn push_item(push: &Element) -> &Element {
    push.get_child("query", ROSTER)
        .and_then(|q| q.get_child("item", ROSTER))
        .expect("push carries an item")
}

/// Types of the subscription presences among `els`.
pub fn sub_types(els: &[Element]) -> Vec<String> {
    els.iter()
        .filter(|e| e.name() == "presence")
        .filter_map(|e| e.attr("type"))
        .filter(|t| {
            matches!(
                *t,
                "subscribe" | "subscribed" | "unsubscribe" | "unsubscribed"
            )
        })
        .map(str::to_owned)
        .collect()
}

/// Presence stanzas of the given type (None = available) among `els`.
pub fn presences<'a>(els: &'a [Element], kind: Option<&str>) -> Vec<&'a Element> {
    els.iter()
        .filter(|e| e.name() == "presence" && e.attr("type") == kind)
        .collect()
}

/// The nine subscription states of RFC 6121 Appendix A.1, from the
/// user's perspective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum St {
    N,
    NPo,
    NPi,
    NPoi,
    T,
    TPi,
    F,
    FPo,
    B,
}

impl St {
    pub fn parts(self) -> (Subscription, bool, bool) {
        use Subscription::*;
        match self {
            St::N => (None, false, false),
            St::NPo => (None, true, false),
            St::NPi => (None, false, true),
            St::NPoi => (None, true, true),
            St::T => (To, false, false),
            St::TPi => (To, false, true),
            St::F => (From, false, false),
            St::FPo => (From, true, false),
            St::B => (Both, false, false),
        }
    }

    pub fn from_parts(sub: Subscription, ask: bool, pending_in: bool) -> St {
        use Subscription::*;
        match (sub, ask, pending_in) {
            (None, false, false) => St::N,
            (None, true, false) => St::NPo,
            (None, false, true) => St::NPi,
            (None, true, true) => St::NPoi,
            (To, false, false) => St::T,
            (To, false, true) => St::TPi,
            (From, false, false) => St::F,
            (From, true, false) => St::FPo,
            (Both, false, false) => St::B,
            other => panic!("impossible state {other:?}"),
        }
    }

    /// The same relationship seen from the contact's side.
    pub fn mirror(self) -> St {
        match self {
            St::N => St::N,
            St::NPo => St::NPi,
            St::NPi => St::NPo,
            St::NPoi => St::NPoi,
            St::T => St::F,
            St::TPi => St::FPo,
            St::F => St::T,
            St::FPo => St::TPi,
            St::B => St::B,
        }
    }

    pub const ALL: [St; 9] = [
        St::N,
        St::NPo,
        St::NPi,
        St::NPoi,
        St::T,
        St::TPi,
        St::F,
        St::FPo,
        St::B,
    ];
}

/// Writes `owner`'s side of state `st` with `other` into storage. "None +
/// Pending In" has no roster item (Appendix A.1 state 3).
pub async fn write_side(server: &TestServer, owner: &str, other: &str, st: St) {
    let store = &server.server.env.storage.roster;
    let (o, c) = (bare(owner), bare(other));
    let (sub, ask, pending_in) = st.parts();
    if st != St::NPi {
        let mut item = RosterItem::new(c.clone());
        item.subscription = sub;
        item.ask = ask;
        item.pending_in = pending_in;
        store.put_item(&o, &item).await.unwrap();
    }
    if pending_in {
        let xml = presence()
            .attr("xmlns", ns::CLIENT)
            .ty("subscribe")
            .attr("from", &c.to_string())
            .to(&o.to_string())
            .to_string();
        store.put_pending_request(&o, &c, &xml).await.unwrap();
    }
}

/// Sets up `st` between `user` and `contact` on both sides.
pub async fn set_state(server: &TestServer, user: &str, contact: &str, st: St) {
    write_side(server, user, contact, st).await;
    write_side(server, contact, user, st.mirror()).await;
}

/// `owner`'s state with `other`, read from storage.
pub async fn state_of(server: &TestServer, owner: &str, other: &str) -> St {
    let store = &server.server.env.storage.roster;
    let (o, c) = (bare(owner), bare(other));
    let item = store.get_item(&o, &c).await.unwrap();
    let pending = store
        .pending_requests(&o)
        .await
        .unwrap()
        .iter()
        .any(|(j, _)| *j == c);
    let (sub, ask) = item.map_or((Subscription::None, false), |i| (i.subscription, i.ask));
    St::from_parts(sub, ask, pending)
}

pub async fn item_of(server: &TestServer, owner: &str, other: &str) -> Option<RosterItem> {
    server
        .server
        .env
        .storage
        .roster
        .get_item(&bare(owner), &bare(other))
        .await
        .unwrap()
}

pub fn text_of(el: &Element, name: &str) -> Option<String> {
    el.get_child(name, ns::CLIENT).map(|c| c.text())
}
