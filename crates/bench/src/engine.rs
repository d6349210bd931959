//! The scenarios: connection storm, idle sessions, one-to-one chat ramp,
//! and the machinery the group chat scenarios ([`crate::rooms`]: `muc`,
//! `muc-light`) share with them.
//!
//! Every session is two small tasks: a reader (parses, records deliveries,
//! answers server pings) and a writer (drains a bounded outbox, coalescing
//! writes). The storm keeps at most `--concurrency` setups in flight. The
//! rate ramp ([`ramp`]) sends whatever its caller builds (a chat message to
//! a random user, a groupchat message to a room) at each step's rate and
//! attributes every delivered copy to the step its message was sent in.

use crate::cli::{ConnArgs, ScenarioArgs};
use crate::client::{self, Event, Inbound, Target, Transport, NS_SM, READ_CHUNK};
use crate::hist::Latency;
use crate::rate::{parse_rates, RateSchedule, SplitMix};
use crate::report::{
    ConnectResult, IdleResult, O2oResult, RunResult, SmResult, StepResult, TargetInfo,
};
use crate::rooms::RoomTracker;
use crate::{procmem, workers};
use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use starling_xml::Element;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

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

/// Per-step counters of the ramp.
#[derive(Default)]
struct StepCounters {
    sent: AtomicU64,
    /// Copies the messages sent should produce (= sent for o2o; sent ×
    /// occupants for a room).
    expected: AtomicU64,
    delivered: AtomicU64,
    /// Benchmark messages that *arrived* during this step, whenever sent.
    arrived: AtomicU64,
    errors: AtomicU64,
    dropped: AtomicU64,
    latency: Mutex<Latency>,
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
    start_us: AtomicU64,
    schedule: RateSchedule,
    steps: Vec<StepCounters>,
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
    fn step_of(&self, ts_us: u64) -> Option<usize> {
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
    fn on_message(&self, el: &Element) -> Option<(usize, u64, Option<u64>)> {
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

/// A live session: its user number and its outbox.
pub(crate) struct Session {
    pub(crate) user: u64,
    pub(crate) outbox: mpsc::Sender<Vec<u8>>,
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

/// Closes every session (`</stream:stream>`) and waits up to 5 s for the
/// readers and writers to finish.
pub(crate) async fn close(
    stop: watch::Sender<bool>,
    sessions: Vec<Session>,
    tasks: Vec<JoinHandle<()>>,
) {
    let _ = stop.send(true);
    drop(sessions);
    let close_deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    for t in tasks {
        let _ = tokio::time::timeout_at(close_deadline, t).await;
    }
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

/// The storm: establishes sessions for users `lo..hi` with bounded
/// concurrency; each established session gets its reader and writer tasks.
pub(crate) async fn connect_phase(
    args: &ScenarioArgs,
    target: &Arc<Target>,
    lo: u64,
    hi: u64,
    presence: bool,
    shared: &Arc<Shared>,
    stop: &watch::Receiver<bool>,
) -> (Vec<Session>, Vec<JoinHandle<()>>, ConnectResult) {
    let mut sessions = Vec::with_capacity((hi - lo) as usize);
    let mut tasks = Vec::with_capacity(2 * (hi - lo) as usize);
    let connect = storm(args, target, lo, hi, presence, shared, |n, conn| {
        let (tx, rx) = mpsc::channel(256);
        let (rd, wr) = tokio::io::split(conn.io);
        tasks.push(tokio::spawn(reader(
            n,
            rd,
            conn.inbound,
            tx.clone(),
            shared.clone(),
            stop.clone(),
            args.conn.sm,
        )));
        let every = if args.conn.sm {
            args.conn.sm_ack_every
        } else {
            0
        };
        tasks.push(tokio::spawn(writer(
            wr,
            rx,
            stop.clone(),
            every,
            shared.clone(),
        )));
        sessions.push(Session {
            user: n,
            outbox: tx,
        });
    })
    .await;
    (sessions, tasks, connect)
}

/// Establishes sessions for users `lo..hi` with at most `--concurrency`
/// setups in flight and hands each one to `on_up` as soon as it is bound
/// (so it can be served while the storm goes on). Counts successes and
/// failures in `shared` (for the progress bar) and returns the storm's
/// result.
pub(crate) async fn storm(
    args: &ScenarioArgs,
    target: &Arc<Target>,
    lo: u64,
    hi: u64,
    presence: bool,
    shared: &Shared,
    on_up: impl FnMut(u64, client::Conn),
) -> ConnectResult {
    let resource = args.resource.clone();
    let conn = args.conn.clone();
    let target = target.clone();
    storm_with(args, lo, hi, shared, on_up, move |n| {
        let target = target_for(&target, &conn, n);
        let user = conn.user(n);
        let password = conn.password_of(n);
        let resource = resource.clone();
        async move {
            client::establish(
                &target,
                target.source_for(n),
                &user,
                &password,
                &resource,
                presence,
            )
            .await
        }
    })
    .await
}

/// The target of user `n`: `target` itself, or with `--domains` a copy
/// whose domain (stream `to`, TLS SNI) is the user's.
pub(crate) fn target_for(target: &Arc<Target>, conn: &ConnArgs, n: u64) -> Arc<Target> {
    if conn.domains == 0 {
        return target.clone();
    }
    Arc::new(Target {
        domain: conn.domain_of(n).into_owned(),
        ..Target::clone(target)
    })
}

/// [`storm`] with any setup: `setup(n)` establishes user `n`'s session
/// (a login, a resumption…).
pub(crate) async fn storm_with<F, Fut>(
    args: &ScenarioArgs,
    lo: u64,
    hi: u64,
    shared: &Shared,
    mut on_up: impl FnMut(u64, client::Conn),
    setup: F,
) -> ConnectResult
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = Result<client::Conn, client::SetupError>> + Send + 'static,
{
    let started = now_ms();
    let mut set = JoinSet::new();
    let mut next = lo;
    let mut established = 0u64;
    let mut hist = Latency::new();
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    let mut first_error = None;
    let concurrency = args.conn.concurrency.max(1);
    loop {
        while set.len() < concurrency && next < hi {
            let n = next;
            next += 1;
            let fut = client::as_device(n, setup(n));
            set.spawn(async move {
                let t0 = Instant::now();
                let r = fut.await;
                (n, t0.elapsed(), r)
            });
        }
        let Some(joined) = set.join_next().await else {
            break;
        };
        match joined {
            Ok((n, took, Ok(conn))) => {
                hist.record_us(took.as_micros() as u64);
                shared.established.fetch_add(1, Relaxed);
                established += 1;
                on_up(n, conn);
            }
            Ok((_, _, Err(e))) => {
                shared.failed.fetch_add(1, Relaxed);
                *failures.entry(e.cause.name().to_owned()).or_default() += 1;
                if first_error.is_none() {
                    first_error = Some(e.to_string());
                }
            }
            Err(e) => {
                shared.failed.fetch_add(1, Relaxed);
                *failures.entry("panic".to_owned()).or_default() += 1;
                if first_error.is_none() {
                    first_error = Some(e.to_string());
                }
            }
        }
    }
    let mut c = ConnectResult {
        attempted: hi - lo,
        established,
        failed: (hi - lo) - established,
        failures,
        first_error,
        started_unix_ms: started,
        finished_unix_ms: now_ms(),
        setup_latency: hist.summary(),
        ..ConnectResult::default()
    };
    c.finalize();
    c
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

/// True for the elements XEP-0198 counts.
pub(crate) fn is_stanza(el: &Element) -> bool {
    el.ns() == "jabber:client" && matches!(el.name(), "message" | "presence" | "iq")
}

/// Reads and parses server traffic; records benchmark messages; answers
/// server-initiated iqs (pings) so the server keeps the session. With
/// `sm`, counts the stanzas received and answers `<r/>` with `<a h/>`.
async fn reader(
    user: u64,
    mut rd: ReadHalf<Transport>,
    mut inbound: Inbound,
    outbox: mpsc::Sender<Vec<u8>>,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    sm: bool,
) {
    let mut buf = [0u8; READ_CHUNK];
    let mut deadline: Option<tokio::time::Instant> = None;
    // Stanzas handled since <enable/> (XEP-0198 §4), and an <a/> owed.
    let mut h: u32 = 0;
    let mut ack_owed = false;
    loop {
        loop {
            match inbound.parse_pending() {
                Ok(Some(Event::Element(el))) => {
                    if sm {
                        if is_stanza(&el) {
                            h = h.wrapping_add(1);
                        } else if el.is("r", NS_SM) {
                            ack_owed = true;
                        } else if el.is("a", NS_SM) {
                            shared.sm.acks_received.fetch_add(1, Relaxed);
                        }
                    }
                    handle_element(user, &el, &outbox, &shared)
                }
                Ok(Some(Event::Header)) => {}
                Ok(Some(Event::Closed)) | Err(_) => return,
                Ok(None) => break,
            }
        }
        // A full outbox keeps the answer owed until the next read.
        if ack_owed
            && outbox
                .try_send(format!("<a xmlns='{NS_SM}' h='{h}'/>").into_bytes())
                .is_ok()
        {
            ack_owed = false;
            shared.sm.acks_sent.fetch_add(1, Relaxed);
        }
        let n = if let Some(d) = deadline {
            match tokio::time::timeout_at(d, rd.read(&mut buf)).await {
                Ok(Ok(n)) => n,
                _ => return,
            }
        } else {
            tokio::select! {
                r = rd.read(&mut buf) => match r { Ok(n) => n, Err(_) => return },
                _ = stop.changed() => {
                    // Keep reading briefly so the server's close is consumed.
                    deadline = Some(tokio::time::Instant::now() + Duration::from_secs(3));
                    continue;
                }
            }
        };
        if n == 0 {
            return;
        }
        inbound.feed(&buf[..n]);
    }
}

fn handle_element(user: u64, el: &Element, outbox: &mpsc::Sender<Vec<u8>>, shared: &Shared) {
    if let Some(m) = &shared.rooms {
        if m.on_element(user, el) {
            return;
        }
    }
    match el.name() {
        "message" => {
            if let Some((step, lat_us, seq)) = shared.on_message(el) {
                if let Some(m) = &shared.rooms {
                    m.copies().copy_arrived(seq, step, lat_us);
                }
            }
        }
        "iq" => {
            if let Some(reply) = iq_reply(el) {
                let _ = outbox.try_send(reply.into_bytes());
            }
        }
        _ => {}
    }
}

/// The answer to a server-initiated iq (`get`/`set`): a result for a ping
/// (so the server keeps the session), `service-unavailable` otherwise.
/// `None` for results and errors.
pub(crate) fn iq_reply(el: &Element) -> Option<String> {
    if el.name() != "iq" || !matches!(el.attr("type"), Some("get") | Some("set")) {
        return None;
    }
    let id = el.attr("id").unwrap_or("");
    let to = el
        .attr("from")
        .map(|f| format!(" to='{f}'"))
        .unwrap_or_default();
    let is_ping = el.children().any(|c| c.name() == "ping");
    Some(if is_ping {
        format!("<iq type='result' id='{id}'{to}/>")
    } else {
        format!(
            "<iq type='error' id='{id}'{to}><error type='cancel'>\
             <service-unavailable xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/></error></iq>"
        )
    })
}

/// Drains the outbox into the socket, coalescing queued stanzas into one
/// write; on stop, closes the stream. With `sm_ack_every` > 0 (`--sm`),
/// asks for an ack (`<r/>`) once that many stanzas were written since the
/// last request.
async fn writer(
    mut wr: WriteHalf<Transport>,
    mut rx: mpsc::Receiver<Vec<u8>>,
    mut stop: watch::Receiver<bool>,
    sm_ack_every: u32,
    shared: Arc<Shared>,
) {
    let sm_a = format!("<a xmlns='{NS_SM}'");
    let mut since_r = 0u32;
    loop {
        tokio::select! {
            m = rx.recv() => {
                let Some(mut buf) = m else { break };
                let mut stanzas = u32::from(!buf.starts_with(sm_a.as_bytes()));
                while buf.len() < 16 * 1024 {
                    match rx.try_recv() {
                        Ok(more) => {
                            stanzas += u32::from(!more.starts_with(sm_a.as_bytes()));
                            buf.extend_from_slice(&more);
                        }
                        Err(_) => break,
                    }
                }
                if sm_ack_every > 0 {
                    since_r += stanzas;
                    if since_r >= sm_ack_every {
                        since_r = 0;
                        buf.extend_from_slice(format!("<r xmlns='{NS_SM}'/>").as_bytes());
                        shared.sm.requests_sent.fetch_add(1, Relaxed);
                    }
                }
                if wr.write_all(&buf).await.is_err() || wr.flush().await.is_err() {
                    return;
                }
            }
            _ = stop.changed() => break,
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = wr.write_all(b"</stream:stream>").await;
        let _ = wr.flush().await;
        let _ = wr.shutdown().await;
    })
    .await;
}

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
async fn o2o_ramp(
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
