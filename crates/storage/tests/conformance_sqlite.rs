//! The shared conformance suite on the SQLite backend.

use starling_storage::{conformance, open, BackendConfig};

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
