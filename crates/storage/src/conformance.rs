//! The conformance suite every backend must pass (DESIGN.md invariant 6).
//!
//! Each function takes a fresh, empty [`Storage`] and panics on the first
//! deviation. Backends call them from their own tests
//! (`tests/conformance_sqlite.rs`, `tests/conformance_postgres.rs`), through
//! [`run_all`]: a new concern adds its function there.

use starling_core::storage::{
    AccountStore, ArchiveId, ArchivePrefs, ArchiveQuery, ArchiveRecord, AuthCache, InboxQuery,
    InboxTotals, InboxUpdate, OfflineStoreError, PrefsDefault, RosterChange, RosterItem, Storage,
    StorageError, Subscription, UnreadChange, WithFilter, ACCOUNT_CHANGES_KEPT, FLAG_BODY,
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

/// The accounts change log behind the servers' auth caches: a password
/// change, a ban or unban and a deletion are each listed once, in order;
/// creation, reads and FAST tokens are not; a reader further behind than
/// the log keeps is told to forget everything.
pub async fn account_changes(s: &Storage) {
    let a = s.accounts.as_ref();
    let v0 = a.account_changes(0).await.unwrap();
    assert_eq!(v0.accounts, Some(vec![]), "a new database has no changes");
    let alice = jid("alice@example.org");
    let evil = jid("x);drop_table_accounts;--@example.org");
    a.create(&alice, &creds("one")).await.unwrap();
    a.create(&evil, &creds("one")).await.unwrap();
    let v1 = a.account_changes(v0.version).await.unwrap();
    assert_eq!(v1.accounts, Some(vec![]), "creating is not a change");
    assert!(a.set_credentials(&alice, &creds("two")).await.unwrap());
    assert!(a.set_disabled(&evil, true).await.unwrap());
    assert!(!a
        .set_disabled(&jid("nobody@example.org"), true)
        .await
        .unwrap());
    assert!(a.delete(&alice).await.unwrap());
    assert!(!a.delete(&alice).await.unwrap());
    let v2 = a.account_changes(v1.version).await.unwrap();
    assert_eq!(v2.version, v1.version + 3);
    assert_eq!(
        v2.accounts,
        Some(vec![alice.clone(), evil.clone(), alice.clone()])
    );
    assert_eq!(
        a.account_changes(v2.version - 1).await.unwrap().accounts,
        Some(vec![alice.clone()])
    );
    assert_eq!(
        a.account_changes(v2.version).await.unwrap().accounts,
        Some(vec![])
    );
    // Ahead of the database (a restored backup) or too far behind.
    assert_eq!(
        a.account_changes(v2.version + 5).await.unwrap().accounts,
        None
    );
    assert_eq!(
        a.account_changes(v2.version - ACCOUNT_CHANGES_KEPT - 1)
            .await
            .unwrap()
            .accounts,
        None
    );
    // The log keeps the last ACCOUNT_CHANGES_KEPT changes.
    for i in 0..ACCOUNT_CHANGES_KEPT + 2 {
        assert!(a.set_disabled(&evil, i % 2 == 0).await.unwrap());
    }
    let v3 = a.account_changes(v2.version).await.unwrap();
    assert_eq!(v3.version, v2.version + ACCOUNT_CHANGES_KEPT + 2);
    assert_eq!(
        v3.accounts, None,
        "changes older than the log keeps are gone"
    );
    let kept = a
        .account_changes(v3.version - ACCOUNT_CHANGES_KEPT)
        .await
        .unwrap()
        .accounts
        .expect("the last ACCOUNT_CHANGES_KEPT are kept");
    assert_eq!(kept.len() as i64, ACCOUNT_CHANGES_KEPT);
}

/// Two servers' auth caches ([`AuthCache`]) over one backend, as two nodes
/// of a cluster or a server and the offline CLI: a change through one is
/// seen by the other at its next [`AuthCache::sync`], not before; a change
/// through a cache is seen by that cache at once; an unknown account is
/// not remembered.
pub async fn auth_cache(s: &Storage) {
    let a = s.accounts.clone();
    let node1 = AuthCache::new(a.clone(), 1000);
    let node2 = AuthCache::new(a.clone(), 1000);
    assert_eq!(
        node1.sync().await.unwrap(),
        None,
        "the first sync starts empty"
    );
    assert_eq!(node2.sync().await.unwrap(), None);
    let alice = jid("alice@example.org");
    let bob = jid("bob@example.org");
    let pw = |c: Option<ScramCredentials>, p: &str| c.expect("credentials").verify_password(p);
    // Not an account yet: not remembered, so creating it elsewhere works at once.
    assert!(node2
        .credentials(&bob, ScramHash::Sha256)
        .await
        .unwrap()
        .is_none());
    a.create(&alice, &creds("one")).await.unwrap();
    a.create(&bob, &creds("one")).await.unwrap();
    assert!(pw(
        node2.credentials(&bob, ScramHash::Sha256).await.unwrap(),
        "one"
    ));
    assert!(pw(
        node2.credentials(&alice, ScramHash::Sha256).await.unwrap(),
        "one"
    ));
    assert!(!node2.is_disabled(&alice).await.unwrap());
    assert!(!node2.is_disabled(&bob).await.unwrap());
    assert_eq!(node2.len(), 2);
    // Another hash function is read, and then kept instead.
    assert!(pw(
        node2.credentials(&alice, ScramHash::Sha1).await.unwrap(),
        "one"
    ));

    // Changed through node 1: node 1 sees it at once, node 2 after its sync.
    node1.set_credentials(&alice, &creds("two")).await.unwrap();
    node1.set_disabled(&bob, true).await.unwrap();
    assert!(pw(
        node1.credentials(&alice, ScramHash::Sha1).await.unwrap(),
        "two"
    ));
    assert!(node1.is_disabled(&bob).await.unwrap());
    assert!(
        pw(
            node2.credentials(&alice, ScramHash::Sha1).await.unwrap(),
            "one"
        ),
        "cached"
    );
    assert!(!node2.is_disabled(&bob).await.unwrap(), "cached");
    assert_eq!(node2.sync().await.unwrap(), Some(2));
    assert!(pw(
        node2.credentials(&alice, ScramHash::Sha1).await.unwrap(),
        "two"
    ));
    assert!(node2.is_disabled(&bob).await.unwrap());
    assert_eq!(node2.sync().await.unwrap(), Some(0));

    // Changed behind both caches (the offline CLI writes the backend).
    a.set_credentials(&alice, &creds("three")).await.unwrap();
    assert!(a.delete(&bob).await.unwrap());
    assert_eq!(node2.sync().await.unwrap(), Some(2));
    assert!(pw(
        node2.credentials(&alice, ScramHash::Sha1).await.unwrap(),
        "three"
    ));
    assert!(node2
        .credentials(&bob, ScramHash::Sha1)
        .await
        .unwrap()
        .is_none());
    assert!(!node2.is_disabled(&bob).await.unwrap());
    // node 1 syncs: alice's and bob's changes since its last sync (its own included).
    assert_eq!(node1.sync().await.unwrap(), Some(4));
    assert!(pw(
        node1.credentials(&alice, ScramHash::Sha1).await.unwrap(),
        "three"
    ));

    // A cache of capacity 0 reads through.
    let off = AuthCache::new(a.clone(), 0);
    assert!(pw(
        off.credentials(&alice, ScramHash::Sha512).await.unwrap(),
        "three"
    ));
    assert_eq!(off.len(), 0);
    // Bounded: never more than its capacity (rounded up to its shards).
    let small = AuthCache::new(a.clone(), 16);
    let many: Vec<(BareJid, Vec<ScramCredentials>)> = (0..64)
        .map(|i| (jid(&format!("u{i}@example.org")), creds("p")))
        .collect();
    a.create_many(&many).await.unwrap();
    for (j, _) in &many {
        assert!(small
            .credentials(j, ScramHash::Sha256)
            .await
            .unwrap()
            .is_some());
    }
    assert!(small.len() <= 16, "{} cached", small.len());
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

    // One contact's item in many owners' rosters at once: owners on two
    // domains, one without the contact, one whose item is a tombstone,
    // one named twice.
    let other = jid("robert);delete_from_roster_items;--@other.example");
    let mut carol_for_other = carol.clone();
    carol_for_other.name = Some("C".into());
    r.put_item(&other, &carol_for_other).await.unwrap();
    let erin = jid("erin@example.org");
    r.put_item(&erin, &carol).await.unwrap();
    r.remove_item(&erin, &carol.jid).await.unwrap();
    let owners = [
        alice.clone(),
        jid("bob@example.org"),
        erin.clone(),
        other.clone(),
        alice.clone(),
    ];
    let mut found = r.items_for_contact(&owners, &carol.jid).await.unwrap();
    found.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    found.dedup();
    assert_eq!(
        found,
        [
            (alice.clone(), carol.clone()),
            (other.clone(), carol_for_other)
        ]
    );
    assert!(r
        .items_for_contact(&[], &carol.jid)
        .await
        .unwrap()
        .is_empty());
    r.remove_user(&other).await.unwrap();
    r.remove_user(&erin).await.unwrap();

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
    assert!(r.has_pending_request(&alice, &dave).await.unwrap());
    assert!(
        !r.has_pending_request(&dave, &alice).await.unwrap(),
        "directed"
    );
    assert!(!r.has_pending_request(&alice, &alice).await.unwrap());
    r.remove_pending_request(&alice, &dave).await.unwrap();
    assert!(r.pending_requests(&alice).await.unwrap().is_empty());
    assert!(!r.has_pending_request(&alice, &dave).await.unwrap());

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

/// Admin API tokens: unique names, listed by name with their hashes,
/// last use recorded, revoked by name; and the account ban flag: off for a
/// new account, on and off again, false for unknown accounts, gone with
/// the account.
pub async fn admin(s: &Storage) {
    use starling_core::storage::AdminToken;
    let t = s.admin_tokens.as_ref();
    assert!(t.admin_tokens().await.unwrap().is_empty());
    let tok = |name: &str, hash: u8| AdminToken {
        name: name.to_owned(),
        hash: vec![hash; 32],
        created_at: 1_800_000_000_000,
        last_used_at: None,
        scope: if hash == 2 { "read" } else { "admin" }.to_owned(),
    };
    let odd = "ops'; DROP TABLE admin_tokens; --";
    t.create_admin_token(&tok("deploy", 1)).await.unwrap();
    t.create_admin_token(&tok(odd, 2)).await.unwrap();
    assert!(matches!(
        t.create_admin_token(&tok("deploy", 3)).await,
        Err(StorageError::Conflict)
    ));
    assert_eq!(
        t.admin_tokens().await.unwrap(),
        [tok("deploy", 1), tok(odd, 2)]
    );
    t.touch_admin_token("deploy", 1_800_000_000_500)
        .await
        .unwrap();
    let listed = t.admin_tokens().await.unwrap();
    assert_eq!(listed[0].last_used_at, Some(1_800_000_000_500));
    assert_eq!(listed[1].last_used_at, None);
    assert!(t.revoke_admin_token(odd).await.unwrap());
    assert!(!t.revoke_admin_token(odd).await.unwrap());
    assert_eq!(t.admin_tokens().await.unwrap().len(), 1);

    let a = s.accounts.as_ref();
    let alice = jid("alice@example.org");
    a.create(&alice, &creds("secret")).await.unwrap();
    assert!(!a.is_disabled(&alice).await.unwrap());
    assert!(a.set_disabled(&alice, true).await.unwrap());
    assert!(a.is_disabled(&alice).await.unwrap());
    assert!(a
        .credentials(&alice, ScramHash::Sha256)
        .await
        .unwrap()
        .is_some());
    assert!(a.set_disabled(&alice, false).await.unwrap());
    assert!(!a.is_disabled(&alice).await.unwrap());
    let nobody = jid("nobody@example.org");
    assert!(!a.set_disabled(&nobody, true).await.unwrap());
    assert!(!a.is_disabled(&nobody).await.unwrap());
    a.set_disabled(&alice, true).await.unwrap();
    a.delete(&alice).await.unwrap();
    a.create(&alice, &creds("again")).await.unwrap();
    assert!(
        !a.is_disabled(&alice).await.unwrap(),
        "a new account starts enabled"
    );
}

/// Domains added at run time: add (conflict on a second add, nothing
/// changed then), state and settings changes, listing by name, deletion;
/// every change moves the version counter and failed ones do not;
/// settings round-trip; SQL-looking names are data.
pub async fn domains(s: &Storage) {
    use starling_core::storage::{DomainSettings, DomainState, StoredDomain};
    let d = s.domains.as_ref();
    assert!(d.domains().await.unwrap().is_empty());
    let v0 = d.domains_version().await.unwrap();
    let dom = |name: &str| StoredDomain {
        name: name.to_owned(),
        state: DomainState::Enabled,
        settings: DomainSettings::default(),
        created_at: 1_800_000_000_000,
        version: 0,
    };
    d.add_domain(&dom("b.example")).await.unwrap();
    let v1 = d.domains_version().await.unwrap();
    assert!(v1 > v0, "an add moves the counter");
    let odd = "x'); DROP TABLE domains; --";
    d.add_domain(&dom(odd)).await.unwrap();
    d.add_domain(&dom("a.example")).await.unwrap();
    let v2 = d.domains_version().await.unwrap();
    assert!(matches!(
        d.add_domain(&dom("a.example")).await,
        Err(StorageError::Conflict)
    ));
    assert_eq!(
        d.domains_version().await.unwrap(),
        v2,
        "a refused add changes nothing"
    );
    let names: Vec<String> = d
        .domains()
        .await
        .unwrap()
        .into_iter()
        .map(|x| x.name)
        .collect();
    assert_eq!(names, ["a.example", "b.example", odd]);
    let a = d.domain("a.example").await.unwrap().expect("stored");
    assert_eq!(a.state, DomainState::Enabled);
    assert_eq!(a.created_at, 1_800_000_000_000);
    assert_eq!(a.version, v2);
    assert!(d.domain("nope.example").await.unwrap().is_none());

    assert!(d
        .set_domain_state("a.example", DomainState::Disabled)
        .await
        .unwrap());
    let v3 = d.domains_version().await.unwrap();
    assert!(v3 > v2);
    let a = d.domain("a.example").await.unwrap().unwrap();
    assert_eq!((a.state, a.version), (DomainState::Disabled, v3));
    assert!(!d
        .set_domain_state("nope.example", DomainState::Enabled)
        .await
        .unwrap());
    assert_eq!(d.domains_version().await.unwrap(), v3);

    let settings = DomainSettings {
        registration: Some(true),
        archive_retention_days: Some(30),
        max_sessions: Some(2),
        certificate: Some("/etc/certs/a.pem".into()),
        private_key: Some("/etc/certs/a.key".into()),
        disabled_modules: Some(vec!["mam".into(), "muc".into()]),
    };
    assert!(d.set_domain_settings("a.example", &settings).await.unwrap());
    assert_eq!(
        d.domain("a.example").await.unwrap().unwrap().settings,
        settings
    );
    assert!(!d
        .set_domain_settings("nope.example", &settings)
        .await
        .unwrap());
    assert!(d
        .set_domain_state("b.example", DomainState::Removing)
        .await
        .unwrap());
    assert_eq!(
        d.domain("b.example").await.unwrap().unwrap().state,
        DomainState::Removing
    );
    let v4 = d.domains_version().await.unwrap();
    assert!(d.delete_domain("b.example").await.unwrap());
    assert!(d.domains_version().await.unwrap() > v4);
    assert!(!d.delete_domain("b.example").await.unwrap());
    assert!(d.domain("b.example").await.unwrap().is_none());
    assert!(d.domain(odd).await.unwrap().is_some());
}

/// Runs every conformance test, each on a fresh storage from `make`.
pub async fn run_all<F, Fut>(mut make: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Storage>,
{
    accounts(&make().await).await;
    account_changes(&make().await).await;
    auth_cache(&make().await).await;
    fast_tokens(&make().await).await;
    admin(&make().await).await;
    domains(&make().await).await;
    roster(&make().await).await;
    user_data(&make().await).await;
    offline(&make().await).await;
    offline_with_archive(&make().await).await;
    archive(&make().await).await;
    inbox(&make().await).await;
    muc(&make().await).await;
    muc_light_blocking(&make().await).await;
    pubsub(&make().await).await;
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

/// Publish-subscribe (XEP-0060, PEP XEP-0163): nodes created (a second
/// creation a conflict), read, listed by name in byte order per service,
/// reconfigured and deleted with their items, subscriptions and
/// affiliations; writes to a missing node refused with nothing written;
/// items newest first (republishing an id replaces it and makes it the
/// newest), trimmed to `max_items` in the publication (the removed ids
/// oldest first), read with a maximum and by id, retracted, purged and
/// trimmed; the newest item of every node in one call; several
/// subscriptions per JID, replaced, removed one or all, listed per JID;
/// affiliations set, replaced and deleted by `none`, listed per JID;
/// account deletion: the account's PEP service, and its bare and full-JID
/// rows on other services, while JIDs that merely share a prefix (or that
/// a LIKE pattern of the JID would match) keep theirs. Names, ids and
/// payloads that look like SQL or are not ASCII are data.
pub async fn pubsub(s: &Storage) {
    use starling_core::storage::{PubsubSubscription, StoredItem, StoredNode};
    let p = s.pubsub.as_ref();
    let node = |service: &str, name: &str, config: &str, created_at| StoredNode {
        service: service.to_owned(),
        node: name.to_owned(),
        config: config.to_owned(),
        created_at,
    };
    let item = |id: &str, payload: &str, seq| StoredItem {
        id: id.to_owned(),
        publisher: "alice@example.org/phone".to_owned(),
        payload: payload.to_owned(),
        seq,
    };
    let sub = |j: &str, subid: &str, state: &str, options: &str| PubsubSubscription {
        jid: j.to_owned(),
        subid: subid.to_owned(),
        state: state.to_owned(),
        options: options.to_owned(),
    };
    let item_ids = |items: Vec<StoredItem>| -> Vec<String> {
        items.into_iter().map(|i| i.id).collect::<Vec<_>>()
    };
    let strings = |v: &[&str]| -> Vec<String> { v.iter().map(|x| (*x).to_owned()).collect() };
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    };
    let pep = "alice@example.org";
    let svc = "pubsub.example.org";
    let blog = "urn:xmpp:microblog:0";

    // Nothing yet; reads and deletions of a missing node are no errors.
    assert_eq!(p.node(pep, blog).await.unwrap(), None);
    assert!(p.nodes(pep).await.unwrap().is_empty());
    assert!(!p.set_node_config(pep, blog, "c").await.unwrap());
    assert!(!p.delete_node(pep, blog).await.unwrap());
    assert!(p.items(pep, blog, None).await.unwrap().is_empty());
    assert!(p.last_items(pep).await.unwrap().is_empty());
    assert!(!p.retract(pep, blog, "a").await.unwrap());
    assert_eq!(p.purge(pep, blog).await.unwrap(), 0);
    assert!(p.trim(pep, blog, 1).await.unwrap().is_empty());
    assert_eq!(
        p.remove_subscription(pep, blog, "bob@example.org", None)
            .await
            .unwrap(),
        0
    );
    // Writes to a missing node are refused, and write nothing.
    assert!(matches!(
        p.publish(pep, blog, &item("a", "<a/>", 1), None).await,
        Err(StorageError::Backend(_))
    ));
    assert!(matches!(
        p.set_subscription(pep, blog, &sub("bob@example.org", "s1", "subscribed", ""))
            .await,
        Err(StorageError::Backend(_))
    ));
    assert!(matches!(
        p.set_affiliation(pep, blog, "bob@example.org", "member")
            .await,
        Err(StorageError::Backend(_))
    ));
    assert!(p.items(pep, blog, None).await.unwrap().is_empty());
    assert!(p.subscriptions(pep, blog).await.unwrap().is_empty());
    assert!(p.affiliations(pep, blog).await.unwrap().is_empty());
    assert!(p
        .subscriptions_of(pep, "bob@example.org")
        .await
        .unwrap()
        .is_empty());
    assert!(p
        .affiliations_of(pep, "bob@example.org")
        .await
        .unwrap()
        .is_empty());

    // Create, conflict, read; the config is stored verbatim.
    let evil_config = "v1'); DROP TABLE pubsub_nodes; --\n{\"access\":\"presence\"}";
    let created = node(pep, blog, evil_config, 1_700_000_000_123);
    p.create_node(&created).await.unwrap();
    assert_eq!(p.node(pep, blog).await.unwrap().as_ref(), Some(&created));
    assert!(matches!(
        p.create_node(&node(pep, blog, "other", 5)).await,
        Err(StorageError::Conflict)
    ));
    assert_eq!(p.node(pep, blog).await.unwrap().as_ref(), Some(&created));
    // The same name on another service is another node.
    let svc_blog = node(svc, blog, "svc", 7);
    p.create_node(&svc_blog).await.unwrap();
    assert_eq!(p.node(svc, blog).await.unwrap().as_ref(), Some(&svc_blog));
    assert_eq!(p.node(pep, blog).await.unwrap().as_ref(), Some(&created));

    // Listing: by name in byte order (a locale would sort differently),
    // per service.
    let evil_node = "robert');DROP TABLE pubsub_items;--";
    for name in [
        "zebra",
        "ünïcødé ✓",
        "élan",
        "a-node",
        "ab",
        evil_node,
        "100%_sure",
    ] {
        p.create_node(&node(pep, name, name, 1)).await.unwrap();
    }
    let all = [
        "100%_sure",
        "a-node",
        "ab",
        evil_node,
        blog,
        "zebra",
        "élan",
        "ünïcødé ✓",
    ];
    let names = |nodes: Vec<StoredNode>| -> Vec<String> {
        nodes
            .into_iter()
            .map(|n| {
                assert_eq!(n.service, pep);
                n.node
            })
            .collect()
    };
    assert_eq!(names(p.nodes(pep).await.unwrap()), all);
    assert_eq!(p.nodes(svc).await.unwrap(), std::slice::from_ref(&svc_blog));
    assert!(p.nodes("alice2@example.org").await.unwrap().is_empty());

    // Reconfiguration: the config only.
    assert!(p
        .set_node_config(pep, "zebra", "new ' config")
        .await
        .unwrap());
    assert_eq!(
        p.node(pep, "zebra").await.unwrap(),
        Some(node(pep, "zebra", "new ' config", 1))
    );
    assert_eq!(p.node(svc, blog).await.unwrap().as_ref(), Some(&svc_blog));

    // Publication order; a republished id replaces its item and becomes
    // the newest.
    assert!(p
        .publish(pep, blog, &item("a", "<entry>1</entry>", 10), None)
        .await
        .unwrap()
        .is_empty());
    p.publish(pep, blog, &item("b", "<entry>2</entry>", 20), None)
        .await
        .unwrap();
    p.publish(pep, blog, &item("c", "<entry>3</entry>", 30), None)
        .await
        .unwrap();
    assert_eq!(
        p.items(pep, blog, None).await.unwrap(),
        [
            item("c", "<entry>3</entry>", 30),
            item("b", "<entry>2</entry>", 20),
            item("a", "<entry>1</entry>", 10)
        ]
    );
    assert_eq!(
        item_ids(p.items(pep, blog, Some(2)).await.unwrap()),
        ["c", "b"]
    );
    assert!(p.items(pep, blog, Some(0)).await.unwrap().is_empty());
    assert!(
        p.items(svc, blog, None).await.unwrap().is_empty(),
        "per service"
    );
    // The per-account quota's count: payload bytes (UTF-8, not
    // characters) of every node of the service, one item left out.
    assert_eq!(p.stored_bytes(pep, None).await.unwrap(), 3 * 16);
    assert_eq!(
        p.stored_bytes(pep, Some((blog, "b"))).await.unwrap(),
        2 * 16
    );
    assert_eq!(
        p.stored_bytes(pep, Some(("zebra", "b"))).await.unwrap(),
        3 * 16
    );
    assert_eq!(p.stored_bytes(svc, None).await.unwrap(), 0);
    p.publish(pep, "élan", &item("u", "<é/>", 1), None)
        .await
        .unwrap();
    assert_eq!(p.stored_bytes(pep, None).await.unwrap(), 3 * 16 + 5);
    assert!(p.retract(pep, "élan", "u").await.unwrap());
    assert_eq!(p.stored_bytes(pep, None).await.unwrap(), 3 * 16);
    // A pubsub service's per-owner count: the items of the nodes the JID
    // owns, whoever published them.
    let o = "owner@example.org";
    p.create_node(&node(svc, "owned", "c", 1)).await.unwrap();
    p.set_affiliation(svc, "owned", o, "owner").await.unwrap();
    p.set_affiliation(svc, "owned", "pub@example.org", "publisher")
        .await
        .unwrap();
    p.publish(svc, "owned", &item("a", "<entry>1</entry>", 1), None)
        .await
        .unwrap();
    p.publish(svc, "owned", &item("b", "<é/>", 2), None)
        .await
        .unwrap();
    assert_eq!(p.owned_bytes(svc, o, None).await.unwrap(), 16 + 5);
    assert_eq!(
        p.owned_bytes(svc, o, Some(("owned", "a"))).await.unwrap(),
        5
    );
    assert_eq!(
        p.owned_bytes(svc, "pub@example.org", None).await.unwrap(),
        0
    );
    assert_eq!(p.owned_bytes(pep, o, None).await.unwrap(), 0);
    assert!(p.delete_node(svc, "owned").await.unwrap());
    assert_eq!(p.owned_bytes(svc, o, None).await.unwrap(), 0);
    let mut republished = item("a", "<entry>1, edited</entry>", 40);
    republished.publisher = "alice@example.org/laptop".to_owned();
    assert!(p
        .publish(pep, blog, &republished, Some(3))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        p.items(pep, blog, None).await.unwrap(),
        [
            republished.clone(),
            item("c", "<entry>3</entry>", 30),
            item("b", "<entry>2</entry>", 20)
        ]
    );

    // max_items: the oldest go, in the publication's transaction, and
    // their ids come back oldest first.
    assert_eq!(
        p.publish(pep, blog, &item("d", "<d/>", 50), Some(3))
            .await
            .unwrap(),
        ["b"]
    );
    assert_eq!(
        item_ids(p.items(pep, blog, None).await.unwrap()),
        ["d", "a", "c"]
    );
    assert_eq!(
        p.publish(pep, blog, &item("e", "<e/>", 60), Some(1))
            .await
            .unwrap(),
        ["c", "a", "d"]
    );
    assert_eq!(item_ids(p.items(pep, blog, None).await.unwrap()), ["e"]);
    // Replacing the one item kept is no removal.
    assert!(p
        .publish(pep, blog, &item("e", "<e2/>", 61), Some(1))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        p.items(pep, blog, None).await.unwrap(),
        [item("e", "<e2/>", 61)]
    );
    // Some(0) keeps nothing, the new item included.
    assert_eq!(
        p.publish(pep, blog, &item("f", "<f/>", 70), Some(0))
            .await
            .unwrap(),
        ["e", "f"]
    );
    assert!(p.items(pep, blog, None).await.unwrap().is_empty());

    // Items by id: those that exist, newest first, each once.
    for (i, id) in ["x1", "x2", "x3", "x4", "x5"].into_iter().enumerate() {
        p.publish(pep, blog, &item(id, id, 100 * (i as i64 + 1)), None)
            .await
            .unwrap();
    }
    assert_eq!(
        item_ids(
            p.items_by_id(pep, blog, &strings(&["x2", "x4", "missing", "x2"]))
                .await
                .unwrap()
        ),
        ["x4", "x2"]
    );
    assert!(p.items_by_id(pep, blog, &[]).await.unwrap().is_empty());
    assert!(p
        .items_by_id(pep, "zebra", &strings(&["x1"]))
        .await
        .unwrap()
        .is_empty());
    assert!(p
        .items_by_id(svc, blog, &strings(&["x1"]))
        .await
        .unwrap()
        .is_empty());
    // More ids than one statement binds.
    let mut many: Vec<String> = (0..1200).map(|i| format!("nope-{i}")).collect();
    many.insert(700, "x1".to_owned());
    many.push("x5".to_owned());
    many.insert(3, "x3".to_owned());
    assert_eq!(
        item_ids(p.items_by_id(pep, blog, &many).await.unwrap()),
        ["x5", "x3", "x1"]
    );

    // Retract, trim, purge.
    assert!(p.retract(pep, blog, "x3").await.unwrap());
    assert!(!p.retract(pep, blog, "x3").await.unwrap());
    assert!(!p.retract(svc, blog, "x4").await.unwrap(), "per service");
    assert_eq!(
        item_ids(p.items(pep, blog, None).await.unwrap()),
        ["x5", "x4", "x2", "x1"]
    );
    assert_eq!(p.trim(pep, blog, 2).await.unwrap(), ["x1", "x2"]);
    assert_eq!(
        item_ids(p.items(pep, blog, None).await.unwrap()),
        ["x5", "x4"]
    );
    assert!(p.trim(pep, blog, 2).await.unwrap().is_empty());
    assert!(p.trim(pep, blog, 5).await.unwrap().is_empty());
    p.publish(svc, blog, &item("s", "<s/>", 1), None)
        .await
        .unwrap();
    assert_eq!(p.purge(pep, blog).await.unwrap(), 2);
    assert_eq!(p.purge(pep, blog).await.unwrap(), 0);
    assert!(p.items(pep, blog, None).await.unwrap().is_empty());
    assert_eq!(item_ids(p.items(svc, blog, None).await.unwrap()), ["s"]);

    // SQL-looking and non-ASCII names, ids and payloads are data.
    let evil_id = "'; DELETE FROM pubsub_items; --";
    let payload = "<x xmlns='urn:x'>ünïcødé ✓ 😀 \\ % _ \"q\" ' ; --</x>";
    let evil_item = item(evil_id, payload, 5);
    p.publish(pep, evil_node, &evil_item, Some(10))
        .await
        .unwrap();
    p.publish(pep, evil_node, &item("😀 id", "", 6), Some(10))
        .await
        .unwrap();
    assert_eq!(
        p.items(pep, evil_node, None).await.unwrap(),
        [item("😀 id", "", 6), evil_item.clone()]
    );
    assert_eq!(
        p.items_by_id(pep, evil_node, &strings(&[evil_id]))
            .await
            .unwrap(),
        [evil_item]
    );

    // The newest item of every node that has one, by node name: items
    // published out of seq order, a node without items, other services'
    // nodes and other accounts' PEP nodes are not mixed in.
    for (id, seq) in [("n1", 1), ("n3", 3), ("n2", 2)] {
        p.publish(pep, "a-node", &item(id, id, seq), None)
            .await
            .unwrap();
    }
    p.publish(pep, "ünïcødé ✓", &item("u", "<ü/>", 9), None)
        .await
        .unwrap();
    p.publish(pep, "élan", &item("old", "<old/>", 100), None)
        .await
        .unwrap();
    p.publish(pep, "élan", &item("new", "<new/>", 200), None)
        .await
        .unwrap();
    p.create_node(&node("alice2@example.org", "a-node", "", 1))
        .await
        .unwrap();
    p.publish("alice2@example.org", "a-node", &item("z", "", 999), None)
        .await
        .unwrap();
    assert_eq!(
        p.last_items(pep).await.unwrap(),
        [
            ("a-node".to_owned(), item("n3", "n3", 3)),
            (evil_node.to_owned(), item("😀 id", "", 6)),
            ("élan".to_owned(), item("new", "<new/>", 200)),
            ("ünïcødé ✓".to_owned(), item("u", "<ü/>", 9)),
        ]
    );
    assert_eq!(
        p.last_items(svc).await.unwrap(),
        [(blog.to_owned(), item("s", "<s/>", 1))]
    );
    // Republishing the oldest item makes it the last one.
    p.publish(pep, "élan", &item("old", "<old2/>", 300), None)
        .await
        .unwrap();
    assert_eq!(
        p.last_items(pep).await.unwrap()[2],
        ("élan".to_owned(), item("old", "<old2/>", 300))
    );

    // The last items of several services at once, with their nodes: the
    // same rows as per service; a service without nodes and a repeated
    // one add nothing.
    let mut expected = Vec::new();
    for service in [pep, svc, "alice2@example.org"] {
        let nodes = p.nodes(service).await.unwrap();
        for (n, it) in p.last_items(service).await.unwrap() {
            let node = nodes.iter().find(|x| x.node == n).unwrap().clone();
            expected.push((node, it));
        }
    }
    let key = |x: &(StoredNode, StoredItem)| (x.0.service.clone(), x.0.node.clone());
    expected.sort_by_key(key);
    let mut got = p
        .last_items_of(&strings(&[
            svc,
            pep,
            "nobody@example.org",
            "alice2@example.org",
            pep,
        ]))
        .await
        .unwrap();
    got.sort_by_key(key);
    assert_eq!(got, expected);
    assert_eq!(expected.len(), 6);
    assert!(p.last_items_of(&[]).await.unwrap().is_empty());

    // Subscriptions: several per JID (by subid), bare and full JIDs apart,
    // listed by JID then subid.
    let bob = "bob@example.org";
    let bob_laptop = "bob@example.org/laptop";
    for x in [
        sub(bob, "s2", "pending", "opts'; --"),
        sub("carol@example.org/phone", "s1", "unconfigured", ""),
        sub(bob_laptop, "s3", "subscribed", ""),
        sub(bob, "s1", "subscribed", ""),
    ] {
        p.set_subscription(pep, "a-node", &x).await.unwrap();
    }
    p.set_subscription(pep, "ab", &sub(bob, "s9", "subscribed", ""))
        .await
        .unwrap();
    p.set_subscription(svc, blog, &sub(bob, "s1", "subscribed", ""))
        .await
        .unwrap();
    assert_eq!(
        p.subscriptions(pep, "a-node").await.unwrap(),
        [
            sub(bob, "s1", "subscribed", ""),
            sub(bob, "s2", "pending", "opts'; --"),
            sub(bob_laptop, "s3", "subscribed", ""),
            sub("carol@example.org/phone", "s1", "unconfigured", ""),
        ]
    );
    // Replaced in place by (jid, subid).
    p.set_subscription(pep, "a-node", &sub(bob, "s2", "subscribed", "o2"))
        .await
        .unwrap();
    assert_eq!(
        p.subscriptions(pep, "a-node").await.unwrap()[1],
        sub(bob, "s2", "subscribed", "o2")
    );
    assert_eq!(p.subscriptions(pep, "a-node").await.unwrap().len(), 4);
    // A JID's subscriptions on a service, by node; JIDs compared as
    // stored (the full JID is another subscriber).
    assert_eq!(
        p.subscriptions_of(pep, bob).await.unwrap(),
        [
            ("a-node".to_owned(), sub(bob, "s1", "subscribed", "")),
            ("a-node".to_owned(), sub(bob, "s2", "subscribed", "o2")),
            ("ab".to_owned(), sub(bob, "s9", "subscribed", "")),
        ]
    );
    assert_eq!(
        p.subscriptions_of(pep, bob_laptop).await.unwrap(),
        [("a-node".to_owned(), sub(bob_laptop, "s3", "subscribed", ""))]
    );
    assert_eq!(
        p.subscriptions_of(svc, bob).await.unwrap(),
        [(blog.to_owned(), sub(bob, "s1", "subscribed", ""))]
    );
    // Removal: one subid, then all of a JID's; nobody else's.
    assert_eq!(
        p.remove_subscription(pep, "a-node", bob, Some("s1"))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        p.remove_subscription(pep, "a-node", bob, Some("s1"))
            .await
            .unwrap(),
        0
    );
    p.set_subscription(pep, "a-node", &sub(bob, "s4", "subscribed", ""))
        .await
        .unwrap();
    assert_eq!(
        p.remove_subscription(pep, "a-node", bob, None)
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        p.subscriptions(pep, "a-node").await.unwrap(),
        [
            sub(bob_laptop, "s3", "subscribed", ""),
            sub("carol@example.org/phone", "s1", "unconfigured", ""),
        ]
    );
    assert_eq!(
        p.subscriptions_of(pep, bob).await.unwrap(),
        [("ab".to_owned(), sub(bob, "s9", "subscribed", ""))]
    );
    assert_eq!(p.subscriptions(svc, blog).await.unwrap().len(), 1);

    // Affiliations: set, replaced, `none` deletes; by JID.
    p.set_affiliation(pep, "a-node", pep, "owner")
        .await
        .unwrap();
    p.set_affiliation(pep, "a-node", bob, "publisher")
        .await
        .unwrap();
    p.set_affiliation(pep, "a-node", "carol@example.org", "member")
        .await
        .unwrap();
    p.set_affiliation(pep, "ab", bob, "publish-only")
        .await
        .unwrap();
    p.set_affiliation(svc, blog, bob, "owner").await.unwrap();
    assert_eq!(
        p.affiliations(pep, "a-node").await.unwrap(),
        pairs(&[
            (pep, "owner"),
            (bob, "publisher"),
            ("carol@example.org", "member")
        ])
    );
    p.set_affiliation(pep, "a-node", bob, "outcast")
        .await
        .unwrap();
    p.set_affiliation(pep, "a-node", "carol@example.org", "none")
        .await
        .unwrap();
    p.set_affiliation(pep, "a-node", "nobody@example.org", "none")
        .await
        .unwrap();
    assert_eq!(
        p.affiliations(pep, "a-node").await.unwrap(),
        pairs(&[(pep, "owner"), (bob, "outcast")])
    );
    assert_eq!(
        p.affiliations_of(pep, bob).await.unwrap(),
        pairs(&[("a-node", "outcast"), ("ab", "publish-only")])
    );
    assert_eq!(
        p.affiliations_of(svc, bob).await.unwrap(),
        pairs(&[(blog, "owner")])
    );

    // Deleting a node deletes its items, subscriptions and affiliations,
    // nothing else; a node created again under its name starts empty.
    assert!(p.delete_node(pep, "a-node").await.unwrap());
    assert!(!p.delete_node(pep, "a-node").await.unwrap());
    assert_eq!(p.node(pep, "a-node").await.unwrap(), None);
    assert!(p.items(pep, "a-node", None).await.unwrap().is_empty());
    assert!(p.subscriptions(pep, "a-node").await.unwrap().is_empty());
    assert!(p.affiliations(pep, "a-node").await.unwrap().is_empty());
    assert_eq!(
        p.affiliations_of(pep, bob).await.unwrap(),
        pairs(&[("ab", "publish-only")])
    );
    assert!(p
        .subscriptions_of(pep, bob_laptop)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(p.subscriptions_of(pep, bob).await.unwrap().len(), 1);
    assert_eq!(p.items(pep, "élan", None).await.unwrap().len(), 2);
    assert_eq!(
        p.items("alice2@example.org", "a-node", None)
            .await
            .unwrap()
            .len(),
        1
    );
    p.create_node(&node(pep, "a-node", "again", 2))
        .await
        .unwrap();
    assert!(p.items(pep, "a-node", None).await.unwrap().is_empty());
    assert!(p.subscriptions(pep, "a-node").await.unwrap().is_empty());
    assert!(p.affiliations(pep, "a-node").await.unwrap().is_empty());
    assert_eq!(names(p.nodes(pep).await.unwrap()), all);

    // remove_user: the account's PEP service and what its bare and full
    // JIDs hold elsewhere; JIDs sharing a prefix keep theirs.
    let news = "news";
    p.create_node(&node(svc, news, "", 3)).await.unwrap();
    let gone = [
        pep,
        "alice@example.org/phone",
        "alice@example.org/",
        "alice@example.org/a/b",
    ];
    let kept = [
        "alice2@example.org",
        "alice@example.or",
        "alice@example.org.evil",
        "alice@example.org0",
        "alice@example.orgx",
        "alice@example.org.evil/phone",
        "alice@example.orgx/phone",
        "bob@example.org/alice@example.org",
        "example.org",
    ];
    for j in gone.iter().chain(&kept) {
        p.set_subscription(svc, news, &sub(j, "s", "subscribed", ""))
            .await
            .unwrap();
        p.set_affiliation(svc, news, j, "member").await.unwrap();
    }
    // On bob's PEP service too, beside bob's own rows.
    let bob_pep = bob;
    p.create_node(&node(bob_pep, "urn:xmpp:avatar:metadata", "", 4))
        .await
        .unwrap();
    p.publish(
        bob_pep,
        "urn:xmpp:avatar:metadata",
        &item("h", "<h/>", 1),
        None,
    )
    .await
    .unwrap();
    for j in ["alice@example.org/phone", pep, bob] {
        p.set_subscription(
            bob_pep,
            "urn:xmpp:avatar:metadata",
            &sub(j, "s", "subscribed", ""),
        )
        .await
        .unwrap();
        p.set_affiliation(bob_pep, "urn:xmpp:avatar:metadata", j, "member")
            .await
            .unwrap();
    }
    // Others' rows on alice's PEP service go with it.
    p.set_subscription(pep, "ab", &sub("carol@example.org", "s", "subscribed", ""))
        .await
        .unwrap();
    // An account's subscriptions on a service: its bare JID and its full
    // JIDs, by node then JID; not the JIDs that only share a prefix, nor
    // other services'.
    let mut gone_sorted = gone.to_vec();
    gone_sorted.sort_unstable();
    assert_eq!(
        p.subscriptions_of_account(svc, &jid(pep)).await.unwrap(),
        gone_sorted
            .iter()
            .map(|j| (news.to_owned(), sub(j, "s", "subscribed", "")))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        p.subscriptions_of_account(bob_pep, &jid(pep))
            .await
            .unwrap()
            .len(),
        2
    );
    p.remove_user(&jid(pep)).await.unwrap();
    assert!(p
        .subscriptions_of_account(svc, &jid(pep))
        .await
        .unwrap()
        .is_empty());
    assert!(p.nodes(pep).await.unwrap().is_empty());
    assert!(p.last_items(pep).await.unwrap().is_empty());
    for name in all {
        assert!(p.items(pep, name, None).await.unwrap().is_empty());
        assert!(p.subscriptions(pep, name).await.unwrap().is_empty());
        assert!(p.affiliations(pep, name).await.unwrap().is_empty());
    }
    assert!(p.subscriptions_of(pep, bob).await.unwrap().is_empty());
    assert!(p.affiliations_of(pep, bob).await.unwrap().is_empty());
    let mut kept_sorted = kept.to_vec();
    kept_sorted.sort_unstable();
    assert_eq!(
        p.subscriptions(svc, news).await.unwrap(),
        kept_sorted
            .iter()
            .map(|j| sub(j, "s", "subscribed", ""))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        p.affiliations(svc, news).await.unwrap(),
        kept_sorted
            .iter()
            .map(|j| ((*j).to_owned(), "member".to_owned()))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        p.subscriptions(bob_pep, "urn:xmpp:avatar:metadata")
            .await
            .unwrap(),
        [sub(bob, "s", "subscribed", "")]
    );
    assert_eq!(
        p.affiliations(bob_pep, "urn:xmpp:avatar:metadata")
            .await
            .unwrap(),
        pairs(&[(bob, "member")])
    );
    assert_eq!(
        item_ids(
            p.items(bob_pep, "urn:xmpp:avatar:metadata", None)
                .await
                .unwrap()
        ),
        ["h"]
    );
    assert_eq!(
        p.last_items("alice2@example.org").await.unwrap(),
        [("a-node".to_owned(), item("z", "", 999))]
    );
    assert_eq!(p.nodes(svc).await.unwrap().len(), 2);
    assert_eq!(p.subscriptions(svc, blog).await.unwrap().len(), 1);
    p.remove_user(&jid(pep)).await.unwrap();

    // LIKE wildcards in a JID match nothing else.
    let odd = "a_b%c@example.org";
    let lookalikes = [
        "axbyc@example.org",
        "axbyc@example.org/r",
        "a_b%cz@example.org/r",
        "a_b%c@example.orgz",
    ];
    for j in [odd, "a_b%c@example.org/r"].iter().chain(&lookalikes) {
        p.set_subscription(svc, news, &sub(j, "s", "subscribed", ""))
            .await
            .unwrap();
        p.set_affiliation(svc, news, j, "member").await.unwrap();
    }
    p.remove_user(&jid(odd)).await.unwrap();
    let mut kept_now: Vec<&str> = kept.iter().chain(&lookalikes).copied().collect();
    kept_now.sort_unstable();
    assert_eq!(
        p.subscriptions(svc, news)
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.jid)
            .collect::<Vec<_>>(),
        kept_now
    );
    assert_eq!(
        p.affiliations(svc, news)
            .await
            .unwrap()
            .into_iter()
            .map(|(j, _)| j)
            .collect::<Vec<_>>(),
        kept_now
    );

    // Account deletion removes them too.
    let dora = jid("dora@example.org");
    s.accounts.create(&dora, &creds("pw")).await.unwrap();
    p.create_node(&node("dora@example.org", "urn:xmpp:nick", "", 1))
        .await
        .unwrap();
    p.publish(
        "dora@example.org",
        "urn:xmpp:nick",
        &item("n", "<nick/>", 1),
        None,
    )
    .await
    .unwrap();
    p.set_subscription(
        svc,
        news,
        &sub("dora@example.org/tablet", "s", "subscribed", ""),
    )
    .await
    .unwrap();
    p.set_affiliation(svc, blog, "dora@example.org", "publisher")
        .await
        .unwrap();
    assert!(s.delete_account(&dora).await.unwrap());
    assert!(p.nodes("dora@example.org").await.unwrap().is_empty());
    assert!(p
        .items("dora@example.org", "urn:xmpp:nick", None)
        .await
        .unwrap()
        .is_empty());
    assert!(p
        .subscriptions_of(svc, "dora@example.org/tablet")
        .await
        .unwrap()
        .is_empty());
    assert!(p
        .affiliations_of(svc, "dora@example.org")
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        p.affiliations(svc, blog).await.unwrap(),
        pairs(&[(bob, "owner")])
    );

    // Concurrent publications to one node take turns: the max_items
    // newest stay, every other item is reported removed exactly once.
    let race = "race";
    p.create_node(&node(svc, race, "", 5)).await.unwrap();
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                s.pubsub
                    .publish(
                        "pubsub.example.org",
                        "race",
                        &StoredItem {
                            id: format!("r{i:02}"),
                            publisher: String::new(),
                            payload: String::new(),
                            seq: i,
                        },
                        Some(3),
                    )
                    .await
            })
        })
        .collect();
    let mut removed = Vec::new();
    for t in tasks {
        removed.extend(t.await.expect("publish task").unwrap());
    }
    removed.sort();
    assert_eq!(
        removed,
        (0..17).map(|i| format!("r{i:02}")).collect::<Vec<_>>()
    );
    assert_eq!(
        item_ids(p.items(svc, race, None).await.unwrap()),
        ["r19", "r18", "r17"]
    );
    // A node deleted while subscriptions and affiliations are written
    // leaves none of them behind.
    for round in 0..5 {
        let tasks: Vec<_> = (0..6)
            .map(|i| {
                let s = s.clone();
                tokio::spawn(async move {
                    let j = format!("user{i}@example.org");
                    let sub = PubsubSubscription {
                        jid: j.clone(),
                        subid: format!("{round}"),
                        state: "subscribed".to_owned(),
                        options: String::new(),
                    };
                    // Refused once the node is gone: either is fine.
                    let _ = s
                        .pubsub
                        .set_subscription("pubsub.example.org", "race", &sub)
                        .await;
                    let _ = s
                        .pubsub
                        .set_affiliation("pubsub.example.org", "race", &j, "member")
                        .await;
                })
            })
            .collect();
        assert!(p.delete_node(svc, race).await.unwrap());
        for t in tasks {
            t.await.expect("subscribe task");
        }
        assert!(p.subscriptions(svc, race).await.unwrap().is_empty());
        assert!(p.affiliations(svc, race).await.unwrap().is_empty());
        assert!(p.items(svc, race, None).await.unwrap().is_empty());
        p.create_node(&node(svc, race, "", 5)).await.unwrap();
    }
}
