//! Scenario `resume`: XEP-0198 session resumption against full logins, and
//! the server memory of detached sessions.
//!
//! 1. **Login storm**: every user logs in (TLS, SASL, bind), enables
//!    stream management with resumption and sends initial presence; rate
//!    and server CPU as in `connect`. Server RSS before and after. With
//!    `--full-login`, each login also fetches the roster, enables carbons,
//!    fetches the block list and the server's disco#info before its
//!    presence, as clients do at every session they could not resume.
//! 2. **Unacked messages** (`--unacked K`, default 0): user `n` sends K
//!    chat messages to user `n + 1` (the last to the first) and every
//!    session waits until it received its K, answering none of the
//!    server's `<r/>`: each session now holds K unacknowledged stanzas
//!    on the server. RSS again.
//! 3. **Drop**: every connection is closed without `</stream:stream>`
//!    (the TCP socket is just dropped), so the server keeps the sessions
//!    detached. After `--settle-secs`, RSS: (detached − before) ÷ sessions
//!    is the memory of one detached session with K unacked stanzas.
//! 4. **Resumption storm**: every user connects again, authenticates and
//!    sends `<resume previd h/>` with `h` = the stanzas it received
//!    (nothing needs re-sending); `<resumed h/>` must count every stanza
//!    the client sent (presence + K), else it is an `h` mismatch. Same
//!    concurrency as the logins, so resumes/s ÷ logins/s and server CPU per
//!    login ÷ per resumption compare the two.
//! 5. The resumed sessions are closed with `</stream:stream>`.
//!
//! Runs in one process (at most `--max-per-process` connections).

use crate::cli::ResumeArgs;
use crate::client::{self, Conn, Event, NS_SM};
use crate::engine::{self, is_stanza, Shared};
use crate::procmem;
use crate::rate::RateSchedule;
use crate::report::ResumeResult;
use anyhow::Context as _;
use starling_xml::Element;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;

/// One logged-in session between the phases.
struct Live {
    n: u64,
    conn: Conn,
    /// Stanzas received since `<enabled/>` (our 'h').
    h: u32,
    /// Stanzas sent since `<enabled/>` (the server's 'h').
    sent: u32,
}

/// Runs the scenario.
pub async fn run(a: ResumeArgs) -> anyhow::Result<()> {
    let mut sc = a.scenario.clone();
    sc.conn.sm = true;
    let users = sc.conn.users;
    anyhow::ensure!(users >= 2, "resume needs at least 2 users");
    anyhow::ensure!(
        users <= sc.sessions_per_process(),
        "resume runs in one process: at most {} sessions (--max-per-process)",
        sc.sessions_per_process()
    );
    let target = {
        let mut t = (*engine::target_of(&sc)?).clone();
        t.sasl2 = a.sasl2;
        t.fast = a.fast;
        t.full_login = a.full_login;
        Arc::new(t)
    };
    let pid = match sc.server_pid {
        Some(p) => p,
        None => procmem::pid_listening_on(sc.conn.port)
            .context("the resume scenario measures the server: pass --server-pid")?,
    };
    let me = std::process::id();
    let cpu = || (procmem::cpu_secs(pid), procmem::cpu_secs(me));
    let delta = |a: Option<f64>, b: Option<f64>| Some(b? - a?);
    let settle = || engine::hold(sc.settle_secs);

    let shared = Arc::new(Shared::new(RateSchedule::new(&[], 1.0, 1)));
    let mut result = engine::skeleton(engine::Scenario::Resume, &sc, 1);
    let pb = engine::progress_bar(&sc, users);
    let reporter = engine::spawn_reporter(&sc, shared.clone(), pb.clone());
    let (lo, hi) = (sc.conn.first_user, sc.conn.first_user + users);

    // 1. Logins.
    let rss_before = procmem::rss_kb(pid)?;
    let c0 = cpu();
    let mut live: Vec<Live> = Vec::with_capacity(users as usize);
    let mut login = engine::storm(&sc, &target, lo, hi, true, &shared, |n, conn| {
        // Initial presence was the first stanza after <enable/>, or the
        // fifth after the four requests of a full login (whose four
        // results the client received).
        let full = u32::from(target.full_login);
        live.push(Live {
            n,
            conn,
            h: 4 * full,
            sent: 1 + 4 * full,
        })
    })
    .await;
    let c1 = cpu();
    login.server_cpu_s = delta(c0.0, c1.0);
    login.client_cpu_s = delta(c0.1, c1.1);
    result.connect = login.clone();
    pb.set_message(format!("settling {} s", sc.settle_secs));
    settle().await;
    let rss_attached = procmem::rss_kb(pid)?;

    // What arrived since the login (contacts' presence, when users have
    // rosters) is read and counted, as a client acknowledges what it
    // received: the resumptions then have nothing to re-send but the
    // unacked messages below.
    if !live.is_empty() {
        pb.set_message("reading what arrived since the login");
        let mut set = JoinSet::new();
        for mut l in live.drain(..) {
            set.spawn(async move {
                read_pending(&mut l).await;
                l
            });
        }
        while let Some(j) = set.join_next().await {
            if let Ok(l) = j {
                live.push(l);
            }
        }
    }

    // 2. Unacknowledged messages.
    let k = a.unacked;
    let mut delivered = 0u64;
    if k > 0 && !live.is_empty() {
        pb.set_message(format!("{k} unacked messages per session"));
        let up: Vec<u64> = live.iter().map(|l| l.n).collect();
        let mut set = JoinSet::new();
        for (i, mut l) in live.drain(..).enumerate() {
            let to = sc.conn.user(up[(i + 1) % up.len()]);
            let to = format!("{to}@{}/{}", sc.conn.domain, sc.resource);
            let pad = "x".repeat(sc.body_bytes);
            let t = Duration::from_secs_f64(a.fill_timeout_secs);
            set.spawn(async move {
                let got = fill(&mut l, &to, k, &pad, t).await;
                (l, got)
            });
        }
        while let Some(j) = set.join_next().await {
            if let Ok((l, got)) = j {
                delivered += got;
                live.push(l);
            }
        }
        settle().await;
    }
    let rss_filled = procmem::rss_kb(pid)?;

    // 3. Drop every connection: the sessions stay detached.
    pb.set_message("dropping connections");
    let detached = live.len() as u64;
    let mut resume_as: HashMap<u64, (String, u32, u32)> = HashMap::new();
    for l in live.drain(..) {
        if let Some(id) = l.conn.sm_id.clone() {
            resume_as.insert(l.n, (id, l.h, l.sent));
        }
        drop(l.conn);
    }
    settle().await;
    let rss_detached = procmem::rss_kb(pid)?;

    // 4. Resumptions.
    pb.set_message("resuming");
    pb.set_position(0);
    shared
        .established
        .store(0, std::sync::atomic::Ordering::Relaxed);
    shared.failed.store(0, std::sync::atomic::Ordering::Relaxed);
    let resume_as = Arc::new(resume_as);
    let mismatch = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut resumed: Vec<Conn> = Vec::with_capacity(detached as usize);
    let c2 = cpu();
    let conn_args = sc.conn.clone();
    let mut resumes = engine::storm_with(
        &sc,
        lo,
        hi,
        &shared,
        |_, conn| resumed.push(conn),
        |n| {
            let target = target.clone();
            let user = conn_args.user(n);
            let password = conn_args.password_of(n);
            let prev = resume_as.get(&n).cloned();
            let mismatch = mismatch.clone();
            async move {
                let Some((previd, h, expected_h)) = prev else {
                    return Err(client::SetupError {
                        cause: client::Cause::Bind,
                        detail: "no session to resume (its login failed)".into(),
                    });
                };
                let (conn, server_h) =
                    client::resume(&target, target.source_for(n), &user, &password, &previd, h)
                        .await?;
                if server_h != expected_h {
                    mismatch.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(conn)
            }
        },
    )
    .await;
    let c3 = cpu();
    resumes.server_cpu_s = delta(c2.0, c3.0);
    resumes.client_cpu_s = delta(c2.1, c3.1);

    // 5. Close.
    pb.set_message("closing sessions");
    let mut set = JoinSet::new();
    for mut c in resumed {
        set.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(3), async {
                let _ = c.send(b"</stream:stream>").await;
                while !matches!(c.next_event().await, Ok(Event::Closed) | Err(_)) {}
            })
            .await;
        });
    }
    while set.join_next().await.is_some() {}
    reporter.abort();
    pb.finish_and_clear();

    let per = |cpu: Option<f64>, n: u64| cpu.map(|c| c / n.max(1) as f64);
    let server_cpu_ratio = match (
        per(login.server_cpu_s, login.established),
        per(resumes.server_cpu_s, resumes.established),
    ) {
        (Some(l), Some(r)) if r > 0.0 => Some(l / r),
        _ => None,
    };
    let kb = |after: u64, n: u64| (after as f64 - rss_before as f64) / n.max(1) as f64;
    result.resume = Some(ResumeResult {
        unacked_per_session: k,
        unacked_delivered: delivered,
        server_pid: pid,
        rss_before_kb: rss_before,
        rss_attached_kb: rss_attached,
        rss_filled_kb: rss_filled,
        rss_detached_kb: rss_detached,
        detached,
        kb_per_attached_session: kb(rss_attached, login.established),
        kb_per_detached_session: kb(rss_detached, detached),
        rate_ratio: resumes.sessions_per_s / login.sessions_per_s.max(1e-9),
        h_mismatch: mismatch.load(std::sync::atomic::Ordering::Relaxed),
        resumes,
        server_cpu_ratio,
    });
    engine::output(&result, &sc)?;
    if sc.require_ratio > 0.0 {
        let r = result.resume.as_ref().expect("set above");
        let ok = r.resumes.established as f64 / r.resumes.attempted.max(1) as f64;
        anyhow::ensure!(
            ok >= sc.require_ratio,
            "only {}/{} sessions resumed ({:?})",
            r.resumes.established,
            r.resumes.attempted,
            r.resumes.first_error
        );
        anyhow::ensure!(
            r.h_mismatch == 0,
            "{} resumptions with a wrong h",
            r.h_mismatch
        );
        anyhow::ensure!(
            delivered as f64 >= sc.require_ratio * (k * detached) as f64,
            "only {delivered} of {} unacked messages arrived",
            k * detached
        );
    }
    Ok(())
}

/// Reads what the server sent until nothing arrives for 300 ms, counting
/// the stanzas into `h` (and answering pings).
async fn read_pending(l: &mut Live) {
    while let Ok(Ok(Event::Element(el))) =
        tokio::time::timeout(Duration::from_millis(300), l.conn.next_event()).await
    {
        receive(l, &el).await;
    }
}

/// One element from the server: a stanza counts into `h`; an iq request
/// (a ping) is answered, and the answer counts into `sent`.
async fn receive(l: &mut Live, el: &Element) {
    if !is_stanza(el) {
        return;
    }
    l.h = l.h.wrapping_add(1);
    if let Some(reply) = engine::iq_reply(el) {
        if l.conn.send(reply.as_bytes()).await.is_ok() {
            l.sent = l.sent.wrapping_add(1);
        }
    }
}

/// Sends `k` messages to `to` and reads until `k` benchmark messages
/// arrived (or `t` passed without one), answering pings but no `<r/>`.
/// Returns the messages received.
async fn fill(l: &mut Live, to: &str, k: u64, pad: &str, t: Duration) -> u64 {
    let mut out = String::new();
    for i in 0..k {
        out.push_str(&format!(
            "<message to='{to}' type='chat' id='u{i}'><body>unacked {i} {pad}</body></message>"
        ));
    }
    if l.conn.send(out.as_bytes()).await.is_err() {
        return 0;
    }
    l.sent = l.sent.wrapping_add(k as u32);
    let mut got = 0;
    while got < k {
        let ev = match tokio::time::timeout(t, l.conn.next_event()).await {
            Ok(Ok(ev)) => ev,
            _ => break,
        };
        let Event::Element(el) = ev else { break };
        if el.is("r", NS_SM) {
            continue;
        }
        receive(l, &el).await;
        if el.name() == "message" && el.attr("type") != Some("error") {
            got += 1;
        }
    }
    got
}
