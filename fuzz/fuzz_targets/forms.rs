//! Fuzz XEP-0004 data forms as submitted by clients (crates/core/src/forms.rs
//! `Submitted`, used by room configuration, pubsub node configuration and registration).
//! The input is an XML element. Beyond "no panic": every field's typed reading agrees with
//! its values, and a form rebuilt with `FormBuilder` from what was read, serialised and
//! parsed again, reads back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use starling_core::forms::{FormBuilder, Submitted};
use starling_xml::Element;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(x) = text.parse::<Element>() else {
        return;
    };
    let form = Submitted::parse(&x);
    let _ = form.form_type();
    let vars: Vec<String> = form.vars().map(str::to_owned).collect();
    let mut rebuilt = FormBuilder::new(&form.kind, None);
    let mut seen = std::collections::HashSet::new();
    for var in &vars {
        let values = form.values(var).expect("a listed field has values");
        match form.single(var) {
            Ok(Some(v)) => assert!(values.len() <= 1 && values.first().map_or("", |s| s) == v),
            Ok(None) => unreachable!("{var:?} is present"),
            Err(_) => assert!(values.len() > 1),
        }
        if let Ok(Some(b)) = form.boolean(var) {
            let v = values[0].trim();
            assert_eq!(b, v == "1" || v == "true");
        }
        // The last occurrence wins: rebuild with that one only.
        if seen.insert(var.clone()) {
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            rebuilt = rebuilt.field(var, "text-multi", None, &values);
        }
    }
    let wire = rebuilt.build().to_string();
    let back = Submitted::parse(&wire.parse::<Element>().expect("a built form re-parses"));
    assert_eq!(back.kind, form.kind);
    for var in &vars {
        assert_eq!(back.values(var), form.values(var), "{var:?}");
    }
});
