//! XMPP Ping (XEP-0199).
//!
//! - Answers `urn:xmpp:ping` iqs addressed to the server (§4.2, c2s) and to
//!   an account's bare JID (answered on its behalf).
//! - Pings idle clients (§4.1, server-to-client): after `interval_secs`
//!   without any data from a client the server sends a ping; if nothing at
//!   all arrives within `timeout_secs`, the session is closed with
//!   `<connection-timeout/>`. TCP keepalive (`[c2s] tcp_keepalive_secs`)
//!   catches dead peers below XMPP.
//!
//! Hooks: iq handlers (server and account scope), `session_opened`,
//! `user_send` (consumes our pongs), timers. Storage: none.
//! Config: `[modules.ping]` enabled, interval_secs, timeout_secs.

use starling_core::disco::Scopes;
use starling_core::hooks::{
    HookRegistry, IqHandler, IqResponse, IqScope, SessionOpenedHandler, TimerHandler,
    UserSendHandler,
};
use starling_core::module::{Module, ModuleCtx};
use starling_core::{
    async_trait, Action, Env, Flow, HookResult, SessionCtx, SessionState, TimerKey,
};
use starling_proto::{ns, Stanza, StanzaKind};
use starling_xml::Element;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `[modules.ping]`: XEP-0199.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PingConfig {
    /// Answer pings and ping idle clients.
    pub enabled: bool,
    /// Seconds without any data from a client before the server pings it.
    /// 0 disables server-initiated pings (pings are still answered).
    pub interval_secs: u64,
    /// Seconds to wait for any data after a ping before the session is
    /// closed with `<connection-timeout/>`.
    pub timeout_secs: u64,
}

impl Default for PingConfig {
    fn default() -> Self {
        PingConfig {
            enabled: true,
            interval_secs: 120,
            timeout_secs: 30,
        }
    }
}

const NAME: &str = "ping";
const CHECK_IDLE: u64 = 1;
const ACK_DEADLINE: u64 = 2;

/// The ping module.
pub struct Ping {
    interval: Duration,
    timeout: Duration,
}

/// Per-session state: the outstanding server ping, if any.
struct Pending {
    id: String,
    sent_at: Instant,
}

impl Ping {
    /// Registers the module.
    pub fn register(cfg: &PingConfig, reg: &mut HookRegistry) {
        let m = Arc::new(Ping {
            interval: Duration::from_secs(cfg.interval_secs),
            timeout: Duration::from_secs(cfg.timeout_secs.max(1)),
        });
        reg.iq(NAME, IqScope::Server, "ping", ns::PING, m.clone());
        reg.iq(NAME, IqScope::Account, "ping", ns::PING, m.clone());
        reg.disco().feature(Scopes::BOTH, ns::PING);
        if cfg.interval_secs > 0 {
            reg.session_opened(NAME, 50, m.clone());
            reg.user_send(NAME, 10, m.clone());
            reg.timer(NAME, m);
        }
    }

    fn key(token: u64) -> TimerKey {
        TimerKey {
            module: NAME,
            token,
        }
    }
}

#[async_trait]
impl IqHandler for Ping {
    async fn handle_iq(&self, _env: &Env, _scope: IqScope, iq: &Stanza) -> IqResponse {
        if iq.type_attr() == Some("get") {
            IqResponse::Result(None)
        } else {
            IqResponse::Error(starling_proto::StanzaErrorCondition::BadRequest.into())
        }
    }
}

#[async_trait]
impl SessionOpenedHandler for Ping {
    async fn session_opened(&self, cx: &mut SessionCtx<'_>) -> HookResult {
        cx.push(Action::SetTimer(Self::key(CHECK_IDLE), self.interval));
        Ok(Flow::Continue)
    }
}

#[async_trait]
impl UserSendHandler for Ping {
    async fn user_send(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        if stanza.kind() != StanzaKind::Iq || stanza.is_iq_request() {
            return Ok(Flow::Continue);
        }
        let ours = cx
            .state
            .get::<Pending>()
            .is_some_and(|p| Some(p.id.as_str()) == stanza.id());
        if ours {
            cx.state.remove::<Pending>();
            cx.push(Action::CancelTimer(Self::key(ACK_DEADLINE)));
            cx.push(Action::SetTimer(Self::key(CHECK_IDLE), self.interval));
            return Ok(Flow::Stop);
        }
        Ok(Flow::Continue)
    }
}

#[async_trait]
impl TimerHandler for Ping {
    async fn timer(&self, cx: &mut SessionCtx<'_>, token: u64) -> HookResult {
        if matches!(cx.info.state, SessionState::Detached { .. }) {
            // No connection to ping (XEP-0198): check again later.
            cx.state.remove::<Pending>();
            cx.push(Action::SetTimer(Self::key(CHECK_IDLE), self.interval));
            return Ok(Flow::Continue);
        }
        let idle = cx.info.last_inbound.elapsed();
        match token {
            CHECK_IDLE => {
                if idle < self.interval {
                    cx.push(Action::SetTimer(
                        Self::key(CHECK_IDLE),
                        self.interval - idle,
                    ));
                    return Ok(Flow::Continue);
                }
                let id = format!("ping-{}", starling_proto::random_id(8));
                let mut iq = Element::new("iq", ns::CLIENT);
                iq.set_attr("type", "get");
                iq.set_attr("id", id.clone());
                iq.set_attr("from", cx.info.domain.clone());
                iq.set_attr("to", cx.jid().as_str());
                iq.append_child(Element::new("ping", ns::PING));
                cx.send(iq);
                cx.state.insert(Pending {
                    id,
                    sent_at: Instant::now(),
                });
                cx.push(Action::SetTimer(Self::key(ACK_DEADLINE), self.timeout));
            }
            ACK_DEADLINE => {
                let sent_at = cx.state.get::<Pending>().map(|p| p.sent_at);
                match sent_at {
                    Some(sent) if cx.info.last_inbound < sent => {
                        tracing::info!(jid = %cx.jid(), "no answer to ping; closing session");
                        cx.push(Action::Close(starling_proto::StreamError::with_text(
                            starling_proto::StreamErrorCondition::ConnectionTimeout,
                            "no answer to ping",
                        )));
                    }
                    _ => {
                        // Something arrived: the client is alive.
                        cx.state.remove::<Pending>();
                        cx.push(Action::SetTimer(Self::key(CHECK_IDLE), self.interval));
                    }
                }
            }
            _ => {}
        }
        Ok(Flow::Continue)
    }
}

impl Module for Ping {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str = "XEP-0199 ping: answers pings, pings idle clients";
    type Config = PingConfig;

    fn enabled(cfg: &PingConfig) -> bool {
        cfg.enabled
    }

    async fn start(cfg: &PingConfig, _ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        Ping::register(cfg, reg);
    }
}
