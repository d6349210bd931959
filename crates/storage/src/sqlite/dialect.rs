//! SQLite's side of [`Dialect`]: the statements that differ from
//! PostgreSQL's. SQLite admits one writer at a time, so a one-statement
//! write is atomic and "check, then write" inside a write transaction
//! needs no lock. Writes queue, first come first served, for the one write
//! connection ([`SqliteStorage::writer`]); batches are multi-row `VALUES` statements of [`ROWS_PER_INSERT`] rows.
//! Every statement text is fixed or assembled from fixed fragments; all
//! values are bound.

use super::{inbox_log, SqliteStorage};
use crate::buckets::BucketWriter;
use crate::dialect::Dialect;
use crate::{backend, hash_name, now_secs, split};
use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection, Transaction};
use starling_core::storage::{
    apply_inbox_update, ArchiveId, ArchiveRecord, InboxRow, InboxUpdate, OfflineStoreError,
    StorageResult, UnreadChange,
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
    const ARCHIVE_BY_OWNER: &'static str = "archive INDEXED BY archive_by_owner";

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
        // Appended to the log (a few pages at the end of a small table)
        // and committed: durable from here. The table itself is written by
        // the merges (`inbox_log.rs`).
        let append = self.inbox.append.lock().await;
        let mut tx = self.begin_write().await.map_err(backend)?;
        let mut seq = 0;
        for chunk in updates.chunks(ROWS_PER_INSERT) {
            let mut b = QueryBuilder::<Sqlite>::new(
                "INSERT INTO inbox_log (domain, username, remote, last_id, unread_op, unread, shared) ",
            );
            b.push_values(chunk, |mut row, u| {
                let (domain, user) = split(&u.owner);
                let (op, n) = unread_op(u.unread);
                row.push_bind(domain)
                    .push_bind(user)
                    .push_bind(u.remote.as_str())
                    .push_bind(u.last.map(|id| id.0))
                    .push_bind(op)
                    .push_bind(n)
                    .push_bind(u.shared);
            });
            seq = b
                .build()
                .execute(&mut *tx)
                .await
                .map_err(backend)?
                .last_insert_rowid();
        }
        tx.commit().await.map_err(backend)?;
        self.inbox.fold(updates, seq);
        drop(append);
        // The background task merges from `merge_rows` on; if updates come
        // faster than it merges, this writer waits for a merge of its own
        // at twice that: the inbox queue then fills and the sessions stop
        // reading (write-behind back-pressure) rather than memory growing.
        let cap = self.inbox_options.merge_rows.saturating_mul(2);
        if self.inbox_options.merge_inline || self.inbox.load().0 >= cap {
            self.merge_inbox().await?;
        }
        Ok(())
    }

    async fn inbox_rows(
        &self,
        owner: &BareJid,
        remote: Option<&str>,
    ) -> StorageResult<Vec<(String, InboxRow)>> {
        let (domain, user) = split(owner);
        loop {
            // The pending updates first, then the rows and the merge
            // generation in one read transaction: if a merge chunk
            // committed in between, some of the updates may be in the rows
            // already; read again (`inbox_log.rs`).
            let (pending, gen) = self.inbox.of_owner(domain, user);
            let mut tx = self.pool.begin().await.map_err(backend)?;
            let rows = sqlx::query(
                "SELECT remote, last_id, unread, shared FROM inbox
                 WHERE domain = ? AND username = ? AND (? IS NULL OR remote = ?)",
            )
            .bind(domain)
            .bind(user)
            .bind(remote)
            .bind(remote)
            .fetch_all(&mut *tx)
            .await
            .map_err(backend)?;
            let db_gen: i64 = sqlx::query_scalar("SELECT gen FROM inbox_merge WHERE id = 1")
                .fetch_one(&mut *tx)
                .await
                .map_err(backend)?;
            tx.commit().await.map_err(backend)?;
            if db_gen != gen && self.inbox.moved_by_us(gen, db_gen) {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                continue;
            }
            let mut out: std::collections::HashMap<String, InboxRow> = rows
                .iter()
                .map(|r| {
                    (
                        r.get::<String, _>(0),
                        crate::inbox_row(r.get(1), r.get(2), r.get(3)),
                    )
                })
                .collect();
            for (r, ops) in pending {
                if remote.is_some_and(|x| x != r) {
                    continue;
                }
                // One update value per conversation, its change replaced
                // per pending op (no JID is parsed again per op).
                let mut u = InboxUpdate {
                    owner: owner.clone(),
                    remote: r.clone(),
                    last: None,
                    unread: UnreadChange::Keep,
                    shared: false,
                };
                let mut row = out.get(&r).copied();
                for op in &ops {
                    u.last = op.last.map(ArchiveId);
                    u.unread = op.unread;
                    u.shared = op.shared;
                    row = apply_inbox_update(row, &u);
                }
                match row {
                    Some(row) => out.insert(r, row),
                    None => out.remove(&r),
                };
            }
            return Ok(out.into_iter().collect());
        }
    }

    async fn delete_inbox(&self, owner: &BareJid, remote: Option<&str>) -> StorageResult<u64> {
        let (domain, user) = split(owner);
        // No merge may write these conversations back after the delete:
        // a set a failed merge left is finished first.
        let merge = self.inbox.merge.lock().await;
        if self.inbox.has_frozen() {
            self.merge_inbox_locked().await?;
        }
        let _append = self.inbox.append.lock().await;
        let existed = self.inbox_rows(owner, remote).await?.len() as u64;
        let mut tx = self.begin_write().await.map_err(backend)?;
        for sql in [
            // The log has no index by owner: a scan of at most one merge's
            // worth of rows (removals are rare).
            "DELETE FROM inbox_log WHERE domain = ? AND username = ? AND (? IS NULL OR remote = ?)",
            "DELETE FROM inbox WHERE domain = ? AND username = ? AND (? IS NULL OR remote = ?)",
        ] {
            sqlx::query(sql)
                .bind(domain)
                .bind(user)
                .bind(remote)
                .bind(remote)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
        }
        tx.commit().await.map_err(backend)?;
        self.inbox.forget(domain, user, remote);
        drop(merge);
        Ok(existed)
    }
}

/// How an unread change is stored in `inbox_log`: (0 keep | 1 add | 2 set, n).
fn unread_op(c: UnreadChange) -> (i64, i64) {
    match c {
        UnreadChange::Keep => (0, 0),
        UnreadChange::Add(n) => (1, i64::from(n)),
        UnreadChange::Set(n) => (2, i64::from(n)),
    }
}

/// The inverse of [`unread_op`].
fn unread_change(op: i64, n: i64) -> UnreadChange {
    let n = n.clamp(0, i64::from(u32::MAX)) as u32;
    match op {
        1 => UnreadChange::Add(n),
        2 => UnreadChange::Set(n),
        _ => UnreadChange::Keep,
    }
}

impl SqliteStorage {
    /// Merges the pending inbox updates into the table (`inbox_log.rs`).
    pub(crate) async fn merge_inbox(&self) -> StorageResult<()> {
        let _merge = self.inbox.merge.lock().await;
        self.merge_inbox_locked().await
    }

    /// [`SqliteStorage::merge_inbox`] with `merge` held: in key order,
    /// [`inbox_log::MERGE_CHUNK`] conversations per transaction, each
    /// recording how far it got; then the log rows go.
    pub(crate) async fn merge_inbox_locked(&self) -> StorageResult<()> {
        let frozen = {
            let _append = self.inbox.append.lock().await;
            self.inbox.freeze()
        };
        let Some(frozen) = frozen else {
            return Ok(());
        };
        let to_merge: Vec<(&inbox_log::Key, &Vec<inbox_log::Op>)> = frozen
            .set
            .iter()
            .filter(|(k, _)| frozen.merged_upto.as_ref().is_none_or(|m| *k > m))
            .collect();
        for chunk in to_merge.chunks(inbox_log::MERGE_CHUNK) {
            let upto = chunk[chunk.len() - 1].0.clone();
            let mut tx = self.begin_write().await.map_err(backend)?;
            for round in inbox_log::rounds(chunk) {
                apply_inbox_rows(&mut tx, &round).await?;
            }
            let gen: i64 = sqlx::query_scalar(
                "UPDATE inbox_merge SET gen = gen + 1, seq_upto = ?,
                 key_domain = ?, key_username = ?, key_remote = ? WHERE id = 1
                 RETURNING gen",
            )
            .bind(frozen.seq)
            .bind(upto.parts().0)
            .bind(upto.parts().1)
            .bind(upto.parts().2)
            .fetch_one(&mut *tx)
            .await
            .map_err(backend)?;
            tx.commit().await.map_err(backend)?;
            self.inbox.chunk_committed(upto, gen);
        }
        let mut tx = self.begin_write().await.map_err(backend)?;
        retire_merged_log(&mut tx, frozen.seq, None).await?;
        tx.commit().await.map_err(backend)?;
        self.inbox.thaw();
        Ok(())
    }

    /// Recovery at open: deletes the log rows an interrupted merge had
    /// written to the table, loads the rest (a crash's leftovers) and
    /// merges them like any other pending updates.
    pub(crate) async fn recover_inbox_log(&self) -> StorageResult<()> {
        let mut tx = self.begin_write().await.map_err(backend)?;
        let state = sqlx::query(
            "SELECT gen, seq_upto, key_domain, key_username, key_remote FROM inbox_merge WHERE id = 1",
        )
        .fetch_one(&mut *tx)
        .await
        .map_err(backend)?;
        self.inbox.set_gen(state.get(0));
        let seq_upto: i64 = state.get(1);
        if let (Some(d), Some(u), Some(r)) = (
            state.get::<Option<String>, _>(2),
            state.get::<Option<String>, _>(3),
            state.get::<Option<String>, _>(4),
        ) {
            retire_merged_log(&mut tx, seq_upto, Some(&inbox_log::Key::new(&d, &u, &r))).await?;
        }
        let rows = sqlx::query(
            "SELECT seq, domain, username, remote, last_id, unread_op, unread, shared
             FROM inbox_log ORDER BY seq",
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        let Some(last) = rows.last() else {
            return Ok(());
        };
        let seq: i64 = last.get(0);
        let updates: Vec<InboxUpdate> = rows
            .iter()
            .filter_map(|r| {
                let owner =
                    BareJid::new(&format!("{}@{}", r.get::<&str, _>(2), r.get::<&str, _>(1)))
                        .ok()?;
                Some(InboxUpdate {
                    owner,
                    remote: r.get(3),
                    last: r.get::<Option<i64>, _>(4).map(ArchiveId),
                    unread: unread_change(r.get(5), r.get(6)),
                    shared: r.get(7),
                })
            })
            .collect();
        self.inbox.fold(&updates, seq);
        self.merge_inbox().await?;
        tracing::info!(
            log_rows = rows.len(),
            "inbox: merged the updates a crash left in the log"
        );
        Ok(())
    }
}

/// Deletes the log rows a merge has written to the table — up to `seq`,
/// and of an interrupted merge only those of the conversations up to
/// `upto` — and clears the merge's progress, in the caller's transaction.
async fn retire_merged_log(
    tx: &mut SqliteConnection,
    seq: i64,
    upto: Option<&inbox_log::Key>,
) -> StorageResult<()> {
    let mut b = QueryBuilder::<Sqlite>::new("DELETE FROM inbox_log WHERE seq <= ");
    b.push_bind(seq);
    if let Some((d, u, r)) = upto.map(inbox_log::Key::parts) {
        b.push(" AND (domain, username, remote) <= (")
            .push_bind(d)
            .push(", ")
            .push_bind(u)
            .push(", ")
            .push_bind(r)
            .push(")");
    }
    b.build().execute(&mut *tx).await.map_err(backend)?;
    sqlx::query(
        "UPDATE inbox_merge SET key_domain = NULL, key_username = NULL, key_remote = NULL
         WHERE id = 1",
    )
    .execute(&mut *tx)
    .await
    .map_err(backend)?;
    Ok(())
}

/// Applies inbox updates, one per conversation, to the table in the
/// caller's transaction, with the rules of [`apply_inbox_update`].
async fn apply_inbox_rows(tx: &mut SqliteConnection, merged: &[InboxUpdate]) -> StorageResult<()> {
    let (with_last, count_only): (Vec<&InboxUpdate>, Vec<&InboxUpdate>) =
        merged.iter().partition(|u| u.last.is_some());
    let (setting, adding): (Vec<&InboxUpdate>, Vec<&InboxUpdate>) = with_last
        .into_iter()
        .partition(|u| matches!(u.unread, UnreadChange::Set(_)));
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
    Ok(())
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
