//! Account operations shared by the CLI, in-band registration and the admin
//! API: passwords become salted SCRAM keys for every hash function, derived
//! on the blocking pool so PBKDF2 never stalls the async runtime
//! (DESIGN.md invariant 8).

use starling_core::storage::{Storage, StorageError};
use starling_proto::sasl::{ScramCredentials, ScramHash};
use starling_proto::BareJid;

/// Why an account operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    /// The password is not acceptable (SASLprep rejects it).
    #[error("the password contains characters that SASLprep (RFC 4013) prohibits")]
    BadPassword,
    /// The account exists already.
    #[error("account {0} already exists")]
    Exists(String),
    /// The name is not stable under normalisation: parsed again, it names
    /// another account (the `jid` crate maps some code points in two
    /// steps, e.g. U+03F9 `Ϲ` → `Σ` → `σ`), so one account could be
    /// reached under two spellings. Found by the `jid` fuzz target.
    #[error(
        "the name {0} does not have one normal form (parsed again it becomes {1}); choose another"
    )]
    Unstable(String, String),
    /// The account does not exist.
    #[error("account {0} does not exist")]
    NotFound(String),
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Derives SCRAM credentials for all hash functions (CPU-heavy; call
/// [`derive_credentials`] from async code).
pub fn derive_credentials_blocking(
    password: &str,
    iterations: u32,
) -> Result<Vec<ScramCredentials>, AccountError> {
    [ScramHash::Sha1, ScramHash::Sha256, ScramHash::Sha512]
        .into_iter()
        .map(|h| {
            ScramCredentials::generate(h, password, iterations)
                .map_err(|_| AccountError::BadPassword)
        })
        .collect()
}

/// Derives SCRAM credentials on the blocking thread pool.
pub async fn derive_credentials(
    password: String,
    iterations: u32,
) -> Result<Vec<ScramCredentials>, AccountError> {
    tokio::task::spawn_blocking(move || derive_credentials_blocking(&password, iterations))
        .await
        .unwrap_or(Err(AccountError::BadPassword))
}

/// Creates an account with a password.
pub async fn create(
    storage: &Storage,
    jid: &BareJid,
    password: &str,
    iterations: u32,
) -> Result<(), AccountError> {
    stable_name(jid)?;
    let creds = derive_credentials(password.to_owned(), iterations).await?;
    match storage.accounts.create(jid, &creds).await {
        Ok(()) => Ok(()),
        Err(StorageError::Conflict) => Err(AccountError::Exists(jid.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// Refuses an account name whose normal form is not a fixed point of
/// normalisation (RFC 7622 §3.2–3.3 apply PRECIS once; a name that
/// changes again when its normal form is parsed would name two accounts).
pub fn stable_name(jid: &BareJid) -> Result<(), AccountError> {
    match BareJid::new(jid.as_str()) {
        Ok(again) if again == *jid => Ok(()),
        Ok(again) => Err(AccountError::Unstable(jid.to_string(), again.to_string())),
        Err(_) => Err(AccountError::Unstable(jid.to_string(), "invalid".into())),
    }
}

/// Changes an account's password.
pub async fn set_password(
    storage: &Storage,
    jid: &BareJid,
    password: &str,
    iterations: u32,
) -> Result<(), AccountError> {
    let creds = derive_credentials(password.to_owned(), iterations).await?;
    if storage.accounts.set_credentials(jid, &creds).await? {
        Ok(())
    } else {
        Err(AccountError::NotFound(jid.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_two_normal_forms_are_refused() {
        // The fuzz target's finding: U+03F9 maps to Σ, which maps to σ.
        let jid = BareJid::new("m\u{3f9}x@localhost").unwrap();
        assert!(matches!(stable_name(&jid), Err(AccountError::Unstable(..))));
        let plain = BareJid::new("M\u{3c3}x@localhost").unwrap();
        assert!(stable_name(&plain).is_ok(), "{plain}");
        assert!(stable_name(&BareJid::new("alice@localhost").unwrap()).is_ok());
    }
}
