//! Group-chat rooms (XEP-0045): what outlives a room's occupants — its
//! configuration, subject and affiliations (with registered nicknames).
//! A room's messages live in the archive, under the room's JID as owner.
//! MUC Light rooms (MongooseIM's protocol) are stored alike, with their
//! own config serialization; their users' blocking lists (rooms and users
//! a user refuses to be added to rooms by) are here too.

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
    /// Removes `jid`'s affiliations everywhere and its MUC Light blocking
    /// list (account deletion). Other users' blocking rows that name `jid`
    /// stay: they belong to those users.
    async fn remove_user(&self, jid: &BareJid) -> StorageResult<()>;
    /// MUC Light blocking list of `user`: (kind, jid) pairs, kind `room`
    /// or `user`, sorted by kind then jid.
    async fn light_blocking(&self, user: &BareJid) -> StorageResult<Vec<(String, BareJid)>>;
    /// Applies changes to `user`'s MUC Light blocking list in one
    /// transaction: `deny` rows are added (already present: no change),
    /// `allow` rows removed (absent: no error).
    ///
    /// A pair in both lists ends up absent (`deny` first, then `allow`).
    /// A kind other than `room` or `user` is refused with an error, and
    /// then nothing is changed.
    async fn set_light_blocking(
        &self,
        user: &BareJid,
        deny: &[(String, BareJid)],
        allow: &[(String, BareJid)],
    ) -> StorageResult<()>;
    /// Which of `users` refuse to be added to `room` by `by` (they block
    /// the room or the user `by`). One query, not one per user.
    ///
    /// In the order of `users`, each once. (Lists of more than a few
    /// hundred users take one statement per few hundred, far below either
    /// engine's limit on bound parameters.)
    async fn light_refusing(
        &self,
        users: &[BareJid],
        room: &BareJid,
        by: &BareJid,
    ) -> StorageResult<Vec<BareJid>>;
}
