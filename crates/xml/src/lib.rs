//! # starling-xml: sans-IO XMPP stream framing
//!
//! This crate turns the raw bytes of an XMPP stream (RFC 6120 §4) into a sequence of
//! [`StreamEvent`]s — the stream header, complete top-level stanzas (and other top-level
//! elements such as `<stream:features/>`), and the closing `</stream:stream>` — and serialises
//! [`Element`] trees back into bytes.
//!
//! ## Design
//!
//! * **Sans-IO.** [`StreamParser::push`] takes a byte slice, consumes as much as is needed to
//!   complete one event, advances the slice and returns the event. It never performs I/O and
//!   never blocks, so it can be driven from any runtime (TCP, TLS, WebSocket adapters, tests).
//! * **Restricted XML via rxml.** Tokenising, well-formedness and namespace resolution are done
//!   by [`rxml::Parser`], which only accepts the XML subset XMPP allows (RFC 6120 §11: no DTDs,
//!   no comments, no processing instructions, no custom entities, UTF-8 only). rxml's errors are
//!   mapped onto RFC 6120 §4.9.3 stream error conditions by [`XmlError::stream_condition`].
//! * **Bounded memory.** The number of bytes handed to rxml is capped so that a stanza (or the
//!   stream header) can never grow more than one byte past its limit before the parser fails
//!   with `policy-violation`. rxml's token-length limit bounds names and attribute values, and
//!   long text is delivered in chunks, so a huge text node is rejected as soon as the stanza
//!   limit is crossed instead of being buffered. Nesting depth and attribute count are checked
//!   as each start tag completes.
//! * **Small when idle.** Whenever `push` runs out of input while sitting between stanzas, the
//!   parser releases rxml's scratch buffers, so an idle connection only keeps the parser struct
//!   itself plus rxml's namespace context and a few bytes of bookkeeping.
//! * **Light owned tree.** [`Element`] is a plain owned tree (name, namespace, attributes, child
//!   nodes) that is cheap to build, inspect, mutate and re-serialise. Common element names,
//!   attribute names and namespaces are stored as `&'static str` to avoid allocations on the
//!   hot path. Attribute order is not significant for equality (as in XML).
//!
//! ## Attribute naming
//!
//! Unprefixed attributes are stored under their local name (`"to"`, `"type"`). Attributes in
//! the XML namespace are stored as `"xml:lang"`, `"xml:space"` etc. Attributes in any other
//! namespace are stored in Clark notation, `"{namespace-uri}local"`, and are given a generated
//! prefix (`ns0`, `ns1`, …) when serialised.
//!
//! ## Example
//!
//! ```
//! use starling_xml::{Limits, StreamEvent, StreamParser};
//!
//! let mut parser = StreamParser::new(Limits::default());
//! let mut input: &[u8] = b"<?xml version='1.0'?><stream:stream xmlns='jabber:client' \
//!     xmlns:stream='http://etherx.jabber.org/streams' to='example.com' version='1.0'>\
//!     <message to='a@example.com'><body>hi</body></message> </stream:stream>";
//!
//! let Some(StreamEvent::Open(header)) = parser.push(&mut input).unwrap() else { panic!() };
//! assert_eq!(header.attr("to"), Some("example.com"));
//! assert_eq!(header.default_ns.as_deref(), Some("jabber:client"));
//!
//! let Some(StreamEvent::Stanza(msg)) = parser.push(&mut input).unwrap() else { panic!() };
//! assert!(msg.is("message", "jabber:client"));
//! assert_eq!(msg.get_child("body", "jabber:client").unwrap().text(), "hi");
//! assert_eq!(msg.to_string_in("jabber:client"), "<message to='a@example.com'><body>hi</body></message>");
//!
//! assert!(matches!(parser.push(&mut input).unwrap(), Some(StreamEvent::Close)));
//! ```

#![deny(missing_docs)]

mod error;
mod stream;
mod tree;

pub use error::XmlError;
pub use stream::{Limits, StreamEvent, StreamHeader, StreamParser};
pub use tree::{Element, ElementBuilder, Node, Prepared};

/// Namespace of the `<stream:stream>` element and its `stream:`-prefixed children
/// (RFC 6120 §4.8.1).
pub const NS_STREAMS: &str = "http://etherx.jabber.org/streams";

/// The XML namespace, bound to the `xml` prefix by definition (used by `xml:lang`).
pub const NS_XML: &str = "http://www.w3.org/XML/1998/namespace";
