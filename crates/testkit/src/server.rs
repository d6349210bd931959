//! The server under test: [`TestServer`] (an in-process Starling on
//! ephemeral loopback ports), its configuration and, on PostgreSQL, its
//! database; configuration files for tests of the real binary.

use crate::{Client, DOMAIN};
use starling_proto::sasl::Mechanism;
use starling_server::config::{Config, HttpListener, Listener, TlsMode};
use starling_server::modules;
use starling_server::RunningServer;
use std::net::SocketAddr;
use std::path::PathBuf;

/// How a test client connects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// STARTTLS on the c2s listener.
    Tcp,
    /// RFC 7395 WebSocket on an HTTP listener (`wss:` if `tls`).
    WebSocket {
        /// Over TLS.
        tls: bool,
    },
}

/// A Starling running in this process on loopback with ephemeral ports and
/// a fresh data directory.
pub struct TestServer {
    /// The running server.
    pub server: RunningServer,
    /// Its data directory (removed on [`TestServer::stop`]).
    pub dir: PathBuf,
    /// Its PostgreSQL database, when tests run on PostgreSQL (dropped on
    /// [`TestServer::stop`]).
    pub database: Option<TestDatabase>,
}

/// A configuration for tests: loopback, ephemeral ports, temp data dir,
/// in-band registration on, quick limits.
pub fn test_config() -> Config {
    let mut cfg = Config::default();
    cfg.server.data_dir =
        std::env::temp_dir().join(format!("starling-test-{}", starling_proto::random_id(12)));
    cfg.listen = vec![
        Listener {
            address: "127.0.0.1:0".parse().unwrap(),
            tls: TlsMode::Starttls,
        },
        Listener {
            address: "127.0.0.1:0".parse().unwrap(),
            tls: TlsMode::Direct,
        },
    ];
    cfg.http.listen = vec![
        HttpListener {
            address: "127.0.0.1:0".parse().unwrap(),
            tls: false,
        },
        HttpListener {
            address: "127.0.0.1:0".parse().unwrap(),
            tls: true,
        },
    ];
    cfg.admin.listen = vec!["127.0.0.1:0".parse().unwrap()];
    cfg.modules.get_mut::<modules::Register>().enabled = true;
    cfg.modules.get_mut::<modules::Register>().max_per_ip = 1000;
    cfg.server.shutdown_timeout_secs = 5;
    cfg
}

impl TestServer {
    /// Starts a server with [`test_config`].
    pub async fn start() -> TestServer {
        Self::start_with(|_| {}).await
    }

    /// Starts a server with [`test_config`] changed by `f`.
    pub async fn start_with(f: impl FnOnce(&mut Config)) -> TestServer {
        Self::start_with_hooks(f, |_| {}).await
    }

    /// Starts a server with [`test_config`] changed by `f` and extra
    /// handlers or services registered by `extra`.
    pub async fn start_with_hooks(
        f: impl FnOnce(&mut Config),
        extra: impl FnOnce(&mut starling_core::hooks::HookRegistry),
    ) -> TestServer {
        let mut cfg = test_config();
        f(&mut cfg);
        let dir = cfg.server.data_dir.clone();
        let database = match (test_pg_admin_url(), cfg.storage.backend.as_str()) {
            (Some(admin), "sqlite") => {
                let db = TestDatabase::for_data_dir(&admin, &dir).await;
                cfg.storage.backend = "postgres".into();
                cfg.storage.url = Some(db.url.clone());
                Some(db)
            }
            _ => None,
        };
        let server = starling_server::start_with(cfg, extra)
            .await
            .expect("server starts");
        TestServer {
            server,
            dir,
            database,
        }
    }

    /// The STARTTLS listener.
    pub fn starttls_addr(&self) -> SocketAddr {
        self.server
            .addr(TlsMode::Starttls)
            .expect("starttls listener")
    }

    /// The direct TLS listener.
    pub fn direct_addr(&self) -> SocketAddr {
        self.server
            .addr(TlsMode::Direct)
            .expect("direct TLS listener")
    }

    /// The HTTP listener (WebSocket) with or without TLS.
    pub fn http_addr(&self, tls: bool) -> SocketAddr {
        self.server
            .http_addrs
            .iter()
            .find(|(_, t)| *t == tls)
            .map(|(a, _)| *a)
            .expect("HTTP listener")
    }

    /// The admin listener (API, metrics, health).
    pub fn admin_addr(&self) -> SocketAddr {
        *self.server.admin_addrs.first().expect("admin listener")
    }

    /// Creates an account `user@localhost` with password `password`.
    pub async fn create_user(&self, user: &str, password: &str) {
        let jid = starling_proto::BareJid::new(&format!("{user}@{DOMAIN}")).unwrap();
        starling_server::accounts::create(&self.server.env.storage, &jid, password, 4096)
            .await
            .expect("create account");
    }

    /// Creates `user` (password "pw-" + user), logs in over STARTTLS with
    /// SCRAM-SHA-256, binds a resource, sends initial presence and consumes
    /// its echo. Other resources of the same user receive that presence.
    pub async fn login(&self, user: &str) -> Client {
        self.login_over(user, Transport::Tcp).await
    }

    /// Like [`TestServer::login`], over `transport`.
    pub async fn login_over(&self, user: &str, transport: Transport) -> Client {
        let password = format!("pw-{user}");
        if !self
            .server
            .env
            .storage
            .accounts
            .exists(&starling_proto::BareJid::new(&format!("{user}@{DOMAIN}")).unwrap())
            .await
            .unwrap()
        {
            self.create_user(user, &password).await;
        }
        let mut c = match transport {
            Transport::Tcp => {
                let mut c = Client::connect(self.starttls_addr()).await;
                c.negotiate_tls().await;
                c
            }
            Transport::WebSocket { tls } => {
                Client::connect_websocket(self.http_addr(tls), tls).await
            }
        };
        c.auth(Mechanism::ScramSha256, user, &password)
            .await
            .expect("login succeeds");
        c.bind(None).await;
        c.send("<presence/>").await;
        // RFC 6121 §4.2.2: the server echoes initial presence to its sender.
        let echo = c.recv().await;
        assert!(
            echo.name() == "presence" && echo.attr("from") == Some(c.jid.as_str()),
            "expected presence echo, got {echo}"
        );
        c
    }

    /// Where this server keeps its data, for opening the same storage again
    /// after it stopped (whichever backend the tests run on).
    pub fn backend_config(&self) -> starling_storage::BackendConfig {
        match &self.database {
            Some(db) => starling_storage::BackendConfig::Postgres {
                url: db.url.clone(),
                pool_size: 1,
            },
            None => starling_storage::BackendConfig::Sqlite {
                path: self.dir.join("starling.db"),
                pool_size: 1,
            },
        }
    }

    /// Graceful shutdown, then removes the data directory (and the
    /// PostgreSQL database).
    pub async fn stop(self) {
        self.server.shutdown().await;
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(db) = self.database {
            db.drop_database().await;
        }
    }
}

/// The PostgreSQL administrator URL when tests run on PostgreSQL:
/// `STARLING_TEST_BACKEND=postgres` with `STARLING_TEST_PG_URL` set
/// (`scripts/pg-test.sh start` prints one). `None` for SQLite (unset or
/// `sqlite`).
pub fn test_pg_admin_url() -> Option<String> {
    match std::env::var("STARLING_TEST_BACKEND").as_deref() {
        Err(_) | Ok("") | Ok("sqlite") => None,
        Ok("postgres") => match std::env::var("STARLING_TEST_PG_URL") {
            Ok(url) if !url.trim().is_empty() => Some(url),
            _ => panic!(
                "STARLING_TEST_BACKEND=postgres needs STARLING_TEST_PG_URL (scripts/pg-test.sh start)"
            ),
        },
        Ok(other) => panic!("STARLING_TEST_BACKEND={other:?}: use sqlite or postgres"),
    }
}

/// A PostgreSQL database of one test server, named after its data
/// directory, so that a server restarted on the same directory finds its
/// data again. It is labelled with that directory: databases whose
/// directory is gone (a test that stopped without [`TestServer::stop`], a
/// killed binary) are dropped by the next test run.
pub struct TestDatabase {
    admin_url: String,
    name: String,
    /// The database's URL.
    pub url: String,
}

const TEST_DB_PREFIX: &str = "starling_test_dir_";

impl TestDatabase {
    /// Creates (or finds) the database for `data_dir`; creates `data_dir`.
    pub async fn for_data_dir(admin_url: &str, data_dir: &std::path::Path) -> TestDatabase {
        use starling_storage::postgres::admin;
        // The directory exists before its database: the sweep below never
        // takes a database being set up for a directory not yet created.
        std::fs::create_dir_all(data_dir).expect("create the test data directory");
        let label = data_dir.display().to_string();
        // FNV-1a: a stable name for the same directory in every process.
        let hash = label.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let name = format!("{TEST_DB_PREFIX}{hash:016x}");
        static SWEPT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !SWEPT.swap(true, std::sync::atomic::Ordering::SeqCst) {
            sweep_orphaned_databases(admin_url, &name).await;
        }
        let url = admin::create_database(admin_url, &name)
            .await
            .unwrap_or_else(|e| panic!("creating test database {name}: {e}"));
        admin::set_label(&url, &label)
            .await
            .unwrap_or_else(|e| panic!("labelling test database {name}: {e}"));
        TestDatabase {
            admin_url: admin_url.to_owned(),
            name,
            url,
        }
    }

    /// Drops the database (a failure is reported, not fatal).
    pub async fn drop_database(self) {
        if let Err(e) =
            starling_storage::postgres::admin::drop_database(&self.admin_url, &self.name).await
        {
            eprintln!("warning: test database {} not dropped: {e}", self.name);
        }
    }
}

/// Drops test databases whose labelled data directory no longer exists.
async fn sweep_orphaned_databases(admin_url: &str, keep: &str) {
    use starling_storage::postgres::admin;
    let Ok(names) = admin::databases_with_prefix(admin_url, TEST_DB_PREFIX).await else {
        return;
    };
    for name in names.into_iter().filter(|n| n != keep) {
        let Ok(url) = admin::with_database(admin_url, &name) else {
            continue;
        };
        if let Ok(Some(dir)) = admin::label(&url).await {
            if !std::path::Path::new(&dir).exists() {
                let _ = admin::drop_database(admin_url, &name).await;
            }
        }
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago (for tests that
/// start the real binary with a configuration file).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral loopback port")
        .port()
}

/// Writes `dir/starling.toml` for the real binary: data under `dir/data`,
/// STARTTLS and direct-TLS listeners on the given loopback ports. When tests
/// run on PostgreSQL ([`test_pg_admin_url`]), storage is a database of its
/// own named after `dir/data` (dropped by a later run once `dir` is gone).
pub fn write_binary_config(dir: &std::path::Path, starttls_port: u16, tls_port: u16) -> PathBuf {
    write_binary_config_with_admin(dir, starttls_port, tls_port, 0)
}

/// Like [`write_binary_config`], with the admin listener on
/// `127.0.0.1:admin_port` (0: an ephemeral port).
pub fn write_binary_config_with_admin(
    dir: &std::path::Path,
    starttls_port: u16,
    tls_port: u16,
    admin_port: u16,
) -> PathBuf {
    let cfg = dir.join("starling.toml");
    let data = dir.join("data");
    let mut text = format!(
        "[server]\ndata_dir = {data:?}\n\n[[listen]]\naddress = \"127.0.0.1:{starttls_port}\"\ntls = \"starttls\"\n\n[[listen]]\naddress = \"127.0.0.1:{tls_port}\"\ntls = \"direct\"\n\n[[http.listen]]\naddress = \"127.0.0.1:0\"\n\n[admin]\nlisten = [\"127.0.0.1:{admin_port}\"]\n",
    );
    if let Some(admin) = test_pg_admin_url() {
        // Callers may be inside a runtime or not: set up on a thread of its own.
        let url = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(TestDatabase::for_data_dir(&admin, &data))
                .url
        })
        .join()
        .expect("create the test database");
        text.push_str(&format!(
            "\n[storage]\nbackend = \"postgres\"\nurl = {url:?}\n"
        ));
    }
    std::fs::write(&cfg, text).expect("write the test configuration");
    cfg
}
