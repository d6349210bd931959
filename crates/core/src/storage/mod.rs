//! Storage interfaces, one trait per concern (DESIGN.md invariant 6).
//!
//! The concerns several modules share (accounts, rosters, archive, inbox,
//! offline, pubsub…) have their trait here and their SQL in the
//! `starling-storage` crate; every backend runs the same conformance suite.
//! A concern that belongs to one module lives in that module's folder
//! instead — its trait, its SQL (written once against
//! `starling_storage::kit`), its [`SchemaStep`]s — and reaches account and
//! domain deletion through [`OwnedData`] (see `modules/muc/store/` for the
//! first one).

mod admin;
mod archive;
mod auth_cache;
mod domains;
mod im;
mod offline;
mod pubsub;
mod timed;
pub use auth_cache::AuthCache;
pub use timed::Timed;

pub use admin::{AdminToken, AdminTokenStore, SCOPE_ADMIN, SCOPE_READ};
pub use archive::{apply_inbox_update, coalesce_inbox_updates, InboxRow};
pub use archive::{
    ArchiveId, ArchiveIds, ArchivePage, ArchivePrefs, ArchiveQuery, ArchiveRecord, ArchiveStore,
    ArchivedMessage, InboxEntry, InboxQuery, InboxStore, InboxTotals, InboxUpdate, PrefsDefault,
    UnreadChange, WithFilter, FLAG_BODY,
};
pub use domains::{DomainSettings, DomainState, DomainStore, StoredDomain};
pub use im::{RosterChange, RosterItem, RosterStore, Subscription, UserDataStore};
pub use offline::{OfflineMessage, OfflineStore, OfflineStoreError};
pub use pubsub::{PubsubStore, PubsubSubscription, StoredItem, StoredNode};

use async_trait::async_trait;
use starling_proto::sasl::{ScramCredentials, ScramHash};
use starling_proto::BareJid;
use std::sync::Arc;

/// A storage failure.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The row already exists (for example creating an existing account).
    #[error("already exists")]
    Conflict,
    /// The backend failed; the message is for operators' logs.
    #[error("storage backend error: {0}")]
    Backend(String),
}

/// Result of a storage operation.
pub type StorageResult<T> = Result<T, StorageError>;

/// Accounts and their SCRAM credentials. Passwords are never stored: only
/// salted SCRAM keys, one set per hash function (RFC 5802 §3).
#[async_trait]
pub trait AccountStore: Send + Sync + 'static {
    /// Creates an account. Fails with [`StorageError::Conflict`] if it exists.
    async fn create(&self, jid: &BareJid, credentials: &[ScramCredentials]) -> StorageResult<()>;
    /// Creates many accounts in one transaction (bulk import); existing
    /// accounts are skipped. Returns how many were created.
    async fn create_many(
        &self,
        accounts: &[(BareJid, Vec<ScramCredentials>)],
    ) -> StorageResult<u64>;
    /// True if the account exists.
    async fn exists(&self, jid: &BareJid) -> StorageResult<bool>;
    /// The stored credentials for one hash function.
    async fn credentials(
        &self,
        jid: &BareJid,
        hash: ScramHash,
    ) -> StorageResult<Option<ScramCredentials>>;
    /// Replaces all credentials (password change). Returns false if the
    /// account does not exist.
    async fn set_credentials(
        &self,
        jid: &BareJid,
        credentials: &[ScramCredentials],
    ) -> StorageResult<bool>;
    /// Deletes the account and everything stored for it. Returns false if
    /// it did not exist.
    async fn delete(&self, jid: &BareJid) -> StorageResult<bool>;
    /// Account names (localparts) of a domain, sorted, after `after`, at most `limit`.
    async fn list(
        &self,
        domain: &str,
        after: Option<&str>,
        limit: u32,
    ) -> StorageResult<Vec<String>>;
    /// Number of accounts in a domain.
    async fn count(&self, domain: &str) -> StorageResult<u64>;
    /// Bans (`true`) or unbans an account: a disabled account cannot
    /// authenticate (RFC 6120 §6.5.1 `<account-disabled/>`). Returns
    /// false if the account does not exist.
    async fn set_disabled(&self, jid: &BareJid, disabled: bool) -> StorageResult<bool>;
    /// True if the account exists and is disabled.
    async fn is_disabled(&self, jid: &BareJid) -> StorageResult<bool>;
    /// The FAST token slots (XEP-0484) of one client (`agent`, its SASL2
    /// user-agent id) of an account.
    async fn fast_tokens(&self, jid: &BareJid, agent: &str) -> StorageResult<Vec<FastToken>>;
    /// Stores `token` in its slot (replacing what was there). Returns
    /// false if the account does not exist.
    async fn put_fast_token(
        &self,
        jid: &BareJid,
        agent: &str,
        token: &FastToken,
    ) -> StorageResult<bool>;
    /// Deletes one slot of a client's FAST tokens, or both (`None`).
    async fn delete_fast_tokens(
        &self,
        jid: &BareJid,
        agent: &str,
        slot: Option<FastSlot>,
    ) -> StorageResult<()>;
    /// The accounts whose credentials, disabled state or existence
    /// changed after change number `after` (0 or a `version` this
    /// returned before), whichever process wrote them: servers poll this
    /// to drop what their [`AuthCache`] holds of them.
    async fn account_changes(&self, after: i64) -> StorageResult<AccountChanges>;
}

/// What [`AccountStore::account_changes`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountChanges {
    /// The change counter now (pass it as `after` next time).
    pub version: i64,
    /// The accounts changed since `after` (an account changed twice is
    /// listed twice), or `None` when the backend no longer has all of
    /// them (it keeps the last [`ACCOUNT_CHANGES_KEPT`]): forget everything.
    pub accounts: Option<Vec<BareJid>>,
}

/// How many account changes a backend keeps for pollers that are behind.
pub const ACCOUNT_CHANGES_KEPT: i64 = 10_000;

/// Which of a client's two FAST token slots (XEP-0484 §6.1): a newly
/// issued token waits in `New` until the client uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FastSlot {
    /// The token the client authenticated with last.
    Current,
    /// The token issued last, not used yet.
    New,
}

impl FastSlot {
    /// The stored number.
    pub fn code(self) -> i64 {
        match self {
            FastSlot::Current => 0,
            FastSlot::New => 1,
        }
    }

    /// The slot a stored number names.
    pub fn from_code(code: i64) -> Option<FastSlot> {
        match code {
            0 => Some(FastSlot::Current),
            1 => Some(FastSlot::New),
            _ => None,
        }
    }
}

/// One stored FAST token: what the token is derived from, never the token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FastToken {
    /// Its slot.
    pub slot: FastSlot,
    /// Random value the token is derived from (with the server's key).
    pub nonce: String,
    /// The HT mechanism it was issued for (XEP-0484: bound to it).
    pub mechanism: String,
    /// Expiry, milliseconds since the Unix epoch.
    pub expires_at: i64,
}

/// Lifecycle of a storage backend as a whole.
#[async_trait]
pub trait StorageBackend: Send + Sync + 'static {
    /// Flushes pending writes and closes connections (graceful shutdown).
    async fn close(&self);
    /// A short description for logs, e.g. `sqlite:./data/starling.db`.
    fn describe(&self) -> String;
    /// The backend itself, for a module's own store to find its engine
    /// (`starling_storage::kit::engine`).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// All storage handles of a deployment.
#[derive(Clone)]
pub struct Storage {
    /// Accounts.
    pub accounts: Arc<dyn AccountStore>,
    /// Rosters and pending subscription requests.
    pub roster: Arc<dyn RosterStore>,
    /// vCards and private XML.
    pub user_data: Arc<dyn UserDataStore>,
    /// Offline messages (XEP-0160).
    pub offline: Arc<dyn OfflineStore>,
    /// Message archives (XEP-0313).
    pub archive: Arc<dyn ArchiveStore>,
    /// Inboxes (XEP-0430).
    pub inbox: Arc<dyn InboxStore>,
    /// Pubsub nodes and items (XEP-0060, PEP XEP-0163).
    pub pubsub: Arc<dyn PubsubStore>,
    /// Admin API tokens.
    pub admin_tokens: Arc<dyn AdminTokenStore>,
    /// Domains added at run time (docs/domains.md).
    pub domains: Arc<dyn DomainStore>,
    /// The backend's lifecycle.
    pub backend: Arc<dyn StorageBackend>,
    /// What modules store on their own, for account and domain deletion
    /// (empty as the backend opens it; the server adds every module's,
    /// enabled or not: `modules::owned_data`).
    pub owned: Arc<[Arc<dyn OwnedData>]>,
}

/// One versioned step of the database schema, with each engine's SQL
/// (which may hold several statements). Versions are global: the
/// backend's own steps and every module's (`Module::SCHEMA`) are applied
/// together, each once, in version order; a new step takes the next
/// unused number.
#[derive(Clone, Copy, Debug)]
pub struct SchemaStep {
    /// Its version, unique across the backend and all modules.
    pub version: i64,
    /// A short name for logs.
    pub name: &'static str,
    /// The SQLite script.
    pub sqlite: &'static str,
    /// The PostgreSQL script.
    pub postgres: &'static str,
}

/// One function of a module store's conformance suite: `(name, run)`,
/// `run` panicking on the first deviation, on a fresh, empty storage
/// opened with every module's schema and owned data. `Module::STORE_SUITES`
/// lists a module's; the scenario tests run every module's on each engine.
pub type StoreSuite = (
    &'static str,
    for<'a> fn(&'a Storage) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>,
);

/// Data a module stores on its own (with its own store trait), so that
/// deleting an account or a domain deletes it too.
#[async_trait]
pub trait OwnedData: Send + Sync + 'static {
    /// The module's name, for logs and errors.
    fn name(&self) -> &'static str;
    /// Deletes what is stored for the account `jid` (what other users
    /// keep about it stays theirs).
    async fn remove_user(&self, jid: &BareJid) -> StorageResult<()>;
    /// Deletes everything stored under the service domain `domain` (the
    /// rooms of `conference.example.org`), when that domain is removed.
    async fn remove_service(&self, domain: &str) -> StorageResult<()>;
}

impl Storage {
    /// Deletes an account and everything stored for it, in every concern.
    /// Returns false if the account did not exist (other data is removed
    /// anyway, so a half-deleted account can be cleaned up).
    pub async fn delete_account(&self, jid: &BareJid) -> StorageResult<bool> {
        self.roster.remove_user(jid).await?;
        self.user_data.remove_user(jid).await?;
        self.offline.remove_user(jid).await?;
        self.archive.remove_user(jid).await?;
        self.inbox.remove_user(jid).await?;
        for owned in self.owned.iter() {
            owned.remove_user(jid).await?;
        }
        self.pubsub.remove_user(jid).await?;
        self.accounts.delete(jid).await
    }
}
