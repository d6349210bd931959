//! The SQLite backend: one database file, WAL journal, `synchronous=NORMAL`
//! (durable across process crashes; a power loss may drop the last
//! transactions), foreign keys on, a small connection pool (SQLite admits one
//! writer at a time; readers proceed in parallel under WAL).

mod dialect;
mod inbox_log;
/// The stores written once for both engines; see [`crate::dialect`].
#[path = "../shared/mod.rs"]
#[allow(
    clippy::duplicate_mod,
    reason = "compiled once per backend on purpose, see crate::dialect"
)]
mod shared;

use crate::migrate;
use crate::{now_secs, OpenError};
use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::SqlitePool;
use starling_core::storage::{SchemaStep, StorageBackend};
use std::path::Path;
use std::time::Duration;

/// This backend, for the shared stores (`shared/`).
type Store = SqliteStorage;

/// The SQL of each schema step ([`crate::migrate`]).
const MIGRATIONS: migrate::Scripts = [
    include_str!("0001_accounts.sql"),
    include_str!("0002_im.sql"),
    include_str!("0003_offline.sql"),
    include_str!("0004_archive.sql"),
    include_str!("0005_inbox_unindexed.sql"),
    include_str!("0006_fast_tokens.sql"),
    include_str!("0007_archive_buckets.sql"),
    include_str!("0009_inbox_groups.sql"),
    include_str!("0011_pubsub.sql"),
    include_str!("0012_admin.sql"),
    include_str!("0013_domains.sql"),
    include_str!("0014_inbox_log.sql"),
    include_str!("0015_archive_owner_buckets.sql"),
    include_str!("0016_account_changes.sql"),
];

/// The SQLite backend.
#[derive(Clone)]
pub struct SqliteStorage {
    /// Connections for reads.
    pub(crate) pool: SqlitePool,
    /// The one connection every write goes through, first come first
    /// served (sqlx's pool queue is fair): a one-row write waits for the
    /// writes that asked before it, never for SQLite's busy polling
    /// (growing sleeps up to 100 ms, which a one-row write could lose to
    /// several large batches in a row). SQLite admits one writer at a time
    /// anyway; with a connection of its own, the pages
    /// writes dirty are cached once, not once per pooled connection that
    /// happened to write (in WAL mode a connection also discards its whole
    /// page cache when another connection has committed since its last
    /// transaction). Measured: RssAnon after a minute of archive load
    /// 263–319 MB → 93–98 MB (docs/memory.md, docs/benchmarks.md
    /// 2026-11-25 16:03).
    pub(crate) writer: SqlitePool,
    target: String,
    /// When to open the next archive bucket ([`crate::buckets`]).
    pub(crate) buckets: std::sync::Arc<crate::buckets::BucketWriter>,
    /// The background checkpointer (see [`SqliteStorage::open`]) and the
    /// inbox log's merger.
    tasks: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    /// Inbox changes committed to the log, not yet merged into the table.
    pub(crate) inbox: std::sync::Arc<inbox_log::Memtable>,
    /// When the inbox log is merged.
    pub(crate) inbox_options: InboxLogOptions,
}

/// When the inbox log is merged ([`crate::OpenOptions`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct InboxLogOptions {
    pub merge_rows: usize,
    pub merge_secs: u64,
    pub merge_inline: bool,
}

impl SqliteStorage {
    /// Opens (creating if needed) the database at `path` and migrates it.
    pub async fn open(path: &Path, pool_size: u32) -> Result<Self, OpenError> {
        Self::open_with(path, pool_size, &crate::OpenOptions::default()).await
    }

    /// [`SqliteStorage::open`] with non-default [`crate::OpenOptions`].
    pub async fn open_with(
        path: &Path,
        pool_size: u32,
        options: &crate::OpenOptions,
    ) -> Result<Self, OpenError> {
        let target = format!("sqlite:{}", path.display());
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                // Surface a clear error below if this fails.
                let _ = crate::fsperm::create_private_dir_all(dir);
            }
        }
        // The database holds password keys: created 0600 whatever the
        // umask. SQLite gives its -wal and -shm files the database's mode.
        let _ = crate::fsperm::create_private_file(path);
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10))
            // SQLite's default page cache is 2 MiB per connection: archive
            // and inbox writes then read index pages back from the OS with
            // a pread and a copy each. 32 MiB per connection, reads through
            // mmap, and checkpoints every ~16 MiB of WAL instead of 4 MiB
            // (fewer fsyncs) keep the batch writer CPU-bound rather than
            // syscall-bound.
            .pragma("cache_size", "-32768")
            .pragma("mmap_size", "1073741824")
            // No checkpoint inside a committing transaction: a checkpoint
            // copies the WAL into the database and fsyncs it, which made
            // every archive batch wait for it (batch time grew with the
            // database). A background task checkpoints instead (below).
            .pragma("wal_autocheckpoint", "0")
            .pragma("temp_store", "memory");
        let connect_err = |source| OpenError::Connect {
            target: target.clone(),
            source,
        };
        let pool = SqlitePoolOptions::new()
            .max_connections(pool_size.max(1))
            .connect_with(opts.clone())
            .await
            .map_err(connect_err)?;
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            // Never closed for idleness or age: its page cache is the point.
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(opts)
            .await
            .map_err(connect_err)?;
        let checkpointer = tokio::spawn(checkpoint_task(pool.clone()));
        let db = SqliteStorage {
            pool,
            writer,
            buckets: std::sync::Arc::new(crate::buckets::BucketWriter::new(options)),
            target,
            tasks: std::sync::Arc::new(std::sync::Mutex::new(vec![checkpointer])),
            inbox: Default::default(),
            inbox_options: InboxLogOptions {
                merge_rows: options.inbox_merge_rows.max(1),
                merge_secs: options.inbox_merge_secs,
                merge_inline: options.inbox_merge_inline,
            },
        };
        db.migrate(&options.schema).await?;
        // What a crash left in the inbox log goes into the table first.
        db.recover_inbox_log()
            .await
            .map_err(|e| OpenError::Recovery {
                target: db.target.clone(),
                what: "inbox log",
                message: e.to_string(),
            })?;
        let merger = tokio::spawn(inbox_merge_task(db.clone()));
        db.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(merger);
        Ok(db)
    }

    async fn migrate(&self, extra: &[SchemaStep]) -> Result<(), OpenError> {
        let conn_err = |source| OpenError::Connect {
            target: self.target.clone(),
            source,
        };
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS starling_schema (
                version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)",
        )
        .execute(&self.writer)
        .await
        .map_err(conn_err)?;
        let applied: std::collections::HashSet<i64> =
            sqlx::query_scalar("SELECT version FROM starling_schema")
                .fetch_all(&self.pool)
                .await
                .map_err(conn_err)?
                .into_iter()
                .collect();
        let plan = migrate::plan(&MIGRATIONS, extra, migrate::Engine::Sqlite)?;
        for m in migrate::pending(plan, &applied)? {
            if !applied.is_empty() {
                // An existing database: a step may rebuild an index over
                // the whole archive; say so before the wait.
                tracing::info!(version = m.version, name = m.name, db = %self.target, "applying schema migration (minutes on a large archive)");
            }
            let err = |source| OpenError::Migration {
                version: m.version,
                name: m.name,
                source,
            };
            let mut tx = self.writer.begin().await.map_err(err)?;
            sqlx::raw_sql(m.sql).execute(&mut *tx).await.map_err(err)?;
            sqlx::query("INSERT INTO starling_schema (version, name, applied_at) VALUES (?, ?, ?)")
                .bind(m.version)
                .bind(m.name)
                .bind(now_secs())
                .execute(&mut *tx)
                .await
                .map_err(err)?;
            tx.commit().await.map_err(err)?;
            tracing::info!(version = m.version, name = m.name, db = %self.target, "applied schema migration");
        }
        Ok(())
    }
}

/// Checkpoints the WAL every second from a connection of its own, so
/// writers never pay for it. PASSIVE runs beside readers and the writer;
/// when the WAL has grown past 256 MiB, a RESTART checkpoint waits for
/// readers so the WAL starts over from its beginning (bounded disk use).
async fn checkpoint_task(pool: SqlitePool) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if pool.is_closed() {
            return;
        }
        let started = std::time::Instant::now();
        match sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_one(&pool)
            .await
        {
            Ok(row) => {
                use sqlx::Row;
                let (wal_pages, done): (i64, i64) = (row.get(1), row.get(2));
                tracing::trace!(
                    wal_pages,
                    checkpointed = done,
                    millis = started.elapsed().as_millis() as u64,
                    "sqlite checkpoint"
                );
                if wal_pages > 65_536 && done == wal_pages {
                    let _ = sqlx::query("PRAGMA wal_checkpoint(RESTART)")
                        .execute(&pool)
                        .await;
                }
            }
            Err(e) => tracing::debug!(error = %e, "sqlite checkpoint failed"),
        }
    }
}

/// Merges the inbox log into the table when enough conversations are
/// pending or the oldest change has waited long enough (`inbox_log.rs`).
async fn inbox_merge_task(db: SqliteStorage) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if db.writer.is_closed() {
            return;
        }
        let (pending, age) = db.inbox.load();
        let due = pending >= db.inbox_options.merge_rows
            || age.is_some_and(|a| a.as_secs() >= db.inbox_options.merge_secs);
        if !due {
            continue;
        }
        let started = std::time::Instant::now();
        match db.merge_inbox().await {
            Ok(()) => tracing::debug!(
                conversations = pending,
                millis = started.elapsed().as_millis() as u64,
                "inbox log merged"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                conversations = pending,
                "merging the inbox log failed; retrying at the next tick (reads still see every change)"
            ),
        }
    }
}

#[async_trait]
impl StorageBackend for SqliteStorage {
    async fn close(&self) {
        // Wait for a merge under way, stop the background tasks, and merge
        // what is left: a cleanly closed database has an empty inbox log.
        {
            let _merge = self.inbox.merge.lock().await;
            for t in self
                .tasks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .drain(..)
            {
                t.abort();
            }
        }
        if let Err(e) = self.merge_inbox().await {
            tracing::warn!(error = %e, "merging the inbox log at close failed; the next start merges it");
        }
        // A last full checkpoint leaves a small WAL behind.
        self.writer.close().await;
        let _ = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&self.pool)
            .await;
        self.pool.close().await;
    }

    fn describe(&self) -> String {
        self.target.clone()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use starling_proto::BareJid;

    /// Writes have a connection of their own: a reader holding every
    /// pooled connection (a long page of archive results, a slow client
    /// of the CLI) does not stall them, and readers see what they wrote.
    #[tokio::test]
    async fn writes_go_through_their_own_connection() {
        let dir =
            std::env::temp_dir().join(format!("starling-writer-{}", starling_proto::random_id(12)));
        let db = SqliteStorage::open(&dir.join("db.sqlite"), 1)
            .await
            .unwrap();
        let storage = db.clone().into_storage();
        let alice: BareJid = "alice@localhost".parse().unwrap();
        let mut held = db.pool.acquire().await.unwrap();
        sqlx::query("BEGIN").execute(&mut *held).await.unwrap();
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM user_data")
            .fetch_one(&mut *held)
            .await
            .unwrap();
        assert_eq!(n, 0);
        // With writes on the pool, this waited for the held connection
        // (sqlx's 30 s acquire timeout).
        tokio::time::timeout(
            Duration::from_secs(5),
            storage
                .user_data
                .set(&alice, "private", "storage:bookmarks", "<x/>"),
        )
        .await
        .expect("the write does not wait for the pool")
        .unwrap();
        sqlx::query("COMMIT").execute(&mut *held).await.unwrap();
        drop(held);
        let got = storage
            .user_data
            .get(&alice, "private", "storage:bookmarks")
            .await
            .unwrap();
        assert_eq!(got.as_deref(), Some("<x/>"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
