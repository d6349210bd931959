//! What every `starling` subcommand shares, wherever it lives (the
//! binary's `cli/` for accounts, admin tokens and the cluster; a module's
//! own `cli.rs` for its feature: `modules/muc/cli.rs` for rooms,
//! `modules/mam/cli.rs` for archives, `modules/upload/cli.rs` for
//! uploaded files): writing to standard output without panicking when it
//! is closed, opening storage for a command, and parsing account JIDs.

use crate::config::Config;
use anyhow::{bail, Context};
use starling_core::storage::Storage;
use starling_proto::BareJid;

/// Writes a line to standard output without panicking when it is closed:
/// `starling user list | head` must stop quietly, not die with "failed
/// printing to stdout". The error ([`StdoutError`]) ends the command; the
/// binary's `main` treats a broken pipe as a clean exit.
///
/// Why not restore the default SIGPIPE disposition instead: that needs
/// `unsafe` (the workspace forbids it), and in the same process a server's
/// socket writes must get EPIPE, not a fatal signal.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*).map_err($crate::command::StdoutError)
    }};
}

/// Writes a line to standard error; a closed stderr is ignored (there is
/// nowhere left to report it).
#[macro_export]
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// Standard output could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write to standard output: {0}")]
pub struct StdoutError(pub std::io::Error);

/// Opens the configured storage for a command (a small pool: a command
/// runs beside a server that holds its own).
pub async fn open_storage(cfg: &Config) -> anyhow::Result<Storage> {
    let mut cfg = cfg.clone();
    cfg.storage.pool_size = 2;
    Ok(crate::modules::open_storage(&cfg.backend_config()).await?)
}

/// Parses an existing account's JID, warning when its domain is not
/// configured (deleting or purging such an account stays possible).
pub fn parse_account(s: &str, cfg: &Config) -> anyhow::Result<BareJid> {
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
pub fn parse_account_quiet(s: &str) -> anyhow::Result<BareJid> {
    let jid = BareJid::new(s).with_context(|| format!("{s:?} is not a valid JID"))?;
    if jid.node().is_none() {
        bail!("{s:?} has no user part; write it as user@domain");
    }
    Ok(jid)
}

/// Whether `domain` is one of `[server] domains`.
pub fn serves(cfg: &Config, domain: &str) -> bool {
    cfg.server
        .domains
        .iter()
        .any(|d| d.eq_ignore_ascii_case(domain))
}

/// Refuses to create an account on a domain the server does not serve
/// (nobody could log in to it), unless `force`.
pub fn check_served(cfg: &Config, domain: &str, force: bool) -> anyhow::Result<()> {
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
