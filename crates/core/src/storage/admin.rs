//! Admin API tokens (docs/admin.md).

use super::StorageResult;
use async_trait::async_trait;

/// One admin API token as stored: never the token, only its SHA-256.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminToken {
    /// Its unique name, shown in the log line of every change made with
    /// it ("who did it").
    pub name: String,
    /// SHA-256 of the token.
    pub hash: Vec<u8>,
    /// When it was created, milliseconds since the Unix epoch.
    pub created_at: i64,
    /// When it last authenticated a request, milliseconds since the Unix
    /// epoch (updated at most once a minute).
    pub last_used_at: Option<i64>,
    /// What it may do: [`SCOPE_ADMIN`] everything, [`SCOPE_READ`] only
    /// read (`GET` requests, the web page without its forms).
    pub scope: String,
}

/// The scope of a token that may do everything.
pub const SCOPE_ADMIN: &str = "admin";
/// The scope of a read-only token (monitoring, dashboards).
pub const SCOPE_READ: &str = "read";

/// The admin API's bearer tokens. Few (one per operator or script), so
/// they are read all at once and compared in constant time by the server.
#[async_trait]
pub trait AdminTokenStore: Send + Sync + 'static {
    /// Stores a new token. Fails with [`super::StorageError::Conflict`]
    /// when the name is taken.
    async fn create_admin_token(&self, token: &AdminToken) -> StorageResult<()>;
    /// Every token, by name.
    async fn admin_tokens(&self) -> StorageResult<Vec<AdminToken>>;
    /// Records a use of token `name` at `at` (milliseconds).
    async fn touch_admin_token(&self, name: &str, at: i64) -> StorageResult<()>;
    /// Deletes token `name`. Returns false if there was none.
    async fn revoke_admin_token(&self, name: &str) -> StorageResult<bool>;
}
