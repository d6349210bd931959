//! External Service Discovery (XEP-0215, `urn:xmpp:extdisco:2`): the
//! STUN and TURN servers clients need to place Jingle audio and video
//! calls, from the configuration.
//!
//! - `<services/>` (optionally of one `type`) lists every configured
//!   service (§3.1, §3.2); `<credentials/>` answers for one service (§3.3;
//!   `item-not-found` for one not configured).
//! - A service with a `secret` gets short-lived credentials per user, the
//!   scheme coturn calls `use-auth-secret` (the "TURN REST API"): username
//!   `EXPIRY:user@domain` (EXPIRY in seconds since the Unix epoch, `ttl_secs`
//!   ahead), password `base64(HMAC-SHA1(secret, username))`, `expires` in
//!   XEP-0082 form; such services are `restricted`. A service with a fixed
//!   `username`/`password` gives those. The secret never leaves the server.
//! - Only this server's own users are answered (`forbidden` otherwise).
//!
//! Hooks: iq handlers `{urn:xmpp:extdisco:2}services` and `credentials`
//! (server scope). Storage: none. Config: `[modules.extdisco]`
//! (`services`; the module runs when at least one is configured).

use hmac::{Hmac, KeyInit, Mac};
use starling_core::hooks::{HookRegistry, IqHandler, IqResponse, IqScope};
use starling_core::module::{ConfigProblem, Module, ModuleCtx};
use starling_core::{async_trait, Env};
use starling_proto::{Stanza, StanzaError, StanzaErrorCondition};
use starling_xml::Element;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const NAME: &str = "extdisco";
/// XEP-0215 namespace.
pub const NS_EXTDISCO: &str = "urn:xmpp:extdisco:2";

/// One external service.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalService {
    /// `stun`, `stuns`, `turn` or `turns` (or another registered type).
    #[serde(rename = "type")]
    pub kind: String,
    /// Host name or IP address clients connect to.
    pub host: String,
    /// Port.
    pub port: u16,
    /// `udp` or `tcp`.
    #[serde(default = "udp")]
    pub transport: String,
    /// A friendly name (optional).
    #[serde(default)]
    pub name: Option<String>,
    /// The secret shared with the TURN server (coturn's
    /// `static-auth-secret`): per-user credentials are derived from it.
    #[serde(default)]
    pub secret: Option<String>,
    /// Fixed credentials instead of a secret.
    #[serde(default)]
    pub username: Option<String>,
    /// Fixed password (with `username`).
    #[serde(default)]
    pub password: Option<String>,
    /// Lifetime of derived credentials, in seconds.
    #[serde(default = "day")]
    pub ttl_secs: u64,
}

fn udp() -> String {
    "udp".into()
}

fn day() -> u64 {
    86_400
}

/// `[modules.extdisco]`: XEP-0215.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExtdiscoConfig {
    /// The services to announce (`[[modules.extdisco.services]]`).
    pub services: Vec<ExternalService>,
}

/// The module.
pub struct Extdisco {
    services: Vec<ExternalService>,
}

/// The credentials of `svc` for `user` at `now`: (username, password,
/// expires), if it has any.
fn credentials(
    svc: &ExternalService,
    user: &str,
    now: SystemTime,
) -> Option<(String, String, Option<String>)> {
    if let Some(secret) = &svc.secret {
        let expiry = now + Duration::from_secs(svc.ttl_secs);
        let secs = expiry
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let username = format!("{secs}:{user}");
        let mut mac = <Hmac<sha1::Sha1> as KeyInit>::new_from_slice(secret.as_bytes())
            .expect("HMAC takes any key");
        mac.update(username.as_bytes());
        use base64::Engine;
        let password =
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        let stamp = starling_proto::datetime::xep0082_datetime(u128::from(secs) * 1000);
        return Some((username, password, Some(stamp)));
    }
    match (&svc.username, &svc.password) {
        (Some(u), Some(p)) => Some((u.clone(), p.clone(), None)),
        _ => None,
    }
}

fn service_el(svc: &ExternalService, user: &str, now: SystemTime) -> Element {
    let mut el = Element::builder("service", NS_EXTDISCO)
        .attr("type", svc.kind.as_str())
        .attr("host", svc.host.as_str())
        .attr("port", svc.port.to_string())
        .attr("transport", svc.transport.as_str())
        .build();
    if let Some(n) = &svc.name {
        el.set_attr("name", n.as_str());
    }
    if let Some((u, p, expires)) = credentials(svc, user, now) {
        el.set_attr("username", u);
        el.set_attr("password", p);
        if let Some(e) = expires {
            el.set_attr("expires", e);
            el.set_attr("restricted", "1");
        }
    }
    el
}

#[async_trait]
impl IqHandler for Extdisco {
    async fn handle_iq(&self, env: &Env, _scope: IqScope, iq: &Stanza) -> IqResponse {
        let Some(from) = iq
            .from()
            .filter(|f| f.node().is_some() && env.hosts.is_local(f.domain().as_str()))
        else {
            return IqResponse::Error(
                StanzaError::new(StanzaErrorCondition::Forbidden)
                    .with_text("external services are for this server's users"),
            );
        };
        if iq.type_attr() != Some("get") {
            return IqResponse::Error(StanzaErrorCondition::BadRequest.into());
        }
        let Some(q) = iq.payload() else {
            return IqResponse::Error(StanzaErrorCondition::BadRequest.into());
        };
        let user = from.to_bare().as_str().to_owned();
        let now = SystemTime::now();
        match q.name() {
            "services" => {
                let mut out = Element::new("services", NS_EXTDISCO);
                let kind = q.attr("type");
                if let Some(k) = kind {
                    out.set_attr("type", k);
                }
                for svc in self
                    .services
                    .iter()
                    .filter(|s| kind.is_none_or(|k| k == s.kind))
                {
                    out.append_child(service_el(svc, &user, now));
                }
                IqResponse::Result(Some(out))
            }
            "credentials" => {
                let Some(want) = q.get_child("service", NS_EXTDISCO) else {
                    return IqResponse::Error(
                        StanzaError::new(StanzaErrorCondition::BadRequest)
                            .with_text("name the service"),
                    );
                };
                let (Some(host), Some(kind)) = (want.attr("host"), want.attr("type")) else {
                    return IqResponse::Error(
                        StanzaError::new(StanzaErrorCondition::BadRequest)
                            .with_text("the service needs a host and a type"),
                    );
                };
                let port = want.attr("port").and_then(|p| p.parse::<u16>().ok());
                let found: Vec<&ExternalService> = self
                    .services
                    .iter()
                    .filter(|s| {
                        s.host == host && s.kind == kind && port.is_none_or(|p| p == s.port)
                    })
                    .collect();
                if found.is_empty() {
                    return IqResponse::Error(
                        StanzaError::new(StanzaErrorCondition::ItemNotFound)
                            .with_text("no such service here"),
                    );
                }
                let mut out = Element::new("credentials", NS_EXTDISCO);
                for svc in found {
                    out.append_child(service_el(svc, &user, now));
                }
                IqResponse::Result(Some(out))
            }
            _ => IqResponse::Error(StanzaErrorCondition::BadRequest.into()),
        }
    }
}

impl Module for Extdisco {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str =
        "XEP-0215 external services: STUN/TURN with time-limited TURN credentials";
    type Config = ExtdiscoConfig;

    fn enabled(cfg: &ExtdiscoConfig) -> bool {
        !cfg.services.is_empty()
    }

    fn validate(cfg: &ExtdiscoConfig, _domains: &[String]) -> Result<(), ConfigProblem> {
        for s in &cfg.services {
            if s.host.trim().is_empty() || s.kind.trim().is_empty() {
                return Err(ConfigProblem::new(
                    "services",
                    "every service needs a type and a host",
                ));
            }
            if s.port == 0 {
                return Err(ConfigProblem::new(
                    "services",
                    format!("{} {}: give the port", s.kind, s.host),
                ));
            }
            if !matches!(s.transport.as_str(), "udp" | "tcp") {
                return Err(ConfigProblem::new(
                    "services",
                    format!("{} {}: transport is udp or tcp", s.kind, s.host),
                ));
            }
            if s.secret.as_deref().is_some_and(str::is_empty) {
                return Err(ConfigProblem::new(
                    "services",
                    format!("{} {}: the secret is empty", s.kind, s.host),
                ));
            }
            if s.username.is_some() != s.password.is_some() {
                return Err(ConfigProblem::new(
                    "services",
                    format!(
                        "{} {}: give both username and password, or neither",
                        s.kind, s.host
                    ),
                ));
            }
            if s.secret.is_some() && s.username.is_some() {
                return Err(ConfigProblem::new(
                    "services",
                    format!(
                        "{} {}: a secret or fixed credentials, not both",
                        s.kind, s.host
                    ),
                ));
            }
            if s.secret.is_some() && s.ttl_secs == 0 {
                return Err(ConfigProblem::new(
                    "services",
                    format!("{} {}: ttl_secs must be positive", s.kind, s.host),
                ));
            }
        }
        Ok(())
    }

    async fn start(cfg: &ExtdiscoConfig, _ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        let m = Arc::new(Extdisco {
            services: cfg.services.clone(),
        });
        reg.iq(NAME, IqScope::Server, "services", NS_EXTDISCO, m.clone());
        reg.iq(NAME, IqScope::Server, "credentials", NS_EXTDISCO, m);
        reg.disco().feature(IqScope::Server, NS_EXTDISCO);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The coturn `use-auth-secret` scheme, checked against an independent
    /// computation of HMAC-SHA1.
    #[test]
    fn turn_credentials_follow_the_shared_secret_scheme() {
        let svc = ExternalService {
            kind: "turn".into(),
            host: "turn.example.org".into(),
            port: 3478,
            transport: "udp".into(),
            name: None,
            secret: Some("north".into()),
            username: None,
            password: None,
            ttl_secs: 3600,
        };
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let (u, p, e) = credentials(&svc, "alice@example.org", now).unwrap();
        assert_eq!(u, "1700003600:alice@example.org");
        // printf '1700003600:alice@example.org' | openssl dgst -sha1 -hmac north -binary | base64
        assert_eq!(p, "d5CsUjHIsQa1lynh4CgfX3bEKI0=");
        assert_eq!(e.as_deref(), Some("2023-11-14T23:13:20.000Z"));
    }
}
