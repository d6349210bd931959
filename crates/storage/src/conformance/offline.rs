//! Offline messages (XEP-0160), alone and written with their archive rows.

use super::{creds, ids, jid, rec};
use starling_core::storage::{ArchiveQuery, OfflineStoreError, Storage};

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
