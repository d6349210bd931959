//! The shared conformance suite on the SQLite backend.

use starling_storage::{conformance, open, open_with, BackendConfig};

/// The scratch databases of one test, removed when the test ends, passed
/// or failed (a full archive suite leaves a WAL of over 100 MB).
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new() -> Scratch {
        Scratch(
            std::env::temp_dir().join(format!("starling-conf-{}", starling_proto::random_id(12))),
        )
    }

    /// A fresh database path inside the scratch directory.
    fn db(&self) -> std::path::PathBuf {
        self.0.join(starling_proto::random_id(8)).join("db.sqlite")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn sqlite_conformance_all_pass() {
    let scratch = Scratch::new();
    conformance::run_all(|| async {
        open(&BackendConfig::Sqlite {
            path: scratch.db(),
            pool_size: 4,
        })
        .await
        .expect("open sqlite")
    })
    .await;
}

#[tokio::test]
async fn sqlite_archive_spread_over_several_buckets_reads_as_one() {
    let scratch = Scratch::new();
    let path = scratch.db();
    let cfg = BackendConfig::Sqlite {
        path: path.clone(),
        pool_size: 4,
    };
    let options = conformance::bucket_test_options();
    let s = open_with(&cfg, &options).await.unwrap();
    conformance::archive_buckets(&s).await;
    // The writes above did open several buckets (the test would pass
    // trivially with one).
    let pool = sqlx::SqlitePool::connect(&format!("sqlite:{}", path.display()))
        .await
        .unwrap();
    let (buckets, first): (i64, i64) =
        sqlx::query_as("SELECT COUNT(*), MIN(first_id) FROM archive_buckets")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(buckets >= 4, "only {buckets} bucket(s)");
    assert_eq!(first, 0);
    // The general suites hold with small buckets too.
    let fresh = || async {
        let cfg = BackendConfig::Sqlite {
            path: scratch.db(),
            pool_size: 4,
        };
        open_with(&cfg, &options).await.unwrap()
    };
    conformance::archive(&fresh().await).await;
    conformance::inbox(&fresh().await).await;
    conformance::offline_with_archive(&fresh().await).await;
}

#[tokio::test]
async fn sqlite_reopen_keeps_data_and_skips_applied_migrations() {
    let scratch = Scratch::new();
    let path = scratch.db();
    let cfg = BackendConfig::Sqlite {
        path: path.clone(),
        pool_size: 2,
    };
    let s = open(&cfg).await.unwrap();
    let jid = starling_proto::BareJid::new("dora@example.org").unwrap();
    s.accounts.create(&jid, &[]).await.unwrap();
    s.backend.close().await;
    let s = open(&cfg).await.expect("reopen migrated db");
    assert!(s.accounts.exists(&jid).await.unwrap());
}

/// The inbox suite holds whether the changes are still in the inbox log
/// (the default: reads apply them to the table's rows) or merged into the
/// table after every batch: both paths give the same answers
/// (`sqlite/inbox_log.rs`).
#[tokio::test]
async fn sqlite_inbox_reads_alike_from_the_log_and_from_the_merged_table() {
    let scratch = Scratch::new();
    let merged_each_batch = starling_storage::OpenOptions {
        inbox_merge_inline: true,
        ..Default::default()
    };
    let cfg = BackendConfig::Sqlite {
        path: scratch.db(),
        pool_size: 4,
    };
    conformance::inbox(&open_with(&cfg, &merged_each_batch).await.unwrap()).await;
    let cfg = BackendConfig::Sqlite {
        path: scratch.db(),
        pool_size: 4,
    };
    conformance::inbox(&open(&cfg).await.unwrap()).await;
}

/// A crash (no close) leaves committed inbox changes in the log only; the
/// next start merges them into the table before it serves anything.
#[tokio::test]
async fn sqlite_inbox_log_left_by_a_crash_is_merged_at_the_next_start() {
    let scratch = Scratch::new();
    use starling_core::storage::{ArchiveId, InboxQuery, InboxUpdate, UnreadChange};
    let path = scratch.db();
    let cfg = BackendConfig::Sqlite {
        path: path.clone(),
        pool_size: 2,
    };
    let never = starling_storage::OpenOptions {
        inbox_merge_secs: 3600,
        ..Default::default()
    };
    let alice = starling_proto::BareJid::new("alice@example.org").unwrap();
    let up = |remote: &str, last: i64, unread| InboxUpdate {
        owner: alice.clone(),
        remote: remote.into(),
        last: Some(ArchiveId(last)),
        unread,
        shared: false,
    };
    let crashed = open_with(&cfg, &never).await.unwrap();
    crashed
        .inbox
        .apply(&[
            up("bob@example.org", 10, UnreadChange::Add(1)),
            up("carol@example.org", 11, UnreadChange::Add(1)),
        ])
        .await
        .unwrap();
    crashed
        .inbox
        .apply(&[up("bob@example.org", 12, UnreadChange::Add(1))])
        .await
        .unwrap();
    let raw = sqlx::SqlitePool::connect(&format!("sqlite:{}", path.display()))
        .await
        .unwrap();
    let count = |sql: &'static str| {
        let raw = raw.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&raw)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        count("SELECT COUNT(*) FROM inbox").await,
        0,
        "not merged yet"
    );
    assert_eq!(count("SELECT COUNT(*) FROM inbox_log").await, 3);
    // The crashed instance is never closed; a new one starts on the file.
    let restarted = open_with(&cfg, &never).await.unwrap();
    assert_eq!(count("SELECT COUNT(*) FROM inbox_log").await, 0);
    assert_eq!(count("SELECT COUNT(*) FROM inbox").await, 2);
    let q = InboxQuery {
        limit: 10,
        ..Default::default()
    };
    let list = restarted.inbox.list(&alice, &q).await.unwrap();
    let got: Vec<(&str, i64, u32)> = list
        .iter()
        .map(|e| (e.remote.as_str(), e.last_id.0, e.unread))
        .collect();
    assert_eq!(
        got,
        vec![("bob@example.org", 12, 2), ("carol@example.org", 11, 1)]
    );
    // The crashed instance still holds its changes in memory: merging them
    // again (as it would) changes nothing.
    crashed.backend.close().await;
    let list = restarted.inbox.list(&alice, &q).await.unwrap();
    assert_eq!(
        list.iter().map(|e| e.unread).collect::<Vec<_>>(),
        vec![2, 1]
    );
    // A clean close leaves an empty log.
    restarted
        .inbox
        .apply(&[up("dave@example.org", 13, UnreadChange::Add(1))])
        .await
        .unwrap();
    assert_eq!(count("SELECT COUNT(*) FROM inbox_log").await, 1);
    restarted.backend.close().await;
    assert_eq!(count("SELECT COUNT(*) FROM inbox_log").await, 0);
    assert_eq!(count("SELECT COUNT(*) FROM inbox").await, 3);
}
