//! Messages (XEP-0045): groupchat messages (§7.4) with the subject
//! (§8.1, §7.3 when participants may change it), private messages (§7.5),
//! mediated invitations and declines (§7.8.2), the history sent on
//! entering (§7.2.13–§7.2.14), and the room's own announcements; what of
//! them goes to the archive and the members' inboxes.

use super::{
    err, means_gone, now_millis, reply_error, Affiliation, Ctx, HistoryItem, Out, Role, Room,
};
use crate::modules::muc::config::AllowPm;
use crate::modules::muc::{NS_MUC, NS_MUC_REQUEST, NS_MUC_USER, NS_OCCUPANT_ID};
use starling_core::forms::Submitted;
use starling_core::storage::{ArchiveId, ArchiveRecord, FLAG_BODY};
use starling_proto::{ns, FullJid, Jid, Stanza, StanzaErrorCondition};
use starling_xml::{Element, Node};

impl Room {
    /// A groupchat message from the room's own JID (an announcement, like
    /// the room's status messages): its body goes to every occupant with
    /// a stanza id, and into the archive, the members' inboxes and the
    /// history when the room logs (`muc#roomconfig_enablelogging`).
    pub(super) fn announce(&mut self, cx: &Ctx<'_>, st: &Stanza, out: &mut Out) {
        let Some(body) = st
            .element()
            .get_child("body", ns::CLIENT)
            .filter(|b| !b.text().is_empty())
        else {
            return reply_error(
                st,
                err(StanzaErrorCondition::BadRequest, "a body is required"),
                out,
            );
        };
        let from: Jid = self.jid.clone().into();
        let id = cx.ids.next();
        let msg_id = st
            .id()
            .map(str::to_owned)
            .unwrap_or_else(|| starling_proto::random_id(10));
        let m = Element::builder("message", ns::CLIENT)
            .attr("type", "groupchat")
            .attr("id", msg_id)
            .attr("from", self.jid.as_str())
            .append(body.clone())
            .append(
                Element::builder("stanza-id", ns::SID)
                    .attr("id", id.encode())
                    .attr("by", self.jid.as_str())
                    .build(),
            )
            .build();
        if self.config.logging {
            if let Some(kind) = inbox_kind(&m) {
                out.inbox.push((id, self.jid.clone(), kind, m.clone()));
            }
            out.archive.push(ArchiveRecord {
                owner: self.jid.clone(),
                id,
                with_bare: self.jid.to_string(),
                remote: self.jid.to_string(),
                outgoing: false,
                origin_id: None,
                flags: FLAG_BODY,
                stanza: m.to_string(),
            });
        }
        self.remember(cx, id, &m);
        self.to_everyone(&m, &from, out);
    }

    /// Keeps `m` (archive id `id`) in the history sent on entering, at
    /// most `max_history` messages.
    fn remember(&mut self, cx: &Ctx<'_>, id: ArchiveId, m: &Element) {
        self.history.push_back(HistoryItem {
            id,
            el: m.clone(),
            chars: m.size_hint(),
        });
        while self.history.len() > cx.svc.max_history as usize {
            self.history.pop_front();
        }
    }

    /// §7.2.13–§7.2.14: the recent messages, filtered by the request.
    pub(super) fn send_history(&self, x: Option<&Element>, to: &FullJid, out: &mut Out) {
        let h = x.and_then(|x| x.get_child("history", NS_MUC));
        let attr = |n: &str| h.and_then(|h| h.attr(n));
        let num = |n: &str| attr(n).and_then(|v| v.trim().parse::<u64>().ok());
        let mut max_stanzas = self.config.history_size as u64;
        if let Some(n) = num("maxstanzas") {
            max_stanzas = max_stanzas.min(n);
        }
        let max_chars = num("maxchars");
        let mut since =
            attr("since").and_then(|s| starling_proto::datetime::parse_xep0082(s.trim()));
        if let Some(secs) = num("seconds") {
            let t = now_millis() - (secs.min(i64::MAX as u64 / 2000) as i64) * 1000;
            since = Some(since.map_or(t, |s| s.max(t)));
        }
        let mut picked: Vec<&HistoryItem> = Vec::new();
        let mut chars = 0u64;
        for item in self.history.iter().rev() {
            if picked.len() as u64 >= max_stanzas {
                break;
            }
            if since.is_some_and(|s| item.id.micros() / 1000 < s) {
                break;
            }
            if let Some(m) = max_chars {
                chars += item.chars as u64;
                if chars > m {
                    break;
                }
            }
            picked.push(item);
        }
        for item in picked.into_iter().rev() {
            let mut el = item.el.clone();
            el.append_child(
                Element::builder("delay", ns::DELAY)
                    .attr("from", self.jid.as_str())
                    .attr("stamp", item.id.stamp())
                    .build(),
            );
            let from = el.attr("from").and_then(|f| Jid::new(f).ok());
            out.stanzas
                .push(Stanza::new(el, from, Some(to.clone().into())));
        }
    }

    pub(super) fn on_room_message(
        &mut self,
        cx: &Ctx<'_>,
        st: &Stanza,
        from: &FullJid,
        out: &mut Out,
    ) {
        match st.stanza_type() {
            "groupchat" => return self.on_groupchat(cx, st, from, out),
            "error" => {
                // A groupchat message bounced by an occupant's server.
                if self.by_jid.contains_key(from) && means_gone(st) {
                    self.remove_session(from, &[333], out);
                }
                return;
            }
            _ => {}
        }
        let el = st.element();
        if let Some(x) = el.get_child("x", NS_MUC_USER) {
            if x.children().any(|c| c.is("invite", NS_MUC_USER)) {
                return self.invite(st, from, x, out);
            }
            if let Some(d) = x.get_child("decline", NS_MUC_USER) {
                return self.decline(from, d, out);
            }
        }
        if let Some(form) = el.get_child("x", ns::DATA_FORMS) {
            let f = Submitted::parse(form);
            if f.form_type() == Some(NS_MUC_REQUEST) {
                return self.voice_request(st, from, &f, out);
            }
        }
        reply_error(
            st,
            err(
                StanzaErrorCondition::BadRequest,
                "send messages to a room with type groupchat",
            ),
            out,
        );
    }

    fn on_groupchat(&mut self, cx: &Ctx<'_>, st: &Stanza, from: &FullJid, out: &mut Out) {
        let Some(nick) = self.by_jid.get(from).cloned() else {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::NotAcceptable,
                    "only occupants may send messages to the room",
                ),
                out,
            );
        };
        let role = self.occupants[&nick].role;
        let bare = from.to_bare();
        if role < Role::Participant {
            // §7.4: visitors may not speak in a moderated room.
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::Forbidden,
                    "visitors may not speak in this room",
                ),
                out,
            );
        }
        let el = st.element();
        let subject = el.get_child("subject", ns::CLIENT);
        if subject.is_some() && el.get_child("body", ns::CLIENT).is_none() {
            // §8.1 (and §7.3 for participants when allowed).
            if role != Role::Moderator && !self.config.change_subject {
                return reply_error(
                    st,
                    err(
                        StanzaErrorCondition::Forbidden,
                        "you may not change the subject of this room",
                    ),
                    out,
                );
            }
            let text = subject.map(|s| s.text()).unwrap_or_default();
            if text.chars().count() > cx.svc.max_subject_len as usize {
                return reply_error(
                    st,
                    err(
                        StanzaErrorCondition::NotAcceptable,
                        "the subject is too long",
                    ),
                    out,
                );
            }
            self.subject = text;
            self.subject_by = nick.clone();
            out.save = true;
        }
        let mut m = Element::new("message", ns::CLIENT);
        for (k, v) in el.attrs() {
            if k != "to" && k != "from" {
                m.set_attr(k, v);
            }
        }
        for node in el.nodes() {
            match node {
                // A sender's own muc#user payload could claim a real JID.
                Node::Element(c)
                    if c.ns() == NS_MUC_USER
                        || c.is("occupant-id", NS_OCCUPANT_ID)
                        || (c.is("stanza-id", ns::SID)
                            && c.attr("by") == Some(self.jid.as_str())) => {}
                other => m.nodes_mut().push(other.clone()),
            }
        }
        m.append_child(self.occupant_id_el(&bare));
        let archived = self.config.logging && subject.is_none() && is_archivable(el);
        let id = cx.ids.next();
        if archived || subject.is_none() {
            m.append_child(
                Element::builder("stanza-id", ns::SID)
                    .attr("id", id.encode())
                    .attr("by", self.jid.as_str())
                    .build(),
            );
        }
        let from_jid = self.occupant_jid(&nick);
        m.set_attr("from", from_jid.as_str());
        if subject.is_none() && is_archivable(el) {
            if archived {
                if let Some(kind) = inbox_kind(el) {
                    out.inbox.push((id, bare.clone(), kind, m.clone()));
                }
                out.archive.push(ArchiveRecord {
                    owner: self.jid.clone(),
                    id,
                    with_bare: bare.to_string(),
                    remote: from_jid.to_string(),
                    outgoing: false,
                    origin_id: origin_id(el),
                    flags: if el.get_child("body", ns::CLIENT).is_some() {
                        FLAG_BODY
                    } else {
                        0
                    },
                    stanza: m.to_string(),
                });
            }
            self.remember(cx, id, &m);
        }
        self.to_everyone(&m, &from_jid, out);
    }

    /// Sends `el` from `from` to every session of every occupant.
    pub(super) fn to_everyone(&self, el: &Element, from: &Jid, out: &mut Out) {
        let sessions: Vec<Jid> = self
            .occupants
            .values()
            .flat_map(|o| o.sessions.iter().map(|(to, _)| to.clone().into()))
            .collect();
        out.stanzas.extend(crate::modules::common::copies(
            el.clone(),
            from.clone(),
            sessions,
        ));
    }

    /// §7.5: a private message to an occupant.
    pub(super) fn on_private_message(
        &mut self,
        st: &Stanza,
        from: &FullJid,
        target: &str,
        out: &mut Out,
    ) {
        if st.is_error() && self.by_jid.contains_key(from) && means_gone(st) {
            // A copy the room sent this occupant bounced (its session is
            // gone): §11.1, removed with 333 — not relayed to whoever the
            // copy was from.
            return self.remove_session(from, &[333], out);
        }
        let Some(nick) = self.by_jid.get(from).cloned() else {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::NotAcceptable,
                    "only occupants may send private messages",
                ),
                out,
            );
        };
        if st.stanza_type() == "groupchat" {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::BadRequest,
                    "groupchat messages go to the room, not to an occupant",
                ),
                out,
            );
        }
        let role = self.occupants[&nick].role;
        let allowed = match self.config.allow_pm {
            AllowPm::Anyone => true,
            AllowPm::Participants => role >= Role::Participant,
            AllowPm::Moderators => role == Role::Moderator,
            AllowPm::None => false,
        };
        if !allowed && st.stanza_type() != "error" {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::Forbidden,
                    "private messages are not allowed in this room",
                ),
                out,
            );
        }
        let Some(t) = self.occupants.get(target) else {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::ItemNotFound,
                    "no occupant has this nickname",
                ),
                out,
            );
        };
        let from_jid = self.occupant_jid(&nick);
        let mut m = st.element().clone();
        m.remove_children("occupant-id", NS_OCCUPANT_ID);
        if st.stanza_type() != "error" {
            m.remove_children("x", NS_MUC_USER);
            m.append_child(Element::new("x", NS_MUC_USER));
            m.append_child(self.occupant_id_el(&from.to_bare()));
        }
        for (to, _) in &t.sessions {
            out.stanzas.push(Stanza::new(
                m.clone(),
                Some(from_jid.clone()),
                Some(to.clone().into()),
            ));
        }
    }

    /// §7.8.2: mediated invitations.
    fn invite(&mut self, st: &Stanza, from: &FullJid, x: &Element, out: &mut Out) {
        let bare = from.to_bare();
        let aff = self.affiliation_of(&bare);
        if !self.by_jid.contains_key(from) && aff < Affiliation::Member {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::NotAcceptable,
                    "only occupants may invite",
                ),
                out,
            );
        }
        if self.config.members_only && !self.config.allow_invites && aff < Affiliation::Admin {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::Forbidden,
                    "only admins and owners may invite to this room",
                ),
                out,
            );
        }
        for inv in x.children().filter(|c| c.is("invite", NS_MUC_USER)) {
            let Some(to) = inv.attr("to").and_then(|t| Jid::new(t).ok()) else {
                return reply_error(
                    st,
                    err(
                        StanzaErrorCondition::JidMalformed,
                        "an invitation needs a valid 'to'",
                    ),
                    out,
                );
            };
            if self.config.members_only
                && aff >= Affiliation::Admin
                && self.affiliation_of(&to.to_bare()) == Affiliation::None
            {
                // The invitee may then enter (§7.8.2: MAY add to the member list).
                self.set_affiliation(&to.to_bare().to_string(), Affiliation::Member, None, out);
            }
            let reason = inv.get_child("reason", NS_MUC_USER).map(|r| r.text());
            let mut invite = Element::builder("invite", NS_MUC_USER)
                .attr("from", from.as_str())
                .build();
            if let Some(r) = &reason {
                invite.append_child(
                    Element::builder("reason", NS_MUC_USER)
                        .text(r.as_str())
                        .build(),
                );
            }
            let mut ux = Element::builder("x", NS_MUC_USER).append(invite).build();
            if self.config.password_protected {
                ux.append_child(
                    Element::builder("password", NS_MUC_USER)
                        .text(self.config.password.as_str())
                        .build(),
                );
            }
            let body = format!(
                "{} invites you to the room {}{}",
                bare,
                self.jid,
                reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            );
            let m = Element::builder("message", ns::CLIENT)
                .attr("id", starling_proto::random_id(10))
                .append(ux)
                .append(Element::builder("body", ns::CLIENT).text(body).build())
                .build();
            out.stanzas
                .push(Stanza::new(m, Some(self.jid.clone().into()), Some(to)));
        }
    }

    /// §7.8.2: an invitee declines; the inviter is told.
    fn decline(&mut self, from: &FullJid, d: &Element, out: &mut Out) {
        let Some(to) = d.attr("to").and_then(|t| Jid::new(t).ok()) else {
            return;
        };
        let mut decline = Element::builder("decline", NS_MUC_USER)
            .attr("from", from.to_bare().as_str())
            .build();
        if let Some(r) = d.get_child("reason", NS_MUC_USER) {
            decline.append_child(
                Element::builder("reason", NS_MUC_USER)
                    .text(r.text())
                    .build(),
            );
        }
        let m = Element::builder("message", ns::CLIENT)
            .attr("id", starling_proto::random_id(10))
            .append(Element::builder("x", NS_MUC_USER).append(decline).build())
            .build();
        out.stanzas
            .push(Stanza::new(m, Some(self.jid.clone().into()), Some(to)));
    }
}

/// Whether a groupchat message belongs in the archive and the history:
/// it has a body, an encrypted payload, a retraction or reactions — not
/// chat states or receipts alone.
pub(in crate::modules::muc) fn is_archivable(el: &Element) -> bool {
    el.children().any(|c| {
        c.is("body", ns::CLIENT)
            || c.name() == "encrypted"
            || c.is("retract", "urn:xmpp:message-retract:1")
            || c.is("reactions", "urn:xmpp:reactions:0")
            || c.is("apply-to", "urn:xmpp:fasten:0")
    })
}

/// How a member's inbox (XEP-0430) counts a message to a room: a new
/// message, a correction, or (`None`) not at all.
pub(in crate::modules::muc) fn inbox_kind(el: &Element) -> Option<starling_proto::mam::Kind> {
    match (
        el.has_child("body", ns::CLIENT),
        el.has_child("replace", "urn:xmpp:message-correct:0"),
    ) {
        (true, false) => Some(starling_proto::mam::Kind::Instant),
        (true, true) => Some(starling_proto::mam::Kind::Correction),
        _ => None,
    }
}

/// The sender's id of a message (XEP-0359 origin-id, else its id).
pub(in crate::modules::muc) fn origin_id(el: &Element) -> Option<String> {
    el.get_child("origin-id", ns::SID)
        .and_then(|o| o.attr("id"))
        .or_else(|| el.attr("id"))
        .map(str::to_owned)
}
