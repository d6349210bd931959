//! SASL authentication for client-to-server streams (RFC 6120 §6).
//!
//! Everything here is sans-IO: the caller decodes the base64 payload of
//! `<auth/>` / `<response/>` (see [`decode_payload`]), feeds the bytes to the
//! state machines and base64-encodes what they return.
//!
//! Supported mechanisms:
//! - `SCRAM-SHA-{1,256,512}` and their `-PLUS` variants (RFC 5802, RFC 7677), with the
//!   `tls-exporter` (RFC 9266) and `tls-server-end-point` (RFC 5929) channel-binding types.
//!   The server side is [`ScramServer`], the client side (tests, load generator) is
//!   [`ScramClient`]; per-user secrets are [`ScramCredentials`] (never the password).
//! - `PLAIN` (RFC 4616) via [`parse_plain`] plus [`ScramCredentials::verify_password`].
//! - `HT-SHA-256-{EXPR,ENDP,NONE}` (draft-schmaus-kitten-sasl-ht, for XEP-0484
//!   FAST tokens) in [`ht`].
//!
//! No function in this module panics on any input.
#![warn(missing_docs)]

mod crypto;
pub mod ht;
mod plain;
mod scram;
#[cfg(test)]
mod tests;

use base64::Engine as _;

pub use crypto::{saslprep, ScramCredentials, DEFAULT_ITERATIONS};
pub use plain::parse_plain;
pub use scram::{ClientFirst, SaltedPassword, ScramClient, ScramServer};

/// Hash function underlying a SCRAM mechanism.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScramHash {
    /// SHA-1 (`SCRAM-SHA-1`, RFC 5802).
    Sha1,
    /// SHA-256 (`SCRAM-SHA-256`, RFC 7677).
    Sha256,
    /// SHA-512 (`SCRAM-SHA-512`).
    Sha512,
}

impl ScramHash {
    /// All supported hash functions, strongest first.
    pub const ALL: [ScramHash; 3] = [ScramHash::Sha512, ScramHash::Sha256, ScramHash::Sha1];

    /// Name of the hash as used in the mechanism name: `"SHA-1"`, `"SHA-256"`, `"SHA-512"`.
    pub fn name(self) -> &'static str {
        match self {
            ScramHash::Sha1 => "SHA-1",
            ScramHash::Sha256 => "SHA-256",
            ScramHash::Sha512 => "SHA-512",
        }
    }

    /// Digest output length in bytes (also the length of StoredKey, ServerKey and proofs).
    pub fn output_len(self) -> usize {
        match self {
            ScramHash::Sha1 => 20,
            ScramHash::Sha256 => 32,
            ScramHash::Sha512 => 64,
        }
    }
}

/// A SASL mechanism this server implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mechanism {
    /// `SCRAM-SHA-1`.
    ScramSha1,
    /// `SCRAM-SHA-1-PLUS` (with channel binding).
    ScramSha1Plus,
    /// `SCRAM-SHA-256`.
    ScramSha256,
    /// `SCRAM-SHA-256-PLUS` (with channel binding).
    ScramSha256Plus,
    /// `SCRAM-SHA-512`.
    ScramSha512,
    /// `SCRAM-SHA-512-PLUS` (with channel binding).
    ScramSha512Plus,
    /// `PLAIN` (RFC 4616); only acceptable over TLS.
    Plain,
}

impl Mechanism {
    /// All mechanisms, strongest first (the order to advertise them in).
    pub const ALL: [Mechanism; 7] = [
        Mechanism::ScramSha512Plus,
        Mechanism::ScramSha512,
        Mechanism::ScramSha256Plus,
        Mechanism::ScramSha256,
        Mechanism::ScramSha1Plus,
        Mechanism::ScramSha1,
        Mechanism::Plain,
    ];

    /// The IANA mechanism name, e.g. `"SCRAM-SHA-256-PLUS"`.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::ScramSha1 => "SCRAM-SHA-1",
            Mechanism::ScramSha1Plus => "SCRAM-SHA-1-PLUS",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha256Plus => "SCRAM-SHA-256-PLUS",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
            Mechanism::ScramSha512Plus => "SCRAM-SHA-512-PLUS",
            Mechanism::Plain => "PLAIN",
        }
    }

    /// Parses a mechanism name as sent in `<auth mechanism='...'/>` (exact, case-sensitive).
    pub fn from_name(s: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == s)
    }

    /// The SCRAM mechanism for `hash`, with channel binding if `plus`.
    pub fn scram(hash: ScramHash, plus: bool) -> Mechanism {
        match (hash, plus) {
            (ScramHash::Sha1, false) => Mechanism::ScramSha1,
            (ScramHash::Sha1, true) => Mechanism::ScramSha1Plus,
            (ScramHash::Sha256, false) => Mechanism::ScramSha256,
            (ScramHash::Sha256, true) => Mechanism::ScramSha256Plus,
            (ScramHash::Sha512, false) => Mechanism::ScramSha512,
            (ScramHash::Sha512, true) => Mechanism::ScramSha512Plus,
        }
    }

    /// The hash function of a SCRAM mechanism; `None` for `PLAIN`.
    pub fn scram_hash(self) -> Option<ScramHash> {
        match self {
            Mechanism::ScramSha1 | Mechanism::ScramSha1Plus => Some(ScramHash::Sha1),
            Mechanism::ScramSha256 | Mechanism::ScramSha256Plus => Some(ScramHash::Sha256),
            Mechanism::ScramSha512 | Mechanism::ScramSha512Plus => Some(ScramHash::Sha512),
            Mechanism::Plain => None,
        }
    }

    /// Whether this is a channel-binding (`-PLUS`) mechanism.
    pub fn is_plus(self) -> bool {
        matches!(
            self,
            Mechanism::ScramSha1Plus | Mechanism::ScramSha256Plus | Mechanism::ScramSha512Plus
        )
    }
}

/// A channel-binding type we can offer (XEP-0440 advertises these).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChannelBindingType {
    /// `tls-exporter` (RFC 9266): 32 bytes of TLS keying material exported with label
    /// `EXPORTER-Channel-Binding` and an empty context.
    TlsExporter,
    /// `tls-server-end-point` (RFC 5929): hash of the server certificate.
    TlsServerEndPoint,
}

impl ChannelBindingType {
    /// All supported types, strongest first.
    pub const ALL: [ChannelBindingType; 2] = [
        ChannelBindingType::TlsExporter,
        ChannelBindingType::TlsServerEndPoint,
    ];

    /// The IANA channel-binding unique prefix: `"tls-exporter"` or `"tls-server-end-point"`.
    pub fn name(self) -> &'static str {
        match self {
            ChannelBindingType::TlsExporter => "tls-exporter",
            ChannelBindingType::TlsServerEndPoint => "tls-server-end-point",
        }
    }

    /// Parses a channel-binding type name (exact match); `None` for types we do not
    /// implement (such as `tls-unique`).
    pub fn from_name(s: &str) -> Option<ChannelBindingType> {
        ChannelBindingType::ALL.into_iter().find(|t| t.name() == s)
    }
}

/// What the TLS layer offers for this connection (empty when not on TLS).
#[derive(Clone, Debug, Default)]
pub struct ChannelBindings {
    /// `tls-exporter` data (RFC 9266), if offered on this connection.
    pub tls_exporter: Option<Vec<u8>>,
    /// `tls-server-end-point` data (RFC 5929), if offered on this connection.
    pub tls_server_end_point: Option<Vec<u8>>,
}

impl ChannelBindings {
    /// The offered types, strongest first (for XEP-0440 `<sasl-channel-binding/>`).
    pub fn types(&self) -> Vec<ChannelBindingType> {
        ChannelBindingType::ALL
            .into_iter()
            .filter(|t| self.get(*t).is_some())
            .collect()
    }

    /// Whether no channel-binding type is offered (then no `-PLUS` mechanism may be advertised).
    pub fn is_empty(&self) -> bool {
        self.tls_exporter.is_none() && self.tls_server_end_point.is_none()
    }

    /// The binding data for `ty`, if offered.
    pub fn get(&self, ty: ChannelBindingType) -> Option<&[u8]> {
        match ty {
            ChannelBindingType::TlsExporter => self.tls_exporter.as_deref(),
            ChannelBindingType::TlsServerEndPoint => self.tls_server_end_point.as_deref(),
        }
    }
}

/// A SASL failure. [`SaslError::condition`] gives the RFC 6120 §6.5 element to send in
/// `<failure/>`; the `Display` text is meant for logs (it never reveals whether a user exists,
/// but prefer not to echo it to unauthenticated peers).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum SaslError {
    /// The message does not follow the mechanism's syntax (or arrived out of order).
    #[error("malformed request: {0}")]
    MalformedRequest(&'static str),
    /// The base64 payload of the XML element is invalid.
    #[error("incorrect base64 encoding")]
    IncorrectEncoding,
    /// Authentication failed: bad credentials, unknown user, channel-binding mismatch or
    /// downgrade. The reason is for logs only.
    #[error("not authorized: {0}")]
    NotAuthorized(&'static str),
    /// The authorization identity is not well formed (or not permitted).
    #[error("invalid authorization identity")]
    InvalidAuthzid,
    /// The mechanism is not supported or not offered on this connection.
    #[error("invalid mechanism")]
    InvalidMechanism,
    /// The client asked for a channel-binding type this connection does not offer (e.g.
    /// `tls-unique`). Sent as `not-authorized`.
    #[error("unsupported channel binding type")]
    UnsupportedChannelBinding,
    /// A string contains characters prohibited by SASLprep (RFC 4013), or violates its bidi rules.
    #[error("string prohibited by SASLprep")]
    Saslprep,
    /// The mechanism requires a TLS-protected stream.
    #[error("encryption required")]
    EncryptionRequired,
    /// The credentials have expired.
    #[error("credentials expired")]
    CredentialsExpired,
    /// A temporary server-side problem (e.g. storage unavailable).
    #[error("temporary authentication failure")]
    TemporaryAuthFailure,
    /// The client aborted the exchange (`<abort/>`).
    #[error("aborted")]
    Aborted,
    /// The mechanism is weaker than this account's policy permits.
    #[error("mechanism too weak")]
    MechanismTooWeak,
    /// The account is disabled.
    #[error("account disabled")]
    AccountDisabled,
    /// An internal error (no randomness, corrupted stored credentials, misuse of the API).
    /// Sent as `temporary-auth-failure`.
    #[error("internal SASL error: {0}")]
    Internal(&'static str),
}

impl SaslError {
    /// RFC 6120 §6.5 condition: "malformed-request", "not-authorized", "invalid-authzid",
    /// "invalid-mechanism", "encryption-required", "incorrect-encoding", "credentials-expired",
    /// "temporary-auth-failure", "aborted", "mechanism-too-weak", "account-disabled".
    pub fn condition(&self) -> &'static str {
        match self {
            SaslError::MalformedRequest(_) | SaslError::Saslprep => "malformed-request",
            SaslError::IncorrectEncoding => "incorrect-encoding",
            SaslError::NotAuthorized(_) | SaslError::UnsupportedChannelBinding => "not-authorized",
            SaslError::InvalidAuthzid => "invalid-authzid",
            SaslError::InvalidMechanism => "invalid-mechanism",
            SaslError::EncryptionRequired => "encryption-required",
            SaslError::CredentialsExpired => "credentials-expired",
            SaslError::TemporaryAuthFailure | SaslError::Internal(_) => "temporary-auth-failure",
            SaslError::Aborted => "aborted",
            SaslError::MechanismTooWeak => "mechanism-too-weak",
            SaslError::AccountDisabled => "account-disabled",
        }
    }
}

/// Decodes the character data of `<auth/>`, `<response/>` etc. (RFC 6120 §6.4.2):
/// `"="` means an empty payload (so does `""`); anything else must be canonical padded base64
/// without whitespace, else [`SaslError::IncorrectEncoding`].
///
/// Note that an `<auth/>` element *without* character data means "no initial response": the
/// caller must answer it with an empty `<challenge/>` rather than treat it as empty data.
pub fn decode_payload(text: &str) -> Result<Vec<u8>, SaslError> {
    if text.is_empty() || text == "=" {
        return Ok(Vec::new());
    }
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|_| SaslError::IncorrectEncoding)
}

/// Encodes a payload for `<challenge/>`, `<success/>` etc. (RFC 6120 §6.4.2): empty data
/// becomes `"="`.
pub fn encode_payload(data: &[u8]) -> String {
    if data.is_empty() {
        "=".to_owned()
    } else {
        base64::engine::general_purpose::STANDARD.encode(data)
    }
}
