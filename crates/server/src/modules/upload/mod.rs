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

pub mod cli;
mod http;
mod names;
mod store;

use http::*;
pub(crate) use http::{wanted, Validators, Wanted};
pub(crate) use names::*;
use store::*;
pub use store::{purge, PurgePolicy, PurgeReport};

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

    const HTTP: bool = true;
    fn subdomain(cfg: &Self::Config) -> Option<&str> {
        Some(&cfg.subdomain)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn filenames_are_refused_or_made_safe() {
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
    pub(super) fn url_names_are_percent_encoded() {
        assert_eq!(percent_encode("très cool.jpg"), "tr%C3%A8s%20cool.jpg");
        assert_eq!(percent_encode("a%2e%2e?#&/"), "a%252e%252e%3F%23%26%2F");
    }

    #[test]
    pub(super) fn media_types_and_allowed_types() {
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
    pub(super) fn config_checks_urls_and_who_is_allowed() {
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
    pub(super) fn enabling_without_http_listeners_is_refused_at_load() {
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
    pub(super) fn the_index_counts_every_entrys_bytes() {
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
    pub(super) fn ephemeral_deadlines_bound_a_files_life() {
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
    pub(super) fn byte_ranges_are_read_as_rfc_9110_says() {
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
    pub(super) fn conditional_requests_compare_the_files_validators() {
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
    pub(super) fn slot_ids_are_long_random_and_checked() {
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
    pub(super) async fn received(frames: Vec<Bytes>, size: u64) -> Result<Vec<u8>, StatusCode> {
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
    pub(super) async fn receive_writes_every_byte_in_order_through_the_shared_buffers() {
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
    pub(super) async fn a_client_that_pauses_holds_no_write_buffer() {
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
