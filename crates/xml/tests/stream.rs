//! Stream framing tests: header, stanzas, keepalives, close, error conditions and limits.

mod common;

use common::*;
use starling_xml::{Element, Limits, Node, StreamEvent, StreamParser, XmlError, NS_STREAMS};

fn stanzas(evs: &[StreamEvent]) -> Vec<&Element> {
    evs.iter()
        .filter_map(|e| match e {
            StreamEvent::Stanza(el) => Some(el),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Header (RFC 6120 §4.7)
// ---------------------------------------------------------------------------------------

/// RFC 6120 §4.7.1-4.7.5: header attributes and the content namespace are reported.
#[test]
fn header_without_xml_decl_yields_open() {
    let evs = parse_all(HEADER.as_bytes()).unwrap();
    assert_eq!(evs.len(), 1);
    let StreamEvent::Open(h) = &evs[0] else {
        panic!("expected Open, got {evs:?}")
    };
    assert_eq!(h.name, "stream");
    assert_eq!(h.ns, NS_STREAMS);
    assert_eq!(h.default_ns.as_deref(), Some("jabber:client"));
    assert_eq!(h.attr("to"), Some("im.example.com"));
    assert_eq!(h.attr("version"), Some("1.0"));
    assert_eq!(h.attr("xml:lang"), Some("en"));
    assert_eq!(h.attr("from"), None);
}

/// RFC 6120 §11.5: an XML declaration may precede the header.
#[test]
fn header_with_xml_decl_yields_open() {
    for decl in [
        "<?xml version='1.0'?>",
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n",
        "<?xml version='1.0' encoding='utf-8' standalone='yes'?>",
    ] {
        let input = format!("{decl}{HEADER}");
        let evs = parse_all(input.as_bytes()).unwrap();
        assert!(
            matches!(&evs[..], [StreamEvent::Open(_)]),
            "{decl}: {evs:?}"
        );
    }
}

/// A UTF-8 byte order mark is allowed before the XML declaration (XML 1.0 §4.3.3).
#[test]
fn header_with_utf8_bom_yields_open() {
    let mut input = vec![0xEF, 0xBB, 0xBF];
    input.extend_from_slice(b"<?xml version='1.0'?>");
    input.extend_from_slice(HEADER.as_bytes());
    // byte by byte, so the BOM is split too
    let mut parser = StreamParser::new(Limits::default());
    let mut evs = Vec::new();
    for b in &input {
        evs.extend(feed(&mut parser, std::slice::from_ref(b)).unwrap());
    }
    assert!(matches!(&evs[..], [StreamEvent::Open(_)]));
}

/// Server-to-server headers (RFC 6120 §9.1.1) keep the dialback prefix declaration
/// (XEP-0220) and report jabber:server as the content namespace.
#[test]
fn header_server_stream_reports_prefixed_declarations() {
    let input = "<stream:stream xmlns='jabber:server' xmlns:db='jabber:server:dialback' \
        xmlns:stream='http://etherx.jabber.org/streams' from='a.example' to='b.example' \
        version='1.0' id='abc'>";
    let evs = parse_all(input.as_bytes()).unwrap();
    let StreamEvent::Open(h) = &evs[0] else {
        panic!()
    };
    assert_eq!(h.default_ns.as_deref(), Some("jabber:server"));
    assert_eq!(h.attr("xmlns:db"), Some("jabber:server:dialback"));
    assert_eq!(h.attr("xmlns:stream"), None);
    assert_eq!(h.attr("id"), Some("abc"));
}

/// RFC 6120 §4.8.2: a header without a default namespace reports `None` so the caller can
/// send invalid-namespace.
#[test]
fn header_without_default_ns_reports_none() {
    let input = "<stream:stream xmlns:stream='http://etherx.jabber.org/streams' to='x'>";
    let evs = parse_all(input.as_bytes()).unwrap();
    let StreamEvent::Open(h) = &evs[0] else {
        panic!()
    };
    assert_eq!(h.default_ns, None);
}

/// Attribute values are entity-decoded in the header too.
#[test]
fn header_escaped_attribute_decoded() {
    let input = "<stream:stream xmlns='jabber:client' \
        xmlns:stream='http://etherx.jabber.org/streams' to='a&amp;b&#x41;'>";
    let evs = parse_all(input.as_bytes()).unwrap();
    let StreamEvent::Open(h) = &evs[0] else {
        panic!()
    };
    assert_eq!(h.attr("to"), Some("a&bA"));
}

/// RFC 6120 §4.8.1: the root element must be {http://etherx.jabber.org/streams}stream.
#[test]
fn header_wrong_namespace_invalid_namespace() {
    let input =
        b"<stream:stream xmlns:stream='http://wrong.example/streams' xmlns='jabber:client'>";
    let (_, err) = parse_until_error(input);
    let err = err.unwrap();
    assert_eq!(err.stream_condition(), "invalid-namespace");
    assert!(
        matches!(err, XmlError::InvalidNamespace { ref name, ref ns }
        if name == "stream" && ns == "http://wrong.example/streams")
    );
}

/// RFC 6120 §4.8.1: an unprefixed, un-namespaced root (e.g. a stanza sent first) is rejected.
#[test]
fn header_stanza_as_root_invalid_namespace() {
    assert_eq!(
        condition_of(b"<message xmlns='jabber:client'/>"),
        "invalid-namespace"
    );
    assert_eq!(condition_of(b"<stream>"), "invalid-namespace");
}

/// A root in the streams namespace but with another name is not a stream header.
#[test]
fn header_wrong_name_bad_format() {
    assert_eq!(
        condition_of(b"<stream:features xmlns:stream='http://etherx.jabber.org/streams'>"),
        "bad-format"
    );
}

/// Garbage before the header is not XML at all.
#[test]
fn header_garbage_not_well_formed() {
    assert_eq!(condition_of(b"GET / HTTP/1.1\r\n"), "not-well-formed");
    assert_eq!(condition_of(b"<stream:stream>"), "not-well-formed"); // undeclared prefix
}

/// A self-closing header opens and immediately closes the stream.
#[test]
fn header_self_closing_open_then_close() {
    let evs = parse_all(
        b"<stream:stream xmlns='jabber:client' xmlns:stream='http://etherx.jabber.org/streams'/>",
    )
    .unwrap();
    assert!(matches!(
        &evs[..],
        [StreamEvent::Open(_), StreamEvent::Close]
    ));
}

// ---------------------------------------------------------------------------------------
// Stanza framing (RFC 6120 §4.1, §8)
// ---------------------------------------------------------------------------------------

/// RFC 6120 §4.1: each first-level child of the stream is delivered as one stanza.
#[test]
fn framing_multiple_stanzas_each_delivered() {
    let input = stream_with(
        "<message to='juliet@example.com' type='chat'><body>Art thou not Romeo?</body></message>\
         <presence/>\
         <iq type='get' id='r1'><query xmlns='jabber:iq:roster'/></iq>\
         <stream:features><starttls xmlns='urn:ietf:params:xml:ns:xmpp-tls'/></stream:features>",
    );
    let evs = parse_all(&input).unwrap();
    let st = stanzas(&evs);
    assert_eq!(st.len(), 4);
    assert!(st[0].is("message", "jabber:client"));
    assert_eq!(st[0].attr("type"), Some("chat"));
    assert_eq!(
        st[0].get_child("body", "jabber:client").unwrap().text(),
        "Art thou not Romeo?"
    );
    assert!(st[1].is("presence", "jabber:client"));
    assert!(st[2].has_child("query", "jabber:iq:roster"));
    assert!(st[3].is("features", NS_STREAMS));
    assert!(st[3].has_child("starttls", "urn:ietf:params:xml:ns:xmpp-tls"));
}

/// A self-closing stanza is delivered as soon as its `/>` arrives, without waiting for
/// more input (rxml queues the end event internally).
#[test]
fn framing_self_closing_stanza_delivered_immediately() {
    let mut p = StreamParser::new(Limits::default());
    feed(&mut p, HEADER.as_bytes()).unwrap();
    let evs = feed(&mut p, b"<presence/>").unwrap();
    assert!(matches!(&evs[..], [StreamEvent::Stanza(_)]), "{evs:?}");
    assert!(p.is_idle());
}

/// `push` returns one event at a time and leaves the rest of the input in the slice.
#[test]
fn framing_push_returns_one_event_and_advances() {
    let input = stream_with("<a xmlns='x'/><b xmlns='x'/>");
    let mut slice = &input[..];
    let mut p = StreamParser::new(Limits::default());
    assert!(matches!(p.push(&mut slice), Ok(Some(StreamEvent::Open(_)))));
    assert!(matches!(p.push(&mut slice), Ok(Some(StreamEvent::Stanza(ref e))) if e.name() == "a"));
    assert!(!slice.is_empty());
    assert!(matches!(p.push(&mut slice), Ok(Some(StreamEvent::Stanza(ref e))) if e.name() == "b"));
    assert!(matches!(p.push(&mut slice), Ok(None)));
    assert!(slice.is_empty());
}

/// Text inside stanzas is preserved exactly, including whitespace, references, CDATA,
/// CRLF normalisation (XML 1.0 §2.11) and multi-byte characters split across pushes.
#[test]
fn framing_text_content_preserved_exactly() {
    let body = "  Hello &amp; &lt;world&gt; &#x263A; <![CDATA[<raw>&]]> \u{1F600} ünï\r\nend  ";
    let input = stream_with(&format!("<message><body>{body}</body></message>"));
    let expected = "  Hello & <world> \u{263A} <raw>& \u{1F600} ünï\nend  ";
    // whole
    let evs = parse_all(&input).unwrap();
    let msg = stanzas(&evs)[0];
    let b = msg.get_child("body", "jabber:client").unwrap();
    assert_eq!(b.text(), expected);
    assert_eq!(b.nodes().len(), 1, "adjacent text must be merged");
    // byte by byte
    let mut p = StreamParser::new(Limits::default());
    let mut evs2 = Vec::new();
    for byte in &input {
        evs2.extend(feed(&mut p, std::slice::from_ref(byte)).unwrap());
    }
    assert_eq!(evs, evs2);
}

/// Mixed content keeps element/text order.
#[test]
fn framing_mixed_content_order_kept() {
    let input = stream_with("<message><body>a<b xmlns='x'>b</b>c</body></message>");
    let evs = parse_all(&input).unwrap();
    let body = stanzas(&evs)[0].get_child("body", "jabber:client").unwrap();
    assert_eq!(body.nodes().len(), 3);
    assert_eq!(body.nodes()[0], Node::Text("a".into()));
    assert!(matches!(&body.nodes()[1], Node::Element(e) if e.is("b", "x") && e.text() == "b"));
    assert_eq!(body.nodes()[2], Node::Text("c".into()));
    assert_eq!(body.text(), "ac");
}

/// Namespaced and xml: attributes follow the naming convention.
#[test]
fn framing_namespaced_attributes_named_by_convention() {
    let input = stream_with(
        "<message xmlns:foo='urn:foo' foo:bar='1' xml:lang='de' id='x'><body/></message>",
    );
    let evs = parse_all(&input).unwrap();
    let m = stanzas(&evs)[0];
    assert_eq!(m.attr("{urn:foo}bar"), Some("1"));
    assert_eq!(m.attr("xml:lang"), Some("de"));
    assert_eq!(m.attr("id"), Some("x"));
    assert_eq!(m.attrs().count(), 3);
}

/// Prefixed stream-namespace children (RFC 6120 §4.9 stream errors) are stanzas in
/// NS_STREAMS.
#[test]
fn framing_stream_error_element_delivered() {
    let input = stream_with(
        "<stream:error><host-unknown xmlns='urn:ietf:params:xml:ns:xmpp-streams'/></stream:error>",
    );
    let evs = parse_all(&input).unwrap();
    let e = stanzas(&evs)[0];
    assert!(e.is("error", NS_STREAMS));
    assert!(e.has_child("host-unknown", "urn:ietf:params:xml:ns:xmpp-streams"));
}

// ---------------------------------------------------------------------------------------
// Whitespace keepalives (RFC 6120 §4.6.1) and close (§4.4)
// ---------------------------------------------------------------------------------------

/// RFC 6120 §4.6.1: whitespace between stanzas produces no event.
#[test]
fn keepalive_whitespace_between_stanzas_ignored() {
    let input = stream_with(" \n\t\r\n <presence/>\n\n  <presence/> \r\n");
    let evs = parse_all(&input).unwrap();
    assert_eq!(evs.len(), 3);
    assert_eq!(stanzas(&evs).len(), 2);
}

/// Keepalives leave the parser idle with nothing pending.
#[test]
fn keepalive_single_space_parser_idle() {
    let mut p = StreamParser::new(Limits::default());
    feed(&mut p, HEADER.as_bytes()).unwrap();
    assert!(p.is_idle());
    for _ in 0..1000 {
        assert!(feed(&mut p, b" ").unwrap().is_empty());
        assert!(p.is_idle());
        assert_eq!(p.pending_bytes(), 0);
    }
}

/// A flood of whitespace is not counted as a stanza (no policy-violation), with a small
/// stanza limit.
#[test]
fn keepalive_whitespace_flood_not_limited() {
    let limits = Limits {
        max_stanza_bytes: 100,
        ..Limits::default()
    };
    let mut p = StreamParser::new(limits);
    feed(&mut p, HEADER.as_bytes()).unwrap();
    let ws = vec![b' '; 100_000];
    assert!(feed(&mut p, &ws).unwrap().is_empty());
    let evs = feed(&mut p, b"<presence/>").unwrap();
    assert_eq!(evs.len(), 1);
}

/// RFC 6120 §4.4: `</stream:stream>` closes the stream.
#[test]
fn close_end_tag_yields_close() {
    let input = stream_with("<presence/></stream:stream>");
    let evs = parse_all(&input).unwrap();
    assert!(matches!(
        &evs[..],
        [
            StreamEvent::Open(_),
            StreamEvent::Stanza(_),
            StreamEvent::Close
        ]
    ));
}

/// Input after the close is consumed and ignored.
#[test]
fn close_trailing_input_discarded() {
    let mut p = StreamParser::new(Limits::default());
    let evs = feed(&mut p, &stream_with("</stream:stream>")).unwrap();
    assert_eq!(evs.len(), 2);
    let mut rest: &[u8] = b"<garbage";
    assert_eq!(p.push(&mut rest).unwrap(), None);
    assert!(rest.is_empty());
    assert!(p.is_idle());
}

// ---------------------------------------------------------------------------------------
// Error conditions (RFC 6120 §4.9.3, §11)
// ---------------------------------------------------------------------------------------

/// RFC 6120 §11.1 / §4.9.3.18: comments are restricted XML — before the header, at stream
/// level and inside a stanza.
#[test]
fn error_comment_restricted_xml() {
    assert_eq!(
        condition_of(format!("<!-- hi -->{HEADER}").as_bytes()),
        "restricted-xml"
    );
    assert_eq!(condition_of(&stream_with("<!-- hi -->")), "restricted-xml");
    assert_eq!(
        condition_of(&stream_with("<message><!-- hi --></message>")),
        "restricted-xml"
    );
}

/// RFC 6120 §11.1: processing instructions other than the XML declaration are restricted.
#[test]
fn error_processing_instruction_restricted_xml() {
    assert_eq!(
        condition_of(format!("<?xml-stylesheet href='a'?>{HEADER}").as_bytes()),
        "restricted-xml"
    );
    assert_eq!(condition_of(&stream_with("<?foo bar?>")), "restricted-xml");
    assert_eq!(
        condition_of(&stream_with("<message><?foo?></message>")),
        "restricted-xml"
    );
    // a second XML declaration inside the stream is a PI too
    assert_eq!(
        condition_of(&stream_with("<?xml version='1.0'?>")),
        "restricted-xml"
    );
}

/// RFC 6120 §11.1: DOCTYPE / internal subset is restricted XML.
#[test]
fn error_doctype_restricted_xml() {
    assert_eq!(
        condition_of(format!("<?xml version='1.0'?><!DOCTYPE stream>{HEADER}").as_bytes()),
        "restricted-xml"
    );
    assert_eq!(
        condition_of(format!("<!DOCTYPE stream [<!ENTITY x 'y'>]>{HEADER}").as_bytes()),
        "restricted-xml"
    );
    assert_eq!(condition_of(&stream_with("<!DOCTYPE x>")), "restricted-xml");
}

/// RFC 6120 §11.1: entity declarations are restricted XML.
#[test]
fn error_entity_declaration_restricted_xml() {
    assert_eq!(
        condition_of(&stream_with("<!ENTITY lol 'lol'>")),
        "restricted-xml"
    );
    assert_eq!(
        condition_of(&stream_with("<message><!ENTITY lol 'lol'></message>")),
        "restricted-xml"
    );
}

/// RFC 6120 §11.1: only the five predefined entities may be referenced.
#[test]
fn error_undeclared_entity_restricted_xml() {
    assert_eq!(
        condition_of(&stream_with("<message><body>&nbsp;</body></message>")),
        "restricted-xml"
    );
    assert_eq!(
        condition_of(&stream_with("<message to='&lol;'/>")),
        "restricted-xml"
    );
}

/// RFC 6120 §4.9.3.13: malformed XML is not-well-formed.
#[test]
fn error_malformed_xml_not_well_formed() {
    for body in [
        "<message></presence>",
        "<message a='1' a='2'/>",
        "<message><body></message>",
        "<x:message/>",
        "<message a=1/>",
        "<message>]]></message>",
        "<message>\u{1}</message>",
        "<message>&#0;</message>",
        "<>",
    ] {
        assert_eq!(
            condition_of(&stream_with(body)),
            "not-well-formed",
            "{body}"
        );
    }
}

/// RFC 6120 §4.9.3.1: non-whitespace character data at stream level is bad-format.
#[test]
fn error_text_at_stream_level_bad_format() {
    assert_eq!(condition_of(&stream_with("hello")), "bad-format");
    assert_eq!(
        condition_of(&stream_with("<presence/> x <presence/>")),
        "bad-format"
    );
}

/// RFC 6120 §11.6 / §4.9.3.22: an encoding declaration other than UTF-8 is
/// unsupported-encoding.
#[test]
fn error_encoding_declaration_unsupported_encoding() {
    assert_eq!(
        condition_of(format!("<?xml version='1.0' encoding='ISO-8859-1'?>{HEADER}").as_bytes()),
        "unsupported-encoding"
    );
}

/// RFC 6120 §11.6: UTF-16 input (with or without BOM) and invalid UTF-8 bytes are
/// unsupported-encoding.
#[test]
fn error_non_utf8_input_unsupported_encoding() {
    let utf16: Vec<u8> = HEADER
        .encode_utf16()
        .flat_map(|u| u.to_le_bytes())
        .collect();
    assert_eq!(condition_of(&utf16), "unsupported-encoding");
    let mut bom16 = vec![0xFF, 0xFE];
    bom16.extend_from_slice(&utf16);
    assert_eq!(condition_of(&bom16), "unsupported-encoding");
    let mut latin1 = stream_with("<message><body>");
    latin1.extend_from_slice(b"caf\xe9 ");
    latin1.extend_from_slice(b"</body></message>");
    assert_eq!(condition_of(&latin1), "unsupported-encoding");
}

/// After an error the parser is poisoned and keeps returning the same error.
#[test]
fn error_after_failure_parser_poisoned() {
    let mut p = StreamParser::new(Limits::default());
    let mut input: &[u8] = b"<oops";
    let mut bad = stream_with("<message><!-- x --></message>");
    bad.extend_from_slice(b"<presence/>");
    let mut slice = &bad[..];
    let first = loop {
        match p.push(&mut slice) {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("expected error"),
            Err(e) => break e,
        }
    };
    assert_eq!(first.stream_condition(), "restricted-xml");
    assert_eq!(p.push(&mut input), Err(first.clone()));
    assert_eq!(p.push(&mut &b"<presence/>"[..]), Err(first));
    assert_eq!(p.pending_bytes(), 0);
}

// ---------------------------------------------------------------------------------------
// Limits (RFC 6120 §13.12 resource exhaustion) -> policy-violation (§4.9.3.14)
// ---------------------------------------------------------------------------------------

fn small(max_stanza_bytes: usize) -> Limits {
    Limits {
        max_stanza_bytes,
        ..Limits::default()
    }
}

/// A stanza of exactly max_stanza_bytes is accepted, one byte more is rejected.
#[test]
fn limits_stanza_at_limit_accepted_over_limit_rejected() {
    let stanza = "<message><body>0123456789</body></message>";
    let n = stanza.len();
    let ok = parse_until_error_with(&stream_with(stanza), small(n));
    assert!(ok.1.is_none(), "{ok:?}");
    assert_eq!(stanzas(&ok.0).len(), 1);
    let (_, err) = parse_until_error_with(&stream_with(stanza), small(n - 1));
    assert_eq!(err, Some(XmlError::StanzaTooLarge { limit: n - 1 }));
    assert_eq!(err.unwrap().stream_condition(), "policy-violation");
}

/// Limits apply per stanza, not cumulatively.
#[test]
fn limits_many_small_stanzas_accepted() {
    let body: String = "<presence/>\n".repeat(1000);
    let (evs, err) = parse_until_error_with(&stream_with(&body), small(20));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(stanzas(&evs).len(), 1000);
}

/// A huge text node fails as soon as the limit is crossed, without consuming (and
/// buffering) the rest of the input.
#[test]
fn limits_huge_text_rejected_early() {
    let mut p = StreamParser::new(Limits::default());
    feed(&mut p, HEADER.as_bytes()).unwrap();
    let mut data = b"<message><body>".to_vec();
    data.resize(10 * 1024 * 1024, b'A');
    let mut slice = &data[..];
    let err = p.push(&mut slice).unwrap_err();
    assert_eq!(err, XmlError::StanzaTooLarge { limit: 256 * 1024 });
    let consumed = data.len() - slice.len();
    assert!(consumed <= 256 * 1024 + 1, "consumed {consumed}");
}

/// A lowered stanza cap (before authentication) refuses a partial stanza as
/// soon as it passes the cap; raised again, a stanza up to the full limit
/// with a text token longer than the cap is read by the same parser.
#[test]
fn limits_stanza_cap_refuses_early_and_lifts_without_new_parser() {
    let mut p = StreamParser::new(Limits::default());
    feed(&mut p, HEADER.as_bytes()).unwrap();
    p.set_stanza_cap(1024);
    let mut big = b"<message><body>".to_vec();
    big.resize(64 * 1024, b'A');
    let mut slice = &big[..];
    assert_eq!(
        p.push(&mut slice).unwrap_err(),
        XmlError::StanzaTooLarge { limit: 1024 }
    );
    assert!(big.len() - slice.len() <= 1025);

    let mut p = StreamParser::new(Limits::default());
    feed(&mut p, HEADER.as_bytes()).unwrap();
    p.set_stanza_cap(1024);
    feed(&mut p, b"<presence/>").unwrap();
    p.set_stanza_cap(usize::MAX);
    let body = "A".repeat(100 * 1024);
    let evs = feed(
        &mut p,
        format!("<message><body>{body}</body></message>").as_bytes(),
    )
    .unwrap();
    assert_eq!(stanzas(&evs).len(), 1);
}

/// Same for a flood of attributes (rxml buffers attributes until the tag closes).
#[test]
fn limits_attribute_flood_rejected_early() {
    let mut p = StreamParser::new(small(4096));
    feed(&mut p, HEADER.as_bytes()).unwrap();
    let mut data = b"<message".to_vec();
    let mut i = 0;
    while data.len() < 1024 * 1024 {
        data.extend_from_slice(format!(" a{i}='x'").as_bytes());
        i += 1;
    }
    let mut slice = &data[..];
    assert_eq!(
        p.push(&mut slice).unwrap_err(),
        XmlError::StanzaTooLarge { limit: 4096 }
    );
    assert!(data.len() - slice.len() <= 4097);
}

/// pending_bytes tracks a partial stanza and drops to 0 when it completes.
#[test]
fn limits_pending_bytes_tracks_partial_stanza() {
    let mut p = StreamParser::new(Limits::default());
    feed(&mut p, HEADER.as_bytes()).unwrap();
    assert_eq!(p.pending_bytes(), 0);
    feed(&mut p, b"<message><body>hello").unwrap();
    assert_eq!(p.pending_bytes(), "<message><body>hello".len());
    assert!(!p.is_idle());
    let evs = feed(&mut p, b"</body></message>").unwrap();
    assert_eq!(evs.len(), 1);
    assert_eq!(p.pending_bytes(), 0);
    assert!(p.is_idle());
}

/// Nesting deeper than max_depth is rejected.
#[test]
fn limits_depth_exceeded_policy_violation() {
    let limits = Limits {
        max_depth: 4,
        ..Limits::default()
    };
    let ok = "<a><b><c><d/></c></b></a>";
    assert!(parse_until_error_with(&stream_with(ok), limits).1.is_none());
    let deep = "<a><b><c><d><e/></d></c></b></a>";
    let (_, err) = parse_until_error_with(&stream_with(deep), limits);
    assert_eq!(err, Some(XmlError::TooDeep { limit: 4 }));
    assert_eq!(err.unwrap().stream_condition(), "policy-violation");
}

/// A depth bomb is rejected at the default limit long before the size limit.
#[test]
fn limits_depth_bomb_rejected() {
    let deep = "<a>".repeat(10_000);
    let (_, err) = parse_until_error(&stream_with(&deep));
    assert_eq!(err, Some(XmlError::TooDeep { limit: 64 }));
}

/// More than max_attributes attributes on one element is rejected.
#[test]
fn limits_too_many_attributes_policy_violation() {
    let limits = Limits {
        max_attributes: 3,
        ..Limits::default()
    };
    let ok = "<message a='1' b='2' c='3' xmlns:x='urn:x'/>"; // declarations do not count
    assert!(parse_until_error_with(&stream_with(ok), limits).1.is_none());
    let bad = "<message><x a='1' b='2' c='3' d='4'/></message>";
    let (_, err) = parse_until_error_with(&stream_with(bad), limits);
    assert_eq!(err, Some(XmlError::TooManyAttributes { limit: 3 }));
    assert_eq!(err.unwrap().stream_condition(), "policy-violation");
}

/// The stream header (with XML declaration) is bounded by max_header_bytes.
#[test]
fn limits_header_too_large_policy_violation() {
    let limits = Limits {
        max_header_bytes: 200,
        ..Limits::default()
    };
    let big = format!(
        "<?xml version='1.0'?><stream:stream xmlns='jabber:client' \
         xmlns:stream='http://etherx.jabber.org/streams' to='{}'>",
        "a".repeat(300)
    );
    let (_, err) = parse_until_error_with(big.as_bytes(), limits);
    assert_eq!(err, Some(XmlError::HeaderTooLarge { limit: 200 }));
    assert_eq!(err.unwrap().stream_condition(), "policy-violation");
    // an endless header is cut off at the limit
    let mut p = StreamParser::new(limits);
    let mut endless = b"<stream:stream xmlns:stream='http://etherx.jabber.org/streams'".to_vec();
    endless.resize(1 << 20, b' ');
    let mut slice = &endless[..];
    assert!(p.push(&mut slice).is_err());
    assert!(endless.len() - slice.len() <= 201);
    // the default limit accepts the usual header
    assert!(parse_all(HEADER.as_bytes()).is_ok());
}

/// A single attribute value longer than the token limit is policy-violation.
#[test]
fn limits_huge_attribute_value_policy_violation() {
    let bad = format!("<message id='{}'/>", "x".repeat(20_000));
    let (_, err) = parse_until_error(&stream_with(&bad));
    let err = err.unwrap();
    assert!(matches!(err, XmlError::TokenTooLarge { .. }), "{err:?}");
    assert_eq!(err.stream_condition(), "policy-violation");
}

/// Text far longer than the token limit (but within the stanza limit) is accepted and
/// reassembled into a single text node.
#[test]
fn limits_long_text_within_limit_merged() {
    let text = "x".repeat(100_000);
    let evs = parse_all(&stream_with(&format!(
        "<message><body>{text}</body></message>"
    )))
    .unwrap();
    let body = stanzas(&evs)[0].get_child("body", "jabber:client").unwrap();
    assert_eq!(body.nodes().len(), 1);
    assert_eq!(body.text(), text);
}

// ---------------------------------------------------------------------------------------
// Element::from_str
// ---------------------------------------------------------------------------------------

/// Stored stanzas can be re-parsed as standalone documents.
#[test]
fn from_str_standalone_document_parsed() {
    let el: Element =
        "<?xml version='1.0'?><message xmlns='jabber:client' to='a'><body>x</body></message>"
            .parse()
            .unwrap();
    assert!(el.is("message", "jabber:client"));
    assert_eq!(el.get_child("body", "jabber:client").unwrap().text(), "x");
    assert_eq!(
        "<a xmlns='x'><!-- c --></a>"
            .parse::<Element>()
            .unwrap_err()
            .stream_condition(),
        "restricted-xml"
    );
    assert!("<a xmlns='x'>".parse::<Element>().is_err());
    assert!("".parse::<Element>().is_err());
}

#[test]
fn hibernate_idle_then_resume_keeps_namespace_context() {
    // The header declares a prefix that stanzas use later: the re-primed
    // parser must still resolve it.
    let header = "<?xml version='1.0'?><stream:stream xmlns='jabber:client' \
        xmlns:stream='http://etherx.jabber.org/streams' xmlns:x='urn:example:x' \
        to='localhost' version='1.0'>";
    let mut p = StreamParser::new(Limits::default());
    let evs = feed(&mut p, header.as_bytes()).unwrap();
    assert!(matches!(evs[0], StreamEvent::Open(_)));
    assert!(p.hibernate());
    assert!(p.is_hibernating());
    let evs = feed(
        &mut p,
        b"<message to='a@b'><x:y a='1'/><body>hi</body></message>",
    )
    .unwrap();
    let StreamEvent::Stanza(m) = &evs[0] else {
        panic!("{evs:?}")
    };
    assert_eq!(m.ns(), "jabber:client");
    assert!(m.has_child("y", "urn:example:x"), "{m}");
    assert!(!p.is_hibernating());
    // Hibernate again between stanzas, then close.
    assert!(p.hibernate());
    let evs = feed(&mut p, b" </stream:stream>").unwrap();
    assert!(matches!(evs[0], StreamEvent::Close));
}

#[test]
fn hibernate_refused_mid_stanza_or_before_open() {
    let mut p = StreamParser::new(Limits::default());
    assert!(!p.hibernate(), "no header yet");
    feed(&mut p, HEADER.as_bytes()).unwrap();
    feed(&mut p, b"<message><body>half").unwrap();
    assert!(!p.hibernate(), "inside a stanza");
    let evs = feed(&mut p, b"</body></message>").unwrap();
    assert_eq!(evs.len(), 1);
    assert!(p.hibernate());
}
