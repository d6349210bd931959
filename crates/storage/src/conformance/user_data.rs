//! Per-user data: private documents, and account deletion removing
//! every concern's data.

use super::{creds, jid};
use starling_core::storage::{RosterItem, Storage};

/// Per-user documents, and account deletion removing every concern's
/// data.
pub async fn user_data(s: &Storage) {
    let alice = jid("alice@example.org");
    let d = s.user_data.as_ref();
    assert_eq!(d.get(&alice, "vcard", "").await.unwrap(), None);
    d.set(&alice, "vcard", "", "<vCard xmlns='vcard-temp'/>")
        .await
        .unwrap();
    d.set(
        &alice,
        "vcard",
        "",
        "<vCard xmlns='vcard-temp'><FN>A</FN></vCard>",
    )
    .await
    .unwrap();
    d.set(
        &alice,
        "private",
        "{storage:bookmarks}storage",
        "<storage/>",
    )
    .await
    .unwrap();
    assert!(d
        .get(&alice, "vcard", "")
        .await
        .unwrap()
        .unwrap()
        .contains("<FN>A</FN>"));
    d.delete(&alice, "private", "{storage:bookmarks}storage")
        .await
        .unwrap();
    assert_eq!(
        d.get(&alice, "private", "{storage:bookmarks}storage")
            .await
            .unwrap(),
        None
    );

    // delete_account removes every concern's rows.
    s.accounts.create(&alice, &creds("pw")).await.unwrap();
    s.roster
        .put_item(&alice, &RosterItem::new(jid("bob@example.org")))
        .await
        .unwrap();
    assert!(s.delete_account(&alice).await.unwrap());
    assert!(!s.accounts.exists(&alice).await.unwrap());
    assert_eq!(s.roster.count(&alice).await.unwrap(), 0);
    assert_eq!(s.user_data.get(&alice, "vcard", "").await.unwrap(), None);
    assert!(!s.delete_account(&alice).await.unwrap());
}
