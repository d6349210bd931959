//! The conformance suite every backend must pass (DESIGN.md invariant 6).
//!
//! Each function takes a fresh, empty [`Storage`] and panics on the first
//! deviation. Backends call them from their own tests
//! (`tests/conformance_sqlite.rs`, `tests/conformance_postgres.rs`), through
//! [`run_all`]: a new concern adds its function there.
//!
//! One file per store (`accounts.rs`: accounts, their change log, auth
//! caches and FAST tokens; `roster.rs`, `user_data.rs`, `offline.rs`,
//! `archive.rs` with its buckets, `inbox.rs`, `pubsub.rs`, `admin.rs`, `domains.rs`), `concurrency.rs` for stores
//! raced by concurrent callers; this file holds [`run_all`] and the
//! helpers the files share. A module's own store has its suite in its
//! folder (`modules/muc/store/conformance.rs` of the server).

mod accounts;
mod admin;
mod archive;
mod concurrency;
mod domains;
mod inbox;
mod offline;
mod pubsub;
mod roster;
mod user_data;

pub use accounts::{account_changes, accounts, auth_cache, fast_tokens};
pub use admin::admin;
pub use archive::{archive, archive_buckets, bucket_test_options};
pub use concurrency::concurrency;
pub use domains::domains;
pub use inbox::inbox;
pub use offline::{offline, offline_with_archive};
pub use pubsub::pubsub;
pub use roster::roster;
pub use user_data::user_data;

use starling_core::storage::{ArchiveId, ArchiveRecord, Storage, FLAG_BODY};
use starling_proto::sasl::{ScramCredentials, ScramHash};
use starling_proto::BareJid;

/// Runs every conformance test, each on a fresh storage from `make`.
pub async fn run_all<F, Fut>(mut make: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Storage>,
{
    accounts(&make().await).await;
    account_changes(&make().await).await;
    auth_cache(&make().await).await;
    fast_tokens(&make().await).await;
    admin(&make().await).await;
    domains(&make().await).await;
    roster(&make().await).await;
    user_data(&make().await).await;
    offline(&make().await).await;
    offline_with_archive(&make().await).await;
    archive(&make().await).await;
    inbox(&make().await).await;
    pubsub(&make().await).await;
    concurrency(&make().await).await;
}

fn jid(s: &str) -> BareJid {
    BareJid::new(s).expect("valid test jid")
}

fn creds(password: &str) -> Vec<ScramCredentials> {
    [ScramHash::Sha1, ScramHash::Sha256, ScramHash::Sha512]
        .into_iter()
        .map(|h| ScramCredentials::generate(h, password, 64).expect("derive"))
        .collect()
}

fn rec(
    owner: &BareJid,
    micros: i64,
    with: &str,
    outgoing: bool,
    origin: Option<&str>,
) -> ArchiveRecord {
    let with_bare = with.split('/').next().unwrap().to_owned();
    ArchiveRecord {
        owner: owner.clone(),
        id: ArchiveId::from_parts(micros, 1),
        with_bare,
        remote: with.to_owned(),
        outgoing,
        origin_id: origin.map(str::to_owned),
        flags: FLAG_BODY,
        stanza: format!("<message id='{micros}'><body>'; DROP TABLE archive; --</body></message>"),
    }
}

fn ids(page: &starling_core::storage::ArchivePage) -> Vec<i64> {
    page.messages.iter().map(|m| m.id.micros()).collect()
}
