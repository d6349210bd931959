//! MUC Light messages: a member's groupchat message to every member's bare
//! JID, archived for the room ("Sending a message to a room"), and the
//! room's notifications of changes (archived as the protocol's MAM
//! section says).

use super::{bad, Inner, LightRoom, Reply};
use crate::modules::muc::host::{self};
use crate::modules::muc::room::{inbox_kind, is_archivable, origin_id};
use starling_core::storage::{ArchiveRecord, FLAG_BODY};
use starling_core::Env;
use starling_proto::{ns, BareJid, FullJid, Jid, Stanza};
use starling_xml::{Element, Node};
use std::sync::Arc;

/// "Sending a message to a room": a copy to every member's bare JID.
pub(super) async fn message(
    host: &Arc<Inner>,
    env: &Env,
    r: &LightRoom,
    sender: &BareJid,
    st: &Stanza,
) -> Reply {
    if st.stanza_type() != "groupchat" {
        return Err(bad("messages to a room are of type groupchat"));
    }
    let el = st.element();
    let from: Jid = FullJid::new(&format!("{}/{}", r.jid, sender))
        .map(Jid::from)
        .unwrap_or_else(|_| r.jid.clone().into());
    let mut m = Element::new("message", ns::CLIENT);
    for (k, v) in el.attrs() {
        if k != "to" && k != "from" {
            m.set_attr(k, v);
        }
    }
    for node in el.nodes() {
        match node {
            // Only the room stamps its stanza ids.
            Node::Element(c)
                if c.is("stanza-id", ns::SID) && c.attr("by") == Some(r.jid.as_str()) => {}
            other => m.nodes_mut().push(other.clone()),
        }
    }
    m.set_attr("from", from.as_str());
    let id = host.ids.next();
    if is_archivable(el) {
        host.archive
            .push(ArchiveRecord {
                owner: r.jid.clone(),
                id,
                with_bare: sender.to_string(),
                remote: from.to_string(),
                outgoing: false,
                origin_id: origin_id(el),
                flags: if el.has_child("body", ns::CLIENT) {
                    FLAG_BODY
                } else {
                    0
                },
                stanza: m.to_string(),
            })
            .await;
        if let Some(kind) = inbox_kind(el) {
            if !env.hooks.archived.is_empty() {
                host::to_inboxes(
                    env,
                    &r.jid,
                    &r.member_list(),
                    vec![(id, sender.clone(), kind, m.clone())],
                )
                .await;
            }
        }
        m.append_child(
            Element::builder("stanza-id", ns::SID)
                .attr("id", id.encode())
                .attr("by", r.jid.as_str())
                .build(),
        );
    }
    Ok(crate::modules::common::copies(
        m,
        from,
        r.members.keys().map(|member| member.clone().into()),
    ))
}

/// A notification from the room's bare JID to `to` (a groupchat message
/// with an empty body, as the protocol's examples).
pub(super) fn notification(
    room: &BareJid,
    to: &BareJid,
    id: &str,
    payloads: Vec<Element>,
) -> Stanza {
    let mut m = Element::builder("message", ns::CLIENT)
        .attr("type", "groupchat")
        .attr("id", id)
        .build();
    for p in payloads {
        m.append_child(p);
    }
    m.append_child(Element::new("body", ns::CLIENT));
    Stanza::new(m, Some(room.clone().into()), Some(to.clone().into()))
}

/// Archives a notification (from the room's bare JID, `<version/>` but no
/// `<prev-version/>`: the MAM section) and returns its stanza-id element.
pub(super) async fn archive_notification(
    host: &Inner,
    r: &LightRoom,
    x: Element,
) -> (Element, Element) {
    let id = host.ids.next();
    let mut m = Element::builder("message", ns::CLIENT)
        .attr("type", "groupchat")
        .attr("from", r.jid.as_str())
        .build();
    m.append_child(x);
    m.append_child(Element::new("body", ns::CLIENT));
    host.archive
        .push(ArchiveRecord {
            owner: r.jid.clone(),
            id,
            with_bare: r.jid.to_string(),
            remote: r.jid.to_string(),
            outgoing: false,
            origin_id: None,
            flags: 0,
            stanza: m.to_string(),
        })
        .await;
    let sid = Element::builder("stanza-id", ns::SID)
        .attr("id", id.encode())
        .attr("by", r.jid.as_str())
        .build();
    (m, sid)
}
