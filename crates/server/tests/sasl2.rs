//! XEP-0388 Extensible SASL Profile (SASL2) over real sockets: the
//! `<authentication/>` feature, `<authenticate/>` with an initial response
//! and `<user-agent/>`, challenges and responses, `<success/>` with the
//! authorization identifier and the mechanism's additional data, the
//! features of the authenticated stream without a stream restart, and
//! `<failure/>` with RFC 6120 §6.5 conditions.

use starling_proto::sasl::Mechanism;
use starling_testkit::{ns, Client, TestServer};

const NS2: &str = "urn:xmpp:sasl:2";

async fn tls_client(server: &TestServer) -> (Client, starling_testkit::starling_xml::Element) {
    let mut c = Client::connect(server.starttls_addr()).await;
    let f = c.negotiate_tls().await;
    (c, f)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_feature_lists_the_sasl_mechanisms_and_only_over_tls() {
    // XEP-0388 §2.1 (feature, mechanisms), §9 (only after TLS).
    let server = TestServer::start_with(|c| c.c2s.require_tls = false).await;
    let mut plain = Client::connect(server.starttls_addr()).await;
    let f = plain.open_stream().await;
    assert!(f.has_child("mechanisms", ns::SASL), "{f}");
    assert!(
        !f.has_child("authentication", NS2),
        "no SASL2 in the clear: {f}"
    );
    // Over TLS: the very mechanisms of the SASL feature.
    let (_, f) = tls_client(&server).await;
    let v1: Vec<String> = f
        .get_child("mechanisms", ns::SASL)
        .unwrap()
        .children()
        .map(|m| m.text())
        .collect();
    let v2: Vec<String> = f
        .get_child("authentication", NS2)
        .expect("SASL2 offered after TLS")
        .children()
        .filter(|c| c.name() == "mechanism")
        .map(|m| m.text())
        .collect();
    assert_eq!(v1, v2);
    assert!(v2.iter().any(|m| m == "SCRAM-SHA-256-PLUS"), "{v2:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn scram_succeeds_with_the_identity_and_features_and_no_restart() {
    // XEP-0388 §2.6.1: <success/> holds the server-final message as
    // additional data and the authorization identifier (a bare JID, no
    // resource bound yet); the features follow without a restart.
    let server = TestServer::start().await;
    server.create_user("alice", "secret").await;
    let mut bob = server.login("bob").await;
    for mech in [
        Mechanism::ScramSha256,
        Mechanism::ScramSha256Plus,
        Mechanism::ScramSha1,
    ] {
        let (mut c, _) = tls_client(&server).await;
        let success = c
            .auth_sasl2(mech, "alice", "secret", "")
            .await
            .unwrap_or_else(|e| panic!("{mech:?}: {e}"));
        assert_eq!(
            success
                .get_child("authorization-identifier", NS2)
                .map(|a| a.text())
                .as_deref(),
            Some("alice@localhost"),
            "{success}"
        );
        let f = c.features.clone().unwrap();
        assert!(
            f.has_child("bind", ns::BIND),
            "resource binding offered: {f}"
        );
        assert!(!f.has_child("authentication", NS2), "{f}");
        // The stream goes on: bind and chat.
        let jid = c.bind(None).await;
        assert!(jid.starts_with("alice@localhost/"), "{jid}");
        c.send(&format!(
            "<message to='{}' type='chat'><body>{mech:?}</body></message>",
            bob.jid
        ))
        .await;
        let m = bob.recv_message().await;
        assert_eq!(m.attr("from"), Some(jid.as_str()));
        c.close().await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_succeeds_without_additional_data() {
    let server = TestServer::start().await;
    server.create_user("alice", "secret").await;
    let (mut c, _) = tls_client(&server).await;
    let success = c
        .auth_sasl2(Mechanism::Plain, "alice@localhost", "secret", "")
        .await
        .unwrap();
    assert!(!success.has_child("additional-data", NS2), "{success}");
    assert!(c.bind(Some("r")).await.ends_with("/r"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_carry_the_rfc6120_condition_and_count_against_the_limit() {
    // XEP-0388 §2.6.2: <failure/> with a §6.5 condition; wrong passwords
    // count like SASL1 failures (RFC 6120 §6.4.5: then policy-violation).
    let server = TestServer::start().await;
    server.create_user("alice", "secret").await;
    let (mut c, _) = tls_client(&server).await;
    // An unknown mechanism.
    c.send(&format!(
        "<authenticate xmlns='{NS2}' mechanism='X-UNKNOWN'><initial-response>AA==</initial-response></authenticate>"
    ))
    .await;
    let f = c.recv().await;
    assert!(f.is("failure", NS2), "{f}");
    assert!(f.has_child("invalid-mechanism", ns::SASL), "{f}");
    // An aborted exchange is no failure of the user's.
    c.send(&format!(
        "<authenticate xmlns='{NS2}' mechanism='SCRAM-SHA-256'/>"
    ))
    .await;
    let challenge = c.recv().await;
    assert!(
        challenge.is("challenge", NS2),
        "empty challenge: {challenge}"
    );
    c.send(&format!("<abort xmlns='{NS2}'/>")).await;
    let f = c.recv().await;
    assert!(
        f.is("failure", NS2) && f.has_child("aborted", ns::SASL),
        "{f}"
    );
    // Wrong passwords: the first two are answered, the third ends the
    // stream (the default limit of 3 counts the unknown mechanism too).
    let f = c
        .auth_sasl2(Mechanism::ScramSha256, "alice", "nope", "")
        .await
        .unwrap_err();
    assert!(f.is("failure", NS2), "{f}");
    assert!(f.has_child("not-authorized", ns::SASL), "{f}");
    let f = c
        .auth_sasl2(Mechanism::Plain, "alice", "nope", "")
        .await
        .unwrap_err();
    assert!(f.has_child("not-authorized", ns::SASL), "{f}");
    c.expect_stream_error("policy-violation").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sasl1_response_inside_a_sasl2_exchange_is_refused() {
    let server = TestServer::start().await;
    server.create_user("alice", "secret").await;
    let (mut c, _) = tls_client(&server).await;
    c.send(&format!(
        "<authenticate xmlns='{NS2}' mechanism='SCRAM-SHA-256'/>"
    ))
    .await;
    assert!(c.recv().await.is("challenge", NS2));
    c.send("<response xmlns='urn:ietf:params:xml:ns:xmpp-sasl'>AA==</response>")
        .await;
    let f = c.recv().await;
    assert!(f.is("failure", ns::SASL), "{f}");
    assert!(f.has_child("malformed-request", ns::SASL), "{f}");
    // Still usable.
    c.auth_sasl2(Mechanism::ScramSha256, "alice", "secret", "")
        .await
        .expect("a fresh SASL2 exchange succeeds");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sasl2_is_refused_on_a_stream_without_tls() {
    // XEP-0388 §9: "SASL2 MUST only be used … after TLS negotiation".
    let server = TestServer::start_with(|c| c.c2s.require_tls = false).await;
    server.create_user("alice", "secret").await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.open_stream().await;
    c.send(&format!(
        "<authenticate xmlns='{NS2}' mechanism='SCRAM-SHA-256'><initial-response>biwsbj1hbGljZSxyPWFiY2RlZmdoaWprbG1ub3A=</initial-response></authenticate>"
    ))
    .await;
    let f = c.recv().await;
    assert!(f.is("failure", NS2), "{f}");
    assert!(f.has_child("encryption-required", ns::SASL), "{f}");
    server.stop().await;
}
