//! Rosters and presence subscriptions (RFC 6121) for scenario tests:
//! contacts written straight into storage, as if the subscription
//! handshake of §3 had run (so a test of something else starts from
//! contacts), and the roster requests of §2 (get, set).
//!
//! ```no_run
//! # use starling_testkit::{roster, TestServer};
//! # async fn scenario() {
//! let server = TestServer::start().await;
//! roster::befriend(&server, "alice", "bob").await;
//! let mut alice = server.login("alice").await;
//! let r = roster::get(&mut alice).await;
//! assert_eq!(roster::jids(&r), ["bob@localhost"]);
//! # }
//! ```

use crate::{Client, TestServer, DOMAIN};
use starling_core::storage::RosterItem;
pub use starling_core::storage::Subscription;
use starling_proto::BareJid;
use starling_xml::Element;

/// The roster namespace (§2.1).
pub const ROSTER: &str = "jabber:iq:roster";

/// The bare JID of account `user` on the test domain.
pub fn bare(user: &str) -> BareJid {
    BareJid::new(&format!("{user}@{DOMAIN}")).expect("a valid user name")
}

/// Writes `contact` into `owner`'s roster with `subscription` (no pending
/// request either way) in `groups`, straight into storage: the state the
/// handshake of §3 would leave, for tests of what follows from it.
pub async fn put(
    server: &TestServer,
    owner: &str,
    contact: &str,
    subscription: Subscription,
    groups: &[&str],
) {
    let mut item = RosterItem::new(bare(contact));
    item.subscription = subscription;
    item.groups = groups.iter().map(|g| (*g).to_owned()).collect();
    server
        .server
        .env
        .storage
        .roster
        .put_item(&bare(owner), &item)
        .await
        .expect("write the roster item");
}

/// [`put`] both ways with subscription `both` and no groups: `a` and `b`
/// see each other's presence (§3.1 run in both directions).
pub async fn befriend(server: &TestServer, a: &str, b: &str) {
    put(server, a, b, Subscription::Both, &[]).await;
    put(server, b, a, Subscription::Both, &[]).await;
}

/// §2.1.3: a roster get; the answer. The session becomes an interested
/// resource (it gets roster pushes from then on, §2.1.6).
pub async fn get(c: &mut Client) -> Element {
    let id = format!("rg-{}", starling_proto::random_id(8));
    c.iq(
        &format!("<iq type='get' id='{id}'><query xmlns='{ROSTER}'/></iq>"),
        &id,
    )
    .await
}

/// §2.3: a roster set adding or updating the item for `jid` (no name, no
/// groups) with iq id `id`; asserts that it was accepted.
pub async fn set_item(c: &mut Client, jid: &str, id: &str) {
    let r = c
        .iq(
            &format!(
                "<iq type='set' id='{id}'><query xmlns='{ROSTER}'><item jid='{jid}'/></query></iq>"
            ),
            id,
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
}

/// The JIDs of the items of a roster result or push, in order.
pub fn jids(r: &Element) -> Vec<String> {
    r.get_child("query", ROSTER)
        .map(|q| {
            q.children()
                .filter(|i| i.name() == "item")
                .filter_map(|i| i.attr("jid").map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}
