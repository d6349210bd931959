//! Moderation (XEP-0045 §8): role changes — kick (§8.2), voice (§8.3–§8.4)
//! — and voice requests (§7.13, approved per §8.6); moderators retracting
//! a message (XEP-0425).

use super::{err, now_millis, reply_error, Ctx, ItemExtra, Moderation, Out, Role, Room};
use crate::modules::muc::{NS_MODERATE, NS_MUC_REQUEST, NS_OCCUPANT_ID, NS_RETRACT};
use starling_core::forms::{FormBuilder, Submitted};
use starling_core::storage::{ArchiveId, ArchiveRecord};
use starling_proto::{ns, FullJid, Stanza, StanzaErrorCondition};
use starling_xml::Element;

impl Room {
    /// §7.13: a visitor asks for voice (forwarded to the moderators);
    /// §8.6: a moderator approves a request.
    pub(super) fn voice_request(
        &mut self,
        st: &Stanza,
        from: &FullJid,
        f: &Submitted,
        out: &mut Out,
    ) {
        let Some(nick) = self.by_jid.get(from).cloned() else {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::NotAcceptable,
                    "only occupants may ask for voice",
                ),
                out,
            );
        };
        let role = self.occupants[&nick].role;
        if role == Role::Moderator
            && f.kind == "submit"
            && f.boolean("muc#request_allow").ok().flatten() == Some(true)
        {
            let target = f.single("muc#roomnick").ok().flatten().map(str::to_owned);
            if let Some(t) = target.filter(|t| {
                self.occupants
                    .get(t)
                    .is_some_and(|o| o.role == Role::Visitor)
            }) {
                self.set_role(&t, Role::Participant, &nick, None, out);
            }
            return;
        }
        if role != Role::Visitor {
            return; // already has voice
        }
        if !self.config.voice_requests {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::Forbidden,
                    "voice requests are disabled in this room",
                ),
                out,
            );
        }
        let form = FormBuilder::new("form", Some(NS_MUC_REQUEST))
            .title("Voice request")
            .instructions("To approve this request for voice, select the \"Grant voice to this person?\" checkbox and submit.")
            .field("muc#role", "list-single", Some("Requested role"), &["participant"])
            .field("muc#jid", "jid-single", Some("User ID"), &[from.to_bare().as_str()])
            .field("muc#roomnick", "text-single", Some("Room nickname"), &[&nick])
            .boolean("muc#request_allow", "Grant voice to this person?", false)
            .build();
        for o in self
            .occupants
            .values()
            .filter(|o| o.role == Role::Moderator)
        {
            for (to, _) in &o.sessions {
                let m = Element::builder("message", ns::CLIENT)
                    .attr("id", starling_proto::random_id(10))
                    .append(form.clone())
                    .build();
                out.stanzas.push(Stanza::new(
                    m,
                    Some(self.jid.clone().into()),
                    Some(to.clone().into()),
                ));
            }
        }
    }

    /// Changes an occupant's role and tells the room (§8.2 kick: 307).
    pub(super) fn set_role(
        &mut self,
        nick: &str,
        r: Role,
        actor: &str,
        reason: Option<&str>,
        out: &mut Out,
    ) {
        let extra = ItemExtra {
            actor: Some(actor).filter(|a| !a.is_empty()),
            reason,
            nick: None,
        };
        if r == Role::None {
            return self.remove_occupant(nick, Role::None, &[307], &extra, out);
        }
        let Some(o) = self.occupants.get_mut(nick) else {
            return;
        };
        o.role = r;
        let o = &self.occupants[nick];
        self.broadcast_presence(o, false, r, &[], &[], &extra, None, out);
    }

    /// XEP-0425 §3: a moderator asks to retract a message by its stanza
    /// id; the message itself is read from the archive by the task.
    pub(super) fn moderate(&mut self, st: &Stanza, from: &FullJid, q: &Element, out: &mut Out) {
        let Some(nick) = self.by_jid.get(from).cloned() else {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::Forbidden,
                    "only moderators of the room may moderate messages",
                ),
                out,
            );
        };
        let o = &self.occupants[&nick];
        if o.role != Role::Moderator {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::Forbidden,
                    "only moderators are allowed to moderate other participants' messages",
                ),
                out,
            );
        }
        if !q.children().any(|c| c.is("retract", NS_RETRACT)) {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::FeatureNotImplemented,
                    "only retraction is supported",
                ),
                out,
            );
        }
        let Some(id) = q.attr("id").and_then(ArchiveId::decode) else {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::ItemNotFound,
                    "no message of this room has this id",
                ),
                out,
            );
        };
        out.moderation = Some(Moderation {
            iq: st.clone(),
            id,
            by: self.occupant_jid(&nick),
            by_occupant: self.occupant_id_el(&o.bare),
            reason: q.get_child("reason", NS_MODERATE).map(|r| r.text()),
        });
    }

    /// XEP-0425 §3–§4: with the archived message (`None`: not found), tells
    /// everyone of the retraction (archived too, for clients catching up),
    /// answers the moderator and returns the tombstone that replaces the
    /// message in the archive (and in the history).
    pub fn finish_moderation(
        &mut self,
        cx: &Ctx<'_>,
        m: Moderation,
        original: Option<Element>,
        out: &mut Out,
    ) -> Option<String> {
        let Some(original) = original
            .filter(|o| o.name() == "message" && o.get_child("retracted", NS_RETRACT).is_none())
        else {
            reply_error(
                &m.iq,
                err(
                    StanzaErrorCondition::ItemNotFound,
                    "no message of this room has this id",
                ),
                out,
            );
            return None;
        };
        let moderated = |el_name: &str| {
            let mut x = Element::builder(el_name, NS_RETRACT).build();
            let mut md = Element::builder("moderated", NS_MODERATE)
                .attr("by", m.by.as_str())
                .build();
            md.append_child(m.by_occupant.clone());
            x.append_child(md);
            if let Some(r) = &m.reason {
                x.append_child(
                    Element::builder("reason", NS_RETRACT)
                        .text(r.as_str())
                        .build(),
                );
            }
            x
        };
        let mut retract = moderated("retract");
        retract.set_attr("id", m.id.encode());
        let id = cx.ids.next();
        let mut msg = Element::builder("message", ns::CLIENT)
            .attr("type", "groupchat")
            .attr("id", starling_proto::random_id(10))
            .append(retract)
            .append(
                Element::builder("stanza-id", ns::SID)
                    .attr("id", id.encode())
                    .attr("by", self.jid.as_str())
                    .build(),
            )
            .build();
        msg.set_attr("from", self.jid.as_str());
        if self.config.logging {
            out.archive.push(ArchiveRecord {
                owner: self.jid.clone(),
                id,
                with_bare: self.jid.to_string(),
                remote: self.jid.to_string(),
                outgoing: false,
                origin_id: None,
                flags: 0,
                stanza: msg.to_string(),
            });
        }
        self.to_everyone(&msg, &self.jid.clone().into(), out);
        // The tombstone keeps who sent it (and when), nothing of what.
        let mut tomb = Element::new("message", ns::CLIENT);
        for (k, v) in original.attrs() {
            tomb.set_attr(k, v);
        }
        for c in original.children() {
            if c.is("occupant-id", NS_OCCUPANT_ID) || c.is("stanza-id", ns::SID) {
                tomb.append_child(c.clone());
            }
        }
        let mut retracted = moderated("retracted");
        retracted.set_attr(
            "stamp",
            starling_proto::datetime::xep0082_datetime(now_millis().max(0) as u128),
        );
        tomb.append_child(retracted);
        if let Some(h) = self.history.iter_mut().find(|h| h.id == m.id) {
            h.el = tomb.clone();
        }
        out.stanzas.push(m.iq.iq_result(None));
        Some(tomb.to_string())
    }
}
