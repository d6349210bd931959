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

mod handover;
mod negotiation;
mod sasl;

use super::C2sShared;
use crate::transport::connection::{Closing, Connection, Inbound, IoEnd, XmlStream};
use crate::transport::tcp::Transport;
use crate::transport::websocket::WsConn;
use sasl::SaslState;
use starling_core::hooks::{ElementStage, FeatureStage, IqResponse, Outgoing, OwnIqHandler};
use starling_core::{
    mailbox, run_chain, Action, CloseReason, Extensions, Flow, Handover, HandoverGate, Mailbox,
    Pressure, SessionCtx, SessionHandle, SessionInfo, SessionMsg, SessionRef, SessionState,
    TimerKey, TooManyResources,
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

/// Stanzas a session handles from one read before it lets the other tasks
/// of its worker run (see [`Session::on_input`]).
const FAIR_SLICE: usize = 16;

/// Stanzas a session may handle in one episode of storage pressure before
/// it stops reading until the pressure is relieved (see
/// `Session::reads_under_pressure`).
const PRESSURE_QUOTA: u32 = 32;

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
    /// The storage-pressure episode this session counts in, and the
    /// stanzas it has handled since it began (see `reads_under_pressure`).
    pressure_read: (u32, u32),
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
            pressure_read: (0, 0),
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
            // past its quota for this episode, stop reading, keep
            // delivering, resume when it is relieved.
            let pressed = pressure.is_high() && !self.reads_under_pressure(&pressure);
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

    /// Whether this session still reads while storage is under pressure:
    /// until it has handled [`PRESSURE_QUOTA`] stanzas in this episode.
    /// Someone chatting sends a few in an episode and is served as usual;
    /// a flooder uses its quota at once and waits for the relief, slowed
    /// by TCP — fairly: every sender gets the same quota per episode. The
    /// write-behind queues stay bounded whatever the quota lets through
    /// (past their limit a write waits for room).
    fn reads_under_pressure(&mut self, pressure: &Pressure) -> bool {
        let episode = pressure.episode();
        if self.pressure_read.0 != episode {
            self.pressure_read = (episode, 0);
        }
        self.pressure_read.1 < PRESSURE_QUOTA
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
        let mut handled = 0usize;
        loop {
            let event = match self.conn.next_event() {
                Ok(Some(ev)) => ev,
                Ok(None) => return Ok(()),
                Err(e) => return Err(Exit::Error(e)),
            };
            match event {
                Inbound::Open(h) => self.on_header(h)?,
                Inbound::Close => return Err(Exit::ClientClosed),
                Inbound::Element(el) => {
                    self.on_element(el).await?;
                    handled += 1;
                    self.pressure_read.1 = self.pressure_read.1.saturating_add(1);
                    if handled.is_multiple_of(FAIR_SLICE) {
                        // Fairness between senders: one read can hold
                        // hundreds of stanzas, and handling them all in
                        // one turn made every other session on this worker
                        // wait for it (a flood of ten senders put 180 ms
                        // p50 on a hundred people chatting beside them,
                        // bench/fairness.sh). After a slice, the others'
                        // turn; the rest of this read waits, and a sender
                        // that keeps the socket full is slowed by TCP.
                        tokio::task::yield_now().await;
                    }
                }
            }
        }
    }

    // ----- stream headers and features (RFC 6120 §4.3, §4.7) -----

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
