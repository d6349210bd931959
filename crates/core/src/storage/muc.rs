//! Group-chat rooms (XEP-0045): what outlives a room's occupants — its
//! configuration, subject and affiliations (with registered nicknames).
//! A room's messages live in the archive, under the room's JID as owner.

use super::StorageResult;
use async_trait::async_trait;
use starling_proto::BareJid;

/// A stored room. `config` and `subject` are the MUC module's own
/// serialization (versioned by it); storage keeps them opaque.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRoom {
    /// The room's bare JID (`room@conference.example.org`).
    pub jid: BareJid,
    /// The room configuration.
    pub config: String,
    /// The current subject (may be empty).
    pub subject: String,
    /// When the room was created, milliseconds since the Unix epoch.
    pub created_at: i64,
}

/// An affiliation with a room (XEP-0045 §5.2) held by a bare JID or a
/// domain, with a registered nickname (§7.10) and the reason given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoomAffiliation {
    /// The affiliated bare JID (or domain), as a string.
    pub jid: String,
    /// `owner`, `admin`, `member` or `outcast`; `none` removes the row.
    pub affiliation: String,
    /// The nickname registered with the room, if any.
    pub nick: Option<String>,
    /// The reason given by whoever set it, if any.
    pub reason: Option<String>,
}

/// Rooms of the group-chat services.
#[async_trait]
pub trait MucStore: Send + Sync + 'static {
    /// The room, if it is stored.
    async fn room(&self, room: &BareJid) -> StorageResult<Option<StoredRoom>>;
    /// Stores the room (creating it or replacing its config and subject;
    /// `created_at` of an existing room is kept).
    async fn put_room(&self, room: &StoredRoom) -> StorageResult<()>;
    /// Deletes the room and its affiliations. Returns false if it was not
    /// stored.
    async fn delete_room(&self, room: &BareJid) -> StorageResult<bool>;
    /// Stored rooms of a service domain, by name, after `after`, at most
    /// `limit`.
    async fn rooms(
        &self,
        service: &str,
        after: Option<&str>,
        limit: u32,
    ) -> StorageResult<Vec<StoredRoom>>;
    /// The room's affiliations, by JID.
    async fn affiliations(&self, room: &BareJid) -> StorageResult<Vec<RoomAffiliation>>;
    /// Applies affiliation changes in one transaction: each row replaces
    /// the JID's previous one; affiliation `none` deletes it.
    async fn set_affiliations(
        &self,
        room: &BareJid,
        changes: &[RoomAffiliation],
    ) -> StorageResult<()>;
    /// The rooms where `jid` has an affiliation, with it.
    async fn rooms_of(&self, jid: &BareJid) -> StorageResult<Vec<(BareJid, RoomAffiliation)>>;
    /// Removes `jid`'s affiliations everywhere (account deletion).
    async fn remove_user(&self, jid: &BareJid) -> StorageResult<()>;
}
