//! Entry points of the server's private parsers of outside input, for the
//! fuzz targets in `fuzz/` (see fuzz/README.md). Each calls the same code
//! the server runs on a request; nothing here is an API, and nothing else
//! in the server uses it.

use crate::listen::http;
use crate::modules::upload::{self, MediaType, Validators, Wanted};
use crate::transport::bosh;
use axum::http::{header, HeaderMap, HeaderValue};
use starling_proto::StanzaError;
use starling_xml::{Element, Limits};
use std::path::PathBuf;
use std::sync::Arc;

/// What a BOSH request body led to.
#[derive(Debug)]
pub enum BoshOutcome {
    /// The `<body/>` was refused before any session: the `terminate`
    /// response body.
    Refused(String),
    /// A session was created (`sid` absent): its `rid`, `wait` (seconds) and
    /// `hold` as bounded by the server.
    Created { rid: u64, wait: u64, hold: u64 },
}

/// `POST /http-bind` up to the session: [`bosh::parse_body`] with `limits`,
/// then [`bosh::handle_request`] on an empty registry where only
/// `example.com` is local.
pub fn bosh_request(body: &[u8], limits: Limits) -> BoshOutcome {
    let el = match bosh::parse_body(body, limits) {
        Ok(el) => el,
        Err(condition) => return BoshOutcome::Refused(bosh::terminate(condition)),
    };
    let registry = Arc::new(bosh::BoshRegistry::default());
    let read_limits =
        crate::transport::connection::ReadLimits::from_c2s(0, limits.max_stanza_bytes, None);
    match bosh::handle_request(
        &registry,
        &el,
        |d| d == "example.com",
        false,
        read_limits,
        64 * 1024,
    ) {
        Ok((session, rid, _conn)) => BoshOutcome::Created {
            rid,
            wait: session.wait.as_secs(),
            hold: session.hold,
        },
        Err(terminate) => BoshOutcome::Refused(terminate),
    }
}

/// The largest `rid` a BOSH request may carry (XEP-0124 §14.1).
pub const BOSH_MAX_RID: u64 = bosh::MAX_RID;
/// The largest `wait` and `hold` a BOSH session gets.
pub const BOSH_MAX_WAIT: u64 = bosh::MAX_WAIT;
/// See [`BOSH_MAX_WAIT`].
pub const BOSH_MAX_HOLD: u64 = bosh::MAX_HOLD;

/// XEP-0156 host-meta: the WebSocket and BOSH URLs for a `Host` header.
pub fn host_meta_urls(host: &[u8], tls: bool) -> Option<(String, String)> {
    let mut headers = HeaderMap::new();
    headers.insert(header::HOST, HeaderValue::from_bytes(host).ok()?);
    http::endpoint_urls(&headers, tls)
}

/// The web chat's static files: the relative path a URL path maps to.
pub fn web_path(path: &str) -> Option<PathBuf> {
    http::safe_relative_path(path)
}

/// What the upload service makes of a download request's headers for a
/// stored file of `length` bytes uploaded at `uploaded` (Unix seconds).
#[derive(Debug, PartialEq)]
pub struct UploadRequest {
    /// `Range` (RFC 9110 §14.2): `None` for the whole file, `Some(None)`
    /// for 416, else the first and last byte served.
    pub range: Option<Option<(u64, u64)>>,
    /// `If-Range` names this content (§13.1.5).
    pub if_range: bool,
    /// `If-None-Match` / `If-Modified-Since` say the client's copy is
    /// current (§13.1.2–3).
    pub not_modified: bool,
}

/// The upload service's reading of `Range`, `If-Range`,
/// `If-None-Match` and `If-Modified-Since` (each given raw, if present).
pub fn upload_request(
    range: Option<&[u8]>,
    if_range: Option<&[u8]>,
    if_none_match: Option<&[u8]>,
    if_modified_since: Option<&[u8]>,
    length: u64,
    uploaded: u64,
) -> UploadRequest {
    let mut headers = HeaderMap::new();
    for (name, value) in [
        (header::RANGE, range),
        (header::IF_RANGE, if_range),
        (header::IF_NONE_MATCH, if_none_match),
        (header::IF_MODIFIED_SINCE, if_modified_since),
    ] {
        if let Some(v) = value.and_then(|v| HeaderValue::from_bytes(v).ok()) {
            headers.insert(name, v);
        }
    }
    let validators = Validators::new(uploaded, length);
    // As `serve` reads it: a header value that is not visible ASCII is no
    // range.
    let range = headers.get(header::RANGE).and_then(|v| v.to_str().ok());
    UploadRequest {
        range: match upload::wanted(range, length) {
            Wanted::Whole => None,
            Wanted::Unsatisfiable => Some(None),
            Wanted::Part(first, last) => Some(Some((first, last))),
        },
        if_range: validators.if_range_holds(&headers),
        not_modified: validators.not_modified(&headers),
    }
}

/// The upload service's names: whether `slot` is a slot id, the safe
/// file name for a requested `filename` (and its URL encoding), and the
/// essence of a `content-type`.
#[derive(Debug)]
pub struct UploadNames {
    pub slot_ok: bool,
    pub filename: Result<String, &'static str>,
    pub url_name: Option<String>,
    pub media_essence: Option<String>,
    pub media_full: Option<String>,
}

/// See [`UploadNames`].
pub fn upload_names(slot: &str, filename: &str, content_type: &str) -> UploadNames {
    let safe = upload::safe_filename(filename);
    let media = MediaType::parse(content_type);
    UploadNames {
        slot_ok: upload::valid_slot_id(slot),
        url_name: safe.as_deref().ok().map(upload::percent_encode),
        filename: safe,
        media_essence: media.as_ref().map(|m| m.essence.clone()),
        media_full: media.map(|m| m.full),
    }
}

/// A XEP-0313 query as the archive parses it.
#[derive(Debug)]
pub struct MamQuery {
    /// Messages per page.
    pub limit: u32,
    /// Ids the query names (each checked to exist).
    pub ids_to_check: Vec<i64>,
    /// The `ids` field.
    pub ids: Vec<i64>,
    /// Exclusive bounds.
    pub after: Option<i64>,
    pub before: Option<i64>,
}

/// `archive_query::parse` of a `<query xmlns='urn:xmpp:mam:2'/>`.
pub fn mam_query(q: &Element, default_page: u32, max_page: u32) -> Result<MamQuery, StanzaError> {
    let r = crate::modules::common::archive_query::parse(q, default_page, max_page)?;
    Ok(MamQuery {
        limit: r.query.limit,
        ids_to_check: r.ids_to_check.iter().map(|i| i.0).collect(),
        ids: r.query.ids.iter().map(|i| i.0).collect(),
        after: r.query.after.map(|i| i.0),
        before: r.query.before.map(|i| i.0),
    })
}
