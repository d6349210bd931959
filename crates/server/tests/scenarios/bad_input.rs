//! Hostile and malformed input: each case gets the RFC 6120 §4.9.3 stream
//! error it deserves, only the offending session is affected, and the server
//! keeps serving everyone else (DESIGN.md invariant 7).

use starling_testkit::stanza::msg;
use starling_testkit::{error_condition, ns, Client, TestServer};
use std::time::Duration;

const HEADER: &str = "<?xml version='1.0'?><stream:stream to='localhost' version='1.0' \
    xmlns='jabber:client' xmlns:stream='http://etherx.jabber.org/streams'>";

/// After a bad session, two others still talk to each other.
async fn others_still_served(server: &TestServer) {
    let mut a = server.login("witness-a").await;
    let mut b = server.login("witness-b").await;
    a.send(&msg(&b.jid).chat().body("still here").to_string())
        .await;
    let m = b.recv().await;
    assert_eq!(
        m.get_child("body", ns::CLIENT).unwrap().text(),
        "still here"
    );
}

/// Opens a raw plain-TCP stream and sends `payload` after the header.
async fn raw_after_header(server: &TestServer, payload: &str) -> Client {
    let mut c = Client::connect(server.starttls_addr()).await;
    c.open_stream().await;
    c.send(payload).await;
    c
}

#[tokio::test(flavor = "multi_thread")]
async fn garbage_after_header_gets_not_well_formed() {
    // RFC 6120 §4.9.3.13.
    let server = TestServer::start().await;
    let mut c = raw_after_header(&server, "<message><body>unclosed</message>").await;
    c.expect_stream_error("not-well-formed").await;
    let mut c = raw_after_header(&server, "<<<>>>").await;
    c.expect_stream_error("not-well-formed").await;
    others_still_served(&server).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn garbage_instead_of_header_gets_header_then_error() {
    // RFC 6120 §4.9.1.2: the server sends its header even for a bad opening.
    let server = TestServer::start().await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.send("GET / HTTP/1.1\r\nHost: localhost\r\n\r\n").await;
    c.expect_stream_error("not-well-formed").await;
    others_still_served(&server).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_stream_namespace_gets_invalid_namespace() {
    // RFC 6120 §4.9.3.10 (stream namespace) and §4.8.2 (content namespace).
    let server = TestServer::start().await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.send("<stream:stream to='localhost' version='1.0' xmlns='jabber:client' xmlns:stream='urn:wrong'>")
        .await;
    c.expect_stream_error("invalid-namespace").await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.send("<stream:stream to='localhost' version='1.0' xmlns='jabber:server' xmlns:stream='http://etherx.jabber.org/streams'>")
        .await;
    c.expect_stream_error("invalid-namespace").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_host_gets_host_unknown() {
    // RFC 6120 §4.9.3.6.
    let server = TestServer::start().await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.send("<stream:stream to='elsewhere.example' version='1.0' xmlns='jabber:client' xmlns:stream='http://etherx.jabber.org/streams'>")
        .await;
    c.expect_stream_error("host-unknown").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn old_stream_version_gets_unsupported_version() {
    // RFC 6120 §4.9.3.25: pre-1.0 streams are not supported.
    let server = TestServer::start().await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.send("<stream:stream to='localhost' xmlns='jabber:client' xmlns:stream='http://etherx.jabber.org/streams'>")
        .await;
    c.expect_stream_error("unsupported-version").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dtd_comment_pi_and_entities_get_restricted_xml() {
    // RFC 6120 §11.1 and §4.9.3.18.
    let server = TestServer::start().await;
    for payload in [
        "<!-- a comment -->",
        "<?evil instruction?>",
        "<message><body>&custom;</body></message>",
    ] {
        let mut c = raw_after_header(&server, payload).await;
        c.expect_stream_error("restricted-xml").await;
    }
    let mut c = Client::connect(server.starttls_addr()).await;
    c.send("<?xml version='1.0'?><!DOCTYPE stream [<!ENTITY lol 'lol'>]>")
        .await;
    c.expect_stream_error("restricted-xml").await;
    others_still_served(&server).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_stanza_gets_policy_violation() {
    // RFC 6120 §13.12 item 4 and §4.9.3.14.
    let server = TestServer::start_with(|c| c.c2s.max_stanza_bytes = 16 * 1024).await;
    let mut alice = server.login("alice").await;
    let big = "x".repeat(20 * 1024);
    alice
        .send(&format!(
            "<message to='bob@localhost'><body>{big}</body></message>"
        ))
        .await;
    alice.expect_stream_error("policy-violation").await;
    others_still_served(&server).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn endless_stanza_is_cut_without_buffering_it_all() {
    // An attacker streams a never-ending text node: the limit applies while
    // it arrives, not after.
    let server = TestServer::start_with(|c| c.c2s.max_stanza_bytes = 16 * 1024).await;
    let mut alice = server.login("alice").await;
    alice.send("<message to='bob@localhost'><body>").await;
    let chunk = "y".repeat(4096);
    let mut sent = 0;
    while sent < 1024 * 1024 && alice.try_send_raw(chunk.as_bytes()).await {
        sent += chunk.len();
    }
    alice.expect_stream_error("policy-violation").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deep_nesting_gets_policy_violation() {
    let server = TestServer::start_with(|c| c.c2s.max_depth = 32).await;
    let mut alice = server.login("alice").await;
    let open = "<x>".repeat(100);
    alice
        .send(&format!("<message to='bob@localhost'>{open}"))
        .await;
    alice.expect_stream_error("policy-violation").await;
    others_still_served(&server).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn too_many_attributes_gets_policy_violation() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let attrs: String = (0..200).map(|i| format!(" a{i}='v'")).collect();
    alice
        .send(&format!("<message to='bob@localhost'{attrs}/>"))
        .await;
    alice.expect_stream_error("policy-violation").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_top_level_element_gets_unsupported_stanza_type() {
    // RFC 6120 §4.9.3.24.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    alice.send("<foo xmlns='jabber:client'/>").await;
    alice.expect_stream_error("unsupported-stanza-type").await;
    let mut bob = server.login("bob").await;
    bob.send("<bar xmlns='urn:example:other'/>").await;
    bob.expect_stream_error("unsupported-stanza-type").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stanza_before_auth_gets_not_authorized() {
    // RFC 6120 §4.9.3.12.
    let server = TestServer::start().await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.negotiate_tls().await;
    c.send("<message to='bob@localhost'><body>let me in</body></message>")
        .await;
    c.expect_stream_error("not-authorized").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stanza_before_starttls_gets_policy_violation() {
    // TLS is required before anything but STARTTLS (RFC 6120 §5.3.1).
    let server = TestServer::start().await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.open_stream().await;
    c.send("<iq type='get' id='r'><query xmlns='jabber:iq:register'/></iq>")
        .await;
    c.expect_stream_error("policy-violation").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn starttls_pipelined_plaintext_is_discarded() {
    // RFC 6120 §5.4.3.3 / STARTTLS command injection: bytes sent in clear
    // after <starttls/> must not be processed inside the TLS stream.
    let server = TestServer::start().await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.open_stream().await;
    // The injected stanza would be a protocol error if processed later.
    c.send("<starttls xmlns='urn:ietf:params:xml:ns:xmpp-tls'/><bogus/>")
        .await;
    let proceed = c.recv().await;
    assert!(proceed.is("proceed", ns::TLS));
    // The handshake then fails or succeeds cleanly; the server must not
    // panic and must keep serving.
    drop(c);
    others_still_served(&server).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sql_looking_strings_are_plain_data() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let evil = "'; DROP TABLE accounts; --";
    alice
        .send(&format!(
            "<message to='{}' type='chat'><body>{evil}</body></message>",
            bob.jid
        ))
        .await;
    assert_eq!(
        bob.recv()
            .await
            .get_child("body", ns::CLIENT)
            .unwrap()
            .text(),
        evil
    );
    // As an account name over SASL (legal localpart characters only).
    let mut c = Client::connect(server.starttls_addr()).await;
    c.negotiate_tls().await;
    let f = c
        .auth(
            starling_proto::sasl::Mechanism::ScramSha256,
            "x);DELETE_FROM_accounts;--",
            "pw",
        )
        .await
        .unwrap_err();
    assert!(f.has_child("not-authorized", ns::SASL));
    // Nothing was harmed: alice's account still works.
    let again = server.login("alice").await;
    assert!(again.jid.starts_with("alice@localhost/"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn flood_is_throttled_and_others_unaffected() {
    // A client sending far beyond its byte budget is slowed down, not
    // disconnected; other sessions keep their latency.
    let server = TestServer::start_with(|c| {
        c.c2s.max_bytes_per_second = 64 * 1024;
        c.c2s.max_stanza_bytes = 16 * 1024; // burst = max(rate, stanza limit) = 64 KiB
    })
    .await;
    let mut flooder = server.login("flooder").await;
    let mut a = server.login("a").await;
    let mut b = server.login("b").await;
    // 512 KiB of headlines (fits in socket buffers), then a ping: at 64 KiB/s
    // the server reaches the ping only after ~7 s.
    let headline = format!(
        "<message to='nobody@localhost' type='headline'><body>{}</body></message>",
        "z".repeat(950)
    );
    let flood: String = std::iter::repeat_n(headline.as_str(), 512).collect();
    let flood_start = std::time::Instant::now();
    flooder.send(&flood).await;
    flooder
        .send("<iq to='localhost' type='get' id='after-flood'><ping xmlns='urn:xmpp:ping'/></iq>")
        .await;
    let start = std::time::Instant::now();
    for i in 0..20 {
        a.send(&msg(&b.jid).chat().body(&i.to_string()).to_string())
            .await;
        assert_eq!(
            b.recv().await.get_child("body", ns::CLIENT).unwrap().text(),
            i.to_string()
        );
    }
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "others were slowed by the flood"
    );
    // The flooder's own ping waits behind its throttled bytes (448 KiB
    // past the burst at 64 KiB/s: 7 s), nothing coming before it...
    let pong = flooder.recv().await;
    assert_eq!(pong.attr("id"), Some("after-flood"), "{pong}");
    assert!(
        flood_start.elapsed() >= Duration::from_secs(5),
        "the flood was not slowed: {:?}",
        flood_start.elapsed()
    );
    // ...but the flooder is not disconnected: the ping is answered.
    assert_eq!(pong.attr("type"), Some("result"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn iq_with_bogus_type_gets_bad_request() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    alice
        .send("<iq type='bogus' id='t' to='localhost'><ping xmlns='urn:xmpp:ping'/></iq>")
        .await;
    assert_eq!(
        error_condition(&alice.recv().await).as_deref(),
        Some("bad-request")
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn random_bytes_never_crash_the_server() {
    // Many sessions feed random bytes; the server answers each with a
    // stream error or closes it, and keeps serving.
    let server = TestServer::start().await;
    let mut seed: u64 = 0x5eed;
    for _ in 0..30 {
        let mut c = Client::connect(server.starttls_addr()).await;
        let mut bytes = HEADER.as_bytes().to_vec();
        for _ in 0..256 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            bytes.push((seed >> 33) as u8);
        }
        c.try_send_raw(&bytes).await;
        drop(c);
    }
    others_still_served(&server).await;
    server.stop().await;
}
