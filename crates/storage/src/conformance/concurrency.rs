//! Stores raced by concurrent callers: quotas, take-alls, roster versions.

use super::{jid, rec};
use starling_core::storage::{ArchiveQuery, OfflineStoreError, RosterItem, Storage};

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
