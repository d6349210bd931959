//! In-band registration (XEP-0077) over real sockets.

use starling_proto::sasl::Mechanism;
use starling_server::modules;
use starling_testkit::stanza::iq_set;
use starling_testkit::{error_condition, ns, Client, TestServer};

async fn tls_stream(server: &TestServer) -> Client {
    let mut c = Client::connect(server.starttls_addr()).await;
    c.negotiate_tls().await;
    c
}

async fn register(
    c: &mut Client,
    user: &str,
    password: &str,
) -> starling_testkit::starling_xml::Element {
    c.iq(
        &iq_set(
            "",
            "reg",
            &format!("<query xmlns='jabber:iq:register'><username>{user}</username><password>{password}</password></query>"),
        ),
        "reg",
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn register_form_then_account_then_login() {
    // XEP-0077 §3.1: get the form, submit it, log in with the new account.
    let server = TestServer::start().await;
    let mut c = tls_stream(&server).await;
    let form = c
        .iq(
            "<iq type='get' id='f'><query xmlns='jabber:iq:register'/></iq>",
            "f",
        )
        .await;
    let q = form.get_child("query", ns::REGISTER).expect("form");
    assert!(q.has_child("username", ns::REGISTER) && q.has_child("password", ns::REGISTER));
    assert!(q.has_child("instructions", ns::REGISTER));
    let r = register(&mut c, "newbie", "s3cret!").await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    assert!(r.attr("to").is_none(), "no 'to' before authentication");
    // Same stream can now authenticate.
    c.auth(Mechanism::ScramSha256, "newbie", "s3cret!")
        .await
        .expect("login with new account");
    assert!(c.bind(None).await.starts_with("newbie@localhost/"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn register_taken_name_gets_conflict() {
    // XEP-0077 §3.1 example 6.
    let server = TestServer::start().await;
    server.create_user("taken", "pw1234").await;
    let mut c = tls_stream(&server).await;
    let r = register(&mut c, "taken", "other123").await;
    assert_eq!(error_condition(&r).as_deref(), Some("conflict"), "{r}");
    // The existing password still works.
    let mut c2 = tls_stream(&server).await;
    c2.auth(Mechanism::ScramSha256, "taken", "pw1234")
        .await
        .unwrap();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn register_missing_fields_or_bad_name_rejected() {
    // XEP-0077 §3.1: not-acceptable for missing data; jid-malformed for a bad name.
    let server = TestServer::start().await;
    let mut c = tls_stream(&server).await;
    let r = c
        .iq("<iq type='set' id='m'><query xmlns='jabber:iq:register'><username>x</username></query></iq>", "m")
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("not-acceptable"));
    let r = register(&mut c, "bad name", "password").await;
    assert_eq!(error_condition(&r).as_deref(), Some("jid-malformed"));
    let r = register(&mut c, "shortpw", "ab").await;
    assert_eq!(error_condition(&r).as_deref(), Some("not-acceptable"));
    // A name with two normal forms (U+03F9 becomes Σ, which parsed again
    // becomes σ: found by the `jid` fuzz target) would make one account
    // reachable under two spellings: not-acceptable, and nothing created.
    let r = register(&mut c, "m\u{3f9}x", "password").await;
    assert_eq!(
        error_condition(&r).as_deref(),
        Some("not-acceptable"),
        "{r}"
    );
    let r = register(&mut c, "m\u{3c3}x", "password").await;
    assert_eq!(
        r.attr("type"),
        Some("result"),
        "the stable spelling is free: {r}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn register_rate_limited_per_ip() {
    let server =
        TestServer::start_with(|c| c.modules.get_mut::<modules::Register>().max_per_ip = 2).await;
    let mut c = tls_stream(&server).await;
    for i in 0..2 {
        let r = register(&mut c, &format!("user{i}"), "password").await;
        assert_eq!(r.attr("type"), Some("result"));
    }
    let r = register(&mut c, "user3", "password").await;
    assert_eq!(error_condition(&r).as_deref(), Some("resource-constraint"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn register_disabled_means_no_feature_and_not_authorized() {
    let server =
        TestServer::start_with(|c| c.modules.get_mut::<modules::Register>().enabled = false).await;
    let mut c = Client::connect(server.starttls_addr()).await;
    let f = c.negotiate_tls().await;
    assert!(!f.has_child("register", ns::REGISTER_FEATURE));
    c.send("<iq type='set' id='r'><query xmlns='jabber:iq:register'><username>a</username><password>bbbb</password></query></iq>")
        .await;
    c.expect_stream_error("not-authorized").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn password_change_in_band_takes_effect() {
    // XEP-0077 §3.3.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = alice
        .iq("<iq type='set' id='pw'><query xmlns='jabber:iq:register'><username>alice</username><password>brand-new</password></query></iq>", "pw")
        .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let mut c = tls_stream(&server).await;
    c.auth(Mechanism::ScramSha512, "alice", "pw-alice")
        .await
        .unwrap_err();
    c.auth(Mechanism::ScramSha512, "alice", "brand-new")
        .await
        .expect("new password works");
    // Changing someone else's password is refused.
    let r = alice
        .iq("<iq type='set' id='pw2'><query xmlns='jabber:iq:register'><username>bob</username><password>hacked!</password></query></iq>", "pw2")
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("not-authorized"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_registration_deletes_account_and_closes_sessions() {
    // XEP-0077 §3.2.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut other = server.login("alice").await;
    alice
        .send("<iq type='set' id='rm'><query xmlns='jabber:iq:register'><remove/></query></iq>")
        .await;
    let r = alice.recv_until(|e| e.attr("id") == Some("rm")).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    alice.expect_stream_error("not-authorized").await;
    other.expect_stream_error("not-authorized").await;
    let mut c = tls_stream(&server).await;
    c.auth(Mechanism::ScramSha256, "alice", "pw-alice")
        .await
        .unwrap_err();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn password_change_addressed_to_server_takes_effect() {
    // Regression (issue 9): XEP-0077 §3.3's example addresses the change to
    // the server (`to='shakespeare.lit'`); it got service-unavailable.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = alice
        .iq(
            "<iq type='get' to='localhost' id='f'><query xmlns='jabber:iq:register'/></iq>",
            "f",
        )
        .await;
    let q = r
        .get_child("query", ns::REGISTER)
        .unwrap_or_else(|| panic!("no form: {r}"));
    assert!(q.get_child("registered", ns::REGISTER).is_some(), "{r}");
    let r = alice
        .iq("<iq type='set' to='localhost' id='pw'><query xmlns='jabber:iq:register'><username>alice</username><password>brand-new</password></query></iq>", "pw")
        .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let mut c = tls_stream(&server).await;
    c.auth(Mechanism::ScramSha256, "alice", "brand-new")
        .await
        .expect("new password works");
    // Still only one's own password.
    let r = alice
        .iq("<iq type='set' to='localhost' id='pw2'><query xmlns='jabber:iq:register'><username>bob</username><password>hacked!</password></query></iq>", "pw2")
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("not-authorized"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_addressed_to_server_deletes_account() {
    // Regression (issue 9): Smack sends XEP-0077 §3.2's remove with
    // `to` = the server's domain; it got service-unavailable.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    alice
        .send("<iq type='set' to='localhost' id='rm'><query xmlns='jabber:iq:register'><remove/></query></iq>")
        .await;
    let r = alice.recv_until(|e| e.attr("id") == Some("rm")).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    assert_eq!(r.attr("from"), Some("localhost"), "{r}");
    alice.expect_stream_error("not-authorized").await;
    let mut c = tls_stream(&server).await;
    c.auth(Mechanism::ScramSha256, "alice", "pw-alice")
        .await
        .unwrap_err();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn register_requests_to_another_account_or_domain_refused() {
    // XEP-0077 §3.2, §3.3: the host acts on the requester's own account;
    // addressing another user's bare JID changes nothing.
    let server = TestServer::start_with(|c| c.server.domains.push("example.org".into())).await;
    let mut alice = server.login("alice").await;
    let bob = server.login("bob").await;
    for (to, id) in [("bob@localhost", "a"), ("example.org", "b")] {
        let r = alice
            .iq(
                &iq_set(
                    to,
                    id,
                    "<query xmlns='jabber:iq:register'><remove/></query>",
                ),
                id,
            )
            .await;
        assert_eq!(
            error_condition(&r).as_deref(),
            Some("forbidden"),
            "{to}: {r}"
        );
        let r = alice
            .iq(&iq_set(to, &format!("{id}2"), "<query xmlns='jabber:iq:register'><username>alice</username><password>brand-new</password></query>"), &format!("{id}2"))
            .await;
        assert_eq!(
            error_condition(&r).as_deref(),
            Some("forbidden"),
            "{to}: {r}"
        );
    }
    // Nothing changed: both accounts keep their passwords.
    for (user, pw) in [("alice", "pw-alice"), ("bob", "pw-bob")] {
        let mut c = tls_stream(&server).await;
        c.auth(Mechanism::ScramSha256, user, pw)
            .await
            .expect("password unchanged");
    }
    drop(bob);
    server.stop().await;
}
