//! Per-account limits over real sockets (issue 31), with small configured
//! limits so the tests run fast: resources per account (RFC 6120 §7.6.2.1
//! `<resource-constraint/>` on bind and Bind 2, a detached
//! stream-management session giving way first, resumption never blocked),
//! group-chat rooms per user and per service, a flood of archive queries
//! from one session, and the PEP storage quota per account.

use starling_core::SessionTransport;
use starling_proto::sasl::Mechanism;
use starling_testkit::stanza::{empty, iq_get, iq_set, msg, presence};
use starling_testkit::starling_xml::Element;
use starling_testkit::{error_condition, eventually, ns, Client, TestServer};
use std::time::Duration;

const SM: &str = "urn:xmpp:sm:3";
const NS_BIND2: &str = "urn:xmpp:bind:0";
/// Failure bound for waiting on the server's view of a dropped connection.
const BOUND: Duration = Duration::from_secs(10);

/// A new stream authenticated as `user` (who must exist), not bound.
async fn authenticated(server: &TestServer, user: &str) -> Client {
    let mut c = Client::connect(server.starttls_addr()).await;
    c.negotiate_tls().await;
    c.auth(Mechanism::ScramSha256, user, &format!("pw-{user}"))
        .await
        .expect("login succeeds");
    c
}

/// Sends a bind request and returns the server's answer.
async fn try_bind(c: &mut Client, resource: &str) -> Element {
    c.iq(
        &format!(
            "<iq type='set' id='b'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'><resource>{resource}</resource></bind></iq>"
        ),
        "b",
    )
    .await
}

/// Waits until the server counts `n` detached sessions (it noticed a
/// dropped connection); `BOUND` is only the failure bound.
async fn until_detached(server: &TestServer, n: i64) {
    let gauge = server
        .server
        .env
        .metrics
        .sessions_on(SessionTransport::Detached)
        .clone();
    eventually(
        "the server noticed the dropped connection",
        BOUND,
        async || (gauge.get() == n).then_some(()),
    )
    .await;
}

async fn enable_resume(c: &mut Client) -> String {
    c.send(&format!("<enable xmlns='{SM}' resume='true'/>"))
        .await;
    // (Presences of the account's other resources may come first.)
    let el = c
        .recv_until(|e| e.is("enabled", SM) || e.is("failed", SM))
        .await;
    assert!(el.is("enabled", SM), "expected <enabled/>, got {el}");
    el.attr("id").expect("resumption id").to_owned()
}

fn body(m: &Element) -> String {
    m.get_child("body", ns::CLIENT)
        .map(|b| b.text())
        .unwrap_or_default()
}

#[tokio::test]
async fn bind_beyond_max_resources_per_account_gets_resource_constraint() {
    let server = TestServer::start_with(|c| c.c2s.max_resources_per_account = 2).await;
    let _a1 = server.login("alice").await;
    let a2 = server.login("alice").await;
    let mut a3 = authenticated(&server, "alice").await;
    let err = try_bind(&mut a3, "third").await;
    assert_eq!(err.attr("type"), Some("error"), "{err}");
    assert_eq!(
        error_condition(&err).as_deref(),
        Some("resource-constraint")
    );
    let e = err.get_child("error", ns::CLIENT).unwrap();
    // RFC 6120 §7.6.2.1: type wait, and the text says what to do.
    assert_eq!(e.attr("type"), Some("wait"), "{err}");
    assert!(err.to_string().contains("close one of them"), "{err}");
    // The stream stays open: once one resource leaves, the bind works.
    a2.close().await;
    // (a2's end may still be on its way to the session table: ask again
    // until it is, within the failure bound.)
    let ok = eventually(
        "the bind succeeds once a resource left",
        BOUND,
        async || {
            let ok = try_bind(&mut a3, "third").await;
            (ok.attr("type") == Some("result")).then_some(ok)
        },
    )
    .await;
    assert_eq!(ok.attr("type"), Some("result"), "{ok}");
    // Other accounts are not affected.
    let _b = server.login("bob").await;
    let refused = server
        .server
        .env
        .metrics
        .encode()
        .lines()
        .find_map(|l| {
            l.strip_prefix("starling_limit_refusals_total{limit=\"max_resources_per_account\"} ")
                .map(|n| n.trim().parse::<f64>().unwrap() >= 1.0)
        })
        .unwrap_or(false);
    assert!(refused, "the refusal is counted");
    server.stop().await;
}

#[tokio::test]
async fn bind_of_a_held_resource_at_the_limit_replaces_it() {
    let server = TestServer::start_with(|c| c.c2s.max_resources_per_account = 1).await;
    let mut a1 = server.login("alice").await;
    let resource = a1.jid.rsplit('/').next().unwrap().to_owned();
    let mut a2 = authenticated(&server, "alice").await;
    // RFC 6120 §7.7.2.2: the same full JID replaces, it adds nothing.
    let ok = try_bind(&mut a2, &resource).await;
    assert_eq!(ok.attr("type"), Some("result"), "{ok}");
    a1.expect_stream_error("conflict").await;
    server.stop().await;
}

#[tokio::test]
async fn bind2_beyond_max_resources_per_account_ends_with_resource_constraint() {
    let server = TestServer::start_with(|c| c.c2s.max_resources_per_account = 1).await;
    let _a1 = server.login("alice").await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.negotiate_tls().await;
    let got = c
        .auth_sasl2(
            Mechanism::ScramSha256,
            "alice",
            "pw-alice",
            &format!("<bind xmlns='{NS_BIND2}'><tag>Second</tag></bind>"),
        )
        .await;
    // Inside SASL2 there is no iq to fail: the stream ends with the
    // condition, as for the domain's session limit.
    let Err(el) = got else {
        panic!("bind 2 beyond the limit succeeded")
    };
    assert!(el.is("error", ns::STREAMS), "{el}");
    assert!(
        el.has_child("resource-constraint", ns::STREAM_ERRORS),
        "{el}"
    );
    server.stop().await;
}

#[tokio::test]
async fn bind_at_the_limit_evicts_the_longest_detached_session_and_reroutes_its_unacked() {
    let server = TestServer::start_with(|c| c.c2s.max_resources_per_account = 2).await;
    let mut bob = server.login("bob").await;
    let mut a1 = server.login("alice").await;
    let mut a2 = server.login("alice").await;
    enable_resume(&mut a1).await;
    let full1 = a1.jid.clone();
    bob.send(&msg(&full1).chat().id("u1").body("unacked").to_string())
        .await;
    assert_eq!(body(&a1.recv_message().await), "unacked"); // never acked
    drop(a1); // the phone lost its connection
    until_detached(&server, 1).await;
    // A third device logs in: the detached session gives way, not the
    // owner. Its unacknowledged message goes to the resource still online
    // (as on a resumption timeout).
    let _a3 = server.login("alice").await;
    let m = a2.recv_message().await;
    assert_eq!(body(&m), "unacked");
    until_detached(&server, 0).await;
    assert_eq!(
        server
            .server
            .env
            .sessions
            .resources(&starling_proto::BareJid::new("alice@localhost").unwrap())
            .len(),
        2
    );
    server.stop().await;
}

#[tokio::test]
async fn resume_at_the_limit_is_not_blocked() {
    let server = TestServer::start_with(|c| c.c2s.max_resources_per_account = 2).await;
    let mut a1 = server.login("alice").await;
    let _a2 = server.login("alice").await;
    let previd = enable_resume(&mut a1).await;
    drop(a1);
    until_detached(&server, 1).await;
    // The resumed session replaces its own detached one: not a new
    // resource, so the full account still gets it back.
    let mut again = authenticated(&server, "alice").await;
    again
        .send(&format!("<resume xmlns='{SM}' previd='{previd}' h='0'/>"))
        .await;
    let r = again
        .recv_until(|e| e.is("resumed", SM) || e.is("failed", SM))
        .await;
    assert!(r.is("resumed", SM), "{r}");
    until_detached(&server, 0).await;
    server.stop().await;
}

// ----- group-chat rooms per user (XEP-0045 at conference.localhost) -----

const MUC: &str = "http://jabber.org/protocol/muc";
const MUC_OWNER: &str = "http://jabber.org/protocol/muc#owner";

/// Sends the presence that creates (or enters) `room` and returns the
/// answer that ends it: the subject message, or an error presence.
async fn create_room(c: &mut Client, room: &str) -> Element {
    c.send(
        &presence()
            .to(&format!("{room}@conference.localhost/nick"))
            .child(&empty("x", MUC))
            .to_string(),
    )
    .await;
    c.recv_until(|e| {
        (e.name() == "message" && e.has_child("subject", ns::CLIENT))
            || (e.name() == "presence" && e.attr("type") == Some("error"))
    })
    .await
}

async fn leave_room(c: &mut Client, room: &str) {
    let occupant = format!("{room}@conference.localhost/nick");
    c.send(&presence().to(&occupant).ty("unavailable").to_string())
        .await;
    // The room routes this after it handled the leave (and ended).
    c.recv_until(|e| {
        e.name() == "presence"
            && e.attr("type") == Some("unavailable")
            && e.attr("from") == Some(occupant.as_str())
    })
    .await;
}

async fn make_persistent(c: &mut Client, room: &str) {
    let r = c
        .iq(
            &iq_set(
                &format!("{room}@conference.localhost"),
                "cfg",
                &format!("<query xmlns='{MUC_OWNER}'><x xmlns='jabber:x:data' type='submit'><field var='FORM_TYPE'><value>http://jabber.org/protocol/muc#roomconfig</value></field><field var='muc#roomconfig_persistentroom'><value>1</value></field></x></query>"),
            ),
            "cfg",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
}

#[tokio::test]
async fn muc_rooms_per_user_count_temporary_and_persistent_and_free_on_destroy() {
    let server = TestServer::start_with(|c| {
        let m = c.modules.get_mut::<starling_server::modules::Muc>();
        m.max_rooms_per_user = 2;
        m.max_temporary_rooms = 3;
    })
    .await;
    let mut alice = server.login("alice").await;
    // Two temporary rooms (one still locked): the third is refused.
    assert!(create_room(&mut alice, "r1").await.name() == "message");
    assert!(create_room(&mut alice, "r2").await.name() == "message");
    let refused = create_room(&mut alice, "r3").await;
    assert_eq!(
        error_condition(&refused).as_deref(),
        Some("not-allowed"),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("(2)"),
        "says the limit: {refused}"
    );
    // Emptying a temporary room ends it and frees its place.
    leave_room(&mut alice, "r1").await;
    assert_eq!(create_room(&mut alice, "r3").await.name(), "message");
    // A room made persistent is counted from storage instead: still two.
    make_persistent(&mut alice, "r2").await;
    let refused = create_room(&mut alice, "r4").await;
    assert_eq!(error_condition(&refused).as_deref(), Some("not-allowed"));
    // Other users are not affected, up to the service's bound on rooms
    // only memory holds (r3 and two of bob's; r2 is stored).
    let mut bob = server.login("bob").await;
    assert_eq!(create_room(&mut bob, "b1").await.name(), "message");
    assert_eq!(create_room(&mut bob, "b2").await.name(), "message");
    let mut carol = server.login("carol").await;
    let full = create_room(&mut carol, "c1").await;
    assert_eq!(
        error_condition(&full).as_deref(),
        Some("resource-constraint"),
        "{full}"
    );
    server.stop().await;
}

// ----- iqs in flight per session -----

const MAM: &str = "urn:xmpp:mam:2";

fn mam_query(id: &str, max: u32) -> String {
    iq_set(
        "",
        id,
        &format!("<query xmlns='{MAM}' queryid='{id}'><set xmlns='http://jabber.org/protocol/rsm'><max>{max}</max></set></query>"),
    )
}

#[tokio::test]
async fn iq_flood_of_archive_queries_runs_one_at_a_time_and_others_are_answered_promptly() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    for i in 0..20 {
        alice
            .send(
                &msg("bob@localhost")
                    .chat()
                    .id(&format!("m{i}"))
                    .body(&format!("m{i}"))
                    .to_string(),
            )
            .await;
    }
    // A barrier: bob got them all, so all are archived for both.
    for _ in 0..20 {
        bob.recv_message().await;
    }
    // alice fires 300 archive queries in one write and reads nothing: a
    // session's iqs to the server's handlers run one at a time in its own
    // task (the rest wait unread in its socket), so at most one of them
    // holds a database connection.
    const FLOOD: usize = 300;
    let mut flood = String::new();
    for i in 0..FLOOD {
        flood.push_str(&mam_query(&format!("f{i}"), 20));
    }
    alice.send(&flood).await;
    // Meanwhile bob's own query is answered at once.
    let started = std::time::Instant::now();
    let bodies = bob.archived_bodies().await;
    let took = started.elapsed();
    assert_eq!(bodies.len(), 20);
    assert!(
        took < Duration::from_secs(1),
        "another user's archive query took {took:?} during the flood"
    );
    // alice's queries are all answered, in order, none lost.
    let mut next = 0;
    while next < FLOOD {
        let el = alice.recv().await;
        if el.name() == "iq" {
            assert_eq!(el.attr("id"), Some(format!("f{next}").as_str()), "{el}");
            assert_eq!(el.attr("type"), Some("result"), "{el}");
            next += 1;
        }
    }
    server.stop().await;
}

// ----- PEP storage per account -----

const PUBSUB: &str = "http://jabber.org/protocol/pubsub";
const PUBSUB_ERRORS: &str = "http://jabber.org/protocol/pubsub#errors";

/// Publishes item `id` of about 1 KB to the account's node `node`.
async fn publish_kb(c: &mut Client, node: &str, id: &str) -> Element {
    let data = "a".repeat(1000);
    c.iq(
        &iq_set(
            "",
            "pub",
            &format!("<pubsub xmlns='{PUBSUB}'><publish node='{node}'><item id='{id}'><data xmlns='urn:example:quota'>{data}</data></item></publish></pubsub>"),
        ),
        "pub",
    )
    .await
}

async fn item_count(c: &mut Client, node: &str) -> usize {
    let r = c
        .iq(
            &iq_get(
                "",
                "items",
                &format!("<pubsub xmlns='{PUBSUB}'><items node='{node}'/></pubsub>"),
            ),
            "items",
        )
        .await;
    r.get_child("pubsub", PUBSUB)
        .and_then(|p| p.get_child("items", PUBSUB))
        .map_or(0, |i| i.children().filter(|c| c.name() == "item").count())
}

#[tokio::test]
async fn pep_publish_over_max_bytes_per_user_is_refused_and_retract_frees_it() {
    let server = TestServer::start_with(|c| {
        c.modules
            .get_mut::<starling_server::modules::Pep>()
            .max_bytes_per_user = 2500;
    })
    .await;
    let mut alice = server.login("alice").await;
    for node in ["n1", "n2"] {
        let ok = publish_kb(&mut alice, node, "x").await;
        assert_eq!(ok.attr("type"), Some("result"), "{ok}");
    }
    // A third KB passes the quota: refused, and nothing stored (not even
    // the node it would have created).
    let refused = publish_kb(&mut alice, "n3", "x").await;
    assert_eq!(
        error_condition(&refused).as_deref(),
        Some("not-acceptable"),
        "{refused}"
    );
    let e = refused.get_child("error", ns::CLIENT).unwrap();
    assert!(e.has_child("payload-too-big", PUBSUB_ERRORS), "{refused}");
    assert!(refused.to_string().contains("of 2500 bytes"), "{refused}");
    let missing = alice
        .iq(
            &iq_get(
                "",
                "items",
                &format!("<pubsub xmlns='{PUBSUB}'><items node='n3'/></pubsub>"),
            ),
            "items",
        )
        .await;
    assert_eq!(error_condition(&missing).as_deref(), Some("item-not-found"));
    // Replacing an item counts the new payload instead of the old one.
    let ok = publish_kb(&mut alice, "n1", "x").await;
    assert_eq!(ok.attr("type"), Some("result"), "{ok}");
    // Retracting frees its bytes.
    let r = alice
        .iq(
            &iq_set(
                "",
                "ret",
                &format!(
                    "<pubsub xmlns='{PUBSUB}'><retract node='n2'><item id='x'/></retract></pubsub>"
                ),
            ),
            "ret",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let ok = publish_kb(&mut alice, "n3", "x").await;
    assert_eq!(ok.attr("type"), Some("result"), "{ok}");
    assert_eq!(item_count(&mut alice, "n3").await, 1);
    // Another account has its own quota.
    let mut bob = server.login("bob").await;
    let ok = publish_kb(&mut bob, "n1", "x").await;
    assert_eq!(ok.attr("type"), Some("result"), "{ok}");
    server.stop().await;
}

// ----- directed presence per session -----

/// An iq round trip to the server: everything routed to `c` before it
/// was handled has arrived. Returns what arrived meanwhile.
async fn barrier(c: &mut Client) -> Vec<Element> {
    c.send("<iq type='get' id='sync'><ping xmlns='urn:xmpp:ping'/></iq>")
        .await;
    let mut seen = Vec::new();
    loop {
        let el = c.recv().await;
        if el.name() == "iq" && el.attr("id") == Some("sync") {
            return seen;
        }
        seen.push(el);
    }
}

fn unavailable_from(seen: &[Element], from: &str) -> usize {
    seen.iter()
        .filter(|e| e.name() == "presence" && e.attr("type") == Some("unavailable"))
        .filter(|e| e.attr("from") == Some(from))
        .count()
}

#[tokio::test]
async fn directed_presence_beyond_max_directed_per_session_is_delivered_but_not_remembered() {
    let server = TestServer::start_with(|c| {
        c.modules
            .get_mut::<starling_server::modules::Presence>()
            .max_directed_per_session = 1;
    })
    .await;
    let mut dave = server.login("dave").await;
    let mut carol = server.login("carol").await;
    let mut alice = server.login("alice").await;
    alice.send("<presence to='dave@localhost'/>").await;
    alice.send("<presence to='carol@localhost'/>").await;
    barrier(&mut alice).await;
    // Both got it (delivery is not limited)…
    for c in [&mut dave, &mut carol] {
        let seen = barrier(c).await;
        assert!(
            seen.iter()
                .any(|e| e.name() == "presence" && e.attr("from") == Some(alice.jid.as_str())),
            "{seen:?}"
        );
    }
    // …but only the first is remembered and told when alice goes away.
    let jid = alice.jid.clone();
    alice.send("<presence type='unavailable'/>").await;
    barrier(&mut alice).await;
    assert_eq!(unavailable_from(&barrier(&mut dave).await, &jid), 1);
    assert_eq!(unavailable_from(&barrier(&mut carol).await, &jid), 0);
    server.stop().await;
}

// ----- the pubsub service's storage per node owner -----

#[tokio::test]
async fn pubsub_publish_over_max_bytes_per_owner_is_refused_and_retract_frees_it() {
    let server = TestServer::start_with(|c| {
        let p = c.modules.get_mut::<starling_server::modules::Pubsub>();
        p.enabled = true;
        p.max_bytes_per_owner = 2500;
    })
    .await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let publish = |node: &str, id: &str| {
        let data = "a".repeat(1000);
        iq_set(
            "pubsub.localhost",
            "pub",
            &format!("<pubsub xmlns='{PUBSUB}'><publish node='{node}'><item id='{id}'><data xmlns='urn:example:quota'>{data}</data></item></publish></pubsub>"),
        )
    };
    // alice's nodes (created by publishing) hold two KB.
    for node in ["a1", "a2"] {
        let ok = alice.iq(&publish(node, "x"), "pub").await;
        assert_eq!(ok.attr("type"), Some("result"), "{ok}");
    }
    let refused = alice.iq(&publish("a1", "y"), "pub").await;
    assert_eq!(
        error_condition(&refused).as_deref(),
        Some("not-acceptable"),
        "{refused}"
    );
    let e = refused.get_child("error", ns::CLIENT).unwrap();
    assert!(e.has_child("payload-too-big", PUBSUB_ERRORS), "{refused}");
    // Replacing an item fits; bob's own nodes have their own quota.
    let ok = alice.iq(&publish("a1", "x"), "pub").await;
    assert_eq!(ok.attr("type"), Some("result"), "{ok}");
    let ok = bob.iq(&publish("b1", "x"), "pub").await;
    assert_eq!(ok.attr("type"), Some("result"), "{ok}");
    // Retracting frees the owner's bytes.
    let r = alice
        .iq(
            &iq_set(
                "pubsub.localhost",
                "ret",
                &format!(
                    "<pubsub xmlns='{PUBSUB}'><retract node='a2'><item id='x'/></retract></pubsub>"
                ),
            ),
            "ret",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let ok = alice.iq(&publish("a1", "y"), "pub").await;
    assert_eq!(ok.attr("type"), Some("result"), "{ok}");
    server.stop().await;
}
