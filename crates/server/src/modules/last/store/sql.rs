//! [`LastActivityStore`] in SQL, the same on both engines (compiled once
//! for each, where `Store` is its backend: see `mod.rs`). One row per
//! account, keyed by `(domain, username)`.

use super::super::LastActivityStore;
use super::Store;
use starling_core::async_trait;
use starling_core::storage::StorageResult;
use starling_proto::BareJid;
use starling_storage::kit::sqlx::{self, Row};
use starling_storage::kit::{backend, split, SqlEngine};

#[async_trait]
impl LastActivityStore for Store {
    async fn get(&self, owner: &BareJid) -> StorageResult<Option<(u64, String)>> {
        let (domain, user) = split(owner);
        let row =
            sqlx::query("SELECT at, status FROM last_activity WHERE domain = $1 AND username = $2")
                .bind(domain)
                .bind(user)
                .fetch_optional(self.reader())
                .await
                .map_err(backend)?;
        Ok(row.map(|r| (r.get::<i64, _>(0) as u64, r.get(1))))
    }

    async fn set(&self, owner: &BareJid, at_unix_secs: u64, status: &str) -> StorageResult<()> {
        let (domain, user) = split(owner);
        sqlx::query(
            "INSERT INTO last_activity (domain, username, at, status) VALUES ($1, $2, $3, $4)
             ON CONFLICT (domain, username) DO UPDATE SET at = excluded.at, status = excluded.status",
        )
        .bind(domain)
        .bind(user)
        .bind(at_unix_secs as i64)
        .bind(status)
        .execute(self.writer())
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn remove_user(&self, owner: &BareJid) -> StorageResult<()> {
        let (domain, user) = split(owner);
        sqlx::query("DELETE FROM last_activity WHERE domain = $1 AND username = $2")
            .bind(domain)
            .bind(user)
            .execute(self.writer())
            .await
            .map_err(backend)?;
        Ok(())
    }
}
