//! The web admin pages: dashboard, users, domains, sessions and rooms,
//! each read through the API's operations.

use super::html::{error_page, esc, form, html, page};
use super::login::logged;
use super::{Flash, PAGE};
use crate::admin::api::{self};
use crate::admin::Shared;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::Value;
use std::collections::HashMap;
use std::fmt::Write as _;

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

pub(super) fn num(v: &Value) -> String {
    match v {
        Value::Null => "—".to_owned(),
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

pub(super) async fn dashboard(State(st): State<Shared>, headers: HeaderMap) -> Response {
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
            Some(me.nav(&st, "Dashboard")),
            me.flash.as_ref(),
            &b,
        ),
    )
}

fn query_of(raw: &Option<String>) -> HashMap<String, String> {
    api::query(raw).unwrap_or_default()
}

pub(super) async fn users_page(
    State(st): State<Shared>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let mut me = match logged(&st, &headers, true).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let q = query_of(&raw);
    let domain = q.get("domain").filter(|d| !d.is_empty()).cloned();
    let after = q.get("after").cloned();
    let mut b = String::new();
    let mut flash = me.flash.take();
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
            esc(&crate::admin::ctl::enc(&domain)),
            esc(&crate::admin::ctl::enc(&n))
        );
    }
    html(
        StatusCode::OK,
        page("Users", Some(me.nav(&st, "Users")), flash.as_ref(), &b),
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

pub(super) async fn domains_page(State(st): State<Shared>, headers: HeaderMap) -> Response {
    let mut me = match logged(&st, &headers, true).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let mut flash = me.flash.take();
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
        page("Domains", Some(me.nav(&st, "Domains")), flash.as_ref(), &b),
    )
}

pub(super) async fn sessions_page(
    State(st): State<Shared>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let mut me = match logged(&st, &headers, true).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let q = query_of(&raw);
    let after = q.get("after").cloned().unwrap_or_default();
    let mut flash = me.flash.take();
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
            esc(&crate::admin::ctl::enc(&n))
        );
    }
    html(
        StatusCode::OK,
        page(
            "Sessions",
            Some(me.nav(&st, "Sessions")),
            flash.as_ref(),
            &b,
        ),
    )
}

/// A page a module added (`AdminExtensions::pages`): the login checked
/// here, the body the module's, in the admin's frame.
pub(super) async fn module_page(
    st: Shared,
    headers: HeaderMap,
    raw: Option<String>,
    index: usize,
) -> Response {
    let mut me = match logged(&st, &headers, true).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let Some(p) = st.extensions.pages.get(index) else {
        return error_page(StatusCode::NOT_FOUND, "no such page");
    };
    let mut flash = me.flash.take();
    let body = match (p.body)(query_of(&raw)).await {
        Ok(b) => b,
        Err(text) => {
            flash = Some(Flash { ok: false, text });
            String::new()
        }
    };
    html(
        StatusCode::OK,
        page(p.title, Some(me.nav(&st, p.title)), flash.as_ref(), &body),
    )
}
