//! Publish-subscribe (XEP-0060 1.26, `reference/xeps/xep-0060.xml`) at
//! `pubsub.<domain>` (`[modules.pubsub]`, docs/pubsub.md): a generic
//! service of leaf nodes that local accounts create, publish to and
//! subscribe to (feeds, application data, bots). Personal eventing (every
//! account a service of its own) is the `pep` module; both use
//! `modules::common::pubsub` (node configuration, publish requests, events).
//!
//! - **Entity** (§5): disco#info of the service (identity
//!   `pubsub/service`, the features built, exactly those) and of a node
//!   (`pubsub/leaf` with the `pubsub#meta-data` form); disco#items of the
//!   service (nodes, by name) and of a node (item ids), with XEP-0059
//!   paging; the requester's subscriptions (§5.6: its bare JID and every
//!   full JID of it) and affiliations (§5.7).
//! - **Subscriber** (§6): subscribe with a bare or full JID of the
//!   requester (§6.1; service admins may subscribe others), with options
//!   (§6.3.7); a second subscription with other options gets its own
//!   subid (multi-subscribe, §6.1.6), one with the same options returns
//!   the existing one; unsubscribe (§6.2); subscription options
//!   (`pubsub#deliver`; digest and message bodies are refused) and their
//!   defaults (§6.3, §6.4); items: all, `max_items`, by id, XEP-0059
//!   paging over the node's items (§6.5); the last item on subscription
//!   when the node says `on_sub` (§6.1.7), with a delay stamp.
//! - **Publisher** (§7): publish with item ids made by the service when
//!   absent, auto-create for those who may create nodes, publish-options
//!   preconditions (§7.1.5), payloads up to `max_item_bytes`; retract
//!   (§7.2). Notifications are headline (or normal) messages from the
//!   service's JID to each subscribed JID once, with SHIM `SubID` headers
//!   (§12.3) when the JID holds several subscriptions; a subscription
//!   with `pubsub#deliver` off gets none.
//! - **Owner** (§8): create (named, instant, with configuration), node
//!   configuration with `notify_config`, default configuration, delete
//!   (with redirect), purge, subscriptions and affiliations management
//!   (several entries per request, the failed ones returned with
//!   `not-acceptable`; the last owner cannot leave); subscribers are told
//!   of the changes to their subscriptions (§12.8 "Notification of
//!   Subscription State Changes"), also when a changed access model or
//!   affiliation removes them.
//! - **Access** (§4.1, §4.5): affiliations owner, publisher, publish-only,
//!   member, outcast; access models open (the default), presence and
//!   roster (an owner's roster, for owners with a local account) and
//!   whitelist (owners, publishers and members). Service admins
//!   (`admins`) have owner rights on every node.
//! - Everything is in storage (`PubsubStore`, service = the service's
//!   domain), so on a cluster any node answers and notifications are
//!   routed to subscribers wherever they are. A deleted account loses its
//!   subscriptions and affiliations (`PubsubStore::remove_user`); the
//!   nodes it owned alone are left to the service admins.
//! - Not built: collection nodes (XEP-0248), the `authorize` access
//!   model and pending subscriptions (§8.6, §8.7), digests, message
//!   bodies and presence-based delivery, the last item on presence
//!   (`on_sub_and_presence`), item expiry, JID addressing of nodes (§4.6.1).
//!
//! Hooks: a [`Service`] at `<subdomain>.<each served domain>`. Storage:
//! `pubsub`, `roster` (access models presence and roster). Config:
//! `[modules.pubsub]` enabled, subdomain, name, create_nodes, admins,
//! default_max_items, max_items, max_nodes, max_subscriptions_per_node,
//! max_item_bytes, max_bytes_per_owner (a quota over the items of the
//! nodes one JID owns, summed in storage at each publication).

mod entity;
mod owner;

use crate::modules::common::pubsub::{
    node_attr, perr, Access, NodeConfig, Rules, Seq, NS_EVENT, NS_OWNER, NS_PUBSUB,
};
use serde::{Deserialize, Serialize};
use starling_core::forms::{FormBuilder, Submitted};
use starling_core::hooks::{HookRegistry, Service, ServiceAddress};
use starling_core::module::{ConfigProblem, Module, ModuleCtx};
use starling_core::storage::{PubsubSubscription, StorageError, Subscription};
use starling_core::{async_trait, Env};
use starling_proto::{
    ns, BareJid, ErrorType, Jid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind,
};
use starling_xml::Element;
use std::collections::{BTreeMap, HashMap};

const NAME: &str = "pubsub";
const NS_META_DATA: &str = "http://jabber.org/protocol/pubsub#meta-data";
const NS_SUBSCRIBE_OPTIONS: &str = "http://jabber.org/protocol/pubsub#subscribe_options";
const NS_RSM: &str = "http://jabber.org/protocol/rsm";
const NS_SHIM: &str = "http://jabber.org/protocol/shim";
/// The longest item id (bytes).
const MAX_ITEM_ID: usize = 1024;

/// `[modules.pubsub]`: XEP-0060.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PubsubConfig {
    /// Run the service (off by default: PEP already serves what
    /// mainstream clients publish; this one is for applications).
    pub enabled: bool,
    /// The service's subdomain of every served domain.
    pub subdomain: String,
    /// Its name in service discovery.
    pub name: String,
    /// Who may create nodes: `local` (accounts of the served domains),
    /// `admins` (only `admins`) or `all` (any JID whose stanzas arrive).
    pub create_nodes: String,
    /// Service administrators (bare JIDs): owner rights on every node.
    pub admins: Vec<String>,
    /// `pubsub#max_items` of a node created without one.
    pub default_max_items: u32,
    /// The most items a node may keep (what `max` means; the most one
    /// page of items holds).
    pub max_items: u32,
    /// Nodes the service may have (each served domain's service apart).
    pub max_nodes: u32,
    /// Subscriptions one node may have.
    pub max_subscriptions_per_node: u32,
    /// Largest payload of an item, in bytes of XML.
    pub max_item_bytes: usize,
    /// Bytes of item payload the nodes one JID owns may hold together,
    /// whoever published them (0: no limit). A publication beyond it gets
    /// `<not-acceptable/>` + `<payload-too-big/>`, and nothing is stored.
    pub max_bytes_per_owner: u64,
}

impl Default for PubsubConfig {
    fn default() -> Self {
        PubsubConfig {
            enabled: false,
            subdomain: "pubsub".into(),
            name: "Publish-Subscribe".into(),
            create_nodes: "local".into(),
            admins: Vec::new(),
            default_max_items: 10,
            max_items: 1000,
            max_nodes: 1000,
            max_subscriptions_per_node: 10_000,
            max_item_bytes: 65_536,
            max_bytes_per_owner: 64 * 1024 * 1024,
        }
    }
}

/// The pubsub module.
pub struct Pubsub;

impl Module for Pubsub {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str =
        "XEP-0060 publish-subscribe service (leaf nodes, subscriptions, affiliations) at pubsub.<domain>";
    type Config = PubsubConfig;
    const STORAGE: &'static [&'static str] = &["pubsub", "roster"];

    fn subdomain(cfg: &Self::Config) -> Option<&str> {
        Some(&cfg.subdomain)
    }
    fn enabled(cfg: &PubsubConfig) -> bool {
        cfg.enabled
    }

    fn validate(cfg: &PubsubConfig, _domains: &[String]) -> Result<(), ConfigProblem> {
        crate::modules::common::check_subdomain(&cfg.subdomain, "pubsub")?;
        if !matches!(cfg.create_nodes.as_str(), "local" | "admins" | "all") {
            return Err(ConfigProblem::new(
                "create_nodes",
                "must be \"local\", \"admins\" or \"all\"",
            ));
        }
        for a in &cfg.admins {
            if BareJid::new(a).map_or(true, |j| j.as_str() != a) {
                return Err(ConfigProblem::new(
                    "admins",
                    format!("{a} is not a bare JID (in its normalized form)"),
                ));
            }
        }
        if cfg.max_items == 0 || cfg.default_max_items == 0 || cfg.default_max_items > cfg.max_items
        {
            return Err(ConfigProblem::new(
                "max_items",
                "max_items and default_max_items must be at least 1, and default_max_items at most max_items",
            ));
        }
        for (key, v) in [
            ("max_nodes", cfg.max_nodes as usize),
            (
                "max_subscriptions_per_node",
                cfg.max_subscriptions_per_node as usize,
            ),
            ("max_item_bytes", cfg.max_item_bytes),
        ] {
            if v == 0 {
                return Err(ConfigProblem::new(key, "must be at least 1"));
            }
        }
        Ok(())
    }

    async fn start(cfg: &PubsubConfig, _ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        let svc = PubsubService {
            rules: Rules {
                default_max_items: cfg.default_max_items,
                max_items: cfg.max_items,
                service: true,
            },
            cfg: cfg.clone(),
            seq: Seq::default(),
        };
        // The label lives as long as the server (one per start).
        let label: &'static str = Box::leak(cfg.subdomain.clone().into_boxed_str());
        reg.service(
            NAME,
            ServiceAddress::Subdomain(label),
            &cfg.name,
            std::sync::Arc::new(svc),
        );
    }
}

/// An affiliation (§4.1); `none` is its absence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Aff {
    Owner,
    Publisher,
    PublishOnly,
    Member,
    Outcast,
}

impl Aff {
    fn as_str(self) -> &'static str {
        match self {
            Aff::Owner => "owner",
            Aff::Publisher => "publisher",
            Aff::PublishOnly => "publish-only",
            Aff::Member => "member",
            Aff::Outcast => "outcast",
        }
    }

    /// `Some(None)` for `none`.
    fn parse(s: &str) -> Option<Option<Aff>> {
        Some(Some(match s {
            "owner" => Aff::Owner,
            "publisher" => Aff::Publisher,
            "publish-only" => Aff::PublishOnly,
            "member" => Aff::Member,
            "outcast" => Aff::Outcast,
            "none" => return Some(None),
            _ => return None,
        }))
    }
}

/// A node as stored: its configuration and affiliations.
struct Node {
    name: String,
    cfg: NodeConfig,
    created_at: i64,
    /// (bare JID, affiliation), by JID.
    affs: Vec<(String, Aff)>,
}

impl Node {
    fn stored_aff(&self, jid: &str) -> Option<Aff> {
        self.affs.iter().find(|(j, _)| j == jid).map(|(_, a)| *a)
    }

    fn with(&self, aff: Aff) -> impl Iterator<Item = &str> {
        self.affs
            .iter()
            .filter(move |(_, a)| *a == aff)
            .map(|(j, _)| j.as_str())
    }
}

/// A subscription's options (§6.3), stored as JSON (empty: the defaults).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct SubOptions {
    /// `pubsub#deliver`: notifications are sent.
    deliver: bool,
}

impl Default for SubOptions {
    fn default() -> Self {
        SubOptions { deliver: true }
    }
}

impl SubOptions {
    fn from_stored(s: &str) -> SubOptions {
        serde_json::from_str(s).unwrap_or_default()
    }

    fn to_stored(&self) -> String {
        if *self == SubOptions::default() {
            String::new()
        } else {
            serde_json::to_string(self).expect("options serialize")
        }
    }

    /// The `pubsub#subscribe_options` form (§6.3.2, §16.2).
    fn form(&self, kind: &str) -> Element {
        FormBuilder::new(kind, Some(NS_SUBSCRIBE_OPTIONS))
            .boolean("pubsub#deliver", "Enable delivery?", self.deliver)
            .build()
    }

    /// Applies a submitted form; `bad-request` + `invalid-options` for
    /// what cannot be applied (§6.3.5).
    fn apply(&mut self, x: &Element) -> Result<(), StanzaError> {
        let form = Submitted::parse(x);
        let invalid = |text: &str| {
            perr(
                StanzaErrorCondition::BadRequest,
                Some("invalid-options"),
                text,
            )
        };
        if form.form_type().is_some_and(|t| t != NS_SUBSCRIBE_OPTIONS) {
            return Err(invalid(
                "subscription options need FORM_TYPE pubsub#subscribe_options",
            ));
        }
        let mut next = self.clone();
        for var in form.vars() {
            let value = || form.boolean(var).map_err(|e| invalid(&e.to_string()));
            match var {
                "FORM_TYPE" => {}
                "pubsub#deliver" => next.deliver = value()?.unwrap_or(true),
                "pubsub#digest" | "pubsub#include_body" => {
                    if value()? == Some(true) {
                        return Err(invalid(&format!("{var} is not supported")));
                    }
                }
                _ => return Err(invalid(&format!("{var} is not a supported option"))),
            }
        }
        *self = next;
        Ok(())
    }
}

/// One request to the service.
struct Req<'a> {
    env: &'a Env,
    /// The service's domain (the `service` of its stored nodes).
    svc: &'a str,
    /// The requester's bare JID (from the `from` its session stamped).
    who: BareJid,
}

/// What a request produced.
#[derive(Default)]
struct Done {
    /// The result's payload (or, with `error`, the error's).
    payload: Option<Element>,
    /// A request partly refused (§8.8.2.4, §8.9.2.4): the error to answer
    /// with, `payload` holding the refused entries.
    error: Option<StanzaError>,
    /// Notifications to send after the answer.
    then: Vec<Stanza>,
}

impl Done {
    fn reply(payload: Element) -> Done {
        Done {
            payload: Some(payload),
            ..Done::default()
        }
    }
}

type Out = Result<Done, StanzaError>;

fn internal(e: StorageError) -> StanzaError {
    tracing::error!(module = NAME, error = %e, "storage failed");
    StanzaError::new(StanzaErrorCondition::InternalServerError).with_type(ErrorType::Wait)
}

fn no_node() -> StanzaError {
    perr(StanzaErrorCondition::ItemNotFound, None, "no such node")
}

fn forbidden(text: &str) -> StanzaError {
    perr(StanzaErrorCondition::Forbidden, None, text)
}

fn bad(text: &str) -> StanzaError {
    perr(StanzaErrorCondition::BadRequest, None, text)
}

/// `<subscription [node] jid subscription [subid]/>` in namespace `ns`.
fn sub_el(ns: &str, node: Option<&str>, jid: &str, state: &str, subid: Option<&str>) -> Element {
    let mut el = Element::builder("subscription", ns).build();
    if let Some(n) = node {
        el.set_attr("node", n);
    }
    el.set_attr("jid", jid);
    el.set_attr("subscription", state);
    if let Some(s) = subid {
        el.set_attr("subid", s);
    }
    el
}

/// XEP-0059 paging of a list the service holds whole.
#[derive(Debug, Default)]
struct Rsm {
    max: Option<usize>,
    after: Option<String>,
    /// `Some("")`: the last page.
    before: Option<String>,
    index: Option<usize>,
}

impl Rsm {
    /// The `<set/>` child of `parent`, if any.
    fn of(parent: &Element) -> Result<Option<Rsm>, StanzaError> {
        let Some(set) = parent.get_child("set", NS_RSM) else {
            return Ok(None);
        };
        let number = |name: &str| -> Result<Option<usize>, StanzaError> {
            set.get_child(name, NS_RSM)
                .map(|e| {
                    e.text()
                        .trim()
                        .parse::<usize>()
                        .map_err(|_| bad(&format!("<{name}/> is a number")))
                })
                .transpose()
        };
        Ok(Some(Rsm {
            max: number("max")?,
            index: number("index")?,
            after: set.get_child("after", NS_RSM).map(|e| e.text()),
            before: set.get_child("before", NS_RSM).map(|e| e.text()),
        }))
    }

    /// The page of `ids` asked for (at most `cap` long) and its `<set/>`.
    /// An unknown `after` or `before` is `item-not-found` (XEP-0059 §2.6).
    fn page(
        &self,
        ids: &[&str],
        cap: usize,
    ) -> Result<(std::ops::Range<usize>, Element), StanzaError> {
        let n = ids.len();
        let max = self.max.unwrap_or(cap).min(cap);
        let pos = |id: &str| {
            ids.iter().position(|i| *i == id).ok_or_else(|| {
                perr(
                    StanzaErrorCondition::ItemNotFound,
                    None,
                    "no such item to page from",
                )
            })
        };
        let range = if let Some(a) = &self.after {
            let start = pos(a)? + 1;
            start..(start + max).min(n)
        } else if let Some(b) = &self.before {
            let end = if b.is_empty() { n } else { pos(b)? };
            end.saturating_sub(max)..end
        } else {
            let start = self.index.unwrap_or(0).min(n);
            start..(start + max).min(n)
        };
        let mut set = Element::new("set", NS_RSM);
        if !range.is_empty() {
            set.append_child(
                Element::builder("first", NS_RSM)
                    .attr("index", range.start.to_string())
                    .text(ids[range.start])
                    .build(),
            );
            set.append_child(
                Element::builder("last", NS_RSM)
                    .text(ids[range.end - 1])
                    .build(),
            );
        }
        set.append_child(
            Element::builder("count", NS_RSM)
                .text(n.to_string())
                .build(),
        );
        Ok((range, set))
    }
}

/// The service at one or more `pubsub.<domain>`.
struct PubsubService {
    cfg: PubsubConfig,
    rules: Rules,
    seq: Seq,
}

#[async_trait]
impl Service for PubsubService {
    async fn handle(&self, env: &Env, st: Stanza) {
        for s in self.answer(env, &st).await {
            env.route(s).await;
        }
    }
}

impl PubsubService {
    /// The stanzas a stanza to the service produces: its answer, then
    /// notifications.
    async fn answer(&self, env: &Env, st: &Stanza) -> Vec<Stanza> {
        let Some(to) = st.to() else {
            return Vec::new();
        };
        let unavailable =
            |text: &str| StanzaError::new(StanzaErrorCondition::ServiceUnavailable).with_text(text);
        match st.kind() {
            StanzaKind::Iq if st.is_iq_request() => {}
            // Errors (a notification that bounced), headlines, group chat
            // and presence: nothing to answer (as the router does). Other
            // messages: nothing here takes them (no subscription
            // authorization forms, §8.6).
            StanzaKind::Message if matches!(st.stanza_type(), "chat" | "normal") => {
                return st
                    .error_reply(unavailable("the pubsub service takes no messages"))
                    .into_iter()
                    .collect()
            }
            _ => return Vec::new(),
        }
        let Some(from) = st.from() else {
            return Vec::new();
        };
        if to.node().is_some() || to.resource().is_some() {
            // JID addressing of nodes (§4.6.1) is not built.
            return st
                .error_reply(unavailable(
                    "address the service's domain, with node attributes",
                ))
                .into_iter()
                .collect();
        }
        let Some(q) = st.payload() else {
            return st.error_reply(bad("empty request")).into_iter().collect();
        };
        let r = Req {
            env,
            svc: to.domain().as_str(),
            who: from.to_bare(),
        };
        let get = st.type_attr() == Some("get");
        let out = match (q.ns(), q.name()) {
            (ns::DISCO_INFO, "query") if get => self.disco_info(&r, q).await.map(Done::reply),
            (ns::DISCO_ITEMS, "query") if get => self.disco_items(&r, q).await.map(Done::reply),
            (NS_PUBSUB, "pubsub") => self.entity(&r, q, get).await,
            (NS_OWNER, "pubsub") => self.owner(&r, q, get).await,
            _ => Err(unavailable("not a request the pubsub service answers")),
        };
        match out {
            Ok(done) => {
                let first = match done.error {
                    None => st.iq_result(done.payload),
                    Some(e) => {
                        let mut el = Element::new("iq", ns::CLIENT);
                        if let Some(id) = st.id() {
                            el.set_attr("id", id);
                        }
                        el.set_attr("type", "error");
                        if let Some(p) = done.payload {
                            el.append_child(p);
                        }
                        el.append_child(e.to_element());
                        Stanza::new(el, st.to().cloned(), st.from().cloned())
                    }
                };
                std::iter::once(first).chain(done.then).collect()
            }
            Err(e) => st.error_reply(e).into_iter().collect(),
        }
    }

    /// §5 and §6, §7: requests in the `pubsub` namespace.
    async fn entity(&self, r: &Req<'_>, ps: &Element, get: bool) -> Out {
        let Some(op) = ps.children().next().filter(|op| op.ns() == NS_PUBSUB) else {
            return Err(bad("empty request"));
        };
        match (op.name(), get) {
            ("items", true) => self.items(r, ps, op).await,
            ("subscriptions", true) => self.own_subscriptions(r, op).await,
            ("affiliations", true) => self.own_affiliations(r, op).await,
            ("options", true) => self.options_get(r, op).await,
            ("options", false) => self.options_set(r, op).await,
            ("default", true) => self.default_options(r, op).await,
            ("subscribe", false) => self.subscribe(r, ps, op).await,
            ("unsubscribe", false) => self.unsubscribe(r, op).await,
            ("publish", false) => self.publish(r, ps, op).await,
            ("retract", false) => self.retract(r, op).await,
            ("create", false) => self.create(r, ps, op).await,
            _ => Err(bad(&format!(
                "<{}/> in an iq {} is not a pubsub request",
                op.name(),
                if get { "get" } else { "set" }
            ))),
        }
    }

    /// §8: requests in the `pubsub#owner` namespace.
    async fn owner(&self, r: &Req<'_>, ps: &Element, get: bool) -> Out {
        let Some(op) = ps.children().next().filter(|op| op.ns() == NS_OWNER) else {
            return Err(bad("empty request"));
        };
        match (op.name(), get) {
            ("configure", true) => self.configure_get(r, op).await,
            ("configure", false) => self.configure_set(r, op).await,
            ("default", true) => self.default_config(op),
            ("delete", false) => self.delete(r, op).await,
            ("purge", false) => self.purge(r, op).await,
            ("subscriptions", true) => self.subscriptions_get(r, op).await,
            ("subscriptions", false) => self.subscriptions_set(r, op).await,
            ("affiliations", true) => self.affiliations_get(r, op).await,
            ("affiliations", false) => self.affiliations_set(r, op).await,
            _ => Err(bad(&format!(
                "<{}/> in an iq {} is not a pubsub owner request",
                op.name(),
                if get { "get" } else { "set" }
            ))),
        }
    }

    fn is_admin(&self, jid: &BareJid) -> bool {
        self.cfg.admins.iter().any(|a| a == jid.as_str())
    }

    /// `jid`'s affiliation with `node`: owner for service admins.
    fn aff_of(&self, node: &Node, jid: &BareJid) -> Option<Aff> {
        if self.is_admin(jid) {
            Some(Aff::Owner)
        } else {
            node.stored_aff(jid.as_str())
        }
    }

    /// Whether the requester may create nodes (`create_nodes`).
    fn may_create(&self, r: &Req<'_>) -> bool {
        self.is_admin(&r.who)
            || match self.cfg.create_nodes.as_str() {
                "all" => true,
                "local" => r.env.hosts.is_local(r.who.domain().as_str()),
                _ => false,
            }
    }

    /// The node, with its affiliations.
    async fn node(&self, r: &Req<'_>, name: &str) -> Result<Option<Node>, StanzaError> {
        let ps = &r.env.storage.pubsub;
        let Some(stored) = ps.node(r.svc, name).await.map_err(internal)? else {
            return Ok(None);
        };
        let cfg = NodeConfig::from_stored(&stored.config).unwrap_or_else(|| {
            tracing::error!(
                module = NAME,
                service = r.svc,
                node = name,
                "unreadable node configuration; the defaults apply"
            );
            NodeConfig::new(&self.rules)
        });
        let affs = ps
            .affiliations(r.svc, name)
            .await
            .map_err(internal)?
            .into_iter()
            .filter_map(|(j, a)| Some((j, Aff::parse(&a).flatten()?)))
            .collect();
        Ok(Some(Node {
            name: name.to_owned(),
            cfg,
            created_at: stored.created_at,
            affs,
        }))
    }

    /// The node named by `op`'s `node` attribute (`nodeid-required`,
    /// `item-not-found`).
    async fn named_node(&self, r: &Req<'_>, op: &Element) -> Result<Node, StanzaError> {
        let name = node_attr(op)?;
        self.node(r, name).await?.ok_or_else(no_node)
    }

    /// Whether `jid` (with affiliation `aff`) may subscribe to the node
    /// and retrieve its items (§4.1 table, §6.1.3, §6.5.9).
    async fn access(
        &self,
        env: &Env,
        node: &Node,
        jid: &BareJid,
        aff: Option<Aff>,
    ) -> Result<(), StanzaError> {
        match aff {
            Some(Aff::Outcast) => return Err(forbidden("you are banned from this node")),
            Some(Aff::PublishOnly) => {
                return Err(forbidden(
                    "a publish-only affiliation neither subscribes nor retrieves items",
                ))
            }
            Some(_) => return Ok(()),
            None => {}
        }
        let groups = &node.cfg.roster_groups_allowed;
        let in_roster = |item: &starling_core::storage::RosterItem| match node.cfg.access_model {
            Access::Presence => {
                matches!(item.subscription, Subscription::From | Subscription::Both)
            }
            _ => item.groups.iter().any(|g| groups.contains(g)),
        };
        match node.cfg.access_model {
            Access::Open => Ok(()),
            Access::Whitelist => Err(perr(
                StanzaErrorCondition::NotAllowed,
                Some("closed-node"),
                "only the node's owners, publishers and members see it",
            )),
            model => {
                for owner in node.with(Aff::Owner) {
                    let Ok(owner) = BareJid::new(owner) else {
                        continue;
                    };
                    if !env.hosts.is_local(owner.domain().as_str()) {
                        continue;
                    }
                    let item = env
                        .storage
                        .roster
                        .get_item(&owner, jid)
                        .await
                        .map_err(internal)?;
                    if item.as_ref().is_some_and(in_roster) {
                        return Ok(());
                    }
                }
                Err(if model == Access::Presence {
                    perr(
                        StanzaErrorCondition::NotAuthorized,
                        Some("presence-subscription-required"),
                        "only contacts subscribed to an owner's presence see this node",
                    )
                } else {
                    perr(
                        StanzaErrorCondition::NotAuthorized,
                        Some("not-in-roster-group"),
                        "only contacts in an owner's allowed roster groups see this node",
                    )
                })
            }
        }
    }

    /// Who gets the node's notifications: each subscribed JID once, if
    /// one of its subscriptions delivers (`pubsub#deliver`) and the node
    /// still admits it, with the subids of those subscriptions when the
    /// JID holds several (SHIM headers, §12.3).
    async fn recipients(
        &self,
        r: &Req<'_>,
        node: &Node,
    ) -> Result<Vec<(Jid, Vec<String>)>, StanzaError> {
        let subs = r
            .env
            .storage
            .pubsub
            .subscriptions(r.svc, &node.name)
            .await
            .map_err(internal)?;
        let mut by_jid: BTreeMap<&str, Vec<&PubsubSubscription>> = BTreeMap::new();
        for s in subs.iter().filter(|s| s.state == "subscribed") {
            by_jid.entry(s.jid.as_str()).or_default().push(s);
        }
        let mut admitted: HashMap<BareJid, bool> = HashMap::new();
        let mut out = Vec::new();
        for (jid, held) in by_jid {
            let delivering: Vec<String> = held
                .iter()
                .filter(|s| SubOptions::from_stored(&s.options).deliver)
                .map(|s| s.subid.clone())
                .collect();
            if delivering.is_empty() {
                continue;
            }
            let Ok(jid) = Jid::new(jid) else {
                continue;
            };
            let bare = jid.to_bare();
            let ok = match admitted.get(&bare) {
                Some(ok) => *ok,
                None => {
                    let ok = self
                        .access(r.env, node, &bare, self.aff_of(node, &bare))
                        .await
                        .is_ok();
                    admitted.insert(bare, ok);
                    ok
                }
            };
            if ok {
                let subids = if held.len() > 1 {
                    delivering
                } else {
                    Vec::new()
                };
                out.push((jid, subids));
            }
        }
        Ok(out)
    }

    /// `event` to each of `to` in a message of the node's notification
    /// type from the service, with the SubID headers each names. Copies
    /// without headers share one serialisation.
    fn notes(
        &self,
        r: &Req<'_>,
        cfg: &NodeConfig,
        event: Element,
        to: Vec<(Jid, Vec<String>)>,
    ) -> Vec<Stanza> {
        self.notes_with(r, cfg, event, None, to)
    }

    /// [`Self::notes`] with `extra` (a delay stamp) after the event.
    fn notes_with(
        &self,
        r: &Req<'_>,
        cfg: &NodeConfig,
        event: Element,
        extra: Option<Element>,
        to: Vec<(Jid, Vec<String>)>,
    ) -> Vec<Stanza> {
        let Ok(service) = Jid::new(r.svc) else {
            return Vec::new();
        };
        let mut m = Element::builder("message", ns::CLIENT)
            .attr("type", cfg.notification_type.as_str())
            .attr("id", starling_proto::random_id(10))
            .build();
        m.append_child(event);
        if let Some(x) = extra {
            m.append_child(x);
        }
        let (plain, headed): (Vec<_>, Vec<_>) = to.into_iter().partition(|(_, s)| s.is_empty());
        let mut out = Vec::with_capacity(plain.len() + headed.len());
        for (jid, subids) in headed {
            let mut one = m.clone();
            one.append_child(shim(&subids));
            out.push(Stanza::new(one, Some(service.clone()), Some(jid)));
        }
        if !plain.is_empty() {
            out.extend(crate::modules::common::copies(
                m,
                service,
                plain.into_iter().map(|(j, _)| j),
            ));
        }
        out
    }

    /// Tells `jid` of its subscription's new state (§12.8).
    fn subscription_note(
        &self,
        r: &Req<'_>,
        node: &Node,
        jid: &str,
        state: &str,
        subid: Option<&str>,
    ) -> Option<Stanza> {
        let to = Jid::new(jid).ok()?;
        let event = Element::builder("event", NS_EVENT)
            .append(sub_el(NS_EVENT, Some(&node.name), jid, state, subid))
            .build();
        self.notes(r, &node.cfg, event, vec![(to, Vec::new())])
            .pop()
    }

    /// Removes the subscriptions the node no longer admits (its access
    /// model or an affiliation changed), of `only` if given, telling each
    /// subscriber.
    async fn prune(
        &self,
        r: &Req<'_>,
        node: &Node,
        only: Option<&[BareJid]>,
    ) -> Result<Vec<Stanza>, StanzaError> {
        let ps = &r.env.storage.pubsub;
        let subs = ps
            .subscriptions(r.svc, &node.name)
            .await
            .map_err(internal)?;
        let mut admitted: HashMap<BareJid, bool> = HashMap::new();
        let mut out = Vec::new();
        for s in subs {
            let Ok(jid) = Jid::new(&s.jid) else {
                continue;
            };
            let bare = jid.to_bare();
            if only.is_some_and(|o| !o.contains(&bare)) {
                continue;
            }
            let ok = match admitted.get(&bare) {
                Some(ok) => *ok,
                None => {
                    let ok = self
                        .access(r.env, node, &bare, self.aff_of(node, &bare))
                        .await
                        .is_ok();
                    admitted.insert(bare, ok);
                    ok
                }
            };
            if !ok {
                ps.remove_subscription(r.svc, &node.name, &s.jid, Some(&s.subid))
                    .await
                    .map_err(internal)?;
                out.extend(self.subscription_note(r, node, &s.jid, "none", Some(&s.subid)));
            }
        }
        Ok(out)
    }

    // ----- discovery (§5.1 to §5.5) -----

    /// §5.1 (the service), §5.3 and §5.4 (a node).
    async fn disco_info(&self, r: &Req<'_>, q: &Element) -> Result<Element, StanzaError> {
        let mut out = Element::new("query", ns::DISCO_INFO);
        let identity = |ty: &str| {
            Element::builder("identity", ns::DISCO_INFO)
                .attr("category", "pubsub")
                .attr("type", ty)
                .build()
        };
        let feature = |f: &str| {
            Element::builder("feature", ns::DISCO_INFO)
                .attr("var", f)
                .build()
        };
        let Some(name) = q.attr("node") else {
            let mut id = identity("service");
            id.set_attr("name", self.cfg.name.as_str());
            out.append_child(id);
            for f in [ns::DISCO_INFO, ns::DISCO_ITEMS, NS_PUBSUB] {
                out.append_child(feature(f));
            }
            for f in FEATURES {
                out.append_child(feature(&format!("{NS_PUBSUB}#{f}")));
            }
            return Ok(out);
        };
        let node = self.node(r, name).await?.ok_or_else(no_node)?;
        self.access(r.env, &node, &r.who, self.aff_of(&node, &r.who))
            .await?;
        let subscribers = r
            .env
            .storage
            .pubsub
            .subscriptions(r.svc, name)
            .await
            .map_err(internal)?
            .len()
            .to_string();
        out.set_attr("node", name);
        out.append_child(identity("leaf"));
        out.append_child(feature(ns::DISCO_INFO));
        out.append_child(feature(NS_PUBSUB));
        let c = &node.cfg;
        let owners: Vec<&str> = node.with(Aff::Owner).collect();
        let publishers: Vec<&str> = node.with(Aff::Publisher).collect();
        let created = starling_proto::datetime::xep0082_datetime(
            u128::try_from(node.created_at).unwrap_or(0),
        );
        out.append_child(
            FormBuilder::new("result", Some(NS_META_DATA))
                .field(
                    "pubsub#title",
                    "text-single",
                    Some("The name of the node"),
                    &[&c.title],
                )
                .field(
                    "pubsub#description",
                    "text-single",
                    Some("A description of the node"),
                    &[&c.description],
                )
                .field(
                    "pubsub#type",
                    "text-single",
                    Some("Payload semantic type information"),
                    &[&c.payload_type],
                )
                .field(
                    "pubsub#access_model",
                    "list-single",
                    Some("Access model"),
                    &[c.access_model.as_str()],
                )
                .field(
                    "pubsub#publish_model",
                    "list-single",
                    Some("Publish model"),
                    &[&c.publish_model],
                )
                .field(
                    "pubsub#max_items",
                    "text-single",
                    Some("Max # of items to persist"),
                    &[&c.max_items.to_string()],
                )
                .field(
                    "pubsub#creation_date",
                    "text-single",
                    Some("The datetime when the node was created"),
                    &[&created],
                )
                .field(
                    "pubsub#owner",
                    "jid-multi",
                    Some("The JIDs of those with an affiliation of owner"),
                    &owners,
                )
                .field(
                    "pubsub#publisher",
                    "jid-multi",
                    Some("The JIDs of those with an affiliation of publisher"),
                    &publishers,
                )
                .field(
                    "pubsub#num_subscribers",
                    "text-single",
                    Some("The number of subscribers to the node"),
                    &[&subscribers],
                )
                .build(),
        );
        Ok(out)
    }

    /// §5.2 (the service's nodes, by name; whitelist nodes only to those
    /// affiliated with them) and §5.5 (a node's item ids, oldest first),
    /// with XEP-0059 paging.
    async fn disco_items(&self, r: &Req<'_>, q: &Element) -> Result<Element, StanzaError> {
        let ps = &r.env.storage.pubsub;
        let rsm = Rsm::of(q)?;
        let mut out = Element::new("query", ns::DISCO_ITEMS);
        let mut listed: Vec<(String, Option<String>)> = Vec::new();
        match q.attr("node") {
            None => {
                let mine: HashMap<String, String> = ps
                    .affiliations_of(r.svc, r.who.as_str())
                    .await
                    .map_err(internal)?
                    .into_iter()
                    .collect();
                let admin = self.is_admin(&r.who);
                for n in ps.nodes(r.svc).await.map_err(internal)? {
                    let cfg = NodeConfig::from_stored(&n.config)
                        .unwrap_or_else(|| NodeConfig::new(&self.rules));
                    let shown = admin
                        || cfg.access_model != Access::Whitelist
                        || mine
                            .get(&n.node)
                            .is_some_and(|a| !matches!(a.as_str(), "outcast" | "publish-only"));
                    if shown {
                        listed.push((n.node, Some(cfg.title).filter(|t| !t.is_empty())));
                    }
                }
            }
            Some(name) => {
                let node = self.node(r, name).await?.ok_or_else(no_node)?;
                self.access(r.env, &node, &r.who, self.aff_of(&node, &r.who))
                    .await?;
                out.set_attr("node", name);
                let mut items = ps.items(r.svc, name, None).await.map_err(internal)?;
                items.reverse();
                listed = items.into_iter().map(|i| (i.id, None)).collect();
            }
        }
        let is_node = q.attr("node").is_none();
        let (range, set) = match &rsm {
            Some(rsm) => {
                let ids: Vec<&str> = listed.iter().map(|(i, _)| i.as_str()).collect();
                let cap = if is_node {
                    self.cfg.max_nodes
                } else {
                    self.cfg.max_items
                };
                let (range, set) = rsm.page(&ids, cap as usize)?;
                (range, Some(set))
            }
            None => (0..listed.len(), None),
        };
        for (i, title) in &listed[range] {
            out.append_child(self.disco_item(r, is_node, i, title.as_deref()));
        }
        if let Some(set) = set {
            out.append_child(set);
        }
        Ok(out)
    }

    /// A disco item: a node (`node` attribute) or an item (its id as
    /// `name`, §5.5).
    fn disco_item(&self, r: &Req<'_>, is_node: bool, id: &str, title: Option<&str>) -> Element {
        let mut el = Element::builder("item", ns::DISCO_ITEMS)
            .attr("jid", r.svc)
            .build();
        if is_node {
            el.set_attr("node", id);
            if let Some(t) = title {
                el.set_attr("name", t);
            }
        } else {
            el.set_attr("name", id);
        }
        el
    }
}

/// `<headers><header name='SubID'>…</header>…</headers>` (XEP-0131).
fn shim(subids: &[String]) -> Element {
    let mut h = Element::new("headers", NS_SHIM);
    for s in subids {
        h.append_child(
            Element::builder("header", NS_SHIM)
                .attr("name", "SubID")
                .text(s.as_str())
                .build(),
        );
    }
    h
}

/// The `pubsub#…` features the service advertises (XEP-0060 §10):
/// exactly what it does.
const FEATURES: &[&str] = &[
    "access-open",
    "auto-create",
    "config-node",
    "config-node-max",
    "create-and-configure",
    "create-nodes",
    "delete-items",
    "delete-nodes",
    "instant-nodes",
    "item-ids",
    "manage-subscriptions",
    "member-affiliation",
    "meta-data",
    "modify-affiliations",
    "multi-items",
    "multi-subscribe",
    "outcast-affiliation",
    "persistent-items",
    "publish",
    "publish-options",
    "publish-only-affiliation",
    "publisher-affiliation",
    "purge-nodes",
    "retract-items",
    "retrieve-affiliations",
    "retrieve-default",
    "retrieve-default-sub",
    "retrieve-items",
    "retrieve-subscriptions",
    "rsm",
    "subscribe",
    "subscription-notifications",
    "subscription-options",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn rsm(max: Option<usize>, after: Option<&str>, before: Option<&str>) -> Rsm {
        Rsm {
            max,
            after: after.map(str::to_owned),
            before: before.map(str::to_owned),
            index: None,
        }
    }

    #[test]
    fn pages_follow_xep_0059() {
        let ids = ["a", "b", "c", "d", "e"];
        let (r, set) = rsm(Some(2), None, None).page(&ids, 100).unwrap();
        assert_eq!(r, 0..2);
        assert!(set.to_string().contains("<count>5</count>"), "{set}");
        assert_eq!(
            rsm(Some(2), Some("b"), None).page(&ids, 100).unwrap().0,
            2..4
        );
        assert_eq!(
            rsm(Some(2), Some("e"), None).page(&ids, 100).unwrap().0,
            5..5
        );
        assert_eq!(
            rsm(Some(2), None, Some("")).page(&ids, 100).unwrap().0,
            3..5
        );
        assert_eq!(
            rsm(Some(2), None, Some("c")).page(&ids, 100).unwrap().0,
            0..2
        );
        assert_eq!(rsm(None, None, None).page(&ids, 3).unwrap().0, 0..3);
        assert_eq!(rsm(Some(0), None, None).page(&ids, 3).unwrap().0, 0..0);
        assert!(rsm(Some(2), Some("zz"), None).page(&ids, 100).is_err());
        let mut ix = rsm(Some(2), None, None);
        ix.index = Some(4);
        assert_eq!(ix.page(&ids, 100).unwrap().0, 4..5);
    }

    #[test]
    fn subscription_options_take_deliver_only() {
        let form = |fields: &str| -> Element {
            format!("<x xmlns='jabber:x:data' type='submit'><field var='FORM_TYPE'><value>{NS_SUBSCRIBE_OPTIONS}</value></field>{fields}</x>").parse().unwrap()
        };
        let mut o = SubOptions::default();
        assert_eq!(o.to_stored(), "");
        o.apply(&form("<field var='pubsub#deliver'><value>false</value></field><field var='pubsub#digest'><value>0</value></field>")).unwrap();
        assert!(!o.deliver);
        assert_eq!(SubOptions::from_stored(&o.to_stored()), o);
        for bad in [
            "<field var='pubsub#digest'><value>1</value></field>",
            "<field var='pubsub#include_body'><value>true</value></field>",
            "<field var='pubsub#show-values'><value>away</value></field>",
            "<field var='pubsub#deliver'><value>maybe</value></field>",
        ] {
            let mut o = SubOptions::default();
            assert!(o.apply(&form(bad)).is_err(), "{bad}");
            assert!(o.deliver, "unchanged after a refused form");
        }
    }

    #[test]
    fn the_defaults_validate() {
        assert!(Pubsub::validate(&PubsubConfig::default(), &[]).is_ok());
        let c = PubsubConfig {
            create_nodes: "everyone".into(),
            ..PubsubConfig::default()
        };
        assert!(Pubsub::validate(&c, &[]).is_err());
        let c = PubsubConfig {
            admins: vec!["Admin@Example.org".into()],
            ..PubsubConfig::default()
        };
        assert!(Pubsub::validate(&c, &[]).is_err());
    }
}
