//! The `muc` scenario: multi-user chat (XEP-0045) against any server.
//!
//! Phases, all over the same sessions (the storm, readers and writers of
//! [`crate::engine`]; the run around the rooms is [`RoomRun`], shared with
//! `muc-light`):
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
//! 3. the ramp of [`RoomRun::ramp`]: random senders send groupchat messages
//!    to their room, the send time and the message number in the body;
//!    every occupant (the sender too: the reflection) gets a copy. Each
//!    copy is timed; per message [`Copies`] counts the copies still
//!    missing and, when the last one arrives, records the latency of that
//!    slowest copy. Error messages from the service count by condition.
//!
//! One process (≤ `--max-per-process` sessions): a message's copies must
//! all arrive at the process that counts them.

use crate::cli::MucArgs;
use crate::engine::{now_us, Scenario};
use crate::hist::Latency;
use crate::report::{JoinResult, MucResult};
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

/// XEP-0045 namespaces.
pub const NS_MUC: &str = "http://jabber.org/protocol/muc";
/// `muc#user`.
pub const NS_MUC_USER: &str = "http://jabber.org/protocol/muc#user";
/// `muc#owner`.
pub const NS_MUC_OWNER: &str = "http://jabber.org/protocol/muc#owner";
/// Rooms up to this size are created as plain instant rooms; larger ones
/// ask for `muc#roomconfig_maxusers` (Starling's and ejabberd's default
/// occupant limit is 200).
pub const USUAL_MAX_USERS: u64 = 200;
/// Prefix of the owner form's iq id.
const CFG_ID: &str = "muccfg";

/// What a session's reader saw of its room while entering.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum JoinEvent {
    /// Own presence (status 110); `created`: status 201.
    SelfPresence { created: bool },
    /// The subject message (end of the entering sequence).
    Subject,
    /// The owner form's result (`Err`: the error condition).
    Configured(Result<(), String>),
    /// The room refused the presence: condition, detail.
    Refused(String, String),
}

/// The scenario's shared bookkeeping (`broadcasts`: other occupants'
/// presences).
pub(crate) type Tracker = RoomState<JoinEvent>;

impl RoomTracker for Tracker {
    /// Takes the room's stanzas that are not groupchat messages with a
    /// body (those are counted by the engine): presences, the subject,
    /// the owner form's result. Error messages are counted by condition.
    fn on_element(&self, user: u64, el: &Element) -> bool {
        if !self.sent_by_service(el) {
            return false;
        }
        match el.name() {
            "presence" => {
                if el.attr("type") == Some("error") {
                    let (cond, text) = error_of(el);
                    self.waiters.notify(user, JoinEvent::Refused(cond, text));
                } else if let Some(x) = el.get_child("x", NS_MUC_USER) {
                    let has = |code: &str| {
                        x.children()
                            .any(|c| c.name() == "status" && c.attr("code") == Some(code))
                    };
                    if has("110") {
                        self.waiters.notify(
                            user,
                            JoinEvent::SelfPresence {
                                created: has("201"),
                            },
                        );
                    } else {
                        self.broadcasts.fetch_add(1, Relaxed);
                    }
                } else {
                    self.broadcasts.fetch_add(1, Relaxed);
                }
                true
            }
            "message" => {
                if el.attr("type") == Some("error") {
                    self.copies.note_error(el);
                }
                if el.children().any(|c| c.name() == "body") {
                    return false;
                }
                if el.attr("type") != Some("error") && el.children().any(|c| c.name() == "subject")
                {
                    self.waiters.notify(user, JoinEvent::Subject);
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
                self.waiters.notify(user, JoinEvent::Configured(r));
                true
            }
            _ => false,
        }
    }

    fn copies(&self) -> &Copies {
        &self.copies
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
    result: Result<(), Failure>,
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
    tracker.waiters.set(plan.user, Some(tx));
    let t0 = Instant::now();
    let mut out = JoinOutcome {
        result: Ok(()),
        latency_us: 0,
        created: false,
        configured: false,
        retries: 0,
    };
    let fail = |cause: &str, detail: String| Err((cause.to_owned(), detail));
    let mut self_seen = false;
    let mut form = 0usize;
    let mut backoff = Backoff::new(plan.deadline);
    out.result = match send(&plan.outbox, &plan.presence).await {
        Err(e) => Err(e),
        Ok(()) => loop {
            let waiting = match (self_seen, out.created) {
                (false, _) => "no own presence",
                (true, true) => "no answer to the owner form",
                (true, false) => "no subject",
            };
            let ev = match next_event(&mut rx, plan.deadline, t0, waiting).await {
                Ok(ev) => ev,
                Err(e) => break Err(e),
            };
            match ev {
                JoinEvent::SelfPresence { created } => {
                    self_seen = true;
                    if created && !out.created {
                        out.created = true;
                        if let Err(e) = send(&plan.outbox, &plan.forms[0]).await {
                            break Err(e);
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
                            if let Err(e) = send(&plan.outbox, f).await {
                                break Err(e);
                            }
                        }
                        None => break fail("config", format!("owner form refused: {e}")),
                    }
                }
                JoinEvent::Refused(cond, text) => {
                    if cond == "item-not-found" && !self_seen {
                        if !backoff.wait().await {
                            break fail(
                                "item-not-found",
                                format!(
                                    "room still locked or missing after {} tries: {text}",
                                    backoff.tries
                                ),
                            );
                        }
                        if let Err(e) = send(&plan.outbox, &plan.presence).await {
                            break Err(e);
                        }
                    } else {
                        break fail(&cond, text);
                    }
                }
            }
        },
    };
    out.retries = backoff.tries;
    out.latency_us = t0.elapsed().as_micros() as u64;
    tracker.waiters.set(plan.user, None);
    out
}

/// The rooms: for each, the session indices of its joined members (in
/// user order).
type Rooms = Vec<Vec<usize>>;

/// Room `r`'s JID.
fn room_jid(a: &MucArgs, r: usize) -> String {
    format!("{}{}@{}", a.rooms.room_prefix, r + 1, a.service())
}

/// The join storm: leaders first, each room's others once its leader is
/// done, at most `--join-concurrency` joins in flight.
async fn join_phase(a: &MucArgs, tracker: &Arc<Tracker>, run: &RoomRun) -> (JoinResult, Rooms) {
    let sc = &a.scenario;
    let sessions = &run.sessions[..];
    let members = run.members(&a.rooms);
    let timeout = Duration::from_secs_f64(a.join_timeout_secs);
    let plan = |i: usize, r: usize| {
        let s = &sessions[i];
        let room = room_jid(a, r);
        JoinPlan {
            user: s.user,
            outbox: s.outbox.clone(),
            presence: join_presence(&room, &sc.conn.user(s.user), a.history),
            forms: owner_forms(&room, s.user, a.rooms.room_size),
            deadline: tokio::time::Instant::now() + timeout,
        }
    };
    let leaders: VecDeque<(usize, usize, bool)> = members
        .iter()
        .enumerate()
        .filter_map(|(r, m)| m.first().map(|&i| (i, r, true)))
        .collect();
    let mut hist = Latency::new();
    let mut res = JoinResult {
        attempted: sessions.len() as u64,
        ..JoinResult::default()
    };
    res.phase.started_unix_ms = now_us() / 1000;
    let mut joined: Rooms = vec![Vec::new(); members.len()];
    bounded(
        a.join_concurrency.unwrap_or(sc.conn.concurrency),
        leaders,
        |(i, r, leader)| {
            let (p, t) = (plan(i, r), tracker.clone());
            async move { (i, r, leader, join_one(t, p).await) }
        },
        |done, queue| {
            let Some((i, r, leader, o)) = done else {
                res.phase.fail("panic", || "a join task panicked".into());
                return;
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
                Err(e) => res.phase.fail(&e.0, || {
                    let who = format!("{} in {}", sc.conn.user(sessions[i].user), room_jid(a, r));
                    rooms::describe(&who, &e)
                }),
            }
            run.pb.set_message(format!("{} joined", res.joined));
        },
    )
    .await;
    res.phase.finished_unix_ms = now_us() / 1000;
    res.failed = res.attempted - res.joined;
    res.phase.latency = hist.summary();
    res.finalize();
    for m in &mut joined {
        m.sort_by_key(|&i| sessions[i].user);
    }
    (res, joined)
}

/// Runs the scenario.
pub async fn run(a: MucArgs) -> anyhow::Result<()> {
    let sc = &a.scenario;
    let service = a.service();
    let (mut run, tracker): (_, Arc<Tracker>) =
        RoomRun::start(Scenario::Muc, sc, &a.rooms, &service, a.join_only)?;
    let users = sc.conn.users;
    let c1 = run.login().await?;

    // The join storm.
    if !sc.quiet {
        run.pb.println(format!(
            "muc: {} sessions entering {} room(s) of {} at {service}",
            run.sessions.len(),
            users.div_ceil(a.rooms.room_size),
            a.rooms.room_size
        ));
    }
    let presences0 = tracker.broadcasts.load(Relaxed);
    let (mut join, rooms) = join_phase(&a, &tracker, &run).await;
    (join.phase.server_cpu_s, join.phase.client_cpu_s) = run.cpu().since(c1);
    // The last joins' presence broadcasts may still be on their way (a
    // room of 1,000 sends half a million): wait until none arrived for
    // 500 ms (at most 30 s) so the ramp does not start on a backlog.
    run.pb
        .set_message("waiting for the presence broadcasts to end");
    wait_quiet(
        &tracker.broadcasts,
        None,
        Duration::from_millis(500),
        Duration::from_secs(30),
    )
    .await;
    join.presences_received = tracker.broadcasts.load(Relaxed) - presences0;

    // The ramp.
    let jids: Vec<String> = (0..rooms.len()).map(|r| room_jid(&a, r)).collect();
    let (layout, ramp) = run
        .ramp(&a.rooms, &service, &tracker.copies, &rooms, &jids, "muc")
        .await;
    run.result.muc = Some(MucResult {
        layout,
        history: a.history,
        join,
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

    fn args(extra: &[&str]) -> MucArgs {
        let Command::Muc(a) = command(&[&["muc"], extra].concat()) else {
            unreachable!()
        };
        a
    }

    #[test]
    fn options_and_room_names() {
        let a = args(&["--domain", "example.org"]);
        assert_eq!(a.rooms.room_size, 5);
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
        assert_eq!(a.rooms.senders_per_room, 2);
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
        t.waiters.set(11, Some(tx));
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
        assert!(!t.on_element(99, &subject) || !t.waiters.knows(99));
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
        assert_eq!(t.broadcasts.load(Relaxed), 1);
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
