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
//!      publications: see [`publish_retry_after`]), the retries reported;
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

use crate::cli::PepArgs;
use crate::client::{self, Cause, Conn, Event, SetupError, Target, READ_CHUNK};
use crate::engine::{self, now_us, Scenario, Shared};
use crate::hist::Latency;
use crate::procmem;
use crate::rate::{RateSchedule, SplitMix};
use crate::report::{ConnectResult, PepFanout, PepMemory, PepResult, PepSetup};
use crate::rooms::{error_of, wait_quiet, Failure};
use base64::Engine as _;
use starling_xml::Element;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt as _;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;

/// XEP-0060.
pub const NS_PUBSUB: &str = "http://jabber.org/protocol/pubsub";
/// XEP-0060 owner use cases.
pub const NS_PUBSUB_OWNER: &str = "http://jabber.org/protocol/pubsub#owner";
/// XEP-0060 notifications.
pub const NS_EVENT: &str = "http://jabber.org/protocol/pubsub#event";
/// XEP-0115.
pub const NS_CAPS: &str = "http://jabber.org/protocol/caps";
/// XEP-0030.
pub const NS_DISCO_INFO: &str = "http://jabber.org/protocol/disco#info";
/// RFC 6121 rosters.
pub const NS_ROSTER: &str = "jabber:iq:roster";
const NS_FRAMING: &str = "urn:ietf:params:xml:ns:xmpp-framing";
const NS_STREAMS: &str = "http://etherx.jabber.org/streams";
/// The `node` of the bench's capabilities (XEP-0115 §4: the software's URI).
pub const CAPS_NODE: &str = "https://example.invalid/starling/bench";
/// The bench client's disco identity: category, type, xml:lang, name.
const IDENTITY: [&str; 4] = ["client", "pc", "", "starling-bench"];
/// The bench client's features besides the `+notify` ones.
const BASE_FEATURES: [&str; 3] = [NS_CAPS, NS_DISCO_INFO, "urn:xmpp:ping"];

/// A PEP node the users publish to.
#[derive(Clone, Copy, Debug)]
pub struct PepNode {
    /// The node name.
    pub node: &'static str,
    /// Published with `publish-options` access model `open` (OMEMO device
    /// lists); else the server's default (`presence`).
    pub open: bool,
}

/// The nodes, in `--nodes` order: what a modern client publishes.
pub const NODES: [PepNode; 8] = [
    PepNode {
        node: "urn:xmpp:avatar:metadata",
        open: false,
    },
    PepNode {
        node: "http://jabber.org/protocol/nick",
        open: false,
    },
    PepNode {
        node: "eu.siacs.conversations.axolotl.devicelist",
        open: true,
    },
    PepNode {
        node: "urn:xmpp:omemo:2:devices",
        open: true,
    },
    PepNode {
        node: "http://jabber.org/protocol/mood",
        open: false,
    },
    PepNode {
        node: "http://jabber.org/protocol/activity",
        open: false,
    },
    PepNode {
        node: "http://jabber.org/protocol/tune",
        open: false,
    },
    PepNode {
        node: "http://jabber.org/protocol/geoloc",
        open: false,
    },
];

/// The item user `n` publishes to node `k` of [`NODES`]: (id, payload).
fn item(k: usize, n: u64) -> (String, String) {
    let mut rng = SplitMix::new(n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (k as u64 + 1));
    let mut hex = || -> String {
        (0..5)
            .map(|_| format!("{:08x}", rng.next_u64() as u32))
            .collect()
    };
    let (a, b) = (hex(), hex());
    let device = |s: &str| u32::from_str_radix(&s[..8], 16).unwrap_or(1) & 0x7fff_ffff;
    let (d1, d2, d3) = (device(&a), device(&b), device(&a[8..]));
    let current = "current".to_owned();
    match k {
        0 => (
            a.clone(),
            format!(
                "<metadata xmlns='urn:xmpp:avatar:metadata'>\
                 <info bytes='{}' height='192' id='{a}' type='image/png' width='192'/>\
                 <info bytes='{}' height='64' id='{b}' type='image/webp' width='64' \
                 url='https://example.invalid/avatars/{b}.webp'/></metadata>",
                20_000 + n % 10_000,
                3_000 + n % 1_000
            ),
        ),
        1 => (
            current,
            format!("<nick xmlns='http://jabber.org/protocol/nick'>Bench user {n}</nick>"),
        ),
        2 => (
            current,
            format!(
                "<list xmlns='eu.siacs.conversations.axolotl'><device id='{d1}'/>\
                 <device id='{d2}'/><device id='{d3}'/></list>"
            ),
        ),
        3 => (
            current,
            format!(
                "<devices xmlns='urn:xmpp:omemo:2'><device id='{d1}' label='Phone'/>\
                 <device id='{d2}' label='Laptop'/><device id='{d3}' label='Desktop'/></devices>"
            ),
        ),
        4 => (
            current,
            "<mood xmlns='http://jabber.org/protocol/mood'><happy/>\
             <text>Measuring logins with many contacts</text></mood>"
                .to_owned(),
        ),
        5 => (
            current,
            "<activity xmlns='http://jabber.org/protocol/activity'><working><coding/></working>\
             <text>Benchmarking personal eventing</text></activity>"
                .to_owned(),
        ),
        6 => (
            current,
            format!(
                "<tune xmlns='http://jabber.org/protocol/tune'><artist>Yes</artist>\
                 <length>686</length><rating>8</rating><source>Yessongs</source>\
                 <title>Heart of the Sunrise</title><track>{}</track>\
                 <uri>https://example.invalid/tunes/{a}</uri></tune>",
                1 + n % 12
            ),
        ),
        _ => (
            current,
            format!(
                "<geoloc xmlns='http://jabber.org/protocol/geoloc'><accuracy>20</accuracy>\
                 <country>Italy</country><lat>45.{:04}</lat><locality>Venice</locality>\
                 <lon>12.{:04}</lon><timestamp>2026-11-26T12:00:00Z</timestamp></geoloc>",
                n % 10_000,
                (n * 7) % 10_000
            ),
        ),
    }
}

/// The publish iq of user `n`'s item on node `k`, with id `id`.
fn publish_iq(k: usize, n: u64, id: &str) -> String {
    let (item_id, payload) = item(k, n);
    publish_item_iq(k, &item_id, &payload, id)
}

/// The publish iq of `payload` as item `item_id` on node `k`, with id `id`.
fn publish_item_iq(k: usize, item_id: &str, payload: &str, id: &str) -> String {
    let options = if NODES[k].open {
        "<publish-options><x xmlns='jabber:x:data' type='submit'>\
         <field var='FORM_TYPE' type='hidden'>\
         <value>http://jabber.org/protocol/pubsub#publish-options</value></field>\
         <field var='pubsub#access_model'><value>open</value></field></x></publish-options>"
    } else {
        ""
    };
    format!(
        "<iq type='set' id='{id}'><pubsub xmlns='{NS_PUBSUB}'><publish node='{}'>\
         <item id='{item_id}'>{payload}</item></publish>{options}</pubsub></iq>",
        NODES[k].node
    )
}

// ----- XEP-0115 -----

/// SHA-1 for the caps hash (XEP-0115 §5.1 uses it).
fn sha1(data: &[u8]) -> [u8; 20] {
    use sha1::Digest;
    sha1::Sha1::digest(data).into()
}

/// The XEP-0115 §5.1 verification string of identities (category, type,
/// xml:lang, name) and features (no extended forms): each identity
/// `category/type/lang/name<`, sorted, then each feature `var<`, sorted.
pub fn verification_string(identities: &[[&str; 4]], features: &[&str]) -> String {
    let mut ids: Vec<String> = identities.iter().map(|i| i.join("/")).collect();
    ids.sort();
    let mut fs: Vec<&str> = features.to_vec();
    fs.sort_unstable();
    let mut s = String::new();
    for x in ids.iter().map(String::as_str).chain(fs) {
        s.push_str(x);
        s.push('<');
    }
    s
}

/// The `ver` of [`verification_string`]: base64 of its SHA-1 (§5.1 steps
/// 9–10, hash `sha-1`).
pub fn caps_ver(identities: &[[&str; 4]], features: &[&str]) -> String {
    let s = verification_string(identities, features);
    base64::engine::general_purpose::STANDARD.encode(sha1(s.as_bytes()))
}

/// The capabilities every bench session announces.
#[derive(Clone, Debug)]
pub struct Caps {
    /// The features: `caps`, `disco#info`, `urn:xmpp:ping` and `NODE+notify` per node.
    pub features: Vec<String>,
    /// Their `ver`.
    pub ver: String,
}

impl Caps {
    /// For the published `nodes`.
    pub fn new(nodes: &[PepNode]) -> Caps {
        let mut features: Vec<String> = BASE_FEATURES.iter().map(|f| f.to_string()).collect();
        features.extend(nodes.iter().map(|n| format!("{}+notify", n.node)));
        let refs: Vec<&str> = features.iter().map(String::as_str).collect();
        let ver = caps_ver(&[IDENTITY], &refs);
        Caps { features, ver }
    }

    /// Available presence with the capabilities (§4).
    pub fn presence(&self) -> String {
        format!(
            "<presence><c xmlns='{NS_CAPS}' hash='sha-1' node='{CAPS_NODE}' ver='{}'/></presence>",
            self.ver
        )
    }

    /// The disco#info result for a query with id `id` from `to`, for
    /// `node` (echoed as asked, §6.3).
    pub fn disco_result(&self, id: &str, to: Option<&str>, node: Option<&str>) -> String {
        let esc = client::xml_escape;
        let to = to.map(|t| format!(" to='{}'", esc(t))).unwrap_or_default();
        let node = node
            .map(|n| format!(" node='{}'", esc(n)))
            .unwrap_or_default();
        let [category, kind, _, name] = IDENTITY;
        let features: String = self
            .features
            .iter()
            .map(|f| format!("<feature var='{}'/>", esc(f)))
            .collect();
        format!(
            "<iq type='result' id='{}'{to}><query xmlns='{NS_DISCO_INFO}'{node}>\
             <identity category='{category}' type='{kind}' name='{name}'/>{features}</query></iq>",
            esc(id)
        )
    }
}

/// The answer to an iq the server sent (`get`/`set`): our disco#info
/// (`true`: it was one), a result for a roster push, the engine's answer
/// otherwise (pings). `None` for results and errors.
fn answer_iq(el: &Element, caps: &Caps) -> Option<(String, bool)> {
    if el.name() != "iq" || !matches!(el.attr("type"), Some("get") | Some("set")) {
        return None;
    }
    let id = el.attr("id").unwrap_or("");
    if el.attr("type") == Some("get") {
        if let Some(q) = el.get_child("query", NS_DISCO_INFO) {
            return Some((caps.disco_result(id, el.attr("from"), q.attr("node")), true));
        }
    }
    if el.attr("type") == Some("set") && el.has_child("query", NS_ROSTER) {
        return Some((
            format!("<iq type='result' id='{}'/>", client::xml_escape(id)),
            false,
        ));
    }
    engine::iq_reply(el).map(|r| (r, false))
}

/// The item id of fan-out publication `i`, sent at `send_us` (µs since
/// the epoch).
fn fan_item_id(send_us: u64, i: u64) -> String {
    format!("fan-{send_us}-{i}")
}

/// Inverse of [`fan_item_id`]: (send time, publication).
fn parse_fan_id(id: &str) -> Option<(u64, u64)> {
    let (send, i) = id.strip_prefix("fan-")?.split_once('-')?;
    Some((send.parse().ok()?, i.parse().ok()?))
}

/// The id of the first item of notification `el`, if any.
fn notified_item_id(el: &Element) -> Option<&str> {
    el.get_child("event", NS_EVENT)?
        .get_child("items", NS_EVENT)?
        .get_child("item", NS_EVENT)?
        .attr("id")
}

/// A bare JID, lower-cased.
fn bare(jid: &str) -> String {
    jid.split('/').next().unwrap_or(jid).to_ascii_lowercase()
}

/// If `el` is a PEP notification: (publisher's bare JID, node).
fn notification(el: &Element) -> Option<(String, String)> {
    if el.name() != "message" || el.attr("type") == Some("error") {
        return None;
    }
    let event = el.get_child("event", NS_EVENT)?;
    let node = event.children().find_map(|c| c.attr("node")).unwrap_or("");
    Some((bare(el.attr("from").unwrap_or("")), node.to_owned()))
}

// ----- layout -----

/// The users of user `n`'s group (groups of `contacts + 1` consecutive
/// users from `first`; the last one may be smaller).
pub(crate) fn group_of(first: u64, users: u64, contacts: u64, n: u64) -> std::ops::Range<u64> {
    let size = contacts + 1;
    let lo = first + (n - first) / size * size;
    lo..(lo + size).min(first + users)
}

/// The layout and the JIDs.
struct Layout {
    first: u64,
    users: u64,
    contacts: u64,
    domain: String,
    pattern: String,
}

impl Layout {
    fn of(a: &PepArgs) -> Layout {
        let c = &a.scenario.conn;
        Layout {
            first: c.first_user,
            users: c.users,
            contacts: a.contacts,
            domain: c.domain.to_ascii_lowercase(),
            pattern: c.user_pattern.clone(),
        }
    }

    fn jid(&self, n: u64) -> String {
        format!(
            "{}@{}",
            self.pattern
                .replace("{n}", &n.to_string())
                .to_ascii_lowercase(),
            self.domain
        )
    }

    /// User `n`'s contacts: (number, bare JID).
    fn contacts_of(&self, n: u64) -> Vec<(u64, String)> {
        group_of(self.first, self.users, self.contacts, n)
            .filter(|&m| m != n)
            .map(|m| (m, self.jid(m)))
            .collect()
    }

    /// The (publisher, node) pairs user `n` should be notified of.
    fn expected(&self, n: u64, nodes: &[PepNode]) -> HashSet<(String, String)> {
        group_of(self.first, self.users, self.contacts, n)
            .flat_map(|m| {
                let jid = self.jid(m);
                nodes.iter().map(move |p| (jid.clone(), p.node.to_owned()))
            })
            .collect()
    }

    fn groups(&self) -> u64 {
        self.users.div_ceil(self.contacts + 1)
    }

    /// The users of group `g`.
    fn group(&self, g: u64) -> std::ops::Range<u64> {
        group_of(
            self.first,
            self.users,
            self.contacts,
            self.first + g * (self.contacts + 1),
        )
    }
}

/// Fan-out publication `i`'s publisher: the online member of group
/// `i mod groups` at or after its turn (`i / groups`, rotating), and the
/// online members of that group (the expected receivers, itself
/// included); `None` when none is online.
fn pick_publisher(layout: &Layout, i: u64, online: impl Fn(u64) -> bool) -> Option<(u64, u64)> {
    let group = layout.group(i % layout.groups());
    let size = group.end - group.start;
    let turn = i / layout.groups();
    let publisher = (0..size)
        .map(|k| group.start + (turn + k) % size)
        .find(|&m| online(m))?;
    Some((publisher, group.filter(|&m| online(m)).count() as u64))
}

// ----- reading -----

/// What [`next_element`] got.
enum Next {
    El(Element),
    Timeout,
    Closed,
}

/// The next element from the server, counting the bytes read into
/// `bytes`; `Timeout` at `deadline`.
async fn next_element(
    conn: &mut Conn,
    bytes: &mut u64,
    deadline: Option<tokio::time::Instant>,
) -> Next {
    let mut buf = [0u8; READ_CHUNK];
    loop {
        match conn.inbound.parse_pending() {
            Ok(Some(Event::Element(el))) => {
                if el.ns() == NS_FRAMING {
                    if el.name() == "close" {
                        return Next::Closed;
                    }
                    continue;
                }
                if el.is("error", NS_STREAMS) {
                    return Next::Closed;
                }
                return Next::El(el);
            }
            Ok(Some(Event::Header)) => continue,
            Ok(Some(Event::Closed)) | Err(_) => return Next::Closed,
            Ok(None) => {}
        }
        let read = conn.io.read(&mut buf);
        let r = match deadline {
            Some(d) => match tokio::time::timeout_at(d, read).await {
                Err(_) => return Next::Timeout,
                Ok(r) => r,
            },
            None => read.await,
        };
        match r {
            Ok(0) | Err(_) => return Next::Closed,
            Ok(n) => {
                *bytes += n as u64;
                conn.inbound.feed(&buf[..n]);
            }
        }
    }
}

/// Sends `</stream:stream>` and reads until the server closes (3 s at most).
async fn close(mut conn: Conn) {
    let _ = tokio::time::timeout(Duration::from_secs(3), async {
        let _ = conn.send(b"</stream:stream>").await;
        let mut sink = 0;
        while !matches!(next_element(&mut conn, &mut sink, None).await, Next::Closed) {}
    })
    .await;
}

fn closed() -> Failure {
    ("closed".into(), "the server closed the session".into())
}

// ----- setup -----

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
async fn setup_phase(
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
async fn warm_caps(
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

// ----- the storm -----

/// What the storm's tasks share.
struct StormCtx {
    target: Arc<Target>,
    layout: Layout,
    conn: crate::cli::ConnArgs,
    resource: String,
    nodes: Vec<PepNode>,
    caps: Caps,
    presence: String,
    quiet: Duration,
    /// A window's longest.
    window: Duration,
    shared: Arc<Shared>,
    /// Every notification received, in windows or after.
    notifications: AtomicU64,
    /// Per user (`n - first`): when its caps presence went out (µs since
    /// the epoch; 0: not yet, or never).
    presence_at: Vec<AtomicU64>,
    /// Per user (`n - first`): its session is online after its window.
    online: Vec<AtomicBool>,
    /// The fan-out phase.
    fan: Mutex<Fan>,
    /// Fan-out notifications received (duplicates included).
    fan_notifications: AtomicU64,
}

/// A fan-out publication.
#[derive(Debug, Default, Clone, PartialEq)]
struct Publication {
    /// When its publisher sent it (µs since the epoch; 0: never).
    send_us: u64,
    /// Online sessions of the publisher's group when it was asked for.
    expected: u64,
    /// Sessions that got it.
    received: u64,
    /// Publish → the latest notification, µs.
    last_us: u64,
}

/// What the fan-out phase's sessions share.
#[derive(Debug, Default)]
struct Fan {
    pubs: Vec<Publication>,
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
    fn result(&self, node: &str, publications: u64, interval_ms: u64) -> PepFanout {
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
struct LoginReport {
    at_unix_ms: u64,
    outcome: Result<LoginStats, SetupError>,
}

/// What a session saw after its window.
#[derive(Debug, Default)]
struct Tail {
    after_window: u64,
    duplicates: u64,
    unexpected: u64,
    caps_queries: u64,
}

/// One login of the storm: waits for `at`, logs in, sends the caps
/// presence, counts notifications until the window closes, reports, then
/// keeps counting until `stop`, and closes.
async fn login(
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
fn storm_result(
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
    use crate::rooms::test_util::{command, parse};

    fn args(extra: &[&str]) -> PepArgs {
        match command(&[&["pep"], extra].concat()) {
            Command::Pep(a) => a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn sha1_matches_the_fips_vectors() {
        let hex = |d: [u8; 20]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(hex(sha1(b"")), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
        assert_eq!(
            hex(sha1(b"abc")),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert_eq!(
            hex(sha1(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1"
        );
        assert_eq!(
            hex(sha1(&[b'a'; 1_000_000])),
            "34aa973cd4c4daa4f61eeb2bdbad27316534016f"
        );
    }

    /// XEP-0115 §5.2: the simple example.
    #[test]
    fn caps_hash_of_the_xep_example() {
        let ids = [["client", "pc", "", "Exodus 0.9.1"]];
        let features = [
            "http://jabber.org/protocol/disco#info",
            "http://jabber.org/protocol/disco#items",
            "http://jabber.org/protocol/muc",
            "http://jabber.org/protocol/caps",
        ];
        assert_eq!(
            verification_string(&ids, &features),
            "client/pc//Exodus 0.9.1<http://jabber.org/protocol/caps<\
             http://jabber.org/protocol/disco#info<http://jabber.org/protocol/disco#items<\
             http://jabber.org/protocol/muc<"
        );
        assert_eq!(caps_ver(&ids, &features), "QgayPKawpkPSDYmwT/WM94uAlu0=");
    }

    /// The disco#info answer hashes to the announced `ver`, as a server
    /// recomputes it (§5.4), and carries every node's `+notify`.
    #[test]
    fn disco_answer_matches_the_announced_ver() {
        let caps = Caps::new(&NODES[..3]);
        let presence = parse(&caps.presence());
        let c = presence.get_child("c", NS_CAPS).unwrap();
        assert_eq!(c.attr("hash"), Some("sha-1"));
        assert_eq!(c.attr("ver"), Some(caps.ver.as_str()));
        let node = format!("{CAPS_NODE}#{}", caps.ver);
        let q = parse(&format!(
            "<iq xmlns='jabber:client' type='get' id='caps-1' from='localhost' to='user1@localhost/bench'>\
             <query xmlns='{NS_DISCO_INFO}' node='{node}'/></iq>"
        ));
        let (answer, disco) = answer_iq(&q, &caps).unwrap();
        assert!(disco);
        let iq = parse(&answer);
        assert_eq!(iq.attr("type"), Some("result"));
        assert_eq!(iq.attr("id"), Some("caps-1"));
        assert_eq!(iq.attr("to"), Some("localhost"));
        let query = iq.get_child("query", NS_DISCO_INFO).unwrap();
        assert_eq!(query.attr("node"), Some(node.as_str()));
        let ids: Vec<[String; 4]> = query
            .children()
            .filter(|c| c.name() == "identity")
            .map(|i| {
                ["category", "type", "xml:lang", "name"].map(|k| i.attr(k).unwrap_or("").to_owned())
            })
            .collect();
        let features: Vec<&str> = query
            .children()
            .filter(|c| c.name() == "feature")
            .filter_map(|f| f.attr("var"))
            .collect();
        let ids: Vec<[&str; 4]> = ids
            .iter()
            .map(|i| [&*i[0], &*i[1], &*i[2], &*i[3]])
            .collect();
        assert_eq!(caps_ver(&ids, &features), caps.ver);
        for n in &NODES[..3] {
            assert!(features.contains(&format!("{}+notify", n.node).as_str()));
        }
        assert!(!features.contains(&"http://jabber.org/protocol/mood+notify"));
        assert_ne!(Caps::new(&NODES[..2]).ver, caps.ver, "a ver per node set");
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
    fn fan_out_items_carry_their_send_time() {
        let id = fan_item_id(1_764_000_000_123_456, 7);
        assert_eq!(id, "fan-1764000000123456-7");
        assert_eq!(parse_fan_id(&id), Some((1_764_000_000_123_456, 7)));
        for bad in [
            "",
            "fan-",
            "fan-12",
            "fan-x-1",
            "fan-1-",
            "fan--1",
            "ab12cd",
            "fan-1-2-3",
        ] {
            assert_eq!(parse_fan_id(bad), None, "{bad}");
        }
        let iq = publish_item_iq(0, &id, "<x/>", "fan-pub-7");
        assert!(iq.contains("id='fan-pub-7'"), "{iq}");
        assert!(
            iq.contains("<publish node='urn:xmpp:avatar:metadata'><item id='fan-1764000000123456-7'><x/></item></publish>"),
            "{iq}"
        );
        assert_eq!(
            publish_iq(0, 5, "p"),
            publish_item_iq(0, &item(0, 5).0, &item(0, 5).1, "p")
        );
        let n = parse(&format!(
            "<message xmlns='jabber:client' from='user2@localhost' to='user1@localhost/bench'>\
             <event xmlns='{NS_EVENT}'><items node='urn:xmpp:avatar:metadata'><item id='{id}'>\
             <metadata xmlns='urn:xmpp:avatar:metadata'/></item></items></event></message>"
        ));
        assert_eq!(notified_item_id(&n), Some(id.as_str()));
        let retract = parse(&format!(
            "<message xmlns='jabber:client' from='user2@localhost'><event xmlns='{NS_EVENT}'>\
             <items node='n'><retract id='{id}'/></items></event></message>"
        ));
        assert_eq!(notified_item_id(&retract), None);
    }

    #[test]
    fn fan_out_publishers_rotate_over_groups_and_online_members() {
        // Users 3..10 in groups 3..6, 6..9, 9..10.
        let l = Layout::of(&args(&[
            "--users",
            "7",
            "--first-user",
            "3",
            "--contacts",
            "2",
        ]));
        let all = |_: u64| true;
        let picks: Vec<_> = (0..7).map(|i| pick_publisher(&l, i, all)).collect();
        assert_eq!(
            picks,
            [(3, 3), (6, 3), (9, 1), (4, 3), (7, 3), (9, 1), (5, 3)].map(Some)
        );
        let some = |m: u64| m != 4 && m != 9 && m != 6;
        assert_eq!(pick_publisher(&l, 3, some), Some((5, 2)), "next online");
        assert_eq!(pick_publisher(&l, 1, some), Some((7, 2)));
        assert_eq!(pick_publisher(&l, 2, some), None, "nobody online");
    }

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
    fn groups_contacts_and_expectations() {
        let a = args(&["--users", "7", "--first-user", "3", "--contacts", "2"]);
        let l = Layout::of(&a);
        assert_eq!(l.groups(), 3);
        assert_eq!(group_of(3, 7, 2, 3), 3..6);
        assert_eq!(group_of(3, 7, 2, 8), 6..9);
        assert_eq!(group_of(3, 7, 2, 9), 9..10, "the last group is smaller");
        assert_eq!(
            l.contacts_of(4),
            vec![
                (3, "user3@localhost".to_string()),
                (5, "user5@localhost".to_string())
            ]
        );
        assert!(l.contacts_of(9).is_empty());
        let e = l.expected(4, &NODES[..2]);
        assert_eq!(e.len(), 6, "3 members (itself included) × 2 nodes");
        assert!(e.contains(&(
            "user4@localhost".into(),
            "http://jabber.org/protocol/nick".into()
        )));
        assert_eq!(l.expected(9, &NODES[..2]).len(), 2, "its own only");
        assert!(l.expected(4, &[]).is_empty());
    }

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
    fn items_are_realistic_and_published_with_their_options() {
        for (k, node) in NODES.iter().enumerate() {
            let iq = parse(&publish_iq(k, 17, "pub0"));
            let ps = iq.get_child("pubsub", NS_PUBSUB).unwrap();
            let publish = ps.get_child("publish", NS_PUBSUB).unwrap();
            assert_eq!(publish.attr("node"), Some(node.node));
            let item = publish.get_child("item", NS_PUBSUB).unwrap();
            assert!(item.attr("id").is_some());
            let size = item.to_string().len();
            assert!((60..700).contains(&size), "node {k}: {size} bytes");
            let options = ps.get_child("publish-options", NS_PUBSUB);
            assert_eq!(options.is_some(), node.open, "node {k}");
        }
        let (id, payload) = item(0, 17);
        assert_eq!(id.len(), 40, "XEP-0084: the id is the SHA-1 of the image");
        assert!(payload.contains(&id));
        assert_eq!(item(2, 17), item(2, 17), "deterministic");
        assert_ne!(item(2, 17), item(2, 18));
        let open = parse(&publish_iq(2, 1, "p"));
        let form = open
            .get_child("pubsub", NS_PUBSUB)
            .and_then(|p| p.get_child("publish-options", NS_PUBSUB))
            .and_then(|o| o.get_child("x", "jabber:x:data"))
            .unwrap();
        let access = form
            .children()
            .find(|f| f.attr("var") == Some("pubsub#access_model"))
            .and_then(|f| f.get_child("value", "jabber:x:data"))
            .map(|v| v.text());
        assert_eq!(access.as_deref(), Some("open"));
    }

    #[test]
    fn notifications_and_iqs_are_told_apart() {
        let caps = Caps::new(&NODES[..1]);
        let n = parse(&format!(
            "<message xmlns='jabber:client' type='headline' from='User2@localhost' to='user1@localhost/bench'>\
             <event xmlns='{NS_EVENT}'><items node='urn:xmpp:avatar:metadata'><item id='x'/></items></event></message>"
        ));
        assert_eq!(
            notification(&n),
            Some(("user2@localhost".into(), "urn:xmpp:avatar:metadata".into()))
        );
        let err = parse(&format!(
            "<message xmlns='jabber:client' type='error' from='user2@localhost'><event xmlns='{NS_EVENT}'/></message>"
        ));
        assert_eq!(notification(&err), None);
        let chat = parse(
            "<message xmlns='jabber:client' from='user2@localhost'><body>hi</body></message>",
        );
        assert_eq!(notification(&chat), None);
        let push = parse(&format!(
            "<iq xmlns='jabber:client' type='set' id='push1'><query xmlns='{NS_ROSTER}'>\
             <item jid='user2@localhost' subscription='both'/></query></iq>"
        ));
        assert_eq!(
            answer_iq(&push, &caps),
            Some(("<iq type='result' id='push1'/>".into(), false))
        );
        let ping = parse(
            "<iq xmlns='jabber:client' type='get' id='p1' from='localhost'><ping xmlns='urn:xmpp:ping'/></iq>",
        );
        assert_eq!(
            answer_iq(&ping, &caps),
            Some(("<iq type='result' id='p1' to='localhost'/>".into(), false))
        );
        let result = parse("<iq xmlns='jabber:client' type='result' id='pub0'/>");
        assert_eq!(answer_iq(&result, &caps), None);
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

    #[test]
    fn the_schedule_spreads_logins_at_the_rate() {
        let t = tokio::time::Instant::now();
        assert_eq!(schedule(t, 7, 0.0), t);
        assert_eq!(schedule(t, 10, 20.0), t + Duration::from_millis(500));
    }
}
