//! `starling ctl`: the admin API's command-line client, for a running
//! server (docs/admin.md). It speaks HTTP/1.1 itself over a TCP stream
//! (one request per connection, `Connection: close`): the admin listener
//! is plain HTTP on loopback, and a hand-written request keeps an HTTP
//! client stack out of the binary.
//!
//! Human-readable output by default, the API's JSON with `--json`. Exit
//! codes: [`EXIT_OK`], [`EXIT_SERVER`] (the server answered with an error:
//! its message is printed), [`EXIT_USAGE`], [`EXIT_CONNECT`] (nothing
//! answered at the URL).

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::io::Write as _;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Success.
pub const EXIT_OK: u8 = 0;
/// The server answered with an error status (4xx/5xx).
pub const EXIT_SERVER: u8 = 1;
/// The command line is wrong.
pub const EXIT_USAGE: u8 = 2;
/// Nothing answered at the URL.
pub const EXIT_CONNECT: u8 = 3;

/// The environment variable holding the token when `--token` is absent.
pub const TOKEN_ENV: &str = "STARLING_ADMIN_TOKEN";

/// `starling ctl …`: manage a running server through its admin API.
#[derive(Args, Debug)]
pub struct CtlArgs {
    /// The admin listener ([admin] listen), http://IP:port.
    #[arg(
        long,
        global = true,
        default_value = "http://127.0.0.1:5290",
        value_name = "URL"
    )]
    pub url: String,
    /// An admin token (from `starling admin token create`); default: the
    /// STARLING_ADMIN_TOKEN environment variable. Prefer the variable: a
    /// command line is visible to other users of the machine.
    #[arg(long, global = true, value_name = "TOKEN")]
    pub token: Option<String>,
    /// Print the API's JSON answer (for scripts).
    #[arg(long, global = true)]
    pub json: bool,
    /// Seconds to wait for the server.
    #[arg(long, global = true, default_value_t = 30, value_name = "SECS")]
    pub timeout: u64,
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// What `starling ctl` does.
#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// Accounts.
    #[command(subcommand)]
    Users(UsersCommand),
    /// Bound sessions.
    #[command(subcommand)]
    Sessions(SessionsCommand),
    /// Domains: the configuration file's and those added at run time.
    #[command(subcommand)]
    Domains(DomainsCommand),
    /// Group-chat rooms (XEP-0045).
    #[command(subcommand)]
    Rooms(RoomsCommand),
    /// Send a message from the server (its domain) to a JID.
    Send {
        /// The recipient: an account (all its resources, or offline
        /// storage), or one resource.
        jid: String,
        /// The message text.
        text: String,
        /// A headline (type='headline': shown as a notice, never stored
        /// offline) instead of a chat message.
        #[arg(long)]
        headline: bool,
        /// A subject line.
        #[arg(long, value_name = "S")]
        subject: Option<String>,
    },
    /// Server statistics: version, uptime, sessions, storage queues.
    Stats,
    /// Health: whether the server is up and ready (exit 0 only when ready).
    Status,
}

/// `starling ctl users …`.
#[derive(Subcommand, Debug)]
pub enum UsersCommand {
    /// List a domain's accounts (all pages, or one with --limit).
    List {
        /// The domain (default: the server's first).
        domain: Option<String>,
        /// Only this many, starting after --after.
        #[arg(long)]
        limit: Option<u32>,
        /// Start after this user name.
        #[arg(long)]
        after: Option<String>,
    },
    /// Create an account (password generated and printed unless given).
    Add {
        /// user@domain
        jid: String,
        /// The password (visible in process lists; leave it out to have
        /// one generated).
        #[arg(long)]
        password: Option<String>,
        /// Allow a domain the server does not serve.
        #[arg(long)]
        force: bool,
    },
    /// Delete an account and its data; its sessions are closed.
    Del {
        /// user@domain
        jid: String,
    },
    /// Change an account's password (generated and printed unless given).
    Passwd {
        /// user@domain
        jid: String,
        /// The new password.
        #[arg(long)]
        password: Option<String>,
    },
    /// Ban an account: it cannot log in and its sessions are closed.
    Ban {
        /// user@domain
        jid: String,
        /// Shown to its clients as the stream error's text.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Lift a ban.
    Unban {
        /// user@domain
        jid: String,
    },
    /// Show an account: banned or not, its sessions, its offline queue.
    Show {
        /// user@domain
        jid: String,
    },
}

/// `starling ctl sessions …`.
#[derive(Subcommand, Debug)]
pub enum SessionsCommand {
    /// List the sessions of every cluster node (or one account's, with
    /// --user; one node's, with --node).
    List {
        /// Only this account's sessions.
        #[arg(long)]
        user: Option<String>,
        /// Only this node's sessions: a node id, or `local`.
        #[arg(long)]
        node: Option<String>,
    },
    /// Close a session (user@domain/resource) or all of an account's.
    Kick {
        /// A full or bare JID.
        jid: String,
        /// Shown to the client as the stream error's text.
        #[arg(long)]
        reason: Option<String>,
    },
}

/// `starling ctl domains …`.
#[derive(Subcommand, Debug)]
pub enum DomainsCommand {
    /// List every domain with its source, state and settings.
    List,
    /// Add a domain (served at once; enabled unless --disabled).
    /// Example: starling ctl domains add chat.example.net registration=off
    Add {
        /// The domain.
        name: String,
        /// Store it without serving it yet.
        #[arg(long)]
        disabled: bool,
        /// Settings, key=value: registration=on|off,
        /// archive_retention_days=N, max_sessions=N, certificate=PATH,
        /// private_key=PATH (paths on the server's machine),
        /// disabled_modules=mam,inbox,muc (none: all running modules).
        #[arg(value_name = "KEY=VALUE")]
        settings: Vec<String>,
    },
    /// Stop serving a domain, keeping its data (its sessions are closed).
    Disable {
        /// The domain.
        name: String,
    },
    /// Serve a disabled domain again.
    Enable {
        /// The domain.
        name: String,
    },
    /// Remove a domain: not served from now on, all its data deleted by
    /// the server in the background.
    Remove {
        /// The domain.
        name: String,
        /// Wait until the deletion is finished, printing its progress.
        #[arg(long)]
        wait: bool,
    },
    /// Change settings (key=value; the value `default` removes an
    /// override), leaving the others as they are.
    Set {
        /// The domain.
        name: String,
        /// key=value …
        #[arg(required = true, value_name = "KEY=VALUE")]
        settings: Vec<String>,
    },
}

/// `starling ctl rooms …`.
#[derive(Subcommand, Debug)]
pub enum RoomsCommand {
    /// List rooms (all pages, or one with --limit): those loaded on this
    /// node and the stored (persistent) ones.
    List {
        /// Only this service (conference.DOMAIN); default: every served
        /// domain's.
        service: Option<String>,
        /// Only this many, starting after --after.
        #[arg(long)]
        limit: Option<u32>,
        /// Start after this room JID.
        #[arg(long)]
        after: Option<String>,
    },
    /// Show a room: configuration, affiliations, occupants.
    Show {
        /// room@service
        jid: String,
    },
    /// Create a room owned by an account, unlocked, without anyone
    /// entering.
    Create {
        /// room@service
        jid: String,
        /// Its owner: an account of this server.
        #[arg(long, value_name = "JID")]
        owner: String,
        /// Its name.
        #[arg(long)]
        name: Option<String>,
        /// Temporary: ends with its last occupant (it waits
        /// idle_unload_secs for the first).
        #[arg(long)]
        temporary: bool,
        /// Listed in the service's room list (else the service default).
        #[arg(long, conflicts_with = "hidden")]
        public: bool,
        /// Not listed in the service's room list.
        #[arg(long)]
        hidden: bool,
        /// Only members may enter.
        #[arg(long)]
        members_only: bool,
    },
    /// Destroy a room: its occupants are told (with the reason), its
    /// stored data and archive are deleted.
    Destroy {
        /// room@service
        jid: String,
        /// Given to the occupants.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Set an affiliation: owner, admin, member, outcast (banned) or none.
    Affiliation {
        /// room@service
        jid: String,
        /// user@domain (or a domain).
        user: String,
        /// owner, admin, member, outcast or none.
        affiliation: String,
        /// Shown to the occupant.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Send a message from the room itself to its occupants.
    Message {
        /// room@service
        jid: String,
        /// The message text.
        text: String,
    },
}

/// One room of a list as a line: JID, flags, occupants, node, name.
fn room_line(r: &Value) -> String {
    let flag = |k: &str, yes: &'static str, no: &'static str| {
        if r[k] == json!(true) {
            yes
        } else {
            no
        }
    };
    let mut l = format!(
        "{}  {}  {}  {}{}  {} occupant(s)  node {}",
        r["jid"].as_str().unwrap_or("?"),
        flag("persistent", "persistent", "temporary"),
        flag("public", "public", "hidden"),
        flag("members_only", "members-only", "open"),
        flag("locked", ", locked", ""),
        // A list's count, or a room's occupant list.
        r["occupants"]
            .as_array()
            .map_or_else(|| r["occupants"].clone(), |o| json!(o.len())),
        r["node"],
    );
    match r["name"].as_str() {
        Some(n) if !n.is_empty() => l.push_str(&format!("  name {n:?}")),
        _ => {}
    }
    l
}

/// A room's details as lines.
fn room_text(r: &Value) -> String {
    let mut out = room_line(r);
    if r["loaded"] != json!(true) {
        out.push_str("  (not loaded on this node)");
    }
    for (k, label) in [("subject", "subject"), ("description", "description")] {
        if let Some(v) = r[k].as_str().filter(|v| !v.is_empty()) {
            out.push_str(&format!("\n{label}: {v}"));
        }
    }
    for aff in ["owner", "admin", "member", "outcast"] {
        let list: Vec<&str> = r["affiliations"][aff]
            .as_array()
            .map(|l| l.iter().filter_map(|e| e["jid"].as_str()).collect())
            .unwrap_or_default();
        if !list.is_empty() {
            out.push_str(&format!("\n{aff}s: {}", list.join(", ")));
        }
    }
    for o in r["occupants"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\noccupant {}  {}  {}  {}",
            o["nick"].as_str().unwrap_or("?"),
            o["role"].as_str().unwrap_or("?"),
            o["affiliation"].as_str().unwrap_or("?"),
            o["jid"].as_str().unwrap_or("?"),
        ));
    }
    out
}

/// What a change answered: its text, or that another node got it.
fn room_change_text(v: &Value, done: impl FnOnce() -> String) -> String {
    match v["node"].as_u64().filter(|_| v["status"].is_string()) {
        Some(node) => {
            format!("handed to cluster node {node}, which runs the room (its log has the outcome)")
        }
        None => done(),
    }
}

async fn rooms(a: &CtlArgs, client: &Client, cmd: &RoomsCommand) -> Result<(), Failure> {
    let path = |jid: &str, rest: &str| format!("/api/v1/rooms/{}{rest}", enc(jid));
    match cmd {
        RoomsCommand::List {
            service,
            limit,
            after,
        } => {
            let mut after = after.clone().unwrap_or_default();
            let mut all = Vec::new();
            loop {
                let page = limit.unwrap_or(1000).clamp(1, 1000);
                let mut p = format!("/api/v1/rooms?limit={page}&after={}", enc(&after));
                if let Some(s) = service {
                    p.push_str(&format!("&service={}", enc(s)));
                }
                let v = client.call("GET", &p, None).await?;
                for r in v["rooms"].as_array().into_iter().flatten() {
                    if a.json {
                        all.push(r.clone());
                    } else {
                        line(&room_line(r));
                    }
                }
                match v["next"].as_str() {
                    Some(n) if limit.is_none() => after = n.to_owned(),
                    _ => break,
                }
            }
            if a.json {
                line(&json!({ "rooms": all }).to_string());
            }
        }
        RoomsCommand::Show { jid } => {
            let v = client.call("GET", &path(jid, ""), None).await?;
            print(a, &v, || room_text(&v));
        }
        RoomsCommand::Create {
            jid,
            owner,
            name,
            temporary,
            public,
            hidden,
            members_only,
        } => {
            let mut body = json!({ "jid": jid, "owner": owner, "persistent": !temporary });
            if let Some(n) = name {
                body["name"] = json!(n);
            }
            if *public || *hidden {
                body["public"] = json!(*public);
            }
            if *members_only {
                body["members_only"] = json!(true);
            }
            let v = client.call("POST", "/api/v1/rooms", Some(body)).await?;
            print(a, &v, || {
                room_change_text(&v, || format!("created {}", room_line(&v)))
            });
        }
        RoomsCommand::Destroy { jid, reason } => {
            let mut p = path(jid, "");
            if let Some(r) = reason {
                p.push_str(&format!("?reason={}", enc(r)));
            }
            let v = client.call("DELETE", &p, None).await?;
            print(a, &v, || {
                room_change_text(&v, || format!("destroyed {jid}"))
            });
        }
        RoomsCommand::Affiliation {
            jid,
            user,
            affiliation,
            reason,
        } => {
            let mut body = json!({ "affiliation": affiliation });
            if let Some(r) = reason {
                body["reason"] = json!(r);
            }
            let p = path(jid, &format!("/affiliations/{}", enc(user)));
            let v = client.call("PUT", &p, Some(body)).await?;
            print(a, &v, || {
                room_change_text(&v, || format!("{user} is now {affiliation} in {jid}"))
            });
        }
        RoomsCommand::Message { jid, text } => {
            let v = client
                .call(
                    "POST",
                    &path(jid, "/messages"),
                    Some(json!({ "body": text })),
                )
                .await?;
            print(a, &v, || {
                room_change_text(&v, || {
                    format!("sent to {jid} (id {})", v["id"].as_str().unwrap_or(""))
                })
            });
        }
    }
    Ok(())
}

/// `key=value` arguments as a JSON object of strings.
fn settings_object(args: &[String]) -> Result<Value, Failure> {
    let mut m = serde_json::Map::new();
    for a in args {
        let (k, v) = a.split_once('=').ok_or_else(|| {
            Failure::Usage(format!("{a:?}: write key=value, e.g. registration=off"))
        })?;
        m.insert(k.trim().to_owned(), json!(v.trim()));
    }
    Ok(Value::Object(m))
}

/// One domain as a line: name, state, source, settings.
fn domain_line(d: &Value) -> String {
    let mut l = format!(
        "{}  {}  {}",
        d["name"].as_str().unwrap_or("?"),
        d["state"].as_str().unwrap_or("?"),
        d["source"].as_str().unwrap_or("?")
    );
    let settings: Vec<String> = d["settings"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| match v {
            Value::Bool(b) => format!("{k}={}", if *b { "on" } else { "off" }),
            Value::String(s) => format!("{k}={s}"),
            v => format!("{k}={v}"),
        })
        .collect();
    if !settings.is_empty() {
        l.push_str("  ");
        l.push_str(&settings.join(" "));
    }
    if let Some(n) = d["removal"]["accounts_deleted"].as_u64() {
        l.push_str(&format!("  ({n} accounts deleted so far)"));
    }
    l
}

async fn domains(a: &CtlArgs, client: &Client, cmd: &DomainsCommand) -> Result<(), Failure> {
    let path = |name: &str, rest: &str| format!("/api/v1/domains/{}{rest}", enc(name));
    match cmd {
        DomainsCommand::List => {
            let v = client.call("GET", "/api/v1/domains", None).await?;
            if a.json {
                line(&v.to_string());
            } else {
                for d in v["domains"].as_array().into_iter().flatten() {
                    line(&domain_line(d));
                }
            }
        }
        DomainsCommand::Add {
            name,
            disabled,
            settings,
        } => {
            let body = json!({ "name": name, "enabled": !disabled, "settings": settings_object(settings)? });
            let v = client.call("POST", "/api/v1/domains", Some(body)).await?;
            print(a, &v, || format!("added {}", domain_line(&v)));
        }
        DomainsCommand::Disable { name } => {
            let v = client.call("POST", &path(name, "/disable"), None).await?;
            print(a, &v, || {
                format!("disabled {name}: its sessions are closed, its data is kept")
            });
        }
        DomainsCommand::Enable { name } => {
            let v = client.call("POST", &path(name, "/enable"), None).await?;
            print(a, &v, || format!("enabled {name}"));
        }
        DomainsCommand::Remove { name, wait } => {
            let v = client.call("DELETE", &path(name, ""), None).await?;
            if !wait {
                print(a, &v, || {
                    format!("removing {name}: its data is deleted in the background (`starling ctl domains list` shows progress)")
                });
                return Ok(());
            }
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                match client.call("GET", &path(name, ""), None).await {
                    Err(Failure::Server(404, _)) => break,
                    Err(e) => return Err(e),
                    Ok(d) => {
                        if !a.json {
                            if let Some(n) = d["removal"]["accounts_deleted"].as_u64() {
                                line(&format!("{name}: {n} accounts deleted so far"));
                            }
                        }
                    }
                }
            }
            print(a, &json!({ "name": name, "removed": true }), || {
                format!("removed {name}")
            });
        }
        DomainsCommand::Set { name, settings } => {
            let v = client
                .call(
                    "PATCH",
                    &path(name, "/settings"),
                    Some(settings_object(settings)?),
                )
                .await?;
            print(a, &v, || domain_line(&v));
        }
    }
    Ok(())
}

/// Why a request failed.
enum Failure {
    /// Nothing answered (or the answer was not HTTP).
    Connect(String),
    /// The server answered with an error.
    Server(u16, String),
    /// The command line was wrong.
    Usage(String),
}

/// Runs a `ctl` command; returns the process exit code.
pub async fn run(args: CtlArgs) -> u8 {
    let result = execute(&args).await;
    match result {
        Ok(()) => EXIT_OK,
        Err(Failure::Usage(m)) => {
            eprintln!("starling ctl: {m}");
            EXIT_USAGE
        }
        Err(Failure::Server(status, m)) => {
            eprintln!("starling ctl: the server answered {status}: {m}");
            EXIT_SERVER
        }
        Err(Failure::Connect(m)) => {
            eprintln!(
                "starling ctl: cannot reach the admin API at {}: {m}. Is the server running, is [admin] listen set to this address (the default is 127.0.0.1:5290), and is --url right?",
                args.url
            );
            EXIT_CONNECT
        }
    }
}

/// Prints a line; a closed standard output ends quietly.
fn line(s: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{s}");
}

pub(crate) use crate::modules::common::admin_api::percent_encode as enc;

async fn execute(a: &CtlArgs) -> Result<(), Failure> {
    let client = Client::new(a)?;
    match &a.command {
        CtlCommand::Status => {
            let (status, body) = client.request("GET", "/health/ready", None, false).await?;
            if a.json {
                line(&body.to_string());
            } else if status == 200 {
                line("ready");
            } else {
                line(&format!(
                    "not ready: {}",
                    body["reason"].as_str().unwrap_or("unknown")
                ));
            }
            if status == 200 {
                Ok(())
            } else {
                Err(Failure::Server(status, "not ready".into()))
            }
        }
        CtlCommand::Stats => {
            let v = client.call("GET", "/api/v1/stats", None).await?;
            if a.json {
                line(&v.to_string());
                return Ok(());
            }
            line(&format!(
                "Starling {} node {} up {}s",
                v["version"].as_str().unwrap_or("?"),
                v["node"],
                v["uptime_secs"]
            ));
            line(&format!(
                "sessions: {} on this node, {} in all",
                v["sessions"]["this_node"], v["sessions"]["all_nodes"]
            ));
            line(&format!(
                "storage: {}",
                v["storage"].as_str().unwrap_or("?")
            ));
            if let Some(q) = v["write_behind"].as_object() {
                for (name, q) in q {
                    line(&format!(
                        "queue {name}: {} queued, {} written, {} dropped",
                        q["queued"], q["written"], q["dropped"]
                    ));
                }
            }
            Ok(())
        }
        CtlCommand::Send {
            jid,
            text,
            headline,
            subject,
        } => {
            let mut body = json!({
                "to": jid, "body": text,
                "type": if *headline { "headline" } else { "chat" },
            });
            if let Some(s) = subject {
                body["subject"] = json!(s);
            }
            let v = client.call("POST", "/api/v1/messages", Some(body)).await?;
            print(a, &v, || {
                format!("sent to {jid} (id {})", v["id"].as_str().unwrap_or(""))
            });
            Ok(())
        }
        CtlCommand::Sessions(SessionsCommand::List { user, node }) => {
            let mut after = String::new();
            let mut all = Vec::new();
            loop {
                let mut path = format!("/api/v1/sessions?limit=1000&after={}", enc(&after));
                if let Some(u) = user {
                    path.push_str(&format!("&user={}", enc(u)));
                }
                if let Some(n) = node {
                    path.push_str(&format!("&node={}", enc(n)));
                }
                let v = client.call("GET", &path, None).await?;
                all.extend(v["sessions"].as_array().cloned().unwrap_or_default());
                match v["next"].as_str() {
                    Some(n) => after = n.to_owned(),
                    None => break,
                }
            }
            if a.json {
                line(&json!({ "sessions": all }).to_string());
                return Ok(());
            }
            for s in &all {
                let mut l = s["jid"].as_str().unwrap_or("?").to_owned();
                if let Some(ip) = s["ip"].as_str() {
                    l.push_str(&format!("  {ip}"));
                }
                if let Some(t) = s["tls"].as_bool() {
                    l.push_str(if t { "  tls" } else { "  plain" });
                }
                if let Some(st) = s["state"].as_str() {
                    l.push_str(&format!("  {st}"));
                }
                if let Some(t) = s["transport"].as_str() {
                    l.push_str(&format!("  {t}"));
                }
                if let Some(since) = s["since"].as_str() {
                    l.push_str(&format!("  since {since}"));
                }
                l.push_str(&format!("  node {}", s["node"]));
                line(&l);
            }
            Ok(())
        }
        CtlCommand::Sessions(SessionsCommand::Kick { jid, reason }) => {
            let mut body = json!({ "jid": jid });
            if let Some(r) = reason {
                body["reason"] = json!(r);
            }
            let v = client
                .call("POST", "/api/v1/sessions/kick", Some(body))
                .await?;
            print(a, &v, || {
                let list: Vec<&str> = v["kicked"]
                    .as_array()
                    .map(|l| l.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                format!("closed {}", list.join(", "))
            });
            Ok(())
        }
        CtlCommand::Users(cmd) => users(a, &client, cmd).await,
        CtlCommand::Domains(cmd) => domains(a, &client, cmd).await,
        CtlCommand::Rooms(cmd) => rooms(a, &client, cmd).await,
    }
}

fn print(a: &CtlArgs, v: &Value, human: impl FnOnce() -> String) {
    if a.json {
        line(&v.to_string());
    } else {
        line(&human());
    }
}

async fn users(a: &CtlArgs, client: &Client, cmd: &UsersCommand) -> Result<(), Failure> {
    match cmd {
        UsersCommand::List {
            domain,
            limit,
            after,
        } => {
            let mut after = after.clone().unwrap_or_default();
            let mut users = Vec::new();
            loop {
                let page = limit.unwrap_or(1000).clamp(1, 1000);
                let mut path = format!("/api/v1/users?limit={page}&after={}", enc(&after));
                if let Some(d) = domain {
                    path.push_str(&format!("&domain={}", enc(d)));
                }
                let v = client.call("GET", &path, None).await?;
                for u in v["users"].as_array().into_iter().flatten() {
                    if a.json {
                        users.push(u.clone());
                    } else {
                        line(u.as_str().unwrap_or("?"));
                    }
                }
                match v["next"].as_str() {
                    Some(n) if limit.is_none() => after = n.to_owned(),
                    _ => break,
                }
            }
            if a.json {
                line(&json!({ "users": users }).to_string());
            }
            Ok(())
        }
        UsersCommand::Add {
            jid,
            password,
            force,
        } => {
            let mut body = json!({ "jid": jid, "force": force });
            if let Some(p) = password {
                body["password"] = json!(p);
            }
            let v = client.call("POST", "/api/v1/users", Some(body)).await?;
            print(a, &v, || match v["password"].as_str() {
                Some(p) => format!("created {jid} with password: {p}"),
                None => format!("created {jid}"),
            });
            Ok(())
        }
        UsersCommand::Del { jid } => {
            let v = client
                .call("DELETE", &format!("/api/v1/users/{}", enc(jid)), None)
                .await?;
            print(a, &v, || {
                format!("deleted {jid} ({} session(s) closed)", v["sessions_closed"])
            });
            Ok(())
        }
        UsersCommand::Passwd { jid, password } => {
            let body = match password {
                Some(p) => json!({ "password": p }),
                None => json!({}),
            };
            let v = client
                .call(
                    "POST",
                    &format!("/api/v1/users/{}/password", enc(jid)),
                    Some(body),
                )
                .await?;
            print(a, &v, || match v["password"].as_str() {
                Some(p) => format!("new password for {jid}: {p}"),
                None => format!("password changed for {jid}"),
            });
            Ok(())
        }
        UsersCommand::Ban { jid, reason } => {
            let body = match reason {
                Some(r) => json!({ "reason": r }),
                None => json!({}),
            };
            let v = client
                .call(
                    "POST",
                    &format!("/api/v1/users/{}/ban", enc(jid)),
                    Some(body),
                )
                .await?;
            print(a, &v, || {
                format!("banned {jid} ({} session(s) closed)", v["sessions_closed"])
            });
            Ok(())
        }
        UsersCommand::Unban { jid } => {
            let v = client
                .call(
                    "POST",
                    &format!("/api/v1/users/{}/unban", enc(jid)),
                    Some(json!({})),
                )
                .await?;
            print(a, &v, || format!("unbanned {jid}"));
            Ok(())
        }
        UsersCommand::Show { jid } => {
            let v = client
                .call("GET", &format!("/api/v1/users/{}", enc(jid)), None)
                .await?;
            print(a, &v, || {
                let sessions: Vec<&str> = v["sessions"]
                    .as_array()
                    .map(|l| l.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                format!(
                    "{jid}: {}, {} offline message(s), sessions: {}",
                    if v["disabled"] == json!(true) {
                        "banned"
                    } else {
                        "active"
                    },
                    v["offline_messages"],
                    if sessions.is_empty() {
                        "none".to_owned()
                    } else {
                        sessions.join(", ")
                    }
                )
            });
            Ok(())
        }
    }
}

/// One admin listener, one request per connection.
struct Client {
    /// `host:port` to connect to and send as `Host`.
    authority: String,
    token: Option<String>,
    timeout: Duration,
}

impl Client {
    fn new(a: &CtlArgs) -> Result<Client, Failure> {
        let rest = a.url.strip_prefix("http://").ok_or_else(|| {
            Failure::Usage(format!(
                "--url {:?} must start with http:// (the admin listener is plain HTTP; put a TLS proxy in front for remote use)",
                a.url
            ))
        })?;
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') {
            return Err(Failure::Usage(format!(
                "--url {:?} must be http://HOST:PORT, without a path",
                a.url
            )));
        }
        let token = a
            .token
            .clone()
            .or_else(|| std::env::var(TOKEN_ENV).ok())
            .filter(|t| !t.is_empty());
        Ok(Client {
            authority: authority.to_owned(),
            token,
            timeout: Duration::from_secs(a.timeout.max(1)),
        })
    }

    /// An API call: the JSON answer of a 2xx, else [`Failure::Server`]
    /// with the server's message.
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, Failure> {
        if self.token.is_none() {
            return Err(Failure::Usage(format!(
                "no token: pass --token or set {TOKEN_ENV} (create one with `starling admin token create --name NAME` on the server's machine)"
            )));
        }
        let (status, v) = self.request(method, path, body, true).await?;
        if (200..300).contains(&status) {
            Ok(v)
        } else {
            Err(Failure::Server(
                status,
                v["error"]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| v.to_string()),
            ))
        }
    }

    async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        auth: bool,
    ) -> Result<(u16, Value), Failure> {
        tokio::time::timeout(self.timeout, self.exchange(method, path, body, auth))
            .await
            .map_err(|_| {
                Failure::Connect(format!("no answer within {} s", self.timeout.as_secs()))
            })?
    }

    async fn exchange(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        auth: bool,
    ) -> Result<(u16, Value), Failure> {
        let mut tcp = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|e| Failure::Connect(e.to_string()))?;
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAccept: application/json\r\nUser-Agent: starling-ctl/{}\r\n",
            self.authority,
            env!("CARGO_PKG_VERSION")
        );
        if auth {
            if let Some(t) = &self.token {
                req.push_str(&format!("Authorization: Bearer {t}\r\n"));
            }
        }
        if !body.is_empty() {
            req.push_str("Content-Type: application/json\r\n");
        }
        req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
        tcp.write_all(req.as_bytes())
            .await
            .map_err(|e| Failure::Connect(e.to_string()))?;
        let mut raw = Vec::new();
        tcp.read_to_end(&mut raw)
            .await
            .map_err(|e| Failure::Connect(e.to_string()))?;
        let (status, body) = parse_response(&raw)
            .ok_or_else(|| Failure::Connect("the answer is not HTTP".into()))?;
        let v = serde_json::from_slice(&body).unwrap_or_else(
            |_| json!({ "error": String::from_utf8_lossy(&body).trim().to_owned() }),
        );
        Ok((status, v))
    }
}

/// The status and body of an HTTP/1.1 response read to its end
/// (`Content-Length`, chunked, or until the connection closed).
fn parse_response(raw: &[u8]) -> Option<(u16, Vec<u8>)> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..split]).ok()?;
    let rest = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()?
        .strip_prefix("HTTP/1.")?
        .get(2..5)?
        .parse()
        .ok()?;
    let mut chunked = false;
    let mut length = None;
    for l in lines {
        let (k, v) = l.split_once(':')?;
        let v = v.trim();
        if k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked") {
            chunked = true;
        } else if k.eq_ignore_ascii_case("content-length") {
            length = v.parse::<usize>().ok();
        }
    }
    let body = if chunked {
        let mut out = Vec::new();
        let mut r = rest;
        loop {
            let end = r.windows(2).position(|w| w == b"\r\n")?;
            let size_text = std::str::from_utf8(&r[..end]).ok()?;
            let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
            r = &r[end + 2..];
            if size == 0 {
                break;
            }
            out.extend_from_slice(r.get(..size)?);
            r = r.get(size + 2..)?;
        }
        out
    } else {
        match length {
            Some(n) => rest.get(..n)?.to_vec(),
            None => rest.to_vec(),
        }
    };
    Some((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_parsed_with_length_chunks_or_close() {
        let r = b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_response(r), Some((401, b"{}".to_vec())));
        let r = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_response(r), Some((200, b"abcde".to_vec())));
        let r = b"HTTP/1.0 503 x\r\n\r\nrest";
        assert_eq!(parse_response(r), Some((503, b"rest".to_vec())));
        assert_eq!(parse_response(b"SSH-2.0-OpenSSH\r\n\r\n"), None);
    }

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(enc("alice@example.org"), "alice@example.org");
        assert_eq!(enc("a/b c"), "a%2Fb%20c");
        assert_eq!(enc("../x"), "..%2Fx");
    }
}
