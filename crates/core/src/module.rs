//! The [`Module`] trait: everything the server needs to know to run a
//! module, declared in one place by the module itself.
//!
//! A module has a name (its `[modules.<name>]` configuration table), its
//! own configuration struct (documented beside the module, deserialized
//! from that table, with defaults for every key), the storage concerns it
//! uses, the other modules it needs, and a `start` function that registers
//! its hooks, element and iq handlers, disco features and background tasks
//! in a [`HookRegistry`]. The server keeps one list of modules; adding a
//! module is writing it and adding one line to that list.
//!
//! Modules never import each other. When they must cooperate they do it
//! through hooks (the archive tells the inbox through
//! [`crate::hooks::ArchivedHandler`]) or through a shared contract type in
//! this crate ([`crate::roster::SessionRoster`]).

use crate::hooks::HookRegistry;
use crate::storage::{ArchiveIds, Storage};
use crate::{Metrics, Pressure};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

/// What a module gets at start-up besides its own configuration.
pub struct ModuleCtx<'a> {
    /// The served domains (`[server] domains`).
    pub domains: &'a [String],
    /// The node's data directory (`[server] data_dir`), for modules that
    /// keep files of their own (uploads).
    pub data_dir: &'a std::path::Path,
    /// This node's id (`[server] node_id`), part of archive ids.
    pub node_id: u8,
    /// SCRAM iteration count for passwords set in-band (`[auth]`).
    pub scram_iterations: u32,
    /// Storage handles.
    pub storage: &'a Storage,
    /// The node's archive id generator (one per node: ids are unique
    /// across every archive).
    pub archive_ids: &'a Arc<ArchiveIds>,
    /// Metrics registry.
    pub metrics: &'a Metrics,
    /// Storage back-pressure, for modules with write-behind queues.
    pub pressure: &'a Arc<Pressure>,
    /// Whether the module named so is enabled (for optional cooperation,
    /// e.g. presence fan-out when the roster module runs).
    pub is_enabled: &'a (dyn Fn(&str) -> bool + Sync),
}

/// A configuration value a module refused, with what to do about it.
#[derive(Debug)]
pub struct ConfigProblem {
    /// The key inside the module's table (e.g. `default_page_size`).
    pub key: &'static str,
    /// What is wrong and what to do.
    pub message: String,
}

impl ConfigProblem {
    /// A problem with `key`.
    pub fn new(key: &'static str, message: impl Into<String>) -> Self {
        ConfigProblem {
            key,
            message: message.into(),
        }
    }
}

/// A storage concern a module uses (documentation and `starling modules`).
pub type StorageConcern = &'static str;

/// A module of the server.
pub trait Module: Send + Sync + 'static {
    /// The module's name: its `[modules.<NAME>]` table and the `module`
    /// field of its log lines.
    const NAME: &'static str;
    /// One line saying what it does (the specifications it implements).
    const SUMMARY: &'static str;
    /// Its configuration: a struct documented beside the module; every key
    /// has a default and unknown keys are refused
    /// (`#[serde(default, deny_unknown_fields)]`).
    type Config: DeserializeOwned + Default + Clone + Debug + Send + Sync + 'static;
    /// The storage concerns it reads or writes.
    const STORAGE: &'static [StorageConcern] = &[];
    /// Modules that must be enabled when this one is.
    const NEEDS: &'static [&'static str] = &[];
    /// Whether the module is served by the HTTP listeners
    /// (`[[http.listen]]`): a configuration that enables it without one is
    /// refused.
    const HTTP: bool = false;
    /// The schema steps of the module's own store (its tables), applied
    /// with the backend's when the storage opens, whether the module is
    /// enabled or not (so turning it on later needs no migration).
    const SCHEMA: &'static [crate::storage::SchemaStep] = &[];
    /// The conformance suite of the module's own store (run on every
    /// engine by the scenario tests' `stores` module, for every module of
    /// the server's list).
    const STORE_SUITES: &'static [crate::storage::StoreSuite] = &[];
    /// The admin API paths (prefixes) the module serves when it is enabled,
    /// so that while it is off they answer 404 saying which module to
    /// turn on.
    const ADMIN_PATHS: &'static [&'static str] = &[];

    /// What the module stores on its own, for account and domain deletion;
    /// asked once when the storage opens, whether the module is enabled or
    /// not (an account's data outlives a module turned off).
    fn owned_data(
        storage: &crate::storage::Storage,
    ) -> Option<std::sync::Arc<dyn crate::storage::OwnedData>> {
        let _ = storage;
        None
    }

    /// The label of the service the module runs on each served domain
    /// (`conference` for `conference.example.org`), if it runs one: no
    /// other module may claim that address.
    fn subdomain(cfg: &Self::Config) -> Option<&str> {
        let _ = cfg;
        None
    }

    /// Domains the module serves on its own (an external component's):
    /// the configuration key that lists them, and the domains. None may
    /// be another module's service address.
    fn claimed_domains(cfg: &Self::Config) -> (&'static str, Vec<String>) {
        let _ = cfg;
        ("", Vec::new())
    }

    /// Whether the configuration turns the module on. A module that is
    /// off registers nothing and runs no code.
    fn enabled(cfg: &Self::Config) -> bool;

    /// Checks values that types alone cannot (`domains`: the served
    /// domains, for per-domain settings).
    fn validate(cfg: &Self::Config, domains: &[String]) -> Result<(), ConfigProblem> {
        let _ = (cfg, domains);
        Ok(())
    }

    /// Registers the module's handlers and starts its background tasks
    /// (inside the Tokio runtime).
    fn start(
        cfg: &Self::Config,
        ctx: &ModuleCtx<'_>,
        reg: &mut HookRegistry,
    ) -> impl Future<Output = ()> + Send;
}

/// The configuration of a module whose only setting is whether it runs.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnabledConfig {
    /// Run the module.
    pub enabled: bool,
}

impl Default for EnabledConfig {
    fn default() -> Self {
        EnabledConfig { enabled: true }
    }
}

/// Bits naming modules in a per-domain switch-off mask
/// ([`crate::Host::modules_off`], `DomainSettings::disabled_modules`).
///
/// A module's bit is assigned the first time its name is seen (at
/// registration, or when a domain's settings name it) and never changes
/// while the process runs; masks are only compared within one process.
/// 64 names at most get a bit: a name seen after that gets none (0) and
/// cannot be switched off per domain, which [`module_bit`]'s callers turn
/// into a refused setting ([`module_bit_checked`]).
pub fn module_bit(name: &str) -> u64 {
    module_bit_checked(name).unwrap_or(0)
}

/// [`module_bit`], or `None` when all 64 bits are taken.
pub fn module_bit_checked(name: &str) -> Option<u64> {
    static NAMES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let i = match names.iter().position(|n| n == name) {
        Some(i) => i,
        None if names.len() < 64 => {
            names.push(name.to_owned());
            names.len() - 1
        }
        None => return None,
    };
    Some(1u64 << i)
}

/// The switch-off mask of these module names.
pub fn modules_mask<'a>(names: impl IntoIterator<Item = &'a str>) -> u64 {
    names.into_iter().fold(0, |m, n| m | module_bit(n))
}
