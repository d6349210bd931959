//! The SQL side of archive buckets (why and the rules: [`crate::buckets`]):
//! filing new rows under their bucket, opening the next bucket when the
//! newest is full, and reading the bounds for queries.

use super::{backend, Db, Store};
use crate::buckets::{bucket_of, overlapping, Bucket, BucketWriter};
use sqlx::{Database, Row};
use starling_core::storage::{ArchiveId, ArchiveRecord, StorageResult};
use std::sync::atomic::Ordering;
use std::sync::Arc;

type Conn = <Db as Database>::Connection;

fn bucket(r: &<Db as Database>::Row) -> Bucket {
    Bucket {
        number: r.get(0),
        first_id: r.get(1),
    }
}

/// The bucket of each of `records` (same order), from the bounds as the
/// caller's transaction sees them, and the newest bucket.
pub(crate) async fn assign(
    conn: &mut Conn,
    records: &[ArchiveRecord],
) -> StorageResult<(Vec<i64>, Bucket)> {
    let min = records.iter().map(|r| r.id.0).min().unwrap_or(0);
    // The bucket of the oldest id, and every later one (usually one or two
    // rows of a tiny table).
    let bounds: Vec<Bucket> = sqlx::query(
        "SELECT bucket, first_id FROM archive_buckets
         WHERE first_id > $1
            OR bucket = (SELECT MAX(bucket) FROM archive_buckets WHERE first_id <= $1)
         ORDER BY bucket",
    )
    .bind(min)
    .fetch_all(&mut *conn)
    .await
    .map_err(backend)?
    .iter()
    .map(bucket)
    .collect();
    let Some(&newest) = bounds.last() else {
        // The migration creates bucket 0 at id 0; only a hand-edited
        // table gets here. File everything under 0 rather than fail.
        let zero = Bucket {
            number: 0,
            first_id: 0,
        };
        return Ok((vec![0; records.len()], zero));
    };
    let numbers = records.iter().map(|r| bucket_of(&bounds, r.id.0)).collect();
    Ok((numbers, newest))
}

/// Called after `inserted` rows were written (in the same transaction):
/// when this node has written a bucket's worth since it last looked,
/// counts the newest bucket's rows and, if it is full, opens the next one.
pub(crate) async fn account(
    conn: &mut Conn,
    writer: &BucketWriter,
    newest: Bucket,
    inserted: u64,
) -> StorageResult<()> {
    let seen = writer.since_check.fetch_add(inserted, Ordering::Relaxed) + inserted;
    if seen < writer.rows {
        return Ok(());
    }
    // An index range count: once per bucket's worth of rows.
    let count: i64 = sqlx::query("SELECT COUNT(*) FROM archive WHERE bucket = $1")
        .bind(newest.number)
        .fetch_one(&mut *conn)
        .await
        .map_err(backend)?
        .get(0);
    if (count.max(0) as u64) < writer.rows {
        writer
            .since_check
            .store(count.max(0) as u64, Ordering::Relaxed);
        return Ok(());
    }
    let max_id: Option<i64> = sqlx::query("SELECT MAX(id) FROM archive")
        .fetch_one(&mut *conn)
        .await
        .map_err(backend)?
        .get(0);
    let now = if writer.follow_clock {
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        ArchiveId::upper_bound(micros).0
    } else {
        0
    };
    let start = now.max(max_id.unwrap_or(0)).max(newest.first_id) + (writer.margin_micros << 8);
    sqlx::query(
        "INSERT INTO archive_buckets (bucket, first_id) VALUES ($1, $2)
         ON CONFLICT (bucket) DO NOTHING",
    )
    .bind(newest.number + 1)
    .bind(start)
    .execute(&mut *conn)
    .await
    .map_err(backend)?;
    writer.since_check.store(0, Ordering::Relaxed);
    writer.forget();
    tracing::info!(
        bucket = newest.number + 1,
        previous_rows = count,
        "archive: the newest bucket is full; the next one starts after the newest id"
    );
    Ok(())
}

impl Store {
    /// The buckets, oldest first, that may hold ids `> after` and
    /// `< before`. The bounds (one row per million archived messages) are
    /// read at most every few seconds ([`BucketWriter`]).
    pub(crate) async fn conversation_buckets(
        &self,
        after: Option<ArchiveId>,
        before: Option<ArchiveId>,
    ) -> StorageResult<Vec<i64>> {
        let bounds = match self.buckets.cached() {
            Some(b) => b,
            None => {
                let at = std::time::Instant::now();
                let bounds: Arc<Vec<Bucket>> = Arc::new(
                    sqlx::query("SELECT bucket, first_id FROM archive_buckets ORDER BY bucket")
                        .fetch_all(&self.pool)
                        .await
                        .map_err(backend)?
                        .iter()
                        .map(bucket)
                        .collect(),
                );
                self.buckets.remember(at, bounds.clone());
                bounds
            }
        };
        Ok(overlapping(
            &bounds,
            after.map(|a| a.0),
            before.map(|b| b.0),
        ))
    }
}
