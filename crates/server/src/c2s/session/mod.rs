//! The c2s session task: RFC 6120 negotiation and the stanza loop.
//!
//! The session's life is [`SessionState`] (`info.state`): `PreAuth` while
//! the stream is negotiated, `Authenticated` after SASL, `Established` once
//! a resource is bound, `Closing` at the end. Within `PreAuth`:
//!
//! ```text
//! connected ──header──► features ──starttls──► (TLS) ──restart──► features
//!                          │                                         │
//!                          └──────────────auth (SASL)────────────────┘
//!                                              │ success → restart
//!                                              ▼
//!              Authenticated: features(bind) ──bind──► Established (hooks)
//! ```
//!
//! Every stanza of an established session goes through the `user_send`
//! hooks and then to the router; every stanza routed to the session goes
//! through `user_receive` and then to the socket. Modules request effects
//! ([`Action`]s) which this task applies; no module ever holds the socket.

mod sasl;

use super::C2sShared;
use crate::transport::connection::{Closing, Connection, Inbound, IoEnd, XmlStream};
use crate::transport::tcp::Transport;
use crate::transport::websocket::WsConn;
use sasl::SaslState;
use starling_core::hooks::{ElementStage, FeatureStage, IqResponse, Outgoing, OwnIqHandler};
use starling_core::{
    mailbox, run_chain, Action, CloseReason, Extensions, Flow, Handover, HandoverGate, Mailbox,
    SessionCtx, SessionHandle, SessionInfo, SessionMsg, SessionRef, SessionState, TimerKey,
    TooManyResources,
};
use starling_proto::sasl::ChannelBindings;
use starling_proto::{
    ns, random_id, BareJid, FullJid, Jid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind,
    StanzaParseError, StreamError, StreamErrorCondition,
};
use starling_xml::{Element, StreamHeader};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::sleep_until;

/// How a session ends.
#[derive(Debug)]
pub(super) enum Exit {
    /// We close the stream with this error (RFC 6120 §4.9).
    Error(StreamError),
    /// The client closed its stream; we close ours (§4.4).
    ClientClosed,
    /// The connection ended without a closing handshake, for this reason.
    Io(IoEnd),
    /// A detached session was not resumed in time (XEP-0198).
    ResumeTimeout,
    /// This session handed its connection to another one (XEP-0198
    /// resumption) and ends without touching it.
    HandedOver,
}

impl Exit {
    pub(super) fn error(c: StreamErrorCondition, text: impl Into<String>) -> Exit {
        Exit::Error(StreamError::with_text(c, text))
    }

    /// The `reason` field of the "session closed" log line.
    pub(super) fn reason(&self) -> &'static str {
        match self {
            Exit::Error(_) => "stream_error",
            Exit::ClientClosed => "client_closed",
            Exit::Io(IoEnd::Eof) => "connection_closed",
            Exit::Io(IoEnd::ReadError) => "read_error",
            Exit::Io(IoEnd::WriteError) => "write_error",
            Exit::Io(IoEnd::WriteTimeout) => "write_timeout",
            Exit::Io(IoEnd::Tls) => "tls_failed",
            Exit::ResumeTimeout => "resumption_timeout",
            Exit::HandedOver => "resumed_elsewhere",
        }
    }
}

/// The session task's state.
pub(crate) struct Session {
    pub(super) shared: Arc<C2sShared>,
    /// The client's connection: framing, TLS, parsing, output buffering.
    pub(super) conn: Connection,
    pub(super) info: SessionInfo,
    pub(super) ext: Extensions,
    /// Our own sender, handed to the session table at bind time. Holding it
    /// also keeps `mailbox.recv()` from ever returning `None`.
    handle: SessionHandle,
    mailbox: Mailbox,
    pub(super) sasl: SaslState,
    /// The SASL2 `<authenticate/>` in progress (XEP-0388; `None` during an
    /// RFC 6120 exchange), for its inline requests.
    pub(super) sasl2_request: Option<Box<Element>>,
    /// The FAST token this stream authenticated with: its slot matters when
    /// a new one is issued, and one past half its life is rotated.
    pub(super) fast_used: Option<starling_core::storage::FastToken>,
    pub(super) auth_failures: u32,
    pub(super) bindings: ChannelBindings,
    /// When a traffic observer wants its `before_flush` again.
    flush_check_at: Option<Instant>,
    connected_at: Instant,
    timers: Vec<(Instant, TimerKey)>,
    /// A traffic observer's bound was exceeded: the session ends.
    overflow: bool,
}

/// Runs one client connection to completion.
///
/// The task's future is what an idle session costs, so it holds only the
/// boxed session and its loop: the TLS handshake and the setup run in a
/// boxed future of their own, freed once the session starts.
pub(crate) async fn run(
    shared: Arc<C2sShared>,
    tcp: TcpStream,
    peer: SocketAddr,
    direct_tls: bool,
    mut shutdown: watch::Receiver<bool>,
) {
    let start = Box::pin(connect(shared, tcp, peer, direct_tls));
    let Some(session) = start.await else {
        return;
    };
    session.run_to_end(&mut shutdown).await;
}

/// Counts the connection in, completes direct TLS if asked for, and builds
/// the session (`None`: the handshake failed).
async fn connect(
    shared: Arc<C2sShared>,
    tcp: TcpStream,
    peer: SocketAddr,
    direct_tls: bool,
) -> Option<Box<Session>> {
    count_connection(&shared);
    let metrics = &shared.env.metrics;
    let transport = if direct_tls {
        let Some(tls) = shared.tls.as_ref() else {
            metrics.connections.dec();
            return None;
        };
        match tokio::time::timeout(shared.negotiation_timeout, tls.direct.accept(tcp)).await {
            Ok(Ok(s)) => Transport::Tls(Box::new(s)),
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "direct TLS handshake failed");
                metrics.connections.dec();
                return None;
            }
            Err(_) => {
                tracing::debug!(%peer, "direct TLS handshake timed out");
                metrics.connections.dec();
                return None;
            }
        }
    } else {
        Transport::Plain(tcp)
    };
    let conn = Connection::Stream(
        XmlStream::new(transport, shared.limits, shared.read_limits())
            .with_preauth_cap(shared.preauth_stanza_bytes),
    );
    let mut session = Session::new(shared.clone(), conn, peer);
    if let Some(ctx) = shared.tls.as_ref().filter(|_| session.info.secure) {
        session.bindings = session.conn.channel_bindings(ctx);
    }
    Some(session)
}

/// Runs one RFC 7395 WebSocket connection to completion. `secure`: the
/// WebSocket came over TLS, or from a peer the HTTP listener trusts as
/// such (see `transport/http.rs`).
pub(crate) async fn run_websocket(
    shared: Arc<C2sShared>,
    ws: crate::transport::websocket::WsStream,
    peer: SocketAddr,
    secure: bool,
    bindings: Option<Arc<ChannelBindings>>,
    mut shutdown: watch::Receiver<bool>,
) {
    count_connection(&shared);
    let conn = Connection::WebSocket(Box::new(WsConn::new(
        ws,
        shared.limits,
        shared.read_limits(),
        shared.preauth_stanza_bytes,
        secure,
    )));
    let mut session = Session::new(shared, conn, peer);
    // wss: the TLS connection's bindings, for SCRAM -PLUS (RFC 5802 §6).
    if let Some(b) = bindings {
        session.bindings = (*b).clone();
    }
    session.run_to_end(&mut shutdown).await;
}

/// Runs one BOSH session (XEP-0206) to completion; see `bosh.rs`.
pub(crate) async fn run_bosh(
    shared: Arc<C2sShared>,
    conn: crate::transport::bosh::BoshConn,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) {
    count_connection(&shared);
    Session::new(shared, Connection::Bosh(Box::new(conn)), peer)
        .run_to_end(&mut shutdown)
        .await;
}

/// Counts a new client connection in (`finish` counts it out).
fn count_connection(shared: &C2sShared) {
    shared.env.metrics.connections.inc();
    shared.env.metrics.connections_total.inc();
}

impl Session {
    fn new(shared: Arc<C2sShared>, conn: Connection, peer: SocketAddr) -> Box<Session> {
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (handle, mailbox) = mailbox(id, shared.mailbox_size, shared.mailbox_bytes);
        let now = Instant::now();
        let secure = conn.is_secure();
        let transport = conn.metrics_transport();
        Box::new(Session {
            conn,
            info: SessionInfo {
                id,
                stream_id: String::new(),
                peer,
                domain: String::new(),
                secure,
                state: SessionState::PreAuth,
                user: None,
                jid: None,
                priority: None,
                last_inbound: now,
                transport,
                modules_off: None,
            },
            shared,
            ext: Extensions::new(),
            handle,
            mailbox,
            sasl: SaslState::Idle,
            sasl2_request: None,
            fast_used: None,
            auth_failures: 0,
            bindings: ChannelBindings::default(),
            flush_check_at: None,
            connected_at: now,
            timers: Vec::new(),
            overflow: false,
        })
    }

    /// Runs the session until it ends, then cleans up. `finish` counts the
    /// connection out if the session still has one (a detached session
    /// lost it earlier, a resumed one handed it on).
    async fn run_to_end(mut self: Box<Self>, shutdown: &mut watch::Receiver<bool>) {
        let exit = self.run_loop(shutdown).await;
        // Boxed (and bound first, so the unboxed future is not a temporary
        // kept across the await): closing is rare and its state large.
        let finish = Box::pin(self.finish(exit));
        finish.await;
    }

    /// True when a module's timer is due now.
    fn timer_due(&self) -> bool {
        !self.timers.is_empty() && {
            let now = Instant::now();
            self.timers.iter().any(|(t, _)| *t <= now)
        }
    }

    /// The earliest instant at which something time-based must happen.
    fn next_deadline(&self) -> Option<Instant> {
        let negotiation = if !self.info.state.is_bound() {
            Some(self.connected_at + self.shared.negotiation_timeout)
        } else {
            None
        };
        let timers = self.timers.iter().map(|(t, _)| *t).min();
        let detached = match self.info.state {
            SessionState::Detached { until } => Some(until),
            _ => None,
        };
        [
            negotiation,
            timers,
            detached,
            self.conn.deadline(),
            self.flush_check_at,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The session's main loop. The handlers of its branches are boxed: the
    /// loop's own future lives as long as the session, and an idle session
    /// should hold only what waiting needs, not room for the deepest
    /// stanza-processing state (measured: 3.3 KB → about 1 KB per session;
    /// one short-lived allocation per read or delivery instead).
    async fn run_loop(&mut self, shutdown: &mut watch::Receiver<bool>) -> Exit {
        if *shutdown.borrow() {
            return Exit::Error(StreamError::new(StreamErrorCondition::SystemShutdown));
        }
        let pressure = self.shared.env.pressure.clone();
        loop {
            let deadline = self.next_deadline();
            let far = Instant::now() + Duration::from_secs(86_400);
            // Storage back-pressure (a write-behind queue is congested):
            // stop reading, keep delivering, resume when it is relieved.
            let pressed = pressure.is_high();
            let reading = self.conn.can_read() && !pressed;
            // A BOSH client that stopped polling: its stanzas wait in the
            // mailbox (senders get <resource-constraint/> once it is full).
            let delivering = self.conn.can_take_output();
            let drain = if delivering {
                None
            } else {
                self.conn.drain_waiter()
            };
            let timer_due = self.timer_due();
            let step = tokio::select! {
                biased;
                _ = shutdown.changed() => Err(Exit::Error(StreamError::with_text(
                    StreamErrorCondition::SystemShutdown,
                    "the server is shutting down; reconnect in a moment",
                ))),
                // A module's due timer runs before the next delivery: the
                // offline module's zero-delay timer, set when the session
                // becomes available, writes the stored messages before any
                // newer one routed live to the session meanwhile.
                () = std::future::ready(()), if timer_due => Box::pin(self.on_deadline()).await,
                msg = self.mailbox.recv(), if delivering => Box::pin(self.on_mailbox(msg)).await,
                () = async { if let Some(d) = &drain { d.output_drained().await } }, if drain.is_some() => Ok(()),
                read = self.conn.read(), if reading => match read {
                    Ok(()) => Box::pin(self.on_input()).await,
                    Err(end) => Err(Exit::Io(end)),
                },
                _ = sleep_until(deadline.unwrap_or(far).into()) => Box::pin(self.on_deadline()).await,
                _ = pressure.relieved(), if pressed => Ok(()),
            };
            let step = step.and_then(|()| self.check_overflow());
            if let Err(exit) = step {
                if self.detach(&exit) {
                    continue;
                }
                return exit;
            }
            // Coalesce: deliver what else is queued before one flush (a due
            // timer goes first, see above).
            for _ in 0..64 {
                if self.timer_due() || !self.conn.can_take_output() {
                    break;
                }
                match self.mailbox.try_recv() {
                    Some(msg) => {
                        let step = Box::pin(self.on_mailbox(msg)).await;
                        if let Err(exit) = step.and_then(|()| self.check_overflow()) {
                            if self.detach(&exit) {
                                break;
                            }
                            return exit;
                        }
                    }
                    None => break,
                }
            }
            self.before_flush();
            if let Err(exit) = self.flush().await {
                if self.detach(&exit) {
                    continue;
                }
                return exit;
            }
        }
    }

    /// The connection of an established session is gone (`exit` is an I/O
    /// end): if a module wants the session kept (XEP-0198 resumption), it
    /// becomes detached and this returns true.
    fn detach(&mut self, exit: &Exit) -> bool {
        // A client that stopped answering pings has a dead connection too.
        let lost = match exit {
            Exit::Io(_) => true,
            Exit::Error(e) => e.condition == StreamErrorCondition::ConnectionTimeout,
            _ => false,
        };
        if !lost || self.info.state != SessionState::Established {
            return false;
        }
        let keep = self
            .shared
            .env
            .hooks
            .connection_lost
            .iter()
            .filter_map(|h| h.connection_lost(&self.info, &mut self.ext))
            .max();
        let Some(keep) = keep else {
            return false;
        };
        let metrics = &self.shared.env.metrics;
        metrics.sessions_on(self.conn.metrics_transport()).dec();
        metrics
            .sessions_on(starling_core::SessionTransport::Detached)
            .inc();
        self.info.transport = starling_core::SessionTransport::Detached;
        if let Exit::Error(e) = exit {
            // Best effort: tell the (probably dead) connection why.
            let e = e.clone();
            let mut conn = std::mem::replace(&mut self.conn, Connection::None);
            tokio::spawn(
                async move { conn.close(Closing::Error(&e), Duration::from_secs(1)).await },
            );
        }
        self.conn.discard_output();
        self.conn = Connection::None;
        self.info.state = SessionState::Detached {
            until: Instant::now() + keep,
        };
        // A new resource beyond the account's limit may take its place.
        self.handle.set_detached(true);
        self.shared.env.metrics.connections.dec();
        tracing::info!(session = self.info.id, jid = ?self.info.jid.as_ref().map(|j| j.to_string()), reason = %exit.reason(), keep_secs = keep.as_secs(), "connection lost; session detached until resumed or expired");
        true
    }

    /// Ends the session once a traffic observer's bound was exceeded.
    fn check_overflow(&self) -> Result<(), Exit> {
        if self.overflow {
            return Err(Exit::error(
                StreamErrorCondition::PolicyViolation,
                "too many unacknowledged stanzas; acknowledge what you receive (XEP-0198)",
            ));
        }
        Ok(())
    }

    /// Lets the traffic observers add elements (ack requests) before a flush.
    fn before_flush(&mut self) {
        self.flush_check_at = None;
        let hooks = &self.shared.env.hooks;
        if hooks.traffic.is_empty()
            || self.info.state != SessionState::Established
            || !self.conn.is_live()
        {
            return;
        }
        let mut out = Vec::new();
        for t in &hooks.traffic {
            if let Some(at) = t.before_flush(&self.info, &mut self.ext, &mut out) {
                self.flush_check_at = Some(self.flush_check_at.map_or(at, |c| c.min(at)));
            }
        }
        for el in &out {
            self.conn.send(el);
        }
    }

    async fn on_deadline(&mut self) -> Result<(), Exit> {
        let now = Instant::now();
        // A due traffic-observer check (`flush_check_at`) needs nothing
        // here: the loop's before_flush runs after this step.
        self.conn.on_deadline(now);
        if matches!(self.info.state, SessionState::Detached { until } if now >= until) {
            return Err(Exit::ResumeTimeout);
        }
        if !self.info.state.is_bound() && now >= self.connected_at + self.shared.negotiation_timeout
        {
            return Err(Exit::error(
                StreamErrorCondition::ConnectionTimeout,
                "authentication and resource binding took too long",
            ));
        }
        let mut due = Vec::new();
        self.timers.retain(|(t, k)| {
            if *t <= now {
                due.push(*k);
                false
            } else {
                true
            }
        });
        for key in due {
            self.run_timer(key).await?;
        }
        Ok(())
    }

    /// Runs the timer handler of `key.module` (its timer fired, or
    /// [`SessionMsg::Notify`] asked for it).
    async fn run_timer(&mut self, key: TimerKey) -> Result<(), Exit> {
        let Some(handler) = self.shared.env.hooks.timer(key.module).cloned() else {
            return Ok(());
        };
        let mut actions = Vec::new();
        let result = {
            let mut cx = SessionCtx::new(&self.shared.env, &self.info, &mut self.ext, &mut actions);
            handler.timer(&mut cx, key.token).await
        };
        if let Err(e) = result {
            starling_core::hooks::log_failure("timer", key.module, &e);
        }
        self.apply(actions).await
    }

    /// Handles every event of the input read so far.
    async fn on_input(&mut self) -> Result<(), Exit> {
        self.info.last_inbound = Instant::now();
        loop {
            let event = match self.conn.next_event() {
                Ok(Some(ev)) => ev,
                Ok(None) => return Ok(()),
                Err(e) => return Err(Exit::Error(e)),
            };
            match event {
                Inbound::Open(h) => self.on_header(h)?,
                Inbound::Close => return Err(Exit::ClientClosed),
                Inbound::Element(el) => self.on_element(el).await?,
            }
        }
    }

    // ----- stream headers and features (RFC 6120 §4.3, §4.7) -----

    fn on_header(&mut self, h: StreamHeader) -> Result<(), Exit> {
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

    fn module_features(&self, stage: FeatureStage, out: &mut Vec<Element>) {
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

    async fn on_element(&mut self, el: Element) -> Result<(), Exit> {
        if !self.info.state.is_authenticated() {
            // Negotiation runs once per stream: boxed so the idle session
            // future does not reserve room for its (large) state.
            return Box::pin(self.on_unauthenticated(el)).await;
        }
        if el.ns() != ns::CLIENT {
            let stage = if self.info.state.is_bound() {
                ElementStage::Established
            } else {
                ElementStage::Authenticated
            };
            if self.on_module_element(stage, &el).await? {
                return Ok(());
            }
            return Err(Exit::error(
                StreamErrorCondition::UnsupportedStanzaType,
                format!(
                    "unexpected element {{{}}}{} after authentication",
                    el.ns(),
                    el.name()
                ),
            ));
        }
        if self.info.state.is_bound() && !self.shared.env.hooks.traffic.is_empty() {
            for t in &self.shared.env.hooks.traffic {
                t.stanza_in(&self.info, &mut self.ext);
            }
        }
        if el.name() == "iq" && el.attr("type") == Some("set") {
            if el.has_child("bind", ns::BIND) {
                return Box::pin(self.on_bind(el)).await;
            }
            if el.has_child("session", ns::SESSION) {
                // Legacy session establishment (RFC 3921 §3): a no-op today.
                let mut reply = Element::new("iq", ns::CLIENT);
                reply.set_attr("type", "result");
                if let Some(id) = el.attr("id") {
                    reply.set_attr("id", id);
                }
                self.write_element(reply);
                return Ok(());
            }
        }
        if !self.info.state.is_bound() {
            return Err(Exit::error(
                StreamErrorCondition::NotAuthorized,
                "bind a resource before sending stanzas (RFC 6120 §7)",
            ));
        }
        self.on_stanza(el).await
    }

    async fn on_unauthenticated(&mut self, el: Element) -> Result<(), Exit> {
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
    async fn on_module_element(&mut self, stage: ElementStage, el: &Element) -> Result<bool, Exit> {
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

    async fn on_starttls(&mut self) -> Result<(), Exit> {
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

    async fn on_bind(&mut self, el: Element) -> Result<(), Exit> {
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
    fn admit(&self, full: &FullJid) -> Result<(), &'static str> {
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
                super::fast::stable_resource_id(key, user, agent, tag)
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

    fn sasl_user(&self) -> Option<BareJid> {
        match &self.sasl {
            SaslState::Done(j) => Some(j.clone()),
            _ => None,
        }
    }

    // ----- stanzas of an established session -----

    async fn on_stanza(&mut self, mut el: Element) -> Result<(), Exit> {
        let full = self.info.jid.clone().expect("checked by caller");
        // RFC 6120 §8.1.2.1 rule 1: the server sets 'from' itself.
        if let Some(claimed) = el.remove_attr("from") {
            if claimed != full.as_str() && claimed != full.to_bare().as_str() {
                tracing::debug!(session = self.info.id, jid = %full, claimed = %claimed, "rewrote spoofed 'from'");
            }
        }
        let mut stanza = match Stanza::from_element(el.clone()) {
            Ok(s) => s,
            Err(StanzaParseError::UnsupportedElement(name)) => {
                return Err(Exit::error(
                    StreamErrorCondition::UnsupportedStanzaType,
                    format!("unknown stanza element {name}"),
                ))
            }
            Err(StanzaParseError::MalformedTo(why)) => {
                self.write_raw_error(
                    &el,
                    StanzaError::new(StanzaErrorCondition::JidMalformed).with_text(why),
                );
                return Ok(());
            }
            Err(StanzaParseError::BadIq) => {
                self.write_raw_error(
                    &el,
                    StanzaError::new(StanzaErrorCondition::BadRequest)
                        .with_text("an iq needs an id and a type of get, set, result or error"),
                );
                return Ok(());
            }
            Err(StanzaParseError::MalformedFrom(_)) => {
                // Cannot happen ('from' was removed above); answer, don't panic.
                self.write_raw_error(&el, StanzaError::new(StanzaErrorCondition::BadRequest));
                return Ok(());
            }
        };
        stanza.set_from(Some(Jid::from(full)));
        self.shared.env.metrics.stanza_in(stanza.kind());
        let mut actions = Vec::new();
        let flow = {
            let mut cx = SessionCtx::new(&self.shared.env, &self.info, &mut self.ext, &mut actions);
            run_chain!(
                self.shared.env.hooks.user_send,
                "user_send",
                off = self.info.modules_off(),
                |h| h.user_send(&mut cx, &mut stanza)
            )
        };
        self.apply(actions).await?;
        if flow == Flow::Continue {
            if let Some(handler) = self.own_iq_handler(&stanza) {
                return self.answer_own_iq(handler, &stanza).await;
            }
            self.shared.env.route(stanza).await;
        }
        Ok(())
    }

    /// The handler of an iq request to the user's own account (no `to`,
    /// or `to` the bare JID), if a module answers that payload in-session.
    fn own_iq_handler(&self, stanza: &Stanza) -> Option<Arc<dyn OwnIqHandler>> {
        if stanza.kind() != StanzaKind::Iq || !stanza.is_iq_request() {
            return None;
        }
        if let Some(to) = stanza.to() {
            let me = self.info.jid.as_ref()?;
            if to.resource().is_some() || to.to_bare() != me.to_bare() {
                return None;
            }
        }
        let p = stanza.payload()?;
        self.shared
            .env
            .hooks
            .own_iq_handler(p.name(), p.ns(), self.info.modules_off())
            .cloned()
    }

    async fn answer_own_iq(
        &mut self,
        handler: Arc<dyn OwnIqHandler>,
        iq: &Stanza,
    ) -> Result<(), Exit> {
        let mut actions = Vec::new();
        {
            let mut cx = SessionCtx::new(&self.shared.env, &self.info, &mut self.ext, &mut actions);
            match handler.own_iq(&mut cx, iq).await {
                IqResponse::Result(p) => cx.send(iq.iq_result(p).into_element()),
                IqResponse::Error(e) => cx.reply_error(iq, e),
                IqResponse::Handled => {}
            }
        }
        self.apply(actions).await
    }

    async fn on_mailbox(&mut self, msg: SessionMsg) -> Result<(), Exit> {
        match msg {
            SessionMsg::Stanza(stanza) => {
                let mut stanza = *stanza;
                let mut actions = Vec::new();
                let flow = {
                    let mut cx =
                        SessionCtx::new(&self.shared.env, &self.info, &mut self.ext, &mut actions);
                    run_chain!(
                        self.shared.env.hooks.user_receive,
                        "user_receive",
                        off = self.info.modules_off(),
                        |h| h.user_receive(&mut cx, &mut stanza)
                    )
                };
                self.apply(actions).await?;
                if flow == Flow::Continue {
                    self.shared.env.metrics.stanza_out(stanza.kind());
                    let mark = self.conn.wire_mark();
                    self.conn.send_stanza(&stanza);
                    self.observe_out(stanza.element(), mark);
                }
                Ok(())
            }
            SessionMsg::Close(CloseReason::Replaced) => Err(Exit::error(
                StreamErrorCondition::Conflict,
                "replaced by a new session with the same resource",
            )),
            SessionMsg::Close(CloseReason::Error(e)) => Err(Exit::Error(*e)),
            SessionMsg::Attach(h) => self.on_attach(h).await,
            SessionMsg::Notify(key) => self.run_timer(*key).await,
        }
    }

    /// A resuming client's connection arrives (XEP-0198 §5): it replaces
    /// ours, if we still have one, and the modules answer the request.
    async fn on_attach(&mut self, h: Box<Handover>) -> Result<(), Exit> {
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
    async fn run_attached(&mut self, request: &Element, failed: bool) -> Result<(), Exit> {
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

    /// Tells the traffic observers about an element written for the
    /// client since `mark` (one of them may keep its wire form).
    fn observe_out(&mut self, el: &Element, mark: Option<usize>) {
        if !self.info.state.is_bound() || self.shared.env.hooks.traffic.is_empty() {
            return;
        }
        let out = Outgoing::new(el, self.conn.wire_since(mark));
        for t in &self.shared.env.hooks.traffic {
            self.overflow |= t.element_out(&self.info, &mut self.ext, &out);
        }
    }

    /// Hands our connection to session `to` (XEP-0198 resumption). On
    /// success this session ends; if `to` is gone, the attach handlers hear
    /// of the failure and the connection stays ours.
    async fn hand_over(&mut self, to: SessionRef, request: Element) -> Result<(), Exit> {
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

    fn write_iq_error(&mut self, id: &str, cond: StanzaErrorCondition, text: &str) {
        let mut reply = Element::new("iq", ns::CLIENT);
        reply.set_attr("type", "error");
        reply.set_attr("id", id);
        reply.append_child(StanzaError::new(cond).with_text(text).to_element());
        self.write_element(reply);
    }

    /// An error reply for an element that could not even be parsed as a
    /// stanza (so `Stanza::error_reply` is not available).
    fn write_raw_error(&mut self, el: &Element, err: StanzaError) {
        if el.attr("type") == Some("error") {
            return;
        }
        let mut reply = Element::new(el.name(), ns::CLIENT);
        reply.set_attr("type", "error");
        if let Some(id) = el.attr("id") {
            reply.set_attr("id", id);
        }
        reply.append_child(err.to_element());
        self.write_element(reply);
    }

    pub(super) async fn flush(&mut self) -> Result<(), Exit> {
        match self.conn.flush(self.shared.write_timeout).await {
            Ok(()) => Ok(()),
            Err(IoEnd::WriteTimeout) => {
                let secs = self.shared.write_timeout.as_secs();
                if self.info.jid.is_some() {
                    tracing::info!(session = self.info.id, peer = %self.info.peer, timeout_secs = secs, "client stopped reading; dropping session");
                } else {
                    // Unauthenticated: anyone can cause it at will.
                    starling_core::log_throttled!(info, session = self.info.id, peer = %self.info.peer, timeout_secs = secs, "client stopped reading; dropping session");
                }
                Err(Exit::Io(IoEnd::WriteTimeout))
            }
            Err(end) => Err(Exit::Io(end)),
        }
    }

    /// Closes the stream as `exit` says, then cleans up.
    async fn finish(mut self: Box<Self>, exit: Exit) {
        self.info.state = SessionState::Closing;
        let close_timeout = self.shared.write_timeout.min(Duration::from_secs(5));
        if self.conn.is_live() {
            self.shared.env.metrics.connections.dec();
        }
        match &exit {
            Exit::Error(e) => {
                self.conn
                    .open_stream(&self.info.stream_id, &self.info.domain);
                self.shared.env.metrics.stream_errors.inc();
                let text = e.text.as_deref().unwrap_or("");
                match &self.info.jid {
                    Some(jid) => {
                        tracing::info!(session = self.info.id, peer = %self.info.peer, jid = %jid, condition = %e.condition, text, "closing stream with error");
                    }
                    // Before authentication anyone can cause this at will
                    // (malformed XML, timeouts): one line per 10 s at most,
                    // counting the others; `starling_stream_errors_total`
                    // counts every one.
                    None => {
                        starling_core::log_throttled!(info, session = self.info.id, peer = %self.info.peer, condition = %e.condition, text, "closing stream with error");
                    }
                }
                self.conn.close(Closing::Error(e), close_timeout).await;
            }
            Exit::ClientClosed => self.conn.close(Closing::Close, close_timeout).await,
            Exit::Io(_) | Exit::ResumeTimeout | Exit::HandedOver => self.conn.discard_output(),
        }
        // What this session still holds (unacknowledged stanzas, its
        // mailbox) goes back to the router; until it has, the account's
        // new messages wait, so none overtakes an older one
        // (starling_core::HandoverGate). Taken before leaving the table.
        match self.info.jid.as_ref().map(|j| j.to_bare()) {
            Some(owner) => {
                let env = self.shared.env.clone();
                let _handover = env.handover.begin(&owner).await;
                HandoverGate::scope(owner, self.hand_back(&exit)).await
            }
            None => self.hand_back(&exit).await,
        }
    }

    /// Leaves the session table and hands what the session still holds
    /// back to the router (see `finish`).
    async fn hand_back(&mut self, exit: &Exit) {
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

/// Splits handler actions into the elements they would write to the
/// client (for a SASL2 `<success/>` or a Bind 2 `<bound/>` to carry
/// instead) and the rest.
pub(super) fn take_sends(actions: Vec<Action>) -> (Vec<Element>, Vec<Action>) {
    let mut sends = Vec::new();
    let mut rest = Vec::new();
    for a in actions {
        match a {
            Action::Send(el) => sends.push(el),
            other => rest.push(other),
        }
    }
    (sends, rest)
}
