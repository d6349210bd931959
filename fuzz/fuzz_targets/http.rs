//! Fuzz the HTTP inputs the listener reads itself (crates/server/src/transport/http.rs):
//! the `Host` header that XEP-0156 host-meta echoes into URLs (`endpoint_urls`) and the
//! URL path of the web chat's static files (`safe_relative_path`). The first byte picks
//! TLS; the rest is both the Host value and the path. Beyond "no panic": an accepted host
//! makes URLs with nothing to escape in XML or JSON and no way out of the authority; an
//! accepted path stays below the web root (no `..`, no absolute part, no NUL, no
//! backslash or drive letter).
#![no_main]

use libfuzzer_sys::fuzz_target;
use starling_server::fuzzing;
use std::path::Component;

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let tls = first & 1 == 1;
    if let Some((ws, bosh)) = fuzzing::host_meta_urls(rest, tls) {
        let host = std::str::from_utf8(rest).expect("an accepted host is ASCII");
        assert!(!host.is_empty() && host.len() <= 255);
        for (url, scheme, path) in [
            (&ws, ["ws", "wss"], "/xmpp-websocket"),
            (&bosh, ["http", "https"], "/http-bind"),
        ] {
            let (s, after) = url.split_once("://").expect("scheme");
            assert_eq!(s, scheme[tls as usize]);
            assert_eq!(after, format!("{host}{path}"));
            assert!(!host.contains(['<', '>', '&', '"', '\'', '\\', '/', '?', '#', '@', ' ', '%']));
        }
    }
    if let Ok(path) = std::str::from_utf8(rest) {
        if let Some(p) = fuzzing::web_path(path) {
            assert!(p.is_relative());
            for c in p.components() {
                assert!(matches!(c, Component::Normal(_)), "{path:?} → {p:?}");
            }
            let s = p.to_str().expect("from a str");
            assert!(!s.contains(['\0', '\\', ':']), "{path:?}");
        }
    }
});
