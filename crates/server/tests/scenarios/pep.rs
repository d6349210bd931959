//! Personal Eventing Protocol (XEP-0163) over real sockets: discovery,
//! publish with auto-create and publish-options (XEP-0060 §7.1.5),
//! notifications filtered by entity capabilities (XEP-0115 `+notify`, the
//! server's disco#info query and hash check), the last item at login
//! (XEP-0163 §4.3.4), access models (XEP-0060 §4.5, errors of §6.5.9),
//! max_items, retract, purge, delete and node configuration, and bad
//! requests.

use base64::Engine;
use sha1::Digest;
use starling_testkit::pubsub::{self, app_error, item_ids, no_event, EVENT, OWNER, PUBSUB};
use starling_testkit::roster::{self, Subscription};
use starling_testkit::stanza::{iq, iq_get, iq_set, presence, query};
use starling_testkit::starling_xml::Element;
use starling_testkit::{error_condition, ns, Client, TestServer};
use std::time::Duration;

const AVATAR: &str = "urn:xmpp:avatar:metadata";
const NICK: &str = "http://jabber.org/protocol/nick";
const QUIET: Duration = Duration::from_millis(400);

/// Mutual presence subscription, in group Friends.
async fn contacts(server: &TestServer, a: &str, b: &str) {
    roster::put(server, a, b, Subscription::Both, &["Friends"]).await;
    roster::put(server, b, a, Subscription::Both, &["Friends"]).await;
}

/// A client's disco#info: identity and `features`.
fn disco_info(features: &[&str]) -> (String, String) {
    let mut f: Vec<String> = features.iter().map(|s| s.to_string()).collect();
    f.sort();
    let mut s = String::from("client/pc//Test<");
    let mut xml = String::from("<identity category='client' type='pc' name='Test'/>");
    for v in &f {
        s.push_str(v);
        s.push('<');
        xml.push_str(&format!("<feature var='{v}'/>"));
    }
    let ver = base64::engine::general_purpose::STANDARD.encode(sha1::Sha1::digest(s.as_bytes()));
    (ver, xml)
}

/// Sends available presence with capabilities for `features`; answers the
/// server's disco#info query (XEP-0115 §6.3) if it asks, with `ver` wrong
/// if `lie`. Returns whether it was asked.
async fn announce(c: &mut Client, features: &[&str], lie: bool) -> bool {
    announce_with(c, features, lie).await.0
}

/// [`announce`], also returning the other stanzas that arrived up to the
/// server's taking the answer. The session asks while it handles the
/// presence (the query is written before it reads the next stanza), so
/// whether it asked is known at a [`Client::barrier`]; after a second
/// barrier it has taken the answer (and cached capabilities it verified).
/// The last items it then sends (§4.3.4) come from a task of its own:
/// receive them, or use [`announce_seen`].
async fn announce_with(c: &mut Client, features: &[&str], lie: bool) -> (bool, Vec<Element>) {
    let mut seen = Vec::new();
    let (ver, xml) = disco_info(features);
    c.send(
        &presence()
            .child(&format!("<c xmlns='http://jabber.org/protocol/caps' hash='sha-1' node='https://starling.test' ver='{ver}'/>"))
            .to_string(),
    )
    .await;
    let mut asked = false;
    for el in c.barrier().await {
        if !asked && el.name() == "iq" && el.attr("type") == Some("get") {
            let q = el
                .get_child("query", ns::DISCO_INFO)
                .expect("a disco#info query");
            assert_eq!(
                q.attr("node"),
                Some(format!("https://starling.test#{ver}").as_str()),
                "{el}"
            );
            let xml = if lie {
                format!("{xml}<feature var='urn:x:extra'/>")
            } else {
                xml.clone()
            };
            c.send(
                &iq("result", el.attr("id").unwrap())
                    .to(el.attr("from").unwrap())
                    .child(&format!(
                        "<query xmlns='{}' node='https://starling.test#{ver}'>{xml}</query>",
                        ns::DISCO_INFO
                    ))
                    .to_string(),
            )
            .await;
            asked = true;
            continue;
        }
        seen.push(el);
    }
    seen.extend(c.barrier().await);
    (asked, seen)
}

/// [`announce_with`], then what follows (the last items) until the
/// connection has been quiet for [`QUIET`]: a timer, because the task
/// that sends the last items tells nobody when it is done, and the test
/// that uses this checks that nothing more than the expected items came.
async fn announce_seen(c: &mut Client, features: &[&str], lie: bool) -> (bool, Vec<Element>) {
    let (asked, mut seen) = announce_with(c, features, lie).await;
    while let Some(ev) = c.next_event_within(QUIET).await {
        if let starling_testkit::Event::Element(el) = ev {
            seen.push(el);
        }
    }
    (asked, seen)
}

/// XEP-0163 §4.1 (XEP-0060 §7.1): publishes to `c`'s own `node`, with
/// publish options `options` (`<field/>`s, XEP-0060 §7.1.5).
async fn publish(c: &mut Client, node: &str, id: &str, payload: &str, options: &str) -> Element {
    pubsub::publish(c, "", node, id, payload, options).await
}

fn field(var: &str, v: &str) -> String {
    format!("<field var='{var}'><value>{v}</value></field>")
}

/// XEP-0060 §6.5: the items of `node` of `owner`'s account (empty: `c`'s
/// own).
async fn items(c: &mut Client, owner: &str, node: &str, extra: &str) -> Element {
    let to = if owner.is_empty() {
        String::new()
    } else {
        format!("{owner}@localhost")
    };
    pubsub::items(c, &to, node, extra, "").await
}

/// The next pubsub event notification from `from`.
async fn event(c: &mut Client, from: &str) -> Element {
    let m = pubsub::next_event(c, from).await;
    assert_eq!(m.attr("type"), Some("headline"), "{m}");
    m.get_child("event", EVENT).unwrap().clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn accounts_are_pep_services_with_the_publish_features() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let f = alice.disco_features("alice@localhost").await;
    for want in [
        PUBSUB,
        "http://jabber.org/protocol/pubsub#publish",
        "http://jabber.org/protocol/pubsub#publish-options",
        "http://jabber.org/protocol/pubsub#auto-create",
        "http://jabber.org/protocol/pubsub#filtered-notifications",
        "http://jabber.org/protocol/pubsub#last-published",
        "http://jabber.org/protocol/pubsub#access-open",
    ] {
        assert!(f.iter().any(|x| x == want), "{want} missing from {f:?}");
    }
    let r = alice
        .iq(
            &iq_get("alice@localhost", "di", &query(ns::DISCO_INFO, "")),
            "di",
        )
        .await;
    let q = r.get_child("query", ns::DISCO_INFO).unwrap();
    assert!(
        q.children().any(|i| i.name() == "identity"
            && i.attr("category") == Some("pubsub")
            && i.attr("type") == Some("pep")),
        "{r}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn notifications_follow_capabilities_and_the_last_item_arrives_at_login() {
    let server = TestServer::start().await;
    contacts(&server, "alice", "bob").await;
    contacts(&server, "alice", "carol").await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let mut carol = server.login("carol").await;
    let mut dave = server.login("dave").await;
    let notify = format!("{AVATAR}+notify");
    // XEP-0115 §6.3: an unknown ver is asked for once.
    assert!(announce(&mut alice, &[&notify], false).await);
    assert!(announce(&mut bob, &[&notify, "urn:x:other"], false).await);
    // Carol's client does not want avatars; Dave is not a contact.
    assert!(announce(&mut carol, &["urn:x:other"], false).await);
    assert!(announce(&mut dave, &[&notify, "urn:x:dave"], false).await);
    for c in [&mut alice, &mut bob, &mut carol, &mut dave] {
        c.barrier().await;
    }
    let r = publish(
        &mut alice,
        AVATAR,
        "av1",
        &format!(
            "<metadata xmlns='{AVATAR}'><info id='av1' bytes='12' type='image/png'/></metadata>"
        ),
        "",
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let published = r
        .get_child("pubsub", PUBSUB)
        .and_then(|p| p.get_child("publish", PUBSUB))
        .unwrap();
    assert_eq!(published.attr("node"), Some(AVATAR));
    for c in [&mut bob, &mut alice] {
        let ev = event(c, "alice@localhost").await;
        let items = ev.get_child("items", EVENT).unwrap();
        assert_eq!(items.attr("node"), Some(AVATAR));
        let item = items.get_child("item", EVENT).unwrap();
        assert_eq!(item.attr("id"), Some("av1"));
        assert!(item.has_child("metadata", AVATAR), "{ev}");
    }
    no_event(&mut carol).await;
    no_event(&mut dave).await;
    // §4.3.4: a subscriber coming online gets the last item; a known ver
    // is not asked for again.
    let mut bob2 = server.login("bob").await;
    let (asked, seen) = announce_with(&mut bob2, &[&notify, "urn:x:other"], false).await;
    assert!(!asked);
    // The last item comes from a task of its own: here already, or next.
    let m = match seen.into_iter().find(|m| m.has_child("event", EVENT)) {
        Some(m) => m,
        None => {
            bob2.recv_until(|e| e.name() == "message" && e.has_child("event", EVENT))
                .await
        }
    };
    assert_eq!(m.attr("from"), Some("alice@localhost"), "{m}");
    let ev = m.get_child("event", EVENT).unwrap();
    assert_eq!(
        ev.get_child("items", EVENT)
            .and_then(|i| i.get_child("item", EVENT))
            .and_then(|i| i.attr("id")),
        Some("av1")
    );
    // §5.4: an answer whose hash does not match is not believed.
    let mut erin = server.login("erin").await;
    roster::put(&server, "alice", "erin", Subscription::From, &["Friends"]).await;
    assert!(announce(&mut erin, &[&format!("{NICK}+notify")], true).await);
    erin.barrier().await;
    let r = publish(
        &mut alice,
        NICK,
        "n1",
        &format!("<nick xmlns='{NICK}'>Alice</nick>"),
        "",
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    no_event(&mut erin).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn access_models_decide_who_sees_the_items() {
    let server = TestServer::start().await;
    contacts(&server, "alice", "bob").await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let mut dave = server.login("dave").await;
    // presence (the default): contacts yes, strangers no (§6.5.9).
    let r = publish(
        &mut alice,
        "urn:x:status",
        "s1",
        "<s xmlns='urn:x:status'>hi</s>",
        "",
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    assert_eq!(
        item_ids(&items(&mut bob, "alice", "urn:x:status", "").await),
        ["s1"]
    );
    let e = items(&mut dave, "alice", "urn:x:status", "").await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("not-authorized"),
        "{e}"
    );
    assert_eq!(
        app_error(&e).as_deref(),
        Some("presence-subscription-required")
    );
    // open (OMEMO device lists): anyone.
    let r = publish(
        &mut alice,
        "eu.siacs.conversations.axolotl.devicelist",
        "current",
        "<list xmlns='eu.siacs.conversations.axolotl'><device id='42'/></list>",
        &field("pubsub#access_model", "open"),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let r = items(
        &mut dave,
        "alice",
        "eu.siacs.conversations.axolotl.devicelist",
        "",
    )
    .await;
    assert_eq!(item_ids(&r), ["current"], "{r}");
    // whitelist (bookmarks): the owner only.
    let r = publish(
        &mut alice,
        "urn:xmpp:bookmarks:1",
        "room@conference.localhost",
        "<conference xmlns='urn:xmpp:bookmarks:1' autojoin='true'/>",
        &[
            field("pubsub#access_model", "whitelist"),
            field("pubsub#max_items", "max"),
            field("pubsub#send_last_published_item", "never"),
        ]
        .concat(),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let e = items(&mut bob, "alice", "urn:xmpp:bookmarks:1", "").await;
    assert_eq!(error_condition(&e).as_deref(), Some("not-allowed"), "{e}");
    assert_eq!(app_error(&e).as_deref(), Some("closed-node"));
    assert_eq!(
        item_ids(&items(&mut alice, "", "urn:xmpp:bookmarks:1", "").await),
        ["room@conference.localhost"]
    );
    // roster: contacts in the allowed groups.
    let r = publish(
        &mut alice,
        "urn:x:mood",
        "m1",
        "<m xmlns='urn:x:mood'/>",
        &[
            field("pubsub#access_model", "roster"),
            field("pubsub#roster_groups_allowed", "Work"),
        ]
        .concat(),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let e = items(&mut bob, "alice", "urn:x:mood", "").await;
    assert_eq!(app_error(&e).as_deref(), Some("not-in-roster-group"), "{e}");
    // Unknown nodes; nobody but the owner publishes.
    let e = items(&mut bob, "alice", "urn:x:none", "").await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("item-not-found"),
        "{e}"
    );
    let e = pubsub::publish(
        &mut bob,
        "alice@localhost",
        "urn:x:status",
        "",
        "<s xmlns='urn:x:status'>pwned</s>",
        "",
    )
    .await;
    assert_eq!(error_condition(&e).as_deref(), Some("forbidden"), "{e}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn publish_options_items_retract_purge_delete_and_configuration() {
    let server = TestServer::start().await;
    contacts(&server, "alice", "bob").await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let notify = "urn:x:feed+notify";
    announce(&mut bob, &[notify], false).await;
    bob.barrier().await;
    // max_items 2: the oldest goes; republishing an id makes it newest.
    for (i, id) in ["a", "b", "c", "b"].iter().enumerate() {
        let r = publish(
            &mut alice,
            "urn:x:feed",
            id,
            &format!("<e xmlns='urn:x:feed' n='{i}'/>"),
            &field("pubsub#max_items", "2"),
        )
        .await;
        assert_eq!(r.attr("type"), Some("result"), "{r}");
    }
    assert_eq!(
        item_ids(&items(&mut bob, "alice", "urn:x:feed", "").await),
        ["c", "b"]
    );
    assert_eq!(
        item_ids(&items(&mut bob, "alice", "urn:x:feed", "max_items='1'").await),
        ["b"]
    );
    // The four publications' notifications (routed before alice's answers),
    // not to be taken for the retraction's below.
    bob.barrier().await;
    // §7.1.5: options that differ from the node's configuration.
    let e = publish(
        &mut alice,
        "urn:x:feed",
        "d",
        "<e xmlns='urn:x:feed'/>",
        &field("pubsub#max_items", "5"),
    )
    .await;
    assert_eq!(error_condition(&e).as_deref(), Some("conflict"), "{e}");
    assert_eq!(app_error(&e).as_deref(), Some("precondition-not-met"));
    // §8.2: the owner reconfigures; lowering max_items trims.
    let r = pubsub::request(
        &mut alice,
        "",
        "get",
        OWNER,
        "<configure node='urn:x:feed'/>",
    )
    .await;
    assert!(r.to_string().contains("pubsub#max_items"), "{r}");
    let r = pubsub::request(
        &mut alice,
        "",
        "set",
        OWNER,
        &format!("<configure node='urn:x:feed'><x xmlns='jabber:x:data' type='submit'><field var='FORM_TYPE' type='hidden'><value>http://jabber.org/protocol/pubsub#node_config</value></field>{}</x></configure>", field("pubsub#max_items", "1")),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    assert_eq!(
        item_ids(&items(&mut alice, "", "urn:x:feed", "").await),
        ["b"]
    );
    let e = pubsub::request(
        &mut alice,
        "",
        "set",
        OWNER,
        &format!("<configure node='urn:x:feed'><x xmlns='jabber:x:data' type='submit'>{}</x></configure>", field("pubsub#access_model", "authorize")),
    )
    .await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("not-acceptable"),
        "{e}"
    );
    // §7.2: retract with notify.
    let r = pubsub::request(
        &mut alice,
        "",
        "set",
        PUBSUB,
        "<retract node='urn:x:feed' notify='true'><item id='b'/></retract>",
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let ev = event(&mut bob, "alice@localhost").await;
    let retract = ev
        .get_child("items", EVENT)
        .and_then(|i| i.get_child("retract", EVENT))
        .unwrap_or_else(|| panic!("{ev}"));
    assert_eq!(retract.attr("id"), Some("b"));
    let e = pubsub::request(
        &mut alice,
        "",
        "set",
        PUBSUB,
        "<retract node='urn:x:feed'><item id='b'/></retract>",
    )
    .await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("item-not-found"),
        "{e}"
    );
    // §8.5 purge, §8.4 delete: notified.
    publish(&mut alice, "urn:x:feed", "z", "<e xmlns='urn:x:feed'/>", "").await;
    event(&mut bob, "alice@localhost").await;
    let r = pubsub::request(&mut alice, "", "set", OWNER, "<purge node='urn:x:feed'/>").await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    assert!(event(&mut bob, "alice@localhost")
        .await
        .has_child("purge", EVENT));
    assert!(item_ids(&items(&mut alice, "", "urn:x:feed", "").await).is_empty());
    let r = pubsub::request(&mut alice, "", "set", OWNER, "<delete node='urn:x:feed'/>").await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    assert!(event(&mut bob, "alice@localhost")
        .await
        .has_child("delete", EVENT));
    let e = items(&mut alice, "", "urn:x:feed", "").await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("item-not-found"),
        "{e}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_publish_requests_get_their_errors() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let cases = [
        ("<publish><item><p xmlns='urn:x'/></item></publish>", "bad-request", "nodeid-required"),
        ("<publish node='n'/>", "bad-request", "item-required"),
        ("<publish node='n'><item id='1'/></publish>", "bad-request", "payload-required"),
        ("<publish node='n'><item id='1'><a xmlns='urn:x'/><b xmlns='urn:x'/></item></publish>", "bad-request", "invalid-payload"),
        ("<publish node='n'><item id='1'><a xmlns='urn:x'/></item><item id='2'><a xmlns='urn:x'/></item></publish>", "bad-request", "invalid-payload"),
    ];
    for (xml, cond, app) in &cases {
        let e = pubsub::request(&mut alice, "", "set", PUBSUB, xml).await;
        assert_eq!(error_condition(&e).as_deref(), Some(*cond), "{xml}: {e}");
        assert_eq!(app_error(&e).as_deref(), Some(*app), "{xml}: {e}");
    }
    let long = "n".repeat(2000);
    let e = publish(&mut alice, &long, "1", "<a xmlns='urn:x'/>", "").await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("not-acceptable"),
        "{e}"
    );
    let e = publish(
        &mut alice,
        "urn:x:q",
        "1",
        "<a xmlns='urn:x'/>",
        &field("pubsub#access_model", "authorize"),
    )
    .await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("not-acceptable"),
        "{e}"
    );
    // SQL-looking node names and ids are just names.
    let evil = "x\"; DROP TABLE pubsub_items; --";
    let r = publish(&mut alice, evil, evil, "<a xmlns='urn:x'>&lt;b&gt;</a>", "").await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let r = items(&mut alice, "", evil, "").await;
    assert_eq!(item_ids(&r), [evil], "{r}");
    server.stop().await;
}

const BOOKMARKS: &str = "urn:xmpp:bookmarks:1";

async fn private_bookmarks(c: &mut Client, set: Option<&str>) -> Element {
    let rid = format!("pv-{}", starling_proto::random_id(6));
    let (ty, inner) = match set {
        Some(x) => (
            "set",
            format!("<storage xmlns='storage:bookmarks'>{x}</storage>"),
        ),
        None => ("get", "<storage xmlns='storage:bookmarks'/>".to_owned()),
    };
    c.iq(
        &iq(ty, &rid)
            .child(&query("jabber:iq:private", &inner))
            .to_string(),
        &rid,
    )
    .await
}

/// XEP-0402 §5.3 "compat": XEP-0048 bookmarks in private storage
/// (XEP-0049) and XEP-0402 bookmarks in PEP are one list.
#[tokio::test(flavor = "multi_thread")]
async fn old_and_new_bookmark_clients_see_one_list() {
    let server = TestServer::start().await;
    contacts(&server, "alice", "bob").await;
    let mut old = server.login("alice").await;
    let mut new = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let f = new.disco_features("alice@localhost").await;
    assert!(
        f.iter().any(|x| x == "urn:xmpp:bookmarks:1#compat"),
        "{f:?}"
    );
    announce(&mut new, &[&format!("{BOOKMARKS}+notify")], false).await;
    announce(
        &mut bob,
        &[&format!("{BOOKMARKS}+notify"), "urn:x:bob"],
        false,
    )
    .await;
    new.barrier().await;
    bob.barrier().await;
    // The old client stores two rooms and a URL.
    let r = private_bookmarks(
        &mut old,
        Some("<conference jid='lobby@conference.localhost' name='Lobby' autojoin='true'><nick>al</nick></conference>\
              <conference jid='quiet@conference.localhost' autojoin='false'/>\
              <url name='Home' url='https://example.org/'/>"),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let mut seen = Vec::new();
    for _ in 0..2 {
        let ev = event(&mut new, "alice@localhost").await;
        let item = ev
            .get_child("items", EVENT)
            .and_then(|i| i.get_child("item", EVENT))
            .unwrap()
            .clone();
        seen.push(item.attr("id").unwrap().to_owned());
        let c = item
            .get_child("conference", BOOKMARKS)
            .unwrap_or_else(|| panic!("{ev}"));
        if item.attr("id") == Some("lobby@conference.localhost") {
            assert_eq!(
                (c.attr("name"), c.attr("autojoin")),
                (Some("Lobby"), Some("true"))
            );
            assert_eq!(c.get_child("nick", BOOKMARKS).unwrap().text(), "al");
        }
    }
    seen.sort();
    assert_eq!(
        seen,
        ["lobby@conference.localhost", "quiet@conference.localhost"]
    );
    // Private bookmarks are private: the node is the owner's only.
    no_event(&mut bob).await;
    let e = items(&mut bob, "alice", BOOKMARKS, "").await;
    assert_eq!(error_condition(&e).as_deref(), Some("not-allowed"), "{e}");
    // A new client adds a room through PEP; the old one sees it.
    let r = publish(
        &mut new,
        BOOKMARKS,
        "dev@conference.localhost",
        &format!("<conference xmlns='{BOOKMARKS}' name='Dev' autojoin='true'/>"),
        "",
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    event(&mut new, "alice@localhost").await;
    let r = private_bookmarks(&mut old, None).await;
    let storage = r
        .get_child("query", "jabber:iq:private")
        .and_then(|q| q.get_child("storage", "storage:bookmarks"))
        .unwrap_or_else(|| panic!("{r}"));
    let jids: Vec<&str> = storage
        .children()
        .filter(|c| c.name() == "conference")
        .filter_map(|c| c.attr("jid"))
        .collect();
    assert_eq!(jids.len(), 3, "{r}");
    assert!(jids.contains(&"dev@conference.localhost"), "{r}");
    assert!(
        storage.children().any(|c| c.name() == "url"),
        "the URL stays: {r}"
    );
    // The old client keeps one room: the other two are retracted, the kept
    // one is not notified again.
    let r = private_bookmarks(
        &mut old,
        Some("<conference jid='lobby@conference.localhost' name='Lobby' autojoin='true'><nick>al</nick></conference>"),
    )
    .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let mut retracted = Vec::new();
    for _ in 0..2 {
        let ev = event(&mut new, "alice@localhost").await;
        let items = ev.get_child("items", EVENT).unwrap();
        assert!(
            items.get_child("item", EVENT).is_none(),
            "unchanged items are not sent again: {ev}"
        );
        retracted.push(
            items
                .get_child("retract", EVENT)
                .unwrap()
                .attr("id")
                .unwrap()
                .to_owned(),
        );
    }
    retracted.sort();
    assert_eq!(
        retracted,
        ["dev@conference.localhost", "quiet@conference.localhost"]
    );
    no_event(&mut new).await;
    assert_eq!(
        item_ids(&items(&mut new, "", BOOKMARKS, "").await),
        ["lobby@conference.localhost"]
    );
    // A conference without a room JID is refused.
    let e = private_bookmarks(&mut old, Some("<conference name='x'/>")).await;
    assert_eq!(error_condition(&e).as_deref(), Some("bad-request"), "{e}");
    server.stop().await;
}

/// XEP-0398: a PEP avatar shows in vCard-based clients (the hash in
/// presence, §3.1; the photo in the vCard, §3.2), and a vCard photo
/// becomes the PEP avatar (§3.3).
#[tokio::test(flavor = "multi_thread")]
async fn pep_and_vcard_avatars_are_converted_both_ways() {
    use base64::Engine;
    let server = TestServer::start().await;
    contacts(&server, "alice", "bob").await;
    contacts(&server, "carol", "bob").await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let mut carol = server.login("carol").await;
    let f = alice.disco_features("alice@localhost").await;
    assert!(
        f.iter().any(|x| x == "urn:xmpp:pep-vcard-conversion:0"),
        "{f:?}"
    );
    let png = b"\x89PNG fake image bytes";
    let b64 = base64::engine::general_purpose::STANDARD.encode(png);
    let id: String = sha1::Sha1::digest(png)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    publish(
        &mut alice,
        "urn:xmpp:avatar:data",
        &id,
        &format!("<data xmlns='urn:xmpp:avatar:data'>{b64}</data>"),
        "",
    )
    .await;
    publish(
        &mut alice,
        AVATAR,
        &id,
        &format!(
            "<metadata xmlns='{AVATAR}'><info id='{id}' bytes='{}' type='image/png'/></metadata>",
            png.len()
        ),
        "",
    )
    .await;
    bob.send("<presence/>").await;
    // Alice's presence of her login is here before the answer, not to be
    // taken for the one below.
    bob.barrier().await;
    alice.send("<presence><show>chat</show></presence>").await;
    let p = bob
        .recv_until(|e| {
            e.name() == "presence" && e.attr("from").is_some_and(|f| f.starts_with("alice@"))
        })
        .await;
    let photo = p
        .get_child("x", "vcard-temp:x:update")
        .and_then(|x| x.get_child("photo", "vcard-temp:x:update"))
        .unwrap_or_else(|| panic!("no avatar hash in {p}"));
    assert_eq!(photo.text(), id);
    let card = bob
        .iq(
            "<iq type='get' id='vc' to='alice@localhost'><vCard xmlns='vcard-temp'/></iq>",
            "vc",
        )
        .await;
    let photo = card
        .get_child("vCard", "vcard-temp")
        .and_then(|v| v.get_child("PHOTO", "vcard-temp"))
        .unwrap_or_else(|| panic!("{card}"));
    assert_eq!(photo.get_child("BINVAL", "vcard-temp").unwrap().text(), b64);
    assert_eq!(
        photo.get_child("TYPE", "vcard-temp").unwrap().text(),
        "image/png"
    );
    // carol's old client sets a vCard photo; bob's PEP client hears of it.
    let (_, seen) = announce_with(&mut bob, &[&format!("{AVATAR}+notify")], false).await;
    // Alice's avatar is the one last item bob now follows (§4.3.4): it comes
    // from a task of its own (here already, or next), and must not be taken
    // for carol's below.
    let m = match seen.into_iter().find(|m| m.has_child("event", EVENT)) {
        Some(m) => m,
        None => {
            bob.recv_until(|e| e.name() == "message" && e.has_child("event", EVENT))
                .await
        }
    };
    assert_eq!(m.attr("from"), Some("alice@localhost"), "{m}");
    bob.barrier().await;
    let jpeg = b"\xff\xd8 fake jpeg";
    let jb64 = base64::engine::general_purpose::STANDARD.encode(jpeg);
    let jid: String = sha1::Sha1::digest(jpeg)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let r = carol
        .iq(
            &iq_set(
                "",
                "vs",
                &format!("<vCard xmlns='vcard-temp'><FN>Carol</FN><PHOTO><TYPE>image/jpeg</TYPE><BINVAL>{jb64}</BINVAL></PHOTO></vCard>"),
            ),
            "vs",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let ev = event(&mut bob, "carol@localhost").await;
    let info = ev
        .get_child("items", EVENT)
        .and_then(|i| i.get_child("item", EVENT))
        .and_then(|i| i.get_child("metadata", AVATAR))
        .and_then(|m| m.get_child("info", AVATAR))
        .unwrap_or_else(|| panic!("{ev}"))
        .clone();
    assert_eq!(
        (info.attr("id"), info.attr("type")),
        (Some(jid.as_str()), Some("image/jpeg"))
    );
    let r = items(&mut bob, "carol", "urn:xmpp:avatar:data", "").await;
    assert_eq!(item_ids(&r), [jid], "{r}");
    server.stop().await;
}

/// Malformed forms and oversize items: the right errors, and nothing else
/// affected (XEP-0060 §7.1.3, §7.1.5; RFC 6120 §4.9.3.14).
#[tokio::test(flavor = "multi_thread")]
async fn malformed_forms_and_oversize_items_are_refused() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    // publish-options whose FORM_TYPE is not publish-options.
    let e = pubsub::request(
        &mut alice,
        "",
        "set",
        PUBSUB,
        "<publish node='urn:x:a'><item id='1'><a xmlns='urn:x'/></item></publish><publish-options><x xmlns='jabber:x:data' type='submit'><field var='FORM_TYPE' type='hidden'><value>urn:x:wrong</value></field></x></publish-options>",
    )
    .await;
    assert_eq!(error_condition(&e).as_deref(), Some("bad-request"), "{e}");
    assert_eq!(app_error(&e).as_deref(), Some("invalid-options"), "{e}");
    // A boolean that is not one.
    let e = publish(
        &mut alice,
        "urn:x:b",
        "1",
        "<a xmlns='urn:x'/>",
        &field("pubsub#persist_items", "perhaps"),
    )
    .await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("not-acceptable"),
        "{e}"
    );
    // Neither node was created.
    for node in ["urn:x:a", "urn:x:b"] {
        let e = items(&mut alice, "", node, "").await;
        assert_eq!(
            error_condition(&e).as_deref(),
            Some("item-not-found"),
            "{e}"
        );
    }
    // An item beyond the stanza size limit ends only the sender's stream.
    let big = "x".repeat(300 * 1024);
    alice
        .send(&iq_set(
            "",
            "big",
            &format!("<pubsub xmlns='{PUBSUB}'><publish node='urn:x:big'><item id='1'><a xmlns='urn:x'>{big}</a></item></publish></pubsub>"),
        ))
        .await;
    alice.expect_stream_error("policy-violation").await;
    let r = publish(&mut bob, "urn:x:ok", "1", "<a xmlns='urn:x'/>", "").await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let mut alice = server.login("alice").await;
    let e = items(&mut alice, "", "urn:x:big", "").await;
    assert_eq!(
        error_condition(&e).as_deref(),
        Some("item-not-found"),
        "nothing half-stored: {e}"
    );
    server.stop().await;
}

/// XEP-0163 §4.3.3: a new presence subscription is a subscription to the
/// contact's PEP nodes — the new subscriber's online resources get the
/// last items at once (on_sub and on_sub_and_presence nodes), not only
/// at their next presence.
#[tokio::test(flavor = "multi_thread")]
async fn approving_a_subscription_sends_the_last_items() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let notify = [
        format!("{AVATAR}+notify"),
        format!("{NICK}+notify"),
        "urn:x:never+notify".to_owned(),
    ];
    let notify: Vec<&str> = notify.iter().map(String::as_str).collect();
    announce(&mut bob, &notify, false).await;
    alice.send("<presence/>").await;
    publish(
        &mut alice,
        AVATAR,
        "av",
        &format!("<metadata xmlns='{AVATAR}'/>"),
        "",
    )
    .await;
    publish(
        &mut alice,
        NICK,
        "n",
        &format!("<nick xmlns='{NICK}'>Al</nick>"),
        &field("pubsub#send_last_published_item", "on_sub"),
    )
    .await;
    publish(
        &mut alice,
        "urn:x:never",
        "x",
        "<x xmlns='urn:x:never'/>",
        &field("pubsub#send_last_published_item", "never"),
    )
    .await;
    alice.barrier().await;
    bob.barrier().await;
    bob.send("<presence to='alice@localhost' type='subscribe'/>")
        .await;
    alice
        .recv_until(|e| e.name() == "presence" && e.attr("type") == Some("subscribe"))
        .await;
    alice
        .send("<presence to='bob@localhost' type='subscribed'/>")
        .await;
    // The approval is routed while alice's session handles it, and the
    // last items with it (the PEP module's inbound hook): once her session
    // answered a ping they were routed, and bob has them at his barrier.
    alice.barrier().await;
    let mut nodes = Vec::new();
    for el in bob.barrier().await {
        if let Some(items) = el
            .get_child("event", EVENT)
            .and_then(|e| e.get_child("items", EVENT))
        {
            assert_eq!(el.attr("from"), Some("alice@localhost"), "{el}");
            nodes.push(items.attr("node").unwrap_or("").to_owned());
        }
    }
    nodes.sort();
    assert_eq!(
        nodes,
        [NICK, AVATAR],
        "on_sub and on_sub_and_presence nodes, not 'never'"
    );
    server.stop().await;
}

/// XEP-0163 §4.3.4 with XEP-0060 §4.5: at login a session gets the last
/// item of each node it follows from every contact whose presence it is
/// subscribed to — read for all contacts at once — and only what each
/// node's access model lets it see, judged by the *owner's* roster.
#[tokio::test(flavor = "multi_thread")]
async fn last_items_at_login_follow_every_access_model_of_every_contact() {
    let server = TestServer::start().await;
    // alice logs in. Her roster: bob, carol, erin both, dave to. Their
    // rosters (the `roster` helper puts alice in "Friends"): bob and carol
    // both; dave has no item for alice; erin has one without subscription.
    contacts(&server, "alice", "bob").await;
    contacts(&server, "alice", "carol").await;
    roster::put(&server, "alice", "dave", Subscription::To, &["Friends"]).await;
    roster::put(&server, "alice", "erin", Subscription::Both, &["Friends"]).await;
    roster::put(&server, "erin", "alice", Subscription::None, &["Friends"]).await;
    let nodes = [
        "urn:x:status",
        "urn:x:open",
        "urn:x:work",
        "urn:x:friends",
        "urn:x:secret",
        "urn:x:never",
        "urn:x:onsub",
    ];
    for owner in ["bob", "carol", "dave", "erin"] {
        let mut c = server.login(owner).await;
        let opts =
            |pairs: &[(&str, &str)]| -> String { pairs.iter().map(|(k, v)| field(k, v)).collect() };
        for (node, options) in [
            ("urn:x:status", String::new()),
            ("urn:x:open", opts(&[("pubsub#access_model", "open")])),
            (
                "urn:x:work",
                opts(&[
                    ("pubsub#access_model", "roster"),
                    ("pubsub#roster_groups_allowed", "Work"),
                ]),
            ),
            (
                "urn:x:friends",
                opts(&[
                    ("pubsub#access_model", "roster"),
                    ("pubsub#roster_groups_allowed", "Friends"),
                ]),
            ),
            (
                "urn:x:secret",
                opts(&[("pubsub#access_model", "whitelist")]),
            ),
            (
                "urn:x:never",
                opts(&[("pubsub#send_last_published_item", "never")]),
            ),
            (
                "urn:x:onsub",
                opts(&[("pubsub#send_last_published_item", "on_sub")]),
            ),
        ] {
            let r = publish(
                &mut c,
                node,
                &format!("{owner}-{node}"),
                &format!("<x xmlns='{node}'/>"),
                &options,
            )
            .await;
            assert_eq!(r.attr("type"), Some("result"), "{r}");
        }
    }
    let mut alice = server.login("alice").await;
    let notify: Vec<String> = nodes.iter().map(|n| format!("{n}+notify")).collect();
    let notify: Vec<&str> = notify.iter().map(String::as_str).collect();
    let (_, seen) = announce_seen(&mut alice, &notify, false).await;
    let mut got: Vec<String> = seen
        .iter()
        .filter_map(|m| {
            let item = m
                .get_child("event", EVENT)?
                .get_child("items", EVENT)?
                .get_child("item", EVENT)?;
            Some(format!(
                "{} {}",
                m.attr("from").unwrap_or(""),
                item.attr("id").unwrap_or("")
            ))
        })
        .collect();
    got.sort();
    // bob and carol (both, alice in Friends): presence, open and Friends
    // nodes. dave (no item for alice): open only. erin (alice in Friends,
    // no subscription): open and Friends, not presence — the owner's
    // roster decides, not alice's. Never: whitelist, never, on_sub, Work.
    let mut want: Vec<String> = Vec::new();
    for owner in ["bob", "carol"] {
        for node in ["urn:x:status", "urn:x:open", "urn:x:friends"] {
            want.push(format!("{owner}@localhost {owner}-{node}"));
        }
    }
    want.push("dave@localhost dave-urn:x:open".to_owned());
    want.push("erin@localhost erin-urn:x:open".to_owned());
    want.push("erin@localhost erin-urn:x:friends".to_owned());
    want.sort();
    assert_eq!(got, want);
    server.stop().await;
}

/// XEP-0163 §4.3.4 at scale: a login whose contacts' last items outnumber
/// its mailbox (`[c2s] mailbox_size`, 8 here; 1,024 by default against
/// 500 contacts × 3 nodes) still gets every one of them — the delivery
/// waits for the session to read instead of overflowing its mailbox,
/// where items would be bounced and lost to it.
#[tokio::test(flavor = "multi_thread")]
async fn last_items_beyond_the_mailbox_size_all_arrive() {
    let server = TestServer::start_with(|cfg| cfg.c2s.mailbox_size = 8).await;
    let names: Vec<String> = (0..30).map(|i| format!("c{i}")).collect();
    let nodes = ["urn:x:a", "urn:x:b", "urn:x:c"];
    for c in &names {
        contacts(&server, "alice", c).await;
        let mut s = server.login(c).await;
        for node in nodes {
            let r = publish(&mut s, node, c, &format!("<x xmlns='{node}'/>"), "").await;
            assert_eq!(r.attr("type"), Some("result"), "{r}");
        }
    }
    let mut alice = server.login("alice").await;
    let notify: Vec<String> = nodes.iter().map(|n| format!("{n}+notify")).collect();
    let notify: Vec<&str> = notify.iter().map(String::as_str).collect();
    let (_, mut seen) = announce_with(&mut alice, &notify, false).await;
    // The last items come from a task of their own, paced to the
    // session's reading: received until there are as many as expected.
    let want = names.len() * nodes.len();
    while seen.iter().filter(|m| m.has_child("event", EVENT)).count() < want {
        seen.push(alice.recv().await);
    }
    let got: std::collections::HashSet<(String, String)> = seen
        .iter()
        .filter_map(|m| {
            let items = m.get_child("event", EVENT)?.get_child("items", EVENT)?;
            Some((m.attr("from")?.to_owned(), items.attr("node")?.to_owned()))
        })
        .collect();
    assert_eq!(got.len(), names.len() * nodes.len(), "{got:?}");
    server.stop().await;
}
