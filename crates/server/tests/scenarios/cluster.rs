//! Issue 11: several nodes on one NATS bus and one PostgreSQL database
//! (docs/cluster.md). Each test starts its own `nats-server` (Debian's
//! package) on a free loopback port and its own database on the test
//! PostgreSQL server (`STARLING_TEST_PG_URL`, `scripts/pg-test.sh`).
//!
//! Without `nats-server` or `STARLING_TEST_PG_URL` the tests print
//! `SKIPPED` and pass, unless `STARLING_REQUIRE_CLUSTER=1` (as in
//! `scripts/test-all.sh`), where they fail.

use crate::killable;

use starling_proto::sasl::Mechanism;
use starling_proto::BareJid;
use starling_server::Config;
use starling_testkit::stanza::msg;
use starling_testkit::stanza::{empty, iq_get, iq_set};
use starling_testkit::starling_xml::Element;
use starling_testkit::{
    eventually, free_port, muc, ns, poll_for, roster::befriend, Client, TestDatabase, TestServer,
};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const HEARTBEAT_MS: u64 = 200;
const NODE_TIMEOUT_MS: u64 = 1_000;

fn required() -> bool {
    std::env::var("STARLING_REQUIRE_CLUSTER").as_deref() == Ok("1")
}

fn nats_binary() -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            !required(),
            "STARLING_REQUIRE_CLUSTER=1 but nats-server is not installed (apt-get install nats-server)"
        );
    }
    found
}

fn pg_admin() -> Option<String> {
    match std::env::var("STARLING_TEST_PG_URL") {
        Ok(u) if !u.trim().is_empty() => Some(u),
        _ => {
            assert!(
                !required(),
                "STARLING_REQUIRE_CLUSTER=1 but STARLING_TEST_PG_URL is not set (scripts/pg-test.sh start)"
            );
            None
        }
    }
}

/// A `nats-server` on a free loopback port, stopped on drop.
struct Nats {
    child: Child,
    port: u16,
}

impl Nats {
    async fn start(bin: &PathBuf) -> Nats {
        Self::start_on(bin, free_port()).await
    }

    async fn start_on(bin: &PathBuf, port: u16) -> Nats {
        let child = Command::new(bin)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        let nats = Nats { child, port };
        nats.wait_up().await;
        nats
    }

    async fn wait_up(&self) {
        let up = poll_for(Duration::from_secs(5), async || {
            tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .ok()
        })
        .await;
        assert!(
            up.is_some(),
            "nats-server did not accept connections on port {} within 5 s",
            self.port
        );
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Everything a cluster test needs: a bus and a shared database.
struct Env {
    nats: Nats,
    db: TestDatabase,
    dir: PathBuf,
}

impl Env {
    async fn start() -> Option<Env> {
        let bin = nats_binary();
        let admin = pg_admin();
        let (Some(bin), Some(admin)) = (bin, admin) else {
            eprintln!(
                "SKIPPED: needs nats-server and STARLING_TEST_PG_URL (scripts/pg-test.sh start)"
            );
            return None;
        };
        let nats = Nats::start(&bin).await;
        let dir = std::env::temp_dir().join(format!(
            "starling-cluster-{}",
            starling_proto::random_id(10)
        ));
        let db = TestDatabase::for_data_dir(&admin, &dir).await;
        Some(Env { nats, db, dir })
    }

    fn configure(&self, cfg: &mut Config, node: u8) {
        cfg.server.node_id = node;
        cfg.storage.backend = "postgres".into();
        cfg.storage.url = Some(self.db.url.clone());
        cfg.cluster.nats_url = Some(self.nats.url());
        cfg.cluster.name = "test".into();
        cfg.cluster.heartbeat_ms = HEARTBEAT_MS;
        cfg.cluster.node_timeout_ms = NODE_TIMEOUT_MS;
        cfg.modules
            .get_mut::<starling_server::modules::MucLight>()
            .enabled = true;
    }

    async fn node(&self, node: u8) -> TestServer {
        TestServer::start_with(|cfg| self.configure(cfg, node)).await
    }

    /// The configuration file of a node run as a separate process.
    fn binary_config(&self, node: u8, port: u16) -> PathBuf {
        let dir = self.dir.join(format!("node{node}"));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("starling.toml");
        std::fs::write(
            &cfg,
            format!(
                "[server]\ndata_dir = {data:?}\nnode_id = {node}\n\n[[listen]]\naddress = \"127.0.0.1:{port}\"\ntls = \"starttls\"\n\n[http]\nlisten = []\n\n[admin]\nlisten = []\n\n[storage]\nbackend = \"postgres\"\nurl = {url:?}\n\n[cluster]\nnats_url = {nats:?}\nname = \"test\"\nheartbeat_ms = {HEARTBEAT_MS}\nnode_timeout_ms = {NODE_TIMEOUT_MS}\n\n[modules.muc_light]\nenabled = true\n",
                data = dir.join("data"),
                url = self.db.url,
                nats = self.nats.url(),
            ),
        )
        .unwrap();
        cfg
    }

    async fn stop(self) {
        self.db.drop_database().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits until `server` knows `n` nodes with `sessions` registry entries
/// for node `node` (None: any).
async fn wait_for(
    server: &TestServer,
    what: &str,
    ok: impl Fn(&[starling_server::cluster::NodeStatus]) -> bool,
) {
    let c = server.server.cluster.as_ref().expect("a cluster node");
    let seen = poll_for(Duration::from_secs(5), async || {
        ok(&c.status()).then_some(())
    })
    .await;
    assert!(
        seen.is_some(),
        "timed out waiting for {what}: {:?}",
        c.status()
    );
}

fn knows_node(s: &[starling_server::cluster::NodeStatus], node: u8) -> bool {
    s.iter().any(|n| n.node == node && !n.this_node)
}

fn entries_of(s: &[starling_server::cluster::NodeStatus], node: u8) -> u64 {
    s.iter()
        .find(|n| n.node == node && !n.this_node)
        .map(|n| n.registry_entries)
        .unwrap_or(0)
}

/// Waits (at most 10 s) until every write-behind queue (archive, inbox)
/// of each of `nodes` has written what it was given: a message's records
/// are queued while the node routes it, so once its recipients have it,
/// this says it is in the database.
async fn until_written(nodes: &[&TestServer]) {
    let waiting = || -> Vec<(String, i64)> {
        nodes
            .iter()
            .flat_map(|n| n.server.env.metrics.write_behind.queues())
            .map(|(name, q)| (name, q.queued.get()))
            .filter(|(_, queued)| *queued != 0)
            .collect()
    };
    let written = poll_for(Duration::from_secs(10), async || {
        waiting().is_empty().then_some(())
    })
    .await;
    assert!(
        written.is_some(),
        "write-behind queues still hold records after 10 s: {:?}",
        waiting()
    );
}

/// Waits (at most 10 s) until every message `node` sent to another node
/// has been acknowledged: from then on it sends none of them again.
async fn until_acked(node: &TestServer) {
    let c = node.server.cluster.as_ref().expect("a cluster node");
    let acked = poll_for(Duration::from_secs(10), async || {
        (c.pending_count() == 0).then_some(())
    })
    .await;
    assert!(
        acked.is_some(),
        "{} messages still unacknowledged after 10 s",
        c.pending_count()
    );
}

/// Routes a message from the server (`localhost`) with `id` to `to`, a
/// session of another node: it crosses the bus behind every frame `node`
/// queued for that node before (one subject, taken in order), so once it
/// has arrived, so has everything `node` sent that session before.
async fn marker(node: &TestServer, to: &str, id: &str) {
    let made = starling_proto::Stanza::new(
        Element::builder("message", ns::CLIENT)
            .attr("type", "chat")
            .attr("id", id)
            .append(Element::builder("body", ns::CLIENT).text("marker").build())
            .build(),
        Some(starling_proto::Jid::new("localhost").unwrap()),
        Some(starling_proto::Jid::new(to).unwrap()),
    );
    node.server.env.route(made).await;
}

fn bare(c: &Client) -> String {
    c.jid.split('/').next().unwrap().to_owned()
}

/// The XEP-0430 inbox of `c`: (conversation, unread, entry id) each.
async fn inbox_entries(c: &mut Client) -> Vec<(String, String, String)> {
    const INBOX: &str = "urn:xmpp:inbox:1";
    c.send(&iq_get("", "inbq", &empty("inbox", INBOX))).await;
    let mut entries = Vec::new();
    loop {
        let el = c.recv().await;
        if el.name() == "iq" && el.attr("id") == Some("inbq") {
            assert_eq!(el.attr("type"), Some("result"), "{el}");
            return entries;
        }
        if let Some(e) = el.get_child("entry", INBOX) {
            let a = |n: &str| e.attr(n).unwrap_or_default().to_owned();
            entries.push((a("jid"), a("unread"), a("id")));
        }
    }
}

/// Logs in on a node run as a separate process and sends initial presence.
async fn login_at(port: u16, user: &str) -> Client {
    let mut c = killable::connect(port, user, &format!("pw-{user}")).await;
    c.send("<presence/>").await;
    let echo = c.recv().await;
    assert_eq!(echo.attr("from"), Some(c.jid.as_str()), "{echo}");
    c
}

#[tokio::test]
async fn three_nodes_chat_presence_carbons_archive_and_conflict() {
    let Some(env) = Env::start().await else {
        return;
    };
    let n1 = env.node(1).await;
    let n2 = env.node(2).await;
    // Node 3 is given a list whose first server is down: it fails over.
    let n3 = TestServer::start_with(|cfg| {
        env.configure(cfg, 3);
        cfg.cluster.nats_url = Some(format!("nats://127.0.0.1:1, {}", env.nats.url()));
    })
    .await;
    for n in [&n1, &n2, &n3] {
        wait_for(n, "the other nodes", |s| s.len() == 3).await;
    }
    for u in ["alice", "bob"] {
        n1.create_user(u, &format!("pw-{u}")).await;
    }
    befriend(&n1, "alice", "bob").await;

    // alice on node 1, bob on node 2.
    let mut alice = n1.login("alice").await;
    // RFC 6121 §4.2.2: bob's initial presence reaches alice across nodes,
    // and alice's current presence is sent to bob (probe answered from the
    // registry of node 2, which holds alice's entry from node 1).
    let mut bob = n2.login("bob").await;
    let p = alice
        .recv_until(|e| e.name() == "presence" && e.attr("from") == Some(bob.jid.as_str()))
        .await;
    assert_eq!(p.attr("type"), None, "{p}");
    let p = bob
        .recv_until(|e| e.name() == "presence" && e.attr("from") == Some(alice.jid.as_str()))
        .await;
    assert_eq!(p.attr("type"), None, "{p}");

    // One-to-one chat both ways: to the bare JID and to the full JID.
    alice
        .send(&msg(&bare(&bob)).chat().id("m1").body("hi bob").to_string())
        .await;
    let m = bob.recv_until(|e| e.name() == "message").await;
    assert_eq!(muc::body(&m), "hi bob");
    assert_eq!(m.attr("from"), Some(alice.jid.as_str()));
    bob.send(&msg(&alice.jid).chat().id("m2").body("hi alice").to_string())
        .await;
    let m = alice.recv_until(|e| e.name() == "message").await;
    assert_eq!(muc::body(&m), "hi alice");
    // Node 1 sent one message across and got its acknowledgement
    // (acknowledgements are gathered for a few milliseconds).
    let metrics = poll_for(Duration::from_secs(1), async || {
        let metrics = n1.server.env.metrics.encode();
        metrics
            .contains("cluster_ack_seconds_count 1")
            .then_some(metrics)
    })
    .await
    .unwrap_or_else(|| n1.server.env.metrics.encode());
    assert!(metrics.contains("cluster_ack_seconds_count 1"), "{metrics}");
    assert!(metrics.contains("cluster_ack_seconds_count 1"), "{metrics}");

    // Presence change fans out across nodes.
    bob.send("<presence><show>away</show></presence>").await;
    let p = alice
        .recv_until(|e| e.name() == "presence" && e.attr("from") == Some(bob.jid.as_str()))
        .await;
    assert_eq!(
        p.get_child("show", ns::CLIENT).map(|s| s.text()).as_deref(),
        Some("away")
    );

    // Carbons (XEP-0280) to alice's other resource on node 3.
    let mut alice2 = n3.login("alice").await;
    // Its initial presence crosses the bus to alice's node-1 session:
    // received here, so that nothing is left on its way to alice.
    let alice2_jid = alice2.jid.clone();
    alice
        .recv_until(|e| e.name() == "presence" && e.attr("from") == Some(alice2_jid.as_str()))
        .await;
    for c in [&mut alice, &mut alice2] {
        let r = c
            .iq(
                "<iq type='set' id='c1'><enable xmlns='urn:xmpp:carbons:2'/></iq>",
                "c1",
            )
            .await;
        assert_eq!(r.attr("type"), Some("result"), "{r}");
    }
    alice
        .send(&msg(&bob.jid).chat().id("m3").body("carbon me").to_string())
        .await;
    let sent = alice2
        .recv_until(|e| e.name() == "message" && e.has_child("sent", "urn:xmpp:carbons:2"))
        .await;
    assert!(sent.to_string().contains("carbon me"), "{sent}");
    let m = bob
        .recv_until(|e| e.name() == "message" && muc::body(e) == "carbon me")
        .await;
    assert_eq!(m.attr("from"), Some(alice.jid.as_str()));

    // One archive, whichever node answers (XEP-0313 on the shared
    // database; archive and inbox writes are batched, so wait for them).
    until_written(&[&n1, &n2, &n3]).await;
    alice.barrier().await;
    alice2.barrier().await;
    let on_node1 = alice.archived_bodies().await;
    let on_node3 = alice2.archived_bodies().await;
    assert_eq!(on_node1, ["hi bob", "hi alice", "carbon me"]);
    assert_eq!(on_node1, on_node3);
    // And one inbox (XEP-0430): alice's conversation with bob, the same on
    // node 1 and node 3, with nothing unread: "hi alice" was counted by
    // node 2 and alice's reply "carbon me" reset the count on node 1;
    // whichever queue wrote first, the reset is newer and wins.
    let inbox1 = inbox_entries(&mut alice).await;
    let inbox3 = inbox_entries(&mut alice2).await;
    assert_eq!(inbox1.len(), 1, "{inbox1:?}");
    assert_eq!(
        (inbox1[0].0.as_str(), inbox1[0].1.as_str()),
        ("bob@localhost", "0")
    );
    assert_eq!(inbox1, inbox3);

    // RFC 6120 §7.7.2.2 across nodes: binding alice's node-1 resource on
    // node 2 closes the node-1 session with <conflict/>.
    alice.barrier().await;
    let resource = alice.jid.split('/').nth(1).unwrap().to_owned();
    let mut again = Client::connect(n2.starttls_addr()).await;
    again.negotiate_tls().await;
    again
        .auth(Mechanism::ScramSha256, "alice", "pw-alice")
        .await
        .unwrap();
    again.bind(Some(&resource)).await;
    alice.expect_stream_error("conflict").await;
    // Messages to that full JID now reach the node-2 session.
    bob.send(&msg(&again.jid).chat().body("after conflict").to_string())
        .await;
    let m = again
        .recv_until(|e| e.name() == "message" && muc::body(e) == "after conflict")
        .await;
    assert_eq!(m.attr("from"), Some(bob.jid.as_str()));

    drop((bob, alice2, again));
    n3.stop().await;
    n2.stop().await;
    n1.stop().await;
    env.stop().await;
}

#[tokio::test]
async fn a_stopped_node_leaves_and_its_users_messages_go_offline() {
    let Some(env) = Env::start().await else {
        return;
    };
    let n1 = env.node(1).await;
    for u in ["carol", "dan", "eve"] {
        n1.create_user(u, &format!("pw-{u}")).await;
    }
    befriend(&n1, "carol", "dan").await;
    let mut carol = n1.login("carol").await;
    let eve = n1.login("eve").await;
    // Node 2 joins a node that has sessions: it learns them from a
    // snapshot, here in one part per session.
    let n2 = TestServer::start_with(|cfg| {
        env.configure(cfg, 2);
        cfg.cluster.snapshot_part_bytes = 1;
    })
    .await;
    wait_for(&n2, "node 1's two sessions", |s| entries_of(s, 1) == 2).await;
    wait_for(&n1, "node 2", |s| knows_node(s, 2)).await;
    let mut dan = n2.login("dan").await;
    // RFC 6121 §4.2: dan's probe of carol is answered on node 2 from the
    // registry entry the snapshot gave it.
    dan.recv_until(|e| e.name() == "presence" && e.attr("from") == Some(carol.jid.as_str()))
        .await;
    drop(eve);
    wait_for(&n2, "eve's session gone", |s| entries_of(s, 1) == 1).await;
    let dan_jid = dan.jid.clone();
    wait_for(&n1, "dan's entry", |s| entries_of(s, 2) == 1).await;
    carol
        .recv_until(|e| e.name() == "presence" && e.attr("from") == Some(dan_jid.as_str()))
        .await;

    // `starling cluster status` hears both nodes on the bus. (The nodes
    // run on this test's runtime: wait for the command off it.)
    let cfg = env.binary_config(9, free_port());
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || killable::bin().args(args).output().unwrap())
    };
    let with_cfg = |extra: &[&str]| {
        let mut a = vec!["--config".to_owned(), cfg.display().to_string()];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let out = run(with_cfg(&["cluster", "status", "--json"]))
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let nodes: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let summary: Vec<(u64, u64)> = nodes
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["node"].as_u64().unwrap(), n["sessions"].as_u64().unwrap()))
        .collect();
    assert_eq!(summary, [(1, 1), (2, 1)], "{nodes}");
    let human = run(with_cfg(&["cluster", "status"])).await.unwrap();
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("2 node(s)"), "{text}");
    // Without a cluster it says what to configure, and fails.
    let none = killable::bin()
        .args(["cluster", "status"])
        .output()
        .unwrap();
    assert!(!none.status.success());
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("[cluster] nats_url"),
        "{none:?}"
    );

    // Graceful stop: dan gets system-shutdown, carol sees him leave, and
    // node 1 forgets node 2 at once (no timeout).
    dan.barrier().await;
    let stopping = tokio::spawn(n2.stop());
    // RFC 6120 §4.9.3.17: the client is told, and reconnects elsewhere.
    dan.expect_stream_error("system-shutdown").await;
    let p = carol
        .recv_until(|e| e.name() == "presence" && e.attr("from") == Some(dan_jid.as_str()))
        .await;
    assert_eq!(p.attr("type"), Some("unavailable"), "{p}");
    stopping.await.unwrap();
    wait_for(&n1, "node 2 gone", |s| !knows_node(s, 2)).await;

    // A message to dan is now stored offline and delivered when he comes
    // back, on node 1.
    carol
        .send("<message to='dan@localhost' type='chat'><body>while you were away</body></message>")
        .await;
    // Stored offline while carol's session handled it.
    carol.barrier().await;
    let mut dan = n1.login("dan").await;
    let m = dan
        .recv_until(|e| e.name() == "message" && muc::body(e) == "while you were away")
        .await;
    assert_eq!(m.attr("from"), Some(carol.jid.as_str()));
    drop(dan);
    n1.stop().await;
    env.stop().await;
}

/// kill -9 of a node: within the node timeout its sessions leave every
/// registry and their contacts get unavailable presence; messages the dead
/// node never acknowledged (it was frozen with SIGSTOP first, so it took
/// none of them) and messages sent after its death go to offline storage.
#[tokio::test]
async fn a_killed_node_is_declared_dead_and_nothing_sent_to_it_is_lost() {
    let Some(env) = Env::start().await else {
        return;
    };
    let n1 = env.node(1).await;
    for u in ["erin", "frank"] {
        n1.create_user(u, &format!("pw-{u}")).await;
    }
    befriend(&n1, "erin", "frank").await;
    let port = free_port();
    let cfg = env.binary_config(2, port);
    let node2 = killable::KillOnDrop(killable::start_binary(&cfg, port).await);
    wait_for(&n1, "node 2", |s| knows_node(s, 2)).await;

    let mut erin = n1.login("erin").await;
    let frank = login_at(port, "frank").await;
    let frank_jid = frank.jid.clone();
    erin.recv_until(|e| e.name() == "presence" && e.attr("from") == Some(frank_jid.as_str()))
        .await;

    // Freeze node 2: it reads nothing, acknowledges nothing.
    let pid = node2.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    for i in 0..3 {
        erin.send(
            &msg(&frank_jid)
                .chat()
                .id(&format!("f{i}"))
                .body(&format!("in flight {i}"))
                .to_string(),
        )
        .await;
    }
    // Then kill it.
    drop(node2);
    let started = std::time::Instant::now();
    let p = erin
        .recv_until(|e| e.name() == "presence" && e.attr("from") == Some(frank_jid.as_str()))
        .await;
    assert_eq!(p.attr("type"), Some("unavailable"), "{p}");
    assert!(
        started.elapsed() < Duration::from_millis(NODE_TIMEOUT_MS + 3 * HEARTBEAT_MS + 1_000),
        "declared dead after {:?}",
        started.elapsed()
    );
    wait_for(&n1, "node 2 forgotten", |s| !knows_node(s, 2)).await;
    erin.send(
        "<message to='frank@localhost' type='chat' id='f9'><body>after death</body></message>",
    )
    .await;
    // Stored offline while erin's session handled it.
    erin.barrier().await;

    // frank comes back on node 1: everything is there, once, in order.
    let mut frank = n1.login("frank").await;
    let mut got = Vec::new();
    while got.len() < 4 {
        let m = frank.recv_until(|e| e.name() == "message").await;
        got.push(muc::body(&m));
    }
    assert_eq!(
        got,
        ["in flight 0", "in flight 1", "in flight 2", "after death"]
    );
    // Once each: the offline messages are written in one go, before frank's
    // next stanza is read.
    frank.expect_nothing().await;
    // The bus metrics say so too.
    let metrics = n1.server.env.metrics.encode();
    assert!(metrics.contains("cluster_rerouted_total 3"), "{metrics}");
    drop(frank);
    n1.stop().await;
    env.stop().await;
}

/// XEP-0198 §5 across nodes: a detached session stays on the node it was
/// detached on (docs/cluster.md says why). Resuming it on another node
/// fails with `<item-not-found/>` and the client binds afresh; on its own
/// node it still resumes.
#[tokio::test]
async fn resumption_on_another_node_is_refused_cleanly() {
    const SM: &str = "urn:xmpp:sm:3";
    let Some(env) = Env::start().await else {
        return;
    };
    let n1 = env.node(1).await;
    let n2 = env.node(2).await;
    wait_for(&n2, "node 1", |s| knows_node(s, 1)).await;
    let mut g = n1.login("gina").await;
    g.send(&format!("<enable xmlns='{SM}' resume='1'/>")).await;
    let enabled = g.recv_until(|e| !e.is("r", SM)).await;
    assert!(enabled.is("enabled", SM), "{enabled}");
    let previd = enabled.attr("id").unwrap().to_owned();
    drop(g);
    // Node 1 noticed the dropped connection: the session is detached.
    let detached = n1
        .server
        .env
        .metrics
        .sessions_on(starling_core::SessionTransport::Detached)
        .clone();
    eventually(
        "node 1 detaches gina's session",
        Duration::from_secs(10),
        async || (detached.get() == 1).then_some(()),
    )
    .await;

    let authenticated = |addr| async move {
        let mut c = Client::connect(addr).await;
        c.negotiate_tls().await;
        c.auth(Mechanism::ScramSha256, "gina", "pw-gina")
            .await
            .unwrap();
        c
    };
    let mut elsewhere = authenticated(n2.starttls_addr()).await;
    elsewhere
        .send(&format!("<resume xmlns='{SM}' previd='{previd}' h='0'/>"))
        .await;
    let f = elsewhere.recv().await;
    assert!(f.is("failed", SM), "{f}");
    assert!(f.has_child("item-not-found", ns::STANZAS), "{f}");
    assert!(elsewhere.bind(None).await.starts_with("gina@localhost/"));

    let mut home = authenticated(n1.starttls_addr()).await;
    home.send(&format!("<resume xmlns='{SM}' previd='{previd}' h='0'/>"))
        .await;
    let r = home.recv().await;
    assert!(r.is("resumed", SM), "{r}");
    drop((elsewhere, home));
    n2.stop().await;
    n1.stop().await;
    env.stop().await;
}

/// The NATS server restarts: nodes reconnect by themselves, a message sent
/// while the bus was down arrives once, and chat goes on both ways.
#[tokio::test]
async fn nats_restart_loses_nothing_acknowledged() {
    let Some(mut env) = Env::start().await else {
        return;
    };
    // Long enough that the outage does not make the nodes declare each
    // other dead.
    let configure = |cfg: &mut Config, node| {
        env.configure(cfg, node);
        cfg.cluster.node_timeout_ms = 10_000;
    };
    let n1 = TestServer::start_with(|c| configure(c, 1)).await;
    let n2 = TestServer::start_with(|c| configure(c, 2)).await;
    wait_for(&n1, "node 2", |s| knows_node(s, 2)).await;
    let mut hank = n1.login("hank").await;
    let mut ivy = n2.login("ivy").await;
    wait_for(&n1, "ivy's entry", |s| entries_of(s, 2) == 1).await;

    // Stop the bus; send while it is down; start it again on its port.
    let port = env.nats.port;
    let bin = nats_binary().unwrap();
    let _ = env.nats.child.kill();
    let _ = env.nats.child.wait();
    // Node 1 no longer hears node 2: the bus is down as node 1 sees it.
    wait_for(&n1, "node 2 unheard for two heartbeats", |s| {
        s.iter()
            .any(|n| n.node == 2 && !n.this_node && n.last_heartbeat_ms_ago > 2 * HEARTBEAT_MS)
    })
    .await;
    hank.send(
        &msg(&ivy.jid)
            .chat()
            .body("sent while the bus was down")
            .to_string(),
    )
    .await;
    // Hank's session has routed it (to the bus's queue) before the answer.
    hank.barrier().await;
    env.nats = Nats::start_on(&bin, port).await;

    let m = ivy.recv_until(|e| e.name() == "message").await;
    assert_eq!(muc::body(&m), "sent while the bus was down");
    ivy.send(&msg(&hank.jid).chat().body("back").to_string())
        .await;
    let m = hank.recv_until(|e| e.name() == "message").await;
    assert_eq!(muc::body(&m), "back");
    // Exactly once, though it may have been sent twice: once node 1 has
    // its acknowledgement it sends it no more, and a marker it sends after
    // reaches ivy behind any copy sent before.
    until_acked(&n1).await;
    marker(&n1, &ivy.jid, "mark").await;
    let m = ivy.recv_until(|e| e.name() == "message").await;
    assert_eq!(m.attr("id"), Some("mark"), "a duplicate: {m}");
    ivy.expect_nothing().await;
    drop((hank, ivy));
    n2.stop().await;
    n1.stop().await;
    env.stop().await;
}

/// Issue 31: the queue of frames waiting for the bus is bounded
/// (`[cluster] max_queue_mib`). While NATS is down a node keeps taking
/// messages for another node: past the bound it drops frames and counts
/// them, holding at most that much; the messages it dropped stay kept
/// and are sent again once the bus is back, so each arrives exactly once.
#[tokio::test]
async fn a_stalled_bus_bounds_the_queue_and_loses_nothing_acknowledged() {
    let Some(mut env) = Env::start().await else {
        return;
    };
    let configure = |cfg: &mut Config, node| {
        env.configure(cfg, node);
        cfg.cluster.node_timeout_ms = 30_000;
        cfg.cluster.max_queue_mib = 1;
    };
    let n1 = TestServer::start_with(|c| configure(c, 1)).await;
    let n2 = TestServer::start_with(|c| configure(c, 2)).await;
    wait_for(&n1, "node 2", |s| knows_node(s, 2)).await;
    let mut hank = n1.login("hank").await;
    let mut ivy = n2.login("ivy").await;
    wait_for(&n1, "ivy's entry", |s| entries_of(s, 2) == 1).await;

    let port = env.nats.port;
    let bin = nats_binary().unwrap();
    let _ = env.nats.child.kill();
    let _ = env.nats.child.wait();
    // 4 MiB for node 2 while the bus is down: four times the bound (the
    // NATS client itself holds at most 64 batches).
    const N: usize = 400;
    let filler = "q".repeat(10 * 1024);
    for i in 0..N {
        hank.send(
            &msg(&ivy.jid)
                .chat()
                .id(&format!("s{i}"))
                .body(&format!("{i} {filler}"))
                .to_string(),
        )
        .await;
    }
    // Barrier: hank's session has routed all of them.
    hank.send("<iq type='get' id='b' to='localhost'><ping xmlns='urn:xmpp:ping'/></iq>")
        .await;
    hank.recv_until(|e| e.attr("id") == Some("b")).await;
    let dropped = |n: &TestServer| -> u64 {
        n.server
            .env
            .metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix("starling_cluster_frames_dropped_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    assert!(dropped(&n1) > 0, "nothing dropped: the queue took 4 MiB");
    env.nats = Nats::start_on(&bin, port).await;

    let mut got = std::collections::BTreeSet::new();
    while got.len() < N {
        let m = ivy.recv_until(|e| e.name() == "message").await;
        let id = m.attr("id").unwrap_or_default().to_owned();
        assert!(got.insert(id.clone()), "{id} arrived twice");
    }
    // Exactly once: chat goes on both ways; once node 1 has every
    // acknowledgement it sends none of them again, and a marker it sends
    // after reaches ivy behind any copy sent before.
    ivy.send(&msg(&hank.jid).chat().id("back").body("back").to_string())
        .await;
    hank.recv_until(|e| e.attr("id") == Some("back")).await;
    until_acked(&n1).await;
    marker(&n1, &ivy.jid, "b2").await;
    let el = ivy.recv_until(|e| e.name() == "message").await;
    assert_eq!(el.attr("id"), Some("b2"), "a duplicate: {el}");
    drop((hank, ivy));
    n2.stop().await;
    n1.stop().await;
    env.stop().await;
}

/// XEP-0191 across nodes: the router of the sender's node enforces the
/// recipient's block list, which the recipient changed on another node.
/// Node 1 has the list cached (it delivered a message before); the block
/// reaches it over the bus and takes effect at once.
#[tokio::test]
async fn a_block_made_on_one_node_is_enforced_by_the_others() {
    let Some(env) = Env::start().await else {
        return;
    };
    let n1 = env.node(1).await;
    let n2 = env.node(2).await;
    wait_for(&n1, "node 2", |s| knows_node(s, 2)).await;
    let mut jack = n1.login("jack").await;
    let mut kate = n2.login("kate").await;
    wait_for(&n1, "kate's entry", |s| entries_of(s, 2) == 1).await;
    let to_kate = |text: &str| msg("kate@localhost").chat().body(text).to_string();
    jack.send(&to_kate("before")).await;
    let m = kate.recv_until(|e| e.name() == "message").await;
    assert_eq!(muc::body(&m), "before");
    // A stanza near the size limit (256 KiB) crosses the bus whole.
    let big = "x".repeat(200_000);
    jack.send(&to_kate(&big)).await;
    let m = kate.recv_until(|e| e.name() == "message").await;
    assert_eq!(muc::body(&m).len(), 200_000);

    let r = kate
        .iq(
            "<iq type='set' id='b1'><block xmlns='urn:xmpp:blocking'><item jid='jack@localhost'/></block></iq>",
            "b1",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    // The block's announcement went on the bus to every node before the
    // answer; a session bound on node 2 after it is announced on the same
    // subject, behind it: once node 1 has that session, it has the block.
    let _lucy = n2.login("lucy").await;
    wait_for(&n1, "lucy's entry, behind the block", |s| {
        entries_of(s, 2) == 2
    })
    .await;
    jack.send(&to_kate("after")).await;
    // §3.5: the blocked sender's message gets service-unavailable ...
    let e = jack
        .recv_until(|e| e.name() == "message" && e.attr("type") == Some("error"))
        .await;
    assert_eq!(
        starling_testkit::error_condition(&e).as_deref(),
        Some("service-unavailable"),
        "{e}"
    );
    // ... and kate gets nothing: a marker node 1 sends her after it is the
    // next thing she gets.
    marker(&n1, &kate.jid, "mark").await;
    let m = kate.recv().await;
    assert_eq!(m.attr("id"), Some("mark"), "kate got: {m}");
    drop((jack, kate));
    n2.stop().await;
    n1.stop().await;
    env.stop().await;
}

/// A partition longer than the node timeout (node 2 frozen with SIGSTOP,
/// then resumed): node 1 declares it dead and tells its users' contacts
/// they left; when node 2 is heard again with the same process, its
/// sessions are back in the registry, the contacts get their presence
/// again, and messages reach them.
#[tokio::test]
async fn a_node_back_from_a_partition_is_announced_again() {
    let Some(env) = Env::start().await else {
        return;
    };
    let n1 = env.node(1).await;
    for u in ["lena", "mike"] {
        n1.create_user(u, &format!("pw-{u}")).await;
    }
    befriend(&n1, "lena", "mike").await;
    let port = free_port();
    let cfg = env.binary_config(2, port);
    let node2 = killable::KillOnDrop(killable::start_binary(&cfg, port).await);
    wait_for(&n1, "node 2", |s| knows_node(s, 2)).await;
    let mut lena = n1.login("lena").await;
    let mut mike = login_at(port, "mike").await;
    let mike_jid = mike.jid.clone();
    let from_mike =
        |e: &Element| e.name() == "presence" && e.attr("from") == Some(mike_jid.as_str());
    lena.recv_until(from_mike).await;

    let pid = node2.0.id().to_string();
    let signal = |sig: &str| {
        assert!(Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success())
    };
    signal("-STOP");
    let p = lena.recv_until(from_mike).await;
    assert_eq!(p.attr("type"), Some("unavailable"), "{p}");
    signal("-CONT");
    let p = lena.recv_until(from_mike).await;
    assert_eq!(p.attr("type"), None, "mike is announced again: {p}");
    wait_for(&n1, "mike's entry", |s| entries_of(s, 2) == 1).await;
    lena.send(&msg(&mike_jid).chat().body("welcome back").to_string())
        .await;
    let m = mike
        .recv_until(|e| e.name() == "message" && muc::body(e) == "welcome back")
        .await;
    assert_eq!(m.attr("from"), Some(lena.jid.as_str()));
    drop((lena, mike, node2));
    n1.stop().await;
    env.stop().await;
}

/// RFC 6121 §3.1 across nodes: the subscription request, the approval, the
/// roster pushes (made by the node that handles each side, for sessions on
/// the other) and the contact's presence.
#[tokio::test]
async fn a_subscription_handshake_across_nodes() {
    const ROSTER: &str = "jabber:iq:roster";
    let Some(env) = Env::start().await else {
        return;
    };
    let n1 = env.node(1).await;
    let n2 = env.node(2).await;
    wait_for(&n1, "node 2", |s| knows_node(s, 2)).await;
    let mut nina = n1.login("nina").await;
    let mut omar = n2.login("omar").await;
    wait_for(&n1, "omar's entry", |s| entries_of(s, 2) == 1).await;
    for c in [&mut nina, &mut omar] {
        // §2.2: a session that asked for the roster gets its pushes.
        let r = c.iq(&iq_get("", "rg", &empty("query", ROSTER)), "rg").await;
        assert_eq!(r.attr("type"), Some("result"), "{r}");
    }
    let push_of = |e: &Element| -> Option<(String, String)> {
        let item = e.get_child("query", ROSTER)?.get_child("item", ROSTER)?;
        Some((
            item.attr("jid")?.to_owned(),
            item.attr("subscription")?.to_owned(),
        ))
    };
    let is_push = |e: &Element| e.name() == "iq" && e.attr("type") == Some("set");

    nina.send("<presence to='omar@localhost' type='subscribe'/>")
        .await;
    let req = omar
        .recv_until(|e| e.name() == "presence" && e.attr("type") == Some("subscribe"))
        .await;
    assert_eq!(req.attr("from"), Some("nina@localhost"));

    omar.send("<presence to='nina@localhost' type='subscribed'/>")
        .await;
    // Omar's own push (node 2, local), then nina's side on node 1.
    let p = omar.recv_until(is_push).await;
    assert_eq!(push_of(&p), Some(("nina@localhost".into(), "from".into())));
    let ok = nina
        .recv_until(|e| e.name() == "presence" && e.attr("type") == Some("subscribed"))
        .await;
    assert_eq!(ok.attr("from"), Some("omar@localhost"));
    let mut saw_push = false;
    let mut saw_presence = false;
    while !(saw_push && saw_presence) {
        let e = nina
            .recv_until(|e| is_push(e) || e.name() == "presence")
            .await;
        if is_push(&e) {
            assert_eq!(push_of(&e), Some(("omar@localhost".into(), "to".into())));
            saw_push = true;
        } else if e.attr("from") == Some(omar.jid.as_str()) && e.attr("type").is_none() {
            // §3.1.6: the contact's current presence follows the approval.
            saw_presence = true;
        }
    }
    drop((nina, omar));
    n2.stop().await;
    n1.stop().await;
    env.stop().await;
}

/// Bad input on the bus (garbage, a cut-off frame, a newer version, an
/// empty message): each is dropped and counted, and the nodes go on
/// routing. (Well-formed frames from an impostor are another matter: the
/// bus is trusted, docs/cluster.md.)
#[tokio::test]
async fn garbage_on_the_bus_is_dropped_and_counted() {
    let Some(env) = Env::start().await else {
        return;
    };
    let n1 = env.node(1).await;
    let n2 = env.node(2).await;
    wait_for(&n1, "node 2", |s| knows_node(s, 2)).await;
    let mut pat = n1.login("pat").await;
    let mut quinn = n2.login("quinn").await;
    wait_for(&n1, "quinn's entry", |s| entries_of(s, 2) == 1).await;

    let rogue = async_nats::connect(env.nats.url()).await.unwrap();
    let mut cut = b"SB\x01\x02".to_vec();
    cut.extend_from_slice(&[0; 8]);
    cut.extend_from_slice(&[7, 255, 255, 0, 0, 1, 2]); // a Deliver cut short
    let mut newer = b"SB\x09\x02".to_vec();
    newer.extend_from_slice(&[0; 8]);
    for (subject, payload) in [
        ("test.all", b"hello, is this XMPP?".to_vec()),
        ("test.node.1", cut),
        ("test.node.1", newer),
        ("test.all", Vec::new()),
    ] {
        rogue
            .publish(subject, bytes::Bytes::from(payload))
            .await
            .unwrap();
    }
    rogue.flush().await.unwrap();
    drop(rogue);

    pat.send(&msg(&quinn.jid).chat().body("still here").to_string())
        .await;
    let m = quinn.recv_until(|e| e.name() == "message").await;
    assert_eq!(muc::body(&m), "still here");
    let metrics = n1.server.env.metrics.encode();
    let bad: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("starling_cluster_bad_messages_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(bad >= 3, "{metrics}");
    drop((pat, quinn));
    n2.stop().await;
    n1.stop().await;
    env.stop().await;
}

// ---- group chat (issue 12): each room runs on one node ----

/// A room name whose owner among `nodes` is `owner` (rendezvous hashing,
/// the rule every node applies).
fn room_owned_by(owner: u8, nodes: &[u8], prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}@conference.localhost"))
        .find(|r| starling_server::cluster::rendezvous(r, nodes) == Some(owner))
        .unwrap()
}

/// Rooms of XEP-0045 on three nodes: a room runs on the node rendezvous
/// hashing picks (here node 2), and occupants on every node create it,
/// enter it, see each other and chat, privately too; its archive answers
/// from any node.
#[tokio::test]
async fn a_room_runs_on_one_node_and_serves_occupants_on_every_node() {
    let Some(env) = Env::start().await else {
        return;
    };
    let n1 = env.node(1).await;
    let n2 = env.node(2).await;
    let n3 = env.node(3).await;
    for n in [&n1, &n2, &n3] {
        wait_for(n, "the other nodes", |s| s.len() == 3).await;
    }
    let room = room_owned_by(2, &[1, 2, 3], "lobby");
    let mut alice = n1.login("alice").await;
    let mut bob = n2.login("bob").await;
    let mut carol = n3.login("carol").await;
    // Created from node 1 (on node 2), configured as an instant room.
    muc::join(&mut alice, &room, "Alice").await;
    muc::instant(&mut alice, &room).await;
    muc::join(&mut bob, &room, "Bob").await;
    muc::join(&mut carol, &room, "Carol").await;
    // Alice (node 1) saw both arrive, with their occupant JIDs.
    for nick in ["Bob", "Carol"] {
        let from = format!("{room}/{nick}");
        let p = alice
            .recv_until(|e| e.name() == "presence" && e.attr("from") == Some(from.as_str()))
            .await;
        assert!(p.has_child("x", muc::MUC_USER), "{p}");
    }
    // (Carol's arrival, sent to bob before the room answers his ping.)
    bob.barrier_via(&room).await;
    // A message from node 3 reaches node 1 and node 2 (and its sender).
    carol
        .send(
            &msg(&room)
                .groupchat()
                .id("g1")
                .body("hello nodes")
                .to_string(),
        )
        .await;
    for c in [&mut alice, &mut bob, &mut carol] {
        let m = c.recv_until(|e| e.name() == "message").await;
        assert_eq!(muc::body(&m), "hello nodes", "{m}");
        assert_eq!(m.attr("from"), Some(format!("{room}/Carol").as_str()));
    }
    // §7.5 across nodes.
    alice
        .send(
            &msg(&format!("{room}/Carol"))
                .chat()
                .id("p1")
                .body("psst")
                .to_string(),
        )
        .await;
    let m = carol.recv_until(|e| e.name() == "message").await;
    assert_eq!(muc::body(&m), "psst");
    assert_eq!(m.attr("from"), Some(format!("{room}/Alice").as_str()));
    // XEP-0410 self-ping from any node reaches the one room.
    let p = bob
        .iq(
            &iq_get(
                &format!("{room}/Bob"),
                "sp",
                "<ping xmlns='urn:xmpp:ping'/>",
            ),
            "sp",
        )
        .await;
    assert_eq!(p.attr("type"), Some("result"), "{p}");
    // The room lives on node 2 only.
    let live = |n: &TestServer| {
        let m = n.server.env.metrics.encode();
        m.contains("muc_rooms_live 1")
    };
    assert!(
        live(&n2) && !live(&n1) && !live(&n3),
        "the room is on node 2 only"
    );
    for c in [alice, bob, carol] {
        drop(c);
    }
    for n in [n1, n2, n3] {
        n.stop().await;
    }
    env.stop().await;
}

/// The room's node is killed: within the node timeout another node owns
/// the room; an occupant's XEP-0410 self-ping is answered `not-acceptable`
/// (the new node does not know them), so they enter again, and the
/// persistent room comes back from storage with its configuration.
#[tokio::test]
async fn a_rooms_node_dies_and_its_occupants_enter_again_elsewhere() {
    let Some(env) = Env::start().await else {
        return;
    };
    let n1 = env.node(1).await;
    for u in ["dora", "ed"] {
        n1.create_user(u, &format!("pw-{u}")).await;
    }
    let port = free_port();
    let cfg = env.binary_config(2, port);
    let node2 = killable::KillOnDrop(killable::start_binary(&cfg, port).await);
    wait_for(&n1, "node 2", |s| knows_node(s, 2)).await;
    let room = room_owned_by(2, &[1, 2], "keep");
    assert_eq!(starling_server::cluster::rendezvous(&room, &[1]), Some(1));
    let mut dora = n1.login("dora").await;
    let mut ed = n1.login("ed").await;
    muc::join(&mut dora, &room, "Dora").await;
    let c = muc::configure(
        &mut dora,
        &room,
        &[
            ("muc#roomconfig_persistentroom", "1"),
            ("muc#roomconfig_roomname", "Kept room"),
        ],
    )
    .await;
    assert_eq!(c.attr("type"), Some("result"), "{c}");
    muc::join(&mut ed, &room, "Ed").await;
    // Ed's arrival crossed the bus to dora before the room's answer.
    dora.barrier_via(&room).await;
    drop(node2); // SIGKILL
    wait_for(&n1, "node 2 declared dead", |s| !knows_node(s, 2)).await;
    // XEP-0410 §4: the room (now on node 1) does not know dora.
    let p = dora
        .iq(
            &iq_get(
                &format!("{room}/Dora"),
                "sp",
                "<ping xmlns='urn:xmpp:ping'/>",
            ),
            "sp",
        )
        .await;
    assert_eq!(
        starling_testkit::error_condition(&p).as_deref(),
        Some("not-acceptable"),
        "{p}"
    );
    // Entering again: the stored room, its name and owner kept.
    muc::join(&mut dora, &room, "Dora").await;
    muc::join(&mut ed, &room, "Ed").await;
    let info = ed
        .iq(
            &iq_get(
                &room,
                "di",
                "<query xmlns='http://jabber.org/protocol/disco#info'/>",
            ),
            "di",
        )
        .await;
    assert!(info.to_string().contains("Kept room"), "{info}");
    assert!(info.to_string().contains("muc_persistent"), "{info}");
    dora.barrier_via(&room).await;
    ed.send(
        &msg(&room)
            .groupchat()
            .id("g")
            .body("still here")
            .to_string(),
    )
    .await;
    let m = dora.recv_until(|e| e.name() == "message").await;
    assert_eq!(muc::body(&m), "still here");
    drop(dora);
    drop(ed);
    n1.stop().await;
    env.stop().await;
}

/// A MUC Light room's version, asked by a member.
async fn light_version(c: &mut Client, room: &str) -> String {
    const CONFIG: &str = "urn:xmpp:muclight:0#configuration";
    let r = c.iq(&iq_get(room, "v", &empty("query", CONFIG)), "v").await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    r.get_child("query", CONFIG)
        .and_then(|q| q.get_child("version", CONFIG))
        .map(|v| v.text())
        .unwrap()
}

/// MUC Light on a cluster: a room runs on the node placement picks (here
/// node 2, a separate process); members on other nodes create it and chat
/// (copies to their bare JIDs cross the bus); when node 2 is killed, the
/// next message loads the stored room on node 1 with the same members and
/// version, and nothing the members see changes.
#[tokio::test]
async fn a_muc_light_rooms_node_dies_and_the_room_goes_on_elsewhere() {
    let Some(env) = Env::start().await else {
        return;
    };
    let n1 = env.node(1).await;
    let n3 = env.node(3).await;
    let port = free_port();
    let cfg = env.binary_config(2, port);
    let node2 = killable::KillOnDrop(killable::start_binary(&cfg, port).await);
    for n in [&n1, &n3] {
        wait_for(n, "nodes 1, 2, 3", |s| s.len() == 3).await;
    }
    let room = (0..)
        .map(|i| format!("group{i}@muclight.localhost"))
        .find(|r| {
            starling_server::cluster::rendezvous(r, &[1, 2, 3]) == Some(2)
                && starling_server::cluster::rendezvous(r, &[1, 3]) == Some(1)
        })
        .unwrap();
    let mut gil = n1.login("gil").await;
    let mut hal = n3.login("hal").await;
    let r = gil
        .iq(
            &iq_set(&room, "mk", "<query xmlns='urn:xmpp:muclight:0#create'><configuration><roomname>Across</roomname></configuration><occupants><user affiliation='member'>hal@localhost</user></occupants></query>"),
            "mk",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let note = hal.recv_until(|e| e.name() == "message").await;
    assert!(
        note.to_string()
            .contains("urn:xmpp:muclight:0#affiliations"),
        "{note}"
    );
    // (Gil's own affiliation notice, from node 2 before its answer.)
    gil.barrier_via(&room).await;
    hal.send(
        &msg(&room)
            .groupchat()
            .id("x1")
            .body("over the bus")
            .to_string(),
    )
    .await;
    for c in [&mut gil, &mut hal] {
        let m = c.recv_until(|e| e.name() == "message").await;
        assert_eq!(muc::body(&m), "over the bus", "{m}");
        assert_eq!(
            m.attr("from"),
            Some(format!("{room}/hal@localhost").as_str())
        );
    }
    // One copy each. (The bus is at-least-once: a message node 2 took but
    // had not acknowledged yet when killed is routed again, to the room's
    // new node — docs/durability.md. Waiting here for node 3 to have the
    // acknowledgement of hal's message keeps it from going twice.)
    until_acked(&n3).await;
    for c in [&mut gil, &mut hal] {
        c.expect_nothing_via(&room).await;
    }
    let before = light_version(&mut gil, &room).await;
    drop(node2); // SIGKILL
    for n in [&n1, &n3] {
        wait_for(n, "node 2 declared dead", |s| !knows_node(s, 2)).await;
    }
    assert_eq!(
        light_version(&mut gil, &room).await,
        before,
        "the stored room, unchanged"
    );
    gil.send(
        &msg(&room)
            .groupchat()
            .id("x2")
            .body("still one group")
            .to_string(),
    )
    .await;
    for c in [&mut gil, &mut hal] {
        let m = c.recv_until(|e| e.name() == "message").await;
        assert_eq!(muc::body(&m), "still one group", "{m}");
    }
    let live = n1.server.env.metrics.encode();
    assert!(
        live.contains("muc_light_rooms_live 1"),
        "the room is on node 1 now"
    );
    drop(gil);
    drop(hal);
    n1.stop().await;
    n3.stop().await;
    env.stop().await;
}

/// A node joins and wins a live room (rendezvous hashing moves the rooms
/// it wins): the old node hands it off — occupants get unavailable
/// presence with status 332 and enter again on the new node, where the
/// persistent room is loaded from storage.
#[tokio::test]
async fn a_joining_node_takes_over_the_rooms_it_wins() {
    let Some(env) = Env::start().await else {
        return;
    };
    let n1 = env.node(1).await;
    let room = room_owned_by(2, &[1, 2], "moving");
    let mut fay = n1.login("fay").await;
    muc::join(&mut fay, &room, "Fay").await;
    let c = muc::configure(
        &mut fay,
        &room,
        &[
            ("muc#roomconfig_persistentroom", "1"),
            ("muc#roomconfig_roomname", "Moving room"),
        ],
    )
    .await;
    assert_eq!(c.attr("type"), Some("result"), "{c}");
    fay.barrier_via(&room).await;
    let n2 = env.node(2).await;
    wait_for(&n1, "node 2", |s| knows_node(s, 2)).await;
    let own = format!("{room}/Fay");
    let gone = fay
        .recv_until(|e| e.name() == "presence" && e.attr("from") == Some(own.as_str()))
        .await;
    assert_eq!(gone.attr("type"), Some("unavailable"), "{gone}");
    let codes: Vec<&str> = gone
        .get_child("x", muc::MUC_USER)
        .map(|x| x.children().filter_map(|s| s.attr("code")).collect())
        .unwrap_or_default();
    assert!(codes.contains(&"332") && codes.contains(&"110"), "{gone}");
    muc::join(&mut fay, &room, "Fay").await;
    let info = fay
        .iq(
            &iq_get(
                &room,
                "di",
                "<query xmlns='http://jabber.org/protocol/disco#info'/>",
            ),
            "di",
        )
        .await;
    assert!(info.to_string().contains("Moving room"), "{info}");
    let m2 = n2.server.env.metrics.encode();
    assert!(
        m2.contains("muc_rooms_live 1"),
        "the room runs on node 2 now"
    );
    drop(fay);
    n2.stop().await;
    n1.stop().await;
    env.stop().await;
}

/// One admin API call (`tests/admin.rs` has the single-node cases).
async fn admin_api(
    node: &TestServer,
    token: &str,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let body = body.map(|b| b.to_string());
    let (status, _, text) = starling_testkit::http_request(
        node.admin_addr(),
        method,
        path,
        Some(token),
        body.as_deref(),
    )
    .await;
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
    )
}

/// Issue 14, rooms in the admin API on a cluster: the admin API of node 1
/// hands its changes for a room that runs on node 2 to node 2 (202 with
/// the node), where the room applies them as the server's own requests;
/// node 1 shows the room from storage.
#[tokio::test]
async fn admin_api_room_changes_reach_the_node_that_runs_the_room() {
    // Without nats-server or PostgreSQL: SKIPPED, unless
    // STARLING_REQUIRE_CLUSTER=1 (CI) makes it fail (module docs).
    let Some(env) = Env::start().await else {
        return;
    };
    let n1 = env.node(1).await;
    let n2 = env.node(2).await;
    for n in [&n1, &n2] {
        wait_for(n, "the other node", |s| s.len() == 2).await;
    }
    let token = starling_server::admin::tokens::create(
        n1.server.env.storage.admin_tokens.as_ref(),
        "ops",
        "admin",
    )
    .await
    .unwrap();
    n1.create_user("alice", "pw-alice").await;
    let room = room_owned_by(2, &[1, 2], "adm");
    let path = format!("/api/v1/rooms/{room}");
    let (status, v) = admin_api(
        &n1,
        &token,
        "POST",
        "/api/v1/rooms",
        Some(serde_json::json!({ "jid": room, "owner": "alice@localhost" })),
    )
    .await;
    assert_eq!((status, &v["node"]), (202, &serde_json::json!(2)), "{v}");
    // Created on node 2 (stored: node 1 reads it from the database,
    // once its affiliations are written too).
    let shown = poll_for(Duration::from_secs(5), async || {
        let (status, v) = admin_api(&n1, &token, "GET", &path, None).await;
        (status == 200 && v["affiliations"]["owner"][0].is_object()).then_some(v)
    })
    .await
    .unwrap_or_default();
    assert_eq!(
        (&shown["node"], &shown["loaded"]),
        (&serde_json::json!(2), &serde_json::json!(false)),
        "{shown}"
    );
    assert_eq!(shown["affiliations"]["owner"][0]["jid"], "alice@localhost");
    let (status, v) = admin_api(&n2, &token, "GET", &path, None).await;
    assert_eq!(
        (status, &v["loaded"]),
        (200, &serde_json::json!(true)),
        "{v}"
    );
    // Bob, on node 1, is in the room (on node 2).
    let mut bob = n1.login("bob").await;
    muc::join(&mut bob, &room, "bob").await;
    // Sessions of every node, from either node's registry; connection
    // details only from the node that runs the session.
    let listed = poll_for(Duration::from_secs(5), async || {
        let (_, v) = admin_api(&n2, &token, "GET", "/api/v1/sessions", None).await;
        v["sessions"]
            .as_array()
            .is_some_and(|s| !s.is_empty())
            .then_some(v)
    })
    .await
    .unwrap_or_default();
    let s = &listed["sessions"][0];
    assert_eq!(
        (&s["jid"], &s["node"]),
        (&serde_json::json!(bob.jid), &serde_json::json!(1)),
        "{listed}"
    );
    assert!(s.get("ip").is_none() && s.get("transport").is_none(), "{s}");
    let (_, v) = admin_api(&n2, &token, "GET", "/api/v1/sessions?node=local", None).await;
    assert_eq!(v["sessions"], serde_json::json!([]), "{v}");
    let (_, v) = admin_api(&n1, &token, "GET", "/api/v1/sessions?node=1", None).await;
    assert_eq!(v["sessions"][0]["transport"], "tls", "{v}");
    let (status, v) = admin_api(
        &n1,
        &token,
        "POST",
        &format!("{path}/messages"),
        Some(serde_json::json!({ "body": "from the operators" })),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    let m = bob.recv_until(|e| e.name() == "message").await;
    assert_eq!(
        (m.attr("from"), muc::body(&m).as_str()),
        (Some(room.as_str()), "from the operators")
    );
    let (status, v) = admin_api(
        &n1,
        &token,
        "PUT",
        &format!("{path}/affiliations/bob@localhost"),
        Some(serde_json::json!({ "affiliation": "outcast" })),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    let p = bob
        .recv_until(|e| e.name() == "presence" && e.attr("type") == Some("unavailable"))
        .await;
    assert!(p.to_string().contains("code='301'"), "{p}");
    let (status, v) = admin_api(&n1, &token, "DELETE", &path, None).await;
    assert_eq!(status, 202, "{v}");
    let gone = poll_for(Duration::from_secs(5), async || {
        (admin_api(&n1, &token, "GET", &path, None).await.0 == 404).then_some(())
    })
    .await;
    assert!(gone.is_some(), "destroyed on node 2");
    drop(bob);
    n2.stop().await;
    n1.stop().await;
    env.stop().await;
}

/// Issue 14 (docs/domains.md): a domain added on one node is served by
/// every node within seconds (each node polls the domains' change
/// counter in the shared database), a user of it logs in on the other
/// node with SNI, and disabling it on the first node closes that session
/// on the other with `host-gone` (RFC 6120 §4.9.3.5).
#[tokio::test]
async fn a_domain_added_or_disabled_on_one_node_is_seen_by_every_node() {
    // Without nats-server or PostgreSQL: SKIPPED, unless
    // STARLING_REQUIRE_CLUSTER=1 (CI) makes it fail (module docs).
    let Some(env) = Env::start().await else {
        return;
    };
    let n1 = env.node(1).await;
    let n2 = env.node(2).await;
    wait_for(&n1, "node 2", |s| knows_node(s, 2)).await;
    let domain = "dyn.example";
    let seen_by = |n: &TestServer, want: bool| {
        let hosts = n.server.env.clone();
        async move {
            let t = std::time::Instant::now();
            let seen = poll_for(Duration::from_secs(10), async || {
                (hosts.hosts.is_local(domain) == want).then_some(())
            })
            .await;
            assert!(
                seen.is_some(),
                "after 10 s, served = {} on the other node",
                !want
            );
            t.elapsed()
        }
    };
    assert!(!n2.server.env.hosts.is_local(domain));
    n1.server
        .domains
        .add(domain, true, Default::default())
        .await
        .unwrap();
    let took = seen_by(&n2, true).await;
    assert!(took < Duration::from_secs(5), "seen after {took:?}");
    let zoe = BareJid::new(&format!("zoe@{domain}")).unwrap();
    starling_server::accounts::create(&n2.server.env.storage, &zoe, "pw-zoe", 4096)
        .await
        .unwrap();
    let mut c = Client::connect(n2.starttls_addr()).await;
    c.domain = domain.to_owned();
    c.negotiate_tls().await;
    c.auth(Mechanism::ScramSha256, "zoe", "pw-zoe")
        .await
        .unwrap_or_else(|f| panic!("login on node 2 failed: {f}"));
    c.bind(None).await;
    n1.server.domains.disable(domain).await.unwrap();
    c.expect_stream_error("host-gone").await;
    seen_by(&n2, false).await;
    n2.stop().await;
    n1.stop().await;
    env.stop().await;
}
