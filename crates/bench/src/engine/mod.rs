//! The scenarios: connection storm, idle sessions, one-to-one chat ramp,
//! and the machinery the group chat scenarios ([`crate::rooms`]: `muc`,
//! `muc-light`) share with them.
//!
//! Every session is two small tasks: a reader (parses, records deliveries,
//! answers server pings) and a writer (drains a bounded outbox, coalescing
//! writes). The storm keeps at most `--concurrency` setups in flight. The
//! rate ramp ([`ramp()`]) sends whatever its caller builds (a chat message to
//! a random user, a groupchat message to a room) at each step's rate and
//! attributes every delivered copy to the step its message was sent in.
//!
//! This file runs a scenario (locally or as workers) and writes its
//! results; `sessions.rs` holds the storm and each session's reader and
//! writer, `shared.rs` the counters they feed, `ramp.rs` the rate ramp.

mod ramp;
mod sessions;
mod shared;

pub(crate) use ramp::{ramp, Outgoing, RampOut};
pub(crate) use sessions::{
    close, connect_phase, iq_reply, is_stanza, storm, storm_with, target_for, Session,
};
pub use shared::{Shared, SmCounters};

use crate::cli::ScenarioArgs;
use crate::client::Target;
use crate::rate::{parse_rates, RateSchedule};
use crate::report::{IdleResult, RunResult, TargetInfo};
use crate::{client, procmem, workers};
use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use ramp::o2o_ramp;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::AsyncBufReadExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Which scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// Connection storm.
    Connect,
    /// Idle sessions, server memory.
    Idle,
    /// One-to-one chat ramp.
    O2o,
    /// Archive queries (run by [`crate::archive`], not by [`run`]).
    Archive,
    /// Stream resumption (run by [`crate::resume`], not by [`run`]).
    Resume,
    /// Multi-user chat (run by [`crate::muc`], not by [`run`]).
    Muc,
    /// MUC Light (run by [`crate::muc_light`], not by [`run`]).
    MucLight,
    /// Personal eventing at login (run by [`crate::pep`], not by [`run`]).
    Pep,
    /// HTTP File Upload (run by [`crate::upload`], not by [`run`]).
    Upload,
}

impl Scenario {
    /// The CLI name.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Connect => "connect",
            Scenario::Idle => "idle",
            Scenario::O2o => "o2o",
            Scenario::Archive => "archive",
            Scenario::Resume => "resume",
            Scenario::Muc => "muc",
            Scenario::MucLight => "muc-light",
            Scenario::Pep => "pep",
            Scenario::Upload => "upload",
        }
    }
}

/// Microseconds since the Unix epoch (shared clock across worker processes).
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn now_ms() -> u64 {
    now_us() / 1000
}

/// Coordination with a parent process (when this is a worker).
enum Mode {
    Local,
    Worker(tokio::io::Lines<tokio::io::BufReader<tokio::io::Stdin>>),
}

impl Mode {
    /// Tells the coordinator this process is ready and waits for `GO <start_us>`.
    async fn ready_and_wait(&mut self) -> anyhow::Result<Option<u64>> {
        match self {
            Mode::Local => Ok(None),
            Mode::Worker(lines) => {
                println!("READY");
                let line = lines.next_line().await?.context("coordinator went away")?;
                let start = line
                    .strip_prefix("GO")
                    .map(str::trim)
                    .and_then(|s| s.parse::<u64>().ok())
                    .filter(|s| *s > 0);
                Ok(start)
            }
        }
    }
}

pub(crate) fn target_of(args: &ScenarioArgs) -> anyhow::Result<Arc<Target>> {
    Ok(Arc::new(Target {
        addr: std::net::SocketAddr::new(args.conn.host, args.conn.port),
        domain: args.conn.domain.clone(),
        tls: args.conn.tls,
        carrier: args.conn.transport,
        mech: args.conn.mechanism,
        sources: args.conn.source_list(args.conn.users),
        extra_ports: args.conn.extra_ports.clone(),
        step_timeout: Duration::from_secs_f64(args.conn.step_timeout),
        tls_connector: client::tls_connector()?,
        bosh_wait: args.conn.bosh_wait,
        sm: args.conn.sm,
        sasl2: false,
        fast: false,
        full_login: false,
    }))
}

/// Target description for reports.
pub fn target_info(args: &ScenarioArgs) -> TargetInfo {
    TargetInfo {
        label: args.label.clone(),
        address: format!("{}:{}", args.conn.host, args.conn.port),
        domain: args.conn.domain_label(),
        tls: format!("{:?}", args.conn.tls).to_lowercase(),
        mechanism: match args.conn.mechanism {
            client::Mech::Plain => "PLAIN",
            client::Mech::ScramSha1 => "SCRAM-SHA-1",
            client::Mech::ScramSha256 => "SCRAM-SHA-256",
        }
        .into(),
        sources: args
            .conn
            .source_list(args.conn.users)
            .iter()
            .map(|s| s.to_string())
            .collect(),
    }
}

/// The empty result skeleton.
pub fn skeleton(sc: Scenario, args: &ScenarioArgs, workers: u32) -> RunResult {
    RunResult {
        tool: "starling-bench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        scenario: sc.name().into(),
        started_unix: now_us() / 1_000_000,
        target: target_info(args),
        users: args.conn.users,
        workers,
        ..RunResult::default()
    }
}

/// Runs a scenario: in this process, or split over worker processes.
pub async fn run(sc: Scenario, args: ScenarioArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.conn.users > 0, "--users must be at least 1");
    anyhow::ensure!(
        !matches!(
            sc,
            Scenario::Archive
                | Scenario::Resume
                | Scenario::Muc
                | Scenario::MucLight
                | Scenario::Pep
                | Scenario::Upload
        ),
        "the {} scenario has its own runner",
        sc.name()
    );
    let result = if args.worker_index.is_none() && args.conn.users > args.sessions_per_process() {
        workers::coordinate(sc, &args).await?
    } else {
        let worker = args.worker_index.is_some();
        let mode = if worker {
            Mode::Worker(tokio::io::BufReader::new(tokio::io::stdin()).lines())
        } else {
            Mode::Local
        };
        let r = run_local(sc, &args, mode).await?;
        if worker {
            println!("R {}", serde_json::to_string(&r)?);
            return Ok(());
        }
        r
    };
    output(&result, &args)
}

pub(crate) fn output(result: &RunResult, args: &ScenarioArgs) -> anyhow::Result<()> {
    let json = serde_json::to_string(result)?;
    if args.json {
        eprint!("{}", result.table());
        println!("{json}");
    } else {
        print!("{}", result.table());
    }
    if let Some(path) = &args.json_file {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        writeln!(f, "{json}")?;
    }
    if args.require_ratio > 0.0 {
        let c = &result.connect;
        let ratio = c.established as f64 / c.attempted.max(1) as f64;
        anyhow::ensure!(
            ratio >= args.require_ratio,
            "only {}/{} sessions established ({:?})",
            c.established,
            c.attempted,
            c.first_error
        );
        if let Some(o) = &result.o2o {
            let sent: u64 = o.steps.iter().map(|s| s.sent).sum();
            let delivered: u64 = o.steps.iter().map(|s| s.delivered).sum();
            anyhow::ensure!(
                sent > 0 && delivered as f64 >= args.require_ratio * sent as f64,
                "only {delivered}/{sent} messages delivered"
            );
        }
        let r = args.require_ratio;
        if let Some(m) = &result.muc {
            let j = &m.join;
            (j.phase).require(j.joined, j.attempted, r, "sessions entered their room")?;
            m.ramp.require(r)?;
        }
        if let Some(m) = &result.muc_light {
            let c = &m.creation;
            (c.phase).require(c.created, c.attempted, r, "MUC Light rooms created")?;
            m.ramp.require(r)?;
        }
        if let Some(p) = &result.pep {
            anyhow::ensure!(
                p.received_expected as f64 >= r * p.expected as f64,
                "only {}/{} expected PEP notifications received in the login windows",
                p.received_expected,
                p.expected
            );
            if let Some(x) = &p.setup {
                anyhow::ensure!(
                    x.contacts_both as f64 >= r * x.contacts_expected as f64
                        && x.published as f64 >= r * x.publish_expected as f64,
                    "setup incomplete: {}/{} contacts mutually subscribed, {}/{} items published ({:?})",
                    x.contacts_both,
                    x.contacts_expected,
                    x.published,
                    x.publish_expected,
                    x.first_error
                );
            }
            if let Some(f) = &p.fanout {
                anyhow::ensure!(
                    f.sent as f64 >= r * f.publications as f64
                        && f.delivered as f64 >= r * f.expected as f64,
                    "publish fan-out: {}/{} publications sent, {}/{} notifications delivered ({} errors)",
                    f.sent,
                    f.publications,
                    f.delivered,
                    f.expected,
                    f.errors
                );
            }
        }
        if let Some(u) = &result.upload {
            for p in &u.phases {
                anyhow::ensure!(
                    p.verified as f64 >= r * p.files as f64,
                    "upload phase {}: only {}/{} files uploaded, downloaded and verified \
                     (slots {:?}, up {:?}, down {:?})",
                    p.name,
                    p.verified,
                    p.files,
                    p.slots.first_error,
                    p.upload.first_error,
                    p.download.first_error
                );
            }
        }
        if let Some(a) = &result.archive {
            let sent: u64 = a.kinds.iter().map(|k| k.queries).sum();
            let ok: u64 = a.kinds.iter().map(|k| k.ok).sum();
            anyhow::ensure!(
                sent > 0 && ok as f64 >= args.require_ratio * sent as f64,
                "only {ok}/{sent} archive queries succeeded"
            );
            if let Some(f) = &a.fill {
                anyhow::ensure!(
                    f.delivered as f64 >= args.require_ratio * (f.per_user * a.users) as f64,
                    "only {} fill messages of {} delivered",
                    f.delivered,
                    f.per_user * a.users
                );
            }
        }
    }
    Ok(())
}

/// The user numbers this process handles.
fn local_range(args: &ScenarioArgs) -> (u64, u64) {
    let k = args.worker_count.max(1);
    let i = args.worker_index.unwrap_or(0);
    let per = args.conn.users.div_ceil(k);
    let lo = args.conn.first_user + i * per;
    let hi = (lo + per).min(args.conn.first_user + args.conn.users);
    (lo, hi.max(lo))
}

pub(crate) fn progress_bar(args: &ScenarioArgs, len: u64) -> ProgressBar {
    if args.quiet || args.worker_index.is_some() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30.cyan/blue}] {pos}/{len} sessions {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    pb
}

/// Runs one process's share of the scenario.
async fn run_local(sc: Scenario, args: &ScenarioArgs, mut mode: Mode) -> anyhow::Result<RunResult> {
    let (lo, hi) = local_range(args);
    let target = target_of(args)?;
    let rates = if sc == Scenario::O2o {
        parse_rates(&args.rates)?
    } else {
        Vec::new()
    };
    let schedule = RateSchedule::new(&rates, args.step_secs, args.worker_count as usize);
    let shared = Arc::new(Shared::new(schedule));
    let mut result = skeleton(sc, args, args.worker_count as u32);

    // The server process (for memory and CPU), when this process can see it.
    let local_only = args.worker_index.is_none();
    let server_pid = if local_only {
        args.server_pid
            .or_else(|| procmem::pid_listening_on(args.conn.port).ok())
    } else {
        None
    };
    // Idle: the "before" reading, with no session of ours yet.
    let idle_pid = if sc == Scenario::Idle && local_only {
        let pid = match server_pid {
            Some(p) => p,
            None => procmem::pid_listening_on(args.conn.port)?,
        };
        Some((pid, procmem::mem_reading(pid)?))
    } else {
        None
    };
    let me = std::process::id();
    let cpu_before = (
        server_pid.and_then(procmem::cpu_secs),
        procmem::cpu_secs(me),
    );

    let pb = progress_bar(args, hi - lo);
    let reporter = spawn_reporter(args, shared.clone(), pb.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let presence = sc != Scenario::Connect || args.presence;
    let (sessions, tasks, connect) =
        connect_phase(args, &target, lo, hi, presence, &shared, &stop_rx).await;
    result.connect = connect;
    result.connect.server_cpu_s = delta(cpu_before.0, server_pid.and_then(procmem::cpu_secs));
    result.connect.client_cpu_s = delta(cpu_before.1, procmem::cpu_secs(me));

    match sc {
        Scenario::Connect => {
            hold(args.hold_secs).await;
        }
        Scenario::Idle => {
            if let Some((pid, before)) = idle_pid {
                pb.set_message(format!("settling {} s", args.settle_secs));
                hold(args.settle_secs).await;
                let after = procmem::mem_reading(pid)?;
                result.idle = Some(idle_result(
                    pid,
                    before,
                    after,
                    result.connect.established,
                    args.settle_secs,
                ));
                hold(args.hold_secs).await;
            } else {
                mode.ready_and_wait().await?;
            }
        }
        Scenario::O2o => {
            let start = match mode.ready_and_wait().await? {
                Some(s) => s,
                None => now_us() + 500_000,
            };
            result.o2o = Some(o2o_ramp(args, &shared, &sessions, start, &pb, server_pid).await);
            result.compute_cost(args.hourly_price);
        }
        Scenario::Archive
        | Scenario::Resume
        | Scenario::Muc
        | Scenario::MucLight
        | Scenario::Pep
        | Scenario::Upload => {
            anyhow::bail!("the {} scenario has its own runner", sc.name())
        }
    }

    pb.set_message("closing sessions");
    if args.conn.sm {
        result.sm = Some(shared.sm.result());
    }
    close(stop_tx, sessions, tasks).await;
    reporter.abort();
    pb.finish_and_clear();
    Ok(result)
}

/// Builds the idle section.
pub fn idle_result(
    pid: u32,
    before: procmem::MemReading,
    after: procmem::MemReading,
    sessions: u64,
    settle: f64,
) -> IdleResult {
    let per_session = |b: u64, a: u64| {
        if sessions > 0 {
            (a as f64 - b as f64) / sessions as f64
        } else {
            0.0
        }
    };
    let part = |b: Option<u64>, a: Option<u64>| Some(per_session(b?, a?));
    IdleResult {
        server_pid: pid,
        rss_before_kb: before.rss,
        rss_after_kb: after.rss,
        sessions,
        kb_per_session: per_session(before.rss, after.rss),
        anon_kb_per_session: part(before.anon, after.anon),
        file_kb_per_session: part(before.file, after.file),
        settle_secs: settle,
    }
}

fn delta(before: Option<f64>, after: Option<f64>) -> Option<f64> {
    Some(after? - before?)
}

pub(crate) async fn hold(secs: f64) {
    if secs > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    }
}

/// Progress: an indicatif bar locally; `P …` lines on stdout in a worker.
pub(crate) fn spawn_reporter(
    args: &ScenarioArgs,
    shared: Arc<Shared>,
    pb: ProgressBar,
) -> JoinHandle<()> {
    let worker = args.worker_index.is_some();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        let mut last = (0u64, 0u64, Instant::now());
        loop {
            tick.tick().await;
            let est = shared.established.load(Relaxed);
            let failed = shared.failed.load(Relaxed);
            let sent = shared.sent.load(Relaxed);
            let delivered = shared.delivered.load(Relaxed);
            if worker {
                println!("P {est} {failed} {sent} {delivered}");
                continue;
            }
            pb.set_position(est + failed);
            let dt = last.2.elapsed().as_secs_f64().max(1e-3);
            if sent > 0 {
                pb.set_message(format!(
                    "{failed} failed | sent {:.0}/s delivered {:.0}/s",
                    (sent - last.0) as f64 / dt,
                    delivered.saturating_sub(last.1) as f64 / dt
                ));
            } else {
                pb.set_message(format!("{failed} failed"));
            }
            last = (sent, delivered, Instant::now());
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser as _;

    fn args(extra: &[&str]) -> ScenarioArgs {
        let mut v = vec!["starling-bench", "o2o"];
        v.extend_from_slice(extra);
        match Cli::parse_from(v).command {
            Command::O2o(a) => a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn workers_split_users_without_overlap() {
        let mut seen = Vec::new();
        for i in 0..3 {
            let a = args(&[
                "--users",
                "10",
                "--first-user",
                "5",
                "--worker-index",
                &i.to_string(),
                "--worker-count",
                "3",
            ]);
            let (lo, hi) = local_range(&a);
            seen.extend(lo..hi);
        }
        assert_eq!(seen, (5..15).collect::<Vec<_>>());
    }
}
