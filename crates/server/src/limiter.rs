//! Fixed-window counters per IP address (authentication failures,
//! registrations). Memory is bounded: stale windows are pruned when the map
//! grows, and the map never exceeds `MAX_TRACKED` addresses. An
//! IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, how a dual-stack listener
//! sees an IPv4 client) counts as the IPv4 address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const MAX_TRACKED: usize = 100_000;

/// Counts events per IP address within a window.
pub struct IpLimiter {
    max: u32,
    window: Duration,
    map: Mutex<HashMap<IpAddr, (u32, Instant)>>,
}

impl IpLimiter {
    /// Allows `max` events per `window` per address.
    pub fn new(max: u32, window: Duration) -> Self {
        IpLimiter {
            max,
            window,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// True if `ip` has used up its allowance in the current window.
    pub fn is_limited(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&ip) {
            Some((n, start)) => start.elapsed() < self.window && *n >= self.max,
            None => false,
        }
    }

    /// Records one event for `ip`; returns true if it is now limited.
    pub fn record(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_TRACKED {
            let window = self.window;
            map.retain(|_, (_, start)| start.elapsed() < window);
            if map.len() >= MAX_TRACKED {
                map.clear();
            }
        }
        let now = Instant::now();
        let entry = map.entry(ip).or_insert((0, now));
        if now.duration_since(entry.1) >= self.window {
            *entry = (0, now);
        }
        entry.0 = entry.0.saturating_add(1);
        entry.0 >= self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_limits_after_max_events_per_ip() {
        let l = IpLimiter::new(2, Duration::from_secs(60));
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        assert!(!l.is_limited(a));
        assert!(!l.record(a));
        assert!(l.record(a));
        assert!(l.is_limited(a));
        assert!(!l.is_limited(b));
    }

    #[test]
    fn limiter_mapped_ipv4_counts_as_ipv4() {
        let l = IpLimiter::new(2, Duration::from_secs(60));
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert!(!l.record(v4));
        assert!(l.record(mapped), "the second failure from the same address");
        assert!(l.is_limited(v4));
        assert!(l.is_limited(mapped));
    }

    #[test]
    fn limiter_window_expiry_resets() {
        let l = IpLimiter::new(1, Duration::from_millis(1));
        let a: IpAddr = "::1".parse().unwrap();
        l.record(a);
        std::thread::sleep(Duration::from_millis(5));
        assert!(!l.is_limited(a));
    }
}
