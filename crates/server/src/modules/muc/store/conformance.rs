//! The conformance suite of the group-chat store, which both engines
//! pass: run by the scenario tests' `muc_store` module on each backend
//! the tests run on (SQLite, and PostgreSQL in `scripts/test-all.sh`).
//!
//! Each function takes a fresh, empty [`Storage`] opened with every
//! module's schema and owned data (`modules::open_storage`) and panics on
//! the first deviation.

use super::{MucData, RoomAffiliation, StoredRoom};
use starling_core::storage::{ArchiveId, ArchiveRecord, OwnedData, Storage, StoreSuite, FLAG_BODY};
use starling_proto::sasl::{ScramCredentials, ScramHash};
use starling_proto::BareJid;

fn jid(s: &str) -> BareJid {
    BareJid::new(s).expect("valid test jid")
}

fn creds(password: &str) -> Vec<ScramCredentials> {
    [ScramHash::Sha1, ScramHash::Sha256, ScramHash::Sha512]
        .into_iter()
        .map(|h| ScramCredentials::generate(h, password, 64).expect("derive"))
        .collect()
}

/// The suite, for `Module::STORE_SUITES`.
pub const SUITES: &[StoreSuite] = &[
    ("rooms and affiliations", |s| Box::pin(muc(s))),
    ("MUC Light blocking lists", |s| {
        Box::pin(muc_light_blocking(s))
    }),
    ("domain removal", |s| Box::pin(muc_domain_removal(s))),
];

/// Group-chat rooms (XEP-0045): rooms stored, updated (config and subject
/// replaced, creation time kept), listed by name in pages per service and
/// deleted with their affiliations; affiliations by JID, replaced whole,
/// `none` deleting; a JID's rooms across services; removal with the
/// account. Configs, subjects, names and nicks that look like SQL are
/// data.
pub async fn muc(s: &Storage) {
    let m = super::open(s);
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

/// MUC Light blocking lists: (kind, jid) pairs listed by kind then jid in
/// byte order; deny idempotent, allow of an absent pair no error, allow
/// winning over deny in one call, an unknown kind refused with nothing
/// changed; one user's rows never another's; `light_refusing` finds the
/// users who block the room or the adding user, in the caller's order,
/// each once, also past one statement's worth of users; removal with the
/// account (rows of others naming the user stay); SQL-looking JIDs are
/// data.
pub async fn muc_light_blocking(s: &Storage) {
    let m = super::open(s);
    let row = |kind: &str, j: &str| (kind.to_owned(), jid(j));
    let rows = |list: &[(&str, &str)]| -> Vec<(String, BareJid)> {
        list.iter().map(|(k, j)| row(k, j)).collect()
    };
    let alice = jid("alice@example.org");
    let bob = jid("bob@example.org");
    let coffee = jid("coffee@muclight.example.org");
    let tea = jid("tea@muclight.example.org");
    let eve = jid("eve@example.org");
    assert!(m.light_blocking(&alice).await.unwrap().is_empty());
    assert!(m
        .light_refusing(std::slice::from_ref(&alice), &coffee, &eve)
        .await
        .unwrap()
        .is_empty());
    assert!(m
        .light_refusing(&[], &coffee, &eve)
        .await
        .unwrap()
        .is_empty());
    m.set_light_blocking(&alice, &[], &[]).await.unwrap();
    // Allowing what is not denied is no error.
    m.set_light_blocking(
        &alice,
        &[],
        &rows(&[("room", "coffee@muclight.example.org")]),
    )
    .await
    .unwrap();
    assert!(m.light_blocking(&alice).await.unwrap().is_empty());

    // Deny: listed by kind, then JID in byte order ("élan" after "zebra");
    // one JID may be blocked as a room and as a user.
    let evil = "robert);drop_table_muclight_blocking;--@muclight.example.org";
    let listed = rows(&[
        ("room", "coffee@muclight.example.org"),
        ("room", evil),
        ("room", "zebra@muclight.example.org"),
        ("room", "élan@muclight.example.org"),
        ("user", "eve@example.org"),
        ("user", "mallory@example.org"),
        ("user", "zebra@muclight.example.org"),
    ]);
    m.set_light_blocking(
        &alice,
        &rows(&[
            ("user", "zebra@muclight.example.org"),
            ("room", "élan@muclight.example.org"),
            ("user", "mallory@example.org"),
            ("room", "zebra@muclight.example.org"),
            ("room", evil),
            ("user", "eve@example.org"),
            ("room", "coffee@muclight.example.org"),
            ("room", "coffee@muclight.example.org"),
        ]),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(m.light_blocking(&alice).await.unwrap(), listed);
    assert_eq!(
        m.light_blocking(&alice).await.unwrap()[1].1.as_str(),
        evil,
        "stored verbatim"
    );
    // Denying again changes nothing and is no error.
    m.set_light_blocking(
        &alice,
        &rows(&[("user", "eve@example.org"), ("room", evil)]),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(m.light_blocking(&alice).await.unwrap(), listed);
    // Nothing shows for another user.
    assert!(m.light_blocking(&bob).await.unwrap().is_empty());

    // Allow removes; deny and allow in one call; allow wins over deny of
    // the same pair; absent pairs are no error.
    m.set_light_blocking(
        &alice,
        &rows(&[
            ("room", "tea@muclight.example.org"),
            ("user", "trudy@example.org"),
        ]),
        &rows(&[
            ("user", "zebra@muclight.example.org"),
            ("room", "élan@muclight.example.org"),
            ("user", "trudy@example.org"),
            ("user", "nobody@example.org"),
            ("room", "eve@example.org"),
        ]),
    )
    .await
    .unwrap();
    let listed = rows(&[
        ("room", "coffee@muclight.example.org"),
        ("room", evil),
        ("room", "tea@muclight.example.org"),
        ("room", "zebra@muclight.example.org"),
        ("user", "eve@example.org"),
        ("user", "mallory@example.org"),
    ]);
    assert_eq!(m.light_blocking(&alice).await.unwrap(), listed);
    // An unknown kind is refused, and nothing of the call is applied.
    for (deny, allow) in [
        (
            rows(&[("room", "new@muclight.example.org")]),
            vec![row("ROOM", "x@example.org")],
        ),
        (
            vec![
                row("room", "new@muclight.example.org"),
                row("domain", "example.org"),
            ],
            vec![],
        ),
        (
            vec![row("room", "new@muclight.example.org")],
            vec![
                row("room", "coffee@muclight.example.org"),
                row("", "eve@example.org"),
            ],
        ),
    ] {
        assert!(m.set_light_blocking(&alice, &deny, &allow).await.is_err());
        assert_eq!(m.light_blocking(&alice).await.unwrap(), listed);
    }

    // Bob's list is his own; alice's does not change.
    m.set_light_blocking(
        &bob,
        &rows(&[
            ("user", "alice@example.org"),
            ("room", "coffee@muclight.example.org"),
        ]),
        &[],
    )
    .await
    .unwrap();
    m.set_light_blocking(&bob, &[], &rows(&[("room", evil)]))
        .await
        .unwrap();
    assert_eq!(
        m.light_blocking(&bob).await.unwrap(),
        rows(&[
            ("room", "coffee@muclight.example.org"),
            ("user", "alice@example.org"),
        ])
    );
    assert_eq!(m.light_blocking(&alice).await.unwrap(), listed);

    // light_refusing: who blocks the room, or the user adding them; not
    // who blocks other rooms or users, nor the same JIDs with the other
    // kind; only among `users`.
    let carol = jid("carol@example.org");
    let dave = jid("dave@example.org");
    let frank = jid("frank@example.org");
    let erin = jid("erin@example.org");
    let trent = jid("trent@example.org");
    m.set_light_blocking(&carol, &rows(&[("user", "eve@example.org")]), &[])
        .await
        .unwrap();
    m.set_light_blocking(
        &dave,
        &rows(&[
            ("room", "tea@muclight.example.org"),
            ("user", "mallory@example.org"),
        ]),
        &[],
    )
    .await
    .unwrap();
    m.set_light_blocking(
        &frank,
        &rows(&[
            ("user", "coffee@muclight.example.org"),
            ("room", "eve@example.org"),
        ]),
        &[],
    )
    .await
    .unwrap();
    m.set_light_blocking(
        &erin,
        &rows(&[("room", "coffee@muclight.example.org")]),
        &[],
    )
    .await
    .unwrap();
    let users = [
        trent.clone(),
        carol.clone(),
        alice.clone(),
        dave.clone(),
        frank.clone(),
        bob.clone(),
        carol.clone(),
    ];
    // alice blocks both, bob the room, carol eve.
    assert_eq!(
        m.light_refusing(&users, &coffee, &eve).await.unwrap(),
        [carol.clone(), alice.clone(), bob.clone()]
    );
    // By someone nobody blocks: those who block the room.
    assert_eq!(
        m.light_refusing(&users, &coffee, &trent).await.unwrap(),
        [alice.clone(), bob.clone()]
    );
    // Another room: alice (tea) and dave (tea).
    assert_eq!(
        m.light_refusing(&users, &tea, &trent).await.unwrap(),
        [alice.clone(), dave.clone()]
    );
    // dave blocks mallory; alice blocks mallory too.
    assert_eq!(
        m.light_refusing(
            &users,
            &jid("other@muclight.example.org"),
            &jid("mallory@example.org")
        )
        .await
        .unwrap(),
        [alice.clone(), dave.clone()]
    );
    assert!(m
        .light_refusing(&[trent.clone(), frank.clone()], &coffee, &eve)
        .await
        .unwrap()
        .is_empty());
    // The SQL-looking room is an ordinary room.
    assert_eq!(
        m.light_refusing(&users, &jid(evil), &trent).await.unwrap(),
        std::slice::from_ref(&alice)
    );
    // More users than one statement takes: found in every part.
    let many: Vec<BareJid> = (0..1234)
        .map(|i| jid(&format!("u{i:04}@example.org")))
        .collect();
    let blockers = [3usize, 499, 500, 501, 999, 1000, 1233];
    for i in blockers {
        m.set_light_blocking(&many[i], &rows(&[("user", "eve@example.org")]), &[])
            .await
            .unwrap();
    }
    let mut expected: Vec<BareJid> = blockers.iter().map(|&i| many[i].clone()).collect();
    assert_eq!(
        m.light_refusing(&many, &coffee, &eve).await.unwrap(),
        expected
    );
    let reversed: Vec<BareJid> = many.iter().rev().cloned().collect();
    expected.reverse();
    assert_eq!(
        m.light_refusing(&reversed, &coffee, &eve).await.unwrap(),
        expected
    );

    // remove_user: the user's own rows, not others' rows naming the user.
    m.remove_user(&alice).await.unwrap();
    assert!(m.light_blocking(&alice).await.unwrap().is_empty());
    assert_eq!(m.light_blocking(&bob).await.unwrap().len(), 2);
    assert_eq!(
        m.light_refusing(&users, &coffee, &alice).await.unwrap(),
        std::slice::from_ref(&bob)
    );
    m.remove_user(&alice).await.unwrap();
    // Account deletion removes them too.
    s.accounts.create(&bob, &creds("pw")).await.unwrap();
    assert!(s.delete_account(&bob).await.unwrap());
    assert!(m.light_blocking(&bob).await.unwrap().is_empty());
    assert_eq!(
        m.light_refusing(&users, &coffee, &eve).await.unwrap(),
        std::slice::from_ref(&carol)
    );
    assert_eq!(m.light_blocking(&erin).await.unwrap().len(), 1);
}

/// Removing a service domain (`OwnedData::remove_service`) deletes its
/// rooms, their affiliations and their archives, and nothing of another
/// service.
pub async fn muc_domain_removal(s: &Storage) {
    let m = super::open(s);
    let room = |j: &str| StoredRoom {
        jid: jid(j),
        config: "{}".to_owned(),
        subject: String::new(),
        created_at: 1,
    };
    let member = RoomAffiliation {
        jid: "alice@example.org".to_owned(),
        affiliation: "member".to_owned(),
        nick: None,
        reason: None,
    };
    // More rooms than one page of the removal.
    let gone: Vec<StoredRoom> = (0..503)
        .map(|i| room(&format!("r{i:03}@conference.example.org")))
        .collect();
    for r in &gone {
        m.put_room(r).await.unwrap();
    }
    let kept = room("r000@conference.example.net");
    m.put_room(&kept).await.unwrap();
    // Archive ids are unique across owners.
    for (n, r) in [&gone[0].jid, &kept.jid].into_iter().enumerate() {
        m.set_affiliations(r, std::slice::from_ref(&member))
            .await
            .unwrap();
        s.archive
            .append(&[ArchiveRecord {
                owner: r.clone(),
                id: ArchiveId::from_parts(1_700_000_000_000_000 + n as i64, 1),
                with_bare: "alice@example.org".to_owned(),
                remote: format!("{r}/alice"),
                outgoing: false,
                origin_id: None,
                flags: FLAG_BODY,
                stanza: "<message><body>hi</body></message>".to_owned(),
            }])
            .await
            .unwrap();
    }
    let data = MucData::new(s);
    data.remove_service("conference.example.org").await.unwrap();
    assert!(m
        .rooms("conference.example.org", None, 10)
        .await
        .unwrap()
        .is_empty());
    assert!(m.affiliations(&gone[0].jid).await.unwrap().is_empty());
    let q = starling_core::storage::ArchiveQuery {
        limit: 10,
        ..Default::default()
    };
    assert!(s
        .archive
        .query(&gone[0].jid, &q)
        .await
        .unwrap()
        .messages
        .is_empty());
    assert_eq!(
        m.rooms("conference.example.net", None, 10).await.unwrap(),
        std::slice::from_ref(&kept)
    );
    assert_eq!(m.affiliations(&kept.jid).await.unwrap(), [member]);
    assert_eq!(
        s.archive.query(&kept.jid, &q).await.unwrap().messages.len(),
        1
    );
}
