//! The `muc-light` scenario: MUC Light (MongooseIM's `urn:xmpp:muclight:0`,
//! group chat without presence: rooms have members, not occupants)
//! against a server that offers it at `muclight.<domain>` (`--service`).
//!
//! Phases, over the same sessions (the run around the rooms is
//! [`RoomRun`], shared with `muc`):
//! 1. the login storm, with initial presence: a room sends its copies to
//!    each member's bare JID, which reaches available resources only;
//! 2. room creation: users are split into rooms of `--room-size`
//!    consecutive users; the first logged-in user of each room sends
//!    `<iq type='set' to='ROOM'><query
//!    xmlns='urn:xmpp:muclight:0#create'><configuration><roomname>PREFIX
//!    K</roomname></configuration><occupants><user
//!    affiliation='member'>MEMBER</user>…</occupants></query></iq>` with
//!    the room's other logged-in users (never itself: the creator becomes
//!    owner); the room exists once the iq's result arrived (rooms/s,
//!    latency iq → result). Every member, the creator included, gets an
//!    affiliation notification (a groupchat message from the room's bare
//!    JID with an empty body): counted, never a copy. A
//!    `resource-constraint` answer is re-sent with backoff until
//!    `--create-timeout-secs`; any other error fails the room. Room nodes
//!    carry a run id (`{prefix}-{run-id}-{k}`), so a rerun does not meet
//!    the last run's rooms (`conflict`). When no room at all could be
//!    created the run stops and says so: the server has no MUC Light
//!    there (ejabberd and Prosody do not implement it);
//! 3. the ramp of [`RoomRun::ramp`]: random senders send groupchat
//!    messages to their room's bare JID; the room sends a copy to every
//!    member's bare JID (the sender's too), from `ROOM/SENDER-BARE-JID`;
//!    each copy is timed and per message the slowest one. Error messages
//!    from the service count by condition (`not-allowed`: not a member;
//!    `resource-constraint`: a busy room) and, when they carry the body,
//!    against their step.
//!
//! With the server's PID known (`--server-pid`, or whoever listens on
//! `--port`), its VmRSS before the logins, after them and after the rooms
//! (each after `--settle-secs`): KiB per session and per room.

use crate::cli::MucLightArgs;
use crate::engine::{self, now_us, Scenario};
use crate::hist::Latency;
use crate::procmem;
use crate::rate::SplitMix;
use crate::report::{CreationResult, MucLightResult, RoomMemory};
use crate::rooms::{
    self, bounded, error_of, next_event, send, wait_quiet, Backoff, Copies, Failure, RoomRun,
    RoomState, RoomTracker,
};
use starling_xml::Element;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// MUC Light's namespace.
pub const NS_MUCLIGHT: &str = "urn:xmpp:muclight:0";
/// Room creation.
pub const NS_CREATE: &str = "urn:xmpp:muclight:0#create";
/// What the report calls the protocol.
pub const PROTOCOL: &str = "MUC Light (urn:xmpp:muclight:0)";
/// Prefix of the creation iq's id.
const CREATE_ID: &str = "mlcreate";

/// The answer to a creation iq.
type Created = Result<(), Failure>;

/// The scenario's shared bookkeeping (`broadcasts`: affiliation and
/// configuration notifications).
pub(crate) type Tracker = RoomState<Created>;

/// What a stanza from the service is to the scenario.
#[derive(Debug, PartialEq)]
enum FromService {
    /// The answer to a creation iq.
    Created(Created),
    /// An affiliation or configuration notification: a message from the
    /// room with an empty body (or none).
    Notification,
    /// An error message; `body`: it carries the message's body (the
    /// engine counts it against its step).
    Error { body: bool },
    /// A copy of a groupchat message (the engine times it).
    Copy,
    /// Anything else.
    Other,
}

/// See [`FromService`].
fn classify(el: &Element) -> FromService {
    let body = el.children().find(|c| c.name() == "body").map(|b| b.text());
    match (el.name(), el.attr("type")) {
        ("iq", Some("result")) if is_create_id(el) => FromService::Created(Ok(())),
        ("iq", Some("error")) if is_create_id(el) => FromService::Created(Err(error_of(el))),
        ("message", Some("error")) => FromService::Error {
            body: body.is_some(),
        },
        ("message", _) if body.is_none_or(|b| b.trim().is_empty()) => FromService::Notification,
        ("message", _) => FromService::Copy,
        _ => FromService::Other,
    }
}

fn is_create_id(el: &Element) -> bool {
    el.attr("id").is_some_and(|i| i.starts_with(CREATE_ID))
}

impl RoomTracker for Tracker {
    /// Takes the creation iqs' answers (whoever they come from: the ids
    /// are ours), the notifications and the error messages without a
    /// body (their condition is counted); leaves the copies to the engine.
    fn on_element(&self, user: u64, el: &Element) -> bool {
        let ours = el.name() == "iq" && is_create_id(el);
        if !ours && !self.sent_by_service(el) {
            return false;
        }
        match classify(el) {
            FromService::Created(r) => {
                self.waiters.notify(user, r);
                true
            }
            FromService::Notification => {
                self.broadcasts.fetch_add(1, Relaxed);
                true
            }
            FromService::Error { body } => {
                self.copies.note_error(el);
                !body
            }
            FromService::Copy => false,
            // No presence in MUC Light; other iqs get the engine's answer.
            FromService::Other => el.name() == "presence",
        }
    }

    fn copies(&self) -> &Copies {
        &self.copies
    }
}

/// The bare JID of room `r` (0-based): `{prefix}-{run_id}-{r + 1}`, or
/// `{prefix}{r + 1}` without a run id.
fn room_jid(prefix: &str, run_id: &str, service: &str, r: usize) -> String {
    let k = r + 1;
    if run_id.is_empty() {
        format!("{prefix}{k}@{service}")
    } else {
        format!("{prefix}-{run_id}-{k}@{service}")
    }
}

/// A run id: 8 random hex digits.
fn new_run_id() -> String {
    let seed = now_us() ^ (u64::from(std::process::id()) << 40);
    format!("{:08x}", SplitMix::new(seed).next_u64() >> 32)
}

/// The creation iq of `room` by `user`, with `members` (bare JIDs, the
/// creator not among them).
fn create_iq(room: &str, user: u64, name: &str, members: &[String]) -> String {
    let occupants = if members.is_empty() {
        String::new()
    } else {
        let users: String = members
            .iter()
            .map(|m| format!("<user affiliation='member'>{m}</user>"))
            .collect();
        format!("<occupants>{users}</occupants>")
    };
    format!(
        "<iq type='set' id='{CREATE_ID}{user}' to='{room}'><query xmlns='{NS_CREATE}'>\
         <configuration><roomname>{name}</roomname></configuration>{occupants}</query></iq>"
    )
}

/// ejabberd or Prosody when `--label` names one (as `bench/compare.sh`
/// labels them: `ejabberd 23.01…`, `Prosody 0.12…`): servers without MUC
/// Light.
fn peer_without_muc_light(label: &str) -> Option<&'static str> {
    match label
        .split_whitespace()
        .next()?
        .to_ascii_lowercase()
        .as_str()
    {
        "ejabberd" => Some("ejabberd"),
        "prosody" => Some("Prosody"),
        _ => None,
    }
}

/// One room's creation.
struct CreatePlan {
    user: u64,
    outbox: mpsc::Sender<Vec<u8>>,
    stanza: String,
    deadline: tokio::time::Instant,
}

/// How a creation ended.
#[derive(Debug)]
struct CreateOutcome {
    result: Created,
    latency_us: u64,
    retries: u64,
}

/// Creates one room: sends the iq and waits for its answer, again after
/// `resource-constraint` (with backoff) until the deadline.
async fn create_one(tracker: Arc<Tracker>, plan: CreatePlan) -> CreateOutcome {
    let (tx, mut rx) = mpsc::unbounded_channel();
    tracker.waiters.set(plan.user, Some(tx));
    let t0 = Instant::now();
    let mut backoff = Backoff::new(plan.deadline);
    let result = loop {
        if let Err(e) = send(&plan.outbox, &plan.stanza).await {
            break Err(e);
        }
        match next_event(&mut rx, plan.deadline, t0, "no answer to the creation").await {
            Ok(Err((cond, text))) if cond == "resource-constraint" => {
                if !backoff.wait().await {
                    let tries = backoff.tries;
                    break Err((cond, format!("still busy after {tries} tries: {text}")));
                }
            }
            Ok(answer) => break answer,
            Err(e) => break Err(e),
        }
    };
    tracker.waiters.set(plan.user, None);
    CreateOutcome {
        result,
        latency_us: t0.elapsed().as_micros() as u64,
        retries: backoff.tries,
    }
}

/// The creation phase: every room with a logged-in member, at most
/// `--create-concurrency` in flight. Returns the result and, per room,
/// the session indices of its members (empty when it was not created).
async fn create_phase(
    a: &MucLightArgs,
    room: &dyn Fn(usize) -> String,
    tracker: &Arc<Tracker>,
    run: &RoomRun,
) -> (CreationResult, Vec<Vec<usize>>) {
    let sc = &a.scenario;
    let sessions = &run.sessions[..];
    let members = run.members(&a.rooms);
    let timeout = Duration::from_secs_f64(a.create_timeout_secs);
    let bare = |i: usize| format!("{}@{}", sc.conn.user(sessions[i].user), sc.conn.domain);
    let plan = |r: usize| {
        let creator = &sessions[members[r][0]];
        let others: Vec<String> = members[r][1..].iter().map(|&i| bare(i)).collect();
        let name = format!("{} {}", a.rooms.room_prefix, r + 1);
        CreatePlan {
            user: creator.user,
            outbox: creator.outbox.clone(),
            stanza: create_iq(&room(r), creator.user, &name, &others),
            deadline: tokio::time::Instant::now() + timeout,
        }
    };
    let queue: VecDeque<usize> = (0..members.len())
        .filter(|&r| !members[r].is_empty())
        .collect();
    let mut res = CreationResult {
        attempted: queue.len() as u64,
        ..CreationResult::default()
    };
    res.phase.started_unix_ms = now_us() / 1000;
    let mut hist = Latency::new();
    let mut created = vec![Vec::new(); members.len()];
    bounded(
        a.create_concurrency.unwrap_or(sc.conn.concurrency),
        queue,
        |r| {
            let (p, t) = (plan(r), tracker.clone());
            async move { (r, create_one(t, p).await) }
        },
        |done, _| {
            let Some((r, o)) = done else {
                res.phase
                    .fail("panic", || "a creation task panicked".into());
                return;
            };
            res.retries += o.retries;
            if let Err(e) = o.result {
                let who = format!("{} creating {}", bare(members[r][0]), room(r));
                res.phase.fail(&e.0, || rooms::describe(&who, &e));
                return;
            }
            res.created += 1;
            res.members += members[r].len() as u64;
            hist.record_us(o.latency_us);
            created[r].clone_from(&members[r]);
            run.pb.set_message(format!("{} rooms created", res.created));
        },
    )
    .await;
    res.phase.finished_unix_ms = now_us() / 1000;
    res.failed = res.attempted - res.created;
    res.notifications_expected = res.members;
    res.phase.latency = hist.summary();
    res.finalize();
    (res, created)
}

/// The memory section from the readings (KiB).
fn memory(
    pid: u32,
    before: u64,
    sessions_kb: u64,
    rooms_kb: u64,
    c: &CreationResult,
    logged_in: u64,
) -> RoomMemory {
    let per = |from: u64, to: u64, n: u64| (to as f64 - from as f64) / n.max(1) as f64;
    RoomMemory {
        server_pid: pid,
        rss_before_kb: before,
        rss_sessions_kb: sessions_kb,
        rss_rooms_kb: rooms_kb,
        kb_per_session: per(before, sessions_kb, logged_in),
        kb_per_room: per(sessions_kb, rooms_kb, c.created),
    }
}

/// The server's VmRSS after `--settle-secs`, when there was a first
/// reading (`before`: PID, KiB).
async fn rss_after_settle(run: &RoomRun, before: Option<(u32, u64)>) -> Option<u64> {
    let (pid, _) = before?;
    run.pb
        .set_message(format!("settling {} s", run.sc.settle_secs));
    engine::hold(run.sc.settle_secs).await;
    procmem::rss_kb(pid).ok()
}

/// Runs the scenario.
pub async fn run(a: MucLightArgs) -> anyhow::Result<()> {
    let sc = &a.scenario;
    if let Some(peer) = peer_without_muc_light(&sc.label) {
        anyhow::bail!(
            "scenario `muc-light` is not supported by {peer} (--label {:?}): MUC Light \
             (urn:xmpp:muclight:0) is MongooseIM's protocol, which ejabberd and Prosody do not \
             implement; measure their group chat with `muc` (XEP-0045) instead",
            sc.label
        );
    }
    let service = a.service();
    let (mut run, tracker): (_, Arc<Tracker>) =
        RoomRun::start(Scenario::MucLight, sc, &a.rooms, &service, a.create_only)?;
    let run_id = a.run_id.clone().unwrap_or_else(new_run_id);
    let room = |r: usize| room_jid(&a.rooms.room_prefix, &run_id, &service, r);
    let before = run
        .server_pid
        .and_then(|pid| Some((pid, procmem::rss_kb(pid).ok()?)));
    let c1 = run.login().await?;
    let sessions_kb = rss_after_settle(&run, before).await;

    // The rooms.
    if !sc.quiet {
        run.pb.println(format!(
            "muc-light: {} sessions, {} room(s) of {} to create at {service} (run id {run_id:?})",
            run.sessions.len(),
            sc.conn.users.div_ceil(a.rooms.room_size),
            a.rooms.room_size
        ));
    }
    let notified0 = tracker.broadcasts.load(Relaxed);
    let (mut creation, rooms) = create_phase(&a, &room, &tracker, &run).await;
    (creation.phase.server_cpu_s, creation.phase.client_cpu_s) = run.cpu().since(c1);
    run.pb
        .set_message("waiting for the affiliation notifications");
    wait_quiet(
        &tracker.broadcasts,
        Some(notified0 + creation.notifications_expected),
        Duration::from_millis(500),
        Duration::from_secs(30),
    )
    .await;
    creation.notifications_received = tracker.broadcasts.load(Relaxed) - notified0;
    if creation.created == 0 && creation.attempted > 0 {
        run.close().await;
        anyhow::bail!(
            "no MUC Light room could be created at {service} ({}): this server does not seem to \
             offer MUC Light (urn:xmpp:muclight:0) there (see --service; ejabberd and Prosody do \
             not implement MUC Light: use `muc` for them)",
            creation.phase.first_error.as_deref().unwrap_or("no answer")
        );
    }
    let rooms_kb = rss_after_settle(&run, before).await;
    let memory = match (before, sessions_kb, rooms_kb) {
        (Some((pid, b)), Some(s), Some(r)) => Some(memory(
            pid,
            b,
            s,
            r,
            &creation,
            run.result.connect.established,
        )),
        _ => None,
    };

    // The ramp.
    let jids: Vec<String> = (0..rooms.len()).map(room).collect();
    let (layout, ramp) = run
        .ramp(
            &a.rooms,
            &service,
            &tracker.copies,
            &rooms,
            &jids,
            "muc-light",
        )
        .await;
    run.result.muc_light = Some(MucLightResult {
        protocol: PROTOCOL.into(),
        layout,
        run_id,
        creation,
        memory,
        ramp,
    });
    run.finish().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Command;
    use crate::rooms::test_util::{command, parse};
    use crate::rooms::NS_STANZAS;

    fn args(extra: &[&str]) -> MucLightArgs {
        match command(&[&["muc-light"], extra].concat()) {
            Command::MucLight(a) => a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn options_and_room_names() {
        let a = args(&["--domain", "example.org"]);
        assert_eq!(a.rooms.room_size, 5);
        assert_eq!(a.service(), "muclight.example.org");
        assert_eq!(a.run_id, None);
        assert!(!a.create_only);
        assert_eq!(a.create_timeout_secs, 30.0);
        let a = args(&[
            "--service",
            "ml.x",
            "--room-prefix",
            "r",
            "--room-size",
            "50",
            "--run-id",
            "abc",
            "--create-only",
            "--create-concurrency",
            "7",
        ]);
        assert_eq!(a.service(), "ml.x");
        assert_eq!(a.rooms.room_size, 50);
        assert_eq!(a.create_concurrency, Some(7));
        assert!(a.create_only);
        assert_eq!(
            room_jid(&a.rooms.room_prefix, "abc", "ml.x", 9),
            "r-abc-10@ml.x"
        );
        assert_eq!(room_jid("bench", "", "ml.x", 0), "bench1@ml.x");
        let (x, y) = (new_run_id(), new_run_id());
        assert_eq!(x.len(), 8);
        assert!(x.chars().all(|c| c.is_ascii_hexdigit()), "{x}");
        assert_ne!(x, y, "a new id per run");
    }

    #[test]
    fn creation_lists_the_members_but_not_the_creator() {
        let iq = parse(&create_iq(
            "bench-1-1@muclight.localhost",
            1,
            "bench 1",
            &["user2@localhost".into(), "user3@localhost".into()],
        ));
        assert_eq!(iq.attr("type"), Some("set"));
        assert_eq!(iq.attr("to"), Some("bench-1-1@muclight.localhost"));
        assert_eq!(iq.attr("id"), Some("mlcreate1"));
        let q = iq.get_child("query", NS_CREATE).unwrap();
        let name = q
            .get_child("configuration", NS_CREATE)
            .and_then(|c| c.get_child("roomname", NS_CREATE))
            .map(|n| n.text());
        assert_eq!(name.as_deref(), Some("bench 1"));
        let users: Vec<(Option<&str>, String)> = q
            .get_child("occupants", NS_CREATE)
            .unwrap()
            .children()
            .map(|u| (u.attr("affiliation"), u.text()))
            .collect();
        assert_eq!(
            users,
            vec![
                (Some("member"), "user2@localhost".to_string()),
                (Some("member"), "user3@localhost".to_string())
            ]
        );
        let alone = parse(&create_iq("r@m.x", 4, "r", &[]));
        let q = alone.get_child("query", NS_CREATE).unwrap();
        assert!(q.get_child("occupants", NS_CREATE).is_none());
    }

    #[test]
    fn stanzas_from_the_service_are_classified() {
        let result = parse(
            "<iq xmlns='jabber:client' type='result' id='mlcreate1' from='bench-1-1@muclight.localhost'/>",
        );
        let conflict = parse(&format!(
            "<iq xmlns='jabber:client' type='error' id='mlcreate1' from='bench-1-1@muclight.localhost'>\
             <error type='cancel'><conflict xmlns='{NS_STANZAS}'/></error></iq>"
        ));
        let notification = parse(
            "<message xmlns='jabber:client' type='groupchat' from='bench-1-1@muclight.localhost' to='user2@localhost'>\
             <x xmlns='urn:xmpp:muclight:0#affiliations'><version>v1</version>\
             <user affiliation='member'>user2@localhost</user></x><body/></message>",
        );
        let copy = parse(
            "<message xmlns='jabber:client' type='groupchat' id='m7' to='user2@localhost' \
             from='bench-1-1@muclight.localhost/user3@localhost'><body>1700000000000000 7 </body>\
             <stanza-id xmlns='urn:xmpp:sid:0' by='bench-1-1@muclight.localhost' id='s1'/></message>",
        );
        let refused = parse(&format!(
            "<message xmlns='jabber:client' type='error' id='m8' from='bench-1-2@muclight.localhost'>\
             <body>1700000000000000 8 </body><error type='cancel'><not-allowed xmlns='{NS_STANZAS}'/></error></message>"
        ));
        let busy = parse(&format!(
            "<message xmlns='jabber:client' type='error' from='bench-1-2@muclight.localhost'>\
             <error type='wait'><resource-constraint xmlns='{NS_STANZAS}'/></error></message>"
        ));
        assert_eq!(classify(&result), FromService::Created(Ok(())));
        assert_eq!(
            classify(&conflict),
            FromService::Created(Err(("conflict".into(), String::new())))
        );
        assert_eq!(classify(&notification), FromService::Notification);
        assert_eq!(classify(&copy), FromService::Copy);
        assert_eq!(classify(&refused), FromService::Error { body: true });
        assert_eq!(classify(&busy), FromService::Error { body: false });

        let t = Tracker::new("muclight.localhost".into(), 1, 3, 1);
        let (tx, mut rx) = mpsc::unbounded_channel();
        t.waiters.set(1, Some(tx));
        assert!(t.on_element(1, &result));
        assert!(t.on_element(1, &conflict));
        assert!(t.on_element(2, &notification));
        assert!(!t.on_element(2, &copy), "copies are the engine's");
        assert!(
            !t.on_element(2, &refused),
            "the engine counts it in its step"
        );
        assert!(t.on_element(2, &busy));
        let chat = parse(
            "<message xmlns='jabber:client' type='chat' from='user3@localhost/bench'><body>1 2</body></message>",
        );
        assert!(!t.on_element(2, &chat), "not from the service");
        // A server without the service bounces the creation from elsewhere.
        let bounce = parse(&format!(
            "<iq xmlns='jabber:client' type='error' id='mlcreate1' from='localhost'>\
             <error type='cancel'><remote-server-not-found xmlns='{NS_STANZAS}'/></error></iq>"
        ));
        assert!(t.on_element(1, &bounce));
        let got: Vec<Created> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(
            got,
            vec![
                Ok(()),
                Err(("conflict".into(), String::new())),
                Err(("remote-server-not-found".into(), String::new()))
            ]
        );
        assert_eq!(t.broadcasts.load(Relaxed), 1);
    }

    #[test]
    fn peers_are_told_apart_by_their_label() {
        assert_eq!(
            peer_without_muc_light("ejabberd 23.01, Erlang/OTP 25"),
            Some("ejabberd")
        );
        assert_eq!(
            peer_without_muc_light("Prosody 0.12.3, lua5.4 5.4.4"),
            Some("Prosody")
        );
        assert_eq!(peer_without_muc_light("starling 0.1.0 (git abc)"), None);
        assert_eq!(peer_without_muc_light(""), None);
    }

    #[test]
    fn memory_per_session_and_per_room() {
        let c = CreationResult {
            created: 4,
            ..CreationResult::default()
        };
        let m = memory(42, 10_000, 12_000, 12_400, &c, 20);
        assert_eq!(m.server_pid, 42);
        assert_eq!(m.kb_per_session, 100.0);
        assert_eq!(m.kb_per_room, 100.0);
        let none = CreationResult::default();
        assert_eq!(memory(1, 5, 5, 3, &none, 0).kb_per_room, -2.0);
    }

    #[tokio::test]
    async fn create_phase_creates_each_room_with_its_logged_in_members() {
        // Users 1..=7 in rooms of 3; user 5 did not log in; the service
        // refuses room 2 (`conflict`).
        let a = args(&[
            "--users",
            "7",
            "--room-size",
            "3",
            "--run-id",
            "t",
            "--quiet",
        ]);
        let service = a.service();
        let (mut run, tracker): (_, Arc<Tracker>) =
            RoomRun::start(Scenario::MucLight, &a.scenario, &a.rooms, &service, true).unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut service_tasks = Vec::new();
        for user in [1, 2, 3, 4, 6, 7] {
            let (tx, mut rx) = mpsc::channel::<Vec<u8>>(8);
            run.sessions
                .push(crate::engine::Session { user, outbox: tx });
            let (t, seen) = (tracker.clone(), seen.clone());
            service_tasks.push(tokio::spawn(async move {
                while let Some(b) = rx.recv().await {
                    let iq = parse(std::str::from_utf8(&b).unwrap());
                    let room = iq.attr("to").unwrap().to_owned();
                    let members: Vec<String> = iq
                        .get_child("query", NS_CREATE)
                        .and_then(|q| q.get_child("occupants", NS_CREATE))
                        .map(|o| o.children().map(|u| u.text()).collect())
                        .unwrap_or_default();
                    seen.lock().unwrap().push((user, room.clone(), members.clone()));
                    let from = format!("from='{room}' id='{}'", iq.attr("id").unwrap());
                    if room.starts_with("bench-t-2@") {
                        t.on_element(user, &parse(&format!(
                            "<iq xmlns='jabber:client' type='error' {from}><error type='cancel'>\
                             <conflict xmlns='{NS_STANZAS}'/></error></iq>"
                        )));
                        continue;
                    }
                    let numbers = members.iter().map(|m| m[4..m.find('@').unwrap()].parse().unwrap());
                    for n in std::iter::once(user).chain(numbers) {
                        t.on_element(n, &parse(&format!(
                            "<message xmlns='jabber:client' type='groupchat' from='{room}' to='user{n}@localhost'>\
                             <x xmlns='urn:xmpp:muclight:0#affiliations'><version>1</version></x><body/></message>"
                        )));
                    }
                    t.on_element(user, &parse(&format!("<iq xmlns='jabber:client' type='result' {from}/>")));
                }
            }));
        }
        let room = |r: usize| room_jid("bench", "t", &service, r);
        let (res, rooms) = create_phase(&a, &room, &tracker, &run).await;
        let mut seen = seen.lock().unwrap().clone();
        seen.sort();
        let jid = |n: u64| format!("user{n}@localhost");
        assert_eq!(
            seen,
            vec![
                (
                    1,
                    "bench-t-1@muclight.localhost".into(),
                    vec![jid(2), jid(3)]
                ),
                (4, "bench-t-2@muclight.localhost".into(), vec![jid(6)]),
                (7, "bench-t-3@muclight.localhost".into(), vec![]),
            ]
        );
        assert_eq!((res.attempted, res.created, res.failed), (3, 2, 1));
        assert_eq!((res.members, res.notifications_expected), (4, 4));
        assert_eq!(tracker.broadcasts.load(Relaxed), 4);
        assert_eq!(res.phase.failures["conflict"], 1);
        assert_eq!(
            res.phase.first_error.as_deref(),
            Some("user4@localhost creating bench-t-2@muclight.localhost: conflict")
        );
        assert_eq!(res.phase.latency.count, 2);
        assert_eq!(rooms, vec![vec![0, 1, 2], vec![], vec![5]]);
        run.close().await;
        for t in service_tasks {
            t.abort();
        }
    }

    #[tokio::test]
    async fn creation_waits_out_a_busy_service_then_succeeds() {
        let t = Arc::new(Tracker::new("muclight.localhost".into(), 1, 1, 0));
        let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(16);
        let stanza = create_iq("r@muclight.localhost", 1, "r", &[]);
        let plan = CreatePlan {
            user: 1,
            outbox: out_tx,
            stanza: stanza.clone(),
            deadline: tokio::time::Instant::now() + Duration::from_secs(5),
        };
        let j = tokio::spawn(create_one(t.clone(), plan));
        let feed = |xml: String| assert!(t.on_element(1, &parse(&xml)));
        assert_eq!(out_rx.recv().await.unwrap(), stanza.as_bytes());
        feed(format!(
            "<iq xmlns='jabber:client' type='error' id='mlcreate1' from='r@muclight.localhost'>\
             <error type='wait'><resource-constraint xmlns='{NS_STANZAS}'/></error></iq>"
        ));
        assert_eq!(out_rx.recv().await.unwrap(), stanza.as_bytes(), "re-sent");
        feed(
            "<iq xmlns='jabber:client' type='result' id='mlcreate1' from='r@muclight.localhost'/>"
                .into(),
        );
        let o = j.await.unwrap();
        assert_eq!(o.result, Ok(()));
        assert_eq!(o.retries, 1);
    }

    #[tokio::test]
    async fn creation_fails_with_the_condition_or_times_out() {
        let t = Arc::new(Tracker::new("muclight.localhost".into(), 1, 2, 0));
        let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(16);
        let plan = |user: u64, secs: f64| CreatePlan {
            user,
            outbox: out_tx.clone(),
            stanza: create_iq("r@muclight.localhost", user, "r", &[]),
            deadline: tokio::time::Instant::now() + Duration::from_secs_f64(secs),
        };
        let j = tokio::spawn(create_one(t.clone(), plan(1, 5.0)));
        out_rx.recv().await.unwrap();
        let el = parse(&format!(
            "<iq xmlns='jabber:client' type='error' id='mlcreate1' from='r@muclight.localhost'>\
             <error type='cancel'><conflict xmlns='{NS_STANZAS}'/>\
             <text xmlns='{NS_STANZAS}'>exists</text></error></iq>"
        ));
        t.on_element(1, &el);
        let o = j.await.unwrap();
        assert_eq!(o.result, Err(("conflict".into(), "exists".into())));
        let o = create_one(t.clone(), plan(2, 0.05)).await;
        let (cause, detail) = o.result.unwrap_err();
        assert_eq!(cause, "timeout");
        assert!(
            detail.starts_with("no answer to the creation after"),
            "{detail}"
        );
    }
}
