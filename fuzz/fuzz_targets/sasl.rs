//! Fuzz the SASL messages a client sends (crates/proto/src/sasl/): the payload decoding of
//! `<auth/>`/`<response/>` (RFC 6120 §6.4.2), PLAIN (RFC 4616), SCRAM client-first and
//! client-final (RFC 5802; server side, every mechanism, with and without channel binding),
//! FAST's HT initiator (XEP-0484), the SCRAM server-first that our client (test kit, load
//! generator) parses, and the SASL2 `<authenticate/>` (XEP-0388) as the session reads it.
//!
//! The first byte picks the case; SCRAM messages are separated by `\n` (which SCRAM never
//! uses). Beyond "no panic": payload encoding round-trips; PLAIN's fields hold no NUL and
//! are non-empty; a SCRAM server never accepts a forged client-final, and with a client
//! built from the same fuzzed user name and password it always does (and the client
//! accepts the server's signature).
#![no_main]

use libfuzzer_sys::fuzz_target;
use starling_proto::ns;
use starling_proto::sasl::ht::{self, HtMechanism};
use starling_proto::sasl::{
    decode_payload, encode_payload, parse_plain, ChannelBindingType, ChannelBindings, Mechanism,
    ScramClient, ScramCredentials, ScramHash, ScramServer,
};
use starling_xml::Element;

const MECHANISMS: [Mechanism; 6] = [
    Mechanism::ScramSha1,
    Mechanism::ScramSha256,
    Mechanism::ScramSha512,
    Mechanism::ScramSha1Plus,
    Mechanism::ScramSha256Plus,
    Mechanism::ScramSha512Plus,
];

fn bindings() -> ChannelBindings {
    ChannelBindings {
        tls_exporter: Some(vec![7u8; 32]),
        tls_server_end_point: Some(vec![9u8; 32]),
    }
}

fn credentials(hash: ScramHash, password: &str) -> Option<ScramCredentials> {
    // One iteration: the fuzzer tests parsing, not PBKDF2.
    ScramCredentials::derive(hash, password, b"fuzz-salt", 1).ok()
}

/// The server side of one SCRAM exchange with the client's two messages as given.
fn scram_server(mechanism: Mechanism, first: &[u8], last: &[u8]) {
    let Ok(mut server) = ScramServer::with_nonce(mechanism, bindings(), true, "servernonce") else {
        return;
    };
    server.set_fake_iterations(1);
    let Ok(cf) = server.client_first(first) else {
        return;
    };
    assert!(!cf.username.is_empty());
    let creds = credentials(mechanism.scram_hash().unwrap(), "pencil");
    let Ok(server_first) = server.server_first(creds.as_ref()) else {
        return;
    };
    let _ = std::str::from_utf8(&server_first).expect("server-first is UTF-8");
    // A forged client-final: the fuzzer does not know the password's keys.
    assert!(server.client_final(last).is_err(), "forged proof accepted");
    assert!(
        server.client_final(last).is_err(),
        "a finished exchange goes on"
    );
}

/// Client and server with the same fuzzed credentials must agree.
fn scram_round_trip(mechanism: Mechanism, user: &str, password: &str, authzid: Option<&str>) {
    let binding = mechanism
        .is_plus()
        .then(|| (ChannelBindingType::TlsExporter, vec![7u8; 32]));
    let Ok(client) = ScramClient::with_nonce(mechanism, user, password, binding, "clientnonce")
    else {
        return;
    };
    let mut client = match authzid {
        Some(a) => client.with_authzid(a),
        None => client,
    };
    let mut server = ScramServer::with_nonce(mechanism, bindings(), true, "servernonce").unwrap();
    // The client sends any user name and authzid it is given (found by this target: an
    // empty one after SASLprep, a NUL in the authzid); the server refuses malformed ones.
    let Ok(cf) = server.client_first(&client.client_first()) else {
        return;
    };
    let creds = credentials(mechanism.scram_hash().unwrap(), password)
        .expect("a password our client accepts derives credentials");
    let _ = cf;
    let server_first = server.server_first(Some(&creds)).unwrap();
    let client_final = client
        .client_final(&server_first)
        .expect("our server-first");
    let server_final = server
        .client_final(&client_final)
        .expect("the right password is accepted");
    client
        .verify_server_final(&server_final)
        .expect("the server's signature");
}

/// A server-first as our client (test kit, load generator) reads it.
fn scram_client(mechanism: Mechanism, server_first: &[u8], server_final: &[u8]) {
    let binding = mechanism
        .is_plus()
        .then(|| (ChannelBindingType::TlsExporter, vec![7u8; 32]));
    let mut client =
        ScramClient::with_nonce(mechanism, "user", "pencil", binding, "clientnonce").unwrap();
    let _ = client.client_first();
    // Iteration counts up to 10^7 are accepted: keep the fuzzer fast.
    if std::str::from_utf8(server_first)
        .ok()
        .and_then(|s| s.split(',').find_map(|a| a.strip_prefix("i=")))
        .and_then(|i| i.parse::<u32>().ok())
        .is_some_and(|i| i > 64)
    {
        return;
    }
    if client.client_final(server_first).is_ok() {
        assert!(
            client.verify_server_final(server_final).is_err() || server_final.starts_with(b"v=")
        );
    }
}

/// `<auth/>` or a SASL2 `<authenticate/>`, as crates/server/src/c2s/session/sasl.rs reads it.
fn element(text: &str) {
    let Ok(el) = text.parse::<Element>() else {
        return;
    };
    let initial = if el.is("authenticate", ns::SASL2) {
        el.get_child("initial-response", ns::SASL2)
            .map(|r| r.text())
            .unwrap_or_default()
    } else if el.is("auth", ns::SASL) {
        el.text()
    } else {
        return;
    };
    let mechanism = el.attr("mechanism").unwrap_or_default();
    let Ok(data) = decode_payload(initial.trim()) else {
        return;
    };
    if let Some(ht) = HtMechanism::from_name(mechanism) {
        let _ = ht.binding();
        let _ = ht::parse_initiator(&data);
    } else if let Some(m) = Mechanism::from_name(mechanism) {
        if m == Mechanism::Plain {
            let _ = parse_plain(&data);
        } else {
            scram_server(m, &data, b"");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let mechanism = MECHANISMS[usize::from(selector >> 4) % MECHANISMS.len()];
    let text = String::from_utf8_lossy(rest);
    let mut lines = rest.splitn(2, |b| *b == b'\n');
    let (a, b) = (
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
    );
    match selector % 7 {
        0 => {
            // Payload encoding: canonical base64 round-trips both ways.
            if let Ok(bytes) = decode_payload(&text) {
                if !bytes.is_empty() {
                    assert_eq!(encode_payload(&bytes), text);
                }
            }
            assert_eq!(decode_payload(&encode_payload(rest)).unwrap(), rest);
        }
        1 => {
            if let Ok((authzid, authcid, password)) = parse_plain(rest) {
                assert!(!authcid.is_empty() && !password.is_empty());
                assert!(!authzid.unwrap_or_default().contains('\0'));
                assert!(!authcid.contains('\0') && !password.contains('\0'));
            }
        }
        2 => scram_server(mechanism, a, b),
        3 => {
            let t = String::from_utf8_lossy(a);
            let mut parts = t.splitn(3, '\0');
            let (user, password, authzid) = (
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
                parts.next(),
            );
            scram_round_trip(mechanism, user, password, authzid);
        }
        4 => scram_client(mechanism, a, b),
        5 => {
            if let Ok((authcid, token)) = ht::parse_initiator(rest) {
                assert!(!authcid.contains('\0'));
                let _ = ht::verify_initiator(&token, b"cb", b"hashed");
            }
        }
        _ => element(&text),
    }
});
