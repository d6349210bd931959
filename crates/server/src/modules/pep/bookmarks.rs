//! XEP-0048 bookmarks in Private XML Storage as a view of XEP-0402's PEP
//! bookmarks (XEP-0402 §5.3 "compat", the feature
//! `urn:xmpp:bookmarks:1#compat`), so that old clients (private storage)
//! and new ones (PEP) see one list:
//!
//! - a private-storage get of `{storage:bookmarks}storage` lists the PEP
//!   node's conferences (the item id is the room's JID), followed by what
//!   else the old format holds (`<url/>` bookmarks), which stays in private
//!   storage;
//! - a set changes the PEP node: conferences that are new or differ are
//!   published, those missing are retracted (notified to the owner's
//!   resources like any publication), unchanged ones are left alone
//!   ("SHOULD NOT send notifications for unchanged items"); the node is
//!   created with XEP-0402 §5's configuration when there is none.

use super::{Pep, NS_PUBSUB};
use starling_core::hooks::PrivateFragmentHandler;
use starling_core::{async_trait, Env};
use starling_proto::{BareJid, StanzaError, StanzaErrorCondition};
use starling_xml::Element;
use std::collections::BTreeMap;
use std::sync::Arc;

/// XEP-0402's node and payload namespace.
pub const NS_BOOKMARKS: &str = "urn:xmpp:bookmarks:1";
/// XEP-0048's namespace.
pub const NS_LEGACY: &str = "storage:bookmarks";
/// Where the rest of the old format is kept (the private module's key).
const PRIVATE_KIND: &str = "private";
const PRIVATE_KEY: &str = "{storage:bookmarks}storage";

/// The compat view, registered as the private storage of
/// `{storage:bookmarks}storage`.
pub struct Bookmarks(pub Arc<Pep>);

fn truthy(v: Option<&str>) -> bool {
    matches!(v, Some("1" | "true"))
}

/// XEP-0402 `<conference/>` (the payload) from XEP-0048's; the room JID.
fn from_legacy(c: &Element) -> Option<(String, Element)> {
    let jid = BareJid::new(c.attr("jid")?).ok()?;
    let mut out = Element::new("conference", NS_BOOKMARKS);
    if let Some(n) = c.attr("name").filter(|n| !n.is_empty()) {
        out.set_attr("name", n);
    }
    if truthy(c.attr("autojoin")) {
        out.set_attr("autojoin", "true");
    }
    for (child, name) in [("nick", "nick"), ("password", "password")] {
        if let Some(v) = c.get_child(child, NS_LEGACY).map(|e| e.text()) {
            out.append_child(Element::builder(name, NS_BOOKMARKS).text(v).build());
        }
    }
    Some((jid.as_str().to_owned(), out))
}

/// XEP-0048 `<conference/>` from an item of the PEP node.
fn to_legacy(jid: &str, c: &Element) -> Element {
    let mut out = Element::builder("conference", NS_LEGACY)
        .attr("jid", jid)
        .attr(
            "autojoin",
            if truthy(c.attr("autojoin")) {
                "true"
            } else {
                "false"
            },
        )
        .build();
    if let Some(n) = c.attr("name") {
        out.set_attr("name", n);
    }
    for name in ["nick", "password"] {
        if let Some(v) = c.get_child(name, NS_BOOKMARKS).map(|e| e.text()) {
            out.append_child(Element::builder(name, NS_LEGACY).text(v).build());
        }
    }
    out
}

impl Bookmarks {
    /// The PEP node's conferences: room JID → payload, if the node exists.
    async fn current(
        &self,
        env: &Env,
        owner: &BareJid,
    ) -> Result<BTreeMap<String, Element>, StanzaError> {
        if self.0.node(env, owner, NS_BOOKMARKS).await?.is_none() {
            return Ok(BTreeMap::new());
        }
        let items = env
            .storage
            .pubsub
            .items(owner.as_str(), NS_BOOKMARKS, None)
            .await
            .map_err(super::internal)?;
        Ok(items
            .into_iter()
            .rev()
            .filter_map(|it| {
                let p = it.payload.parse::<Element>().ok()?;
                p.is("conference", NS_BOOKMARKS).then_some((it.id, p))
            })
            .collect())
    }
}

#[async_trait]
impl PrivateFragmentHandler for Bookmarks {
    async fn get(&self, env: &Env, owner: &BareJid) -> Result<Element, StanzaError> {
        let mut storage = Element::new("storage", NS_LEGACY);
        for (jid, c) in self.current(env, owner).await? {
            storage.append_child(to_legacy(&jid, &c));
        }
        let rest = env
            .storage
            .user_data
            .get(owner, PRIVATE_KIND, PRIVATE_KEY)
            .await
            .map_err(super::internal)?;
        if let Some(rest) = rest.and_then(|r| r.parse::<Element>().ok()) {
            for c in rest.children().filter(|c| !c.is("conference", NS_LEGACY)) {
                storage.append_child(c.clone());
            }
        }
        Ok(storage)
    }

    async fn set(&self, env: &Env, owner: &BareJid, el: &Element) -> Result<(), StanzaError> {
        let mut wanted = BTreeMap::new();
        for c in el.children().filter(|c| c.is("conference", NS_LEGACY)) {
            let Some((jid, payload)) = from_legacy(c) else {
                return Err(StanzaError::new(StanzaErrorCondition::BadRequest)
                    .with_text("every conference bookmark needs a valid room jid"));
            };
            wanted.insert(jid, payload);
        }
        // What is not a conference stays in private storage.
        let mut rest = Element::new("storage", NS_LEGACY);
        for c in el.children().filter(|c| !c.is("conference", NS_LEGACY)) {
            rest.append_child(c.clone());
        }
        env.storage
            .user_data
            .set(owner, PRIVATE_KIND, PRIVATE_KEY, &rest.to_string_in(""))
            .await
            .map_err(super::internal)?;
        let current = self.current(env, owner).await?;
        let exists = self.0.node(env, owner, NS_BOOKMARKS).await?.is_some();
        let publisher = owner
            .with_resource_str("bookmarks")
            .map_err(|_| StanzaError::new(StanzaErrorCondition::InternalServerError))?;
        for (jid, payload) in &wanted {
            if current.get(jid) == Some(payload) {
                continue;
            }
            let mut ps = Element::new("pubsub", NS_PUBSUB);
            let p = Element::builder("publish", NS_PUBSUB)
                .attr("node", NS_BOOKMARKS)
                .append(
                    Element::builder("item", NS_PUBSUB)
                        .attr("id", jid.as_str())
                        .append(payload.clone())
                        .build(),
                )
                .build();
            ps.append_child(p.clone());
            if !exists {
                // XEP-0402 §5: private, every item kept, never pushed as
                // the last item.
                ps.append_child(publish_options());
            }
            self.0.publish(env, owner, &publisher, &ps, &p).await?;
        }
        for jid in current.keys().filter(|j| !wanted.contains_key(*j)) {
            let r = Element::builder("retract", NS_PUBSUB)
                .attr("node", NS_BOOKMARKS)
                .attr("notify", "true")
                .append(
                    Element::builder("item", NS_PUBSUB)
                        .attr("id", jid.as_str())
                        .build(),
                )
                .build();
            self.0.retract(env, owner, &r).await?;
        }
        Ok(())
    }
}

/// XEP-0402 §5's publish-options.
fn publish_options() -> Element {
    let form = starling_core::forms::FormBuilder::new(
        "submit",
        Some("http://jabber.org/protocol/pubsub#publish-options"),
    )
    .field("pubsub#persist_items", "boolean", None, &["true"])
    .field("pubsub#max_items", "text-single", None, &["max"])
    .field(
        "pubsub#send_last_published_item",
        "list-single",
        None,
        &["never"],
    )
    .field("pubsub#access_model", "list-single", None, &["whitelist"])
    .build();
    Element::builder("publish-options", NS_PUBSUB)
        .append(form)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_and_native_conferences_convert_both_ways() {
        let legacy: Element =
            "<conference xmlns='storage:bookmarks' jid='Room@Conference.Example.org' \
             name='The Room' autojoin='1'><nick>JC</nick><password>pw</password></conference>"
                .parse()
                .unwrap();
        let (jid, native) = from_legacy(&legacy).unwrap();
        assert_eq!(jid, "room@conference.example.org");
        assert_eq!(native.attr("autojoin"), Some("true"));
        assert_eq!(native.get_child("nick", NS_BOOKMARKS).unwrap().text(), "JC");
        let back = to_legacy(&jid, &native);
        assert_eq!(back.attr("jid"), Some("room@conference.example.org"));
        assert_eq!(back.attr("name"), Some("The Room"));
        assert_eq!(back.get_child("password", NS_LEGACY).unwrap().text(), "pw");
        let bad: Element = "<conference xmlns='storage:bookmarks' name='x'/>"
            .parse()
            .unwrap();
        assert!(from_legacy(&bad).is_none());
    }
}
