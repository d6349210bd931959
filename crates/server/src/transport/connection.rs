//! Connections: how a client's XML elements reach its session and back.
//!
//! A connection knows framing, not XMPP semantics: it turns input into
//! [`Inbound`] events (the stream was opened, a top-level element, the
//! stream was closed) and writes the session's elements, stream headers,
//! features and errors in its own framing. The session task
//! (`session.rs`) does RFC 6120 negotiation and stanza handling once, for
//! every kind of connection, and never writes framing strings itself.
//!
//! Kinds:
//!
//! * [`XmlStream`] — an RFC 6120 XML stream over TCP, with STARTTLS or
//!   direct TLS (XEP-0368): one long-lived XML document per direction,
//!   restarted after STARTTLS and SASL.
//! * [`WsConn`] — RFC 7395 over WebSocket (`websocket.rs`): one element
//!   per message, `<open/>`/`<close/>` framing, no STARTTLS.
//! * [`BoshConn`] — XEP-0124/0206 BOSH (`bosh.rs`): payloads arrive in
//!   HTTP requests in rid order, output waits for the next held request.
//!
//! Every method is cancel-safe where the session's `select!` loop needs it
//! ([`Connection::read`]): whatever was read is kept in the connection, so a
//! read that loses the race to a mailbox message loses no bytes.

use super::bosh::BoshConn;
pub(crate) use super::framing::{Closing, Inbound, IoEnd, ReadGovernor, ReadLimits};
use super::tcp::Transport;
use super::websocket::WsConn;
use crate::tls::TlsContext;
use starling_proto::sasl::ChannelBindings;
use starling_proto::{ns, Stanza, StreamError, StreamErrorCondition};
use starling_xml::{Element, Limits, StreamEvent, StreamParser};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// A client connection of any kind — or none, while a session is detached
/// (XEP-0198): then input never comes, output is discarded (stream
/// management keeps its own copy of what the client has not
/// acknowledged), and closing does nothing.
// Not boxed: almost every session holds a live connection, which would then
// cost one more allocation and pointer hop; `None` is the rare detached case.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Connection {
    /// An RFC 6120 XML stream over TCP or TLS.
    Stream(XmlStream),
    /// RFC 7395 XMPP over WebSocket (boxed: TCP sessions should not pay
    /// for its size).
    WebSocket(Box<WsConn>),
    /// XEP-0124/0206 BOSH: many HTTP requests.
    Bosh(Box<BoshConn>),
    /// No connection.
    None,
}

impl Connection {
    /// True unless this is [`Connection::None`].
    pub(crate) fn is_live(&self) -> bool {
        !matches!(self, Connection::None)
    }

    /// How a session on this connection counts in
    /// `starling_c2s_sessions_by_transport` (no connection: detached).
    pub(crate) fn metrics_transport(&self) -> starling_core::SessionTransport {
        use starling_core::SessionTransport as T;
        match self {
            Connection::None => T::Detached,
            Connection::Stream(s) if s.is_secure() => T::Tls,
            Connection::Stream(_) => T::Tcp,
            Connection::WebSocket(_) => T::WebSocket,
            Connection::Bosh(_) => T::Bosh,
        }
    }

    /// True once the bytes travel encrypted.
    pub(crate) fn is_secure(&self) -> bool {
        match self {
            Connection::None => false,
            Connection::Stream(s) => s.is_secure(),
            Connection::WebSocket(w) => w.is_secure(),
            Connection::Bosh(b) => b.is_secure(),
        }
    }

    /// False while reading is paused by the rate limit.
    pub(crate) fn can_read(&self) -> bool {
        match self {
            Connection::None => false,
            Connection::Stream(s) => s.governor.paused_until.is_none(),
            Connection::WebSocket(w) => w.governor.paused_until.is_none(),
            Connection::Bosh(_) => true,
        }
    }

    /// False while output waits for the client beyond what the connection
    /// holds (a BOSH client that is not polling): the session then leaves
    /// stanzas in its bounded mailbox, as a TCP session whose write is
    /// blocked does. TCP and WebSocket writes bound themselves (the flush
    /// waits, within `[c2s] write_timeout_secs`).
    pub(crate) fn can_take_output(&self) -> bool {
        match self {
            Connection::Bosh(b) => b.can_take_output(),
            _ => true,
        }
    }

    /// What to wait on until [`Connection::can_take_output`] again
    /// ([`super::bosh::BoshSession::output_drained`]); `None` for
    /// connections that never refuse output.
    pub(crate) fn drain_waiter(&self) -> Option<std::sync::Arc<super::bosh::BoshSession>> {
        match self {
            Connection::Bosh(b) => Some(b.session()),
            _ => None,
        }
    }

    /// The earliest instant at which [`Connection::on_deadline`] has
    /// something to do.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match self {
            Connection::None => None,
            Connection::Stream(s) => s.governor.deadline(),
            Connection::WebSocket(w) => w.governor.deadline(),
            Connection::Bosh(_) => None,
        }
    }

    /// Resumes paused reading and hibernates an idle parser when their
    /// time has come.
    pub(crate) fn on_deadline(&mut self, now: Instant) {
        match self {
            Connection::None | Connection::Bosh(_) => {}
            Connection::Stream(s) => s.governor.on_deadline(now, &mut s.parser),
            Connection::WebSocket(w) => w.governor.on_deadline(now, &mut w.parser),
        }
    }

    /// Waits for input and keeps it for [`Connection::next_event`].
    /// Cancel-safe.
    pub(crate) async fn read(&mut self) -> Result<(), IoEnd> {
        match self {
            Connection::None => std::future::pending().await,
            Connection::Stream(s) => s.read().await,
            Connection::WebSocket(w) => w.read().await,
            Connection::Bosh(b) => b.read().await,
        }
    }

    /// The next event of the input read so far, or `None` when it is all
    /// consumed. A framing or XML error is the stream error to close with.
    pub(crate) fn next_event(&mut self) -> Result<Option<Inbound>, StreamError> {
        match self {
            Connection::None => Ok(None),
            Connection::Stream(s) => s.next_event(),
            Connection::WebSocket(w) => w.next_event(),
            Connection::Bosh(b) => b.next_event(),
        }
    }

    /// Sends our stream header (once per stream).
    pub(crate) fn open_stream(&mut self, id: &str, from: &str) {
        match self {
            Connection::None => {}
            Connection::Stream(s) => s.open_stream(id, from),
            Connection::WebSocket(w) => w.open_stream(id, from),
            Connection::Bosh(b) => b.open_stream(id, from),
        }
    }

    /// Sends a stream header that the caller built, for the protocols
    /// served over a plain XML stream other than c2s (an external
    /// component's `jabber:component:accept`, XEP-0114 §3; later a
    /// server's `jabber:server`): once per stream, TCP/TLS streams only.
    /// Elements are written afterwards as on a client stream: those of
    /// `jabber:client` carry no `xmlns`, so they are read in the stream's
    /// own default namespace.
    pub(crate) fn open_stream_with(&mut self, header: &[u8]) {
        if let Connection::Stream(s) = self {
            if s.header_sent {
                return;
            }
            s.header_sent = true;
            s.wbuf.extend_from_slice(header);
        }
    }

    /// Sends the stream features (RFC 6120 §4.3.2).
    pub(crate) fn send_features(&mut self, features: &[Element]) {
        match self {
            Connection::None => {}
            Connection::Stream(s) => {
                s.wbuf.extend_from_slice(b"<stream:features>");
                for f in features {
                    f.write_to(&mut s.wbuf, ns::CLIENT);
                }
                s.wbuf.extend_from_slice(b"</stream:features>");
            }
            Connection::WebSocket(w) => w.send_features(features),
            Connection::Bosh(b) => b.send_features(features),
        }
    }

    /// Queues one element for the client (written at the next flush).
    pub(crate) fn send(&mut self, el: &Element) {
        match self {
            Connection::None => {}
            Connection::Stream(s) => el.write_to(&mut s.wbuf, ns::CLIENT),
            Connection::WebSocket(w) => w.send(el),
            Connection::Bosh(b) => b.send(el),
        }
    }

    /// Where the next element's bytes will start in the output buffer, for
    /// [`Connection::wire_since`] (XML streams only).
    pub(crate) fn wire_mark(&self) -> Option<usize> {
        match self {
            Connection::Stream(s) => Some(s.wbuf.len()),
            _ => None,
        }
    }

    /// The bytes queued since `mark`: the wire form of the element just
    /// sent, in the `jabber:client` default namespace (the stream's). `None`
    /// for transports that frame elements differently.
    pub(crate) fn wire_since(&self, mark: Option<usize>) -> Option<&[u8]> {
        match (self, mark) {
            (Connection::Stream(s), Some(m)) => s.wbuf.get(m..),
            _ => None,
        }
    }

    /// Queues a stanza already serialised in the `jabber:client` default
    /// namespace (a stream-management retransmission). WebSocket and BOSH
    /// carry standalone elements, which name their namespace.
    pub(crate) fn send_wire(&mut self, wire: &[u8]) {
        match self {
            Connection::None => {}
            Connection::Stream(s) => s.wbuf.extend_from_slice(wire),
            Connection::WebSocket(w) => w.send_bytes(with_client_ns(wire)),
            Connection::Bosh(b) => b.send_bytes(&with_client_ns(wire)),
        }
    }

    /// Queues one stanza for the client: its shared serialisation with
    /// this copy's `to` spliced in when it has one (a room's copies), else
    /// the element.
    pub(crate) fn send_stanza(&mut self, st: &Stanza) {
        let Some(wire) = st.prepared() else {
            return self.send(st.element());
        };
        let to = st.element().attr("to");
        match self {
            Connection::None => {}
            Connection::Stream(s) => wire.write_to(&mut s.wbuf, ns::CLIENT, to),
            Connection::WebSocket(w) => w.send_prepared(wire, to),
            Connection::Bosh(b) => b.send_prepared(wire, to),
        }
    }

    /// Starts a new stream on the same connection (RFC 6120 §4.3.3, after
    /// SASL success): input that follows the current element belongs to
    /// the new stream, and our next header opens it.
    pub(crate) fn restart(&mut self) {
        match self {
            Connection::None => {}
            Connection::Stream(s) => {
                s.parser = s.new_parser();
                s.header_sent = false;
            }
            Connection::WebSocket(w) => w.restart(),
            Connection::Bosh(_) => {}
        }
    }

    /// The client has authenticated: input is held to the full stanza
    /// limit from now on instead of `[c2s] max_preauth_stanza_bytes`.
    pub(crate) fn set_authenticated(&mut self) {
        match self {
            Connection::None => {}
            Connection::Stream(s) => s.parser.set_stanza_cap(usize::MAX),
            Connection::WebSocket(w) => w.set_authenticated(),
            Connection::Bosh(b) => b.set_authenticated(),
        }
    }

    /// True if this connection can be upgraded with STARTTLS now.
    pub(crate) fn can_starttls(&self) -> bool {
        match self {
            Connection::None | Connection::WebSocket(_) | Connection::Bosh(_) => false,
            Connection::Stream(s) => matches!(s.transport, Transport::Plain(_)),
        }
    }

    /// STARTTLS (RFC 6120 §5.4.3.3): sends `<proceed/>`, performs the
    /// handshake within `timeout`, drops whatever was received before it,
    /// and starts a new stream. Returns the channel bindings of the new
    /// TLS connection.
    pub(crate) async fn starttls(
        &mut self,
        tls: &TlsContext,
        timeout: Duration,
        write_timeout: Duration,
    ) -> Result<ChannelBindings, IoEnd> {
        match self {
            Connection::None | Connection::WebSocket(_) | Connection::Bosh(_) => Err(IoEnd::Tls),
            Connection::Stream(s) => s.starttls(tls, timeout, write_timeout).await,
        }
    }

    /// Refuses STARTTLS (§5.4.2.2): `<failure/>`, then the stream ends.
    pub(crate) async fn refuse_starttls(&mut self, write_timeout: Duration) {
        match self {
            Connection::None => {}
            Connection::WebSocket(w) => {
                w.send(&Element::new("failure", ns::TLS));
                w.close(Closing::Close, write_timeout).await;
            }
            Connection::Bosh(b) => {
                b.send(&Element::new("failure", ns::TLS));
                b.close(Closing::Close);
            }
            Connection::Stream(s) => {
                s.wbuf.extend_from_slice(
                    b"<failure xmlns='urn:ietf:params:xml:ns:xmpp-tls'/></stream:stream>",
                );
                let _ = s.flush(write_timeout).await;
            }
        }
    }

    /// The channel bindings of a TLS connection (empty on plain TCP).
    pub(crate) fn channel_bindings(&mut self, tls: &TlsContext) -> ChannelBindings {
        match self {
            // tls-server-end-point over wss would need the HTTP layer's TLS
            // stream; -PLUS is not offered there.
            Connection::None | Connection::WebSocket(_) | Connection::Bosh(_) => {
                ChannelBindings::default()
            }
            Connection::Stream(s) => match &mut s.transport {
                Transport::Tls(t) => tls.bindings(t),
                _ => ChannelBindings::default(),
            },
        }
    }

    /// Writes everything queued, within `timeout`.
    pub(crate) async fn flush(&mut self, timeout: Duration) -> Result<(), IoEnd> {
        match self {
            Connection::None => Ok(()),
            Connection::Stream(s) => s.flush(timeout).await,
            Connection::WebSocket(w) => w.flush(timeout).await,
            Connection::Bosh(b) => {
                b.flush();
                Ok(())
            }
        }
    }

    /// Ends the stream as `how` says (after what is already queued), within
    /// `timeout`, and closes the connection. The stream header must have
    /// been sent ([`Connection::open_stream`]) before an error.
    pub(crate) async fn close(&mut self, how: Closing<'_>, timeout: Duration) {
        match self {
            Connection::None => {}
            Connection::Stream(s) => s.close(how, timeout).await,
            Connection::WebSocket(w) => w.close(how, timeout).await,
            Connection::Bosh(b) => b.close(how),
        }
    }

    /// Drops whatever is queued for the client (the connection is gone).
    pub(crate) fn discard_output(&mut self) {
        match self {
            Connection::None => {}
            Connection::Stream(s) => s.wbuf = Vec::new(),
            Connection::WebSocket(w) => w.discard_output(),
            Connection::Bosh(b) => b.discard_output(),
        }
    }
}

/// An RFC 6120 XML stream over TCP or TLS.
pub(crate) struct XmlStream {
    transport: Transport,
    parser: StreamParser,
    limits: Limits,
    /// Input read but not yet parsed (empty, and unallocated, while idle).
    pending: Vec<u8>,
    /// How far `pending` has been parsed.
    pos: usize,
    /// Output queued since the last flush (handed to the write, so an
    /// idle connection holds no buffer).
    wbuf: Vec<u8>,
    /// Our header for the current stream has been sent.
    header_sent: bool,
    governor: ReadGovernor,
}

impl XmlStream {
    /// A new stream over `transport`.
    pub(crate) fn new(transport: Transport, limits: Limits, read_limits: ReadLimits) -> XmlStream {
        XmlStream {
            transport,
            parser: StreamParser::new(limits),
            limits,
            pending: Vec::new(),
            pos: 0,
            wbuf: Vec::new(),
            header_sent: false,
            governor: ReadGovernor::new(read_limits),
        }
    }

    /// Holds every element to `cap` bytes until
    /// [`Connection::set_authenticated`] (a client stream: what an
    /// unauthenticated connection can make the server buffer is small).
    pub(crate) fn with_preauth_cap(mut self, cap: usize) -> XmlStream {
        self.parser.set_stanza_cap(cap);
        self
    }

    /// A parser for a new stream on this connection, with the current
    /// parser's stanza limit (the pre-auth cap while it applies: the
    /// parser holds it, so the idle connection stores it once).
    fn new_parser(&self) -> StreamParser {
        let mut p = StreamParser::new(self.limits);
        p.set_stanza_cap(self.parser.stanza_cap());
        p
    }

    fn is_secure(&self) -> bool {
        matches!(self.transport, Transport::Tls(_))
    }

    async fn read(&mut self) -> Result<(), IoEnd> {
        // Cancel-safe: `read_chunk` hands over bytes only when it
        // completes, and they are stored before anything else can happen.
        match self.transport.read_chunk().await {
            Ok(data) if data.is_empty() => Err(IoEnd::Eof),
            Ok(data) => {
                self.governor.throttle(data.len());
                if self.pos >= self.pending.len() {
                    self.pending = data;
                    self.pos = 0;
                } else {
                    self.pending.extend_from_slice(&data);
                }
                Ok(())
            }
            Err(e) => {
                tracing::debug!(error = %e, "read failed");
                Err(IoEnd::ReadError)
            }
        }
    }

    fn next_event(&mut self) -> Result<Option<Inbound>, StreamError> {
        let mut input = &self.pending[self.pos.min(self.pending.len())..];
        let before = input.len();
        let result = self.parser.push(&mut input);
        self.pos += before - input.len();
        match result {
            Ok(Some(StreamEvent::Open(h))) => Ok(Some(Inbound::Open(h))),
            Ok(Some(StreamEvent::Stanza(el))) => Ok(Some(Inbound::Element(el))),
            Ok(Some(StreamEvent::Close)) => Ok(Some(Inbound::Close)),
            Ok(None) => {
                // All input consumed: release it, and let the parser
                // hibernate after the configured quiet time. (The parser's
                // final `Ok(None)` is also where it frees its scratch
                // buffers.)
                self.pending = Vec::new();
                self.pos = 0;
                self.governor.idle();
                Ok(None)
            }
            Err(e) => {
                let cond = StreamErrorCondition::from_str(e.stream_condition())
                    .unwrap_or(StreamErrorCondition::NotWellFormed);
                Err(StreamError::with_text(cond, e.to_string()))
            }
        }
    }

    fn open_stream(&mut self, id: &str, from: &str) {
        if self.header_sent {
            return;
        }
        self.header_sent = true;
        let header = format!(
            "<?xml version='1.0'?><stream:stream xmlns='jabber:client' \
             xmlns:stream='http://etherx.jabber.org/streams' id='{id}' from='{from}' \
             version='1.0' xml:lang='en'>"
        );
        self.wbuf.extend_from_slice(header.as_bytes());
    }

    async fn starttls(
        &mut self,
        tls: &TlsContext,
        timeout: Duration,
        write_timeout: Duration,
    ) -> Result<ChannelBindings, IoEnd> {
        self.wbuf
            .extend_from_slice(b"<proceed xmlns='urn:ietf:params:xml:ns:xmpp-tls'/>");
        self.flush(write_timeout).await?;
        let Transport::Plain(tcp) = std::mem::replace(&mut self.transport, Transport::Upgrading)
        else {
            return Err(IoEnd::Tls);
        };
        // RFC 6120 §5.4.3.3: nothing sent before the handshake may be read
        // as part of the secured stream.
        self.pending = Vec::new();
        self.pos = 0;
        match tokio::time::timeout(timeout, Box::pin(tls.starttls.accept(tcp))).await {
            Ok(Ok(mut stream)) => {
                let bindings = tls.bindings(&mut stream);
                self.transport = Transport::Tls(Box::new(stream));
                self.parser = self.new_parser();
                self.header_sent = false;
                Ok(bindings)
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "TLS handshake failed");
                Err(IoEnd::Tls)
            }
            Err(_) => Err(IoEnd::Tls),
        }
    }

    async fn flush(&mut self, timeout: Duration) -> Result<(), IoEnd> {
        if self.wbuf.is_empty() {
            return Ok(());
        }
        // Hand the buffer to the write; an idle connection keeps none.
        let buf = std::mem::take(&mut self.wbuf);
        let write = async {
            self.transport.write_all(&buf).await?;
            self.transport.flush().await
        };
        match tokio::time::timeout(timeout, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "write failed");
                Err(IoEnd::WriteError)
            }
            Err(_) => Err(IoEnd::WriteTimeout),
        }
    }

    async fn close(&mut self, how: Closing<'_>, timeout: Duration) {
        if let Closing::Error(e) = how {
            self.wbuf.extend_from_slice(b"<stream:error>");
            for child in e.to_element().children() {
                child.write_to(&mut self.wbuf, ns::CLIENT);
            }
            self.wbuf.extend_from_slice(b"</stream:error>");
        }
        self.wbuf.extend_from_slice(b"</stream:stream>");
        let buf = std::mem::take(&mut self.wbuf);
        let _ = tokio::time::timeout(timeout, async {
            self.transport.write_all(&buf).await?;
            self.transport.flush().await?;
            self.transport.shutdown().await
        })
        .await;
    }
}

/// `wire` (an element serialised in the `jabber:client` default namespace,
/// whose root therefore has no `xmlns`) with `xmlns='jabber:client'` on its
/// root, as a standalone element (RFC 7395 messages, BOSH bodies) needs.
fn with_client_ns(wire: &[u8]) -> Vec<u8> {
    let name_end = wire
        .iter()
        .position(|b| matches!(b, b' ' | b'/' | b'>' | b'\t' | b'\r' | b'\n'))
        .unwrap_or(wire.len());
    let mut out = Vec::with_capacity(wire.len() + 22);
    out.extend_from_slice(&wire[..name_end]);
    out.extend_from_slice(b" xmlns='jabber:client'");
    out.extend_from_slice(&wire[name_end..]);
    out
}

#[cfg(test)]
mod wire_tests {
    use super::with_client_ns;
    use starling_xml::Element;

    #[test]
    fn standalone_wire_names_the_client_namespace() {
        let mut el = Element::new("message", starling_proto::ns::CLIENT);
        el.set_attr("to", "a@b/c");
        el.append_child(
            Element::builder("body", starling_proto::ns::CLIENT)
                .text("hi")
                .build(),
        );
        let mut wire = Vec::new();
        el.write_to(&mut wire, starling_proto::ns::CLIENT);
        let standalone = String::from_utf8(with_client_ns(&wire)).unwrap();
        assert_eq!(standalone, el.to_string_in(""));
        let parsed: Element = standalone.parse().unwrap();
        assert_eq!(parsed.ns(), starling_proto::ns::CLIENT);
        assert_eq!(
            parsed
                .get_child("body", starling_proto::ns::CLIENT)
                .unwrap()
                .text(),
            "hi"
        );
        assert_eq!(
            String::from_utf8(with_client_ns(b"<iq/>")).unwrap(),
            "<iq xmlns='jabber:client'/>"
        );
    }
}
