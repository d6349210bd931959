//! Throttling of repeated log lines.
//!
//! A warning that a client can trigger at will (a bounce to a full
//! mailbox, say) must not turn into a log flood: one abusive pair of
//! accounts once wrote 19 MB of identical lines in 35 s. A [`LogThrottle`]
//! lets the first event through, then at most one per interval, and that
//! line reports how many were suppressed since the previous one. Counting
//! every event is the job of a metric, not of the log.
//!
//! It is two atomics and no lock, so it can sit in every session's mailbox
//! and be checked on the routing hot path.
//!
//! For a log line that has one cause at one place in the code (an
//! unauthenticated client's stream error, a refused admin token), the
//! [`log_throttled!`](crate::log_throttled) macro keeps a `LogThrottle` in a
//! `static` at the call site: at most one line per [`LOG_INTERVAL`] per
//! call site, each with a `suppressed` field, so no outside party can write
//! more than a few lines a minute through it (docs/security.md, "Logs").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How often a throttled warning is logged at most.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Lets one repeated warning through at most once per interval.
#[derive(Debug, Default)]
pub struct LogThrottle {
    /// When the last line was let through, in milliseconds on
    /// [`monotonic_ms`]'s clock; 0 = never.
    last_ms: AtomicU64,
    /// Events not logged since that line.
    suppressed: AtomicU64,
}

/// Milliseconds since an arbitrary process-wide origin, plus one (so 0 can
/// mean "never").
pub fn monotonic_ms() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    origin.elapsed().as_millis() as u64 + 1
}

impl LogThrottle {
    /// A throttle that lets its first event through (usable in a `static`).
    pub const fn new() -> LogThrottle {
        LogThrottle {
            last_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Records one event. `Some(n)` means: log it now, saying that `n`
    /// events were suppressed since the previous line; `None`: stay quiet
    /// (the event is counted for the next line).
    pub fn check(&self) -> Option<u64> {
        self.check_at(monotonic_ms(), LOG_INTERVAL.as_millis() as u64)
    }

    /// [`check`](Self::check) at a given time (milliseconds, > 0) and
    /// interval, for tests.
    pub fn check_at(&self, now_ms: u64, interval_ms: u64) -> Option<u64> {
        let last = self.last_ms.load(Ordering::Relaxed);
        if (last == 0 || now_ms.saturating_sub(last) >= interval_ms)
            && self
                .last_ms
                .compare_exchange(last, now_ms.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // Only the thread that won the exchange logs; an event counted
            // by a racing thread meanwhile may land in this line or the
            // next, which is as good.
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// Logs a `tracing` event at most once per [`LOG_INTERVAL`] for this call
/// site, with a `suppressed` field counting the events not logged since
/// the previous line. Use it for every line that an outside party can
/// cause at will (a client's bad input, a refused token, a full quota):
///
/// ```
/// # let peer = "[::1]:5222";
/// starling_core::log_throttled!(info, %peer, "closing stream with error");
/// ```
#[macro_export]
macro_rules! log_throttled {
    ($level:ident, $($rest:tt)+) => {{
        static THROTTLE: $crate::throttle::LogThrottle = $crate::throttle::LogThrottle::new();
        if let Some(suppressed) = THROTTLE.check() {
            $crate::throttle::__tracing::$level!(suppressed, $($rest)+);
        }
    }};
}

#[doc(hidden)]
pub use tracing as __tracing;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_throttle_first_event_logged_then_one_summary_per_interval() {
        let t = LogThrottle::default();
        assert_eq!(t.check_at(5, 10_000), Some(0), "the first event is logged");
        for ms in 6..1006 {
            assert_eq!(t.check_at(ms, 10_000), None, "within the interval");
        }
        assert_eq!(
            t.check_at(10_005, 10_000),
            Some(1000),
            "the next line says how many were suppressed"
        );
        assert_eq!(t.check_at(10_006, 10_000), None);
        assert_eq!(t.check_at(30_000, 10_000), Some(1));
        assert_eq!(
            t.check_at(50_000, 10_000),
            Some(0),
            "a lone event after a quiet spell"
        );
    }

    #[test]
    fn log_throttle_concurrent_events_all_counted() {
        let t = std::sync::Arc::new(LogThrottle::default());
        assert_eq!(t.check_at(1, 10_000), Some(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        assert_eq!(t.check_at(2, 10_000), None);
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        assert_eq!(t.check_at(10_001, 10_000), Some(40_000));
    }

    #[test]
    fn log_throttled_macro_writes_one_line_per_call_site_per_interval() {
        use std::io::Write;
        use std::sync::{Arc, Mutex};
        #[derive(Clone)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf(Arc::new(Mutex::new(Vec::new())));
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            for i in 0..10_000 {
                crate::log_throttled!(info, peer = i, "flood line");
            }
            for _ in 0..10 {
                crate::log_throttled!(warn, "another cause");
            }
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].contains("flood line") && lines[0].contains("suppressed=0 peer=0"),
            "{text}"
        );
        assert!(lines[1].contains("another cause"), "{text}");
    }

    #[test]
    fn monotonic_ms_never_zero() {
        assert!(monotonic_ms() >= 1);
    }
}
