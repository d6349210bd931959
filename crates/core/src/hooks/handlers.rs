//! The hook points: one trait per hook, with the types their calls take
//! and return (stages, outgoing elements, archived messages, iq scopes and
//! answers, service addresses).

use super::{HookResult, SessionCtx, SessionInfo};
use crate::storage::ArchiveId;
use crate::{Env, Extensions};
use async_trait::async_trait;
use starling_proto::{BareJid, Stanza, StanzaError};
use starling_xml::Element;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
