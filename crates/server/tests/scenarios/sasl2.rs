//! XEP-0388 Extensible SASL Profile (SASL2) over real sockets: the
//! `<authentication/>` feature, `<authenticate/>` with an initial response
//! and `<user-agent/>`, challenges and responses, `<success/>` with the
//! authorization identifier and the mechanism's additional data, the
//! features of the authenticated stream without a stream restart, and
//! `<failure/>` with RFC 6120 §6.5 conditions.

use starling_proto::sasl::Mechanism;
use starling_testkit::stanza::msg;
use starling_testkit::{ns, Client, TestServer, SASL2_USER_AGENT};

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
        c.send(&msg(&bob.jid).chat().body(&format!("{mech:?}")).to_string())
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

const NS_BIND2: &str = "urn:xmpp:bind:0";
const NS_SM: &str = "urn:xmpp:sm:3";

#[tokio::test(flavor = "multi_thread")]
async fn bind2_is_offered_with_its_inline_features() {
    // XEP-0386 §3.1: <bind/> in SASL2's <inline/>, listing what a bind
    // request may enable.
    let server = TestServer::start().await;
    let (_, f) = tls_client(&server).await;
    let bind = f
        .get_child("authentication", NS2)
        .and_then(|a| a.get_child("inline", NS2))
        .and_then(|i| i.get_child("bind", NS_BIND2))
        .unwrap_or_else(|| panic!("Bind 2 offered: {f}"));
    let vars: Vec<&str> = bind
        .get_child("inline", NS_BIND2)
        .expect("inline features")
        .children()
        .filter_map(|c| c.attr("var"))
        .collect();
    for v in ["urn:xmpp:sm:3", "urn:xmpp:carbons:2", "urn:xmpp:csi:0"] {
        assert!(vars.contains(&v), "{v} in {vars:?}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bind2_binds_a_tagged_resource_and_enables_sm_and_carbons_inline() {
    // XEP-0386 §3.2–3.3, XEP-0198 "Enable Stream Management Inline".
    let server = TestServer::start().await;
    let mut bob = server.login("bob").await;
    let mut other = server.login("alice").await; // alice's other device
    let (mut c, _) = tls_client(&server).await;
    let success = c
        .auth_sasl2(
            Mechanism::ScramSha256,
            "alice",
            "pw-alice",
            &format!("<bind xmlns='{NS_BIND2}'><tag>Tester</tag><enable xmlns='{NS_SM}' resume='true'/><enable xmlns='urn:xmpp:carbons:2'/></bind>"),
        )
        .await
        .unwrap();
    let full = success
        .get_child("authorization-identifier", NS2)
        .map(|a| a.text())
        .unwrap();
    assert!(full.starts_with("alice@localhost/Tester/"), "{full}");
    assert!(full.len() > "alice@localhost/Tester/".len(), "{full}");
    let bound = success
        .get_child("bound", NS_BIND2)
        .unwrap_or_else(|| panic!("<bound/> in {success}"));
    let enabled = bound
        .get_child("enabled", NS_SM)
        .unwrap_or_else(|| panic!("<enabled/> in {bound}"));
    assert_eq!(enabled.attr("resume"), Some("true"), "{enabled}");
    assert!(enabled.attr("id").is_some_and(|id| !id.is_empty()));
    // Nothing left to negotiate on the bound stream.
    let f = c.features.clone().unwrap();
    assert!(!f.has_child("bind", ns::BIND), "{f}");
    assert!(!f.has_child("sm", NS_SM), "{f}");
    c.jid = full.clone();
    c.send("<presence/>").await;
    let echo = c.recv().await;
    assert_eq!(echo.attr("from"), Some(full.as_str()), "{echo}");
    // Carbons are on: bob's message to the other device is copied here.
    other.recv_until(|e| e.name() == "presence").await;
    bob.send(
        &msg(&other.jid)
            .chat()
            .id("c1")
            .body("to the other device")
            .to_string(),
    )
    .await;
    let copy = c.recv_until(|e| e.name() == "message").await;
    assert!(copy.has_child("received", "urn:xmpp:carbons:2"), "{copy}");
    // Stream management is on: h counts the presence we sent.
    c.send(&format!("<r xmlns='{NS_SM}'/>")).await;
    let a = c.recv_until(|e| e.is("a", NS_SM)).await;
    assert_eq!(a.attr("h"), Some("1"), "{a}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bind2_can_start_the_session_inactive() {
    // XEP-0386 §3.2: "the session must begin in that state" (XEP-0352).
    let server = TestServer::start().await;
    server.create_user("alice", "secret").await;
    let mut bob = server.login("bob").await;
    let (mut c, _) = tls_client(&server).await;
    let success = c
        .auth_sasl2(
            Mechanism::ScramSha256,
            "alice",
            "secret",
            &format!("<bind xmlns='{NS_BIND2}'><inactive xmlns='urn:xmpp:csi:0'/></bind>"),
        )
        .await
        .unwrap();
    let full = success
        .get_child("authorization-identifier", NS2)
        .map(|a| a.text())
        .unwrap();
    assert!(full.starts_with("alice@localhost/"), "{full}");
    // Stream management, for its <r/> → <a/> round trip: a barrier whose
    // answer is no stanza (a ping's answer would be delivered at once,
    // after what is held, §6).
    c.send(&format!("<enable xmlns='{NS_SM}'/>")).await;
    let enabled = c.recv().await;
    assert!(enabled.is("enabled", NS_SM), "{enabled}");
    bob.send(
        &msg(&full)
            .chat()
            .child("<composing xmlns='http://jabber.org/protocol/chatstates'/>")
            .to_string(),
    )
    .await;
    bob.barrier().await; // routed to alice's session, which holds it
    c.send(&format!("<r xmlns='{NS_SM}'/>")).await;
    let a = c.recv().await;
    assert!(a.is("a", NS_SM), "nothing before the ack: {a}");
    c.send("<active xmlns='urn:xmpp:csi:0'/>").await;
    let m = c.recv_until(|e| e.name() == "message").await;
    assert!(
        m.has_child("composing", "http://jabber.org/protocol/chatstates"),
        "{m}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_authentication_binds_nothing() {
    // XEP-0388 "Failure": inline requests of a failed attempt are not
    // processed; a later plain SASL2 success names the bare JID.
    let server = TestServer::start().await;
    server.create_user("alice", "secret").await;
    let (mut c, _) = tls_client(&server).await;
    let f = c
        .auth_sasl2(
            Mechanism::ScramSha256,
            "alice",
            "wrong",
            &format!("<bind xmlns='{NS_BIND2}'><tag>T</tag></bind>"),
        )
        .await
        .unwrap_err();
    assert!(f.has_child("not-authorized", ns::SASL), "{f}");
    assert!(
        server
            .server
            .env
            .sessions
            .resources(&starling_proto::BareJid::new("alice@localhost").unwrap())
            .is_empty(),
        "nothing bound"
    );
    let success = c
        .auth_sasl2(Mechanism::ScramSha256, "alice", "secret", "")
        .await
        .unwrap();
    assert_eq!(
        success
            .get_child("authorization-identifier", NS2)
            .map(|a| a.text())
            .as_deref(),
        Some("alice@localhost")
    );
    server.stop().await;
}

/// Logs in over SASL2 with Bind 2 and stream management (resumable);
/// returns the client, its full JID and the resumption id.
async fn resumable(server: &TestServer, user: &str) -> (Client, String, String) {
    let (mut c, _) = tls_client(server).await;
    let success = c
        .auth_sasl2(
            Mechanism::ScramSha256,
            user,
            &format!("pw-{user}"),
            &format!("<bind xmlns='{NS_BIND2}'><tag>T</tag><enable xmlns='{NS_SM}' resume='true'/></bind>"),
        )
        .await
        .unwrap();
    let full = success
        .get_child("authorization-identifier", NS2)
        .unwrap()
        .text();
    let id = success
        .get_child("bound", NS_BIND2)
        .and_then(|b| b.get_child("enabled", NS_SM))
        .and_then(|e| e.attr("id"))
        .unwrap_or_else(|| panic!("resumable: {success}"))
        .to_owned();
    c.jid = full.clone();
    c.send("<presence/>").await;
    c.recv_until(|e| e.name() == "presence").await;
    (c, full, id)
}

#[tokio::test(flavor = "multi_thread")]
async fn inline_resumption_takes_over_the_detached_session_in_one_exchange() {
    // XEP-0198 "Inline Stream Resumption" with XEP-0388: <sm/> offered in
    // SASL2's <inline/>; <resume/> in <authenticate/> is processed first,
    // a Bind 2 request next to it is ignored, and <success/> names the
    // resumed full JID and carries <resumed/>; unacknowledged stanzas are
    // sent again after the features.
    let server = TestServer::start().await;
    server.create_user("alice", "pw-alice").await;
    let mut bob = server.login("bob").await;
    let (mut c, full, id) = resumable(&server, "alice").await;
    bob.send(&msg(&full).chat().id("u1").body("unacked").to_string())
        .await;
    c.recv_until(|e| e.name() == "message").await; // never acknowledged
    drop(c); // the connection is lost; the session waits

    let (mut c2, f) = tls_client(&server).await;
    let inline = f
        .get_child("authentication", NS2)
        .and_then(|a| a.get_child("inline", NS2))
        .unwrap();
    assert!(
        inline.has_child("sm", NS_SM),
        "inline resumption offered: {inline}"
    );
    let success = c2
        .auth_sasl2(
            Mechanism::ScramSha256,
            "alice",
            "pw-alice",
            &format!("<resume xmlns='{NS_SM}' previd='{id}' h='1'/><bind xmlns='{NS_BIND2}'><tag>T</tag></bind>"),
        )
        .await
        .unwrap();
    assert_eq!(
        success
            .get_child("authorization-identifier", NS2)
            .map(|a| a.text())
            .as_deref(),
        Some(full.as_str()),
        "{success}"
    );
    let resumed = success
        .get_child("resumed", NS_SM)
        .unwrap_or_else(|| panic!("<resumed/> in {success}"));
    assert_eq!(resumed.attr("previd"), Some(id.as_str()));
    assert!(
        !success.has_child("bound", NS_BIND2),
        "bind ignored: {success}"
    );
    c2.jid = full.clone();
    // The presence echo (h=1 acknowledged it) is not resent; the message is.
    let again = c2.recv_until(|e| e.name() == "message").await;
    assert_eq!(again.attr("id"), Some("u1"), "{again}");
    bob.send(&msg(&full).chat().id("u2").body("after").to_string())
        .await;
    let m = c2.recv_until(|e| e.name() == "message").await;
    assert_eq!(m.attr("id"), Some("u2"), "{m}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_inline_resumption_is_reported_and_the_bind_goes_ahead() {
    // XEP-0386 §3.2 note: "If resumption of the previous stream fails, the
    // server MUST include the XEP-0198 failure in the response, and then
    // MUST proceed to process the bind request". Someone else's id fails
    // like an unknown one (the id is bound to its account).
    let server = TestServer::start().await;
    server.create_user("alice", "pw-alice").await;
    server.create_user("mallory", "pw-mallory").await;
    let (c, _, alice_id) = resumable(&server, "alice").await;
    drop(c);
    for previd in ["unknown-id", alice_id.as_str()] {
        let (mut m, _) = tls_client(&server).await;
        let success = m
            .auth_sasl2(
                Mechanism::ScramSha256,
                "mallory",
                "pw-mallory",
                &format!("<resume xmlns='{NS_SM}' previd='{previd}' h='0'/><bind xmlns='{NS_BIND2}'><tag>M</tag></bind>"),
            )
            .await
            .unwrap();
        let failed = success
            .get_child("failed", NS_SM)
            .unwrap_or_else(|| panic!("<failed/> in {success}"));
        assert!(failed.has_child("item-not-found", ns::STANZAS), "{failed}");
        let full = success
            .get_child("authorization-identifier", NS2)
            .unwrap()
            .text();
        assert!(full.starts_with("mallory@localhost/M/"), "{full}");
        assert!(success.has_child("bound", NS_BIND2), "{success}");
    }
    server.stop().await;
}

const NS_FAST: &str = "urn:xmpp:fast:0";

/// Logs in with SCRAM over SASL2 asking for a FAST token for `mechanism`;
/// returns the token.
async fn fast_token(server: &TestServer, user: &str, mechanism: &str) -> String {
    let (mut c, f) = tls_client(server).await;
    let offered: Vec<String> = f
        .get_child("authentication", NS2)
        .and_then(|a| a.get_child("inline", NS2))
        .and_then(|i| i.get_child("fast", NS_FAST))
        .unwrap_or_else(|| panic!("FAST offered: {f}"))
        .children()
        .map(|m| m.text())
        .collect();
    assert!(offered.iter().any(|m| m == mechanism), "{offered:?}");
    let success = c
        .auth_sasl2(
            Mechanism::ScramSha256,
            user,
            &format!("pw-{user}"),
            &format!("<request-token xmlns='{NS_FAST}' mechanism='{mechanism}'/>"),
        )
        .await
        .unwrap();
    let token = success
        .get_child("token", NS_FAST)
        .unwrap_or_else(|| panic!("<token/> in {success}"));
    let expiry = token.attr("expiry").unwrap();
    assert!(expiry.ends_with('Z') && expiry.len() == 24, "{expiry}");
    token.attr("token").unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn fast_tokens_authenticate_in_one_round_trip_bound_to_their_mechanism() {
    // XEP-0484 §4.1–4.3: <fast/> offered inline with HT mechanisms; a
    // token requested at a password login authenticates the same client
    // later in one step, and only with the mechanism it was issued for.
    let server = TestServer::start().await;
    server.create_user("alice", "pw-alice").await;
    for mech in ["HT-SHA-256-NONE", "HT-SHA-256-EXPR", "HT-SHA-256-ENDP"] {
        let token = fast_token(&server, "alice", mech).await;
        for round in 0..2 {
            let (mut c, _) = tls_client(&server).await;
            let success = c
                .auth_fast(
                    mech,
                    "alice",
                    &token,
                    "",
                    &format!("<bind xmlns='{NS_BIND2}'><tag>F</tag></bind>"),
                )
                .await
                .unwrap_or_else(|e| panic!("{mech} round {round}: {e}"));
            let full = success
                .get_child("authorization-identifier", NS2)
                .unwrap()
                .text();
            assert!(full.starts_with("alice@localhost/F/"), "{full}");
            c.close().await;
        }
        // Another mechanism, a wrong token, another user: refused.
        let other = if mech == "HT-SHA-256-NONE" {
            "HT-SHA-256-ENDP"
        } else {
            "HT-SHA-256-NONE"
        };
        for (m, t, u) in [
            (other, token.as_str(), "alice"),
            (mech, "not-the-token", "alice"),
            (mech, token.as_str(), "bob"),
        ] {
            let (mut c, _) = tls_client(&server).await;
            let f = c.auth_fast(m, u, t, "", "").await.unwrap_err();
            assert!(
                f.is("failure", NS2) && f.has_child("not-authorized", ns::SASL),
                "{m} {u}: {f}"
            );
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fast_needs_its_element_and_a_user_agent() {
    let server = TestServer::start().await;
    server.create_user("alice", "pw-alice").await;
    let token = fast_token(&server, "alice", "HT-SHA-256-NONE").await;
    let (mut c, _) = tls_client(&server).await;
    use base64::Engine;
    let first = starling_proto::sasl::ht::initiator("alice", token.as_bytes(), b"");
    c.send(&format!(
        "<authenticate xmlns='{NS2}' mechanism='HT-SHA-256-NONE'><initial-response>{}</initial-response><user-agent id='{SASL2_USER_AGENT}'/></authenticate>",
        base64::engine::general_purpose::STANDARD.encode(&first)
    ))
    .await;
    let f = c.recv().await;
    assert!(
        f.has_child("malformed-request", ns::SASL),
        "no <fast/>: {f}"
    );
    c.send(&format!(
        "<authenticate xmlns='{NS2}' mechanism='HT-SHA-256-NONE'><initial-response>{}</initial-response><fast xmlns='{NS_FAST}'/></authenticate>",
        base64::engine::general_purpose::STANDARD.encode(&first)
    ))
    .await;
    let f = c.recv().await;
    assert!(
        f.has_child("malformed-request", ns::SASL),
        "no user agent: {f}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn invalidate_and_a_password_change_revoke_fast_tokens() {
    // XEP-0484 §4.5 (invalidate='true'); a new password ends every token.
    let server = TestServer::start().await;
    server.create_user("alice", "pw-alice").await;
    let token = fast_token(&server, "alice", "HT-SHA-256-NONE").await;
    let (mut c, _) = tls_client(&server).await;
    let success = c
        .auth_fast("HT-SHA-256-NONE", "alice", &token, "invalidate='true'", "")
        .await
        .unwrap();
    assert!(
        !success.has_child("token", NS_FAST),
        "no new token: {success}"
    );
    let (mut c, _) = tls_client(&server).await;
    assert!(c
        .auth_fast("HT-SHA-256-NONE", "alice", &token, "", "")
        .await
        .is_err());

    let token = fast_token(&server, "alice", "HT-SHA-256-NONE").await;
    let alice = starling_proto::BareJid::new("alice@localhost").unwrap();
    let creds = [starling_proto::sasl::ScramCredentials::derive(
        starling_proto::sasl::ScramHash::Sha256,
        "pw-new",
        b"some-salt",
        4096,
    )
    .unwrap()];
    server
        .server
        .env
        .storage
        .accounts
        .set_credentials(&alice, &creds)
        .await
        .unwrap();
    let (mut c, _) = tls_client(&server).await;
    let f = c
        .auth_fast("HT-SHA-256-NONE", "alice", &token, "", "")
        .await
        .unwrap_err();
    assert!(f.has_child("not-authorized", ns::SASL), "{f}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_near_expiry_is_rotated_and_the_old_one_works_until_the_new_is_used() {
    // XEP-0484 §4.4 and §6.1: a new token in the <success/>; the old one
    // stays valid until the new one is used, then no longer.
    use starling_core::storage::{FastSlot, FastToken};
    let server = TestServer::start().await;
    server.create_user("alice", "pw-alice").await;
    let alice = starling_proto::BareJid::new("alice@localhost").unwrap();
    let agent = SASL2_USER_AGENT;
    let key = std::fs::read(server.dir.join("fast.key")).expect("the FAST key");
    let nonce = "test-nonce";
    let old = starling_proto::sasl::ht::derive_token(&key, &[alice.as_str(), agent, nonce]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    server
        .server
        .env
        .storage
        .accounts
        .put_fast_token(
            &alice,
            agent,
            &FastToken {
                slot: FastSlot::Current,
                nonce: nonce.into(),
                mechanism: "HT-SHA-256-NONE".into(),
                expires_at: now + 3_600_000, // an hour of 14 days left
            },
        )
        .await
        .unwrap();
    let (mut c, _) = tls_client(&server).await;
    let success = c
        .auth_fast("HT-SHA-256-NONE", "alice", &old, "", "")
        .await
        .unwrap();
    let new = success
        .get_child("token", NS_FAST)
        .unwrap_or_else(|| panic!("rotated: {success}"))
        .attr("token")
        .unwrap()
        .to_owned();
    assert_ne!(new, old);
    // The old token still works (the new one may not have arrived), and
    // brings another new one, which replaces the unused one (§4.4: "SHOULD
    // invalidate any tokens previously generated that have not been
    // used")...
    let (mut c, _) = tls_client(&server).await;
    let success = c
        .auth_fast("HT-SHA-256-NONE", "alice", &old, "", "")
        .await
        .unwrap();
    let newer = success
        .get_child("token", NS_FAST)
        .and_then(|t| t.attr("token"))
        .unwrap()
        .to_owned();
    let (mut c, _) = tls_client(&server).await;
    assert!(c
        .auth_fast("HT-SHA-256-NONE", "alice", &new, "", "")
        .await
        .is_err());
    // ...until the newest one is used: then the old one is gone.
    let (mut c, _) = tls_client(&server).await;
    let success = c
        .auth_fast("HT-SHA-256-NONE", "alice", &newer, "", "")
        .await
        .unwrap();
    assert!(
        !success.has_child("token", NS_FAST),
        "a fresh token is not rotated: {success}"
    );
    let (mut c, _) = tls_client(&server).await;
    assert!(c
        .auth_fast("HT-SHA-256-NONE", "alice", &old, "", "")
        .await
        .is_err());
    let (mut c, _) = tls_client(&server).await;
    c.auth_fast("HT-SHA-256-NONE", "alice", &newer, "", "")
        .await
        .unwrap();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bind2_gives_one_client_the_same_resource_and_replaces_its_earlier_session() {
    // XEP-0386 §3.3 (stable resources per tag and user-agent id, the id
    // not exposed) and §3.2 ("SHOULD terminate any earlier sessions from
    // the same client"): the new session takes the resource, the earlier
    // one gets <conflict/> (RFC 6120 §7.7.2.2).
    let server = TestServer::start().await;
    server.create_user("alice", "pw-alice").await;
    let login = |tag: &'static str| {
        let server = &server;
        async move {
            let (mut c, _) = tls_client(server).await;
            let success = c
                .auth_sasl2(
                    Mechanism::ScramSha256,
                    "alice",
                    "pw-alice",
                    &format!("<bind xmlns='{NS_BIND2}'><tag>{tag}</tag></bind>"),
                )
                .await
                .unwrap();
            let full = success
                .get_child("authorization-identifier", NS2)
                .unwrap()
                .text();
            (c, full)
        }
    };
    let (mut first, jid1) = login("Phone").await;
    let (_second, jid2) = login("Phone").await;
    assert_eq!(jid1, jid2, "same client, same tag, same resource");
    assert!(
        !jid1.contains(&SASL2_USER_AGENT[..8]),
        "the user-agent id is not exposed: {jid1}"
    );
    first.expect_stream_error("conflict").await;
    let (_third, jid3) = login("Laptop").await;
    assert!(jid3.starts_with("alice@localhost/Laptop/"), "{jid3}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bound_carries_the_archive_metadata() {
    // XEP-0386 §3.3: "<metadata/> … describing the state of the user's
    // message archive at the precise time of resource binding" (XEP-0313).
    let server = TestServer::start().await;
    server.create_user("alice", "pw-alice").await;
    let bind = format!("<bind xmlns='{NS_BIND2}'><tag>M</tag></bind>");
    let (mut c, _) = tls_client(&server).await;
    let success = c
        .auth_sasl2(Mechanism::ScramSha256, "alice", "pw-alice", &bind)
        .await
        .unwrap();
    let md = success
        .get_child("bound", NS_BIND2)
        .and_then(|b| b.get_child("metadata", "urn:xmpp:mam:2"))
        .unwrap_or_else(|| panic!("metadata in {success}"));
    assert!(md.children().next().is_none(), "empty archive: {md}");
    drop(c);
    let mut bob = server.login("bob").await;
    for i in 0..2 {
        bob.send(
            &msg("alice@localhost")
                .chat()
                .id(&format!("m{i}"))
                .body(&i.to_string())
                .to_string(),
        )
        .await;
    }
    bob.iq(
        "<iq type='get' id='p' to='localhost'><ping xmlns='urn:xmpp:ping'/></iq>",
        "p",
    )
    .await;
    let (mut c, _) = tls_client(&server).await;
    let success = c
        .auth_sasl2(Mechanism::ScramSha256, "alice", "pw-alice", &bind)
        .await
        .unwrap();
    let md = success
        .get_child("bound", NS_BIND2)
        .and_then(|b| b.get_child("metadata", "urn:xmpp:mam:2"))
        .unwrap();
    let start = md
        .get_child("start", "urn:xmpp:mam:2")
        .unwrap_or_else(|| panic!("{md}"));
    let end = md.get_child("end", "urn:xmpp:mam:2").unwrap();
    assert!(
        start.attr("id").is_some() && start.attr("timestamp").is_some(),
        "{md}"
    );
    assert_ne!(start.attr("id"), end.attr("id"), "two messages: {md}");
    server.stop().await;
}
