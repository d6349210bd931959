//! Typed hooks, the handler registry and the action accumulator.
//!
//! Each hook point is a trait. A module implements the traits of the hooks it
//! cares about and registers the implementations in the [`HookRegistry`]
//! with a priority (lower runs first). Hooks a module does not register cost
//! nothing: a disabled module runs no code (DESIGN.md invariant 1).
//!
//! Handlers of session hooks get a [`SessionCtx`]: read-only facts about the
//! session, the module's own per-session state, and an accumulator of
//! [`Action`]s. The session task applies the actions, in order, when the
//! chain has run; handlers never write to the socket themselves.
//!
//! A handler that returns an error is logged and skipped; the chain goes on
//! and the connection stays up (invariant 3).

use crate::routing::SessionRef;
use crate::storage::ArchiveId;
use crate::{disco::DiscoRegistry, Env, Extensions};
use async_trait::async_trait;
use starling_proto::{BareJid, FullJid, Stanza, StanzaError, StreamError};
use starling_xml::Element;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a handler tells the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Run the next handler (and the default action at the end).
    Continue,
    /// The stanza was consumed: stop the chain and skip the default action.
    Stop,
}

/// A handler failure; logged with the module name, then the chain goes on.
pub type HookError = Box<dyn std::error::Error + Send + Sync>;
/// A handler's result.
pub type HookResult = Result<Flow, HookError>;

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

/// A stanza sent by an authenticated, bound client, after the server stamped
/// its `from` (RFC 6120 §8.1.2.1). Returning [`Flow::Stop`] consumes it;
/// otherwise the default is to route it.
#[async_trait]
pub trait UserSendHandler: Send + Sync + 'static {
    /// Handles one stanza.
    async fn user_send(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult;
}

/// A stanza routed to this session, before it is written to the client.
/// Returning [`Flow::Stop`] drops it; otherwise it is written.
#[async_trait]
pub trait UserReceiveHandler: Send + Sync + 'static {
    /// Handles one stanza.
    async fn user_receive(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult;
}

/// A stanza received on a stream that has not authenticated yet (for
/// example XEP-0077 registration). If no handler consumes it, the stream is
/// closed with `<not-authorized/>` (RFC 6120 §4.9.3.12). The stanza has no
/// trusted `from`; `cx.info.jid` is `None`.
#[async_trait]
pub trait PreAuthHandler: Send + Sync + 'static {
    /// Handles one stanza.
    async fn pre_auth(&self, cx: &mut SessionCtx<'_>, stanza: &mut Stanza) -> HookResult;
}

/// The session bound a resource and is ready for stanzas.
#[async_trait]
pub trait SessionOpenedHandler: Send + Sync + 'static {
    /// Runs once per session.
    async fn session_opened(&self, cx: &mut SessionCtx<'_>) -> HookResult;
}

/// Adds to the `<bound/>` of every Bind 2 request (XEP-0386 §3.3), right
/// after the resource was bound: what the handler sends goes into
/// `<bound/>` (the archive's `<metadata/>`, for instance).
#[async_trait]
pub trait BoundHandler: Send + Sync + 'static {
    /// Runs once per Bind 2 request.
    async fn bound(&self, cx: &mut SessionCtx<'_>) -> HookResult;
}

/// The session is ending (the client left, the stream failed, or it was
/// replaced). Actions that write to this session are ignored; routed
/// stanzas are still routed.
#[async_trait]
pub trait SessionClosedHandler: Send + Sync + 'static {
    /// Runs once per bound session.
    async fn session_closed(&self, cx: &mut SessionCtx<'_>) -> HookResult;
}

/// A session of another cluster node was lost with its node (the node
/// stopped answering, or restarted): the session did not close, so its
/// own [`SessionClosedHandler`]s never ran. Called on one surviving node
/// per lost session, with what the registry knew of it.
#[async_trait]
pub trait SessionLostHandler: Send + Sync + 'static {
    /// Runs once per lost session.
    async fn session_lost(&self, env: &crate::Env, entry: &crate::SessionEntry) -> HookResult;

    /// The node was only cut off (a partition longer than the node
    /// timeout): it is back with the same process and this session, which
    /// [`SessionLostHandler::session_lost`] announced as gone, is still
    /// there. Called on one surviving node per session.
    async fn session_returned(
        &self,
        _env: &crate::Env,
        _entry: &crate::SessionEntry,
    ) -> HookResult {
        Ok(crate::Flow::Continue)
    }
}

/// Drops one entry of a module's node-local cache because the data behind
/// it changed on another cluster node (see [`crate::Router::invalidate`]).
pub trait CacheHandler: Send + Sync + 'static {
    /// Forgets what is cached under `key` (the module's own key format).
    fn invalidate(&self, key: &str);
}

/// A timer set by this module (see [`Action::SetTimer`]) fired.
#[async_trait]
pub trait TimerHandler: Send + Sync + 'static {
    /// Handles the timer `token`.
    async fn timer(&self, cx: &mut SessionCtx<'_>, token: u64) -> HookResult;
}

/// When in a session's life a top-level element that is not a stanza
/// arrives (see [`ElementHandler`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementStage {
    /// Before authentication.
    PreAuth,
    /// Authenticated, before resource binding.
    Authenticated,
    /// A resource is bound.
    Established,
    /// Inline in a SASL2 `<authenticate/>` (XEP-0388 §2.6.1), after the
    /// authentication succeeded and before any Bind 2 request: XEP-0198's
    /// `<resume/>`. What the handler sends goes into the `<success/>`.
    Sasl2,
    /// Inside a Bind 2 request (XEP-0386 §3.2): the resource was just bound
    /// during SASL2 authentication. What the handler sends goes into the
    /// `<bound/>` element of the `<success/>`; every namespace with a
    /// handler here is listed as an inline feature of the bind feature.
    Bind2,
}

/// Handles top-level elements that are not stanzas — XEP-0198's
/// `<enable/>`, `<r/>`, `<a/>`, `<resume/>`, XEP-0352's `<active/>` —
/// registered per ([`ElementStage`], namespace). An element no handler
/// claims closes the stream with `<unsupported-stanza-type/>`.
#[async_trait]
pub trait ElementHandler: Send + Sync + 'static {
    /// Handles one element.
    async fn element(&self, cx: &mut SessionCtx<'_>, el: &Element) -> HookResult;
}

/// One element a session wrote for its client, as a [`TrafficObserver`]
/// sees it.
pub struct Outgoing<'a> {
    el: &'a Element,
    wire: Option<&'a [u8]>,
}

impl<'a> Outgoing<'a> {
    /// `wire`: the bytes the connection wrote for `el` in the
    /// `jabber:client` default namespace (no `xmlns` on the root), when it
    /// has them (an XML stream); else they are serialised on demand.
    pub fn new(el: &'a Element, wire: Option<&'a [u8]>) -> Self {
        Outgoing { el, wire }
    }

    /// The element.
    pub fn element(&self) -> &'a Element {
        self.el
    }

    /// Appends the element's wire form in the `jabber:client` default
    /// namespace to `out`: a copy of the connection's bytes, or a fresh
    /// serialisation (WebSocket, BOSH, a detached session).
    pub fn write_wire(&self, out: &mut Vec<u8>) {
        match self.wire {
            Some(w) => out.extend_from_slice(w),
            None => self.el.write_to(out, starling_proto::ns::CLIENT),
        }
    }
}

/// Sees a session's stanza traffic, synchronously and cheaply (XEP-0198
/// counts it). Runs only after a resource is bound.
pub trait TrafficObserver: Send + Sync + 'static {
    /// One stanza arrived from the client.
    fn stanza_in(&self, info: &SessionInfo, state: &mut Extensions);
    /// One element was written to the client — or, while the session is
    /// detached, would have been. An observer that keeps it keeps its wire
    /// form ([`Outgoing::write_wire`]: the bytes the connection just
    /// wrote, copied, not a tree to free later). Returns true if the
    /// session must end (with `<policy-violation/>`): the observer's bound
    /// was exceeded.
    fn element_out(&self, info: &SessionInfo, state: &mut Extensions, out: &Outgoing<'_>) -> bool;
    /// The session is about to flush what it wrote in this turn; `out`
    /// takes elements to write first (an ack request). Returns when the
    /// observer wants to be asked again even if nothing else happens (a
    /// delayed ack request), or `None`.
    fn before_flush(
        &self,
        info: &SessionInfo,
        state: &mut Extensions,
        out: &mut Vec<Element>,
    ) -> Option<Instant>;
}

/// The connection of an established session is gone without a closing
/// handshake (end of file, I/O error, write timeout). A handler may keep
/// the session, detached, for the returned time (the longest wins); if
/// none does, the session ends.
pub trait ConnectionLostHandler: Send + Sync + 'static {
    /// How long to keep the session without a connection, if at all.
    fn connection_lost(&self, info: &SessionInfo, state: &mut Extensions) -> Option<Duration>;
}

/// A connection was handed to this session ([`Action::Attach`]), or the
/// handing over failed (`failed`: the session it was meant for is gone;
/// then this runs in the session that asked).
#[async_trait]
pub trait AttachHandler: Send + Sync + 'static {
    /// `request` is the client's element that asked for the connection to
    /// be attached.
    async fn attached(
        &self,
        cx: &mut SessionCtx<'_>,
        request: &Element,
        failed: bool,
    ) -> HookResult;
}

/// Waits until everything earlier handlers queued for writing is durable
/// (committed to storage), so an acknowledgement may cover it.
#[async_trait]
pub trait DurabilityHandler: Send + Sync + 'static {
    /// Returns once the writes queued so far are committed (or failed
    /// their retries).
    async fn durable(&self, env: &Env);

    /// Like [`DurabilityHandler::durable`], for an acknowledgement to one
    /// session: a module whose writes happen later, in a task of its own
    /// (a group-chat room archives what the session sent it when the room
    /// gets to it), first waits for what this session handed it (kept in
    /// the session's state).
    async fn durable_for(&self, cx: &mut SessionCtx<'_>) {
        self.durable(cx.env).await
    }
}

/// An account is about to be deleted (in-band, XEP-0077 §3.2, or by an
/// administrator through the running server): modules whose live state
/// names it (rooms' members) let go of it and tell whoever must know,
/// before its stored data is removed. Called with the account's sessions
/// still open; `Storage::delete_account` runs after every handler
/// returned.
#[async_trait]
pub trait AccountRemovedHandler: Send + Sync + 'static {
    /// `jid`'s account is being deleted.
    async fn account_removed(&self, env: &Env, jid: &BareJid);
}

/// Serves one Private XML Storage fragment (XEP-0049) from another
/// module's data: XEP-0048 bookmarks (`{storage:bookmarks}storage`) are a
/// view of the account's XEP-0402 PEP bookmarks (XEP-0402 §5.3 "compat"),
/// so old and new clients see the same list.
#[async_trait]
pub trait PrivateFragmentHandler: Send + Sync + 'static {
    /// The fragment as the account's data makes it (the whole element).
    async fn get(&self, env: &Env, owner: &BareJid) -> Result<Element, StanzaError>;
    /// Stores the fragment `el` by changing the account's data.
    async fn set(&self, env: &Env, owner: &BareJid, el: &Element) -> Result<(), StanzaError>;
}

/// One copy of a message the archive kept (XEP-0313): `owner`'s archive
/// got message `id`, exchanged with `peer`.
pub struct Archived<'a> {
    /// Whose archive.
    pub owner: &'a BareJid,
    /// The other party (bare JID).
    pub peer: &'a BareJid,
    /// The archive id of this copy.
    pub id: ArchiveId,
    /// The owner sent it (true) or received it (false).
    pub outgoing: bool,
    /// How it counts (instant message, correction, other).
    pub kind: starling_proto::mam::Kind,
    /// The message as archived.
    pub element: &'a Element,
    /// The copy is in the peer's archive, not the owner's: a group chat
    /// room archived it once for all its members (`owner` is a member).
    pub shared: bool,
}

/// Follows what the archive keeps: the inbox counts unread messages from
/// it. Called by the archive module for each archived copy, after it is
/// queued for writing (it may not be committed yet; [`Hooks::durable`]
/// waits for that).
#[async_trait]
pub trait ArchivedHandler: Send + Sync + 'static {
    /// `msg` was archived.
    async fn archived(&self, env: &Env, msg: &Archived<'_>);
}

/// When in negotiation stream features are offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FeatureStage {
    /// Before authentication (next to the SASL mechanisms).
    PreAuth,
    /// After authentication (next to resource binding).
    PostAuth,
    /// Inside the SASL2 `<authentication/>` feature's `<inline/>`
    /// (XEP-0388 §2.1): what an `<authenticate/>` may carry, e.g.
    /// XEP-0198's `<sm/>`.
    Sasl2Inline,
}

/// Contributes elements to `<stream:features/>` (RFC 6120 §4.3.2).
pub trait StreamFeatureProvider: Send + Sync + 'static {
    /// Appends this module's features for `stage` to `out`.
    fn stream_features(
        &self,
        env: &Env,
        info: &SessionInfo,
        stage: FeatureStage,
        out: &mut Vec<Element>,
    );
}

/// A message of type chat or normal for an existing account with no
/// available resource (RFC 6121 §8.5.2.1.1). A handler that stores it
/// returns [`Flow::Stop`]; if none does, the sender gets
/// `<service-unavailable/>`.
///
/// Handlers that run before the storing one put in `companions` the rows
/// that must become durable together with the stored message (the
/// recipient's archive copy); the storing handler commits them in the same
/// transaction, so offline delivery and history cannot disagree after a
/// crash. Companions of a message that is not stored are not written
/// (the sender gets an error: the message was not accepted).
#[async_trait]
pub trait OfflineMessageHandler: Send + Sync + 'static {
    /// Handles one message.
    async fn offline_message(
        &self,
        env: &Env,
        stanza: &Stanza,
        companions: &mut OfflineCompanions,
    ) -> HookResult;
}

/// Rows written in the same transaction as an offline message (see
/// [`OfflineMessageHandler`]).
#[derive(Default, Debug)]
pub struct OfflineCompanions {
    /// Archive rows (the recipient's copy of the message).
    pub archive: Vec<crate::storage::ArchiveRecord>,
}

/// A stanza addressed to a local account (bare or full JID), seen by the
/// router before it applies its delivery rules (RFC 6121 §8.5). A handler
/// that answers or drops it returns [`Flow::Stop`]. Used for rules that must
/// hold whatever resource is online, e.g. block lists (XEP-0191) and
/// subscription handling (RFC 6121 §3). A handler may change the stanza
/// before delivery (for example the archive adds a XEP-0359 stanza id).
#[async_trait]
pub trait InboundHandler: Send + Sync + 'static {
    /// Handles one stanza; `to` is a local account.
    async fn inbound(&self, env: &Env, stanza: &mut Stanza) -> HookResult;
}

/// The server is shutting down: every session has closed and storage is
/// still open. Modules with background writers flush them here.
#[async_trait]
pub trait ShutdownHandler: Send + Sync + 'static {
    /// Runs once, before storage is closed.
    async fn shutdown(&self, env: &Env);
}

/// Runs once when the server has built its [`Env`], before the listeners
/// open: for modules with tasks of their own that need it (group-chat
/// rooms run as tasks that route stanzas). Keep a `Weak` of it: the
/// environment holds the hooks, which hold the handler.
pub trait StartedHandler: Send + Sync + 'static {
    /// The server's environment.
    fn started(&self, env: &Arc<Env>);
}

/// Who an iq is addressed to, from the server's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IqScope {
    /// The server itself (`to` is a local domain).
    Server,
    /// An account's bare JID, answered by the server on the account's
    /// behalf (RFC 6121 §8.5.2.1.3), including iqs with no `to`.
    Account,
}

/// The answer of an iq handler.
#[derive(Debug)]
pub enum IqResponse {
    /// Reply `type='result'` with this payload.
    Result(Option<Element>),
    /// Reply `type='error'`.
    Error(StanzaError),
    /// The handler took care of any reply itself.
    Handled,
}

/// Handles iq get/set requests whose payload is in one namespace.
#[async_trait]
pub trait IqHandler: Send + Sync + 'static {
    /// Handles one request. `iq.from()` is the trusted sender.
    async fn handle_iq(&self, env: &Env, scope: IqScope, iq: &Stanza) -> IqResponse;
}

/// Handles iq get/set requests a user sends to their own account: no `to`,
/// or `to` their bare JID (RFC 6120 §10.3.3, RFC 6121 §2.1.3). These are
/// answered inside the sending session, on one path: the handler sees the
/// session (its per-session state, such as the roster cache) and what it
/// sends goes straight to that session, never through a mailbox (large
/// archive pages). Requests for another account's data go to the
/// [`IqHandler`] of [`IqScope::Account`] instead.
#[async_trait]
pub trait OwnIqHandler: Send + Sync + 'static {
    /// Handles one request; elements sent with `cx.send` precede the
    /// answer.
    async fn own_iq(&self, cx: &mut SessionCtx<'_>, iq: &Stanza) -> IqResponse;
}

/// The address a local service owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceAddress {
    /// `<label>.<domain>` for every served domain (`conference` gives
    /// `conference.example.org` on a server for `example.org`).
    Subdomain(&'static str),
    /// One fixed domain.
    Domain(String),
}

/// A local service: it owns a domain (see [`ServiceAddress`]) and gets
/// every stanza addressed to that domain or to a JID in it (rooms,
/// occupants, nodes), with `from` already stamped by the sender's session.
/// Group chat, pubsub, upload and components are services; the router
/// knows them only through this registry.
#[async_trait]
pub trait Service: Send + Sync + 'static {
    /// Handles one stanza. Replies go out through `env.route`; errors are
    /// the service's to send (a stanza it ignores is dropped).
    async fn handle(&self, env: &Env, stanza: Stanza);

    /// Handles a stanza another cluster node placed here
    /// ([`crate::Router::to_service_on`]): it must be handled on this node,
    /// never sent on again.
    async fn handle_placed(&self, env: &Env, stanza: Stanza) {
        self.handle(env, stanza).await
    }
}

struct ServiceEntry {
    address: ServiceAddress,
    name: String,
    module: &'static str,
    bit: u64,
    service: Arc<dyn Service>,
}

struct OwnIqEntry {
    name: String,
    module: &'static str,
    bit: u64,
    handler: Arc<dyn OwnIqHandler>,
}

struct IqEntry {
    scope: IqScope,
    name: String,
    module: &'static str,
    bit: u64,
    handler: Arc<dyn IqHandler>,
}

struct ElementEntry {
    stage: ElementStage,
    ns: String,
    module: &'static str,
    bit: u64,
    handler: Arc<dyn ElementHandler>,
}

struct Registered<T: ?Sized> {
    priority: i32,
    module: &'static str,
    /// [`crate::module::module_bit`] of `module`.
    bit: u64,
    handler: Arc<T>,
}

/// A priority-ordered chain of handlers of one hook.
pub struct Chain<T: ?Sized> {
    handlers: Vec<Registered<T>>,
}

impl<T: ?Sized> Default for Chain<T> {
    fn default() -> Self {
        Chain {
            handlers: Vec::new(),
        }
    }
}

impl<T: ?Sized> Chain<T> {
    fn add(&mut self, priority: i32, module: &'static str, handler: Arc<T>) {
        self.handlers.push(Registered {
            priority,
            module,
            bit: crate::module::module_bit(module),
            handler,
        });
        // Stable sort: equal priorities keep registration order.
        self.handlers.sort_by_key(|r| r.priority);
    }

    /// True when no handler is registered.
    pub fn is_empty(&self) -> bool {
        self.handlers.is_empty()
    }

    /// The handlers in running order, with their module names.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &Arc<T>)> {
        self.handlers.iter().map(|r| (r.module, &r.handler))
    }

    /// [`Chain::iter`] without the modules switched off in `off` (a
    /// domain's [`crate::Host::modules_off`]).
    pub fn iter_on(&self, off: u64) -> impl Iterator<Item = (&'static str, &Arc<T>)> {
        self.handlers
            .iter()
            .filter(move |r| r.bit & off == 0)
            .map(|r| (r.module, &r.handler))
    }
}

/// Logs a handler failure; the chain continues.
pub fn log_failure(hook: &'static str, module: &'static str, err: &HookError) {
    tracing::error!(hook, module, error = %err, "hook handler failed; skipped");
}

/// Runs a chain; stops at the first [`Flow::Stop`]. Failed handlers are
/// logged and skipped.
#[macro_export]
macro_rules! run_chain {
    ($chain:expr, $hook:literal, |$h:ident| $call:expr) => {
        $crate::run_chain!($chain, $hook, off = 0, |$h| $call)
    };
    // `off`: the modules switched off for the domain concerned
    // ([`crate::Host::modules_off`]) are skipped.
    ($chain:expr, $hook:literal, off = $off:expr, |$h:ident| $call:expr) => {{
        let mut flow = $crate::Flow::Continue;
        for (module, $h) in $chain.iter_on($off) {
            match $call.await {
                Ok($crate::Flow::Continue) => {}
                Ok($crate::Flow::Stop) => {
                    flow = $crate::Flow::Stop;
                    break;
                }
                Err(e) => $crate::hooks::log_failure($hook, module, &e),
            }
        }
        flow
    }};
}

/// Where modules register their handlers. Frozen into [`Hooks`] once all
/// enabled modules are started.
#[derive(Default)]
pub struct HookRegistry {
    hooks: Hooks,
    /// The module being started ([`HookRegistry::begin_module`]): disco
    /// declarations and stream features are tagged with it.
    current: Option<&'static str>,
    /// Registries the embedding server defines and modules fill at start
    /// (see [`HookRegistry::provide`]).
    provided: Extensions,
}

/// All registered handlers, shared read-only by every session.
#[derive(Default)]
pub struct Hooks {
    /// [`UserSendHandler`]s.
    pub user_send: Chain<dyn UserSendHandler>,
    /// [`UserReceiveHandler`]s.
    pub user_receive: Chain<dyn UserReceiveHandler>,
    /// [`PreAuthHandler`]s.
    pub pre_auth: Chain<dyn PreAuthHandler>,
    /// [`SessionOpenedHandler`]s.
    pub session_opened: Chain<dyn SessionOpenedHandler>,
    /// [`SessionClosedHandler`]s.
    pub session_closed: Chain<dyn SessionClosedHandler>,
    /// [`SessionLostHandler`]s.
    pub session_lost: Chain<dyn SessionLostHandler>,
    /// [`CacheHandler`]s by module name.
    caches: HashMap<&'static str, Arc<dyn CacheHandler>>,
    /// [`BoundHandler`]s.
    pub bound: Chain<dyn BoundHandler>,
    /// [`OfflineMessageHandler`]s.
    pub offline_message: Chain<dyn OfflineMessageHandler>,
    /// [`InboundHandler`]s.
    pub inbound: Chain<dyn InboundHandler>,
    /// [`StreamFeatureProvider`]s with their modules' bits (see
    /// [`Hooks::stream_features_on`]).
    stream_features: Vec<(u64, Arc<dyn StreamFeatureProvider>)>,
    /// [`ShutdownHandler`]s.
    pub shutdown: Chain<dyn ShutdownHandler>,
    /// [`StartedHandler`]s.
    pub started: Vec<Arc<dyn StartedHandler>>,
    /// [`TrafficObserver`]s.
    pub traffic: Vec<Arc<dyn TrafficObserver>>,
    /// [`ConnectionLostHandler`]s.
    pub connection_lost: Vec<Arc<dyn ConnectionLostHandler>>,
    /// [`AttachHandler`]s.
    pub attached: Chain<dyn AttachHandler>,
    /// [`DurabilityHandler`]s.
    pub durability: Vec<Arc<dyn DurabilityHandler>>,
    /// [`AccountRemovedHandler`]s.
    pub account_removed: Vec<Arc<dyn AccountRemovedHandler>>,
    /// Private XML fragments served by modules, by `{ns}name`.
    pub private_fragments: Vec<(String, Arc<dyn PrivateFragmentHandler>)>,
    /// [`ArchivedHandler`]s.
    pub archived: Chain<dyn ArchivedHandler>,
    /// [`ElementHandler`]s by (stage, namespace).
    elements: Vec<ElementEntry>,
    timers: HashMap<&'static str, Arc<dyn TimerHandler>>,
    /// namespace → (scope, element name, module, handler); looked up by
    /// `&str` so routing an iq allocates nothing.
    iq: HashMap<String, Vec<IqEntry>>,
    /// namespace → own-account handlers.
    own_iq: HashMap<String, Vec<OwnIqEntry>>,
    /// Local services.
    services: Vec<ServiceEntry>,
    /// Features and identities for service discovery, declared by modules.
    pub disco: DiscoRegistry,
}

impl Hooks {
    /// The handler of non-stanza elements in namespace `ns` at `stage`,
    /// with its module's name.
    /// `off`: the modules switched off for the session's domain
    /// ([`crate::Host::modules_off`]); theirs are not found.
    pub fn element_handler(
        &self,
        stage: ElementStage,
        ns: &str,
        off: u64,
    ) -> Option<(&'static str, &Arc<dyn ElementHandler>)> {
        // Few entries: a linear scan, no key to allocate.
        self.elements
            .iter()
            .find(|e| e.stage == stage && e.ns == ns && e.bit & off == 0)
            .map(|e| (e.module, &e.handler))
    }

    /// The stream feature providers of the modules not switched off in
    /// `off`.
    pub fn stream_features_on(
        &self,
        off: u64,
    ) -> impl Iterator<Item = &Arc<dyn StreamFeatureProvider>> {
        self.stream_features
            .iter()
            .filter(move |(bit, _)| bit & off == 0)
            .map(|(_, p)| p)
    }

    /// The namespaces with a handler at `stage`, in registration order,
    /// without those of modules switched off in `off`.
    pub fn element_namespaces(&self, stage: ElementStage, off: u64) -> impl Iterator<Item = &str> {
        self.elements
            .iter()
            .filter(move |e| e.stage == stage && e.bit & off == 0)
            .map(|e| e.ns.as_str())
    }

    /// The module serving private fragment `key` (`{ns}name`), if any.
    pub fn private_fragment(&self, key: &str) -> Option<&Arc<dyn PrivateFragmentHandler>> {
        self.private_fragments
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, h)| h)
    }

    /// Waits until every [`DurabilityHandler`] says its queued writes are
    /// committed.
    pub async fn durable(&self, env: &Env) {
        for h in &self.durability {
            h.durable(env).await;
        }
    }

    /// [`Hooks::durable`] for an acknowledgement to the session of `cx`
    /// ([`DurabilityHandler::durable_for`]).
    pub async fn durable_for(&self, cx: &mut SessionCtx<'_>) {
        for h in &self.durability {
            h.durable_for(cx).await;
        }
    }

    /// Tells every [`ArchivedHandler`] about an archived copy (not those
    /// of modules switched off for the owner's domain).
    pub async fn archived(&self, env: &Env, msg: &Archived<'_>) {
        let off = env
            .hosts
            .modules_off(msg.owner.domain().as_str())
            .unwrap_or(0);
        for (_, h) in self.archived.iter_on(off) {
            h.archived(env, msg).await;
        }
    }

    /// The timer handler of `module`.
    pub fn timer(&self, module: &str) -> Option<&Arc<dyn TimerHandler>> {
        self.timers.get(module)
    }

    /// The cache handler of `module` (a name read off the wire).
    pub fn cache(&self, module: &str) -> Option<&Arc<dyn CacheHandler>> {
        self.caches.get(module)
    }

    /// The registered name of a module with a timer handler (a name read
    /// off the wire, back to the `'static` one a [`TimerKey`] holds).
    pub fn timer_module(&self, module: &str) -> Option<&'static str> {
        self.timers.get_key_value(module).map(|(k, _)| *k)
    }

    /// The service owning `domain`, if any. `modules_off` says which
    /// domains are served (a subdomain service exists under each of them)
    /// and which modules each switches off
    /// ([`crate::Hosts::modules_off`]): a subdomain service whose module
    /// is off for the parent domain does not exist there.
    pub fn service_for(
        &self,
        domain: &str,
        modules_off: impl Fn(&str) -> Option<u64>,
    ) -> Option<&Arc<dyn Service>> {
        self.services
            .iter()
            .find(|e| match &e.address {
                ServiceAddress::Domain(d) => d == domain,
                ServiceAddress::Subdomain(label) => domain
                    .strip_prefix(label)
                    .and_then(|r| r.strip_prefix('.'))
                    .and_then(&modules_off)
                    .is_some_and(|off| off & e.bit == 0),
            })
            .map(|e| &e.service)
    }

    /// The services under served domain `domain` with their names
    /// (`disco#items` of the server, XEP-0030 §4), without those of
    /// modules switched off in `off` (the domain's
    /// [`crate::Host::modules_off`]).
    pub fn services_of(&self, domain: &str, off: u64) -> Vec<(String, &str)> {
        self.services
            .iter()
            .filter(|e| e.bit & off == 0)
            .filter_map(|e| {
                let jid = match &e.address {
                    ServiceAddress::Subdomain(label) => format!("{label}.{domain}"),
                    ServiceAddress::Domain(d)
                        if d.strip_suffix(domain).is_some_and(|p| p.ends_with('.')) =>
                    {
                        d.clone()
                    }
                    ServiceAddress::Domain(_) => return None,
                };
                Some((jid, e.name.as_str()))
            })
            .collect()
    }

    /// The own-account handler for a payload `{ns}name`, unless its
    /// module is switched off in `off` (the account's domain's
    /// [`crate::Host::modules_off`]).
    pub fn own_iq_handler(&self, name: &str, ns: &str, off: u64) -> Option<&Arc<dyn OwnIqHandler>> {
        self.own_iq
            .get(ns)?
            .iter()
            .find(|e| e.name == name && e.bit & off == 0)
            .map(|e| &e.handler)
    }

    /// The iq handler for a payload `{ns}name` in `scope`, unless its
    /// module is switched off in `off` (the addressed domain's).
    pub fn iq_handler(
        &self,
        scope: IqScope,
        name: &str,
        ns: &str,
        off: u64,
    ) -> Option<&Arc<dyn IqHandler>> {
        self.iq
            .get(ns)?
            .iter()
            .find(|e| e.scope == scope && e.name == name && e.bit & off == 0)
            .map(|e| &e.handler)
    }
}

impl HookRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a [`UserSendHandler`].
    pub fn user_send(&mut self, module: &'static str, priority: i32, h: Arc<dyn UserSendHandler>) {
        self.hooks.user_send.add(priority, module, h);
    }

    /// Registers a [`UserReceiveHandler`].
    pub fn user_receive(
        &mut self,
        module: &'static str,
        priority: i32,
        h: Arc<dyn UserReceiveHandler>,
    ) {
        self.hooks.user_receive.add(priority, module, h);
    }

    /// Registers a [`PreAuthHandler`].
    pub fn pre_auth(&mut self, module: &'static str, priority: i32, h: Arc<dyn PreAuthHandler>) {
        self.hooks.pre_auth.add(priority, module, h);
    }

    /// Registers a [`SessionOpenedHandler`].
    pub fn session_opened(
        &mut self,
        module: &'static str,
        priority: i32,
        h: Arc<dyn SessionOpenedHandler>,
    ) {
        self.hooks.session_opened.add(priority, module, h);
    }

    /// Registers a [`BoundHandler`].
    pub fn bound(&mut self, module: &'static str, priority: i32, h: Arc<dyn BoundHandler>) {
        self.hooks.bound.add(priority, module, h);
    }

    /// Registers a [`SessionClosedHandler`].
    pub fn session_closed(
        &mut self,
        module: &'static str,
        priority: i32,
        h: Arc<dyn SessionClosedHandler>,
    ) {
        self.hooks.session_closed.add(priority, module, h);
    }

    /// Registers `module`'s [`CacheHandler`].
    pub fn cache(&mut self, module: &'static str, h: Arc<dyn CacheHandler>) {
        self.hooks.caches.insert(module, h);
    }

    /// Registers a [`SessionLostHandler`].
    pub fn session_lost(
        &mut self,
        module: &'static str,
        priority: i32,
        h: Arc<dyn SessionLostHandler>,
    ) {
        self.hooks.session_lost.add(priority, module, h);
    }

    /// Registers an [`OfflineMessageHandler`].
    pub fn offline_message(
        &mut self,
        module: &'static str,
        priority: i32,
        h: Arc<dyn OfflineMessageHandler>,
    ) {
        self.hooks.offline_message.add(priority, module, h);
    }

    /// Registers an [`InboundHandler`].
    pub fn inbound(&mut self, module: &'static str, priority: i32, h: Arc<dyn InboundHandler>) {
        self.hooks.inbound.add(priority, module, h);
    }

    /// Registers a [`ShutdownHandler`].
    pub fn shutdown(&mut self, module: &'static str, priority: i32, h: Arc<dyn ShutdownHandler>) {
        self.hooks.shutdown.add(priority, module, h);
    }

    /// Registers a [`StartedHandler`].
    pub fn started(&mut self, h: Arc<dyn StartedHandler>) {
        self.hooks.started.push(h);
    }

    /// Registers a [`TrafficObserver`].
    pub fn traffic(&mut self, h: Arc<dyn TrafficObserver>) {
        self.hooks.traffic.push(h);
    }

    /// Registers a [`ConnectionLostHandler`].
    pub fn connection_lost(&mut self, h: Arc<dyn ConnectionLostHandler>) {
        self.hooks.connection_lost.push(h);
    }

    /// Registers an [`AttachHandler`].
    pub fn attached(&mut self, module: &'static str, priority: i32, h: Arc<dyn AttachHandler>) {
        self.hooks.attached.add(priority, module, h);
    }

    /// Registers the [`PrivateFragmentHandler`] of the fragment `{ns}name`.
    ///
    /// # Panics
    /// If another module serves that fragment.
    pub fn private_fragment(&mut self, name: &str, ns: &str, h: Arc<dyn PrivateFragmentHandler>) {
        let key = format!("{{{ns}}}{name}");
        assert!(
            !self.hooks.private_fragments.iter().any(|(k, _)| *k == key),
            "two modules serve the private fragment {key}"
        );
        self.hooks.private_fragments.push((key, h));
    }

    /// Registers an [`AccountRemovedHandler`].
    pub fn account_removed(&mut self, h: Arc<dyn AccountRemovedHandler>) {
        self.hooks.account_removed.push(h);
    }

    /// Registers a [`DurabilityHandler`].
    pub fn durability(&mut self, h: Arc<dyn DurabilityHandler>) {
        self.hooks.durability.push(h);
    }

    /// Registers an [`ArchivedHandler`].
    pub fn archived(&mut self, module: &'static str, priority: i32, h: Arc<dyn ArchivedHandler>) {
        self.hooks.archived.add(priority, module, h);
    }

    /// Registers the [`ElementHandler`] for namespace `ns` at `stage`.
    ///
    /// # Panics
    /// If another module already handles that namespace at that stage.
    pub fn element(
        &mut self,
        module: &'static str,
        stage: ElementStage,
        ns: &str,
        h: Arc<dyn ElementHandler>,
    ) {
        if let Some(other) = self
            .hooks
            .elements
            .iter()
            .find(|e| e.stage == stage && e.ns == ns)
        {
            panic!(
                "modules {} and {module} both handle {{{ns}}} elements at {stage:?}",
                other.module
            );
        }
        self.hooks.elements.push(ElementEntry {
            stage,
            ns: ns.to_owned(),
            module,
            bit: crate::module::module_bit(module),
            handler: h,
        });
    }

    /// Registers a [`StreamFeatureProvider`] of the module being started
    /// ([`HookRegistry::begin_module`]).
    pub fn stream_features(&mut self, h: Arc<dyn StreamFeatureProvider>) {
        let bit = self.current.map_or(0, crate::module::module_bit);
        self.hooks.stream_features.push((bit, h));
    }

    /// Says which module registers what follows (the server calls it
    /// before each module's `start`): the disco features and stream
    /// features declared next belong to `module`, and are hidden for the
    /// domains that switch it off.
    pub fn begin_module(&mut self, module: &'static str) {
        self.current = Some(module);
        self.hooks.disco.current_bit = crate::module::module_bit(module);
    }

    /// Ends [`HookRegistry::begin_module`]: what is declared next belongs
    /// to no module and is shown for every domain.
    pub fn end_module(&mut self) {
        self.current = None;
        self.hooks.disco.current_bit = 0;
    }

    /// Registers the [`TimerHandler`] for timers set with `module`'s name.
    pub fn timer(&mut self, module: &'static str, h: Arc<dyn TimerHandler>) {
        self.hooks.timers.insert(module, h);
    }

    /// Registers an [`IqHandler`] for payload `{ns}name` in `scope`.
    ///
    /// # Panics
    /// If another module already handles the same payload in the same scope:
    /// two enabled modules claiming one namespace is a configuration bug that
    /// must stop start-up, not be resolved silently.
    pub fn iq(
        &mut self,
        module: &'static str,
        scope: IqScope,
        name: &str,
        ns: &str,
        h: Arc<dyn IqHandler>,
    ) {
        let entries = self.hooks.iq.entry(ns.to_owned()).or_default();
        if let Some(other) = entries.iter().find(|e| e.scope == scope && e.name == name) {
            panic!(
                "modules {} and {module} both handle {{{ns}}}{name} in {scope:?} scope",
                other.module
            );
        }
        entries.push(IqEntry {
            scope,
            name: name.to_owned(),
            module,
            bit: crate::module::module_bit(module),
            handler: h,
        });
    }

    /// Registers a local [`Service`] at `address`, listed in the server's
    /// `disco#items` as `name`.
    ///
    /// # Panics
    /// If another service already owns that address.
    pub fn service(
        &mut self,
        module: &'static str,
        address: ServiceAddress,
        name: &str,
        service: Arc<dyn Service>,
    ) {
        if let Some(other) = self.hooks.services.iter().find(|e| e.address == address) {
            panic!(
                "modules {} and {module} both claim the service address {address:?}",
                other.module
            );
        }
        self.hooks.services.push(ServiceEntry {
            address,
            name: name.to_owned(),
            module,
            bit: crate::module::module_bit(module),
            service,
        });
    }

    /// Registers the [`OwnIqHandler`] for payload `{ns}name`.
    ///
    /// # Panics
    /// If another module already handles that payload.
    pub fn own_iq(&mut self, module: &'static str, name: &str, ns: &str, h: Arc<dyn OwnIqHandler>) {
        let entries = self.hooks.own_iq.entry(ns.to_owned()).or_default();
        if let Some(other) = entries.iter().find(|e| e.name == name) {
            panic!(
                "modules {} and {module} both handle own-account {{{ns}}}{name}",
                other.module
            );
        }
        entries.push(OwnIqEntry {
            name: name.to_owned(),
            module,
            bit: crate::module::module_bit(module),
            handler: h,
        });
    }

    /// Service discovery declarations.
    pub fn disco(&mut self) -> &mut DiscoRegistry {
        &mut self.hooks.disco
    }

    /// Lends modules a registry that the embedding server defines, for
    /// contributions this crate has no type for — the server's HTTP routes
    /// (`starling_server::HttpRoutes`), so that HTTP types stay out of the
    /// extension API. Keyed by type: the server provides an empty registry
    /// before it starts the modules, a module fills it through
    /// [`HookRegistry::provided`], and the server takes it back with
    /// [`HookRegistry::take_provided`] before [`HookRegistry::build`]
    /// (what is left is dropped there).
    pub fn provide<T: std::any::Any + Send>(&mut self, registry: T) {
        self.provided.insert(registry);
    }

    /// The provided registry of type `T`; `None` when the server running
    /// the module provides none (a module then says what it cannot do).
    pub fn provided<T: std::any::Any + Send>(&mut self) -> Option<&mut T> {
        self.provided.get_mut::<T>()
    }

    /// Takes back the provided registry of type `T`.
    pub fn take_provided<T: std::any::Any + Send>(&mut self) -> Option<T> {
        self.provided.remove::<T>()
    }

    /// Freezes the registry.
    pub fn build(self) -> Hooks {
        self.hooks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::DomainSettings;

    struct Order(&'static str, Flow);
    #[async_trait]
    impl OfflineMessageHandler for Order {
        async fn offline_message(
            &self,
            _env: &Env,
            _s: &Stanza,
            _c: &mut OfflineCompanions,
        ) -> HookResult {
            if self.0 == "fail" {
                return Err("boom".into());
            }
            Ok(self.1)
        }
    }

    #[test]
    fn chain_orders_by_priority_then_registration() {
        let mut reg = HookRegistry::new();
        reg.offline_message("b", 50, Arc::new(Order("b", Flow::Continue)));
        reg.offline_message("a", 10, Arc::new(Order("a", Flow::Continue)));
        reg.offline_message("c", 50, Arc::new(Order("c", Flow::Continue)));
        let hooks = reg.build();
        let names: Vec<_> = hooks.offline_message.iter().map(|(m, _)| m).collect();
        assert_eq!(names, ["a", "b", "c"]);
    }

    #[test]
    fn provided_registries_are_lent_to_modules_and_taken_back() {
        struct Routes(Vec<&'static str>);
        let mut reg = HookRegistry::new();
        assert!(reg.provided::<Routes>().is_none(), "nothing provided yet");
        reg.provide(Routes(Vec::new()));
        reg.provided::<Routes>().unwrap().0.push("/upload");
        assert_eq!(reg.take_provided::<Routes>().unwrap().0, ["/upload"]);
        assert!(reg.provided::<Routes>().is_none());
    }

    #[test]
    #[should_panic(expected = "both claim the service address")]
    fn two_services_on_one_address_panic() {
        struct S;
        #[async_trait]
        impl Service for S {
            async fn handle(&self, _: &Env, _: Stanza) {}
        }
        let mut reg = HookRegistry::new();
        reg.service("a", ServiceAddress::Subdomain("muc"), "", Arc::new(S));
        reg.service("b", ServiceAddress::Subdomain("muc"), "", Arc::new(S));
    }

    #[test]
    #[should_panic(expected = "both handle")]
    fn iq_registry_duplicate_namespace_panics() {
        struct H;
        #[async_trait]
        impl IqHandler for H {
            async fn handle_iq(&self, _: &Env, _: IqScope, _: &Stanza) -> IqResponse {
                IqResponse::Handled
            }
        }
        let mut reg = HookRegistry::new();
        reg.iq("m1", IqScope::Server, "ping", "urn:xmpp:ping", Arc::new(H));
        reg.iq("m2", IqScope::Server, "ping", "urn:xmpp:ping", Arc::new(H));
    }

    #[test]
    fn switched_off_modules_are_skipped_in_chains_services_and_lookups() {
        struct S;
        #[async_trait]
        impl Service for S {
            async fn handle(&self, _: &Env, _: Stanza) {}
        }
        let mut reg = HookRegistry::new();
        reg.offline_message("t_first", 10, Arc::new(Order("a", Flow::Continue)));
        reg.offline_message("t_second", 20, Arc::new(Order("b", Flow::Continue)));
        reg.service(
            "t_rooms",
            ServiceAddress::Subdomain("rooms"),
            "",
            Arc::new(S),
        );
        let hooks = reg.build();
        let off = crate::module::modules_mask(["t_first", "t_rooms"]);
        let names: Vec<_> = hooks.offline_message.iter_on(off).map(|(m, _)| m).collect();
        assert_eq!(names, ["t_second"]);
        assert_eq!(hooks.offline_message.iter_on(0).count(), 2);
        // The subdomain service exists under a served domain unless its
        // module is off there.
        let hosts = crate::Hosts::new(["a.example".to_owned()]);
        hosts.set(
            "b.example",
            DomainSettings {
                disabled_modules: Some(vec!["t_rooms".into()]),
                ..Default::default()
            },
        );
        let find = |d| hooks.service_for(d, |p| hosts.modules_off(p)).is_some();
        assert!(find("rooms.a.example"));
        assert!(!find("rooms.b.example"));
        assert!(!find("rooms.c.example"));
        assert_eq!(hooks.services_of("b.example", off).len(), 0);
        // A session's handle sees a settings change at once.
        let live = hosts.get("b.example").unwrap().modules_off_handle();
        hosts.set("b.example", DomainSettings::default());
        assert_eq!(live.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert!(find("rooms.b.example"));
    }
}
