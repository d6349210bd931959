//! Software Version (XEP-0092) of the server.
//!
//! Answers `jabber:iq:version` queries addressed to the server with the
//! name "Starling" and this build's version; the operating system only when
//! `show_os` is on (it helps attackers more than users). Queries to a
//! user's full JID are routed to the client, which answers for itself.
//!
//! Hooks: iq handler `{jabber:iq:version}query` (server scope).
//! Config: `[modules.version]`.

use starling_core::hooks::{HookRegistry, IqHandler, IqResponse, IqScope};
use starling_core::module::{Module, ModuleCtx};
use starling_core::{async_trait, Env};
use starling_proto::{Stanza, StanzaErrorCondition};
use starling_xml::Element;
use std::sync::Arc;

/// `[modules.version]`: XEP-0092.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VersionConfig {
    /// Answer software version queries.
    pub enabled: bool,
    /// Include the operating system in the answer.
    pub show_os: bool,
}

impl Default for VersionConfig {
    fn default() -> Self {
        VersionConfig {
            enabled: true,
            show_os: false,
        }
    }
}

const NAME: &str = "version";
/// XEP-0092 namespace.
pub const NS_VERSION: &str = "jabber:iq:version";

/// The version module.
pub struct Version {
    os: Option<String>,
}

impl Version {
    /// Registers the module.
    pub fn register(cfg: &VersionConfig, reg: &mut HookRegistry) {
        let os = cfg.show_os.then(|| {
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
            format!("{} {}", std::env::consts::OS, release.trim())
                .trim()
                .to_owned()
        });
        reg.iq(
            NAME,
            IqScope::Server,
            "query",
            NS_VERSION,
            Arc::new(Version { os }),
        );
        reg.disco().feature(IqScope::Server, NS_VERSION);
    }
}

#[async_trait]
impl IqHandler for Version {
    async fn handle_iq(&self, _env: &Env, _scope: IqScope, iq: &Stanza) -> IqResponse {
        if iq.type_attr() != Some("get") {
            return IqResponse::Error(StanzaErrorCondition::BadRequest.into());
        }
        let mut q = Element::new("query", NS_VERSION);
        q.append_child(
            Element::builder("name", NS_VERSION)
                .text("Starling")
                .build(),
        );
        q.append_child(
            Element::builder("version", NS_VERSION)
                .text(env!("CARGO_PKG_VERSION"))
                .build(),
        );
        if let Some(os) = &self.os {
            q.append_child(Element::builder("os", NS_VERSION).text(os.clone()).build());
        }
        IqResponse::Result(Some(q))
    }
}

impl Module for Version {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str = "XEP-0092 software version";
    type Config = VersionConfig;

    fn enabled(cfg: &VersionConfig) -> bool {
        cfg.enabled
    }

    async fn start(cfg: &VersionConfig, _ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        Version::register(cfg, reg);
    }
}
