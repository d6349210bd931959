//! Offline message storage (XEP-0160): messages for an account with no
//! available resource, kept until its next available presence.

use super::{ArchiveRecord, StorageError};
use async_trait::async_trait;
use starling_proto::BareJid;

/// Why a message could not be stored.
#[derive(Debug, thiserror::Error)]
pub enum OfflineStoreError {
    /// The owner already has `max` stored messages.
    #[error("offline storage full ({max} messages)")]
    QuotaExceeded {
        /// The quota that was reached.
        max: u32,
    },
    /// The backend failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// One stored message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OfflineMessage {
    /// Backend-assigned id; ids of one owner grow with storage order.
    pub id: i64,
    /// The sender's JID, as a string.
    pub from: String,
    /// The serialized stanza, as it will be delivered.
    pub stanza: String,
    /// When it was stored, in milliseconds since the Unix epoch.
    pub stamp_millis: i64,
}

/// Per-user offline message queues.
#[async_trait]
pub trait OfflineStore: Send + Sync + 'static {
    /// Appends a message to `owner`'s queue unless it already holds
    /// `max_per_user` messages, and appends `archive` (the message's
    /// archive rows, as [`ArchiveStore::append`] would) in the same
    /// transaction. The write is committed (durable) when this returns
    /// `Ok`; on any error nothing was written.
    ///
    /// [`ArchiveStore::append`]: super::ArchiveStore::append
    async fn store(
        &self,
        owner: &BareJid,
        from: &str,
        stanza: &str,
        stamp_millis: i64,
        max_per_user: u32,
        archive: &[ArchiveRecord],
    ) -> Result<(), OfflineStoreError>;
    /// All stored messages of `owner`, oldest first.
    async fn fetch_all(&self, owner: &BareJid) -> Result<Vec<OfflineMessage>, StorageError>;
    /// Deletes `owner`'s messages with ids up to and including `up_to_id`.
    async fn delete_up_to(&self, owner: &BareJid, up_to_id: i64) -> Result<u64, StorageError>;
    /// Fetches and deletes all of `owner`'s messages in one transaction,
    /// oldest first, so that concurrent callers never get the same message.
    async fn take_all(&self, owner: &BareJid) -> Result<Vec<OfflineMessage>, StorageError>;
    /// Number of stored messages of `owner`.
    async fn count(&self, owner: &BareJid) -> Result<u64, StorageError>;
    /// Deletes every stored message of `owner` (account deletion).
    async fn remove_user(&self, owner: &BareJid) -> Result<(), StorageError>;
}
