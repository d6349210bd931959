//! The replicated session registry: this node's events (numbered, on
//! `P.all`), another node's applied in order, gaps repaired by a
//! snapshot; the session table's observer that announces local changes.

use super::frame::{self, EntryState, Frame, Header};
use super::{lock, Cluster, Dest, Order, Peer};
use crate::routing::sessions::TableObserver;
use starling_core::{CloseReason, SessionMsg, SessionRef};
use starling_xml::Element;
use std::sync::{Arc, Weak};
use std::time::Instant;

impl Cluster {
    /// Queues a registry event (numbered) or a heartbeat (carrying the
    /// last number).
    pub(super) fn announce(&self, make: impl FnOnce(u64) -> Frame, numbered: bool) {
        let mut seq = lock(&self.seq);
        if numbered {
            *seq += 1;
        }
        let f = make(*seq);
        self.send(Dest::All, &f);
    }

    pub(super) fn on_event(&self, h: Header, f: Frame) -> Vec<starling_core::SessionEntry> {
        let seq = match &f {
            Frame::Bound { seq, .. } | Frame::Unbound { seq, .. } | Frame::Presence { seq, .. } => {
                *seq
            }
            _ => return Vec::new(),
        };
        let mut lost = Vec::new();
        let mut peers = lock(&self.peers);
        let peer = self.peer(&mut peers, h, &mut lost);
        peer.last_seen = Instant::now();
        if peer.awaiting {
            peer.buffered.push((seq, f));
            return lost;
        }
        match peer.order(seq) {
            Order::Stale => {}
            Order::Next => self.apply(f),
            Order::Gap => {
                peer.buffered.push((seq, f));
                self.resync(peer, h.node);
            }
        }
        lost
    }

    /// Asks `node` for a snapshot; its events wait for it.
    pub(super) fn resync(&self, peer: &mut Peer, node: u8) {
        peer.awaiting = true;
        self.send(Dest::Node(node), &Frame::SyncRequest);
    }

    fn apply(&self, f: Frame) {
        match f {
            Frame::Bound {
                session, bound_at, ..
            } => {
                if let Some(old) = self.table.remote_bound(&session, bound_at) {
                    tracing::info!(jid = %session.jid, node = session.node, local_session = old.id, "resource conflict: bound again on another node; closing ours");
                    let _ = old.try_send(SessionMsg::Close(CloseReason::Replaced));
                }
            }
            Frame::Unbound { session, .. } => self.table.remote_unbound(&session),
            Frame::Presence { entry, .. } => self.table.remote_presence(
                &entry.session,
                entry.presence.map(|(p, el)| (p, Arc::new(el))),
            ),
            _ => {}
        }
    }

    pub(super) fn on_snapshot(
        &self,
        h: Header,
        seq: u64,
        entries: Vec<EntryState>,
        first: bool,
        last: bool,
        found: &mut Vec<starling_core::SessionEntry>,
    ) -> Vec<starling_core::SessionEntry> {
        let mut lost = Vec::new();
        let mut peers = lock(&self.peers);
        let peer = self.peer(&mut peers, h, &mut lost);
        if peer.returned {
            found.extend(entries.iter().map(|e| starling_core::SessionEntry {
                session: e.session.clone(),
                priority: e.presence.as_ref().map(|(p, _)| *p),
                presence: e.presence.as_ref().map(|(_, el)| Arc::new(el.clone())),
            }));
            peer.returned = !last;
        }
        peer.last_seen = Instant::now();
        // The first part replaces what we knew of that node.
        let before = if first {
            self.table.remove_node(h.node)
        } else {
            Vec::new()
        };
        for e in &entries {
            if let Some(old) = self.table.remote_bound(&e.session, e.bound_at) {
                let _ = old.try_send(SessionMsg::Close(CloseReason::Replaced));
            }
            if let Some((p, el)) = &e.presence {
                self.table
                    .remote_presence(&e.session, Some((*p, Arc::new(el.clone()))));
            }
        }
        tracing::debug!(
            node = h.node,
            sessions = entries.len(),
            replaced = before.len(),
            seq,
            first,
            last,
            "registry snapshot part applied"
        );
        if !last {
            // Its events keep waiting for the rest.
            peer.awaiting = true;
            return lost;
        }
        peer.applied = seq;
        peer.awaiting = false;
        let mut buffered = std::mem::take(&mut peer.buffered);
        buffered.sort_by_key(|(s, _)| *s);
        for (s, f) in buffered {
            match peer.order(s) {
                Order::Stale => {}
                Order::Next => self.apply(f),
                Order::Gap => {
                    // The next snapshot is taken after these were sent.
                    self.resync(peer, h.node);
                    break;
                }
            }
        }
        lost
    }

    pub(super) fn send_snapshot(&self, to: u8) {
        // As of event `seq` at least: every numbered event's change is in
        // the table before its number is taken. Changes made while the
        // entries are read may be in it too; their events come after `seq`
        // and applying them again is harmless. (The event lock is not held
        // while the table is read: binds go on meanwhile.)
        let seq = *lock(&self.seq);
        let entries: Vec<EntryState> = self
            .table
            .local_sessions()
            .into_iter()
            .map(|s| EntryState {
                bound_at: s.bound_at,
                presence: s.entry.priority.zip(s.entry.presence.as_deref().cloned()),
                session: s.entry.session,
            })
            .collect();
        for part in frame::snapshot_parts(seq, entries, self.cfg.snapshot_part_bytes.max(1)) {
            self.send(Dest::Node(to), &part);
        }
    }
}

/// Publishes this node's session changes.
pub(super) struct Observer(pub(super) Weak<Cluster>);

impl TableObserver for Observer {
    fn bound(&self, session: &SessionRef, bound_at: u64) {
        if let Some(c) = self.0.upgrade() {
            c.announce(
                |seq| Frame::Bound {
                    seq,
                    session: session.clone(),
                    bound_at,
                },
                true,
            );
        }
    }

    fn unbound(&self, session: &SessionRef) {
        if let Some(c) = self.0.upgrade() {
            c.announce(
                |seq| Frame::Unbound {
                    seq,
                    session: session.clone(),
                },
                true,
            );
        }
    }

    fn presence(&self, session: &SessionRef, presence: Option<(i8, Arc<Element>)>) {
        if let Some(c) = self.0.upgrade() {
            c.announce(
                |seq| Frame::Presence {
                    seq,
                    entry: EntryState {
                        session: session.clone(),
                        bound_at: 0,
                        presence: presence.map(|(p, el)| (p, (*el).clone())),
                    },
                },
                true,
            );
        }
    }
}
