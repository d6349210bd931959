//! External components (XEP-0114, `[modules.component]`) over real
//! sockets. The component side is written by hand: raw TCP, XML strings,
//! parsed with `starling_xml::StreamParser`. Users are testkit clients.
//!
//! Two components are configured, `gw.localhost` and `bot.localhost`
//! (both under the served domain `localhost`).

use sha1::Digest as _;
use starling_server::modules::component::{ComponentEntry, NS_COMPONENT_ACCEPT};
use starling_server::modules::Component;
use starling_testkit::stanza::{iq, iq_get};
use starling_testkit::stanza::{msg, presence};
use starling_testkit::starling_xml::{Element, Limits, StreamEvent, StreamHeader, StreamParser};
use starling_testkit::{error_condition, eventually, free_port, ns, Client, TestServer};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const GW: &str = "gw.localhost";
const GW_SECRET: &str = "gw-secret-0123456789";
const BOT: &str = "bot.localhost";
const BOT_SECRET: &str = "bot-secret-9876543210";
/// Long enough for anything the server does at once.
const WAIT: Duration = Duration::from_secs(10);

fn entry(domain: &str, secret: &str, name: &str) -> ComponentEntry {
    ComponentEntry {
        domain: domain.into(),
        secret: Some(secret.into()),
        secret_file: None,
        name: name.into(),
    }
}

/// A server with both components configured, and the component port.
async fn server_with(f: impl FnOnce(&mut starling_server::Config)) -> (TestServer, SocketAddr) {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let server = TestServer::start_with(|c| {
        let m = c.modules.get_mut::<Component>();
        m.enabled = true;
        m.listen = addr;
        m.components = vec![
            entry(GW, GW_SECRET, "IRC gateway"),
            entry(BOT, BOT_SECRET, ""),
        ];
        f(c)
    })
    .await;
    (server, addr)
}

async fn server() -> (TestServer, SocketAddr) {
    server_with(|_| {}).await
}

/// What the server sent on a component connection.
#[derive(Debug)]
enum Ev {
    Header(StreamHeader),
    Element(Element),
    Close,
    Eof,
}

/// The component side of XEP-0114, by hand.
struct Comp {
    tcp: TcpStream,
    parser: StreamParser,
    buf: Vec<u8>,
    /// The server's stream header.
    header: Option<StreamHeader>,
}

impl Comp {
    async fn connect(addr: SocketAddr) -> Comp {
        Comp {
            tcp: TcpStream::connect(addr).await.expect("connect"),
            parser: StreamParser::new(Limits {
                max_stanza_bytes: 1 << 24,
                ..Limits::default()
            }),
            buf: Vec::new(),
            header: None,
        }
    }

    async fn send(&mut self, xml: &str) {
        self.tcp.write_all(xml.as_bytes()).await.expect("write");
    }

    /// Writes, ignoring errors (the server may have closed already).
    async fn try_send(&mut self, xml: &str) {
        let _ = self.tcp.write_all(xml.as_bytes()).await;
    }

    async fn next_within(&mut self, wait: Duration) -> Option<Ev> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if !self.buf.is_empty() {
                let mut input: &[u8] = &self.buf;
                let before = input.len();
                let ev = self.parser.push(&mut input);
                let used = before - input.len();
                self.buf.drain(..used);
                match ev {
                    Ok(Some(StreamEvent::Open(h))) => return Some(Ev::Header(h)),
                    Ok(Some(StreamEvent::Stanza(el))) => return Some(Ev::Element(el)),
                    Ok(Some(StreamEvent::Close)) => return Some(Ev::Close),
                    Ok(None) => {}
                    Err(e) => panic!("the server sent bad XML: {e}"),
                }
            }
            let mut chunk = [0u8; 16384];
            let n = match tokio::time::timeout_at(deadline, self.tcp.read(&mut chunk)).await {
                Err(_) => return None,
                Ok(Ok(n)) => n,
                Ok(Err(_)) => 0,
            };
            if n == 0 {
                return Some(Ev::Eof);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    async fn next(&mut self) -> Ev {
        self.next_within(WAIT)
            .await
            .expect("timed out waiting for the server")
    }

    /// The next top-level element.
    async fn recv(&mut self) -> Element {
        match self.next().await {
            Ev::Element(el) => el,
            other => panic!("expected an element, got {other:?}"),
        }
    }

    /// A round trip through the server, as `Client::barrier` for users:
    /// an XEP-0199 ping from component `domain` to the server, whose answer
    /// is routed into this connection's mailbox behind whatever was routed
    /// to it before the server handled the ping (the connection handles
    /// its stanzas in order). Returns the elements that came before it.
    async fn barrier(&mut self, domain: &str) -> Vec<Element> {
        let id = format!("barrier-{}", starling_proto::random_id(8));
        self.send(
            &iq("get", &id)
                .attr("from", domain)
                .to("localhost")
                .child("<ping xmlns='urn:xmpp:ping'/>")
                .to_string(),
        )
        .await;
        let mut before = Vec::new();
        loop {
            let el = self.recv().await;
            if el.name() == "iq" && el.attr("id") == Some(id.as_str()) {
                return before;
            }
            before.push(el);
        }
    }

    /// Asserts that nothing arrived up to a [`barrier`](Self::barrier)
    /// (after whatever would have caused it has been routed).
    async fn expect_nothing(&mut self, domain: &str) {
        let got = self.barrier(domain).await;
        assert!(
            got.is_empty(),
            "expected nothing before the barrier, got: {}",
            got.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    /// §3: our stream header to `to`; returns the server's.
    async fn open(&mut self, to: &str) -> StreamHeader {
        self.send(&format!(
            "<?xml version='1.0'?><stream:stream xmlns='{NS_COMPONENT_ACCEPT}' \
             xmlns:stream='http://etherx.jabber.org/streams' to='{to}'>"
        ))
        .await;
        match self.next().await {
            Ev::Header(h) => {
                self.header = Some(h.clone());
                h
            }
            other => panic!("expected the server's stream header, got {other:?}"),
        }
    }

    /// §3: `<handshake>` with hex(SHA-1(stream id + secret)).
    async fn handshake(&mut self, secret: &str) {
        let id = self
            .header
            .as_ref()
            .and_then(|h| h.attr("id"))
            .expect("the server's header has an id")
            .to_owned();
        self.send(&format!("<handshake>{}</handshake>", hash(&id, secret)))
            .await;
    }

    /// Connects, authenticates and checks the empty `<handshake/>`.
    async fn login(addr: SocketAddr, domain: &str, secret: &str) -> Comp {
        let mut c = Comp::connect(addr).await;
        c.open(domain).await;
        c.handshake(secret).await;
        let el = c.recv().await;
        assert!(
            el.is("handshake", NS_COMPONENT_ACCEPT) && el.nodes().is_empty(),
            "expected an empty <handshake/>, got {el}"
        );
        c
    }

    /// Reads until a stream error; asserts its condition, then that the
    /// stream and the connection are closed.
    async fn expect_stream_error(&mut self, condition: &str) {
        loop {
            match self.next().await {
                Ev::Header(_) => continue,
                Ev::Element(el) if el.is("error", ns::STREAMS) => {
                    let got: Vec<String> = el
                        .children()
                        .filter(|c| c.ns() == ns::STREAM_ERRORS && c.name() != "text")
                        .map(|c| c.name().to_owned())
                        .collect();
                    assert_eq!(got, [condition], "stream error: {el}");
                    break;
                }
                other => panic!("expected stream error {condition}, got {other:?}"),
            }
        }
        loop {
            match self.next().await {
                Ev::Close => continue,
                Ev::Eof => return,
                other => panic!("expected the connection to close, got {other:?}"),
            }
        }
    }
}

/// XEP-0114 §3: lowercase hex SHA-1 of the stream id and the secret.
fn hash(id: &str, secret: &str) -> String {
    sha1::Sha1::digest(format!("{id}{secret}").as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A user's next message (skipping presence).
async fn next_message(c: &mut Client) -> Element {
    c.recv_until(|e| e.name() == "message").await
}

/// §3: the server answers the component's header with its own in
/// `jabber:component:accept`, `from` the component's domain and a fresh
/// id; the handshake is the hash of that id, and it is answered with an
/// empty `<handshake/>`.
#[tokio::test]
async fn handshake_with_the_stream_id_connects() {
    let (server, addr) = server().await;
    let mut c = Comp::connect(addr).await;
    let h = c.open(GW).await;
    assert_eq!(h.default_ns.as_deref(), Some(NS_COMPONENT_ACCEPT));
    assert_eq!(h.attr("from"), Some(GW));
    let id = h.attr("id").expect("stream id").to_owned();
    assert!(id.len() >= 16, "a long random id: {id}");
    c.handshake(GW_SECRET).await;
    let el = c.recv().await;
    assert!(el.is("handshake", NS_COMPONENT_ACCEPT), "{el}");
    // Every stream gets its own id: an old handshake is worth nothing.
    let mut again = Comp::connect(addr).await;
    let h2 = again.open(BOT).await;
    assert_ne!(h2.attr("id"), Some(id.as_str()));
    server.stop().await;
}

/// §3: a wrong secret (or a hash of another id) gets `<not-authorized/>`
/// and the stream closes; so does a stanza before the handshake.
#[tokio::test]
async fn wrong_secret_is_not_authorized() {
    let (server, addr) = server().await;
    let mut c = Comp::connect(addr).await;
    c.open(GW).await;
    c.handshake("not-the-secret").await;
    c.expect_stream_error("not-authorized").await;
    // The secret of another component does not open this one.
    let mut c = Comp::connect(addr).await;
    c.open(GW).await;
    c.handshake(BOT_SECRET).await;
    c.expect_stream_error("not-authorized").await;
    // The right secret over another stream's id.
    let mut c = Comp::connect(addr).await;
    c.open(GW).await;
    c.send(&format!(
        "<handshake>{}</handshake>",
        hash("other-id", GW_SECRET)
    ))
    .await;
    c.expect_stream_error("not-authorized").await;
    // Stanzas before the handshake.
    let mut c = Comp::connect(addr).await;
    c.open(GW).await;
    c.send("<message from='a@gw.localhost' to='alice@localhost'><body>x</body></message>")
        .await;
    c.expect_stream_error("not-authorized").await;
    // The right one still works afterwards.
    Comp::login(addr, GW, GW_SECRET).await;
    server.stop().await;
}

/// §3: a domain that is no configured component gets `<host-unknown/>`
/// after a stream header (which does not claim that domain); a header
/// without `to` `<improper-addressing/>`; a client namespace
/// `<invalid-namespace/>`.
#[tokio::test]
async fn unknown_domain_missing_to_and_wrong_namespace_are_refused() {
    let (server, addr) = server().await;
    for to in ["nope.localhost", "localhost", "conference.localhost"] {
        let mut c = Comp::connect(addr).await;
        let h = c.open(to).await;
        assert_eq!(h.attr("from"), None, "{to}: no domain claimed");
        c.expect_stream_error("host-unknown").await;
    }
    let mut c = Comp::connect(addr).await;
    c.send(&format!(
        "<stream:stream xmlns='{NS_COMPONENT_ACCEPT}' xmlns:stream='http://etherx.jabber.org/streams'>"
    ))
    .await;
    c.expect_stream_error("improper-addressing").await;
    let mut c = Comp::connect(addr).await;
    c.send(&format!(
        "<stream:stream xmlns='jabber:client' xmlns:stream='http://etherx.jabber.org/streams' to='{GW}'>"
    ))
    .await;
    c.expect_stream_error("invalid-namespace").await;
    server.stop().await;
}

/// A second connection for a connected domain is refused with
/// `<conflict/>` after its handshake (Prosody's default); the first one
/// keeps working. Once the first one closes, the domain can connect again.
#[tokio::test]
async fn second_connection_gets_conflict_and_the_first_stays() {
    let (server, addr) = server().await;
    let mut alice = server.login("alice").await;
    let mut first = Comp::login(addr, GW, GW_SECRET).await;
    let mut second = Comp::connect(addr).await;
    second.open(GW).await;
    second.handshake(GW_SECRET).await;
    second.expect_stream_error("conflict").await;
    alice
        .send("<message to='x@gw.localhost' id='m1'><body>still there?</body></message>")
        .await;
    let m = first.recv().await;
    assert!(m.is("message", NS_COMPONENT_ACCEPT), "{m}");
    assert_eq!(m.attr("id"), Some("m1"));
    // The first one closes its stream; a new connection is accepted.
    first.send("</stream:stream>").await;
    assert!(matches!(first.next().await, Ev::Close | Ev::Eof));
    Comp::login(addr, GW, GW_SECRET).await;
    server.stop().await;
}

/// §4: a user's message and iq reach the component (as
/// `jabber:component:accept` stanzas, payloads intact, `from` the user's
/// full JID); its answers from JIDs of its domain reach the user.
#[tokio::test]
async fn users_and_the_component_exchange_messages_and_iqs() {
    let (server, addr) = server().await;
    let mut alice = server.login("alice").await;
    let mut gw = Comp::login(addr, GW, GW_SECRET).await;
    alice
        .send(
            "<message to='bob@gw.localhost' id='m1' type='chat'><body>hello irc</body>\
             <x xmlns='urn:example:unknown'><deep a='1'>kept</deep></x></message>",
        )
        .await;
    let m = gw.recv().await;
    assert!(m.is("message", NS_COMPONENT_ACCEPT), "{m}");
    assert_eq!(m.attr("from"), Some(alice.jid.as_str()));
    assert_eq!(m.attr("to"), Some("bob@gw.localhost"));
    assert_eq!(
        m.get_child("body", NS_COMPONENT_ACCEPT).map(|b| b.text()),
        Some("hello irc".into())
    );
    let x = m
        .get_child("x", "urn:example:unknown")
        .expect("payload kept");
    assert_eq!(
        x.get_child("deep", "urn:example:unknown").unwrap().text(),
        "kept"
    );
    // The answer, from a JID of the component's domain.
    gw.send(
        &msg(&alice.jid)
            .attr("from", "bob@gw.localhost/irc")
            .chat()
            .id("r1")
            .body("hi alice")
            .to_string(),
    )
    .await;
    let r = next_message(&mut alice).await;
    assert_eq!(r.attr("from"), Some("bob@gw.localhost/irc"));
    assert_eq!(
        r.get_child("body", ns::CLIENT).map(|b| b.text()),
        Some("hi alice".into())
    );
    // An iq to the component's domain, answered by the component.
    alice
        .send("<iq type='get' id='d1' to='gw.localhost'><query xmlns='http://jabber.org/protocol/disco#info'/></iq>")
        .await;
    let q = gw.recv().await;
    assert!(q.is("iq", NS_COMPONENT_ACCEPT), "{q}");
    assert_eq!(q.attr("type"), Some("get"));
    assert_eq!(q.attr("from"), Some(alice.jid.as_str()));
    gw.send(
        &iq("result", "d1")
            .attr("from", "gw.localhost")
            .to(&alice.jid)
            .child(
                "<query xmlns='http://jabber.org/protocol/disco#info'>\
                 <identity category='gateway' type='irc' name='IRC'/></query>",
            )
            .to_string(),
    )
    .await;
    let a = alice.recv_until(|e| e.attr("id") == Some("d1")).await;
    assert_eq!(a.attr("type"), Some("result"), "{a}");
    assert_eq!(a.attr("from"), Some(GW));
    let id = a
        .get_child("query", ns::DISCO_INFO)
        .and_then(|q| q.get_child("identity", ns::DISCO_INFO))
        .expect("the component's identity");
    assert_eq!(id.attr("type"), Some("irc"));
    // Directed presence to a JID of the component reaches it too.
    alice.send("<presence to='bob@gw.localhost'/>").await;
    let p = gw.recv().await;
    assert!(p.is("presence", NS_COMPONENT_ACCEPT), "{p}");
    assert_eq!(p.attr("from"), Some(alice.jid.as_str()));
    assert_eq!(p.attr("to"), Some("bob@gw.localhost"));
    server.stop().await;
}

/// The server's `disco#items` lists a component under its domain (with
/// its configured name).
#[tokio::test]
async fn server_disco_items_list_the_components() {
    let (server, _addr) = server().await;
    let mut alice = server.login("alice").await;
    let r = alice
        .iq(
            "<iq type='get' id='i1' to='localhost'><query xmlns='http://jabber.org/protocol/disco#items'/></iq>",
            "i1",
        )
        .await;
    let items: Vec<(String, Option<String>)> = r
        .get_child("query", ns::DISCO_ITEMS)
        .expect("items")
        .children()
        .map(|i| {
            (
                i.attr("jid").unwrap_or_default().to_owned(),
                i.attr("name").map(str::to_owned),
            )
        })
        .collect();
    assert!(
        items.contains(&(GW.to_owned(), Some("IRC gateway".to_owned()))),
        "{items:?}"
    );
    assert!(items.contains(&(BOT.to_owned(), None)), "{items:?}");
    server.stop().await;
}

/// §3: a component routes like the server's own services: to a user's
/// bare JID, to another component, to the server (whose answer comes
/// back to it), with any JID of its domain as `from`.
#[tokio::test]
async fn a_component_reaches_users_other_components_and_the_server() {
    let (server, addr) = server().await;
    let mut alice = server.login("alice").await;
    let mut gw = Comp::login(addr, GW, GW_SECRET).await;
    let mut bot = Comp::login(addr, BOT, BOT_SECRET).await;
    gw.send("<message from='carol@gw.localhost' to='alice@localhost' type='chat'><body>to the bare JID</body></message>")
        .await;
    let m = next_message(&mut alice).await;
    assert_eq!(m.attr("from"), Some("carol@gw.localhost"));
    assert_eq!(
        m.get_child("body", ns::CLIENT).map(|b| b.text()),
        Some("to the bare JID".into())
    );
    // Component to component.
    gw.send(
        "<message from='gw.localhost' to='echo@bot.localhost' id='c2c'><body>ping</body></message>",
    )
    .await;
    let m = bot.recv().await;
    assert_eq!(m.attr("from"), Some(GW));
    assert_eq!(m.attr("to"), Some("echo@bot.localhost"));
    assert_eq!(m.attr("id"), Some("c2c"));
    // To the server: its answer comes back to the component.
    gw.send("<iq type='get' id='v1' from='gw.localhost' to='localhost'><query xmlns='http://jabber.org/protocol/disco#info'/></iq>")
        .await;
    let r = gw.recv().await;
    assert!(r.is("iq", NS_COMPONENT_ACCEPT), "{r}");
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    assert_eq!(r.attr("from"), Some("localhost"));
    assert_eq!(r.attr("to"), Some(GW));
    // To a user who does not exist: the router's error comes back.
    gw.send(
        "<message from='carol@gw.localhost' to='nobody@localhost' id='e1'><body>?</body></message>",
    )
    .await;
    let e = gw.recv().await;
    assert_eq!(e.attr("type"), Some("error"), "{e}");
    assert_eq!(e.attr("id"), Some("e1"));
    let cond = e
        .get_child("error", NS_COMPONENT_ACCEPT)
        .and_then(|er| er.children().find(|c| c.ns() == ns::STANZAS))
        .map(|c| c.name().to_owned());
    assert_eq!(cond.as_deref(), Some("service-unavailable"), "{e}");
    server.stop().await;
}

/// §3: `from` must be in the component's domain: another domain is
/// `<invalid-from/>`, none `<improper-addressing/>` — stream errors that
/// end that component's stream only. A missing `to` is answered with
/// `bad-request` and the stream goes on.
#[tokio::test]
async fn from_outside_its_domain_ends_only_that_stream() {
    let (server, addr) = server().await;
    let mut alice = server.login("alice").await;
    let mut bot = Comp::login(addr, BOT, BOT_SECRET).await;
    let mut gw = Comp::login(addr, GW, GW_SECRET).await;
    // No 'to': bad-request, from the server, and the stream stays.
    gw.send("<message from='a@gw.localhost' id='nt'><body>where?</body></message>")
        .await;
    let e = gw.recv().await;
    assert_eq!(e.attr("type"), Some("error"), "{e}");
    assert_eq!(e.attr("id"), Some("nt"));
    assert_eq!(e.attr("to"), Some("a@gw.localhost"));
    gw.send("</stream:stream>").await;
    assert!(matches!(gw.next().await, Ev::Close | Ev::Eof));
    // Pretending to be the other component, a user or the server; no
    // 'from'; a malformed one.
    for (forged, condition) in [
        ("from='x@bot.localhost'", "invalid-from"),
        ("from='alice@localhost/res'", "invalid-from"),
        ("from='localhost'", "invalid-from"),
        ("", "improper-addressing"),
        ("from='a@b@gw.localhost'", "improper-addressing"),
    ] {
        let mut gw = Comp::login(addr, GW, GW_SECRET).await;
        gw.send(&format!(
            "<message {forged} to='alice@localhost'><body>forged</body></message>"
        ))
        .await;
        gw.expect_stream_error(condition).await;
    }
    // Nothing forged reached alice; the other component and alice are
    // unaffected.
    alice
        .send("<message to='x@bot.localhost' id='ok'><body>fine?</body></message>")
        .await;
    let m = bot.recv().await;
    assert_eq!(m.attr("id"), Some("ok"));
    bot.send(
        &msg(&alice.jid)
            .attr("from", "x@bot.localhost")
            .id("ok2")
            .body("fine")
            .to_string(),
    )
    .await;
    let m = next_message(&mut alice).await;
    assert_eq!(
        m.attr("id"),
        Some("ok2"),
        "no forged message arrived first: {m}"
    );
    server.stop().await;
}

/// While a component is not connected, iq requests and messages to its
/// domain get `service-unavailable`; presence is dropped. The same after
/// it disconnects.
#[tokio::test]
async fn stanzas_for_a_disconnected_component_get_service_unavailable() {
    let (server, addr) = server().await;
    let mut alice = server.login("alice").await;
    for round in 0..2 {
        alice
            .send(
                &msg("x@gw.localhost")
                    .id(&format!("m{round}"))
                    .body("anyone?")
                    .to_string(),
            )
            .await;
        let e = alice.recv_until(|e| e.name() == "message").await;
        assert_eq!(e.attr("type"), Some("error"), "{e}");
        assert_eq!(e.attr("from"), Some("x@gw.localhost"));
        assert_eq!(error_condition(&e).as_deref(), Some("service-unavailable"));
        let e = alice
            .iq(
                &iq_get(
                    "gw.localhost",
                    &format!("q{round}"),
                    "<query xmlns='http://jabber.org/protocol/disco#info'/>",
                ),
                &format!("q{round}"),
            )
            .await;
        assert_eq!(e.attr("type"), Some("error"), "{e}");
        assert_eq!(error_condition(&e).as_deref(), Some("service-unavailable"));
        alice.send("<presence to='x@gw.localhost'/>").await;
        // Dropped: no error comes back (it would be routed while alice's
        // session handles the presence, before her ping).
        alice.expect_nothing().await;
        if round == 0 {
            // Connected: delivered. Then it goes away.
            let mut gw = Comp::login(addr, GW, GW_SECRET).await;
            alice
                .send("<message to='x@gw.localhost' id='here'><body>now?</body></message>")
                .await;
            assert_eq!(gw.recv().await.attr("id"), Some("here"));
            drop(gw);
            // The connection's end is noticed at once (EOF): wait until the
            // registry has let it go.
            wait_component_on(&server, None).await;
        }
    }
    server.stop().await;
}

/// A connection that does not finish its handshake within
/// `negotiation_timeout_secs` is closed with `<connection-timeout/>`.
#[tokio::test]
async fn negotiation_timeout_closes_the_connection() {
    let (server, addr) = server_with(|c| {
        c.modules.get_mut::<Component>().negotiation_timeout_secs = 1;
    })
    .await;
    let started = std::time::Instant::now();
    let mut c = Comp::connect(addr).await;
    c.open(GW).await;
    // An authenticated component has no such deadline: one that logs in
    // now is still connected after the deadline of a connection opened
    // after its handshake (`silent`, below) has passed.
    let mut gw = Comp::login(addr, GW, GW_SECRET).await;
    // Silent from the first byte: the same as a stream header alone.
    let mut silent = Comp::connect(addr).await;
    c.expect_stream_error("connection-timeout").await;
    assert!(started.elapsed() >= Duration::from_millis(900));
    silent.expect_stream_error("connection-timeout").await;
    let mut alice = server.login("alice").await;
    alice
        .send("<message to='x@gw.localhost' id='late'><body>.</body></message>")
        .await;
    assert_eq!(gw.recv().await.attr("id"), Some("late"));
    server.stop().await;
}

/// Malformed XML, an unknown top-level element or an oversized stanza
/// ends that component's stream with the matching condition; the other
/// component and the users go on.
#[tokio::test]
async fn bad_input_closes_only_that_stream() {
    let (server, addr) = server_with(|c| {
        c.modules.get_mut::<Component>().max_stanza_bytes = 20_000;
    })
    .await;
    let mut alice = server.login("alice").await;
    let mut bot = Comp::login(addr, BOT, BOT_SECRET).await;
    let big = "x".repeat(30_000);
    for (input, condition) in [
        (
            "<message from='a@gw.localhost' to='alice@localhost'><body>x</bod></message>"
                .to_owned(),
            "not-well-formed",
        ),
        (
            "<foo xmlns='urn:example:foo'/>".to_owned(),
            "unsupported-stanza-type",
        ),
        (
            format!(
                "<message from='a@gw.localhost' to='alice@localhost'><body>{big}</body></message>"
            ),
            "policy-violation",
        ),
    ] {
        let mut gw = Comp::login(addr, GW, GW_SECRET).await;
        gw.try_send(&input).await;
        gw.expect_stream_error(condition).await;
    }
    // Each stream error came after its input was handled: nothing of it
    // was routed to alice.
    alice.expect_nothing().await;
    alice
        .send("<message to='x@bot.localhost' id='ok'><body>still here</body></message>")
        .await;
    assert_eq!(bot.recv().await.attr("id"), Some("ok"));
    bot.expect_nothing(BOT).await;
    server.stop().await;
}

/// Shutdown closes a component's stream with `<system-shutdown/>`.
#[tokio::test]
async fn shutdown_closes_component_streams() {
    let (server, addr) = server().await;
    let mut gw = Comp::login(addr, GW, GW_SECRET).await;
    let stop = tokio::spawn(server.stop());
    gw.expect_stream_error("system-shutdown").await;
    tokio::time::timeout(WAIT, stop)
        .await
        .expect("shutdown ends")
        .unwrap();
}

/// A component on another service's address would leave the router to
/// pick one of the two: start-up stops (for modules `check-config` does
/// not know, as well as for those it does).
#[tokio::test]
async fn a_component_on_another_services_address_stops_start_up() {
    let mut cfg = starling_testkit::test_config();
    let m = cfg.modules.get_mut::<Component>();
    m.enabled = true;
    m.listen = "127.0.0.1:0".parse().unwrap();
    m.components = vec![entry("conference.localhost", "s", "")];
    let dir = cfg.server.data_dir.clone();
    let err = match starling_server::start(cfg).await {
        Ok(_) => panic!("started with two services on conference.localhost"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("two services claim conference.localhost"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

// ----- on a cluster (docs/cluster.md, docs/components.md) -----

/// A `nats-server` on a free loopback port and a database of its own on
/// the test PostgreSQL server; `None` (the test prints SKIPPED) without
/// them, unless `STARLING_REQUIRE_CLUSTER=1`.
struct Bus {
    nats: std::process::Child,
    nats_port: u16,
    db: starling_testkit::TestDatabase,
    dir: std::path::PathBuf,
}

impl Bus {
    async fn start() -> Option<Bus> {
        let required = std::env::var("STARLING_REQUIRE_CLUSTER").as_deref() == Ok("1");
        let bin = ["/usr/sbin", "/usr/bin"]
            .iter()
            .map(std::path::PathBuf::from)
            .chain(
                std::env::var_os("PATH")
                    .iter()
                    .flat_map(std::env::split_paths),
            )
            .map(|d| d.join("nats-server"))
            .find(|p| p.is_file());
        let admin = std::env::var("STARLING_TEST_PG_URL")
            .ok()
            .filter(|u| !u.trim().is_empty());
        let (Some(bin), Some(admin)) = (bin, admin) else {
            assert!(
                !required,
                "STARLING_REQUIRE_CLUSTER=1 needs nats-server and STARLING_TEST_PG_URL"
            );
            eprintln!(
                "SKIPPED: needs nats-server and STARLING_TEST_PG_URL (scripts/pg-test.sh start)"
            );
            return None;
        };
        let nats_port = free_port();
        let nats = std::process::Command::new(bin)
            .args(["-a", "127.0.0.1", "-p", &nats_port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start nats-server");
        eventually(
            &format!("nats-server accepts connections on port {nats_port}"),
            Duration::from_secs(5),
            async || TcpStream::connect(("127.0.0.1", nats_port)).await.ok(),
        )
        .await;
        let dir = std::env::temp_dir().join(format!(
            "starling-component-cluster-{}",
            starling_proto::random_id(10)
        ));
        let db = starling_testkit::TestDatabase::for_data_dir(&admin, &dir).await;
        Some(Bus {
            nats,
            nats_port,
            db,
            dir,
        })
    }

    /// Node `node` of the cluster, its component listener on `listen`.
    async fn node(&self, node: u8, listen: SocketAddr) -> TestServer {
        TestServer::start_with(|c| {
            c.server.node_id = node;
            c.storage.backend = "postgres".into();
            c.storage.url = Some(self.db.url.clone());
            c.cluster.nats_url = Some(format!("nats://127.0.0.1:{}", self.nats_port));
            c.cluster.name = "component-test".into();
            c.cluster.heartbeat_ms = 200;
            c.cluster.node_timeout_ms = 1000;
            let m = c.modules.get_mut::<Component>();
            m.enabled = true;
            m.listen = listen;
            m.components = vec![entry(GW, GW_SECRET, "IRC gateway")];
        })
        .await
    }

    async fn stop(mut self) {
        let _ = self.nats.kill();
        let _ = self.nats.wait();
        self.db.drop_database().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits until `server`'s registry says the component is connected
/// (`Some(node)`) or not (`None`).
async fn wait_component_on(server: &TestServer, node: Option<u8>) {
    let jid = starling_proto::FullJid::new(&format!("{GW}/component")).unwrap();
    eventually(
        &format!("the registry says the component is on {node:?}"),
        Duration::from_secs(5),
        async || {
            (server.server.env.sessions.get(&jid).map(|e| e.session.node) == node).then_some(())
        },
    )
    .await;
}

/// A component connects to one node; users of the other node reach it
/// (messages with their full JID, and stanzas from bare JIDs, which the
/// server makes) and get its answers; a second connection on the other
/// node gets `<conflict/>`; once it leaves, both nodes answer
/// `service-unavailable`; it may then connect to the other node.
#[tokio::test]
async fn on_a_cluster_a_component_serves_users_of_every_node() {
    let Some(bus) = Bus::start().await else {
        return;
    };
    let (a1, a2): (SocketAddr, SocketAddr) = (
        format!("127.0.0.1:{}", free_port()).parse().unwrap(),
        format!("127.0.0.1:{}", free_port()).parse().unwrap(),
    );
    let n1 = bus.node(1, a1).await;
    let n2 = bus.node(2, a2).await;
    for (n, other) in [(&n1, 2u8), (&n2, 1u8)] {
        let c = n.server.cluster.as_ref().expect("a cluster node");
        eventually(
            &format!("node {other} joins the cluster"),
            Duration::from_secs(5),
            async || {
                c.status()
                    .iter()
                    .any(|s| s.node == other && !s.this_node)
                    .then_some(())
            },
        )
        .await;
    }
    let mut gw = Comp::login(a1, GW, GW_SECRET).await;
    wait_component_on(&n2, Some(1)).await;
    // alice on node 2.
    let mut alice = n2.login("alice").await;
    alice
        .send("<message to='x@gw.localhost' id='n2' type='chat'><body>from node 2</body></message>")
        .await;
    let m = gw.recv().await;
    assert_eq!(m.attr("id"), Some("n2"), "{m}");
    assert_eq!(m.attr("from"), Some(alice.jid.as_str()));
    gw.send(
        &msg(&alice.jid)
            .attr("from", "x@gw.localhost")
            .id("back")
            .body("to node 2")
            .to_string(),
    )
    .await;
    assert_eq!(next_message(&mut alice).await.attr("id"), Some("back"));
    // An iq request from node 2, answered by the component.
    alice
        .send("<iq type='get' id='q2' to='gw.localhost'><ping xmlns='urn:xmpp:ping'/></iq>")
        .await;
    let q = gw.recv().await;
    assert_eq!(q.attr("id"), Some("q2"), "{q}");
    gw.send(
        &iq("result", "q2")
            .attr("from", "gw.localhost")
            .to(&alice.jid)
            .to_string(),
    )
    .await;
    let r = alice.recv_until(|e| e.attr("id") == Some("q2")).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    // A stanza the server makes on node 2, from a bare JID.
    let made = starling_proto::Stanza::new(
        Element::builder("message", ns::CLIENT)
            .attr("id", "bare")
            .append(Element::builder("body", ns::CLIENT).text("made").build())
            .build(),
        Some(starling_proto::Jid::new("alice@localhost").unwrap()),
        Some(starling_proto::Jid::new("x@gw.localhost").unwrap()),
    );
    n2.server.env.route(made).await;
    let m = gw.recv().await;
    assert_eq!(m.attr("id"), Some("bare"), "{m}");
    assert_eq!(m.attr("from"), Some("alice@localhost"));
    // The same domain on the other node: conflict, the first stays.
    let mut second = Comp::connect(a2).await;
    second.open(GW).await;
    second.handshake(GW_SECRET).await;
    second.expect_stream_error("conflict").await;
    alice
        .send("<message to='x@gw.localhost' id='still'><body>.</body></message>")
        .await;
    assert_eq!(gw.recv().await.attr("id"), Some("still"));
    // It leaves: node 2 answers for it.
    gw.send("</stream:stream>").await;
    assert!(matches!(gw.next().await, Ev::Close | Ev::Eof));
    wait_component_on(&n2, None).await;
    alice
        .send("<message to='x@gw.localhost' id='gone'><body>?</body></message>")
        .await;
    let e = next_message(&mut alice).await;
    assert_eq!(e.attr("id"), Some("gone"));
    assert_eq!(error_condition(&e).as_deref(), Some("service-unavailable"));
    // Now on node 2: bob on node 1 reaches it there.
    let mut gw = Comp::login(a2, GW, GW_SECRET).await;
    wait_component_on(&n1, Some(2)).await;
    let mut bob = n1.login("bob").await;
    bob.send("<message to='y@gw.localhost' id='n1'><body>from node 1</body></message>")
        .await;
    let m = gw.recv().await;
    assert_eq!(m.attr("id"), Some("n1"), "{m}");
    assert_eq!(m.attr("from"), Some(bob.jid.as_str()));
    drop(gw);
    alice.close().await;
    bob.close().await;
    n2.stop().await;
    n1.stop().await;
    bus.stop().await;
}

/// A gateway's contacts in the user's roster (XEP-0100 §4.1, RFC 6121
/// §3.1): the user subscribes to the gateway's domain and to a contact
/// behind it, the component approves, and the user's items end `to`; the
/// component asks back and the user approves (`both`).
#[tokio::test]
async fn a_gateway_takes_part_in_roster_subscriptions() {
    let (server, addr) = server().await;
    let mut alice = server.login("alice").await;
    alice
        .send("<iq type='get' id='r0'><query xmlns='jabber:iq:roster'/></iq>")
        .await;
    alice.recv_until(|e| e.attr("id") == Some("r0")).await;
    alice.send("<presence/>").await;
    let mut gw = Comp::login(addr, GW, GW_SECRET).await;
    for contact in [GW, "bob@gw.localhost"] {
        alice
            .send(&presence().to(contact).ty("subscribe").to_string())
            .await;
        // §3.1.2: the request reaches the gateway from the user's bare JID.
        let p = loop {
            let el = gw.recv().await;
            if el.name() == "presence" && el.attr("type") == Some("subscribe") {
                break el;
            }
        };
        assert_eq!(p.attr("from"), Some("alice@localhost"), "{p}");
        assert_eq!(p.attr("to"), Some(contact));
        gw.send(
            &presence()
                .attr("from", contact)
                .to("alice@localhost")
                .ty("subscribed")
                .to_string(),
        )
        .await;
        let push = alice
            .recv_until(|e| {
                e.name() == "iq"
                    && e.to_string().contains(&format!("jid='{contact}'"))
                    && e.to_string().contains("subscription='to'")
            })
            .await;
        assert_eq!(push.attr("type"), Some("set"), "{push}");
    }
    // The gateway asks back; the user approves: both.
    gw.send("<presence from='bob@gw.localhost' to='alice@localhost' type='subscribe'/>")
        .await;
    alice
        .recv_until(|e| e.name() == "presence" && e.attr("type") == Some("subscribe"))
        .await;
    alice
        .send("<presence to='bob@gw.localhost' type='subscribed'/>")
        .await;
    alice
        .recv_until(|e| e.name() == "iq" && e.to_string().contains("subscription='both'"))
        .await;
    // The approval reaches the gateway.
    let ok = loop {
        let el = gw.recv().await;
        if el.name() == "presence" && el.attr("type") == Some("subscribed") {
            break el;
        }
    };
    assert_eq!(ok.attr("to"), Some("bob@gw.localhost"), "{ok}");
    let item = server
        .server
        .env
        .storage
        .roster
        .get_item(
            &starling_proto::BareJid::new("alice@localhost").unwrap(),
            &starling_proto::BareJid::new("bob@gw.localhost").unwrap(),
        )
        .await
        .unwrap()
        .expect("an item");
    assert_eq!(
        item.subscription,
        starling_core::storage::Subscription::Both
    );
    server.stop().await;
}
