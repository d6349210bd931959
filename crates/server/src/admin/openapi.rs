//! The OpenAPI 3.0 document of the admin listener, served at
//! [`PATH`]. Written by hand (no generator crate): the test below checks
//! that every route the router serves is described, and nothing else.

use crate::modules::common::admin_api::openapi::{body, err, limit, ok, op, query};
use serde_json::{json, Value};

/// Where the document is served (no token needed).
pub(crate) const PATH: &str = "/api/openapi.json";

/// The listener's routes outside the API: (method, path).
#[cfg(test)]
pub(crate) const OTHER_ROUTES: &[(&str, &str)] = &[
    ("get", "/health/live"),
    ("get", "/health/ready"),
    ("get", "/metrics"),
    ("get", PATH),
];

fn jid_param() -> Value {
    json!({
        "name": "jid", "in": "path", "required": true,
        "description": "The account, user@domain (percent-encoded in the path).",
        "schema": { "type": "string", "example": "alice@example.org" }
    })
}

/// The document, with the paths modules add (`extra`: their
/// `AdminExtensions::openapi`).
pub(crate) fn document(extra: &[Value]) -> Value {
    let object = |props: Value| json!({ "type": "object", "properties": props });
    let user_page = object(json!({
        "domain": { "type": "string" },
        "users": { "type": "array", "items": { "type": "string" } },
        "next": { "type": "string", "nullable": true, "description": "The `after` of the next page; null on the last page." }
    }));
    let session = object(json!({
        "jid": { "type": "string" }, "node": { "type": "integer" },
        "available": { "type": "boolean" }, "priority": { "type": "integer", "nullable": true },
        "since": { "type": "string", "format": "date-time" },
        "ip": { "type": "string" }, "port": { "type": "integer" }, "tls": { "type": "boolean" },
        "state": { "type": "string", "enum": ["pre-auth", "authenticated", "established", "detached", "closing"] },
        "resumable_for_secs": { "type": "integer" },
        "transport": { "type": "string", "enum": ["tcp", "tls", "websocket", "bosh", "detached"], "description": "This node's sessions only, like ip, port, tls and state." }
    }));
    let not_found = err("No such account.");
    let text = |d: &str| json!({ "description": d, "content": { "text/plain": { "schema": { "type": "string" } } } });
    let mut doc = json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Starling admin API",
            "version": "1",
            "description": "The admin listener of a Starling XMPP server ([admin] listen, loopback by default; docs/admin.md). /api/v1 needs `Authorization: Bearer <token>` (tokens: `starling admin token create --name NAME`). Every change is logged as `admin action` with the token's name."
        },
        "servers": [{ "url": "http://127.0.0.1:5290" }],
        "security": [{ "bearer": [] }],
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": {
                "Error": object(json!({ "error": { "type": "string" }, "status": { "type": "integer" } }))
            }
        },
        "paths": {
            "/health/live": { "get": {
                "summary": "Liveness: 200 while the process serves requests.", "security": [],
                "responses": { "200": ok("Live.", object(json!({ "status": { "type": "string" } }))) }
            }},
            "/health/ready": { "get": {
                "summary": "Readiness: 200 once start-up is complete, 503 while starting or shutting down.", "security": [],
                "responses": {
                    "200": ok("Ready.", object(json!({ "status": { "type": "string" } }))),
                    "503": ok("Not ready.", object(json!({ "status": { "type": "string" }, "reason": { "type": "string", "enum": ["starting", "shutting down"] } })))
                }
            }},
            "/metrics": { "get": {
                "summary": "Prometheus metrics (OpenMetrics text format 1.0.0).", "security": [],
                "responses": { "200": text("The metrics.") }
            }},
            PATH: { "get": {
                "summary": "This document.", "security": [],
                "responses": { "200": ok("OpenAPI 3.0 document.", json!({ "type": "object" })) }
            }},
            "/api/v1/users": {
                "get": op("List a domain's accounts by name, a page at a time.",
                    vec![
                        query("domain", "The domain (default: the first configured).", json!({ "type": "string" })),
                        query("after", "Start after this user name (the previous page's `next`).", json!({ "type": "string" })),
                        limit(100, 1000),
                    ], None,
                    json!({ "200": ok("One page.", user_page) })),
                "post": op("Create an account.", vec![],
                    Some(body(object(json!({
                        "jid": { "type": "string" },
                        "password": { "type": "string", "description": "Left out: one is generated and returned." },
                        "force": { "type": "boolean", "description": "Allow a domain this server does not serve." }
                    })))),
                    json!({
                        "201": ok("Created.", object(json!({ "jid": { "type": "string" }, "password": { "type": "string" } }))),
                        "409": err("The account exists.")
                    }))
            },
            "/api/v1/users/{jid}": {
                "get": op("An account: banned or not, its sessions, its offline queue length.", vec![jid_param()], None,
                    json!({
                        "200": ok("The account.", object(json!({
                            "jid": { "type": "string" }, "disabled": { "type": "boolean" },
                            "sessions": { "type": "array", "items": { "type": "string" } },
                            "offline_messages": { "type": "integer" }
                        }))),
                        "404": not_found.clone()
                    })),
                "delete": op("Delete an account and all its data (rooms let go of it first); its sessions close with <not-authorized/>.", vec![jid_param()], None,
                    json!({
                        "200": ok("Deleted.", object(json!({ "jid": { "type": "string" }, "deleted": { "type": "boolean" }, "sessions_closed": { "type": "integer" } }))),
                        "404": not_found.clone()
                    }))
            },
            "/api/v1/users/{jid}/password": {
                "post": op("Change an account's password (FAST tokens are revoked; sessions stay).", vec![jid_param()],
                    Some(body(object(json!({ "password": { "type": "string", "description": "Left out: one is generated and returned." } })))),
                    json!({
                        "200": ok("Changed.", object(json!({ "jid": { "type": "string" }, "password_changed": { "type": "boolean" }, "password": { "type": "string" } }))),
                        "404": not_found.clone()
                    }))
            },
            "/api/v1/users/{jid}/ban": {
                "post": op("Ban an account: it cannot log in (<account-disabled/>) and its sessions close with <policy-violation/>.", vec![jid_param()],
                    Some(body(object(json!({ "reason": { "type": "string", "description": "Sent as the stream error's text." } })))),
                    json!({
                        "200": ok("Banned.", object(json!({ "jid": { "type": "string" }, "disabled": { "type": "boolean" }, "sessions_closed": { "type": "integer" } }))),
                        "404": not_found.clone()
                    }))
            },
            "/api/v1/users/{jid}/unban": {
                "post": op("Lift a ban.", vec![jid_param()], None,
                    json!({
                        "200": ok("Unbanned.", object(json!({ "jid": { "type": "string" }, "disabled": { "type": "boolean" } }))),
                        "404": not_found.clone()
                    }))
            },
            "/api/v1/users/{jid}/offline": {
                "get": op("The account's offline messages (XEP-0160), oldest first, left in place.", vec![jid_param(), limit(100, 10000)], None,
                    json!({
                        "200": ok("The queue.", object(json!({
                            "jid": { "type": "string" }, "count": { "type": "integer" },
                            "messages": { "type": "array", "items": object(json!({
                                "id": { "type": "integer" }, "from": { "type": "string" },
                                "stored_at": { "type": "string", "format": "date-time" }, "stanza": { "type": "string" }
                            })) }
                        }))),
                        "404": not_found.clone()
                    }))
            },
            "/api/v1/users/{jid}/archive/purge": {
                "post": op("Delete the account's archived messages (XEP-0313): all, or those before an instant.", vec![jid_param()],
                    Some(body(object(json!({ "before": { "type": "string", "format": "date-time", "example": "2026-01-31T00:00:00Z" } })))),
                    json!({ "200": ok("Purged.", object(json!({ "jid": { "type": "string" }, "deleted": { "type": "integer" } }))) }))
            },
            "/api/v1/sessions": {
                "get": op("Bound sessions by full JID, on every node of the cluster (from this node's registry); connection details for this node's.",
                    vec![
                        query("user", "Only this account's sessions (user@domain).", json!({ "type": "string" })),
                        query("node", "Only this node's (a node id, `local`), or `all` (default).", json!({ "type": "string" })),
                        query("after", "Start after this full JID (the previous page's `next`).", json!({ "type": "string" })),
                        limit(100, 1000),
                    ], None,
                    json!({ "200": ok("One page.", object(json!({
                        "node": { "type": "integer" },
                        "sessions": { "type": "array", "items": session },
                        "next": { "type": "string", "nullable": true }
                    }))) }))
            },
            "/api/v1/sessions/kick": {
                "post": op("Close a session (full JID) or every session of an account (bare JID) with <policy-violation/>.", vec![],
                    Some(json!({ "required": true, "content": { "application/json": { "schema": {
                        "type": "object", "required": ["jid"],
                        "properties": { "jid": { "type": "string" }, "reason": { "type": "string" } }
                    } } } })),
                    json!({
                        "200": ok("Closed.", object(json!({ "kicked": { "type": "array", "items": { "type": "string" } } }))),
                        "404": err("No such session.")
                    }))
            },
            "/api/v1/messages": {
                "post": op("Send a message from the server (its domain) to a JID, routed like any message.", vec![],
                    Some(json!({ "required": true, "content": { "application/json": { "schema": {
                        "type": "object", "required": ["to", "body"],
                        "properties": {
                            "to": { "type": "string" }, "body": { "type": "string" },
                            "type": { "type": "string", "enum": ["chat", "normal", "headline"], "default": "chat" },
                            "subject": { "type": "string" }
                        }
                    } } } })),
                    json!({ "202": ok("Routed.", object(json!({
                        "to": { "type": "string" }, "from": { "type": "string" }, "id": { "type": "string" }, "type": { "type": "string" }
                    }))) }))
            },
            "/api/v1/stats": {
                "get": op("Server statistics: version, node, uptime, sessions, storage queues.", vec![], None,
                    json!({ "200": ok("Statistics.", object(json!({
                        "version": { "type": "string" }, "node": { "type": "integer" }, "uptime_secs": { "type": "integer" },
                        "domains": { "type": "array", "items": { "type": "string" } },
                        "sessions": object(json!({ "this_node": { "type": "integer" }, "all_nodes": { "type": "integer" } })),
                        "storage": { "type": "string" },
                        "write_behind": { "type": "object", "additionalProperties": object(json!({
                            "queued": { "type": "integer" }, "written": { "type": "integer" }, "dropped": { "type": "integer" }
                        })) },
                        "pressure": { "type": "boolean" }, "cluster": { "type": "boolean" }
                    }))) }))
            },
            "/api/v1/cluster": {
                "get": op("Cluster status as this node sees it ({\"enabled\": false} without [cluster]).", vec![], None,
                    json!({ "200": ok("Nodes.", object(json!({
                        "enabled": { "type": "boolean" }, "this_node": { "type": "integer" },
                        "nodes": { "type": "array", "items": object(json!({
                            "node": { "type": "integer" }, "this_node": { "type": "boolean" }, "sessions": { "type": "integer" },
                            "registry_entries": { "type": "integer" }, "last_heartbeat_ms_ago": { "type": "integer" }
                        })) },
                        "unacknowledged_deliveries": { "type": "integer" }
                    }))) }))
            }
        }
    });
    for more in std::iter::once(domain_paths()).chain(extra.iter().cloned()) {
        if let (Some(paths), Value::Object(more)) = (doc["paths"].as_object_mut(), more) {
            paths.extend(more);
        }
    }
    doc
}

/// The domain endpoints (a document of their own: one `json!` for
/// everything exceeds the macro recursion limit).
fn domain_paths() -> Value {
    let object = |props: Value| json!({ "type": "object", "properties": props });
    let settings = json!({
        "type": "object",
        "description": "Overrides of the global configuration (docs/domains.md). In a request, null or \"default\" removes an override.",
        "properties": {
            "registration": { "type": "boolean", "description": "In-band registration on (true, \"on\") or off (false, \"off\")." },
            "archive_retention_days": { "type": "integer", "minimum": 0, "description": "0: forever." },
            "max_sessions": { "type": "integer", "minimum": 0, "description": "Sessions bound at once on one node." },
            "certificate": { "type": "string", "description": "PEM chain on the server's machine (with private_key)." },
            "private_key": { "type": "string" },
            "disabled_modules": { "type": "array", "items": { "type": "string" }, "description": "Modules switched off for this domain (names as in [modules.<name>]; not presence, roster, disco, register, component); [] for none." }
        }
    });
    let domain = object(json!({
        "name": { "type": "string" },
        "source": { "type": "string", "enum": ["config", "stored"] },
        "state": { "type": "string", "enum": ["enabled", "disabled", "removing"] },
        "served": { "type": "boolean" },
        "settings": settings.clone(),
        "created_at": { "type": "string", "format": "date-time", "nullable": true },
        "removal": object(json!({
            "running_here": { "type": "boolean" },
            "accounts_deleted": { "type": "integer", "nullable": true, "description": "Counted every 1000 accounts, on the node that deletes." }
        }))
    }));
    let name_param = json!({
        "name": "name", "in": "path", "required": true,
        "description": "The domain.",
        "schema": { "type": "string", "example": "chat.example.net" }
    });
    let no_domain = err("No such domain.");
    let configured = err("A domain of the configuration file (it cannot be changed at run time), one that exists already, or one being removed.");
    json!({
            "/api/v1/domains": {
                "get": op("Every domain: the configuration file's, then those added at run time, with state and settings.", vec![], None,
                    json!({ "200": ok("The domains.", object(json!({ "domains": { "type": "array", "items": domain.clone() } }))) })),
                "post": op("Add a domain at run time (served at once on this node, within 2 s on the others).", vec![],
                    Some(json!({ "required": true, "content": { "application/json": { "schema": {
                        "type": "object", "required": ["name"],
                        "properties": {
                            "name": { "type": "string" },
                            "enabled": { "type": "boolean", "default": true },
                            "settings": settings.clone()
                        }
                    } } } })),
                    json!({ "201": ok("Added.", domain.clone()), "409": configured.clone() }))
            },
            "/api/v1/domains/{name}": {
                "get": op("One domain, with the progress of its removal.", vec![name_param.clone()], None,
                    json!({ "200": ok("The domain.", domain.clone()), "404": no_domain.clone() })),
                "delete": op("Remove a domain: it stops being served (its sessions close with <host-gone/>) and its data is deleted in the background; GET shows state `removing` until it answers 404.", vec![name_param.clone()], None,
                    json!({
                        "202": ok("Removal started.", object(json!({ "name": { "type": "string" }, "state": { "type": "string" }, "status": { "type": "string" } }))),
                        "404": no_domain.clone(), "409": configured.clone()
                    }))
            },
            "/api/v1/domains/{name}/disable": {
                "post": op("Stop serving a domain, keeping its data: its sessions close with <host-gone/>, new streams get <host-unknown/>.", vec![name_param.clone()], None,
                    json!({ "200": ok("Disabled.", domain.clone()), "404": no_domain.clone(), "409": configured.clone() }))
            },
            "/api/v1/domains/{name}/enable": {
                "post": op("Serve a disabled domain again.", vec![name_param.clone()], None,
                    json!({ "200": ok("Enabled.", domain.clone()), "404": no_domain.clone(), "409": configured.clone() }))
            },
            "/api/v1/domains/{name}/settings": {
                "put": op("Replace a domain's settings (keys left out go back to the default).", vec![name_param.clone()],
                    Some(body(settings.clone())),
                    json!({ "200": ok("Changed.", domain.clone()), "404": no_domain.clone(), "409": configured.clone() })),
                "patch": op("Change some of a domain's settings (null or \"default\" removes an override).", vec![name_param.clone()],
                    Some(body(settings.clone())),
                    json!({ "200": ok("Changed.", domain.clone()), "404": no_domain.clone(), "409": configured.clone() }))
            }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every route the admin router serves is in the document with its
    /// method, and the document describes no route that is not served.
    #[test]
    fn openapi_describes_every_route_and_only_those() {
        // With the group-chat module's endpoints, the one module that adds
        // some today.
        let doc = document(&[crate::modules::muc::admin_openapi()]);
        let paths = doc["paths"].as_object().expect("paths");
        let mut served: Vec<(String, String)> = super::super::api::table()
            .into_iter()
            .map(|(m, p, _)| (m.to_owned(), p.to_owned()))
            .collect();
        served.extend(
            crate::modules::muc::ADMIN_ROUTES
                .iter()
                .map(|(m, p)| (m.to_string(), p.to_string())),
        );
        served.extend(
            OTHER_ROUTES
                .iter()
                .map(|(m, p)| (m.to_string(), p.to_string())),
        );
        for (method, path) in &served {
            assert!(
                paths.get(path).and_then(|p| p.get(method)).is_some(),
                "{method} {path} is served but not in the OpenAPI document"
            );
        }
        for (path, ops) in paths {
            for method in ops.as_object().expect("operations").keys() {
                assert!(
                    served.iter().any(|(m, p)| m == method && p == path),
                    "{method} {path} is documented but not served"
                );
            }
        }
        assert_eq!(doc["openapi"], "3.0.3");
    }
}
