//! Roster and presence subscriptions (RFC 6121 §2, §3, Appendix A; roster
//! versioning XEP-0237; subscription pre-approval RFC 6121 §3.4).
//!
//! - Roster get/set/remove from the user's own client (iqs with no 'to' or
//!   'to' = the user's bare JID), handled in `user_send` because the
//!   session that asked for the roster becomes *interested* (§2.2) — state
//!   kept in [`SessionRoster`]. Roster iqs addressed to another account get
//!   `<forbidden/>` (§2.3.3).
//! - Roster pushes (§2.1.6) are routed to every bound resource of the
//!   owner; the `user_receive` handler keeps the session's roster cache
//!   current with them and drops them at sessions that never asked for the
//!   roster. Pushes always carry `ver` internally (it orders them against
//!   the cache); it is removed on the wire when versioning is off.
//! - XEP-0237: a roster get with a known `ver` gets an empty result and
//!   one push per item changed since (the last carries the current
//!   version, earlier ones versions that are never newer than their
//!   change, so a client that stops half-way re-syncs correctly); an
//!   unknown `ver` gets the full roster.
//! - Outbound subscription stanzas (`user_send`, Appendix A.2): stamped
//!   with the user's bare JID (§3.1.2, §3.1.5, §3.2.2, §3.3.2), 'to'
//!   reduced to a bare JID, the user's item stored and pushed *before*
//!   routing (so a synchronous auto-reply of the contact's server sees the
//!   new state, and pushes stay in version order, §2.6.3), then routed or
//!   not as the tables say. Approving sends the
//!   user's current presence to the contact (§3.1.5); cancelling sends
//!   unavailable first (§3.2.2).
//! - Inbound subscription stanzas to a local account (`inbound`, Appendix
//!   A.3), so they are processed whether or not the contact is online:
//!   deliver / don't deliver / auto-reply as the tables say. Delivery goes
//!   to the account's sessions; `user_receive` lets `subscribe` through
//!   to available resources and the others to available or interested ones
//!   (§3.1.3, §3.1.6).
//! - "Pending in" is recorded as a stored subscription request
//!   (`RosterStore::put_pending_request`), with or without a roster item
//!   (Appendix A.1 state 3: no item is created for a mere request). The
//!   table is the truth; an item's `pending_in` is written to match it.
//!   Requests are kept until approved, denied or cancelled and delivered
//!   each time the user sends initial presence (§3.1.3 rule 4).
//! - The roster of a session is cached in [`SessionRoster::contacts`]
//!   (loaded by the roster get or at initial presence, one query) for the
//!   presence module's fan-out (RFC 6121 §4).
//!
//! Local simplifications: every account is local (no s2s), so the user's
//! server and the contact's server are this process; subscriptions to
//! remote domains get `<remote-server-not-found/>` and change nothing.
//! `subscribe` to a local account that does not exist is processed like any
//! other on the user's side (item with `ask`, pushed, §3.1.2); the
//! contact's side then answers `unsubscribed` from the contact's bare JID
//! (§3.1.3 and §8.5.1 allow that or silence; ejabberd and Prosody answer),
//! which clears the ask with a second push (§3.2.3, A.3.4), so clients see
//! the request end. Subscribing to oneself is ignored and
//! adding oneself to the roster gets `<not-allowed/>` (§2.3.3 interop
//! note). Changes to one account's items are serialized on this node
//! (`ItemLocks`: a roster set, the user's own subscription stanzas and the
//! contacts' arriving ones), so simultaneous requests from both sides end in
//! `both` on both sides. On a cluster the contact's side of a change runs on
//! the sender's node: two nodes changing one item at the same instant can
//! still overwrite each other (last writer wins there).
//!
//! Hooks: `user_send` (30), `user_receive` (30), `inbound` (50), own-account
//! iq handler `{jabber:iq:roster}query` (in the requesting session, which
//! keeps the cache), iq handler for other accounts (refusal), stream features
//! (rosterver, pre-approval). Storage: roster, accounts.
//! Config: `[modules.roster]` ([`RosterConfig`]): enabled, max_items, versioning.

use starling_core::hooks::{
    FeatureStage, HookRegistry, InboundHandler, IqHandler, IqResponse, IqScope, OwnIqHandler,
    StreamFeatureProvider, UserReceiveHandler, UserSendHandler,
};
use starling_core::module::{Module, ModuleCtx};
use starling_core::roster::SessionRoster;
use starling_core::storage::{RosterChange, RosterItem, StorageError, Subscription};
use starling_core::{async_trait, Env, Flow, HookResult, SessionCtx, SessionInfo};
use starling_proto::{
    ns, random_id, BareJid, ErrorType, FullJid, Jid, Stanza, StanzaError, StanzaErrorCondition,
    StanzaKind,
};
use starling_xml::Element;
use std::sync::Arc;

/// `[modules.roster]`: RFC 6121 roster and subscriptions, XEP-0237.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RosterConfig {
    /// Run the module (without it there are no contacts or subscriptions).
    pub enabled: bool,
    /// Most items in one roster; adding more fails with
    /// `<not-allowed/>` and a text saying so.
    pub max_items: u32,
    /// Offer roster versioning (XEP-0237).
    pub versioning: bool,
}

impl Default for RosterConfig {
    fn default() -> Self {
        RosterConfig {
            enabled: true,
            max_items: 1000,
            versioning: true,
        }
    }
}

const NAME: &str = "roster";
/// The roster namespace (RFC 6121 §2).
pub const NS_ROSTER: &str = "jabber:iq:roster";
/// Roster versioning stream feature (RFC 6121 §2.6.1, XEP-0237).
pub const NS_ROSTERVER: &str = "urn:xmpp:features:rosterver";
/// Subscription pre-approval stream feature (RFC 6121 §3.4).
pub const NS_PRE_APPROVAL: &str = "urn:xmpp:features:pre-approval";
/// Longest accepted item name and group name, in bytes (§2.3.3).
pub const MAX_NAME_BYTES: usize = 1023;

/// The roster module.
pub struct Roster {
    max_items: u64,
    versioning: bool,
    /// Serializes the read-modify-write of one account's items.
    locks: ItemLocks,
}

/// One account's roster items are read, changed and written by several
/// tasks: its own sessions (roster sets, outbound subscription stanzas)
/// and the sessions of its contacts (their subscription stanzas arrive
/// through the router in the sender's task, Appendix A.3). Two of those
/// at once must not lose an update (both `subscribe` at the same moment
/// would leave one side `to` and the other `both`), so each account's
/// changes run under one of these striped locks. A task holds at most one
/// stripe and never routes a stanza to another account while holding it
/// (those wait in an [`After`] list), so stripes cannot deadlock. Within
/// one node; see the module doc for a cluster.
struct ItemLocks(Vec<tokio::sync::Mutex<()>>);

impl ItemLocks {
    fn new() -> ItemLocks {
        ItemLocks((0..64).map(|_| tokio::sync::Mutex::new(())).collect())
    }

    async fn lock(&self, owner: &BareJid) -> tokio::sync::MutexGuard<'_, ()> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        owner.hash(&mut h);
        self.0[(h.finish() % self.0.len() as u64) as usize]
            .lock()
            .await
    }
}

/// What a change sends to other accounts, after its lock is released.
enum After {
    Route(Stanza),
    CurrentPresence(BareJid, BareJid),
    Unavailable(BareJid, BareJid),
}

async fn run_after(env: &Env, after: Vec<After>) {
    for a in after {
        match a {
            After::Route(s) => env.route(s).await,
            After::CurrentPresence(owner, to) => send_current_presence(env, &owner, &to).await,
            After::Unavailable(owner, to) => send_unavailable(env, &owner, &to).await,
        }
    }
}

impl Roster {
    /// Registers the module.
    pub fn register(cfg: &RosterConfig, reg: &mut HookRegistry) {
        let m = Arc::new(Roster {
            max_items: u64::from(cfg.max_items),
            versioning: cfg.versioning,
            locks: ItemLocks::new(),
        });
        reg.user_send(NAME, 30, m.clone());
        reg.user_receive(NAME, 30, m.clone());
        reg.inbound(NAME, 50, m.clone());
        reg.own_iq(NAME, "query", NS_ROSTER, m.clone());
        reg.iq(NAME, IqScope::Account, "query", NS_ROSTER, m.clone());
        reg.stream_features(m);
    }
}

fn storage_failure(what: &str, e: &StorageError) -> StanzaError {
    tracing::error!(module = NAME, error = %e, "{what}");
    StanzaError::new(StanzaErrorCondition::InternalServerError).with_type(ErrorType::Wait)
}

fn err(c: StanzaErrorCondition, text: &str) -> StanzaError {
    StanzaError::new(c).with_text(text)
}

/// A subscription presence type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SubType {
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
}

impl SubType {
    fn of(stanza: &Stanza) -> Option<SubType> {
        if stanza.kind() != StanzaKind::Presence {
            return None;
        }
        Some(match stanza.type_attr()? {
            "subscribe" => SubType::Subscribe,
            "subscribed" => SubType::Subscribed,
            "unsubscribe" => SubType::Unsubscribe,
            "unsubscribed" => SubType::Unsubscribed,
            _ => return None,
        })
    }
}

/// `<item/>` for a roster result or push.
pub fn item_element(item: &RosterItem) -> Element {
    let mut el = Element::new("item", NS_ROSTER);
    el.set_attr("jid", item.jid.as_str());
    if let Some(name) = item.name.as_deref().filter(|n| !n.is_empty()) {
        el.set_attr("name", name);
    }
    el.set_attr("subscription", item.subscription.as_str());
    if item.ask {
        el.set_attr("ask", "subscribe");
    }
    if item.approved {
        el.set_attr("approved", "true");
    }
    for g in &item.groups {
        el.append_child(
            Element::builder("group", NS_ROSTER)
                .text(g.as_str())
                .build(),
        );
    }
    el
}

fn removed_element(jid: &BareJid) -> Element {
    Element::builder("item", NS_ROSTER)
        .attr("jid", jid.as_str())
        .attr("subscription", "remove")
        .build()
}

fn push_iq(to: &FullJid, item: Element, ver: u64) -> Element {
    let mut iq = Element::new("iq", ns::CLIENT);
    iq.set_attr("type", "set");
    iq.set_attr("id", format!("push-{}", random_id(10)));
    iq.set_attr("to", to.as_str());
    let mut q = Element::new("query", NS_ROSTER);
    q.set_attr("ver", ver.to_string());
    q.append_child(item);
    iq.append_child(q);
    iq
}

/// Routes a roster push of `item` (version `ver`) to every bound resource
/// of `owner`; sessions that did not ask for the roster drop it.
pub async fn push_all(env: &Env, owner: &BareJid, item: Element, ver: u64) {
    for e in env.sessions.resources(owner) {
        let iq = push_iq(&e.session.jid, item.clone(), ver);
        env.route(Stanza::new(iq, None, Some(e.session.jid.into())))
            .await;
    }
}

/// Hands `stanza` to every bound resource of `owner` through the router
/// (without its inbound chain, which already ran): the receive hook
/// decides which sessions show it.
async fn deliver(env: &Env, owner: &BareJid, stanza: &Stanza) {
    for e in env.sessions.resources(owner) {
        if let Err(why) = env.router.deliver(env, &e.session, stanza.clone()).await {
            // A full mailbox is logged (throttled) by the router.
            tracing::debug!(module = NAME, to = %e.jid(), ?why, "subscription presence not delivered");
        }
    }
}

/// Sends the current presence of each available resource of `owner` to
/// `to` (RFC 6121 §3.1.5, §3.4 auto-approval).
pub async fn send_current_presence(env: &Env, owner: &BareJid, to: &BareJid) {
    for e in env.sessions.resources(owner) {
        if let Some(p) = &e.presence {
            let mut el = (**p).clone();
            el.remove_attr("to");
            env.route(Stanza::new(
                el,
                Some(e.session.jid.into()),
                Some(to.clone().into()),
            ))
            .await;
        }
    }
}

/// Sends unavailable presence from each available resource of `owner` to
/// `to` (RFC 6121 §3.2.2, §3.3.3 step 3).
pub async fn send_unavailable(env: &Env, owner: &BareJid, to: &BareJid) {
    for e in env.sessions.resources(owner) {
        if e.priority.is_some() {
            env.route(Stanza::presence(
                Some("unavailable"),
                e.session.jid.into(),
                to.clone().into(),
            ))
            .await;
        }
    }
}

/// The user's item for `contact` and whether a subscription request from
/// `contact` is pending.
async fn load_state(
    env: &Env,
    owner: &BareJid,
    contact: &BareJid,
) -> Result<(Option<RosterItem>, bool), StorageError> {
    let item = env.storage.roster.get_item(owner, contact).await?;
    let pending = env
        .storage
        .roster
        .has_pending_request(owner, contact)
        .await?;
    Ok((item, pending))
}

/// Stores `item` and pushes it.
async fn save(env: &Env, owner: &BareJid, item: &RosterItem) -> Result<(), StorageError> {
    let ver = env.storage.roster.put_item(owner, item).await?;
    push_all(env, owner, item_element(item), ver).await;
    Ok(())
}

fn with_to(s: Subscription, on: bool) -> Subscription {
    match (s.has_from(), on) {
        (true, true) => Subscription::Both,
        (true, false) => Subscription::From,
        (false, true) => Subscription::To,
        (false, false) => Subscription::None,
    }
}

fn with_from(s: Subscription, on: bool) -> Subscription {
    match (s.has_to(), on) {
        (true, true) => Subscription::Both,
        (true, false) => Subscription::To,
        (false, true) => Subscription::From,
        (false, false) => Subscription::None,
    }
}

impl Roster {
    // ----- roster get / set (RFC 6121 §2) -----

    async fn roster_get(&self, cx: &mut SessionCtx<'_>, iq: &Stanza) -> Result<(), StanzaError> {
        let Some(q) = iq.payload() else {
            return Err(StanzaErrorCondition::BadRequest.into());
        };
        if q.children().any(|c| c.name() == "item") {
            return Err(err(
                StanzaErrorCondition::BadRequest,
                "a roster get carries no items",
            ));
        }
        let owner = cx.jid().to_bare();
        let env = cx.env;
        let store = &env.storage.roster;
        cx.state
            .get_or_insert_with(SessionRoster::default)
            .interested = true;
        if self.versioning {
            if let Some(known) = q.attr("ver").and_then(|v| v.parse::<u64>().ok()) {
                let changes = store
                    .changes_since(&owner, known)
                    .await
                    .map_err(|e| storage_failure("roster changes lookup failed", &e))?;
                if let Some((current, changes)) = changes {
                    // §2.6.3: empty result, then one interim push per change.
                    cx.send(iq.iq_result(None).into_element());
                    let me = cx.jid().clone();
                    let n = changes.len();
                    for (i, change) in changes.iter().enumerate() {
                        let ver = if i + 1 == n {
                            current
                        } else {
                            known + i as u64 + 1
                        };
                        let item = match change {
                            RosterChange::Updated(it) => item_element(it),
                            RosterChange::Removed(j) => removed_element(j),
                        };
                        cx.send(push_iq(&me, item, ver));
                    }
                    return Ok(());
                }
            }
        }
        let (version, items) = store
            .get_roster(&owner)
            .await
            .map_err(|e| storage_failure("roster load failed", &e))?;
        let mut query = Element::new("query", NS_ROSTER);
        if self.versioning {
            query.set_attr("ver", version.to_string());
        }
        for it in &items {
            query.append_child(item_element(it));
        }
        let state = cx.state.get_or_insert_with(SessionRoster::default);
        if state.contacts.is_none() || state.version < version {
            state.load(version, &items);
        }
        cx.send(iq.iq_result(Some(query)).into_element());
        Ok(())
    }

    async fn roster_set(&self, cx: &mut SessionCtx<'_>, iq: &Stanza) -> Result<(), StanzaError> {
        let Some(q) = iq.payload() else {
            return Err(StanzaErrorCondition::BadRequest.into());
        };
        let items: Vec<&Element> = q.children().filter(|c| c.is("item", NS_ROSTER)).collect();
        if items.len() != 1 {
            return Err(err(
                StanzaErrorCondition::BadRequest,
                "a roster set carries exactly one item",
            ));
        }
        let item = items[0];
        let Some(raw) = item.attr("jid") else {
            return Err(err(StanzaErrorCondition::BadRequest, "the item has no jid"));
        };
        let jid = Jid::new(raw).map_err(|e| {
            err(
                StanzaErrorCondition::JidMalformed,
                &format!("invalid jid: {e}"),
            )
        })?;
        if jid.resource().is_some() {
            return Err(err(
                StanzaErrorCondition::JidMalformed,
                "roster items are bare JIDs",
            ));
        }
        let contact = jid.to_bare();
        let owner = cx.jid().to_bare();
        if contact == owner {
            return Err(err(
                StanzaErrorCondition::NotAllowed,
                "you cannot add yourself to your roster",
            ));
        }
        if item.attr("subscription") == Some("remove") {
            return self.roster_remove(cx, iq, &owner, &contact).await;
        }
        // §2.1.2.5: other subscription values, 'ask' and 'approved' are ignored.
        let name = item.attr("name").filter(|n| !n.is_empty());
        if name.is_some_and(|n| n.len() > MAX_NAME_BYTES) {
            return Err(err(
                StanzaErrorCondition::NotAcceptable,
                &format!("the name is longer than {MAX_NAME_BYTES} bytes"),
            ));
        }
        let mut groups: Vec<String> = Vec::new();
        for g in item.children().filter(|c| c.is("group", NS_ROSTER)) {
            let t = g.text();
            if t.is_empty() {
                return Err(err(StanzaErrorCondition::NotAcceptable, "empty group name"));
            }
            if t.len() > MAX_NAME_BYTES {
                return Err(err(
                    StanzaErrorCondition::NotAcceptable,
                    &format!("a group name is longer than {MAX_NAME_BYTES} bytes"),
                ));
            }
            if groups.contains(&t) {
                return Err(err(StanzaErrorCondition::BadRequest, "duplicate group"));
            }
            groups.push(t);
        }
        let env = cx.env;
        let _guard = self.locks.lock(&owner).await;
        let (existing, pending_in) = load_state(env, &owner, &contact)
            .await
            .map_err(|e| storage_failure("roster lookup failed", &e))?;
        let mut it = match existing {
            Some(it) => it,
            None => {
                self.check_room(env, &owner).await?;
                RosterItem::new(contact)
            }
        };
        it.name = name.map(str::to_owned);
        it.groups = groups;
        it.pending_in = pending_in;
        let ver = env
            .storage
            .roster
            .put_item(&owner, &it)
            .await
            .map_err(|e| storage_failure("roster update failed", &e))?;
        cx.send(iq.iq_result(None).into_element());
        push_all(env, &owner, item_element(&it), ver).await;
        Ok(())
    }

    /// `<not-allowed/>` when the roster is full.
    async fn check_room(&self, env: &Env, owner: &BareJid) -> Result<(), StanzaError> {
        let n = env
            .storage
            .roster
            .count(owner)
            .await
            .map_err(|e| storage_failure("roster count failed", &e))?;
        if n >= self.max_items {
            return Err(err(
                StanzaErrorCondition::NotAllowed,
                &format!(
                    "your roster is full: at most {} contacts are allowed",
                    self.max_items
                ),
            ));
        }
        Ok(())
    }

    /// §2.5: removal, with the unsubscribe/unsubscribed the state calls for.
    async fn roster_remove(
        &self,
        cx: &mut SessionCtx<'_>,
        iq: &Stanza,
        owner: &BareJid,
        contact: &BareJid,
    ) -> Result<(), StanzaError> {
        let env = cx.env;
        let fail = |e: StorageError| storage_failure("roster removal failed", &e);
        let guard = self.locks.lock(owner).await;
        let (item, pending_in) = load_state(env, owner, contact).await.map_err(fail)?;
        let Some(item) = item else {
            return Err(err(
                StanzaErrorCondition::ItemNotFound,
                "no such item in your roster",
            ));
        };
        let ver = env
            .storage
            .roster
            .remove_item(owner, contact)
            .await
            .map_err(fail)?;
        if pending_in {
            env.storage
                .roster
                .remove_pending_request(owner, contact)
                .await
                .map_err(fail)?;
        }
        cx.send(iq.iq_result(None).into_element());
        if let Some(ver) = ver {
            push_all(env, owner, removed_element(contact), ver).await;
        }
        drop(guard);
        let me: Jid = owner.clone().into();
        let them: Jid = contact.clone().into();
        // §2.5.2 rule 1 (and a pending request of ours is withdrawn too).
        if item.subscription.has_to() || item.ask {
            env.route(Stanza::presence(
                Some("unsubscribe"),
                me.clone(),
                them.clone(),
            ))
            .await;
        }
        // §2.5.2 rule 2 (and a pending request from the contact is denied).
        if item.subscription.has_from() || pending_in {
            if item.subscription.has_from() {
                send_unavailable(env, owner, contact).await;
            }
            env.route(Stanza::presence(Some("unsubscribed"), me, them))
                .await;
        }
        Ok(())
    }

    // ----- outbound subscription stanzas (RFC 6121 §3, Appendix A.2) -----

    async fn outbound(
        &self,
        cx: &mut SessionCtx<'_>,
        stanza: &mut Stanza,
        kind: SubType,
    ) -> Result<(), StanzaError> {
        let env = cx.env;
        let Some(to) = stanza.to().cloned() else {
            return Ok(());
        };
        let domain = to.domain().as_str();
        let reachable = env.hosts.is_local(domain)
            || env
                .hooks
                .service_for(domain, |d| env.hosts.modules_off(d))
                .is_some();
        if !reachable {
            // No s2s: the contact's server cannot be reached (§3.1.2).
            // Local services (gateways on external components, XEP-0100)
            // are reached through the router like accounts.
            return Err(StanzaErrorCondition::RemoteServerNotFound.into());
        }
        let owner = cx.jid().to_bare();
        let contact = to.to_bare();
        if contact == owner {
            return Ok(()); // one is always subscribed to oneself
        }
        if kind == SubType::Subscribe && contact.node().is_none() && env.hosts.is_local(domain) {
            // The server itself takes no subscriptions.
            return Err(err(
                StanzaErrorCondition::ServiceUnavailable,
                "the server does not take presence subscriptions",
            ));
        }
        // §3.1.2: the user's bare JID, to the contact's bare JID.
        stanza.set_from(Some(owner.clone().into()));
        stanza.set_to(Some(contact.clone().into()));
        let fail = |e: StorageError| storage_failure("subscription update failed", &e);
        let guard = self.locks.lock(&owner).await;
        let mut after = Vec::new();
        let (item, pending_in) = load_state(env, &owner, &contact).await.map_err(fail)?;
        let store = &env.storage.roster;
        match kind {
            SubType::Subscribe => {
                // A.2.1: always routed; ask='subscribe' unless already set.
                let (mut it, fresh) = match item {
                    Some(it) => (it, false),
                    None => {
                        self.check_room(env, &owner).await?;
                        (RosterItem::new(contact.clone()), true)
                    }
                };
                // Pending out only when not subscribed yet (To/Both: no change).
                if fresh || !(it.ask || it.subscription.has_to()) {
                    it.ask = !it.subscription.has_to();
                    it.pending_in = pending_in;
                    save(env, &owner, &it).await.map_err(fail)?;
                }
                after.push(After::Route(stanza.clone()));
            }
            SubType::Unsubscribe => {
                // A.2.2: always routed; drops 'to' and 'ask'.
                if let Some(mut it) = item.filter(|it| it.subscription.has_to() || it.ask) {
                    it.subscription = with_to(it.subscription, false);
                    it.ask = false;
                    it.pending_in = pending_in;
                    save(env, &owner, &it).await.map_err(fail)?;
                }
                after.push(After::Route(stanza.clone()));
            }
            SubType::Subscribed => {
                let has_from = item.as_ref().is_some_and(|i| i.subscription.has_from());
                if has_from {
                    return Ok(()); // A.2.3: M.N. route, no change
                }
                if pending_in {
                    // A.2.3 / §3.1.5: approval.
                    let mut it = match item {
                        Some(it) => it,
                        None => {
                            self.check_room(env, &owner).await?;
                            RosterItem::new(contact.clone())
                        }
                    };
                    it.subscription = with_from(it.subscription, true);
                    it.pending_in = false;
                    it.approved = false;
                    save(env, &owner, &it).await.map_err(fail)?;
                    store
                        .remove_pending_request(&owner, &contact)
                        .await
                        .map_err(fail)?;
                    after.push(After::Route(stanza.clone()));
                    after.push(After::CurrentPresence(owner.clone(), contact.clone()));
                } else {
                    // §3.4.2 rules 3 and 4: pre-approval, not routed.
                    let mut it = match item {
                        Some(it) => it,
                        None => {
                            self.check_room(env, &owner).await?;
                            RosterItem::new(contact.clone())
                        }
                    };
                    if !it.approved {
                        it.approved = true;
                        save(env, &owner, &it).await.map_err(fail)?;
                    }
                }
            }
            SubType::Unsubscribed => {
                let has_from = item.as_ref().is_some_and(|i| i.subscription.has_from());
                if has_from || pending_in {
                    // A.2.4 / §3.2.2: cancellation or denial, routed.
                    if let Some(mut it) = item.filter(|_| has_from) {
                        it.subscription = with_from(it.subscription, false);
                        it.pending_in = false;
                        it.approved = false;
                        save(env, &owner, &it).await.map_err(fail)?;
                    }
                    if pending_in {
                        store
                            .remove_pending_request(&owner, &contact)
                            .await
                            .map_err(fail)?;
                    }
                    if has_from {
                        after.push(After::Unavailable(owner.clone(), contact.clone()));
                    }
                    after.push(After::Route(stanza.clone()));
                } else if let Some(mut it) = item.filter(|i| i.approved) {
                    // §3.4: cancels a pre-approval; S.N. route.
                    it.approved = false;
                    save(env, &owner, &it).await.map_err(fail)?;
                }
            }
        }
        drop(guard);
        run_after(env, after).await;
        Ok(())
    }

    // ----- inbound subscription stanzas (Appendix A.3) -----

    async fn inbound_sub(
        &self,
        env: &Env,
        stanza: &Stanza,
        kind: SubType,
        owner: &BareJid,
        contact: &BareJid,
    ) -> Result<(), StorageError> {
        if kind == SubType::Subscribe && !env.storage.accounts.exists(owner).await? {
            // No such account (§8.5.1): refuse on its behalf, so the
            // requester's pending ask is cleared (§3.2.3, A.3.4) instead of
            // staying forever.
            env.route(Stanza::presence(
                Some("unsubscribed"),
                owner.clone().into(),
                contact.clone().into(),
            ))
            .await;
            return Ok(());
        }
        let guard = self.locks.lock(owner).await;
        let mut after = Vec::new();
        let (item, pending_in) = load_state(env, owner, contact).await?;
        let store = &env.storage.roster;
        let sub = item.as_ref().map_or(Subscription::None, |i| i.subscription);
        let ask = item.as_ref().is_some_and(|i| i.ask);
        // What the user's client sees: from the contact's bare JID, to the
        // user's bare JID.
        let mut shown = stanza.clone();
        shown.set_from(Some(contact.clone().into()));
        shown.set_to(Some(owner.clone().into()));
        let me: Jid = owner.clone().into();
        let them: Jid = contact.clone().into();
        match kind {
            SubType::Subscribe => {
                if sub.has_from() {
                    // A.3.1 [2] / §3.1.3 rule 2: auto-reply, don't deliver.
                    after.push(After::Route(Stanza::presence(Some("subscribed"), me, them)));
                    after.push(After::CurrentPresence(owner.clone(), contact.clone()));
                } else if let Some(mut it) = item.filter(|i| i.approved) {
                    // A.3.1 [1] / §3.4: pre-approved.
                    it.subscription = with_from(it.subscription, true);
                    it.approved = false;
                    it.pending_in = false;
                    let ver = store.put_item(owner, &it).await?;
                    after.push(After::Route(Stanza::presence(Some("subscribed"), me, them)));
                    push_all(env, owner, item_element(&it), ver).await;
                    after.push(After::CurrentPresence(owner.clone(), contact.clone()));
                } else if !pending_in {
                    // A.3.1: None → None + Pending In, To → To + Pending In…
                    // Stored until approved or denied (§3.1.3 rule 4).
                    store
                        .put_pending_request(owner, contact, &shown.element().to_string())
                        .await?;
                    deliver(env, owner, &shown).await;
                }
                // Already pending: S.N. deliver, no state change.
            }
            SubType::Unsubscribe => {
                if !(sub.has_from() || pending_in) {
                    return Ok(()); // A.3.2: S.N. deliver
                }
                if pending_in {
                    store.remove_pending_request(owner, contact).await?;
                }
                deliver(env, owner, &shown).await;
                if sub.has_from() {
                    if let Some(mut it) = item {
                        it.subscription = with_from(it.subscription, false);
                        it.pending_in = false;
                        it.approved = false;
                        save(env, owner, &it).await?;
                    }
                    after.push(After::Unavailable(owner.clone(), contact.clone()));
                }
                // A.3.2 [1]: auto-reply.
                after.push(After::Route(Stanza::presence(
                    Some("unsubscribed"),
                    me,
                    them,
                )));
            }
            SubType::Subscribed => {
                let Some(mut it) = item.filter(|_| ask) else {
                    return Ok(()); // A.3.3: no pending out → ignore
                };
                it.subscription = with_to(it.subscription, true);
                it.ask = false;
                it.pending_in = pending_in;
                let ver = store.put_item(owner, &it).await?;
                deliver(env, owner, &shown).await; // §3.1.6 step 1, before the push
                push_all(env, owner, item_element(&it), ver).await;
            }
            SubType::Unsubscribed => {
                let Some(mut it) = item.filter(|_| ask || sub.has_to()) else {
                    return Ok(()); // A.3.4: ignore
                };
                it.subscription = with_to(it.subscription, false);
                it.ask = false;
                it.pending_in = pending_in;
                let ver = store.put_item(owner, &it).await?;
                deliver(env, owner, &shown).await; // §3.2.3 step 1, before the push
                push_all(env, owner, item_element(&it), ver).await;
            }
        }
        drop(guard);
        run_after(env, after).await;
        Ok(())
    }

    /// Initial presence: load the session's roster cache if needed and
    /// deliver stored subscription requests (§3.1.3 rule 4).
    async fn on_broadcast(&self, cx: &mut SessionCtx<'_>) -> Result<(), StorageError> {
        let owner = cx.jid().to_bare();
        let env = cx.env;
        let store = &env.storage.roster;
        let loaded = cx
            .state
            .get::<SessionRoster>()
            .is_some_and(|s| s.contacts.is_some());
        if !loaded {
            let (version, items) = store.get_roster(&owner).await?;
            cx.state
                .get_or_insert_with(SessionRoster::default)
                .load(version, &items);
        }
        if cx.info.priority.is_some() {
            return Ok(()); // an update, not initial presence
        }
        let pending = store.pending_requests(&owner).await?;
        if pending.is_empty() {
            return Ok(());
        }
        // Through our own mailbox, so they arrive after the presence echo
        // and pass the receive filter like live requests.
        let Some(me) = env.sessions.get(cx.jid()) else {
            return Ok(());
        };
        for (from, xml) in pending {
            let parsed = xml
                .parse::<Element>()
                .ok()
                .and_then(|el| Stanza::from_element(el).ok());
            let Some(stanza) = parsed else {
                tracing::warn!(module = NAME, jid = %owner, contact = %from, "unreadable stored subscription request skipped");
                continue;
            };
            if env.router.deliver(env, &me.session, stanza).await.is_err() {
                tracing::warn!(module = NAME, jid = %owner, "mailbox full: remaining subscription requests wait for the next login");
                break;
            }
        }
        Ok(())
    }
}

#[async_trait]
impl UserSendHandler for Roster {
    async fn user_send(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        match stanza.kind() {
            StanzaKind::Iq | StanzaKind::Message => Ok(Flow::Continue),
            StanzaKind::Presence => {
                if let Some(kind) = SubType::of(stanza) {
                    if stanza.to().is_none() {
                        return Ok(Flow::Stop); // to oneself: nothing to do
                    }
                    let original = stanza.clone();
                    if let Err(e) = self.outbound(cx, stanza, kind).await {
                        cx.reply_error(&original, e);
                    }
                    return Ok(Flow::Stop);
                }
                if stanza.type_attr().is_none() && stanza.to().is_none() {
                    if let Err(e) = self.on_broadcast(cx).await {
                        tracing::error!(module = NAME, error = %e, "roster load at initial presence failed");
                    }
                }
                Ok(Flow::Continue)
            }
        }
    }
}

/// The user's own roster (§2.1.3: no `to`, or the bare JID), answered in
/// the session whose cache and interest flag it updates.
#[async_trait]
impl OwnIqHandler for Roster {
    async fn own_iq(&self, cx: &mut SessionCtx<'_>, iq: &Stanza) -> IqResponse {
        let r = if iq.type_attr() == Some("get") {
            self.roster_get(cx, iq).await
        } else {
            self.roster_set(cx, iq).await
        };
        match r {
            Ok(()) => IqResponse::Handled,
            Err(e) => IqResponse::Error(e),
        }
    }
}

#[async_trait]
impl UserReceiveHandler for Roster {
    async fn user_receive(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        match stanza.kind() {
            StanzaKind::Iq => {
                // Roster pushes come from the server: no 'from' (§2.1.6).
                if stanza.from().is_some() || stanza.type_attr() != Some("set") {
                    return Ok(Flow::Continue);
                }
                let Some(q) = stanza.payload().filter(|p| p.is("query", NS_ROSTER)) else {
                    return Ok(Flow::Continue);
                };
                let ver = q.attr("ver").and_then(|v| v.parse::<u64>().ok());
                let change = q.get_child("item", NS_ROSTER).and_then(|it| {
                    let jid = BareJid::new(it.attr("jid")?).ok()?;
                    let sub = it.attr("subscription").unwrap_or("none");
                    Some((jid, Subscription::parse(sub)))
                });
                let state = cx.state.get_or_insert_with(SessionRoster::default);
                if let (Some(contacts), Some(ver), Some((jid, sub))) =
                    (state.contacts.as_mut(), ver, change)
                {
                    if ver > state.version {
                        state.version = ver;
                        match sub {
                            Some(s) => {
                                contacts.insert(jid, s);
                            }
                            None => {
                                contacts.remove(&jid);
                            }
                        }
                    }
                }
                if !state.interested {
                    return Ok(Flow::Stop);
                }
                if !self.versioning {
                    if let Some(q) = stanza.element_mut().get_child_mut("query", NS_ROSTER) {
                        q.remove_attr("ver");
                    }
                }
                Ok(Flow::Continue)
            }
            StanzaKind::Presence => {
                let Some(kind) = SubType::of(stanza) else {
                    return Ok(Flow::Continue);
                };
                let available = cx.info.priority.is_some();
                let interested = cx
                    .state
                    .get::<SessionRoster>()
                    .is_some_and(|s| s.interested);
                // §3.1.3: requests go to available resources; §3.1.6,
                // §3.2.3, §3.3.3: the others to interested resources.
                let show = match kind {
                    SubType::Subscribe => available,
                    _ => available || interested,
                };
                Ok(if show { Flow::Continue } else { Flow::Stop })
            }
            StanzaKind::Message => Ok(Flow::Continue),
        }
    }
}

#[async_trait]
impl InboundHandler for Roster {
    async fn inbound(&self, env: &Env, stanza: &mut Stanza) -> HookResult {
        let Some(kind) = SubType::of(stanza) else {
            return Ok(Flow::Continue);
        };
        // Subscription presence to a local account is the server's (§3.1.3:
        // a full JID counts as the bare JID); never delivered raw.
        let (Some(from), Some(to)) = (stanza.from(), stanza.to()) else {
            return Ok(Flow::Stop);
        };
        let owner = to.to_bare();
        let contact = from.to_bare();
        if owner == contact || to.node().is_none() {
            return Ok(Flow::Stop);
        }
        if let Err(e) = self.inbound_sub(env, stanza, kind, &owner, &contact).await {
            tracing::error!(module = NAME, jid = %owner, contact = %contact, error = %e, "inbound subscription processing failed");
        }
        Ok(Flow::Stop)
    }
}

#[async_trait]
impl IqHandler for Roster {
    async fn handle_iq(&self, _env: &Env, _scope: IqScope, _iq: &Stanza) -> IqResponse {
        // §2.3.3: only the account's own resources may read or change it.
        IqResponse::Error(err(
            StanzaErrorCondition::Forbidden,
            "you cannot access another user's roster",
        ))
    }
}

impl StreamFeatureProvider for Roster {
    fn stream_features(
        &self,
        _env: &Env,
        _info: &SessionInfo,
        stage: FeatureStage,
        out: &mut Vec<Element>,
    ) {
        if stage != FeatureStage::PostAuth {
            return;
        }
        if self.versioning {
            out.push(Element::new("ver", NS_ROSTERVER));
        }
        out.push(Element::new("sub", NS_PRE_APPROVAL));
    }
}

impl Module for Roster {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str = "RFC 6121 roster and subscriptions, XEP-0237 roster versioning";
    type Config = RosterConfig;
    const STORAGE: &'static [&'static str] = &["roster", "accounts"];

    fn enabled(cfg: &RosterConfig) -> bool {
        cfg.enabled
    }

    async fn start(cfg: &RosterConfig, _ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        Roster::register(cfg, reg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscription_arithmetic() {
        use Subscription::*;
        assert_eq!(with_to(None, true), To);
        assert_eq!(with_to(From, true), Both);
        assert_eq!(with_to(Both, false), From);
        assert_eq!(with_from(To, true), Both);
        assert_eq!(with_from(Both, false), To);
        assert_eq!(with_from(From, false), None);
    }

    #[test]
    fn item_element_carries_state() {
        let mut it = RosterItem::new(BareJid::new("a@b").unwrap());
        it.ask = true;
        it.approved = true;
        it.name = Some("A".into());
        it.groups = vec!["g1".into(), "g2".into()];
        let el = item_element(&it);
        assert_eq!(el.attr("ask"), Some("subscribe"));
        assert_eq!(el.attr("approved"), Some("true"));
        assert_eq!(el.attr("subscription"), Some("none"));
        assert_eq!(el.children().count(), 2);
    }
}
