//! Back-pressure from storage to the sockets.
//!
//! A write-behind queue that falls behind the database raises the pressure;
//! while it is raised, sessions that have used their quota of stanzas in
//! this episode of pressure stop reading from their sockets (they keep
//! delivering what others send them), so senders are slowed down by TCP
//! flow control instead of the queues growing memory and latency without
//! bound, or sessions blocking in the middle of routing while their own
//! mailboxes overflow. Sources lower it again when they have drained below
//! their low-water mark; sessions then resume reading.
//!
//! The check on the hot path is one relaxed atomic load.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use tokio::sync::Notify;

/// The server-wide pressure gate.
#[derive(Default, Debug)]
pub struct Pressure {
    /// Sources that are currently over their high-water mark.
    raised: AtomicUsize,
    /// Counts the times the pressure went up from none: sessions keep
    /// their per-episode quota of stanzas against it.
    episode: AtomicU32,
    relieved: Notify,
}

impl Pressure {
    /// A gate with no pressure.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether any source is over its high-water mark.
    pub fn is_high(&self) -> bool {
        self.raised.load(Ordering::Relaxed) > 0
    }

    /// One source went over its high-water mark. Each `raise` is matched by
    /// exactly one [`Pressure::lower`] from the same source.
    pub fn raise(&self) {
        if self.raised.fetch_add(1, Ordering::AcqRel) == 0 {
            self.episode.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Which episode of pressure this is (or was last): it changes each
    /// time the pressure rises from none. A session under pressure reads
    /// on until it has handled its quota of stanzas in the episode, so a
    /// person sending now and then is not held up with the flooders.
    pub fn episode(&self) -> u32 {
        self.episode.load(Ordering::Relaxed)
    }

    /// One source drained below its low-water mark.
    pub fn lower(&self) {
        if self.raised.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.relieved.notify_waiters();
        }
    }

    /// Completes when no source is raised any more.
    pub async fn relieved(&self) {
        loop {
            let notified = self.relieved.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.is_high() {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn an_episode_starts_when_the_pressure_rises_from_none() {
        let p = Pressure::new();
        let first = p.episode();
        p.raise();
        assert_eq!(p.episode(), first + 1);
        p.raise(); // a second source: the same episode
        p.lower();
        assert_eq!(p.episode(), first + 1);
        p.lower();
        p.raise();
        assert_eq!(p.episode(), first + 2, "risen again from none");
    }

    #[tokio::test]
    async fn relieved_waits_until_every_source_lowered() {
        let p = Arc::new(Pressure::new());
        p.raise();
        p.raise();
        assert!(p.is_high());
        let waiter = tokio::spawn({
            let p = p.clone();
            async move { p.relieved().await }
        });
        p.lower();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "one source is still raised");
        p.lower();
        tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("relieved after the last lower")
            .unwrap();
        assert!(!p.is_high());
        // No pressure: returns at once.
        tokio::time::timeout(Duration::from_millis(100), p.relieved())
            .await
            .unwrap();
    }
}
