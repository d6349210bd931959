//! Prometheus metrics over real sockets (docs/metrics.md): sessions by
//! transport (TCP, TLS, WebSocket, BOSH, detached by XEP-0198 and resumed)
//! and by domain, logins by mechanism and failures by reason, stanzas in
//! and out, one routing latency sample per routed message (to a mailbox or
//! the offline store), storage and write-behind commit latencies, process
//! metrics — and every gauge back to 0 once the clients are gone. Then the
//! documentation: every exported metric is in docs/metrics.md and every
//! documented one is exported, and every query of
//! docs/grafana-dashboard.json names an exported metric.

use base64::Engine;
use starling_proto::sasl::Mechanism;
use starling_server::modules;
use starling_testkit::stanza::msg;
use starling_testkit::starling_xml::Element;
use starling_testkit::{eventually, free_port, ns, poll_for, Client, TestServer, Transport};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

const SM: &str = "urn:xmpp:sm:3";

/// One scrape: each sample line's name with its labels, as printed, and
/// its value.
struct Scrape {
    text: String,
    samples: BTreeMap<String, f64>,
}

impl Scrape {
    fn of(server: &TestServer) -> Scrape {
        let text = server.server.env.metrics.encode();
        let samples = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| {
                let (key, value) = l.rsplit_once(' ')?;
                Some((key.to_owned(), value.parse().ok()?))
            })
            .collect();
        Scrape { text, samples }
    }

    /// The value of `key` (`name` or `name{labels}`), which must exist.
    fn get(&self, key: &str) -> f64 {
        *self
            .samples
            .get(key)
            .unwrap_or_else(|| panic!("{key} missing in:\n{}", self.text))
    }

    /// The names of the sample lines (`_total`, `_bucket`… included) and
    /// of the families (`# TYPE` lines).
    fn names(&self) -> BTreeSet<String> {
        let mut names: BTreeSet<String> = self
            .samples
            .keys()
            .map(|k| k.split('{').next().unwrap().to_owned())
            .collect();
        names.extend(self.families());
        names
    }

    /// The metric families (`# TYPE name type`).
    fn families(&self) -> BTreeSet<String> {
        self.text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .map(str::to_owned)
            .collect()
    }
}

/// Waits (up to 10 s) until `key` has the value `want`: a sample is
/// recorded just after the event a client sees (a routed stanza is timed
/// once it is in the mailbox, before the sender's task goes on).
async fn until_sample(server: &TestServer, key: &str, want: f64) {
    let seen = poll_for(Duration::from_secs(10), async || {
        (Scrape::of(server).samples.get(key).copied() == Some(want)).then_some(())
    })
    .await;
    if seen.is_none() {
        let scrape = Scrape::of(server);
        panic!(
            "{key} is {:?}, expected {want}:\n{}",
            scrape.samples.get(key),
            scrape.text
        );
    }
}

fn transport(t: &str) -> String {
    format!("starling_c2s_sessions_by_transport{{transport=\"{t}\"}}")
}

fn count(family: &str, labels: &str) -> String {
    format!("{family}_count{{{labels}}}")
}

// ----- a minimal BOSH client (XEP-0124/0206) -----

const BIND: &str = "http://jabber.org/protocol/httpbind";
const XBOSH: &str = "urn:xmpp:xbosh";

use starling_testkit::bosh_post as post;

struct Bosh {
    addr: SocketAddr,
    sid: String,
    rid: u64,
}

impl Bosh {
    /// Creates a session, logs `user` in with PLAIN and binds; returns
    /// the session and its full JID.
    async fn login(addr: SocketAddr, user: &str) -> (Bosh, String) {
        let rid = 1_000_000;
        let r = post(
            addr,
            &format!("<body xmlns='{BIND}' rid='{rid}' to='localhost' wait='5' hold='1' ver='1.6' xml:lang='en' xmpp:version='1.0' xmlns:xmpp='{XBOSH}'/>"),
        )
        .await;
        let sid = r.attr("sid").expect("sid").to_owned();
        let mut b = Bosh {
            addr,
            sid,
            rid: rid + 1,
        };
        let b64 = base64::engine::general_purpose::STANDARD.encode(format!("\0{user}\0pw-{user}"));
        let r = b
            .send(
                "",
                &format!(
                    "<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' mechanism='PLAIN'>{b64}</auth>"
                ),
            )
            .await;
        assert!(r.has_child("success", ns::SASL), "{r}");
        b.send("xmpp:restart='true' to='localhost'", "").await;
        let r = b
            .send("", "<iq xmlns='jabber:client' type='set' id='b1'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'/></iq>")
            .await;
        let jid = r
            .get_child("iq", ns::CLIENT)
            .and_then(|iq| iq.get_child("bind", ns::BIND))
            .and_then(|b| b.get_child("jid", ns::BIND))
            .map(|j| j.text())
            .unwrap_or_else(|| panic!("bind result: {r}"));
        (b, jid)
    }

    async fn send(&mut self, attrs: &str, payload: &str) -> Element {
        let rid = self.rid;
        self.rid += 1;
        let body = format!(
            "<body xmlns='{BIND}' xmlns:xmpp='{XBOSH}' sid='{}' rid='{rid}' {attrs}>{payload}</body>",
            self.sid
        );
        post(self.addr, &body).await
    }
}

/// A plain-TCP client (no TLS) logged in as `user` and bound.
async fn login_plain_tcp(server: &TestServer, user: &str) -> Client {
    server.create_user(user, &format!("pw-{user}")).await;
    let mut c = Client::connect(server.starttls_addr()).await;
    c.open_stream().await;
    c.auth(Mechanism::ScramSha256, user, &format!("pw-{user}"))
        .await
        .expect("login succeeds");
    c.bind(None).await;
    c
}

async fn chat(from: &mut Client, to: &str, body: &str) {
    from.send(&msg(to).chat().body(body).to_string()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_logins_stanzas_routing_and_storage_are_measured_on_every_transport() {
    let server = TestServer::start_with(|c| c.c2s.require_tls = false).await;
    let before = Scrape::of(&server);
    for t in ["tcp", "tls", "websocket", "bosh", "detached"] {
        assert_eq!(before.get(&transport(t)), 0.0);
    }

    // One session per transport, and a failed login.
    let mut alice = server.login("alice").await; // STARTTLS
    let mut bob = server
        .login_over("bob", Transport::WebSocket { tls: false })
        .await;
    let mut erin = login_plain_tcp(&server, "erin").await;
    server.create_user("carol", "pw-carol").await;
    let (mut carol, carol_jid) = Bosh::login(server.http_addr(false), "carol").await;
    server.create_user("dave", "pw-dave").await; // never logs in
    let mut intruder = Client::connect(server.starttls_addr()).await;
    intruder.negotiate_tls().await;
    intruder
        .auth(Mechanism::ScramSha256, "alice", "wrong")
        .await
        .unwrap_err();

    let s = Scrape::of(&server);
    for (t, n) in [
        ("tcp", 1.0),
        ("tls", 1.0),
        ("websocket", 1.0),
        ("bosh", 1.0),
        ("detached", 0.0),
    ] {
        assert_eq!(s.get(&transport(t)), n, "{t}");
    }
    assert_eq!(s.get("starling_c2s_sessions"), 4.0);
    assert_eq!(
        s.get("starling_c2s_sessions_by_domain{domain=\"localhost\"}"),
        4.0
    );
    assert_eq!(
        s.get("starling_auth_success_total{mechanism=\"SCRAM-SHA-256\"}"),
        3.0
    );
    assert_eq!(
        s.get("starling_auth_success_total{mechanism=\"PLAIN\"}"),
        1.0
    );
    assert_eq!(
        s.get("starling_auth_failures_total{reason=\"not-authorized\"}"),
        1.0
    );
    // Logins read credentials and rosters through the timed stores.
    assert!(
        s.get(&count(
            "starling_storage_latency_seconds",
            "store=\"accounts\",op=\"read\""
        )) >= 4.0
    );
    assert!(
        s.get(&count(
            "starling_storage_latency_seconds",
            "store=\"roster\",op=\"read\""
        )) >= 1.0
    );

    // Messages: 3 + 2 between TLS and WebSocket, 1 from plain TCP to
    // BOSH, 1 to dave, offline: 7 routed, 6 delivered.
    let routed = count("starling_routing_latency_seconds", "kind=\"message\"");
    let routed_before = s.get(&routed);
    let in_before = s.get("starling_stanzas_in_total{kind=\"message\"}");
    let out_before = s.get("starling_stanzas_out_total{kind=\"message\"}");
    for i in 0..3 {
        chat(&mut alice, &bob.jid, &format!("a{i}")).await;
        bob.recv_message().await;
    }
    for i in 0..2 {
        chat(&mut bob, &alice.jid, &format!("b{i}")).await;
        alice.recv_message().await;
    }
    chat(&mut erin, &carol_jid, "to bosh").await;
    let r = carol.send("", "").await; // a held request, answered with the message
    assert!(r.get_child("message", ns::CLIENT).is_some(), "{r}");
    chat(&mut alice, "dave@localhost", "offline").await;

    until_sample(&server, &routed, routed_before + 7.0).await;
    until_sample(
        &server,
        &count(
            "starling_storage_latency_seconds",
            "store=\"offline\",op=\"write\"",
        ),
        1.0,
    )
    .await;
    let s = Scrape::of(&server);
    assert_eq!(
        s.get("starling_stanzas_in_total{kind=\"message\"}") - in_before,
        7.0
    );
    assert_eq!(
        s.get("starling_stanzas_out_total{kind=\"message\"}") - out_before,
        6.0
    );
    assert!(s.get("starling_routing_latency_seconds_sum{kind=\"message\"}") > 0.0);
    // Every sample is in the +Inf bucket (cumulative buckets).
    assert_eq!(
        s.get("starling_routing_latency_seconds_bucket{le=\"+Inf\",kind=\"message\"}"),
        s.get(&routed),
    );
    // The archive's write-behind queue committed the copies in batches.
    let commits = count("starling_write_behind_commit_seconds", "queue=\"archive\"");
    eventually(
        "an archive batch is committed",
        Duration::from_secs(10),
        async || (Scrape::of(&server).get(&commits) >= 1.0).then_some(()),
    )
    .await;
    let s = Scrape::of(&server);
    assert!(s.get("starling_write_behind_written_total{queue=\"archive\"}") >= 1.0);
    assert!(
        s.get(&count(
            "starling_storage_latency_seconds",
            "store=\"archive\",op=\"write\""
        )) >= 1.0
    );

    // XEP-0198: a lost connection leaves a detached session; resuming it
    // over a new TLS stream attaches it again.
    alice
        .send(&format!("<enable xmlns='{SM}' resume='true'/>"))
        .await;
    let enabled = alice.recv_until(|e| e.is("enabled", SM)).await;
    let previd = enabled.attr("id").expect("resumption id").to_owned();
    drop(alice);
    until_sample(&server, &transport("detached"), 1.0).await;
    let s = Scrape::of(&server);
    assert_eq!(s.get(&transport("tls")), 0.0);
    assert_eq!(s.get("starling_c2s_sessions"), 4.0);
    let mut alice = Client::connect(server.starttls_addr()).await;
    alice.negotiate_tls().await;
    alice
        .auth(Mechanism::ScramSha256, "alice", "pw-alice")
        .await
        .unwrap();
    alice
        .send(&format!("<resume xmlns='{SM}' previd='{previd}' h='0'/>"))
        .await;
    let resumed = alice.recv_until(|e| !e.is("r", SM)).await;
    assert!(resumed.is("resumed", SM), "{resumed}");
    until_sample(&server, &transport("detached"), 0.0).await;
    assert_eq!(Scrape::of(&server).get(&transport("tls")), 1.0);

    // Everyone leaves: the gauges return to 0.
    alice.close().await;
    bob.close().await;
    erin.close().await;
    let r = carol
        .send(
            "type='terminate'",
            "<presence xmlns='jabber:client' type='unavailable'/>",
        )
        .await;
    assert_eq!(r.attr("type"), Some("terminate"), "{r}");
    drop(intruder);
    until_sample(&server, "starling_c2s_sessions", 0.0).await;
    until_sample(&server, "starling_c2s_connections", 0.0).await;
    let s = Scrape::of(&server);
    for t in ["tcp", "tls", "websocket", "bosh", "detached"] {
        assert_eq!(s.get(&transport(t)), 0.0, "{t}");
    }
    assert_eq!(
        s.get("starling_c2s_sessions_by_domain{domain=\"localhost\"}"),
        0.0
    );
    server.stop().await;
}

/// The auth cache's lookups are counted: the first login of an account
/// reads its credentials and disabled flag from storage (two misses), the
/// next ones from memory (two hits each); the gauge follows at the next
/// poll of the accounts change log.
#[tokio::test(flavor = "multi_thread")]
async fn auth_cache_lookups_and_size_are_exported() {
    let server = TestServer::start().await;
    let hit = "starling_auth_cache_lookups_total{result=\"hit\"}";
    let miss = "starling_auth_cache_lookups_total{result=\"miss\"}";
    let s = Scrape::of(&server);
    let (hits, misses) = (s.get(hit), s.get(miss));
    drop(server.login("alice").await);
    let s = Scrape::of(&server);
    assert_eq!(
        s.get(miss),
        misses + 2.0,
        "credentials and disabled flag read"
    );
    assert_eq!(s.get(hit), hits);
    drop(server.login("alice").await);
    drop(server.login("alice").await);
    let s = Scrape::of(&server);
    assert_eq!(s.get(miss), misses + 2.0);
    assert_eq!(s.get(hit), hits + 4.0);
    until_sample(&server, "starling_auth_cache_accounts", 1.0).await;
}

/// A session's block list (XEP-0191) is read when the session opens, not
/// at its first stanza (blocking.rs, `session_opened`): after a restart,
/// thousands of sessions' first messages no longer queue their reads on
/// storage behind the traffic. Counted by the timed blocking store: one
/// read per session opened, none for the messages that follow.
#[tokio::test(flavor = "multi_thread")]
async fn block_lists_are_read_when_sessions_open_not_at_their_first_stanza() {
    let server = TestServer::start().await;
    let key = count(
        "starling_storage_latency_seconds",
        "store=\"blocking\",op=\"read\"",
    );
    let reads = || async {
        Scrape::of(&server)
            .samples
            .get(&key)
            .copied()
            .unwrap_or(0.0)
    };
    let before = reads().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    until_sample(&server, &key, before + 2.0).await;
    for i in 0..3 {
        chat(&mut alice, &bob.jid, &format!("a{i}")).await;
        bob.recv_message().await;
        chat(&mut bob, &alice.jid, &format!("b{i}")).await;
        alice.recv_message().await;
    }
    assert_eq!(reads().await, before + 2.0);
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn process_metrics_and_build_info_are_exported() {
    let server = TestServer::start().await;
    let s = Scrape::of(&server);
    assert!(s.get("process_resident_memory_bytes") > 1e6);
    assert!(s.get("process_virtual_memory_bytes") >= s.get("process_resident_memory_bytes"));
    assert!(s.get("process_open_fds") >= 3.0);
    assert!(s.get("process_threads") >= 1.0);
    assert!(s.get("process_cpu_seconds_total") > 0.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let start = s.get("process_start_time_seconds");
    assert!(
        start <= now + 1.0 && start > now - 3600.0,
        "{start} vs {now}"
    );
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        s.get(&format!("starling_build_info{{version=\"{version}\"}}")),
        1.0
    );
    server.stop().await;
}

/// A server exporting every optional metric too: the proxy65, component
/// and upload modules enabled, the cluster bus counters registered as a
/// clustered node registers them (no NATS here), a message routed and
/// archived, a file uploaded and downloaded.
async fn server_with_every_metric() -> TestServer {
    let component: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let server = TestServer::start_with(|c| {
        c.modules.get_mut::<modules::MucLight>().enabled = true;
        let p = c.modules.get_mut::<modules::Proxy65>();
        p.enabled = true;
        p.listen = "127.0.0.1:0".parse().unwrap();
        let m = c.modules.get_mut::<modules::Component>();
        m.enabled = true;
        m.listen = component;
        m.components = vec![modules::component::ComponentEntry {
            domain: "gw.localhost".into(),
            secret: Some("gateway-secret-0123456789".into()),
            secret_file: None,
            name: String::new(),
        }];
        c.modules.get_mut::<modules::Upload>().enabled = true;
    })
    .await;
    let bus = starling_server::cluster::BusCounters::new();
    server.server.env.metrics.with_registry(|r| bus.register(r));
    let mut alice = server.login("alice").await;
    let bob = server.login("bob").await;
    chat(&mut alice, &bob.jid, "hello").await;
    let path = crate::upload::slot_path(&mut alice, "f.txt", 5, None).await;
    let http = server.http_addr(false);
    assert_eq!(
        crate::upload::put(http, &path, "text/plain", b"hello")
            .await
            .status,
        201
    );
    assert_eq!(crate::upload::get(http, &path).await.body, b"hello");
    // Families whose series appear with their first event: a limit
    // refusal and an admin token refusal (each proven end to end in
    // offline:: and admin::).
    server
        .server
        .env
        .metrics
        .limit_refused("offline.max_messages_per_user");
    server.server.env.metrics.admin_auth_failed("api");
    server
}

#[tokio::test(flavor = "multi_thread")]
async fn every_exported_metric_is_documented_and_every_documented_one_exported() {
    let doc = include_str!("../../../../docs/metrics.md");
    let server = server_with_every_metric().await;
    let s = Scrape::of(&server);
    let undocumented: Vec<_> = s
        .families()
        .into_iter()
        .filter(|f| !doc.contains(&format!("`{f}")))
        .collect();
    assert!(
        undocumented.is_empty(),
        "exported but not in docs/metrics.md: {undocumented:?}"
    );
    // The names in the tables' first column.
    let documented: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect();
    assert!(documented.len() > 30, "{documented:?}");
    let names = s.names();
    let missing: Vec<_> = documented.iter().filter(|d| !names.contains(*d)).collect();
    assert!(
        missing.is_empty(),
        "documented but not exported: {missing:?}\n{}",
        s.text
    );
    server.stop().await;
}

/// Every `expr` of the dashboard, wherever it is nested.
fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn grafana_dashboard_is_valid_and_queries_only_exported_metrics() {
    let json = include_str!("../../../../docs/grafana-dashboard.json");
    let dash: serde_json::Value = serde_json::from_str(json).expect("valid JSON");
    assert!(
        dash["schemaVersion"].as_u64().unwrap() >= 36,
        "schemaVersion"
    );
    let vars = dash["templating"]["list"].as_array().expect("variables");
    assert!(
        vars.iter()
            .any(|v| v["type"] == "datasource" && v["query"] == "prometheus"),
        "a Prometheus datasource variable"
    );
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let mut all = Vec::new();
    exprs(&dash, &mut all);
    assert!(all.len() >= 15, "{all:?}");

    let server = server_with_every_metric().await;
    let names = Scrape::of(&server).names();
    for e in &all {
        let used: Vec<&str> = e
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .filter(|t| t.starts_with("starling_") || t.starts_with("process_"))
            .collect();
        assert!(!used.is_empty(), "no metric in {e}");
        for name in used {
            assert!(names.contains(name), "{name} (in {e}) is not exported");
        }
    }
    server.stop().await;
}
