//! The HT SASL mechanisms (draft-schmaus-kitten-sasl-ht), which FAST
//! (XEP-0484) uses to authenticate with a server-issued token in one round
//! trip: `HT-SHA-256-NONE`, `-ENDP` (tls-server-end-point, RFC 5929) and
//! `-EXPR` (tls-exporter, RFC 9266).
//!
//! - initiator: `authcid NUL HMAC-SHA-256(token, "Initiator" || cb-data)`
//! - responder: `HMAC-SHA-256(token, "Responder" || cb-data)`, sent as the
//!   SASL2 `<additional-data/>`.
//!
//! The HMAC key is the token as the client received it (its UTF-8 bytes).

use super::{ChannelBindingType, SaslError};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// An HT mechanism with SHA-256 and one channel-binding choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HtMechanism {
    /// `HT-SHA-256-EXPR`: bound to the TLS connection by tls-exporter.
    Expr,
    /// `HT-SHA-256-ENDP`: bound to the server certificate.
    Endp,
    /// `HT-SHA-256-NONE`: no channel binding.
    None,
}

impl HtMechanism {
    /// Every HT mechanism, strongest first.
    pub const ALL: [HtMechanism; 3] = [HtMechanism::Expr, HtMechanism::Endp, HtMechanism::None];

    /// The mechanism name.
    pub fn name(self) -> &'static str {
        match self {
            HtMechanism::Expr => "HT-SHA-256-EXPR",
            HtMechanism::Endp => "HT-SHA-256-ENDP",
            HtMechanism::None => "HT-SHA-256-NONE",
        }
    }

    /// The mechanism with this name.
    pub fn from_name(name: &str) -> Option<HtMechanism> {
        HtMechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The channel binding the mechanism needs, if any.
    pub fn binding(self) -> Option<ChannelBindingType> {
        match self {
            HtMechanism::Expr => Some(ChannelBindingType::TlsExporter),
            HtMechanism::Endp => Some(ChannelBindingType::TlsServerEndPoint),
            HtMechanism::None => None,
        }
    }
}

fn mac(token: &[u8], label: &[u8], cb: &[u8]) -> Vec<u8> {
    // HMAC accepts keys of any length: new_from_slice cannot fail.
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(token).expect("any key length");
    m.update(label);
    m.update(cb);
    m.finalize().into_bytes().to_vec()
}

/// Splits an initiator message into the authentication identity and the
/// hashed token.
pub fn parse_initiator(data: &[u8]) -> Result<(String, Vec<u8>), SaslError> {
    let nul = data
        .iter()
        .position(|b| *b == 0)
        .ok_or(SaslError::MalformedRequest("HT: no NUL after the authcid"))?;
    let authcid = std::str::from_utf8(&data[..nul])
        .map_err(|_| SaslError::MalformedRequest("HT: authcid is not UTF-8"))?;
    if authcid.is_empty() {
        return Err(SaslError::MalformedRequest("HT: empty authcid"));
    }
    let hashed = &data[nul + 1..];
    if hashed.len() != 32 {
        return Err(SaslError::MalformedRequest(
            "HT: hashed token of the wrong length",
        ));
    }
    Ok((authcid.to_owned(), hashed.to_vec()))
}

/// True if `hashed` is the initiator hash of `token` over `cb` (compared
/// in constant time).
pub fn verify_initiator(token: &[u8], cb: &[u8], hashed: &[u8]) -> bool {
    mac(token, b"Initiator", cb).ct_eq(hashed).into()
}

/// The responder message (mutual authentication).
pub fn responder(token: &[u8], cb: &[u8]) -> Vec<u8> {
    mac(token, b"Responder", cb)
}

/// A token derived from a server key and its context (the account, the
/// client, a stored nonce): base64url without padding of
/// HMAC-SHA-256(key, parts joined by NUL). The server stores the nonce,
/// never the token.
pub fn derive_token(key: &[u8], parts: &[&str]) -> String {
    use base64::Engine as _;
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("any key length");
    m.update(b"starling-fast-token");
    for p in parts {
        m.update(&[0]);
        m.update(p.as_bytes());
    }
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(m.finalize().into_bytes())
}

/// The initiator message a client sends (tests, load generator).
pub fn initiator(authcid: &str, token: &[u8], cb: &[u8]) -> Vec<u8> {
    let mut out = authcid.as_bytes().to_vec();
    out.push(0);
    out.extend_from_slice(&mac(token, b"Initiator", cb));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initiator_verifies_and_binds_to_token_and_channel() {
        let msg = initiator("alice", b"tok", b"cb");
        let (authcid, hashed) = parse_initiator(&msg).unwrap();
        assert_eq!(authcid, "alice");
        assert!(verify_initiator(b"tok", b"cb", &hashed));
        assert!(!verify_initiator(b"tok2", b"cb", &hashed), "another token");
        assert!(
            !verify_initiator(b"tok", b"other", &hashed),
            "another channel"
        );
        assert!(!verify_initiator(b"tok", b"cb", &responder(b"tok", b"cb")));
    }

    #[test]
    fn matches_an_independent_hmac_sha256() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for
        // nothing?" → 5bdcc146…; here the label and cb concatenate to it.
        let out = mac(b"Jefe", b"what do ya want ", b"for nothing?");
        assert_eq!(
            out.iter().map(|b| format!("{b:02x}")).collect::<String>(),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn malformed_initiators_are_refused() {
        for bad in [
            &b"alice"[..],
            b"\0abc",
            b"alice\0short",
            b"\xff\0aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        ] {
            assert!(parse_initiator(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names_round_trip() {
        for m in HtMechanism::ALL {
            assert_eq!(HtMechanism::from_name(m.name()), Some(m));
        }
        assert_eq!(HtMechanism::from_name("HT-SHA-256-UNIQ"), None);
    }
}
