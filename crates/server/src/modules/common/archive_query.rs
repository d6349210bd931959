//! XEP-0313 queries over an [`ArchiveStore`], shared by every archive the
//! server answers for: a user's own (`modules/mam.rs`) and a room's
//! (`modules/muc/mam.rs`). Modules do not import each other, so what both
//! need lives here, like [`crate::modules::common::write_behind`]:
//!
//! - [`parse`]: a `<query/>` (§4.1 form fields `with`, `start`, `end`,
//!   `before-id`, `after-id`, `ids`; XEP-0059 `max`, `after`, `before`;
//!   `<flip-page/>`, §4.3.4) into an [`ArchiveQuery`] — pure, no storage;
//! - [`answer`]: runs it and renders the `<result/>` messages (§4.2) and the
//!   `<fin/>` iq with its RSM set (§4.3);
//! - [`query_form`] (§4.1.5) and [`metadata`] (§5);
//! - [`purge_domain`] and [`retention_task`]: deleting a domain's messages
//!   older than its retention (users' archives by domain; rooms' by their
//!   service's domain).
//!
//! Who may query an archive, what `with` means there and what a stored
//! stanza looks like to the requester stay with the caller (the `present`
//! closure of [`answer`]). Section numbers are XEP-0313's (version 1.1.3).

use starling_core::storage::{
    ArchiveId, ArchivePage, ArchiveQuery, ArchiveStore, ArchivedMessage, WithFilter,
};
use starling_proto::mam::{result_message, rsm_first_last, NS_MAM, NS_RSM};
use starling_proto::{ns, BareJid, FullJid, Jid, Stanza, StanzaError, StanzaErrorCondition};
use starling_xml::Element;

/// `urn:xmpp:mam:2#extended` (§7): `before-id`/`after-id`/`ids`, flipped
/// pages and metadata, all of which [`parse`] and [`metadata`] provide.
pub const NS_MAM_EXTENDED: &str = "urn:xmpp:mam:2#extended";
const NS_XDATA_VALIDATE: &str = "http://jabber.org/protocol/xdata-validate";

/// A parsed query.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// What to read: filters, exclusive id bounds, page size, direction.
    pub query: ArchiveQuery,
    /// RSM `<max/>` as asked (`Some(0)`: only the count).
    pub max: Option<u32>,
    /// `<flip-page/>`: results in reverse order.
    pub flip: bool,
    /// The `queryid` attribute, echoed in each `<result/>`.
    pub queryid: Option<String>,
    /// Every id the query names (sorted, deduplicated): each must exist in
    /// the archive, else `item-not-found`.
    pub ids_to_check: Vec<ArchiveId>,
}

fn err(c: StanzaErrorCondition, text: &str) -> StanzaError {
    StanzaError::new(c).with_text(text)
}

/// Parses `q` (the `<query xmlns='urn:xmpp:mam:2'/>` payload): unknown ids
/// → `item-not-found`, unknown fields or RSM `<index/>` →
/// `feature-not-implemented`, malformed forms or dates → `bad-request`,
/// more than `max_page` `ids` → `policy-violation`. The page size is RSM
/// `<max/>` capped at `max_page`, else `default_page`.
pub fn parse(q: &Element, default_page: u32, max_page: u32) -> Result<Request, StanzaError> {
    let mut query = ArchiveQuery::default();
    let mut after: Option<ArchiveId> = None;
    let mut before: Option<ArchiveId> = None;
    let mut ids_to_check: Vec<ArchiveId> = Vec::new();
    let tighten_after = |a: &mut Option<ArchiveId>, v: ArchiveId| {
        *a = Some(a.map_or(v, |x| x.max(v)));
    };
    let tighten_before = |b: &mut Option<ArchiveId>, v: ArchiveId| {
        *b = Some(b.map_or(v, |x| x.min(v)));
    };
    let decode = |s: &str| {
        ArchiveId::decode(s.trim()).ok_or_else(|| {
            err(
                StanzaErrorCondition::ItemNotFound,
                "no message with this id in the archive",
            )
        })
    };
    if let Some(x) = q.get_child("x", ns::DATA_FORMS) {
        if !matches!(x.attr("type"), Some("submit") | None) {
            return Err(err(
                StanzaErrorCondition::BadRequest,
                "the form must be of type submit",
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for f in x.children().filter(|c| c.is("field", ns::DATA_FORMS)) {
            let var = f.attr("var").unwrap_or("");
            // XEP-0004 §3.2: a field's var identifies it in its form. A
            // second `ids` field would also get past the page's bound on
            // ids (the fuzzer's mam target found that).
            if !var.is_empty() && !seen.insert(var) {
                return Err(err(
                    StanzaErrorCondition::BadRequest,
                    &format!("field {var:?} is in the form twice"),
                ));
            }
            let values: Vec<String> = f
                .children()
                .filter(|c| c.is("value", ns::DATA_FORMS))
                .map(|v| v.text())
                .collect();
            let single = || -> Result<Option<&str>, StanzaError> {
                match values.len() {
                    0 => Ok(None),
                    1 => Ok(Some(values[0].trim())),
                    _ => Err(err(
                        StanzaErrorCondition::BadRequest,
                        "field takes one value",
                    )),
                }
            };
            match var {
                "FORM_TYPE" => {
                    if single()? != Some(NS_MAM) {
                        return Err(err(
                            StanzaErrorCondition::BadRequest,
                            "FORM_TYPE must be urn:xmpp:mam:2",
                        ));
                    }
                }
                "with" => {
                    if let Some(v) = single()?.filter(|v| !v.is_empty()) {
                        let j: Jid = v.parse().map_err(|_| {
                            err(
                                StanzaErrorCondition::JidMalformed,
                                "'with' is not a valid JID",
                            )
                        })?;
                        let bare = j.to_bare().as_str().to_owned();
                        query.with = Some(match j.resource() {
                            None => WithFilter::Bare(bare),
                            Some(_) => WithFilter::Full {
                                bare,
                                full: j.to_string(),
                            },
                        });
                    }
                }
                "start" | "end" => {
                    if let Some(v) = single()?.filter(|v| !v.is_empty()) {
                        let micros =
                            starling_proto::datetime::parse_xep0082(v).ok_or_else(|| {
                                err(
                                    StanzaErrorCondition::BadRequest,
                                    "dates must be XEP-0082 DateTimes like 2024-01-31T12:00:00Z",
                                )
                            })?;
                        if var == "start" {
                            tighten_after(
                                &mut after,
                                ArchiveId(ArchiveId::lower_bound(micros).0 - 1),
                            );
                        } else {
                            tighten_before(
                                &mut before,
                                ArchiveId(ArchiveId::upper_bound(micros).0.saturating_add(1)),
                            );
                        }
                    }
                }
                "after-id" | "before-id" => {
                    if let Some(v) = single()?.filter(|v| !v.is_empty()) {
                        let id = decode(v)?;
                        ids_to_check.push(id);
                        if var == "after-id" {
                            tighten_after(&mut after, id);
                        } else {
                            tighten_before(&mut before, id);
                        }
                    }
                }
                "ids" => {
                    // One page's worth at most: the ids become bound
                    // parameters of one statement.
                    if values.len() > max_page as usize {
                        return Err(StanzaError::new(StanzaErrorCondition::PolicyViolation)
                            .with_text(format!("at most {max_page} ids per query")));
                    }
                    for v in &values {
                        let id = decode(v)?;
                        ids_to_check.push(id);
                        query.ids.push(id);
                    }
                    if query.ids.is_empty() {
                        return Err(err(
                            StanzaErrorCondition::BadRequest,
                            "'ids' needs at least one value",
                        ));
                    }
                }
                other => {
                    return Err(err(
                        StanzaErrorCondition::FeatureNotImplemented,
                        &format!("unknown query field {other:?}"),
                    ))
                }
            }
        }
    }
    let mut max: Option<u32> = None;
    if let Some(set) = q.get_child("set", NS_RSM) {
        for c in set.children() {
            match (c.ns(), c.name()) {
                (NS_RSM, "max") => {
                    max = Some(c.text().trim().parse().map_err(|_| {
                        err(StanzaErrorCondition::BadRequest, "<max/> must be a number")
                    })?);
                }
                (NS_RSM, "after") => {
                    let id = decode(&c.text())?;
                    ids_to_check.push(id);
                    tighten_after(&mut after, id);
                }
                (NS_RSM, "before") => {
                    query.from_end = true;
                    let t = c.text();
                    if !t.trim().is_empty() {
                        let id = decode(&t)?;
                        ids_to_check.push(id);
                        tighten_before(&mut before, id);
                    }
                }
                (NS_RSM, "index") => {
                    return Err(err(
                        StanzaErrorCondition::FeatureNotImplemented,
                        "RSM <index/> is not supported; page with <after/> and <before/>",
                    ))
                }
                _ => {
                    return Err(err(
                        StanzaErrorCondition::BadRequest,
                        "unexpected element in <set/>",
                    ))
                }
            }
        }
    }
    query.after = after;
    query.before = before;
    query.limit = max.map_or(default_page, |m| m.min(max_page));
    ids_to_check.sort();
    ids_to_check.dedup();
    Ok(Request {
        query,
        max,
        flip: q.has_child("flip-page", NS_MAM),
        queryid: q.attr("queryid").map(str::to_owned),
        ids_to_check,
    })
}

/// Runs `req` (parsed from `iq`'s payload) on `owner`'s archive for
/// `requester`: the `<result/>` messages, from `owner` to `requester`, and
/// the final iq (`<fin/>` with `complete` when the page reaches the end in
/// the paging direction, and the RSM `<first/>`/`<last/>`, or `<count/>`
/// for `max=0`). `present` turns each stored stanza into what the
/// requester sees. Storage failures are logged under `module` and answered
/// with `internal-server-error`. The caller flushes its write-behind queue
/// first if it wants read-your-writes.
pub async fn answer(
    store: &dyn ArchiveStore,
    owner: &BareJid,
    requester: &FullJid,
    iq: &Stanza,
    req: &Request,
    module: &'static str,
    mut present: impl FnMut(&ArchivedMessage, Element) -> Element,
) -> Result<(Vec<Element>, Element), StanzaError> {
    let backend = |e: starling_core::storage::StorageError| {
        tracing::error!(module, user = %owner, error = %e, "archive query failed");
        StanzaError::new(StanzaErrorCondition::InternalServerError)
    };
    if !req.ids_to_check.is_empty() {
        let found = store
            .existing(owner, &req.ids_to_check)
            .await
            .map_err(backend)?;
        if found.len() != req.ids_to_check.len() {
            return Err(err(
                StanzaErrorCondition::ItemNotFound,
                "no message with this id in the archive",
            ));
        }
    }
    let queryid = req.queryid.as_deref();
    let mut set = Element::new("set", NS_RSM);
    let mut fin = Element::new("fin", NS_MAM);
    let mut results = Vec::new();
    if req.max == Some(0) {
        let n = store.count(owner, &req.query).await.map_err(backend)?;
        set.append_child(
            Element::builder("count", NS_RSM)
                .text(n.to_string())
                .build(),
        );
        fin.set_attr("complete", if n == 0 { "true" } else { "false" });
    } else {
        let ArchivePage { messages, complete } =
            store.query(owner, &req.query).await.map_err(backend)?;
        rsm_first_last(
            &mut set,
            messages.first().map(|m| m.id.encode()),
            messages.last().map(|m| m.id.encode()),
        );
        if complete {
            fin.set_attr("complete", "true");
        }
        for m in &messages {
            let Ok(stored) = m.stanza.parse::<Element>() else {
                tracing::error!(module, user = %owner, id = m.id.0, "archived stanza does not parse; skipped");
                continue;
            };
            results.push(result_message(
                owner,
                requester,
                queryid,
                &m.id.encode(),
                &m.id.stamp(),
                present(m, stored),
            ));
        }
        if req.flip {
            results.reverse();
        }
    }
    fin.append_child(set);
    let mut reply = iq.iq_result(Some(fin));
    reply.set_from(Some(owner.clone().into()));
    reply.set_to(Some(requester.clone().into()));
    Ok((results, reply.into_element()))
}

/// §4.1.5: the query form (the payload of the answer to an iq `get`).
pub fn query_form() -> Element {
    let field = |var: &str, ty: &str| {
        Element::builder("field", ns::DATA_FORMS)
            .attr("var", var)
            .attr("type", ty)
            .build()
    };
    let mut form = Element::builder("x", ns::DATA_FORMS)
        .attr("type", "form")
        .build();
    form.append_child(
        Element::builder("field", ns::DATA_FORMS)
            .attr("var", "FORM_TYPE")
            .attr("type", "hidden")
            .append(
                Element::builder("value", ns::DATA_FORMS)
                    .text(NS_MAM)
                    .build(),
            )
            .build(),
    );
    form.append_child(field("with", "jid-single"));
    form.append_child(field("start", "text-single"));
    form.append_child(field("end", "text-single"));
    form.append_child(field("before-id", "text-single"));
    form.append_child(field("after-id", "text-single"));
    let mut ids = field("ids", "list-multi");
    ids.append_child(
        Element::builder("validate", NS_XDATA_VALIDATE)
            .attr("datatype", "xs:string")
            .append(Element::new("open", NS_XDATA_VALIDATE))
            .build(),
    );
    form.append_child(ids);
    Element::builder("query", NS_MAM).append(form).build()
}

/// §5: `<metadata/>` for an archive whose oldest and newest ids are
/// `bounds` (empty for an empty archive).
pub fn metadata(bounds: Option<(ArchiveId, ArchiveId)>) -> Element {
    let mut md = Element::new("metadata", NS_MAM);
    if let Some((first, last)) = bounds {
        for (name, id) in [("start", first), ("end", last)] {
            md.append_child(
                Element::builder(name, NS_MAM)
                    .attr("id", id.encode())
                    .attr("timestamp", id.stamp())
                    .build(),
            );
        }
    }
    md
}

/// Deletes `domain`'s archived messages older than `days` days (every
/// archive whose owner is in `domain`); returns how many. Logged as
/// `module`'s.
pub async fn purge_domain(
    store: &dyn ArchiveStore,
    domain: &str,
    days: u32,
    module: &'static str,
) -> starling_core::storage::StorageResult<u64> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0);
    let cutoff = now - i64::from(days) * 86_400 * 1_000_000;
    let r = store
        .purge_domain_before(domain, ArchiveId::lower_bound(cutoff))
        .await;
    match &r {
        Ok(n) => tracing::info!(module, domain, days, deleted = n, "archive retention purge"),
        Err(e) => tracing::error!(module, domain, error = %e, "archive retention purge failed"),
    }
    r
}

/// Applies the retention of every served domain at once and then every
/// hour: the domain's `archive_retention_days` setting (a domain added at
/// run time, docs/domains.md), else `configured(domain)`; 0 keeps
/// messages forever. Ends when the server's environment is gone.
pub async fn retention_task_for_hosts(
    store: std::sync::Arc<dyn ArchiveStore>,
    env: std::sync::Weak<starling_core::Env>,
    configured: impl Fn(&str) -> u32 + Send + 'static,
    module: &'static str,
) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(3600));
    loop {
        tick.tick().await;
        let Some(env) = env.upgrade() else { return };
        let rules: Vec<(String, u32)> = env
            .hosts
            .list()
            .into_iter()
            .filter_map(|d| {
                let days = env
                    .hosts
                    .get(&d)
                    .and_then(|h| h.settings.archive_retention_days)
                    .unwrap_or_else(|| configured(&d));
                (days > 0).then_some((d, days))
            })
            .collect();
        drop(env);
        for (domain, days) in &rules {
            let _ = purge_domain(store.as_ref(), domain, *days, module).await;
        }
    }
}

/// Applies `rules` (domain, days) at once and then every hour.
pub async fn retention_task(
    store: std::sync::Arc<dyn ArchiveStore>,
    rules: Vec<(String, u32)>,
    module: &'static str,
) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(3600));
    loop {
        tick.tick().await;
        for (domain, days) in &rules {
            let _ = purge_domain(store.as_ref(), domain, *days, module).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(inner: &str) -> Element {
        format!("<query xmlns='urn:xmpp:mam:2' queryid='x'>{inner}</query>")
            .parse()
            .unwrap()
    }

    fn cond(r: Result<Request, StanzaError>) -> StanzaErrorCondition {
        r.expect_err("an error").condition
    }

    #[test]
    fn parses_fields_paging_and_flip() {
        let a = ArchiveId::from_parts(1_700_000_000_000_000, 1);
        let b = ArchiveId::from_parts(1_700_000_100_000_000, 1);
        let r = parse(
            &q(&format!(
                "<x xmlns='jabber:x:data' type='submit'>\
                 <field var='FORM_TYPE'><value>urn:xmpp:mam:2</value></field>\
                 <field var='with'><value>Juliet@Capulet.lit/balcony</value></field>\
                 <field var='after-id'><value>{}</value></field></x>\
                 <set xmlns='http://jabber.org/protocol/rsm'><max>500</max><before>{}</before></set>\
                 <flip-page/>",
                a.encode(),
                b.encode()
            )),
            50,
            250,
        )
        .unwrap();
        assert_eq!(
            r.query.with,
            Some(WithFilter::Full {
                bare: "juliet@capulet.lit".into(),
                full: "juliet@capulet.lit/balcony".into()
            })
        );
        assert_eq!((r.query.after, r.query.before), (Some(a), Some(b)));
        assert!(r.query.from_end && r.flip);
        assert_eq!((r.max, r.query.limit), (Some(500), 250));
        assert_eq!(r.queryid.as_deref(), Some("x"));
        assert_eq!(r.ids_to_check, vec![a, b]);
        assert_eq!(parse(&q(""), 50, 250).unwrap().query.limit, 50);
    }

    /// XEP-0004 §3.2: one field per var. Two `ids` fields of one value
    /// each passed the one-page bound (which counted one field's values):
    /// the fuzzer's mam target, `fuzz/corpus/mam/repeated-ids`.
    #[test]
    fn a_field_given_twice_is_refused() {
        let a = ArchiveId::from_parts(1_700_000_000_000_000, 1).encode();
        let b = ArchiveId::from_parts(1_700_000_000_000_001, 1).encode();
        let form = |fields: &str| {
            q(&format!(
                "<x xmlns='jabber:x:data' type='submit'>{fields}</x>"
            ))
        };
        let ids = |v: &str| format!("<field var='ids'><value>{v}</value></field>");
        assert_eq!(
            cond(parse(&form(&format!("{}{}", ids(&a), ids(&b))), 1, 1)),
            StanzaErrorCondition::BadRequest
        );
        let with = "<field var='with'><value>juliet@capulet.lit</value></field>";
        assert_eq!(
            cond(parse(&form(&format!("{with}{with}")), 50, 250)),
            StanzaErrorCondition::BadRequest
        );
        // One field of one id is one page of 1.
        assert_eq!(parse(&form(&ids(&a)), 1, 1).unwrap().query.ids.len(), 1);
    }

    #[test]
    fn refuses_what_it_does_not_know() {
        use StanzaErrorCondition::*;
        let field = |var: &str, v: &str| {
            q(&format!(
                "<x xmlns='jabber:x:data' type='submit'><field var='{var}'><value>{v}</value></field></x>"
            ))
        };
        assert_eq!(
            cond(parse(&field("fulltext", "x"), 50, 250)),
            FeatureNotImplemented
        );
        assert_eq!(
            cond(parse(&field("start", "yesterday"), 50, 250)),
            BadRequest
        );
        assert_eq!(
            cond(parse(&field("after-id", "nope"), 50, 250)),
            ItemNotFound
        );
        assert_eq!(cond(parse(&field("with", "@"), 50, 250)), JidMalformed);
        assert_eq!(
            cond(parse(
                &q("<set xmlns='http://jabber.org/protocol/rsm'><index>3</index></set>"),
                50,
                250
            )),
            FeatureNotImplemented
        );
    }
}
