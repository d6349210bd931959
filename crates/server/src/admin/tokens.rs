//! Admin API tokens: 32 bytes from the operating system's CSPRNG, shown
//! once as `sta_` + base64url, stored only as their SHA-256 with a name
//! (`AdminTokenStore`). A request's token is hashed and compared with every
//! stored hash in constant time (`subtle`), so neither the comparison nor
//! the number of tokens checked depends on how much of a guess was right.
//!
//! Tokens are made, listed and revoked offline on the database by `starling
//! admin token …` (like `starling user …`); a running server reads them
//! for each request, so a revocation takes effect at once.

use base64::Engine as _;
use sha2::{Digest, Sha256};
use starling_core::storage::{
    AdminToken, AdminTokenStore, StorageError, StorageResult, SCOPE_ADMIN, SCOPE_READ,
};
use subtle::ConstantTimeEq;

/// Prefix of every token: recognisable in a leaked file or log, and by
/// secret scanners.
pub const TOKEN_PREFIX: &str = "sta_";

/// Longest token name: names appear in every log line of a change.
const MAX_NAME: usize = 64;

/// A new random token (not stored).
pub fn generate() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("operating system CSPRNG unavailable");
    format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// The SHA-256 a token is stored as.
pub fn hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// The stored token whose hash is `token`'s, comparing with every stored
/// hash in constant time.
pub fn find<'a>(tokens: &'a [AdminToken], token: &str) -> Option<&'a AdminToken> {
    let h = hash(token);
    let mut found = None;
    for t in tokens {
        // No early exit: every hash is compared.
        if bool::from(t.hash.as_slice().ct_eq(h.as_slice())) {
            found = Some(t);
        }
    }
    found
}

/// Whether `name` is acceptable: 1–64 letters, digits, `-`, `_`, `.`, `@`
/// (it is logged and shown, so nothing that needs quoting).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b))
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Why a token could not be created.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The name is not acceptable.
    #[error("token name {0:?} is not valid: use 1-64 letters, digits, '-', '_', '.' or '@'")]
    BadName(String),
    /// The scope is not one of `admin`, `read`.
    #[error("token scope {0:?} is not valid: use admin (everything) or read (GET requests only)")]
    BadScope(String),
    /// A token with this name exists.
    #[error("a token named {0:?} exists already: revoke it first (starling admin token revoke {0}) or choose another name")]
    Exists(String),
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Creates and stores a token named `name` with `scope` (`admin` or
/// `read`); returns the token, which is not kept anywhere else.
pub async fn create(
    store: &dyn AdminTokenStore,
    name: &str,
    scope: &str,
) -> Result<String, TokenError> {
    if !valid_name(name) {
        return Err(TokenError::BadName(name.to_owned()));
    }
    if scope != SCOPE_ADMIN && scope != SCOPE_READ {
        return Err(TokenError::BadScope(scope.to_owned()));
    }
    let token = generate();
    let row = AdminToken {
        name: name.to_owned(),
        hash: hash(&token),
        created_at: now_millis(),
        last_used_at: None,
        scope: scope.to_owned(),
    };
    match store.create_admin_token(&row).await {
        Ok(()) => Ok(token),
        Err(StorageError::Conflict) => Err(TokenError::Exists(name.to_owned())),
        Err(e) => Err(e.into()),
    }
}

/// Every stored token (hashes included; callers show names and times).
pub async fn list(store: &dyn AdminTokenStore) -> StorageResult<Vec<AdminToken>> {
    store.admin_tokens().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_prefixed_and_found_only_by_their_hash() {
        let a = generate();
        let b = generate();
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX));
        // 32 bytes in unpadded base64url.
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 43);
        let stored = [
            AdminToken {
                name: "a".into(),
                hash: hash(&a),
                created_at: 0,
                last_used_at: None,
                scope: SCOPE_ADMIN.to_owned(),
            },
            AdminToken {
                name: "b".into(),
                hash: hash(&b),
                created_at: 0,
                last_used_at: None,
                scope: SCOPE_ADMIN.to_owned(),
            },
        ];
        assert_eq!(find(&stored, &b).map(|t| t.name.as_str()), Some("b"));
        assert!(find(&stored, "sta_wrong").is_none());
        assert!(find(&stored, "").is_none());
        assert!(find(&[], &a).is_none());
    }

    #[test]
    fn token_names_are_plain() {
        assert!(valid_name("deploy-bot_1.ops@example"));
        for bad in ["", "a b", "x'; DROP TABLE", "ü", &"n".repeat(65)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }
}
