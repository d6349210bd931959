//! Web sessions of the admin page: the check every page makes (cookie,
//! expiry, a still-valid token), the login form and login with an admin
//! token (limited per address), logout.

use super::html::{cookie, error_page, html, page, redirect, same_origin, set_cookie, Nav};
use super::{random_token, same, Flash, COOKIE, LOGIN_COOKIE, LOGIN_WINDOW};
use crate::admin::api::{self, ApiError};
use crate::admin::{tokens, AdminState, Caller, Shared};
use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use starling_core::storage::SCOPE_ADMIN;
use std::collections::HashMap;
use std::net::SocketAddr;

/// A logged-in request: the caller (token name), the session id and its
/// CSRF token, and the flash message for this page.
pub(super) struct Logged {
    pub(super) id: String,
    pub(super) caller: Caller,
    /// The token may only read (scope `read`): pages, no actions.
    pub(super) read_only: bool,
    pub(super) csrf: String,
    pub(super) flash: Option<Flash>,
}

impl Logged {
    /// The navigation of a page of section `active`.
    pub(super) fn nav<'a>(&'a self, st: &'a AdminState, active: &'a str) -> Nav<'a> {
        Nav {
            active,
            token: &self.caller.0,
            csrf: &self.csrf,
            pages: &st.extensions.pages,
        }
    }
}

/// The request's web session, or the response to give instead (the login
/// page, 503 while starting or stopping).
pub(super) async fn logged(
    st: &Shared,
    headers: &HeaderMap,
    take_flash: bool,
) -> Result<Logged, Response> {
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

pub(super) async fn login_page(State(st): State<Shared>, headers: HeaderMap) -> Response {
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
pub(super) fn fields(body: &Bytes) -> Result<HashMap<String, String>, ApiError> {
    let text = std::str::from_utf8(body).map_err(|_| api::bad("the form is not UTF-8"))?;
    api::query(&Some(text.to_owned()))
}

pub(super) async fn login(
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

pub(super) async fn logout(State(st): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
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
