//! Multi-User Chat (XEP-0045) over real sockets, one scenario per use case
//! (section numbers in each test), with XEP-0359 stanza ids, XEP-0410
//! self-ping and XEP-0421 occupant ids. Includes the cases the Smack
//! integration tests hold ejabberd and Prosody to: a locked room is not
//! joinable, a full room says so, the default role in a moderated room is
//! visitor, occupants see each other's presence before their own, occupant
//! disco answers correctly.

use starling_testkit::muc::{
    admin_set, body, configure, enter, instant, item, join, join_error, join_with, open_room, room,
    statuses, MUC, MUC_ADMIN, MUC_OWNER, MUC_USER, SERVICE,
};
use starling_testkit::stanza::{iq, iq_get, iq_set, msg, presence, query};
use starling_testkit::starling_xml::Element;
use starling_testkit::{error_condition, ns, poll_for, Client, TestServer};
use std::time::Duration;

/// The `jid`s of `to`'s disco#items (XEP-0030 §4).
async fn item_jids(c: &mut Client, to: &str) -> Vec<String> {
    let id = format!("items-{}", starling_proto::random_id(6));
    let r = c
        .iq(&iq_get(to, &id, &query(ns::DISCO_ITEMS, "")), &id)
        .await;
    r.get_child("query", ns::DISCO_ITEMS)
        .unwrap_or_else(|| panic!("no disco#items result: {r}"))
        .children()
        .filter_map(|i| i.attr("jid").map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn creating_a_room_locks_it_until_configured_and_presence_comes_in_order() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let r = room("lobby");

    // §10.1.1: the creator is owner and moderator, told 110 and 201.
    let got = join(&mut alice, &r, "Alice").await;
    let own = got.iter().find(|e| e.name() == "presence").unwrap();
    assert_eq!(own.attr("from"), Some(format!("{r}/Alice").as_str()));
    let codes = statuses(own);
    assert!(
        codes.contains(&"110".into()) && codes.contains(&"201".into()),
        "{own}"
    );
    assert_eq!(item(own).attr("affiliation"), Some("owner"));
    assert_eq!(item(own).attr("role"), Some("moderator"));
    assert!(
        own.has_child("occupant-id", "urn:xmpp:occupant-id:0"),
        "XEP-0421: {own}"
    );

    // §7.2.10: a locked room is not joinable.
    assert_eq!(join_error(&mut bob, &r, "Bob", "").await, "item-not-found");

    // §10.1.2: an instant room.
    instant(&mut alice, &r).await;
    let got = join(&mut bob, &r, "Bob").await;
    let presences: Vec<&Element> = got.iter().filter(|e| e.name() == "presence").collect();
    // §7.2.3: the others' presence first, the own one last with 110.
    assert_eq!(presences.len(), 2, "{got:?}");
    assert_eq!(
        presences[0].attr("from"),
        Some(format!("{r}/Alice").as_str())
    );
    assert!(statuses(presences[0]).is_empty());
    assert_eq!(presences[1].attr("from"), Some(format!("{r}/Bob").as_str()));
    assert!(statuses(presences[1]).contains(&"110".into()));
    assert_eq!(item(presences[1]).attr("role"), Some("participant"));
    assert_eq!(item(presences[1]).attr("affiliation"), Some("none"));
    // Semi-anonymous by default: bob does not see alice's real JID…
    assert!(item(presences[0]).attr("jid").is_none(), "{}", presences[0]);
    // …alice (a moderator) sees bob's.
    let p = alice
        .recv_until(|e| e.name() == "presence" && e.attr("from") == Some(&format!("{r}/Bob")))
        .await;
    assert_eq!(item(&p).attr("jid"), Some(bob.jid.as_str()));
    assert!(statuses(&p).is_empty());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_subject_and_history_on_entering() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = open_room(&mut alice, "talk", "Alice").await;

    // §8.1: the moderator sets the subject; everyone gets it.
    alice
        .send(
            &msg(&r)
                .groupchat()
                .id("s1")
                .child("<subject>Plans</subject>")
                .to_string(),
        )
        .await;
    let s = alice.recv_message().await;
    assert_eq!(s.get_child("subject", ns::CLIENT).unwrap().text(), "Plans");
    // §7.4: messages are reflected to the sender too, with a stanza-id by
    // the room and the sender's id kept.
    for i in 1..=3 {
        alice
            .send(
                &msg(&r)
                    .groupchat()
                    .id(&format!("m{i}"))
                    .body(&format!("hello {i}"))
                    .child("<occupant-id xmlns='urn:xmpp:occupant-id:0' id='forged'/>")
                    .to_string(),
            )
            .await;
        let m = alice.recv_message().await;
        assert_eq!(m.attr("from"), Some(format!("{r}/Alice").as_str()));
        assert_eq!(m.attr("id"), Some(format!("m{i}").as_str()));
        assert_eq!(body(&m), format!("hello {i}"));
        let sid = m
            .get_child("stanza-id", "urn:xmpp:sid:0")
            .expect("stanza-id");
        assert_eq!(sid.attr("by"), Some(r.as_str()));
        let oids: Vec<_> = m
            .children()
            .filter(|c| c.is("occupant-id", "urn:xmpp:occupant-id:0"))
            .collect();
        assert_eq!(oids.len(), 1, "client occupant-id replaced: {m}");
        assert_ne!(oids[0].attr("id"), Some("forged"));
    }

    // §7.2.13, §7.2.14: history (2 asked) with delays, then the subject.
    let mut bob = server.login("bob").await;
    let got = join_with(&mut bob, &r, "Bob", "<history maxstanzas='2'/>").await;
    let msgs: Vec<&Element> = got.iter().filter(|e| e.name() == "message").collect();
    assert_eq!(msgs.len(), 3, "{got:?}");
    assert_eq!(body(msgs[0]), "hello 2");
    assert_eq!(body(msgs[1]), "hello 3");
    let delay = msgs[0].get_child("delay", "urn:xmpp:delay").expect("delay");
    assert_eq!(delay.attr("from"), Some(r.as_str()));
    assert_eq!(
        msgs[2].get_child("subject", ns::CLIENT).unwrap().text(),
        "Plans"
    );
    assert_eq!(msgs[2].attr("from"), Some(format!("{r}/Alice").as_str()));
    // maxstanzas='0': no history at all.
    let mut carol = server.login("carol").await;
    let got = join_with(&mut carol, &r, "Carol", "<history maxstanzas='0'/>").await;
    assert_eq!(got.iter().filter(|e| e.name() == "message").count(), 1);

    // §7.4: non-occupants cannot send; §7.3: participants may not change
    // the subject by default.
    let mut dave = server.login("dave").await;
    dave.send(&msg(&r).groupchat().id("x").body("hi").to_string())
        .await;
    let e = dave.recv_message().await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("not-acceptable"),
        "{e}"
    );
    // Carol's presence came while her entering was handled, before the room
    // took this ping.
    bob.barrier_via(&r).await;
    bob.send(
        &msg(&r)
            .groupchat()
            .id("s2")
            .child("<subject>mine</subject>")
            .to_string(),
    )
    .await;
    let e = bob.recv_message().await;
    assert_eq!(error_condition(&e).as_deref(), Some("forbidden"), "{e}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn private_messages_nick_changes_and_leaving() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = open_room(&mut alice, "pm", "Alice").await;
    let mut bob = server.login("bob").await;
    join(&mut bob, &r, "Bob").await;
    alice.barrier_via(&r).await;

    // §7.5: a private message arrives from the sender's occupant JID.
    bob.send(
        &msg(&format!("{r}/Alice"))
            .chat()
            .id("p1")
            .body("psst")
            .to_string(),
    )
    .await;
    let m = alice.recv_message().await;
    assert_eq!(m.attr("from"), Some(format!("{r}/Bob").as_str()));
    assert_eq!(body(&m), "psst");
    assert!(m.has_child("x", MUC_USER));
    // To a nick nobody has: item-not-found.
    bob.send(
        &msg(&format!("{r}/Nobody"))
            .chat()
            .id("p2")
            .body("?")
            .to_string(),
    )
    .await;
    let e = bob.recv_message().await;
    assert_eq!(error_condition(&e).as_deref(), Some("item-not-found"));
    // groupchat to an occupant: bad-request.
    bob.send(
        &msg(&format!("{r}/Alice"))
            .groupchat()
            .id("p3")
            .body("?")
            .to_string(),
    )
    .await;
    let e = bob.recv_message().await;
    assert_eq!(error_condition(&e).as_deref(), Some("bad-request"));

    // §7.6: nick change: unavailable with 303 and the new nick, then the
    // new presence.
    bob.send(&presence().to(&format!("{r}/Robert")).to_string())
        .await;
    let un = alice.recv_until(|e| e.name() == "presence").await;
    assert_eq!(un.attr("type"), Some("unavailable"));
    assert_eq!(un.attr("from"), Some(format!("{r}/Bob").as_str()));
    assert_eq!(item(&un).attr("nick"), Some("Robert"));
    assert!(statuses(&un).contains(&"303".into()));
    let av = alice.recv_until(|e| e.name() == "presence").await;
    assert_eq!(av.attr("from"), Some(format!("{r}/Robert").as_str()));
    assert_eq!(av.attr("type"), None);
    let own = bob.recv_until(|e| e.name() == "presence").await;
    assert!(statuses(&own).contains(&"303".into()) && statuses(&own).contains(&"110".into()));
    bob.recv_until(|e| e.name() == "presence").await;
    // The old nick is free, taking alice's is a conflict (§7.6.3).
    bob.send(&presence().to(&format!("{r}/Alice")).to_string())
        .await;
    let e = bob.recv_until(|e| e.name() == "presence").await;
    assert_eq!(error_condition(&e).as_deref(), Some("conflict"), "{e}");

    // §7.14: leaving; a closed connection leaves too (directed presence).
    bob.send(
        &presence()
            .to(&format!("{r}/Robert"))
            .ty("unavailable")
            .status("bye")
            .to_string(),
    )
    .await;
    let un = alice.recv_until(|e| e.name() == "presence").await;
    assert_eq!(un.attr("type"), Some("unavailable"));
    assert_eq!(item(&un).attr("role"), Some("none"));
    let own = bob.recv_until(|e| e.name() == "presence").await;
    assert!(statuses(&own).contains(&"110".into()));
    let mut carol = server.login("carol").await;
    join(&mut carol, &r, "Carol").await;
    // Carol's available presence (routed before she got the subject) must
    // not be taken for her leaving.
    alice.barrier_via(&r).await;
    carol.close().await;
    let un = alice.recv_until(|e| e.name() == "presence").await;
    assert_eq!(un.attr("from"), Some(format!("{r}/Carol").as_str()));
    assert_eq!(un.attr("type"), Some("unavailable"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn entering_errors_password_members_ban_nick_full_and_bad_nick() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;

    // §7.2.5: password.
    let r = room("secret");
    join(&mut alice, &r, "Alice").await;
    let c = configure(
        &mut alice,
        &r,
        &[
            ("muc#roomconfig_passwordprotectedroom", "1"),
            ("muc#roomconfig_roomsecret", "open sesame"),
        ],
    )
    .await;
    assert_eq!(c.attr("type"), Some("result"), "{c}");
    assert_eq!(join_error(&mut bob, &r, "Bob", "").await, "not-authorized");
    assert_eq!(
        join_error(&mut bob, &r, "Bob", "<password>wrong</password>").await,
        "not-authorized"
    );
    join_with(&mut bob, &r, "Bob", "<password>open sesame</password>").await;

    // §7.2.8: nick conflict.
    let mut carol = server.login("carol").await;
    assert_eq!(
        join_error(&mut carol, &r, "Bob", "<password>open sesame</password>").await,
        "conflict"
    );
    // A nickname that is not a valid resourcepart, or too long.
    let long = "n".repeat(65);
    assert_eq!(join_error(&mut carol, &r, &long, "").await, "jid-malformed");

    // §7.2.6: members-only.
    let r2 = room("club");
    join(&mut alice, &r2, "Alice").await;
    configure(&mut alice, &r2, &[("muc#roomconfig_membersonly", "1")]).await;
    assert_eq!(
        join_error(&mut carol, &r2, "Carol", "").await,
        "registration-required"
    );
    let a = admin_set(
        &mut alice,
        &r2,
        "<item affiliation='member' jid='carol@localhost'/>",
    )
    .await;
    assert_eq!(a.attr("type"), Some("result"), "{a}");
    join(&mut carol, &r2, "Carol").await;

    // §7.2.9: full (owners still enter).
    let r3 = room("tiny");
    join(&mut alice, &r3, "Alice").await;
    configure(&mut alice, &r3, &[("muc#roomconfig_maxusers", "2")]).await;
    join(&mut bob, &r3, "Bob").await;
    assert_eq!(
        join_error(&mut carol, &r3, "Carol", "").await,
        "service-unavailable"
    );
    // A maxusers above the service limit is refused.
    let c = configure(&mut alice, &r3, &[("muc#roomconfig_maxusers", "999999")]).await;
    assert_eq!(
        error_condition(&c).as_deref(),
        Some("not-acceptable"),
        "{c}"
    );
    let c = configure(
        &mut alice,
        &r3,
        &[("muc#roomconfig_moderatedroom", "perhaps")],
    )
    .await;
    assert_eq!(error_condition(&c).as_deref(), Some("bad-request"), "{c}");

    // §7.2.7 / §9.1: banned.
    alice.barrier_via(&r3).await;
    let a = admin_set(
        &mut alice,
        &r3,
        "<item affiliation='outcast' jid='bob@localhost'><reason>spam</reason></item>",
    )
    .await;
    assert_eq!(a.attr("type"), Some("result"), "{a}");
    let gone = bob
        .recv_until(|e| e.name() == "presence" && e.attr("from") == Some(&format!("{r3}/Bob")))
        .await;
    assert_eq!(gone.attr("type"), Some("unavailable"));
    assert!(statuses(&gone).contains(&"301".into()), "{gone}");
    assert_eq!(item(&gone).attr("affiliation"), Some("outcast"));
    assert_eq!(
        item(&gone)
            .get_child("reason", MUC_USER)
            .map(|r| r.text())
            .as_deref(),
        Some("spam")
    );
    assert_eq!(join_error(&mut bob, &r3, "Bob", "").await, "forbidden");
    // §9.2: the ban list.
    let l = alice
        .iq(
            &iq_get(
                &r3,
                "bl",
                &query(MUC_ADMIN, "<item affiliation='outcast'/>"),
            ),
            "bl",
        )
        .await;
    let items: Vec<_> = l
        .get_child("query", MUC_ADMIN)
        .unwrap()
        .children()
        .collect();
    assert_eq!(items.len(), 1, "{l}");
    assert_eq!(items[0].attr("jid"), Some("bob@localhost"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn moderated_rooms_visitors_voice_and_kick() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = room("stage");
    join(&mut alice, &r, "Alice").await;
    configure(&mut alice, &r, &[("muc#roomconfig_moderatedroom", "1")]).await;
    // Whatever the configuration change told the occupants comes before the
    // room's answer to this ping, not in place of the voice request below.
    alice.barrier_via(&r).await;
    let mut bob = server.login("bob").await;
    let got = join(&mut bob, &r, "Bob").await;
    // §5.1.2: the default role in a moderated room is visitor.
    let own = got.iter().rfind(|e| e.name() == "presence").unwrap();
    assert_eq!(item(own).attr("role"), Some("visitor"), "{own}");
    // §7.4: visitors may not speak.
    bob.send(&msg(&r).groupchat().id("v1").body("hi").to_string())
        .await;
    let e = bob.recv_message().await;
    assert_eq!(error_condition(&e).as_deref(), Some("forbidden"), "{e}");
    // §8.5: the voice list is for moderators.
    let l = bob
        .iq(
            &iq_get(&r, "vl", &query(MUC_ADMIN, "<item role='participant'/>")),
            "vl",
        )
        .await;
    assert_eq!(error_condition(&l).as_deref(), Some("forbidden"));
    // §7.13: a voice request reaches the moderator, §8.6 approving it
    // gives voice.
    bob.send(&msg(&r).id("vr").child("<x xmlns='jabber:x:data' type='submit'><field var='FORM_TYPE'><value>http://jabber.org/protocol/muc#request</value></field><field var='muc#role'><value>participant</value></field></x>").to_string())
        .await;
    let req = alice.recv_message().await;
    assert!(req.has_child("x", "jabber:x:data"), "{req}");
    alice
        .send(&msg(&r).id("ok").child("<x xmlns='jabber:x:data' type='submit'><field var='FORM_TYPE'><value>http://jabber.org/protocol/muc#request</value></field><field var='muc#roomnick'><value>Bob</value></field><field var='muc#request_allow'><value>true</value></field></x>").to_string())
        .await;
    let p = bob.recv_until(|e| e.name() == "presence").await;
    assert_eq!(item(&p).attr("role"), Some("participant"), "{p}");
    bob.send(&msg(&r).groupchat().id("v2").body("thanks").to_string())
        .await;
    assert_eq!(body(&bob.recv_message().await), "thanks");
    // §8.4: revoking voice, §8.3 granting it with the admin iq.
    let a = admin_set(&mut alice, &r, "<item nick='Bob' role='visitor'/>").await;
    assert_eq!(a.attr("type"), Some("result"), "{a}");
    let p = bob.recv_until(|e| e.name() == "presence").await;
    assert_eq!(item(&p).attr("role"), Some("visitor"));
    // A visitor cannot kick; a moderator cannot be kicked by a participant.
    let k = admin_set(&mut bob, &r, "<item nick='Alice' role='none'/>").await;
    assert_eq!(error_condition(&k).as_deref(), Some("forbidden"), "{k}");
    // §8.2: kick, 307 with the actor and reason.
    let k = admin_set(
        &mut alice,
        &r,
        "<item nick='Bob' role='none'><reason>noise</reason></item>",
    )
    .await;
    assert_eq!(k.attr("type"), Some("result"), "{k}");
    let gone = bob
        .recv_until(|e| e.name() == "presence" && e.attr("type") == Some("unavailable"))
        .await;
    let codes = statuses(&gone);
    assert!(
        codes.contains(&"307".into()) && codes.contains(&"110".into()),
        "{gone}"
    );
    assert_eq!(
        item(&gone)
            .get_child("actor", MUC_USER)
            .and_then(|a| a.attr("nick")),
        Some("Alice")
    );
    // Kicking someone not there: item-not-found; an owner cannot be kicked
    // by an admin (§8.2: not-allowed).
    let k = admin_set(&mut alice, &r, "<item nick='Bob' role='none'/>").await;
    assert_eq!(error_condition(&k).as_deref(), Some("item-not-found"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn affiliations_admins_owners_and_the_last_owner() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = open_room(&mut alice, "org", "Alice").await;
    let mut bob = server.login("bob").await;
    join(&mut bob, &r, "Bob").await;
    alice.barrier_via(&r).await;
    // §9.6 via an affiliation: admin makes bob a moderator at once.
    let a = admin_set(
        &mut alice,
        &r,
        "<item affiliation='admin' jid='bob@localhost'/>",
    )
    .await;
    assert_eq!(a.attr("type"), Some("result"), "{a}");
    let p = bob.recv_until(|e| e.name() == "presence").await;
    assert_eq!(item(&p).attr("affiliation"), Some("admin"));
    assert_eq!(item(&p).attr("role"), Some("moderator"));
    // An admin may not touch an owner (§9.1, §10.4).
    let a = admin_set(
        &mut bob,
        &r,
        "<item affiliation='outcast' jid='alice@localhost'/>",
    )
    .await;
    assert_eq!(error_condition(&a).as_deref(), Some("not-allowed"), "{a}");
    let a = admin_set(
        &mut bob,
        &r,
        "<item affiliation='owner' jid='bob@localhost'/>",
    )
    .await;
    assert_eq!(error_condition(&a).as_deref(), Some("not-allowed"), "{a}");
    // Only owners see the owner list and the configuration form (§10.5, §10.2).
    let f = bob.iq(&iq_get(&r, "cf", &query(MUC_OWNER, "")), "cf").await;
    assert_eq!(error_condition(&f).as_deref(), Some("forbidden"));
    let f = alice
        .iq(&iq_get(&r, "cf", &query(MUC_OWNER, "")), "cf")
        .await;
    let form = f
        .get_child("query", MUC_OWNER)
        .and_then(|q| q.get_child("x", "jabber:x:data"))
        .expect("form");
    let vars: Vec<&str> = form.children().filter_map(|c| c.attr("var")).collect();
    for v in [
        "muc#roomconfig_roomname",
        "muc#roomconfig_persistentroom",
        "muc#roomconfig_membersonly",
        "muc#roomconfig_whois",
        "muc#roomconfig_roomowners",
    ] {
        assert!(vars.contains(&v), "{v} missing from {form}");
    }
    // §10.4: the last owner cannot step down.
    let a = admin_set(
        &mut alice,
        &r,
        "<item affiliation='member' jid='alice@localhost'/>",
    )
    .await;
    assert_eq!(error_condition(&a).as_deref(), Some("conflict"), "{a}");
    // §10.3: a second owner, then the first may leave the list.
    let a = admin_set(
        &mut alice,
        &r,
        "<item affiliation='owner' jid='bob@localhost'/>",
    )
    .await;
    assert_eq!(a.attr("type"), Some("result"));
    let a = admin_set(
        &mut alice,
        &r,
        "<item affiliation='member' jid='alice@localhost'/>",
    )
    .await;
    assert_eq!(a.attr("type"), Some("result"), "{a}");
    // §9.5: the member list.
    let l = bob
        .iq(
            &iq_get(&r, "ml", &query(MUC_ADMIN, "<item affiliation='member'/>")),
            "ml",
        )
        .await;
    let jids: Vec<_> = l
        .get_child("query", MUC_ADMIN)
        .unwrap()
        .children()
        .filter_map(|i| i.attr("jid"))
        .collect();
    assert_eq!(jids, ["alice@localhost"], "{l}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn destroying_a_room_with_an_alternate_venue() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = open_room(&mut alice, "old", "Alice").await;
    let mut bob = server.login("bob").await;
    join(&mut bob, &r, "Bob").await;
    let d = bob
        .iq(&iq_set(&r, "d", &query(MUC_OWNER, "<destroy/>")), "d")
        .await;
    assert_eq!(error_condition(&d).as_deref(), Some("forbidden"));
    // §10.9
    let d = alice
        .iq(
            &iq_set(
                &r,
                "d",
                &query(
                    MUC_OWNER,
                    &format!(
                        "<destroy jid='{}'><reason>moved</reason></destroy>",
                        room("new")
                    ),
                ),
            ),
            "d",
        )
        .await;
    assert_eq!(d.attr("type"), Some("result"), "{d}");
    let p = bob.recv_until(|e| e.name() == "presence").await;
    assert_eq!(p.attr("type"), Some("unavailable"));
    let destroy = p
        .get_child("x", MUC_USER)
        .and_then(|x| x.get_child("destroy", MUC_USER))
        .expect("destroy");
    assert_eq!(destroy.attr("jid"), Some(room("new").as_str()));
    assert_eq!(
        destroy
            .get_child("reason", MUC_USER)
            .map(|r| r.text())
            .as_deref(),
        Some("moved")
    );
    // The room is gone: disco answers item-not-found.
    let i = bob
        .iq(&iq_get(&r, "i", &query(ns::DISCO_INFO, "")), "i")
        .await;
    assert_eq!(
        error_condition(&i).as_deref(),
        Some("item-not-found"),
        "{i}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn discovery_of_the_service_rooms_and_occupants() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    // §6.1: the server lists the service.
    let items = alice
        .iq(
            &iq_get("localhost", "it", &query(ns::DISCO_ITEMS, "")),
            "it",
        )
        .await;
    assert!(items.to_string().contains(SERVICE), "{items}");
    // §6.2
    let f = alice.disco_features(SERVICE).await;
    assert!(f.contains(&MUC.to_owned()), "{f:?}");
    let r = open_room(&mut alice, "public", "Alice").await;
    let hidden = room("hidden");
    join(&mut alice, &hidden, "Alice").await;
    configure(&mut alice, &hidden, &[("muc#roomconfig_publicroom", "0")]).await;
    alice.barrier_via(&hidden).await;
    let jids = item_jids(&mut alice, SERVICE).await;
    assert_eq!(jids, [r.as_str()]);
    // §6.4: room features and the roominfo form.
    let f = alice.disco_features(&r).await;
    for v in [
        MUC,
        "muc_public",
        "muc_temporary",
        "muc_open",
        "muc_unmoderated",
        "muc_semianonymous",
        "muc_unsecured",
        "urn:xmpp:occupant-id:0",
        "http://jabber.org/protocol/muc#self-ping-optimization",
    ] {
        assert!(f.contains(&v.to_owned()), "{v} missing: {f:?}");
    }
    let f = alice.disco_features(&hidden).await;
    assert!(f.contains(&"muc_hidden".to_owned()));
    // §6.5: occupant disco from a non-occupant is bad-request.
    let mut bob = server.login("bob").await;
    let d = bob
        .iq(
            &iq_get(&format!("{r}/Alice"), "od", &query(ns::DISCO_INFO, "")),
            "od",
        )
        .await;
    assert_eq!(error_condition(&d).as_deref(), Some("bad-request"), "{d}");
    // From an occupant it reaches the occupant's client, whose answer
    // comes back from the occupant JID.
    join(&mut bob, &r, "Bob").await;
    alice.barrier_via(&r).await;
    bob.send(&iq_get(
        &format!("{r}/Alice"),
        "od2",
        &query(ns::DISCO_INFO, ""),
    ))
    .await;
    let q = alice.recv_until(|e| e.name() == "iq").await;
    assert_eq!(q.attr("from"), Some(format!("{r}/Bob").as_str()), "{q}");
    let id = q.attr("id").unwrap().to_owned();
    alice
        .send(
            &iq("result", &id)
                .to(&format!("{r}/Bob"))
                .child(&query(ns::DISCO_INFO, "<feature var='x-test'/>"))
                .to_string(),
        )
        .await;
    let a = bob.recv_until(|e| e.name() == "iq").await;
    assert_eq!(a.attr("id"), Some("od2"), "{a}");
    assert_eq!(a.attr("from"), Some(format!("{r}/Alice").as_str()));
    assert!(a.to_string().contains("x-test"));
    // XEP-0410: self-ping answered by the room; not joined: not-acceptable.
    let p = bob
        .iq(
            &iq_get(&format!("{r}/Bob"), "sp", "<ping xmlns='urn:xmpp:ping'/>"),
            "sp",
        )
        .await;
    assert_eq!(p.attr("type"), Some("result"), "{p}");
    let mut carol = server.login("carol").await;
    let p = carol
        .iq(
            &iq_get(&format!("{r}/Carol"), "sp", "<ping xmlns='urn:xmpp:ping'/>"),
            "sp",
        )
        .await;
    assert_eq!(
        error_condition(&p).as_deref(),
        Some("not-acceptable"),
        "{p}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn invitations_mediated_direct_and_declined() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = open_room(&mut alice, "party", "Alice").await;
    let mut bob = server.login("bob").await;
    // §7.8.2: mediated.
    alice
        .send(
            &msg(&r)
                .id("inv")
                .child(&format!("<x xmlns='{MUC_USER}'><invite to='bob@localhost'><reason>come</reason></invite></x>"))
                .to_string(),
        )
        .await;
    let m = bob.recv_message().await;
    assert_eq!(m.attr("from"), Some(r.as_str()));
    let inv = m
        .get_child("x", MUC_USER)
        .and_then(|x| x.get_child("invite", MUC_USER))
        .expect("invite");
    assert_eq!(inv.attr("from"), Some(alice.jid.as_str()));
    assert_eq!(
        inv.get_child("reason", MUC_USER)
            .map(|r| r.text())
            .as_deref(),
        Some("come")
    );
    // Declining reaches the inviter.
    bob.send(
        &msg(&r)
            .id("dec")
            .child(&format!("<x xmlns='{MUC_USER}'><decline to='alice@localhost'><reason>busy</reason></decline></x>"))
            .to_string(),
    )
        .await;
    let m = alice.recv_message().await;
    let d = m
        .get_child("x", MUC_USER)
        .and_then(|x| x.get_child("decline", MUC_USER))
        .expect("decline");
    assert_eq!(d.attr("from"), Some("bob@localhost"));
    // XEP-0249 direct invitations are client to client: they pass through.
    alice
        .send(
            &msg("bob@localhost")
                .id("di")
                .child(&format!("<x xmlns='jabber:x:conference' jid='{r}'/>"))
                .to_string(),
        )
        .await;
    let m = bob.recv_message().await;
    assert_eq!(
        m.get_child("x", "jabber:x:conference")
            .and_then(|x| x.attr("jid")),
        Some(r.as_str())
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn registering_a_nickname_reserves_it() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = open_room(&mut alice, "reg", "Alice").await;
    let mut bob = server.login("bob").await;
    // §7.10
    let f = bob
        .iq(
            &iq_get(&r, "rg", "<query xmlns='jabber:iq:register'/>"),
            "rg",
        )
        .await;
    assert!(f.to_string().contains("muc#register_roomnick"), "{f}");
    let s = bob
        .iq(&iq_set(&r, "rs", "<query xmlns='jabber:iq:register'><x xmlns='jabber:x:data' type='submit'><field var='FORM_TYPE'><value>http://jabber.org/protocol/muc#register</value></field><field var='muc#register_roomnick'><value>Bobby</value></field></x></query>"), "rs")
        .await;
    assert_eq!(s.attr("type"), Some("result"), "{s}");
    // §7.12: discovering the reserved nick.
    let d = bob
        .iq(
            &iq_get(
                &r,
                "rn",
                &format!("<query xmlns='{}' node='x-roomuser-item'/>", ns::DISCO_INFO),
            ),
            "rn",
        )
        .await;
    let id = d
        .get_child("query", ns::DISCO_INFO)
        .and_then(|q| q.get_child("identity", ns::DISCO_INFO))
        .expect("identity");
    assert_eq!(id.attr("name"), Some("Bobby"));
    // Nobody else may take it (§7.2.8).
    let mut carol = server.login("carol").await;
    assert_eq!(join_error(&mut carol, &r, "Bobby", "").await, "conflict");
    let got = join(&mut bob, &r, "Bobby").await;
    let own = got.iter().rfind(|e| e.name() == "presence").unwrap();
    assert_eq!(item(own).attr("affiliation"), Some("member"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn persistent_rooms_survive_a_restart_with_history_and_affiliations() {
    let dir = std::env::temp_dir().join(format!("starling-muc-{}", starling_proto::random_id(10)));
    let d = dir.clone();
    let server = TestServer::start_with(|c| c.server.data_dir = d).await;
    let mut alice = server.login("alice").await;
    let r = room("forever");
    join(&mut alice, &r, "Alice").await;
    let c = configure(
        &mut alice,
        &r,
        &[
            ("muc#roomconfig_persistentroom", "1"),
            ("muc#roomconfig_roomname", "Forever"),
            ("muc#roomconfig_membersonly", "1"),
        ],
    )
    .await;
    assert_eq!(c.attr("type"), Some("result"), "{c}");
    admin_set(
        &mut alice,
        &r,
        "<item affiliation='member' jid='bob@localhost'/>",
    )
    .await;
    alice
        .send(
            &msg(&r)
                .groupchat()
                .id("s")
                .child("<subject>Kept</subject>")
                .to_string(),
        )
        .await;
    for i in 1..=3 {
        alice
            .send(
                &msg(&r)
                    .groupchat()
                    .id(&format!("m{i}"))
                    .body(&format!("old {i}"))
                    .to_string(),
            )
            .await;
    }
    // The room handled the subject and the three messages.
    alice.barrier_via(&r).await;
    // The room outlives its last occupant.
    alice
        .send(
            &presence()
                .to(&format!("{r}/Alice"))
                .ty("unavailable")
                .to_string(),
        )
        .await;
    alice.barrier_via(&r).await;
    server.server.shutdown().await; // keeps the data directory

    let d = dir.clone();
    let server = TestServer::start_with(|c| c.server.data_dir = d).await;
    let mut bob = server.login("bob").await;
    let got = join(&mut bob, &r, "Bob").await;
    let msgs: Vec<&Element> = got.iter().filter(|e| e.name() == "message").collect();
    let bodies: Vec<String> = msgs
        .iter()
        .map(|m| body(m))
        .filter(|b| !b.is_empty())
        .collect();
    assert_eq!(bodies, ["old 1", "old 2", "old 3"], "{got:?}");
    assert_eq!(
        msgs.last()
            .unwrap()
            .get_child("subject", ns::CLIENT)
            .unwrap()
            .text(),
        "Kept"
    );
    let f = bob.disco_features(&r).await;
    assert!(
        f.contains(&"muc_persistent".to_owned()) && f.contains(&"muc_membersonly".to_owned()),
        "{f:?}"
    );
    let mut carol = server.login("carol").await;
    assert_eq!(
        join_error(&mut carol, &r, "Carol", "").await,
        "registration-required"
    );
    // Persistent public rooms are listed even when empty.
    let l = carol
        .iq(&iq_get(SERVICE, "rl", &query(ns::DISCO_ITEMS, "")), "rl")
        .await;
    assert!(l.to_string().contains("Forever"), "{l}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_into_one_room_leaves_other_rooms_alone() {
    let server = TestServer::start_with(|c| {
        c.modules
            .get_mut::<starling_server::modules::Muc>()
            .room_queue = 2;
    })
    .await;
    let mut alice = server.login("alice").await;
    let busy = open_room(&mut alice, "busy", "Alice").await;
    let mut bob = server.login("bob").await;
    let calm = open_room(&mut bob, "calm", "Bob").await;
    let mut burst = String::new();
    for i in 0..400 {
        burst.push_str(
            &msg(&busy)
                .groupchat()
                .id(&format!("f{i}"))
                .body(&i.to_string())
                .to_string(),
        );
    }
    let mut carol = server.login("carol").await;
    join(&mut carol, &busy, "Carol").await;
    alice.barrier_via(&busy).await;
    alice.send(&burst).await;
    // Leaving during the flood is never refused (no ghost occupant).
    carol
        .send(
            &presence()
                .to(&format!("{busy}/Carol"))
                .ty("unavailable")
                .to_string(),
        )
        .await;
    bob.send(&msg(&calm).groupchat().id("c").body("fine").to_string())
        .await;
    assert_eq!(body(&bob.recv_message().await), "fine");
    let mut delivered = 0;
    let mut refused = 0;
    while let Some(starling_testkit::Event::Element(e)) =
        alice.next_event_within(Duration::from_secs(2)).await
    {
        if e.name() != "message" {
            continue;
        }
        match e.attr("type") {
            Some("error") => {
                assert_eq!(
                    error_condition(&e).as_deref(),
                    Some("resource-constraint"),
                    "{e}"
                );
                refused += 1;
            }
            _ => delivered += 1,
        }
        if delivered + refused == 400 {
            break;
        }
    }
    assert_eq!(
        delivered + refused,
        400,
        "every message is delivered or refused"
    );
    assert!(refused > 0, "a queue of 2 refused nothing out of 400");
    // What is left (carol's leaving) is no message: none came twice.
    let rest = alice.barrier_via(&busy).await;
    assert!(
        rest.iter().all(|e| e.name() != "message"),
        "more than 400 answers: {rest:?}"
    );
    let occupants = item_jids(&mut alice, &busy).await;
    assert_eq!(occupants, [format!("{busy}/Alice")]);
    alice.expect_nothing_via(&busy).await;
    server.stop().await;
}

/// XEP-0313 queries of a room's archive (section numbers are XEP-0313's,
/// version 1.1.3).
mod room_archive {
    use super::*;
    use starling_testkit::mam::{form, max, query, MAM};

    const SID: &str = "urn:xmpp:sid:0";

    fn real_jid(m: &Element) -> Option<String> {
        m.get_child("x", MUC_USER)
            .and_then(|x| x.get_child("item", MUC_USER))
            .and_then(|i| i.attr("jid"))
            .map(str::to_owned)
    }

    fn bare(c: &Client) -> String {
        c.jid.split('/').next().unwrap().to_owned()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_rooms_archive_pages_over_mam_and_hides_real_jids() {
        let server = TestServer::start().await;
        let mut alice = server.login("alice").await;
        let r = open_room(&mut alice, "archived", "Alice").await;
        // §7: advertised on the room while it is logged (the default).
        let f = alice.disco_features(&r).await;
        assert!(
            f.contains(&MAM.to_owned()) && f.contains(&format!("{MAM}#extended")),
            "{f:?}"
        );
        for i in 1..=5 {
            // §8.4: a sender's own muc#user <x/> is not believed.
            let forged = if i == 3 {
                format!("<x xmlns='{MUC_USER}'><item jid='mallory@localhost'/></x>")
            } else {
                String::new()
            };
            alice
                .send(
                    &msg(&r)
                        .groupchat()
                        .id(&format!("m{i}"))
                        .body(&format!("m{i}"))
                        .child(&forged)
                        .to_string(),
                )
                .await;
        }
        alice.barrier_via(&r).await;

        // §6.1.2: anyone may read an open room's archive, even without
        // entering it; §4.3.2: pages with RSM <max/> and <after/>.
        let mut bob = server.login("bob").await;
        let p1 = query(&mut bob, &r, "p1", &max(2, "")).await;
        assert_eq!(p1.error(), None, "{}", p1.fin);
        assert_eq!(p1.bodies(), ["m1", "m2"]);
        assert!(!p1.complete(), "{}", p1.fin);
        assert_eq!(p1.rsm("first").as_deref(), Some(p1.items[0].0.as_str()));
        assert_eq!(p1.rsm("last").as_deref(), Some(p1.items[1].0.as_str()));
        let (id, m) = &p1.items[0];
        // §6.1.2: from the occupant JID, no 'to'; §3.5: its stanza id.
        assert_eq!(m.attr("from"), Some(format!("{r}/Alice").as_str()), "{m}");
        assert_eq!(m.attr("to"), None, "{m}");
        let sid = m.get_child("stanza-id", SID).unwrap();
        assert_eq!(
            (sid.attr("by"), sid.attr("id")),
            (Some(r.as_str()), Some(id.as_str()))
        );
        let last = p1.rsm("last").unwrap();
        let p2 = query(
            &mut bob,
            &r,
            "p2",
            &max(2, &format!("<after>{last}</after>")),
        )
        .await;
        assert_eq!(p2.bodies(), ["m3", "m4"]);
        assert!(!p2.complete());
        let last = p2.rsm("last").unwrap();
        let p3 = query(
            &mut bob,
            &r,
            "p3",
            &max(2, &format!("<after>{last}</after>")),
        )
        .await;
        assert_eq!(p3.bodies(), ["m5"]);
        assert!(p3.complete(), "{}", p3.fin);
        // §4.3.3: the last page; RSM max=0: the count.
        let tail = query(&mut bob, &r, "tail", &max(2, "<before/>")).await;
        assert_eq!(tail.bodies(), ["m4", "m5"]);
        let n = query(&mut bob, &r, "n", &max(0, "")).await;
        assert_eq!(n.rsm("count").as_deref(), Some("5"), "{}", n.fin);

        // Semi-anonymous room (the default): bob sees no real JID, not
        // even the forged one; the owner sees the sender's.
        let all = query(&mut bob, &r, "all", "").await;
        assert_eq!(all.items.len(), 5);
        assert!(
            all.items.iter().all(|(_, m)| real_jid(m).is_none()),
            "{:?}",
            all.items
        );
        let owner_view = query(&mut alice, &r, "own", "").await;
        for (_, m) in &owner_view.items {
            assert_eq!(real_jid(m), Some(bare(&alice)), "{m}");
            assert_eq!(
                m.children().filter(|c| c.is("x", MUC_USER)).count(),
                1,
                "{m}"
            );
        }

        // §4.1.1: 'with' is the sender's real JID, only for those who may
        // know it (or their own); an occupant JID is not supported.
        let alice_bare = bare(&alice);
        let w = query(&mut alice, &r, "w1", &form(&[("with", &alice_bare)])).await;
        assert_eq!(w.items.len(), 5);
        let w = query(&mut bob, &r, "w2", &form(&[("with", &alice_bare)])).await;
        assert_eq!(w.error().as_deref(), Some("forbidden"), "{}", w.fin);
        let bob_bare = bare(&bob);
        let w = query(&mut bob, &r, "w3", &form(&[("with", &bob_bare)])).await;
        assert!(w.items.is_empty() && w.complete(), "{}", w.fin);
        let w = query(
            &mut bob,
            &r,
            "w4",
            &form(&[("with", &format!("{r}/Alice"))]),
        )
        .await;
        assert_eq!(w.error().as_deref(), Some("feature-not-implemented"));

        // §4.1.3 and §4.3.4 (#extended): ids and flipped pages.
        let ids = all
            .items
            .iter()
            .map(|(id, _)| id.clone())
            .collect::<Vec<_>>();
        let one = query(&mut bob, &r, "one", &form(&[("ids", &ids[1])])).await;
        assert_eq!(one.bodies(), ["m2"]);
        let flipped = query(
            &mut bob,
            &r,
            "flip",
            &format!("{}<flip-page/>", max(2, "<before/>")),
        )
        .await;
        assert_eq!(flipped.bodies(), ["m5", "m4"]);
        let unknown = query(&mut bob, &r, "unk", &form(&[("after-id", "0000000000000")])).await;
        assert_eq!(unknown.error().as_deref(), Some("item-not-found"));

        // §5: metadata; §4.1.5: the form.
        let md = bob
            .iq(
                &iq_get(&r, "md", &format!("<metadata xmlns='{MAM}'/>")),
                "md",
            )
            .await;
        let md = md
            .get_child("metadata", MAM)
            .unwrap_or_else(|| panic!("{md}"));
        assert_eq!(
            md.get_child("start", MAM).unwrap().attr("id"),
            Some(ids[0].as_str())
        );
        assert_eq!(
            md.get_child("end", MAM).unwrap().attr("id"),
            Some(ids[4].as_str())
        );
        let fq = bob
            .iq(
                &iq_get(&r, "fq", &starling_testkit::stanza::query(MAM, "")),
                "fq",
            )
            .await;
        assert!(
            fq.get_child("query", MAM)
                .and_then(|q| q.get_child("x", "jabber:x:data"))
                .is_some(),
            "{fq}"
        );

        // Logging off: no longer advertised.
        let c = configure(&mut alice, &r, &[("muc#roomconfig_enablelogging", "0")]).await;
        assert_eq!(c.attr("type"), Some("result"), "{c}");
        alice.barrier_via(&r).await;
        let f = bob.disco_features(&r).await;
        assert!(!f.iter().any(|v| v.starts_with(MAM)), "{f:?}");
        server.stop().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn only_those_who_may_enter_read_the_archive() {
        let server = TestServer::start().await;
        let mut alice = server.login("alice").await;
        let mut bob = server.login("bob").await;
        let mut carol = server.login("carol").await;
        let r = open_room(&mut alice, "inner", "Alice").await;
        let c = configure(&mut alice, &r, &[("muc#roomconfig_membersonly", "1")]).await;
        assert_eq!(c.attr("type"), Some("result"), "{c}");
        admin_set(
            &mut alice,
            &r,
            "<item affiliation='member' jid='bob@localhost'/>",
        )
        .await;
        alice
            .send(&msg(&r).groupchat().id("x").body("members only").to_string())
            .await;
        // The room handled the message before carol's query.
        alice.barrier_via(&r).await;
        // §6.1.2: "In a members-only chat room, only owners, admins or
        // members can query a room archive."
        let p = query(&mut carol, &r, "c", "").await;
        assert_eq!(p.error().as_deref(), Some("forbidden"), "{}", p.fin);
        assert!(p.items.is_empty());
        let p = query(&mut bob, &r, "b", "").await;
        assert_eq!(p.bodies(), ["members only"]);

        // An open room: anyone but an outcast.
        let open = open_room(&mut alice, "outer", "Alice").await;
        admin_set(
            &mut alice,
            &open,
            "<item affiliation='outcast' jid='carol@localhost'/>",
        )
        .await;
        let p = query(&mut carol, &open, "o", "").await;
        assert_eq!(p.error().as_deref(), Some("forbidden"), "{}", p.fin);
        let p = query(&mut bob, &open, "o2", "").await;
        assert_eq!(p.error(), None, "{}", p.fin);
        server.stop().await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_persistent_rooms_archive_outlives_a_restart_but_not_the_room() {
        let dir =
            std::env::temp_dir().join(format!("starling-muc-{}", starling_proto::random_id(10)));
        let d = dir.clone();
        let server = TestServer::start_with(|c| c.server.data_dir = d).await;
        let mut alice = server.login("alice").await;
        let r = open_room(&mut alice, "kept", "Alice").await;
        configure(&mut alice, &r, &[("muc#roomconfig_persistentroom", "1")]).await;
        for i in 1..=2 {
            alice
                .send(
                    &msg(&r)
                        .groupchat()
                        .id(&format!("k{i}"))
                        .body(&format!("kept {i}"))
                        .to_string(),
                )
                .await;
        }
        // A temporary room that ends with its last occupant.
        let gone = open_room(&mut alice, "fleeting", "Alice").await;
        alice
            .send(&msg(&gone).groupchat().id("s").body("secret").to_string())
            .await;
        // Both rooms handled their messages.
        alice.barrier_via(&r).await;
        alice.barrier_via(&gone).await;
        alice
            .send(
                &presence()
                    .to(&format!("{gone}/Alice"))
                    .ty("unavailable")
                    .to_string(),
            )
            .await;
        // The room handled the leaving (and ended): it, or the service for
        // the room that is no more, answers after.
        alice.barrier_via(&gone).await;
        server.server.shutdown().await; // keeps the data directory

        let d = dir.clone();
        let server = TestServer::start_with(|c| c.server.data_dir = d).await;
        let mut bob = server.login("bob").await;
        let p = query(&mut bob, &r, "k", "").await;
        assert_eq!(p.bodies(), ["kept 1", "kept 2"], "{}", p.fin);
        // The same name, a new room: the old conversation is not its archive.
        let again = open_room(&mut bob, "fleeting", "Bob").await;
        let p = query(&mut bob, &again, "f", "").await;
        assert!(
            p.items.is_empty() && p.complete(),
            "{:?} {}",
            p.bodies(),
            p.fin
        );
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn moderators_retract_messages_leaving_a_tombstone() {
    const MODERATE: &str = "urn:xmpp:message-moderate:1";
    const RETRACT: &str = "urn:xmpp:message-retract:1";
    // XEP-0425 §3: the request to retract the message of stanza id `id`.
    let moderate = |id: &str, extra: &str| {
        format!(
            "<moderate id='{id}' xmlns='{MODERATE}'><retract xmlns='{RETRACT}'/>{extra}</moderate>"
        )
    };
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = open_room(&mut alice, "modroom", "Alice").await;
    let mut bob = server.login("bob").await;
    join(&mut bob, &r, "Bob").await;
    alice.barrier_via(&r).await;
    bob.send(
        &msg(&r)
            .groupchat()
            .id("spam")
            .body("buy potions")
            .to_string(),
    )
    .await;
    let m = alice.recv_message().await;
    let sid = m
        .get_child("stanza-id", "urn:xmpp:sid:0")
        .and_then(|s| s.attr("id"))
        .unwrap()
        .to_owned();
    // The reflection of bob's own message, not to be taken for the
    // retraction below.
    bob.barrier_via(&r).await;
    let f = alice.disco_features(&r).await;
    assert!(f.contains(&MODERATE.to_owned()), "XEP-0425 §2: {f:?}");
    // XEP-0425 §3: a participant may not moderate.
    let e = bob
        .iq(&iq_set(&r, "mod1", &moderate(&sid, "")), "mod1")
        .await;
    assert_eq!(error_condition(&e).as_deref(), Some("forbidden"), "{e}");
    // An id the room never gave: item-not-found.
    let e = alice
        .iq(&iq_set(&r, "mod2", &moderate("0000000000000", "")), "mod2")
        .await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("item-not-found"),
        "{e}"
    );
    // The moderator retracts: everyone gets the retraction from the room.
    alice
        .send(&iq_set(
            &r,
            "mod3",
            &moderate(&sid, "<reason>spam</reason>"),
        ))
        .await;
    let n = bob.recv_message().await;
    assert_eq!(n.attr("from"), Some(r.as_str()), "{n}");
    let retract = n.get_child("retract", RETRACT).expect("retract");
    assert_eq!(retract.attr("id"), Some(sid.as_str()));
    let moderated = retract.get_child("moderated", MODERATE).expect("moderated");
    assert_eq!(moderated.attr("by"), Some(format!("{r}/Alice").as_str()));
    assert!(moderated.has_child("occupant-id", "urn:xmpp:occupant-id:0"));
    assert_eq!(
        retract
            .get_child("reason", RETRACT)
            .map(|r| r.text())
            .as_deref(),
        Some("spam")
    );
    let ok = alice
        .recv_until(|e| e.name() == "iq" && e.attr("id") == Some("mod3"))
        .await;
    assert_eq!(ok.attr("type"), Some("result"), "{ok}");
    // §4: newcomers' history shows the tombstone, not the message.
    let mut carol = server.login("carol").await;
    let got = join(&mut carol, &r, "Carol").await;
    let text: String = got.iter().map(|e| e.to_string()).collect();
    assert!(!text.contains("buy potions"), "{text}");
    assert!(text.contains("retracted"), "{text}");
    // §4: the room's archive keeps the tombstone only.
    // Alice's copy of the retraction and carol's presence come before the
    // room's answer, not among the archive's results.
    alice.barrier_via(&r).await;
    alice
        .send(&iq_set(
            &r,
            "mq",
            "<query xmlns='urn:xmpp:mam:2' queryid='t'/>",
        ))
        .await;
    let mut pages = String::new();
    loop {
        let el = alice.recv().await;
        if el.name() == "iq" && el.attr("id") == Some("mq") {
            assert_eq!(el.attr("type"), Some("result"), "{el}");
            break;
        }
        pages.push_str(&el.to_string());
    }
    assert!(!pages.contains("buy potions"), "{pages}");
    assert!(
        pages.contains("retracted") && pages.contains(&sid),
        "{pages}"
    );
    // Retracting it again: it is already gone.
    let e = alice
        .iq(&iq_set(&r, "mod4", &moderate(&sid, "")), "mod4")
        .await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("item-not-found"),
        "{e}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn members_see_the_room_in_their_inbox_with_unread_counts() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = open_room(&mut alice, "team", "Alice").await;
    let a = admin_set(
        &mut alice,
        &r,
        "<item affiliation='member' jid='bob@localhost'/>",
    )
    .await;
    assert_eq!(a.attr("type"), Some("result"), "{a}");
    let mut bob = server.login("bob").await;
    join(&mut bob, &r, "Bob").await;
    let mut carol = server.login("carol").await;
    join(&mut carol, &r, "Carol").await;
    for (i, text) in ["one", "two"].iter().enumerate() {
        carol
            .send(
                &msg(&r)
                    .groupchat()
                    .id(&format!("c{i}"))
                    .body(text)
                    .to_string(),
            )
            .await;
        carol.recv_message().await;
    }
    // Members (bob; alice, the owner) count both; carol, no member, has
    // no entry for the room.
    assert_eq!(
        bob.inbox_entries().await,
        [(r.clone(), 2, "two".to_owned())]
    );
    assert_eq!(
        alice.inbox_entries().await,
        [(r.clone(), 2, "two".to_owned())]
    );
    assert!(carol.inbox_entries().await.is_empty());
    // Writing in the room reads it: bob's count goes to 0, alice's grows.
    bob.send(&msg(&r).groupchat().id("b1").body("three").to_string())
        .await;
    bob.recv_message().await;
    assert_eq!(
        bob.inbox_entries().await,
        [(r.clone(), 0, "three".to_owned())]
    );
    assert_eq!(
        alice.inbox_entries().await,
        [(r.clone(), 3, "three".to_owned())]
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn owners_set_a_room_avatar_and_occupants_hear_of_it() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = open_room(&mut alice, "pics", "Alice").await;
    let mut bob = server.login("bob").await;
    join(&mut bob, &r, "Bob").await;
    alice.barrier_via(&r).await;
    let f = bob.disco_features(&r).await;
    assert!(f.contains(&"vcard-temp".to_owned()), "{f:?}");
    // Only owners set it.
    let vcard = "<vCard xmlns='vcard-temp'><PHOTO><TYPE>image/png</TYPE><BINVAL>aGVsbG8=</BINVAL></PHOTO></vCard>";
    let e = bob.iq(&iq_set(&r, "v1", vcard), "v1").await;
    assert_eq!(error_condition(&e).as_deref(), Some("forbidden"), "{e}");
    let ok = alice.iq(&iq_set(&r, "v2", vcard), "v2").await;
    assert_eq!(ok.attr("type"), Some("result"), "{ok}");
    // Occupants get the XEP-0153 hash from the room's JID: SHA-1("hello").
    let p = bob.recv_until(|e| e.name() == "presence").await;
    assert_eq!(p.attr("from"), Some(r.as_str()), "{p}");
    let photo = p
        .get_child("x", "vcard-temp:x:update")
        .and_then(|x| x.get_child("photo", "vcard-temp:x:update"))
        .map(|p| p.text());
    assert_eq!(
        photo.as_deref(),
        Some("aaf4c61ddcc5e8a2dabede0f3b482cd9aea9434d")
    );
    // Anyone reads it back; the room info form carries the hash.
    let v = bob
        .iq(&iq_get(&r, "v3", "<vCard xmlns='vcard-temp'/>"), "v3")
        .await;
    assert!(v.to_string().contains("aGVsbG8="), "{v}");
    let i = bob
        .iq(&iq_get(&r, "v4", &query(ns::DISCO_INFO, "")), "v4")
        .await;
    assert!(
        i.to_string()
            .contains("aaf4c61ddcc5e8a2dabede0f3b482cd9aea9434d"),
        "{i}"
    );
    // Not base64: bad-request; too large: not-acceptable.
    let e = alice
        .iq(
            &iq_set(
                &r,
                "v5",
                "<vCard xmlns='vcard-temp'><PHOTO><BINVAL>***</BINVAL></PHOTO></vCard>",
            ),
            "v5",
        )
        .await;
    assert_eq!(error_condition(&e).as_deref(), Some("bad-request"), "{e}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gets_the_right_errors_and_other_rooms_carry_on() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = open_room(&mut alice, "strict", "Alice").await;
    let other = room("other");
    let mut bob = server.login("bob").await;
    // Nicknames: blank, padded, absent.
    for nick in [" ", " padded"] {
        bob.send(&enter(&format!("{r}/{nick}"), "")).await;
        let e = bob
            .recv_until(|e| e.name() == "presence" && e.attr("type") == Some("error"))
            .await;
        assert!(
            matches!(error_condition(&e).as_deref(), Some("jid-malformed")),
            "{nick:?}: {e}"
        );
    }
    bob.send(&enter(&r, "")).await;
    let e = bob
        .recv_until(|e| e.name() == "presence" && e.attr("type") == Some("error"))
        .await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("jid-malformed"),
        "§7.2.1: {e}"
    );
    // An oversized subject (max_subject_len: 1024 characters).
    let long = "s".repeat(1025);
    alice
        .send(
            &msg(&r)
                .groupchat()
                .id("big")
                .child(&format!("<subject>{long}</subject>"))
                .to_string(),
        )
        .await;
    let e = alice.recv_message().await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("not-acceptable"),
        "{e}"
    );
    // A forged muc#user payload claiming a real JID is not passed on.
    join(&mut bob, &r, "Bob").await;
    alice.barrier_via(&r).await;
    bob.send(
        &msg(&r)
            .groupchat()
            .id("f")
            .body("hi")
            .child(&format!(
                "<x xmlns='{MUC_USER}'><item jid='ceo@localhost/desk'/></x>"
            ))
            .to_string(),
    )
    .await;
    let m = alice.recv_message().await;
    assert_eq!(body(&m), "hi");
    assert!(!m.to_string().contains("ceo@localhost"), "{m}");
    // §11.1: a copy bounced by the occupant's server as gone removes the
    // occupant (333); the bounce is not relayed.
    alice.barrier_via(&r).await;
    bob.send(
        &msg(&format!("{r}/Alice"))
            .ty("error")
            .id("x")
            .child("<error type='cancel'><service-unavailable xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/></error>")
            .to_string(),
    )
        .await;
    let gone = alice.recv().await;
    assert_eq!(gone.name(), "presence", "no relayed error first: {gone}");
    assert_eq!(gone.attr("type"), Some("unavailable"), "{gone}");
    assert!(statuses(&gone).contains(&"333".into()), "{gone}");
    // Another room works meanwhile.
    join(&mut alice, &other, "Alice").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn room_archives_are_purged_after_the_retention() {
    use starling_core::storage::{ArchiveId, ArchiveQuery, ArchiveRecord};
    let dir =
        std::env::temp_dir().join(format!("starling-mucret-{}", starling_proto::random_id(10)));
    let d = dir.clone();
    let server = TestServer::start_with(|c| c.server.data_dir = d).await;
    let room_jid = starling_proto::BareJid::new(&room("old")).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    let rec = |micros: i64, body: &str| ArchiveRecord {
        owner: room_jid.clone(),
        id: ArchiveId::from_parts(micros, 0),
        with_bare: "alice@localhost".into(),
        remote: format!("{}/Alice", room("old")),
        outgoing: false,
        origin_id: None,
        flags: 1,
        stanza: format!(
            "<message xmlns='jabber:client' type='groupchat'><body>{body}</body></message>"
        ),
    };
    let storage = server.server.env.storage.clone();
    storage
        .archive
        .append(&[
            rec(now - 3 * 86_400_000_000, "three days old"),
            rec(now - 3_600_000_000, "an hour old"),
        ])
        .await
        .unwrap();
    server.server.shutdown().await; // keeps the data directory

    let d = dir.clone();
    let server = TestServer::start_with(|c| {
        c.server.data_dir = d;
        c.modules
            .get_mut::<starling_server::modules::Muc>()
            .retention_days = 2;
    })
    .await;
    let storage = server.server.env.storage.clone();
    let q = ArchiveQuery {
        limit: 10,
        ..ArchiveQuery::default()
    };
    // The purge runs in a task of its own started with the server, and
    // tells nobody when it is done: its effect is polled, up to 5 s.
    let left = poll_for(Duration::from_secs(5), async || {
        let left = storage.archive.query(&room_jid, &q).await.unwrap().messages;
        (left.len() == 1).then_some(left)
    })
    .await
    .unwrap_or_default();
    assert_eq!(left.len(), 1, "the old message is purged at start");
    assert!(left[0].stanza.contains("an hour old"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_acknowledged_group_message_is_in_the_rooms_archive() {
    use starling_core::storage::ArchiveQuery;
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = open_room(&mut alice, "durable", "Alice").await;
    alice.send("<enable xmlns='urn:xmpp:sm:3'/>").await;
    alice.recv_until(|e| e.name() == "enabled").await;
    let room_jid = starling_proto::BareJid::new(&r).unwrap();
    for i in 0..20 {
        // XEP-0198: the ack covers the message only once it is durable,
        // here in the room's archive (docs/durability.md).
        alice
            .send(&format!(
                "{}<r xmlns='urn:xmpp:sm:3'/>",
                msg(&r)
                    .groupchat()
                    .id(&format!("d{i}"))
                    .body(&format!("kept {i}"))
            ))
            .await;
        alice.recv_until(|e| e.name() == "a").await;
        let page = server
            .server
            .env
            .storage
            .archive
            .query(
                &room_jid,
                &ArchiveQuery {
                    limit: 100,
                    ..ArchiveQuery::default()
                },
            )
            .await
            .unwrap();
        assert!(
            page.messages
                .iter()
                .any(|m| m.stanza.contains(&format!("kept {i}<"))),
            "message {i} acknowledged before it was archived"
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_user_in_fifty_rooms_drops_and_comes_back() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let rooms: Vec<String> = (0..50).map(|i| room(&format!("many{i}"))).collect();
    for r in &rooms {
        join(&mut alice, r, "Alice").await;
        let c = configure(&mut alice, r, &[("muc#roomconfig_persistentroom", "1")]).await;
        assert_eq!(c.attr("type"), Some("result"), "{c}");
    }
    let mut bob = server.login("bob").await;
    join(&mut bob, &rooms[0], "Bob").await;
    // The connection drops without a word: every room is left (RFC 6121
    // §4.6.3, directed presence), no ghost stays behind.
    drop(alice);
    let un = bob
        .recv_until(|e| {
            e.name() == "presence" && e.attr("from") == Some(&format!("{}/Alice", rooms[0]))
        })
        .await;
    assert_eq!(un.attr("type"), Some("unavailable"), "{un}");
    let mut alice = server.login("alice").await;
    let started = std::time::Instant::now();
    for r in &rooms {
        let got = join(&mut alice, r, "Alice").await;
        let own = got.iter().rfind(|e| e.name() == "presence").unwrap();
        assert!(
            !statuses(own).contains(&"201".into()),
            "the room was kept: {own}"
        );
        assert_eq!(item(own).attr("affiliation"), Some("owner"));
    }
    eprintln!("re-entered 50 rooms in {:?}", started.elapsed());
    let back = bob
        .recv_until(|e| {
            e.name() == "presence" && e.attr("from") == Some(&format!("{}/Alice", rooms[0]))
        })
        .await;
    assert_eq!(back.attr("type"), None, "{back}");
    let occupants = item_jids(&mut bob, &rooms[0]).await;
    assert_eq!(occupants.len(), 2, "alice once, bob: {occupants:?}");
    server.stop().await;
}

/// An account deleted in-band (XEP-0077 §3.2) loses its affiliations in
/// every room, live ones included (as ejabberd's mod_muc does on user
/// removal): in a members-only room its occupant is removed with 321
/// (§9.4), the member list no longer names it, and an account created
/// later with the same name is not a member.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_account_loses_its_affiliations() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let r = open_room(&mut alice, "guild", "alice").await;
    let c = configure(
        &mut alice,
        &r,
        &[
            ("muc#roomconfig_persistentroom", "1"),
            ("muc#roomconfig_membersonly", "1"),
        ],
    )
    .await;
    assert_eq!(c.attr("type"), Some("result"), "{c}");
    let a = admin_set(
        &mut alice,
        &r,
        "<item affiliation='member' jid='bob@localhost' nick='bobby'/>",
    )
    .await;
    assert_eq!(a.attr("type"), Some("result"), "{a}");
    join(&mut bob, &r, "bobby").await;
    // Bob's entering presence must not be taken for his removal.
    alice.barrier_via(&r).await;
    bob.barrier_via(&r).await;
    let rm = bob
        .iq(
            "<iq type='set' id='rm'><query xmlns='jabber:iq:register'><remove/></query></iq>",
            "rm",
        )
        .await;
    assert_eq!(rm.attr("type"), Some("result"), "{rm}");
    let p = alice
        .recv_until(|e| e.name() == "presence" && e.attr("from") == Some(&format!("{r}/bobby")))
        .await;
    assert_eq!(p.attr("type"), Some("unavailable"), "{p}");
    assert!(statuses(&p).contains(&"321".to_owned()), "{p}");
    assert_eq!(item(&p).attr("affiliation"), Some("none"), "{p}");
    let members = alice
        .iq(
            &iq_get(&r, "mem", &query(MUC_ADMIN, "<item affiliation='member'/>")),
            "mem",
        )
        .await;
    assert_eq!(members.attr("type"), Some("result"), "{members}");
    assert!(!members.to_string().contains("bob@localhost"), "{members}");
    // A new account named bob is not a member of the members-only room.
    let mut again = server.login("bob").await;
    assert_eq!(
        join_error(&mut again, &r, "bobby", "").await,
        "registration-required"
    );
    server.stop().await;
}
