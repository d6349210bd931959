//! What authentication reads, kept in memory: an account's SCRAM
//! credentials and whether it is disabled (ejabberd's `auth_use_cache`,
//! MongooseIM's auth cache).
//!
//! Every login and every stream-management resumption authenticates, and
//! each authentication read both through the backend: on SQLite, a round
//! trip to sqlx's worker thread and back (two context switches per read),
//! the largest item of a resumption storm's profile (docs/benchmarks.md).
//! The cache answers those reads from memory after the first.
//!
//! Coherence:
//! - writes through this store (password change, disable, delete) drop the
//!   account's entry once the backend has the change, and a read that
//!   started before any invalidation and ends after it is not kept (the
//!   cache's generation moved);
//! - every such write, by any process — another node of a cluster, the
//!   offline CLI (`starling user passwd`) — also records the account in
//!   the backend's change log; the server polls it ([`AuthCache::sync`],
//!   every 2 s) and forgets the accounts changed since its last poll. So a
//!   password changed elsewhere stops working here within one poll;
//! - an account that does not exist is not remembered (one created
//!   elsewhere can log in at once), and FAST tokens (XEP-0484) are not
//!   cached: they are written at logins and rotated, and a stale token
//!   list would accept a token another node had replaced.
//!
//! Bounded: at most `capacity` accounts (beyond that an arbitrary entry of
//! the same shard is evicted); 0 turns the cache off.

use super::{AccountChanges, AccountStore, FastSlot, FastToken, StorageResult};
use crate::metrics::Metrics;
use async_trait::async_trait;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use starling_proto::sasl::{ScramCredentials, ScramHash};
use starling_proto::BareJid;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Shards of the map (a power of two): logins on many runtime threads
/// rarely wait for each other.
const SHARDS: usize = 16;

/// What is known of one account.
#[derive(Default)]
struct Entry {
    /// The credentials read last (of one hash function: a client uses the
    /// same mechanism every time).
    credentials: Option<ScramCredentials>,
    /// Whether it is disabled, once read.
    disabled: Option<bool>,
}

/// The cache in front of an [`AccountStore`].
pub struct AuthCache {
    inner: Arc<dyn AccountStore>,
    shards: Box<[Mutex<HashMap<BareJid, Entry>>]>,
    hasher: RandomState,
    /// Entries per shard.
    per_shard: usize,
    /// Moves on every invalidation: a read that began before one is not
    /// kept.
    generation: AtomicU64,
    /// The backend's change counter when the cache was last checked.
    version: AtomicI64,
    /// `starling_auth_cache_lookups_total{result}`, and its two counters.
    lookups: Family<Vec<(String, String)>, Counter>,
    hits: Counter,
    misses: Counter,
    /// `starling_auth_cache_accounts`, set at each [`AuthCache::sync`].
    accounts: Gauge,
}

impl AuthCache {
    /// `inner` behind a cache of at most `capacity` accounts.
    pub fn new(inner: Arc<dyn AccountStore>, capacity: usize) -> AuthCache {
        let lookups = Family::<Vec<(String, String)>, Counter>::default();
        let counter = |result: &str| {
            lookups
                .get_or_create(&vec![("result".to_owned(), result.to_owned())])
                .clone()
        };
        let (hits, misses) = (counter("hit"), counter("miss"));
        AuthCache {
            inner,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            per_shard: capacity.div_ceil(SHARDS),
            generation: AtomicU64::new(0),
            version: AtomicI64::new(i64::MIN),
            hits,
            misses,
            lookups,
            accounts: Gauge::default(),
        }
    }

    /// Exports the cache's lookups (reads answered from memory: hit; from
    /// storage: miss) and its size in `metrics`.
    pub fn export(&self, metrics: &Metrics) {
        metrics.with_registry(|r| {
            r.register(
                "auth_cache_lookups",
                "Authentication reads (SCRAM credentials, disabled flag) answered from the auth cache (hit) or from storage (miss)",
                self.lookups.clone(),
            );
            r.register(
                "auth_cache_accounts",
                "Accounts in the auth cache (updated every 2 s)",
                self.accounts.clone(),
            );
        });
    }

    fn shard(&self, jid: &BareJid) -> &Mutex<HashMap<BareJid, Entry>> {
        let i = self.hasher.hash_one(jid) as usize % SHARDS;
        &self.shards[i]
    }

    /// Reads `get` from the entry, or runs `load` on the backend and keeps
    /// its answer with `put` when `keep` (and no invalidation happened
    /// meanwhile).
    async fn read<T: Clone, F>(
        &self,
        jid: &BareJid,
        get: impl Fn(&Entry) -> Option<T>,
        keep: impl Fn(&T) -> bool,
        put: impl FnOnce(&mut Entry, T),
        load: F,
    ) -> StorageResult<T>
    where
        F: std::future::Future<Output = StorageResult<T>>,
    {
        if self.per_shard == 0 {
            return load.await;
        }
        if let Some(v) = self
            .shard(jid)
            .lock()
            .expect("auth cache")
            .get(jid)
            .and_then(&get)
        {
            self.hits.inc();
            return Ok(v);
        }
        self.misses.inc();
        let generation = self.generation.load(Ordering::Acquire);
        let v = load.await?;
        if !keep(&v) {
            return Ok(v);
        }
        let mut shard = self.shard(jid).lock().expect("auth cache");
        if self.generation.load(Ordering::Acquire) == generation {
            if !shard.contains_key(jid) && shard.len() >= self.per_shard {
                if let Some(victim) = shard.keys().next().cloned() {
                    shard.remove(&victim);
                }
            }
            put(shard.entry(jid.clone()).or_default(), v.clone());
        }
        Ok(v)
    }

    /// Drops what is known of `jid`.
    pub fn forget(&self, jid: &BareJid) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.shard(jid).lock().expect("auth cache").remove(jid);
    }

    /// Drops everything.
    fn clear(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        for s in self.shards.iter() {
            s.lock().expect("auth cache").clear();
        }
    }

    /// Forgets the accounts that changed since the last call, by this
    /// process or another (the backend's change log); everything when the
    /// log no longer reaches back that far, and on the first call. Run it
    /// before serving and then every few seconds. Returns how many
    /// accounts it forgot (`None`: all).
    pub async fn sync(&self) -> StorageResult<Option<usize>> {
        // The first call asks from beyond any counter: the backend answers
        // with its counter alone (the "ahead" case), without listing.
        let after = match self.version.load(Ordering::Acquire) {
            i64::MIN => i64::MAX,
            v => v,
        };
        let changes = self.inner.account_changes(after).await?;
        self.version.store(changes.version, Ordering::Release);
        let forgot = match changes.accounts {
            Some(accounts) => {
                for jid in &accounts {
                    self.forget(jid);
                }
                Some(accounts.len())
            }
            _ => {
                self.clear();
                None
            }
        };
        self.accounts.set(self.len() as i64);
        Ok(forgot)
    }

    /// Accounts cached now (for tests and metrics).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().expect("auth cache").len())
            .sum()
    }

    /// True if nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl AccountStore for AuthCache {
    async fn create(&self, jid: &BareJid, credentials: &[ScramCredentials]) -> StorageResult<()> {
        let r = self.inner.create(jid, credentials).await;
        self.forget(jid);
        r
    }

    async fn create_many(
        &self,
        accounts: &[(BareJid, Vec<ScramCredentials>)],
    ) -> StorageResult<u64> {
        let r = self.inner.create_many(accounts).await;
        for (jid, _) in accounts {
            self.forget(jid);
        }
        r
    }

    async fn exists(&self, jid: &BareJid) -> StorageResult<bool> {
        self.inner.exists(jid).await
    }

    async fn credentials(
        &self,
        jid: &BareJid,
        hash: ScramHash,
    ) -> StorageResult<Option<ScramCredentials>> {
        self.read(
            jid,
            |e| {
                e.credentials
                    .as_ref()
                    .filter(|c| c.hash == hash)
                    .map(|c| Some(c.clone()))
            },
            Option::is_some,
            |e, v| e.credentials = v,
            self.inner.credentials(jid, hash),
        )
        .await
    }

    async fn set_credentials(
        &self,
        jid: &BareJid,
        credentials: &[ScramCredentials],
    ) -> StorageResult<bool> {
        let r = self.inner.set_credentials(jid, credentials).await;
        self.forget(jid);
        r
    }

    async fn delete(&self, jid: &BareJid) -> StorageResult<bool> {
        let r = self.inner.delete(jid).await;
        self.forget(jid);
        r
    }

    async fn list(
        &self,
        domain: &str,
        after: Option<&str>,
        limit: u32,
    ) -> StorageResult<Vec<String>> {
        self.inner.list(domain, after, limit).await
    }

    async fn count(&self, domain: &str) -> StorageResult<u64> {
        self.inner.count(domain).await
    }

    async fn set_disabled(&self, jid: &BareJid, disabled: bool) -> StorageResult<bool> {
        let r = self.inner.set_disabled(jid, disabled).await;
        self.forget(jid);
        r
    }

    async fn is_disabled(&self, jid: &BareJid) -> StorageResult<bool> {
        self.read(
            jid,
            |e| e.disabled,
            |_| true,
            |e, v| e.disabled = Some(v),
            self.inner.is_disabled(jid),
        )
        .await
    }

    async fn fast_tokens(&self, jid: &BareJid, agent: &str) -> StorageResult<Vec<FastToken>> {
        self.inner.fast_tokens(jid, agent).await
    }

    async fn put_fast_token(
        &self,
        jid: &BareJid,
        agent: &str,
        token: &FastToken,
    ) -> StorageResult<bool> {
        self.inner.put_fast_token(jid, agent, token).await
    }

    async fn delete_fast_tokens(
        &self,
        jid: &BareJid,
        agent: &str,
        slot: Option<FastSlot>,
    ) -> StorageResult<()> {
        self.inner.delete_fast_tokens(jid, agent, slot).await
    }

    async fn account_changes(&self, after: i64) -> StorageResult<AccountChanges> {
        self.inner.account_changes(after).await
    }
}
