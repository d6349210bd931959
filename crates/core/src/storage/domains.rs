//! Domains added at run time (docs/domains.md): the `domains` table,
//! with per-domain settings and one change counter that every node polls.

use super::StorageResult;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The life of a stored domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DomainState {
    /// Served.
    Enabled,
    /// Kept with its data, not served: streams to it get `host-unknown`.
    Disabled,
    /// Not served; its data is being deleted (a restarted server resumes
    /// the deletion), after which the row goes.
    Removing,
}

impl DomainState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            DomainState::Enabled => "enabled",
            DomainState::Disabled => "disabled",
            DomainState::Removing => "removing",
        }
    }

    /// The state a stored name names.
    pub fn parse(s: &str) -> Option<DomainState> {
        match s {
            "enabled" => Some(DomainState::Enabled),
            "disabled" => Some(DomainState::Disabled),
            "removing" => Some(DomainState::Removing),
            _ => None,
        }
    }
}

/// What a domain overrides of the global configuration. Every field is
/// optional: `None` means "as configured for the whole server". Stored
/// as JSON with a format version (`v`), unknown keys ignored, so a newer
/// node's settings stay readable by an older one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DomainSettings {
    /// In-band registration (XEP-0077) on or off for this domain,
    /// overriding `[modules.register] enabled`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registration: Option<bool>,
    /// Archive retention in days (0: forever), overriding
    /// `[modules.mam] retention_days` / `domain_retention_days`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archive_retention_days: Option<u32>,
    /// Most sessions bound at once on one node for this domain; a bind
    /// beyond it is refused with `resource-constraint`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<u32>,
    /// The domain's own certificate chain (PEM), used by SNI when the
    /// `[tls]` certificate does not cover the domain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificate: Option<PathBuf>,
    /// The private key of `certificate` (PEM).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub private_key: Option<PathBuf>,
    /// Modules switched off for this domain (their names, as in
    /// `[modules.<name>]`): they run for the other domains, and for this
    /// one they answer nothing, advertise nothing and store nothing
    /// (docs/domains.md "Modules per domain").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled_modules: Option<Vec<String>>,
}

/// The stored format version of [`DomainSettings`].
const SETTINGS_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Versioned {
    v: u32,
    #[serde(flatten)]
    settings: DomainSettings,
}

impl DomainSettings {
    /// The stored form.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&Versioned {
            v: SETTINGS_VERSION,
            settings: self.clone(),
        })
        .unwrap_or_else(|_| "{\"v\":1}".to_owned())
    }

    /// Reads the stored form; `None` if it is not JSON of this shape.
    pub fn from_json(s: &str) -> Option<DomainSettings> {
        serde_json::from_str::<Versioned>(s)
            .ok()
            .map(|v| v.settings)
    }

    /// The certificate and key pair, when both are set.
    pub fn certificate_pair(&self) -> Option<(&std::path::Path, &std::path::Path)> {
        Some((self.certificate.as_deref()?, self.private_key.as_deref()?))
    }
}

/// One stored domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredDomain {
    /// The domain (normalised, lower case).
    pub name: String,
    /// Served, disabled or being removed.
    pub state: DomainState,
    /// Its overrides.
    pub settings: DomainSettings,
    /// When it was added, milliseconds since the Unix epoch.
    pub created_at: i64,
    /// The change counter's value at this row's last change.
    pub version: i64,
}

/// Domains added at run time. Every change increments one counter
/// ([`DomainStore::domains_version`]); a node that polls it learns in one
/// primary-key read whether anything changed, then reads the table.
#[async_trait]
pub trait DomainStore: Send + Sync + 'static {
    /// Stores a new domain (its `version` is assigned). Fails with
    /// [`super::StorageError::Conflict`] if the name exists.
    async fn add_domain(&self, domain: &StoredDomain) -> StorageResult<()>;
    /// One domain.
    async fn domain(&self, name: &str) -> StorageResult<Option<StoredDomain>>;
    /// Every stored domain, by name.
    async fn domains(&self) -> StorageResult<Vec<StoredDomain>>;
    /// Changes a domain's state. False if there is no such domain.
    async fn set_domain_state(&self, name: &str, state: DomainState) -> StorageResult<bool>;
    /// Replaces a domain's settings. False if there is no such domain.
    async fn set_domain_settings(
        &self,
        name: &str,
        settings: &DomainSettings,
    ) -> StorageResult<bool>;
    /// Deletes the row (its data must be gone already). False if there
    /// was none.
    async fn delete_domain(&self, name: &str) -> StorageResult<bool>;
    /// The change counter: it grows with every add, state or settings
    /// change and deletion.
    async fn domains_version(&self) -> StorageResult<i64>;
}
