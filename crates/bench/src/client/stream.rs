//! The XML stream over a transport: parsing what the server sends, sending.

use super::transport::Transport;
use super::READ_CHUNK;
use starling_xml::{Element, Limits, StreamEvent, StreamParser};
use std::io;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
    pub(super) fn websocket() -> Inbound {
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

    pub(super) fn restart(&mut self) {
        self.inbound = if matches!(self.io, Transport::Ws(_) | Transport::Bosh(_)) {
            Inbound::websocket()
        } else {
            Inbound::default()
        };
    }
}
