//! Built-in modules, one file per module. Each implements
//! [`starling_core::module::Module`]: its name, its configuration struct
//! (defined and documented in its file, parsed from `[modules.<name>]`),
//! the storage it uses, the modules it needs, and `start`, which registers
//! its hooks. [`MODULES`] is the one list of them; [`ModulesSection`] holds
//! each one's parsed configuration. A module that is not enabled registers
//! nothing and runs no code, and no module imports another (they cooperate
//! through hooks and the contract types of `starling-core`).

pub mod blocking;
pub mod carbons;
pub mod common;
pub mod component;
pub mod csi;
pub mod disco;
pub mod extdisco;
pub mod inbox;
pub mod last;
pub mod mam;
pub mod muc;
pub mod offline;
pub mod pep;
pub mod ping;
pub mod presence;
pub mod private;
pub mod proxy65;
pub mod pubsub;
pub mod register;
pub mod roster;
pub mod sm;
pub mod time;
pub mod upload;
pub mod vcard;
pub mod version;

pub use blocking::Blocking;
pub use carbons::Carbons;
pub use component::Component;
pub use csi::Csi;
pub use disco::Disco;
pub use extdisco::Extdisco;
pub use inbox::Inbox;
pub use last::Last;
pub use mam::Mam;
pub use muc::light::MucLight;
pub use muc::Muc;
pub use offline::Offline;
pub use pep::Pep;
pub use ping::Ping;
pub use presence::Presence;
pub use private::Private;
pub use proxy65::Proxy65;
pub use pubsub::Pubsub;
pub use register::Register;
pub use roster::Roster;
pub use sm::StreamManagement;
pub use time::Time;
pub use upload::Upload;
pub use vcard::Vcard;
pub use version::Version;

use serde::Deserialize as _;
use starling_core::hooks::HookRegistry;
use starling_core::module::{ConfigProblem, Module, ModuleCtx};
use starling_core::storage::{OwnedData, SchemaStep, Storage, StoreSuite};
use std::any::Any;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;

/// Every module the server knows, in registration order (handlers of equal
/// priority run in this order). Adding a module is one line here.
pub static MODULES: &[&dyn ModuleEntry] = &[
    &Entry::<Presence>(PhantomData),
    &Entry::<Roster>(PhantomData),
    &Entry::<Ping>(PhantomData),
    &Entry::<Disco>(PhantomData),
    &Entry::<Register>(PhantomData),
    &Entry::<Blocking>(PhantomData),
    &Entry::<Vcard>(PhantomData),
    &Entry::<Private>(PhantomData),
    &Entry::<Last>(PhantomData),
    &Entry::<Offline>(PhantomData),
    &Entry::<Csi>(PhantomData),
    &Entry::<StreamManagement>(PhantomData),
    &Entry::<Carbons>(PhantomData),
    &Entry::<Mam>(PhantomData),
    &Entry::<Inbox>(PhantomData),
    &Entry::<Muc>(PhantomData),
    &Entry::<MucLight>(PhantomData),
    &Entry::<Proxy65>(PhantomData),
    &Entry::<Component>(PhantomData),
    &Entry::<Pep>(PhantomData),
    &Entry::<Pubsub>(PhantomData),
    &Entry::<Upload>(PhantomData),
    &Entry::<Extdisco>(PhantomData),
    &Entry::<Version>(PhantomData),
    &Entry::<Time>(PhantomData),
];

/// Every module's schema steps ([`Module::SCHEMA`]), enabled or not.
pub fn schema() -> Vec<SchemaStep> {
    MODULES.iter().flat_map(|m| m.schema()).copied().collect()
}

/// Every module's store conformance suites ([`Module::STORE_SUITES`]),
/// with the module's name.
pub fn store_suites() -> Vec<(&'static str, StoreSuite)> {
    MODULES
        .iter()
        .flat_map(|m| m.store_suites().iter().map(move |s| (m.name(), *s)))
        .collect()
}

/// `storage` with every module's [`OwnedData`] (enabled or not), so that
/// deleting an account or a domain reaches what modules store on their
/// own.
pub fn with_owned_data(mut storage: Storage) -> Storage {
    let owned: Vec<Arc<dyn OwnedData>> = MODULES
        .iter()
        .filter_map(|m| m.owned_data(&storage))
        .collect();
    storage.owned = owned.into();
    storage
}

/// Opens `backend` as the server does: the backend's schema and every
/// module's, and every module's owned data attached. Commands and tests
/// open a server's storage through this (`starling_storage::open` alone
/// knows no module's tables).
pub async fn open_storage(
    backend: &starling_storage::BackendConfig,
) -> Result<Storage, starling_storage::OpenError> {
    let options = starling_storage::OpenOptions {
        schema: schema(),
        ..Default::default()
    };
    let storage = starling_storage::open_with(backend, &options).await?;
    Ok(with_owned_data(storage))
}

/// A module's configuration, type-erased so the `[modules]` section can
/// hold every module's own struct.
pub trait AnyConfig: Any + fmt::Debug + Send + Sync {
    /// A boxed copy.
    fn clone_box(&self) -> Box<dyn AnyConfig>;
    /// For downcasting to the module's struct.
    fn as_any(&self) -> &dyn Any;
    /// For downcasting to the module's struct.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: Any + fmt::Debug + Clone + Send + Sync> AnyConfig for T {
    fn clone_box(&self) -> Box<dyn AnyConfig> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

type StartFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// A [`Module`] seen through a type-erased entry of [`MODULES`].
pub trait ModuleEntry: Sync {
    /// [`Module::NAME`].
    fn name(&self) -> &'static str;
    /// [`Module::SUMMARY`].
    fn summary(&self) -> &'static str;
    /// [`Module::STORAGE`].
    fn storage(&self) -> &'static [&'static str];
    /// [`Module::NEEDS`].
    fn needs(&self) -> &'static [&'static str];
    /// [`Module::HTTP`].
    fn http(&self) -> bool;
    /// [`Module::SCHEMA`].
    fn schema(&self) -> &'static [SchemaStep];
    /// [`Module::ADMIN_PATHS`].
    fn admin_paths(&self) -> &'static [&'static str];
    /// [`Module::STORE_SUITES`].
    fn store_suites(&self) -> &'static [StoreSuite];
    /// [`Module::owned_data`].
    fn owned_data(&self, storage: &Storage) -> Option<Arc<dyn OwnedData>>;
    /// [`Module::subdomain`].
    fn subdomain<'c>(&self, cfg: &'c dyn AnyConfig) -> Option<&'c str>;
    /// [`Module::claimed_domains`].
    fn claimed_domains(&self, cfg: &dyn AnyConfig) -> (&'static str, Vec<String>);
    /// The default configuration.
    fn default_config(&self) -> Box<dyn AnyConfig>;
    /// Parses the module's `[modules.<name>]` table.
    fn parse(&self, table: toml::Value) -> Result<Box<dyn AnyConfig>, String>;
    /// [`Module::enabled`].
    fn enabled(&self, cfg: &dyn AnyConfig) -> bool;
    /// [`Module::validate`].
    fn validate(&self, cfg: &dyn AnyConfig, domains: &[String]) -> Result<(), ConfigProblem>;
    /// [`Module::start`].
    fn start<'a>(
        &'a self,
        cfg: &'a dyn AnyConfig,
        ctx: &'a ModuleCtx<'a>,
        reg: &'a mut HookRegistry,
    ) -> StartFuture<'a>;
}

struct Entry<M>(PhantomData<fn() -> M>);

fn downcast<M: Module>(cfg: &dyn AnyConfig) -> &M::Config {
    cfg.as_any()
        .downcast_ref::<M::Config>()
        .expect("each module's entry holds its own configuration type")
}

impl<M: Module> ModuleEntry for Entry<M> {
    fn name(&self) -> &'static str {
        M::NAME
    }
    fn summary(&self) -> &'static str {
        M::SUMMARY
    }
    fn storage(&self) -> &'static [&'static str] {
        M::STORAGE
    }
    fn needs(&self) -> &'static [&'static str] {
        M::NEEDS
    }
    fn http(&self) -> bool {
        M::HTTP
    }
    fn schema(&self) -> &'static [SchemaStep] {
        M::SCHEMA
    }
    fn admin_paths(&self) -> &'static [&'static str] {
        M::ADMIN_PATHS
    }
    fn store_suites(&self) -> &'static [StoreSuite] {
        M::STORE_SUITES
    }
    fn owned_data(&self, storage: &Storage) -> Option<Arc<dyn OwnedData>> {
        M::owned_data(storage)
    }
    fn subdomain<'c>(&self, cfg: &'c dyn AnyConfig) -> Option<&'c str> {
        M::subdomain(downcast::<M>(cfg))
    }
    fn claimed_domains(&self, cfg: &dyn AnyConfig) -> (&'static str, Vec<String>) {
        M::claimed_domains(downcast::<M>(cfg))
    }
    fn default_config(&self) -> Box<dyn AnyConfig> {
        Box::new(M::Config::default())
    }
    fn parse(&self, table: toml::Value) -> Result<Box<dyn AnyConfig>, String> {
        M::Config::deserialize(table)
            .map(|c| Box::new(c) as Box<dyn AnyConfig>)
            .map_err(|e| e.to_string())
    }
    fn enabled(&self, cfg: &dyn AnyConfig) -> bool {
        M::enabled(downcast::<M>(cfg))
    }
    fn validate(&self, cfg: &dyn AnyConfig, domains: &[String]) -> Result<(), ConfigProblem> {
        M::validate(downcast::<M>(cfg), domains)
    }
    fn start<'a>(
        &'a self,
        cfg: &'a dyn AnyConfig,
        ctx: &'a ModuleCtx<'a>,
        reg: &'a mut HookRegistry,
    ) -> StartFuture<'a> {
        Box::pin(M::start(downcast::<M>(cfg), ctx, reg))
    }
}

/// `[modules]`: one table per module of [`MODULES`], each parsed into that
/// module's own configuration struct (documented beside the module).
pub struct ModulesSection {
    /// In [`MODULES`] order.
    configs: Vec<Box<dyn AnyConfig>>,
}

impl ModulesSection {
    fn index(name: &str) -> usize {
        MODULES
            .iter()
            .position(|m| m.name() == name)
            .unwrap_or_else(|| panic!("module {name} is not in MODULES"))
    }

    /// Module `M`'s configuration.
    pub fn get<M: Module>(&self) -> &M::Config {
        downcast::<M>(&*self.configs[Self::index(M::NAME)])
    }

    /// Module `M`'s configuration, to change it (tests, tools).
    pub fn get_mut<M: Module>(&mut self) -> &mut M::Config {
        self.configs[Self::index(M::NAME)]
            .as_any_mut()
            .downcast_mut::<M::Config>()
            .expect("each module's entry holds its own configuration type")
    }

    /// Whether the module called `name` is enabled (false for unknown names).
    pub fn is_enabled(&self, name: &str) -> bool {
        MODULES
            .iter()
            .zip(&self.configs)
            .any(|(m, c)| m.name() == name && m.enabled(&**c))
    }

    /// Every module with its configuration, in [`MODULES`] order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static dyn ModuleEntry, &dyn AnyConfig)> {
        MODULES
            .iter()
            .copied()
            .zip(self.configs.iter().map(|c| &**c))
    }

    /// Checks each module's values, the modules each enabled one needs,
    /// that a module served over HTTP has an HTTP listener
    /// (`http_listeners`), and that no module claims another's service
    /// address (`domains`: the served domains). Errors are
    /// `(dotted key, message)`.
    pub fn validate(
        &self,
        domains: &[String],
        http_listeners: bool,
    ) -> Result<(), (String, String)> {
        for (m, c) in self.iter() {
            if let Err(p) = m.validate(c, domains) {
                return Err((format!("modules.{}.{}", m.name(), p.key), p.message));
            }
            if !m.enabled(c) {
                continue;
            }
            for need in m.needs() {
                if !self.is_enabled(need) {
                    return Err((
                        format!("modules.{}.enabled", m.name()),
                        format!(
                            "the {} module needs the {need} module: enable [modules.{need}] or set [modules.{}] enabled = false",
                            m.name(),
                            m.name()
                        ),
                    ));
                }
            }
            if m.http() && !http_listeners {
                return Err((
                    format!("modules.{}.enabled", m.name()),
                    format!(
                        "the {0} module is served by the HTTP listeners: add an [[http.listen]] (tls = true for HTTPS) or set [modules.{0}] enabled = false",
                        m.name()
                    ),
                ));
            }
        }
        self.validate_claimed_domains(domains)
    }

    /// A domain a module claims (an external component's) must not be the
    /// address of another enabled module's service (`conference.<domain>`
    /// …): both would claim its stanzas. (Services registered otherwise
    /// are checked at start, when every service is known.)
    fn validate_claimed_domains(&self, domains: &[String]) -> Result<(), (String, String)> {
        let normalized = |d: &str| match starling_proto::BareJid::new(d) {
            Ok(j) if j.node().is_none() => Some(j.domain().as_str().to_owned()),
            _ => None,
        };
        let served: Vec<String> = domains.iter().filter_map(|d| normalized(d)).collect();
        let services: Vec<(&str, &str)> = self
            .iter()
            .filter(|(m, c)| m.enabled(*c))
            .filter_map(|(m, c)| Some((m.name(), m.subdomain(c)?)))
            .collect();
        for (m, c) in self.iter().filter(|(m, c)| m.enabled(*c)) {
            let (key, claimed) = m.claimed_domains(c);
            for domain in claimed {
                for (module, label) in &services {
                    let Some(host) = domain.strip_prefix(label).and_then(|r| r.strip_prefix('.'))
                    else {
                        continue;
                    };
                    if served.iter().any(|d| d == host) {
                        return Err((
                            format!("modules.{}.{key}", m.name()),
                            format!(
                                "{domain} is the address of the {module} service ({label}.{host}): give the {} another domain, or change [modules.{module}] subdomain",
                                m.name()
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

impl Default for ModulesSection {
    fn default() -> Self {
        ModulesSection {
            configs: MODULES.iter().map(|m| m.default_config()).collect(),
        }
    }
}

impl Clone for ModulesSection {
    fn clone(&self) -> Self {
        ModulesSection {
            configs: self.configs.iter().map(|c| (**c).clone_box()).collect(),
        }
    }
}

impl fmt::Debug for ModulesSection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.iter().map(|(m, c)| (m.name(), c)))
            .finish()
    }
}

impl<'de> serde::Deserialize<'de> for ModulesSection {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut tables = std::collections::BTreeMap::<String, toml::Value>::deserialize(d)?;
        let mut configs = Vec::with_capacity(MODULES.len());
        for m in MODULES {
            configs.push(match tables.remove(m.name()) {
                Some(t) => m
                    .parse(t)
                    .map_err(|e| D::Error::custom(format!("[modules.{}]: {e}", m.name())))?,
                None => m.default_config(),
            });
        }
        if let Some(unknown) = tables.keys().next() {
            let known: Vec<&str> = MODULES.iter().map(|m| m.name()).collect();
            return Err(D::Error::custom(format!(
                "unknown module `{unknown}`; known modules: {}",
                known.join(", ")
            )));
        }
        Ok(ModulesSection { configs })
    }
}
