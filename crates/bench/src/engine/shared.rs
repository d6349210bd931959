//! The accounting every session feeds: deliveries per ramp step, errors,
//! latencies, stream management counters.

use super::now_us;
use crate::hist::Latency;
use crate::rate::RateSchedule;
use crate::report::SmResult;
use crate::rooms::RoomTracker;
use starling_xml::Element;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

/// Per-step counters of the ramp.
#[derive(Default)]
pub(super) struct StepCounters {
    pub(super) sent: AtomicU64,
    /// Copies the messages sent should produce (= sent for o2o; sent ×
    /// occupants for a room).
    pub(super) expected: AtomicU64,
    pub(super) delivered: AtomicU64,
    /// Benchmark messages that *arrived* during this step, whenever sent.
    pub(super) arrived: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) dropped: AtomicU64,
    pub(super) latency: Mutex<Latency>,
}

/// State shared by all tasks of one process.
pub struct Shared {
    /// Sessions established.
    pub established: AtomicU64,
    /// Setups failed.
    pub failed: AtomicU64,
    /// Messages queued for sending.
    pub sent: AtomicU64,
    /// Benchmark messages received.
    pub delivered: AtomicU64,
    /// Stream management (`--sm`).
    pub sm: SmCounters,
    pub(super) start_us: AtomicU64,
    pub(super) schedule: RateSchedule,
    pub(super) steps: Vec<StepCounters>,
    /// A group chat scenario's bookkeeping (joins or creations, copies
    /// per message).
    pub(crate) rooms: Option<Arc<dyn RoomTracker>>,
}

impl Shared {
    pub(crate) fn new(schedule: RateSchedule) -> Shared {
        let steps = (0..schedule.steps().len())
            .map(|_| StepCounters::default())
            .collect();
        Shared {
            established: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            sm: SmCounters::default(),
            start_us: AtomicU64::new(0),
            schedule,
            steps,
            rooms: None,
        }
    }

    /// With a group chat scenario's tracker (its elements go there first).
    pub(crate) fn with_rooms(mut self, t: Arc<dyn RoomTracker>) -> Shared {
        self.rooms = Some(t);
        self
    }

    /// The ramp step a message sent at `ts_us` belongs to (a message sent
    /// just after the ramp's end counts in the last step).
    pub(super) fn step_of(&self, ts_us: u64) -> Option<usize> {
        let start = self.start_us.load(Relaxed);
        if start == 0 || ts_us < start || self.steps.is_empty() {
            return None;
        }
        let t = (ts_us - start) as f64 / 1e6;
        Some(self.schedule.step_at(t).unwrap_or(self.steps.len() - 1))
    }

    /// The ramp step running at `ts_us`, if any (none during the drain).
    fn arrival_step(&self, ts_us: u64) -> Option<usize> {
        let start = self.start_us.load(Relaxed);
        if start == 0 || ts_us < start {
            return None;
        }
        self.schedule.step_at((ts_us - start) as f64 / 1e6)
    }

    /// Records a benchmark message (its send time is the body's first
    /// word); returns its step, latency in µs and the body's second word
    /// as a number (the group chat scenarios' message number) if it is a
    /// delivery (not an error bounce, not from before the ramp).
    pub(super) fn on_message(&self, el: &Element) -> Option<(usize, u64, Option<u64>)> {
        let body = el.children().find(|c| c.name() == "body")?;
        let text = body.text();
        let mut words = text.split_whitespace();
        let ts = words.next().and_then(|t| t.parse::<u64>().ok())?;
        let step = self.step_of(ts)?;
        let c = &self.steps[step];
        if el.attr("type") == Some("error") {
            c.errors.fetch_add(1, Relaxed);
            return None;
        }
        let now = now_us();
        let lat = now.saturating_sub(ts);
        if let Some(a) = self.arrival_step(now) {
            self.steps[a].arrived.fetch_add(1, Relaxed);
        }
        c.delivered.fetch_add(1, Relaxed);
        self.delivered.fetch_add(1, Relaxed);
        if let Ok(mut h) = c.latency.lock() {
            h.record_us(lat);
        }
        Some((step, lat, words.next().and_then(|t| t.parse::<u64>().ok())))
    }
}

/// Stream management counters of one process (`--sm`).
#[derive(Default)]
pub struct SmCounters {
    /// `<a h/>` answers sent to the server's `<r/>`.
    pub acks_sent: AtomicU64,
    /// `<r/>` sent by the client.
    pub requests_sent: AtomicU64,
    /// `<a h/>` received from the server.
    pub acks_received: AtomicU64,
}

impl SmCounters {
    /// The counts so far.
    pub fn result(&self) -> SmResult {
        SmResult {
            acks_sent: self.acks_sent.load(Relaxed),
            requests_sent: self.requests_sent.load(Relaxed),
            acks_received: self.acks_received.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_attributed_to_their_send_step() {
        let s = Shared::new(RateSchedule::new(&[10.0, 20.0], 2.0, 1));
        let start = 1_000_000_000u64;
        s.start_us.store(start, Relaxed);
        let msg = |ts: u64, ty: &str| {
            Element::builder("message", "jabber:client")
                .attr("type", ty)
                .append(
                    Element::builder("body", "jabber:client")
                        .text(format!("{ts} xx"))
                        .build(),
                )
                .build()
        };
        s.on_message(&msg(start + 500_000, "chat"));
        s.on_message(&msg(start + 2_500_000, "chat"));
        s.on_message(&msg(start + 2_600_000, "error"));
        s.on_message(&msg(start - 1, "chat")); // before the ramp: ignored
        assert_eq!(s.steps[0].delivered.load(Relaxed), 1);
        assert_eq!(s.steps[1].delivered.load(Relaxed), 1);
        assert_eq!(s.steps[1].errors.load(Relaxed), 1);
        assert_eq!(s.delivered.load(Relaxed), 2);
    }
}
