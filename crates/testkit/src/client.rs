//! The scripted XMPP client: [`Client`] connects (TCP, direct TLS,
//! WebSocket), negotiates the stream, authenticates, sends and receives,
//! and waits on barriers.

use crate::tls::tls_connector;
use crate::{ns, DOMAIN, TIMEOUT};
use rustls::pki_types::ServerName;
use sha2::Digest;
use starling_proto::sasl::{ChannelBindingType, Mechanism, ScramClient};
use starling_xml::{Element, Limits, StreamEvent, StreamParser};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::WebSocketStream;

/// The `<user-agent id/>` (a UUID v4, XEP-0388 §2.4) that
/// [`Client::auth_sasl2`] and [`Client::auth_fast`] send: one client
/// installation, so FAST tokens and Bind 2 resources carry over.
pub const SASL2_USER_AGENT: &str = "d4565fa7-4d72-4749-b3d3-740edbf87770";

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
    /// [`device_tls`](crate::device_tls) keeps the server's session tickets between
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
