//! The environment shared by the router, sessions and modules.

use crate::hooks::Hooks;
use crate::storage::StorageResult;
use crate::storage::{DomainSettings, Storage};
use crate::{HandoverGate, Metrics, Pressure, Router, SessionManager};
use starling_proto::{BareJid, Stanza};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// The domains this deployment serves, each with its settings
/// ([`DomainSettings`]: the overrides of a domain added at run time,
/// empty for a configured one). Domains can be added and removed at run
/// time (DESIGN.md invariant 9, docs/domains.md), hence the lock; it is
/// held only for a lookup, never across an `.await`.
#[derive(Debug, Default)]
pub struct Hosts {
    domains: RwLock<HashMap<String, Arc<Host>>>,
}

/// One served domain.
#[derive(Debug, Default)]
pub struct Host {
    /// What it overrides of the configuration.
    pub settings: DomainSettings,
    /// Sessions of this domain bound on this node (shared by the entries
    /// that replace this one when its settings change).
    sessions: Arc<AtomicU32>,
    /// The modules switched off for this domain, as a mask of
    /// [`crate::module::module_bit`]s (shared like `sessions`, so a
    /// session holding it sees a settings change at once).
    modules_off: Arc<AtomicU64>,
}

impl Host {
    /// Counts a session that is binding. False (and nothing counted) when
    /// the domain's `max_sessions` is reached on this node.
    pub fn open_session(&self) -> bool {
        let max = self.settings.max_sessions.unwrap_or(u32::MAX);
        self.sessions
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    /// Uncounts a session counted by [`Host::open_session`].
    pub fn close_session(&self) {
        let _ = self
            .sessions
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Sessions of this domain bound on this node.
    pub fn sessions(&self) -> u32 {
        self.sessions.load(Ordering::Acquire)
    }

    /// The modules switched off for this domain (a mask of
    /// [`crate::module::module_bit`]s).
    pub fn modules_off(&self) -> u64 {
        self.modules_off.load(Ordering::Relaxed)
    }

    /// The live mask of [`Host::modules_off`], for a session to keep.
    pub fn modules_off_handle(&self) -> Arc<AtomicU64> {
        self.modules_off.clone()
    }
}

impl Hosts {
    /// A host set with these (already normalised) domains.
    pub fn new<I: IntoIterator<Item = String>>(domains: I) -> Self {
        Hosts {
            domains: RwLock::new(
                domains
                    .into_iter()
                    .map(|d| (d, Arc::new(Host::default())))
                    .collect(),
            ),
        }
    }

    /// True if `domain` is served here.
    pub fn is_local(&self, domain: &str) -> bool {
        self.domains
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(domain)
    }

    /// A served domain with its settings.
    pub fn get(&self, domain: &str) -> Option<Arc<Host>> {
        self.domains
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(domain)
            .cloned()
    }

    /// Adds a domain with no overrides (keeps an existing one as it is).
    pub fn add(&self, domain: String) {
        self.domains
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(domain)
            .or_default();
    }

    /// Serves `domain` with `settings` (adds it, or replaces its settings
    /// and keeps its session count).
    pub fn set(&self, domain: &str, settings: DomainSettings) {
        let off = crate::module::modules_mask(
            settings
                .disabled_modules
                .iter()
                .flatten()
                .map(String::as_str),
        );
        let mut map = self.domains.write().unwrap_or_else(|e| e.into_inner());
        let (sessions, modules_off) = map
            .get(domain)
            .map(|h| (h.sessions.clone(), h.modules_off.clone()))
            .unwrap_or_default();
        modules_off.store(off, Ordering::Relaxed);
        map.insert(
            domain.to_owned(),
            Arc::new(Host {
                settings,
                sessions,
                modules_off,
            }),
        );
    }

    /// The modules switched off for `domain` if it is served here (one
    /// lookup: the router's "is it local" and "what is off" at once).
    pub fn modules_off(&self, domain: &str) -> Option<u64> {
        self.domains
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(domain)
            .map(|h| h.modules_off())
    }

    /// Removes a domain.
    pub fn remove(&self, domain: &str) -> bool {
        self.domains
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(domain)
            .is_some()
    }

    /// How many domains are served.
    pub fn len(&self) -> usize {
        self.domains.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True if no domain is served.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All served domains, sorted.
    pub fn list(&self) -> Vec<String> {
        let mut v: Vec<_> = self
            .domains
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
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
