//! SQLite's inbox writes: an append-only log, merged into the table in key
//! order, in large runs.
//!
//! # Why
//!
//! Every archived message changes two inbox rows (the sender's and the
//! recipient's conversation), and with random partners those rows are at
//! random places in a table of millions: written in place, each batch of
//! the write-behind queue dirtied almost one table page per update, which
//! the commit wrote to the WAL and the checkpoint copied back. The cost
//! per message grew with the number of conversations — the largest part of
//! the growth from an empty archive to a 10-million-message one (issue 9;
//! `docs/benchmarks.md`, 2026-11-27).
//!
//! # How
//!
//! - A batch of updates is *appended* to `inbox_log` (rowid order: a few
//!   pages at the end of a small table) and committed: that is when it is
//!   durable, as before (`docs/durability.md`). Then each update is added,
//!   in order, to its conversation's list in [`Memtable`]'s active set.
//! - A background task merges when the active set holds
//!   [`crate::OpenOptions::inbox_merge_rows`] updates or its oldest is
//!   [`crate::OpenOptions::inbox_merge_secs`] old: the set is frozen, and
//!   its conversations are written in key order, [`MERGE_CHUNK`] per
//!   transaction (a page is written once per merge however many of its
//!   rows change; other writers wait for one chunk at most). A
//!   conversation's updates are applied one after the other ("rounds":
//!   the k-th update of every conversation of the chunk in one pass), so
//!   the upserts' rules see exactly the sequence the queue wrote. Each
//!   chunk's transaction also records, in `inbox_merge`, how far the merge
//!   got (log rows up to `seq_upto` for keys up to `key_upto` are in the
//!   table) and bumps `gen`. A last transaction deletes the merged log
//!   rows.
//! - Another process on the same file (the command-line tool) merges the
//!   log when it opens the database, as recovery. Its merges bump `gen`
//!   too: a reader that sees `gen` moved while this process was not
//!   merging takes the new value over (`Memtable::moved_by_us`). Updates
//!   the other process merged from this one's log are then applied again
//!   from memory: an extra count for a conversation can result, only when
//!   the tool opens the database while the server is writing.
//! - Reads take the owner's pending updates (frozen ones of conversations
//!   not merged yet, then active ones), read the table's rows and `gen` in
//!   one read transaction, and apply the updates with
//!   [`apply_inbox_update`], the upserts' own rules. If `gen` moved since
//!   the updates were taken (a chunk committed in between), they read
//!   again: nothing is applied twice.
//! - Recovery: opening the database first deletes the log rows an
//!   interrupted merge had written (`inbox_merge`), then loads the rest
//!   into the active set and merges it like any other. Closing merges
//!   everything. A merge that fails keeps its frozen set, and the next one
//!   resumes it where it stopped.
//!
//! Memory: a merge starts at `inbox_merge_rows` pending updates; when
//! updates come faster than merges write them, the writer itself waits
//! for a merge at twice that (the inbox queue fills, and write-behind
//! back-pressure slows the senders). So at most 2 × `inbox_merge_rows`
//! updates are active and as many frozen: ~100 bytes each, ~80 MB with
//! the default 200,000 (`docs/memory.md`). A cap at 1.5 × was reached at
//! 6,000 msg/s on a 10-million-message archive while the machine was busy
//! with a build (a merge's chunks wait behind the archive's batches).
//!
//! [`apply_inbox_update`]: starling_core::storage::apply_inbox_update

use starling_core::storage::{ArchiveId, InboxUpdate, UnreadChange};
use starling_proto::BareJid;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Conversations per merge transaction. Each chunk waits its turn on the
/// one write connection behind the archive batches, so few large chunks
/// finish a merge sooner than many small ones (a 10-million-message
/// archive's 4-million-conversation inbox: ~5,500 pages per chunk).
pub(crate) const MERGE_CHUNK: usize = 20_000;

/// A conversation: owner's domain, owner's username and remote bare JID
/// in one allocation, NUL-separated (no JID holds a NUL), so that keys
/// order as SQLite orders the table's primary key (bytewise, component
/// by component: NUL sorts first).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Key(Box<str>);

impl Key {
    pub(crate) fn new(domain: &str, user: &str, remote: &str) -> Key {
        Key(format!("{domain}\0{user}\0{remote}").into_boxed_str())
    }

    /// (domain, username, remote).
    pub(crate) fn parts(&self) -> (&str, &str, &str) {
        let mut it = self.0.splitn(3, '\0');
        let d = it.next().unwrap_or("");
        let u = it.next().unwrap_or("");
        (d, u, it.next().unwrap_or(""))
    }
}

/// One pending update of a conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Op {
    pub last: Option<i64>,
    pub unread: UnreadChange,
    pub shared: bool,
}

/// The update `op` of conversation `key`.
pub(crate) fn update(key: &Key, op: &Op) -> Option<InboxUpdate> {
    let (domain, user, remote) = key.parts();
    let owner = BareJid::new(&format!("{user}@{domain}")).ok()?;
    Some(InboxUpdate {
        owner,
        remote: remote.to_owned(),
        last: op.last.map(ArchiveId),
        unread: op.unread,
        shared: op.shared,
    })
}

type Set = BTreeMap<Key, Vec<Op>>;

/// A set being merged.
#[derive(Clone)]
pub(crate) struct Frozen {
    pub set: Arc<Set>,
    /// The log's highest rowid the set covers.
    pub seq: i64,
    /// The last conversation whose updates are committed to the table.
    pub merged_upto: Option<Key>,
}

/// Updates committed to the log and not yet merged into the table.
#[derive(Default)]
pub(crate) struct Memtable {
    state: Mutex<State>,
    /// Held while a batch is appended and folded, and while the active set
    /// is frozen: the frozen set and the log rows a merge deletes agree.
    pub append: tokio::sync::Mutex<()>,
    /// Held for a whole merge (and by removals, which must not race one).
    pub merge: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    active: Set,
    active_ops: usize,
    /// The log's highest rowid folded into `active`.
    active_seq: i64,
    /// When the oldest update in `active` was folded.
    active_since: Option<Instant>,
    frozen: Option<Frozen>,
    /// Merge chunks committed, as `inbox_merge.gen` counts them.
    gen: i64,
}

fn key(u: &InboxUpdate) -> Key {
    let (domain, user) = crate::split(&u.owner);
    Key::new(domain, user, &u.remote)
}

impl Memtable {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The database's merge generation, read at open.
    pub(crate) fn set_gen(&self, gen: i64) {
        self.lock().gen = gen;
    }

    /// Adds a batch whose log rows end at `seq` (call with `append` held,
    /// after the commit).
    pub(crate) fn fold(&self, updates: &[InboxUpdate], seq: i64) {
        let mut s = self.lock();
        for u in updates {
            let op = Op {
                last: u.last.map(|id| id.0),
                unread: u.unread,
                shared: u.shared,
            };
            // Most conversations get one update between merges: no spare
            // capacity for them.
            s.active
                .entry(key(u))
                .and_modify(|ops| ops.push(op))
                .or_insert_with(|| vec![op]);
        }
        s.active_ops += updates.len();
        s.active_seq = s.active_seq.max(seq);
        if s.active_since.is_none() && s.active_ops > 0 {
            s.active_since = Some(Instant::now());
        }
    }

    /// Pending updates, and how long the oldest has waited.
    pub(crate) fn load(&self) -> (usize, Option<std::time::Duration>) {
        let s = self.lock();
        (s.active_ops, s.active_since.map(|t| t.elapsed()))
    }

    /// The set to merge: the frozen one a failed merge left, or the
    /// active set, frozen now (call with `append` and `merge` held).
    pub(crate) fn freeze(&self) -> Option<Frozen> {
        let mut s = self.lock();
        if let Some(f) = &s.frozen {
            return Some(f.clone());
        }
        if s.active.is_empty() {
            return None;
        }
        let frozen = Frozen {
            set: Arc::new(std::mem::take(&mut s.active)),
            seq: s.active_seq,
            merged_upto: None,
        };
        s.active_ops = 0;
        s.active_since = None;
        s.frozen = Some(frozen.clone());
        Some(frozen)
    }

    /// A merge chunk ending at `upto` is committed; the database's `gen`
    /// is now `gen`.
    pub(crate) fn chunk_committed(&self, upto: Key, gen: i64) {
        let mut s = self.lock();
        if let Some(f) = &mut s.frozen {
            f.merged_upto = Some(upto);
        }
        s.gen = gen;
    }

    /// A reader found the database's `gen` at `db_gen`, not at the `seen`
    /// it took with the updates: true if that may be one of this
    /// process's merge chunks (read again); false if only another process
    /// on the same file (the command-line tool) can have merged, in which
    /// case the generation is taken over.
    pub(crate) fn moved_by_us(&self, seen: i64, db_gen: i64) -> bool {
        let mut s = self.lock();
        if s.frozen.is_some() || s.gen != seen {
            return true;
        }
        s.gen = db_gen;
        false
    }

    /// The frozen set is all in the table and its log rows are gone.
    pub(crate) fn thaw(&self) {
        self.lock().frozen = None;
    }

    /// `owner`'s pending updates per remote, in order, and the merge
    /// generation they go with.
    pub(crate) fn of_owner(&self, domain: &str, user: &str) -> (Vec<(String, Vec<Op>)>, i64) {
        let s = self.lock();
        let lo = Key::new(domain, user, "");
        let mut out: BTreeMap<String, Vec<Op>> = BTreeMap::new();
        let mut collect = |set: &Set, after: Option<&Key>| {
            for (k, ops) in set.range(lo.clone()..) {
                let (d, u, r) = k.parts();
                if d != domain || u != user {
                    break;
                }
                if after.is_some_and(|a| k <= a) {
                    continue;
                }
                out.entry(r.to_owned()).or_default().extend(ops);
            }
        };
        if let Some(f) = &s.frozen {
            collect(&f.set, f.merged_upto.as_ref());
        }
        collect(&s.active, None);
        (out.into_iter().collect(), s.gen)
    }

    /// Drops `owner`'s pending updates (of one conversation, or all).
    /// Call with `merge` and `append` held and no frozen set.
    pub(crate) fn forget(&self, domain: &str, user: &str, remote: Option<&str>) {
        let mut s = self.lock();
        let mut dropped = 0;
        s.active.retain(|k, ops| {
            let (d, u, r) = k.parts();
            let gone = d == domain && u == user && remote.is_none_or(|x| x == r);
            if gone {
                dropped += ops.len();
            }
            !gone
        });
        s.active_ops -= dropped;
    }

    /// Whether a merge left a frozen set behind.
    pub(crate) fn has_frozen(&self) -> bool {
        self.lock().frozen.is_some()
    }
}

/// The rounds of a chunk: round k holds the k-th update of every
/// conversation that has one, so each round touches a conversation once
/// and applying the rounds in order applies every conversation's updates
/// in order.
pub(crate) fn rounds(chunk: &[(&Key, &Vec<Op>)]) -> Vec<Vec<InboxUpdate>> {
    let depth = chunk.iter().map(|(_, ops)| ops.len()).max().unwrap_or(0);
    (0..depth)
        .map(|k| {
            chunk
                .iter()
                .filter_map(|(key, ops)| ops.get(k).and_then(|op| update(key, op)))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(owner: &str, remote: &str, last: Option<i64>, unread: UnreadChange) -> InboxUpdate {
        InboxUpdate {
            owner: BareJid::new(owner).unwrap(),
            remote: remote.into(),
            last: last.map(ArchiveId),
            unread,
            shared: false,
        }
    }

    #[test]
    fn pending_updates_keep_their_order_across_batches_and_merges() {
        use UnreadChange::*;
        let m = Memtable::default();
        m.fold(&[up("a@x", "b@x", Some(1), Add(1))], 1);
        m.fold(&[up("a@x", "c@x", Some(2), Add(1))], 2);
        let f = m.freeze().unwrap();
        assert_eq!(f.seq, 2);
        m.fold(
            &[
                up("a@x", "b@x", Some(3), Add(1)),
                up("aa@x", "b@x", Some(3), Add(1)),
            ],
            4,
        );
        let (got, gen) = m.of_owner("x", "a");
        assert_eq!(gen, 0);
        let lasts: Vec<(&str, Vec<Option<i64>>)> = got
            .iter()
            .map(|(r, ops)| (r.as_str(), ops.iter().map(|o| o.last).collect()))
            .collect();
        assert_eq!(
            lasts,
            vec![("b@x", vec![Some(1), Some(3)]), ("c@x", vec![Some(2)])]
        );
        // Once the chunk holding a@x/b@x is in the table, reads take only
        // the updates that came after the freeze.
        m.chunk_committed(Key::new("x", "a", "b@x"), 1);
        let (got, gen) = m.of_owner("x", "a");
        assert_eq!(gen, 1);
        assert_eq!(got[0].1.len(), 1);
        assert_eq!(got[1].0, "c@x");
        // A failed merge's set is merged again before anything newer.
        assert_eq!(m.freeze().unwrap().seq, 2);
        m.thaw();
        assert_eq!(m.load().0, 2);
        assert_eq!(m.freeze().unwrap().seq, 4);
        m.thaw();
        m.fold(&[up("a@x", "b@x", Some(5), Add(1))], 5);
        m.fold(&[up("a@x", "c@x", Some(6), Add(1))], 6);
        m.forget("x", "a", Some("b@x"));
        assert_eq!(m.load().0, 1);
        m.forget("x", "a", None);
        assert_eq!(m.load().0, 0);
    }

    /// Keys order like SQLite's (domain, username, remote) primary key.
    #[test]
    fn keys_order_component_by_component() {
        let k = Key::new;
        assert!(k("x", "a", "z@x") < k("x", "ab", "a@x"));
        assert!(k("x", "ab", "a@x") < k("xy", "a", "a@x"));
        assert!(k("x", "a", "b@x") < k("x", "a", "b@x/r"));
        assert_eq!(k("x", "a", "b@x").parts(), ("x", "a", "b@x"));
    }

    #[test]
    fn rounds_apply_each_conversations_updates_in_order() {
        use UnreadChange::*;
        let a = Key::new("x", "a", "b@x");
        let b = Key::new("x", "a", "c@x");
        let op = |last, unread| Op {
            last: Some(last),
            unread,
            shared: false,
        };
        let ops_a = vec![op(1, Add(1)), op(2, Set(0)), op(3, Add(1))];
        let ops_b = vec![op(4, Add(1))];
        let r = rounds(&[(&a, &ops_a), (&b, &ops_b)]);
        let shape: Vec<Vec<(String, i64)>> = r
            .iter()
            .map(|round| {
                round
                    .iter()
                    .map(|u| (u.remote.clone(), u.last.unwrap().0))
                    .collect()
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                vec![("b@x".into(), 1), ("c@x".into(), 4)],
                vec![("b@x".into(), 2)],
                vec![("b@x".into(), 3)],
            ]
        );
    }
}
