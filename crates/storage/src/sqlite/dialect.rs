//! SQLite's side of [`Dialect`]: the statements that differ from
//! PostgreSQL's. SQLite admits one writer at a time, so a one-statement
//! write is atomic and "check, then write" inside a write transaction
//! needs no lock. Writes queue, first come first served, for the one write
//! connection ([`SqliteStorage::writer`]); batches are multi-row `VALUES` statements of [`ROWS_PER_INSERT`] rows.
//! Every statement text is fixed or assembled from fixed fragments; all
//! values are bound.

use super::SqliteStorage;
use crate::buckets::BucketWriter;
use crate::dialect::Dialect;
use crate::{backend, hash_name, now_secs, split};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection, Transaction};
use starling_core::storage::{
    coalesce_inbox_updates, ArchiveRecord, InboxUpdate, OfflineStoreError, StorageResult,
    UnreadChange,
};
use starling_proto::sasl::ScramCredentials;
use starling_proto::BareJid;

/// Rows per INSERT statement (10 parameters each, far below SQLite's limit).
const ROWS_PER_INSERT: usize = 200;

impl Dialect for SqliteStorage {
    type Db = Sqlite;
    type List = String;
    const ROW_LOCKS: bool = false;
    const ARCHIVE_BY_WITH: &'static str = "archive INDEXED BY archive_by_with";

    fn encode_list(items: &[String], sep: char) -> String {
        items.join(&sep.to_string())
    }

    fn decode_list(stored: String, sep: char) -> Vec<String> {
        stored
            .split(sep)
            .filter(|x| !x.is_empty())
            .map(str::to_owned)
            .collect()
    }

    async fn begin_write(&self) -> Result<Transaction<'static, Sqlite>, sqlx::Error> {
        self.writer.begin_with("BEGIN IMMEDIATE").await
    }

    async fn insert_credentials(
        conn: &mut SqliteConnection,
        accounts: &[(&BareJid, &[ScramCredentials])],
    ) -> Result<(), sqlx::Error> {
        for (jid, credentials) in accounts {
            let (domain, user) = split(jid);
            for c in credentials.iter() {
                sqlx::query(
                    "INSERT INTO account_credentials
                     (domain, username, hash, salt, iterations, stored_key, server_key)
                     VALUES (?, ?, ?, ?, ?, ?, ?)",
                )
                .bind(domain)
                .bind(user)
                .bind(hash_name(c.hash))
                .bind(&c.salt)
                .bind(c.iterations as i64)
                .bind(&c.stored_key)
                .bind(&c.server_key)
                .execute(&mut *conn)
                .await?;
            }
        }
        Ok(())
    }

    async fn insert_accounts(
        &self,
        accounts: &[(BareJid, Vec<ScramCredentials>)],
    ) -> StorageResult<u64> {
        let mut tx = self.writer.begin().await.map_err(backend)?;
        let mut created = 0;
        let now = now_secs();
        for (jid, creds) in accounts {
            let (domain, user) = split(jid);
            let n = sqlx::query(
                "INSERT INTO accounts (domain, username, created_at) VALUES (?, ?, ?)
                 ON CONFLICT DO NOTHING",
            )
            .bind(domain)
            .bind(user)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(backend)?
            .rows_affected();
            if n == 1 {
                Self::insert_credentials(&mut tx, &[(jid, creds)])
                    .await
                    .map_err(backend)?;
                created += 1;
            }
        }
        tx.commit().await.map_err(backend)?;
        Ok(created)
    }

    async fn insert_blocked(&self, owner: &BareJid, jids: &[String]) -> StorageResult<Vec<String>> {
        let (domain, user) = split(owner);
        let mut tx = self.writer.begin().await.map_err(backend)?;
        let mut added = Vec::new();
        for j in jids {
            let n = sqlx::query(
                "INSERT INTO blocklist (domain, username, jid) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
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

    async fn delete_blocked(&self, owner: &BareJid, jids: &[String]) -> StorageResult<Vec<String>> {
        let (domain, user) = split(owner);
        let mut tx = self.writer.begin().await.map_err(backend)?;
        let mut removed = Vec::new();
        for j in jids {
            let n =
                sqlx::query("DELETE FROM blocklist WHERE domain = ? AND username = ? AND jid = ?")
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

    async fn insert_offline(
        &self,
        owner: &BareJid,
        from: &str,
        stanza: &str,
        stamp_millis: i64,
        max_per_user: u32,
        archive: &[ArchiveRecord],
    ) -> Result<(), OfflineStoreError> {
        let (domain, user) = split(owner);
        // BEGIN IMMEDIATE takes SQLite's write lock before the first
        // statement, which reads (the archive's bucket bounds): a deferred
        // transaction that reads and then writes gets SQLITE_BUSY at once,
        // without waiting, if another connection (another process on the
        // same file, such as the CLI) committed in between. Holding the
        // lock also keeps the quota check below atomic against such
        // writers.
        let mut tx = self.begin_write().await.map_err(backend)?;
        insert_archive_rows(&mut tx, &self.buckets, archive).await?;
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

    async fn insert_archive(&self, records: &[ArchiveRecord]) -> StorageResult<()> {
        // IMMEDIATE: the first statement reads the bucket bounds (see
        // insert_offline).
        let mut tx = self.begin_write().await.map_err(backend)?;
        insert_archive_rows(&mut tx, &self.buckets, records).await?;
        tx.commit().await.map_err(backend)
    }

    async fn upsert_inbox(&self, updates: &[InboxUpdate]) -> StorageResult<()> {
        // One row per conversation, so the groups below can run in any
        // order: new last messages that add to the count, new last
        // messages that set it, and count-only changes.
        let merged = coalesce_inbox_updates(updates);
        let (with_last, count_only): (Vec<&InboxUpdate>, Vec<&InboxUpdate>) =
            merged.iter().partition(|u| u.last.is_some());
        let (setting, adding): (Vec<&InboxUpdate>, Vec<&InboxUpdate>) = with_last
            .into_iter()
            .partition(|u| matches!(u.unread, UnreadChange::Set(_)));
        let mut tx = self.begin_write().await.map_err(backend)?;
        // A change that comes with an older message than the row's newest
        // does not touch the count: in a cluster, two nodes' queues may
        // write a message's count and the owner's later reset (a reply)
        // in either order, and archive ids are time-ordered across nodes
        // (docs/cluster.md). On one node the queue keeps the order, so
        // this only makes a replayed batch harmless.
        for (group, unread_sql) in [
            (
                &adding,
                "CASE WHEN excluded.last_id > last_id THEN unread + excluded.unread ELSE unread END",
            ),
            (
                &setting,
                "CASE WHEN excluded.last_id >= last_id THEN excluded.unread ELSE unread END",
            ),
        ] {
            for chunk in group.chunks(ROWS_PER_INSERT) {
                let mut b = QueryBuilder::<Sqlite>::new(
                    "INSERT INTO inbox (domain, username, remote, last_id, unread, shared) ",
                );
                b.push_values(chunk, |mut row, u| {
                    let (domain, user) = split(&u.owner);
                    let id = u.last.expect("partitioned on last");
                    let n = match u.unread {
                        UnreadChange::Keep => 0,
                        UnreadChange::Add(n) | UnreadChange::Set(n) => i64::from(n),
                    };
                    row.push_bind(domain)
                        .push_bind(user)
                        .push_bind(u.remote.as_str())
                        .push_bind(id.0)
                        .push_bind(n)
                        .push_bind(u.shared);
                });
                b.push(
                    " ON CONFLICT (domain, username, remote) DO UPDATE SET
                       last_id = MAX(last_id, excluded.last_id),
                       shared = CASE WHEN excluded.last_id >= last_id THEN excluded.shared ELSE shared END,
                       unread = ",
                );
                b.push(unread_sql);
                b.build().execute(&mut *tx).await.map_err(backend)?;
            }
        }
        for u in count_only {
            let (domain, user) = split(&u.owner);
            let (set, value) = match u.unread {
                UnreadChange::Keep => continue,
                UnreadChange::Add(n) => (0i64, i64::from(n)),
                UnreadChange::Set(n) => (1, i64::from(n)),
            };
            sqlx::query(
                "UPDATE inbox SET unread = CASE WHEN ? = 1 THEN ? ELSE unread + ? END
                 WHERE domain = ? AND username = ? AND remote = ?",
            )
            .bind(set)
            .bind(value)
            .bind(value)
            .bind(domain)
            .bind(user)
            .bind(u.remote.as_str())
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        }
        tx.commit().await.map_err(backend)
    }
}

/// Inserts archive rows (idempotent by id) in the caller's transaction;
/// shared by [`Dialect::insert_archive`] and [`Dialect::insert_offline`],
/// which writes a message's archive rows with it.
async fn insert_archive_rows(
    conn: &mut SqliteConnection,
    buckets: &BucketWriter,
    records: &[ArchiveRecord],
) -> StorageResult<()> {
    if records.is_empty() {
        return Ok(());
    }
    let (numbers, newest) = super::shared::buckets::assign(conn, records).await?;
    let rows: Vec<(&ArchiveRecord, i64)> = records.iter().zip(numbers).collect();
    for chunk in rows.chunks(ROWS_PER_INSERT) {
        let mut b = QueryBuilder::<Sqlite>::new(
            "INSERT OR IGNORE INTO archive
             (id, domain, username, with_bare, remote, outgoing, origin_id, flags, stanza, bucket) ",
        );
        b.push_values(chunk, |mut row, (r, bucket)| {
            let (domain, user) = split(&r.owner);
            row.push_bind(r.id.0)
                .push_bind(domain)
                .push_bind(user)
                .push_bind(r.with_bare.as_str())
                .push_bind(r.remote.as_str())
                .push_bind(i64::from(r.outgoing))
                .push_bind(r.origin_id.as_deref())
                .push_bind(i64::from(r.flags))
                .push_bind(r.stanza.as_str())
                .push_bind(*bucket);
        });
        b.build().execute(&mut *conn).await.map_err(backend)?;
    }
    super::shared::buckets::account(conn, buckets, newest, records.len() as u64).await
}
