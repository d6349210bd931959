//! vcard-temp (XEP-0054): profile cards.
//!
//! - A user sets their own vCard (`set` with no 'to' or to their own bare
//!   JID); setting anyone else's gets `<forbidden/>`. Cards larger than
//!   `max_bytes` of serialized XML get `<not-acceptable/>` with a text
//!   giving the limit, and change nothing.
//! - Anyone may fetch a user's vCard from their bare JID; a user without a
//!   card returns an empty `<vCard/>` (XEP-0054 §3.1); an unknown account
//!   gets `<service-unavailable/>` (RFC 6121 §8.5.1).
//!
//! - XEP-0398: with PEP on, a card without a `PHOTO` is served with the
//!   account's PEP avatar (`pep::avatar`); PEP turns a `PHOTO` set here
//!   into the PEP avatar.
//!
//! Hooks: iq handler `{vcard-temp}vCard` (account scope). Storage:
//! user_data (kind "vcard"), accounts. Config: `[modules.vcard]`.

use starling_core::hooks::{HookRegistry, IqHandler, IqResponse, IqScope};
use starling_core::module::{Module, ModuleCtx};
use starling_core::{async_trait, Env};
use starling_proto::{ErrorType, Stanza, StanzaError, StanzaErrorCondition};
use starling_xml::Element;
use std::sync::Arc;

/// `[modules.vcard]`: XEP-0054 vCards.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VcardConfig {
    /// Run the module.
    pub enabled: bool,
    /// Largest document stored, in bytes of serialized XML.
    pub max_bytes: usize,
}

impl Default for VcardConfig {
    fn default() -> Self {
        VcardConfig {
            enabled: true,
            max_bytes: 64 * 1024,
        }
    }
}

const NAME: &str = "vcard";
/// XEP-0054 namespace.
pub const NS_VCARD: &str = "vcard-temp";

/// The vCard module.
pub struct Vcard {
    max_bytes: usize,
    /// XEP-0398: a card without a photo shows the PEP avatar.
    pep: bool,
}

impl Vcard {
    /// Registers the module.
    pub fn register(cfg: &VcardConfig, pep: bool, reg: &mut HookRegistry) {
        let m = Arc::new(Vcard {
            max_bytes: cfg.max_bytes,
            pep,
        });
        reg.iq(NAME, IqScope::Account, "vCard", NS_VCARD, m);
        reg.disco().feature(IqScope::Server, NS_VCARD);
    }
}

fn storage_error(e: starling_core::storage::StorageError) -> IqResponse {
    tracing::error!(error = %e, "vCard storage failed");
    IqResponse::Error(
        StanzaError::new(StanzaErrorCondition::InternalServerError).with_type(ErrorType::Wait),
    )
}

#[async_trait]
impl IqHandler for Vcard {
    async fn handle_iq(&self, env: &Env, _scope: IqScope, iq: &Stanza) -> IqResponse {
        let Some(from) = iq.from().map(|f| f.to_bare()) else {
            return IqResponse::Error(StanzaErrorCondition::BadRequest.into());
        };
        let owner = iq.to().map(|t| t.to_bare()).unwrap_or_else(|| from.clone());
        let Some(card) = iq.payload() else {
            return IqResponse::Error(StanzaErrorCondition::BadRequest.into());
        };
        match iq.type_attr() {
            Some("get") => {
                if owner != from {
                    match env.storage.accounts.exists(&owner).await {
                        Ok(true) => {}
                        Ok(false) => {
                            return IqResponse::Error(
                                StanzaErrorCondition::ServiceUnavailable.into(),
                            )
                        }
                        Err(e) => return storage_error(e),
                    }
                }
                let mut card = match env.storage.user_data.get(&owner, NAME, "").await {
                    Ok(Some(xml)) => xml.parse::<Element>().unwrap_or_else(|e| {
                        tracing::error!(error = %e, user = %owner, "stored vCard does not parse");
                        Element::new("vCard", NS_VCARD)
                    }),
                    Ok(None) => Element::new("vCard", NS_VCARD),
                    Err(e) => return storage_error(e),
                };
                // XEP-0398 §3.2: no photo of its own, the PEP avatar's.
                if self.pep && !card.has_child("PHOTO", NS_VCARD) {
                    if let Some(photo) =
                        crate::modules::common::avatar::vcard_photo(env, &owner).await
                    {
                        card.append_child(photo);
                    }
                }
                IqResponse::Result(Some(card))
            }
            Some("set") => {
                if owner != from {
                    return IqResponse::Error(
                        StanzaError::new(StanzaErrorCondition::Forbidden)
                            .with_text("you can only set your own vCard"),
                    );
                }
                let xml = card.to_string_in("");
                if xml.len() > self.max_bytes {
                    return IqResponse::Error(
                        StanzaError::new(StanzaErrorCondition::NotAcceptable).with_text(format!(
                            "the vCard is larger than {} bytes",
                            self.max_bytes
                        )),
                    );
                }
                match env.storage.user_data.set(&owner, NAME, "", &xml).await {
                    Ok(()) => IqResponse::Result(None),
                    Err(e) => storage_error(e),
                }
            }
            _ => IqResponse::Error(StanzaErrorCondition::BadRequest.into()),
        }
    }
}

impl Module for Vcard {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str = "XEP-0054 vcard-temp";
    type Config = VcardConfig;
    const STORAGE: &'static [&'static str] = &["user_data"];

    fn enabled(cfg: &VcardConfig) -> bool {
        cfg.enabled
    }

    async fn start(cfg: &VcardConfig, ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        Vcard::register(cfg, (ctx.is_enabled)("pep"), reg);
    }
}
