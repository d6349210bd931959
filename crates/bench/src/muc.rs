//! The `muc` scenario: multi-user chat (XEP-0045) against any server.
//!
//! Phases, all over the same sessions (the storm, readers and writers of
//! [`engine`]):
//! 1. login storm with initial presence;
//! 2. join storm: users are split into rooms of `--room-size` consecutive
//!    users; each sends `<presence to='room/nick'>` with `<x
//!    xmlns='http://jabber.org/protocol/muc'><history
//!    maxstanzas='0'/></x>` and has entered when its own presence (status
//!    110) and then the subject (§7.2.15, the end of the entering
//!    sequence) arrived. The first member of each room goes first: its
//!    self-presence carries 201 when it created the room, which then stays
//!    locked (§10.1.1) until it submits the owner form (an instant room,
//!    §10.1.2, with `muc#roomconfig_maxusers` when the room is larger
//!    than the usual default of 200); the room's other members are let
//!    in once that is done. A server that does not lock new rooms sends
//!    no 201 and nothing is configured; a join refused with
//!    `item-not-found` (a room still locked) is re-sent until
//!    `--join-timeout-secs`;
//! 3. the ramp of [`engine::ramp`]: random senders send groupchat messages
//!    to their room, the send time and the message number in the body;
//!    every occupant (the sender too: the reflection) gets a copy. Each
//!    copy is timed; per message the tracker counts the copies still
//!    missing and, when the last one arrives, records the latency of that
//!    slowest copy.
//!
//! One process (≤ `--max-per-process` sessions): a message's copies must
//! all arrive at the process that counts them.

use crate::cli::MucArgs;
use crate::engine::{self, now_us, Outgoing, Session, Shared};
use crate::hist::Latency;
use crate::procmem;
use crate::rate::{parse_rates, RateSchedule, SplitMix};
use crate::report::{JoinResult, MucResult, MucStepResult};
use starling_xml::Element;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

/// XEP-0045 namespaces.
pub const NS_MUC: &str = "http://jabber.org/protocol/muc";
/// `muc#user`.
pub const NS_MUC_USER: &str = "http://jabber.org/protocol/muc#user";
/// `muc#owner`.
pub const NS_MUC_OWNER: &str = "http://jabber.org/protocol/muc#owner";
const NS_STANZAS: &str = "urn:ietf:params:xml:ns:xmpp-stanzas";
/// Rooms up to this size are created as plain instant rooms; larger ones
/// ask for `muc#roomconfig_maxusers` (Starling's and ejabberd's default
/// occupant limit is 200).
pub const USUAL_MAX_USERS: u64 = 200;
/// Prefix of the owner form's iq id.
const CFG_ID: &str = "muccfg";

/// What a session's reader saw of its room while entering.
#[derive(Debug, Clone, PartialEq)]
enum JoinEvent {
    /// Own presence (status 110); `created`: status 201.
    SelfPresence { created: bool },
    /// The subject message (end of the entering sequence).
    Subject,
    /// The owner form's result (`Err`: the error condition).
    Configured(Result<(), String>),
    /// The room refused the presence: condition, detail.
    Refused(String, String),
}

/// A message whose copies are still arriving.
struct Pending {
    remaining: u64,
    max_us: u64,
    step: usize,
}

/// Per ramp step: messages every occupant got, and their last copy.
#[derive(Default)]
struct StepExtra {
    complete: AtomicU64,
    last: Mutex<Latency>,
}

const SHARDS: usize = 64;

/// The scenario's shared bookkeeping, fed by the session readers
/// ([`engine`] hands it every element first).
pub struct Tracker {
    service: String,
    lo: u64,
    waiters: Vec<Mutex<Option<mpsc::UnboundedSender<JoinEvent>>>>,
    presences: AtomicU64,
    pending: Vec<Mutex<HashMap<u64, Pending>>>,
    steps: Vec<StepExtra>,
    unexpected: AtomicU64,
}

/// The error condition of an error stanza and its text.
fn error_of(el: &Element) -> (String, String) {
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
fn domain_of(jid: &str) -> &str {
    let bare = jid.split('/').next().unwrap_or(jid);
    bare.rsplit_once('@').map(|(_, d)| d).unwrap_or(bare)
}

impl Tracker {
    /// For users `lo..lo + users` and a ramp of `steps` steps.
    pub fn new(service: String, lo: u64, users: u64, steps: usize) -> Tracker {
        Tracker {
            service,
            lo,
            waiters: (0..users).map(|_| Mutex::new(None)).collect(),
            presences: AtomicU64::new(0),
            pending: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            steps: (0..steps).map(|_| StepExtra::default()).collect(),
            unexpected: AtomicU64::new(0),
        }
    }

    fn waiter(&self, user: u64) -> Option<&Mutex<Option<mpsc::UnboundedSender<JoinEvent>>>> {
        self.waiters
            .get(usize::try_from(user.checked_sub(self.lo)?).ok()?)
    }

    fn set_waiter(&self, user: u64, tx: Option<mpsc::UnboundedSender<JoinEvent>>) {
        if let Some(w) = self.waiter(user) {
            *w.lock().unwrap_or_else(|e| e.into_inner()) = tx;
        }
    }

    fn notify(&self, user: u64, ev: JoinEvent) {
        if let Some(w) = self.waiter(user) {
            if let Some(tx) = &*w.lock().unwrap_or_else(|e| e.into_inner()) {
                let _ = tx.send(ev);
            }
        }
    }

    /// Takes the room's stanzas that are not groupchat messages with a
    /// body (those are counted by [`engine`]): presences, the subject,
    /// the owner form's result. Returns whether the element was taken.
    pub(crate) fn on_element(&self, user: u64, el: &Element) -> bool {
        let Some(from) = el.attr("from") else {
            return false;
        };
        if !domain_of(from).eq_ignore_ascii_case(&self.service) {
            return false;
        }
        match el.name() {
            "presence" => {
                if el.attr("type") == Some("error") {
                    let (cond, text) = error_of(el);
                    self.notify(user, JoinEvent::Refused(cond, text));
                } else if let Some(x) = el.get_child("x", NS_MUC_USER) {
                    let has = |code: &str| {
                        x.children()
                            .any(|c| c.name() == "status" && c.attr("code") == Some(code))
                    };
                    if has("110") {
                        self.notify(
                            user,
                            JoinEvent::SelfPresence {
                                created: has("201"),
                            },
                        );
                    } else {
                        self.presences.fetch_add(1, Relaxed);
                    }
                } else {
                    self.presences.fetch_add(1, Relaxed);
                }
                true
            }
            "message" => {
                if el.children().any(|c| c.name() == "body") {
                    return false;
                }
                if el.attr("type") != Some("error") && el.children().any(|c| c.name() == "subject")
                {
                    self.notify(user, JoinEvent::Subject);
                }
                true
            }
            "iq" if el.attr("id").is_some_and(|i| i.starts_with(CFG_ID)) => {
                let r = match el.attr("type") {
                    Some("result") => Ok(()),
                    _ => {
                        let (cond, text) = error_of(el);
                        Err(if text.is_empty() {
                            cond
                        } else {
                            format!("{cond}: {text}")
                        })
                    }
                };
                self.notify(user, JoinEvent::Configured(r));
                true
            }
            _ => false,
        }
    }

    fn shard(&self, seq: u64) -> &Mutex<HashMap<u64, Pending>> {
        &self.pending[(seq % SHARDS as u64) as usize]
    }

    /// Message `seq`, sent in ramp step `step`, should produce `copies`.
    fn expect(&self, seq: u64, copies: u64, step: usize) {
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
    fn forget(&self, seq: u64) {
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
}

/// The stanzas of one join.
struct JoinPlan {
    user: u64,
    outbox: mpsc::Sender<Vec<u8>>,
    presence: String,
    /// The owner form, preferred (with `muc#roomconfig_maxusers` for large
    /// rooms) and the plain instant room to fall back to.
    forms: Vec<String>,
    deadline: tokio::time::Instant,
}

/// How a join ended.
#[derive(Debug)]
struct JoinOutcome {
    /// `Err((cause, detail))`.
    result: Result<(), (String, String)>,
    latency_us: u64,
    created: bool,
    configured: bool,
    retries: u64,
}

/// The owner forms for a room of `size`: the first is preferred.
fn owner_forms(room: &str, user: u64, size: u64) -> Vec<String> {
    let iq = |x: &str, k: u32| {
        format!(
            "<iq type='set' to='{room}' id='{CFG_ID}{user}-{k}'><query xmlns='{NS_MUC_OWNER}'>{x}</query></iq>"
        )
    };
    let instant = iq("<x xmlns='jabber:x:data' type='submit'/>", 0);
    if size <= USUAL_MAX_USERS {
        return vec![instant];
    }
    let sized = iq(
        &format!(
            "<x xmlns='jabber:x:data' type='submit'>\
             <field var='FORM_TYPE' type='hidden'><value>http://jabber.org/protocol/muc#roomconfig</value></field>\
             <field var='muc#roomconfig_maxusers'><value>{size}</value></field></x>"
        ),
        1,
    );
    vec![sized, instant]
}

/// The entering presence.
fn join_presence(room: &str, nick: &str, history: u32) -> String {
    format!(
        "<presence to='{room}/{nick}'><x xmlns='{NS_MUC}'><history maxstanzas='{history}'/></x></presence>"
    )
}

/// Enters one room (see the module doc).
async fn join_one(tracker: Arc<Tracker>, plan: JoinPlan) -> JoinOutcome {
    let (tx, mut rx) = mpsc::unbounded_channel();
    tracker.set_waiter(plan.user, Some(tx));
    let t0 = Instant::now();
    let mut out = JoinOutcome {
        result: Ok(()),
        latency_us: 0,
        created: false,
        configured: false,
        retries: 0,
    };
    let fail = |cause: &str, detail: String| Err((cause.to_owned(), detail));
    let send = |s: String| {
        let outbox = plan.outbox.clone();
        async move { outbox.send(s.into_bytes()).await.is_ok() }
    };
    let mut self_seen = false;
    let mut form = 0usize;
    let mut backoff = Duration::from_millis(20);
    out.result = if !send(plan.presence.clone()).await {
        fail("closed", "the session is gone".into())
    } else {
        loop {
            let ev = match tokio::time::timeout_at(plan.deadline, rx.recv()).await {
                Err(_) => {
                    let at = match (self_seen, out.created) {
                        (false, _) => "no own presence",
                        (true, true) => "no answer to the owner form",
                        (true, false) => "no subject",
                    };
                    break fail(
                        "timeout",
                        format!("{at} after {:.1} s", t0.elapsed().as_secs_f64()),
                    );
                }
                Ok(None) => break fail("closed", "the session is gone".into()),
                Ok(Some(ev)) => ev,
            };
            match ev {
                JoinEvent::SelfPresence { created } => {
                    self_seen = true;
                    if created && !out.created {
                        out.created = true;
                        if !send(plan.forms[0].clone()).await {
                            break fail("closed", "the session is gone".into());
                        }
                    }
                }
                JoinEvent::Subject => {
                    if self_seen && (!out.created || out.configured) {
                        break Ok(());
                    }
                }
                JoinEvent::Configured(Ok(())) => {
                    out.configured = true;
                    if self_seen {
                        break Ok(());
                    }
                }
                JoinEvent::Configured(Err(e)) => {
                    form += 1;
                    match plan.forms.get(form) {
                        Some(f) => {
                            if !send(f.clone()).await {
                                break fail("closed", "the session is gone".into());
                            }
                        }
                        None => break fail("config", format!("owner form refused: {e}")),
                    }
                }
                JoinEvent::Refused(cond, text) => {
                    if cond == "item-not-found" && !self_seen {
                        out.retries += 1;
                        let wake = tokio::time::Instant::now() + backoff;
                        if wake >= plan.deadline {
                            break fail(
                                "item-not-found",
                                format!(
                                    "room still locked or missing after {} tries: {text}",
                                    out.retries
                                ),
                            );
                        }
                        tokio::time::sleep_until(wake).await;
                        backoff = (backoff * 2).min(Duration::from_millis(500));
                        if !send(plan.presence.clone()).await {
                            break fail("closed", "the session is gone".into());
                        }
                    } else {
                        break fail(&cond, text);
                    }
                }
            }
        }
    };
    out.latency_us = t0.elapsed().as_micros() as u64;
    tracker.set_waiter(plan.user, None);
    out
}

/// The rooms: for each, the session indices of its joined members (in
/// user order).
type Rooms = Vec<Vec<usize>>;

/// Room `r`'s JID.
fn room_jid(a: &MucArgs, r: usize) -> String {
    format!("{}{}@{}", a.room_prefix, r + 1, a.service())
}

/// The join storm: leaders first, each room's others once its leader is
/// done, at most `--join-concurrency` joins in flight.
async fn join_phase(
    a: &MucArgs,
    tracker: &Arc<Tracker>,
    sessions: &[Session],
    pb: &indicatif::ProgressBar,
) -> (JoinResult, Rooms) {
    let sc = &a.scenario;
    let first = sc.conn.first_user;
    let nrooms = sc.conn.users.div_ceil(a.room_size) as usize;
    // Members per room, established sessions only, in user order.
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); nrooms];
    let mut order: Vec<usize> = (0..sessions.len()).collect();
    order.sort_by_key(|&i| sessions[i].user);
    for i in order {
        let r = ((sessions[i].user - first) / a.room_size) as usize;
        members[r].push(i);
    }
    let concurrency = a.join_concurrency.unwrap_or(sc.conn.concurrency).max(1);
    let timeout = Duration::from_secs_f64(a.join_timeout_secs);
    let plan = |i: usize, r: usize| {
        let s = &sessions[i];
        let room = room_jid(a, r);
        JoinPlan {
            user: s.user,
            outbox: s.outbox.clone(),
            presence: join_presence(&room, &sc.conn.user(s.user), a.history),
            forms: owner_forms(&room, s.user, a.room_size),
            deadline: tokio::time::Instant::now() + timeout,
        }
    };
    let mut queue: VecDeque<(usize, usize, bool)> = members
        .iter()
        .enumerate()
        .filter_map(|(r, m)| m.first().map(|&i| (i, r, true)))
        .collect();
    let started = now_us() / 1000;
    let mut set = JoinSet::new();
    let mut hist = Latency::new();
    let mut res = JoinResult {
        attempted: sessions.len() as u64,
        started_unix_ms: started,
        ..JoinResult::default()
    };
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    let mut joined: Rooms = vec![Vec::new(); nrooms];
    loop {
        while set.len() < concurrency {
            let Some((i, r, leader)) = queue.pop_front() else {
                break;
            };
            let p = plan(i, r);
            let t = tracker.clone();
            set.spawn(async move { (i, r, leader, join_one(t, p).await) });
        }
        let Some(j) = set.join_next().await else {
            break;
        };
        let Ok((i, r, leader, o)) = j else {
            *failures.entry("panic".into()).or_default() += 1;
            continue;
        };
        if leader {
            queue.extend(members[r].iter().skip(1).map(|&m| (m, r, false)));
        }
        res.retries += o.retries;
        res.created += u64::from(o.created);
        res.configured += u64::from(o.configured);
        match o.result {
            Ok(()) => {
                res.joined += 1;
                hist.record_us(o.latency_us);
                joined[r].push(i);
            }
            Err((cause, detail)) => {
                *failures.entry(cause.clone()).or_default() += 1;
                if res.first_error.is_none() {
                    res.first_error = Some(format!(
                        "{} in {}: {cause}: {detail}",
                        sc.conn.user(sessions[i].user),
                        room_jid(a, r)
                    ));
                }
            }
        }
        pb.set_message(format!("{} joined", res.joined));
    }
    res.finished_unix_ms = now_us() / 1000;
    res.failed = res.attempted - res.joined;
    res.failures = failures;
    res.latency = hist.summary();
    res.finalize();
    for m in &mut joined {
        m.sort_by_key(|&i| sessions[i].user);
    }
    (res, joined)
}

/// Waits until no occupant presence arrived for `quiet` (at most `max`).
async fn quiet_presences(tracker: &Tracker, quiet: Duration, max: Duration) {
    let end = Instant::now() + max;
    let step = quiet / 5;
    let mut last = tracker.presences.load(Relaxed);
    let mut still = Duration::ZERO;
    while still < quiet && Instant::now() < end {
        tokio::time::sleep(step).await;
        let now = tracker.presences.load(Relaxed);
        if now == last {
            still += step;
        } else {
            still = Duration::ZERO;
            last = now;
        }
    }
}

/// Runs the scenario.
pub async fn run(a: MucArgs) -> anyhow::Result<()> {
    let sc = a.scenario.clone();
    let users = sc.conn.users;
    anyhow::ensure!(users > 0, "--users must be at least 1");
    anyhow::ensure!(a.room_size > 0, "--room-size must be at least 1");
    anyhow::ensure!(
        users <= sc.sessions_per_process() && sc.worker_index.is_none(),
        "muc runs in one process (a message's copies must all reach the process that counts them): \
         at most {} sessions (--max-per-process)",
        sc.sessions_per_process()
    );
    let service = a.service();
    let rates = if a.join_only {
        Vec::new()
    } else {
        parse_rates(&sc.rates)?
    };
    let schedule = RateSchedule::new(&rates, sc.step_secs, 1);
    let (lo, hi) = (sc.conn.first_user, sc.conn.first_user + users);
    let tracker = Arc::new(Tracker::new(service.clone(), lo, users, rates.len()));
    let shared = Arc::new(Shared::new(schedule).with_muc(tracker.clone()));
    let target = engine::target_of(&sc)?;
    let mut result = engine::skeleton(engine::Scenario::Muc, &sc, 1);
    let server_pid = sc
        .server_pid
        .or_else(|| procmem::pid_listening_on(sc.conn.port).ok());
    let me = std::process::id();
    let cpu = || {
        (
            server_pid.and_then(procmem::cpu_secs),
            procmem::cpu_secs(me),
        )
    };
    let delta = |a: Option<f64>, b: Option<f64>| Some(b? - a?);

    let pb = engine::progress_bar(&sc, users);
    let reporter = engine::spawn_reporter(&sc, shared.clone(), pb.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let c0 = cpu();
    let (sessions, tasks, connect) =
        engine::connect_phase(&sc, &target, lo, hi, true, &shared, &stop_rx).await;
    let c1 = cpu();
    result.connect = connect;
    result.connect.server_cpu_s = delta(c0.0, c1.0);
    result.connect.client_cpu_s = delta(c0.1, c1.1);

    // The join storm.
    if !sc.quiet {
        pb.println(format!(
            "muc: {} sessions entering {} room(s) of {} at {service}",
            sessions.len(),
            users.div_ceil(a.room_size),
            a.room_size
        ));
    }
    let presences0 = tracker.presences.load(Relaxed);
    let (mut join, rooms) = join_phase(&a, &tracker, &sessions, &pb).await;
    let c2 = cpu();
    join.server_cpu_s = delta(c1.0, c2.0);
    join.client_cpu_s = delta(c1.1, c2.1);
    // The last joins' presence broadcasts may still be on their way (a
    // room of 1,000 sends half a million): wait until none arrived for
    // 500 ms (at most 30 s) so the ramp does not start on a backlog.
    pb.set_message("waiting for the presence broadcasts to end");
    quiet_presences(
        &tracker,
        Duration::from_millis(500),
        Duration::from_secs(30),
    )
    .await;
    join.presences_received = tracker.presences.load(Relaxed) - presences0;

    // The ramp.
    let senders: Vec<(usize, usize)> = rooms
        .iter()
        .enumerate()
        .flat_map(|(r, m)| {
            let n = if a.senders_per_room == 0 {
                m.len()
            } else {
                (a.senders_per_room as usize).min(m.len())
            };
            m[..n].iter().map(move |&i| (i, r))
        })
        .collect();
    let mut muc = MucResult {
        service: service.clone(),
        room_prefix: a.room_prefix.clone(),
        room_size: a.room_size,
        rooms: rooms.len() as u64,
        senders_per_room: a.senders_per_room,
        senders: senders.len() as u64,
        history: a.history,
        join,
        step_secs: sc.step_secs,
        p99_bound_ms: sc.p99_bound_ms,
        min_delivery_ratio: sc.min_ratio,
        drain_secs: sc.drain_secs,
        ..MucResult::default()
    };
    if !rates.is_empty() && !senders.is_empty() {
        let jids: Vec<String> = (0..rooms.len()).map(|r| room_jid(&a, r)).collect();
        let pad = "x".repeat(sc.body_bytes);
        let t = tracker.clone();
        let (sessions_ref, senders_ref, rooms_ref) = (&sessions[..], &senders[..], &rooms[..]);
        let next = move |rng: &mut SplitMix, seq: u64, ts: u64, step: usize| {
            let (i, r) = senders_ref[rng.below(senders_ref.len() as u64) as usize];
            let copies = rooms_ref[r].len() as u64;
            t.expect(seq, copies, step);
            Some(Outgoing {
                outbox: &sessions_ref[i].outbox,
                stanza: format!(
                    "<message to='{}' type='groupchat' id='m{seq}'><body>{ts} {seq} {pad}</body></message>",
                    jids[r]
                ),
                copies,
            })
        };
        let t = tracker.clone();
        let out = engine::ramp(
            &sc,
            &shared,
            now_us() + 500_000,
            &pb,
            server_pid,
            "muc",
            next,
            move |seq| t.forget(seq),
        )
        .await;
        muc.steps = out
            .steps
            .into_iter()
            .zip(out.expected)
            .enumerate()
            .map(|(k, (s, expected))| {
                let x = &tracker.steps[k];
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
            .collect();
        muc.unexpected_copies = tracker.unexpected.load(Relaxed);
    }
    muc.finalize();
    result.muc = Some(muc);

    pb.set_message("closing sessions");
    if sc.conn.sm {
        result.sm = Some(shared.sm.result());
    }
    engine::close(stop_tx, sessions, tasks).await;
    reporter.abort();
    pb.finish_and_clear();
    engine::output(&result, &sc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser as _;

    fn parse(xml: &str) -> Element {
        xml.parse().expect("test XML")
    }

    fn args(extra: &[&str]) -> MucArgs {
        let mut v = vec!["starling-bench", "muc"];
        v.extend_from_slice(extra);
        match Cli::parse_from(v).command {
            Command::Muc(a) => a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn options_and_room_names() {
        let a = args(&["--domain", "example.org"]);
        assert_eq!(a.room_size, 5);
        assert_eq!(a.service(), "conference.example.org");
        assert_eq!(room_jid(&a, 0), "bench1@conference.example.org");
        let a = args(&[
            "--service",
            "rooms.x",
            "--room-prefix",
            "r",
            "--room-size",
            "1000",
            "--senders-per-room",
            "2",
        ]);
        assert_eq!(room_jid(&a, 9), "r10@rooms.x");
        assert_eq!(a.senders_per_room, 2);
    }

    #[test]
    fn owner_form_asks_for_room_size_only_for_large_rooms() {
        let f = owner_forms("r1@c.x", 7, 5);
        assert_eq!(f.len(), 1);
        let q = parse(&f[0]);
        assert_eq!(q.attr("id"), Some("muccfg7-0"));
        let x = q
            .get_child("query", NS_MUC_OWNER)
            .and_then(|q| q.get_child("x", "jabber:x:data"))
            .unwrap();
        assert_eq!(x.attr("type"), Some("submit"));
        assert_eq!(x.children().count(), 0, "an instant room: empty form");
        let f = owner_forms("r1@c.x", 7, 1000);
        assert_eq!(f.len(), 2, "sized form, then the instant room");
        assert!(f[0].contains("<field var='muc#roomconfig_maxusers'><value>1000</value>"));
        assert!(parse(&f[0]).attr("id").unwrap().starts_with(CFG_ID));
        let p = parse(&join_presence("r1@c.x", "user1", 0));
        assert_eq!(p.attr("to"), Some("r1@c.x/user1"));
        let h = p
            .get_child("x", NS_MUC)
            .and_then(|x| x.get_child("history", NS_MUC));
        assert_eq!(h.and_then(|h| h.attr("maxstanzas")), Some("0"));
    }

    #[test]
    fn reader_events_are_classified() {
        let t = Tracker::new("conference.localhost".into(), 10, 3, 1);
        let (tx, mut rx) = mpsc::unbounded_channel();
        t.set_waiter(11, Some(tx));
        let own = parse(
            "<presence xmlns='jabber:client' from='r1@conference.localhost/user11'>\
             <x xmlns='http://jabber.org/protocol/muc#user'><item affiliation='owner' role='moderator'/>\
             <status code='110'/><status code='201'/></x></presence>",
        );
        let other = parse(
            "<presence xmlns='jabber:client' from='r1@conference.localhost/user12'>\
             <x xmlns='http://jabber.org/protocol/muc#user'><item affiliation='none' role='participant'/></x></presence>",
        );
        let subject = parse(
            "<message xmlns='jabber:client' type='groupchat' from='r1@conference.localhost'><subject/></message>",
        );
        let locked = parse(
            "<presence xmlns='jabber:client' type='error' from='r1@conference.localhost/user11'>\
             <x xmlns='http://jabber.org/protocol/muc'/><error type='cancel'>\
             <item-not-found xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/>\
             <text xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'>locked</text></error></presence>",
        );
        let cfg = parse(
            "<iq xmlns='jabber:client' type='result' id='muccfg11-0' from='r1@conference.localhost'/>",
        );
        let chat = parse(
            "<message xmlns='jabber:client' type='groupchat' from='r1@conference.localhost/user12'><body>1 2</body></message>",
        );
        let elsewhere = parse("<presence xmlns='jabber:client' from='user12@localhost/bench'/>");
        for el in [&own, &other, &subject, &locked, &cfg] {
            assert!(t.on_element(11, el), "{el}");
        }
        assert!(!t.on_element(11, &chat), "bodies are counted by the engine");
        assert!(!t.on_element(11, &elsewhere));
        assert!(!t.on_element(99, &subject) || t.waiter(99).is_none());
        let mut got = Vec::new();
        while let Ok(e) = rx.try_recv() {
            got.push(e);
        }
        assert_eq!(
            got,
            vec![
                JoinEvent::SelfPresence { created: true },
                JoinEvent::Subject,
                JoinEvent::Refused("item-not-found".into(), "locked".into()),
                JoinEvent::Configured(Ok(())),
            ]
        );
        assert_eq!(t.presences.load(Relaxed), 1);
    }

    #[test]
    fn last_copy_is_recorded_when_every_copy_arrived() {
        let t = Tracker::new("c".into(), 1, 1, 2);
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

    #[tokio::test]
    async fn creator_configures_and_others_retry_while_locked() {
        let t = Arc::new(Tracker::new("conference.localhost".into(), 1, 2, 0));
        let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(16);
        let plan = JoinPlan {
            user: 1,
            outbox: out_tx,
            presence: join_presence("r1@conference.localhost", "user1", 0),
            forms: owner_forms("r1@conference.localhost", 1, 500),
            deadline: tokio::time::Instant::now() + Duration::from_secs(5),
        };
        let j = tokio::spawn(join_one(t.clone(), plan));
        let from = "from='r1@conference.localhost/user1'";
        let feed = |xml: String| {
            let el = parse(&xml);
            assert!(t.on_element(1, &el));
        };
        // Locked at first (someone else's room): re-sent.
        let sent = String::from_utf8(out_rx.recv().await.unwrap()).unwrap();
        assert!(sent.starts_with("<presence"));
        feed(format!(
            "<presence xmlns='jabber:client' type='error' {from}><error type='cancel'>\
             <item-not-found xmlns='{NS_STANZAS}'/></error></presence>"
        ));
        let again = String::from_utf8(out_rx.recv().await.unwrap()).unwrap();
        assert_eq!(again, sent);
        // Now created by us: the sized form, refused, then the instant one.
        feed(format!(
            "<presence xmlns='jabber:client' {from}><x xmlns='{NS_MUC_USER}'>\
             <status code='110'/><status code='201'/></x></presence>"
        ));
        let form = String::from_utf8(out_rx.recv().await.unwrap()).unwrap();
        assert!(form.contains("maxusers"));
        feed(
            "<message xmlns='jabber:client' type='groupchat' from='r1@conference.localhost'><subject/></message>"
                .into(),
        );
        feed(format!(
            "<iq xmlns='jabber:client' type='error' id='muccfg1-1' from='r1@conference.localhost'>\
             <error type='modify'><not-acceptable xmlns='{NS_STANZAS}'/></error></iq>"
        ));
        let form = String::from_utf8(out_rx.recv().await.unwrap()).unwrap();
        assert!(form.contains("id='muccfg1-0'") && !form.contains("maxusers"));
        feed(
            "<iq xmlns='jabber:client' type='result' id='muccfg1-0' from='r1@conference.localhost'/>"
                .into(),
        );
        let o = j.await.unwrap();
        assert!(o.result.is_ok(), "{:?}", o.result);
        assert!(o.created && o.configured);
        assert_eq!(o.retries, 1);
    }

    #[tokio::test]
    async fn refusals_other_than_locked_fail_with_their_condition() {
        let t = Arc::new(Tracker::new("conference.localhost".into(), 1, 1, 0));
        let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(16);
        let plan = JoinPlan {
            user: 1,
            outbox: out_tx,
            presence: join_presence("r1@conference.localhost", "user1", 0),
            forms: owner_forms("r1@conference.localhost", 1, 5),
            deadline: tokio::time::Instant::now() + Duration::from_secs(5),
        };
        let j = tokio::spawn(join_one(t.clone(), plan));
        out_rx.recv().await.unwrap();
        let el = parse(&format!(
            "<presence xmlns='jabber:client' type='error' from='r1@conference.localhost/user1'>\
             <error type='wait'><service-unavailable xmlns='{NS_STANZAS}'/>\
             <text xmlns='{NS_STANZAS}'>this room is full</text></error></presence>"
        ));
        t.on_element(1, &el);
        let o = j.await.unwrap();
        assert_eq!(
            o.result,
            Err(("service-unavailable".into(), "this room is full".into()))
        );
    }
}
