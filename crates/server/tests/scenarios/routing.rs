//! Routing between local sessions: RFC 6120 §8.1.2.1 (from stamping), §10
//! (server rules), RFC 6121 §8.5 (local user delivery rules).

use starling_server::modules;
use starling_testkit::stanza::msg;
use starling_testkit::stanza::{iq, iq_get, presence};
use starling_testkit::{error_condition, ns, TestServer};

fn body(el: &starling_testkit::starling_xml::Element) -> String {
    el.get_child("body", ns::CLIENT)
        .map(|b| b.text())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_to_full_jid_delivered_with_stamped_from() {
    // RFC 6121 §8.5.3.1; RFC 6120 §8.1.2.1 rule 1 (from = sender's full JID).
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    alice
        .send(&msg(&bob.jid).chat().id("m1").body("hi bob").to_string())
        .await;
    let m = bob.recv().await;
    assert_eq!(m.attr("from"), Some(alice.jid.as_str()));
    assert_eq!(m.attr("id"), Some("m1"));
    assert_eq!(body(&m), "hi bob");
    // And back.
    bob.send(&msg(&alice.jid).chat().body("hi alice").to_string())
        .await;
    assert_eq!(body(&alice.recv().await), "hi alice");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn spoofed_from_is_rewritten() {
    // RFC 6120 §8.1.2.1: the server overrides the 'from' a client claims.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    alice
        .send(
            &msg(&bob.jid)
                .attr("from", "admin@localhost/console")
                .chat()
                .body("trust me")
                .to_string(),
        )
        .await;
    let m = bob.recv().await;
    assert_eq!(m.attr("from"), Some(alice.jid.as_str()));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_payloads_pass_through_untouched() {
    // DESIGN.md invariant 5: unknown extensions are forwarded as received.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    alice
        .send(
            &msg(&bob.jid)
                .chat()
                .body("x & y")
                .child("<custom xmlns='urn:example:x' a='1'><deep><b>t</b></deep></custom>")
                .to_string(),
        )
        .await;
    let m = bob.recv().await;
    let custom = m
        .get_child("custom", "urn:example:x")
        .expect("extension forwarded");
    assert_eq!(custom.attr("a"), Some("1"));
    assert_eq!(
        custom
            .get_child("deep", "urn:example:x")
            .unwrap()
            .get_child("b", "urn:example:x")
            .unwrap()
            .text(),
        "t"
    );
    assert_eq!(body(&m), "x & y");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_to_bare_jid_goes_to_highest_priority_resource() {
    // RFC 6121 §8.5.2.1.1.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut low = server.login("bob").await;
    let mut high = server.login("bob").await;
    low.send("<presence><priority>1</priority></presence>")
        .await;
    high.send("<presence><priority>5</priority></presence>")
        .await;
    // Let the priorities land before routing.
    let _ = low
        .iq(
            "<iq type='get' id='s'><ping xmlns='urn:xmpp:ping'/></iq>",
            "s",
        )
        .await;
    let _ = high
        .iq(
            "<iq type='get' id='s'><ping xmlns='urn:xmpp:ping'/></iq>",
            "s",
        )
        .await;
    // Presence broadcasts between the resources are not under test (both
    // presences were handled: their iqs are answered).
    low.barrier().await;
    high.barrier().await;
    alice
        .send("<message to='bob@localhost' type='chat'><body>to bare</body></message>")
        .await;
    assert_eq!(body(&high.recv_message().await), "to bare");
    alice.barrier().await;
    low.expect_nothing().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn headline_to_bare_jid_goes_to_all_non_negative_resources() {
    // RFC 6121 §8.5.2.1.1: headline → all available resources with priority ≥ 0.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut a = server.login("bob").await;
    let mut b = server.login("bob").await;
    let mut neg = server.login("bob").await;
    neg.send("<presence><priority>-1</priority></presence>")
        .await;
    let _ = neg
        .iq(
            "<iq type='get' id='s'><ping xmlns='urn:xmpp:ping'/></iq>",
            "s",
        )
        .await;
    // Presence broadcasts between the resources are not under test (all
    // presences were handled: logins got their echoes, neg its answer).
    neg.barrier().await;
    a.barrier().await;
    b.barrier().await;
    alice
        .send("<message to='bob@localhost' type='headline'><body>news</body></message>")
        .await;
    assert_eq!(body(&a.recv_message().await), "news");
    assert_eq!(body(&b.recv_message().await), "news");
    alice.barrier().await;
    neg.expect_nothing().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_to_user_without_available_resource_gets_service_unavailable() {
    // RFC 6121 §8.5.2.1.1 without offline storage / §8.5.2.2 (with it:
    // tests/offline.rs).
    let server =
        TestServer::start_with(|c| c.modules.get_mut::<modules::Offline>().enabled = false).await;
    server.create_user("bob", "pw").await;
    let mut alice = server.login("alice").await;
    alice
        .send(
            "<message to='bob@localhost' type='chat' id='o1'><body>are you there</body></message>",
        )
        .await;
    let e = alice.recv().await;
    assert_eq!(e.attr("type"), Some("error"));
    assert_eq!(e.attr("id"), Some("o1"));
    assert_eq!(e.attr("from"), Some("bob@localhost"));
    assert_eq!(error_condition(&e).as_deref(), Some("service-unavailable"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn negative_priority_only_counts_as_unavailable_for_bare_messages() {
    // RFC 6121 §8.5.2.1.1: resources with negative priority get no bare-JID
    // messages (without offline storage: an error; with it, tests/offline.rs).
    let server =
        TestServer::start_with(|c| c.modules.get_mut::<modules::Offline>().enabled = false).await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    bob.send("<presence><priority>-5</priority></presence>")
        .await;
    let _ = bob
        .iq(
            "<iq type='get' id='s'><ping xmlns='urn:xmpp:ping'/></iq>",
            "s",
        )
        .await;
    // Presence broadcasts between the resources are not under test.
    bob.barrier().await;
    alice
        .send("<message to='bob@localhost' type='chat' id='n'><body>x</body></message>")
        .await;
    assert_eq!(
        error_condition(&alice.recv_message().await).as_deref(),
        Some("service-unavailable")
    );
    // (Routed: alice has the error.)
    bob.expect_nothing().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn message_to_unknown_account_gets_service_unavailable() {
    // RFC 6121 §8.5.1.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    alice
        .send("<message to='nobody@localhost' type='chat' id='u'><body>x</body></message>")
        .await;
    let e = alice.recv().await;
    assert_eq!(error_condition(&e).as_deref(), Some("service-unavailable"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn message_to_gone_full_jid_is_treated_as_bare() {
    // RFC 6121 §8.5.3.2.1: no such resource → handled as for the bare JID.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    alice
        .send("<message to='bob@localhost/old-phone' type='chat'><body>fallback</body></message>")
        .await;
    let m = bob.recv().await;
    assert_eq!(body(&m), "fallback");
    assert_eq!(
        m.attr("to"),
        Some("bob@localhost/old-phone"),
        "addressing is preserved"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn iq_between_full_jids_and_result_routed_back() {
    // RFC 6121 §8.5.3.1 for iq; the response is routed like any stanza.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    alice
        .send(&iq_get(&bob.jid, "q1", "<query xmlns='urn:example:q'/>"))
        .await;
    let q = bob.recv().await;
    assert_eq!(q.attr("from"), Some(alice.jid.as_str()));
    bob.send(&iq("result", "q1").to(&alice.jid).to_string())
        .await;
    let r = alice.recv().await;
    assert_eq!((r.attr("type"), r.attr("id")), (Some("result"), Some("q1")));
    assert_eq!(r.attr("from"), Some(bob.jid.as_str()));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn iq_to_absent_full_jid_gets_service_unavailable() {
    // RFC 6121 §8.5.3.2.2.
    let server = TestServer::start().await;
    server.create_user("bob", "pw").await;
    let mut alice = server.login("alice").await;
    let r = alice
        .iq(
            "<iq to='bob@localhost/none' type='get' id='q'><query xmlns='urn:example:q'/></iq>",
            "q",
        )
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("service-unavailable"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn iq_to_bare_jid_unknown_namespace_gets_service_unavailable() {
    // RFC 6121 §8.5.2.1.3: the server answers for the account.
    let server = TestServer::start().await;
    let _bob = server.login("bob").await;
    let mut alice = server.login("alice").await;
    let r = alice
        .iq(
            "<iq to='bob@localhost' type='get' id='q'><query xmlns='urn:example:none'/></iq>",
            "q",
        )
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("service-unavailable"));
    assert_eq!(r.attr("from"), Some("bob@localhost"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn iq_to_server_unknown_namespace_gets_service_unavailable() {
    // RFC 6120 §10.3.3 / §8.3.3.19.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = alice
        .iq(
            "<iq to='localhost' type='get' id='q'><query xmlns='urn:example:none'/></iq>",
            "q",
        )
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("service-unavailable"));
    assert_eq!(r.attr("from"), Some("localhost"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn message_to_remote_domain_gets_remote_server_not_found() {
    // No server-to-server yet: RFC 6120 §8.3.3.16.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    alice
        .send("<message to='juliet@capulet.example' type='chat' id='r'><body>x</body></message>")
        .await;
    assert_eq!(
        error_condition(&alice.recv().await).as_deref(),
        Some("remote-server-not-found")
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_to_gets_jid_malformed() {
    // RFC 6120 §8.3.3.8.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    alice
        .send("<message to='a@b@c' id='j'><body>x</body></message>")
        .await;
    let e = alice.recv().await;
    assert_eq!(e.attr("id"), Some("j"));
    assert_eq!(error_condition(&e).as_deref(), Some("jid-malformed"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn iq_without_id_gets_bad_request() {
    // RFC 6120 §8.2.3: iq requires 'id'.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    alice
        .send("<iq type='get' to='localhost'><ping xmlns='urn:xmpp:ping'/></iq>")
        .await;
    assert_eq!(
        error_condition(&alice.recv().await).as_deref(),
        Some("bad-request")
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn directed_presence_to_full_jid_delivered() {
    // RFC 6121 §4.6 / §8.5.3.1.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    alice
        .send(&presence().to(&bob.jid).show("away").to_string())
        .await;
    let p = bob.recv().await;
    assert_eq!(p.name(), "presence");
    assert_eq!(p.attr("from"), Some(alice.jid.as_str()));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn groupchat_to_bare_jid_gets_service_unavailable() {
    // RFC 6121 §8.5.2.1.1 (groupchat to a bare JID of a user).
    let server = TestServer::start().await;
    let _bob = server.login("bob").await;
    let mut alice = server.login("alice").await;
    alice
        .send("<message to='bob@localhost' type='groupchat' id='g'><body>x</body></message>")
        .await;
    assert_eq!(
        error_condition(&alice.recv().await).as_deref(),
        Some("service-unavailable")
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn error_stanza_is_never_answered_with_error() {
    // RFC 6120 §8.3.1.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    alice
        .send("<message to='nobody@localhost' type='error' id='e'><error type='cancel'><item-not-found xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/></error></message>")
        .await;
    alice.expect_nothing().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ping_server_and_own_account_answered() {
    // XEP-0199 §4.2 (c2s ping) and an iq with no 'to' (RFC 6120 §10.3.3).
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = alice
        .iq(
            "<iq to='localhost' type='get' id='p1'><ping xmlns='urn:xmpp:ping'/></iq>",
            "p1",
        )
        .await;
    assert_eq!(
        (r.attr("type"), r.attr("from")),
        (Some("result"), Some("localhost"))
    );
    let r = alice
        .iq(
            "<iq type='get' id='p2'><ping xmlns='urn:xmpp:ping'/></iq>",
            "p2",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn server_pings_idle_client_and_drops_silent_one() {
    // XEP-0199 §4.1: server-to-client ping; no answer → connection-timeout.
    let server = TestServer::start_with(|c| {
        c.modules.get_mut::<modules::Ping>().interval_secs = 1;
        c.modules.get_mut::<modules::Ping>().timeout_secs = 1;
    })
    .await;
    let mut alive = server.login("alice").await;
    let mut silent = server.login("bob").await;
    let ping = alive.recv_until(|e| e.has_child("ping", ns::PING)).await;
    assert_eq!(ping.attr("from"), Some("localhost"));
    assert_eq!(ping.attr("type"), Some("get"));
    alive
        .send(
            &iq("result", ping.attr("id").unwrap())
                .to("localhost")
                .to_string(),
        )
        .await;
    silent.recv_until(|e| e.has_child("ping", ns::PING)).await;
    silent.expect_stream_error("connection-timeout").await;
    // The answering client is still served.
    let r = alive
        .iq(
            "<iq to='localhost' type='get' id='x'><ping xmlns='urn:xmpp:ping'/></iq>",
            "x",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn presence_broadcast_to_own_resources_and_echoed() {
    // RFC 6121 §4.2.2: initial presence goes to all of the user's available
    // resources, including the sender; §4.5.2: unavailable presence too.
    let server = TestServer::start().await;
    let mut phone = server.login("alice").await; // echo consumed by login()
    let mut laptop = server.login("alice").await;
    let p = phone.recv().await;
    assert_eq!(
        (p.name(), p.attr("from")),
        ("presence", Some(laptop.jid.as_str()))
    );
    laptop
        .send("<presence><show>dnd</show><priority>3</priority></presence>")
        .await;
    let echo = laptop.recv().await;
    assert_eq!(echo.get_child("show", ns::CLIENT).unwrap().text(), "dnd");
    let p = phone.recv().await;
    assert_eq!(p.get_child("show", ns::CLIENT).unwrap().text(), "dnd");
    laptop.send("<presence type='unavailable'/>").await;
    let p = phone.recv().await;
    assert_eq!(
        (p.attr("type"), p.attr("from")),
        (Some("unavailable"), Some(laptop.jid.as_str()))
    );
    // An unavailable resource no longer gets broadcasts.
    phone.send("<presence><show>away</show></presence>").await;
    let _echo = phone.recv().await;
    phone.barrier().await;
    laptop.expect_nothing().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn disco_info_lists_declared_features_only() {
    // XEP-0030 §3.1: identity and features, from the enabled modules.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = alice
        .iq("<iq to='localhost' type='get' id='d'><query xmlns='http://jabber.org/protocol/disco#info'/></iq>", "d")
        .await;
    let q = r.get_child("query", ns::DISCO_INFO).expect("query");
    let id = q.get_child("identity", ns::DISCO_INFO).expect("identity");
    assert_eq!(
        (id.attr("category"), id.attr("type")),
        (Some("server"), Some("im"))
    );
    let features: Vec<_> = q.children().filter_map(|f| f.attr("var")).collect();
    for f in [ns::DISCO_INFO, ns::DISCO_ITEMS, ns::PING, ns::REGISTER] {
        assert!(features.contains(&f), "{f} missing in {features:?}");
    }
    // A disabled module is not advertised.
    let server2 = TestServer::start_with(|c| {
        c.modules.get_mut::<modules::Ping>().enabled = false;
        c.modules.get_mut::<modules::Register>().enabled = false;
        c.modules.get_mut::<modules::Register>().allow_cancel = false;
        c.modules
            .get_mut::<modules::Register>()
            .allow_password_change = false;
    })
    .await;
    let mut carol = server2.login("carol").await;
    let vars = carol.disco_features("localhost").await;
    assert!(
        !vars.iter().any(|v| v == ns::PING || v == ns::REGISTER),
        "{vars:?}"
    );
    let r = carol
        .iq(
            "<iq to='localhost' type='get' id='p'><ping xmlns='urn:xmpp:ping'/></iq>",
            "p",
        )
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("service-unavailable"));
    server.stop().await;
    server2.stop().await;
}

/// Features that clients look for on the server's own disco#info.
const SERVER_SCOPE_ACCOUNT_FEATURES: [&str; 5] = [
    "urn:xmpp:mam:2",
    "urn:xmpp:mam:2#extended",
    "urn:xmpp:carbons:2",
    "urn:xmpp:blocking",
    "urn:xmpp:inbox:1",
];

#[tokio::test(flavor = "multi_thread")]
async fn disco_server_advertises_archive_and_inbox_when_enabled() {
    // Regression (issue 9, profanity: "Server doesn't support MAM"): MAM was
    // advertised on the account only. XEP-0313 §7 requires it on the
    // archiving JID (the account); clients also look at the server's
    // disco#info, where Prosody and ejabberd list it. XEP-0280 §3 and
    // XEP-0191 §3.1: carbons and blocking on the server; XEP-0430 §2.1:
    // the inbox on the server as MongooseIM does.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let on_server = alice.disco_features("localhost").await;
    let on_account = alice.disco_features("alice@localhost").await;
    for f in SERVER_SCOPE_ACCOUNT_FEATURES {
        assert!(
            on_server.iter().any(|v| v == f),
            "{f} on server: {on_server:?}"
        );
    }
    for f in [
        "urn:xmpp:mam:2",
        "urn:xmpp:mam:2#extended",
        "urn:xmpp:inbox:1",
    ] {
        assert!(
            on_account.iter().any(|v| v == f),
            "{f} on account: {on_account:?}"
        );
    }
    // Disabled modules advertise nothing, in either scope (invariant 1).
    let server2 = TestServer::start_with(|c| {
        c.modules.get_mut::<modules::Mam>().enabled = false;
        c.modules.get_mut::<modules::Inbox>().enabled = false;
        c.modules.get_mut::<modules::Carbons>().enabled = false;
        c.modules.get_mut::<modules::Blocking>().enabled = false;
    })
    .await;
    let mut carol = server2.login("carol").await;
    for to in ["localhost", "carol@localhost"] {
        let vars = carol.disco_features(to).await;
        for f in SERVER_SCOPE_ACCOUNT_FEATURES {
            assert!(
                !vars.iter().any(|v| v == f),
                "{f} advertised on {to}: {vars:?}"
            );
        }
    }
    server.stop().await;
    server2.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn disco_on_account_answered_for_owner_only() {
    // XEP-0030 §3.1: the server answers for the account.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let r = alice
        .iq("<iq to='alice@localhost' type='get' id='d'><query xmlns='http://jabber.org/protocol/disco#info'/></iq>", "d")
        .await;
    let id = r
        .get_child("query", ns::DISCO_INFO)
        .unwrap()
        .get_child("identity", ns::DISCO_INFO)
        .unwrap();
    assert_eq!(
        (id.attr("category"), id.attr("type")),
        (Some("account"), Some("registered"))
    );
    let r = bob
        .iq("<iq to='alice@localhost' type='get' id='d'><query xmlns='http://jabber.org/protocol/disco#info'/></iq>", "d")
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("service-unavailable"));
    server.stop().await;
}
