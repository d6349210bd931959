//! The computations over results: merging worker results, rates and
//! ratios, the saturation point of a ramp, the cost metric.

use super::scenarios::{CreationResult, JoinResult, PhaseStats, RoomRampResult};
use super::{ConnectResult, CostResult, O2oResult, RunResult, Saturation, StepResult};
use crate::hist::LatencySummary;

/// Instance cost per billion delivered messages.
pub fn cost_per_billion(hourly_price: f64, delivered_per_s: f64) -> Option<f64> {
    if delivered_per_s <= 0.0 {
        return None;
    }
    Some(hourly_price / (delivered_per_s * 3600.0) * 1e9)
}

impl RunResult {
    /// Fills [`RunResult::cost`] from the saturation point.
    pub fn compute_cost(&mut self, hourly_price: Option<f64>) {
        let (Some(price), Some(o2o)) = (hourly_price, &self.o2o) else {
            return;
        };
        let d = o2o.saturation.delivered_per_s;
        self.cost = cost_per_billion(price, d).map(|c| CostResult {
            hourly_price: price,
            delivered_per_s: d,
            cost_per_billion: c,
        });
    }
}

impl ConnectResult {
    /// Recomputes duration and rate from the window.
    pub fn finalize(&mut self) {
        self.duration_s =
            self.finished_unix_ms.saturating_sub(self.started_unix_ms) as f64 / 1000.0;
        self.sessions_per_s = if self.duration_s > 0.0 {
            self.established as f64 / self.duration_s
        } else {
            0.0
        };
    }

    /// Merges worker results (counts add, window is the union, latency merges
    /// exactly).
    pub fn merge(parts: &[ConnectResult]) -> anyhow::Result<ConnectResult> {
        let mut out = ConnectResult {
            started_unix_ms: parts.iter().map(|p| p.started_unix_ms).min().unwrap_or(0),
            finished_unix_ms: parts.iter().map(|p| p.finished_unix_ms).max().unwrap_or(0),
            ..ConnectResult::default()
        };
        for p in parts {
            out.attempted += p.attempted;
            out.established += p.established;
            out.failed += p.failed;
            for (k, v) in &p.failures {
                *out.failures.entry(k.clone()).or_default() += v;
            }
            if out.first_error.is_none() {
                out.first_error.clone_from(&p.first_error);
            }
            out.client_cpu_s = sum_opt(out.client_cpu_s, p.client_cpu_s);
        }
        out.server_cpu_s = parts.iter().find_map(|p| p.server_cpu_s);
        out.setup_latency = LatencySummary::merge_all(parts.iter().map(|p| &p.setup_latency))?;
        out.finalize();
        Ok(out)
    }
}

impl RoomRampResult {
    /// Recomputes per-step rates, ratios, CPU per copy and `ok`, then the
    /// saturation point.
    pub fn finalize(&mut self) {
        let secs = self.step_secs.max(1e-9);
        for s in &mut self.steps {
            s.sent_per_s = s.sent as f64 / secs;
            s.delivered_per_s = s.delivered_copies as f64 / secs;
            s.arrived_per_s = s.arrived_copies as f64 / secs;
            s.delivery_ratio = if s.expected_copies > 0 {
                s.delivered_copies as f64 / s.expected_copies as f64
            } else {
                0.0
            };
            s.server_cpu_us_per_copy = match s.server_cpu_pct {
                Some(p) if s.arrived_copies > 0 => {
                    Some(p / 100.0 * secs / s.arrived_copies as f64 * 1e6)
                }
                _ => None,
            };
            s.ok = s.sent > 0
                && s.delivery_ratio >= self.min_delivery_ratio
                && s.latency.p99_ms <= self.p99_bound_ms
                && s.sent_per_s >= 0.9 * s.target_rate;
        }
        let points: Vec<RampPoint> = self
            .steps
            .iter()
            .map(|s| RampPoint {
                ok: s.ok,
                target_rate: s.target_rate,
                delivered_per_s: s.delivered_per_s,
            })
            .collect();
        self.saturation = saturation_of(&points, self.p99_bound_ms);
        if self.saturation.rate > 0.0 {
            self.saturation.note = format!(
                "{}; {:.0} delivered copies/s at {} msg/s sent",
                self.saturation.note, self.saturation.delivered_per_s, self.saturation.rate
            );
        }
    }

    /// With `--require-ratio`: fails unless that fraction of the copies
    /// expected over the ramp was delivered (nothing to check without a
    /// ramp).
    pub fn require(&self, ratio: f64) -> anyhow::Result<()> {
        if self.steps.is_empty() {
            return Ok(());
        }
        let expected: u64 = self.steps.iter().map(|s| s.expected_copies).sum();
        let delivered: u64 = self.steps.iter().map(|s| s.delivered_copies).sum();
        anyhow::ensure!(
            expected > 0 && delivered as f64 >= ratio * expected as f64,
            "only {delivered}/{expected} copies of room messages delivered"
        );
        Ok(())
    }
}

impl PhaseStats {
    /// Counts a failure by cause; the first failure's detail is kept as
    /// the example.
    pub fn fail(&mut self, cause: &str, detail: impl FnOnce() -> String) {
        *self.failures.entry(cause.to_owned()).or_default() += 1;
        if self.first_error.is_none() {
            self.first_error = Some(detail());
        }
    }

    /// With `--require-ratio`: fails unless `done` of `attempted` (what
    /// they are: `what`) reach `ratio`.
    pub fn require(&self, done: u64, attempted: u64, ratio: f64, what: &str) -> anyhow::Result<()> {
        anyhow::ensure!(
            attempted > 0 && done as f64 >= ratio * attempted as f64,
            "only {done}/{attempted} {what} ({:?})",
            self.first_error
        );
        Ok(())
    }

    /// Sets the phase's length from its window and returns `n` per second
    /// over it.
    pub fn per_s(&mut self, n: u64) -> f64 {
        self.duration_s =
            self.finished_unix_ms.saturating_sub(self.started_unix_ms) as f64 / 1000.0;
        if self.duration_s > 0.0 {
            n as f64 / self.duration_s
        } else {
            0.0
        }
    }
}

impl JoinResult {
    /// Recomputes duration and rate from the window.
    pub fn finalize(&mut self) {
        self.joins_per_s = self.phase.per_s(self.joined);
    }
}

impl CreationResult {
    /// Recomputes duration and rates from the window.
    pub fn finalize(&mut self) {
        self.rooms_per_s = self.phase.per_s(self.created);
        self.members_per_s = self.phase.per_s(self.members);
    }
}

impl O2oResult {
    /// Recomputes per-step rates, ratios and `ok`, then the saturation point.
    pub fn finalize(&mut self) {
        let secs = self.step_secs.max(1e-9);
        for s in &mut self.steps {
            s.sent_per_s = s.sent as f64 / secs;
            s.delivered_per_s = s.delivered as f64 / secs;
            s.arrived_per_s = s.arrived as f64 / secs;
            s.delivery_ratio = if s.sent > 0 {
                s.delivered as f64 / s.sent as f64
            } else {
                0.0
            };
            s.ok = s.sent > 0
                && s.delivery_ratio >= self.min_delivery_ratio
                && s.latency.p99_ms <= self.p99_bound_ms
                && s.sent_per_s >= 0.9 * s.target_rate;
        }
        self.saturation = saturation(&self.steps, self.p99_bound_ms);
    }

    /// Merges worker results step by step (all workers run the same ramp).
    pub fn merge(parts: &[O2oResult]) -> anyhow::Result<O2oResult> {
        let first = parts
            .first()
            .ok_or_else(|| anyhow::anyhow!("no o2o results to merge"))?;
        let n = parts.iter().map(|p| p.steps.len()).max().unwrap_or(0);
        let mut steps = Vec::with_capacity(n);
        for i in 0..n {
            let each: Vec<&StepResult> = parts.iter().filter_map(|p| p.steps.get(i)).collect();
            steps.push(StepResult {
                target_rate: each[0].target_rate,
                sent: each.iter().map(|s| s.sent).sum(),
                delivered: each.iter().map(|s| s.delivered).sum(),
                arrived: each.iter().map(|s| s.arrived).sum(),
                errors: each.iter().map(|s| s.errors).sum(),
                client_dropped: each.iter().map(|s| s.client_dropped).sum(),
                latency: LatencySummary::merge_all(each.iter().map(|s| &s.latency))?,
                // Every worker sees the same server; client CPU adds up.
                server_cpu_pct: each.iter().find_map(|s| s.server_cpu_pct),
                client_cpu_pct: each.iter().fold(None, |a, s| sum_opt(a, s.client_cpu_pct)),
                ..StepResult::default()
            });
        }
        let mut out = O2oResult {
            step_secs: first.step_secs,
            p99_bound_ms: first.p99_bound_ms,
            min_delivery_ratio: first.min_delivery_ratio,
            drain_secs: first.drain_secs,
            steps,
            saturation: Saturation::default(),
        };
        out.finalize();
        Ok(out)
    }
}

fn sum_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x + y),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The highest step that kept up, and whether a later one failed.
pub fn saturation(steps: &[StepResult], bound_ms: f64) -> Saturation {
    let points: Vec<RampPoint> = steps
        .iter()
        .map(|s| RampPoint {
            ok: s.ok,
            target_rate: s.target_rate,
            delivered_per_s: s.delivered_per_s,
        })
        .collect();
    saturation_of(&points, bound_ms)
}

/// What [`saturation_of`] needs of a step.
pub struct RampPoint {
    /// The step kept up.
    pub ok: bool,
    /// Its target rate.
    pub target_rate: f64,
    /// What it delivered per second.
    pub delivered_per_s: f64,
}

/// [`saturation`] over any kind of step.
pub fn saturation_of(steps: &[RampPoint], bound_ms: f64) -> Saturation {
    let best = steps.iter().rposition(|s| s.ok);
    match best {
        None => Saturation {
            reached: false,
            rate: 0.0,
            delivered_per_s: 0.0,
            note: format!(
                "no step kept up (delivery ratio or p99 ≤ {bound_ms} ms failed from the first step)"
            ),
        },
        Some(i) if i + 1 == steps.len() => Saturation {
            reached: false,
            rate: steps[i].target_rate,
            delivered_per_s: steps[i].delivered_per_s,
            note: format!(
                "every step up to {} msg/s kept up: saturation is above the ramp",
                steps[i].target_rate
            ),
        },
        Some(i) => Saturation {
            reached: true,
            rate: steps[i].target_rate,
            delivered_per_s: steps[i].delivered_per_s,
            note: format!(
                "kept up to {} msg/s; {} msg/s failed",
                steps[i].target_rate,
                steps[i + 1].target_rate
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{lat, o2o, step};
    use super::*;
    #[test]
    fn saturation_is_the_last_step_that_kept_up() {
        let o = o2o(vec![
            step(100.0, 1000, 1000, 2_000),
            step(200.0, 2000, 2000, 5_000),
            step(400.0, 4000, 3000, 5_000),   // ratio too low
            step(800.0, 8000, 8000, 500_000), // p99 too high
        ]);
        assert!(o.steps[0].ok && o.steps[1].ok && !o.steps[2].ok && !o.steps[3].ok);
        assert!(o.saturation.reached);
        assert_eq!(o.saturation.rate, 200.0);
        assert_eq!(o.saturation.delivered_per_s, 200.0);
    }

    #[test]
    fn client_that_cannot_reach_the_rate_does_not_count() {
        let o = o2o(vec![
            step(100.0, 1000, 1000, 1_000),
            step(1000.0, 5000, 5000, 1_000),
        ]);
        assert!(!o.steps[1].ok);
        assert_eq!(o.saturation.rate, 100.0);
    }

    #[test]
    fn ramp_without_failure_is_not_saturated() {
        let o = o2o(vec![step(100.0, 1000, 1000, 1_000)]);
        assert!(!o.saturation.reached);
        assert_eq!(o.saturation.rate, 100.0);
    }

    #[test]
    fn merging_worker_steps_adds_counts_and_histograms() {
        let a = o2o(vec![
            step(100.0, 500, 500, 1_000),
            step(200.0, 1000, 990, 1_000),
        ]);
        let b = o2o(vec![
            step(100.0, 500, 500, 3_000),
            step(200.0, 1000, 1000, 200_000),
        ]);
        let m = O2oResult::merge(&[a, b]).unwrap();
        assert_eq!(m.steps[0].sent, 1000);
        assert_eq!(m.steps[0].delivered, 1000);
        assert_eq!(m.steps[0].latency.count, 1000);
        assert!((m.steps[0].latency.p50_ms - 1.0).abs() < 0.01);
        assert!((m.steps[0].latency.p90_ms - 3.0).abs() < 0.01);
        assert_eq!(m.steps[1].delivered, 1990);
        // Half of step 2's deliveries are slow: merged p99 must see it.
        assert!(m.steps[1].latency.p99_ms > 100.0);
        assert!(!m.steps[1].ok);
        assert_eq!(m.saturation.rate, 100.0);
    }

    #[test]
    fn arrivals_per_step_are_summed_rated_and_optional_in_json() {
        // Past saturation a step's own messages arrive late (delivered/s
        // drops) while the server keeps delivering (arrived/s holds).
        let mut a = step(200.0, 2000, 600, 1_000);
        a.arrived = 1500;
        let mut b = step(200.0, 2000, 700, 1_000);
        b.arrived = 1400;
        let m = O2oResult::merge(&[o2o(vec![a]), o2o(vec![b])]).unwrap();
        assert_eq!(m.steps[0].arrived, 2900);
        assert_eq!(m.steps[0].arrived_per_s, 290.0);
        assert_eq!(m.steps[0].delivered_per_s, 130.0);
        // A result written before the field existed still reads.
        let mut v = serde_json::to_value(&m.steps[0]).unwrap();
        v.as_object_mut().unwrap().remove("arrived");
        v.as_object_mut().unwrap().remove("arrived_per_s");
        let old: StepResult = serde_json::from_value(v).unwrap();
        assert_eq!(old.arrived, 0);
    }

    #[test]
    fn connect_merge_uses_the_union_window() {
        let a = ConnectResult {
            attempted: 10,
            established: 9,
            failed: 1,
            failures: [("auth".to_string(), 1)].into(),
            started_unix_ms: 1_000,
            finished_unix_ms: 3_000,
            setup_latency: lat(&[1000; 9]),
            ..ConnectResult::default()
        };
        let b = ConnectResult {
            attempted: 10,
            established: 10,
            started_unix_ms: 1_500,
            finished_unix_ms: 5_000,
            setup_latency: lat(&[2000; 10]),
            ..ConnectResult::default()
        };
        let m = ConnectResult::merge(&[a, b]).unwrap();
        assert_eq!(m.established, 19);
        assert_eq!(m.failures["auth"], 1);
        assert_eq!(m.duration_s, 4.0);
        assert_eq!(m.sessions_per_s, 19.0 / 4.0);
        assert_eq!(m.setup_latency.count, 19);
    }

    #[test]
    fn cost_metric() {
        // 1 $/h at 10,000 msg/s: 36 M msgs per $ → 27.78 $ per billion.
        let c = cost_per_billion(1.0, 10_000.0).unwrap();
        assert!((c - 27.777_777).abs() < 1e-3);
        assert_eq!(cost_per_billion(1.0, 0.0), None);
    }
}
