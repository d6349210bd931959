//! Requests to the MUC Light service's own JID: service discovery and the
//! member's rooms (disco#items with RSM), and the blocking requests.

use super::blocking::blocking;
use super::{internal, Inner, Stored, NS_BLOCKING, NS_CREATE, NS_LIGHT, NS_RSM};
use crate::modules::muc::host::error;
use starling_core::Env;
use starling_proto::{ns, BareJid, Stanza, StanzaError, StanzaErrorCondition, StanzaKind};
use starling_xml::Element;
use std::sync::Arc;

/// Stanzas to the service's own JID.
pub(super) async fn service_stanza(host: &Arc<Inner>, env: &Env, st: &Stanza) -> Option<Stanza> {
    if st.kind() != StanzaKind::Iq {
        if st.kind() == StanzaKind::Message && !st.is_error() {
            return st.error_reply(error(
                StanzaErrorCondition::ServiceUnavailable,
                "send messages to a room",
            ));
        }
        return None;
    }
    if !st.is_iq_request() {
        return None;
    }
    let from = st.from()?.to_bare();
    let q = st.payload()?;
    let get = st.type_attr() == Some("get");
    let reply = match (q.ns(), q.name(), get) {
        (ns::DISCO_INFO, "query", true) if q.attr("node").is_none() => {
            let mut r = Element::new("query", ns::DISCO_INFO);
            r.append_child(
                Element::builder("identity", ns::DISCO_INFO)
                    .attr("category", "conference")
                    .attr("name", host.cfg.name.as_str())
                    .attr("type", "text")
                    .build(),
            );
            let mut features = vec![NS_LIGHT, ns::DISCO_INFO, ns::DISCO_ITEMS, ns::PING];
            if host.cfg.blocking {
                features.push(NS_BLOCKING);
            }
            for f in features {
                r.append_child(
                    Element::builder("feature", ns::DISCO_INFO)
                        .attr("var", f)
                        .build(),
                );
            }
            Ok(Some(r))
        }
        (ns::DISCO_ITEMS, "query", true) if q.attr("node").is_none() => {
            my_rooms(host, st, &from).await
        }
        (NS_BLOCKING, "query", _) if host.cfg.blocking => blocking(host, &from, q, get).await,
        (NS_CREATE, "query", false) => {
            // "Requesting a new room with a unique name": the room's own
            // task creates it (on its node), answering from its JID.
            let service = st.to().map(|t| t.domain().as_str().to_owned())?;
            let name = starling_proto::random_id(20);
            let Ok(room) = BareJid::new(&format!("{name}@{service}")) else {
                return None;
            };
            let mut el = st.element().clone();
            el.set_attr("to", room.as_str());
            let fwd = Stanza::new(el, st.from().cloned(), Some(room.into()));
            env.route(fwd).await;
            return None;
        }
        (ns::PING, "ping", true) => Ok(None),
        _ => Err(StanzaError::new(StanzaErrorCondition::ServiceUnavailable)),
    };
    match reply {
        Ok(p) => Some(st.iq_result(p)),
        Err(e) => st.error_reply(e),
    }
}

/// "Discovering occupied rooms": the requester's rooms with name and
/// version, XEP-0059 paging (`max`, `after`).
async fn my_rooms(
    host: &Inner,
    st: &Stanza,
    who: &BareJid,
) -> Result<Option<Element>, StanzaError> {
    let service = st
        .to()
        .map(|t| t.domain().as_str().to_owned())
        .unwrap_or_default();
    let set = st.payload().and_then(|q| q.get_child("set", NS_RSM));
    let max = set
        .and_then(|s| s.get_child("max", NS_RSM))
        .and_then(|m| m.text().trim().parse::<usize>().ok())
        .unwrap_or(1000)
        .min(1000);
    let after = set
        .and_then(|s| s.get_child("after", NS_RSM))
        .map(|a| a.text());
    let mut rooms: Vec<BareJid> = host
        .store
        .rooms_of(who)
        .await
        .map_err(|e| internal(e, "listing rooms"))?
        .into_iter()
        .map(|(j, _)| j)
        .filter(|j| j.domain().as_str() == service)
        .collect();
    rooms.sort();
    let total = rooms.len();
    let page: Vec<BareJid> = rooms
        .into_iter()
        .filter(|j| after.as_ref().is_none_or(|a| j.as_str() > a.as_str()))
        .take(max)
        .collect();
    let mut q = Element::new("query", ns::DISCO_ITEMS);
    for j in &page {
        let stored = host
            .store
            .room(j)
            .await
            .map_err(|e| internal(e, "reading a room"))?;
        let Some(s) = stored.and_then(|s| serde_json::from_str::<Stored>(&s.config).ok()) else {
            continue;
        };
        q.append_child(
            Element::builder("item", ns::DISCO_ITEMS)
                .attr("jid", j.as_str())
                .attr("name", s.fields.get("roomname").map_or("", String::as_str))
                .attr("version", s.version.as_str())
                .build(),
        );
    }
    if set.is_some() || page.len() < total {
        let mut s = Element::new("set", NS_RSM);
        if let (Some(f), Some(l)) = (page.first(), page.last()) {
            s.append_child(
                Element::builder("first", NS_RSM)
                    .attr("index", (total - page.len()).min(total).to_string())
                    .text(f.as_str())
                    .build(),
            );
            s.append_child(Element::builder("last", NS_RSM).text(l.as_str()).build());
        }
        s.append_child(
            Element::builder("count", NS_RSM)
                .text(total.to_string())
                .build(),
        );
        q.append_child(s);
    }
    Ok(Some(q))
}
