//! [`OfflineStore`]. `store` is each engine's own
//! ([`Dialect::insert_offline`]: the quota check must be atomic against
//! other writers, by SQLite's single writer or by PostgreSQL's per-owner
//! advisory lock). `take_all` is one `DELETE … RETURNING`: a concurrent
//! second delete waits for the first one (SQLite's write lock, PostgreSQL's
//! row locks) and then finds the rows gone, so each message is handed to
//! exactly one caller.

use super::{backend, split, Db, Dialect, Store};
use async_trait::async_trait;
use sqlx::{Database, Row};
use starling_core::storage::{
    ArchiveRecord, OfflineMessage, OfflineStore, OfflineStoreError, StorageError,
};
use starling_proto::BareJid;

fn message(r: <Db as Database>::Row) -> OfflineMessage {
    OfflineMessage {
        id: r.get(0),
        from: r.get(1),
        stanza: r.get(2),
        stamp_millis: r.get(3),
    }
}

#[async_trait]
impl OfflineStore for Store {
    async fn store(
        &self,
        owner: &BareJid,
        from: &str,
        stanza: &str,
        stamp_millis: i64,
        max_per_user: u32,
        archive: &[ArchiveRecord],
    ) -> Result<(), OfflineStoreError> {
        self.insert_offline(owner, from, stanza, stamp_millis, max_per_user, archive)
            .await
    }

    async fn fetch_all(&self, owner: &BareJid) -> Result<Vec<OfflineMessage>, StorageError> {
        let (domain, user) = split(owner);
        let rows = sqlx::query(
            "SELECT id, sender, stanza, stamp FROM offline_messages
             WHERE domain = $1 AND username = $2 ORDER BY id",
        )
        .bind(domain)
        .bind(user)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows.into_iter().map(message).collect())
    }

    async fn delete_up_to(&self, owner: &BareJid, up_to_id: i64) -> Result<u64, StorageError> {
        let (domain, user) = split(owner);
        let n = sqlx::query(
            "DELETE FROM offline_messages WHERE domain = $1 AND username = $2 AND id <= $3",
        )
        .bind(domain)
        .bind(user)
        .bind(up_to_id)
        .execute(&self.writer)
        .await
        .map_err(backend)?
        .rows_affected();
        Ok(n)
    }

    async fn take_all(&self, owner: &BareJid) -> Result<Vec<OfflineMessage>, StorageError> {
        let (domain, user) = split(owner);
        let rows = sqlx::query(
            "DELETE FROM offline_messages WHERE domain = $1 AND username = $2
             RETURNING id, sender, stanza, stamp",
        )
        .bind(domain)
        .bind(user)
        .fetch_all(&self.writer)
        .await
        .map_err(backend)?;
        // RETURNING gives no order guarantee: sort by id afterwards.
        let mut v: Vec<_> = rows.into_iter().map(message).collect();
        v.sort_by_key(|m| m.id);
        Ok(v)
    }

    async fn count(&self, owner: &BareJid) -> Result<u64, StorageError> {
        let (domain, user) = split(owner);
        let n: i64 = sqlx::query(
            "SELECT COUNT(*) FROM offline_messages WHERE domain = $1 AND username = $2",
        )
        .bind(domain)
        .bind(user)
        .fetch_one(&self.pool)
        .await
        .map_err(backend)?
        .get(0);
        Ok(n as u64)
    }

    async fn remove_user(&self, owner: &BareJid) -> Result<(), StorageError> {
        self.exec_for_owner(
            "DELETE FROM offline_messages WHERE domain = $1 AND username = $2",
            owner,
        )
        .await
    }
}
