//! Personal Eventing Protocol (XEP-0163): every account is a
//! publish-subscribe service (XEP-0060) at its bare JID, for the data its
//! clients share with contacts — OMEMO device lists and key bundles
//! (XEP-0384), avatars (XEP-0084), nicknames (XEP-0172), bookmarks
//! (XEP-0402) — with notifications filtered by what each client asked for
//! through entity capabilities (XEP-0115 `+notify`).
//!
//! What it does:
//! - publish with auto-create (XEP-0060 §7.1, XEP-0163 §7.1.1), item ids
//!   made by the service when absent, `publish-options` with precondition
//!   checks (§7.1.5: `conflict` + `precondition-not-met` when the node's
//!   configuration differs), persistent items with `max_items` (a number
//!   or `max`), retract (§7.2, notified with `notify='true'` or
//!   `pubsub#notify_retract`), items retrieval (§6.5: all, `max_items`,
//!   by id), node configuration (§8.2), default configuration (§8.3),
//!   purge (§8.5) and delete (§8.4) with their notifications;
//! - access models `presence` (the default: the owner and contacts with a
//!   subscription to the owner's presence), `open`, `roster` (contacts in
//!   `pubsub#roster_groups_allowed`) and `whitelist` (the owner only);
//!   errors as §6.5.9 says (`presence-subscription-required`,
//!   `not-in-roster-group`, `closed-node`);
//! - notifications (`headline` messages from the owner's bare JID) to the
//!   owner's available resources and those of the contacts the access
//!   model admits, when the resource's capabilities include `NODE+notify`
//!   (XEP-0163 §4.2.1); the last item of each such node when the
//!   subscriber comes online or changes its capabilities (§4.3.4);
//! - entity capabilities (XEP-0115): a `<c/>` in a user's available
//!   presence whose `ver` is unknown is asked for once (disco#info to that
//!   resource with `node#ver`), the answer's hash is verified (§5.4) before
//!   it is cached for everyone.
//!
//! Hooks: own-account iq handlers `{pubsub}pubsub` and `{pubsub#owner}pubsub`,
//! account-scope iq handlers for other users' requests to an account's
//! bare JID, `user_send` (capabilities in presence, answers to the disco
//! queries). Storage: `pubsub` (the service is the account's bare JID).
//! Config: `[modules.pep]` enabled, default_max_items, max_items,
//! max_nodes_per_user, max_bytes_per_user (a quota over all of an
//! account's items, counted from storage).
//!
//! The files: this one the module, its configuration and hooks, node
//! lookup and access models; `requests.rs` the account's pubsub requests
//! (publish, retract, items, the owner's use cases); `notify.rs`
//! notifications and the last items on presence or subscription;
//! `caps.rs` entity capabilities; `avatar.rs` and `bookmarks.rs` the
//! XEP-0398 and XEP-0402 conversions.

pub(crate) mod avatar;
mod bookmarks;

use crate::modules::common::pubsub::{perr, Access, NodeConfig, Rules, Seq, NS_OWNER, NS_PUBSUB};
use starling_core::disco::Scopes;
use starling_core::hooks::{
    HookRegistry, InboundHandler, IqHandler, IqResponse, IqScope, OwnIqHandler,
};
use starling_core::module::{ConfigProblem, Module, ModuleCtx};
use starling_core::storage::{RosterItem, StorageError, Subscription};
use starling_core::{async_trait, Env, Flow, HookResult, SessionCtx};
use starling_proto::{BareJid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
mod caps;
mod notify;
mod requests;

/// `[modules.pep]`: XEP-0163.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PepConfig {
    /// Serve PEP on every account.
    pub enabled: bool,
    /// `pubsub#max_items` of a node created without one.
    pub default_max_items: u32,
    /// The most items a node may keep (what `max` means).
    pub max_items: u32,
    /// Nodes an account may have (OMEMO uses one per device).
    pub max_nodes_per_user: u32,
    /// Bytes of item payload an account may store over all its nodes (0:
    /// no limit). A publication beyond it is refused with `<not-acceptable/>`
    /// and `<payload-too-big/>`, and nothing is stored.
    pub max_bytes_per_user: u64,
}

impl Default for PepConfig {
    fn default() -> Self {
        PepConfig {
            enabled: true,
            default_max_items: 1,
            max_items: 1000,
            max_nodes_per_user: 250,
            max_bytes_per_user: 10 * 1024 * 1024,
        }
    }
}

const NAME: &str = "pep";

fn internal(e: StorageError) -> StanzaError {
    tracing::error!(module = NAME, error = %e, "storage failed");
    StanzaError::new(StanzaErrorCondition::InternalServerError)
}

/// The PEP module.
pub struct Pep {
    cfg: PepConfig,
    /// Verified capabilities: `hash:ver` → features.
    caps: RwLock<HashMap<String, Arc<HashSet<String>>>>,
    /// The publication order of items.
    seq: Seq,
    /// XEP-0398: the vcard module runs, so avatars are converted.
    vcard_conversion: bool,
    /// Itself, for the tasks that deliver last items.
    me: std::sync::Weak<Pep>,
    /// The server, once started (those tasks route on their own).
    env: std::sync::OnceLock<std::sync::Weak<Env>>,
}

impl Pep {
    /// What node configurations may hold.
    fn rules(&self) -> Rules {
        Rules {
            default_max_items: self.cfg.default_max_items,
            max_items: self.cfg.max_items,
            service: false,
        }
    }

    async fn node(
        &self,
        env: &Env,
        owner: &BareJid,
        node: &str,
    ) -> Result<Option<NodeConfig>, StanzaError> {
        match env.storage.pubsub.node(owner.as_str(), node).await {
            Ok(Some(n)) => Ok(Some(
                NodeConfig::from_stored(&n.config)
                    .unwrap_or_else(|| NodeConfig::new(&self.rules())),
            )),
            Ok(None) => Ok(None),
            Err(e) => Err(internal(e)),
        }
    }

    /// Whether `who` may see `owner`'s node (§6.5.9 errors otherwise).
    async fn may_see(
        &self,
        env: &Env,
        owner: &BareJid,
        who: &BareJid,
        cfg: &NodeConfig,
    ) -> Result<(), StanzaError> {
        if who == owner || cfg.access_model == Access::Open {
            return Ok(());
        }
        let item = env
            .storage
            .roster
            .get_item(owner, who)
            .await
            .map_err(internal)?;
        admits(cfg, item.as_ref())
    }
}

/// Whether a node's access model admits a contact other than the owner
/// whose item in the owner's roster is `item` (§6.5.9 errors otherwise).
fn admits(cfg: &NodeConfig, item: Option<&RosterItem>) -> Result<(), StanzaError> {
    match cfg.access_model {
        Access::Open => Ok(()),
        Access::Presence => {
            if item
                .is_some_and(|i| matches!(i.subscription, Subscription::From | Subscription::Both))
            {
                Ok(())
            } else {
                Err(perr(
                    StanzaErrorCondition::NotAuthorized,
                    Some("presence-subscription-required"),
                    "only contacts subscribed to the owner's presence see this node",
                ))
            }
        }
        Access::Roster => {
            if item.is_some_and(|i| {
                i.groups
                    .iter()
                    .any(|g| cfg.roster_groups_allowed.contains(g))
            }) {
                Ok(())
            } else {
                Err(perr(
                    StanzaErrorCondition::NotAuthorized,
                    Some("not-in-roster-group"),
                    "only some of the owner's contacts see this node",
                ))
            }
        }
        Access::Whitelist => Err(perr(
            StanzaErrorCondition::NotAllowed,
            Some("closed-node"),
            "only the owner sees this node",
        )),
    }
}

#[async_trait]
impl OwnIqHandler for Pep {
    async fn own_iq(&self, cx: &mut SessionCtx<'_>, iq: &Stanza) -> IqResponse {
        let me = cx.jid().clone();
        match self.own(cx.env, &me, iq).await {
            Ok(p) => IqResponse::Result(p),
            Err(e) => IqResponse::Error(e),
        }
    }
}

#[async_trait]
impl IqHandler for Pep {
    /// Another user's request to an account's bare JID: items only.
    async fn handle_iq(&self, env: &Env, _scope: IqScope, iq: &Stanza) -> IqResponse {
        let (Some(to), Some(from)) = (iq.to(), iq.from()) else {
            return IqResponse::Error(StanzaErrorCondition::BadRequest.into());
        };
        let owner = to.to_bare();
        let who = from.to_bare();
        let Some(ps) = iq.payload() else {
            return IqResponse::Error(StanzaErrorCondition::BadRequest.into());
        };
        if !env.storage.accounts.exists(&owner).await.unwrap_or(false) {
            return IqResponse::Error(StanzaErrorCondition::ServiceUnavailable.into());
        }
        if ps.ns() == NS_OWNER || iq.type_attr() != Some("get") {
            return IqResponse::Error(perr(
                StanzaErrorCondition::Forbidden,
                None,
                "only the account's owner changes its nodes",
            ));
        }
        match ps.children().find(|c| c.is("items", NS_PUBSUB)) {
            Some(op) => match self.items(env, &owner, &who, op).await {
                Ok(p) => IqResponse::Result(Some(p)),
                Err(e) => IqResponse::Error(e),
            },
            None => IqResponse::Error(perr(
                StanzaErrorCondition::FeatureNotImplemented,
                Some("unsupported"),
                "subscriptions to personal nodes are implicit (XEP-0163 +notify)",
            )),
        }
    }
}

impl starling_core::hooks::StartedHandler for Pep {
    fn started(&self, env: &Arc<Env>) {
        let _ = self.env.set(Arc::downgrade(env));
    }
}

#[async_trait]
impl InboundHandler for Pep {
    /// `subscribed` from `owner` to a contact: the contact's available
    /// resources get `owner`'s last items (XEP-0163 §4.3.3). Runs before
    /// the roster's handler, which consumes subscription stanzas; the
    /// owner's item already says `from` (stored before it was routed).
    async fn inbound(&self, env: &Env, stanza: &mut Stanza) -> HookResult {
        if stanza.kind() == StanzaKind::Presence && stanza.type_attr() == Some("subscribed") {
            if let (Some(from), Some(to)) = (stanza.from(), stanza.to()) {
                let (owner, contact) = (from.to_bare(), to.to_bare());
                if owner != contact && owner.node().is_some() && to.node().is_some() {
                    self.on_approved(env, &owner, &contact).await;
                }
            }
        }
        Ok(Flow::Continue)
    }
}

impl Module for Pep {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str =
        "XEP-0163 personal eventing (PEP) with XEP-0115 +notify filtering";
    type Config = PepConfig;
    const STORAGE: &'static [&'static str] = &["pubsub", "roster"];

    fn enabled(cfg: &PepConfig) -> bool {
        cfg.enabled
    }

    fn validate(cfg: &PepConfig, _domains: &[String]) -> Result<(), ConfigProblem> {
        if cfg.max_items == 0 || cfg.default_max_items == 0 || cfg.default_max_items > cfg.max_items
        {
            return Err(ConfigProblem::new(
                "max_items",
                "max_items and default_max_items must be at least 1, and default_max_items at most max_items",
            ));
        }
        Ok(())
    }

    async fn start(cfg: &PepConfig, ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        let m = Arc::new_cyclic(|me| Pep {
            cfg: cfg.clone(),
            caps: RwLock::new(HashMap::new()),
            seq: Seq::default(),
            vcard_conversion: (ctx.is_enabled)("vcard"),
            me: me.clone(),
            env: std::sync::OnceLock::new(),
        });
        reg.started(m.clone());
        reg.own_iq(NAME, "pubsub", NS_PUBSUB, m.clone());
        reg.own_iq(NAME, "pubsub", NS_OWNER, m.clone());
        reg.iq(NAME, IqScope::Account, "pubsub", NS_PUBSUB, m.clone());
        reg.iq(NAME, IqScope::Account, "pubsub", NS_OWNER, m.clone());
        // Before presence (40), which consumes broadcast presence.
        if (ctx.is_enabled)("private") {
            reg.private_fragment(
                "storage",
                bookmarks::NS_LEGACY,
                Arc::new(bookmarks::Bookmarks(m.clone())),
            );
            reg.disco()
                .feature(Scopes::ACCOUNT, "urn:xmpp:bookmarks:1#compat");
        }
        if m.vcard_conversion {
            reg.disco().feature(Scopes::ACCOUNT, avatar::FEATURE);
        }
        reg.inbound(NAME, 45, m.clone());
        reg.user_send(NAME, 38, m);
        let d = reg.disco();
        d.identity(IqScope::Account, "pubsub", "pep", None);
        for f in [
            NS_PUBSUB,
            "http://jabber.org/protocol/pubsub#access-open",
            "http://jabber.org/protocol/pubsub#access-presence",
            "http://jabber.org/protocol/pubsub#access-roster",
            "http://jabber.org/protocol/pubsub#access-whitelist",
            "http://jabber.org/protocol/pubsub#auto-create",
            "http://jabber.org/protocol/pubsub#auto-subscribe",
            "http://jabber.org/protocol/pubsub#config-node",
            "http://jabber.org/protocol/pubsub#create-and-configure",
            "http://jabber.org/protocol/pubsub#delete-items",
            "http://jabber.org/protocol/pubsub#delete-nodes",
            "http://jabber.org/protocol/pubsub#filtered-notifications",
            "http://jabber.org/protocol/pubsub#item-ids",
            "http://jabber.org/protocol/pubsub#last-published",
            "http://jabber.org/protocol/pubsub#persistent-items",
            "http://jabber.org/protocol/pubsub#presence-notifications",
            "http://jabber.org/protocol/pubsub#publish",
            "http://jabber.org/protocol/pubsub#publish-options",
            "http://jabber.org/protocol/pubsub#purge-nodes",
            "http://jabber.org/protocol/pubsub#retract-items",
            "http://jabber.org/protocol/pubsub#retrieve-default",
            "http://jabber.org/protocol/pubsub#retrieve-items",
        ] {
            d.feature(Scopes::ACCOUNT, f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_options_are_checked_against_the_config() {
        let cfg = PepConfig::default();
        let cfg = Rules {
            default_max_items: cfg.default_max_items,
            max_items: cfg.max_items,
            service: false,
        };
        let mut n = NodeConfig::new(&cfg);
        n.set(&cfg, "pubsub#access_model", &["open".into()])
            .unwrap();
        n.set(&cfg, "pubsub#max_items", &["max".into()]).unwrap();
        assert_eq!((n.access_model, n.max_items), (Access::Open, 1000));
        assert!(n.set(&cfg, "pubsub#max_items", &["1001".into()]).is_err());
        assert!(n
            .set(&cfg, "pubsub#access_model", &["authorize".into()])
            .is_err());
        assert!(n.set(&cfg, "pubsub#unknown", &["x".into()]).is_err());
        assert!(n
            .set(&cfg, "pubsub#persist_items", &["maybe".into()])
            .is_err());
        let stored = n.to_stored();
        assert_eq!(NodeConfig::from_stored(&stored), Some(n));
    }
}
