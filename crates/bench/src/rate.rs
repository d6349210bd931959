//! Rate scheduling for the `o2o` ramp.
//!
//! A ramp is a list of steps, each a total message rate held for a fixed
//! time. The sender loop asks [`RateSchedule::due`] how many messages should
//! have been sent by now and sends the difference, so short stalls are
//! caught up instead of silently lowering the rate, and the count never
//! overshoots.

/// One step of a ramp.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Step {
    /// Messages per second (for this process).
    pub rate: f64,
    /// Duration in seconds.
    pub secs: f64,
}

/// A piecewise-constant rate over time.
#[derive(Clone, Debug, PartialEq)]
pub struct RateSchedule {
    steps: Vec<Step>,
}

impl RateSchedule {
    /// A schedule of `rates` (total, msg/s) held `secs` each, divided by
    /// `share` (the number of processes sending in parallel).
    pub fn new(rates: &[f64], secs: f64, share: usize) -> RateSchedule {
        let share = share.max(1) as f64;
        RateSchedule {
            steps: rates
                .iter()
                .map(|&r| Step {
                    rate: r / share,
                    secs,
                })
                .collect(),
        }
    }

    /// The steps.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// Total duration in seconds.
    pub fn total_secs(&self) -> f64 {
        self.steps.iter().map(|s| s.secs).sum()
    }

    /// The step index active at `t` seconds (None once the ramp is over).
    pub fn step_at(&self, t: f64) -> Option<usize> {
        if t < 0.0 {
            return None;
        }
        let mut start = 0.0;
        for (i, s) in self.steps.iter().enumerate() {
            if t < start + s.secs {
                return Some(i);
            }
            start += s.secs;
        }
        None
    }

    /// Start time in seconds of step `i`.
    pub fn step_start(&self, i: usize) -> f64 {
        self.steps[..i].iter().map(|s| s.secs).sum()
    }

    /// Messages that should have been sent by `t` seconds (cumulative,
    /// floored). After the end it stays at the total.
    pub fn due(&self, t: f64) -> u64 {
        if t <= 0.0 {
            return 0;
        }
        let mut acc = 0.0;
        let mut start = 0.0;
        for s in &self.steps {
            if t < start + s.secs {
                acc += s.rate * (t - start);
                return acc.floor() as u64;
            }
            acc += s.rate * s.secs;
            start += s.secs;
        }
        acc.floor() as u64
    }
}

/// Parses a ramp: a comma list of rates (`100,200,500`) and/or ranges
/// `FROM..TO/STEP` (`1000..5000/1000` = 1000,2000,…,5000).
pub fn parse_rates(s: &str) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((range, step)) = part.split_once('/') {
            let (from, to) = range
                .split_once("..")
                .ok_or_else(|| anyhow::anyhow!("bad range {part:?}: want FROM..TO/STEP"))?;
            let (from, to, step): (f64, f64, f64) = (from.parse()?, to.parse()?, step.parse()?);
            anyhow::ensure!(step > 0.0 && to >= from, "bad range {part:?}");
            let mut r = from;
            while r <= to + 1e-9 {
                out.push(r);
                r += step;
            }
        } else {
            let r: f64 = part.parse()?;
            anyhow::ensure!(r > 0.0, "rates must be positive: {part:?}");
            out.push(r);
        }
    }
    anyhow::ensure!(!out.is_empty(), "empty ramp");
    Ok(out)
}

/// A small deterministic PRNG (SplitMix64) for picking senders and
/// recipients; not cryptographic, just fast and dependency-free.
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    /// Seeded generator.
    pub fn new(seed: u64) -> SplitMix {
        SplitMix(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_follows_the_ramp() {
        let s = RateSchedule::new(&[100.0, 200.0, 400.0], 10.0, 1);
        assert_eq!(s.due(0.0), 0);
        assert_eq!(s.due(1.0), 100);
        assert_eq!(s.due(10.0), 1000);
        assert_eq!(s.due(15.0), 2000);
        assert_eq!(s.due(20.0), 3000);
        assert_eq!(s.due(25.0), 5000);
        assert_eq!(s.due(30.0), 7000);
        assert_eq!(s.due(99.0), 7000, "no messages after the ramp");
        assert_eq!(s.total_secs(), 30.0);
    }

    #[test]
    fn due_is_monotonic_and_never_overshoots() {
        let s = RateSchedule::new(&[7.3, 1234.5, 0.5], 3.3, 1);
        let mut last = 0;
        let mut t = 0.0;
        while t < 12.0 {
            let d = s.due(t);
            assert!(d >= last);
            let exact = if t < 3.3 {
                7.3 * t
            } else if t < 6.6 {
                7.3 * 3.3 + 1234.5 * (t - 3.3)
            } else {
                7.3 * 3.3 + 1234.5 * 3.3 + 0.5 * (t - 6.6).min(3.3)
            };
            assert!(d as f64 <= exact + 1e-6 && d as f64 > exact - 1.0);
            last = d;
            t += 0.0137;
        }
    }

    #[test]
    fn workers_share_the_rate() {
        let one = RateSchedule::new(&[1000.0, 3000.0], 5.0, 1);
        let quarter = RateSchedule::new(&[1000.0, 3000.0], 5.0, 4);
        assert_eq!(quarter.due(10.0) * 4, one.due(10.0));
        assert_eq!(quarter.steps()[1].rate, 750.0);
    }

    #[test]
    fn step_lookup() {
        let s = RateSchedule::new(&[1.0, 2.0, 3.0], 2.0, 1);
        assert_eq!(s.step_at(-0.1), None);
        assert_eq!(s.step_at(0.0), Some(0));
        assert_eq!(s.step_at(1.99), Some(0));
        assert_eq!(s.step_at(2.0), Some(1));
        assert_eq!(s.step_at(5.9), Some(2));
        assert_eq!(s.step_at(6.0), None);
        assert_eq!(s.step_start(2), 4.0);
    }

    #[test]
    fn parses_lists_and_ranges() {
        assert_eq!(parse_rates("100, 200").unwrap(), vec![100.0, 200.0]);
        assert_eq!(
            parse_rates("1000..3000/1000,5000").unwrap(),
            vec![1000.0, 2000.0, 3000.0, 5000.0]
        );
        assert!(parse_rates("").is_err());
        assert!(parse_rates("10..5/1").is_err());
        assert!(parse_rates("-4").is_err());
    }

    #[test]
    fn splitmix_below_is_in_range_and_spreads() {
        let mut r = SplitMix::new(42);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            let v = r.below(10);
            seen[v as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 800 && c < 1200), "{seen:?}");
    }
}
