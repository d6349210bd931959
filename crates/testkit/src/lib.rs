//! Test kit: an in-process Starling on ephemeral loopback ports and a
//! scripted XMPP client that speaks over a real socket, so integration tests
//! read as conversations:
//!
//! ```no_run
//! # use starling_testkit::TestServer;
//! # async fn scenario() {
//! let server = TestServer::start().await;
//! let mut alice = server.login("alice").await;
//! let mut bob = server.login("bob").await;
//! alice.send(&format!("<message to='{}' type='chat'><body>hi</body></message>", bob.jid)).await;
//! let msg = bob.recv().await;
//! assert_eq!(msg.get_child("body", "jabber:client").unwrap().text(), "hi");
//! # }
//! ```
//!
//! The client panics with a readable message on anything unexpected; every
//! wait has a timeout, so a broken server fails a test instead of hanging it.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use sha2::Digest;
use starling_proto::sasl::{ChannelBindingType, Mechanism, ScramClient};
use starling_server::config::{Config, HttpListener, Listener, TlsMode};
use starling_server::modules;
use starling_server::RunningServer;
use starling_xml::{Element, Limits, StreamEvent, StreamParser};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::WebSocketStream;

pub use starling_server;
pub use starling_xml;

pub mod muc;

/// Namespaces used in assertions.
pub mod ns {
    pub use starling_proto::ns::*;
}

/// How long any single expectation may wait.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The test domain.
pub const DOMAIN: &str = "localhost";

/// How a test client connects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// STARTTLS on the c2s listener.
    Tcp,
    /// RFC 7395 WebSocket on an HTTP listener (`wss:` if `tls`).
    WebSocket {
        /// Over TLS.
        tls: bool,
    },
}

/// A Starling running in this process on loopback with ephemeral ports and
/// a fresh data directory.
pub struct TestServer {
    /// The running server.
    pub server: RunningServer,
    /// Its data directory (removed on [`TestServer::stop`]).
    pub dir: PathBuf,
    /// Its PostgreSQL database, when tests run on PostgreSQL (dropped on
    /// [`TestServer::stop`]).
    pub database: Option<TestDatabase>,
}

/// A configuration for tests: loopback, ephemeral ports, temp data dir,
/// in-band registration on, quick limits.
pub fn test_config() -> Config {
    let mut cfg = Config::default();
    cfg.server.data_dir =
        std::env::temp_dir().join(format!("starling-test-{}", starling_proto::random_id(12)));
    cfg.listen = vec![
        Listener {
            address: "127.0.0.1:0".parse().unwrap(),
            tls: TlsMode::Starttls,
        },
        Listener {
            address: "127.0.0.1:0".parse().unwrap(),
            tls: TlsMode::Direct,
        },
    ];
    cfg.http.listen = vec![
        HttpListener {
            address: "127.0.0.1:0".parse().unwrap(),
            tls: false,
        },
        HttpListener {
            address: "127.0.0.1:0".parse().unwrap(),
            tls: true,
        },
    ];
    cfg.admin.listen = vec!["127.0.0.1:0".parse().unwrap()];
    cfg.modules.get_mut::<modules::Register>().enabled = true;
    cfg.modules.get_mut::<modules::Register>().max_per_ip = 1000;
    cfg.server.shutdown_timeout_secs = 5;
    cfg
}

impl TestServer {
    /// Starts a server with [`test_config`].
    pub async fn start() -> TestServer {
        Self::start_with(|_| {}).await
    }

    /// Starts a server with [`test_config`] changed by `f`.
    pub async fn start_with(f: impl FnOnce(&mut Config)) -> TestServer {
        Self::start_with_hooks(f, |_| {}).await
    }

    /// Starts a server with [`test_config`] changed by `f` and extra
    /// handlers or services registered by `extra`.
    pub async fn start_with_hooks(
        f: impl FnOnce(&mut Config),
        extra: impl FnOnce(&mut starling_core::hooks::HookRegistry),
    ) -> TestServer {
        let mut cfg = test_config();
        f(&mut cfg);
        let dir = cfg.server.data_dir.clone();
        let database = match (test_pg_admin_url(), cfg.storage.backend.as_str()) {
            (Some(admin), "sqlite") => {
                let db = TestDatabase::for_data_dir(&admin, &dir).await;
                cfg.storage.backend = "postgres".into();
                cfg.storage.url = Some(db.url.clone());
                Some(db)
            }
            _ => None,
        };
        let server = starling_server::start_with(cfg, extra)
            .await
            .expect("server starts");
        TestServer {
            server,
            dir,
            database,
        }
    }

    /// The STARTTLS listener.
    pub fn starttls_addr(&self) -> SocketAddr {
        self.server
            .addr(TlsMode::Starttls)
            .expect("starttls listener")
    }

    /// The direct TLS listener.
    pub fn direct_addr(&self) -> SocketAddr {
        self.server
            .addr(TlsMode::Direct)
            .expect("direct TLS listener")
    }

    /// The HTTP listener (WebSocket) with or without TLS.
    pub fn http_addr(&self, tls: bool) -> SocketAddr {
        self.server
            .http_addrs
            .iter()
            .find(|(_, t)| *t == tls)
            .map(|(a, _)| *a)
            .expect("HTTP listener")
    }

    /// The admin listener (API, metrics, health).
    pub fn admin_addr(&self) -> SocketAddr {
        *self.server.admin_addrs.first().expect("admin listener")
    }

    /// Creates an account `user@localhost` with password `password`.
    pub async fn create_user(&self, user: &str, password: &str) {
        let jid = starling_proto::BareJid::new(&format!("{user}@{DOMAIN}")).unwrap();
        starling_server::accounts::create(&self.server.env.storage, &jid, password, 4096)
            .await
            .expect("create account");
    }

    /// Creates `user` (password "pw-" + user), logs in over STARTTLS with
    /// SCRAM-SHA-256, binds a resource, sends initial presence and consumes
    /// its echo. Other resources of the same user receive that presence.
    pub async fn login(&self, user: &str) -> Client {
        self.login_over(user, Transport::Tcp).await
    }

    /// Like [`TestServer::login`], over `transport`.
    pub async fn login_over(&self, user: &str, transport: Transport) -> Client {
        let password = format!("pw-{user}");
        if !self
            .server
            .env
            .storage
            .accounts
            .exists(&starling_proto::BareJid::new(&format!("{user}@{DOMAIN}")).unwrap())
            .await
            .unwrap()
        {
            self.create_user(user, &password).await;
        }
        let mut c = match transport {
            Transport::Tcp => {
                let mut c = Client::connect(self.starttls_addr()).await;
                c.negotiate_tls().await;
                c
            }
            Transport::WebSocket { tls } => {
                Client::connect_websocket(self.http_addr(tls), tls).await
            }
        };
        c.auth(Mechanism::ScramSha256, user, &password)
            .await
            .expect("login succeeds");
        c.bind(None).await;
        c.send("<presence/>").await;
        // RFC 6121 §4.2.2: the server echoes initial presence to its sender.
        let echo = c.recv().await;
        assert!(
            echo.name() == "presence" && echo.attr("from") == Some(c.jid.as_str()),
            "expected presence echo, got {echo}"
        );
        c
    }

    /// Where this server keeps its data, for opening the same storage again
    /// after it stopped (whichever backend the tests run on).
    pub fn backend_config(&self) -> starling_storage::BackendConfig {
        match &self.database {
            Some(db) => starling_storage::BackendConfig::Postgres {
                url: db.url.clone(),
                pool_size: 1,
            },
            None => starling_storage::BackendConfig::Sqlite {
                path: self.dir.join("starling.db"),
                pool_size: 1,
            },
        }
    }

    /// Graceful shutdown, then removes the data directory (and the
    /// PostgreSQL database).
    pub async fn stop(self) {
        self.server.shutdown().await;
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(db) = self.database {
            db.drop_database().await;
        }
    }
}

/// The PostgreSQL administrator URL when tests run on PostgreSQL:
/// `STARLING_TEST_BACKEND=postgres` with `STARLING_TEST_PG_URL` set
/// (`scripts/pg-test.sh start` prints one). `None` for SQLite (unset or
/// `sqlite`).
pub fn test_pg_admin_url() -> Option<String> {
    match std::env::var("STARLING_TEST_BACKEND").as_deref() {
        Err(_) | Ok("") | Ok("sqlite") => None,
        Ok("postgres") => match std::env::var("STARLING_TEST_PG_URL") {
            Ok(url) if !url.trim().is_empty() => Some(url),
            _ => panic!(
                "STARLING_TEST_BACKEND=postgres needs STARLING_TEST_PG_URL (scripts/pg-test.sh start)"
            ),
        },
        Ok(other) => panic!("STARLING_TEST_BACKEND={other:?}: use sqlite or postgres"),
    }
}

/// A PostgreSQL database of one test server, named after its data
/// directory, so that a server restarted on the same directory finds its
/// data again. It is labelled with that directory: databases whose
/// directory is gone (a test that stopped without [`TestServer::stop`], a
/// killed binary) are dropped by the next test run.
pub struct TestDatabase {
    admin_url: String,
    name: String,
    /// The database's URL.
    pub url: String,
}

const TEST_DB_PREFIX: &str = "starling_test_dir_";

impl TestDatabase {
    /// Creates (or finds) the database for `data_dir`; creates `data_dir`.
    pub async fn for_data_dir(admin_url: &str, data_dir: &std::path::Path) -> TestDatabase {
        use starling_storage::postgres::admin;
        // The directory exists before its database: the sweep below never
        // takes a database being set up for a directory not yet created.
        std::fs::create_dir_all(data_dir).expect("create the test data directory");
        let label = data_dir.display().to_string();
        // FNV-1a: a stable name for the same directory in every process.
        let hash = label.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let name = format!("{TEST_DB_PREFIX}{hash:016x}");
        static SWEPT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !SWEPT.swap(true, std::sync::atomic::Ordering::SeqCst) {
            sweep_orphaned_databases(admin_url, &name).await;
        }
        let url = admin::create_database(admin_url, &name)
            .await
            .unwrap_or_else(|e| panic!("creating test database {name}: {e}"));
        admin::set_label(&url, &label)
            .await
            .unwrap_or_else(|e| panic!("labelling test database {name}: {e}"));
        TestDatabase {
            admin_url: admin_url.to_owned(),
            name,
            url,
        }
    }

    /// Drops the database (a failure is reported, not fatal).
    pub async fn drop_database(self) {
        if let Err(e) =
            starling_storage::postgres::admin::drop_database(&self.admin_url, &self.name).await
        {
            eprintln!("warning: test database {} not dropped: {e}", self.name);
        }
    }
}

/// Drops test databases whose labelled data directory no longer exists.
async fn sweep_orphaned_databases(admin_url: &str, keep: &str) {
    use starling_storage::postgres::admin;
    let Ok(names) = admin::databases_with_prefix(admin_url, TEST_DB_PREFIX).await else {
        return;
    };
    for name in names.into_iter().filter(|n| n != keep) {
        let Ok(url) = admin::with_database(admin_url, &name) else {
            continue;
        };
        if let Ok(Some(dir)) = admin::label(&url).await {
            if !std::path::Path::new(&dir).exists() {
                let _ = admin::drop_database(admin_url, &name).await;
            }
        }
    }
}

/// Accepts any certificate: tests run against self-signed certificates.
#[derive(Debug)]
struct NoVerify;

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A TLS connector that accepts any server certificate (tests of the
/// server's TLS layer itself).
pub fn insecure_tls_connector() -> TlsConnector {
    tls_connector(false)
}

fn tls_connector(alpn: bool) -> TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoVerify))
        .with_no_client_auth();
    if alpn {
        cfg.alpn_protocols = vec![b"xmpp-client".to_vec()];
    }
    TlsConnector::from(Arc::new(cfg))
}

/// The `<user-agent id/>` (a UUID v4, XEP-0388 §2.4) that
/// [`Client::auth_sasl2`] and [`Client::auth_fast`] send: one client
/// installation, so FAST tokens and Bind 2 resources carry over.
pub const SASL2_USER_AGENT: &str = "d4565fa7-4d72-4749-b3d3-740edbf87770";

/// A TLS client that keeps the server's session tickets across
/// connections, like one client device ([`Client::starttls_via`]).
pub fn device_tls() -> TlsConnector {
    tls_connector(false)
}

enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    /// RFC 7395: one element per text message, over TCP or TLS.
    Ws(Box<WebSocketStream<Conn>>),
    Gone,
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Conn::Ws(_) | Conn::Gone => Poll::Ready(Ok(())),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Conn::Ws(_) | Conn::Gone => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Conn::Ws(_) | Conn::Gone => Poll::Ready(Ok(())),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Conn::Ws(_) | Conn::Gone => Poll::Ready(Ok(())),
        }
    }
}

/// What the server sent.
#[derive(Debug)]
pub enum Event {
    /// The server's stream header.
    Header,
    /// A top-level element (stanza, features, stream error, SASL…).
    Element(Element),
    /// `</stream:stream>`.
    Close,
    /// The connection ended.
    Eof,
}

/// A scripted XMPP client over a real socket.
pub struct Client {
    conn: Conn,
    parser: StreamParser,
    buf: Vec<u8>,
    /// The bound full JID, after [`Client::bind`].
    pub jid: String,
    /// The features of the last stream header.
    pub features: Option<Element>,
    /// The SASL mechanism of the last successful authentication.
    pub mechanism_used: Option<Mechanism>,
    /// The domain streams are opened to (`to`) and, for STARTTLS, the TLS
    /// server name (SNI); [`DOMAIN`] unless changed.
    pub domain: String,
}

fn client_limits() -> Limits {
    Limits {
        max_stanza_bytes: 16 * 1024 * 1024,
        ..Limits::default()
    }
}

fn client_parser() -> StreamParser {
    StreamParser::new(client_limits())
}

impl Client {
    /// Connects over plain TCP (for STARTTLS, or plaintext tests).
    pub async fn connect(addr: SocketAddr) -> Client {
        Self::connect_tcp(TcpStream::connect(addr).await.expect("connect"))
    }

    /// Like [`Client::connect`], from the local address `from` (another
    /// loopback address such as 127.0.0.2: a second source address).
    pub async fn connect_from(addr: SocketAddr, from: IpAddr) -> Client {
        Self::connect_tcp(tcp_connect_from(addr, from).await)
    }

    fn connect_tcp(tcp: TcpStream) -> Client {
        Client {
            conn: Conn::Plain(tcp),
            parser: client_parser(),
            buf: Vec::new(),
            jid: String::new(),
            features: None,
            mechanism_used: None,
            domain: DOMAIN.to_owned(),
        }
    }

    /// Connects to an RFC 7395 WebSocket endpoint (`ws_addr` is an HTTP
    /// listener; `tls` for `wss:`) offering `protocols` (normally
    /// `["xmpp"]`). Returns the HTTP status if the upgrade is refused. The
    /// stream is not opened yet.
    pub async fn connect_websocket_with(
        addr: SocketAddr,
        tls: bool,
        protocols: &[&str],
    ) -> Result<Client, u16> {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        Self::websocket_over(tcp, addr, tls, protocols).await
    }

    /// Like [`Client::connect_websocket`] (plain `ws:`), from the local
    /// address `from` (another loopback address: a second source).
    pub async fn connect_websocket_from(addr: SocketAddr, from: IpAddr) -> Client {
        let tcp = tcp_connect_from(addr, from).await;
        let mut c = Self::websocket_over(tcp, addr, false, &["xmpp"])
            .await
            .expect("WebSocket upgrade accepted");
        c.open_stream().await;
        c
    }

    async fn websocket_over(
        tcp: TcpStream,
        addr: SocketAddr,
        tls: bool,
        protocols: &[&str],
    ) -> Result<Client, u16> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let conn = if tls {
            let tls = tls_connector(false)
                .connect(ServerName::try_from(DOMAIN).unwrap(), tcp)
                .await
                .expect("TLS handshake");
            Conn::Tls(Box::new(tls))
        } else {
            Conn::Plain(tcp)
        };
        let scheme = if tls { "wss" } else { "ws" };
        let mut req = format!("{scheme}://{DOMAIN}:{}/xmpp-websocket", addr.port())
            .into_client_request()
            .expect("request");
        if !protocols.is_empty() {
            req.headers_mut().insert(
                "Sec-WebSocket-Protocol",
                protocols.join(", ").parse().unwrap(),
            );
        }
        match tokio_tungstenite::client_async(req, conn).await {
            Ok((ws, _)) => Ok(Client {
                conn: Conn::Ws(Box::new(ws)),
                parser: StreamParser::for_elements(client_limits()),
                buf: Vec::new(),
                jid: String::new(),
                features: None,
                mechanism_used: None,
                domain: DOMAIN.to_owned(),
            }),
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => Err(resp.status().as_u16()),
            Err(e) => panic!("WebSocket handshake failed: {e}"),
        }
    }

    /// Connects over WebSocket with the `xmpp` subprotocol and opens the
    /// stream (RFC 7395 §3.3.2).
    pub async fn connect_websocket(addr: SocketAddr, tls: bool) -> Client {
        let mut c = Self::connect_websocket_with(addr, tls, &["xmpp"])
            .await
            .expect("WebSocket upgrade accepted");
        c.open_stream().await;
        c
    }

    /// True on a WebSocket connection.
    pub fn is_websocket(&self) -> bool {
        matches!(self.conn, Conn::Ws(_))
    }

    /// Sends one WebSocket message of raw bytes (a text frame, or a
    /// binary one if `binary`).
    pub async fn send_ws_frame(&mut self, bytes: &[u8], binary: bool) -> bool {
        use futures_util::SinkExt;
        use tokio_tungstenite::tungstenite::Message;
        let Conn::Ws(ws) = &mut self.conn else {
            panic!("not a WebSocket connection");
        };
        let msg = if binary {
            Message::Binary(bytes.to_vec().into())
        } else {
            Message::Text(String::from_utf8(bytes.to_vec()).expect("UTF-8").into())
        };
        ws.send(msg).await.is_ok()
    }

    /// Connects with direct TLS (XEP-0368) and opens the stream.
    pub async fn connect_direct_tls(addr: SocketAddr) -> Client {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let tls = tls_connector(true)
            .connect(ServerName::try_from(DOMAIN).unwrap(), tcp)
            .await
            .expect("direct TLS handshake");
        let mut c = Client {
            conn: Conn::Tls(Box::new(tls)),
            parser: client_parser(),
            buf: Vec::new(),
            jid: String::new(),
            features: None,
            mechanism_used: None,
            domain: DOMAIN.to_owned(),
        };
        c.open_stream().await;
        c
    }

    /// Writes raw bytes (over WebSocket: as one text message).
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        if self.is_websocket() {
            assert!(self.send_ws_frame(bytes, false).await, "write");
            return;
        }
        self.conn.write_all(bytes).await.expect("write");
        self.conn.flush().await.expect("flush");
    }

    /// Writes an XML string.
    pub async fn send(&mut self, xml: &str) {
        self.send_raw(xml.as_bytes()).await
    }

    /// Writes raw bytes, ignoring errors (the server may already be gone).
    pub async fn try_send_raw(&mut self, bytes: &[u8]) -> bool {
        if self.is_websocket() {
            return self.send_ws_frame(bytes, false).await;
        }
        self.conn.write_all(bytes).await.is_ok() && self.conn.flush().await.is_ok()
    }

    /// The next event from the server, or `None` after [`TIMEOUT`].
    pub async fn next_event_within(&mut self, wait: Duration) -> Option<Event> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if !self.buf.is_empty() {
                let mut input: &[u8] = &self.buf;
                let before = input.len();
                let ev = self.parser.push(&mut input);
                let consumed = before - input.len();
                self.buf.drain(..consumed);
                match ev {
                    Ok(Some(StreamEvent::Stanza(el))) if el.ns() == ns::FRAMING => {
                        return Some(match el.name() {
                            "open" => Event::Header,
                            _ => Event::Close,
                        })
                    }
                    Ok(Some(StreamEvent::Open(_))) => return Some(Event::Header),
                    Ok(Some(StreamEvent::Stanza(el))) => return Some(Event::Element(el)),
                    Ok(Some(StreamEvent::Close)) => return Some(Event::Close),
                    Ok(None) => {}
                    Err(e) => panic!("server sent bad XML: {e}"),
                }
            }
            if let Conn::Ws(ws) = &mut self.conn {
                use futures_util::StreamExt;
                use tokio_tungstenite::tungstenite::Message;
                match tokio::time::timeout_at(deadline, ws.next()).await {
                    Err(_) => return None,
                    Ok(Some(Ok(Message::Text(t)))) => self.buf.extend_from_slice(t.as_bytes()),
                    Ok(Some(Ok(Message::Binary(_)))) => panic!("the server sent a binary message"),
                    Ok(Some(Ok(Message::Close(_)))) | Ok(None) | Ok(Some(Err(_))) => {
                        return Some(Event::Eof)
                    }
                    Ok(Some(Ok(_))) => {}
                }
                continue;
            }
            let mut chunk = [0u8; 16384];
            let n = match tokio::time::timeout_at(deadline, self.conn.read(&mut chunk)).await {
                Err(_) => return None,
                Ok(Ok(n)) => n,
                Ok(Err(_)) => 0,
            };
            if n == 0 {
                return Some(Event::Eof);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The next event, panicking after [`TIMEOUT`].
    pub async fn next_event(&mut self) -> Event {
        self.next_event_within(TIMEOUT)
            .await
            .expect("timed out waiting for the server")
    }

    /// The next top-level element, panicking on anything else.
    pub async fn recv(&mut self) -> Element {
        match self.next_event().await {
            Event::Element(el) => el,
            other => panic!("expected an element, got {other:?}"),
        }
    }

    /// Asserts that nothing arrives for `wait`.
    pub async fn expect_silence(&mut self, wait: Duration) {
        if let Some(ev) = self.next_event_within(wait).await {
            panic!("expected silence, got {ev:?}");
        }
    }

    /// Reads until a stream error; asserts its condition, then that the
    /// stream is closed.
    pub async fn expect_stream_error(&mut self, condition: &str) {
        loop {
            match self.next_event().await {
                Event::Header => continue,
                Event::Element(el) if el.is("error", ns::STREAMS) => {
                    let got: Vec<_> = el
                        .children()
                        .filter(|c| c.ns() == ns::STREAM_ERRORS && c.name() != "text")
                        .map(|c| c.name().to_owned())
                        .collect();
                    assert_eq!(got, [condition], "stream error: {el}");
                    break;
                }
                Event::Element(el) if el.is("features", ns::STREAMS) => continue,
                other => panic!("expected stream error {condition}, got {other:?}"),
            }
        }
        match self.next_event().await {
            Event::Close | Event::Eof => {}
            other => panic!("expected the stream to close after the error, got {other:?}"),
        }
    }

    /// Asserts the connection is closed (EOF, possibly after a close tag).
    pub async fn expect_closed(&mut self) {
        loop {
            match self.next_event().await {
                Event::Eof => return,
                Event::Close => continue,
                other => panic!("expected the connection to close, got {other:?}"),
            }
        }
    }

    /// Sends a stream header to [`DOMAIN`] and reads the server's header and
    /// features.
    pub async fn open_stream(&mut self) -> Element {
        if self.is_websocket() {
            self.send(&format!(
                "<open xmlns='urn:ietf:params:xml:ns:xmpp-framing' to='{}' version='1.0'/>",
                self.domain
            ))
            .await;
        } else {
            self.send(&format!(
                "<?xml version='1.0'?><stream:stream to='{}' version='1.0' \
             xmlns='jabber:client' xmlns:stream='http://etherx.jabber.org/streams'>",
                self.domain
            ))
            .await;
        }
        match self.next_event().await {
            Event::Header => {}
            other => panic!("expected stream header, got {other:?}"),
        }
        let features = self.recv().await;
        assert!(
            features.is("features", ns::STREAMS),
            "expected features, got {features}"
        );
        self.features = Some(features.clone());
        features
    }

    /// Opens the stream and performs STARTTLS (RFC 6120 §5), then reopens.
    pub async fn negotiate_tls(&mut self) -> Element {
        let f = self.open_stream().await;
        assert!(f.has_child("starttls", ns::TLS), "no STARTTLS offered: {f}");
        self.starttls().await
    }

    /// Sends `<starttls/>`, expects `<proceed/>`, upgrades, reopens.
    pub async fn starttls(&mut self) -> Element {
        self.starttls_via(&tls_connector(false)).await
    }

    /// [`Client::starttls`] with the given TLS client: one made by
    /// [`device_tls`] keeps the server's session tickets between
    /// connections, as a client device does.
    pub async fn starttls_via(&mut self, connector: &TlsConnector) -> Element {
        self.send("<starttls xmlns='urn:ietf:params:xml:ns:xmpp-tls'/>")
            .await;
        let proceed = self.recv().await;
        assert!(
            proceed.is("proceed", ns::TLS),
            "expected proceed, got {proceed}"
        );
        let Conn::Plain(tcp) = std::mem::replace(&mut self.conn, Conn::Gone) else {
            panic!("STARTTLS on a TLS connection");
        };
        let tls = connector
            .connect(ServerName::try_from(self.domain.clone()).unwrap(), tcp)
            .await
            .expect("TLS handshake");
        self.conn = Conn::Tls(Box::new(tls));
        self.parser = client_parser();
        self.buf.clear();
        self.open_stream().await
    }

    /// The mechanisms offered in the current features.
    pub fn mechanisms(&self) -> Vec<String> {
        self.features
            .as_ref()
            .and_then(|f| f.get_child("mechanisms", ns::SASL))
            .map(|m| m.children().map(|c| c.text()).collect())
            .unwrap_or_default()
    }

    /// How the TLS handshake of this connection went (full or resumed);
    /// `None` without TLS.
    pub fn tls_handshake_kind(&self) -> Option<rustls::HandshakeKind> {
        match &self.conn {
            Conn::Tls(tls) => tls.get_ref().1.handshake_kind(),
            _ => None,
        }
    }

    /// The server certificate of this TLS connection (DER).
    pub fn peer_certificate(&self) -> Option<Vec<u8>> {
        match &self.conn {
            Conn::Tls(tls) => tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| c.as_ref().to_vec()),
            _ => None,
        }
    }

    /// Channel binding data for a -PLUS mechanism on this connection.
    pub fn channel_binding(&self, ty: ChannelBindingType) -> Vec<u8> {
        let tls = match &self.conn {
            Conn::Tls(tls) => tls,
            Conn::Ws(ws) => match ws.get_ref() {
                Conn::Tls(tls) => tls,
                _ => panic!("channel binding needs TLS (wss:)"),
            },
            _ => panic!("channel binding needs TLS"),
        };
        let conn = tls.get_ref().1;
        match ty {
            ChannelBindingType::TlsExporter => conn
                .export_keying_material([0u8; 32], b"EXPORTER-Channel-Binding", None)
                .expect("exporter")
                .to_vec(),
            ChannelBindingType::TlsServerEndPoint => {
                let cert = &conn.peer_certificates().expect("server certificate")[0];
                sha2::Sha256::digest(cert.as_ref()).to_vec()
            }
        }
    }

    /// SASL authentication; on success the stream is restarted and the new
    /// features read. Returns the `<failure/>` element on failure.
    pub async fn auth(
        &mut self,
        mechanism: Mechanism,
        user: &str,
        password: &str,
    ) -> Result<(), Element> {
        let binding = if mechanism.is_plus() {
            let ty = ChannelBindingType::TlsExporter;
            Some((ty, self.channel_binding(ty)))
        } else {
            None
        };
        self.auth_with_binding(mechanism, user, password, binding)
            .await
    }

    /// SASL authentication with explicit channel binding data.
    pub async fn auth_with_binding(
        &mut self,
        mechanism: Mechanism,
        user: &str,
        password: &str,
        binding: Option<(ChannelBindingType, Vec<u8>)>,
    ) -> Result<(), Element> {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        if mechanism == Mechanism::Plain {
            let msg = format!("\0{user}\0{password}");
            self.send(&format!(
                "<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' mechanism='PLAIN'>{}</auth>",
                b64.encode(msg)
            ))
            .await;
            let reply = self.recv().await;
            if !reply.is("success", ns::SASL) {
                return Err(reply);
            }
        } else {
            let mut scram =
                ScramClient::new(mechanism, user, password, binding).expect("scram client");
            let first = scram.client_first();
            self.send(&format!(
                "<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' mechanism='{}'>{}</auth>",
                mechanism.name(),
                b64.encode(first)
            ))
            .await;
            let challenge = self.recv().await;
            if !challenge.is("challenge", ns::SASL) {
                return Err(challenge);
            }
            let server_first = b64
                .decode(challenge.text().trim())
                .expect("base64 challenge");
            let fin = scram.client_final(&server_first).expect("client final");
            self.send(&format!(
                "<response xmlns='urn:ietf:params:xml:ns:xmpp-sasl'>{}</response>",
                b64.encode(fin)
            ))
            .await;
            let reply = self.recv().await;
            if !reply.is("success", ns::SASL) {
                return Err(reply);
            }
            let server_final = b64.decode(reply.text().trim()).expect("base64 success");
            scram
                .verify_server_final(&server_final)
                .expect("server signature verifies");
        }
        self.mechanism_used = Some(mechanism);
        self.parser = if self.is_websocket() {
            StreamParser::for_elements(client_limits())
        } else {
            client_parser()
        };
        self.open_stream().await;
        Ok(())
    }

    /// XEP-0388 SASL2 authentication with `<user-agent/>` and `inline`
    /// (extra children of `<authenticate/>`, e.g. a Bind 2 request). On
    /// success returns the `<success/>` element, after checking the server
    /// signature, and reads the features that follow it (no stream
    /// restart); they are in `features`. On failure returns what the server
    /// sent instead.
    pub async fn auth_sasl2(
        &mut self,
        mechanism: Mechanism,
        user: &str,
        password: &str,
        inline: &str,
    ) -> Result<Element, Element> {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        const NS2: &str = "urn:xmpp:sasl:2";
        let agent = format!(
            "<user-agent id='{SASL2_USER_AGENT}'><software>starling-testkit</software></user-agent>"
        );
        let binding = if mechanism.is_plus() {
            let ty = ChannelBindingType::TlsExporter;
            Some((ty, self.channel_binding(ty)))
        } else {
            None
        };
        let mut scram = None;
        let first = if mechanism == Mechanism::Plain {
            format!("\0{user}\0{password}").into_bytes()
        } else {
            let mut c = ScramClient::new(mechanism, user, password, binding).expect("scram client");
            let first = c.client_first();
            scram = Some(c);
            first
        };
        self.send(&format!(
            "<authenticate xmlns='{NS2}' mechanism='{}'><initial-response>{}</initial-response>{agent}{inline}</authenticate>",
            mechanism.name(),
            b64.encode(first)
        ))
        .await;
        let mut reply = self.recv().await;
        if let Some(c) = scram.as_mut() {
            if !reply.is("challenge", NS2) {
                return Err(reply);
            }
            let server_first = b64.decode(reply.text().trim()).expect("base64 challenge");
            let fin = c.client_final(&server_first).expect("client final");
            self.send(&format!(
                "<response xmlns='{NS2}'>{}</response>",
                b64.encode(fin)
            ))
            .await;
            reply = self.recv().await;
        }
        if !reply.is("success", NS2) {
            return Err(reply);
        }
        if let Some(c) = &scram {
            let data = reply
                .get_child("additional-data", NS2)
                .map(|d| b64.decode(d.text().trim()).expect("base64 additional data"))
                .expect("SCRAM server-final in <additional-data/>");
            c.verify_server_final(&data)
                .expect("server signature verifies");
        }
        self.mechanism_used = Some(mechanism);
        let features = self.recv().await;
        assert!(
            features.is("features", ns::STREAMS),
            "features after SASL2 success, got {features}"
        );
        self.features = Some(features);
        Ok(reply)
    }

    /// XEP-0484 FAST: SASL2 authentication with a token over `mechanism`
    /// (`HT-SHA-256-EXPR`, `-ENDP` or `-NONE`), the same user agent as
    /// [`Client::auth_sasl2`], `<fast/>` with `fast_attrs`, and `inline`.
    /// On success checks the server's responder message and reads the
    /// features that follow.
    pub async fn auth_fast(
        &mut self,
        mechanism: &str,
        user: &str,
        token: &str,
        fast_attrs: &str,
        inline: &str,
    ) -> Result<Element, Element> {
        use base64::Engine;
        use starling_proto::sasl::ht;
        let b64 = base64::engine::general_purpose::STANDARD;
        const NS2: &str = "urn:xmpp:sasl:2";
        let ht_mech = ht::HtMechanism::from_name(mechanism).expect("an HT mechanism");
        let cb = ht_mech
            .binding()
            .map(|ty| self.channel_binding(ty))
            .unwrap_or_default();
        let first = ht::initiator(user, token.as_bytes(), &cb);
        self.send(&format!(
            "<authenticate xmlns='{NS2}' mechanism='{mechanism}'><initial-response>{}</initial-response><user-agent id='{SASL2_USER_AGENT}'/><fast xmlns='urn:xmpp:fast:0' {fast_attrs}/>{inline}</authenticate>",
            b64.encode(first)
        ))
        .await;
        let reply = self.recv().await;
        if !reply.is("success", NS2) {
            return Err(reply);
        }
        let data = reply
            .get_child("additional-data", NS2)
            .map(|d| b64.decode(d.text().trim()).expect("base64"))
            .expect("the responder message in <additional-data/>");
        assert_eq!(
            data,
            ht::responder(token.as_bytes(), &cb),
            "server authenticated itself"
        );
        let features = self.recv().await;
        assert!(features.is("features", ns::STREAMS), "{features}");
        self.features = Some(features);
        Ok(reply)
    }

    /// Binds a resource (RFC 6120 §7) and returns the full JID.
    pub async fn bind(&mut self, resource: Option<&str>) -> String {
        let res = resource
            .map(|r| format!("<resource>{r}</resource>"))
            .unwrap_or_default();
        self.send(&format!(
            "<iq type='set' id='bind1'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'>{res}</bind></iq>"
        ))
        .await;
        let reply = self.recv().await;
        assert_eq!(reply.attr("type"), Some("result"), "bind failed: {reply}");
        let jid = reply
            .get_child("bind", ns::BIND)
            .and_then(|b| b.get_child("jid", ns::BIND))
            .map(|j| j.text())
            .expect("bind result carries the JID");
        self.jid = jid.clone();
        jid
    }

    /// Sends an iq and waits for the reply with the same id (other elements
    /// that arrive meanwhile are discarded).
    pub async fn iq(&mut self, xml_with_id: &str, id: &str) -> Element {
        self.send(xml_with_id).await;
        loop {
            let el = self.recv().await;
            if el.name() == "iq" && el.attr("id") == Some(id) {
                return el;
            }
        }
    }

    /// Receives until an element matching `pred` arrives.
    pub async fn recv_until(&mut self, pred: impl Fn(&Element) -> bool) -> Element {
        loop {
            let el = self.recv().await;
            if pred(&el) {
                return el;
            }
        }
    }

    /// The `var`s of the features in `to`'s disco#info (XEP-0030 §3.1);
    /// panics if the query is not answered with a result.
    pub async fn disco_features(&mut self, to: &str) -> Vec<String> {
        let id = format!("disco-{}", starling_proto::random_id(6));
        let r = self
            .iq(
                &format!("<iq to='{to}' type='get' id='{id}'><query xmlns='http://jabber.org/protocol/disco#info'/></iq>"),
                &id,
            )
            .await;
        r.get_child("query", ns::DISCO_INFO)
            .unwrap_or_else(|| panic!("no disco#info result: {r}"))
            .children()
            .filter(|f| f.name() == "feature")
            .filter_map(|f| f.attr("var").map(str::to_owned))
            .collect()
    }

    /// Receives until a `<message/>` arrives (skipping presence broadcasts).
    pub async fn recv_message(&mut self) -> Element {
        self.recv_until(|e| e.name() == "message").await
    }

    /// The bodies of the messages in this account's archive (XEP-0313,
    /// the first 100), oldest first. Nothing else may be queued for the
    /// client.
    pub async fn archived_bodies(&mut self) -> Vec<String> {
        const MAM: &str = "urn:xmpp:mam:2";
        self.send(&format!(
            "<iq type='set' id='mamq'><query xmlns='{MAM}' queryid='q'><set xmlns='http://jabber.org/protocol/rsm'><max>100</max></set></query></iq>"
        ))
        .await;
        let mut bodies = Vec::new();
        loop {
            let el = self.recv().await;
            if el.name() == "iq" && el.attr("id") == Some("mamq") {
                assert_eq!(el.attr("type"), Some("result"), "{el}");
                return bodies;
            }
            if let Some(m) = el
                .get_child("result", MAM)
                .and_then(|r| r.get_child("forwarded", "urn:xmpp:forward:0"))
                .and_then(|f| f.get_child("message", ns::CLIENT))
            {
                bodies.push(
                    m.get_child("body", ns::CLIENT)
                        .map(|b| b.text())
                        .unwrap_or_default(),
                );
            }
        }
    }

    /// (jid, unread, last body) of each conversation of this account's
    /// inbox (XEP-0430), after draining what was queued.
    pub async fn inbox_entries(&mut self) -> Vec<(String, u32, String)> {
        const INBOX: &str = "urn:xmpp:inbox:1";
        self.drain().await;
        self.send(&format!(
            "<iq type='get' id='ibx'><inbox xmlns='{INBOX}'/></iq>"
        ))
        .await;
        let mut out = Vec::new();
        loop {
            let el = self.recv().await;
            if el.name() == "iq" && el.attr("id") == Some("ibx") {
                assert_eq!(el.attr("type"), Some("result"), "{el}");
                return out;
            }
            if let Some(e) = el.get_child("entry", INBOX) {
                let body = el
                    .get_child("result", "urn:xmpp:mam:2")
                    .and_then(|r| r.get_child("forwarded", "urn:xmpp:forward:0"))
                    .and_then(|f| f.get_child("message", ns::CLIENT))
                    .and_then(|m| m.get_child("body", ns::CLIENT))
                    .map(|b| b.text())
                    .unwrap_or_default();
                out.push((
                    e.attr("jid").unwrap_or("").to_owned(),
                    e.attr("unread").and_then(|u| u.parse().ok()).unwrap_or(0),
                    body,
                ));
            }
        }
    }

    /// A round trip to this client's own server (an XEP-0199 ping to its
    /// domain) that returns every element that arrived before the answer.
    ///
    /// Why it is a barrier: a session writes what was routed to it before
    /// it reads its client's next stanza (the session loop takes its
    /// mailbox first), and answers a ping to the server in order. So once
    /// the answer is here, everything that had been routed to this session
    /// by the time the server read the ping has arrived. A stanza another
    /// session sent is routed while that session handles it, so to wait for
    /// it, call `barrier()` on the sender first (its answer proves its
    /// stanzas were routed), then on the recipient. A service with a queue
    /// of its own (a room, a write-behind queue) needs a round trip
    /// through it: [`barrier_via`](Self::barrier_via).
    pub async fn barrier(&mut self) -> Vec<Element> {
        let to = self.domain.clone();
        self.barrier_via(&to).await
    }

    /// [`barrier`](Self::barrier) through `to`: an XEP-0199 ping to that
    /// JID (a room, a component, the server), which answers it after
    /// whatever it was handling; an error answer counts as an answer too
    /// (a room that does not support ping says so in order). Returns every
    /// element that arrived before the answer.
    pub async fn barrier_via(&mut self, to: &str) -> Vec<Element> {
        let id = format!("barrier-{}", starling_proto::random_id(8));
        self.send(&format!(
            "<iq type='get' id='{id}' to='{to}'><ping xmlns='urn:xmpp:ping'/></iq>"
        ))
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

    /// Asserts that nothing arrived for this client up to a
    /// [`barrier`](Self::barrier): call it after whatever would have
    /// caused the stanza that must not come (and, for a stanza another
    /// client would cause, after that client's own barrier).
    pub async fn expect_nothing(&mut self) {
        let got = self.barrier().await;
        assert!(
            got.is_empty(),
            "expected nothing before the barrier, got: {}",
            got.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    /// [`expect_nothing`](Self::expect_nothing) through `to`
    /// ([`barrier_via`](Self::barrier_via)).
    pub async fn expect_nothing_via(&mut self, to: &str) {
        let got = self.barrier_via(to).await;
        assert!(
            got.is_empty(),
            "expected nothing before the barrier through {to}, got: {}",
            got.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    /// Discards whatever arrives until the connection has been quiet for
    /// 200 ms. Prefer [`barrier`](Self::barrier), which says what it waits
    /// for and does not wait for a timer.
    pub async fn drain(&mut self) {
        while self
            .next_event_within(Duration::from_millis(200))
            .await
            .is_some()
        {}
    }

    /// Closes the stream politely and waits for the server's close.
    pub async fn close(mut self) {
        if self.is_websocket() {
            self.send("<close xmlns='urn:ietf:params:xml:ns:xmpp-framing'/>")
                .await;
        } else {
            self.send("</stream:stream>").await;
        }
        let _ = self.next_event_within(Duration::from_secs(2)).await;
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago (for tests that
/// start the real binary with a configuration file).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral loopback port")
        .port()
}

/// Writes `dir/starling.toml` for the real binary: data under `dir/data`,
/// STARTTLS and direct-TLS listeners on the given loopback ports. When tests
/// run on PostgreSQL ([`test_pg_admin_url`]), storage is a database of its
/// own named after `dir/data` (dropped by a later run once `dir` is gone).
pub fn write_binary_config(dir: &std::path::Path, starttls_port: u16, tls_port: u16) -> PathBuf {
    write_binary_config_with_admin(dir, starttls_port, tls_port, 0)
}

/// Like [`write_binary_config`], with the admin listener on
/// `127.0.0.1:admin_port` (0: an ephemeral port).
pub fn write_binary_config_with_admin(
    dir: &std::path::Path,
    starttls_port: u16,
    tls_port: u16,
    admin_port: u16,
) -> PathBuf {
    let cfg = dir.join("starling.toml");
    let data = dir.join("data");
    let mut text = format!(
        "[server]\ndata_dir = {data:?}\n\n[[listen]]\naddress = \"127.0.0.1:{starttls_port}\"\ntls = \"starttls\"\n\n[[listen]]\naddress = \"127.0.0.1:{tls_port}\"\ntls = \"direct\"\n\n[[http.listen]]\naddress = \"127.0.0.1:0\"\n\n[admin]\nlisten = [\"127.0.0.1:{admin_port}\"]\n",
    );
    if let Some(admin) = test_pg_admin_url() {
        // Callers may be inside a runtime or not: set up on a thread of its own.
        let url = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(TestDatabase::for_data_dir(&admin, &data))
                .url
        })
        .join()
        .expect("create the test database");
        text.push_str(&format!(
            "\n[storage]\nbackend = \"postgres\"\nurl = {url:?}\n"
        ));
    }
    std::fs::write(&cfg, text).expect("write the test configuration");
    cfg
}

/// The defined condition of a stanza error element.
pub fn error_condition(stanza: &Element) -> Option<String> {
    stanza
        .get_child("error", ns::CLIENT)?
        .children()
        .find(|c| c.ns() == ns::STANZAS && c.name() != "text")
        .map(|c| c.name().to_owned())
}

/// A TCP connection to `addr` from the local address `from` (port chosen
/// by the system).
pub async fn tcp_connect_from(addr: SocketAddr, from: IpAddr) -> TcpStream {
    let socket = if from.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .expect("socket");
    socket
        .bind(SocketAddr::new(from, 0))
        .expect("bind the local address");
    socket.connect(addr).await.expect("connect")
}

/// POSTs `body` to the BOSH endpoint (`/http-bind`, XEP-0124/0206) of the
/// HTTP listener at `addr`, one request per connection, and parses the
/// `<body/>` it answers (panics unless it is a 200 within 30 s).
pub async fn bosh_post(addr: SocketAddr, body: &str) -> Element {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        format!(
            "POST /http-bind HTTP/1.1\r\nHost: {addr}\r\nContent-Type: text/xml; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), tcp.read_to_end(&mut raw))
        .await
        .expect("answered in time")
        .unwrap();
    let text = String::from_utf8(raw).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let xml = text.split_once("\r\n\r\n").unwrap().1;
    let mut p = StreamParser::for_elements(Limits::default());
    let mut input = xml.as_bytes();
    match p.push(&mut input) {
        Ok(Some(StreamEvent::Stanza(el))) => el,
        other => panic!("not a body: {other:?} in {xml}"),
    }
}

/// Upgrades a plain TCP connection to the RFC 7395 endpoint of the HTTP
/// listener at `addr` (`xmpp` subprotocol) by hand, for tests that write
/// frames a WebSocket library would not (floods that never read,
/// unfinished fragments). `buffers` sets the socket's kernel send and
/// receive buffers first (small ones make a stalled peer visible sooner).
/// Returns the socket after the `101` response; the stream is not opened.
pub async fn raw_websocket(addr: SocketAddr, buffers: Option<u32>) -> TcpStream {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .expect("socket");
    if let Some(n) = buffers {
        socket.set_send_buffer_size(n).expect("SO_SNDBUF");
        socket.set_recv_buffer_size(n).expect("SO_RCVBUF");
    }
    let mut tcp = socket.connect(addr).await.expect("connect");
    tcp.write_all(
        format!(
            "GET /xmpp-websocket HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: xmpp\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(TIMEOUT, tcp.read(&mut b))
            .await
            .expect("upgrade answered in time")
            .expect("read");
        assert_eq!(n, 1, "connection closed during the upgrade: {head:?}");
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    // RFC 6455 §1.3's example key and its answer.
    assert!(
        head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        "Sec-WebSocket-Accept: {head}"
    );
    tcp
}

/// The header of a masked client frame (RFC 6455 §5.2) announcing `len`
/// payload bytes, with a zero masking key so the payload can be written
/// as is (and in as many pieces as wanted).
pub fn ws_frame_header(fin: bool, opcode: u8, len: u64) -> Vec<u8> {
    let mut h = vec![if fin { 0x80 } else { 0 } | (opcode & 0x0f)];
    match len {
        0..=125 => h.push(0x80 | len as u8),
        126..=0xffff => {
            h.push(0x80 | 126);
            h.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            h.push(0x80 | 127);
            h.extend_from_slice(&len.to_be_bytes());
        }
    }
    h.extend_from_slice(&[0, 0, 0, 0]);
    h
}

/// A whole masked client frame carrying `payload`.
pub fn ws_frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = ws_frame_header(fin, opcode, payload.len() as u64);
    f.extend_from_slice(payload);
    f
}

/// One HTTP/1.1 request (`Connection: close`) to `addr` with an optional
/// bearer token and JSON body, as the admin API's tests send them:
/// status, content type, body (de-chunked).
pub async fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String, String) {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = body.unwrap_or("");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    tcp.write_all(req.as_bytes()).await.unwrap();
    tcp.write_all(body.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let _ = tcp.read_to_end(&mut raw).await;
    let (status, headers, body) = parse_http_response(&raw);
    let content_type = headers
        .into_iter()
        .find(|(k, _)| k == "content-type")
        .map(|(_, v)| v)
        .unwrap_or_default();
    (status, content_type, body)
}

/// A whole HTTP/1.1 response as read until the server closed: status,
/// headers (names lower-cased, values trimmed), body (de-chunked).
pub fn parse_http_response(raw: &[u8]) -> (u16, Vec<(String, String)>, String) {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let status: u16 = head[9..12].parse().unwrap();
    let headers: Vec<(String, String)> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        let mut out = String::new();
        let mut r = rest;
        loop {
            let (size, after) = r.split_once("\r\n").unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            if size == 0 {
                break;
            }
            out.push_str(&after[..size]);
            r = &after[size + 2..];
        }
        out
    } else {
        rest.to_owned()
    };
    (status, headers, body)
}
