//! Shared helpers for the integration tests.
#![allow(dead_code)]

use starling_xml::{Limits, StreamEvent, StreamParser, XmlError};

/// A client stream header as sent in RFC 6120 §4.7 / §9 examples.
pub const HEADER: &str = "<stream:stream xmlns='jabber:client' \
    xmlns:stream='http://etherx.jabber.org/streams' to='im.example.com' \
    version='1.0' xml:lang='en'>";

/// Feed all of `input` in one go, collecting events until input is exhausted or an error.
pub fn feed(parser: &mut StreamParser, mut input: &[u8]) -> Result<Vec<StreamEvent>, XmlError> {
    let mut out = Vec::new();
    loop {
        let before = input.len();
        match parser.push(&mut input)? {
            Some(ev) => out.push(ev),
            None => {
                assert!(input.is_empty(), "Ok(None) with {} bytes left", input.len());
                return Ok(out);
            }
        }
        assert!(input.len() <= before);
    }
}

/// Parse a whole input with default limits.
pub fn parse_all(input: &[u8]) -> Result<Vec<StreamEvent>, XmlError> {
    feed(&mut StreamParser::new(Limits::default()), input)
}

/// Parse and return the events plus the terminating error (if any).
pub fn parse_until_error(input: &[u8]) -> (Vec<StreamEvent>, Option<XmlError>) {
    parse_until_error_with(input, Limits::default())
}

/// Like [`parse_until_error`] with custom limits.
pub fn parse_until_error_with(
    mut input: &[u8],
    limits: Limits,
) -> (Vec<StreamEvent>, Option<XmlError>) {
    let mut parser = StreamParser::new(limits);
    let mut out = Vec::new();
    loop {
        match parser.push(&mut input) {
            Ok(Some(ev)) => out.push(ev),
            Ok(None) => return (out, None),
            Err(e) => return (out, Some(e)),
        }
    }
}

/// The stream error condition produced by `input`, panicking if it parses cleanly.
pub fn condition_of(input: &[u8]) -> &'static str {
    match parse_until_error(input) {
        (_, Some(e)) => e.stream_condition(),
        (evs, None) => panic!("expected an error, got events {evs:?}"),
    }
}

/// Header followed by `body`.
pub fn stream_with(body: &str) -> Vec<u8> {
    format!("{HEADER}{body}").into_bytes()
}
