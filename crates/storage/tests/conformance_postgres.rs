//! The shared conformance suite on the PostgreSQL backend, each function on
//! a fresh database, plus the migration runner's guarantees.
//!
//! Needs `STARLING_TEST_PG_URL`, an administrator URL such as
//! `postgres://postgres@127.0.0.1:55432/postgres` (`scripts/pg-test.sh start`
//! runs such a server). Without it the tests print `SKIPPED` and pass,
//! unless `STARLING_REQUIRE_PG=1` (as in `scripts/test-all.sh`), where they
//! fail.

use sqlx::Row;
use starling_storage::postgres::admin;
use starling_storage::{conformance, open, open_with, BackendConfig, OpenError};
use std::future::Future;
use std::sync::{Arc, Mutex};

fn admin_url() -> Option<String> {
    match std::env::var("STARLING_TEST_PG_URL") {
        Ok(u) if !u.trim().is_empty() => Some(u),
        _ => {
            assert!(
                std::env::var("STARLING_REQUIRE_PG").as_deref() != Ok("1"),
                "STARLING_REQUIRE_PG=1 but STARLING_TEST_PG_URL is not set (scripts/pg-test.sh start)"
            );
            eprintln!("SKIPPED: set STARLING_TEST_PG_URL (scripts/pg-test.sh start)");
            None
        }
    }
}

fn db_name() -> String {
    format!("starling_test_{}", starling_proto::random_id(12))
}

fn config(url: &str, pool_size: u32) -> BackendConfig {
    BackendConfig::Postgres {
        url: url.to_owned(),
        pool_size,
    }
}

/// Runs `body` with the URL of a fresh, empty database, and drops the
/// database afterwards, also when `body` panics.
async fn with_fresh_db<F, Fut>(admin_url: &str, body: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let name = db_name();
    let url = admin::create_database(admin_url, &name)
        .await
        .expect("create the test database");
    let outcome = tokio::spawn(body(url)).await;
    admin::drop_database(admin_url, &name)
        .await
        .expect("drop the test database");
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

async fn schema_rows(url: &str) -> Vec<(i64, String, i64)> {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let rows =
        sqlx::query("SELECT version, name, applied_at FROM starling_schema ORDER BY version")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
    pool.close().await;
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_conformance_all_pass() {
    let Some(admin_url) = admin_url() else { return };
    let created = Arc::new(Mutex::new(Vec::new()));
    let (a, c) = (admin_url.clone(), created.clone());
    let outcome = tokio::spawn(async move {
        conformance::run_all(|| {
            let (a, c) = (a.clone(), c.clone());
            async move {
                let name = db_name();
                c.lock().unwrap().push(name.clone());
                let url = admin::create_database(&a, &name).await.expect("create db");
                open(&config(&url, 4)).await.expect("open postgres")
            }
        })
        .await;
    })
    .await;
    let names = created.lock().unwrap().clone();
    for name in names {
        admin::drop_database(&admin_url, &name).await.unwrap();
    }
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_archive_spread_over_several_buckets_reads_as_one() {
    let Some(admin_url) = admin_url() else { return };
    with_fresh_db(&admin_url, |url| async move {
        let s = open_with(&config(&url, 4), &conformance::bucket_test_options())
            .await
            .unwrap();
        conformance::archive_buckets(&s).await;
        s.backend.close().await;
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let buckets: i64 = sqlx::query("SELECT COUNT(*) FROM archive_buckets")
            .fetch_one(&pool)
            .await
            .unwrap()
            .get(0);
        assert!(buckets >= 4, "only {buckets} bucket(s)");
        pool.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_reopen_keeps_data_and_applying_twice_is_a_no_op() {
    let Some(admin_url) = admin_url() else { return };
    with_fresh_db(&admin_url, |url| async move {
        let s = open(&config(&url, 2)).await.unwrap();
        let applied = schema_rows(&url).await;
        assert_eq!(
            applied
                .iter()
                .map(|r| (r.0, r.1.as_str()))
                .collect::<Vec<_>>(),
            [
                (1, "accounts"),
                (2, "im-core"),
                (3, "offline"),
                (4, "archive-inbox"),
                (5, "inbox-unindexed"),
                (6, "fast-tokens"),
                (7, "archive-buckets"),
                (9, "inbox-groups"),
                (11, "pubsub"),
                (12, "admin"),
                (13, "domains"),
                (14, "inbox-log"),
                (15, "archive-owner-buckets"),
                (16, "account-changes")
            ]
        );
        let jid = starling_proto::BareJid::new("dora@example.org").unwrap();
        s.accounts.create(&jid, &[]).await.unwrap();
        s.backend.close().await;
        let s = open(&config(&url, 2)).await.expect("reopen migrated db");
        assert!(s.accounts.exists(&jid).await.unwrap());
        assert_eq!(schema_rows(&url).await, applied, "nothing re-applied");
        s.backend.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_concurrent_first_open_by_several_pools_succeeds() {
    let Some(admin_url) = admin_url() else { return };
    with_fresh_db(&admin_url, |url| async move {
        let opens: Vec<_> = (0..4)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move { open(&config(&url, 2)).await })
            })
            .collect();
        for o in opens {
            let s = o.await.unwrap().expect("concurrent open succeeds");
            s.backend.close().await;
        }
        // The storage crate's own steps (a module's come with the server).
        assert_eq!(schema_rows(&url).await.len(), 14, "each migration once");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_newer_schema_is_refused() {
    let Some(admin_url) = admin_url() else { return };
    with_fresh_db(&admin_url, |url| async move {
        open(&config(&url, 1)).await.unwrap().backend.close().await;
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        sqlx::query(
            "INSERT INTO starling_schema (version, name, applied_at) VALUES (999, 'future', 0)",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
        match open(&config(&url, 1)).await {
            Err(OpenError::TooNew { found: 999, .. }) => {}
            Err(e) => panic!("unexpected error: {e}"),
            Ok(_) => panic!("a newer schema was accepted"),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_missing_database_explains_how_to_create_it() {
    let Some(admin_url) = admin_url() else { return };
    let url = admin::with_database(&admin_url, &db_name()).unwrap();
    let err = open(&config(&url, 1))
        .await
        .err()
        .expect("the database does not exist")
        .to_string();
    assert!(err.contains("does not exist"), "{err}");
    assert!(err.contains("createdb"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_over_tls_with_sslmode_require() {
    let Some(admin_url) = admin_url() else { return };
    let pool = sqlx::PgPool::connect(&admin_url).await.unwrap();
    let ssl: String = sqlx::query("SHOW ssl")
        .fetch_one(&pool)
        .await
        .unwrap()
        .get(0);
    pool.close().await;
    if ssl != "on" {
        eprintln!("SKIPPED: the server at STARLING_TEST_PG_URL has ssl = off");
        return;
    }
    with_fresh_db(&admin_url, |url| async move {
        let tls_url = format!("{url}?sslmode=require");
        let s = open(&config(&tls_url, 1)).await.expect("open over TLS");
        let jid = starling_proto::BareJid::new("tls@example.org").unwrap();
        s.accounts.create(&jid, &[]).await.unwrap();
        s.backend.close().await;
        let pool = sqlx::PgPool::connect(&tls_url).await.unwrap();
        let on_tls: bool = sqlx::query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .unwrap()
            .get(0);
        assert!(on_tls, "sslmode=require gives a TLS connection");
        pool.close().await;
    })
    .await;
}
