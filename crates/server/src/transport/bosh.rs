//! BOSH (XEP-0124) carrying XMPP (XEP-0206), as a
//! [`Connection`](super::connection::Connection) kind.
//!
//! A BOSH session is many HTTP requests over time. Each `POST /http-bind`
//! (handled in `http.rs` by [`handle_request`]) carries a `<body/>` with a
//! request id (`rid`) and zero or more payload elements; the payloads go to
//! the session task **in rid order** (§7; a request that arrives early
//! waits, within the window of `requests` rids, for the ones before it),
//! and the request is held until the session has something to send or
//! `wait` seconds passed (§7). At most `hold` requests are held: when one
//! more arrives, the oldest is answered at once (§7). More than `requests`
//! simultaneous requests end the session with `policy-violation` (§11).
//! Request bodies count against `[c2s] max_bytes_per_second` as TCP reads
//! do: over the rate, a request waits (and the ones after it wait for their
//! turn) before its payloads are handled.
//! The last `requests` responses are kept, so a client that lost one
//! (broken connection, §14.3) gets the same answer for the same rid; an
//! older or far-ahead rid ends the session with `item-not-found`.
//!
//! Acknowledgements (§9): every response carries `ack`, the highest rid
//! received with all lower ones (the creation response always; later ones
//! only when it differs from the rid answered). A client that sets
//! `ack='1'` at creation acknowledges responses in turn: acknowledged
//! responses are forgotten, unacknowledged ones are kept (up to 8) for
//! retransmission, and a request whose `ack` is older than the last
//! response sent is answered at once with `report` (the first missing rid)
//! and `time` (ms since it was sent).
//!
//! XEP-0206: the creation response carries the stream features and
//! `xmpp:version`; `xmpp:restart='true'` restarts the stream after SASL;
//! `type='terminate'` closes it (§6). With no request held for
//! `inactivity` seconds (or the client's `pause`, up to `maxpause`, §10)
//! the connection counts as lost — a stream-management session is then
//! detached and can resume on any transport.
//!
//! The session task sees this connection like any other: `read` waits for
//! payloads, `send` queues elements for the next response, `close` ends
//! the BOSH session with `type='terminate'` (and the stream error, if any).

use super::framing::{Closing, Inbound, IoEnd, ReadGovernor, ReadLimits};
use starling_proto::{ns, StreamError};
use starling_xml::{Element, Limits, Prepared, StreamEvent, StreamHeader, StreamParser};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// XEP-0124's namespace.
pub const NS_HTTPBIND: &str = "http://jabber.org/protocol/httpbind";
/// XEP-0206's namespace (`xmpp:version`, `xmpp:restart`).
pub const NS_XBOSH: &str = "urn:xmpp:xbosh";

/// The longest `wait` granted, in seconds.
pub const MAX_WAIT: u64 = 60;
/// Seconds without a request before the connection counts as lost.
pub const INACTIVITY: u64 = 60;
/// The longest `pause` granted, in seconds (§10).
pub const MAX_PAUSE: u64 = 120;
/// The largest request id a client may use (XEP-0124 §14.1).
pub const MAX_RID: u64 = (1 << 53) - 1;
/// Responses kept for a client that acknowledges them (§9) until it does.
const MAX_UNACKED: usize = 8;
/// Requests held at once (`hold`).
pub const MAX_HOLD: u64 = 1;

/// How a BOSH session ended (the `type='terminate'` response's condition).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Normally (client or server closed the stream).
    Normal,
    /// With a stream error, sent inside the body.
    StreamError,
    /// With a binding condition (XEP-0124 §17.2): `item-not-found`…
    Binding(&'static str),
}

struct State {
    inbound: VecDeque<Inbound>,
    /// Serialized payload elements for the next responses, one per entry
    /// (a response takes whole elements, up to `max_pending` bytes).
    outbound: VecDeque<Vec<u8>>,
    /// The bytes in `outbound`.
    outbound_bytes: usize,
    /// The client has authenticated: request bodies may be as large as
    /// stanzas allow, not `[c2s] max_preauth_stanza_bytes`.
    authenticated: bool,
    next_rid: u64,
    held: BTreeSet<u64>,
    /// Requests being processed (held, or waiting for their turn).
    active: usize,
    /// The last responses (rid, body, when sent), for retransmission.
    responses: VecDeque<(u64, String, Instant)>,
    /// The client acknowledges responses (`ack='1'` at creation, §9.1).
    client_acks: bool,
    ended: Option<Ended>,
    /// The HTTP side lost the session (bad rid, overactivity): the session
    /// task's read ends.
    lost: bool,
    last_request: Instant,
    idle_allowed: Duration,
    stream_id: String,
    /// `[c2s] max_bytes_per_second` over request bodies, as on TCP and
    /// WebSocket (only its token bucket is used: there is no parser here
    /// to hibernate).
    governor: ReadGovernor,
}

/// One BOSH session, shared by its session task and its HTTP requests.
pub(crate) struct BoshSession {
    pub sid: String,
    pub wait: Duration,
    pub hold: u64,
    pub requests: u64,
    pub domain: String,
    /// `[c2s] bosh_max_pending_bytes`: output held for the client, and
    /// the most one response carries.
    max_pending: usize,
    state: Mutex<State>,
    /// Payloads (or an end) for the session task.
    to_session: Notify,
    /// Output, rid progress or an end, for the HTTP requests.
    to_http: Notify,
    /// A response took output: the session task may take more stanzas.
    drained: Notify,
}

impl BoshSession {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until the output held for the client is under
    /// `[c2s] bosh_max_pending_bytes` (a response took some) or the
    /// session is over. Cancel-safe.
    pub(crate) async fn output_drained(&self) {
        loop {
            let notified = self.drained.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = self.lock();
                if st.outbound_bytes < self.max_pending || st.ended.is_some() || st.lost {
                    return;
                }
            }
            notified.await;
        }
    }

    /// True once the client has authenticated (its request bodies may then
    /// be as large as stanzas).
    pub(crate) fn is_authenticated(&self) -> bool {
        self.lock().authenticated
    }
}

impl State {
    /// Queues one element for the client.
    fn push_out(&mut self, el: Vec<u8>) {
        self.outbound_bytes += el.len();
        self.outbound.push_back(el);
    }

    /// The elements of the next response: whole elements up to `max`
    /// bytes (at least one), or everything once the session has ended
    /// (its last response; what is queued is bounded by `max` and one
    /// element anyway).
    fn take_out(&mut self, max: usize) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(next) = self.outbound.front() {
            if !out.is_empty() && out.len() + next.len() > max && self.ended.is_none() {
                break;
            }
            let next = self.outbound.pop_front().unwrap_or_default();
            self.outbound_bytes -= next.len();
            out.extend_from_slice(&next);
        }
        out
    }
}

/// The sessions of this node by sid.
#[derive(Default)]
pub(crate) struct BoshRegistry {
    sessions: Mutex<HashMap<String, Arc<BoshSession>>>,
}

impl BoshRegistry {
    pub(crate) fn get(&self, sid: &str) -> Option<Arc<BoshSession>> {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(sid)
            .cloned()
    }

    fn insert(&self, s: Arc<BoshSession>) {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(s.sid.clone(), s);
    }

    fn remove(&self, sid: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(sid);
    }
}

/// The session task's side of a BOSH session.
pub struct BoshConn {
    session: Arc<BoshSession>,
    registry: Arc<BoshRegistry>,
    secure: bool,
}

impl Drop for BoshConn {
    fn drop(&mut self) {
        {
            let mut st = self.session.lock();
            if st.ended.is_none() {
                st.ended = Some(Ended::Normal);
            }
        }
        self.session.to_http.notify_waiters();
        self.registry.remove(&self.session.sid);
    }
}

impl BoshConn {
    pub(crate) fn is_secure(&self) -> bool {
        self.secure
    }

    /// Waits for payloads. Cancel-safe: nothing is taken until
    /// [`BoshConn::next_event`].
    pub(crate) async fn read(&mut self) -> Result<(), IoEnd> {
        loop {
            let notified = self.session.to_session.notified();
            let deadline = {
                let st = self.session.lock();
                if !st.inbound.is_empty() {
                    return Ok(());
                }
                if st.lost || st.ended.is_some() {
                    return Err(IoEnd::Eof);
                }
                if st.active == 0 {
                    let at = st.last_request + st.idle_allowed;
                    if Instant::now() >= at {
                        return Err(IoEnd::Eof);
                    }
                    Some(at)
                } else {
                    None
                }
            };
            match deadline {
                Some(at) => {
                    let _ = tokio::time::timeout_at(at.into(), notified).await;
                }
                None => notified.await,
            }
        }
    }

    pub(crate) fn next_event(&mut self) -> Result<Option<Inbound>, StreamError> {
        Ok(self.session.lock().inbound.pop_front())
    }

    pub(crate) fn open_stream(&mut self, id: &str, _from: &str) {
        self.session.lock().stream_id = id.to_owned();
    }

    pub(crate) fn send_features(&mut self, features: &[Element]) {
        let mut buf = b"<stream:features xmlns:stream='http://etherx.jabber.org/streams'>".to_vec();
        for f in features {
            f.write_to(&mut buf, "");
        }
        buf.extend_from_slice(b"</stream:features>");
        self.session.lock().push_out(buf);
    }

    pub(crate) fn send(&mut self, el: &Element) {
        let mut buf = Vec::new();
        el.write_to(&mut buf, "");
        self.session.lock().push_out(buf);
    }

    /// Queues one serialised standalone element.
    pub(crate) fn send_bytes(&mut self, bytes: &[u8]) {
        self.session.lock().push_out(bytes.to_vec());
    }

    pub(crate) fn send_prepared(&mut self, wire: &Prepared, to: Option<&str>) {
        let mut buf = Vec::with_capacity(wire.len() + 64);
        wire.write_to(&mut buf, "", to);
        self.session.lock().push_out(buf);
    }

    /// False while `[c2s] bosh_max_pending_bytes` of output wait for the
    /// client: the session then leaves stanzas in its mailbox (bounded by
    /// `mailbox_size`, past which senders get `<resource-constraint/>`).
    pub(crate) fn can_take_output(&self) -> bool {
        let st = self.session.lock();
        st.outbound_bytes < self.session.max_pending || st.ended.is_some() || st.lost
    }

    /// The shared session, for [`BoshSession::output_drained`].
    pub(crate) fn session(&self) -> Arc<BoshSession> {
        self.session.clone()
    }

    /// The client authenticated: larger request bodies are accepted.
    pub(crate) fn set_authenticated(&mut self) {
        self.session.lock().authenticated = true;
    }

    pub(crate) fn flush(&mut self) {
        if !self.session.lock().outbound.is_empty() {
            self.session.to_http.notify_waiters();
        }
    }

    pub(crate) fn close(&mut self, how: Closing<'_>) {
        {
            let mut st = self.session.lock();
            match how {
                Closing::Error(e) => {
                    let mut buf =
                        b"<stream:error xmlns:stream='http://etherx.jabber.org/streams'>".to_vec();
                    for child in e.to_element().children() {
                        child.write_to(&mut buf, "");
                    }
                    buf.extend_from_slice(b"</stream:error>");
                    st.push_out(buf);
                    st.ended.get_or_insert(Ended::StreamError);
                }
                Closing::Close => {
                    st.ended.get_or_insert(Ended::Normal);
                }
            }
        }
        self.session.to_http.notify_waiters();
    }

    pub(crate) fn discard_output(&mut self) {
        let mut st = self.session.lock();
        st.outbound = VecDeque::new();
        st.outbound_bytes = 0;
    }
}

pub(crate) fn terminate(condition: &str) -> String {
    format!("<body xmlns='{NS_HTTPBIND}' type='terminate' condition='{condition}'/>")
}

fn header(domain: &str) -> StreamHeader {
    StreamHeader {
        name: "stream".into(),
        ns: ns::STREAMS.into(),
        default_ns: Some(ns::CLIENT.into()),
        attrs: vec![
            ("to".into(), domain.into()),
            ("version".into(), "1.0".into()),
        ],
    }
}

/// Parses one request's `<body/>` (XEP-0124 §4) with the c2s `limits`: a
/// body holds payloads of up to the stanza limit, so it may be twice that
/// (room for several small ones). Anything after the `<body/>` element is
/// ignored. Fails with the `terminate` condition to answer: a body over the
/// limit is `policy-violation`, one that is not a whole `<body/>` in the
/// httpbind namespace `bad-request`.
pub(crate) fn parse_body(bytes: &[u8], limits: Limits) -> Result<Element, &'static str> {
    let limit = limits.max_stanza_bytes.saturating_mul(2);
    if bytes.len() > limit {
        return Err("policy-violation");
    }
    let mut parser = StreamParser::for_elements(Limits {
        max_stanza_bytes: limit,
        ..limits
    });
    let mut input = bytes;
    match parser.push(&mut input) {
        Ok(Some(StreamEvent::Stanza(el))) if el.is("body", NS_HTTPBIND) => Ok(el),
        _ => Err("bad-request"),
    }
}

/// Handles one `<body/>` (already parsed). `is_local` says whether a
/// domain is served here. For a creation request the caller starts the
/// session task with the returned connection, then calls [`respond`].
pub(crate) fn handle_request(
    registry: &Arc<BoshRegistry>,
    body: &Element,
    is_local: impl Fn(&str) -> bool,
    secure: bool,
    read_limits: ReadLimits,
    max_pending: usize,
) -> Result<(Arc<BoshSession>, u64, Option<BoshConn>), String> {
    // §14.1: rids never exceed 2^53 - 1, so rid arithmetic cannot overflow.
    let Some(rid) = body
        .attr("rid")
        .and_then(|r| r.trim().parse::<u64>().ok())
        .filter(|r| *r <= MAX_RID)
    else {
        return Err(terminate("bad-request"));
    };
    match body.attr("sid") {
        None => {
            let to = body.attr("to").unwrap_or("");
            if !is_local(to) {
                return Err(terminate("host-unknown"));
            }
            let num = |name: &str, max: u64, default: u64| {
                body.attr(name)
                    .and_then(|v| v.parse::<u64>().ok())
                    .map_or(default, |v| v.min(max))
            };
            let wait = num("wait", MAX_WAIT, MAX_WAIT);
            let hold = num("hold", MAX_HOLD, MAX_HOLD);
            let session = Arc::new(BoshSession {
                sid: starling_proto::random_id(32),
                wait: Duration::from_secs(wait),
                hold,
                requests: hold + 1,
                domain: to.to_owned(),
                max_pending,
                state: Mutex::new(State {
                    inbound: VecDeque::from([Inbound::Open(header(to))]),
                    outbound: VecDeque::new(),
                    outbound_bytes: 0,
                    authenticated: false,
                    next_rid: rid,
                    held: BTreeSet::new(),
                    active: 0,
                    responses: VecDeque::new(),
                    client_acks: body.attr("ack") == Some("1"),
                    ended: None,
                    lost: false,
                    last_request: Instant::now(),
                    idle_allowed: Duration::from_secs(INACTIVITY),
                    stream_id: String::new(),
                    governor: ReadGovernor::new(read_limits),
                }),
                to_session: Notify::new(),
                to_http: Notify::new(),
                drained: Notify::new(),
            });
            registry.insert(session.clone());
            let conn = BoshConn {
                session: session.clone(),
                registry: registry.clone(),
                secure,
            };
            Ok((session, rid, Some(conn)))
        }
        Some(sid) => match registry.get(sid) {
            Some(s) => Ok((s, rid, None)),
            None => Err(terminate("item-not-found")),
        },
    }
}

/// Waits for `rid`'s turn, hands its payloads to the session, holds the
/// request until there is output (or `wait`), and returns the response.
pub(crate) async fn respond(
    s: &Arc<BoshSession>,
    rid: u64,
    body: &Element,
    body_bytes: usize,
    creation: bool,
) -> String {
    // In rid order (§7): wait for the requests before this one.
    let deadline = tokio::time::Instant::now() + s.wait;
    {
        let mut st = s.lock();
        if rid < st.next_rid {
            // A retransmission (§14.3): the same answer, if still kept.
            if let Some((_, r, _)) = st.responses.iter().find(|(r, _, _)| *r == rid) {
                return r.clone();
            }
            drop(st);
            return lose(s, "item-not-found");
        }
        if st.ended.is_some() {
            // The session is over (§13): as if unknown.
            return terminate("item-not-found");
        }
        if rid >= st.next_rid + s.requests {
            drop(st);
            return lose(s, "item-not-found");
        }
        if st.active as u64 >= s.requests {
            drop(st);
            return lose(s, "policy-violation");
        }
        st.active += 1;
    }
    let result = serve(s, rid, body, body_bytes, creation, deadline).await;
    {
        let mut st = s.lock();
        st.active -= 1;
        st.held.remove(&rid);
        st.last_request = Instant::now();
    }
    s.to_session.notify_one();
    s.to_http.notify_waiters();
    result
}

/// Ends the session from the HTTP side with `condition`.
pub(crate) fn lose(s: &Arc<BoshSession>, condition: &'static str) -> String {
    {
        let mut st = s.lock();
        st.lost = true;
        st.ended.get_or_insert(Ended::Binding(condition));
    }
    s.to_session.notify_one();
    s.to_http.notify_waiters();
    s.drained.notify_waiters();
    terminate(condition)
}

async fn serve(
    s: &Arc<BoshSession>,
    rid: u64,
    body: &Element,
    body_bytes: usize,
    creation: bool,
    deadline: tokio::time::Instant,
) -> String {
    // Our turn.
    loop {
        let notified = s.to_http.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let st = s.lock();
            if st.next_rid == rid || st.ended.is_some() {
                break;
            }
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return lose(s, "item-not-found");
        }
    }
    // Over the read rate, this request waits (and the ones after it wait
    // for their turn) until the bucket refills: the client is slowed, as a
    // TCP client whose socket is not read, not disconnected.
    let pause = {
        let mut st = s.lock();
        st.governor.throttle(body_bytes);
        st.governor.paused_until.take()
    };
    if let Some(until) = pause {
        tokio::time::sleep_until(until.into()).await;
    }
    let mut immediate = false;
    let mut terminating = false;
    let mut report = None;
    {
        let mut st = s.lock();
        if st.ended.is_none() {
            st.next_rid = rid + 1;
            if !creation && st.client_acks {
                // §9.2: the client has every response up to `ack`; when it
                // misses one we already sent, tell it at once (`report`,
                // `time`) so it can ask again.
                if let Some(ack) = body.attr("ack").and_then(|a| a.parse::<u64>().ok()) {
                    let last_sent = st.responses.back().map(|(r, _, _)| *r);
                    if last_sent.is_some_and(|l| ack < l) {
                        if let Some((r, _, at)) =
                            st.responses.iter().find(|(r, _, _)| *r == ack + 1)
                        {
                            report = Some((*r, at.elapsed().as_millis()));
                            immediate = true;
                        }
                    }
                    // What the client has, it will not ask for again.
                    st.responses.retain(|(r, _, _)| *r > ack);
                }
            }
            if !creation {
                if body.attr(&format!("{{{NS_XBOSH}}}restart")) == Some("true") {
                    st.inbound.push_back(Inbound::Open(header(&s.domain)));
                }
                for child in body.children() {
                    st.inbound.push_back(Inbound::Element(child.clone()));
                }
                if body.attr("type") == Some("terminate") {
                    st.inbound.push_back(Inbound::Close);
                    terminating = true;
                }
                if let Some(p) = body.attr("pause").and_then(|p| p.parse::<u64>().ok()) {
                    st.idle_allowed = Duration::from_secs(p.min(MAX_PAUSE));
                    immediate = true;
                } else {
                    st.idle_allowed = Duration::from_secs(INACTIVITY);
                }
            }
            st.held.insert(rid);
        }
    }
    s.to_session.notify_one();
    s.to_http.notify_waiters();
    // Held until there is output, a newer request pushes us out, or `wait`.
    loop {
        let notified = s.to_http.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let mut st = s.lock();
            let pushed_out = st.held.len() as u64 > s.hold && st.held.first() == Some(&rid);
            let has_output = !st.outbound.is_empty();
            // The creation response waits for the features.
            let ready = if terminating {
                // Answered once the stream is closed (§13).
                st.ended.is_some()
            } else {
                has_output || st.ended.is_some() || (!creation && (immediate || pushed_out))
            };
            if ready || tokio::time::Instant::now() >= deadline {
                let out = st.take_out(s.max_pending);
                if !out.is_empty() {
                    s.drained.notify_waiters();
                }
                let reply = compose(s, &st, out, rid, creation, report);
                st.responses.push_back((rid, reply.clone(), Instant::now()));
                // §14.3 keeps the last `requests` responses; a client that
                // acknowledges responses (§9) gets the ones it has not
                // acknowledged kept too, up to a bound.
                let keep = if st.client_acks {
                    MAX_UNACKED
                } else {
                    s.requests as usize
                };
                while st.responses.len() > keep {
                    st.responses.pop_front();
                }
                return reply;
            }
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }
}

/// The response `<body/>` to request `rid`. It acknowledges requests
/// (§9.1): `ack` is the highest rid received with every lower one
/// received, on the creation response always, later only when it differs
/// from `rid`; `report` (rid, ms since sent) points the client at a
/// response it missed (§9.2).
fn compose(
    s: &BoshSession,
    st: &State,
    out: Vec<u8>,
    rid: u64,
    creation: bool,
    report: Option<(u64, u128)>,
) -> String {
    let mut head =
        format!("<body xmlns='{NS_HTTPBIND}' xmlns:stream='http://etherx.jabber.org/streams'");
    let acked = st.next_rid.saturating_sub(1);
    if creation || acked != rid {
        head.push_str(&format!(" ack='{acked}'"));
    }
    if let Some((r, ms)) = report {
        head.push_str(&format!(" report='{r}' time='{ms}'"));
    }
    if creation {
        head.push_str(&format!(
            " xmlns:xmpp='{NS_XBOSH}' xmpp:version='1.0' xmpp:restartlogic='true' sid='{}' wait='{}' hold='{}' requests='{}' inactivity='{INACTIVITY}' polling='2' maxpause='{MAX_PAUSE}' ver='1.11' from='{}' authid='{}'",
            s.sid,
            s.wait.as_secs(),
            s.hold,
            s.requests,
            s.domain,
            st.stream_id
        ));
    }
    match &st.ended {
        None => {}
        Some(Ended::Normal) => head.push_str(" type='terminate'"),
        Some(Ended::StreamError) => {
            head.push_str(" type='terminate' condition='remote-stream-error'")
        }
        Some(Ended::Binding(c)) => head.push_str(&format!(" type='terminate' condition='{c}'")),
    }
    if out.is_empty() {
        head.push_str("/>");
        return head;
    }
    head.push('>');
    head.push_str(&String::from_utf8_lossy(&out));
    head.push_str("</body>");
    head
}
