//! Last Activity (XEP-0012).
//!
//! - To the server: its uptime in seconds (§5).
//! - To an account's bare JID: `seconds='0'` while the account has an
//!   available resource, otherwise the seconds since its last logout and
//!   the status text of its last unavailable presence (§4). Only the user
//!   and contacts subscribed to the user's presence (subscription from or
//!   both) may ask; others get `<forbidden/>` (§4). An account that never
//!   logged out since it was created gets `<item-not-found/>`.
//! - Logout times are recorded when a user's last available resource goes
//!   away, cleanly or not.
//!
//! Hooks: iq handler `{jabber:iq:last}query` (server and account scope),
//! `user_send` (status of unavailable presence), `session_closed`.
//! Storage: its own store (`store/`: the last-activity table), roster,
//! accounts. Config: `[modules.last]`.

use starling_core::hooks::{
    HookRegistry, IqHandler, IqResponse, IqScope, SessionClosedHandler, UserSendHandler,
};
use starling_core::module::{EnabledConfig, Module, ModuleCtx};
use starling_core::{async_trait, Env, Flow, HookResult, SessionCtx};
use starling_proto::{ns, ErrorType, Stanza, StanzaError, StanzaErrorCondition, StanzaKind};
use starling_xml::Element;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

pub mod store;

use store::LastActivityStore;

const NAME: &str = "last";
/// XEP-0012 namespace.
pub const NS_LAST: &str = "jabber:iq:last";

/// The last-activity module.
pub struct Last {
    started: Instant,
    store: Arc<dyn LastActivityStore>,
}

/// Per-session state: the status text of the session's last unavailable
/// presence.
struct LastStatus(String);

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Last {
    /// Registers the module, recording in `store`.
    pub fn register(reg: &mut HookRegistry, store: Arc<dyn LastActivityStore>) {
        let m = Arc::new(Last {
            started: Instant::now(),
            store,
        });
        reg.iq(NAME, IqScope::Server, "query", NS_LAST, m.clone());
        reg.iq(NAME, IqScope::Account, "query", NS_LAST, m.clone());
        reg.disco().feature(IqScope::Server, NS_LAST);
        reg.user_send(NAME, 30, m.clone());
        reg.session_closed(NAME, 50, m);
    }

    fn answer(seconds: u64, status: &str) -> IqResponse {
        let mut q = Element::builder("query", NS_LAST)
            .attr("seconds", seconds.to_string())
            .build();
        if !status.is_empty() {
            q.append_text(status);
        }
        IqResponse::Result(Some(q))
    }
}

#[async_trait]
impl IqHandler for Last {
    async fn handle_iq(&self, env: &Env, scope: IqScope, iq: &Stanza) -> IqResponse {
        if iq.type_attr() != Some("get") {
            return IqResponse::Error(StanzaErrorCondition::BadRequest.into());
        }
        if scope == IqScope::Server {
            return Self::answer(self.started.elapsed().as_secs(), "");
        }
        let Some(from) = iq.from().map(|f| f.to_bare()) else {
            return IqResponse::Error(StanzaErrorCondition::BadRequest.into());
        };
        let owner = iq.to().map(|t| t.to_bare()).unwrap_or_else(|| from.clone());
        let internal = |e: starling_core::storage::StorageError| {
            tracing::error!(error = %e, "last activity lookup failed");
            IqResponse::Error(
                StanzaError::new(StanzaErrorCondition::InternalServerError)
                    .with_type(ErrorType::Wait),
            )
        };
        if owner != from {
            match env.storage.accounts.exists(&owner).await {
                Ok(true) => {}
                Ok(false) => {
                    return IqResponse::Error(StanzaErrorCondition::ServiceUnavailable.into())
                }
                Err(e) => return internal(e),
            }
            match env.storage.roster.get_item(&owner, &from).await {
                Ok(Some(item)) if item.subscription.has_from() => {}
                Ok(_) => return IqResponse::Error(StanzaErrorCondition::Forbidden.into()),
                Err(e) => return internal(e),
            }
        }
        if env
            .sessions
            .resources(&owner)
            .iter()
            .any(|e| e.priority.is_some())
        {
            return Self::answer(0, "");
        }
        match self.store.get(&owner).await {
            Ok(Some((at, status))) => Self::answer(now_unix().saturating_sub(at), &status),
            Ok(None) => IqResponse::Error(StanzaErrorCondition::ItemNotFound.into()),
            Err(e) => internal(e),
        }
    }
}

#[async_trait]
impl UserSendHandler for Last {
    async fn user_send(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        if stanza.kind() == StanzaKind::Presence
            && stanza.to().is_none()
            && stanza.type_attr() == Some("unavailable")
        {
            let status = stanza
                .element()
                .get_child("status", ns::CLIENT)
                .map(|s| s.text())
                .unwrap_or_default();
            cx.state.insert(LastStatus(status));
        }
        Ok(Flow::Continue)
    }
}

#[async_trait]
impl SessionClosedHandler for Last {
    async fn session_closed(&self, cx: &mut SessionCtx<'_>) -> HookResult {
        let owner = cx.jid().to_bare();
        // The closing session is already out of the table.
        if cx
            .env
            .sessions
            .resources(&owner)
            .iter()
            .any(|e| e.priority.is_some())
        {
            return Ok(Flow::Continue);
        }
        let status = cx
            .state
            .remove::<LastStatus>()
            .map(|s| s.0)
            .unwrap_or_default();
        self.store.set(&owner, now_unix(), &status).await?;
        Ok(Flow::Continue)
    }
}

impl Module for Last {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str = "XEP-0012 last activity";
    type Config = EnabledConfig;
    const STORAGE: &'static [&'static str] = &["last_activity", "roster", "accounts"];
    const SCHEMA: &'static [starling_core::storage::SchemaStep] = store::SCHEMA;
    const STORE_SUITES: &'static [starling_core::storage::StoreSuite] = store::conformance::SUITES;

    fn owned_data(
        storage: &starling_core::storage::Storage,
    ) -> Option<Arc<dyn starling_core::storage::OwnedData>> {
        Some(Arc::new(store::LastData::new(storage)))
    }

    fn enabled(cfg: &EnabledConfig) -> bool {
        cfg.enabled
    }

    async fn start(_cfg: &EnabledConfig, ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        Last::register(reg, store::open_timed(ctx.storage, ctx.metrics));
    }
}
