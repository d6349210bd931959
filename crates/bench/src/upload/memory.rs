//! The server's VmRSS sampled while the transfers run.

use crate::procmem;
use crate::report::RssWindow;
use std::time::Duration;

/// Samples a process's VmRSS until finished.
pub struct RssSampler {
    pid: u32,
    before: u64,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<(u64, u64)>,
}

impl RssSampler {
    /// Starts sampling `pid` every `every` (None if its memory is not
    /// readable).
    pub fn start(pid: u32, every: Duration) -> Option<RssSampler> {
        let before = procmem::rss_kb(pid).ok()?;
        let (stop, mut rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut max = before;
            let mut samples = 1u64;
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        if let Ok(kb) = procmem::rss_kb(pid) {
                            max = max.max(kb);
                            samples += 1;
                        }
                    }
                    _ = rx.changed() => break,
                }
            }
            (max, samples)
        });
        Some(RssSampler {
            pid,
            before,
            stop,
            task,
        })
    }

    /// Stops sampling; takes the "after" reading.
    pub async fn finish(self) -> RssWindow {
        let _ = self.stop.send(true);
        let (mut max, mut samples) = self.task.await.unwrap_or((self.before, 1));
        let after = procmem::rss_kb(self.pid).unwrap_or(0);
        if after > 0 {
            max = max.max(after);
            samples += 1;
        }
        RssWindow {
            before_kb: self.before,
            max_kb: max,
            after_kb: after,
            growth_kb: max.saturating_sub(self.before),
            samples,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_is_sampled_until_finished() {
        let s = RssSampler::start(std::process::id(), Duration::from_millis(5)).unwrap();
        tokio::time::sleep(Duration::from_millis(40)).await;
        let w = s.finish().await;
        assert!(w.samples >= 3, "{w:?}");
        assert!(w.before_kb > 0 && w.max_kb >= w.before_kb && w.max_kb >= w.after_kb);
        assert_eq!(w.growth_kb, w.max_kb - w.before_kb);
        assert!(RssSampler::start(u32::MAX, Duration::from_millis(5)).is_none());
    }
}
