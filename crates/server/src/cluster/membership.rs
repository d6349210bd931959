//! Membership: heartbeats (sent, and what one from another node says),
//! the peers this node knows, nodes declared dead (their sessions lost,
//! their kept messages routed again), placement by rendezvous hashing
//! over the living nodes, and what a listener hears of each node
//! (`starling cluster status`).

use super::frame::{self, Frame, Header};
use super::{connect_client, lock, rendezvous_score, Cluster, ClusterError, Dest, Peer};
use crate::config::ClusterSection;
use futures_util::StreamExt as _;
use starling_core::{run_chain, Env};
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

impl Cluster {
    pub(super) fn heartbeat_now(&self) {
        let sessions = self.table.local_count() as u32;
        self.announce(|seq| Frame::Heartbeat { seq, sessions }, false);
    }

    /// The node that runs `key` (a group-chat room): rendezvous hashing
    /// over the living nodes, this one included — every node computes the
    /// same owner from the same membership, and when a node comes or goes
    /// only the keys it wins or held move.
    pub fn placement(&self, key: &str) -> u8 {
        let mut best = (self.node, rendezvous_score(key, self.node));
        for n in lock(&self.peers).keys() {
            let s = rendezvous_score(key, *n);
            if s > best.1 || (s == best.1 && *n > best.0) {
                best = (*n, s);
            }
        }
        best.0
    }

    /// Returns the sessions lost if `h` is a new incarnation of a known node.
    pub(super) fn on_heartbeat(
        &self,
        h: Header,
        seq: u64,
        sessions: u32,
    ) -> Vec<starling_core::SessionEntry> {
        let mut lost = Vec::new();
        let mut peers = lock(&self.peers);
        let peer = self.peer(&mut peers, h, &mut lost);
        peer.last_seen = Instant::now();
        peer.last_heartbeat = std::time::SystemTime::now();
        peer.sessions = sessions;
        if !peer.awaiting && seq > peer.applied {
            // Its last events never arrived.
            self.resync(peer, h.node);
        }
        lost
    }

    /// The peer of `h`, created (and asked for a snapshot) if new; a new
    /// incarnation replaces the old one, whose sessions are lost.
    pub(super) fn peer<'a>(
        &self,
        peers: &'a mut BTreeMap<u8, Peer>,
        h: Header,
        lost: &mut Vec<starling_core::SessionEntry>,
    ) -> &'a mut Peer {
        let fresh = match peers.get(&h.node) {
            None => true,
            Some(p) if p.incarnation != h.incarnation => {
                tracing::warn!(
                    node = h.node,
                    "node restarted: forgetting its previous sessions"
                );
                lost.extend(self.table.remove_node(h.node));
                true
            }
            Some(_) => false,
        };
        if fresh {
            tracing::info!(
                node = h.node,
                "node joined the cluster; asking for its sessions"
            );
            let mut peer = Peer::new(h.incarnation);
            peer.returned = lock(&self.dead).remove(&h.node) == Some(h.incarnation);
            if peer.returned {
                tracing::warn!(
                    node = h.node,
                    "node declared dead is back (a partition ended); its sessions will be announced again"
                );
            }
            peers.insert(h.node, peer);
            self.send(Dest::Node(h.node), &Frame::SyncRequest);
        }
        peers.get_mut(&h.node).expect("inserted above")
    }

    /// True if no living node has a lower id than this one.
    pub(super) fn lowest_alive(&self) -> bool {
        lock(&self.peers).keys().all(|n| *n > self.node)
    }

    /// Runs the session-lost handlers, on the lowest living node only.
    pub(super) async fn sessions_lost(&self, env: &Env, lost: Vec<starling_core::SessionEntry>) {
        if !self.lowest_alive() {
            return;
        }
        for entry in lost {
            let _ = run_chain!(env.hooks.session_lost, "session_lost", |h| h
                .session_lost(env, &entry));
        }
    }

    pub(super) async fn heartbeat(
        self: Arc<Self>,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        let every = Duration::from_millis(self.cfg.heartbeat_ms.max(1));
        let timeout = Duration::from_millis(self.cfg.node_timeout_ms);
        let retransmit_after = (2 * every).max(Duration::from_millis(500));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            self.heartbeat_now();
            let resent = self.retransmit(retransmit_after);
            if resent > 0 {
                tracing::debug!(
                    messages = resent,
                    "unacknowledged cross-node messages sent again"
                );
            }
            let dead: Vec<u8> = lock(&self.peers)
                .iter()
                .filter(|(_, p)| p.last_seen.elapsed() > timeout)
                .map(|(n, _)| *n)
                .collect();
            if dead.is_empty() {
                continue;
            }
            let Some(env) = self.env.get().and_then(Weak::upgrade) else {
                return;
            };
            for node in dead {
                if let Some(p) = lock(&self.peers).remove(&node) {
                    lock(&self.dead).insert(node, p.incarnation);
                }
                let lost = self.table.remove_node(node);
                tracing::warn!(
                    node,
                    sessions = lost.len(),
                    timeout_ms = timeout.as_millis() as u64,
                    "node not heard from: declared dead; its sessions are gone"
                );
                self.reroute_pending(&env, node).await;
                self.sessions_lost(&env, lost).await;
            }
        }
    }
}

/// A node as its heartbeats describe it (`starling cluster status`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct ObservedNode {
    /// Its `node_id`.
    pub node: u8,
    /// Sessions bound on it.
    pub sessions: u32,
    /// Its registry events so far.
    pub registry_events: u64,
    /// Its process incarnation (changes when it restarts).
    pub incarnation: String,
    /// Milliseconds since its last heartbeat, when the listening ended.
    pub last_heartbeat_ms_ago: u64,
}

/// Listens to the bus of the cluster `cfg` describes for `listen_for` and
/// reports every node heard (sorted by id). Sends nothing.
pub async fn observe(
    cfg: &ClusterSection,
    listen_for: Duration,
) -> Result<Vec<ObservedNode>, ClusterError> {
    let options = async_nats::ConnectOptions::new().name("starling-cluster-status");
    let client = connect_client(cfg, options).await?;
    let mut sub = client.subscribe(format!("{}.all", cfg.name)).await?;
    let mut seen: BTreeMap<u8, (ObservedNode, Instant)> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + listen_for;
    while let Ok(Some(msg)) = tokio::time::timeout_at(deadline, sub.next()).await {
        let Ok((h, frames)) = frame::decode(&msg.payload) else {
            continue;
        };
        for f in frames {
            if let Frame::Heartbeat { seq, sessions } = f {
                seen.insert(
                    h.node,
                    (
                        ObservedNode {
                            node: h.node,
                            sessions,
                            registry_events: seq,
                            incarnation: format!("{:016x}", h.incarnation),
                            last_heartbeat_ms_ago: 0,
                        },
                        Instant::now(),
                    ),
                );
            }
        }
    }
    Ok(seen
        .into_values()
        .map(|(mut n, at)| {
            n.last_heartbeat_ms_ago = at.elapsed().as_millis() as u64;
            n
        })
        .collect())
}
