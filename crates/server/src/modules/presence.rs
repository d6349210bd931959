//! Presence (RFC 6121 §4).
//!
//! - Availability and priority of each resource are recorded in the session
//!   table (with the last broadcast presence, for probes), which is what
//!   routing to a bare JID needs (§8.5.2, §4.7.2.3).
//! - Broadcast presence (no 'to') goes to the user's own available resources
//!   (the sender gets the echo of available presence, §4.2.2, §4.4.2,
//!   §4.5.2) and, with the roster module, to every contact with
//!   subscription from/both (§4.2.2, §4.4.2, §4.5.2). Fan-out reads the
//!   session's roster cache ([`SessionRoster`], one roster query per
//!   session) and routes one stanza per contact: no scan of the session
//!   table.
//! - Initial presence: the current presence of every contact with
//!   subscription to/both. All accounts are local, so instead of sending
//!   probes the server answers them itself (§4.3.1: "does not need to send
//!   a presence probe if the contact's account resides on the same
//!   server"): one session-table lookup per contact, the stored presence of
//!   each available resource (§4.3.2 rule 4) written to the new session
//!   after the router's `inbound` chain (block lists) accepted it. Offline
//!   contacts send nothing (§4.3.2 rule 3 is a SHOULD that "can greatly
//!   increase the number of presence notifications").
//! - Contacts who log in at the same moment see each other exactly once.
//!   The session records its availability in the session table *before*
//!   it looks up its contacts (not only through the `SetPresence` action
//!   after the chain), so a contact's broadcast that the lookup misses
//!   finds the session available and is delivered. A contact whose
//!   availability the lookup saw may still have its broadcast delivered
//!   too; the lookup's answers are remembered ([`Announced`], for
//!   [`ANNOUNCED_TTL`]) and the first routed presence of each of those
//!   resources is dropped if it carries the same payload — the routed copy
//!   always arrives after the looked-up one, through the mailbox. Any
//!   other presence from that resource ends the suppression for it, and a
//!   probe the client sends ends it for all (the answers are asked for).
//! - Probes that do arrive (sent by a client, §4.3) are answered per
//!   §4.3.2 from the session table: `unsubscribed` from the bare JID when
//!   the prober is not a subscriber, the stored presence of each available
//!   resource (only mere availability of the one resource for a full-JID
//!   probe), or unavailable from the bare JID when none is available.
//!   Probes are never delivered to clients.
//! - Directed presence (§4.6): available presence sent to an entity that is
//!   not a subscriber is remembered per session (up to
//!   `max_directed_per_session` entries); directed unavailable forgets it, and so
//!   (SHOULD) does unavailable presence received from it. When the session
//!   becomes unavailable — unavailable broadcast, stream close or a dropped
//!   connection — those entities get unavailable presence.
//! - A session that ends while available has unavailable presence
//!   broadcast on its behalf to subscribers and own resources (§4.5.2).
//!
//! Hooks: `user_send` (40), `user_receive` (40), `session_closed`, timer,
//! `inbound` (45, probes; with the roster module). Storage: roster
//! (probe authorisation). Config: `[modules.presence]` enabled,
//! max_directed_per_session.

use starling_core::hooks::{
    HookRegistry, InboundHandler, SessionClosedHandler, SessionLostHandler, TimerHandler,
    UserReceiveHandler, UserSendHandler,
};
use starling_core::module::{Module, ModuleCtx};
use starling_core::roster::SessionRoster;
use starling_core::{async_trait, run_chain, Action, Env, Flow, HookResult, SessionCtx, TimerKey};
use starling_proto::{BareJid, Jid, Stanza, StanzaKind};
use starling_xml::Element;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// `[modules.presence]`: RFC 6121 presence (availability and priority).
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PresenceConfig {
    /// Track availability and priority from the client's presence. Turning
    /// it off leaves every session unavailable for bare-JID delivery.
    pub enabled: bool,
    /// Entities one session remembers having sent directed available
    /// presence to (RFC 6121 §4.6.3), to send them unavailable presence
    /// when it ends. Beyond it the presence is still delivered but not
    /// remembered (that entity is not told when the session ends).
    pub max_directed_per_session: usize,
}

impl Default for PresenceConfig {
    fn default() -> Self {
        PresenceConfig {
            enabled: true,
            max_directed_per_session: MAX_DIRECTED,
        }
    }
}

const NAME: &str = "presence";
/// Most entities one session remembers having sent directed presence to,
/// by default (`max_directed_per_session`).
pub const MAX_DIRECTED: usize = 1000;
/// How long a session remembers the contacts' presence it was given at
/// login, to drop the same presence arriving again from a contact who
/// became available at the same moment. Generous: the racing copy is
/// routed right after the contact's own availability was recorded.
pub const ANNOUNCED_TTL: Duration = Duration::from_secs(10);
const FORGET_ANNOUNCED: TimerKey = TimerKey {
    module: NAME,
    token: 1,
};

/// The presence module.
pub struct Presence {
    /// `max_directed_per_session`.
    max_directed: usize,
}

/// Per-session state: entities that got directed available presence.
#[derive(Default)]
struct Directed {
    targets: HashSet<Jid>,
}

/// Per-session state, for [`ANNOUNCED_TTL`] after initial presence: the
/// contacts' resources whose presence the session was given from the
/// session table, with that presence.
struct Announced {
    sent: Vec<(Jid, Arc<Element>)>,
}

impl Presence {
    /// Registers the module; `roster` says whether the roster module runs
    /// (subscription-based fan-out and probe answers need it).
    pub fn register(roster: bool, max_directed: usize, reg: &mut HookRegistry) {
        let m = Arc::new(Presence { max_directed });
        reg.user_send(NAME, 40, m.clone());
        reg.user_receive(NAME, 40, m.clone());
        reg.session_closed(NAME, 40, m.clone());
        reg.session_lost(NAME, 40, m.clone());
        reg.timer(NAME, m.clone());
        if roster {
            reg.inbound(NAME, 45, m);
        }
    }
}

fn subscribers(cx: &SessionCtx<'_>) -> Vec<BareJid> {
    cx.state
        .get::<SessionRoster>()
        .map(|s| s.subscribers().cloned().collect())
        .unwrap_or_default()
}

impl Presence {
    /// Presence with no 'to': availability for broadcast.
    async fn broadcast(&self, cx: &mut SessionCtx<'_>, stanza: &Stanza, available: bool) {
        let was_available = cx.info.priority.is_some();
        let record = available.then(|| (stanza.priority(), Arc::new(stanza.element().clone())));
        if available && !was_available {
            // Visible as available before the contacts are looked up (see
            // the module doc); the action below updates the session's own
            // facts and writes the same entry again.
            cx.env
                .sessions
                .set_presence(cx.jid(), cx.info.id, record.clone());
        }
        cx.push(Action::SetPresence(record));
        let me = cx.jid().clone();
        let my_bare = me.to_bare();
        // Own resources (§4.2.2, §4.4.2, §4.5.2).
        for other in cx.env.sessions.resources(&my_bare) {
            if other.session.jid != me && other.priority.is_some() {
                let mut copy = stanza.clone();
                copy.set_to(Some(other.session.jid.into()));
                cx.route(copy);
            }
        }
        // Subscribers (§4.2.2, §4.4.2, §4.5.2).
        let subs = subscribers(cx);
        if available || was_available {
            for c in &subs {
                let mut copy = stanza.clone();
                copy.set_to(Some(c.clone().into()));
                cx.route(copy);
            }
        }
        if available {
            // §4.2.2: "including the resource that generated the presence".
            let mut echo = stanza.clone();
            echo.set_to(Some(me.clone().into()));
            cx.send(echo.into_element());
            if !was_available {
                self.current_presence_of_contacts(cx).await;
            }
        } else if let Some(d) = cx.state.remove::<Directed>() {
            // §4.6.3 rule 2: directed presence ends with the session's
            // availability.
            for t in d.targets {
                if was_available && subs.contains(&t.to_bare()) {
                    continue; // already got the broadcast
                }
                let mut copy = stanza.clone();
                copy.set_to(Some(t));
                cx.route(copy);
            }
        }
    }

    /// Initial presence: the stored presence of each available resource of
    /// each contact the user is subscribed to (§4.2.2, §4.3.2 rule 4).
    async fn current_presence_of_contacts(&self, cx: &mut SessionCtx<'_>) {
        let contacts: Vec<BareJid> = match cx.state.get::<SessionRoster>() {
            Some(s) => s.subscriptions().cloned().collect(),
            None => return,
        };
        let env = cx.env;
        let me: Jid = cx.jid().clone().into();
        let mut sent = Vec::new();
        for c in contacts {
            for e in env.sessions.resources(&c) {
                let Some(p) = &e.presence else { continue };
                let from: Jid = e.session.jid.into();
                let mut s = Stanza::new((**p).clone(), Some(from.clone()), Some(me.clone()));
                let flow = if env.hooks.inbound.is_empty() {
                    Flow::Continue
                } else {
                    run_chain!(
                        env.hooks.inbound,
                        "inbound",
                        off = cx.info.modules_off(),
                        |h| h.inbound(env, &mut s)
                    )
                };
                if flow == Flow::Continue {
                    cx.send(s.into_element());
                    sent.push((from, p.clone()));
                }
            }
        }
        if !sent.is_empty() {
            cx.state.insert(Announced { sent });
            cx.push(Action::SetTimer(FORGET_ANNOUNCED, ANNOUNCED_TTL));
        }
    }

    /// A presence from a contact's resource: false if it repeats the
    /// presence this session was given from the session table at login.
    fn is_news(&self, cx: &mut SessionCtx<'_>, stanza: &Stanza) -> bool {
        let (Some(a), Some(from)) = (cx.state.get_mut::<Announced>(), stanza.from()) else {
            return true;
        };
        let Some(i) = a.sent.iter().position(|(j, _)| j == from) else {
            return true;
        };
        let (_, known) = a.sent.swap_remove(i);
        if a.sent.is_empty() {
            cx.state.remove::<Announced>();
            cx.push(Action::CancelTimer(FORGET_ANNOUNCED));
        }
        !(stanza.type_attr().is_none() && known.children().eq(stanza.element().children()))
    }

    /// Presence with a 'to': remember or forget directed presence (§4.6.3).
    fn directed(&self, cx: &mut SessionCtx<'_>, to: &Jid, available: bool) {
        let bare = to.to_bare();
        if bare == cx.jid().to_bare() {
            return;
        }
        if available {
            let subscribed = cx
                .state
                .get::<SessionRoster>()
                .is_some_and(|s| s.is_subscriber(&bare));
            // Rule 1: a subscriber during the presence session needs no
            // tracking; rules 2 and 3: everyone else does.
            if subscribed && cx.info.priority.is_some() {
                return;
            }
            let d = cx.state.get_or_insert_with(Directed::default);
            if d.targets.len() < self.max_directed {
                d.targets.insert(to.clone());
            }
        } else if let Some(d) = cx.state.get_mut::<Directed>() {
            d.targets.remove(to);
        }
    }
}

#[async_trait]
impl UserSendHandler for Presence {
    async fn user_send(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        if stanza.kind() != StanzaKind::Presence {
            return Ok(Flow::Continue);
        }
        let available = match stanza.type_attr() {
            None => true,
            Some("unavailable") => false,
            Some("probe") => {
                // The answers are asked for: none is a repeat to drop.
                if cx.state.remove::<Announced>().is_some() {
                    cx.push(Action::CancelTimer(FORGET_ANNOUNCED));
                }
                return Ok(Flow::Continue);
            }
            _ => return Ok(Flow::Continue),
        };
        match stanza.to().cloned() {
            None => {
                self.broadcast(cx, stanza, available).await;
                Ok(Flow::Stop)
            }
            Some(to) => {
                self.directed(cx, &to, available);
                Ok(Flow::Continue)
            }
        }
    }
}

#[async_trait]
impl UserReceiveHandler for Presence {
    async fn user_receive(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        if stanza.kind() != StanzaKind::Presence {
            return Ok(Flow::Continue);
        }
        // §4.6.1: SHOULD forget an entity that sends unavailable presence.
        if stanza.type_attr() == Some("unavailable") {
            if let (Some(d), Some(from)) = (cx.state.get_mut::<Directed>(), stanza.from()) {
                d.targets.remove(from);
            }
        }
        if matches!(stanza.type_attr(), None | Some("unavailable")) && !self.is_news(cx, stanza) {
            return Ok(Flow::Stop); // already given at login (module doc)
        }
        Ok(Flow::Continue)
    }
}

#[async_trait]
impl TimerHandler for Presence {
    async fn timer(&self, cx: &mut SessionCtx<'_>, _token: u64) -> HookResult {
        cx.state.remove::<Announced>();
        Ok(Flow::Continue)
    }
}

/// A session of a cluster node that died: what [`SessionClosedHandler`]
/// would have sent, from what the registry and the roster know (the
/// session's directed-presence targets died with it and get nothing).
#[async_trait]
impl SessionLostHandler for Presence {
    async fn session_lost(&self, env: &Env, entry: &starling_core::SessionEntry) -> HookResult {
        if entry.priority.is_none() {
            return Ok(Flow::Continue);
        }
        let from: Jid = entry.session.jid.clone().into();
        announce(env, entry, |to| {
            Some(Stanza::presence(Some("unavailable"), from.clone(), to))
        })
        .await
    }

    /// The lost session is back: its last broadcast presence again, to the
    /// same people.
    async fn session_returned(&self, env: &Env, entry: &starling_core::SessionEntry) -> HookResult {
        let (Some(_), Some(last)) = (entry.priority, entry.presence.as_deref()) else {
            return Ok(Flow::Continue);
        };
        let from: Jid = entry.session.jid.clone().into();
        announce(env, entry, |to| {
            let mut s = Stanza::from_element(last.clone()).ok()?;
            s.set_from(Some(from.clone()));
            s.set_to(Some(to));
            Some(s)
        })
        .await
    }
}

/// Routes what `make` builds for each of the account's other available
/// resources and each subscriber in its stored roster (a session of a
/// cluster node that died or came back: there is no session state to read
/// them from).
async fn announce(
    env: &Env,
    entry: &starling_core::SessionEntry,
    make: impl Fn(Jid) -> Option<Stanza>,
) -> HookResult {
    let owner = entry.session.jid.to_bare();
    for other in env.sessions.resources(&owner) {
        if other.priority.is_some() && other.session != entry.session {
            if let Some(s) = make(other.session.jid.into()) {
                env.route(s).await;
            }
        }
    }
    let (_, items) = env.storage.roster.get_roster(&owner).await?;
    for item in items.iter().filter(|i| i.subscription.has_from()) {
        if let Some(s) = make(item.jid.clone().into()) {
            env.route(s).await;
        }
    }
    Ok(Flow::Continue)
}

#[async_trait]
impl SessionClosedHandler for Presence {
    async fn session_closed(&self, cx: &mut SessionCtx<'_>) -> HookResult {
        // §4.5.2: gracefully or not, an available resource that goes away
        // is announced unavailable; §4.6.3: so are directed-presence targets.
        let me = cx.jid().clone();
        let unavailable = |to: Jid| Stanza::presence(Some("unavailable"), me.clone().into(), to);
        let mut sent: HashSet<BareJid> = HashSet::new();
        if cx.info.priority.is_some() {
            for other in cx.env.sessions.resources(&me.to_bare()) {
                if other.priority.is_some() {
                    cx.route(unavailable(other.session.jid.into()));
                }
            }
            for c in subscribers(cx) {
                cx.route(unavailable(c.clone().into()));
                sent.insert(c);
            }
        }
        if let Some(d) = cx.state.remove::<Directed>() {
            for t in d.targets {
                if !sent.contains(&t.to_bare()) {
                    cx.route(unavailable(t));
                }
            }
        }
        Ok(Flow::Continue)
    }
}

#[async_trait]
impl InboundHandler for Presence {
    async fn inbound(&self, env: &Env, stanza: &mut Stanza) -> HookResult {
        if stanza.kind() != StanzaKind::Presence || stanza.type_attr() != Some("probe") {
            return Ok(Flow::Continue);
        }
        // §4.3.2: probes are the server's, never delivered.
        let (Some(from), Some(to)) = (stanza.from().cloned(), stanza.to().cloned()) else {
            return Ok(Flow::Stop);
        };
        let owner = to.to_bare();
        let prober = from.to_bare();
        let authorized = owner == prober
            || match env.storage.roster.get_item(&owner, &prober).await {
                Ok(item) => item.is_some_and(|i| i.subscription.has_from()),
                Err(e) => {
                    tracing::error!(module = NAME, error = %e, "roster lookup for a probe failed");
                    return Ok(Flow::Stop);
                }
            };
        if !authorized {
            // Rule 1: unsubscribed from the bare JID (no presence leak).
            env.route(Stanza::presence(
                Some("unsubscribed"),
                owner.into(),
                prober.into(),
            ))
            .await;
            return Ok(Flow::Stop);
        }
        let id = stanza.id().map(str::to_owned);
        match to.try_as_full() {
            Ok(full) => {
                // Only that resource, and only the fact that it is available.
                let available = env.sessions.get(full).is_some_and(|e| e.priority.is_some());
                let kind = (!available).then_some("unavailable");
                let mut reply = Stanza::presence(kind, full.clone().into(), from.clone());
                if let Some(id) = &id {
                    reply.element_mut().set_attr("id", id.as_str());
                }
                env.route(reply).await;
            }
            Err(_) => {
                let mut any = false;
                for e in env.sessions.resources(&owner) {
                    if let Some(p) = &e.presence {
                        any = true;
                        let el: Element = (**p).clone();
                        env.route(Stanza::new(
                            el,
                            Some(e.session.jid.into()),
                            Some(from.clone()),
                        ))
                        .await;
                    }
                }
                if !any {
                    // Rule 3: unavailable from the bare JID.
                    env.route(Stanza::presence(Some("unavailable"), owner.into(), from))
                        .await;
                }
            }
        }
        Ok(Flow::Stop)
    }
}

impl Module for Presence {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str =
        "RFC 6121 presence: availability, priority, broadcast, probes, directed presence";
    type Config = PresenceConfig;

    fn enabled(cfg: &PresenceConfig) -> bool {
        cfg.enabled
    }

    async fn start(cfg: &PresenceConfig, ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        Presence::register(
            (ctx.is_enabled)("roster"),
            cfg.max_directed_per_session,
            reg,
        );
    }
}
