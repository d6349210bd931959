//! SCRAM client/server round trips and adversarial inputs through the public API of
//! `starling_proto::sasl`.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use proptest::prelude::*;
use starling_proto::sasl::{
    parse_plain, ChannelBindingType, ChannelBindings, Mechanism, SaslError, ScramClient,
    ScramCredentials, ScramHash, ScramServer,
};

/// Low iteration count: keeps the tests fast; the RFC vectors (unit tests) use 4096.
const ITERATIONS: u32 = 16;

const SCRAM_MECHANISMS: [Mechanism; 6] = [
    Mechanism::ScramSha1,
    Mechanism::ScramSha1Plus,
    Mechanism::ScramSha256,
    Mechanism::ScramSha256Plus,
    Mechanism::ScramSha512,
    Mechanism::ScramSha512Plus,
];

fn bindings() -> ChannelBindings {
    ChannelBindings {
        tls_exporter: Some((0u8..32).collect()),
        tls_server_end_point: Some(vec![0xAB; 32]),
    }
}

fn creds(hash: ScramHash, password: &str) -> ScramCredentials {
    ScramCredentials::generate(hash, password, ITERATIONS).unwrap()
}

/// Runs a full exchange; `Ok(())` only if the server accepted and the client verified the
/// server signature.
fn exchange(
    mechanism: Mechanism,
    server_bindings: ChannelBindings,
    plus_advertised: bool,
    client_binding: Option<(ChannelBindingType, Vec<u8>)>,
    client_password: &str,
    stored: Option<&ScramCredentials>,
) -> Result<(), SaslError> {
    let mut client = ScramClient::new(mechanism, "juliet", client_password, client_binding)?;
    let mut server = ScramServer::new(mechanism, server_bindings, plus_advertised)?;
    let first = server.client_first(&client.client_first())?;
    assert_eq!(first.username, "juliet");
    assert_eq!(first.authzid, None);
    let server_first = server.server_first(stored)?;
    let client_final = client.client_final(&server_first)?;
    let server_final = server.client_final(&client_final)?;
    client.verify_server_final(&server_final)
}

/// Drives a client to just before client-final, returning (server, client-final-message).
fn up_to_client_final(
    mechanism: Mechanism,
    client_binding: Option<(ChannelBindingType, Vec<u8>)>,
) -> (ScramServer, String) {
    let hash = mechanism.scram_hash().unwrap();
    let stored = creds(hash, "secret");
    let mut client = ScramClient::new(mechanism, "juliet", "secret", client_binding).unwrap();
    let mut server = ScramServer::new(mechanism, bindings(), true).unwrap();
    server.client_first(&client.client_first()).unwrap();
    let server_first = server.server_first(Some(&stored)).unwrap();
    let client_final = String::from_utf8(client.client_final(&server_first).unwrap()).unwrap();
    (server, client_final)
}

fn cb(ty: ChannelBindingType) -> Option<(ChannelBindingType, Vec<u8>)> {
    Some((ty, bindings().get(ty).unwrap().to_vec()))
}

#[test]
fn round_trip_all_mechanisms_all_binding_types_ok() {
    for mechanism in SCRAM_MECHANISMS {
        let hash = mechanism.scram_hash().unwrap();
        let stored = creds(hash, "r0mε0 & juliet");
        if mechanism.is_plus() {
            for ty in [
                ChannelBindingType::TlsExporter,
                ChannelBindingType::TlsServerEndPoint,
            ] {
                exchange(
                    mechanism,
                    bindings(),
                    true,
                    cb(ty),
                    "r0mε0 & juliet",
                    Some(&stored),
                )
                .unwrap_or_else(|e| panic!("{mechanism:?} {ty:?}: {e}"));
            }
        } else {
            // Without TLS bindings and with them (client not using channel binding).
            exchange(
                mechanism,
                ChannelBindings::default(),
                false,
                None,
                "r0mε0 & juliet",
                Some(&stored),
            )
            .unwrap_or_else(|e| panic!("{mechanism:?}: {e}"));
            exchange(
                mechanism,
                bindings(),
                true,
                None,
                "r0mε0 & juliet",
                Some(&stored),
            )
            .unwrap_or_else(|e| panic!("{mechanism:?} on TLS: {e}"));
        }
    }
}

#[test]
fn round_trip_y_flag_without_plus_advertised_ok() {
    let stored = creds(ScramHash::Sha256, "secret");
    exchange(
        Mechanism::ScramSha256,
        ChannelBindings::default(),
        false,
        cb(ChannelBindingType::TlsExporter),
        "secret",
        Some(&stored),
    )
    .unwrap();
}

#[test]
fn round_trip_authzid_passed_through() {
    let stored = creds(ScramHash::Sha256, "secret");
    let mut client = ScramClient::new(Mechanism::ScramSha256, "juliet", "secret", None)
        .unwrap()
        .with_authzid("juliet@example.com");
    let mut server =
        ScramServer::new(Mechanism::ScramSha256, ChannelBindings::default(), false).unwrap();
    let first = server.client_first(&client.client_first()).unwrap();
    assert_eq!(first.authzid.as_deref(), Some("juliet@example.com"));
    let sf = server.server_first(Some(&stored)).unwrap();
    let cf = client.client_final(&sf).unwrap();
    let fin = server.client_final(&cf).unwrap();
    client.verify_server_final(&fin).unwrap();
}

#[test]
fn round_trip_saslprep_equivalent_password_ok() {
    let stored = creds(ScramHash::Sha1, "IX");
    exchange(
        Mechanism::ScramSha1,
        ChannelBindings::default(),
        false,
        None,
        "\u{2168}",
        Some(&stored),
    )
    .unwrap();
}

#[test]
fn round_trip_wrong_password_not_authorized() {
    for mechanism in SCRAM_MECHANISMS {
        let stored = creds(mechanism.scram_hash().unwrap(), "secret");
        let binding = mechanism.is_plus().then(|| {
            (
                ChannelBindingType::TlsExporter,
                bindings().tls_exporter.unwrap(),
            )
        });
        let err = exchange(
            mechanism,
            bindings(),
            true,
            binding,
            "Secret",
            Some(&stored),
        )
        .unwrap_err();
        assert_eq!(
            err,
            SaslError::NotAuthorized("invalid proof"),
            "{mechanism:?}"
        );
        assert_eq!(err.condition(), "not-authorized");
    }
}

#[test]
fn round_trip_unknown_user_not_authorized_at_end() {
    for mechanism in SCRAM_MECHANISMS {
        let binding = mechanism
            .is_plus()
            .then(|| (ChannelBindingType::TlsServerEndPoint, vec![0xAB; 32]));
        let mut client = ScramClient::new(mechanism, "ghost", "secret", binding).unwrap();
        let mut server = ScramServer::new(mechanism, bindings(), true).unwrap();
        server.client_first(&client.client_first()).unwrap();
        // server-first succeeds and looks like a real one.
        let sf = server.server_first(None).unwrap();
        let sf_text = String::from_utf8(sf.clone()).unwrap();
        assert!(sf_text.starts_with("r=") && sf_text.contains(",s=") && sf_text.contains(",i="));
        let cf = client.client_final(&sf).unwrap();
        // Same error as a wrong password: no user enumeration.
        assert_eq!(
            server.client_final(&cf).unwrap_err(),
            SaslError::NotAuthorized("invalid proof")
        );
    }
}

#[test]
fn round_trip_gs2_y_when_plus_advertised_not_authorized() {
    let stored = creds(ScramHash::Sha512, "secret");
    let err = exchange(
        Mechanism::ScramSha512,
        bindings(),
        true,
        cb(ChannelBindingType::TlsExporter),
        "secret",
        Some(&stored),
    )
    .unwrap_err();
    assert_eq!(err.condition(), "not-authorized");
}

#[test]
fn round_trip_plus_mechanism_without_bindings_fails() {
    let stored = creds(ScramHash::Sha256, "secret");
    let err = exchange(
        Mechanism::ScramSha256Plus,
        ChannelBindings::default(),
        false,
        cb(ChannelBindingType::TlsExporter),
        "secret",
        Some(&stored),
    )
    .unwrap_err();
    assert_eq!(err, SaslError::InvalidMechanism);
}

#[test]
fn round_trip_tls_unique_fails() {
    let mut server = ScramServer::new(Mechanism::ScramSha1Plus, bindings(), true).unwrap();
    assert_eq!(
        server
            .client_first(b"p=tls-unique,,n=juliet,r=abcdef")
            .unwrap_err(),
        SaslError::UnsupportedChannelBinding
    );
}

#[test]
fn round_trip_binding_data_mismatch_not_authorized() {
    // Client sees different TLS binding data (a MITM terminating TLS).
    for ty in [
        ChannelBindingType::TlsExporter,
        ChannelBindingType::TlsServerEndPoint,
    ] {
        let stored = creds(ScramHash::Sha256, "secret");
        let err = exchange(
            Mechanism::ScramSha256Plus,
            bindings(),
            true,
            Some((ty, vec![0xEE; 32])),
            "secret",
            Some(&stored),
        )
        .unwrap_err();
        assert_eq!(
            err,
            SaslError::NotAuthorized("channel bindings do not match")
        );
    }
}

#[test]
fn client_final_tampered_cb_not_authorized() {
    let (mut server, cf) = up_to_client_final(
        Mechanism::ScramSha256Plus,
        cb(ChannelBindingType::TlsExporter),
    );
    let (c_attr, rest) = cf.split_once(',').unwrap();
    let mut cb_bytes = B64.decode(c_attr.strip_prefix("c=").unwrap()).unwrap();
    let last = cb_bytes.len() - 1;
    cb_bytes[last] ^= 1;
    let tampered = format!("c={},{rest}", B64.encode(cb_bytes));
    assert_eq!(
        server.client_final(tampered.as_bytes()).unwrap_err(),
        SaslError::NotAuthorized("channel bindings do not match")
    );
}

#[test]
fn client_final_cb_type_swapped_not_authorized() {
    // Header says tls-exporter, but c= claims tls-server-end-point with its data.
    let (mut server, cf) = up_to_client_final(
        Mechanism::ScramSha1Plus,
        cb(ChannelBindingType::TlsExporter),
    );
    let rest = cf.split_once(',').unwrap().1;
    let mut other = b"p=tls-server-end-point,,".to_vec();
    other.extend_from_slice(&[0xAB; 32]);
    let tampered = format!("c={},{rest}", B64.encode(other));
    assert!(matches!(
        server.client_final(tampered.as_bytes()),
        Err(SaslError::NotAuthorized(_))
    ));
}

#[test]
fn client_final_nonce_mismatch_not_authorized() {
    let (mut server, cf) = up_to_client_final(Mechanism::ScramSha512, None);
    let tampered = cf.replacen(",r=", ",r=X", 1);
    assert_eq!(
        server.client_final(tampered.as_bytes()).unwrap_err(),
        SaslError::NotAuthorized("nonce mismatch")
    );
}

#[test]
fn client_final_tampered_proof_not_authorized() {
    let (mut server, cf) = up_to_client_final(Mechanism::ScramSha256, None);
    let (head, proof) = cf.rsplit_once(",p=").unwrap();
    let mut proof = B64.decode(proof).unwrap();
    proof[0] ^= 0x80;
    let tampered = format!("{head},p={}", B64.encode(proof));
    assert_eq!(
        server.client_final(tampered.as_bytes()).unwrap_err(),
        SaslError::NotAuthorized("invalid proof")
    );
}

#[test]
fn client_final_invalid_base64_proof_malformed() {
    let (mut server, cf) = up_to_client_final(Mechanism::ScramSha1, None);
    let head = cf.rsplit_once(",p=").unwrap().0;
    let tampered = format!("{head},p=***not base64***");
    assert_eq!(
        server
            .client_final(tampered.as_bytes())
            .unwrap_err()
            .condition(),
        "malformed-request"
    );
}

#[test]
fn client_final_wrong_length_proof_malformed() {
    let (mut server, cf) = up_to_client_final(Mechanism::ScramSha256, None);
    let head = cf.rsplit_once(",p=").unwrap().0;
    let tampered = format!("{head},p={}", B64.encode([0u8; 20]));
    assert!(matches!(
        server.client_final(tampered.as_bytes()),
        Err(SaslError::MalformedRequest(_))
    ));
}

#[test]
fn client_final_malformed_messages_rejected() {
    let (_, cf) = up_to_client_final(Mechanism::ScramSha256, None);
    let (without_proof, proof) = cf.rsplit_once(",p=").unwrap();
    let nonce = without_proof.split_once(",r=").unwrap().1;
    let cases: Vec<Vec<u8>> = vec![
        Vec::new(),
        b"\xff\xfe".to_vec(),
        b"c=biws".to_vec(),
        format!("c=biws,r={nonce}").into_bytes(),
        format!("r={nonce},c=biws,p={proof}").into_bytes(),
        format!("c=biws,p={proof},r={nonce}").into_bytes(),
        format!("c=b!ws,r={nonce},p={proof}").into_bytes(),
        format!("c=biws,r={nonce},bad,p={proof}").into_bytes(),
        format!("c=biws,r={nonce},p={proof},").into_bytes(),
        format!("{without_proof},p=").into_bytes(),
        format!("{without_proof},p={proof}\u{0}").into_bytes(),
        format!("{without_proof}\u{e9},p={proof}").into_bytes(),
        {
            let mut v = format!("{without_proof},p=").into_bytes();
            v.extend_from_slice(b"\xc3\x28");
            v
        },
    ];
    for msg in cases {
        let (mut server, _) = up_to_client_final(Mechanism::ScramSha256, None);
        let err = server.client_final(&msg).unwrap_err();
        assert!(
            matches!(err.condition(), "malformed-request" | "not-authorized"),
            "{msg:?}: {err:?}"
        );
    }
}

#[test]
fn client_final_extension_before_proof_covered_by_signature() {
    // An optional extension is accepted but is part of AuthMessage, so inserting one
    // after the client signed invalidates the proof.
    let (mut server, cf) = up_to_client_final(Mechanism::ScramSha256, None);
    let (head, proof) = cf.rsplit_once(",p=").unwrap();
    let tampered = format!("{head},x=1,p={proof}");
    assert_eq!(
        server.client_final(tampered.as_bytes()).unwrap_err(),
        SaslError::NotAuthorized("invalid proof")
    );
}

#[test]
fn client_final_replayed_message_rejected() {
    let (mut server, cf) = up_to_client_final(Mechanism::ScramSha1, None);
    server.client_final(cf.as_bytes()).unwrap();
    assert!(server.client_final(cf.as_bytes()).is_err());
}

#[test]
fn client_first_non_utf8_malformed() {
    let mut server =
        ScramServer::new(Mechanism::ScramSha1, ChannelBindings::default(), false).unwrap();
    assert_eq!(
        server
            .client_first(b"n,,n=\xc0\xaf,r=abc")
            .unwrap_err()
            .condition(),
        "malformed-request"
    );
}

#[test]
fn verify_password_plain_flow_ok() {
    let stored = creds(ScramHash::Sha256, "tanstaaftanstaaf");
    let (authzid, authcid, password) = parse_plain(b"\0tim\0tanstaaftanstaaf").unwrap();
    assert_eq!(authzid, None);
    assert_eq!(authcid, "tim");
    assert!(stored.verify_password(&password));
    assert!(!stored.verify_password("tanstaaf"));
}

// ---- never panic on arbitrary input ----

fn arb_mechanism() -> impl Strategy<Value = Mechanism> {
    prop::sample::select(SCRAM_MECHANISMS.to_vec())
}

/// Bytes that are often close to valid SCRAM syntax.
fn scramish() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200),
        "[npy=a-z,=0-9A-Z+/\\-]{0,80}".prop_map(String::into_bytes),
        (
            prop::sample::select(vec![
                "n,,",
                "y,,",
                "p=tls-exporter,,",
                "p=tls-server-end-point,,",
                "p=tls-unique,,",
                "n,a=x,",
                "n,a=,",
                "c=",
                "r=",
                "v=",
                "e=",
            ]),
            "[a-zA-Z0-9=,+/]{0,60}"
        )
            .prop_map(|(p, s)| format!("{p}{s}").into_bytes()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn scram_server_client_first_arbitrary_bytes_no_panic(
        m in arb_mechanism(), plus in any::<bool>(), msg in scramish()
    ) {
        let mut server = ScramServer::new(m, bindings(), plus).unwrap();
        if server.client_first(&msg).is_ok() {
            let _ = server.server_first(None).unwrap();
        }
    }

    #[test]
    fn scram_server_client_final_arbitrary_bytes_no_panic(
        m in arb_mechanism(), msg in scramish()
    ) {
        let binding = m.is_plus().then(|| (ChannelBindingType::TlsExporter, bindings().tls_exporter.unwrap()));
        let mut client = ScramClient::new(m, "juliet", "pw", binding).unwrap();
        let mut server = ScramServer::new(m, bindings(), true).unwrap();
        server.client_first(&client.client_first()).unwrap();
        server.server_first(None).unwrap();
        prop_assert!(server.client_final(&msg).is_err());
    }

    #[test]
    fn scram_server_client_final_mutated_valid_message_rejected(
        m in arb_mechanism(), pos in any::<prop::sample::Index>(), bit in 0u8..8
    ) {
        let binding = m.is_plus().then(|| (ChannelBindingType::TlsServerEndPoint, vec![0xAB; 32]));
        let (mut server, cf) = up_to_client_final(m, binding);
        let mut bytes = cf.into_bytes();
        let i = pos.index(bytes.len());
        bytes[i] ^= 1 << bit;
        // Any single-bit change must be rejected (never panic, never accept).
        prop_assert!(server.client_final(&bytes).is_err());
    }

    #[test]
    fn scram_client_steps_arbitrary_bytes_no_panic(
        m in arb_mechanism(), sf in scramish(), fin in scramish()
    ) {
        let binding = m.is_plus().then(|| (ChannelBindingType::TlsExporter, vec![1; 32]));
        let mut client = ScramClient::new(m, "juliet", "pw", binding).unwrap();
        client.client_first();
        prop_assert!(client.client_final(&sf).is_err());
        prop_assert!(client.verify_server_final(&fin).is_err());
    }

    #[test]
    fn scram_client_server_first_with_our_nonce_no_panic(
        m in arb_mechanism(), tail in "[a-zA-Z0-9=,+/]{0,40}"
    ) {
        let mut client = ScramClient::with_nonce(m, "juliet", "pw",
            m.is_plus().then(|| (ChannelBindingType::TlsExporter, vec![1; 32])), "abc").unwrap();
        let sf = format!("r=abcd,s=c2FsdA==,i=3{tail}");
        if let Ok(cf) = client.client_final(sf.as_bytes()) {
            let _ = client.verify_server_final(&cf);
        }
    }

    #[test]
    fn parse_plain_arbitrary_bytes_no_panic(msg in prop::collection::vec(any::<u8>(), 0..100)) {
        if let Ok((authzid, authcid, password)) = parse_plain(&msg) {
            prop_assert!(!authcid.is_empty() && !password.is_empty());
            prop_assert!(authzid.is_none_or(|a| !a.is_empty()));
        }
    }

    #[test]
    fn saslprep_arbitrary_string_no_panic(s in any::<String>()) {
        let _ = starling_proto::sasl::saslprep(&s);
    }

    #[test]
    fn decode_payload_arbitrary_string_no_panic(s in any::<String>()) {
        let _ = starling_proto::sasl::decode_payload(&s);
    }
}
