//! A lean XMPP client for load generation: one tokio task per connection,
//! small read buffers, no per-connection threads.
//!
//! [`establish`] runs the whole login (TCP, optional STARTTLS or direct TLS,
//! SASL PLAIN or SCRAM, resource binding, optional initial presence) and
//! classifies every failure by [`Cause`], so a connection storm can report
//! failures by cause instead of a single error count.

use anyhow::Context as _;
use base64::Engine as _;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use serde::{Deserialize, Serialize};
use starling_proto::sasl::{Mechanism, ScramClient};
use starling_xml::{Element, Limits, StreamEvent, StreamParser};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

const NS_STREAMS: &str = "http://etherx.jabber.org/streams";
const NS_TLS: &str = "urn:ietf:params:xml:ns:xmpp-tls";
const NS_SASL: &str = "urn:ietf:params:xml:ns:xmpp-sasl";
const NS_SASL2: &str = "urn:xmpp:sasl:2";
/// The `<user-agent id/>` sent with SASL2 (XEP-0388 §2.4: a UUID v4).
const USER_AGENT_ID: &str = "2b6b4c1e-4a5f-4d0e-9c43-8a1f0f6f7a10";
const NS_BIND: &str = "urn:ietf:params:xml:ns:xmpp-bind";
const NS_REGISTER: &str = "jabber:iq:register";
const NS_FRAMING: &str = "urn:ietf:params:xml:ns:xmpp-framing";

/// Size of the per-read scratch buffer. Kept small: a load generator holds
/// tens of thousands of connections.
pub const READ_CHUNK: usize = 2048;

/// How the connection is secured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// Plain TCP, no TLS at all (the server must allow SASL without TLS).
    Plain,
    /// Plain TCP upgraded with STARTTLS (RFC 6120 §5).
    Starttls,
    /// TLS from the first byte (XEP-0368).
    Direct,
}

/// How XML reaches the server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Carrier {
    /// An RFC 6120 XML stream over TCP (with `--tls`).
    #[default]
    Tcp,
    /// RFC 7395 XMPP over WebSocket at `/xmpp-websocket` (`--tls plain`:
    /// `ws:`, `--tls direct`: `wss:`).
    Websocket,
    /// XEP-0124/XEP-0206 BOSH at `/http-bind` (`--tls plain`: `http:`,
    /// `--tls direct`: `https:`), two keep-alive connections per session.
    Bosh,
}

/// The SASL mechanism to log in with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum Mech {
    /// `PLAIN`.
    #[value(name = "PLAIN")]
    #[serde(rename = "PLAIN")]
    Plain,
    /// `SCRAM-SHA-1`.
    #[value(name = "SCRAM-SHA-1")]
    #[serde(rename = "SCRAM-SHA-1")]
    ScramSha1,
    /// `SCRAM-SHA-256`.
    #[value(name = "SCRAM-SHA-256")]
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
}

impl Mech {
    fn mechanism(self) -> Mechanism {
        match self {
            Mech::Plain => Mechanism::Plain,
            Mech::ScramSha1 => Mechanism::ScramSha1,
            Mech::ScramSha256 => Mechanism::ScramSha256,
        }
    }
}

/// Why a session could not be established.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cause {
    /// TCP connect failed (refused, no ports left, too many open files…).
    Connect,
    /// TLS handshake failed.
    Tls,
    /// Stream negotiation failed (bad XML, stream error, missing features).
    Stream,
    /// SASL authentication was refused.
    Auth,
    /// Resource binding failed.
    Bind,
    /// Something took longer than the per-step timeout.
    Timeout,
    /// The server closed the connection during setup.
    Closed,
}

impl Cause {
    /// A short stable name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Cause::Connect => "connect",
            Cause::Tls => "tls",
            Cause::Stream => "stream",
            Cause::Auth => "auth",
            Cause::Bind => "bind",
            Cause::Timeout => "timeout",
            Cause::Closed => "closed",
        }
    }
}

/// A setup failure with its cause and a human detail.
#[derive(Debug)]
pub struct SetupError {
    /// The cause bucket.
    pub cause: Cause,
    /// What happened.
    pub detail: String,
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.cause.name(), self.detail)
    }
}

impl std::error::Error for SetupError {}

fn fail<T>(cause: Cause, detail: impl Into<String>) -> Result<T, SetupError> {
    Err(SetupError {
        cause,
        detail: detail.into(),
    })
}

/// Where and how to connect; shared by all connections.
#[derive(Clone)]
pub struct Target {
    /// Server address.
    pub addr: SocketAddr,
    /// XMPP domain (stream `to`, TLS SNI).
    pub domain: String,
    /// Transport security.
    pub tls: TlsMode,
    /// TCP stream or WebSocket.
    pub carrier: Carrier,
    /// SASL mechanism.
    pub mech: Mech,
    /// Local source addresses, used round-robin by connection index.
    pub sources: Vec<IpAddr>,
    /// More server ports (other nodes of a cluster): connection `i` goes
    /// to port `[addr's, extra_ports…][i % (1 + extra)]`.
    pub extra_ports: Vec<u16>,
    /// Timeout of each setup step.
    pub step_timeout: Duration,
    /// TLS client configuration (accepts any certificate).
    pub tls_connector: TlsConnector,
    /// BOSH: the `wait` asked for (seconds a request may be held).
    pub bosh_wait: u64,
    /// Enable XEP-0198 stream management (with resumption) after binding.
    pub sm: bool,
    /// Resume inline in SASL2 (XEP-0388) instead of after a SASL
    /// exchange and a stream restart.
    pub sasl2: bool,
    /// Log in over SASL2 asking for a FAST token (XEP-0484) and resume
    /// with it (HT-SHA-256-NONE) instead of SCRAM.
    pub fast: bool,
    /// After binding (and `<enable/>`), fetch what a client re-fetches at
    /// every fresh session before its initial presence (`resume
    /// --full-login`): see [`sync_after_bind`].
    pub full_login: bool,
}

/// Where one connection comes from and goes to.
#[derive(Clone, Copy, Debug)]
pub struct Via {
    /// The local source address (None: the kernel's choice).
    pub source: Option<IpAddr>,
    /// The server address.
    pub addr: SocketAddr,
}

impl Target {
    /// The source and server addresses of connection number `i`.
    pub fn source_for(&self, i: u64) -> Via {
        let source = if self.sources.is_empty() {
            None
        } else {
            Some(self.sources[(i % self.sources.len() as u64) as usize])
        };
        let k = 1 + self.extra_ports.len() as u64;
        let addr = match (i % k) as usize {
            0 => self.addr,
            j => SocketAddr::new(self.addr.ip(), self.extra_ports[j - 1]),
        };
        Via { source, addr }
    }
}

/// Accepts any server certificate: benchmarks run against self-signed certs.
#[derive(Debug)]
struct AcceptAny;

impl ServerCertVerifier for AcceptAny {
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

tokio::task_local! {
    /// The simulated device (user number) the current connection belongs
    /// to ([`as_device`]).
    static DEVICE: u64;
}

/// Runs `f` as user `n`'s device: like a real client, each device keeps
/// its own TLS session tickets and its SCRAM salted password between
/// connections, so its next connection resumes TLS (RFC 8446 §2.2) and
/// skips PBKDF2 (RFC 5802 §5.1). Outside `as_device` nothing is kept per
/// device.
pub async fn as_device<F: std::future::Future>(n: u64, f: F) -> F::Output {
    DEVICE.scope(n, f).await
}

fn device() -> Option<u64> {
    DEVICE.try_with(|d| *d).ok()
}

type DeviceMap<T> = std::sync::Mutex<std::collections::HashMap<u64, T>>;

/// FAST tokens kept per device (XEP-0484).
static TOKENS: std::sync::LazyLock<DeviceMap<String>> = std::sync::LazyLock::new(Default::default);

/// XEP-0484's namespace.
const NS_FAST: &str = "urn:xmpp:fast:0";

/// Salted passwords kept per device.
static SALTED: std::sync::LazyLock<DeviceMap<starling_proto::sasl::SaltedPassword>> =
    std::sync::LazyLock::new(Default::default);

/// TLS sessions kept per device ([`as_device`]); connections outside a
/// device share one small cache, as rustls does by default.
#[derive(Debug)]
struct PerDeviceSessions {
    devices: DeviceMap<Arc<rustls::client::ClientSessionMemoryCache>>,
    shared: Arc<rustls::client::ClientSessionMemoryCache>,
}

impl PerDeviceSessions {
    fn store(&self) -> Arc<rustls::client::ClientSessionMemoryCache> {
        match device() {
            Some(n) => self
                .devices
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(n)
                .or_insert_with(|| Arc::new(rustls::client::ClientSessionMemoryCache::new(1)))
                .clone(),
            None => self.shared.clone(),
        }
    }
}

impl rustls::client::ClientSessionStore for PerDeviceSessions {
    fn set_kx_hint(&self, name: ServerName<'static>, group: rustls::NamedGroup) {
        self.store().set_kx_hint(name, group)
    }
    fn kx_hint(&self, name: &ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.store().kx_hint(name)
    }
    fn set_tls12_session(
        &self,
        name: ServerName<'static>,
        value: rustls::client::Tls12ClientSessionValue,
    ) {
        self.store().set_tls12_session(name, value)
    }
    fn tls12_session(
        &self,
        name: &ServerName<'_>,
    ) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.store().tls12_session(name)
    }
    fn remove_tls12_session(&self, name: &ServerName<'static>) {
        self.store().remove_tls12_session(name)
    }
    fn insert_tls13_ticket(
        &self,
        name: ServerName<'static>,
        value: rustls::client::Tls13ClientSessionValue,
    ) {
        self.store().insert_tls13_ticket(name, value)
    }
    fn take_tls13_ticket(
        &self,
        name: &ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        self.store().take_tls13_ticket(name)
    }
}

/// A TLS connector with the ring provider that accepts self-signed
/// certificates and keeps TLS sessions per device ([`as_device`]).
pub fn tls_connector() -> anyhow::Result<TlsConnector> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny))
        .with_no_client_auth();
    cfg.resumption = rustls::client::Resumption::store(Arc::new(PerDeviceSessions {
        devices: Default::default(),
        shared: Arc::new(rustls::client::ClientSessionMemoryCache::new(256)),
    }));
    Ok(TlsConnector::from(Arc::new(cfg)))
}

/// Plain or TLS transport.
pub enum Transport {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP (boxed: the rustls state is large).
    Tls(Box<TlsStream<TcpStream>>),
    /// RFC 7395 over either of the above, as a byte stream: each write is
    /// one text message (the callers write whole elements), reads return
    /// the text of the messages received.
    Ws(Box<WsIo>),
    /// XEP-0124/0206 BOSH as a byte stream (see [`crate::bosh`]).
    Bosh(Box<crate::bosh::BoshIo>),
}

/// A WebSocket seen as a byte stream (see [`Transport::Ws`]). Writes are
/// made RFC 7395-conformant here, so the scenarios can write what they
/// write on TCP: each top-level element becomes its own text message
/// (§3.3.3; ejabberd refuses a message holding several), a stanza without
/// a namespace gets `xmlns='jabber:client'` (standalone elements have no
/// stream default namespace; Prosody refuses them), and
/// `</stream:stream>` becomes `<close/>` (§3.3.2).
pub struct WsIo {
    ws: tokio_tungstenite::WebSocketStream<Transport>,
    /// Received text not yet read.
    rest: Vec<u8>,
    /// Messages accepted by `poll_write` and not yet handed to the socket.
    out: std::collections::VecDeque<String>,
}

impl WsIo {
    fn new(ws: tokio_tungstenite::WebSocketStream<Transport>) -> WsIo {
        WsIo {
            ws,
            rest: Vec::new(),
            out: std::collections::VecDeque::new(),
        }
    }

    /// Hands queued messages to the WebSocket until it is full.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        use futures_util::Sink;
        use tokio_tungstenite::tungstenite::Message;
        while let Some(text) = self.out.pop_front() {
            match Pin::new(&mut self.ws).poll_ready(cx) {
                Poll::Pending => {
                    self.out.push_front(text);
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(io::Error::other(e))),
                Poll::Ready(Ok(())) => {}
            }
            if let Err(e) = Pin::new(&mut self.ws).start_send(Message::Text(text.into())) {
                return Poll::Ready(Err(io::Error::other(e)));
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// Splits XML written for a stream into RFC 7395 messages (see [`WsIo`]).
/// The input holds whole elements; text between them is dropped.
pub fn ws_messages(xml: &str) -> Vec<String> {
    let b = xml.as_bytes();
    let mut out = Vec::new();
    let (mut depth, mut start, mut i) = (0usize, None::<usize>, 0usize);
    // The end of the tag starting at `at` (the index of its '>'),
    // skipping quoted attribute values.
    let tag_end = |at: usize| -> Option<usize> {
        let mut quote = None;
        for (k, &c) in b.iter().enumerate().skip(at + 1) {
            match (quote, c) {
                (None, b'"' | b'\'') => quote = Some(c),
                (Some(q), _) if c == q => quote = None,
                (None, b'>') => return Some(k),
                _ => {}
            }
        }
        None
    };
    while i < b.len() {
        if b[i] != b'<' {
            i += 1;
            continue;
        }
        let Some(end) = tag_end(i) else { break };
        match b.get(i + 1) {
            Some(b'?' | b'!') => {}
            Some(b'/') => {
                if depth == 0 {
                    // The stream's own end tag.
                    out.push("<close xmlns='urn:ietf:params:xml:ns:xmpp-framing'/>".to_owned());
                } else {
                    depth -= 1;
                    if depth == 0 {
                        out.push(qualify(&xml[start.take().unwrap_or(i)..=end]));
                    }
                }
            }
            _ => {
                let self_closing = b[end - 1] == b'/';
                if depth == 0 {
                    start = Some(i);
                }
                if self_closing {
                    if depth == 0 {
                        out.push(qualify(&xml[i..=end]));
                        start = None;
                    }
                } else {
                    depth += 1;
                }
            }
        }
        i = end + 1;
    }
    out
}

/// Adds `xmlns='jabber:client'` to a stanza whose start tag has no
/// default namespace.
fn qualify(el: &str) -> String {
    let name_end = el[1..]
        .find(|c: char| c.is_whitespace() || c == '/' || c == '>')
        .map_or(el.len(), |k| k + 1);
    let name = &el[1..name_end];
    let tag_end = el.find('>').unwrap_or(el.len());
    let has_ns = el[..tag_end].contains("xmlns=");
    if has_ns || !matches!(name, "message" | "presence" | "iq") {
        return el.to_owned();
    }
    format!(
        "{} xmlns='jabber:client'{}",
        &el[..name_end],
        &el[name_end..]
    )
}

impl AsyncRead for WsIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        use futures_util::Stream;
        use tokio_tungstenite::tungstenite::Message;
        let this = self.get_mut();
        loop {
            if !this.rest.is_empty() {
                let n = this.rest.len().min(buf.remaining());
                buf.put_slice(&this.rest[..n]);
                this.rest.drain(..n);
                return Poll::Ready(Ok(()));
            }
            match Pin::new(&mut this.ws).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) | Poll::Ready(Some(Ok(Message::Close(_)))) => {
                    return Poll::Ready(Ok(()))
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(io::Error::other(e))),
                Poll::Ready(Some(Ok(Message::Text(t)))) => this.rest = t.as_bytes().to_vec(),
                Poll::Ready(Some(Ok(_))) => continue,
            }
        }
    }
}

impl AsyncWrite for WsIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // What was accepted before goes out first (back-pressure).
        match this.drain(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) => {}
        }
        this.out.extend(ws_messages(&String::from_utf8_lossy(buf)));
        match this.drain(cx) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            // Accepted: the rest is handed over by later writes or flush.
            _ => Poll::Ready(Ok(buf.len())),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        use futures_util::Sink;
        let this = self.get_mut();
        match this.drain(cx) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        Pin::new(&mut this.ws)
            .poll_flush(cx)
            .map_err(io::Error::other)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        use futures_util::Sink;
        let this = self.get_mut();
        match this.drain(cx) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        Pin::new(&mut this.ws)
            .poll_close(cx)
            .map_err(io::Error::other)
    }
}

impl AsyncRead for Transport {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Transport::Ws(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Transport::Bosh(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Transport::Ws(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Transport::Bosh(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_flush(cx),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Transport::Ws(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Transport::Bosh(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Transport::Ws(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Transport::Bosh(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// What the server sent.
#[derive(Debug)]
pub enum Event {
    /// A stream header.
    Header,
    /// A top-level element.
    Element(Element),
    /// `</stream:stream>` or EOF.
    Closed,
}

/// Incoming side of a stream: the parser and bytes not parsed yet.
pub struct Inbound {
    parser: StreamParser,
    pending: Vec<u8>,
}

/// One XMPP connection: transport plus [`Inbound`].
pub struct Conn {
    /// The transport.
    pub io: Transport,
    /// Parser state.
    pub inbound: Inbound,
    /// The XEP-0198 resumption id, once stream management is enabled with
    /// resumption.
    pub sm_id: Option<String>,
}

fn limits() -> Limits {
    Limits {
        max_stanza_bytes: 1024 * 1024,
        ..Limits::default()
    }
}

fn parser() -> StreamParser {
    StreamParser::new(limits())
}

impl Default for Inbound {
    fn default() -> Self {
        Inbound {
            parser: parser(),
            pending: Vec::new(),
        }
    }
}

impl Inbound {
    /// For RFC 7395: the parser is primed with a stream header of its own
    /// and then sees one element per message (`<open/>` included).
    fn websocket() -> Inbound {
        Inbound {
            parser: StreamParser::for_elements(limits()),
            pending: Vec::new(),
        }
    }
}

impl Inbound {
    /// Parses one event out of already-received bytes, if complete.
    pub fn parse_pending(&mut self) -> anyhow::Result<Option<Event>> {
        while !self.pending.is_empty() {
            let mut input: &[u8] = &self.pending;
            let before = input.len();
            let ev = self.parser.push(&mut input);
            let consumed = before - input.len();
            self.pending.drain(..consumed);
            match ev {
                Ok(Some(StreamEvent::Open(_))) => return Ok(Some(Event::Header)),
                Ok(Some(StreamEvent::Stanza(el))) => return Ok(Some(Event::Element(el))),
                Ok(Some(StreamEvent::Close)) => return Ok(Some(Event::Closed)),
                Ok(None) => {
                    if consumed == 0 {
                        break;
                    }
                }
                Err(e) => anyhow::bail!("bad XML from server: {e}"),
            }
        }
        if self.pending.is_empty() && self.pending.capacity() > READ_CHUNK {
            self.pending = Vec::new();
        }
        Ok(None)
    }

    /// Appends received bytes.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }
}

impl Conn {
    /// Reads the next event (no timeout).
    pub async fn next_event(&mut self) -> anyhow::Result<Event> {
        loop {
            if let Some(ev) = self.inbound.parse_pending()? {
                return Ok(ev);
            }
            let mut chunk = [0u8; READ_CHUNK];
            let n = self.io.read(&mut chunk).await?;
            if n == 0 {
                return Ok(Event::Closed);
            }
            self.inbound.feed(&chunk[..n]);
        }
    }

    /// Writes and flushes.
    pub async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.io.write_all(bytes).await?;
        self.io.flush().await
    }

    fn restart(&mut self) {
        self.inbound = if matches!(self.io, Transport::Ws(_) | Transport::Bosh(_)) {
            Inbound::websocket()
        } else {
            Inbound::default()
        };
    }
}

async fn step<T>(
    t: Duration,
    cause_on_err: Cause,
    f: impl std::future::Future<Output = anyhow::Result<T>>,
) -> Result<T, SetupError> {
    step_named(t, cause_on_err, "", f).await
}

async fn step_named<T>(
    t: Duration,
    cause_on_err: Cause,
    what: &str,
    f: impl std::future::Future<Output = anyhow::Result<T>>,
) -> Result<T, SetupError> {
    match tokio::time::timeout(t, f).await {
        Err(_) => fail(Cause::Timeout, format!("timed out {what}")),
        Ok(Err(e)) => fail(cause_on_err, format!("{e:#}")),
        Ok(Ok(v)) => Ok(v),
    }
}

/// Reads the next element, mapping a close to [`Cause::Closed`].
async fn expect_element(conn: &mut Conn, t: Duration, what: &str) -> Result<Element, SetupError> {
    loop {
        let label = format!("waiting for {what}");
        match step_named(t, Cause::Stream, &label, conn.next_event()).await? {
            Event::Header => continue,
            // RFC 7395 framing: <open/> is the header.
            Event::Element(el) if el.ns() == NS_FRAMING && el.name() == "open" => continue,
            Event::Element(el) if el.ns() == NS_FRAMING => {
                return fail(Cause::Closed, format!("closed before {what}"))
            }
            Event::Element(el) if el.is("error", NS_STREAMS) => {
                let cond: Vec<_> = el.children().map(|c| c.name().to_owned()).collect();
                return fail(
                    Cause::Stream,
                    format!("stream error while waiting for {what}: {}", cond.join(",")),
                );
            }
            Event::Element(el) => return Ok(el),
            Event::Closed => return fail(Cause::Closed, format!("closed before {what}")),
        }
    }
}

async fn open_stream(conn: &mut Conn, target: &Target) -> Result<Element, SetupError> {
    if let Transport::Bosh(b) = &conn.io {
        // Session creation, or the restart after SASL (XEP-0206 §5).
        b.open();
        return features(conn, target).await;
    }
    let header = if target.carrier == Carrier::Websocket {
        format!(
            "<open xmlns='{NS_FRAMING}' to='{}' version='1.0' xml:lang='en'/>",
            target.domain
        )
    } else {
        format!(
            "<?xml version='1.0'?><stream:stream to='{}' version='1.0' xml:lang='en' \
         xmlns='jabber:client' xmlns:stream='http://etherx.jabber.org/streams'>",
            target.domain
        )
    };
    step(target.step_timeout, Cause::Closed, async {
        Ok(conn.send(header.as_bytes()).await?)
    })
    .await?;
    features(conn, target).await
}

async fn features(conn: &mut Conn, target: &Target) -> Result<Element, SetupError> {
    let f = expect_element(conn, target.step_timeout, "stream features").await?;
    if !f.is("features", NS_STREAMS) {
        return fail(
            Cause::Stream,
            format!("expected features, got {}", f.name()),
        );
    }
    Ok(f)
}

async fn tcp_connect(target: &Target, source: Via) -> Result<TcpStream, SetupError> {
    let f = async {
        let sock = if source.addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        if let Some(ip) = source.source {
            sock.bind(SocketAddr::new(ip, 0))?;
        }
        let s = sock.connect(source.addr).await?;
        s.set_nodelay(true)?;
        Ok(s)
    };
    step_named(target.step_timeout, Cause::Connect, "in TCP connect", f).await
}

async fn tls_upgrade(target: &Target, tcp: TcpStream) -> Result<Transport, SetupError> {
    let name = ServerName::try_from(target.domain.clone()).map_err(|e| SetupError {
        cause: Cause::Tls,
        detail: format!("bad server name: {e}"),
    })?;
    let f = async { Ok(target.tls_connector.connect(name, tcp).await?) };
    let tls = step_named(target.step_timeout, Cause::Tls, "in TLS handshake", f).await?;
    Ok(Transport::Tls(Box::new(tls)))
}

/// A TCP connection, with TLS from the first byte for `--tls direct`.
pub async fn connect_transport(target: &Target, source: Via) -> Result<Transport, SetupError> {
    let tcp = tcp_connect(target, source).await?;
    if target.tls == TlsMode::Direct {
        tls_upgrade(target, tcp).await
    } else {
        Ok(Transport::Plain(tcp))
    }
}

/// Connects and negotiates up to (but not including) SASL; returns the
/// connection and the features offered for authentication.
pub async fn connect_stream(target: &Target, source: Via) -> Result<(Conn, Element), SetupError> {
    if target.carrier == Carrier::Bosh {
        if target.tls == TlsMode::Starttls {
            return fail(
                Cause::Tls,
                "BOSH has no STARTTLS: use --tls plain (http:) or --tls direct (https:)",
            );
        }
        let io = crate::bosh::BoshIo::connect(target, source).await?;
        let mut conn = Conn {
            io: Transport::Bosh(Box::new(io)),
            inbound: Inbound::websocket(),
            sm_id: None,
        };
        let features = open_stream(&mut conn, target).await?;
        return Ok((conn, features));
    }
    let io = connect_transport(target, source).await?;
    if target.carrier == Carrier::Websocket {
        if target.tls == TlsMode::Starttls {
            return fail(
                Cause::Tls,
                "WebSocket has no STARTTLS: use --tls plain (ws:) or --tls direct (wss:)",
            );
        }
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let scheme = if target.tls == TlsMode::Direct {
            "wss"
        } else {
            "ws"
        };
        let mut req = format!("{scheme}://{}/xmpp-websocket", target.addr)
            .into_client_request()
            .map_err(|e| SetupError {
                cause: Cause::Connect,
                detail: format!("WebSocket request: {e}"),
            })?;
        req.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            "xmpp".parse().expect("header value"),
        );
        let f = async { Ok(tokio_tungstenite::client_async(req, io).await?.0) };
        let ws = step_named(
            target.step_timeout,
            Cause::Connect,
            "in WebSocket upgrade",
            f,
        )
        .await?;
        let mut conn = Conn {
            io: Transport::Ws(Box::new(WsIo::new(ws))),
            inbound: Inbound::websocket(),
            sm_id: None,
        };
        let features = open_stream(&mut conn, target).await?;
        return Ok((conn, features));
    }
    let mut conn = Conn {
        io,
        inbound: Inbound::default(),
        sm_id: None,
    };
    let mut features = open_stream(&mut conn, target).await?;
    if target.tls == TlsMode::Starttls {
        if !features.has_child("starttls", NS_TLS) {
            return fail(Cause::Stream, "server does not offer STARTTLS");
        }
        step(target.step_timeout, Cause::Closed, async {
            Ok(conn
                .send(b"<starttls xmlns='urn:ietf:params:xml:ns:xmpp-tls'/>")
                .await?)
        })
        .await?;
        let p = expect_element(&mut conn, target.step_timeout, "<proceed/>").await?;
        if !p.is("proceed", NS_TLS) {
            return fail(Cause::Tls, format!("STARTTLS refused: {}", p.name()));
        }
        let Transport::Plain(tcp) = conn.io else {
            return fail(Cause::Tls, "STARTTLS on TLS");
        };
        conn.io = tls_upgrade(target, tcp).await?;
        conn.restart();
        features = open_stream(&mut conn, target).await?;
    }
    Ok((conn, features))
}

async fn send_step(conn: &mut Conn, t: Duration, s: String) -> Result<(), SetupError> {
    step(t, Cause::Closed, async {
        Ok(conn.send(s.as_bytes()).await?)
    })
    .await
}

async fn authenticate(
    conn: &mut Conn,
    target: &Target,
    user: &str,
    password: &str,
    sasl2: Option<&str>,
) -> Result<Option<Element>, SetupError> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let t = target.step_timeout;
    // XEP-0388: the same exchange in urn:xmpp:sasl:2, the initial response
    // in its own element, `inline` requests next to it, and the
    // server-final message as <additional-data/> of the <success/>.
    let ns = if sasl2.is_some() { NS_SASL2 } else { NS_SASL };
    let start = |mech: &str, data: &[u8]| {
        match sasl2 {
        Some(inline) => format!(
            "<authenticate xmlns='{NS_SASL2}' mechanism='{mech}'><initial-response>{}</initial-response><user-agent id='{}'/>{inline}</authenticate>",
            b64.encode(data),
            USER_AGENT_ID
        ),
        None => format!(
            "<auth xmlns='{NS_SASL}' mechanism='{mech}'>{}</auth>",
            b64.encode(data)
        ),
    }
    };
    let final_data = |el: &Element| -> Vec<u8> {
        let text = match sasl2 {
            Some(_) => el
                .get_child("additional-data", NS_SASL2)
                .map(|d| d.text())
                .unwrap_or_default(),
            None => el.text(),
        };
        b64.decode(text.trim()).unwrap_or_default()
    };
    let failure = |el: &Element| {
        let cond: Vec<_> = el.children().map(|c| c.name().to_owned()).collect();
        SetupError {
            cause: Cause::Auth,
            detail: format!("{} {}", el.name(), cond.join(",")),
        }
    };
    if target.mech == Mech::Plain {
        let msg = format!("\0{user}\0{password}");
        send_step(conn, t, start("PLAIN", msg.as_bytes())).await?;
        let reply = expect_element(conn, t, "SASL result").await?;
        if !reply.is("success", ns) {
            return Err(failure(&reply));
        }
        Ok(sasl2.map(|_| reply))
    } else {
        let mech = target.mech.mechanism();
        let dev = device();
        let kept = dev.and_then(|n| {
            SALTED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&n)
                .cloned()
        });
        let mut scram = ScramClient::new(mech, user, password, None)
            .map_err(|e| SetupError {
                cause: Cause::Auth,
                detail: format!("SCRAM client: {e}"),
            })?
            .with_salted_password(kept);
        let first = scram.client_first();
        send_step(conn, t, start(mech.name(), &first)).await?;
        let challenge = expect_element(conn, t, "SASL challenge").await?;
        if !challenge.is("challenge", ns) {
            return Err(failure(&challenge));
        }
        let server_first = b64
            .decode(challenge.text().trim())
            .map_err(|e| SetupError {
                cause: Cause::Auth,
                detail: format!("bad base64 in challenge: {e}"),
            })?;
        // PBKDF2 is CPU-heavy; keep it off the I/O threads' hot path.
        let (scram, fin) = tokio::task::spawn_blocking(move || {
            let fin = scram.client_final(&server_first);
            (scram, fin)
        })
        .await
        .map_err(|e| SetupError {
            cause: Cause::Auth,
            detail: format!("PBKDF2 task: {e}"),
        })?;
        let fin = fin.map_err(|e| SetupError {
            cause: Cause::Auth,
            detail: format!("SCRAM: {e}"),
        })?;
        send_step(
            conn,
            t,
            format!("<response xmlns='{ns}'>{}</response>", b64.encode(fin)),
        )
        .await?;
        let mut reply = expect_element(conn, t, "SASL result").await?;
        if sasl2.is_none() && reply.is("challenge", NS_SASL) {
            // Some servers send the server-final message as a challenge.
            let data = b64.decode(reply.text().trim()).unwrap_or_default();
            if scram.verify_server_final(&data).is_err() {
                return fail(Cause::Auth, "server signature does not verify");
            }
            send_step(conn, t, format!("<response xmlns='{NS_SASL}'/>")).await?;
            reply = expect_element(conn, t, "SASL result").await?;
            if !reply.is("success", NS_SASL) {
                return Err(failure(&reply));
            }
        } else if reply.is("success", ns) {
            let data = final_data(&reply);
            if scram.verify_server_final(&data).is_err() {
                return fail(Cause::Auth, "server signature does not verify");
            }
        } else {
            return Err(failure(&reply));
        }
        if let (Some(n), Some(salted)) = (dev, scram.salted_password()) {
            SALTED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(n, salted.clone());
        }
        Ok(sasl2.map(|_| reply))
    }
}

/// Connects, authenticates as `user` and restarts the stream (RFC 6120
/// §6.4.6); returns the connection with the post-authentication features.
async fn authenticated_stream(
    target: &Target,
    source: Via,
    user: &str,
    password: &str,
) -> Result<(Conn, Element), SetupError> {
    let (mut conn, features) = connect_stream(target, source).await?;
    if !features.has_child("mechanisms", NS_SASL) {
        return fail(Cause::Stream, "server offers no SASL mechanisms");
    }
    authenticate(&mut conn, target, user, password, None).await?;
    conn.restart();
    let features = open_stream(&mut conn, target).await?;
    Ok((conn, features))
}

/// Logs in as `user` and binds `resource`; sends `<presence/>` if asked.
/// Returns the established connection.
pub async fn establish(
    target: &Target,
    source: Via,
    user: &str,
    password: &str,
    resource: &str,
    presence: bool,
) -> Result<Conn, SetupError> {
    let (mut conn, features) = if target.fast {
        sasl2_with_token(target, source, user, password).await?
    } else {
        authenticated_stream(target, source, user, password).await?
    };
    if !features.has_child("bind", NS_BIND) {
        return fail(Cause::Bind, "server offers no resource binding");
    }
    let t = target.step_timeout;
    let bind = format!(
        "<iq type='set' id='b1'><bind xmlns='{NS_BIND}'><resource>{resource}</resource></bind></iq>"
    );
    step(t, Cause::Closed, async {
        Ok(conn.send(bind.as_bytes()).await?)
    })
    .await?;
    loop {
        let reply = expect_element(&mut conn, t, "bind result").await?;
        if reply.name() != "iq" || reply.attr("id") != Some("b1") {
            continue;
        }
        if reply.attr("type") != Some("result") {
            return fail(Cause::Bind, format!("bind refused: {reply}"));
        }
        break;
    }
    // Legacy session establishment (RFC 3921) when the server insists.
    if let Some(s) = features.get_child("session", "urn:ietf:params:xml:ns:xmpp-session") {
        if !s.has_child("optional", "urn:ietf:params:xml:ns:xmpp-session") {
            let iq = "<iq type='set' id='s1'><session xmlns='urn:ietf:params:xml:ns:xmpp-session'/></iq>";
            step(t, Cause::Closed, async {
                Ok(conn.send(iq.as_bytes()).await?)
            })
            .await?;
            loop {
                let reply = expect_element(&mut conn, t, "session result").await?;
                if reply.name() == "iq" && reply.attr("id") == Some("s1") {
                    break;
                }
            }
        }
    }
    if target.sm {
        enable_sm(&mut conn, t).await?;
    }
    if target.full_login {
        sync_after_bind(&mut conn, t).await?;
    }
    if presence {
        step(t, Cause::Closed, async {
            Ok(conn.send(b"<presence/>").await?)
        })
        .await?;
    }
    if let Transport::Bosh(b) = &conn.io {
        b.start_polling();
    }
    Ok(conn)
}

/// XEP-0198's namespace.
pub const NS_SM: &str = "urn:xmpp:sm:3";

/// What Conversations, Dino and Gajim ask for at every fresh session (one
/// that was not resumed) before the initial presence: the roster (RFC 6121
/// §2.2), message carbons (XEP-0280), the block list (XEP-0191) and the
/// server's features (XEP-0030). A resumption restores all of it, which is
/// what `resume --full-login` compares. Sent in one batch (real clients
/// pipeline them too); every answer must be a result.
async fn sync_after_bind(conn: &mut Conn, t: Duration) -> Result<(), SetupError> {
    const REQUESTS: &str = "<iq type='get' id='fl1'><query xmlns='jabber:iq:roster'/></iq>\
        <iq type='set' id='fl2'><enable xmlns='urn:xmpp:carbons:2'/></iq>\
        <iq type='get' id='fl3'><blocklist xmlns='urn:xmpp:blocking'/></iq>\
        <iq type='get' id='fl4'><query xmlns='http://jabber.org/protocol/disco#info'/></iq>";
    step(t, Cause::Closed, async {
        Ok(conn.send(REQUESTS.as_bytes()).await?)
    })
    .await?;
    let mut pending = 4;
    while pending > 0 {
        let reply =
            expect_element(conn, t, "roster, carbons, block list and disco results").await?;
        let Some(id) = reply.attr("id").filter(|i| i.starts_with("fl")) else {
            continue;
        };
        if reply.name() != "iq" || reply.attr("type") != Some("result") {
            return fail(
                Cause::Bind,
                format!("full login: request {id} refused: {reply}"),
            );
        }
        pending -= 1;
    }
    Ok(())
}

/// Enables stream management with resumption (XEP-0198 §3, §5) and keeps
/// the resumption id.
async fn enable_sm(conn: &mut Conn, t: Duration) -> Result<(), SetupError> {
    send_step(conn, t, format!("<enable xmlns='{NS_SM}' resume='true'/>")).await?;
    loop {
        let el = expect_element(conn, t, "<enabled/>").await?;
        if el.is("enabled", NS_SM) {
            conn.sm_id = el.attr("id").map(str::to_owned);
            if conn.sm_id.is_none() {
                return fail(Cause::Bind, "stream management enabled without resumption");
            }
            return Ok(());
        }
        if el.is("failed", NS_SM) {
            return fail(Cause::Bind, format!("stream management refused: {el}"));
        }
    }
}

/// Resumes a detached XEP-0198 session (§5): a new connection, SASL, then
/// `<resume previd h/>` instead of binding. Returns the connection and
/// the server's `h` from `<resumed/>`. Stanzas the server re-sends follow
/// on the connection.
pub async fn resume(
    target: &Target,
    source: Via,
    user: &str,
    password: &str,
    previd: &str,
    h: u32,
) -> Result<(Conn, u32), SetupError> {
    if target.sasl2 {
        return resume_inline(target, source, user, password, previd, h).await;
    }
    let (mut conn, features) = authenticated_stream(target, source, user, password).await?;
    if !features.has_child("sm", NS_SM) {
        return fail(Cause::Bind, "server offers no stream management");
    }
    let t = target.step_timeout;
    send_step(
        &mut conn,
        t,
        format!("<resume xmlns='{NS_SM}' previd='{previd}' h='{h}'/>"),
    )
    .await?;
    loop {
        let el = expect_element(&mut conn, t, "<resumed/>").await?;
        if el.is("resumed", NS_SM) {
            let server_h = el.attr("h").and_then(|h| h.parse().ok()).unwrap_or(0);
            conn.sm_id = Some(previd.to_owned());
            if let Transport::Bosh(b) = &conn.io {
                b.start_polling();
            }
            return Ok((conn, server_h));
        }
        if el.is("failed", NS_SM) {
            return fail(Cause::Bind, format!("resumption refused: {el}"));
        }
    }
}

/// SASL2 with SCRAM asking for a FAST token (kept for this device);
/// returns the connection and the features after the `<success/>`.
async fn sasl2_with_token(
    target: &Target,
    source: Via,
    user: &str,
    password: &str,
) -> Result<(Conn, Element), SetupError> {
    let (mut conn, features) = connect_stream(target, source).await?;
    let offered = features
        .get_child("authentication", NS_SASL2)
        .and_then(|a| a.get_child("inline", NS_SASL2))
        .and_then(|i| i.get_child("fast", NS_FAST))
        .is_some_and(|f| f.children().any(|m| m.text() == "HT-SHA-256-NONE"));
    if !offered {
        return fail(Cause::Stream, "server offers no FAST with HT-SHA-256-NONE");
    }
    let inline = format!("<request-token xmlns='{NS_FAST}' mechanism='HT-SHA-256-NONE'/>");
    let success = authenticate(&mut conn, target, user, password, Some(&inline))
        .await?
        .expect("SASL2 returns its <success/>");
    let Some(token) = success
        .get_child("token", NS_FAST)
        .and_then(|t| t.attr("token"))
    else {
        return fail(Cause::Auth, format!("no FAST token in {success}"));
    };
    if let Some(n) = device() {
        TOKENS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(n, token.to_owned());
    }
    let f = expect_element(&mut conn, target.step_timeout, "features after SASL2").await?;
    Ok((conn, f))
}

/// [`resume`] inline in SASL2 (XEP-0388, XEP-0198 "Inline Stream
/// Resumption"): `<resume/>` inside `<authenticate/>`, `<resumed/>` inside
/// `<success/>`, no stream restart and no separate round trip.
async fn resume_inline(
    target: &Target,
    source: Via,
    user: &str,
    password: &str,
    previd: &str,
    h: u32,
) -> Result<(Conn, u32), SetupError> {
    let (mut conn, features) = connect_stream(target, source).await?;
    let offered = features
        .get_child("authentication", NS_SASL2)
        .and_then(|a| a.get_child("inline", NS_SASL2))
        .is_some_and(|i| i.has_child("sm", NS_SM));
    if !offered {
        return fail(Cause::Stream, "server offers no inline resumption in SASL2");
    }
    let inline = format!("<resume xmlns='{NS_SM}' previd='{previd}' h='{h}'/>");
    let success = if target.fast {
        fast_authenticate(&mut conn, target, user, &inline).await?
    } else {
        authenticate(&mut conn, target, user, password, Some(&inline))
            .await?
            .expect("SASL2 returns its <success/>")
    };
    let Some(resumed) = success.get_child("resumed", NS_SM) else {
        return fail(Cause::Bind, format!("resumption refused: {success}"));
    };
    let server_h = resumed.attr("h").and_then(|h| h.parse().ok()).unwrap_or(0);
    // The features of the resumed stream follow (XEP-0388 "Success").
    let t = target.step_timeout;
    let f = expect_element(&mut conn, t, "features after SASL2").await?;
    if !f.is("features", NS_STREAMS) {
        return fail(Cause::Stream, format!("expected features, got {f}"));
    }
    conn.sm_id = Some(previd.to_owned());
    Ok((conn, server_h))
}

/// XEP-0484: one-step SASL2 authentication with this device's FAST token
/// (HT-SHA-256-NONE) and `inline` requests; keeps a rotated token.
async fn fast_authenticate(
    conn: &mut Conn,
    target: &Target,
    user: &str,
    inline: &str,
) -> Result<Element, SetupError> {
    use starling_proto::sasl::ht;
    let b64 = base64::engine::general_purpose::STANDARD;
    let t = target.step_timeout;
    let n = device();
    let Some(token) = n.and_then(|n| {
        TOKENS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&n)
            .cloned()
    }) else {
        return fail(
            Cause::Auth,
            "no FAST token for this user (its login did not get one)",
        );
    };
    let first = ht::initiator(user, token.as_bytes(), b"");
    send_step(
        conn,
        t,
        format!(
            "<authenticate xmlns='{NS_SASL2}' mechanism='HT-SHA-256-NONE'><initial-response>{}</initial-response><user-agent id='{USER_AGENT_ID}'/><fast xmlns='{NS_FAST}'/>{inline}</authenticate>",
            b64.encode(first)
        ),
    )
    .await?;
    let reply = expect_element(conn, t, "SASL2 result").await?;
    if !reply.is("success", NS_SASL2) {
        return fail(Cause::Auth, format!("FAST refused: {reply}"));
    }
    let data = reply
        .get_child("additional-data", NS_SASL2)
        .and_then(|d| b64.decode(d.text().trim()).ok())
        .unwrap_or_default();
    if data != ht::responder(token.as_bytes(), b"") {
        return fail(
            Cause::Auth,
            "the server's FAST responder message does not verify",
        );
    }
    if let (Some(n), Some(new)) = (
        n,
        reply
            .get_child("token", NS_FAST)
            .and_then(|t| t.attr("token")),
    ) {
        TOKENS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(n, new.to_owned());
    }
    Ok(reply)
}

/// Outcome of one in-band registration.
#[derive(Debug, PartialEq, Eq)]
pub enum Registered {
    /// The account was created.
    Created,
    /// It already existed (`<conflict/>`).
    Exists,
}

/// Escapes text for XML character data and single-quoted attributes.
pub(crate) fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\'', "&apos;")
}

/// Registers `user` with XEP-0077 in-band registration.
pub async fn register(
    target: &Target,
    source: Via,
    user: &str,
    password: &str,
) -> Result<Registered, SetupError> {
    let (mut conn, _features) = connect_stream(target, source).await?;
    let iq = format!(
        "<iq type='set' id='r1'><query xmlns='{NS_REGISTER}'><username>{}</username><password>{}</password></query></iq>",
        xml_escape(user),
        xml_escape(password)
    );
    let t = target.step_timeout;
    step(t, Cause::Closed, async {
        Ok(conn.send(iq.as_bytes()).await?)
    })
    .await?;
    let result = loop {
        let reply = expect_element(&mut conn, t, "registration result").await?;
        if reply.name() != "iq" || reply.attr("id") != Some("r1") {
            continue;
        }
        if reply.attr("type") == Some("result") {
            break Ok(Registered::Created);
        }
        let err = reply
            .children()
            .find(|c| c.name() == "error")
            .map(|e| {
                e.children()
                    .map(|c| c.name().to_owned())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        if err.iter().any(|c| c == "conflict") {
            break Ok(Registered::Exists);
        }
        break fail(
            Cause::Auth,
            format!("registration refused: {}", err.join(",")),
        );
    };
    let _ = conn.send(b"</stream:stream>").await;
    result
}

#[cfg(test)]
mod ws_tests {
    use super::ws_messages;

    /// RFC 7395 §3.3.3: one element per message, stanzas qualified;
    /// §3.3.2: the stream end is `<close/>`.
    #[test]
    fn writes_become_one_qualified_element_per_message() {
        let m = ws_messages(
            "<message to='a@b' type='chat'><body>x &gt; y, a/b</body></message>\
             <r xmlns='urn:xmpp:sm:3'/><presence/>\
             <iq xmlns='jabber:client' type='get' id='1'><ping xmlns='urn:xmpp:ping'/></iq>\
             <message to='c@d' id='q\"&apos;>'/></stream:stream>",
        );
        assert_eq!(
            m,
            [
                "<message xmlns='jabber:client' to='a@b' type='chat'><body>x &gt; y, a/b</body></message>",
                "<r xmlns='urn:xmpp:sm:3'/>",
                "<presence xmlns='jabber:client'/>",
                "<iq xmlns='jabber:client' type='get' id='1'><ping xmlns='urn:xmpp:ping'/></iq>",
                "<message xmlns='jabber:client' to='c@d' id='q\"&apos;>'/>",
                "<close xmlns='urn:ietf:params:xml:ns:xmpp-framing'/>",
            ]
        );
        let open =
            "<open xmlns='urn:ietf:params:xml:ns:xmpp-framing' to='localhost' version='1.0'/>";
        assert_eq!(ws_messages(open), [open]);
    }
}
