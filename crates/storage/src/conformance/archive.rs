//! The message archive (XEP-0313), and its buckets.

use super::{creds, ids, jid, rec};
use starling_core::storage::{
    ArchiveId, ArchivePrefs, ArchiveQuery, ArchiveRecord, PrefsDefault, Storage, WithFilter,
    FLAG_BODY,
};

/// Message archive (XEP-0313): batched appends (idempotent), paging in
/// both directions with completeness, `with` (bare and full), id bounds,
/// id lists, counts, bounds, retraction lookup and tombstones, unread
/// counting, retention and per-user purge, preferences, isolation and
/// account deletion.
pub async fn archive(s: &Storage) {
    let a = s.archive.as_ref();
    let alice = jid("alice@example.org");
    let alice2 = jid("alice@example.net");
    assert!(a.bounds(&alice).await.unwrap().is_none());
    assert_eq!(a.max_id().await.unwrap(), None);
    let page = a
        .query(
            &alice,
            &ArchiveQuery {
                limit: 10,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(page.messages.is_empty() && page.complete);

    // 1..=10 with bob (odd outgoing), 11..=15 with carol/phone, one
    // message of another owner.
    let mut recs = Vec::new();
    for t in 1..=10 {
        recs.push(rec(
            &alice,
            t,
            "bob@example.org/desk",
            t % 2 == 1,
            Some(&format!("o{t}")),
        ));
    }
    for t in 11..=15 {
        let r = if t % 2 == 0 {
            "carol@example.org/phone"
        } else {
            "carol@example.org/pc"
        };
        recs.push(rec(&alice, t, r, false, None));
    }
    // Ids are unique across the deployment: another node's id at t=5.
    let mut foreign = rec(&alice2, 5, "bob@example.org", false, Some("o5"));
    foreign.id = ArchiveId::from_parts(5, 2);
    recs.push(foreign);
    a.append(&recs).await.unwrap();
    // A retried batch does not duplicate.
    a.append(&recs[..3]).await.unwrap();
    let all = ArchiveQuery {
        limit: 100,
        ..Default::default()
    };
    assert_eq!(a.count(&alice, &all).await.unwrap(), 15);
    assert_eq!(
        a.max_id().await.unwrap(),
        recs.iter().map(|r| r.id).max(),
        "greatest id over all archives"
    );
    let (first, last) = a.bounds(&alice).await.unwrap().unwrap();
    assert_eq!((first.micros(), last.micros()), (1, 15));

    // Forward paging from the start.
    let p1 = a
        .query(
            &alice,
            &ArchiveQuery {
                limit: 4,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(ids(&p1), vec![1, 2, 3, 4]);
    assert!(!p1.complete);
    assert!(
        p1.messages[0].stanza.contains("DROP TABLE"),
        "stored verbatim"
    );
    assert_eq!(p1.messages[0].with_bare, "bob@example.org");
    assert!(p1.messages[0].outgoing && !p1.messages[1].outgoing);
    let p2 = a
        .query(
            &alice,
            &ArchiveQuery {
                limit: 20,
                after: Some(p1.messages[3].id),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(ids(&p2), (5..=15).collect::<Vec<_>>());
    assert!(p2.complete);
    // Backward paging from the end (RSM <before/>).
    let last_page = ArchiveQuery {
        limit: 3,
        from_end: true,
        ..Default::default()
    };
    let b1 = a.query(&alice, &last_page).await.unwrap();
    assert_eq!(ids(&b1), vec![13, 14, 15], "chronological within the page");
    assert!(!b1.complete);
    let b2 = a
        .query(
            &alice,
            &ArchiveQuery {
                before: Some(b1.messages[0].id),
                limit: 20,
                from_end: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(ids(&b2), (1..=12).collect::<Vec<_>>());
    assert!(b2.complete);
    // with: bare matches every resource, full only that one.
    let with_bob = ArchiveQuery {
        with: Some(WithFilter::Bare("bob@example.org".into())),
        limit: 100,
        ..Default::default()
    };
    assert_eq!(
        ids(&a.query(&alice, &with_bob).await.unwrap()),
        (1..=10).collect::<Vec<_>>()
    );
    let with_phone = ArchiveQuery {
        with: Some(WithFilter::Full {
            bare: "carol@example.org".into(),
            full: "carol@example.org/phone".into(),
        }),
        limit: 100,
        ..Default::default()
    };
    assert_eq!(
        ids(&a.query(&alice, &with_phone).await.unwrap()),
        vec![12, 14]
    );
    assert_eq!(a.count(&alice, &with_phone).await.unwrap(), 2);
    // Time range as id bounds (inclusive start/end).
    let range = ArchiveQuery {
        after: Some(ArchiveId(ArchiveId::lower_bound(3).0 - 1)),
        before: Some(ArchiveId(ArchiveId::upper_bound(6).0 + 1)),
        limit: 100,
        ..Default::default()
    };
    assert_eq!(
        ids(&a.query(&alice, &range).await.unwrap()),
        vec![3, 4, 5, 6]
    );
    // Explicit ids, including one of another owner (not returned).
    let other = recs.last().unwrap().id;
    let pick = ArchiveQuery {
        ids: vec![recs[1].id, recs[7].id, other],
        limit: 100,
        ..Default::default()
    };
    assert_eq!(ids(&a.query(&alice, &pick).await.unwrap()), vec![2, 8]);
    let found = a.existing(&alice, &[recs[1].id, other]).await.unwrap();
    assert_eq!(found, vec![recs[1].id]);
    // Retraction lookup: by origin id, direction and partner only.
    let m3 = a
        .find_by_origin(&alice, "bob@example.org", "o3", true)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m3.id, recs[2].id);
    assert!(a
        .find_by_origin(&alice, "bob@example.org", "o3", false)
        .await
        .unwrap()
        .is_none());
    assert!(a
        .find_by_origin(&alice, "carol@example.org", "o3", true)
        .await
        .unwrap()
        .is_none());
    assert!(a
        .replace(&alice, m3.id, "<message><retracted/></message>")
        .await
        .unwrap());
    assert!(
        !a.replace(&alice2, m3.id, "<x/>").await.unwrap(),
        "other owner's id"
    );
    let t = a
        .query(
            &alice,
            &ArchiveQuery {
                ids: vec![m3.id],
                limit: 1,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(t.messages[0].stanza, "<message><retracted/></message>");
    assert_eq!(
        t.messages[0].flags & FLAG_BODY,
        0,
        "a tombstone is no instant message"
    );
    // Unread counting: received body messages from bob after id 2 are 4, 6, 8, 10.
    assert_eq!(
        a.count_unread_after(&alice, "bob@example.org", recs[1].id)
            .await
            .unwrap(),
        4
    );
    // Preferences.
    assert_eq!(a.prefs(&alice).await.unwrap(), None);
    let prefs = ArchivePrefs {
        default: PrefsDefault::Roster,
        always: vec!["x@example.org".into(), "y@example.org".into()],
        never: vec!["'; DROP TABLE archive_prefs; --@e.org".into()],
    };
    a.set_prefs(&alice, &prefs).await.unwrap();
    assert_eq!(a.prefs(&alice).await.unwrap(), Some(prefs.clone()));
    let never = ArchivePrefs {
        default: PrefsDefault::Never,
        always: vec![],
        never: vec![],
    };
    a.set_prefs(&alice, &never).await.unwrap();
    assert_eq!(a.prefs(&alice).await.unwrap(), Some(never));
    // Retention by domain: example.org messages before 5 go, example.net's stay.
    assert_eq!(
        a.purge_domain_before("example.org", ArchiveId::lower_bound(5))
            .await
            .unwrap(),
        4
    );
    assert_eq!(a.bounds(&alice).await.unwrap().unwrap().0.micros(), 5);
    assert_eq!(a.count(&alice2, &all).await.unwrap(), 1);
    // Per-user purge: before a point, then everything.
    assert_eq!(
        a.purge_user(&alice, Some(ArchiveId::lower_bound(10)))
            .await
            .unwrap(),
        5
    );
    assert_eq!(a.purge_user(&alice, None).await.unwrap(), 6);
    assert_eq!(a.count(&alice, &all).await.unwrap(), 0);
    // Account deletion removes archive and prefs.
    s.accounts.create(&alice2, &creds("pw")).await.unwrap();
    a.set_prefs(&alice2, &prefs).await.unwrap();
    assert!(s.delete_account(&alice2).await.unwrap());
    assert_eq!(a.count(&alice2, &all).await.unwrap(), 0);
    assert_eq!(a.prefs(&alice2).await.unwrap(), None);
}

/// Archive buckets ([`crate::buckets`]), on a storage opened with
/// [`crate::OpenOptions`] of a few rows per bucket, a 1 µs margin and no
/// clock (`bucket_test_options`): appends in small batches spread one
/// conversation over several buckets, a late row (an older id appended
/// last) files under its id's bucket, and every query that names a
/// conversation — pages both ways, counts, origin-id lookups, unread
/// counts — sees every bucket.
pub async fn archive_buckets(s: &Storage) {
    let a = s.archive.as_ref();
    let alice = jid("alice@example.org");
    let bob_ts = [1i64, 2, 5, 9, 14, 20];
    for chunk in (1..=20).collect::<Vec<i64>>().chunks(2) {
        let recs: Vec<ArchiveRecord> = chunk
            .iter()
            .map(|&t| {
                let with = if bob_ts.contains(&t) {
                    "bob@example.org/desk"
                } else {
                    "carol@example.org/pc"
                };
                rec(&alice, t, with, false, Some(&format!("o{t}")))
            })
            .collect();
        a.append(&recs).await.unwrap();
    }
    // Late: bob's t=3 (from another node: carol's t=3 has node 1) arrives
    // after t=20, as an offline copy written late would.
    let mut late = rec(&alice, 3, "bob@example.org/desk", false, Some("o3"));
    late.id = ArchiveId::from_parts(3, 2);
    a.append(&[late]).await.unwrap();
    let expected = vec![1, 2, 3, 5, 9, 14, 20];
    let bob = Some(WithFilter::Bare("bob@example.org".into()));

    // Forward, two at a time.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let p = a
            .query(
                &alice,
                &ArchiveQuery {
                    with: bob.clone(),
                    after,
                    limit: 2,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        seen.extend(ids(&p));
        after = p.messages.last().map(|m| m.id);
        if p.complete {
            break;
        }
        assert!(seen.len() < 20, "paging forward never completes: {seen:?}");
    }
    assert_eq!(seen, expected, "forward through every bucket");

    // Backward from the end, two at a time (RSM <before/>).
    let mut seen = Vec::new();
    let mut before = None;
    loop {
        let p = a
            .query(
                &alice,
                &ArchiveQuery {
                    with: bob.clone(),
                    before,
                    limit: 2,
                    from_end: true,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let mut page = ids(&p);
        page.extend(seen);
        seen = page;
        before = p.messages.first().map(|m| m.id);
        if p.complete {
            break;
        }
        assert!(seen.len() < 20, "paging backward never completes: {seen:?}");
    }
    assert_eq!(seen, expected, "backward through every bucket");

    // One page larger than every bucket together.
    let all = a
        .query(
            &alice,
            &ArchiveQuery {
                with: bob.clone(),
                limit: 100,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(ids(&all), expected);
    assert!(all.complete);
    // A window in the middle.
    let mid = a
        .query(
            &alice,
            &ArchiveQuery {
                with: bob.clone(),
                after: Some(ArchiveId::from_parts(2, 1)),
                before: Some(ArchiveId::from_parts(20, 1)),
                limit: 100,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(ids(&mid), vec![3, 5, 9, 14]);

    // Counts.
    let count = |after: Option<i64>| ArchiveQuery {
        with: bob.clone(),
        after: after.map(|t| ArchiveId::from_parts(t, 1)),
        limit: 100,
        ..Default::default()
    };
    assert_eq!(a.count(&alice, &count(None)).await.unwrap(), 7);
    assert_eq!(a.count(&alice, &count(Some(5))).await.unwrap(), 3);
    assert_eq!(
        a.count(&alice, &ArchiveQuery::default()).await.unwrap(),
        21,
        "without a filter: every row"
    );
    // Origin ids in the oldest and the newest bucket, and the late row.
    for t in [1, 3, 20] {
        let m = a
            .find_by_origin(&alice, "bob@example.org", &format!("o{t}"), false)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("o{t} not found"));
        assert_eq!(m.id.micros(), t);
    }
    assert!(a
        .find_by_origin(&alice, "bob@example.org", "o4", false)
        .await
        .unwrap()
        .is_none());
    // Unread after t=2: 3, 5, 9, 14, 20.
    assert_eq!(
        a.count_unread_after(&alice, "bob@example.org", ArchiveId::from_parts(2, 1))
            .await
            .unwrap(),
        5
    );
    // The whole archive (no `with`: the by-owner index, bucket first),
    // both directions, three at a time.
    let everything: Vec<i64> = {
        let mut v: Vec<i64> = (1..=20).collect();
        v.insert(2, 3); // the late row (node 2) after carol's t=3 (node 1)
        v
    };
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let p = a
            .query(
                &alice,
                &ArchiveQuery {
                    after,
                    limit: 3,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        seen.extend(ids(&p));
        after = p.messages.last().map(|m| m.id);
        if p.complete {
            break;
        }
        assert!(seen.len() < 40, "paging forward never completes: {seen:?}");
    }
    assert_eq!(seen, everything, "the whole archive forward");
    let mut seen = Vec::new();
    let mut before = None;
    loop {
        let p = a
            .query(
                &alice,
                &ArchiveQuery {
                    before,
                    limit: 3,
                    from_end: true,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let mut page = ids(&p);
        page.extend(seen);
        seen = page;
        before = p.messages.first().map(|m| m.id);
        if p.complete {
            break;
        }
        assert!(seen.len() < 40, "paging backward never completes: {seen:?}");
    }
    assert_eq!(seen, everything, "the whole archive backward");
    assert_eq!(
        a.count(
            &alice,
            &ArchiveQuery {
                after: Some(ArchiveId::from_parts(17, 1)),
                ..Default::default()
            }
        )
        .await
        .unwrap(),
        3
    );
    let (first, last) = a.bounds(&alice).await.unwrap().unwrap();
    assert_eq!((first.micros(), last.micros()), (1, 20));
    assert_eq!(a.bounds(&jid("nobody@example.org")).await.unwrap(), None);
    // Purging before t=10 leaves t=10..20 in every bucket they are in.
    let purged = a
        .purge_user(&alice, Some(ArchiveId::from_parts(10, 0)))
        .await
        .unwrap();
    assert_eq!(purged, 10, "t=1..9 and the late t=3");
    let (first, _) = a.bounds(&alice).await.unwrap().unwrap();
    assert_eq!(first.micros(), 10);
    // Removing the account leaves nothing in any bucket.
    a.remove_user(&alice).await.unwrap();
    assert_eq!(a.count(&alice, &count(None)).await.unwrap(), 0);
    assert_eq!(
        a.count(&alice, &ArchiveQuery::default()).await.unwrap(),
        0,
        "nothing of the owner's"
    );
}

/// The [`crate::OpenOptions`] under which [`archive_buckets`] sees several
/// buckets: three rows each, a new one right after the newest id.
pub fn bucket_test_options() -> crate::OpenOptions {
    crate::OpenOptions {
        archive_bucket_rows: 3,
        archive_bucket_margin_micros: 1,
        archive_bucket_follow_clock: false,
        ..Default::default()
    }
}
