//! Multi-User Chat (XEP-0045) for scenario tests: its namespaces, room
//! JIDs, entering a room (the whole entering sequence, up to the subject
//! that ends it, §7.2.15), an owner's instant room (§10.1.2) and
//! configuration (§10.2), admin items (§9), and reading what rooms send:
//! the `muc#user` status codes and item of a presence, a message's body.
//!
//! ```no_run
//! # use starling_testkit::{muc, TestServer};
//! # async fn scenario() {
//! let server = TestServer::start().await;
//! let mut alice = server.login("alice").await;
//! let r = muc::open_room(&mut alice, "lobby", "Alice").await;
//! let mut bob = server.login("bob").await;
//! let got = muc::join(&mut bob, &r, "Bob").await;
//! let own = got.iter().rfind(|e| e.name() == "presence").unwrap();
//! assert!(muc::statuses(own).contains(&"110".to_owned()));
//! assert_eq!(muc::item(own).attr("role"), Some("participant"));
//! # }
//! ```
//!
//! The namespaces are spelled out here rather than taken from the server,
//! so that tests check the server against the specification's names.

use crate::stanza::presence;
use crate::{error_condition, ns, Client};
use starling_xml::Element;

/// XEP-0045's base namespace (the `<x/>` of an entering presence).
pub const MUC: &str = "http://jabber.org/protocol/muc";
/// What rooms add to presence and messages (status codes, items, invites).
pub const MUC_USER: &str = "http://jabber.org/protocol/muc#user";
/// Moderators' and admins' requests (roles, affiliation lists), §8–§9.
pub const MUC_ADMIN: &str = "http://jabber.org/protocol/muc#admin";
/// Owners' requests (configuration, destruction), §10.
pub const MUC_OWNER: &str = "http://jabber.org/protocol/muc#owner";
/// The MUC service of the test domain ([`crate::DOMAIN`]) with the
/// module's default subdomain.
pub const SERVICE: &str = "conference.localhost";

/// The JID of room `name` on [`SERVICE`].
pub fn room(name: &str) -> String {
    room_on(name, SERVICE)
}

/// The JID of room `name` on `service` (another MUC service, or a MUC
/// Light one).
pub fn room_on(name: &str, service: &str) -> String {
    format!("{name}@{service}")
}

/// The status codes (§15.6) of `el`'s `muc#user` `<x/>`, in order; empty
/// without one.
pub fn statuses(el: &Element) -> Vec<String> {
    el.get_child("x", MUC_USER)
        .map(|x| {
            x.children()
                .filter(|c| c.name() == "status")
                .filter_map(|c| c.attr("code").map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The `<item/>` of `el`'s `muc#user` `<x/>` (affiliation, role, nick,
/// real JID, reason, actor); panics without one.
pub fn item(el: &Element) -> &Element {
    el.get_child("x", MUC_USER)
        .and_then(|x| x.get_child("item", MUC_USER))
        .unwrap_or_else(|| panic!("no muc#user item: {el}"))
}

/// The text of a message's `<body/>`; empty without one.
pub fn body(m: &Element) -> String {
    m.get_child("body", ns::CLIENT)
        .map(|b| b.text())
        .unwrap_or_default()
}

/// Sends a join presence (`extra` inside `<x xmlns=muc>`, e.g. a
/// `<password/>` or `<history/>`) and returns every stanza up to and
/// including the subject message, which ends the entering sequence
/// (§7.2.15). Panics on an error presence.
pub async fn join_with(c: &mut Client, room: &str, nick: &str, extra: &str) -> Vec<Element> {
    c.send(&enter(&format!("{room}/{nick}"), extra)).await;
    let mut got = Vec::new();
    loop {
        let el = c.recv().await;
        assert_ne!(el.attr("type"), Some("error"), "entering failed: {el}");
        let done = el.name() == "message" && el.has_child("subject", ns::CLIENT);
        got.push(el);
        if done {
            return got;
        }
    }
}

/// An entering presence (§7.2.2) to `to` (an occupant JID, room/nick)
/// with `extra` inside its `<x xmlns=muc>` (a `<password/>`, a
/// `<history/>`; empty: none), for tests that read the room's answer
/// themselves, e.g. to a nick it must refuse. `to` is escaped
/// ([`crate::stanza`]).
pub fn enter(to: &str, extra: &str) -> String {
    let x = if extra.is_empty() {
        format!("<x xmlns='{MUC}'/>")
    } else {
        format!("<x xmlns='{MUC}'>{extra}</x>")
    };
    presence().to(to).child(&x).to_string()
}

/// [`join_with`] with nothing inside `<x/>`.
pub async fn join(c: &mut Client, room: &str, nick: &str) -> Vec<Element> {
    join_with(c, room, nick, "").await
}

/// A join that must fail: the condition of the error presence, which must
/// come from the occupant JID asked for (stanzas before it are skipped).
pub async fn join_error(c: &mut Client, room: &str, nick: &str, extra: &str) -> String {
    c.send(&enter(&format!("{room}/{nick}"), extra)).await;
    let el = c
        .recv_until(|e| e.name() == "presence" && e.attr("type") == Some("error"))
        .await;
    assert_eq!(
        el.attr("from"),
        Some(format!("{room}/{nick}").as_str()),
        "{el}"
    );
    error_condition(&el).unwrap_or_default()
}

/// §10.1.2: the owner accepts the default configuration (an instant
/// room); panics unless the room answers with a result.
pub async fn instant(c: &mut Client, room: &str) {
    let r = c
        .iq(
            &format!("<iq to='{room}' type='set' id='inst'><query xmlns='{MUC_OWNER}'><x xmlns='jabber:x:data' type='submit'/></query></iq>"),
            "inst",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
}

/// §10.2: submits the room configuration form with `fields` (`(var,
/// value)`, besides its FORM_TYPE); returns the room's answer.
pub async fn configure(c: &mut Client, room: &str, fields: &[(&str, &str)]) -> Element {
    let mut f = String::new();
    for (var, v) in fields {
        f.push_str(&format!("<field var='{var}'><value>{v}</value></field>"));
    }
    c.iq(
        &format!("<iq to='{room}' type='set' id='cfg'><query xmlns='{MUC_OWNER}'><x xmlns='jabber:x:data' type='submit'><field var='FORM_TYPE'><value>http://jabber.org/protocol/muc#roomconfig</value></field>{f}</x></query></iq>"),
        "cfg",
    )
    .await
}

/// Creates room `name` on [`SERVICE`] owned by `c` (entering as `nick`,
/// an instant room) and returns its JID once the room has answered a ping
/// ([`Client::barrier_via`]): whatever it sent for the entering and the
/// configuration has arrived and is discarded.
pub async fn open_room(c: &mut Client, name: &str, nick: &str) -> String {
    let r = room(name);
    join(c, &r, nick).await;
    instant(c, &r).await;
    c.barrier_via(&r).await;
    r
}

/// A `muc#admin` set with `item` (one or more `<item/>`s: roles §8,
/// affiliations §9–§10); returns the room's answer.
pub async fn admin_set(c: &mut Client, room: &str, item: &str) -> Element {
    c.iq(
        &format!(
            "<iq to='{room}' type='set' id='adm'><query xmlns='{MUC_ADMIN}'>{item}</query></iq>"
        ),
        "adm",
    )
    .await
}
