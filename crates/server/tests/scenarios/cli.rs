//! The `starling` binary: configuration checking, account commands, and a
//! real process that shuts down gracefully on SIGTERM.

use starling_proto::sasl::Mechanism;
use starling_testkit::stanza::{empty, iq_get, msg, presence};
use starling_testkit::{
    eventually, eventually_blocking, free_port, poll_for, write_binary_config, Client,
};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_starling"))
}

/// A test's scratch directory, removed when the test ends (passed or
/// failed); derefs to its path.
struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir() -> TempDir {
    let d = std::env::temp_dir().join(format!("starling-cli-{}", starling_proto::random_id(10)));
    std::fs::create_dir_all(&d).unwrap();
    TempDir(d)
}

#[test]
fn check_config_reports_bad_key_with_line() {
    let dir = temp_dir();
    let cfg = dir.join("bad.toml");
    std::fs::write(
        &cfg,
        "[server]\ndomains = [\"example.org\"]\n\n[c2s]\nmax_stanza_size = 1\n",
    )
    .unwrap();
    let out = bin().args(["check-config"]).arg(&cfg).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("max_stanza_size"), "{err}");
    assert!(err.contains("line 5"), "{err}");

    let good = write_binary_config(&dir, 1, 2);
    let out = bin().arg("check-config").arg(&good).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK"));
}

#[test]
fn help_explains_zero_config_start() {
    let out = bin().arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("localhost") && text.contains("5222"),
        "{text}"
    );
    assert!(text.contains("user"), "{text}");
}

#[test]
fn user_add_list_passwd_del_import() {
    let dir = temp_dir();
    let cfg = write_binary_config(&dir, 1, 2);
    let run = |args: &[&str], stdin: &str| {
        let mut child = bin()
            .arg("--config")
            .arg(&cfg)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = run(&["user", "add", "alice@localhost"], "secret\n");
    assert!(ok, "{err}");
    assert!(out.contains("created alice@localhost"));
    let (ok, _, err) = run(&["user", "add", "alice@localhost"], "again\n");
    assert!(!ok);
    assert!(err.contains("already exists"), "{err}");
    let (ok, _, err) = run(&["user", "add", "not a jid"], "x\n");
    assert!(!ok && err.contains("not a valid JID"), "{err}");

    let import = dir.join("users.txt");
    std::fs::write(
        &import,
        "# load-test users\nu1:p1\nu2@localhost:p2\n\nalice:ignored\n",
    )
    .unwrap();
    let (ok, out, err) = run(&["user", "import", import.to_str().unwrap()], "");
    assert!(ok, "{err}");
    assert!(out.contains("created 2 account(s), skipped 1"), "{out}");
    assert!(err.contains("imported 3/3"), "progress shown: {err}");

    let (ok, out, _) = run(&["user", "list"], "");
    assert!(ok);
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["alice@localhost", "u1@localhost", "u2@localhost"]
    );
    let (ok, _, err) = run(&["user", "passwd", "alice@localhost"], "newpass\n");
    assert!(ok, "{err}");
    let (ok, out, _) = run(&["user", "del", "u1@localhost"], "");
    assert!(ok && out.contains("deleted"));
    let (ok, _, err) = run(&["user", "del", "u1@localhost"], "");
    assert!(!ok && err.contains("does not exist"), "{err}");
}

/// `starling archive purge|retention`: one user's archive (all, or before a
/// date) and the configured retention, on a database seeded directly.
#[tokio::test(flavor = "multi_thread")]
async fn archive_purge_and_retention_commands() {
    use starling_core::storage::{ArchiveId, ArchiveQuery, ArchiveRecord, FLAG_BODY};
    let dir = temp_dir();
    let cfg = write_binary_config(&dir, 1, 2);
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str("\n[modules.mam]\nretention_days = 30\n");
    std::fs::write(&cfg, text).unwrap();
    // Whichever backend the configuration names (SQLite, or PostgreSQL
    // when the suite runs with STARLING_TEST_BACKEND=postgres).
    let db_cfg = starling_server::Config::load(&cfg)
        .unwrap()
        .backend_config();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    let day = 86_400_000_000i64;
    let alice = starling_proto::BareJid::new("alice@localhost").unwrap();
    let bob = starling_proto::BareJid::new("bob@localhost").unwrap();
    let storage = starling_server::modules::open_storage(&db_cfg)
        .await
        .unwrap();
    let mut recs = Vec::new();
    for (n, (owner, age_days)) in [
        (&alice, 40),
        (&alice, 10),
        (&alice, 0),
        (&bob, 40),
        (&bob, 1),
    ]
    .into_iter()
    .enumerate()
    {
        recs.push(ArchiveRecord {
            owner: owner.clone(),
            id: ArchiveId::from_parts(now - age_days * day + n as i64, 0),
            with_bare: "carol@localhost".into(),
            remote: "carol@localhost/r".into(),
            outgoing: false,
            origin_id: None,
            flags: FLAG_BODY,
            stanza: "<message xmlns='jabber:client'><body>x</body></message>".into(),
        });
    }
    storage.archive.append(&recs).await.unwrap();
    storage.backend.close().await;
    let run = |args: &[&str]| {
        let out = bin().arg("--config").arg(&cfg).args(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = run(&["archive", "retention"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("localhost: deleted 2 message(s) older than 30 day(s)"),
        "{out}"
    );
    let before = starling_proto::datetime::xep0082_datetime(((now - 5 * day) / 1000) as u128);
    let (ok, out, err) = run(&["archive", "purge", "alice@localhost", "--before", &before]);
    assert!(ok, "{err}");
    assert!(
        out.contains("deleted 1 archived message(s) of alice@localhost"),
        "{out}"
    );
    let (ok, _, err) = run(&[
        "archive",
        "purge",
        "alice@localhost",
        "--before",
        "last week",
    ]);
    assert!(!ok && err.contains("XEP-0082"), "{err}");
    let (ok, out, err) = run(&["archive", "purge", "bob@localhost"]);
    assert!(ok && out.contains("deleted 1 archived"), "{out}{err}");
    let storage = starling_server::modules::open_storage(&db_cfg)
        .await
        .unwrap();
    let all = ArchiveQuery {
        limit: 10,
        ..Default::default()
    };
    assert_eq!(storage.archive.count(&alice, &all).await.unwrap(), 1);
    assert_eq!(storage.archive.count(&bob, &all).await.unwrap(), 0);
    storage.backend.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn binary_serves_clients_and_stops_gracefully_on_sigterm() {
    let dir = temp_dir();
    let (p1, p2) = (free_port(), free_port());
    let cfg = write_binary_config(&dir, p1, p2);
    let mut add = bin()
        .arg("--config")
        .arg(&cfg)
        .args(["user", "add", "alice@localhost"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    add.stdin.take().unwrap().write_all(b"secret\n").unwrap();
    assert!(add.wait().unwrap().success());

    let mut server = bin()
        .arg("--config")
        .arg(&cfg)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{p1}").parse().unwrap();
    until_accepting(addr).await;
    let mut c = Client::connect(addr).await;
    c.negotiate_tls().await;
    c.auth(Mechanism::ScramSha256, "alice", "secret")
        .await
        .unwrap();
    c.bind(None).await;
    // The certificate was generated on first start and persisted.
    assert!(dir.join("data/tls/cert.pem").exists());

    let pid = server.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    c.expect_stream_error("system-shutdown").await;
    let status = tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "clean exit after SIGTERM: {status:?}");
}

/// The auth cache (`[auth] cache_accounts`) keeps a logged-in account's
/// credentials in memory; a password changed or an account deleted by the
/// offline CLI while the server runs reaches it through the accounts
/// change log within one poll (2 s): the old password stops working, the
/// new one works, a deleted account cannot log in.
#[tokio::test(flavor = "multi_thread")]
async fn password_changed_by_the_cli_reaches_the_running_servers_auth_cache() {
    let dir = temp_dir();
    let (p1, p2) = (free_port(), free_port());
    let cfg = write_binary_config(&dir, p1, p2);
    add_user(&cfg, "alice", "secret");
    add_user(&cfg, "bob", "secret");
    let server = KillOnDrop::spawn(bin().arg("--config").arg(&cfg));
    eventually("the server answers a stream header", STARTUP, async || {
        answers_a_stream(p1).then_some(())
    })
    .await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{p1}").parse().unwrap();
    let login = |user: &'static str, password: &'static str| async move {
        let mut c = Client::connect(addr).await;
        c.negotiate_tls().await;
        c.auth(Mechanism::ScramSha256, user, password).await.is_ok()
    };
    // Logged in: both accounts' credentials are now cached.
    assert!(login("alice", "secret").await);
    assert!(login("bob", "secret").await);
    assert!(login("alice", "secret").await);

    let (ok, _, err) = run_cli(&cfg, &["user", "passwd", "alice@localhost"], "changed\n");
    assert!(ok, "{err}");
    let (ok, _, err) = run_cli(&cfg, &["user", "del", "bob@localhost"], "");
    assert!(ok, "{err}");
    eventually(
        "the old password and the deleted account stop working",
        Duration::from_secs(15),
        async || (!login("alice", "secret").await && !login("bob", "secret").await).then_some(()),
    )
    .await;
    assert!(login("alice", "changed").await);
    assert!(!login("alice", "secret").await);
    assert!(!login("bob", "secret").await);
    let (status, err) = server.stop();
    assert!(status.success(), "{err}");
}

/// Starts the binary with `cfg`, waits until `port` accepts on 127.0.0.1,
/// stops it with SIGTERM and returns its exit status and standard error
/// (a pipe, not a terminal).
fn run_until_ready_then_stop(
    cfg: &std::path::Path,
    port: u16,
) -> (std::process::ExitStatus, String) {
    let server = KillOnDrop::spawn(bin().arg("--config").arg(cfg));
    until_serving(port);
    server.stop()
}

/// How long the binary may take to start (a loaded 2-core machine).
const STARTUP: Duration = Duration::from_secs(60);

/// Waits (at most [`STARTUP`]) until the binary answers a stream header
/// on `port` of 127.0.0.1. Listeners are bound before storage opens (a
/// busy port is reported before anything is written), so an accepted
/// connection does not mean ready.
fn until_serving(port: u16) {
    eventually_blocking("the server answers a stream header", STARTUP, || {
        answers_a_stream(port).then_some(())
    });
}

/// Waits (at most [`STARTUP`]) until `addr` accepts TCP connections.
async fn until_accepting(addr: std::net::SocketAddr) {
    eventually("the server accepts connections", STARTUP, async || {
        tokio::net::TcpStream::connect(addr).await.ok().map(drop)
    })
    .await;
}

/// Whether the server on `port` answers a client stream header.
fn answers_a_stream(port: u16) -> bool {
    use std::io::Read;
    let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
    let header = "<?xml version='1.0'?><stream:stream to='localhost' xmlns='jabber:client' xmlns:stream='http://etherx.jabber.org/streams' version='1.0'>";
    let mut buf = [0u8; 64];
    c.write_all(header.as_bytes()).is_ok() && matches!(c.read(&mut buf), Ok(n) if n > 0)
}

/// Issue 9: logs written to a file or pipe carried ANSI colour codes, so
/// `grep 'condition='` found nothing; `[log] format = "json"` gives one
/// JSON object per line.
#[test]
fn logs_to_a_pipe_are_plain_text_or_json_lines() {
    let dir = temp_dir();
    let (p1, p2) = (free_port(), free_port());
    let cfg = write_binary_config(&dir, p1, p2);
    let (status, err) = run_until_ready_then_stop(&cfg, p1);
    assert!(status.success(), "{err}");
    assert!(err.contains("listening for clients"), "{err}");
    assert!(!err.contains("\x1b["), "no colour codes on a pipe: {err:?}");
    assert!(err.contains(&format!("address=127.0.0.1:{p1}")), "{err}");

    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str("\n[log]\nformat = \"json\"\n");
    std::fs::write(&cfg, text).unwrap();
    let (status, err) = run_until_ready_then_stop(&cfg, p1);
    assert!(status.success(), "{err}");
    let mut listening = 0;
    for line in err.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{line}"
        );
        if v["message"] == "listening for clients" {
            assert!(v["address"].is_string(), "fields at the top level: {line}");
            listening += 1;
        }
    }
    assert_eq!(listening, 2, "{err}");
}

/// A server process, killed if the test fails before stopping it. Its
/// standard error is read as it comes (a full pipe would stall a server
/// that logs a lot), into `said`.
struct KillOnDrop {
    child: Option<std::process::Child>,
    said: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    stderr: Option<std::thread::JoinHandle<()>>,
}

impl KillOnDrop {
    fn spawn(cmd: &mut Command) -> KillOnDrop {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut pipe = child.stderr.take().unwrap();
        let said = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let to = said.clone();
        let stderr = std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            loop {
                match std::io::Read::read(&mut pipe, &mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => to.lock().unwrap().extend_from_slice(&chunk[..n]),
                }
            }
        });
        KillOnDrop {
            child: Some(child),
            said,
            stderr: Some(stderr),
        }
    }

    /// What the server wrote to its standard error so far.
    fn said(&self) -> String {
        String::from_utf8_lossy(&self.said.lock().unwrap()).into_owned()
    }

    /// Waits (at most `within`) until a line of standard error satisfies
    /// `line`; panics saying `what` otherwise.
    async fn until_said(&self, what: &str, within: Duration, line: impl Fn(&str) -> bool) {
        let said = poll_for(within, async || {
            self.said().lines().any(&line).then_some(())
        })
        .await;
        assert!(
            said.is_some(),
            "the server did not log {what} within {within:?}:\n{}",
            self.said()
        );
    }

    /// SIGTERM, then the exit status and standard error.
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        let mut child = self.child.take().unwrap();
        let pid = child.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        let status = child.wait().unwrap();
        self.stderr.take().unwrap().join().unwrap();
        (status, self.said())
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Creates `user@localhost` with `password` through the CLI.
fn add_user(cfg: &std::path::Path, user: &str, password: &str) {
    let mut add = bin()
        .arg("--config")
        .arg(cfg)
        .args(["user", "add", &format!("{user}@localhost")])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    add.stdin
        .take()
        .unwrap()
        .write_all(format!("{password}\n").as_bytes())
        .unwrap();
    assert!(add.wait().unwrap().success());
}

/// Issue 9: a client flooding one that does not read logged one WARN line
/// per bounced stanza (19 MB of log in 35 s); the session dropped for not
/// reading was logged as a bare "session closed".
#[tokio::test(flavor = "multi_thread")]
async fn flood_to_a_client_that_stops_reading_logs_little_and_says_why() {
    let dir = temp_dir();
    let (p1, p2) = (free_port(), free_port());
    let cfg = write_binary_config(&dir, p1, p2);
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    // A mailbox big enough that Alice's socket buffers fill up first (so
    // her session blocks in a write and hits the timeout), small enough
    // that it then overflows within that timeout.
    text.push_str("\n[c2s]\nmailbox_size = 64\nwrite_timeout_secs = 2\nmax_bytes_per_second = 0\n");
    std::fs::write(&cfg, text).unwrap();
    add_user(&cfg, "alice", "secret");
    add_user(&cfg, "bob", "secret");
    let server = KillOnDrop::spawn(bin().arg("--config").arg(&cfg));
    let addr = format!("127.0.0.1:{p1}").parse().unwrap();
    until_accepting(addr).await;
    let login = |user: &'static str| async move {
        let mut c = Client::connect(addr).await;
        c.negotiate_tls().await;
        c.auth(Mechanism::ScramSha256, user, "secret")
            .await
            .unwrap();
        c.bind(Some("r")).await;
        c.send("<presence/>").await;
        c
    };
    // Alice never reads again after this.
    let alice = login("alice").await;
    let mut bob = login("bob").await;
    // (Bob's own available presence.)
    bob.barrier().await;
    let body = "x".repeat(4000);
    let mut bounced = 0;
    // Small batches: Bob's bounces never fill his own socket buffers.
    for batch in 0..200 {
        for i in 0..20 {
            bob.send(
                &msg("alice@localhost/r")
                    .id(&format!("m{batch}-{i}"))
                    .chat()
                    .body(&body)
                    .to_string(),
            )
            .await;
        }
        // Bob reads his bounces after each batch, so he is not the one
        // dropped: a bounce is routed to him while his session handles the
        // message, so all of the batch's are in before his barrier's answer.
        for el in bob.barrier().await {
            bounced += usize::from(el.attr("type") == Some("error"));
        }
    }
    assert!(bounced > 100, "the flood bounced: {bounced}");
    // Alice's session is dropped after the write timeout (2 s).
    let dropped = |l: &str| {
        l.contains("session closed")
            && l.contains("jid=alice@localhost/r")
            && l.contains("reason=write_timeout")
    };
    server
        .until_said("alice's session closed", Duration::from_secs(20), dropped)
        .await;
    let (_, err) = tokio::task::spawn_blocking(move || server.stop())
        .await
        .unwrap();
    drop(alice);
    let warnings = err
        .lines()
        .filter(|l| l.contains("recipient mailbox full"))
        .count();
    assert!(
        (1..=3).contains(&warnings),
        "{bounced} bounces, {warnings} warning lines:\n{err}"
    );
    assert!(err.lines().any(dropped), "{bounced} bounces:\n{err}");
}

/// Runs `starling --config cfg ARGS` with `stdin`; (success, stdout, stderr).
fn run_cli(cfg: &std::path::Path, args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = bin()
        .arg("--config")
        .arg(cfg)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Issue 9: `starling user list | head` panicked with "failed printing to
/// stdout: Broken pipe".
#[test]
fn user_list_into_a_closed_pipe_exits_quietly() {
    let dir = temp_dir();
    let cfg = write_binary_config(&dir, 1, 2);
    let import = dir.join("users.txt");
    let lines: String = (0..20_000).map(|i| format!("user{i}:pw\n")).collect();
    std::fs::write(&import, lines).unwrap();
    let (ok, _, err) = run_cli(
        &cfg,
        &[
            "user",
            "import",
            import.to_str().unwrap(),
            "--iterations",
            "1",
        ],
        "",
    );
    assert!(ok, "{err}");
    let mut child = bin()
        .arg("--config")
        .arg(&cfg)
        .args(["user", "list"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
    drop(stdout); // like `head` exiting
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_ne!(out.status.code(), Some(101), "{err}");
    assert!(out.status.success(), "{:?} {err}", out.status);
}

/// Issue 9: `user import` accepted `gina:` (an empty password), and `user
/// add`/`import` created accounts on domains the server does not serve.
#[test]
fn user_add_and_import_refuse_empty_passwords_and_unserved_domains() {
    let dir = temp_dir();
    let cfg = write_binary_config(&dir, 1, 2);
    let import = dir.join("users.txt");
    std::fs::write(&import, "# team\nfred:pw\ngina:\n").unwrap();
    let (ok, _, err) = run_cli(&cfg, &["user", "import", import.to_str().unwrap()], "");
    assert!(!ok, "{err}");
    assert!(
        err.contains("users.txt:3") && err.contains("empty password"),
        "{err}"
    );
    let (_, out, _) = run_cli(&cfg, &["user", "list"], "");
    assert_eq!(out, "", "nothing imported");

    let (ok, _, err) = run_cli(&cfg, &["user", "add", "hal@example.net"], "pw\n");
    assert!(!ok);
    assert!(
        err.contains("example.net")
            && err.contains("configured domains: localhost")
            && err.contains("--force"),
        "{err}"
    );
    let (ok, _, err) = run_cli(
        &cfg,
        &["user", "add", "hal@localhost", "--password", ""],
        "",
    );
    assert!(!ok && err.contains("empty password"), "{err}");

    std::fs::write(&import, "ivy:pw\njoe@example.net:pw\n").unwrap();
    let (ok, _, err) = run_cli(&cfg, &["user", "import", import.to_str().unwrap()], "");
    assert!(!ok);
    assert!(
        err.contains("users.txt:2") && err.contains("example.net") && err.contains("--force"),
        "{err}"
    );
    let (ok, _, err) = run_cli(
        &cfg,
        &["user", "import", import.to_str().unwrap(), "--force"],
        "",
    );
    assert!(ok, "{err}");
    let (ok, _, err) = run_cli(&cfg, &["user", "add", "hal@example.net", "--force"], "pw\n");
    assert!(ok, "{err}");
    let (_, out, _) = run_cli(&cfg, &["user", "list", "example.net"], "");
    assert_eq!(out, "hal@example.net\njoe@example.net\n");
}

/// Issue 9: `check-config` said OK for a garbage certificate that `run`
/// then rejected, and nothing about a certificate for other domains.
#[test]
fn check_config_loads_the_certificate_like_run() {
    let dir = temp_dir();
    let cfg = write_binary_config(&dir, 1, 2);
    let base = std::fs::read_to_string(&cfg).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, "garbage\n").unwrap();
    std::fs::write(&key, "garbage\n").unwrap();
    let with_tls = format!(
        "{base}\n[tls]\ncertificate = {:?}\nprivate_key = {:?}\n",
        cert.display().to_string(),
        key.display().to_string()
    );
    std::fs::write(&cfg, &with_tls).unwrap();
    let out = bin().arg("check-config").arg(&cfg).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("certificate") && err.contains("cert.pem"),
        "{err}"
    );

    // A valid pair for another domain: OK, with a warning naming the domain.
    let other = dir.join("other");
    starling_server::tls::TlsContext::load_or_generate(
        None,
        None,
        &other,
        &["other.example".to_owned()],
    )
    .unwrap();
    std::fs::copy(other.join("tls/cert.pem"), &cert).unwrap();
    std::fs::copy(other.join("tls/key.pem"), &key).unwrap();
    let out = bin()
        .arg("--config")
        .arg(&cfg)
        .arg("check-config")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK"));
    assert!(
        err.contains("warning")
            && err.contains("does not cover localhost")
            && err.contains("other.example"),
        "{err}"
    );
}

/// Issue 9: a port in use was found only after data_dir, the database and
/// the certificate had been created.
#[test]
fn run_with_port_in_use_fails_before_writing_data_dir() {
    let dir = temp_dir();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let cfg = write_binary_config(&dir, free_port(), port);
    let out = bin().arg("--config").arg(&cfg).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("cannot listen on 127.0.0.1:{port}")) && err.contains("[[listen]]"),
        "{err}"
    );
    // On PostgreSQL test runs the test kit creates the (empty) directory
    // for the database's label; nothing may be written into it.
    let data = dir.join("data");
    let written: Vec<_> = std::fs::read_dir(&data)
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(written.is_empty(), "nothing written: {written:?} {err}");
}

/// Issue 9: `[::]` accepts IPv4 and IPv6 clients (dual stack), as the
/// default listeners now do.
#[test]
fn listener_on_unspecified_ipv6_accepts_both_stacks() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("SKIPPED: this machine has no IPv6 loopback");
        return;
    }
    let dir = temp_dir();
    let (p1, p2) = (free_port(), free_port());
    let cfg = dir.join("starling.toml");
    let data = dir.join("data");
    std::fs::write(
        &cfg,
        format!("[server]\ndata_dir = {data:?}\n\n[[listen]]\naddress = \"[::]:{p1}\"\ntls = \"starttls\"\n\n[[listen]]\naddress = \"[::]:{p2}\"\ntls = \"direct\"\n\n[http]\nlisten = []\n\n[admin]\nlisten = []\n"),
    )
    .unwrap();
    let server = KillOnDrop::spawn(bin().arg("--config").arg(&cfg));
    until_serving(p1);
    for addr in [
        format!("[::1]:{p1}"),
        format!("[::1]:{p2}"),
        format!("127.0.0.1:{p2}"),
    ] {
        std::net::TcpStream::connect(&addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    }
    let (status, err) = server.stop();
    assert!(status.success(), "{err}");
}

/// Issue 9: `data/starling.db` (password keys) was created world-readable.
#[cfg(unix)]
#[test]
fn data_dir_and_database_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir();
    let (p1, p2) = (free_port(), free_port());
    let cfg = write_binary_config(&dir, p1, p2);
    if std::fs::read_to_string(&cfg).unwrap().contains("postgres") {
        eprintln!("SKIPPED: no SQLite file on PostgreSQL");
        return;
    }
    add_user(&cfg, "alice", "secret");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let data = dir.join("data");
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(&data.join("starling.db")), 0o600);
    let server = KillOnDrop::spawn(bin().arg("--config").arg(&cfg));
    until_serving(p1);
    // The WAL files appear with the first write after start-up, which
    // may come a moment after the first stream is answered on a loaded
    // machine: wait for them (bounded), then check every file.
    let files = [
        "starling.db",
        "starling.db-wal",
        "starling.db-shm",
        "tls/key.pem",
    ];
    eventually_blocking("the server opens its WAL", Duration::from_secs(30), || {
        (files.iter().filter(|f| data.join(f).exists()).count() >= 3).then_some(())
    });
    for f in files {
        let p = data.join(f);
        if p.exists() {
            assert_eq!(mode(&p), 0o600, "{f}");
        }
    }
    assert_eq!(mode(&data.join("tls")), 0o700);
    let (status, err) = server.stop();
    assert!(status.success(), "{err}");
}

/// Issue 9: small messages — a missing configuration file's reason was
/// printed twice; `check-config --help` showed both `-c` and `<FILE>`.
#[test]
fn missing_config_said_once_and_check_config_has_one_way() {
    let out = bin()
        .args(["--config", "/nonexistent/x.toml", "user", "list"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.matches("No such file").count(), 1, "{err}");

    let out = bin().args(["check-config", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let usage = help.lines().find(|l| l.starts_with("Usage:")).unwrap();
    assert!(!usage.contains("FILE"), "no positional file: {help}");
    assert!(
        help.contains("--config") && help.contains("certificate"),
        "{help}"
    );
    let out = bin().arg("check-config").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--config FILE check-config"),
        "{err}"
    );
}

/// `starling modules` lists every module with its state from the
/// configuration, what it implements, its storage and what it needs; a
/// configuration naming an unknown module is refused with the known ones.
#[test]
fn modules_lists_each_module_with_its_state() {
    let dir = temp_dir();
    let cfg = dir.join("starling.toml");
    std::fs::write(&cfg, "[modules.carbons]\nenabled = false\n").unwrap();
    let out = bin()
        .arg("--config")
        .arg(&cfg)
        .arg("modules")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let line = |name: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} line in:\n{text}"))
            .to_owned()
    };
    assert!(line("carbons").contains(" off "), "{text}");
    assert!(
        line("mam").contains(" on ") && line("mam").contains("XEP-0313"),
        "{text}"
    );
    assert!(line("inbox").contains("[needs: mam]"), "{text}");
    assert_eq!(
        text.lines().count(),
        starling_server::modules::MODULES.len(),
        "one line per module: {text}"
    );
    assert!(line("pep").contains(" on "), "{text}");
    assert!(line("extdisco").contains(" off "), "{text}");
    assert!(line("muc_light").contains(" off "), "{text}");
    assert!(line("proxy65").contains(" off "), "{text}");
    assert!(line("component").contains(" off "), "{text}");
    assert!(line("upload").contains(" off "), "{text}");
    assert!(line("pubsub").contains(" off "), "{text}");
    std::fs::write(&cfg, "[modules.carbon]\nenabled = false\n").unwrap();
    let out = bin()
        .arg("--config")
        .arg(&cfg)
        .arg("modules")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown module `carbon`") && err.contains("carbons"),
        "{err}"
    );
}

/// The values of field `var` in the first data form inside `el`.
fn form_values(el: &starling_testkit::starling_xml::Element, var: &str) -> Vec<String> {
    fn find<'a>(
        el: &'a starling_testkit::starling_xml::Element,
        var: &str,
    ) -> Option<&'a starling_testkit::starling_xml::Element> {
        if el.name() == "field" && el.attr("var") == Some(var) {
            return Some(el);
        }
        el.children().find_map(|c| find(c, var))
    }
    find(el, var)
        .map(|f| {
            f.children()
                .filter(|v| v.name() == "value")
                .map(|v| v.text())
                .collect()
        })
        .unwrap_or_default()
}

/// Issue 12: `starling room list|create|destroy` work on the database
/// like `user …`; a server started on the same data directory serves the
/// created room (persistent, unlocked, its owner configures it), and a
/// destroyed room is gone with its affiliations and archive.
#[tokio::test(flavor = "multi_thread")]
async fn room_create_list_serve_and_destroy() {
    use starling_testkit::{ns, TestServer};
    const MUC: &str = "http://jabber.org/protocol/muc";
    const MUC_OWNER: &str = "http://jabber.org/protocol/muc#owner";
    const MUC_USER: &str = "http://jabber.org/protocol/muc#user";
    let dir = temp_dir();
    let cfg = write_binary_config(&dir, 1, 2);
    let lobby = "lobby@conference.localhost";

    // Refused: not a JID, no room name, a resource, a service this server
    // does not run, an owner that is not a bare JID.
    for (args, says) in [
        (
            vec!["not a room", "--owner", "alice@localhost"],
            "not a valid JID",
        ),
        (
            vec!["conference.localhost", "--owner", "alice@localhost"],
            "no room name",
        ),
        (
            vec![
                "lobby@conference.localhost/Nick",
                "--owner",
                "alice@localhost",
            ],
            "has a resource",
        ),
        (
            vec!["lobby@chat.localhost", "--owner", "alice@localhost"],
            "not a group-chat service",
        ),
        (vec![lobby, "--owner", "alice@localhost/phone"], "bare JID"),
        (vec![lobby, "--owner", "localhost"], "no user part"),
    ] {
        let mut a = vec!["room", "create"];
        a.extend(args);
        let (ok, _, err) = run_cli(&cfg, &a, "");
        assert!(!ok && err.contains(says), "{a:?}: {err}");
    }
    let (ok, _, err) = run_cli(
        &cfg,
        &[
            "room",
            "create",
            "lobby@chat.localhost",
            "--owner",
            "alice@localhost",
        ],
        "",
    );
    assert!(
        !ok && err.contains("conference.localhost"),
        "names the configured service: {err}"
    );

    let (ok, out, err) = run_cli(
        &cfg,
        &[
            "room",
            "create",
            lobby,
            "--owner",
            "alice@localhost",
            "--name",
            "The Lobby",
            "--members-only",
        ],
        "",
    );
    assert!(ok, "{err}");
    assert_eq!(out, format!("created {lobby} (owner alice@localhost)\n"));
    assert!(
        err.contains("user add alice@localhost"),
        "no account yet: {err}"
    );
    let (ok, _, err) = run_cli(
        &cfg,
        &["room", "create", lobby, "--owner", "bob@localhost"],
        "",
    );
    assert!(
        !ok && err.contains("already exists") && err.contains("room destroy"),
        "{err}"
    );
    let (ok, _, err) = run_cli(
        &cfg,
        &[
            "room",
            "create",
            "quiet@conference.localhost",
            "--owner",
            "bob@localhost",
            "--hidden",
            "--password",
            "pw",
        ],
        "",
    );
    assert!(ok, "{err}");

    let (ok, out, err) = run_cli(&cfg, &["room", "list"], "");
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].starts_with(
            "lobby@conference.localhost  public  members-only  owners alice@localhost  created 20"
        ) && lines[0].ends_with("name \"The Lobby\""),
        "{out}"
    );
    assert!(
        lines[1].starts_with(
            "quiet@conference.localhost  hidden  open, password  owners bob@localhost"
        ),
        "{out}"
    );
    let (ok, out, err) = run_cli(
        &cfg,
        &[
            "room",
            "list",
            "--service",
            "conference.localhost",
            "--json",
        ],
        "",
    );
    assert!(ok, "{err}");
    let rooms: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rooms = rooms.as_array().unwrap();
    assert_eq!(rooms.len(), 2, "{out}");
    assert_eq!(rooms[0]["jid"], lobby);
    assert_eq!(rooms[0]["name"], "The Lobby");
    assert_eq!(rooms[0]["public"], true);
    assert_eq!(rooms[0]["members_only"], true);
    assert_eq!(rooms[0]["owners"], serde_json::json!(["alice@localhost"]));
    assert!(rooms[0]["created_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(rooms[1]["public"], false);
    assert_eq!(rooms[1]["password_protected"], true);
    let (ok, out, err) = run_cli(
        &cfg,
        &[
            "room",
            "list",
            "--service",
            "conference.example.org",
            "--json",
        ],
        "",
    );
    assert!(ok && err.contains("not a group-chat service"), "{err}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap(),
        serde_json::json!([])
    );

    // A server on the same data directory serves the room.
    let data = dir.join("data");
    let server = TestServer::start_with(|c| c.server.data_dir = data).await;
    let mut alice = server.login("alice").await;
    let features = alice.disco_features(lobby).await;
    assert!(
        features.iter().any(|f| f == "muc_persistent")
            && features.iter().any(|f| f == "muc_membersonly")
            && features.iter().any(|f| f == "muc_public"),
        "{features:?}"
    );
    let form = alice
        .iq(&iq_get(lobby, "cf", &empty("query", MUC_OWNER)), "cf")
        .await;
    assert_eq!(
        form.attr("type"),
        Some("result"),
        "the owner gets the form: {form}"
    );
    assert_eq!(form_values(&form, "muc#roomconfig_roomname"), ["The Lobby"]);
    assert_eq!(form_values(&form, "muc#roomconfig_persistentroom"), ["1"]);
    assert_eq!(form_values(&form, "muc#roomconfig_membersonly"), ["1"]);
    assert_eq!(
        form_values(&form, "muc#roomconfig_roomowners"),
        ["alice@localhost"]
    );
    assert_eq!(
        form_values(&form, "muc#roomconfig_maxusers"),
        ["200"],
        "the service default"
    );
    // Unlocked: the owner enters an existing room (no 201) and talks.
    alice
        .send(
            &presence()
                .to(&format!("{lobby}/Alice"))
                .child(&empty("x", MUC))
                .to_string(),
        )
        .await;
    let own = alice
        .recv_until(|e| {
            e.name() == "presence" && e.attr("from") == Some("lobby@conference.localhost/Alice")
        })
        .await;
    assert_ne!(own.attr("type"), Some("error"), "{own}");
    let x = own.get_child("x", MUC_USER).unwrap();
    assert_eq!(
        x.get_child("item", MUC_USER).unwrap().attr("affiliation"),
        Some("owner")
    );
    assert!(
        !x.children()
            .any(|s| s.name() == "status" && s.attr("code") == Some("201")),
        "not a new room: {own}"
    );
    alice
        .recv_until(|e| e.name() == "message" && e.has_child("subject", ns::CLIENT))
        .await;
    alice
        .send(&msg(lobby).groupchat().id("m1").body("hello").to_string())
        .await;
    alice
        .recv_until(|e| e.name() == "message" && e.attr("id") == Some("m1"))
        .await;
    // The hidden room is not in the service's room list.
    let items = alice
        .iq(
            &iq_get(
                "conference.localhost",
                "rl",
                &empty("query", ns::DISCO_ITEMS),
            ),
            "rl",
        )
        .await;
    let listed: Vec<String> = items
        .get_child("query", ns::DISCO_ITEMS)
        .unwrap()
        .children()
        .filter_map(|i| i.attr("jid").map(str::to_owned))
        .collect();
    assert_eq!(listed, [lobby], "{items}");
    alice
        .send(
            &presence()
                .to(&format!("{lobby}/Alice"))
                .ty("unavailable")
                .to_string(),
        )
        .await;
    // The room has handled the leave (and sent alice her unavailable
    // presence) once it answers her ping.
    alice.barrier_via(lobby).await;
    let backend = server.backend_config();
    server.server.shutdown().await; // keeps the data directory

    // Destroyed with its affiliations and archive; piped standard input
    // (not a terminal) needs no --yes, like `user del` and `archive purge`.
    let (ok, out, err) = run_cli(&cfg, &["room", "destroy", lobby, "--yes"], "");
    assert!(ok, "{err}");
    assert_eq!(
        out,
        format!("destroyed {lobby}: 1 affiliation(s) and 1 archived message(s) deleted\n")
    );
    let (ok, out, err) = run_cli(&cfg, &["room", "destroy", "quiet@conference.localhost"], "");
    assert!(
        ok && out.starts_with("destroyed quiet@conference.localhost"),
        "{err}"
    );
    let (ok, _, err) = run_cli(&cfg, &["room", "destroy", lobby, "--yes"], "");
    assert!(!ok && err.contains("no stored room"), "{err}");
    let (ok, _, err) = run_cli(&cfg, &["room", "destroy", "not a room", "--yes"], "");
    assert!(!ok && err.contains("not a valid JID"), "{err}");
    let (ok, out, err) = run_cli(&cfg, &["room", "list"], "");
    assert!(ok && out.is_empty(), "{out}{err}");
    let (ok, out, _) = run_cli(&cfg, &["room", "list", "--json"], "");
    assert!(ok);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap(),
        serde_json::json!([])
    );
    let storage = starling_server::modules::open_storage(&backend)
        .await
        .unwrap();
    let room = starling_proto::BareJid::new(lobby).unwrap();
    let alice_jid = starling_proto::BareJid::new("alice@localhost").unwrap();
    let muc = starling_server::modules::muc::store::open(&storage);
    assert!(muc.affiliations(&room).await.unwrap().is_empty());
    assert!(muc.rooms_of(&alice_jid).await.unwrap().is_empty());
    let all = starling_core::storage::ArchiveQuery {
        limit: 10,
        ..Default::default()
    };
    assert_eq!(storage.archive.count(&room, &all).await.unwrap(), 0);
    storage.backend.close().await;
}

/// Issue 12: `room list` reads rooms a page at a time and lists every one
/// across pages, in order, as text or as one JSON array; `room --help`
/// says the commands act on storage and what a running server does.
#[tokio::test(flavor = "multi_thread")]
async fn room_list_pages_through_many_rooms() {
    use starling_server::modules::muc::store::StoredRoom;
    use starling_server::modules::muc::{stored_config_for_cli, CliRoom, MucConfig};
    let dir = temp_dir();
    let cfg = write_binary_config(&dir, 1, 2);
    let db_cfg = starling_server::Config::load(&cfg)
        .unwrap()
        .backend_config();
    let storage = starling_server::modules::open_storage(&db_cfg)
        .await
        .unwrap();
    let muc = starling_server::modules::muc::store::open(&storage);
    let n = 1_201;
    for i in 0..n {
        let config = stored_config_for_cli(&MucConfig::default(), &CliRoom::default()).unwrap();
        muc.put_room(&StoredRoom {
            jid: starling_proto::BareJid::new(&format!("r{i:05}@conference.localhost")).unwrap(),
            config,
            subject: String::new(),
            created_at: 1_700_000_000_000,
        })
        .await
        .unwrap();
    }
    storage.backend.close().await;
    let (ok, out, err) = run_cli(&cfg, &["room", "list"], "");
    assert!(ok, "{err}");
    let jids: Vec<&str> = out
        .lines()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    let expected: Vec<String> = (0..n)
        .map(|i| format!("r{i:05}@conference.localhost"))
        .collect();
    assert_eq!(jids, expected);
    assert!(
        out.lines()
            .next()
            .unwrap()
            .ends_with("owners -  created 2023-11-14T22:13:20.000Z"),
        "{out}"
    );
    let (ok, out, err) = run_cli(&cfg, &["room", "list", "--json"], "");
    assert!(ok, "{err}");
    let rooms: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(rooms.as_array().unwrap().len(), n);
    assert_eq!(
        rooms[n - 1]["jid"],
        format!("r{:05}@conference.localhost", n - 1)
    );

    let out = bin().args(["room", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("act on storage directly") && help.contains("until it is next loaded"),
        "{help}"
    );
}
