//! [`PubsubStore`]: publish-subscribe nodes (XEP-0060, PEP XEP-0163), their
//! items, subscriptions and affiliations.
//!
//! The node row stands for a foreign key: items, subscriptions and
//! affiliations are written only in a transaction that has found the node
//! row (and locked it on PostgreSQL), and `delete_node` deletes the node
//! row first, then the rest, in one transaction. Lock order everywhere:
//! the node row, then the node's other rows. On PostgreSQL the writers
//! that add a row to a node take `FOR KEY SHARE` (concurrent subscribers
//! of one node do not wait for each other; a deletion of the node waits
//! for them, and they find no node after it), the writers of items take
//! `FOR NO KEY UPDATE` (publications to one node take turns, so trimming
//! to `max_items` sees every item; subscribers do not wait for them).
//! SQLite has one writer: each such transaction begins `IMMEDIATE`
//! ([`Dialect::begin_write`]), as one that reads before it writes must.
//!
//! Newest first means by `seq`, then by item id (the module makes seqs
//! unique; the id only makes ties deterministic), the order of the
//! `pubsub_items_by_seq` index.

use super::{backend, Db, Dialect, Store};
use crate::dialect::Conn;
use async_trait::async_trait;
use sqlx::{Database, Row};
use starling_core::storage::{
    PubsubStore, PubsubSubscription, StorageError, StorageResult, StoredItem, StoredNode,
};
use starling_proto::BareJid;
use std::collections::BTreeSet;

/// `$sql` with ` $lock` (a PostgreSQL row-locking clause) appended where
/// the engine has row locks, like `for_update!` with another strength.
macro_rules! locking {
    ($sql:literal, $lock:literal) => {
        if <Store as crate::dialect::Dialect>::ROW_LOCKS {
            concat!($sql, " ", $lock)
        } else {
            $sql
        }
    };
}

/// Item ids per [`PubsubStore::items_by_id`] statement, services per
/// [`PubsubStore::last_items_of`] statement (bound parameters
/// stay far below either engine's limit).
const IDS_PER_QUERY: usize = 500;

/// The error of a write to a node that does not exist.
fn no_node(service: &str, node: &str) -> StorageError {
    StorageError::Backend(format!("pubsub: no node {node:?} on service {service:?}"))
}

/// A `pubsub_nodes` row (`service, node, config, created_at`).
fn node_from_row(r: &<Db as Database>::Row) -> StoredNode {
    StoredNode {
        service: r.get("service"),
        node: r.get("node"),
        config: r.get("config"),
        created_at: r.get("created_at"),
    }
}

/// A `pubsub_items` row (`item_id, publisher, payload, seq`).
fn item_from_row(r: &<Db as Database>::Row) -> StoredItem {
    StoredItem {
        id: r.get("item_id"),
        publisher: r.get("publisher"),
        payload: r.get("payload"),
        seq: r.get("seq"),
    }
}

/// A `pubsub_subscriptions` row (`jid, subid, state, options`).
fn subscription_from_row(r: &<Db as Database>::Row) -> PubsubSubscription {
    PubsubSubscription {
        jid: r.get("jid"),
        subid: r.get("subid"),
        state: r.get("state"),
        options: r.get("options"),
    }
}

/// Finds the node row with `sql` (its `SELECT`, with the lock the caller
/// needs) in the caller's transaction; true if it exists.
async fn find_node(
    conn: &mut Conn<Store>,
    sql: &'static str,
    service: &str,
    node: &str,
) -> StorageResult<bool> {
    Ok(sqlx::query(sql)
        .bind(service)
        .bind(node)
        .fetch_optional(&mut *conn)
        .await
        .map_err(backend)?
        .is_some())
}

/// Deletes all but the `keep` newest items of a node in the caller's
/// transaction (which holds the node row); the removed ids, oldest first.
async fn trim_in(
    conn: &mut Conn<Store>,
    service: &str,
    node: &str,
    keep: u32,
) -> StorageResult<Vec<String>> {
    // The newest item to remove is the (keep+1)-th newest: it and every
    // older one go. No such item (a row-valued NULL): nothing goes.
    let rows = sqlx::query(
        "DELETE FROM pubsub_items
         WHERE service = $1 AND node = $2
           AND (seq, item_id) <= (
             SELECT seq, item_id FROM pubsub_items
             WHERE service = $1 AND node = $2
             ORDER BY seq DESC, item_id DESC LIMIT 1 OFFSET $3)
         RETURNING item_id, seq",
    )
    .bind(service)
    .bind(node)
    .bind(i64::from(keep))
    .fetch_all(&mut *conn)
    .await
    .map_err(backend)?;
    let mut removed: Vec<(i64, String)> = rows
        .iter()
        .map(|r| (r.get("seq"), r.get("item_id")))
        .collect();
    // RETURNING has no order.
    removed.sort();
    Ok(removed.into_iter().map(|(_, id)| id).collect())
}

#[async_trait]
impl PubsubStore for Store {
    async fn node(&self, service: &str, node: &str) -> StorageResult<Option<StoredNode>> {
        let row = sqlx::query(
            "SELECT service, node, config, created_at FROM pubsub_nodes
             WHERE service = $1 AND node = $2",
        )
        .bind(service)
        .bind(node)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?;
        Ok(row.as_ref().map(node_from_row))
    }

    async fn create_node(&self, node: &StoredNode) -> StorageResult<()> {
        // One statement: atomic on both engines.
        let created = sqlx::query(
            "INSERT INTO pubsub_nodes (service, node, config, created_at)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (service, node) DO NOTHING",
        )
        .bind(node.service.as_str())
        .bind(node.node.as_str())
        .bind(node.config.as_str())
        .bind(node.created_at)
        .execute(&self.writer)
        .await
        .map_err(backend)?
        .rows_affected();
        if created == 0 {
            return Err(StorageError::Conflict);
        }
        Ok(())
    }

    async fn set_node_config(
        &self,
        service: &str,
        node: &str,
        config: &str,
    ) -> StorageResult<bool> {
        let updated =
            sqlx::query("UPDATE pubsub_nodes SET config = $3 WHERE service = $1 AND node = $2")
                .bind(service)
                .bind(node)
                .bind(config)
                .execute(&self.writer)
                .await
                .map_err(backend)?
                .rows_affected();
        Ok(updated > 0)
    }

    async fn delete_node(&self, service: &str, node: &str) -> StorageResult<bool> {
        let mut tx = self.begin_write().await.map_err(backend)?;
        // The node row first: writers of the node's rows hold it (see the
        // module's documentation), so what they wrote is committed, and
        // seen by the deletions below, or they find no node.
        let existed = sqlx::query("DELETE FROM pubsub_nodes WHERE service = $1 AND node = $2")
            .bind(service)
            .bind(node)
            .execute(&mut *tx)
            .await
            .map_err(backend)?
            .rows_affected()
            > 0;
        for sql in [
            "DELETE FROM pubsub_items WHERE service = $1 AND node = $2",
            "DELETE FROM pubsub_subscriptions WHERE service = $1 AND node = $2",
            "DELETE FROM pubsub_affiliations WHERE service = $1 AND node = $2",
        ] {
            sqlx::query(sql)
                .bind(service)
                .bind(node)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
        }
        tx.commit().await.map_err(backend)?;
        Ok(existed)
    }

    async fn nodes(&self, service: &str) -> StorageResult<Vec<StoredNode>> {
        let rows = sqlx::query(
            "SELECT service, node, config, created_at FROM pubsub_nodes
             WHERE service = $1 ORDER BY node",
        )
        .bind(service)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows.iter().map(node_from_row).collect())
    }

    async fn publish(
        &self,
        service: &str,
        node: &str,
        item: &StoredItem,
        max_items: Option<u32>,
    ) -> StorageResult<Vec<String>> {
        let mut tx = self.begin_write().await.map_err(backend)?;
        let sql = locking!(
            "SELECT 1 FROM pubsub_nodes WHERE service = $1 AND node = $2",
            "FOR NO KEY UPDATE"
        );
        if !find_node(&mut tx, sql, service, node).await? {
            return Err(no_node(service, node));
        }
        sqlx::query(
            "INSERT INTO pubsub_items (service, node, item_id, publisher, payload, seq)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (service, node, item_id) DO UPDATE SET
               publisher = excluded.publisher, payload = excluded.payload, seq = excluded.seq",
        )
        .bind(service)
        .bind(node)
        .bind(item.id.as_str())
        .bind(item.publisher.as_str())
        .bind(item.payload.as_str())
        .bind(item.seq)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
        let removed = match max_items {
            Some(max) => trim_in(&mut tx, service, node, max).await?,
            None => Vec::new(),
        };
        tx.commit().await.map_err(backend)?;
        Ok(removed)
    }

    async fn items(
        &self,
        service: &str,
        node: &str,
        max: Option<u32>,
    ) -> StorageResult<Vec<StoredItem>> {
        let rows = sqlx::query(
            "SELECT item_id, publisher, payload, seq FROM pubsub_items
             WHERE service = $1 AND node = $2
             ORDER BY seq DESC, item_id DESC LIMIT $3",
        )
        .bind(service)
        .bind(node)
        .bind(max.map_or(i64::MAX, i64::from))
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows.iter().map(item_from_row).collect())
    }

    async fn items_by_id(
        &self,
        service: &str,
        node: &str,
        ids: &[String],
    ) -> StorageResult<Vec<StoredItem>> {
        // Each id once, so that no item is found by two statements.
        let ids: Vec<&str> = ids
            .iter()
            .map(String::as_str)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut items = Vec::new();
        for group in ids.chunks(IDS_PER_QUERY) {
            let mut b = sqlx::QueryBuilder::<Db>::new(
                "SELECT item_id, publisher, payload, seq FROM pubsub_items WHERE service = ",
            );
            b.push_bind(service)
                .push(" AND node = ")
                .push_bind(node)
                .push(" AND item_id IN (");
            let mut sep = b.separated(", ");
            for id in group {
                sep.push_bind(*id);
            }
            b.push(")");
            let rows = b.build().fetch_all(&self.pool).await.map_err(backend)?;
            items.extend(rows.iter().map(item_from_row));
        }
        items.sort_by(|a, b| (b.seq, &b.id).cmp(&(a.seq, &a.id)));
        Ok(items)
    }

    async fn last_items(&self, service: &str) -> StorageResult<Vec<(String, StoredItem)>> {
        // Per node of the service, its newest item: one probe of the
        // by-seq index (newest end) and one of the primary key.
        let rows = sqlx::query(
            "SELECT n.node, i.item_id, i.publisher, i.payload, i.seq
             FROM pubsub_nodes n
             JOIN pubsub_items i
               ON i.service = n.service AND i.node = n.node
              AND i.item_id = (
                SELECT j.item_id FROM pubsub_items j
                WHERE j.service = n.service AND j.node = n.node
                ORDER BY j.seq DESC, j.item_id DESC LIMIT 1)
             WHERE n.service = $1
             ORDER BY n.node",
        )
        .bind(service)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows
            .iter()
            .map(|r| (r.get("node"), item_from_row(r)))
            .collect())
    }

    async fn last_items_of(
        &self,
        services: &[String],
    ) -> StorageResult<Vec<(StoredNode, StoredItem)>> {
        // The query of `last_items` for a few hundred services at a time.
        let services: Vec<&str> = services
            .iter()
            .map(String::as_str)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut out = Vec::new();
        for group in services.chunks(IDS_PER_QUERY) {
            let mut b = sqlx::QueryBuilder::<Db>::new(
                "SELECT n.service, n.node, n.config, n.created_at,
                        i.item_id, i.publisher, i.payload, i.seq
                 FROM pubsub_nodes n
                 JOIN pubsub_items i
                   ON i.service = n.service AND i.node = n.node
                  AND i.item_id = (
                    SELECT j.item_id FROM pubsub_items j
                    WHERE j.service = n.service AND j.node = n.node
                    ORDER BY j.seq DESC, j.item_id DESC LIMIT 1)
                 WHERE n.service IN (",
            );
            let mut sep = b.separated(", ");
            for service in group {
                sep.push_bind(*service);
            }
            b.push(") ORDER BY n.service, n.node");
            let rows = b.build().fetch_all(&self.pool).await.map_err(backend)?;
            out.extend(rows.iter().map(|r| (node_from_row(r), item_from_row(r))));
        }
        Ok(out)
    }

    async fn stored_bytes(
        &self,
        service: &str,
        except: Option<(&str, &str)>,
    ) -> StorageResult<u64> {
        // OCTET_LENGTH: bytes on both engines (LENGTH counts characters).
        let (node, id) = except.unwrap_or(("", ""));
        let row = sqlx::query(
            "SELECT CAST(COALESCE(SUM(OCTET_LENGTH(payload)), 0) AS BIGINT) AS bytes
             FROM pubsub_items
             WHERE service = $1 AND NOT (node = $2 AND item_id = $3)",
        )
        .bind(service)
        .bind(node)
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .map_err(backend)?;
        let bytes: i64 = row.get("bytes");
        Ok(bytes.max(0) as u64)
    }

    async fn owned_bytes(
        &self,
        service: &str,
        owner: &str,
        except: Option<(&str, &str)>,
    ) -> StorageResult<u64> {
        let (node, id) = except.unwrap_or(("", ""));
        let row = sqlx::query(
            "SELECT CAST(COALESCE(SUM(OCTET_LENGTH(i.payload)), 0) AS BIGINT) AS bytes
             FROM pubsub_affiliations a
             JOIN pubsub_items i ON i.service = a.service AND i.node = a.node
             WHERE a.service = $1 AND a.jid = $2 AND a.affiliation = 'owner'
               AND NOT (i.node = $3 AND i.item_id = $4)",
        )
        .bind(service)
        .bind(owner)
        .bind(node)
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .map_err(backend)?;
        let bytes: i64 = row.get("bytes");
        Ok(bytes.max(0) as u64)
    }

    async fn retract(&self, service: &str, node: &str, id: &str) -> StorageResult<bool> {
        let removed = sqlx::query(
            "DELETE FROM pubsub_items WHERE service = $1 AND node = $2 AND item_id = $3",
        )
        .bind(service)
        .bind(node)
        .bind(id)
        .execute(&self.writer)
        .await
        .map_err(backend)?
        .rows_affected();
        Ok(removed > 0)
    }

    async fn purge(&self, service: &str, node: &str) -> StorageResult<u64> {
        Ok(
            sqlx::query("DELETE FROM pubsub_items WHERE service = $1 AND node = $2")
                .bind(service)
                .bind(node)
                .execute(&self.writer)
                .await
                .map_err(backend)?
                .rows_affected(),
        )
    }

    async fn trim(&self, service: &str, node: &str, max: u32) -> StorageResult<Vec<String>> {
        let mut tx = self.begin_write().await.map_err(backend)?;
        // Publications take turns with this (the node row, as in publish).
        let sql = locking!(
            "SELECT 1 FROM pubsub_nodes WHERE service = $1 AND node = $2",
            "FOR NO KEY UPDATE"
        );
        if !find_node(&mut tx, sql, service, node).await? {
            // No node, no items (delete_node removed them).
            return Ok(Vec::new());
        }
        let removed = trim_in(&mut tx, service, node, max).await?;
        tx.commit().await.map_err(backend)?;
        Ok(removed)
    }

    async fn subscriptions(
        &self,
        service: &str,
        node: &str,
    ) -> StorageResult<Vec<PubsubSubscription>> {
        let rows = sqlx::query(
            "SELECT jid, subid, state, options FROM pubsub_subscriptions
             WHERE service = $1 AND node = $2 ORDER BY jid, subid",
        )
        .bind(service)
        .bind(node)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows.iter().map(subscription_from_row).collect())
    }

    async fn set_subscription(
        &self,
        service: &str,
        node: &str,
        sub: &PubsubSubscription,
    ) -> StorageResult<()> {
        let mut tx = self.begin_write().await.map_err(backend)?;
        let sql = locking!(
            "SELECT 1 FROM pubsub_nodes WHERE service = $1 AND node = $2",
            "FOR KEY SHARE"
        );
        if !find_node(&mut tx, sql, service, node).await? {
            return Err(no_node(service, node));
        }
        sqlx::query(
            "INSERT INTO pubsub_subscriptions (service, node, jid, subid, state, options)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (service, node, jid, subid) DO UPDATE SET
               state = excluded.state, options = excluded.options",
        )
        .bind(service)
        .bind(node)
        .bind(sub.jid.as_str())
        .bind(sub.subid.as_str())
        .bind(sub.state.as_str())
        .bind(sub.options.as_str())
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
        tx.commit().await.map_err(backend)
    }

    async fn remove_subscription(
        &self,
        service: &str,
        node: &str,
        jid: &str,
        subid: Option<&str>,
    ) -> StorageResult<u64> {
        let q = match subid {
            Some(subid) => sqlx::query(
                "DELETE FROM pubsub_subscriptions
                 WHERE service = $1 AND node = $2 AND jid = $3 AND subid = $4",
            )
            .bind(service)
            .bind(node)
            .bind(jid)
            .bind(subid),
            None => sqlx::query(
                "DELETE FROM pubsub_subscriptions WHERE service = $1 AND node = $2 AND jid = $3",
            )
            .bind(service)
            .bind(node)
            .bind(jid),
        };
        Ok(q.execute(&self.writer)
            .await
            .map_err(backend)?
            .rows_affected())
    }

    async fn subscriptions_of(
        &self,
        service: &str,
        jid: &str,
    ) -> StorageResult<Vec<(String, PubsubSubscription)>> {
        let rows = sqlx::query(
            "SELECT node, jid, subid, state, options FROM pubsub_subscriptions
             WHERE service = $1 AND jid = $2 ORDER BY node, subid",
        )
        .bind(service)
        .bind(jid)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows
            .iter()
            .map(|r| (r.get("node"), subscription_from_row(r)))
            .collect())
    }

    async fn subscriptions_of_account(
        &self,
        service: &str,
        jid: &BareJid,
    ) -> StorageResult<Vec<(String, PubsubSubscription)>> {
        // The bare JID and the range of its full JIDs, as in remove_user.
        let bare = jid.as_str();
        let rows = sqlx::query(
            "SELECT node, jid, subid, state, options FROM pubsub_subscriptions
             WHERE (jid = $2 OR (jid >= $3 AND jid < $4)) AND service = $1
             ORDER BY node, jid, subid",
        )
        .bind(service)
        .bind(bare)
        .bind(format!("{bare}/"))
        .bind(format!("{bare}0"))
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows
            .iter()
            .map(|r| (r.get("node"), subscription_from_row(r)))
            .collect())
    }

    async fn affiliations(
        &self,
        service: &str,
        node: &str,
    ) -> StorageResult<Vec<(String, String)>> {
        let rows = sqlx::query(
            "SELECT jid, affiliation FROM pubsub_affiliations
             WHERE service = $1 AND node = $2 ORDER BY jid",
        )
        .bind(service)
        .bind(node)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows
            .iter()
            .map(|r| (r.get("jid"), r.get("affiliation")))
            .collect())
    }

    async fn set_affiliation(
        &self,
        service: &str,
        node: &str,
        jid: &str,
        affiliation: &str,
    ) -> StorageResult<()> {
        let mut tx = self.begin_write().await.map_err(backend)?;
        let sql = locking!(
            "SELECT 1 FROM pubsub_nodes WHERE service = $1 AND node = $2",
            "FOR KEY SHARE"
        );
        if !find_node(&mut tx, sql, service, node).await? {
            return Err(no_node(service, node));
        }
        if affiliation == "none" {
            sqlx::query(
                "DELETE FROM pubsub_affiliations WHERE service = $1 AND node = $2 AND jid = $3",
            )
            .bind(service)
            .bind(node)
            .bind(jid)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        } else {
            sqlx::query(
                "INSERT INTO pubsub_affiliations (service, node, jid, affiliation)
                 VALUES ($1, $2, $3, $4)
                 ON CONFLICT (service, node, jid) DO UPDATE SET
                   affiliation = excluded.affiliation",
            )
            .bind(service)
            .bind(node)
            .bind(jid)
            .bind(affiliation)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        }
        tx.commit().await.map_err(backend)
    }

    async fn affiliations_of(
        &self,
        service: &str,
        jid: &str,
    ) -> StorageResult<Vec<(String, String)>> {
        let rows = sqlx::query(
            "SELECT node, affiliation FROM pubsub_affiliations
             WHERE service = $1 AND jid = $2 ORDER BY node",
        )
        .bind(service)
        .bind(jid)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows
            .iter()
            .map(|r| (r.get("node"), r.get("affiliation")))
            .collect())
    }

    async fn remove_user(&self, jid: &BareJid) -> StorageResult<()> {
        let bare = jid.as_str();
        // The account's full JIDs `bare/…` are the range [bare + "/",
        // bare + "0") in byte order ('0' follows '/'): compared, not
        // matched with LIKE, where `%` and `_` of a JID would be wildcards.
        let (from, to) = (format!("{bare}/"), format!("{bare}0"));
        let mut tx = self.begin_write().await.map_err(backend)?;
        // The PEP service: its node rows first (the lock order of every
        // writer of a node), then the nodes' rows.
        for sql in [
            "DELETE FROM pubsub_nodes WHERE service = $1",
            "DELETE FROM pubsub_items WHERE service = $1",
            "DELETE FROM pubsub_subscriptions WHERE service = $1",
            "DELETE FROM pubsub_affiliations WHERE service = $1",
        ] {
            sqlx::query(sql)
                .bind(bare)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
        }
        // What the account holds on other services (ranges of the by-jid
        // indexes).
        for sql in [
            "DELETE FROM pubsub_subscriptions WHERE jid = $1 OR (jid >= $2 AND jid < $3)",
            "DELETE FROM pubsub_affiliations WHERE jid = $1 OR (jid >= $2 AND jid < $3)",
        ] {
            sqlx::query(sql)
                .bind(bare)
                .bind(from.as_str())
                .bind(to.as_str())
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
        }
        tx.commit().await.map_err(backend)
    }
}
