//! [`ArchiveStore`] and [`InboxStore`] on SQLite. Batches are written as
//! multi-row statements inside one transaction (the write-behind queue in
//! the server hands them over). Every statement text is fixed or assembled
//! from fixed fragments; all values are bound.

use super::{backend, split, SqliteStorage};
use crate::dynsql;
use async_trait::async_trait;
use sqlx::{QueryBuilder, Row, Sqlite};
use starling_core::storage::{
    coalesce_inbox_updates, ArchiveId, ArchivePage, ArchivePrefs, ArchiveQuery, ArchiveRecord,
    ArchiveStore, ArchivedMessage, InboxEntry, InboxQuery, InboxStore, InboxTotals, InboxUpdate,
    PrefsDefault, StorageResult, UnreadChange, FLAG_BODY,
};
use starling_proto::BareJid;

/// Rows per INSERT statement (9 parameters each, far below SQLite's limit).
const ROWS_PER_INSERT: usize = 200;

fn message(r: &sqlx::sqlite::SqliteRow) -> ArchivedMessage {
    ArchivedMessage {
        id: ArchiveId(r.get(0)),
        with_bare: r.get(1),
        outgoing: r.get::<i64, _>(2) != 0,
        flags: r.get::<i64, _>(3) as i32,
        stanza: r.get(4),
    }
}

/// Inserts archive rows (idempotent by id) in the caller's transaction;
/// shared by [`ArchiveStore::append`] and the offline store, which writes a
/// message's archive rows with it.
pub(super) async fn insert_archive_rows(
    conn: &mut sqlx::SqliteConnection,
    records: &[ArchiveRecord],
) -> StorageResult<()> {
    for chunk in records.chunks(ROWS_PER_INSERT) {
        let mut b = QueryBuilder::<Sqlite>::new(
            "INSERT OR IGNORE INTO archive
             (id, domain, username, with_bare, remote, outgoing, origin_id, flags, stanza) ",
        );
        b.push_values(chunk, |mut row, r| {
            let (domain, user) = split(&r.owner);
            row.push_bind(r.id.0)
                .push_bind(domain)
                .push_bind(user)
                .push_bind(r.with_bare.as_str())
                .push_bind(r.remote.as_str())
                .push_bind(i64::from(r.outgoing))
                .push_bind(r.origin_id.as_deref())
                .push_bind(i64::from(r.flags))
                .push_bind(r.stanza.as_str());
        });
        b.build().execute(&mut *conn).await.map_err(backend)?;
    }
    Ok(())
}

#[async_trait]
impl ArchiveStore for SqliteStorage {
    async fn append(&self, records: &[ArchiveRecord]) -> StorageResult<()> {
        if records.is_empty() {
            return Ok(());
        }
        let _turn = self.write_turn.lock().await;
        let mut tx = self.pool.begin().await.map_err(backend)?;
        insert_archive_rows(&mut tx, records).await?;
        tx.commit().await.map_err(backend)
    }

    async fn query(&self, owner: &BareJid, q: &ArchiveQuery) -> StorageResult<ArchivePage> {
        let rows = dynsql::archive_page::<Sqlite>(owner, q)
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
        let n: i64 = dynsql::archive_count::<Sqlite>(owner, q)
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
        let rows = dynsql::archive_existing::<Sqlite>(owner, ids)
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
            "SELECT id FROM archive WHERE domain = ? AND username = ? ORDER BY id ASC LIMIT 1",
        )
        .bind(domain)
        .bind(user)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?;
        let Some(first) = first else { return Ok(None) };
        let last: i64 = sqlx::query(
            "SELECT id FROM archive WHERE domain = ? AND username = ? ORDER BY id DESC LIMIT 1",
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
             WHERE domain = ? AND username = ? AND with_bare = ? AND origin_id = ?
               AND outgoing = ?
             ORDER BY id DESC LIMIT 1",
        )
        .bind(domain)
        .bind(user)
        .bind(with_bare)
        .bind(origin_id)
        .bind(i64::from(outgoing))
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?;
        Ok(row.as_ref().map(message))
    }

    async fn replace(&self, owner: &BareJid, id: ArchiveId, stanza: &str) -> StorageResult<bool> {
        let (domain, user) = split(owner);
        let n = sqlx::query(
            "UPDATE archive SET stanza = ?, flags = flags & ~? WHERE id = ? AND domain = ? AND username = ?",
        )
        .bind(stanza)
        .bind(i64::from(FLAG_BODY))
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
             WHERE domain = ? AND username = ? AND with_bare = ? AND id > ?
               AND outgoing = 0 AND (flags & ?) != 0",
        )
        .bind(domain)
        .bind(user)
        .bind(with_bare)
        .bind(after.0)
        .bind(i64::from(FLAG_BODY))
        .fetch_one(&self.pool)
        .await
        .map_err(backend)?
        .get(0);
        Ok(n as u64)
    }

    async fn purge_domain_before(&self, domain: &str, before: ArchiveId) -> StorageResult<u64> {
        let n = sqlx::query("DELETE FROM archive WHERE id < ? AND domain = ?")
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
        let n = sqlx::query("DELETE FROM archive WHERE domain = ? AND username = ? AND id < ?")
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
            "SELECT def, always, never FROM archive_prefs WHERE domain = ? AND username = ?",
        )
        .bind(domain)
        .bind(user)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?;
        Ok(row.map(|r| {
            let list = |s: String| -> Vec<String> {
                s.split('\n')
                    .filter(|x| !x.is_empty())
                    .map(str::to_owned)
                    .collect()
            };
            ArchivePrefs {
                default: PrefsDefault::parse(r.get::<&str, _>(0)).unwrap_or(PrefsDefault::Always),
                always: list(r.get(1)),
                never: list(r.get(2)),
            }
        }))
    }

    async fn set_prefs(&self, owner: &BareJid, prefs: &ArchivePrefs) -> StorageResult<()> {
        let (domain, user) = split(owner);
        sqlx::query(
            "INSERT INTO archive_prefs (domain, username, def, always, never) VALUES (?, ?, ?, ?, ?)
             ON CONFLICT (domain, username) DO UPDATE
             SET def = excluded.def, always = excluded.always, never = excluded.never",
        )
        .bind(domain)
        .bind(user)
        .bind(prefs.default.as_str())
        .bind(prefs.always.join("\n"))
        .bind(prefs.never.join("\n"))
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn remove_user(&self, owner: &BareJid) -> StorageResult<()> {
        self.exec_for_owner(
            "DELETE FROM archive WHERE domain = ? AND username = ?",
            owner,
        )
        .await?;
        self.exec_for_owner(
            "DELETE FROM archive_prefs WHERE domain = ? AND username = ?",
            owner,
        )
        .await
    }
}

fn entry(r: &sqlx::sqlite::SqliteRow) -> InboxEntry {
    InboxEntry {
        remote: r.get(0),
        last_id: ArchiveId(r.get(1)),
        last_stanza: r.get(2),
        unread: r.get::<i64, _>(3).clamp(0, i64::from(u32::MAX)) as u32,
    }
}

#[async_trait]
impl InboxStore for SqliteStorage {
    async fn apply(&self, updates: &[InboxUpdate]) -> StorageResult<()> {
        if updates.is_empty() {
            return Ok(());
        }
        // One row per conversation, so the groups below can run in any
        // order: new last messages that add to the count, new last
        // messages that set it, and count-only changes.
        let merged = coalesce_inbox_updates(updates);
        let (with_last, count_only): (Vec<&InboxUpdate>, Vec<&InboxUpdate>) =
            merged.iter().partition(|u| u.last.is_some());
        let (setting, adding): (Vec<&InboxUpdate>, Vec<&InboxUpdate>) = with_last
            .into_iter()
            .partition(|u| matches!(u.unread, UnreadChange::Set(_)));
        let _turn = self.write_turn.lock().await;
        let mut tx = self.pool.begin().await.map_err(backend)?;
        for (group, unread_sql) in [
            (&adding, "unread + excluded.unread"),
            (&setting, "excluded.unread"),
        ] {
            for chunk in group.chunks(ROWS_PER_INSERT) {
                let mut b = QueryBuilder::<Sqlite>::new(
                    "INSERT INTO inbox (domain, username, remote, last_id, unread) ",
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
                        .push_bind(n);
                });
                b.push(
                    " ON CONFLICT (domain, username, remote) DO UPDATE SET
                       last_id = MAX(last_id, excluded.last_id),
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

    async fn list(&self, owner: &BareJid, q: &InboxQuery) -> StorageResult<Vec<InboxEntry>> {
        let rows = dynsql::inbox_page::<Sqlite>(owner, q)
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
             WHERE i.domain = ? AND i.username = ? AND i.remote = ?",
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
            "SELECT COUNT(*), COALESCE(SUM(unread > 0), 0), COALESCE(SUM(unread), 0) FROM inbox
             WHERE domain = ? AND username = ?",
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
        let n = sqlx::query("DELETE FROM inbox WHERE domain = ? AND username = ? AND remote = ?")
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
        self.exec_for_owner("DELETE FROM inbox WHERE domain = ? AND username = ?", owner)
            .await
    }
}
