//! SASL negotiation (RFC 6120 §6) for the c2s session: which mechanisms to
//! offer, and the `<auth/>`, `<challenge/>`, `<response/>`, `<success/>`,
//! `<failure/>` exchange. The mechanisms themselves are sans-IO code in
//! `starling_proto::sasl`; this file adds credential lookup, limits and
//! logging.

use super::{take_sends, Exit, Session};
use crate::c2s::fast::NS_FAST;
use starling_core::hooks::{ElementStage, FeatureStage};
use starling_core::storage::{FastSlot, FastToken};
use starling_core::{Action, SessionState};
use starling_proto::sasl::ht::{self, HtMechanism};
use starling_proto::sasl::{
    decode_payload, encode_payload, parse_plain, Mechanism, SaslError, ScramHash, ScramServer,
};
use starling_proto::{ns, BareJid, StreamErrorCondition};
use starling_xml::Element;

/// Where the SASL exchange of a stream stands.
pub(crate) enum SaslState {
    /// No exchange in progress.
    Idle,
    /// `<auth/>` came without an initial response; we sent an empty
    /// challenge and wait for the client's first message (§6.4.2).
    AwaitingInitial(Mechanism),
    /// SCRAM server-first sent; waiting for client-final.
    Scram(Box<ScramServer>, BareJid),
    /// Authenticated as this account.
    Done(BareJid),
}

enum Step {
    Challenge(Vec<u8>),
    Success(Vec<u8>, BareJid),
}

impl Session {
    /// Mechanisms to offer on this stream, strongest first.
    pub(super) fn offered_mechanisms(&self) -> Vec<Mechanism> {
        let secure = self.info.secure;
        self.shared
            .mechanisms
            .iter()
            .copied()
            .filter(|m| match m {
                Mechanism::Plain => secure,
                m if m.is_plus() => secure && !self.bindings.is_empty(),
                _ => secure || !self.shared.require_tls,
            })
            .collect()
    }

    /// An element of either SASL profile: RFC 6120 §6 (`<auth/>`,
    /// `<response/>`, `<abort/>`) or XEP-0388 SASL2 (`<authenticate/>`,
    /// `<response/>`, `<abort/>` in `urn:xmpp:sasl:2`). The mechanisms,
    /// credential checks and limits are the same; SASL2 differs in framing,
    /// in the `<success/>` (authorization identifier, additional data) and
    /// in having no stream restart (§6.4.6 does not apply, XEP-0388
    /// "Success": the features follow at once).
    pub(super) async fn on_sasl(&mut self, el: Element) -> Result<(), Exit> {
        let v2 = el.ns() == ns::SASL2;
        if (self.shared.require_tls || v2) && !self.info.secure {
            // RFC 6120 §6.4.? / §6.5.4: the mechanism needs a protected
            // stream; XEP-0388 §9: SASL2 only after TLS.
            return self.sasl_failure(
                v2,
                SaslError::EncryptionRequired,
                "use STARTTLS first",
                None,
            );
        }
        let mechanism = self.mechanism_of(&el);
        let result = match (v2, el.name()) {
            (false, "auth") => {
                self.sasl2_request = None;
                self.on_auth(&el, el.text()).await
            }
            (true, "authenticate") => {
                self.sasl2_request = Some(Box::new(el.clone()));
                let initial = el
                    .get_child("initial-response", ns::SASL2)
                    .map(|r| r.text())
                    .unwrap_or_default();
                match el.attr("mechanism").and_then(HtMechanism::from_name) {
                    Some(ht) => self.on_fast(&el, ht, &initial).await,
                    None => self.on_auth(&el, initial).await,
                }
            }
            // A response continues the exchange in its own profile.
            (_, "response") if v2 == self.sasl2_request.is_some() => self.on_response(&el).await,
            (_, "abort") => {
                self.sasl = SaslState::Idle;
                Err(SaslError::Aborted)
            }
            _ => Err(SaslError::MalformedRequest("unknown SASL element")),
        };
        let result = match result {
            Ok(Step::Success(data, jid)) => self.refuse_disabled(data, jid).await,
            other => other,
        };
        match result {
            Ok(Step::Challenge(data)) => {
                self.write_sasl(v2, "challenge", &data);
                Ok(())
            }
            Ok(Step::Success(data, jid)) => {
                // (Before the channel bindings are freed below.)
                let fast_offered = if v2 { self.offered_fast() } else { Vec::new() };
                self.shared.env.metrics.auth_succeeded(mechanism);
                tracing::info!(session = self.info.id, user = %jid, peer = %self.info.peer, sasl2 = v2, "authenticated");
                self.info.user = Some(jid.clone());
                self.sasl = SaslState::Done(jid.clone());
                self.info.state = SessionState::Authenticated;
                self.conn.set_authenticated();
                // Channel bindings are only needed for SASL: free them.
                self.bindings = Default::default();
                if v2 {
                    let request = self.sasl2_request.take();
                    let mut success = Element::new("success", ns::SASL2);
                    if !data.is_empty() {
                        success.append_child(
                            Element::builder("additional-data", ns::SASL2)
                                .text(encode_payload(&data))
                                .build(),
                        );
                    }
                    // XEP-0484: a token asked for, or due for rotation.
                    if let Some(token) = self
                        .fast_token_for(&jid, request.as_deref(), &fast_offered)
                        .await
                    {
                        success.append_child(token);
                    }
                    // Inline requests first (XEP-0198: a <resume/> before
                    // any bind); a resumption that succeeds hands the
                    // connection over and ends this session here.
                    let answers = match request.as_deref() {
                        Some(r) => self.sasl2_inline(r, &success).await?,
                        None => Vec::new(),
                    };
                    // XEP-0386: a Bind 2 request is processed before the
                    // <success/>, which then names the full JID.
                    let bound = match request
                        .as_deref()
                        .and_then(|r| r.get_child("bind", ns::BIND2))
                    {
                        Some(b) => {
                            let agent = request.as_deref().and_then(user_agent_id);
                            Some(self.bind2(&jid, b, agent).await?)
                        }
                        None => None,
                    };
                    let identity = bound
                        .as_ref()
                        .map_or_else(|| jid.to_string(), |(f, _)| f.to_string());
                    success.append_child(
                        Element::builder("authorization-identifier", ns::SASL2)
                            .text(identity)
                            .build(),
                    );
                    for a in answers {
                        success.append_child(a);
                    }
                    let opened = bound.is_some();
                    if let Some((_, bound)) = bound {
                        success.append_child(bound);
                    }
                    self.write_element(success);
                    // No restart: the features of the authenticated stream
                    // follow the <success/> (XEP-0388 "Success").
                    self.write_features();
                    if opened {
                        return self.session_opened().await;
                    }
                } else {
                    self.write_sasl(false, "success", &data);
                    self.conn.restart();
                }
                Ok(())
            }
            Err(e) => {
                let user = match &self.sasl {
                    SaslState::Scram(_, j) => Some(j.to_string()),
                    _ => None,
                };
                self.sasl = SaslState::Idle;
                // XEP-0388 "Failure": inline requests are not processed.
                self.sasl2_request = None;
                self.sasl_failure(v2, e, "", user)
            }
        }
    }

    /// A banned account (the admin API's ban) is refused once it proved
    /// its credentials, whatever the mechanism, with `<account-disabled/>`
    /// (RFC 6120 §6.5.1): only who knows the password learns of the ban.
    async fn refuse_disabled(&mut self, data: Vec<u8>, jid: BareJid) -> Result<Step, SaslError> {
        match self.shared.env.storage.accounts.is_disabled(&jid).await {
            Ok(false) => Ok(Step::Success(data, jid)),
            Ok(true) => {
                tracing::info!(session = self.info.id, user = %jid, peer = %self.info.peer, "authentication refused: the account is disabled");
                Err(SaslError::AccountDisabled)
            }
            Err(e) => {
                tracing::error!(error = %e, "account state lookup failed");
                Err(SaslError::TemporaryAuthFailure)
            }
        }
    }

    /// Runs the inline requests of a successful SASL2 `<authenticate/>`
    /// that have an [`ElementStage::Sasl2`] handler (XEP-0198's
    /// `<resume/>`) and returns what they answered, for the `<success/>`.
    /// A handler asking to take over another session's connection (a
    /// resumption) hands it over with `success` to finish; then this
    /// session ends (`Exit::HandedOver`). Unknown inline elements are
    /// ignored (XEP-0388 §2.6.1 lists only what was offered).
    async fn sasl2_inline(
        &mut self,
        request: &Element,
        success: &Element,
    ) -> Result<Vec<Element>, Exit> {
        let mut answers = Vec::new();
        for child in request.children() {
            if child.ns() == ns::SASL2 || child.ns() == ns::BIND2 {
                continue; // <initial-response/>, <user-agent/>, <bind/>
            }
            let Some(actions) = self.element_actions(ElementStage::Sasl2, child).await else {
                continue;
            };
            let (sends, actions) = take_sends(actions);
            answers.extend(sends);
            let mut rest = Vec::new();
            for a in actions {
                let Action::Attach { to, request } = a else {
                    rest.push(a);
                    continue;
                };
                let success = Box::new(success.clone());
                if let Some(back) = self.try_hand_over(to, request, Some(success)).await? {
                    // The session ended in between: its handlers answer
                    // here (<failed/>), then we go on.
                    let (sends, more) = take_sends(self.attached_actions(&back, true).await);
                    answers.extend(sends);
                    rest.extend(more);
                }
            }
            self.apply(rest).await?;
        }
        Ok(answers)
    }

    /// The SASL2 stream feature (XEP-0388 §2.1) with `mechs` and what an
    /// `<authenticate/>` may carry inline: FAST (XEP-0484 §4.1), the
    /// modules' [`FeatureStage::Sasl2Inline`] features (XEP-0198's
    /// `<sm/>`) and Bind 2 with the features its request may enable
    /// (XEP-0386 §3.1).
    pub(super) fn sasl2_feature(&self, mechs: &[Mechanism]) -> Element {
        let mut inline = Element::new("inline", ns::SASL2);
        let fast = self.offered_fast();
        if !fast.is_empty() {
            inline.append_child(mechanism_list(
                "fast",
                NS_FAST,
                fast.iter().map(|m| m.name()),
            ));
        }
        let mut extra = Vec::new();
        for p in self
            .shared
            .env
            .hooks
            .stream_features_on(self.info.modules_off())
        {
            p.stream_features(
                &self.shared.env,
                &self.info,
                FeatureStage::Sasl2Inline,
                &mut extra,
            );
        }
        for e in extra {
            inline.append_child(e);
        }
        let mut bind_inline = Element::new("inline", ns::BIND2);
        for var in self
            .shared
            .env
            .hooks
            .element_namespaces(ElementStage::Bind2, self.info.modules_off())
        {
            bind_inline.append_child(
                Element::builder("feature", ns::BIND2)
                    .attr("var", var)
                    .build(),
            );
        }
        inline.append_child(
            Element::builder("bind", ns::BIND2)
                .append(bind_inline)
                .build(),
        );
        let mut el = mechanism_list("authentication", ns::SASL2, mechs.iter().map(|m| m.name()));
        el.append_child(inline);
        el
    }

    /// The FAST mechanisms offered on this stream (XEP-0484 §4.1): only
    /// over TLS, and a channel-bound one only where its binding exists.
    pub(super) fn offered_fast(&self) -> Vec<HtMechanism> {
        if self.shared.fast.is_none() || !self.info.secure {
            return Vec::new();
        }
        HtMechanism::ALL
            .into_iter()
            .filter(|m| m.binding().is_none_or(|ty| self.bindings.get(ty).is_some()))
            .collect()
    }

    /// XEP-0484 §4.3: authentication with a FAST token, in one step. The
    /// token must be the client's (its user-agent id), for this mechanism,
    /// unexpired, and its HMAC over this connection's channel binding must
    /// verify. A token from the `new` slot becomes `current`; with
    /// `invalidate='true'` the token used is revoked.
    async fn on_fast(
        &mut self,
        el: &Element,
        mech: HtMechanism,
        initial: &str,
    ) -> Result<Step, SaslError> {
        if matches!(self.sasl, SaslState::Done(_)) {
            return Err(SaslError::MalformedRequest("already authenticated"));
        }
        self.sasl = SaslState::Idle;
        if self.shared.auth_limiter.is_limited(self.info.peer.ip()) {
            return Err(SaslError::TemporaryAuthFailure);
        }
        if !self.offered_fast().contains(&mech) {
            return Err(SaslError::InvalidMechanism);
        }
        let Some(fast_el) = el.get_child("fast", NS_FAST) else {
            return Err(SaslError::MalformedRequest(
                "authenticating with a FAST token needs <fast/> (XEP-0484 §4.3)",
            ));
        };
        let agent = user_agent_id(el)
            .ok_or(SaslError::MalformedRequest(
                "FAST needs the client's <user-agent id/> (XEP-0484 §5)",
            ))?
            .to_owned();
        let data = decode_payload(initial.trim())?;
        let (authcid, hashed) = ht::parse_initiator(&data)?;
        let jid = self.account_jid(&authcid)?;
        let cb = match mech.binding() {
            None => Vec::new(),
            Some(ty) => self
                .bindings
                .get(ty)
                .ok_or(SaslError::UnsupportedChannelBinding)?
                .to_vec(),
        };
        let Some(fast) = self.shared.fast.as_ref() else {
            return Err(SaslError::InvalidMechanism);
        };
        let accounts = self.shared.env.storage.accounts.clone();
        let temporary = |e: starling_core::storage::StorageError| {
            tracing::error!(error = %e, "FAST token lookup failed");
            SaslError::TemporaryAuthFailure
        };
        let mut tokens = accounts
            .fast_tokens(&jid, &agent)
            .await
            .map_err(temporary)?;
        let had_current = tokens.iter().any(|t| t.slot == FastSlot::Current);
        // The newer token first (XEP-0484 §6.1).
        tokens.sort_by_key(|t| t.slot != FastSlot::New);
        let now = crate::c2s::fast::now_millis();
        let found = tokens.into_iter().find_map(|t| {
            if t.mechanism != mech.name() || t.expires_at <= now {
                return None;
            }
            let token = fast.token(&jid, &agent, &t.nonce);
            ht::verify_initiator(token.as_bytes(), &cb, &hashed).then_some((t, token))
        });
        let Some((used, token)) = found else {
            return Err(SaslError::NotAuthorized(
                "unknown, expired or wrong FAST token",
            ));
        };
        let invalidate = matches!(fast_el.attr("invalidate"), Some("true" | "1"));
        if invalidate {
            accounts
                .delete_fast_tokens(&jid, &agent, Some(used.slot))
                .await
                .map_err(temporary)?;
        } else if used.slot == FastSlot::New && had_current {
            // §4.4: using the newer token invalidates the older one. The
            // used token stays in `new` (no write on the common path); it
            // moves to `current` only when a newer one is issued.
            accounts
                .delete_fast_tokens(&jid, &agent, Some(FastSlot::Current))
                .await
                .map_err(temporary)?;
        }
        self.fast_used = (!invalidate).then_some(used);
        Ok(Step::Success(ht::responder(token.as_bytes(), &cb), jid))
    }

    /// The `<token/>` for the `<success/>` (XEP-0484 §4.2, §4.4): one the
    /// client asked for with `<request-token/>` (a mechanism we offered),
    /// else a replacement for a token due for rotation. The new token
    /// goes to the client's `new` slot.
    async fn fast_token_for(
        &mut self,
        jid: &BareJid,
        request: Option<&Element>,
        offered: &[HtMechanism],
    ) -> Option<Element> {
        let used = self.fast_used.take();
        let request = request?;
        let fast = self.shared.fast.as_ref()?;
        // §4.4: a token past half its life is replaced unasked.
        let rotate = used
            .as_ref()
            .filter(|u| fast.due_for_rotation(u))
            .and_then(|u| HtMechanism::from_name(&u.mechanism))
            .map(HtMechanism::name);
        let asked = request
            .get_child("request-token", NS_FAST)
            .and_then(|r| r.attr("mechanism"))
            .and_then(HtMechanism::from_name)
            .filter(|m| offered.contains(m))
            .map(HtMechanism::name);
        let mechanism = asked.or(rotate)?;
        let agent = user_agent_id(request)?;
        let (stored, token) = fast.issue(jid, agent, mechanism);
        // The token just used, if it sits in `new`, moves to `current`:
        // it keeps working until the client uses the one issued now
        // (§6.1: a client may lose this response).
        if let Some(used) = used.filter(|u| u.slot == FastSlot::New) {
            let current = FastToken {
                slot: FastSlot::Current,
                ..used
            };
            if let Err(e) = self
                .shared
                .env
                .storage
                .accounts
                .put_fast_token(jid, agent, &current)
                .await
            {
                tracing::error!(error = %e, user = %jid, "keeping the used FAST token failed; none issued");
                return None;
            }
        }
        match self
            .shared
            .env
            .storage
            .accounts
            .put_fast_token(jid, agent, &stored)
            .await
        {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => {
                tracing::error!(error = %e, user = %jid, "storing a FAST token failed; none issued");
                return None;
            }
        }
        let expiry = starling_proto::datetime::xep0082_datetime(stored.expires_at.max(0) as u128);
        tracing::info!(session = self.info.id, user = %jid, mechanism, "FAST token issued");
        Some(
            Element::builder("token", NS_FAST)
                .attr("expiry", expiry)
                .attr("token", token)
                .build(),
        )
    }

    /// The mechanism `el` (a SASL element) authenticates with, for the
    /// metrics: named by `<auth/>` and `<authenticate/>`, else the one of
    /// the exchange in progress.
    fn mechanism_of(&self, el: &Element) -> &'static str {
        match (&self.sasl, el.attr("mechanism")) {
            (_, Some(m)) => Mechanism::from_name(m)
                .map(Mechanism::name)
                .or_else(|| HtMechanism::from_name(m).map(HtMechanism::name))
                .unwrap_or("other"),
            (SaslState::AwaitingInitial(m), None) => m.name(),
            (SaslState::Scram(server, _), None) => server.mechanism().name(),
            _ => "other",
        }
    }

    fn write_sasl(&mut self, v2: bool, name: &str, data: &[u8]) {
        let mut el = Element::new(name, if v2 { ns::SASL2 } else { ns::SASL });
        if !data.is_empty() || name == "challenge" {
            el.append_text(encode_payload(data));
        }
        self.write_element(el);
    }

    fn sasl_failure(
        &mut self,
        v2: bool,
        e: SaslError,
        text: &str,
        user: Option<String>,
    ) -> Result<(), Exit> {
        // XEP-0388 "Failure": the RFC 6120 §6.5 condition, in the SASL
        // namespace, inside a SASL2 <failure/>.
        let outer = if v2 { ns::SASL2 } else { ns::SASL };
        let mut failure = Element::new("failure", outer);
        failure.append_child(Element::new(e.condition(), ns::SASL));
        if !text.is_empty() {
            failure.append_child(
                Element::builder("text", outer)
                    .attr("xml:lang", "en")
                    .text(text)
                    .build(),
            );
        }
        self.write_element(failure);
        if matches!(e, SaslError::Aborted) {
            return Ok(());
        }
        self.shared.env.metrics.auth_failed(e.condition());
        self.shared.auth_limiter.record(self.info.peer.ip());
        self.auth_failures += 1;
        // Every failure at debug level; at info one line per 10 s with a
        // count, so a password-guessing botnet cannot flood the log
        // (`starling_auth_failures_total` counts every one, and each
        // address is limited by `[auth] max_failures_per_ip`).
        let user = user.as_deref().unwrap_or("-");
        tracing::debug!(session = self.info.id, peer = %self.info.peer, user, condition = e.condition(), error = %e, "authentication failed");
        starling_core::log_throttled!(info, session = self.info.id, peer = %self.info.peer, user, condition = e.condition(), error = %e, "authentication failed");
        if self.auth_failures >= self.shared.max_auth_attempts {
            // §6.4.5: too many retries → <policy-violation/>.
            return Err(Exit::error(
                StreamErrorCondition::PolicyViolation,
                "too many failed authentication attempts",
            ));
        }
        Ok(())
    }

    async fn on_auth(&mut self, el: &Element, initial: String) -> Result<Step, SaslError> {
        if matches!(self.sasl, SaslState::Done(_)) {
            return Err(SaslError::MalformedRequest("already authenticated"));
        }
        self.sasl = SaslState::Idle;
        if self.shared.auth_limiter.is_limited(self.info.peer.ip()) {
            return Err(SaslError::TemporaryAuthFailure);
        }
        let mechanism = el
            .attr("mechanism")
            .and_then(Mechanism::from_name)
            .filter(|m| self.offered_mechanisms().contains(m))
            .ok_or(SaslError::InvalidMechanism)?;
        if initial.is_empty() {
            // No initial response: empty challenge (§6.4.2).
            self.sasl = SaslState::AwaitingInitial(mechanism);
            return Ok(Step::Challenge(Vec::new()));
        }
        let data = decode_payload(initial.trim())?;
        self.initial(mechanism, &data).await
    }

    async fn on_response(&mut self, el: &Element) -> Result<Step, SaslError> {
        let data = decode_payload(el.text().trim())?;
        match std::mem::replace(&mut self.sasl, SaslState::Idle) {
            SaslState::AwaitingInitial(m) => self.initial(m, &data).await,
            SaslState::Scram(mut server, jid) => {
                let reply = server.client_final(&data);
                match reply {
                    Ok(server_final) => Ok(Step::Success(server_final, jid)),
                    Err(e) => {
                        self.sasl = SaslState::Scram(server, jid); // for the failure log
                        Err(e)
                    }
                }
            }
            _ => Err(SaslError::MalformedRequest("no authentication in progress")),
        }
    }

    /// The account a PLAIN authcid or SCRAM username names. RFC 6120
    /// §6.3.7 asks for the simple user name; clients also send the bare
    /// JID, which names the same account when its domain is the stream's
    /// (compared after the jid crate's normalisation). Any other domain is
    /// not this stream's account.
    fn account_jid(&self, username: &str) -> Result<BareJid, SaslError> {
        let invalid = || SaslError::NotAuthorized("invalid username");
        let given = if username.contains('@') {
            Some(BareJid::new(username).map_err(|_| invalid())?)
        } else {
            None
        };
        let local = match &given {
            Some(j) => j.node().ok_or_else(invalid)?.as_str(),
            None => username,
        };
        let jid = BareJid::new(&format!("{local}@{}", self.info.domain))
            .ok()
            .filter(|j| j.node().is_some())
            .ok_or_else(invalid)?;
        if given.as_ref().is_some_and(|g| *g != jid) {
            return Err(SaslError::NotAuthorized("not an account of this domain"));
        }
        Ok(jid)
    }

    fn check_authzid(&self, authzid: Option<&str>, jid: &BareJid) -> Result<(), SaslError> {
        match authzid {
            None => Ok(()),
            Some(a) if BareJid::new(a).is_ok_and(|z| z == *jid) => Ok(()),
            Some(_) => Err(SaslError::InvalidAuthzid),
        }
    }

    async fn initial(&mut self, mechanism: Mechanism, data: &[u8]) -> Result<Step, SaslError> {
        let accounts = self.shared.env.storage.accounts.clone();
        if mechanism == Mechanism::Plain {
            let (authzid, authcid, password) = parse_plain(data)?;
            let jid = self.account_jid(&authcid)?;
            self.check_authzid(authzid.as_deref(), &jid)?;
            let creds = accounts
                .credentials(&jid, ScramHash::Sha256)
                .await
                .map_err(|e| {
                    tracing::error!(error = %e, "credential lookup failed");
                    SaslError::TemporaryAuthFailure
                })?;
            let Some(creds) = creds else {
                return Err(SaslError::NotAuthorized("unknown user or wrong password"));
            };
            // PBKDF2 runs on the blocking pool (invariant 8).
            let ok = tokio::task::spawn_blocking(move || creds.verify_password(&password))
                .await
                .unwrap_or(false);
            return if ok {
                Ok(Step::Success(Vec::new(), jid))
            } else {
                Err(SaslError::NotAuthorized("unknown user or wrong password"))
            };
        }
        let hash = mechanism.scram_hash().ok_or(SaslError::InvalidMechanism)?;
        let plus_advertised = self.offered_mechanisms().iter().any(|m| m.is_plus());
        let mut server = ScramServer::new(mechanism, self.bindings.clone(), plus_advertised)?;
        server.set_fake_iterations(self.shared.scram_iterations);
        let first = server.client_first(data)?;
        let jid = self.account_jid(&first.username)?;
        self.check_authzid(first.authzid.as_deref(), &jid)?;
        let creds = accounts.credentials(&jid, hash).await.map_err(|e| {
            tracing::error!(error = %e, "credential lookup failed");
            SaslError::TemporaryAuthFailure
        })?;
        let server_first = server.server_first(creds.as_ref())?;
        self.sasl = SaslState::Scram(Box::new(server), jid);
        Ok(Step::Challenge(server_first))
    }
}

/// The SASL2 `<user-agent id/>` of an `<authenticate/>` (XEP-0388 §2.4),
/// if usable as a key (FAST tokens, stable Bind 2 resources).
fn user_agent_id(authenticate: &Element) -> Option<&str> {
    authenticate
        .get_child("user-agent", ns::SASL2)
        .and_then(|u| u.attr("id"))
        .filter(|id| !id.is_empty() && id.len() <= 128)
}

/// `<{name} xmlns='{ns}'>` holding one `<mechanism/>` per name.
pub(super) fn mechanism_list<'a>(
    name: &str,
    ns: &str,
    mechanisms: impl Iterator<Item = &'a str>,
) -> Element {
    let mut el = Element::new(name, ns);
    for m in mechanisms {
        el.append_child(Element::builder("mechanism", ns).text(m).build());
    }
    el
}
