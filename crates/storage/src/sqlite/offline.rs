//! [`OfflineStore`] on SQLite. SQLite admits one writer at a time, so the
//! quota check and the insert (one statement) cannot interleave with another
//! writer, and take-and-delete hands each message to exactly one caller.
//! `store` writes the message's archive rows in the same transaction.

use super::archive::insert_archive_rows;
use super::{backend, split, SqliteStorage};
use async_trait::async_trait;
use sqlx::Row;
use starling_core::storage::{
    ArchiveRecord, OfflineMessage, OfflineStore, OfflineStoreError, StorageError,
};
use starling_proto::BareJid;

fn message(r: sqlx::sqlite::SqliteRow) -> OfflineMessage {
    OfflineMessage {
        id: r.get(0),
        from: r.get(1),
        stanza: r.get(2),
        stamp_millis: r.get(3),
    }
}

#[async_trait]
impl OfflineStore for SqliteStorage {
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
        // The archive rows first: the transaction's first statement writes,
        // so it takes SQLite's write lock at once (no read-to-write upgrade).
        let _turn = self.write_turn.lock().await;
        let mut tx = self.pool.begin().await.map_err(backend)?;
        insert_archive_rows(&mut tx, archive).await?;
        let n = sqlx::query(
            "INSERT INTO offline_messages (domain, username, sender, stanza, stamp)
             SELECT ?, ?, ?, ?, ?
             WHERE (SELECT COUNT(*) FROM offline_messages
                    WHERE domain = ? AND username = ?) < ?",
        )
        .bind(domain)
        .bind(user)
        .bind(from)
        .bind(stanza)
        .bind(stamp_millis)
        .bind(domain)
        .bind(user)
        .bind(i64::from(max_per_user))
        .execute(&mut *tx)
        .await
        .map_err(backend)?
        .rows_affected();
        if n == 0 {
            // Dropping the transaction rolls the archive rows back too.
            return Err(OfflineStoreError::QuotaExceeded { max: max_per_user });
        }
        tx.commit().await.map_err(backend)?;
        Ok(())
    }

    async fn fetch_all(&self, owner: &BareJid) -> Result<Vec<OfflineMessage>, StorageError> {
        let (domain, user) = split(owner);
        let rows = sqlx::query(
            "SELECT id, sender, stanza, stamp FROM offline_messages
             WHERE domain = ? AND username = ? ORDER BY id",
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
        let _turn = self.write_turn.lock().await;
        let n = sqlx::query(
            "DELETE FROM offline_messages WHERE domain = ? AND username = ? AND id <= ?",
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
        let _turn = self.write_turn.lock().await;
        // RETURNING gives no order guarantee: sort by id afterwards.
        let rows = sqlx::query(
            "DELETE FROM offline_messages WHERE domain = ? AND username = ?
             RETURNING id, sender, stanza, stamp",
        )
        .bind(domain)
        .bind(user)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        let mut v: Vec<_> = rows.into_iter().map(message).collect();
        v.sort_by_key(|m| m.id);
        Ok(v)
    }

    async fn count(&self, owner: &BareJid) -> Result<u64, StorageError> {
        let (domain, user) = split(owner);
        let n: i64 =
            sqlx::query("SELECT COUNT(*) FROM offline_messages WHERE domain = ? AND username = ?")
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
            "DELETE FROM offline_messages WHERE domain = ? AND username = ?",
            owner,
        )
        .await
    }
}
