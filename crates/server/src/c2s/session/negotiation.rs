//! The session's stream negotiation (RFC 6120 §4–§7): the stream header
//! and features, what an unauthenticated client may send, STARTTLS, and
//! resource binding with the checks that admit a full JID. SASL is in
//! `sasl.rs`.

use super::*;

impl Session {
    pub(super) fn on_header(&mut self, h: StreamHeader) -> Result<(), Exit> {
        let to = h.attr("to").unwrap_or("");
        let domain = starling_proto::BareJid::new(to)
            .ok()
            .filter(|j| j.node().is_none())
            .map(|j| j.domain().as_str().to_owned());
        // Answer with our header whatever the outcome (§4.9.1.2).
        // A restart (after STARTTLS or SASL) may not switch domains.
        let domain_ok = match &domain {
            Some(d)
                if self.shared.env.hosts.is_local(d)
                    && (self.info.domain.is_empty() || self.info.domain == *d) =>
            {
                self.info.domain = d.to_string();
                self.info.modules_off =
                    self.shared.env.hosts.get(d).map(|h| h.modules_off_handle());
                true
            }
            _ => false,
        };
        if self.info.domain.is_empty() {
            self.info.domain = self
                .shared
                .env
                .hosts
                .list()
                .into_iter()
                .next()
                .unwrap_or_default();
        }
        self.info.stream_id = random_id(16);
        self.conn
            .open_stream(&self.info.stream_id, &self.info.domain);
        if h.default_ns.as_deref() != Some(ns::CLIENT) {
            return Err(Exit::error(
                StreamErrorCondition::InvalidNamespace,
                "the stream's default namespace must be jabber:client",
            ));
        }
        if !domain_ok {
            return Err(Exit::error(
                StreamErrorCondition::HostUnknown,
                format!("this server does not serve {to:?}"),
            ));
        }
        let version_ok = h
            .attr("version")
            .and_then(|v| v.split('.').next())
            .and_then(|major| major.parse::<u32>().ok())
            .is_some_and(|major| major >= 1);
        if !version_ok {
            return Err(Exit::error(
                StreamErrorCondition::UnsupportedVersion,
                "only XMPP streams of version 1.0 are supported",
            ));
        }
        self.write_features();
        Ok(())
    }

    pub(super) fn write_features(&mut self) {
        let mut features = Vec::new();
        let tls_available =
            self.shared.tls.is_some() && !self.info.secure && self.conn.can_starttls();
        if !self.info.state.is_authenticated() {
            if tls_available {
                let mut starttls = Element::new("starttls", ns::TLS);
                if self.shared.require_tls {
                    starttls.append_child(Element::new("required", ns::TLS));
                }
                features.push(starttls);
            }
            if self.info.secure || !self.shared.require_tls {
                let mechs = self.offered_mechanisms();
                if !mechs.is_empty() {
                    features.push(sasl::mechanism_list(
                        "mechanisms",
                        ns::SASL,
                        mechs.iter().map(|m| m.name()),
                    ));
                    // XEP-0388: the same mechanisms over SASL2, only on an
                    // encrypted stream (§9).
                    if self.info.secure {
                        features.push(self.sasl2_feature(&mechs));
                    }
                }
                // XEP-0440: which channel bindings -PLUS can use here.
                if !self.bindings.is_empty() {
                    let mut cb = Element::new("sasl-channel-binding", ns::SASL_CB);
                    for t in self.bindings.types() {
                        cb.append_child(
                            Element::builder("channel-binding", ns::SASL_CB)
                                .attr("type", t.name())
                                .build(),
                        );
                    }
                    features.push(cb);
                }
                self.module_features(FeatureStage::PreAuth, &mut features);
            }
        } else if !self.info.state.is_bound() {
            features.push(Element::new("bind", ns::BIND));
            let mut session = Element::new("session", ns::SESSION);
            session.append_child(Element::new("optional", ns::SESSION));
            features.push(session);
            self.module_features(FeatureStage::PostAuth, &mut features);
        }
        // A stream bound during SASL2 (XEP-0386) offers nothing more: what
        // could be enabled was enabled inline.
        self.conn.send_features(&features);
    }

    pub(super) fn module_features(&self, stage: FeatureStage, out: &mut Vec<Element>) {
        for p in self
            .shared
            .env
            .hooks
            .stream_features_on(self.info.modules_off())
        {
            p.stream_features(&self.shared.env, &self.info, stage, out);
        }
    }

    // ----- top-level elements -----

    pub(super) async fn on_unauthenticated(&mut self, el: Element) -> Result<(), Exit> {
        if el.is("starttls", ns::TLS) {
            return self.on_starttls().await;
        }
        if el.ns() == ns::SASL || el.ns() == ns::SASL2 {
            return self.on_sasl(el).await;
        }
        if el.ns() == ns::CLIENT && matches!(el.name(), "iq" | "message" | "presence") {
            if self.shared.require_tls && !self.info.secure {
                return Err(Exit::error(
                    StreamErrorCondition::PolicyViolation,
                    "STARTTLS is required before anything else",
                ));
            }
            let mut el = el;
            el.remove_attr("from");
            let mut stanza = match Stanza::from_element(el) {
                Ok(s) => s,
                Err(_) => {
                    return Err(Exit::error(
                        StreamErrorCondition::NotAuthorized,
                        "authenticate before sending stanzas",
                    ))
                }
            };
            let mut actions = Vec::new();
            let flow = {
                let mut cx =
                    SessionCtx::new(&self.shared.env, &self.info, &mut self.ext, &mut actions);
                run_chain!(
                    self.shared.env.hooks.pre_auth,
                    "pre_auth",
                    off = self.info.modules_off(),
                    |h| h.pre_auth(&mut cx, &mut stanza)
                )
            };
            self.apply(actions).await?;
            if flow == Flow::Stop {
                return Ok(());
            }
            return Err(Exit::error(
                StreamErrorCondition::NotAuthorized,
                "authenticate before sending stanzas",
            ));
        }
        if el.ns() != ns::CLIENT && self.on_module_element(ElementStage::PreAuth, &el).await? {
            return Ok(());
        }
        Err(Exit::error(
            StreamErrorCondition::UnsupportedStanzaType,
            format!(
                "unexpected element {{{}}}{} before authentication",
                el.ns(),
                el.name()
            ),
        ))
    }

    // ----- STARTTLS (RFC 6120 §5) -----

    /// Hands a non-stanza element to the module registered for its
    /// namespace at `stage`; false if there is none.
    pub(super) async fn on_module_element(
        &mut self,
        stage: ElementStage,
        el: &Element,
    ) -> Result<bool, Exit> {
        let Some(actions) = self.element_actions(stage, el).await else {
            return Ok(false);
        };
        self.apply(actions).await?;
        Ok(true)
    }

    /// Runs the handler of `el`'s namespace at `stage` and returns the
    /// actions it asked for, unapplied; `None` if there is no handler.
    pub(super) async fn element_actions(
        &mut self,
        stage: ElementStage,
        el: &Element,
    ) -> Option<Vec<Action>> {
        let (module, handler) = self
            .shared
            .env
            .hooks
            .element_handler(stage, el.ns(), self.info.modules_off())
            .map(|(m, h)| (m, h.clone()))?;
        let mut actions = Vec::new();
        let result = {
            let mut cx = SessionCtx::new(&self.shared.env, &self.info, &mut self.ext, &mut actions);
            handler.element(&mut cx, el).await
        };
        if let Err(e) = result {
            starling_core::hooks::log_failure("element", module, &e);
        }
        Some(actions)
    }

    pub(super) async fn on_starttls(&mut self) -> Result<(), Exit> {
        let tls = self.shared.tls.clone();
        let Some(tls) = tls.filter(|_| !self.info.secure && self.conn.can_starttls()) else {
            // §5.4.2.2: failure, then close the stream.
            self.conn.refuse_starttls(self.shared.write_timeout).await;
            return Err(Exit::Io(IoEnd::Tls));
        };
        let remaining = (self.connected_at + self.shared.negotiation_timeout)
            .saturating_duration_since(Instant::now());
        match self
            .conn
            .starttls(&tls, remaining, self.shared.write_timeout)
            .await
        {
            Ok(bindings) => {
                self.bindings = bindings;
                self.info.secure = true;
                Ok(())
            }
            Err(end) => {
                tracing::debug!(session = self.info.id, peer = %self.info.peer, "STARTTLS failed");
                Err(Exit::Io(end))
            }
        }
    }

    // ----- resource binding (RFC 6120 §7) -----

    pub(super) async fn on_bind(&mut self, el: Element) -> Result<(), Exit> {
        let id = el.attr("id").unwrap_or("").to_owned();
        if self.info.state.is_bound() {
            // §7.7.2.3 allows refusing additional resources on one stream.
            self.write_iq_error(
                &id,
                StanzaErrorCondition::NotAllowed,
                "a resource is already bound",
            );
            return Ok(());
        }
        let Some(user) = self.sasl_user() else {
            return Err(Exit::error(
                StreamErrorCondition::NotAuthorized,
                "not authenticated",
            ));
        };
        let requested = el
            .get_child("bind", ns::BIND)
            .and_then(|b| b.get_child("resource", ns::BIND))
            .map(|r| r.text())
            .unwrap_or_default();
        let requested = requested.trim();
        let resource = if requested.is_empty() {
            format!("starling-{}", random_id(10))
        } else {
            requested.to_owned()
        };
        let full = match user.with_resource_str(&resource) {
            Ok(f) => f,
            Err(_) => {
                // §7.7.2.1: the resource cannot be processed.
                self.write_iq_error(&id, StanzaErrorCondition::BadRequest, "invalid resource");
                return Ok(());
            }
        };
        if let Err(text) = self.admit(&full) {
            // RFC 6120 §7.6.2.1: the server "has reached a limit on the
            // number of connected resources" (here the domain's
            // max_sessions; docs/domains.md).
            self.write_iq_error(&id, StanzaErrorCondition::ResourceConstraint, text);
            return Ok(());
        }
        if let Err(TooManyResources(max)) = self.bind_resource(&full).await {
            // RFC 6120 §7.6.2.1: "the account has reached a limit on the
            // number of simultaneous connected resources allowed".
            self.write_iq_error(
                &id,
                StanzaErrorCondition::ResourceConstraint,
                &format!(
                    "this account already has {max} connected resources (the limit); close one of them and try again"
                ),
            );
            return Ok(());
        }
        let mut reply = Element::new("iq", ns::CLIENT);
        reply.set_attr("type", "result");
        reply.set_attr("id", id);
        let mut bind = Element::new("bind", ns::BIND);
        bind.append_child(
            Element::builder("jid", ns::BIND)
                .text(full.as_str())
                .build(),
        );
        reply.append_child(bind);
        self.write_element(reply);
        self.session_opened().await
    }

    /// Counts a session of `full`'s domain before it binds: refused when
    /// the domain is no longer served (disabled while this stream
    /// negotiated) or its `max_sessions` is reached on this node. Every
    /// bound session is counted once and uncounted in `hand_back`.
    pub(super) fn admit(&self, full: &FullJid) -> Result<(), &'static str> {
        match self.shared.env.hosts.get(full.domain().as_str()) {
            Some(host) if host.open_session() => Ok(()),
            Some(_) => Err("this domain has reached its session limit; try again later"),
            None => Err("this domain is no longer served"),
        }
    }

    /// Binds `full` to this session: the router replaces a session holding
    /// the same full JID (RFC 6120 §7.7.2.2), and the session is
    /// established. Refused (and the domain's count taken in `admit` given
    /// back) when the account has `max_resources_per_account` connected.
    pub(super) async fn bind_resource(&mut self, full: &FullJid) -> Result<(), TooManyResources> {
        let env = &self.shared.env;
        let bound = env
            .router
            .bind(
                env,
                full,
                self.handle.clone(),
                self.shared.max_resources_per_account,
            )
            .await;
        if let Err(e) = bound {
            if let Some(host) = env.hosts.get(full.domain().as_str()) {
                host.close_session();
            }
            env.metrics.limit_refused("max_resources_per_account");
            return Err(e);
        }
        self.info.jid = Some(full.clone());
        self.info.state = SessionState::Established;
        let metrics = &self.shared.env.metrics;
        metrics.sessions.inc();
        metrics.sessions_on(self.conn.metrics_transport()).inc();
        metrics.sessions_of_domain(full.domain().as_str()).inc();
        self.info.transport = self.conn.metrics_transport();
        tracing::info!(session = self.info.id, jid = %full, peer = %self.info.peer, secure = self.info.secure, "session bound");
        Ok(())
    }

    /// Runs the `session_opened` hooks (after a bind result was written).
    pub(super) async fn session_opened(&mut self) -> Result<(), Exit> {
        let mut actions = Vec::new();
        {
            let mut cx = SessionCtx::new(&self.shared.env, &self.info, &mut self.ext, &mut actions);
            run_chain!(
                self.shared.env.hooks.session_opened,
                "session_opened",
                off = self.info.modules_off(),
                |h| h.session_opened(&mut cx)
            );
        }
        self.apply(actions).await
    }

    /// XEP-0386 Bind 2, inside a successful SASL2 authentication: binds
    /// `{tag}/{random}` (§3.3; a random resource if the tag is no valid
    /// resource), runs the inline requests (XEP-0198 `<enable/>`, XEP-0280
    /// `<enable/>`, XEP-0352 `<active/>`/`<inactive/>`) through their
    /// modules' [`ElementStage::Bind2`] handlers, and returns the full JID
    /// and the `<bound/>` element holding what those handlers answered.
    pub(super) async fn bind2(
        &mut self,
        user: &BareJid,
        request: &Element,
        agent: Option<&str>,
    ) -> Result<(FullJid, Element), Exit> {
        let tag = request
            .get_child("tag", ns::BIND2)
            .map(|t| t.text().trim().to_owned())
            .filter(|t| !t.is_empty() && t.len() <= 64);
        // §3.3: a client that names itself (SASL2 user-agent id) gets the
        // same resource for the same tag every time, so its new session
        // replaces its earlier one (RFC 6120 §7.7.2.2, as §3.2 asks:
        // "SHOULD terminate any earlier sessions from the same client").
        let random = match (&self.shared.key, agent, &tag) {
            (Some(key), Some(agent), Some(tag)) => {
                crate::c2s::fast::stable_resource_id(key, user, agent, tag)
            }
            _ => random_id(10),
        };
        let full = tag
            .and_then(|t| user.with_resource_str(&format!("{t}/{random}")).ok())
            .or_else(|| user.with_resource_str(&format!("starling-{random}")).ok())
            .ok_or_else(|| {
                Exit::error(
                    StreamErrorCondition::InternalServerError,
                    "no resource could be generated",
                )
            })?;
        if let Err(text) = self.admit(&full) {
            // Inside SASL2's success there is no iq to fail: the stream
            // ends with the same condition (RFC 6120 §4.9.3.17).
            return Err(Exit::error(StreamErrorCondition::ResourceConstraint, text));
        }
        if let Err(TooManyResources(max)) = self.bind_resource(&full).await {
            // As for the domain's limit above: no iq to fail inside SASL2.
            return Err(Exit::error(
                StreamErrorCondition::ResourceConstraint,
                format!("this account already has {max} connected resources (the limit); close one of them and try again"),
            ));
        }
        let mut bound = Element::new("bound", ns::BIND2);
        for child in request.children() {
            if child.ns() == ns::BIND2 {
                continue; // <tag/>
            }
            // A request not offered inline has no handler: ignored.
            if let Some(actions) = self.element_actions(ElementStage::Bind2, child).await {
                let (sends, rest) = take_sends(actions);
                sends.into_iter().for_each(|el| {
                    bound.append_child(el);
                });
                self.apply(rest).await?;
            }
        }
        // What every bind gets (the archive's metadata, §3.3).
        let mut actions = Vec::new();
        {
            let mut cx = SessionCtx::new(&self.shared.env, &self.info, &mut self.ext, &mut actions);
            run_chain!(
                self.shared.env.hooks.bound,
                "bound",
                off = self.info.modules_off(),
                |h| h.bound(&mut cx)
            );
        }
        let (sends, rest) = take_sends(actions);
        sends.into_iter().for_each(|el| {
            bound.append_child(el);
        });
        self.apply(rest).await?;
        Ok((full, bound))
    }

    pub(super) fn sasl_user(&self) -> Option<BareJid> {
        match &self.sasl {
            SaslState::Done(j) => Some(j.clone()),
            _ => None,
        }
    }

    // ----- stanzas of an established session -----
}
