//! [`MucStore`] in SQL, the same on both engines (compiled once for each,
//! where `Store` is its backend: see `mod.rs`): group-chat rooms and
//! their affiliations.
//!
//! A room JID `name@service` is keyed by `(service, name)`, its domain and
//! node (as [`split`] gives an account's). Writers of one stored room are
//! serialized by its `muc_rooms` row: `delete_room` deletes it first and
//! `set_affiliations` locks it first (`FOR UPDATE` on PostgreSQL; SQLite
//! has one writer anyway), so the lock order is the same everywhere (room
//! row, then affiliation rows). Affiliations do not require a stored room:
//! the module may write them before the room itself.
//!
//! MUC Light blocking lists (`muclight_blocking`) are keyed by their
//! owner's bare JID; a transaction of [`MucStore::set_light_blocking`]
//! touches its rows in key order, whatever the caller's order, so two of
//! them never wait for each other in a cycle (PostgreSQL).

use super::super::{MucStore, RoomAffiliation, StoredRoom};
use super::Store;
use starling_core::async_trait;
use starling_core::storage::{StorageError, StorageResult};
use starling_proto::BareJid;
use starling_storage::for_update;
use starling_storage::kit::sqlx::{self, Database, Row};
use starling_storage::kit::{backend, split, SqlEngine};
use std::collections::{BTreeMap, HashSet};

/// The driver of this engine.
type Db = <Store as SqlEngine>::Db;

/// Users per [`MucStore::light_refusing`] statement (bound parameters stay
/// far below either engine's limit).
const REFUSING_GROUP: usize = 500;

/// The kinds of MUC Light blocking rows.
const LIGHT_KINDS: [&str; 2] = ["room", "user"];

/// The room JID of a `(service, name)` key; `None` if it is no longer a
/// valid JID.
fn room_jid(service: &str, name: &str) -> Option<BareJid> {
    if name.is_empty() {
        BareJid::new(service).ok()
    } else {
        BareJid::new(&format!("{name}@{service}")).ok()
    }
}

/// A `muc_rooms` row (`service, name, config, subject, created_at`).
fn room_from_row(r: &<Db as Database>::Row) -> Option<StoredRoom> {
    Some(StoredRoom {
        jid: room_jid(r.get("service"), r.get("name"))?,
        config: r.get("config"),
        subject: r.get("subject"),
        created_at: r.get("created_at"),
    })
}

/// A `muc_affiliations` row (`jid, affiliation, nick, reason`).
fn affiliation_from_row(r: &<Db as Database>::Row) -> RoomAffiliation {
    RoomAffiliation {
        jid: r.get("jid"),
        affiliation: r.get("affiliation"),
        nick: r.get("nick"),
        reason: r.get("reason"),
    }
}

#[async_trait]
impl MucStore for Store {
    async fn room(&self, room: &BareJid) -> StorageResult<Option<StoredRoom>> {
        let (service, name) = split(room);
        let row = sqlx::query(
            "SELECT service, name, config, subject, created_at FROM muc_rooms
             WHERE service = $1 AND name = $2",
        )
        .bind(service)
        .bind(name)
        .fetch_optional(self.reader())
        .await
        .map_err(backend)?;
        Ok(row.as_ref().and_then(room_from_row))
    }

    async fn put_room(&self, room: &StoredRoom) -> StorageResult<()> {
        let (service, name) = split(&room.jid);
        // One statement: atomic on both engines; created_at is not in the
        // update, so an existing room keeps its own.
        sqlx::query(
            "INSERT INTO muc_rooms (service, name, config, subject, created_at)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (service, name) DO UPDATE SET
               config = excluded.config, subject = excluded.subject",
        )
        .bind(service)
        .bind(name)
        .bind(room.config.as_str())
        .bind(room.subject.as_str())
        .bind(room.created_at)
        .execute(self.writer())
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn delete_room(&self, room: &BareJid) -> StorageResult<bool> {
        let (service, name) = split(room);
        let mut tx = self.begin_write().await.map_err(backend)?;
        // The room row first: the lock order of set_affiliations.
        let existed = sqlx::query("DELETE FROM muc_rooms WHERE service = $1 AND name = $2")
            .bind(service)
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(backend)?
            .rows_affected()
            > 0;
        sqlx::query("DELETE FROM muc_affiliations WHERE service = $1 AND name = $2")
            .bind(service)
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(existed)
    }

    async fn rooms(
        &self,
        service: &str,
        after: Option<&str>,
        limit: u32,
    ) -> StorageResult<Vec<StoredRoom>> {
        let rows = sqlx::query(
            "SELECT service, name, config, subject, created_at FROM muc_rooms
             WHERE service = $1 AND name > $2
             ORDER BY name LIMIT $3",
        )
        .bind(service)
        .bind(after.unwrap_or(""))
        .bind(i64::from(limit))
        .fetch_all(self.reader())
        .await
        .map_err(backend)?;
        Ok(rows.iter().filter_map(room_from_row).collect())
    }

    async fn affiliations(&self, room: &BareJid) -> StorageResult<Vec<RoomAffiliation>> {
        let (service, name) = split(room);
        let rows = sqlx::query(
            "SELECT jid, affiliation, nick, reason FROM muc_affiliations
             WHERE service = $1 AND name = $2 ORDER BY jid",
        )
        .bind(service)
        .bind(name)
        .fetch_all(self.reader())
        .await
        .map_err(backend)?;
        Ok(rows.iter().map(affiliation_from_row).collect())
    }

    async fn set_affiliations(
        &self,
        room: &BareJid,
        changes: &[RoomAffiliation],
    ) -> StorageResult<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let (service, name) = split(room);
        let mut tx = self.begin_write().await.map_err(backend)?;
        // Lock order: the room row (if stored), then the affiliations, as
        // delete_room does; concurrent writers of one room take turns.
        sqlx::query(for_update!(
            "SELECT 1 FROM muc_rooms WHERE service = $1 AND name = $2"
        ))
        .bind(service)
        .bind(name)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
        // In the caller's order: of two changes of one JID, the last wins.
        for c in changes {
            if c.affiliation == "none" {
                sqlx::query(
                    "DELETE FROM muc_affiliations WHERE service = $1 AND name = $2 AND jid = $3",
                )
                .bind(service)
                .bind(name)
                .bind(c.jid.as_str())
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            } else {
                sqlx::query(
                    "INSERT INTO muc_affiliations (service, name, jid, affiliation, nick, reason)
                     VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (service, name, jid) DO UPDATE SET
                       affiliation = excluded.affiliation, nick = excluded.nick,
                       reason = excluded.reason",
                )
                .bind(service)
                .bind(name)
                .bind(c.jid.as_str())
                .bind(c.affiliation.as_str())
                .bind(c.nick.as_deref())
                .bind(c.reason.as_deref())
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            }
        }
        tx.commit().await.map_err(backend)
    }

    async fn rooms_of(&self, jid: &BareJid) -> StorageResult<Vec<(BareJid, RoomAffiliation)>> {
        let rows = sqlx::query(
            "SELECT service, name, jid, affiliation, nick, reason FROM muc_affiliations
             WHERE jid = $1 ORDER BY service, name",
        )
        .bind(jid.as_str())
        .fetch_all(self.reader())
        .await
        .map_err(backend)?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let room = room_jid(r.get("service"), r.get("name"))?;
                Some((room, affiliation_from_row(r)))
            })
            .collect())
    }

    async fn remove_user(&self, jid: &BareJid) -> StorageResult<()> {
        let mut tx = self.begin_write().await.map_err(backend)?;
        sqlx::query("DELETE FROM muc_affiliations WHERE jid = $1")
            .bind(jid.as_str())
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        sqlx::query("DELETE FROM muclight_blocking WHERE owner = $1")
            .bind(jid.as_str())
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        tx.commit().await.map_err(backend)
    }

    async fn light_blocking(&self, user: &BareJid) -> StorageResult<Vec<(String, BareJid)>> {
        let rows = sqlx::query(
            "SELECT kind, jid FROM muclight_blocking WHERE owner = $1 ORDER BY kind, jid",
        )
        .bind(user.as_str())
        .fetch_all(self.reader())
        .await
        .map_err(backend)?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let jid = BareJid::new(r.get("jid")).ok()?;
                Some((r.get("kind"), jid))
            })
            .collect())
    }

    async fn set_light_blocking(
        &self,
        user: &BareJid,
        deny: &[(String, BareJid)],
        allow: &[(String, BareJid)],
    ) -> StorageResult<()> {
        // Each pair once, true to add it; `allow` after `deny`, so it wins.
        let mut changes = BTreeMap::new();
        for ((kind, jid), add) in deny
            .iter()
            .map(|c| (c, true))
            .chain(allow.iter().map(|c| (c, false)))
        {
            if !LIGHT_KINDS.contains(&kind.as_str()) {
                return Err(StorageError::Backend(format!(
                    "MUC Light blocking: unknown kind {kind:?}"
                )));
            }
            changes.insert((kind.as_str(), jid.as_str()), add);
        }
        if changes.is_empty() {
            return Ok(());
        }
        let mut tx = self.begin_write().await.map_err(backend)?;
        // In key order (see the module's documentation).
        for ((kind, jid), add) in changes {
            let sql = if add {
                "INSERT INTO muclight_blocking (owner, kind, jid) VALUES ($1, $2, $3)
                 ON CONFLICT (owner, kind, jid) DO NOTHING"
            } else {
                "DELETE FROM muclight_blocking WHERE owner = $1 AND kind = $2 AND jid = $3"
            };
            sqlx::query(sql)
                .bind(user.as_str())
                .bind(kind)
                .bind(jid)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
        }
        tx.commit().await.map_err(backend)
    }

    async fn light_refusing(
        &self,
        users: &[BareJid],
        room: &BareJid,
        by: &BareJid,
    ) -> StorageResult<Vec<BareJid>> {
        let mut refusing = HashSet::new();
        for group in users.chunks(REFUSING_GROUP) {
            let mut b = sqlx::QueryBuilder::<Db>::new(
                "SELECT DISTINCT owner FROM muclight_blocking
                 WHERE ((kind = 'room' AND jid = ",
            );
            b.push_bind(room.as_str())
                .push(") OR (kind = 'user' AND jid = ")
                .push_bind(by.as_str())
                .push(")) AND owner IN (");
            let mut sep = b.separated(", ");
            for u in group {
                sep.push_bind(u.as_str());
            }
            b.push(")");
            let rows = b.build().fetch_all(self.reader()).await.map_err(backend)?;
            refusing.extend(rows.iter().map(|r| r.get::<String, _>("owner")));
        }
        // In the caller's order, each once.
        Ok(users
            .iter()
            .filter(|u| refusing.remove(u.as_str()))
            .cloned()
            .collect())
    }
}
