//! The conformance suites of modules' own stores (a module keeps its
//! store in its folder: `modules/muc/store/`; it lists its suite as
//! `Module::STORE_SUITES`), on the backend the tests
//! run on: SQLite, or PostgreSQL with `STARLING_TEST_BACKEND=postgres`
//! (`scripts/test-all.sh` runs this module on both).

use starling_core::storage::Storage;
use starling_testkit::{test_pg_admin_url, TestDatabase};
use std::future::Future;

/// A fresh, empty database on the backend the tests run on, removed by
/// [`Fresh::remove`].
struct Fresh {
    dir: std::path::PathBuf,
    database: Option<TestDatabase>,
    backend: starling_storage::BackendConfig,
}

impl Fresh {
    async fn new() -> Fresh {
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
        Fresh {
            dir,
            database,
            backend,
        }
    }

    async fn remove(self) {
        if let Some(db) = self.database {
            db.drop_database().await;
        }
        let _ = std::fs::remove_dir_all(self.dir);
    }
}

/// Runs `suite` on a fresh storage opened as the server opens it (every
/// module's schema and owned data), then removes it.
async fn on_fresh<F, Fut>(suite: F)
where
    F: FnOnce(Storage) -> Fut,
    Fut: Future<Output = ()>,
{
    let fresh = Fresh::new().await;
    let storage = starling_server::modules::open_storage(&fresh.backend)
        .await
        .expect("open a fresh storage");
    suite(storage.clone()).await;
    storage.backend.close().await;
    fresh.remove().await;
}

/// Every module's store suites (`Module::STORE_SUITES`: group chat,
/// MUC Light blocking lists, last activity, block lists…), each on a fresh
/// storage. A module with a store of its own is covered by adding it to
/// the server's list of modules; nothing to add here.
#[tokio::test]
async fn every_module_store_passes_its_suite() {
    let suites = starling_server::modules::store_suites();
    let names: Vec<String> = suites
        .iter()
        .map(|(m, (n, _))| format!("{m}: {n}"))
        .collect();
    for want in [
        "muc: rooms and affiliations",
        "blocking: block lists",
        "last: last activity",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
    for (module, (name, run)) in suites {
        eprintln!("store suite {module}: {name}");
        on_fresh(|s| async move { run(&s).await }).await;
    }
}

/// A database opened by the storage crate alone (no module's tables, as
/// an older build made it) gets the modules' steps when the server opens
/// it: the group-chat tables are there and usable.
#[tokio::test]
async fn module_steps_are_applied_to_an_existing_database() {
    let fresh = Fresh::new().await;
    let backend = fresh.backend.clone();
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
    fresh.remove().await;
}
