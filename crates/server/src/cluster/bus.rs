//! The bus itself: frames queued for the publisher (bounded in bytes),
//! batched per destination into NATS messages, and the receiver that
//! decodes what arrives and hands each frame to its handler.

use super::frame::{self, Frame, Header, Writer};
use super::{lock, Cluster, Dest, Out, LINGER_WHEN_BUSY, MAX_BATCH_BYTES, MAX_BATCH_FRAMES};
use bytes::Bytes;
use futures_util::StreamExt as _;
use starling_core::hooks::TimerKey;
use starling_core::{run_chain, Env, SessionMsg};
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

impl Cluster {
    fn header(&self) -> Header {
        Header {
            node: self.node,
            incarnation: self.incarnation,
        }
    }

    pub(super) fn send(&self, dest: Dest, frame: &Frame) {
        self.enqueue(dest, frame::encode_frame(frame));
    }

    /// Queues an encoded frame for the publisher, unless the queue holds
    /// `max_queue_bytes` already (the bus is stalled): then the frame is
    /// dropped and counted, and `false` returned. A kept message stays
    /// kept and is sent again by the retransmit timer; a lost registry
    /// event shows as a gap in its sequence numbers and the peers ask for
    /// a snapshot.
    pub(super) fn enqueue(&self, dest: Dest, bytes: Vec<u8>) -> bool {
        use std::sync::atomic::Ordering;
        let n = bytes.len();
        if self.out_bytes.load(Ordering::Relaxed) + n > self.max_queue_bytes {
            self.counters.dropped.inc();
            starling_core::log_throttled!(
                warn,
                max_queue_mib = self.cfg.max_queue_mib,
                "cluster bus queue full (NATS is not taking frames); frames dropped: kept messages will be sent again"
            );
            return false;
        }
        self.out_bytes.fetch_add(n, Ordering::Relaxed);
        if self.out.send(Out::Frame(dest, bytes)).is_err() {
            self.out_bytes.fetch_sub(n, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Batches queued frames by destination into NATS messages.
    pub(super) async fn publisher(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<Out>) {
        let mut batches: BTreeMap<Option<u8>, Writer> = BTreeMap::new();
        let mut last_publish = Instant::now() - Duration::from_secs(1);
        while let Some(first) = rx.recv().await {
            // Under load (the previous batch left less than a millisecond
            // ago), wait for the next timer tick so that one NATS message
            // carries what queues meanwhile.
            if last_publish.elapsed() < LINGER_WHEN_BUSY {
                tokio::time::sleep(LINGER_WHEN_BUSY).await;
            }
            last_publish = Instant::now();
            let mut next = Some(first);
            let mut n = 0;
            let mut flushed = Vec::new();
            while let Some(item) = next.take() {
                let (dest, bytes) = match item {
                    Out::Frame(d, b) => {
                        self.out_bytes
                            .fetch_sub(b.len(), std::sync::atomic::Ordering::Relaxed);
                        (d, b)
                    }
                    Out::Flush(done) => {
                        flushed.push(done);
                        if n < 4 * MAX_BATCH_FRAMES {
                            next = rx.try_recv().ok();
                        }
                        continue;
                    }
                };
                let key = match dest {
                    Dest::All => None,
                    Dest::Node(k) => Some(k),
                };
                // A frame that would take the batch past its size goes in
                // the next one: a message stays under NATS' payload limit.
                if batches
                    .get(&key)
                    .is_some_and(|w| !w.is_empty() && w.len() + bytes.len() > MAX_BATCH_BYTES)
                {
                    let w = batches.remove(&key).expect("just seen");
                    self.publish(key, w).await;
                }
                let w = batches
                    .entry(key)
                    .or_insert_with(|| Writer::new(self.header()));
                w.push_encoded(&bytes);
                if w.frames() >= MAX_BATCH_FRAMES || w.len() >= MAX_BATCH_BYTES {
                    let w = batches.remove(&key).expect("just used");
                    self.publish(key, w).await;
                }
                n += 1;
                if n < 4 * MAX_BATCH_FRAMES {
                    next = rx.try_recv().ok();
                }
            }
            for (key, w) in std::mem::take(&mut batches) {
                self.publish(key, w).await;
            }
            if !flushed.is_empty() {
                let _ = self.client.flush().await;
                for done in flushed {
                    let _ = done.send(());
                }
            }
        }
    }

    async fn publish(&self, key: Option<u8>, w: Writer) {
        let frames = w.frames() as u64;
        let msg = w.finish();
        let subject = match key {
            None => self.all_subject.clone(),
            Some(n) => format!("{}{n}", self.node_prefix),
        };
        self.counters.messages_out.inc();
        self.counters.frames_out.inc_by(frames);
        self.counters.bytes_out.inc_by(msg.len() as u64);
        self.counters.batch_frames.observe(frames as f64);
        if let Err(e) = self.client.publish(subject, Bytes::from(msg)).await {
            // The client queues while reconnecting; this is a closed client
            // or an oversized message. Kept messages are re-routed if the
            // peer is declared dead meanwhile.
            tracing::warn!(error = %e, "cluster bus publish failed");
        }
    }

    pub(super) async fn receiver(self: Arc<Self>, mut sub: async_nats::Subscriber) {
        while let Some(msg) = sub.next().await {
            self.counters.messages_in.inc();
            self.counters.bytes_in.inc_by(msg.payload.len() as u64);
            let (header, frames) = match frame::decode(&msg.payload) {
                Ok(x) => x,
                Err(e) => {
                    self.counters.bad_messages.inc();
                    tracing::warn!(subject = %msg.subject, error = %e, "unreadable cluster bus message dropped");
                    continue;
                }
            };
            if header.node == self.node {
                if header.incarnation != self.incarnation {
                    tracing::error!(node = self.node, "another process uses this node_id on the cluster bus: give every node its own [server] node_id");
                }
                continue;
            }
            self.counters.frames_in.inc_by(frames.len() as u64);
            let Some(env) = self.env.get().and_then(Weak::upgrade) else {
                return;
            };
            self.handle(&env, header, frames).await;
        }
    }

    pub(super) async fn handle(&self, env: &Env, h: Header, frames: Vec<Frame>) {
        let mut acks = Vec::new();
        let mut lost = Vec::new();
        let mut found = Vec::new();
        for f in frames {
            match f {
                Frame::Heartbeat { seq, sessions } => {
                    lost.extend(self.on_heartbeat(h, seq, sessions));
                }
                f @ (Frame::Bound { .. } | Frame::Unbound { .. } | Frame::Presence { .. }) => {
                    lost.extend(self.on_event(h, f));
                }
                Frame::Snapshot {
                    seq,
                    entries,
                    first,
                    last,
                } => {
                    lost.extend(self.on_snapshot(h, seq, entries, first, last, &mut found));
                }
                Frame::SyncRequest => self.send_snapshot(h.node),
                Frame::Deliver { id, to, stanza } => {
                    let new = id == 0
                        || lock(&self.taken)
                            .entry((h.node, h.incarnation))
                            .or_default()
                            .take(id);
                    if new {
                        self.on_deliver(env, to, stanza).await;
                    }
                    if id != 0 {
                        acks.push(id);
                    }
                }
                Frame::Ack { ids } => {
                    let mut p = lock(&self.pending);
                    for id in ids {
                        if let Some(k) = p.remove(&(h.node, id)) {
                            self.counters
                                .ack_seconds
                                .observe(k.first_sent.elapsed().as_secs_f64());
                        }
                    }
                }
                Frame::Notify { to, module, token } => {
                    if let (Some(handle), Some(module)) =
                        (self.table.handle(&to), env.hooks.timer_module(&module))
                    {
                        let _ = handle
                            .try_send(SessionMsg::Notify(Box::new(TimerKey { module, token })));
                    }
                }
                Frame::Close { to, why } => {
                    if let Some(handle) = self.table.handle(&to) {
                        let _ = handle.try_send(SessionMsg::Close(why.into_reason()));
                    }
                }
                Frame::CloseAccount { account, why } => {
                    let reason = why.into_reason();
                    for (_, handle) in self.table.resources_with_handles(&account) {
                        if let Some(handle) = handle {
                            let _ = handle.try_send(SessionMsg::Close(reason.clone()));
                        }
                    }
                }
                Frame::Invalidate { module, key } => {
                    if let Some(h) = env.hooks.cache(&module) {
                        h.invalidate(&key);
                    }
                }
                Frame::Leaving => {
                    let removed = lock(&self.peers).remove(&h.node).is_some();
                    let gone = self.table.remove_node(h.node);
                    tracing::info!(
                        node = h.node,
                        left_sessions = gone.len(),
                        known = removed,
                        "node left the cluster"
                    );
                    self.reroute_pending(env, h.node).await;
                }
            }
        }
        if !acks.is_empty() {
            let first = {
                let mut all = lock(&self.acks);
                let was_empty = all.is_empty();
                all.entry(h.node).or_default().extend(acks);
                was_empty
            };
            if first {
                self.acks_queued.notify_one();
            }
        }
        if !lost.is_empty() {
            self.sessions_lost(env, lost).await;
        }
        if !found.is_empty() && self.lowest_alive() {
            for entry in found {
                let _ = run_chain!(env.hooks.session_lost, "session_returned", |h| h
                    .session_returned(env, &entry));
            }
        }
    }
}
