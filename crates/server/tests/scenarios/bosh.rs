//! BOSH (XEP-0124) carrying XMPP (XEP-0206) over real HTTP requests:
//! session creation with the stream features (XEP-0206 §5), SASL and the
//! restart (§6), binding and chatting with a TCP user in both directions
//! with long polling (XEP-0124 §7), a retransmitted rid answered the same
//! (§14.3), request and response acknowledgements (§9), unknown sids and out-of-window rids (`item-not-found`, §17.2),
//! too many simultaneous requests (`policy-violation`, §11), bad bodies
//! (`bad-request`), and terminate (§13). Other users are never affected.

use base64::Engine;
use starling_testkit::muc;
use starling_testkit::stanza::{iq_get, msg};
use starling_testkit::starling_xml::Element;
use starling_testkit::{eventually, ns, TestServer};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIND: &str = "http://jabber.org/protocol/httpbind";
const XBOSH: &str = "urn:xmpp:xbosh";

use starling_testkit::bosh_post as post;

struct Bosh {
    addr: SocketAddr,
    sid: String,
    rid: u64,
}

impl Bosh {
    /// Creates a session (wait seconds) and returns it with the features.
    async fn create(addr: SocketAddr, wait: u32) -> (Bosh, Element) {
        Self::create_with(addr, wait, "").await
    }

    /// [`Bosh::create`] with more attributes on the creation request.
    async fn create_with(addr: SocketAddr, wait: u32, attrs: &str) -> (Bosh, Element) {
        let rid = 1_000_000;
        let r = post(
            addr,
            &format!("<body xmlns='{BIND}' rid='{rid}' to='localhost' wait='{wait}' hold='1' ver='1.6' xml:lang='en' xmpp:version='1.0' xmlns:xmpp='{XBOSH}' {attrs}/>"),
        )
        .await;
        assert!(r.is("body", BIND), "{r}");
        assert_eq!(r.attr("type"), None, "{r}");
        // XEP-0124 §9.1: a server that acknowledges requests does so from
        // the creation response on.
        assert_eq!(r.attr("ack"), Some("1000000"), "{r}");
        let sid = r.attr("sid").expect("sid").to_owned();
        assert_eq!(r.attr("hold"), Some("1"));
        assert_eq!(r.attr("requests"), Some("2"));
        assert_eq!(r.attr(&format!("{{{XBOSH}}}version")), Some("1.0"), "{r}");
        let features = r
            .get_child("features", ns::STREAMS)
            .expect("features in the creation response")
            .clone();
        (
            Bosh {
                addr,
                sid,
                rid: rid + 1,
            },
            features,
        )
    }

    fn body(&mut self, attrs: &str, payload: &str) -> (u64, String) {
        let rid = self.rid;
        self.rid += 1;
        (
            rid,
            format!("<body xmlns='{BIND}' xmlns:xmpp='{XBOSH}' sid='{}' rid='{rid}' {attrs}>{payload}</body>", self.sid),
        )
    }

    async fn send(&mut self, attrs: &str, payload: &str) -> Element {
        let (_, b) = self.body(attrs, payload);
        post(self.addr, &b).await
    }

    /// Logs in with PLAIN and binds; returns the full JID.
    async fn login(&mut self, user: &str) -> String {
        let b64 = base64::engine::general_purpose::STANDARD.encode(format!("\0{user}\0pw-{user}"));
        let r = self
            .send(
                "",
                &format!(
                    "<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' mechanism='PLAIN'>{b64}</auth>"
                ),
            )
            .await;
        assert!(r.has_child("success", ns::SASL), "{r}");
        let r = self.send("xmpp:restart='true' to='localhost'", "").await;
        let f = r
            .get_child("features", ns::STREAMS)
            .expect("features after restart");
        assert!(f.has_child("bind", ns::BIND), "{f}");
        let r = self
            .send("", "<iq xmlns='jabber:client' type='set' id='b1'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'/></iq>")
            .await;
        r.get_child("iq", ns::CLIENT)
            .and_then(|iq| iq.get_child("bind", ns::BIND))
            .and_then(|b| b.get_child("jid", ns::BIND))
            .map(|j| j.text())
            .unwrap_or_else(|| panic!("bind result: {r}"))
    }
}

fn condition(r: &Element) -> (Option<&str>, Option<&str>) {
    (r.attr("type"), r.attr("condition"))
}

#[tokio::test]
async fn bosh_login_and_chat_with_a_tcp_user_both_ways() {
    let server = TestServer::start().await;
    server.create_user("alice", "pw-alice").await;
    let mut tcp = server.login("bob").await;
    let (mut b, features) = Bosh::create(server.http_addr(false), 5).await;
    assert!(!features.has_child("starttls", ns::TLS), "{features}");
    assert!(
        features.has_child("mechanisms", ns::SASL),
        "loopback counts as secure: {features}"
    );
    let full = b.login("alice").await;
    assert!(full.starts_with("alice@localhost/"), "{full}");

    // Client → server: the payload of a request. (A ping rides along: its
    // answer ends the request at once instead of after `wait`, and shows
    // the message before it was handled.)
    let r = b
        .send(
            "",
            &format!(
                "<message xmlns='jabber:client' to='{}' type='chat'><body>over bosh</body></message><iq xmlns='jabber:client' type='get' id='p0' to='localhost'><ping xmlns='urn:xmpp:ping'/></iq>",
                tcp.jid
            ),
        )
        .await;
    assert!(
        r.children()
            .any(|c| c.is("iq", ns::CLIENT) && c.attr("id") == Some("p0")),
        "{r}"
    );
    let m = tcp.recv_message().await;
    assert_eq!(m.get_child("body", ns::CLIENT).unwrap().text(), "over bosh");
    assert_eq!(m.attr("from"), Some(full.as_str()));

    // Server → client: a held (empty) request is answered when a message arrives.
    let (rid, poll) = b.body("", "");
    let addr = b.addr;
    let held = tokio::spawn(async move { post(addr, &poll).await });
    // sleep: the point — the request stays unanswered a while (nothing
    // outside the BOSH session shows a request being held).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !held.is_finished(),
        "an empty request is held (long polling)"
    );
    tcp.send(&msg(&full).chat().body("to bosh").to_string())
        .await;
    let r = held.await.unwrap();
    let m = r
        .get_child("message", ns::CLIENT)
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(m.get_child("body", ns::CLIENT).unwrap().text(), "to bosh");

    // §14.3: the same rid again gets the same answer.
    let again = post(
        b.addr,
        &format!("<body xmlns='{BIND}' sid='{}' rid='{rid}'/>", b.sid),
    )
    .await;
    assert_eq!(again.to_string(), r.to_string());

    // With nothing to say, a request returns empty after `wait`.
    let t = std::time::Instant::now();
    let r = b.send("", "").await;
    assert!(r.children().next().is_none(), "{r}");
    assert!(t.elapsed() >= Duration::from_secs(4), "held for wait='5'");

    // §13: terminate.
    let r = b
        .send(
            "type='terminate'",
            "<presence xmlns='jabber:client' type='unavailable'/>",
        )
        .await;
    assert_eq!(r.attr("type"), Some("terminate"), "{r}");
    let r = b.send("", "").await;
    assert_eq!(condition(&r), (Some("terminate"), Some("item-not-found")));
    tcp.close().await;
    server.stop().await;
}

#[tokio::test]
async fn bad_sids_rids_bodies_and_overactivity_end_only_their_session() {
    let server = TestServer::start().await;
    let mut bystander = server.login("carol").await;
    let addr = server.http_addr(false);

    // Unknown sid.
    let r = post(addr, &format!("<body xmlns='{BIND}' sid='nope' rid='5'/>")).await;
    assert_eq!(condition(&r), (Some("terminate"), Some("item-not-found")));
    // Not a body / not XML / no rid.
    for bad in [
        "<message/>",
        "<<<",
        &format!("<body xmlns='{BIND}' to='localhost'/>"),
        // §14.1: above 2^53 - 1 (near u64::MAX, rid + 1 would overflow).
        &format!(
            "<body xmlns='{BIND}' rid='18446744073709551615' to='localhost' wait='5' hold='1'/>"
        ),
    ] {
        let r = post(addr, bad).await;
        assert_eq!(
            condition(&r),
            (Some("terminate"), Some("bad-request")),
            "{bad}"
        );
    }
    // A domain we do not serve.
    let r = post(
        addr,
        &format!("<body xmlns='{BIND}' rid='9' to='elsewhere.example' wait='5' hold='1'/>"),
    )
    .await;
    assert_eq!(condition(&r), (Some("terminate"), Some("host-unknown")));

    // A rid far outside the window ends the session.
    let (mut b, _) = Bosh::create(addr, 5).await;
    b.rid += 10;
    let r = b.send("", "").await;
    assert_eq!(condition(&r), (Some("terminate"), Some("item-not-found")));

    // Overactivity (§11): requests='2'; a third simultaneous request (here
    // all for the next rid but one, waiting for its turn) ends the session
    // with policy-violation.
    let (mut b, _) = Bosh::create(addr, 5).await;
    b.rid += 1;
    let (_, early) = b.body("", "");
    let (e1, e2) = (early.clone(), early.clone());
    let h1 = tokio::spawn(async move { post(addr, &e1).await });
    let h2 = tokio::spawn(async move { post(addr, &e2).await });
    // sleep: both must be waiting at the server before the third comes,
    // and nothing outside the BOSH session shows that they are.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = post(addr, &early).await;
    assert_eq!(
        condition(&r),
        (Some("terminate"), Some("policy-violation")),
        "{r}"
    );
    let _ = (h1.await, h2.await);

    // Nobody else noticed.
    let r = bystander
        .iq(
            "<iq type='get' id='p' to='localhost'><ping xmlns='urn:xmpp:ping'/></iq>",
            "p",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"));
    server.stop().await;
}

/// XEP-0124 §9: the server acknowledges requests (`ack` on a response
/// whose request was overtaken by a newer one, none when it would repeat
/// the request's own rid), and a client that acknowledges responses
/// (`ack='1'` at creation) and reports an older `ack` than what was sent
/// is answered at once with `report` and `time`.
#[tokio::test]
async fn request_and_response_acknowledgements() {
    let server = TestServer::start().await;
    server.create_user("alice", "pw-alice").await;
    let (mut b, _) = Bosh::create_with(server.http_addr(false), 2, "ack='1'").await;
    b.login("alice").await;

    // A held request pushed out by the next one acknowledges that one.
    let (rid_a, a) = b.body("", "");
    let addr = b.addr;
    let held_a = tokio::spawn(async move { post(addr, &a).await });
    // (Whichever reaches the server first, b waits for a's turn: a is
    // held, then pushed out by b.)
    let (rid_b, bb) = b.body(&format!("ack='{}'", rid_a - 1), "");
    let held_b = tokio::spawn(async move { post(addr, &bb).await });
    let ra = held_a.await.unwrap();
    assert_eq!(ra.attr("ack"), Some(rid_b.to_string().as_str()), "{ra}");
    assert_eq!(ra.attr("report"), None, "{ra}");
    // Answered after `wait` with nothing newer: its own rid, so no ack.
    let rb = held_b.await.unwrap();
    assert_eq!(rb.attr("ack"), None, "{rb}");

    // §9.2: the client says it has responses only up to rid_a - 1 although
    // rid_a and rid_b were answered: it is told at once which one it lacks.
    let t = std::time::Instant::now();
    let rc = b.send(&format!("ack='{}'", rid_a - 1), "").await;
    assert!(t.elapsed() < Duration::from_secs(1), "answered immediately");
    assert_eq!(rc.attr("report"), Some(rid_a.to_string().as_str()), "{rc}");
    let ms: u64 = rc
        .attr("time")
        .expect("time")
        .parse()
        .expect("milliseconds");
    assert!(
        ms >= 1000,
        "rid_a was answered before rid_b's wait: {ms} ms"
    );
    // The missing response is still there for the asking (§14.3).
    let again = post(
        b.addr,
        &format!("<body xmlns='{BIND}' sid='{}' rid='{rid_a}'/>", b.sid),
    )
    .await;
    assert_eq!(again.to_string(), ra.to_string());
    server.stop().await;
}

#[tokio::test]
async fn host_meta_advertises_bosh() {
    let server = TestServer::start().await;
    let addr = server.http_addr(false);
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        format!(
            "GET /.well-known/host-meta.json HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.unwrap();
    assert!(
        out.contains(&format!("\"href\":\"http://{addr}/http-bind\"")),
        "{out}"
    );
    assert!(out.contains("urn:xmpp:alt-connections:xbosh"), "{out}");
    server.stop().await;
}

#[tokio::test]
async fn a_paused_bosh_session_that_never_returns_resumes_over_tcp() {
    // XEP-0124 §10: pause='1' allows one second without requests; past it
    // the connection counts as lost, and XEP-0198 keeps the session for a
    // resumption on another transport.
    const SM: &str = "urn:xmpp:sm:3";
    let server = TestServer::start().await;
    server.create_user("alice", "pw-alice").await;
    let mut bob = server.login("bob").await;
    let (mut b, _) = Bosh::create(server.http_addr(false), 2).await;
    let full = b.login("alice").await;
    let r = b
        .send("", &format!("<enable xmlns='{SM}' resume='true'/>"))
        .await;
    let id = r
        .get_child("enabled", SM)
        .and_then(|e| e.attr("id"))
        .unwrap_or_else(|| panic!("{r}"))
        .to_owned();
    let r = b.send("pause='1'", "").await;
    assert_eq!(
        r.attr("type"),
        None,
        "a pause does not end the session: {r}"
    );
    // Past the pause, the session is detached.
    let detached = server
        .server
        .env
        .metrics
        .sessions_on(starling_core::SessionTransport::Detached);
    eventually(
        "the paused session is detached",
        Duration::from_secs(10),
        async || (detached.get() == 1).then_some(()),
    )
    .await;
    bob.send(&msg(&full).chat().body("while paused").to_string())
        .await;
    bob.barrier().await; // queued in the detached session

    let mut tcp = starling_testkit::Client::connect(server.starttls_addr()).await;
    tcp.negotiate_tls().await;
    tcp.auth(
        starling_proto::sasl::Mechanism::ScramSha256,
        "alice",
        "pw-alice",
    )
    .await
    .unwrap();
    tcp.send(&format!("<resume xmlns='{SM}' previd='{id}' h='0'/>"))
        .await;
    let resumed = tcp.recv().await;
    assert!(resumed.is("resumed", SM), "{resumed}");
    let m = tcp.recv_message().await;
    assert_eq!(
        m.get_child("body", ns::CLIENT).unwrap().text(),
        "while paused"
    );
    assert_eq!(m.attr("to"), Some(full.as_str()));
    // The BOSH session is gone.
    let r = b.send("", "").await;
    assert_eq!(r.attr("type"), Some("terminate"), "{r}");
    server.stop().await;
}

/// `[c2s] max_bytes_per_second` applies to a BOSH session's request
/// bodies: a flooding BOSH client is slowed (its requests wait before
/// their payloads are handled), not disconnected, and others keep their
/// latency.
#[tokio::test(flavor = "multi_thread")]
async fn a_flooding_bosh_client_is_throttled_and_others_unaffected() {
    let server = TestServer::start_with(|c| {
        c.c2s.max_bytes_per_second = 16 * 1024;
        c.c2s.max_stanza_bytes = 16 * 1024; // burst 16 KiB
    })
    .await;
    server.create_user("flooder", "pw-flooder").await;
    let addr = server.http_addr(false);
    let (mut f, _) = Bosh::create(addr, 5).await;
    f.login("flooder").await;
    let mut a = server.login("a").await;
    let mut b = server.login("b").await;
    // Six requests of about 12 KiB (a headline and a ping each): 72 KiB at
    // 16 KiB/s after a 16 KiB burst is at least 3.5 s of reading.
    let headline = format!(
        "<message xmlns='jabber:client' to='nobody@localhost' type='headline'><body>{}</body></message>",
        "z".repeat(12 * 1024)
    );
    let throttled = std::sync::Arc::new(tokio::sync::Notify::new());
    let t = throttled.clone();
    let flood = tokio::spawn(async move {
        let start = std::time::Instant::now();
        for i in 0..6 {
            let r = f
                .send(
                    "",
                    &format!("{headline}<iq xmlns='jabber:client' to='localhost' type='get' id='f{i}'><ping xmlns='urn:xmpp:ping'/></iq>"),
                )
                .await;
            assert_eq!(r.attr("type"), None, "not terminated: {r}");
            let pong = r
                .get_child("iq", ns::CLIENT)
                .unwrap_or_else(|| panic!("ping answer in {r}"));
            assert_eq!(pong.attr("id"), Some(format!("f{i}").as_str()), "{r}");
            if i == 0 {
                // The burst is spent: the next requests are slowed.
                t.notify_one();
            }
        }
        start.elapsed()
    });
    throttled.notified().await;
    let start = std::time::Instant::now();
    for i in 0..20 {
        a.send(&msg(&b.jid).chat().body(&i.to_string()).to_string())
            .await;
        let m = b.recv_message().await;
        assert_eq!(
            m.get_child("body", ns::CLIENT).map(|b| b.text()),
            Some(i.to_string())
        );
    }
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "others were slowed by the flood"
    );
    let took = flood.await.unwrap();
    assert!(
        took >= Duration::from_millis(2500),
        "72 KiB were read in {took:?}, faster than 16 KiB/s allows"
    );
    server.stop().await;
}

/// A room's copies are serialised once and each connection splices its
/// `to` in: a BOSH occupant gets them as whole `jabber:client` stanzas in
/// the body (XEP-0206 §7: stanzas qualified by their namespace), like a
/// TCP occupant does.
#[tokio::test]
async fn room_messages_reach_a_bosh_occupant_whole() {
    const MUC: &str = "http://jabber.org/protocol/muc";
    let server = TestServer::start().await;
    server.create_user("bob", "pw-bob").await;
    let mut alice = server.login("alice").await;
    let mut carol = server.login("carol").await;
    let room = "lobby@conference.localhost";
    muc::join(&mut alice, room, "alice").await;
    muc::instant(&mut alice, room).await;
    muc::join(&mut carol, room, "carol").await;
    let (mut b, _) = Bosh::create(server.http_addr(false), 2).await;
    let bob = b.login("bob").await;
    let mut r = b
        .send(
            "",
            &format!(
                "<presence xmlns='jabber:client' to='{room}/bob'><x xmlns='{MUC}'/></presence>"
            ),
        )
        .await;
    // Until bob has entered (the subject ends the sequence, XEP-0045
    // §7.2.15), in this response or a later one.
    for _ in 0..10 {
        if r.children().any(|c| c.has_child("subject", ns::CLIENT)) {
            break;
        }
        r = b.send("", "").await;
    }
    assert!(
        r.children().any(|c| c.has_child("subject", ns::CLIENT)),
        "bob entered: {r}"
    );
    // The room answers in order: its broadcasts of bob's join came first.
    alice.barrier_via(room).await;
    alice
        .send(
            &msg(room)
                .groupchat()
                .id("g1")
                .body("to all & <you>")
                .to_string(),
        )
        .await;
    let mut got = None;
    for _ in 0..10 {
        let r = b.send("", "").await;
        got = r
            .children()
            .find(|c| c.is("message", ns::CLIENT) && c.has_child("body", ns::CLIENT))
            .cloned();
        if got.is_some() {
            break;
        }
    }
    let m = got.expect("bob got the room's message");
    assert_eq!(m.attr("to"), Some(bob.as_str()), "{m}");
    assert_eq!(m.attr("from"), Some(format!("{room}/alice").as_str()));
    assert_eq!(m.attr("type"), Some("groupchat"));
    assert_eq!(
        m.get_child("body", ns::CLIENT).unwrap().text(),
        "to all & <you>"
    );
    assert!(m.has_child("stanza-id", "urn:xmpp:sid:0"), "{m}");
    // The TCP occupants' copies carry their own `to`.
    for c in [&mut alice, &mut carol] {
        let m = c.recv_message().await;
        assert_eq!(m.attr("to"), Some(c.jid.as_str()), "{m}");
        assert_eq!(
            m.get_child("body", ns::CLIENT).unwrap().text(),
            "to all & <you>"
        );
    }
    server.stop().await;
}

/// Issue 31 item 3: a BOSH user who stops polling. Output for it is held
/// up to `[c2s] bosh_max_pending_bytes`; then its stanzas wait in the
/// session's mailbox, and once `mailbox_size` wait there senders get
/// `<resource-constraint/>`, as for a TCP client that stops reading.
/// When it polls again each response carries at most
/// `bosh_max_pending_bytes` (whole stanzas), and every stanza that was
/// accepted arrives, in order.
#[tokio::test]
async fn bosh_client_that_stops_polling_bounds_output_and_loses_nothing_accepted() {
    let bounced = stop_polling_then_resume(|c| c.c2s.mailbox_size = 4).await;
    // At most PENDING (+ one message) held and 4 in the mailbox: at least
    // five of twelve were refused; at least the mailbox's four accepted.
    assert!(bounced.len() >= 5, "bounced only {bounced:?}");
    assert!(bounced.len() <= 8, "bounced {bounced:?}");
}

/// The mailbox's byte bound (`[c2s] mailbox_bytes`): with room for a
/// thousand stanzas but 20 KiB, a reader that stopped holds two 6 KiB
/// messages in its mailbox (each costs ~7.4 KB parsed), and senders get
/// `<resource-constraint/>`
/// for the rest, however large the stanza count bound. Nothing accepted
/// is lost.
#[tokio::test]
async fn mailbox_byte_bound_refuses_before_the_count_bound() {
    let bounced = stop_polling_then_resume(|c| {
        c.c2s.mailbox_size = 1000;
        c.c2s.max_stanza_bytes = 16 * 1024;
        c.c2s.mailbox_bytes = 20 * 1024;
    })
    .await;
    // Two in the mailbox, and at most three more taken into the BOSH
    // output before the client stopped: 2 to 5 accepted of 12 (the count
    // bound alone would have taken all twelve).
    assert!(bounced.len() >= 7, "bounced only {bounced:?}");
    assert!(bounced.len() <= 10, "bounced {bounced:?}");
}

/// A BOSH user stops polling while `a` sends it twelve messages of about
/// 6 KiB (`[c2s] bosh_max_pending_bytes` is 16 KiB); then it polls again.
/// Returns the ids bounced with `<resource-constraint/>`; asserts that
/// every other one arrives, in order, in responses of bounded size.
async fn stop_polling_then_resume(
    configure: impl FnOnce(&mut starling_server::config::Config),
) -> Vec<String> {
    const PENDING: usize = 16 * 1024;
    let server = TestServer::start_with(|c| {
        c.c2s.bosh_max_pending_bytes = PENDING;
        configure(c);
    })
    .await;
    server.create_user("web", "pw-web").await;
    let addr = server.http_addr(false);
    let (mut web, _) = Bosh::create(addr, 1).await;
    let jid = web.login("web").await;
    let mut a = server.login("a").await;
    // Twelve messages of about 6 KiB while the BOSH user does not poll.
    let filler = "m".repeat(6 * 1024);
    for i in 0..12 {
        a.send(
            &msg(&jid)
                .chat()
                .id(&format!("m{i}"))
                .body(&format!("{i} {filler}"))
                .to_string(),
        )
        .await;
    }
    // Barriers: the bounces are written with or right after these answers.
    let mut bounced = Vec::new();
    for barrier in ["p1", "p2"] {
        a.send(&iq_get(
            "localhost",
            barrier,
            "<ping xmlns='urn:xmpp:ping'/>",
        ))
        .await;
        loop {
            let el = a.recv().await;
            if el.attr("id") == Some(barrier) {
                break;
            }
            assert_eq!(el.attr("type"), Some("error"), "{el}");
            assert_eq!(
                starling_testkit::error_condition(&el).as_deref(),
                Some("resource-constraint"),
                "{el}"
            );
            bounced.push(el.attr("id").unwrap_or_default().to_owned());
        }
    }
    let accepted: Vec<String> = (0..12)
        .map(|i| format!("m{i}"))
        .filter(|id| !bounced.contains(id))
        .collect();
    // Polling again: bounded responses, everything accepted, in order.
    let mut got = Vec::new();
    for _ in 0..20 {
        if got.len() == accepted.len() {
            break;
        }
        let r = web.send("", "").await;
        assert_eq!(r.attr("type"), None, "not terminated: {r}");
        let messages: Vec<&Element> = r
            .children()
            .filter(|c| c.is("message", ns::CLIENT))
            .collect();
        let bytes: usize = messages.iter().map(|m| m.to_string().len()).sum();
        assert!(
            messages.len() <= 1 || bytes <= PENDING + 512,
            "a response of {bytes} bytes ({} messages)",
            messages.len()
        );
        got.extend(
            messages
                .iter()
                .map(|m| m.attr("id").unwrap_or_default().to_owned()),
        );
    }
    assert_eq!(got, accepted, "bounced: {bounced:?}");
    server.stop().await;
    bounced
}
