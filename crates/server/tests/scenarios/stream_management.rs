//! XEP-0198 Stream Management over real sockets: the feature and its
//! order rules (§3), ack counting (§4), `h` too high (§6), resumption with
//! the unacknowledged stanzas retransmitted exactly once (§5), resumption
//! refused for unknown or someone else's ids, the old connection replaced,
//! and what becomes of unacknowledged messages when a session ends for good
//! (§4: another resource or offline storage, archived once).

use starling_core::SessionTransport;
use starling_proto::sasl::Mechanism;
use starling_server::modules;
use starling_testkit::stanza::iq_get;
use starling_testkit::stanza::msg;
use starling_testkit::starling_xml::Element;
use starling_testkit::{
    error_condition, eventually, free_port, ns, write_binary_config, Client, Event, TestServer,
};
use std::time::Duration;

const SM: &str = "urn:xmpp:sm:3";
/// Failure bound for waiting on a server-side effect.
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

/// Skips the server's ack requests (`<r/>`), answering none.
async fn recv_skipping_r(c: &mut Client) -> Element {
    c.recv_until(|e| !e.is("r", SM)).await
}

async fn enable(c: &mut Client, attrs: &str) -> Element {
    c.send(&format!("<enable xmlns='{SM}' {attrs}/>")).await;
    let el = recv_skipping_r(c).await;
    assert!(el.is("enabled", SM), "expected <enabled/>, got {el}");
    el
}

async fn message(c: &mut Client, to: &str, body: &str) {
    c.send(&msg(to).chat().id(body).body(body).to_string())
        .await;
}

fn body(m: &Element) -> String {
    m.get_child("body", ns::CLIENT)
        .map(|b| b.text())
        .unwrap_or_default()
}

/// Asks for an ack and returns its `h`.
async fn ack(c: &mut Client) -> u32 {
    c.send(&format!("<r xmlns='{SM}'/>")).await;
    let a = c.recv_until(|e| e.is("a", SM)).await;
    a.attr("h").unwrap().parse().unwrap()
}

/// An `<r/>` → `<a/>` round trip, a barrier on the session like
/// [`Client::barrier`] (the session writes what was routed to it before
/// it reads the `<r/>`, and answers it in order) whose answer is no
/// stanza: it adds nothing to acknowledge and brings no ack request.
/// Returns what arrived before the `<a/>`, and its `h`.
async fn sm_barrier(c: &mut Client) -> (Vec<Element>, u32) {
    c.send(&format!("<r xmlns='{SM}'/>")).await;
    let mut before = Vec::new();
    loop {
        let el = c.recv().await;
        if el.is("a", SM) {
            return (before, el.attr("h").unwrap().parse().unwrap());
        }
        before.push(el);
    }
}

/// [`sm_barrier`], asserting that nothing arrived before the `<a/>`;
/// returns its `h`.
async fn sm_expect_nothing(c: &mut Client) -> u32 {
    let (before, h) = sm_barrier(c).await;
    assert!(
        before.is_empty(),
        "expected nothing before <a/>, got: {}",
        before
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    h
}

/// Waits until `cond` holds: a server-side effect no client sees;
/// panics after [`BOUND`].
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut cond: impl FnMut() -> F) {
    eventually(what, BOUND, async || cond().await.then_some(())).await;
}

/// Waits until the server counts `n` detached sessions (it noticed a
/// dropped connection of a resumable session).
async fn until_detached(server: &TestServer, n: i64) {
    let gauge = server
        .server
        .env
        .metrics
        .sessions_on(SessionTransport::Detached);
    until("the server noticed the dropped connection", || async {
        gauge.get() == n
    })
    .await;
}

/// Waits until alice's offline queue holds `n` messages.
async fn until_offline(server: &TestServer, n: u64) {
    let alice = &starling_proto::BareJid::new("alice@localhost").unwrap();
    let offline = &server.server.env.storage.offline;
    until(&format!("alice's offline queue holds {n}"), || async move {
        offline.count(alice).await.unwrap() == n
    })
    .await;
}

#[tokio::test]
async fn feature_after_auth_enable_order_and_acks_count_stanzas() {
    // Ack requests come quickly here (the policy has its own test).
    let server = TestServer::start_with(|c| {
        c.modules
            .get_mut::<modules::StreamManagement>()
            .request_ack_delay_ms = 50
    })
    .await;
    let mut bob = server.login("bob").await;
    let alice = server.login("alice").await;
    alice.close().await;

    let mut a = authenticated(&server, "alice").await;
    // §3: offered after authentication.
    let features = a.features.clone().unwrap();
    assert!(features.has_child("sm", SM), "{features}");
    // §3: <enable/> before resource binding fails.
    a.send(&format!("<enable xmlns='{SM}'/>")).await;
    let f = a.recv().await;
    assert!(f.is("failed", SM), "{f}");
    assert!(f.has_child("unexpected-request", ns::STANZAS), "{f}");
    a.bind(None).await;
    let enabled = enable(&mut a, "").await;
    assert!(
        enabled.attr("id").is_none(),
        "no resumption asked: {enabled}"
    );
    assert!(enabled.attr("resume").is_none(), "{enabled}");
    // A second <enable/> fails too (as ejabberd and Prosody answer it).
    a.send(&format!("<enable xmlns='{SM}'/>")).await;
    let f = recv_skipping_r(&mut a).await;
    assert!(f.is("failed", SM), "{f}");

    // §4: h counts the stanzas handled since <enable/>.
    assert_eq!(ack(&mut a).await, 0);
    a.send("<presence/>").await;
    message(&mut a, "bob@localhost", "one").await;
    a.send("<iq type='get' id='p1' to='localhost'><ping xmlns='urn:xmpp:ping'/></iq>")
        .await;
    a.send(&format!("<r xmlns='{SM}'/>")).await;
    // The server counts what it sends (presence echo, ping result…) and
    // asks for an ack of it: one <r/> while none is answered.
    let mut received = 0u32;
    let mut asked = 0;
    let h = loop {
        let el = a.recv().await;
        if el.is("a", SM) {
            break el.attr("h").unwrap().parse::<u32>().unwrap();
        }
        if el.is("r", SM) {
            asked += 1;
        } else if el.ns() == ns::CLIENT {
            received += 1;
        }
    };
    assert_eq!(h, 3, "presence, message and ping were handled");
    assert_eq!(body(&bob.recv_message().await), "one");
    message(&mut bob, &a.jid.clone(), "to-alice").await;
    let tally = |els: Vec<Element>, received: &mut u32, asked: &mut u32| {
        for el in els {
            if el.is("r", SM) {
                *asked += 1;
            } else if el.ns() == ns::CLIENT {
                if el.name() == "message" {
                    assert_eq!(body(&el), "to-alice");
                }
                *received += 1;
            }
        }
    };
    // Bob's message is routed once his ping is answered; alice's ack round
    // trip then brings everything routed to her before it.
    bob.barrier().await;
    tally(sm_barrier(&mut a).await.0, &mut received, &mut asked);
    // The server's request comes once the oldest unacknowledged stanza is
    // request_ack_delay_ms old: wait for it if it has not come yet.
    while asked == 0 {
        tally(vec![a.recv().await], &mut received, &mut asked);
    }
    // A stanza written while it is unanswered brings no second request
    // (one due rides in the same write, before the <a/> below). The ping's
    // answer is a stanza received too.
    let mut before = a.barrier().await;
    before.push(Element::new("iq", ns::CLIENT));
    before.extend(sm_barrier(&mut a).await.0);
    tally(before, &mut received, &mut asked);
    assert!(
        received >= 3,
        "ping result, presence echo and message: {received}"
    );
    assert_eq!(asked, 1, "one outstanding ack request at a time");
    // Acknowledging everything received is fine (no stream error, no new
    // request), and the next stanza brings a new <r/> (after
    // request_ack_delay_ms).
    a.send(&format!("<a xmlns='{SM}' h='{received}'/>")).await;
    assert_eq!(
        sm_expect_nothing(&mut a).await,
        4,
        "presence, message, ping and the barrier's ping were handled"
    );
    message(&mut bob, &a.jid.clone(), "again").await;
    assert_eq!(body(&a.recv_message().await), "again");
    let r = a.recv().await;
    assert!(r.is("r", SM), "{r}");
    server.stop().await;
}

/// The server's ack requests (§4 leaves when to the implementation): one
/// outstanding at a time, sent once `request_ack_every` stanzas are
/// unacknowledged, or once the oldest is `request_ack_delay_ms` old — not
/// one per stanza, which would double the elements on the wire. A request
/// due by age rides with the next stanza written; a stream with nothing
/// more to send gets one of its own at twice the delay.
#[tokio::test]
async fn ack_requests_come_after_a_batch_or_a_delay() {
    let server = TestServer::start_with(|c| {
        let sm = c.modules.get_mut::<modules::StreamManagement>();
        sm.request_ack_every = 5;
        sm.request_ack_delay_ms = 1000;
    })
    .await;
    server.create_user("alice", "pw-alice").await;
    let mut a = authenticated(&server, "alice").await;
    a.bind(None).await;
    enable(&mut a, "").await;
    let mut bob = server.login("bob").await;
    // One stanza and nothing after it: a request of its own, at twice the
    // delay.
    message(&mut bob, &a.jid.clone(), "m0").await;
    assert_eq!(body(&a.recv().await), "m0");
    let t = std::time::Instant::now();
    // The first thing to come is the request, at twice the delay.
    let r = a.recv().await;
    assert!(r.is("r", SM), "{r}");
    assert!(
        t.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        t.elapsed()
    );
    a.send(&format!("<a xmlns='{SM}' h='1'/>")).await;
    // A stanza past the delay (not twice it) brings the request with it.
    message(&mut bob, &a.jid.clone(), "m1").await;
    assert_eq!(body(&a.recv().await), "m1");
    let t = std::time::Instant::now();
    // sleep: the point — m1 gets past the delay (not twice it)…
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // …with no request of its own meanwhile.
    sm_expect_nothing(&mut a).await;
    message(&mut bob, &a.jid.clone(), "m2").await;
    assert_eq!(body(&a.recv().await), "m2");
    let r = a.recv().await;
    assert!(r.is("r", SM), "{r}");
    assert!(
        t.elapsed() < Duration::from_millis(1900),
        "came alone, not with m2: {:?}",
        t.elapsed()
    );
    a.send(&format!("<a xmlns='{SM}' h='3'/>")).await;
    // Four more: still nothing; the fifth brings the request at once.
    for i in 3..=6 {
        message(&mut bob, &a.jid.clone(), &format!("m{i}")).await;
        assert_eq!(body(&a.recv().await), format!("m{i}"));
    }
    // A request due by count would have come in m6's write.
    sm_expect_nothing(&mut a).await;
    message(&mut bob, &a.jid.clone(), "m7").await;
    assert_eq!(body(&a.recv().await), "m7");
    let t = std::time::Instant::now();
    let r = a.recv().await;
    assert!(r.is("r", SM), "{r}");
    assert!(
        t.elapsed() < Duration::from_millis(1000),
        "{:?}",
        t.elapsed()
    );
    server.stop().await;
}

#[tokio::test]
async fn ack_above_sent_count_is_undefined_condition() {
    let server = TestServer::start().await;
    let mut a = server.login("alice").await;
    enable(&mut a, "").await;
    // §6: nothing was sent since <enable/>; h='5' is too high.
    a.send(&format!("<a xmlns='{SM}' h='5'/>")).await;
    let err = a.recv_until(|e| e.is("error", ns::STREAMS)).await;
    assert!(
        err.has_child("undefined-condition", ns::STREAM_ERRORS),
        "{err}"
    );
    let app = err
        .get_child("handled-count-too-high", SM)
        .unwrap_or_else(|| panic!("no <handled-count-too-high/>: {err}"));
    assert_eq!(app.attr("h"), Some("5"));
    assert_eq!(app.attr("send-count"), Some("0"));
    a.expect_closed().await;
    server.stop().await;
}

#[tokio::test]
async fn ack_elements_before_enable_are_a_stream_error() {
    let server = TestServer::start().await;
    let mut a = server.login("alice").await;
    a.send(&format!("<r xmlns='{SM}'/>")).await;
    a.expect_stream_error("unsupported-stanza-type").await;
    server.stop().await;
}

#[tokio::test]
async fn resume_after_connection_loss_retransmits_unacked_exactly_once() {
    let server = TestServer::start().await;
    let mut bob = server.login("bob").await;
    let mut a = server.login("alice").await;
    // Mutual presence, so bob would see alice go offline.
    bob.send("<presence type='subscribe' to='alice@localhost'/>")
        .await;
    a.recv_until(|e| e.attr("type") == Some("subscribe")).await;
    a.send("<presence type='subscribed' to='bob@localhost'/>")
        .await;
    bob.recv_until(|e| e.name() == "presence" && e.attr("type").is_none())
        .await;
    // Alice's session handled her 'subscribed' (bob has its effect): what
    // it routed to either of them (roster pushes) came before their pings'
    // answers.
    a.barrier().await;
    bob.barrier().await;

    let enabled = enable(&mut a, "resume='true'").await;
    let previd = enabled.attr("id").expect("resumption id").to_owned();
    assert_eq!(enabled.attr("resume"), Some("true"));
    assert_eq!(enabled.attr("max"), Some("300"), "the default timeout");
    let full = a.jid.clone();

    message(&mut a, "bob@localhost", "from-alice").await;
    assert_eq!(body(&bob.recv_message().await), "from-alice");
    message(&mut bob, &full, "m1").await;
    assert_eq!(body(&a.recv_message().await), "m1");
    a.send(&format!("<a xmlns='{SM}' h='1'/>")).await;
    message(&mut bob, &full, "m2").await;
    assert_eq!(body(&a.recv_message().await), "m2"); // received, never acked
                                                     // The connection drops without </stream:stream>.
    drop(a);
    // §5: the session stays, detached; bob sees no unavailable presence
    // and his message is queued for alice.
    until_detached(&server, 1).await;
    message(&mut bob, &full, "m3").await;
    bob.expect_nothing().await;

    let mut a2 = authenticated(&server, "alice").await;
    a2.send(&format!("<resume xmlns='{SM}' previd='{previd}' h='1'/>"))
        .await;
    let resumed = a2.recv().await;
    assert!(resumed.is("resumed", SM), "{resumed}");
    assert_eq!(resumed.attr("previd"), Some(previd.as_str()));
    assert_eq!(
        resumed.attr("h"),
        Some("1"),
        "alice sent one stanza since enable"
    );
    // m1 was acknowledged: only m2 and m3 come again, in order, once (the
    // retransmission is written with <resumed/>, before any ping answer).
    let got: Vec<String> = a2
        .barrier()
        .await
        .iter()
        .filter(|el| el.name() == "message")
        .map(body)
        .collect();
    assert_eq!(got, ["m2", "m3"]);
    // The resumed session is the same resource and works both ways.
    message(&mut a2, "bob@localhost", "after-resume").await;
    let m = bob.recv_message().await;
    assert_eq!(body(&m), "after-resume");
    assert_eq!(m.attr("from"), Some(full.as_str()));
    message(&mut bob, &full, "m4").await;
    assert_eq!(body(&recv_skipping_r(&mut a2).await), "m4");
    server.stop().await;
}

#[tokio::test]
async fn resume_with_unknown_or_another_accounts_id_fails_and_bind_still_works() {
    let server = TestServer::start().await;
    let mut a = server.login("alice").await;
    server.login("mallory").await.close().await;
    let previd = enable(&mut a, "resume='1'")
        .await
        .attr("id")
        .unwrap()
        .to_owned();
    drop(a);
    until_detached(&server, 1).await;

    // §5: unknown id → <failed><item-not-found/>, and binding still works.
    let mut m = authenticated(&server, "mallory").await;
    m.send(&format!("<resume xmlns='{SM}' previd='{previd}' h='0'/>"))
        .await;
    let f = m.recv().await;
    assert!(f.is("failed", SM), "{f}");
    assert!(f.has_child("item-not-found", ns::STANZAS), "{f}");
    m.send(&format!("<resume xmlns='{SM}' previd='no-such-id' h='0'/>"))
        .await;
    let f = m.recv().await;
    assert!(f.has_child("item-not-found", ns::STANZAS), "{f}");
    assert!(m.bind(None).await.starts_with("mallory@localhost/"));
    // Alice's own session is still resumable after mallory's attempt.
    let mut a2 = authenticated(&server, "alice").await;
    a2.send(&format!("<resume xmlns='{SM}' previd='{previd}' h='0'/>"))
        .await;
    let r = a2.recv().await;
    assert!(r.is("resumed", SM), "{r}");
    server.stop().await;
}

#[tokio::test]
async fn resuming_while_the_old_connection_is_open_replaces_it() {
    let server = TestServer::start().await;
    let mut a = server.login("alice").await;
    let previd = enable(&mut a, "resume='true'")
        .await
        .attr("id")
        .unwrap()
        .to_owned();
    let mut a2 = authenticated(&server, "alice").await;
    a2.send(&format!("<resume xmlns='{SM}' previd='{previd}' h='0'/>"))
        .await;
    let r = a2.recv().await;
    assert!(r.is("resumed", SM), "{r}");
    // §5: the old stream gets <conflict/>.
    a.expect_stream_error("conflict").await;
    server.stop().await;
}

#[tokio::test]
async fn expired_session_hands_unacked_messages_to_offline_storage_archived_once() {
    let server = TestServer::start().await;
    let mut bob = server.login("bob").await;
    let mut a = server.login("alice").await;
    bob.send("<presence type='subscribe' to='alice@localhost'/>")
        .await;
    a.recv_until(|e| e.attr("type") == Some("subscribe")).await;
    a.send("<presence type='subscribed' to='bob@localhost'/>")
        .await;
    bob.recv_until(|e| e.name() == "presence" && e.attr("type").is_none())
        .await;
    // Alice's session handled her 'subscribed' (bob has its effect): what
    // it routed to either of them (roster pushes) came before their pings'
    // answers.
    a.barrier().await;
    bob.barrier().await;

    // The client asks for one second.
    let enabled = enable(&mut a, "resume='true' max='1'").await;
    assert_eq!(enabled.attr("max"), Some("1"));
    let full = a.jid.clone();
    message(&mut bob, &full, "e1").await;
    assert_eq!(body(&a.recv_message().await), "e1"); // never acked
    drop(a);
    until_detached(&server, 1).await;
    message(&mut bob, &full, "e2").await; // queued while detached
                                          // After the timeout the session ends: bob sees alice unavailable.
    let p = bob
        .recv_until(|e| e.name() == "presence" && e.attr("type") == Some("unavailable"))
        .await;
    assert_eq!(p.attr("from"), Some(full.as_str()));
    // §4: both unacknowledged messages went to offline storage, with the
    // time of their first delivery; and each is archived exactly once.
    let mut a2 = server.login("alice").await;
    let m1 = a2.recv_message().await;
    let m2 = a2.recv_message().await;
    assert_eq!((body(&m1), body(&m2)), ("e1".into(), "e2".into()));
    for m in [&m1, &m2] {
        let delays = m
            .children()
            .filter(|c| c.is("delay", "urn:xmpp:delay"))
            .count();
        assert_eq!(delays, 1, "one delay stamp: {m}");
    }
    a2.barrier().await;
    let bodies = a2.archived_bodies().await;
    assert_eq!(
        bodies.iter().filter(|b| *b == "e1").count(),
        1,
        "{bodies:?}"
    );
    assert_eq!(
        bodies.iter().filter(|b| *b == "e2").count(),
        1,
        "{bodies:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn without_resumption_unacked_messages_go_to_another_resource_or_offline() {
    let server = TestServer::start().await;
    let mut bob = server.login("bob").await;
    let mut a = server.login("alice").await;
    enable(&mut a, "").await;
    let full = a.jid.clone();
    message(&mut bob, &full, "n1").await;
    assert_eq!(body(&a.recv_message().await), "n1"); // never acked
    a.send(&format!("<r xmlns='{SM}'/>")).await; // nothing acked either
    drop(a);
    // No resumption: the session ends at once, and n1 goes to storage.
    until_offline(&server, 1).await;
    let mut a2 = server.login("alice").await;
    let m = a2.recv_message().await;
    assert_eq!(body(&m), "n1");
    // An iq request that was never acknowledged is answered for the client.
    enable(&mut a2, "").await;
    let full2 = a2.jid.clone();
    bob.send(&iq_get(&full2, "v1", "<query xmlns='jabber:iq:version'/>"))
        .await;
    a2.recv_until(|e| e.name() == "iq").await;
    drop(a2);
    let err = bob
        .recv_until(|e| e.name() == "iq" && e.attr("id") == Some("v1"))
        .await;
    assert_eq!(err.attr("type"), Some("error"), "{err}");
    assert_eq!(
        error_condition(&err).as_deref(),
        Some("service-unavailable")
    );
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_never_acks_is_ended_at_the_queue_bound_and_loses_nothing() {
    let server =
        TestServer::start_with(|c| c.modules.get_mut::<modules::StreamManagement>().max_queue = 5)
            .await;
    let mut bob = server.login("bob").await;
    let mut a = server.login("alice").await;
    enable(&mut a, "resume='true'").await;
    let full = a.jid.clone();
    for i in 0..6 {
        message(&mut bob, &full, &format!("q{i}")).await;
    }
    // q0..q4 arrive, then q5 passes the bound.
    let err = a.recv_until(|e| e.is("error", ns::STREAMS)).await;
    assert!(
        err.has_child("policy-violation", ns::STREAM_ERRORS),
        "{err}"
    );
    let mut a2 = server.login("alice").await;
    let mut got = Vec::new();
    while got.len() < 6 {
        let el = a2.recv().await;
        if el.name() == "message" {
            got.push(body(&el));
        }
    }
    // No copy after them: the hand-back had ended (all six were re-routed).
    let extra = a2.barrier().await;
    got.extend(extra.iter().filter(|el| el.name() == "message").map(body));
    // Each exactly once. (Order is not asserted: messages re-routed while
    // the new session's offline retrieval runs may overtake it.)
    got.sort();
    assert_eq!(got, ["q0", "q1", "q2", "q3", "q4", "q5"]);
    server.stop().await;
}

/// The queue is bounded in bytes too (`max_queue_bytes`), attached or
/// detached: three 4 KiB messages pass 10 KiB long before `max_queue`.
#[tokio::test]
async fn sm_queue_over_max_queue_bytes_ends_the_session_and_loses_nothing() {
    let server = TestServer::start_with(|c| {
        c.modules
            .get_mut::<modules::StreamManagement>()
            .max_queue_bytes = 10 * 1024
    })
    .await;
    let mut bob = server.login("bob").await;
    let mut a = server.login("alice").await;
    enable(&mut a, "resume='true'").await;
    let full = a.jid.clone();
    let filler = "b".repeat(4 * 1024);
    for i in 0..3 {
        message(&mut bob, &full, &format!("q{i} {filler}")).await;
    }
    let err = a.recv_until(|e| e.is("error", ns::STREAMS)).await;
    assert!(
        err.has_child("policy-violation", ns::STREAM_ERRORS),
        "{err}"
    );
    let mut a2 = server.login("alice").await;
    let tag = |el: &Element| body(el).split(' ').next().unwrap_or_default().to_owned();
    let mut got = Vec::new();
    while got.len() < 3 {
        let el = a2.recv().await;
        if el.name() == "message" {
            got.push(tag(&el));
        }
    }
    // No copy after them: the hand-back had ended.
    let extra = a2.barrier().await;
    got.extend(extra.iter().filter(|el| el.name() == "message").map(tag));
    got.sort();
    assert_eq!(got, ["q0", "q1", "q2"]);
    server.stop().await;
}

use crate::killable;

#[tokio::test(flavor = "multi_thread")]
async fn acked_message_is_archived_even_after_sigkill() {
    // §4 and docs/durability.md: <a h/> covers a client's message only once
    // its archive rows are committed. The archive's write-behind window is
    // ten minutes here: only the ack's wait can have committed the row
    // before the SIGKILL.
    let dir =
        std::env::temp_dir().join(format!("starling-smkill-{}", starling_proto::random_id(10)));
    std::fs::create_dir_all(&dir).unwrap();
    let (p1, p2) = (free_port(), free_port());
    let cfg = write_binary_config(&dir, p1, p2);
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str("\n[modules.mam]\nbatch_delay_ms = 600000\n");
    std::fs::write(&cfg, text).unwrap();
    killable::add_user(&cfg, "alice@localhost", "secret-a");
    killable::add_user(&cfg, "bob@localhost", "secret-b");

    let mut server = killable::KillOnDrop(killable::start_binary(&cfg, p1).await);
    let mut bob = killable::connect(p1, "bob", "secret-b").await;
    bob.send("<presence/>").await;
    let mut alice = killable::connect(p1, "alice", "secret-a").await;
    enable(&mut alice, "").await;
    message(&mut alice, "bob@localhost", "acked").await;
    assert_eq!(ack(&mut alice).await, 1);
    server.0.kill().unwrap(); // SIGKILL
    let _ = server.0.wait();
    drop((alice, bob));

    server = killable::KillOnDrop(killable::start_binary(&cfg, p1).await);
    let mut alice = killable::connect(p1, "alice", "secret-a").await;
    assert_eq!(alice.archived_bodies().await, ["acked"]);
    let mut bob = killable::connect(p1, "bob", "secret-b").await;
    assert_eq!(bob.archived_bodies().await, ["acked"]);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// §4 with RFC 6121 §8.5.2.1.1: when a detached session expires, a message
/// that was addressed to the bare JID is not re-routed if another resource
/// at least as preferred is available (it got its own copy: showing it
/// again would duplicate it), while one addressed to the expired session's
/// full JID is; and with the other resource less preferred (it got no
/// copy), the bare-JID message is re-routed to it.
#[tokio::test]
async fn expired_session_does_not_repeat_bare_jid_messages_another_resource_got() {
    let server = TestServer::start().await;
    let mut bob = server.login("bob").await;
    for less_preferred in [false, true] {
        let expect_bare_again = less_preferred;
        let mut a = server.login("alice").await;
        let mut b = server.login("alice").await;
        if less_preferred {
            // b stays available, with a lower priority than a.
            b.send("<presence><priority>1</priority></presence>").await;
            a.send("<presence><priority>5</priority></presence>").await;
        }
        // Each one's presences were routed once its ping is answered (b's
        // first, as b sent first); the other's barrier then brings them.
        b.barrier().await;
        a.barrier().await;
        b.barrier().await;
        enable(&mut a, "resume='true' max='1'").await;
        let full = a.jid.clone();
        let tag = if less_preferred { "lower" } else { "equal" };
        message(&mut bob, "alice@localhost", &format!("{tag}-bare")).await;
        assert_eq!(body(&a.recv_message().await), format!("{tag}-bare"));
        if !expect_bare_again {
            // Equal priority: b got its own copy.
            assert_eq!(body(&b.recv_message().await), format!("{tag}-bare"));
        }
        message(&mut bob, &full, &format!("{tag}-full")).await;
        assert_eq!(body(&a.recv_message().await), format!("{tag}-full"));
        drop(a); // detached, nothing acked; expires after 1 s
                 // The expired session re-routes its queue, then tells b it
                 // is gone (one session_closed step, in that order); b's
                 // barrier brings whatever came after.
        let mut got = Vec::new();
        loop {
            let el = b.recv().await;
            if el.name() == "message" {
                got.push(body(&el));
            } else if el.name() == "presence"
                && el.attr("type") == Some("unavailable")
                && el.attr("from") == Some(full.as_str())
            {
                break;
            }
        }
        let extra = b.barrier().await;
        got.extend(extra.iter().filter(|el| el.name() == "message").map(body));
        let mut want = vec![format!("{tag}-full")];
        if expect_bare_again {
            want.insert(0, format!("{tag}-bare"));
        }
        got.sort();
        want.sort();
        assert_eq!(got, want, "{tag}");
        b.close().await;
    }
    server.stop().await;
}

/// §4 with RFC 6121's ordering: when a detached session expires, its
/// unacknowledged messages are handed back to the router (here: offline
/// storage) while new messages for the account keep arriving. The new
/// ones wait for the hand-back (starling_core::HandoverGate), so the
/// offline queue, and the client at its next login, has every message
/// once and in the order it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_keep_their_order_across_an_expiring_sessions_hand_back() {
    let server = TestServer::start_with(|c| {
        c.modules
            .get_mut::<modules::Offline>()
            .max_messages_per_user = 100_000;
        c.modules.get_mut::<modules::StreamManagement>().max_queue = 100_000;
        // No bounce for a full mailbox while the new session catches up.
        c.c2s.mailbox_size = 1_000_000;
        c.c2s.mailbox_bytes = usize::MAX;
    })
    .await;
    let bob = server.login("bob").await;
    let mut a = server.login("alice").await;
    enable(&mut a, "resume='true' max='1'").await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let count = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let sender = {
        let (stop, count) = (stop.clone(), count.clone());
        tokio::spawn(async move {
            let mut bob = bob;
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                message(&mut bob, "alice@localhost", &format!("{n:06}")).await;
                n += 1;
                count.store(n, std::sync::atomic::Ordering::Relaxed);
                if n.is_multiple_of(5) {
                    // sleep: pacing (about 2500 messages a second), not a wait.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            (bob, n)
        })
    };
    // Alice reads for a while, acknowledging nothing, then her connection
    // drops: everything written to her since is unacknowledged.
    let mut read = 0;
    while read < 300 {
        if recv_skipping_r(&mut a).await.name() == "message" {
            read += 1;
        }
    }
    drop(a);
    // Detached for 1 s, then expired: the hand-back runs while bob sends.
    // The session leaves the table when its hand-back begins; bob's
    // messages sent after that wait for it to end (HandoverGate).
    let alice = &starling_proto::BareJid::new("alice@localhost").unwrap();
    until("alice's detached session expired", || async {
        !server.server.env.sessions.has_resources(alice)
    })
    .await;
    let after = count.load(std::sync::atomic::Ordering::Relaxed) + 200;
    until("bob sent 200 more", || async {
        count.load(std::sync::atomic::Ordering::Relaxed) >= after
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut bob, sent) = sender.await.unwrap();
    // Bob's session routed (stored) all his messages before it answers.
    bob.barrier().await;
    let mut a2 = server.login("alice").await;
    let mut got = Vec::new();
    while got.len() < sent as usize {
        match a2.next_event_within(Duration::from_secs(5)).await {
            Some(Event::Element(el)) if el.name() == "message" => got.push(body(&el)),
            Some(Event::Element(_)) => {}
            _ => break,
        }
    }
    // No copy after them.
    let extra = a2.barrier().await;
    got.extend(extra.iter().filter(|el| el.name() == "message").map(body));
    let out_of_order: Vec<(&String, &String)> = got
        .windows(2)
        .filter(|w| w[0] >= w[1])
        .map(|w| (&w[0], &w[1]))
        .collect();
    assert!(
        out_of_order.is_empty(),
        "{} of {} messages arrived after a later one, e.g. {:?}",
        out_of_order.len(),
        got.len(),
        out_of_order.iter().take(3).collect::<Vec<_>>()
    );
    let gaps: Vec<(&String, &String)> = got
        .windows(2)
        .filter(|w| w[1].parse::<u32>().unwrap() != w[0].parse::<u32>().unwrap() + 1)
        .map(|w| (&w[0], &w[1]))
        .collect();
    let stored = server
        .server
        .env
        .storage
        .offline
        .count(&starling_proto::BareJid::new("alice@localhost").unwrap())
        .await
        .unwrap();
    assert!(
        gaps.is_empty() && got.len() == sent as usize,
        "every message once: {} of {sent} received, {stored} still stored offline, gaps {:?}",
        got.len(),
        gaps.iter().take(3).collect::<Vec<_>>()
    );
    server.stop().await;
}
