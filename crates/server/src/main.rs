//! The `starling` command: run the server, check a configuration, manage
//! accounts, archives, group-chat rooms and uploaded files.

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use starling_core::storage::Storage;
use starling_proto::{BareJid, Jid};
use starling_server::config::LogFormat;
use starling_server::modules::muc::{
    stored_config_for_cli, stored_config_summary, CliRoom, StoredConfigSummary,
};
use starling_server::modules::Muc;
use starling_server::{accounts, Config};
use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Writes a line to standard output without panicking when it is closed:
/// `starling user list | head` must stop quietly, not die with "failed
/// printing to stdout". The error ([`StdoutError`]) ends the command; `main`
/// treats a broken pipe as a clean exit.
///
/// Why not restore the default SIGPIPE disposition instead: that needs
/// `unsafe` (the workspace forbids it), and in the same process a server's
/// socket writes must get EPIPE, not a fatal signal.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*).map_err(StdoutError)
    }};
}

/// Writes a line to standard error; a closed stderr is ignored (there is
/// nowhere left to report it).
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// Standard output could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write to standard output: {0}")]
struct StdoutError(std::io::Error);

/// Starling: an XMPP instant-messaging server.
///
/// With no arguments it serves the domain `localhost` with zero
/// configuration: data in ./data (SQLite), a self-signed certificate
/// generated on first start, clients on port 5222 (STARTTLS) and 5223
/// (direct TLS). Create an account with `starling user add alice@localhost`
/// and log in with any XMPP client.
#[derive(Parser)]
#[command(name = "starling", version, about, long_about)]
struct Cli {
    /// Configuration file (TOML). Every key is optional; see
    /// docs/configuration.md. Without it, built-in defaults are used.
    #[arg(short, long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (the default). Stops gracefully on SIGINT/SIGTERM.
    Run,
    /// Validate the configuration file given with --config as `run` would
    /// load it: every key (the first problem is reported with its key and
    /// line), and the TLS certificate and key, with a warning when the
    /// certificate does not cover a configured domain or is about to
    /// expire. Example: starling --config /etc/starling.toml check-config
    CheckConfig {
        /// The file, when not given with --config (older form).
        #[arg(hide = true)]
        file: Option<PathBuf>,
    },
    /// List the modules this build has, whether the configuration enables
    /// each, what it implements, the storage it uses and the modules it
    /// needs. Each one's settings are its [modules.<name>] table, documented
    /// in docs/configuration.md.
    Modules,
    /// Manage accounts offline, on the database (works while the server
    /// runs). `starling ctl users …` does the same through a running
    /// server's admin API, which also closes a deleted account's sessions.
    #[command(subcommand)]
    User(UserCommand),
    /// Manage domains added at run time (stored in the database, beside
    /// the configured [server] domains; docs/domains.md). Works with or
    /// without a running server, which sees each change within 2 s.
    #[command(subcommand)]
    Domain(starling_server::domains::DomainCommand),
    /// Manage a running server through its admin API ([admin] listen;
    /// docs/admin.md): accounts, sessions, messages, statistics.
    /// Exit codes: 0 ok, 1 the server answered with an error, 2 usage,
    /// 3 cannot connect. Example: STARLING_ADMIN_TOKEN=… starling ctl
    /// users list
    Ctl(starling_server::admin::ctl::CtlArgs),
    /// Admin API tokens (stored hashed in the database; works while the
    /// server runs).
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Manage message archives (XEP-0313; works while the server runs).
    #[command(subcommand)]
    Archive(ArchiveCommand),
    /// Inspect a cluster ([cluster] in the configuration; docs/cluster.md).
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Manage stored group-chat rooms (XEP-0045, [modules.muc]; docs/muc.md).
    ///
    /// These commands act on storage directly, like `user`, with or without
    /// a running server. A running server does not notice them for a room
    /// it has loaded (one with occupants, or emptied less than [modules.muc]
    /// idle_unload_secs ago): that room keeps its in-memory state until it
    /// is next loaded. A room made by `create` is served from its first
    /// stanza on. A room destroyed here while loaded keeps running with its
    /// occupants, who are not told, and what changes in it later
    /// (configuration, subject, affiliations, messages) is written to
    /// storage again: destroy a room that has occupants through XMPP as its
    /// owner (XEP-0045 §10.9, which also tells the occupants), and use
    /// `room destroy` for rooms nobody is in, or with the server stopped.
    /// Temporary rooms live only in the running server and are not stored.
    #[command(subcommand)]
    Room(RoomCommand),
    /// Manage uploaded files (XEP-0363, [modules.upload]; docs/upload.md).
    #[command(subcommand)]
    Upload(UploadCommand),
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Admin API tokens.
    #[command(subcommand)]
    Token(TokenCommand),
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Create a token and print it, once: only its SHA-256 is stored.
    /// Example: starling admin token create --name deploy
    Create {
        /// Its name (who uses it): shown in the log line of every change
        /// made with it.
        #[arg(long)]
        name: String,
        /// What it may do: admin (everything) or read (GET requests and
        /// the web page without its forms: monitoring, dashboards).
        #[arg(long, default_value = "admin", value_parser = ["admin", "read"])]
        scope: String,
    },
    /// List the tokens: name, scope, created, last used (never the tokens).
    List,
    /// Revoke a token; requests using it are refused at once.
    Revoke {
        /// Its name.
        name: String,
    },
}

#[derive(Subcommand)]
enum UploadCommand {
    /// Remove uploaded files older than --older-than-days (default: the
    /// configured expire_after_days) and upload slots never used, from
    /// [modules.upload] dir. Works while the server runs (the server also
    /// does it hourly; it counts quotas again at its next sweep).
    /// Example: starling --config /etc/starling.toml upload purge --dry-run
    Purge {
        /// Remove files uploaded at least this many days ago (0: all).
        #[arg(long, value_name = "N")]
        older_than_days: Option<u64>,
        /// Count what would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Subcommand)]
enum RoomCommand {
    /// List the stored (persistent) rooms of a service.
    ///
    /// One line per room, by JID: public (listed in service discovery) or
    /// hidden, open or members-only (and password-protected), its owners,
    /// when it was created and its name. Rooms are read from storage a page
    /// at a time. Temporary rooms exist only in a running server and are
    /// not listed. Example: starling room list --service
    /// conference.example.org --json
    List {
        /// The service, e.g. conference.localhost (default: [modules.muc]
        /// subdomain under each configured [server] domain).
        #[arg(long, value_name = "DOMAIN")]
        service: Option<String>,
        /// A JSON array with one object per room (for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Create a persistent room with one owner.
    ///
    /// The room is unlocked (anyone allowed can enter at once) and has the
    /// service's new-room defaults from [modules.muc] (occupant limit,
    /// history, logging, moderation…) except what the options set; its
    /// owner changes the rest with the configuration form. An existing
    /// stored room is refused. Example: starling room create
    /// lobby@conference.localhost --owner alice@localhost --name Lobby
    Create {
        /// The room, name@service (a service this server runs, e.g.
        /// lobby@conference.localhost).
        jid: String,
        /// Its owner's bare JID, e.g. alice@localhost.
        #[arg(long, value_name = "BARE_JID")]
        owner: String,
        /// Its natural-language name (muc#roomconfig_roomname).
        #[arg(long, value_name = "N")]
        name: Option<String>,
        /// Only members may enter (owners and admins add them).
        #[arg(long)]
        members_only: bool,
        /// Not listed in the service's room list (disco#items).
        #[arg(long)]
        hidden: bool,
        /// Entering needs this password (visible in process lists; it is
        /// a shared secret of the room, sent in invitations).
        #[arg(long, value_name = "P")]
        password: Option<String>,
    },
    /// Delete a stored room, its affiliations and its archive.
    ///
    /// Deletes the room's configuration, its affiliations (owners, admins,
    /// members, bans, registered nicknames) and its message archive. Asks
    /// for confirmation when standard input is a terminal, unless --yes.
    /// Occupants are not told, and a running server that has the room
    /// loaded keeps it: destroy a room that has occupants through XMPP as
    /// its owner (see `starling room --help`).
    Destroy {
        /// The room, e.g. lobby@conference.localhost.
        jid: String,
        /// Do not ask for confirmation.
        #[arg(short, long)]
        yes: bool,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// List the nodes of the cluster, their sessions and their last
    /// heartbeat, as heard on the NATS bus of [cluster] nats_url (it listens
    /// for three heartbeat intervals; sends nothing). Exit code 0 when at
    /// least one node answered, 1 otherwise.
    /// Example: starling --config /etc/starling.toml cluster status
    Status {
        /// One JSON object per node, in an array (for scripts).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ArchiveCommand {
    /// Delete one user's archived messages: all of them, or those older than
    /// --before.
    Purge {
        /// The account, e.g. alice@localhost.
        jid: String,
        /// Keep messages from this instant on (XEP-0082, e.g.
        /// 2026-01-31T00:00:00Z).
        #[arg(long, value_name = "DATETIME")]
        before: Option<String>,
    },
    /// Apply the configured retention ([modules.mam] retention_days and
    /// domain_retention_days) now, for every domain (the server also does
    /// it hourly).
    Retention,
}

#[derive(Subcommand)]
enum UserCommand {
    /// Create an account. Without --password the password is read from
    /// standard input, or generated and printed when stdin is a terminal.
    Add {
        /// The account, e.g. alice@localhost.
        jid: String,
        /// The password (visible in process lists: prefer stdin).
        #[arg(long)]
        password: Option<String>,
        /// Create the account even if its domain is not one of the
        /// configured [server] domains (it cannot log in until it is).
        #[arg(long)]
        force: bool,
    },
    /// Delete an account and its data.
    Del {
        /// The account.
        jid: String,
    },
    /// Change an account's password (same password sources as `add`).
    Passwd {
        /// The account.
        jid: String,
        /// The new password.
        #[arg(long)]
        password: Option<String>,
    },
    /// List the accounts of a domain (default: the first configured domain).
    List {
        /// The domain.
        domain: Option<String>,
    },
    /// Create many accounts from a file with one `user@domain:password` per
    /// line (or `user:password` with --domain). Existing accounts are
    /// skipped; blank lines and lines starting with # are ignored. A line
    /// with an empty password, or on a domain the server does not serve
    /// (without --force), stops the import before anything is created.
    Import {
        /// The file ("-" for standard input).
        file: PathBuf,
        /// Domain for lines without one.
        #[arg(long)]
        domain: Option<String>,
        /// PBKDF2 iterations for the stored keys (default from the
        /// configuration, 4096). Lower values speed up load-test set-ups
        /// and weaken stored keys against offline attack.
        #[arg(long)]
        iterations: Option<u32>,
        /// Accept accounts on domains that are not configured [server]
        /// domains.
        #[arg(long)]
        force: bool,
    },
}

fn main() -> std::process::ExitCode {
    let mut cli = Cli::parse();
    if matches!(cli.command, Some(Command::Ctl(_))) {
        let Some(Command::Ctl(args)) = cli.command.take() else {
            unreachable!("matched above")
        };
        // The client needs no configuration file and no logging.
        let code = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt.block_on(starling_server::admin::ctl::run(args)),
            Err(e) => {
                note!("starling ctl: cannot start the async runtime: {e}");
                starling_server::admin::ctl::EXIT_USAGE
            }
        };
        return std::process::ExitCode::from(code);
    }
    match real_main(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            if let Some(StdoutError(io)) = e.downcast_ref::<StdoutError>() {
                if io.kind() == std::io::ErrorKind::BrokenPipe {
                    // The reader has all it wanted (`| head`): not an error.
                    return std::process::ExitCode::SUCCESS;
                }
            }
            note!("starling: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn load_config(path: Option<&Path>) -> anyhow::Result<Config> {
    match path {
        Some(p) => Ok(Config::load(p)?),
        None => Ok(Config::default()),
    }
}

/// Logs go to standard error: `[log] format = "text"` (coloured only on a
/// terminal, so a log file stays greppable) or `"json"` (one object per
/// line, event fields at the top level).
fn init_logging(cfg: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cfg.log.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cfg.log.format {
        LogFormat::Text => {
            // https://no-color.org: a non-empty NO_COLOR turns colours off.
            let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
            builder
                .with_ansi(std::io::stderr().is_terminal() && !no_color)
                .init()
        }
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    if let Some(Command::CheckConfig { file }) = &cli.command {
        let file = match (file, &cli.config) {
            (Some(f), Some(c)) if f != c => bail!(
                "two files given ({} and {}); check one: starling --config FILE check-config",
                c.display(),
                f.display()
            ),
            (Some(f), _) | (None, Some(f)) => f,
            (None, None) => bail!("no file to check: starling --config FILE check-config"),
        };
        return check_config(file);
    }
    let cfg = load_config(cli.config.as_deref())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    match cli.command.unwrap_or(Command::Run) {
        Command::Run => {
            init_logging(&cfg);
            rt.block_on(run(cfg))
        }
        Command::CheckConfig { .. } => unreachable!("handled above"),
        Command::Modules => {
            list_modules(&cfg);
            Ok(())
        }
        Command::User(cmd) => {
            note!(
                "working offline on the database ({}); `starling ctl users …` goes through a running server",
                cfg.storage_description()
            );
            rt.block_on(user(cfg, cmd))
        }
        Command::Ctl(_) => unreachable!("handled in main"),
        Command::Domain(cmd) => {
            // A removal's progress is logged.
            init_logging(&cfg);
            note!(
                "working on the database ({}); a running server sees the change within 2 s",
                cfg.storage_description()
            );
            rt.block_on(async {
                let storage = open_storage(&cfg).await?;
                starling_server::domains::run_cli(&cfg, storage, cmd).await
            })
        }
        Command::Admin(AdminCommand::Token(cmd)) => rt.block_on(admin_token(cfg, cmd)),
        Command::Archive(cmd) => rt.block_on(archive(cfg, cmd)),
        Command::Cluster(cmd) => rt.block_on(cluster(cfg, cmd)),
        Command::Room(cmd) => rt.block_on(room(cfg, cmd)),
        Command::Upload(cmd) => {
            // Files that cannot be read or removed are logged.
            init_logging(&cfg);
            rt.block_on(upload(cfg, cmd))
        }
    }
}

/// `upload …`.
async fn upload(cfg: Config, cmd: UploadCommand) -> anyhow::Result<()> {
    use starling_server::modules::upload::{purge, upload_dir, PurgePolicy, PurgeReport};
    let UploadCommand::Purge {
        older_than_days,
        dry_run,
    } = cmd;
    let up = cfg.modules.get::<starling_server::modules::Upload>();
    let dir = upload_dir(up, &cfg.server.data_dir);
    let days = older_than_days.or((up.expire_after_days > 0).then_some(up.expire_after_days));
    let policy = PurgePolicy {
        older_than: days.map(|d| std::time::Duration::from_secs(d.saturating_mul(86_400))),
        slot_timeout: std::time::Duration::from_secs(up.slot_timeout_secs.max(1)),
        dry_run,
    };
    match days {
        Some(d) => note!(
            "{} files uploaded {d} or more day(s) ago, and slots never used, in {}",
            if dry_run { "counting" } else { "removing" },
            dir.display()
        ),
        None => note!(
            "files are kept (expire_after_days = 0; pass --older-than-days N to remove old ones); {} slots never used in {}",
            if dry_run { "counting" } else { "removing" },
            dir.display()
        ),
    }
    let mut progress = |r: &PurgeReport| {
        note!(
            "… {} slot(s) scanned, {} file(s) ({} bytes) removed so far",
            r.scanned,
            r.files_removed,
            r.bytes_removed
        );
    };
    let r = purge(&dir, &policy, &mut progress)
        .await
        .with_context(|| format!("reading the upload directory {}", dir.display()))?;
    let verb = if dry_run { "would remove" } else { "removed" };
    out!(
        "{verb} {} file(s) ({} bytes) and {} unused slot(s); kept {} file(s) ({} bytes); {} slot(s) scanned",
        r.files_removed,
        r.bytes_removed,
        r.slots_removed,
        r.files_kept,
        r.bytes_kept,
        r.scanned
    )?;
    if r.errors > 0 {
        bail!(
            "{} slot(s) could not be read or removed (see the messages above)",
            r.errors
        );
    }
    Ok(())
}

/// `admin token …`.
async fn admin_token(cfg: Config, cmd: TokenCommand) -> anyhow::Result<()> {
    use starling_server::admin::tokens;
    let storage = open_storage(&cfg).await?;
    let store = storage.admin_tokens.as_ref();
    let result = async {
        match cmd {
            TokenCommand::Create { name, scope } => {
                let token = tokens::create(store, &name, &scope).await?;
                note!(
                    "created admin token {name:?} (scope {scope}); it is shown only now: keep it secret (e.g. export STARLING_ADMIN_TOKEN=…)"
                );
                out!("{token}")?;
            }
            TokenCommand::List => {
                let list = tokens::list(store).await?;
                if list.is_empty() {
                    note!("no admin tokens; create one with: starling admin token create --name NAME");
                }
                let when = |ms: i64| {
                    starling_proto::datetime::xep0082_datetime(u128::try_from(ms).unwrap_or(0))
                };
                for t in &list {
                    out!(
                        "{}  scope {}  created {}  last used {}",
                        t.name,
                        t.scope,
                        when(t.created_at),
                        t.last_used_at.map_or("never".to_owned(), when)
                    )?;
                }
            }
            TokenCommand::Revoke { name } => {
                if store.revoke_admin_token(&name).await? {
                    out!("revoked admin token {name:?}")?;
                } else {
                    bail!("no admin token named {name:?} (see `starling admin token list`)");
                }
            }
        }
        Ok(())
    }
    .await;
    storage.backend.close().await;
    result
}

/// `cluster …`.
async fn cluster(cfg: Config, cmd: ClusterCommand) -> anyhow::Result<()> {
    let ClusterCommand::Status { json } = cmd;
    let Some(url) = cfg.cluster.nats_url.clone() else {
        bail!("no cluster configured: set [cluster] nats_url in the file given with --config (docs/cluster.md)");
    };
    let listen = std::time::Duration::from_millis(3 * cfg.cluster.heartbeat_ms.max(100) + 200);
    if !json && std::io::stderr().is_terminal() {
        note!("listening on {url} for {:.1} s…", listen.as_secs_f64());
    }
    let nodes = starling_server::cluster::observe(&cfg.cluster, listen).await?;
    if json {
        out!("{}", serde_json::to_string_pretty(&nodes)?)?;
    } else {
        out!(
            "cluster {:?} on {url}: {} node(s)",
            cfg.cluster.name,
            nodes.len()
        )?;
        if !nodes.is_empty() {
            out!(
                "{:>4}  {:>9}  {:>15}  {:>15}  incarnation",
                "node",
                "sessions",
                "registry events",
                "last heartbeat"
            )?;
        }
        for n in &nodes {
            out!(
                "{:>4}  {:>9}  {:>15}  {:>12} ms  {}",
                n.node,
                n.sessions,
                n.registry_events,
                n.last_heartbeat_ms_ago,
                n.incarnation
            )?;
        }
    }
    if nodes.is_empty() {
        bail!(
            "no node of cluster {:?} was heard on {url} within {:.1} s: are the nodes running with the same [cluster] name?",
            cfg.cluster.name,
            listen.as_secs_f64()
        );
    }
    Ok(())
}

/// `modules`: one line per module, in registration order.
fn list_modules(cfg: &Config) {
    let width = starling_server::modules::MODULES
        .iter()
        .map(|m| m.name().len())
        .max()
        .unwrap_or(0);
    for (m, c) in cfg.modules.iter() {
        let mut line = format!(
            "{:<width$}  {:<3}  {}",
            m.name(),
            if m.enabled(c) { "on" } else { "off" },
            m.summary()
        );
        if !m.storage().is_empty() {
            line.push_str(&format!(" [storage: {}]", m.storage().join(", ")));
        }
        if !m.needs().is_empty() {
            line.push_str(&format!(" [needs: {}]", m.needs().join(", ")));
        }
        println!("{line}");
    }
}

/// `check-config`: what `run` would refuse, refused here too; warnings for
/// what would start but hurt clients.
fn check_config(file: &Path) -> anyhow::Result<()> {
    use starling_server::tls::{CertificateFacts, TlsContext};
    let cfg = Config::load(file)?;
    let certificate = match (&cfg.tls.certificate, &cfg.tls.private_key) {
        (Some(cert), Some(key)) => {
            TlsContext::load(cert, key).context("[tls] certificate/private_key")?;
            let facts = CertificateFacts::from_pem_file(cert)?;
            let uncovered = facts.uncovered(&cfg.server.domains);
            if !uncovered.is_empty() {
                note!(
                    "warning: certificate {} does not cover {} (its names: {}); clients will refuse TLS for those domains: get a certificate that names them",
                    cert.display(),
                    uncovered.join(", "),
                    if facts.dns_names.is_empty() { "none".to_owned() } else { facts.dns_names.join(", ") }
                );
            }
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            if facts.not_after <= now {
                note!(
                    "warning: certificate {} has expired: renew it",
                    cert.display()
                );
            } else if facts.not_after - now < 14 * 86_400 {
                note!(
                    "warning: certificate {} expires in {} day(s): renew it",
                    cert.display(),
                    (facts.not_after - now) / 86_400
                );
            } else if facts.not_before > now {
                note!("warning: certificate {} is not valid yet", cert.display());
            }
            format!("certificate {}", cert.display())
        }
        _ => "self-signed certificate".to_owned(),
    };
    for a in cfg.admin.exposed() {
        note!(
            "warning: [admin] listen {a} is not a loopback address: /metrics and /health need no token there; restrict access or use 127.0.0.1"
        );
    }
    out!(
        "{}: OK ({} domain(s), {} listener(s), database {}, {certificate})",
        file.display(),
        cfg.server.domains.len(),
        cfg.listen.len(),
        cfg.storage_description()
    )?;
    Ok(())
}

async fn run(cfg: Config) -> anyhow::Result<()> {
    // The handlers are installed before start-up, so a SIGTERM that comes
    // while the server is still starting (its listeners may already answer)
    // stops it gracefully instead of killing it.
    let stop = StopSignal::install();
    let server = starling_server::start(cfg).await?;
    stop.wait().await;
    server.shutdown().await;
    Ok(())
}

/// SIGINT and SIGTERM, caught from the moment this is made.
struct StopSignal {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl StopSignal {
    fn install() -> StopSignal {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            StopSignal {
                term: signal(SignalKind::terminate()).expect("SIGTERM handler"),
                int: signal(SignalKind::interrupt()).expect("SIGINT handler"),
            }
        }
        #[cfg(not(unix))]
        StopSignal {}
    }

    async fn wait(mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn open_storage(cfg: &Config) -> anyhow::Result<Storage> {
    let mut cfg = cfg.clone();
    cfg.storage.pool_size = 2;
    Ok(starling_storage::open(&cfg.backend_config()).await?)
}

/// Parses an existing account's JID, warning when its domain is not
/// configured (deleting or purging such an account stays possible).
fn parse_account(s: &str, cfg: &Config) -> anyhow::Result<BareJid> {
    let jid = parse_account_quiet(s)?;
    if !serves(cfg, jid.domain().as_str()) {
        note!(
            "warning: {} is not one of the configured domains ({})",
            jid.domain(),
            cfg.server.domains.join(", ")
        );
    }
    Ok(jid)
}

/// Parses a JID that must have a user part, without the domain warning.
fn parse_account_quiet(s: &str) -> anyhow::Result<BareJid> {
    let jid = BareJid::new(s).with_context(|| format!("{s:?} is not a valid JID"))?;
    if jid.node().is_none() {
        bail!("{s:?} has no user part; write it as user@domain");
    }
    Ok(jid)
}

fn serves(cfg: &Config, domain: &str) -> bool {
    cfg.server
        .domains
        .iter()
        .any(|d| d.eq_ignore_ascii_case(domain))
}

/// Refuses to create an account on a domain the server does not serve
/// (nobody could log in to it), unless `force`.
fn check_served(cfg: &Config, domain: &str, force: bool) -> anyhow::Result<()> {
    if serves(cfg, domain) {
        return Ok(());
    }
    let configured = cfg.server.domains.join(", ");
    if force {
        note!("warning: {domain} is not one of the configured domains ({configured}); creating the account anyway (--force)");
        return Ok(());
    }
    bail!(
        "{domain} is not served by this server (configured domains: {configured}); \
         add it to [server] domains in the configuration, or pass --force to create the account anyway"
    )
}

fn obtain_password(given: Option<String>) -> anyhow::Result<(String, bool)> {
    if let Some(p) = given {
        if p.is_empty() {
            bail!("empty password: give one with --password or on standard input");
        }
        return Ok((p, false));
    }
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Ok((starling_proto::random_id(20), true));
    }
    let mut line = String::new();
    stdin.lock().read_line(&mut line)?;
    let p = line.trim_end_matches(['\r', '\n']).to_owned();
    if p.is_empty() {
        bail!("empty password on standard input");
    }
    Ok((p, false))
}

async fn archive(cfg: Config, cmd: ArchiveCommand) -> anyhow::Result<()> {
    use starling_core::storage::ArchiveId;
    let storage = open_storage(&cfg).await?;
    let result = match cmd {
        ArchiveCommand::Purge { jid, before } => {
            let jid = parse_account(&jid, &cfg)?;
            let before = match before {
                None => None,
                Some(t) => {
                    let micros = starling_proto::datetime::parse_xep0082(&t).with_context(
                        || format!("--before {t:?} is not a XEP-0082 DateTime like 2026-01-31T00:00:00Z"),
                    )?;
                    Some(ArchiveId::lower_bound(micros))
                }
            };
            let n = storage.archive.purge_user(&jid, before).await?;
            out!("deleted {n} archived message(s) of {jid}")?;
            Ok(())
        }
        ArchiveCommand::Retention => {
            let mam = cfg.modules.get::<starling_server::modules::Mam>();
            for d in &cfg.server.domains {
                let days = mam
                    .domain_retention_days
                    .get(d)
                    .copied()
                    .unwrap_or(mam.retention_days);
                if days == 0 {
                    out!("{d}: messages are kept forever (retention_days = 0)")?;
                    continue;
                }
                let n =
                    starling_server::modules::mam::purge_domain(storage.archive.as_ref(), d, days)
                        .await?;
                out!("{d}: deleted {n} message(s) older than {days} day(s)")?;
            }
            Ok(())
        }
    };
    storage.backend.close().await;
    result
}

/// The group-chat services of this configuration: [modules.muc]
/// subdomain under each served domain.
fn muc_services(cfg: &Config) -> Vec<String> {
    let sub = &cfg.modules.get::<Muc>().subdomain;
    cfg.server
        .domains
        .iter()
        .map(|d| format!("{sub}.{}", d.to_ascii_lowercase()))
        .collect()
}

/// Parses a room's JID (name@service, no resource).
fn parse_room(s: &str, cfg: &Config) -> anyhow::Result<BareJid> {
    let example = muc_services(cfg)
        .first()
        .map_or("lobby@conference.localhost".to_owned(), |s| {
            format!("lobby@{s}")
        });
    let jid = Jid::new(s).with_context(|| {
        format!("{s:?} is not a valid JID; write a room as name@service, e.g. {example}")
    })?;
    if jid.resource().is_some() {
        bail!("{s:?} has a resource (/…); a room's JID is name@service, e.g. {example}");
    }
    if jid.node().is_none() {
        bail!("{s:?} has no room name; write it as name@service, e.g. {example}");
    }
    Ok(jid.into_bare())
}

/// Refuses (or, for an existing room, only warns about) a room whose
/// domain is not one of the configured group-chat services.
fn check_muc_service(cfg: &Config, service: &str, refuse: bool) -> anyhow::Result<()> {
    let services = muc_services(cfg);
    if services.iter().any(|s| s == service) {
        return Ok(());
    }
    let hint = format!(
        "{service} is not a group-chat service of this server (configured: {}; each is [modules.muc] subdomain under a [server] domain)",
        services.join(", ")
    );
    if refuse {
        bail!("{hint}: use one of those, or add the domain to [server] domains");
    }
    note!("warning: {hint}");
    Ok(())
}

/// Parses a room owner's JID: bare, with a user part.
fn parse_owner(s: &str) -> anyhow::Result<BareJid> {
    let jid = Jid::new(s).with_context(|| format!("--owner {s:?} is not a valid JID"))?;
    if jid.resource().is_some() {
        bail!("--owner {s:?} is a full JID; give the owner's bare JID, e.g. alice@localhost");
    }
    if jid.node().is_none() {
        bail!("--owner {s:?} has no user part; write it as user@domain");
    }
    Ok(jid.into_bare())
}

/// A stored room as `room list` shows it.
struct RoomLine {
    jid: BareJid,
    summary: Option<StoredConfigSummary>,
    owners: Vec<String>,
    created: String,
}

impl RoomLine {
    fn text(&self) -> String {
        let flags = match &self.summary {
            Some(c) => format!(
                "{}  {}{}",
                if c.public { "public" } else { "hidden" },
                if c.members_only {
                    "members-only"
                } else {
                    "open"
                },
                if c.password_protected {
                    ", password"
                } else {
                    ""
                }
            ),
            None => "(configuration unreadable)".to_owned(),
        };
        let owners = if self.owners.is_empty() {
            "-".to_owned()
        } else {
            self.owners.join(",")
        };
        let mut line = format!(
            "{}  {flags}  owners {owners}  created {}",
            self.jid, self.created
        );
        match self.summary.as_ref().map(|c| c.name.as_str()) {
            Some(name) if !name.is_empty() => line.push_str(&format!("  name {name:?}")),
            _ => {}
        }
        line
    }

    fn json(&self) -> serde_json::Value {
        let c = self.summary.as_ref();
        serde_json::json!({
            "jid": self.jid.as_str(),
            "service": self.jid.domain().as_str(),
            "name": c.map(|c| c.name.as_str()),
            "public": c.map(|c| c.public),
            "members_only": c.map(|c| c.members_only),
            "password_protected": c.map(|c| c.password_protected),
            "owners": self.owners,
            "created_at": self.created,
        })
    }
}

/// `room …`.
async fn room(cfg: Config, cmd: RoomCommand) -> anyhow::Result<()> {
    let storage = open_storage(&cfg).await?;
    let result = match cmd {
        RoomCommand::List { service, json } => room_list(&storage, &cfg, service, json).await,
        RoomCommand::Create {
            jid,
            owner,
            name,
            members_only,
            hidden,
            password,
        } => {
            let opts = CliRoom {
                name: name.unwrap_or_default(),
                members_only,
                hidden,
                password,
            };
            room_create(&storage, &cfg, &jid, &owner, &opts).await
        }
        RoomCommand::Destroy { jid, yes } => room_destroy(&storage, &cfg, &jid, yes).await,
    };
    storage.backend.close().await;
    result
}

/// Rooms read from storage per page by `room list`.
const ROOM_PAGE: u32 = 500;

async fn room_list(
    storage: &Storage,
    cfg: &Config,
    service: Option<String>,
    json: bool,
) -> anyhow::Result<()> {
    let services = match service {
        Some(s) => {
            let domain = BareJid::new(&s)
                .ok()
                .filter(|j| j.node().is_none())
                .with_context(|| {
                    format!(
                        "--service {s:?} is not a domain; give a service like conference.localhost"
                    )
                })?;
            let domain = domain.domain().as_str().to_owned();
            check_muc_service(cfg, &domain, false)?;
            vec![domain]
        }
        None => muc_services(cfg),
    };
    if !cfg.modules.is_enabled("muc") {
        note!("warning: group chat is off ([modules.muc] enabled = false): these rooms are not served");
    }
    if json {
        out!("[")?;
    }
    // One JSON object is held back until the next shows whether a comma
    // follows it.
    let mut pending: Option<String> = None;
    let mut total = 0u64;
    for service in &services {
        let mut after: Option<String> = None;
        loop {
            let page = storage
                .muc
                .rooms(service, after.as_deref(), ROOM_PAGE)
                .await?;
            let Some(last) = page.last() else { break };
            after = last.jid.node().map(|n| n.as_str().to_owned());
            for r in &page {
                let owners = storage
                    .muc
                    .affiliations(&r.jid)
                    .await?
                    .into_iter()
                    .filter(|a| a.affiliation == "owner")
                    .map(|a| a.jid)
                    .collect();
                let line = RoomLine {
                    summary: stored_config_summary(&r.config),
                    owners,
                    created: starling_proto::datetime::xep0082_datetime(
                        u128::try_from(r.created_at).unwrap_or(0),
                    ),
                    jid: r.jid.clone(),
                };
                total += 1;
                if json {
                    if let Some(p) = pending.replace(line.json().to_string()) {
                        out!("  {p},")?;
                    }
                } else {
                    out!("{}", line.text())?;
                }
            }
        }
    }
    if json {
        if let Some(p) = pending {
            out!("  {p}")?;
        }
        out!("]")?;
    } else if total == 0 && std::io::stderr().is_terminal() {
        note!("no stored rooms on {}", services.join(", "));
    }
    Ok(())
}

async fn room_create(
    storage: &Storage,
    cfg: &Config,
    jid: &str,
    owner: &str,
    opts: &CliRoom,
) -> anyhow::Result<()> {
    use starling_core::storage::{RoomAffiliation, StoredRoom};
    let jid = parse_room(jid, cfg)?;
    check_muc_service(cfg, jid.domain().as_str(), true)?;
    if !cfg.modules.is_enabled("muc") {
        bail!("group chat is off ([modules.muc] enabled = false): enable it, or nobody could enter the room");
    }
    let owner = parse_owner(owner)?;
    let svc = cfg.modules.get::<Muc>();
    let config = stored_config_for_cli(svc, opts)
        .map_err(|e| anyhow::anyhow!("cannot create {jid}: {e}"))?;
    if let Some(existing) = storage.muc.room(&jid).await? {
        bail!(
            "room {jid} already exists (created {}): choose another name, or delete it first with `starling room destroy {jid}`",
            starling_proto::datetime::xep0082_datetime(
                u128::try_from(existing.created_at).unwrap_or(0)
            )
        );
    }
    if !serves(cfg, owner.domain().as_str()) {
        note!(
            "warning: {} is not one of the configured domains ({}); {owner} cannot log in here",
            owner.domain(),
            cfg.server.domains.join(", ")
        );
    } else if !storage.accounts.exists(&owner).await? {
        note!("warning: {owner} has no account yet; create it with `starling user add {owner}`");
    }
    if svc.max_rooms_per_user > 0 {
        let owned = storage
            .muc
            .rooms_of(&owner)
            .await?
            .iter()
            .filter(|(_, a)| a.affiliation == "owner")
            .count();
        if owned >= svc.max_rooms_per_user as usize {
            note!(
                "warning: {owner} already owns {owned} room(s), the most [modules.muc] max_rooms_per_user lets a user create; creating this one anyway"
            );
        }
    }
    let created_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    storage
        .muc
        .put_room(&StoredRoom {
            jid: jid.clone(),
            config,
            subject: String::new(),
            created_at,
        })
        .await?;
    let owner_row = RoomAffiliation {
        jid: owner.to_string(),
        affiliation: "owner".into(),
        nick: None,
        reason: None,
    };
    if let Err(e) = storage.muc.set_affiliations(&jid, &[owner_row]).await {
        // No room without its owner.
        let _ = storage.muc.delete_room(&jid).await;
        return Err(e.into());
    }
    out!("created {jid} (owner {owner})")?;
    Ok(())
}

async fn room_destroy(storage: &Storage, cfg: &Config, jid: &str, yes: bool) -> anyhow::Result<()> {
    let jid = parse_room(jid, cfg)?;
    check_muc_service(cfg, jid.domain().as_str(), false)?;
    if storage.muc.room(&jid).await?.is_none() {
        bail!(
            "no stored room {jid}: see `starling room list --service {}` (a temporary room lives only in the running server; its owner destroys it through XMPP)",
            jid.domain()
        );
    }
    let affiliations = storage.muc.affiliations(&jid).await?;
    let stdin = std::io::stdin();
    if !yes && stdin.is_terminal() {
        let owners: Vec<&str> = affiliations
            .iter()
            .filter(|a| a.affiliation == "owner")
            .map(|a| a.jid.as_str())
            .collect();
        note!(
            "{jid}: owners {}, {} affiliation(s) in all. A running server that has it loaded keeps its occupants; destroy a room in use through XMPP as its owner.",
            if owners.is_empty() { "-".to_owned() } else { owners.join(", ") },
            affiliations.len()
        );
        {
            use std::io::Write as _;
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "Delete {jid}, its affiliations and its archive? [y/N] "
            );
            let _ = err.flush();
        }
        let mut answer = String::new();
        stdin.lock().read_line(&mut answer)?;
        if !matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
            bail!("nothing deleted (answer y to delete, or pass --yes)");
        }
    }
    // The archive first: if deleting the room then fails, running the
    // command again finds the room and finishes.
    let messages = storage.archive.purge_user(&jid, None).await?;
    storage.muc.delete_room(&jid).await?;
    out!(
        "destroyed {jid}: {} affiliation(s) and {messages} archived message(s) deleted",
        affiliations.len()
    )?;
    Ok(())
}

async fn user(cfg: Config, cmd: UserCommand) -> anyhow::Result<()> {
    let storage = open_storage(&cfg).await?;
    let iterations = cfg.auth.scram_iterations;
    let result = match cmd {
        UserCommand::Add {
            jid,
            password,
            force,
        } => {
            let jid = parse_account_quiet(&jid)?;
            // A domain added with `starling domain add` is served too.
            if !starling_server::domains::stored_and_enabled(&storage, jid.domain().as_str()).await
            {
                check_served(&cfg, jid.domain().as_str(), force)?;
            }
            let (password, generated) = obtain_password(password)?;
            accounts::create(&storage, &jid, &password, iterations).await?;
            if generated {
                out!("created {jid} with password: {password}")?;
            } else {
                out!("created {jid}")?;
            }
            Ok(())
        }
        UserCommand::Del { jid } => {
            let jid = parse_account(&jid, &cfg)?;
            if storage.delete_account(&jid).await? {
                out!("deleted {jid}")?;
                Ok(())
            } else {
                Err(anyhow::anyhow!("{jid} does not exist"))
            }
        }
        UserCommand::Passwd { jid, password } => {
            let jid = parse_account(&jid, &cfg)?;
            let (password, generated) = obtain_password(password)?;
            accounts::set_password(&storage, &jid, &password, iterations).await?;
            if generated {
                out!("new password for {jid}: {password}")?;
            } else {
                out!("password changed for {jid}")?;
            }
            Ok(())
        }
        UserCommand::List { domain } => {
            let domain = domain.unwrap_or_else(|| cfg.server.domains[0].clone());
            let mut after: Option<String> = None;
            loop {
                let page = storage
                    .accounts
                    .list(&domain, after.as_deref(), 1000)
                    .await?;
                for u in &page {
                    out!("{u}@{domain}")?;
                }
                if page.len() < 1000 {
                    break;
                }
                after = page.last().cloned();
            }
            Ok(())
        }
        UserCommand::Import {
            file,
            domain,
            iterations: iters,
            force,
        } => {
            import(
                &storage,
                &cfg,
                &file,
                domain,
                iters.unwrap_or(iterations),
                force,
            )
            .await
        }
    };
    storage.backend.close().await;
    result
}

async fn import(
    storage: &Storage,
    cfg: &Config,
    file: &Path,
    domain: Option<String>,
    iterations: u32,
    force: bool,
) -> anyhow::Result<()> {
    if iterations < 4096 {
        note!("warning: {iterations} PBKDF2 iterations is below RFC 7677's minimum of 4096; use only for test accounts");
    }
    let text = if file == Path::new("-") {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?
    };
    let domain = domain.unwrap_or_else(|| cfg.server.domains[0].clone());
    let mut entries = Vec::new();
    let mut unserved_warned = false;
    let mut stored_domains: std::collections::HashMap<String, bool> =
        std::collections::HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((user, password)) = line.split_once(':') else {
            bail!(
                "{}:{}: expected user@domain:password",
                file.display(),
                n + 1
            );
        };
        let user = if user.contains('@') {
            user.to_owned()
        } else {
            format!("{user}@{domain}")
        };
        let jid = BareJid::new(&user)
            .ok()
            .filter(|j| j.node().is_some())
            .with_context(|| {
                format!(
                    "{}:{}: {user:?} is not a valid account",
                    file.display(),
                    n + 1
                )
            })?;
        if password.is_empty() {
            bail!(
                "{}:{}: empty password for {jid}; every account needs one",
                file.display(),
                n + 1
            );
        }
        // Without --force the first such line stops the import; with it,
        // one warning is enough.
        let quiet = force && unserved_warned;
        // A domain added with `starling domain add` is served too (as for
        // `user add`); asked once per domain.
        let stored = match stored_domains.get(jid.domain().as_str()) {
            Some(s) => *s,
            None => {
                let s =
                    starling_server::domains::stored_and_enabled(storage, jid.domain().as_str())
                        .await;
                stored_domains.insert(jid.domain().as_str().to_owned(), s);
                s
            }
        };
        if !quiet && !stored && !serves(cfg, jid.domain().as_str()) {
            check_served(cfg, jid.domain().as_str(), force)
                .with_context(|| format!("{}:{}", file.display(), n + 1))?;
            unserved_warned = true;
        }
        entries.push((jid, password.to_owned()));
    }
    let total = entries.len();
    let started = Instant::now();
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut created = 0u64;
    for (i, chunk) in entries.chunks(500).enumerate() {
        // Derive keys for this chunk on all cores (PBKDF2 dominates).
        let parts: Vec<Vec<(BareJid, String)>> = chunk
            .chunks(chunk.len().div_ceil(workers).max(1))
            .map(|c| c.to_vec())
            .collect();
        let mut tasks = Vec::new();
        for part in parts {
            tasks.push(tokio::task::spawn_blocking(move || {
                part.into_iter()
                    .map(|(jid, pw)| {
                        accounts::derive_credentials_blocking(&pw, iterations).map(|c| (jid, c))
                    })
                    .collect::<Result<Vec<_>, _>>()
            }));
        }
        let mut batch = Vec::with_capacity(chunk.len());
        for t in tasks {
            batch.extend(t.await??);
        }
        created += storage.accounts.create_many(&batch).await?;
        let done = (i * 500 + chunk.len()).min(total);
        let rate = done as f64 / started.elapsed().as_secs_f64().max(0.001);
        note!("imported {done}/{total} ({rate:.0} accounts/s)");
    }
    out!(
        "created {created} account(s), skipped {} existing, in {:.1}s",
        total as u64 - created,
        started.elapsed().as_secs_f64()
    )?;
    Ok(())
}
