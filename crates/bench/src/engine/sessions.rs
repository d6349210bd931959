//! The sessions: the storm that establishes them with bounded concurrency,
//! and each one's reader and writer tasks.

use super::now_ms;
use super::shared::Shared;
use crate::cli::{ConnArgs, ScenarioArgs};
use crate::client;
use crate::client::{Event, Inbound, Target, Transport, NS_SM, READ_CHUNK};
use crate::hist::Latency;
use crate::report::ConnectResult;
use starling_xml::Element;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

/// A live session: its user number and its outbox.
pub(crate) struct Session {
    pub(crate) user: u64,
    pub(crate) outbox: mpsc::Sender<Vec<u8>>,
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
