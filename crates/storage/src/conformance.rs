//! The conformance suite every backend must pass (DESIGN.md invariant 6).
//!
//! Each function takes a fresh, empty [`Storage`] and panics on the first
//! deviation. Backends call them from their own tests
//! (`tests/conformance_sqlite.rs`, `tests/conformance_postgres.rs`), through
//! [`run_all`]: a new concern adds its function there.

use starling_core::storage::{
    ArchiveId, ArchivePrefs, ArchiveQuery, ArchiveRecord, InboxQuery, InboxTotals, InboxUpdate,
    OfflineStoreError, PrefsDefault, RosterChange, RosterItem, Storage, StorageError, Subscription,
    UnreadChange, WithFilter, FLAG_BODY,
};
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

/// Accounts: create, conflict, credentials per hash, password change,
/// listing, counting and deletion; SQL-looking names stored verbatim.
pub async fn accounts(s: &Storage) {
    let a = s.accounts.as_ref();
    let alice = jid("alice@example.org");
    assert!(!a.exists(&alice).await.unwrap());
    a.create(&alice, &creds("secret")).await.unwrap();
    assert!(a.exists(&alice).await.unwrap());
    assert!(matches!(
        a.create(&alice, &creds("other")).await,
        Err(StorageError::Conflict)
    ));
    for h in [ScramHash::Sha1, ScramHash::Sha256, ScramHash::Sha512] {
        let c = a
            .credentials(&alice, h)
            .await
            .unwrap()
            .expect("creds stored");
        assert_eq!(c.hash, h);
        assert!(c.verify_password("secret"));
        assert!(!c.verify_password("other"));
    }
    assert!(a.set_credentials(&alice, &creds("new")).await.unwrap());
    let c = a
        .credentials(&alice, ScramHash::Sha256)
        .await
        .unwrap()
        .unwrap();
    assert!(c.verify_password("new"));
    assert!(!a
        .set_credentials(&jid("nobody@example.org"), &creds("x"))
        .await
        .unwrap());

    // Same localpart, another domain: a separate account (invariant 9).
    let alice2 = jid("alice@other.example");
    a.create(&alice2, &creds("x")).await.unwrap();
    // A name that looks like SQL is data, nothing else.
    let evil = jid("robert);delete_from_accounts;--@example.org");
    a.create(&evil, &creds("x")).await.unwrap();
    assert!(a.exists(&evil).await.unwrap());

    let created = a
        .create_many(&[
            (jid("bob@example.org"), creds("b")),
            (alice.clone(), creds("ignored")),
            (jid("carol@example.org"), creds("c")),
        ])
        .await
        .unwrap();
    assert_eq!(created, 2, "existing accounts are skipped by bulk import");
    assert!(a
        .credentials(&alice, ScramHash::Sha256)
        .await
        .unwrap()
        .unwrap()
        .verify_password("new"));

    assert_eq!(a.count("example.org").await.unwrap(), 4);
    assert_eq!(a.count("other.example").await.unwrap(), 1);
    let page1 = a.list("example.org", None, 2).await.unwrap();
    assert_eq!(page1, ["alice", "bob"]);
    let page2 = a.list("example.org", Some("bob"), 10).await.unwrap();
    assert_eq!(page2, ["carol", "robert);delete_from_accounts;--"]);

    assert!(a.delete(&alice).await.unwrap());
    assert!(!a.delete(&alice).await.unwrap());
    assert!(!a.exists(&alice).await.unwrap());
    assert!(a
        .credentials(&alice, ScramHash::Sha1)
        .await
        .unwrap()
        .is_none());
    assert!(a.exists(&alice2).await.unwrap());
}

/// Rosters: items, versions (XEP-0237), tombstones, pending requests.
pub async fn roster(s: &Storage) {
    let r = s.roster.as_ref();
    let alice = jid("alice@example.org");
    assert_eq!(r.get_roster(&alice).await.unwrap(), (0, vec![]));
    let mut bob = RosterItem::new(jid("bob@example.org"));
    bob.name = Some("Bob 'the builder'".into());
    bob.groups = vec!["Friends".into(), "Work & Play".into()];
    bob.ask = true;
    let v1 = r.put_item(&alice, &bob).await.unwrap();
    let mut carol = RosterItem::new(jid("carol@example.org"));
    carol.subscription = Subscription::Both;
    let v2 = r.put_item(&alice, &carol).await.unwrap();
    assert!(v2 > v1);
    let (v, items) = r.get_roster(&alice).await.unwrap();
    assert_eq!(v, v2);
    assert_eq!(
        items,
        vec![bob.clone(), carol.clone()],
        "sorted by JID, all fields kept"
    );
    assert_eq!(
        r.get_item(&alice, &bob.jid).await.unwrap(),
        Some(bob.clone())
    );
    assert_eq!(r.count(&alice).await.unwrap(), 2);

    // Update and removal are versioned; removal leaves a tombstone.
    bob.subscription = Subscription::To;
    bob.ask = false;
    bob.groups.clear();
    let v3 = r.put_item(&alice, &bob).await.unwrap();
    let v4 = r
        .remove_item(&alice, &carol.jid)
        .await
        .unwrap()
        .expect("was present");
    assert!(v4 > v3);
    assert_eq!(r.remove_item(&alice, &carol.jid).await.unwrap(), None);
    assert_eq!(r.get_item(&alice, &carol.jid).await.unwrap(), None);
    assert_eq!(r.count(&alice).await.unwrap(), 1);
    let (cur, changes) = r.changes_since(&alice, v2).await.unwrap().unwrap();
    assert_eq!(cur, v4);
    assert_eq!(
        changes,
        vec![
            RosterChange::Updated(bob.clone()),
            RosterChange::Removed(carol.jid.clone())
        ]
    );
    assert_eq!(
        r.changes_since(&alice, v4).await.unwrap(),
        Some((v4, vec![]))
    );
    assert_eq!(
        r.changes_since(&alice, v4 + 10).await.unwrap(),
        None,
        "unknown version"
    );
    // Re-adding a removed contact resurrects it.
    r.put_item(&alice, &carol).await.unwrap();
    assert_eq!(r.count(&alice).await.unwrap(), 2);
    // Rosters are per owner.
    assert_eq!(
        r.get_roster(&jid("bob@example.org")).await.unwrap().1,
        vec![]
    );

    // Pending subscription requests (RFC 6121 §3.1.3).
    let dave = jid("dave@example.org");
    r.put_pending_request(&alice, &dave, "<presence type='subscribe'/>")
        .await
        .unwrap();
    r.put_pending_request(
        &alice,
        &dave,
        "<presence type='subscribe'><status>hi</status></presence>",
    )
    .await
    .unwrap();
    let pending = r.pending_requests(&alice).await.unwrap();
    assert_eq!(pending.len(), 1, "one request per contact, latest kept");
    assert!(pending[0].1.contains("hi"));
    r.remove_pending_request(&alice, &dave).await.unwrap();
    assert!(r.pending_requests(&alice).await.unwrap().is_empty());

    r.remove_user(&alice).await.unwrap();
    assert_eq!(r.get_roster(&alice).await.unwrap(), (0, vec![]));
}

/// Block lists, per-user documents, last activity, and account deletion
/// removing every concern's data.
pub async fn user_data(s: &Storage) {
    let alice = jid("alice@example.org");
    let b = s.blocking.as_ref();
    assert_eq!(
        b.block(&alice, &["x@y".into(), "spam.example".into()])
            .await
            .unwrap(),
        ["x@y", "spam.example"]
    );
    assert_eq!(
        b.block(&alice, &["x@y".into()]).await.unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(b.blocklist(&alice).await.unwrap(), ["spam.example", "x@y"]);
    assert_eq!(
        b.unblock(&alice, &["x@y".into(), "z@y".into()])
            .await
            .unwrap(),
        ["x@y"]
    );
    assert_eq!(b.unblock_all(&alice).await.unwrap(), ["spam.example"]);
    assert!(b.blocklist(&alice).await.unwrap().is_empty());

    let d = s.user_data.as_ref();
    assert_eq!(d.get(&alice, "vcard", "").await.unwrap(), None);
    d.set(&alice, "vcard", "", "<vCard xmlns='vcard-temp'/>")
        .await
        .unwrap();
    d.set(
        &alice,
        "vcard",
        "",
        "<vCard xmlns='vcard-temp'><FN>A</FN></vCard>",
    )
    .await
    .unwrap();
    d.set(
        &alice,
        "private",
        "{storage:bookmarks}storage",
        "<storage/>",
    )
    .await
    .unwrap();
    assert!(d
        .get(&alice, "vcard", "")
        .await
        .unwrap()
        .unwrap()
        .contains("<FN>A</FN>"));
    d.delete(&alice, "private", "{storage:bookmarks}storage")
        .await
        .unwrap();
    assert_eq!(
        d.get(&alice, "private", "{storage:bookmarks}storage")
            .await
            .unwrap(),
        None
    );

    let l = s.last_activity.as_ref();
    assert_eq!(l.get(&alice).await.unwrap(), None);
    l.set(&alice, 1_700_000_000, "gone fishing").await.unwrap();
    l.set(&alice, 1_700_000_100, "").await.unwrap();
    assert_eq!(
        l.get(&alice).await.unwrap(),
        Some((1_700_000_100, String::new()))
    );

    // delete_account removes every concern's rows.
    s.accounts.create(&alice, &creds("pw")).await.unwrap();
    s.roster
        .put_item(&alice, &RosterItem::new(jid("bob@example.org")))
        .await
        .unwrap();
    s.blocking.block(&alice, &["x@y".into()]).await.unwrap();
    assert!(s.delete_account(&alice).await.unwrap());
    assert!(!s.accounts.exists(&alice).await.unwrap());
    assert_eq!(s.roster.count(&alice).await.unwrap(), 0);
    assert!(s.blocking.blocklist(&alice).await.unwrap().is_empty());
    assert_eq!(s.user_data.get(&alice, "vcard", "").await.unwrap(), None);
    assert_eq!(s.last_activity.get(&alice).await.unwrap(), None);
    assert!(!s.delete_account(&alice).await.unwrap());
}

/// Offline messages (XEP-0160): queue order, per-user quota, per-owner
/// isolation, delete up to an id, take-and-delete, removal with the account.
pub async fn offline(s: &Storage) {
    let o = s.offline.as_ref();
    let alice = jid("alice@example.org");
    let bob = jid("bob@example.org");
    let other_domain = jid("alice@example.net");
    assert_eq!(o.count(&alice).await.unwrap(), 0);
    assert!(o.fetch_all(&alice).await.unwrap().is_empty());
    for i in 0..3 {
        let xml = format!("<message id='m{i}'>'; DROP TABLE x; --</message>");
        o.store(
            &alice,
            "carol@example.org/r",
            &xml,
            1_700_000_000_000 + i,
            3,
            &[],
        )
        .await
        .unwrap();
    }
    // Quota: the fourth message is refused and nothing changes.
    assert!(matches!(
        o.store(&alice, "carol@example.org/r", "<message/>", 0, 3, &[])
            .await,
        Err(OfflineStoreError::QuotaExceeded { max: 3 })
    ));
    assert_eq!(o.count(&alice).await.unwrap(), 3);
    // Isolation: other owners (same user, other domain too) are separate.
    o.store(&bob, "x@y", "<message id='b'/>", 5, 3, &[])
        .await
        .unwrap();
    o.store(&other_domain, "x@y", "<message id='n'/>", 6, 3, &[])
        .await
        .unwrap();
    let all = o.fetch_all(&alice).await.unwrap();
    assert_eq!(all.len(), 3);
    for (i, m) in all.iter().enumerate() {
        assert_eq!(
            m.stanza,
            format!("<message id='m{i}'>'; DROP TABLE x; --</message>")
        );
        assert_eq!(m.from, "carol@example.org/r");
        assert_eq!(m.stamp_millis, 1_700_000_000_000 + i as i64);
    }
    assert!(all.windows(2).all(|w| w[0].id < w[1].id), "oldest first");
    // Delete up to an id.
    assert_eq!(o.delete_up_to(&alice, all[1].id).await.unwrap(), 2);
    let rest = o.fetch_all(&alice).await.unwrap();
    assert_eq!(rest, vec![all[2].clone()]);
    // New messages come after the older ones, ids never reused.
    o.store(&alice, "d@e", "<message id='m3'/>", 7, 3, &[])
        .await
        .unwrap();
    let taken = o.take_all(&alice).await.unwrap();
    assert_eq!(taken.len(), 2);
    assert_eq!(taken[0], all[2]);
    assert_eq!(taken[1].stanza, "<message id='m3'/>");
    assert!(taken[1].id > all[2].id);
    assert_eq!(o.count(&alice).await.unwrap(), 0);
    assert!(o.take_all(&alice).await.unwrap().is_empty());
    assert_eq!(o.count(&bob).await.unwrap(), 1);
    assert_eq!(o.count(&other_domain).await.unwrap(), 1);
    // remove_user, and delete_account removes the queue too.
    o.remove_user(&bob).await.unwrap();
    assert_eq!(o.count(&bob).await.unwrap(), 0);
    assert_eq!(o.count(&other_domain).await.unwrap(), 1);
    s.accounts.create(&alice, &creds("pw")).await.unwrap();
    o.store(&alice, "x@y", "<message/>", 8, 3, &[])
        .await
        .unwrap();
    assert!(s.delete_account(&alice).await.unwrap());
    assert_eq!(o.count(&alice).await.unwrap(), 0);
    assert_eq!(o.count(&other_domain).await.unwrap(), 1);
}

/// Concurrency: stores racing for the last quota slots never exceed the
/// quota; concurrent take-alls hand each message to exactly one caller;
/// concurrent roster writers get distinct versions. Backends shared by
/// several nodes must hold this across connections.
pub async fn concurrency(s: &Storage) {
    let alice = jid("alice@example.org");
    let quota = 5;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let (s, alice) = (s.clone(), alice.clone());
        tasks.push(tokio::spawn(async move {
            s.offline
                .store(
                    &alice,
                    "x@y",
                    &format!("<message id='c{i}'/>"),
                    i,
                    quota,
                    &[],
                )
                .await
        }));
    }
    let mut stored = 0;
    for t in tasks {
        match t.await.expect("store task") {
            Ok(()) => stored += 1,
            Err(OfflineStoreError::QuotaExceeded { max }) => assert_eq!(max, quota),
            Err(e) => panic!("store failed: {e}"),
        }
    }
    assert_eq!(stored, quota, "exactly the quota is stored");
    assert_eq!(s.offline.count(&alice).await.unwrap(), u64::from(quota));

    let bob = jid("bob@example.org");
    for i in 0..40 {
        s.offline
            .store(&bob, "x@y", &format!("<message id='t{i}'/>"), i, 1000, &[])
            .await
            .unwrap();
    }
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (s, bob) = (s.clone(), bob.clone());
        tasks.push(tokio::spawn(async move { s.offline.take_all(&bob).await }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        let taken = t.await.expect("take task").unwrap();
        assert!(taken.windows(2).all(|w| w[0].id < w[1].id), "oldest first");
        ids.extend(taken.into_iter().map(|m| m.id));
    }
    ids.sort();
    let before = ids.len();
    ids.dedup();
    assert_eq!(before, ids.len(), "no message handed out twice");
    assert_eq!(ids.len(), 40, "every message handed out once");

    let mut tasks = Vec::new();
    for i in 0..10 {
        let (s, alice) = (s.clone(), alice.clone());
        tasks.push(tokio::spawn(async move {
            let item = RosterItem::new(jid(&format!("c{i}@example.org")));
            s.roster.put_item(&alice, &item).await
        }));
    }
    let mut versions = Vec::new();
    for t in tasks {
        versions.push(t.await.expect("roster task").unwrap());
    }
    versions.sort();
    versions.dedup();
    assert_eq!(versions.len(), 10, "each write gets its own version");
    let (v, items) = s.roster.get_roster(&alice).await.unwrap();
    assert_eq!(items.len(), 10);
    assert_eq!(v, *versions.last().unwrap());

    // Offline messages with their archive rows (whose transaction reads
    // the bucket bounds before it writes) beside roster writers: none
    // fails with "database is locked"
    // (a SQLite deferred transaction that reads, then writes after
    // another connection's commit, gets SQLITE_BUSY without waiting).
    let carol = jid("carol@example.org");
    let mut tasks = Vec::new();
    for i in 0..40i64 {
        let (s, carol, alice) = (s.clone(), carol.clone(), alice.clone());
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                let r = rec(&carol, 10_000 + i, "dave@example.org/r", false, None);
                s.offline
                    .store(&carol, "dave@example.org/r", "<message/>", i, 1000, &[r])
                    .await
                    .map_err(|e| e.to_string())
            } else {
                let item = RosterItem::new(jid(&format!("w{i}@example.org")));
                s.roster
                    .put_item(&alice, &item)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        }));
    }
    for t in tasks {
        t.await.expect("write task").expect("concurrent write");
    }
    assert_eq!(s.offline.count(&carol).await.unwrap(), 20);
    let all = ArchiveQuery {
        limit: 100,
        ..Default::default()
    };
    assert_eq!(
        s.archive.query(&carol, &all).await.unwrap().messages.len(),
        20
    );
}

/// The offline store writes a message's archive rows in its transaction:
/// both are committed together, and a refused message (quota) leaves
/// neither behind.
pub async fn offline_with_archive(s: &Storage) {
    let alice = jid("alice@example.org");
    let r1 = rec(&alice, 1_000, "carol@example.org/r", false, Some("o1"));
    s.offline
        .store(
            &alice,
            "carol@example.org/r",
            "<message id='o1'/>",
            1,
            1,
            std::slice::from_ref(&r1),
        )
        .await
        .unwrap();
    assert_eq!(s.offline.count(&alice).await.unwrap(), 1);
    let all = ArchiveQuery {
        limit: 10,
        ..Default::default()
    };
    let page = s.archive.query(&alice, &all).await.unwrap();
    assert_eq!(
        ids(&page),
        vec![1_000],
        "archive row committed with the message"
    );
    assert_eq!(page.messages[0].stanza, r1.stanza);
    // Over quota: the archive row is rolled back with the refused message.
    let r2 = rec(&alice, 2_000, "carol@example.org/r", false, Some("o2"));
    assert!(matches!(
        s.offline
            .store(
                &alice,
                "carol@example.org/r",
                "<message id='o2'/>",
                2,
                1,
                &[r2]
            )
            .await,
        Err(OfflineStoreError::QuotaExceeded { max: 1 })
    ));
    let page = s.archive.query(&alice, &all).await.unwrap();
    assert_eq!(ids(&page), vec![1_000], "nothing of a refused message");
    // The same row again (a retried write) is ignored, like append's.
    s.offline.remove_user(&alice).await.unwrap();
    s.offline
        .store(
            &alice,
            "carol@example.org/r",
            "<message id='o1'/>",
            1,
            1,
            &[r1],
        )
        .await
        .unwrap();
    assert_eq!(
        ids(&s.archive.query(&alice, &all).await.unwrap()),
        vec![1_000]
    );
}

/// FAST tokens (XEP-0484): two slots per client, replaced in place,
/// per-client and per-slot deletion, none for unknown accounts, all gone
/// after a password change or the account's deletion.
pub async fn fast_tokens(s: &Storage) {
    use starling_core::storage::{FastSlot, FastToken};
    let a = s.accounts.as_ref();
    let alice = jid("alice@example.org");
    a.create(&alice, &creds("secret")).await.unwrap();
    let tok = |slot, nonce: &str| FastToken {
        slot,
        nonce: nonce.to_owned(),
        mechanism: "HT-SHA-256-NONE".to_owned(),
        expires_at: 1_900_000_000_000,
    };
    let agent = "d4565fa7-4d72-4749-b3d3-740edbf87770";
    let other = "other'; DROP TABLE fast_tokens; --";
    assert!(a.fast_tokens(&alice, agent).await.unwrap().is_empty());
    assert!(a
        .put_fast_token(&alice, agent, &tok(FastSlot::New, "n1"))
        .await
        .unwrap());
    assert!(a
        .put_fast_token(&alice, agent, &tok(FastSlot::Current, "c1"))
        .await
        .unwrap());
    assert!(a
        .put_fast_token(&alice, agent, &tok(FastSlot::New, "n2"))
        .await
        .unwrap());
    assert!(a
        .put_fast_token(&alice, other, &tok(FastSlot::New, "o1"))
        .await
        .unwrap());
    assert_eq!(
        a.fast_tokens(&alice, agent).await.unwrap(),
        [tok(FastSlot::Current, "c1"), tok(FastSlot::New, "n2")]
    );
    assert!(!a
        .put_fast_token(&jid("nobody@example.org"), agent, &tok(FastSlot::New, "x"))
        .await
        .unwrap());
    a.delete_fast_tokens(&alice, agent, Some(FastSlot::New))
        .await
        .unwrap();
    assert_eq!(
        a.fast_tokens(&alice, agent).await.unwrap(),
        [tok(FastSlot::Current, "c1")]
    );
    a.delete_fast_tokens(&alice, agent, None).await.unwrap();
    assert!(a.fast_tokens(&alice, agent).await.unwrap().is_empty());
    assert_eq!(a.fast_tokens(&alice, other).await.unwrap().len(), 1);
    // A password change revokes them.
    a.set_credentials(&alice, &creds("new")).await.unwrap();
    assert!(a.fast_tokens(&alice, other).await.unwrap().is_empty());
    // So does deleting the account.
    a.put_fast_token(&alice, agent, &tok(FastSlot::New, "n3"))
        .await
        .unwrap();
    a.delete(&alice).await.unwrap();
    a.create(&alice, &creds("again")).await.unwrap();
    assert!(a.fast_tokens(&alice, agent).await.unwrap().is_empty());
}

/// Runs every conformance test, each on a fresh storage from `make`.
pub async fn run_all<F, Fut>(mut make: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Storage>,
{
    accounts(&make().await).await;
    fast_tokens(&make().await).await;
    roster(&make().await).await;
    user_data(&make().await).await;
    offline(&make().await).await;
    offline_with_archive(&make().await).await;
    archive(&make().await).await;
    inbox(&make().await).await;
    muc(&make().await).await;
    muc_light_blocking(&make().await).await;
    concurrency(&make().await).await;
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
    // Removing the account leaves nothing in any bucket.
    a.remove_user(&alice).await.unwrap();
    assert_eq!(a.count(&alice, &count(None)).await.unwrap(), 0);
}

/// The [`crate::OpenOptions`] under which [`archive_buckets`] sees several
/// buckets: three rows each, a new one right after the newest id.
pub fn bucket_test_options() -> crate::OpenOptions {
    crate::OpenOptions {
        archive_bucket_rows: 3,
        archive_bucket_margin_micros: 1,
        archive_bucket_follow_clock: false,
    }
}

fn rec(
    owner: &BareJid,
    micros: i64,
    with: &str,
    outgoing: bool,
    origin: Option<&str>,
) -> ArchiveRecord {
    let with_bare = with.split('/').next().unwrap().to_owned();
    ArchiveRecord {
        owner: owner.clone(),
        id: ArchiveId::from_parts(micros, 1),
        with_bare,
        remote: with.to_owned(),
        outgoing,
        origin_id: origin.map(str::to_owned),
        flags: FLAG_BODY,
        stanza: format!("<message id='{micros}'><body>'; DROP TABLE archive; --</body></message>"),
    }
}

fn ids(page: &starling_core::storage::ArchivePage) -> Vec<i64> {
    page.messages.iter().map(|m| m.id.micros()).collect()
}

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

fn upd(owner: &BareJid, remote: &str, last: Option<i64>, unread: UnreadChange) -> InboxUpdate {
    InboxUpdate {
        owner: owner.clone(),
        remote: remote.to_owned(),
        last: last.map(|t| ArchiveId::from_parts(t, 0)),
        unread,
        shared: false,
    }
}

/// An archived message of `owner` with `remote` at time `t` (node 0).
fn archived(owner: &BareJid, remote: &str, t: i64) -> ArchiveRecord {
    ArchiveRecord {
        owner: owner.clone(),
        id: ArchiveId::from_parts(t, 0),
        with_bare: remote.to_owned(),
        remote: remote.to_owned(),
        outgoing: false,
        origin_id: None,
        flags: FLAG_BODY,
        stanza: format!("<message id='{t}'/>"),
    }
}

/// Inbox (XEP-0430): upserts in order, unread arithmetic, updates without
/// a message touching only existing rows, newest-first listing with paging
/// and unread-only, the last message joined from the owner's archive (so a
/// tombstone shows; a purged message is `None`), totals, removal, isolation
/// and account deletion.
pub async fn inbox(s: &Storage) {
    let i = s.inbox.as_ref();
    let alice = jid("alice@example.org");
    let bob = jid("bob@example.org");
    // Alice's archive holds the messages the updates point at (bob's
    // archive does not: the join is per owner).
    s.archive
        .append(&[
            archived(&alice, "bob@example.org", 1),
            archived(&alice, "carol@example.org", 2),
            archived(&alice, "bob@example.org", 3),
        ])
        .await
        .unwrap();
    assert_eq!(i.totals(&alice).await.unwrap(), InboxTotals::default());
    i.apply(&[
        upd(&alice, "bob@example.org", Some(1), UnreadChange::Add(1)),
        upd(&alice, "carol@example.org", Some(2), UnreadChange::Add(1)),
        upd(&alice, "bob@example.org", Some(3), UnreadChange::Add(1)),
        upd(&alice, "dave@example.org", Some(4), UnreadChange::Set(0)),
        // No message and no row: nothing is created.
        upd(&alice, "eve@example.org", None, UnreadChange::Set(0)),
        upd(&bob, "alice@example.org", Some(3), UnreadChange::Set(0)),
        upd(
            &alice,
            "'; DROP TABLE inbox; --",
            Some(0),
            UnreadChange::Add(2),
        ),
    ])
    .await
    .unwrap();
    let all = InboxQuery {
        limit: 10,
        ..Default::default()
    };
    let l = i.list(&alice, &all).await.unwrap();
    let names: Vec<&str> = l.iter().map(|e| e.remote.as_str()).collect();
    assert_eq!(
        names,
        [
            "dave@example.org",
            "bob@example.org",
            "carol@example.org",
            "'; DROP TABLE inbox; --"
        ]
    );
    assert_eq!(l[1].unread, 2);
    assert_eq!(l[1].last_stanza.as_deref(), Some("<message id='3'/>"));
    assert_eq!(
        l[0].last_stanza, None,
        "dave's message is not in the archive"
    );
    assert_eq!(l[1].last_id, ArchiveId::from_parts(3, 0));
    assert_eq!(
        i.totals(&alice).await.unwrap(),
        InboxTotals {
            conversations: 4,
            unread_conversations: 3,
            unread_messages: 5
        }
    );
    // Paging: newest first, `before` the last id of a page.
    let p1 = i
        .list(
            &alice,
            &InboxQuery {
                limit: 2,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(p1.len(), 2);
    let p2 = i
        .list(
            &alice,
            &InboxQuery {
                limit: 2,
                before: Some(p1[1].last_id),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        p2.iter().map(|e| e.remote.as_str()).collect::<Vec<_>>(),
        ["carol@example.org", "'; DROP TABLE inbox; --"]
    );
    let back = i
        .list(
            &alice,
            &InboxQuery {
                limit: 1,
                after: Some(p2[0].last_id),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        back[0].remote, "bob@example.org",
        "the page just newer than carol"
    );
    let unread = i
        .list(
            &alice,
            &InboxQuery {
                limit: 10,
                unread_only: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(unread.len(), 3);
    // Reset without a message; an older message does not replace a newer one.
    i.apply(&[
        upd(&alice, "bob@example.org", None, UnreadChange::Set(0)),
        upd(&alice, "carol@example.org", Some(1), UnreadChange::Keep),
    ])
    .await
    .unwrap();
    assert_eq!(
        i.get(&alice, "bob@example.org")
            .await
            .unwrap()
            .unwrap()
            .unread,
        0
    );
    let carol = i.get(&alice, "carol@example.org").await.unwrap().unwrap();
    assert_eq!(
        (carol.last_id, carol.unread),
        (ArchiveId::from_parts(2, 0), 1)
    );
    // Changes that come with an older message than the conversation's
    // newest leave the count alone: in a cluster, a reply's reset (from
    // the owner's node) may be written before the count of a message
    // that preceded it (from the sender's node); and a batch written
    // twice counts once.
    let frank = "frank@example.org";
    let alice_ref = &alice;
    let unread_of = |remote: &'static str| async move {
        i.get(alice_ref, remote).await.unwrap().unwrap().unread
    };
    i.apply(&[upd(&alice, frank, Some(10), UnreadChange::Set(0))])
        .await
        .unwrap();
    i.apply(&[upd(&alice, frank, Some(9), UnreadChange::Add(1))])
        .await
        .unwrap();
    assert_eq!(unread_of(frank).await, 0, "the older message was read");
    i.apply(&[upd(&alice, frank, Some(11), UnreadChange::Add(1))])
        .await
        .unwrap();
    i.apply(&[upd(&alice, frank, Some(11), UnreadChange::Add(1))])
        .await
        .unwrap();
    assert_eq!(unread_of(frank).await, 1, "a newer message counts once");
    i.apply(&[upd(&alice, frank, Some(10), UnreadChange::Set(0))])
        .await
        .unwrap();
    assert_eq!(
        unread_of(frank).await,
        1,
        "an older reset does not clear it"
    );
    assert!(i.remove(&alice, frank).await.unwrap());
    // A retraction's tombstone in the archive is what the inbox shows.
    assert!(s
        .archive
        .replace(&alice, ArchiveId::from_parts(3, 0), "<t/>")
        .await
        .unwrap());
    assert_eq!(
        i.get(&alice, "bob@example.org")
            .await
            .unwrap()
            .unwrap()
            .last_stanza
            .as_deref(),
        Some("<t/>")
    );
    assert_eq!(
        i.get(&bob, "alice@example.org")
            .await
            .unwrap()
            .unwrap()
            .last_stanza,
        None,
        "never another owner's archive row"
    );
    // Groups: a room's archive holds the message once; a member's row
    // marked shared points into it, an unmarked one does not.
    let room = jid("room@conference.example.org");
    s.archive
        .append(&[archived(&room, "carol@example.org", 50)])
        .await
        .unwrap();
    let shared = |owner: &BareJid, unread| InboxUpdate {
        shared: true,
        ..upd(owner, "room@conference.example.org", Some(50), unread)
    };
    // (delivered twice, e.g. replayed after a crash: counted once)
    for _ in 0..2 {
        i.apply(&[shared(&alice, UnreadChange::Add(1))])
            .await
            .unwrap();
    }
    i.apply(&[upd(
        &bob,
        "room@conference.example.org",
        Some(50),
        UnreadChange::Add(1),
    )])
    .await
    .unwrap();
    let g = i
        .get(&alice, "room@conference.example.org")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(g.last_stanza.as_deref(), Some("<message id='50'/>"));
    assert_eq!(g.unread, 1, "the same message counts once");
    let listed = i.list(&alice, &all).await.unwrap();
    assert_eq!(listed[0].remote, "room@conference.example.org");
    assert_eq!(listed[0].last_stanza.as_deref(), Some("<message id='50'/>"));
    assert_eq!(
        i.get(&bob, "room@conference.example.org")
            .await
            .unwrap()
            .unwrap()
            .last_stanza,
        None,
        "an unmarked row never shows another archive's message"
    );
    assert!(i
        .remove(&alice, "room@conference.example.org")
        .await
        .unwrap());
    assert!(i.remove(&bob, "room@conference.example.org").await.unwrap());
    // Removal and isolation.
    assert!(i.remove(&alice, "dave@example.org").await.unwrap());
    assert!(!i.remove(&alice, "dave@example.org").await.unwrap());
    assert_eq!(i.totals(&bob).await.unwrap().conversations, 1);
    s.accounts.create(&alice, &creds("pw")).await.unwrap();
    assert!(s.delete_account(&alice).await.unwrap());
    assert_eq!(i.totals(&alice).await.unwrap().conversations, 0);
    assert_eq!(i.totals(&bob).await.unwrap().conversations, 1);
}

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
