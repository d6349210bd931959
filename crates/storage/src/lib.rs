//! Storage backends for the traits of `starling_core::storage`.
//!
//! - [`sqlite`]: embedded SQLite (the zero-configuration default), WAL mode,
//!   versioned migrations applied at start-up.
//! - [`postgres`]: PostgreSQL, for deployments of one or many nodes sharing
//!   a database; same traits, same semantics, same migrations (by version and
//!   name) and the same [`conformance`] suite.
//!
//! Architecture invariant: SQL appears only in this crate, always with bound
//! parameters, never with values formatted into the statement text.

pub mod conformance;
mod dynsql;
pub mod fsperm;
mod migrate;
pub mod postgres;
pub mod sqlite;

use starling_core::storage::Storage;
use starling_proto::BareJid;

/// An account's key columns: `(domain, username)`.
pub(crate) fn split(jid: &BareJid) -> (&str, &str) {
    (
        jid.domain().as_str(),
        jid.node().map(|n| n.as_str()).unwrap_or(""),
    )
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
}

/// Opens the configured backend, applying pending migrations.
pub async fn open(config: &BackendConfig) -> Result<Storage, OpenError> {
    match config {
        BackendConfig::Sqlite { path, pool_size } => {
            let db = sqlite::SqliteStorage::open(path, *pool_size).await?;
            Ok(db.into_storage())
        }
        BackendConfig::Postgres { url, pool_size } => {
            let db = postgres::PostgresStorage::open(url, *pool_size).await?;
            Ok(db.into_storage())
        }
    }
}
