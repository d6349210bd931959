//! Fuzz JIDs (RFC 7622) as the server reads them: the `jid` crate behind
//! `starling_proto::{Jid, BareJid, FullJid}` (stringprep/PRECIS normalisation, length
//! limits) and the `to`/`from` attributes of a stanza (`Stanza::from_element`,
//! crates/proto/src/stanza.rs). Beyond "no panic": a parsed JID's string form parses,
//! normalising twice reaches a fixed point, its bare part is a bare JID, full and bare
//! parsers agree with the general one, and each part is 1–1023 bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use starling_proto::{BareJid, FullJid, Jid, Stanza};
use starling_xml::Element;

fn check(s: &str) {
    let Ok(j) = Jid::new(s) else {
        assert!(
            BareJid::new(s).is_err() && FullJid::new(s).is_err(),
            "{s:?}"
        );
        return;
    };
    let text = j.to_string();
    let again = Jid::new(&text).expect("a JID's string form parses");
    // Normalisation is not always idempotent in the jid crate (found by this target:
    // "mϹx" → "mΣx" → "mσx", U+03F9 is unassigned in stringprep's Unicode 3.2 but
    // NFKC-mapped); the second form must be a fixed point.
    let third = Jid::new(&again.to_string()).expect("a JID's string form parses");
    assert_eq!(third, again, "{s:?} → {text:?} → {again}");
    let bare = again.to_bare();
    assert_eq!(BareJid::new(bare.as_str()).expect("bare part"), bare);
    for part in [
        j.node().map(|n| n.as_str()),
        Some(j.domain().as_str()),
        j.resource().map(|r| r.as_str()),
    ]
    .into_iter()
    .flatten()
    {
        assert!(!part.is_empty() && part.len() <= 1023, "{s:?}");
    }
    match j.resource() {
        Some(_) => assert!(FullJid::new(s).is_ok() && BareJid::new(s).is_err(), "{s:?}"),
        None => assert!(BareJid::new(s).is_ok() && FullJid::new(s).is_err(), "{s:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    check(s);
    // As the `to` and `from` of a stanza.
    let mut el = Element::new("message", "jabber:client");
    el.set_attr("to", s);
    el.set_attr("from", s);
    if let Ok(stanza) = Stanza::from_element(el) {
        let to = stanza.to().expect("a valid to");
        let again = Jid::new(&to.to_string()).expect("a stanza's to re-parses");
        assert_eq!(Jid::new(&again.to_string()).unwrap(), again);
    }
});
