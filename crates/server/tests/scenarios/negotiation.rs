//! Stream negotiation over real sockets: RFC 6120 §4 (streams), §5
//! (STARTTLS), §6 (SASL), §7 (resource binding), XEP-0368 (direct TLS),
//! XEP-0440 (channel-binding advertisement), legacy session iq.

use starling_proto::sasl::{ChannelBindingType, Mechanism};
use starling_testkit::stanza::msg;
use starling_testkit::{ns, Client, Event, TestServer};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread")]
async fn features_before_tls_offer_only_required_starttls() {
    // RFC 6120 §5.3.1: TLS required → only STARTTLS, marked <required/>.
    let server = TestServer::start().await;
    let mut c = Client::connect(server.starttls_addr()).await;
    let f = c.open_stream().await;
    let starttls = f.get_child("starttls", ns::TLS).expect("starttls offered");
    assert!(starttls.has_child("required", ns::TLS));
    assert!(
        !f.has_child("mechanisms", ns::SASL),
        "no SASL before TLS: {f}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn features_after_tls_list_scram_plus_plain_and_channel_bindings() {
    // RFC 6120 §6.3.3 mechanisms; XEP-0440 §3 channel-binding types.
    let server = TestServer::start().await;
    let mut c = Client::connect(server.starttls_addr()).await;
    let f = c.negotiate_tls().await;
    assert!(!f.has_child("starttls", ns::TLS));
    let mechs = c.mechanisms();
    for m in [
        "SCRAM-SHA-512-PLUS",
        "SCRAM-SHA-512",
        "SCRAM-SHA-256-PLUS",
        "SCRAM-SHA-256",
        "SCRAM-SHA-1-PLUS",
        "SCRAM-SHA-1",
        "PLAIN",
    ] {
        assert!(mechs.iter().any(|x| x == m), "{m} missing from {mechs:?}");
    }
    let cb = f
        .get_child("sasl-channel-binding", ns::SASL_CB)
        .expect("XEP-0440 element");
    let types: Vec<_> = cb.children().filter_map(|c| c.attr("type")).collect();
    assert!(
        types.contains(&"tls-exporter") && types.contains(&"tls-server-end-point"),
        "{types:?}"
    );
    // XEP-0077 §4: registration feature (enabled in tests).
    assert!(f.has_child("register", ns::REGISTER_FEATURE));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn login_every_scram_mechanism_and_plain_succeeds() {
    let server = TestServer::start().await;
    server.create_user("alice", "secret").await;
    for mech in [
        Mechanism::ScramSha1,
        Mechanism::ScramSha256,
        Mechanism::ScramSha512,
        Mechanism::ScramSha1Plus,
        Mechanism::ScramSha256Plus,
        Mechanism::ScramSha512Plus,
        Mechanism::Plain,
    ] {
        let mut c = Client::connect(server.starttls_addr()).await;
        c.negotiate_tls().await;
        c.auth(mech, "alice", "secret")
            .await
            .unwrap_or_else(|f| panic!("{} failed: {f}", mech.name()));
        // §7: after SASL, bind and the optional legacy session are offered.
        let f = c.features.clone().unwrap();
        assert!(f.has_child("bind", ns::BIND), "{f}");
        assert!(f
            .get_child("session", ns::SESSION)
            .unwrap()
            .has_child("optional", ns::SESSION));
        let jid = c.bind(Some("r1")).await;
        assert_eq!(jid, "alice@localhost/r1");
        c.close().await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn login_with_full_address_as_username_succeeds() {
    // Regression (issue 9): PLAIN with authcid `alice@localhost` got
    // not-authorized. RFC 6120 §6.3.7 calls for the simple user name, but
    // clients send the bare JID; it names the same account when its domain
    // is the stream's (compared after normalisation, RFC 7622 §3.2). SCRAM
    // (`n=alice@localhost`) is treated the same way, as ejabberd does.
    let server = TestServer::start().await;
    server.create_user("alice", "secret").await;
    for (mech, user) in [
        (Mechanism::Plain, "alice@localhost"),
        (Mechanism::Plain, "alice@LocalHost"),
        (Mechanism::ScramSha256, "alice@localhost"),
        (Mechanism::ScramSha1Plus, "alice@localhost"),
    ] {
        let mut c = Client::connect(server.starttls_addr()).await;
        c.negotiate_tls().await;
        c.auth(mech, user, "secret")
            .await
            .unwrap_or_else(|f| panic!("{} as {user} failed: {f}", mech.name()));
        assert_eq!(c.bind(Some("r1")).await, "alice@localhost/r1");
        c.close().await;
    }
    // An address in another domain is refused on a stream to localhost,
    // even when that account exists.
    let server2 = TestServer::start_with(|c| c.server.domains.push("example.org".into())).await;
    server2.create_user("alice", "secret").await;
    let other = starling_proto::BareJid::new("alice@example.org").unwrap();
    starling_server::accounts::create(&server2.server.env.storage, &other, "secret", 4096)
        .await
        .unwrap();
    for (mech, user) in [
        (Mechanism::Plain, "alice@example.org"),
        (Mechanism::ScramSha256, "alice@example.org"),
        (Mechanism::Plain, "alice@localhost/res"),
    ] {
        let mut c = Client::connect(server2.starttls_addr()).await;
        c.negotiate_tls().await;
        let f = c.auth(mech, user, "secret").await.unwrap_err();
        assert!(f.has_child("not-authorized", ns::SASL), "{user}: {f}");
    }
    server.stop().await;
    server2.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn scram_plus_with_tls_server_end_point_succeeds() {
    // RFC 5929 §4 binding type, advertised per XEP-0440.
    let server = TestServer::start().await;
    server.create_user("alice", "secret").await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.negotiate_tls().await;
    let ty = ChannelBindingType::TlsServerEndPoint;
    let data = c.channel_binding(ty);
    c.auth_with_binding(
        Mechanism::ScramSha256Plus,
        "alice",
        "secret",
        Some((ty, data)),
    )
    .await
    .expect("tls-server-end-point binding accepted");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reconnecting_client_resumes_its_tls_session_and_binds_channels_to_it() {
    // RFC 8446 §2.2 / §4.6.1: the server sends a session ticket; a client
    // that keeps it resumes without a certificate signature on its next
    // connection. RFC 9266: tls-exporter is still unique per connection, so
    // SCRAM-PLUS works on the resumed session too.
    let server = TestServer::start().await;
    server.create_user("alice", "secret").await;
    let device = starling_testkit::device_tls();
    for (round, expected) in [
        (1, rustls::HandshakeKind::Full),
        (2, rustls::HandshakeKind::Resumed),
        (3, rustls::HandshakeKind::Resumed),
    ] {
        let mut c = Client::connect(server.starttls_addr()).await;
        c.open_stream().await;
        c.starttls_via(&device).await;
        assert_eq!(c.tls_handshake_kind(), Some(expected), "connection {round}");
        let ty = ChannelBindingType::TlsExporter;
        let data = c.channel_binding(ty);
        c.auth_with_binding(
            Mechanism::ScramSha256Plus,
            "alice",
            "secret",
            Some((ty, data)),
        )
        .await
        .expect("tls-exporter binding accepted");
        c.bind(None).await;
        c.close().await;
        if round == 1 {
            // More clients than a 256-entry server-side session cache
            // holds: stateless tickets are not evicted by them.
            for _ in 0..300 {
                let other = Client::connect_direct_tls(server.direct_addr()).await;
                drop(other);
            }
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn scram_plus_with_wrong_binding_data_fails() {
    // RFC 5802 §6: the server verifies the channel binding data.
    let server = TestServer::start().await;
    server.create_user("alice", "secret").await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.negotiate_tls().await;
    let err = c
        .auth_with_binding(
            Mechanism::ScramSha256Plus,
            "alice",
            "secret",
            Some((ChannelBindingType::TlsExporter, vec![0u8; 32])),
        )
        .await
        .expect_err("forged binding rejected");
    assert!(err.has_child("not-authorized", ns::SASL), "{err}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn direct_tls_login_and_ping_succeeds() {
    // XEP-0368: TLS from the first byte; no STARTTLS offered inside.
    let server = TestServer::start().await;
    server.create_user("alice", "secret").await;
    let mut c = Client::connect_direct_tls(server.direct_addr()).await;
    let f = c.features.clone().unwrap();
    assert!(!f.has_child("starttls", ns::TLS));
    assert!(c.mechanisms().iter().any(|m| m == "SCRAM-SHA-256-PLUS"));
    c.auth(Mechanism::ScramSha256Plus, "alice", "secret")
        .await
        .unwrap();
    c.bind(None).await;
    let reply = c
        .iq(
            "<iq type='get' id='p1' to='localhost'><ping xmlns='urn:xmpp:ping'/></iq>",
            "p1",
        )
        .await;
    assert_eq!(reply.attr("type"), Some("result"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_password_fails_then_policy_violation_after_max_attempts() {
    // RFC 6120 §6.4.5: retries allowed, then <policy-violation/>.
    let server = TestServer::start().await;
    server.create_user("alice", "secret").await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.negotiate_tls().await;
    for _ in 0..2 {
        let f = c
            .auth(Mechanism::ScramSha256, "alice", "nope")
            .await
            .unwrap_err();
        assert!(f.has_child("not-authorized", ns::SASL), "{f}");
    }
    // Third failure hits the default limit of 3.
    let f = c
        .auth(Mechanism::ScramSha256, "alice", "nope")
        .await
        .unwrap_err();
    assert!(f.has_child("not-authorized", ns::SASL), "{f}");
    c.expect_stream_error("policy-violation").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_user_fails_like_wrong_password() {
    let server = TestServer::start().await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.negotiate_tls().await;
    for mech in [Mechanism::ScramSha256, Mechanism::Plain] {
        let f = c.auth(mech, "nobody", "x").await.unwrap_err();
        assert!(f.has_child("not-authorized", ns::SASL), "{f}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn per_ip_failure_limit_refuses_further_attempts() {
    let server = TestServer::start_with(|c| {
        c.auth.max_failures_per_ip = 2;
        c.c2s.max_auth_attempts = 5;
    })
    .await;
    server.create_user("alice", "secret").await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.negotiate_tls().await;
    for _ in 0..2 {
        c.auth(Mechanism::ScramSha256, "alice", "bad")
            .await
            .unwrap_err();
    }
    // Even the right password is refused while the address is limited.
    let mut c2 = Client::connect(server.starttls_addr()).await;
    c2.negotiate_tls().await;
    let f = c2
        .auth(Mechanism::ScramSha256, "alice", "secret")
        .await
        .unwrap_err();
    assert!(f.has_child("temporary-auth-failure", ns::SASL), "{f}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn auth_before_tls_gets_encryption_required() {
    // RFC 6120 §6.5.4 (encryption-required) when TLS is mandatory.
    let server = TestServer::start().await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.open_stream().await;
    c.send("<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' mechanism='PLAIN'>AGEAYg==</auth>")
        .await;
    let f = c.recv().await;
    assert!(f.has_child("encryption-required", ns::SASL), "{f}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn plaintext_allowed_offers_scram_but_never_plain() {
    // PLAIN only over TLS, even when plain-text streams are allowed.
    let server = TestServer::start_with(|c| c.c2s.require_tls = false).await;
    server.create_user("alice", "secret").await;
    let mut c = Client::connect(server.starttls_addr()).await;
    let f = c.open_stream().await;
    assert!(!f
        .get_child("starttls", ns::TLS)
        .unwrap()
        .has_child("required", ns::TLS));
    let mechs = c.mechanisms();
    assert!(mechs.contains(&"SCRAM-SHA-256".to_string()), "{mechs:?}");
    assert!(
        !mechs.iter().any(|m| m == "PLAIN" || m.ends_with("-PLUS")),
        "{mechs:?}"
    );
    c.auth(Mechanism::ScramSha256, "alice", "secret")
        .await
        .unwrap();
    assert_eq!(
        c.bind(None).await.split('/').next(),
        Some("alice@localhost")
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn auth_without_initial_response_gets_empty_challenge() {
    // RFC 6120 §6.4.2: no initial response → empty challenge.
    let server = TestServer::start().await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.negotiate_tls().await;
    c.send("<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' mechanism='SCRAM-SHA-256'/>")
        .await;
    let ch = c.recv().await;
    assert!(ch.is("challenge", ns::SASL), "{ch}");
    assert_eq!(ch.text(), "=");
    c.send("<abort xmlns='urn:ietf:params:xml:ns:xmpp-sasl'/>")
        .await;
    let f = c.recv().await;
    assert!(f.has_child("aborted", ns::SASL), "{f}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_mechanism_gets_invalid_mechanism() {
    let server = TestServer::start().await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.negotiate_tls().await;
    c.send("<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' mechanism='DIGEST-MD5'/>")
        .await;
    let f = c.recv().await;
    assert!(f.has_child("invalid-mechanism", ns::SASL), "{f}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bind_without_resource_generates_one() {
    // RFC 6120 §7.6: server-generated resource.
    let server = TestServer::start().await;
    let c = server.login("alice").await;
    let (bare, res) = c.jid.split_once('/').expect("full JID");
    assert_eq!(bare, "alice@localhost");
    assert!(res.len() >= 10, "{res}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bind_same_resource_replaces_old_session_with_conflict() {
    // RFC 6120 §7.7.2.2: the new session wins; the old one gets <conflict/>.
    let server = TestServer::start().await;
    server.create_user("alice", "secret").await;
    let mut old = Client::connect(server.starttls_addr()).await;
    old.negotiate_tls().await;
    old.auth(Mechanism::ScramSha256, "alice", "secret")
        .await
        .unwrap();
    old.bind(Some("phone")).await;
    let mut new = Client::connect(server.starttls_addr()).await;
    new.negotiate_tls().await;
    new.auth(Mechanism::ScramSha256, "alice", "secret")
        .await
        .unwrap();
    assert_eq!(new.bind(Some("phone")).await, "alice@localhost/phone");
    old.expect_stream_error("conflict").await;
    // The new session is the one routed to.
    let mut bob = server.login("bob").await;
    bob.send("<message to='alice@localhost/phone' id='m1'><body>hi</body></message>")
        .await;
    let m = new.recv().await;
    assert_eq!(m.attr("id"), Some("m1"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_resource_gets_bad_request() {
    // RFC 6120 §7.7.2.1.
    let server = TestServer::start().await;
    server.create_user("alice", "secret").await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.negotiate_tls().await;
    c.auth(Mechanism::ScramSha256, "alice", "secret")
        .await
        .unwrap();
    // RFC 7622 §3.4: a resourcepart is at most 1023 bytes.
    let long = "r".repeat(1100);
    let reply = c
        .iq(
            &format!("<iq type='set' id='b'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'><resource>{long}</resource></bind></iq>"),
            "b",
        )
        .await;
    assert_eq!(
        starling_testkit::error_condition(&reply).as_deref(),
        Some("bad-request"),
        "{reply}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn legacy_session_iq_returns_result() {
    let server = TestServer::start().await;
    let mut c = server.login("alice").await;
    let r = c
        .iq(
            "<iq type='set' id='s1'><session xmlns='urn:ietf:params:xml:ns:xmpp-session'/></iq>",
            "s1",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stanza_before_bind_gets_not_authorized() {
    let server = TestServer::start().await;
    server.create_user("alice", "secret").await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.negotiate_tls().await;
    c.auth(Mechanism::ScramSha256, "alice", "secret")
        .await
        .unwrap();
    c.send("<message to='bob@localhost'><body>x</body></message>")
        .await;
    c.expect_stream_error("not-authorized").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_unauthenticated_stream_gets_connection_timeout() {
    // RFC 6120 §4.9.3.4.
    let server = TestServer::start_with(|c| c.c2s.negotiation_timeout_secs = 1).await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.open_stream().await;
    c.expect_stream_error("connection-timeout").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_close_gets_close_back() {
    // RFC 6120 §4.4.
    let server = TestServer::start().await;
    let mut c = server.login("alice").await;
    c.send("</stream:stream>").await;
    match c.next_event().await {
        Event::Close => {}
        other => panic!("expected </stream:stream>, got {other:?}"),
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_closes_streams_with_system_shutdown() {
    // RFC 6120 §4.9.3.20.
    let server = TestServer::start().await;
    let mut c = server.login("alice").await;
    let stop = tokio::spawn(server.stop());
    c.expect_stream_error("system-shutdown").await;
    stop.await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn whitespace_keepalives_are_accepted() {
    // RFC 6120 §4.6.1.
    let server = TestServer::start().await;
    let mut c = server.login("alice").await;
    for _ in 0..5 {
        c.send(" ").await;
    }
    c.send("\n\t ").await;
    // The answer comes first (no error for the whitespace), and nothing
    // after it either.
    c.send("<iq type='get' id='p' to='localhost'><ping xmlns='urn:xmpp:ping'/></iq>")
        .await;
    let r = c.recv().await;
    assert_eq!(r.attr("id"), Some("p"), "{r}");
    assert_eq!(r.attr("type"), Some("result"));
    c.expect_nothing().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_sessions_stanzas_and_auth_failures() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    alice
        .send(&msg(&bob.jid).chat().body("m").to_string())
        .await;
    bob.recv().await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.negotiate_tls().await;
    c.auth(Mechanism::ScramSha256, "alice", "wrong")
        .await
        .unwrap_err();
    let text = server.server.env.metrics.encode();
    let value = |name: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing in:\n{text}"))
    };
    assert_eq!(value("starling_c2s_sessions "), 2.0);
    assert_eq!(
        value("starling_auth_failures_total{reason=\"not-authorized\"} "),
        1.0
    );
    assert!(value("starling_auth_success_total{mechanism=\"SCRAM-SHA-256\"} ") >= 2.0);
    assert!(value("starling_stanzas_in_total{kind=\"message\"} ") >= 1.0);
    assert!(value("starling_stanzas_out_total{kind=\"message\"} ") >= 1.0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_session_hibernates_parser_and_resumes() {
    // After a quiet period the session frees its XML parser; the stream
    // (with its namespace context) must continue seamlessly.
    let server = TestServer::start_with(|c| c.c2s.hibernate_after_secs = 1).await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    // sleep: the point — a second and a half of quiet, past
    // hibernate_after_secs (nothing outside the session shows the parser
    // hibernated).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    alice
        .send(
            &msg(&bob.jid)
                .chat()
                .body("after nap")
                .child("<x xmlns='urn:example:x'/>")
                .to_string(),
        )
        .await;
    let m = bob.recv().await;
    assert_eq!(m.get_child("body", ns::CLIENT).unwrap().text(), "after nap");
    assert!(m.has_child("x", "urn:example:x"));
    server.stop().await;
}
