//! The group-chat store, the MUC and MUC Light modules' own: what
//! outlives a room's occupants — its configuration, subject and
//! affiliations (with registered nicknames) (XEP-0045). A room's messages
//! live in the archive, under the room's JID as owner. MUC Light rooms
//! (MongooseIM's protocol) are stored alike, with their own config
//! serialization; their users' blocking lists (rooms and users a user
//! refuses to be added to rooms by) are here too.
//!
//! The whole store is in this folder (`starling_storage::kit` explains the
//! pattern): [`MucStore`], the trait the modules use; `sql.rs`, its SQL,
//! written once and compiled for each engine below; `sqlite/` and
//! `postgres/`, the schema steps ([`SCHEMA`], versions 8 and 10, applied
//! with the backend's own); [`MucData`], what account and domain deletion
//! remove; `conformance.rs`, the suite both engines pass (run by the
//! scenario tests' `stores` module, on SQLite and on PostgreSQL, through
//! `Module::STORE_SUITES`).

pub mod conformance;

use starling_core::async_trait;
use starling_core::storage::{ArchiveStore, OwnedData, SchemaStep, Storage, StorageResult, Timed};
use starling_core::{timed_store, Metrics};
use starling_proto::BareJid;
use starling_storage::kit::{self, Engine};
use std::sync::Arc;

mod on_postgres;
mod on_sqlite;

/// The store's tables (versions are global: see `Module::SCHEMA`).
pub const SCHEMA: &[SchemaStep] = &[
    SchemaStep {
        version: 8,
        name: "muc",
        sqlite: include_str!("sqlite/0008_muc.sql"),
        postgres: include_str!("postgres/0008_muc.sql"),
    },
    SchemaStep {
        version: 10,
        name: "muclight-blocking",
        sqlite: include_str!("sqlite/0010_muclight_blocking.sql"),
        postgres: include_str!("postgres/0010_muclight_blocking.sql"),
    },
];

/// The store on `storage`'s engine.
pub fn open(storage: &Storage) -> Arc<dyn MucStore> {
    match kit::engine(storage) {
        Engine::Sqlite(db) => Arc::new(db),
        Engine::Postgres(db) => Arc::new(db),
    }
}

/// [`open`], with every call timed into `metrics`
/// (`starling_storage_latency_seconds{store="muc"}`).
pub fn open_timed(storage: &Storage, metrics: &Metrics) -> Arc<dyn MucStore> {
    Timed::wrap(open(storage), metrics, "muc")
}

/// What account and domain deletion remove of group chat: an account's
/// affiliations and MUC Light blocking list; a service domain's rooms,
/// with their archives.
pub struct MucData {
    store: Arc<dyn MucStore>,
    archive: Arc<dyn ArchiveStore>,
}

impl MucData {
    /// Over `storage`'s engine.
    pub fn new(storage: &Storage) -> MucData {
        MucData {
            store: open(storage),
            archive: storage.archive.clone(),
        }
    }
}

#[async_trait]
impl OwnedData for MucData {
    fn name(&self) -> &'static str {
        super::NAME
    }

    async fn remove_user(&self, jid: &BareJid) -> StorageResult<()> {
        self.store.remove_user(jid).await
    }

    async fn remove_service(&self, domain: &str) -> StorageResult<()> {
        const PAGE: u32 = 500;
        loop {
            let rooms = self.store.rooms(domain, None, PAGE).await?;
            if rooms.is_empty() {
                return Ok(());
            }
            for r in &rooms {
                self.archive.purge_user(&r.jid, None).await?;
                self.store.delete_room(&r.jid).await?;
            }
        }
    }
}

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

timed_store!(MucStore {
    read fn room(&self, room: &BareJid) -> StorageResult<Option<StoredRoom>>;
    write fn put_room(&self, room: &StoredRoom) -> StorageResult<()>;
    write fn delete_room(&self, room: &BareJid) -> StorageResult<bool>;
    read fn rooms(&self, service: &str, after: Option<&str>, limit: u32) -> StorageResult<Vec<StoredRoom>>;
    read fn affiliations(&self, room: &BareJid) -> StorageResult<Vec<RoomAffiliation>>;
    write fn set_affiliations(&self, room: &BareJid, changes: &[RoomAffiliation]) -> StorageResult<()>;
    read fn rooms_of(&self, jid: &BareJid) -> StorageResult<Vec<(BareJid, RoomAffiliation)>>;
    write fn remove_user(&self, jid: &BareJid) -> StorageResult<()>;
    read fn light_blocking(&self, user: &BareJid) -> StorageResult<Vec<(String, BareJid)>>;
    write fn set_light_blocking(&self, user: &BareJid, deny: &[(String, BareJid)], allow: &[(String, BareJid)]) -> StorageResult<()>;
    read fn light_refusing(&self, users: &[BareJid], room: &BareJid, by: &BareJid) -> StorageResult<Vec<BareJid>>;
});
