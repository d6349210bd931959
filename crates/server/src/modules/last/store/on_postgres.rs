//! The store's SQL (`sql.rs`) compiled for PostgreSQL.

/// The backend `sql.rs` implements the store for.
type Store = starling_storage::kit::PostgresStorage;

#[path = "sql.rs"]
#[allow(
    clippy::duplicate_mod,
    reason = "compiled once per engine on purpose, see starling_storage::kit"
)]
mod sql;
