//! The store's SQL (`sql.rs`) compiled for SQLite, and SQLite's batch
//! writes: one statement per JID in one transaction on the write
//! connection (SQLite has no arrays to bind; each statement is a B-tree
//! probe on the one writer, so a list of a few hundred JIDs stays well
//! under a millisecond per JID).

use starling_core::storage::StorageResult;
use starling_proto::BareJid;
use starling_storage::kit::{backend, split, sqlx, SqlEngine};

/// The backend `sql.rs` implements the store for.
type Store = starling_storage::kit::SqliteStorage;

#[path = "sql.rs"]
#[allow(
    clippy::duplicate_mod,
    reason = "compiled once per engine on purpose, see starling_storage::kit"
)]
mod sql;

/// `BlockingStore::block`: the newly added JIDs, in the caller's order,
/// each once.
async fn insert(db: &Store, owner: &BareJid, jids: &[String]) -> StorageResult<Vec<String>> {
    let (domain, user) = split(owner);
    let mut tx = db.writer().begin().await.map_err(backend)?;
    let mut added = Vec::new();
    for j in jids {
        let n = sqlx::query(
            "INSERT INTO blocklist (domain, username, jid) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        )
        .bind(domain)
        .bind(user)
        .bind(j)
        .execute(&mut *tx)
        .await
        .map_err(backend)?
        .rows_affected();
        if n > 0 {
            added.push(j.clone());
        }
    }
    tx.commit().await.map_err(backend)?;
    Ok(added)
}

/// `BlockingStore::unblock`: the removed JIDs, in the caller's order,
/// each once.
async fn delete(db: &Store, owner: &BareJid, jids: &[String]) -> StorageResult<Vec<String>> {
    let (domain, user) = split(owner);
    let mut tx = db.writer().begin().await.map_err(backend)?;
    let mut removed = Vec::new();
    for j in jids {
        let n =
            sqlx::query("DELETE FROM blocklist WHERE domain = $1 AND username = $2 AND jid = $3")
                .bind(domain)
                .bind(user)
                .bind(j)
                .execute(&mut *tx)
                .await
                .map_err(backend)?
                .rows_affected();
        if n > 0 {
            removed.push(j.clone());
        }
    }
    tx.commit().await.map_err(backend)?;
    Ok(removed)
}
