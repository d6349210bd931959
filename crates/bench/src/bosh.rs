//! A lean BOSH client (XEP-0124, XEP-0206) seen as a byte stream, so the
//! scenarios run over it unchanged (like [`crate::client::WsIo`] for
//! WebSocket).
//!
//! One BOSH session is a [`BoshIo`] (what the session's reader and writer
//! use) and one driver task that owns two HTTP/1.1 keep-alive connections
//! ("lanes", plain TCP or TLS with `--tls direct`), hand-written HTTP: a
//! `POST /http-bind` with `Content-Length`, and a response read up to its
//! `Content-Length`. No HTTP library, so a session costs two sockets, two
//! small buffers and one task.
//!
//! - Writes are payload bytes (whole elements). Whatever was written
//!   since the last request goes into the next `<body/>`, so stanzas
//!   queued together travel in one request. Writing
//!   `</stream:stream>` (or shutting down) sends `type='terminate'`.
//! - Reads return the payloads of the responses in rid order (the two
//!   lanes may answer out of order), i.e. a sequence of complete elements
//!   for a [`starling_xml::StreamParser::for_elements`] parser. The end of
//!   the session (a `type='terminate'` response, a lost lane) reads as EOF.
//! - [`BoshIo::open`] starts the stream: the session creation request the
//!   first time, a restart (`xmpp:restart='true'`, XEP-0206 §5) after SASL.
//! - Requests: at most the server's `requests` (2) at once (XEP-0124 §11).
//!   Once [`BoshIo::start_polling`] was called (after resource binding)
//!   one request is always held by the server (the long poll), and
//!   outgoing payloads go out at once in the second one; without it (during
//!   negotiation) a request is sent only when there is something to send.
//! - A lane that breaks while a request is out is reconnected once and the
//!   same request (same rid) sent again (§14.3).
//!
//! The `<body/>` wrapper is written with a prefix (`<hb:body
//! xmlns:hb='http://jabber.org/protocol/httpbind' xmlns='jabber:client'>`)
//! so that payloads without an `xmlns` (the scenarios write
//! `<message to=…>` as on a TCP stream) are in `jabber:client`, as
//! XEP-0206 requires, without rewriting them.

use crate::client::{connect_transport, SetupError, Target, Transport, Via};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{mpsc, Notify};

/// XEP-0124's namespace.
pub const NS_HTTPBIND: &str = "http://jabber.org/protocol/httpbind";
/// XEP-0206's namespace.
pub const NS_XBOSH: &str = "urn:xmpp:xbosh";

/// Outgoing state shared by the [`BoshIo`] and its driver.
#[derive(Default)]
struct Out {
    /// Payload bytes not sent yet.
    data: Vec<u8>,
    /// A stream (re)start was asked for.
    open: bool,
    /// The client ended the session.
    terminate: bool,
    /// Keep one request held by the server at all times.
    polling: bool,
}

struct Shared {
    out: Mutex<Out>,
    wake: Notify,
}

impl Shared {
    fn with<R>(&self, f: impl FnOnce(&mut Out) -> R) -> R {
        let r = f(&mut self.out.lock().unwrap_or_else(|e| e.into_inner()));
        self.wake.notify_one();
        r
    }
}

/// One BOSH session as a byte stream (see the module doc).
pub struct BoshIo {
    shared: Arc<Shared>,
    rx: mpsc::Receiver<Vec<u8>>,
    rest: Vec<u8>,
    rest_pos: usize,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for BoshIo {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl BoshIo {
    /// Connects both lanes to `target` and starts the driver. Nothing is
    /// sent before [`BoshIo::open`].
    pub async fn connect(target: &Target, source: Via) -> Result<BoshIo, SetupError> {
        // Both lanes at once: a browser keeps its second connection alive
        // too, so the server's memory per session includes it.
        let a = connect_transport(target, source).await?;
        let b = connect_transport(target, source).await?;
        let shared = Arc::new(Shared {
            out: Mutex::new(Out::default()),
            wake: Notify::new(),
        });
        let (tx, rx) = mpsc::channel(64);
        let driver = Driver {
            lanes: [Lane::new(a), Lane::new(b)],
            shared: shared.clone(),
            tx,
            host: target.addr.to_string(),
            domain: target.domain.clone(),
            wait: target.bosh_wait,
            sid: None,
            requests: 1,
            next_rid: initial_rid(),
            deliver_rid: 0,
            stash: Vec::new(),
            terminate_sent: false,
        };
        let reconnect = ReconnectTarget {
            target: target.clone(),
            source,
        };
        let driver = tokio::spawn(driver.run(reconnect));
        Ok(BoshIo {
            shared,
            rx,
            rest: Vec::new(),
            rest_pos: 0,
            driver,
        })
    }

    /// Starts the stream: session creation, or a restart after SASL.
    pub fn open(&self) {
        self.shared.with(|o| o.open = true);
    }

    /// From now on one request is always held by the server.
    pub fn start_polling(&self) {
        self.shared.with(|o| o.polling = true);
    }
}

/// What a lane needs to connect again.
struct ReconnectTarget {
    target: Target,
    source: Via,
}

impl ReconnectTarget {
    async fn connect(&self) -> io::Result<Transport> {
        connect_transport(&self.target, self.source)
            .await
            .map_err(|e| io::Error::other(e.to_string()))
    }
}

/// A random first rid well below 2^53 (XEP-0124 §14.1).
fn initial_rid() -> u64 {
    let t = crate::engine::now_us();
    let mut r = crate::rate::SplitMix::new(t ^ ((std::process::id() as u64) << 32));
    1_000_000 + r.below(1 << 40)
}

impl AsyncRead for BoshIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.rest_pos < this.rest.len() {
                let n = (this.rest.len() - this.rest_pos).min(buf.remaining());
                buf.put_slice(&this.rest[this.rest_pos..this.rest_pos + n]);
                this.rest_pos += n;
                if this.rest_pos == this.rest.len() {
                    this.rest = Vec::new();
                    this.rest_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            match this.rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                // The session is over: EOF.
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Ready(Some(bytes)) => {
                    this.rest = bytes;
                    this.rest_pos = 0;
                }
            }
        }
    }
}

impl AsyncWrite for BoshIo {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.shared.with(|o| {
            if buf == b"</stream:stream>" {
                o.terminate = true;
            } else {
                o.data.extend_from_slice(buf);
            }
        });
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.shared.with(|o| o.terminate = true);
        Poll::Ready(Ok(()))
    }
}

/// One HTTP/1.1 keep-alive connection.
struct Lane {
    io: Transport,
    /// Received bytes not yet consumed (cancel-safe response reading).
    buf: Vec<u8>,
    /// The request out on this lane: its rid and its bytes (for a resend).
    out: Option<(u64, Vec<u8>)>,
    /// This lane was reconnected for the request it carries.
    retried: bool,
}

impl Lane {
    fn new(io: Transport) -> Lane {
        Lane {
            io,
            buf: Vec::new(),
            out: None,
            retried: false,
        }
    }

    /// Reads one whole response; returns its body. Cancel-safe: partial
    /// input stays in `buf`.
    async fn response(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some((body, used)) = parse_response(&self.buf)? {
                self.buf.drain(..used);
                if self.buf.is_empty() && self.buf.capacity() > 4096 {
                    self.buf = Vec::new();
                }
                return Ok(body);
            }
            let mut chunk = [0u8; crate::client::READ_CHUNK];
            let n = self.io.read(&mut chunk).await?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Parses an HTTP/1.1 response with `Content-Length` at the start of
/// `buf`: `Ok(None)` if incomplete, else the body and the bytes used.
pub fn parse_response(buf: &[u8]) -> io::Result<Option<(Vec<u8>, usize)>> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > 16 * 1024 {
            return Err(io::Error::other("HTTP response header too long"));
        }
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..end])
        .map_err(|_| io::Error::other("HTTP response header is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or("");
    let code = status.split(' ').nth(1).unwrap_or("");
    if code != "200" {
        return Err(io::Error::other(format!("HTTP status: {status}")));
    }
    let mut len = None;
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            if k.trim().eq_ignore_ascii_case("content-length") {
                len = v.trim().parse::<usize>().ok();
            } else if k.trim().eq_ignore_ascii_case("transfer-encoding") {
                return Err(io::Error::other("chunked HTTP responses are not supported"));
            }
        }
    }
    let len = len.ok_or_else(|| io::Error::other("HTTP response without Content-Length"))?;
    let start = end + 4;
    if buf.len() < start + len {
        return Ok(None);
    }
    Ok(Some((buf[start..start + len].to_vec(), start + len)))
}

/// A parsed `<body/>` response: its attributes we need and its payload.
#[derive(Debug, PartialEq, Eq)]
pub struct BodyReply<'a> {
    /// `sid` (creation response).
    pub sid: Option<&'a str>,
    /// `requests` (creation response).
    pub requests: Option<u64>,
    /// `type='terminate'`: the session is over.
    pub terminate: bool,
    /// `condition`, if any.
    pub condition: Option<&'a str>,
    /// The payload elements, as bytes.
    pub payload: &'a [u8],
}

fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    for q in ['\'', '"'] {
        let pat = format!(" {name}={q}");
        if let Some(i) = tag.find(&pat) {
            let rest = &tag[i + pat.len()..];
            return rest.find(q).map(|j| &rest[..j]);
        }
    }
    None
}

/// Splits a response `<body …>payload</body>` (or `<body …/>`) into its
/// start tag's attributes and payload bytes, without building a tree.
pub fn parse_body(xml: &[u8]) -> io::Result<BodyReply<'_>> {
    let bad = || io::Error::other("the response is not a <body/>");
    let start = xml.iter().position(|&b| b == b'<').ok_or_else(bad)?;
    let gt = start
        + xml[start..]
            .iter()
            .position(|&b| b == b'>')
            .ok_or_else(bad)?;
    let tag = std::str::from_utf8(&xml[start..gt]).map_err(|_| bad())?;
    let name_end = tag
        .find(|c: char| c.is_whitespace() || c == '/')
        .unwrap_or(tag.len());
    let name = &tag[1..name_end];
    if name != "body" && !name.ends_with(":body") {
        return Err(bad());
    }
    let self_closing = tag.ends_with('/');
    let payload = if self_closing {
        &xml[0..0]
    } else {
        let close = format!("</{name}>");
        let trimmed = xml.trim_ascii_end();
        let end = trimmed
            .len()
            .checked_sub(close.len())
            .filter(|&e| e > gt && &trimmed[e..] == close.as_bytes())
            .ok_or_else(bad)?;
        &xml[gt + 1..end]
    };
    Ok(BodyReply {
        sid: attr(tag, "sid"),
        requests: attr(tag, "requests").and_then(|r| r.parse().ok()),
        terminate: attr(tag, "type") == Some("terminate"),
        condition: attr(tag, "condition"),
        payload,
    })
}

struct Driver {
    lanes: [Lane; 2],
    shared: Arc<Shared>,
    tx: mpsc::Sender<Vec<u8>>,
    host: String,
    domain: String,
    wait: u64,
    sid: Option<String>,
    /// Requests allowed at once (1 until the creation response).
    requests: usize,
    next_rid: u64,
    /// The rid whose payload is delivered next (responses in rid order).
    deliver_rid: u64,
    /// Responses that arrived before an older one: (rid, payload, end).
    stash: Vec<(u64, Vec<u8>, bool)>,
    terminate_sent: bool,
}

enum Next {
    /// A request body to send.
    Send(String),
    /// Nothing to send now.
    Idle,
}

impl Driver {
    fn outstanding(&self) -> usize {
        self.lanes.iter().filter(|l| l.out.is_some()).count()
    }

    /// What to send next, if anything may go now.
    fn next_request(&mut self) -> Next {
        let outstanding = self.outstanding();
        if outstanding >= self.requests || self.terminate_sent {
            return Next::Idle;
        }
        let rid = self.next_rid;
        let mut o = self.shared.out.lock().unwrap_or_else(|e| e.into_inner());
        let Some(sid) = &self.sid else {
            if !o.open || outstanding > 0 {
                return Next::Idle;
            }
            o.open = false;
            return Next::Send(format!(
                "<body xmlns='{NS_HTTPBIND}' xmlns:xmpp='{NS_XBOSH}' content='text/xml; charset=utf-8' \
                 hold='1' rid='{rid}' to='{}' ver='1.11' wait='{}' xml:lang='en' xmpp:version='1.0'/>",
                self.domain, self.wait
            ));
        };
        let restart = std::mem::take(&mut o.open);
        let terminate = o.terminate;
        let poll = o.polling && outstanding == 0;
        if !(restart || terminate || poll || !o.data.is_empty()) {
            return Next::Idle;
        }
        let mut body = format!(
            "<hb:body xmlns:hb='{NS_HTTPBIND}' xmlns='jabber:client' xmlns:xmpp='{NS_XBOSH}' rid='{rid}' sid='{sid}'"
        );
        if restart {
            body.push_str(&format!(
                " to='{}' xml:lang='en' xmpp:restart='true'",
                self.domain
            ));
        }
        if terminate {
            body.push_str(" type='terminate'");
            self.terminate_sent = true;
        }
        if o.data.is_empty() {
            body.push_str("/>");
        } else {
            body.push('>');
            body.push_str(&String::from_utf8_lossy(&o.data));
            body.push_str("</hb:body>");
            o.data.clear();
            if o.data.capacity() > 16 * 1024 {
                o.data = Vec::new();
            }
        }
        Next::Send(body)
    }

    async fn send(&mut self, body: String, reconnect: &ReconnectTarget) -> io::Result<()> {
        let rid = self.next_rid;
        self.next_rid += 1;
        let req = format!(
            "POST /http-bind HTTP/1.1\r\nHost: {}\r\nContent-Type: text/xml; charset=utf-8\r\nContent-Length: {}\r\n\r\n{body}",
            self.host,
            body.len()
        )
        .into_bytes();
        let i = if self.lanes[0].out.is_none() { 0 } else { 1 };
        let lane = &mut self.lanes[i];
        lane.retried = false;
        if write_request(&mut lane.io, &req).await.is_err() {
            // A keep-alive connection the server closed: once more.
            lane.io = reconnect.connect().await?;
            lane.buf.clear();
            lane.retried = true;
            write_request(&mut lane.io, &req).await?;
        }
        lane.out = Some((rid, req));
        Ok(())
    }

    /// Hands payloads to the reader in rid order. Returns false when the
    /// session ended.
    async fn deliver(&mut self, rid: u64, payload: Vec<u8>, end: bool) -> bool {
        self.stash.push((rid, payload, end));
        loop {
            let Some(i) = self
                .stash
                .iter()
                .position(|(r, _, _)| *r == self.deliver_rid)
            else {
                return true;
            };
            let (_, payload, end) = self.stash.swap_remove(i);
            self.deliver_rid += 1;
            if !payload.is_empty() && self.tx.send(payload).await.is_err() {
                return false;
            }
            if end {
                return false;
            }
        }
    }

    /// Handles the response (or failure) of lane `i`. Returns false when
    /// the session is over.
    async fn on_response(
        &mut self,
        i: usize,
        r: io::Result<Vec<u8>>,
        reconnect: &ReconnectTarget,
    ) -> bool {
        let lane = &mut self.lanes[i];
        let body = match r {
            Ok(b) => b,
            Err(_) if !lane.retried && !self.terminate_sent => {
                // §14.3: the same request again on a new connection.
                let Some((_, req)) = &lane.out else {
                    return false;
                };
                let req = req.clone();
                lane.retried = true;
                lane.buf.clear();
                match reconnect.connect().await {
                    Ok(io) => lane.io = io,
                    Err(_) => return false,
                }
                return write_request(&mut lane.io, &req).await.is_ok();
            }
            Err(_) => return false,
        };
        let Some((rid, _)) = lane.out.take() else {
            return false;
        };
        let Ok(reply) = parse_body(&body) else {
            return false;
        };
        if self.sid.is_none() {
            let Some(sid) = reply.sid else {
                return false;
            };
            self.sid = Some(sid.to_owned());
            self.requests = reply.requests.unwrap_or(2).clamp(1, 2) as usize;
            self.deliver_rid = rid;
        }
        let end = reply.terminate;
        let payload = reply.payload.to_vec();
        self.deliver(rid, payload, end).await
    }

    async fn run(mut self, reconnect: ReconnectTarget) {
        loop {
            while let Next::Send(body) = self.next_request() {
                if self.send(body, &reconnect).await.is_err() {
                    return;
                }
            }
            if self.terminate_sent && self.outstanding() == 0 {
                return;
            }
            let [a, b] = &mut self.lanes;
            let (a_busy, b_busy) = (a.out.is_some(), b.out.is_some());
            let (i, r) = tokio::select! {
                r = a.response(), if a_busy => (0, r),
                r = b.response(), if b_busy => (1, r),
                _ = self.shared.wake.notified() => continue,
            };
            if !self.on_response(i, r, &reconnect).await {
                return;
            }
        }
    }
}

async fn write_request(io: &mut Transport, req: &[u8]) -> io::Result<()> {
    io.write_all(req).await?;
    io.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_responses_are_parsed_when_complete() {
        let r =
            b"HTTP/1.1 200 OK\r\ncontent-type: text/xml\r\ncontent-length: 5\r\n\r\nhelloHTTP/1.1";
        assert_eq!(parse_response(&r[..40]).unwrap(), None);
        assert_eq!(parse_response(&r[..64]).unwrap(), None);
        let (body, used) = parse_response(r).unwrap().unwrap();
        assert_eq!(body, b"hello");
        assert_eq!(&r[used..], b"HTTP/1.1");
        assert!(parse_response(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").is_err());
    }

    #[test]
    fn bodies_are_split_without_a_parser() {
        let b = parse_body(
            b"<body xmlns='http://jabber.org/protocol/httpbind' sid='abc' requests='2' wait='60'><stream:features xmlns:stream='x'/></body>",
        )
        .unwrap();
        assert_eq!(b.sid, Some("abc"));
        assert_eq!(b.requests, Some(2));
        assert!(!b.terminate);
        assert_eq!(b.payload, b"<stream:features xmlns:stream='x'/>");
        let b =
            parse_body(b"<body xmlns='x' type='terminate' condition='item-not-found'/>").unwrap();
        assert!(b.terminate);
        assert_eq!(b.condition, Some("item-not-found"));
        assert!(b.payload.is_empty());
        let b = parse_body(b"<body xmlns=\"x\"><a/><b/></body>\n").unwrap();
        assert_eq!(b.payload, b"<a/><b/>");
        assert!(parse_body(b"<html>no</html>").is_err());
        assert!(parse_body(b"<body xmlns='x'><a/>").is_err());
    }
}
