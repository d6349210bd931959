//! Roster management (RFC 6121 §2, XEP-0237) and presence subscriptions
//! (RFC 6121 §3, Appendix A) over real sockets.

use crate::im_common;

use im_common::*;
use starling_core::storage::Subscription;
use starling_server::modules;
use starling_testkit::stanza::{iq, iq_get, iq_set, presence};
use starling_testkit::starling_xml::Element;
use starling_testkit::{error_condition, ns, TestServer};

// ---------------------------------------------------------------------------
// Appendix A tables. Each row: set up the state between user `u` and
// contact `c` in storage, log both in (available and interested), apply one
// stanza, then check both rosters and what each side received.
// ---------------------------------------------------------------------------

/// One row of an outbound table (A.2): `u` sends `kind` to `c`.
struct Out {
    old: St,
    new: St,
    /// The user gets a roster push (visible change of the item).
    u_push: bool,
    /// The contact's client gets the stanza (routed, then delivered per A.3).
    c_gets: bool,
    /// The contact gets a roster push.
    c_push: bool,
}

fn out(old: St, new: St, u_push: bool, c_gets: bool, c_push: bool) -> Out {
    Out {
        old,
        new,
        u_push,
        c_gets,
        c_push,
    }
}

async fn outbound_table(table: &str, kind: &str, rows: Vec<Out>) {
    let server = TestServer::start().await;
    for (i, row) in rows.iter().enumerate() {
        let (u, c) = (format!("u{table}x{i}"), format!("c{table}x{i}"));
        set_state(&server, &u, &c, row.old).await;
        let mut uc = login_full(&server, &u).await;
        let mut cc = login_full(&server, &c).await;
        sync(&mut uc).await;
        uc.send(
            &presence()
                .to(&format!("{c}@localhost"))
                .ty(kind)
                .to_string(),
        )
        .await;
        let u_got = sync(&mut uc).await;
        let c_got = sync(&mut cc).await;
        let ctx = format!(
            "A.2 {table} {kind} row {:?}: u got {u_got:?}, c got {c_got:?}",
            row.old
        );
        assert_eq!(state_of(&server, &u, &c).await, row.new, "{ctx}");
        assert_eq!(state_of(&server, &c, &u).await, row.new.mirror(), "{ctx}");
        assert_eq!(!pushes(&u_got).is_empty(), row.u_push, "{ctx}");
        assert_eq!(!pushes(&c_got).is_empty(), row.c_push, "{ctx}");
        let c_subs = sub_types(&c_got);
        if row.c_gets {
            assert_eq!(c_subs, vec![kind.to_owned()], "{ctx}");
            let p = c_got.iter().find(|e| e.attr("type") == Some(kind)).unwrap();
            // §3.1.2 and friends: stamped with the user's bare JID.
            assert_eq!(
                p.attr("from"),
                Some(format!("{u}@localhost").as_str()),
                "{ctx}"
            );
        } else {
            assert!(c_subs.is_empty(), "{ctx}");
        }
        assert!(sub_types(&u_got).is_empty(), "{ctx}");
        if row.c_gets && kind == "subscribed" {
            // §3.1.5: the approver's current presence follows.
            assert_eq!(presences(&c_got, None).len(), 1, "{ctx}");
        }
    }
    server.stop().await;
}

/// One row of an inbound table (A.3): the stanza arrives at `u`'s server
/// from `c` (injected at the router, as a contact's server would send it).
struct In {
    old: St,
    new: St,
    delivered: bool,
    push: bool,
}

fn inb(old: St, new: St, delivered: bool, push: bool) -> In {
    In {
        old,
        new,
        delivered,
        push,
    }
}

async fn inbound_table(table: &str, kind: &str, rows: Vec<In>) {
    let server = TestServer::start().await;
    for (i, row) in rows.iter().enumerate() {
        let (u, c) = (format!("u{table}y{i}"), format!("c{table}y{i}"));
        set_state(&server, &u, &c, row.old).await;
        let mut uc = login_full(&server, &u).await;
        sync(&mut uc).await;
        let el: Element = presence()
            .attr("xmlns", ns::CLIENT)
            .attr("from", &format!("{c}@localhost"))
            .to(&format!("{u}@localhost"))
            .ty(kind)
            .to_string()
            .parse()
            .unwrap();
        let stanza = starling_proto::Stanza::from_element(el).unwrap();
        server.server.env.route(stanza).await;
        let got = sync(&mut uc).await;
        let ctx = format!("A.3 {table} {kind} row {:?}: got {got:?}", row.old);
        assert_eq!(state_of(&server, &u, &c).await, row.new, "{ctx}");
        let subs = sub_types(&got);
        if row.delivered {
            assert_eq!(subs, vec![kind.to_owned()], "{ctx}");
        } else {
            assert!(subs.is_empty(), "{ctx}");
        }
        assert_eq!(!pushes(&got).is_empty(), row.push, "{ctx}");
        if row.delivered && row.push {
            // §3.1.6 / §3.2.3 step 1: the presence comes before the push.
            let p = got
                .iter()
                .position(|e| e.name() == "presence" && e.attr("type") == Some(kind));
            let q = got.iter().position(|e| e.name() == "iq");
            assert!(p < q, "{ctx}");
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a21_outbound_subscribe() {
    // RFC 6121 Appendix A.2.1, Table 2 (and §3.1.2); contact side per A.3.1.
    use St::*;
    outbound_table(
        "a21",
        "subscribe",
        vec![
            out(N, NPo, true, true, false),     // "None" → "None + Pending Out"
            out(NPo, NPo, false, false, false), // no state change; A.3.1 S.N. deliver
            out(NPi, NPoi, true, true, false),  // → "None + Pending Out+In"
            out(NPoi, NPoi, false, false, false),
            out(T, T, false, false, false), // contact auto-replies (A.3.1 [2])
            out(TPi, TPi, false, false, false),
            out(F, FPo, true, true, false), // → "From + Pending Out"
            out(FPo, FPo, false, false, false),
            out(B, B, false, false, false),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a22_outbound_unsubscribe() {
    // RFC 6121 Appendix A.2.2, Table 3 (§3.3.2); contact side per A.3.2 / §3.3.3.
    use St::*;
    outbound_table(
        "a22",
        "unsubscribe",
        vec![
            out(N, N, false, false, false),
            out(NPo, N, true, true, false), // "None + Pending Out" → "None"
            out(NPi, NPi, false, false, false),
            out(NPoi, NPi, true, true, false), // → "None + Pending In"
            out(T, N, true, true, true),       // "To" → "None"
            out(TPi, NPi, true, true, true),   // "To + Pending In" → "None + Pending In"
            out(F, F, false, false, false),
            out(FPo, F, true, true, false), // "From + Pending Out" → "From"
            out(B, F, true, true, true),    // "Both" → "From"
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a23_outbound_subscribed() {
    // RFC 6121 Appendix A.2.3, Table 4 (§3.1.5, pre-approval §3.4.2);
    // contact side per A.3.3 / §3.1.6.
    use St::*;
    outbound_table(
        "a23",
        "subscribed",
        vec![
            out(N, N, true, false, false), // M.N. route; pre-approval (push approved)
            out(NPo, NPo, true, false, false), // pre-approval
            out(NPi, F, true, true, true), // "None + Pending In" → "From"
            out(NPoi, FPo, true, true, true), // → "From + Pending Out"
            out(T, T, true, false, false), // pre-approval
            out(TPi, B, true, true, true), // "To + Pending In" → "Both"
            out(F, F, false, false, false), // M.N. route, no change
            out(FPo, FPo, false, false, false),
            out(B, B, false, false, false),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a24_outbound_unsubscribed() {
    // RFC 6121 Appendix A.2.4, Table 5 (§3.2.2); contact side per A.3.4 / §3.2.3.
    use St::*;
    outbound_table(
        "a24",
        "unsubscribed",
        vec![
            out(N, N, false, false, false), // S.N. route
            out(NPo, NPo, false, false, false),
            out(NPi, N, false, true, true), // denial: "None + Pending In" → "None"
            out(NPoi, NPo, false, true, true), // → "None + Pending Out"
            out(T, T, false, false, false),
            out(TPi, T, false, true, true), // "To + Pending In" → "To"
            out(F, N, true, true, true),    // cancellation: "From" → "None"
            out(FPo, NPo, true, true, true), // "From + Pending Out" → "None + Pending Out"
            out(B, T, true, true, true),    // "Both" → "To"
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a31_inbound_subscribe() {
    // RFC 6121 Appendix A.3.1, Table 6 (§3.1.3).
    use St::*;
    inbound_table(
        "a31",
        "subscribe",
        vec![
            inb(N, NPi, true, false),    // MUST deliver; "None + Pending In"
            inb(NPo, NPoi, true, false), // → "None + Pending Out+In"
            inb(NPi, NPi, false, false), // S.N. deliver
            inb(NPoi, NPoi, false, false),
            inb(T, TPi, true, false), // → "To + Pending In"
            inb(TPi, TPi, false, false),
            inb(F, F, false, false), // S.N. [2]: auto-reply subscribed
            inb(FPo, FPo, false, false),
            inb(B, B, false, false),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a32_inbound_unsubscribe() {
    // RFC 6121 Appendix A.3.2, Table 7 (§3.3.3).
    use St::*;
    inbound_table(
        "a32",
        "unsubscribe",
        vec![
            inb(N, N, false, false),
            inb(NPo, NPo, false, false),
            inb(NPi, N, true, false), // the request is withdrawn
            inb(NPoi, NPo, true, false),
            inb(T, T, false, false),
            inb(TPi, T, true, false),
            inb(F, N, true, true),
            inb(FPo, NPo, true, true),
            inb(B, T, true, true),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a33_inbound_subscribed() {
    // RFC 6121 Appendix A.3.3, Table 8 (§3.1.6).
    use St::*;
    inbound_table(
        "a33",
        "subscribed",
        vec![
            inb(N, N, false, false), // no pending out: ignored
            inb(NPo, T, true, true),
            inb(NPi, NPi, false, false),
            inb(NPoi, TPi, true, true),
            inb(T, T, false, false),
            inb(TPi, TPi, false, false),
            inb(F, F, false, false),
            inb(FPo, B, true, true),
            inb(B, B, false, false),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a34_inbound_unsubscribed() {
    // RFC 6121 Appendix A.3.4, Table 9 (§3.2.3).
    use St::*;
    inbound_table(
        "a34",
        "unsubscribed",
        vec![
            inb(N, N, false, false),
            inb(NPo, N, true, true),
            inb(NPi, NPi, false, false),
            inb(NPoi, NPi, true, true),
            inb(T, N, true, true),
            inb(TPi, NPi, true, true),
            inb(F, F, false, false),
            inb(FPo, F, true, true),
            inb(B, F, true, true),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------
// Subscription scenarios
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn full_handshake_both_ways() {
    // RFC 6121 §3.1.1–§3.1.6; Appendix A.2.1 row "None", A.3.1 row "None",
    // A.2.3 row "None + Pending In", A.3.3 row "None + Pending Out".
    let server = TestServer::start().await;
    let mut alice = login_full(&server, "alice").await;
    let mut bob = login_full(&server, "bob").await;
    alice
        .send("<presence to='bob@localhost' type='subscribe' id='s1'/>")
        .await;
    let a = sync(&mut alice).await;
    let item = push_item(pushes(&a)[0]);
    assert_eq!(
        (
            item.attr("jid"),
            item.attr("subscription"),
            item.attr("ask")
        ),
        (Some("bob@localhost"), Some("none"), Some("subscribe"))
    );
    let b = sync(&mut bob).await;
    assert_eq!(sub_types(&b), ["subscribe"]);
    let req = &b[0];
    assert_eq!(req.attr("from"), Some("alice@localhost"));
    assert_eq!(req.attr("id"), Some("s1"));
    // A.1 state 3: no item for a mere request.
    assert!(pushes(&b).is_empty());
    assert!(item_of(&server, "bob", "alice").await.is_none());

    bob.send("<presence to='alice@localhost' type='subscribed'/>")
        .await;
    let b = sync(&mut bob).await;
    let item = push_item(pushes(&b)[0]);
    assert_eq!(item.attr("subscription"), Some("from"));
    let a = sync(&mut alice).await;
    // §3.1.6: the approval, then the push, then bob's presence.
    assert_eq!(sub_types(&a), ["subscribed"]);
    assert_eq!(push_item(pushes(&a)[0]).attr("subscription"), Some("to"));
    assert_eq!(push_item(pushes(&a)[0]).attr("ask"), None);
    let p = presences(&a, None);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].attr("from"), Some(bob.jid.as_str()));

    // And back: bob subscribes, alice approves → both.
    bob.send("<presence to='alice@localhost' type='subscribe'/>")
        .await;
    sync(&mut bob).await;
    let a = sync(&mut alice).await;
    assert_eq!(sub_types(&a), ["subscribe"]);
    alice
        .send("<presence to='bob@localhost' type='subscribed'/>")
        .await;
    let a = sync(&mut alice).await;
    assert_eq!(push_item(pushes(&a)[0]).attr("subscription"), Some("both"));
    let b = sync(&mut bob).await;
    assert_eq!(push_item(pushes(&b)[0]).attr("subscription"), Some("both"));
    assert_eq!(
        presences(&b, None)[0].attr("from"),
        Some(alice.jid.as_str())
    );
    assert_eq!(state_of(&server, "alice", "bob").await, St::B);
    assert_eq!(state_of(&server, "bob", "alice").await, St::B);

    // Now presence flows both ways (§4.4).
    alice.send("<presence><show>away</show></presence>").await;
    sync(&mut alice).await;
    let b = sync(&mut bob).await;
    assert_eq!(
        text_of(presences(&b, None)[0], "show").as_deref(),
        Some("away")
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn offline_subscription_request_delivered_at_each_login_until_answered() {
    // RFC 6121 §3.1.3 rule 4.
    let server = TestServer::start().await;
    server.create_user("bob", "pw-bob").await;
    let mut alice = login_full(&server, "alice").await;
    alice
        .send(
            "<presence to='bob@localhost' type='subscribe'><status>it is alice</status></presence>",
        )
        .await;
    sync(&mut alice).await;
    for _ in 0..2 {
        let mut bob = server.login("bob").await;
        let got = sync(&mut bob).await;
        assert_eq!(sub_types(&got), ["subscribe"], "{got:?}");
        let req = got
            .iter()
            .find(|e| e.attr("type") == Some("subscribe"))
            .unwrap();
        assert_eq!(req.attr("from"), Some("alice@localhost"));
        // The complete stanza is kept, extended content included.
        assert_eq!(text_of(req, "status").as_deref(), Some("it is alice"));
        bob.close().await;
    }
    // Approved → no longer delivered; alice is now subscribed.
    let mut bob = server.login("bob").await;
    sync(&mut bob).await;
    bob.send("<presence to='alice@localhost' type='subscribed'/>")
        .await;
    sync(&mut bob).await;
    bob.close().await;
    let mut bob = server.login("bob").await;
    assert!(sub_types(&sync(&mut bob).await).is_empty());
    assert_eq!(state_of(&server, "alice", "bob").await, St::T);
    let a = sync(&mut alice).await;
    assert_eq!(sub_types(&a), ["subscribed"]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn subscription_requests_go_to_available_resources_only() {
    // RFC 6121 §3.1 implementation note, §3.1.3 rule 3: requests to
    // available resources; roster pushes to interested ones.
    let server = TestServer::start().await;
    let mut alice = login_full(&server, "alice").await;
    server.create_user("bob", "pw-bob").await;
    let mut bob_avail = server.login("bob").await;
    // Connected, interested, never available.
    let mut bob_conn = starling_testkit::Client::connect(server.starttls_addr()).await;
    bob_conn.negotiate_tls().await;
    bob_conn
        .auth(
            starling_proto::sasl::Mechanism::ScramSha256,
            "bob",
            "pw-bob",
        )
        .await
        .unwrap();
    bob_conn.bind(Some("quiet")).await;
    roster_get(&mut bob_conn).await;
    sync(&mut bob_avail).await;
    alice
        .send("<presence to='bob@localhost' type='subscribe'/>")
        .await;
    sync(&mut alice).await;
    assert_eq!(sub_types(&sync(&mut bob_avail).await), ["subscribe"]);
    assert!(sync(&mut bob_conn).await.is_empty());
    // Approving from the available one pushes to the interested one.
    bob_avail
        .send("<presence to='alice@localhost' type='subscribed'/>")
        .await;
    let avail = sync(&mut bob_avail).await;
    assert!(
        pushes(&avail).is_empty(),
        "bob_avail never asked for the roster: {avail:?}"
    );
    let quiet = sync(&mut bob_conn).await;
    assert_eq!(
        push_item(pushes(&quiet)[0]).attr("subscription"),
        Some("from")
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pre_approval_auto_answers_the_later_request() {
    // RFC 6121 §3.4: stream feature, approved flag, auto-reply (A.3.1 [1]).
    let server = TestServer::start().await;
    let mut alice = login_full(&server, "alice").await;
    let features = alice.features.clone().expect("post-auth features");
    assert!(features
        .get_child("sub", "urn:xmpp:features:pre-approval")
        .is_some());
    let mut bob = login_full(&server, "bob").await;
    alice
        .send("<presence to='bob@localhost' type='subscribed'/>")
        .await;
    let a = sync(&mut alice).await;
    let item = push_item(pushes(&a)[0]);
    assert_eq!(
        (item.attr("approved"), item.attr("subscription")),
        (Some("true"), Some("none"))
    );
    // §3.4.2 rule 4: not routed.
    assert!(sync(&mut bob).await.is_empty());
    bob.send("<presence to='alice@localhost' type='subscribe'/>")
        .await;
    let b = sync(&mut bob).await;
    // bob: push ask, then the auto-approval and push "to", then alice's presence.
    assert_eq!(sub_types(&b), ["subscribed"]);
    assert_eq!(
        push_item(pushes(&b).last().unwrap()).attr("subscription"),
        Some("to")
    );
    assert_eq!(
        presences(&b, None)[0].attr("from"),
        Some(alice.jid.as_str())
    );
    let a = sync(&mut alice).await;
    assert!(
        sub_types(&a).is_empty(),
        "request not delivered when pre-approved"
    );
    let item = push_item(pushes(&a)[0]);
    assert_eq!(
        (item.attr("approved"), item.attr("subscription")),
        (None, Some("from"))
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pre_approval_cancelled_by_unsubscribed() {
    // RFC 6121 §3.4 implementation note, A.2.4 [1]; not routed (§3.2.2 rule 2).
    let server = TestServer::start().await;
    let mut alice = login_full(&server, "alice").await;
    let mut bob = login_full(&server, "bob").await;
    alice
        .send("<presence to='bob@localhost' type='subscribed'/>")
        .await;
    sync(&mut alice).await;
    alice
        .send("<presence to='bob@localhost' type='unsubscribed'/>")
        .await;
    let a = sync(&mut alice).await;
    assert_eq!(push_item(pushes(&a)[0]).attr("approved"), None);
    assert!(sync(&mut bob).await.is_empty());
    assert!(!item_of(&server, "alice", "bob").await.unwrap().approved);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn subscription_spoofing_changes_nothing() {
    // RFC 6120 §8.1.2.1, RFC 6121 §3.1.2: the server stamps the user's bare
    // JID; A.2.3: "subscribed" to someone who never asked is only a
    // pre-approval; A.3.3: unsolicited "subscribed" is ignored.
    let server = TestServer::start().await;
    let mut mallory = login_full(&server, "mallory").await;
    let mut bob = login_full(&server, "bob").await;
    let _carol = login_full(&server, "carol").await;
    // Claims to be carol approving bob's (nonexistent) request.
    mallory
        .send("<presence from='carol@localhost' to='bob@localhost' type='subscribed'/>")
        .await;
    // Claims to be carol asking bob.
    mallory
        .send("<presence from='carol@localhost/x' to='bob@localhost' type='subscribe'/>")
        .await;
    sync(&mut mallory).await;
    let b = sync(&mut bob).await;
    assert_eq!(sub_types(&b), ["subscribe"]);
    assert_eq!(
        b[0].attr("from"),
        Some("mallory@localhost"),
        "stamped, not carol"
    );
    assert!(pushes(&b).is_empty());
    assert!(item_of(&server, "bob", "carol").await.is_none());
    assert!(item_of(&server, "carol", "bob").await.is_none());
    assert!(item_of(&server, "bob", "mallory").await.is_none());
    // mallory's "subscribed" only pre-approved bob on mallory's own roster.
    let m = item_of(&server, "mallory", "bob").await.unwrap();
    assert!(m.approved && m.subscription == starling_core::storage::Subscription::None);
    // bob never asked: mallory cannot push bob to "to".
    mallory
        .send("<presence to='bob@localhost' type='unsubscribed'/>")
        .await;
    sync(&mut mallory).await;
    assert!(sync(&mut bob).await.is_empty());
    assert_eq!(state_of(&server, "bob", "mallory").await, St::NPi);
    // A subscription presence to a full JID is treated as to the bare JID
    // and never delivered raw to that resource.
    mallory
        .send(&presence().to(&bob.jid).ty("unsubscribe").to_string())
        .await;
    sync(&mut mallory).await;
    let b = sync(&mut bob).await;
    assert_eq!(sub_types(&b), ["unsubscribe"], "request withdrawn (A.3.2)");
    assert_eq!(b[0].attr("to"), Some("bob@localhost"));
    assert_eq!(state_of(&server, "bob", "mallory").await, St::N);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn subscribe_to_unknown_local_account_pushed_then_unsubscribed() {
    // Regression (issue 9): a subscription request to a local account that
    // does not exist got an error and no roster push. RFC 6121 §3.1.2: the
    // user's server pushes the item (none + ask) to interested resources;
    // the contact's side (§3.1.3, §8.5.1) answers, like ejabberd and
    // Prosody, with `unsubscribed` from the contact's bare JID, which the
    // user's server processes per §3.2.3 / Appendix A.3.4: delivered, then
    // the pending ask cleared with a second push.
    let server = TestServer::start().await;
    let mut alice = login_full(&server, "alice").await;
    alice
        .send("<presence to='ghost@localhost' type='subscribe' id='g'/>")
        .await;
    let got = sync(&mut alice).await;
    assert!(
        got.iter().all(|e| e.attr("type") != Some("error")),
        "{got:?}"
    );
    let p = pushes(&got);
    assert_eq!(p.len(), 2, "{got:?}");
    let first = push_item(p[0]);
    assert_eq!(
        (
            first.attr("jid"),
            first.attr("subscription"),
            first.attr("ask")
        ),
        (Some("ghost@localhost"), Some("none"), Some("subscribe"))
    );
    let second = push_item(p[1]);
    assert_eq!(
        (second.attr("subscription"), second.attr("ask")),
        (Some("none"), None)
    );
    assert_eq!(sub_types(&got), ["unsubscribed"]);
    let refusal = presences(&got, Some("unsubscribed"))[0];
    assert_eq!(refusal.attr("from"), Some("ghost@localhost"));
    // Order: push (ask), the refusal, then the push that clears the ask.
    let pos = |e: &Element| got.iter().position(|x| std::ptr::eq(x, e)).unwrap();
    assert!(
        pos(p[0]) < pos(refusal) && pos(refusal) < pos(p[1]),
        "{got:?}"
    );
    // The item stays, with subscription none and no pending ask.
    let item = item_of(&server, "alice", "ghost").await.expect("item kept");
    assert_eq!((item.subscription, item.ask), (Subscription::None, false));
    // No account appeared and nothing was stored for the ghost.
    let ghost = bare("ghost");
    let storage = &server.server.env.storage;
    assert!(!storage.accounts.exists(&ghost).await.unwrap());
    assert!(storage
        .roster
        .pending_requests(&ghost)
        .await
        .unwrap()
        .is_empty());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn subscribe_to_remote_contact_fails() {
    // RFC 6121 §3.1.2: an error when the request cannot be routed (no s2s).
    let server = TestServer::start().await;
    let mut alice = login_full(&server, "alice").await;
    alice
        .send("<presence to='juliet@example.com' type='subscribe' id='r'/>")
        .await;
    let got = sync(&mut alice).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        error_condition(&got[0]).as_deref(),
        Some("remote-server-not-found")
    );
    let r = roster_get(&mut alice).await;
    assert_eq!(r.get_child("query", ROSTER).unwrap().children().count(), 0);
    server.stop().await;
}

// ---------------------------------------------------------------------------
// Roster get / set / remove / pushes (§2)
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn roster_set_pushes_to_interested_resources_only() {
    // RFC 6121 §2.1.3, §2.1.4 (empty roster), §2.3.2, §2.1.6, §2.2.
    let server = TestServer::start().await;
    let mut r1 = login_full(&server, "alice").await;
    let mut r2 = login_full(&server, "alice").await;
    let mut r3 = server.login("alice").await; // never asks for the roster
    sync(&mut r1).await;
    let empty = roster_get(&mut r1).await;
    let q = empty
        .get_child("query", ROSTER)
        .expect("empty query, not an error");
    assert_eq!(q.children().count(), 0);
    let res = r1
        .iq(
            "<iq type='set' id='a1'><query xmlns='jabber:iq:roster'><item jid='Nurse@Example.com' name='Nurse'><group>Servants</group></item></query></iq>",
            "a1",
        )
        .await;
    assert_eq!(res.attr("type"), Some("result"));
    for c in [&mut r1, &mut r2] {
        let got = sync(c).await;
        let p = pushes(&got);
        assert_eq!(p.len(), 1, "{got:?}");
        assert_eq!(p[0].attr("from"), None, "§2.1.6: from the account itself");
        let item = push_item(p[0]);
        assert_eq!(item.attr("jid"), Some("nurse@example.com"), "normalised");
        assert_eq!(item.attr("name"), Some("Nurse"));
        assert_eq!(item.attr("subscription"), Some("none"));
        assert_eq!(item.get_child("group", ROSTER).unwrap().text(), "Servants");
    }
    assert!(pushes(&sync(&mut r3).await).is_empty());
    // §2.4: update replaces groups and name atomically.
    r2.iq(
        "<iq type='set' id='a2'><query xmlns='jabber:iq:roster'><item jid='nurse@example.com'><group>A</group><group>B</group></item></query></iq>",
        "a2",
    )
    .await;
    sync(&mut r2).await;
    let got = sync(&mut r1).await;
    let item = push_item(pushes(&got)[0]);
    assert_eq!(item.attr("name"), None);
    assert_eq!(item.children().count(), 2);
    let full = roster_get(&mut r3).await;
    let items: Vec<_> = full
        .get_child("query", ROSTER)
        .unwrap()
        .children()
        .collect();
    assert_eq!(items.len(), 1);
    // r3 asked now: it is interested from here on (§2.2).
    sync(&mut r3).await;
    // §2.5: removal.
    let res = r1
        .iq(
            "<iq type='set' id='a3'><query xmlns='jabber:iq:roster'><item jid='nurse@example.com' subscription='remove'/></query></iq>",
            "a3",
        )
        .await;
    assert_eq!(res.attr("type"), Some("result"));
    for c in [&mut r1, &mut r2, &mut r3] {
        let got = sync(c).await;
        assert_eq!(
            push_item(pushes(&got)[0]).attr("subscription"),
            Some("remove")
        );
    }
    // §2.5.3: removing an unknown item.
    let res = r1
        .iq(
            "<iq type='set' id='a4'><query xmlns='jabber:iq:roster'><item jid='nurse@example.com' subscription='remove'/></query></iq>",
            "a4",
        )
        .await;
    assert_eq!(error_condition(&res).as_deref(), Some("item-not-found"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn roster_set_ignores_subscription_attributes() {
    // RFC 6121 §2.1.2.5, §2.1.5 rule 2, §2.1.2.1–2: 'subscription' other than
    // remove, 'ask' and 'approved' in a set are ignored.
    let server = TestServer::start().await;
    let mut alice = login_full(&server, "alice").await;
    let _bob = login_full(&server, "bob").await;
    let res = alice
        .iq(
            "<iq type='set' id='s'><query xmlns='jabber:iq:roster'><item jid='bob@localhost' subscription='both' ask='subscribe' approved='true'/></query></iq>",
            "s",
        )
        .await;
    assert_eq!(res.attr("type"), Some("result"));
    let item = item_of(&server, "alice", "bob").await.unwrap();
    assert_eq!(
        item.subscription,
        starling_core::storage::Subscription::None
    );
    assert!(!item.ask && !item.approved);
    assert!(item_of(&server, "bob", "alice").await.is_none());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn removing_a_contact_cancels_both_subscriptions() {
    // RFC 6121 §2.5.2 rules 1–3; contact side A.3.2 row "Both"→… and A.3.4.
    let server = TestServer::start().await;
    set_state(&server, "alice", "bob", St::B).await;
    let mut alice = login_full(&server, "alice").await;
    let mut bob = login_full(&server, "bob").await;
    sync(&mut alice).await;
    alice
        .iq(
            "<iq type='set' id='r'><query xmlns='jabber:iq:roster'><item jid='bob@localhost' subscription='remove'/></query></iq>",
            "r",
        )
        .await;
    sync(&mut alice).await;
    let b = sync(&mut bob).await;
    assert_eq!(sub_types(&b), ["unsubscribe", "unsubscribed"]);
    assert_eq!(
        presences(&b, Some("unavailable"))[0].attr("from"),
        Some(alice.jid.as_str())
    );
    assert_eq!(
        push_item(pushes(&b).last().unwrap()).attr("subscription"),
        Some("none")
    );
    assert!(item_of(&server, "alice", "bob").await.is_none());
    assert_eq!(state_of(&server, "bob", "alice").await, St::N);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_roster_sets_are_rejected_and_change_nothing() {
    // RFC 6121 §2.3.3 error cases; §2.1.3 (get with items).
    let server = TestServer::start().await;
    let mut alice = login_full(&server, "alice").await;
    let long = "x".repeat(2000);
    let cases = [
        // More than one item → bad-request.
        (
            "<item jid='a@localhost'/><item jid='b@localhost'/>".to_owned(),
            "bad-request",
        ),
        // No item → bad-request.
        (String::new(), "bad-request"),
        // Invalid JIDs → jid-malformed.
        ("<item jid='a@b@c'/>".to_owned(), "jid-malformed"),
        ("<item jid=''/>".to_owned(), "jid-malformed"),
        (
            "<item jid='bob@localhost/phone'/>".to_owned(),
            "jid-malformed",
        ),
        ("<item name='no jid'/>".to_owned(), "bad-request"),
        // Duplicate groups → bad-request.
        (
            "<item jid='a@localhost'><group>G</group><group>G</group></item>".to_owned(),
            "bad-request",
        ),
        // Empty group → not-acceptable.
        (
            "<item jid='a@localhost'><group></group></item>".to_owned(),
            "not-acceptable",
        ),
        // Oversized name and group → not-acceptable.
        (
            format!("<item jid='a@localhost' name='{long}'/>"),
            "not-acceptable",
        ),
        (
            format!("<item jid='a@localhost'><group>{long}</group></item>"),
            "not-acceptable",
        ),
        // The user's own JID → not-allowed (§2.3.3 interoperability note).
        ("<item jid='alice@localhost'/>".to_owned(), "not-allowed"),
    ];
    for (i, (items, cond)) in cases.iter().enumerate() {
        let id = format!("bad{i}");
        let r = alice
            .iq(
                &iq_set("", &id, &format!("<query xmlns='{ROSTER}'>{items}</query>")),
                &id,
            )
            .await;
        assert_eq!(error_condition(&r).as_deref(), Some(*cond), "{items}: {r}");
    }
    let r = alice
        .iq(
            "<iq type='get' id='g'><query xmlns='jabber:iq:roster'><item jid='a@localhost'/></query></iq>",
            "g",
        )
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("bad-request"));
    // Someone else's roster → forbidden (§2.3.3).
    let _bob = login_full(&server, "bob").await;
    for t in ["get", "set"] {
        let r = alice
            .iq(
                &iq(t, &format!("o{t}"))
                    .to("bob@localhost")
                    .child("<query xmlns='jabber:iq:roster'><item jid='a@localhost'/></query>")
                    .to_string(),
                &format!("o{t}"),
            )
            .await;
        assert_eq!(error_condition(&r).as_deref(), Some("forbidden"));
    }
    let got = sync(&mut alice).await;
    assert!(pushes(&got).is_empty());
    let r = roster_get(&mut alice).await;
    assert_eq!(r.get_child("query", ROSTER).unwrap().children().count(), 0);
    let r = server
        .server
        .env
        .storage
        .roster
        .get_roster(&bare("bob"))
        .await
        .unwrap();
    assert!(r.1.is_empty());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn roster_size_limit() {
    // [modules.roster] max_items: not-allowed with a text, for sets and for
    // subscription requests that would add an item.
    let server =
        TestServer::start_with(|c| c.modules.get_mut::<modules::Roster>().max_items = 2).await;
    let mut alice = login_full(&server, "alice").await;
    let _bob = login_full(&server, "bob").await;
    for j in ["a@localhost", "b@localhost"] {
        let r = alice
            .iq(
                &iq_set(
                    "",
                    j,
                    &format!("<query xmlns='{ROSTER}'><item jid='{j}'/></query>"),
                ),
                j,
            )
            .await;
        assert_eq!(r.attr("type"), Some("result"));
    }
    let r = alice
        .iq(
            "<iq type='set' id='c'><query xmlns='jabber:iq:roster'><item jid='c@localhost'/></query></iq>",
            "c",
        )
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("not-allowed"));
    let text = r
        .get_child("error", ns::CLIENT)
        .and_then(|e| e.get_child("text", ns::STANZAS))
        .map(|t| t.text())
        .unwrap();
    assert!(text.contains("at most 2"), "{text}");
    // Updating an existing item still works.
    let r = alice
        .iq(
            "<iq type='set' id='u'><query xmlns='jabber:iq:roster'><item jid='a@localhost' name='A'/></query></iq>",
            "u",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"));
    alice
        .send("<presence to='bob@localhost' type='subscribe' id='s'/>")
        .await;
    let got = sync(&mut alice).await;
    let err = got.iter().find(|e| e.name() == "presence").unwrap();
    assert_eq!(error_condition(err).as_deref(), Some("not-allowed"));
    assert_eq!(
        server
            .server
            .env
            .storage
            .roster
            .count(&bare("alice"))
            .await
            .unwrap(),
        2
    );
    assert!(item_of(&server, "bob", "alice").await.is_none());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn roster_versioning() {
    // RFC 6121 §2.6, XEP-0237.
    let server = TestServer::start().await;
    let mut alice = login_full(&server, "alice").await;
    assert!(alice
        .features
        .as_ref()
        .unwrap()
        .get_child("ver", "urn:xmpp:features:rosterver")
        .is_some());
    set_item(&mut alice, "a@localhost", "1").await;
    set_item(&mut alice, "b@localhost", "2").await;
    sync(&mut alice).await;
    let full = alice
        .iq(
            "<iq type='get' id='v0'><query xmlns='jabber:iq:roster' ver=''/></iq>",
            "v0",
        )
        .await;
    let q = full.get_child("query", ROSTER).unwrap();
    assert_eq!(q.children().count(), 2);
    let ver = q.attr("ver").unwrap().to_owned();
    // Same version → empty result (no query), no pushes.
    let r = alice
        .iq(
            &iq_get("", "v1", &format!("<query xmlns='{ROSTER}' ver='{ver}'/>")),
            "v1",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"));
    assert!(r.children().next().is_none(), "{r}");
    assert!(sync(&mut alice).await.is_empty());
    // Changes while "offline": one update, one addition, one removal.
    set_item(&mut alice, "c@localhost", "3").await;
    let r = alice
        .iq("<iq type='set' id='4'><query xmlns='jabber:iq:roster'><item jid='a@localhost' subscription='remove'/></query></iq>", "4")
        .await;
    assert_eq!(r.attr("type"), Some("result"));
    set_item(&mut alice, "c@localhost", "5").await;
    let live = sync(&mut alice).await;
    let last_live_ver = pushes(&live)
        .last()
        .unwrap()
        .get_child("query", ROSTER)
        .unwrap()
        .attr("ver")
        .unwrap()
        .to_owned();
    let mut later = login_full(&server, "alice").await;
    later
        .send(&iq_get(
            "",
            "v2",
            &format!("<query xmlns='{ROSTER}' ver='{ver}'/>"),
        ))
        .await;
    let got = sync(&mut later).await;
    assert_eq!(got[0].attr("id"), Some("v2"));
    assert!(got[0].children().next().is_none(), "empty result first");
    let p = pushes(&got);
    // Only the changed items, each once, oldest first; b is untouched.
    let items: Vec<_> = p
        .iter()
        .map(|e| {
            let i = push_item(e);
            (
                i.attr("jid").unwrap().to_owned(),
                i.attr("subscription").unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        items,
        [
            ("a@localhost".to_owned(), "remove".to_owned()),
            ("c@localhost".to_owned(), "none".to_owned())
        ]
    );
    let vers: Vec<u64> = p
        .iter()
        .map(|e| {
            e.get_child("query", ROSTER)
                .unwrap()
                .attr("ver")
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(
        vers.windows(2).all(|w| w[0] < w[1]),
        "unique, increasing: {vers:?}"
    );
    assert_eq!(vers.last().unwrap().to_string(), last_live_ver);
    // An unknown version → the full roster.
    let r = later
        .iq(
            "<iq type='get' id='v3'><query xmlns='jabber:iq:roster' ver='999999'/></iq>",
            "v3",
        )
        .await;
    assert_eq!(r.get_child("query", ROSTER).unwrap().children().count(), 2);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn versioning_off_means_no_ver_anywhere() {
    // RFC 6121 §2.6.1: the feature is advertised only when supported.
    let server =
        TestServer::start_with(|c| c.modules.get_mut::<modules::Roster>().versioning = false).await;
    let mut alice = login_full(&server, "alice").await;
    let f = alice.features.clone().unwrap();
    assert!(f.get_child("ver", "urn:xmpp:features:rosterver").is_none());
    set_item(&mut alice, "a@localhost", "1").await;
    let got = sync(&mut alice).await;
    assert_eq!(
        pushes(&got)[0]
            .get_child("query", ROSTER)
            .unwrap()
            .attr("ver"),
        None
    );
    let r = roster_get(&mut alice).await;
    assert_eq!(r.get_child("query", ROSTER).unwrap().attr("ver"), None);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn roster_disabled_registers_nothing() {
    // ARCHITECTURE.md invariant 1: a disabled module runs no code.
    let server =
        TestServer::start_with(|c| c.modules.get_mut::<modules::Roster>().enabled = false).await;
    let mut alice = server.login("alice").await;
    let f = alice.features.clone().unwrap();
    assert!(f
        .get_child("sub", "urn:xmpp:features:pre-approval")
        .is_none());
    let r = alice
        .iq(
            "<iq type='get' id='g'><query xmlns='jabber:iq:roster'/></iq>",
            "g",
        )
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("service-unavailable"));
    server.stop().await;
}

/// Both users of a pair ask and approve at the same instant (what two
/// people adding each other do): every pair ends `both` on both sides,
/// never one side `to` and the other `both` (a lost update between the
/// user's own change and the contact's arriving one, RFC 6121 Appendix
/// A.2/A.3 applied to one item by two tasks at once). A regression test
/// for what `starling-bench pep`'s setup hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn simultaneous_mutual_subscriptions_end_both_on_both_sides() {
    let server = TestServer::start().await;
    let pairs = 24;
    let mut clients = Vec::new();
    for i in 0..pairs {
        let mut a = server.login(&format!("ra{i}")).await;
        let mut b = server.login(&format!("rb{i}")).await;
        a.send("<presence/>").await;
        b.send("<presence/>").await;
        clients.push((a, b));
    }
    // Everyone asks at once, then everyone approves at once.
    for step in ["subscribe", "subscribed"] {
        let mut sends = Vec::new();
        for (i, (a, b)) in clients.iter_mut().enumerate() {
            let (ja, jb) = (format!("ra{i}@localhost"), format!("rb{i}@localhost"));
            sends.push(async move {
                let (to_b, to_a) = (
                    presence().to(&jb).ty(step).to_string(),
                    presence().to(&ja).ty(step).to_string(),
                );
                tokio::join!(a.send(&to_b), b.send(&to_a));
            });
        }
        futures_util::future::join_all(sends).await;
        // Every session handled what it sent (its ping is answered after),
        // then what was routed to it, then what that routed back.
        for _ in 0..3 {
            futures_util::future::join_all(
                clients
                    .iter_mut()
                    .flat_map(|(a, b)| [a.barrier(), b.barrier()]),
            )
            .await;
        }
    }
    let roster = server.server.env.storage.roster.clone();
    let mut wrong = Vec::new();
    for i in 0..pairs {
        for (me, them) in [
            (format!("ra{i}"), format!("rb{i}")),
            (format!("rb{i}"), format!("ra{i}")),
        ] {
            let owner = starling_proto::BareJid::new(&format!("{me}@localhost")).unwrap();
            let contact = starling_proto::BareJid::new(&format!("{them}@localhost")).unwrap();
            let item = roster.get_item(&owner, &contact).await.unwrap();
            let state = item.as_ref().map(|i| (i.subscription, i.ask, i.pending_in));
            if state != Some((Subscription::Both, false, false)) {
                wrong.push(format!("{me} → {them}: {state:?}"));
            }
        }
    }
    assert!(wrong.is_empty(), "lost updates: {wrong:#?}");
    server.stop().await;
}
