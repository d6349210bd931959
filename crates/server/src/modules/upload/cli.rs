//! `starling upload purge`: expired and over-quota uploads (docs/upload.md).

use crate::config::Config;
use crate::{note, out};
use anyhow::{bail, Context};
use clap::Subcommand;

#[derive(Subcommand)]
pub enum UploadCommand {
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

/// `upload …`.
pub async fn run(cfg: Config, cmd: UploadCommand) -> anyhow::Result<()> {
    use super::{purge, upload_dir, PurgePolicy, PurgeReport};
    let UploadCommand::Purge {
        older_than_days,
        dry_run,
    } = cmd;
    let up = cfg.modules.get::<super::Upload>();
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
