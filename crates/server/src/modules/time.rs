//! Entity Time (XEP-0202) of the server.
//!
//! Answers `<time xmlns='urn:xmpp:time'/>` gets addressed to the server with
//! the current UTC time (XEP-0082 format, millisecond precision) and the
//! zone offset `Z`-equivalent `+00:00`: the server reports UTC whatever
//! zone its host is set to.
//!
//! Hooks: iq handler `{urn:xmpp:time}time` (server scope).
//! Config: `[modules.time]`.

use starling_core::hooks::{HookRegistry, IqHandler, IqResponse, IqScope};
use starling_core::module::{EnabledConfig, Module, ModuleCtx};
use starling_core::{async_trait, Env};
use starling_proto::datetime::xep0082_datetime;
use starling_proto::{Stanza, StanzaErrorCondition};
use starling_xml::Element;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

const NAME: &str = "time";
/// XEP-0202 namespace.
pub const NS_TIME: &str = "urn:xmpp:time";

/// The entity time module.
pub struct Time;

impl Time {
    /// Registers the module.
    pub fn register(reg: &mut HookRegistry) {
        reg.iq(NAME, IqScope::Server, "time", NS_TIME, Arc::new(Time));
        reg.disco().feature(IqScope::Server, NS_TIME);
    }
}

#[async_trait]
impl IqHandler for Time {
    async fn handle_iq(&self, _env: &Env, _scope: IqScope, iq: &Stanza) -> IqResponse {
        if iq.type_attr() != Some("get") {
            return IqResponse::Error(StanzaErrorCondition::BadRequest.into());
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let mut t = Element::new("time", NS_TIME);
        t.append_child(Element::builder("tzo", NS_TIME).text("+00:00").build());
        t.append_child(
            Element::builder("utc", NS_TIME)
                .text(xep0082_datetime(now))
                .build(),
        );
        IqResponse::Result(Some(t))
    }
}

impl Module for Time {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str = "XEP-0202 entity time";
    type Config = EnabledConfig;

    fn enabled(cfg: &EnabledConfig) -> bool {
        cfg.enabled
    }

    async fn start(_cfg: &EnabledConfig, _ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        Time::register(reg);
    }
}
