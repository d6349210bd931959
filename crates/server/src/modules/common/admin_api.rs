//! What a module needs to serve admin API endpoints and a web admin page
//! of its own (the group-chat module's rooms: `modules/muc/admin_api.rs`).
//!
//! The admin listener (`admin/`) owns authentication (bearer tokens and
//! their scopes, the web admin's sessions), the page frame and the OpenAPI
//! document; a module adds, through [`AdminExtensions`] in its hook
//! registry (`reg.provided::<AdminExtensions>()`): routes under
//! `/api/v1/` (each behind the same token check, with the caller's
//! [`Caller`] as a request extension), their part of the OpenAPI
//! document, and a page of the web admin (its body; the admin checks the
//! login and draws the frame). The helpers below are the ones every
//! endpoint of the admin API uses: errors as JSON, bounded JSON bodies,
//! query strings, the `admin action` log line.

use axum::body::Bytes;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use serde::de::DeserializeOwned;
use serde_json::Value;
use starling_proto::BareJid;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// The admin API routes, OpenAPI paths and web admin pages modules add.
/// The server provides an empty one to the modules' registry and hands
/// what they added to the admin listener.
#[derive(Default)]
pub struct AdminExtensions {
    /// `(method, path, handler)`, the handler with its state applied.
    pub routes: Vec<(&'static str, &'static str, MethodRouter)>,
    /// OpenAPI `paths` objects describing those routes.
    pub openapi: Vec<Value>,
    /// Pages of the web admin.
    pub pages: Vec<AdminPage>,
    /// `(path prefix, module)` of the modules that are off
    /// (`Module::ADMIN_PATHS`): their endpoints answer 404 saying so.
    pub disabled: Vec<(&'static str, &'static str)>,
}

/// The body of one web admin page: from the query string's parameters,
/// its HTML (escaped with [`esc`]), or an error message shown above an
/// empty page.
pub type PageBody = Arc<
    dyn Fn(HashMap<String, String>) -> Pin<Box<dyn Future<Output = Result<String, String>> + Send>>
        + Send
        + Sync,
>;

/// A page of the web admin that a module serves (read only: changes go
/// through the API, whose token check and `admin action` log line they
/// then share).
pub struct AdminPage {
    /// Its path, `/admin/<name>`.
    pub path: &'static str,
    /// Its title, also its link in the navigation.
    pub title: &'static str,
    /// What it shows.
    pub body: PageBody,
}

/// The name of the token that authenticated a request (a request
/// extension set by the admin's token check).
#[derive(Clone, Debug)]
pub struct Caller(pub String);

/// A JSON answer.
pub fn json(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        format!("{body}\n"),
    )
        .into_response()
}

/// A JSON error: `{"error": message, "status": code}`.
pub fn error(status: StatusCode, message: &str) -> Response {
    json(
        status,
        &serde_json::json!({ "error": message, "status": status.as_u16() }),
    )
}

/// HTML-escapes `s` for text and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// What an operation answers: the JSON body, or an [`ApiError`].
pub type OpResult = Result<Value, ApiError>;

/// An error answer (small, unlike a `Response`, so `Result`s stay small).
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl axum::response::IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error(self.status, &self.message)
    }
}

pub fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, message)
}

pub fn storage_failed(e: impl std::fmt::Display) -> ApiError {
    tracing::error!(error = %e, "admin API: storage failed");
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "storage failed; see the server log",
    )
}

/// Logs a change made through the API: grep `admin action`.
pub fn audit(caller: &Caller, action: &str, target: &str) {
    tracing::info!(token = %caller.0, action, target, "admin action");
}

/// A JSON request body: 400 when it is not the expected object, 413 when
/// it is larger than `[admin] max_body_bytes`.
pub struct Body<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> axum::extract::FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            let status = e.status();
            let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
                "request body too large ([admin] max_body_bytes)".to_owned()
            } else {
                format!("cannot read the request body: {e}")
            };
            ApiError::new(status, message)
        })?;
        // An empty body is an empty object: every field is optional there.
        let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        serde_json::from_slice(bytes)
            .map(Body)
            .map_err(|e| bad(format!("the body is not the expected JSON object: {e}")))
    }
}

/// The query string's parameters, percent-decoded (`+` is a space).
pub fn query(raw: &Option<String>) -> Result<HashMap<String, String>, ApiError> {
    let mut out = HashMap::new();
    for pair in raw
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = percent_decode(k).ok_or_else(|| bad("malformed query string"))?;
        let v = percent_decode(v).ok_or_else(|| bad("malformed query string"))?;
        out.insert(k, v);
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// `limit` from the query: 1..=max, `default` when absent.
pub fn limit(q: &HashMap<String, String>, default: u32, max: u32) -> Result<u32, ApiError> {
    match q.get("limit") {
        None => Ok(default),
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| bad(format!("limit must be a number from 1 to {max}"))),
    }
}

/// An account's JID (`user@domain`, no resource).
pub fn account(s: &str) -> Result<BareJid, ApiError> {
    BareJid::new(s)
        .ok()
        .filter(|j| j.node().is_some())
        .ok_or_else(|| bad(format!("{s:?} is not an account JID (user@domain)")))
}

/// `s` percent-encoded for a path segment or a query value (unreserved
/// characters and `@` kept).
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~@".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Helpers for OpenAPI 3.0 fragments (`admin/openapi.rs` writes the
/// document by hand, and a module its [`AdminExtensions::openapi`]).
pub mod openapi {
    use serde_json::{json, Value};

    /// A query parameter.
    pub fn query(name: &str, description: &str, schema: Value) -> Value {
        json!({ "name": name, "in": "query", "required": false, "description": description, "schema": schema })
    }

    /// The `limit` query parameter of a paged listing.
    pub fn limit(default: u32, max: u32) -> Value {
        query(
            "limit",
            "Page size.",
            json!({ "type": "integer", "minimum": 1, "maximum": max, "default": default }),
        )
    }

    /// An optional JSON request body.
    pub fn body(schema: Value) -> Value {
        json!({ "required": false, "content": { "application/json": { "schema": schema } } })
    }

    /// A JSON answer.
    pub fn ok(description: &str, schema: Value) -> Value {
        json!({ "description": description, "content": { "application/json": { "schema": schema } } })
    }

    /// An error answer (`{"error", "status"}`).
    pub fn err(description: &str) -> Value {
        json!({ "description": description, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } })
    }

    /// An operation with the responses every API operation shares.
    pub fn op(
        summary: &str,
        params: Vec<Value>,
        request: Option<Value>,
        responses: Value,
    ) -> Value {
        let mut r = responses;
        r["400"] = err("Malformed input (JID, query or body).");
        r["401"] = err("Missing or invalid bearer token.");
        r["413"] = err("Body larger than [admin] max_body_bytes.");
        r["503"] = err("Storage failed, or the server is starting or shutting down.");
        let mut o = json!({ "summary": summary, "parameters": params, "responses": r });
        if let Some(b) = request {
            o["requestBody"] = b;
        }
        o
    }
}
