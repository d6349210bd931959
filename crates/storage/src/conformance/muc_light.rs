//! MUC Light blocking lists.

use super::{creds, jid};
use starling_core::storage::Storage;
use starling_proto::BareJid;

/// MUC Light blocking lists: (kind, jid) pairs listed by kind then jid in
/// byte order; deny idempotent, allow of an absent pair no error, allow
/// winning over deny in one call, an unknown kind refused with nothing
/// changed; one user's rows never another's; `light_refusing` finds the
/// users who block the room or the adding user, in the caller's order,
/// each once, also past one statement's worth of users; removal with the
/// account (rows of others naming the user stay); SQL-looking JIDs are
/// data.
pub async fn muc_light_blocking(s: &Storage) {
    let m = s.muc.as_ref();
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
