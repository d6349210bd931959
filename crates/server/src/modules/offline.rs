//! Offline message storage and delivery (XEP-0160, RFC 6121 §8.5.2.1.1).
//!
//! - Storing: a chat or normal message for an existing account with no
//!   available resource (the router's `offline_message` hook) is stored with
//!   a XEP-0203 `<delay from='{domain}' stamp='…'>Offline Storage</delay>`
//!   child, and the write is committed before the router is told it was
//!   stored, so a message the sender got no error for survives a crash.
//!   The rows earlier handlers put in the hook's `OfflineCompanions` (the
//!   archive's copy for the recipient) are committed in the same
//!   transaction, or not at all when the message is refused.
//!   Not stored (XEP-0160 §3, XEP-0334, XEP-0085 §5.5):
//!   - messages with a `<no-store/>` hint: the sender gets
//!     `<service-unavailable/>` with a text saying so (RFC 6121
//!     §8.5.2.1.1: not stored → error);
//!   - standalone chat-state notifications and messages with nothing to
//!     deliver (only chat states, hints, `<thread/>`): silently discarded —
//!     they are transient and "SHOULD NOT be stored offline" (XEP-0085 §5.5,
//!     XEP-0160 §3); a `<store/>` hint overrides this (XEP-0334).
//!   - `<no-permanent-store/>` does *not* prevent offline storage: XEP-0334
//!     §3 (sensitive messages) says such a message may be "stored
//!     temporarily as a normal part of delivery (e.g. if the recipient is
//!     offline)", which is what this queue is; archives must honour it.
//!   - Headline, groupchat and error messages never reach the hook (the
//!     router drops or bounces them, XEP-0160 §3).
//!
//!   When the user's queue holds `max_messages_per_user` messages, the
//!   sender gets `<service-unavailable/>` with a text saying the recipient's
//!   offline storage is full; a storage failure gets
//!   `<internal-server-error type='wait'/>`. Either way the error is routed
//!   here and the hook returns `Stop`, so the router does not bounce twice.
//! - Delivery: "when the recipient next sends available presence" (XEP-0160
//!   §4): broadcast available presence with priority ≥ 0 from a session
//!   that was not yet available with priority ≥ 0. The `user_send` handler
//!   (35, before the presence module consumes the stanza at 40) only sets a
//!   zero-delay timer; the timer runs after the presence module's actions
//!   were applied, so the presence echo comes first and the session is
//!   already in the session table as available (new messages are delivered
//!   directly from then on). A router that looked the session table up
//!   before that and is still committing the message to the queue looks
//!   again after the commit and asks every available resource (through
//!   [`Router::notify`](starling_core::Router::notify)) to read the queue
//!   again, so no message stays stored while its owner is online. The
//!   timer reads
//!   the queue oldest first, writes the messages to this session only, and
//!   sets a second zero-delay timer that deletes them (up to the last id
//!   read) — it fires only after the session's write buffer was flushed to
//!   the socket, so a session that dies first leaves them stored for the
//!   next login (at least once; two resources becoming available at the
//!   same instant may both get them). Exactly-once delivery needs XEP-0198
//!   acknowledgements. A live message routed after the availability was
//!   recorded waits in the session's mailbox: the session runs a due
//!   timer before its next delivery, so the stored messages are written
//!   first. One stored while the queue was being read comes with a
//!   notification queued ahead of any later live message (the router
//!   stores, then notifies, then routes the next), so it is read again
//!   before those are written.
//! - Disco: feature `msgoffline` (server).
//!
//! Hooks: `offline_message` (50), `user_send` (35), timer. Storage:
//! offline. Config: `[modules.offline]` enabled, max_messages_per_user.

use starling_core::hooks::{
    HookRegistry, IqScope, OfflineCompanions, OfflineMessageHandler, TimerHandler, TimerKey,
    UserSendHandler,
};
use starling_core::module::{Module, ModuleCtx};
use starling_core::storage::OfflineStoreError;
use starling_core::{async_trait, Action, Env, Flow, HookResult, SessionCtx};
use starling_proto::datetime::xep0082_datetime;
use starling_proto::{ns, ErrorType, Stanza, StanzaError, StanzaErrorCondition, StanzaKind};
use starling_xml::Element;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `[modules.offline]`: offline message storage (XEP-0160).
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OfflineConfig {
    /// Run the module (without it, messages to offline users bounce with
    /// `<service-unavailable/>`).
    pub enabled: bool,
    /// Most messages stored per user; beyond it senders get
    /// `<service-unavailable/>`.
    pub max_messages_per_user: u32,
}

impl Default for OfflineConfig {
    fn default() -> Self {
        OfflineConfig {
            enabled: true,
            max_messages_per_user: 1000,
        }
    }
}

const NAME: &str = "offline";
/// The XEP-0160 disco feature.
pub const FEATURE: &str = "msgoffline";
/// XEP-0085 namespace.
pub const NS_CHATSTATES: &str = "http://jabber.org/protocol/chatstates";

const DELIVER: u64 = 1;
const DELETE: u64 = 2;

/// The offline-message module.
pub struct Offline {
    max_per_user: u32,
}

/// Per-session state: the last id written to the session, deleted by the
/// `DELETE` timer once the write buffer was flushed.
struct Delivered(i64);

/// What to do with a message for an offline user.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Store,
    /// `<no-store/>` hint: not stored, the sender gets an error.
    Refuse,
    /// Nothing worth keeping (chat states only): dropped silently.
    Discard,
}

fn decide(el: &Element) -> Decision {
    if el.has_child("no-store", ns::HINTS) {
        return Decision::Refuse;
    }
    if el.has_child("store", ns::HINTS) {
        return Decision::Store;
    }
    let worth = el
        .children()
        .any(|c| !(c.ns() == NS_CHATSTATES || c.ns() == ns::HINTS || c.is("thread", ns::CLIENT)));
    if worth {
        Decision::Store
    } else {
        Decision::Discard
    }
}

fn now_millis() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

fn key(token: u64) -> TimerKey {
    TimerKey {
        module: NAME,
        token,
    }
}

impl Offline {
    /// Registers the module.
    pub fn register(cfg: &OfflineConfig, reg: &mut HookRegistry) {
        let m = Arc::new(Offline {
            max_per_user: cfg.max_messages_per_user,
        });
        reg.offline_message(NAME, 50, m.clone());
        reg.user_send(NAME, 35, m.clone());
        reg.timer(NAME, m);
        reg.disco().feature(IqScope::Server, FEATURE);
    }

    async fn bounce(env: &Env, stanza: &Stanza, err: StanzaError) {
        if let Some(reply) = stanza.error_reply(err) {
            if reply.to().is_some() {
                env.route(reply).await;
            }
        }
    }
}

#[async_trait]
impl OfflineMessageHandler for Offline {
    async fn offline_message(
        &self,
        env: &Env,
        stanza: &Stanza,
        companions: &mut OfflineCompanions,
    ) -> HookResult {
        if !matches!(stanza.stanza_type(), "" | "normal" | "chat") {
            return Ok(Flow::Continue);
        }
        let Some(to) = stanza.to() else {
            return Ok(Flow::Continue);
        };
        let owner = to.to_bare();
        match decide(stanza.element()) {
            Decision::Store => {}
            Decision::Discard => return Ok(Flow::Stop),
            Decision::Refuse => {
                let err = StanzaError::new(StanzaErrorCondition::ServiceUnavailable).with_text(
                    "the recipient is offline and the message asked not to be stored (no-store hint)",
                );
                Self::bounce(env, stanza, err).await;
                return Ok(Flow::Stop);
            }
        }
        let now = now_millis();
        let mut el = stanza.element().clone();
        // A stanza handed back by stream management already carries our
        // delay, stamped when its delivery first failed (XEP-0198 §4).
        let stamped = el
            .children()
            .any(|c| c.is("delay", ns::DELAY) && c.attr("from") == Some(owner.domain().as_str()));
        if !stamped {
            el.append_child(
                Element::builder("delay", ns::DELAY)
                    .attr("from", owner.domain().as_str())
                    .attr("stamp", xep0082_datetime(now))
                    .text("Offline Storage")
                    .build(),
            );
        }
        let xml = el.to_string_in("");
        let from = stanza.from().map(|f| f.to_string()).unwrap_or_default();
        let stamp = i64::try_from(now).unwrap_or(i64::MAX);
        match env
            .storage
            .offline
            .store(
                &owner,
                &from,
                &xml,
                stamp,
                self.max_per_user,
                &companions.archive,
            )
            .await
        {
            Ok(()) => {
                tracing::debug!(module = NAME, to = %owner, "message stored offline");
                // The router found no available resource, but one may have
                // become available (and read the queue) while this write
                // was committing: ask it to read the queue again (module
                // doc, "Delivery").
                for e in env.sessions.resources(&owner) {
                    if e.priority.is_some_and(|p| p >= 0) {
                        let _ = env.router.notify(env, &e.session, key(DELIVER)).await;
                    }
                }
            }
            Err(OfflineStoreError::QuotaExceeded { max }) => {
                // A sender can cause this at will: the log line is
                // throttled, the metric counts every bounce.
                env.metrics.limit_refused("offline.max_messages_per_user");
                starling_core::log_throttled!(info, module = NAME, to = %owner, max, "offline storage full; bouncing");
                let err = StanzaError::new(StanzaErrorCondition::ServiceUnavailable)
                    .with_text("the recipient is offline and its offline storage is full");
                Self::bounce(env, stanza, err).await;
            }
            Err(OfflineStoreError::Storage(e)) => {
                tracing::error!(module = NAME, to = %owner, error = %e, "storing an offline message failed");
                let err = StanzaError::new(StanzaErrorCondition::InternalServerError)
                    .with_type(ErrorType::Wait);
                Self::bounce(env, stanza, err).await;
            }
        }
        Ok(Flow::Stop)
    }
}

#[async_trait]
impl UserSendHandler for Offline {
    async fn user_send(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        if stanza.kind() != StanzaKind::Presence
            || stanza.type_attr().is_some()
            || stanza.to().is_some()
        {
            return Ok(Flow::Continue);
        }
        let was_deliverable = matches!(cx.info.priority, Some(p) if p >= 0);
        if !was_deliverable && stanza.priority() >= 0 {
            // After the presence module's actions (echo, availability).
            cx.push(Action::SetTimer(key(DELIVER), Duration::ZERO));
        }
        Ok(Flow::Continue)
    }
}

#[async_trait]
impl TimerHandler for Offline {
    async fn timer(&self, cx: &mut SessionCtx<'_>, token: u64) -> HookResult {
        let owner = cx.jid().to_bare();
        match token {
            DELIVER => {
                // Messages written to this session but not yet deleted
                // (their deletion awaits the flush) are not written again.
                let written = cx.state.get::<Delivered>().map_or(i64::MIN, |d| d.0);
                let mut messages = cx.env.storage.offline.fetch_all(&owner).await?;
                messages.retain(|m| m.id > written);
                let Some(last) = messages.last().map(|m| m.id) else {
                    return Ok(Flow::Continue);
                };
                let n = messages.len();
                for m in messages {
                    match m.stanza.parse::<Element>() {
                        Ok(el) => cx.send(el),
                        Err(e) => {
                            tracing::error!(module = NAME, user = %owner, id = m.id, error = %e,
                                "stored offline message does not parse; dropped");
                        }
                    }
                }
                tracing::debug!(module = NAME, user = %owner, count = n, "offline messages delivered");
                cx.state.insert(Delivered(last));
                cx.push(Action::SetTimer(key(DELETE), Duration::ZERO));
            }
            DELETE => {
                if let Some(Delivered(last)) = cx.state.remove::<Delivered>() {
                    cx.env.storage.offline.delete_up_to(&owner, last).await?;
                }
            }
            _ => {}
        }
        Ok(Flow::Continue)
    }
}

impl Module for Offline {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str = "XEP-0160 offline message storage";
    type Config = OfflineConfig;
    const STORAGE: &'static [&'static str] = &["offline"];

    fn enabled(cfg: &OfflineConfig) -> bool {
        cfg.enabled
    }

    async fn start(cfg: &OfflineConfig, _ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        Offline::register(cfg, reg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn el(xml: &str) -> Element {
        xml.parse().unwrap()
    }

    #[test]
    fn what_is_stored() {
        let d = |x: &str| decide(&el(x));
        assert_eq!(
            d("<message xmlns='jabber:client'><body>hi</body></message>"),
            Decision::Store
        );
        assert_eq!(
            d("<message xmlns='jabber:client'><active xmlns='http://jabber.org/protocol/chatstates'/><thread>t</thread></message>"),
            Decision::Discard
        );
        assert_eq!(d("<message xmlns='jabber:client'/>"), Decision::Discard);
        assert_eq!(
            d("<message xmlns='jabber:client'><composing xmlns='http://jabber.org/protocol/chatstates'/><store xmlns='urn:xmpp:hints'/></message>"),
            Decision::Store
        );
        assert_eq!(
            d("<message xmlns='jabber:client'><body>x</body><no-store xmlns='urn:xmpp:hints'/></message>"),
            Decision::Refuse
        );
        assert_eq!(
            d("<message xmlns='jabber:client'><body>x</body><no-permanent-store xmlns='urn:xmpp:hints'/></message>"),
            Decision::Store
        );
        // Payloads other than a body are worth keeping (receipts, encryption).
        assert_eq!(
            d("<message xmlns='jabber:client'><received xmlns='urn:xmpp:receipts' id='1'/></message>"),
            Decision::Store
        );
    }
}
