//! The upload store on disk: each slot's `meta.json` and file, the
//! in-memory index of who stored what (quotas), and the scan that expires
//! files (the hourly sweep and `starling upload purge`).

use super::*;

/// `meta.json` of a slot. Versioned: a file of a newer format is left
/// alone (never served, never deleted).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Meta {
    /// The format version ([`META_VERSION`]).
    pub(super) v: u32,
    /// The uploader's bare JID.
    pub(super) owner: String,
    /// The normalised file name (the URL's last segment, decoded).
    pub(super) filename: String,
    /// The announced and, once uploaded, actual size in bytes.
    pub(super) size: u64,
    /// The announced media type, served with the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) content_type: Option<String>,
    /// Unix seconds the slot was issued.
    pub(super) created: u64,
    /// Unix seconds the upload completed; absent while the slot is unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) uploaded: Option<u64>,
    /// Unix seconds from which an ephemeral upload (§5.3) is never served
    /// again, whatever `expire_after_days` says (format 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) expire_before: Option<u64>,
}

/// When an uploaded file stops being served: `expire_after` past its
/// upload, or its ephemeral deadline if sooner (`None`: never).
pub(super) fn file_expires(
    uploaded: u64,
    expire_before: Option<u64>,
    expire_after: Option<Duration>,
) -> Option<u64> {
    let after = expire_after.map(|d| uploaded.saturating_add(d.as_secs()));
    match (after, expire_before) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// One slot in the quota index.
#[derive(Clone, Debug)]
pub(super) struct IndexEntry {
    pub(super) slot: String,
    pub(super) size: u64,
    pub(super) created: u64,
    pub(super) uploaded: Option<u64>,
    pub(super) expire_before: Option<u64>,
}

/// Each owner's slots, for the quota: rebuilt from disk at start and by
/// each sweep; slots issued and uploads completed in between are added as
/// they happen.
#[derive(Default)]
pub(super) struct Index {
    pub(super) by_owner: HashMap<String, Vec<IndexEntry>>,
    /// Bytes of every entry: what `quota_total` counts. Files that expire
    /// keep counting until the sweep that removes them.
    pub(super) bytes: u64,
}

impl Index {
    pub(super) fn insert(&mut self, owner: &str, e: IndexEntry) {
        let v = self.by_owner.entry(owner.to_owned()).or_default();
        self.bytes += e.size;
        match v.iter_mut().find(|x| x.slot == e.slot) {
            Some(x) => {
                self.bytes -= x.size;
                *x = e;
            }
            None => v.push(e),
        }
    }

    pub(super) fn remove(&mut self, owner: &str, slot: &str) {
        if let Some(v) = self.by_owner.get_mut(owner) {
            // A slot is indexed once (`insert` replaces); order is not kept.
            if let Some(i) = v.iter().position(|e| e.slot == slot) {
                self.bytes -= v.swap_remove(i).size;
            }
            if v.is_empty() {
                self.by_owner.remove(owner);
            }
        }
    }

    pub(super) fn mark_uploaded(&mut self, owner: &str, slot: &str, at: u64) {
        if let Some(e) = self
            .by_owner
            .get_mut(owner)
            .and_then(|v| v.iter_mut().find(|e| e.slot == slot))
        {
            e.uploaded = Some(at);
        }
    }

    /// Files and bytes indexed.
    pub(super) fn totals(&self) -> (usize, u64) {
        self.by_owner
            .values()
            .flatten()
            .fold((0, 0), |(n, b), e| (n + 1, b + e.size))
    }
}

/// When an indexed slot stops counting for the quota: an unused slot when
/// its PUT URL expires, a file when it expires (`None`: never).
pub(super) fn counts_until(
    e: &IndexEntry,
    expire_after: Option<Duration>,
    slot_timeout: Duration,
) -> Option<u64> {
    match e.uploaded {
        Some(t) => file_expires(t, e.expire_before, expire_after),
        None => Some(e.created + slot_timeout.as_secs()),
    }
}

pub(super) const META_FILE: &str = "meta.json";
pub(super) const DATA_FILE: &str = "file";
pub(super) const PART_FILE: &str = "file.part";

pub(super) async fn read_meta(slot_dir: &Path) -> io::Result<Meta> {
    let bytes = tokio::fs::read(slot_dir.join(META_FILE)).await?;
    serde_json::from_slice(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Writes `meta.json` through a temporary file and a rename, so a reader
/// sees the old or the new version, never part of one.
pub(super) async fn write_meta(slot_dir: &Path, meta: &Meta) -> io::Result<()> {
    let json = serde_json::to_vec(meta).map_err(io::Error::other)?;
    let tmp = slot_dir.join("meta.json.tmp");
    let mut f = private_file(&tmp, false).await?;
    f.write_all(&json).await?;
    f.sync_all().await?;
    drop(f);
    tokio::fs::rename(&tmp, slot_dir.join(META_FILE)).await
}

/// Opens `path` for writing with mode 0600, refusing an existing file when
/// `exclusive`.
pub(super) async fn private_file(path: &Path, exclusive: bool) -> io::Result<tokio::fs::File> {
    let mut o = tokio::fs::OpenOptions::new();
    o.write(true);
    if exclusive {
        o.create_new(true);
    } else {
        o.create(true).truncate(true);
    }
    #[cfg(unix)]
    o.mode(0o600);
    o.open(path).await
}

/// What [`purge`] removes.
#[derive(Clone, Debug)]
pub struct PurgePolicy {
    /// Files uploaded at least this long ago (`None`: no file).
    pub older_than: Option<Duration>,
    /// The slot timeout: slots never used are removed once twice this old
    /// (and idle, if an upload into them had begun).
    pub slot_timeout: Duration,
    /// Count what would be removed, remove nothing.
    pub dry_run: bool,
}

/// What a [`purge`] found and did.
#[derive(Clone, Debug, Default)]
pub struct PurgeReport {
    /// Slot directories looked at.
    pub scanned: u64,
    /// Uploaded files removed (or, in a dry run, that would be).
    pub files_removed: u64,
    /// Their bytes.
    pub bytes_removed: u64,
    /// Slots never used, removed.
    pub slots_removed: u64,
    /// Files kept.
    pub files_kept: u64,
    /// Their bytes.
    pub bytes_kept: u64,
    /// Slot directories that could not be read or removed (logged).
    pub errors: u64,
}

/// Removes, from the upload directory `dir`, the files `policy` says have
/// expired and the slots never used; calls `progress` every 1,000 slots.
/// Works beside a running server (which notices at its next hourly sweep).
pub async fn purge(
    dir: &Path,
    policy: &PurgePolicy,
    progress: &mut (dyn FnMut(&PurgeReport) + Send),
) -> io::Result<PurgeReport> {
    scan(dir, policy, progress).await.map(|(r, _)| r)
}

/// [`purge`], also returning the slots kept with their metadata.
pub(super) async fn scan(
    dir: &Path,
    policy: &PurgePolicy,
    progress: &mut (dyn FnMut(&PurgeReport) + Send),
) -> io::Result<(PurgeReport, Vec<(String, Meta)>)> {
    let mut report = PurgeReport::default();
    let mut kept = Vec::new();
    let mut entries = match tokio::fs::read_dir(dir).await {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((report, kept)),
        Err(e) => return Err(e),
    };
    let now = unix_now();
    let timeout = policy.slot_timeout.as_secs();
    while let Some(entry) = entries.next_entry().await? {
        let Some(slot) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        // Only our own directories; anything else is left alone.
        if !valid_slot_id(&slot) || !entry.file_type().await.is_ok_and(|t| t.is_dir()) {
            continue;
        }
        report.scanned += 1;
        if report.scanned % 1000 == 0 {
            progress(&report);
        }
        let path = entry.path();
        let meta = match read_meta(&path).await {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Being created now, or left by a crash: old ones go.
                if age_secs(&path, now).await.is_some_and(|a| a >= 2 * timeout) {
                    remove(&path, policy.dry_run, &mut report).await;
                }
                continue;
            }
            Err(e) => {
                tracing::warn!(module = NAME, slot = %path.display(), error = %e, "unreadable upload metadata; left alone");
                report.errors += 1;
                continue;
            }
        };
        if meta.v > META_VERSION {
            // Written by a newer Starling: not ours to judge.
            continue;
        }
        let expired = match meta.uploaded {
            Some(t) => {
                file_expires(t, meta.expire_before, policy.older_than).is_some_and(|e| now >= e)
            }
            None => {
                let unused = now.saturating_sub(meta.created) >= 2 * timeout;
                // An upload still arriving keeps its slot.
                let idle = age_secs(&path.join(PART_FILE), now)
                    .await
                    .is_none_or(|a| a >= timeout);
                unused && idle
            }
        };
        if expired {
            if remove(&path, policy.dry_run, &mut report).await {
                match meta.uploaded {
                    Some(_) => {
                        report.files_removed += 1;
                        report.bytes_removed += meta.size;
                    }
                    None => report.slots_removed += 1,
                }
            }
        } else {
            if meta.uploaded.is_some() {
                report.files_kept += 1;
                report.bytes_kept += meta.size;
            }
            kept.push((slot, meta));
        }
    }
    Ok((report, kept))
}

/// Seconds since `path` was last modified (`None` if it does not exist).
pub(super) async fn age_secs(path: &Path, now: u64) -> Option<u64> {
    let modified = tokio::fs::metadata(path).await.ok()?.modified().ok()?;
    let at = modified.duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(now.saturating_sub(at))
}

/// Removes a slot directory; true if it is gone (or would be).
pub(super) async fn remove(path: &Path, dry_run: bool, report: &mut PurgeReport) -> bool {
    if dry_run {
        return true;
    }
    match tokio::fs::remove_dir_all(path).await {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => true,
        Err(e) => {
            tracing::warn!(module = NAME, slot = %path.display(), error = %e, "cannot remove an expired upload");
            report.errors += 1;
            false
        }
    }
}

// ---------------------------------------------------------------------
// HTTP (§7, §8).
