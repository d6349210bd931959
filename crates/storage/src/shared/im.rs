//! The instant-messaging stores: roster, blocking, user data, last
//! activity.
//!
//! Roster writes of one owner are serialized by that owner's
//! `roster_versions` row: every writer locks it first (the version upsert,
//! or `FOR UPDATE` on PostgreSQL; SQLite has one writer anyway), so
//! versions are gap-free in commit order and the lock order is the same
//! everywhere (version row, then item rows). Reads of the version and the
//! items are one statement, hence one snapshot.

use super::{backend, split, Db, Dialect, Store};
use crate::dialect::Conn;
use crate::now_secs;
use async_trait::async_trait;
use sqlx::{Database, Row};
use starling_core::storage::{
    RosterChange, RosterItem, RosterStore, StorageResult, Subscription, UserDataStore,
};
use starling_proto::BareJid;
use std::collections::{BTreeMap, BTreeSet};

/// Owners per [`RosterStore::items_for_contact`] statement (bound
/// parameters stay far below either engine's limit).
const OWNERS_PER_QUERY: usize = 500;

/// SQLite's separator of group names, a character XML text cannot contain.
const GROUP_SEP: char = '\u{1f}';

/// The item of a row; `None` for the all-NULL side of an outer join (and
/// for a contact that is no longer a valid JID).
fn item_from_row(r: &<Db as Database>::Row) -> Option<RosterItem> {
    let jid = BareJid::new(r.get::<Option<&str>, _>("contact")?).ok()?;
    Some(RosterItem {
        jid,
        name: r.get("name"),
        subscription: Subscription::parse(r.get::<&str, _>("subscription"))?,
        ask: r.get("ask"),
        pending_in: r.get("pending_in"),
        approved: r.get("approved"),
        groups: Store::decode_list(r.get("groups"), GROUP_SEP),
    })
}

/// Increments `owner`'s roster version (creating it at 1) and returns it;
/// the row stays locked until the transaction ends.
async fn bump_version(tx: &mut Conn<Store>, domain: &str, user: &str) -> Result<u64, sqlx::Error> {
    let v: i64 = sqlx::query(
        "INSERT INTO roster_versions AS v (domain, username, version) VALUES ($1, $2, 1)
         ON CONFLICT (domain, username) DO UPDATE SET version = v.version + 1
         RETURNING version",
    )
    .bind(domain)
    .bind(user)
    .fetch_one(&mut *tx)
    .await?
    .get(0);
    Ok(v as u64)
}

#[async_trait]
impl RosterStore for Store {
    async fn get_roster(&self, owner: &BareJid) -> StorageResult<(u64, Vec<RosterItem>)> {
        let (domain, user) = split(owner);
        // An empty roster still yields its version row.
        let rows = sqlx::query(
            "SELECT v.version AS current, i.contact, i.name, i.subscription, i.ask,
                    i.pending_in, i.approved, i.groups
             FROM (SELECT COALESCE((SELECT version FROM roster_versions
                                    WHERE domain = $1 AND username = $2), 0) AS version) v
             LEFT JOIN roster_items i
               ON i.domain = $1 AND i.username = $2 AND NOT i.removed
             ORDER BY i.contact",
        )
        .bind(domain)
        .bind(user)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        let version = rows
            .first()
            .map(|r| r.get::<i64, _>("current"))
            .unwrap_or(0);
        Ok((
            version as u64,
            rows.iter().filter_map(item_from_row).collect(),
        ))
    }

    async fn get_item(
        &self,
        owner: &BareJid,
        contact: &BareJid,
    ) -> StorageResult<Option<RosterItem>> {
        let (domain, user) = split(owner);
        let row = sqlx::query(
            "SELECT contact, name, subscription, ask, pending_in, approved, groups
             FROM roster_items
             WHERE domain = $1 AND username = $2 AND contact = $3 AND NOT removed",
        )
        .bind(domain)
        .bind(user)
        .bind(contact.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?;
        Ok(row.as_ref().and_then(item_from_row))
    }

    async fn items_for_contact(
        &self,
        owners: &[BareJid],
        contact: &BareJid,
    ) -> StorageResult<Vec<(BareJid, RosterItem)>> {
        // Per domain, the owners' rows for this contact: primary-key
        // probes, a few hundred owners per statement.
        let mut by_domain: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for owner in owners {
            let (domain, user) = split(owner);
            by_domain.entry(domain).or_default().insert(user);
        }
        let mut out = Vec::new();
        for (domain, users) in by_domain {
            let users: Vec<&str> = users.into_iter().collect();
            for group in users.chunks(OWNERS_PER_QUERY) {
                let mut b = sqlx::QueryBuilder::<Db>::new(
                    "SELECT username, contact, name, subscription, ask, pending_in, approved, groups
                     FROM roster_items WHERE domain = ",
                );
                b.push_bind(domain)
                    .push(" AND contact = ")
                    .push_bind(contact.as_str())
                    .push(" AND NOT removed AND username IN (");
                let mut sep = b.separated(", ");
                for user in group {
                    sep.push_bind(*user);
                }
                b.push(")");
                let rows = b.build().fetch_all(&self.pool).await.map_err(backend)?;
                for r in &rows {
                    let owner = BareJid::new(&format!("{}@{domain}", r.get::<&str, _>("username")));
                    if let (Ok(owner), Some(item)) = (owner, item_from_row(r)) {
                        out.push((owner, item));
                    }
                }
            }
        }
        Ok(out)
    }

    async fn put_item(&self, owner: &BareJid, item: &RosterItem) -> StorageResult<u64> {
        let (domain, user) = split(owner);
        let mut tx = self.begin_write().await.map_err(backend)?;
        let version = bump_version(&mut tx, domain, user).await.map_err(backend)?;
        sqlx::query(
            "INSERT INTO roster_items
             (domain, username, contact, name, subscription, ask, pending_in, approved, groups, version, removed)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, FALSE)
             ON CONFLICT (domain, username, contact) DO UPDATE SET
               name = excluded.name, subscription = excluded.subscription, ask = excluded.ask,
               pending_in = excluded.pending_in, approved = excluded.approved,
               groups = excluded.groups, version = excluded.version, removed = FALSE",
        )
        .bind(domain)
        .bind(user)
        .bind(item.jid.as_str())
        .bind(item.name.as_deref())
        .bind(item.subscription.as_str())
        .bind(item.ask)
        .bind(item.pending_in)
        .bind(item.approved)
        .bind(Store::encode_list(&item.groups, GROUP_SEP))
        .bind(version as i64)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(version)
    }

    async fn remove_item(&self, owner: &BareJid, contact: &BareJid) -> StorageResult<Option<u64>> {
        let (domain, user) = split(owner);
        let mut tx = self.begin_write().await.map_err(backend)?;
        // Lock order: the version row, then the item (as put_item does).
        let roster = sqlx::query(for_update!(
            "SELECT 1 FROM roster_versions WHERE domain = $1 AND username = $2"
        ))
        .bind(domain)
        .bind(user)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
        if roster.is_none() {
            return Ok(None); // no roster at all
        }
        let exists = sqlx::query(
            "SELECT 1 FROM roster_items
             WHERE domain = $1 AND username = $2 AND contact = $3 AND NOT removed",
        )
        .bind(domain)
        .bind(user)
        .bind(contact.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?
        .is_some();
        if !exists {
            return Ok(None);
        }
        let version = bump_version(&mut tx, domain, user).await.map_err(backend)?;
        // Keep a tombstone so versioned clients learn about the removal.
        sqlx::query(
            "UPDATE roster_items SET removed = TRUE, version = $1, subscription = 'none',
             ask = FALSE, pending_in = FALSE, approved = FALSE, groups = $2, name = NULL
             WHERE domain = $3 AND username = $4 AND contact = $5",
        )
        .bind(version as i64)
        .bind(Store::encode_list(&[], GROUP_SEP))
        .bind(domain)
        .bind(user)
        .bind(contact.as_str())
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(Some(version))
    }

    async fn changes_since(
        &self,
        owner: &BareJid,
        version: u64,
    ) -> StorageResult<Option<(u64, Vec<RosterChange>)>> {
        let (domain, user) = split(owner);
        let rows = sqlx::query(
            "SELECT v.version AS current, i.contact, i.name, i.subscription, i.ask,
                    i.pending_in, i.approved, i.groups, i.removed
             FROM (SELECT COALESCE((SELECT version FROM roster_versions
                                    WHERE domain = $1 AND username = $2), 0) AS version) v
             LEFT JOIN roster_items i
               ON i.domain = $1 AND i.username = $2 AND i.version > $3
             ORDER BY i.version",
        )
        .bind(domain)
        .bind(user)
        .bind(version as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        let current = rows
            .first()
            .map(|r| r.get::<i64, _>("current"))
            .unwrap_or(0) as u64;
        if version > current {
            return Ok(None);
        }
        let changes = rows
            .iter()
            .filter_map(|r| {
                if r.get::<Option<bool>, _>("removed")? {
                    BareJid::new(r.get::<Option<&str>, _>("contact")?)
                        .ok()
                        .map(RosterChange::Removed)
                } else {
                    item_from_row(r).map(RosterChange::Updated)
                }
            })
            .collect();
        Ok(Some((current, changes)))
    }

    async fn count(&self, owner: &BareJid) -> StorageResult<u64> {
        let (domain, user) = split(owner);
        let n: i64 = sqlx::query(
            "SELECT COUNT(*) FROM roster_items WHERE domain = $1 AND username = $2 AND NOT removed",
        )
        .bind(domain)
        .bind(user)
        .fetch_one(&self.pool)
        .await
        .map_err(backend)?
        .get(0);
        Ok(n as u64)
    }

    async fn pending_requests(&self, owner: &BareJid) -> StorageResult<Vec<(BareJid, String)>> {
        let (domain, user) = split(owner);
        let rows = sqlx::query(
            "SELECT contact, stanza FROM subscription_requests
             WHERE domain = $1 AND username = $2 ORDER BY created_at, contact",
        )
        .bind(domain)
        .bind(user)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let jid = BareJid::new(r.get::<&str, _>(0)).ok()?;
                Some((jid, r.get::<String, _>(1)))
            })
            .collect())
    }

    async fn has_pending_request(&self, owner: &BareJid, contact: &BareJid) -> StorageResult<bool> {
        let (domain, user) = split(owner);
        let row = sqlx::query(
            "SELECT 1 FROM subscription_requests
             WHERE domain = $1 AND username = $2 AND contact = $3",
        )
        .bind(domain)
        .bind(user)
        .bind(contact.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?;
        Ok(row.is_some())
    }

    async fn put_pending_request(
        &self,
        owner: &BareJid,
        from: &BareJid,
        stanza: &str,
    ) -> StorageResult<()> {
        let (domain, user) = split(owner);
        sqlx::query(
            "INSERT INTO subscription_requests (domain, username, contact, stanza, created_at)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (domain, username, contact) DO UPDATE SET stanza = excluded.stanza",
        )
        .bind(domain)
        .bind(user)
        .bind(from.as_str())
        .bind(stanza)
        .bind(now_secs())
        .execute(&self.writer)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn remove_pending_request(&self, owner: &BareJid, from: &BareJid) -> StorageResult<()> {
        let (domain, user) = split(owner);
        sqlx::query(
            "DELETE FROM subscription_requests WHERE domain = $1 AND username = $2 AND contact = $3",
        )
        .bind(domain)
        .bind(user)
        .bind(from.as_str())
        .execute(&self.writer)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn remove_user(&self, owner: &BareJid) -> StorageResult<()> {
        let (domain, user) = split(owner);
        let mut tx = self.begin_write().await.map_err(backend)?;
        // The version row first: the lock order of every roster writer.
        for sql in [
            "DELETE FROM roster_versions WHERE domain = $1 AND username = $2",
            "DELETE FROM roster_items WHERE domain = $1 AND username = $2",
            "DELETE FROM subscription_requests WHERE domain = $1 AND username = $2",
        ] {
            sqlx::query(sql)
                .bind(domain)
                .bind(user)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
        }
        tx.commit().await.map_err(backend)
    }
}

#[async_trait]
impl UserDataStore for Store {
    async fn get(&self, owner: &BareJid, kind: &str, key: &str) -> StorageResult<Option<String>> {
        let (domain, user) = split(owner);
        let row = sqlx::query(
            "SELECT value FROM user_data
             WHERE domain = $1 AND username = $2 AND kind = $3 AND key = $4",
        )
        .bind(domain)
        .bind(user)
        .bind(kind)
        .bind(key)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn set(&self, owner: &BareJid, kind: &str, key: &str, value: &str) -> StorageResult<()> {
        let (domain, user) = split(owner);
        sqlx::query(
            "INSERT INTO user_data (domain, username, kind, key, value) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (domain, username, kind, key) DO UPDATE SET value = excluded.value",
        )
        .bind(domain)
        .bind(user)
        .bind(kind)
        .bind(key)
        .bind(value)
        .execute(&self.writer)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn delete(&self, owner: &BareJid, kind: &str, key: &str) -> StorageResult<()> {
        let (domain, user) = split(owner);
        sqlx::query(
            "DELETE FROM user_data WHERE domain = $1 AND username = $2 AND kind = $3 AND key = $4",
        )
        .bind(domain)
        .bind(user)
        .bind(kind)
        .bind(key)
        .execute(&self.writer)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn remove_user(&self, owner: &BareJid) -> StorageResult<()> {
        self.exec_for_owner(
            "DELETE FROM user_data WHERE domain = $1 AND username = $2",
            owner,
        )
        .await
    }
}
