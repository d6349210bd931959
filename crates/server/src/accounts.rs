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
    let creds = derive_credentials(password.to_owned(), iterations).await?;
    match storage.accounts.create(jid, &creds).await {
        Ok(()) => Ok(()),
        Err(StorageError::Conflict) => Err(AccountError::Exists(jid.to_string())),
        Err(e) => Err(e.into()),
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
