//! Message Carbons (XEP-0280) over real sockets: enabling and disabling,
//! received and sent copies to the other carbons-enabled resources only,
//! no duplicates when a bare-JID message reaches several resources, the
//! `<private/>` exclusion, the §6.1 eligibility rules and forged carbons.

use starling_testkit::stanza::{empty, iq_get, iq_set, msg};
use starling_testkit::starling_xml::Element;
use starling_testkit::{ns, Client, TestServer};

const NS_CARBONS: &str = "urn:xmpp:carbons:2";
const NS_FORWARD: &str = "urn:xmpp:forward:0";

fn bare_of(c: &Client) -> String {
    c.jid.split('/').next().unwrap().to_owned()
}

async fn set_carbons(c: &mut Client, on: bool, id: &str) -> Element {
    let what = if on { "enable" } else { "disable" };
    c.iq(&iq_set("", id, &empty(what, NS_CARBONS)), id).await
}

/// §4: enables carbons and checks the result.
async fn enable(c: &mut Client) {
    let r = set_carbons(c, true, "enable1").await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
}

fn body(m: &Element) -> String {
    m.get_child("body", ns::CLIENT)
        .map(|b| b.text())
        .unwrap_or_default()
}

/// Checks a carbon's wrapper (§7, §8) and returns the forwarded message.
fn unwrap_carbon<'a>(c: &Client, m: &'a Element, kind: &str) -> &'a Element {
    assert_eq!(m.name(), "message", "{m}");
    assert_eq!(
        m.attr("from"),
        Some(bare_of(c).as_str()),
        "from the bare JID: {m}"
    );
    assert_eq!(m.attr("to"), Some(c.jid.as_str()), "to the full JID: {m}");
    m.get_child(kind, NS_CARBONS)
        .unwrap_or_else(|| panic!("no <{kind}/>: {m}"))
        .get_child("forwarded", NS_FORWARD)
        .unwrap_or_else(|| panic!("no <forwarded/>: {m}"))
        .get_child("message", ns::CLIENT)
        .unwrap_or_else(|| panic!("no forwarded message: {m}"))
}

/// Alice with three resources (only the first two enable carbons) and bob;
/// everything that arrived at login read (a barrier each).
async fn setup(server: &TestServer) -> (Client, Client, Client, Client) {
    let mut a1 = server.login("alice").await;
    let mut a2 = server.login("alice").await;
    let mut a3 = server.login("alice").await;
    let mut bob = server.login("bob").await;
    enable(&mut a1).await;
    enable(&mut a2).await;
    for c in [&mut a1, &mut a2, &mut a3, &mut bob] {
        c.barrier().await;
    }
    (a1, a2, a3, bob)
}

#[tokio::test]
async fn enable_disable_repeated_are_results_and_feature_advertised() {
    let server = TestServer::start().await;
    let mut a = server.login("alice").await;
    // §3: the server advertises the feature.
    assert!(a
        .disco_features("localhost")
        .await
        .contains(&NS_CARBONS.to_owned()));
    // §4, §5, §9.1: enable/disable, repeated, each answered with a result
    // from the bare JID.
    for (on, id) in [(true, "e1"), (true, "e2"), (false, "d1"), (false, "d2")] {
        let r = set_carbons(&mut a, on, id).await;
        assert_eq!(r.attr("type"), Some("result"), "{r}");
        assert_eq!(r.attr("from"), Some(bare_of(&a).as_str()), "{r}");
        assert!(r.children().next().is_none(), "{r}");
    }
    // An enable addressed to the own bare JID is handled too.
    let id = "e3";
    let r = a
        .iq(&iq_set(&bare_of(&a), id, &empty("enable", NS_CARBONS)), id)
        .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    // A get is not defined: bad-request.
    let r = a
        .iq(&iq_get("", "g1", &empty("enable", NS_CARBONS)), "g1")
        .await;
    assert_eq!(r.attr("type"), Some("error"), "{r}");
    server.stop().await;
}

#[tokio::test]
async fn received_carbons_go_to_other_enabled_resources_only() {
    let server = TestServer::start().await;
    let (mut a1, mut a2, mut a3, mut bob) = setup(&server).await;
    // §7: bob writes to a1's full JID; a1 gets the original, a2 (enabled)
    // a <received/> copy, a3 (not enabled) nothing.
    bob.send(
        &msg(&a1.jid)
            .chat()
            .id("m1")
            .body("hi a1")
            .child("<thread>t1</thread>")
            .to_string(),
    )
    .await;
    let m = a1.recv_message().await;
    assert_eq!(body(&m), "hi a1");
    assert!(!m.has_child("received", NS_CARBONS));
    let c = a2.recv_message().await;
    assert_eq!(c.attr("type"), Some("chat"), "same type: {c}");
    let inner = unwrap_carbon(&a2, &c, "received");
    assert_eq!(body(inner), "hi a1");
    assert_eq!(inner.attr("from"), Some(bob.jid.as_str()));
    assert_eq!(inner.attr("to"), Some(a1.jid.as_str()));
    assert_eq!(
        inner.get_child("thread", ns::CLIENT).map(|t| t.text()),
        Some("t1".into())
    );
    // The recipient itself gets no copy; a non-enabled resource nothing.
    a1.expect_nothing().await;
    a3.expect_nothing().await;
    server.stop().await;
}

#[tokio::test]
async fn sent_carbons_go_to_other_enabled_resources_only() {
    let server = TestServer::start().await;
    let (mut a1, mut a2, mut a3, mut bob) = setup(&server).await;
    // §8: a1 writes to bob; a2 gets a <sent/> copy, the sender none (even
    // though it enabled carbons), a3 nothing.
    a1.send(&msg(&bob.jid).chat().id("s1").body("hi bob").to_string())
        .await;
    assert_eq!(body(&bob.recv_message().await), "hi bob");
    let c = a2.recv_message().await;
    let inner = unwrap_carbon(&a2, &c, "sent");
    assert_eq!(body(inner), "hi bob");
    assert_eq!(inner.attr("from"), Some(a1.jid.as_str()));
    assert_eq!(inner.attr("to"), Some(bob.jid.as_str()));
    a1.expect_nothing().await;
    a3.expect_nothing().await;
    // §8: also when the sender has not enabled carbons.
    a3.send(&msg(&bob.jid).chat().body("from a3").to_string())
        .await;
    assert_eq!(body(&bob.recv_message().await), "from a3");
    for c in [&mut a1, &mut a2] {
        let m = c.recv_message().await;
        assert_eq!(body(unwrap_carbon(c, &m, "sent")), "from a3");
    }
    a3.expect_nothing().await;
    server.stop().await;
}

#[tokio::test]
async fn bare_jid_message_to_equal_priorities_is_not_copied_twice() {
    let server = TestServer::start().await;
    let (mut a1, mut a2, mut a3, mut bob) = setup(&server).await;
    // a3 enables carbons but has a negative priority: it gets no original.
    enable(&mut a3).await;
    a3.send("<presence><priority>-1</priority></presence>")
        .await;
    for c in [&mut a1, &mut a2, &mut a3, &mut bob] {
        c.barrier().await;
    }
    bob.send("<message to='alice@localhost' type='chat'><body>to all</body></message>")
        .await;
    // RFC 6121 §8.5.2.1.1: a1 and a2 (priority 0) both get the original;
    // XEP-0280 §7: neither gets a copy, a3 gets exactly one.
    for c in [&mut a1, &mut a2] {
        let m = c.recv_message().await;
        assert_eq!(body(&m), "to all");
        assert!(!m.has_child("received", NS_CARBONS), "{m}");
        c.expect_nothing().await;
    }
    let m = a3.recv_message().await;
    assert_eq!(body(unwrap_carbon(&a3, &m, "received")), "to all");
    a3.expect_nothing().await;
    server.stop().await;
}

#[tokio::test]
async fn private_messages_are_not_copied() {
    let server = TestServer::start().await;
    let (mut a1, mut a2, _a3, mut bob) = setup(&server).await;
    let private = format!("<private xmlns='{NS_CARBONS}'/><no-copy xmlns='urn:xmpp:hints'/>");
    // §8: sending side.
    a1.send(
        &msg(&bob.jid)
            .chat()
            .body("secret out")
            .child(&private)
            .to_string(),
    )
    .await;
    let m = bob.recv_message().await;
    assert_eq!(body(&m), "secret out");
    // The current XEP no longer strips <private/> (§8 interop note).
    assert!(m.has_child("private", NS_CARBONS), "{m}");
    a2.expect_nothing().await;
    // §8: receiving side.
    bob.send(
        &msg(&a1.jid)
            .chat()
            .body("secret in")
            .child(&private)
            .to_string(),
    )
    .await;
    assert_eq!(body(&a1.recv_message().await), "secret in");
    a2.expect_nothing().await;
    server.stop().await;
}

#[tokio::test]
async fn only_eligible_message_types_are_copied() {
    let server = TestServer::start().await;
    let (mut a1, mut a2, _a3, mut bob) = setup(&server).await;
    // §6.1: headline, groupchat, error and body-less normal messages are
    // not copied.
    for (i, m) in [
        "<message to='{to}' type='headline'><body>news</body></message>",
        "<message to='{to}' type='groupchat'><body>room</body></message>",
        "<message to='{to}' type='error'><error type='cancel'><item-not-found xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/></error></message>",
        "<message to='{to}'><subject>no body</subject></message>",
    ]
    .iter()
    .enumerate()
    {
        bob.send(&m.replace("{to}", &a1.jid)).await;
        let got = a1.recv_message().await;
        assert!(!got.has_child("received", NS_CARBONS), "{i}: {got}");
        a2.expect_nothing().await;
    }
    // Type normal with a body, and a body-less receipt, are copied.
    bob.send(&msg(&a1.jid).body("normal").to_string()).await;
    a1.recv_message().await;
    let c = a2.recv_message().await;
    assert_eq!(body(unwrap_carbon(&a2, &c, "received")), "normal");
    bob.send(
        &msg(&a1.jid)
            .child("<received xmlns='urn:xmpp:receipts' id='x'/>")
            .to_string(),
    )
    .await;
    a1.recv_message().await;
    let c = a2.recv_message().await;
    assert!(unwrap_carbon(&a2, &c, "received").has_child("received", "urn:xmpp:receipts"));
    server.stop().await;
}

#[tokio::test]
async fn forged_carbons_are_dropped() {
    let server = TestServer::start().await;
    let (mut a1, mut a2, _a3, mut bob) = setup(&server).await;
    let forged = |kind: &str, to: &str| {
        msg(to)
            .chat()
            .child(&format!(
                "<{kind} xmlns='{NS_CARBONS}'><forwarded xmlns='{NS_FORWARD}'>\
                 <message xmlns='jabber:client' from='juliet@localhost/balcony' to='{to}' type='chat'>\
                 <body>meet me</body></message></forwarded></{kind}>"
            ))
            .to_string()
    };
    // §11 (the Tybalt example in §7): from another user, to the bare and
    // the full JID, received and sent: never delivered.
    for kind in ["received", "sent"] {
        bob.send(&forged(kind, "alice@localhost")).await;
        bob.send(&forged(kind, &a2.jid)).await;
    }
    // From one of alice's own resources: 'from' is a full JID, not the
    // bare JID only the server uses.
    a1.send(&forged("received", &a2.jid)).await;
    // Barriers: bob's and a1's stanzas were all handled (routed or
    // dropped) before their pings were answered.
    bob.barrier().await;
    a1.expect_nothing().await;
    a2.expect_nothing().await;
    server.stop().await;
}

#[tokio::test]
async fn disabled_resources_get_nothing() {
    let server = TestServer::start().await;
    let (mut a1, mut a2, mut a3, mut bob) = setup(&server).await;
    // §5: after disabling, a2 gets no more copies.
    let r = set_carbons(&mut a2, false, "d1").await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    bob.send(&msg(&a1.jid).chat().body("in").to_string()).await;
    assert_eq!(body(&a1.recv_message().await), "in");
    a1.send(&msg(&bob.jid).chat().body("out").to_string()).await;
    assert_eq!(body(&bob.recv_message().await), "out");
    a2.expect_nothing().await;
    a3.expect_nothing().await;
    // Enabling again resumes copies (§9.1).
    enable(&mut a2).await;
    bob.send(&msg(&a1.jid).chat().body("again").to_string())
        .await;
    let c = a2.recv_message().await;
    assert_eq!(body(unwrap_carbon(&a2, &c, "received")), "again");
    server.stop().await;
}
