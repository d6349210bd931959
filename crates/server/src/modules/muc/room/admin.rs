//! The `muc#admin` requests (XEP-0045): the lists by role or affiliation
//! (§8.5, §9.2, §9.5, §9.8, §10.5, §10.8) and their changes — roles
//! (§8.2–§8.4), bans (§9.1), members (§9.3–§9.4), admins and owners
//! (§10.3–§10.8) — with their effect on occupants; nickname registration
//! (§7.10), which makes a member; an account's removal from the server.

use super::{err, Aff, Affiliation, ItemExtra, Out, Role, Room};
use crate::modules::muc::config::RoomConfig;
use crate::modules::muc::store::RoomAffiliation;
use crate::modules::muc::NS_MUC_ADMIN;
use starling_core::forms::{FormBuilder, Submitted};
use starling_proto::{ns, BareJid, FullJid, StanzaError, StanzaErrorCondition};
use starling_xml::Element;

impl Room {
    /// The actor's role and affiliation.
    fn standing(&self, from: &FullJid) -> (Role, Affiliation, Option<String>) {
        let aff = self.affiliation_of(&from.to_bare());
        match self.by_jid.get(from) {
            Some(n) => (self.occupants[n].role, aff, Some(n.clone())),
            None => (Role::None, aff, None),
        }
    }

    /// §8.5, §9.2, §9.5, §9.8, §10.5, §10.8: lists by role or affiliation.
    pub(super) fn admin_get(
        &self,
        from: &FullJid,
        q: &Element,
    ) -> Result<Option<Element>, StanzaError> {
        let (role, aff, _) = self.standing(from);
        let item = q
            .get_child("item", NS_MUC_ADMIN)
            .ok_or_else(|| err(StanzaErrorCondition::BadRequest, "an item is required"))?;
        let mut r = Element::new("query", NS_MUC_ADMIN);
        if let Some(want) = item.attr("role") {
            let want = Role::parse(want)
                .ok_or_else(|| err(StanzaErrorCondition::BadRequest, "unknown role"))?;
            let allowed = match want {
                Role::Moderator => aff >= Affiliation::Admin,
                _ => role == Role::Moderator,
            };
            if !allowed {
                return Err(err(
                    StanzaErrorCondition::Forbidden,
                    "you may not see this list",
                ));
            }
            for o in self.occupants.values().filter(|o| o.role == want) {
                let mut i = Element::builder("item", NS_MUC_ADMIN)
                    .attr("affiliation", self.affiliation_of(&o.bare).as_str())
                    .attr("role", o.role.as_str())
                    .attr("nick", o.nick.as_str())
                    .build();
                if let Some((j, _)) = o.sessions.last() {
                    i.set_attr("jid", j.as_str());
                }
                r.append_child(i);
            }
            return Ok(Some(r));
        }
        let want = item
            .attr("affiliation")
            .and_then(Affiliation::parse)
            .filter(|a| *a != Affiliation::None)
            .ok_or_else(|| {
                err(
                    StanzaErrorCondition::BadRequest,
                    "an item needs a role or an affiliation",
                )
            })?;
        let allowed = match want {
            Affiliation::Member => {
                aff >= Affiliation::Admin
                    || RoomConfig::lists(&self.config.get_member_list, role.as_str())
                        && role != Role::None
            }
            _ => aff >= Affiliation::Admin,
        };
        if !allowed {
            return Err(err(
                StanzaErrorCondition::Forbidden,
                "you may not see this list",
            ));
        }
        for (j, a) in self
            .affiliations
            .iter()
            .filter(|(_, a)| a.affiliation == want)
        {
            let mut i = Element::builder("item", NS_MUC_ADMIN)
                .attr("affiliation", want.as_str())
                .attr("jid", j.as_str())
                .build();
            if let Some(n) = &a.nick {
                i.set_attr("nick", n.as_str());
            }
            if let Some(reason) = &a.reason {
                i.append_child(
                    Element::builder("reason", NS_MUC_ADMIN)
                        .text(reason.as_str())
                        .build(),
                );
            }
            r.append_child(i);
        }
        Ok(Some(r))
    }

    /// §8.2–§8.5, §9.1–§9.8, §10.3–§10.8: role and affiliation changes,
    /// all checked before any is applied.
    pub(super) fn admin_set(
        &mut self,
        from: &FullJid,
        q: &Element,
        out: &mut Out,
    ) -> Result<Option<Element>, StanzaError> {
        let standing = self.standing(from);
        self.admin_items(standing, Some(&from.to_bare()), q, out)
    }

    /// The items of a `muc#admin` set by an actor of this standing (role,
    /// affiliation, nick) with this real JID (none: the server).
    pub(super) fn admin_items(
        &mut self,
        (role, aff, actor_nick): (Role, Affiliation, Option<String>),
        actor: Option<&BareJid>,
        q: &Element,
        out: &mut Out,
    ) -> Result<Option<Element>, StanzaError> {
        enum Change {
            Role(String, Role, Option<String>),
            Aff(BareJid, Affiliation, Option<String>),
        }
        let mut changes = Vec::new();
        for item in q.children().filter(|c| c.is("item", NS_MUC_ADMIN)) {
            let reason = item.get_child("reason", NS_MUC_ADMIN).map(|r| r.text());
            if let Some(a) = item.attr("affiliation") {
                let a = Affiliation::parse(a)
                    .ok_or_else(|| err(StanzaErrorCondition::BadRequest, "unknown affiliation"))?;
                let target = match (item.attr("jid"), item.attr("nick")) {
                    (Some(j), _) => BareJid::new(j.split('/').next().unwrap_or(j))
                        .map_err(|_| err(StanzaErrorCondition::JidMalformed, "not a valid JID"))?,
                    (None, Some(n)) => {
                        self.occupants
                            .get(n)
                            .map(|o| o.bare.clone())
                            .ok_or_else(|| {
                                err(
                                    StanzaErrorCondition::ItemNotFound,
                                    "no occupant has this nickname",
                                )
                            })?
                    }
                    _ => {
                        return Err(err(
                            StanzaErrorCondition::BadRequest,
                            "an affiliation item needs a jid",
                        ))
                    }
                };
                let current = self
                    .affiliations
                    .get(target.as_str())
                    .map_or(Affiliation::None, |x| x.affiliation);
                // Owners change anything; admins only below admin, to below admin.
                let may = aff == Affiliation::Owner
                    || (aff == Affiliation::Admin
                        && current < Affiliation::Admin
                        && a < Affiliation::Admin);
                if !may {
                    return Err(err(
                        StanzaErrorCondition::NotAllowed,
                        "you may not change this affiliation",
                    ));
                }
                changes.push(Change::Aff(target, a, reason));
            } else if let Some(r) = item.attr("role") {
                let r = Role::parse(r)
                    .ok_or_else(|| err(StanzaErrorCondition::BadRequest, "unknown role"))?;
                let nick = item.attr("nick").ok_or_else(|| {
                    err(StanzaErrorCondition::BadRequest, "a role item needs a nick")
                })?;
                let target = self.occupants.get(nick).ok_or_else(|| {
                    err(
                        StanzaErrorCondition::ItemNotFound,
                        "no occupant has this nickname",
                    )
                })?;
                let target_aff = self.affiliation_of(&target.bare);
                if role != Role::Moderator {
                    return Err(err(
                        StanzaErrorCondition::Forbidden,
                        "only moderators change roles",
                    ));
                }
                // §8.2, §8.4, §9.7: nobody lowers the role of a higher (or
                // equal admin/owner) affiliation; moderator status is the
                // admins' to give and take.
                if (r < target.role
                    && target_aff >= Affiliation::Admin
                    && target_aff >= aff
                    && Some(&target.bare) != actor)
                    || (target_aff > aff && r < target.role)
                {
                    return Err(err(
                        StanzaErrorCondition::NotAllowed,
                        "you may not change the role of this occupant",
                    ));
                }
                if (r == Role::Moderator || target.role == Role::Moderator)
                    && aff < Affiliation::Admin
                    && r != target.role
                {
                    return Err(err(
                        StanzaErrorCondition::NotAllowed,
                        "only admins and owners grant or revoke moderator status",
                    ));
                }
                changes.push(Change::Role(nick.to_owned(), r, reason));
            } else {
                return Err(err(
                    StanzaErrorCondition::BadRequest,
                    "an item needs a role or an affiliation",
                ));
            }
        }
        if changes.is_empty() {
            return Err(err(StanzaErrorCondition::BadRequest, "no item"));
        }
        // §10.4: the room always keeps an owner.
        let mut owners: Vec<String> = self.with_affiliation(Affiliation::Owner);
        for c in &changes {
            if let Change::Aff(j, a, _) = c {
                owners.retain(|o| o != j.as_str());
                if *a == Affiliation::Owner {
                    owners.push(j.to_string());
                }
            }
        }
        if owners.is_empty() {
            return Err(err(
                StanzaErrorCondition::Conflict,
                "the room must keep at least one owner",
            ));
        }
        let actor = actor_nick.unwrap_or_default();
        for c in changes {
            match c {
                Change::Role(nick, r, reason) => {
                    self.set_role(&nick, r, &actor, reason.as_deref(), out)
                }
                Change::Aff(j, a, reason) => self.change_affiliation(&j, a, &actor, reason, out),
            }
        }
        Ok(None)
    }

    /// Stores an affiliation row (no presence effects).
    pub(super) fn set_affiliation(
        &mut self,
        jid: &str,
        a: Affiliation,
        reason: Option<String>,
        out: &mut Out,
    ) {
        let nick = self.affiliations.get(jid).and_then(|x| x.nick.clone());
        if a == Affiliation::None {
            self.affiliations.remove(jid);
        } else {
            self.affiliations.insert(
                jid.to_owned(),
                Aff {
                    affiliation: a,
                    nick: nick.clone().filter(|_| a != Affiliation::Outcast),
                    reason: reason.clone(),
                },
            );
        }
        out.affiliations.push(RoomAffiliation {
            jid: jid.to_owned(),
            affiliation: a.as_str().to_owned(),
            nick: nick.filter(|_| a != Affiliation::Outcast),
            reason,
        });
    }

    /// The server deletes account `gone`: its affiliation (and the nick
    /// registered with it) goes, with the effects of an owner setting it
    /// to `none` (§9.4 in a members-only room: removed with 321). A room
    /// whose only owner it was keeps no owner; the service's `admins` can
    /// still manage it.
    pub fn account_removed(&mut self, gone: &BareJid, out: &mut Out) {
        if self.affiliations.contains_key(gone.as_str()) {
            self.change_affiliation(
                gone,
                Affiliation::None,
                "",
                Some("account deleted".to_owned()),
                out,
            );
            tracing::info!(module = crate::modules::muc::NAME, room = %self.jid, user = %gone, "deleted account's affiliation removed");
        }
    }

    /// Changes an affiliation and its effect on occupants holding it:
    /// ban (§9.1: 301), membership lost in a members-only room (§9.4:
    /// 321), roles following the new affiliation (§9.3, §9.6, §10.3).
    pub(super) fn change_affiliation(
        &mut self,
        j: &BareJid,
        a: Affiliation,
        actor: &str,
        reason: Option<String>,
        out: &mut Out,
    ) {
        self.set_affiliation(j.as_str(), a, reason.clone(), out);
        let nicks: Vec<String> = self
            .occupants
            .values()
            .filter(|o| &o.bare == j || (j.node().is_none() && o.bare.domain() == j.domain()))
            .map(|o| o.nick.clone())
            .collect();
        let extra = ItemExtra {
            actor: Some(actor).filter(|a| !a.is_empty()),
            reason: reason.as_deref(),
            nick: None,
        };
        for nick in nicks {
            if a == Affiliation::Outcast {
                self.remove_occupant(&nick, Role::None, &[301], &extra, out);
            } else if self.config.members_only && a < Affiliation::Member {
                self.remove_occupant(&nick, Role::None, &[321], &extra, out);
            } else {
                let cur = self.occupants[&nick].role;
                let role = match a {
                    Affiliation::Owner | Affiliation::Admin => Role::Moderator,
                    Affiliation::Member if cur < Role::Participant => Role::Participant,
                    _ if cur == Role::Moderator => self.default_role(a),
                    _ => cur,
                };
                if let Some(o) = self.occupants.get_mut(&nick) {
                    o.role = role;
                }
                let o = &self.occupants[&nick];
                self.broadcast_presence(o, false, role, &[], &[], &extra, None, out);
            }
        }
    }

    /// §7.10: the registration form, or the registered nick.
    pub(super) fn register_get(&self, from: &FullJid) -> Result<Option<Element>, StanzaError> {
        let bare = from.to_bare();
        if let Some(n) = self
            .affiliations
            .get(bare.as_str())
            .and_then(|a| a.nick.as_deref())
        {
            return Ok(Some(
                Element::builder("query", ns::REGISTER)
                    .append(Element::new("registered", ns::REGISTER))
                    .append(Element::builder("username", ns::REGISTER).text(n).build())
                    .build(),
            ));
        }
        if self.config.members_only && self.affiliation_of(&bare) < Affiliation::Member {
            return Err(err(
                StanzaErrorCondition::RegistrationRequired,
                "this room registers its members only",
            ));
        }
        let form = FormBuilder::new("form", Some("http://jabber.org/protocol/muc#register"))
            .title("Register with the room")
            .instructions("Reserve a nickname in this room.")
            .field(
                "muc#register_roomnick",
                "text-single",
                Some("Desired nickname"),
                &[],
            )
            .build();
        Ok(Some(
            Element::builder("query", ns::REGISTER)
                .append(
                    Element::builder("instructions", ns::REGISTER)
                        .text("Reserve a nickname in this room.")
                        .build(),
                )
                .append(form)
                .build(),
        ))
    }

    /// §7.10: registering a nickname makes the user a member; `<remove/>`
    /// gives both up.
    pub(super) fn register_set(
        &mut self,
        from: &FullJid,
        q: &Element,
        out: &mut Out,
    ) -> Result<Option<Element>, StanzaError> {
        let bare = from.to_bare();
        let aff = self.affiliation_of(&bare);
        if q.get_child("remove", ns::REGISTER).is_some() {
            if let Some(a) = self.affiliations.get_mut(bare.as_str()) {
                a.nick = None;
                if a.affiliation == Affiliation::Member {
                    self.change_affiliation(&bare, Affiliation::None, "", None, out);
                } else {
                    let a = a.affiliation;
                    self.set_affiliation(bare.as_str(), a, None, out);
                }
            }
            return Ok(None);
        }
        if aff == Affiliation::Outcast {
            return Err(err(
                StanzaErrorCondition::Forbidden,
                "you are banned from this room",
            ));
        }
        if self.config.members_only && aff < Affiliation::Member {
            return Err(err(
                StanzaErrorCondition::RegistrationRequired,
                "this room registers its members only",
            ));
        }
        let form = q
            .get_child("x", ns::DATA_FORMS)
            .map(Submitted::parse)
            .ok_or_else(|| {
                err(
                    StanzaErrorCondition::BadRequest,
                    "submit the registration form",
                )
            })?;
        if form.kind == "cancel" {
            return Ok(None);
        }
        let raw = form
            .single("muc#register_roomnick")
            .ok()
            .flatten()
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                err(
                    StanzaErrorCondition::NotAcceptable,
                    "muc#register_roomnick is required",
                )
            })?;
        let nick = self
            .jid
            .with_resource_str(raw)
            .map(|j| j.resource().as_str().to_owned())
            .map_err(|_| {
                err(
                    StanzaErrorCondition::JidMalformed,
                    "this nickname is not allowed",
                )
            })?;
        if self.nick_owner(&nick).is_some_and(|o| o != bare.as_str())
            || self.occupants.get(&nick).is_some_and(|o| o.bare != bare)
        {
            return Err(err(
                StanzaErrorCondition::Conflict,
                "this nickname is registered by someone else",
            ));
        }
        let a = aff.max(Affiliation::Member);
        let reason = self
            .affiliations
            .get(bare.as_str())
            .and_then(|x| x.reason.clone());
        self.affiliations.insert(
            bare.to_string(),
            Aff {
                affiliation: a,
                nick: Some(nick.clone()),
                reason: reason.clone(),
            },
        );
        out.affiliations.push(RoomAffiliation {
            jid: bare.to_string(),
            affiliation: a.as_str().to_owned(),
            nick: Some(nick),
            reason,
        });
        if aff < Affiliation::Member {
            let nicks: Vec<String> = self
                .occupants
                .values()
                .filter(|o| o.bare == bare)
                .map(|o| o.nick.clone())
                .collect();
            for n in nicks {
                if let Some(o) = self.occupants.get_mut(&n) {
                    o.role = o.role.max(Role::Participant);
                }
                let o = &self.occupants[&n];
                self.broadcast_presence(
                    o,
                    false,
                    o.role,
                    &[],
                    &[],
                    &ItemExtra::default(),
                    None,
                    out,
                );
            }
        }
        Ok(None)
    }
}
