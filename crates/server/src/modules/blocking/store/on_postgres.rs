//! The store's SQL (`sql.rs`) compiled for PostgreSQL, and PostgreSQL's
//! batch writes: one statement over an array of JIDs, `WITH ORDINALITY`
//! keeping the caller's order (repeats within the list are written and
//! reported once).

use starling_core::storage::StorageResult;
use starling_proto::BareJid;
use starling_storage::kit::sqlx::{self, Row};
use starling_storage::kit::{backend, split, SqlEngine};

/// The backend `sql.rs` implements the store for.
type Store = starling_storage::kit::PostgresStorage;

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
    let rows = sqlx::query(
        "WITH added AS (
             INSERT INTO blocklist (domain, username, jid)
             SELECT $1, $2, j FROM unnest($3::text[]) AS t(j)
             ON CONFLICT DO NOTHING
             RETURNING jid)
         SELECT t.j FROM unnest($3::text[]) WITH ORDINALITY AS t(j, n)
         JOIN added a ON a.jid = t.j
         GROUP BY t.j ORDER BY MIN(t.n)",
    )
    .bind(domain)
    .bind(user)
    .bind(jids)
    .fetch_all(db.writer())
    .await
    .map_err(backend)?;
    Ok(rows.into_iter().map(|r| r.get(0)).collect())
}

/// `BlockingStore::unblock`: the removed JIDs, in the caller's order,
/// each once.
async fn delete(db: &Store, owner: &BareJid, jids: &[String]) -> StorageResult<Vec<String>> {
    let (domain, user) = split(owner);
    let rows = sqlx::query(
        "WITH gone AS (
             DELETE FROM blocklist
             WHERE domain = $1 AND username = $2 AND jid = ANY($3::text[])
             RETURNING jid)
         SELECT t.j FROM unnest($3::text[]) WITH ORDINALITY AS t(j, n)
         JOIN gone g ON g.jid = t.j
         GROUP BY t.j ORDER BY MIN(t.n)",
    )
    .bind(domain)
    .bind(user)
    .bind(jids)
    .fetch_all(db.writer())
    .await
    .map_err(backend)?;
    Ok(rows.into_iter().map(|r| r.get(0)).collect())
}
