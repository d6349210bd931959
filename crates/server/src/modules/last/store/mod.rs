//! The last-activity store, the module's own (XEP-0012): each account's
//! last logout time and the status text it left with.
//!
//! As every module's store (`starling_storage::kit` explains the
//! pattern): [`LastActivityStore`], the trait the module uses; `sql.rs`,
//! its SQL written once and compiled for each engine (`on_sqlite.rs`,
//! `on_postgres.rs`); [`SCHEMA`], its table (step 17; databases made
//! before it have the table from step 2); [`LastData`], what account
//! deletion removes; `conformance.rs`, the suite both engines pass (listed as
//! `Module::STORE_SUITES`, run by the scenario tests' `stores` module).

pub mod conformance;
mod on_postgres;
mod on_sqlite;

use starling_core::async_trait;
use starling_core::storage::{OwnedData, SchemaStep, Storage, StorageResult, Timed};
use starling_core::{timed_store, Metrics};
use starling_proto::BareJid;
use starling_storage::kit::{self, Engine};
use std::sync::Arc;

/// Last logout time and status (XEP-0012).
#[async_trait]
pub trait LastActivityStore: Send + Sync + 'static {
    /// Seconds since the Unix epoch of the last logout, and its status text.
    async fn get(&self, owner: &BareJid) -> StorageResult<Option<(u64, String)>>;
    /// Records a logout.
    async fn set(&self, owner: &BareJid, at_unix_secs: u64, status: &str) -> StorageResult<()>;
    /// Deletes the record.
    async fn remove_user(&self, owner: &BareJid) -> StorageResult<()>;
}

/// The store's table (versions are global: see `Module::SCHEMA`).
pub const SCHEMA: &[SchemaStep] = &[SchemaStep {
    version: 17,
    name: "last-activity",
    sqlite: include_str!("sqlite/0017_last_activity.sql"),
    postgres: include_str!("postgres/0017_last_activity.sql"),
}];

/// The store on `storage`'s engine.
pub fn open(storage: &Storage) -> Arc<dyn LastActivityStore> {
    match kit::engine(storage) {
        Engine::Sqlite(db) => Arc::new(db),
        Engine::Postgres(db) => Arc::new(db),
    }
}

/// [`open`], with every call timed into `metrics`
/// (`starling_storage_latency_seconds{store="last_activity"}`).
pub fn open_timed(storage: &Storage, metrics: &Metrics) -> Arc<dyn LastActivityStore> {
    Timed::wrap(open(storage), metrics, "last_activity")
}

/// What account deletion removes: the account's record. (The module runs
/// no service domain.)
pub struct LastData(Arc<dyn LastActivityStore>);

impl LastData {
    /// Over `storage`'s engine.
    pub fn new(storage: &Storage) -> LastData {
        LastData(open(storage))
    }
}

#[async_trait]
impl OwnedData for LastData {
    fn name(&self) -> &'static str {
        super::NAME
    }

    async fn remove_user(&self, jid: &BareJid) -> StorageResult<()> {
        self.0.remove_user(jid).await
    }

    async fn remove_service(&self, _domain: &str) -> StorageResult<()> {
        Ok(())
    }
}

timed_store!(LastActivityStore {
    read fn get(&self, owner: &BareJid) -> StorageResult<Option<(u64, String)>>;
    write fn set(&self, owner: &BareJid, at_unix_secs: u64, status: &str) -> StorageResult<()>;
    write fn remove_user(&self, owner: &BareJid) -> StorageResult<()>;
});
