//! The `pep` scenario's login storm and publish fan-out: every login's
//! notifications counted and timed, the results.

use super::layout::{group_of, Layout};
use super::proto::{
    answer_iq, close, fan_item_id, item, next_element, notification, notified_item_id,
    parse_fan_id, publish_item_iq, Caps, Next, PepNode,
};
use crate::client;
use crate::client::{Conn, SetupError, Target};
use crate::engine::{now_us, Shared};
use crate::hist::Latency;
use crate::report::{ConnectResult, PepFanout, PepResult};
use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch, Semaphore};

/// What the storm's tasks share.
pub(super) struct StormCtx {
    pub(super) target: Arc<Target>,
    pub(super) layout: Layout,
    pub(super) conn: crate::cli::ConnArgs,
    pub(super) resource: String,
    pub(super) nodes: Vec<PepNode>,
    pub(super) caps: Caps,
    pub(super) presence: String,
    pub(super) quiet: Duration,
    /// A window's longest.
    pub(super) window: Duration,
    pub(super) shared: Arc<Shared>,
    /// Every notification received, in windows or after.
    pub(super) notifications: AtomicU64,
    /// Per user (`n - first`): when its caps presence went out (µs since
    /// the epoch; 0: not yet, or never).
    pub(super) presence_at: Vec<AtomicU64>,
    /// Per user (`n - first`): its session is online after its window.
    pub(super) online: Vec<AtomicBool>,
    /// The fan-out phase.
    pub(super) fan: Mutex<Fan>,
    /// Fan-out notifications received (duplicates included).
    pub(super) fan_notifications: AtomicU64,
}

/// A fan-out publication.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Publication {
    /// When its publisher sent it (µs since the epoch; 0: never).
    pub(super) send_us: u64,
    /// Online sessions of the publisher's group when it was asked for.
    pub(super) expected: u64,
    /// Sessions that got it.
    pub(super) received: u64,
    /// Publish → the latest notification, µs.
    pub(super) last_us: u64,
}

/// What the fan-out phase's sessions share.
#[derive(Debug, Default)]
pub(super) struct Fan {
    pub(super) pubs: Vec<Publication>,
    /// Publish → each notification.
    each: Latency,
    duplicates: u64,
    errors: u64,
}

impl Fan {
    /// Records a notification of publication `i` sent at `send_us` that
    /// arrived at `now_us` in a session that already got `seen`; false if
    /// it is not one of this run's.
    fn receipt(&mut self, i: u64, send_us: u64, now_us: u64, seen: &mut HashSet<u64>) -> bool {
        let Some(p) = self.pubs.get_mut(i as usize) else {
            return false;
        };
        if p.send_us == 0 || p.send_us != send_us {
            return false;
        }
        if !seen.insert(i) {
            self.duplicates += 1;
            return true;
        }
        let us = now_us.saturating_sub(send_us);
        p.received += 1;
        p.last_us = p.last_us.max(us);
        self.each.record_us(us);
        true
    }

    /// The phase's result.
    pub(super) fn result(&self, node: &str, publications: u64, interval_ms: u64) -> PepFanout {
        let mut last = Latency::new();
        let mut f = PepFanout {
            node: node.to_owned(),
            publications,
            interval_ms,
            errors: self.errors,
            duplicates: self.duplicates,
            ..PepFanout::default()
        };
        for p in self.pubs.iter().filter(|p| p.send_us != 0) {
            f.sent += 1;
            f.max_receivers = f.max_receivers.max(p.expected);
            f.expected += p.expected;
            f.delivered += p.received.min(p.expected);
            if p.received >= p.expected {
                f.complete += 1;
                last.record_us(p.last_us);
            }
        }
        f.latency = self.each.summary();
        f.last_latency = last.summary();
        f
    }
}

/// Publishes fan-out publication `i` from user `n`'s session: false if the
/// connection failed.
async fn publish_fan(ctx: &StormCtx, conn: &mut Conn, n: u64, i: u64) -> bool {
    let send_us = now_us();
    if let Some(p) = ctx.fan.lock().unwrap().pubs.get_mut(i as usize) {
        p.send_us = send_us;
    }
    let (_, payload) = item(0, n);
    let iq = publish_item_iq(
        0,
        &fan_item_id(send_us, i),
        &payload,
        &format!("fan-pub-{i}"),
    );
    conn.send(iq.as_bytes()).await.is_ok()
}

/// One login, at the end of its window.
#[derive(Debug, Default)]
struct LoginStats {
    /// The user.
    n: u64,
    setup_us: u64,
    bound_unix_ms: u64,
    expected: u64,
    received: u64,
    received_expected: u64,
    duplicates: u64,
    unexpected: u64,
    last_us: Option<u64>,
    after_presence_us: Option<u64>,
    window_end_unix_ms: u64,
    /// When the caps presence went out (µs since the epoch).
    presence_unix_us: u64,
    /// The publisher of every expected (publisher, node) pair that did not
    /// arrive in the window.
    missing_from: Vec<u64>,
    bytes: u64,
    presences: u64,
    caps_queries: u64,
    closed: bool,
}

/// A login's report to the coordinator.
pub(super) struct LoginReport {
    at_unix_ms: u64,
    outcome: Result<LoginStats, SetupError>,
}

/// What a session saw after its window.
#[derive(Debug, Default)]
pub(super) struct Tail {
    after_window: u64,
    duplicates: u64,
    unexpected: u64,
    caps_queries: u64,
}

/// One login of the storm: waits for `at`, logs in, sends the caps
/// presence, counts notifications until the window closes, reports, then
/// keeps counting until `stop`, and closes.
pub(super) async fn login(
    ctx: Arc<StormCtx>,
    n: u64,
    at: tokio::time::Instant,
    sem: Arc<Semaphore>,
    reports: mpsc::UnboundedSender<LoginReport>,
    mut stop: watch::Receiver<bool>,
    mut publish: mpsc::UnboundedReceiver<u64>,
) -> Tail {
    tokio::time::sleep_until(at).await;
    let permit = sem.acquire_owned().await.ok();
    let t0 = Instant::now();
    let (user, password) = (ctx.conn.user(n), ctx.conn.password_of(n));
    let target = &ctx.target;
    let r = client::as_device(
        n,
        client::establish(
            target,
            target.source_for(n),
            &user,
            &password,
            &ctx.resource,
            false,
        ),
    )
    .await;
    drop(permit);
    let mut conn = match r {
        Ok(c) => c,
        Err(e) => {
            ctx.shared.failed.fetch_add(1, Relaxed);
            let _ = reports.send(LoginReport {
                at_unix_ms: now_us() / 1000,
                outcome: Err(e),
            });
            return Tail::default();
        }
    };
    ctx.shared.established.fetch_add(1, Relaxed);
    let expected = ctx.layout.expected(n, &ctx.nodes);
    let mut s = LoginStats {
        n,
        setup_us: t0.elapsed().as_micros() as u64,
        bound_unix_ms: now_us() / 1000,
        expected: expected.len() as u64,
        ..LoginStats::default()
    };
    let mut seen: HashSet<(String, String)> = HashSet::new();
    let tp = Instant::now();
    s.presence_unix_us = now_us();
    if let Some(at) = ctx.presence_at.get((n - ctx.layout.first) as usize) {
        at.store(s.presence_unix_us, Relaxed);
    }
    s.closed = conn.send(ctx.presence.as_bytes()).await.is_err();
    // Until every expected notification arrived (then `quiet` more, for
    // duplicates and extras), or `window` at most: a server that delivers
    // later than another (its own caps round trips, a backlog) is waited
    // for, not counted as missing.
    let window_end = tokio::time::Instant::now() + ctx.window;
    let mut deadline = if expected.is_empty() {
        tokio::time::Instant::now() + ctx.quiet
    } else {
        window_end
    };
    while !s.closed {
        let el = match next_element(&mut conn, &mut s.bytes, Some(deadline)).await {
            Next::Timeout => break,
            Next::Closed => {
                s.closed = true;
                break;
            }
            Next::El(el) => el,
        };
        if let Some(key) = notification(&el) {
            ctx.notifications.fetch_add(1, Relaxed);
            s.received += 1;
            s.last_us = Some(t0.elapsed().as_micros() as u64);
            s.after_presence_us = Some(tp.elapsed().as_micros() as u64);
            if !expected.contains(&key) {
                s.unexpected += 1;
            } else if seen.contains(&key) {
                s.duplicates += 1;
            } else {
                s.received_expected += 1;
            }
            seen.insert(key);
            if s.received_expected == s.expected {
                deadline = (tokio::time::Instant::now() + ctx.quiet).min(window_end + ctx.quiet);
            }
        } else if el.name() == "presence" {
            s.presences += 1;
        } else if let Some((reply, disco)) = answer_iq(&el, &ctx.caps) {
            s.caps_queries += u64::from(disco);
            if conn.send(reply.as_bytes()).await.is_err() {
                s.closed = true;
            }
        }
    }
    s.window_end_unix_ms = now_us() / 1000;
    for m in group_of(ctx.layout.first, ctx.layout.users, ctx.layout.contacts, n) {
        let jid = ctx.layout.jid(m);
        for node in &ctx.nodes {
            if !seen.contains(&(jid.clone(), node.node.to_owned())) {
                s.missing_from.push(m);
            }
        }
    }
    let gone = s.closed;
    let me = (n - ctx.layout.first) as usize;
    if !gone {
        ctx.online[me].store(true, Relaxed);
    }
    let _ = reports.send(LoginReport {
        at_unix_ms: s.bound_unix_ms,
        outcome: Ok(s),
    });
    drop(reports);
    let mut tail = Tail::default();
    if gone {
        return tail;
    }
    let mut sink = 0;
    let mut fan_seen = HashSet::new();
    let mut open = true;
    while !*stop.borrow() {
        let el = tokio::select! {
            r = next_element(&mut conn, &mut sink, None) => match r {
                Next::El(el) => el,
                _ => {
                    open = false;
                    break;
                }
            },
            Some(i) = publish.recv() => {
                if !publish_fan(&ctx, &mut conn, n, i).await {
                    open = false;
                    break;
                }
                continue;
            }
            _ = stop.changed() => break,
        };
        if let Some(key) = notification(&el) {
            if let Some((send_us, i)) = notified_item_id(&el).and_then(parse_fan_id) {
                let now = now_us();
                if ctx
                    .fan
                    .lock()
                    .unwrap()
                    .receipt(i, send_us, now, &mut fan_seen)
                {
                    ctx.fan_notifications.fetch_add(1, Relaxed);
                    continue;
                }
            }
            ctx.notifications.fetch_add(1, Relaxed);
            tail.after_window += 1;
            if !expected.contains(&key) {
                tail.unexpected += 1;
            } else if !seen.insert(key) {
                tail.duplicates += 1;
            }
        } else if el.name() == "iq"
            && el.attr("type") == Some("error")
            && el.attr("id").is_some_and(|id| id.starts_with("fan-pub-"))
        {
            ctx.fan.lock().unwrap().errors += 1;
        } else if let Some((reply, disco)) = answer_iq(&el, &ctx.caps) {
            tail.caps_queries += u64::from(disco);
            if conn.send(reply.as_bytes()).await.is_err() {
                open = false;
                break;
            }
        }
    }
    ctx.online[me].store(false, Relaxed);
    if open {
        close(conn).await;
    }
    tail
}

/// The result of the storm from the logins' reports and tails;
/// `presence_of(m)`: when user `m`'s caps presence went out (µs since the
/// epoch, 0: never).
pub(super) fn storm_result(
    started_unix_ms: u64,
    reports: Vec<LoginReport>,
    tails: &[Tail],
    presence_of: impl Fn(u64) -> u64,
) -> (ConnectResult, PepResult) {
    let mut c = ConnectResult {
        attempted: reports.len() as u64,
        started_unix_ms,
        finished_unix_ms: started_unix_ms,
        ..ConnectResult::default()
    };
    let mut p = PepResult::default();
    let (mut setup, mut last, mut after) = (Latency::new(), Latency::new(), Latency::new());
    let (mut bytes, mut presences, mut window_end) = (0u64, 0u64, started_unix_ms);
    for r in reports {
        c.finished_unix_ms = c.finished_unix_ms.max(r.at_unix_ms);
        let s = match r.outcome {
            Ok(s) => s,
            Err(e) => {
                c.failed += 1;
                *c.failures.entry(e.cause.name().to_owned()).or_default() += 1;
                if c.first_error.is_none() {
                    c.first_error = Some(e.to_string());
                }
                continue;
            }
        };
        c.established += 1;
        setup.record_us(s.setup_us);
        if let (Some(l), Some(a)) = (s.last_us, s.after_presence_us) {
            last.record_us(l);
            after.record_us(a);
        }
        p.expected += s.expected;
        p.received += s.received;
        p.received_expected += s.received_expected;
        p.duplicates += s.duplicates;
        p.unexpected += s.unexpected;
        p.caps_queries += s.caps_queries;
        p.closed_in_window += u64::from(s.closed);
        for &m in &s.missing_from {
            let t = presence_of(m);
            if m == s.n || (t != 0 && t < s.presence_unix_us) {
                p.missing_online_first += 1;
            } else {
                p.missing_later += 1;
            }
        }
        p.complete_logins += u64::from(s.received_expected == s.expected);
        bytes += s.bytes;
        presences += s.presences;
        window_end = window_end.max(s.window_end_unix_ms);
    }
    for t in tails {
        p.after_window += t.after_window;
        p.duplicates += t.duplicates;
        p.unexpected += t.unexpected;
        p.caps_queries += t.caps_queries;
    }
    c.setup_latency = setup.summary();
    c.finalize();
    p.logins = c.established;
    p.missing = p.expected.saturating_sub(p.received_expected);
    let per = |x: u64| x as f64 / p.logins.max(1) as f64;
    p.expected_per_login = per(p.expected);
    p.received_per_login = per(p.received);
    p.bytes_per_login = per(bytes);
    p.presences_per_login = per(presences);
    p.latency = last.summary();
    p.after_presence_latency = after.summary();
    p.duration_s = window_end.saturating_sub(started_unix_ms) as f64 / 1000.0;
    if p.duration_s > 0.0 {
        p.notifications_per_s = p.received as f64 / p.duration_s;
    }
    (c, p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Cause;

    #[test]
    fn fan_out_receipts_are_timed_and_counted() {
        let mut f = Fan::default();
        for expected in [3, 2, 4] {
            f.pubs.push(Publication {
                expected,
                ..Publication::default()
            });
        }
        f.pubs[0].send_us = 1_000;
        f.pubs[1].send_us = 2_000;
        let (mut a, mut b, mut c) = (HashSet::new(), HashSet::new(), HashSet::new());
        assert!(f.receipt(0, 1_000, 3_000, &mut a));
        assert!(f.receipt(0, 1_000, 5_000, &mut b));
        assert!(f.receipt(0, 1_000, 4_000, &mut c));
        assert!(f.receipt(0, 1_000, 9_000, &mut c), "a duplicate is one");
        assert!(f.receipt(1, 2_000, 2_500, &mut a));
        assert!(!f.receipt(1, 1_999, 2_500, &mut b), "an earlier run's");
        assert!(!f.receipt(2, 0, 2_500, &mut b), "not sent");
        assert!(!f.receipt(9, 2_000, 2_500, &mut b), "no such publication");
        f.errors = 1;
        let r = f.result("urn:xmpp:avatar:metadata", 4, 100);
        assert_eq!(
            (
                r.publications,
                r.sent,
                r.errors,
                r.interval_ms,
                r.max_receivers
            ),
            (4, 2, 1, 100, 3)
        );
        assert_eq!(
            (r.expected, r.delivered, r.duplicates, r.complete),
            (5, 4, 1, 1)
        );
        assert_eq!(r.latency.count, 4);
        assert_eq!(r.latency.p50_ms, 2.0);
        assert!((r.latency.max_ms - 4.0).abs() < 0.01, "{:?}", r.latency);
        assert_eq!(r.last_latency.count, 1, "the complete publication only");
        assert!((r.last_latency.max_ms - 4.0).abs() < 0.01);
    }

    #[test]
    fn storm_result_counts_every_outcome() {
        let ok = |expected, received, received_expected, last: Option<u64>| LoginReport {
            at_unix_ms: 1_500,
            outcome: Ok(LoginStats {
                setup_us: 20_000,
                bound_unix_ms: 1_500,
                expected,
                received,
                received_expected,
                last_us: last,
                after_presence_us: last.map(|l| l - 10_000),
                window_end_unix_ms: 3_000,
                bytes: 10_240,
                presences: 4,
                caps_queries: 1,
                ..LoginStats::default()
            }),
        };
        let mut dup = ok(6, 8, 6, Some(50_000));
        if let Ok(s) = &mut dup.outcome {
            s.duplicates = 1;
            s.unexpected = 1;
        }
        // User 2 misses one item of its own, one of user 1 (online
        // first) and one of user 3 (later): 3 of 6 received.
        let mut partial = ok(6, 3, 3, Some(40_000));
        if let Ok(s) = &mut partial.outcome {
            s.n = 2;
            s.presence_unix_us = 1_600_000;
            s.missing_from = vec![1, 2, 3];
        }
        let reports = vec![
            ok(6, 6, 6, Some(30_000)),
            partial,
            dup,
            LoginReport {
                at_unix_ms: 2_000,
                outcome: Err(SetupError {
                    cause: Cause::Auth,
                    detail: "failure not-authorized".into(),
                }),
            },
        ];
        let tails = [
            Tail {
                after_window: 2,
                duplicates: 1,
                ..Tail::default()
            },
            Tail::default(),
        ];
        let presence_of = |m: u64| [0, 1_550_000, 1_600_000, 1_700_000][m as usize];
        let (c, p) = storm_result(1_000, reports, &tails, presence_of);
        assert_eq!((c.attempted, c.established, c.failed), (4, 3, 1));
        assert_eq!(c.failures["auth"], 1);
        assert_eq!(c.duration_s, 1.0);
        assert_eq!(c.sessions_per_s, 3.0);
        assert_eq!(c.setup_latency.count, 3);
        assert_eq!((p.logins, p.expected, p.received), (3, 18, 17));
        assert_eq!((p.received_expected, p.missing), (15, 3));
        assert_eq!((p.missing_online_first, p.missing_later), (2, 1));
        assert_eq!((p.duplicates, p.unexpected, p.after_window), (2, 1, 2));
        assert_eq!(p.complete_logins, 2);
        assert_eq!(p.caps_queries, 3);
        assert_eq!(p.expected_per_login, 6.0);
        assert_eq!(p.bytes_per_login, 10_240.0);
        assert_eq!(p.latency.count, 3);
        assert!((p.latency.max_ms - 50.0).abs() < 0.1);
        assert!((p.after_presence_latency.p50_ms - 30.0).abs() < 0.1);
        assert_eq!(p.duration_s, 2.0);
        assert_eq!(p.notifications_per_s, 8.5);
    }
}
