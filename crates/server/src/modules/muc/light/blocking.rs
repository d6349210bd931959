//! MUC Light blocking lists ("Blocking functionality"): rooms and users a
//! member refuses, read and changed at the service.

use super::{bad, internal, Inner, NS_BLOCKING};
use crate::modules::muc::host::error;
use starling_proto::{BareJid, StanzaError, StanzaErrorCondition};
use starling_xml::Element;

/// "Blocking functionality": the list, or changes to it.
pub(super) async fn blocking(
    host: &Inner,
    who: &BareJid,
    q: &Element,
    get: bool,
) -> Result<Option<Element>, StanzaError> {
    if get {
        let list = host
            .store
            .light_blocking(who)
            .await
            .map_err(|e| internal(e, "reading a blocking list"))?;
        let mut r = Element::new("query", NS_BLOCKING);
        for (kind, jid) in list {
            r.append_child(
                Element::builder(kind.as_str(), NS_BLOCKING)
                    .attr("action", "deny")
                    .text(jid.as_str())
                    .build(),
            );
        }
        return Ok(Some(r));
    }
    let mut deny = Vec::new();
    let mut allow = Vec::new();
    for c in q.children() {
        let kind = match c.name() {
            "room" | "user" if c.ns() == NS_BLOCKING => c.name(),
            _ => return Err(bad("blocking items are <room/> or <user/>")),
        };
        let text = c.text();
        let jid = BareJid::new(text.trim())
            .ok()
            .filter(|j| j.node().is_some())
            .ok_or_else(|| bad("a blocking item holds a bare JID"))?;
        let item = (kind.to_owned(), jid);
        match c.attr("action") {
            Some("deny") => deny.push(item),
            Some("allow") => allow.push(item),
            _ => return Err(bad("action must be deny or allow")),
        }
    }
    if deny.is_empty() && allow.is_empty() {
        return Err(bad("name at least one room or user"));
    }
    if !deny.is_empty() {
        let now = host
            .store
            .light_blocking(who)
            .await
            .map_err(|e| internal(e, "reading a blocking list"))?;
        let added = deny.iter().filter(|d| !now.contains(d)).count();
        if now.len() + added > host.cfg.max_blocking_items as usize {
            return Err(error(
                StanzaErrorCondition::ResourceConstraint,
                &format!(
                    "a blocking list holds at most {} items",
                    host.cfg.max_blocking_items
                ),
            ));
        }
    }
    host.store
        .set_light_blocking(who, &deny, &allow)
        .await
        .map_err(|e| internal(e, "storing a blocking list"))?;
    Ok(None)
}
