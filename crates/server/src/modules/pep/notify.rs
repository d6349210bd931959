//! PEP notifications (XEP-0163 §4.2–§4.3): an event to the owner's and
//! the admitted contacts' resources that asked for it, and the last items
//! of the nodes a session follows when it comes online (§4.3.4) or is
//! newly subscribed to the owner's presence (§4.3.3).

use super::caps::caps_key;
use super::{admits, Pep, NAME};
use crate::modules::common::pubsub::{items_event, Access, NodeConfig};
use starling_core::storage::{RosterItem, StoredItem, Subscription};
use starling_core::Env;
use starling_proto::{ns, BareJid, FullJid, Jid, Stanza};
use starling_xml::Element;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Free mailbox slots the last-item delivery waits for before each item
/// (a quarter of the default `[c2s] mailbox_size`: room for the presences
/// and messages arriving meanwhile).
const LAST_ITEMS_ROOM: usize = 256;

/// The longest it waits for them at one item: a session that made no room
/// in that time stopped reading, and the rest is sent without waiting (it
/// gets the usual bounces; the task ends instead of waiting per item). A
/// slow reader that makes progress is waited for as long as it reads.
const LAST_ITEMS_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Pep {
    /// Delivers the last items to a session that just came online (or
    /// changed its capabilities) in a task of its own: the user's presence
    /// broadcast, which this hook runs before, does not wait for them.
    pub(super) fn deliver_last_soon(
        &self,
        me: BareJid,
        to: FullJid,
        features: Arc<HashSet<String>>,
    ) {
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

    /// The available resources that get `owner`'s notifications for
    /// `node`: the owner's, and the contacts' the access model admits,
    /// each only if it asked for them (`NODE+notify`).
    pub(super) async fn recipients(
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
    pub(super) async fn notify(
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
    pub(super) async fn on_approved(&self, env: &Env, owner: &BareJid, contact: &BareJid) {
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
}
