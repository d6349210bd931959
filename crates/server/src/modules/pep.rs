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

pub(crate) mod avatar;
mod bookmarks;

use crate::modules::common::pubsub::{
    check_preconditions, configured, delete_event, item_el, items_event, node_attr, perr,
    publication, publish_options, purge_event, retract_event, Access, NodeConfig, Rules, Seq,
    NS_NODE_CONFIG, NS_OWNER, NS_PUBSUB,
};
use starling_core::disco::Scopes;
use starling_core::forms::Submitted;
use starling_core::hooks::{
    HookRegistry, InboundHandler, IqHandler, IqResponse, IqScope, OwnIqHandler, UserSendHandler,
};
use starling_core::module::{ConfigProblem, Module, ModuleCtx};
use starling_core::storage::{RosterItem, StorageError, StoredItem, StoredNode, Subscription};
use starling_core::{async_trait, Env, Flow, HookResult, SessionCtx};
use starling_proto::{
    ns, BareJid, FullJid, Jid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind,
};
use starling_xml::Element;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

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
const NS_CAPS: &str = "http://jabber.org/protocol/caps";
/// Distinct capability `ver`s remembered before the cache starts over.
const CAPS_CACHE_LIMIT: usize = 10_000;
/// Verified capabilities are kept in `user_data` (kind `caps`, key
/// `hash:ver`, value: the features, one per line) under this pseudo-owner,
/// so every node of a cluster knows what any node verified. A domain that
/// can never be served (RFC 2606 `.invalid`).
const CAPS_KIND: &str = "caps";

fn caps_owner() -> BareJid {
    BareJid::new("capabilities.starling.invalid").expect("a valid domain JID")
}

fn internal(e: StorageError) -> StanzaError {
    tracing::error!(module = NAME, error = %e, "storage failed");
    StanzaError::new(StanzaErrorCondition::InternalServerError)
}

/// The session's capabilities as the module follows them.
#[derive(Default)]
struct CapsState {
    /// The `hash:ver` of the last available presence with capabilities.
    ver: Option<String>,
    /// Our disco#info query waiting for its answer: (id, hash, ver).
    pending: Option<(String, String, String)>,
    /// The `ver` the last items were delivered for.
    delivered: Option<String>,
}

/// Free mailbox slots the last-item delivery waits for before each item
/// (a quarter of the default `[c2s] mailbox_size`: room for the presences
/// and messages arriving meanwhile).
const LAST_ITEMS_ROOM: usize = 256;
/// The longest it waits for them at one item: a session that made no room
/// in that time stopped reading, and the rest is sent without waiting (it
/// gets the usual bounces; the task ends instead of waiting per item). A
/// slow reader that makes progress is waited for as long as it reads.
const LAST_ITEMS_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

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
    /// Delivers the last items to a session that just came online (or
    /// changed its capabilities) in a task of its own: the user's presence
    /// broadcast, which this hook runs before, does not wait for them.
    fn deliver_last_soon(&self, me: BareJid, to: FullJid, features: Arc<HashSet<String>>) {
        let (Some(pep), Some(env)) = (
            self.me.upgrade(),
            self.env.get().and_then(std::sync::Weak::upgrade),
        ) else {
            return;
        };
        tokio::spawn(async move {
            pep.deliver_last(&env, &me, &to, &features).await;
        });
    }

    /// Verified capabilities `key` (`hash:ver`): from this node's cache,
    /// else from storage (verified by any node of a cluster), else `None`.
    async fn features(&self, env: &Env, key: &str) -> Option<Arc<HashSet<String>>> {
        if let Some(f) = self.caps.read().unwrap_or_else(|e| e.into_inner()).get(key) {
            return Some(f.clone());
        }
        let stored = match env
            .storage
            .user_data
            .get(&caps_owner(), CAPS_KIND, key)
            .await
        {
            Ok(s) => s?,
            Err(e) => {
                tracing::warn!(module = NAME, caps = key, error = %e, "reading stored capabilities failed");
                return None;
            }
        };
        let features: Arc<HashSet<String>> = Arc::new(
            stored
                .lines()
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect(),
        );
        self.remember(key, features.clone());
        Some(features)
    }

    fn remember(&self, key: &str, features: Arc<HashSet<String>>) {
        let mut caps = self.caps.write().unwrap_or_else(|e| e.into_inner());
        if caps.len() >= CAPS_CACHE_LIMIT {
            caps.clear();
        }
        caps.insert(key.to_owned(), features);
    }

    /// Whether the resource whose last presence is `presence` asked for
    /// `node`'s notifications.
    async fn wants(&self, env: &Env, presence: Option<&Element>, node: &str) -> bool {
        let Some(key) = presence.and_then(caps_key) else {
            return false;
        };
        self.features(env, &key)
            .await
            .is_some_and(|f| f.contains(&format!("{node}+notify")))
    }

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

    /// The available resources that get `owner`'s notifications for
    /// `node`: the owner's, and the contacts' the access model admits,
    /// each only if it asked for them (`NODE+notify`).
    async fn recipients(
        &self,
        env: &Env,
        owner: &BareJid,
        node: &str,
        cfg: &NodeConfig,
    ) -> Vec<FullJid> {
        let mut accounts = vec![owner.clone()];
        if cfg.access_model != Access::Whitelist {
            accounts.extend(self.admitted_contacts(env, owner, cfg).await);
        }
        let mut out = Vec::new();
        for bare in &accounts {
            for e in env.sessions.resources(bare) {
                if e.priority.is_some() && self.wants(env, e.presence.as_deref(), node).await {
                    out.push(e.session.jid.clone());
                }
            }
        }
        out
    }

    /// The contacts of `owner` whose resources the node's access model
    /// admits to its notifications.
    async fn admitted_contacts(
        &self,
        env: &Env,
        owner: &BareJid,
        cfg: &NodeConfig,
    ) -> Vec<BareJid> {
        let mut out = Vec::new();
        let roster = match env.storage.roster.get_roster(owner).await {
            Ok((_, items)) => items,
            Err(e) => {
                tracing::error!(module = NAME, owner = %owner, error = %e, "reading the roster for notifications failed");
                return out;
            }
        };
        for item in roster {
            let subscribed = matches!(item.subscription, Subscription::From | Subscription::Both);
            let admitted = match cfg.access_model {
                Access::Open | Access::Presence => subscribed,
                Access::Roster => {
                    subscribed
                        && item
                            .groups
                            .iter()
                            .any(|g| cfg.roster_groups_allowed.contains(g))
                }
                Access::Whitelist => false,
            };
            if admitted && &item.jid != owner {
                out.push(item.jid);
            }
        }
        out
    }

    /// Sends `owner`'s event about `node` to its recipients.
    async fn notify(
        &self,
        env: &Env,
        owner: &BareJid,
        node: &str,
        cfg: &NodeConfig,
        event: Element,
    ) {
        let to = self.recipients(env, owner, node, cfg).await;
        if to.is_empty() {
            return;
        }
        let mut m = Element::builder("message", ns::CLIENT)
            .attr("type", cfg.notification_type.as_str())
            .attr("id", starling_proto::random_id(10))
            .build();
        m.append_child(event);
        let from: Jid = owner.clone().into();
        for s in crate::modules::common::copies(m, from, to.into_iter().map(Jid::from)) {
            env.route(s).await;
        }
    }

    /// Sends session `to` (of account `me`, with `features`) the last item
    /// of every node it follows: its own account's and its contacts'
    /// (§4.3.4, on available presence).
    async fn deliver_last(
        &self,
        env: &Env,
        me: &BareJid,
        to: &FullJid,
        features: &HashSet<String>,
    ) {
        if !features.iter().any(|f| f.ends_with("+notify")) {
            return;
        }
        let mut services = vec![me.clone()];
        match env.storage.roster.get_roster(me).await {
            Ok((_, items)) => services.extend(
                items
                    .into_iter()
                    .filter(|i| matches!(i.subscription, Subscription::To | Subscription::Both))
                    .map(|i| i.jid),
            ),
            Err(e) => {
                tracing::error!(module = NAME, user = %me, error = %e, "reading the roster for last items failed")
            }
        }
        self.deliver_last_of(env, &services, me, to, features, true)
            .await;
    }

    /// Sends session `to` (of account `me`, with `features`) the last item
    /// of each of `owners`' nodes it follows and may see: on its presence
    /// (`on_presence`, nodes sending the last item `on_sub_and_presence`)
    /// or on a new subscription (`on_sub` too). The items with their nodes
    /// in one query per few hundred owners, and the access checks that
    /// need the owners' rosters in as few.
    async fn deliver_last_of(
        &self,
        env: &Env,
        owners: &[BareJid],
        me: &BareJid,
        to: &FullJid,
        features: &HashSet<String>,
        on_presence: bool,
    ) {
        let services: Vec<String> = owners.iter().map(|o| o.as_str().to_owned()).collect();
        let last = match env.storage.pubsub.last_items_of(&services).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(module = NAME, user = %me, owners = owners.len(), error = %e, "reading last items failed");
                return;
            }
        };
        // Only what this session follows and the node sends now.
        let last: Vec<(BareJid, String, NodeConfig, StoredItem)> = last
            .into_iter()
            .filter(|(node, _)| features.contains(&format!("{}+notify", node.node)))
            .filter_map(|(node, item)| {
                let cfg = NodeConfig::from_stored(&node.config)
                    .unwrap_or_else(|| NodeConfig::new(&self.rules()));
                let wanted = match cfg.send_last_published_item.as_str() {
                    "on_sub_and_presence" => true,
                    "on_sub" => !on_presence,
                    _ => false,
                };
                let owner = BareJid::new(&node.service).ok()?;
                wanted.then_some((owner, node.node, cfg, item))
            })
            .collect();
        if last.is_empty() {
            return;
        }
        // The owners' roster items for `me`, where an access model needs
        // them.
        let checked: Vec<BareJid> = last
            .iter()
            .filter(|(owner, _, cfg, _)| owner != me && cfg.access_model != Access::Open)
            .map(|(owner, _, _, _)| owner.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let items: HashMap<BareJid, RosterItem> = if checked.is_empty() {
            HashMap::new()
        } else {
            match env.storage.roster.items_for_contact(&checked, me).await {
                Ok(found) => found.into_iter().collect(),
                Err(e) => {
                    tracing::error!(module = NAME, user = %me, error = %e, "reading the owners' rosters for last items failed");
                    return;
                }
            }
        };
        // Paced to the session's reading: a login with hundreds of
        // contacts gets thousands of items, and its contacts' presences at
        // the same time; a full mailbox would bounce them.
        let session = env.sessions.get(to).map(|e| e.session);
        let mut reading = true;
        for (owner, node, cfg, item) in last {
            if &owner != me && admits(&cfg, items.get(&owner)).is_err() {
                continue;
            }
            if let (Some(s), true) = (&session, reading) {
                reading = env
                    .router
                    .wait_for_room(s, LAST_ITEMS_ROOM, LAST_ITEMS_WAIT)
                    .await;
            }
            let mut m = Element::builder("message", ns::CLIENT)
                .attr("type", cfg.notification_type.as_str())
                .attr("id", starling_proto::random_id(10))
                .build();
            m.append_child(items_event(&node, &[item], false));
            env.route(Stanza::new(m, Some(owner.into()), Some(to.clone().into())))
                .await;
        }
    }

    /// A new presence subscription (XEP-0163 §4.3.3: the contact is now
    /// subscribed to `owner`'s presence, so it is subscribed to its PEP
    /// nodes): each available resource of `contact` gets the last items
    /// it follows at once, without waiting for its next presence.
    async fn on_approved(&self, env: &Env, owner: &BareJid, contact: &BareJid) {
        for e in env.sessions.resources(contact) {
            if e.priority.is_none() {
                continue;
            }
            let Some(key) = e.presence.as_deref().and_then(caps_key) else {
                continue;
            };
            if let Some(features) = self.features(env, &key).await {
                self.deliver_last_of(
                    env,
                    std::slice::from_ref(owner),
                    contact,
                    &e.session.jid,
                    &features,
                    false,
                )
                .await;
            }
        }
    }

    // ----- the use cases -----

    /// §7.1: publish (the owner only), creating the node if needed.
    async fn publish(
        &self,
        env: &Env,
        owner: &BareJid,
        publisher: &FullJid,
        ps: &Element,
        p: &Element,
    ) -> Result<Element, StanzaError> {
        let node = node_attr(p)?;
        let (item, payload) = publication(p, true)?;
        let options = publish_options(ps)?;
        let rules = self.rules();
        let id = item
            .attr("id")
            .filter(|id| !id.is_empty())
            .map(str::to_owned)
            .unwrap_or_else(|| starling_proto::random_id(16));
        let payload = payload.map(|p| p.to_string()).unwrap_or_default();
        self.check_quota(env, owner, node, &id, payload.len())
            .await?;
        let cfg = match self.node(env, owner, node).await? {
            Some(cfg) => {
                // §7.1.5: every option must match the node's configuration.
                if let Some(o) = &options {
                    check_preconditions(&cfg, &rules, o)?;
                }
                cfg
            }
            None => {
                let cfg = configured(&rules, options.as_ref())?;
                let count = env
                    .storage
                    .pubsub
                    .nodes(owner.as_str())
                    .await
                    .map_err(internal)?
                    .len();
                if count >= self.cfg.max_nodes_per_user as usize {
                    return Err(perr(
                        StanzaErrorCondition::NotAllowed,
                        Some("max-nodes-exceeded"),
                        "this account has as many nodes as the server allows",
                    ));
                }
                let stored = StoredNode {
                    service: owner.as_str().to_owned(),
                    node: node.to_owned(),
                    config: cfg.to_stored(),
                    created_at: self.seq.next() / 1000,
                };
                match env.storage.pubsub.create_node(&stored).await {
                    Ok(()) | Err(StorageError::Conflict) => {}
                    Err(e) => return Err(internal(e)),
                }
                tracing::debug!(module = NAME, owner = %owner, node, "node created");
                cfg
            }
        };
        let stored = StoredItem {
            id: id.clone(),
            publisher: publisher.to_bare().as_str().to_owned(),
            payload,
            seq: self.seq.next(),
        };
        env.storage
            .pubsub
            .publish(owner.as_str(), node, &stored, Some(cfg.keep()))
            .await
            .map_err(internal)?;
        self.notify(
            env,
            owner,
            node,
            &cfg,
            items_event(node, std::slice::from_ref(&stored), false),
        )
        .await;
        Ok(Element::builder("pubsub", NS_PUBSUB)
            .append(
                Element::builder("publish", NS_PUBSUB)
                    .attr("node", node)
                    .append(Element::builder("item", NS_PUBSUB).attr("id", id).build())
                    .build(),
            )
            .build())
    }

    /// `max_bytes_per_user`: refuses a publication of `bytes` of payload
    /// as item `id` of `node` when the account's stored items (all its
    /// nodes, less the item it would replace) would pass the quota.
    /// Counted from storage, so it holds across restarts and cluster
    /// nodes; before `max_items` trims older items (a full account frees
    /// space by retracting, purging or deleting).
    async fn check_quota(
        &self,
        env: &Env,
        owner: &BareJid,
        node: &str,
        id: &str,
        bytes: usize,
    ) -> Result<(), StanzaError> {
        let quota = self.cfg.max_bytes_per_user;
        if quota == 0 {
            return Ok(());
        }
        let used = env
            .storage
            .pubsub
            .stored_bytes(owner.as_str(), Some((node, id)))
            .await
            .map_err(internal)?;
        if used.saturating_add(bytes as u64) <= quota {
            return Ok(());
        }
        env.metrics.limit_refused("pep.max_bytes_per_user");
        // XEP-0060 §7.1.3.4's condition: the payload cannot be stored
        // (XEP-0060 has no quota condition of its own); the text says why.
        Err(perr(
            StanzaErrorCondition::NotAcceptable,
            Some("payload-too-big"),
            &format!(
                "this account's PEP storage is full ({used} of {quota} bytes used); retract items or delete nodes to free space"
            ),
        ))
    }

    /// §6.5: items, for the owner or whoever the access model admits.
    async fn items(
        &self,
        env: &Env,
        owner: &BareJid,
        who: &BareJid,
        el: &Element,
    ) -> Result<Element, StanzaError> {
        let node = node_attr(el)?;
        let cfg = self
            .node(env, owner, node)
            .await?
            .ok_or_else(|| perr(StanzaErrorCondition::ItemNotFound, None, "no such node"))?;
        self.may_see(env, owner, who, &cfg).await?;
        let ids: Vec<String> = el
            .children()
            .filter(|c| c.is("item", NS_PUBSUB))
            .filter_map(|c| c.attr("id").map(str::to_owned))
            .collect();
        let mut items = if ids.is_empty() {
            let max = el.attr("max_items").and_then(|m| m.parse::<u32>().ok());
            env.storage.pubsub.items(owner.as_str(), node, max).await
        } else {
            env.storage
                .pubsub
                .items_by_id(owner.as_str(), node, &ids)
                .await
        }
        .map_err(internal)?;
        // Oldest first, as they were published.
        items.reverse();
        let mut list = Element::builder("items", NS_PUBSUB)
            .attr("node", node)
            .build();
        for it in &items {
            list.append_child(item_el(NS_PUBSUB, it));
        }
        Ok(Element::builder("pubsub", NS_PUBSUB).append(list).build())
    }

    /// §7.2: retract.
    async fn retract(&self, env: &Env, owner: &BareJid, el: &Element) -> Result<(), StanzaError> {
        let node = node_attr(el)?;
        let cfg = self
            .node(env, owner, node)
            .await?
            .ok_or_else(|| perr(StanzaErrorCondition::ItemNotFound, None, "no such node"))?;
        let ids: Vec<&str> = el
            .children()
            .filter(|c| c.is("item", NS_PUBSUB))
            .filter_map(|c| c.attr("id"))
            .collect();
        let [id] = ids[..] else {
            return Err(perr(
                StanzaErrorCondition::BadRequest,
                Some("item-required"),
                "name the one item to retract",
            ));
        };
        if !env
            .storage
            .pubsub
            .retract(owner.as_str(), node, id)
            .await
            .map_err(internal)?
        {
            return Err(perr(
                StanzaErrorCondition::ItemNotFound,
                None,
                "no such item",
            ));
        }
        let notify = matches!(el.attr("notify"), Some("1" | "true")) || cfg.notify_retract;
        if notify {
            self.notify(env, owner, node, &cfg, retract_event(node, id))
                .await;
        }
        Ok(())
    }

    /// The owner's use cases (§8): configure, default, delete, purge.
    async fn owner(
        &self,
        env: &Env,
        owner: &BareJid,
        iq: &Stanza,
        ps: &Element,
    ) -> Result<Option<Element>, StanzaError> {
        let Some(op) = ps.children().next() else {
            return Err(perr(
                StanzaErrorCondition::BadRequest,
                None,
                "empty request",
            ));
        };
        let get = iq.type_attr() == Some("get");
        match (op.name(), get) {
            ("default", true) => Ok(Some(
                Element::builder("pubsub", NS_OWNER)
                    .append(
                        Element::builder("default", NS_OWNER)
                            .append(NodeConfig::new(&self.rules()).form(&self.rules(), "form"))
                            .build(),
                    )
                    .build(),
            )),
            ("configure", _) => {
                let node = node_attr(op)?;
                let cfg = self.node(env, owner, node).await?.ok_or_else(|| {
                    perr(StanzaErrorCondition::ItemNotFound, None, "no such node")
                })?;
                if get {
                    return Ok(Some(
                        Element::builder("pubsub", NS_OWNER)
                            .append(
                                Element::builder("configure", NS_OWNER)
                                    .attr("node", node)
                                    .append(cfg.form(&self.rules(), "form"))
                                    .build(),
                            )
                            .build(),
                    ));
                }
                let Some(x) = op.get_child("x", ns::DATA_FORMS) else {
                    return Err(perr(
                        StanzaErrorCondition::BadRequest,
                        None,
                        "submit a node_config form",
                    ));
                };
                let form = Submitted::parse(x);
                if x.attr("type") == Some("cancel") {
                    return Ok(None);
                }
                if form.form_type().is_some_and(|t| t != NS_NODE_CONFIG) {
                    return Err(perr(
                        StanzaErrorCondition::BadRequest,
                        None,
                        "FORM_TYPE must be pubsub#node_config",
                    ));
                }
                let mut next = cfg.clone();
                for var in form.vars() {
                    next.set(&self.rules(), var, form.values(var).unwrap_or_default())
                        .map_err(|e| perr(StanzaErrorCondition::NotAcceptable, None, &e))?;
                }
                if !env
                    .storage
                    .pubsub
                    .set_node_config(owner.as_str(), node, &next.to_stored())
                    .await
                    .map_err(internal)?
                {
                    return Err(perr(
                        StanzaErrorCondition::ItemNotFound,
                        None,
                        "no such node",
                    ));
                }
                let keep = if next.persist_items {
                    next.max_items
                } else {
                    1
                };
                env.storage
                    .pubsub
                    .trim(owner.as_str(), node, keep)
                    .await
                    .map_err(internal)?;
                Ok(None)
            }
            ("delete", false) => {
                let node = node_attr(op)?;
                let cfg = self.node(env, owner, node).await?.ok_or_else(|| {
                    perr(StanzaErrorCondition::ItemNotFound, None, "no such node")
                })?;
                // Whoever would be told must be found before the node goes.
                let to = if cfg.notify_delete {
                    self.recipients(env, owner, node, &cfg).await
                } else {
                    Vec::new()
                };
                env.storage
                    .pubsub
                    .delete_node(owner.as_str(), node)
                    .await
                    .map_err(internal)?;
                if !to.is_empty() {
                    let mut m = Element::builder("message", ns::CLIENT)
                        .attr("type", cfg.notification_type.as_str())
                        .build();
                    m.append_child(delete_event(node, None));
                    for s in crate::modules::common::copies(
                        m,
                        owner.clone().into(),
                        to.into_iter().map(Jid::from),
                    ) {
                        env.route(s).await;
                    }
                }
                Ok(None)
            }
            ("purge", false) => {
                let node = node_attr(op)?;
                let cfg = self.node(env, owner, node).await?.ok_or_else(|| {
                    perr(StanzaErrorCondition::ItemNotFound, None, "no such node")
                })?;
                env.storage
                    .pubsub
                    .purge(owner.as_str(), node)
                    .await
                    .map_err(internal)?;
                self.notify(env, owner, node, &cfg, purge_event(node)).await;
                Ok(None)
            }
            _ => Err(perr(
                StanzaErrorCondition::FeatureNotImplemented,
                Some("unsupported"),
                "not supported on personal nodes",
            )),
        }
    }

    /// A request from the account's own session (`no to` or its bare JID).
    async fn own(
        &self,
        env: &Env,
        me: &FullJid,
        iq: &Stanza,
    ) -> Result<Option<Element>, StanzaError> {
        let owner = me.to_bare();
        let Some(ps) = iq.payload() else {
            return Err(perr(
                StanzaErrorCondition::BadRequest,
                None,
                "empty request",
            ));
        };
        if ps.ns() == NS_OWNER {
            return self.owner(env, &owner, iq, ps).await;
        }
        let set = iq.type_attr() == Some("set");
        let Some(op) = ps
            .children()
            .find(|c| c.ns() == NS_PUBSUB && c.name() != "publish-options")
        else {
            return Err(perr(
                StanzaErrorCondition::BadRequest,
                None,
                "empty request",
            ));
        };
        match (op.name(), set) {
            ("publish", true) => self.publish(env, &owner, me, ps, op).await.map(Some),
            ("retract", true) => self.retract(env, &owner, op).await.map(|()| None),
            ("items", false) => self.items(env, &owner, &owner, op).await.map(Some),
            // Subscriptions to one's own PEP are implicit (+notify).
            _ => Err(perr(
                StanzaErrorCondition::FeatureNotImplemented,
                Some("unsupported"),
                "not supported on personal nodes",
            )),
        }
    }
}

/// `hash:ver` of a presence's capabilities (XEP-0115 §4), if it has
/// hashed ones.
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

fn caps_key(presence: &Element) -> Option<String> {
    let c = presence.get_child("c", NS_CAPS)?;
    let hash = c.attr("hash")?;
    let ver = c.attr("ver")?;
    Some(format!("{hash}:{ver}"))
}

/// The verification string of a disco#info result (XEP-0115 §5.1) and
/// its features, or `None` if the result breaks §5.4's rules (duplicate
/// identities or features, forms without one FORM_TYPE).
fn caps_string(query: &Element) -> Option<(String, HashSet<String>)> {
    let mut ids: Vec<String> = query
        .children()
        .filter(|c| c.is("identity", ns::DISCO_INFO))
        .map(|i| {
            format!(
                "{}/{}/{}/{}",
                i.attr("category").unwrap_or(""),
                i.attr("type").unwrap_or(""),
                i.attr("xml:lang").unwrap_or(""),
                i.attr("name").unwrap_or("")
            )
        })
        .collect();
    let mut features: Vec<String> = query
        .children()
        .filter(|c| c.is("feature", ns::DISCO_INFO))
        .filter_map(|f| f.attr("var").map(str::to_owned))
        .collect();
    let (n_ids, n_features) = (ids.len(), features.len());
    ids.sort();
    ids.dedup();
    features.sort();
    features.dedup();
    if ids.len() != n_ids || features.len() != n_features {
        return None;
    }
    let mut s = String::new();
    for i in &ids {
        s.push_str(i);
        s.push('<');
    }
    for f in &features {
        s.push_str(f);
        s.push('<');
    }
    let mut forms = Vec::new();
    for x in query.children().filter(|c| c.is("x", ns::DATA_FORMS)) {
        let types: Vec<String> = x
            .children()
            .filter(|f| f.attr("var") == Some("FORM_TYPE"))
            .flat_map(|f| {
                f.children()
                    .filter(|v| v.name() == "value")
                    .map(|v| v.text())
            })
            .collect();
        let [form_type] = &types[..] else {
            continue; // no FORM_TYPE: ignored (§5.4 3.6)
        };
        let mut fields: Vec<(String, Vec<String>)> = x
            .children()
            .filter(|f| f.name() == "field" && f.attr("var").is_some_and(|v| v != "FORM_TYPE"))
            .map(|f| {
                let mut v: Vec<String> = f
                    .children()
                    .filter(|v| v.name() == "value")
                    .map(|v| v.text())
                    .collect();
                v.sort();
                (f.attr("var").unwrap_or("").to_owned(), v)
            })
            .collect();
        fields.sort();
        let mut part = format!("{form_type}<");
        for (var, values) in fields {
            part.push_str(&var);
            part.push('<');
            for v in values {
                part.push_str(&v);
                part.push('<');
            }
        }
        forms.push((form_type.clone(), part));
    }
    forms.sort();
    if forms.windows(2).any(|w| w[0].0 == w[1].0) {
        return None; // two forms with one FORM_TYPE (§5.4 3.4)
    }
    for (_, part) in forms {
        s.push_str(&part);
    }
    Some((s, features.into_iter().collect()))
}

/// Whether `ver` is the `hash` of `s` (sha-1 or sha-256, base64).
fn caps_match(hash: &str, ver: &str, s: &str) -> bool {
    use base64::Engine;
    use sha1::Digest as _;
    let digest = match hash {
        "sha-1" => sha1::Sha1::digest(s.as_bytes()).to_vec(),
        "sha-256" => sha2::Sha256::digest(s.as_bytes()).to_vec(),
        _ => return false,
    };
    base64::engine::general_purpose::STANDARD.encode(digest) == ver
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

#[async_trait]
impl UserSendHandler for Pep {
    /// Follows the session's capabilities: asks for unknown ones, takes
    /// the answer, and delivers the last items once they are known.
    async fn user_send(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        match stanza.kind() {
            StanzaKind::Presence if stanza.to().is_none() && stanza.type_attr().is_none() => {
                if self.vcard_conversion {
                    avatar::stamp_presence(cx.env, &cx.jid().to_bare(), stanza).await;
                }
                let Some(key) = caps_key(stanza.element()) else {
                    return Ok(Flow::Continue);
                };
                let known = self.features(cx.env, &key).await;
                let st = cx.state.get_or_insert_with(CapsState::default);
                st.ver = Some(key.clone());
                match known {
                    Some(features) if st.delivered.as_ref() != Some(&key) => {
                        st.delivered = Some(key);
                        self.deliver_last_soon(cx.jid().to_bare(), cx.jid().clone(), features);
                    }
                    Some(_) => {}
                    None if st.pending.is_none() => {
                        let c = stanza
                            .element()
                            .get_child("c", NS_CAPS)
                            .expect("caps_key found it");
                        let (hash, ver) = key.split_once(':').expect("made with a colon");
                        let (hash, ver) = (hash.to_owned(), ver.to_owned());
                        let id = format!("caps-{}", starling_proto::random_id(8));
                        let mut q = Element::new("query", ns::DISCO_INFO);
                        q.set_attr("node", format!("{}#{ver}", c.attr("node").unwrap_or("")));
                        let mut iq = Element::builder("iq", ns::CLIENT)
                            .attr("type", "get")
                            .attr("id", id.clone())
                            .attr("from", cx.info.domain.clone())
                            .attr("to", cx.jid().as_str())
                            .build();
                        iq.append_child(q);
                        cx.state.get_or_insert_with(CapsState::default).pending =
                            Some((id, hash, ver));
                        cx.send(iq);
                    }
                    None => {}
                }
                Ok(Flow::Continue)
            }
            StanzaKind::Iq
                if self.vcard_conversion
                    && stanza.type_attr() == Some("set")
                    && stanza
                        .to()
                        .is_none_or(|t| t.to_bare() == cx.jid().to_bare()) =>
            {
                if let Some(card) = stanza.payload().filter(|p| p.is("vCard", "vcard-temp")) {
                    let owner = cx.jid().to_bare();
                    avatar::vcard_set(self, cx.env, &owner, card).await;
                }
                Ok(Flow::Continue)
            }
            StanzaKind::Iq if !stanza.is_iq_request() => {
                let Some((id, hash, ver)) =
                    cx.state.get::<CapsState>().and_then(|s| s.pending.clone())
                else {
                    return Ok(Flow::Continue);
                };
                if stanza.id() != Some(id.as_str()) {
                    return Ok(Flow::Continue);
                }
                if let Some(s) = cx.state.get_mut::<CapsState>() {
                    s.pending = None;
                }
                let verified = stanza
                    .element()
                    .get_child("query", ns::DISCO_INFO)
                    .filter(|_| stanza.type_attr() == Some("result"))
                    .and_then(caps_string)
                    .filter(|(s, _)| caps_match(&hash, &ver, s));
                let key = format!("{hash}:{ver}");
                match verified {
                    Some((_, features)) => {
                        let mut lines: Vec<&str> = features.iter().map(String::as_str).collect();
                        lines.sort_unstable();
                        if let Err(e) = cx
                            .env
                            .storage
                            .user_data
                            .set(&caps_owner(), CAPS_KIND, &key, &lines.join("\n"))
                            .await
                        {
                            tracing::warn!(module = NAME, caps = %key, error = %e, "storing verified capabilities failed");
                        }
                        let features = Arc::new(features);
                        self.remember(&key, features.clone());
                        let current = cx.state.get::<CapsState>().and_then(|s| s.ver.clone());
                        if current.as_ref() == Some(&key) {
                            if let Some(s) = cx.state.get_mut::<CapsState>() {
                                s.delivered = Some(key);
                            }
                            self.deliver_last_soon(cx.jid().to_bare(), cx.jid().clone(), features);
                        }
                    }
                    None => {
                        starling_core::log_throttled!(info, module = NAME, jid = %cx.jid(), caps = %key, "capabilities not verified (§5.4): not cached");
                    }
                }
                Ok(Flow::Stop)
            }
            _ => Ok(Flow::Continue),
        }
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

    /// XEP-0115 §5.2's simple example and §5.3's complex one.
    #[test]
    fn caps_strings_and_hashes_match_the_xep_examples() {
        let simple: Element = "<query xmlns='http://jabber.org/protocol/disco#info'>\
            <identity category='client' name='Exodus 0.9.1' type='pc'/>\
            <feature var='http://jabber.org/protocol/caps'/>\
            <feature var='http://jabber.org/protocol/disco#info'/>\
            <feature var='http://jabber.org/protocol/disco#items'/>\
            <feature var='http://jabber.org/protocol/muc'/></query>"
            .parse()
            .unwrap();
        let (s, f) = caps_string(&simple).unwrap();
        assert_eq!(s, "client/pc//Exodus 0.9.1<http://jabber.org/protocol/caps<http://jabber.org/protocol/disco#info<http://jabber.org/protocol/disco#items<http://jabber.org/protocol/muc<");
        assert!(caps_match("sha-1", "QgayPKawpkPSDYmwT/WM94uAlu0=", &s));
        assert!(f.contains("http://jabber.org/protocol/muc"));
        let complex: Element = "<query xmlns='http://jabber.org/protocol/disco#info'>\
            <identity xml:lang='en' category='client' name='Psi 0.11' type='pc'/>\
            <identity xml:lang='el' category='client' name='Ψ 0.11' type='pc'/>\
            <feature var='http://jabber.org/protocol/caps'/>\
            <feature var='http://jabber.org/protocol/disco#info'/>\
            <feature var='http://jabber.org/protocol/disco#items'/>\
            <feature var='http://jabber.org/protocol/muc'/>\
            <x xmlns='jabber:x:data' type='result'>\
              <field var='FORM_TYPE' type='hidden'><value>urn:xmpp:dataforms:softwareinfo</value></field>\
              <field var='ip_version'><value>ipv4</value><value>ipv6</value></field>\
              <field var='os'><value>Mac</value></field>\
              <field var='os_version'><value>10.5.1</value></field>\
              <field var='software'><value>Psi</value></field>\
              <field var='software_version'><value>0.11</value></field>\
            </x></query>"
            .parse()
            .unwrap();
        let (s, _) = caps_string(&complex).unwrap();
        assert!(
            caps_match("sha-1", "q07IKJEyjvHSyhy//CH0CxmKi8w=", &s),
            "{s}"
        );
        assert!(!caps_match("sha-1", "QgayPKawpkPSDYmwT/WM94uAlu0=", &s));
        // §5.4: a duplicate feature makes the answer unusable.
        let dup: Element = "<query xmlns='http://jabber.org/protocol/disco#info'>\
            <feature var='a'/><feature var='a'/></query>"
            .parse()
            .unwrap();
        assert!(caps_string(&dup).is_none());
    }

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
