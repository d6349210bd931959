//! [`ArchiveStore`] and [`InboxStore`] on PostgreSQL, with the same
//! semantics as the SQLite implementation. Batches are single statements
//! over arrays (`INSERT … SELECT * FROM unnest(…)`), whatever their size.
//! Every statement text is fixed or assembled from fixed fragments; all
//! values are bound.

use super::{backend, split, PostgresStorage};
use crate::dynsql;
use async_trait::async_trait;
use sqlx::{Postgres, QueryBuilder, Row};
use starling_core::storage::{
    coalesce_inbox_updates, ArchiveId, ArchivePage, ArchivePrefs, ArchiveQuery, ArchiveRecord,
    ArchiveStore, ArchivedMessage, InboxEntry, InboxQuery, InboxStore, InboxTotals, InboxUpdate,
    PrefsDefault, StorageResult, UnreadChange, FLAG_BODY,
};
use starling_proto::BareJid;

fn message(r: &sqlx::postgres::PgRow) -> ArchivedMessage {
    ArchivedMessage {
        id: ArchiveId(r.get(0)),
        with_bare: r.get(1),
        outgoing: r.get::<bool, _>(2),
        flags: r.get::<i32, _>(3),
        stanza: r.get(4),
    }
}

/// Inserts archive rows (idempotent by id) on the caller's connection or
/// transaction; shared by [`ArchiveStore::append`] and the offline store,
/// which writes a message's archive rows with it.
pub(super) async fn insert_archive_rows(
    conn: &mut sqlx::PgConnection,
    records: &[ArchiveRecord],
) -> StorageResult<()> {
    if records.is_empty() {
        return Ok(());
    }
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
         (id, domain, username, with_bare, remote, outgoing, origin_id, flags, stanza)
         SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[],
                              $6::boolean[], $7::text[], $8::int[], $9::text[])
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
    .execute(&mut *conn)
    .await
    .map_err(backend)?;
    Ok(())
}

#[async_trait]
impl ArchiveStore for PostgresStorage {
    async fn append(&self, records: &[ArchiveRecord]) -> StorageResult<()> {
        let mut conn = self.pool.acquire().await.map_err(backend)?;
        insert_archive_rows(&mut conn, records).await
    }

    async fn query(&self, owner: &BareJid, q: &ArchiveQuery) -> StorageResult<ArchivePage> {
        let rows = dynsql::archive_page::<Postgres>(owner, q)
            .build()
            .fetch_all(&self.pool)
            .await
            .map_err(backend)?;
        let complete = rows.len() <= q.limit as usize;
        let mut messages: Vec<ArchivedMessage> =
            rows.iter().take(q.limit as usize).map(message).collect();
        if q.from_end {
            messages.reverse();
        }
        Ok(ArchivePage { messages, complete })
    }

    async fn count(&self, owner: &BareJid, q: &ArchiveQuery) -> StorageResult<u64> {
        let n: i64 = dynsql::archive_count::<Postgres>(owner, q)
            .build()
            .fetch_one(&self.pool)
            .await
            .map_err(backend)?
            .get(0);
        Ok(n as u64)
    }

    async fn existing(&self, owner: &BareJid, ids: &[ArchiveId]) -> StorageResult<Vec<ArchiveId>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let rows = dynsql::archive_existing::<Postgres>(owner, ids)
            .build()
            .fetch_all(&self.pool)
            .await
            .map_err(backend)?;
        Ok(rows.iter().map(|r| ArchiveId(r.get(0))).collect())
    }

    async fn max_id(&self) -> StorageResult<Option<ArchiveId>> {
        // The primary key's last entry: one index probe.
        let max: Option<i64> = sqlx::query("SELECT MAX(id) FROM archive")
            .fetch_one(&self.pool)
            .await
            .map_err(backend)?
            .get(0);
        Ok(max.map(ArchiveId))
    }

    async fn bounds(&self, owner: &BareJid) -> StorageResult<Option<(ArchiveId, ArchiveId)>> {
        let (domain, user) = split(owner);
        // Two index probes rather than MIN/MAX over a filtered set.
        let first = sqlx::query(
            "SELECT id FROM archive WHERE domain = $1 AND username = $2 ORDER BY id ASC LIMIT 1",
        )
        .bind(domain)
        .bind(user)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?;
        let Some(first) = first else { return Ok(None) };
        let last: i64 = sqlx::query(
            "SELECT id FROM archive WHERE domain = $1 AND username = $2 ORDER BY id DESC LIMIT 1",
        )
        .bind(domain)
        .bind(user)
        .fetch_one(&self.pool)
        .await
        .map_err(backend)?
        .get(0);
        Ok(Some((ArchiveId(first.get(0)), ArchiveId(last))))
    }

    async fn find_by_origin(
        &self,
        owner: &BareJid,
        with_bare: &str,
        origin_id: &str,
        outgoing: bool,
    ) -> StorageResult<Option<ArchivedMessage>> {
        let (domain, user) = split(owner);
        let row = sqlx::query(
            "SELECT id, with_bare, outgoing, flags, stanza FROM archive
             WHERE domain = $1 AND username = $2 AND with_bare = $3 AND origin_id = $4
               AND outgoing = $5
             ORDER BY id DESC LIMIT 1",
        )
        .bind(domain)
        .bind(user)
        .bind(with_bare)
        .bind(origin_id)
        .bind(outgoing)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?;
        Ok(row.as_ref().map(message))
    }

    async fn replace(&self, owner: &BareJid, id: ArchiveId, stanza: &str) -> StorageResult<bool> {
        let (domain, user) = split(owner);
        let n = sqlx::query(
            "UPDATE archive SET stanza = $1, flags = flags & ~$2::int
             WHERE id = $3 AND domain = $4 AND username = $5",
        )
        .bind(stanza)
        .bind(FLAG_BODY)
        .bind(id.0)
        .bind(domain)
        .bind(user)
        .execute(&self.pool)
        .await
        .map_err(backend)?
        .rows_affected();
        Ok(n > 0)
    }

    async fn count_unread_after(
        &self,
        owner: &BareJid,
        with_bare: &str,
        after: ArchiveId,
    ) -> StorageResult<u64> {
        let (domain, user) = split(owner);
        let n: i64 = sqlx::query(
            "SELECT COUNT(*) FROM archive
             WHERE domain = $1 AND username = $2 AND with_bare = $3 AND id > $4
               AND NOT outgoing AND (flags & $5::int) != 0",
        )
        .bind(domain)
        .bind(user)
        .bind(with_bare)
        .bind(after.0)
        .bind(FLAG_BODY)
        .fetch_one(&self.pool)
        .await
        .map_err(backend)?
        .get(0);
        Ok(n as u64)
    }

    async fn purge_domain_before(&self, domain: &str, before: ArchiveId) -> StorageResult<u64> {
        let n = sqlx::query("DELETE FROM archive WHERE id < $1 AND domain = $2")
            .bind(before.0)
            .bind(domain)
            .execute(&self.pool)
            .await
            .map_err(backend)?
            .rows_affected();
        Ok(n)
    }

    async fn purge_user(&self, owner: &BareJid, before: Option<ArchiveId>) -> StorageResult<u64> {
        let (domain, user) = split(owner);
        let n = sqlx::query("DELETE FROM archive WHERE domain = $1 AND username = $2 AND id < $3")
            .bind(domain)
            .bind(user)
            .bind(before.map_or(i64::MAX, |b| b.0))
            .execute(&self.pool)
            .await
            .map_err(backend)?
            .rows_affected();
        Ok(n)
    }

    async fn prefs(&self, owner: &BareJid) -> StorageResult<Option<ArchivePrefs>> {
        let (domain, user) = split(owner);
        let row = sqlx::query(
            "SELECT def, always, never FROM archive_prefs WHERE domain = $1 AND username = $2",
        )
        .bind(domain)
        .bind(user)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?;
        Ok(row.map(|r| ArchivePrefs {
            default: PrefsDefault::parse(r.get::<&str, _>(0)).unwrap_or(PrefsDefault::Always),
            always: r.get(1),
            never: r.get(2),
        }))
    }

    async fn set_prefs(&self, owner: &BareJid, prefs: &ArchivePrefs) -> StorageResult<()> {
        let (domain, user) = split(owner);
        sqlx::query(
            "INSERT INTO archive_prefs (domain, username, def, always, never)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (domain, username) DO UPDATE
             SET def = excluded.def, always = excluded.always, never = excluded.never",
        )
        .bind(domain)
        .bind(user)
        .bind(prefs.default.as_str())
        .bind(&prefs.always)
        .bind(&prefs.never)
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn remove_user(&self, owner: &BareJid) -> StorageResult<()> {
        self.exec_for_owner(
            "DELETE FROM archive WHERE domain = $1 AND username = $2",
            owner,
        )
        .await?;
        self.exec_for_owner(
            "DELETE FROM archive_prefs WHERE domain = $1 AND username = $2",
            owner,
        )
        .await
    }
}

fn entry(r: &sqlx::postgres::PgRow) -> InboxEntry {
    InboxEntry {
        remote: r.get(0),
        last_id: ArchiveId(r.get(1)),
        last_stanza: r.get(2),
        unread: r.get::<i32, _>(3).max(0) as u32,
    }
}

#[async_trait]
impl InboxStore for PostgresStorage {
    async fn apply(&self, updates: &[InboxUpdate]) -> StorageResult<()> {
        if updates.is_empty() {
            return Ok(());
        }
        // One row per conversation (an upsert may not touch a row twice),
        // so the groups below can run in any order.
        let merged = coalesce_inbox_updates(updates);
        let (with_last, count_only): (Vec<&InboxUpdate>, Vec<&InboxUpdate>) =
            merged.iter().partition(|u| u.last.is_some());
        let (setting, adding): (Vec<&InboxUpdate>, Vec<&InboxUpdate>) = with_last
            .into_iter()
            .partition(|u| matches!(u.unread, UnreadChange::Set(_)));
        let mut tx = self.pool.begin().await.map_err(backend)?;
        for (group, sql) in [
            (&adding, "i.unread + excluded.unread"),
            (&setting, "excluded.unread"),
        ] {
            if group.is_empty() {
                continue;
            }
            let (mut domains, mut users, mut remotes, mut ids, mut counts) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for u in group.iter() {
                let (domain, user) = split(&u.owner);
                let id = u.last.expect("partitioned on last");
                domains.push(domain);
                users.push(user);
                remotes.push(u.remote.as_str());
                ids.push(id.0);
                counts.push(match u.unread {
                    UnreadChange::Keep => 0i32,
                    UnreadChange::Add(n) | UnreadChange::Set(n) => n.min(i32::MAX as u32) as i32,
                });
            }
            let mut b = QueryBuilder::<Postgres>::new(
                "INSERT INTO inbox AS i (domain, username, remote, last_id, unread)
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
                .push(
                    "::int[])
                 ON CONFLICT (domain, username, remote) DO UPDATE SET
                   last_id = GREATEST(i.last_id, excluded.last_id),
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

    async fn list(&self, owner: &BareJid, q: &InboxQuery) -> StorageResult<Vec<InboxEntry>> {
        let rows = dynsql::inbox_page::<Postgres>(owner, q)
            .build()
            .fetch_all(&self.pool)
            .await
            .map_err(backend)?;
        let mut out: Vec<InboxEntry> = rows.iter().map(entry).collect();
        out.sort_by_key(|e| std::cmp::Reverse(e.last_id));
        Ok(out)
    }

    async fn get(&self, owner: &BareJid, remote: &str) -> StorageResult<Option<InboxEntry>> {
        let (domain, user) = split(owner);
        let row = sqlx::query(
            "SELECT i.remote, i.last_id, a.stanza, i.unread FROM inbox i
             LEFT JOIN archive a ON a.id = i.last_id AND a.domain = i.domain AND a.username = i.username
             WHERE i.domain = $1 AND i.username = $2 AND i.remote = $3",
        )
        .bind(domain)
        .bind(user)
        .bind(remote)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?;
        Ok(row.as_ref().map(entry))
    }

    async fn totals(&self, owner: &BareJid) -> StorageResult<InboxTotals> {
        let (domain, user) = split(owner);
        let r = sqlx::query(
            "SELECT COUNT(*), COUNT(*) FILTER (WHERE unread > 0), COALESCE(SUM(unread), 0)::bigint
             FROM inbox WHERE domain = $1 AND username = $2",
        )
        .bind(domain)
        .bind(user)
        .fetch_one(&self.pool)
        .await
        .map_err(backend)?;
        Ok(InboxTotals {
            conversations: r.get::<i64, _>(0) as u64,
            unread_conversations: r.get::<i64, _>(1) as u64,
            unread_messages: r.get::<i64, _>(2) as u64,
        })
    }

    async fn remove(&self, owner: &BareJid, remote: &str) -> StorageResult<bool> {
        let (domain, user) = split(owner);
        let n =
            sqlx::query("DELETE FROM inbox WHERE domain = $1 AND username = $2 AND remote = $3")
                .bind(domain)
                .bind(user)
                .bind(remote)
                .execute(&self.pool)
                .await
                .map_err(backend)?
                .rows_affected();
        Ok(n > 0)
    }

    async fn remove_user(&self, owner: &BareJid) -> StorageResult<()> {
        self.exec_for_owner(
            "DELETE FROM inbox WHERE domain = $1 AND username = $2",
            owner,
        )
        .await
    }
}
