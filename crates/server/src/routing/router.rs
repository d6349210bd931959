//! Routing of stanzas on one node (RFC 6120 §10, RFC 6121 §8.5).
//!
//! | `to`                           | message                              | presence                 | iq get/set                   |
//! |--------------------------------|--------------------------------------|--------------------------|------------------------------|
//! | a local service's domain (or a JID in it) | the service (`Service::handle`) | the service   | the service                  |
//! | remote domain                  | `remote-server-not-found` (no s2s)   | dropped                  | `remote-server-not-found`    |
//! | local domain (± resource)      | `service-unavailable`¹               | dropped                  | server iq handlers, else `service-unavailable` |
//! | bare JID, no such account      | `service-unavailable` (§8.5.1)       | dropped                  | `service-unavailable`        |
//! | bare JID, available resources  | chat/normal: highest priority ≥ 0; headline: all ≥ 0 (§8.5.2.1.1); groupchat: `service-unavailable`, from a local service² all ≥ 0 | all available (§8.5.2.1.2) | account iq handlers (§8.5.2.1.3) |
//! | bare JID, none available       | chat/normal: offline hook, else `service-unavailable`; headline dropped; groupchat from a local service² dropped | dropped | account iq handlers |
//! | full JID, session bound        | delivered (§8.5.3.1)                 | delivered                | delivered                    |
//! | full JID, no such session      | as bare JID (§8.5.3.2.1); groupchat: `service-unavailable` | dropped (§8.5.3.2.3) | `service-unavailable` (§8.5.3.2.2) |
//!
//! ¹ type error/headline/groupchat messages are dropped instead; an error is
//! never answered with an error (RFC 6120 §8.3.1).
//! ² a MUC Light room delivers to its members' bare JIDs; its archive and
//! the members' inboxes keep what they were not online for.
//!
//! Subscription presence and probes to a local account are consumed by the
//! roster and presence modules in the `inbound` chain (RFC 6121 §3, §4.3);
//! without them they are dropped here. iq results and errors addressed to the server
//! or to a bare JID are dropped: modules that issue requests consume the
//! answers in their own hooks.

use super::sessions::{Replaced, SessionTable};
use crate::cluster::Cluster;
use async_trait::async_trait;
use starling_core::hooks::{IqResponse, IqScope, OfflineCompanions, TimerKey};
use starling_core::{
    run_chain, CloseReason, Env, Flow, Handover, Router, SessionEntry, SessionHandle, SessionMsg,
    SessionRef, SessionSendError, TooManyResources,
};
use starling_proto::{
    BareJid, ErrorType, FullJid, Jid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind,
    StreamError, StreamErrorCondition,
};
use std::sync::Arc;
use std::time::Instant;

/// The router. It owns the session table's mailboxes: nothing else puts
/// messages in a session's queue. In a cluster, a session of another node
/// is reached through the cluster bus ([`Cluster`]): the same rules pick
/// the resources, wherever they are bound.
pub struct LocalRouter {
    table: Arc<SessionTable>,
    cluster: std::sync::OnceLock<Arc<Cluster>>,
}

impl LocalRouter {
    /// A router over `table` (the same table as `Env::sessions`).
    pub fn new(table: Arc<SessionTable>) -> Self {
        LocalRouter {
            table,
            cluster: std::sync::OnceLock::new(),
        }
    }

    /// Routes to the sessions of other nodes through `cluster` (set once,
    /// at start).
    pub fn set_cluster(&self, cluster: Arc<Cluster>) {
        let _ = self.cluster.set(cluster);
    }

    /// Closes exactly one session (the admin API's kick), on this node
    /// or, through the cluster bus, on another. False if this node knows
    /// no such session.
    pub fn close_session(&self, to: &SessionRef, reason: CloseReason) -> bool {
        if let Some(h) = self.table.handle(to) {
            let _ = h.try_send(SessionMsg::Close(reason));
            return true;
        }
        match self.cluster.get() {
            Some(c) if to.node != self.table.node() && self.table.contains(to) => {
                c.close(to, &reason);
                true
            }
            _ => false,
        }
    }
}

fn error(c: StanzaErrorCondition) -> StanzaError {
    StanzaError::new(c)
}

impl LocalRouter {
    /// Sends an error back to the sender of `stanza` (never for errors).
    async fn bounce(&self, env: &Env, stanza: &Stanza, err: StanzaError) {
        if let Some(reply) = stanza.error_reply(err) {
            if reply.to().is_some() {
                Box::pin(self.route(env, reply)).await;
            }
        }
    }

    /// Puts the stanza in one session's mailbox; bounces on a full mailbox.
    /// Returns the stanza back if the session is gone. A session of
    /// another node (no `handle`) gets it through the cluster bus, whose
    /// receiving node applies the same fallbacks.
    async fn deliver_to(
        &self,
        env: &Env,
        entry: &SessionEntry,
        handle: Option<&SessionHandle>,
        stanza: Stanza,
    ) -> Result<(), Stanza> {
        let Some(handle) = handle else {
            return match self.cluster.get() {
                Some(c) => {
                    c.deliver(&entry.session, stanza);
                    Ok(())
                }
                None => Err(stanza),
            };
        };
        match handle.try_send(SessionMsg::Stanza(Box::new(stanza))) {
            Ok(()) => Ok(()),
            Err((SessionSendError::Full, SessionMsg::Stanza(stanza))) => {
                env.metrics.mailbox_full.inc();
                // A flooding sender must not flood the log too: the first
                // bounce per recipient session is logged, then at most one
                // line per 10 s with the count suppressed meanwhile (the
                // metric counts every one).
                if let Some(suppressed) = handle.full_warning() {
                    tracing::warn!(
                        to = %entry.jid(),
                        session = handle.id,
                        suppressed,
                        "recipient mailbox full; bouncing"
                    );
                }
                self.bounce(
                    env,
                    &stanza,
                    error(StanzaErrorCondition::ResourceConstraint)
                        .with_text("the recipient is not reading its messages fast enough"),
                )
                .await;
                Ok(())
            }
            Err((_, SessionMsg::Stanza(stanza))) => Err(*stanza),
            Err((_, _)) => Ok(()),
        }
    }

    async fn iq_local(&self, env: &Env, scope: IqScope, stanza: Stanza) {
        if !stanza.is_iq_request() {
            return; // results/errors to the server or an account: nobody waits here
        }
        let Some(payload) = stanza.payload() else {
            // RFC 6120 §8.2.3: a get/set iq has exactly one payload child.
            return self
                .bounce(env, &stanza, error(StanzaErrorCondition::BadRequest))
                .await;
        };
        // A module switched off for the addressed domain answers nothing
        // (no `to`: the sender's own account, RFC 6120 §10.3.3).
        let off = stanza
            .to()
            .or(stanza.from())
            .and_then(|t| env.hosts.modules_off(t.domain().as_str()))
            .unwrap_or(0);
        let Some(handler) = env
            .hooks
            .iq_handler(scope, payload.name(), payload.ns(), off)
        else {
            return self
                .bounce(
                    env,
                    &stanza,
                    error(StanzaErrorCondition::ServiceUnavailable),
                )
                .await;
        };
        let response = handler.handle_iq(env, scope, &stanza).await;
        let reply = match response {
            IqResponse::Result(p) => Some(stanza.iq_result(p)),
            IqResponse::Error(e) => stanza.error_reply(e),
            IqResponse::Handled => None,
        };
        if let Some(reply) = reply {
            if reply.to().is_some() {
                Box::pin(self.route(env, reply)).await;
            }
        }
    }

    /// Routes to an account's bare JID; true if the stanza reached a
    /// mailbox (or the cluster bus, or the offline store).
    async fn to_bare(&self, env: &Env, bare: &BareJid, stanza: Stanza) -> bool {
        match stanza.kind() {
            StanzaKind::Iq => {
                self.iq_local(env, IqScope::Account, stanza).await;
                false
            }
            StanzaKind::Presence => {
                let t = stanza.stanza_type();
                let mut delivered = false;
                if t.is_empty() || t == "unavailable" {
                    // §8.5.2.1.2: directed presence goes to all available resources.
                    for (e, h) in self
                        .table
                        .resources_with_handles(bare)
                        .iter()
                        .filter(|(e, _)| e.priority.is_some())
                    {
                        delivered |= self
                            .deliver_to(env, e, h.as_ref(), stanza.clone())
                            .await
                            .is_ok();
                    }
                }
                delivered
            }
            StanzaKind::Message => self.message_to_bare(env, bare, stanza).await,
        }
    }

    /// Message delivery rules for a bare JID (RFC 6121 §8.5.2); true if
    /// the message reached a mailbox, the cluster bus or the offline
    /// handlers (which stored, discarded or refused it).
    async fn message_to_bare(&self, env: &Env, bare: &BareJid, stanza: Stanza) -> bool {
        let t = stanza.stanza_type().to_owned();
        if t == "error" {
            return false;
        }
        // §8.5.2.1.1 refuses groupchat messages to a bare JID; a local
        // room service that delivers to its members' accounts (MUC Light)
        // is the exception: every available resource, none stored.
        let to_all = t == "headline" || t == "groupchat";
        if t == "groupchat" && !Self::sent_by_local_service(env, &stanza) {
            self.bounce(
                env,
                &stanza,
                error(StanzaErrorCondition::ServiceUnavailable),
            )
            .await;
            return false;
        }
        // A closing session of this account may be handing older messages
        // back: this one goes after them (starling_core::HandoverGate).
        env.handover.wait(bare).await;
        let resources = self.table.resources_with_handles(bare);
        let available: Vec<&(SessionEntry, Option<SessionHandle>)> = resources
            .iter()
            .filter(|(e, _)| matches!(e.priority, Some(p) if p >= 0))
            .collect();
        if !available.is_empty() {
            let targets: Vec<&(SessionEntry, Option<SessionHandle>)> = if to_all {
                available
            } else {
                // chat/normal: the highest-priority resource(s).
                let max = available
                    .iter()
                    .filter_map(|(e, _)| e.priority)
                    .max()
                    .unwrap_or(0);
                available
                    .into_iter()
                    .filter(|(e, _)| e.priority == Some(max))
                    .collect()
            };
            let mut delivered = false;
            for (e, h) in targets {
                delivered |= self
                    .deliver_to(env, e, h.as_ref(), stanza.clone())
                    .await
                    .is_ok();
            }
            if delivered {
                return true;
            }
        }
        if to_all {
            // §8.5.2.1.1: headlines are not stored; a room's message is
            // in the room's archive and the member's inbox.
            return false;
        }
        // The resource picked above may have closed its mailbox after
        // starting a hand-back: offline storage, too, waits for it.
        env.handover.wait(bare).await;
        // The account may not exist; sessions imply it does.
        if resources.is_empty() {
            match env.storage.accounts.exists(bare).await {
                Ok(true) => {}
                Ok(false) => {
                    self.bounce(
                        env,
                        &stanza,
                        error(StanzaErrorCondition::ServiceUnavailable),
                    )
                    .await;
                    return false;
                }
                Err(e) => {
                    tracing::error!(error = %e, "account lookup failed while routing");
                    self.bounce(
                        env,
                        &stanza,
                        error(StanzaErrorCondition::InternalServerError).with_type(ErrorType::Wait),
                    )
                    .await;
                    return false;
                }
            }
        }
        let mut companions = OfflineCompanions::default();
        let off = env.hosts.modules_off(bare.domain().as_str()).unwrap_or(0);
        let flow = run_chain!(
            env.hooks.offline_message,
            "offline_message",
            off = off,
            |h| h.offline_message(env, &stanza, &mut companions)
        );
        if flow == Flow::Continue {
            // §8.5.2.1.1: no offline storage → service-unavailable.
            self.bounce(
                env,
                &stanza,
                error(StanzaErrorCondition::ServiceUnavailable)
                    .with_text("the recipient is offline and offline storage is not enabled"),
            )
            .await;
            return false;
        }
        true
    }
}

impl LocalRouter {
    /// Whether the stanza comes from a local service (a room of one).
    fn sent_by_local_service(env: &Env, stanza: &Stanza) -> bool {
        stanza.from().is_some_and(|f| {
            env.hooks
                .service_for(f.domain().as_str(), |d| env.hosts.modules_off(d))
                .is_some()
        })
    }

    /// Hands an operation on a session this node does not run to the
    /// cluster: `Gone` when there is no cluster or no such session.
    fn remote(
        &self,
        to: &SessionRef,
        op: impl FnOnce(&Cluster) -> Result<(), SessionSendError>,
    ) -> Result<(), SessionSendError> {
        match self.cluster.get() {
            Some(c) if to.node != self.table.node() && self.table.contains(to) => op(c),
            _ => Err(SessionSendError::Gone),
        }
    }
}

impl LocalRouter {
    /// [`Router::route`]'s rules; true if the stanza reached an account's
    /// mailbox, the cluster bus or the offline handlers (what the routing
    /// latency measures), false if it went to a service or the server, or
    /// was bounced or dropped.
    async fn route_to(&self, env: &Env, mut stanza: Stanza) -> bool {
        // RFC 6120 §10.3: no 'to' means the sender's own account.
        let to: Jid = match stanza.to().or(stanza.from()) {
            Some(j) => j.clone(),
            None => return false, // server-generated stanza with no addresses: nowhere to go
        };
        let to_account = stanza.to().is_none();
        let Some(off) = env.hosts.modules_off(to.domain().as_str()) else {
            // A local service (group chat, pubsub, …) owns the domain.
            if let Some(service) = env
                .hooks
                .service_for(to.domain().as_str(), |d| env.hosts.modules_off(d))
            {
                service.handle(env, stanza).await;
                return false;
            }
            // No server-to-server connections yet.
            let cond = StanzaErrorCondition::RemoteServerNotFound;
            if stanza.kind() != StanzaKind::Presence {
                self.bounce(env, &stanza, error(cond)).await;
            }
            return false;
        };
        if to.node().is_none() {
            match stanza.kind() {
                StanzaKind::Iq => self.iq_local(env, IqScope::Server, stanza).await,
                StanzaKind::Message => {
                    if !matches!(stanza.stanza_type(), "error" | "headline" | "groupchat") {
                        self.bounce(
                            env,
                            &stanza,
                            error(StanzaErrorCondition::ServiceUnavailable),
                        )
                        .await;
                    }
                }
                StanzaKind::Presence => {}
            };
            return false;
        }
        // Account-wide rules (block lists, subscriptions) before delivery.
        if !env.hooks.inbound.is_empty() {
            let flow = run_chain!(env.hooks.inbound, "inbound", off = off, |h| h
                .inbound(env, &mut stanza));
            if flow == Flow::Stop {
                return false;
            }
        }
        let bare = to.to_bare();
        if to_account {
            return self.to_bare(env, &bare, stanza).await;
        }
        match to.try_as_full() {
            Err(_) => self.to_bare(env, &bare, stanza).await,
            Ok(full) => {
                let stanza = match self.table.get_with_handle(full) {
                    Some((entry, handle)) => {
                        match self.deliver_to(env, &entry, handle.as_ref(), stanza).await {
                            Ok(()) => return true,
                            Err(stanza) => stanza,
                        }
                    }
                    None => stanza,
                };
                match stanza.kind() {
                    StanzaKind::Message => {
                        if stanza.stanza_type() == "groupchat" {
                            self.bounce(
                                env,
                                &stanza,
                                error(StanzaErrorCondition::ServiceUnavailable),
                            )
                            .await;
                            false
                        } else {
                            self.message_to_bare(env, &bare, stanza).await
                        }
                    }
                    StanzaKind::Iq => {
                        if stanza.is_iq_request() {
                            self.bounce(
                                env,
                                &stanza,
                                error(StanzaErrorCondition::ServiceUnavailable),
                            )
                            .await
                        }
                        false
                    }
                    StanzaKind::Presence => false,
                }
            }
        }
    }
}

#[async_trait]
impl Router for LocalRouter {
    async fn route(&self, env: &Env, stanza: Stanza) {
        // One clock read pair per routed stanza, none per copy: the time to
        // its recipient's mailbox, the cluster bus or the offline store
        // (starling_routing_latency_seconds; other outcomes are not timed).
        let kind = stanza.kind();
        let start = Instant::now();
        if self.route_to(env, stanza).await {
            env.metrics.routed(kind, start.elapsed());
        }
    }

    async fn reroute(&self, env: &Env, stanza: Stanza) {
        let Some(bare) = stanza.to().map(Jid::to_bare) else {
            return;
        };
        match stanza.kind() {
            // The inbound chain already ran (block lists, archive): only
            // the delivery rules apply again.
            StanzaKind::Message => {
                self.message_to_bare(env, &bare, stanza).await;
            }
            StanzaKind::Iq => {
                if stanza.is_iq_request() {
                    self.bounce(
                        env,
                        &stanza,
                        error(StanzaErrorCondition::ServiceUnavailable),
                    )
                    .await
                }
            }
            StanzaKind::Presence => {}
        }
    }

    async fn deliver(
        &self,
        env: &Env,
        to: &SessionRef,
        stanza: Stanza,
    ) -> Result<(), SessionSendError> {
        let Some(handle) = self.table.handle(to) else {
            return self.remote(to, |c| c.deliver_unacked(to, stanza));
        };
        match handle.try_send(SessionMsg::Stanza(Box::new(stanza))) {
            Ok(()) => Ok(()),
            Err((why, _)) => {
                if why == SessionSendError::Full {
                    env.metrics.mailbox_full.inc();
                    // Throttled per recipient session, like the bounces.
                    if let Some(suppressed) = handle.full_warning() {
                        tracing::warn!(to = %to.jid, session = to.id, suppressed, "recipient mailbox full; server-made stanza dropped");
                    }
                }
                Err(why)
            }
        }
    }

    async fn wait_for_room(
        &self,
        to: &SessionRef,
        free: usize,
        max_wait: std::time::Duration,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + max_wait;
        while let Some(h) = self.table.handle(to) {
            // At most half the mailbox, whatever `[c2s] mailbox_size` is.
            let want = free.min(h.capacity() / 2).max(1);
            if h.room() >= want {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        true
    }

    async fn notify(
        &self,
        _env: &Env,
        to: &SessionRef,
        key: TimerKey,
    ) -> Result<(), SessionSendError> {
        let Some(handle) = self.table.handle(to) else {
            return self.remote(to, |c| c.notify(to, key));
        };
        handle
            .try_send(SessionMsg::Notify(Box::new(key)))
            .map_err(|(why, _)| why)
    }

    async fn bind(
        &self,
        _env: &Env,
        jid: &FullJid,
        session: SessionHandle,
        max_resources: usize,
    ) -> Result<(), TooManyResources> {
        let new_id = session.id;
        let done = self.table.register(jid, session, max_resources)?;
        match done.replaced {
            None => {}
            // RFC 6120 §7.7.2.2: the new session wins; the old one gets <conflict/>.
            Some(Replaced::Local(old)) => {
                tracing::info!(%jid, old_session = old.id, new_session = new_id, "resource conflict: replacing older session");
                let _ = old.try_send(SessionMsg::Close(CloseReason::Replaced));
            }
            Some(Replaced::Remote(old)) => {
                tracing::info!(%jid, old_node = old.node, old_session = old.id, new_session = new_id, "resource conflict: replacing older session on another node");
                if let Some(c) = self.cluster.get() {
                    c.close(&old, &CloseReason::Replaced);
                }
            }
        }
        if let Some(old) = done.evicted {
            // The account was at its limit: its longest-detached session
            // gives way. It ends as if its resumption had timed out (its
            // unacknowledged stanzas are re-routed by its session_closed).
            tracing::info!(%jid, old_session = old.id, new_session = new_id, max_resources, "resource limit: closing the account's longest-detached session");
            let _ = old.try_send(SessionMsg::Close(CloseReason::Error(Box::new(
                StreamError::with_text(
                    StreamErrorCondition::ResourceConstraint,
                    "a new session of this account took the place of this detached one (max_resources_per_account)",
                ),
            ))));
        }
        Ok(())
    }

    async fn attach(
        &self,
        _env: &Env,
        to: &SessionRef,
        handover: Box<Handover>,
    ) -> Result<(), Box<Handover>> {
        let Some(handle) = self.table.handle(to) else {
            return Err(handover);
        };
        match handle.try_send(SessionMsg::Attach(handover)) {
            Ok(()) => Ok(()),
            Err((_, SessionMsg::Attach(h))) => Err(h),
            // try_send hands back the message it was given: not reached.
            Err(_) => Ok(()),
        }
    }

    fn invalidate(&self, module: &'static str, key: &str) {
        if let Some(c) = self.cluster.get() {
            c.invalidate(module, key);
        }
    }

    fn placement(&self, key: &str) -> Option<u8> {
        let c = self.cluster.get()?;
        let n = c.placement(key);
        (n != c.node()).then_some(n)
    }

    async fn to_service_on(&self, env: &Env, node: u8, stanza: Stanza) {
        let stanza = match self.cluster.get() {
            Some(c) if node != c.node() => match c.deliver_service(node, stanza) {
                None => return,
                Some(s) => s,
            },
            _ => stanza,
        };
        // No cluster, or nothing to mark it with: handled here.
        let service = stanza.to().and_then(|t| {
            env.hooks
                .service_for(t.domain().as_str(), |d| env.hosts.modules_off(d))
                .cloned()
        });
        if let Some(s) = service {
            s.handle_placed(env, stanza).await;
        }
    }

    async fn close_sessions(&self, _env: &Env, account: &BareJid, reason: CloseReason) {
        for (_, h) in self.table.resources_with_handles(account) {
            if let Some(h) = h {
                let _ = h.try_send(SessionMsg::Close(reason.clone()));
            }
        }
        // Sessions of other nodes that this node may not know of yet.
        if let Some(c) = self.cluster.get() {
            c.close_account(account, &reason);
        }
    }
}
