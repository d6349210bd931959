//! [`ArchiveStore`] and [`InboxStore`]. The batch writers fed by the
//! write-behind queue are each engine's own ([`Dialect::insert_archive`],
//! [`Dialect::upsert_inbox`]); pages, counts and id lookups are assembled
//! in [`crate::dynsql`]; everything else is below, once.

use super::{backend, split, Db, Dialect, Store};
use crate::{buckets, dynsql};
use async_trait::async_trait;
use sqlx::{Database, Row};
use starling_core::storage::{
    ArchiveId, ArchivePage, ArchivePrefs, ArchiveQuery, ArchiveRecord, ArchiveStore,
    ArchivedMessage, InboxEntry, InboxQuery, InboxRow, InboxStore, InboxTotals, InboxUpdate,
    PrefsDefault, StorageResult, FLAG_BODY,
};
use starling_proto::BareJid;
use std::collections::HashMap;

/// Buckets per `COUNT` statement (bound parameters stay far below
/// either engine's limit).
const COUNT_GROUP: usize = 500;

/// SQLite's separator of the JIDs in `always` and `never`.
const JID_SEP: char = '\n';

/// The index a query reads: the by-conversation one with a `with`
/// filter, the by-owner one without (both lead with the bucket).
fn index_for(q: &ArchiveQuery) -> &'static str {
    if q.with.is_some() {
        Store::ARCHIVE_BY_WITH
    } else {
        Store::ARCHIVE_BY_OWNER
    }
}

impl Store {
    /// The owner's first (`ASC`) or last (`DESC`) id, visiting `buckets`
    /// in the given order, a group at a time.
    async fn owner_edge(
        &self,
        owner: &BareJid,
        buckets: &[i64],
        order: &'static str,
    ) -> StorageResult<Option<i64>> {
        let (domain, user) = split(owner);
        for group in buckets::groups(buckets) {
            let mut b = sqlx::QueryBuilder::<Db>::new("SELECT id FROM ");
            b.push(Store::ARCHIVE_BY_OWNER).push(" WHERE bucket IN (");
            let mut sep = b.separated(", ");
            for n in group {
                sep.push_bind(*n);
            }
            b.push(") AND domain = ").push_bind(domain);
            b.push(" AND username = ").push_bind(user);
            b.push(" ORDER BY id ").push(order).push(" LIMIT 1");
            let row = b
                .build()
                .fetch_optional(&self.pool)
                .await
                .map_err(backend)?;
            if let Some(row) = row {
                return Ok(Some(row.get(0)));
            }
        }
        Ok(None)
    }

    /// Deletes the owner's rows in `buckets` (older than `before` if
    /// given), through the by-owner index.
    async fn delete_owner_rows(
        &self,
        owner: &BareJid,
        buckets: &[i64],
        before: Option<ArchiveId>,
    ) -> StorageResult<u64> {
        let (domain, user) = split(owner);
        let mut n = 0;
        for group in buckets.chunks(COUNT_GROUP) {
            let mut b = sqlx::QueryBuilder::<Db>::new("DELETE FROM archive WHERE bucket IN (");
            let mut sep = b.separated(", ");
            for x in group {
                sep.push_bind(*x);
            }
            b.push(") AND domain = ").push_bind(domain);
            b.push(" AND username = ").push_bind(user);
            if let Some(before) = before {
                b.push(" AND id < ").push_bind(before.0);
            }
            n += b
                .build()
                .execute(&self.writer)
                .await
                .map_err(backend)?
                .rows_affected();
        }
        Ok(n)
    }
}

/// A row of `id, with_bare, outgoing, flags, stanza`.
fn message(r: &<Db as Database>::Row) -> ArchivedMessage {
    ArchivedMessage {
        id: ArchiveId(r.get(0)),
        with_bare: r.get(1),
        outgoing: r.get(2),
        flags: r.get(3),
        stanza: r.get(4),
    }
}

#[async_trait]
impl ArchiveStore for Store {
    async fn append(&self, records: &[ArchiveRecord]) -> StorageResult<()> {
        if records.is_empty() {
            return Ok(());
        }
        self.insert_archive(records).await
    }

    async fn query(&self, owner: &BareJid, q: &ArchiveQuery) -> StorageResult<ArchivePage> {
        let want = q.limit as usize + 1;
        let rows = if q.ids.is_empty() {
            // One conversation, or the owner's whole archive: its buckets
            // in paging order, a group at a time, until the page (and the
            // one row that says whether it is complete) is full
            // (`crate::buckets`).
            let mut buckets = self.conversation_buckets(q.after, q.before).await?;
            if q.from_end {
                buckets.reverse();
            }
            let mut rows = Vec::new();
            for group in buckets::groups(&buckets) {
                let rest = ArchiveQuery {
                    limit: (want - rows.len() - 1) as u32,
                    ..q.clone()
                };
                rows.extend(
                    dynsql::archive_page::<Db>(owner, &rest, index_for(q), Some(group))
                        .build()
                        .fetch_all(&self.pool)
                        .await
                        .map_err(backend)?,
                );
                if rows.len() >= want {
                    break;
                }
            }
            rows
        } else {
            // Ids: primary-key lookups.
            dynsql::archive_page::<Db>(owner, q, "archive", None)
                .build()
                .fetch_all(&self.pool)
                .await
                .map_err(backend)?
        };
        let complete = rows.len() < want;
        let mut messages: Vec<ArchivedMessage> =
            rows.iter().take(q.limit as usize).map(message).collect();
        if q.from_end {
            messages.reverse();
        }
        Ok(ArchivePage { messages, complete })
    }

    async fn count(&self, owner: &BareJid, q: &ArchiveQuery) -> StorageResult<u64> {
        if !q.ids.is_empty() {
            let n: i64 = dynsql::archive_count::<Db>(owner, q, "archive", None)
                .build()
                .fetch_one(&self.pool)
                .await
                .map_err(backend)?
                .get(0);
            return Ok(n as u64);
        }
        let buckets = self.conversation_buckets(q.after, q.before).await?;
        let mut total = 0;
        for group in buckets.chunks(COUNT_GROUP) {
            let n: i64 = dynsql::archive_count::<Db>(owner, q, index_for(q), Some(group))
                .build()
                .fetch_one(&self.pool)
                .await
                .map_err(backend)?
                .get(0);
            total += n as u64;
        }
        Ok(total)
    }

    async fn existing(&self, owner: &BareJid, ids: &[ArchiveId]) -> StorageResult<Vec<ArchiveId>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let rows = dynsql::archive_existing::<Db>(owner, ids)
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
        // The oldest bucket that has a row of the owner's, then the newest:
        // an index probe per bucket at most, usually one.
        let mut all = self.conversation_buckets(None, None).await?;
        let Some(first) = self.owner_edge(owner, &all, "ASC").await? else {
            return Ok(None);
        };
        all.reverse();
        let last = self.owner_edge(owner, &all, "DESC").await?.unwrap_or(first);
        Ok(Some((ArchiveId(first), ArchiveId(last))))
    }

    async fn find_by_origin(
        &self,
        owner: &BareJid,
        with_bare: &str,
        origin_id: &str,
        outgoing: bool,
    ) -> StorageResult<Option<ArchivedMessage>> {
        // Newest bucket first: the message is almost always recent.
        let mut all = self.conversation_buckets(None, None).await?;
        all.reverse();
        for group in buckets::groups(&all) {
            let mut b = dynsql::conversation::<Db>(
                "id, with_bare, outgoing, flags, stanza",
                Store::ARCHIVE_BY_WITH,
                owner,
                with_bare,
                group,
            );
            b.push(" AND origin_id = ").push_bind(origin_id);
            b.push(" AND outgoing = ").push_bind(outgoing);
            b.push(" ORDER BY id DESC LIMIT 1");
            let row = b
                .build()
                .fetch_optional(&self.pool)
                .await
                .map_err(backend)?;
            if let Some(row) = row {
                return Ok(Some(message(&row)));
            }
        }
        Ok(None)
    }

    async fn replace(&self, owner: &BareJid, id: ArchiveId, stanza: &str) -> StorageResult<bool> {
        let (domain, user) = split(owner);
        let n = sqlx::query(
            "UPDATE archive SET stanza = $1, flags = flags & ~$2
             WHERE id = $3 AND domain = $4 AND username = $5",
        )
        .bind(stanza)
        .bind(FLAG_BODY)
        .bind(id.0)
        .bind(domain)
        .bind(user)
        .execute(&self.writer)
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
        let buckets = self.conversation_buckets(Some(after), None).await?;
        let mut total = 0;
        for group in buckets.chunks(COUNT_GROUP) {
            let mut b = dynsql::conversation::<Db>(
                "COUNT(*)",
                Store::ARCHIVE_BY_WITH,
                owner,
                with_bare,
                group,
            );
            b.push(" AND id > ").push_bind(after.0);
            b.push(" AND NOT outgoing AND (flags & ")
                .push_bind(FLAG_BODY);
            b.push(") != 0");
            let n: i64 = b
                .build()
                .fetch_one(&self.pool)
                .await
                .map_err(backend)?
                .get(0);
            total += n as u64;
        }
        Ok(total)
    }

    async fn purge_domain_before(&self, domain: &str, before: ArchiveId) -> StorageResult<u64> {
        let n = sqlx::query("DELETE FROM archive WHERE id < $1 AND domain = $2")
            .bind(before.0)
            .bind(domain)
            .execute(&self.writer)
            .await
            .map_err(backend)?
            .rows_affected();
        Ok(n)
    }

    async fn purge_user(&self, owner: &BareJid, before: Option<ArchiveId>) -> StorageResult<u64> {
        let buckets = self.conversation_buckets(None, before).await?;
        self.delete_owner_rows(owner, &buckets, before).await
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
            always: Store::decode_list(r.get(1), JID_SEP),
            never: Store::decode_list(r.get(2), JID_SEP),
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
        .bind(Store::encode_list(&prefs.always, JID_SEP))
        .bind(Store::encode_list(&prefs.never, JID_SEP))
        .execute(&self.writer)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn remove_user(&self, owner: &BareJid) -> StorageResult<()> {
        let buckets = self.conversation_buckets(None, None).await?;
        self.delete_owner_rows(owner, &buckets, None).await?;
        self.exec_for_owner(
            "DELETE FROM archive_prefs WHERE domain = $1 AND username = $2",
            owner,
        )
        .await
    }
}

impl Store {
    /// Entries with their last message, newest first: one archive lookup
    /// by id for the page. A conversation's last message is in the owner's
    /// archive, or for a `shared` one (a group) in the remote's; a row of
    /// anyone else's archive is never shown.
    async fn inbox_entries(
        &self,
        owner: &BareJid,
        mut rows: Vec<(String, InboxRow)>,
    ) -> StorageResult<Vec<InboxEntry>> {
        rows.sort_by_key(|(_, r)| std::cmp::Reverse(r.last_id));
        let mut stanzas: HashMap<i64, (String, String, String)> = HashMap::new();
        for chunk in rows.chunks(COUNT_GROUP) {
            let mut b = sqlx::QueryBuilder::<Db>::new(
                "SELECT id, domain, username, stanza FROM archive WHERE id IN (",
            );
            let mut sep = b.separated(", ");
            for (_, r) in chunk {
                sep.push_bind(r.last_id.0);
            }
            b.push(")");
            for r in b.build().fetch_all(&self.pool).await.map_err(backend)? {
                stanzas.insert(r.get(0), (r.get(1), r.get(2), r.get(3)));
            }
        }
        let (domain, user) = split(owner);
        Ok(rows
            .into_iter()
            .map(|(remote, r)| {
                let last_stanza = stanzas.get(&r.last_id.0).and_then(|(d, u, stanza)| {
                    let mine = if r.shared {
                        remote.split_once('@') == Some((u.as_str(), d.as_str()))
                    } else {
                        d == domain && u == user
                    };
                    mine.then(|| stanza.clone())
                });
                InboxEntry {
                    remote,
                    last_id: r.last_id,
                    last_stanza,
                    unread: r.unread,
                }
            })
            .collect())
    }
}

#[async_trait]
impl InboxStore for Store {
    async fn apply(&self, updates: &[InboxUpdate]) -> StorageResult<()> {
        if updates.is_empty() {
            return Ok(());
        }
        self.upsert_inbox(updates).await
    }

    async fn list(&self, owner: &BareJid, q: &InboxQuery) -> StorageResult<Vec<InboxEntry>> {
        // An owner has thousands of conversations at most: they are read
        // through the primary key (clustered by owner) and paged here.
        let mut rows: Vec<(String, InboxRow)> = self
            .inbox_rows(owner, None)
            .await?
            .into_iter()
            .filter(|(_, r)| {
                q.before.is_none_or(|b| r.last_id < b)
                    && q.after.is_none_or(|a| r.last_id > a)
                    && (!q.unread_only || r.unread > 0)
            })
            .collect();
        // A page towards newer conversations (`after` only) is the one
        // just after the cursor; any other, the newest before it.
        if q.after.is_some() && q.before.is_none() {
            rows.sort_by_key(|(_, r)| r.last_id);
        } else {
            rows.sort_by_key(|(_, r)| std::cmp::Reverse(r.last_id));
        }
        rows.truncate(q.limit as usize);
        self.inbox_entries(owner, rows).await
    }

    async fn get(&self, owner: &BareJid, remote: &str) -> StorageResult<Option<InboxEntry>> {
        let rows = self.inbox_rows(owner, Some(remote)).await?;
        Ok(self.inbox_entries(owner, rows).await?.pop())
    }

    async fn totals(&self, owner: &BareJid) -> StorageResult<InboxTotals> {
        let rows = self.inbox_rows(owner, None).await?;
        Ok(InboxTotals {
            conversations: rows.len() as u64,
            unread_conversations: rows.iter().filter(|(_, r)| r.unread > 0).count() as u64,
            unread_messages: rows.iter().map(|(_, r)| u64::from(r.unread)).sum(),
        })
    }

    async fn remove(&self, owner: &BareJid, remote: &str) -> StorageResult<bool> {
        Ok(self.delete_inbox(owner, Some(remote)).await? > 0)
    }

    async fn remove_user(&self, owner: &BareJid) -> StorageResult<()> {
        self.delete_inbox(owner, None).await.map(|_| ())
    }
}
