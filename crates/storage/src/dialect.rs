//! What differs between SQLite and PostgreSQL, in one list: the
//! [`Dialect`] trait. Everything else is written once, in `shared/`.
//!
//! # How the stores are shared
//!
//! `shared/` holds the store implementations whose SQL is the same on both
//! engines. It is an ordinary module compiled once into each backend
//! (`#[path = "../shared/mod.rs"] mod shared;` in `sqlite/mod.rs` and
//! `postgres/mod.rs`), where `Store` names that backend's type. After that
//! the code is as concrete as if it had been written twice: sqlx checks
//! every bind and decode against the real driver, nothing is dispatched at
//! run time, and rustfmt, clippy and error messages see a normal file.
//! (Generic code over `sqlx::Database` was the alternative; it needs a
//! dozen `where` bounds on foreign types — `&str: Encode<DB>`,
//! `&mut DB::Connection: Executor` … — restated on every impl, because
//! Rust does not imply them from a trait.)
//!
//! The differences that turned out *not* to need a hook:
//!
//! - placeholders: shared statements are written with `$1…$n`, which
//!   PostgreSQL requires and SQLite accepts too (sqlx binds SQLite's
//!   `$NNN` parameters by number, and a number may repeat). Statement
//!   texts are `&'static str` literals: nothing is rewritten, ever.
//! - booleans: a Rust `bool` binds and decodes as PostgreSQL `BOOLEAN` and
//!   as SQLite `INTEGER` 0/1, and SQLite understands `TRUE`, `FALSE` and
//!   `NOT column`; statements use those.
//! - upserts (`ON CONFLICT … DO UPDATE SET x = excluded.x`, with a table
//!   alias where the new value refers to the old one), `RETURNING`, and
//!   aggregate `FILTER (WHERE …)` are spelled alike.
//! - collation: PostgreSQL's key columns are `COLLATE "C"` in the schema,
//!   so ordering is byte order as in SQLite, without a word in the queries.
//!
//! What does differ is below: how a transaction that reads before it writes
//! starts, row locks, the one multi-valued column type, the hot-path
//! writer's turn, and the batch writers (multi-row `VALUES` on SQLite, one
//! statement over arrays with `unnest` on PostgreSQL), whose SQL and
//! performance are each engine's own.

use sqlx::{Database, Transaction};
use starling_core::storage::{
    ArchiveRecord, InboxRow, InboxUpdate, OfflineStoreError, StorageResult,
};
use starling_proto::sasl::ScramCredentials;
use starling_proto::BareJid;

/// The connection type of a dialect's driver.
pub(crate) type Conn<D> = <<D as Dialect>::Db as Database>::Connection;

/// One backend's side of every statement that is not the same on both
/// engines. Implemented by [`crate::sqlite::SqliteStorage`] (in
/// `sqlite/dialect.rs`) and [`crate::postgres::PostgresStorage`] (in
/// `postgres/dialect.rs`); used by `shared/` with the concrete type only.
pub(crate) trait Dialect: Send + Sync + Sized + 'static {
    /// The sqlx driver.
    type Db: Database;

    /// How a list of strings is stored in one column (roster groups,
    /// archiving preferences): a `TEXT[]` on PostgreSQL, the items joined
    /// by a separator that cannot occur in them on SQLite.
    type List;

    /// True where `SELECT … FOR UPDATE` exists and is needed (PostgreSQL,
    /// where several nodes write at once); SQLite has one writer at a time
    /// and no such clause. Read through `kit::SqlEngine::ROW_LOCKS` by the
    /// `for_update!` macro (`kit.rs`), which picks one of two literals at
    /// compile time.
    const ROW_LOCKS: bool;

    /// The archive table, read through its by-conversation index
    /// (`archive_by_with`) for a query that names a conversation and its
    /// buckets ([`crate::buckets`]). SQLite has no statistics and might
    /// otherwise walk the owner's whole archive in id order to avoid a
    /// sort; PostgreSQL's planner decides from its statistics.
    const ARCHIVE_BY_WITH: &'static str;

    /// The archive table, read through its by-owner index
    /// (`archive_by_owner`, bucket first since schema step 15) for a query
    /// of an owner's whole archive and its buckets.
    const ARCHIVE_BY_OWNER: &'static str;

    /// `items` as a [`Self::List`] value; `sep` is SQLite's separator.
    fn encode_list(items: &[String], sep: char) -> Self::List;

    /// A stored [`Self::List`] back as its items (empty items are dropped).
    fn decode_list(stored: Self::List, sep: char) -> Vec<String>;

    /// Begins a transaction that may read before it writes. SQLite:
    /// `BEGIN IMMEDIATE`, which takes the write lock at once (a deferred
    /// transaction that reads first cannot upgrade once another writer has
    /// committed: `SQLITE_BUSY_SNAPSHOT`, not a wait); PostgreSQL: `BEGIN`,
    /// with the rows to protect locked by `FOR UPDATE`.
    async fn begin_write(&self) -> Result<Transaction<'static, Self::Db>, sqlx::Error>;

    /// Inserts the credentials of several accounts in the caller's
    /// transaction.
    async fn insert_credentials(
        conn: &mut Conn<Self>,
        accounts: &[(&BareJid, &[ScramCredentials])],
    ) -> Result<(), sqlx::Error>;

    /// [`AccountStore::create_many`](starling_core::storage::AccountStore::create_many):
    /// one transaction, existing accounts (and repeats) skipped.
    async fn insert_accounts(
        &self,
        accounts: &[(BareJid, Vec<ScramCredentials>)],
    ) -> StorageResult<u64>;

    /// [`OfflineStore::store`](starling_core::storage::OfflineStore::store):
    /// the quota check, the insert and the message's archive rows, atomic
    /// against every other writer of the owner's queue.
    async fn insert_offline(
        &self,
        owner: &BareJid,
        from: &str,
        stanza: &str,
        stamp_millis: i64,
        max_per_user: u32,
        archive: &[ArchiveRecord],
    ) -> Result<(), OfflineStoreError>;

    /// [`ArchiveStore::append`](starling_core::storage::ArchiveStore::append):
    /// a batch of the write-behind queue, idempotent by id.
    async fn insert_archive(&self, records: &[ArchiveRecord]) -> StorageResult<()>;

    /// [`InboxStore::apply`](starling_core::storage::InboxStore::apply): a
    /// batch of the write-behind queue as a few upserts.
    async fn upsert_inbox(&self, updates: &[InboxUpdate]) -> StorageResult<()>;

    /// `owner`'s conversations (`remote`: that one only) as a reader must
    /// see them: the stored rows, with any committed updates that are not
    /// in the table yet applied (SQLite's inbox log,
    /// `sqlite/inbox_log.rs`; PostgreSQL writes the table directly).
    async fn inbox_rows(
        &self,
        owner: &BareJid,
        remote: Option<&str>,
    ) -> StorageResult<Vec<(String, InboxRow)>>;

    /// [`InboxStore::remove`](starling_core::storage::InboxStore::remove)
    /// (`remote`) and
    /// [`InboxStore::remove_user`](starling_core::storage::InboxStore::remove_user)
    /// (`None`): the conversations' rows and pending changes; how many rows
    /// there were.
    async fn delete_inbox(&self, owner: &BareJid, remote: Option<&str>) -> StorageResult<u64>;
}
