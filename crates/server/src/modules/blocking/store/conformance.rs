//! The conformance suite of the block list store, which both engines pass
//! (the scenario tests' `stores` module runs it on the backend the tests
//! run on). Each function takes a fresh, empty [`Storage`] opened with
//! every module's schema and owned data (`modules::open_storage`).

use starling_core::storage::{Storage, StoreSuite};
use starling_proto::BareJid;

/// The suite, for `Module::STORE_SUITES`.
pub const SUITES: &[StoreSuite] = &[("block lists", |s| Box::pin(blocking(s)))];

/// Block lists: additions and removals report what changed in the
/// caller's order, each once (repeats in one call too); the list is
/// sorted; one account's list never another's; SQL-looking JIDs are data;
/// emptying returns what was there; account deletion removes the list.
pub async fn blocking(s: &Storage) {
    let b = super::open(s);
    let alice = BareJid::new("alice@example.org").unwrap();
    let bob = BareJid::new("bob@example.org").unwrap();
    let l = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(b.blocklist(&alice).await.unwrap().is_empty());
    assert_eq!(
        b.block(&alice, &l(&["x@y", "spam.example", "x@y"]))
            .await
            .unwrap(),
        ["x@y", "spam.example"]
    );
    assert_eq!(
        b.block(&alice, &l(&["x@y"])).await.unwrap(),
        Vec::<String>::new()
    );
    let evil = "a'); DELETE FROM blocklist; --@evil.example";
    assert_eq!(b.block(&bob, &l(&[evil])).await.unwrap(), [evil]);
    assert_eq!(b.blocklist(&alice).await.unwrap(), ["spam.example", "x@y"]);
    assert_eq!(
        b.unblock(&alice, &l(&["z@y", "x@y", "x@y"])).await.unwrap(),
        ["x@y"]
    );
    assert_eq!(b.unblock_all(&alice).await.unwrap(), ["spam.example"]);
    assert!(b.blocklist(&alice).await.unwrap().is_empty());
    assert_eq!(b.blocklist(&bob).await.unwrap(), [evil]);
    // Account deletion removes it (through the module's OwnedData).
    s.accounts.create(&bob, &[]).await.unwrap();
    assert!(s.delete_account(&bob).await.unwrap());
    assert!(b.blocklist(&bob).await.unwrap().is_empty());
}
