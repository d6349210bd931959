//! `starling room …`: group-chat rooms in storage (docs/muc.md).

use super::{stored_config_for_cli, stored_config_summary, CliRoom, Muc, StoredConfigSummary};
use crate::command::{open_storage, serves};
use crate::config::Config;
use crate::{note, out};
use anyhow::{bail, Context};
use clap::Subcommand;
use starling_core::storage::Storage;
use starling_proto::{BareJid, Jid};
use std::io::{BufRead, IsTerminal};

#[derive(Subcommand)]
pub enum RoomCommand {
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
pub struct RoomLine {
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
pub async fn run(cfg: Config, cmd: RoomCommand) -> anyhow::Result<()> {
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
pub(crate) const ROOM_PAGE: u32 = 500;

async fn room_list(
    storage: &Storage,
    cfg: &Config,
    service: Option<String>,
    json: bool,
) -> anyhow::Result<()> {
    let muc = super::store::open(storage);
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
            let page = muc.rooms(service, after.as_deref(), ROOM_PAGE).await?;
            let Some(last) = page.last() else { break };
            after = last.jid.node().map(|n| n.as_str().to_owned());
            for r in &page {
                let owners = muc
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
    use super::store::{RoomAffiliation, StoredRoom};
    let muc = super::store::open(storage);
    let jid = parse_room(jid, cfg)?;
    check_muc_service(cfg, jid.domain().as_str(), true)?;
    if !cfg.modules.is_enabled("muc") {
        bail!("group chat is off ([modules.muc] enabled = false): enable it, or nobody could enter the room");
    }
    let owner = parse_owner(owner)?;
    let svc = cfg.modules.get::<Muc>();
    let config = stored_config_for_cli(svc, opts)
        .map_err(|e| anyhow::anyhow!("cannot create {jid}: {e}"))?;
    if let Some(existing) = muc.room(&jid).await? {
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
        let owned = muc
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
    muc.put_room(&StoredRoom {
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
    if let Err(e) = muc.set_affiliations(&jid, &[owner_row]).await {
        // No room without its owner.
        let _ = muc.delete_room(&jid).await;
        return Err(e.into());
    }
    out!("created {jid} (owner {owner})")?;
    Ok(())
}

async fn room_destroy(storage: &Storage, cfg: &Config, jid: &str, yes: bool) -> anyhow::Result<()> {
    let muc = super::store::open(storage);
    let jid = parse_room(jid, cfg)?;
    check_muc_service(cfg, jid.domain().as_str(), false)?;
    if muc.room(&jid).await?.is_none() {
        bail!(
            "no stored room {jid}: see `starling room list --service {}` (a temporary room lives only in the running server; its owner destroys it through XMPP)",
            jid.domain()
        );
    }
    let affiliations = muc.affiliations(&jid).await?;
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
    muc.delete_room(&jid).await?;
    out!(
        "destroyed {jid}: {} affiliation(s) and {messages} archived message(s) deleted",
        affiliations.len()
    )?;
    Ok(())
}
