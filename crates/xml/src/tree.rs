//! Owned light element tree and its serialiser.

use std::borrow::Cow;
use std::fmt;

use crate::error::XmlError;
use crate::{NS_STREAMS, NS_XML};

/// Frequently used strings that are stored as `&'static str` instead of being allocated.
const INTERNED: &[&str] = &[
    // namespaces
    "jabber:client",
    "jabber:server",
    NS_STREAMS,
    "urn:ietf:params:xml:ns:xmpp-stanzas",
    "urn:ietf:params:xml:ns:xmpp-streams",
    "urn:ietf:params:xml:ns:xmpp-sasl",
    "urn:ietf:params:xml:ns:xmpp-tls",
    "urn:ietf:params:xml:ns:xmpp-bind",
    "urn:ietf:params:xml:ns:xmpp-session",
    "urn:xmpp:sm:3",
    "urn:xmpp:ping",
    "urn:xmpp:delay",
    "jabber:iq:roster",
    "http://jabber.org/protocol/disco#info",
    "http://jabber.org/protocol/disco#items",
    "http://jabber.org/protocol/caps",
    "http://jabber.org/protocol/chatstates",
    "",
    // element names
    "message",
    "presence",
    "iq",
    "body",
    "subject",
    "thread",
    "show",
    "status",
    "priority",
    "error",
    "query",
    "item",
    "text",
    "active",
    "composing",
    "request",
    "received",
    "delay",
    "c",
    "x",
    "r",
    "a",
    "features",
    // attribute names
    "to",
    "from",
    "id",
    "type",
    "xml:lang",
    "jid",
    "name",
    "node",
    "ver",
    "hash",
    "xmlns",
];

fn intern(s: &str) -> Cow<'static, str> {
    for known in INTERNED {
        if *known == s {
            return Cow::Borrowed(known);
        }
    }
    Cow::Owned(s.to_owned())
}

#[allow(clippy::ptr_arg)] // needs to tell borrowed from owned
fn cow_heap(s: &Cow<'static, str>) -> usize {
    match s {
        Cow::Borrowed(_) => 0,
        Cow::Owned(s) => s.capacity(),
    }
}

/// A child node of an [`Element`]: either a nested element or character data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    /// A child element.
    Element(Element),
    /// Character data (already unescaped).
    Text(String),
}

impl Node {
    /// The element, if this node is one.
    pub fn as_element(&self) -> Option<&Element> {
        match self {
            Node::Element(e) => Some(e),
            Node::Text(_) => None,
        }
    }

    /// The text, if this node is character data.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Node::Element(_) => None,
            Node::Text(t) => Some(t),
        }
    }
}

/// An owned XML element: local name, namespace, attributes and child nodes.
///
/// Attribute names follow the crate-level convention: plain local names for unprefixed
/// attributes, `"xml:lang"` (etc.) for the XML namespace and `"{uri}local"` otherwise.
/// Attribute names are unique within an element; their order is not significant and is
/// ignored by `==`.
#[derive(Clone, Debug)]
pub struct Element {
    name: Cow<'static, str>,
    ns: Cow<'static, str>,
    attrs: Vec<(Cow<'static, str>, String)>,
    nodes: Vec<Node>,
}

impl PartialEq for Element {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.ns == other.ns
            && self.attrs.len() == other.attrs.len()
            && self
                .attrs
                .iter()
                .all(|(k, v)| other.attr(k) == Some(v.as_str()))
            && self.nodes == other.nodes
    }
}

impl Eq for Element {}

impl Element {
    /// Create an empty element with local name `name` in namespace `ns`.
    pub fn new(name: &str, ns: &str) -> Element {
        Element {
            name: intern(name),
            ns: intern(ns),
            attrs: Vec::new(),
            nodes: Vec::new(),
        }
    }

    /// Start building an element with local name `name` in namespace `ns`.
    pub fn builder(name: &str, ns: &str) -> ElementBuilder {
        ElementBuilder {
            el: Element::new(name, ns),
        }
    }

    /// Build an element from parser output (attributes already unique).
    pub(crate) fn from_parsed(name: &str, ns: &str, attrs: rxml::AttrMap) -> Element {
        let mut out = Vec::with_capacity(attrs.len());
        for ((ans, aname), value) in attrs {
            out.push((attr_key(ans.as_str(), aname.as_str()), value));
        }
        Element {
            name: intern(name),
            ns: intern(ns),
            attrs: out,
            nodes: Vec::new(),
        }
    }

    /// Local name of the element.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Namespace URI of the element (empty string for no namespace).
    pub fn ns(&self) -> &str {
        &self.ns
    }

    /// True if the element has local name `name` and namespace `ns`.
    pub fn is(&self, name: &str, ns: &str) -> bool {
        self.name == name && self.ns == ns
    }

    /// Value of the attribute `name` (see the crate docs for the naming convention).
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Set attribute `name` to `value`, replacing any previous value.
    pub fn set_attr(&mut self, name: &str, value: impl Into<String>) {
        let value = value.into();
        if let Some(slot) = self.attrs.iter_mut().find(|(k, _)| k == name) {
            slot.1 = value;
        } else {
            self.attrs.push((intern(name), value));
        }
    }

    /// Remove attribute `name`, returning its value if it was present.
    pub fn remove_attr(&mut self, name: &str) -> Option<String> {
        let idx = self.attrs.iter().position(|(k, _)| k == name)?;
        Some(self.attrs.remove(idx).1)
    }

    /// Iterate over `(name, value)` pairs of all attributes.
    pub fn attrs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.attrs.iter().map(|(k, v)| (k.as_ref(), v.as_str()))
    }

    /// All child nodes (elements and text) in document order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Mutable access to the child nodes.
    ///
    /// Callers inserting text directly should avoid adjacent or empty text nodes, which do
    /// not survive a serialise/parse round trip as separate nodes.
    pub fn nodes_mut(&mut self) -> &mut Vec<Node> {
        &mut self.nodes
    }

    /// Iterate over the child elements (text nodes are skipped).
    pub fn children(&self) -> impl Iterator<Item = &Element> {
        self.nodes.iter().filter_map(Node::as_element)
    }

    /// First child element with the given local name and namespace.
    pub fn get_child(&self, name: &str, ns: &str) -> Option<&Element> {
        self.children().find(|c| c.is(name, ns))
    }

    /// Mutable reference to the first child element with the given local name and namespace.
    pub fn get_child_mut(&mut self, name: &str, ns: &str) -> Option<&mut Element> {
        self.nodes.iter_mut().find_map(|n| match n {
            Node::Element(e) if e.is(name, ns) => Some(e),
            _ => None,
        })
    }

    /// True if there is a child element with the given local name and namespace.
    pub fn has_child(&self, name: &str, ns: &str) -> bool {
        self.get_child(name, ns).is_some()
    }

    /// Append a child element and return a mutable reference to it.
    pub fn append_child(&mut self, child: Element) -> &mut Element {
        self.nodes.push(Node::Element(child));
        match self.nodes.last_mut() {
            Some(Node::Element(e)) => e,
            // The node pushed just above is an element.
            _ => unreachable!("last node is the element just pushed"),
        }
    }

    /// Append character data. Merges with a directly preceding text node; empty text is
    /// ignored.
    pub fn append_text(&mut self, text: impl Into<String>) {
        let text = text.into();
        if text.is_empty() {
            return;
        }
        if let Some(Node::Text(last)) = self.nodes.last_mut() {
            last.push_str(&text);
        } else {
            self.nodes.push(Node::Text(text));
        }
    }

    /// Remove all child elements with the given local name and namespace.
    pub fn remove_children(&mut self, name: &str, ns: &str) {
        self.nodes
            .retain(|n| !matches!(n, Node::Element(e) if e.is(name, ns)));
    }

    /// Concatenation of the direct text children.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            if let Node::Text(t) = n {
                out.push_str(t);
            }
        }
        out
    }

    /// Serialise into `out`.
    ///
    /// `parent_ns` is the default namespace in scope at the insertion point (for example
    /// `"jabber:client"` for a stanza written into a client stream); no `xmlns` attribute is
    /// emitted on an element whose namespace equals the one in scope. Attributes named
    /// `xmlns` or `xmlns:*` are never written (namespace declarations are generated from the
    /// element and attribute namespaces). Control characters that XML 1.0 cannot represent
    /// are replaced by U+FFFD.
    pub fn write_to(&self, out: &mut Vec<u8>, parent_ns: &str) {
        self.write_name(out, parent_ns);
        self.write_attrs(out, None);
        self.write_rest(out, parent_ns);
    }

    /// `<name` and, if the element's namespace is not the one in scope,
    /// its `xmlns` declaration.
    fn write_name(&self, out: &mut Vec<u8>, parent_ns: &str) {
        // The XML namespace cannot be declared as a default namespace; it is always bound
        // to the `xml` prefix, which leaves the default namespace in scope unchanged.
        let xml_prefixed = self.ns == NS_XML;
        out.push(b'<');
        if xml_prefixed {
            out.extend_from_slice(b"xml:");
        }
        out.extend_from_slice(self.name.as_bytes());
        if self.ns != parent_ns && !xml_prefixed {
            out.extend_from_slice(b" xmlns='");
            escape_into(out, &self.ns, true);
            out.push(b'\'');
        }
    }

    /// The attributes (each with a leading space), except `skip`, with the
    /// declarations of the prefixes they use.
    fn write_attrs(&self, out: &mut Vec<u8>, skip: Option<&str>) {
        let mut prefixes = 0usize;
        // (uri, prefix index) for namespaced attributes; allocated only when needed.
        let mut declared: Vec<(&str, usize)> = Vec::new();
        for (k, v) in &self.attrs {
            let k: &str = k;
            if k == "xmlns" || k.starts_with("xmlns:") || skip == Some(k) {
                continue;
            }
            out.push(b' ');
            match split_clark(k) {
                Some(("", local)) => out.extend_from_slice(local.as_bytes()),
                Some((uri, local)) if uri == NS_XML => {
                    out.extend_from_slice(b"xml:");
                    out.extend_from_slice(local.as_bytes());
                }
                Some((uri, local)) => {
                    let idx = match declared.iter().find(|(u, _)| *u == uri) {
                        Some((_, idx)) => *idx,
                        None => {
                            let idx = prefixes;
                            prefixes += 1;
                            declared.push((uri, idx));
                            out.extend_from_slice(format!("xmlns:ns{idx}='").as_bytes());
                            escape_into(out, uri, true);
                            out.extend_from_slice(b"' ");
                            idx
                        }
                    };
                    out.extend_from_slice(format!("ns{idx}:").as_bytes());
                    out.extend_from_slice(local.as_bytes());
                }
                None => out.extend_from_slice(k.as_bytes()),
            }
            out.extend_from_slice(b"='");
            escape_into(out, v, true);
            out.push(b'\'');
        }
    }

    /// What follows the attributes: `/>`, or `>`, the content and the end
    /// tag.
    fn write_rest(&self, out: &mut Vec<u8>, parent_ns: &str) {
        if self.nodes.is_empty() {
            out.extend_from_slice(b"/>");
            return;
        }
        let xml_prefixed = self.ns == NS_XML;
        let child_ns = if xml_prefixed { parent_ns } else { &self.ns };
        out.push(b'>');
        for n in &self.nodes {
            match n {
                Node::Element(e) => e.write_to(out, child_ns),
                Node::Text(t) => escape_into(out, t, false),
            }
        }
        out.extend_from_slice(b"</");
        if xml_prefixed {
            out.extend_from_slice(b"xml:");
        }
        out.extend_from_slice(self.name.as_bytes());
        out.push(b'>');
    }

    /// Serialises this element once for copies that differ only in
    /// attribute `splice` (a stanza's `to`): see [`Prepared`].
    pub fn prepare(&self, splice: &'static str) -> Prepared {
        // `<name`: the scope it is written into decides the `xmlns`.
        let mut name = Vec::new();
        self.write_name(&mut name, &self.ns);
        let mut attrs = Vec::new();
        self.write_attrs(&mut attrs, Some(splice));
        let mut rest = Vec::new();
        // The content sees the element's own namespace unless it is
        // `xml:`-prefixed (never a stanza); `prepare` is for stanzas.
        self.write_rest(&mut rest, &self.ns);
        Prepared {
            ns: self.ns.clone(),
            name,
            attrs,
            rest,
            splice,
        }
    }

    /// Serialise into a `String`; see [`Element::write_to`] for `parent_ns`.
    pub fn to_string_in(&self, parent_ns: &str) -> String {
        let mut out = Vec::new();
        self.write_to(&mut out, parent_ns);
        match String::from_utf8(out) {
            Ok(s) => s,
            // Cannot happen: only UTF-8 input and ASCII markup are written.
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    /// Approximate number of heap bytes owned by this element and its descendants
    /// (for metrics and memory limits).
    pub fn size_hint(&self) -> usize {
        let mut n = cow_heap(&self.name) + cow_heap(&self.ns);
        n += self.attrs.capacity() * std::mem::size_of::<(Cow<'static, str>, String)>();
        for (k, v) in &self.attrs {
            n += cow_heap(k) + v.capacity();
        }
        n += self.nodes.capacity() * std::mem::size_of::<Node>();
        for node in &self.nodes {
            n += match node {
                Node::Element(e) => e.size_hint(),
                Node::Text(t) => t.capacity(),
            };
        }
        n
    }
}

impl fmt::Display for Element {
    /// Serialises with no namespace in scope, so the root always carries `xmlns`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_string_in(""))
    }
}

impl std::str::FromStr for Element {
    type Err = XmlError;

    /// Parse a standalone XML document (one root element, optional XML declaration) into an
    /// element tree, with [`Limits::default`](crate::Limits) depth and attribute limits but no
    /// size limit. Useful for stanzas stored as strings (offline messages, archives).
    fn from_str(s: &str) -> Result<Element, XmlError> {
        crate::stream::parse_document(s.as_bytes())
    }
}

/// An element serialised once, to be written many times with one attribute
/// (`splice`) set to a different value each time: a room's message copies
/// differ only in `to`. Writing one costs a few copies of bytes instead of
/// walking and escaping the tree. The bytes are those [`Element::write_to`]
/// writes for the element with that attribute's value (attribute order
/// aside: the spliced one comes last).
#[derive(Clone, Debug)]
pub struct Prepared {
    ns: Cow<'static, str>,
    /// `<name`.
    name: Vec<u8>,
    /// ` a='…'…`, without `splice`.
    attrs: Vec<u8>,
    /// `/>` or `>…</name>`.
    rest: Vec<u8>,
    splice: &'static str,
}

impl Prepared {
    /// Writes the element with attribute `splice` set to `value` (absent
    /// if `None`); `parent_ns` as for [`Element::write_to`].
    pub fn write_to(&self, out: &mut Vec<u8>, parent_ns: &str, value: Option<&str>) {
        out.reserve(self.len() + value.map_or(0, |v| v.len() + self.splice.len() + 4));
        out.extend_from_slice(&self.name);
        if self.ns != parent_ns && self.ns != NS_XML {
            out.extend_from_slice(b" xmlns='");
            escape_into(out, &self.ns, true);
            out.push(b'\'');
        }
        out.extend_from_slice(&self.attrs);
        if let Some(v) = value {
            out.push(b' ');
            out.extend_from_slice(self.splice.as_bytes());
            out.extend_from_slice(b"='");
            escape_into(out, v, true);
            out.push(b'\'');
        }
        out.extend_from_slice(&self.rest);
    }

    /// The bytes shared by every copy.
    pub fn len(&self) -> usize {
        self.name.len() + self.attrs.len() + self.rest.len()
    }

    /// Never true: an element has at least its name.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// Builder returned by [`Element::builder`].
#[derive(Clone, Debug)]
pub struct ElementBuilder {
    el: Element,
}

impl ElementBuilder {
    /// Set an attribute (replacing an earlier value of the same name).
    pub fn attr(mut self, name: &str, value: impl Into<String>) -> Self {
        self.el.set_attr(name, value);
        self
    }

    /// Append a child element.
    pub fn append(mut self, child: Element) -> Self {
        self.el.append_child(child);
        self
    }

    /// Append character data (merged with preceding text).
    pub fn text(mut self, text: impl Into<String>) -> Self {
        self.el.append_text(text);
        self
    }

    /// Finish building.
    pub fn build(self) -> Element {
        self.el
    }
}

/// Attribute key for a parsed attribute in namespace `ns` with local name `local`.
fn attr_key(ns: &str, local: &str) -> Cow<'static, str> {
    if ns.is_empty() {
        intern(local)
    } else if ns == NS_XML {
        if local == "lang" {
            Cow::Borrowed("xml:lang")
        } else {
            Cow::Owned(format!("xml:{local}"))
        }
    } else {
        Cow::Owned(format!("{{{ns}}}{local}"))
    }
}

/// Convert a parsed attribute map into `(name, value)` pairs using the naming convention.
pub(crate) fn attrs_to_pairs(attrs: rxml::AttrMap) -> Vec<(String, String)> {
    attrs
        .into_iter()
        .map(|((ns, local), v)| (attr_key(ns.as_str(), local.as_str()).into_owned(), v))
        .collect()
}

/// Split a stored attribute name into (namespace, local). `None` for plain names.
fn split_clark(k: &str) -> Option<(&str, &str)> {
    if let Some(rest) = k.strip_prefix("xml:") {
        return Some((NS_XML, rest));
    }
    let rest = k.strip_prefix('{')?;
    // Local names cannot contain '}', namespace URIs can: split at the last one.
    let end = rest.rfind('}')?;
    Some((&rest[..end], &rest[end + 1..]))
}

/// Append `s` escaped for XML text (`attr == false`) or a single- or double-quoted
/// attribute value (`attr == true`).
fn escape_into(out: &mut Vec<u8>, s: &str, attr: bool) {
    let bytes = s.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let (rep, len): (&[u8], usize) = match b {
            b'&' => (b"&amp;", 1),
            b'<' => (b"&lt;", 1),
            b'>' => (b"&gt;", 1),
            b'"' if attr => (b"&quot;", 1),
            b'\'' if attr => (b"&apos;", 1),
            // Attribute value normalisation would turn literal whitespace into spaces, and
            // line-end normalisation would turn CR into LF: use character references.
            b'\t' if attr => (b"&#9;", 1),
            b'\n' if attr => (b"&#10;", 1),
            b'\r' => (b"&#13;", 1),
            0x00..=0x08 | 0x0B | 0x0C | 0x0E..=0x1F => ("\u{FFFD}".as_bytes(), 1),
            // U+FFFE and U+FFFF are not XML characters either.
            0xEF if bytes.get(i + 1) == Some(&0xBF)
                && matches!(bytes.get(i + 2), Some(0xBE | 0xBF)) =>
            {
                ("\u{FFFD}".as_bytes(), 3)
            }
            _ => {
                i += 1;
                continue;
            }
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(rep);
        i += len;
        start = i;
    }
    out.extend_from_slice(&bytes[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_text_specials_escaped() {
        let mut out = Vec::new();
        escape_into(&mut out, "a&b<c>d\"e'f\r\n\t", false);
        assert_eq!(out, b"a&amp;b&lt;c&gt;d\"e'f&#13;\n\t");
    }

    #[test]
    fn escape_attr_specials_escaped() {
        let mut out = Vec::new();
        escape_into(&mut out, "a&b<c>d\"e'f\r\n\t", true);
        assert_eq!(out, b"a&amp;b&lt;c&gt;d&quot;e&apos;f&#13;&#10;&#9;");
    }

    #[test]
    fn escape_control_chars_replaced() {
        let mut out = Vec::new();
        escape_into(&mut out, "a\u{0}b\u{1f}c\u{fffe}d\u{ffff}e\u{fffd}", false);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "a\u{fffd}b\u{fffd}c\u{fffd}d\u{fffd}e\u{fffd}"
        );
    }

    #[test]
    fn intern_known_names_borrowed() {
        assert!(matches!(intern("jabber:client"), Cow::Borrowed(_)));
        assert!(matches!(intern("unusual"), Cow::Owned(_)));
    }

    #[test]
    fn split_clark_forms_parsed() {
        assert_eq!(split_clark("to"), None);
        assert_eq!(split_clark("xml:lang"), Some((NS_XML, "lang")));
        assert_eq!(split_clark("{urn:x}a"), Some(("urn:x", "a")));
        assert_eq!(split_clark("{broken"), None);
        assert_eq!(split_clark("{urn:a}b}x"), Some(("urn:a}b", "x")));
    }

    /// A prepared element writes what `write_to` writes for the element
    /// with the spliced attribute set last, in every namespace scope.
    #[test]
    fn prepared_writes_what_write_to_writes_with_the_splice_last() {
        let mut m: Element = "<message xmlns='jabber:client' from='r@c.x/n&amp;1' \
             type='groupchat' id='i' xml:lang='en' xmlns:p='urn:p' p:a='v'>\
             <body>a &lt; b</body><x xmlns='urn:x'><y/>t</x></message>"
            .parse()
            .unwrap();
        let prepared = m.prepare("to");
        for (scope, to) in [
            ("jabber:client", Some("u@h/r'1")),
            ("", Some("u@h")),
            ("jabber:client", None),
        ] {
            match to {
                Some(t) => {
                    m.remove_attr("to");
                    m.set_attr("to", t)
                }
                None => {
                    m.remove_attr("to");
                }
            }
            let mut want = Vec::new();
            m.write_to(&mut want, scope);
            let mut got = Vec::new();
            prepared.write_to(&mut got, scope, to);
            assert_eq!(
                String::from_utf8(got).unwrap(),
                String::from_utf8(want).unwrap()
            );
        }
        // A `to` the prepared element had is replaced, not repeated.
        m.set_attr("to", "old@h");
        let mut got = Vec::new();
        m.prepare("to")
            .write_to(&mut got, "jabber:client", Some("new@h"));
        let got = String::from_utf8(got).unwrap();
        assert!(
            got.contains(" to='new@h'") && !got.contains("old@h"),
            "{got}"
        );
        // An empty element keeps its short form.
        let mut got = Vec::new();
        Element::new("presence", "jabber:client")
            .prepare("to")
            .write_to(&mut got, "", Some("a@b"));
        assert_eq!(got, b"<presence xmlns='jabber:client' to='a@b'/>");
    }
}
