//! Deliveries to another node's sessions and services: message stanzas
//! kept until acknowledged and sent again meanwhile, deliveries taken once
//! on the receiving side, acknowledgements gathered, and the kept messages
//! of a dead node routed again here.

use super::frame::{self, Frame};
use super::{lock, Cluster, Dest, ACK_DELAY, SERVICE_DELIVERY};
use starling_core::{Env, SessionMsg, SessionRef, SessionSendError};
use starling_proto::{BareJid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind};
use starling_xml::Element;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A message stanza sent to another node, kept until it is acknowledged
/// (and sent again every retransmission interval until then).
pub(super) struct Pending {
    /// The `Deliver` frame as sent (sent again as is; decoded only if the
    /// message must be routed again here).
    pub(super) frame: Vec<u8>,
    pub(super) sent_at: Instant,
    pub(super) first_sent: Instant,
}

/// Which deliveries of one sender (one incarnation of a node) this node
/// has taken, so a retransmitted one is acknowledged again but delivered
/// once. Ids are numbered per destination node, so they arrive here in
/// order except where the bus lost some.
#[derive(Default)]
pub(super) struct Taken {
    /// The highest id taken.
    max: u64,
    /// Ids below `max` never received (lost on the bus): a
    /// retransmission of one of them is new.
    missing: std::collections::BTreeSet<u64>,
}

/// At most this many lost ids are remembered per sender.
const MAX_MISSING: usize = 100_000;

impl Taken {
    /// True if delivery `id` is new (and now taken).
    pub(super) fn take(&mut self, id: u64) -> bool {
        if id > self.max {
            let from = (self.max + 1).max(id.saturating_sub(MAX_MISSING as u64));
            self.missing.extend(from..id);
            while self.missing.len() > MAX_MISSING {
                self.missing.pop_first();
            }
            self.max = id;
            true
        } else {
            self.missing.remove(&id)
        }
    }
}

impl Cluster {
    /// Sends a stanza to a session of another node (the router found it
    /// there). A message is kept until that node acknowledges it.
    pub fn deliver(&self, to: &SessionRef, stanza: Stanza) {
        if stanza.kind() != StanzaKind::Message {
            // Presence and iq: as on one node, not kept (an iq's sender
            // times out; presence is state, sent again on change).
            let _ = self.deliver_unacked(to, stanza);
            return;
        }
        // Serialized outside any lock; numbered and queued under the
        // pending lock, so ids leave in order.
        let mut frame = frame::encode_deliver(0, to, stanza.element());
        let mut pending = lock(&self.pending);
        let id = {
            let mut ids = lock(&self.next_id);
            let n = ids.entry(to.node).or_insert(0);
            *n += 1;
            *n
        };
        frame::set_deliver_id(&mut frame, id);
        // Kept even when the queue is full: the retransmit timer sends it.
        self.enqueue(Dest::Node(to.node), frame.clone());
        let now = Instant::now();
        pending.insert(
            (to.node, id),
            Pending {
                frame,
                sent_at: now,
                first_sent: now,
            },
        );
    }

    /// Hands a stanza for a local service (a room, an external component)
    /// to the same service on `node`
    /// ([`starling_core::Router::to_service_on`]): a [`Frame::Deliver`]
    /// marked [`SERVICE_DELIVERY`], so a message is kept until that node
    /// took it and placed again here if the node dies. The marker rides in
    /// a [`SessionRef`], whose JID the receiver does not read (it finds the
    /// service by the stanza's `to`): the sender's full JID, or for a
    /// sender without one (a bare JID's subscription presence, the
    /// server's own requests) `<the service's domain>/service`. Gives the
    /// stanza back (`Some`) if it has no `to` either.
    pub fn deliver_service(&self, node: u8, stanza: Stanza) -> Option<Stanza> {
        let carrier = stanza
            .from()
            .and_then(|f| f.try_as_full().ok())
            .cloned()
            .or_else(|| {
                let domain = stanza.to()?.domain().as_str().to_owned();
                BareJid::new(&domain)
                    .ok()?
                    .with_resource_str("service")
                    .ok()
            });
        let Some(jid) = carrier else {
            return Some(stanza);
        };
        let to = SessionRef {
            jid,
            node,
            id: SERVICE_DELIVERY,
        };
        self.deliver(&to, stanza);
        None
    }

    /// Sends again the kept messages older than `after` to nodes still
    /// alive (their delivery or its acknowledgement was lost on the bus).
    pub(super) fn retransmit(&self, after: Duration) -> usize {
        let alive: Vec<u8> = lock(&self.peers).keys().copied().collect();
        let mut pending = lock(&self.pending);
        let mut n = 0;
        for ((node, _), p) in pending.iter_mut() {
            if p.sent_at.elapsed() < after || !alive.contains(node) {
                continue;
            }
            if !self.enqueue(Dest::Node(*node), p.frame.clone()) {
                // Still full: the rest waits for the next round.
                break;
            }
            p.sent_at = Instant::now();
            n += 1;
        }
        self.counters.retransmitted.inc_by(n as u64);
        n
    }

    /// A server-made stanza for exactly one session of another node
    /// ([`starling_core::Router::deliver`]): best effort, no fallback.
    pub fn deliver_unacked(&self, to: &SessionRef, stanza: Stanza) -> Result<(), SessionSendError> {
        self.send(
            Dest::Node(to.node),
            &Frame::Deliver {
                id: 0,
                to: to.clone(),
                stanza: stanza.into_element(),
            },
        );
        Ok(())
    }

    /// Messages sent to other nodes and not acknowledged yet.
    pub fn pending_count(&self) -> usize {
        lock(&self.pending).len()
    }

    pub(super) async fn on_deliver(&self, env: &Env, to: SessionRef, stanza: Element) {
        let Ok(stanza) = Stanza::from_element(stanza) else {
            return;
        };
        if to.id == SERVICE_DELIVERY {
            // A stanza another node placed on this one's service (a room).
            let service = stanza.to().and_then(|t| {
                env.hooks
                    .service_for(t.domain().as_str(), |d| env.hosts.modules_off(d))
                    .cloned()
            });
            if let Some(s) = service {
                s.handle_placed(env, stanza).await;
            }
            return;
        }
        let stanza = match self.table.handle(&to) {
            Some(handle) => match handle.try_send(SessionMsg::Stanza(Box::new(stanza))) {
                Ok(()) => return,
                Err((SessionSendError::Full, SessionMsg::Stanza(s))) => {
                    env.metrics.mailbox_full.inc();
                    if let Some(reply) = s.error_reply(
                        StanzaError::new(StanzaErrorCondition::ResourceConstraint)
                            .with_text("the recipient is not reading its messages fast enough"),
                    ) {
                        env.route(reply).await;
                    }
                    return;
                }
                Err((_, SessionMsg::Stanza(s))) => *s,
                Err(_) => return,
            },
            None => stanza,
        };
        // The session ended meanwhile: another resource, offline storage
        // or an error, as on one node (RFC 6121 §8.5.3.2).
        env.router.reroute(env, stanza).await;
    }

    /// Routes again the messages kept for `node` (it died or left).
    pub(super) async fn reroute_pending(&self, env: &Env, node: u8) {
        lock(&self.taken).retain(|(n, _), _| *n != node);
        let kept: Vec<(Stanza, bool)> = {
            let mut p = lock(&self.pending);
            // In the order they were sent (the map is ordered by id).
            let ids: Vec<(u8, u64)> = p
                .range((node, 0)..=(node, u64::MAX))
                .map(|(k, _)| *k)
                .collect();
            ids.into_iter()
                .filter_map(|k| p.remove(&k))
                .filter_map(|v| match frame::decode_frame(&v.frame) {
                    Ok(Some(Frame::Deliver { stanza, to, .. })) => Stanza::from_element(stanza)
                        .ok()
                        .map(|s| (s, to.id == SERVICE_DELIVERY)),
                    _ => None,
                })
                .collect()
        };
        if !kept.is_empty() {
            self.counters.rerouted.inc_by(kept.len() as u64);
            tracing::info!(
                node,
                messages = kept.len(),
                "routing again messages the lost node never acknowledged"
            );
        }
        for (s, placed) in kept {
            if placed {
                // A room's stanza: placed again, on a living node.
                env.route(s).await;
            } else {
                env.router.reroute(env, s).await;
            }
        }
    }

    /// Sends the gathered acknowledgements, [`ACK_DELAY`] after the first.
    pub(super) async fn ack_sender(self: Arc<Self>) {
        loop {
            self.acks_queued.notified().await;
            tokio::time::sleep(ACK_DELAY).await;
            let all = std::mem::take(&mut *lock(&self.acks));
            for (node, ids) in all {
                self.send(Dest::Node(node), &Frame::Ack { ids });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Taken;

    #[test]
    fn a_retransmitted_delivery_is_taken_once_and_a_lost_one_when_it_comes() {
        let mut t = Taken::default();
        assert!(t.take(1));
        assert!(t.take(2));
        assert!(!t.take(2), "a retransmission of a taken delivery");
        // 3 and 4 were lost on the bus.
        assert!(t.take(5));
        assert!(!t.take(5));
        assert!(t.take(4), "a lost one, sent again");
        assert!(!t.take(4));
        assert!(t.take(3));
        assert!(!t.take(1));
        assert!(t.missing.is_empty());
        // A huge gap keeps only the newest MAX_MISSING ids.
        assert!(t.take(10 * super::MAX_MISSING as u64));
        assert_eq!(t.missing.len(), super::MAX_MISSING);
    }
}
