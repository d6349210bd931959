//! SQLite implementation of the instant-messaging storage traits.

use super::{backend, now_secs, split, SqliteStorage};
use async_trait::async_trait;
use sqlx::sqlite::SqliteRow;
use sqlx::Row;
use starling_core::storage::{
    BlockingStore, LastActivityStore, RosterChange, RosterItem, RosterStore, StorageResult,
    Subscription, UserDataStore,
};
use starling_proto::BareJid;

const GROUP_SEP: char = '\u{1f}';

fn item_from_row(r: &SqliteRow) -> Option<RosterItem> {
    let jid = BareJid::new(r.get::<&str, _>("contact")).ok()?;
    let groups: String = r.get("groups");
    Some(RosterItem {
        jid,
        name: r.get("name"),
        subscription: Subscription::parse(r.get::<&str, _>("subscription"))?,
        ask: r.get::<i64, _>("ask") != 0,
        pending_in: r.get::<i64, _>("pending_in") != 0,
        approved: r.get::<i64, _>("approved") != 0,
        groups: if groups.is_empty() {
            Vec::new()
        } else {
            groups.split(GROUP_SEP).map(str::to_owned).collect()
        },
    })
}

async fn bump_version(
    tx: &mut sqlx::SqliteConnection,
    domain: &str,
    user: &str,
) -> Result<u64, sqlx::Error> {
    let v: i64 = sqlx::query(
        "INSERT INTO roster_versions (domain, username, version) VALUES (?, ?, 1)
         ON CONFLICT (domain, username) DO UPDATE SET version = version + 1
         RETURNING version",
    )
    .bind(domain)
    .bind(user)
    .fetch_one(&mut *tx)
    .await?
    .get(0);
    Ok(v as u64)
}

impl SqliteStorage {
    async fn roster_version(&self, domain: &str, user: &str) -> StorageResult<u64> {
        let v: Option<i64> =
            sqlx::query("SELECT version FROM roster_versions WHERE domain = ? AND username = ?")
                .bind(domain)
                .bind(user)
                .fetch_optional(&self.pool)
                .await
                .map_err(backend)?
                .map(|r| r.get(0));
        Ok(v.unwrap_or(0) as u64)
    }
}

#[async_trait]
impl RosterStore for SqliteStorage {
    async fn get_roster(&self, owner: &BareJid) -> StorageResult<(u64, Vec<RosterItem>)> {
        let (domain, user) = split(owner);
        let rows = sqlx::query(
            "SELECT contact, name, subscription, ask, pending_in, approved, groups
             FROM roster_items WHERE domain = ? AND username = ? AND removed = 0
             ORDER BY contact",
        )
        .bind(domain)
        .bind(user)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        let items = rows.iter().filter_map(item_from_row).collect();
        Ok((self.roster_version(domain, user).await?, items))
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
             WHERE domain = ? AND username = ? AND contact = ? AND removed = 0",
        )
        .bind(domain)
        .bind(user)
        .bind(contact.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?;
        Ok(row.as_ref().and_then(item_from_row))
    }

    async fn put_item(&self, owner: &BareJid, item: &RosterItem) -> StorageResult<u64> {
        let (domain, user) = split(owner);
        let groups = item.groups.join(&GROUP_SEP.to_string());
        let mut tx = self.pool.begin().await.map_err(backend)?;
        let version = bump_version(&mut tx, domain, user).await.map_err(backend)?;
        sqlx::query(
            "INSERT INTO roster_items
             (domain, username, contact, name, subscription, ask, pending_in, approved, groups, version, removed)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)
             ON CONFLICT (domain, username, contact) DO UPDATE SET
               name = excluded.name, subscription = excluded.subscription, ask = excluded.ask,
               pending_in = excluded.pending_in, approved = excluded.approved,
               groups = excluded.groups, version = excluded.version, removed = 0",
        )
        .bind(domain)
        .bind(user)
        .bind(item.jid.as_str())
        .bind(item.name.as_deref())
        .bind(item.subscription.as_str())
        .bind(item.ask as i64)
        .bind(item.pending_in as i64)
        .bind(item.approved as i64)
        .bind(groups)
        .bind(version as i64)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(version)
    }

    async fn remove_item(&self, owner: &BareJid, contact: &BareJid) -> StorageResult<Option<u64>> {
        let (domain, user) = split(owner);
        let mut tx = self.pool.begin().await.map_err(backend)?;
        let exists = sqlx::query(
            "SELECT 1 FROM roster_items
             WHERE domain = ? AND username = ? AND contact = ? AND removed = 0",
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
            "UPDATE roster_items SET removed = 1, version = ?, subscription = 'none', ask = 0,
             pending_in = 0, approved = 0, groups = '', name = NULL
             WHERE domain = ? AND username = ? AND contact = ?",
        )
        .bind(version as i64)
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
        let current = self.roster_version(domain, user).await?;
        if version > current {
            return Ok(None);
        }
        let rows = sqlx::query(
            "SELECT contact, name, subscription, ask, pending_in, approved, groups, removed
             FROM roster_items WHERE domain = ? AND username = ? AND version > ?
             ORDER BY version",
        )
        .bind(domain)
        .bind(user)
        .bind(version as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        let changes = rows
            .iter()
            .filter_map(|r| {
                if r.get::<i64, _>("removed") != 0 {
                    BareJid::new(r.get::<&str, _>("contact"))
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
            "SELECT COUNT(*) FROM roster_items WHERE domain = ? AND username = ? AND removed = 0",
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
             WHERE domain = ? AND username = ? ORDER BY created_at, contact",
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

    async fn put_pending_request(
        &self,
        owner: &BareJid,
        from: &BareJid,
        stanza: &str,
    ) -> StorageResult<()> {
        let (domain, user) = split(owner);
        sqlx::query(
            "INSERT INTO subscription_requests (domain, username, contact, stanza, created_at)
             VALUES (?, ?, ?, ?, ?)
             ON CONFLICT (domain, username, contact) DO UPDATE SET stanza = excluded.stanza",
        )
        .bind(domain)
        .bind(user)
        .bind(from.as_str())
        .bind(stanza)
        .bind(now_secs())
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn remove_pending_request(&self, owner: &BareJid, from: &BareJid) -> StorageResult<()> {
        let (domain, user) = split(owner);
        sqlx::query(
            "DELETE FROM subscription_requests WHERE domain = ? AND username = ? AND contact = ?",
        )
        .bind(domain)
        .bind(user)
        .bind(from.as_str())
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn remove_user(&self, owner: &BareJid) -> StorageResult<()> {
        let (domain, user) = split(owner);
        let mut tx = self.pool.begin().await.map_err(backend)?;
        for sql in [
            "DELETE FROM roster_items WHERE domain = ? AND username = ?",
            "DELETE FROM roster_versions WHERE domain = ? AND username = ?",
            "DELETE FROM subscription_requests WHERE domain = ? AND username = ?",
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
impl BlockingStore for SqliteStorage {
    async fn blocklist(&self, owner: &BareJid) -> StorageResult<Vec<String>> {
        let (domain, user) = split(owner);
        let rows =
            sqlx::query("SELECT jid FROM blocklist WHERE domain = ? AND username = ? ORDER BY jid")
                .bind(domain)
                .bind(user)
                .fetch_all(&self.pool)
                .await
                .map_err(backend)?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    async fn block(&self, owner: &BareJid, jids: &[String]) -> StorageResult<Vec<String>> {
        let (domain, user) = split(owner);
        let mut tx = self.pool.begin().await.map_err(backend)?;
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

    async fn unblock(&self, owner: &BareJid, jids: &[String]) -> StorageResult<Vec<String>> {
        let (domain, user) = split(owner);
        let mut tx = self.pool.begin().await.map_err(backend)?;
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

    async fn unblock_all(&self, owner: &BareJid) -> StorageResult<Vec<String>> {
        let (domain, user) = split(owner);
        let rows =
            sqlx::query("DELETE FROM blocklist WHERE domain = ? AND username = ? RETURNING jid")
                .bind(domain)
                .bind(user)
                .fetch_all(&self.pool)
                .await
                .map_err(backend)?;
        let mut v: Vec<String> = rows.into_iter().map(|r| r.get(0)).collect();
        v.sort();
        Ok(v)
    }
}

#[async_trait]
impl UserDataStore for SqliteStorage {
    async fn get(&self, owner: &BareJid, kind: &str, key: &str) -> StorageResult<Option<String>> {
        let (domain, user) = split(owner);
        let row = sqlx::query(
            "SELECT value FROM user_data WHERE domain = ? AND username = ? AND kind = ? AND key = ?",
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
            "INSERT INTO user_data (domain, username, kind, key, value) VALUES (?, ?, ?, ?, ?)
             ON CONFLICT (domain, username, kind, key) DO UPDATE SET value = excluded.value",
        )
        .bind(domain)
        .bind(user)
        .bind(kind)
        .bind(key)
        .bind(value)
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn delete(&self, owner: &BareJid, kind: &str, key: &str) -> StorageResult<()> {
        let (domain, user) = split(owner);
        sqlx::query(
            "DELETE FROM user_data WHERE domain = ? AND username = ? AND kind = ? AND key = ?",
        )
        .bind(domain)
        .bind(user)
        .bind(kind)
        .bind(key)
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn remove_user(&self, owner: &BareJid) -> StorageResult<()> {
        self.exec_for_owner(
            "DELETE FROM user_data WHERE domain = ? AND username = ?",
            owner,
        )
        .await
    }
}

#[async_trait]
impl LastActivityStore for SqliteStorage {
    async fn get(&self, owner: &BareJid) -> StorageResult<Option<(u64, String)>> {
        let (domain, user) = split(owner);
        let row =
            sqlx::query("SELECT at, status FROM last_activity WHERE domain = ? AND username = ?")
                .bind(domain)
                .bind(user)
                .fetch_optional(&self.pool)
                .await
                .map_err(backend)?;
        Ok(row.map(|r| (r.get::<i64, _>(0) as u64, r.get(1))))
    }

    async fn set(&self, owner: &BareJid, at_unix_secs: u64, status: &str) -> StorageResult<()> {
        let (domain, user) = split(owner);
        let _turn = self.write_turn.lock().await;
        sqlx::query(
            "INSERT INTO last_activity (domain, username, at, status) VALUES (?, ?, ?, ?)
             ON CONFLICT (domain, username) DO UPDATE SET at = excluded.at, status = excluded.status",
        )
        .bind(domain)
        .bind(user)
        .bind(at_unix_secs as i64)
        .bind(status)
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn remove_user(&self, owner: &BareJid) -> StorageResult<()> {
        self.exec_for_owner(
            "DELETE FROM last_activity WHERE domain = ? AND username = ?",
            owner,
        )
        .await
    }
}
