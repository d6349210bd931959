//! Scenario `pep`: what personal eventing (XEP-0163) costs at login.
//!
//! Users are split into groups of `--contacts` + 1 consecutive users
//! (user `first + i` is in group `i / (contacts + 1)`; the last group may
//! be smaller); the members of a group are each other's contacts.
//!
//! 1. **Setup**, over XMPP only, so that it works against any server
//!    (skipped with `--skip-setup`):
//!    - every user logs in (`--concurrency` in flight), fetches its roster
//!      (so the server delivers subscription requests to it, RFC 6121
//!      §3.1.3) and sends `<presence/>` — without capabilities, so that
//!      nothing is notified during the setup;
//!    - once all are online, each user removes the roster items outside
//!      its group (an earlier run's) and those whose two sides disagree
//!      (`disagreements`), then one handshake per pair: the
//!      lower-numbered user sends `subscribe`, the other answers
//!      `subscribed` and `subscribe`, the first answers `subscribed`; a
//!      user is done when the roster pushes say `both` for every contact
//!      (`--setup-timeout-secs`);
//!    - then it publishes one item to each of the first `--nodes` nodes of
//!      [`NODES`] (avatar metadata, nick, OMEMO device lists with
//!      `publish-options` access model `open`…; payloads of a few hundred
//!      bytes) and deletes the list's other nodes (an earlier run's); a
//!      refused publication is sent again after a pause, at most 9 times
//!      (ejabberd's mnesia refuses some of many simultaneous first
//!      publications: see `publish_retry_after` in `setup.rs`), the
//!      retries reported;
//!    - every session closes (`</stream:stream>`).
//! 2. **The caps warm-up** (not measured; skipped with `--cold-caps`): the
//!    first user logs in alone, sends the storm's caps presence and
//!    answers the server's disco#info queries, then logs out; the tool
//!    waits `--settle-secs`. A production server knows the `ver` of the
//!    clients its users run (ejabberd and Starling keep verified caps in
//!    their database, Prosody in memory): without this, the storm's
//!    first logins would all meet a `ver` the server never saw, and what a
//!    server does with notifications before its disco#info round trip
//!    completes differs (ejabberd 23.01 drops them: `mod_pubsub` filters
//!    last items through `mod_caps:get_features/2`, empty until the
//!    answer is stored, and does not send them again afterwards).
//! 3. **The login storm** (measured): every user logs in again, at
//!    `--rate` logins/s (0: all at once; at most `--concurrency` in flight
//!    until bound), and sends available presence with XEP-0115
//!    capabilities: one `ver` (sha-1, §5.1) shared by every session,
//!    whose features include `NODE+notify` for each published node. The
//!    server's disco#info query for it (§6.3, from whichever JID) is
//!    answered. Expected by each login: the last item of every node of
//!    every group member, its own included (group size × nodes), as
//!    notifications (`<message>` with a `pubsub#event` child). A login's
//!    window lasts until it got all of them and then `--quiet-ms` passed
//!    without another, or `--window-secs` after its caps presence at the
//!    latest: servers that deliver later (a backlog, their own round
//!    trips) are waited for rather than cut off; what did not arrive by
//!    then is missing, split by whether its publisher was online first
//!    (the login itself, or a contact whose caps presence went out before
//!    the login's) or logged in after it. (ejabberd 23.01 sends a login
//!    the last items of online contacts only, from their sessions'
//!    answers to its presence probes — `mod_pubsub:presence_probe/3`; its
//!    `ignore_pep_from_offline: false` is a no-op since the code that
//!    used it was commented out in `send_last_items/1` — so with
//!    simultaneous logins it misses the items of the contacts that log in
//!    after it, by design.) Per login: TCP connect → last
//!    notification (and caps presence → last notification), notifications
//!    received, the expected (publisher, node) pairs among them,
//!    duplicates, unexpected ones, XML bytes and presences received after
//!    binding. Sessions stay online after their window and keep counting
//!    (notifications after the window: what others' logins sent to
//!    sessions already online — the "notification storm"), until every
//!    window closed and no notification came for `--quiet-ms`. Server CPU
//!    over the storm per login, and with the server's PID known
//!    (`--server-pid`, or whoever listens on `--port`) its VmRSS before and
//!    after the storm (each after `--settle-secs`): KiB per session.
//!
//! 4. **The publish fan-out** (measured; only with `--publishes` N > 0):
//!    once every login's window closed (and the memory was read), N
//!    publications to the first node (avatar metadata), one every
//!    `--publish-interval-ms`, publication `i` by an online user of group
//!    `i mod groups` (rotating through its members). The orchestrator
//!    tells that user's session (a channel per session) to publish; the
//!    item id `fan-<send time, µs since the epoch>-<i>` carries the send
//!    time, so each receiving session times its notification itself:
//!    publish → each notification, and per publication the number of
//!    receivers and the time to the last one. Expected receivers: the
//!    online sessions of the publisher's group, its own included (they
//!    all announced `+notify`). After the last publication the tool waits
//!    until `--quiet-ms` passes without a fan-out notification (30 s at
//!    most), then every session closes.
//!
//! Runs in one process (at most `--max-per-process` sessions).
//!
//! This file runs the phases in order; `proto.rs` holds what the scenario
//! sends and reads (nodes and items, caps, notifications), `layout.rs`
//! who is whose contact and who publishes, `setup.rs` the setup and the
//! caps warm-up, `storm.rs` the login storm and the publish fan-out.

mod layout;
mod proto;
mod setup;
mod storm;

pub(crate) use layout::group_of;
pub use proto::{
    caps_ver, verification_string, Caps, PepNode, CAPS_NODE, NODES, NS_CAPS, NS_DISCO_INFO,
    NS_EVENT, NS_PUBSUB, NS_PUBSUB_OWNER, NS_ROSTER,
};

use crate::cli::PepArgs;
use crate::engine::{now_us, Scenario, Shared};
use crate::rate::RateSchedule;
use crate::report::PepMemory;
use crate::rooms::wait_quiet;
use crate::{engine, procmem};
use layout::{pick_publisher, Layout};
use setup::{setup_phase, warm_caps};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use storm::{login, storm_result, Fan, Publication, StormCtx};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;

/// Starting times of the storm's logins: all at `start` with rate 0, else
/// `i / rate` seconds after it.
fn schedule(start: tokio::time::Instant, i: u64, rate: f64) -> tokio::time::Instant {
    if rate > 0.0 {
        start + Duration::from_secs_f64(i as f64 / rate)
    } else {
        start
    }
}

/// Checks the options.
fn check(a: &PepArgs) -> anyhow::Result<()> {
    let sc = &a.scenario;
    anyhow::ensure!(sc.conn.users > 0, "--users must be at least 1");
    anyhow::ensure!(
        sc.conn.users <= sc.sessions_per_process() && sc.worker_index.is_none(),
        "pep runs in one process: at most {} sessions (--max-per-process)",
        sc.sessions_per_process()
    );
    anyhow::ensure!(
        a.rate >= 0.0 && a.rate.is_finite(),
        "--rate must be 0 or more"
    );
    anyhow::ensure!(a.quiet_ms > 0, "--quiet-ms must be at least 1");
    anyhow::ensure!(
        a.window_secs > 0.0 && a.window_secs.is_finite(),
        "--window-secs must be more than 0"
    );
    anyhow::ensure!(
        !sc.conn.sm,
        "pep does not speak XEP-0198 stream management: leave out --sm"
    );
    anyhow::ensure!(
        a.publishes == 0 || a.nodes > 0,
        "--publishes needs --nodes 1 or more (it publishes to the first node)"
    );
    Ok(())
}

/// Runs the scenario.
pub async fn run(a: PepArgs) -> anyhow::Result<()> {
    check(&a)?;
    let sc = &a.scenario;
    let target = engine::target_of(sc)?;
    let layout = Layout::of(&a);
    let nodes: Vec<PepNode> = NODES[..a.nodes as usize].to_vec();
    let caps = Arc::new(Caps::new(&nodes));
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
    let mut result = engine::skeleton(Scenario::Pep, sc, 1);
    let shared = Arc::new(Shared::new(RateSchedule::new(&[], 1.0, 1)));
    let pb = engine::progress_bar(sc, sc.conn.users);
    let reporter = engine::spawn_reporter(sc, shared.clone(), pb.clone());

    // 1. Setup.
    let setup = if a.skip_setup {
        None
    } else {
        let x = setup_phase(&a, &target, &layout, &caps, &shared, &pb).await;
        if !sc.quiet {
            pb.println(format!(
                "pep: setup took {:.1} s: {} logins in {:.2} s, {}/{} contacts mutually subscribed after {:.2} s, {}/{} items published after {:.2} s",
                x.total_s,
                x.logins.established,
                x.logins.duration_s,
                x.contacts_both,
                x.contacts_expected,
                x.subscribe_s,
                x.published,
                x.publish_expected,
                x.publish_s
            ));
        }
        Some(x)
    };
    // The caps warm-up.
    let warmup = if a.cold_caps {
        None
    } else {
        pb.set_message("caps warm-up");
        match warm_caps(
            &target,
            &sc.conn,
            &sc.resource,
            sc.conn.first_user,
            &caps,
            Duration::from_millis(a.quiet_ms),
        )
        .await
        {
            Ok(q) => Some(q),
            Err(e) => {
                pb.println(format!(
                    "pep: caps warm-up failed ({e}); the storm starts cold"
                ));
                None
            }
        }
    };
    if setup.is_some() || warmup.is_some() {
        pb.set_message(format!("settling {} s", sc.settle_secs));
        engine::hold(sc.settle_secs).await;
    }

    // 2. The storm.
    shared.established.store(0, Relaxed);
    shared.failed.store(0, Relaxed);
    pb.set_position(0);
    pb.set_message("login storm");
    let rss_before = server_pid.and_then(|p| Some((p, procmem::rss_kb(p).ok()?)));
    let ctx = Arc::new(StormCtx {
        target: target.clone(),
        layout,
        conn: sc.conn.clone(),
        resource: sc.resource.clone(),
        presence: caps.presence(),
        caps: (*caps).clone(),
        nodes: nodes.clone(),
        quiet: Duration::from_millis(a.quiet_ms),
        window: Duration::from_secs_f64(a.window_secs),
        shared: shared.clone(),
        notifications: AtomicU64::new(0),
        presence_at: (0..sc.conn.users).map(|_| AtomicU64::new(0)).collect(),
        online: (0..sc.conn.users).map(|_| AtomicBool::new(false)).collect(),
        fan: Mutex::new(Fan::default()),
        fan_notifications: AtomicU64::new(0),
    });
    let c0 = cpu();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = watch::channel(false);
    let sem = Arc::new(Semaphore::new(sc.conn.concurrency.max(1)));
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let started_unix_ms = now_us() / 1000 + 100;
    let (lo, hi) = (sc.conn.first_user, sc.conn.first_user + sc.conn.users);
    let mut set = JoinSet::new();
    let mut publishers = Vec::with_capacity(sc.conn.users as usize);
    for (i, n) in (lo..hi).enumerate() {
        let (publish_tx, publish_rx) = mpsc::unbounded_channel();
        publishers.push(publish_tx);
        set.spawn(login(
            ctx.clone(),
            n,
            schedule(start, i as u64, a.rate),
            sem.clone(),
            tx.clone(),
            stop_rx.clone(),
            publish_rx,
        ));
    }
    drop(tx);
    let mut reports = Vec::with_capacity(sc.conn.users as usize);
    while let Some(r) = rx.recv().await {
        reports.push(r);
        pb.set_message(format!("{} login windows closed", reports.len()));
    }
    // Notifications to sessions already online, until none comes.
    pb.set_message("waiting for the last notifications");
    wait_quiet(
        &ctx.notifications,
        None,
        Duration::from_millis(a.quiet_ms),
        Duration::from_secs(60),
    )
    .await;
    let c1 = cpu();
    let rss_after = match rss_before {
        Some((pid, _)) => {
            pb.set_message(format!("settling {} s", sc.settle_secs));
            engine::hold(sc.settle_secs).await;
            procmem::rss_kb(pid).ok()
        }
        None => None,
    };
    // 4. The publish fan-out.
    let fanout = if a.publishes > 0 {
        pb.set_message(format!("publish fan-out: {} publications", a.publishes));
        let first = ctx.layout.first;
        let online = |m: u64| ctx.online[(m - first) as usize].load(Relaxed);
        let interval = Duration::from_millis(a.publish_interval_ms);
        let t0 = tokio::time::Instant::now();
        for i in 0..a.publishes {
            tokio::time::sleep_until(t0 + interval * i as u32).await;
            let Some((m, expected)) = pick_publisher(&ctx.layout, i, online) else {
                continue;
            };
            let k = {
                let mut f = ctx.fan.lock().unwrap();
                f.pubs.push(Publication {
                    expected,
                    ..Publication::default()
                });
                f.pubs.len() as u64 - 1
            };
            let _ = publishers[(m - first) as usize].send(k);
        }
        wait_quiet(
            &ctx.fan_notifications,
            None,
            Duration::from_millis(a.quiet_ms),
            Duration::from_secs(30),
        )
        .await;
        let f = ctx
            .fan
            .lock()
            .unwrap()
            .result(nodes[0].node, a.publishes, a.publish_interval_ms);
        if !sc.quiet {
            pb.println(format!(
                "pep: fan-out: {}/{} notifications of {} publications delivered; p99 {:.1} ms to each contact, {:.1} ms to the last",
                f.delivered, f.expected, f.sent, f.latency.p99_ms, f.last_latency.p99_ms
            ));
        }
        Some(f)
    } else {
        None
    };
    pb.set_message("closing sessions");
    let _ = stop_tx.send(true);
    let mut tails = Vec::new();
    while let Some(t) = set.join_next().await {
        if let Ok(t) = t {
            tails.push(t);
        }
    }
    drop(publishers);
    reporter.abort();
    pb.finish_and_clear();

    let first = ctx.layout.first;
    let (mut connect, mut p) = storm_result(started_unix_ms, reports, &tails, |m| {
        ctx.presence_at
            .get((m - first) as usize)
            .map_or(0, |t| t.load(Relaxed))
    });
    connect.server_cpu_s = delta(c0.0, c1.0);
    connect.client_cpu_s = delta(c0.1, c1.1);
    p.server_cpu_ms_per_login = connect
        .server_cpu_s
        .map(|s| s * 1000.0 / p.logins.max(1) as f64);
    p.memory = match (rss_before, rss_after) {
        (Some((pid, b)), Some(after)) => Some(PepMemory {
            server_pid: pid,
            rss_before_kb: b,
            rss_after_kb: after,
            kb_per_session: (after as f64 - b as f64) / p.logins.max(1) as f64,
        }),
        _ => None,
    };
    p.contacts = a.contacts;
    p.groups = ctx.layout.groups();
    p.nodes = nodes.iter().map(|n| n.node.to_owned()).collect();
    p.caps_ver = caps.ver.clone();
    p.target_rate = a.rate;
    p.quiet_ms = a.quiet_ms;
    p.window_secs = a.window_secs;
    p.caps_warmed_up = warmup.is_some();
    p.caps_warmup_queries = warmup.unwrap_or(0);
    p.setup = setup;
    p.fanout = fanout;
    result.connect = connect;
    result.pep = Some(p);
    engine::output(&result, sc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Command;
    use crate::rooms::test_util::command;

    pub(super) fn args(extra: &[&str]) -> PepArgs {
        match command(&[&["pep"], extra].concat()) {
            Command::Pep(a) => a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn options_and_defaults() {
        let a = args(&[]);
        assert_eq!((a.contacts, a.nodes, a.rate, a.quiet_ms), (9, 3, 0.0, 2000));
        assert!(!a.skip_setup);
        assert_eq!(a.scenario.conn.users, 100);
        let a = args(&[
            "--users",
            "50",
            "--contacts",
            "4",
            "--nodes",
            "8",
            "--rate",
            "25",
            "--quiet-ms",
            "500",
            "--skip-setup",
            "--setup-timeout-secs",
            "5",
            "--server-pid",
            "42",
        ]);
        assert_eq!((a.contacts, a.nodes, a.rate, a.quiet_ms), (4, 8, 25.0, 500));
        assert!(a.skip_setup);
        assert_eq!(a.setup_timeout_secs, 5.0);
        assert_eq!(a.scenario.server_pid, Some(42));
        check(&a).unwrap();
        let err = <crate::cli::Cli as clap::Parser>::try_parse_from([
            "starling-bench",
            "pep",
            "--nodes",
            "9",
        ]);
        assert!(err.is_err(), "at most 8 nodes");
        assert!(check(&args(&["--rate=-1"])).is_err());
        assert!(check(&args(&["--quiet-ms", "0"])).is_err());
        assert!(check(&args(&["--sm"])).is_err());
        assert!(check(&args(&["--users", "20000"])).is_err(), "one process");
        let a = args(&[]);
        assert_eq!((a.publishes, a.publish_interval_ms), (0, 500), "no fan-out");
        let a = args(&["--publishes", "3", "--publish-interval-ms", "20"]);
        assert_eq!((a.publishes, a.publish_interval_ms), (3, 20));
        check(&a).unwrap();
        assert!(
            check(&args(&["--publishes", "3", "--nodes", "0"])).is_err(),
            "nothing to publish to"
        );
    }

    #[test]
    fn the_schedule_spreads_logins_at_the_rate() {
        let t = tokio::time::Instant::now();
        assert_eq!(schedule(t, 7, 0.0), t);
        assert_eq!(schedule(t, 10, 20.0), t + Duration::from_millis(500));
    }
}
