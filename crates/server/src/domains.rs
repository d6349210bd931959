//! Domains added, disabled, enabled and removed at run time
//! (docs/domains.md; DESIGN.md invariant 9).
//!
//! The configuration's `[server] domains` are served always and cannot be
//! changed here. Every other domain is a row of the `domains` table
//! ([`DomainStore`]) with a state and its settings ([`DomainSettings`]:
//! registration, archive retention, a session limit, a certificate). The
//! served set is [`starling_core::Hosts`], which the router, the session
//! negotiation and the SNI certificate resolver ask; this service keeps it
//! equal to the table:
//!
//! - at start-up, [`Domains::sync`] runs before the listeners accept;
//! - then every node polls the table's change counter every
//!   [`POLL_INTERVAL`] (one primary-key read) and reads the table only
//!   when the counter moved. A poll rather than the cluster bus because
//!   the offline CLI (`starling domain …`) writes the database directly
//!   and knows no bus: one mechanism sees every writer, on a single node
//!   as on a cluster, at the cost of one indexed read per node every 2 s
//!   and a delay of at most 2 s. Changes made through this service (the
//!   admin API) are applied on the calling node at once.
//!
//! A domain that stops being served (disabled, being removed, deleted) is
//! removed from the host set, so new streams to it get `host-unknown`,
//! and this node's sessions of it are closed with the stream error
//! `host-gone` (RFC 6120 §4.9.3.5: "the value of the 'to' attribute … is
//! no longer serviced by the receiving entity"), as every node does for
//! its own. A stream still negotiating with it is refused at its next
//! restart (after STARTTLS or SASL) with `host-unknown`.
//!
//! Removal marks the row `removing`, then deletes the domain's data in the
//! background: every account through [`Env::delete_account`] (all of its
//! per-user stores, rooms told), a progress line every
//! [`PROGRESS_EVERY`] accounts and a final count, then the stored rooms
//! (with their archives) and pubsub nodes of the services under the
//! domain, the self-signed certificate, and last the row. A restarted
//! server finds the row still `removing` and starts over (each step is
//! idempotent). On a cluster one node does it: the one
//! `Router::placement` picks for the domain (any node without a cluster).

use crate::routing::sessions::SessionTable;
use crate::tls::SniResolver;
use starling_core::storage::{DomainSettings, DomainState, Storage, StorageError, StoredDomain};
use starling_core::{CloseReason, Env};
use starling_proto::{BareJid, StreamError, StreamErrorCondition};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How often every node reads the change counter.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Accounts deleted between two progress lines of a removal.
pub const PROGRESS_EVERY: u64 = 1000;

/// Accounts read per page during a removal.
const PAGE: u32 = 500;

/// Why a domain operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum DomainError {
    /// Not a usable domain name.
    #[error("{0:?} is not a valid domain name: {1}")]
    InvalidName(String, &'static str),
    /// A domain of the configuration file.
    #[error("{0} is configured in the configuration file ([server] domains); it cannot be changed at run time: edit the file and restart")]
    Configured(String),
    /// Already stored.
    #[error("{0} already exists")]
    Exists(String),
    /// Not stored.
    #[error("no domain {0} (see `starling domain list`)")]
    NotFound(String),
    /// Being removed: only the removal goes on.
    #[error("{0} is being removed")]
    Removing(String),
    /// A bad setting.
    #[error("{0}")]
    BadSetting(String),
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Checks a domain name given by an operator and returns its normalised
/// form: a valid JID domainpart (RFC 7622 §3.2, normalised by the `jid`
/// crate) that is also a DNS host name: labels of 1–63 letters, digits
/// or `-` (not first or last), at most 253 bytes. That also keeps it safe
/// as a directory name (`data_dir/tls/domains/<domain>`): no `/`, `\`,
/// `..`, or leading dot.
pub fn validate_name(raw: &str) -> Result<String, DomainError> {
    let bad = |why| Err(DomainError::InvalidName(raw.to_owned(), why));
    if raw.is_empty() {
        return bad("empty");
    }
    if raw.len() > 253 {
        return bad("longer than 253 bytes");
    }
    let name = match BareJid::new(raw) {
        Ok(j) if j.node().is_none() => j.domain().as_str().to_owned(),
        Ok(_) => return bad("it has a user part (…@); give the domain only"),
        Err(_) => return bad("not a JID domainpart"),
    };
    for label in name.split('.') {
        if label.is_empty() {
            return bad("empty label (.. or a leading or trailing dot)");
        }
        if label.len() > 63 {
            return bad("a label is longer than 63 bytes");
        }
        if !label.chars().all(|c| c.is_alphanumeric() || c == '-') {
            return bad("only letters, digits, '-' and '.' are allowed");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("a label starts or ends with '-'");
        }
    }
    Ok(name)
}

/// Applies `key=value` to settings (`starling domain set`, the admin
/// API): `registration=on|off`, `archive_retention_days=N`,
/// `max_sessions=N`, `certificate=PATH`, `private_key=PATH`,
/// `disabled_modules=NAME,NAME` (`none`: every running module); the value
/// `default` removes the override.
pub fn apply_setting(s: &mut DomainSettings, assignment: &str) -> Result<(), DomainError> {
    let bad = |m: String| Err(DomainError::BadSetting(m));
    let Some((key, value)) = assignment.split_once('=') else {
        return bad(format!(
            "{assignment:?}: write key=value, e.g. registration=off"
        ));
    };
    let (key, value) = (key.trim(), value.trim());
    let reset = value == "default";
    let number = |what: &str| -> Result<Option<u32>, DomainError> {
        if reset {
            return Ok(None);
        }
        value.parse::<u32>().map(Some).map_err(|_| {
            DomainError::BadSetting(format!(
                "{what}={value:?}: a whole number (or default) is expected"
            ))
        })
    };
    let path = |what: &str| -> Result<Option<PathBuf>, DomainError> {
        if reset {
            return Ok(None);
        }
        if value.is_empty() {
            return Err(DomainError::BadSetting(format!(
                "{what}: a file path (or default) is expected"
            )));
        }
        Ok(Some(PathBuf::from(value)))
    };
    match key {
        "registration" => {
            s.registration = match value {
                "on" | "true" | "yes" => Some(true),
                "off" | "false" | "no" => Some(false),
                "default" => None,
                _ => return bad(format!("registration={value:?}: on, off or default")),
            }
        }
        "archive_retention_days" => s.archive_retention_days = number(key)?,
        "max_sessions" => s.max_sessions = number(key)?,
        "certificate" => s.certificate = path(key)?,
        "private_key" => s.private_key = path(key)?,
        "disabled_modules" => {
            s.disabled_modules = match value {
                "default" => None,
                "none" | "" => Some(Vec::new()),
                list => {
                    let mut names = Vec::new();
                    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                        check_switchable(name)?;
                        if !names.iter().any(|n| n == name) {
                            names.push(name.to_owned());
                        }
                    }
                    names.sort();
                    Some(names)
                }
            }
        }
        _ => {
            return bad(format!(
                "unknown setting {key:?}; known: registration, archive_retention_days, max_sessions, certificate, private_key, disabled_modules"
            ))
        }
    }
    Ok(())
}

/// Modules every domain runs: the core of RFC 6120/6121 (`presence`,
/// `roster`, `disco`), `register` (switched per domain with the
/// `registration` setting) and `component` (components are configured
/// per domain already).
const NOT_SWITCHABLE: &[&str] = &["presence", "roster", "disco", "register", "component"];

/// Whether `name` may be in `disabled_modules`.
fn check_switchable(name: &str) -> Result<(), DomainError> {
    if NOT_SWITCHABLE.contains(&name) {
        return Err(DomainError::BadSetting(format!(
            "disabled_modules: {name} cannot be switched off per domain (every domain runs presence, roster, disco; use registration=off for register)"
        )));
    }
    if !crate::modules::MODULES.iter().any(|m| m.name() == name) {
        let known: Vec<&str> = crate::modules::MODULES
            .iter()
            .map(|m| m.name())
            .filter(|n| !NOT_SWITCHABLE.contains(n))
            .collect();
        return Err(DomainError::BadSetting(format!(
            "disabled_modules: no module is called {name:?}; known: {}",
            known.join(", ")
        )));
    }
    if starling_core::module::module_bit_checked(name).is_none() {
        return Err(DomainError::BadSetting(format!(
            "disabled_modules: {name} cannot be switched off (more than 64 module names)"
        )));
    }
    Ok(())
}

/// Checks settings as a whole (a certificate needs its key).
fn check_settings(s: &DomainSettings) -> Result<(), DomainError> {
    if s.certificate.is_some() != s.private_key.is_some() {
        return Err(DomainError::BadSetting(
            "certificate and private_key go together: set both, or neither".into(),
        ));
    }
    // A module that stays on must keep what it needs (the inbox lists
    // what the archive stores).
    let off = s.disabled_modules.as_deref().unwrap_or_default();
    for m in crate::modules::MODULES {
        if off.iter().any(|n| n == m.name()) {
            continue;
        }
        if let Some(need) = m.needs().iter().find(|n| off.iter().any(|o| o == *n)) {
            return Err(DomainError::BadSetting(format!(
                "disabled_modules: {} needs {need}; switch {} off too, or keep {need}",
                m.name(),
                m.name()
            )));
        }
    }
    Ok(())
}

/// Where a listed domain comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DomainSource {
    /// `[server] domains`.
    Configured,
    /// The `domains` table.
    Stored,
}

/// One domain as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainInfo {
    /// The domain.
    pub name: String,
    /// Configuration or table.
    pub source: DomainSource,
    /// Its state (configured domains are always enabled).
    pub state: DomainState,
    /// Its overrides (none for configured domains).
    pub settings: DomainSettings,
    /// When it was added (stored domains), milliseconds since the epoch.
    pub created_at: Option<i64>,
}

/// What the service needs of a running server.
struct Runtime {
    env: Arc<Env>,
    table: Arc<SessionTable>,
}

/// The domain service: the operations of `starling domain …` and of the
/// admin API, and (in a running server) the keeper of the served set.
pub struct Domains {
    storage: Storage,
    configured: Vec<String>,
    data_dir: PathBuf,
    tls: Option<Arc<SniResolver>>,
    runtime: OnceLock<Runtime>,
    /// The counter value last applied (`None`: never synced).
    applied: tokio::sync::Mutex<Option<i64>>,
    /// Removals running on this node, with the accounts deleted so far
    /// (updated every [`PROGRESS_EVERY`]).
    removing: Arc<Mutex<HashMap<String, u64>>>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Domains {
    /// The service over `storage`; `configured` are the configuration's
    /// (normalised) domains. Without [`Domains::attach`] it only changes
    /// the table (the offline CLI).
    pub fn new(
        storage: Storage,
        configured: Vec<String>,
        data_dir: PathBuf,
        tls: Option<Arc<SniResolver>>,
    ) -> Arc<Domains> {
        Arc::new(Domains {
            storage,
            configured,
            data_dir,
            tls,
            runtime: OnceLock::new(),
            applied: tokio::sync::Mutex::new(None),
            removing: Arc::default(),
        })
    }

    /// Connects the service to a running server (at start, once).
    pub(crate) fn attach(&self, env: Arc<Env>, table: Arc<SessionTable>) {
        let _ = self.runtime.set(Runtime { env, table });
    }

    fn is_configured(&self, name: &str) -> bool {
        self.configured.iter().any(|d| d == name)
    }

    /// A validated, stored-domain name (not a configured one).
    fn stored_name(&self, raw: &str) -> Result<String, DomainError> {
        let name = validate_name(raw)?;
        if self.is_configured(&name) {
            return Err(DomainError::Configured(name));
        }
        Ok(name)
    }

    /// Adds a domain (enabled unless `enabled` is false) with `settings`.
    /// Its self-signed certificate is made now unless it has its own or
    /// the default certificate covers it.
    pub async fn add(
        &self,
        raw: &str,
        enabled: bool,
        settings: DomainSettings,
    ) -> Result<StoredDomain, DomainError> {
        let name = self.stored_name(raw)?;
        check_settings(&settings)?;
        let d = StoredDomain {
            name: name.clone(),
            state: if enabled {
                DomainState::Enabled
            } else {
                DomainState::Disabled
            },
            settings,
            created_at: now_ms(),
            version: 0,
        };
        match self.storage.domains.add_domain(&d).await {
            Err(StorageError::Conflict) => return Err(DomainError::Exists(name)),
            r => r?,
        }
        let covered = self.tls.as_ref().is_some_and(|t| t.default_covers(&name));
        if d.settings.certificate.is_none() && !covered {
            let dir = self.data_dir.clone();
            let n = name.clone();
            let made = tokio::task::spawn_blocking(move || {
                crate::tls::ensure_domain_certificate(&dir, &n, now_ms() / 1000)
            })
            .await;
            match made {
                Ok(Ok(_)) => {}
                // Made on the first handshake instead.
                Ok(Err(e)) => {
                    tracing::warn!(domain = %name, error = %format!("{e:#}"), "cannot make the domain's certificate now")
                }
                Err(e) => tracing::warn!(domain = %name, error = %e, "certificate task failed"),
            }
        }
        tracing::info!(domain = %name, enabled, "domain added");
        self.sync().await?;
        Ok(d)
    }

    async fn stored(&self, name: &str) -> Result<StoredDomain, DomainError> {
        self.storage
            .domains
            .domain(name)
            .await?
            .ok_or_else(|| DomainError::NotFound(name.to_owned()))
    }

    /// Stops serving a domain (its data stays): its sessions are closed
    /// with `host-gone`.
    pub async fn disable(&self, raw: &str) -> Result<(), DomainError> {
        self.set_state(raw, DomainState::Disabled).await
    }

    /// Serves a disabled domain again.
    pub async fn enable(&self, raw: &str) -> Result<(), DomainError> {
        self.set_state(raw, DomainState::Enabled).await
    }

    async fn set_state(&self, raw: &str, state: DomainState) -> Result<(), DomainError> {
        let name = self.stored_name(raw)?;
        let d = self.stored(&name).await?;
        if d.state == DomainState::Removing {
            return Err(DomainError::Removing(name));
        }
        self.storage.domains.set_domain_state(&name, state).await?;
        tracing::info!(domain = %name, state = state.as_str(), "domain state changed");
        self.sync().await?;
        Ok(())
    }

    /// Marks a domain `removing`: it stops being served at once, and its
    /// data is deleted in the background (by a running server; offline,
    /// [`Domains::purge`] does it).
    pub async fn remove(&self, raw: &str) -> Result<(), DomainError> {
        let name = self.stored_name(raw)?;
        self.stored(&name).await?;
        self.storage
            .domains
            .set_domain_state(&name, DomainState::Removing)
            .await?;
        tracing::info!(domain = %name, "domain marked for removal");
        self.sync().await?;
        Ok(())
    }

    /// Replaces a domain's settings.
    pub async fn set_settings(
        &self,
        raw: &str,
        settings: DomainSettings,
    ) -> Result<(), DomainError> {
        let name = self.stored_name(raw)?;
        check_settings(&settings)?;
        let d = self.stored(&name).await?;
        if d.state == DomainState::Removing {
            return Err(DomainError::Removing(name));
        }
        self.storage
            .domains
            .set_domain_settings(&name, &settings)
            .await?;
        tracing::info!(domain = %name, settings = %settings.to_json(), "domain settings changed");
        self.sync().await?;
        Ok(())
    }

    /// One domain's stored settings (`Configured` for a configured one).
    pub async fn get(&self, raw: &str) -> Result<StoredDomain, DomainError> {
        let name = self.stored_name(raw)?;
        self.stored(&name).await
    }

    /// Accounts deleted so far by a removal of `name` running on this
    /// node (counted every [`PROGRESS_EVERY`]), `None` if none runs here.
    pub fn removal_progress(&self, name: &str) -> Option<u64> {
        self.removing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .copied()
    }

    /// Every domain: the configured ones first, then the stored ones by
    /// name.
    pub async fn list(&self) -> Result<Vec<DomainInfo>, DomainError> {
        let mut out: Vec<DomainInfo> = self
            .configured
            .iter()
            .map(|d| DomainInfo {
                name: d.clone(),
                source: DomainSource::Configured,
                state: DomainState::Enabled,
                settings: DomainSettings::default(),
                created_at: None,
            })
            .collect();
        for d in self.storage.domains.domains().await? {
            if self.is_configured(&d.name) {
                continue;
            }
            out.push(DomainInfo {
                name: d.name,
                source: DomainSource::Stored,
                state: d.state,
                settings: d.settings,
                created_at: Some(d.created_at),
            });
        }
        Ok(out)
    }

    /// Makes the served set equal to the table, if the change counter
    /// moved since the last time (a no-op offline).
    pub async fn sync(&self) -> Result<(), DomainError> {
        let Some(rt) = self.runtime.get() else {
            return Ok(());
        };
        let mut applied = self.applied.lock().await;
        let version = self.storage.domains.domains_version().await?;
        if *applied == Some(version) {
            return Ok(());
        }
        let rows = self.storage.domains.domains().await?;
        let hosts = &rt.env.hosts;
        let mut stored = HashSet::with_capacity(rows.len());
        let mut to_remove = Vec::new();
        for d in rows {
            if self.is_configured(&d.name) {
                tracing::warn!(domain = %d.name, "a stored domain is also configured in the file; the file wins");
                continue;
            }
            match d.state {
                DomainState::Enabled => {
                    let changed = match hosts.get(&d.name) {
                        Some(h) => h.settings != d.settings,
                        None => true,
                    };
                    if changed {
                        let was = hosts.is_local(&d.name);
                        if let Some(t) = &self.tls {
                            t.forget(&d.name);
                        }
                        hosts.set(&d.name, d.settings);
                        if !was {
                            tracing::info!(domain = %d.name, "serving domain");
                        }
                    }
                }
                DomainState::Disabled => self.stop_serving(rt, &d.name, "the domain was disabled"),
                DomainState::Removing => {
                    self.stop_serving(rt, &d.name, "the domain was removed");
                    to_remove.push(d.name.clone());
                }
            }
            stored.insert(d.name);
        }
        // Rows deleted (a finished removal elsewhere).
        for name in hosts.list() {
            if !stored.contains(&name) && !self.is_configured(&name) {
                self.stop_serving(rt, &name, "the domain was removed");
            }
        }
        *applied = Some(version);
        drop(applied);
        for name in to_remove {
            self.start_removal(rt, name);
        }
        Ok(())
    }

    /// Removes `name` from the served set and closes this node's sessions
    /// of it with `host-gone`.
    fn stop_serving(&self, rt: &Runtime, name: &str, why: &str) {
        if let Some(t) = &self.tls {
            t.forget(name);
        }
        if !rt.env.hosts.remove(name) {
            return;
        }
        let mut closed = 0u64;
        for s in rt.table.local_sessions() {
            if s.entry.jid().domain().as_str() == name {
                if let Some(h) = rt.table.handle(&s.entry.session) {
                    let err = StreamError::with_text(StreamErrorCondition::HostGone, why);
                    let _ = h.try_send(starling_core::SessionMsg::Close(CloseReason::Error(
                        Box::new(err),
                    )));
                    closed += 1;
                }
            }
        }
        tracing::info!(
            domain = name,
            sessions_closed = closed,
            reason = why,
            "domain no longer served"
        );
    }

    /// Starts the background removal of `name` on this node, unless it
    /// runs already or another cluster node owns it.
    fn start_removal(&self, rt: &Runtime, name: String) {
        let key = format!("domain-removal/{name}");
        if let Some(node) = rt.env.router.placement(&key) {
            if node != rt.table.node() {
                return;
            }
        }
        if self
            .removing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.clone(), 0)
            .is_some()
        {
            return;
        }
        let env = rt.env.clone();
        let storage = self.storage.clone();
        let data_dir = self.data_dir.clone();
        let tls = self.tls.clone();
        let removing = self.removing.clone();
        tokio::spawn(async move {
            let services: Vec<String> = env
                .hooks
                .services_of(&name, 0)
                .into_iter()
                .map(|(jid, _)| jid)
                .collect();
            match purge(&storage, Some(&env), &name, &services, |n| {
                tracing::info!(domain = %name, accounts_deleted = n, "removing domain: progress");
                if let Some(p) = removing
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_mut(&name)
                {
                    *p = n;
                }
            })
            .await
            {
                Ok(n) => {
                    let _ = std::fs::remove_dir_all(crate::tls::domain_certificate_dir(
                        &data_dir, &name,
                    ));
                    if let Some(t) = &tls {
                        t.forget(&name);
                    }
                    // Its sessions closed long before its data was gone.
                    env.metrics.forget_domain(&name);
                    tracing::info!(domain = %name, accounts_deleted = n, "domain removed: its data is deleted");
                }
                Err(e) => {
                    tracing::error!(domain = %name, error = %e, "removing domain failed; it stays 'removing' and is resumed at the next start");
                }
            }
            removing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&name);
        });
    }

    /// Deletes every stored thing of domain `raw` (offline: the CLI's
    /// `domain remove`), calling `progress` every [`PROGRESS_EVERY`]
    /// accounts; returns how many accounts were deleted. The domain must
    /// be `removing`.
    pub async fn purge(
        &self,
        raw: &str,
        services: &[String],
        progress: impl FnMut(u64),
    ) -> Result<u64, DomainError> {
        let name = self.stored_name(raw)?;
        let d = self.stored(&name).await?;
        if d.state != DomainState::Removing {
            return Err(DomainError::BadSetting(format!(
                "{name} is not being removed; run `starling domain remove {name}` first"
            )));
        }
        let env = self.runtime.get().map(|r| r.env.clone());
        let n = purge(&self.storage, env.as_deref(), &name, services, progress).await?;
        let _ = std::fs::remove_dir_all(crate::tls::domain_certificate_dir(&self.data_dir, &name));
        Ok(n)
    }
}

/// Deletes every stored thing of domain `name` and then its row: each
/// account with all its per-user data (through the running server's
/// [`Env::delete_account`] when there is one, so modules let go of it
/// first), `progress(n)` every [`PROGRESS_EVERY`] accounts; the stored
/// rooms (and their archives) and pubsub nodes of `services` (the
/// services' domains under `name`). Idempotent: run again after a crash,
/// it finishes the job. Returns how many accounts were deleted.
async fn purge(
    storage: &Storage,
    env: Option<&Env>,
    name: &str,
    services: &[String],
    mut progress: impl FnMut(u64),
) -> Result<u64, DomainError> {
    let mut deleted = 0u64;
    let mut after: Option<String> = None;
    loop {
        let page = storage.accounts.list(name, after.as_deref(), PAGE).await?;
        for user in &page {
            let Ok(jid) = BareJid::new(&format!("{user}@{name}")) else {
                tracing::warn!(
                    domain = name,
                    user,
                    "skipping an account whose JID does not parse"
                );
                continue;
            };
            match env {
                Some(env) => env.delete_account(&jid).await?,
                None => storage.delete_account(&jid).await?,
            };
            deleted += 1;
            if deleted.is_multiple_of(PROGRESS_EVERY) {
                progress(deleted);
            }
        }
        if page.len() < PAGE as usize {
            break;
        }
        after = page.last().cloned();
    }
    for service in services {
        for owned in storage.owned.iter() {
            owned.remove_service(service).await?;
        }
        for node in storage.pubsub.nodes(service).await? {
            storage.pubsub.delete_node(service, &node.node).await?;
        }
    }
    storage.domains.delete_domain(name).await?;
    Ok(deleted)
}

/// The configuration's domains, normalised as the server serves them.
pub fn configured_domains(cfg: &crate::Config) -> Vec<String> {
    cfg.server
        .domains
        .iter()
        .map(|d| {
            BareJid::new(d)
                .map(|j| j.domain().as_str().to_owned())
                .unwrap_or_else(|_| d.clone())
        })
        .collect()
}

/// True if `domain` is a stored, enabled domain (`starling user add`
/// accepts accounts of it).
pub async fn stored_and_enabled(storage: &Storage, domain: &str) -> bool {
    matches!(
        storage.domains.domain(domain).await,
        Ok(Some(d)) if d.state == DomainState::Enabled
    )
}

/// `starling domain …`: works on the database, with or without a running
/// server (which sees each change within [`POLL_INTERVAL`]).
#[derive(clap::Subcommand)]
pub enum DomainCommand {
    /// Add a domain (enabled unless --disabled). Its self-signed
    /// certificate is made under data_dir/tls/domains/NAME/ unless
    /// --certificate is given or the [tls] certificate covers it.
    /// Example: starling domain add chat.example.net --registration off
    Add {
        /// The domain.
        name: String,
        /// Store it without serving it yet (`domain enable` later).
        #[arg(long)]
        disabled: bool,
        /// In-band registration here: on or off (default: [modules.register] enabled).
        #[arg(long, value_name = "on|off")]
        registration: Option<String>,
        /// Archive retention in days, 0 = forever (default: [modules.mam]).
        #[arg(long, value_name = "DAYS")]
        archive_retention_days: Option<u32>,
        /// Most sessions of this domain bound at once on one node.
        #[arg(long, value_name = "N")]
        max_sessions: Option<u32>,
        /// The domain's own certificate chain (PEM), with --private-key.
        #[arg(long, value_name = "FILE")]
        certificate: Option<PathBuf>,
        /// The private key of --certificate (PEM).
        #[arg(long, value_name = "FILE")]
        private_key: Option<PathBuf>,
    },
    /// List every domain: configured ones (from the file) and stored ones
    /// with their state and settings.
    List {
        /// One JSON array instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Stop serving a domain, keeping its data: its sessions are closed
    /// with <host-gone/>, new streams get <host-unknown/>.
    Disable {
        /// The domain.
        name: String,
    },
    /// Serve a disabled domain again.
    Enable {
        /// The domain.
        name: String,
    },
    /// Remove a domain and delete all its data (accounts with everything
    /// stored for them, its rooms and pubsub nodes). It stops being served
    /// at once; the deletion runs here with progress lines (a running
    /// server that also picks it up does the same idempotent work), or,
    /// with --background, is left to the running server.
    Remove {
        /// The domain.
        name: String,
        /// Only mark it for removal; a running server deletes the data.
        #[arg(long)]
        background: bool,
    },
    /// Change settings: key=value pairs, `default` removing an override.
    /// Keys: registration (on|off), archive_retention_days, max_sessions,
    /// certificate, private_key. Example: starling domain set
    /// chat.example.net max_sessions=500 registration=default
    Set {
        /// The domain.
        name: String,
        /// key=value …
        #[arg(required = true, value_name = "KEY=VALUE")]
        settings: Vec<String>,
    },
}

fn settings_text(s: &DomainSettings) -> String {
    let mut parts = Vec::new();
    if let Some(r) = s.registration {
        parts.push(format!("registration={}", if r { "on" } else { "off" }));
    }
    if let Some(d) = s.archive_retention_days {
        parts.push(format!("archive_retention_days={d}"));
    }
    if let Some(m) = s.max_sessions {
        parts.push(format!("max_sessions={m}"));
    }
    if let Some(c) = &s.certificate {
        parts.push(format!("certificate={}", c.display()));
    }
    if let Some(k) = &s.private_key {
        parts.push(format!("private_key={}", k.display()));
    }
    parts.join(" ")
}

fn out(line: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
    use std::io::Write as _;
    writeln!(std::io::stdout().lock(), "{line}")
        .map_err(|e| anyhow::anyhow!("cannot write to standard output: {e}"))
}

/// The services' domains under `domain` that the configuration's modules
/// own (their stored rooms and nodes go with the domain).
fn service_domains(cfg: &crate::Config, domain: &str) -> Vec<String> {
    let mut subs = vec![cfg.modules.get::<crate::modules::Muc>().subdomain.clone()];
    subs.push(
        cfg.modules
            .get::<crate::modules::pubsub::Pubsub>()
            .subdomain
            .clone(),
    );
    subs.push(
        cfg.modules
            .get::<crate::modules::MucLight>()
            .subdomain
            .clone(),
    );
    subs.into_iter().map(|s| format!("{s}.{domain}")).collect()
}

/// Runs one `starling domain …` command on `storage`.
pub async fn run_cli(
    cfg: &crate::Config,
    storage: Storage,
    cmd: DomainCommand,
) -> anyhow::Result<()> {
    let domains = Domains::new(
        storage,
        configured_domains(cfg),
        cfg.server.data_dir.clone(),
        None,
    );
    match cmd {
        DomainCommand::Add {
            name,
            disabled,
            registration,
            archive_retention_days,
            max_sessions,
            certificate,
            private_key,
        } => {
            let mut s = DomainSettings {
                archive_retention_days,
                max_sessions,
                certificate,
                private_key,
                ..DomainSettings::default()
            };
            if let Some(r) = registration {
                apply_setting(&mut s, &format!("registration={r}"))?;
            }
            // A certificate given here is checked before it is stored.
            if let Some((c, k)) = s.certificate_pair() {
                crate::tls::TlsContext::load(c, k)?;
            }
            let d = domains.add(&name, !disabled, s).await?;
            out(format_args!(
                "added {} ({}); a running server serves it within {} s",
                d.name,
                d.state.as_str(),
                POLL_INTERVAL.as_secs()
            ))?;
        }
        DomainCommand::List { json } => {
            let list = domains.list().await?;
            if json {
                let v: Vec<serde_json::Value> = list
                    .iter()
                    .map(|d| {
                        serde_json::json!({
                            "name": d.name,
                            "source": match d.source { DomainSource::Configured => "config", DomainSource::Stored => "stored" },
                            "state": d.state.as_str(),
                            "settings": d.settings,
                            "created_at": d.created_at,
                        })
                    })
                    .collect();
                out(format_args!("{}", serde_json::Value::Array(v)))?;
            } else {
                for d in &list {
                    let source = match d.source {
                        DomainSource::Configured => "config",
                        DomainSource::Stored => "stored",
                    };
                    let settings = settings_text(&d.settings);
                    out(format_args!(
                        "{}  {}  {source}{}{settings}",
                        d.name,
                        d.state.as_str(),
                        if settings.is_empty() { "" } else { "  " }
                    ))?;
                }
            }
        }
        DomainCommand::Disable { name } => {
            domains.disable(&name).await?;
            out(format_args!(
                "disabled {name}; a running server closes its sessions within {} s",
                POLL_INTERVAL.as_secs()
            ))?;
        }
        DomainCommand::Enable { name } => {
            domains.enable(&name).await?;
            out(format_args!("enabled {name}"))?;
        }
        DomainCommand::Remove { name, background } => {
            let name = validate_name(&name)?;
            domains.remove(&name).await?;
            if background {
                out(format_args!(
                    "{name} marked for removal; a running server deletes its data in the background (see its log)"
                ))?;
            } else {
                let services = service_domains(cfg, &name);
                let n = domains
                    .purge(&name, &services, |n| {
                        let _ = out(format_args!("{name}: {n} accounts deleted so far"));
                    })
                    .await?;
                out(format_args!(
                    "removed {name}: {n} account(s) and their data deleted"
                ))?;
            }
        }
        DomainCommand::Set { name, settings } => {
            let mut s = domains.get(&name).await?.settings;
            for a in &settings {
                apply_setting(&mut s, a)?;
            }
            if let Some((c, k)) = s.certificate_pair() {
                crate::tls::TlsContext::load(c, k)?;
            }
            domains.set_settings(&name, s.clone()).await?;
            let text = settings_text(&s);
            out(format_args!(
                "{name}: {}",
                if text.is_empty() {
                    "no overrides"
                } else {
                    &text
                }
            ))?;
        }
    }
    domains.storage.backend.close().await;
    Ok(())
}
