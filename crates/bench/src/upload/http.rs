//! The hand-written HTTP/1.1 client of the `upload` scenario: URLs,
//! response heads, chunked bodies, PUT and GET over TCP or TLS.

use super::data::{Pattern, Verifier};
use super::xmpp::Slot;
use crate::client::Transport;
use rustls::pki_types::ServerName;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// The longest response head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Read buffer per transfer.
const READ_BUF: usize = 64 * 1024;

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
    pub(super) fn new(cause: &str, detail: impl Into<String>) -> Fail {
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
pub(super) struct Http {
    pub(super) tls: TlsConnector,
    pub(super) addr_override: Option<SocketAddr>,
    /// Resolved addresses per (host, port), the last one that worked first.
    pub(super) resolved: Mutex<HashMap<(String, u16), Vec<SocketAddr>>>,
    pub(super) connect_timeout: Duration,
    pub(super) io_timeout: Duration,
    pub(super) chunk: usize,
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
    pub(super) async fn put(
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
    pub(super) async fn get(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client;
    use std::sync::Arc;

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
}
