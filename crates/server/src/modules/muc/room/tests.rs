//! Unit tests of the room: fan-out in a big room, the history on entering.

use super::*;
use crate::modules::muc::NS_MUC;

fn presence_to(room: &str, nick: &str, from: &str) -> Stanza {
    let el: Element = format!(
        "<presence xmlns='jabber:client' from='{from}' to='{room}/{nick}'><x xmlns='{NS_MUC}'><history maxstanzas='0'/></x></presence>"
    )
    .parse()
    .unwrap();
    Stanza::from_element(el).unwrap()
}

fn groupchat(room: &str, from: &str, body: &str) -> Stanza {
    let el: Element = format!(
        "<message xmlns='jabber:client' from='{from}' to='{room}' type='groupchat'><body>{body}</body></message>"
    )
    .parse()
    .unwrap();
    Stanza::from_element(el).unwrap()
}

/// A room of `n` occupants (user0 the owner), unlocked, with the
/// service limits raised as an operator would for big rooms.
fn big_room(n: usize, svc: &MucConfig, ids: &ArchiveIds) -> Room {
    let jid = BareJid::new("big@conference.example.org").unwrap();
    let mut config = RoomConfig::new_room(svc, "salt".into());
    config.max_users = n as u32;
    let mut room = Room::new(jid, config, String::new(), 0);
    let cx = Ctx { svc, ids };
    let mut out = Out::default();
    room.make_owner(&BareJid::new("user0@example.org").unwrap(), &mut out);
    for i in 0..n {
        let mut out = Out::default();
        room.handle(
            &cx,
            presence_to(
                "big@conference.example.org",
                &format!("u{i}"),
                &format!("user{i}@example.org/r"),
            ),
            &mut out,
        );
        // §7.2.3: the i occupants already there, then the newcomer's
        // presence to each of them and to itself, then the subject.
        let presences = out
            .stanzas
            .iter()
            .filter(|s| s.kind() == StanzaKind::Presence)
            .count();
        assert_eq!(presences, i + (i + 1), "join {i}");
        let last_presence = out
            .stanzas
            .iter()
            .rfind(|s| s.kind() == StanzaKind::Presence)
            .unwrap();
        assert_eq!(
            last_presence.to().unwrap().as_str(),
            format!("user{i}@example.org/r")
        );
    }
    room
}

#[test]
fn a_thousand_occupant_room_fans_out_once_per_occupant() {
    let svc = MucConfig::default();
    let ids = ArchiveIds::new(1, None);
    let mut room = big_room(1000, &svc, &ids);
    assert_eq!(room.occupant_count(), 1000);
    let cx = Ctx {
        svc: &svc,
        ids: &ids,
    };
    let mut out = Out::default();
    room.handle(
        &cx,
        groupchat(
            "big@conference.example.org",
            "user7@example.org/r",
            "hello all",
        ),
        &mut out,
    );
    assert_eq!(
        out.stanzas.len(),
        1000,
        "one copy per occupant, the sender included"
    );
    assert_eq!(out.archive.len(), 1, "archived once for the room");
    let mut to: Vec<&str> = out
        .stanzas
        .iter()
        .map(|s| s.to().unwrap().as_str())
        .collect();
    to.sort();
    to.dedup();
    assert_eq!(to.len(), 1000);
    assert!(out
        .stanzas
        .iter()
        .all(|s| s.from().unwrap().as_str() == "big@conference.example.org/u7"));
    // The room is full: one more (not an admin) is refused (§7.2.9).
    let mut out = Out::default();
    room.handle(
        &cx,
        presence_to("big@conference.example.org", "late", "late@example.org/r"),
        &mut out,
    );
    assert_eq!(out.stanzas.len(), 1);
    assert!(out.stanzas[0].is_error());
    assert!(out.stanzas[0]
        .element()
        .to_string()
        .contains("service-unavailable"));
    // The owner still enters past the limit (§7.2.9).
    let mut out = Out::default();
    room.handle(
        &cx,
        presence_to(
            "big@conference.example.org",
            "boss",
            "user0@example.org/other",
        ),
        &mut out,
    );
    assert!(!out.stanzas.iter().any(|s| s.is_error()));
}

#[test]
fn history_filters_by_count_and_characters() {
    let svc = MucConfig::default();
    let ids = ArchiveIds::new(1, None);
    let mut room = big_room(1, &svc, &ids);
    let cx = Ctx {
        svc: &svc,
        ids: &ids,
    };
    for i in 0..30 {
        let mut out = Out::default();
        room.handle(
            &cx,
            groupchat(
                "big@conference.example.org",
                "user0@example.org/r",
                &format!("m{i}"),
            ),
            &mut out,
        );
    }
    assert_eq!(room.history.len(), 30);
    let x: Element = format!("<x xmlns='{NS_MUC}'><history maxstanzas='5'/></x>")
        .parse()
        .unwrap();
    let to = FullJid::new("a@example.org/r").unwrap();
    let mut out = Out::default();
    room.send_history(Some(&x), &to, &mut out);
    let bodies: Vec<String> = out
        .stanzas
        .iter()
        .map(|s| s.element().get_child("body", ns::CLIENT).unwrap().text())
        .collect();
    assert_eq!(bodies, ["m25", "m26", "m27", "m28", "m29"]);
    // Without a request: the room's muc#maxhistoryfetch (20).
    let mut out = Out::default();
    room.send_history(None, &to, &mut out);
    assert_eq!(out.stanzas.len(), 20);
    // maxchars: only what fits.
    let one = room.history.back().unwrap().chars;
    let x: Element = format!(
        "<x xmlns='{NS_MUC}'><history maxchars='{}'/></x>",
        one * 2 + 1
    )
    .parse()
    .unwrap();
    let mut out = Out::default();
    room.send_history(Some(&x), &to, &mut out);
    assert_eq!(out.stanzas.len(), 2);
}
