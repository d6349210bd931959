//! Handing a connection between session tasks (XEP-0198 resumption, and
//! SASL2's inline resumption): the session that receives a connection
//! (`on_attach`, `run_attached`), the one that gives it away
//! (`hand_over`), and giving a session's state back when it ends
//! (`hand_back`).

use super::*;

impl Session {
    /// A resuming client's connection arrives (XEP-0198 §5): it replaces
    /// ours, if we still have one, and the modules answer the request.
    pub(super) async fn on_attach(&mut self, h: Box<Handover>) -> Result<(), Exit> {
        let Handover {
            conn,
            peer,
            secure,
            request,
            sasl2_success,
        } = *h;
        let Ok(conn) = conn.downcast::<Connection>() else {
            return Ok(());
        };
        if !self.info.state.is_bound() {
            return Ok(()); // ending already; dropping the connection closes it
        }
        let old = std::mem::replace(&mut self.conn, *conn);
        let metrics = &self.shared.env.metrics;
        metrics.sessions_on(old.metrics_transport()).dec();
        metrics.sessions_on(self.conn.metrics_transport()).inc();
        self.info.transport = self.conn.metrics_transport();
        if old.is_live() {
            let mut old = old;
            let e = StreamError::with_text(
                StreamErrorCondition::Conflict,
                "this session was resumed on another connection",
            );
            old.close(
                Closing::Error(&e),
                self.shared.write_timeout.min(Duration::from_secs(5)),
            )
            .await;
        } else {
            self.shared.env.metrics.connections.inc();
        }
        tracing::info!(session = self.info.id, jid = ?self.info.jid.as_ref().map(|j| j.to_string()), %peer, "session resumed on a new connection");
        self.info.peer = peer;
        self.info.secure = secure;
        self.info.state = SessionState::Established;
        self.handle.set_detached(false);
        match sasl2_success {
            None => self.run_attached(&request, false).await,
            Some(mut success) => {
                // Inline resumption (XEP-0388, XEP-0198): our full JID and
                // the attach handlers' answer (<resumed/>) complete the
                // <success/>; the features follow; then what the handlers
                // resend.
                let full = self
                    .info
                    .jid
                    .as_ref()
                    .map(|j| j.to_string())
                    .unwrap_or_default();
                success.append_child(
                    Element::builder("authorization-identifier", ns::SASL2)
                        .text(full)
                        .build(),
                );
                let (sends, rest) = take_sends(self.attached_actions(&request, false).await);
                sends.into_iter().for_each(|el| {
                    success.append_child(el);
                });
                self.write_element(*success);
                self.write_features();
                Box::pin(self.apply(rest)).await
            }
        }
    }

    /// Runs the attach handlers (see [`starling_core::hooks::AttachHandler`]).
    pub(super) async fn run_attached(
        &mut self,
        request: &Element,
        failed: bool,
    ) -> Result<(), Exit> {
        let actions = self.attached_actions(request, failed).await;
        Box::pin(self.apply(actions)).await
    }

    /// The attach handlers' actions, unapplied.
    pub(super) async fn attached_actions(
        &mut self,
        request: &Element,
        failed: bool,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        {
            let mut cx = SessionCtx::new(&self.shared.env, &self.info, &mut self.ext, &mut actions);
            run_chain!(
                self.shared.env.hooks.attached,
                "attached",
                off = self.info.modules_off(),
                |h| h.attached(&mut cx, request, failed)
            );
        }
        actions
    }

    /// Applies the effects requested by hook handlers, in order.
    pub(super) async fn apply(&mut self, actions: Vec<Action>) -> Result<(), Exit> {
        for action in actions {
            match action {
                Action::Send(el) => self.write_element(el),
                Action::Route(stanza) => self.shared.env.route(stanza).await,
                Action::SetPresence(p) => {
                    self.info.priority = p.as_ref().map(|(prio, _)| *prio);
                    if let Some(jid) = &self.info.jid {
                        self.shared.env.sessions.set_presence(jid, self.info.id, p);
                    }
                }
                Action::SetTimer(key, after) => {
                    self.timers.retain(|(_, k)| *k != key);
                    self.timers.push((Instant::now() + after, key));
                }
                Action::CancelTimer(key) => self.timers.retain(|(_, k)| *k != key),
                Action::Close(e) => return Err(Exit::Error(e)),
                Action::Resend(wire) => self.conn.send_wire(&wire),
                Action::Reroute(stanza) => {
                    let env = &self.shared.env;
                    env.router.reroute(env, stanza).await
                }
                Action::Attach { to, request } => return self.hand_over(to, request).await,
            }
        }
        Ok(())
    }

    // ----- output -----

    pub(super) fn write_element(&mut self, el: Element) {
        if el.ns() == ns::CLIENT {
            if let Some(kind) = match el.name() {
                "message" => Some(StanzaKind::Message),
                "presence" => Some(StanzaKind::Presence),
                "iq" => Some(StanzaKind::Iq),
                _ => None,
            } {
                self.shared.env.metrics.stanza_out(kind);
            }
        }
        let mark = self.conn.wire_mark();
        self.conn.send(&el);
        self.observe_out(&el, mark);
    }

    /// Hands our connection to session `to` (XEP-0198 resumption). On
    /// success this session ends; if `to` is gone, the attach handlers hear
    /// of the failure and the connection stays ours.
    pub(super) async fn hand_over(&mut self, to: SessionRef, request: Element) -> Result<(), Exit> {
        match self.try_hand_over(to, request, None).await? {
            None => Ok(()),
            Some(request) => self.run_attached(&request, true).await,
        }
    }

    /// Hands the connection to session `to`: `Err(Exit::HandedOver)` when
    /// it took it, else the connection is ours again and the request is
    /// given back.
    pub(super) async fn try_hand_over(
        &mut self,
        to: SessionRef,
        request: Element,
        sasl2_success: Option<Box<Element>>,
    ) -> Result<Option<Element>, Exit> {
        // What is queued for the client (nothing, normally) goes first.
        self.flush().await?;
        let conn = std::mem::replace(&mut self.conn, Connection::None);
        let handover = Box::new(Handover {
            conn: Box::new(conn),
            peer: self.info.peer,
            secure: self.info.secure,
            request,
            sasl2_success,
        });
        let env = &self.shared.env;
        match env.router.attach(env, &to, handover).await {
            Ok(()) => {
                env.metrics.connections.dec();
                Err(Exit::HandedOver)
            }
            Err(h) => {
                let Handover { conn, request, .. } = *h;
                if let Ok(conn) = conn.downcast::<Connection>() {
                    self.conn = *conn;
                }
                Ok(Some(request))
            }
        }
    }

    /// Leaves the session table and hands what the session still holds
    /// back to the router (see `finish`).
    pub(super) async fn hand_back(&mut self, exit: &Exit) {
        if let Some(jid) = self.info.jid.clone() {
            self.shared.env.sessions.unregister(&jid, self.info.id);
            let metrics = &self.shared.env.metrics;
            metrics.sessions.dec();
            metrics.sessions_on(self.conn.metrics_transport()).dec();
            metrics.sessions_of_domain(jid.domain().as_str()).dec();
            if let Some(host) = self.shared.env.hosts.get(jid.domain().as_str()) {
                host.close_session();
            }
            let mut actions = Vec::new();
            {
                let mut cx =
                    SessionCtx::new(&self.shared.env, &self.info, &mut self.ext, &mut actions);
                run_chain!(
                    self.shared.env.hooks.session_closed,
                    "session_closed",
                    off = self.info.modules_off(),
                    |h| h.session_closed(&mut cx)
                );
            }
            // The stream is gone: only routing effects still make sense.
            let env = &self.shared.env;
            for a in actions {
                match a {
                    Action::Route(s) => env.route(s).await,
                    Action::Reroute(s) => env.router.reroute(env, s).await,
                    _ => {}
                }
            }
            tracing::info!(session = self.info.id, jid = %jid, reason = %exit.reason(), "session closed");
        }
        // Stanzas still queued for this session go back to the router, now
        // that the session is unregistered: messages reach another resource
        // or offline handling (RFC 6121 §8.5.3.2.1), iq requests are bounced.
        self.mailbox.close();
        let env = &self.shared.env;
        while let Some(msg) = self.mailbox.try_recv() {
            if let SessionMsg::Stanza(s) = msg {
                env.router.reroute(env, *s).await;
            }
        }
    }
}
