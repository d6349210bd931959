//! RFC 7395: XMPP over WebSocket, as a [`Connection`](super::connection::Connection)
//! kind.
//!
//! Every WebSocket text message carries one complete XML element (§3.3.3):
//! `<open/>` and `<close/>` in the framing namespace (§3.3.2) instead of
//! the stream header and closing tag, stanzas and negotiation elements
//! each with their own namespace declarations. There is no STARTTLS (the
//! WebSocket is `wss:` or it is not encrypted, §3.2), and stream restarts
//! after SASL are a new `<open/>` (§3.3.2). Our output is one element per
//! message as well; stream errors are followed by `<close/>` (§3.6).
//!
//! Parsing reuses the stream parser and its limits
//! ([`StreamParser::for_elements`]), fed each message; a message must leave it between elements, so an element
//! split over two messages is `<not-well-formed/>`.
//!
//! Below tungstenite, [`WsIo`] sees every byte read from the socket before
//! tungstenite buffers it: it counts all of them (control frames, pings,
//! fragments, text) against `[c2s] max_bytes_per_second` and pauses
//! reading when over it, whatever the frame kind; it reads frame headers
//! and refuses a message (one frame or a fragmented one) that would grow
//! past the limit in force — `[c2s] max_preauth_stanza_bytes` before
//! authentication, twice `max_stanza_bytes` after — with
//! `<policy-violation/>` before its payload is buffered; and it ends a
//! connection whose writes (pongs included) have been blocked for
//! `[c2s] write_timeout_secs` while it keeps sending. tungstenite's write
//! buffer is bounded too (see [`server_stream`]), so a client that sends
//! pings and never reads cannot queue pongs without bound.

use super::framing::{Closing, Inbound, IoEnd, ReadGovernor, ReadLimits};
use futures_util::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use starling_proto::{ns, StreamError, StreamErrorCondition};
use starling_xml::{Element, Limits, Prepared, StreamEvent, StreamHeader, StreamParser};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// A server-side WebSocket over an upgraded HTTP connection.
pub(crate) type WsStream = WebSocketStream<WsIo<TokioIo<hyper::upgrade::Upgraded>>>;

/// The most tungstenite keeps of output the client has not taken:
/// four maximal stanzas, at least 1 MiB (it must hold the largest single
/// message we send, e.g. a full roster, plus what is still unsent). Past
/// it a pong is dropped (only the latest is kept) and a stanza fails the
/// write, which ends the session.
fn max_write_buffer(max_stanza_bytes: usize) -> usize {
    max_stanza_bytes.saturating_mul(4).max(1 << 20)
}

/// The WebSocket stream of an upgraded connection (the handshake is
/// done: see `http.rs`), with the byte-level guard [`WsIo`] under it.
/// `preauth_cap` is the message limit until [`WsConn::set_authenticated`].
pub(crate) async fn server_stream(
    upgraded: hyper::upgrade::Upgraded,
    read_limits: ReadLimits,
    preauth_cap: usize,
    max_stanza_bytes: usize,
    write_timeout: Duration,
) -> WsStream {
    let io = WsIo::new(
        TokioIo::new(upgraded),
        read_limits,
        preauth_cap.min(max_stanza_bytes),
        write_timeout,
    );
    // Small buffers: an idle session should not hold tungstenite's 128 KiB
    // defaults. After authentication messages up to twice the stanza limit
    // are read (and then refused with <policy-violation/>); larger ones are
    // refused by `WsIo` at their frame header.
    let config = WebSocketConfig::default()
        .read_buffer_size(1024)
        .write_buffer_size(0)
        .max_write_buffer_size(max_write_buffer(max_stanza_bytes))
        .max_message_size(Some(max_stanza_bytes.saturating_mul(2)))
        .max_frame_size(Some(max_stanza_bytes.saturating_mul(2)));
    WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await
}

/// The I/O under tungstenite: read-rate limit over every byte, message
/// size guard at the frame level, and write-stall detection.
pub(crate) struct WsIo<T> {
    inner: T,
    /// `[c2s] max_bytes_per_second` over every byte read.
    bucket: ReadGovernor,
    /// Reading is paused until this fires.
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    frames: FrameScan,
    /// The largest message (sum of its frames' payloads) accepted now.
    limit: u64,
    /// The size of a message refused for being over `limit`; reading has
    /// stopped.
    refused: Option<u64>,
    /// Since when a write has been waiting for the client to read.
    write_blocked_since: Option<Instant>,
    write_timeout: Duration,
    /// Reading stopped because writes were blocked for `write_timeout`.
    stalled: bool,
}

impl<T> WsIo<T> {
    fn new(inner: T, read_limits: ReadLimits, limit: usize, write_timeout: Duration) -> WsIo<T> {
        WsIo {
            inner,
            bucket: ReadGovernor::new(read_limits),
            sleep: None,
            frames: FrameScan::default(),
            limit: limit as u64,
            refused: None,
            write_blocked_since: None,
            write_timeout,
            stalled: false,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WsIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.refused.is_some() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a message over the size limit",
            )));
        }
        // A client that sends (pings) but never reads: its pongs cannot be
        // written; end it as a stuck write ends any session.
        if this
            .write_blocked_since
            .is_some_and(|t| t.elapsed() >= this.write_timeout)
        {
            this.stalled = true;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client does not read",
            )));
        }
        if let Some(sleep) = this.sleep.as_mut() {
            ready!(sleep.as_mut().poll(cx));
            this.sleep = None;
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let new = &buf.filled()[before..];
        if let Err(size) = this.frames.scan(new, this.limit) {
            this.refused = Some(size);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a message over the size limit",
            )));
        }
        this.bucket.throttle(new.len());
        if let Some(until) = this.bucket.paused_until.take() {
            this.sleep = Some(Box::pin(tokio::time::sleep_until(until.into())));
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WsIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Pending => {
                this.write_blocked_since.get_or_insert_with(Instant::now);
                Poll::Pending
            }
            done => {
                this.write_blocked_since = None;
                done
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Follows RFC 6455 frame headers through the bytes read (§5.2), to know
/// each data message's size before its payload arrives.
#[derive(Default)]
struct FrameScan {
    /// The header being read.
    head: [u8; 14],
    have: usize,
    /// Payload bytes of the current frame still to come.
    payload_left: u64,
    /// Payload bytes of the unfinished data message so far.
    message: u64,
}

impl FrameScan {
    /// Follows `data`; `Err(size)` when a data message would grow to
    /// `size` bytes, over `limit`.
    fn scan(&mut self, mut data: &[u8], limit: u64) -> Result<(), u64> {
        while !data.is_empty() {
            if self.payload_left > 0 {
                let n = self.payload_left.min(data.len() as u64);
                self.payload_left -= n;
                data = &data[n as usize..];
                continue;
            }
            self.head[self.have] = data[0];
            self.have += 1;
            data = &data[1..];
            if self.have < 2 {
                continue;
            }
            let len7 = self.head[1] & 0x7f;
            let ext = match len7 {
                126 => 2,
                127 => 8,
                _ => 0,
            };
            let mask = if self.head[1] & 0x80 != 0 { 4 } else { 0 };
            if self.have < 2 + ext + mask {
                continue;
            }
            let len = match ext {
                0 => u64::from(len7),
                2 => u64::from(u16::from_be_bytes([self.head[2], self.head[3]])),
                _ => u64::from_be_bytes(self.head[2..10].try_into().unwrap_or([0xff; 8])),
            };
            self.have = 0;
            let fin = self.head[0] & 0x80 != 0;
            let opcode = self.head[0] & 0x0f;
            // Control frames (opcode 8..15) are not part of a message;
            // tungstenite refuses those over 125 bytes.
            if opcode & 0x08 == 0 {
                let size = if opcode == 0 {
                    self.message.saturating_add(len)
                } else {
                    len
                };
                if size > limit {
                    return Err(size);
                }
                self.message = if fin { 0 } else { size };
            }
            self.payload_left = len;
        }
        Ok(())
    }
}

/// An RFC 7395 WebSocket connection.
pub struct WsConn {
    ws: WsStream,
    pub(crate) parser: StreamParser,
    /// Parser hibernation, as on TCP (the read rate is [`WsIo`]'s).
    pub(crate) governor: ReadGovernor,
    limits: Limits,
    /// The message limit until the client authenticates
    /// (`[c2s] max_preauth_stanza_bytes`); `None` afterwards.
    preauth_cap: Option<usize>,
    /// The message being parsed, and how far.
    pending: Vec<u8>,
    pos: usize,
    /// The stream error owed for a frame or message refused while reading.
    refused: Option<StreamError>,
    /// Messages queued since the last flush.
    out: Vec<String>,
    secure: bool,
    header_sent: bool,
}

impl WsConn {
    /// A connection over an upgraded WebSocket ([`server_stream`]);
    /// `secure` if it came over TLS (`wss:`).
    pub(crate) fn new(
        ws: WsStream,
        limits: Limits,
        read_limits: ReadLimits,
        preauth_cap: usize,
        secure: bool,
    ) -> WsConn {
        let preauth_cap = preauth_cap.min(limits.max_stanza_bytes);
        let mut parser = StreamParser::for_elements(limits);
        parser.set_stanza_cap(preauth_cap);
        WsConn {
            ws,
            parser,
            // `WsIo` limits the rate over every byte; this one only
            // hibernates the parser.
            governor: ReadGovernor::new(ReadLimits {
                bytes_per_second: 0,
                ..read_limits
            }),
            limits,
            preauth_cap: Some(preauth_cap),
            pending: Vec::new(),
            pos: 0,
            refused: None,
            out: Vec::new(),
            secure,
            header_sent: false,
        }
    }

    pub(crate) fn is_secure(&self) -> bool {
        self.secure
    }

    /// The largest message accepted now.
    fn message_limit(&self) -> usize {
        self.preauth_cap.unwrap_or(self.limits.max_stanza_bytes)
    }

    /// The client authenticated: messages up to the stanza limit from now
    /// on (up to twice that is read before it is refused).
    pub(crate) fn set_authenticated(&mut self) {
        self.preauth_cap = None;
        self.parser.set_stanza_cap(usize::MAX);
        self.ws.get_mut().limit = (self.limits.max_stanza_bytes as u64).saturating_mul(2);
    }

    /// Waits for the next message. Cancel-safe: a message is stored as
    /// soon as the stream yields it.
    pub(crate) async fn read(&mut self) -> Result<(), IoEnd> {
        loop {
            match self.ws.next().await {
                None => return Err(IoEnd::Eof),
                Some(Err(e)) => {
                    let io = self.ws.get_ref();
                    if let Some(size) = io.refused {
                        self.refused = Some(StreamError::with_text(
                            StreamErrorCondition::PolicyViolation,
                            format!(
                                "a message of {size} bytes is over this server's limit of {}{}",
                                self.message_limit(),
                                if self.preauth_cap.is_some() {
                                    " before authentication"
                                } else {
                                    ""
                                }
                            ),
                        ));
                        return Ok(());
                    }
                    if io.stalled {
                        return Err(IoEnd::WriteTimeout);
                    }
                    tracing::debug!(error = %e, "WebSocket read failed");
                    return Err(IoEnd::ReadError);
                }
                Some(Ok(Message::Text(t))) => {
                    if self.pos < self.pending.len() {
                        // Not reached: the session parses all input before
                        // it reads again. Keep both rather than lose one.
                        self.pending.extend_from_slice(t.as_bytes());
                    } else {
                        self.pending = t.as_bytes().to_vec();
                        self.pos = 0;
                    }
                    return Ok(());
                }
                Some(Ok(Message::Binary(_))) => {
                    self.refused = Some(StreamError::with_text(
                        StreamErrorCondition::BadFormat,
                        "XMPP over WebSocket uses text messages only (RFC 7395 §3.2)",
                    ));
                    return Ok(());
                }
                // Pongs are sent by the WebSocket layer; nothing to parse.
                // (Every byte was counted by `WsIo`, which also paused.)
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
                Some(Ok(Message::Close(_))) => return Err(IoEnd::Eof),
            }
        }
    }

    pub(crate) fn next_event(&mut self) -> Result<Option<Inbound>, StreamError> {
        if let Some(e) = self.refused.take() {
            return Err(e);
        }
        let limit = self.message_limit();
        if self.pos == 0 && self.pending.len() > limit {
            return Err(StreamError::with_text(
                StreamErrorCondition::PolicyViolation,
                format!(
                    "a message of {} bytes is over this server's limit of {limit}",
                    self.pending.len(),
                ),
            ));
        }
        let mut input = &self.pending[self.pos.min(self.pending.len())..];
        let before = input.len();
        let result = self.parser.push(&mut input);
        self.pos += before - input.len();
        match result {
            Ok(Some(StreamEvent::Stanza(el))) => Ok(Some(framing(el))),
            Ok(Some(StreamEvent::Open(_) | StreamEvent::Close)) => Err(StreamError::with_text(
                StreamErrorCondition::BadFormat,
                "send <open/> and <close/> (RFC 7395 §3.3.2), not stream tags",
            )),
            Ok(None) => {
                let whole = self.parser.pending_bytes() == 0;
                self.pending = Vec::new();
                self.pos = 0;
                self.governor.idle();
                if !whole {
                    return Err(StreamError::with_text(
                        StreamErrorCondition::NotWellFormed,
                        "each WebSocket message must hold complete elements (RFC 7395 §3.3.3)",
                    ));
                }
                Ok(None)
            }
            Err(e) => {
                let cond = StreamErrorCondition::from_str(e.stream_condition())
                    .unwrap_or(StreamErrorCondition::NotWellFormed);
                Err(StreamError::with_text(cond, e.to_string()))
            }
        }
    }

    pub(crate) fn open_stream(&mut self, id: &str, from: &str) {
        if self.header_sent {
            return;
        }
        self.header_sent = true;
        let open = Element::builder("open", ns::FRAMING)
            .attr("from", from)
            .attr("id", id)
            .attr("version", "1.0")
            .attr("xml:lang", "en")
            .build();
        self.out.push(open.to_string_in(""));
    }

    pub(crate) fn send_features(&mut self, features: &[Element]) {
        let mut buf = b"<stream:features xmlns:stream='http://etherx.jabber.org/streams'>".to_vec();
        for f in features {
            f.write_to(&mut buf, "");
        }
        buf.extend_from_slice(b"</stream:features>");
        self.out.push(into_string(buf));
    }

    pub(crate) fn send(&mut self, el: &Element) {
        self.out.push(el.to_string_in(""));
    }

    /// Queues one serialised standalone element (one message).
    pub(crate) fn send_bytes(&mut self, bytes: Vec<u8>) {
        self.out.push(into_string(bytes));
    }

    pub(crate) fn send_prepared(&mut self, wire: &Prepared, to: Option<&str>) {
        let mut buf = Vec::with_capacity(wire.len() + 64);
        wire.write_to(&mut buf, "", to);
        self.out.push(into_string(buf));
    }

    pub(crate) fn restart(&mut self) {
        self.parser = StreamParser::for_elements(self.limits);
        if let Some(cap) = self.preauth_cap {
            self.parser.set_stanza_cap(cap);
        }
        self.header_sent = false;
    }

    pub(crate) async fn flush(&mut self, timeout: Duration) -> Result<(), IoEnd> {
        if self.out.is_empty() {
            return Ok(());
        }
        let out = std::mem::take(&mut self.out);
        let write = async {
            for m in out {
                self.ws.feed(Message::Text(m.into())).await?;
            }
            self.ws.flush().await
        };
        match tokio::time::timeout(timeout, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "WebSocket write failed");
                Err(IoEnd::WriteError)
            }
            Err(_) => Err(IoEnd::WriteTimeout),
        }
    }

    pub(crate) async fn close(&mut self, how: Closing<'_>, timeout: Duration) {
        if let Closing::Error(e) = how {
            let mut buf =
                b"<stream:error xmlns:stream='http://etherx.jabber.org/streams'>".to_vec();
            for child in e.to_element().children() {
                child.write_to(&mut buf, "");
            }
            buf.extend_from_slice(b"</stream:error>");
            self.out.push(into_string(buf));
        }
        self.out
            .push(Element::new("close", ns::FRAMING).to_string_in(""));
        let _ = tokio::time::timeout(timeout, async {
            let _ = self.flush(timeout).await;
            let frame = CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            };
            let _ = self.ws.send(Message::Close(Some(frame))).await;
            // Wait for the client's close frame (RFC 6455 §5.5.1).
            while let Some(Ok(m)) = self.ws.next().await {
                if matches!(m, Message::Close(_)) {
                    break;
                }
            }
        })
        .await;
    }

    pub(crate) fn discard_output(&mut self) {
        self.out = Vec::new();
    }
}

/// `<open/>` and `<close/>` become the stream events; anything else is an
/// element.
fn framing(el: Element) -> Inbound {
    if el.ns() == ns::FRAMING {
        match el.name() {
            "open" => {
                return Inbound::Open(StreamHeader {
                    name: "open".into(),
                    ns: ns::FRAMING.into(),
                    // Stanzas are jabber:client; the session checks it.
                    default_ns: Some(ns::CLIENT.into()),
                    attrs: el
                        .attrs()
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .collect(),
                });
            }
            "close" => return Inbound::Close,
            _ => {}
        }
    }
    Inbound::Element(el)
}

fn into_string(buf: Vec<u8>) -> String {
    // Only UTF-8 input and ASCII markup are written.
    String::from_utf8(buf).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}
