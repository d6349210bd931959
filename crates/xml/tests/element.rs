//! Element tree API and serialiser tests.

use starling_xml::{Element, Node, NS_STREAMS};

const CLIENT: &str = "jabber:client";
const ROSTER: &str = "jabber:iq:roster";

fn iq() -> Element {
    Element::builder("iq", CLIENT)
        .attr("type", "result")
        .attr("id", "r1")
        .append(
            Element::builder("query", ROSTER)
                .append(
                    Element::builder("item", ROSTER)
                        .attr("jid", "romeo@example.net")
                        .build(),
                )
                .build(),
        )
        .build()
}

/// RFC 6120 §4.8.3: stanzas written into a jabber:client stream carry no xmlns; payload
/// namespaces are declared where they change (RFC 6121 §2.1.3 roster example).
#[test]
fn write_child_namespace_declared_only_where_changed() {
    assert_eq!(
        iq().to_string_in(CLIENT),
        "<iq type='result' id='r1'><query xmlns='jabber:iq:roster'>\
         <item jid='romeo@example.net'/></query></iq>"
    );
    assert_eq!(
        iq().to_string(),
        "<iq xmlns='jabber:client' type='result' id='r1'><query xmlns='jabber:iq:roster'>\
         <item jid='romeo@example.net'/></query></iq>"
    );
}

/// A child without namespace inside a namespaced parent undeclares the default namespace.
#[test]
fn write_empty_namespace_child_undeclares_default() {
    let el = Element::builder("a", "urn:x")
        .append(Element::new("b", ""))
        .build();
    assert_eq!(el.to_string_in("urn:x"), "<a><b xmlns=''/></a>");
    assert_eq!(Element::new("b", "").to_string_in(""), "<b/>");
}

/// Escaping: `& < > " '` in attributes, `& < >` in text (XML 1.0 §2.4, §3.3.3).
#[test]
fn write_special_characters_escaped() {
    let el = Element::builder("body", CLIENT)
        .attr("x", "a&b<c>d\"e'f")
        .text("1 < 2 && 3 > 2 \"q\" 'a'")
        .build();
    assert_eq!(
        el.to_string_in(CLIENT),
        "<body x='a&amp;b&lt;c&gt;d&quot;e&apos;f'>1 &lt; 2 &amp;&amp; 3 &gt; 2 \"q\" 'a'</body>"
    );
}

/// Namespaced attributes get generated prefixes; xml:lang is written as such.
#[test]
fn write_namespaced_attributes_prefixed() {
    let el = Element::builder("x", "urn:x")
        .attr("{urn:a}k", "1")
        .attr("{urn:b}k", "2")
        .attr("{urn:a}j", "3")
        .attr("xml:lang", "en")
        .build();
    assert_eq!(
        el.to_string_in("urn:x"),
        "<x xmlns:ns0='urn:a' ns0:k='1' xmlns:ns1='urn:b' ns1:k='2' ns0:j='3' xml:lang='en'/>"
    );
    let back: Element = el.to_string().parse().unwrap();
    assert_eq!(back, el);
}

/// xmlns pseudo-attributes set by callers are never written (the serialiser owns
/// namespace declarations).
#[test]
fn write_xmlns_attributes_skipped() {
    let mut el = Element::new("a", "urn:x");
    el.set_attr("xmlns", "urn:evil");
    el.set_attr("xmlns:p", "urn:p");
    assert_eq!(el.to_string(), "<a xmlns='urn:x'/>");
}

/// write_to appends to an existing buffer.
#[test]
fn write_to_existing_buffer_appended() {
    let mut out = b"<stream:stream>".to_vec();
    Element::new("presence", CLIENT).write_to(&mut out, CLIENT);
    assert_eq!(out, b"<stream:stream><presence/>");
    let mut out = Vec::new();
    Element::new("features", NS_STREAMS).write_to(&mut out, CLIENT);
    assert_eq!(out, b"<features xmlns='http://etherx.jabber.org/streams'/>");
}

#[test]
fn attr_set_replaces_and_remove_returns_value() {
    let mut el = Element::new("message", CLIENT);
    assert_eq!(el.attr("to"), None);
    el.set_attr("to", "a@b");
    el.set_attr("to", "c@d");
    assert_eq!(el.attr("to"), Some("c@d"));
    assert_eq!(el.attrs().collect::<Vec<_>>(), vec![("to", "c@d")]);
    assert_eq!(el.remove_attr("to"), Some("c@d".to_string()));
    assert_eq!(el.remove_attr("to"), None);
    assert_eq!(el.attrs().count(), 0);
}

#[test]
fn children_lookup_finds_by_name_and_namespace() {
    let mut el = iq();
    assert!(el.has_child("query", ROSTER));
    assert!(!el.has_child("query", CLIENT));
    assert_eq!(el.children().count(), 1);
    el.get_child_mut("query", ROSTER)
        .unwrap()
        .append_child(Element::new("item", ROSTER))
        .set_attr("jid", "juliet@example.com");
    let q = el.get_child("query", ROSTER).unwrap();
    assert_eq!(q.children().count(), 2);
    assert_eq!(
        q.children().nth(1).unwrap().attr("jid"),
        Some("juliet@example.com")
    );
    el.remove_children("query", ROSTER);
    assert!(!el.has_child("query", ROSTER));
    assert!(el.nodes().is_empty());
}

#[test]
fn text_adjacent_appends_merged() {
    let mut el = Element::new("body", CLIENT);
    el.append_text("a");
    el.append_text("");
    el.append_text("b");
    el.append_child(Element::new("x", "urn:x"));
    el.append_text("c");
    assert_eq!(el.nodes().len(), 3);
    assert_eq!(el.text(), "abc");
    assert_eq!(el.nodes()[0], Node::Text("ab".into()));
    assert_eq!(el.nodes()[2].as_text(), Some("c"));
    assert!(el.nodes()[1].as_element().unwrap().is("x", "urn:x"));
    el.nodes_mut().clear();
    assert_eq!(el.text(), "");
}

#[test]
fn equality_attribute_order_ignored() {
    let a = Element::builder("m", CLIENT)
        .attr("a", "1")
        .attr("b", "2")
        .build();
    let b = Element::builder("m", CLIENT)
        .attr("b", "2")
        .attr("a", "1")
        .build();
    let c = Element::builder("m", CLIENT)
        .attr("b", "2")
        .attr("a", "3")
        .build();
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_ne!(a, Element::builder("m", CLIENT).attr("a", "1").build());
}

#[test]
fn size_hint_grows_with_content() {
    let small = Element::new("presence", CLIENT);
    let big = Element::builder("message", CLIENT)
        .text("x".repeat(10_000))
        .build();
    assert_eq!(small.size_hint(), 0); // interned name and namespace, no children
    assert!(big.size_hint() >= 10_000);
    assert!(iq().size_hint() > 0);
}

/// Namespace URIs may contain `}`; Clark-notation names split at the last one.
#[test]
fn write_namespace_with_brace_roundtrips() {
    let el: Element = "<a xmlns='urn:x' xmlns:p='urn:a}b' p:k='v'/>"
        .parse()
        .unwrap();
    assert_eq!(el.attr("{urn:a}b}k"), Some("v"));
    assert_eq!(el.to_string().parse::<Element>().unwrap(), el);
}

/// Elements in the XML namespace (`<xml:foo/>`) are written with the `xml` prefix, as the
/// XML namespace may not be declared as a default namespace.
#[test]
fn write_xml_namespace_element_prefixed() {
    let el: Element = "<a xmlns='urn:x'><xml:foo><b/></xml:foo></a>"
        .parse()
        .unwrap();
    let foo = el.children().next().unwrap();
    assert!(foo.is("foo", starling_xml::NS_XML));
    assert!(foo.has_child("b", "urn:x"));
    assert_eq!(
        el.to_string(),
        "<a xmlns='urn:x'><xml:foo><b/></xml:foo></a>"
    );
    assert_eq!(el.to_string().parse::<Element>().unwrap(), el);
}
