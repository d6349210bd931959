//! The owner's requests (XEP-0045 §10): the configuration form (§10.1.2
//! instant room, §10.1.3, §10.2, with the status codes of §10.2.1),
//! destroying the room (§10.9), and the room's vCard (room avatars as
//! XEP-0486 describes).

use super::{err, status, Affiliation, Ctx, ItemExtra, Out, Role, Room};
use crate::modules::muc::config::{FormProblem, Whois};
use crate::modules::muc::{NS_MUC_OWNER, NS_MUC_USER, NS_VCARD, NS_VCARD_UPDATE};
use starling_core::forms::Submitted;
use starling_proto::{ns, BareJid, FullJid, StanzaError, StanzaErrorCondition};
use starling_xml::Element;

impl Room {
    /// §10.1.3, §10.2: the configuration form, for owners.
    pub(super) fn owner_get(
        &self,
        cx: &Ctx<'_>,
        from: &FullJid,
    ) -> Result<Option<Element>, StanzaError> {
        if self.affiliation_of(&from.to_bare()) != Affiliation::Owner {
            return Err(err(
                StanzaErrorCondition::Forbidden,
                "only owners may configure the room",
            ));
        }
        let form = self
            .config
            .form(
                cx.svc,
                &self.with_affiliation(Affiliation::Owner),
                &self.with_affiliation(Affiliation::Admin),
            )
            .build();
        Ok(Some(
            Element::builder("query", NS_MUC_OWNER).append(form).build(),
        ))
    }

    /// §10.1.2 (instant room), §10.1.3, §10.2 (configuration), §10.9
    /// (destroy).
    pub(super) fn owner_set(
        &mut self,
        cx: &Ctx<'_>,
        from: &FullJid,
        q: &Element,
        out: &mut Out,
    ) -> Result<Option<Element>, StanzaError> {
        if self.affiliation_of(&from.to_bare()) != Affiliation::Owner {
            return Err(err(
                StanzaErrorCondition::Forbidden,
                "only owners may configure or destroy the room",
            ));
        }
        if let Some(d) = q.get_child("destroy", NS_MUC_OWNER) {
            self.destroy(d, out);
            return Ok(None);
        }
        let Some(x) = q.get_child("x", ns::DATA_FORMS) else {
            return Err(err(
                StanzaErrorCondition::BadRequest,
                "send a form or a destroy request",
            ));
        };
        let form = Submitted::parse(x);
        if form.kind == "cancel" {
            // §10.1.3: cancelling the first configuration destroys the room.
            if self.locked {
                self.destroy(&Element::new("destroy", NS_MUC_OWNER), out);
            }
            return Ok(None);
        }
        if form.kind != "submit" {
            return Err(err(
                StanzaErrorCondition::BadRequest,
                "the form must be of type submit or cancel",
            ));
        }
        let (new, lists) = self.config.apply(cx.svc, &form).map_err(|p| match p {
            FormProblem::Bad(t) => err(StanzaErrorCondition::BadRequest, &t),
            FormProblem::NotAcceptable(t) => err(StanzaErrorCondition::NotAcceptable, &t),
        })?;
        if lists.owners.as_ref().is_some_and(|o| o.is_empty()) {
            return Err(err(
                StanzaErrorCondition::Conflict,
                "the room must keep at least one owner",
            ));
        }
        let old = std::mem::replace(&mut self.config, new);
        let was_locked = std::mem::replace(&mut self.locked, false);
        out.save = true;
        for (list, a) in [
            (lists.owners, Affiliation::Owner),
            (lists.admins, Affiliation::Admin),
        ] {
            let Some(list) = list else { continue };
            for j in self.with_affiliation(a) {
                if !list.contains(&j) {
                    if let Ok(b) = BareJid::new(&j) {
                        self.change_affiliation(&b, Affiliation::None, "", None, out);
                    }
                }
            }
            for j in list {
                if self.affiliations.get(&j).map(|x| x.affiliation) != Some(a) {
                    if let Ok(b) = BareJid::new(&j) {
                        self.change_affiliation(&b, a, "", None, out);
                    }
                }
            }
        }
        // §10.2.1: tell the occupants what changed.
        let c = &self.config;
        let mut codes = Vec::new();
        if !was_locked {
            codes.push(104);
        }
        if c.logging != old.logging {
            codes.push(if c.logging { 170 } else { 171 });
        }
        if c.whois != old.whois {
            codes.push(if c.whois == Whois::Anyone { 172 } else { 173 });
        }
        if !codes.is_empty() {
            let mut x = Element::new("x", NS_MUC_USER);
            for code in codes {
                x.append_child(status(code));
            }
            let m = Element::builder("message", ns::CLIENT)
                .attr("type", "groupchat")
                .attr("id", starling_proto::random_id(10))
                .append(x)
                .build();
            self.to_everyone(&m, &self.jid.clone().into(), out);
        }
        // §9.4 / status 322: a room turned members-only loses non-members.
        if self.config.members_only && !old.members_only {
            let out_nicks: Vec<String> = self
                .occupants
                .values()
                .filter(|o| self.affiliation_of(&o.bare) < Affiliation::Member)
                .map(|o| o.nick.clone())
                .collect();
            for n in out_nicks {
                self.remove_occupant(&n, Role::None, &[322], &ItemExtra::default(), out);
            }
        }
        // Roles follow a change of moderation for unaffiliated occupants.
        if self.config.moderated != old.moderated {
            let nicks: Vec<String> = self.occupants.keys().cloned().collect();
            for n in nicks {
                let o = &self.occupants[&n];
                let aff = self.affiliation_of(&o.bare);
                let target = self.default_role(aff);
                if aff == Affiliation::None && o.role != Role::Moderator && o.role != target {
                    self.set_role(&n, target, "", None, out);
                }
            }
        }
        Ok(None)
    }

    /// §10.9: every occupant leaves with the `<destroy/>` (alternate venue
    /// and reason); the room is deleted.
    pub(super) fn destroy(&mut self, d: &Element, out: &mut Out) {
        let mut destroy = Element::new("destroy", NS_MUC_USER);
        if let Some(j) = d.attr("jid") {
            destroy.set_attr("jid", j);
        }
        if let Some(r) = d.get_child("reason", NS_MUC_OWNER) {
            destroy.append_child(
                Element::builder("reason", NS_MUC_USER)
                    .text(r.text())
                    .build(),
            );
        }
        if let Some(p) = d.get_child("password", NS_MUC_OWNER) {
            destroy.append_child(
                Element::builder("password", NS_MUC_USER)
                    .text(p.text())
                    .build(),
            );
        }
        let nicks: Vec<String> = self.occupants.keys().cloned().collect();
        for n in &nicks {
            let o = &self.occupants[n];
            self.broadcast_presence(
                o,
                true,
                Role::None,
                &[],
                &[],
                &ItemExtra::default(),
                Some(&destroy),
                out,
            );
        }
        self.occupants.clear();
        self.by_jid.clear();
        out.destroyed = true;
    }

    /// Room avatars (vcard-temp on the room's JID, as XEP-0486 describes):
    /// owners set the vCard; when its photo changes, occupants get
    /// presence from the room's JID with the XEP-0153 hash.
    pub(super) fn set_vcard(
        &mut self,
        cx: &Ctx<'_>,
        from: &FullJid,
        q: &Element,
        out: &mut Out,
    ) -> Result<Option<Element>, StanzaError> {
        if self.affiliation_of(&from.to_bare()) != Affiliation::Owner {
            return Err(err(
                StanzaErrorCondition::Forbidden,
                "only owners may change the room's vCard",
            ));
        }
        let xml = q.to_string();
        if xml.len() > cx.svc.max_vcard_bytes {
            return Err(err(
                StanzaErrorCondition::NotAcceptable,
                "the vCard is too large",
            ));
        }
        let photo = q
            .get_child("PHOTO", NS_VCARD)
            .and_then(|p| p.get_child("BINVAL", NS_VCARD))
            .map(|b| b.text().split_whitespace().collect::<String>());
        let hash = match photo {
            None => String::new(),
            Some(b64) => {
                use base64::Engine as _;
                use sha1::Digest as _;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(b64.as_bytes())
                    .map_err(|_| {
                        err(
                            StanzaErrorCondition::BadRequest,
                            "PHOTO/BINVAL is not base64",
                        )
                    })?;
                sha1::Sha1::digest(&bytes)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect()
            }
        };
        self.config.vcard = if q.children().next().is_some() {
            xml
        } else {
            String::new()
        };
        out.save = true;
        if hash != self.config.avatar_hash {
            self.config.avatar_hash = hash;
            let mut x = Element::new("x", NS_VCARD_UPDATE);
            let mut photo = Element::new("photo", NS_VCARD_UPDATE);
            if !self.config.avatar_hash.is_empty() {
                photo.append_text(self.config.avatar_hash.as_str());
            }
            x.append_child(photo);
            let p = Element::builder("presence", ns::CLIENT).append(x).build();
            self.to_everyone(&p, &self.jid.clone().into(), out);
        }
        Ok(None)
    }
}
