//! [`OfflineStore`] on PostgreSQL.
//!
//! - `store`: a transaction takes the owner's advisory lock
//!   ([`OwnerLock::Offline`]), then inserts only if the owner's count is
//!   under the quota. The insert is a new statement, so under READ COMMITTED
//!   it sees every message committed by the previous lock holder: concurrent
//!   stores (from any node) cannot exceed the quota, and one owner's ids grow
//!   in commit order. The message's archive rows are inserted in the same
//!   transaction.
//! - `take_all`: one `DELETE … RETURNING`. A concurrent second delete waits
//!   for the first one's row locks and then finds the rows gone, so each
//!   message is handed to exactly one caller.

use super::archive::insert_archive_rows;
use super::{backend, split, OwnerLock, PostgresStorage};
use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::Row;
use starling_core::storage::{
    ArchiveRecord, OfflineMessage, OfflineStore, OfflineStoreError, StorageError,
};
use starling_proto::BareJid;

fn message(r: PgRow) -> OfflineMessage {
    OfflineMessage {
        id: r.get(0),
        from: r.get(1),
        stanza: r.get(2),
        stamp_millis: r.get(3),
    }
}

#[async_trait]
impl OfflineStore for PostgresStorage {
    async fn store(
        &self,
        owner: &BareJid,
        from: &str,
        stanza: &str,
        stamp_millis: i64,
        max_per_user: u32,
        archive: &[ArchiveRecord],
    ) -> Result<(), OfflineStoreError> {
        let (domain, user) = split(owner);
        let mut tx = self.pool.begin().await.map_err(backend)?;
        Self::lock_owner(&mut tx, OwnerLock::Offline, owner)
            .await
            .map_err(backend)?;
        let n = sqlx::query(
            "INSERT INTO offline_messages (domain, username, sender, stanza, stamp)
             SELECT $1, $2, $3, $4, $5
             WHERE (SELECT COUNT(*) FROM offline_messages
                    WHERE domain = $1 AND username = $2) < $6",
        )
        .bind(domain)
        .bind(user)
        .bind(from)
        .bind(stanza)
        .bind(stamp_millis)
        .bind(i64::from(max_per_user))
        .execute(&mut *tx)
        .await
        .map_err(backend)?
        .rows_affected();
        if n == 0 {
            return Err(OfflineStoreError::QuotaExceeded { max: max_per_user });
        }
        insert_archive_rows(&mut tx, archive).await?;
        // Durable once this returns (synchronous_commit of the server).
        tx.commit().await.map_err(backend)?;
        Ok(())
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
        .execute(&self.pool)
        .await
        .map_err(backend)?
        .rows_affected();
        Ok(n)
    }

    async fn take_all(&self, owner: &BareJid) -> Result<Vec<OfflineMessage>, StorageError> {
        let (domain, user) = split(owner);
        let rows = sqlx::query(
            "WITH taken AS (
                 DELETE FROM offline_messages WHERE domain = $1 AND username = $2
                 RETURNING id, sender, stanza, stamp)
             SELECT id, sender, stanza, stamp FROM taken ORDER BY id",
        )
        .bind(domain)
        .bind(user)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows.into_iter().map(message).collect())
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
