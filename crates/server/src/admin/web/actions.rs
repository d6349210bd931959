//! The web admin page's actions (POST, then a redirect with a one-time
//! message): each calls the API's operation, so it is checked, performed
//! and logged as through the API.

use super::html::{error_page, redirect, same_origin};
use super::login::{fields, logged};
use super::pages::num;
use super::same;
use crate::admin::api::{self, ApiError, NewDomain, NewUser};
use crate::admin::Shared;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::Value;
use std::collections::HashMap;

fn field(f: &HashMap<String, String>, k: &str) -> String {
    f.get(k).map(|v| v.trim().to_owned()).unwrap_or_default()
}

fn optional(f: &HashMap<String, String>, k: &str) -> Option<String> {
    f.get(k).filter(|v| !v.is_empty()).cloned()
}

/// `POST /admin/{section}/{action}`: the API operation, then back to the
/// section's page with the outcome.
pub(super) async fn action(
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
            format!("/admin/users?domain={}", crate::admin::ctl::enc(&d))
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
