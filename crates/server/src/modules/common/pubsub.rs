//! What the two publish-subscribe services (XEP-0060) share: PEP
//! (XEP-0163, `pep.rs`: every account is a service) and the generic
//! service at `pubsub.<domain>` (`pubsub/`). Not a module of its own (it
//! registers nothing), like [`super::copies`].
//!
//! - namespaces;
//! - node configuration ([`NodeConfig`]): its stored form (versioned JSON),
//!   the `pubsub#node_config` form (§8.2, §16.4) and the application of a
//!   submitted field, within [`Rules`] (what each service allows);
//! - publish requests: the one item and its payload (§7.1.3.6), the
//!   `publish-options` form and its preconditions (§7.1.5);
//! - `<item/>` and event elements (§7.1.2.1, §7.2.2.1, §8.4.2, §8.5.2);
//! - errors with XEP-0060 application conditions ([`perr`]);
//! - the publication order of items ([`Seq`]).

use starling_core::forms::{FormBuilder, Submitted};
use starling_core::storage::StoredItem;
use starling_proto::{ns, StanzaError, StanzaErrorCondition};
use starling_xml::Element;
use std::sync::atomic::{AtomicI64, Ordering};

/// XEP-0060 namespaces.
pub(crate) const NS_PUBSUB: &str = "http://jabber.org/protocol/pubsub";
/// Owner use cases.
pub(crate) const NS_OWNER: &str = "http://jabber.org/protocol/pubsub#owner";
/// Notifications.
pub(crate) const NS_EVENT: &str = "http://jabber.org/protocol/pubsub#event";
/// Application-specific error conditions.
pub(crate) const NS_ERRORS: &str = "http://jabber.org/protocol/pubsub#errors";
/// The node configuration form.
pub(crate) const NS_NODE_CONFIG: &str = "http://jabber.org/protocol/pubsub#node_config";
/// The publish-options form.
pub(crate) const NS_PUBLISH_OPTIONS: &str = "http://jabber.org/protocol/pubsub#publish-options";

/// Who may see a node's items (XEP-0060 §4.5). `authorize` is not built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Access {
    Open,
    Presence,
    Roster,
    Whitelist,
}

impl Access {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Access::Open => "open",
            Access::Presence => "presence",
            Access::Roster => "roster",
            Access::Whitelist => "whitelist",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Access> {
        Some(match s {
            "open" => Access::Open,
            "presence" => Access::Presence,
            "roster" => Access::Roster,
            "whitelist" => Access::Whitelist,
            _ => return None,
        })
    }
}

/// What a service allows in its nodes' configuration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rules {
    /// `pubsub#max_items` of a node created without one.
    pub default_max_items: u32,
    /// The most items a node may keep (what `max` means).
    pub max_items: u32,
    /// The generic service (`pubsub.<domain>`): access model `open` and no
    /// last item by default, configurable publish model, notifications and
    /// payloads, the description, payload type and `notify_config`
    /// fields; no `on_sub_and_presence`. PEP otherwise: `presence`, last
    /// item on subscription and presence, the owner publishes, always
    /// notifies with payloads.
    pub service: bool,
}

fn yes() -> bool {
    true
}

fn publishers() -> String {
    "publishers".into()
}

/// A node's configuration (stored as JSON with a version). Fields added
/// after version 1 have serde defaults, so older stored configurations
/// read back unchanged.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct NodeConfig {
    pub v: u32,
    pub access_model: Access,
    pub max_items: u32,
    pub persist_items: bool,
    /// `never`, `on_sub` or `on_sub_and_presence`.
    pub send_last_published_item: String,
    pub notify_retract: bool,
    pub notify_delete: bool,
    /// `headline` or `normal`.
    pub notification_type: String,
    pub title: String,
    pub roster_groups_allowed: Vec<String>,
    /// `publishers`, `subscribers` or `open` (the service only).
    #[serde(default = "publishers")]
    pub publish_model: String,
    #[serde(default = "yes")]
    pub deliver_notifications: bool,
    #[serde(default = "yes")]
    pub deliver_payloads: bool,
    #[serde(default)]
    pub notify_config: bool,
    #[serde(default)]
    pub description: String,
    /// `pubsub#type`: the payload's semantic type.
    #[serde(default)]
    pub payload_type: String,
}

impl NodeConfig {
    /// The default configuration (§8.3).
    pub(crate) fn new(r: &Rules) -> NodeConfig {
        NodeConfig {
            v: 1,
            access_model: if r.service {
                Access::Open
            } else {
                Access::Presence
            },
            max_items: r.default_max_items.max(1),
            persist_items: true,
            send_last_published_item: if r.service {
                "never"
            } else {
                "on_sub_and_presence"
            }
            .into(),
            notify_retract: true,
            notify_delete: true,
            notification_type: "headline".into(),
            title: String::new(),
            roster_groups_allowed: Vec::new(),
            publish_model: publishers(),
            deliver_notifications: true,
            deliver_payloads: true,
            notify_config: false,
            description: String::new(),
            payload_type: String::new(),
        }
    }

    pub(crate) fn from_stored(s: &str) -> Option<NodeConfig> {
        serde_json::from_str(s).ok()
    }

    pub(crate) fn to_stored(&self) -> String {
        serde_json::to_string(self).expect("a node config serializes")
    }

    /// How many items the store keeps: `max_items`, or the last one only
    /// when items do not persist (it is still sent as the last item).
    pub(crate) fn keep(&self) -> u32 {
        if self.persist_items {
            self.max_items
        } else {
            1
        }
    }

    /// The `pubsub#node_config` form (§8.2) of type `kind`.
    pub(crate) fn form(&self, r: &Rules, kind: &str) -> Element {
        if r.service {
            self.service_form(r, kind)
        } else {
            self.pep_form(r, kind)
        }
    }

    fn pep_form(&self, r: &Rules, kind: &str) -> Element {
        let max = self.max_items.to_string();
        let groups: Vec<&str> = self
            .roster_groups_allowed
            .iter()
            .map(String::as_str)
            .collect();
        FormBuilder::new(kind, Some(NS_NODE_CONFIG))
            .field(
                "pubsub#title",
                "text-single",
                Some("A friendly name for the node"),
                &[&self.title],
            )
            .field_with_options(
                "pubsub#access_model",
                "list-single",
                Some("Who may subscribe and retrieve items"),
                &[self.access_model.as_str()],
                &[
                    ("Anyone", "open"),
                    ("Contacts with a presence subscription", "presence"),
                    ("Contacts in the allowed roster groups", "roster"),
                    ("The owner only", "whitelist"),
                ],
            )
            .field(
                "pubsub#roster_groups_allowed",
                "list-multi",
                Some("Roster groups allowed"),
                &groups,
            )
            .field(
                "pubsub#max_items",
                "text-single",
                Some(&format!("Items to keep (at most {}, or max)", r.max_items)),
                &[&max],
            )
            .boolean("pubsub#persist_items", "Keep items", self.persist_items)
            .field_with_options(
                "pubsub#send_last_published_item",
                "list-single",
                Some("When to send the last item"),
                &[&self.send_last_published_item],
                &[
                    ("Never", "never"),
                    ("On subscription", "on_sub"),
                    ("On subscription and presence", "on_sub_and_presence"),
                ],
            )
            .boolean(
                "pubsub#notify_retract",
                "Notify when items are retracted",
                self.notify_retract,
            )
            .boolean(
                "pubsub#notify_delete",
                "Notify when the node is deleted",
                self.notify_delete,
            )
            .boolean(
                "pubsub#deliver_notifications",
                "Deliver notifications",
                true,
            )
            .boolean(
                "pubsub#deliver_payloads",
                "Deliver payloads with notifications",
                true,
            )
            .field_with_options(
                "pubsub#notification_type",
                "list-single",
                Some("Message type of notifications"),
                &[&self.notification_type],
                &[("Headline", "headline"), ("Normal", "normal")],
            )
            .field_with_options(
                "pubsub#publish_model",
                "list-single",
                Some("Who may publish"),
                &["publishers"],
                &[("Publishers (the owner)", "publishers")],
            )
            .build()
    }

    fn service_form(&self, r: &Rules, kind: &str) -> Element {
        let max = self.max_items.to_string();
        let groups: Vec<&str> = self
            .roster_groups_allowed
            .iter()
            .map(String::as_str)
            .collect();
        FormBuilder::new(kind, Some(NS_NODE_CONFIG))
            .field(
                "pubsub#title",
                "text-single",
                Some("A friendly name for the node"),
                &[&self.title],
            )
            .field(
                "pubsub#description",
                "text-single",
                Some("A description of the node"),
                &[&self.description],
            )
            .field(
                "pubsub#type",
                "text-single",
                Some("The type of the payloads (usually their namespace)"),
                &[&self.payload_type],
            )
            .field_with_options(
                "pubsub#access_model",
                "list-single",
                Some("Who may subscribe and retrieve items"),
                &[self.access_model.as_str()],
                &[
                    ("Anyone", "open"),
                    (
                        "Contacts of an owner with a presence subscription",
                        "presence",
                    ),
                    ("Contacts in an owner's allowed roster groups", "roster"),
                    ("Owners, publishers and members only", "whitelist"),
                ],
            )
            .field(
                "pubsub#roster_groups_allowed",
                "list-multi",
                Some("Roster groups allowed"),
                &groups,
            )
            .field_with_options(
                "pubsub#publish_model",
                "list-single",
                Some("Who may publish"),
                &[&self.publish_model],
                &[
                    ("Owners and publishers", "publishers"),
                    ("Subscribers too", "subscribers"),
                    ("Anyone", "open"),
                ],
            )
            .field(
                "pubsub#max_items",
                "text-single",
                Some(&format!("Items to keep (at most {}, or max)", r.max_items)),
                &[&max],
            )
            .boolean(
                "pubsub#persist_items",
                "Keep items (else only the last one)",
                self.persist_items,
            )
            .field_with_options(
                "pubsub#send_last_published_item",
                "list-single",
                Some("When to send the last item"),
                &[&self.send_last_published_item],
                &[("Never", "never"), ("On subscription", "on_sub")],
            )
            .boolean(
                "pubsub#deliver_notifications",
                "Deliver notifications",
                self.deliver_notifications,
            )
            .boolean(
                "pubsub#deliver_payloads",
                "Deliver payloads with notifications",
                self.deliver_payloads,
            )
            .boolean(
                "pubsub#notify_config",
                "Notify subscribers when the configuration changes",
                self.notify_config,
            )
            .boolean(
                "pubsub#notify_delete",
                "Notify when the node is deleted",
                self.notify_delete,
            )
            .boolean(
                "pubsub#notify_retract",
                "Notify when items are retracted or purged",
                self.notify_retract,
            )
            .field_with_options(
                "pubsub#notification_type",
                "list-single",
                Some("Message type of notifications"),
                &[&self.notification_type],
                &[("Headline", "headline"), ("Normal", "normal")],
            )
            .build()
    }

    /// Applies one field of a configuration or publish-options form.
    /// `Err` names what is wrong with the value.
    pub(crate) fn set(&mut self, r: &Rules, var: &str, values: &[String]) -> Result<(), String> {
        let one = || values.first().map(|v| v.trim()).unwrap_or("");
        let boolean = || match one() {
            "1" | "true" => Ok(true),
            "0" | "false" => Ok(false),
            v => Err(format!("{var}: '{v}' is not a boolean")),
        };
        match var {
            "FORM_TYPE" => {}
            "pubsub#title" => self.title = one().to_owned(),
            "pubsub#access_model" => {
                self.access_model = Access::parse(one())
                    .ok_or_else(|| format!("unsupported access model '{}'", one()))?
            }
            "pubsub#roster_groups_allowed" => self.roster_groups_allowed = values.to_vec(),
            "pubsub#max_items" => {
                self.max_items = match one() {
                    "max" => r.max_items,
                    v => match v.parse::<u32>() {
                        Ok(n) if (1..=r.max_items).contains(&n) => n,
                        _ => return Err(format!("max_items must be 1 to {} or max", r.max_items)),
                    },
                }
            }
            "pubsub#persist_items" => self.persist_items = boolean()?,
            "pubsub#send_last_published_item" => match one() {
                v @ ("never" | "on_sub") => self.send_last_published_item = v.to_owned(),
                v @ "on_sub_and_presence" if !r.service => {
                    self.send_last_published_item = v.to_owned()
                }
                v => return Err(format!("send_last_published_item '{v}' is not supported")),
            },
            "pubsub#notify_retract" => self.notify_retract = boolean()?,
            "pubsub#notify_delete" => self.notify_delete = boolean()?,
            "pubsub#notification_type" => match one() {
                v @ ("headline" | "normal") => self.notification_type = v.to_owned(),
                v => return Err(format!("notification_type '{v}' is not supported")),
            },
            "pubsub#deliver_notifications" if r.service => self.deliver_notifications = boolean()?,
            "pubsub#deliver_payloads" if r.service => self.deliver_payloads = boolean()?,
            // Always on in PEP; asking for them is fine, turning them off is not.
            "pubsub#deliver_notifications" | "pubsub#deliver_payloads" => {
                if !boolean()? {
                    return Err(format!("{var} cannot be turned off here"));
                }
            }
            "pubsub#publish_model" if r.service => match one() {
                v @ ("publishers" | "subscribers" | "open") => self.publish_model = v.to_owned(),
                v => return Err(format!("publish_model '{v}' is not supported")),
            },
            "pubsub#publish_model" => {
                if one() != "publishers" {
                    return Err("only the owner publishes to a personal node".into());
                }
            }
            "pubsub#notify_config" if r.service => self.notify_config = boolean()?,
            "pubsub#description" if r.service => self.description = one().to_owned(),
            "pubsub#type" if r.service => self.payload_type = one().to_owned(),
            // Leaf nodes only (collections, XEP-0248, are not built).
            "pubsub#node_type" if r.service => {
                if one() != "leaf" {
                    return Err("only leaf nodes are supported".into());
                }
            }
            _ => return Err(format!("{var} is not a supported option")),
        }
        Ok(())
    }
}

/// A pubsub error: a condition with an application-specific child
/// (XEP-0060 §6.5.9, §7.1.3).
pub(crate) fn perr(cond: StanzaErrorCondition, app: Option<&str>, text: &str) -> StanzaError {
    let mut e = StanzaError::new(cond).with_text(text);
    if let Some(a) = app {
        e = e.with_app(Element::new(a, NS_ERRORS));
    }
    e
}

/// `feature-not-implemented` with `<unsupported feature='…'/>`.
pub(crate) fn unsupported(feature: &str, text: &str) -> StanzaError {
    StanzaError::new(StanzaErrorCondition::FeatureNotImplemented)
        .with_text(text)
        .with_app(
            Element::builder("unsupported", NS_ERRORS)
                .attr("feature", feature)
                .build(),
        )
}

/// The longest node name (bytes).
pub(crate) const MAX_NODE_NAME: usize = 1024;

/// A node name as clients send it: non-empty, reasonably short.
pub(crate) fn node_attr(el: &Element) -> Result<&str, StanzaError> {
    match el.attr("node") {
        Some(n) => node_name(n),
        None => Err(perr(
            StanzaErrorCondition::BadRequest,
            Some("nodeid-required"),
            "name the node",
        )),
    }
}

/// `n` if it may name a node.
pub(crate) fn node_name(n: &str) -> Result<&str, StanzaError> {
    if !n.is_empty() && n.len() <= MAX_NODE_NAME {
        Ok(n)
    } else {
        Err(perr(
            StanzaErrorCondition::NotAcceptable,
            None,
            "node names are 1 to 1024 bytes",
        ))
    }
}

/// The item of a publish request (§7.1): one `<item/>` holding at most one
/// payload element, and exactly one if `payload_required`.
pub(crate) fn publication(
    p: &Element,
    payload_required: bool,
) -> Result<(&Element, Option<&Element>), StanzaError> {
    let mut items = p.children().filter(|c| c.is("item", NS_PUBSUB));
    let item = items.next();
    if items.next().is_some() {
        return Err(perr(
            StanzaErrorCondition::BadRequest,
            Some("invalid-payload"),
            "publish one item at a time",
        ));
    }
    let Some(item) = item else {
        return Err(perr(
            StanzaErrorCondition::BadRequest,
            Some("item-required"),
            "publish an item",
        ));
    };
    let mut kids = item.children();
    match (kids.next(), kids.next()) {
        (Some(k), None) => Ok((item, Some(k))),
        (None, _) if !payload_required => Ok((item, None)),
        (None, _) => Err(perr(
            StanzaErrorCondition::BadRequest,
            Some("payload-required"),
            "the item needs a payload",
        )),
        _ => Err(perr(
            StanzaErrorCondition::BadRequest,
            Some("invalid-payload"),
            "an item holds one payload element",
        )),
    }
}

/// The `publish-options` form of a publish request, if any (§7.1.5).
pub(crate) fn publish_options(ps: &Element) -> Result<Option<Submitted>, StanzaError> {
    let options = ps
        .get_child("publish-options", NS_PUBSUB)
        .and_then(|o| o.get_child("x", ns::DATA_FORMS))
        .map(Submitted::parse);
    if let Some(o) = &options {
        if o.form_type().is_some_and(|t| t != NS_PUBLISH_OPTIONS) {
            return Err(perr(
                StanzaErrorCondition::BadRequest,
                Some("invalid-options"),
                "publish-options need FORM_TYPE pubsub#publish-options",
            ));
        }
    }
    Ok(options)
}

/// §7.1.5: every option must match the existing node's configuration,
/// else `conflict` + `precondition-not-met`.
pub(crate) fn check_preconditions(
    cfg: &NodeConfig,
    r: &Rules,
    o: &Submitted,
) -> Result<(), StanzaError> {
    let mut wanted = cfg.clone();
    for var in o.vars() {
        let values = o.values(var).unwrap_or_default();
        if wanted.set(r, var, values).is_err() {
            return Err(perr(
                StanzaErrorCondition::Conflict,
                Some("precondition-not-met"),
                &format!("{var} cannot be met"),
            ));
        }
    }
    if &wanted != cfg {
        return Err(perr(
            StanzaErrorCondition::Conflict,
            Some("precondition-not-met"),
            "the node's configuration differs from the publish-options",
        ));
    }
    Ok(())
}

/// §7.1.5 3: the configuration of a node created by a publication, the
/// defaults changed by the publish-options (`not-acceptable` +
/// `invalid-options` if one cannot be applied).
pub(crate) fn configured(r: &Rules, o: Option<&Submitted>) -> Result<NodeConfig, StanzaError> {
    let mut cfg = NodeConfig::new(r);
    if let Some(o) = o {
        for var in o.vars() {
            let values = o.values(var).unwrap_or_default();
            cfg.set(r, var, values).map_err(|e| {
                perr(
                    StanzaErrorCondition::NotAcceptable,
                    Some("invalid-options"),
                    &e,
                )
            })?;
        }
    }
    Ok(cfg)
}

/// `<item id>payload</item>` in namespace `ns`.
pub(crate) fn item_el(ns: &str, it: &StoredItem) -> Element {
    let mut el = Element::builder("item", ns)
        .attr("id", it.id.as_str())
        .build();
    if let Ok(p) = it.payload.parse::<Element>() {
        el.append_child(p);
    }
    el
}

/// `<event><items node>…</items></event>`, the items with their
/// payloads unless `ids_only` (§7.1.2.2, a notification-only node).
pub(crate) fn items_event(node: &str, items: &[StoredItem], ids_only: bool) -> Element {
    let mut list = Element::builder("items", NS_EVENT)
        .attr("node", node)
        .build();
    for it in items {
        list.append_child(if ids_only {
            Element::builder("item", NS_EVENT)
                .attr("id", it.id.as_str())
                .build()
        } else {
            item_el(NS_EVENT, it)
        });
    }
    Element::builder("event", NS_EVENT).append(list).build()
}

/// `<event><items node><retract id/></items></event>` (§7.2.2.1).
pub(crate) fn retract_event(node: &str, id: &str) -> Element {
    let mut list = Element::builder("items", NS_EVENT)
        .attr("node", node)
        .build();
    list.append_child(Element::builder("retract", NS_EVENT).attr("id", id).build());
    Element::builder("event", NS_EVENT).append(list).build()
}

/// `<event><purge node/></event>` (§8.5.2).
pub(crate) fn purge_event(node: &str) -> Element {
    Element::builder("event", NS_EVENT)
        .append(
            Element::builder("purge", NS_EVENT)
                .attr("node", node)
                .build(),
        )
        .build()
}

/// `<event><delete node>[<redirect uri/>]</delete></event>` (§8.4.2).
pub(crate) fn delete_event(node: &str, redirect: Option<&str>) -> Element {
    let mut delete = Element::builder("delete", NS_EVENT)
        .attr("node", node)
        .build();
    if let Some(uri) = redirect {
        delete.append_child(
            Element::builder("redirect", NS_EVENT)
                .attr("uri", uri)
                .build(),
        );
    }
    Element::builder("event", NS_EVENT).append(delete).build()
}

/// The publication order of items ([`StoredItem::seq`]): microseconds
/// since the Unix epoch, made unique and increasing by this process.
#[derive(Default)]
pub(crate) struct Seq(AtomicI64);

impl Seq {
    pub(crate) fn next(&self) -> i64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        let mut last = self.0.load(Ordering::Relaxed);
        loop {
            let next = now.max(last + 1);
            match self
                .0
                .compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(cur) => last = cur,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEP: Rules = Rules {
        default_max_items: 1,
        max_items: 1000,
        service: false,
    };
    const SERVICE: Rules = Rules {
        default_max_items: 10,
        max_items: 100,
        service: true,
    };

    #[test]
    fn configurations_stored_before_the_service_fields_read_back_as_before() {
        // A PEP node stored by the first version.
        let old = r#"{"v":1,"access_model":"open","max_items":5,"persist_items":true,"send_last_published_item":"on_sub_and_presence","notify_retract":true,"notify_delete":true,"notification_type":"headline","title":"t","roster_groups_allowed":[]}"#;
        let n = NodeConfig::from_stored(old).unwrap();
        let mut want = NodeConfig::new(&PEP);
        want.access_model = Access::Open;
        want.max_items = 5;
        want.title = "t".into();
        assert_eq!(n, want);
        assert_eq!(NodeConfig::from_stored(&n.to_stored()), Some(n));
    }

    #[test]
    fn the_service_allows_more_than_pep() {
        let mut s = NodeConfig::new(&SERVICE);
        assert_eq!(
            (s.access_model, s.send_last_published_item.as_str()),
            (Access::Open, "never")
        );
        for (var, v) in [
            ("pubsub#publish_model", "open"),
            ("pubsub#deliver_payloads", "0"),
            ("pubsub#notify_config", "1"),
            ("pubsub#type", "urn:x"),
            ("pubsub#node_type", "leaf"),
        ] {
            s.set(&SERVICE, var, &[v.into()]).unwrap();
            let mut p = NodeConfig::new(&PEP);
            assert!(p.set(&PEP, var, &[v.into()]).is_err(), "{var}");
        }
        assert_eq!(s.publish_model, "open");
        assert!(!s.deliver_payloads && s.notify_config);
        assert!(s
            .set(
                &SERVICE,
                "pubsub#send_last_published_item",
                &["on_sub_and_presence".into()]
            )
            .is_err());
        assert!(s
            .set(&SERVICE, "pubsub#node_type", &["collection".into()])
            .is_err());
        s.set(&SERVICE, "pubsub#max_items", &["max".into()])
            .unwrap();
        assert_eq!(s.max_items, 100);
        assert!(s
            .set(&SERVICE, "pubsub#max_items", &["101".into()])
            .is_err());
    }
}
