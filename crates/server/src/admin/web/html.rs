//! HTML for the web admin page: escaping, the page frame and its style,
//! forms with their CSRF field, redirects, cookies, the same-origin check
//! and error pages.

use super::Flash;
use crate::modules::common::admin_api::AdminPage;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::fmt::Write as _;

pub(crate) use crate::modules::common::admin_api::esc;

pub(super) const STYLE: &str = "body{font:15px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#f6f7f9}\
header{background:#1d3557;color:#fff;padding:.6em 1em;display:flex;gap:1.2em;align-items:center}\
header a{color:#fff;text-decoration:none}header a.on{text-decoration:underline}\
header form{margin-left:auto}main{padding:1em;max-width:70em}\
table{border-collapse:collapse;background:#fff;margin:.5em 0}td,th{border:1px solid #ddd;padding:.3em .6em;text-align:left;vertical-align:top}\
form.inline{display:inline}input,select,button{font:inherit;margin:.1em}\
.flash{padding:.5em 1em;border-radius:4px}.ok{background:#d8f3dc}.err{background:#ffd6d6}\
.cards{display:flex;flex-wrap:wrap;gap:1em}.card{background:#fff;border:1px solid #ddd;padding:.6em 1em;min-width:10em}\
.card b{display:block;font-size:1.6em}code{background:#eee;padding:0 .2em}";

/// The navigation of a logged-in page.
pub(super) struct Nav<'a> {
    /// The active section's title.
    pub active: &'a str,
    /// The token's name.
    pub token: &'a str,
    /// The session's CSRF value (the logout form).
    pub csrf: &'a str,
    /// The pages modules added, linked after the admin's own.
    pub pages: &'a [AdminPage],
}

/// A whole page. `nav` once logged in.
pub(super) fn page(title: &str, nav: Option<Nav<'_>>, flash: Option<&Flash>, body: &str) -> String {
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
    if let Some(Nav {
        active,
        token,
        csrf,
        pages,
    }) = nav
    {
        let own = [
            ("/admin", "Dashboard"),
            ("/admin/users", "Users"),
            ("/admin/domains", "Domains"),
            ("/admin/sessions", "Sessions"),
        ];
        let added = pages.iter().map(|p| (p.path, p.title));
        for (href, name) in own.into_iter().chain(added) {
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

pub(super) fn csrf_field(csrf: &str) -> String {
    format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        esc(csrf)
    )
}

/// A POST form with hidden fields, visible `inner` inputs and a button.
pub(super) fn form(
    action: &str,
    csrf: &str,
    hidden: &[(&str, &str)],
    inner: &str,
    button: &str,
) -> String {
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
pub(super) fn html(status: StatusCode, body: String) -> Response {
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

pub(super) fn redirect(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    r.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(to).unwrap_or(HeaderValue::from_static("/admin")),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

pub(super) fn set_cookie(r: &mut Response, name: &str, value: &str, max_age: Option<u64>) {
    let mut c = format!("{name}={value}; Path=/admin; HttpOnly; SameSite=Strict");
    if let Some(s) = max_age {
        let _ = write!(c, "; Max-Age={s}");
    }
    if let Ok(v) = HeaderValue::from_str(&c) {
        r.headers_mut().append(header::SET_COOKIE, v);
    }
}

pub(super) fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
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
pub(super) fn same_origin(headers: &HeaderMap) -> bool {
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

pub(super) fn error_page(status: StatusCode, text: &str) -> Response {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::web::{COOKIE, LOGIN_COOKIE};

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
