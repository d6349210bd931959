//! The SOCKS5 Bytestreams proxy (XEP-0065, `[modules.proxy65]`) over real
//! sockets: discovery (§4), the SOCKS5 negotiation (§6.3.2, §6.3.4,
//! §10.2, RFC 1928), activation (§6.3.5) and relaying, with the error
//! cases and the limits of the configuration. Alice is the requester and
//! Bob the target throughout.

use sha1::Digest as _;
use starling_core::hooks::{Service, ServiceAddress};
use starling_core::{async_trait, Env};
use starling_proto::{Jid, Stanza};
use starling_server::modules::proxy65::{Allowed, Proxy65Config};
use starling_testkit::stanza::{empty, iq_get, iq_set};
use starling_testkit::starling_xml::Element;
use starling_testkit::{error_condition, ns, Client, TestServer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

const PROXY: &str = "proxy.localhost";
const BS: &str = "http://jabber.org/protocol/bytestreams";
/// Long enough for anything the proxy does at once.
const WAIT: Duration = Duration::from_secs(10);

async fn server_with(f: impl FnOnce(&mut Proxy65Config)) -> TestServer {
    TestServer::start_with(|c| proxy_config(c, f)).await
}

fn proxy_config(c: &mut starling_server::Config, f: impl FnOnce(&mut Proxy65Config)) {
    let p = c.modules.get_mut::<starling_server::modules::Proxy65>();
    p.enabled = true;
    p.listen = "127.0.0.1:0".parse().unwrap();
    f(p);
}

/// §6.3.2: DST.ADDR, SHA-1(SID + requester JID + target JID) in hex.
fn hash(sid: &str, requester: &str, target: &str) -> String {
    sha1::Sha1::digest(format!("{sid}{requester}{target}").as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// §4: the `<streamhost/>` the proxy returns to `c`, or the error.
async fn streamhost_reply(c: &mut Client) -> Element {
    c.iq(&iq_get(PROXY, "sh", &empty("query", BS)), "sh").await
}

/// The proxy's SOCKS5 address, as its streamhost says.
async fn proxy_addr(c: &mut Client) -> SocketAddr {
    let r = streamhost_reply(c).await;
    let sh = r
        .get_child("query", BS)
        .and_then(|q| q.get_child("streamhost", BS))
        .unwrap_or_else(|| panic!("no streamhost: {r}"));
    format!("{}:{}", sh.attr("host").unwrap(), sh.attr("port").unwrap())
        .parse()
        .unwrap_or_else(|_| panic!("not host and port: {sh}"))
}

fn connect_request(addr: &[u8], port: u16) -> Vec<u8> {
    let mut r = vec![5, 1, 0, 3, addr.len() as u8];
    r.extend_from_slice(addr);
    r.extend_from_slice(&port.to_be_bytes());
    r
}

/// RFC 1928: greeting ("no authentication"), CONNECT to `addr` port 0;
/// asserts the success reply echoes them (§6.3.2).
async fn socks_connect(proxy: SocketAddr, addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(&[5, 1, 0]).await.unwrap();
    let mut method = [0u8; 2];
    tokio::time::timeout(WAIT, s.read_exact(&mut method))
        .await
        .expect("method selection in time")
        .unwrap();
    assert_eq!(method, [5, 0], "'no authentication' chosen");
    s.write_all(&connect_request(addr.as_bytes(), 0))
        .await
        .unwrap();
    let mut reply = [0u8; 47];
    tokio::time::timeout(WAIT, s.read_exact(&mut reply))
        .await
        .expect("CONNECT reply in time")
        .unwrap();
    assert_eq!(reply[..5], [5, 0, 0, 3, 40], "succeeded, DOMAINNAME");
    assert_eq!(&reply[5..45], addr.as_bytes(), "BND.ADDR = DST.ADDR");
    assert_eq!(reply[45..], [0, 0], "BND.PORT = DST.PORT");
    s
}

/// Everything the proxy sends on `s` until it closes (or resets) it.
async fn read_until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read_all = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(WAIT, read_all)
        .await
        .expect("the proxy closes the connection");
    got
}

/// Sends `bytes` on a new connection; returns what the proxy sent back
/// before closing it.
async fn socks_refused(proxy: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    // A connection closed at once may refuse the bytes: that is an answer too.
    let _ = s.write_all(bytes).await;
    read_until_closed(&mut s).await
}

/// §6.3.5: `c` asks the proxy to activate stream `sid` to `target`.
async fn activate(c: &mut Client, sid: &str, target: &str) -> Element {
    let id = format!("act-{}", starling_proto::random_id(6));
    c.iq(
        &iq_set(
            PROXY,
            &id,
            &format!("<query xmlns='{BS}' sid='{sid}'><activate>{target}</activate></query>"),
        ),
        &id,
    )
    .await
}

fn data(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Writes `send` then half-closes, while reading until the proxy closes;
/// returns what was read.
fn exchange(s: TcpStream, send: Vec<u8>) -> tokio::task::JoinHandle<Vec<u8>> {
    tokio::spawn(async move {
        let (mut rd, mut wr) = s.into_split();
        let write = async move {
            // A cut transfer resets the sender: its errors are expected.
            if wr.write_all(&send).await.is_ok() {
                let _ = wr.shutdown().await;
            }
        };
        let read = async move {
            let mut got = Vec::new();
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => return got,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        };
        let ((), got) = tokio::join!(write, read);
        got
    })
}

async fn joined(h: tokio::task::JoinHandle<Vec<u8>>) -> Vec<u8> {
    tokio::time::timeout(Duration::from_secs(30), h)
        .await
        .expect("the transfer ends")
        .unwrap()
}

/// Alice and Bob, logged in, both connected to the proxy for `sid` (Bob
/// first, §6.3.2, then Alice, §6.3.4); returns (alice's, bob's) sockets.
async fn pair(
    alice: &mut Client,
    bob: &Client,
    proxy: SocketAddr,
    sid: &str,
) -> (TcpStream, TcpStream) {
    let h = hash(sid, &alice.jid, &bob.jid);
    let target = socks_connect(proxy, &h).await;
    let requester = socks_connect(proxy, &h).await;
    (requester, target)
}

/// §4: the server's disco#items lists the proxy; its disco#info says it
/// is a bytestreams proxy; its streamhost is where it listens.
#[tokio::test]
async fn discovery_lists_the_proxy_with_its_identity_and_streamhost() {
    let server = server_with(|_| {}).await;
    let mut alice = server.login("alice").await;
    let items = alice
        .iq(
            "<iq to='localhost' type='get' id='items'><query xmlns='http://jabber.org/protocol/disco#items'/></iq>",
            "items",
        )
        .await;
    let listed: Vec<&str> = items
        .get_child("query", ns::DISCO_ITEMS)
        .unwrap()
        .children()
        .filter_map(|i| i.attr("jid"))
        .collect();
    assert!(listed.contains(&PROXY), "{items}");

    let info = alice
        .iq(
            &iq_get(PROXY, "info", &empty("query", ns::DISCO_INFO)),
            "info",
        )
        .await;
    let q = info.get_child("query", ns::DISCO_INFO).unwrap();
    assert!(
        q.children().any(|i| i.name() == "identity"
            && i.attr("category") == Some("proxy")
            && i.attr("type") == Some("bytestreams")),
        "{info}"
    );
    assert!(alice.disco_features(PROXY).await.iter().any(|f| f == BS));

    let r = streamhost_reply(&mut alice).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let sh = r
        .get_child("query", BS)
        .and_then(|q| q.get_child("streamhost", BS))
        .unwrap();
    assert_eq!(sh.attr("jid"), Some(PROXY));
    assert_eq!(sh.attr("host"), Some("127.0.0.1"), "the listen IP");
    let addr = proxy_addr(&mut alice).await;
    assert_ne!(addr.port(), 0, "the bound port, not the configured 0");
    TcpStream::connect(addr)
        .await
        .expect("the proxy listens there");
    server.stop().await;
}

/// §4: `host` and `port` override what is advertised.
#[tokio::test]
async fn streamhost_advertises_the_configured_host_and_port() {
    let server = server_with(|p| {
        p.host = "files.example.org".into();
        p.port = 7625;
    })
    .await;
    let mut alice = server.login("alice").await;
    let r = streamhost_reply(&mut alice).await;
    let sh = r
        .get_child("query", BS)
        .and_then(|q| q.get_child("streamhost", BS))
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(
        (sh.attr("host"), sh.attr("port")),
        (Some("files.example.org"), Some("7625"))
    );
    server.stop().await;
}

/// §6: the mediated connection end to end; the proxy relays both ways,
/// every byte in order, until both sides close; metrics count it.
#[tokio::test]
async fn mediated_transfer_relays_both_ways_exactly() {
    let server = server_with(|_| {}).await;
    let mut alice = server.login("alice").await;
    let bob = server.login("bob").await;
    let proxy = proxy_addr(&mut alice).await;
    let (requester, target) = pair(&mut alice, &bob, proxy, "sid-1").await;
    let bob_jid = bob.jid.clone();
    let r = activate(&mut alice, "sid-1", &bob_jid).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    assert_eq!(r.attr("from"), Some(PROXY), "{r}");

    let up = data(300_000, 1);
    let down = data(100_000, 2);
    let at_alice = exchange(requester, up.clone());
    let at_bob = exchange(target, down.clone());
    let (got_by_alice, got_by_bob) = (joined(at_alice).await, joined(at_bob).await);
    assert_eq!(got_by_bob.len(), up.len());
    assert!(got_by_bob == up, "bob received alice's bytes in order");
    assert_eq!(got_by_alice.len(), down.len());
    assert!(got_by_alice == down, "alice received bob's bytes in order");

    let metrics = server.server.env.metrics.encode();
    assert!(
        metrics.contains("starling_proxy65_transfers_total 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("starling_proxy65_relayed_bytes_total 400000\n"),
        "{metrics}"
    );
    server.stop().await;
}

/// §6.3.5's errors: an unknown stream is item-not-found, a stream with
/// one party connected is not-allowed, and nobody but the requester can
/// activate (the hash includes the iq's `from`); a malformed request is
/// bad-request or jid-malformed; a second activation is not-allowed.
#[tokio::test]
async fn activation_errors_and_only_the_requester_activates() {
    let server = server_with(|_| {}).await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let mut carol = server.login("carol").await;
    let proxy = proxy_addr(&mut alice).await;
    let bob_jid = bob.jid.clone();
    let alice_jid = alice.jid.clone();

    let r = activate(&mut alice, "never-connected", &bob_jid).await;
    assert_eq!(
        error_condition(&r).as_deref(),
        Some("item-not-found"),
        "{r}"
    );

    // Only the target is connected.
    let h = hash("sid-2", &alice.jid, &bob.jid);
    let target = socks_connect(proxy, &h).await;
    let r = activate(&mut alice, "sid-2", &bob_jid).await;
    assert_eq!(error_condition(&r).as_deref(), Some("not-allowed"), "{r}");

    let requester = socks_connect(proxy, &h).await;
    // A third party, the target itself, either way round: no such stream.
    let r = activate(&mut carol, "sid-2", &bob_jid).await;
    assert_eq!(
        error_condition(&r).as_deref(),
        Some("item-not-found"),
        "{r}"
    );
    let r = activate(&mut bob, "sid-2", &alice_jid).await;
    assert_eq!(
        error_condition(&r).as_deref(),
        Some("item-not-found"),
        "{r}"
    );
    let r = activate(&mut bob, "sid-2", &bob_jid).await;
    assert_eq!(
        error_condition(&r).as_deref(),
        Some("item-not-found"),
        "{r}"
    );
    // The target must be the full JID the hash was made with.
    let r = activate(&mut alice, "sid-2", "bob@localhost").await;
    assert_eq!(
        error_condition(&r).as_deref(),
        Some("item-not-found"),
        "{r}"
    );

    let r = alice
        .iq(
            &iq_set(
                PROXY,
                "nosid",
                &format!("<query xmlns='{BS}'><activate>{bob_jid}</activate></query>"),
            ),
            "nosid",
        )
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("bad-request"), "{r}");
    let r = activate(&mut alice, "sid-2", "@localhost").await;
    assert_eq!(error_condition(&r).as_deref(), Some("jid-malformed"), "{r}");

    let r = activate(&mut alice, "sid-2", &bob_jid).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let r = activate(&mut alice, "sid-2", &bob_jid).await;
    assert_eq!(error_condition(&r).as_deref(), Some("not-allowed"), "{r}");

    // The refused attempts did not disturb the pair.
    let at_bob = exchange(target, Vec::new());
    let at_alice = exchange(requester, b"hello bob".to_vec());
    assert_eq!(joined(at_bob).await, b"hello bob");
    assert!(joined(at_alice).await.is_empty());
    server.stop().await;
}

/// §10.1 (one target per bytestream): a third connection with a paired
/// hash gets "connection not allowed by ruleset" and is closed; the pair
/// goes on.
#[tokio::test]
async fn a_third_connection_with_the_same_hash_is_refused() {
    let server = server_with(|_| {}).await;
    let mut alice = server.login("alice").await;
    let bob = server.login("bob").await;
    let proxy = proxy_addr(&mut alice).await;
    let (requester, target) = pair(&mut alice, &bob, proxy, "sid-3").await;
    let h = hash("sid-3", &alice.jid, &bob.jid);
    let mut third = vec![5, 1, 0];
    third.extend(connect_request(h.as_bytes(), 0));
    let got = socks_refused(proxy, &third).await;
    assert_eq!(got, [5, 0, 5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);

    let bob_jid = bob.jid.clone();
    let r = activate(&mut alice, "sid-3", &bob_jid).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    // Still refused while relaying.
    let got = socks_refused(proxy, &third).await;
    assert_eq!(got[2..4], [5, 2]);
    let at_bob = exchange(target, Vec::new());
    let at_alice = exchange(requester, b"only bob".to_vec());
    assert_eq!(joined(at_bob).await, b"only bob");
    joined(at_alice).await;
    server.stop().await;
}

/// RFC 1928 / §10.2: what is not "no authentication" + CONNECT to a
/// 40-digit hash at port 0 gets its reply code and is closed; a stalled
/// handshake holds nothing up; the proxy serves the next pair as usual.
#[tokio::test]
async fn bad_socks5_handshakes_are_refused_and_others_still_served() {
    let server = server_with(|_| {}).await;
    let mut alice = server.login("alice").await;
    let bob = server.login("bob").await;
    let proxy = proxy_addr(&mut alice).await;
    let h = hash("sid-4", &alice.jid, &bob.jid);

    // A greeting that announces 255 methods and sends three, then waits.
    let mut stalled = TcpStream::connect(proxy).await.unwrap();
    stalled.write_all(&[5, 255, 0, 1, 2]).await.unwrap();

    // Username/password only: no acceptable method (0xFF).
    assert_eq!(socks_refused(proxy, &[5, 1, 2]).await, [5, 0xff]);
    // Not SOCKS5 at all.
    assert_eq!(
        socks_refused(proxy, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await,
        b""
    );
    let refusals: [(Vec<u8>, u8); 5] = [
        // UDP ASSOCIATE (§8, not built): command not supported.
        (vec![5, 3, 0, 3, 0], 7),
        // An IPv4 address: address type not supported.
        (vec![5, 1, 0, 1, 127, 0, 0, 1, 0, 0], 8),
        // Not a hash: host unreachable.
        (connect_request(b"example.org", 0), 4),
        (connect_request(&h.as_bytes()[..39], 0), 4),
        // Port other than 0: not allowed.
        (connect_request(h.as_bytes(), 80), 2),
    ];
    for (request, code) in refusals {
        let mut bytes = vec![5, 1, 0];
        bytes.extend_from_slice(&request);
        let got = socks_refused(proxy, &bytes).await;
        assert_eq!(got, [5, 0, 5, code, 0, 1, 0, 0, 0, 0, 0, 0], "{request:?}");
    }

    let (requester, target) = pair(&mut alice, &bob, proxy, "sid-4").await;
    let bob_jid = bob.jid.clone();
    let r = activate(&mut alice, "sid-4", &bob_jid).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let at_bob = exchange(target, Vec::new());
    let at_alice = exchange(requester, data(50_000, 3));
    assert_eq!(joined(at_bob).await, data(50_000, 3));
    joined(at_alice).await;
    drop(stalled);
    server.stop().await;
}

/// Answers of the proxy to a JID of another domain, which this test
/// plays (there is no server-to-server yet): replies to `remote.test`
/// land here.
struct Remote(mpsc::UnboundedSender<Element>);

#[async_trait]
impl Service for Remote {
    async fn handle(&self, _env: &Env, stanza: Stanza) {
        let _ = self.0.send(stanza.element().clone());
    }
}

async fn remote_server(allowed: Allowed) -> (TestServer, mpsc::UnboundedReceiver<Element>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let server = TestServer::start_with_hooks(
        |c| proxy_config(c, |p| p.allowed = allowed),
        |reg| {
            reg.service(
                "remote-test",
                ServiceAddress::Domain("remote.test".into()),
                "",
                Arc::new(Remote(tx)),
            )
        },
    )
    .await;
    (server, rx)
}

/// Routes `payload` in an iq of `type` from mallory@remote.test to the
/// proxy; returns the answer.
async fn from_remote(
    server: &TestServer,
    answers: &mut mpsc::UnboundedReceiver<Element>,
    kind: &str,
    payload: Element,
) -> Element {
    let el = Element::builder("iq", ns::CLIENT)
        .attr("type", kind)
        .attr("id", "remote-1")
        .append(payload)
        .build();
    let from = Jid::new("mallory@remote.test/x").unwrap();
    let to = Jid::new(PROXY).unwrap();
    server
        .server
        .env
        .route(Stanza::new(el, Some(from), Some(to)))
        .await;
    tokio::time::timeout(WAIT, answers.recv())
        .await
        .expect("an answer")
        .unwrap()
}

/// §4: with `allowed = "local"` (the default) a user of another domain
/// is `forbidden` to use the proxy (its address and activation); with
/// `allowed = "all"` it gets the streamhost.
#[tokio::test]
async fn users_of_other_domains_are_forbidden_unless_allowed_is_all() {
    let query = || Element::builder("query", BS).build();
    let activation = || {
        Element::builder("query", BS)
            .attr("sid", "s")
            .append(
                Element::builder("activate", BS)
                    .text("bob@localhost/r")
                    .build(),
            )
            .build()
    };
    let (server, mut answers) = remote_server(Allowed::Local).await;
    let r = from_remote(&server, &mut answers, "get", query()).await;
    assert_eq!(error_condition(&r).as_deref(), Some("forbidden"), "{r}");
    let r = from_remote(&server, &mut answers, "set", activation()).await;
    assert_eq!(error_condition(&r).as_deref(), Some("forbidden"), "{r}");
    server.stop().await;

    let (server, mut answers) = remote_server(Allowed::All).await;
    let r = from_remote(&server, &mut answers, "get", query()).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    assert!(
        r.get_child("query", BS)
            .and_then(|q| q.get_child("streamhost", BS))
            .is_some(),
        "{r}"
    );
    let r = from_remote(&server, &mut answers, "set", activation()).await;
    assert_eq!(
        error_condition(&r).as_deref(),
        Some("item-not-found"),
        "{r}"
    );
    server.stop().await;
}

/// `max_transfer_bytes`: the relay stops at the limit (both directions
/// together) and closes both connections.
#[tokio::test]
async fn a_transfer_over_max_transfer_bytes_is_cut() {
    let server = server_with(|p| p.max_transfer_bytes = 64 * 1024).await;
    let mut alice = server.login("alice").await;
    let bob = server.login("bob").await;
    let proxy = proxy_addr(&mut alice).await;
    let (requester, target) = pair(&mut alice, &bob, proxy, "sid-5").await;
    let bob_jid = bob.jid.clone();
    let r = activate(&mut alice, "sid-5", &bob_jid).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let sent = data(256 * 1024, 5);
    let at_bob = exchange(target, Vec::new());
    let at_alice = exchange(requester, sent.clone());
    let got = joined(at_bob).await;
    assert_eq!(got.len(), 64 * 1024, "exactly the limit, then closed");
    assert!(got == sent[..64 * 1024]);
    joined(at_alice).await;
    server.stop().await;
}

/// `max_bytes_per_second` paces a transfer: 100,000 bytes at 40,000 B/s
/// take over two seconds and arrive whole.
#[tokio::test]
async fn max_bytes_per_second_paces_a_transfer() {
    let server = server_with(|p| p.max_bytes_per_second = 40_000).await;
    let mut alice = server.login("alice").await;
    let bob = server.login("bob").await;
    let proxy = proxy_addr(&mut alice).await;
    let (requester, target) = pair(&mut alice, &bob, proxy, "sid-6").await;
    let bob_jid = bob.jid.clone();
    let r = activate(&mut alice, "sid-6", &bob_jid).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let sent = data(100_000, 6);
    let started = Instant::now();
    let at_bob = exchange(target, Vec::new());
    let at_alice = exchange(requester, sent.clone());
    let got = joined(at_bob).await;
    let took = started.elapsed();
    assert!(got == sent, "{} bytes of {}", got.len(), sent.len());
    assert!(took >= Duration::from_millis(2000), "took {took:?}");
    joined(at_alice).await;
    server.stop().await;
}

/// `activation_timeout_secs`: a connection without a partner, and a pair
/// never activated, are closed; the stream is gone (item-not-found).
#[tokio::test]
async fn connections_not_activated_in_time_are_closed() {
    let server = server_with(|p| p.activation_timeout_secs = 1).await;
    let mut alice = server.login("alice").await;
    let bob = server.login("bob").await;
    let proxy = proxy_addr(&mut alice).await;
    let bob_jid = bob.jid.clone();

    let mut alone = socks_connect(proxy, &hash("sid-7", &alice.jid, &bob_jid)).await;
    let (mut requester, mut target) = pair(&mut alice, &bob, proxy, "sid-8").await;
    let started = Instant::now();
    assert!(read_until_closed(&mut alone).await.is_empty());
    assert!(read_until_closed(&mut requester).await.is_empty());
    assert!(read_until_closed(&mut target).await.is_empty());
    assert!(started.elapsed() < Duration::from_secs(5));
    let r = activate(&mut alice, "sid-8", &bob_jid).await;
    assert_eq!(
        error_condition(&r).as_deref(),
        Some("item-not-found"),
        "{r}"
    );
    // A handshake that never completes is closed by then too.
    let mut slow = TcpStream::connect(proxy).await.unwrap();
    slow.write_all(&[5]).await.unwrap();
    assert!(read_until_closed(&mut slow).await.is_empty());
    server.stop().await;
}

/// `idle_timeout_secs`: an activated transfer that moves nothing is
/// closed.
#[tokio::test]
async fn an_idle_transfer_is_closed() {
    let server = server_with(|p| p.idle_timeout_secs = 1).await;
    let mut alice = server.login("alice").await;
    let bob = server.login("bob").await;
    let proxy = proxy_addr(&mut alice).await;
    let (mut requester, mut target) = pair(&mut alice, &bob, proxy, "sid-9").await;
    let bob_jid = bob.jid.clone();
    let r = activate(&mut alice, "sid-9", &bob_jid).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    requester.write_all(b"one").await.unwrap();
    let mut three = [0u8; 3];
    target.read_exact(&mut three).await.unwrap();
    assert_eq!(&three, b"one");
    let started = Instant::now();
    assert!(read_until_closed(&mut target).await.is_empty());
    assert!(read_until_closed(&mut requester).await.is_empty());
    let idle = started.elapsed();
    assert!(
        idle >= Duration::from_millis(500) && idle < Duration::from_secs(5),
        "{idle:?}"
    );
    server.stop().await;
}

/// `max_connections`: connections past it are closed at once; those
/// already open are not affected.
#[tokio::test]
async fn connections_beyond_max_connections_are_closed() {
    let server = server_with(|p| p.max_connections = 2).await;
    let mut alice = server.login("alice").await;
    let bob = server.login("bob").await;
    let proxy = proxy_addr(&mut alice).await;
    let (requester, target) = pair(&mut alice, &bob, proxy, "sid-10").await;
    let mut greeting = vec![5, 1, 0];
    greeting.extend(connect_request(&[b'a'; 40], 0));
    assert!(socks_refused(proxy, &greeting).await.is_empty());
    let bob_jid = bob.jid.clone();
    let r = activate(&mut alice, "sid-10", &bob_jid).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let at_bob = exchange(target, Vec::new());
    let at_alice = exchange(requester, b"fits".to_vec());
    assert_eq!(joined(at_bob).await, b"fits");
    joined(at_alice).await;
    server.stop().await;
}

/// Server shutdown closes live transfers and the listener.
#[tokio::test]
async fn shutdown_closes_transfers_and_the_listener() {
    let server = server_with(|_| {}).await;
    let mut alice = server.login("alice").await;
    let bob = server.login("bob").await;
    let proxy = proxy_addr(&mut alice).await;
    let (mut requester, mut target) = pair(&mut alice, &bob, proxy, "sid-11").await;
    let bob_jid = bob.jid.clone();
    let r = activate(&mut alice, "sid-11", &bob_jid).await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let mut waiting = socks_connect(proxy, &hash("sid-12", &alice.jid, &bob_jid)).await;
    drop(alice);
    drop(bob);
    tokio::time::timeout(Duration::from_secs(30), server.stop())
        .await
        .expect("shutdown in time");
    assert!(read_until_closed(&mut requester).await.is_empty());
    assert!(read_until_closed(&mut target).await.is_empty());
    assert!(read_until_closed(&mut waiting).await.is_empty());
    assert!(
        TcpStream::connect(proxy).await.is_err(),
        "nothing listens any more"
    );
}
