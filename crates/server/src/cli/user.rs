//! `starling user …`: accounts, offline on the database, and `user import` from other servers.

use crate::*;

#[derive(Subcommand)]
pub(crate) enum UserCommand {
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

pub(crate) async fn user(cfg: Config, cmd: UserCommand) -> anyhow::Result<()> {
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

pub(crate) async fn import(
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
