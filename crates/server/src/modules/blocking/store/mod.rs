//! The block list store, the blocking module's own (XEP-0191): each
//! account's blocked JIDs.
//!
//! As every module's store (`starling_storage::kit` explains the
//! pattern): [`BlockingStore`], the trait the module uses; `sql.rs`, its
//! SQL written once and compiled for each engine, with the two batch
//! writes whose SQL differs beside it (`on_sqlite.rs`: one statement per
//! JID in a transaction; `on_postgres.rs`: one statement over an array);
//! [`SCHEMA`], its table (step 18; databases made before it have the
//! table from step 2); [`BlockingData`], what account deletion removes;
//! `conformance.rs`, the suite both engines pass (the scenario tests'
//! `stores` module).

pub mod conformance;
mod on_postgres;
mod on_sqlite;

use starling_core::async_trait;
use starling_core::storage::{OwnedData, SchemaStep, Storage, StorageResult, Timed};
use starling_core::{timed_store, Metrics};
use starling_proto::BareJid;
use starling_storage::kit::{self, Engine};
use std::sync::Arc;

/// Block lists (XEP-0191).
#[async_trait]
pub trait BlockingStore: Send + Sync + 'static {
    /// The block list, sorted.
    async fn blocklist(&self, owner: &BareJid) -> StorageResult<Vec<String>>;
    /// Adds JIDs (existing ones are kept); returns those newly added, in
    /// the caller's order, each once.
    async fn block(&self, owner: &BareJid, jids: &[String]) -> StorageResult<Vec<String>>;
    /// Removes JIDs; returns those that were present, in the caller's
    /// order, each once.
    async fn unblock(&self, owner: &BareJid, jids: &[String]) -> StorageResult<Vec<String>>;
    /// Empties the list; returns what was in it, sorted.
    async fn unblock_all(&self, owner: &BareJid) -> StorageResult<Vec<String>>;
}

/// The store's table (versions are global: see `Module::SCHEMA`).
pub const SCHEMA: &[SchemaStep] = &[SchemaStep {
    version: 18,
    name: "blocklist",
    sqlite: include_str!("sqlite/0018_blocklist.sql"),
    postgres: include_str!("postgres/0018_blocklist.sql"),
}];

/// The store on `storage`'s engine.
pub fn open(storage: &Storage) -> Arc<dyn BlockingStore> {
    match kit::engine(storage) {
        Engine::Sqlite(db) => Arc::new(db),
        Engine::Postgres(db) => Arc::new(db),
    }
}

/// [`open`], with every call timed into `metrics`
/// (`starling_storage_latency_seconds{store="blocking"}`).
pub fn open_timed(storage: &Storage, metrics: &Metrics) -> Arc<dyn BlockingStore> {
    Timed::wrap(open(storage), metrics, "blocking")
}

/// What account deletion removes: the account's block list (other users'
/// lists that name it stay theirs). The module runs no service domain.
pub struct BlockingData(Arc<dyn BlockingStore>);

impl BlockingData {
    /// Over `storage`'s engine.
    pub fn new(storage: &Storage) -> BlockingData {
        BlockingData(open(storage))
    }
}

#[async_trait]
impl OwnedData for BlockingData {
    fn name(&self) -> &'static str {
        super::NAME
    }

    async fn remove_user(&self, jid: &BareJid) -> StorageResult<()> {
        self.0.unblock_all(jid).await.map(drop)
    }

    async fn remove_service(&self, _domain: &str) -> StorageResult<()> {
        Ok(())
    }
}

timed_store!(BlockingStore {
    read fn blocklist(&self, owner: &BareJid) -> StorageResult<Vec<String>>;
    write fn block(&self, owner: &BareJid, jids: &[String]) -> StorageResult<Vec<String>>;
    write fn unblock(&self, owner: &BareJid, jids: &[String]) -> StorageResult<Vec<String>>;
    write fn unblock_all(&self, owner: &BareJid) -> StorageResult<Vec<String>>;
});
