//! The `upload` scenario: XEP-0363 HTTP File Upload throughput and the
//! server's memory while files stream through it.
//!
//! 1. `--users` log in (the storm of [`engine::storm`], no presence).
//! 2. Discovery on the first session: disco#items of the domain, then
//!    disco#info of every item (pipelined); the service is the first item
//!    with identity `store`/`file` and feature `urn:xmpp:http:upload:0`,
//!    its limit the `max-file-size` field of the form of that type.
//!    `--service` skips the items (its disco#info is still asked).
//! 3. Each phase (`big`: one file of `--big-mb` MiB; `parallel`:
//!    `--parallel` files of `--small-kb` KiB): slot requests (file `i` by
//!    user `i mod users`, a user's requests pipelined), then every PUT at
//!    once, then every GET (of the files uploaded) at once.
//!
//! HTTP/1.1 is written by hand over a tokio TCP stream, TLS (rustls, any
//! certificate, as the XMPP connections) when the URL is `https:`; one
//! connection per request (`Connection: close`). A PUT body is generated
//! chunk by chunk ([`Pattern`]: byte `i` of file `f` is a pure function of
//! `f` and `i`), so no file is ever in memory, and a GET body is compared,
//! as it arrives, with the same bytes regenerated at the same offsets
//! ([`Verifier`]). Responses may carry `Content-Length`, be chunked
//! ([`Chunked`]) or end with the connection; 1xx responses are skipped.
//!
//! While the PUTs (and then the GETs) run, a sampler reads the server's
//! VmRSS every `--sample-ms` ([`RssSampler`]): before, max, after.

use crate::cli::UploadArgs;
use crate::client::{self, Conn, Event, Transport};
use crate::engine::{self, Scenario, Shared};
use crate::hist::Latency;
use crate::procmem;
use crate::rate::RateSchedule;
use crate::report::{human_bytes, RssWindow, SlotStats, TransferStats, UploadPhase, UploadResult};
use futures_util::future::join_all;
use indicatif::ProgressBar;
use rustls::pki_types::ServerName;
use starling_xml::Element;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio_rustls::TlsConnector;

/// XEP-0363's namespace.
pub const NS_UPLOAD: &str = "urn:xmpp:http:upload:0";
const NS_DISCO_ITEMS: &str = "http://jabber.org/protocol/disco#items";
const NS_DISCO_INFO: &str = "http://jabber.org/protocol/disco#info";
const NS_DATA: &str = "jabber:x:data";
const NS_STANZAS: &str = "urn:ietf:params:xml:ns:xmpp-stanzas";

/// The longest response head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Read buffer per transfer.
const READ_BUF: usize = 64 * 1024;

// ------------------------------------------------------------------ data

/// The content of one generated file: byte `i` is byte `i mod 8` (little
/// endian) of a SplitMix64 finalizer of `seed` and `i / 8`, so any range
/// can be produced (and checked) without the bytes before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pattern(u64);

impl Pattern {
    /// The file of `seed`.
    pub fn new(seed: u64) -> Pattern {
        Pattern(seed)
    }

    fn word(self, k: u64) -> [u8; 8] {
        let mut z = self.0 ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)).to_le_bytes()
    }

    /// Writes the bytes at `offset..offset + buf.len()` into `buf`.
    pub fn fill(self, offset: u64, buf: &mut [u8]) {
        let mut pos = offset;
        let mut i = 0;
        while i < buf.len() && !pos.is_multiple_of(8) {
            buf[i] = self.word(pos / 8)[(pos % 8) as usize];
            i += 1;
            pos += 1;
        }
        let mut words = buf[i..].chunks_exact_mut(8);
        for w in &mut words {
            w.copy_from_slice(&self.word(pos / 8));
            pos += 8;
        }
        let rest = words.into_remainder();
        if !rest.is_empty() {
            let w = self.word(pos / 8);
            rest.copy_from_slice(&w[..rest.len()]);
        }
    }
}

/// Checks a received stream against its [`Pattern`], piece by piece.
#[derive(Debug)]
pub struct Verifier {
    pattern: Pattern,
    /// Bytes seen so far.
    pub offset: u64,
    /// Offset of the first byte that differs.
    pub mismatch: Option<u64>,
    scratch: Vec<u8>,
}

impl Verifier {
    /// For the stream of `pattern`, from offset 0.
    pub fn new(pattern: Pattern) -> Verifier {
        Verifier {
            pattern,
            offset: 0,
            mismatch: None,
            scratch: Vec::new(),
        }
    }

    /// The next received bytes.
    pub fn feed(&mut self, data: &[u8]) {
        if self.mismatch.is_none() && !data.is_empty() {
            self.scratch.resize(data.len(), 0);
            let want = &mut self.scratch[..data.len()];
            self.pattern.fill(self.offset, want);
            if want != data {
                let at = want.iter().zip(data).position(|(a, b)| a != b);
                self.mismatch = Some(self.offset + at.unwrap_or(0) as u64);
            }
        }
        self.offset += data.len() as u64;
    }
}

// ------------------------------------------------------------------ XMPP

/// A granted slot (XEP-0363 §4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Where to PUT.
    pub put: String,
    /// Headers to send with the PUT (only those §4 allows:
    /// Authorization, Cookie, Expires; line breaks removed).
    pub headers: Vec<(String, String)>,
    /// Where to GET.
    pub get: String,
}

/// A slot request iq.
pub fn slot_request(id: &str, service: &str, filename: &str, size: u64, ctype: &str) -> String {
    let e = client::xml_escape;
    format!(
        "<iq type='get' id='{}' to='{}'><request xmlns='{NS_UPLOAD}' filename='{}' size='{size}' content-type='{}'/></iq>",
        e(id),
        e(service),
        e(filename),
        e(ctype)
    )
}

/// The condition of an error iq (`file-too-large` when the service says
/// so, §6).
fn error_condition(iq: &Element) -> String {
    let err = iq.children().find(|c| c.name() == "error");
    if err.is_some_and(|e| e.has_child("file-too-large", NS_UPLOAD)) {
        return "file-too-large".into();
    }
    err.and_then(|e| e.children().find(|c| c.ns() == NS_STANZAS))
        .map(|c| c.name().to_owned())
        .unwrap_or_else(|| "undefined-condition".into())
}

/// Parses the answer to a slot request: the slot, or a cause (the error
/// condition, `malformed`) and a detail.
pub fn parse_slot(iq: &Element) -> Result<Slot, (String, String)> {
    if iq.attr("type") == Some("error") {
        let cond = error_condition(iq);
        let text = iq
            .children()
            .find(|c| c.name() == "error")
            .and_then(|e| e.children().find(|c| c.name() == "text"))
            .map(|t| format!(": {}", t.text()))
            .unwrap_or_default();
        return Err((cond.clone(), format!("slot refused: {cond}{text}")));
    }
    let malformed = |d: &str| ("malformed".to_owned(), d.to_owned());
    if iq.attr("type") != Some("result") {
        return Err(malformed("the answer is not a result iq"));
    }
    let slot = iq
        .get_child("slot", NS_UPLOAD)
        .ok_or_else(|| malformed("result without <slot xmlns='urn:xmpp:http:upload:0'/>"))?;
    let url = |name: &str| {
        slot.get_child(name, NS_UPLOAD)
            .and_then(|e| e.attr("url"))
            .filter(|u| !u.trim().is_empty())
            .map(|u| u.trim().to_owned())
            .ok_or_else(|| malformed(&format!("<slot/> without <{name} url/>")))
    };
    let (put, get) = (url("put")?, url("get")?);
    let headers = slot
        .get_child("put", NS_UPLOAD)
        .into_iter()
        .flat_map(|p| p.children())
        .filter(|h| h.name() == "header")
        .filter_map(|h| {
            let name = h.attr("name")?.trim();
            let allowed = ["Authorization", "Cookie", "Expires"];
            let name = allowed.iter().find(|a| a.eq_ignore_ascii_case(name))?;
            let value: String = h
                .text()
                .chars()
                .filter(|c| *c != '\r' && *c != '\n')
                .collect();
            Some(((*name).to_owned(), value.trim().to_owned()))
        })
        .collect();
    Ok(Slot { put, headers, get })
}

/// The JIDs of a disco#items result.
pub fn disco_items(iq: &Element) -> Vec<String> {
    iq.get_child("query", NS_DISCO_ITEMS)
        .into_iter()
        .flat_map(|q| q.children())
        .filter(|i| i.name() == "item" && i.attr("node").is_none())
        .filter_map(|i| i.attr("jid").map(str::to_owned))
        .collect()
}

/// What a disco#info result says about upload: `None` if it is not an
/// upload service (identity store/file and the feature), else its
/// `max-file-size` if announced.
pub fn upload_info(iq: &Element) -> Option<Option<u64>> {
    let q = iq.get_child("query", NS_DISCO_INFO)?;
    let identity = q.children().any(|c| {
        c.name() == "identity"
            && c.attr("category") == Some("store")
            && c.attr("type") == Some("file")
    });
    let feature = q
        .children()
        .any(|c| c.name() == "feature" && c.attr("var") == Some(NS_UPLOAD));
    if !identity || !feature {
        return None;
    }
    let field_value = |x: &Element, var: &str| {
        x.children()
            .find(|f| f.name() == "field" && f.attr("var") == Some(var))
            .and_then(|f| f.children().find(|v| v.name() == "value"))
            .map(|v| v.text().trim().to_owned())
    };
    let max = q
        .children()
        .filter(|x| x.is("x", NS_DATA))
        .find(|x| field_value(x, "FORM_TYPE").as_deref() == Some(NS_UPLOAD))
        .and_then(|x| field_value(x, "max-file-size"))
        .and_then(|v| v.parse().ok());
    Some(max)
}

/// The answer to one iq and how long it took, or a cause and a detail.
type IqAnswer = Result<(Element, Duration), (String, String)>;

/// One logged-in user.
struct Session {
    conn: Conn,
    user: u64,
}

impl Session {
    async fn next(&mut self) -> Result<Element, String> {
        loop {
            match self.conn.next_event().await {
                Ok(Event::Element(el)) => return Ok(el),
                Ok(Event::Header) => continue,
                Ok(Event::Closed) => return Err("the server closed the stream".into()),
                Err(e) => return Err(format!("{e:#}")),
            }
        }
    }

    /// Sends the iqs at once and waits for their answers (result or error
    /// iq), answering the server's own iqs meanwhile. Per request: the
    /// answer and how long it took, or `timeout`/`closed`.
    async fn iqs(&mut self, reqs: Vec<(String, String)>, timeout: Duration) -> Vec<IqAnswer> {
        if reqs.is_empty() {
            return Vec::new();
        }
        let mut out: Vec<Option<IqAnswer>> = reqs.iter().map(|_| None).collect();
        let index: HashMap<String, usize> = reqs
            .iter()
            .enumerate()
            .map(|(i, (id, _))| (id.clone(), i))
            .collect();
        let xml: String = reqs.iter().map(|(_, x)| x.as_str()).collect();
        let t0 = Instant::now();
        let mut left = reqs.len();
        let fail_all = |out: &mut Vec<Option<_>>, cause: &str, detail: String| {
            for o in out.iter_mut().filter(|o| o.is_none()) {
                *o = Some(Err((cause.to_owned(), detail.clone())));
            }
        };
        if let Err(e) = self.conn.send(xml.as_bytes()).await {
            fail_all(&mut out, "closed", format!("cannot send: {e}"));
            left = 0;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        while left > 0 {
            let el = match tokio::time::timeout_at(deadline, self.next()).await {
                Err(_) => {
                    fail_all(&mut out, "timeout", format!("no answer in {timeout:?}"));
                    break;
                }
                Ok(Err(e)) => {
                    fail_all(&mut out, "closed", e);
                    break;
                }
                Ok(Ok(el)) => el,
            };
            if el.name() != "iq" {
                continue;
            }
            if let Some(reply) = engine::iq_reply(&el) {
                let _ = self.conn.send(reply.as_bytes()).await;
                continue;
            }
            if let Some(&i) = el.attr("id").and_then(|id| index.get(id)) {
                if out[i].is_none() {
                    out[i] = Some(Ok((el, t0.elapsed())));
                    left -= 1;
                }
            }
        }
        out.into_iter()
            .map(|o| o.unwrap_or_else(|| Err(("closed".into(), "no answer".into()))))
            .collect()
    }

    async fn close(mut self) {
        let _ =
            tokio::time::timeout(Duration::from_secs(2), self.conn.send(b"</stream:stream>")).await;
    }
}

/// The upload service and its limit.
#[derive(Debug)]
struct Service {
    jid: String,
    discovered: bool,
    max: Option<u64>,
}

async fn discover(
    s: &mut Session,
    domain: &str,
    explicit: Option<&str>,
    t: Duration,
) -> anyhow::Result<Service> {
    let info_req = |id: &str, jid: &str| {
        (
            id.to_owned(),
            format!(
                "<iq type='get' id='{id}' to='{}'><query xmlns='{NS_DISCO_INFO}'/></iq>",
                client::xml_escape(jid)
            ),
        )
    };
    if let Some(jid) = explicit {
        let r = s.iqs(vec![info_req("up-info", jid)], t).await;
        let max = match r.into_iter().next() {
            Some(Ok((el, _))) => upload_info(&el).flatten(),
            _ => None,
        };
        return Ok(Service {
            jid: jid.to_owned(),
            discovered: false,
            max,
        });
    }
    let items = format!(
        "<iq type='get' id='up-items' to='{}'><query xmlns='{NS_DISCO_ITEMS}'/></iq>",
        client::xml_escape(domain)
    );
    let r = s.iqs(vec![("up-items".into(), items)], t).await;
    let items = match r.into_iter().next() {
        Some(Ok((el, _))) if el.attr("type") == Some("result") => disco_items(&el),
        Some(Ok((el, _))) => {
            anyhow::bail!("disco#items of {domain} failed: {}", error_condition(&el))
        }
        Some(Err((c, d))) => anyhow::bail!("disco#items of {domain}: {c}: {d}"),
        None => Vec::new(),
    };
    let reqs: Vec<(String, String)> = items
        .iter()
        .enumerate()
        .map(|(i, jid)| info_req(&format!("up-info-{i}"), jid))
        .collect();
    let answers = s.iqs(reqs, t).await;
    for (jid, a) in items.iter().zip(answers) {
        if let Ok((el, _)) = a {
            if let Some(max) = upload_info(&el) {
                return Ok(Service {
                    jid: jid.clone(),
                    discovered: true,
                    max,
                });
            }
        }
    }
    anyhow::bail!(
        "no HTTP File Upload service (identity store/file, feature {NS_UPLOAD}) among the {} \
         disco#items of {domain} ({}); enable one (Starling: [modules.upload] enabled = true \
         and an [[http.listen]]) or name it with --service",
        items.len(),
        items.join(", ")
    )
}

// ------------------------------------------------------------------ HTTP

/// A parsed `http:`/`https:` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    /// `https:`.
    pub tls: bool,
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// Port (default 80 or 443).
    pub port: u16,
    /// The Host header (the authority as written).
    pub authority: String,
    /// Path and query (at least `/`), fragment removed.
    pub path: String,
}

/// Parses an absolute `http:` or `https:` URL.
pub fn parse_url(s: &str) -> Result<Url, String> {
    let s = s.trim();
    let (scheme, rest) = s.split_once("://").ok_or("not an absolute URL")?;
    let tls = match scheme.to_ascii_lowercase().as_str() {
        "http" => false,
        "https" => true,
        other => return Err(format!("scheme {other:?} is not http or https")),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if authority.contains('@') {
        return Err("user information in the URL is not supported".into());
    }
    if authority.is_empty() {
        return Err("no host in the URL".into());
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or("unclosed [ in the host")?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("junk after the IPv6 address")?),
        };
        (h, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("no host in the URL".into());
    }
    let port = match port {
        None | Some("") => {
            if tls {
                443
            } else {
                80
            }
        }
        Some(p) => p.parse().map_err(|_| format!("bad port {p:?}"))?,
    };
    let tail = tail.split('#').next().unwrap_or("");
    let path = if tail.starts_with('/') {
        tail.to_owned()
    } else {
        format!("/{tail}")
    };
    if path.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err("spaces or control characters in the path".into());
    }
    Ok(Url {
        tls,
        host: host.to_owned(),
        port,
        authority: authority.to_owned(),
        path,
    })
}

/// How a response body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyLen {
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// With the connection.
    UntilClose,
}

/// A response's status line and headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    /// Status code.
    pub status: u16,
    /// Reason phrase.
    pub reason: String,
    /// Headers, names as sent.
    pub headers: Vec<(String, String)>,
    /// How the body ends.
    pub body: BodyLen,
}

impl Head {
    /// The first header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Parses a response head at the start of `buf` (lines ending in CRLF or
/// a bare LF): `Ok(None)` if incomplete, else the head and the bytes it
/// took. Interim (1xx) heads are returned like others; the caller skips
/// them.
pub fn parse_head(buf: &[u8]) -> Result<Option<(Head, usize)>, String> {
    // The end of the head: the first empty line.
    let mut end = None;
    let mut start = 0;
    while let Some(nl) = buf[start..].iter().position(|&b| b == b'\n') {
        let line = &buf[start..start + nl];
        if line.is_empty() || line == b"\r" {
            end = Some((start, start + nl + 1));
            break;
        }
        start += nl + 1;
    }
    let Some((head_end, used)) = end else {
        if buf.len() > MAX_HEAD {
            return Err(format!("response head longer than {MAX_HEAD} bytes"));
        }
        return Ok(None);
    };
    if head_end > MAX_HEAD {
        return Err(format!("response head longer than {MAX_HEAD} bytes"));
    }
    let text = std::str::from_utf8(&buf[..head_end])
        .map_err(|_| "response head is not UTF-8".to_owned())?;
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(format!("not an HTTP/1.x status line: {status_line:?}"));
    }
    let code = parts.next().unwrap_or("");
    if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("bad status code in {status_line:?}"));
    }
    let status: u16 = code.parse().map_err(|_| "bad status code".to_owned())?;
    let reason = parts.next().unwrap_or("").trim().to_owned();
    let mut headers = Vec::new();
    for l in lines.filter(|l| !l.is_empty()) {
        if l.starts_with([' ', '\t']) {
            return Err("obsolete header line folding".into());
        }
        let (k, v) = l
            .split_once(':')
            .ok_or_else(|| format!("header line without a colon: {l:?}"))?;
        if k.is_empty() || k.ends_with([' ', '\t']) {
            return Err(format!("bad header name in {l:?}"));
        }
        headers.push((k.to_owned(), v.trim().to_owned()));
    }
    let mut length: Option<u64> = None;
    let mut chunked = false;
    for (k, v) in &headers {
        if k.eq_ignore_ascii_case("content-length") {
            // "10, 10" (a list of equal values) is allowed (RFC 9110 §8.6).
            for part in v.split(',').map(str::trim) {
                if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(format!("bad Content-Length {v:?}"));
                }
                let n: u64 = part
                    .parse()
                    .map_err(|_| format!("Content-Length {v:?} too large"))?;
                if length.is_some_and(|l| l != n) {
                    return Err("conflicting Content-Length values".into());
                }
                length = Some(n);
            }
        } else if k.eq_ignore_ascii_case("transfer-encoding") {
            let last = v.rsplit(',').next().unwrap_or("").trim();
            if last.eq_ignore_ascii_case("chunked") {
                chunked = true;
            } else if !v.trim().is_empty() && !last.eq_ignore_ascii_case("identity") {
                return Err(format!("unsupported Transfer-Encoding {v:?}"));
            }
        }
    }
    let body = if status / 100 == 1 || status == 204 || status == 304 {
        BodyLen::Length(0)
    } else if chunked {
        BodyLen::Chunked
    } else if let Some(n) = length {
        BodyLen::Length(n)
    } else {
        BodyLen::UntilClose
    };
    Ok(Some((
        Head {
            status,
            reason,
            headers,
            body,
        },
        used,
    )))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChunkState {
    Size,
    Data(u64),
    DataEnd,
    Trailer,
    Done,
}

/// A `Transfer-Encoding: chunked` decoder fed any slices of the body.
#[derive(Debug)]
pub struct Chunked {
    state: ChunkState,
    line: Vec<u8>,
}

impl Default for Chunked {
    fn default() -> Self {
        Chunked {
            state: ChunkState::Size,
            line: Vec::new(),
        }
    }
}

impl Chunked {
    /// Whether the last chunk and the trailers were read.
    pub fn done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Decodes `input`, handing the data to `out`; returns the bytes
    /// consumed (less than `input.len()` only once done).
    pub fn feed(&mut self, input: &[u8], out: &mut impl FnMut(&[u8])) -> Result<usize, String> {
        let mut i = 0;
        while i < input.len() {
            match self.state {
                ChunkState::Done => break,
                ChunkState::Data(left) => {
                    let n = (left.min((input.len() - i) as u64)) as usize;
                    out(&input[i..i + n]);
                    i += n;
                    self.state = if left == n as u64 {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left - n as u64)
                    };
                }
                ChunkState::Size | ChunkState::DataEnd | ChunkState::Trailer => {
                    let b = input[i];
                    i += 1;
                    if b != b'\n' {
                        if self.line.len() >= 4096 {
                            return Err("chunk size or trailer line too long".into());
                        }
                        self.line.push(b);
                        continue;
                    }
                    let mut line = std::mem::take(&mut self.line);
                    if line.last() == Some(&b'\r') {
                        line.pop();
                    }
                    self.state = match self.state {
                        ChunkState::Size => {
                            let size = line.split(|&c| c == b';').next().unwrap_or(&[]);
                            let size = std::str::from_utf8(size)
                                .map_err(|_| "chunk size is not ASCII".to_owned())?
                                .trim();
                            if size.is_empty()
                                || size.len() > 15
                                || !size.bytes().all(|c| c.is_ascii_hexdigit())
                            {
                                return Err(format!("bad chunk size {size:?}"));
                            }
                            match u64::from_str_radix(size, 16) {
                                Ok(0) => ChunkState::Trailer,
                                Ok(n) => ChunkState::Data(n),
                                Err(_) => return Err(format!("bad chunk size {size:?}")),
                            }
                        }
                        ChunkState::DataEnd if line.is_empty() => ChunkState::Size,
                        ChunkState::DataEnd => return Err("no CRLF after chunk data".into()),
                        _ if line.is_empty() => ChunkState::Done,
                        _ => ChunkState::Trailer,
                    };
                }
            }
        }
        Ok(i)
    }
}

/// Why a transfer failed: a report bucket and a detail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fail {
    /// `http-NNN`, `verify`, `length`, `short`, `connect`, `tls`,
    /// `timeout`, `io`, `closed`, `malformed`, `url`.
    pub cause: String,
    /// What happened.
    pub detail: String,
}

impl Fail {
    fn new(cause: &str, detail: impl Into<String>) -> Fail {
        Fail {
            cause: cause.to_owned(),
            detail: detail.into(),
        }
    }
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.cause, self.detail)
    }
}

fn io_fail(what: &str, e: io::Error) -> Fail {
    Fail::new("io", format!("{what}: {e}"))
}

/// Runs one read or write with the no-progress timeout.
async fn timed<T>(
    t: Duration,
    what: &str,
    f: impl std::future::Future<Output = io::Result<T>>,
) -> Result<T, Fail> {
    match tokio::time::timeout(t, f).await {
        Err(_) => Err(Fail::new("timeout", format!("no progress in {t:?} {what}"))),
        Ok(Err(e)) => Err(io_fail(what, e)),
        Ok(Ok(v)) => Ok(v),
    }
}

/// The HTTP side: TLS, addresses, timeouts.
struct Http {
    tls: TlsConnector,
    addr_override: Option<SocketAddr>,
    /// Resolved addresses per (host, port), the last one that worked first.
    resolved: Mutex<HashMap<(String, u16), Vec<SocketAddr>>>,
    connect_timeout: Duration,
    io_timeout: Duration,
    chunk: usize,
}

impl Http {
    async fn addrs(&self, url: &Url) -> Result<Vec<SocketAddr>, Fail> {
        if let Some(a) = self.addr_override {
            return Ok(vec![a]);
        }
        if let Ok(ip) = url.host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, url.port)]);
        }
        let key = (url.host.clone(), url.port);
        if let Some(v) = self.lock().get(&key) {
            return Ok(v.clone());
        }
        let found: Vec<SocketAddr> = tokio::net::lookup_host((url.host.as_str(), url.port))
            .await
            .map_err(|e| Fail::new("connect", format!("cannot resolve {}: {e}", url.host)))?
            .collect();
        if found.is_empty() {
            return Err(Fail::new("connect", format!("{} has no address", url.host)));
        }
        self.lock().insert(key, found.clone());
        Ok(found)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u16), Vec<SocketAddr>>> {
        self.resolved.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn connect(&self, url: &Url) -> Result<Transport, Fail> {
        let addrs = self.addrs(url).await?;
        let mut last = String::new();
        let mut tcp = None;
        for (k, a) in addrs.iter().enumerate() {
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(a)).await {
                Ok(Ok(s)) => {
                    if k > 0 {
                        if let Some(v) = self.lock().get_mut(&(url.host.clone(), url.port)) {
                            v.retain(|x| x != a);
                            v.insert(0, *a);
                        }
                    }
                    tcp = Some(s);
                    break;
                }
                Ok(Err(e)) => last = format!("{a}: {e}"),
                Err(_) => last = format!("{a}: timed out"),
            }
        }
        let tcp = tcp.ok_or_else(|| Fail::new("connect", last))?;
        let _ = tcp.set_nodelay(true);
        if !url.tls {
            return Ok(Transport::Plain(tcp));
        }
        let name = ServerName::try_from(url.host.clone())
            .map_err(|e| Fail::new("tls", format!("bad server name {:?}: {e}", url.host)))?;
        match tokio::time::timeout(self.connect_timeout, self.tls.connect(name, tcp)).await {
            Err(_) => Err(Fail::new("timeout", "in the TLS handshake")),
            Ok(Err(e)) => Err(Fail::new("tls", e.to_string())),
            Ok(Ok(s)) => Ok(Transport::Tls(Box::new(s))),
        }
    }

    /// Reads a final (non-1xx) response head; `buf` keeps what followed it.
    async fn read_head(&self, io: &mut Transport, buf: &mut Vec<u8>) -> Result<Head, Fail> {
        let mut chunk = vec![0u8; 8192];
        loop {
            match parse_head(buf) {
                Err(e) => return Err(Fail::new("malformed", e)),
                Ok(Some((h, used))) => {
                    buf.drain(..used);
                    if h.status / 100 == 1 {
                        continue;
                    }
                    return Ok(h);
                }
                Ok(None) => {}
            }
            let n = timed(self.io_timeout, "reading the response", io.read(&mut chunk)).await?;
            if n == 0 {
                return Err(Fail::new("closed", "connection closed before a response"));
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Reads a body of `len` after the head (`buf`: bytes already read),
    /// handing it to `sink`; returns the body's length.
    async fn read_body(
        &self,
        io: &mut Transport,
        buf: Vec<u8>,
        len: BodyLen,
        mut sink: impl FnMut(&[u8]),
    ) -> Result<u64, Fail> {
        let mut got = 0u64;
        let mut dec = Chunked::default();
        let mut take = |data: &[u8], got: &mut u64| -> Result<bool, Fail> {
            match len {
                BodyLen::Length(n) => {
                    let k = ((n - *got) as usize).min(data.len());
                    sink(&data[..k]);
                    *got += k as u64;
                    Ok(*got >= n)
                }
                BodyLen::UntilClose => {
                    sink(data);
                    *got += data.len() as u64;
                    Ok(false)
                }
                BodyLen::Chunked => {
                    dec.feed(data, &mut |d: &[u8]| {
                        sink(d);
                        *got += d.len() as u64;
                    })
                    .map_err(|e| Fail::new("malformed", e))?;
                    Ok(dec.done())
                }
            }
        };
        if len == BodyLen::Length(0) || take(&buf, &mut got)? {
            return Ok(got);
        }
        drop(buf);
        let mut chunk = vec![0u8; READ_BUF];
        loop {
            let n = match tokio::time::timeout(self.io_timeout, io.read(&mut chunk)).await {
                Err(_) => {
                    return Err(Fail::new(
                        "timeout",
                        format!(
                            "no progress in {:?} after {got} body bytes",
                            self.io_timeout
                        ),
                    ))
                }
                // A TLS peer that closes without close_notify: the end of
                // an until-close body, else an early end.
                Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => 0,
                Ok(Err(e)) => return Err(io_fail("reading the body", e)),
                Ok(Ok(n)) => n,
            };
            if n == 0 {
                if len == BodyLen::UntilClose {
                    return Ok(got);
                }
                return Err(Fail::new(
                    "short",
                    format!("connection closed after {got} body bytes ({len:?})"),
                ));
            }
            if take(&chunk[..n], &mut got)? {
                return Ok(got);
            }
        }
    }

    /// A short piece of an error response's body, for the report.
    async fn error_detail(&self, io: &mut Transport, buf: Vec<u8>, h: &Head) -> String {
        let mut text = Vec::new();
        // Whatever arrives in 2 s; a broken or slow body is not the point.
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            self.read_body(io, buf, h.body, |d| {
                let room = 200usize.saturating_sub(text.len());
                text.extend_from_slice(&d[..room.min(d.len())]);
            }),
        )
        .await;
        let text = String::from_utf8_lossy(&text);
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if text.is_empty() {
            format!("HTTP {} {}", h.status, h.reason)
        } else {
            format!("HTTP {} {}: {text}", h.status, h.reason)
        }
    }

    /// PUTs `size` bytes of `pattern` to the slot.
    async fn put(
        &self,
        slot: &Slot,
        size: u64,
        pattern: Pattern,
        ctype: &str,
        progress: &AtomicU64,
    ) -> Result<(), Fail> {
        let url =
            parse_url(&slot.put).map_err(|e| Fail::new("url", format!("{e}: {}", slot.put)))?;
        let mut io = self.connect(&url).await?;
        let mut head = format!(
            "PUT {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: starling-bench\r\nContent-Type: {ctype}\r\nContent-Length: {size}\r\n",
            url.path, url.authority
        );
        for (k, v) in &slot.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("Connection: close\r\n\r\n");
        let mut buf = vec![0u8; self.chunk.max(1)];
        let sent = async {
            timed(
                self.io_timeout,
                "sending the request",
                io.write_all(head.as_bytes()),
            )
            .await?;
            let mut off = 0u64;
            while off < size {
                let n = ((size - off) as usize).min(buf.len());
                pattern.fill(off, &mut buf[..n]);
                timed(self.io_timeout, "sending the body", io.write_all(&buf[..n])).await?;
                off += n as u64;
                progress.fetch_add(n as u64, Relaxed);
            }
            timed(self.io_timeout, "sending the body", io.flush()).await
        }
        .await;
        drop(buf);
        let mut rbuf = Vec::new();
        let head = match sent {
            Ok(()) => self.read_head(&mut io, &mut rbuf).await?,
            // The server may have answered (413, 403…) and closed before
            // the whole body: its answer says more than the broken pipe.
            Err(e) => {
                let early = tokio::time::timeout(
                    Duration::from_secs(2),
                    self.read_head(&mut io, &mut rbuf),
                )
                .await;
                match early {
                    Ok(Ok(h)) => h,
                    _ => return Err(e),
                }
            }
        };
        if !(200..300).contains(&head.status) {
            let detail = self.error_detail(&mut io, rbuf, &head).await;
            return Err(Fail::new(&format!("http-{}", head.status), detail));
        }
        self.read_body(&mut io, rbuf, head.body, |_| {}).await?;
        let _ = tokio::time::timeout(Duration::from_secs(1), io.shutdown()).await;
        Ok(())
    }

    /// GETs the file and checks it is `size` bytes of `pattern`.
    async fn get(
        &self,
        slot: &Slot,
        size: u64,
        pattern: Pattern,
        progress: &AtomicU64,
    ) -> Result<(), Fail> {
        let url =
            parse_url(&slot.get).map_err(|e| Fail::new("url", format!("{e}: {}", slot.get)))?;
        let mut io = self.connect(&url).await?;
        let req = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: starling-bench\r\nAccept: */*\r\nConnection: close\r\n\r\n",
            url.path, url.authority
        );
        timed(self.io_timeout, "sending the request", async {
            io.write_all(req.as_bytes()).await?;
            io.flush().await
        })
        .await?;
        let mut rbuf = Vec::new();
        let head = self.read_head(&mut io, &mut rbuf).await?;
        if head.status != 200 {
            let detail = self.error_detail(&mut io, rbuf, &head).await;
            return Err(Fail::new(&format!("http-{}", head.status), detail));
        }
        if let BodyLen::Length(n) = head.body {
            if n != size {
                return Err(Fail::new(
                    "length",
                    format!("Content-Length {n}, the file has {size} bytes"),
                ));
            }
        }
        let mut v = Verifier::new(pattern);
        let got = self
            .read_body(&mut io, rbuf, head.body, |d| {
                v.feed(d);
                progress.fetch_add(d.len() as u64, Relaxed);
            })
            .await?;
        if let Some(at) = v.mismatch {
            return Err(Fail::new(
                "verify",
                format!("byte {at} differs from what was uploaded"),
            ));
        }
        if got != size {
            return Err(Fail::new(
                "length",
                format!("{got} bytes received, the file has {size}"),
            ));
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), io.shutdown()).await;
        Ok(())
    }
}

// ------------------------------------------------------------------ memory

/// Samples a process's VmRSS until finished.
pub struct RssSampler {
    pid: u32,
    before: u64,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<(u64, u64)>,
}

impl RssSampler {
    /// Starts sampling `pid` every `every` (None if its memory is not
    /// readable).
    pub fn start(pid: u32, every: Duration) -> Option<RssSampler> {
        let before = procmem::rss_kb(pid).ok()?;
        let (stop, mut rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut max = before;
            let mut samples = 1u64;
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        if let Ok(kb) = procmem::rss_kb(pid) {
                            max = max.max(kb);
                            samples += 1;
                        }
                    }
                    _ = rx.changed() => break,
                }
            }
            (max, samples)
        });
        Some(RssSampler {
            pid,
            before,
            stop,
            task,
        })
    }

    /// Stops sampling; takes the "after" reading.
    pub async fn finish(self) -> RssWindow {
        let _ = self.stop.send(true);
        let (mut max, mut samples) = self.task.await.unwrap_or((self.before, 1));
        let after = procmem::rss_kb(self.pid).unwrap_or(0);
        if after > 0 {
            max = max.max(after);
            samples += 1;
        }
        RssWindow {
            before_kb: self.before,
            max_kb: max,
            after_kb: after,
            growth_kb: max.saturating_sub(self.before),
            samples,
        }
    }
}

// ------------------------------------------------------------------ phases

/// What every phase shares.
struct Ctx {
    http: Arc<Http>,
    service: String,
    content_type: String,
    server_pid: Option<u32>,
    sample: Duration,
    slot_timeout: Duration,
    quiet: bool,
    pb: ProgressBar,
    /// Mixed into every file's pattern seed, new each run.
    nonce: u64,
    /// The scheme of the first slot's PUT URL.
    scheme: Mutex<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Up,
    Down,
}

/// One file of a phase with its slot.
#[derive(Clone)]
struct Job {
    index: usize,
    slot: Arc<Slot>,
    pattern: Pattern,
}

fn record(failures: &mut BTreeMap<String, u64>, first: &mut Option<String>, f: &Fail) {
    *failures.entry(f.cause.clone()).or_default() += 1;
    first.get_or_insert_with(|| f.to_string());
}

/// Runs every job's PUT (or GET) at once; returns the stats and the jobs
/// that succeeded.
async fn transfer(
    ctx: &Ctx,
    dir: Dir,
    phase: &str,
    jobs: Vec<Job>,
    size: u64,
) -> (TransferStats, Vec<Job>) {
    if jobs.is_empty() {
        return (TransferStats::default(), Vec::new());
    }
    let what = if dir == Dir::Up { "upload" } else { "download" };
    let total = size * jobs.len() as u64;
    let progress = Arc::new(AtomicU64::new(0));
    let ticker = {
        let (pb, progress, label) = (ctx.pb.clone(), progress.clone(), format!("{phase}: {what}"));
        let t0 = Instant::now();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                let done = progress.load(Relaxed);
                let secs = t0.elapsed().as_secs_f64().max(1e-3);
                pb.set_message(format!(
                    "{label} {} of {} ({:.1} MiB/s)",
                    human_bytes(done),
                    human_bytes(total),
                    done as f64 / secs / 1048576.0
                ));
            }
        })
    };
    let me = std::process::id();
    let cpu0 = (
        ctx.server_pid.and_then(procmem::cpu_secs),
        procmem::cpu_secs(me),
    );
    let sampler = ctx
        .server_pid
        .and_then(|p| RssSampler::start(p, ctx.sample));
    let files = jobs.len() as u64;
    let t0 = Instant::now();
    let mut set = JoinSet::new();
    for job in jobs {
        let (http, ctype, progress) =
            (ctx.http.clone(), ctx.content_type.clone(), progress.clone());
        set.spawn(async move {
            let start = Instant::now();
            let r = match dir {
                Dir::Up => {
                    http.put(&job.slot, size, job.pattern, &ctype, &progress)
                        .await
                }
                Dir::Down => http.get(&job.slot, size, job.pattern, &progress).await,
            };
            (job, start.elapsed(), r)
        });
    }
    let mut stats = TransferStats {
        files,
        ..TransferStats::default()
    };
    let mut lat = Latency::new();
    let mut ok = Vec::new();
    while let Some(j) = set.join_next().await {
        match j {
            Ok((job, took, Ok(()))) => {
                lat.record_us(took.as_micros() as u64);
                ok.push(job);
            }
            Ok((_, _, Err(f))) => record(&mut stats.failures, &mut stats.first_error, &f),
            Err(e) => record(
                &mut stats.failures,
                &mut stats.first_error,
                &Fail::new("panic", e.to_string()),
            ),
        }
    }
    stats.duration_s = t0.elapsed().as_secs_f64();
    ticker.abort();
    if let Some(s) = sampler {
        stats.memory = Some(s.finish().await);
    }
    let cpu1 = (
        ctx.server_pid.and_then(procmem::cpu_secs),
        procmem::cpu_secs(me),
    );
    stats.server_cpu_s = cpu0.0.zip(cpu1.0).map(|(a, b)| b - a);
    stats.client_cpu_s = cpu0.1.zip(cpu1.1).map(|(a, b)| b - a);
    stats.ok = ok.len() as u64;
    stats.bytes = stats.ok * size;
    stats.mib_per_s = stats.bytes as f64 / stats.duration_s.max(1e-9) / 1048576.0;
    stats.latency = lat.summary();
    ok.sort_by_key(|j| j.index);
    if !ctx.quiet {
        say(
            &ctx.pb,
            format!(
                "upload: {phase}: {what} {}/{} files of {} in {:.2} s => {:.1} MiB/s",
                stats.ok,
                files,
                human_bytes(size),
                stats.duration_s,
                stats.mib_per_s
            ),
        );
    }
    (stats, ok)
}

/// A line on stderr above the progress bar (also when the bar is hidden:
/// no terminal).
fn say(pb: &ProgressBar, line: String) {
    if pb.is_hidden() {
        eprintln!("{line}");
    } else {
        pb.println(line);
    }
}

/// The file name of file `i` of a phase.
fn file_name(phase: &str, i: usize) -> String {
    format!("starling-bench-{phase}-{i}.bin")
}

/// Slots, uploads, downloads of `files` files of `size` bytes.
async fn run_phase(
    ctx: &Ctx,
    sessions: &mut [Session],
    phase: &str,
    files: usize,
    size: u64,
    seed: u64,
) -> UploadPhase {
    let t0 = Instant::now();
    ctx.pb
        .set_message(format!("{phase}: requesting {files} slot(s)"));
    let users = sessions.len();
    let answers = join_all(sessions.iter_mut().enumerate().map(|(k, s)| {
        let mine: Vec<usize> = (k..files).step_by(users).collect();
        let reqs = mine
            .iter()
            .map(|&i| {
                let id = format!("{phase}-slot-{i}");
                let xml = slot_request(
                    &id,
                    &ctx.service,
                    &file_name(phase, i),
                    size,
                    &ctx.content_type,
                );
                (id, xml)
            })
            .collect();
        async move {
            let r = s.iqs(reqs, ctx.slot_timeout).await;
            mine.into_iter().zip(r).collect::<Vec<_>>()
        }
    }))
    .await;
    let mut slots = SlotStats {
        requested: files as u64,
        ..SlotStats::default()
    };
    let mut lat = Latency::new();
    let mut jobs = Vec::new();
    for (i, a) in answers.into_iter().flatten() {
        let parsed = a.and_then(|(el, took)| parse_slot(&el).map(|s| (s, took)));
        match parsed {
            Ok((slot, took)) => {
                lat.record_us(took.as_micros() as u64);
                jobs.push(Job {
                    index: i,
                    slot: Arc::new(slot),
                    pattern: Pattern::new(
                        seed ^ ctx.nonce ^ (i as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93),
                    ),
                });
            }
            Err((cause, detail)) => {
                *slots.failures.entry(cause).or_default() += 1;
                slots.first_error.get_or_insert(detail);
            }
        }
    }
    jobs.sort_by_key(|j| j.index);
    if let Some(j) = jobs.first() {
        let mut scheme = ctx.scheme.lock().unwrap_or_else(|e| e.into_inner());
        if scheme.is_empty() {
            *scheme = j
                .slot
                .put
                .split("://")
                .next()
                .unwrap_or("")
                .to_ascii_lowercase();
        }
    }
    slots.granted = jobs.len() as u64;
    slots.latency = lat.summary();
    slots.duration_s = t0.elapsed().as_secs_f64();
    let (upload, uploaded) = transfer(ctx, Dir::Up, phase, jobs, size).await;
    let (download, verified) = transfer(ctx, Dir::Down, phase, uploaded, size).await;
    UploadPhase {
        name: phase.to_owned(),
        files: files as u64,
        file_bytes: size,
        slots,
        upload,
        download,
        verified: verified.len() as u64,
        total_s: t0.elapsed().as_secs_f64(),
    }
}

fn check(a: &UploadArgs) -> anyhow::Result<()> {
    let sc = &a.scenario;
    anyhow::ensure!(sc.conn.users > 0, "--users must be at least 1");
    anyhow::ensure!(
        sc.conn.users <= sc.sessions_per_process() && sc.worker_index.is_none(),
        "upload runs in one process: at most {} sessions (--max-per-process)",
        sc.sessions_per_process()
    );
    anyhow::ensure!(
        !sc.conn.sm,
        "upload does not speak XEP-0198 stream management: leave out --sm"
    );
    anyhow::ensure!(
        a.http_timeout_secs > 0.0 && a.http_timeout_secs.is_finite(),
        "--http-timeout-secs must be positive"
    );
    anyhow::ensure!(
        !a.content_type.is_empty()
            && a.content_type
                .bytes()
                .all(|b| b.is_ascii_graphic() || b == b' '),
        "--content-type must be printable ASCII"
    );
    anyhow::ensure!(
        a.parallel <= 100_000,
        "--parallel above 100000 would run out of file descriptors"
    );
    Ok(())
}

/// Runs the scenario.
pub async fn run(a: UploadArgs) -> anyhow::Result<()> {
    check(&a)?;
    let sc = &a.scenario;
    let target = engine::target_of(sc)?;
    let server_pid = sc
        .server_pid
        .or_else(|| procmem::pid_listening_on(sc.conn.port).ok());
    let mut result = engine::skeleton(Scenario::Upload, sc, 1);
    let shared = Arc::new(Shared::new(RateSchedule::new(&[], 1.0, 1)));
    let pb = engine::progress_bar(sc, sc.conn.users);
    let reporter = engine::spawn_reporter(sc, shared.clone(), pb.clone());
    let (lo, hi) = (sc.conn.first_user, sc.conn.first_user + sc.conn.users);
    let mut sessions = Vec::new();
    result.connect = engine::storm(sc, &target, lo, hi, false, &shared, |n, conn| {
        sessions.push(Session { conn, user: n })
    })
    .await;
    reporter.abort();
    sessions.sort_by_key(|s| s.user);
    if sessions.is_empty() {
        pb.finish_and_clear();
        anyhow::bail!(
            "no session established: {}",
            result.connect.first_error.as_deref().unwrap_or("?")
        );
    }
    let step = Duration::from_secs_f64(sc.conn.step_timeout);
    pb.set_message("discovering the upload service");
    let service = match discover(
        &mut sessions[0],
        &sc.conn.domain,
        a.service.as_deref(),
        step,
    )
    .await
    {
        Ok(s) => s,
        Err(e) => {
            pb.finish_and_clear();
            for s in sessions {
                s.close().await;
            }
            return Err(e);
        }
    };
    if let Some(max) = service.max {
        for (what, bytes) in [("--big-mb", a.big_bytes()), ("--small-kb", a.small_bytes())] {
            if bytes > max {
                say(
                    &pb,
                    format!(
                    "upload: warning: {what} makes files of {bytes} bytes, above the service's \
                     max-file-size of {max}: expect file-too-large (raise the server's limit)"
                ),
                );
            }
        }
    }
    let ctx = Ctx {
        http: Arc::new(Http {
            tls: client::tls_connector()?,
            addr_override: a.http_addr,
            resolved: Mutex::new(HashMap::new()),
            connect_timeout: step,
            io_timeout: Duration::from_secs_f64(a.http_timeout_secs),
            chunk: (a.chunk_kb * 1024) as usize,
        }),
        service: service.jid.clone(),
        content_type: a.content_type.clone(),
        server_pid,
        sample: Duration::from_millis(a.sample_ms),
        slot_timeout: step,
        quiet: sc.quiet,
        pb: pb.clone(),
        nonce: engine::now_us(),
        scheme: Mutex::new(String::new()),
    };
    let mut phases = Vec::new();
    if a.big_mb > 0 {
        phases.push(run_phase(&ctx, &mut sessions, "big", 1, a.big_bytes(), 1).await);
    }
    if a.parallel > 0 && a.small_kb > 0 {
        phases.push(
            run_phase(
                &ctx,
                &mut sessions,
                "parallel",
                a.parallel as usize,
                a.small_bytes(),
                2,
            )
            .await,
        );
    }
    pb.set_message("closing sessions");
    join_all(sessions.into_iter().map(Session::close)).await;
    pb.finish_and_clear();
    let scheme = ctx.scheme.lock().unwrap_or_else(|e| e.into_inner()).clone();
    result.upload = Some(UploadResult {
        service: service.jid,
        discovered: service.discovered,
        max_file_size: service.max,
        content_type: a.content_type.clone(),
        scheme,
        server_pid,
        sample_ms: a.sample_ms,
        phases,
    });
    engine::output(&result, sc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Command;
    use crate::rooms::test_util::{command, parse};

    #[test]
    fn arguments_reach_the_scenario() {
        let Command::Upload(a) = command(&[
            "upload",
            "--big-mb",
            "2",
            "--parallel",
            "5",
            "--small-kb",
            "64",
            "--chunk-kb",
            "16",
        ]) else {
            panic!()
        };
        assert!(check(&a).is_ok());
        assert_eq!(
            (a.big_bytes(), a.parallel, a.small_bytes()),
            (2 << 20, 5, 64 << 10)
        );
        let Command::Upload(a) = command(&["upload", "--sm"]) else {
            panic!()
        };
        assert!(check(&a).is_err(), "--sm is refused");
        let Command::Upload(a) = command(&["upload", "--content-type", "image/png\r\nX: y"]) else {
            panic!()
        };
        assert!(check(&a).is_err(), "no header injection through the type");
        let Command::Upload(a) = command(&["upload", "--http-timeout-secs", "0"]) else {
            panic!()
        };
        assert!(check(&a).is_err());
    }

    #[test]
    fn patterns_are_random_access_and_differ_per_seed() {
        let p = Pattern::new(42);
        let mut whole = vec![0u8; 1000];
        p.fill(0, &mut whole);
        // Any split gives the same bytes.
        for cut in [1usize, 3, 7, 8, 9, 17, 500, 999] {
            let (mut a, mut b) = (vec![0u8; cut], vec![0u8; 1000 - cut]);
            p.fill(0, &mut a);
            p.fill(cut as u64, &mut b);
            assert_eq!([a, b].concat(), whole, "cut at {cut}");
        }
        let mut mid = vec![0u8; 5];
        p.fill(13, &mut mid);
        assert_eq!(mid, whole[13..18]);
        let mut other = vec![0u8; 1000];
        Pattern::new(43).fill(0, &mut other);
        assert_ne!(other, whole);
        // Not a constant or short-period stream.
        assert!(whole.iter().collect::<std::collections::HashSet<_>>().len() > 200);
        assert_ne!(whole[..8], whole[8..16]);
    }

    #[test]
    fn verifier_finds_the_first_wrong_byte() {
        let p = Pattern::new(7);
        let mut data = vec![0u8; 10_000];
        p.fill(0, &mut data);
        let mut v = Verifier::new(p);
        for piece in data.chunks(333) {
            v.feed(piece);
        }
        assert_eq!((v.offset, v.mismatch), (10_000, None));
        data[4321] ^= 1;
        let mut v = Verifier::new(p);
        for piece in data.chunks(1000) {
            v.feed(piece);
        }
        assert_eq!(v.mismatch, Some(4321));
        // Another file's bytes do not verify.
        let mut v = Verifier::new(Pattern::new(8));
        v.feed(&data[..64]);
        assert!(v.mismatch.is_some());
    }

    #[test]
    fn slot_requests_are_escaped_xml() {
        let xml = slot_request("s1", "upload.example.org", "a'b&<c>.bin", 123, "image/png");
        let el = parse(&format!("<wrap xmlns='jabber:client'>{xml}</wrap>"));
        let iq = el.children().next().unwrap();
        assert_eq!(
            (iq.attr("type"), iq.attr("to")),
            (Some("get"), Some("upload.example.org"))
        );
        let r = iq.get_child("request", NS_UPLOAD).unwrap();
        assert_eq!(r.attr("filename"), Some("a'b&<c>.bin"));
        assert_eq!(r.attr("size"), Some("123"));
        assert_eq!(r.attr("content-type"), Some("image/png"));
    }

    #[test]
    fn slots_are_parsed() {
        // XEP-0363 §4, Example 5, with a header that must be dropped and
        // one with a line break.
        let iq = parse(
            "<iq xmlns='jabber:client' from='upload.montague.tld' id='step_03' to='romeo@montague.tld/garden' type='result'>\
             <slot xmlns='urn:xmpp:http:upload:0'>\
             <put url='https://upload.montague.tld/4a771ac1-f0b2-4a4a-9700-f2a26fa2bb67/tr%C3%A8s%20cool.jpg'>\
             <header name='Authorization'>Basic Base64String==</header>\
             <header name='Cookie'>foo=bar;\r\n user=romeo</header>\
             <header name='X-Evil'>no</header>\
             </put>\
             <get url=' https://download.montague.tld/4a771ac1-f0b2-4a4a-9700-f2a26fa2bb67/tr%C3%A8s%20cool.jpg'/>\
             </slot></iq>",
        );
        let s = parse_slot(&iq).unwrap();
        assert!(s.put.starts_with("https://upload.montague.tld/4a77"));
        assert!(
            s.get.starts_with("https://download.montague.tld/"),
            "trimmed"
        );
        assert_eq!(
            s.headers,
            vec![
                (
                    "Authorization".to_owned(),
                    "Basic Base64String==".to_owned()
                ),
                ("Cookie".to_owned(), "foo=bar; user=romeo".to_owned()),
            ]
        );
        // §6: too large, with the limit; quota; other errors.
        let too_large = parse(
            "<iq xmlns='jabber:client' id='s' type='error'><error type='modify'>\
             <not-acceptable xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/>\
             <text xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'>File too large. The maximum file size is 20000 bytes</text>\
             <file-too-large xmlns='urn:xmpp:http:upload:0'><max-file-size>20000</max-file-size></file-too-large>\
             </error></iq>",
        );
        let (cause, detail) = parse_slot(&too_large).unwrap_err();
        assert_eq!(cause, "file-too-large");
        assert!(detail.contains("20000 bytes"), "{detail}");
        let quota = parse(
            "<iq xmlns='jabber:client' id='s' type='error'><error type='wait'>\
             <resource-constraint xmlns='urn:ietf:params:xml:ns:xmpp-stanzas'/>\
             <retry xmlns='urn:xmpp:http:upload:0' stamp='2017-12-03T23:42:05Z'/></error></iq>",
        );
        assert_eq!(parse_slot(&quota).unwrap_err().0, "resource-constraint");
        let bare = parse("<iq xmlns='jabber:client' id='s' type='error'/>");
        assert_eq!(parse_slot(&bare).unwrap_err().0, "undefined-condition");
        for bad in [
            "<iq xmlns='jabber:client' id='s' type='result'/>",
            "<iq xmlns='jabber:client' id='s' type='result'><slot xmlns='urn:xmpp:http:upload:0'><put url='http://a/b'/></slot></iq>",
            "<iq xmlns='jabber:client' id='s' type='result'><slot xmlns='urn:xmpp:http:upload:0'><put url=''/><get url='http://a/b'/></slot></iq>",
            "<iq xmlns='jabber:client' id='s' type='result'><slot xmlns='urn:xmpp:http:upload'><put url='http://a/b'/><get url='http://a/b'/></slot></iq>",
        ] {
            assert_eq!(parse_slot(&parse(bad)).unwrap_err().0, "malformed", "{bad}");
        }
    }

    #[test]
    fn the_upload_service_is_recognised() {
        let items = parse(
            "<iq xmlns='jabber:client' type='result' id='up-items'>\
             <query xmlns='http://jabber.org/protocol/disco#items'>\
             <item jid='conference.localhost'/><item jid='localhost' node='x'/>\
             <item jid='upload.localhost' name='HTTP File Upload'/></query></iq>",
        );
        assert_eq!(
            disco_items(&items),
            vec!["conference.localhost", "upload.localhost"]
        );
        // XEP-0363 §3, Example 2.
        let info = parse(
            "<iq xmlns='jabber:client' type='result' id='i'>\
             <query xmlns='http://jabber.org/protocol/disco#info'>\
             <identity category='store' type='file' name='HTTP File Upload'/>\
             <feature var='urn:xmpp:http:upload:0'/>\
             <x type='result' xmlns='jabber:x:data'>\
             <field var='FORM_TYPE' type='hidden'><value>urn:xmpp:http:upload:0</value></field>\
             <field var='max-file-size'><value>5242880</value></field></x>\
             <x type='result' xmlns='jabber:x:data'>\
             <field var='FORM_TYPE' type='hidden'><value>urn:xmpp:other</value></field>\
             <field var='max-file-size'><value>1</value></field></x>\
             </query></iq>",
        );
        assert_eq!(upload_info(&info), Some(Some(5_242_880)));
        let no_limit = parse(
            "<iq xmlns='jabber:client' type='result' id='i'><query xmlns='http://jabber.org/protocol/disco#info'>\
             <identity category='store' type='file'/><feature var='urn:xmpp:http:upload:0'/></query></iq>",
        );
        assert_eq!(upload_info(&no_limit), Some(None));
        let muc = parse(
            "<iq xmlns='jabber:client' type='result' id='i'><query xmlns='http://jabber.org/protocol/disco#info'>\
             <identity category='conference' type='text'/><feature var='urn:xmpp:http:upload:0'/></query></iq>",
        );
        assert_eq!(upload_info(&muc), None, "identity store/file is required");
        let old = parse(
            "<iq xmlns='jabber:client' type='result' id='i'><query xmlns='http://jabber.org/protocol/disco#info'>\
             <identity category='store' type='file'/><feature var='urn:xmpp:http:upload'/></query></iq>",
        );
        assert_eq!(
            upload_info(&old),
            None,
            "the pre-0.3 namespace is not this protocol"
        );
    }

    #[test]
    fn urls() {
        let u = parse_url("http://localhost:5280/upload/abc/f%20x.bin").unwrap();
        assert_eq!(
            u,
            Url {
                tls: false,
                host: "localhost".into(),
                port: 5280,
                authority: "localhost:5280".into(),
                path: "/upload/abc/f%20x.bin".into(),
            }
        );
        let u = parse_url("HTTPS://[::1]/a?b=c#frag").unwrap();
        assert_eq!((u.tls, u.host.as_str(), u.port), (true, "::1", 443));
        assert_eq!((u.authority.as_str(), u.path.as_str()), ("[::1]", "/a?b=c"));
        let u = parse_url("https://[::1]:8443").unwrap();
        assert_eq!((u.port, u.path.as_str()), (8443, "/"));
        let u = parse_url("http://example.org?x").unwrap();
        assert_eq!((u.port, u.path.as_str()), (80, "/?x"));
        for bad in [
            "ftp://x/y",
            "localhost/x",
            "http:///x",
            "http://user:pw@host/x",
            "http://host:99999/x",
            "http://host:port/x",
            "http://[::1/x",
            "http://[::1]x/y",
            "http://host/a b",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    fn head(s: &str) -> Result<Option<(Head, usize)>, String> {
        parse_head(s.as_bytes())
    }

    #[test]
    fn response_heads_with_odd_inputs() {
        let r = "HTTP/1.1 201 Created\r\nContent-Length: 0\r\nAccess-Control-Allow-Origin: *\r\n\r\nNEXT";
        let (h, used) = head(r).unwrap().unwrap();
        assert_eq!(
            (h.status, h.reason.as_str(), h.body),
            (201, "Created", BodyLen::Length(0))
        );
        assert_eq!(&r[used..], "NEXT");
        assert_eq!(h.header("access-control-allow-origin"), Some("*"));
        // Incomplete at every cut.
        for cut in 0..r.len() - 4 {
            assert_eq!(head(&r[..cut]).unwrap(), None, "cut {cut}");
        }
        // Bare LF line ends, no reason phrase, HTTP/1.0, odd spacing.
        let (h, used) = head("HTTP/1.0 200\nContent-Length:   12 \nX-Empty:\n\nbody")
            .unwrap()
            .unwrap();
        assert_eq!(
            (h.status, h.reason.as_str(), h.body),
            (200, "", BodyLen::Length(12))
        );
        assert_eq!(h.header("x-empty"), Some(""));
        assert_eq!(
            used,
            "HTTP/1.0 200\nContent-Length:   12 \nX-Empty:\n\n".len()
        );
        // Interim responses have no body; the caller skips them.
        let (h, used) = head("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((h.status, h.body, used), (100, BodyLen::Length(0), 25));
        // 204: no body even with a length; chunked wins over a length;
        // neither: until the connection closes.
        let (h, _) = head("HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.body, BodyLen::Length(0));
        let (h, _) = head(
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.body, BodyLen::Chunked, "chunked last: a chunked body");
        let (h, _) =
            head("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: Chunked\r\n\r\n")
                .unwrap()
                .unwrap();
        assert_eq!(h.body, BodyLen::Chunked);
        let (h, _) = head("HTTP/1.1 200 OK\r\nServer: x\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.body, BodyLen::UntilClose);
        // Repeated equal lengths are fine, as a list too.
        let (h, _) = head("HTTP/1.1 200 OK\r\nContent-Length: 7, 7\r\ncontent-length: 7\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.body, BodyLen::Length(7));
        // Errors, never panics.
        for bad in [
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 0x10\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            "HTTP/1.1 200 OK\r\nX: a\r\n  folded\r\n\r\n",
            "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
            "HTTP/1.1 200 OK\r\nBad : space\r\n\r\n",
            "HTTP/1.1 20 OK\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
            "HTTP/1.1 abc OK\r\n\r\n",
            "HTTP/2 200\r\n\r\n",
            "SSH-2.0-OpenSSH_9.6\r\n\r\n",
            "\r\n",
        ] {
            assert!(head(bad).is_err(), "{bad:?}");
        }
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nX: \xff\r\n\r\n").is_err());
        // A head that never ends is refused once too long.
        let endless = format!(
            "HTTP/1.1 200 OK\r\n{}",
            "X-Pad: aaaaaaaaaaaaaaaa\r\n".repeat(4000)
        );
        assert!(head(&endless).is_err());
        assert_eq!(head(&endless[..1000]).unwrap(), None);
    }

    fn dechunk(pieces: &[&[u8]]) -> Result<(Vec<u8>, bool, usize), String> {
        let mut d = Chunked::default();
        let mut out = Vec::new();
        let mut rest = 0;
        for p in pieces {
            let used = d.feed(p, &mut |b: &[u8]| out.extend_from_slice(b))?;
            rest += p.len() - used;
        }
        Ok((out, d.done(), rest))
    }

    #[test]
    fn chunked_bodies_with_odd_inputs() {
        let body = b"5\r\nhello\r\nA;ext=1\r\n, chunked!\r\n0\r\nX-Trailer: t\r\n\r\nNEXT";
        let (out, done, rest) = dechunk(&[body]).unwrap();
        assert_eq!(
            (out.as_slice(), done, rest),
            (&b"hello, chunked!"[..], true, 4)
        );
        // One byte at a time.
        let bytes: Vec<&[u8]> = body[..body.len() - 4].chunks(1).collect();
        let (out, done, rest) = dechunk(&bytes).unwrap();
        assert_eq!(
            (out.as_slice(), done, rest),
            (&b"hello, chunked!"[..], true, 0)
        );
        // Bare LF, upper-case hex, leading zeros, no trailers.
        let (out, done, _) = dechunk(&[b"00B\nhello world\n0\n\n"]).unwrap();
        assert_eq!((out.as_slice(), done), (&b"hello world"[..], true));
        // Not done until the final empty line.
        let (_, done, _) = dechunk(&[b"3\r\nabc\r\n0\r\n"]).unwrap();
        assert!(!done);
        for bad in [
            &b"g\r\nx\r\n"[..],
            b"\r\n",
            b"-1\r\n",
            b"3\r\nabcX\r\n",
            b"ffffffffffffffff0\r\n",
        ] {
            assert!(
                dechunk(&[bad]).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(dechunk(&[&vec![b'1'; 5000]]).is_err(), "endless size line");
    }

    /// A one-file HTTP server: stores what is PUT, serves it chunked (or
    /// with a length, or damaged) on GET, one request per connection.
    async fn tiny_server(mode: &'static str) -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let store = Arc::new(Mutex::new(Vec::<u8>::new()));
            loop {
                let Ok((mut s, _)) = l.accept().await else {
                    return;
                };
                let store = store.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = vec![0u8; 65536];
                    let end = loop {
                        let n = s.read(&mut chunk).await.unwrap();
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break p + 4;
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    if head.starts_with("PUT") {
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("Content-Length: "))
                            .unwrap()
                            .trim()
                            .parse()
                            .unwrap();
                        let mut body = buf[end..].to_vec();
                        while body.len() < len {
                            let n = s.read(&mut chunk).await.unwrap();
                            body.extend_from_slice(&chunk[..n]);
                        }
                        *store.lock().unwrap() = body;
                        let _ = s
                            .write_all(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n")
                            .await;
                        return;
                    }
                    let mut body = store.lock().unwrap().clone();
                    match mode {
                        "chunked" => {
                            let _ = s
                                .write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                                .await;
                            for c in body.chunks(7777) {
                                let _ = s.write_all(format!("{:x}\r\n", c.len()).as_bytes()).await;
                                let _ = s.write_all(c).await;
                                let _ = s.write_all(b"\r\n").await;
                            }
                            let _ = s.write_all(b"0\r\n\r\n").await;
                        }
                        "damaged" | "close" => {
                            if mode == "damaged" {
                                body[1000] ^= 0x40;
                            }
                            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await;
                            let _ = s.write_all(&body).await;
                        }
                        _ => {
                            let _ = s.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\n\r\nno\r\nfile").await;
                        }
                    }
                });
            }
        });
        addr
    }

    fn http() -> Http {
        Http {
            tls: client::tls_connector().unwrap(),
            addr_override: None,
            resolved: Mutex::new(HashMap::new()),
            connect_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(5),
            chunk: 10_000,
        }
    }

    #[tokio::test]
    async fn put_then_get_round_trips_and_verifies() {
        let p = Pattern::new(99);
        let size = 300_001;
        let progress = AtomicU64::new(0);
        for (mode, want) in [
            ("chunked", None),
            ("close", None),
            ("damaged", Some("verify")),
            ("missing", Some("http-404")),
        ] {
            let addr = tiny_server(mode).await;
            let url = format!("http://{addr}/upload/x/f.bin");
            let slot = Slot {
                put: url.clone(),
                headers: vec![("Authorization".into(), "Basic x".into())],
                get: url,
            };
            let h = http();
            h.put(&slot, size, p, "application/octet-stream", &progress)
                .await
                .unwrap();
            let got = h.get(&slot, size, p, &progress).await;
            assert_eq!(
                got.as_ref().err().map(|f| f.cause.as_str()),
                want,
                "{mode}: {got:?}"
            );
            if mode == "missing" {
                assert!(got.unwrap_err().detail.contains("404 Not Found: no file"));
            }
            // Wrong expectations: another file, another size.
            if mode == "chunked" {
                let f = h
                    .get(&slot, size, Pattern::new(98), &progress)
                    .await
                    .unwrap_err();
                assert_eq!(f.cause, "verify");
                let f = h.get(&slot, size + 1, p, &progress).await.unwrap_err();
                assert_eq!(f.cause, "length");
            }
        }
        assert!(progress.load(Relaxed) >= 4 * size);
        // Nothing listening: a connect failure, not a panic.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead = l.local_addr().unwrap();
        drop(l);
        let slot = Slot {
            put: format!("http://{dead}/x"),
            headers: vec![],
            get: "nonsense".into(),
        };
        let h = http();
        let f = h.put(&slot, 10, p, "a/b", &progress).await.unwrap_err();
        assert_eq!(f.cause, "connect");
        let f = h.get(&slot, 10, p, &progress).await.unwrap_err();
        assert_eq!(f.cause, "url");
    }

    #[tokio::test]
    async fn memory_is_sampled_until_finished() {
        let s = RssSampler::start(std::process::id(), Duration::from_millis(5)).unwrap();
        tokio::time::sleep(Duration::from_millis(40)).await;
        let w = s.finish().await;
        assert!(w.samples >= 3, "{w:?}");
        assert!(w.before_kb > 0 && w.max_kb >= w.before_kb && w.max_kb >= w.after_kb);
        assert_eq!(w.growth_kb, w.max_kb - w.before_kb);
        assert!(RssSampler::start(u32::MAX, Duration::from_millis(5)).is_none());
    }
}
