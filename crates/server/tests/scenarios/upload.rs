//! HTTP File Upload (XEP-0363 v1.2.0, `reference/xeps/xep-0363.xml`) over
//! real sockets: discovery with the size limit (§3), slots (§4), the error
//! cases (§6), PUT and GET over hand-written HTTP/1.1 (§7), CORS (§8),
//! unguessable URLs and hostile paths (§9), expiry and `starling upload
//! purge`.

use starling_server::modules::upload::UploadConfig;
use starling_server::modules::Upload;
use starling_testkit::stanza::{empty, iq_get};
use starling_testkit::starling_xml::Element;
use starling_testkit::{error_condition, ns, poll_for, Client, TestServer};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const NS: &str = "urn:xmpp:http:upload:0";
const SERVICE: &str = "upload.localhost";

async fn server_with(f: impl FnOnce(&mut UploadConfig)) -> TestServer {
    TestServer::start_with(|c| {
        let u = c.modules.get_mut::<Upload>();
        u.enabled = true;
        f(u);
    })
    .await
}

/// Asks for a slot (§4); the whole iq reply.
pub(crate) async fn request(
    c: &mut Client,
    filename: &str,
    size: &str,
    content_type: Option<&str>,
) -> Element {
    let id = format!("slot-{}", starling_proto::random_id(6));
    let ct = content_type
        .map(|t| format!(" content-type='{t}'"))
        .unwrap_or_default();
    c.iq(
        &iq_get(
            SERVICE,
            &id,
            &format!("<request xmlns='{NS}' filename='{filename}' size='{size}'{ct}/>"),
        ),
        &id,
    )
    .await
}

/// The PUT and GET URLs of a slot reply.
fn urls(reply: &Element) -> (String, String) {
    let slot = reply
        .get_child("slot", NS)
        .unwrap_or_else(|| panic!("no slot: {reply}"));
    let url = |name: &str| {
        slot.get_child(name, NS)
            .and_then(|e| e.attr("url"))
            .unwrap_or_else(|| panic!("no {name} url: {reply}"))
            .to_owned()
    };
    (url("put"), url("get"))
}

/// A slot's URL path (`/upload/…`), to use on any listener.
pub(crate) async fn slot_path(
    c: &mut Client,
    filename: &str,
    size: usize,
    content_type: Option<&str>,
) -> String {
    let r = request(c, filename, &size.to_string(), content_type).await;
    let (put, get) = urls(&r);
    assert_eq!(put, get, "one URL for both");
    path_of(&put)
}

/// The system clock's whole seconds since the Unix epoch, as the upload
/// module reads them: a slot is `created` at that second, and expires
/// once the clock's second reaches `created + slot_timeout_secs`.
fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Sleeps until the system clock reaches second `at` since the Unix epoch:
/// from then on, the server's expiry checks (`now >= deadline`, in whole
/// seconds of the same clock) see `at` has come.
async fn until_unix_second(at: u64) {
    loop {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let target = Duration::from_secs(at);
        if now >= target {
            return;
        }
        // sleep: the point — a deadline of the wall clock has to pass.
        tokio::time::sleep(target - now).await;
    }
}

fn path_of(url: &str) -> String {
    let rest = url.split_once("://").expect("absolute URL").1;
    rest[rest.find('/').expect("a path")..].to_owned()
}

/// The slot's directory on the server.
fn slot_dir(server: &TestServer, path: &str) -> PathBuf {
    let slot = path.split('/').nth(2).expect("/upload/{slot}/{name}");
    server.dir.join("upload").join(slot)
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

pub(crate) struct Reply {
    pub(crate) status: u16,
    headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {:?} {}",
            self.status,
            self.headers,
            String::from_utf8_lossy(&self.body[..self.body.len().min(200)])
        )
    }
}

/// Sends the request head (plus `Connection: close`) and `body`, then
/// reads the whole answer.
pub(crate) async fn http(
    addr: SocketAddr,
    head: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let mut req = format!("{head} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    tcp.write_all(req.as_bytes()).await.unwrap();
    tcp.write_all(body).await.unwrap();
    read_reply(&mut tcp).await
}

async fn read_reply(tcp: &mut TcpStream) -> Reply {
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), tcp.read_to_end(&mut raw))
        .await
        .expect("answered in time")
        .expect("read the answer");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

pub(crate) async fn put(addr: SocketAddr, path: &str, content_type: &str, body: &[u8]) -> Reply {
    let len = body.len().to_string();
    http(
        addr,
        &format!("PUT {path}"),
        &[("Content-Type", content_type), ("Content-Length", &len)],
        body,
    )
    .await
}

/// A PUT refused from its head alone: the body is never sent (as a client
/// waiting for `100 Continue` would).
async fn put_head(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut all = vec![("Expect", "100-continue")];
    all.extend_from_slice(headers);
    http(addr, &format!("PUT {path}"), &all, b"").await
}

pub(crate) async fn get(addr: SocketAddr, path: &str) -> Reply {
    http(addr, &format!("GET {path}"), &[], b"").await
}

/// §3: the server lists the service; its disco#info has the identity, the
/// feature and the max-file-size form (XEP-0128).
#[tokio::test]
async fn discovery_lists_the_service_with_its_max_file_size() {
    let server = server_with(|u| u.max_file_size = 1_234_567).await;
    let mut alice = server.login("alice").await;
    let items = alice
        .iq(
            "<iq to='localhost' type='get' id='i1'><query xmlns='http://jabber.org/protocol/disco#items'/></iq>",
            "i1",
        )
        .await;
    let listed = items
        .get_child("query", ns::DISCO_ITEMS)
        .unwrap()
        .children()
        .any(|i| i.attr("jid") == Some(SERVICE));
    assert!(listed, "{items}");
    let info = alice
        .iq(
            &iq_get(SERVICE, "i2", &empty("query", ns::DISCO_INFO)),
            "i2",
        )
        .await;
    let q = info.get_child("query", ns::DISCO_INFO).expect("result");
    let identity = q.get_child("identity", ns::DISCO_INFO).expect("identity");
    assert_eq!(
        (identity.attr("category"), identity.attr("type")),
        (Some("store"), Some("file"))
    );
    assert!(
        q.children()
            .any(|f| f.name() == "feature" && f.attr("var") == Some(NS)),
        "{info}"
    );
    let form = q.get_child("x", "jabber:x:data").expect("form");
    let field = |var: &str| {
        form.children()
            .find(|f| f.attr("var") == Some(var))
            .and_then(|f| f.get_child("value", "jabber:x:data"))
            .map(|v| v.text())
    };
    assert_eq!(field("FORM_TYPE").as_deref(), Some(NS));
    assert_eq!(field("max-file-size").as_deref(), Some("1234567"));
    server.stop().await;
}

/// Off by default (as in Prosody and ejabberd): nothing listed, nothing
/// served.
#[tokio::test]
async fn upload_is_off_by_default() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = request(&mut alice, "a.txt", "10", None).await;
    assert_eq!(r.attr("type"), Some("error"), "{r}");
    let page = get(server.http_addr(false), "/upload/").await;
    assert_eq!(page.status, 404, "{page:?}");
    server.stop().await;
}

/// §4 → §7: a slot, a PUT of a few hundred KB and the same bytes back with
/// the headers of a safe download; HEAD too. The URL keeps the name
/// percent-encoded (§4) and has a 32-character random slot id (§9).
#[tokio::test]
async fn slot_put_get_round_trip_keeps_bytes_and_headers() {
    let server = server_with(|_| {}).await;
    let mut alice = server.login("alice").await;
    let data = pattern(300_000);
    let r = request(&mut alice, "très cool.jpg", "300000", Some("image/jpeg")).await;
    let (put_url, get_url) = urls(&r);
    let tls_port = server.http_addr(true).port();
    let prefix = format!("https://localhost:{tls_port}/upload/");
    assert!(put_url.starts_with(&prefix), "{put_url}");
    assert_eq!(put_url, get_url);
    let rest = &put_url[prefix.len()..];
    let (slot, name) = rest.split_once('/').unwrap();
    assert_eq!(name, "tr%C3%A8s%20cool.jpg");
    assert!(
        slot.len() >= 32 && slot.bytes().all(|b| b.is_ascii_alphanumeric()),
        "{slot}"
    );
    let path = path_of(&put_url);
    let other = slot_path(&mut alice, "très cool.jpg", 10, None).await;
    assert_ne!(path, other, "every slot has its own id");

    let addr = server.http_addr(false);
    let up = put(addr, &path, "image/jpeg", &data).await;
    assert_eq!(up.status, 201, "{up:?}");
    assert_eq!(up.header("access-control-allow-origin"), Some("*"));

    let down = get(addr, &path).await;
    assert_eq!(down.status, 200, "{down:?}");
    assert!(down.body == data, "the same bytes back");
    assert_eq!(down.header("content-type"), Some("image/jpeg"));
    assert_eq!(down.header("content-length"), Some("300000"));
    assert_eq!(
        down.header("content-disposition"),
        Some("inline; filename*=UTF-8''tr%C3%A8s%20cool.jpg")
    );
    assert_eq!(down.header("x-content-type-options"), Some("nosniff"));
    assert!(
        down.header("content-security-policy")
            .is_some_and(|c| c.contains("default-src 'none'")),
        "{down:?}"
    );
    assert_eq!(down.header("access-control-allow-origin"), Some("*"));

    let head = http(addr, &format!("HEAD {path}"), &[], b"").await;
    assert_eq!(head.status, 200, "{head:?}");
    assert_eq!(head.header("content-length"), Some("300000"));
    assert!(head.body.is_empty());

    // The same file over the HTTPS listener the URL names.
    let tls = https_get(server.http_addr(true), &path).await;
    assert!(
        tls.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&tls[..100])
    );
    assert!(tls.ends_with(&data[data.len() - 1000..]));

    // Anything but images, audio and video is an attachment.
    let page = slot_path(&mut alice, "page.html", 20, Some("text/html")).await;
    assert_eq!(
        put(addr, &page, "text/html", b"<script>x()</script>")
            .await
            .status,
        201
    );
    let down = get(addr, &page).await;
    assert_eq!(
        down.header("content-disposition"),
        Some("attachment; filename*=UTF-8''page.html")
    );
    assert_eq!(down.header("x-content-type-options"), Some("nosniff"));
    server.stop().await;
}

/// `starling upload purge` with `extra` arguments on `server`'s data
/// directory (files kept for 30 days): its output.
fn purge_cli(server: &TestServer, extra: &[&str]) -> String {
    let cfg = server.dir.join("purge.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\ndata_dir = {:?}\n\n[modules.upload]\nenabled = true\nexpire_after_days = 30\n",
            server.dir
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_starling"))
        .arg("--config")
        .arg(&cfg)
        .args(["upload", "purge"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// XEP-0363 §5 (v1.2.0), upload purposes: the service advertises
/// `#message` and `#ephemeral`. An ephemeral upload (§5.3) is not served
/// from its `expire-before` on, although files are otherwise kept for 30
/// days, and purge removes it; its slot takes no PUT after it either. A
/// missing, malformed or past `expire-before` is a bad request. `permanent`
/// (§5.4, not advertised) is served as the default purpose, `message`.
#[tokio::test]
async fn ephemeral_uploads_are_never_served_after_their_deadline() {
    const PURPOSE: &str = "urn:xmpp:http:upload:purpose:0";
    let server = server_with(|u| u.expire_after_days = 30).await;
    let mut alice = server.login("alice").await;
    let features = alice.disco_features(SERVICE).await;
    for (purpose, served) in [
        ("message", true),
        ("ephemeral", true),
        ("profile", false),
        ("permanent", false),
    ] {
        assert_eq!(
            features.contains(&format!("{PURPOSE}#{purpose}")),
            served,
            "{purpose}: {features:?}"
        );
    }

    // Three seconds' time at most to see the file served before it.
    let deadline = unix_secs() + 3;
    let stamp = starling_proto::datetime::xep0082_datetime(u128::from(deadline) * 1000);
    let ask = |name: &'static str, purpose: String| {
        let id = format!("p-{name}");
        iq_get(
            SERVICE,
            &id,
            &format!("<request xmlns='{NS}' filename='{name}' size='5'>{purpose}</request>"),
        )
    };
    let ephemeral = |name: &'static str, expire: &str| {
        ask(
            name,
            format!("<ephemeral xmlns='{PURPOSE}' expire-before='{expire}'/>"),
        )
    };
    async fn slot(alice: &mut Client, name: &str, req: String) -> Element {
        alice.iq(&req, &format!("p-{name}")).await
    }
    let story =
        path_of(&urls(&slot(&mut alice, "story.jpg", ephemeral("story.jpg", &stamp)).await).0);
    let late = path_of(&urls(&slot(&mut alice, "late.jpg", ephemeral("late.jpg", &stamp)).await).0);
    let kept = path_of(
        &urls(
            &slot(
                &mut alice,
                "blog.jpg",
                ask("blog.jpg", empty("permanent", PURPOSE)),
            )
            .await,
        )
        .0,
    );
    for (name, req) in [
        ("none.jpg", ask("none.jpg", empty("ephemeral", PURPOSE))),
        ("bad.jpg", ephemeral("bad.jpg", "tomorrow")),
        ("past.jpg", ephemeral("past.jpg", "2020-01-01T00:00:00Z")),
    ] {
        let r = slot(&mut alice, name, req).await;
        assert_eq!(
            error_condition(&r).as_deref(),
            Some("bad-request"),
            "{name}: {r}"
        );
    }

    let addr = server.http_addr(false);
    assert_eq!(put(addr, &story, "image/jpeg", b"story").await.status, 201);
    assert_eq!(put(addr, &kept, "image/jpeg", b"kept!").await.status, 201);
    let served = get(addr, &story).await;
    assert_eq!(served.status, 200, "{served:?}");
    let max_age: u64 = served
        .header("cache-control")
        .and_then(|c| c.split("max-age=").nth(1))
        .and_then(|a| a.split(',').next())
        .and_then(|a| a.parse().ok())
        .expect("a max-age");
    assert!(max_age <= 3, "cached only until the deadline: {max_age}");
    let meta: serde_json::Value = serde_json::from_slice(
        &std::fs::read(slot_dir(&server, &story).join("meta.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        (meta["v"].as_u64(), meta["expire_before"].as_u64()),
        (Some(2), Some(deadline))
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(slot_dir(&server, &kept).join("meta.json")).unwrap())
            .unwrap();
    assert_eq!(meta["v"].as_u64(), Some(1), "no deadline: the first format");

    // Past the deadline (its second has begun).
    until_unix_second(deadline).await;
    assert_eq!(
        get(addr, &story).await.status,
        404,
        "not served after expire-before"
    );
    assert_eq!(put(addr, &late, "image/jpeg", b"late!").await.status, 403);
    assert_eq!(get(addr, &kept).await.body, b"kept!");
    let done = purge_cli(&server, &[]);
    assert!(done.contains("removed 1 file(s) (5 bytes)"), "{done}");
    assert!(!slot_dir(&server, &story).exists());
    assert!(slot_dir(&server, &kept).exists());
    server.stop().await;
}

/// RFC 9110 §14: a client whose download was cut off asks for the rest
/// with `Range` and gets `206` with exactly those bytes (also across the
/// server's read chunks of 256 KiB); a range past the end is `416`; `HEAD`
/// and several ranges get the whole file (§14.2); `If-Range` with a
/// validator of another version gets the whole file too (§13.1.5). §13:
/// `If-None-Match` and `If-Modified-Since` with the file's validators get
/// `304` and no body.
#[tokio::test]
async fn downloads_resume_with_byte_ranges_and_revalidate() {
    let server = server_with(|_| {}).await;
    let mut alice = server.login("alice").await;
    let data = pattern(300_000);
    let path = slot_path(&mut alice, "voice.ogg", 300_000, Some("audio/ogg")).await;
    let addr = server.http_addr(false);
    assert_eq!(put(addr, &path, "audio/ogg", &data).await.status, 201);
    let ranged = |range: &'static str| {
        let path = path.clone();
        async move { http(addr, &format!("GET {path}"), &[("Range", range)], b"").await }
    };

    let whole = get(addr, &path).await;
    assert_eq!(whole.status, 200, "{whole:?}");
    assert_eq!(whole.header("accept-ranges"), Some("bytes"));
    let etag = whole.header("etag").expect("ETag").to_owned();
    let modified = whole
        .header("last-modified")
        .expect("Last-Modified")
        .to_owned();

    for (range, first, last) in [
        ("bytes=100000-", 100_000, 299_999),
        ("bytes=1000-299000", 1000, 299_000),
        ("bytes=0-262144", 0, 262_144),
        ("bytes=-1000", 299_000, 299_999),
        ("bytes=0-0", 0, 0),
        ("bytes=299999-500000", 299_999, 299_999),
    ] {
        let part = ranged(range).await;
        assert_eq!(part.status, 206, "{range}: {part:?}");
        assert_eq!(
            part.header("content-range"),
            Some(format!("bytes {first}-{last}/300000").as_str()),
            "{range}"
        );
        let len = last - first + 1;
        assert_eq!(
            part.header("content-length"),
            Some(len.to_string().as_str())
        );
        assert!(part.body == data[first..=last], "{range}: other bytes");
        assert_eq!(part.header("content-type"), Some("audio/ogg"));
        assert_eq!(part.header("etag"), Some(etag.as_str()));
    }

    let past = ranged("bytes=300000-").await;
    assert_eq!(past.status, 416, "{past:?}");
    assert_eq!(past.header("content-range"), Some("bytes */300000"));

    for ignored in ["bytes=0-1,5-6", "bytes=5-4", "pages=1-2"] {
        let r = ranged(ignored).await;
        assert_eq!(r.status, 200, "{ignored}: {r:?}");
        assert!(r.body == data, "{ignored}: the whole file");
    }
    let head = http(
        addr,
        &format!("HEAD {path}"),
        &[("Range", "bytes=0-9")],
        b"",
    )
    .await;
    assert_eq!(head.status, 200, "{head:?}");
    assert_eq!(head.header("content-length"), Some("300000"));

    let get_with = |headers: Vec<(&'static str, String)>| {
        let path = path.clone();
        async move {
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            http(addr, &format!("GET {path}"), &h, b"").await
        }
    };
    let same = get_with(vec![
        ("Range", "bytes=10-19".into()),
        ("If-Range", etag.clone()),
    ])
    .await;
    assert_eq!(same.status, 206, "{same:?}");
    assert!(same.body == data[10..20]);
    let same = get_with(vec![
        ("Range", "bytes=10-19".into()),
        ("If-Range", modified.clone()),
    ])
    .await;
    assert_eq!(same.status, 206, "{same:?}");
    let other = get_with(vec![
        ("Range", "bytes=10-19".into()),
        ("If-Range", "\"another-version\"".into()),
    ])
    .await;
    assert_eq!(other.status, 200, "{other:?}");
    assert!(other.body == data);

    for cond in [
        ("If-None-Match", etag.clone()),
        ("If-None-Match", format!("\"x\", W/{etag}")),
        ("If-Modified-Since", modified.clone()),
    ] {
        let r = get_with(vec![cond.clone()]).await;
        assert_eq!(r.status, 304, "{cond:?}: {r:?}");
        assert!(r.body.is_empty(), "{cond:?}");
        assert_eq!(r.header("etag"), Some(etag.as_str()));
    }
    let changed = get_with(vec![("If-None-Match", "\"another-version\"".into())]).await;
    assert_eq!(changed.status, 200, "{changed:?}");
    assert!(changed.body == data);
    // Neither ranges nor validators reveal anything of a URL that is not a
    // stored file.
    let missing = http(
        addr,
        "GET /upload/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/voice.ogg",
        &[("Range", "bytes=0-9")],
        b"",
    )
    .await;
    assert_eq!(missing.status, 404, "{missing:?}");
    server.stop().await;
}

/// The service's metrics (docs/metrics.md): slot requests by result, PUT
/// and GET answers by status, bytes stored and sent, files kept on disk.
#[tokio::test]
async fn slots_uploads_and_downloads_are_counted_in_the_metrics() {
    let server = server_with(|u| {
        u.max_file_size = 1000;
        u.quota_per_user = 1500;
    })
    .await;
    let sample = |key: &str| -> f64 {
        let text = server.server.env.metrics.encode();
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    };
    assert_eq!(sample("starling_upload_stored_files"), 0.0);
    let mut alice = server.login("alice").await;
    let addr = server.http_addr(false);
    let data = pattern(800);
    let path = slot_path(&mut alice, "a.bin", 800, None).await;
    assert_eq!(
        put(addr, &path, "application/octet-stream", &data)
            .await
            .status,
        201
    );
    assert_eq!(
        put(addr, &path, "application/octet-stream", &data)
            .await
            .status,
        409
    );
    assert_eq!(get(addr, &path).await.status, 200);
    let part = http(
        addr,
        &format!("GET {path}"),
        &[("Range", "bytes=0-99")],
        b"",
    )
    .await;
    assert_eq!(part.status, 206);
    assert_eq!(get(addr, "/upload/nosuchslot/a.bin").await.status, 404);
    // Too large, then over the quota (800 stored + 800 asked > 1500).
    let big = request(&mut alice, "b.bin", "5000", None).await;
    assert_eq!(big.attr("type"), Some("error"));
    let over = request(&mut alice, "c.bin", "800", None).await;
    assert_eq!(over.attr("type"), Some("error"));

    assert_eq!(
        sample("starling_upload_slots_total{result=\"granted\"}"),
        1.0
    );
    assert_eq!(
        sample("starling_upload_slots_total{result=\"too_large\"}"),
        1.0
    );
    assert_eq!(sample("starling_upload_slots_total{result=\"quota\"}"), 1.0);
    assert_eq!(sample("starling_upload_puts_total{status=\"201\"}"), 1.0);
    assert_eq!(sample("starling_upload_puts_total{status=\"409\"}"), 1.0);
    assert_eq!(sample("starling_upload_received_bytes_total"), 800.0);
    assert_eq!(sample("starling_upload_receiving"), 0.0);
    assert_eq!(
        sample("starling_upload_downloads_total{status=\"200\"}"),
        1.0
    );
    assert_eq!(
        sample("starling_upload_downloads_total{status=\"206\"}"),
        1.0
    );
    assert_eq!(
        sample("starling_upload_downloads_total{status=\"404\"}"),
        1.0
    );
    assert_eq!(sample("starling_upload_sent_bytes_total"), 900.0);
    assert_eq!(sample("starling_upload_stored_files"), 1.0);
    assert_eq!(sample("starling_upload_stored_bytes"), 800.0);
    server.stop().await;
}

async fn https_get(addr: SocketAddr, path: &str) -> Vec<u8> {
    let connector = starling_testkit::insecure_tls_connector();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut raw)).await;
    raw
}

/// A 20 MB file is written to disk while it arrives (the partial file
/// grows before the body is complete: the server does not hold the body
/// in memory), then comes back whole.
#[tokio::test]
async fn a_file_larger_than_any_buffer_is_streamed_to_disk() {
    const SIZE: usize = 20 * 1024 * 1024;
    let server = server_with(|u| u.max_file_size = 64 * 1024 * 1024).await;
    let mut alice = server.login("alice").await;
    let path = slot_path(&mut alice, "big.bin", SIZE, None).await;
    let data = pattern(SIZE);
    let mut tcp = TcpStream::connect(server.http_addr(false)).await.unwrap();
    tcp.write_all(
        format!("PUT {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {SIZE}\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let half = SIZE / 2;
    tcp.write_all(&data[..half]).await.unwrap();
    let part = slot_dir(&server, &path).join("file.part");
    let on_disk = || std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
    let written = poll_for(Duration::from_secs(20), async || {
        (on_disk() >= 4 * 1024 * 1024).then_some(())
    })
    .await;
    assert!(
        written.is_some(),
        "only {} bytes on disk after half the body was sent",
        on_disk()
    );
    tcp.write_all(&data[half..]).await.unwrap();
    let up = read_reply(&mut tcp).await;
    assert_eq!(up.status, 201, "{up:?}");
    assert!(!part.exists(), "the partial file was renamed");
    let down = get(server.http_addr(false), &path).await;
    assert_eq!(down.status, 200);
    assert_eq!(
        down.header("content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(down.body.len(), SIZE);
    assert!(down.body == data, "the same 20 MB back");
    server.stop().await;
}

/// A body trickling in as many small TCP segments (many small frames per
/// write to disk, more than a batch takes) is stored whole and in order.
#[tokio::test]
async fn a_body_sent_in_small_pieces_arrives_whole() {
    const SIZE: usize = 200_000;
    let server = server_with(|_| {}).await;
    let mut alice = server.login("alice").await;
    let path = slot_path(&mut alice, "pieces.bin", SIZE, None).await;
    let data = pattern(SIZE);
    let mut tcp = TcpStream::connect(server.http_addr(false)).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    tcp.write_all(
        format!("PUT {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {SIZE}\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    for (i, piece) in data.chunks(97).enumerate() {
        tcp.write_all(piece).await.unwrap();
        if i % 64 == 63 {
            // sleep: the point — let the server read what arrived, so
            // separate segments make separate frames.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let up = read_reply(&mut tcp).await;
    assert_eq!(up.status, 201, "{up:?}");
    let down = get(server.http_addr(false), &path).await;
    assert_eq!(down.status, 200);
    assert!(down.body == data, "the same {SIZE} bytes back");
    server.stop().await;
}

/// §6: over max-file-size is not-acceptable with `<file-too-large>` and the
/// limit; the request stays in the error (as §6's example).
#[tokio::test]
async fn too_large_is_refused_with_the_limit() {
    let server = server_with(|u| u.max_file_size = 1000).await;
    let mut alice = server.login("alice").await;
    let r = request(&mut alice, "big.png", "1001", Some("image/png")).await;
    assert_eq!(
        error_condition(&r).as_deref(),
        Some("not-acceptable"),
        "{r}"
    );
    let err = r.get_child("error", ns::CLIENT).unwrap();
    assert_eq!(err.attr("type"), Some("modify"));
    let max = err
        .get_child("file-too-large", NS)
        .and_then(|f| f.get_child("max-file-size", NS))
        .map(|m| m.text());
    assert_eq!(max.as_deref(), Some("1000"), "{r}");
    assert!(r.get_child("request", NS).is_some(), "{r}");
    // The limit itself is fine.
    assert!(urls(&request(&mut alice, "ok.png", "1000", None).await)
        .0
        .contains("/ok.png"));
    server.stop().await;
}

/// §6: the quota counts unexpired files and slots not yet used (until
/// their PUT URL expires); past it, resource-constraint (type wait) with
/// `<retry stamp>`. Each account has its own.
#[tokio::test]
async fn quota_counts_unexpired_files_and_unused_slots() {
    let server = server_with(|u| {
        u.quota_per_user = 1000;
        u.slot_timeout_secs = 2;
    })
    .await;
    let mut alice = server.login("alice").await;
    let first = slot_path(&mut alice, "a.bin", 600, None).await;
    // The first slot was created at this second or before.
    let first_expires = unix_secs() + 2;
    let r = request(&mut alice, "b.bin", "600", None).await;
    assert_eq!(
        error_condition(&r).as_deref(),
        Some("resource-constraint"),
        "{r}"
    );
    let err = r.get_child("error", ns::CLIENT).unwrap();
    assert_eq!(err.attr("type"), Some("wait"));
    let stamp = err.get_child("retry", NS).and_then(|e| e.attr("stamp"));
    assert!(stamp.is_some_and(|s| s.ends_with('Z')), "{r}");
    // Exactly up to the quota is fine.
    let second = slot_path(&mut alice, "c.bin", 400, None).await;
    let mut bob = server.login("bob").await;
    slot_path(&mut bob, "b.bin", 600, None).await;
    // An uploaded file keeps counting; an unused slot stops when its PUT
    // URL expires.
    let addr = server.http_addr(false);
    assert_eq!(
        put(addr, &second, "application/octet-stream", &[1; 400])
            .await
            .status,
        201
    );
    until_unix_second(first_expires).await;
    assert_eq!(
        put(addr, &first, "application/octet-stream", &[1; 600])
            .await
            .status,
        403
    );
    slot_path(&mut alice, "d.bin", 600, None).await;
    let r = request(&mut alice, "e.bin", "1", None).await;
    assert_eq!(
        error_condition(&r).as_deref(),
        Some("resource-constraint"),
        "{r}"
    );
    server.stop().await;
}

/// `quota_total`: all accounts' files and unused slots together; past it,
/// resource-constraint (type wait) saying the store is full, whoever asks.
#[tokio::test]
async fn the_whole_store_has_a_quota_of_its_own() {
    let server = server_with(|u| {
        u.quota_per_user = 0;
        u.quota_total = 1000;
    })
    .await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let first = slot_path(&mut alice, "a.bin", 600, None).await;
    let r = request(&mut bob, "b.bin", "600", None).await;
    assert_eq!(
        error_condition(&r).as_deref(),
        Some("resource-constraint"),
        "{r}"
    );
    let err = r.get_child("error", ns::CLIENT).unwrap();
    assert_eq!(err.attr("type"), Some("wait"));
    assert!(
        err.get_child("text", "urn:ietf:params:xml:ns:xmpp-stanzas")
            .is_some_and(|t| t.text().contains("store is full")),
        "{r}"
    );
    assert!(
        err.get_child("retry", NS).is_none(),
        "no per-user retry time"
    );
    // Exactly up to the limit is fine.
    slot_path(&mut bob, "c.bin", 400, None).await;
    let addr = server.http_addr(false);
    assert_eq!(
        put(addr, &first, "application/octet-stream", &[7; 600])
            .await
            .status,
        201
    );
    let r = request(&mut alice, "d.bin", "1", None).await;
    assert_eq!(
        error_condition(&r).as_deref(),
        Some("resource-constraint"),
        "{r}"
    );
    let text = server.server.env.metrics.encode();
    assert!(
        text.contains("starling_upload_slots_total{result=\"full\"} 2"),
        "{text}"
    );
    server.stop().await;
}

/// §4/§6: bad file names (empty, '/', '..', control characters), sizes and
/// types are bad-request; other odd names are made safe and kept in the URL
/// percent-encoded.
#[tokio::test]
async fn bad_requests_are_refused_and_odd_names_made_safe() {
    let server = server_with(|_| {}).await;
    let mut alice = server.login("alice").await;
    for (name, size, ct) in [
        ("", "10", None),
        ("   ", "10", None),
        ("a/b.png", "10", None),
        ("../../etc/passwd", "10", None),
        ("..", "10", None),
        ("..\\..\\x.png", "10", None),
        ("tab&#9;name.png", "10", None),
        ("ok.png", "-5", None),
        ("ok.png", "ten", None),
        ("ok.png", "10", Some("not a type")),
    ] {
        let r = request(&mut alice, name, size, ct).await;
        assert_eq!(
            error_condition(&r).as_deref(),
            Some("bad-request"),
            "{name:?} {size:?}: {r}"
        );
    }
    let r = request(&mut alice, ".hidden.png", "10", None).await;
    assert!(urls(&r).0.ends_with("/_hidden.png"), "{r}");
    let r = request(&mut alice, "C:\\photos\\a b?.png", "10", None).await;
    assert!(urls(&r).0.ends_with("/C__photos_a%20b_.png"), "{r}");
    let r = request(&mut alice, "100%.png", "10", None).await;
    assert!(urls(&r).0.ends_with("/100%25.png"), "{r}");
    server.stop().await;
}

/// §6: `allowed` (forbidden, type auth) and `allowed_types`
/// (not-acceptable).
#[tokio::test]
async fn who_and_what_may_be_uploaded_is_configurable() {
    let server = server_with(|u| {
        u.allowed = vec!["alice@localhost".into()];
        u.allowed_types = vec!["image/*".into(), "audio/ogg".into()];
    })
    .await;
    let mut bob = server.login("bob").await;
    let r = request(&mut bob, "a.png", "10", Some("image/png")).await;
    assert_eq!(error_condition(&r).as_deref(), Some("forbidden"), "{r}");
    assert_eq!(
        r.get_child("error", ns::CLIENT).unwrap().attr("type"),
        Some("auth")
    );
    let mut alice = server.login("alice").await;
    for ok in ["image/png", "IMAGE/JPEG", "audio/ogg; codecs=opus"] {
        let r = request(&mut alice, "a.png", "10", Some(ok)).await;
        assert!(r.get_child("slot", NS).is_some(), "{ok}: {r}");
    }
    for refused in [Some("application/pdf"), Some("audio/mpeg"), None] {
        let r = request(&mut alice, "a.pdf", "10", refused).await;
        assert_eq!(
            error_condition(&r).as_deref(),
            Some("not-acceptable"),
            "{refused:?}: {r}"
        );
    }
    server.stop().await;
}

/// §9: only the exact URL of an uploaded file serves it. Traversal, plain
/// or percent-encoded, other names and unknown or unused slots are "not
/// found", and nothing outside the upload directory is reached.
#[tokio::test]
async fn traversal_and_unknown_urls_find_nothing() {
    let server = server_with(|_| {}).await;
    let mut alice = server.login("alice").await;
    let addr = server.http_addr(false);
    let path = slot_path(&mut alice, "a.txt", 5, Some("text/plain")).await;
    assert_eq!(get(addr, &path).await.status, 404, "not uploaded yet");
    assert_eq!(put(addr, &path, "text/plain", b"hello").await.status, 201);
    assert_eq!(get(addr, &path).await.status, 200);
    let slot = path.split('/').nth(2).unwrap();
    // A file the server can read, to make sure it is not served.
    std::fs::write(server.dir.join("secret.txt"), "secret").unwrap();
    for bad in [
        "/upload/../../etc/passwd".to_owned(),
        "/upload/%2e%2e/%2e%2e%2fetc%2fpasswd".to_owned(),
        "/upload/%2e%2e/secret.txt".to_owned(),
        format!("/upload/{slot}/..%2f..%2fsecret.txt"),
        format!("/upload/{slot}/%2e%2e"),
        format!("/upload/{slot}/b.txt"),
        format!("/upload/{slot}/meta.json"),
        format!("/upload/{slot}/a.txt/file"),
        format!("/upload/{}/a.txt", starling_proto::random_id(32)),
        "/upload/abc/a.txt".to_owned(),
        format!("/upload/{slot}"),
    ] {
        let r = get(addr, &bad).await;
        assert!(matches!(r.status, 400 | 404), "{bad}: {r:?}");
        assert!(!r.body.windows(6).any(|w| w == b"secret"), "{bad}: {r:?}");
        let r = put(addr, &bad, "text/plain", b"x").await;
        assert!(matches!(r.status, 400 | 404 | 405), "PUT {bad}: {r:?}");
    }
    assert_eq!(
        std::fs::read_to_string(server.dir.join("secret.txt")).unwrap(),
        "secret"
    );
    server.stop().await;
}

/// §7: the PUT must carry exactly the announced length (larger 413, other
/// 400, none 411) and type (415); a broken-off upload leaves nothing
/// behind and may be retried; a slot takes one upload (409).
#[tokio::test]
async fn put_must_match_its_slot_and_happens_once() {
    let server = server_with(|_| {}).await;
    let mut alice = server.login("alice").await;
    let addr = server.http_addr(false);
    let path = slot_path(&mut alice, "v.ogg", 4000, Some("audio/ogg")).await;
    let data = pattern(4000);
    for (len, expected) in [("4001", 413), ("3999", 400), ("x", 400)] {
        let r = put_head(
            addr,
            &path,
            &[("Content-Type", "audio/ogg"), ("Content-Length", len)],
        )
        .await;
        assert_eq!(r.status, expected, "Content-Length {len}: {r:?}");
    }
    let r = put_head(addr, &path, &[("Content-Type", "audio/ogg")]).await;
    assert_eq!(r.status, 411, "{r:?}");
    let r = put_head(
        addr,
        &path,
        &[("Content-Type", "text/html"), ("Content-Length", "4000")],
    )
    .await;
    assert_eq!(r.status, 415, "{r:?}");

    // The connection ends 10 bytes short.
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        format!("PUT {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: audio/ogg\r\nContent-Length: 4000\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    tcp.write_all(&data[..3990]).await.unwrap();
    tcp.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut rest)).await;
    let dir = slot_dir(&server, &path);
    let removed = poll_for(Duration::from_secs(5), async || {
        (!dir.join("file.part").exists()).then_some(())
    })
    .await;
    assert!(removed.is_some(), "partial file left behind");
    assert_eq!(get(addr, &path).await.status, 404);

    // A Content-Type with parameters is the same type.
    let up = put(addr, &path, "audio/ogg; codecs=opus", &data).await;
    assert_eq!(up.status, 201, "{up:?}");
    let again = put(addr, &path, "audio/ogg", &pattern(4000)).await;
    assert_eq!(again.status, 409, "{again:?}");
    assert!(
        get(addr, &path).await.body == data,
        "the first upload stays"
    );
    server.stop().await;
}

/// §8: the PUT URL is valid for slot_timeout_secs only.
#[tokio::test]
async fn put_after_the_slot_timeout_is_refused() {
    let server = server_with(|u| u.slot_timeout_secs = 1).await;
    let mut alice = server.login("alice").await;
    let path = slot_path(&mut alice, "late.txt", 4, None).await;
    // The slot was created at this second or before: its PUT URL is
    // void from the next one on.
    until_unix_second(unix_secs() + 1).await;
    let r = put(server.http_addr(false), &path, "text/plain", b"late").await;
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(get(server.http_addr(false), &path).await.status, 404);
    server.stop().await;
}

/// §8: web clients on other origins may PUT and GET (CORS preflight).
#[tokio::test]
async fn cors_preflight_allows_web_clients() {
    let server = server_with(|_| {}).await;
    let mut alice = server.login("alice").await;
    let path = slot_path(&mut alice, "a.png", 4, Some("image/png")).await;
    let r = http(
        server.http_addr(false),
        &format!("OPTIONS {path}"),
        &[
            ("Origin", "https://web.example"),
            ("Access-Control-Request-Method", "PUT"),
            ("Access-Control-Request-Headers", "content-type"),
        ],
        b"",
    )
    .await;
    assert!(matches!(r.status, 200 | 204), "{r:?}");
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    let methods = r.header("access-control-allow-methods").unwrap_or("");
    assert!(methods.contains("PUT") && methods.contains("GET"), "{r:?}");
    let headers = r.header("access-control-allow-headers").unwrap_or("");
    assert!(
        headers.to_ascii_lowercase().contains("content-type"),
        "{r:?}"
    );
    server.stop().await;
}

/// Expiry: a file older than expire_after_days is no longer served, and
/// `starling upload purge` removes it (a dry run only counts); a recent
/// file is kept.
#[tokio::test]
async fn expired_files_are_not_served_and_purge_removes_them() {
    let server = server_with(|u| u.expire_after_days = 30).await;
    let mut alice = server.login("alice").await;
    let addr = server.http_addr(false);
    let old = slot_path(&mut alice, "old.txt", 3, None).await;
    let new = slot_path(&mut alice, "new.txt", 3, None).await;
    assert_eq!(put(addr, &old, "text/plain", b"old").await.status, 201);
    assert_eq!(put(addr, &new, "text/plain", b"new").await.status, 201);
    // Uploaded 31 days ago, as far as its metadata says.
    let old_dir = slot_dir(&server, &old);
    let meta_path = old_dir.join("meta.json");
    let mut meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&meta_path).unwrap()).unwrap();
    meta["uploaded"] = (unix_secs() - 31 * 86_400).into();
    std::fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
    assert_eq!(get(addr, &old).await.status, 404, "expired");
    assert_eq!(get(addr, &new).await.status, 200);

    let purge = |extra: &[&str]| purge_cli(&server, extra);
    let dry = purge(&["--dry-run"]);
    assert!(dry.contains("would remove 1 file(s) (3 bytes)"), "{dry}");
    assert!(old_dir.exists(), "a dry run removes nothing");
    let done = purge(&[]);
    assert!(done.contains("removed 1 file(s) (3 bytes)"), "{done}");
    assert!(done.contains("kept 1 file(s)"), "{done}");
    assert!(!old_dir.exists(), "the expired file is gone");
    assert_eq!(get(addr, &new).await.body, b"new");
    server.stop().await;
}
