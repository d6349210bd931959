//! The `pep` scenario's setup over XMPP (logins, subscription handshakes,
//! publications) and the caps warm-up.

use super::layout::Layout;
use super::proto::{
    answer_iq, bare, close, closed, next_element, publish_iq, Caps, Next, NODES, NS_PUBSUB_OWNER,
    NS_ROSTER,
};
use crate::cli::PepArgs;
use crate::client::{Cause, Conn, SetupError, Target};
use crate::engine::Shared;
use crate::rate::SplitMix;
use crate::report::PepSetup;
use crate::rooms::{error_of, Failure};
use crate::{client, engine};
use starling_xml::Element;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// A roster: bare JID → subscription.
type Roster = HashMap<String, String>;

/// Logs in, fetches the roster, sends `<presence/>` (no capabilities).
async fn setup_login(
    target: &Target,
    n: u64,
    user: &str,
    password: &str,
    resource: &str,
) -> Result<(Conn, Roster), SetupError> {
    let mut conn = client::establish(
        target,
        target.source_for(n),
        user,
        password,
        resource,
        false,
    )
    .await?;
    let t = target.step_timeout;
    let err = |cause, detail: String| SetupError { cause, detail };
    let get = format!("<iq type='get' id='roster1'><query xmlns='{NS_ROSTER}'/></iq>");
    conn.send(get.as_bytes())
        .await
        .map_err(|e| err(Cause::Closed, format!("sending the roster get: {e}")))?;
    let deadline = tokio::time::Instant::now() + t;
    let mut sink = 0;
    let roster = loop {
        match next_element(&mut conn, &mut sink, Some(deadline)).await {
            Next::Timeout => return Err(err(Cause::Timeout, "no roster result".into())),
            Next::Closed => return Err(err(Cause::Closed, "closed before the roster".into())),
            Next::El(el) if el.name() == "iq" && el.attr("id") == Some("roster1") => {
                if el.attr("type") != Some("result") {
                    return Err(err(Cause::Stream, format!("roster get refused: {el}")));
                }
                break el
                    .get_child("query", NS_ROSTER)
                    .map(|q| {
                        q.children()
                            .filter(|i| i.name() == "item")
                            .filter_map(|i| {
                                Some((
                                    bare(i.attr("jid")?),
                                    i.attr("subscription").unwrap_or("none").to_owned(),
                                ))
                            })
                            .collect()
                    })
                    .unwrap_or_default();
            }
            Next::El(_) => {}
        }
    };
    conn.send(b"<presence/>")
        .await
        .map_err(|e| err(Cause::Closed, format!("sending presence: {e}")))?;
    Ok((conn, roster))
}

/// Whether a subscription state includes `to` (we see their presence).
fn has_to(sub: &str) -> bool {
    matches!(sub, "to" | "both")
}

/// Whether a subscription state includes `from` (they see ours).
fn has_from(sub: &str) -> bool {
    matches!(sub, "from" | "both")
}

/// The pairs of logged-in contacts (lower, higher) whose roster items
/// disagree: one side sees the other's presence (`to`) while the other
/// does not count it as a subscriber (`from`), or the reverse.
fn disagreements(layout: &Layout, rosters: &HashMap<u64, Roster>) -> Vec<(u64, u64)> {
    let state = |n: u64, m: u64| -> Option<String> {
        let r = rosters.get(&n)?;
        Some(
            r.get(&layout.jid(m))
                .cloned()
                .unwrap_or_else(|| "none".into()),
        )
    };
    let mut out = Vec::new();
    let mut users: Vec<u64> = rosters.keys().copied().collect();
    users.sort_unstable();
    for &n in &users {
        for (m, _) in layout.contacts_of(n) {
            if m < n {
                continue;
            }
            let (Some(a), Some(b)) = (state(n, m), state(m, n)) else {
                continue;
            };
            if has_to(&a) != has_from(&b) || has_from(&a) != has_to(&b) {
                out.push((n, m));
            }
        }
    }
    out
}

/// One user's setup after the logins.
struct SetupPlan {
    n: u64,
    conn: Conn,
    roster: Roster,
    me: String,
    /// The contacts (bare JIDs), and whether this user starts the
    /// handshake with each (it has the lower number).
    contacts: Vec<(String, bool)>,
    /// Contacts whose roster item disagrees with theirs (an earlier run
    /// interrupted, or a server that lost an update): removed (both sides
    /// reset) and subscribed again. Only the lower-numbered user of a pair
    /// has it here.
    reset: Vec<String>,
    nodes: usize,
    /// For the subscriptions.
    deadline: tokio::time::Instant,
    /// For the publications, from their start.
    timeout: Duration,
    caps: Arc<Caps>,
}

/// How one user's setup went.
#[derive(Default)]
struct SetupDone {
    contacts: u64,
    both: u64,
    already: u64,
    subscribes: u64,
    reset: u64,
    removed: u64,
    published: u64,
    publish_retries: u64,
    deleted: u64,
    subscribed_after: Option<Duration>,
    published_after: Option<Duration>,
    failures: Vec<Failure>,
}

/// What an outstanding iq of the setup is.
#[derive(Clone, Copy, PartialEq)]
enum Op {
    Remove,
    Reset,
    /// The item of node `k` of [`NODES`].
    Publish(usize),
    Delete,
}

/// Attempts at each publication of the setup (see [`publish_retry_after`]).
const PUBLISH_ATTEMPTS: u32 = 10;

/// How long user `n` waits before attempt `attempt` (1, 2…) at the
/// publication to node `k` that was refused: 200 ms doubled at each
/// attempt up to 6.4 s, plus up to as much again (jitter, so that the
/// users whose publications collided do not collide again): about a
/// minute at most over the 9 retries. (5 attempts 200 ms × attempt
/// apart left 453 of 1,503 publications refused at 501 users.)
///
/// Why retry at all: a server may refuse a publication because of other
/// users' concurrent ones, not because of anything in it. ejabberd 23.01
/// (mnesia) allocates every new node's id from one record,
/// `{pubsub_index, node}` (`pubsub_index:new/1` reads it, then writes
/// it); when many users auto-create their first nodes in the same
/// instant, mnesia aborts some of those transactions as deadlocks
/// (`{aborted, {cyclic, …, {pubsub_index, node}, write, …}}` in its
/// error.log), `mod_pubsub:do_transaction/4` turns the abort into an
/// error instead of letting mnesia restart the transaction, and
/// `publish_item/8` answers the failed auto-create with `item-not-found`
/// (43 of 303 publications refused at 101 users). A production server
/// never sees its users create their first nodes all in one instant;
/// a client whose publication fails tries again later. Retrying gives
/// every server the same published items; the retries are reported.
fn publish_retry_after(n: u64, k: usize, attempt: u32) -> Duration {
    let base = 200u64 << attempt.saturating_sub(1).min(5);
    let jitter = SplitMix::new(n ^ ((k as u64) << 32) ^ (u64::from(attempt) << 40)).next_u64();
    Duration::from_millis(base + jitter % (base + 1))
}

/// Subscriptions, publications, clean-up of one user; returns its
/// connection (closed by the caller once every user is done).
async fn setup_user(p: SetupPlan, t0: Instant) -> (Conn, SetupDone) {
    let SetupPlan {
        n,
        mut conn,
        roster,
        me,
        contacts,
        reset,
        nodes,
        deadline,
        timeout,
        caps,
    } = p;
    let mut out = SetupDone {
        contacts: contacts.len() as u64,
        ..SetupDone::default()
    };
    let mut pending: HashMap<String, Op> = HashMap::new();
    let mut batch = String::new();
    for (i, (jid, _)) in roster
        .iter()
        .filter(|(j, _)| !contacts.iter().any(|(c, _)| c == *j) && **j != me)
        .enumerate()
    {
        let id = format!("rm{i}");
        batch.push_str(&format!(
            "<iq type='set' id='{id}'><query xmlns='{NS_ROSTER}'><item jid='{}' subscription='remove'/></query></iq>",
            client::xml_escape(jid)
        ));
        pending.insert(id, Op::Remove);
    }
    let mut subs: HashMap<String, String> = contacts
        .iter()
        .map(|(c, _)| {
            (
                c.clone(),
                roster.get(c).cloned().unwrap_or_else(|| "none".into()),
            )
        })
        .collect();
    for (i, c) in reset.iter().enumerate() {
        let id = format!("reset{i}");
        batch.push_str(&format!(
            "<iq type='set' id='{id}'><query xmlns='{NS_ROSTER}'><item jid='{c}' subscription='remove'/></query></iq>"
        ));
        pending.insert(id, Op::Reset);
        subs.insert(c.clone(), "none".into());
    }
    out.already = subs.values().filter(|s| *s == "both").count() as u64;
    out.reset = reset.len() as u64;
    // One handshake at a time per pair, as clients do: the lower-numbered
    // user asks; the other approves and asks back; the first approves.
    // (Both asking at once makes concurrent changes to the same pair of
    // roster items, which a server may not serialise.) A user that lacks
    // `to` but already has `from` asks whatever its number: the other side
    // has nothing left to ask.
    let mut asked: HashSet<String> = HashSet::new();
    for (c, initiates) in &contacts {
        let s = &subs[c];
        if !has_to(s) && (*initiates || has_from(s)) {
            batch.push_str(&format!("<presence to='{c}' type='subscribe'/>"));
            asked.insert(c.clone());
        }
    }
    let mut bytes = 0;
    // Publications refused so far, per node; refused ones to send again
    // (when, node).
    let mut attempts = [0u32; NODES.len()];
    let mut retries: Vec<(tokio::time::Instant, usize)> = Vec::new();
    let mut alive = batch.is_empty() || conn.send(batch.as_bytes()).await.is_ok();
    // Handles what the server sends; false when the session is gone.
    macro_rules! serve {
        ($el:expr) => {{
            let el: Element = $el;
            let mut reply = String::new();
            if let Some(q) = el
                .get_child("query", NS_ROSTER)
                .filter(|_| el.name() == "iq" && el.attr("type") == Some("set"))
            {
                for it in q.children().filter(|i| i.name() == "item") {
                    let jid = bare(it.attr("jid").unwrap_or(""));
                    if let Some(s) = subs.get_mut(&jid) {
                        *s = match it.attr("subscription").unwrap_or("none") {
                            "remove" => "none",
                            x => x,
                        }
                        .to_owned();
                    }
                }
            }
            if el.name() == "presence" && el.attr("type") == Some("subscribe") {
                let from = bare(el.attr("from").unwrap_or(""));
                if let Some(s) = subs.get(&from) {
                    reply.push_str(&format!("<presence to='{from}' type='subscribed'/>"));
                    if !has_to(s) && asked.insert(from.clone()) {
                        reply.push_str(&format!("<presence to='{from}' type='subscribe'/>"));
                    }
                }
            }
            if el.name() == "iq" && matches!(el.attr("type"), Some("result") | Some("error")) {
                if let Some(op) = el.attr("id").and_then(|id| pending.remove(id)) {
                    let ok = el.attr("type") == Some("result");
                    match (op, ok) {
                        (Op::Remove, true) => out.removed += 1,
                        (Op::Delete, true) => out.deleted += 1,
                        (Op::Publish(_), true) => out.published += 1,
                        (Op::Publish(k), false) => {
                            attempts[k] += 1;
                            if attempts[k] < PUBLISH_ATTEMPTS {
                                out.publish_retries += 1;
                                let at = tokio::time::Instant::now()
                                    + publish_retry_after(n, k, attempts[k]);
                                retries.push((at, k));
                            } else {
                                let (cond, text) = error_of(&el);
                                out.failures.push((format!("publish:{cond}"), text));
                            }
                        }
                        (Op::Reset, _) => {}
                        // Already gone (item-not-found): nothing to clean.
                        (Op::Remove | Op::Delete, false) => {}
                    }
                }
            }
            if let Some((r, _)) = answer_iq(&el, &caps) {
                reply.push_str(&r);
            }
            reply.is_empty() || conn.send(reply.as_bytes()).await.is_ok()
        }};
    }
    // Mutual subscriptions.
    while alive && subs.values().any(|s| s != "both") {
        match next_element(&mut conn, &mut bytes, Some(deadline)).await {
            Next::Timeout => {
                let left = subs.values().filter(|s| *s != "both").count();
                out.failures.push((
                    "subscribe-timeout".into(),
                    format!(
                        "user {n}: {left} of {} contacts not mutually subscribed",
                        subs.len()
                    ),
                ));
                break;
            }
            Next::Closed => alive = false,
            Next::El(el) => alive = serve!(el),
        }
    }
    out.both = subs.values().filter(|s| *s == "both").count() as u64;
    out.subscribes = asked.len() as u64;
    if out.both == out.contacts {
        out.subscribed_after = Some(t0.elapsed());
    }
    // Publications, and the list's other nodes deleted.
    let mut batch = String::new();
    for (k, node) in NODES.iter().enumerate() {
        let (id, op) = if k < nodes {
            (format!("pub{k}"), Op::Publish(k))
        } else {
            (format!("del{k}"), Op::Delete)
        };
        batch.push_str(&match op {
            Op::Publish(_) => publish_iq(k, n, &id),
            _ => format!(
                "<iq type='set' id='{id}'><pubsub xmlns='{NS_PUBSUB_OWNER}'><delete node='{}'/></pubsub></iq>",
                node.node
            ),
        });
        pending.insert(id, op);
    }
    alive = alive && conn.send(batch.as_bytes()).await.is_ok();
    let deadline = tokio::time::Instant::now() + timeout;
    while alive && (!pending.is_empty() || !retries.is_empty()) {
        let now = tokio::time::Instant::now();
        if retries.iter().any(|(at, _)| *at <= now) {
            let mut batch = String::new();
            retries.retain(|&(at, k)| {
                if at > now {
                    return true;
                }
                let id = format!("pub{k}r{}", attempts[k]);
                batch.push_str(&publish_iq(k, n, &id));
                pending.insert(id, Op::Publish(k));
                false
            });
            if conn.send(batch.as_bytes()).await.is_err() {
                alive = false;
                break;
            }
        }
        let wake = retries
            .iter()
            .map(|(at, _)| *at)
            .min()
            .map_or(deadline, |at| at.min(deadline));
        match next_element(&mut conn, &mut bytes, Some(wake)).await {
            Next::Timeout if tokio::time::Instant::now() < deadline => {}
            Next::Timeout => {
                let left = pending
                    .values()
                    .filter(|o| matches!(o, Op::Publish(_)))
                    .count()
                    + retries.len();
                if left > 0 {
                    out.failures.push((
                        "publish-timeout".into(),
                        format!("user {n}: {left} publications unanswered"),
                    ));
                }
                break;
            }
            Next::Closed => alive = false,
            Next::El(el) => alive = serve!(el),
        }
    }
    if !alive {
        out.failures.push(closed());
    }
    if out.published == nodes as u64 {
        out.published_after = Some(t0.elapsed());
    }
    (conn, out)
}

/// The setup phase (see the module doc).
pub(super) async fn setup_phase(
    a: &PepArgs,
    target: &Arc<Target>,
    layout: &Layout,
    caps: &Arc<Caps>,
    shared: &Shared,
    pb: &indicatif::ProgressBar,
) -> PepSetup {
    let sc = &a.scenario;
    let (lo, hi) = (sc.conn.first_user, sc.conn.first_user + sc.conn.users);
    let t0 = Instant::now();
    pb.set_message("setup: logging in");
    let rosters: Arc<Mutex<HashMap<u64, Roster>>> = Arc::default();
    let mut conns = Vec::new();
    let conn_args = sc.conn.clone();
    let logins = engine::storm_with(
        sc,
        lo,
        hi,
        shared,
        |n, c| conns.push((n, c)),
        |n| {
            let (target, rosters) = (target.clone(), rosters.clone());
            let (user, password) = (conn_args.user(n), conn_args.password_of(n));
            let resource = sc.resource.clone();
            async move {
                let (conn, roster) = setup_login(&target, n, &user, &password, &resource).await?;
                rosters
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(n, roster);
                Ok(conn)
            }
        },
    )
    .await;
    pb.set_message("setup: subscribing and publishing");
    let t1 = Instant::now();
    let timeout = Duration::from_secs_f64(a.setup_timeout_secs);
    let deadline = tokio::time::Instant::now() + timeout;
    let nodes = a.nodes as usize;
    let resets = {
        let r = rosters.lock().unwrap_or_else(|e| e.into_inner());
        disagreements(layout, &r)
    };
    let mut set = JoinSet::new();
    for (n, conn) in conns {
        let roster = rosters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&n)
            .unwrap_or_default();
        let plan = SetupPlan {
            n,
            conn,
            roster,
            me: layout.jid(n),
            contacts: layout
                .contacts_of(n)
                .into_iter()
                .map(|(m, jid)| (jid, n < m))
                .collect(),
            reset: resets
                .iter()
                .filter(|(lo, _)| *lo == n)
                .map(|(_, hi)| layout.jid(*hi))
                .collect(),
            nodes,
            deadline,
            timeout,
            caps: caps.clone(),
        };
        set.spawn(setup_user(plan, t1));
    }
    let mut x = PepSetup {
        publish_expected: nodes as u64 * logins.established,
        ..PepSetup::default()
    };
    let mut done = Vec::new();
    let (mut sub_s, mut pub_s) = (0f64, 0f64);
    while let Some(r) = set.join_next().await {
        let Ok((conn, d)) = r else {
            *x.failures.entry("panic".into()).or_default() += 1;
            continue;
        };
        x.contacts_expected += d.contacts;
        x.contacts_both += d.both;
        x.contacts_already += d.already;
        x.subscribes_sent += d.subscribes;
        x.pairs_reset += d.reset;
        x.stale_items_removed += d.removed;
        x.published += d.published;
        x.publish_retries += d.publish_retries;
        x.stale_nodes_deleted += d.deleted;
        sub_s = sub_s.max(d.subscribed_after.map_or(0.0, |t| t.as_secs_f64()));
        pub_s = pub_s.max(d.published_after.map_or(0.0, |t| t.as_secs_f64()));
        for (cause, detail) in d.failures {
            *x.failures.entry(cause.clone()).or_default() += 1;
            if x.first_error.is_none() {
                x.first_error = Some(if detail.is_empty() {
                    cause
                } else {
                    format!("{cause}: {detail}")
                });
            }
        }
        done.push(conn);
        pb.set_message(format!("setup: {} users done", done.len()));
    }
    x.subscribe_s = sub_s;
    x.publish_s = pub_s;
    pb.set_message("setup: logging out");
    let mut set = JoinSet::new();
    for c in done {
        set.spawn(close(c));
    }
    while set.join_next().await.is_some() {}
    x.logins = logins;
    x.total_s = t0.elapsed().as_secs_f64();
    x
}

// ----- the caps warm-up -----

/// The caps warm-up (see the module doc): user `n` logs in, announces the
/// capabilities and answers the server's disco#info queries, until `quiet`
/// passes without one (a query answered, or none came: the server knew
/// the `ver` already, or does not ask), 20 s at most; then logs out.
/// Returns the queries answered.
pub(super) async fn warm_caps(
    target: &Target,
    conn_args: &crate::cli::ConnArgs,
    resource: &str,
    n: u64,
    caps: &Caps,
    quiet: Duration,
) -> Result<u64, SetupError> {
    let (user, password) = (conn_args.user(n), conn_args.password_of(n));
    let mut conn = client::establish(
        target,
        target.source_for(n),
        &user,
        &password,
        resource,
        false,
    )
    .await?;
    let err = |detail: &str| SetupError {
        cause: Cause::Closed,
        detail: detail.to_owned(),
    };
    conn.send(caps.presence().as_bytes())
        .await
        .map_err(|e| err(&format!("sending the caps presence: {e}")))?;
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut deadline = (tokio::time::Instant::now() + quiet).min(end);
    let (mut queries, mut sink) = (0, 0);
    loop {
        match next_element(&mut conn, &mut sink, Some(deadline)).await {
            Next::Timeout => break,
            Next::Closed => return Err(err("the server closed the warm-up session")),
            Next::El(el) => {
                if let Some((reply, disco)) = answer_iq(&el, caps) {
                    if disco {
                        queries += 1;
                        deadline = (tokio::time::Instant::now() + quiet).min(end);
                    }
                    conn.send(reply.as_bytes())
                        .await
                        .map_err(|e| err(&format!("answering: {e}")))?;
                }
            }
        }
    }
    close(conn).await;
    Ok(queries)
}

#[cfg(test)]
mod tests {
    use super::super::tests::args;
    use super::*;

    #[test]
    fn disagreeing_roster_items_are_found() {
        let l = Layout::of(&args(&["--users", "6", "--contacts", "2"]));
        let roster = |items: &[(&str, &str)]| -> Roster {
            items
                .iter()
                .map(|(j, s)| (j.to_string(), s.to_string()))
                .collect()
        };
        let rosters: HashMap<u64, Roster> = [
            // user1 sees user3 (to) but does not count it as a subscriber,
            // while user3 says both: a lost update.
            (
                1,
                roster(&[("user2@localhost", "both"), ("user3@localhost", "to")]),
            ),
            (2, roster(&[("user1@localhost", "both")])),
            (3, roster(&[("user1@localhost", "both")])),
            // Half-way through a handshake, consistent: user4 asked and was
            // approved (to), user5 approved (from).
            (4, roster(&[("user5@localhost", "to")])),
            (5, roster(&[("user4@localhost", "from")])),
            // user6's contacts did not log in or agree (none/none).
            (6, roster(&[])),
        ]
        .into_iter()
        .collect();
        assert_eq!(disagreements(&l, &rosters), vec![(1, 3)]);
        assert!(has_to("to") && has_to("both") && !has_to("from") && !has_to("none"));
        assert!(has_from("from") && has_from("both") && !has_from("to"));
    }

    #[test]
    fn refused_publications_back_off() {
        let ms = |a| publish_retry_after(7, 2, a).as_millis() as u64;
        assert!((200..=400).contains(&ms(1)), "{}", ms(1));
        assert!((400..=800).contains(&ms(2)), "{}", ms(2));
        assert!((6_400..=12_800).contains(&ms(9)), "{}", ms(9));
        let total: u64 = (1..PUBLISH_ATTEMPTS).map(ms).sum();
        assert!(total < 120_000, "{total} ms");
        assert_ne!(
            publish_retry_after(7, 2, 3),
            publish_retry_after(8, 2, 3),
            "jittered per user"
        );
    }
}
