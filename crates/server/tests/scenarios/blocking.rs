//! Blocking Command (XEP-0191) over real sockets.

use starling_testkit::roster::{self, Subscription};
use starling_testkit::stanza::msg;
use starling_testkit::stanza::{iq_get, iq_set, presence};
use starling_testkit::{error_condition, ns, Client, TestServer};

const NS_BLOCKING: &str = "urn:xmpp:blocking";

async fn block(c: &mut Client, jids: &[&str]) -> starling_testkit::starling_xml::Element {
    let items: String = jids.iter().map(|j| format!("<item jid='{j}'/>")).collect();
    c.iq(
        &iq_set(
            "",
            "b",
            &format!("<block xmlns='{NS_BLOCKING}'>{items}</block>"),
        ),
        "b",
    )
    .await
}

async fn unblock(c: &mut Client, jids: &[&str]) -> starling_testkit::starling_xml::Element {
    let items: String = jids.iter().map(|j| format!("<item jid='{j}'/>")).collect();
    c.iq(
        &iq_set(
            "",
            "u",
            &format!("<unblock xmlns='{NS_BLOCKING}'>{items}</unblock>"),
        ),
        "u",
    )
    .await
}

async fn blocklist(c: &mut Client) -> Vec<String> {
    let r = c
        .iq(
            "<iq type='get' id='l'><blocklist xmlns='urn:xmpp:blocking'/></iq>",
            "l",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    r.get_child("blocklist", NS_BLOCKING)
        .expect("blocklist")
        .children()
        .filter_map(|i| i.attr("jid").map(str::to_owned))
        .collect()
}

fn body(el: &starling_testkit::starling_xml::Element) -> String {
    el.get_child("body", ns::CLIENT)
        .map(|b| b.text())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn block_list_get_block_unblock_and_pushes_to_interested_resources() {
    // XEP-0191 §3.2 (get), §3.3 (block + push), §3.4 (unblock + push).
    let server = TestServer::start().await;
    let mut phone = server.login("alice").await;
    let mut laptop = server.login("alice").await;
    // The laptop's initial presence was routed before its echo came.
    phone.barrier().await;
    assert!(blocklist(&mut phone).await.is_empty());
    let r = block(&mut phone, &["bob@localhost", "Spam.Example"]).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    // The requesting resource gets the push…
    let push = phone
        .recv_until(|e| e.has_child("block", NS_BLOCKING))
        .await;
    assert_eq!(push.attr("type"), Some("set"));
    let pushed: Vec<_> = push
        .get_child("block", NS_BLOCKING)
        .unwrap()
        .children()
        .filter_map(|i| i.attr("jid"))
        .collect();
    assert_eq!(pushed, ["bob@localhost", "spam.example"], "normalised JIDs");
    // …the one that never asked for the list does not (pushes went out
    // while the request was handled: the phone has its answer).
    laptop.expect_nothing().await;
    assert_eq!(
        blocklist(&mut phone).await,
        ["bob@localhost", "spam.example"]
    );
    let r = unblock(&mut phone, &["spam.example"]).await;
    assert_eq!(r.attr("type"), Some("result"));
    phone
        .recv_until(|e| e.has_child("unblock", NS_BLOCKING))
        .await;
    assert_eq!(blocklist(&mut phone).await, ["bob@localhost"]);
    // Unblock everything (§3.5): an empty unblock.
    unblock(&mut phone, &[]).await;
    assert!(blocklist(&mut phone).await.is_empty());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn blocked_contact_cannot_reach_user_by_message_presence_or_iq() {
    // XEP-0191 §3.5: presence dropped, message and iq get service-unavailable.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    block(&mut alice, &["bob@localhost"]).await;
    alice.barrier().await; // the push
    bob.send(&msg(&alice.jid).chat().id("m").body("hi").to_string())
        .await;
    let e = bob.recv().await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("service-unavailable"),
        "{e}"
    );
    bob.send("<message to='alice@localhost' type='chat' id='m2'><body>bare</body></message>")
        .await;
    assert_eq!(
        error_condition(&bob.recv().await).as_deref(),
        Some("service-unavailable")
    );
    let r = bob
        .iq(
            &iq_get(&alice.jid, "q", "<query xmlns='urn:example:q'/>"),
            "q",
        )
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("service-unavailable"));
    bob.send(&presence().to(&alice.jid).to_string()).await;
    bob.expect_nothing().await; // no error for presence (and it was routed)
    alice.expect_nothing().await; // and nothing delivered
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn user_sending_to_blocked_jid_gets_not_acceptable_blocked() {
    // XEP-0191 §3.6.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    block(&mut alice, &["bob@localhost"]).await;
    alice.barrier().await; // the push
    alice
        .send(&msg(&bob.jid).chat().id("x").body("psst").to_string())
        .await;
    let e = alice.recv().await;
    assert_eq!(error_condition(&e).as_deref(), Some("not-acceptable"));
    assert!(
        e.get_child("error", ns::CLIENT)
            .unwrap()
            .has_child("blocked", "urn:xmpp:blocking:errors"),
        "{e}"
    );
    // Alice's message was handled (she has the error): nothing for bob.
    bob.expect_nothing().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unblock_restores_delivery_and_block_persists_across_sessions() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    block(&mut alice, &["bob@localhost"]).await;
    drop(alice);
    let mut alice = server.login("alice").await;
    assert_eq!(
        blocklist(&mut alice).await,
        ["bob@localhost"],
        "stored, not per session"
    );
    unblock(&mut alice, &["bob@localhost"]).await;
    alice.barrier().await; // the push
    bob.barrier().await;
    bob.send(&msg(&alice.jid).chat().body("back").to_string())
        .await;
    assert_eq!(body(&alice.recv_message().await), "back");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn domain_block_never_blocks_own_resources() {
    // XEP-0016 §2.1 domain matching; XEP-0191 §5: a user's own resources
    // are never blocked from each other.
    let server = TestServer::start().await;
    let mut a1 = server.login("alice").await;
    let mut a2 = server.login("alice").await;
    let mut bob = server.login("bob").await;
    block(&mut a1, &["localhost"]).await;
    // Logins' presences were routed before their echoes, the block's
    // pushes before its answer.
    a1.barrier().await;
    a2.barrier().await;
    bob.barrier().await;
    bob.send(&msg(&a1.jid).chat().id("d").body("x").to_string())
        .await;
    assert_eq!(
        error_condition(&bob.recv().await).as_deref(),
        Some("service-unavailable")
    );
    a2.send(&msg(&a1.jid).chat().body("self").to_string()).await;
    assert_eq!(body(&a1.recv_message().await), "self");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn block_and_unblock_send_presence_to_subscribed_contact() {
    // XEP-0191 §3.3: unavailable presence to the blocked JID if it receives
    // the user's presence; §3.4: current presence again on unblock.
    let server = TestServer::start().await;
    roster::put(&server, "alice", "bob", Subscription::Both, &[]).await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    alice.send("<presence><show>chat</show></presence>").await;
    // Alice's presence was routed to bob once her ping is answered.
    alice.barrier().await;
    bob.barrier().await;
    block(&mut alice, &["bob@localhost"]).await;
    let p = bob.recv_until(|e| e.name() == "presence").await;
    assert_eq!(
        (p.attr("type"), p.attr("from")),
        (Some("unavailable"), Some(alice.jid.as_str()))
    );
    unblock(&mut alice, &["bob@localhost"]).await;
    let p = bob.recv_until(|e| e.name() == "presence").await;
    assert_eq!(p.attr("type"), None, "available again: {p}");
    assert_eq!(
        p.get_child("show", ns::CLIENT).map(|s| s.text()).as_deref(),
        Some("chat")
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_block_requests_rejected_without_change() {
    // XEP-0191 §3.3: empty block → bad-request; invalid JID → jid-malformed.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = block(&mut alice, &[]).await;
    assert_eq!(error_condition(&r).as_deref(), Some("bad-request"));
    let r = block(&mut alice, &["a@b@c"]).await;
    assert_eq!(error_condition(&r).as_deref(), Some("jid-malformed"));
    let r = alice
        .iq(
            "<iq type='set' id='n'><block xmlns='urn:xmpp:blocking'><item/></block></iq>",
            "n",
        )
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("bad-request"));
    assert!(blocklist(&mut alice).await.is_empty());
    // Someone else's list is not reachable.
    let mut bob = server.login("bob").await;
    let r = bob
        .iq("<iq to='alice@localhost' type='get' id='o'><blocklist xmlns='urn:xmpp:blocking'/></iq>", "o")
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("service-unavailable"));
    server.stop().await;
}
