//! Property tests: chunking invariance, robustness against corrupted input, and
//! serialise/parse round trips.

mod common;

use common::*;
use proptest::prelude::*;
use starling_xml::{Element, Limits, StreamEvent, StreamParser, XmlError};

/// XML 1.0 `Char` production (RFC 6120 §11.1 restricts XMPP to XML 1.0).
fn is_xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

fn xml_char() -> impl Strategy<Value = char> {
    prop_oneof![
        4 => prop::sample::select(vec!['a', 'z', ' ', '&', '<', '>', '"', '\'', '\n', '\r', '\t', ']', ';', '#']),
        2 => prop::sample::select(vec!['é', 'ü', '☺', '\u{1F600}', '\u{10FFFF}', '\u{FFFD}', 'Ω']),
        1 => any::<char>().prop_filter("xml char", |c| is_xml_char(*c)),
    ]
}

fn xml_string(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(xml_char(), 0..max).prop_map(|v| v.into_iter().collect())
}

fn name() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "message", "body", "a", "x-y", "n_1.2", "ünï", "query", "item",
    ])
}

fn namespace() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "jabber:client",
        "urn:x",
        "",
        "urn:y:z?a&b'c\"",
        "http://jabber.org/protocol/disco#info",
        starling_xml::NS_XML,
    ])
}

fn attr_name() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "to",
        "id",
        "type",
        "xml:lang",
        "xml:space",
        "{urn:a}k",
        "{urn:b}k",
        "{urn:a}j",
        "ünï",
        "{urn:a}b}k",
    ])
}

fn leaf() -> impl Strategy<Value = Element> {
    (
        name(),
        namespace(),
        prop::collection::vec((attr_name(), xml_string(12)), 0..4),
        xml_string(16),
    )
        .prop_map(|(n, ns, attrs, text)| {
            let mut b = Element::builder(n, ns);
            for (k, v) in attrs {
                b = b.attr(k, v);
            }
            b.text(text).build()
        })
}

/// Child content of an element under construction.
#[derive(Clone, Debug)]
enum Content {
    Child(Element),
    Text(String),
}

fn element() -> impl Strategy<Value = Element> {
    leaf().prop_recursive(4, 32, 5, |inner| {
        (
            leaf(),
            prop::collection::vec(
                prop_oneof![
                    inner.prop_map(Content::Child),
                    xml_string(10).prop_map(Content::Text)
                ],
                0..5,
            ),
        )
            .prop_map(|(mut el, content)| {
                for c in content {
                    match c {
                        Content::Child(e) => {
                            el.append_child(e);
                        }
                        Content::Text(t) => el.append_text(t),
                    }
                }
                el
            })
    })
}

/// A serialised client stream with the given stanzas, whitespace keepalives between them,
/// an optional XML declaration and an optional close tag.
fn stream_bytes(stanzas: &[Element], decl: bool, ws: &[String], close: bool) -> Vec<u8> {
    let mut out = Vec::new();
    if decl {
        out.extend_from_slice(b"<?xml version='1.0'?>\n");
    }
    out.extend_from_slice(HEADER.as_bytes());
    for (i, s) in stanzas.iter().enumerate() {
        if let Some(w) = ws.get(i) {
            out.extend_from_slice(w.as_bytes());
        }
        s.write_to(&mut out, "jabber:client");
    }
    if close {
        out.extend_from_slice(b"</stream:stream>");
    }
    out
}

fn whitespace() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(vec![' ', '\n', '\t', '\r']), 0..4)
        .prop_map(|v| v.into_iter().collect())
}

/// Feed `input` split at the given (unsorted, possibly duplicate) points; collect events
/// until the input is exhausted or an error occurs.
fn feed_split(
    input: &[u8],
    points: &[usize],
    limits: Limits,
) -> (Vec<StreamEvent>, Option<XmlError>) {
    let mut cuts: Vec<usize> = points.iter().map(|p| p % (input.len() + 1)).collect();
    cuts.push(0);
    cuts.push(input.len());
    cuts.sort_unstable();
    let mut parser = StreamParser::new(limits);
    let mut events = Vec::new();
    for w in cuts.windows(2) {
        let mut chunk = &input[w[0]..w[1]];
        loop {
            match parser.push(&mut chunk) {
                Ok(Some(ev)) => events.push(ev),
                Ok(None) => {
                    assert!(chunk.is_empty(), "Ok(None) with input left");
                    break;
                }
                Err(e) => {
                    // poisoned: every later call reports the same error
                    let mut rest: &[u8] = b"<x/>";
                    assert_eq!(parser.push(&mut rest).as_ref().err(), Some(&e));
                    return (events, Some(e));
                }
            }
        }
    }
    (events, None)
}

/// Two outcomes of the same (possibly invalid) input fed with different splits agree.
///
/// Some differences are inherent to incremental parsing and allowed: an error may be
/// detected later when more of the input arrives in one read (or not at all yet, if the
/// input ends in an incomplete construct), and for garbage where rxml reads ahead inside
/// a text run, *which* low-level problem is noticed first (a text token where none is
/// allowed, an invalid UTF-8 byte, character data at stream level) can depend on where
/// the read boundary falls. Restricted-XML, namespace and policy errors never vary.
fn same_condition(a: &Option<XmlError>, b: &Option<XmlError>) -> bool {
    const GARBAGE: [&str; 3] = ["not-well-formed", "unsupported-encoding", "bad-format"];
    match (a, b) {
        (Some(a), Some(b)) => {
            let (a, b) = (a.stream_condition(), b.stream_condition());
            a == b || (GARBAGE.contains(&a) && GARBAGE.contains(&b))
        }
        _ => true,
    }
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1..=255u8).prop_map(|(i, x)| Mutation::Flip(i, x)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<usize>(), 1..16usize).prop_map(|(i, n)| Mutation::Delete(i, n)),
    ]
}

fn apply(mut data: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        let len = data.len();
        match m {
            Mutation::Flip(i, x) if len > 0 => data[i % len] ^= x,
            Mutation::Truncate(i) => data.truncate(i % (len + 1)),
            Mutation::Insert(i, b) => {
                let at = i % (len + 1);
                data.splice(at..at, b.iter().copied());
            }
            Mutation::Delete(i, n) if len > 0 => {
                let at = i % len;
                let end = (at + n).min(len);
                data.drain(at..end);
            }
            _ => {}
        }
    }
    data
}

proptest! {
    // 256 cases by default; set PROPTEST_CASES for longer runs.
    /// RFC 6120 §4.1/§4.6.1: a valid stream yields the same events however it is split
    /// across reads (including inside multi-byte UTF-8 sequences), and the stanzas equal
    /// the trees that were serialised.
    #[test]
    fn split_valid_stream_events_identical(
        stanzas in prop::collection::vec(element(), 0..6),
        ws in prop::collection::vec(whitespace(), 0..6),
        decl in any::<bool>(),
        close in any::<bool>(),
        points in prop::collection::vec(any::<usize>(), 0..24),
    ) {
        let input = stream_bytes(&stanzas, decl, &ws, close);
        let (whole, err) = feed_split(&input, &[], Limits::default());
        prop_assert!(err.is_none(), "error {:?} for {}", err, String::from_utf8_lossy(&input));
        let (split, err) = feed_split(&input, &points, Limits::default());
        prop_assert!(err.is_none());
        prop_assert_eq!(&whole, &split);
        // one Open, the stanzas, optionally Close
        prop_assert!(matches!(whole.first(), Some(StreamEvent::Open(_))));
        let got: Vec<&Element> = whole.iter().filter_map(|e| match e {
            StreamEvent::Stanza(s) => Some(s),
            _ => None,
        }).collect();
        prop_assert_eq!(got, stanzas.iter().collect::<Vec<_>>());
        prop_assert_eq!(matches!(whole.last(), Some(StreamEvent::Close)), close);
    }

    /// Byte-at-a-time feeding is the extreme split.
    #[test]
    fn split_byte_by_byte_events_identical(stanzas in prop::collection::vec(element(), 1..3)) {
        let input = stream_bytes(&stanzas, true, &[], true);
        let all: Vec<usize> = (0..input.len()).collect();
        prop_assert_eq!(feed_split(&input, &[], Limits::default()), feed_split(&input, &all, Limits::default()));
    }

    /// Corrupted streams (byte flips, truncations, insertions, deletions) never panic; they
    /// produce events and/or one error, and the outcome does not depend on how the input
    /// is split.
    #[test]
    fn corrupt_stream_never_panics(
        stanzas in prop::collection::vec(element(), 0..4),
        muts in prop::collection::vec(mutation(), 1..6),
        points in prop::collection::vec(any::<usize>(), 0..16),
        small_limits in any::<bool>(),
    ) {
        let input = apply(stream_bytes(&stanzas, true, &[], true), &muts);
        let limits = if small_limits {
            Limits { max_stanza_bytes: 200, max_depth: 3, max_attributes: 2, max_header_bytes: 150 }
        } else {
            Limits::default()
        };
        let (ev_whole, err_whole) = feed_split(&input, &[], limits);
        let (ev_split, err_split) = feed_split(&input, &points, limits);
        prop_assert_eq!(ev_whole, ev_split);
        prop_assert!(same_condition(&err_whole, &err_split), "{:?} vs {:?}", err_whole, err_split);
    }

    /// Arbitrary bytes never panic, with or without a valid header in front.
    #[test]
    fn random_bytes_never_panic(
        data in prop::collection::vec(any::<u8>(), 0..512),
        with_header in any::<bool>(),
        points in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        let mut input = if with_header { HEADER.as_bytes().to_vec() } else { Vec::new() };
        input.extend_from_slice(&data);
        let _ = feed_split(&input, &points, Limits::default());
    }

    /// Arbitrary XML-ish token soup never panics (more likely to reach deep parser states
    /// than uniformly random bytes).
    #[test]
    fn random_markup_never_panics(
        parts in prop::collection::vec(prop::sample::select(vec![
            "<", ">", "/", "/>", "</", "<?", "?>", "<!", "<!--", "-->", "<![CDATA[", "]]>", "]",
            "&", "&amp;", "&#", "&#x", ";", "=", "'", "\"", " ", "\r", "\n", "a", "b:c", "xmlns",
            "xmlns:b", "xml:lang", "stream:stream", "message", "\u{e9}", "\u{1F600}", "\u{0}",
            "\u{FFFE}", "\u{0B}", "\u{85}",
        ]), 0..64),
        with_header in any::<bool>(),
        points in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        let mut input = if with_header { HEADER.as_bytes().to_vec() } else { Vec::new() };
        for p in parts {
            input.extend_from_slice(p.as_bytes());
        }
        let (ev_a, a) = feed_split(&input, &[], Limits::default());
        let (ev_b, b) = feed_split(&input, &points, Limits::default());
        prop_assert_eq!(ev_a, ev_b);
        prop_assert!(same_condition(&a, &b), "{:?} vs {:?}", a, b);
    }

    /// Serialising and re-parsing yields an equal tree, both as a standalone document
    /// (`Display` / `FromStr`) and inside a stream with a default namespace in scope.
    #[test]
    fn roundtrip_serialise_parse_equal(el in element()) {
        let text = el.to_string();
        let back: Element = text.parse().map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
        prop_assert_eq!(&back, &el);
        // re-serialising the parsed tree is a fixed point up to attribute order
        let again: Element = back.to_string().parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(&again, &el);
        let evs = parse_all(&stream_bytes(std::slice::from_ref(&el), false, &[], false))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&evs[1], &StreamEvent::Stanza(el));
    }
}
