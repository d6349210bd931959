//! Fuzz XEP-0082 DateTime parsing (crates/proto/src/datetime.rs `parse_xep0082`, read from
//! archive query forms, `<delay/>` and stream management). Beyond "no panic": what parses
//! is a valid instant, and formatting it (`xep0082_datetime`, milliseconds, UTC) and
//! parsing that again gives the same instant to the millisecond.
#![no_main]

use libfuzzer_sys::fuzz_target;
use starling_proto::datetime::{parse_xep0082, xep0082_datetime};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let Some(micros) = parse_xep0082(s) else {
        return;
    };
    if micros < 0 {
        // Before 1970: formatting takes milliseconds since the epoch (unsigned).
        return;
    }
    let millis = micros / 1000;
    let text = xep0082_datetime(millis as u128);
    let again = parse_xep0082(&text).unwrap_or_else(|| panic!("{s:?} → {text:?} does not parse"));
    assert_eq!(again, millis * 1000, "{s:?} → {text:?}");
});
