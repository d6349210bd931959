//! Group-chat rooms (XEP-0045): rooms and affiliations.

use super::{creds, jid};
use starling_core::storage::Storage;

/// Group-chat rooms (XEP-0045): rooms stored, updated (config and subject
/// replaced, creation time kept), listed by name in pages per service and
/// deleted with their affiliations; affiliations by JID, replaced whole,
/// `none` deleting; a JID's rooms across services; removal with the
/// account. Configs, subjects, names and nicks that look like SQL are
/// data.
pub async fn muc(s: &Storage) {
    use starling_core::storage::{RoomAffiliation, StoredRoom};
    let m = s.muc.as_ref();
    let room = |j: &str, config: &str, subject: &str, created_at| StoredRoom {
        jid: jid(j),
        config: config.to_owned(),
        subject: subject.to_owned(),
        created_at,
    };
    let aff = |j: &str, a: &str, nick: Option<&str>, reason: Option<&str>| RoomAffiliation {
        jid: j.to_owned(),
        affiliation: a.to_owned(),
        nick: nick.map(str::to_owned),
        reason: reason.map(str::to_owned),
    };
    let service = "conference.example.org";
    let coffee = jid("coffee@conference.example.org");
    assert_eq!(m.room(&coffee).await.unwrap(), None);
    assert!(m.rooms(service, None, 10).await.unwrap().is_empty());
    assert!(m.affiliations(&coffee).await.unwrap().is_empty());
    assert!(!m.delete_room(&coffee).await.unwrap());

    // Stored verbatim, SQL-looking or not.
    let evil_config = "v1'); DROP TABLE muc_rooms; --\n{\"public\":true}";
    let created = room(
        "coffee@conference.example.org",
        evil_config,
        "",
        1_700_000_000_123,
    );
    m.put_room(&created).await.unwrap();
    assert_eq!(m.room(&coffee).await.unwrap().as_ref(), Some(&created));
    // An update replaces config and subject, keeps created_at.
    m.put_room(&room(
        "coffee@conference.example.org",
        "v1 {\"public\":false}",
        "Espresso's only",
        1_800_000_000_000,
    ))
    .await
    .unwrap();
    assert_eq!(
        m.room(&coffee).await.unwrap(),
        Some(room(
            "coffee@conference.example.org",
            "v1 {\"public\":false}",
            "Espresso's only",
            1_700_000_000_123,
        ))
    );

    // Listing: by name in byte order (a locale would put "ab" before
    // "a-room" and "élan" among the e's), per service, in pages.
    for name in [
        "tea",
        "zebra",
        "élan",
        "a-room",
        "ab",
        "robert);drop_table_muc_rooms;--",
    ] {
        m.put_room(&room(
            &format!("{name}@{service}"),
            name,
            "",
            1_700_000_000_000,
        ))
        .await
        .unwrap();
    }
    let other = jid("coffee@muc.other.example");
    m.put_room(&room("coffee@muc.other.example", "o", "", 5))
        .await
        .unwrap();
    let names = |rooms: Vec<StoredRoom>| -> Vec<String> {
        rooms
            .iter()
            .map(|r| {
                assert_eq!(r.jid.domain().as_str(), service);
                r.jid.node().unwrap().as_str().to_owned()
            })
            .collect()
    };
    let all = [
        "a-room",
        "ab",
        "coffee",
        "robert);drop_table_muc_rooms;--",
        "tea",
        "zebra",
        "élan",
    ];
    assert_eq!(names(m.rooms(service, None, 100).await.unwrap()), all);
    assert_eq!(
        names(m.rooms(service, None, 2).await.unwrap()),
        &all[..2],
        "limit"
    );
    assert_eq!(
        names(m.rooms(service, Some("ab"), 3).await.unwrap()),
        &all[2..5],
        "after is exclusive"
    );
    assert_eq!(
        names(m.rooms(service, Some("b"), 3).await.unwrap()),
        &all[2..5],
        "after need not be a stored name"
    );
    assert_eq!(
        names(m.rooms(service, Some("tea"), 3).await.unwrap()),
        &all[5..],
        "the last page is short"
    );
    assert!(m.rooms(service, Some("élan"), 2).await.unwrap().is_empty());
    assert!(m.rooms(service, None, 0).await.unwrap().is_empty());
    assert_eq!(
        m.rooms("muc.other.example", None, 10).await.unwrap(),
        [room("coffee@muc.other.example", "o", "", 5)]
    );
    assert!(m.rooms("example.org", None, 10).await.unwrap().is_empty());
    let evil_room = jid("robert);drop_table_muc_rooms;--@conference.example.org");
    assert_eq!(
        m.room(&evil_room).await.unwrap().unwrap().config,
        "robert);drop_table_muc_rooms;--"
    );
    assert_eq!(
        m.room(&coffee).await.unwrap().unwrap().created_at,
        1_700_000_000_123
    );

    // Affiliations: by JID; nick and reason round-trip as None or Some.
    let owner = aff(
        "alice@example.org",
        "owner",
        Some("Alice 'A' O'Neil"),
        Some("created it"),
    );
    let member = aff("bob@example.org", "member", None, None);
    let outcast = aff("spam.example", "outcast", None, Some("spam; DROP TABLE x"));
    m.set_affiliations(&coffee, &[owner.clone(), outcast.clone(), member.clone()])
        .await
        .unwrap();
    assert_eq!(
        m.affiliations(&coffee).await.unwrap(),
        [owner.clone(), member.clone(), outcast.clone()]
    );
    assert!(m.affiliations(&other).await.unwrap().is_empty());
    m.set_affiliations(&coffee, &[]).await.unwrap();
    assert_eq!(m.affiliations(&coffee).await.unwrap().len(), 3);
    // A change replaces the whole row (Some → None too); `none` deletes;
    // `none` for a JID without a row is no error; of two changes of one
    // JID the last wins; all in one call.
    let admin = aff("bob@example.org", "admin", Some("bobby"), None);
    let carol = aff(
        "carol@example.org",
        "member",
        Some("carol"),
        Some("invited"),
    );
    m.set_affiliations(
        &coffee,
        &[
            aff("alice@example.org", "owner", None, None),
            aff("spam.example", "none", None, None),
            aff("nobody@example.org", "none", None, None),
            aff("carol@example.org", "outcast", None, None),
            carol.clone(),
            member.clone(),
            admin.clone(),
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        m.affiliations(&coffee).await.unwrap(),
        [
            aff("alice@example.org", "owner", None, None),
            admin.clone(),
            carol.clone(),
        ]
    );
    // Affiliations with other rooms: rooms_of, by room (service, then
    // name).
    let tea = jid("tea@conference.example.org");
    m.set_affiliations(&other, &[aff("bob@example.org", "member", None, None)])
        .await
        .unwrap();
    m.set_affiliations(&tea, &[member.clone(), owner.clone()])
        .await
        .unwrap();
    assert_eq!(
        m.rooms_of(&jid("bob@example.org")).await.unwrap(),
        [
            (coffee.clone(), admin.clone()),
            (tea.clone(), member.clone()),
            (other.clone(), aff("bob@example.org", "member", None, None)),
        ]
    );
    assert_eq!(
        m.rooms_of(&jid("carol@example.org")).await.unwrap(),
        [(coffee.clone(), carol.clone())]
    );
    assert!(m
        .rooms_of(&jid("nobody@example.org"))
        .await
        .unwrap()
        .is_empty());
    // A domain's affiliation is found by the domain's JID.
    m.set_affiliations(&tea, std::slice::from_ref(&outcast))
        .await
        .unwrap();
    assert_eq!(
        m.rooms_of(&jid("spam.example")).await.unwrap(),
        [(tea.clone(), outcast.clone())]
    );

    // Deleting a room deletes its affiliations, nothing else.
    assert!(m.delete_room(&coffee).await.unwrap());
    assert!(!m.delete_room(&coffee).await.unwrap());
    assert_eq!(m.room(&coffee).await.unwrap(), None);
    assert!(m.affiliations(&coffee).await.unwrap().is_empty());
    assert_eq!(m.affiliations(&tea).await.unwrap().len(), 3);
    assert_eq!(m.rooms(service, None, 100).await.unwrap().len(), 6);
    assert!(m.room(&other).await.unwrap().is_some());
    assert_eq!(
        m.rooms_of(&jid("bob@example.org")).await.unwrap(),
        [
            (tea.clone(), member.clone()),
            (other.clone(), aff("bob@example.org", "member", None, None)),
        ]
    );
    // Affiliations of a room that is not stored are deleted with it too
    // (false: there was no room row).
    let ghost = jid("ghost@conference.example.org");
    m.set_affiliations(&ghost, std::slice::from_ref(&member))
        .await
        .unwrap();
    assert_eq!(m.affiliations(&ghost).await.unwrap(), [member]);
    assert!(!m.delete_room(&ghost).await.unwrap());
    assert!(m.affiliations(&ghost).await.unwrap().is_empty());
    // A re-created room starts with no affiliations and a new created_at.
    m.put_room(&room("coffee@conference.example.org", "new", "", 42))
        .await
        .unwrap();
    assert_eq!(m.room(&coffee).await.unwrap().unwrap().created_at, 42);
    assert!(m.affiliations(&coffee).await.unwrap().is_empty());

    // remove_user: the JID's rows everywhere, nobody else's.
    let bob = jid("bob@example.org");
    m.remove_user(&bob).await.unwrap();
    assert!(m.rooms_of(&bob).await.unwrap().is_empty());
    assert!(m.affiliations(&other).await.unwrap().is_empty());
    assert_eq!(
        m.affiliations(&tea).await.unwrap(),
        [owner.clone(), outcast.clone()]
    );
    m.remove_user(&bob).await.unwrap();
    // Account deletion removes them too; the rooms stay.
    let alice = jid("alice@example.org");
    s.accounts.create(&alice, &creds("pw")).await.unwrap();
    assert!(s.delete_account(&alice).await.unwrap());
    assert!(m.rooms_of(&alice).await.unwrap().is_empty());
    assert_eq!(m.affiliations(&tea).await.unwrap(), [outcast]);
    assert!(m.room(&tea).await.unwrap().is_some());
}
