//! Occupants' presence (XEP-0045): entering (§7.2, and the creator's
//! status 201 of §10.1.1), presence updates (§7.7), nickname changes
//! (§7.6), leaving (§7.14), the removal of an occupant (kick, ban,
//! affiliation change, shutdown, error: §8.2, §9.1, §9.4, §11.1) and the
//! presence broadcast every one of them makes (§7.2.3).

use super::{
    err, means_gone, reply_error, status, Affiliation, Ctx, ItemExtra, Occupant, Out, Role, Room,
};
use crate::modules::muc::config::{RoomConfig, Whois};
use crate::modules::muc::{NS_MUC, NS_MUC_USER, NS_OCCUPANT_ID};
use starling_proto::{ns, FullJid, Jid, Stanza, StanzaErrorCondition};
use starling_xml::Element;

/// A presence's children worth broadcasting: everything but MUC payloads
/// and occupant ids, which the room writes itself.
fn presence_payload(el: &Element) -> impl Iterator<Item = &Element> {
    el.children().filter(|c| {
        !(c.ns() == NS_MUC || c.ns() == NS_MUC_USER || c.is("occupant-id", NS_OCCUPANT_ID))
    })
}

impl Room {
    /// The `muc#user` payload describing occupant `o` to a viewer.
    fn user_x(
        &self,
        o: &Occupant,
        real: Option<&FullJid>,
        role: Role,
        extra: &ItemExtra<'_>,
    ) -> Element {
        let aff = self.affiliation_of(&o.bare);
        let mut item = Element::builder("item", NS_MUC_USER)
            .attr("affiliation", aff.as_str())
            .attr("role", role.as_str())
            .build();
        if let Some(j) = real {
            item.set_attr("jid", j.as_str());
        }
        if let Some(n) = extra.nick {
            item.set_attr("nick", n);
        }
        if let Some(a) = extra.actor {
            item.append_child(
                Element::builder("actor", NS_MUC_USER)
                    .attr("nick", a)
                    .build(),
            );
        }
        if let Some(r) = extra.reason {
            item.append_child(Element::builder("reason", NS_MUC_USER).text(r).build());
        }
        Element::builder("x", NS_MUC_USER).append(item).build()
    }

    /// Sends occupant `nick`'s presence (available with its last presence,
    /// or unavailable) to every session in the room: `codes` for all,
    /// `self_codes` (after 110) for the occupant's own sessions. Presence
    /// of a role that is not broadcast goes to the occupant only.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn broadcast_presence(
        &self,
        o: &Occupant,
        unavailable: bool,
        role: Role,
        codes: &[u16],
        self_codes: &[u16],
        extra: &ItemExtra<'_>,
        destroy: Option<&Element>,
        out: &mut Out,
    ) {
        let broadcast =
            unavailable || RoomConfig::lists(&self.config.presence_broadcast, role.as_str());
        let from = self.occupant_jid(&o.nick);
        let base = o.sessions.last().map(|(_, p)| p);
        let shown_jid = o.sessions.last().map(|(j, _)| j);
        for viewer in self.occupants.values() {
            let me = viewer.nick == o.nick;
            if !me && !broadcast {
                continue;
            }
            for (to, _) in &viewer.sessions {
                let mut x = self.user_x(
                    o,
                    shown_jid.filter(|_| me || self.sees_jids(viewer.role)),
                    role,
                    extra,
                );
                if me {
                    x.append_child(status(110));
                    for c in self_codes {
                        x.append_child(status(*c));
                    }
                }
                for c in codes {
                    x.append_child(status(*c));
                }
                if let Some(d) = destroy {
                    x.append_child(d.clone());
                }
                out.stanzas
                    .push(self.presence_stanza(o, base, unavailable, x, &from, to));
            }
        }
    }

    fn presence_stanza(
        &self,
        o: &Occupant,
        base: Option<&Element>,
        unavailable: bool,
        x: Element,
        from: &Jid,
        to: &FullJid,
    ) -> Stanza {
        let mut el = Element::new("presence", ns::CLIENT);
        if unavailable {
            el.set_attr("type", "unavailable");
        }
        if let Some(b) = base {
            for c in presence_payload(b) {
                if !unavailable || c.is("status", ns::CLIENT) {
                    el.append_child(c.clone());
                }
            }
        }
        el.append_child(x);
        el.append_child(
            Element::builder("occupant-id", NS_OCCUPANT_ID)
                .attr("id", o.oid.as_str())
                .build(),
        );
        Stanza::new(el, Some(from.clone()), Some(to.clone().into()))
    }

    /// Sends occupant `o`'s current presence to one session.
    fn presence_to(&self, o: &Occupant, to: &FullJid, viewer: Role, out: &mut Out) {
        let real = o
            .sessions
            .last()
            .map(|(j, _)| j)
            .filter(|_| self.sees_jids(viewer));
        let x = self.user_x(o, real, o.role, &ItemExtra::default());
        let from = self.occupant_jid(&o.nick);
        out.stanzas.push(self.presence_stanza(
            o,
            o.sessions.last().map(|(_, p)| p),
            false,
            x,
            &from,
            to,
        ));
    }

    pub(super) fn on_presence(
        &mut self,
        cx: &Ctx<'_>,
        st: &Stanza,
        from: &FullJid,
        nick: Option<&str>,
        out: &mut Out,
    ) {
        match st.type_attr() {
            None => {}
            Some("unavailable") => {
                if self.by_jid.contains_key(from) {
                    self.leave(from, st.element(), out);
                }
                return;
            }
            Some("error") => {
                if self.by_jid.contains_key(from) && means_gone(st) {
                    self.remove_session(from, &[333], out);
                }
                return;
            }
            _ => return, // subscriptions and probes mean nothing to a room
        }
        let Some(raw) = nick else {
            // §7.2.1: entering needs a nickname.
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::JidMalformed,
                    "a room nickname is required",
                ),
                out,
            );
        };
        let nick = match self.jid.with_resource_str(raw) {
            Ok(j)
                if raw.trim() == raw
                    && !raw.is_empty()
                    && raw.chars().count() <= cx.svc.max_nick_len as usize =>
            {
                j.resource().as_str().to_owned()
            }
            _ => {
                return reply_error(
                    st,
                    err(
                        StanzaErrorCondition::JidMalformed,
                        "this nickname is not allowed",
                    ),
                    out,
                )
            }
        };
        match self.by_jid.get(from).cloned() {
            Some(cur) if cur == nick => self.update_presence(from, st, out),
            Some(cur) => self.change_nick(from, &cur, &nick, st, out),
            None => self.join(cx, from, &nick, st, self.creating, out),
        }
    }

    /// §7.2: enters `from` with `nick`. `created`: the room was just made
    /// for this presence (§10.1.1: status 201, the creator becomes owner).
    pub fn join(
        &mut self,
        _cx: &Ctx<'_>,
        from: &FullJid,
        nick: &str,
        st: &Stanza,
        created: bool,
        out: &mut Out,
    ) {
        let bare = from.to_bare();
        let aff = self.affiliation_of(&bare);
        let refuse = |c: StanzaErrorCondition, text: &str, out: &mut Out| {
            let mut e = st.error_reply(err(c, text));
            if let Some(e) = &mut e {
                e.element_mut().remove_children("x", NS_MUC);
                e.element_mut().append_child(Element::new("x", NS_MUC));
            }
            out.stanzas.extend(e);
        };
        if self.locked && aff != Affiliation::Owner {
            // §7.2.10
            return refuse(
                StanzaErrorCondition::ItemNotFound,
                "this room is locked until its owner configures it",
                out,
            );
        }
        if aff == Affiliation::Outcast {
            return refuse(
                StanzaErrorCondition::Forbidden,
                "you are banned from this room",
                out,
            ); // §7.2.7
        }
        if self.config.members_only && aff < Affiliation::Member {
            return refuse(
                StanzaErrorCondition::RegistrationRequired,
                "this room is for members only",
                out,
            ); // §7.2.6
        }
        let same_person = self.occupants.get(nick).map(|o| o.bare == bare);
        if same_person == Some(false) || self.nick_owner(nick).is_some_and(|o| o != bare.as_str()) {
            // §7.2.8
            return refuse(
                StanzaErrorCondition::Conflict,
                "this nickname is in use or registered by someone else",
                out,
            );
        }
        if same_person.is_none()
            && self.occupants.len() >= self.config.max_users as usize
            && aff < Affiliation::Admin
        {
            return refuse(
                StanzaErrorCondition::ServiceUnavailable,
                "this room is full",
                out,
            ); // §7.2.9
        }
        let x = st.element().get_child("x", NS_MUC);
        if self.config.password_protected {
            let given = x
                .and_then(|x| x.get_child("password", NS_MUC))
                .map(|p| p.text());
            if given.as_deref() != Some(self.config.password.as_str()) {
                return refuse(
                    StanzaErrorCondition::NotAuthorized,
                    "this room needs a password",
                    out,
                ); // §7.2.5
            }
        }
        let role = self.default_role(aff);
        let mut presence = st.element().clone();
        presence.remove_children("x", NS_MUC);
        self.waiting_for_first = false;
        self.by_jid.insert(from.clone(), nick.to_owned());
        match self.occupants.get_mut(nick) {
            Some(o) => o.sessions.push((from.clone(), presence)),
            None => {
                self.occupants.insert(
                    nick.to_owned(),
                    Occupant {
                        nick: nick.to_owned(),
                        oid: self.occupant_id(&bare),
                        bare: bare.clone(),
                        sessions: vec![(from.clone(), presence)],
                        role,
                    },
                );
            }
        }
        let me = &self.occupants[nick];
        // §7.2.3: the others' presence first…
        for o in self.occupants.values() {
            if o.nick != nick && RoomConfig::lists(&self.config.presence_broadcast, o.role.as_str())
            {
                self.presence_to(o, from, me.role, out);
            }
        }
        // …then the new presence to everyone, the occupant's own last.
        let mut self_codes = Vec::new();
        if self.config.whois == Whois::Anyone {
            self_codes.push(100); // §7.2.4
        }
        if self.config.logging {
            self_codes.push(170); // §7.2.12
        }
        if created {
            self_codes.push(201); // §10.1.1
        }
        let mut own = Vec::new();
        {
            let mut all = Out::default();
            self.broadcast_presence(
                me,
                false,
                me.role,
                &[],
                &self_codes,
                &ItemExtra::default(),
                None,
                &mut all,
            );
            let me_jid = Jid::from(from.clone());
            for s in all.stanzas {
                if s.to() == Some(&me_jid) {
                    own.push(s);
                } else {
                    out.stanzas.push(s);
                }
            }
        }
        out.stanzas.extend(own);
        // §7.2.13–§7.2.15: history, then the subject.
        self.send_history(x, from, out);
        let subject_from = if self.subject_by.is_empty() {
            Jid::from(self.jid.clone())
        } else {
            self.occupant_jid(&self.subject_by)
        };
        let subject = Element::builder("message", ns::CLIENT)
            .attr("type", "groupchat")
            .attr("id", starling_proto::random_id(10))
            .append(
                Element::builder("subject", ns::CLIENT)
                    .text(self.subject.as_str())
                    .build(),
            )
            .build();
        out.stanzas.push(Stanza::new(
            subject,
            Some(subject_from),
            Some(from.clone().into()),
        ));
    }

    /// §7.7: a new availability from a joined session.
    fn update_presence(&mut self, from: &FullJid, st: &Stanza, out: &mut Out) {
        let Some(nick) = self.by_jid.get(from).cloned() else {
            return;
        };
        let Some(o) = self.occupants.get_mut(&nick) else {
            return;
        };
        let mut p = st.element().clone();
        p.remove_children("x", NS_MUC);
        if let Some(i) = o.sessions.iter().position(|(j, _)| j == from) {
            let s = o.sessions.remove(i);
            o.sessions.push((s.0, p));
        }
        let o = &self.occupants[&nick];
        self.broadcast_presence(o, false, o.role, &[], &[], &ItemExtra::default(), None, out);
    }

    /// §7.6: a joined session asks for another nickname.
    fn change_nick(&mut self, from: &FullJid, cur: &str, new: &str, st: &Stanza, out: &mut Out) {
        let bare = from.to_bare();
        let taken = self.occupants.get(new).is_some_and(|o| o.bare != bare)
            || self.nick_owner(new).is_some_and(|o| o != bare.as_str());
        if taken {
            // §7.6.3
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::Conflict,
                    "this nickname is in use or registered by someone else",
                ),
                out,
            );
        }
        if self.occupants.contains_key(new) {
            // Another session of the same person holds it: join that nick.
            return reply_error(
                st,
                err(
                    StanzaErrorCondition::NotAcceptable,
                    "leave the room before taking the nickname of your other session",
                ),
                out,
            );
        }
        let Some(o) = self.occupants.get(cur) else {
            return;
        };
        // Unavailable from the old nick with 303 and the new nick…
        let extra = ItemExtra {
            nick: Some(new),
            ..Default::default()
        };
        self.broadcast_presence(o, true, o.role, &[303], &[], &extra, None, out);
        let Some(mut o) = self.occupants.remove(cur) else {
            return;
        };
        // …then available from the new one (§7.6.2).
        let mut p = st.element().clone();
        p.remove_children("x", NS_MUC);
        if let Some(i) = o.sessions.iter().position(|(j, _)| j == from) {
            o.sessions[i].1 = p;
            let s = o.sessions.remove(i);
            o.sessions.push(s);
        }
        o.nick = new.to_owned();
        for (j, _) in &o.sessions {
            self.by_jid.insert(j.clone(), new.to_owned());
        }
        if self.subject_by == cur {
            self.subject_by = new.to_owned();
        }
        self.occupants.insert(new.to_owned(), o);
        let o = &self.occupants[new];
        self.broadcast_presence(o, false, o.role, &[], &[], &ItemExtra::default(), None, out);
    }

    /// §7.14: a session leaves (its last presence's status is kept).
    fn leave(&mut self, from: &FullJid, presence: &Element, out: &mut Out) {
        let Some(nick) = self.by_jid.remove(from) else {
            return;
        };
        let Some(o) = self.occupants.get_mut(&nick) else {
            return;
        };
        o.sessions.retain(|(j, _)| j != from);
        if !o.sessions.is_empty() {
            // Another session keeps the nick: only this one is told.
            let o = &self.occupants[&nick];
            let mut x = self.user_x(o, Some(from), Role::None, &ItemExtra::default());
            x.append_child(status(110));
            let mut el = Element::new("presence", ns::CLIENT);
            el.set_attr("type", "unavailable");
            el.append_child(x);
            let from_jid = self.occupant_jid(&nick);
            out.stanzas
                .push(Stanza::new(el, Some(from_jid), Some(from.clone().into())));
            return;
        }
        let mut p = presence.clone();
        p.remove_children("x", NS_MUC);
        o.sessions.push((from.clone(), p));
        let o = &self.occupants[&nick];
        self.broadcast_presence(
            o,
            true,
            Role::None,
            &[],
            &[],
            &ItemExtra::default(),
            None,
            out,
        );
        self.occupants.remove(&nick);
    }

    /// Removes one session (an error bounce, §11.1: status 333) or, with
    /// `codes` of a kick or ban, the whole occupant.
    pub(super) fn remove_session(&mut self, from: &FullJid, codes: &[u16], out: &mut Out) {
        let Some(nick) = self.by_jid.get(from).cloned() else {
            return;
        };
        let o = &self.occupants[&nick];
        if o.sessions.len() > 1 {
            self.by_jid.remove(from);
            if let Some(o) = self.occupants.get_mut(&nick) {
                o.sessions.retain(|(j, _)| j != from);
            }
            return;
        }
        self.remove_occupant(&nick, Role::None, codes, &ItemExtra::default(), out);
    }

    /// Removes an occupant with an unavailable presence carrying `codes`
    /// (kick 307, ban 301, affiliation change 321, members-only 322,
    /// shutdown 332, error 333).
    pub(super) fn remove_occupant(
        &mut self,
        nick: &str,
        role: Role,
        codes: &[u16],
        extra: &ItemExtra<'_>,
        out: &mut Out,
    ) {
        let Some(o) = self.occupants.get(nick) else {
            return;
        };
        self.broadcast_presence(o, true, role, codes, &[], extra, None, out);
        if let Some(o) = self.occupants.remove(nick) {
            for (j, _) in o.sessions {
                self.by_jid.remove(&j);
            }
        }
    }

    /// Every occupant leaves because the service stops (status 332).
    pub fn shutdown(&mut self, out: &mut Out) {
        let nicks: Vec<String> = self.occupants.keys().cloned().collect();
        for n in nicks {
            self.remove_occupant(&n, Role::None, &[332], &ItemExtra::default(), out);
        }
    }
}
