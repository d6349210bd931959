//! Archive buckets: why the by-conversation index leads with one, and the
//! arithmetic on bucket bounds (the SQL is in `shared/buckets.rs`).
//!
//! # Why
//!
//! A `with` query (one conversation's history) needs an index ordered by
//! owner, peer and id. Messages arrive in id order but to random
//! conversations, so each new row used to land at a random place in an
//! index as large as the archive: once that index outgrew the page cache,
//! every archived row dirtied a page of its own, which the commit wrote to
//! the WAL and the checkpoint copied back. The cost per message grew with
//! the archive (measured: server CPU at 6,000 msg/s +77% on a
//! 10-million-message archive compared with an empty one; with buckets
//! +35–45%, the rest being the inbox; `docs/benchmarks.md`, 2026-11-25).
//!
//! The index now starts with a *bucket*: a run of about
//! [`DEFAULT_ROWS`] consecutive archived rows. New rows go to the newest
//! bucket, whose part of the index is bounded, so an insert costs what it
//! cost on an empty archive, whatever the archive's size. Older buckets
//! are never written again (apart from a late row, below).
//!
//! # The rules
//!
//! - Bucket `b` is the id range `[first_id(b), first_id(b + 1))`
//!   (`archive_buckets`; the newest bucket is open-ended). Ids are
//!   time-ordered, so buckets are ordered like their rows, and a query's
//!   id range maps to a run of buckets.
//! - A row's bucket follows from its id and the bounds read in the same
//!   transaction that inserts it, so a late row (an offline message's
//!   archive copy written after a newer batch) goes to the bucket its id
//!   belongs to.
//! - When the newest bucket holds [`DEFAULT_ROWS`] rows, the writer that
//!   notices opens the next one starting [`START_MARGIN_MICROS`] *after*
//!   the newest id in the archive and the current time. No row with an id
//!   that high exists yet, and none will be inserted before the new bound
//!   is committed (ids are taken from the clock when a message is routed,
//!   and inserted after), so no row is ever filed under the wrong bucket,
//!   on one node or on several (clock skew below the margin).
//! - A query with a `with` filter visits its buckets newest first (or
//!   oldest first when paging forwards) in groups of growing size, and
//!   stops as soon as the page is full: a page of an active conversation
//!   costs one index range scan, as before; a page of a contact unheard of
//!   for a long time costs one index probe per bucket (about 20 for a
//!   10-million-message archive).

/// Rows per bucket. Large enough that a rare contact's history costs few
/// probes (one per million archived rows), small enough that the newest
/// bucket's part of the index (~70 MB) is written like a small index.
pub const DEFAULT_ROWS: u64 = 1 << 20;

/// A new bucket starts this long after the newest id in the archive and
/// the current time (see the module documentation).
pub const START_MARGIN_MICROS: i64 = 10_000_000;

/// A bucket: its number and the first id it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bucket {
    pub number: i64,
    pub first_id: i64,
}

/// The bucket of `id`, from `bounds` sorted by `first_id` (the newest
/// bucket whose range starts at or before `id`; the first of `bounds` if
/// none does).
pub(crate) fn bucket_of(bounds: &[Bucket], id: i64) -> i64 {
    let i = bounds.partition_point(|b| b.first_id <= id);
    bounds[i.saturating_sub(1)].number
}

/// The buckets, in order, that may hold ids `> after` and `< before`.
pub(crate) fn overlapping(bounds: &[Bucket], after: Option<i64>, before: Option<i64>) -> Vec<i64> {
    let mut out = Vec::new();
    for (i, b) in bounds.iter().enumerate() {
        // The last id this bucket can hold, inclusive.
        let last = bounds.get(i + 1).map_or(i64::MAX, |n| n.first_id - 1);
        if after.is_some_and(|a| last <= a) {
            continue;
        }
        if before.is_some_and(|x| b.first_id >= x) {
            break;
        }
        out.push(b.number);
    }
    out
}

/// `buckets` cut into groups of 1, 4, 16, 64 … (at most `MAX_GROUP`), in
/// order: a query visits one group per statement and stops when its page
/// is full, so the common case (the newest bucket has enough) costs one
/// statement and a rare contact's history costs a few.
pub(crate) fn groups(buckets: &[i64]) -> Vec<&[i64]> {
    const MAX_GROUP: usize = 256;
    let mut out = Vec::new();
    let mut rest = buckets;
    let mut size = 1;
    while !rest.is_empty() {
        let (g, r) = rest.split_at(size.min(rest.len()));
        out.push(g);
        rest = r;
        size = (size * 4).min(MAX_GROUP);
    }
    out
}

/// How a node decides when the newest bucket is full: it counts the rows
/// it inserted since it last looked, and only then counts the bucket's
/// rows in the database (the other nodes of a cluster write to it too).
#[derive(Debug)]
pub(crate) struct BucketWriter {
    /// Rows per bucket.
    pub rows: u64,
    /// How far after the newest id a new bucket starts.
    pub margin_micros: i64,
    /// The new bucket also starts after the current time (off only in
    /// tests whose ids are not times).
    pub follow_clock: bool,
    /// Rows inserted since the last exact count (starts at `rows`, so the
    /// first batch after start-up counts).
    pub since_check: std::sync::atomic::AtomicU64,
    /// The bounds as last read for a query, and when. A bucket opened
    /// after that read starts at least `margin_micros` after it, so a copy
    /// younger than half the margin cannot miss a bucket that holds rows
    /// (half: room for clock skew between nodes). Tests without a clock
    /// read the table every time.
    cache: std::sync::Mutex<Option<(std::time::Instant, std::sync::Arc<Vec<Bucket>>)>>,
}

impl BucketWriter {
    pub(crate) fn new(options: &crate::OpenOptions) -> Self {
        let rows = options.archive_bucket_rows.max(1);
        BucketWriter {
            rows,
            margin_micros: options.archive_bucket_margin_micros.max(1),
            follow_clock: options.archive_bucket_follow_clock,
            since_check: std::sync::atomic::AtomicU64::new(rows),
            cache: std::sync::Mutex::new(None),
        }
    }

    /// How long a read of the bounds may be reused.
    fn cache_ttl(&self) -> std::time::Duration {
        if self.follow_clock {
            std::time::Duration::from_micros((self.margin_micros / 2).max(0) as u64)
        } else {
            std::time::Duration::ZERO
        }
    }

    /// The cached bounds, if young enough.
    pub(crate) fn cached(&self) -> Option<std::sync::Arc<Vec<Bucket>>> {
        let ttl = self.cache_ttl();
        let guard = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        match &*guard {
            Some((at, b)) if at.elapsed() < ttl => Some(b.clone()),
            _ => None,
        }
    }

    /// Remembers bounds read at `at` (taken before the read).
    pub(crate) fn remember(&self, at: std::time::Instant, bounds: std::sync::Arc<Vec<Bucket>>) {
        if self.cache_ttl().is_zero() {
            return;
        }
        *self.cache.lock().unwrap_or_else(|e| e.into_inner()) = Some((at, bounds));
    }

    /// Drops the cached bounds (this node just opened a bucket).
    pub(crate) fn forget(&self) {
        *self.cache.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds() -> Vec<Bucket> {
        [(0, 0), (1, 100), (2, 200)]
            .map(|(number, first_id)| Bucket { number, first_id })
            .to_vec()
    }

    #[test]
    fn an_id_belongs_to_the_bucket_whose_range_holds_it() {
        let b = bounds();
        assert_eq!(bucket_of(&b, 0), 0);
        assert_eq!(bucket_of(&b, 99), 0);
        assert_eq!(bucket_of(&b, 100), 1);
        assert_eq!(bucket_of(&b, 250), 2);
        // Bounds read from a later bucket on: an older id files under the
        // first of them (the reader always includes the id's own bucket).
        assert_eq!(bucket_of(&b[1..], 50), 1);
    }

    #[test]
    fn a_query_visits_only_the_buckets_of_its_id_range() {
        let b = bounds();
        assert_eq!(overlapping(&b, None, None), vec![0, 1, 2]);
        assert_eq!(overlapping(&b, Some(99), None), vec![1, 2]);
        assert_eq!(overlapping(&b, Some(98), None), vec![0, 1, 2]);
        assert_eq!(overlapping(&b, None, Some(100)), vec![0]);
        assert_eq!(overlapping(&b, None, Some(101)), vec![0, 1]);
        assert_eq!(overlapping(&b, Some(150), Some(160)), vec![1]);
        assert_eq!(overlapping(&b, Some(500), None), vec![2]);
    }

    #[test]
    fn groups_grow_geometrically_and_keep_the_order() {
        let all: Vec<i64> = (0..30).collect();
        let g = groups(&all);
        assert_eq!(
            g.iter().map(|g| g.len()).collect::<Vec<_>>(),
            vec![1, 4, 16, 9]
        );
        assert_eq!(g.concat(), all);
        assert!(groups(&[]).is_empty());
    }
}
