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

use super::connection::{Closing, Inbound, IoEnd, ReadGovernor, ReadLimits};
use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::SinkExt;
use starling_proto::{ns, StreamError, StreamErrorCondition};
use starling_xml::{Element, Limits, Prepared, StreamEvent, StreamHeader, StreamParser};
use std::time::Duration;

/// An RFC 7395 WebSocket connection.
pub struct WsConn {
    ws: WebSocket,
    pub(crate) parser: StreamParser,
    /// Read-rate limit and parser hibernation, as on TCP.
    pub(crate) governor: ReadGovernor,
    limits: Limits,
    /// The message being parsed, and how far.
    pending: Vec<u8>,
    pos: usize,
    /// A frame that is not a text message arrived.
    bad_frame: Option<&'static str>,
    /// Messages queued since the last flush.
    out: Vec<String>,
    secure: bool,
    header_sent: bool,
}

impl WsConn {
    /// A connection over an upgraded WebSocket; `secure` if it came over
    /// TLS (`wss:`).
    pub(crate) fn new(
        ws: WebSocket,
        limits: Limits,
        read_limits: ReadLimits,
        secure: bool,
    ) -> WsConn {
        WsConn {
            ws,
            parser: StreamParser::for_elements(limits),
            governor: ReadGovernor::new(read_limits),
            limits,
            pending: Vec::new(),
            pos: 0,
            bad_frame: None,
            out: Vec::new(),
            secure,
            header_sent: false,
        }
    }

    pub(crate) fn is_secure(&self) -> bool {
        self.secure
    }

    /// Waits for the next message. Cancel-safe: a message is stored as
    /// soon as `recv` yields it.
    pub(crate) async fn read(&mut self) -> Result<(), IoEnd> {
        loop {
            match self.ws.recv().await {
                None => return Err(IoEnd::Eof),
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "WebSocket read failed");
                    return Err(IoEnd::ReadError);
                }
                Some(Ok(Message::Text(t))) => {
                    self.governor.throttle(t.len());
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
                    self.bad_frame =
                        Some("XMPP over WebSocket uses text messages only (RFC 7395 §3.2)");
                    return Ok(());
                }
                // Pongs are sent by the WebSocket layer; nothing to parse.
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                Some(Ok(Message::Close(_))) => return Err(IoEnd::Eof),
            }
        }
    }

    pub(crate) fn next_event(&mut self) -> Result<Option<Inbound>, StreamError> {
        if let Some(why) = self.bad_frame.take() {
            return Err(StreamError::with_text(StreamErrorCondition::BadFormat, why));
        }
        if self.pos == 0 && self.pending.len() > self.limits.max_stanza_bytes {
            return Err(StreamError::with_text(
                StreamErrorCondition::PolicyViolation,
                format!(
                    "a message of {} bytes is over this server's limit of {}",
                    self.pending.len(),
                    self.limits.max_stanza_bytes
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
                code: 1000,
                reason: "".into(),
            };
            let _ = self.ws.send(Message::Close(Some(frame))).await;
            // Wait for the client's close frame (RFC 6455 §5.5.1).
            while let Some(Ok(m)) = self.ws.recv().await {
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
