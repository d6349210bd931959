//! The web admin page at `/admin` on the admin listener (docs/admin.md):
//! server-rendered HTML (no script at all; the Content-Security-Policy
//! forbids it), every dynamic value HTML-escaped by [`html::esc`].
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
//!   (list, kick), logout; and the pages modules add (the group-chat
//!   rooms, list only).
//! - Every action calls the API's operation (`api::user_create`,
//!   `api::domain_remove`, …): the same checks, the same effects, the same
//!   `admin action` log line with the token's name. Actions answer with a
//!   redirect (POST/redirect/GET) and a one-time message kept in the
//!   server-side session (a generated password is shown there once).
//!
//! This file holds the web sessions' state and the routes; the rest by
//! concern: `html.rs` (escaping, the page frame, forms, cookies, the
//! origin check), `login.rs` (the session check, login, logout),
//! `pages.rs` (dashboard, users, domains, sessions, modules' pages) and
//! `actions.rs` (the POST actions, through the API's operations).

use super::Shared;
use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::Router;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;

mod actions;
mod html;
mod login;
mod pages;

use actions::action;
use login::{login, login_page, logout};
use pages::{dashboard, domains_page, module_page, sessions_page, users_page};

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

/// The web page's routes (no bearer token: the session cookie), with the
/// pages modules added (`pages`: their paths, in order).
pub(crate) fn routes(pages: &[&'static str]) -> Router<Shared> {
    let own = Router::new()
        .route("/admin", get(dashboard))
        .route("/admin/", get(dashboard))
        .route("/admin/login", get(login_page).post(login))
        .route("/admin/logout", post(logout))
        .route("/admin/users", get(users_page))
        .route("/admin/domains", get(domains_page))
        .route("/admin/sessions", get(sessions_page))
        .route("/admin/{section}/{action}", post(action));
    pages.iter().enumerate().fold(own, |r, (index, path)| {
        r.route(
            path,
            get(
                move |State(st): State<Shared>, headers: HeaderMap, RawQuery(raw): RawQuery| {
                    module_page(st, headers, raw, index)
                },
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
