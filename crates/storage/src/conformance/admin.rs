//! Admin API tokens and the account ban flag.

use super::{creds, jid};
use starling_core::storage::{Storage, StorageError};
use starling_proto::sasl::ScramHash;

/// Admin API tokens: unique names, listed by name with their hashes,
/// last use recorded, revoked by name; and the account ban flag: off for a
/// new account, on and off again, false for unknown accounts, gone with
/// the account.
pub async fn admin(s: &Storage) {
    use starling_core::storage::AdminToken;
    let t = s.admin_tokens.as_ref();
    assert!(t.admin_tokens().await.unwrap().is_empty());
    let tok = |name: &str, hash: u8| AdminToken {
        name: name.to_owned(),
        hash: vec![hash; 32],
        created_at: 1_800_000_000_000,
        last_used_at: None,
        scope: if hash == 2 { "read" } else { "admin" }.to_owned(),
    };
    let odd = "ops'; DROP TABLE admin_tokens; --";
    t.create_admin_token(&tok("deploy", 1)).await.unwrap();
    t.create_admin_token(&tok(odd, 2)).await.unwrap();
    assert!(matches!(
        t.create_admin_token(&tok("deploy", 3)).await,
        Err(StorageError::Conflict)
    ));
    assert_eq!(
        t.admin_tokens().await.unwrap(),
        [tok("deploy", 1), tok(odd, 2)]
    );
    t.touch_admin_token("deploy", 1_800_000_000_500)
        .await
        .unwrap();
    let listed = t.admin_tokens().await.unwrap();
    assert_eq!(listed[0].last_used_at, Some(1_800_000_000_500));
    assert_eq!(listed[1].last_used_at, None);
    assert!(t.revoke_admin_token(odd).await.unwrap());
    assert!(!t.revoke_admin_token(odd).await.unwrap());
    assert_eq!(t.admin_tokens().await.unwrap().len(), 1);

    let a = s.accounts.as_ref();
    let alice = jid("alice@example.org");
    a.create(&alice, &creds("secret")).await.unwrap();
    assert!(!a.is_disabled(&alice).await.unwrap());
    assert!(a.set_disabled(&alice, true).await.unwrap());
    assert!(a.is_disabled(&alice).await.unwrap());
    assert!(a
        .credentials(&alice, ScramHash::Sha256)
        .await
        .unwrap()
        .is_some());
    assert!(a.set_disabled(&alice, false).await.unwrap());
    assert!(!a.is_disabled(&alice).await.unwrap());
    let nobody = jid("nobody@example.org");
    assert!(!a.set_disabled(&nobody, true).await.unwrap());
    assert!(!a.is_disabled(&nobody).await.unwrap());
    a.set_disabled(&alice, true).await.unwrap();
    a.delete(&alice).await.unwrap();
    a.create(&alice, &creds("again")).await.unwrap();
    assert!(
        !a.is_disabled(&alice).await.unwrap(),
        "a new account starts enabled"
    );
}
