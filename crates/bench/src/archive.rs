//! The `archive` scenario: Message Archive Management (XEP-0313,
//! `urn:xmpp:mam:2`) query latency with RSM paging (XEP-0059).
//!
//! Phases, all over the same sessions:
//! 1. login of the measured users and the partner accounts (the storm of
//!    [`engine::storm`]);
//! 2. optional fill: partners send `--fill` chat messages to every measured
//!    user; the phase ends when all were delivered (or nothing arrived for
//!    `--fill-timeout-secs`);
//! 3. warm-up (for `by-id`): per user the oldest and newest message (first
//!    page and latest page with `<max>1</max>`), then time-range probes at
//!    random instants in between (`start` form field) collect message ids
//!    spread over the archive, whatever the server's id format;
//! 4. measurement: every user sends queries of a random selected kind, one
//!    at a time, and times each from the iq send to its `<fin/>` result.
//!
//! A query counts as good only if its page is well-formed: the `<fin/>` iq
//! is a result, no more results than `<max>`, RSM `<first>`/`<last>` match
//! the first and last result, `with` results involve the contact, a page is
//! not shorter than the archive is known to be (after a fill), and a short
//! page without `complete='true'` is tolerated as "capped" (the server
//! enforces its own maximum). Anything else is an error by cause.

use crate::cli::{ArchiveArgs, QueryKind};
use crate::client::{self, Conn, Event};
use crate::engine::{self, now_us, Shared};
use crate::hist::Latency;
use crate::rate::{RateSchedule, SplitMix};
use crate::report::{ArchiveResult, FillResult, QueryKindResult, WarmupResult};
use anyhow::Context as _;
use starling_xml::Element;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// MAM namespace.
pub const NS_MAM: &str = "urn:xmpp:mam:2";
/// RSM namespace.
pub const NS_RSM: &str = "http://jabber.org/protocol/rsm";
const NS_FORWARD: &str = "urn:xmpp:forward:0";
const NS_DELAY: &str = "urn:xmpp:delay";
const NS_STANZAS: &str = "urn:ietf:params:xml:ns:xmpp-stanzas";

// ------------------------------------------------------------------ time

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Inverse of [`days_from_civil`].
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

/// Parses an XEP-0082 DateTime (`2024-05-01T10:20:30.123456Z`, fraction
/// and a `±hh:mm` offset optional) into microseconds since the epoch.
pub fn parse_stamp(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut micros = 0i64;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return None;
        }
        let frac = &s[start..i];
        let six: String = frac.chars().chain(std::iter::repeat('0')).take(6).collect();
        micros = six.parse().ok()?;
    }
    let offset_s = match &s[i..] {
        "Z" => 0,
        tz if tz.len() == 6 && (tz.starts_with('+') || tz.starts_with('-')) => {
            if tz.as_bytes()[3] != b':' {
                return None;
            }
            let (oh, om) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            let v = oh * 3600 + om * 60;
            if tz.starts_with('-') {
                -v
            } else {
                v
            }
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo as u32, d as u32);
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset_s;
    u64::try_from(secs * 1_000_000 + micros).ok()
}

/// Formats microseconds since the epoch as an XEP-0082 UTC DateTime with
/// microseconds (`2024-05-01T10:20:30.123456Z`).
pub fn format_stamp(us: u64) -> String {
    let secs = (us / 1_000_000) as i64;
    let micros = us % 1_000_000;
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

// ------------------------------------------------------------------ queries

/// Which page of the result set to ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Paging {
    /// The first (oldest) page: no `<before>`/`<after>`.
    First,
    /// The last (newest) page: `<before/>`.
    Latest,
    /// The page right after a message id.
    After(String),
    /// The page right before a message id.
    Before(String),
}

/// One MAM query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MamQuery {
    /// `with` filter (a bare JID).
    pub with: Option<String>,
    /// `start` filter, µs since the epoch.
    pub start: Option<u64>,
    /// `end` filter, µs since the epoch.
    pub end: Option<u64>,
    /// RSM `<max>`.
    pub max: u32,
    /// RSM paging.
    pub paging: Paging,
}

impl MamQuery {
    /// A query of `max` results and `paging`, without filters.
    pub fn page(max: u32, paging: Paging) -> MamQuery {
        MamQuery {
            with: None,
            start: None,
            end: None,
            max,
            paging,
        }
    }

    /// The iq stanza (`type='set'`, id `iq_id`, query id `query_id`).
    pub fn to_xml(&self, iq_id: &str, query_id: &str) -> String {
        let mut s = format!(
            "<iq type='set' id='{}'><query xmlns='{NS_MAM}' queryid='{}'>",
            client::xml_escape(iq_id),
            client::xml_escape(query_id)
        );
        let mut fields = Vec::new();
        if let Some(w) = &self.with {
            fields.push(("with", client::xml_escape(w)));
        }
        if let Some(t) = self.start {
            fields.push(("start", format_stamp(t)));
        }
        if let Some(t) = self.end {
            fields.push(("end", format_stamp(t)));
        }
        if !fields.is_empty() {
            s.push_str(
                "<x xmlns='jabber:x:data' type='submit'><field var='FORM_TYPE' type='hidden'>\
                 <value>urn:xmpp:mam:2</value></field>",
            );
            for (var, value) in fields {
                let _ = write!(s, "<field var='{var}'><value>{value}</value></field>");
            }
            s.push_str("</x>");
        }
        let _ = write!(s, "<set xmlns='{NS_RSM}'><max>{}</max>", self.max);
        match &self.paging {
            Paging::First => {}
            Paging::Latest => s.push_str("<before/>"),
            Paging::After(id) => {
                let _ = write!(s, "<after>{}</after>", client::xml_escape(id));
            }
            Paging::Before(id) => {
                let _ = write!(s, "<before>{}</before>", client::xml_escape(id));
            }
        }
        s.push_str("</set></query></iq>");
        s
    }
}

/// One archived message as returned in a `<result/>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// The archive id (`<result id=…>`).
    pub id: String,
    /// The `<delay stamp=…>` of the forwarded message, µs.
    pub stamp_us: Option<u64>,
    /// Bare `from` of the archived message.
    pub from: Option<String>,
    /// Bare `to` of the archived message.
    pub to: Option<String>,
}

/// A page: the results and the `<fin/>` data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Page {
    /// Results in arrival order.
    pub items: Vec<Item>,
    /// `<fin complete='true'>`.
    pub complete: bool,
    /// RSM `<first>`.
    pub first: Option<String>,
    /// RSM `<last>`.
    pub last: Option<String>,
    /// RSM `<count>`.
    pub count: Option<u64>,
}

/// Why a query failed (the report's error buckets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueryError {
    /// The server answered with an error iq (condition name).
    Stanza(String),
    /// No `<fin/>` within the query timeout.
    Timeout,
    /// The page does not have the expected size.
    Count(String),
    /// The answer is not a well-formed MAM page.
    Malformed(String),
    /// The session was closed.
    Closed(String),
    /// The query could not be sent.
    Send(String),
}

impl QueryError {
    /// The report bucket.
    pub fn bucket(&self) -> &'static str {
        match self {
            QueryError::Stanza(_) => "error",
            QueryError::Timeout => "timeout",
            QueryError::Count(_) => "count",
            QueryError::Malformed(_) => "malformed",
            QueryError::Closed(_) => "closed",
            QueryError::Send(_) => "send",
        }
    }
}

impl std::fmt::Display for QueryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueryError::Stanza(c) => write!(f, "error: server returned <{c}/>"),
            QueryError::Timeout => write!(f, "timeout: no <fin/> in time"),
            QueryError::Count(d) => write!(f, "count: {d}"),
            QueryError::Malformed(d) => write!(f, "malformed: {d}"),
            QueryError::Closed(d) => write!(f, "closed: {d}"),
            QueryError::Send(d) => write!(f, "send: {d}"),
        }
    }
}

fn bare(jid: &str) -> &str {
    jid.split('/').next().unwrap_or(jid)
}

/// Collects the result messages of one query until its `<fin/>` iq.
#[derive(Debug)]
pub struct PageCollector {
    iq_id: String,
    query_id: String,
    items: Vec<Item>,
    malformed: Option<String>,
}

impl PageCollector {
    /// For the query sent as iq `iq_id` with `queryid` `query_id`.
    pub fn new(iq_id: &str, query_id: &str) -> PageCollector {
        PageCollector {
            iq_id: iq_id.to_owned(),
            query_id: query_id.to_owned(),
            items: Vec::new(),
            malformed: None,
        }
    }

    /// Whether `el` belongs to this query (a result message or the iq).
    pub fn claims(&self, el: &Element) -> bool {
        match el.name() {
            "message" => el
                .get_child("result", NS_MAM)
                .is_some_and(|r| r.attr("queryid").unwrap_or("") == self.query_id),
            "iq" => {
                el.attr("id") == Some(self.iq_id.as_str())
                    && matches!(el.attr("type"), Some("result") | Some("error"))
            }
            _ => false,
        }
    }

    /// Takes an element [`claimed`](Self::claims) by this query; returns the
    /// outcome once the iq arrived.
    pub fn feed(&mut self, el: &Element) -> Option<Result<Page, QueryError>> {
        if el.name() == "message" {
            if let Some(r) = el.get_child("result", NS_MAM) {
                match parse_result(r) {
                    Ok(item) => self.items.push(item),
                    Err(e) => {
                        self.malformed.get_or_insert(e);
                    }
                }
            }
            return None;
        }
        if el.attr("type") == Some("error") {
            let cond = el
                .children()
                .find(|c| c.name() == "error")
                .and_then(|e| e.children().find(|c| c.ns() == NS_STANZAS))
                .map(|c| c.name().to_owned())
                .unwrap_or_else(|| "undefined-condition".into());
            return Some(Err(QueryError::Stanza(cond)));
        }
        if let Some(e) = self.malformed.take() {
            return Some(Err(QueryError::Malformed(e)));
        }
        let Some(fin) = el.get_child("fin", NS_MAM) else {
            return Some(Err(QueryError::Malformed(
                "iq result without <fin xmlns='urn:xmpp:mam:2'/>".into(),
            )));
        };
        let set = fin.get_child("set", NS_RSM);
        let text = |name: &str| {
            set.and_then(|s| s.get_child(name, NS_RSM))
                .map(|c| c.text().trim().to_owned())
        };
        let count = match text("count") {
            Some(c) => match c.parse() {
                Ok(n) => Some(n),
                Err(_) => {
                    return Some(Err(QueryError::Malformed(format!(
                        "RSM count {c:?} is not a number"
                    ))))
                }
            },
            None => None,
        };
        Some(Ok(Page {
            items: std::mem::take(&mut self.items),
            complete: matches!(fin.attr("complete"), Some("true") | Some("1")),
            first: text("first"),
            last: text("last"),
            count,
        }))
    }
}

fn parse_result(r: &Element) -> Result<Item, String> {
    let id = r
        .attr("id")
        .filter(|i| !i.is_empty())
        .ok_or("<result/> without id")?
        .to_owned();
    let fwd = r
        .get_child("forwarded", NS_FORWARD)
        .ok_or("<result/> without <forwarded/>")?;
    let stamp_us = fwd
        .get_child("delay", NS_DELAY)
        .and_then(|d| d.attr("stamp"))
        .map(|s| parse_stamp(s).ok_or_else(|| format!("bad delay stamp {s:?}")))
        .transpose()?;
    let msg = fwd.children().find(|c| c.name() == "message");
    Ok(Item {
        id,
        stamp_us,
        from: msg.and_then(|m| m.attr("from")).map(|f| bare(f).to_owned()),
        to: msg.and_then(|m| m.attr("to")).map(|t| bare(t).to_owned()),
    })
}

/// What a page must look like.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expect {
    /// The requested `<max>`.
    pub max: u32,
    /// At least this many results (known from a fill; 0 when unknown).
    pub min_items: u64,
    /// Every result involves this bare JID (`with` queries).
    pub with: Option<String>,
    /// Must not be among the results (the `<after>`/`<before>` anchor).
    pub anchor: Option<String>,
}

/// Checks a page; `Ok(true)` when it is good but capped (shorter than
/// `max` without `complete='true'`).
pub fn check_page(page: &Page, want: &Expect) -> Result<bool, QueryError> {
    let n = page.items.len() as u64;
    if n > u64::from(want.max) {
        return Err(QueryError::Count(format!(
            "{n} results for <max>{}</max>",
            want.max
        )));
    }
    if n < want.min_items.min(u64::from(want.max)) {
        return Err(QueryError::Count(format!(
            "{n} results, the archive holds at least {}",
            want.min_items
        )));
    }
    if let (Some(c), true) = (page.count, page.complete) {
        if c < n {
            return Err(QueryError::Count(format!(
                "RSM count {c} below the {n} results returned"
            )));
        }
    }
    if n == 0 {
        if page.first.is_some() || page.last.is_some() {
            return Err(QueryError::Malformed(
                "RSM first/last in an empty page".into(),
            ));
        }
        if !page.complete {
            return Err(QueryError::Count(
                "empty page without complete='true'".into(),
            ));
        }
        return Ok(false);
    }
    let (first, last) = (&page.items[0].id, &page.items[page.items.len() - 1].id);
    if page.first.as_ref() != Some(first) || page.last.as_ref() != Some(last) {
        return Err(QueryError::Malformed(format!(
            "RSM first/last {:?}/{:?} do not match the results {first:?}/{last:?}",
            page.first, page.last
        )));
    }
    if let Some(a) = &want.anchor {
        if page.items.iter().any(|i| &i.id == a) {
            return Err(QueryError::Malformed(format!(
                "the anchor {a:?} is in its own after/before page"
            )));
        }
    }
    if let Some(w) = &want.with {
        if let Some(i) = page
            .items
            .iter()
            .find(|i| i.from.as_deref() != Some(w) && i.to.as_deref() != Some(w))
        {
            return Err(QueryError::Malformed(format!(
                "result {:?} ({:?} -> {:?}) does not involve {w}",
                i.id, i.from, i.to
            )));
        }
    }
    Ok(n < u64::from(want.max) && !page.complete)
}

// ------------------------------------------------------------------ sessions

/// Phases of the run, advanced by the coordinator.
const PH_FILL: u8 = 0;
const PH_WARMUP: u8 = 1;
const PH_MEASURE: u8 = 2;

/// Fill messages carry this body prefix.
const FILL_PREFIX: &str = "archive-fill ";

/// State shared by the user tasks and the coordinator.
struct Ctx {
    args: ArchiveArgs,
    shared: Arc<Shared>,
    phase: watch::Receiver<u8>,
    /// When measurement starts and ends (µs since the epoch; set before
    /// entering [`PH_MEASURE`]).
    window: std::sync::Mutex<(u64, u64)>,
    /// Fill messages delivered to measured users.
    fill_delivered: AtomicU64,
}

/// A session serving one measured user.
struct UserSession {
    conn: Conn,
    user: u64,
    seq: u64,
    fills: u64,
}

impl UserSession {
    async fn send(&mut self, s: &str) -> Result<(), QueryError> {
        self.conn
            .send(s.as_bytes())
            .await
            .map_err(|e| QueryError::Send(e.to_string()))
    }

    /// Handles an element that belongs to no query: counts fill
    /// deliveries, answers pings.
    async fn background(&mut self, el: &Element, ctx: &Ctx) -> Result<(), QueryError> {
        match el.name() {
            "message" if el.get_child("result", NS_MAM).is_none() => {
                let body = el.children().find(|c| c.name() == "body").map(|b| b.text());
                if body.is_some_and(|b| b.starts_with(FILL_PREFIX))
                    && el.attr("type") != Some("error")
                {
                    self.fills += 1;
                    ctx.fill_delivered.fetch_add(1, Relaxed);
                    ctx.shared.delivered.fetch_add(1, Relaxed);
                }
            }
            "iq" => {
                if let Some(r) = engine::iq_reply(el) {
                    self.send(&r).await?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    async fn next(&mut self) -> Result<Element, QueryError> {
        loop {
            match self.conn.next_event().await {
                Ok(Event::Element(el)) => return Ok(el),
                Ok(Event::Header) => continue,
                Ok(Event::Closed) => {
                    return Err(QueryError::Closed("server closed the stream".into()))
                }
                Err(e) => return Err(QueryError::Closed(format!("{e:#}"))),
            }
        }
    }

    /// Serves background traffic until the phase reaches `phase`.
    async fn serve_until(&mut self, ctx: &Ctx, phase: u8) -> Result<(), QueryError> {
        let mut rx = ctx.phase.clone();
        while *rx.borrow_and_update() < phase {
            tokio::select! {
                el = self.next() => {
                    let el = el?;
                    self.background(&el, ctx).await?;
                }
                r = rx.changed() => {
                    if r.is_err() {
                        return Err(QueryError::Closed("coordinator stopped".into()));
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends `q` and collects its page (no checks besides well-formedness).
    async fn query(&mut self, q: &MamQuery, ctx: &Ctx) -> Result<Page, QueryError> {
        self.seq += 1;
        let iq_id = format!("mam{}", self.seq);
        let query_id = format!("q{}-{}", self.user, self.seq);
        let mut col = PageCollector::new(&iq_id, &query_id);
        self.send(&q.to_xml(&iq_id, &query_id)).await?;
        let timeout = Duration::from_secs_f64(ctx.args.query_timeout_secs);
        let fut = async {
            loop {
                let el = self.next().await?;
                if col.claims(&el) {
                    if let Some(r) = col.feed(&el) {
                        return r;
                    }
                } else {
                    self.background(&el, ctx).await?;
                }
            }
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(QueryError::Timeout),
        }
    }
}

/// Per-kind counters of one user task.
#[derive(Default)]
struct KindStats {
    queries: u64,
    ok: u64,
    errors: BTreeMap<String, u64>,
    first_error: Option<String>,
    results: u64,
    capped: u64,
    latency: Latency,
}

impl KindStats {
    fn record(&mut self, outcome: Result<(Page, bool), QueryError>, took_us: u64) {
        self.queries += 1;
        match outcome {
            Ok((page, capped)) => {
                self.ok += 1;
                self.results += page.items.len() as u64;
                self.capped += u64::from(capped);
                self.latency.record_us(took_us);
            }
            Err(e) => {
                *self.errors.entry(e.bucket().to_owned()).or_default() += 1;
                if self.first_error.is_none() {
                    self.first_error = Some(e.to_string());
                }
            }
        }
    }

    fn merge(&mut self, o: KindStats) {
        self.queries += o.queries;
        self.ok += o.ok;
        for (k, v) in o.errors {
            *self.errors.entry(k).or_default() += v;
        }
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
        self.results += o.results;
        self.capped += o.capped;
        self.latency.merge(&o.latency);
    }
}

/// What a user task reports.
#[derive(Default)]
struct UserOutcome {
    ids: u64,
    warmup_errors: u64,
    warmup_first_error: Option<String>,
    kinds: BTreeMap<QueryKind, KindStats>,
}

impl UserOutcome {
    fn warmup_error(&mut self, e: String) {
        self.warmup_errors += 1;
        self.warmup_first_error.get_or_insert(e);
    }
}

/// Warm-up of one user: oldest and newest message, then time-range probes.
/// Returns the ids found (empty for an empty archive).
async fn collect_ids(
    s: &mut UserSession,
    ctx: &Ctx,
    rng: &mut SplitMix,
    out: &mut UserOutcome,
) -> Vec<String> {
    let mut ids = BTreeSet::new();
    let bound = |page: Result<Page, QueryError>, out: &mut UserOutcome| match page {
        Ok(p) => p.items.into_iter().next(),
        Err(e) => {
            out.warmup_error(e.to_string());
            None
        }
    };
    let oldest = bound(s.query(&MamQuery::page(1, Paging::First), ctx).await, out);
    let newest = bound(s.query(&MamQuery::page(1, Paging::Latest), ctx).await, out);
    let (Some(oldest), Some(newest)) = (oldest, newest) else {
        return Vec::new();
    };
    let range = match (oldest.stamp_us, newest.stamp_us) {
        (Some(a), Some(b)) if b >= a => Some((a, b)),
        _ => None,
    };
    ids.insert(oldest.id);
    ids.insert(newest.id);
    if let Some((a, b)) = range {
        for _ in 0..ctx.args.probes {
            let t = a + rng.below(b - a + 1);
            let q = MamQuery {
                start: Some(t),
                ..MamQuery::page(1, Paging::First)
            };
            match s.query(&q, ctx).await {
                Ok(p) => {
                    if let Some(i) = p.items.into_iter().next() {
                        ids.insert(i.id);
                    }
                }
                Err(e) => out.warmup_error(e.to_string()),
            }
        }
    } else {
        out.warmup_error("results without a usable <delay stamp/>".into());
    }
    ids.into_iter().collect()
}

/// Fill messages user `idx` (0-based among measured users) received from
/// partner `p` (0-based): message k goes out from partner k % partners.
pub fn fill_from_partner(fill: u64, partners: u64, p: u64) -> u64 {
    if partners == 0 {
        return 0;
    }
    fill / partners + u64::from(p < fill % partners)
}

/// One measured user: fill deliveries, warm-up, measurement.
async fn user_task(
    mut s: UserSession,
    ctx: Arc<Ctx>,
    warm_tx: mpsc::UnboundedSender<()>,
) -> UserOutcome {
    let a = &ctx.args;
    let mut out = UserOutcome::default();
    let mut rng = SplitMix::new(now_us() ^ s.user.wrapping_mul(0x9E37_79B9));
    if s.serve_until(&ctx, PH_WARMUP).await.is_err() {
        drop(warm_tx);
        return out;
    }
    let ids = if a.queries.contains(&QueryKind::ById) {
        collect_ids(&mut s, &ctx, &mut rng, &mut out).await
    } else {
        Vec::new()
    };
    out.ids = ids.len() as u64;
    let _ = warm_tx.send(());
    drop(warm_tx);
    if s.serve_until(&ctx, PH_MEASURE).await.is_err() {
        return out;
    }
    let (start, end) = *ctx.window.lock().unwrap_or_else(|e| e.into_inner());
    let kinds: Vec<QueryKind> = a
        .queries
        .iter()
        .copied()
        .filter(|k| *k != QueryKind::ById || !ids.is_empty())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if kinds.is_empty() {
        let _ = s.conn.send(b"</stream:stream>").await;
        return out;
    }
    let users = a.scenario.conn.users.max(1) as f64;
    let interval_us = (a.rate > 0.0).then(|| (1e6 * users / a.rate) as u64);
    let mut next_at = start + interval_us.map_or(0, |i| rng.below(i.max(1)));
    let partners = a.partners;
    let domain = &a.scenario.conn.domain;
    let page = a.page_size;
    loop {
        if interval_us.is_some() {
            let now = now_us();
            if next_at > now {
                tokio::time::sleep(Duration::from_micros(next_at - now)).await;
            }
        }
        let scheduled = if interval_us.is_some() {
            next_at
        } else {
            now_us()
        };
        if scheduled >= end {
            break;
        }
        if let Some(i) = interval_us {
            next_at += i;
        }
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        let (q, want) = match kind {
            QueryKind::Latest => (
                MamQuery::page(page, Paging::Latest),
                Expect {
                    max: page,
                    min_items: a.fill,
                    ..Expect::default()
                },
            ),
            QueryKind::ById => {
                let id = ids[rng.below(ids.len() as u64) as usize].clone();
                let paging = if rng.below(2) == 0 {
                    Paging::After(id.clone())
                } else {
                    Paging::Before(id.clone())
                };
                (
                    MamQuery::page(page, paging),
                    Expect {
                        max: page,
                        anchor: Some(id),
                        ..Expect::default()
                    },
                )
            }
            QueryKind::With => {
                let p = rng.below(partners.max(1));
                let with = format!("{}@{domain}", a.scenario.conn.user(a.partner_first() + p));
                (
                    MamQuery {
                        with: Some(with.clone()),
                        ..MamQuery::page(page, Paging::Latest)
                    },
                    Expect {
                        max: page,
                        min_items: fill_from_partner(a.fill, partners, p),
                        with: Some(with),
                        ..Expect::default()
                    },
                )
            }
        };
        let r = s.query(&q, &ctx).await;
        let took = now_us().saturating_sub(scheduled);
        let closed = matches!(r, Err(QueryError::Closed(_)) | Err(QueryError::Send(_)));
        let outcome = r.and_then(|p| check_page(&p, &want).map(|capped| (p, capped)));
        out.kinds.entry(kind).or_default().record(outcome, took);
        if closed {
            return out;
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), s.conn.send(b"</stream:stream>")).await;
    out
}

/// One partner: sends its share of the fill to every measured user, then
/// serves its session until the coordinator stops it.
async fn partner_task(
    mut conn: Conn,
    index: u64,
    ctx: Arc<Ctx>,
    targets: Vec<u64>,
    mut stop: watch::Receiver<bool>,
) -> u64 {
    let a = &ctx.args;
    let partners = a.partners.max(1);
    let domain = &a.scenario.conn.domain;
    let resource = &a.scenario.resource;
    // Message k of user u: k ≡ index (mod partners).
    let mine: Vec<(u64, u64)> = (index..a.fill)
        .step_by(partners as usize)
        .flat_map(|k| targets.iter().map(move |&u| (k, u)))
        .collect();
    let sched = RateSchedule::new(&[a.fill_rate / partners as f64], 1e9, 1);
    let t0 = Instant::now();
    let mut sent = 0usize;
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = tick.tick(), if sent < mine.len() => {
                let due = (sched.due(t0.elapsed().as_secs_f64()) as usize).min(mine.len());
                if due > sent {
                    let mut buf = String::new();
                    for &(k, u) in &mine[sent..due] {
                        let _ = write!(
                            buf,
                            "<message to='{}@{domain}/{resource}' type='chat' id='f{index}-{k}-{u}'>\
                             <body>{FILL_PREFIX}{k}</body></message>",
                            a.scenario.conn.user(u)
                        );
                    }
                    if conn.send(buf.as_bytes()).await.is_err() {
                        break;
                    }
                    ctx.shared.sent.fetch_add((due - sent) as u64, Relaxed);
                    sent = due;
                }
            }
            ev = conn.next_event() => match ev {
                Ok(Event::Element(el)) => {
                    if let Some(r) = engine::iq_reply(&el) {
                        if conn.send(r.as_bytes()).await.is_err() {
                            break;
                        }
                    }
                }
                Ok(Event::Header) => {}
                Ok(Event::Closed) | Err(_) => break,
            },
            _ = stop.changed() => break,
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), conn.send(b"</stream:stream>")).await;
    sent as u64
}

/// Runs the `archive` scenario and prints/writes its result.
pub async fn run(a: ArchiveArgs) -> anyhow::Result<()> {
    let sc = &a.scenario;
    anyhow::ensure!(sc.conn.users > 0, "--users must be at least 1");
    anyhow::ensure!(a.page_size > 0, "--page-size must be at least 1");
    anyhow::ensure!(!a.queries.is_empty(), "--queries is empty");
    anyhow::ensure!(
        a.fill == 0 || a.partners > 0,
        "--fill needs at least one partner (--partners)"
    );
    let needs_partners = a.fill > 0 || a.queries.contains(&QueryKind::With);
    let partners = if needs_partners { a.partners } else { 0 };
    anyhow::ensure!(
        !a.queries.contains(&QueryKind::With) || a.partners > 0,
        "`with` queries need partner accounts (--partners)"
    );
    let users = sc.conn.users;
    anyhow::ensure!(
        users + partners <= sc.max_per_process,
        "the archive scenario runs in one process: at most --max-per-process ({}) sessions",
        sc.max_per_process
    );
    let (lo, hi) = (sc.conn.first_user, sc.conn.first_user + users);
    let pfirst = a.partner_first();
    anyhow::ensure!(
        partners == 0 || pfirst >= hi || pfirst + partners <= lo,
        "partner accounts {pfirst}..{} overlap the measured users {lo}..{hi}",
        pfirst + partners
    );

    anyhow::ensure!(
        !sc.conn.sm,
        "--sm is not supported by the archive scenario (its sessions answer no <r/>)"
    );
    let target = engine::target_of(sc)?;
    let shared = Arc::new(Shared::new(RateSchedule::new(&[], 1.0, 1)));
    let mut result = engine::skeleton(engine::Scenario::Archive, sc, 1);
    let pb = engine::progress_bar(sc, users + partners);
    let reporter = engine::spawn_reporter(sc, shared.clone(), pb.clone());
    let (phase_tx, phase_rx) = watch::channel(PH_FILL);
    let ctx = Arc::new(Ctx {
        args: a.clone(),
        shared: shared.clone(),
        phase: phase_rx,
        window: std::sync::Mutex::new((0, 0)),
        fill_delivered: AtomicU64::new(0),
    });
    let (warm_tx, mut warm_rx) = mpsc::unbounded_channel();
    let mut user_tasks = Vec::new();
    let mut partner_conns = Vec::new();
    let mut connect = engine::storm(sc, &target, lo, hi, true, &shared, |n, conn| {
        let s = UserSession {
            conn,
            user: n,
            seq: 0,
            fills: 0,
        };
        user_tasks.push(tokio::spawn(user_task(s, ctx.clone(), warm_tx.clone())));
    })
    .await;
    drop(warm_tx);
    if partners > 0 {
        let pc = engine::storm(
            sc,
            &target,
            pfirst,
            pfirst + partners,
            true,
            &shared,
            |n, conn| partner_conns.push((n - pfirst, conn)),
        )
        .await;
        connect = crate::report::ConnectResult::merge(&[connect, pc])?;
    }
    result.connect = connect;
    let measured: Vec<u64> = (lo..hi).collect();

    // Fill.
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut partner_tasks = Vec::new();
    for (i, conn) in partner_conns {
        partner_tasks.push(tokio::spawn(partner_task(
            conn,
            i,
            ctx.clone(),
            measured.clone(),
            stop_rx.clone(),
        )));
    }
    let mut fill = None;
    if a.fill > 0 {
        let expected = a.fill * user_tasks.len() as u64;
        let t0 = Instant::now();
        // (delivered so far, when that count was reached)
        let mut last = (0u64, t0);
        let complete = loop {
            let d = ctx.fill_delivered.load(Relaxed);
            if d != last.0 {
                last = (d, Instant::now());
            }
            if d >= expected {
                break true;
            }
            if last.1.elapsed().as_secs_f64() > a.fill_timeout_secs {
                break false;
            }
            pb.set_message(format!("fill: {d}/{expected} delivered"));
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let secs = last.1.duration_since(t0).as_secs_f64().max(1e-3);
        let delivered = ctx.fill_delivered.load(Relaxed);
        fill = Some(FillResult {
            per_user: a.fill,
            partners,
            sent: shared.sent.load(Relaxed),
            delivered,
            duration_s: secs,
            delivered_per_s: delivered as f64 / secs,
            complete,
        });
        if !complete && !sc.quiet {
            pb.println(format!(
                "archive: only {delivered}/{expected} fill messages delivered; measuring anyway"
            ));
        }
        // Archives are written around delivery; give the last ones a moment.
        engine::hold(1.0).await;
    }

    // Warm-up.
    pb.set_message("warm-up: collecting message ids");
    let w0 = Instant::now();
    let _ = phase_tx.send(PH_WARMUP);
    let mut warmed = 0usize;
    while warmed < user_tasks.len() {
        if warm_rx.recv().await.is_none() {
            break;
        }
        warmed += 1;
    }
    let warm_secs = w0.elapsed().as_secs_f64();

    // Measurement.
    let start = now_us() + 100_000;
    let end = start + (a.duration_secs * 1e6) as u64;
    *ctx.window.lock().unwrap_or_else(|e| e.into_inner()) = (start, end);
    pb.set_message(format!("measuring {} s", a.duration_secs));
    let _ = phase_tx.send(PH_MEASURE);
    let mut total = UserOutcome::default();
    let mut without_ids = 0;
    let n_users = user_tasks.len() as u64;
    for t in user_tasks {
        match t.await {
            Ok(o) => {
                total.ids += o.ids;
                without_ids += u64::from(o.ids == 0);
                total.warmup_errors += o.warmup_errors;
                if total.warmup_first_error.is_none() {
                    total.warmup_first_error = o.warmup_first_error;
                }
                for (k, s) in o.kinds {
                    total.kinds.entry(k).or_default().merge(s);
                }
            }
            Err(e) => {
                total.warmup_error(format!("user task failed: {e}"));
            }
        }
    }
    let _ = stop_tx.send(true);
    for t in partner_tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    reporter.abort();
    pb.finish_and_clear();

    let secs = a.duration_secs.max(1e-9);
    let mut seen = BTreeSet::new();
    let kinds: Vec<QueryKindResult> = a
        .queries
        .iter()
        .filter(|k| seen.insert(**k))
        .map(|k| {
            let s = total.kinds.remove(k).unwrap_or_default();
            QueryKindResult {
                kind: k.name().into(),
                queries: s.queries,
                ok: s.ok,
                errors: s.errors,
                first_error: s.first_error,
                results: s.results,
                capped: s.capped,
                queries_per_s: s.ok as f64 / secs,
                latency: s.latency.summary(),
            }
        })
        .collect();
    result.archive = Some(ArchiveResult {
        page_size: a.page_size,
        duration_s: a.duration_secs,
        target_rate: a.rate,
        users: n_users,
        fill,
        warmup: WarmupResult {
            ids: if a.queries.contains(&QueryKind::ById) {
                total.ids
            } else {
                0
            },
            users_without_ids: if a.queries.contains(&QueryKind::ById) {
                without_ids
            } else {
                0
            },
            errors: total.warmup_errors,
            first_error: total.warmup_first_error,
            duration_s: warm_secs,
        },
        queries_per_s: kinds.iter().map(|k| k.ok).sum::<u64>() as f64 / secs,
        kinds,
    });
    engine::output(&result, sc).context("archive result")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Inbound;

    /// Parses server XML (one or more top-level elements) like the client does.
    fn parse(xml: &str) -> Vec<Element> {
        let mut inb = Inbound::default();
        inb.feed(
            b"<stream:stream xmlns='jabber:client' xmlns:stream='http://etherx.jabber.org/streams'>",
        );
        inb.feed(xml.as_bytes());
        let mut out = Vec::new();
        while let Some(ev) = inb.parse_pending().unwrap() {
            if let Event::Element(el) = ev {
                out.push(el);
            }
        }
        out
    }

    fn result_msg(qid: &str, id: &str, stamp: &str, from: &str) -> String {
        format!(
            "<message to='user1@localhost/bench'><result xmlns='urn:xmpp:mam:2' queryid='{qid}' id='{id}'>\
             <forwarded xmlns='urn:xmpp:forward:0'><delay xmlns='urn:xmpp:delay' stamp='{stamp}'/>\
             <message xmlns='jabber:client' from='{from}/r' to='user1@localhost/bench' type='chat'>\
             <body>hi</body></message></forwarded></result></message>"
        )
    }

    fn fin(id: &str, complete: bool, first: &str, last: &str, count: Option<u64>) -> String {
        let c = if complete { " complete='true'" } else { "" };
        let set = if first.is_empty() {
            String::new()
        } else {
            format!("<first index='0'>{first}</first><last>{last}</last>")
        };
        let count = count
            .map(|n| format!("<count>{n}</count>"))
            .unwrap_or_default();
        format!(
            "<iq type='result' id='{id}'><fin xmlns='urn:xmpp:mam:2'{c}>\
             <set xmlns='http://jabber.org/protocol/rsm'>{set}{count}</set></fin></iq>"
        )
    }

    fn collect(col: &mut PageCollector, xml: &str) -> Option<Result<Page, QueryError>> {
        let mut last = None;
        for el in parse(xml) {
            if col.claims(&el) {
                last = col.feed(&el);
            }
        }
        last
    }

    #[test]
    fn stamps_round_trip_and_accept_offsets() {
        assert_eq!(parse_stamp("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_stamp("2000-03-01T00:00:00Z"),
            Some(951_868_800_000_000)
        );
        let us = parse_stamp("2024-02-29T23:59:59.123456Z").unwrap();
        assert_eq!(format_stamp(us), "2024-02-29T23:59:59.123456Z");
        assert_eq!(parse_stamp("2024-02-29T23:59:59.1234Z"), Some(us - 56));
        assert_eq!(
            parse_stamp("2024-03-01T01:59:59.123456+02:00"),
            Some(us),
            "offsets are subtracted"
        );
        assert_eq!(parse_stamp("2024-02-29T22:59:59.123456-01:00"), Some(us));
        for bad in [
            "",
            "2024-02-29",
            "2024-02-29T23:59:59",
            "2024-13-01T00:00:00Z",
            "2024-02-29T23:59:59.Z",
            "2024-02-29T23:59:59+0200",
            "2024-02-29 23:59:59Z",
        ] {
            assert_eq!(parse_stamp(bad), None, "{bad}");
        }
        for us in [
            0u64,
            1,
            86_399_999_999,
            1_700_000_000_123_456,
            4_102_444_800_000_000,
        ] {
            assert_eq!(parse_stamp(&format_stamp(us)), Some(us));
        }
    }

    #[test]
    fn query_builders() {
        assert_eq!(
            MamQuery::page(50, Paging::Latest).to_xml("i1", "q1"),
            "<iq type='set' id='i1'><query xmlns='urn:xmpp:mam:2' queryid='q1'>\
             <set xmlns='http://jabber.org/protocol/rsm'><max>50</max><before/></set></query></iq>"
        );
        assert_eq!(
            MamQuery::page(1, Paging::First).to_xml("i", "q"),
            "<iq type='set' id='i'><query xmlns='urn:xmpp:mam:2' queryid='q'>\
             <set xmlns='http://jabber.org/protocol/rsm'><max>1</max></set></query></iq>"
        );
        let after = MamQuery::page(10, Paging::After("a&b".into())).to_xml("i", "q");
        assert!(
            after.contains("<max>10</max><after>a&amp;b</after></set>"),
            "{after}"
        );
        let before = MamQuery::page(10, Paging::Before("x1".into())).to_xml("i", "q");
        assert!(before.contains("<before>x1</before>"), "{before}");
        let q = MamQuery {
            with: Some("user2@localhost".into()),
            start: Some(1_700_000_000_000_000),
            end: None,
            max: 5,
            paging: Paging::Latest,
        };
        let xml = q.to_xml("i", "q");
        // The built XML parses, and the form carries FORM_TYPE, with, start.
        let el = &parse(&xml)[0];
        let query = el.get_child("query", NS_MAM).unwrap();
        let form = query.get_child("x", "jabber:x:data").unwrap();
        let fields: Vec<(String, String)> = form
            .children()
            .map(|f| {
                (
                    f.attr("var").unwrap().to_owned(),
                    f.children().next().unwrap().text(),
                )
            })
            .collect();
        assert_eq!(
            fields,
            vec![
                ("FORM_TYPE".into(), "urn:xmpp:mam:2".into()),
                ("with".into(), "user2@localhost".into()),
                ("start".into(), "2023-11-14T22:13:20.000000Z".into()),
            ]
        );
        let set = query.get_child("set", NS_RSM).unwrap();
        assert!(set.has_child("before", NS_RSM));
        assert_eq!(set.get_child("max", NS_RSM).unwrap().text(), "5");
    }

    #[test]
    fn collector_gathers_its_results_until_fin() {
        let mut col = PageCollector::new("mam1", "q1");
        let xml = [
            result_msg("q1", "A", "2024-01-01T00:00:00Z", "user9@localhost"),
            // Another query's result and an unrelated iq are not claimed.
            result_msg("q0", "Z", "2024-01-01T00:00:00Z", "user9@localhost"),
            "<iq type='result' id='mam0'/>".into(),
            "<message from='user9@localhost/r' type='chat'><body>live</body></message>".into(),
            result_msg("q1", "B", "2024-01-01T00:00:01.5Z", "user9@localhost"),
        ]
        .concat();
        let els = parse(&xml);
        let claimed: Vec<bool> = els.iter().map(|e| col.claims(e)).collect();
        assert_eq!(claimed, vec![true, false, false, false, true]);
        for (el, _) in els.iter().zip(&claimed).filter(|(_, c)| **c) {
            assert!(col.feed(el).is_none(), "no outcome before the fin");
        }
        let page = collect(&mut col, &fin("mam1", false, "A", "B", Some(1000)))
            .unwrap()
            .unwrap();
        assert_eq!(page.items.len(), 2);
        assert_eq!(page.items[1].id, "B");
        assert_eq!(page.items[1].stamp_us, Some(1_704_067_201_500_000));
        assert_eq!(page.items[0].from.as_deref(), Some("user9@localhost"));
        assert_eq!(page.items[0].to.as_deref(), Some("user1@localhost"));
        assert!(!page.complete);
        assert_eq!(
            (page.first.as_deref(), page.last.as_deref()),
            (Some("A"), Some("B"))
        );
        assert_eq!(page.count, Some(1000));
    }

    #[test]
    fn collector_reports_errors_and_malformed_pages() {
        let mut col = PageCollector::new("mam2", "q2");
        let err = "<iq type='error' id='mam2'><error type='cancel'>\
                   <feature-not-implemented xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/></error></iq>";
        let r = collect(&mut col, err).unwrap().unwrap_err();
        assert_eq!(r, QueryError::Stanza("feature-not-implemented".into()));
        assert_eq!(r.bucket(), "error");

        let mut col = PageCollector::new("mam3", "q3");
        let r = collect(&mut col, "<iq type='result' id='mam3'/>").unwrap();
        assert!(matches!(r, Err(QueryError::Malformed(_))), "{r:?}");

        let mut col = PageCollector::new("mam4", "q4");
        let xml = [
            result_msg("q4", "A", "yesterday", "u@localhost"),
            fin("mam4", true, "A", "A", None),
        ]
        .concat();
        let r = collect(&mut col, &xml).unwrap();
        assert!(
            matches!(&r, Err(QueryError::Malformed(m)) if m.contains("stamp")),
            "{r:?}"
        );
    }

    fn page(ids: &[&str], complete: bool) -> Page {
        Page {
            items: ids
                .iter()
                .map(|i| Item {
                    id: (*i).into(),
                    stamp_us: Some(1),
                    from: Some("user9@localhost".into()),
                    to: Some("user1@localhost".into()),
                })
                .collect(),
            complete,
            first: ids.first().map(|s| (*s).into()),
            last: ids.last().map(|s| (*s).into()),
            count: None,
        }
    }

    #[test]
    fn page_checks() {
        let want = |max, min_items| Expect {
            max,
            min_items,
            ..Expect::default()
        };
        // Full page; short last page; short page without complete = capped.
        assert_eq!(
            check_page(&page(&["a", "b"], false), &want(2, 0)),
            Ok(false)
        );
        assert_eq!(check_page(&page(&["a"], true), &want(2, 0)), Ok(false));
        assert_eq!(check_page(&page(&["a"], false), &want(2, 0)), Ok(true));
        assert_eq!(check_page(&page(&[], true), &want(2, 0)), Ok(false));
        // Too many; fewer than the fill; empty but not complete.
        let bucket = |r: Result<bool, QueryError>| r.unwrap_err().bucket();
        assert_eq!(
            bucket(check_page(&page(&["a", "b", "c"], false), &want(2, 0))),
            "count"
        );
        assert_eq!(
            bucket(check_page(&page(&["a"], true), &want(50, 2))),
            "count"
        );
        assert_eq!(
            check_page(&page(&["a", "b"], true), &want(2, 1000)),
            Ok(false)
        );
        assert_eq!(bucket(check_page(&page(&[], false), &want(2, 0))), "count");
        // RSM first/last must match the results.
        let mut p = page(&["a", "b"], false);
        p.last = Some("a".into());
        assert_eq!(bucket(check_page(&p, &want(2, 0))), "malformed");
        // complete with an RSM count below the results.
        let mut p = page(&["a", "b"], true);
        p.count = Some(1);
        assert_eq!(bucket(check_page(&p, &want(5, 0))), "count");
        // The anchor of an after/before page must not be in it.
        let anchored = Expect {
            max: 5,
            anchor: Some("b".into()),
            ..Expect::default()
        };
        assert_eq!(
            bucket(check_page(&page(&["a", "b"], true), &anchored)),
            "malformed"
        );
        assert_eq!(check_page(&page(&["c", "d"], true), &anchored), Ok(false));
        // `with` results must involve the contact.
        let with = |w: &str| Expect {
            max: 5,
            with: Some(w.into()),
            ..Expect::default()
        };
        assert_eq!(
            check_page(&page(&["a"], true), &with("user9@localhost")),
            Ok(false)
        );
        assert_eq!(
            bucket(check_page(&page(&["a"], true), &with("user8@localhost"))),
            "malformed"
        );
    }

    #[test]
    fn fill_is_spread_over_partners() {
        assert_eq!(fill_from_partner(10, 3, 0), 4);
        assert_eq!(fill_from_partner(10, 3, 1), 3);
        assert_eq!(fill_from_partner(10, 3, 2), 3);
        assert_eq!((0..3).map(|p| fill_from_partner(10, 3, p)).sum::<u64>(), 10);
        assert_eq!(fill_from_partner(10, 0, 0), 0);
    }

    #[test]
    fn kind_stats_merge() {
        let mut a = KindStats::default();
        a.record(Ok((page(&["a", "b"], false), false)), 1_000);
        a.record(Err(QueryError::Timeout), 10_000_000);
        let mut b = KindStats::default();
        b.record(Ok((page(&["a"], false), true)), 3_000);
        b.record(Err(QueryError::Count("x".into())), 1);
        a.merge(b);
        assert_eq!((a.queries, a.ok, a.results, a.capped), (4, 2, 3, 1));
        assert_eq!(a.errors.get("timeout"), Some(&1));
        assert_eq!(a.errors.get("count"), Some(&1));
        assert_eq!(
            a.latency.len(),
            2,
            "failed queries do not enter the histogram"
        );
        assert!(a.first_error.unwrap().starts_with("timeout"));
    }
}
