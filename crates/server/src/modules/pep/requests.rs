//! The pubsub requests to an account's PEP service (XEP-0163 over
//! XEP-0060): publish with auto-create and publish-options (§7.1), the
//! payload quota, items (§6.5), retract (§7.2), the owner's use cases —
//! configure, default, delete, purge (§8) — and the dispatch of the
//! account's own requests.

use super::{internal, Pep, NAME};
use crate::modules::common::pubsub::{
    check_preconditions, configured, delete_event, item_el, items_event, node_attr, perr,
    publication, publish_options, purge_event, retract_event, NodeConfig, NS_NODE_CONFIG, NS_OWNER,
    NS_PUBSUB,
};
use starling_core::forms::Submitted;
use starling_core::storage::{StorageError, StoredItem, StoredNode};
use starling_core::Env;
use starling_proto::{ns, BareJid, FullJid, Jid, Stanza, StanzaError, StanzaErrorCondition};
use starling_xml::Element;

impl Pep {
    /// §7.1: publish (the owner only), creating the node if needed.
    pub(super) async fn publish(
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
    pub(super) async fn items(
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
    pub(super) async fn retract(
        &self,
        env: &Env,
        owner: &BareJid,
        el: &Element,
    ) -> Result<(), StanzaError> {
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
    pub(super) async fn own(
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
