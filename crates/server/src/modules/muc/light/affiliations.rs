//! MUC Light members ("Changing the occupant list"): the user items, the
//! protocol's rules for who may change what, the owner's hand-over, the
//! checks on newcomers (accounts, blocking lists, room limits), and the
//! change itself with its notifications.

use super::messages::{archive_notification, notification};
use super::{
    aff_str, bad, internal, new_version, not_allowed, row, user_el, Done, Inner, LAff, LightRoom,
    MucLightConfig, NAME, NS_AFFILIATIONS,
};
use crate::modules::muc::host::{self, error};
use crate::modules::muc::store::RoomAffiliation;
use starling_core::Env;
use starling_proto::{BareJid, Stanza, StanzaError, StanzaErrorCondition};
use starling_xml::Element;
use std::collections::{BTreeMap, BTreeSet};

/// Parses `<user affiliation='…'>jid</user>` items.
pub(super) fn parse_users(
    q: &Element,
    ns: &str,
) -> Result<Vec<(BareJid, Option<LAff>)>, StanzaError> {
    let mut seen = BTreeSet::new();
    let mut items = Vec::new();
    for c in q.children() {
        if !c.is("user", ns) {
            if c.name() == "version" && c.ns() == ns {
                continue;
            }
            return Err(bad(
                "only <user affiliation='…'>jid</user> items are allowed here",
            ));
        }
        let aff = c
            .attr("affiliation")
            .and_then(LAff::parse)
            .ok_or_else(|| bad("affiliation must be owner, member or none"))?;
        let text = c.text();
        let jid = BareJid::new(text.trim())
            .ok()
            .filter(|j| j.node().is_some())
            .ok_or_else(|| bad("a user item holds a user's bare JID"))?;
        if !seen.insert(jid.clone()) {
            return Err(bad("each user may appear once"));
        }
        items.push((jid, aff));
    }
    Ok(items)
}

/// Checks users about to become members: accounts of this server that
/// exist and are not in too many rooms. Returns those who refuse (their
/// blocking lists), to be skipped silently.
pub(super) async fn check_newcomers(
    host: &Inner,
    env: &Env,
    room: &BareJid,
    by: &BareJid,
    newcomers: &[BareJid],
) -> Result<Vec<BareJid>, StanzaError> {
    for n in newcomers {
        if !env.hosts.is_local(n.domain().as_str()) {
            return Err(error(
                StanzaErrorCondition::NotAcceptable,
                &format!("{n} is not an account of this server (no server-to-server links)"),
            ));
        }
        if n != by {
            match env.storage.accounts.exists(n).await {
                Ok(true) => {}
                Ok(false) => {
                    return Err(error(
                        StanzaErrorCondition::ItemNotFound,
                        &format!("there is no account {n}"),
                    ))
                }
                Err(e) => return Err(internal(e, "account lookup")),
            }
        }
    }
    let refusing = if host.cfg.blocking {
        host.store
            .light_refusing(newcomers, room, by)
            .await
            .map_err(|e| internal(e, "reading blocking lists"))?
    } else {
        Vec::new()
    };
    if host.cfg.max_rooms_per_user > 0 {
        let service = room.domain().as_str();
        for n in newcomers.iter().filter(|n| !refusing.contains(n)) {
            let rooms = host
                .store
                .rooms_of(n)
                .await
                .map_err(|e| internal(e, "counting rooms"))?;
            let count = rooms
                .iter()
                .filter(|(j, _)| j.domain().as_str() == service)
                .count();
            if count >= host.cfg.max_rooms_per_user as usize {
                return Err(not_allowed(&format!(
                    "{n} is in as many rooms as this service allows ({})",
                    host.cfg.max_rooms_per_user
                )));
            }
        }
    }
    Ok(refusing)
}

/// The changes an affiliation request makes, after the protocol's rules
/// ("Changing the occupant list"), before blocking lists are applied.
/// `Err` is the error the requester gets.
pub(super) fn plan(
    cfg: &MucLightConfig,
    members: &BTreeMap<BareJid, LAff>,
    actor: &BareJid,
    items: &[(BareJid, Option<LAff>)],
) -> Result<Vec<(BareJid, Option<LAff>)>, StanzaError> {
    let actor_owner = members.get(actor) == Some(&LAff::Owner);
    let mut owners = 0;
    for (j, new) in items {
        let cur = members.get(j).copied();
        if cur == *new {
            return Err(bad(&format!(
                "{j} is already {}: every change must change something",
                aff_str(cur)
            )));
        }
        match new {
            Some(LAff::Owner) => {
                if cfg.equal_occupants {
                    return Err(bad("rooms of this service have no owner"));
                }
                if !actor_owner {
                    return Err(not_allowed("only the owner may choose an owner"));
                }
                owners += 1;
            }
            None if j != actor && !actor_owner => {
                return Err(not_allowed("only the owner may remove others"));
            }
            Some(LAff::Member) if cur.is_none() && !actor_owner && !cfg.all_can_invite => {
                return Err(not_allowed("only the owner may add members"));
            }
            Some(LAff::Member) if cur == Some(LAff::Owner) && !actor_owner => {
                return Err(not_allowed("only the owner may change an owner"));
            }
            _ => {}
        }
    }
    if owners > 1 {
        return Err(bad("a room has at most one owner"));
    }
    Ok(items.to_vec())
}

/// Completes a plan: a new owner demotes the old one; an owner who leaves
/// or steps down without naming one is replaced by the first remaining
/// member. Returns the full change list.
pub(super) fn complete(
    cfg: &MucLightConfig,
    members: &BTreeMap<BareJid, LAff>,
    mut changes: Vec<(BareJid, Option<LAff>)>,
) -> Vec<(BareJid, Option<LAff>)> {
    if cfg.equal_occupants {
        return changes;
    }
    let old_owner = members
        .iter()
        .find(|(_, a)| **a == LAff::Owner)
        .map(|(j, _)| j.clone());
    let new_owner = changes
        .iter()
        .find(|(_, a)| *a == Some(LAff::Owner))
        .map(|(j, _)| j.clone());
    match (old_owner, new_owner) {
        (Some(old), Some(_)) if !changes.iter().any(|(j, _)| *j == old) => {
            changes.push((old, Some(LAff::Member)));
        }
        (Some(old), None) => {
            let leaves = changes
                .iter()
                .any(|(j, a)| *j == old && *a != Some(LAff::Owner));
            if leaves {
                let mut after = members.clone();
                for (j, a) in &changes {
                    match a {
                        Some(a) => after.insert(j.clone(), *a),
                        None => after.remove(j),
                    };
                }
                let heir = after
                    .iter()
                    .find(|(j, a)| **a == LAff::Member && **j != old)
                    .map(|(j, _)| j.clone());
                if let Some(heir) = heir {
                    changes.retain(|(j, _)| *j != heir);
                    changes.push((heir, Some(LAff::Owner)));
                }
            }
        }
        _ => {}
    }
    changes
}

/// "Changing the occupant list".
pub(super) async fn affiliations(
    host: &Inner,
    env: &Env,
    r: &mut LightRoom,
    sender: &BareJid,
    st: &Stanza,
    q: &Element,
) -> Result<Done, StanzaError> {
    let items = parse_users(q, NS_AFFILIATIONS)?;
    if items.is_empty() {
        return Err(bad("name at least one user"));
    }
    let mut changes = plan(&host.cfg, &r.members, sender, &items)?;
    let newcomers: Vec<BareJid> = changes
        .iter()
        .filter(|(j, a)| a.is_some() && !r.members.contains_key(j))
        .map(|(j, _)| j.clone())
        .collect();
    if !newcomers.is_empty() {
        // Those who block the room or the sender are skipped silently.
        let refusing = check_newcomers(host, env, &r.jid, sender, &newcomers).await?;
        changes.retain(|(j, _)| !refusing.contains(j));
    }
    let changes = complete(&host.cfg, &r.members, changes);
    let mut after = r.members.clone();
    for (j, a) in &changes {
        match a {
            Some(a) => after.insert(j.clone(), *a),
            None => after.remove(j),
        };
    }
    if after.len() > host.cfg.max_occupants as usize {
        return Err(not_allowed(&format!(
            "a room has at most {} members",
            host.cfg.max_occupants
        )));
    }
    let id = st.id().unwrap_or_default();
    let mut out = Vec::new();
    if changes.is_empty() {
        // Everyone named refuses: nothing changes.
        out.push(st.iq_result(None));
        return Ok(Done::Kept(out));
    }
    let removed: Vec<BareJid> = changes
        .iter()
        .filter(|(_, a)| a.is_none())
        .map(|(j, _)| j.clone())
        .collect();
    for j in &removed {
        let mut x = Element::new("x", NS_AFFILIATIONS);
        x.append_child(user_el(NS_AFFILIATIONS, j, None));
        out.push(notification(&r.jid, j, id, vec![x]));
    }
    if after.is_empty() {
        // "A room is automatically destroyed when its occupant list
        // becomes empty."
        out.push(st.iq_result(None));
        return Ok(Done::Destroyed(out));
    }
    let rows: Vec<RoomAffiliation> = changes.iter().map(|(j, a)| row(j, *a)).collect();
    host.store
        .set_affiliations(&r.jid, &rows)
        .await
        .map_err(|e| internal(e, "storing the room's members"))?;
    let prev = std::mem::replace(&mut r.version, new_version());
    let old = std::mem::replace(&mut r.members, after);
    if let Err(e) = host.store.put_room(&r.to_stored()).await {
        tracing::error!(module = NAME, room = %r.jid, error = %e, "storing the room's version failed");
    }
    let list = |parent: &mut Element| {
        for (j, a) in &changes {
            parent.append_child(user_el(NS_AFFILIATIONS, j, *a));
        }
    };
    let mut x = Element::new("x", NS_AFFILIATIONS);
    x.append_child(
        Element::builder("version", NS_AFFILIATIONS)
            .text(r.version.as_str())
            .build(),
    );
    list(&mut x);
    let (archived, sid) = archive_notification(host, r, x).await;
    let mut full = Element::new("x", NS_AFFILIATIONS);
    full.append_child(
        Element::builder("prev-version", NS_AFFILIATIONS)
            .text(prev.as_str())
            .build(),
    );
    full.append_child(
        Element::builder("version", NS_AFFILIATIONS)
            .text(r.version.as_str())
            .build(),
    );
    list(&mut full);
    let mut joined = Vec::new();
    for (j, a) in &r.members {
        if old.contains_key(j) {
            out.push(notification(&r.jid, j, id, vec![full.clone(), sid.clone()]));
        } else {
            // Newcomers: only their own affiliation, no prev-version.
            let mut x = Element::new("x", NS_AFFILIATIONS);
            x.append_child(
                Element::builder("version", NS_AFFILIATIONS)
                    .text(r.version.as_str())
                    .build(),
            );
            x.append_child(user_el(NS_AFFILIATIONS, j, Some(*a)));
            out.push(notification(&r.jid, j, id, vec![x, sid.clone()]));
            joined.push(j.clone());
        }
    }
    // Newcomers see the room in their inbox.
    if !joined.is_empty() && !env.hooks.archived.is_empty() {
        if let Some(aid) = sid
            .attr("id")
            .and_then(starling_core::storage::ArchiveId::decode)
        {
            host::to_inboxes(
                env,
                &r.jid,
                &joined,
                vec![(
                    aid,
                    sender.clone(),
                    starling_proto::mam::Kind::Instant,
                    archived,
                )],
            )
            .await;
        }
    }
    out.push(st.iq_result(None));
    Ok(Done::Kept(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn j(s: &str) -> BareJid {
        BareJid::new(s).unwrap()
    }

    fn room() -> BTreeMap<BareJid, LAff> {
        BTreeMap::from([
            (j("o@x"), LAff::Owner),
            (j("a@x"), LAff::Member),
            (j("b@x"), LAff::Member),
        ])
    }

    fn cond(e: StanzaError) -> StanzaErrorCondition {
        e.condition
    }

    #[test]
    fn members_may_only_leave_and_only_the_owner_changes_others() {
        let cfg = MucLightConfig::default();
        let r = room();
        // Changing the occupant list, rule 2: everyone may leave.
        assert!(plan(&cfg, &r, &j("a@x"), &[(j("a@x"), None)]).is_ok());
        // Rule 11: members cannot remove others, add (unless allowed), or
        // make an owner.
        for items in [
            vec![(j("b@x"), None)],
            vec![(j("c@x"), Some(LAff::Member))],
            vec![(j("a@x"), Some(LAff::Owner))],
        ] {
            assert_eq!(
                cond(plan(&cfg, &r, &j("a@x"), &items).unwrap_err()),
                StanzaErrorCondition::NotAllowed
            );
        }
        let open = MucLightConfig {
            all_can_invite: true,
            ..MucLightConfig::default()
        };
        assert!(plan(&open, &r, &j("a@x"), &[(j("c@x"), Some(LAff::Member))]).is_ok());
        // Rule 10: meaningless changes are bad requests.
        assert_eq!(
            cond(plan(&cfg, &r, &j("o@x"), &[(j("a@x"), Some(LAff::Member))]).unwrap_err()),
            StanzaErrorCondition::BadRequest
        );
        assert_eq!(
            cond(plan(&cfg, &r, &j("o@x"), &[(j("z@x"), None)]).unwrap_err()),
            StanzaErrorCondition::BadRequest
        );
        // Rule 6: at most one owner per request.
        assert_eq!(
            cond(
                plan(
                    &cfg,
                    &r,
                    &j("o@x"),
                    &[(j("a@x"), Some(LAff::Owner)), (j("b@x"), Some(LAff::Owner))]
                )
                .unwrap_err()
            ),
            StanzaErrorCondition::BadRequest
        );
    }

    #[test]
    fn a_new_owner_demotes_the_old_one_and_a_leaving_owner_gets_an_heir() {
        let cfg = MucLightConfig::default();
        let r = room();
        // Rule 6: giving someone 'owner' makes the current one a member.
        let c = complete(&cfg, &r, vec![(j("a@x"), Some(LAff::Owner))]);
        assert!(c.contains(&(j("o@x"), Some(LAff::Member))));
        // Rule 7: leaving and naming the heir in one request.
        let c = complete(
            &cfg,
            &r,
            vec![(j("o@x"), None), (j("b@x"), Some(LAff::Owner))],
        );
        assert_eq!(c.len(), 2);
        // Rule 5: the server picks one (the first remaining member).
        let c = complete(&cfg, &r, vec![(j("o@x"), None)]);
        assert_eq!(c, vec![(j("o@x"), None), (j("a@x"), Some(LAff::Owner))]);
        // With equal occupants there is no owner to hand over.
        let eq = MucLightConfig {
            equal_occupants: true,
            ..MucLightConfig::default()
        };
        assert_eq!(complete(&eq, &r, vec![(j("o@x"), None)]).len(), 1);
    }

    #[test]
    fn user_items_are_checked() {
        let q = |xml: &str| xml.parse::<Element>().unwrap();
        let ok = q("<query xmlns='urn:xmpp:muclight:0#affiliations'><user affiliation='member'>a@x</user><user affiliation='none'>b@x</user></query>");
        assert_eq!(parse_users(&ok, NS_AFFILIATIONS).unwrap().len(), 2);
        for bad in [
            "<query xmlns='urn:xmpp:muclight:0#affiliations'><item role='participant'>a@x</item></query>",
            "<query xmlns='urn:xmpp:muclight:0#affiliations'><user affiliation='admin'>a@x</user></query>",
            "<query xmlns='urn:xmpp:muclight:0#affiliations'><user affiliation='member'>a@x/r</user></query>",
            "<query xmlns='urn:xmpp:muclight:0#affiliations'><user affiliation='member'>x</user></query>",
            "<query xmlns='urn:xmpp:muclight:0#affiliations'><user affiliation='member'>a@x</user><user affiliation='none'>a@x</user></query>",
        ] {
            assert_eq!(
                cond(parse_users(&q(bad), NS_AFFILIATIONS).unwrap_err()),
                StanzaErrorCondition::BadRequest,
                "{bad}"
            );
        }
    }
}
