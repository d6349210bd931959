//! HTTP File Upload (XEP-0363 v1.2.0, `reference/xeps/xep-0363.xml`) at
//! `upload.<domain>` (`[modules.upload]`, docs/upload.md): clients ask the
//! service for a slot over XMPP, `PUT` the file over HTTP, and share the
//! `GET` URL in a message.
//!
//! - **Discovery** (§3): a local service at `<subdomain>.<domain>`, listed
//!   in the server's disco#items; its disco#info has identity
//!   `store`/`file`, feature `urn:xmpp:http:upload:0` and the XEP-0128
//!   form with `max-file-size`; the `message` and `ephemeral` purposes
//!   (§5): an ephemeral upload is never served from its `expire-before`
//!   on.
//! - **Slots** (§4): `<request filename size content-type/>` gives a
//!   `<slot>` whose `put` and `get` URLs are the same,
//!   `{base_url}/upload/{slot}/{file name, percent-encoded}`; the slot id
//!   is 32 characters of the OS CSPRNG (160 bits), so URLs cannot be
//!   guessed (§9). Errors (§6): `not-acceptable` with `<file-too-large>`
//!   and `<max-file-size>` above `max_file_size`, `not-acceptable` for a
//!   type outside `allowed_types`, `resource-constraint` (with `<retry
//!   stamp>` when a file will expire) past `quota_per_user`, `bad-request`
//!   for a bad file name, size or type, `forbidden` for users outside
//!   `allowed`.
//! - **HTTP** (§7, §8; the routes are mounted at `/upload` on every HTTP
//!   listener through [`HttpRoutes`]): `PUT` within `slot_timeout_secs`,
//!   with exactly the announced `Content-Length` (larger: 413, other: 400,
//!   absent: 411) and the announced type if any (else 415), streamed into
//!   `file.part` beside the metadata and renamed into place when complete,
//!   once per slot (a second one: 409); `GET`/`HEAD` stream the file with
//!   its type, length, `Content-Disposition` (inline only for images, audio
//!   and video), `X-Content-Type-Options: nosniff` and a
//!   `Content-Security-Policy` that runs nothing; one byte range of a file
//!   on request (206/416, RFC 9110 §14) and 304 for a current copy
//!   (`ETag`/`Last-Modified`, §13); unknown, unfinished or expired files
//!   are 404. CORS headers on every answer and `OPTIONS`
//!   preflights, for web clients.
//! - **Storage**: none in the database. Each slot is a directory
//!   `dir/<slot>/` holding `meta.json` (format version, owner, name, size,
//!   type, when issued, when uploaded) and `file`. The per-user quota is
//!   counted from an in-memory index built by scanning `dir` at start and
//!   again by the hourly sweep, which removes files older than
//!   `expire_after_days` and slots never used; `starling upload purge` runs
//!   the same scan ([`purge`]). GET and PUT read the metadata from disk, so
//!   nodes sharing `dir` serve each other's files.
//!
//! Hooks: a [`Service`]; HTTP routes. Metrics: `starling_upload_*`
//! ([`UploadMetrics`]). Config: `[modules.upload]` enabled,
//! subdomain, max_file_size, quota_per_user, expire_after_days,
//! slot_timeout_secs, base_url, dir, allowed_types, allowed.

use crate::transport::http::HttpRoutes;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use futures_util::StreamExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use starling_core::forms::FormBuilder;
use starling_core::hooks::{HookRegistry, Service, ServiceAddress};
use starling_core::module::{ConfigProblem, Module, ModuleCtx};
use starling_core::{async_trait, Env, Held};
use starling_proto::{
    ns, BareJid, ErrorType, Stanza, StanzaError, StanzaErrorCondition, StanzaKind,
};
use starling_xml::Element;
use std::collections::HashMap;
use std::io;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::AsyncWriteExt;

const NAME: &str = "upload";
/// The protocol's namespace (its disco feature).
pub const NS_UPLOAD: &str = "urn:xmpp:http:upload:0";
/// Upload purposes (XEP-0363 §5, v1.2.0); `#message` and `#ephemeral` are
/// the ones served.
pub const NS_PURPOSE: &str = "urn:xmpp:http:upload:purpose:0";
/// Where the module's HTTP routes are mounted on every listener.
pub const HTTP_PREFIX: &str = "/upload";
/// The service's name in service discovery.
const DISPLAY_NAME: &str = "HTTP File Upload";
/// Length of a slot id: 32 characters of a 32-letter alphabet, 160 bits.
const SLOT_ID_LEN: usize = 32;
/// The alphabet of `starling_proto::random_id`, which makes slot ids.
const SLOT_ID_ALPHABET: &[u8] = b"abcdefghijkmnpqrstuvwxyz23456789";
/// The newest metadata format (`meta.json` field `v`) this server reads
/// and writes. 1: the first; 2: adds `expire_before` (an ephemeral
/// upload's deadline), so a server that knows only 1 leaves such a file
/// alone instead of serving it past its deadline. Files without a deadline
/// are still written as 1.
const META_VERSION: u32 = 2;
/// How often the running server removes expired files and unused slots.
const SWEEP_EVERY: Duration = Duration::from_secs(3600);
/// Bytes of a file read at a time by a download, straight into the chunk
/// hyper writes (two in flight per download at most: one read, one being
/// written).
const IO_CHUNK: usize = 256 * 1024;
/// An upload's write buffer: what is received is copied here and written
/// to its file with one `write` on the blocking pool. Smaller buffers mean
/// more trips to the blocking pool: 64 KiB ones, four times the trips,
/// halved the upload speed of a 100 MiB file (docs/benchmarks.md
/// 2026-11-26).
const UPLOAD_BUFFER: usize = 256 * 1024;
/// Write buffers that exist at once, shared by all uploads in flight: what
/// the bodies of every upload hold together, besides hyper's read buffer
/// of each connection (`transport::http`), however many arrive at once.
/// An upload takes one only while its body is arriving faster than it is
/// written; the rest wait in their socket buffers (the kernel's, not the
/// server's), and TCP slows their clients down.
const UPLOAD_BUFFERS: usize = 8;
/// How long an upload holding a write buffer waits for more of its body
/// before writing what it has and handing the buffer back. hyper hands a
/// body over from the connection's task a read (16 KiB at most) at a time,
/// so the next one is rarely there at once: writing whenever it was not
/// made a 100 MiB upload four times slower (one trip to the blocking pool
/// per 16 KiB).
const UPLOAD_FILL_GAP: Duration = Duration::from_millis(2);
/// `fsync`s of finished uploads at once; the others wait for their turn.
/// Each runs on a blocking-pool thread of its own: 400 uploads at once
/// ended with up to 423 threads; 16 at a time kept it near 100 and the
/// RSS growth at +31–34 MiB instead of +39, at the same speed (the file
/// system's journal takes syncs a commit at a time anyway;
/// docs/benchmarks.md 2026-11-28).
const UPLOAD_SYNCS: usize = 16;
/// The longest file name accepted, in bytes (most file systems' limit).
const MAX_FILENAME_BYTES: usize = 255;
const SECS_PER_DAY: u64 = 86_400;

/// `[modules.upload]`: XEP-0363 HTTP File Upload.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UploadConfig {
    /// Run the upload service (off by default, as in Prosody and
    /// ejabberd; Conversations, Dino, Gajim and Converse.js need it to send
    /// pictures, voice messages and files).
    pub enabled: bool,
    /// The service's subdomain of every served domain.
    pub subdomain: String,
    /// Largest file accepted, in bytes (announced in disco#info).
    pub max_file_size: u64,
    /// Bytes of unexpired files (and of slots not yet used) one account
    /// may hold; 0: no quota.
    pub quota_per_user: u64,
    /// Bytes of files (and of slots not yet used) the whole service may
    /// hold, all accounts together; 0: no limit.
    pub quota_total: u64,
    /// Days a file is kept after its upload; 0: kept until purged.
    pub expire_after_days: u64,
    /// Seconds the PUT URL of a slot is valid after the slot was issued.
    pub slot_timeout_secs: u64,
    /// The public URL of the HTTP listeners' root, e.g.
    /// `https://chat.example.org:5443`; files are at
    /// `<base_url>/upload/…`. Unset: `https://<domain>:<port>` of the
    /// first `tls = true` HTTP listener (else `http://` of the first
    /// listener), with the user's domain as host.
    pub base_url: Option<String>,
    /// Where files are kept; relative paths are under `[server] data_dir`.
    /// Unset: `<data_dir>/upload`.
    pub dir: Option<PathBuf>,
    /// Media types accepted (`image/jpeg`, or `image/*` for a whole
    /// type); empty: any.
    pub allowed_types: Vec<String>,
    /// Who may upload: `local` (accounts of every served domain), a
    /// served domain, or an account's bare JID.
    pub allowed: Vec<String>,
}

impl Default for UploadConfig {
    fn default() -> Self {
        UploadConfig {
            enabled: false,
            subdomain: "upload".into(),
            max_file_size: 100 * 1024 * 1024,
            quota_per_user: 1024 * 1024 * 1024,
            quota_total: 0,
            expire_after_days: 30,
            slot_timeout_secs: 300,
            base_url: None,
            dir: None,
            allowed_types: Vec::new(),
            allowed: vec!["local".into()],
        }
    }
}

/// Where the files of this configuration are kept.
pub fn upload_dir(cfg: &UploadConfig, data_dir: &Path) -> PathBuf {
    match &cfg.dir {
        Some(d) => data_dir.join(d),
        None => data_dir.join("upload"),
    }
}

/// The upload module.
pub struct Upload;

impl Module for Upload {
    const NAME: &'static str = NAME;
    const SUMMARY: &'static str =
        "XEP-0363 HTTP file upload at upload.<domain>: slots over XMPP, PUT/GET on the HTTP listeners, quota, expiry";
    type Config = UploadConfig;

    fn enabled(cfg: &UploadConfig) -> bool {
        cfg.enabled
    }

    fn validate(cfg: &UploadConfig, _domains: &[String]) -> Result<(), ConfigProblem> {
        crate::modules::common::check_subdomain(&cfg.subdomain, "upload")?;
        if cfg.max_file_size == 0 {
            return Err(ConfigProblem::new("max_file_size", "must be at least 1"));
        }
        if cfg.slot_timeout_secs == 0 {
            return Err(ConfigProblem::new(
                "slot_timeout_secs",
                "must be at least 1 (XEP-0363 recommends about 300)",
            ));
        }
        if let Some(url) = &cfg.base_url {
            check_base_url(url).map_err(|m| ConfigProblem::new("base_url", m))?;
        }
        for t in &cfg.allowed_types {
            let ok = MediaType::parse(t).is_some_and(|m| m.params.is_empty())
                || t.strip_suffix("/*")
                    .is_some_and(|ty| !ty.is_empty() && ty.bytes().all(is_token_byte));
            if !ok {
                return Err(ConfigProblem::new(
                    "allowed_types",
                    format!("{t:?}: a media type (\"image/jpeg\") or a whole type (\"image/*\")"),
                ));
            }
        }
        for a in &cfg.allowed {
            Allowed::parse(a).map_err(|m| ConfigProblem::new("allowed", m))?;
        }
        Ok(())
    }

    async fn start(cfg: &UploadConfig, ctx: &ModuleCtx<'_>, reg: &mut HookRegistry) {
        let dir = upload_dir(cfg, ctx.data_dir);
        if let Err(e) = starling_storage::fsperm::create_private_dir_all(&dir) {
            tracing::error!(module = NAME, dir = %dir.display(), error = %e, "cannot create the upload directory; the upload service is off");
            return;
        }
        let Some(routes) = reg.provided::<HttpRoutes>() else {
            tracing::error!(
                module = NAME,
                "this server has no HTTP listeners to serve files; the upload service is off"
            );
            return;
        };
        let base = match &cfg.base_url {
            Some(url) => BaseUrl::Fixed(url.trim_end_matches('/').to_owned()),
            None => {
                let listeners = routes.listeners();
                let Some(&(addr, tls)) = listeners
                    .iter()
                    .find(|(_, tls)| *tls)
                    .or_else(|| listeners.first())
                else {
                    tracing::error!(
                        module = NAME,
                        "no [[http.listen]] listener and no base_url; the upload service is off"
                    );
                    return;
                };
                BaseUrl::Derived {
                    https: tls,
                    port: addr.port(),
                }
            }
        };
        let plain = match &base {
            BaseUrl::Fixed(u) => u.starts_with("http://"),
            BaseUrl::Derived { https, .. } => !https,
        };
        if plain {
            tracing::warn!(
                module = NAME,
                "upload URLs are plain http://: XEP-0363 requires HTTPS, and clients may refuse them; use a tls = true listener or an https base_url"
            );
        }
        let inner = Arc::new(Inner {
            dir,
            base,
            max_file_size: cfg.max_file_size,
            quota: cfg.quota_per_user,
            quota_total: cfg.quota_total,
            expire_after: (cfg.expire_after_days > 0)
                .then(|| Duration::from_secs(cfg.expire_after_days * SECS_PER_DAY)),
            slot_timeout: Duration::from_secs(cfg.slot_timeout_secs),
            allowed_types: cfg
                .allowed_types
                .iter()
                .map(|t| t.to_ascii_lowercase())
                .collect(),
            allowed: cfg
                .allowed
                .iter()
                .filter_map(|a| Allowed::parse(a).ok())
                .collect(),
            subdomain: cfg.subdomain.clone(),
            index: Mutex::new(Index::default()),
            metrics: UploadMetrics::default(),
        });
        ctx.metrics.with_registry(|r| inner.metrics.register(r));
        let started = std::time::Instant::now();
        inner.sweep().await;
        let (files, bytes) = inner.lock_index().totals();
        tracing::info!(
            module = NAME,
            dir = %inner.dir.display(),
            files,
            bytes,
            millis = started.elapsed().as_millis() as u64,
            "upload directory scanned"
        );
        routes.mount(NAME, HTTP_PREFIX, http_routes(inner.clone()));
        // The label lives as long as the server (one per start).
        let label: &'static str = Box::leak(cfg.subdomain.clone().into_boxed_str());
        reg.service(
            NAME,
            ServiceAddress::Subdomain(label),
            DISPLAY_NAME,
            Arc::new(UploadService(inner.clone())),
        );
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + SWEEP_EVERY, SWEEP_EVERY);
            loop {
                tick.tick().await;
                // The service is gone once the server stopped.
                let Some(inner) = weak.upgrade() else { return };
                inner.sweep().await;
            }
        });
    }
}

/// Refuses base URLs that cannot prefix ours.
fn check_base_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or("must start with https:// (or http:// behind a TLS proxy)")?;
    let host = rest.split('/').next().unwrap_or("");
    if host.is_empty() {
        return Err("names no host, e.g. https://upload.example.org".into());
    }
    if url.contains(['?', '#']) || !url.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("must be a plain URL (no query, fragment, spaces or non-ASCII)".into());
    }
    Ok(())
}

/// One entry of `allowed`.
#[derive(Debug, PartialEq, Eq)]
enum Allowed {
    /// Any account of a served domain.
    Local,
    /// Accounts of this domain.
    Domain(String),
    /// This account.
    Account(BareJid),
}

impl Allowed {
    fn parse(s: &str) -> Result<Allowed, String> {
        if s == "local" {
            return Ok(Allowed::Local);
        }
        let jid = BareJid::new(s).map_err(|e| {
            format!("{s:?}: \"local\", a domain or an account's bare JID expected ({e})")
        })?;
        Ok(match jid.node() {
            None => Allowed::Domain(jid.domain().as_str().to_owned()),
            Some(_) => Allowed::Account(jid),
        })
    }
}

/// The public URL prefix of the HTTP listeners.
enum BaseUrl {
    /// `base_url` as configured (no trailing `/`).
    Fixed(String),
    /// From a listener: the user's domain as host.
    Derived {
        /// `https` rather than `http`.
        https: bool,
        /// The listener's port.
        port: u16,
    },
}

impl BaseUrl {
    fn for_domain(&self, domain: &str) -> String {
        match self {
            BaseUrl::Fixed(u) => u.clone(),
            BaseUrl::Derived { https, port } => {
                let scheme = if *https { "https" } else { "http" };
                format!("{scheme}://{domain}:{port}")
            }
        }
    }
}

/// What the service and its HTTP handlers share.
struct Inner {
    dir: PathBuf,
    base: BaseUrl,
    max_file_size: u64,
    /// 0: none.
    quota: u64,
    /// 0: none.
    quota_total: u64,
    /// `None`: files are kept.
    expire_after: Option<Duration>,
    slot_timeout: Duration,
    /// Lowercase; `type/*` entries match a whole type.
    allowed_types: Vec<String>,
    allowed: Vec<Allowed>,
    subdomain: String,
    index: Mutex<Index>,
    metrics: UploadMetrics,
}

/// Counters by one label (`result`, `status`).
type ByLabel = Family<Vec<(String, String)>, Counter>;

/// The service's metrics (registered as `starling_upload_*`,
/// docs/metrics.md).
#[derive(Clone, Default)]
struct UploadMetrics {
    /// Slot requests by `result`: granted, too_large, quota, full, refused.
    slots: ByLabel,
    /// `PUT` answers by HTTP `status`.
    puts: ByLabel,
    /// Bytes of the files stored.
    received_bytes: Counter,
    /// `PUT` bodies being received now.
    receiving: Gauge,
    /// `GET`/`HEAD` answers by HTTP `status`.
    downloads: ByLabel,
    /// Body bytes sent by downloads.
    sent_bytes: Counter,
    /// Files uploaded and not yet removed, in this node's index.
    stored_files: Gauge,
    /// Their bytes.
    stored_bytes: Gauge,
}

impl UploadMetrics {
    fn register(&self, r: &mut prometheus_client::registry::Registry) {
        r.register(
            "upload_slots",
            "HTTP upload slot requests by result (granted, too_large, quota, full, refused)",
            self.slots.clone(),
        );
        r.register(
            "upload_puts",
            "HTTP upload PUT answers by status code",
            self.puts.clone(),
        );
        r.register(
            "upload_received_bytes",
            "Bytes of the uploaded files stored",
            self.received_bytes.clone(),
        );
        r.register(
            "upload_receiving",
            "HTTP uploads receiving their body now",
            self.receiving.clone(),
        );
        r.register(
            "upload_downloads",
            "HTTP upload GET and HEAD answers by status code",
            self.downloads.clone(),
        );
        r.register(
            "upload_sent_bytes",
            "Bytes of uploaded files sent to downloaders",
            self.sent_bytes.clone(),
        );
        r.register(
            "upload_stored_files",
            "Uploaded files kept on disk (this node's index)",
            self.stored_files.clone(),
        );
        r.register(
            "upload_stored_bytes",
            "Bytes of the uploaded files kept on disk (this node's index)",
            self.stored_bytes.clone(),
        );
    }

    fn count(family: &ByLabel, label: &str, value: &str) {
        family
            .get_or_create(&vec![(label.to_owned(), value.to_owned())])
            .inc();
    }
}

/// `meta.json` of a slot. Versioned: a file of a newer format is left
/// alone (never served, never deleted).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Meta {
    /// The format version ([`META_VERSION`]).
    v: u32,
    /// The uploader's bare JID.
    owner: String,
    /// The normalised file name (the URL's last segment, decoded).
    filename: String,
    /// The announced and, once uploaded, actual size in bytes.
    size: u64,
    /// The announced media type, served with the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content_type: Option<String>,
    /// Unix seconds the slot was issued.
    created: u64,
    /// Unix seconds the upload completed; absent while the slot is unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    uploaded: Option<u64>,
    /// Unix seconds from which an ephemeral upload (§5.3) is never served
    /// again, whatever `expire_after_days` says (format 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expire_before: Option<u64>,
}

/// When an uploaded file stops being served: `expire_after` past its
/// upload, or its ephemeral deadline if sooner (`None`: never).
fn file_expires(
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
struct IndexEntry {
    slot: String,
    size: u64,
    created: u64,
    uploaded: Option<u64>,
    expire_before: Option<u64>,
}

/// Each owner's slots, for the quota: rebuilt from disk at start and by
/// each sweep; slots issued and uploads completed in between are added as
/// they happen.
#[derive(Default)]
struct Index {
    by_owner: HashMap<String, Vec<IndexEntry>>,
    /// Bytes of every entry: what `quota_total` counts. Files that expire
    /// keep counting until the sweep that removes them.
    bytes: u64,
}

impl Index {
    fn insert(&mut self, owner: &str, e: IndexEntry) {
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

    fn remove(&mut self, owner: &str, slot: &str) {
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

    fn mark_uploaded(&mut self, owner: &str, slot: &str, at: u64) {
        if let Some(e) = self
            .by_owner
            .get_mut(owner)
            .and_then(|v| v.iter_mut().find(|e| e.slot == slot))
        {
            e.uploaded = Some(at);
        }
    }

    /// Files and bytes indexed.
    fn totals(&self) -> (usize, u64) {
        self.by_owner
            .values()
            .flatten()
            .fold((0, 0), |(n, b), e| (n + 1, b + e.size))
    }
}

/// When an indexed slot stops counting for the quota: an unused slot when
/// its PUT URL expires, a file when it expires (`None`: never).
fn counts_until(
    e: &IndexEntry,
    expire_after: Option<Duration>,
    slot_timeout: Duration,
) -> Option<u64> {
    match e.uploaded {
        Some(t) => file_expires(t, e.expire_before, expire_after),
        None => Some(e.created + slot_timeout.as_secs()),
    }
}

impl Inner {
    fn lock_index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot_dir(&self, slot: &str) -> PathBuf {
        self.dir.join(slot)
    }

    fn policy(&self, dry_run: bool) -> PurgePolicy {
        PurgePolicy {
            older_than: self.expire_after,
            slot_timeout: self.slot_timeout,
            dry_run,
        }
    }

    /// Removes expired files and unused slots and rebuilds the quota index
    /// from what is left on disk (other nodes' slots and `starling upload
    /// purge` included).
    async fn sweep(&self) {
        let started = unix_now();
        let (report, kept) = match scan(&self.dir, &self.policy(false), &mut |_| {}).await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(module = NAME, dir = %self.dir.display(), error = %e, "scanning the upload directory failed");
                return;
            }
        };
        if report.files_removed + report.slots_removed > 0 || report.errors > 0 {
            tracing::info!(
                module = NAME,
                files = report.files_removed,
                bytes = report.bytes_removed,
                unused_slots = report.slots_removed,
                errors = report.errors,
                "expired uploads removed"
            );
        }
        let mut fresh = Index::default();
        for (slot, m) in kept {
            fresh.insert(
                &m.owner,
                IndexEntry {
                    slot,
                    size: m.size,
                    created: m.created,
                    uploaded: m.uploaded,
                    expire_before: m.expire_before,
                },
            );
        }
        let mut idx = self.lock_index();
        // Slots issued while the directory was read may have been missed
        // by it (a minute's margin covers a slow scan's start); uploads
        // completed meanwhile are newer than what it read.
        for (owner, entries) in &idx.by_owner {
            for e in entries {
                let seen = fresh
                    .by_owner
                    .get(owner)
                    .is_some_and(|v| v.iter().any(|x| x.slot == e.slot));
                match (seen, e.uploaded) {
                    (true, Some(at)) => fresh.mark_uploaded(owner, &e.slot, at),
                    (false, _) if e.created + 60 >= started => fresh.insert(owner, e.clone()),
                    _ => {}
                }
            }
        }
        let (files, bytes) = fresh
            .by_owner
            .values()
            .flatten()
            .filter(|e| e.uploaded.is_some())
            .fold((0, 0), |(n, b), e| (n + 1, b + e.size));
        self.metrics.stored_files.set(files);
        self.metrics.stored_bytes.set(bytes as i64);
        *idx = fresh;
    }

    /// Whether `who` may upload.
    fn may_upload(&self, env: &Env, who: &BareJid) -> bool {
        if who.node().is_none() {
            return false;
        }
        let domain = who.domain().as_str();
        self.allowed.iter().any(|a| match a {
            Allowed::Local => env.hosts.is_local(domain),
            Allowed::Domain(d) => d == domain,
            Allowed::Account(j) => j == who,
        })
    }

    fn type_allowed(&self, essence: &str) -> bool {
        self.allowed_types.is_empty()
            || self
                .allowed_types
                .iter()
                .any(|t| match t.strip_suffix("/*") {
                    Some(ty) => essence
                        .split_once('/')
                        .is_some_and(|(major, _)| major == ty),
                    None => t == essence,
                })
    }

    /// §4: a slot for `req` (`<request/>`) from `who`, to `service` (the
    /// service's domain), or the §6 error.
    async fn slot(
        &self,
        env: &Env,
        who: &BareJid,
        service: &str,
        req: &Element,
    ) -> Result<Element, Refusal> {
        if !self.may_upload(env, who) {
            return Err(StanzaError::new(StanzaErrorCondition::Forbidden)
                .with_type(ErrorType::Auth)
                .with_text("you may not upload files here")
                .into());
        }
        let filename = safe_filename(req.attr("filename").unwrap_or(""))
            .map_err(|m| bad_request(&format!("invalid file name: {m}")))?;
        let size: u64 = req
            .attr("size")
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| bad_request("size must be a whole number of bytes"))?;
        if size > self.max_file_size {
            // §6: the limit, in the error itself.
            return Err(Refusal {
                error: StanzaError::new(StanzaErrorCondition::NotAcceptable)
                    .with_type(ErrorType::Modify)
                    .with_text(format!(
                        "File too large: the maximum file size is {} bytes",
                        self.max_file_size
                    )),
                app: Some(
                    Element::builder("file-too-large", NS_UPLOAD)
                        .append(
                            Element::builder("max-file-size", NS_UPLOAD)
                                .text(self.max_file_size.to_string())
                                .build(),
                        )
                        .build(),
                ),
                result: "too_large",
            });
        }
        let content_type = match req.attr("content-type").map(str::trim) {
            None | Some("") => None,
            Some(t) => Some(
                MediaType::parse(t)
                    .ok_or_else(|| bad_request("content-type is not a media type"))?,
            ),
        };
        let essence = content_type
            .as_ref()
            .map_or("application/octet-stream", |m| m.essence.as_str());
        if !self.type_allowed(essence) {
            return Err(StanzaError::new(StanzaErrorCondition::NotAcceptable)
                .with_type(ErrorType::Modify)
                .with_text(format!("files of type {essence} are not accepted here"))
                .into());
        }
        let now = unix_now();
        let expire_before = ephemeral_deadline(req, now)?;
        let slot = starling_proto::random_id(SLOT_ID_LEN);
        let owner = who.as_str();
        {
            let mut idx = self.lock_index();
            if self.quota > 0 {
                let mut used = 0u64;
                let mut frees_at: Option<u64> = None;
                for e in idx.by_owner.get(owner).into_iter().flatten() {
                    let until = counts_until(e, self.expire_after, self.slot_timeout);
                    if until.is_none_or(|u| u > now) {
                        used += e.size;
                        if let Some(u) = until {
                            frees_at = Some(frees_at.map_or(u, |f| f.min(u)));
                        }
                    }
                }
                if used.saturating_add(size) > self.quota {
                    // §6: a temporary error, with when to try again if a
                    // counted file or slot will stop counting.
                    return Err(Refusal {
                        error: StanzaError::new(StanzaErrorCondition::ResourceConstraint)
                            .with_type(ErrorType::Wait)
                            .with_text(format!(
                                "Quota reached: your files take {used} of your {} bytes",
                                self.quota
                            )),
                        app: frees_at.map(|at| {
                            let stamp =
                                starling_proto::datetime::xep0082_datetime(u128::from(at) * 1000);
                            Element::builder("retry", NS_UPLOAD)
                                .attr("stamp", stamp)
                                .build()
                        }),
                        result: "quota",
                    });
                }
            }
            if self.quota_total > 0 && idx.bytes.saturating_add(size) > self.quota_total {
                return Err(Refusal {
                    error: StanzaError::new(StanzaErrorCondition::ResourceConstraint)
                        .with_type(ErrorType::Wait)
                        .with_text("The upload store is full; try again later"),
                    app: None,
                    result: "full",
                });
            }
            idx.insert(
                owner,
                IndexEntry {
                    slot: slot.clone(),
                    size,
                    created: now,
                    uploaded: None,
                    expire_before,
                },
            );
        }
        let meta = Meta {
            v: if expire_before.is_some() { 2 } else { 1 },
            owner: owner.to_owned(),
            filename: filename.clone(),
            size,
            content_type: content_type.map(|m| m.full),
            created: now,
            uploaded: None,
            expire_before,
        };
        if let Err(e) = self.create_slot(&slot, &meta).await {
            self.lock_index().remove(owner, &slot);
            let _ = tokio::fs::remove_dir_all(self.slot_dir(&slot)).await;
            tracing::error!(module = NAME, dir = %self.dir.display(), error = %e, "cannot write an upload slot");
            return Err(StanzaError::new(StanzaErrorCondition::InternalServerError)
                .with_type(ErrorType::Wait)
                .with_text("the upload store is not writable")
                .into());
        }
        let domain = service
            .strip_prefix(self.subdomain.as_str())
            .and_then(|d| d.strip_prefix('.'))
            .unwrap_or(service);
        let url = format!(
            "{}{HTTP_PREFIX}/{slot}/{}",
            self.base.for_domain(domain),
            percent_encode(&filename)
        );
        tracing::debug!(module = NAME, owner, size, "upload slot issued");
        Ok(Element::builder("slot", NS_UPLOAD)
            .append(
                Element::builder("put", NS_UPLOAD)
                    .attr("url", url.as_str())
                    .build(),
            )
            .append(
                Element::builder("get", NS_UPLOAD)
                    .attr("url", url.as_str())
                    .build(),
            )
            .build())
    }

    async fn create_slot(&self, slot: &str, meta: &Meta) -> io::Result<()> {
        let mut b = tokio::fs::DirBuilder::new();
        #[cfg(unix)]
        b.mode(0o700);
        b.create(self.slot_dir(slot)).await?;
        write_meta(&self.slot_dir(slot), meta).await
    }

    /// disco#info of the service (§3).
    fn disco_info(&self) -> Element {
        let mut q = Element::new("query", ns::DISCO_INFO);
        q.append_child(
            Element::builder("identity", ns::DISCO_INFO)
                .attr("category", "store")
                .attr("type", "file")
                .attr("name", DISPLAY_NAME)
                .build(),
        );
        let message = format!("{NS_PURPOSE}#message");
        let ephemeral = format!("{NS_PURPOSE}#ephemeral");
        for f in [NS_UPLOAD, &message, &ephemeral, ns::DISCO_INFO, ns::PING] {
            q.append_child(
                Element::builder("feature", ns::DISCO_INFO)
                    .attr("var", f)
                    .build(),
            );
        }
        q.append_child(
            FormBuilder::new("result", Some(NS_UPLOAD))
                .field(
                    "max-file-size",
                    "text-single",
                    None,
                    &[&self.max_file_size.to_string()],
                )
                .build(),
        );
        q
    }
}

/// The deadline of an ephemeral upload (§5.3: `<ephemeral
/// expire-before='…'/>` in the request), in Unix seconds; `None` for every
/// other purpose. `message` is the default (§5), and `profile` and
/// `permanent`, which this service does not advertise, are served as
/// `message` too: kept as long as `expire_after_days` says.
fn ephemeral_deadline(req: &Element, now: u64) -> Result<Option<u64>, StanzaError> {
    let Some(e) = req.get_child("ephemeral", NS_PURPOSE) else {
        return Ok(None);
    };
    let micros = e
        .attr("expire-before")
        .and_then(starling_proto::datetime::parse_xep0082)
        .ok_or_else(|| bad_request("expire-before must be a XEP-0082 DateTime"))?;
    // A deadline inside a second is served until that second starts.
    let at = u64::try_from(micros.div_euclid(1_000_000)).unwrap_or(0);
    if at <= now {
        return Err(bad_request("expire-before is not in the future"));
    }
    Ok(Some(at))
}

/// A refused slot request (§6): the stanza error, the
/// application-specific element it carries, if any, and how the metrics
/// count it.
struct Refusal {
    error: StanzaError,
    app: Option<Element>,
    /// Its `result` in `starling_upload_slots_total`.
    result: &'static str,
}

impl From<StanzaError> for Refusal {
    fn from(error: StanzaError) -> Refusal {
        Refusal {
            error,
            app: None,
            result: "refused",
        }
    }
}

fn bad_request(text: &str) -> StanzaError {
    StanzaError::new(StanzaErrorCondition::BadRequest)
        .with_type(ErrorType::Modify)
        .with_text(text)
}

/// The service at `upload.<domain>`.
struct UploadService(Arc<Inner>);

#[async_trait]
impl Service for UploadService {
    async fn handle(&self, env: &Env, st: Stanza) {
        if st.is_error() {
            return;
        }
        let reply = match st.kind() {
            StanzaKind::Iq if st.is_iq_request() => self.iq(env, &st).await,
            StanzaKind::Message => {
                st.error_reply(StanzaError::new(StanzaErrorCondition::ServiceUnavailable))
            }
            _ => None,
        };
        if let Some(r) = reply {
            env.route(r).await;
        }
    }
}

impl UploadService {
    async fn iq(&self, env: &Env, st: &Stanza) -> Option<Stanza> {
        let inner = &self.0;
        let from = st.from()?.to_bare();
        let to = st.to()?;
        // Only the service itself; no entities in it.
        if to.node().is_some() || to.resource().is_some() {
            return st.error_reply(StanzaError::new(StanzaErrorCondition::ServiceUnavailable));
        }
        let service = to.domain().as_str();
        let get = st.type_attr() == Some("get");
        let Some(q) = st.payload() else {
            return st.error_reply(bad_request("an iq request has one payload"));
        };
        let answer = match (q.ns(), q.name(), get) {
            (ns::DISCO_INFO, "query", true) if q.attr("node").is_none() => {
                Ok(Some(inner.disco_info()))
            }
            (ns::DISCO_ITEMS, "query", true) if q.attr("node").is_none() => {
                Ok(Some(Element::new("query", ns::DISCO_ITEMS)))
            }
            (NS_UPLOAD, "request", true) => {
                let slot = inner.slot(env, &from, service, q).await;
                let result = match &slot {
                    Ok(_) => "granted",
                    Err(r) => r.result,
                };
                UploadMetrics::count(&inner.metrics.slots, "result", result);
                slot.map(Some)
            }
            (ns::PING, "ping", true) => Ok(None),
            _ => Err(StanzaError::new(StanzaErrorCondition::ServiceUnavailable).into()),
        };
        match answer {
            Ok(p) => Some(st.iq_result(p)),
            Err(Refusal { error, app, .. }) => {
                // The request stays in the error reply (§6's examples).
                let mut r = st.error_reply(error)?;
                if let (Some(app), Some(err)) =
                    (app, r.element_mut().get_child_mut("error", ns::CLIENT))
                {
                    err.append_child(app);
                }
                Some(r)
            }
        }
    }
}

// ---------------------------------------------------------------------
// Names, types and URLs.

/// The file name of a slot request, normalised to a safe name, or why it
/// is refused: empty, longer than 255 bytes, with `/`, control characters
/// or a `..` component. Backslashes, characters Windows refuses and
/// bidirectional controls (which disguise extensions) become `_`, as does
/// a leading dot (no hidden files); surrounding spaces go.
pub(crate) fn safe_filename(raw: &str) -> Result<String, &'static str> {
    let name = raw.trim();
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > MAX_FILENAME_BYTES {
        return Err("it is longer than 255 bytes");
    }
    if name.contains('/') {
        return Err("it contains '/'");
    }
    if name.chars().any(char::is_control) {
        return Err("it contains control characters");
    }
    if name.split('\\').any(|part| part == "." || part == "..") {
        return Err("it is or contains a '..' or '.' path component");
    }
    let mut out: String = name
        .chars()
        .map(|c| match c {
            '\\' | ':' | '*' | '?' | '"' | '<' | '>' | '|' => '_',
            '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => '_',
            c => c,
        })
        .collect();
    if out.starts_with('.') {
        out.replace_range(..1, "_");
    }
    Ok(out)
}

/// RFC 3986 percent-encoding of everything but unreserved characters
/// (XEP-0363 §4: non-ASCII characters MUST be percent-encoded); also a
/// valid RFC 8187 `filename*` value.
pub(crate) fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b)
}

/// A media type (`type/subtype`, optional parameters) as announced in a
/// slot request; only printable ASCII, so it is a valid header value.
#[derive(Debug)]
pub(crate) struct MediaType {
    /// `type/subtype`, lowercase.
    pub(crate) essence: String,
    /// As given (trimmed), served as `Content-Type`.
    pub(crate) full: String,
    /// Whatever follows the first `;`.
    params: String,
}

impl MediaType {
    pub(crate) fn parse(s: &str) -> Option<MediaType> {
        let s = s.trim();
        if s.is_empty() || s.len() > 255 || !s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return None;
        }
        let (essence, params) = match s.split_once(';') {
            Some((e, p)) => (e.trim(), p.trim()),
            None => (s, ""),
        };
        let (ty, sub) = essence.split_once('/')?;
        let token = |t: &str| !t.is_empty() && t.bytes().all(is_token_byte);
        (token(ty) && token(sub)).then(|| MediaType {
            essence: essence.to_ascii_lowercase(),
            full: s.to_owned(),
            params: params.to_owned(),
        })
    }
}

pub(crate) fn valid_slot_id(s: &str) -> bool {
    s.len() == SLOT_ID_LEN && s.bytes().all(|b| SLOT_ID_ALPHABET.contains(&b))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

// ---------------------------------------------------------------------
// Files on disk.

const META_FILE: &str = "meta.json";
const DATA_FILE: &str = "file";
const PART_FILE: &str = "file.part";

async fn read_meta(slot_dir: &Path) -> io::Result<Meta> {
    let bytes = tokio::fs::read(slot_dir.join(META_FILE)).await?;
    serde_json::from_slice(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Writes `meta.json` through a temporary file and a rename, so a reader
/// sees the old or the new version, never part of one.
async fn write_meta(slot_dir: &Path, meta: &Meta) -> io::Result<()> {
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
async fn private_file(path: &Path, exclusive: bool) -> io::Result<tokio::fs::File> {
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
async fn scan(
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
async fn age_secs(path: &Path, now: u64) -> Option<u64> {
    let modified = tokio::fs::metadata(path).await.ok()?.modified().ok()?;
    let at = modified.duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(now.saturating_sub(at))
}

/// Removes a slot directory; true if it is gone (or would be).
async fn remove(path: &Path, dry_run: bool, report: &mut PurgeReport) -> bool {
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

fn http_routes(inner: Arc<Inner>) -> Router {
    Router::new()
        .route("/", get(index_page))
        .route(
            "/{slot}/{name}",
            get(download).put(upload).options(preflight),
        )
        .with_state(inner)
}

/// CORS for web clients on other origins (§8: "loose CORS headers").
fn cors(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(
            "Content-Length, Content-Type, Content-Disposition, Content-Range, Accept-Ranges, ETag, Last-Modified",
        ),
    );
    r
}

/// A short plain-text answer.
fn status(code: StatusCode, text: &str) -> Response {
    cors(
        (
            code,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            )],
            format!("{text}\n"),
        )
            .into_response(),
    )
}

fn not_found() -> Response {
    status(StatusCode::NOT_FOUND, "no such file")
}

async fn index_page() -> Response {
    status(
        StatusCode::OK,
        "This is Starling's HTTP upload endpoint (XEP-0363): XMPP clients get upload slots from the upload service and PUT files here.",
    )
}

/// `OPTIONS`: the CORS preflight.
async fn preflight() -> Response {
    let mut r = cors(StatusCode::NO_CONTENT.into_response());
    let h = r.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("OPTIONS, HEAD, GET, PUT"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(
            "Authorization, Content-Type, Range, If-Range, If-None-Match, If-Modified-Since",
        ),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("86400"),
    );
    r
}

/// The slot of a URL, if the URL is one of ours: a well-formed slot id,
/// metadata we can read, and the file name it was issued for. Anything
/// else (`..`, encoded or not, other names) is "not found".
async fn lookup(inner: &Inner, slot: &str, name: &str) -> Option<(PathBuf, Meta)> {
    if !valid_slot_id(slot) {
        return None;
    }
    let dir = inner.slot_dir(slot);
    let meta = read_meta(&dir).await.ok()?;
    (meta.v <= META_VERSION && meta.filename == name).then_some((dir, meta))
}

/// `PUT /upload/{slot}/{name}` (§7).
async fn upload(
    State(inner): State<Arc<Inner>>,
    UrlPath((slot, name)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = store(&inner, &slot, &name, &headers, body).await;
    UploadMetrics::count(&inner.metrics.puts, "status", r.status().as_str());
    r
}

/// The work of [`upload`].
async fn store(inner: &Inner, slot: &str, name: &str, headers: &HeaderMap, body: Body) -> Response {
    let Some((dir, meta)) = lookup(inner, slot, name).await else {
        return not_found();
    };
    if meta.uploaded.is_some() || tokio::fs::metadata(dir.join(DATA_FILE)).await.is_ok() {
        return status(StatusCode::CONFLICT, "this slot was already used");
    }
    let now = unix_now();
    if now >= meta.created + inner.slot_timeout.as_secs()
        || meta.expire_before.is_some_and(|b| now >= b)
    {
        return status(
            StatusCode::FORBIDDEN,
            "this upload slot expired; request a new one",
        );
    }
    // §7: the service MUST reject a Content-Length other than the size.
    let length = match headers.get(header::CONTENT_LENGTH) {
        None => return status(StatusCode::LENGTH_REQUIRED, "Content-Length is required"),
        Some(v) => match v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) {
            Some(n) => n,
            None => return status(StatusCode::BAD_REQUEST, "bad Content-Length"),
        },
    };
    if length > meta.size {
        return status(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("this slot is for {} bytes", meta.size),
        );
    }
    if length != meta.size {
        return status(
            StatusCode::BAD_REQUEST,
            &format!("this slot is for {} bytes", meta.size),
        );
    }
    // §7: SHOULD reject another type than the one announced.
    if let (Some(announced), Some(given)) = (&meta.content_type, headers.get(header::CONTENT_TYPE))
    {
        let same = MediaType::parse(announced)
            .zip(given.to_str().ok().and_then(MediaType::parse))
            .is_some_and(|(a, g)| a.essence == g.essence);
        if !same {
            return status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                &format!("this slot is for {announced}"),
            );
        }
    }
    let part = dir.join(PART_FILE);
    let file = match private_file(&part, true).await {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            // Another PUT is writing it, or one died long ago.
            let stale = age_secs(&part, unix_now())
                .await
                .is_some_and(|a| a >= inner.slot_timeout.as_secs());
            if !stale || tokio::fs::remove_file(&part).await.is_err() {
                return status(
                    StatusCode::CONFLICT,
                    "an upload to this slot is in progress",
                );
            }
            match private_file(&part, true).await {
                Ok(f) => f,
                Err(_) => {
                    return status(
                        StatusCode::CONFLICT,
                        "an upload to this slot is in progress",
                    )
                }
            }
        }
        Err(e) => {
            tracing::error!(module = NAME, slot = %dir.display(), error = %e, "cannot create an upload file");
            return status(StatusCode::INTERNAL_SERVER_ERROR, "cannot store the file");
        }
    };
    // Whatever ends this upload (an error, the client going away and the
    // connection dropping this future), the partial file goes with it.
    let _part = PartFile(part.clone());
    let receiving = Held::new(&inner.metrics.receiving);
    if let Err((code, text)) = receive(inner.slot_timeout, file, body, meta.size).await {
        return status(code, &text);
    }
    drop(receiving);
    // One PUT per slot: a hard link fails if the file exists, so of two
    // uploads that both got here, one wins.
    let data = dir.join(DATA_FILE);
    if let Err(e) = tokio::fs::hard_link(&part, &data).await {
        if e.kind() == io::ErrorKind::AlreadyExists {
            return status(StatusCode::CONFLICT, "this slot was already used");
        }
        tracing::error!(module = NAME, slot = %dir.display(), error = %e, "cannot store an upload");
        return status(StatusCode::INTERNAL_SERVER_ERROR, "cannot store the file");
    }
    let now = unix_now();
    let done = Meta {
        uploaded: Some(now),
        ..meta
    };
    if let Err(e) = write_meta(&dir, &done).await {
        tracing::error!(module = NAME, slot = %dir.display(), error = %e, "cannot record an upload");
        let _ = tokio::fs::remove_file(&data).await;
        return status(StatusCode::INTERNAL_SERVER_ERROR, "cannot store the file");
    }
    {
        // Under the index's lock, as the sweep that recounts the gauges.
        let mut idx = inner.lock_index();
        idx.mark_uploaded(&done.owner, slot, now);
        inner.metrics.stored_files.inc();
        inner.metrics.stored_bytes.inc_by(done.size as i64);
    }
    inner.metrics.received_bytes.inc_by(done.size);
    tracing::info!(module = NAME, owner = %done.owner, bytes = done.size, "file uploaded");
    // §7: 201 means the file is served from the GET URL from now on.
    cors(StatusCode::CREATED.into_response())
}

/// A `file.part` being written, removed when dropped (by then it is
/// either linked into place or incomplete).
struct PartFile(PathBuf);

impl Drop for PartFile {
    fn drop(&mut self) {
        // One unlink: quick enough not to matter to the runtime.
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The write buffers of [`UPLOAD_BUFFERS`]: a permit per buffer, and the
/// buffers not lent out. Allocated on first use, freed when the last
/// upload in flight ends.
struct UploadBuffers {
    permits: tokio::sync::Semaphore,
    free: Mutex<Vec<Vec<u8>>>,
}

static BUFFERS: UploadBuffers = UploadBuffers {
    permits: tokio::sync::Semaphore::const_new(UPLOAD_BUFFERS),
    free: Mutex::new(Vec::new()),
};

/// Permits for the uploads' `fsync`s ([`UPLOAD_SYNCS`]).
static SYNCS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(UPLOAD_SYNCS);

/// Uploads receiving their body now, in this process.
static RECEIVING: AtomicUsize = AtomicUsize::new(0);

/// One upload counted in [`RECEIVING`] while it lives; the last one out
/// frees the write buffers.
struct Receiving;

impl Receiving {
    fn start() -> Receiving {
        RECEIVING.fetch_add(1, Ordering::Relaxed);
        Receiving
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        if RECEIVING.fetch_sub(1, Ordering::Relaxed) == 1 {
            BUFFERS
                .free
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
        }
    }
}

/// A write buffer lent to one upload, with its permit.
struct Lent {
    buf: Vec<u8>,
    _permit: tokio::sync::SemaphorePermit<'static>,
}

impl UploadBuffers {
    async fn lend(&'static self) -> Lent {
        // The semaphore is never closed.
        let permit = self.permits.acquire().await.expect("never closed");
        let buf = self
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(UPLOAD_BUFFER));
        Lent {
            buf,
            _permit: permit,
        }
    }

    fn give_back(&self, lent: Lent) {
        // The buffer never grows past [`UPLOAD_BUFFER`] (`receive` fills it
        // to its room); the permit goes back as `lent` is dropped.
        let Lent { mut buf, _permit } = lent;
        buf.clear();
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(buf);
    }
}

/// Streams the request body into `file`: exactly `size` bytes, each read
/// within the slot timeout, then synced to disk.
///
/// Memory per upload in flight is bounded whatever the number of uploads:
/// the body is read (into hyper's read buffer of the connection, 16 KiB at
/// most, `transport::http`) and copied into one of the [`UPLOAD_BUFFERS`]
/// shared write buffers, which takes what else is already there and is
/// written to the file with one `write` on the blocking pool once full or
/// once the body pauses ([`UPLOAD_FILL_GAP`]). An upload waits for its next
/// bytes without a write buffer, so a slow client holds one for at most
/// that pause after each read; while every
/// buffer is busy the others are not read, and TCP slows their clients
/// down to the disk's pace. Before this, each upload kept the body's own
/// frames (hyper's buffers) until written: ~0.2 MiB per upload in flight
/// with 100 at once (docs/benchmarks.md 2026-11-27, 2026-11-28).
async fn receive(
    slot_timeout: Duration,
    file: tokio::fs::File,
    body: Body,
    size: u64,
) -> Result<(), (StatusCode, String)> {
    let _receiving = Receiving::start();
    // Nothing is in flight on a file just opened: this returns at once.
    let mut file = file.into_std().await;
    let mut stream = body.into_data_stream();
    let mut got = 0u64;
    // Part of a frame that did not fit in the previous buffer.
    let mut carried: Option<Bytes> = None;
    let failed = |e: io::Error| {
        tracing::error!(module = NAME, error = %e, "writing an upload failed");
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot store the file".to_owned(),
        )
    };
    let broke = |e: axum::Error| {
        (
            StatusCode::BAD_REQUEST,
            format!("the upload broke off: {e}"),
        )
    };
    // Every frame is counted against the slot's size as it arrives.
    let mut counted = |c: Bytes| {
        got += c.len() as u64;
        if got > size {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("this slot is for {size} bytes"),
            ));
        }
        Ok(c)
    };
    let mut ended = false;
    while !ended {
        // Wait for the next bytes without holding a buffer.
        let first = match carried.take() {
            Some(c) => c,
            None => match tokio::time::timeout(slot_timeout, stream.next()).await {
                Err(_) => {
                    return Err((StatusCode::REQUEST_TIMEOUT, "the upload stalled".to_owned()))
                }
                Ok(None) => {
                    ended = true;
                    Bytes::new()
                }
                Ok(Some(Err(e))) => return Err(broke(e)),
                Ok(Some(Ok(c))) => counted(c)?,
            },
        };
        if ended {
            break;
        }
        let mut lent = BUFFERS.lend().await;
        let mut next = Some(first);
        // Fill the buffer while the body keeps coming: a client that
        // pauses for more than [`UPLOAD_FILL_GAP`] gets what it sent
        // written and the buffer goes back.
        while let Some(chunk) = next.take() {
            let room = UPLOAD_BUFFER - lent.buf.len();
            if chunk.len() > room {
                lent.buf.extend_from_slice(&chunk[..room]);
                carried = Some(chunk.slice(room..));
                break;
            }
            lent.buf.extend_from_slice(&chunk);
            if lent.buf.len() == UPLOAD_BUFFER {
                break;
            }
            match tokio::time::timeout(UPLOAD_FILL_GAP, stream.next()).await {
                Err(_) => {}
                Ok(None) => ended = true,
                Ok(Some(Err(e))) => return Err(broke(e)),
                Ok(Some(Ok(c))) => next = Some(counted(c)?),
            }
        }
        let written = tokio::task::spawn_blocking(move || {
            let r = file.write_all(&lent.buf);
            (file, lent, r)
        })
        .await;
        // A panic in the write, or the runtime shutting down.
        let (f, lent, r) = written.map_err(|e| failed(io::Error::other(e)))?;
        BUFFERS.give_back(lent);
        r.map_err(failed)?;
        file = f;
    }
    if got != size {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("{got} bytes received; this slot is for {size}"),
        ));
    }
    // An acknowledged upload must survive a crash (§7's 201 promises the
    // file): synced before the answer, without holding a buffer.
    let _sync = SYNCS.acquire().await.expect("never closed");
    tokio::task::spawn_blocking(move || file.sync_all())
        .await
        .map_err(|e| failed(io::Error::other(e)))?
        .map_err(failed)
}

/// Whether browsers may show this type in place: images (not SVG, which
/// can carry scripts), audio and video.
fn inline_type(essence: &str) -> bool {
    (essence.starts_with("image/") && essence != "image/svg+xml")
        || essence.starts_with("audio/")
        || essence.starts_with("video/")
}

/// `GET`/`HEAD /upload/{slot}/{name}`: the file, streamed; one byte range
/// of it when a `GET` asks (RFC 9110 §14: a client resumes a download cut
/// off), and `304 Not Modified` to a client whose copy is current (§13).
async fn download(
    State(inner): State<Arc<Inner>>,
    UrlPath((slot, name)): UrlPath<(String, String)>,
    method: Method,
    request: HeaderMap,
) -> Response {
    let r = serve(&inner, &slot, &name, method, &request).await;
    UploadMetrics::count(&inner.metrics.downloads, "status", r.status().as_str());
    r
}

/// The work of [`download`].
async fn serve(
    inner: &Inner,
    slot: &str,
    name: &str,
    method: Method,
    request: &HeaderMap,
) -> Response {
    let Some((dir, meta)) = lookup(inner, slot, name).await else {
        return not_found();
    };
    let Some(uploaded) = meta.uploaded else {
        return not_found();
    };
    let now = unix_now();
    let expires = file_expires(uploaded, meta.expire_before, inner.expire_after);
    if expires.is_some_and(|e| now >= e) {
        return not_found();
    }
    let file = match tokio::fs::File::open(dir.join(DATA_FILE)).await {
        Ok(f) => f,
        Err(_) => return not_found(),
    };
    let length = match file.metadata().await {
        Ok(m) => m.len(),
        Err(_) => return not_found(),
    };
    let media = meta.content_type.as_deref().and_then(MediaType::parse);
    let (essence, content_type) = match &media {
        Some(m) => (m.essence.as_str(), m.full.as_str()),
        None => ("application/octet-stream", "application/octet-stream"),
    };
    let disposition = format!(
        "{}; filename*=UTF-8''{}",
        if inline_type(essence) {
            "inline"
        } else {
            "attachment"
        },
        percent_encode(&meta.filename)
    );
    let max_age = expires.map_or(31_536_000, |e| e - now);
    let value = |s: &str| {
        HeaderValue::from_str(s)
            .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"))
    };
    let validators = Validators::new(uploaded, length);
    let cache_control = value(&format!("private, max-age={max_age}, immutable"));
    if validators.not_modified(request) {
        let mut r = StatusCode::NOT_MODIFIED.into_response();
        validators.insert(r.headers_mut());
        r.headers_mut().insert(header::CACHE_CONTROL, cache_control);
        return cors(r);
    }
    // §14.2: Range is defined for GET only.
    let range = request
        .get(header::RANGE)
        .filter(|_| method == Method::GET)
        .and_then(|v| v.to_str().ok())
        .filter(|_| validators.if_range_holds(request));
    let (code, first, count) = match wanted(range, length) {
        Wanted::Whole => (StatusCode::OK, 0, length),
        Wanted::Part(first, last) => (StatusCode::PARTIAL_CONTENT, first, last - first + 1),
        Wanted::Unsatisfiable => {
            let mut r = status(StatusCode::RANGE_NOT_SATISFIABLE, "no such byte range");
            r.headers_mut()
                .insert(header::CONTENT_RANGE, value(&format!("bytes */{length}")));
            return r;
        }
    };
    // Read on the blocking pool straight into the chunk hyper will write
    // (`tokio::fs::File` would read into a buffer of its own and copy).
    let mut file = file.into_std().await;
    if first > 0 {
        // Only moves the file offset: no I/O to wait for.
        if io::Seek::seek(&mut file, io::SeekFrom::Start(first)).is_err() {
            return status(StatusCode::INTERNAL_SERVER_ERROR, "cannot read the file");
        }
    }
    let sent = inner.metrics.sent_bytes.clone();
    let stream = futures_util::stream::try_unfold((file, count), move |(f, left)| {
        let sent = sent.clone();
        async move {
            if left == 0 {
                return Ok::<_, io::Error>(None);
            }
            let read = tokio::task::spawn_blocking(move || {
                let want = left.min(IO_CHUNK as u64);
                let mut chunk = Vec::with_capacity(want as usize);
                let r = io::Read::read_to_end(&mut io::Read::take(&f, want), &mut chunk);
                (f, chunk, r)
            })
            .await;
            let (f, chunk, r) = read.map_err(io::Error::other)?;
            r?;
            if chunk.is_empty() {
                Ok(None)
            } else {
                let left = left - chunk.len() as u64;
                sent.inc_by(chunk.len() as u64);
                Ok(Some((Bytes::from(chunk), (f, left))))
            }
        }
    });
    let mut r = Response::new(Body::from_stream(stream));
    *r.status_mut() = code;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, value(content_type));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(count));
    if code == StatusCode::PARTIAL_CONTENT {
        h.insert(
            header::CONTENT_RANGE,
            value(&format!("bytes {first}-{}/{length}", first + count - 1)),
        );
    }
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    validators.insert(h);
    h.insert(header::CONTENT_DISPOSITION, value(&disposition));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // §9: nothing in an uploaded file runs, and no page frames it.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; media-src 'self'; frame-ancestors 'none'"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, cache_control);
    cors(r)
}

/// A stored file's validators (RFC 9110 §8.8). A slot's file never changes
/// once uploaded, so its upload time and length identify its content.
pub(crate) struct Validators {
    /// Strong entity tag: `"<uploaded>-<length>"` in hex.
    etag: String,
    last_modified: std::time::SystemTime,
}

impl Validators {
    pub(crate) fn new(uploaded: u64, length: u64) -> Validators {
        Validators {
            etag: format!("\"{uploaded:x}-{length:x}\""),
            // `uploaded` comes from `meta.json`: a value past what the
            // clock can hold must not panic the download.
            last_modified: std::time::UNIX_EPOCH
                .checked_add(Duration::from_secs(uploaded))
                .unwrap_or(std::time::UNIX_EPOCH),
        }
    }

    fn insert(&self, h: &mut HeaderMap) {
        if let Ok(v) = HeaderValue::from_str(&self.etag) {
            h.insert(header::ETAG, v);
        }
        if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(self.last_modified)) {
            h.insert(header::LAST_MODIFIED, v);
        }
    }

    /// §13.2.2 steps 3–4: `If-None-Match` (weak comparison) when present,
    /// else `If-Modified-Since`.
    pub(crate) fn not_modified(&self, request: &HeaderMap) -> bool {
        let text = |name| {
            request
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
        };
        if let Some(tags) = text(header::IF_NONE_MATCH) {
            return tags
                .split(',')
                .map(str::trim)
                .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == self.etag);
        }
        text(header::IF_MODIFIED_SINCE)
            .and_then(|d| httpdate::parse_http_date(d).ok())
            .is_some_and(|since| self.last_modified <= since)
    }

    /// §13.1.5: a `Range` applies only if `If-Range`, when present, names
    /// this content: the same strong entity tag, or exactly its
    /// modification date.
    pub(crate) fn if_range_holds(&self, request: &HeaderMap) -> bool {
        let Some(v) = request.get(header::IF_RANGE).and_then(|v| v.to_str().ok()) else {
            return true;
        };
        let v = v.trim();
        if v.starts_with('"') {
            v == self.etag
        } else {
            httpdate::parse_http_date(v).is_ok_and(|d| d == self.last_modified)
        }
    }
}

/// What a `Range` header asks of a file of `length` bytes (RFC 9110 §14.1).
#[derive(Debug, PartialEq)]
pub(crate) enum Wanted {
    /// No range, or one to ignore (§14.2: another unit, bad syntax, or
    /// several ranges, which this server does not serve as multipart).
    Whole,
    /// Bytes `first..=last`.
    Part(u64, u64),
    /// A range starting past the end, or an empty suffix: 416.
    Unsatisfiable,
}

pub(crate) fn wanted(range: Option<&str>, length: u64) -> Wanted {
    let Some((unit, set)) = range.and_then(|r| r.split_once('=')) else {
        return Wanted::Whole;
    };
    if !unit.trim().eq_ignore_ascii_case("bytes") || set.contains(',') {
        return Wanted::Whole;
    }
    let Some((a, b)) = set.trim().split_once('-') else {
        return Wanted::Whole;
    };
    // Digits only; a position too large for u64 is past any file's end.
    let number = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().unwrap_or(u64::MAX))
    };
    match (number(a), number(b)) {
        (None, Some(suffix)) if a.is_empty() => {
            if suffix == 0 || length == 0 {
                Wanted::Unsatisfiable
            } else {
                Wanted::Part(length - suffix.min(length), length - 1)
            }
        }
        (Some(first), None) if b.is_empty() => {
            if first >= length {
                Wanted::Unsatisfiable
            } else {
                Wanted::Part(first, length - 1)
            }
        }
        (Some(first), Some(last)) if first <= last => {
            if first >= length {
                Wanted::Unsatisfiable
            } else {
                Wanted::Part(first, last.min(length - 1))
            }
        }
        _ => Wanted::Whole,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filenames_are_refused_or_made_safe() {
        for bad in [
            "", "   ", "a/b", "../x", "..", ".", "a\\..\\b", "x\u{1}y", "a\u{7f}", "a\nb",
        ] {
            assert!(safe_filename(bad).is_err(), "{bad:?}");
        }
        assert!(safe_filename(&"x".repeat(256)).is_err());
        assert_eq!(safe_filename("très cool.jpg").unwrap(), "très cool.jpg");
        assert_eq!(safe_filename(" a..b.jpg ").unwrap(), "a..b.jpg");
        assert_eq!(safe_filename(".htaccess").unwrap(), "_htaccess");
        assert_eq!(safe_filename("C:\\x\\y.png").unwrap(), "C__x_y.png");
        assert_eq!(
            safe_filename("photo\u{202e}gpj.exe").unwrap(),
            "photo_gpj.exe"
        );
    }

    #[test]
    fn url_names_are_percent_encoded() {
        assert_eq!(percent_encode("très cool.jpg"), "tr%C3%A8s%20cool.jpg");
        assert_eq!(percent_encode("a%2e%2e?#&/"), "a%252e%252e%3F%23%26%2F");
    }

    #[test]
    fn media_types_and_allowed_types() {
        assert_eq!(
            MediaType::parse("Image/JPEG").unwrap().essence,
            "image/jpeg"
        );
        let m = MediaType::parse("text/plain; charset=utf-8").unwrap();
        assert_eq!(
            (m.essence.as_str(), m.params.as_str()),
            ("text/plain", "charset=utf-8")
        );
        for bad in ["", "image", "/x", "a/b\r\nX: y", "a b/c", "é/x"] {
            assert!(MediaType::parse(bad).is_none(), "{bad:?}");
        }
        let cfg = |types: &[&str]| UploadConfig {
            allowed_types: types.iter().map(|s| s.to_string()).collect(),
            ..UploadConfig::default()
        };
        assert!(Upload::validate(&cfg(&["image/*", "audio/ogg"]), &[]).is_ok());
        assert!(Upload::validate(&cfg(&["image"]), &[]).is_err());
        assert!(Upload::validate(&cfg(&["*/*"]), &[]).is_err());
    }

    #[test]
    fn config_checks_urls_and_who_is_allowed() {
        let with = |f: fn(&mut UploadConfig)| {
            let mut c = UploadConfig::default();
            f(&mut c);
            Upload::validate(&c, &[])
        };
        assert!(with(|_| {}).is_ok());
        assert!(with(|c| c.base_url = Some("https://up.example.org:5443/x".into())).is_ok());
        assert!(with(|c| c.base_url = Some("ftp://x".into())).is_err());
        assert!(with(|c| c.base_url = Some("https://".into())).is_err());
        assert!(with(|c| c.base_url = Some("https://a b".into())).is_err());
        assert!(with(|c| c.allowed = vec!["example.org".into(), "a@example.org".into()]).is_ok());
        assert!(with(|c| c.allowed = vec!["a@b@c".into()]).is_err());
        assert!(with(|c| c.subdomain = "Up load".into()).is_err());
        assert!(with(|c| c.slot_timeout_secs = 0).is_err());
    }

    #[test]
    fn enabling_without_http_listeners_is_refused_at_load() {
        let parse = |t: &str| crate::Config::parse(t, Path::new("x.toml"));
        let err = parse("[http]\nlisten = []\n[modules.upload]\nenabled = true\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("modules.upload.enabled"), "{err}");
        assert!(
            parse("[http]\nlisten = []\n").is_ok(),
            "off: no listener needed"
        );
        assert!(parse("[modules.upload]\nenabled = true\n").is_ok());
    }

    /// The index's byte count (what `quota_total` compares) follows
    /// inserts, replacements and removals.
    #[test]
    fn the_index_counts_every_entrys_bytes() {
        let entry = |slot: &str, size| IndexEntry {
            slot: slot.into(),
            size,
            created: 0,
            uploaded: None,
            expire_before: None,
        };
        let mut idx = Index::default();
        idx.insert("a@x", entry("s1", 100));
        idx.insert("a@x", entry("s2", 50));
        idx.insert("b@x", entry("s3", 7));
        assert_eq!(idx.bytes, 157);
        idx.insert("a@x", entry("s1", 30));
        assert_eq!(idx.bytes, 87, "a replaced entry counts once");
        idx.remove("a@x", "s2");
        idx.remove("a@x", "nope");
        idx.remove("c@x", "s3");
        assert_eq!(idx.bytes, 37);
        idx.remove("a@x", "s1");
        idx.remove("b@x", "s3");
        assert_eq!((idx.bytes, idx.by_owner.len()), (0, 0));
    }

    /// XEP-0363 §5.3: an ephemeral upload's deadline wins over a later
    /// expiry, and holds alone when files are kept forever; other purposes
    /// have none.
    #[test]
    fn ephemeral_deadlines_bound_a_files_life() {
        let month = Some(Duration::from_secs(30 * SECS_PER_DAY));
        assert_eq!(
            file_expires(1000, None, month),
            Some(1000 + 30 * SECS_PER_DAY)
        );
        assert_eq!(file_expires(1000, Some(5000), month), Some(5000));
        assert_eq!(
            file_expires(1000, Some(u64::MAX), month),
            Some(1000 + 30 * SECS_PER_DAY)
        );
        assert_eq!(file_expires(1000, Some(5000), None), Some(5000));
        assert_eq!(file_expires(1000, None, None), None);

        let req = |purpose: &str| {
            format!("<request xmlns='{NS_UPLOAD}' filename='a' size='1'>{purpose}</request>")
                .parse::<Element>()
                .unwrap()
        };
        let now = 1_700_000_000;
        let eph = |stamp: &str| {
            ephemeral_deadline(
                &req(&format!(
                    "<ephemeral xmlns='{NS_PURPOSE}' expire-before='{stamp}'/>"
                )),
                now,
            )
        };
        // 2023-11-14T22:13:20Z is `now`; a fraction of a second rounds
        // down (served until that second starts, never after).
        assert_eq!(eph("2023-11-14T22:13:21Z").unwrap(), Some(now + 1));
        assert_eq!(eph("2023-11-14T22:13:21.999Z").unwrap(), Some(now + 1));
        assert_eq!(eph("2023-11-15T00:13:25+02:00").unwrap(), Some(now + 5));
        for bad in ["2023-11-14T22:13:20Z", "2020-01-01T00:00:00Z", "soon", ""] {
            assert!(eph(bad).is_err(), "{bad}");
        }
        let missing = ephemeral_deadline(&req(&format!("<ephemeral xmlns='{NS_PURPOSE}'/>")), now);
        assert!(missing.is_err());
        for other in [
            String::new(),
            format!("<message xmlns='{NS_PURPOSE}'/>"),
            format!("<permanent xmlns='{NS_PURPOSE}'/>"),
            "<ephemeral xmlns='urn:example' expire-before='x'/>".to_owned(),
        ] {
            assert_eq!(
                ephemeral_deadline(&req(&other), now).unwrap(),
                None,
                "{other}"
            );
        }
    }

    /// RFC 9110 §14.1.2 (byte ranges), §14.1.3 (suffixes), §14.2 (what to
    /// ignore), §15.5.17 (416).
    #[test]
    fn byte_ranges_are_read_as_rfc_9110_says() {
        use Wanted::*;
        let w = |r: &str| wanted(Some(r), 10_000);
        assert_eq!(wanted(None, 10_000), Whole);
        // §14.1.2 examples: first 500 bytes, second 500, from 9500 on.
        assert_eq!(w("bytes=0-499"), Part(0, 499));
        assert_eq!(w("bytes=500-999"), Part(500, 999));
        assert_eq!(w("bytes=9500-"), Part(9500, 9999));
        // §14.1.3: the last 500; a suffix longer than the file is all of it.
        assert_eq!(w("bytes=-500"), Part(9500, 9999));
        assert_eq!(w("bytes=-20000"), Part(0, 9999));
        // A last position past the end means the end; units are
        // case-insensitive; spaces around the spec are allowed.
        assert_eq!(w("bytes=9000-20000"), Part(9000, 9999));
        assert_eq!(w("Bytes= 1-1 "), Part(1, 1));
        assert_eq!(w("bytes=0-99999999999999999999999"), Part(0, 9999));
        // Unsatisfiable: a first position at or past the end, an empty
        // suffix, any range of an empty file.
        assert_eq!(w("bytes=10000-"), Unsatisfiable);
        assert_eq!(w("bytes=10000-10005"), Unsatisfiable);
        assert_eq!(w("bytes=99999999999999999999999-"), Unsatisfiable);
        assert_eq!(w("bytes=-0"), Unsatisfiable);
        assert_eq!(wanted(Some("bytes=0-"), 0), Unsatisfiable);
        assert_eq!(wanted(Some("bytes=-5"), 0), Unsatisfiable);
        // Ignored (§14.2): other units, bad syntax, last before first,
        // several ranges (not served as multipart/byteranges).
        for ignored in [
            "items=0-5",
            "bytes",
            "bytes=",
            "bytes=-",
            "bytes=5",
            "bytes=a-b",
            "bytes=+1-2",
            "bytes=1--2",
            "bytes=5-4",
            "bytes=0-1,5-6",
            "bytes=0-1, 5-6",
        ] {
            assert_eq!(w(ignored), Whole, "{ignored}");
        }
    }

    /// RFC 9110 §13.1.3 (If-Modified-Since), §13.1.2 (If-None-Match, weak
    /// comparison, and its precedence, §13.2.2), §13.1.5 (If-Range: strong
    /// tag or the exact date).
    #[test]
    fn conditional_requests_compare_the_files_validators() {
        let v = Validators::new(1_700_000_000, 1234);
        let tag = "\"6553f100-4d2\"";
        assert_eq!(v.etag, tag);
        let mut h = HeaderMap::new();
        v.insert(&mut h);
        assert_eq!(h[header::ETAG], tag);
        let date = "Tue, 14 Nov 2023 22:13:20 GMT";
        assert_eq!(h[header::LAST_MODIFIED], date);
        let req = |pairs: &[(header::HeaderName, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(k.clone(), HeaderValue::from_str(v).unwrap());
            }
            h
        };
        let inm = header::IF_NONE_MATCH;
        let ims = header::IF_MODIFIED_SINCE;
        assert!(!v.not_modified(&req(&[])));
        assert!(v.not_modified(&req(&[(inm.clone(), tag)])));
        assert!(v.not_modified(&req(&[(inm.clone(), "W/\"6553f100-4d2\"")])));
        assert!(v.not_modified(&req(&[(inm.clone(), "\"x\", \"6553f100-4d2\"")])));
        assert!(v.not_modified(&req(&[(inm.clone(), "*")])));
        assert!(!v.not_modified(&req(&[(inm.clone(), "\"other\"")])));
        // If-None-Match present: If-Modified-Since is not looked at.
        assert!(!v.not_modified(&req(&[(inm, "\"other\""), (ims.clone(), date)])));
        assert!(v.not_modified(&req(&[(ims.clone(), date)])));
        assert!(v.not_modified(&req(&[(ims.clone(), "Wed, 15 Nov 2023 00:00:00 GMT")])));
        assert!(!v.not_modified(&req(&[(ims.clone(), "Tue, 14 Nov 2023 22:13:19 GMT")])));
        assert!(!v.not_modified(&req(&[(ims, "yesterday")])));

        let ifr = header::IF_RANGE;
        assert!(v.if_range_holds(&req(&[])));
        assert!(v.if_range_holds(&req(&[(ifr.clone(), tag)])));
        assert!(v.if_range_holds(&req(&[(ifr.clone(), date)])));
        assert!(!v.if_range_holds(&req(&[(ifr.clone(), "W/\"6553f100-4d2\"")])));
        assert!(!v.if_range_holds(&req(&[(ifr.clone(), "\"other\"")])));
        assert!(!v.if_range_holds(&req(&[(ifr.clone(), "Wed, 15 Nov 2023 00:00:00 GMT")])));
        assert!(!v.if_range_holds(&req(&[(ifr, "garbage")])));
    }

    #[test]
    fn slot_ids_are_long_random_and_checked() {
        let a = starling_proto::random_id(SLOT_ID_LEN);
        assert!(valid_slot_id(&a));
        assert_ne!(a, starling_proto::random_id(SLOT_ID_LEN));
        for bad in ["..", "%2e%2e", &a[1..], &format!("{}l", &a[1..])] {
            assert!(!valid_slot_id(bad), "{bad:?}");
        }
    }

    /// The tests that use the process's write buffers, one at a time.
    static SHARED_BUFFERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// Runs [`receive`] on a body of `frames` into a fresh file; the
    /// file's content, or the error's status.
    async fn received(frames: Vec<Bytes>, size: u64) -> Result<Vec<u8>, StatusCode> {
        let path = std::env::temp_dir().join(format!(
            "starling-upload-receive-{}",
            starling_proto::random_id(10)
        ));
        let file = tokio::fs::File::create(&path).await.unwrap();
        let body = Body::from_stream(futures_util::stream::iter(
            frames.into_iter().map(Ok::<_, io::Error>),
        ));
        let r = receive(Duration::from_secs(5), file, body, size).await;
        let on_disk = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        r.map(|()| on_disk).map_err(|(code, _)| code)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn receive_writes_every_byte_in_order_through_the_shared_buffers() {
        let _alone = SHARED_BUFFERS.lock().await;
        // Frames of uneven sizes, some larger than a write buffer or than
        // what is left of one (split across two buffers), some empty.
        let sizes = [
            1,
            0,
            300 * 1024,
            7,
            UPLOAD_BUFFER - 8,
            16 * 1024,
            1,
            600 * 1024,
            3,
        ];
        let frames: Vec<Bytes> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                Bytes::from(
                    (0..n)
                        .map(|j| ((i * 31 + j) % 251) as u8)
                        .collect::<Vec<u8>>(),
                )
            })
            .collect();
        let expected: Vec<u8> = frames.iter().flat_map(|f| f.iter().copied()).collect();
        let total = expected.len() as u64;
        // More uploads at once than there are write buffers: each waits
        // for one, none gets another's bytes.
        let uploads: Vec<_> = (0..3 * UPLOAD_BUFFERS)
            .map(|_| tokio::spawn(received(frames.clone(), total)))
            .collect();
        for u in uploads {
            let on_disk = u.await.unwrap().unwrap();
            assert!(on_disk == expected, "{} bytes on disk", on_disk.len());
        }
        // Every buffer came back; none is kept once no upload is in flight.
        assert_eq!(BUFFERS.permits.available_permits(), UPLOAD_BUFFERS);
        assert_eq!(SYNCS.available_permits(), UPLOAD_SYNCS);
        assert_eq!(RECEIVING.load(Ordering::Relaxed), 0);
        assert!(BUFFERS.free.lock().unwrap().is_empty());

        // The declared size is the contract (XEP-0363 §5): more is 413,
        // less is 400, and the buffers still all come back.
        let more = received(frames.clone(), total - 1).await;
        assert_eq!(more, Err(StatusCode::PAYLOAD_TOO_LARGE));
        let less = received(frames, total + 1).await;
        assert_eq!(less, Err(StatusCode::BAD_REQUEST));
        assert_eq!(BUFFERS.permits.available_permits(), UPLOAD_BUFFERS);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_pauses_holds_no_write_buffer() {
        let _alone = SHARED_BUFFERS.lock().await;
        // As many uploads as there are buffers send a little, then pause
        // (a phone on a slow link); another upload meanwhile goes through.
        let path = std::env::temp_dir().join(format!(
            "starling-upload-pause-{}",
            starling_proto::random_id(10)
        ));
        std::fs::create_dir(&path).unwrap();
        let mut paused = Vec::new();
        for i in 0..UPLOAD_BUFFERS {
            let file = tokio::fs::File::create(path.join(i.to_string()))
                .await
                .unwrap();
            let frames = futures_util::stream::iter([Bytes::from_static(b"first")])
                .chain(futures_util::stream::once(async {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    Bytes::from_static(b"second")
                }))
                .map(Ok::<_, io::Error>);
            paused.push(tokio::spawn(receive(
                Duration::from_secs(10),
                file,
                Body::from_stream(frames),
                11,
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let file = tokio::fs::File::create(path.join("other")).await.unwrap();
        let other = Body::from(vec![7u8; 3 * UPLOAD_BUFFER]);
        let done = tokio::time::timeout(
            Duration::from_secs(2),
            receive(
                Duration::from_secs(10),
                file,
                other,
                3 * UPLOAD_BUFFER as u64,
            ),
        )
        .await;
        assert!(matches!(done, Ok(Ok(()))), "blocked behind paused uploads");
        assert!(paused.iter().all(|p| !p.is_finished()));
        for p in paused {
            p.await.unwrap().unwrap();
        }
        for i in 0..UPLOAD_BUFFERS {
            assert_eq!(
                std::fs::read(path.join(i.to_string())).unwrap(),
                b"firstsecond"
            );
        }
        std::fs::remove_dir_all(&path).unwrap();
    }
}
