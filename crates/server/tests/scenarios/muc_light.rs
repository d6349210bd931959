//! MUC Light (MongooseIM's protocol, `reference/xeps/proto-muc-light.xml`)
//! over real sockets: one scenario per operation (the spec's section in
//! each test's comments) and its error cases.

use starling_testkit::muc::{body, room_on};
use starling_testkit::stanza::{self, msg, presence, query};
use starling_testkit::starling_xml::Element;
use starling_testkit::{error_condition, eventually, ns, Client, TestServer};
use std::time::Duration;

const CREATE: &str = "urn:xmpp:muclight:0#create";
const DESTROY: &str = "urn:xmpp:muclight:0#destroy";
const CONFIG: &str = "urn:xmpp:muclight:0#configuration";
const AFF: &str = "urn:xmpp:muclight:0#affiliations";
const INFO: &str = "urn:xmpp:muclight:0#info";
const BLOCKING: &str = "urn:xmpp:muclight:0#blocking";
const SERVICE: &str = "muclight.localhost";
const MAM: &str = "urn:xmpp:mam:2";

fn room(name: &str) -> String {
    room_on(name, SERVICE)
}

async fn server() -> TestServer {
    server_with(|_| {}).await
}

async fn server_with(
    f: impl FnOnce(&mut starling_server::modules::muc::light::MucLightConfig),
) -> TestServer {
    TestServer::start_with(|c| {
        let l = c.modules.get_mut::<starling_server::modules::MucLight>();
        l.enabled = true;
        f(l);
    })
    .await
}

/// Creates accounts (as `TestServer::login` would) without logging in.
async fn accounts(server: &TestServer, users: &[&str]) {
    for u in users {
        server.create_user(u, &format!("pw-{u}")).await;
    }
}

/// (jid, affiliation) of each `<user/>` under `el`.
fn users(el: &Element) -> Vec<(String, String)> {
    el.children()
        .filter(|c| c.name() == "user")
        .map(|c| (c.text(), c.attr("affiliation").unwrap_or("").to_owned()))
        .collect()
}

fn child_text(el: &Element, name: &str, ns: &str) -> Option<String> {
    el.get_child(name, ns).map(|c| c.text())
}

/// Creates `name` owned by `c` with `members`; returns the iq result.
async fn create(c: &mut Client, name: &str, roomname: &str, members: &[&str]) -> Reply {
    let occ: String = members
        .iter()
        .map(|m| format!("<user affiliation='member'>{m}@localhost</user>"))
        .collect();
    let id = format!("create-{name}");
    let payload = query(
        CREATE,
        &format!("<configuration><roomname>{roomname}</roomname></configuration><occupants>{occ}</occupants>"),
    );
    request(c, &stanza::iq_set(&room(name), &id, &payload), &id).await
}

/// The next affiliations notification from `room`.
async fn aff_note(c: &mut Client, room: &str) -> Element {
    let m = c
        .recv_until(|e| e.name() == "message" && e.attr("from") == Some(room))
        .await;
    assert_eq!(m.attr("type"), Some("groupchat"), "{m}");
    m
}

async fn iq_set(c: &mut Client, to: &str, id: &str, payload: &str) -> Reply {
    request(c, &stanza::iq_set(to, id, payload), id).await
}

/// An iq's reply and what arrived before it (the notifications MUC Light
/// sends before answering).
struct Reply {
    el: Element,
    before: Vec<Element>,
}

impl std::ops::Deref for Reply {
    type Target = Element;
    fn deref(&self) -> &Element {
        &self.el
    }
}

impl std::fmt::Display for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.el.fmt(f)
    }
}

impl Reply {
    /// The notification from `room` that arrived before the reply.
    fn note(&self, room: &str) -> Element {
        self.before
            .iter()
            .find(|e| e.name() == "message" && e.attr("from") == Some(room))
            .cloned()
            .unwrap_or_else(|| panic!("no notification from {room} before {}", self.el))
    }
}

async fn request(c: &mut Client, xml: &str, id: &str) -> Reply {
    c.send(xml).await;
    let mut before = Vec::new();
    loop {
        let el = c.recv().await;
        if el.name() == "iq" && el.attr("id") == Some(id) {
            return Reply { el, before };
        }
        before.push(el);
    }
}

async fn iq_get(c: &mut Client, to: &str, id: &str, payload: &str) -> Element {
    c.iq(&stanza::iq_get(to, id, payload), id).await
}

/// The rooms of the service `c` is in (disco#items): (jid, name, version).
async fn my_rooms(c: &mut Client) -> Vec<(String, String, String)> {
    let r = iq_get(
        c,
        SERVICE,
        "items",
        "<query xmlns='http://jabber.org/protocol/disco#items'/>",
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    r.get_child("query", ns::DISCO_ITEMS)
        .unwrap()
        .children()
        .filter(|i| i.name() == "item")
        .map(|i| {
            (
                i.attr("jid").unwrap_or("").to_owned(),
                i.attr("name").unwrap_or("").to_owned(),
                i.attr("version").unwrap_or("").to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_service_is_discovered_and_rooms_are_created_with_their_members() {
    let server = server().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let mut carol = server.login("carol").await;
    // "Discovering the Service": listed by the server, identity and feature.
    let items = iq_get(
        &mut alice,
        "localhost",
        "srv",
        "<query xmlns='http://jabber.org/protocol/disco#items'/>",
    )
    .await;
    assert!(
        items
            .get_child("query", ns::DISCO_ITEMS)
            .unwrap()
            .children()
            .any(|i| i.attr("jid") == Some(SERVICE)),
        "{items}"
    );
    let features = alice.disco_features(SERVICE).await;
    assert!(
        features.contains(&"urn:xmpp:muclight:0".to_owned()),
        "{features:?}"
    );
    assert!(features.contains(&BLOCKING.to_owned()), "{features:?}");
    // "Creating a new room": every new occupant gets only their own
    // affiliation and the version, no prev-version, before the result.
    let r = create(&mut alice, "coven", "A Dark Cave", &["bob", "carol"]).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let mut version = String::new();
    let notes = [
        r.note(&room("coven")),
        aff_note(&mut bob, &room("coven")).await,
        aff_note(&mut carol, &room("coven")).await,
    ];
    for (m, me, aff) in notes
        .into_iter()
        .zip([
            ("alice@localhost", "owner"),
            ("bob@localhost", "member"),
            ("carol@localhost", "member"),
        ])
        .map(|(m, (me, aff))| (m, me, aff))
    {
        assert_eq!(m.attr("id"), Some("create-coven"), "{m}");
        let x = m.get_child("x", AFF).unwrap_or_else(|| panic!("{m}"));
        assert_eq!(users(x), vec![(me.to_owned(), aff.to_owned())], "{m}");
        assert!(x.get_child("prev-version", AFF).is_none(), "{m}");
        version = child_text(x, "version", AFF).unwrap();
        assert!(m.get_child("body", ns::CLIENT).is_some(), "{m}");
    }
    // "Discovering Occupied Rooms": name and version.
    assert_eq!(
        my_rooms(&mut bob).await,
        vec![(room("coven"), "A Dark Cave".to_owned(), version.clone())]
    );
    let mut dave = server.login("dave").await;
    assert!(my_rooms(&mut dave).await.is_empty());
    // "Room already exists": conflict, for members and others alike.
    for c in [&mut alice, &mut dave] {
        let e = create(c, "coven", "Again", &[]).await;
        assert_eq!(error_condition(&e).as_deref(), Some("conflict"), "{e}");
    }
    // "Requesting a new room with a unique name": to the service's JID;
    // the result and the notification come from the new room, same id.
    let r = iq_set(
        &mut dave,
        SERVICE,
        "createrandom",
        &query(
            CREATE,
            "<configuration><roomname>Random Cave</roomname></configuration>",
        ),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let new_room = r.attr("from").unwrap().to_owned();
    assert!(new_room.ends_with(&format!("@{SERVICE}")), "{r}");
    let rooms = my_rooms(&mut dave).await;
    assert_eq!(rooms.len(), 1);
    assert_eq!(rooms[0].0, new_room);
    assert_eq!(rooms[0].1, "Random Cave");
    // Creation rules: no 'none', no creator in the list, one owner.
    for (id, occ) in [
        ("c1", "<user affiliation='none'>bob@localhost</user>"),
        ("c2", "<user affiliation='member'>dave@localhost</user>"),
        ("c3", "<user affiliation='owner'>bob@localhost</user><user affiliation='owner'>carol@localhost</user>"),
        ("c4", "<user affiliation='member'>bob@localhost</user><user affiliation='member'>bob@localhost</user>"),
    ] {
        let e = iq_set(
            &mut dave,
            &room(id),
            id,
            &query(CREATE, &format!("<occupants>{occ}</occupants>")),
        )
        .await;
        assert_eq!(error_condition(&e).as_deref(), Some("bad-request"), "{id}: {e}");
    }
    // Choosing an owner makes the creator "just" a member.
    let e = iq_set(
        &mut dave,
        &room("c5"),
        "c5",
        "<query xmlns='urn:xmpp:muclight:0#create'><occupants><user affiliation='owner'>bob@localhost</user></occupants></query>",
    )
    .await;
    assert_eq!(e.attr("type"), Some("result"), "{e}");
    let info = iq_get(&mut dave, &room("c5"), "i5", &query(AFF, "")).await;
    let mut u = users(info.get_child("query", AFF).unwrap());
    u.sort();
    assert_eq!(
        u,
        vec![
            ("bob@localhost".to_owned(), "owner".to_owned()),
            ("dave@localhost".to_owned(), "member".to_owned())
        ]
    );
    // Members must be accounts of this server.
    let e = create(&mut dave, "c6", "x", &["nobody"]).await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("item-not-found"),
        "{e}"
    );
    let e = iq_set(
        &mut dave,
        &room("c7"),
        "c7",
        "<query xmlns='urn:xmpp:muclight:0#create'><occupants><user affiliation='member'>x@elsewhere.example</user></occupants></query>",
    )
    .await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("not-acceptable"),
        "{e}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_reach_every_members_account_and_the_room_archive() {
    let server = server().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let mut bob2 = server.login("bob").await;
    accounts(&server, &["carol"]).await;
    let r = create(&mut alice, "chat", "Chat", &["bob", "carol"]).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    r.note(&room("chat"));
    for c in [&mut bob, &mut bob2] {
        aff_note(c, &room("chat")).await;
    }
    // "Sending a message to a room": every member's account, the sender
    // too, from room/sender-bare-jid, with the room's stanza id.
    alice
        .send(
            &msg(&room("chat"))
                .groupchat()
                .id("m1")
                .body("Harpier cries")
                .child(&format!(
                    "<stanza-id xmlns='urn:xmpp:sid:0' by='{}' id='forged'/>",
                    room("chat")
                ))
                .to_string(),
        )
        .await;
    let mut ids = Vec::new();
    for c in [&mut alice, &mut bob, &mut bob2] {
        let m = c.recv_message().await;
        assert_eq!(
            m.attr("from"),
            Some(format!("{}/alice@localhost", room("chat")).as_str()),
            "{m}"
        );
        assert_eq!(m.attr("type"), Some("groupchat"), "{m}");
        assert_eq!(m.attr("id"), Some("m1"), "{m}");
        assert_eq!(body(&m), "Harpier cries");
        let sids: Vec<&Element> = m.children().filter(|c| c.name() == "stanza-id").collect();
        assert_eq!(sids.len(), 1, "the forged stanza id is gone: {m}");
        assert_ne!(sids[0].attr("id"), Some("forged"));
        ids.push(sids[0].attr("id").unwrap().to_owned());
    }
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
    // Carol was offline: the room's archive (members only) has it, with
    // the creation notification before it ("XEP-0313 Message Archive
    // Management": from the room, no 'to', version and no prev-version).
    let mut carol = server.login("carol").await;
    // Nothing from the room's past (groupchat is not stored offline): the
    // room answers after all it handled, and the session runs its offline
    // timer before reading the ping.
    carol.expect_nothing_via(&room("chat")).await;
    carol
        .send(&stanza::iq_set(
            &room("chat"),
            "mam",
            &format!("<query xmlns='{MAM}' queryid='q1'/>"),
        ))
        .await;
    let mut got = Vec::new();
    loop {
        let el = carol.recv().await;
        if el.name() == "iq" {
            assert_eq!(el.attr("type"), Some("result"), "{el}");
            break;
        }
        let m = el
            .get_child("result", MAM)
            .and_then(|r| r.get_child("forwarded", "urn:xmpp:forward:0"))
            .and_then(|f| f.get_child("message", ns::CLIENT))
            .unwrap_or_else(|| panic!("{el}"))
            .clone();
        got.push(m);
    }
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].attr("from"), Some(room("chat").as_str()));
    assert!(got[0].attr("to").is_none());
    let x = got[0].get_child("x", AFF).unwrap();
    assert_eq!(users(x).len(), 3, "creation lists all initial occupants");
    assert!(x.get_child("prev-version", AFF).is_none());
    assert_eq!(
        got[1].attr("from"),
        Some(format!("{}/alice@localhost", room("chat")).as_str())
    );
    assert_eq!(body(&got[1]), "Harpier cries");
    // "General Error Cases": a non-member's message, iq and archive query
    // get item-not-found; a chat message gets bad-request; presence is
    // ignored.
    let mut dave = server.login("dave").await;
    dave.send(
        &msg(&room("chat"))
            .groupchat()
            .id("u1")
            .body("let me in")
            .to_string(),
    )
    .await;
    let e = dave.recv_message().await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("item-not-found"),
        "{e}"
    );
    for (id, payload) in [("u2", query(CONFIG, "")), ("u3", query(MAM, ""))] {
        let t = if id == "u3" { "set" } else { "get" };
        let e = dave
            .iq(
                &stanza::iq(t, id)
                    .to(&room("chat"))
                    .child(&payload)
                    .to_string(),
                id,
            )
            .await;
        assert_eq!(
            error_condition(&e).as_deref(),
            Some("item-not-found"),
            "{e}"
        );
    }
    // bob2's available presence; the room's copies were received above.
    bob.barrier_via(&room("chat")).await;
    bob.send(&msg(&room("chat")).chat().id("bad2").body("x").to_string())
        .await;
    let e = bob.recv_message().await;
    assert_eq!(error_condition(&e).as_deref(), Some("bad-request"), "{e}");
    bob.send(&presence().to(&format!("{}/bob", room("chat"))).to_string())
        .await;
    // The room ignored the presence before it answered this ping.
    bob.expect_nothing_via(&room("chat")).await;
    alice.barrier_via(&room("chat")).await;
    alice.expect_nothing_via(&room("chat")).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn room_information_is_versioned() {
    let server = server().await;
    let mut alice = server.login("alice").await;
    accounts(&server, &["bob"]).await;
    let r = create(&mut alice, "info", "A Dark Cave", &["bob"]).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    alice.barrier_via(&room("info")).await;
    // "Getting the room configuration": no version → everything.
    let r = iq_get(
        &mut alice,
        &room("info"),
        "g1",
        &query(CONFIG, "<version/>"),
    )
    .await;
    let q = r
        .get_child("query", CONFIG)
        .unwrap_or_else(|| panic!("{r}"));
    let v = child_text(q, "version", CONFIG).unwrap();
    assert_eq!(
        child_text(q, "roomname", CONFIG).as_deref(),
        Some("A Dark Cave")
    );
    assert_eq!(
        child_text(q, "subject", CONFIG).as_deref(),
        Some(""),
        "schema default"
    );
    // "Matching versions": an empty result.
    for ns in [CONFIG, AFF, INFO] {
        let r = iq_get(
            &mut alice,
            &room("info"),
            "g2",
            &query(ns, &format!("<version>{v}</version>")),
        )
        .await;
        assert_eq!(r.attr("type"), Some("result"), "{r}");
        assert!(r.children().next().is_none(), "{r}");
    }
    // "Requesting a user list" and "Requesting full room information".
    let r = iq_get(
        &mut alice,
        &room("info"),
        "g3",
        &query(AFF, "<version>old</version>"),
    )
    .await;
    let mut u = users(r.get_child("query", AFF).unwrap());
    u.sort();
    assert_eq!(
        u,
        vec![
            ("alice@localhost".to_owned(), "owner".to_owned()),
            ("bob@localhost".to_owned(), "member".to_owned())
        ]
    );
    let r = iq_get(&mut alice, &room("info"), "g4", &query(INFO, "")).await;
    let q = r.get_child("query", INFO).unwrap_or_else(|| panic!("{r}"));
    assert_eq!(child_text(q, "version", INFO).as_deref(), Some(v.as_str()));
    assert_eq!(
        child_text(
            q.get_child("configuration", INFO).unwrap(),
            "roomname",
            INFO
        )
        .as_deref(),
        Some("A Dark Cave")
    );
    assert_eq!(users(q.get_child("occupants", INFO).unwrap()).len(), 2);
    // The room's disco#info, for members.
    let f = alice.disco_features(&room("info")).await;
    assert!(
        f.contains(&"urn:xmpp:muclight:0".to_owned()) && f.contains(&MAM.to_owned()),
        "{f:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn configuration_changes_are_announced_with_both_versions() {
    let server = server().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    create(&mut alice, "conf", "A Dark Cave", &["bob"]).await;
    // The creation notifications (routed before alice's result): bob's
    // must not be taken for the configuration's below.
    alice.barrier_via(&room("conf")).await;
    bob.barrier_via(&room("conf")).await;
    let v0 = my_rooms(&mut bob).await[0].2.clone();
    // "Setting room configuration": a delta; every member is told.
    let r = iq_set(
        &mut alice,
        &room("conf"),
        "conf2",
        &query(CONFIG, "<roomname>A Darker Cave</roomname>"),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    for m in [
        r.note(&room("conf")),
        aff_note(&mut bob, &room("conf")).await,
    ] {
        let x = m.get_child("x", CONFIG).unwrap_or_else(|| panic!("{m}"));
        assert_eq!(
            child_text(x, "prev-version", CONFIG).as_deref(),
            Some(v0.as_str())
        );
        assert_ne!(
            child_text(x, "version", CONFIG).as_deref(),
            Some(v0.as_str())
        );
        assert_eq!(
            child_text(x, "roomname", CONFIG).as_deref(),
            Some("A Darker Cave")
        );
        assert!(
            x.get_child("subject", CONFIG).is_none(),
            "only what changed: {m}"
        );
    }
    // "Changing room subject" is a configuration change too.
    let r = iq_set(
        &mut alice,
        &room("conf"),
        "subj",
        &query(CONFIG, "<subject>To be or not to be?</subject>"),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let m = aff_note(&mut bob, &room("conf")).await;
    assert_eq!(
        child_text(m.get_child("x", CONFIG).unwrap(), "subject", CONFIG).as_deref(),
        Some("To be or not to be?")
    );
    // "Request sender has insufficient privileges": a member may not.
    let e = iq_set(
        &mut bob,
        &room("conf"),
        "c3",
        &query(CONFIG, "<roomname>Mine</roomname>"),
    )
    .await;
    assert_eq!(error_condition(&e).as_deref(), Some("not-allowed"), "{e}");
    // Unknown fields and the reserved names; oversize values.
    for (id, body, cond) in [
        ("c4", "<colour>red</colour>".to_owned(), "bad-request"),
        (
            "c5",
            "<roomname>x</roomname><roomname>y</roomname>".to_owned(),
            "bad-request",
        ),
        (
            "c6",
            format!("<subject>{}</subject>", "x".repeat(1025)),
            "not-acceptable",
        ),
        (
            "c7",
            "<roomname>'); DROP TABLE muc_rooms; --</roomname>".to_owned(),
            "",
        ),
    ] {
        let r = iq_set(&mut alice, &room("conf"), id, &query(CONFIG, &body)).await;
        if cond.is_empty() {
            assert_eq!(r.attr("type"), Some("result"), "{r}");
        } else {
            assert_eq!(error_condition(&r).as_deref(), Some(cond), "{id}: {r}");
        }
    }
    assert_eq!(
        my_rooms(&mut bob).await[0].1,
        "'); DROP TABLE muc_rooms; --"
    );
    // With all_can_configure, members may.
    server.stop().await;
    let server = server_with(|l| l.all_can_configure = true).await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    create(&mut alice, "open", "Open", &["bob"]).await;
    bob.barrier_via(&room("open")).await;
    let r = iq_set(
        &mut bob,
        &room("open"),
        "c8",
        &query(CONFIG, "<roomname>Bob's</roomname>"),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_occupant_list_changes_by_the_rules() {
    let server = server().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let mut carol = server.login("carol").await;
    let mut dave = server.login("dave").await;
    create(&mut alice, "crew", "Crew", &["bob", "carol"]).await;
    for c in [&mut alice, &mut bob, &mut carol] {
        c.barrier_via(&room("crew")).await;
    }
    let v0 = my_rooms(&mut bob).await[0].2.clone();
    // "Changing the occupant list": add dave, remove carol in one request.
    let r = iq_set(
        &mut alice,
        &room("crew"),
        "member1",
        &query(AFF, "<user affiliation='member'>dave@localhost</user><user affiliation='none'>carol@localhost</user>"),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    // Staying members: the full change list with both versions.
    for m in [
        r.note(&room("crew")),
        aff_note(&mut bob, &room("crew")).await,
    ] {
        assert_eq!(m.attr("id"), Some("member1"));
        let x = m.get_child("x", AFF).unwrap();
        assert_eq!(
            child_text(x, "prev-version", AFF).as_deref(),
            Some(v0.as_str())
        );
        let mut u = users(x);
        u.sort();
        assert_eq!(
            u,
            vec![
                ("carol@localhost".to_owned(), "none".to_owned()),
                ("dave@localhost".to_owned(), "member".to_owned())
            ]
        );
    }
    // The newcomer: only themselves, no prev-version.
    let m = aff_note(&mut dave, &room("crew")).await;
    let x = m.get_child("x", AFF).unwrap();
    assert_eq!(
        users(x),
        vec![("dave@localhost".to_owned(), "member".to_owned())]
    );
    assert!(x.get_child("prev-version", AFF).is_none() && x.get_child("version", AFF).is_some());
    // The removed: only themselves with none, no versions.
    let m = aff_note(&mut carol, &room("crew")).await;
    let x = m.get_child("x", AFF).unwrap();
    assert_eq!(
        users(x),
        vec![("carol@localhost".to_owned(), "none".to_owned())]
    );
    assert!(x.get_child("version", AFF).is_none());
    assert!(my_rooms(&mut carol).await.is_empty());
    // Carol is out: her messages are refused, she gets no more messages.
    bob.send(&msg(&room("crew")).groupchat().body("hi").to_string())
        .await;
    assert_eq!(body(&dave.recv_message().await), "hi");
    // The room handled bob's message (dave has it) before carol's ping,
    // which it answers as to a stranger.
    carol.expect_nothing_via(&room("crew")).await;
    for c in [&mut alice, &mut bob] {
        c.barrier_via(&room("crew")).await;
    }
    // Rule 10: meaningless changes; rule 11: members cannot remove others
    // or make owners, nor add (all_can_invite is off).
    for (id, who, body, cond) in [
        (
            "e1",
            "alice",
            "<user affiliation='member'>bob@localhost</user>",
            "bad-request",
        ),
        (
            "e2",
            "alice",
            "<user affiliation='none'>zed@localhost</user>",
            "bad-request",
        ),
        (
            "e3",
            "bob",
            "<user affiliation='none'>dave@localhost</user>",
            "not-allowed",
        ),
        (
            "e4",
            "bob",
            "<user affiliation='owner'>bob@localhost</user>",
            "not-allowed",
        ),
        (
            "e5",
            "bob",
            "<user affiliation='member'>carol@localhost</user>",
            "not-allowed",
        ),
        (
            "e6",
            "alice",
            "<item role='participant'>bob@localhost</item>",
            "bad-request",
        ),
    ] {
        let c = if who == "alice" { &mut alice } else { &mut bob };
        let e = iq_set(c, &room("crew"), id, &query(AFF, body)).await;
        assert_eq!(error_condition(&e).as_deref(), Some(cond), "{id}: {e}");
    }
    // Rule 6: a new owner makes the old one a member.
    let r = iq_set(
        &mut alice,
        &room("crew"),
        "own",
        &query(AFF, "<user affiliation='owner'>bob@localhost</user>"),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let m = aff_note(&mut dave, &room("crew")).await;
    let mut u = users(m.get_child("x", AFF).unwrap());
    u.sort();
    assert_eq!(
        u,
        vec![
            ("alice@localhost".to_owned(), "member".to_owned()),
            ("bob@localhost".to_owned(), "owner".to_owned())
        ]
    );
    // Rule 2 and 5: the owner leaves; the server picks a new owner.
    for c in [&mut alice, &mut bob, &mut dave] {
        c.barrier_via(&room("crew")).await;
    }
    let r = iq_set(
        &mut bob,
        &room("crew"),
        "leave1",
        &query(AFF, "<user affiliation='none'>bob@localhost</user>"),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let m = aff_note(&mut dave, &room("crew")).await;
    let mut u = users(m.get_child("x", AFF).unwrap());
    u.sort();
    assert_eq!(
        u,
        vec![
            ("alice@localhost".to_owned(), "owner".to_owned()),
            ("bob@localhost".to_owned(), "none".to_owned())
        ]
    );
    // The room is too full for another member.
    server.stop().await;
    let server = server_with(|l| l.max_occupants = 2).await;
    let mut alice = server.login("alice").await;
    accounts(&server, &["bob", "carol"]).await;
    create(&mut alice, "small", "Small", &["bob"]).await;
    let e = iq_set(
        &mut alice,
        &room("small"),
        "full",
        &query(AFF, "<user affiliation='member'>carol@localhost</user>"),
    )
    .await;
    assert_eq!(error_condition(&e).as_deref(), Some("not-allowed"), "{e}");
    let e = create(&mut alice, "big", "Big", &["bob", "carol"]).await;
    assert_eq!(error_condition(&e).as_deref(), Some("not-allowed"), "{e}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn users_block_rooms_and_inviters() {
    let server = server().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let mut carol = server.login("carol").await;
    create(&mut alice, "one", "One", &[]).await;
    create(&mut bob, "two", "Two", &[]).await;
    alice.barrier_via(&room("one")).await;
    bob.barrier_via(&room("two")).await;
    // "Blocking a room", "Blocking a user", "Requesting a blocking list".
    let r = iq_set(
        &mut carol,
        SERVICE,
        "block1",
        &query(
            BLOCKING,
            &format!(
                "<room action='deny'>{}</room><user action='deny'>bob@localhost</user>",
                room("one")
            ),
        ),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let list = iq_get(&mut carol, SERVICE, "getblock1", &query(BLOCKING, "")).await;
    let items: Vec<(String, String, String)> = list
        .get_child("query", BLOCKING)
        .unwrap()
        .children()
        .map(|c| {
            (
                c.name().to_owned(),
                c.attr("action").unwrap_or("").to_owned(),
                c.text(),
            )
        })
        .collect();
    assert_eq!(
        items,
        vec![
            ("room".to_owned(), "deny".to_owned(), room("one")),
            (
                "user".to_owned(),
                "deny".to_owned(),
                "bob@localhost".to_owned()
            )
        ]
    );
    // "Service denies adding blocking user": skipped silently.
    let mut dave = server.login("dave").await;
    let r = iq_set(
        &mut alice,
        &room("one"),
        "blocked1",
        &query(AFF, "<user affiliation='member'>carol@localhost</user><user affiliation='member'>dave@localhost</user>"),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let m = r.note(&room("one"));
    assert_eq!(
        users(m.get_child("x", AFF).unwrap()),
        vec![("dave@localhost".to_owned(), "member".to_owned())]
    );
    aff_note(&mut dave, &room("one")).await;
    let r = iq_set(
        &mut bob,
        &room("two"),
        "blocked2",
        &query(AFF, "<user affiliation='member'>carol@localhost</user>"),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    // Creating a room with her in it skips her too.
    let r = create(&mut bob, "three", "Three", &["carol"]).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    // None of the three rooms told carol anything: each answers her ping
    // (as a stranger's) after the change it made.
    for name in ["one", "two", "three"] {
        carol.expect_nothing_via(&room(name)).await;
    }
    assert!(my_rooms(&mut carol).await.is_empty());
    // "Unblocking": allow (unblocking what is not blocked is no error).
    let r = iq_set(
        &mut carol,
        SERVICE,
        "unblock1",
        &query(
            BLOCKING,
            &format!(
                "<room action='allow'>{}</room><user action='allow'>zed@localhost</user>",
                room("one")
            ),
        ),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let r = iq_set(
        &mut alice,
        &room("one"),
        "add2",
        &query(AFF, "<user affiliation='member'>carol@localhost</user>"),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    aff_note(&mut carol, &room("one")).await;
    // Bad items.
    for (id, body) in [
        ("b1", "<room action='maybe'>x@y</room>"),
        ("b2", "<thing action='deny'>x@y</thing>"),
        ("b3", "<user action='deny'>not a jid</user>"),
        ("b4", ""),
    ] {
        let e = iq_set(&mut carol, SERVICE, id, &query(BLOCKING, body)).await;
        assert_eq!(
            error_condition(&e).as_deref(),
            Some("bad-request"),
            "{id}: {e}"
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rooms_are_destroyed_by_the_owner_or_when_empty() {
    let server = server().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    create(&mut alice, "doomed", "Doomed", &["bob"]).await;
    alice.barrier_via(&room("doomed")).await;
    bob.barrier_via(&room("doomed")).await;
    bob.send(
        &msg(&room("doomed"))
            .groupchat()
            .body("last words")
            .to_string(),
    )
    .await;
    // Bob's ping first: the room handled his message before either answer.
    bob.barrier_via(&room("doomed")).await;
    alice.barrier_via(&room("doomed")).await;
    // Only the owner may destroy.
    let e = iq_set(&mut bob, &room("doomed"), "d0", &query(DESTROY, "")).await;
    assert_eq!(error_condition(&e).as_deref(), Some("not-allowed"), "{e}");
    // "Destroying a room": each member's own 'none' and the destroy
    // marker, no version.
    let r = iq_set(&mut alice, &room("doomed"), "destroy1", &query(DESTROY, "")).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    for (m, me) in [
        (r.note(&room("doomed")), "alice@localhost"),
        (aff_note(&mut bob, &room("doomed")).await, "bob@localhost"),
    ] {
        let x = m.get_child("x", AFF).unwrap();
        assert_eq!(users(x), vec![(me.to_owned(), "none".to_owned())]);
        assert!(x.get_child("version", AFF).is_none());
        assert!(m.get_child("x", DESTROY).is_some(), "{m}");
    }
    let e = iq_get(&mut alice, &room("doomed"), "d2", &query(CONFIG, "")).await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("item-not-found"),
        "{e}"
    );
    assert!(my_rooms(&mut bob).await.is_empty());
    // A new room of the same name starts empty: no earlier archive.
    create(&mut alice, "doomed", "Again", &[]).await;
    alice.barrier_via(&room("doomed")).await;
    alice
        .send(&stanza::iq_set(&room("doomed"), "mam", &query(MAM, "")))
        .await;
    let mut n = 0;
    loop {
        let el = alice.recv().await;
        if el.name() == "iq" {
            break;
        }
        n += 1;
        assert!(!el.to_string().contains("last words"), "{el}");
    }
    assert_eq!(n, 1, "only the new room's creation");
    // "If the room becomes empty, it is destroyed."
    let r = iq_set(
        &mut alice,
        &room("doomed"),
        "bye",
        &query(AFF, "<user affiliation='none'>alice@localhost</user>"),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let e = create(&mut bob, "doomed", "Bob's now", &[]).await;
    assert_eq!(
        e.attr("type"),
        Some("result"),
        "the name is free again: {e}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn groups_are_in_the_inbox_and_rooms_outlive_their_task() {
    let server = server_with(|l| l.idle_unload_secs = 1).await;
    let mut alice = server.login("alice").await;
    accounts(&server, &["bob"]).await;
    create(&mut alice, "team", "Team", &["bob"]).await;
    alice.barrier_via(&room("team")).await;
    for text in ["one", "two"] {
        alice
            .send(&msg(&room("team")).groupchat().body(text).to_string())
            .await;
    }
    // The room handled both messages (and queued their inbox rows, which
    // an inbox query flushes first).
    alice.barrier_via(&room("team")).await;
    // Bob was never online: his inbox lists the room, unread 3 (being
    // added, and two messages), the last one shown.
    let mut bob = server.login("bob").await;
    let inbox = bob.inbox_entries().await;
    assert_eq!(inbox, vec![(room("team"), 3, "two".to_owned())]);
    // Alice wrote them: nothing unread for her.
    let inbox = alice.inbox_entries().await;
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0].1, 0);
    // The room unloads when idle and comes back from storage unchanged.
    let v = my_rooms(&mut bob).await[0].2.clone();
    // Its task ends after idle_unload_secs (1 s) without stanzas: the
    // service's gauge of loaded rooms says when.
    eventually(
        "the idle room is unloaded",
        Duration::from_secs(10),
        async || {
            server
                .server
                .env
                .metrics
                .encode()
                .lines()
                .any(|l| l.ends_with("muc_light_rooms_live 0"))
                .then_some(())
        },
    )
    .await;
    let r = iq_get(
        &mut bob,
        &room("team"),
        "v",
        &query(CONFIG, &format!("<version>{v}</version>")),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    assert!(
        r.children().next().is_none(),
        "same version after reloading: {r}"
    );
    bob.send(&msg(&room("team")).groupchat().body("three").to_string())
        .await;
    let m = alice.recv_message().await;
    assert_eq!(body(&m), "three");
    server.stop().await;
}

/// An account deleted in-band (XEP-0077 §3.2) leaves its rooms as if it
/// had set its own affiliation to `none` (what MongooseIM's MUC Light does
/// on user removal): the others are told, an owner gets an heir, a room it
/// was alone in is destroyed, and an account created later with the same
/// name is in none of them.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_account_leaves_its_rooms() {
    let server = server().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let mut carol = server.login("carol").await;
    let r = create(&mut alice, "club", "Club", &["bob", "carol"]).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let r = create(&mut alice, "solo", "Solo", &[]).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    for c in [&mut alice, &mut bob, &mut carol] {
        c.barrier_via(&room("club")).await;
    }
    let r = alice
        .iq(
            "<iq type='set' id='rm'><query xmlns='jabber:iq:register'><remove/></query></iq>",
            "rm",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let mut heirs = 0;
    for c in [&mut bob, &mut carol] {
        let m = aff_note(c, &room("club")).await;
        let x = m.get_child("x", AFF).unwrap_or_else(|| panic!("{m}"));
        let changes = users(x);
        assert!(
            changes.contains(&("alice@localhost".to_owned(), "none".to_owned())),
            "{m}"
        );
        heirs += changes.iter().filter(|(_, a)| a == "owner").count();
        assert!(x.get_child("prev-version", AFF).is_some(), "{m}");
    }
    assert_eq!(heirs, 2, "both are told of the one new owner");
    let list = iq_get(&mut bob, &room("club"), "aff", &query(AFF, "")).await;
    let q = list
        .get_child("query", AFF)
        .unwrap_or_else(|| panic!("{list}"));
    let now = users(q);
    assert_eq!(now.len(), 2, "{list}");
    assert!(now.iter().all(|(j, _)| j != "alice@localhost"), "{list}");
    assert_eq!(now.iter().filter(|(_, a)| a == "owner").count(), 1);
    // The room she was alone in is gone: its name is free.
    let r = create(&mut carol, "solo", "Carol's", &[]).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    // A new account with the same name is a stranger to the club.
    let mut again = server.login("alice").await;
    assert!(my_rooms(&mut again).await.is_empty());
    let e = iq_get(&mut again, &room("club"), "cfg", &query(CONFIG, "")).await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("item-not-found"),
        "{e}"
    );
    server.stop().await;
}
