//! The `starling` command: run the server, check a configuration, manage
//! accounts, archives, group-chat rooms and uploaded files.

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use starling_core::storage::Storage;
use starling_proto::BareJid;
use starling_server::config::LogFormat;
use starling_server::{accounts, Config};
use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use starling_server::command::{
    check_served, open_storage, parse_account, parse_account_quiet, serves, StdoutError,
};
use starling_server::{note, out};

mod cli;
use cli::{admin::*, cluster::*, user::*};
use starling_server::modules::{mam, muc, upload};

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
    Archive(mam::cli::ArchiveCommand),
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
    Room(muc::cli::RoomCommand),
    /// Manage uploaded files (XEP-0363, [modules.upload]; docs/upload.md).
    #[command(subcommand)]
    Upload(upload::cli::UploadCommand),
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
        Command::Archive(cmd) => rt.block_on(mam::cli::run(cfg, cmd)),
        Command::Cluster(cmd) => rt.block_on(cluster(cfg, cmd)),
        Command::Room(cmd) => rt.block_on(muc::cli::run(cfg, cmd)),
        Command::Upload(cmd) => {
            // Files that cannot be read or removed are logged.
            init_logging(&cfg);
            rt.block_on(upload::cli::run(cfg, cmd))
        }
    }
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
