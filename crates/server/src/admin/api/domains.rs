//! The admin API's domain endpoints (docs/domains.md), through
//! `crate::domains::Domains`: list, show, add, enable, disable and remove
//! hosted domains; read, replace and patch their settings.

use super::{audit, bad, storage_failed, ApiError, ApiResult, Body, OpResult};
use crate::admin::{json, Caller, Shared};
use crate::domains::{DomainError, DomainInfo, DomainSource};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Extension;
use serde::Deserialize;
use serde_json::{json as j, Value};
use starling_core::storage::{DomainSettings, DomainState};

fn domain_error(e: DomainError) -> ApiError {
    let status = match &e {
        DomainError::InvalidName(..) | DomainError::BadSetting(_) => StatusCode::BAD_REQUEST,
        DomainError::Configured(_) | DomainError::Exists(_) | DomainError::Removing(_) => {
            StatusCode::CONFLICT
        }
        DomainError::NotFound(_) => StatusCode::NOT_FOUND,
        DomainError::Storage(e) => return storage_failed(e),
    };
    ApiError::new(status, e.to_string())
}

/// A domain as the API shows it.
fn domain_value(st: &Shared, d: &DomainInfo) -> Value {
    let mut v = j!({
        "name": d.name,
        "source": match d.source {
            DomainSource::Configured => "config",
            DomainSource::Stored => "stored",
        },
        "state": d.state.as_str(),
        "served": st.env.hosts.is_local(&d.name),
        "settings": d.settings,
        "created_at": d.created_at.map(|ms| starling_proto::datetime::xep0082_datetime(
            u128::try_from(ms).unwrap_or(0))),
    });
    if d.state == DomainState::Removing {
        // Progress of a removal this node runs (another node's is in its log).
        v["removal"] = j!({
            "running_here": st.domains.removal_progress(&d.name).is_some(),
            "accounts_deleted": st.domains.removal_progress(&d.name),
        });
    }
    v
}

/// Every domain: configured ones first, then stored ones by name, each
/// with its state and settings.
pub(crate) async fn domains_list(st: &Shared) -> OpResult {
    let list = st.domains.list().await.map_err(domain_error)?;
    let v: Vec<Value> = list.iter().map(|d| domain_value(st, d)).collect();
    Ok(j!({ "domains": v }))
}

/// `GET /api/v1/domains`.
pub(super) async fn list_domains(State(st): State<Shared>) -> ApiResult {
    Ok(json(StatusCode::OK, &domains_list(&st).await?))
}

/// One domain (404 if neither configured nor stored).
pub(crate) async fn domain_show(st: &Shared, raw: &str) -> OpResult {
    let name = crate::domains::validate_name(raw).map_err(domain_error)?;
    let list = st.domains.list().await.map_err(domain_error)?;
    let d = list.iter().find(|d| d.name == name).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no domain {name} (GET /api/v1/domains lists them)"),
        )
    })?;
    Ok(domain_value(st, d))
}

/// `GET /api/v1/domains/{name}`.
pub(super) async fn get_domain(State(st): State<Shared>, Path(name): Path<String>) -> ApiResult {
    Ok(json(StatusCode::OK, &domain_show(&st, &name).await?))
}

/// Applies a JSON object of settings to `s`, key by key, through
/// `domains::apply_setting` (as `starling domain set` does): `true`/`false`
/// are on/off, numbers and strings their text, `null` or `"default"`
/// remove the override.
pub(crate) fn apply_settings_json(
    s: &mut DomainSettings,
    given: &serde_json::Map<String, Value>,
) -> Result<(), ApiError> {
    for (key, value) in given {
        let text = match value {
            Value::Null => "default".to_owned(),
            Value::Bool(true) => "on".to_owned(),
            Value::Bool(false) => "off".to_owned(),
            Value::Number(n) => n.to_string(),
            Value::String(t) => t.clone(),
            // A list of names (disabled_modules): [] is "none".
            Value::Array(items) => {
                let names: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
                match names {
                    Some(n) if n.is_empty() => "none".to_owned(),
                    Some(n) => n.join(","),
                    None => {
                        return Err(bad(format!(
                            "setting {key:?}: a list of strings is expected"
                        )))
                    }
                }
            }
            _ => {
                return Err(bad(format!(
                "setting {key:?}: a string, number, boolean, list of strings or null is expected"
            )))
            }
        };
        crate::domains::apply_setting(s, &format!("{key}={text}")).map_err(domain_error)?;
    }
    Ok(())
}

/// A certificate named in settings must load (as the CLI checks).
async fn check_certificate(s: &DomainSettings) -> Result<(), ApiError> {
    if let Some((c, k)) = s.certificate_pair() {
        let (c, k) = (c.to_owned(), k.to_owned());
        tokio::task::spawn_blocking(move || crate::tls::TlsContext::load(&c, &k).map(|_| ()))
            .await
            .map_err(|e| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("checking the certificate failed: {e}"),
                )
            })?
            .map_err(|e| bad(format!("the certificate cannot be used: {e:#}")))?;
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewDomain {
    pub(crate) name: String,
    #[serde(default = "yes")]
    pub(crate) enabled: bool,
    #[serde(default)]
    pub(crate) settings: serde_json::Map<String, Value>,
}

fn yes() -> bool {
    true
}

/// Adds a domain (enabled unless `enabled` is false) with its settings;
/// this node serves it at once, the others within 2 s.
pub(crate) async fn domain_add(st: &Shared, caller: &Caller, req: NewDomain) -> OpResult {
    let name = crate::domains::validate_name(&req.name).map_err(domain_error)?;
    let mut settings = DomainSettings::default();
    apply_settings_json(&mut settings, &req.settings)?;
    check_certificate(&settings).await?;
    let d = st
        .domains
        .add(&name, req.enabled, settings)
        .await
        .map_err(domain_error)?;
    audit(caller, "domain.add", &d.name);
    domain_show(st, &d.name).await
}

/// `POST /api/v1/domains` `{"name", "enabled"?, "settings"?}`.
pub(super) async fn add_domain(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Body(req): Body<NewDomain>,
) -> ApiResult {
    let v = domain_add(&st, &caller, req).await?;
    Ok(json(StatusCode::CREATED, &v))
}

/// Disables (`enable` false: its sessions close with `host-gone`, new
/// streams get `host-unknown`, its data stays) or enables a stored domain.
pub(crate) async fn domain_set_enabled(
    st: &Shared,
    caller: &Caller,
    raw: &str,
    enable: bool,
) -> OpResult {
    let name = crate::domains::validate_name(raw).map_err(domain_error)?;
    let (r, action) = if enable {
        (st.domains.enable(&name).await, "domain.enable")
    } else {
        (st.domains.disable(&name).await, "domain.disable")
    };
    r.map_err(domain_error)?;
    audit(caller, action, &name);
    domain_show(st, &name).await
}

/// `POST /api/v1/domains/{name}/disable`.
pub(super) async fn disable_domain(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult {
    let v = domain_set_enabled(&st, &caller, &name, false).await?;
    Ok(json(StatusCode::OK, &v))
}

/// `POST /api/v1/domains/{name}/enable`.
pub(super) async fn enable_domain(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult {
    let v = domain_set_enabled(&st, &caller, &name, true).await?;
    Ok(json(StatusCode::OK, &v))
}

/// Marks a stored domain `removing` (not served from now on) and lets the
/// server delete its data in the background; a configured domain is 409.
pub(crate) async fn domain_remove(st: &Shared, caller: &Caller, raw: &str) -> OpResult {
    let name = crate::domains::validate_name(raw).map_err(domain_error)?;
    st.domains.remove(&name).await.map_err(domain_error)?;
    audit(caller, "domain.remove", &name);
    Ok(j!({
        "name": name,
        "state": "removing",
        "status": format!("removal started: its sessions are closed and its data is deleted in the background; GET /api/v1/domains/{name} shows progress until it answers 404"),
    }))
}

/// `DELETE /api/v1/domains/{name}`: 202 Accepted.
pub(super) async fn remove_domain(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult {
    let v = domain_remove(&st, &caller, &name).await?;
    Ok(json(StatusCode::ACCEPTED, &v))
}

/// Changes a stored domain's settings: `replace` sets exactly `given`
/// (every other key back to the default), else only the keys given
/// change (`null`/`"default"` removes one).
pub(crate) async fn domain_settings(
    st: &Shared,
    caller: &Caller,
    raw: &str,
    given: &serde_json::Map<String, Value>,
    replace: bool,
) -> OpResult {
    let name = crate::domains::validate_name(raw).map_err(domain_error)?;
    let mut s = if replace {
        DomainSettings::default()
    } else {
        st.domains.get(&name).await.map_err(domain_error)?.settings
    };
    apply_settings_json(&mut s, given)?;
    check_certificate(&s).await?;
    st.domains
        .set_settings(&name, s)
        .await
        .map_err(domain_error)?;
    audit(caller, "domain.settings", &name);
    domain_show(st, &name).await
}

/// `PUT /api/v1/domains/{name}/settings`: the whole settings object.
pub(super) async fn replace_domain_settings(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Body(given): Body<serde_json::Map<String, Value>>,
) -> ApiResult {
    let v = domain_settings(&st, &caller, &name, &given, true).await?;
    Ok(json(StatusCode::OK, &v))
}

/// `PATCH /api/v1/domains/{name}/settings`: the keys to change.
pub(super) async fn patch_domain_settings(
    State(st): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Body(given): Body<serde_json::Map<String, Value>>,
) -> ApiResult {
    let v = domain_settings(&st, &caller, &name, &given, false).await?;
    Ok(json(StatusCode::OK, &v))
}
