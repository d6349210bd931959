//! The owner use cases (XEP-0060 §8): create, configure, default
//! configuration, delete, purge, subscriptions and affiliations.

use super::{
    bad, forbidden, internal, no_node, sub_el, Aff, Done, Node, Out, PubsubService, Req,
    SubOptions, NAME,
};
use crate::modules::common::pubsub::{
    delete_event, node_name, perr, purge_event, unsupported, Access, NodeConfig, NS_EVENT,
    NS_NODE_CONFIG, NS_OWNER, NS_PUBSUB,
};
use starling_core::forms::Submitted;
use starling_core::storage::{PubsubSubscription, StorageError, StoredNode};
use starling_proto::{ns, BareJid, ErrorType, Jid, StanzaError, StanzaErrorCondition};
use starling_xml::Element;
use std::collections::BTreeMap;

impl PubsubService {
    /// Creates node `name` with `cfg`, the requester its owner; `None` if
    /// it exists. At most `max_nodes` per service (`not-allowed` +
    /// `max-nodes-exceeded`).
    pub(super) async fn create_node(
        &self,
        r: &Req<'_>,
        name: &str,
        cfg: NodeConfig,
    ) -> Result<Option<Node>, StanzaError> {
        let store = &r.env.storage.pubsub;
        let count = store.nodes(r.svc).await.map_err(internal)?.len();
        if count >= self.cfg.max_nodes as usize {
            return Err(perr(
                StanzaErrorCondition::NotAllowed,
                Some("max-nodes-exceeded"),
                "this service has as many nodes as it allows",
            ));
        }
        let created_at = self.seq.next() / 1000;
        let stored = StoredNode {
            service: r.svc.to_owned(),
            node: name.to_owned(),
            config: cfg.to_stored(),
            created_at,
        };
        match store.create_node(&stored).await {
            Ok(()) => {}
            Err(StorageError::Conflict) => return Ok(None),
            Err(e) => return Err(internal(e)),
        }
        store
            .set_affiliation(r.svc, name, r.who.as_str(), "owner")
            .await
            .map_err(internal)?;
        tracing::debug!(module = NAME, service = r.svc, node = name, owner = %r.who, "node created");
        Ok(Some(Node {
            name: name.to_owned(),
            cfg,
            created_at,
            affs: vec![(r.who.as_str().to_owned(), Aff::Owner)],
        }))
    }

    /// Applies a submitted `node_config` form to `cfg` (§8.2.4): `false`
    /// if it was cancelled. Values the service cannot take are
    /// `not-acceptable` (§8.2.5), an unknown access model with
    /// `unsupported-access-model` (§8.1.2).
    fn apply_config(&self, cfg: &mut NodeConfig, x: &Element) -> Result<bool, StanzaError> {
        let form = Submitted::parse(x);
        if form.kind == "cancel" {
            return Ok(false);
        }
        if form.form_type().is_some_and(|t| t != NS_NODE_CONFIG) {
            return Err(bad("FORM_TYPE must be pubsub#node_config"));
        }
        let mut next = cfg.clone();
        for var in form.vars() {
            let values = form.values(var).unwrap_or_default();
            if var == "pubsub#access_model"
                && values
                    .first()
                    .and_then(|v| Access::parse(v.trim()))
                    .is_none()
            {
                return Err(perr(
                    StanzaErrorCondition::NotAcceptable,
                    Some("unsupported-access-model"),
                    "the access models are open, presence, roster and whitelist",
                ));
            }
            next.set(&self.rules, var, values)
                .map_err(|e| perr(StanzaErrorCondition::NotAcceptable, None, &e))?;
        }
        *cfg = next;
        Ok(true)
    }

    /// §8.1: create a node, named or instant (§8.1.1), with a
    /// configuration (§8.1.3) if one is given.
    pub(super) async fn create(&self, r: &Req<'_>, ps: &Element, op: &Element) -> Out {
        let name = op.attr("node").map(node_name).transpose()?;
        if !self.may_create(r) {
            return Err(forbidden("you may not create nodes here"));
        }
        let mut cfg = NodeConfig::new(&self.rules);
        if let Some(c) = ps.children().find(|c| c.is("configure", NS_PUBSUB)) {
            if c.attr("node").is_some() {
                return Err(bad(
                    "the configure element of a creation has no node attribute (§8.1.3)",
                ));
            }
            if let Some(x) = c.get_child("x", ns::DATA_FORMS) {
                self.apply_config(&mut cfg, x)?;
            }
        }
        let created = match name {
            Some(n) => self.create_node(r, n, cfg).await?,
            None => {
                // A name the service makes; 100 bits leave no room for a
                // collision, but a taken one is not reused.
                let mut made = None;
                for _ in 0..3 {
                    let n = starling_proto::random_id(20);
                    made = self.create_node(r, &n, cfg.clone()).await?;
                    if made.is_some() {
                        break;
                    }
                }
                made
            }
        };
        let Some(node) = created else {
            return Err(perr(
                StanzaErrorCondition::Conflict,
                None,
                "a node with this name exists",
            ));
        };
        Ok(Done::reply(
            Element::builder("pubsub", NS_PUBSUB)
                .append(
                    Element::builder("create", NS_PUBSUB)
                        .attr("node", node.name.as_str())
                        .build(),
                )
                .build(),
        ))
    }

    /// The node named by `op`, if the requester owns it (or is a service
    /// admin): `nodeid-required`, `item-not-found`, `forbidden`.
    async fn owned(&self, r: &Req<'_>, op: &Element) -> Result<Node, StanzaError> {
        let node = self.named_node(r, op).await?;
        if self.aff_of(&node, &r.who) != Some(Aff::Owner) {
            return Err(forbidden("only the node's owners may do this"));
        }
        Ok(node)
    }

    /// §8.2: the configuration form.
    pub(super) async fn configure_get(&self, r: &Req<'_>, op: &Element) -> Out {
        let node = self.owned(r, op).await?;
        Ok(Done::reply(
            Element::builder("pubsub", NS_OWNER)
                .append(
                    Element::builder("configure", NS_OWNER)
                        .attr("node", node.name.as_str())
                        .append(node.cfg.form(&self.rules, "form"))
                        .build(),
                )
                .build(),
        ))
    }

    /// §8.2.4: a new configuration. Items beyond a lowered `max_items`
    /// go; subscribers a changed access model no longer admits lose their
    /// subscriptions (and are told); with `notify_config`, subscribers are
    /// told of the change (§8.2.5.3), with the form unless the node is
    /// notification-only.
    pub(super) async fn configure_set(&self, r: &Req<'_>, op: &Element) -> Out {
        let mut node = self.owned(r, op).await?;
        let Some(x) = op.get_child("x", ns::DATA_FORMS) else {
            return Err(bad("submit a node_config form"));
        };
        let before = node.cfg.clone();
        if !self.apply_config(&mut node.cfg, x)? {
            return Ok(Done::default());
        }
        let store = &r.env.storage.pubsub;
        if !store
            .set_node_config(r.svc, &node.name, &node.cfg.to_stored())
            .await
            .map_err(internal)?
        {
            return Err(no_node());
        }
        store
            .trim(r.svc, &node.name, node.cfg.keep())
            .await
            .map_err(internal)?;
        let mut then = Vec::new();
        if before.access_model != node.cfg.access_model
            || before.roster_groups_allowed != node.cfg.roster_groups_allowed
        {
            then.extend(self.prune(r, &node, None).await?);
        }
        if node.cfg.notify_config {
            let mut c = Element::builder("configuration", NS_EVENT)
                .attr("node", node.name.as_str())
                .build();
            if node.cfg.deliver_payloads {
                c.append_child(node.cfg.form(&self.rules, "result"));
            }
            let event = Element::builder("event", NS_EVENT).append(c).build();
            let to = self.recipients(r, &node).await?;
            then.extend(self.notes(
                r,
                &node.cfg,
                event,
                to.into_iter().map(|(j, _)| (j, Vec::new())).collect(),
            ));
        }
        Ok(Done {
            payload: None,
            error: None,
            then,
        })
    }

    /// §8.3: the default configuration (leaf nodes; collections are not
    /// built).
    pub(super) fn default_config(&self, op: &Element) -> Out {
        if op.attr("type").is_some_and(|t| t != "leaf") {
            return Err(unsupported(
                "collections",
                "only leaf nodes are built (no XEP-0248 collections)",
            ));
        }
        Ok(Done::reply(
            Element::builder("pubsub", NS_OWNER)
                .append(
                    Element::builder("default", NS_OWNER)
                        .append(NodeConfig::new(&self.rules).form(&self.rules, "form"))
                        .build(),
                )
                .build(),
        ))
    }

    /// §8.4: delete, telling subscribers (with the redirect if given).
    pub(super) async fn delete(&self, r: &Req<'_>, op: &Element) -> Out {
        let node = self.owned(r, op).await?;
        let redirect = op
            .get_child("redirect", NS_OWNER)
            .and_then(|e| e.attr("uri"));
        // Whoever would be told must be found before the node goes.
        let to = if node.cfg.notify_delete {
            self.recipients(r, &node)
                .await?
                .into_iter()
                .map(|(j, _)| (j, Vec::new()))
                .collect()
        } else {
            Vec::new()
        };
        r.env
            .storage
            .pubsub
            .delete_node(r.svc, &node.name)
            .await
            .map_err(internal)?;
        tracing::debug!(module = NAME, service = r.svc, node = %node.name, by = %r.who, "node deleted");
        Ok(Done {
            payload: None,
            error: None,
            then: self.notes(r, &node.cfg, delete_event(&node.name, redirect), to),
        })
    }

    /// §8.5: purge (owners and publishers, §4.1), telling subscribers
    /// once if retractions are notified.
    pub(super) async fn purge(&self, r: &Req<'_>, op: &Element) -> Out {
        let node = self.named_node(r, op).await?;
        if !matches!(
            self.aff_of(&node, &r.who),
            Some(Aff::Owner | Aff::Publisher)
        ) {
            return Err(forbidden(
                "only the node's owners and publishers may purge it",
            ));
        }
        r.env
            .storage
            .pubsub
            .purge(r.svc, &node.name)
            .await
            .map_err(internal)?;
        let then = if node.cfg.notify_retract {
            let to = self
                .recipients(r, &node)
                .await?
                .into_iter()
                .map(|(j, _)| (j, Vec::new()))
                .collect();
            self.notes(r, &node.cfg, purge_event(&node.name), to)
        } else {
            Vec::new()
        };
        Ok(Done {
            payload: None,
            error: None,
            then,
        })
    }

    /// §8.8.1: the node's subscriptions.
    pub(super) async fn subscriptions_get(&self, r: &Req<'_>, op: &Element) -> Out {
        let node = self.owned(r, op).await?;
        let mut list = Element::builder("subscriptions", NS_OWNER)
            .attr("node", node.name.as_str())
            .build();
        for s in r
            .env
            .storage
            .pubsub
            .subscriptions(r.svc, &node.name)
            .await
            .map_err(internal)?
        {
            list.append_child(sub_el(NS_OWNER, None, &s.jid, &s.state, Some(&s.subid)));
        }
        Ok(Done::reply(
            Element::builder("pubsub", NS_OWNER).append(list).build(),
        ))
    }

    /// §8.8.2: changes to subscriptions (`subscribed`: one with the
    /// default options unless the JID holds one; `none`: the one named by
    /// subid, else all of the JID's). Each subscriber is told (§8.8.4).
    /// The entries that cannot be applied are returned with their current
    /// state in a `not-acceptable` error; the others are applied
    /// (§8.8.2.4).
    pub(super) async fn subscriptions_set(&self, r: &Req<'_>, op: &Element) -> Out {
        let node = self.owned(r, op).await?;
        let store = &r.env.storage.pubsub;
        let mut failed = Vec::new();
        let mut then = Vec::new();
        for e in op.children().filter(|c| c.is("subscription", NS_OWNER)) {
            let Some(state) = e.attr("subscription") else {
                continue; // §8.8.2.1: no attribute, no change
            };
            let Some(jid) = e.attr("jid").and_then(|j| Jid::new(j).ok()) else {
                failed.push(e.clone());
                continue;
            };
            let subid = e.attr("subid");
            let subs = store
                .subscriptions(r.svc, &node.name)
                .await
                .map_err(internal)?;
            let held: Vec<&PubsubSubscription> =
                subs.iter().filter(|s| s.jid == jid.as_str()).collect();
            let current = |failed: &mut Vec<Element>| {
                let named = subid.and_then(|id| held.iter().find(|s| s.subid == id));
                let state = if named.is_some() || (subid.is_none() && !held.is_empty()) {
                    "subscribed"
                } else {
                    "none"
                };
                failed.push(sub_el(NS_OWNER, None, jid.as_str(), state, subid));
            };
            match state {
                "subscribed" => {
                    let bare = jid.to_bare();
                    let banned = matches!(
                        self.aff_of(&node, &bare),
                        Some(Aff::Outcast | Aff::PublishOnly)
                    );
                    if banned || subid.is_some_and(|id| !held.iter().any(|s| s.subid == id)) {
                        current(&mut failed);
                        continue;
                    }
                    if !held.is_empty() {
                        continue; // subscribed already
                    }
                    if subs.len() >= self.cfg.max_subscriptions_per_node as usize {
                        current(&mut failed);
                        continue;
                    }
                    let s = PubsubSubscription {
                        jid: jid.as_str().to_owned(),
                        subid: starling_proto::random_id(16),
                        state: "subscribed".into(),
                        options: SubOptions::default().to_stored(),
                    };
                    store
                        .set_subscription(r.svc, &node.name, &s)
                        .await
                        .map_err(internal)?;
                    then.extend(self.subscription_note(
                        r,
                        &node,
                        &s.jid,
                        "subscribed",
                        Some(&s.subid),
                    ));
                }
                "none" => {
                    let gone: Vec<&PubsubSubscription> = held
                        .iter()
                        .copied()
                        .filter(|s| subid.is_none_or(|id| s.subid == id))
                        .collect();
                    if subid.is_some() && gone.is_empty() {
                        current(&mut failed);
                        continue;
                    }
                    for s in gone {
                        store
                            .remove_subscription(r.svc, &node.name, &s.jid, Some(&s.subid))
                            .await
                            .map_err(internal)?;
                        then.extend(self.subscription_note(
                            r,
                            &node,
                            &s.jid,
                            "none",
                            Some(&s.subid),
                        ));
                    }
                }
                // pending and unconfigured are not built (no authorize
                // access model, no required configuration).
                _ => current(&mut failed),
            }
        }
        Ok(Self::partly(
            &node,
            "subscriptions",
            failed,
            then,
            "these subscriptions could not be changed; the others were",
        ))
    }

    /// The answer to a request whose `failed` entries were not applied.
    fn partly(
        node: &Node,
        list: &str,
        failed: Vec<Element>,
        then: Vec<starling_proto::Stanza>,
        text: &str,
    ) -> Done {
        if failed.is_empty() {
            return Done {
                payload: None,
                error: None,
                then,
            };
        }
        let mut l = Element::builder(list, NS_OWNER)
            .attr("node", node.name.as_str())
            .build();
        for f in failed {
            l.append_child(f);
        }
        Done {
            payload: Some(Element::builder("pubsub", NS_OWNER).append(l).build()),
            error: Some(
                StanzaError::new(StanzaErrorCondition::NotAcceptable)
                    .with_type(ErrorType::Modify)
                    .with_text(text),
            ),
            then,
        }
    }

    /// §8.9.1: the node's affiliations.
    pub(super) async fn affiliations_get(&self, r: &Req<'_>, op: &Element) -> Out {
        let node = self.owned(r, op).await?;
        let mut list = Element::builder("affiliations", NS_OWNER)
            .attr("node", node.name.as_str())
            .build();
        for (jid, a) in &node.affs {
            list.append_child(
                Element::builder("affiliation", NS_OWNER)
                    .attr("jid", jid.as_str())
                    .attr("affiliation", a.as_str())
                    .build(),
            );
        }
        Ok(Done::reply(
            Element::builder("pubsub", NS_OWNER).append(list).build(),
        ))
    }

    /// §8.9.2: changes to affiliations (of bare JIDs; a full JID counts as
    /// its bare JID). One JID twice is `bad-request`; entries that would
    /// leave the node without an owner, and unknown affiliations or JIDs,
    /// are returned with the current affiliation in a `not-acceptable`
    /// error, the others applied (§8.9.2.4). Subscriptions the new
    /// affiliations no longer allow (outcast, publish-only, a whitelist
    /// left) go, their subscribers told.
    pub(super) async fn affiliations_set(&self, r: &Req<'_>, op: &Element) -> Out {
        let mut node = self.owned(r, op).await?;
        let mut current: BTreeMap<String, Aff> = node.affs.iter().cloned().collect();
        let mut failed = Vec::new();
        let mut changes: Vec<(BareJid, Option<Aff>)> = Vec::new();
        let mut seen = Vec::new();
        for e in op.children().filter(|c| c.is("affiliation", NS_OWNER)) {
            let jid = e.attr("jid").and_then(|j| Jid::new(j).ok());
            if let Some(j) = &jid {
                let bare = j.to_bare();
                if seen.contains(&bare) {
                    return Err(bad("one affiliation per JID (§8.9.2.4)"));
                }
                seen.push(bare);
            }
            let Some(aff) = e.attr("affiliation") else {
                continue; // no attribute, no change
            };
            let Some(jid) = jid else {
                failed.push(e.clone());
                continue;
            };
            let bare = jid.to_bare();
            match Aff::parse(aff) {
                Some(a) => changes.push((bare, a)),
                None => failed.push(aff_el(bare.as_str(), current.get(bare.as_str()).copied())),
            }
        }
        // The node keeps an owner: demoting every owner is refused.
        let mut after = current.clone();
        for (j, a) in &changes {
            match a {
                Some(a) => after.insert(j.as_str().to_owned(), *a),
                None => after.remove(j.as_str()),
            };
        }
        if !after.values().any(|a| *a == Aff::Owner) {
            changes.retain(|(j, a)| {
                let demotes =
                    current.get(j.as_str()) == Some(&Aff::Owner) && *a != Some(Aff::Owner);
                if demotes {
                    failed.push(aff_el(j.as_str(), Some(Aff::Owner)));
                }
                !demotes
            });
        }
        let store = &r.env.storage.pubsub;
        let mut touched = Vec::new();
        for (j, a) in changes {
            store
                .set_affiliation(r.svc, &node.name, j.as_str(), a.map_or("none", Aff::as_str))
                .await
                .map_err(internal)?;
            match a {
                Some(a) => current.insert(j.as_str().to_owned(), a),
                None => current.remove(j.as_str()),
            };
            touched.push(j);
        }
        node.affs = current.into_iter().collect();
        let then = self.prune(r, &node, Some(&touched)).await?;
        Ok(Self::partly(
            &node,
            "affiliations",
            failed,
            then,
            "these affiliations could not be changed; the others were",
        ))
    }
}

/// `<affiliation jid affiliation/>` (owner namespace).
fn aff_el(jid: &str, aff: Option<Aff>) -> Element {
    Element::builder("affiliation", NS_OWNER)
        .attr("jid", jid)
        .attr("affiliation", aff.map_or("none", Aff::as_str))
        .build()
}
