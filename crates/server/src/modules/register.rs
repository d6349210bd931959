//! In-Band Registration (XEP-0077).
//!
//! - Unauthenticated clients create accounts (§3.1) when
//!   `[modules.register] enabled = true`, limited to `max_per_ip`
//!   registrations per IP address per `window_secs`; the stream feature
//!   `<register xmlns='http://jabber.org/features/iq-register'/>` is
//!   advertised then (§4). A domain added at run time may override
//!   `enabled` with its `registration` setting (docs/domains.md), either
//!   way: the handler is always registered and asks the domain.
//! - Logged-in users change their password (§3.3) and delete their account
//!   (§3.2) when `allow_password_change` / `allow_cancel` are on; deleting
//!   closes every session of the account with `<not-authorized/>`. The
//!   request may carry no `to`, the user's own bare JID, or the user's own
//!   domain (§3.3's example; Smack sends removals that way); the account
//!   acted on is always the sender's. Another account's JID or another
//!   domain gets `<forbidden/>`.
//!
//! Passwords become salted SCRAM keys on the blocking pool. Registration
//! uses the plain `username`/`password` fields (§3.1); data forms (§6) are
//! not offered.
//!
//! Hooks: `pre_auth`, stream features (pre-auth), iq handler
//! `{jabber:iq:register}query` in account and server scope.
//! Storage: accounts. Config: `[modules.register]`.

use crate::accounts::{self, AccountError};
use crate::limiter::IpLimiter;
use starling_core::hooks::{
    FeatureStage, HookRegistry, IqHandler, IqResponse, IqScope, PreAuthHandler,
    StreamFeatureProvider,
};
use starling_core::module::{Module, ModuleCtx};
use starling_core::{async_trait, CloseReason, Env, Flow, HookResult, SessionCtx, SessionInfo};
use starling_proto::{
    ns, BareJid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind, StreamError,
    StreamErrorCondition,
};
use starling_xml::Element;
use std::sync::Arc;
use std::time::Duration;

/// `[modules.register]`: XEP-0077.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegisterConfig {
    /// Allow anyone who can connect to create an account (off by default).
    pub enabled: bool,
    /// Accounts one IP address may create within `window_secs`.
    pub max_per_ip: u32,
    /// The registration rate-limit window, in seconds.
    pub window_secs: u64,
    /// Let logged-in users change their password in-band.
    pub allow_password_change: bool,
    /// Let logged-in users delete their account in-band.
    pub allow_cancel: bool,
    /// Shortest password accepted.
    pub min_password_length: usize,
}

impl Default for RegisterConfig {
    fn default() -> Self {
        RegisterConfig {
            enabled: false,
            max_per_ip: 5,
            window_secs: 600,
            allow_password_change: true,
            allow_cancel: true,
            min_password_length: 4,
        }
    }
}

const NAME: &str = "register";

/// The registration module.
pub struct Register {
    cfg: RegisterConfig,
    iterations: u32,
    limiter: IpLimiter,
}

impl Register {
    /// Registers the module's handlers for what the configuration enables.
    pub fn register(cfg: &RegisterConfig, scram_iterations: u32, reg: &mut HookRegistry) {
        let m = Arc::new(Register {
            cfg: cfg.clone(),
            iterations: scram_iterations,
            limiter: IpLimiter::new(cfg.max_per_ip, Duration::from_secs(cfg.window_secs)),
        });
        // Always: a domain's `registration` setting may turn it on where
        // `enabled` is off ([`Register::open`] decides per stream).
        reg.pre_auth(NAME, 50, m.clone());
        reg.stream_features(m.clone());
        if cfg.enabled || cfg.allow_password_change || cfg.allow_cancel {
            reg.iq(NAME, IqScope::Account, "query", ns::REGISTER, m.clone());
            reg.iq(NAME, IqScope::Server, "query", ns::REGISTER, m);
            reg.disco().feature(IqScope::Server, ns::REGISTER);
        }
    }

    /// True if unauthenticated clients may register on `domain`: its
    /// `registration` setting, else `[modules.register] enabled`.
    fn open(&self, env: &Env, domain: &str) -> bool {
        env.hosts
            .get(domain)
            .and_then(|h| h.settings.registration)
            .unwrap_or(self.cfg.enabled)
    }

    fn form(&self, registered: Option<&str>) -> Element {
        let mut q = Element::new("query", ns::REGISTER);
        match registered {
            Some(user) => {
                q.append_child(Element::new("registered", ns::REGISTER));
                q.append_child(
                    Element::builder("username", ns::REGISTER)
                        .text(user)
                        .build(),
                );
                q.append_child(Element::new("password", ns::REGISTER));
            }
            None => {
                q.append_child(
                    Element::builder("instructions", ns::REGISTER)
                        .text("Choose a username and password to register with this server.")
                        .build(),
                );
                q.append_child(Element::new("username", ns::REGISTER));
                q.append_child(Element::new("password", ns::REGISTER));
            }
        }
        q
    }

    fn fields(query: &Element) -> (Option<String>, Option<String>) {
        let get = |n: &str| {
            query
                .get_child(n, ns::REGISTER)
                .map(|e| e.text())
                .filter(|s| !s.is_empty())
        };
        (get("username"), get("password"))
    }

    fn check_password(&self, password: &str) -> Result<(), StanzaError> {
        if password.chars().count() < self.cfg.min_password_length {
            return Err(
                StanzaError::new(StanzaErrorCondition::NotAcceptable).with_text(format!(
                    "the password must have at least {} characters",
                    self.cfg.min_password_length
                )),
            );
        }
        Ok(())
    }

    async fn create(
        &self,
        info: &SessionInfo,
        env: &Env,
        query: &Element,
    ) -> Result<(), StanzaError> {
        let (Some(username), Some(password)) = Self::fields(query) else {
            // §3.1: required information missing.
            return Err(StanzaError::new(StanzaErrorCondition::NotAcceptable)
                .with_text("username and password are required"));
        };
        let jid = BareJid::new(&format!("{}@{}", username.trim(), info.domain))
            .ok()
            .filter(|j| j.node().is_some())
            .ok_or_else(|| {
                StanzaError::new(StanzaErrorCondition::JidMalformed)
                    .with_text("the username is not a valid JID localpart")
            })?;
        self.check_password(&password)?;
        let ip = info.peer.ip();
        if self.limiter.is_limited(ip) {
            return Err(StanzaError::new(StanzaErrorCondition::ResourceConstraint)
                .with_text("too many registrations from your address; try again later"));
        }
        match accounts::create(&env.storage, &jid, &password, self.iterations).await {
            Ok(()) => {
                self.limiter.record(ip);
                tracing::info!(user = %jid, peer = %info.peer, "account registered in-band");
                Ok(())
            }
            Err(AccountError::Exists(_)) => Err(StanzaError::new(StanzaErrorCondition::Conflict)
                .with_text("this username is taken")),
            Err(AccountError::BadPassword) => {
                Err(StanzaError::new(StanzaErrorCondition::NotAcceptable)
                    .with_text("the password contains prohibited characters"))
            }
            Err(AccountError::Unstable(..)) => {
                Err(StanzaError::new(StanzaErrorCondition::NotAcceptable)
                    .with_text("this username has no single normal form; choose another"))
            }
            Err(e) => {
                tracing::error!(error = %e, "registration failed");
                Err(StanzaError::new(StanzaErrorCondition::InternalServerError))
            }
        }
    }
}

impl StreamFeatureProvider for Register {
    fn stream_features(
        &self,
        env: &Env,
        info: &SessionInfo,
        stage: FeatureStage,
        out: &mut Vec<Element>,
    ) {
        if stage == FeatureStage::PreAuth && self.open(env, &info.domain) {
            out.push(Element::new("register", ns::REGISTER_FEATURE));
        }
    }
}

fn reply_to(stanza: &Stanza, result: Result<Option<Element>, StanzaError>) -> Option<Element> {
    let reply = match result {
        Ok(payload) => stanza.iq_result(payload),
        Err(e) => stanza.error_reply(e)?,
    };
    let mut el = reply.into_element();
    // The client has no address yet: no 'to' (RFC 6120 §8.1.1.1).
    el.remove_attr("to");
    el.remove_attr("from");
    Some(el)
}

#[async_trait]
impl PreAuthHandler for Register {
    async fn pre_auth(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult {
        if stanza.kind() != StanzaKind::Iq || !self.open(cx.env, &cx.info.domain) {
            return Ok(Flow::Continue);
        }
        let Some(query) = stanza.payload().filter(|q| q.is("query", ns::REGISTER)) else {
            return Ok(Flow::Continue);
        };
        let result = match stanza.type_attr() {
            Some("get") => Ok(Some(self.form(None))),
            Some("set") if query.has_child("remove", ns::REGISTER) => {
                Err(StanzaError::new(StanzaErrorCondition::NotAuthorized)
                    .with_text("log in to delete your account"))
            }
            Some("set") => self.create(cx.info, cx.env, query).await.map(|()| None),
            _ => return Ok(Flow::Continue),
        };
        if let Some(el) = reply_to(stanza, result) {
            cx.send(el);
        }
        Ok(Flow::Stop)
    }
}

#[async_trait]
impl IqHandler for Register {
    async fn handle_iq(&self, env: &Env, scope: IqScope, iq: &Stanza) -> IqResponse {
        let Some(from) = iq.from().map(|f| f.to_bare()) else {
            return IqResponse::Error(StanzaErrorCondition::BadRequest.into());
        };
        // Only the account itself manages its registration: addressed to
        // itself (or nothing) or to its own server.
        let own = match (scope, iq.to()) {
            (_, None) => true,
            (IqScope::Account, Some(t)) => t.to_bare() == from,
            (IqScope::Server, Some(t)) => t.domain() == from.domain(),
        };
        if !own {
            return IqResponse::Error(StanzaErrorCondition::Forbidden.into());
        }
        let Some(query) = iq.payload() else {
            return IqResponse::Error(StanzaErrorCondition::BadRequest.into());
        };
        let user = from.node().map(|n| n.as_str()).unwrap_or("").to_owned();
        match iq.type_attr() {
            Some("get") => IqResponse::Result(Some(self.form(Some(&user)))),
            Some("set") if query.has_child("remove", ns::REGISTER) => {
                if !self.cfg.allow_cancel {
                    return IqResponse::Error(StanzaErrorCondition::NotAllowed.into());
                }
                match env.delete_account(&from).await {
                    Ok(_) => {
                        tracing::info!(user = %from, "account deleted in-band");
                        // §3.2: answer first, then close every session.
                        env.route(iq.iq_result(None)).await;
                        let reason = CloseReason::Error(Box::new(StreamError::with_text(
                            StreamErrorCondition::NotAuthorized,
                            "this account has been deleted",
                        )));
                        env.router.close_sessions(env, &from, reason).await;
                        IqResponse::Handled
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "account deletion failed");
                        IqResponse::Error(StanzaErrorCondition::InternalServerError.into())
                    }
                }
            }
            Some("set") => {
                if !self.cfg.allow_password_change {
                    return IqResponse::Error(StanzaErrorCondition::NotAllowed.into());
                }
                let (Some(username), Some(password)) = Self::fields(query) else {
                    return IqResponse::Error(
                        StanzaError::new(StanzaErrorCondition::BadRequest)
                            .with_text("username and password are required"),
                    );
                };
                if BareJid::new(&format!("{}@{}", username.trim(), from.domain()))
                    .map_or(true, |j| j != from)
                {
                    return IqResponse::Error(
                        StanzaError::new(StanzaErrorCondition::NotAuthorized)
                            .with_text("you can only change your own password"),
                    );
                }
                if let Err(e) = self.check_password(&password) {
                    return IqResponse::Error(e);
                }
                match accounts::set_password(&env.storage, &from, &password, self.iterations).await
                {
                    Ok(()) => {
                        tracing::info!(user = %from, "password changed in-band");
                        IqResponse::Result(None)
                    }
                    Err(AccountError::BadPassword) => IqResponse::Error(
                        StanzaError::new(StanzaErrorCondition::NotAcceptable)
                            .with_text("the password contains prohibited characters"),
                    ),
                    Err(e) => {
                        tracing::error!(error = %e, "password change failed");
                        IqResponse::Error(StanzaErrorCondition::InternalServerError.into())
                    }
                }
            }
            _ => IqResponse::Error(StanzaErrorCondition::BadRequest.into()),
        }
    }
}

impl Module for Register {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str =
        "XEP-0077 in-band password change and account removal; open registration when enabled";
    type Config = RegisterConfig;
    const STORAGE: &'static [&'static str] = &["accounts"];

    fn enabled(_cfg: &RegisterConfig) -> bool {
        true
    }

    async fn start(cfg: &RegisterConfig, ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        Register::register(cfg, ctx.scram_iterations, reg);
    }
}
