//! The incremental stream framer.

use rxml::error::EndOrError;
use rxml::{Event, Parse, RawEvent, WithOptions};

use crate::error::XmlError;
use crate::tree::{attrs_to_pairs, Element};
use crate::NS_STREAMS;

/// Upper bound for rxml's token length (names, attribute values, text chunks).
///
/// rxml reserves a scratch buffer of this size while a token is being read, and releases it
/// when the parser goes idle. Text longer than this is delivered in chunks (and merged), so it
/// only limits the length of a single name or attribute value.
const MAX_TOKEN: usize = 8192;

/// Resource limits applied by [`StreamParser`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Maximum size in bytes of one top-level child of the stream (a stanza, including any
    /// whitespace inside it). Default 256 KiB.
    pub max_stanza_bytes: usize,
    /// Maximum element nesting depth inside a stanza (the stanza element itself is depth 1).
    /// Default 64.
    pub max_depth: usize,
    /// Maximum number of attributes on a single element (namespace declarations excluded).
    /// Default 64.
    pub max_attributes: usize,
    /// Maximum size in bytes of the stream header, including an XML declaration and
    /// whitespace before it. Default 4096.
    pub max_header_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_stanza_bytes: 256 * 1024,
            max_depth: 64,
            max_attributes: 64,
            max_header_bytes: 4096,
        }
    }
}

/// The stream header: the opening `<stream:stream>` tag (RFC 6120 §4.7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamHeader {
    /// Local name of the root element (`"stream"`).
    pub name: String,
    /// Namespace of the root element ([`NS_STREAMS`]).
    pub ns: String,
    /// The unprefixed default namespace declared on the header (`xmlns='jabber:client'`),
    /// needed for the content-namespace check of RFC 6120 §4.8.2. `None` if not declared.
    pub default_ns: Option<String>,
    /// Attributes (`to`, `from`, `version`, `id`, `xml:lang`, ...), using the same naming
    /// convention as [`Element`]. Prefixed namespace declarations other than the one for the
    /// `stream` prefix are included as `("xmlns:prefix", uri)`, e.g. `xmlns:db` for server
    /// dialback (XEP-0220).
    pub attrs: Vec<(String, String)>,
}

impl StreamHeader {
    /// Value of header attribute `name`.
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One event of an XMPP stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamEvent {
    /// The stream header was received.
    Open(StreamHeader),
    /// A complete top-level child of the stream (stanza, `<stream:features/>`, SASL/TLS
    /// negotiation elements, `<stream:error/>`, ...).
    Stanza(Element),
    /// `</stream:stream>` was received. Any further input is discarded.
    Close,
}

#[derive(Debug)]
enum State {
    /// Waiting for the stream header. `bom` counts matched bytes of a UTF-8 byte order mark.
    Start { bom: u8 },
    /// Inside the stream.
    Open,
    /// `</stream:stream>` seen.
    Closed,
    /// An error occurred; it is returned again on every call.
    Failed(Box<XmlError>),
}

/// Incremental, sans-IO parser for one XMPP stream (create a new one for each stream
/// restart after STARTTLS or SASL, RFC 6120 §4.3.3).
pub struct StreamParser {
    /// Boxed: rxml's parser is ~500 bytes; keeping it out of line keeps `StreamParser`
    /// cheap to move (it lives inside connection futures).
    /// `None` while hibernating (see [`StreamParser::hibernate`]).
    parser: Option<Box<rxml::Parser>>,
    state: State,
    /// Open elements of the stanza being built (empty between stanzas).
    stack: Vec<Element>,
    /// Raw header bytes, kept until the header is complete to recover namespace
    /// declarations (rxml's resolved events do not report them).
    header_buf: Vec<u8>,
    /// The raw stream header (XML declaration and opening tag), kept once
    /// the stream is open so a hibernated parser can be re-primed with the
    /// stream's namespace context.
    header_raw: Box<[u8]>,
    /// Bytes of the current unit (header or stanza) attributed to events so far.
    acc: usize,
    /// Bytes consumed by rxml but not yet attributed to an event.
    unattributed: usize,
    limits: Limits,
    /// The stanza limit in force: `limits.max_stanza_bytes`, or less while
    /// [`StreamParser::set_stanza_cap`] says so (before authentication).
    stanza_cap: usize,
}

impl std::fmt::Debug for StreamParser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamParser")
            .field("state", &self.state)
            .field("depth", &self.stack.len())
            .field("pending_bytes", &self.pending_bytes())
            .finish_non_exhaustive()
    }
}

fn new_rxml(limits: &Limits) -> Box<rxml::Parser> {
    let mut p = rxml::Parser::with_options(rxml_options(token_limit(limits)));
    // Emit text as soon as it is available: keeps keepalive whitespace from being buffered
    // inside rxml and lets text count against the stanza limit immediately.
    p.set_text_buffering(false);
    Box::new(p)
}

fn rxml_options(max_token_length: usize) -> rxml::Options {
    rxml::Options {
        max_token_length,
        ..rxml::Options::default()
    }
}

fn token_limit(limits: &Limits) -> usize {
    limits.max_stanza_bytes.clamp(64, MAX_TOKEN)
}

fn is_xml_whitespace(s: &str) -> bool {
    s.bytes().all(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
}

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

impl StreamParser {
    /// Create a parser for a new stream, enforcing `limits`.
    pub fn new(limits: Limits) -> Self {
        StreamParser {
            parser: Some(new_rxml(&limits)),
            state: State::Start { bom: 0 },
            stack: Vec::new(),
            header_buf: Vec::new(),
            header_raw: Box::default(),
            acc: 0,
            unattributed: 0,
            stanza_cap: limits.max_stanza_bytes,
            limits,
        }
    }

    /// Lowers the stanza limit to `cap` bytes (or raises it back, never
    /// past `limits.max_stanza_bytes`): a server holds unauthenticated
    /// input to a much smaller limit than stanzas after login. Takes
    /// effect for the stanza being read; the XML token limit stays that of
    /// `limits`, so raising the cap again needs no new parser.
    pub fn set_stanza_cap(&mut self, cap: usize) {
        self.stanza_cap = cap.min(self.limits.max_stanza_bytes);
    }

    /// The stanza limit in force ([`StreamParser::set_stanza_cap`]).
    pub fn stanza_cap(&self) -> usize {
        self.stanza_cap
    }

    /// Create a parser for standalone top-level elements, as XMPP over WebSocket (RFC 7395)
    /// and BOSH (XEP-0124) carry them: it is primed with a stream header of its own
    /// (default namespace `jabber:client`), so every element pushed afterwards comes out as
    /// [`StreamEvent::Stanza`], with the same `limits`.
    pub fn for_elements(limits: Limits) -> Self {
        let mut p = StreamParser::new(limits);
        let mut prime: &[u8] = b"<stream:stream xmlns='jabber:client' \
            xmlns:stream='http://etherx.jabber.org/streams'>";
        // Our own header: well-formed, within any limits; its Open event is dropped.
        let _ = p.push(&mut prime);
        p
    }

    /// Consume bytes from `input` (advancing the slice) until one event is complete and
    /// return it.
    ///
    /// Returns `Ok(None)` when `input` is exhausted without a complete event (call again with
    /// more data; partial tokens are kept internally, so the consumed bytes must not be fed
    /// again). Call repeatedly until `Ok(None)`: one chunk may contain several events.
    /// After an `Err`, the parser is poisoned and every further call returns the same error.
    /// After [`StreamEvent::Close`], further input is consumed and discarded.
    pub fn push(&mut self, input: &mut &[u8]) -> Result<Option<StreamEvent>, XmlError> {
        match self.push_inner(input) {
            Ok(v) => Ok(v),
            Err(e) => {
                self.stack = Vec::new();
                self.header_buf = Vec::new();
                self.parser = None;
                self.header_raw = Box::default();
                self.state = State::Failed(Box::new(e.clone()));
                Err(e)
            }
        }
    }

    fn push_inner(&mut self, input: &mut &[u8]) -> Result<Option<StreamEvent>, XmlError> {
        loop {
            let limit = match &mut self.state {
                State::Failed(e) => return Err((**e).clone()),
                State::Closed => {
                    *input = &input[input.len()..];
                    return Ok(None);
                }
                State::Start { bom } => {
                    // Skip a UTF-8 byte order mark (XML 1.0 §4.3.3 permits one).
                    while (*bom as usize) < BOM.len() {
                        match input.first() {
                            None => return Ok(None),
                            Some(&b) if b == BOM[*bom as usize] => {
                                *bom += 1;
                                *input = &input[1..];
                            }
                            Some(_) if *bom == 0 => {
                                *bom = BOM.len() as u8;
                            }
                            Some(_) => {
                                return Err(XmlError::UnsupportedEncoding(
                                    "truncated byte order mark".into(),
                                ))
                            }
                        }
                    }
                    self.limits.max_header_bytes
                }
                State::Open => self.stanza_cap,
            };

            // Hand rxml at most one byte more than the remaining budget, so the limit
            // check below fires before rxml can buffer more than that.
            let used = self.acc.saturating_add(self.unattributed);
            let budget = limit.saturating_sub(used).saturating_add(1);
            let take = input.len().min(budget);
            let mut chunk = &input[..take];
            if self.parser.is_none() {
                self.parser = Some(self.reprime()?);
            }
            let parser = self.parser.as_mut().expect("set just above");
            let res = parser.parse(&mut chunk, false);
            let consumed = take - chunk.len();
            if matches!(self.state, State::Start { .. }) {
                self.header_buf.extend_from_slice(&input[..consumed]);
            }
            *input = &input[consumed..];
            self.unattributed = self.unattributed.saturating_add(consumed);

            match res {
                Ok(Some(ev)) => {
                    let len = ev.metrics().len();
                    self.unattributed = self.unattributed.saturating_sub(len);
                    self.acc = self.acc.saturating_add(len);
                    self.check_limit(limit)?;
                    if let Some(out) = self.handle(ev)? {
                        return Ok(Some(out));
                    }
                }
                Ok(None) => {
                    // Only reported at end of file, which we never signal.
                    return Err(XmlError::NotWellFormed("unexpected end of document".into()));
                }
                Err(EndOrError::NeedMoreData) => {
                    self.check_limit(limit)?;
                    if input.is_empty() {
                        if self.is_idle() {
                            self.shrink();
                        }
                        return Ok(None);
                    }
                    if consumed == 0 {
                        // Defensive: rxml asked for more data without using what it got.
                        return Err(XmlError::NotWellFormed("parser made no progress".into()));
                    }
                }
                Err(EndOrError::Error(e)) => {
                    let prologue = match self.state {
                        State::Start { .. } => Some(&self.header_buf[..]),
                        _ => None,
                    };
                    return Err(XmlError::from_rxml(e, prologue, token_limit(&self.limits)));
                }
            }
        }
    }

    fn check_limit(&self, limit: usize) -> Result<(), XmlError> {
        if self.acc.saturating_add(self.unattributed) <= limit {
            return Ok(());
        }
        Err(match self.state {
            State::Start { .. } => XmlError::HeaderTooLarge { limit },
            _ => XmlError::StanzaTooLarge { limit },
        })
    }

    fn shrink(&mut self) {
        if let Some(p) = self.parser.as_mut() {
            p.release_temporaries();
        }
        self.stack = Vec::new();
    }

    fn handle(&mut self, ev: Event) -> Result<Option<StreamEvent>, XmlError> {
        match (&self.state, ev) {
            (State::Start { .. }, Event::XmlDeclaration(..)) => Ok(None),
            (State::Start { .. }, Event::StartElement(_, (ns, name), attrs)) => {
                if ns.as_str() != NS_STREAMS {
                    return Err(XmlError::InvalidNamespace {
                        name: name.as_str().into(),
                        ns: ns.as_str().into(),
                    });
                }
                if name.as_str() != "stream" {
                    return Err(XmlError::BadFormat(format!(
                        "stream root element must be <stream:stream>, got <{}>",
                        name.as_str()
                    )));
                }
                if attrs.len() > self.limits.max_attributes {
                    return Err(XmlError::TooManyAttributes {
                        limit: self.limits.max_attributes,
                    });
                }
                let mut attrs = attrs_to_pairs(attrs);
                let header_buf = std::mem::take(&mut self.header_buf);
                let default_ns = scan_namespace_decls(&header_buf, &self.limits, &mut attrs);
                // Bytes rxml consumed beyond the opening tag are not header.
                let end = header_buf.len().saturating_sub(self.unattributed);
                self.header_raw = header_buf[..end].into();
                self.state = State::Open;
                self.acc = 0;
                Ok(Some(StreamEvent::Open(StreamHeader {
                    name: name.as_str().into(),
                    ns: ns.as_str().into(),
                    default_ns,
                    attrs,
                })))
            }
            (State::Open, Event::StartElement(_, (ns, name), attrs)) => {
                if self.stack.len() >= self.limits.max_depth {
                    return Err(XmlError::TooDeep {
                        limit: self.limits.max_depth,
                    });
                }
                if attrs.len() > self.limits.max_attributes {
                    return Err(XmlError::TooManyAttributes {
                        limit: self.limits.max_attributes,
                    });
                }
                self.stack
                    .push(Element::from_parsed(name.as_str(), ns.as_str(), attrs));
                Ok(None)
            }
            (State::Open, Event::EndElement(_)) => match self.stack.pop() {
                None => {
                    self.state = State::Closed;
                    self.acc = 0;
                    self.unattributed = 0;
                    self.shrink();
                    Ok(Some(StreamEvent::Close))
                }
                Some(el) => match self.stack.last_mut() {
                    Some(parent) => {
                        parent.append_child(el);
                        Ok(None)
                    }
                    None => {
                        self.acc = 0;
                        Ok(Some(StreamEvent::Stanza(el)))
                    }
                },
            },
            (State::Open, Event::Text(_, text)) => match self.stack.last_mut() {
                Some(top) => {
                    top.append_text(text);
                    Ok(None)
                }
                None if is_xml_whitespace(&text) => {
                    // Whitespace keepalive between stanzas (RFC 6120 §4.6.1).
                    self.acc = 0;
                    Ok(None)
                }
                None => Err(XmlError::BadFormat("character data at stream level".into())),
            },
            (_, ev) => Err(XmlError::NotWellFormed(format!(
                "unexpected XML event {ev:?}"
            ))),
        }
    }

    /// Frees the underlying XML parser's state while the stream is idle
    /// between stanzas (about 1.7 KB per connection); the next
    /// [`StreamParser::push`] re-primes a fresh parser from the stored
    /// stream header (a few microseconds). Returns false, changing nothing,
    /// unless the stream is open and idle.
    pub fn hibernate(&mut self) -> bool {
        if !matches!(self.state, State::Open) || !self.is_idle() || self.header_raw.is_empty() {
            return false;
        }
        self.parser = None;
        self.stack = Vec::new();
        true
    }

    /// True while hibernating.
    pub fn is_hibernating(&self) -> bool {
        self.parser.is_none() && matches!(self.state, State::Open)
    }

    /// A fresh rxml parser positioned inside the stream root, with the
    /// header's namespace declarations in scope.
    fn reprime(&self) -> Result<Box<rxml::Parser>, XmlError> {
        let mut p = new_rxml(&self.limits);
        let mut input: &[u8] = &self.header_raw;
        loop {
            match p.parse(&mut input, false) {
                Ok(Some(Event::StartElement(..))) => return Ok(p),
                Ok(Some(_)) => {}
                Err(EndOrError::NeedMoreData) if !input.is_empty() => {}
                _ => {
                    return Err(XmlError::NotWellFormed(
                        "cannot resume the stream after hibernation".into(),
                    ))
                }
            }
        }
    }

    /// Bytes of the current partially received stanza (or stream header); 0 when idle
    /// between stanzas.
    pub fn pending_bytes(&self) -> usize {
        match self.state {
            State::Start { .. } | State::Open => self.acc.saturating_add(self.unattributed),
            State::Closed | State::Failed(_) => 0,
        }
    }

    /// True when between stanzas and no partial token is buffered (safe point to shrink
    /// buffers). Also true once the stream is closed or the parser has failed.
    pub fn is_idle(&self) -> bool {
        match self.state {
            State::Start { .. } | State::Open => {
                self.stack.is_empty() && self.acc == 0 && self.unattributed == 0
            }
            State::Closed | State::Failed(_) => true,
        }
    }
}

/// Re-read the raw header bytes with rxml's raw (non-resolving) parser to recover the
/// namespace declarations of the stream header, which the resolving parser consumes.
/// Returns the default namespace and appends prefixed declarations (except `stream`) to
/// `attrs` as `xmlns:prefix`.
fn scan_namespace_decls(
    buf: &[u8],
    limits: &Limits,
    attrs: &mut Vec<(String, String)>,
) -> Option<String> {
    let mut raw = rxml::RawParser::with_options(rxml_options(token_limit(limits)));
    let mut input = buf;
    let mut default_ns = None;
    // The bytes were already accepted by the resolving parser, so this cannot fail; stop
    // quietly on anything unexpected.
    while let Ok(Some(ev)) = raw.parse(&mut input, false) {
        match ev {
            RawEvent::Attribute(_, (None, local), value) if local.as_str() == "xmlns" => {
                default_ns = Some(value);
            }
            RawEvent::Attribute(_, (Some(prefix), local), value)
                if prefix.as_str() == "xmlns" && local.as_str() != "stream" =>
            {
                attrs.push((format!("xmlns:{}", local.as_str()), value));
            }
            RawEvent::ElementHeadClose(_) => break,
            _ => {}
        }
    }
    default_ns
}

/// Parse a standalone document into an element (used by `Element::from_str`).
pub(crate) fn parse_document(mut input: &[u8]) -> Result<Element, XmlError> {
    let limits = Limits::default();
    let mut parser = rxml::Parser::with_options(rxml_options(MAX_TOKEN));
    let mut stack: Vec<Element> = Vec::new();
    let mut root = None;
    loop {
        match parser.parse(&mut input, true) {
            Ok(Some(Event::XmlDeclaration(..))) => {}
            Ok(Some(Event::StartElement(_, (ns, name), attrs))) => {
                if stack.len() >= limits.max_depth {
                    return Err(XmlError::TooDeep {
                        limit: limits.max_depth,
                    });
                }
                if attrs.len() > limits.max_attributes {
                    return Err(XmlError::TooManyAttributes {
                        limit: limits.max_attributes,
                    });
                }
                stack.push(Element::from_parsed(name.as_str(), ns.as_str(), attrs));
            }
            Ok(Some(Event::EndElement(_))) => {
                let Some(el) = stack.pop() else {
                    return Err(XmlError::NotWellFormed("unbalanced end tag".into()));
                };
                match stack.last_mut() {
                    Some(parent) => {
                        parent.append_child(el);
                    }
                    None => root = Some(el),
                }
            }
            Ok(Some(Event::Text(_, text))) => {
                if let Some(top) = stack.last_mut() {
                    top.append_text(text);
                }
            }
            Ok(None) => {
                return root.ok_or_else(|| XmlError::NotWellFormed("no root element".into()))
            }
            Err(EndOrError::NeedMoreData) => {
                return Err(XmlError::NotWellFormed("truncated document".into()))
            }
            Err(EndOrError::Error(e)) => return Err(XmlError::from_rxml(e, None, MAX_TOKEN)),
        }
    }
}
