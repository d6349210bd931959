//! Creating N accounts: in-band registration (any server), Starling's bulk
//! import, the peers' command-line tools, or Prosody's account files.

use crate::cli::{ConnArgs, ProvisionArgs, ProvisionMethod};
use crate::client::{self, Registered, Target};
use anyhow::Context as _;
use starling_proto::sasl::{ScramCredentials, ScramHash};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// Runs `provision`.
pub async fn run(p: ProvisionArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let c = &p.conn;
    match p.method {
        ProvisionMethod::Ibr => ibr(c).await?,
        ProvisionMethod::StarlingFile => {
            let out = p.out.clone().context("--out FILE is required")?;
            write_starling_file(c, &out)?;
            eprintln!("wrote {} accounts to {}", c.users, out.display());
        }
        ProvisionMethod::StarlingImport => {
            let out = p.out.clone().unwrap_or_else(|| {
                std::env::temp_dir()
                    .join(format!("starling-bench-users-{}.txt", std::process::id()))
            });
            write_starling_file(c, &out)?;
            let mut cmd = std::process::Command::new(&p.starling_bin);
            if let Some(cfg) = &p.starling_config {
                cmd.arg("--config").arg(cfg);
            }
            cmd.args(["user", "import"])
                .arg(&out)
                .args(["--iterations", &p.iterations.to_string()]);
            if p.force {
                cmd.arg("--force");
            }
            eprintln!("running {cmd:?}");
            let st = cmd
                .status()
                .with_context(|| format!("cannot run {}", p.starling_bin.display()))?;
            if p.out.is_none() {
                let _ = std::fs::remove_file(&out);
            }
            anyhow::ensure!(st.success(), "starling user import failed: {st}");
        }
        ProvisionMethod::Ejabberdctl => {
            let ctl = p.ctl.clone().unwrap_or_else(|| "ejabberdctl".into());
            run_ctl(c, &ctl, |user, domain, pw| {
                vec!["register".into(), user.into(), domain.into(), pw.into()]
            })
            .await?
        }
        ProvisionMethod::Prosodyctl => {
            let ctl = p.ctl.clone().unwrap_or_else(|| "prosodyctl".into());
            run_ctl(c, &ctl, |user, domain, pw| {
                vec!["register".into(), user.into(), domain.into(), pw.into()]
            })
            .await?
        }
        ProvisionMethod::ProsodyFiles => {
            let dir = p
                .prosody_data
                .clone()
                .context("--prosody-data DIR is required")?;
            prosody_files(c, &dir, p.iterations, p.chown.as_deref())?;
            if let Some(contacts) = p.contacts {
                prosody_rosters(c, &dir, contacts)?;
                if let Some(owner) = p.chown.as_deref() {
                    let st = std::process::Command::new("chown")
                        .arg("-R")
                        .arg(owner)
                        .arg(&dir)
                        .status()?;
                    anyhow::ensure!(st.success(), "chown failed");
                }
            }
        }
    }
    eprintln!(
        "provisioned {} account(s) with {:?} in {:.1} s",
        c.users,
        p.method,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn users(c: &ConnArgs) -> impl Iterator<Item = (String, String)> + '_ {
    (c.first_user..c.first_user + c.users).map(|n| (c.user(n), c.password_of(n)))
}

/// `user@domain:password` lines, the format of `starling user import`.
pub fn starling_import_text(c: &ConnArgs) -> String {
    let mut s = String::new();
    for n in c.first_user..c.first_user + c.users {
        let (u, pw) = (c.user(n), c.password_of(n));
        let _ = writeln!(s, "{u}@{}:{pw}", c.domain_of(n));
    }
    s
}

fn write_starling_file(c: &ConnArgs, out: &Path) -> anyhow::Result<()> {
    std::fs::write(out, starling_import_text(c))
        .with_context(|| format!("cannot write {}", out.display()))
}

async fn ibr(c: &ConnArgs) -> anyhow::Result<()> {
    let target = Arc::new(Target {
        addr: std::net::SocketAddr::new(c.host, c.port),
        domain: c.domain.clone(),
        tls: c.tls,
        carrier: c.transport,
        mech: c.mechanism,
        sources: c.source_list(c.users),
        extra_ports: c.extra_ports.clone(),
        step_timeout: Duration::from_secs_f64(c.step_timeout),
        tls_connector: client::tls_connector()?,
        bosh_wait: c.bosh_wait,
        sm: false,
        sasl2: false,
        fast: false,
        full_login: false,
    });
    let mut set = JoinSet::new();
    let mut next = c.first_user;
    let end = c.first_user + c.users;
    let (mut created, mut existed) = (0u64, 0u64);
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    let mut first_error = None;
    let mut last_report = Instant::now();
    loop {
        while set.len() < c.concurrency.max(1) && next < end {
            let n = next;
            next += 1;
            let t = crate::engine::target_for(&target, c, n);
            let (user, pw) = (c.user(n), c.password_of(n));
            set.spawn(async move { client::register(&t, t.source_for(n), &user, &pw).await });
        }
        let Some(r) = set.join_next().await else {
            break;
        };
        match r {
            Ok(Ok(Registered::Created)) => created += 1,
            Ok(Ok(Registered::Exists)) => existed += 1,
            Ok(Err(e)) => {
                *failures.entry(e.cause.name().into()).or_default() += 1;
                first_error.get_or_insert_with(|| e.to_string());
            }
            Err(e) => {
                *failures.entry("panic".into()).or_default() += 1;
                first_error.get_or_insert_with(|| e.to_string());
            }
        }
        if last_report.elapsed() > Duration::from_secs(2) {
            eprintln!(
                "registered {created}, existing {existed}, failed {:?}",
                failures
            );
            last_report = Instant::now();
        }
    }
    eprintln!("registered {created}, existing {existed}, failed {failures:?}");
    anyhow::ensure!(
        failures.is_empty(),
        "{} registration(s) failed, e.g. {}",
        failures.values().sum::<u64>(),
        first_error.unwrap_or_default()
    );
    Ok(())
}

async fn run_ctl(
    c: &ConnArgs,
    ctl: &str,
    args: impl Fn(&str, &str, &str) -> Vec<String>,
) -> anyhow::Result<()> {
    let mut words = ctl.split_whitespace();
    let prog = words.next().context("empty --ctl")?.to_owned();
    let lead: Vec<String> = words.map(str::to_owned).collect();
    let mut set = JoinSet::new();
    let mut it = users(c);
    let mut failed = 0u64;
    let mut done = 0u64;
    loop {
        while set.len() < 8 {
            let Some((u, pw)) = it.next() else { break };
            let mut cmd = tokio::process::Command::new(&prog);
            cmd.args(&lead)
                .args(args(&u, &c.domain, &pw))
                .stdout(std::process::Stdio::null());
            set.spawn(async move { cmd.status().await });
        }
        let Some(r) = set.join_next().await else {
            break;
        };
        done += 1;
        if !matches!(r, Ok(Ok(s)) if s.success()) {
            failed += 1;
        }
        if done.is_multiple_of(500) {
            eprintln!("{done}/{} ({failed} failed)", c.users);
        }
    }
    anyhow::ensure!(failed == 0, "{failed} of {done} `{ctl}` calls failed");
    Ok(())
}

/// Prosody's storage encoding of a path component (datamanager.lua:
/// everything but alphanumerics becomes `%xx`).
fn prosody_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02x}")
            }
        })
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The content of one Prosody `accounts/USER.dat` for internal_hashed
/// (SCRAM-SHA-1 StoredKey/ServerKey in hex, as Prosody 0.12 writes them).
pub fn prosody_account(password: &str, salt: &str, iterations: u32) -> anyhow::Result<String> {
    let creds = ScramCredentials::derive(ScramHash::Sha1, password, salt.as_bytes(), iterations)
        .map_err(|e| anyhow::anyhow!("SCRAM derivation: {e}"))?;
    Ok(format!(
        "return {{\n\t[\"iteration_count\"] = {iterations};\n\t[\"salt\"] = \"{salt}\";\n\t[\"server_key\"] = \"{}\";\n\t[\"stored_key\"] = \"{}\";\n}};\n",
        hex(&creds.server_key),
        hex(&creds.stored_key)
    ))
}

/// A Lua string literal.
fn lua_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The content of one Prosody `roster/USER.dat` (the `internal` storage,
/// as Prosody 0.12 writes it): `contacts` (bare JIDs), each `both`, no
/// pending request, no name, no group.
pub fn prosody_roster(contacts: &[String]) -> String {
    let mut s = String::from(
        "return {\n\t[false] = {\n\t\t[\"pending\"] = {};\n\t\t[\"version\"] = 1;\n\t};\n",
    );
    for jid in contacts {
        let _ = write!(
            s,
            "\t[{}] = {{\n\t\t[\"groups\"] = {{}};\n\t\t[\"subscription\"] = \"both\";\n\t}};\n",
            lua_string(jid)
        );
    }
    s.push_str("};\n");
    s
}

/// Every user's roster file with the `pep` scenario's layout for
/// `contacts` contacts per user: what its setup over XMPP (one
/// subscription handshake per pair) leaves, without the handshakes.
///
/// Why: Prosody 0.12 with its file storage rewrites a user's whole roster
/// file (pending requests included, re-serialised in Lua) at every step
/// of every handshake — about 8 writes of a 100-item file per pair of
/// contacts. At 101 users × 100 contacts that is ~40,000 writes of
/// 10–20 KB, which this machine's Prosody does at ~90/s: 7+ minutes of
/// full CPU, far beyond the setup's timeout, and its backlog then
/// starved the storm's logins. The `pep` scenario finds these rosters
/// `both` on both sides and only publishes over XMPP.
fn prosody_rosters(c: &ConnArgs, data: &Path, contacts: u64) -> anyhow::Result<()> {
    let dir: PathBuf = data.join(prosody_encode(&c.domain)).join("roster");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let domain = c.domain.to_ascii_lowercase();
    let bare = |n: u64| format!("{}@{domain}", c.user(n).to_ascii_lowercase());
    for n in c.first_user..c.first_user + c.users {
        let jids: Vec<String> = crate::pep::group_of(c.first_user, c.users, contacts, n)
            .filter(|&m| m != n)
            .map(bare)
            .collect();
        let path = dir.join(format!("{}.dat", prosody_encode(&c.user(n))));
        std::fs::write(&path, prosody_roster(&jids))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    eprintln!(
        "wrote {} Prosody rosters ({contacts} contacts per user, groups of {}) under {}",
        c.users,
        contacts + 1,
        dir.display()
    );
    Ok(())
}

fn prosody_files(
    c: &ConnArgs,
    data: &Path,
    iterations: u32,
    chown: Option<&str>,
) -> anyhow::Result<()> {
    let dir: PathBuf = data.join(prosody_encode(&c.domain)).join("accounts");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let list: Vec<(String, String)> = users(c).collect();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let chunk = list.len().div_ceil(threads).max(1);
    std::thread::scope(|s| -> anyhow::Result<()> {
        let handles: Vec<_> = list
            .chunks(chunk)
            .map(|part| {
                let dir = &dir;
                s.spawn(move || -> anyhow::Result<()> {
                    for (u, pw) in part {
                        let salt = starling_proto::random_id(24);
                        let text = prosody_account(pw, &salt, iterations)?;
                        let path = dir.join(format!("{}.dat", prosody_encode(u)));
                        std::fs::write(&path, text)
                            .with_context(|| format!("cannot write {}", path.display()))?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("writer thread panicked"))??;
        }
        Ok(())
    })?;
    if let Some(owner) = chown {
        let st = std::process::Command::new("chown")
            .arg("-R")
            .arg(owner)
            .arg(data)
            .status()?;
        anyhow::ensure!(st.success(), "chown failed");
    }
    eprintln!(
        "wrote {} Prosody accounts under {}",
        list.len(),
        dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser as _;

    fn conn(extra: &[&str]) -> ConnArgs {
        let mut v = vec!["starling-bench", "provision"];
        v.extend_from_slice(extra);
        match Cli::parse_from(v).command {
            Command::Provision(p) => p.conn,
            _ => unreachable!(),
        }
    }

    #[test]
    fn starling_file_format() {
        let c = conn(&[
            "--users",
            "3",
            "--password",
            "pw{n}",
            "--domain",
            "example.org",
        ]);
        assert_eq!(
            starling_import_text(&c),
            "user1@example.org:pw1\nuser2@example.org:pw2\nuser3@example.org:pw3\n"
        );
    }

    #[test]
    fn starling_file_spread_over_domains() {
        let c = conn(&[
            "--users",
            "3",
            "--first-user",
            "2",
            "--password",
            "pw{n}",
            "--domains",
            "2",
            "--domain-pattern",
            "d{n}.example",
        ]);
        assert_eq!(
            starling_import_text(&c),
            "user2@d2.example:pw2\nuser3@d1.example:pw3\nuser4@d2.example:pw4\n"
        );
    }

    #[test]
    fn prosody_account_file_matches_rfc_5802_vector() {
        // RFC 5802 §5: password "pencil", salt QSXCR+Q6sek8bf92 (base64), 4096.
        // Prosody keeps the salt as a raw string, so use a printable salt and
        // check the keys against our own SCRAM implementation instead.
        let text = prosody_account("pencil", "abc-salt", 4096).unwrap();
        assert!(text.starts_with("return {"));
        assert!(text.contains("[\"iteration_count\"] = 4096;"));
        assert!(text.contains("[\"salt\"] = \"abc-salt\";"));
        let creds = ScramCredentials::derive(ScramHash::Sha1, "pencil", b"abc-salt", 4096).unwrap();
        assert!(text.contains(&hex(&creds.stored_key)));
        assert_eq!(prosody_encode("example.org"), "example%2eorg");
        let roster = prosody_roster(&["user2@localhost".into(), "a\"b@localhost".into()]);
        assert!(roster.starts_with("return {\n\t[false] = {\n"));
        assert!(roster.contains(
            "\t[\"user2@localhost\"] = {\n\t\t[\"groups\"] = {};\n\t\t[\"subscription\"] = \"both\";\n\t};\n"
        ));
        assert!(roster.contains("[\"a\\\"b@localhost\"]"));
        assert!(roster.ends_with("};\n"));
        assert_eq!(prosody_encode("user1"), "user1");
    }
}
