//! `starling archive …`: message archive maintenance (docs/mam.md).

use crate::command::{open_storage, parse_account};
use crate::config::Config;
use crate::out;
use anyhow::Context;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum ArchiveCommand {
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

pub async fn run(cfg: Config, cmd: ArchiveCommand) -> anyhow::Result<()> {
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
            let mam = cfg.modules.get::<super::Mam>();
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
                let n = super::purge_domain(storage.archive.as_ref(), d, days).await?;
                out!("{d}: deleted {n} message(s) older than {days} day(s)")?;
            }
            Ok(())
        }
    };
    storage.backend.close().await;
    result
}
