//! The conformance suite every backend must pass (DESIGN.md invariant 6).
//!
//! Each function takes a fresh, empty [`Storage`] and panics on the first
//! deviation. Backends call them from their own tests (see
//! `tests/conformance_sqlite.rs`); a PostgreSQL backend runs the very same
//! functions.

use starling_core::storage::{Storage, StorageError};
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

/// Runs every conformance test, each on a fresh storage from `make`.
pub async fn run_all<F, Fut>(mut make: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Storage>,
{
    accounts(&make().await).await;
}
