//! Fuzz the XMPP stream framer: the input (after the first byte) is fed in two reads split
//! at a point derived from the first byte, once with default and once with tiny limits.
//! Any panic is a bug; every call must return events, `Ok(None)` or an error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use starling_xml::{Limits, StreamEvent, StreamParser};

fn run(data: &[u8], split: usize, limits: Limits) {
    let mut parser = StreamParser::new(limits);
    let (a, b) = data.split_at(split.min(data.len()));
    for part in [a, b] {
        let mut input = part;
        loop {
            match parser.push(&mut input) {
                Ok(Some(StreamEvent::Stanza(el))) => {
                    // exercise the serialiser and the standalone parser on what we got
                    let text = el.to_string();
                    let back: starling_xml::Element =
                        text.parse().expect("serialised stanza must re-parse");
                    assert_eq!(back, el);
                    let _ = el.size_hint();
                }
                Ok(Some(_)) => {}
                Ok(None) => {
                    assert!(input.is_empty());
                    break;
                }
                Err(e) => {
                    let _ = e.stream_condition();
                    // poisoned parser keeps failing the same way
                    assert_eq!(parser.push(&mut &b"<x/>"[..]), Err(e));
                    return;
                }
            }
        }
    }
    let _ = (parser.pending_bytes(), parser.is_idle());
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let split = if rest.is_empty() {
        0
    } else {
        first as usize * rest.len() / 255
    };
    run(rest, split, Limits::default());
    run(
        rest,
        split,
        Limits {
            max_stanza_bytes: 128,
            max_depth: 4,
            max_attributes: 3,
            max_header_bytes: 256,
        },
    );
    // also parse the raw bytes as a standalone document
    if let Ok(s) = std::str::from_utf8(rest) {
        let _ = s.parse::<starling_xml::Element>();
    }
});
