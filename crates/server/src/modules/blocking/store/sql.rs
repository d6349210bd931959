//! [`BlockingStore`] in SQL, the same on both engines (compiled once for
//! each, where `Store` is its backend: see `mod.rs`), except the two
//! batch writes, each engine's own beside this file (`super::insert`,
//! `super::delete`). Rows are keyed by `(domain, username, jid)`.

use super::super::BlockingStore;
use super::Store;
use starling_core::async_trait;
use starling_core::storage::StorageResult;
use starling_proto::BareJid;
use starling_storage::kit::sqlx::{self, Row};
use starling_storage::kit::{backend, split, SqlEngine};

#[async_trait]
impl BlockingStore for Store {
    async fn blocklist(&self, owner: &BareJid) -> StorageResult<Vec<String>> {
        let (domain, user) = split(owner);
        let rows = sqlx::query(
            "SELECT jid FROM blocklist WHERE domain = $1 AND username = $2 ORDER BY jid",
        )
        .bind(domain)
        .bind(user)
        .fetch_all(self.reader())
        .await
        .map_err(backend)?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    async fn block(&self, owner: &BareJid, jids: &[String]) -> StorageResult<Vec<String>> {
        super::insert(self, owner, jids).await
    }

    async fn unblock(&self, owner: &BareJid, jids: &[String]) -> StorageResult<Vec<String>> {
        super::delete(self, owner, jids).await
    }

    async fn unblock_all(&self, owner: &BareJid) -> StorageResult<Vec<String>> {
        let (domain, user) = split(owner);
        let rows =
            sqlx::query("DELETE FROM blocklist WHERE domain = $1 AND username = $2 RETURNING jid")
                .bind(domain)
                .bind(user)
                .fetch_all(self.writer())
                .await
                .map_err(backend)?;
        // RETURNING gives no order guarantee.
        let mut v: Vec<String> = rows.into_iter().map(|r| r.get(0)).collect();
        v.sort();
        Ok(v)
    }
}
