//! XMPP protocol vocabulary shared by the server, its modules, the test kit
//! and the load generator. Sans-IO: nothing here touches a socket.
//!
//! - [`ns`]: namespace constants.
//! - [`Stanza`]: a top-level stanza with its routing attributes parsed once
//!   (RFC 6120 §8.1) and the element kept whole, so unknown payloads pass
//!   through untouched (DESIGN.md invariant 5).
//! - [`StanzaError`] / [`StreamError`]: the error conditions of RFC 6120
//!   §8.3 and §4.9, mapped to XML in one place.
//! - [`sasl`]: SASL mechanisms (SCRAM-SHA-1/256/512 and -PLUS, PLAIN).
//! - [`datetime`]: XEP-0082 date-times; [`mam`]: archive vocabulary shared
//!   by the archive and the inbox (message classification, result sets).

pub mod datetime;
pub mod error;
pub mod mam;
pub mod ns;
pub mod sasl;
mod stanza;

pub use error::{ErrorType, StanzaError, StanzaErrorCondition, StreamError, StreamErrorCondition};
pub use jid::{BareJid, FullJid, Jid};
pub use stanza::{Stanza, StanzaKind, StanzaParseError};
pub use starling_xml::{Element, Node};

/// Generates an identifier of `len` characters from the operating system's
/// CSPRNG, using an alphabet that is safe in JIDs, XML attributes and URLs.
///
/// Used for stream ids, server-generated resources and stanza ids.
pub fn random_id(len: usize) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijkmnpqrstuvwxyz23456789";
    let mut bytes = vec![0u8; len];
    // getrandom only fails when the OS has no entropy source at all; there is
    // no safe way to continue generating identifiers in that case.
    getrandom::fill(&mut bytes).expect("operating system CSPRNG unavailable");
    bytes
        .iter()
        .map(|b| ALPHABET[(*b as usize) % ALPHABET.len()] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_id_length_and_alphabet_ok() {
        let a = random_id(16);
        let b = random_id(16);
        assert_eq!(a.len(), 16);
        assert_ne!(a, b);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
    }
}
