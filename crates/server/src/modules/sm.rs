//! XEP-0198 Stream Management: acknowledgements and session resumption.
//!
//! Specification: XEP-0198 v1.6 (`urn:xmpp:sm:3`). Sections cited below are
//! that document's.
//!
//! * §3 — `<sm/>` is offered after authentication; `<enable/>` is accepted
//!   once a resource is bound (before: `<failed><unexpected-request/>`, as
//!   is a second `<enable/>`, which ejabberd and Prosody answer the same
//!   way instead of the stream error the text suggests). With
//!   `resume='true'` the answer carries an unguessable id (CSPRNG) and the
//!   granted `max`: the client's `max`, capped at `max_resume_secs`, or
//!   `resume_timeout_secs`.
//! * §4 — both counters wrap at 2^32. `<r/>` is answered with `<a h/>`
//!   **once what the client sent is durable**: the durability handlers
//!   (the archive's write-behind queue) are awaited first, so a client that
//!   forgets a message when it is acknowledged never loses it to a server
//!   crash (docs/durability.md). The server asks for an ack (`<r/>`), one
//!   request at a time, once `request_ack_every` stanzas are unacknowledged
//!   or the oldest is `request_ack_delay_ms` old, in the same write as the
//!   next stanzas (alone only when nothing more is sent, at twice the
//!   delay). An `h` above what was sent closes the stream with
//!   `<undefined-condition/>` and `<handled-count-too-high/>` (§6).
//! * §5 — when the connection of a resumable session is lost (not closed
//!   with `</stream:stream>`), the session stays bound and available,
//!   detached, for the granted time, queueing what arrives. `<resume/>`
//!   after authentication hands the new connection to it if the id is known
//!   **and belongs to the authenticated account** (otherwise
//!   `<failed><item-not-found/>`, the same answer whether or not the id
//!   exists); the old connection, if still open, gets `<conflict/>`.
//!   `<resumed h/>` is followed by every stanza the client's `h` does not
//!   cover.
//! * §4 ("before the session state is discarded") — when a session with
//!   stream management ends, whatever the reason, unacknowledged messages
//!   are handed back to the router with a XEP-0203 delay stamped at their
//!   first sending: another resource or offline storage gets them, as if
//!   the resource had been unavailable; unacknowledged iq requests get
//!   `service-unavailable`. Carbon copies and archive query results are
//!   not re-routed (the originals are delivered or archived elsewhere), nor
//!   is presence (the contacts see the resource go offline instead). Nor
//!   is a message addressed to the bare JID when the archive runs and
//!   another resource of the account is available with at least this
//!   session's priority: that resource got its own copy when the message
//!   was routed (RFC 6121 §8.5.2.1.1 delivers to every highest-priority
//!   resource), or, if it came online later, found it in the archive —
//!   re-routing would show it twice (the case behind ejabberd's
//!   `resend_on_timeout: if_offline`). Messages to this session's full JID
//!   were delivered nowhere else and are always re-routed.
//! * A session whose unacknowledged queue passes `max_queue` stanzas or
//!   `max_queue_bytes` bytes (attached or detached) ends
//!   with `<policy-violation/>` (and its queue is re-routed as above), so
//!   a client that never acks, or stays away, cannot grow it forever.
//!
//! Hooks: element handlers for `urn:xmpp:sm:3` (authenticated and
//! established stages), a traffic observer (counting), connection-lost
//! (detaching), attach (resuming), session-closed (re-routing), a stream
//! feature. Config: `[modules.stream_management]` ([`SmConfig`]).

use serde::Deserialize;
use starling_core::hooks::{
    AttachHandler, ConnectionLostHandler, ElementHandler, ElementStage, FeatureStage, HookRegistry,
    Outgoing, SessionClosedHandler, StreamFeatureProvider, TrafficObserver,
};
use starling_core::module::{Module, ModuleCtx};
use starling_core::{
    async_trait, Action, Env, Extensions, Flow, HookResult, SessionCtx, SessionInfo, SessionRef,
};
use starling_proto::datetime::xep0082_datetime;
use starling_proto::{
    ns, random_id, BareJid, Stanza, StanzaErrorCondition, StreamError, StreamErrorCondition,
};
use starling_xml::Element;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

const NAME: &str = "stream_management";
/// XEP-0198's namespace.
pub const NS_SM: &str = "urn:xmpp:sm:3";

/// `[modules.stream_management]`: XEP-0198.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SmConfig {
    /// Offer stream management.
    pub enabled: bool,
    /// Allow resumption (`resume='true'`).
    pub resume: bool,
    /// Seconds a detached session waits for its client when the client
    /// asks for no particular time.
    pub resume_timeout_secs: u64,
    /// The longest time a client may ask for with `max`.
    pub max_resume_secs: u64,
    /// Unacknowledged stanzas a session may hold before it is ended (and
    /// its queue re-routed).
    pub max_queue: usize,
    /// Bytes of unacknowledged stanzas a session may hold before it is
    /// ended the same way: `max_queue` alone allowed 1000 maximal stanzas
    /// (256 MiB) per detached session.
    pub max_queue_bytes: usize,
    /// The server asks for an ack (`<r/>`) once this many stanzas are
    /// unacknowledged…
    pub request_ack_every: usize,
    /// …or once the oldest unacknowledged stanza is this old (ms).
    pub request_ack_delay_ms: u64,
}

impl Default for SmConfig {
    fn default() -> Self {
        SmConfig {
            enabled: true,
            resume: true,
            resume_timeout_secs: 300,
            max_resume_secs: 3600,
            max_queue: 1000,
            max_queue_bytes: 16 * 1024 * 1024,
            request_ack_every: 32,
            request_ack_delay_ms: 2000,
        }
    }
}

/// The stanzas the client has not acknowledged yet, oldest first, kept as
/// the bytes the connection wrote (the `jabber:client` wire form): one
/// buffer per session, appended to and consumed from the front, so a
/// stanza costs a copy of its bytes and no allocation or tree to free when
/// it is acknowledged (measured: freeing acknowledged trees long after
/// they were written was the largest single cost of stream management).
#[derive(Default)]
struct Unacked {
    /// The stanzas' bytes from `head` on.
    buf: Vec<u8>,
    head: usize,
    /// Each stanza's length and when it was handed to the connection (for
    /// ack requests, and the delay stamp if it is re-routed).
    items: VecDeque<(u32, Instant)>,
    /// The first item's time, kept here too: the ack-request check runs
    /// at every flush and should not touch the queue's (cold) memory.
    oldest: Option<Instant>,
}

/// What an empty queue keeps of its buffer (an idle session holds no
/// more; a busy one regrows it between acks, a few copies per ack).
const KEEP_EMPTY: usize = 1024;

impl Unacked {
    fn len(&self) -> usize {
        self.items.len()
    }

    /// The bytes of the stanzas held.
    fn bytes(&self) -> usize {
        self.buf.len() - self.head
    }

    fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    fn oldest(&self) -> Option<Instant> {
        self.oldest
    }

    fn push(&mut self, out: &Outgoing<'_>, at: Instant) {
        if self.head > 0 && self.head >= self.buf.len() / 2 {
            self.buf.drain(..self.head);
            self.head = 0;
        }
        self.oldest.get_or_insert(at);
        let start = self.buf.len();
        out.write_wire(&mut self.buf);
        let len = u32::try_from(self.buf.len() - start).unwrap_or(u32::MAX);
        self.items.push_back((len, at));
    }

    /// Forgets the `n` oldest.
    fn drop_front(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        for (len, _) in self.items.drain(..n) {
            self.head += len as usize;
        }
        self.oldest = self.items.front().map(|&(_, at)| at);
        if self.is_empty() {
            self.head = 0;
            if self.buf.capacity() > KEEP_EMPTY {
                self.buf = Vec::new();
            } else {
                self.buf.clear();
            }
            if self.items.capacity() > 64 {
                self.items = VecDeque::new();
            }
        }
    }

    /// Gives back the buffer's unused room (a detached session's queue).
    fn shrink(&mut self) {
        self.buf.drain(..self.head);
        self.head = 0;
        self.buf.shrink_to_fit();
        self.items.shrink_to_fit();
    }

    /// Each stanza's bytes and when it was sent, oldest first.
    fn iter(&self) -> impl Iterator<Item = (&[u8], Instant)> {
        let mut at = self.head;
        self.items.iter().map(move |&(len, sent)| {
            let bytes = &self.buf[at..at + len as usize];
            at += len as usize;
            (bytes, sent)
        })
    }
}

/// Parses a queued stanza back into a tree (re-routing, rare). The bytes
/// are our own serialisation of a tree, so no input limit applies: a
/// stanza larger or deeper than the defaults (the c2s limits are
/// configurable) must come back whole.
fn parse_wire(wire: &[u8]) -> Option<Element> {
    let limits = starling_xml::Limits {
        max_stanza_bytes: wire.len() + 1,
        max_depth: usize::MAX,
        max_attributes: usize::MAX,
        ..starling_xml::Limits::default()
    };
    let mut parser = starling_xml::StreamParser::for_elements(limits);
    let mut input = wire;
    match parser.push(&mut input) {
        Ok(Some(starling_xml::StreamEvent::Stanza(el))) => Some(el),
        other => {
            tracing::error!(bytes = wire.len(), result = ?other.map(|_| ()), "an unacknowledged stanza could not be read back for re-routing");
            None
        }
    }
}

/// Per-session state, once `<enable/>` succeeded.
struct SmState {
    /// Stanzas handled from the client ('h' we report), mod 2^32.
    h_in: u32,
    /// Stanzas sent to the client, mod 2^32.
    sent: u32,
    /// The client's last 'h'.
    acked: u32,
    /// Sent and not acknowledged, oldest first.
    unacked: Unacked,
    /// Our `<r/>` awaits its `<a/>`.
    requested: bool,
    /// `sent` at the last flush: a flush with more carries stanzas, and an
    /// ack request due then rides along with them.
    sent_at_flush: u32,
    /// The resumption id, if the session is resumable.
    resume_id: Option<String>,
    /// How long the session is kept detached.
    keep: Duration,
    /// The queue passed `max_queue` or `max_queue_bytes`.
    overflow: bool,
}

/// Resumable sessions: resumption id → (account, session).
type Registry = Mutex<HashMap<String, (BareJid, SessionRef)>>;

/// The module.
pub struct StreamManagement {
    cfg: SmConfig,
    resumable: Registry,
    /// The archive module runs (late resources find bare-JID messages
    /// there).
    archive: bool,
}

impl StreamManagement {
    /// Registers the module's hooks.
    pub fn register(cfg: &SmConfig, archive: bool, reg: &mut HookRegistry) {
        let m = Arc::new(StreamManagement {
            cfg: cfg.clone(),
            resumable: Mutex::new(HashMap::new()),
            archive,
        });
        reg.element(NAME, ElementStage::Authenticated, NS_SM, m.clone());
        reg.element(NAME, ElementStage::Established, NS_SM, m.clone());
        // XEP-0198 §"Enable Stream Management Inline": <enable/> inside a
        // Bind 2 request; <enabled/> goes into <bound/>.
        reg.element(NAME, ElementStage::Bind2, NS_SM, m.clone());
        // XEP-0198 "Inline Stream Resumption": <resume/> inside SASL2.
        reg.element(NAME, ElementStage::Sasl2, NS_SM, m.clone());
        reg.traffic(m.clone());
        reg.connection_lost(m.clone());
        reg.attached(NAME, 50, m.clone());
        // Early: presence's own clean-up may route stanzas to this session.
        reg.session_closed(NAME, 10, m.clone());
        reg.stream_features(m);
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, HashMap<String, (BareJid, SessionRef)>> {
        self.resumable.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn failed(condition: StanzaErrorCondition, h: Option<u32>) -> Element {
    let mut el = Element::new("failed", NS_SM);
    if let Some(h) = h {
        el.set_attr("h", h.to_string());
    }
    el.append_child(Element::new(condition.as_str(), ns::STANZAS));
    el
}

fn h_attr(el: &Element) -> Option<u32> {
    el.attr("h")?.parse().ok()
}

/// True for the stanzas XEP-0198 counts.
fn is_stanza(el: &Element) -> bool {
    el.ns() == ns::CLIENT && matches!(el.name(), "message" | "presence" | "iq")
}

/// Applies the client's 'h' (§4): drops what it covers. An 'h' above what
/// was sent is the §6 stream error.
fn apply_ack(st: &mut SmState, h: u32) -> Result<(), StreamError> {
    let newly = h.wrapping_sub(st.acked) as usize;
    if newly > st.unacked.len() {
        let app = Element::builder("handled-count-too-high", NS_SM)
            .attr("h", h.to_string())
            .attr("send-count", st.sent.to_string())
            .build();
        return Err(StreamError::with_text(
            StreamErrorCondition::UndefinedCondition,
            format!(
                "you acknowledged {h} stanzas, but only {} were sent",
                st.sent
            ),
        )
        .with_app(app));
    }
    st.unacked.drop_front(newly);
    st.acked = h;
    Ok(())
}

impl StreamManagement {
    async fn enable(&self, cx: &mut SessionCtx<'_>, el: &Element) {
        if cx.state.get::<SmState>().is_some() {
            cx.send(failed(StanzaErrorCondition::UnexpectedRequest, None));
            return;
        }
        let wants_resume = matches!(el.attr("resume"), Some("true" | "1"));
        let keep = match el.attr("max").and_then(|m| m.parse::<u64>().ok()) {
            Some(max) if max > 0 => max.min(self.cfg.max_resume_secs),
            _ => self.cfg.resume_timeout_secs,
        };
        let mut enabled = Element::new("enabled", NS_SM);
        let resume_id = if wants_resume && self.cfg.resume {
            // Where the router knows this session (node and id).
            let Some(me) = cx
                .env
                .sessions
                .get(cx.jid())
                .map(|e| e.session)
                .filter(|s| s.id == cx.info.id)
            else {
                cx.send(failed(StanzaErrorCondition::InternalServerError, None));
                return;
            };
            let id = random_id(32);
            self.registry().insert(id.clone(), (cx.jid().to_bare(), me));
            enabled.set_attr("id", id.clone());
            enabled.set_attr("resume", "true");
            enabled.set_attr("max", keep.to_string());
            Some(id)
        } else {
            None
        };
        cx.state.insert(SmState {
            h_in: 0,
            sent: 0,
            acked: 0,
            unacked: Unacked::default(),
            requested: false,
            sent_at_flush: 0,
            resume_id,
            keep: Duration::from_secs(keep),
            overflow: false,
        });
        cx.send(enabled);
    }

    fn resume(&self, cx: &mut SessionCtx<'_>, el: &Element) {
        let (Some(previd), Some(_h)) = (el.attr("previd"), h_attr(el)) else {
            cx.send(failed(StanzaErrorCondition::BadRequest, None));
            return;
        };
        let target = {
            let reg = self.registry();
            reg.get(previd)
                .filter(|(owner, _)| Some(owner) == cx.info.user.as_ref())
                .map(|(_, s)| s.clone())
        };
        match target {
            Some(to) => cx.push(Action::Attach {
                to,
                request: el.clone(),
            }),
            None => {
                starling_core::log_throttled!(info, session = cx.info.id, user = ?cx.info.user.as_ref().map(|u| u.to_string()), "stream resumption refused: unknown or expired id");
                cx.send(failed(StanzaErrorCondition::ItemNotFound, None));
            }
        }
    }
}

#[async_trait]
impl ElementHandler for StreamManagement {
    async fn element(&self, cx: &mut SessionCtx<'_>, el: &Element) -> HookResult {
        let bound = cx.info.state.is_bound();
        match el.name() {
            "enable" if bound => self.enable(cx, el).await,
            // §3: not before resource binding.
            "enable" => cx.send(failed(StanzaErrorCondition::UnexpectedRequest, None)),
            // §5: resumption replaces binding; a bound stream cannot.
            "resume" if !bound => self.resume(cx, el),
            "resume" => cx.send(failed(StanzaErrorCondition::UnexpectedRequest, None)),
            "r" | "a" if cx.state.get::<SmState>().is_none() => {
                cx.push(Action::Close(StreamError::with_text(
                    StreamErrorCondition::UnsupportedStanzaType,
                    "stream management is not enabled on this stream",
                )));
            }
            "r" => {
                // The ack covers only what is durable (module doc).
                cx.env.hooks.durable_for(cx).await;
                let h = cx.state.get::<SmState>().map_or(0, |s| s.h_in);
                cx.send(
                    Element::builder("a", NS_SM)
                        .attr("h", h.to_string())
                        .build(),
                );
            }
            "a" => {
                let Some(h) = h_attr(el) else {
                    cx.push(Action::Close(StreamError::with_text(
                        StreamErrorCondition::InvalidXml,
                        "<a/> needs an 'h' attribute (XEP-0198 §4)",
                    )));
                    return Ok(Flow::Continue);
                };
                if let Some(st) = cx.state.get_mut::<SmState>() {
                    st.requested = false;
                    if let Err(e) = apply_ack(st, h) {
                        cx.push(Action::Close(e));
                    }
                }
            }
            _ => {
                cx.push(Action::Close(StreamError::with_text(
                    StreamErrorCondition::UnsupportedStanzaType,
                    format!("unknown stream management element <{}/>", el.name()),
                )));
            }
        }
        Ok(Flow::Continue)
    }
}

impl TrafficObserver for StreamManagement {
    fn stanza_in(&self, _info: &SessionInfo, state: &mut Extensions) {
        if let Some(st) = state.get_mut::<SmState>() {
            st.h_in = st.h_in.wrapping_add(1);
        }
    }

    fn element_out(&self, _info: &SessionInfo, state: &mut Extensions, out: &Outgoing<'_>) -> bool {
        let Some(st) = state.get_mut::<SmState>() else {
            return false;
        };
        if !is_stanza(out.element()) {
            return false;
        }
        st.sent = st.sent.wrapping_add(1);
        st.unacked.push(out, Instant::now());
        let over =
            st.unacked.len() > self.cfg.max_queue || st.unacked.bytes() > self.cfg.max_queue_bytes;
        if over && !st.overflow {
            st.overflow = true;
            return true;
        }
        false
    }

    /// Asks for an ack once `request_ack_every` stanzas are unacknowledged,
    /// or when the oldest is `request_ack_delay_ms` old — not after every
    /// flush: a request per message would double the elements on the wire
    /// (measured: +40% CPU per message, docs/benchmarks.md). A request due
    /// by age goes out with the next stanzas written, in the same write;
    /// only a stream that sends nothing more gets a request of its own,
    /// once the oldest is twice as old (a write of its own costs the
    /// kernel and TLS as much as a message: docs/benchmarks.md
    /// 2026-11-28).
    fn before_flush(
        &self,
        _info: &SessionInfo,
        state: &mut Extensions,
        out: &mut Vec<Element>,
    ) -> Option<Instant> {
        let st = state.get_mut::<SmState>()?;
        let carries_stanzas = st.sent != st.sent_at_flush;
        st.sent_at_flush = st.sent;
        if st.requested {
            return None;
        }
        let oldest = st.unacked.oldest()?;
        let delay = Duration::from_millis(self.cfg.request_ack_delay_ms);
        let (due, alone) = (oldest + delay, oldest + 2 * delay);
        let now = Instant::now();
        if st.unacked.len() >= self.cfg.request_ack_every.max(1)
            || (carries_stanzas && now >= due)
            || now >= alone
        {
            st.requested = true;
            out.push(Element::new("r", NS_SM));
            return None;
        }
        Some(alone)
    }
}

impl ConnectionLostHandler for StreamManagement {
    fn connection_lost(&self, _info: &SessionInfo, state: &mut Extensions) -> Option<Duration> {
        let st = state.get_mut::<SmState>()?;
        st.resume_id.as_ref()?;
        // The ack request on the dead connection is void.
        st.requested = false;
        // Detached, the queue only waits: no room for growth.
        st.unacked.shrink();
        Some(st.keep)
    }
}

#[async_trait]
impl AttachHandler for StreamManagement {
    async fn attached(
        &self,
        cx: &mut SessionCtx<'_>,
        request: &Element,
        failed_over: bool,
    ) -> HookResult {
        if failed_over {
            // The session expired between the lookup and the hand-over.
            cx.send(failed(StanzaErrorCondition::ItemNotFound, None));
            return Ok(Flow::Continue);
        }
        let h = h_attr(request).unwrap_or(0);
        let previd = request.attr("previd").unwrap_or("").to_owned();
        let ack = match cx.state.get_mut::<SmState>() {
            Some(st) => apply_ack(st, h),
            None => return Ok(Flow::Continue),
        };
        if let Err(e) = ack {
            cx.push(Action::Close(e));
            return Ok(Flow::Continue);
        }
        // 'h' in <resumed/> acknowledges the client's stanzas: durable first.
        cx.env.hooks.durable_for(cx).await;
        let st = cx.state.get_mut::<SmState>().expect("checked above");
        st.requested = false;
        let resumed = Element::builder("resumed", NS_SM)
            .attr("h", st.h_in.to_string())
            .attr("previd", previd)
            .build();
        let again: Vec<Vec<u8>> = st.unacked.iter().map(|(w, _)| w.to_vec()).collect();
        cx.send(resumed);
        for wire in again {
            cx.push(Action::Resend(wire));
        }
        Ok(Flow::Continue)
    }
}

#[async_trait]
impl SessionClosedHandler for StreamManagement {
    async fn session_closed(&self, cx: &mut SessionCtx<'_>) -> HookResult {
        let Some(st) = cx.state.remove::<SmState>() else {
            return Ok(Flow::Continue);
        };
        if let Some(id) = &st.resume_id {
            let mut reg = self.registry();
            if reg.get(id).is_some_and(|(_, s)| s.id == cx.info.id) {
                reg.remove(id);
            }
        }
        let domain = cx.info.domain.clone();
        let unacked: Vec<(Element, Instant)> = st
            .unacked
            .iter()
            .filter_map(|(wire, at)| Some((parse_wire(wire)?, at)))
            .collect();
        // Another available resource at least as preferred as this one
        // already has what was addressed to the bare JID (module doc).
        // (Looked up only when such a message is waiting.)
        let covered = self.archive
            && unacked.iter().any(|(el, _)| to_bare_jid(el))
            && cx.info.priority.is_some_and(|mine| {
                let owner = cx.jid().to_bare();
                cx.env.sessions.resources(&owner).iter().any(|e| {
                    e.session.id != cx.info.id && e.priority.is_some_and(|p| p >= mine.max(0))
                })
            });
        let mut rerouted = 0usize;
        for (el, at) in unacked {
            if covered && to_bare_jid(&el) {
                continue;
            }
            if let Some(stanza) = unacked_to_reroute(el, at, &domain) {
                rerouted += 1;
                cx.push(Action::Reroute(stanza));
            }
        }
        if rerouted > 0 {
            tracing::info!(session = cx.info.id, jid = %cx.jid(), rerouted, "unacknowledged stanzas handed back to the router");
        }
        Ok(Flow::Continue)
    }
}

/// A message addressed to a bare JID (delivered by the rules of RFC 6121
/// §8.5.2, possibly to several resources).
fn to_bare_jid(el: &Element) -> bool {
    el.name() == "message"
        && el
            .attr("to")
            .and_then(|t| t.parse::<starling_proto::Jid>().ok())
            .is_some_and(|j| j.resource().is_none())
}

/// What becomes of one unacknowledged stanza when its session ends (§4).
fn unacked_to_reroute(mut el: Element, sent_at: Instant, domain: &str) -> Option<Stanza> {
    let at = SystemTime::now()
        .checked_sub(sent_at.elapsed())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    match el.name() {
        "message" => {
            let copy = el.has_child("received", ns::CARBONS)
                || el.has_child("sent", ns::CARBONS)
                || el.has_child("result", ns::MAM);
            if copy || matches!(el.attr("type"), Some("error")) {
                return None;
            }
            if !el.has_child("delay", ns::DELAY) {
                let millis = at
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis());
                el.append_child(
                    Element::builder("delay", ns::DELAY)
                        .attr("from", domain)
                        .attr("stamp", xep0082_datetime(millis))
                        .build(),
                );
            }
        }
        "iq" if matches!(el.attr("type"), Some("get" | "set")) => {}
        _ => return None,
    }
    Stanza::from_element(el).ok()
}

impl StreamFeatureProvider for StreamManagement {
    fn stream_features(
        &self,
        _env: &Env,
        _info: &SessionInfo,
        stage: FeatureStage,
        out: &mut Vec<Element>,
    ) {
        if matches!(stage, FeatureStage::PostAuth | FeatureStage::Sasl2Inline) {
            out.push(Element::new("sm", NS_SM));
        }
    }
}

impl Module for StreamManagement {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str = "XEP-0198 stream management with resumption";
    type Config = SmConfig;

    fn enabled(cfg: &SmConfig) -> bool {
        cfg.enabled
    }

    async fn start(cfg: &SmConfig, ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        StreamManagement::register(cfg, (ctx.is_enabled)("mam"), reg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(sent: u32, acked: u32, unacked: usize) -> SmState {
        let mut queue = Unacked::default();
        for i in 0..unacked {
            let mut el = Element::new("message", ns::CLIENT);
            el.set_attr("id", i.to_string());
            queue.push(&Outgoing::new(&el, None), Instant::now());
        }
        SmState {
            h_in: 0,
            sent,
            acked,
            unacked: queue,
            requested: false,
            sent_at_flush: 0,
            resume_id: None,
            keep: Duration::ZERO,
            overflow: false,
        }
    }

    #[test]
    fn ack_arithmetic_wraps_at_2_pow_32() {
        // §4: h goes from 2^32-1 back to 0.
        let mut st = state(1, u32::MAX - 1, 3);
        assert!(apply_ack(&mut st, 0).is_ok());
        assert_eq!(st.unacked.len(), 1);
        assert_eq!(st.acked, 0);
        assert!(apply_ack(&mut st, 1).is_ok());
        assert!(st.unacked.is_empty());
    }

    #[test]
    fn ack_above_sent_is_handled_count_too_high() {
        // §6: h above the send count → undefined-condition + handled-count-too-high.
        let mut st = state(8, 5, 3);
        let e = apply_ack(&mut st, 10).unwrap_err();
        assert_eq!(e.condition, StreamErrorCondition::UndefinedCondition);
        let app = e.app.expect("application condition");
        assert_eq!(app.name(), "handled-count-too-high");
        assert_eq!(app.attr("h"), Some("10"));
        assert_eq!(app.attr("send-count"), Some("8"));
        assert_eq!(st.unacked.len(), 3, "nothing dropped");
        // Repeating the last h changes nothing.
        assert!(apply_ack(&mut st, 5).is_ok());
        assert_eq!(st.unacked.len(), 3);
    }

    #[test]
    fn carbons_presence_and_errors_are_not_rerouted() {
        // Through the queue's wire form, as a session's end sees them.
        let sent = |el: Element| {
            let mut q = Unacked::default();
            q.push(&Outgoing::new(&el, None), Instant::now());
            let (wire, at) = q.iter().next().unwrap();
            (parse_wire(wire).expect("parses back"), at)
        };
        let mut carbon = Element::new("message", ns::CLIENT);
        carbon.append_child(Element::new("received", ns::CARBONS));
        assert!({
            let (e, at) = sent(carbon);
            unacked_to_reroute(e, at, "x")
        }
        .is_none());
        assert!({
            let (e, at) = sent(Element::new("presence", ns::CLIENT));
            unacked_to_reroute(e, at, "x")
        }
        .is_none());
        let mut msg = Element::new("message", ns::CLIENT);
        msg.set_attr("to", "a@x/r");
        msg.set_attr("from", "b@x/r");
        let s = {
            let (e, at) = sent(msg);
            unacked_to_reroute(e, at, "x")
        }
        .expect("rerouted");
        assert!(s.element().has_child("delay", ns::DELAY));
        let mut result = Element::new("iq", ns::CLIENT);
        result.set_attr("type", "result");
        result.set_attr("id", "1");
        assert!({
            let (e, at) = sent(result);
            unacked_to_reroute(e, at, "x")
        }
        .is_none());
    }
}

#[cfg(test)]
mod queue_tests {
    use super::*;

    fn msg(i: usize) -> Element {
        Element::builder("message", ns::CLIENT)
            .attr("id", i.to_string())
            .append(
                Element::builder("body", ns::CLIENT)
                    .text("x".repeat(i))
                    .build(),
            )
            .build()
    }

    #[test]
    fn queue_keeps_order_across_acks_and_compaction() {
        let mut q = Unacked::default();
        let mut next = 0usize;
        let mut first = 0usize;
        for round in 0..50 {
            for _ in 0..(round % 7 + 1) {
                q.push(&Outgoing::new(&msg(next), None), Instant::now());
                next += 1;
            }
            let n = (round % 5).min(q.len());
            q.drop_front(n);
            first += n;
            let ids: Vec<String> = q
                .iter()
                .map(|(w, _)| parse_wire(w).unwrap().attr("id").unwrap().to_owned())
                .collect();
            let want: Vec<String> = (first..next).map(|i| i.to_string()).collect();
            assert_eq!(ids, want, "round {round}");
        }
        q.shrink();
        assert_eq!(q.buf.capacity(), q.buf.len(), "shrunk to what it holds");
        let after: Vec<String> = q
            .iter()
            .map(|(w, _)| parse_wire(w).unwrap().attr("id").unwrap().to_owned())
            .collect();
        assert_eq!(
            after,
            (first..next).map(|i| i.to_string()).collect::<Vec<_>>()
        );
        q.drop_front(q.len());
        assert_eq!(q.len(), 0);
        assert!(
            q.buf.capacity() <= KEEP_EMPTY,
            "an empty queue holds at most {KEEP_EMPTY} bytes"
        );
    }

    #[test]
    fn big_and_deep_stanzas_come_back_whole() {
        // Larger and deeper than the parser's default input limits.
        let mut deep = Element::new("x", "urn:example:deep");
        for _ in 0..100 {
            let mut parent = Element::new("x", "urn:example:deep");
            parent.append_child(deep);
            deep = parent;
        }
        let el = Element::builder("message", ns::CLIENT)
            .attr("to", "a@b/c")
            .append(
                Element::builder("body", ns::CLIENT)
                    .text("y".repeat(300 * 1024))
                    .build(),
            )
            .append(deep)
            .build();
        let mut q = Unacked::default();
        q.push(&Outgoing::new(&el, None), Instant::now());
        let (wire, _) = q.iter().next().unwrap();
        assert!(wire.len() > 256 * 1024);
        assert_eq!(parse_wire(wire).expect("read back"), el);
    }

    #[test]
    fn wire_from_the_connection_is_kept_as_written() {
        let el = msg(3);
        let mut wire = Vec::new();
        el.write_to(&mut wire, ns::CLIENT);
        let mut q = Unacked::default();
        q.push(&Outgoing::new(&el, Some(&wire)), Instant::now());
        assert_eq!(q.iter().next().unwrap().0, &wire[..]);
        assert_eq!(parse_wire(&wire).unwrap(), el);
    }
}
