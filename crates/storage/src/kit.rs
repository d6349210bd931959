//! What a module needs to keep a store of its own in its folder: its trait,
//! its SQL written once for both engines, its schema steps.
//!
//! The pattern is the one of this crate's `shared/` (see `dialect.rs`):
//! the module's SQL file is compiled once per engine, in a module where
//! `Store` names that engine's backend type, and implements the module's
//! trait for it:
//!
//! ```ignore
//! // on_sqlite.rs, beside sql.rs (and on_postgres.rs alike)
//! type Store = starling_storage::kit::SqliteStorage;
//! #[path = "sql.rs"]
//! mod sql;
//! ```
//!
//! In that file, reads go to [`SqlEngine::reader`], every write to
//! [`SqlEngine::writer`] (SQLite's one write connection; the same pool on
//! PostgreSQL), a transaction that reads before it writes starts with
//! [`SqlEngine::begin_write`] and locks the rows it protects with
//! [`for_update!`](crate::for_update). Statements use `$1…$n`
//! placeholders, `TRUE`/`FALSE`, upserts with `excluded.`, `RETURNING`;
//! only bound parameters, never values formatted into the text. The
//! module finds the opened engine with [`engine`], declares its tables as
//! `Module::SCHEMA` steps, and its per-account and per-domain data as
//! `Module::owned_data`. `modules/muc/store/` of the server is the model.

use crate::dialect::Dialect;
pub use crate::postgres::PostgresStorage;
pub use crate::sqlite::SqliteStorage;
pub use crate::{backend, split};
pub use sqlx;
use starling_core::storage::Storage;
use std::future::Future;

/// What a module's SQL sees of an engine's backend.
pub trait SqlEngine: Clone + Send + Sync + 'static {
    /// The sqlx driver.
    type Db: sqlx::Database;
    /// True where `SELECT … FOR UPDATE` exists and is needed (PostgreSQL);
    /// use it through [`for_update!`](crate::for_update).
    const ROW_LOCKS: bool;
    /// The pool for reads.
    fn reader(&self) -> &sqlx::Pool<Self::Db>;
    /// The pool every write goes through.
    fn writer(&self) -> &sqlx::Pool<Self::Db>;
    /// Begins a transaction that may read before it writes (SQLite:
    /// `BEGIN IMMEDIATE`; PostgreSQL: `BEGIN`, with `FOR UPDATE` on the
    /// rows to protect).
    fn begin_write(
        &self,
    ) -> impl Future<Output = Result<sqlx::Transaction<'static, Self::Db>, sqlx::Error>> + Send;
}

impl SqlEngine for SqliteStorage {
    type Db = sqlx::Sqlite;
    const ROW_LOCKS: bool = <SqliteStorage as Dialect>::ROW_LOCKS;
    fn reader(&self) -> &sqlx::SqlitePool {
        &self.pool
    }
    fn writer(&self) -> &sqlx::SqlitePool {
        &self.writer
    }
    fn begin_write(
        &self,
    ) -> impl Future<Output = Result<sqlx::Transaction<'static, sqlx::Sqlite>, sqlx::Error>> + Send
    {
        Dialect::begin_write(self)
    }
}

impl SqlEngine for PostgresStorage {
    type Db = sqlx::Postgres;
    const ROW_LOCKS: bool = <PostgresStorage as Dialect>::ROW_LOCKS;
    fn reader(&self) -> &sqlx::PgPool {
        &self.pool
    }
    fn writer(&self) -> &sqlx::PgPool {
        &self.writer
    }
    fn begin_write(
        &self,
    ) -> impl Future<Output = Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error>> + Send
    {
        Dialect::begin_write(self)
    }
}

/// The engine a [`Storage`] was opened on.
pub enum Engine {
    /// SQLite.
    Sqlite(SqliteStorage),
    /// PostgreSQL.
    Postgres(PostgresStorage),
}

/// The engine of `storage` (one this crate opened: every [`Storage`] of a
/// server is).
///
/// # Panics
///
/// If `storage` was put together elsewhere from another backend.
pub fn engine(storage: &Storage) -> Engine {
    let any = storage.backend.as_any();
    if let Some(db) = any.downcast_ref::<SqliteStorage>() {
        Engine::Sqlite(db.clone())
    } else if let Some(db) = any.downcast_ref::<PostgresStorage>() {
        Engine::Postgres(db.clone())
    } else {
        panic!(
            "storage backend {} is not one of starling_storage's",
            storage.backend.describe()
        )
    }
}

/// `$sql` with ` FOR UPDATE` appended where the engine has row locks
/// ([`SqlEngine::ROW_LOCKS`] of the `Store` in scope); both texts are
/// literals, chosen at compile time.
#[macro_export]
macro_rules! for_update {
    ($sql:literal) => {
        if <Store as $crate::kit::SqlEngine>::ROW_LOCKS {
            concat!($sql, " FOR UPDATE")
        } else {
            $sql
        }
    };
}
