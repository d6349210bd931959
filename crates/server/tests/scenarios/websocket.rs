//! XMPP over WebSocket (RFC 7395) and connection discovery (XEP-0156) over
//! real sockets: the upgrade and its subprotocol (§3.1), `<open/>` /
//! `<close/>` framing (§3.3.2), one element per message (§3.3.3), stream
//! errors followed by `<close/>` (§3.6), login and chat with TCP clients,
//! `ws:` and `wss:`, SCRAM -PLUS bound to the `wss:` TLS connection, bad
//! frames, and stream-management resumption from a WebSocket session onto
//! a TCP connection.

use starling_core::SessionTransport;
use starling_proto::sasl::Mechanism;
use starling_testkit::muc;
use starling_testkit::stanza::msg;
use starling_testkit::starling_xml::Element;
use starling_testkit::{eventually, ns, Client, Event, TestServer, Transport};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SM: &str = "urn:xmpp:sm:3";

// CLOSE_WAIT: at shutdown the server closes a WebSocket stream and waits
// up to 5 s for the client's close frame (RFC 6455 §5.5.1), which a test
// client nobody reads never sends: tests drop their WebSocket clients
// before stopping the server.
const WS: Transport = Transport::WebSocket { tls: false };
const WSS: Transport = Transport::WebSocket { tls: true };

fn body(m: &Element) -> String {
    m.get_child("body", ns::CLIENT)
        .map(|b| b.text())
        .unwrap_or_default()
}

/// Waits until the server counts `n` detached sessions (it noticed a
/// dropped connection of a resumable session).
async fn until_detached(server: &TestServer, n: i64) {
    let gauge = server
        .server
        .env
        .metrics
        .sessions_on(SessionTransport::Detached);
    eventually(
        "the server noticed the dropped connection",
        Duration::from_secs(10),
        async || (gauge.get() == n).then_some(()),
    )
    .await;
}

/// A plain HTTP/1.1 GET; returns the status line and the body.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    http_get_with(addr, path, "").await
}

/// [`http_get`] with `headers` (each ending in CRLF) added to the request.
async fn http_get_with(addr: std::net::SocketAddr, path: &str, headers: &str) -> (String, String) {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.unwrap();
    let status = out.lines().next().unwrap_or_default().to_owned();
    let body = out
        .split_once("\r\n\r\n")
        .map(|x| x.1)
        .unwrap_or("")
        .to_owned();
    (status, body)
}

#[tokio::test]
async fn host_meta_advertises_the_websocket_endpoint() {
    // XEP-0156 §3: XRD and JRD, URL taken from the Host the client used.
    let server = TestServer::start().await;
    let addr = server.http_addr(false);
    let url = format!("ws://{addr}/xmpp-websocket");
    let (status, xml) = http_get(addr, "/.well-known/host-meta").await;
    assert!(status.contains("200"), "{status}");
    assert!(
        xml.contains("rel='urn:xmpp:alt-connections:websocket'"),
        "{xml}"
    );
    assert!(xml.contains(&format!("href='{url}'")), "{xml}");
    let (status, json) = http_get(addr, "/.well-known/host-meta.json").await;
    assert!(status.contains("200"), "{status}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["links"][0]["rel"], "urn:xmpp:alt-connections:websocket");
    assert_eq!(v["links"][0]["href"], url.as_str());
    let (status, _) = http_get(addr, "/nothing-here").await;
    assert!(status.contains("404"), "{status}");
    server.stop().await;
}

#[tokio::test]
async fn request_heads_are_bounded_and_an_oversized_one_gets_431() {
    // The HTTP listener reads at most 16 KiB of a request head
    // (`transport::http::HTTP_READ_BUFFER`): a browser's usual cookies fit,
    // a 40 KiB head is refused with 431 (RFC 6585 §5), and the listener
    // keeps serving.
    let server = TestServer::start().await;
    let addr = server.http_addr(false);
    let cookie = format!("Cookie: c={}\r\n", "x".repeat(8 * 1024));
    let (status, json) = http_get_with(addr, "/.well-known/host-meta.json", &cookie).await;
    assert!(status.contains("200"), "{status}");
    assert!(json.contains("alt-connections"), "{json}");
    let huge = format!("Cookie: c={}\r\n", "x".repeat(40 * 1024));
    let (status, _) = http_get_with(addr, "/.well-known/host-meta.json", &huge).await;
    assert!(status.contains("431"), "{status}");
    let (status, _) = http_get(addr, "/.well-known/host-meta").await;
    assert!(status.contains("200"), "{status}");
    server.stop().await;
}

#[tokio::test]
async fn upgrade_without_the_xmpp_subprotocol_is_refused() {
    // RFC 7395 §3.1: the client must offer "xmpp".
    let server = TestServer::start().await;
    let addr = server.http_addr(false);
    let status = Client::connect_websocket_with(addr, false, &[]).await.err();
    assert_eq!(status, Some(400));
    let status = Client::connect_websocket_with(addr, false, &["chat"])
        .await
        .err();
    assert_eq!(status, Some(400));
    // The listener still serves a proper client.
    let mut ok = Client::connect_websocket(addr, false).await;
    assert!(ok.features.is_some());
    ok.send("<close xmlns='urn:ietf:params:xml:ns:xmpp-framing'/>")
        .await;
    drop(ok); // see CLOSE_WAIT
    server.stop().await;
}

#[tokio::test]
async fn websocket_and_tcp_users_chat_both_ways_over_ws_and_wss() {
    let server = TestServer::start().await;
    for transport in [WS, WSS] {
        let mut web = server.login_over("alice", transport).await;
        let mut tcp = server.login("bob").await;
        // No STARTTLS inside a WebSocket (§3.2): features after <open/>.
        let probe = Client::connect_websocket(server.http_addr(false), false).await;
        let f = probe.features.clone().unwrap();
        assert!(!f.has_child("starttls", ns::TLS), "{f}");
        assert!(
            f.has_child("mechanisms", ns::SASL),
            "loopback ws may log in: {f}"
        );
        probe.close().await;

        web.send(
            &msg(&tcp.jid)
                .chat()
                .id("w1")
                .body("from the web")
                .to_string(),
        )
        .await;
        let m = tcp.recv_message().await;
        assert_eq!(body(&m), "from the web");
        assert_eq!(m.attr("from"), Some(web.jid.as_str()));
        tcp.send(&msg(&web.jid).chat().id("t1").body("from tcp").to_string())
            .await;
        let m = web.recv_message().await;
        assert_eq!(body(&m), "from tcp");
        // An iq round trip, answered by the server.
        let r = web
            .iq(
                "<iq type='get' id='ping1' to='localhost'><ping xmlns='urn:xmpp:ping'/></iq>",
                "ping1",
            )
            .await;
        assert_eq!(r.attr("type"), Some("result"));
        // §3.3.2 / §3.6: <close/> is answered with <close/>.
        web.send("<close xmlns='urn:ietf:params:xml:ns:xmpp-framing'/>")
            .await;
        loop {
            match web.next_event().await {
                Event::Close | Event::Eof => break,
                Event::Element(_) | Event::Header => continue,
            }
        }
        tcp.close().await;
    }
    server.stop().await;
}

#[tokio::test]
async fn plain_websocket_from_loopback_is_not_trusted_when_configured() {
    let server = TestServer::start_with(|c| c.http.secure_loopback = false).await;
    let c = Client::connect_websocket(server.http_addr(false), false).await;
    let f = c.features.clone().unwrap();
    assert!(
        !f.has_child("mechanisms", ns::SASL),
        "no SASL over plain ws while TLS is required: {f}"
    );
    // wss still works.
    let mut s = Client::connect_websocket(server.http_addr(true), true).await;
    server.create_user("carol", "pw-carol").await;
    s.auth(Mechanism::ScramSha256, "carol", "pw-carol")
        .await
        .expect("login over wss");
    c.close().await;
    drop(s); // see CLOSE_WAIT
    server.stop().await;
}

/// Sends `frame` as one message on a fresh WebSocket stream and expects
/// the stream error `condition` followed by `<close/>`.
async fn expect_error_for(server: &TestServer, frame: &[u8], binary: bool, condition: &str) {
    let mut c = Client::connect_websocket(server.http_addr(false), false).await;
    assert!(c.send_ws_frame(frame, binary).await);
    let err = c.recv_until(|e| e.is("error", ns::STREAMS)).await;
    assert!(
        err.has_child(condition, ns::STREAM_ERRORS),
        "expected {condition}: {err}"
    );
    match c.next_event().await {
        Event::Close | Event::Eof => {}
        other => panic!("expected <close/> after the error, got {other:?}"),
    }
}

#[tokio::test]
async fn bad_frames_get_their_stream_errors_and_others_keep_working() {
    let server = TestServer::start_with(|c| c.c2s.max_stanza_bytes = 10_000).await;
    let mut bystander = server.login_over("bob", WS).await;
    // §3.2: text messages only.
    expect_error_for(&server, b"<presence/>", true, "bad-format").await;
    // Over the stanza limit.
    let big = format!("<message><body>{}</body></message>", "x".repeat(12_000));
    expect_error_for(&server, big.as_bytes(), false, "policy-violation").await;
    // §3.3.3: an element split over two messages.
    expect_error_for(&server, b"<message><body>half", false, "not-well-formed").await;
    // Not XML at all.
    expect_error_for(&server, b"<<<>>>", false, "not-well-formed").await;
    // A stream header instead of <open/>: an unclosed element.
    expect_error_for(
        &server,
        b"<stream:stream xmlns:stream='http://etherx.jabber.org/streams' xmlns='jabber:client' to='localhost' version='1.0'>",
        false,
        "not-well-formed",
    )
    .await;
    // A closing stream tag instead of <close/> (§3.3.2).
    expect_error_for(&server, b"</stream:stream>", false, "bad-format").await;
    // Far over the limit: the WebSocket layer drops the connection.
    let mut c = Client::connect_websocket(server.http_addr(false), false).await;
    let huge = "y".repeat(100_000);
    let _ = c.send_ws_frame(huge.as_bytes(), false).await;
    loop {
        match c.next_event_within(Duration::from_secs(5)).await {
            Some(Event::Eof) | None => break,
            Some(_) => continue,
        }
    }
    // The logged-in WebSocket user was not affected.
    let r = bystander
        .iq(
            "<iq type='get' id='p2' to='localhost'><ping xmlns='urn:xmpp:ping'/></iq>",
            "p2",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"));
    drop((bystander, c)); // see CLOSE_WAIT
    server.stop().await;
}

#[tokio::test]
async fn a_websocket_session_resumes_over_tcp() {
    // XEP-0198 §5 across transports: the session outlives its WebSocket.
    let server = TestServer::start().await;
    let mut bob = server.login("bob").await;
    let mut web = server.login_over("alice", WS).await;
    web.send(&format!("<enable xmlns='{SM}' resume='true'/>"))
        .await;
    let enabled = web.recv_until(|e| e.is("enabled", SM)).await;
    let id = enabled.attr("id").expect("resumption id").to_owned();
    let full = web.jid.clone();
    bob.send(&msg(&full).chat().id("m1").body("one").to_string())
        .await;
    assert_eq!(body(&web.recv_message().await), "one");
    drop(web); // the browser tab dies: no <close/>, no ack
    until_detached(&server, 1).await;
    bob.send(&msg(&full).chat().id("m2").body("two").to_string())
        .await;
    bob.barrier().await; // m2 is queued in the detached session

    let mut tcp = Client::connect(server.starttls_addr()).await;
    tcp.negotiate_tls().await;
    tcp.auth(Mechanism::ScramSha256, "alice", "pw-alice")
        .await
        .unwrap();
    tcp.send(&format!("<resume xmlns='{SM}' previd='{id}' h='0'/>"))
        .await;
    let resumed = tcp.recv().await;
    assert!(resumed.is("resumed", SM), "{resumed}");
    // The queue is re-sent with <resumed/>, before any ping's answer.
    let mut bodies = Vec::new();
    for el in tcp.barrier().await {
        if el.name() == "message" {
            assert_eq!(el.attr("to"), Some(full.as_str()));
            bodies.push(body(&el));
        }
    }
    assert_eq!(bodies, ["one", "two"], "unacked and queued, each once");
    server.stop().await;
}

#[tokio::test]
async fn a_tcp_session_resumes_over_websocket() {
    // XEP-0198 §5 the other way: the stanzas queued for a TCP stream (kept
    // as that stream's bytes, without `xmlns`) are re-sent as standalone
    // RFC 7395 messages, each naming `jabber:client`.
    let server = TestServer::start().await;
    let mut bob = server.login("bob").await;
    let mut tcp = server.login("alice").await;
    tcp.send(&format!("<enable xmlns='{SM}' resume='true'/>"))
        .await;
    let enabled = tcp.recv_until(|e| e.is("enabled", SM)).await;
    let id = enabled.attr("id").expect("resumption id").to_owned();
    let full = tcp.jid.clone();
    bob.send(&msg(&full).chat().id("m1").body("one & <only>").to_string())
        .await;
    assert_eq!(body(&tcp.recv_message().await), "one & <only>");
    drop(tcp); // no </stream:stream>, no ack
    until_detached(&server, 1).await;
    bob.send(&msg(&full).chat().id("m2").body("two").to_string())
        .await;
    bob.barrier().await; // m2 is queued in the detached session

    let mut web = Client::connect_websocket(server.http_addr(false), false).await;
    web.auth(Mechanism::ScramSha256, "alice", "pw-alice")
        .await
        .unwrap();
    web.send(&format!("<resume xmlns='{SM}' previd='{id}' h='0'/>"))
        .await;
    let resumed = web.recv().await;
    assert!(resumed.is("resumed", SM), "{resumed}");
    // The queue is re-sent with <resumed/>, before any ping's answer.
    let mut bodies = Vec::new();
    for el in web.barrier().await {
        if el.name() == "message" {
            assert_eq!(el.ns(), "jabber:client", "{el}");
            assert_eq!(el.attr("to"), Some(full.as_str()));
            bodies.push(body(&el));
        }
    }
    assert_eq!(
        bodies,
        ["one & <only>", "two"],
        "unacked and queued, each once"
    );
    drop(web); // see CLOSE_WAIT
    server.stop().await;
}

/// RFC 5802 §6 / RFC 9266 over `wss:`: a WebSocket stream is one TLS
/// connection, so SCRAM -PLUS with that connection's bindings works as on
/// TCP (XEP-0440 lists the types); binding data of another connection is
/// refused. Plain `ws:` offers no -PLUS, even from loopback where it
/// counts as secure.
#[tokio::test]
async fn scram_plus_over_wss_binds_to_the_tls_connection() {
    use starling_proto::sasl::ChannelBindingType;
    let server = TestServer::start().await;
    server.create_user("alice", "secret").await;
    for ty in [
        ChannelBindingType::TlsExporter,
        ChannelBindingType::TlsServerEndPoint,
    ] {
        let mut c = Client::connect_websocket(server.http_addr(true), true).await;
        assert!(
            c.mechanisms().iter().any(|m| m == "SCRAM-SHA-256-PLUS"),
            "{:?}",
            c.mechanisms()
        );
        let data = c.channel_binding(ty);
        c.auth_with_binding(
            Mechanism::ScramSha256Plus,
            "alice",
            "secret",
            Some((ty, data)),
        )
        .await
        .unwrap_or_else(|f| panic!("{ty:?}: {f}"));
        let jid = c.bind(None).await;
        assert!(jid.starts_with("alice@localhost/"), "{jid}");
    }
    // Another connection's exporter value does not authenticate.
    let other = Client::connect_websocket(server.http_addr(true), true).await;
    let stolen = other.channel_binding(ChannelBindingType::TlsExporter);
    let mut c = Client::connect_websocket(server.http_addr(true), true).await;
    let failure = c
        .auth_with_binding(
            Mechanism::ScramSha256Plus,
            "alice",
            "secret",
            Some((ChannelBindingType::TlsExporter, stolen)),
        )
        .await
        .expect_err("bindings of another connection");
    assert!(failure.has_child("not-authorized", ns::SASL), "{failure}");
    drop(c); // see CLOSE_WAIT
             // ws: from loopback is "secure" but has no TLS to bind to.
    let c = Client::connect_websocket(server.http_addr(false), false).await;
    assert!(
        !c.mechanisms().iter().any(|m| m.ends_with("-PLUS")),
        "{:?}",
        c.mechanisms()
    );
    drop((c, other)); // see CLOSE_WAIT
    server.stop().await;
}

/// `[c2s] max_bytes_per_second` applies to WebSocket sessions as to TCP:
/// a flooding WebSocket client is slowed, not disconnected, and others
/// keep their latency.
#[tokio::test(flavor = "multi_thread")]
async fn a_flooding_websocket_client_is_throttled_and_others_unaffected() {
    let server = TestServer::start_with(|c| {
        c.c2s.max_bytes_per_second = 64 * 1024;
        c.c2s.max_stanza_bytes = 16 * 1024; // burst 64 KiB
    })
    .await;
    let mut flooder = server.login_over("flooder", WS).await;
    let mut a = server.login("a").await;
    let mut b = server.login("b").await;
    // 256 KiB of headlines, one per WebSocket message, then a ping: at
    // 64 KiB/s the ping is reached after about 3 s.
    let headline = format!(
        "<message xmlns='jabber:client' to='nobody@localhost' type='headline'><body>{}</body></message>",
        "z".repeat(950)
    );
    let flood_start = std::time::Instant::now();
    for _ in 0..256 {
        flooder.send(&headline).await;
    }
    flooder
        .send("<iq xmlns='jabber:client' to='localhost' type='get' id='after-flood'><ping xmlns='urn:xmpp:ping'/></iq>")
        .await;
    let start = std::time::Instant::now();
    for i in 0..20 {
        a.send(&msg(&b.jid).chat().body(&i.to_string()).to_string())
            .await;
        assert_eq!(body(&b.recv().await), i.to_string());
    }
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "others were slowed by the flood"
    );
    // The flooder is slowed: nothing comes before the ping's answer, and
    // that comes once 192 KiB past the burst were read at 64 KiB/s (3 s).
    let pong = flooder.recv().await;
    assert_eq!(pong.attr("id"), Some("after-flood"), "{pong}");
    assert_eq!(pong.attr("type"), Some("result"));
    assert!(
        flood_start.elapsed() >= Duration::from_secs(2),
        "the flood was not slowed: {:?}",
        flood_start.elapsed()
    );
    drop(flooder); // see CLOSE_WAIT
    server.stop().await;
}

/// After `[c2s] hibernate_after_secs` of quiet a WebSocket session frees
/// its XML parser too; the next message parses with the same namespace
/// context.
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_websocket_session_hibernates_its_parser_and_resumes() {
    let server = TestServer::start_with(|c| c.c2s.hibernate_after_secs = 1).await;
    let mut web = server.login_over("alice", WS).await;
    let mut bob = server.login("bob").await;
    // sleep: the point — a second and a half of quiet, past
    // hibernate_after_secs (nothing outside the session shows the parser
    // hibernated).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    web.send(&format!(
        "<message xmlns='jabber:client' to='{}' type='chat'><body>after nap</body><x xmlns='urn:example:x'/></message>",
        bob.jid
    ))
    .await;
    let m = bob.recv().await;
    assert_eq!(body(&m), "after nap");
    assert!(m.has_child("x", "urn:example:x"));
    drop(web); // see CLOSE_WAIT
    server.stop().await;
}

/// A room's copies are serialised once and each connection splices its
/// `to` in: a WebSocket occupant gets each copy as one message holding a
/// whole stanza with its namespace (RFC 7395 §3.3.3).
#[tokio::test]
async fn room_messages_reach_a_websocket_occupant_whole() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut web = server.login_over("bob", WS).await;
    let room = "lobby@conference.localhost";
    muc::join(&mut alice, room, "alice").await;
    muc::instant(&mut alice, room).await;
    muc::join(&mut web, room, "bob").await;
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
    for c in [&mut web, &mut alice] {
        let m = c.recv_message().await;
        assert_eq!(m.ns(), ns::CLIENT, "{m}");
        assert_eq!(m.attr("to"), Some(c.jid.as_str()), "{m}");
        assert_eq!(m.attr("from"), Some(format!("{room}/alice").as_str()));
        assert_eq!(body(&m), "to all & <you>");
        assert!(m.has_child("stanza-id", "urn:xmpp:sid:0"), "{m}");
    }
    drop(web); // see CLOSE_WAIT
    server.stop().await;
}

/// Reads and discards what the server sends on `tcp` until it closes the
/// connection; false if it is still open after `within`.
async fn closed_within(tcp: &mut tokio::net::TcpStream, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// Issue 31 item 1: an unauthenticated WebSocket that sends masked
/// 125-byte pings as fast as it can and never reads. Every byte counts
/// against `[c2s] max_bytes_per_second` (pings included), so the server
/// reads about rate × time + burst and the client's socket blocks; the
/// pongs it cannot write do not pile up, and the connection is closed.
/// Meanwhile a WebSocket user logs in and chats as usual.
#[tokio::test(flavor = "multi_thread")]
async fn websocket_preauth_ping_flood_is_throttled_then_closed() {
    let server = TestServer::start_with(|c| {
        c.c2s.max_bytes_per_second = 32 * 1024;
        c.c2s.max_stanza_bytes = 16 * 1024; // burst 32 KiB
        c.c2s.write_timeout_secs = 2;
        c.c2s.negotiation_timeout_secs = 6;
    })
    .await;
    let addr = server.http_addr(false);
    let mut tcp = starling_testkit::raw_websocket(addr, Some(16 * 1024)).await;
    let flood = tokio::spawn(async move {
        let ping = starling_testkit::ws_frame(true, 0x9, &[b'p'; 125]);
        let batch: Vec<u8> = ping.repeat(64);
        let start = std::time::Instant::now();
        let mut written = 0usize;
        while start.elapsed() < Duration::from_secs(3) {
            match tokio::time::timeout(Duration::from_millis(300), tcp.write_all(&batch)).await {
                Ok(Ok(())) => written += batch.len(),
                // Blocked: the server is not reading faster than its limit.
                Err(_) => {}
                Ok(Err(_)) => break,
            }
        }
        (tcp, written, start.elapsed())
    });
    // A witness logs in over WebSocket and chats during the flood.
    let mut web = server.login_over("alice", WS).await;
    let mut bob = server.login("bob").await;
    for i in 0..5 {
        let start = std::time::Instant::now();
        web.send(&format!(
            "<message xmlns='jabber:client' to='{}' type='chat'><body>{i}</body></message>",
            bob.jid
        ))
        .await;
        assert_eq!(body(&bob.recv_message().await), i.to_string());
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "the witness was slowed: {:?}",
            start.elapsed()
        );
    }
    let (mut tcp, written, took) = flood.await.unwrap();
    eprintln!("ping flood: {written} bytes written in {took:?}");
    // What the server read (≤ 32 KiB/s × 3 s + 32 KiB) plus kernel buffers
    // (about 200 KiB with the small client buffers). Unthrottled, loopback
    // takes hundreds of MB in 3 s.
    assert!(
        written < 1024 * 1024,
        "{written} bytes of pings written in {took:?}: the server read them unthrottled"
    );
    // The client never read its pongs: the connection is closed (write
    // timeout, or the negotiation timeout at the latest).
    assert!(
        closed_within(&mut tcp, Duration::from_secs(15)).await,
        "the flooding connection is still open"
    );
    drop(web); // see CLOSE_WAIT
    server.stop().await;
}

/// Issue 31 item 8: before authentication a WebSocket message over
/// `[c2s] max_preauth_stanza_bytes` is refused with `<policy-violation/>`,
/// and so is an unfinished fragment announcing more (refused at its frame
/// header, before its payload is buffered); after authentication the same
/// size is an ordinary stanza.
#[tokio::test]
async fn websocket_message_over_preauth_limit_is_refused_until_authenticated() {
    let server = TestServer::start_with(|c| c.c2s.max_preauth_stanza_bytes = 8 * 1024).await;
    let filler = "x".repeat(10 * 1024);
    // One whole message.
    let mut c = Client::connect_websocket(server.http_addr(false), false).await;
    assert!(
        c.send_ws_frame(
            format!("<message xmlns='jabber:client'><body>{filler}</body></message>").as_bytes(),
            false
        )
        .await
    );
    let err = c.recv_until(|e| e.is("error", ns::STREAMS)).await;
    assert!(
        err.has_child("policy-violation", ns::STREAM_ERRORS),
        "{err}"
    );
    // An unfinished fragment of a 500 KB message: its header is enough.
    let mut tcp = starling_testkit::raw_websocket(server.http_addr(false), None).await;
    tcp.write_all(&starling_testkit::ws_frame(
        true,
        0x1,
        b"<open xmlns='urn:ietf:params:xml:ns:xmpp-framing' to='localhost' version='1.0'/>",
    ))
    .await
    .unwrap();
    tcp.write_all(&starling_testkit::ws_frame(false, 0x1, b"<message><body>"))
        .await
        .unwrap();
    tcp.write_all(&starling_testkit::ws_frame_header(false, 0x0, 500_000))
        .await
        .unwrap();
    tcp.write_all(&[b'y'; 1000]).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf)).await {
            Err(_) => panic!("not closed; got {}", String::from_utf8_lossy(&seen)),
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
        }
    }
    let seen = String::from_utf8_lossy(&seen);
    assert!(seen.contains("policy-violation"), "{seen}");
    // After authentication the same message is accepted.
    let mut web = server.login_over("alice", WS).await;
    let mut bob = server.login("bob").await;
    web.send(&format!(
        "<message xmlns='jabber:client' to='{}' type='chat'><body>{filler}</body></message>",
        bob.jid
    ))
    .await;
    assert_eq!(body(&bob.recv_message().await), filler);
    drop((c, web)); // see CLOSE_WAIT
    server.stop().await;
}
