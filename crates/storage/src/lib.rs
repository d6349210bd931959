//! Storage backends for the traits of `starling_core::storage`.
//!
//! - [`sqlite`]: embedded SQLite (the zero-configuration default), WAL mode,
//!   versioned migrations applied at start-up.
//! - [`postgres`]: PostgreSQL, for deployments of one or many nodes sharing
//!   a database; same traits, same semantics, same migrations (by version and
//!   name) and the same [`conformance`] suite.
//!
//! Architecture invariant: SQL appears only in this crate and in modules'
//! own stores written with [`kit`], always with bound parameters, never
//! with values formatted into the statement text.
//!
//! # Layout
//!
//! - `shared/`: the stores whose SQL is the same on both engines, written
//!   once and compiled into each backend (where `Store` is that backend's
//!   type). Statements use `$1…$n` placeholders, which both engines accept.
//! - `dialect.rs`: the `Dialect` trait, the one list of what
//!   differs (row locks, write transactions, the list column type, the
//!   batch writers), and why the rest does not.
//! - `sqlite/dialect.rs`, `postgres/dialect.rs`: each engine's side of
//!   that list; `sqlite/mod.rs`, `postgres/mod.rs`: opening, migrations,
//!   lifecycle.
//! - `dynsql.rs`: statements assembled at run time (archive and inbox
//!   pages), from fixed fragments, for both engines.
//!
//! # How to add a store
//!
//! A store that one module alone uses lives in that module's folder
//! instead ([`kit`] says how; the group-chat store of the server's
//! `modules/muc/store/` is the model). A store several modules share:
//!
//! 1. Declare the trait in `starling_core::storage` and add its handle to
//!    `Storage` (and to `into_storage` in `shared/mod.rs`).
//! 2. Add a schema step: its name to `STEPS` in `migrate.rs`, its script
//!    to both backends (`sqlite/000N_*.sql`, `postgres/000N_*.sql`, listed
//!    in their `MIGRATIONS`): SQLite `INTEGER` where PostgreSQL has
//!    `BIGINT`/`BOOLEAN`, and `COLLATE "C"` on PostgreSQL's key columns.
//! 3. Implement the trait once, in a new file of `shared/` (declared in
//!    `shared/mod.rs`): `$n` placeholders, `TRUE`/`FALSE`, upserts with
//!    `excluded.`, `RETURNING`; reads on `self.pool`, every write on
//!    `self.writer` (SQLite's one write connection, whose page cache stays
//!    warm; the same pool on PostgreSQL); `self.begin_write()` for a
//!    transaction that reads before it writes, with `for_update!` (the
//!    macro of [`kit`]) on the
//!    rows it protects.
//! 4. Only where the engines really differ (a batch over arrays, an
//!    advisory lock, a type with no common spelling), add a method to
//!    `Dialect` and implement it in both `*/dialect.rs`.
//! 5. Add a function to [`conformance`] (the store's file in
//!    `src/conformance/`, or a new file re-exported from its `mod.rs`) and
//!    call it from `run_all` in `conformance/mod.rs`; it runs on both
//!    engines (`tests/conformance_*.rs`).

pub mod buckets;
pub mod conformance;
mod dialect;
mod dynsql;
pub mod fsperm;
#[macro_use]
pub mod kit;
mod migrate;
pub mod postgres;
pub mod sqlite;

use starling_core::storage::{Storage, StorageError};
use starling_proto::sasl::ScramHash;
use starling_proto::BareJid;
use std::time::{SystemTime, UNIX_EPOCH};

/// An inbox row from its stored columns (`unread` as either engine's
/// integer, clamped).
pub(crate) fn inbox_row(
    last_id: i64,
    unread: i64,
    shared: bool,
) -> starling_core::storage::InboxRow {
    starling_core::storage::InboxRow {
        last_id: starling_core::storage::ArchiveId(last_id),
        unread: unread.clamp(0, i64::from(u32::MAX)) as u32,
        shared,
    }
}

/// An account's (or a room's) key columns: `(domain, node)`.
pub fn split(jid: &BareJid) -> (&str, &str) {
    (
        jid.domain().as_str(),
        jid.node().map(|n| n.as_str()).unwrap_or(""),
    )
}

/// A driver error as a [`StorageError`] (the message is for logs).
pub fn backend(e: sqlx::Error) -> StorageError {
    StorageError::Backend(e.to_string())
}

/// Seconds since the Unix epoch.
pub(crate) fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The `hash` column of a credentials row.
pub(crate) fn hash_name(h: ScramHash) -> &'static str {
    match h {
        ScramHash::Sha1 => "sha1",
        ScramHash::Sha256 => "sha256",
        ScramHash::Sha512 => "sha512",
    }
}

/// Which backend to open, and where.
#[derive(Clone, Debug)]
pub enum BackendConfig {
    /// An SQLite database file (created if missing).
    Sqlite {
        /// Path of the database file.
        path: std::path::PathBuf,
        /// Size of the connection pool.
        pool_size: u32,
    },
    /// A PostgreSQL database (it must exist; tables are created by the
    /// migrations).
    Postgres {
        /// `postgres://user[:password]@host[:port]/database[?sslmode=…]`.
        url: String,
        /// Size of the connection pool (per node).
        pool_size: u32,
    },
}

/// Opening a backend failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The database could not be opened or created.
    #[error("cannot open database {target}: {source}")]
    Connect {
        /// What we tried to open.
        target: String,
        /// The driver's error.
        source: sqlx::Error,
    },
    /// The storage settings are unusable (e.g. a malformed URL); the message
    /// says what to write instead.
    #[error("{0}")]
    Config(String),
    /// PostgreSQL could not be reached, refused us, or cannot be set up.
    #[error("cannot use PostgreSQL at {target}: {source}. {hint}")]
    Postgres {
        /// The server and database, without password.
        target: String,
        /// The driver's error.
        source: sqlx::Error,
        /// What the operator should check.
        hint: &'static str,
    },
    /// A schema migration failed.
    #[error("schema migration {version} ({name}) failed: {source}")]
    Migration {
        /// The migration's version.
        version: i64,
        /// The migration's name.
        name: &'static str,
        /// The driver's error.
        source: sqlx::Error,
    },
    /// The database was written by a newer Starling.
    #[error("database schema version {found} is newer than this build supports ({supported}); upgrade Starling or restore a backup")]
    TooNew {
        /// Version found in the database.
        found: i64,
        /// Highest version this build knows.
        supported: i64,
    },
    /// Work left by a crash could not be finished at start-up.
    #[error("cannot recover the {what} of {target}: {message}; check the disk and the file's permissions, then start again")]
    Recovery {
        /// The database.
        target: String,
        /// What was being recovered.
        what: &'static str,
        /// The error.
        message: String,
    },
}

/// Tuning that deployments leave alone; tests change it to see several
/// archive buckets with a handful of messages.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Archived rows per bucket of the by-conversation index
    /// ([`buckets`]); default [`buckets::DEFAULT_ROWS`].
    pub archive_bucket_rows: u64,
    /// How far (in microseconds of archive id) after the newest id a new
    /// bucket starts; default [`buckets::START_MARGIN_MICROS`].
    pub archive_bucket_margin_micros: i64,
    /// A new bucket also starts after the current time; default true
    /// (tests whose archive ids are small numbers turn it off).
    pub archive_bucket_follow_clock: bool,
    /// SQLite: pending inbox conversations that start a merge of the inbox
    /// log into the table (`sqlite/inbox_log.rs`); default
    /// [`INBOX_MERGE_ROWS`].
    pub inbox_merge_rows: usize,
    /// SQLite: seconds the oldest pending inbox change waits at most
    /// before a merge; default [`INBOX_MERGE_SECS`].
    pub inbox_merge_secs: u64,
    /// SQLite: merge after every batch (tests of the merged table).
    pub inbox_merge_inline: bool,
    /// The schema steps of modules' own stores (`Module::SCHEMA`), applied with the backend's (the server passes
    /// every module's: `starling_server::open_storage`).
    pub schema: Vec<starling_core::storage::SchemaStep>,
}

/// Default [`OpenOptions::inbox_merge_rows`]: ~30 MB of pending changes at
/// most, and a merge per ~17 s at 12,000 inbox updates a second, which
/// writes each page of a 4-million-conversation table about once
/// (`docs/benchmarks.md`, 2026-11-27).
pub const INBOX_MERGE_ROWS: usize = 200_000;

/// Default [`OpenOptions::inbox_merge_secs`].
pub const INBOX_MERGE_SECS: u64 = 30;

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            archive_bucket_rows: buckets::DEFAULT_ROWS,
            archive_bucket_margin_micros: buckets::START_MARGIN_MICROS,
            archive_bucket_follow_clock: true,
            inbox_merge_rows: INBOX_MERGE_ROWS,
            inbox_merge_secs: INBOX_MERGE_SECS,
            inbox_merge_inline: false,
            schema: Vec::new(),
        }
    }
}

/// Opens the configured backend, applying pending migrations.
pub async fn open(config: &BackendConfig) -> Result<Storage, OpenError> {
    open_with(config, &OpenOptions::default()).await
}

/// [`open`] with non-default [`OpenOptions`].
pub async fn open_with(
    config: &BackendConfig,
    options: &OpenOptions,
) -> Result<Storage, OpenError> {
    match config {
        BackendConfig::Sqlite { path, pool_size } => {
            let db = sqlite::SqliteStorage::open_with(path, *pool_size, options).await?;
            Ok(db.into_storage())
        }
        BackendConfig::Postgres { url, pool_size } => {
            let db = postgres::PostgresStorage::open_with(url, *pool_size, options).await?;
            Ok(db.into_storage())
        }
    }
}
