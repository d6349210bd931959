//! Profile and information modules over real sockets: vcard-temp
//! (XEP-0054), private XML storage (XEP-0049), last activity (XEP-0012),
//! software version (XEP-0092), entity time (XEP-0202).

use starling_proto::BareJid;
use starling_server::modules;
use starling_testkit::roster::{self, Subscription};
use starling_testkit::stanza::iq_set;
use starling_testkit::{error_condition, eventually, TestServer};
use std::time::Duration;

const VCARD: &str = "vcard-temp";
const PRIVATE: &str = "jabber:iq:private";
const LAST: &str = "jabber:iq:last";

/// Waits (at most 10 s) until `user`'s logout is in storage: the session
/// records it in its `session_closed` hook, after the stream's close has
/// been written, so a client's view of the close does not say it is done.
async fn until_logout_recorded(server: &TestServer, user: &str) -> (u64, String) {
    let jid = BareJid::new(user).unwrap();
    eventually(
        &format!("{user}'s logout is recorded"),
        Duration::from_secs(10),
        async || {
            starling_server::modules::last::store::open(&server.server.env.storage)
                .get(&jid)
                .await
                .unwrap()
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn vcard_set_own_and_fetch_from_anyone() {
    // XEP-0054 §3.1 (retrieve own), §3.2 (update), §3.3 (another user's).
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let empty = alice
        .iq(
            "<iq type='get' id='v0'><vCard xmlns='vcard-temp'/></iq>",
            "v0",
        )
        .await;
    let card = empty
        .get_child("vCard", VCARD)
        .expect("empty vCard when none is stored");
    assert_eq!(card.children().count(), 0);
    let r = alice
        .iq("<iq type='set' id='v1'><vCard xmlns='vcard-temp'><FN>Alice &amp; Co</FN><NICKNAME>al</NICKNAME><x xmlns='urn:example:ext'>keep</x></vCard></iq>", "v1")
        .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let r = bob
        .iq(
            "<iq to='alice@localhost' type='get' id='v2'><vCard xmlns='vcard-temp'/></iq>",
            "v2",
        )
        .await;
    assert_eq!(r.attr("from"), Some("alice@localhost"));
    let card = r.get_child("vCard", VCARD).expect("vCard");
    assert_eq!(card.get_child("FN", VCARD).unwrap().text(), "Alice & Co");
    assert_eq!(
        card.get_child("x", "urn:example:ext").unwrap().text(),
        "keep",
        "unknown parts kept"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn vcard_others_and_oversized_rejected_without_change() {
    let server =
        TestServer::start_with(|c| c.modules.get_mut::<modules::Vcard>().max_bytes = 1000).await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    alice
        .iq(
            "<iq type='set' id='s'><vCard xmlns='vcard-temp'><FN>A</FN></vCard></iq>",
            "s",
        )
        .await;
    let r = bob
        .iq("<iq to='alice@localhost' type='set' id='f'><vCard xmlns='vcard-temp'><FN>hacked</FN></vCard></iq>", "f")
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("forbidden"));
    let big = "x".repeat(2000);
    let r = alice
        .iq(
            &iq_set(
                "",
                "b",
                &format!("<vCard xmlns='vcard-temp'><DESC>{big}</DESC></vCard>"),
            ),
            "b",
        )
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("not-acceptable"));
    let r = alice
        .iq(
            "<iq type='get' id='g'><vCard xmlns='vcard-temp'/></iq>",
            "g",
        )
        .await;
    assert_eq!(
        r.get_child("vCard", VCARD)
            .unwrap()
            .get_child("FN", VCARD)
            .unwrap()
            .text(),
        "A"
    );
    let r = alice
        .iq(
            "<iq to='nobody@localhost' type='get' id='n'><vCard xmlns='vcard-temp'/></iq>",
            "n",
        )
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("service-unavailable"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn private_storage_roundtrip_and_errors() {
    // XEP-0049 §2 (store/retrieve), §3 (errors).
    let server =
        TestServer::start_with(|c| c.modules.get_mut::<modules::Private>().max_bytes = 500).await;
    let mut alice = server.login("alice").await;
    let r = alice
        .iq("<iq type='set' id='p1'><query xmlns='jabber:iq:private'><prefs xmlns='urn:example:prefs'><theme>dark</theme></prefs></query></iq>", "p1")
        .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let r = alice
        .iq("<iq type='get' id='p2'><query xmlns='jabber:iq:private'><prefs xmlns='urn:example:prefs'/></query></iq>", "p2")
        .await;
    let prefs = r
        .get_child("query", PRIVATE)
        .unwrap()
        .get_child("prefs", "urn:example:prefs")
        .unwrap();
    assert_eq!(
        prefs
            .get_child("theme", "urn:example:prefs")
            .unwrap()
            .text(),
        "dark"
    );
    // Never stored → returned empty.
    let r = alice
        .iq("<iq type='get' id='p3'><query xmlns='jabber:iq:private'><other xmlns='urn:example:other'/></query></iq>", "p3")
        .await;
    let other = r
        .get_child("query", PRIVATE)
        .unwrap()
        .get_child("other", "urn:example:other")
        .unwrap();
    assert_eq!(other.children().count(), 0);
    // No child → bad-request ("Bad Format"); reserved namespace → not-acceptable.
    let r = alice
        .iq(
            "<iq type='get' id='p4'><query xmlns='jabber:iq:private'/></iq>",
            "p4",
        )
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("bad-request"));
    let r = alice
        .iq("<iq type='set' id='p5'><query xmlns='jabber:iq:private'><x xmlns='jabber:iq:roster'/></query></iq>", "p5")
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("not-acceptable"));
    let big = "y".repeat(800);
    let r = alice
        .iq(
            &iq_set(
                "",
                "p6",
                &format!("<query xmlns='jabber:iq:private'><prefs xmlns='urn:example:prefs'>{big}</prefs></query>"),
            ),
            "p6",
        )
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("not-acceptable"));
    // Someone else's → forbidden.
    let mut bob = server.login("bob").await;
    let r = bob
        .iq("<iq to='alice@localhost' type='get' id='p7'><query xmlns='jabber:iq:private'><prefs xmlns='urn:example:prefs'/></query></iq>", "p7")
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("forbidden"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn last_activity_server_uptime_and_contact_logout_time() {
    // XEP-0012 §5 (server), §4 (offline user, authorised requester).
    let server = TestServer::start().await;
    // Alice may see bob's presence.
    roster::put(&server, "bob", "alice", Subscription::From, &[]).await;

    let mut alice = server.login("alice").await;
    let r = alice
        .iq(
            "<iq to='localhost' type='get' id='u'><query xmlns='jabber:iq:last'/></iq>",
            "u",
        )
        .await;
    let secs: u64 = r
        .get_child("query", LAST)
        .unwrap()
        .attr("seconds")
        .unwrap()
        .parse()
        .unwrap();
    assert!(secs < 60, "uptime {secs}");

    let mut bob = server.login("bob").await;
    let r = alice
        .iq(
            "<iq to='bob@localhost' type='get' id='l1'><query xmlns='jabber:iq:last'/></iq>",
            "l1",
        )
        .await;
    assert_eq!(
        r.get_child("query", LAST).unwrap().attr("seconds"),
        Some("0"),
        "online → 0: {r}"
    );
    bob.send("<presence type='unavailable'><status>lunch</status></presence>")
        .await;
    bob.close().await;
    until_logout_recorded(&server, "bob@localhost").await;
    let r = alice
        .iq(
            "<iq to='bob@localhost' type='get' id='l2'><query xmlns='jabber:iq:last'/></iq>",
            "l2",
        )
        .await;
    let q = r.get_child("query", LAST).expect("last activity");
    assert!(q.attr("seconds").unwrap().parse::<u64>().unwrap() < 10);
    assert_eq!(q.text(), "lunch");

    // Not subscribed → forbidden.
    let mut carol = server.login("carol").await;
    let r = carol
        .iq(
            "<iq to='bob@localhost' type='get' id='l3'><query xmlns='jabber:iq:last'/></iq>",
            "l3",
        )
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("forbidden"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn last_activity_recorded_when_connection_drops() {
    // A dropped TCP connection (no closing tag) still records the logout.
    let server = TestServer::start().await;
    let bob = server.login("bob").await;
    drop(bob);
    let (at, _) = until_logout_recorded(&server, "bob@localhost").await;
    assert!(at > 0, "logout time recorded");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn version_and_time_answered_by_server() {
    // XEP-0092 §2, XEP-0202 §3.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = alice
        .iq(
            "<iq to='localhost' type='get' id='v'><query xmlns='jabber:iq:version'/></iq>",
            "v",
        )
        .await;
    let q = r.get_child("query", "jabber:iq:version").expect("version");
    assert_eq!(
        q.get_child("name", "jabber:iq:version").unwrap().text(),
        "Starling"
    );
    assert!(!q
        .get_child("version", "jabber:iq:version")
        .unwrap()
        .text()
        .is_empty());
    assert!(
        !q.has_child("os", "jabber:iq:version"),
        "OS hidden by default"
    );
    let r = alice
        .iq(
            "<iq to='localhost' type='get' id='t'><time xmlns='urn:xmpp:time'/></iq>",
            "t",
        )
        .await;
    let t = r.get_child("time", "urn:xmpp:time").expect("time");
    assert_eq!(
        t.get_child("tzo", "urn:xmpp:time").unwrap().text(),
        "+00:00"
    );
    let utc = t.get_child("utc", "urn:xmpp:time").unwrap().text();
    assert!(
        utc.len() == 24 && utc.ends_with('Z') && utc.starts_with("20"),
        "{utc}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn disco_advertises_each_enabled_im_module() {
    // XEP-0030: features declared by the modules themselves.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let vars = alice.disco_features("localhost").await;
    for f in [
        "urn:xmpp:blocking",
        VCARD,
        PRIVATE,
        LAST,
        "jabber:iq:version",
        "urn:xmpp:time",
    ] {
        assert!(vars.iter().any(|v| v == f), "{f} missing from {vars:?}");
    }
    let server2 = TestServer::start_with(|c| {
        c.modules.get_mut::<modules::Blocking>().enabled = false;
        c.modules.get_mut::<modules::Vcard>().enabled = false;
        c.modules.get_mut::<modules::Time>().enabled = false;
    })
    .await;
    let mut bob = server2.login("bob").await;
    let vars = bob.disco_features("localhost").await;
    assert!(
        !vars
            .iter()
            .any(|v| v == "urn:xmpp:blocking" || v == VCARD || v == "urn:xmpp:time"),
        "{vars:?}"
    );
    server.stop().await;
    server2.stop().await;
}
