//! What a session hook's handler gets: the session's facts
//! ([`SessionInfo`], [`SessionState`]), its context ([`SessionCtx`]) and
//! the actions it asks the session task to apply ([`Action`]).

use crate::routing::SessionRef;
use crate::{Env, Extensions};
use starling_proto::{BareJid, FullJid, Stanza, StanzaError, StreamError};
use starling_xml::Element;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Identifies a session timer: the module that set it and a module-chosen
/// token. Setting a timer with the same key replaces it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerKey {
    /// The module's name, as given to the registry.
    pub module: &'static str,
    /// Module-defined meaning.
    pub token: u64,
}

/// An effect requested by a handler, applied by the session task.
#[derive(Debug)]
pub enum Action {
    /// Write this element to this session's client.
    Send(Element),
    /// Route this stanza (its `from` must be set by the handler).
    Route(Stanza),
    /// Record the session's availability in the session table: priority
    /// and the presence broadcast (`None`: not available).
    SetPresence(Option<(i8, Arc<Element>)>),
    /// Fire the module's timer handler after a delay.
    SetTimer(TimerKey, Duration),
    /// Cancel a timer.
    CancelTimer(TimerKey),
    /// Close the stream with this error.
    Close(StreamError),
    /// Write this stanza to the client again, without telling the
    /// [`TrafficObserver`]s (a stream-management retransmission: the
    /// stanza was counted when it was first written). The bytes are the
    /// stanza's wire form in the `jabber:client` default namespace, as
    /// [`Outgoing::write_wire`] gives it.
    Resend(Vec<u8>),
    /// Hand this stanza back to the router: its session ends before its
    /// client received it (see `Router::reroute`).
    Reroute(Stanza),
    /// Hand this session's connection to another session, which takes it
    /// over (XEP-0198 resumption); `request` is the client's element that
    /// asked for it, given to that session's [`AttachHandler`]s. If the
    /// other session is gone, the [`AttachHandler`]s of this session are
    /// told with `failed` set.
    Attach {
        /// The session that takes the connection.
        to: SessionRef,
        /// The client's request.
        request: Element,
    },
}

/// Where a session is in its life (DESIGN.md "Sessions, connections and
/// services"). The session task moves it forward; nothing else does.
///
/// ```text
/// PreAuth ──SASL success──► Authenticated ──bind──► Established ──► Closing
///                                                    │    ▲
///                                      connection lost│    │resumed
///                                                    ▼    │
///                                        Detached { until } ──deadline──► Closing
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionState {
    /// Stream negotiation before authentication: headers, STARTTLS, SASL
    /// (RFC 6120 §5, §6).
    PreAuth,
    /// SASL succeeded; no resource is bound yet (§7).
    Authenticated,
    /// A resource is bound: stanzas flow.
    Established,
    /// Established, but its connection is gone; the session waits for a
    /// client to take it over until this deadline (XEP-0198 resumption).
    Detached {
        /// When the session ends if nobody resumes it.
        until: Instant,
    },
    /// The session is ending: no more input is read.
    Closing,
}

impl SessionState {
    /// True once SASL succeeded (and until the session ends).
    pub fn is_authenticated(self) -> bool {
        !matches!(self, SessionState::PreAuth)
    }

    /// True while stanzas flow to and from a bound resource, with or
    /// without a connection.
    pub fn is_bound(self) -> bool {
        matches!(
            self,
            SessionState::Established | SessionState::Detached { .. }
        )
    }
}

/// Facts about a session, maintained by the session task.
#[derive(Clone, Debug)]
pub struct SessionInfo {
    /// Process-unique session id.
    pub id: u64,
    /// The stream id sent in our stream header.
    pub stream_id: String,
    /// The client's address.
    pub peer: SocketAddr,
    /// The domain the client addressed (stream `to`).
    pub domain: String,
    /// True once TLS is established.
    pub secure: bool,
    /// Where the session is in its life.
    pub state: SessionState,
    /// The authenticated account, once SASL succeeded.
    pub user: Option<BareJid>,
    /// The bound full JID, once resource binding is done.
    pub jid: Option<FullJid>,
    /// Presence priority; `None` while not available.
    pub priority: Option<i8>,
    /// When the last bytes arrived from the client.
    pub last_inbound: Instant,
    /// The connection the session is on now (or `Detached`).
    pub transport: crate::SessionTransport,
    /// The modules switched off for `domain` ([`crate::Host::modules_off`],
    /// live: a settings change applies at once); `None` until the stream
    /// names a served domain.
    pub modules_off: Option<Arc<std::sync::atomic::AtomicU64>>,
}

impl SessionInfo {
    /// The modules switched off for this session's domain (a mask of
    /// [`crate::module::module_bit`]s).
    pub fn modules_off(&self) -> u64 {
        self.modules_off
            .as_ref()
            .map_or(0, |m| m.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// What a session hook handler works with.
pub struct SessionCtx<'a> {
    /// The server environment (router, storage, configuration of hosts…).
    pub env: &'a Env,
    /// Facts about the session.
    pub info: &'a SessionInfo,
    /// Per-module state of this session.
    pub state: &'a mut Extensions,
    actions: &'a mut Vec<Action>,
}

impl<'a> SessionCtx<'a> {
    /// A context over the given parts; used by the session task.
    pub fn new(
        env: &'a Env,
        info: &'a SessionInfo,
        state: &'a mut Extensions,
        actions: &'a mut Vec<Action>,
    ) -> Self {
        SessionCtx {
            env,
            info,
            state,
            actions,
        }
    }

    /// The bound JID. Hooks that run before binding must not call this.
    ///
    /// # Panics
    /// If called on a session that has not bound a resource; the hook
    /// points that run before binding are documented as such.
    pub fn jid(&self) -> &FullJid {
        self.info
            .jid
            .as_ref()
            .expect("session hook that requires a bound resource")
    }

    /// Requests an effect.
    pub fn push(&mut self, action: Action) {
        self.actions.push(action);
    }

    /// Requests that `el` be written to this session's client.
    pub fn send(&mut self, el: Element) {
        self.actions.push(Action::Send(el));
    }

    /// Requests that `stanza` be routed.
    pub fn route(&mut self, stanza: Stanza) {
        self.actions.push(Action::Route(stanza));
    }

    /// Answers `stanza` with an error (routed to the sender), unless it is an
    /// error itself.
    pub fn reply_error(&mut self, stanza: &Stanza, error: StanzaError) {
        if let Some(reply) = stanza.error_reply(error) {
            self.actions.push(Action::Send(reply.into_element()));
        }
    }
}
