//! Unit tests: RFC test vectors, parser details, SASLprep, PLAIN.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;

use super::scram::{ClientFirst, ScramClient, ScramServer};
use super::*;

fn b64(s: &str) -> Vec<u8> {
    B64.decode(s).unwrap()
}

fn exporter_only() -> ChannelBindings {
    ChannelBindings {
        tls_exporter: Some(vec![7u8; 32]),
        tls_server_end_point: None,
    }
}

fn both_bindings() -> ChannelBindings {
    ChannelBindings {
        tls_exporter: Some(vec![7u8; 32]),
        tls_server_end_point: Some(vec![9u8; 32]),
    }
}

// ---- RFC 5802 §5 (SCRAM-SHA-1) and RFC 7677 §3 (SCRAM-SHA-256) vectors ----

struct Vector {
    mechanism: Mechanism,
    client_nonce: &'static str,
    server_nonce: &'static str,
    salt: &'static str,
    client_first: &'static str,
    server_first: &'static str,
    client_final: &'static str,
    server_final: &'static str,
}

const RFC5802_SHA1: Vector = Vector {
    mechanism: Mechanism::ScramSha1,
    client_nonce: "fyko+d2lbbFgONRv9qkxdawL",
    server_nonce: "3rfcNHYJY1ZVvWVs7j",
    salt: "QSXCR+Q6sek8bf92",
    client_first: "n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL",
    server_first: "r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096",
    client_final:
        "c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=",
    server_final: "v=rmF9pqV8S7suAoZWja4dJRkFsKQ=",
};

const RFC7677_SHA256: Vector = Vector {
    mechanism: Mechanism::ScramSha256,
    client_nonce: "rOprNGfwEbeRWgbNEkqO",
    server_nonce: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
    salt: "W22ZaJ0SNY7soEsUEjb6gQ==",
    client_first: "n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
    server_first: "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
    client_final: "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
    server_final: "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
};

fn check_server_vector(v: &Vector) {
    let hash = v.mechanism.scram_hash().unwrap();
    let creds = ScramCredentials::derive(hash, "pencil", &b64(v.salt), 4096).unwrap();
    let mut server = ScramServer::with_nonce(
        v.mechanism,
        ChannelBindings::default(),
        false,
        v.server_nonce,
    )
    .unwrap();
    let first = server.client_first(v.client_first.as_bytes()).unwrap();
    assert_eq!(
        first,
        ClientFirst {
            username: "user".into(),
            authzid: None
        }
    );
    assert_eq!(
        server.server_first(Some(&creds)).unwrap(),
        v.server_first.as_bytes()
    );
    assert_eq!(
        server.client_final(v.client_final.as_bytes()).unwrap(),
        v.server_final.as_bytes()
    );
}

fn check_client_vector(v: &Vector) {
    let mut client =
        ScramClient::with_nonce(v.mechanism, "user", "pencil", None, v.client_nonce).unwrap();
    assert_eq!(client.client_first(), v.client_first.as_bytes());
    let final_msg = client.client_final(v.server_first.as_bytes()).unwrap();
    assert_eq!(final_msg, v.client_final.as_bytes());
    client
        .verify_server_final(v.server_final.as_bytes())
        .unwrap();
    // RFC 5802 §5.1: a client that kept the salted password gets the same
    // proof without PBKDF2; a kept one for another salt or count is not
    // used (a wrong password would not verify).
    let kept = client.salted_password().cloned();
    assert!(kept.is_some());
    let mut again = ScramClient::with_nonce(v.mechanism, "user", "pencil", None, v.client_nonce)
        .unwrap()
        .with_salted_password(kept);
    again.client_first();
    assert_eq!(
        again.client_final(v.server_first.as_bytes()).unwrap(),
        v.client_final.as_bytes()
    );
    let mut wrong =
        ScramClient::with_nonce(v.mechanism, "user", "other", None, v.client_nonce).unwrap();
    wrong.client_first();
    let other_first = format!("r={}srv,s=YWJjZA==,i=4096", v.client_nonce);
    wrong.client_final(other_first.as_bytes()).unwrap();
    assert!(wrong.salted_password().is_some());
    let mut other_salt =
        ScramClient::with_nonce(v.mechanism, "user", "pencil", None, v.client_nonce)
            .unwrap()
            .with_salted_password(wrong.salted_password().cloned());
    other_salt.client_first();
    assert_eq!(
        other_salt.client_final(v.server_first.as_bytes()).unwrap(),
        v.client_final.as_bytes()
    );
}

#[test]
fn scram_server_rfc5802_sha1_vector_matches() {
    check_server_vector(&RFC5802_SHA1);
}

#[test]
fn scram_client_rfc5802_sha1_vector_matches() {
    check_client_vector(&RFC5802_SHA1);
}

#[test]
fn scram_server_rfc7677_sha256_vector_matches() {
    check_server_vector(&RFC7677_SHA256);
}

#[test]
fn scram_client_rfc7677_sha256_vector_matches() {
    check_client_vector(&RFC7677_SHA256);
}

#[test]
fn credentials_rfc5802_vector_keys_match_client_derivation() {
    // StoredKey/ServerKey for "pencil" as derived by the client must verify the password.
    let creds =
        ScramCredentials::derive(ScramHash::Sha1, "pencil", &b64(RFC5802_SHA1.salt), 4096).unwrap();
    assert_eq!(creds.stored_key.len(), 20);
    assert_eq!(creds.server_key.len(), 20);
    assert!(creds.verify_password("pencil"));
    assert!(!creds.verify_password("pencil "));
}

#[test]
fn scram_client_rfc_vector_wrong_server_signature_rejected() {
    let v = &RFC7677_SHA256;
    let mut client =
        ScramClient::with_nonce(v.mechanism, "user", "pencil", None, v.client_nonce).unwrap();
    client.client_first();
    client.client_final(v.server_first.as_bytes()).unwrap();
    assert_eq!(
        client.verify_server_final(b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ="),
        Err(SaslError::NotAuthorized("server signature mismatch"))
    );
    assert!(matches!(
        client.verify_server_final(b"e=invalid-proof"),
        Err(SaslError::NotAuthorized(_))
    ));
    assert!(client.verify_server_final(b"v=!!").is_err());
    assert!(client.verify_server_final(b"").is_err());
}

#[test]
fn scram_client_verify_before_final_rejected() {
    let client = ScramClient::new(Mechanism::ScramSha1, "user", "pencil", None).unwrap();
    assert!(client.verify_server_final(b"v=AAAA").is_err());
}

// ---- Credentials ----

#[test]
fn credentials_derive_zero_iterations_rejected() {
    assert!(matches!(
        ScramCredentials::derive(ScramHash::Sha256, "pw", b"salt", 0),
        Err(SaslError::Internal(_))
    ));
}

#[test]
fn credentials_derive_empty_salt_rejected() {
    assert!(ScramCredentials::derive(ScramHash::Sha256, "pw", b"", 1).is_err());
}

#[test]
fn credentials_derive_prohibited_password_rejected() {
    assert_eq!(
        ScramCredentials::derive(ScramHash::Sha256, "a\u{7}b", b"salt", 1),
        Err(SaslError::Saslprep)
    );
}

#[test]
fn credentials_generate_fresh_salt_differs() {
    let a = ScramCredentials::generate(ScramHash::Sha512, "pw", 2).unwrap();
    let b = ScramCredentials::generate(ScramHash::Sha512, "pw", 2).unwrap();
    assert_eq!(a.salt.len(), 16);
    assert_ne!(a.salt, b.salt);
    assert_eq!(a.stored_key.len(), 64);
    assert!(a.verify_password("pw") && b.verify_password("pw"));
}

#[test]
fn credentials_verify_password_saslprepped_equivalent_accepted() {
    // U+00AD is mapped to nothing, U+2168 (ROMAN NUMERAL NINE) to "IX".
    let creds = ScramCredentials::derive(ScramHash::Sha256, "IX", b"salt", 2).unwrap();
    assert!(creds.verify_password("I\u{AD}X"));
    assert!(creds.verify_password("\u{2168}"));
    assert!(!creds.verify_password("ix"));
    assert!(!creds.verify_password("\u{7}"));
}

#[test]
fn credentials_verify_password_corrupted_false() {
    let mut creds = ScramCredentials::derive(ScramHash::Sha1, "pw", b"salt", 2).unwrap();
    creds.iterations = 0;
    assert!(!creds.verify_password("pw"));
    let mut creds = ScramCredentials::derive(ScramHash::Sha1, "pw", b"salt", 2).unwrap();
    creds.stored_key.pop();
    assert!(!creds.verify_password("pw"));
}

// ---- SASLprep (RFC 4013 §3 examples) ----

#[test]
fn saslprep_soft_hyphen_mapped_to_nothing() {
    assert_eq!(saslprep("I\u{AD}X").unwrap(), "IX");
}

#[test]
fn saslprep_ascii_unchanged() {
    assert_eq!(saslprep("user").unwrap(), "user");
    assert_eq!(saslprep("USER").unwrap(), "USER");
}

#[test]
fn saslprep_feminine_ordinal_normalized_to_a() {
    assert_eq!(saslprep("\u{AA}").unwrap(), "a");
}

#[test]
fn saslprep_roman_numeral_nine_normalized_to_ix() {
    assert_eq!(saslprep("\u{2168}").unwrap(), "IX");
}

#[test]
fn saslprep_non_ascii_space_mapped_to_space() {
    assert_eq!(saslprep("a\u{A0}b").unwrap(), "a b");
}

#[test]
fn saslprep_control_character_rejected() {
    assert_eq!(saslprep("\u{7}"), Err(SaslError::Saslprep));
}

#[test]
fn saslprep_bidi_violation_rejected() {
    assert_eq!(saslprep("\u{627}1"), Err(SaslError::Saslprep));
}

// ---- client-first-message parsing ----

fn server(mechanism: Mechanism, bindings: ChannelBindings, plus: bool) -> ScramServer {
    ScramServer::new(mechanism, bindings, plus).unwrap()
}

#[test]
fn scram_server_new_plain_invalid_mechanism() {
    assert_eq!(
        ScramServer::new(Mechanism::Plain, both_bindings(), true).unwrap_err(),
        SaslError::InvalidMechanism
    );
}

#[test]
fn scram_server_new_plus_without_bindings_invalid_mechanism() {
    for m in [
        Mechanism::ScramSha1Plus,
        Mechanism::ScramSha256Plus,
        Mechanism::ScramSha512Plus,
    ] {
        assert_eq!(
            ScramServer::new(m, ChannelBindings::default(), true).unwrap_err(),
            SaslError::InvalidMechanism
        );
    }
}

#[test]
fn client_first_authzid_decoded() {
    let mut s = server(Mechanism::ScramSha256, ChannelBindings::default(), false);
    let first = s
        .client_first(b"n,a=juliet@example.com,n=ju=2Cliet=3D,r=abc")
        .unwrap();
    assert_eq!(first.username, "ju,liet=");
    assert_eq!(first.authzid.as_deref(), Some("juliet@example.com"));
}

#[test]
fn client_first_bad_authzid_escape_invalid_authzid() {
    for msg in [
        &b"n,a=ju=2liet,n=user,r=abc"[..],
        b"n,a=,n=user,r=abc",
        b"n,a=x=,n=user,r=abc",
    ] {
        let mut s = server(Mechanism::ScramSha256, ChannelBindings::default(), false);
        assert_eq!(s.client_first(msg).unwrap_err(), SaslError::InvalidAuthzid);
    }
}

#[test]
fn client_first_username_saslprepped() {
    let mut s = server(Mechanism::ScramSha1, ChannelBindings::default(), false);
    let first = s.client_first("n,,n=I\u{AD}X,r=abc".as_bytes()).unwrap();
    assert_eq!(first.username, "IX");
}

#[test]
fn client_first_prohibited_username_rejected() {
    let mut s = server(Mechanism::ScramSha1, ChannelBindings::default(), false);
    assert_eq!(
        s.client_first("n,,n=a\u{7},r=abc".as_bytes())
            .unwrap_err()
            .condition(),
        "malformed-request"
    );
}

#[test]
fn client_first_mandatory_extension_rejected() {
    let mut s = server(Mechanism::ScramSha1, ChannelBindings::default(), false);
    assert!(matches!(
        s.client_first(b"n,,m=foo,n=user,r=abc"),
        Err(SaslError::MalformedRequest(_))
    ));
}

#[test]
fn client_first_optional_extension_accepted() {
    let mut s = server(Mechanism::ScramSha1, ChannelBindings::default(), false);
    assert!(s.client_first(b"n,,n=user,r=abc,x=ext").is_ok());
}

#[test]
fn client_first_malformed_messages_rejected() {
    let cases: &[&[u8]] = &[
        b"",
        b"n",
        b"n,",
        b"n,,",
        b"n,,n=user",
        b"n,,n=,r=abc",
        b"n,,n=user,r=",
        b"n,,r=abc,n=user",
        b"n,,n=us=er,r=abc",
        b"x,,n=user,r=abc",
        b"p,,n=user,r=abc",
        b"N,,n=user,r=abc",
        b"n,b=x,n=user,r=abc",
        b"n,,n=user,r=abc,bogus",
        b"n,,n=user,r=a\x7fb",
        b"n,,n=user,r=abc,",
        b"n,,n=\xff,r=abc",
        b"\xc3\x28,,n=user,r=abc",
        b"n,,n=us\0er,r=abc",
    ];
    for msg in cases {
        let mut s = server(Mechanism::ScramSha256, ChannelBindings::default(), false);
        let err = s.client_first(msg).unwrap_err();
        assert!(
            matches!(err.condition(), "malformed-request" | "invalid-authzid"),
            "{msg:?}: {err:?}"
        );
    }
}

#[test]
fn client_first_y_flag_with_plus_advertised_not_authorized() {
    let mut s = server(Mechanism::ScramSha256, both_bindings(), true);
    assert_eq!(
        s.client_first(b"y,,n=user,r=abc").unwrap_err(),
        SaslError::NotAuthorized("channel binding downgrade")
    );
}

#[test]
fn client_first_y_flag_without_plus_advertised_accepted() {
    let mut s = server(Mechanism::ScramSha256, ChannelBindings::default(), false);
    assert!(s.client_first(b"y,,n=user,r=abc").is_ok());
}

#[test]
fn client_first_p_flag_with_non_plus_mechanism_rejected() {
    let mut s = server(Mechanism::ScramSha256, both_bindings(), true);
    assert!(matches!(
        s.client_first(b"p=tls-exporter,,n=user,r=abc"),
        Err(SaslError::MalformedRequest(_))
    ));
}

#[test]
fn client_first_n_flag_with_plus_mechanism_rejected() {
    for flag in ["n", "y"] {
        let mut s = server(Mechanism::ScramSha256Plus, both_bindings(), true);
        let msg = format!("{flag},,n=user,r=abc");
        assert!(s.client_first(msg.as_bytes()).is_err());
    }
}

#[test]
fn client_first_tls_unique_unsupported_channel_binding() {
    let mut s = server(Mechanism::ScramSha256Plus, both_bindings(), true);
    let err = s.client_first(b"p=tls-unique,,n=user,r=abc").unwrap_err();
    assert_eq!(err, SaslError::UnsupportedChannelBinding);
    assert_eq!(err.condition(), "not-authorized");
}

#[test]
fn client_first_type_not_offered_unsupported_channel_binding() {
    let mut s = server(Mechanism::ScramSha1Plus, exporter_only(), true);
    assert_eq!(
        s.client_first(b"p=tls-server-end-point,,n=user,r=abc")
            .unwrap_err(),
        SaslError::UnsupportedChannelBinding
    );
}

#[test]
fn client_first_invalid_cb_name_rejected() {
    for flag in ["p=", "p=tls_exporter", "p=tls exporter"] {
        let mut s = server(Mechanism::ScramSha1Plus, exporter_only(), true);
        let msg = format!("{flag},,n=user,r=abc");
        assert!(matches!(
            s.client_first(msg.as_bytes()),
            Err(SaslError::MalformedRequest(_))
        ));
    }
}

#[test]
fn client_first_offered_type_records_channel_binding() {
    let mut s = server(Mechanism::ScramSha512Plus, both_bindings(), true);
    s.client_first(b"p=tls-server-end-point,,n=user,r=abc")
        .unwrap();
    assert_eq!(
        s.channel_binding(),
        Some(ChannelBindingType::TlsServerEndPoint)
    );
}

// ---- state machine ----

#[test]
fn scram_server_out_of_order_calls_rejected() {
    let mut s = server(Mechanism::ScramSha1, ChannelBindings::default(), false);
    assert!(s.server_first(None).is_err());
    assert!(s.client_final(b"c=biws,r=abc,p=AAAA").is_err());
    // Any error is final.
    assert!(s.client_first(b"n,,n=user,r=abc").is_err());

    let mut s = server(Mechanism::ScramSha1, ChannelBindings::default(), false);
    s.client_first(b"n,,n=user,r=abc").unwrap();
    assert!(s.client_first(b"n,,n=user,r=abc").is_err());
    assert!(s.server_first(None).is_err());
}

#[test]
fn scram_server_error_in_client_final_is_final() {
    let creds = ScramCredentials::derive(ScramHash::Sha1, "pencil", b"salt", 2).unwrap();
    let mut client = ScramClient::new(Mechanism::ScramSha1, "user", "pencil", None).unwrap();
    let mut s = server(Mechanism::ScramSha1, ChannelBindings::default(), false);
    s.client_first(&client.client_first()).unwrap();
    let sf = s.server_first(Some(&creds)).unwrap();
    let cf = client.client_final(&sf).unwrap();
    assert!(s.client_final(b"garbage").is_err());
    // The correct message no longer helps: no second try on the same exchange.
    assert!(s.client_final(&cf).is_err());
}

#[test]
fn scram_server_credentials_for_other_hash_internal() {
    let creds = ScramCredentials::derive(ScramHash::Sha1, "pencil", b"salt", 2).unwrap();
    let mut s = server(Mechanism::ScramSha256, ChannelBindings::default(), false);
    s.client_first(b"n,,n=user,r=abc").unwrap();
    let err = s.server_first(Some(&creds)).unwrap_err();
    assert!(matches!(err, SaslError::Internal(_)));
    assert_eq!(err.condition(), "temporary-auth-failure");
}

#[test]
fn scram_server_corrupted_credentials_internal() {
    let mut creds = ScramCredentials::derive(ScramHash::Sha1, "pencil", b"salt", 2).unwrap();
    creds.server_key.clear();
    let mut s = server(Mechanism::ScramSha1, ChannelBindings::default(), false);
    s.client_first(b"n,,n=user,r=abc").unwrap();
    assert!(matches!(
        s.server_first(Some(&creds)),
        Err(SaslError::Internal(_))
    ));
}

fn fake_server_first(username: &str, iterations: Option<u32>) -> String {
    let mut s = server(Mechanism::ScramSha256, ChannelBindings::default(), false);
    if let Some(i) = iterations {
        s.set_fake_iterations(i);
    }
    s.client_first(format!("n,,n={username},r=abc").as_bytes())
        .unwrap();
    let sf = String::from_utf8(s.server_first(None).unwrap()).unwrap();
    // Strip the nonce, which is fresh each time.
    sf.split_once(",s=").unwrap().1.to_owned()
}

#[test]
fn scram_server_unknown_user_fake_salt_deterministic_per_username() {
    assert_eq!(
        fake_server_first("ghost", None),
        fake_server_first("ghost", None)
    );
    assert_ne!(
        fake_server_first("ghost", None),
        fake_server_first("ghost2", None)
    );
    assert!(fake_server_first("ghost", None).ends_with(",i=4096"));
    assert!(fake_server_first("ghost", Some(10000)).ends_with(",i=10000"));
    // Salt looks like a real 16-byte salt.
    let sf = fake_server_first("ghost", None);
    let salt = sf.split_once(",i=").unwrap().0;
    assert_eq!(b64(salt).len(), 16);
}

#[test]
fn scram_server_debug_hides_secrets() {
    let s = server(Mechanism::ScramSha1, ChannelBindings::default(), false);
    let text = format!("{s:?}");
    assert!(text.contains("ScramSha1"));
    let c = ScramClient::new(Mechanism::ScramSha1, "user", "hunter2", None).unwrap();
    assert!(!format!("{c:?}").contains("hunter2"));
}

// ---- ScramClient construction ----

#[test]
fn scram_client_new_plain_invalid_mechanism() {
    assert_eq!(
        ScramClient::new(Mechanism::Plain, "u", "p", None).unwrap_err(),
        SaslError::InvalidMechanism
    );
}

#[test]
fn scram_client_new_plus_without_binding_rejected() {
    assert_eq!(
        ScramClient::new(Mechanism::ScramSha256Plus, "u", "p", None).unwrap_err(),
        SaslError::UnsupportedChannelBinding
    );
}

#[test]
fn scram_client_first_flags_and_escaping() {
    let mut c = ScramClient::with_nonce(Mechanism::ScramSha1, "a,b=c", "p", None, "xyz").unwrap();
    assert_eq!(c.client_first(), b"n,,n=a=2Cb=3Dc,r=xyz");
    let mut c = ScramClient::with_nonce(
        Mechanism::ScramSha1,
        "u",
        "p",
        Some((ChannelBindingType::TlsExporter, vec![1])),
        "xyz",
    )
    .unwrap();
    assert_eq!(c.client_first(), b"y,,n=u,r=xyz");
    let mut c = ScramClient::with_nonce(
        Mechanism::ScramSha1Plus,
        "u",
        "p",
        Some((ChannelBindingType::TlsServerEndPoint, vec![1])),
        "xyz",
    )
    .unwrap()
    .with_authzid("u@example.com");
    assert_eq!(
        c.client_first(),
        b"p=tls-server-end-point,a=u@example.com,n=u,r=xyz"
    );
}

#[test]
fn scram_client_final_bad_server_first_rejected() {
    let cases: &[&[u8]] = &[
        b"",
        b"r=xyz,s=c2FsdA==,i=1",              // nonce not extended
        b"r=abcdef,s=c2FsdA==,i=1",           // foreign nonce
        b"r=xyzabc,s=!!,i=1",                 // bad base64
        b"r=xyzabc,s=,i=1",                   // empty salt
        b"r=xyzabc,s=c2FsdA==,i=0",           // zero iterations
        b"r=xyzabc,s=c2FsdA==,i=+1",          // not digits
        b"r=xyzabc,s=c2FsdA==,i=99999999999", // overflow
        b"r=xyzabc,s=c2FsdA==,i=4294967295",  // too expensive
        b"r=xyzabc,s=c2FsdA==",
        b"m=x,r=xyzabc,s=c2FsdA==,i=1",
        b"r=xyzabc,s=c2FsdA==,i=1,bad",
        b"\xff",
    ];
    for msg in cases {
        let mut c = ScramClient::with_nonce(Mechanism::ScramSha1, "u", "p", None, "xyz").unwrap();
        assert!(c.client_final(msg).is_err(), "{msg:?}");
    }
}

// ---- PLAIN ----

#[test]
fn parse_plain_without_authzid_ok() {
    assert_eq!(
        parse_plain(b"\0tim\0tanstaaftanstaaf").unwrap(),
        (None, "tim".to_owned(), "tanstaaftanstaaf".to_owned())
    );
}

#[test]
fn parse_plain_with_authzid_ok() {
    assert_eq!(
        parse_plain(b"Ursel\0Kurt\0xipj3plmq").unwrap(),
        (
            Some("Ursel".to_owned()),
            "Kurt".to_owned(),
            "xipj3plmq".to_owned()
        )
    );
}

#[test]
fn parse_plain_authcid_saslprepped_password_verbatim() {
    let (_, authcid, password) = parse_plain("\0I\u{AD}X\0pa\u{AD}ss".as_bytes()).unwrap();
    assert_eq!(authcid, "IX");
    assert_eq!(password, "pa\u{AD}ss");
}

#[test]
fn parse_plain_bad_messages_malformed() {
    let cases: &[&[u8]] = &[
        b"",
        b"tim",
        b"\0tim",
        b"\0tim\0",
        b"\0\0pw",
        b"a\0tim\0pw\0",
        b"a\0tim\0p\0w",
        b"\0\xff\0pw",
        b"\0tim\0\xff",
        b"\xff\0tim\0pw",
        "\0\u{AD}\0pw".as_bytes(),
        b"\0a\x07\0pw",
    ];
    for msg in cases {
        assert_eq!(
            parse_plain(msg).unwrap_err().condition(),
            "malformed-request",
            "{msg:?}"
        );
    }
}

// ---- enums and helpers ----

#[test]
fn mechanism_names_round_trip() {
    for m in Mechanism::ALL {
        assert_eq!(Mechanism::from_name(m.name()), Some(m));
        if let Some(h) = m.scram_hash() {
            assert_eq!(Mechanism::scram(h, m.is_plus()), m);
            assert!(m.name().starts_with(&format!("SCRAM-{}", h.name())));
            assert_eq!(m.is_plus(), m.name().ends_with("-PLUS"));
        }
    }
    assert_eq!(Mechanism::from_name("scram-sha-1"), None);
    assert_eq!(Mechanism::from_name("DIGEST-MD5"), None);
    assert_eq!(Mechanism::ALL[0].name(), "SCRAM-SHA-512-PLUS");
    assert_eq!(Mechanism::ALL[6], Mechanism::Plain);
}

#[test]
fn channel_bindings_types_strongest_first() {
    assert!(ChannelBindings::default().is_empty());
    assert!(ChannelBindings::default().types().is_empty());
    assert_eq!(
        both_bindings().types(),
        vec![
            ChannelBindingType::TlsExporter,
            ChannelBindingType::TlsServerEndPoint
        ]
    );
    assert_eq!(
        ChannelBindingType::from_name("tls-server-end-point"),
        Some(ChannelBindingType::TlsServerEndPoint)
    );
    assert_eq!(ChannelBindingType::from_name("tls-unique"), None);
}

#[test]
fn sasl_error_conditions_are_rfc6120() {
    let all = [
        SaslError::MalformedRequest("x"),
        SaslError::IncorrectEncoding,
        SaslError::NotAuthorized("x"),
        SaslError::InvalidAuthzid,
        SaslError::InvalidMechanism,
        SaslError::UnsupportedChannelBinding,
        SaslError::Saslprep,
        SaslError::EncryptionRequired,
        SaslError::CredentialsExpired,
        SaslError::TemporaryAuthFailure,
        SaslError::Aborted,
        SaslError::MechanismTooWeak,
        SaslError::AccountDisabled,
        SaslError::Internal("x"),
    ];
    let allowed = [
        "aborted",
        "account-disabled",
        "credentials-expired",
        "encryption-required",
        "incorrect-encoding",
        "invalid-authzid",
        "invalid-mechanism",
        "malformed-request",
        "mechanism-too-weak",
        "not-authorized",
        "temporary-auth-failure",
    ];
    for e in all {
        assert!(allowed.contains(&e.condition()), "{e:?}");
        assert!(!e.to_string().is_empty());
    }
}

#[test]
fn decode_payload_equals_sign_empty() {
    assert_eq!(decode_payload("=").unwrap(), Vec::<u8>::new());
    assert_eq!(decode_payload("").unwrap(), Vec::<u8>::new());
    assert_eq!(decode_payload("biws").unwrap(), b"n,,");
    assert_eq!(decode_payload("bi ws"), Err(SaslError::IncorrectEncoding));
    assert_eq!(decode_payload("biw"), Err(SaslError::IncorrectEncoding));
    assert_eq!(encode_payload(b""), "=");
    assert_eq!(encode_payload(b"n,,"), "biws");
}
