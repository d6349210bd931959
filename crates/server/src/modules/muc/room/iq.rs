//! Iq to the room (XEP-0045): the dispatch by namespace, service discovery
//! of the room (§6.4, and §7.12's `x-roomuser-item` node) and of its
//! occupants (§6.5); iq to an occupant: self-ping (XEP-0410) answered
//! here, other requests forwarded to the occupant's client and the answer
//! brought back.

use super::{err, reply_error, Ctx, Out, PendingIq, Room};
use crate::modules::common::archive_query::NS_MAM_EXTENDED;
use crate::modules::muc::config::Whois;
use crate::modules::muc::{
    NS_MODERATE, NS_MUC, NS_MUC_ADMIN, NS_MUC_OWNER, NS_MUC_REQUEST, NS_OCCUPANT_ID,
    NS_SELF_PING_OPT, NS_VCARD,
};
use starling_proto::{ns, FullJid, Stanza, StanzaError, StanzaErrorCondition};
use starling_xml::Element;

impl Room {
    pub(super) fn on_room_iq(&mut self, cx: &Ctx<'_>, st: &Stanza, from: &FullJid, out: &mut Out) {
        if !st.is_iq_request() {
            return;
        }
        let Some(q) = st.payload() else {
            return reply_error(st, StanzaErrorCondition::BadRequest.into(), out);
        };
        let get = st.type_attr() == Some("get");
        if q.is("moderate", NS_MODERATE) && !get {
            return self.moderate(st, from, q, out);
        }
        let answer = match (q.ns(), q.name(), get) {
            (ns::DISCO_INFO, "query", true) => self.disco_info(st, from, q),
            (ns::DISCO_ITEMS, "query", true) => Ok(Some(self.disco_items(from))),
            (NS_MUC_ADMIN, "query", true) => self.admin_get(from, q),
            (NS_MUC_ADMIN, "query", false) => self.admin_set(from, q, out),
            (NS_MUC_OWNER, "query", true) => self.owner_get(cx, from),
            (NS_MUC_OWNER, "query", false) => self.owner_set(cx, from, q, out),
            (ns::REGISTER, "query", true) => self.register_get(from),
            (ns::REGISTER, "query", false) => self.register_set(from, q, out),
            (ns::PING, "ping", true) => Ok(None),
            (NS_VCARD, "vCard", true) => Ok(Some(
                self.config
                    .vcard
                    .parse::<Element>()
                    .unwrap_or_else(|_| Element::new("vCard", NS_VCARD)),
            )),
            (NS_VCARD, "vCard", false) => self.set_vcard(cx, from, q, out),
            _ => Err(StanzaErrorCondition::ServiceUnavailable.into()),
        };
        match answer {
            Ok(p) => out.stanzas.push(st.iq_result(p)),
            Err(e) => reply_error(st, e, out),
        }
    }

    /// §6.4 (and §7.12 for the `x-roomuser-item` node).
    fn disco_info(
        &self,
        _st: &Stanza,
        from: &FullJid,
        q: &Element,
    ) -> Result<Option<Element>, StanzaError> {
        if q.attr("node") == Some("x-roomuser-item") {
            let mut r = Element::builder("query", ns::DISCO_INFO)
                .attr("node", "x-roomuser-item")
                .build();
            if let Some(n) = self
                .affiliations
                .get(from.to_bare().as_str())
                .and_then(|a| a.nick.as_deref())
            {
                r.append_child(
                    Element::builder("identity", ns::DISCO_INFO)
                        .attr("category", "conference")
                        .attr("name", n)
                        .attr("type", "text")
                        .build(),
                );
            }
            return Ok(Some(r));
        }
        if q.attr("node").is_some() {
            return Err(StanzaErrorCondition::ItemNotFound.into());
        }
        let c = &self.config;
        let mut r = Element::new("query", ns::DISCO_INFO);
        let name = if c.name.is_empty() {
            self.jid.node().map(|n| n.as_str()).unwrap_or("")
        } else {
            c.name.as_str()
        };
        r.append_child(
            Element::builder("identity", ns::DISCO_INFO)
                .attr("category", "conference")
                .attr("name", name)
                .attr("type", "text")
                .build(),
        );
        let features = [
            NS_MUC,
            if c.public { "muc_public" } else { "muc_hidden" },
            if c.persistent {
                "muc_persistent"
            } else {
                "muc_temporary"
            },
            if c.members_only {
                "muc_membersonly"
            } else {
                "muc_open"
            },
            if c.moderated {
                "muc_moderated"
            } else {
                "muc_unmoderated"
            },
            if c.whois == Whois::Anyone {
                "muc_nonanonymous"
            } else {
                "muc_semianonymous"
            },
            if c.password_protected {
                "muc_passwordprotected"
            } else {
                "muc_unsecured"
            },
            ns::REGISTER,
            NS_MUC_REQUEST,
            NS_OCCUPANT_ID,
            NS_SELF_PING_OPT,
            NS_MODERATE,
            NS_VCARD,
            // Reflected messages keep the sender's id.
            "http://jabber.org/protocol/muc#stable_id",
            ns::SID,
            ns::DISCO_INFO,
            ns::DISCO_ITEMS,
            ns::PING,
        ];
        // XEP-0313 §7: the room's archive (mam.rs), while it is kept.
        let archive = [starling_proto::mam::NS_MAM, NS_MAM_EXTENDED];
        let archive = if c.logging { &archive[..] } else { &[] };
        for f in features.iter().chain(archive) {
            r.append_child(
                Element::builder("feature", ns::DISCO_INFO)
                    .attr("var", *f)
                    .build(),
            );
        }
        r.append_child(c.info_form(self.occupants.len(), &self.subject).build());
        Ok(Some(r))
    }

    /// §6.5: occupants are listed to other occupants of a public room only.
    fn disco_items(&self, from: &FullJid) -> Element {
        let mut r = Element::new("query", ns::DISCO_ITEMS);
        if self.config.public && self.by_jid.contains_key(from) {
            for nick in self.occupants.keys() {
                r.append_child(
                    Element::builder("item", ns::DISCO_ITEMS)
                        .attr("jid", self.occupant_jid(nick).as_str())
                        .build(),
                );
            }
        }
        r
    }

    /// An iq to an occupant: a self-ping (XEP-0410) is answered here; other
    /// requests from occupants go to the occupant's client (§6.5 for
    /// disco; vCards and versions the same way) with the id rewritten, and
    /// the answer comes back the same way.
    pub(super) fn on_occupant_iq(
        &mut self,
        st: &Stanza,
        from: &FullJid,
        target: &str,
        out: &mut Out,
    ) {
        if !st.is_iq_request() {
            // An answer to a forwarded request, from the target's client.
            let Some(p) = st.id().and_then(|id| self.pending_iq.remove(id)) else {
                return;
            };
            if self.by_jid.get(from).map(String::as_str) != Some(p.target_nick.as_str()) {
                return;
            }
            let mut el = st.element().clone();
            el.set_attr("id", p.id);
            let from_jid = self.occupant_jid(&p.target_nick);
            out.stanzas
                .push(Stanza::new(el, Some(from_jid), Some(p.requester.into())));
            return;
        }
        let Some(nick) = self.by_jid.get(from).cloned() else {
            let c = if st
                .payload()
                .is_some_and(|p| p.ns() == ns::DISCO_INFO || p.ns() == ns::DISCO_ITEMS)
            {
                StanzaErrorCondition::BadRequest // §6.5
            } else {
                StanzaErrorCondition::NotAcceptable // XEP-0410 §3
            };
            return reply_error(st, err(c, "you are not an occupant of this room"), out);
        };
        if nick == target && st.payload().is_some_and(|p| p.is("ping", ns::PING)) {
            return out.stanzas.push(st.iq_result(None)); // XEP-0410 §4
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
        let Some((to, _)) = t.sessions.last() else {
            return;
        };
        let to = to.clone();
        let now = std::time::Instant::now();
        self.pending_iq
            .retain(|_, p| now.duration_since(p.at).as_secs() < 60);
        if self.pending_iq.len() >= 1000 {
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::ResourceConstraint,
                    "too many requests in flight",
                ),
                out,
            );
        }
        self.next_iq += 1;
        let id = format!("muc{}-{}", self.next_iq, starling_proto::random_id(6));
        self.pending_iq.insert(
            id.clone(),
            PendingIq {
                requester: from.clone(),
                id: st.id().unwrap_or("").to_owned(),
                target_nick: target.to_owned(),
                at: now,
            },
        );
        let mut el = st.element().clone();
        el.set_attr("id", id);
        out.stanzas.push(Stanza::new(
            el,
            Some(self.occupant_jid(&nick)),
            Some(to.into()),
        ));
    }
}
