//! XEP-0352 Client State Indication: while a client says it is inactive
//! (a phone in a pocket), what it does not need at once is held back.
//!
//! Specification: XEP-0352 v1.0 (`urn:xmpp:csi:0`); sections cited are
//! that document's.
//!
//! * §5 — `<csi/>` is offered after authentication; `<inactive/>` and
//!   `<active/>` have no reply. A stream starts active.
//! * §6 (left to the server) — while inactive, availability presence
//!   (available or unavailable; subscription presence is not held) and
//!   chat-state-only messages (XEP-0085, no body) are held, keeping only
//!   the newest per sender: a contact who changes status ten times costs
//!   the phone one stanza. Anything else — a message with a body, an iq,
//!   an error, a subscription request; also the answer to the client's
//!   own iq) — is delivered at once, after
//!   everything held (in arrival order), so the client sees a consistent
//!   sequence. `<active/>` delivers what is held. At `max_held` distinct
//!   senders the buffer is delivered too, so it stays bounded.
//! * Held stanzas have not been sent: stream management does not count
//!   them until they are. A session that ends while inactive drops what it
//!   held (presence is re-announced and chat states are transient, as in
//!   ejabberd and Prosody).
//!
//! Hooks: element handler for `urn:xmpp:csi:0` (authenticated and
//! established stages), `user_receive` (last, priority 100), a stream
//! feature. Config: `[modules.csi]` ([`CsiConfig`]).

use serde::Deserialize;
use starling_core::hooks::{
    ElementHandler, ElementStage, FeatureStage, HookRegistry, StreamFeatureProvider,
    UserReceiveHandler,
};
use starling_core::module::{Module, ModuleCtx};
use starling_core::{async_trait, Action, Env, Flow, HookResult, SessionCtx, SessionInfo};
use starling_proto::{Stanza, StanzaKind};
use starling_xml::Element;
use std::sync::Arc;

const NAME: &str = "csi";
/// XEP-0352's namespace.
pub const NS_CSI: &str = "urn:xmpp:csi:0";
const NS_CHATSTATES: &str = "http://jabber.org/protocol/chatstates";

/// `[modules.csi]`: XEP-0352.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CsiConfig {
    /// Offer client state indication.
    pub enabled: bool,
    /// Distinct senders whose stanzas an inactive session holds before it
    /// delivers them all.
    pub max_held: usize,
}

impl Default for CsiConfig {
    fn default() -> Self {
        CsiConfig {
            enabled: true,
            max_held: 100,
        }
    }
}

/// What an inactive session holds: (kind and sender, stanza), oldest first.
#[derive(Default)]
struct Inactive {
    held: Vec<(Key, Element)>,
}

#[derive(PartialEq, Eq)]
struct Key {
    presence: bool,
    from: String,
}

/// The module.
pub struct Csi {
    cfg: CsiConfig,
}

impl Csi {
    /// Registers the module's hooks.
    pub fn register(cfg: &CsiConfig, reg: &mut HookRegistry) {
        let m = Arc::new(Csi { cfg: cfg.clone() });
        reg.element(NAME, ElementStage::Authenticated, NS_CSI, m.clone());
        reg.element(NAME, ElementStage::Established, NS_CSI, m.clone());
        // XEP-0386 §3.2: the session may begin inactive.
        reg.element(NAME, ElementStage::Bind2, NS_CSI, m.clone());
        // Last: what it holds has been through every other module.
        reg.user_receive(NAME, 100, m.clone());
        reg.stream_features(m);
    }
}

/// The key under which `el` may be held, or `None` if it must go now.
fn holdable(el: &Element, kind: StanzaKind) -> Option<Key> {
    let from = el.attr("from").unwrap_or("").to_owned();
    match kind {
        StanzaKind::Presence => {
            matches!(el.attr("type"), None | Some("unavailable")).then_some(Key {
                presence: true,
                from,
            })
        }
        StanzaKind::Message => {
            let chat_state_only = el.children().any(|c| c.ns() == NS_CHATSTATES)
                && el.children().all(|c| {
                    c.ns() == NS_CHATSTATES
                        || c.name() == "thread"
                        || c.is("stanza-id", "urn:xmpp:sid:0")
                        || c.name() == "no-store" && c.ns() == "urn:xmpp:hints"
                });
            let error = el.attr("type") == Some("error");
            (chat_state_only && !error).then_some(Key {
                presence: false,
                from,
            })
        }
        _ => None,
    }
}

/// Queues everything held for writing, oldest first.
fn release(cx: &mut SessionCtx<'_>) {
    if let Some(st) = cx.state.get_mut::<Inactive>() {
        let held = std::mem::take(&mut st.held);
        for (_, el) in held {
            cx.push(Action::Send(el));
        }
    }
}

#[async_trait]
impl ElementHandler for Csi {
    async fn element(&self, cx: &mut SessionCtx<'_>, el: &Element) -> HookResult {
        match el.name() {
            "inactive" if cx.state.get::<Inactive>().is_none() => {
                cx.state.insert(Inactive::default());
            }
            "active" => {
                release(cx);
                cx.state.remove::<Inactive>();
            }
            // §5 defines only these two; others are ignored, as no reply
            // is ever sent.
            _ => {}
        }
        Ok(Flow::Continue)
    }
}

#[async_trait]
impl UserReceiveHandler for Csi {
    async fn user_receive(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        if cx.state.get::<Inactive>().is_none() {
            return Ok(Flow::Continue);
        }
        let Some(key) = holdable(stanza.element(), stanza.kind()) else {
            // Important: everything held goes first, then this.
            release(cx);
            return Ok(Flow::Continue);
        };
        let max = self.cfg.max_held;
        let st = cx.state.get_mut::<Inactive>().expect("checked above");
        st.held.retain(|(k, _)| *k != key);
        st.held.push((key, stanza.element().clone()));
        if st.held.len() >= max {
            release(cx);
        }
        Ok(Flow::Stop)
    }
}

impl StreamFeatureProvider for Csi {
    fn stream_features(
        &self,
        _env: &Env,
        _info: &SessionInfo,
        stage: FeatureStage,
        out: &mut Vec<Element>,
    ) {
        if stage == FeatureStage::PostAuth {
            out.push(Element::new("csi", NS_CSI));
        }
    }
}

impl Module for Csi {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str = "XEP-0352 client state indication";
    type Config = CsiConfig;

    fn enabled(cfg: &CsiConfig) -> bool {
        cfg.enabled
    }

    async fn start(cfg: &CsiConfig, _ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        Csi::register(cfg, reg);
    }
}
