//! The web admin page at `/admin` on the admin listener (docs/admin.md):
//! server-rendered HTML (no script at all; the Content-Security-Policy
//! forbids it), every dynamic value HTML-escaped by [`esc`].
//!
//! - **Login** with an admin token (the same tokens as the API). The
//!   browser gets a cookie holding a random session id (32 CSPRNG bytes),
//!   `HttpOnly; SameSite=Strict; Path=/admin`; the server maps it to the
//!   token's *name* with an idle and an absolute expiry. The token itself
//!   is never stored in the cookie or kept after the login; a revoked
//!   token ends its web sessions at their next request. Failed logins are
//!   limited per client address ([`LOGIN_FAILURES`] per
//!   [`LOGIN_WINDOW`], then 429 for wrong tokens; a valid token is never
//!   locked out).
//! - **CSRF**: every POST form carries the session's random CSRF token
//!   (the login form a pre-session one, double-submitted in a cookie),
//!   compared in constant time; a request whose `Origin` is not this
//!   host is refused too.
//! - **Pages**: dashboard (sessions, messages/s computed from two
//!   readings of `starling_stanzas_in_total{kind="message"}`, write-behind
//!   queues, cluster nodes, uptime; refreshes itself every 5 s), users
//!   (pages of a domain's accounts; create, delete, password, ban,
//!   unban), domains (list, add, disable, enable, remove), sessions
//!   (list, kick), rooms (list only), logout.
//! - Every action calls the API's operation (`api::user_create`,
//!   `api::domain_remove`, …): the same checks, the same effects, the same
//!   `admin action` log line with the token's name. Actions answer with a
//!   redirect (POST/redirect/GET) and a one-time message kept in the
//!   server-side session (a generated password is shown there once).

use super::api::{self, ApiError, NewDomain, NewUser};
use super::{tokens, Caller, Shared};
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde_json::Value;
use starling_core::storage::SCOPE_ADMIN;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;

/// The session cookie.
const COOKIE: &str = "starling_admin";
/// The login form's double-submit CSRF cookie.
const LOGIN_COOKIE: &str = "starling_admin_login";
/// A web session ends after this long without a request…
pub(crate) const SESSION_IDLE: Duration = Duration::from_secs(30 * 60);
/// …and this long after the login in any case.
pub(crate) const SESSION_MAX: Duration = Duration::from_secs(12 * 3600);
/// Web sessions kept at most (the oldest goes first).
const MAX_SESSIONS: usize = 1000;
/// Failed logins allowed per client address within [`LOGIN_WINDOW`].
pub(crate) const LOGIN_FAILURES: u32 = 5;
/// The window of [`LOGIN_FAILURES`].
pub(crate) const LOGIN_WINDOW: Duration = Duration::from_secs(60);
/// Users and sessions listed per page.
const PAGE: u32 = 50;

/// A one-time message shown on the next page.
struct Flash {
    ok: bool,
    text: String,
}

struct WebSession {
    /// The name of the token that logged in.
    token: String,
    csrf: String,
    created: Instant,
    last_seen: Instant,
    flash: Option<Flash>,
}

/// The messages counter as last read by the dashboard.
struct Reading {
    at: Instant,
    messages: f64,
    /// Messages per second between the two last readings.
    rate: Option<f64>,
}

/// The web page's state: sessions, failed logins, the dashboard's last
/// reading of the messages counter.
#[derive(Default)]
pub(crate) struct WebState {
    sessions: Mutex<HashMap<String, WebSession>>,
    failures: Mutex<HashMap<IpAddr, (Instant, u32)>>,
    reading: Mutex<Option<Reading>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// 32 random bytes, base64url.
fn random_token() -> String {
    use base64::Engine as _;
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("operating system CSPRNG unavailable");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn same(a: &str, b: &str) -> bool {
    bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

impl WebState {
    /// True if `ip` may try to log in now (the web page's login and the
    /// API's token check share this limit).
    pub(super) fn login_allowed(&self, ip: IpAddr) -> bool {
        match lock(&self.failures).get(&ip) {
            Some((since, n)) => since.elapsed() >= LOGIN_WINDOW || *n < LOGIN_FAILURES,
            None => true,
        }
    }

    pub(super) fn login_failed(&self, ip: IpAddr) {
        let mut f = lock(&self.failures);
        if f.len() > 10_000 {
            f.retain(|_, (since, _)| since.elapsed() < LOGIN_WINDOW);
        }
        let e = f.entry(ip).or_insert((Instant::now(), 0));
        if e.0.elapsed() >= LOGIN_WINDOW {
            *e = (Instant::now(), 0);
        }
        e.1 += 1;
    }

    /// A new session for the token named `token`: (id, csrf).
    fn open(&self, token: &str) -> String {
        let id = random_token();
        let now = Instant::now();
        let mut s = lock(&self.sessions);
        s.retain(|_, w| alive(w, now));
        if s.len() >= MAX_SESSIONS {
            if let Some(oldest) = s
                .iter()
                .min_by_key(|(_, w)| w.created)
                .map(|(k, _)| k.clone())
            {
                s.remove(&oldest);
            }
        }
        s.insert(
            id.clone(),
            WebSession {
                token: token.to_owned(),
                csrf: random_token(),
                created: now,
                last_seen: now,
                flash: None,
            },
        );
        id
    }

    /// The live session `id`: (token name, csrf), its flash taken if
    /// `take_flash`.
    fn get(&self, id: &str, take_flash: bool) -> Option<(String, String, Option<Flash>)> {
        let now = Instant::now();
        let mut s = lock(&self.sessions);
        let w = s.get_mut(id)?;
        if !alive(w, now) {
            s.remove(id);
            return None;
        }
        w.last_seen = now;
        let flash = if take_flash { w.flash.take() } else { None };
        Some((w.token.clone(), w.csrf.clone(), flash))
    }

    fn flash(&self, id: &str, ok: bool, text: String) {
        if let Some(w) = lock(&self.sessions).get_mut(id) {
            w.flash = Some(Flash { ok, text });
        }
    }

    fn close(&self, id: &str) {
        lock(&self.sessions).remove(id);
    }

    /// Messages received from clients per second, from this reading of
    /// the counter and the previous one (at least a second apart).
    fn message_rate(&self, messages: Option<f64>) -> Option<f64> {
        let messages = messages?;
        let now = Instant::now();
        let mut r = lock(&self.reading);
        match r.as_mut() {
            Some(prev) if now.duration_since(prev.at) >= Duration::from_secs(1) => {
                let dt = now.duration_since(prev.at).as_secs_f64();
                let rate = ((messages - prev.messages) / dt).max(0.0);
                *prev = Reading {
                    at: now,
                    messages,
                    rate: Some(rate),
                };
                Some(rate)
            }
            Some(prev) => prev.rate,
            None => {
                *r = Some(Reading {
                    at: now,
                    messages,
                    rate: None,
                });
                None
            }
        }
    }
}

fn alive(w: &WebSession, now: Instant) -> bool {
    now.duration_since(w.last_seen) < SESSION_IDLE && now.duration_since(w.created) < SESSION_MAX
}

/// The web page's routes (no bearer token: the session cookie).
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/admin", get(dashboard))
        .route("/admin/", get(dashboard))
        .route("/admin/login", get(login_page).post(login))
        .route("/admin/logout", post(logout))
        .route("/admin/users", get(users_page))
        .route("/admin/domains", get(domains_page))
        .route("/admin/sessions", get(sessions_page))
        .route("/admin/rooms", get(rooms_page))
        .route("/admin/{section}/{action}", post(action))
}

// ---- HTML helpers

/// HTML-escapes text for element content and quoted attribute values.
pub(crate) fn esc(s: &str) -> String {
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

const STYLE: &str = "body{font:15px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#f6f7f9}\
header{background:#1d3557;color:#fff;padding:.6em 1em;display:flex;gap:1.2em;align-items:center}\
header a{color:#fff;text-decoration:none}header a.on{text-decoration:underline}\
header form{margin-left:auto}main{padding:1em;max-width:70em}\
table{border-collapse:collapse;background:#fff;margin:.5em 0}td,th{border:1px solid #ddd;padding:.3em .6em;text-align:left;vertical-align:top}\
form.inline{display:inline}input,select,button{font:inherit;margin:.1em}\
.flash{padding:.5em 1em;border-radius:4px}.ok{background:#d8f3dc}.err{background:#ffd6d6}\
.cards{display:flex;flex-wrap:wrap;gap:1em}.card{background:#fff;border:1px solid #ddd;padding:.6em 1em;min-width:10em}\
.card b{display:block;font-size:1.6em}code{background:#eee;padding:0 .2em}";

/// A whole page. `nav`: (active section, token name, csrf) once logged in.
fn page(title: &str, nav: Option<(&str, &str, &str)>, flash: Option<&Flash>, body: &str) -> String {
    let mut h = String::with_capacity(body.len() + 2048);
    let _ = write!(
        h,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width\">{refresh}<title>{t} · Starling admin</title>\
<style>{STYLE}</style></head><body><header><strong>Starling admin</strong>",
        t = esc(title),
        refresh = if title == "Dashboard" {
            "<meta http-equiv=\"refresh\" content=\"5\">"
        } else {
            ""
        },
    );
    if let Some((active, token, csrf)) = nav {
        for (href, name) in [
            ("/admin", "Dashboard"),
            ("/admin/users", "Users"),
            ("/admin/domains", "Domains"),
            ("/admin/sessions", "Sessions"),
            ("/admin/rooms", "Rooms"),
        ] {
            let _ = write!(
                h,
                "<a href=\"{href}\"{}>{name}</a>",
                if active == name { " class=\"on\"" } else { "" }
            );
        }
        let _ = write!(
            h,
            "<form method=\"post\" action=\"/admin/logout\">{}<span>token <code>{}</code></span> <button id=\"logout\">Log out</button></form>",
            csrf_field(csrf),
            esc(token)
        );
    }
    h.push_str("</header><main>");
    let _ = write!(h, "<h1>{}</h1>", esc(title));
    if let Some(f) = flash {
        let _ = write!(
            h,
            "<p class=\"flash {}\" id=\"flash\">{}</p>",
            if f.ok { "ok" } else { "err" },
            esc(&f.text)
        );
    }
    h.push_str(body);
    h.push_str("</main></body></html>");
    h
}

fn csrf_field(csrf: &str) -> String {
    format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        esc(csrf)
    )
}

/// A POST form with hidden fields, visible `inner` inputs and a button.
fn form(action: &str, csrf: &str, hidden: &[(&str, &str)], inner: &str, button: &str) -> String {
    let mut f = format!(
        "<form class=\"inline\" method=\"post\" action=\"{}\">{}",
        esc(action),
        csrf_field(csrf)
    );
    for (k, v) in hidden {
        let _ = write!(
            f,
            "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
            esc(k),
            esc(v)
        );
    }
    let _ = write!(f, "{inner}<button>{}</button></form>", esc(button));
    f
}

/// The headers every page carries: no caching, no framing, no script.
fn html(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Not `no-referrer`: with it, browsers send `Origin: null` on form
    // posts, which [`same_origin`] refuses.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    r
}

fn redirect(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    r.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(to).unwrap_or(HeaderValue::from_static("/admin")),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn set_cookie(r: &mut Response, name: &str, value: &str, max_age: Option<u64>) {
    let mut c = format!("{name}={value}; Path=/admin; HttpOnly; SameSite=Strict");
    if let Some(s) = max_age {
        let _ = write!(c, "; Max-Age={s}");
    }
    if let Ok(v) = HeaderValue::from_str(&c) {
        r.headers_mut().append(header::SET_COOKIE, v);
    }
}

fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

/// Refuses a cross-origin POST: `Origin` present and not this host (an
/// opaque `null` origin, e.g. a sandboxed frame, included).
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .is_some_and(|o| o == host)
}

fn error_page(status: StatusCode, text: &str) -> Response {
    html(
        status,
        page(
            "Error",
            None,
            Some(&Flash {
                ok: false,
                text: text.to_owned(),
            }),
            "<p><a href=\"/admin\">Back</a></p>",
        ),
    )
}

// ---- Sessions

/// A logged-in request: the caller (token name), the session id and its
/// CSRF token, and the flash message for this page.
struct Logged {
    id: String,
    caller: Caller,
    /// The token may only read (scope `read`): pages, no actions.
    read_only: bool,
    csrf: String,
    flash: Option<Flash>,
}

/// The request's web session, or the response to give instead (the login
/// page, 503 while starting or stopping).
async fn logged(st: &Shared, headers: &HeaderMap, take_flash: bool) -> Result<Logged, Response> {
    if let Some(why) = st.health.not_ready() {
        return Err(error_page(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("the server is {why}"),
        ));
    }
    let Some(id) = cookie(headers, COOKIE) else {
        return Err(redirect("/admin/login"));
    };
    let Some((token, csrf, flash)) = st.web.get(&id, take_flash) else {
        return Err(redirect("/admin/login"));
    };
    // A revoked token ends its web sessions.
    let read_only = match st.env.storage.admin_tokens.admin_tokens().await {
        Ok(list) => match list.iter().find(|t| t.name == token) {
            Some(t) => t.scope != SCOPE_ADMIN,
            None => {
                st.web.close(&id);
                return Err(redirect("/admin/login"));
            }
        },
        Err(e) => {
            tracing::error!(error = %e, "admin web: cannot read the tokens");
            return Err(error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "storage unavailable",
            ));
        }
    };
    Ok(Logged {
        id,
        caller: Caller(token),
        read_only,
        csrf,
        flash,
    })
}

async fn login_page(State(st): State<Shared>, headers: HeaderMap) -> Response {
    if let Some(id) = cookie(&headers, COOKIE) {
        if st.web.get(&id, false).is_some() {
            return redirect("/admin");
        }
    }
    login_form(None, StatusCode::OK)
}

fn login_form(error: Option<&str>, status: StatusCode) -> Response {
    let pre = random_token();
    let body = format!(
        "<form method=\"post\" action=\"/admin/login\" id=\"login\">\
<input type=\"hidden\" name=\"csrf\" value=\"{pre}\">\
<p><label>Admin token<br><input type=\"password\" name=\"token\" autocomplete=\"off\" size=\"50\" required autofocus></label></p>\
<p><button>Log in</button></p></form>\
<p>Tokens are made on the server's machine: <code>starling admin token create --name NAME</code>.</p>"
    );
    let flash = error.map(|e| Flash {
        ok: false,
        text: e.to_owned(),
    });
    let mut r = html(status, page("Log in", None, flash.as_ref(), &body));
    set_cookie(&mut r, LOGIN_COOKIE, &pre, Some(3600));
    r
}

/// The form's fields (`application/x-www-form-urlencoded`).
fn fields(body: &Bytes) -> Result<HashMap<String, String>, ApiError> {
    let text = std::str::from_utf8(body).map_err(|_| api::bad("the form is not UTF-8"))?;
    api::query(&Some(text.to_owned()))
}

async fn login(
    State(st): State<Shared>,
    Extension(ConnectInfo(peer)): Extension<ConnectInfo<SocketAddr>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !same_origin(&headers) {
        return error_page(StatusCode::FORBIDDEN, "cross-origin request refused");
    }
    let ip = peer.ip();
    // Checked once the token is known to be wrong: a valid token logs in
    // whatever other clients from this address tried (issue 31, item 10).
    let locked = !st.web.login_allowed(ip);
    let Ok(f) = fields(&body) else {
        return login_form(Some("malformed form"), StatusCode::BAD_REQUEST);
    };
    let pre = cookie(&headers, LOGIN_COOKIE).unwrap_or_default();
    let given = f.get("csrf").map(String::as_str).unwrap_or("");
    if pre.is_empty() || !same(&pre, given) {
        return login_form(
            Some("the form expired; log in again"),
            StatusCode::FORBIDDEN,
        );
    }
    if let Some(why) = st.health.not_ready() {
        return error_page(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("the server is {why}"),
        );
    }
    let token = f.get("token").map(|t| t.trim()).unwrap_or("");
    let stored = match st.env.storage.admin_tokens.admin_tokens().await {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "admin web: cannot read the tokens");
            return error_page(StatusCode::SERVICE_UNAVAILABLE, "storage unavailable");
        }
    };
    let Some(found) = (!token.is_empty())
        .then(|| tokens::find(&stored, token))
        .flatten()
    else {
        st.web.login_failed(ip);
        st.env.metrics.admin_auth_failed("web");
        if locked {
            starling_core::log_throttled!(warn, %peer, "admin web: too many failed logins; refused");
            return login_form(
                Some(&format!(
                    "too many failed logins from this address; wait {} s",
                    LOGIN_WINDOW.as_secs()
                )),
                StatusCode::TOO_MANY_REQUESTS,
            );
        }
        // The token itself is never logged.
        starling_core::log_throttled!(warn, %peer, "admin web: login with an unknown token refused");
        return login_form(
            Some("invalid token (revoked, or never created on this deployment)"),
            StatusCode::UNAUTHORIZED,
        );
    };
    let id = st.web.open(&found.name);
    tracing::info!(token = %found.name, %peer, "admin web: logged in");
    let mut r = redirect("/admin");
    set_cookie(&mut r, COOKIE, &id, None);
    set_cookie(&mut r, LOGIN_COOKIE, "", Some(0));
    r
}

async fn logout(State(st): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(id) = cookie(&headers, COOKIE) {
        if let Some((token, csrf, _)) = st.web.get(&id, false) {
            let ok = fields(&body)
                .ok()
                .and_then(|f| f.get("csrf").map(|c| same(c, &csrf)))
                .unwrap_or(false);
            if !ok || !same_origin(&headers) {
                return error_page(StatusCode::FORBIDDEN, "missing or wrong CSRF token");
            }
            st.web.close(&id);
            tracing::info!(token = %token, "admin web: logged out");
        }
    }
    let mut r = redirect("/admin/login");
    set_cookie(&mut r, COOKIE, "", Some(0));
    r
}

// ---- Pages

fn card(label: &str, value: &str, id: &str) -> String {
    format!(
        "<div class=\"card\" id=\"{}\"><b>{}</b>{}</div>",
        esc(id),
        esc(value),
        esc(label)
    )
}

fn uptime(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if d > 0 {
        format!("{d}d {h}h {m}m")
    } else if h > 0 {
        format!("{h}h {m}m")
    } else {
        format!("{m}m {s}s")
    }
}

/// Messages received from clients since start, read from the metrics.
fn messages_in(st: &Shared) -> Option<f64> {
    let text = st.env.metrics.encode();
    let mut total = None;
    for l in text.lines() {
        if l.starts_with("starling_stanzas_in_total{") && l.contains("kind=\"message\"") {
            if let Some(v) = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
                *total.get_or_insert(0.0) += v;
            }
        }
    }
    total
}

fn num(v: &Value) -> String {
    match v {
        Value::Null => "—".to_owned(),
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

async fn dashboard(State(st): State<Shared>, headers: HeaderMap) -> Response {
    let me = match logged(&st, &headers, true).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let stats = api::stats_value(&st);
    let cluster = api::cluster_value(&st);
    let total = messages_in(&st);
    let rate = st.web.message_rate(total);
    let mut b = String::from("<div class=\"cards\">");
    b.push_str(&card(
        "sessions on this node",
        &num(&stats["sessions"]["this_node"]),
        "sessions",
    ));
    b.push_str(&card(
        "sessions in all",
        &num(&stats["sessions"]["all_nodes"]),
        "sessions-all",
    ));
    b.push_str(&card(
        "messages/s received (between the last two page loads)",
        &rate.map_or("…".to_owned(), |r| format!("{r:.1}")),
        "rate",
    ));
    b.push_str(&card(
        "messages received since start",
        &total.map_or("—".to_owned(), |t| format!("{t:.0}")),
        "messages",
    ));
    b.push_str(&card(
        "uptime",
        &uptime(stats["uptime_secs"].as_u64().unwrap_or(0)),
        "uptime",
    ));
    b.push_str(&card(
        "domains served",
        &stats["domains"].as_array().map_or(0, Vec::len).to_string(),
        "domains",
    ));
    b.push_str("</div>");
    let _ = write!(
        b,
        "<p>Starling {} · node {} · storage <code>{}</code>{}</p>",
        esc(&num(&stats["version"])),
        esc(&num(&stats["node"])),
        esc(&num(&stats["storage"])),
        if stats["pressure"] == true {
            " · <strong>storage under pressure</strong>"
        } else {
            ""
        }
    );
    b.push_str("<h2>Write-behind queues</h2><table id=\"queues\"><tr><th>queue</th><th>queued</th><th>written</th><th>dropped</th></tr>");
    if let Some(q) = stats["write_behind"].as_object() {
        for (name, q) in q {
            let _ = write!(
                b,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(name),
                esc(&num(&q["queued"])),
                esc(&num(&q["written"])),
                esc(&num(&q["dropped"]))
            );
        }
    }
    b.push_str("</table><h2>Cluster</h2>");
    if cluster["enabled"] == true {
        b.push_str("<table id=\"nodes\"><tr><th>node</th><th>sessions</th><th>registry entries</th><th>last heartbeat</th></tr>");
        for n in cluster["nodes"].as_array().into_iter().flatten() {
            let _ = write!(
                b,
                "<tr><td>{}{}</td><td>{}</td><td>{}</td><td>{} ms ago</td></tr>",
                esc(&num(&n["node"])),
                if n["this_node"] == true {
                    " (this one)"
                } else {
                    ""
                },
                esc(&num(&n["sessions"])),
                esc(&num(&n["registry_entries"])),
                esc(&num(&n["last_heartbeat_ms_ago"]))
            );
        }
        let _ = write!(
            b,
            "</table><p>Unacknowledged deliveries: {}</p>",
            esc(&num(&cluster["unacknowledged_deliveries"]))
        );
    } else {
        b.push_str("<p>Not clustered (no <code>[cluster]</code>).</p>");
    }
    b.push_str("<p><small>This page reloads every 5 s.</small></p>");
    html(
        StatusCode::OK,
        page(
            "Dashboard",
            Some(("Dashboard", &me.caller.0, &me.csrf)),
            me.flash.as_ref(),
            &b,
        ),
    )
}

fn query_of(raw: &Option<String>) -> HashMap<String, String> {
    api::query(raw).unwrap_or_default()
}

async fn users_page(
    State(st): State<Shared>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let me = match logged(&st, &headers, true).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let q = query_of(&raw);
    let domain = q.get("domain").filter(|d| !d.is_empty()).cloned();
    let after = q.get("after").cloned();
    let mut b = String::new();
    let mut flash = me.flash;
    let listed = api::users_page(&st, domain.as_deref(), after.as_deref(), PAGE).await;
    let (domain, users, next) = match &listed {
        Ok(v) => (
            num(&v["domain"]),
            v["users"].as_array().cloned().unwrap_or_default(),
            v["next"].as_str().map(str::to_owned),
        ),
        Err(e) => {
            flash = Some(Flash {
                ok: false,
                text: e.message.clone(),
            });
            (domain.unwrap_or_default(), Vec::new(), None)
        }
    };
    // Domain picker: the served domains.
    b.push_str("<form method=\"get\" action=\"/admin/users\">Domain <select name=\"domain\">");
    let mut served = st.env.hosts.list();
    served.sort();
    for d in &served {
        let _ = write!(
            b,
            "<option{}>{}</option>",
            if *d == domain { " selected" } else { "" },
            esc(d)
        );
    }
    b.push_str("</select> <button>Show</button></form>");
    b.push_str("<h2>Create an account</h2>");
    b.push_str(&form(
        "/admin/users/create",
        &me.csrf,
        &[("domain", &domain)],
        &format!(
            "<input name=\"jid\" placeholder=\"user@{}\" required size=\"30\"> \
<input name=\"password\" type=\"password\" placeholder=\"password (empty: generated)\" autocomplete=\"new-password\"> ",
            esc(&domain)
        ),
        "Create",
    ));
    let _ = write!(b, "<h2>Accounts of {}</h2>", esc(&domain));
    if users.is_empty() {
        b.push_str("<p>None.</p>");
    } else {
        b.push_str("<table id=\"users\"><tr><th>account</th><th>actions</th></tr>");
        for u in &users {
            let jid = num(u);
            let hidden = [("jid", jid.as_str()), ("domain", domain.as_str())];
            let _ = write!(
                b,
                "<tr data-jid=\"{}\"><td>{}</td><td>{} {} {} {}</td></tr>",
                esc(&jid),
                esc(&jid),
                form(
                    "/admin/users/password",
                    &me.csrf,
                    &hidden,
                    "<input name=\"password\" type=\"password\" placeholder=\"new password (empty: generated)\" autocomplete=\"new-password\">",
                    "Set password"
                ),
                form(
                    "/admin/users/ban",
                    &me.csrf,
                    &hidden,
                    "<input name=\"reason\" placeholder=\"reason\" size=\"12\">",
                    "Ban"
                ),
                form("/admin/users/unban", &me.csrf, &hidden, "", "Unban"),
                form("/admin/users/delete", &me.csrf, &hidden, "", "Delete"),
            );
        }
        b.push_str("</table>");
    }
    if let Some(n) = next {
        let _ = write!(
            b,
            "<p><a id=\"next\" href=\"/admin/users?domain={}&amp;after={}\">Next page</a></p>",
            esc(&super::ctl::enc(&domain)),
            esc(&super::ctl::enc(&n))
        );
    }
    html(
        StatusCode::OK,
        page(
            "Users",
            Some(("Users", &me.caller.0, &me.csrf)),
            flash.as_ref(),
            &b,
        ),
    )
}

fn settings_text(v: &Value) -> String {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| match v {
                    Value::Bool(true) => format!("{k}=on"),
                    Value::Bool(false) => format!("{k}=off"),
                    v => format!("{k}={}", num(v)),
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

async fn domains_page(State(st): State<Shared>, headers: HeaderMap) -> Response {
    let me = match logged(&st, &headers, true).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let mut flash = me.flash;
    let list = match api::domains_list(&st).await {
        Ok(v) => v["domains"].as_array().cloned().unwrap_or_default(),
        Err(e) => {
            flash = Some(Flash {
                ok: false,
                text: e.message,
            });
            Vec::new()
        }
    };
    let mut b = String::from("<h2>Add a domain</h2>");
    b.push_str(&form(
        "/admin/domains/add",
        &me.csrf,
        &[],
        "<input name=\"name\" placeholder=\"chat.example.net\" required size=\"30\"> \
<label><input type=\"checkbox\" name=\"enabled\" value=\"on\" checked> enabled</label> \
registration <select name=\"registration\"><option value=\"\">default</option><option>on</option><option>off</option></select> \
<input name=\"max_sessions\" placeholder=\"max sessions\" size=\"10\" inputmode=\"numeric\"> \
<input name=\"archive_retention_days\" placeholder=\"archive retention (days)\" size=\"18\" inputmode=\"numeric\"> ",
        "Add",
    ));
    b.push_str("<h2>Domains</h2><table id=\"domains\"><tr><th>domain</th><th>source</th><th>state</th><th>settings</th><th>actions</th></tr>");
    for d in &list {
        let name = num(&d["name"]);
        let state = num(&d["state"]);
        let mut state_text = state.clone();
        if let Some(n) = d["removal"]["accounts_deleted"].as_u64() {
            let _ = write!(state_text, " ({n} accounts deleted so far)");
        }
        let actions = if d["source"] == "config" {
            "configuration file".to_owned()
        } else if state == "removing" {
            String::new()
        } else {
            let hidden = [("name", name.as_str())];
            let toggle = if state == "enabled" {
                form("/admin/domains/disable", &me.csrf, &hidden, "", "Disable")
            } else {
                form("/admin/domains/enable", &me.csrf, &hidden, "", "Enable")
            };
            format!(
                "{toggle} {}",
                form(
                    "/admin/domains/remove",
                    &me.csrf,
                    &hidden,
                    "<label><input type=\"checkbox\" name=\"confirm\" value=\"yes\" required> delete all its data</label> ",
                    "Remove"
                )
            )
        };
        let _ = write!(
            b,
            "<tr data-domain=\"{}\"><td>{}</td><td>{}</td><td class=\"state\">{}</td><td>{}</td><td>{}</td></tr>",
            esc(&name),
            esc(&name),
            esc(&num(&d["source"])),
            esc(&state_text),
            esc(&settings_text(&d["settings"])),
            actions
        );
    }
    b.push_str("</table><p>Settings are changed with <code>starling ctl domains set</code> or the API.</p>");
    html(
        StatusCode::OK,
        page(
            "Domains",
            Some(("Domains", &me.caller.0, &me.csrf)),
            flash.as_ref(),
            &b,
        ),
    )
}

async fn sessions_page(
    State(st): State<Shared>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let me = match logged(&st, &headers, true).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let q = query_of(&raw);
    let after = q.get("after").cloned().unwrap_or_default();
    let mut flash = me.flash;
    let (sessions, next) = match api::sessions_page(&st, None, None, &after, PAGE as usize).await {
        Ok(v) => (
            v["sessions"].as_array().cloned().unwrap_or_default(),
            v["next"].as_str().map(str::to_owned),
        ),
        Err(e) => {
            flash = Some(Flash {
                ok: false,
                text: e.message,
            });
            (Vec::new(), None)
        }
    };
    let mut b = String::new();
    if sessions.is_empty() {
        b.push_str("<p id=\"no-sessions\">No session is bound on this node.</p>");
    } else {
        b.push_str("<table id=\"sessions\"><tr><th>session</th><th>address</th><th>TLS</th><th>state</th><th>since</th><th></th></tr>");
        for s in &sessions {
            let jid = num(&s["jid"]);
            let addr = match (s["ip"].as_str(), s["port"].as_u64()) {
                (Some(ip), Some(p)) => format!("{ip} port {p}"),
                _ => "—".to_owned(),
            };
            let _ = write!(
                b,
                "<tr data-jid=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&jid),
                esc(&jid),
                esc(&addr),
                match s["tls"].as_bool() {
                    Some(true) => "yes",
                    Some(false) => "no",
                    None => "—",
                },
                esc(&num(&s["state"])),
                esc(&num(&s["since"])),
                form(
                    "/admin/sessions/kick",
                    &me.csrf,
                    &[("jid", jid.as_str())],
                    "<input name=\"reason\" placeholder=\"reason\" size=\"12\"> ",
                    "Kick"
                )
            );
        }
        b.push_str("</table>");
    }
    if let Some(n) = next {
        let _ = write!(
            b,
            "<p><a id=\"next\" href=\"/admin/sessions?after={}\">Next page</a></p>",
            esc(&super::ctl::enc(&n))
        );
    }
    html(
        StatusCode::OK,
        page(
            "Sessions",
            Some(("Sessions", &me.caller.0, &me.csrf)),
            flash.as_ref(),
            &b,
        ),
    )
}

/// Group-chat rooms, read only (changes: the API or `starling ctl rooms`).
async fn rooms_page(
    State(st): State<Shared>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let me = match logged(&st, &headers, true).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let q = query_of(&raw);
    let mut flash = me.flash;
    let page_of =
        super::rooms::rooms_page(&st, None, q.get("after").map(String::as_str), PAGE as usize)
            .await;
    let (rooms, next) = match page_of {
        Ok(v) => (
            v["rooms"].as_array().cloned().unwrap_or_default(),
            v["next"].as_str().map(str::to_owned),
        ),
        Err(e) => {
            flash = Some(Flash {
                ok: false,
                text: e.message,
            });
            (Vec::new(), None)
        }
    };
    let mut b = String::from(
        "<p>Rooms loaded on this node and stored ones. Changes: the API \
(<code>/api/v1/rooms</code>) or <code>starling ctl rooms</code>.</p>",
    );
    if rooms.is_empty() {
        b.push_str("<p id=\"no-rooms\">No rooms.</p>");
    } else {
        b.push_str("<table id=\"rooms\"><tr><th>room</th><th>name</th><th>kind</th><th>occupants</th><th>node</th></tr>");
        for r in &rooms {
            let jid = num(&r["jid"]);
            let flag = |k: &str, yes: &'static str, no: &'static str| {
                if r[k] == Value::Bool(true) {
                    yes
                } else {
                    no
                }
            };
            let _ = write!(
                b,
                "<tr data-jid=\"{}\"><td>{}</td><td>{}</td><td>{}, {}, {}{}</td><td>{}</td><td>{}</td></tr>",
                esc(&jid),
                esc(&jid),
                esc(&num(&r["name"])),
                flag("persistent", "persistent", "temporary"),
                flag("public", "public", "hidden"),
                flag("members_only", "members-only", "open"),
                flag("locked", ", locked", ""),
                esc(&num(&r["occupants"])),
                esc(&num(&r["node"])),
            );
        }
        b.push_str("</table>");
    }
    if let Some(n) = next {
        let _ = write!(
            b,
            "<p><a id=\"next\" href=\"/admin/rooms?after={}\">Next page</a></p>",
            esc(&super::ctl::enc(&n))
        );
    }
    html(
        StatusCode::OK,
        page(
            "Rooms",
            Some(("Rooms", &me.caller.0, &me.csrf)),
            flash.as_ref(),
            &b,
        ),
    )
}

// ---- Actions

fn field(f: &HashMap<String, String>, k: &str) -> String {
    f.get(k).map(|v| v.trim().to_owned()).unwrap_or_default()
}

fn optional(f: &HashMap<String, String>, k: &str) -> Option<String> {
    f.get(k).filter(|v| !v.is_empty()).cloned()
}

/// `POST /admin/{section}/{action}`: the API operation, then back to the
/// section's page with the outcome.
async fn action(
    State(st): State<Shared>,
    Path((section, act)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let me = match logged(&st, &headers, false).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let f = match fields(&body) {
        Ok(f) => f,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &e.message),
    };
    if !same_origin(&headers) || !f.get("csrf").is_some_and(|c| same(c, &me.csrf)) {
        tracing::warn!(token = %me.caller.0, "admin web: a form without the right CSRF token refused");
        return error_page(
            StatusCode::FORBIDDEN,
            "missing or wrong CSRF token: reload the page and try again",
        );
    }
    if me.read_only {
        tracing::warn!(token = %me.caller.0, section = %section, action = %act, "admin web: a change refused to a read-only token");
        return error_page(
            StatusCode::FORBIDDEN,
            "this token may only read (scope read); changes need a token made with --scope admin",
        );
    }
    let caller = &me.caller;
    let users_back = {
        let d = field(&f, "domain");
        if d.is_empty() {
            "/admin/users".to_owned()
        } else {
            format!("/admin/users?domain={}", super::ctl::enc(&d))
        }
    };
    let (back, outcome): (String, Result<String, ApiError>) = match (section.as_str(), act.as_str())
    {
        ("users", "create") => {
            let jid = field(&f, "jid");
            let r = api::user_create(
                &st,
                caller,
                NewUser {
                    jid: jid.clone(),
                    password: optional(&f, "password"),
                    force: false,
                },
            )
            .await
            .map(|v| match v["password"].as_str() {
                Some(p) => format!("created {jid}; its generated password (shown once): {p}"),
                None => format!("created {jid}"),
            });
            (users_back, r)
        }
        ("users", "delete") => {
            let jid = field(&f, "jid");
            let r = api::user_delete(&st, caller, &jid).await.map(|v| {
                format!(
                    "deleted {jid} ({} session(s) closed)",
                    num(&v["sessions_closed"])
                )
            });
            (users_back, r)
        }
        ("users", "password") => {
            let jid = field(&f, "jid");
            let r = api::user_password(&st, caller, &jid, optional(&f, "password"))
                .await
                .map(|v| match v["password"].as_str() {
                    Some(p) => format!("new password for {jid} (shown once): {p}"),
                    None => format!("password of {jid} changed"),
                });
            (users_back, r)
        }
        ("users", "ban") => {
            let jid = field(&f, "jid");
            let r = api::user_ban(&st, caller, &jid, optional(&f, "reason"))
                .await
                .map(|v| {
                    format!(
                        "banned {jid} ({} session(s) closed)",
                        num(&v["sessions_closed"])
                    )
                });
            (users_back, r)
        }
        ("users", "unban") => {
            let jid = field(&f, "jid");
            let r = api::user_unban(&st, caller, &jid)
                .await
                .map(|_| format!("unbanned {jid}"));
            (users_back, r)
        }
        ("domains", "add") => {
            let name = field(&f, "name");
            let mut settings = serde_json::Map::new();
            for k in ["registration", "max_sessions", "archive_retention_days"] {
                if let Some(v) = optional(&f, k) {
                    settings.insert(k.to_owned(), Value::String(v.trim().to_owned()));
                }
            }
            let r = api::domain_add(
                &st,
                caller,
                NewDomain {
                    name: name.clone(),
                    enabled: f.get("enabled").is_some_and(|v| v == "on"),
                    settings,
                },
            )
            .await
            .map(|v| format!("added {} ({})", num(&v["name"]), num(&v["state"])));
            ("/admin/domains".to_owned(), r)
        }
        ("domains", a @ ("disable" | "enable")) => {
            let name = field(&f, "name");
            let r = api::domain_set_enabled(&st, caller, &name, a == "enable")
                .await
                .map(|v| format!("{} is now {}", num(&v["name"]), num(&v["state"])));
            ("/admin/domains".to_owned(), r)
        }
        ("domains", "remove") => {
            let name = field(&f, "name");
            let r = if f.get("confirm").is_some_and(|v| v == "yes") {
                api::domain_remove(&st, caller, &name).await.map(|_| {
                    format!("removing {name}: its sessions are closed and its data is deleted in the background")
                })
            } else {
                Err(api::bad(
                    "tick the box to confirm that all its data is deleted",
                ))
            };
            ("/admin/domains".to_owned(), r)
        }
        ("sessions", "kick") => {
            let jid = field(&f, "jid");
            let r = api::session_kick(&st, caller, &jid, optional(&f, "reason"))
                .await
                .map(|v| {
                    let list: Vec<&str> = v["kicked"]
                        .as_array()
                        .map(|l| l.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    format!("closed {}", list.join(", "))
                });
            ("/admin/sessions".to_owned(), r)
        }
        _ => return error_page(StatusCode::NOT_FOUND, "no such action"),
    };
    match outcome {
        Ok(text) => st.web.flash(&me.id, true, text),
        Err(e) => st.web.flash(&me.id, false, e.message),
    }
    redirect(&back)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_covers_markup_and_quotes() {
        assert_eq!(
            esc("<a href=\"x\" onclick='y'>&</a>"),
            "&lt;a href=&quot;x&quot; onclick=&#39;y&#39;&gt;&amp;&lt;/a&gt;"
        );
    }

    #[test]
    fn cookies_are_read_by_name() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; starling_admin=abc; starling_admin_login=def"),
        );
        assert_eq!(cookie(&h, COOKIE).as_deref(), Some("abc"));
        assert_eq!(cookie(&h, LOGIN_COOKIE).as_deref(), Some("def"));
        assert_eq!(cookie(&h, "b"), None);
    }

    #[test]
    fn failed_logins_are_limited_per_address() {
        let w = WebState::default();
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        for _ in 0..LOGIN_FAILURES {
            assert!(w.login_allowed(ip));
            w.login_failed(ip);
        }
        assert!(!w.login_allowed(ip));
        assert!(w.login_allowed("192.0.2.2".parse().unwrap()));
    }

    #[test]
    fn sessions_expire_and_close() {
        let w = WebState::default();
        let id = w.open("ops");
        let (token, csrf, _) = w.get(&id, false).unwrap();
        assert_eq!(token, "ops");
        assert_ne!(csrf, id);
        w.flash(&id, true, "done".into());
        assert_eq!(
            w.get(&id, true).unwrap().2.map(|f| f.text).as_deref(),
            Some("done")
        );
        assert!(w.get(&id, true).unwrap().2.is_none(), "a flash shows once");
        lock(&w.sessions).get_mut(&id).unwrap().last_seen =
            Instant::now() - SESSION_IDLE - Duration::from_secs(1);
        assert!(w.get(&id, false).is_none());
        let id = w.open("ops");
        w.close(&id);
        assert!(w.get(&id, false).is_none());
    }

    #[test]
    fn cross_origin_posts_are_recognised() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:5290"));
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:5290"),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(!same_origin(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&h));
    }
}
