//! The entity, subscriber and publisher use cases (XEP-0060 §5.6, §5.7,
//! §6, §7).

use super::{
    bad, forbidden, internal, no_node, sub_el, Aff, Done, Node, Out, PubsubService, Req, Rsm,
    SubOptions, MAX_ITEM_ID,
};
use crate::modules::common::pubsub::{
    check_preconditions, configured, item_el, items_event, node_attr, perr, publication,
    publish_options, retract_event, NS_PUBSUB,
};
use starling_core::forms::Submitted;
use starling_core::storage::{PubsubSubscription, StoredItem};
use starling_proto::{ns, ErrorType, Jid, Stanza, StanzaError, StanzaErrorCondition};
use starling_xml::Element;

impl PubsubService {
    /// §5.6: the requester's subscriptions (its bare JID and every full
    /// JID of it), on the node named if one is.
    pub(super) async fn own_subscriptions(&self, r: &Req<'_>, op: &Element) -> Out {
        let only = op.attr("node");
        let subs = r
            .env
            .storage
            .pubsub
            .subscriptions_of_account(r.svc, &r.who)
            .await
            .map_err(internal)?;
        let mut list = Element::new("subscriptions", NS_PUBSUB);
        if let Some(n) = only {
            list.set_attr("node", n);
        }
        for (node, s) in subs {
            if only.is_none_or(|n| n == node) {
                list.append_child(sub_el(
                    NS_PUBSUB,
                    Some(&node),
                    &s.jid,
                    &s.state,
                    Some(&s.subid),
                ));
            }
        }
        Ok(Done::reply(
            Element::builder("pubsub", NS_PUBSUB).append(list).build(),
        ))
    }

    /// §5.7: the requester's affiliations, with the node named if one is.
    pub(super) async fn own_affiliations(&self, r: &Req<'_>, op: &Element) -> Out {
        let only = op.attr("node");
        let affs = r
            .env
            .storage
            .pubsub
            .affiliations_of(r.svc, r.who.as_str())
            .await
            .map_err(internal)?;
        let mut list = Element::new("affiliations", NS_PUBSUB);
        if let Some(n) = only {
            list.set_attr("node", n);
        }
        for (node, a) in affs {
            if only.is_none_or(|n| n == node) {
                list.append_child(
                    Element::builder("affiliation", NS_PUBSUB)
                        .attr("node", node)
                        .attr("affiliation", a)
                        .build(),
                );
            }
        }
        Ok(Done::reply(
            Element::builder("pubsub", NS_PUBSUB).append(list).build(),
        ))
    }

    /// §6.5: items, all, the newest `max_items`, by id, or a page
    /// (XEP-0059) of them in publication order.
    pub(super) async fn items(&self, r: &Req<'_>, ps: &Element, op: &Element) -> Out {
        let node = self.named_node(r, op).await?;
        self.access(r.env, &node, &r.who, self.aff_of(&node, &r.who))
            .await?;
        let store = &r.env.storage.pubsub;
        let ids: Vec<String> = op
            .children()
            .filter(|c| c.is("item", NS_PUBSUB))
            .filter_map(|c| c.attr("id").map(str::to_owned))
            .collect();
        let mut set = None;
        let mut items = if ids.is_empty() {
            let max = op
                .attr("max_items")
                .map(|m| m.parse::<u32>().map_err(|_| bad("max_items is a number")))
                .transpose()?;
            store.items(r.svc, &node.name, max).await
        } else {
            store.items_by_id(r.svc, &node.name, &ids).await
        }
        .map_err(internal)?;
        // Oldest first, as they were published.
        items.reverse();
        if let (true, Some(rsm)) = (ids.is_empty(), Rsm::of(ps)?) {
            let list: Vec<&str> = items.iter().map(|i| i.id.as_str()).collect();
            let (range, s) = rsm.page(&list, self.cfg.max_items as usize)?;
            items = items.drain(range).collect();
            set = Some(s);
        }
        let mut list = Element::builder("items", NS_PUBSUB)
            .attr("node", node.name.as_str())
            .build();
        for it in &items {
            list.append_child(item_el(NS_PUBSUB, it));
        }
        let mut p = Element::builder("pubsub", NS_PUBSUB).append(list).build();
        if let Some(s) = set {
            p.append_child(s);
        }
        Ok(Done::reply(p))
    }

    /// The subscription an `<options/>` or `<unsubscribe/>` request names
    /// (§6.2.3, §6.3.4): its node and JID (the requester's own, unless a
    /// service admin asks), and its subid when the JID holds several.
    async fn named_subscription(
        &self,
        r: &Req<'_>,
        op: &Element,
        jid_missing: &str,
        not_subscribed: ErrorType,
    ) -> Result<(Node, PubsubSubscription), StanzaError> {
        let name = node_attr(op)?;
        let jid = match op.attr("jid") {
            None => {
                return Err(perr(
                    StanzaErrorCondition::BadRequest,
                    Some(jid_missing),
                    "name the subscribed JID",
                ))
            }
            Some(j) => Jid::new(j).map_err(|_| {
                perr(
                    StanzaErrorCondition::BadRequest,
                    Some("invalid-jid"),
                    "not a JID",
                )
            })?,
        };
        if jid.to_bare() != r.who && !self.is_admin(&r.who) {
            return Err(forbidden("that is not your subscription"));
        }
        let node = self.node(r, name).await?.ok_or_else(no_node)?;
        let mut mine: Vec<PubsubSubscription> = r
            .env
            .storage
            .pubsub
            .subscriptions(r.svc, name)
            .await
            .map_err(internal)?
            .into_iter()
            .filter(|s| s.jid == jid.as_str())
            .collect();
        if mine.is_empty() {
            return Err(perr(
                StanzaErrorCondition::UnexpectedRequest,
                Some("not-subscribed"),
                "that JID is not subscribed to this node",
            )
            .with_type(not_subscribed));
        }
        let sub = match op.attr("subid") {
            Some(id) => {
                let Some(i) = mine.iter().position(|s| s.subid == id) else {
                    return Err(perr(
                        StanzaErrorCondition::NotAcceptable,
                        Some("invalid-subid"),
                        "no such subscription",
                    ));
                };
                mine.swap_remove(i)
            }
            None if mine.len() > 1 => {
                return Err(perr(
                    StanzaErrorCondition::BadRequest,
                    Some("subid-required"),
                    "that JID holds several subscriptions: name one",
                ))
            }
            None => mine.swap_remove(0),
        };
        Ok((node, sub))
    }

    /// §6.3: a subscription's options form.
    pub(super) async fn options_get(&self, r: &Req<'_>, op: &Element) -> Out {
        let (node, sub) = self
            .named_subscription(r, op, "jid-required", ErrorType::Modify)
            .await?;
        let options = Element::builder("options", NS_PUBSUB)
            .attr("node", node.name.as_str())
            .attr("jid", sub.jid.as_str())
            .attr("subid", sub.subid.as_str())
            .append(SubOptions::from_stored(&sub.options).form("form"))
            .build();
        Ok(Done::reply(
            Element::builder("pubsub", NS_PUBSUB)
                .append(options)
                .build(),
        ))
    }

    /// §6.3.5: changes a subscription's options.
    pub(super) async fn options_set(&self, r: &Req<'_>, op: &Element) -> Out {
        let (node, mut sub) = self
            .named_subscription(r, op, "jid-required", ErrorType::Modify)
            .await?;
        let Some(x) = op.get_child("x", ns::DATA_FORMS) else {
            return Err(perr(
                StanzaErrorCondition::BadRequest,
                Some("invalid-options"),
                "submit a subscribe_options form",
            ));
        };
        let mut options = SubOptions::from_stored(&sub.options);
        options.apply(x)?;
        sub.options = options.to_stored();
        r.env
            .storage
            .pubsub
            .set_subscription(r.svc, &node.name, &sub)
            .await
            .map_err(internal)?;
        Ok(Done::default())
    }

    /// §6.4: the default subscription options, of the service or a node.
    pub(super) async fn default_options(&self, r: &Req<'_>, op: &Element) -> Out {
        let mut d = Element::new("default", NS_PUBSUB);
        if let Some(name) = op.attr("node") {
            self.node(r, name).await?.ok_or_else(no_node)?;
            d.set_attr("node", name);
        }
        d.append_child(SubOptions::default().form("result"));
        Ok(Done::reply(
            Element::builder("pubsub", NS_PUBSUB).append(d).build(),
        ))
    }

    /// §6.1: subscribe, with options (§6.3.7) if given. A JID subscribing
    /// again with the options of one of its subscriptions gets that one
    /// back; with other options, a new one with its own subid (§6.1.6).
    pub(super) async fn subscribe(&self, r: &Req<'_>, ps: &Element, op: &Element) -> Out {
        let name = node_attr(op)?;
        let invalid_jid =
            |text: &str| perr(StanzaErrorCondition::BadRequest, Some("invalid-jid"), text);
        let jid = op
            .attr("jid")
            .ok_or_else(|| invalid_jid("subscribe a JID of yours (the jid attribute)"))
            .and_then(|j| Jid::new(j).map_err(|_| invalid_jid("not a JID")))?;
        let bare = jid.to_bare();
        if bare != r.who && !self.is_admin(&r.who) {
            return Err(invalid_jid("you may subscribe only your own JIDs"));
        }
        let options_el = ps.children().find(|c| c.is("options", NS_PUBSUB));
        let mut options = SubOptions::default();
        if let Some(o) = options_el {
            if o.attr("node").is_some() || o.attr("jid").is_some() {
                return Err(bad(
                    "the options of a subscription request have no node or jid (§6.3.7)",
                ));
            }
            if let Some(x) = o.get_child("x", ns::DATA_FORMS) {
                options.apply(x)?;
            }
        }
        let node = self.node(r, name).await?.ok_or_else(no_node)?;
        self.access(r.env, &node, &bare, self.aff_of(&node, &bare))
            .await?;
        let store = &r.env.storage.pubsub;
        let subs = store.subscriptions(r.svc, name).await.map_err(internal)?;
        let held = subs.iter().filter(|s| s.jid == jid.as_str()).count();
        let existing = subs
            .iter()
            .find(|s| s.jid == jid.as_str() && SubOptions::from_stored(&s.options) == options);
        let (sub, held) = match existing {
            Some(s) => (s.clone(), held),
            None => {
                if subs.len() >= self.cfg.max_subscriptions_per_node as usize {
                    return Err(perr(
                        StanzaErrorCondition::PolicyViolation,
                        Some("too-many-subscriptions"),
                        "this node has as many subscriptions as the service allows",
                    )
                    .with_type(ErrorType::Wait));
                }
                let s = PubsubSubscription {
                    jid: jid.as_str().to_owned(),
                    subid: starling_proto::random_id(16),
                    state: "subscribed".into(),
                    options: options.to_stored(),
                };
                store
                    .set_subscription(r.svc, name, &s)
                    .await
                    .map_err(internal)?;
                (s, held + 1)
            }
        };
        let mut p = Element::builder("pubsub", NS_PUBSUB)
            .append(sub_el(
                NS_PUBSUB,
                Some(name),
                &sub.jid,
                "subscribed",
                Some(&sub.subid),
            ))
            .build();
        if options_el.is_some() {
            p.append_child(
                Element::builder("options", NS_PUBSUB)
                    .append(options.form("result"))
                    .build(),
            );
        }
        let mut then = Vec::new();
        // §6.1.7: the last item, with when it was published.
        if node.cfg.send_last_published_item == "on_sub" && options.deliver {
            if let Some(last) = store
                .items(r.svc, name, Some(1))
                .await
                .map_err(internal)?
                .pop()
            {
                let subids = if held > 1 {
                    vec![sub.subid.clone()]
                } else {
                    Vec::new()
                };
                let event = items_event(
                    name,
                    std::slice::from_ref(&last),
                    !node.cfg.deliver_payloads,
                );
                let stamp = starling_proto::datetime::xep0082_datetime(
                    u128::try_from(last.seq / 1000).unwrap_or(0),
                );
                let delay = Element::builder("delay", ns::DELAY)
                    .attr("from", r.svc)
                    .attr("stamp", stamp)
                    .build();
                then = self.notes_with(
                    r,
                    &node.cfg,
                    event,
                    Some(delay),
                    vec![(jid.clone(), subids)],
                );
            }
        }
        Ok(Done {
            payload: Some(p),
            error: None,
            then,
        })
    }

    /// §6.2: unsubscribe.
    pub(super) async fn unsubscribe(&self, r: &Req<'_>, op: &Element) -> Out {
        let (node, sub) = self
            .named_subscription(r, op, "invalid-jid", ErrorType::Cancel)
            .await?;
        r.env
            .storage
            .pubsub
            .remove_subscription(r.svc, &node.name, &sub.jid, Some(&sub.subid))
            .await
            .map_err(internal)?;
        Ok(Done::reply(
            Element::builder("pubsub", NS_PUBSUB)
                .append(sub_el(
                    NS_PUBSUB,
                    Some(&node.name),
                    &sub.jid,
                    "none",
                    Some(&sub.subid),
                ))
                .build(),
        ))
    }

    /// §7.1: publish (owners, publishers and publish-only entities, and
    /// others as the publish model says), creating the node for those who
    /// may create nodes.
    pub(super) async fn publish(&self, r: &Req<'_>, ps: &Element, op: &Element) -> Out {
        let name = node_attr(op)?;
        let (item, payload) = publication(op, false)?;
        if item.attr("id").is_some_and(|id| id.len() > MAX_ITEM_ID) {
            return Err(perr(
                StanzaErrorCondition::NotAcceptable,
                None,
                "item ids are at most 1024 bytes",
            ));
        }
        let payload = payload.map(|p| p.to_string());
        if payload
            .as_ref()
            .is_some_and(|p| p.len() > self.cfg.max_item_bytes)
        {
            return Err(perr(
                StanzaErrorCondition::NotAcceptable,
                Some("payload-too-big"),
                &format!(
                    "payloads are at most {} bytes here",
                    self.cfg.max_item_bytes
                ),
            ));
        }
        let options = publish_options(ps)?;
        let existing = match self.node(r, name).await? {
            Some(n) => Some(n),
            None if self.may_create(r) => {
                // §7.1.4, §7.1.5: created with the options as its
                // configuration, the publisher its owner.
                let cfg = configured(&self.rules, options.as_ref())?;
                match self.create_node(r, name, cfg).await? {
                    Some(created) => {
                        return self.publish_to(r, &created, item, payload, None).await;
                    }
                    // Created meanwhile by someone else: as if it existed.
                    None => self.node(r, name).await?,
                }
            }
            None => None,
        };
        let node = existing.ok_or_else(no_node)?;
        self.publish_to(r, &node, item, payload, options.as_ref())
            .await
    }

    /// Publishes to an existing node, if the requester may, the node's
    /// configuration meets `preconditions` (§7.1.5) and the item suits it.
    async fn publish_to(
        &self,
        r: &Req<'_>,
        node: &Node,
        item: &Element,
        payload: Option<String>,
        preconditions: Option<&Submitted>,
    ) -> Out {
        let store = &r.env.storage.pubsub;
        let may = match self.aff_of(node, &r.who) {
            Some(Aff::Owner | Aff::Publisher | Aff::PublishOnly) => true,
            Some(Aff::Outcast) => false,
            _ => match node.cfg.publish_model.as_str() {
                "open" => true,
                "subscribers" => store
                    .subscriptions_of_account(r.svc, &r.who)
                    .await
                    .map_err(internal)?
                    .iter()
                    .any(|(n, s)| *n == node.name && s.state == "subscribed"),
                _ => false,
            },
        };
        if !may {
            return Err(forbidden("you may not publish to this node"));
        }
        if let Some(o) = preconditions {
            check_preconditions(&node.cfg, &self.rules, o)?;
        }
        if payload.is_none() && node.cfg.deliver_payloads {
            return Err(perr(
                StanzaErrorCondition::BadRequest,
                Some("payload-required"),
                "the item needs a payload",
            ));
        }
        let id = item
            .attr("id")
            .filter(|id| !id.is_empty())
            .map(str::to_owned)
            .unwrap_or_else(|| starling_proto::random_id(16));
        let payload = payload.unwrap_or_default();
        self.check_owner_quota(r, node, &id, payload.len()).await?;
        let stored = StoredItem {
            id: id.clone(),
            publisher: r.who.as_str().to_owned(),
            payload,
            seq: self.seq.next(),
        };
        store
            .publish(r.svc, &node.name, &stored, Some(node.cfg.keep()))
            .await
            .map_err(internal)?;
        let then = if node.cfg.deliver_notifications {
            let to = self.recipients(r, node).await?;
            let event = items_event(
                &node.name,
                std::slice::from_ref(&stored),
                !node.cfg.deliver_payloads,
            );
            self.notes(r, &node.cfg, event, to)
        } else {
            Vec::new()
        };
        Ok(Done {
            payload: Some(
                Element::builder("pubsub", NS_PUBSUB)
                    .append(
                        Element::builder("publish", NS_PUBSUB)
                            .attr("node", node.name.as_str())
                            .append(Element::builder("item", NS_PUBSUB).attr("id", id).build())
                            .build(),
                    )
                    .build(),
            ),
            error: None,
            then,
        })
    }

    /// `max_bytes_per_owner`: refuses a publication of `bytes` as item `id`
    /// of `node` when the items of the nodes one of its owners owns
    /// (less the item it would replace) would pass the quota. Counted
    /// from storage, so it holds across restarts and cluster nodes.
    async fn check_owner_quota(
        &self,
        r: &Req<'_>,
        node: &Node,
        id: &str,
        bytes: usize,
    ) -> Result<(), StanzaError> {
        let quota = self.cfg.max_bytes_per_owner;
        if quota == 0 {
            return Ok(());
        }
        for owner in node.with(Aff::Owner) {
            let used = r
                .env
                .storage
                .pubsub
                .owned_bytes(r.svc, owner, Some((&node.name, id)))
                .await
                .map_err(internal)?;
            if used.saturating_add(bytes as u64) > quota {
                r.env.metrics.limit_refused("pubsub.max_bytes_per_owner");
                // As PEP's quota: XEP-0060 §7.1.3.4's condition, the
                // text says why.
                return Err(perr(
                    StanzaErrorCondition::NotAcceptable,
                    Some("payload-too-big"),
                    &format!(
                        "the nodes of {owner} hold as much as this service allows ({used} of {quota} bytes); retract items or delete nodes to free space"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// §7.2: retract (owners and publishers any item, publish-only
    /// entities their own), notified if asked (`notify`) or configured.
    pub(super) async fn retract(&self, r: &Req<'_>, op: &Element) -> Out {
        let node = self.named_node(r, op).await?;
        let aff = self.aff_of(&node, &r.who);
        if !matches!(aff, Some(Aff::Owner | Aff::Publisher | Aff::PublishOnly)) {
            return Err(forbidden("you may not retract items of this node"));
        }
        let ids: Vec<&str> = op
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
        let store = &r.env.storage.pubsub;
        let found = store
            .items_by_id(r.svc, &node.name, &[id.to_owned()])
            .await
            .map_err(internal)?;
        let Some(it) = found.first() else {
            return Err(perr(
                StanzaErrorCondition::ItemNotFound,
                None,
                "no such item",
            ));
        };
        if aff == Some(Aff::PublishOnly) && it.publisher != r.who.as_str() {
            return Err(forbidden(
                "a publish-only affiliation retracts its own items only",
            ));
        }
        if !store
            .retract(r.svc, &node.name, id)
            .await
            .map_err(internal)?
        {
            return Err(perr(
                StanzaErrorCondition::ItemNotFound,
                None,
                "no such item",
            ));
        }
        let asked = matches!(op.attr("notify"), Some("1" | "true"));
        let then: Vec<Stanza> =
            if asked || (node.cfg.notify_retract && node.cfg.deliver_notifications) {
                let to = self.recipients(r, &node).await?;
                self.notes(r, &node.cfg, retract_event(&node.name, id), to)
            } else {
                Vec::new()
            };
        Ok(Done {
            payload: None,
            error: None,
            then,
        })
    }
}
