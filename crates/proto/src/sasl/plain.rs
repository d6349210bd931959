//! RFC 4616 PLAIN.

use super::{saslprep, SaslError};

/// RFC 4616 PLAIN: returns (authzid, authcid, password); rejects NULs inside fields, empty
/// authcid/password, wrong field count.
///
/// The message is `[authzid] NUL authcid NUL passwd`, all UTF-8. An empty authzid yields
/// `None`. The authcid is returned SASLprepped (like [`super::ClientFirst::username`]); the
/// password is returned as sent ([`super::ScramCredentials::verify_password`] SASLpreps it).
pub fn parse_plain(msg: &[u8]) -> Result<(Option<String>, String, String), SaslError> {
    let mut fields = msg.split(|b| *b == 0);
    let (Some(authzid), Some(authcid), Some(password), None) =
        (fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return Err(SaslError::MalformedRequest(
            "PLAIN needs exactly three fields",
        ));
    };
    let authzid = utf8(authzid)?;
    let authcid = utf8(authcid)?;
    let password = utf8(password)?;
    if authcid.is_empty() {
        return Err(SaslError::MalformedRequest("PLAIN authcid is empty"));
    }
    if password.is_empty() {
        return Err(SaslError::MalformedRequest("PLAIN password is empty"));
    }
    let authcid = saslprep(authcid)?;
    if authcid.is_empty() {
        return Err(SaslError::MalformedRequest("PLAIN authcid is empty"));
    }
    let authzid = (!authzid.is_empty()).then(|| authzid.to_owned());
    Ok((authzid, authcid, password.to_owned()))
}

fn utf8(b: &[u8]) -> Result<&str, SaslError> {
    std::str::from_utf8(b).map_err(|_| SaslError::MalformedRequest("PLAIN field is not UTF-8"))
}
