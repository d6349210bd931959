//! Parser errors and their mapping to RFC 6120 stream error conditions.

/// Error produced while parsing an XMPP stream.
///
/// Every variant maps to exactly one RFC 6120 §4.9.3 stream error condition via
/// [`XmlError::stream_condition`]; after such an error the stream must be closed.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum XmlError {
    /// The input is not well-formed (namespace-well-formed) XML 1.0.
    #[error("not well-formed XML: {0}")]
    NotWellFormed(String),
    /// The input uses an XML feature XMPP forbids (RFC 6120 §11.1): DTD / DOCTYPE, entity
    /// declarations, comments, processing instructions or undeclared entity references.
    #[error("restricted XML: {0}")]
    RestrictedXml(String),
    /// The input is not UTF-8 or declares an encoding other than UTF-8 (RFC 6120 §11.6).
    #[error("unsupported encoding: {0}")]
    UnsupportedEncoding(String),
    /// The stream root element is not `{http://etherx.jabber.org/streams}stream`
    /// (RFC 6120 §4.8.1).
    #[error("invalid stream namespace: got {{{ns}}}{name}")]
    InvalidNamespace {
        /// Local name of the offending root element.
        name: String,
        /// Namespace of the offending root element.
        ns: String,
    },
    /// Structurally valid XML that is not a valid XMPP stream, e.g. non-whitespace text at
    /// the stream level or a root element with the wrong name.
    #[error("bad format: {0}")]
    BadFormat(String),
    /// A top-level stream child exceeded [`Limits::max_stanza_bytes`](crate::Limits).
    #[error("stanza exceeds {limit} bytes")]
    StanzaTooLarge {
        /// The configured limit.
        limit: usize,
    },
    /// Element nesting inside a stanza exceeded [`Limits::max_depth`](crate::Limits).
    #[error("element nesting exceeds {limit} levels")]
    TooDeep {
        /// The configured limit.
        limit: usize,
    },
    /// An element carried more than [`Limits::max_attributes`](crate::Limits) attributes.
    #[error("element has more than {limit} attributes")]
    TooManyAttributes {
        /// The configured limit.
        limit: usize,
    },
    /// The stream header (plus any XML declaration) exceeded
    /// [`Limits::max_header_bytes`](crate::Limits).
    #[error("stream header exceeds {limit} bytes")]
    HeaderTooLarge {
        /// The configured limit.
        limit: usize,
    },
    /// A single name or attribute value exceeded the parser's token size limit.
    #[error("XML name or attribute value exceeds {limit} bytes")]
    TokenTooLarge {
        /// The token size limit in effect.
        limit: usize,
    },
}

impl XmlError {
    /// RFC 6120 §4.9.3 stream error condition to send: `"not-well-formed"`,
    /// `"restricted-xml"` (DTD/doctype, comments, processing instructions, entity
    /// declarations, non-predefined entity references), `"policy-violation"` (stanza too
    /// large / too deep / too many attributes / header too large / token too large),
    /// `"invalid-namespace"` (stream element not `{NS_STREAMS}stream`), `"bad-format"`
    /// (non-whitespace text at stream level) or `"unsupported-encoding"` (non UTF-8 input or
    /// an encoding declaration other than UTF-8).
    pub fn stream_condition(&self) -> &'static str {
        match self {
            XmlError::NotWellFormed(_) => "not-well-formed",
            XmlError::RestrictedXml(_) => "restricted-xml",
            XmlError::UnsupportedEncoding(_) => "unsupported-encoding",
            XmlError::InvalidNamespace { .. } => "invalid-namespace",
            XmlError::BadFormat(_) => "bad-format",
            XmlError::StanzaTooLarge { .. }
            | XmlError::TooDeep { .. }
            | XmlError::TooManyAttributes { .. }
            | XmlError::HeaderTooLarge { .. }
            | XmlError::TokenTooLarge { .. } => "policy-violation",
        }
    }

    /// Map an rxml error. `prologue` holds the bytes consumed so far while no root element
    /// has been seen yet (used to recognise UTF-16 input and processing instructions whose
    /// target starts with `xml`); `token_limit` is the rxml token limit in effect.
    pub(crate) fn from_rxml(
        e: rxml::Error,
        prologue: Option<&[u8]>,
        token_limit: usize,
    ) -> XmlError {
        use rxml::Error as E;
        if let Some(bytes) = prologue {
            // NUL in the first two bytes means UTF-16/32 input (`<\0` or `\0<`).
            if bytes.iter().take(2).any(|&b| b == 0) {
                return XmlError::UnsupportedEncoding(
                    "NUL byte in stream prologue (UTF-16?)".into(),
                );
            }
            // rxml lexes `<?xml-stylesheet ...?>` as a broken XML declaration.
            if !matches!(e, E::RestrictedXml(_) | E::InvalidUtf8Byte(_)) && starts_with_pi(bytes) {
                return XmlError::RestrictedXml("processing instructions".into());
            }
        }
        match e {
            E::RestrictedXml("only utf-8 encoding is allowed") => {
                XmlError::UnsupportedEncoding("encoding declaration other than UTF-8".into())
            }
            E::RestrictedXml("long name or reference") | E::RestrictedXml("event too long") => {
                XmlError::TokenTooLarge { limit: token_limit }
            }
            E::RestrictedXml(what) => XmlError::RestrictedXml(what.into()),
            E::UndeclaredEntity => {
                XmlError::RestrictedXml("reference to an undeclared entity".into())
            }
            // rxml reports any `<!` that does not start a comment or CDATA section this way:
            // `<!DOCTYPE`, `<!ENTITY`, `<!ELEMENT`, `<!ATTLIST` — i.e. DTD markup.
            E::InvalidSyntax("malformed cdata or comment section start") => {
                XmlError::RestrictedXml("DTD markup (<!DOCTYPE / <!ENTITY ...)".into())
            }
            E::InvalidUtf8Byte(b) => {
                XmlError::UnsupportedEncoding(format!("invalid UTF-8 byte 0x{b:02x}"))
            }
            other => XmlError::NotWellFormed(other.to_string()),
        }
    }
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn skip_ws(b: &[u8]) -> &[u8] {
    let n = b.iter().take_while(|&&c| is_ws(c)).count();
    &b[n..]
}

/// True if the prologue (after whitespace and an optional XML declaration) starts with a
/// processing instruction, i.e. `<?` followed by a target other than exactly `xml`.
fn starts_with_pi(prologue: &[u8]) -> bool {
    let mut rest = skip_ws(prologue);
    for _ in 0..2 {
        let Some(target) = rest.strip_prefix(b"<?") else {
            return false;
        };
        let is_decl = target.len() > 3 && target.starts_with(b"xml") && is_ws(target[3]);
        if !is_decl {
            // Needs at least one target byte to tell `<?xml ` from `<?xm` + error.
            return !target.is_empty();
        }
        match target.windows(2).position(|w| w == b"?>") {
            Some(end) => rest = skip_ws(&target[end + 2..]),
            None => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_with_pi_various_prologues_classified() {
        assert!(starts_with_pi(b"<?xml-stylesheet"));
        assert!(starts_with_pi(b"  <?foo"));
        assert!(starts_with_pi(b"<?xml version='1.0'?>\n<?xml-x"));
        assert!(!starts_with_pi(b"<?xml version='1.0' encoding='latin1'?>"));
        assert!(!starts_with_pi(b"<?xml version='1.0'?><stream:stream"));
        assert!(!starts_with_pi(b"<stream"));
        assert!(!starts_with_pi(b"<?"));
    }

    #[test]
    fn stream_condition_all_variants_mapped() {
        let cases = [
            (XmlError::NotWellFormed(String::new()), "not-well-formed"),
            (XmlError::RestrictedXml(String::new()), "restricted-xml"),
            (
                XmlError::UnsupportedEncoding(String::new()),
                "unsupported-encoding",
            ),
            (
                XmlError::InvalidNamespace {
                    name: String::new(),
                    ns: String::new(),
                },
                "invalid-namespace",
            ),
            (XmlError::BadFormat(String::new()), "bad-format"),
            (XmlError::StanzaTooLarge { limit: 1 }, "policy-violation"),
            (XmlError::TooDeep { limit: 1 }, "policy-violation"),
            (XmlError::TooManyAttributes { limit: 1 }, "policy-violation"),
            (XmlError::HeaderTooLarge { limit: 1 }, "policy-violation"),
            (XmlError::TokenTooLarge { limit: 1 }, "policy-violation"),
        ];
        for (e, cond) in cases {
            assert_eq!(e.stream_condition(), cond, "{e}");
        }
    }
}
