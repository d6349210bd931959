//! Issue 31 item 8: before authentication, what one connection can make
//! the server hold is `[c2s] max_preauth_stanza_bytes`, far below the
//! stanza limit, on every transport: an element (even unfinished) over it
//! on TCP/TLS, a BOSH request body over it. Over the limit: a
//! `<policy-violation/>` stream error (BOSH: a `policy-violation`
//! terminate) and the connection or session ends. After authentication
//! the same size is an ordinary stanza, after an RFC 6120 stream restart
//! and after SASL2 (which has none). WebSocket: `websocket.rs`.

use starling_proto::sasl::Mechanism;
use starling_testkit::stanza::{iq_set, msg};
use starling_testkit::{bosh_post, ns, Client, TestServer};

const BIND: &str = "http://jabber.org/protocol/httpbind";
const XBOSH: &str = "urn:xmpp:xbosh";
const PREAUTH: usize = 8 * 1024;

fn filler() -> String {
    "x".repeat(10 * 1024)
}

fn body_text(m: &starling_testkit::starling_xml::Element) -> String {
    m.get_child("body", ns::CLIENT)
        .map(|b| b.text())
        .unwrap_or_default()
}

#[tokio::test]
async fn tcp_element_over_preauth_limit_is_refused_until_authenticated() {
    let server = TestServer::start_with(|c| c.c2s.max_preauth_stanza_bytes = PREAUTH).await;
    // Unfinished, before TLS: refused once it passes the limit, without
    // waiting for the rest.
    let mut c = Client::connect(server.starttls_addr()).await;
    c.open_stream().await;
    c.send(&format!("<message><body>{}", filler())).await;
    c.expect_stream_error("policy-violation").await;
    // After TLS, still unauthenticated.
    let mut c = Client::connect(server.starttls_addr()).await;
    c.negotiate_tls().await;
    c.send(&iq_set(
        "",
        "r1",
        &format!(
            "<query xmlns='jabber:iq:register'><username>{}</username></query>",
            filler()
        ),
    ))
    .await;
    c.expect_stream_error("policy-violation").await;
    // After SASL and the stream restart.
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    alice
        .send(&msg(&bob.jid).chat().body(&(filler())).to_string())
        .await;
    assert_eq!(body_text(&bob.recv_message().await), filler());
    // After SASL2, on the same stream (no restart).
    server.create_user("carol", "secret").await;
    let mut carol = Client::connect(server.starttls_addr()).await;
    carol.negotiate_tls().await;
    carol
        .auth_sasl2(Mechanism::ScramSha256, "carol", "secret", "")
        .await
        .expect("SASL2 succeeds");
    carol.bind(None).await;
    carol
        .send(&msg(&bob.jid).chat().body(&(filler())).to_string())
        .await;
    assert_eq!(body_text(&bob.recv_message().await), filler());
    server.stop().await;
}

#[tokio::test]
async fn bosh_body_over_preauth_limit_is_refused_until_authenticated() {
    let server = TestServer::start_with(|c| c.c2s.max_preauth_stanza_bytes = PREAUTH).await;
    server.create_user("alice", "pw-alice").await;
    let mut bob = server.login("bob").await;
    let addr = server.http_addr(false);
    let create = |rid: u64| {
        format!("<body xmlns='{BIND}' rid='{rid}' to='localhost' wait='1' hold='1' ver='1.6' xmpp:version='1.0' xmlns:xmpp='{XBOSH}'/>")
    };
    // A creation request over the limit.
    let big_create = format!(
        "<body xmlns='{BIND}' rid='1' to='localhost' wait='5' hold='1' ver='1.6' xmpp:version='1.0' xmlns:xmpp='{XBOSH}'><message xmlns='jabber:client'><body>{}</body></message></body>",
        filler()
    );
    let r = bosh_post(addr, &big_create).await;
    assert_eq!(r.attr("condition"), Some("policy-violation"), "{r}");
    // A request of an unauthenticated session: refused, and the session ends.
    let r = bosh_post(addr, &create(10)).await;
    let sid = r.attr("sid").expect("sid").to_owned();
    let big = |rid: u64| {
        format!(
            "<body xmlns='{BIND}' sid='{sid}' rid='{rid}'><message xmlns='jabber:client' to='{}' type='chat'><body>{}</body></message></body>",
            bob.jid,
            filler()
        )
    };
    let r = bosh_post(addr, &big(11)).await;
    assert_eq!(r.attr("type"), Some("terminate"), "{r}");
    assert_eq!(r.attr("condition"), Some("policy-violation"), "{r}");
    let r = bosh_post(
        addr,
        &format!("<body xmlns='{BIND}' sid='{sid}' rid='12'/>"),
    )
    .await;
    assert_eq!(r.attr("condition"), Some("item-not-found"), "{r}");
    // Authenticated, the same body is delivered.
    let r = bosh_post(addr, &create(20)).await;
    let sid = r.attr("sid").expect("sid").to_owned();
    let send = |rid: u64, attrs: &str, payload: &str| {
        format!("<body xmlns='{BIND}' xmlns:xmpp='{XBOSH}' sid='{sid}' rid='{rid}' {attrs}>{payload}</body>")
    };
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode("\0alice\0pw-alice");
    let r = bosh_post(
        addr,
        &send(
            21,
            "",
            &format!(
                "<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' mechanism='PLAIN'>{b64}</auth>"
            ),
        ),
    )
    .await;
    assert!(r.has_child("success", ns::SASL), "{r}");
    let r = bosh_post(addr, &send(22, "xmpp:restart='true' to='localhost'", "")).await;
    assert!(r.get_child("features", ns::STREAMS).is_some(), "{r}");
    let r = bosh_post(
        addr,
        &send(
            23,
            "",
            "<iq xmlns='jabber:client' type='set' id='b1'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'/></iq>",
        ),
    )
    .await;
    assert!(r.get_child("iq", ns::CLIENT).is_some(), "{r}");
    let r = bosh_post(
        addr,
        &format!(
            "<body xmlns='{BIND}' sid='{sid}' rid='24'><message xmlns='jabber:client' to='{}' type='chat'><body>{}</body></message></body>",
            bob.jid,
            filler()
        ),
    )
    .await;
    assert_eq!(r.attr("type"), None, "{r}");
    assert_eq!(body_text(&bob.recv_message().await), filler());
    server.stop().await;
}
