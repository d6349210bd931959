//! Message Archive Management over real sockets: XEP-0313 (`urn:xmpp:mam:2`
//! and `#extended`), XEP-0059 paging, XEP-0359 stanza ids, XEP-0441
//! preferences, XEP-0334 hints, XEP-0424 retraction tombstones, XEP-0308
//! corrections, XEP-0184 receipts and XEP-0333 markers in the archive, and
//! the errors each XEP prescribes for bad queries.

use starling_testkit::mam::{err_query, form, ok_query, rsm, FORWARD as FWD, MAM};
use starling_testkit::stanza::{empty, iq_get, iq_set, msg};
use starling_testkit::starling_xml::Element;
use starling_testkit::{error_condition, eventually, ns, Client, TestServer};
use std::time::Duration;

const SID: &str = "urn:xmpp:sid:0";
const RETRACT: &str = "urn:xmpp:message-retract:1";

fn bare_of(c: &Client) -> String {
    c.jid.split('/').next().unwrap().to_owned()
}

async fn chat(from: &mut Client, to: &str, id: &str, body: &str) {
    from.send(&msg(to).chat().id(id).body(body).to_string())
        .await;
}

/// Waits for the wall clock's next millisecond and returns it, as an
/// XEP-0082 stamp (millisecond precision): whatever was archived before
/// the call is strictly earlier, whatever after it not earlier.
async fn next_millisecond() -> String {
    let ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    };
    let start = ms();
    loop {
        let now = ms();
        if now > start {
            return starling_proto::datetime::xep0082_datetime(now);
        }
        tokio::task::yield_now().await;
    }
}

/// Alice sends `n` messages to bob, who receives each; returns bob's copies.
async fn converse(alice: &mut Client, bob: &mut Client, n: usize) -> Vec<Element> {
    let mut got = Vec::new();
    for i in 0..n {
        chat(alice, &bare_of(bob), &format!("m{i}"), &format!("msg {i}")).await;
        got.push(bob.recv_message().await);
    }
    got
}

#[tokio::test]
async fn archived_both_ways_with_stanza_ids_and_paging() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    // XEP-0313 §6 / XEP-0359 §4: features on the account.
    let features = alice.disco_features(&bare_of(&alice)).await;
    for f in [
        MAM,
        "urn:xmpp:mam:2#extended",
        SID,
        RETRACT,
        "urn:xmpp:message-retract:1#tombstone",
    ] {
        assert!(features.iter().any(|x| x == f), "{f} in {features:?}");
    }
    let got = converse(&mut alice, &mut bob, 12).await;
    // §3.1: the delivered copy carries bob's archive id.
    let sid = got[0]
        .get_child("stanza-id", SID)
        .expect("stanza-id on delivery");
    assert_eq!(sid.attr("by"), Some(bare_of(&bob).as_str()));
    let first_id = sid.attr("id").unwrap().to_owned();
    // Bob's archive holds all 12 in order, ids equal to the stanza ids.
    let all = ok_query(&mut bob, "", "all", "").await;
    assert_eq!(
        all.bodies(),
        (0..12).map(|i| format!("msg {i}")).collect::<Vec<_>>()
    );
    assert_eq!(all.items[0].0, first_id);
    assert!(all.complete());
    let mut sorted = all.ids();
    sorted.sort();
    assert_eq!(sorted, all.ids(), "ids are time-ordered strings");
    // Alice's archive has her outgoing copies (without a stanza-id by bob).
    let a = ok_query(&mut alice, "", "a", "").await;
    assert_eq!(a.items.len(), 12);
    assert_eq!(a.items[3].1.attr("to"), Some(bare_of(&bob).as_str()));
    assert!(
        a.ids().iter().all(|id| !all.ids().contains(id)),
        "ids are unique across archives"
    );

    // RSM forward paging (§4.3.2 and XEP-0059 §2.2).
    let p1 = ok_query(&mut bob, "", "p1", &rsm("<max>5</max>")).await;
    assert_eq!(p1.items.len(), 5);
    assert!(!p1.complete());
    assert_eq!(p1.rsm("first").as_deref(), Some(all.items[0].0.as_str()));
    assert_eq!(p1.rsm("last").as_deref(), Some(all.items[4].0.as_str()));
    let p2 = ok_query(
        &mut bob,
        "",
        "p2",
        &rsm(&format!(
            "<max>5</max><after>{}</after>",
            p1.rsm("last").unwrap()
        )),
    )
    .await;
    assert_eq!(p2.bodies()[0], "msg 5");
    let p3 = ok_query(
        &mut bob,
        "",
        "p3",
        &rsm(&format!(
            "<max>5</max><after>{}</after>",
            p2.rsm("last").unwrap()
        )),
    )
    .await;
    assert_eq!(p3.bodies(), ["msg 10", "msg 11"]);
    assert!(p3.complete());
    // The last page (§4.3.3: empty <before/>), then backwards.
    let l1 = ok_query(&mut bob, "", "l1", &rsm("<max>5</max><before/>")).await;
    assert_eq!(
        l1.bodies(),
        (7..12).map(|i| format!("msg {i}")).collect::<Vec<_>>(),
        "chronological within the page"
    );
    assert!(!l1.complete());
    let l2 = ok_query(
        &mut bob,
        "",
        "l2",
        &rsm(&format!(
            "<max>10</max><before>{}</before>",
            l1.rsm("first").unwrap()
        )),
    )
    .await;
    assert_eq!(l2.items.len(), 7);
    assert!(l2.complete(), "reached the start while paging backwards");
    // Flip-page (§4.3.4): same page, reversed.
    let f = ok_query(
        &mut bob,
        "",
        "f",
        &format!("{}<flip-page/>", rsm("<max>5</max><before/>")),
    )
    .await;
    let mut rev = l1.bodies();
    rev.reverse();
    assert_eq!(f.bodies(), rev);
    // Extended: after-id / before-id / ids (§4.1.3, §4.1.4).
    let between = ok_query(
        &mut bob,
        "",
        "b",
        &form(&[
            ("after-id", &all.items[2].0),
            ("before-id", &all.items[6].0),
        ]),
    )
    .await;
    assert_eq!(between.bodies(), ["msg 3", "msg 4", "msg 5"]);
    let picked = ok_query(&mut bob, "", "ids", &form(&[("ids", &all.items[9].0)])).await;
    assert_eq!(picked.bodies(), ["msg 9"]);
    // RSM max=0: the count only.
    let count = ok_query(&mut bob, "", "c", &rsm("<max>0</max>")).await;
    assert!(count.items.is_empty());
    assert_eq!(count.rsm("count").as_deref(), Some("12"));
    // Metadata (§6).
    let md = bob
        .iq(&iq_get("", "md", &empty("metadata", MAM)), "md")
        .await;
    let md = md.get_child("metadata", MAM).expect("metadata");
    assert_eq!(
        md.get_child("start", MAM).and_then(|s| s.attr("id")),
        Some(all.items[0].0.as_str())
    );
    assert_eq!(
        md.get_child("end", MAM).and_then(|s| s.attr("id")),
        Some(all.items[11].0.as_str())
    );
    assert!(md
        .get_child("end", MAM)
        .and_then(|s| s.attr("timestamp"))
        .is_some());
    // The query form (§4.1.5) lists every field, ids with an open validate.
    let fr = bob
        .iq(&iq_get("", "form", &empty("query", MAM)), "form")
        .await;
    let x = fr
        .get_child("query", MAM)
        .and_then(|q| q.get_child("x", "jabber:x:data"))
        .expect("form");
    let vars: Vec<&str> = x.children().filter_map(|f| f.attr("var")).collect();
    assert_eq!(
        vars,
        [
            "FORM_TYPE",
            "with",
            "start",
            "end",
            "before-id",
            "after-id",
            "ids"
        ]
    );
    // Operators see the write-behind queues: 12 messages, archived twice.
    let metrics = server.server.env.metrics.encode();
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {metrics}"))
    };
    assert_eq!(
        value("starling_write_behind_written_total{queue=\"archive\"}"),
        24.0
    );
    assert_eq!(
        value("starling_write_behind_queued{queue=\"archive\"}"),
        0.0
    );
    assert_eq!(
        value("starling_write_behind_dropped_total{queue=\"archive\"}"),
        0.0
    );
    server.stop().await;
}

#[tokio::test]
async fn with_and_time_filters() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let mut carol = server.login("carol").await;
    converse(&mut alice, &mut bob, 2).await;
    // t: a millisecond after the first two were archived (they were before
    // bob got them), and before the next ones.
    let t = next_millisecond().await;
    next_millisecond().await;
    chat(&mut carol, &bare_of(&bob), "c1", "from carol").await;
    bob.recv_message().await;
    chat(&mut alice, &bare_of(&bob), "late", "late alice").await;
    bob.recv_message().await;
    // §4.1.1: with a bare JID matches every resource of it.
    let w = ok_query(&mut bob, "", "w", &form(&[("with", &bare_of(&alice))])).await;
    assert_eq!(w.bodies(), ["msg 0", "msg 1", "late alice"]);
    // With a full JID, only that resource.
    let wf = ok_query(&mut bob, "", "wf", &form(&[("with", &carol.jid)])).await;
    assert_eq!(wf.bodies(), ["from carol"]);
    let wf2 = ok_query(
        &mut bob,
        "",
        "wf2",
        &form(&[("with", &format!("{}/other", bare_of(&carol)))]),
    )
    .await;
    assert!(wf2.items.is_empty());
    // §4.1.2: start and end, inclusive.
    let after = ok_query(&mut bob, "", "s", &form(&[("start", &t)])).await;
    assert_eq!(after.bodies(), ["from carol", "late alice"]);
    let before = ok_query(&mut bob, "", "e", &form(&[("end", &t)])).await;
    assert_eq!(before.bodies(), ["msg 0", "msg 1"]);
    let both = ok_query(
        &mut bob,
        "",
        "se",
        &form(&[("start", &t), ("with", &bare_of(&alice))]),
    )
    .await;
    assert_eq!(both.bodies(), ["late alice"]);
    server.stop().await;
}

#[tokio::test]
async fn what_is_not_archived_and_preferences() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let b = bare_of(&bob);
    // XEP-0334: no-store and no-permanent-store; chat states alone.
    alice
        .send(
            &msg(&b)
                .chat()
                .body("secret")
                .child("<no-store xmlns='urn:xmpp:hints'/>")
                .to_string(),
        )
        .await;
    alice
        .send(
            &msg(&b)
                .chat()
                .body("secret2")
                .child("<no-permanent-store xmlns='urn:xmpp:hints'/>")
                .to_string(),
        )
        .await;
    alice
        .send(
            &msg(&b)
                .chat()
                .child("<composing xmlns='http://jabber.org/protocol/chatstates'/>")
                .to_string(),
        )
        .await;
    alice
        .send(&msg(&b).headline().body("news").to_string())
        .await;
    for _ in 0..4 {
        let m = bob.recv_message().await;
        assert!(
            m.get_child("stanza-id", SID).is_none(),
            "not archived, so no stanza-id: {m}"
        );
    }
    // Receipts, markers and corrections are archived (XEP-0313 §5.1.1 and
    // the convergence rule).
    chat(&mut alice, &bare_of(&bob), "orig", "helo").await;
    bob.recv_message().await;
    alice
        .send(
            &msg(&b)
                .chat()
                .id("fix")
                .body("hello")
                .child("<replace xmlns='urn:xmpp:message-correct:0' id='orig'/>")
                .to_string(),
        )
        .await;
    bob.recv_message().await;
    bob.send(
        &msg(&bare_of(&alice))
            .chat()
            .child("<received xmlns='urn:xmpp:receipts' id='orig'/>")
            .to_string(),
    )
    .await;
    bob.send(
        &msg(&bare_of(&alice))
            .chat()
            .child("<displayed xmlns='urn:xmpp:chat-markers:0' id='fix'/>")
            .to_string(),
    )
    .await;
    alice.recv_message().await;
    alice.recv_message().await;
    let p = ok_query(&mut bob, "", "all", "").await;
    assert_eq!(p.items.len(), 4, "{:?}", p.bodies());
    assert_eq!(p.bodies()[..2], ["helo".to_owned(), "hello".to_owned()]);
    assert!(p.items[1]
        .1
        .get_child("replace", "urn:xmpp:message-correct:0")
        .is_some());
    assert!(p.items[2]
        .1
        .get_child("received", "urn:xmpp:receipts")
        .is_some());
    assert!(p.items[3]
        .1
        .get_child("displayed", "urn:xmpp:chat-markers:0")
        .is_some());

    // XEP-0441 preferences: default never with an always-list.
    let pr = bob.iq(&iq_get("", "pg", &empty("prefs", MAM)), "pg").await;
    assert_eq!(
        pr.get_child("prefs", MAM).and_then(|p| p.attr("default")),
        Some("always")
    );
    let mut carol = server.login("carol").await;
    let set = bob
        .iq(
            &iq_set("", "ps", &format!("<prefs xmlns='{MAM}' default='never'><always><jid>{}</jid></always><never/></prefs>", bare_of(&carol))),
            "ps",
        )
        .await;
    assert_eq!(set.attr("type"), Some("result"), "{set}");
    let echoed = set.get_child("prefs", MAM).unwrap();
    assert_eq!(echoed.attr("default"), Some("never"));
    assert_eq!(
        echoed.get_child("always", MAM).unwrap().children().count(),
        1
    );
    chat(&mut alice, &bare_of(&bob), "n1", "not kept").await;
    let m = bob.recv_message().await;
    assert!(m.get_child("stanza-id", SID).is_none());
    chat(&mut carol, &bare_of(&bob), "k1", "kept").await;
    let m = bob.recv_message().await;
    assert!(m.get_child("stanza-id", SID).is_some());
    let p = ok_query(&mut bob, "", "after-prefs", &rsm("<max>2</max><before/>")).await;
    assert_eq!(p.bodies().last().map(String::as_str), Some("kept"));
    assert!(!p.bodies().contains(&"not kept".to_owned()));
    // Roster mode: carol is not in bob's roster, so nothing is kept.
    bob.iq(
        &iq_set(
            "",
            "pr",
            &format!("<prefs xmlns='{MAM}' default='roster'/>"),
        ),
        "pr",
    )
    .await;
    chat(&mut carol, &bare_of(&bob), "k2", "stranger").await;
    let m = bob.recv_message().await;
    assert!(
        m.get_child("stanza-id", SID).is_none(),
        "roster mode, not a contact: {m}"
    );
    // Bad preference values.
    let bad = bob
        .iq(
            &iq_set(
                "",
                "pb",
                &format!("<prefs xmlns='{MAM}' default='sometimes'/>"),
            ),
            "pb",
        )
        .await;
    assert_eq!(error_condition(&bad).as_deref(), Some("bad-request"));
    server.stop().await;
}

#[tokio::test]
async fn retraction_leaves_tombstones_and_only_the_author_may_retract() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let b = bare_of(&bob);
    alice
        .send(
            &msg(&b)
                .chat()
                .id("oops")
                .body("wrong chat")
                .child(&format!("<origin-id xmlns='{SID}' id='oops-origin'/>"))
                .to_string(),
        )
        .await;
    bob.recv_message().await;
    chat(&mut alice, &bare_of(&bob), "keep", "fine").await;
    bob.recv_message().await;
    // XEP-0424 §3: retract by origin id.
    alice
        .send(
            &msg(&b)
                .chat()
                .id("r1")
                .child(&format!("<retract xmlns='{RETRACT}' id='oops-origin'/><fallback xmlns='urn:xmpp:fallback:0' for='{RETRACT}'/>"))
                .body("/me retracted a message")
                .child("<store xmlns='urn:xmpp:hints'/>")
                .to_string(),
        )
        .await;
    let r = bob.recv_message().await;
    assert_eq!(
        r.get_child("retract", RETRACT).and_then(|x| x.attr("id")),
        Some("oops-origin")
    );
    for c in [&mut alice, &mut bob] {
        let p = ok_query(c, "", "h", "").await;
        assert_eq!(p.items.len(), 3, "original, second message, retraction");
        let t = &p.items[0].1;
        let retracted = t
            .get_child("retracted", RETRACT)
            .unwrap_or_else(|| panic!("tombstone: {t}"));
        assert_eq!(retracted.attr("id"), Some("r1"));
        assert!(retracted.attr("stamp").is_some());
        assert!(
            t.get_child("body", ns::CLIENT).is_none(),
            "the body is gone: {t}"
        );
        assert_eq!(t.attr("id"), Some("oops"), "attributes kept");
        assert_eq!(p.bodies()[1], "fine");
        assert!(
            p.items[2].1.get_child("retract", RETRACT).is_some(),
            "§4: the retraction is archived"
        );
    }
    // Bob tries to retract alice's message: forbidden, not delivered, and
    // nothing changes in either archive.
    bob.send(
        &msg(&bare_of(&alice))
            .chat()
            .id("r2")
            .child(&format!("<retract xmlns='{RETRACT}' id='keep'/>"))
            .to_string(),
    )
    .await;
    let e = bob.recv_message().await;
    assert_eq!(e.attr("type"), Some("error"));
    assert_eq!(error_condition(&e).as_deref(), Some("forbidden"));
    // (Handled: bob has the error.)
    alice.expect_nothing().await;
    let p = ok_query(&mut alice, "", "h2", "").await;
    assert_eq!(p.bodies()[1], "fine");
    // A forged retraction from carol cannot touch alice's message in bob's
    // archive: only messages from the same bare JID are matched (§6).
    let mut carol = server.login("carol").await;
    carol
        .send(
            &msg(&b)
                .chat()
                .id("r3")
                .child(&format!("<retract xmlns='{RETRACT}' id='keep'/>"))
                .body("x")
                .to_string(),
        )
        .await;
    bob.recv_message().await;
    let p = ok_query(&mut bob, "", "h3", &form(&[("with", &bare_of(&alice))])).await;
    assert_eq!(p.bodies()[1], "fine");
    server.stop().await;
}

#[tokio::test]
async fn bad_queries_get_their_errors() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    converse(&mut alice, &mut bob, 2).await;
    // XEP-0313 §4.3.5 / §4.1.3: unknown ids → item-not-found.
    for (q, inner) in [
        ("bogus-after", rsm("<after>not-an-id</after>")),
        (
            "bogus-before",
            rsm("<before>'; DROP TABLE archive; --</before>"),
        ),
        ("valid-but-absent", rsm("<after>0000000000000</after>")),
        ("bogus-after-id", form(&[("after-id", "zzz")])),
        ("bogus-ids", form(&[("ids", "00000000000001")])),
    ] {
        assert_eq!(
            err_query(&mut bob, "", q, &inner).await,
            "item-not-found",
            "{q}"
        );
    }
    // §4.1.5: unknown fields → feature-not-implemented.
    assert_eq!(
        err_query(&mut bob, "", "f", &form(&[("{urn:x}mood", "lonely")])).await,
        "feature-not-implemented"
    );
    assert_eq!(
        err_query(&mut bob, "", "g", &form(&[("include-groupchat", "true")])).await,
        "feature-not-implemented"
    );
    // Malformed forms and values → bad-request (jid-malformed for JIDs).
    assert_eq!(
        err_query(&mut bob, "", "d", &form(&[("start", "yesterday")])).await,
        "bad-request"
    );
    assert_eq!(
        err_query(&mut bob, "", "m", &rsm("<max>lots</max>")).await,
        "bad-request"
    );
    assert_eq!(
        err_query(&mut bob, "", "w", &form(&[("with", "@@")])).await,
        "jid-malformed"
    );
    let wrong_type = "<x xmlns='jabber:x:data' type='submit'><field var='FORM_TYPE'><value>urn:xmpp:mam:1</value></field></x>";
    assert_eq!(
        err_query(&mut bob, "", "t", wrong_type).await,
        "bad-request"
    );
    assert_eq!(
        err_query(&mut bob, "", "i", &rsm("<index>3</index>")).await,
        "feature-not-implemented"
    );
    // More ids than a page holds: refused before any SQL.
    let many: String = (0..1000).map(|_| "<value>0000000000000</value>").collect();
    let too_many = format!(
        "<x xmlns='jabber:x:data' type='submit'><field var='FORM_TYPE'><value>{MAM}</value></field><field var='ids'>{many}</field></x>"
    );
    assert_eq!(
        err_query(&mut bob, "", "n", &too_many).await,
        "policy-violation"
    );
    // §8: someone else's archive → forbidden.
    let p = bob
        .iq(&iq_set(&bare_of(&alice), "x", &empty("query", MAM)), "x")
        .await;
    assert_eq!(error_condition(&p).as_deref(), Some("forbidden"), "{p}");
    let p = bob
        .iq(&iq_get(&bare_of(&alice), "y", &empty("prefs", MAM)), "y")
        .await;
    assert_eq!(error_condition(&p).as_deref(), Some("forbidden"), "{p}");
    // The session survives all of it.
    let ok = ok_query(&mut bob, "", "ok", "").await;
    assert_eq!(ok.items.len(), 2);
    server.stop().await;
}

#[tokio::test]
async fn spoofed_stanza_ids_are_removed_and_offline_messages_are_archived() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let b = bare_of(&bob);
    // XEP-0359 §5: a stanza-id claiming to be by the recipient is dropped.
    alice
        .send(
            &msg(&b)
                .chat()
                .body("x")
                .child(&format!("<stanza-id xmlns='{SID}' by='{b}' id='forged'/><stanza-id xmlns='{SID}' by='elsewhere.example' id='kept'/>"))
                .to_string(),
        )
        .await;
    let m = bob.recv_message().await;
    let ids: Vec<(Option<&str>, Option<&str>)> = m
        .children()
        .filter(|c| c.is("stanza-id", SID))
        .map(|c| (c.attr("by"), c.attr("id")))
        .collect();
    assert_eq!(ids.len(), 2, "{m}");
    assert!(ids.contains(&(Some("elsewhere.example"), Some("kept"))));
    assert!(!ids.iter().any(|(_, id)| *id == Some("forged")));
    bob.close().await;
    // Offline: archived with its stanza id, delivered at the next login.
    // (Stored by alice's session, or handed back by bob's closing one.)
    chat(&mut alice, &b, "off", "while away").await;
    let bob_jid = starling_proto::BareJid::new(&b).unwrap();
    let offline = &server.server.env.storage.offline;
    eventually(
        "the message is stored offline",
        Duration::from_secs(10),
        async || (offline.count(&bob_jid).await.unwrap() == 1).then_some(()),
    )
    .await;
    let mut bob = server.login("bob").await;
    let m = bob.recv_message().await;
    assert_eq!(
        m.get_child("body", ns::CLIENT).map(|b| b.text()).as_deref(),
        Some("while away")
    );
    let sid = m
        .get_child("stanza-id", SID)
        .expect("stanza id on the offline copy")
        .attr("id")
        .unwrap()
        .to_owned();
    let p = ok_query(&mut bob, "", "q", &rsm("<max>1</max><before/>")).await;
    assert_eq!(p.ids(), [sid]);
    server.stop().await;
}

#[tokio::test]
async fn queued_archive_writes_survive_a_graceful_shutdown() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    converse(&mut alice, &mut bob, 20).await;
    // Shut down at once: the last messages are still queued; then open the
    // database again (whichever backend the tests run on) and look.
    let backend = server.backend_config();
    server.server.shutdown().await;
    let db = starling_server::modules::open_storage(&backend)
        .await
        .unwrap();
    let bob_jid = starling_proto::BareJid::new("bob@localhost").unwrap();
    let n = db
        .archive
        .count(&bob_jid, &Default::default())
        .await
        .unwrap();
    assert_eq!(
        n, 20,
        "the write-behind queue was flushed before storage closed"
    );
    db.backend.close().await;
    if let Some(d) = server.database {
        d.drop_database().await;
    }
    let _ = std::fs::remove_dir_all(&server.dir);
}

#[tokio::test]
async fn sent_carbons_carry_the_senders_archive_id_and_recipients_never_see_it() {
    let server = TestServer::start().await;
    let mut a1 = server.login("alice").await;
    let mut a2 = server.login("alice").await;
    let mut bob = server.login("bob").await;
    a1.barrier().await; // a2's presence (routed before its echo came)
    let r = a2
        .iq(
            "<iq type='set' id='cc'><enable xmlns='urn:xmpp:carbons:2'/></iq>",
            "cc",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"));
    let alice = bare_of(&a1);
    // A client's own forged stanza-id by alice is removed too.
    a1.send(
        &msg(&bare_of(&bob))
            .chat()
            .id("s1")
            .body("hi")
            .child(&format!(
                "<stanza-id xmlns='{SID}' by='{alice}' id='forged'/>"
            ))
            .to_string(),
    )
    .await;
    let got = bob.recv_message().await;
    let by: Vec<Option<&str>> = got
        .children()
        .filter(|c| c.is("stanza-id", SID))
        .map(|c| c.attr("by"))
        .collect();
    assert_eq!(
        by,
        [Some("bob@localhost")],
        "only the recipient's own archive id: {got}"
    );
    let carbon = a2.recv_message().await;
    let fwd = carbon
        .get_child("sent", "urn:xmpp:carbons:2")
        .and_then(|s| s.get_child("forwarded", FWD))
        .and_then(|f| f.get_child("message", ns::CLIENT))
        .unwrap_or_else(|| panic!("sent carbon: {carbon}"));
    let ids: Vec<&str> = fwd
        .children()
        .filter(|c| c.is("stanza-id", SID) && c.attr("by") == Some(alice.as_str()))
        .filter_map(|c| c.attr("id"))
        .collect();
    assert_eq!(ids.len(), 1, "{fwd}");
    // XEP-0313 §3.1: it is the id in alice's archive.
    let p = ok_query(&mut a2, "", "own", "").await;
    assert_eq!(p.ids(), [ids[0].to_owned()]);
    server.stop().await;
}

/// docs/memory.md: the archive queue is bounded in bytes as well as in
/// records, so large stanzas raise the back-pressure and fill the queue
/// long before its record count does; nothing is lost, and the queue's
/// bytes stay within `queue_max_mib` (plus one stanza, admitted alone).
#[tokio::test(flavor = "multi_thread")]
async fn large_stanzas_fill_the_archive_queue_by_bytes_not_count() {
    let server = TestServer::start_with(|cfg| {
        let mam = cfg.modules.get_mut::<starling_server::modules::Mam>();
        mam.queue_max_mib = 1;
        // A window long enough that everything below is still queued when
        // the gauge is read, unless the bytes bound cut it short.
        mam.batch_delay_ms = 60_000;
        mam.batch_size = 10_000;
    })
    .await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let queues = server.server.env.metrics.write_behind.queues();
    let (_, archive) = queues
        .iter()
        .find(|(name, _)| name == "archive")
        .expect("archive queue")
        .clone();
    let body = "x".repeat(100 * 1024);
    for i in 0..24 {
        chat(&mut alice, &bare_of(&bob), &format!("big{i}"), &body).await;
        bob.recv_message().await;
    }
    // 24 messages × 2 archive rows × 100 KiB = 4.8 MiB were archived: at
    // most 1 MiB waited at any time, so the writer did not wait for its
    // 60 s window (batches written when the pressure rose).
    assert!(
        archive.written.get() > 0,
        "the bytes bound made the writer write before its window ended"
    );
    assert!(
        archive.bytes.get() <= (1 << 20) + 110 * 1024,
        "queued bytes {} within queue_max_mib",
        archive.bytes.get()
    );
    let page = ok_query(&mut alice, "", "q1", "").await;
    assert_eq!(page.items.len(), 24, "every message archived");
}
