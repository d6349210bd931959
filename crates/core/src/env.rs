//! The environment shared by the router, sessions and modules.

use crate::hooks::Hooks;
use crate::storage::Storage;
use crate::storage::StorageResult;
use crate::{HandoverGate, Metrics, Pressure, Router, SessionManager};
use starling_proto::{BareJid, Stanza};
use std::collections::HashSet;
use std::sync::{Arc, RwLock};

/// The domains this deployment serves. Domains can be added and removed at
/// run time (DESIGN.md invariant 9), hence the lock; it is held only for a
/// lookup, never across an `.await`.
#[derive(Debug, Default)]
pub struct Hosts {
    domains: RwLock<HashSet<String>>,
}

impl Hosts {
    /// A host set with these (already normalised) domains.
    pub fn new<I: IntoIterator<Item = String>>(domains: I) -> Self {
        Hosts {
            domains: RwLock::new(domains.into_iter().collect()),
        }
    }

    /// True if `domain` is served here.
    pub fn is_local(&self, domain: &str) -> bool {
        self.domains
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(domain)
    }

    /// Adds a domain.
    pub fn add(&self, domain: String) {
        self.domains
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(domain);
    }

    /// Removes a domain.
    pub fn remove(&self, domain: &str) -> bool {
        self.domains
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(domain)
    }

    /// All served domains, sorted.
    pub fn list(&self) -> Vec<String> {
        let mut v: Vec<_> = self
            .domains
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        v.sort();
        v
    }
}

/// Everything a module handler may use, shared by all tasks.
pub struct Env {
    /// The router.
    pub router: Arc<dyn Router>,
    /// The local session table.
    pub sessions: Arc<dyn SessionManager>,
    /// Storage handles.
    pub storage: Storage,
    /// Served domains.
    pub hosts: Hosts,
    /// Registered hook handlers.
    pub hooks: Hooks,
    /// Metrics.
    pub metrics: Metrics,
    /// Storage back-pressure: sessions stop reading while it is high.
    pub pressure: Arc<Pressure>,
    /// Holds an account's new messages while a closing session of it
    /// hands its stanzas back to the router, so they keep their order.
    pub handover: Arc<HandoverGate>,
}

impl Env {
    /// Routes a stanza through the router.
    pub async fn route(&self, stanza: Stanza) {
        self.router.route(self, stanza).await
    }

    /// Deletes an account through the running server: the modules whose
    /// live state names it let go of it first (rooms remove the member and
    /// tell the others, [`crate::hooks::AccountRemovedHandler`]), then
    /// everything stored for it goes. Returns false if the account did
    /// not exist. (The offline `starling user del` deletes stored data
    /// only.)
    pub async fn delete_account(&self, jid: &BareJid) -> StorageResult<bool> {
        for h in &self.hooks.account_removed {
            h.account_removed(self, jid).await;
        }
        self.storage.delete_account(jid).await
    }
}
