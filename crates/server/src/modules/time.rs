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
use starling_core::{async_trait, Env};
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

/// XEP-0082 DateTime in UTC for milliseconds since the Unix epoch.
pub fn xep0082_datetime(unix_millis: u128) -> String {
    let secs = (unix_millis / 1000) as i64;
    let millis = unix_millis % 1000;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetime_known_instants() {
        assert_eq!(xep0082_datetime(0), "1970-01-01T00:00:00.000Z");
        // XEP-0082 §3.2 example instant.
        assert_eq!(
            xep0082_datetime(1_070_114_434_000),
            "2003-11-29T14:00:34.000Z"
        );
        assert_eq!(
            xep0082_datetime(951_782_400_123),
            "2000-02-29T00:00:00.123Z"
        );
    }
}
