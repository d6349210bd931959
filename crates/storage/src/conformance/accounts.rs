//! Accounts: the account store, its change log and the auth caches over it,
//! FAST tokens.

use super::{creds, jid};
use starling_core::storage::{
    AccountStore, AuthCache, Storage, StorageError, ACCOUNT_CHANGES_KEPT,
};
use starling_proto::sasl::{ScramCredentials, ScramHash};
use starling_proto::BareJid;

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
