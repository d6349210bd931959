//! Storage latency: every store of a [`Storage`] wrapped so that each call
//! is timed into `starling_storage_latency_seconds{store, op}`.
//!
//! A wrapper forwards each trait method to the backend's store, default
//! methods included (a backend may override them with one statement), and
//! records the call's duration in the histogram of its store and class
//! ([`StorageOp::Read`] or [`StorageOp::Write`], listed per method below).
//! The cost is two clock reads and two atomic additions per call, next to
//! a database round trip. The histograms are resolved once, when the
//! server wraps its storage at start-up ([`Storage::timed`]).
//!
//! Adding a method to one of these traits means adding its line here: the
//! compiler points at this file until it is done. The admin token store is
//! not wrapped (a handful of calls per API request, not on any session's
//! path).

use super::{
    AccountChanges, AccountStore, ArchiveId, ArchivePage, ArchivePrefs, ArchiveQuery,
    ArchiveRecord, ArchiveStore, ArchivedMessage, FastSlot, FastToken, InboxEntry, InboxQuery,
    InboxStore, InboxTotals, InboxUpdate, OfflineMessage, OfflineStore, OfflineStoreError,
    PubsubStore, PubsubSubscription, RosterChange, RosterItem, RosterStore, Storage, StorageError,
    StorageResult, StoredItem, StoredNode, UserDataStore,
};
use crate::metrics::{LatencyHistogram, Metrics, StorageOp};
use starling_proto::sasl::{ScramCredentials, ScramHash};
use starling_proto::BareJid;
use std::sync::Arc;

/// A store whose calls are timed (see [`timed_store!`](crate::timed_store),
/// which implements the store's trait for it).
pub struct Timed<T: ?Sized> {
    /// The store.
    pub inner: Arc<T>,
    /// The histogram of its reads.
    pub read: LatencyHistogram,
    /// The histogram of its writes.
    pub write: LatencyHistogram,
}

impl<T: ?Sized> Timed<T> {
    /// `inner`, timed into `metrics` as `store`.
    pub fn wrap(inner: Arc<T>, metrics: &Metrics, store: &str) -> Arc<Timed<T>> {
        Arc::new(Timed {
            inner,
            read: metrics.storage_latency(store, StorageOp::Read),
            write: metrics.storage_latency(store, StorageOp::Write),
        })
    }
}

impl Storage {
    /// This storage with every store's calls timed into `metrics` (the
    /// admin token store excepted; see the module doc).
    pub fn timed(self, metrics: &Metrics) -> Storage {
        Storage {
            accounts: Timed::wrap(self.accounts.clone(), metrics, "accounts"),
            roster: Timed::wrap(self.roster.clone(), metrics, "roster"),
            user_data: Timed::wrap(self.user_data.clone(), metrics, "user_data"),
            offline: Timed::wrap(self.offline.clone(), metrics, "offline"),
            archive: Timed::wrap(self.archive.clone(), metrics, "archive"),
            inbox: Timed::wrap(self.inbox.clone(), metrics, "inbox"),
            pubsub: Timed::wrap(self.pubsub.clone(), metrics, "pubsub"),
            ..self
        }
    }
}

/// `impl $trait for Timed<dyn $trait>`: each `read fn …;` or `write fn …;`
/// forwards to the inner store and records its duration in that class.
/// A module's own store trait is timed with it too (`modules/muc/store/`).
#[macro_export]
macro_rules! timed_store {
    ($trait:ident { $( $op:ident fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty; )* }) => {
        #[$crate::async_trait]
        impl $trait for $crate::storage::Timed<dyn $trait> {
            $(
                async fn $name(&self $(, $arg: $ty)*) -> $ret {
                    let start = ::std::time::Instant::now();
                    let r = self.inner.$name($($arg),*).await;
                    self.$op.observe(start.elapsed());
                    r
                }
            )*
        }
    };
}

timed_store!(AccountStore {
    write fn create(&self, jid: &BareJid, credentials: &[ScramCredentials]) -> StorageResult<()>;
    write fn create_many(&self, accounts: &[(BareJid, Vec<ScramCredentials>)]) -> StorageResult<u64>;
    read fn exists(&self, jid: &BareJid) -> StorageResult<bool>;
    read fn credentials(&self, jid: &BareJid, hash: ScramHash) -> StorageResult<Option<ScramCredentials>>;
    write fn set_credentials(&self, jid: &BareJid, credentials: &[ScramCredentials]) -> StorageResult<bool>;
    write fn delete(&self, jid: &BareJid) -> StorageResult<bool>;
    read fn list(&self, domain: &str, after: Option<&str>, limit: u32) -> StorageResult<Vec<String>>;
    read fn count(&self, domain: &str) -> StorageResult<u64>;
    write fn set_disabled(&self, jid: &BareJid, disabled: bool) -> StorageResult<bool>;
    read fn is_disabled(&self, jid: &BareJid) -> StorageResult<bool>;
    read fn fast_tokens(&self, jid: &BareJid, agent: &str) -> StorageResult<Vec<FastToken>>;
    write fn put_fast_token(&self, jid: &BareJid, agent: &str, token: &FastToken) -> StorageResult<bool>;
    write fn delete_fast_tokens(&self, jid: &BareJid, agent: &str, slot: Option<FastSlot>) -> StorageResult<()>;
    read fn account_changes(&self, after: i64) -> StorageResult<AccountChanges>;
});

timed_store!(RosterStore {
    read fn get_roster(&self, owner: &BareJid) -> StorageResult<(u64, Vec<RosterItem>)>;
    read fn get_item(&self, owner: &BareJid, contact: &BareJid) -> StorageResult<Option<RosterItem>>;
    read fn items_for_contact(&self, owners: &[BareJid], contact: &BareJid) -> StorageResult<Vec<(BareJid, RosterItem)>>;
    write fn put_item(&self, owner: &BareJid, item: &RosterItem) -> StorageResult<u64>;
    write fn remove_item(&self, owner: &BareJid, contact: &BareJid) -> StorageResult<Option<u64>>;
    read fn changes_since(&self, owner: &BareJid, version: u64) -> StorageResult<Option<(u64, Vec<RosterChange>)>>;
    read fn count(&self, owner: &BareJid) -> StorageResult<u64>;
    read fn pending_requests(&self, owner: &BareJid) -> StorageResult<Vec<(BareJid, String)>>;
    read fn has_pending_request(&self, owner: &BareJid, contact: &BareJid) -> StorageResult<bool>;
    write fn put_pending_request(&self, owner: &BareJid, from: &BareJid, stanza: &str) -> StorageResult<()>;
    write fn remove_pending_request(&self, owner: &BareJid, from: &BareJid) -> StorageResult<()>;
    write fn remove_user(&self, owner: &BareJid) -> StorageResult<()>;
});

timed_store!(UserDataStore {
    read fn get(&self, owner: &BareJid, kind: &str, key: &str) -> StorageResult<Option<String>>;
    write fn set(&self, owner: &BareJid, kind: &str, key: &str, value: &str) -> StorageResult<()>;
    write fn delete(&self, owner: &BareJid, kind: &str, key: &str) -> StorageResult<()>;
    write fn remove_user(&self, owner: &BareJid) -> StorageResult<()>;
});

timed_store!(OfflineStore {
    write fn store(&self, owner: &BareJid, from: &str, stanza: &str, stamp_millis: i64, max_per_user: u32, archive: &[ArchiveRecord]) -> Result<(), OfflineStoreError>;
    read fn fetch_all(&self, owner: &BareJid) -> Result<Vec<OfflineMessage>, StorageError>;
    write fn delete_up_to(&self, owner: &BareJid, up_to_id: i64) -> Result<u64, StorageError>;
    write fn take_all(&self, owner: &BareJid) -> Result<Vec<OfflineMessage>, StorageError>;
    read fn count(&self, owner: &BareJid) -> Result<u64, StorageError>;
    write fn remove_user(&self, owner: &BareJid) -> Result<(), StorageError>;
});

timed_store!(ArchiveStore {
    write fn append(&self, records: &[ArchiveRecord]) -> StorageResult<()>;
    read fn query(&self, owner: &BareJid, q: &ArchiveQuery) -> StorageResult<ArchivePage>;
    read fn count(&self, owner: &BareJid, q: &ArchiveQuery) -> StorageResult<u64>;
    read fn existing(&self, owner: &BareJid, ids: &[ArchiveId]) -> StorageResult<Vec<ArchiveId>>;
    read fn max_id(&self) -> StorageResult<Option<ArchiveId>>;
    read fn bounds(&self, owner: &BareJid) -> StorageResult<Option<(ArchiveId, ArchiveId)>>;
    read fn find_by_origin(&self, owner: &BareJid, with_bare: &str, origin_id: &str, outgoing: bool) -> StorageResult<Option<ArchivedMessage>>;
    write fn replace(&self, owner: &BareJid, id: ArchiveId, stanza: &str) -> StorageResult<bool>;
    read fn count_unread_after(&self, owner: &BareJid, with_bare: &str, after: ArchiveId) -> StorageResult<u64>;
    write fn purge_domain_before(&self, domain: &str, before: ArchiveId) -> StorageResult<u64>;
    write fn purge_user(&self, owner: &BareJid, before: Option<ArchiveId>) -> StorageResult<u64>;
    read fn prefs(&self, owner: &BareJid) -> StorageResult<Option<ArchivePrefs>>;
    write fn set_prefs(&self, owner: &BareJid, prefs: &ArchivePrefs) -> StorageResult<()>;
    write fn remove_user(&self, owner: &BareJid) -> StorageResult<()>;
});

timed_store!(InboxStore {
    write fn apply(&self, updates: &[InboxUpdate]) -> StorageResult<()>;
    read fn list(&self, owner: &BareJid, q: &InboxQuery) -> StorageResult<Vec<InboxEntry>>;
    read fn get(&self, owner: &BareJid, remote: &str) -> StorageResult<Option<InboxEntry>>;
    read fn totals(&self, owner: &BareJid) -> StorageResult<InboxTotals>;
    write fn remove(&self, owner: &BareJid, remote: &str) -> StorageResult<bool>;
    write fn remove_user(&self, owner: &BareJid) -> StorageResult<()>;
});

timed_store!(PubsubStore {
    read fn node(&self, service: &str, node: &str) -> StorageResult<Option<StoredNode>>;
    write fn create_node(&self, node: &StoredNode) -> StorageResult<()>;
    write fn set_node_config(&self, service: &str, node: &str, config: &str) -> StorageResult<bool>;
    write fn delete_node(&self, service: &str, node: &str) -> StorageResult<bool>;
    read fn nodes(&self, service: &str) -> StorageResult<Vec<StoredNode>>;
    write fn publish(&self, service: &str, node: &str, item: &StoredItem, max_items: Option<u32>) -> StorageResult<Vec<String>>;
    read fn items(&self, service: &str, node: &str, max: Option<u32>) -> StorageResult<Vec<StoredItem>>;
    read fn items_by_id(&self, service: &str, node: &str, ids: &[String]) -> StorageResult<Vec<StoredItem>>;
    read fn last_items(&self, service: &str) -> StorageResult<Vec<(String, StoredItem)>>;
    read fn last_items_of(&self, services: &[String]) -> StorageResult<Vec<(StoredNode, StoredItem)>>;
    read fn stored_bytes(&self, service: &str, except: Option<(&str, &str)>) -> StorageResult<u64>;
    read fn owned_bytes(&self, service: &str, owner: &str, except: Option<(&str, &str)>) -> StorageResult<u64>;
    write fn retract(&self, service: &str, node: &str, id: &str) -> StorageResult<bool>;
    write fn purge(&self, service: &str, node: &str) -> StorageResult<u64>;
    write fn trim(&self, service: &str, node: &str, max: u32) -> StorageResult<Vec<String>>;
    read fn subscriptions(&self, service: &str, node: &str) -> StorageResult<Vec<PubsubSubscription>>;
    write fn set_subscription(&self, service: &str, node: &str, sub: &PubsubSubscription) -> StorageResult<()>;
    write fn remove_subscription(&self, service: &str, node: &str, jid: &str, subid: Option<&str>) -> StorageResult<u64>;
    read fn subscriptions_of(&self, service: &str, jid: &str) -> StorageResult<Vec<(String, PubsubSubscription)>>;
    read fn subscriptions_of_account(&self, service: &str, jid: &BareJid) -> StorageResult<Vec<(String, PubsubSubscription)>>;
    read fn affiliations(&self, service: &str, node: &str) -> StorageResult<Vec<(String, String)>>;
    write fn set_affiliation(&self, service: &str, node: &str, jid: &str, affiliation: &str) -> StorageResult<()>;
    read fn affiliations_of(&self, service: &str, jid: &str) -> StorageResult<Vec<(String, String)>>;
    write fn remove_user(&self, jid: &BareJid) -> StorageResult<()>;
});
