//! Private XML Storage (XEP-0049).
//!
//! A user stores and fetches XML fragments keyed by their element's name
//! and namespace, on their own account only (`<forbidden/>` otherwise, as
//! the XEP prefers). A get or set without a child gets `<bad-request/>`
//! (the XEP's "Bad Format"); fragments in reserved namespaces
//! (`jabber:*`, `http://jabber.org/*`, `vcard-temp`) and fragments larger
//! than `max_bytes` get `<not-acceptable/>`. A get of a fragment never
//! stored returns it empty.
//!
//! A fragment another module serves (`PrivateFragmentHandler`: PEP makes
//! XEP-0048 bookmarks a view of XEP-0402's, XEP-0402 §5.3) is got and set
//! through that module.
//!
//! Hooks: iq handler `{jabber:iq:private}query` (account scope). Storage:
//! user_data (kind "private"). Config: `[modules.private]`.

use starling_core::hooks::{HookRegistry, IqHandler, IqResponse, IqScope};
use starling_core::module::{Module, ModuleCtx};
use starling_core::{async_trait, Env};
use starling_proto::{ErrorType, Stanza, StanzaError, StanzaErrorCondition};
use starling_xml::Element;
use std::sync::Arc;

/// `[modules.private]`: XEP-0049 private XML storage.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrivateConfig {
    /// Run the module.
    pub enabled: bool,
    /// Largest document stored, in bytes of serialized XML.
    pub max_bytes: usize,
}

impl Default for PrivateConfig {
    fn default() -> Self {
        PrivateConfig {
            enabled: true,
            max_bytes: 64 * 1024,
        }
    }
}

const NAME: &str = "private";
/// XEP-0049 namespace.
pub const NS_PRIVATE: &str = "jabber:iq:private";

/// The private storage module.
pub struct Private {
    max_bytes: usize,
}

impl Private {
    /// Registers the module.
    pub fn register(cfg: &PrivateConfig, reg: &mut HookRegistry) {
        let m = Arc::new(Private {
            max_bytes: cfg.max_bytes,
        });
        reg.iq(NAME, IqScope::Account, "query", NS_PRIVATE, m);
        reg.disco().feature(IqScope::Server, NS_PRIVATE);
    }
}

fn key(el: &Element) -> String {
    format!("{{{}}}{}", el.ns(), el.name())
}

fn reserved(ns: &str) -> bool {
    ns.starts_with("jabber:") || ns.starts_with("http://jabber.org/") || ns == "vcard-temp"
}

fn err(c: StanzaErrorCondition, text: &str) -> IqResponse {
    IqResponse::Error(StanzaError::new(c).with_text(text))
}

#[async_trait]
impl IqHandler for Private {
    async fn handle_iq(&self, env: &Env, _scope: IqScope, iq: &Stanza) -> IqResponse {
        let Some(owner) = iq.from().map(|f| f.to_bare()) else {
            return IqResponse::Error(StanzaErrorCondition::BadRequest.into());
        };
        if iq.to().is_some_and(|t| t.to_bare() != owner) {
            return err(
                StanzaErrorCondition::Forbidden,
                "private data belongs to its owner only",
            );
        }
        let Some(query) = iq.payload() else {
            return IqResponse::Error(StanzaErrorCondition::BadRequest.into());
        };
        let fragments: Vec<&Element> = query.children().collect();
        if fragments.is_empty() {
            return err(
                StanzaErrorCondition::BadRequest,
                "name the fragment to get or set",
            );
        }
        if let [f] = fragments[..] {
            if let Some(h) = env.hooks.private_fragment(&key(f)) {
                return match iq.type_attr() {
                    Some("get") => match h.get(env, &owner).await {
                        Ok(el) => {
                            let mut out = Element::new("query", NS_PRIVATE);
                            out.append_child(el);
                            IqResponse::Result(Some(out))
                        }
                        Err(e) => IqResponse::Error(e),
                    },
                    Some("set") => {
                        if f.to_string_in("").len() > self.max_bytes {
                            return err(
                                StanzaErrorCondition::NotAcceptable,
                                &format!("a fragment is larger than {} bytes", self.max_bytes),
                            );
                        }
                        match h.set(env, &owner, f).await {
                            Ok(()) => IqResponse::Result(None),
                            Err(e) => IqResponse::Error(e),
                        }
                    }
                    _ => IqResponse::Error(StanzaErrorCondition::BadRequest.into()),
                };
            }
        }
        if let Some(f) = fragments.iter().find(|f| reserved(f.ns())) {
            return err(
                StanzaErrorCondition::NotAcceptable,
                &format!("the namespace {} is reserved", f.ns()),
            );
        }
        let storage_error = |e: starling_core::storage::StorageError| {
            tracing::error!(error = %e, user = %owner, "private storage failed");
            IqResponse::Error(
                StanzaError::new(StanzaErrorCondition::InternalServerError)
                    .with_type(ErrorType::Wait),
            )
        };
        match iq.type_attr() {
            Some("get") => {
                if fragments.len() > 1 {
                    // §3: one namespace per get.
                    return err(StanzaErrorCondition::NotAcceptable, "one fragment per get");
                }
                let f = fragments[0];
                let stored = match env.storage.user_data.get(&owner, NAME, &key(f)).await {
                    Ok(v) => v.and_then(|x| x.parse::<Element>().ok()),
                    Err(e) => return storage_error(e),
                };
                let mut out = Element::new("query", NS_PRIVATE);
                out.append_child(stored.unwrap_or_else(|| Element::new(f.name(), f.ns())));
                IqResponse::Result(Some(out))
            }
            Some("set") => {
                let mut docs = Vec::with_capacity(fragments.len());
                for f in &fragments {
                    let xml = f.to_string_in("");
                    if xml.len() > self.max_bytes {
                        return err(
                            StanzaErrorCondition::NotAcceptable,
                            &format!("a fragment is larger than {} bytes", self.max_bytes),
                        );
                    }
                    docs.push((key(f), xml, *f));
                }
                for (k, xml, f) in docs {
                    if let Some(h) = env.hooks.private_fragment(&k) {
                        if let Err(e) = h.set(env, &owner, f).await {
                            return IqResponse::Error(e);
                        }
                    } else if let Err(e) = env.storage.user_data.set(&owner, NAME, &k, &xml).await {
                        return storage_error(e);
                    }
                }
                IqResponse::Result(None)
            }
            _ => IqResponse::Error(StanzaErrorCondition::BadRequest.into()),
        }
    }
}

impl Module for Private {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str = "XEP-0049 private XML storage";
    type Config = PrivateConfig;
    const STORAGE: &'static [&'static str] = &["user_data"];

    fn enabled(cfg: &PrivateConfig) -> bool {
        cfg.enabled
    }

    async fn start(cfg: &PrivateConfig, _ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        Private::register(cfg, reg);
    }
}
