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
//! The server's `disco#info` carries its contact addresses (XEP-0157) as an
//! extended-information form (XEP-0128, `FORM_TYPE`
//! `http://jabber.org/network/serverinfo`) when `[modules.disco.contact]`
//! names any, and the stream features carry the server's own entity
//! capabilities (XEP-0115 §6.3, asked by XEP-0479 Core): a `<c/>` whose
//! `ver` is the hash of that `disco#info`, which is also answered at
//! `node#ver`.
//!
//! Hooks: iq handlers for `disco#info` and `disco#items`, server and account
//! scope; a stream-feature provider. Storage: accounts (existence).
//! Config: `[modules.disco]`.

use starling_core::disco::Scopes;
use starling_core::hooks::{
    FeatureStage, HookRegistry, IqHandler, IqResponse, IqScope, SessionInfo, StreamFeatureProvider,
};
use starling_core::module::{Module, ModuleCtx};
use starling_core::{async_trait, Env};
use starling_proto::{ns, Stanza, StanzaErrorCondition};
use starling_xml::Element;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// The `node` of the server's entity capabilities (XEP-0115 §4).
pub const CAPS_NODE: &str = "https://starling.chat/caps";
const NS_CAPS: &str = "http://jabber.org/protocol/caps";
const NS_SERVERINFO: &str = "http://jabber.org/network/serverinfo";
/// The address kinds of XEP-0157 §3.
const CONTACT_KINDS: &[&str] = &[
    "abuse", "admin", "feedback", "sales", "security", "status", "support",
];

/// `[modules.disco]`: XEP-0030.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoConfig {
    /// Answer service discovery queries.
    pub enabled: bool,
    /// Name shown in the server identity.
    pub server_name: String,
    /// Contact addresses (XEP-0157): `abuse`, `admin`, `feedback`, `sales`,
    /// `security`, `status`, `support`, each a list of URIs (`mailto:`,
    /// `xmpp:`, `https:`…).
    pub contact: BTreeMap<String, Vec<String>>,
}

impl Default for DiscoConfig {
    fn default() -> Self {
        DiscoConfig {
            enabled: true,
            server_name: "Starling".into(),
            contact: BTreeMap::new(),
        }
    }
}

const NAME: &str = "disco";

/// The disco module.
pub struct Disco {
    /// The XEP-0128 forms of the server's `disco#info`.
    server_forms: Vec<Element>,
    /// The server's caps `ver`, computed once every module has declared
    /// its features (on first use).
    /// One per set of modules switched off (a domain's
    /// `disabled_modules`), most deployments have one.
    ver: Mutex<HashMap<u64, Arc<str>>>,
}

impl Disco {
    /// Registers the module.
    pub fn register(cfg: &DiscoConfig, reg: &mut HookRegistry) {
        let mut server_forms = Vec::new();
        if !cfg.contact.is_empty() {
            let mut form = starling_core::forms::FormBuilder::new("result", Some(NS_SERVERINFO));
            for (kind, uris) in &cfg.contact {
                let values: Vec<&str> = uris.iter().map(String::as_str).collect();
                form = form.field(&format!("{kind}-addresses"), "list-multi", None, &values);
            }
            server_forms.push(form.build());
        }
        let m = Arc::new(Disco {
            server_forms,
            ver: Mutex::default(),
        });
        reg.stream_features(m.clone());
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
        // What the addressed domain switches off is neither listed nor
        // counted in its caps.
        let off = iq
            .to()
            .or(iq.from())
            .and_then(|t| env.hosts.modules_off(t.domain().as_str()))
            .unwrap_or(0);
        // The only node: the server's capabilities (XEP-0115 §6.2).
        let caps_node = node.is_some_and(|n| {
            scope == IqScope::Server
                && query.ns() == ns::DISCO_INFO
                && n == format!("{CAPS_NODE}#{}", self.ver(env, off))
        });
        if node.is_some() && !caps_node {
            return IqResponse::Error(StanzaErrorCondition::ItemNotFound.into());
        }
        let mut out = Element::new("query", query.ns());
        if let Some(n) = node {
            out.set_attr("node", n);
        }
        if query.ns() == ns::DISCO_INFO {
            for id in env.hooks.disco.identities(scope, off) {
                let mut e = Element::builder("identity", ns::DISCO_INFO)
                    .attr("category", id.category.clone())
                    .attr("type", id.kind.clone())
                    .build();
                if let Some(n) = &id.name {
                    e.set_attr("name", n.clone());
                }
                out.append_child(e);
            }
            for f in env.hooks.disco.features(scope, off) {
                out.append_child(
                    Element::builder("feature", ns::DISCO_INFO)
                        .attr("var", f)
                        .build(),
                );
            }
            if scope == IqScope::Server {
                for form in &self.server_forms {
                    out.append_child(form.clone());
                }
            }
        }
        // disco#items of the server: its local services (XEP-0030 §4.3).
        if query.ns() == ns::DISCO_ITEMS && scope == IqScope::Server {
            if let Some(domain) = iq.to().map(|t| t.domain().as_str().to_owned()) {
                for (jid, name) in env.hooks.services_of(&domain, off) {
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

impl Disco {
    /// The server's caps `ver` for a domain that switches off the modules
    /// in `off`: the sha-1 of its `disco#info` verification string
    /// (XEP-0115 §5.1).
    fn ver(&self, env: &Env, off: u64) -> Arc<str> {
        let mut cache = self.ver.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry(off)
            .or_insert_with(|| self.compute_ver(env, off).into())
            .clone()
    }

    fn compute_ver(&self, env: &Env, off: u64) -> String {
        {
            use base64::Engine;
            use sha1::Digest;
            let mut ids: Vec<String> = env
                .hooks
                .disco
                .identities(IqScope::Server, off)
                .map(|i| {
                    format!(
                        "{}/{}//{}",
                        i.category,
                        i.kind,
                        i.name.as_deref().unwrap_or("")
                    )
                })
                .collect();
            ids.sort();
            let mut features: Vec<&str> = env.hooks.disco.features(IqScope::Server, off).collect();
            features.sort();
            features.dedup();
            let mut s = String::new();
            for i in &ids {
                s.push_str(i);
                s.push('<');
            }
            for f in features {
                s.push_str(f);
                s.push('<');
            }
            for form in &self.server_forms {
                let sub = starling_core::forms::Submitted::parse(form);
                s.push_str(sub.form_type().unwrap_or(""));
                s.push('<');
                let mut vars: Vec<&str> = sub.vars().filter(|v| *v != "FORM_TYPE").collect();
                vars.sort_unstable();
                vars.dedup();
                for v in vars {
                    s.push_str(v);
                    s.push('<');
                    let mut values: Vec<&String> =
                        sub.values(v).unwrap_or_default().iter().collect();
                    values.sort();
                    for value in values {
                        s.push_str(value);
                        s.push('<');
                    }
                }
            }
            base64::engine::general_purpose::STANDARD.encode(sha1::Sha1::digest(s.as_bytes()))
        }
    }
}

impl StreamFeatureProvider for Disco {
    /// XEP-0115 §6.3: the server's capabilities in its stream features.
    fn stream_features(
        &self,
        env: &Env,
        info: &SessionInfo,
        stage: FeatureStage,
        out: &mut Vec<Element>,
    ) {
        if stage == FeatureStage::PostAuth {
            out.push(
                Element::builder("c", NS_CAPS)
                    .attr("hash", "sha-1")
                    .attr("node", CAPS_NODE)
                    .attr("ver", &*self.ver(env, info.modules_off()))
                    .build(),
            );
        }
    }
}

impl Module for Disco {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str = "XEP-0030 service discovery of the server and accounts";
    type Config = DiscoConfig;

    fn enabled(cfg: &DiscoConfig) -> bool {
        cfg.enabled
    }

    fn validate(
        cfg: &DiscoConfig,
        _domains: &[String],
    ) -> Result<(), starling_core::module::ConfigProblem> {
        for (kind, uris) in &cfg.contact {
            if !CONTACT_KINDS.contains(&kind.as_str()) {
                return Err(starling_core::module::ConfigProblem::new(
                    "contact",
                    format!(
                        "'{kind}' is not an XEP-0157 address kind; use one of {}",
                        CONTACT_KINDS.join(", ")
                    ),
                ));
            }
            if let Some(u) = uris
                .iter()
                .find(|u| !u.contains(':') || u.chars().any(char::is_whitespace))
            {
                return Err(starling_core::module::ConfigProblem::new(
                    "contact",
                    format!("'{u}' under {kind} is not a URI (write mailto:…, xmpp:… or https:…)"),
                ));
            }
        }
        Ok(())
    }

    async fn start(cfg: &DiscoConfig, _ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        Disco::register(cfg, reg);
    }
}
