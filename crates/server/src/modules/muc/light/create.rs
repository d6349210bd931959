//! Creating a MUC Light room ("Creating a new room"): its configuration,
//! its first members, what is stored and who is told.

use super::affiliations::{check_newcomers, parse_users};
use super::config::parse_config;
use super::messages::{archive_notification, notification};
use super::{
    bad, internal, new_version, not_allowed, row, user_el, Inner, LAff, LightRoom, NAME,
    NS_AFFILIATIONS, NS_CREATE,
};
use crate::modules::muc::host::{self};
use crate::modules::muc::room::now_millis;
use crate::modules::muc::store::RoomAffiliation;
use starling_core::Env;
use starling_proto::{BareJid, Stanza, StanzaError};
use starling_xml::Element;
use std::collections::BTreeMap;
use std::sync::Arc;

/// "Creating a new room".
pub(super) async fn create(
    host: &Arc<Inner>,
    env: &Env,
    jid: &BareJid,
    creator: &BareJid,
    st: &Stanza,
    q: &Element,
) -> Result<(LightRoom, Vec<Stanza>), StanzaError> {
    let cfg = &host.cfg;
    if !host::may_create(env, &cfg.create_rooms, &cfg.admins, creator) {
        return Err(not_allowed("you may not create rooms on this service"));
    }
    let mut config: BTreeMap<String, String> = cfg.config_schema.clone();
    let mut occupants = Vec::new();
    for c in q.children() {
        if c.is("configuration", NS_CREATE) {
            for (k, v) in parse_config(cfg, c, NS_CREATE)? {
                config.insert(k, v);
            }
        } else if c.is("occupants", NS_CREATE) {
            occupants = parse_users(c, NS_CREATE)?;
        } else {
            return Err(bad(
                "a create query holds <configuration/> and <occupants/>",
            ));
        }
    }
    let mut members: BTreeMap<BareJid, LAff> = BTreeMap::new();
    let mut owner_chosen = false;
    for (j, a) in &occupants {
        if j == creator {
            return Err(bad("the occupant list must not include the creator"));
        }
        match a {
            None => return Err(bad("'none' cannot be used when creating a room")),
            Some(LAff::Owner) if cfg.equal_occupants => {
                return Err(bad("rooms of this service have no owner"))
            }
            Some(LAff::Owner) if owner_chosen => return Err(bad("a room has at most one owner")),
            Some(LAff::Owner) => owner_chosen = true,
            Some(LAff::Member) => {}
        }
        members.insert(j.clone(), a.expect("checked above"));
    }
    let creator_aff = if cfg.equal_occupants || owner_chosen {
        LAff::Member
    } else {
        LAff::Owner
    };
    if members.len() + 1 > cfg.max_occupants as usize {
        return Err(not_allowed(&format!(
            "a room has at most {} members",
            cfg.max_occupants
        )));
    }
    let mut everyone: Vec<BareJid> = vec![creator.clone()];
    everyone.extend(members.keys().cloned());
    let refusing = check_newcomers(host, env, jid, creator, &everyone).await?;
    if refusing.contains(creator) {
        return Err(not_allowed("you block this room"));
    }
    for r in &refusing {
        members.remove(r);
    }
    members.insert(creator.clone(), creator_aff);
    let room = LightRoom {
        jid: jid.clone(),
        config,
        members,
        version: new_version(),
        created_at: now_millis(),
    };
    let rows: Vec<RoomAffiliation> = room.members.iter().map(|(j, a)| row(j, Some(*a))).collect();
    host.store
        .put_room(&room.to_stored())
        .await
        .map_err(|e| internal(e, "storing the room"))?;
    host.store
        .set_affiliations(jid, &rows)
        .await
        .map_err(|e| internal(e, "storing the room's members"))?;
    // A user can create and destroy groups in a loop: each at debug, at
    // info one line per 10 s with a count.
    tracing::debug!(module = NAME, room = %jid, creator = %creator, members = room.members.len(), "room created");
    starling_core::log_throttled!(info, module = NAME, room = %jid, creator = %creator, members = room.members.len(), "room created");
    // "Room creation is archived as an affiliation change that includes
    // ALL initial occupants."
    let mut x = Element::new("x", NS_AFFILIATIONS);
    x.append_child(
        Element::builder("version", NS_AFFILIATIONS)
            .text(room.version.as_str())
            .build(),
    );
    room.users_el(&mut x, NS_AFFILIATIONS);
    let (archived, sid) = archive_notification(host, &room, x).await;
    let iq_id = st.id().unwrap_or_default().to_owned();
    let mut out = Vec::new();
    for (j, a) in &room.members {
        // Each newcomer gets only their own affiliation, no prev-version.
        let mut x = Element::new("x", NS_AFFILIATIONS);
        x.append_child(
            Element::builder("version", NS_AFFILIATIONS)
                .text(room.version.as_str())
                .build(),
        );
        x.append_child(user_el(NS_AFFILIATIONS, j, Some(*a)));
        out.push(notification(&room.jid, j, &iq_id, vec![x, sid.clone()]));
    }
    if !env.hooks.archived.is_empty() {
        if let Some(id) = sid
            .attr("id")
            .and_then(starling_core::storage::ArchiveId::decode)
        {
            host::to_inboxes(
                env,
                &room.jid,
                &room.member_list(),
                vec![(
                    id,
                    creator.clone(),
                    starling_proto::mam::Kind::Instant,
                    archived,
                )],
            )
            .await;
        }
    }
    out.push(st.iq_result(None));
    Ok((room, out))
}
