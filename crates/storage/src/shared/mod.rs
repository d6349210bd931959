//! The stores whose SQL is the same on both engines, written once.
//!
//! This module is compiled into each backend (`sqlite/mod.rs` and
//! `postgres/mod.rs` declare it with `#[path]`), where `Store` is that
//! backend's type; see [`crate::dialect`] for why, and for the few hooks
//! (`Store::…` calls from the [`Dialect`] trait) where the engines differ.
//! Statements use `$1…$n` placeholders, `TRUE`/`FALSE`, and
//! `for_update!` where PostgreSQL must lock a row.

// `for_update!` is `kit`'s (textually in scope: `#[macro_use] pub mod kit`
// in lib.rs comes before the backends), the one a module's store uses too.

mod accounts;
mod admin;
mod archive;
pub(crate) mod buckets;
mod domains;
mod im;
mod offline;
mod pubsub;

use super::Store;
use crate::dialect::Dialect;
use crate::{backend, split};
use starling_core::storage::{Storage, StorageResult};
use starling_proto::BareJid;
use std::sync::Arc;

/// The driver of this backend.
type Db = <Store as Dialect>::Db;

impl Store {
    /// Wraps the backend into the [`Storage`] handles.
    pub fn into_storage(self) -> Storage {
        let me = Arc::new(self);
        Storage {
            accounts: me.clone(),
            roster: me.clone(),
            user_data: me.clone(),
            offline: me.clone(),
            archive: me.clone(),
            inbox: me.clone(),
            pubsub: me.clone(),
            admin_tokens: me.clone(),
            domains: me.clone(),
            backend: me,
            owned: Arc::new([]),
        }
    }

    /// Runs `sql`, a statement whose only parameters are `domain = $1` and
    /// `username = $2`, for `owner` (per-user deletions).
    async fn exec_for_owner(&self, sql: &'static str, owner: &BareJid) -> StorageResult<()> {
        let (domain, user) = split(owner);
        sqlx::query(sql)
            .bind(domain)
            .bind(user)
            .execute(&self.writer)
            .await
            .map_err(backend)?;
        Ok(())
    }
}
