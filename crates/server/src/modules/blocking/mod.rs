//! Blocking Command (XEP-0191).
//!
//! - `<blocklist/>` get, `<block/>` and `<unblock/>` sets (with or without
//!   items) on the user's own account; results pushed to every resource of
//!   the user that requested the block list (§3.3–§3.5).
//! - Enforcement before delivery, whatever resource is online (router
//!   `inbound` hook): from a blocked JID, presence is dropped silently,
//!   messages get `<service-unavailable/>`, iq get/set get
//!   `<service-unavailable/>`, other iqs are dropped (§3.5). Stanzas the
//!   user's own client sends to a blocked JID get `<not-acceptable/>` with
//!   `<blocked xmlns='urn:xmpp:blocking:errors'/>` (§3.6); stanzas the server
//!   sends on the user's behalf (presence broadcasts) are dropped.
//! - Blocking sends unavailable presence to blocked contacts that were
//!   receiving the user's presence; unblocking sends the current presence
//!   again (§3.3, §3.4).
//! - JID matching as XEP-0016 §2.1: full JID, bare JID, domain/resource,
//!   domain. A user's own resources are never blocked from each other.
//!
//! Block lists are cached per user (loaded on first use, updated by this
//! module), so enforcement costs hash lookups, not queries. In a cluster a
//! change is also announced to the other nodes, which drop their copy
//! (`CacheHandler`): the block takes effect there within the bus latency.
//!
//! Hooks: iq handler `urn:xmpp:blocking` (account scope), `inbound` (10),
//! `user_send` (5), `user_receive` (push filtering). Storage: blocking,
//! roster (who receives presence). Config: `[modules.blocking]`.

use starling_core::hooks::{
    CacheHandler, HookRegistry, InboundHandler, IqHandler, IqResponse, IqScope,
    SessionOpenedHandler, UserReceiveHandler, UserSendHandler,
};
use starling_core::module::{EnabledConfig, Module, ModuleCtx};
use starling_core::storage::StorageResult;
use starling_core::{async_trait, Env, Flow, HookResult, SessionCtx};
use starling_proto::{ns, BareJid, Jid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind};
use starling_xml::Element;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

pub mod store;

use store::BlockingStore;

const NAME: &str = "blocking";
/// XEP-0191 namespace.
pub const NS_BLOCKING: &str = "urn:xmpp:blocking";
/// XEP-0191 §3.6 application error namespace.
pub const NS_BLOCKING_ERRORS: &str = "urn:xmpp:blocking:errors";
/// Cached block lists beyond which the cache is emptied (it refills on demand).
const CACHE_LIMIT: usize = 200_000;

type List = Arc<HashSet<String>>;

/// The blocking module.
pub struct Blocking {
    cache: RwLock<HashMap<BareJid, List>>,
    /// The block lists (`store/`).
    store: Arc<dyn BlockingStore>,
}

/// Per-session state: this session asked for the block list (§3.2), so it
/// gets pushes.
struct Interested;

impl Blocking {
    /// Registers the module, keeping block lists in `store`.
    pub fn register(reg: &mut HookRegistry, store: Arc<dyn BlockingStore>) {
        let m = Arc::new(Blocking {
            cache: RwLock::default(),
            store,
        });
        reg.iq(NAME, IqScope::Account, "blocklist", NS_BLOCKING, m.clone());
        reg.iq(NAME, IqScope::Account, "block", NS_BLOCKING, m.clone());
        reg.iq(NAME, IqScope::Account, "unblock", NS_BLOCKING, m.clone());
        reg.disco().feature(IqScope::Server, NS_BLOCKING);
        reg.inbound(NAME, 10, m.clone());
        reg.user_send(NAME, 5, m.clone());
        reg.user_receive(NAME, 10, m.clone());
        reg.session_opened(NAME, 50, m.clone());
        reg.cache(NAME, m);
    }

    async fn list(&self, owner: &BareJid) -> StorageResult<List> {
        if let Some(l) = self
            .cache
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(owner)
        {
            return Ok(l.clone());
        }
        let list: List = Arc::new(self.store.blocklist(owner).await?.into_iter().collect());
        let mut cache = self.cache.write().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_LIMIT {
            cache.clear();
        }
        cache.insert(owner.clone(), list.clone());
        Ok(list)
    }

    /// Drops `owner`'s cached list here and on the other nodes of a
    /// cluster (their routers check it for messages to `owner`).
    fn forget(&self, env: &Env, owner: &BareJid) {
        self.cache
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(owner);
        env.router.invalidate(NAME, owner.as_str());
    }

    /// True if `owner` blocks `other` (XEP-0016 §2.1 matching order).
    async fn blocks(&self, owner: &BareJid, other: &Jid) -> bool {
        if other.to_bare() == *owner {
            return false; // never between a user's own resources
        }
        let list = match self.list(owner).await {
            Ok(l) => l,
            Err(e) => {
                // Fail open for delivery but say so: a storage outage must
                // not silently drop everyone's messages.
                tracing::error!(error = %e, user = %owner, "cannot load block list");
                return false;
            }
        };
        if list.is_empty() {
            return false;
        }
        let domain = other.domain().as_str();
        list.contains(other.as_str())
            || list.contains(other.to_bare().as_str())
            || other
                .resource()
                .is_some_and(|r| list.contains(&format!("{domain}/{}", r.as_str())))
            || list.contains(domain)
    }

    fn items(query: &Element) -> Result<Vec<String>, StanzaError> {
        query
            .children()
            .filter(|c| c.is("item", NS_BLOCKING))
            .map(|i| {
                let raw = i.attr("jid").ok_or_else(|| {
                    StanzaError::new(StanzaErrorCondition::BadRequest).with_text("item without jid")
                })?;
                Jid::new(raw).map(|j| j.as_str().to_owned()).map_err(|_| {
                    StanzaError::new(StanzaErrorCondition::JidMalformed)
                        .with_text(format!("{raw:?} is not a valid JID"))
                })
            })
            .collect()
    }

    /// Routes the push to every resource of `owner`; sessions that never
    /// asked for the block list drop it in `user_receive`.
    async fn push(&self, env: &Env, owner: &BareJid, name: &str, jids: &[String]) {
        let mut payload = Element::new(name, NS_BLOCKING);
        for j in jids {
            payload.append_child(
                Element::builder("item", NS_BLOCKING)
                    .attr("jid", j.clone())
                    .build(),
            );
        }
        for e in env.sessions.resources(owner) {
            let mut iq = Element::new("iq", ns::CLIENT);
            iq.set_attr("type", "set");
            iq.set_attr("id", format!("push-{}", starling_proto::random_id(8)));
            iq.append_child(payload.clone());
            env.route(Stanza::new(
                iq,
                Some(owner.clone().into()),
                Some(e.session.jid.into()),
            ))
            .await;
        }
    }

    /// §3.3/§3.4: unavailable presence on block, current presence on
    /// unblock, to the affected JIDs that receive the user's presence.
    async fn presence_effects(&self, env: &Env, owner: &BareJid, jids: &[String], blocked: bool) {
        let resources: Vec<_> = env
            .sessions
            .resources(owner)
            .into_iter()
            .filter(|e| e.presence.is_some())
            .collect();
        if resources.is_empty() {
            return;
        }
        for j in jids {
            let Ok(target) = BareJid::new(j) else {
                continue;
            };
            if target.node().is_none() {
                continue; // domain blocks: no single contact to notify
            }
            let subscribed = matches!(
                env.storage.roster.get_item(owner, &target).await,
                Ok(Some(item)) if item.subscription.has_from()
            );
            if !subscribed {
                continue;
            }
            for r in &resources {
                let el = if blocked {
                    Element::builder("presence", ns::CLIENT)
                        .attr("type", "unavailable")
                        .build()
                } else {
                    let mut p = (**r.presence.as_ref().expect("filtered above")).clone();
                    p.remove_attr("to");
                    p
                };
                let mut s = Stanza::new(
                    el,
                    Some(r.session.jid.clone().into()),
                    Some(target.clone().into()),
                );
                if !blocked {
                    // Re-stamp: the cached presence carries its own 'from'.
                    s.set_from(Some(r.session.jid.clone().into()));
                }
                env.route(s).await;
            }
        }
    }
}

#[async_trait]
impl IqHandler for Blocking {
    async fn handle_iq(&self, env: &Env, _scope: IqScope, iq: &Stanza) -> IqResponse {
        let Some(owner) = iq.from().map(|f| f.to_bare()) else {
            return IqResponse::Error(StanzaErrorCondition::BadRequest.into());
        };
        if iq.to().is_some_and(|t| t.to_bare() != owner) {
            // Only the user's own server handles their block list.
            return IqResponse::Error(StanzaErrorCondition::ServiceUnavailable.into());
        }
        let Some(query) = iq.payload() else {
            return IqResponse::Error(StanzaErrorCondition::BadRequest.into());
        };
        let internal = |e: starling_core::storage::StorageError| {
            tracing::error!(error = %e, user = %owner, "block list storage failed");
            IqResponse::Error(
                StanzaError::new(StanzaErrorCondition::InternalServerError)
                    .with_type(starling_proto::ErrorType::Wait),
            )
        };
        match (iq.type_attr(), query.name()) {
            (Some("get"), "blocklist") => match self.list(&owner).await {
                Ok(list) => {
                    let mut sorted: Vec<&String> = list.iter().collect();
                    sorted.sort();
                    let mut out = Element::new("blocklist", NS_BLOCKING);
                    for j in sorted {
                        out.append_child(
                            Element::builder("item", NS_BLOCKING)
                                .attr("jid", j.clone())
                                .build(),
                        );
                    }
                    IqResponse::Result(Some(out))
                }
                Err(e) => internal(e),
            },
            (Some("set"), "block") => {
                let jids = match Self::items(query) {
                    Ok(j) if !j.is_empty() => j,
                    Ok(_) => {
                        // §3.3: at least one item.
                        return IqResponse::Error(
                            StanzaError::new(StanzaErrorCondition::BadRequest)
                                .with_text("block needs at least one item"),
                        );
                    }
                    Err(e) => return IqResponse::Error(e),
                };
                // Presence goes out before the block takes effect.
                self.presence_effects(env, &owner, &jids, true).await;
                let result = self.store.block(&owner, &jids).await;
                self.forget(env, &owner);
                match result {
                    Ok(_) => {
                        env.route(iq.iq_result(None)).await;
                        self.push(env, &owner, "block", &jids).await;
                        IqResponse::Handled
                    }
                    Err(e) => internal(e),
                }
            }
            (Some("set"), "unblock") => {
                let jids = match Self::items(query) {
                    Ok(j) => j,
                    Err(e) => return IqResponse::Error(e),
                };
                let result = if jids.is_empty() {
                    self.store.unblock_all(&owner).await
                } else {
                    self.store.unblock(&owner, &jids).await
                };
                self.forget(env, &owner);
                match result {
                    Ok(removed) => {
                        env.route(iq.iq_result(None)).await;
                        // An empty unblock push means "everything" (§3.5).
                        self.push(env, &owner, "unblock", &jids).await;
                        self.presence_effects(env, &owner, &removed, false).await;
                        IqResponse::Handled
                    }
                    Err(e) => internal(e),
                }
            }
            _ => IqResponse::Error(StanzaErrorCondition::BadRequest.into()),
        }
    }
}

#[async_trait]
impl InboundHandler for Blocking {
    async fn inbound(&self, env: &Env, stanza: &mut Stanza) -> HookResult {
        let (Some(to), Some(from)) = (stanza.to(), stanza.from()) else {
            return Ok(Flow::Continue);
        };
        let owner = to.to_bare();
        let from_bare = from.to_bare();
        // Inbound rule: the recipient blocks the sender (§3.5).
        let inbound = self.blocks(&owner, from).await;
        // Outbound rule for what the server routes on a local user's behalf
        // (presence broadcasts): the sender blocks the recipient. Errors are
        // exempt: they are the server's bounces of the blocked JID's own
        // stanzas (§3.5).
        let outbound = !inbound
            && !stanza.is_error()
            && env.hosts.is_local(from.domain().as_str())
            && from.node().is_some()
            && self.blocks(&from_bare, to).await;
        if !inbound && !outbound {
            return Ok(Flow::Continue);
        }
        if inbound {
            let bounce = match stanza.kind() {
                StanzaKind::Presence => false,
                StanzaKind::Message => true,
                StanzaKind::Iq => stanza.is_iq_request(),
            };
            if bounce {
                if let Some(reply) =
                    stanza.error_reply(StanzaErrorCondition::ServiceUnavailable.into())
                {
                    env.route(reply).await;
                }
            }
        }
        Ok(Flow::Stop)
    }
}

/// The user's list is read when a session opens rather than at its first
/// stanza: every stanza a session sends or receives is checked against it,
/// and after a restart thousands of sessions' first stanzas otherwise
/// queued their reads on storage at once (the first seconds' p99 rose to
/// 45–155 ms at 10,000 msg/s; docs/benchmarks.md 2026-11-27 22:10).
#[async_trait]
impl SessionOpenedHandler for Blocking {
    async fn session_opened(&self, cx: &mut SessionCtx<'_>) -> HookResult {
        let me = cx.jid().to_bare();
        if let Err(e) = self.list(&me).await {
            // Read again at the first stanza.
            tracing::warn!(module = NAME, user = %me, error = %e, "reading the block list failed");
        }
        Ok(Flow::Continue)
    }
}

#[async_trait]
impl UserSendHandler for Blocking {
    async fn user_send(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        // §3.2: a session that fetches the list gets pushes from now on.
        if stanza.kind() == StanzaKind::Iq
            && stanza.type_attr() == Some("get")
            && stanza
                .payload()
                .is_some_and(|p| p.is("blocklist", NS_BLOCKING))
        {
            cx.state.insert(Interested);
        }
        let Some(to) = stanza.to() else {
            return Ok(Flow::Continue);
        };
        let me = cx.jid().to_bare();
        if !self.blocks(&me, to).await {
            return Ok(Flow::Continue);
        }
        // §3.6: not routed; an error for message and iq, presence dropped.
        if stanza.kind() != StanzaKind::Presence {
            if let Some(reply) = stanza.error_reply(StanzaErrorCondition::NotAcceptable.into()) {
                let mut el = reply.into_element();
                if let Some(err) = el.get_child_mut("error", ns::CLIENT) {
                    err.append_child(Element::new("blocked", NS_BLOCKING_ERRORS));
                }
                cx.send(el);
            }
        }
        Ok(Flow::Stop)
    }
}

#[async_trait]
impl UserReceiveHandler for Blocking {
    async fn user_receive(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        let is_push = stanza.kind() == StanzaKind::Iq
            && stanza.type_attr() == Some("set")
            && stanza
                .from()
                .is_some_and(|f| f.is_bare() && f.to_bare() == cx.jid().to_bare())
            && stanza
                .payload()
                .is_some_and(|p| p.ns() == NS_BLOCKING && matches!(p.name(), "block" | "unblock"));
        if is_push && cx.state.get::<Interested>().is_none() {
            return Ok(Flow::Stop);
        }
        Ok(Flow::Continue)
    }
}

impl Module for Blocking {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str = "XEP-0191 blocking command";
    type Config = EnabledConfig;
    const STORAGE: &'static [&'static str] = &["blocking", "roster"];
    const SCHEMA: &'static [starling_core::storage::SchemaStep] = store::SCHEMA;
    const STORE_SUITES: &'static [starling_core::storage::StoreSuite] = store::conformance::SUITES;

    fn owned_data(
        storage: &starling_core::storage::Storage,
    ) -> Option<Arc<dyn starling_core::storage::OwnedData>> {
        Some(Arc::new(store::BlockingData::new(storage)))
    }

    fn enabled(cfg: &EnabledConfig) -> bool {
        cfg.enabled
    }

    async fn start(_cfg: &EnabledConfig, ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        Blocking::register(reg, store::open_timed(ctx.storage, ctx.metrics));
    }
}

impl CacheHandler for Blocking {
    fn invalidate(&self, key: &str) {
        if let Ok(owner) = BareJid::new(key) {
            self.cache
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&owner);
        }
    }
}
