//! The conformance suites of modules' own stores (a module keeps its
//! store in its folder: `modules/muc/store/`), on the backend the tests
//! run on: SQLite, or PostgreSQL with `STARLING_TEST_BACKEND=postgres`
//! (`scripts/test-all.sh` runs this module on both).

use starling_core::storage::Storage;
use starling_server::modules::blocking::store::conformance as blocking;
use starling_server::modules::last::store::conformance as last;
use starling_server::modules::muc::store::conformance;
use starling_testkit::{test_pg_admin_url, TestDatabase};
use std::future::Future;

/// Runs `suite` on a fresh storage opened as the server opens it (every
/// module's schema and owned data), then removes it.
async fn on_fresh<F, Fut>(suite: F)
where
    F: FnOnce(Storage) -> Fut,
    Fut: Future<Output = ()>,
{
    let dir =
        std::env::temp_dir().join(format!("starling-store-{}", starling_proto::random_id(12)));
    let database = match test_pg_admin_url() {
        Some(admin) => Some(TestDatabase::for_data_dir(&admin, &dir).await),
        None => None,
    };
    let backend = match &database {
        Some(db) => starling_storage::BackendConfig::Postgres {
            url: db.url.clone(),
            pool_size: 2,
        },
        None => starling_storage::BackendConfig::Sqlite {
            path: dir.join("starling.db"),
            pool_size: 2,
        },
    };
    let storage = starling_server::modules::open_storage(&backend)
        .await
        .expect("open a fresh storage");
    suite(storage.clone()).await;
    storage.backend.close().await;
    if let Some(db) = database {
        db.drop_database().await;
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// XEP-0045 rooms and affiliations (`MucStore`).
#[tokio::test]
async fn muc_rooms_and_affiliations() {
    on_fresh(|s| async move { conformance::muc(&s).await }).await;
}

/// MUC Light blocking lists.
#[tokio::test]
async fn muc_light_blocking_lists() {
    on_fresh(|s| async move { conformance::muc_light_blocking(&s).await }).await;
}

/// Removing a service domain removes its rooms and their archives.
#[tokio::test]
async fn muc_domain_removal() {
    on_fresh(|s| async move { conformance::muc_domain_removal(&s).await }).await;
}

/// Block lists (XEP-0191): changes reported in order, removed with the
/// account.
#[tokio::test]
async fn block_lists() {
    on_fresh(|s| async move { blocking::blocking(&s).await }).await;
}

/// Last activity (XEP-0012): replaced per logout, removed with the account.
#[tokio::test]
async fn last_activity_records() {
    on_fresh(|s| async move { last::last_activity(&s).await }).await;
}

/// A database opened by the storage crate alone (no module's tables, as
/// an older build made it) gets the modules' steps when the server opens
/// it: the group-chat tables are there and usable.
#[tokio::test]
async fn module_steps_are_applied_to_an_existing_database() {
    if test_pg_admin_url().is_some() {
        return; // the same code path on PostgreSQL; the SQLite file is enough
    }
    let dir =
        std::env::temp_dir().join(format!("starling-store-{}", starling_proto::random_id(12)));
    let backend = starling_storage::BackendConfig::Sqlite {
        path: dir.join("starling.db"),
        pool_size: 1,
    };
    let bare = starling_storage::open(&backend).await.unwrap();
    bare.backend.close().await;
    let s = starling_server::modules::open_storage(&backend)
        .await
        .unwrap();
    let room = starling_proto::BareJid::new("coffee@conference.example.org").unwrap();
    let muc = starling_server::modules::muc::store::open(&s);
    assert_eq!(muc.room(&room).await.unwrap(), None);
    let last = starling_server::modules::last::store::open(&s);
    assert_eq!(last.get(&room).await.unwrap(), None);
    assert_eq!(
        s.owned.iter().map(|o| o.name()).collect::<Vec<_>>(),
        ["blocking", "last", "muc"],
        "every module's own data is attached"
    );
    s.backend.close().await;
    let _ = std::fs::remove_dir_all(dir);
}
