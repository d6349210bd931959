//! The conformance suite of the last-activity store, which both engines
//! pass (the scenario tests' `stores` module runs it on the backend the
//! tests run on). Each function takes a fresh, empty [`Storage`] opened
//! with every module's schema and owned data (`modules::open_storage`).

use starling_core::storage::{Storage, StoreSuite};
use starling_proto::BareJid;

/// The suite, for `Module::STORE_SUITES`.
pub const SUITES: &[StoreSuite] = &[("last activity", |s| Box::pin(last_activity(s)))];

/// A record is replaced by the next logout (status text stored verbatim,
/// SQL-looking or empty), one account's never another's, and removed with
/// the account.
pub async fn last_activity(s: &Storage) {
    let l = super::open(s);
    let alice = BareJid::new("alice@example.org").unwrap();
    let bob = BareJid::new("bob@example.org").unwrap();
    assert_eq!(l.get(&alice).await.unwrap(), None);
    let evil = "gone'); DELETE FROM last_activity; --";
    l.set(&alice, 1_700_000_000, evil).await.unwrap();
    l.set(&bob, 1_600_000_000, "bye").await.unwrap();
    assert_eq!(
        l.get(&alice).await.unwrap(),
        Some((1_700_000_000, evil.to_owned()))
    );
    l.set(&alice, 1_700_000_100, "").await.unwrap();
    assert_eq!(
        l.get(&alice).await.unwrap(),
        Some((1_700_000_100, String::new()))
    );
    assert_eq!(
        l.get(&bob).await.unwrap(),
        Some((1_600_000_000, "bye".to_owned()))
    );
    // Account deletion removes it (through the module's OwnedData).
    s.accounts.create(&alice, &[]).await.unwrap();
    assert!(s.delete_account(&alice).await.unwrap());
    assert_eq!(l.get(&alice).await.unwrap(), None);
    assert!(l.get(&bob).await.unwrap().is_some());
}
