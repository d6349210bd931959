//! Message archive (XEP-0313) and inbox (XEP-0430) storage.
//!
//! Archive ids are 63-bit integers that grow with time: the archiving
//! node's clock in microseconds shifted left by 8 bits, plus the node id
//! (see [`ArchiveId`]). They are unique across a deployment whose nodes have
//! distinct node ids, and a time range maps to an id range, so the backends
//! need no timestamp column or index: `(owner, id)` serves both.

use super::StorageResult;
use async_trait::async_trait;
use starling_proto::BareJid;

/// A time-ordered archive id (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ArchiveId(pub i64);

const ID_ALPHABET: &[u8; 32] = b"0123456789abcdefghijklmnopqrstuv";
/// Length of an encoded id: 63 bits in base 32.
const ID_LEN: usize = 13;

impl ArchiveId {
    /// The id for microsecond `micros` on node `node`.
    pub fn from_parts(micros: i64, node: u8) -> ArchiveId {
        ArchiveId((micros << 8) | i64::from(node))
    }

    /// The smallest id at or after `micros`.
    pub fn lower_bound(micros: i64) -> ArchiveId {
        ArchiveId(micros.max(0).saturating_mul(256))
    }

    /// The largest id at or before `micros`.
    pub fn upper_bound(micros: i64) -> ArchiveId {
        ArchiveId(micros.max(0).saturating_mul(256).saturating_add(255))
    }

    /// When the message was archived, in microseconds since the Unix epoch.
    pub fn micros(self) -> i64 {
        self.0 >> 8
    }

    /// When the message was archived as a XEP-0082 `DateTime` (the
    /// `<delay stamp/>` of archive results).
    pub fn stamp(self) -> String {
        starling_proto::datetime::xep0082_datetime((self.micros() / 1000).max(0) as u128)
    }

    /// The id as clients see it: 13 base-32 digits, zero-padded, so that
    /// string order equals time order.
    pub fn encode(self) -> String {
        let mut v = self.0 as u64;
        let mut out = [b'0'; ID_LEN];
        for slot in out.iter_mut().rev() {
            *slot = ID_ALPHABET[(v & 31) as usize];
            v >>= 5;
        }
        String::from_utf8(out.to_vec()).expect("ascii")
    }

    /// Parses [`ArchiveId::encode`]'s output; anything else is `None`.
    pub fn decode(s: &str) -> Option<ArchiveId> {
        if s.len() != ID_LEN {
            return None;
        }
        let mut v: u64 = 0;
        for b in s.bytes() {
            let d = match b {
                b'0'..=b'9' => b - b'0',
                b'a'..=b'v' => b - b'a' + 10,
                _ => return None,
            };
            v = v.checked_mul(32)? | u64::from(d);
        }
        i64::try_from(v).ok().map(ArchiveId)
    }
}

/// The archive id generator of a node, shared by every module that
/// archives (one-to-one archives, room archives): ids are unique across
/// owners, so two generators on one node could repeat one.
#[derive(Debug)]
pub struct ArchiveIds {
    node: u8,
    last: std::sync::atomic::AtomicI64,
}

impl ArchiveIds {
    /// A generator for node `node` whose ids are all greater than `above`
    /// (the greatest id in storage at start-up).
    pub fn new(node: u8, above: Option<ArchiveId>) -> ArchiveIds {
        ArchiveIds {
            node,
            last: std::sync::atomic::AtomicI64::new(above.map_or(0, |i| i.0)),
        }
    }

    /// A new id: its microsecond part is strictly greater than that of
    /// every id this generator gave before and of the id it was seeded
    /// with, so a clock that steps back (or a restart after one) never
    /// repeats an id; the low byte is always this node's.
    pub fn next(&self) -> ArchiveId {
        use std::sync::atomic::Ordering;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        let mut prev = self.last.load(Ordering::Relaxed);
        loop {
            let micros = now.max((prev >> 8) + 1);
            let next = ArchiveId::from_parts(micros, self.node).0;
            match self
                .last
                .compare_exchange_weak(prev, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return ArchiveId(next),
                Err(p) => prev = p,
            }
        }
    }
}

/// Bit in [`ArchiveRecord::flags`]: an instant message (it has a body);
/// counted as unread by the inbox.
pub const FLAG_BODY: i32 = 1;

/// One archived message, as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveRecord {
    /// Whose archive.
    pub owner: BareJid,
    /// Its id (unique across the deployment).
    pub id: ArchiveId,
    /// The other party's bare JID.
    pub with_bare: String,
    /// The other party's JID as it appeared in the stanza (may be full).
    pub remote: String,
    /// Sent by the owner (true) or received (false).
    pub outgoing: bool,
    /// The sender-chosen id (XEP-0359 origin-id, else the `id` attribute),
    /// used to find the message for retractions (XEP-0424).
    pub origin_id: Option<String>,
    /// [`FLAG_BODY`] and future bits.
    pub flags: i32,
    /// The serialized message.
    pub stanza: String,
}

/// A stored message, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchivedMessage {
    /// Its id.
    pub id: ArchiveId,
    /// The other party's bare JID.
    pub with_bare: String,
    /// Sent by the owner.
    pub outgoing: bool,
    /// See [`ArchiveRecord::flags`].
    pub flags: i32,
    /// The serialized message (or its tombstone).
    pub stanza: String,
}

/// Which conversation partner a query is limited to (XEP-0313 §4.1.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WithFilter {
    /// A bare JID: any of its resources.
    Bare(String),
    /// A full JID: exactly that address.
    Full {
        /// Its bare part.
        bare: String,
        /// The full JID.
        full: String,
    },
}

/// An archive query. Bounds are exclusive ids; the time range is turned
/// into ids by the caller with [`ArchiveId::lower_bound`]/[`ArchiveId::upper_bound`]
/// (inclusive bounds are expressed as exclusive ones ±1).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArchiveQuery {
    /// Conversation partner.
    pub with: Option<WithFilter>,
    /// Only ids greater than this.
    pub after: Option<ArchiveId>,
    /// Only ids smaller than this.
    pub before: Option<ArchiveId>,
    /// Only these ids (empty: no restriction).
    pub ids: Vec<ArchiveId>,
    /// At most this many messages.
    pub limit: u32,
    /// Take the *last* `limit` matching messages (RSM `<before/>`); otherwise
    /// the first.
    pub from_end: bool,
}

/// A page of results.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArchivePage {
    /// Matching messages in chronological order.
    pub messages: Vec<ArchivedMessage>,
    /// No further matching message exists in the paging direction.
    pub complete: bool,
}

/// The default of an archiving preference (XEP-0441 §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefsDefault {
    /// Archive everything.
    Always,
    /// Archive nothing.
    Never,
    /// Archive messages with roster contacts.
    Roster,
}

impl PrefsDefault {
    /// The protocol value.
    pub fn as_str(self) -> &'static str {
        match self {
            PrefsDefault::Always => "always",
            PrefsDefault::Never => "never",
            PrefsDefault::Roster => "roster",
        }
    }

    /// Parses the protocol value.
    pub fn parse(s: &str) -> Option<PrefsDefault> {
        match s {
            "always" => Some(PrefsDefault::Always),
            "never" => Some(PrefsDefault::Never),
            "roster" => Some(PrefsDefault::Roster),
            _ => None,
        }
    }
}

/// A user's archiving preferences.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchivePrefs {
    /// What to do with JIDs in neither list.
    pub default: PrefsDefault,
    /// JIDs always archived.
    pub always: Vec<String>,
    /// JIDs never archived (wins over `always`).
    pub never: Vec<String>,
}

/// Per-user message archives.
#[async_trait]
pub trait ArchiveStore: Send + Sync + 'static {
    /// Appends records (any owners) in one transaction. Ids are unique; a
    /// record whose id already exists is ignored, so a retried batch does
    /// not duplicate messages.
    async fn append(&self, records: &[ArchiveRecord]) -> StorageResult<()>;
    /// Runs a query on `owner`'s archive.
    async fn query(&self, owner: &BareJid, q: &ArchiveQuery) -> StorageResult<ArchivePage>;
    /// Number of messages matching `q`, ignoring its limit and direction.
    async fn count(&self, owner: &BareJid, q: &ArchiveQuery) -> StorageResult<u64>;
    /// Which of `ids` exist in `owner`'s archive.
    async fn existing(&self, owner: &BareJid, ids: &[ArchiveId]) -> StorageResult<Vec<ArchiveId>>;
    /// The greatest id in any archive (seeds the id generator at start-up).
    async fn max_id(&self) -> StorageResult<Option<ArchiveId>>;
    /// The oldest and newest ids of `owner`'s archive.
    async fn bounds(&self, owner: &BareJid) -> StorageResult<Option<(ArchiveId, ArchiveId)>>;
    /// The newest message of `owner` with `with_bare` whose origin id is
    /// `origin_id` and direction `outgoing`.
    async fn find_by_origin(
        &self,
        owner: &BareJid,
        with_bare: &str,
        origin_id: &str,
        outgoing: bool,
    ) -> StorageResult<Option<ArchivedMessage>>;
    /// Replaces a message's stanza (retraction tombstones). Returns false if
    /// no such message.
    async fn replace(&self, owner: &BareJid, id: ArchiveId, stanza: &str) -> StorageResult<bool>;
    /// Number of received instant messages ([`FLAG_BODY`]) from `with_bare`
    /// with ids greater than `after` (inbox unread counts).
    async fn count_unread_after(
        &self,
        owner: &BareJid,
        with_bare: &str,
        after: ArchiveId,
    ) -> StorageResult<u64>;
    /// Deletes messages of `domain`'s accounts older than `before`
    /// (retention). Returns how many were deleted.
    async fn purge_domain_before(&self, domain: &str, before: ArchiveId) -> StorageResult<u64>;
    /// Deletes `owner`'s messages older than `before` (all if `None`).
    async fn purge_user(&self, owner: &BareJid, before: Option<ArchiveId>) -> StorageResult<u64>;
    /// The user's preferences, if set.
    async fn prefs(&self, owner: &BareJid) -> StorageResult<Option<ArchivePrefs>>;
    /// Stores the user's preferences.
    async fn set_prefs(&self, owner: &BareJid, prefs: &ArchivePrefs) -> StorageResult<()>;
    /// Deletes everything of `owner` (account deletion).
    async fn remove_user(&self, owner: &BareJid) -> StorageResult<()>;
}

/// How an inbox update changes the unread count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnreadChange {
    /// Leave it.
    Keep,
    /// Add this many.
    Add(u32),
    /// Set it to this value.
    Set(u32),
}

impl UnreadChange {
    /// The effect of `self` followed by `next`.
    pub fn then(self, next: UnreadChange) -> UnreadChange {
        match (self, next) {
            (s, UnreadChange::Keep) => s,
            (_, UnreadChange::Set(n)) => UnreadChange::Set(n),
            (UnreadChange::Keep, a) => a,
            (UnreadChange::Add(a), UnreadChange::Add(b)) => UnreadChange::Add(a.saturating_add(b)),
            (UnreadChange::Set(a), UnreadChange::Add(b)) => UnreadChange::Set(a.saturating_add(b)),
        }
    }
}

/// One change to a conversation of an inbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxUpdate {
    /// Whose inbox.
    pub owner: BareJid,
    /// The conversation partner's bare JID.
    pub remote: String,
    /// A new last message: its id in the owner's archive (or, for a
    /// `shared` conversation, in the remote's).
    pub last: Option<ArchiveId>,
    /// The unread count change.
    pub unread: UnreadChange,
    /// The conversation's messages are in the remote's archive: a group
    /// chat room's, which every member's inbox row points into.
    pub shared: bool,
}

/// Merges updates per conversation, keeping the order in which
/// conversations first appear: the newest `last` wins and unread changes
/// compose in order. Applying the result is equivalent to applying
/// `updates` one by one, and each conversation appears once, so backends
/// can group the result into multi-row statements.
pub fn coalesce_inbox_updates(updates: &[InboxUpdate]) -> Vec<InboxUpdate> {
    let mut index: std::collections::HashMap<(&str, &str), usize> =
        std::collections::HashMap::new();
    let mut out: Vec<InboxUpdate> = Vec::with_capacity(updates.len());
    for u in updates {
        match index.get(&(u.owner.as_str(), u.remote.as_str())) {
            Some(&i) => {
                let m = &mut out[i];
                if let Some(last) = u.last {
                    if m.last.is_none_or(|id| id <= last) {
                        m.last = Some(last);
                        m.shared = u.shared;
                    }
                }
                m.unread = m.unread.then(u.unread);
            }
            None => {
                index.insert((u.owner.as_str(), u.remote.as_str()), out.len());
                out.push(u.clone());
            }
        }
    }
    out
}

/// A stored inbox row, as [`apply_inbox_update`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InboxRow {
    /// Archive id of the last message.
    pub last_id: ArchiveId,
    /// Unread messages.
    pub unread: u32,
    /// The conversation's messages are in the remote's archive.
    pub shared: bool,
}

/// What applying `u` to a conversation's row (`None`: no row yet) leaves,
/// with exactly the rules of the backends' upserts: a new last message
/// never moves `last_id` backwards; an `Add` counts only with a message
/// newer than the row's, a `Set` only with one at least as new, so a
/// replayed or late update is harmless; a change without a message
/// creates no row. Backends that keep recent updates outside the table
/// (SQLite's inbox log, `docs/memory.md`) answer reads by applying them
/// to the stored rows with this function.
pub fn apply_inbox_update(row: Option<InboxRow>, u: &InboxUpdate) -> Option<InboxRow> {
    let value = |c: UnreadChange| match c {
        UnreadChange::Keep => 0,
        UnreadChange::Add(n) | UnreadChange::Set(n) => n,
    };
    match (row, u.last) {
        (None, None) => None,
        (None, Some(last)) => Some(InboxRow {
            last_id: last,
            unread: value(u.unread),
            shared: u.shared,
        }),
        (Some(r), None) => Some(InboxRow {
            unread: match u.unread {
                UnreadChange::Keep => r.unread,
                UnreadChange::Add(n) => r.unread.saturating_add(n),
                UnreadChange::Set(n) => n,
            },
            ..r
        }),
        (Some(r), Some(last)) => Some(InboxRow {
            last_id: r.last_id.max(last),
            shared: if last >= r.last_id {
                u.shared
            } else {
                r.shared
            },
            unread: match u.unread {
                UnreadChange::Set(n) if last >= r.last_id => n,
                UnreadChange::Add(n) if last > r.last_id => r.unread.saturating_add(n),
                _ => r.unread,
            },
        }),
    }
}

/// One conversation of an inbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxEntry {
    /// The conversation partner's bare JID.
    pub remote: String,
    /// Archive id of the last message.
    pub last_id: ArchiveId,
    /// The last message as the owner's archive holds it now (a tombstone
    /// after a retraction); `None` if it left the archive (retention).
    pub last_stanza: Option<String>,
    /// Unread messages.
    pub unread: u32,
}

/// Totals of an inbox (XEP-0430 `<fin/>`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboxTotals {
    /// Conversations.
    pub conversations: u64,
    /// Conversations with at least one unread message.
    pub unread_conversations: u64,
    /// Unread messages over all conversations.
    pub unread_messages: u64,
}

/// An inbox listing request: newest conversation first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InboxQuery {
    /// Only conversations whose last id is smaller (the next page).
    pub before: Option<ArchiveId>,
    /// Only conversations whose last id is greater (the previous page).
    pub after: Option<ArchiveId>,
    /// Only conversations with unread messages.
    pub unread_only: bool,
    /// At most this many.
    pub limit: u32,
}

/// Per-user conversation lists. A conversation keeps the archive id of its
/// last message, not a copy: listings join the owner's archive, so rows
/// stay small (cheap to update at every message) and a retraction's
/// tombstone shows without touching the inbox.
#[async_trait]
pub trait InboxStore: Send + Sync + 'static {
    /// Applies updates in order, in one transaction. An update with no
    /// `last` for a conversation that does not exist creates nothing.
    async fn apply(&self, updates: &[InboxUpdate]) -> StorageResult<()>;
    /// Lists conversations, newest last message first.
    async fn list(&self, owner: &BareJid, q: &InboxQuery) -> StorageResult<Vec<InboxEntry>>;
    /// One conversation.
    async fn get(&self, owner: &BareJid, remote: &str) -> StorageResult<Option<InboxEntry>>;
    /// Totals over the whole inbox.
    async fn totals(&self, owner: &BareJid) -> StorageResult<InboxTotals>;
    /// Deletes one conversation. Returns false if it did not exist.
    async fn remove(&self, owner: &BareJid, remote: &str) -> StorageResult<bool>;
    /// Deletes `owner`'s inbox (account deletion).
    async fn remove_user(&self, owner: &BareJid) -> StorageResult<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_encode_in_time_order_and_round_trip() {
        let a = ArchiveId::from_parts(1_700_000_000_000_000, 0);
        let b = ArchiveId::from_parts(1_700_000_000_000_001, 0);
        let c = ArchiveId::from_parts(1_700_000_000_000_001, 7);
        assert!(a.encode() < b.encode() && b.encode() < c.encode());
        for id in [a, b, c, ArchiveId(0), ArchiveId(i64::MAX)] {
            assert_eq!(ArchiveId::decode(&id.encode()), Some(id));
        }
        assert_eq!(c.micros(), 1_700_000_000_000_001);
        assert!(ArchiveId::lower_bound(5) <= ArchiveId::from_parts(5, 0));
        assert!(ArchiveId::upper_bound(5) >= ArchiveId::from_parts(5, 255));
    }

    #[test]
    fn bogus_ids_do_not_decode() {
        for s in [
            "",
            "x",
            "0000000000000z",
            "zzzzzzzzzzzzz",
            "'; drop table",
            "vvvvvvvvvvvvv",
        ] {
            assert_eq!(ArchiveId::decode(s), None, "{s}");
        }
    }

    fn u(owner: &str, remote: &str, last: Option<i64>, unread: UnreadChange) -> InboxUpdate {
        InboxUpdate {
            owner: BareJid::new(owner).unwrap(),
            remote: remote.into(),
            last: last.map(ArchiveId),
            unread,
            shared: false,
        }
    }

    #[test]
    fn inbox_updates_merge_per_conversation_in_order() {
        use UnreadChange::*;
        let merged = coalesce_inbox_updates(&[
            u("a@x", "b@x", Some(1), Add(1)),
            u("a@x", "c@x", Some(2), Add(1)),
            u("a@x", "b@x", Some(3), Add(1)),
            u("b@x", "a@x", Some(3), Set(0)),
            u("a@x", "b@x", None, Set(0)),
            u("a@x", "b@x", Some(4), Add(1)),
        ]);
        assert_eq!(
            merged,
            vec![
                u("a@x", "b@x", Some(4), Set(1)),
                u("a@x", "c@x", Some(2), Add(1)),
                u("b@x", "a@x", Some(3), Set(0)),
            ]
        );
    }

    /// The overlay rules are the upserts' (`crates/storage`'s dialects);
    /// the storage conformance suite checks both agree on every engine.
    #[test]
    fn inbox_updates_apply_like_the_upserts() {
        use UnreadChange::*;
        let row = |last: i64, unread: u32| {
            Some(InboxRow {
                last_id: ArchiveId(last),
                unread,
                shared: false,
            })
        };
        let up = |last: Option<i64>, c| u("a@x", "b@x", last, c);
        // A change without a message creates nothing.
        assert_eq!(apply_inbox_update(None, &up(None, Set(0))), None);
        assert_eq!(apply_inbox_update(None, &up(Some(5), Add(2))), row(5, 2));
        assert_eq!(apply_inbox_update(None, &up(Some(5), Keep)), row(5, 0));
        // Newer message: counts; same message again (a replay): does not.
        assert_eq!(
            apply_inbox_update(row(5, 2), &up(Some(6), Add(1))),
            row(6, 3)
        );
        assert_eq!(
            apply_inbox_update(row(5, 2), &up(Some(5), Add(1))),
            row(5, 2)
        );
        assert_eq!(
            apply_inbox_update(row(5, 2), &up(Some(4), Add(1))),
            row(5, 2)
        );
        // Set needs a message at least as new.
        assert_eq!(
            apply_inbox_update(row(5, 2), &up(Some(5), Set(7))),
            row(5, 7)
        );
        assert_eq!(
            apply_inbox_update(row(5, 2), &up(Some(4), Set(7))),
            row(5, 2)
        );
        // Count-only changes apply to an existing row.
        assert_eq!(apply_inbox_update(row(5, 2), &up(None, Set(0))), row(5, 0));
        assert_eq!(apply_inbox_update(row(5, 2), &up(None, Add(1))), row(5, 3));
        // A merged update applied twice leaves what one application left.
        let merged =
            &coalesce_inbox_updates(&[up(Some(6), Add(1)), up(None, Set(0)), up(Some(7), Add(1))])
                [0];
        let once = apply_inbox_update(row(5, 2), merged);
        assert_eq!(once, row(7, 1));
        assert_eq!(apply_inbox_update(once, merged), once);
    }

    #[test]
    fn unread_changes_compose() {
        use UnreadChange::*;
        assert_eq!(Add(1).then(Add(2)), Add(3));
        assert_eq!(Add(1).then(Set(0)).then(Add(2)), Set(2));
        assert_eq!(Keep.then(Add(1)), Add(1));
        assert_eq!(Set(4).then(Keep), Set(4));
    }
}
