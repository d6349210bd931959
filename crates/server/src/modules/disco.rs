//! Service Discovery (XEP-0030): `disco#info` and `disco#items` for the
//! server and for accounts.
//!
//! Features and identities come only from what enabled modules declared in
//! the hook registry (`HookRegistry::disco`) — there is no hand-kept list.
//! Each module declares a feature for the server's domain, for accounts'
//! bare JIDs, or both (`Scopes`); account services that clients look for
//! on the server (archive, inbox) are declared in both.
//! Account queries are answered for the account's owner; other requesters
//! get `<service-unavailable/>` as if the account did not exist
//! (XEP-0030 §3.1, presence-based visibility arrives with the roster).
//!
//! Hooks: iq handlers for `disco#info` and `disco#items`, server and account
//! scope. Storage: accounts (existence). Config: `[modules.disco]`.

use starling_core::disco::Scopes;
use starling_core::hooks::{HookRegistry, IqHandler, IqResponse, IqScope};
use starling_core::module::{Module, ModuleCtx};
use starling_core::{async_trait, Env};
use starling_proto::{ns, Stanza, StanzaErrorCondition};
use starling_xml::Element;
use std::sync::Arc;

/// `[modules.disco]`: XEP-0030.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoConfig {
    /// Answer service discovery queries.
    pub enabled: bool,
    /// Name shown in the server identity.
    pub server_name: String,
}

impl Default for DiscoConfig {
    fn default() -> Self {
        DiscoConfig {
            enabled: true,
            server_name: "Starling".into(),
        }
    }
}

const NAME: &str = "disco";

/// The disco module.
pub struct Disco;

impl Disco {
    /// Registers the module.
    pub fn register(cfg: &DiscoConfig, reg: &mut HookRegistry) {
        let m = Arc::new(Disco);
        for scope in [IqScope::Server, IqScope::Account] {
            reg.iq(NAME, scope, "query", ns::DISCO_INFO, m.clone());
            reg.iq(NAME, scope, "query", ns::DISCO_ITEMS, m.clone());
        }
        reg.disco()
            .feature(Scopes::BOTH, ns::DISCO_INFO)
            .feature(Scopes::BOTH, ns::DISCO_ITEMS);
        reg.disco()
            .identity(IqScope::Server, "server", "im", Some(&cfg.server_name))
            .identity(IqScope::Account, "account", "registered", None);
    }
}

#[async_trait]
impl IqHandler for Disco {
    async fn handle_iq(&self, env: &Env, scope: IqScope, iq: &Stanza) -> IqResponse {
        if iq.type_attr() != Some("get") {
            return IqResponse::Error(StanzaErrorCondition::BadRequest.into());
        }
        let Some(query) = iq.payload() else {
            return IqResponse::Error(StanzaErrorCondition::BadRequest.into());
        };
        if scope == IqScope::Account {
            let owner = match (iq.from(), iq.to()) {
                (Some(f), Some(t)) => f.to_bare() == t.to_bare(),
                (Some(_), None) => true,
                _ => false,
            };
            if !owner {
                return IqResponse::Error(StanzaErrorCondition::ServiceUnavailable.into());
            }
        }
        let node = query.attr("node");
        if node.is_some() {
            // No module publishes disco nodes yet.
            return IqResponse::Error(StanzaErrorCondition::ItemNotFound.into());
        }
        let mut out = Element::new("query", query.ns());
        if query.ns() == ns::DISCO_INFO {
            for id in env.hooks.disco.identities(scope) {
                let mut e = Element::builder("identity", ns::DISCO_INFO)
                    .attr("category", id.category.clone())
                    .attr("type", id.kind.clone())
                    .build();
                if let Some(n) = &id.name {
                    e.set_attr("name", n.clone());
                }
                out.append_child(e);
            }
            for f in env.hooks.disco.features(scope) {
                out.append_child(
                    Element::builder("feature", ns::DISCO_INFO)
                        .attr("var", f.clone())
                        .build(),
                );
            }
        }
        // disco#items of the server: its local services (XEP-0030 §4.3).
        if query.ns() == ns::DISCO_ITEMS && scope == IqScope::Server {
            if let Some(domain) = iq.to().map(|t| t.domain().as_str().to_owned()) {
                for (jid, name) in env.hooks.services_of(&domain) {
                    let mut item = Element::builder("item", ns::DISCO_ITEMS)
                        .attr("jid", jid)
                        .build();
                    if !name.is_empty() {
                        item.set_attr("name", name);
                    }
                    out.append_child(item);
                }
            }
        }
        IqResponse::Result(Some(out))
    }
}

impl Module for Disco {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str = "XEP-0030 service discovery of the server and accounts";
    type Config = DiscoConfig;

    fn enabled(cfg: &DiscoConfig) -> bool {
        cfg.enabled
    }

    async fn start(cfg: &DiscoConfig, _ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        Disco::register(cfg, reg);
    }
}
