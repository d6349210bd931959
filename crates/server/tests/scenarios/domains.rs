//! Domains added, disabled, enabled and removed at run time
//! (docs/domains.md), over real sockets: SNI certificates, logins,
//! `host-gone`/`host-unknown`, removal of the data, per-domain settings,
//! refused names, and the CLI seen by a running server.

use starling_core::storage::{DomainSettings, DomainState};
use starling_proto::sasl::Mechanism;
use starling_proto::BareJid;
use starling_server::domains::{apply_setting, validate_name, DomainError};
use starling_server::tls::CertificateFacts;
use starling_testkit::stanza::msg;
use starling_testkit::stanza::{empty, iq_get, iq_set};
use starling_testkit::{eventually, ns, poll_for, Client, TestServer};
use std::time::Duration;

const DYN: &str = "dyn.example";

async fn create(server: &TestServer, jid: &str) {
    let jid = BareJid::new(jid).unwrap();
    starling_server::accounts::create(&server.server.env.storage, &jid, "secret", 4096)
        .await
        .expect("create account");
}

/// Connects over STARTTLS to `domain` (stream `to` and SNI).
async fn connect_to(server: &TestServer, domain: &str) -> Client {
    let mut c = Client::connect(server.starttls_addr()).await;
    c.domain = domain.to_owned();
    c.negotiate_tls().await;
    c
}

/// Logs `user@domain` in (SCRAM-SHA-256-PLUS, tls-exporter), binds,
/// sends initial presence and reads its echo.
async fn login_to(server: &TestServer, user: &str, domain: &str) -> Client {
    let mut c = connect_to(server, domain).await;
    c.auth(Mechanism::ScramSha256Plus, user, "secret")
        .await
        .unwrap_or_else(|f| panic!("login of {user}@{domain} failed: {f}"));
    c.bind(None).await;
    c.send("<presence/>").await;
    c.recv().await;
    c
}

/// Polls `f` until it is true (at most 10 s).
async fn until(what: &str, mut f: impl FnMut() -> bool) {
    eventually(what, Duration::from_secs(10), async || f().then_some(())).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn domain_added_at_run_time_serves_its_users_with_its_own_certificate() {
    let server = TestServer::start().await;
    let domains = server.server.domains.clone();
    domains
        .add(DYN, true, DomainSettings::default())
        .await
        .expect("add");
    assert!(server.server.env.hosts.is_local(DYN));
    create(&server, &format!("alice@{DYN}")).await;
    create(&server, "bob@localhost").await;

    let mut alice = login_to(&server, "alice", DYN).await;
    assert!(
        alice.jid.starts_with(&format!("alice@{DYN}/")),
        "{}",
        alice.jid
    );
    // SNI: the domain's own self-signed certificate, not the default one.
    let der = alice.peer_certificate().expect("TLS");
    let facts = CertificateFacts::from_der(&der).unwrap();
    assert_eq!(facts.common_name.as_deref(), Some(DYN));
    assert!(facts.covers(DYN) && facts.covers(&format!("conference.{DYN}")));
    assert!(!facts.covers("localhost"), "{facts:?}");
    let key = server.dir.join("tls/domains").join(DYN).join("key.pem");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", key.display());
    }
    // SCRAM-PLUS with tls-server-end-point: the hash of the certificate
    // this connection got by SNI (RFC 5929).
    let mut plus = connect_to(&server, DYN).await;
    let ty = starling_proto::sasl::ChannelBindingType::TlsServerEndPoint;
    let data = plus.channel_binding(ty);
    plus.auth_with_binding(
        Mechanism::ScramSha256Plus,
        "alice",
        "secret",
        Some((ty, data)),
    )
    .await
    .expect("tls-server-end-point of the domain's certificate");
    drop(plus);
    // The default domain still gets the default certificate.
    let bob_conn = connect_to(&server, "localhost").await;
    let facts = CertificateFacts::from_der(&bob_conn.peer_certificate().unwrap()).unwrap();
    assert!(facts.covers("localhost") && !facts.covers(DYN));
    drop(bob_conn);

    // Chat across domains.
    let mut bob = login_to(&server, "bob", "localhost").await;
    alice
        .send(
            &msg(&bob.jid)
                .chat()
                .id("m1")
                .body(&format!("hello from {DYN}"))
                .to_string(),
        )
        .await;
    let m = bob.recv_message().await;
    assert_eq!(
        m.get_child("body", ns::CLIENT).map(|b| b.text()).as_deref(),
        Some("hello from dyn.example")
    );
    assert!(m.attr("from").unwrap().starts_with("alice@dyn.example/"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn domain_disabled_closes_sessions_with_host_gone_and_refuses_new_streams() {
    let server = TestServer::start().await;
    let domains = server.server.domains.clone();
    domains
        .add(DYN, true, DomainSettings::default())
        .await
        .unwrap();
    create(&server, &format!("alice@{DYN}")).await;
    let mut alice = login_to(&server, "alice", DYN).await;

    domains.disable(DYN).await.unwrap();
    // RFC 6120 §4.9.3.5: the domain is no longer serviced.
    alice.expect_stream_error("host-gone").await;
    assert!(!server.server.env.hosts.is_local(DYN));
    // §4.9.3.6: a new stream to it.
    let mut c = Client::connect(server.starttls_addr()).await;
    c.domain = DYN.to_owned();
    c.send(&format!(
        "<?xml version='1.0'?><stream:stream to='{DYN}' version='1.0' \
         xmlns='jabber:client' xmlns:stream='http://etherx.jabber.org/streams'>"
    ))
    .await;
    c.expect_stream_error("host-unknown").await;

    // Enabled again: the account (kept) logs in.
    domains.enable(DYN).await.unwrap();
    let alice = login_to(&server, "alice", DYN).await;
    assert!(alice.jid.starts_with("alice@dyn.example/"));
    // Disabling an unknown domain says so.
    assert!(matches!(
        domains.disable("nope.example").await,
        Err(DomainError::NotFound(_))
    ));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn domain_removed_deletes_accounts_roster_and_archive_in_the_background() {
    let server = TestServer::start().await;
    let env = server.server.env.clone();
    let domains = server.server.domains.clone();
    domains
        .add(DYN, true, DomainSettings::default())
        .await
        .unwrap();
    create(&server, &format!("alice@{DYN}")).await;
    create(&server, &format!("carol@{DYN}")).await;
    create(&server, "bob@localhost").await;
    let mut alice = login_to(&server, "alice", DYN).await;
    // A roster item and an archived message.
    alice
        .iq(
            "<iq type='set' id='r1'><query xmlns='jabber:iq:roster'><item jid='bob@localhost'/></query></iq>",
            "r1",
        )
        .await;
    alice
        .send("<message to='bob@localhost' type='chat'><body>archived</body></message>")
        .await;
    let alice_jid = BareJid::new("alice@dyn.example").unwrap();
    let archived = || async {
        env.storage
            .archive
            .query(
                &alice_jid,
                &starling_core::storage::ArchiveQuery {
                    limit: 10,
                    ..Default::default()
                },
            )
            .await
            .map(|p| p.messages.len())
            .unwrap_or(0)
    };
    let n = poll_for(Duration::from_secs(5), async || {
        Some(archived().await).filter(|n| *n > 0)
    })
    .await;
    assert!(n.is_some(), "the message is archived");
    assert_eq!(
        env.storage
            .roster
            .get_roster(&alice_jid)
            .await
            .unwrap()
            .1
            .len(),
        1
    );

    domains.remove(DYN).await.unwrap();
    alice.expect_stream_error("host-gone").await;
    // The background removal deletes everything, then the row.
    let removed = poll_for(Duration::from_secs(10), async || {
        env.storage
            .domains
            .domain(DYN)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(removed.is_some(), "the domain's row is removed");
    assert_eq!(env.storage.accounts.count(DYN).await.unwrap(), 0);
    assert!(env
        .storage
        .roster
        .get_roster(&alice_jid)
        .await
        .unwrap()
        .1
        .is_empty());
    assert_eq!(archived().await, 0);
    assert!(!server.dir.join("tls/domains").join(DYN).exists());
    // Other domains keep their accounts.
    assert_eq!(env.storage.accounts.count("localhost").await.unwrap(), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn domain_registration_setting_overrides_the_module_configuration() {
    // Registration is on in the tests' configuration.
    let server = TestServer::start().await;
    let domains = server.server.domains.clone();
    let closed = DomainSettings {
        registration: Some(false),
        ..Default::default()
    };
    domains.add(DYN, true, closed).await.unwrap();
    let c = connect_to(&server, DYN).await;
    let f = c.features.clone().unwrap();
    assert!(!f.has_child("register", ns::REGISTER_FEATURE), "{f}");
    let c = connect_to(&server, "localhost").await;
    assert!(c
        .features
        .clone()
        .unwrap()
        .has_child("register", ns::REGISTER_FEATURE));
    // As with registration off for the whole server: a stanza before
    // authentication ends the stream (RFC 6120 §4.9.3.12).
    let mut c = connect_to(&server, DYN).await;
    c.send(
        "<iq type='set' id='reg'><query xmlns='jabber:iq:register'><username>eve</username><password>pw</password></query></iq>",
    )
    .await;
    c.expect_stream_error("not-authorized").await;
    let eve = BareJid::new("eve@dyn.example").unwrap();
    assert!(!server
        .server
        .env
        .storage
        .accounts
        .exists(&eve)
        .await
        .unwrap());

    // Turned on: registration works for this domain.
    let mut s = DomainSettings::default();
    apply_setting(&mut s, "registration=on").unwrap();
    domains.set_settings(DYN, s).await.unwrap();
    let mut c = connect_to(&server, DYN).await;
    assert!(c
        .features
        .clone()
        .unwrap()
        .has_child("register", ns::REGISTER_FEATURE));
    let reply = c
        .iq(
            "<iq type='set' id='reg'><query xmlns='jabber:iq:register'><username>eve</username><password>pw-eve-1</password></query></iq>",
            "reg",
        )
        .await;
    assert_eq!(reply.attr("type"), Some("result"), "{reply}");
    assert!(server
        .server
        .env
        .storage
        .accounts
        .exists(&eve)
        .await
        .unwrap());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn domain_max_sessions_refuses_a_bind_beyond_it_with_resource_constraint() {
    let server = TestServer::start().await;
    let domains = server.server.domains.clone();
    let s = DomainSettings {
        max_sessions: Some(1),
        ..Default::default()
    };
    domains.add(DYN, true, s).await.unwrap();
    create(&server, &format!("alice@{DYN}")).await;
    let first = login_to(&server, "alice", DYN).await;
    let mut second = connect_to(&server, DYN).await;
    second
        .auth(Mechanism::ScramSha256, "alice", "secret")
        .await
        .unwrap();
    second
        .send("<iq type='set' id='b'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'/></iq>")
        .await;
    let reply = second.recv().await;
    assert_eq!(reply.attr("type"), Some("error"), "{reply}");
    assert_eq!(
        starling_testkit::error_condition(&reply).as_deref(),
        Some("resource-constraint"),
        "{reply}"
    );
    // The first session leaves: a new one fits.
    first.close().await;
    let host = server.server.env.hosts.get(DYN).unwrap();
    until("the session is uncounted", || host.sessions() == 0).await;
    second.bind(None).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn domain_operations_refuse_configured_domains_and_bad_names() {
    let server = TestServer::start().await;
    let domains = server.server.domains.clone();
    for op in [
        domains.remove("localhost").await,
        domains.disable("localhost").await,
        domains
            .add("localhost", true, DomainSettings::default())
            .await
            .map(|_| ()),
    ] {
        let e = op.expect_err("a configured domain");
        assert!(matches!(e, DomainError::Configured(_)), "{e}");
        assert!(e.to_string().contains("configuration file"), "{e}");
    }
    for bad in [
        "../x",
        "a/b.example",
        "x'); DROP TABLE domains; --",
        "",
        "a..b",
        ".lead.example",
        "user@example.org",
        "-x.example",
        "a b.example",
    ] {
        let e = domains
            .add(bad, true, DomainSettings::default())
            .await
            .expect_err(bad);
        assert!(matches!(e, DomainError::InvalidName(..)), "{bad:?}: {e}");
        assert!(e.to_string().contains("not a valid domain name"), "{e}");
    }
    assert_eq!(
        validate_name("Chat.Example.NET").unwrap(),
        "chat.example.net"
    );
    assert!(!server.dir.join("tls/domains/x").exists());
    let mut s = DomainSettings::default();
    assert!(apply_setting(&mut s, "colour=blue").is_err());
    assert!(apply_setting(&mut s, "max_sessions=lots").is_err());
    // A second add of one name.
    domains
        .add(DYN, false, DomainSettings::default())
        .await
        .unwrap();
    assert!(matches!(
        domains.add(DYN, true, DomainSettings::default()).await,
        Err(DomainError::Exists(_))
    ));
    // Added disabled: not served.
    assert!(!server.server.env.hosts.is_local(DYN));
    let listed = domains.list().await.unwrap();
    assert_eq!(listed[0].name, "localhost");
    assert_eq!(listed[1].state, DomainState::Disabled);
    server.stop().await;
}

/// The CLI's way: a change written to the database by another process
/// (here: another handle on the same storage, as `starling domain add`
/// opens) is seen by the running server through the version poll.
#[tokio::test(flavor = "multi_thread")]
async fn domain_written_to_the_database_elsewhere_is_served_within_seconds() {
    let server = TestServer::start().await;
    let storage = starling_server::modules::open_storage(&server.backend_config())
        .await
        .unwrap();
    let offline = starling_server::domains::Domains::new(
        storage.clone(),
        vec!["localhost".into()],
        server.dir.clone(),
        None,
    );
    offline
        .add(DYN, true, DomainSettings::default())
        .await
        .unwrap();
    let env = server.server.env.clone();
    until("the server serves the new domain", || {
        env.hosts.is_local(DYN)
    })
    .await;
    create(&server, &format!("alice@{DYN}")).await;
    let mut alice = login_to(&server, "alice", DYN).await;
    offline.disable(DYN).await.unwrap();
    alice.expect_stream_error("host-gone").await;
    assert!(!env.hosts.is_local(DYN));
    storage.backend.close().await;
    server.stop().await;
}

fn cli(cfg: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_starling"))
        .arg("--config")
        .arg(cfg)
        .args(args)
        .output()
        .expect("run starling");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `starling domain …` offline: add with settings, list, set, disable,
/// refusals with their reasons, and remove with a progress line per
/// 1000 accounts and the final count.
#[tokio::test(flavor = "multi_thread")]
async fn domain_cli_adds_lists_sets_and_removes_with_progress() {
    let dir =
        std::env::temp_dir().join(format!("starling-domcli-{}", starling_proto::random_id(10)));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = starling_testkit::write_binary_config(&dir, 0, 0);
    let (ok, out, err) = cli(
        &cfg,
        &[
            "domain",
            "add",
            "cli.example",
            "--registration",
            "off",
            "--max-sessions",
            "5",
        ],
    );
    assert!(ok, "{out}{err}");
    assert!(out.contains("added cli.example (enabled)"), "{out}");
    assert!(dir.join("data/tls/domains/cli.example/cert.pem").exists());
    let (ok, out, _) = cli(
        &cfg,
        &[
            "domain",
            "set",
            "cli.example",
            "archive_retention_days=30",
            "registration=default",
        ],
    );
    assert!(ok);
    assert!(
        out.contains("max_sessions=5 ") || out.contains("archive_retention_days=30"),
        "{out}"
    );
    let (_, out, _) = cli(&cfg, &["domain", "list"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "localhost  enabled  config", "{out}");
    assert_eq!(
        lines[1], "cli.example  enabled  stored  archive_retention_days=30 max_sessions=5",
        "{out}"
    );
    let (_, out, _) = cli(&cfg, &["domain", "list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[1]["settings"]["max_sessions"], 5);
    // A stored domain is served: `user import` takes its accounts without
    // --force, as `user add` does; an unserved one still stops the import.
    let list = dir.join("users.txt");
    std::fs::write(
        &list,
        "ann@cli.example:pw-ann-1\nbob@cli.example:pw-bob-1\n",
    )
    .unwrap();
    let (ok, out, err) = cli(&cfg, &["user", "import", list.to_str().unwrap()]);
    assert!(ok && out.contains("created 2 account(s)"), "{out}{err}");
    std::fs::write(&list, "cid@elsewhere.example:pw-cid-1\n").unwrap();
    let (ok, _, err) = cli(&cfg, &["user", "import", list.to_str().unwrap()]);
    assert!(
        !ok && err.contains("elsewhere.example is not served"),
        "{err}"
    );
    for (args, why) in [
        (vec!["domain", "remove", "localhost"], "configuration file"),
        (vec!["domain", "add", "../x"], "not a valid domain name"),
        (vec!["domain", "add", "cli.example"], "already exists"),
        (
            vec!["domain", "set", "cli.example", "colour=blue"],
            "unknown setting",
        ),
        (
            vec!["domain", "disable", "nope.example"],
            "no domain nope.example",
        ),
    ] {
        let (ok, out, err) = cli(&cfg, &args);
        assert!(!ok, "{args:?}: {out}");
        assert!(err.contains(why), "{args:?}: {err}");
    }
    // Accounts of the domain (bulk, without credentials; with ann and bob
    // imported above, 1,502), then remove.
    let (ok, _, err) = cli(&cfg, &["domain", "disable", "cli.example"]);
    assert!(ok, "{err}");
    // The accounts go into the database the binary uses (SQLite in its
    // data directory, or the test PostgreSQL database of that directory).
    let backend = starling_server::Config::load(&cfg)
        .unwrap()
        .backend_config();
    let s = starling_server::modules::open_storage(&backend)
        .await
        .unwrap();
    let accounts: Vec<_> = (0..1500)
        .map(|i| (BareJid::new(&format!("u{i}@cli.example")).unwrap(), vec![]))
        .collect();
    s.accounts.create_many(&accounts).await.unwrap();
    s.backend.close().await;
    let (ok, out, err) = cli(&cfg, &["domain", "remove", "cli.example"]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("cli.example: 1000 accounts deleted so far"),
        "{out}"
    );
    assert!(
        out.contains("removed cli.example: 1502 account(s)"),
        "{out}"
    );
    let (_, out, _) = cli(&cfg, &["domain", "list"]);
    assert!(!out.contains("cli.example"), "{out}");
    assert!(!dir.join("data/tls/domains/cli.example").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The server's disco#items answer for `to`, as text.
async fn disco_items(c: &mut Client, to: &str) -> String {
    c.iq(
        &iq_get(
            to,
            "items",
            "<query xmlns='http://jabber.org/protocol/disco#items'/>",
        ),
        "items",
    )
    .await
    .to_string()
}

/// The error condition of an iq reply (None for a result).
fn condition(reply: &starling_testkit::starling_xml::Element) -> Option<String> {
    starling_testkit::error_condition(reply)
}

#[tokio::test(flavor = "multi_thread")]
async fn domain_disabled_modules_are_off_for_that_domain_only_and_back_at_once() {
    // docs/domains.md "Modules per domain". MAM, inbox and MUC run for the
    // server (defaults); the added domain switches them off.
    const MAM: &str = "urn:xmpp:mam:2";
    const INBOX: &str = "urn:xmpp:inbox:1";
    let server = TestServer::start().await;
    let domains = server.server.domains.clone();
    let mut off = DomainSettings::default();
    apply_setting(&mut off, "disabled_modules=muc, mam,inbox").unwrap();
    assert_eq!(
        off.disabled_modules.as_deref(),
        Some(&["inbox".to_owned(), "mam".to_owned(), "muc".to_owned()][..])
    );
    domains.add(DYN, true, off).await.unwrap();
    create(&server, &format!("alice@{DYN}")).await;
    create(&server, "carol@localhost").await;
    let mut alice = login_to(&server, "alice", DYN).await;
    let mut carol = login_to(&server, "carol", "localhost").await;

    // Advertised for one domain, not for the other (XEP-0030 §3.1, §4.3).
    let on_dyn = alice.disco_features(DYN).await;
    assert!(!on_dyn.iter().any(|f| f == MAM || f == INBOX), "{on_dyn:?}");
    assert!(on_dyn.iter().any(|f| f == ns::DISCO_INFO), "{on_dyn:?}");
    let own = alice.disco_features(&format!("alice@{DYN}")).await;
    assert!(!own.iter().any(|f| f == MAM), "{own:?}");
    let on_local = carol.disco_features("localhost").await;
    assert!(on_local.iter().any(|f| f == MAM), "{on_local:?}");
    let dyn_items = disco_items(&mut alice, DYN).await;
    assert!(
        !dyn_items.contains(&format!("conference.{DYN}")),
        "{dyn_items}"
    );
    let local_items = disco_items(&mut carol, "localhost").await;
    assert!(
        local_items.contains("conference.localhost"),
        "{local_items}"
    );

    // Requests to a switched-off module: service-unavailable (RFC 6120
    // §8.3.3.19), for the account and for the server.
    let q = iq_set("", "mq", &empty("query", MAM));
    let r = alice.iq(&q, "mq").await;
    assert_eq!(condition(&r).as_deref(), Some("service-unavailable"), "{r}");
    let r = alice
        .iq(&iq_get("", "ib", &empty("inbox", INBOX)), "ib")
        .await;
    assert_eq!(condition(&r).as_deref(), Some("service-unavailable"), "{r}");
    // The domain's group-chat service does not exist: asked as any
    // unknown domain is (no server-to-server: remote-server-not-found).
    let r = alice
        .iq(
            &iq_get(
                &format!("conference.{DYN}"),
                "ci",
                "<query xmlns='http://jabber.org/protocol/disco#info'/>",
            ),
            "ci",
        )
        .await;
    assert_eq!(
        condition(&r).as_deref(),
        Some("remote-server-not-found"),
        "{r}"
    );
    let f = carol.disco_features("conference.localhost").await;
    assert!(
        f.iter().any(|f| f == "http://jabber.org/protocol/muc"),
        "{f:?}"
    );

    // A message across: archived for carol (MAM on at localhost), not
    // for alice.
    alice
        .send("<message to='carol@localhost' type='chat' id='m1'><body>across</body></message>")
        .await;
    let m = carol.recv_message().await;
    assert_eq!(m.get_child("body", ns::CLIENT).unwrap().text(), "across");
    assert_eq!(carol.archived_bodies().await, ["across"]);
    let env = &server.server.env;
    env.hooks.durable(env).await;
    let alice_bare = BareJid::new(&format!("alice@{DYN}")).unwrap();
    let kept = env
        .storage
        .archive
        .query(&alice_bare, &Default::default())
        .await
        .unwrap();
    assert!(kept.messages.is_empty(), "alice's archive: {kept:?}");

    // Switched back on: the open session sees it at once.
    let mut on = DomainSettings::default();
    apply_setting(&mut on, "disabled_modules=none").unwrap();
    domains.set_settings(DYN, on).await.unwrap();
    let on_dyn = alice.disco_features(DYN).await;
    assert!(on_dyn.iter().any(|f| f == MAM), "{on_dyn:?}");
    alice
        .send("<message to='carol@localhost' type='chat' id='m2'><body>kept</body></message>")
        .await;
    carol.recv_message().await;
    assert_eq!(alice.archived_bodies().await, ["kept"]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn domain_disabled_modules_refuse_core_unknown_and_needed_modules() {
    let server = TestServer::start().await;
    let mut s = DomainSettings::default();
    for (bad, says) in [
        ("disabled_modules=roster", "cannot be switched off"),
        ("disabled_modules=presence,mam", "cannot be switched off"),
        ("disabled_modules=nope", "no module is called"),
    ] {
        match apply_setting(&mut s, bad) {
            Err(DomainError::BadSetting(m)) => assert!(m.contains(says), "{bad}: {m}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    // The inbox lists what the archive stores: switching mam off alone is
    // refused, with both named.
    apply_setting(&mut s, "disabled_modules=mam").unwrap();
    match server.server.domains.add(DYN, true, s).await {
        Err(DomainError::BadSetting(m)) => {
            assert!(m.contains("inbox needs mam"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    assert!(!server.server.env.hosts.is_local(DYN));
    server.stop().await;
}
