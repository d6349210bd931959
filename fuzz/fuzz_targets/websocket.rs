//! Fuzz XMPP over WebSocket's parsing (RFC 7395, crates/server/src/transport/websocket.rs):
//! one `StreamParser::for_elements` per stream, fed one text message at a time, where a
//! message must hold whole elements. The input is a sequence of messages separated by
//! 0xFF (a byte that never occurs in UTF-8), parsed once with default and once with tiny
//! limits. Beyond "no panic": every element that comes out is within the limits, serialises
//! and re-parses to itself, and a message the parser leaves mid-element is detected
//! (`pending_bytes() > 0`), never silently merged with the next one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use starling_xml::{Element, Limits, StreamEvent, StreamParser};

/// Nesting depth (the element itself is 1) and the most attributes on one element.
fn shape(el: &Element) -> (usize, usize) {
    el.children()
        .map(shape)
        .fold((1, el.attrs().count()), |(d, a), (cd, ca)| {
            (d.max(cd + 1), a.max(ca))
        })
}

fn run(data: &[u8], limits: Limits) {
    let mut parser = StreamParser::for_elements(limits);
    for message in data.split(|b| *b == 0xFF) {
        // websocket.rs refuses a message over the stanza limit before parsing it.
        if message.len() > limits.max_stanza_bytes {
            continue;
        }
        let mut input = message;
        loop {
            match parser.push(&mut input) {
                Ok(Some(StreamEvent::Stanza(el))) => {
                    let (depth, attrs) = shape(&el);
                    assert!(depth <= limits.max_depth, "{depth} levels");
                    assert!(attrs <= limits.max_attributes, "{attrs} attributes");
                    let text = el.to_string();
                    let back: Element = text.parse().expect("serialised element must re-parse");
                    assert_eq!(back, el);
                }
                // websocket.rs ends the stream: `<open/>` is an element, not a header.
                Ok(Some(StreamEvent::Open(_) | StreamEvent::Close)) => return,
                Ok(None) => {
                    assert!(input.is_empty());
                    if parser.pending_bytes() != 0 {
                        // not-well-formed: an element split over two messages
                        return;
                    }
                    break;
                }
                Err(e) => {
                    let _ = e.stream_condition();
                    return;
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    run(data, Limits::default());
    run(
        data,
        Limits {
            max_stanza_bytes: 128,
            max_depth: 4,
            max_attributes: 3,
            max_header_bytes: 256,
        },
    );
});
