//! Message Carbons (XEP-0280).
//!
//! - Enabling and disabling (§4, §5): `<enable/>`/`<disable/>` iq sets in
//!   `urn:xmpp:carbons:2` addressed to the user's own account (no `to`, the
//!   own bare JID or the user's server) are answered with an empty result
//!   from the bare JID; repeated requests are not errors (§9.1). The flag
//!   lives in the session's module state, so it ends with the session.
//! - Eligible messages (§6.1): no `<private/>` child, not themselves a
//!   carbon, not of type `groupchat`, `headline` or `error`, and one of:
//!   type `chat`; type `normal` with a `<body/>`; a XEP-0184 receipt,
//!   XEP-0085 chat state or XEP-0333 marker; a XEP-0249 direct invitation
//!   or a XEP-0045 mediated invitation. A message received from a full JID
//!   that carries `muc#user` (a MUC private message) is not copied on the
//!   receiving side; one sent to a MUC participant is.
//!   Not implemented: carbons of errors answering an eligible message (that
//!   needs per-message state); hence `urn:xmpp:carbons:rules:0` is not
//!   advertised (§6.2).
//! - Received carbons (§7): when an eligible message is about to be written
//!   to a session (`user_receive`), a `<received/>` copy goes to every other
//!   resource of the user that did not get the original under RFC 6121
//!   §8.5. For a message to the bare JID, the resources the router
//!   delivered to are recomputed (available, priority ≥ 0, highest
//!   priority); they are not copied, and only the first of them (by full
//!   JID) generates the copies, so equal-priority resources never produce
//!   duplicates. Messages from the user's own resources are left to the
//!   sent carbons.
//! - Sent carbons (§8): an eligible message a session sends (`user_send`,
//!   after blocking had its say) is copied as `<sent/>` to every other
//!   resource of the user, except the one it is addressed to.
//! - Copies are `<message from='user@domain' to='user@domain/res'
//!   type='(original)'>` wrapping `<received|sent><forwarded
//!   xmlns='urn:xmpp:forward:0'>` + the original message (XEP-0297). They
//!   are put straight into the other session's mailbox rather than routed:
//!   a copy for a resource that just went away must not fall back to
//!   bare-JID delivery or offline storage (and, per §9.3, never bounces to
//!   the original sender). The recipient session's `user_receive` drops
//!   copies if it has not enabled carbons.
//! - Security (§11): a message carrying a `<received/>` or `<sent/>` carbon
//!   is delivered only if it comes from the recipient's own bare JID, i.e.
//!   from this server; forged carbons from anyone else are dropped. An
//!   `offline_message` handler discards carbons that would be stored.
//! - `<private/>` (§8) is not stripped: the current XEP lifted that
//!   requirement (interoperability note in §8).
//! - Disco: feature `urn:xmpp:carbons:2` (server, §3).
//!
//! Hooks: `user_send` (50), `user_receive` (20), `offline_message` (10).
//! Storage: none. Config: `[modules.carbons]` enabled.

use starling_core::hooks::{
    ElementHandler, ElementStage, HookRegistry, IqScope, OfflineCompanions, OfflineMessageHandler,
    UserReceiveHandler, UserSendHandler,
};
use starling_core::module::{EnabledConfig, Module, ModuleCtx};
use starling_core::{async_trait, Env, Flow, HookResult, SessionCtx, SessionEntry};
use starling_proto::{ns, BareJid, FullJid, Jid, Stanza, StanzaErrorCondition, StanzaKind};
use starling_xml::Element;
use std::sync::Arc;

const NAME: &str = "carbons";
const NS_CHATSTATES: &str = "http://jabber.org/protocol/chatstates";
const NS_CONFERENCE: &str = "jabber:x:conference";
const NS_MUC_USER: &str = "http://jabber.org/protocol/muc#user";

/// The carbons module.
pub struct Carbons;

/// Per-session state: this session enabled carbons.
struct Enabled;

impl Carbons {
    /// Registers the module.
    pub fn register(reg: &mut HookRegistry) {
        let m = Arc::new(Carbons);
        reg.disco().feature(IqScope::Server, ns::CARBONS);
        // XEP-0386 §3.2: <enable/> inside a Bind 2 request ("MUST
        // succeed, no response is necessary").
        reg.element(NAME, ElementStage::Bind2, ns::CARBONS, m.clone());
        reg.user_send(NAME, 50, m.clone());
        reg.user_receive(NAME, 20, m.clone());
        reg.offline_message(NAME, 10, m);
    }
}

/// True if `msg` carries a carbon (`<received/>` or `<sent/>`).
fn is_carbon(msg: &Element) -> bool {
    msg.has_child("received", ns::CARBONS) || msg.has_child("sent", ns::CARBONS)
}

/// §6.1 eligibility, common to both directions.
fn eligible(stanza: &Stanza) -> bool {
    if stanza.kind() != StanzaKind::Message {
        return false;
    }
    let el = stanza.element();
    if el.has_child("private", ns::CARBONS) || is_carbon(el) {
        return false;
    }
    match stanza.stanza_type() {
        "chat" => true,
        "normal" => {
            el.has_child("body", ns::CLIENT)
                || el.children().any(|c| {
                    matches!(
                        c.ns(),
                        ns::RECEIPTS | NS_CHATSTATES | ns::CHAT_MARKERS | NS_CONFERENCE
                    ) || (c.is("x", NS_MUC_USER) && c.has_child("invite", NS_MUC_USER))
                })
        }
        _ => false, // groupchat, headline, error (and unknown types)
    }
}

/// Builds the copy for `to`.
fn wrap(original: &Stanza, owner: &BareJid, to: &FullJid, kind: &str) -> Stanza {
    let forwarded = Element::builder("forwarded", ns::FORWARD)
        .append(original.element().clone())
        .build();
    let mut el = Element::new("message", ns::CLIENT);
    if let Some(t) = original.type_attr() {
        el.set_attr("type", t);
    }
    el.append_child(
        Element::builder(kind, ns::CARBONS)
            .append(forwarded)
            .build(),
    );
    Stanza::new(el, Some(owner.clone().into()), Some(to.clone().into()))
}

/// Sends copies to the user's resources not in `skip`, through the router.
async fn fan_out(env: &Env, original: &Stanza, owner: &BareJid, skip: &[&str], kind: &str) {
    for e in env.sessions.resources(owner) {
        if skip.contains(&e.jid().as_str()) {
            continue;
        }
        let copy = wrap(original, owner, e.jid(), kind);
        if env.router.deliver(env, &e.session, copy).await.is_err() {
            // Full or gone: a copy is best effort and never bounces (§9.3).
            tracing::debug!(to = %e.jid(), "carbon copy not delivered");
        }
    }
}

/// The resources RFC 6121 §8.5.2.1.1 delivers a chat/normal message for the
/// bare JID to (as the router computes it).
fn bare_targets(resources: &[SessionEntry]) -> Vec<&str> {
    let max = resources
        .iter()
        .filter_map(|e| e.priority.filter(|p| *p >= 0))
        .max();
    match max {
        Some(m) => resources
            .iter()
            .filter(|e| e.priority == Some(m))
            .map(|e| e.session.jid.as_str())
            .collect(),
        None => Vec::new(),
    }
}

fn own_account(to: Option<&Jid>, me: &BareJid) -> bool {
    match to {
        None => true,
        Some(t) => t.to_bare() == *me || (t.node().is_none() && t.domain() == me.domain()),
    }
}

#[async_trait]
impl ElementHandler for Carbons {
    async fn element(&self, cx: &mut SessionCtx<'_>, el: &Element) -> HookResult {
        if el.name() == "enable" {
            cx.state.insert(Enabled);
        }
        Ok(Flow::Continue)
    }
}

#[async_trait]
impl UserSendHandler for Carbons {
    async fn user_send(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        let me = cx.jid().clone();
        let owner = me.to_bare();
        if stanza.kind() == StanzaKind::Iq {
            let Some(p) = stanza.payload() else {
                return Ok(Flow::Continue);
            };
            if p.ns() != ns::CARBONS || !matches!(p.name(), "enable" | "disable") {
                return Ok(Flow::Continue);
            }
            if !own_account(stanza.to(), &owner) {
                return Ok(Flow::Continue); // someone else's: routed, answered there
            }
            if stanza.type_attr() != Some("set") {
                cx.reply_error(stanza, StanzaErrorCondition::BadRequest.into());
                return Ok(Flow::Stop);
            }
            if p.name() == "enable" {
                cx.state.insert(Enabled);
            } else {
                cx.state.remove::<Enabled>();
            }
            let mut reply = stanza.iq_result(None);
            reply.set_from(Some(owner.into()));
            reply.set_to(Some(me.into()));
            cx.send(reply.into_element());
            return Ok(Flow::Stop);
        }
        if !eligible(stanza) {
            return Ok(Flow::Continue);
        }
        // The recipient, if it is one of our own resources, gets the
        // original; nobody gets a copy of their own message.
        let to = stanza.to().map(|t| t.as_str().to_owned());
        let mut skip = vec![me.as_str()];
        if let Some(t) = to.as_deref() {
            skip.push(t);
        }
        fan_out(cx.env, stanza, &owner, &skip, "sent").await;
        Ok(Flow::Continue)
    }
}

#[async_trait]
impl UserReceiveHandler for Carbons {
    async fn user_receive(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        if stanza.kind() != StanzaKind::Message {
            return Ok(Flow::Continue);
        }
        let me = cx.jid().clone();
        let owner = me.to_bare();
        if is_carbon(stanza.element()) {
            // §11: only our own server's copies, addressed to this session,
            // and only if this session asked for them.
            let own = stanza
                .from()
                .is_some_and(|f| f.is_bare() && f.to_bare() == owner);
            let for_me = stanza.to().is_some_and(|t| t.as_str() == me.as_str());
            if !own {
                tracing::debug!(jid = %me, "dropped a forged carbon");
                return Ok(Flow::Stop);
            }
            if !for_me || cx.state.get::<Enabled>().is_none() {
                return Ok(Flow::Stop);
            }
            return Ok(Flow::Continue);
        }
        if !eligible(stanza) {
            return Ok(Flow::Continue);
        }
        let Some(from) = stanza.from() else {
            return Ok(Flow::Continue);
        };
        if from.to_bare() == owner {
            return Ok(Flow::Continue); // our own resource: sent carbons cover it
        }
        if from.resource().is_some() && stanza.element().has_child("x", NS_MUC_USER) {
            return Ok(Flow::Continue); // MUC private message (§6.1)
        }
        let resources = cx.env.sessions.resources(&owner);
        let addressed_to_me = stanza.to().is_some_and(|t| t.as_str() == me.as_str());
        let mut skip: Vec<&str> = vec![me.as_str()];
        if !addressed_to_me {
            // Delivered by the bare-JID rule: possibly to several resources.
            let targets = bare_targets(&resources);
            if targets.contains(&me.as_str()) {
                if targets.iter().min() != Some(&me.as_str()) {
                    return Ok(Flow::Continue); // another recipient copies it
                }
                skip = targets;
            }
        }
        fan_out(cx.env, stanza, &owner, &skip, "received").await;
        Ok(Flow::Continue)
    }
}

#[async_trait]
impl OfflineMessageHandler for Carbons {
    async fn offline_message(
        &self,
        _env: &Env,
        stanza: &Stanza,
        _companions: &mut OfflineCompanions,
    ) -> HookResult {
        // A copy re-routed from a closed session is not worth keeping.
        let own = match (stanza.from(), stanza.to()) {
            (Some(f), Some(t)) => f.is_bare() && f.to_bare() == t.to_bare(),
            _ => false,
        };
        if own && is_carbon(stanza.element()) {
            return Ok(Flow::Stop);
        }
        Ok(Flow::Continue)
    }
}

impl Module for Carbons {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str = "XEP-0280 message carbons";
    type Config = EnabledConfig;

    fn enabled(cfg: &EnabledConfig) -> bool {
        cfg.enabled
    }

    async fn start(_cfg: &EnabledConfig, _ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        Carbons::register(reg);
    }
}
