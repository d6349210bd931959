//! Fuzz BOSH request handling up to the session (XEP-0124/0206,
//! crates/server/src/transport/bosh.rs `parse_body` and `handle_request`): a `POST
//! /http-bind` body with default and with tiny limits. Beyond "no panic": the answer is a
//! `terminate` body with one of the conditions the endpoint uses, or a new session whose
//! `rid`, `wait` and `hold` are within XEP-0124's bounds; the terminate body is well-formed XML.
#![no_main]

use libfuzzer_sys::fuzz_target;
use starling_server::fuzzing::{self, BoshOutcome};
use starling_xml::{Element, Limits};

const CONDITIONS: [&str; 4] = [
    "bad-request",
    "policy-violation",
    "host-unknown",
    "item-not-found",
];

fn run(data: &[u8], limits: Limits) {
    match fuzzing::bosh_request(data, limits) {
        BoshOutcome::Refused(terminate) => {
            let el: Element = terminate.parse().expect("a well-formed terminate body");
            assert_eq!(el.attr("type"), Some("terminate"));
            let condition = el.attr("condition").unwrap_or_default();
            assert!(CONDITIONS.contains(&condition), "{terminate}");
        }
        BoshOutcome::Created { rid, wait, hold } => {
            assert!(rid <= fuzzing::BOSH_MAX_RID);
            assert!(wait <= fuzzing::BOSH_MAX_WAIT);
            assert!(hold <= fuzzing::BOSH_MAX_HOLD);
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
