//! PostgreSQL's side of [`Dialect`]: the statements that differ from
//! SQLite's. Several nodes write at once, so "check, then write" is
//! explicit: rows locked `FOR UPDATE` (shared code, through
//! `for_update!`), per-owner advisory locks ([`PostgresStorage::lock_owner`],
//! the offline quota), and batches as one statement over arrays
//! (`INSERT … SELECT * FROM unnest($1::text[], …)`), whatever their size.
//! Every statement text is fixed or assembled from fixed fragments; all
//! values are bound.

use super::{OwnerLock, PostgresStorage};
use crate::buckets::BucketWriter;
use crate::dialect::Dialect;
use crate::{backend, hash_name, now_secs, split};
use sqlx::{PgConnection, Postgres, QueryBuilder, Row, Transaction};
use starling_core::storage::{
    coalesce_inbox_updates, ArchiveRecord, InboxRow, InboxUpdate, OfflineStoreError, StorageResult,
    UnreadChange,
};
use starling_proto::sasl::ScramCredentials;
use starling_proto::BareJid;
use std::collections::HashSet;

impl Dialect for PostgresStorage {
    type Db = Postgres;
    type List = Vec<String>;
    const ROW_LOCKS: bool = true;
    const ARCHIVE_BY_WITH: &'static str = "archive";
    const ARCHIVE_BY_OWNER: &'static str = "archive";

    fn encode_list(items: &[String], _sep: char) -> Vec<String> {
        items.to_vec()
    }

    fn decode_list(stored: Vec<String>, _sep: char) -> Vec<String> {
        stored
    }

    async fn begin_write(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        self.pool.begin().await
    }

    /// The batched-write pattern of this backend: one array parameter per
    /// column, `unnest` turns them back into rows.
    async fn insert_credentials(
        tx: &mut PgConnection,
        accounts: &[(&BareJid, &[ScramCredentials])],
    ) -> Result<(), sqlx::Error> {
        let mut domains = Vec::new();
        let mut users = Vec::new();
        let mut hashes = Vec::new();
        let mut salts = Vec::new();
        let mut iterations = Vec::new();
        let mut stored = Vec::new();
        let mut server = Vec::new();
        for (jid, creds) in accounts {
            let (domain, user) = split(jid);
            for c in creds.iter() {
                domains.push(domain);
                users.push(user);
                hashes.push(hash_name(c.hash));
                salts.push(c.salt.as_slice());
                iterations.push(i64::from(c.iterations));
                stored.push(c.stored_key.as_slice());
                server.push(c.server_key.as_slice());
            }
        }
        if domains.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "INSERT INTO account_credentials
             (domain, username, hash, salt, iterations, stored_key, server_key)
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[],
                                  $5::bigint[], $6::bytea[], $7::bytea[])",
        )
        .bind(&domains)
        .bind(&users)
        .bind(&hashes)
        .bind(&salts)
        .bind(&iterations)
        .bind(&stored)
        .bind(&server)
        .execute(&mut *tx)
        .await?;
        Ok(())
    }

    async fn insert_accounts(
        &self,
        accounts: &[(BareJid, Vec<ScramCredentials>)],
    ) -> StorageResult<u64> {
        if accounts.is_empty() {
            return Ok(0);
        }
        let (domains, users): (Vec<&str>, Vec<&str>) =
            accounts.iter().map(|(j, _)| split(j)).unzip();
        let mut tx = self.pool.begin().await.map_err(backend)?;
        // One statement for the whole batch; existing accounts (and repeats
        // within the batch) are skipped by ON CONFLICT.
        let created: HashSet<(String, String)> = sqlx::query(
            "INSERT INTO accounts (domain, username, created_at)
             SELECT d, u, $3 FROM unnest($1::text[], $2::text[]) AS t(d, u)
             ON CONFLICT DO NOTHING
             RETURNING domain, username",
        )
        .bind(&domains)
        .bind(&users)
        .bind(now_secs())
        .fetch_all(&mut *tx)
        .await
        .map_err(backend)?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
        // Credentials of the first occurrence of each created account.
        let mut seen = HashSet::new();
        let batch: Vec<(&BareJid, &[ScramCredentials])> = accounts
            .iter()
            .filter(|(j, _)| {
                let (d, u) = split(j);
                created.contains(&(d.to_owned(), u.to_owned())) && seen.insert(j.clone())
            })
            .map(|(j, c)| (j, c.as_slice()))
            .collect();
        Self::insert_credentials(&mut tx, &batch)
            .await
            .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(created.len() as u64)
    }

    /// A transaction takes the owner's advisory lock
    /// ([`OwnerLock::Offline`]), then inserts only if the owner's count is
    /// under the quota. The insert is a new statement, so under READ
    /// COMMITTED it sees every message committed by the previous lock
    /// holder: concurrent stores (from any node) cannot exceed the quota,
    /// and one owner's ids grow in commit order. The message's archive rows
    /// are inserted in the same transaction.
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
        insert_archive_rows(&mut tx, &self.buckets, archive).await?;
        // Durable once this returns (synchronous_commit of the server).
        tx.commit().await.map_err(backend)?;
        Ok(())
    }

    async fn insert_archive(&self, records: &[ArchiveRecord]) -> StorageResult<()> {
        let mut conn = self.pool.acquire().await.map_err(backend)?;
        insert_archive_rows(&mut conn, &self.buckets, records).await
    }

    async fn upsert_inbox(&self, updates: &[InboxUpdate]) -> StorageResult<()> {
        // One row per conversation (an upsert may not touch a row twice),
        // so the groups below can run in any order.
        let merged = coalesce_inbox_updates(updates);
        let (with_last, count_only): (Vec<&InboxUpdate>, Vec<&InboxUpdate>) =
            merged.iter().partition(|u| u.last.is_some());
        let (setting, adding): (Vec<&InboxUpdate>, Vec<&InboxUpdate>) = with_last
            .into_iter()
            .partition(|u| matches!(u.unread, UnreadChange::Set(_)));
        let mut tx = self.pool.begin().await.map_err(backend)?;
        // Older than the row's newest message: the count is left alone
        // (see the SQLite dialect: two cluster nodes' queues in either
        // order).
        for (group, sql) in [
            (
                &adding,
                "CASE WHEN excluded.last_id > i.last_id THEN i.unread + excluded.unread ELSE i.unread END",
            ),
            (
                &setting,
                "CASE WHEN excluded.last_id >= i.last_id THEN excluded.unread ELSE i.unread END",
            ),
        ] {
            if group.is_empty() {
                continue;
            }
            let (mut domains, mut users, mut remotes, mut ids, mut counts, mut shared) = (
                Vec::new(),
                Vec::new(),
                Vec::new(),
                Vec::new(),
                Vec::new(),
                Vec::new(),
            );
            for u in group.iter() {
                let (domain, user) = split(&u.owner);
                let id = u.last.expect("partitioned on last");
                domains.push(domain);
                users.push(user);
                remotes.push(u.remote.as_str());
                ids.push(id.0);
                shared.push(u.shared);
                counts.push(match u.unread {
                    UnreadChange::Keep => 0i32,
                    UnreadChange::Add(n) | UnreadChange::Set(n) => n.min(i32::MAX as u32) as i32,
                });
            }
            let mut b = QueryBuilder::<Postgres>::new(
                "INSERT INTO inbox AS i (domain, username, remote, last_id, unread, shared)
                 SELECT * FROM unnest(",
            );
            b.push_bind(&domains)
                .push("::text[], ")
                .push_bind(&users)
                .push("::text[], ")
                .push_bind(&remotes)
                .push("::text[], ")
                .push_bind(&ids)
                .push("::bigint[], ")
                .push_bind(&counts)
                .push("::int[], ")
                .push_bind(&shared)
                .push(
                    "::bool[])
                 ON CONFLICT (domain, username, remote) DO UPDATE SET
                   last_id = GREATEST(i.last_id, excluded.last_id),
                   shared = CASE WHEN excluded.last_id >= i.last_id THEN excluded.shared ELSE i.shared END,
                   unread = ",
                )
                .push(sql);
            b.build().execute(&mut *tx).await.map_err(backend)?;
        }
        for u in count_only {
            let (domain, user) = split(&u.owner);
            let (set, value) = match u.unread {
                UnreadChange::Keep => continue,
                UnreadChange::Add(n) => (false, n.min(i32::MAX as u32) as i32),
                UnreadChange::Set(n) => (true, n.min(i32::MAX as u32) as i32),
            };
            sqlx::query(
                "UPDATE inbox SET unread = CASE WHEN $1 THEN $2 ELSE unread + $2 END
                 WHERE domain = $3 AND username = $4 AND remote = $5",
            )
            .bind(set)
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

    async fn inbox_rows(
        &self,
        owner: &BareJid,
        remote: Option<&str>,
    ) -> StorageResult<Vec<(String, InboxRow)>> {
        let (domain, user) = split(owner);
        let rows = sqlx::query(
            "SELECT remote, last_id, unread, shared FROM inbox
             WHERE domain = $1 AND username = $2 AND ($3::TEXT IS NULL OR remote = $3)",
        )
        .bind(domain)
        .bind(user)
        .bind(remote)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows
            .iter()
            .map(|r| {
                let unread: i32 = r.get(2);
                (
                    r.get::<String, _>(0),
                    crate::inbox_row(r.get(1), i64::from(unread), r.get(3)),
                )
            })
            .collect())
    }

    async fn delete_inbox(&self, owner: &BareJid, remote: Option<&str>) -> StorageResult<u64> {
        let (domain, user) = split(owner);
        let n = sqlx::query(
            "DELETE FROM inbox WHERE domain = $1 AND username = $2
             AND ($3::TEXT IS NULL OR remote = $3)",
        )
        .bind(domain)
        .bind(user)
        .bind(remote)
        .execute(&self.writer)
        .await
        .map_err(backend)?
        .rows_affected();
        Ok(n)
    }
}

/// Inserts archive rows (idempotent by id) on the caller's connection or
/// transaction; shared by [`Dialect::insert_archive`] and
/// [`Dialect::insert_offline`], which writes a message's archive rows with
/// it.
async fn insert_archive_rows(
    conn: &mut PgConnection,
    buckets: &BucketWriter,
    records: &[ArchiveRecord],
) -> StorageResult<()> {
    if records.is_empty() {
        return Ok(());
    }
    let (numbers, newest) = super::shared::buckets::assign(conn, records).await?;
    let n = records.len();
    let (mut ids, mut domains, mut users, mut withs, mut remotes) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut outs, mut origins, mut flags, mut stanzas) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for r in records {
        let (domain, user) = split(&r.owner);
        ids.push(r.id.0);
        domains.push(domain);
        users.push(user);
        withs.push(r.with_bare.as_str());
        remotes.push(r.remote.as_str());
        outs.push(r.outgoing);
        origins.push(r.origin_id.as_deref());
        flags.push(r.flags);
        stanzas.push(r.stanza.as_str());
    }
    sqlx::query(
        "INSERT INTO archive
         (id, domain, username, with_bare, remote, outgoing, origin_id, flags, stanza, bucket)
         SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[],
                              $6::boolean[], $7::text[], $8::int[], $9::text[], $10::bigint[])
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(&ids)
    .bind(&domains)
    .bind(&users)
    .bind(&withs)
    .bind(&remotes)
    .bind(&outs)
    .bind(&origins)
    .bind(&flags)
    .bind(&stanzas)
    .bind(&numbers)
    .execute(&mut *conn)
    .await
    .map_err(backend)?;
    super::shared::buckets::account(conn, buckets, newest, n as u64).await
}
