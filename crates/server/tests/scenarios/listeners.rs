//! Every listener bounds its connections from accept (transport/gate.rs)
//! and every HTTP connection is bounded in time (transport/http.rs
//! `serve_connection`), over real sockets:
//!
//! - idle HTTP connections, heads sent a byte at a time, bodies trickled,
//!   idle keep-alive connections are closed after their (short, test)
//!   timeouts; a BOSH long-poll and an open WebSocket outlive them;
//! - `[server] max_connections_per_ip` refuses connection N+1 on the c2s,
//!   HTTP and admin listeners and frees the slot when one closes; another
//!   loopback address (127.0.0.2) still logs in over TCP and WebSocket;
//! - `[server] max_connections` counts HTTP connections from accept;
//! - on a dual-stack `[::]` listener an IPv4 client is 127.0.0.1, not
//!   `::ffff:127.0.0.1`: plain WebSocket and BOSH from it get SASL
//!   mechanisms (secure_loopback), and the per-IP auth-failure limiter
//!   counts both forms as one address.

use starling_proto::sasl::Mechanism;
use starling_testkit::starling_server::config::{HttpListener, Listener, TlsMode};
use starling_testkit::starling_server::Config;
use starling_testkit::starling_xml::Element;
use starling_testkit::{bosh_post, ns, tcp_connect_from, Client, TestServer};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BIND: &str = "http://jabber.org/protocol/httpbind";
const XBOSH: &str = "urn:xmpp:xbosh";
/// The failure bound of every wait here: far above the 1 s test timeouts.
const BOUND: Duration = Duration::from_secs(15);

/// Short HTTP timeouts (1 s) so that the tests run fast.
fn short_http(c: &mut Config) {
    c.http.request_head_timeout_secs = 1;
    c.http.keepalive_timeout_secs = 1;
    c.http.body_timeout_secs = 1;
}

/// A per-address limit of `n` that applies on loopback.
fn per_ip(n: usize) -> impl FnOnce(&mut Config) {
    move |c: &mut Config| {
        c.server.max_connections_per_ip = n;
        c.server.per_ip_limit_loopback = true;
    }
}

/// Reads until the server closes `tcp` (EOF or reset); what it sent.
async fn closed_by_server(tcp: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(BOUND, read)
        .await
        .expect("the server closes the connection");
    out
}

/// One GET on a keep-alive connection; its status (the body is read by
/// its Content-Length).
async fn get_keepalive(tcp: &mut TcpStream, path: &str) -> u16 {
    tcp.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(BOUND, tcp.read(&mut buf))
            .await
            .expect("an answer")
            .unwrap();
        assert!(n > 0, "closed before the answer");
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if body.len() >= len {
                return head[9..12].parse().unwrap();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn http_idle_connection_closed_after_head_timeout() {
    let server = TestServer::start_with(short_http).await;
    let mut tcp = TcpStream::connect(server.http_addr(false)).await.unwrap();
    let started = Instant::now();
    let answer = closed_by_server(&mut tcp).await;
    assert!(answer.is_empty() || answer.starts_with(b"HTTP/1.1 408"));
    assert!(started.elapsed() >= Duration::from_millis(900));
    // The admin listener shares serve_connection.
    let mut tcp = TcpStream::connect(server.admin_addr()).await.unwrap();
    closed_by_server(&mut tcp).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_slow_head_cut_by_head_timeout() {
    let server = TestServer::start_with(short_http).await;
    let mut tcp = TcpStream::connect(server.http_addr(false)).await.unwrap();
    let head = format!(
        "GET /.well-known/host-meta HTTP/1.1\r\nHost: localhost\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(100)
    );
    let started = Instant::now();
    let mut sent = 0;
    // One byte every 100 ms: the whole head would take 15 s.
    for b in head.bytes() {
        if tcp.write_all(&[b]).await.is_err() {
            break;
        }
        sent += 1;
        let mut buf = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(100), tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(_)) => {} // a 408, then the close
            Err(_) => {}
        }
        assert!(started.elapsed() < BOUND, "still open after {sent} bytes");
    }
    assert!(sent < head.len(), "the head was cut before its end");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_trickled_body_cut_by_body_timeout() {
    let server = TestServer::start_with(short_http).await;
    let mut tcp = TcpStream::connect(server.http_addr(false)).await.unwrap();
    tcp.write_all(b"POST /http-bind HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/xml\r\nContent-Length: 1073741824\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    // One byte every 100 ms: never a stall of 1 s, but 10 bytes/s, far
    // below body_min_bytes_per_sec.
    loop {
        if tcp.write_all(b"<").await.is_err() {
            break;
        }
        let mut buf = [0u8; 1024];
        match tokio::time::timeout(Duration::from_millis(100), tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            _ => {}
        }
        assert!(started.elapsed() < BOUND, "a trickled body is still read");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_idle_keepalive_connection_closed() {
    // A head timeout far above the keep-alive one: this is the keep-alive
    // timer at work.
    let server = TestServer::start_with(|c| {
        c.http.request_head_timeout_secs = 60;
        c.http.keepalive_timeout_secs = 1;
    })
    .await;
    let mut tcp = TcpStream::connect(server.http_addr(false)).await.unwrap();
    assert_eq!(get_keepalive(&mut tcp, "/.well-known/host-meta").await, 200);
    assert_eq!(get_keepalive(&mut tcp, "/.well-known/host-meta").await, 200);
    let idle = Instant::now();
    closed_by_server(&mut tcp).await;
    assert!(
        idle.elapsed() < Duration::from_secs(10),
        "{:?}",
        idle.elapsed()
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bosh_long_poll_and_websocket_outlive_http_timeouts() {
    let server = TestServer::start_with(short_http).await;
    let http = server.http_addr(false);
    let mut ws = server
        .login_over(
            "alice",
            starling_testkit::Transport::WebSocket { tls: false },
        )
        .await;
    let created = bosh_post(
        http,
        &format!("<body xmlns='{BIND}' rid='1000' to='localhost' wait='3' hold='1' ver='1.6' xmpp:version='1.0' xmlns:xmpp='{XBOSH}'/>"),
    )
    .await;
    let sid = created.attr("sid").expect("a session").to_owned();
    // An empty request is held up to wait = 3 s: three times every HTTP
    // timeout.
    let held = Instant::now();
    let r = bosh_post(
        http,
        &format!("<body xmlns='{BIND}' sid='{sid}' rid='1001'/>"),
    )
    .await;
    assert!(r.is("body", BIND), "{r}");
    assert_eq!(r.attr("type"), None, "answered, not terminated: {r}");
    assert!(
        held.elapsed() >= Duration::from_secs(2),
        "{:?}",
        held.elapsed()
    );
    // The WebSocket, idle all that time, still works.
    let pong = ws
        .iq(
            "<iq type='get' id='p1' to='localhost'><ping xmlns='urn:xmpp:ping'/></iq>",
            "p1",
        )
        .await;
    assert_eq!(pong.attr("type"), Some("result"), "{pong}");
    server.stop().await;
}

/// Opens connections from 127.0.0.1 until `n` are admitted and served
/// (each proven by a stream header), returns them.
async fn hold_c2s(addr: SocketAddr, n: usize) -> Vec<Client> {
    let mut held = Vec::new();
    for _ in 0..n {
        let mut c = Client::connect(addr).await;
        c.open_stream().await;
        held.push(c);
    }
    held
}

/// A metric's value from the admin listener's /metrics (0 if absent).
async fn metric(server: &TestServer, series: &str) -> u64 {
    let (_, _, body) =
        starling_testkit::http_request(server.admin_addr(), "GET", "/metrics", None, None).await;
    let key = format!("{series} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0)
}

/// Waits until `listener` holds `n` gate slots (a closed connection's
/// slot is given back when its task ends, just after the close).
async fn until_open(server: &TestServer, listener: &str, n: u64) {
    let series = format!("starling_connections_open{{listener=\"{listener}\"}}");
    let started = Instant::now();
    while metric(server, &series).await != n {
        assert!(started.elapsed() < BOUND, "{series} never reached {n}");
    }
}

async fn refused_metric(server: &TestServer, listener: &str, reason: &str) -> u64 {
    let (_, _, body) =
        starling_testkit::http_request(server.admin_addr(), "GET", "/metrics", None, None).await;
    let key = format!(
        "starling_connections_refused_total{{listener=\"{listener}\",reason=\"{reason}\"}} "
    );
    body.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn c2s_per_ip_limit_refuses_next_connection_and_frees_slot() {
    let server = TestServer::start_with(per_ip(2)).await;
    let addr = server.starttls_addr();
    let mut held = hold_c2s(addr, 2).await;
    let mut third = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed_by_server(&mut third).await.is_empty(),
        "closed at once, nothing sent"
    );
    assert_eq!(refused_metric(&server, "c2s", "per_ip").await, 1);
    held.pop().unwrap().close().await;
    until_open(&server, "c2s", 1).await;
    let mut again = Client::connect(addr).await;
    again.negotiate_tls().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_per_ip_limit_refuses_next_connection_and_frees_slot() {
    let server = TestServer::start_with(per_ip(2)).await;
    let addr = server.http_addr(false);
    let mut a = TcpStream::connect(addr).await.unwrap();
    let b = TcpStream::connect(addr).await.unwrap();
    // a is served: b was accepted before the third.
    assert_eq!(get_keepalive(&mut a, "/.well-known/host-meta").await, 200);
    let mut third = TcpStream::connect(addr).await.unwrap();
    assert!(closed_by_server(&mut third).await.is_empty());
    assert_eq!(refused_metric(&server, "http", "per_ip").await, 1);
    // The c2s listener shares the count.
    let mut c2s = TcpStream::connect(server.starttls_addr()).await.unwrap();
    assert!(closed_by_server(&mut c2s).await.is_empty());
    drop(b);
    let started = Instant::now();
    loop {
        let mut next = TcpStream::connect(addr).await.unwrap();
        next.write_all(
            b"GET /.well-known/host-meta HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        if closed_by_server(&mut next)
            .await
            .starts_with(b"HTTP/1.1 200")
        {
            break;
        }
        assert!(started.elapsed() < BOUND, "the slot was never freed");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_per_ip_limit_refuses_next_connection() {
    let server = TestServer::start_with(per_ip(2)).await;
    let addr = server.admin_addr();
    let mut a = TcpStream::connect(addr).await.unwrap();
    let b = TcpStream::connect(addr).await.unwrap();
    assert_eq!(get_keepalive(&mut a, "/health/live").await, 200);
    let mut third = TcpStream::connect(addr).await.unwrap();
    assert!(closed_by_server(&mut third).await.is_empty());
    drop(a);
    drop(b);
    // The slots come back once their connections' tasks end (a retry
    // before then is refused and counted too).
    let started = Instant::now();
    loop {
        let mut next = TcpStream::connect(addr).await.unwrap();
        next.write_all(
            b"GET /health/live HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        if closed_by_server(&mut next)
            .await
            .starts_with(b"HTTP/1.1 200")
        {
            break;
        }
        assert!(started.elapsed() < BOUND, "the slots were never freed");
    }
    // The third connection, and any retry refused while the slots were
    // still being freed (the metrics are read through this listener, so
    // only now).
    assert!(refused_metric(&server, "admin", "per_ip").await >= 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn total_limit_counts_http_connections_from_accept() {
    let server = TestServer::start_with(|c| c.server.max_connections = 2).await;
    let http = server.http_addr(false);
    let mut a = TcpStream::connect(http).await.unwrap();
    let b = TcpStream::connect(http).await.unwrap();
    assert_eq!(get_keepalive(&mut a, "/.well-known/host-meta").await, 200);
    // Two idle HTTP connections (never upgraded) hold the whole total.
    let mut c2s = TcpStream::connect(server.starttls_addr()).await.unwrap();
    assert!(closed_by_server(&mut c2s).await.is_empty());
    assert_eq!(refused_metric(&server, "c2s", "total").await, 1);
    drop(b);
    until_open(&server, "http", 1).await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.negotiate_tls().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn another_loopback_address_logs_in_while_one_is_full() {
    let server = TestServer::start_with(per_ip(2)).await;
    server.create_user("bob", "pw-bob").await;
    let _held = hold_c2s(server.starttls_addr(), 2).await;
    let mut refused = TcpStream::connect(server.starttls_addr()).await.unwrap();
    assert!(closed_by_server(&mut refused).await.is_empty());
    let other: IpAddr = "127.0.0.2".parse().unwrap();
    let mut tcp = Client::connect_from(server.starttls_addr(), other).await;
    tcp.negotiate_tls().await;
    tcp.auth(Mechanism::ScramSha256, "bob", "pw-bob")
        .await
        .unwrap();
    tcp.bind(None).await;
    let mut ws = Client::connect_websocket_from(server.http_addr(false), other).await;
    ws.auth(Mechanism::ScramSha256, "bob", "pw-bob")
        .await
        .unwrap();
    ws.bind(None).await;
    let pong = ws
        .iq(
            "<iq type='get' id='p2' to='localhost'><ping xmlns='urn:xmpp:ping'/></iq>",
            "p2",
        )
        .await;
    assert_eq!(pong.attr("type"), Some("result"), "{pong}");
    // The raw socket helper works from that address too.
    drop(tcp_connect_from(server.http_addr(false), other).await);
    server.stop().await;
}

/// A `[::]` listener for HTTP (and c2s), plus the usual ones.
fn dual_stack(c: &mut Config) {
    c.http.listen = vec![HttpListener {
        address: "[::]:0".parse().unwrap(),
        tls: false,
    }];
    c.listen.push(Listener {
        address: "[::]:0".parse().unwrap(),
        tls: TlsMode::Starttls,
    });
}

fn v4_loopback(port_of: SocketAddr) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port_of.port()))
}

#[tokio::test(flavor = "multi_thread")]
async fn dual_stack_ipv4_loopback_websocket_and_bosh_get_mechanisms() {
    let server = TestServer::start_with(dual_stack).await;
    let http = v4_loopback(server.http_addr(false));
    let mut ws = Client::connect_websocket_with(http, false, &["xmpp"])
        .await
        .expect("upgrade");
    let features = ws.open_stream().await;
    assert!(
        features.has_child("mechanisms", ns::SASL),
        "127.0.0.1 on [::] is loopback: {features}"
    );
    let created: Element = bosh_post(
        http,
        &format!("<body xmlns='{BIND}' rid='1000' to='localhost' wait='5' hold='1' ver='1.6' xmpp:version='1.0' xmlns:xmpp='{XBOSH}'/>"),
    )
    .await;
    let features = created
        .get_child("features", ns::STREAMS)
        .expect("features");
    assert!(features.has_child("mechanisms", ns::SASL), "{created}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn auth_failure_limiter_counts_mapped_ipv4_as_ipv4() {
    let server = TestServer::start_with(|c| {
        dual_stack(c);
        c.auth.max_failures_per_ip = 2;
    })
    .await;
    server.create_user("alice", "secret").await;
    // Two failures from 127.0.0.1 on the IPv4 listener...
    let mut c = Client::connect(server.starttls_addr()).await;
    c.negotiate_tls().await;
    for _ in 0..2 {
        c.auth(Mechanism::ScramSha256, "alice", "bad")
            .await
            .unwrap_err();
    }
    // ...limit the same client on the [::] listener, where the kernel
    // gives its address as ::ffff:127.0.0.1.
    let dual = server
        .server
        .c2s_addrs
        .iter()
        .find(|(a, _)| a.is_ipv6() || a.ip().is_unspecified())
        .map(|(a, _)| *a)
        .expect("the [::] listener");
    let mut c2 = Client::connect(v4_loopback(dual)).await;
    c2.negotiate_tls().await;
    let f = c2
        .auth(Mechanism::ScramSha256, "alice", "secret")
        .await
        .unwrap_err();
    assert!(f.has_child("temporary-auth-failure", ns::SASL), "{f}");
    server.stop().await;
}

/// Stopping the server does not wait for idle HTTP connections: an idle
/// keep-alive connection (after a request) and a new one that sent
/// nothing are closed at once, not after `keepalive_timeout_secs` (15 s)
/// or `request_head_timeout_secs` (20 s), which every stop used to wait
/// out while a browser held a connection.
#[tokio::test(flavor = "multi_thread")]
async fn stopping_closes_idle_http_connections_at_once() {
    let server = TestServer::start().await;
    let http = server.http_addr(false);
    let mut kept = TcpStream::connect(http).await.unwrap();
    assert_eq!(
        get_keepalive(&mut kept, "/.well-known/host-meta").await,
        200
    );
    let mut fresh = TcpStream::connect(http).await.unwrap();
    until_open(&server, "http", 2).await;
    let started = Instant::now();
    server.stop().await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the stop waited {took:?} for idle HTTP connections"
    );
    // Both were closed by the server (not left open past the stop).
    closed_by_server(&mut kept).await;
    closed_by_server(&mut fresh).await;
}
