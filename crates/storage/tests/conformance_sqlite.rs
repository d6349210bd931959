//! The shared conformance suite on the SQLite backend.

use starling_storage::{conformance, open, open_with, BackendConfig};

fn temp_db() -> std::path::PathBuf {
    std::env::temp_dir()
        .join(format!("starling-conf-{}", starling_proto::random_id(12)))
        .join("db.sqlite")
}

#[tokio::test]
async fn sqlite_conformance_all_pass() {
    conformance::run_all(|| async {
        open(&BackendConfig::Sqlite {
            path: temp_db(),
            pool_size: 4,
        })
        .await
        .expect("open sqlite")
    })
    .await;
}

#[tokio::test]
async fn sqlite_archive_spread_over_several_buckets_reads_as_one() {
    let path = temp_db();
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
            path: temp_db(),
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
    let path = temp_db();
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
