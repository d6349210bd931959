//! The rate ramp: each step's messages sent at its rate, every delivered
//! copy attributed to the step its message was sent in.

use super::sessions::Session;
use super::shared::Shared;
use super::{hold, now_us};
use crate::cli::ScenarioArgs;
use crate::procmem;
use crate::rate::{parse_rates, SplitMix};
use crate::report::{O2oResult, StepResult};
use indicatif::ProgressBar;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// One message of the ramp, built by the scenario: the sender's outbox,
/// the stanza and how many copies of it should arrive.
pub(crate) struct Outgoing<'a> {
    /// The sending session's outbox.
    pub outbox: &'a mpsc::Sender<Vec<u8>>,
    /// The stanza; its body starts with the send time in µs.
    pub stanza: String,
    /// Copies the message should produce (1 for a chat message; one per
    /// occupant for a groupchat message, the reflection included).
    pub copies: u64,
}

/// What a ramp measured, step by step (the steps that ran).
pub(crate) struct RampOut {
    /// Per step: counts, latency of every copy, CPU. `delivered` and
    /// `arrived` count copies.
    pub steps: Vec<StepResult>,
    /// Per step: copies expected.
    pub expected: Vec<u64>,
}

/// The rate ramp: at each step's rate, asks `next(rng, seq, ts_us, step)`
/// for a message (`None`: nothing to send) and queues it on the sender's
/// outbox; `unsent(seq)` is told of messages the full outbox refused. Then
/// waits `--drain-secs` and collects the per-step results. A step that
/// delivered under `--min-ratio` of its expected copies or whose p99 is
/// above the bound counts as failed; after `--stop-after-fails` failed
/// steps in a row the ramp ends (`what` names the scenario in progress
/// lines).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn ramp<'a>(
    args: &ScenarioArgs,
    shared: &Arc<Shared>,
    start_us: u64,
    pb: &ProgressBar,
    server_pid: Option<u32>,
    what: &str,
    mut next: impl FnMut(&mut SplitMix, u64, u64, usize) -> Option<Outgoing<'a>>,
    mut unsent: impl FnMut(u64),
) -> RampOut {
    // CPU samples at each step boundary: (time s, server CPU s, own CPU s).
    let me = std::process::id();
    let sample = || {
        (
            now_us() as f64 / 1e6,
            server_pid.and_then(procmem::cpu_secs),
            procmem::cpu_secs(me),
        )
    };
    let mut marks = Vec::new();
    shared.start_us.store(start_us, Relaxed);
    let schedule = shared.schedule.clone();
    let nsteps = schedule.steps().len();
    let rates = parse_rates(&args.rates).unwrap_or_default();
    let mut rng = SplitMix::new(now_us() ^ (args.worker_index.unwrap_or(0) << 40));
    let early_stop = args.worker_index.is_none() && args.stop_after_fails > 0;
    let grace = (3.0 * args.p99_bound_ms / 1000.0).max(2.0);
    let mut evaluated = 0usize;
    let mut consecutive_fails = 0u32;
    let mut steps_run = nsteps;

    let wait = start_us.saturating_sub(now_us());
    tokio::time::sleep(Duration::from_micros(wait)).await;
    let mut sent = 0u64;
    let mut shown_step = usize::MAX;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while steps_run > 0 {
        let now = now_us();
        let t = now.saturating_sub(start_us) as f64 / 1e6;
        let Some(step) = schedule.step_at(t) else {
            break;
        };
        if step != shown_step {
            shown_step = step;
            while marks.len() <= step {
                marks.push(sample());
            }
            pb.set_prefix(format!("step {}/{nsteps}", step + 1));
            if !args.quiet && args.worker_index.is_none() {
                pb.println(format!(
                    "{what} step {}/{nsteps}: {} msg/s for {} s",
                    step + 1,
                    rates.get(step).copied().unwrap_or(0.0),
                    args.step_secs
                ));
            }
        }
        let due = schedule.due(t);
        while sent < due {
            sent += 1;
            // The receiver attributes the message by this timestamp: count
            // the send in the same step.
            let ts = now_us();
            let k = shared.step_of(ts).unwrap_or(step);
            let Some(m) = next(&mut rng, sent, ts, k) else {
                continue;
            };
            let counters = &shared.steps[k];
            if m.outbox.try_send(m.stanza.into_bytes()).is_ok() {
                counters.sent.fetch_add(1, Relaxed);
                counters.expected.fetch_add(m.copies, Relaxed);
                shared.sent.fetch_add(1, Relaxed);
            } else {
                counters.dropped.fetch_add(1, Relaxed);
                unsent(sent);
            }
        }
        // Early stop: judge each finished step after a grace period.
        if early_stop {
            while evaluated < step && t >= schedule.step_start(evaluated) + args.step_secs + grace {
                let c = &shared.steps[evaluated];
                let expected = c.expected.load(Relaxed);
                let ratio = c.delivered.load(Relaxed) as f64 / expected.max(1) as f64;
                let p99 = c.latency.lock().map(|h| h.quantile_ms(0.99)).unwrap_or(0.0);
                let ok = ratio >= args.min_ratio && p99 <= args.p99_bound_ms;
                consecutive_fails = if ok { 0 } else { consecutive_fails + 1 };
                evaluated += 1;
                if consecutive_fails >= args.stop_after_fails {
                    // The current step is partial: leave it out.
                    steps_run = step;
                    if !args.quiet {
                        pb.println(format!(
                            "{what}: {consecutive_fails} step(s) in a row did not keep up; stopping the ramp"
                        ));
                    }
                    break;
                }
            }
            if steps_run <= step {
                break;
            }
        }
        tick.tick().await;
    }
    marks.push(sample());
    pb.set_message(format!("draining {} s", args.drain_secs));
    hold(args.drain_secs).await;

    let run = 0..steps_run.min(nsteps);
    RampOut {
        steps: run
            .clone()
            .map(|i| {
                let c = &shared.steps[i];
                StepResult {
                    target_rate: rates[i],
                    sent: c.sent.load(Relaxed),
                    delivered: c.delivered.load(Relaxed),
                    arrived: c.arrived.load(Relaxed),
                    errors: c.errors.load(Relaxed),
                    client_dropped: c.dropped.load(Relaxed),
                    latency: c.latency.lock().map(|h| h.summary()).unwrap_or_default(),
                    server_cpu_pct: cpu_pct(&marks, i, |m| m.1),
                    client_cpu_pct: cpu_pct(&marks, i, |m| m.2),
                    ..StepResult::default()
                }
            })
            .collect(),
        expected: run
            .map(|i| shared.steps[i].expected.load(Relaxed))
            .collect(),
    }
}

/// The o2o ramp: messages from random local senders to random users.
pub(super) async fn o2o_ramp(
    args: &ScenarioArgs,
    shared: &Arc<Shared>,
    sessions: &[Session],
    start_us: u64,
    pb: &ProgressBar,
    server_pid: Option<u32>,
) -> O2oResult {
    let total_users = args.conn.users;
    let first = args.conn.first_user;
    let pad = "x".repeat(args.body_bytes);
    let resource = if args.to_bare {
        String::new()
    } else {
        format!("/{}", args.resource)
    };
    let next = |rng: &mut SplitMix, seq: u64, ts: u64, _step: usize| {
        if sessions.is_empty() {
            return None;
        }
        let s = &sessions[rng.below(sessions.len() as u64) as usize];
        let mut to = first + rng.below(total_users);
        if to == s.user && total_users > 1 {
            to = first + (to - first + 1) % total_users;
        }
        Some(Outgoing {
            outbox: &s.outbox,
            stanza: format!(
                "<message to='{}@{}{resource}' type='chat' id='m{seq}'><body>{ts} {pad}</body></message>",
                args.conn.user(to),
                args.conn.domain_of(to),
            ),
            copies: 1,
        })
    };
    let steps = if sessions.is_empty() {
        Vec::new()
    } else {
        ramp(args, shared, start_us, pb, server_pid, "o2o", next, |_| {})
            .await
            .steps
    };
    let mut o = O2oResult {
        step_secs: args.step_secs,
        p99_bound_ms: args.p99_bound_ms,
        min_delivery_ratio: args.min_ratio,
        drain_secs: args.drain_secs,
        steps,
        ..O2oResult::default()
    };
    o.finalize();
    o
}

type Mark = (f64, Option<f64>, Option<f64>);

/// CPU % of one core between marks `i` and `i + 1`.
fn cpu_pct(marks: &[Mark], i: usize, pick: impl Fn(&Mark) -> Option<f64>) -> Option<f64> {
    let (a, b) = (marks.get(i)?, marks.get(i + 1)?);
    let dt = b.0 - a.0;
    (dt > 0.0).then_some(())?;
    Some((pick(b)? - pick(a)?) / dt * 100.0)
}
