//! What the group chat scenarios share: `muc` (XEP-0045, [`crate::muc`])
//! and `muc-light` (MongooseIM's MUC Light, [`crate::muc_light`]).
//!
//! - [`RoomRun`]: the run around the rooms: option checks (one process),
//!   the login storm with initial presence ([`engine`]'s storm, readers and
//!   writers), CPU marks, the ramp of groupchat messages, closing and the
//!   output;
//! - [`members_by_room`]: user `first + i` is a member of room
//!   `i / room-size` (consecutive users together), logged-in sessions only;
//! - [`Copies`]: per message of the ramp, the copies still missing (one
//!   per member of its room, the sender's included); when the last one
//!   arrives, the latency of that slowest copy; error conditions from the
//!   service;
//! - [`Waiters`], [`bounded`], [`Backoff`], [`wait_quiet`]: the setup phases'
//!   plumbing (a task per join or creation waits for what the session's
//!   reader saw, at most N in flight, re-sends with backoff, waiting for
//!   broadcasts to end).
//!
//! A message's copies must all arrive at the process that counts them:
//! these scenarios run in one process (≤ `--max-per-process` sessions).

use crate::cli::{RoomArgs, ScenarioArgs};
use crate::engine::{self, now_us, Outgoing, Scenario, Session, Shared};
use crate::hist::Latency;
use crate::procmem;
use crate::rate::{parse_rates, RateSchedule, SplitMix};
use crate::report::{MucStepResult, RoomLayout, RoomRampResult, RunResult};
use indicatif::ProgressBar;
use starling_xml::Element;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

/// RFC 6120 stanza error conditions.
pub(crate) const NS_STANZAS: &str = "urn:ietf:params:xml:ns:xmpp-stanzas";

/// A failed step of a setup phase: cause (an error condition, `timeout`,
/// `closed`…) and detail.
pub(crate) type Failure = (String, String);

/// `WHO: CAUSE[: DETAIL]`, an example failure for the report.
pub(crate) fn describe(who: &str, (cause, detail): &Failure) -> String {
    if detail.is_empty() {
        format!("{who}: {cause}")
    } else {
        format!("{who}: {cause}: {detail}")
    }
}

/// The error condition of an error stanza and its text.
pub(crate) fn error_of(el: &Element) -> Failure {
    let Some(e) = el.children().find(|c| c.name() == "error") else {
        return ("undefined-condition".into(), el.to_string());
    };
    let cond = e
        .children()
        .find(|c| c.ns() == NS_STANZAS && c.name() != "text")
        .map(|c| c.name().to_owned())
        .unwrap_or_else(|| "undefined-condition".into());
    let text = e
        .get_child("text", NS_STANZAS)
        .map(|t| t.text())
        .unwrap_or_default();
    (cond, text)
}

/// The domain of a JID.
pub(crate) fn domain_of(jid: &str) -> &str {
    let bare = jid.split('/').next().unwrap_or(jid);
    bare.rsplit_once('@').map(|(_, d)| d).unwrap_or(bare)
}

fn closed() -> Failure {
    ("closed".to_owned(), "the session is gone".to_owned())
}

/// Queues `stanza` on a session's outbox; `closed` when the session is
/// gone.
pub(crate) async fn send(outbox: &mpsc::Sender<Vec<u8>>, stanza: &str) -> Result<(), Failure> {
    outbox
        .send(stanza.as_bytes().to_vec())
        .await
        .map_err(|_| closed())
}

/// The next event for a task waiting on `rx`: `timeout` at `deadline`
/// (detail: what it was `waiting` for, and for how long since `t0`),
/// `closed` when nobody can send any more.
pub(crate) async fn next_event<E>(
    rx: &mut mpsc::UnboundedReceiver<E>,
    deadline: tokio::time::Instant,
    t0: Instant,
    waiting: &str,
) -> Result<E, Failure> {
    match tokio::time::timeout_at(deadline, rx.recv()).await {
        Err(_) => Err((
            "timeout".to_owned(),
            format!("{waiting} after {:.1} s", t0.elapsed().as_secs_f64()),
        )),
        Ok(None) => Err(closed()),
        Ok(Some(ev)) => Ok(ev),
    }
}

/// What the session readers hand a group chat scenario first (see
/// `engine`'s reader).
pub(crate) trait RoomTracker: Send + Sync {
    /// Takes the scenario's own stanzas (not the groupchat copies with a
    /// body: [`engine`] times those and passes them to
    /// [`RoomTracker::copies`]). Returns whether the element was taken.
    fn on_element(&self, user: u64, el: &Element) -> bool;
    /// The per-message copy bookkeeping.
    fn copies(&self) -> &Copies;
}

/// A group chat scenario's bookkeeping, fed by the session readers: the
/// service, the setup tasks waiting for events of type `E`, a count of
/// the rooms' broadcasts during setup (occupant presences, affiliation
/// notifications), the copies. Each scenario implements [`RoomTracker`]
/// for its `RoomState<E>`.
pub(crate) struct RoomState<E> {
    /// The service's domain.
    pub(crate) service: String,
    /// Per user, the setup task waiting for its events.
    pub(crate) waiters: Waiters<E>,
    /// Setup broadcasts received.
    pub(crate) broadcasts: AtomicU64,
    /// The ramp's copies.
    pub(crate) copies: Copies,
}

impl<E> RoomState<E> {
    /// For users `lo..lo + users` and a ramp of `steps` steps.
    pub(crate) fn new(service: String, lo: u64, users: u64, steps: usize) -> RoomState<E> {
        RoomState {
            service,
            waiters: Waiters::new(lo, users),
            broadcasts: AtomicU64::new(0),
            copies: Copies::new(steps),
        }
    }

    /// Whether `el` comes from the service (or one of its rooms).
    pub(crate) fn sent_by_service(&self, el: &Element) -> bool {
        el.attr("from")
            .is_some_and(|f| domain_of(f).eq_ignore_ascii_case(&self.service))
    }
}

/// Per-user channels to the task that waits for what a user's session
/// reader sees of its room (users `lo..lo + n`).
pub(crate) struct Waiters<E> {
    lo: u64,
    slots: Vec<Mutex<Option<mpsc::UnboundedSender<E>>>>,
}

impl<E> Waiters<E> {
    /// For users `lo..lo + users`.
    pub(crate) fn new(lo: u64, users: u64) -> Waiters<E> {
        Waiters {
            lo,
            slots: (0..users).map(|_| Mutex::new(None)).collect(),
        }
    }

    fn slot(&self, user: u64) -> Option<&Mutex<Option<mpsc::UnboundedSender<E>>>> {
        self.slots
            .get(usize::try_from(user.checked_sub(self.lo)?).ok()?)
    }

    /// Whether `user` is one of ours.
    #[cfg(test)]
    pub(crate) fn knows(&self, user: u64) -> bool {
        self.slot(user).is_some()
    }

    /// Starts (`Some`) or ends (`None`) waiting for `user`'s events.
    pub(crate) fn set(&self, user: u64, tx: Option<mpsc::UnboundedSender<E>>) {
        if let Some(w) = self.slot(user) {
            *w.lock().unwrap_or_else(|e| e.into_inner()) = tx;
        }
    }

    /// Hands `ev` to whoever waits for `user` (dropped if nobody does).
    pub(crate) fn notify(&self, user: u64, ev: E) {
        if let Some(w) = self.slot(user) {
            if let Some(tx) = &*w.lock().unwrap_or_else(|e| e.into_inner()) {
                let _ = tx.send(ev);
            }
        }
    }
}

/// Re-sending after a refusal that may pass (a room still locked, a busy
/// service): waits 20 ms, doubling up to 500 ms, until the deadline.
pub(crate) struct Backoff {
    next: Duration,
    deadline: tokio::time::Instant,
    /// Waits so far.
    pub(crate) tries: u64,
}

impl Backoff {
    /// Until `deadline`.
    pub(crate) fn new(deadline: tokio::time::Instant) -> Backoff {
        Backoff {
            next: Duration::from_millis(20),
            deadline,
            tries: 0,
        }
    }

    /// Counts a try and sleeps before the re-send; false (without
    /// sleeping) when the re-send would come after the deadline.
    pub(crate) async fn wait(&mut self) -> bool {
        self.tries += 1;
        let wake = tokio::time::Instant::now() + self.next;
        if wake >= self.deadline {
            return false;
        }
        tokio::time::sleep_until(wake).await;
        self.next = (self.next * 2).min(Duration::from_millis(500));
        true
    }
}

/// Runs `task(item)` for the items of `queue`, at most `concurrency` at
/// once; `done` gets each result (`None`: the task panicked) and may queue
/// more items.
pub(crate) async fn bounded<I, O, Fut>(
    concurrency: usize,
    mut queue: VecDeque<I>,
    task: impl Fn(I) -> Fut,
    mut done: impl FnMut(Option<O>, &mut VecDeque<I>),
) where
    Fut: Future<Output = O> + Send + 'static,
    O: Send + 'static,
{
    let mut set = JoinSet::new();
    loop {
        while set.len() < concurrency.max(1) {
            let Some(item) = queue.pop_front() else {
                break;
            };
            set.spawn(task(item));
        }
        let Some(r) = set.join_next().await else {
            break;
        };
        done(r.ok(), &mut queue);
    }
}

/// Waits until `counter` stayed still for `quiet` or reached `enough` (at
/// most `max`): the broadcasts of a setup phase are over.
pub(crate) async fn wait_quiet(
    counter: &AtomicU64,
    enough: Option<u64>,
    quiet: Duration,
    max: Duration,
) {
    let end = Instant::now() + max;
    let step = quiet / 5;
    let mut last = counter.load(Relaxed);
    let mut still = Duration::ZERO;
    while still < quiet && Instant::now() < end && enough.is_none_or(|n| last < n) {
        tokio::time::sleep(step).await;
        let now = counter.load(Relaxed);
        if now == last {
            still += step;
        } else {
            still = Duration::ZERO;
            last = now;
        }
    }
}

/// The rooms: for each, the indices in `sessions` of its members (user
/// `first + i` is in room `i / room_size`), logged-in sessions only, in
/// user order.
pub(crate) fn members_by_room(
    sessions: &[Session],
    first: u64,
    users: u64,
    room_size: u64,
) -> Vec<Vec<usize>> {
    let mut members = vec![Vec::new(); users.div_ceil(room_size) as usize];
    let mut order: Vec<usize> = (0..sessions.len()).collect();
    order.sort_by_key(|&i| sessions[i].user);
    for i in order {
        let r = ((sessions[i].user - first) / room_size) as usize;
        if let Some(m) = members.get_mut(r) {
            m.push(i);
        }
    }
    members
}

/// The senders of the ramp, (session index, room): the `per_room`
/// first members of each room (0: all of them).
pub(crate) fn senders(rooms: &[Vec<usize>], per_room: u64) -> Vec<(usize, usize)> {
    rooms
        .iter()
        .enumerate()
        .flat_map(|(r, m)| {
            let n = if per_room == 0 {
                m.len()
            } else {
                (per_room as usize).min(m.len())
            };
            m[..n].iter().map(move |&i| (i, r))
        })
        .collect()
}

/// The report's layout section.
fn layout(a: &RoomArgs, service: &str, rooms: usize, senders: usize) -> RoomLayout {
    RoomLayout {
        service: service.to_owned(),
        room_prefix: a.room_prefix.clone(),
        room_size: a.room_size,
        rooms: rooms as u64,
        senders_per_room: a.senders_per_room,
        senders: senders as u64,
    }
}

/// A message whose copies are still arriving.
struct Pending {
    remaining: u64,
    max_us: u64,
    step: usize,
}

/// Per ramp step: messages every member got, and their last copy.
#[derive(Default)]
struct StepExtra {
    complete: AtomicU64,
    last: Mutex<Latency>,
}

const SHARDS: usize = 64;

/// The copies of the ramp's messages (see the module doc).
pub(crate) struct Copies {
    pending: Vec<Mutex<HashMap<u64, Pending>>>,
    steps: Vec<StepExtra>,
    unexpected: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
}

impl Copies {
    /// For a ramp of `steps` steps.
    pub(crate) fn new(steps: usize) -> Copies {
        Copies {
            pending: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            steps: (0..steps).map(|_| StepExtra::default()).collect(),
            unexpected: AtomicU64::new(0),
            errors: Mutex::new(BTreeMap::new()),
        }
    }

    fn shard(&self, seq: u64) -> &Mutex<HashMap<u64, Pending>> {
        &self.pending[(seq % SHARDS as u64) as usize]
    }

    /// Message `seq`, sent in ramp step `step`, should produce `copies`.
    pub(crate) fn expect(&self, seq: u64, copies: u64, step: usize) {
        self.shard(seq)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                seq,
                Pending {
                    remaining: copies,
                    max_us: 0,
                    step,
                },
            );
    }

    /// Message `seq` was not sent after all.
    pub(crate) fn forget(&self, seq: u64) {
        self.shard(seq)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&seq);
    }

    /// A copy of message `seq` (sent in `step`) arrived after `lat_us`.
    pub(crate) fn copy_arrived(&self, seq: Option<u64>, step: usize, lat_us: u64) {
        let Some(seq) = seq else {
            self.unexpected.fetch_add(1, Relaxed);
            return;
        };
        let done = {
            let mut map = self.shard(seq).lock().unwrap_or_else(|e| e.into_inner());
            match map.get_mut(&seq) {
                None => {
                    self.unexpected.fetch_add(1, Relaxed);
                    return;
                }
                Some(p) => {
                    p.max_us = p.max_us.max(lat_us);
                    p.remaining = p.remaining.saturating_sub(1);
                    if p.remaining == 0 {
                        map.remove(&seq)
                    } else {
                        None
                    }
                }
            }
        };
        if let Some(p) = done {
            let k = if p.step < self.steps.len() {
                p.step
            } else {
                step
            };
            if let Some(x) = self.steps.get(k) {
                x.complete.fetch_add(1, Relaxed);
                if let Ok(mut h) = x.last.lock() {
                    h.record_us(p.max_us);
                }
            }
        }
    }

    /// Counts the condition of an error stanza from the service.
    pub(crate) fn note_error(&self, el: &Element) {
        let (cond, _) = error_of(el);
        *self
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(cond)
            .or_default() += 1;
    }

    /// The ramp's steps with the copies' figures.
    fn step_results(&self, out: engine::RampOut) -> Vec<MucStepResult> {
        out.steps
            .into_iter()
            .zip(out.expected)
            .enumerate()
            .map(|(k, (s, expected))| {
                let x = &self.steps[k];
                MucStepResult {
                    target_rate: s.target_rate,
                    sent: s.sent,
                    expected_copies: expected,
                    delivered_copies: s.delivered,
                    arrived_copies: s.arrived,
                    errors: s.errors,
                    client_dropped: s.client_dropped,
                    latency: s.latency,
                    messages_complete: x.complete.load(Relaxed),
                    last_copy_latency: x.last.lock().map(|h| h.summary()).unwrap_or_default(),
                    server_cpu_pct: s.server_cpu_pct,
                    client_cpu_pct: s.client_cpu_pct,
                    ..MucStepResult::default()
                }
            })
            .collect()
    }
}

/// CPU seconds used so far by the server (when its PID is known) and by
/// this process.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CpuMark(Option<f64>, Option<f64>);

impl CpuMark {
    /// (server, load generator) CPU seconds since `earlier`.
    pub(crate) fn since(self, earlier: CpuMark) -> (Option<f64>, Option<f64>) {
        let d = |a: Option<f64>, b: Option<f64>| Some(b? - a?);
        (d(earlier.0, self.0), d(earlier.1, self.1))
    }
}

/// One group chat run (see the module doc).
pub(crate) struct RoomRun {
    /// The options.
    pub(crate) sc: ScenarioArgs,
    /// The result so far; the scenario adds its section.
    pub(crate) result: RunResult,
    /// The server process, when known (`--server-pid`, or whoever listens
    /// on `--port`).
    pub(crate) server_pid: Option<u32>,
    /// Progress output.
    pub(crate) pb: ProgressBar,
    /// The logged-in sessions (after [`RoomRun::login`]).
    pub(crate) sessions: Vec<Session>,
    shared: Arc<Shared>,
    ramp_steps: usize,
    reporter: JoinHandle<()>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl RoomRun {
    /// Checks the options and sets up a run of `scenario` at `service`
    /// with rooms of `a.room_size`, the ramp of `--rates` (none with
    /// `no_ramp`) and the scenario's tracker (the readers hand it every
    /// element first), returned too.
    pub(crate) fn start<E>(
        scenario: Scenario,
        sc: &ScenarioArgs,
        a: &RoomArgs,
        service: &str,
        no_ramp: bool,
    ) -> anyhow::Result<(RoomRun, Arc<RoomState<E>>)>
    where
        RoomState<E>: RoomTracker + 'static,
    {
        let users = sc.conn.users;
        anyhow::ensure!(users > 0, "--users must be at least 1");
        anyhow::ensure!(a.room_size > 0, "--room-size must be at least 1");
        anyhow::ensure!(
            users <= sc.sessions_per_process() && sc.worker_index.is_none(),
            "{} runs in one process (a message's copies must all reach the process that counts them): \
             at most {} sessions (--max-per-process)",
            scenario.name(),
            sc.sessions_per_process()
        );
        let rates = if no_ramp {
            Vec::new()
        } else {
            parse_rates(&sc.rates)?
        };
        let tracker = Arc::new(RoomState::new(
            service.to_owned(),
            sc.conn.first_user,
            users,
            rates.len(),
        ));
        let schedule = RateSchedule::new(&rates, sc.step_secs, 1);
        let shared = Arc::new(Shared::new(schedule).with_rooms(tracker.clone()));
        let pb = engine::progress_bar(sc, users);
        let run = RoomRun {
            sc: sc.clone(),
            result: engine::skeleton(scenario, sc, 1),
            server_pid: sc
                .server_pid
                .or_else(|| procmem::pid_listening_on(sc.conn.port).ok()),
            reporter: engine::spawn_reporter(sc, shared.clone(), pb.clone()),
            pb,
            sessions: Vec::new(),
            shared,
            ramp_steps: rates.len(),
            stop: watch::channel(false).0,
            tasks: Vec::new(),
        };
        Ok((run, tracker))
    }

    /// The rooms of the logged-in sessions ([`members_by_room`]).
    pub(crate) fn members(&self, a: &RoomArgs) -> Vec<Vec<usize>> {
        let c = &self.sc.conn;
        members_by_room(&self.sessions, c.first_user, c.users, a.room_size)
    }

    /// CPU used so far.
    pub(crate) fn cpu(&self) -> CpuMark {
        CpuMark(
            self.server_pid.and_then(procmem::cpu_secs),
            procmem::cpu_secs(std::process::id()),
        )
    }

    /// The login storm, with initial presence (groupchat messages to a
    /// bare JID reach available resources); returns the CPU mark at its
    /// end.
    pub(crate) async fn login(&mut self) -> anyhow::Result<CpuMark> {
        let sc = &self.sc;
        let target = engine::target_of(sc)?;
        let (lo, hi) = (sc.conn.first_user, sc.conn.first_user + sc.conn.users);
        let c0 = self.cpu();
        let (sessions, tasks, connect) = engine::connect_phase(
            sc,
            &target,
            lo,
            hi,
            true,
            &self.shared,
            &self.stop.subscribe(),
        )
        .await;
        let c1 = self.cpu();
        self.sessions = sessions;
        self.tasks = tasks;
        self.result.connect = connect;
        (
            self.result.connect.server_cpu_s,
            self.result.connect.client_cpu_s,
        ) = c1.since(c0);
        Ok(c1)
    }

    /// The ramp of [`engine::ramp`]: random senders (the
    /// `--senders-per-room` first members of each room in `rooms`) send
    /// `<message type='groupchat' to='ROOM'><body>SEND-TIME-µs NUMBER
    /// PAD</body></message>` to their room (`jids`); every member of the
    /// room should get a copy. Nothing is sent without rates or senders.
    /// Returns the report's layout and ramp sections.
    pub(crate) async fn ramp(
        &self,
        a: &RoomArgs,
        service: &str,
        copies: &Copies,
        rooms: &[Vec<usize>],
        jids: &[String],
        what: &str,
    ) -> (RoomLayout, RoomRampResult) {
        let senders = &senders(rooms, a.senders_per_room)[..];
        let sc = &self.sc;
        let mut out = RoomRampResult {
            step_secs: sc.step_secs,
            p99_bound_ms: sc.p99_bound_ms,
            min_delivery_ratio: sc.min_ratio,
            drain_secs: sc.drain_secs,
            ..RoomRampResult::default()
        };
        if self.ramp_steps > 0 && !senders.is_empty() {
            let pad = "x".repeat(sc.body_bytes);
            let sessions = &self.sessions[..];
            let next = |rng: &mut SplitMix, seq: u64, ts: u64, step: usize| {
                let (i, r) = senders[rng.below(senders.len() as u64) as usize];
                let n = rooms[r].len() as u64;
                copies.expect(seq, n, step);
                Some(Outgoing {
                    outbox: &sessions[i].outbox,
                    stanza: format!(
                        "<message to='{}' type='groupchat' id='m{seq}'><body>{ts} {seq} {pad}</body></message>",
                        jids[r]
                    ),
                    copies: n,
                })
            };
            let r = engine::ramp(
                sc,
                &self.shared,
                now_us() + 500_000,
                &self.pb,
                self.server_pid,
                what,
                next,
                |seq| copies.forget(seq),
            )
            .await;
            out.steps = copies.step_results(r);
            out.unexpected_copies = copies.unexpected.load(Relaxed);
        }
        out.errors_by_condition = copies
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        out.finalize();
        (layout(a, service, rooms.len(), senders.len()), out)
    }

    /// Closes every session and returns the result.
    pub(crate) async fn close(self) -> RunResult {
        let mut result = self.result;
        self.pb.set_message("closing sessions");
        if self.sc.conn.sm {
            result.sm = Some(self.shared.sm.result());
        }
        engine::close(self.stop, self.sessions, self.tasks).await;
        self.reporter.abort();
        self.pb.finish_and_clear();
        result
    }

    /// Closes every session and prints the result.
    pub(crate) async fn finish(self) -> anyhow::Result<()> {
        let sc = self.sc.clone();
        let result = self.close().await;
        engine::output(&result, &sc)
    }
}

/// Test helpers of the group chat scenarios.
#[cfg(test)]
pub(crate) mod test_util {
    use crate::cli::{Cli, Command};
    use clap::Parser as _;
    use starling_xml::Element;

    /// Parses test XML.
    pub(crate) fn parse(xml: &str) -> Element {
        xml.parse().expect("test XML")
    }

    /// The command of `starling-bench ARGS…`.
    pub(crate) fn command(args: &[&str]) -> Command {
        Cli::parse_from(std::iter::once("starling-bench").chain(args.iter().copied())).command
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(user: u64) -> Session {
        Session {
            user,
            outbox: mpsc::channel(1).0,
        }
    }

    #[test]
    fn rooms_take_consecutive_logged_in_users_and_senders_the_first() {
        // Users 10..=21 in rooms of 5; 12 and 16 failed to log in; the
        // sessions came up in any order.
        let sessions: Vec<Session> = [21, 10, 11, 13, 14, 15, 17, 18, 19, 20]
            .into_iter()
            .map(session)
            .collect();
        let rooms = members_by_room(&sessions, 10, 12, 5);
        let users: Vec<Vec<u64>> = rooms
            .iter()
            .map(|m| m.iter().map(|&i| sessions[i].user).collect())
            .collect();
        assert_eq!(
            users,
            vec![vec![10, 11, 13, 14], vec![15, 17, 18, 19], vec![20, 21]]
        );
        let two = senders(&rooms, 2);
        assert_eq!(two.len(), 6);
        assert_eq!(sessions[two[2].0].user, 15);
        assert_eq!(two[2].1, 1);
        assert_eq!(senders(&rooms, 0).len(), 10, "0: every member");
        assert_eq!(senders(&rooms, 9).len(), 10);
    }

    #[test]
    fn last_copy_is_recorded_when_every_copy_arrived() {
        let t = Copies::new(2);
        t.expect(1, 3, 0);
        t.expect(2, 2, 1);
        t.expect(3, 5, 1);
        t.copy_arrived(Some(1), 0, 1_000);
        t.copy_arrived(Some(1), 0, 9_000);
        assert_eq!(t.steps[0].complete.load(Relaxed), 0);
        t.copy_arrived(Some(1), 0, 4_000);
        assert_eq!(t.steps[0].complete.load(Relaxed), 1);
        let last = t.steps[0].last.lock().unwrap().summary();
        assert_eq!(last.count, 1);
        assert!((last.max_ms - 9.0).abs() < 0.01, "the slowest copy");
        t.copy_arrived(Some(2), 1, 500);
        t.copy_arrived(Some(2), 1, 700);
        t.copy_arrived(Some(2), 1, 800); // one too many
        t.copy_arrived(None, 1, 800);
        t.forget(3);
        t.copy_arrived(Some(3), 1, 800);
        assert_eq!(t.steps[1].complete.load(Relaxed), 1);
        assert_eq!(t.unexpected.load(Relaxed), 3);
    }

    #[test]
    fn error_conditions_are_counted_and_parsed() {
        let t = Copies::new(0);
        let err = |cond: &str| -> Element {
            format!(
                "<message xmlns='jabber:client' type='error' from='r@muclight.x'>\
                 <error type='wait'><{cond} xmlns='{NS_STANZAS}'/>\
                 <text xmlns='{NS_STANZAS}'>busy</text></error></message>"
            )
            .parse()
            .unwrap()
        };
        t.note_error(&err("resource-constraint"));
        t.note_error(&err("resource-constraint"));
        t.note_error(&err("not-allowed"));
        let e = t.errors.lock().unwrap().clone();
        assert_eq!(e["resource-constraint"], 2);
        assert_eq!(e["not-allowed"], 1);
        assert_eq!(
            error_of(&err("not-allowed")),
            ("not-allowed".into(), "busy".into())
        );
        assert_eq!(domain_of("r@muclight.x/u@x"), "muclight.x");
        assert_eq!(domain_of("muclight.x"), "muclight.x");
    }

    #[tokio::test]
    async fn backoff_stops_before_the_deadline() {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
        let mut b = Backoff::new(deadline);
        let mut waited = 0;
        while b.wait().await {
            waited += 1;
        }
        assert!(waited >= 1, "20 ms fit in 300");
        assert_eq!(b.tries, waited + 1, "the last try did not wait");
        assert!(tokio::time::Instant::now() < deadline);
    }

    #[tokio::test]
    async fn bounded_runs_queued_follow_ups_and_counts_panics() {
        let mut seen = Vec::new();
        let mut panics = 0;
        bounded(
            2,
            VecDeque::from([1u32, 2, 3]),
            |i| async move {
                assert_ne!(i, 3, "a task that panics");
                i
            },
            |r, q| match r {
                Some(i) => {
                    seen.push(i);
                    if i == 1 {
                        q.push_back(10);
                    }
                }
                None => panics += 1,
            },
        )
        .await;
        seen.sort();
        assert_eq!(seen, vec![1, 2, 10]);
        assert_eq!(panics, 1);
    }
}
