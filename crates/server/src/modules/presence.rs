//! Presence: availability and priority of the client's own session
//! (RFC 6121 §4.2 initial presence, §4.5 unavailable presence, §4.7.2.3
//! priority).
//!
//! This module records, in the session table, whether each resource is
//! available and with which priority, which is what routing to a bare JID
//! needs (RFC 6121 §8.5.2), and broadcasts the user's presence to all of the
//! user's own available resources, including the sender for available
//! presence (RFC 6121 §4.2.2, §4.5.2). Broadcast to subscribers, probes and
//! subscription handling arrive with the roster module.
//!
//! Hooks: `user_send` (presence without 'to'). Storage: none.
//! Config: `[modules.presence]` enabled.

use starling_core::hooks::{HookRegistry, UserSendHandler};
use starling_core::{async_trait, Action, Flow, HookResult, SessionCtx};
use starling_proto::{ns, Stanza, StanzaKind};
use std::sync::Arc;

const NAME: &str = "presence";

/// The presence module.
pub struct Presence;

impl Presence {
    /// Registers the module.
    pub fn register(reg: &mut HookRegistry) {
        reg.user_send(NAME, 40, Arc::new(Presence));
    }
}

/// The priority of an available presence: the `<priority/>` child as an
/// integer in -128..=127 (RFC 6121 §4.7.2.3), 0 when absent or invalid.
pub fn priority_of(stanza: &Stanza) -> i8 {
    stanza
        .element()
        .get_child("priority", ns::CLIENT)
        .and_then(|p| p.text().trim().parse::<i64>().ok())
        .map(|p| p.clamp(-128, 127) as i8)
        .unwrap_or(0)
}

#[async_trait]
impl UserSendHandler for Presence {
    async fn user_send(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        if stanza.kind() != StanzaKind::Presence || stanza.to().is_some() {
            return Ok(Flow::Continue);
        }
        let available = match stanza.type_attr() {
            None => true,
            Some("unavailable") => false,
            _ => return Ok(Flow::Continue),
        };
        cx.push(Action::SetPresence(available.then(|| {
            (priority_of(stanza), Arc::new(stanza.element().clone()))
        })));
        let me = cx.jid().clone();
        for other in cx.env.sessions.resources(&me.to_bare()) {
            if other.jid != me && other.priority.is_some() {
                let mut copy = stanza.clone();
                copy.set_to(Some(other.jid.into()));
                cx.route(copy);
            }
        }
        if available {
            // §4.2.2: "including the resource that generated the presence".
            let mut echo = stanza.clone();
            echo.set_to(Some(me.into()));
            cx.send(echo.into_element());
        }
        Ok(Flow::Stop)
    }
}
