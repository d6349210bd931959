//! The publish-subscribe service (XEP-0060) at `pubsub.localhost` over
//! real sockets: one scenario per group of use cases (the spec's sections
//! in each test's comments), the notifications subscribers get (and those
//! who unsubscribed or turned delivery off do not), access models,
//! owners' management, multiple subscriptions with SHIM headers, the error
//! cases, bad input, account deletion and a restart.

use starling_server::modules::pubsub::PubsubConfig;
use starling_server::modules::Pubsub;
use starling_testkit::pubsub::{
    self, app_error, event_items, form, item_ids, no_event, no_event_after, request, subids, EVENT,
    NODE_CONFIG, OWNER, PUBSUB, SUB_OPTIONS,
};
use starling_testkit::stanza::{msg, query};
use starling_testkit::starling_xml::Element;
use starling_testkit::{error_condition, ns, Client, TestServer};

const SVC: &str = "pubsub.localhost";
const RSM: &str = "http://jabber.org/protocol/rsm";

async fn server() -> TestServer {
    server_with(|_| {}).await
}

async fn server_with(f: impl FnOnce(&mut PubsubConfig)) -> TestServer {
    TestServer::start_with(|c| {
        let p = c.modules.get_mut::<Pubsub>();
        p.enabled = true;
        f(p);
    })
    .await
}

/// A `<pubsub/>` request to the service.
async fn ps(c: &mut Client, ty: &str, inner: &str) -> Element {
    request(c, SVC, ty, PUBSUB, inner).await
}

/// A `<pubsub/>` request of an owner (§8) to the service.
async fn own(c: &mut Client, ty: &str, inner: &str) -> Element {
    request(c, SVC, ty, OWNER, inner).await
}

#[track_caller]
fn ok(r: &Element) {
    assert_eq!(r.attr("type"), Some("result"), "{r}");
}

/// (defined condition, pubsub#errors condition) of an error answer.
#[track_caller]
fn err(r: &Element) -> (String, Option<String>) {
    assert_eq!(r.attr("type"), Some("error"), "{r}");
    (error_condition(r).unwrap_or_default(), app_error(r))
}

#[track_caller]
fn is_err(r: &Element, cond: &str, app: Option<&str>) {
    assert_eq!(err(r), (cond.to_owned(), app.map(str::to_owned)), "{r}");
}

// testkit::pubsub's requests, to the service (SVC).

/// §8.1: creates `node` at the service.
async fn create(c: &mut Client, node: &str, config: &[(&str, &str)]) -> Element {
    pubsub::create(c, SVC, node, config).await
}

/// §7.1: publishes item `id` (empty: named by the service) to `node`.
async fn publish(c: &mut Client, node: &str, id: &str, payload: &str) -> Element {
    pubsub::publish(c, SVC, node, id, payload, "").await
}

/// §6.1: subscribes `jid` to `node`.
async fn subscribe(c: &mut Client, node: &str, jid: &str) -> Element {
    pubsub::subscribe(c, SVC, node, jid).await
}

/// §6.5: the items of `node`.
async fn items(c: &mut Client, node: &str, attrs: &str, inner: &str) -> Element {
    pubsub::items(c, SVC, node, attrs, inner).await
}

/// The next notification from the service.
async fn event(c: &mut Client) -> Element {
    pubsub::next_event(c, SVC).await
}

fn entry(text: &str) -> String {
    format!("<entry xmlns='http://www.w3.org/2005/Atom'><title>{text}</title></entry>")
}

/// The `<subscription/>` of a subscribe or unsubscribe answer.
fn subscription(r: &Element) -> Element {
    r.get_child("pubsub", PUBSUB)
        .and_then(|p| p.get_child("subscription", PUBSUB))
        .unwrap_or_else(|| panic!("no subscription in {r}"))
        .clone()
}

/// The values of field `var` in the first form under `el`.
fn field(el: &Element, var: &str) -> Option<Vec<String>> {
    if el.name() == "field" && el.attr("var") == Some(var) {
        return Some(
            el.children()
                .filter(|v| v.name() == "value")
                .map(|v| v.text())
                .collect(),
        );
    }
    el.children().find_map(|c| field(c, var))
}

/// (jid, affiliation) pairs of an owner affiliations list.
fn affiliations(r: &Element) -> Vec<(String, String)> {
    r.get_child("pubsub", OWNER)
        .and_then(|p| p.get_child("affiliations", OWNER))
        .unwrap_or_else(|| panic!("no affiliations in {r}"))
        .children()
        .map(|a| {
            (
                a.attr("jid").unwrap_or("").to_owned(),
                a.attr("affiliation").unwrap_or("").to_owned(),
            )
        })
        .collect()
}

async fn set_affiliation(c: &mut Client, node: &str, jid: &str, aff: &str) -> Element {
    own(
        c,
        "set",
        &format!("<affiliations node='{node}'><affiliation jid='{jid}' affiliation='{aff}'/></affiliations>"),
    )
    .await
}

async fn disco(c: &mut Client, ns: &str, node: Option<&str>, inner: &str) -> Element {
    let node = node.map(|n| format!(" node='{n}'")).unwrap_or_default();
    let r = request(
        c,
        SVC,
        "get",
        "",
        &format!("<query xmlns='{ns}'{node}>{inner}</query>"),
    )
    .await;
    ok(&r);
    r.get_child("query", ns).unwrap().clone()
}

/// The exact feature list (XEP-0060 §10): what is built, nothing else.
const FEATURES: &[&str] = &[
    "access-open",
    "auto-create",
    "config-node",
    "config-node-max",
    "create-and-configure",
    "create-nodes",
    "delete-items",
    "delete-nodes",
    "instant-nodes",
    "item-ids",
    "manage-subscriptions",
    "member-affiliation",
    "meta-data",
    "modify-affiliations",
    "multi-items",
    "multi-subscribe",
    "outcast-affiliation",
    "persistent-items",
    "publish",
    "publish-options",
    "publish-only-affiliation",
    "publisher-affiliation",
    "purge-nodes",
    "retract-items",
    "retrieve-affiliations",
    "retrieve-default",
    "retrieve-default-sub",
    "retrieve-items",
    "retrieve-subscriptions",
    "rsm",
    "subscribe",
    "subscription-notifications",
    "subscription-options",
];

/// §5.1 to §5.5: the server lists the service; its identity and exactly
/// the features built; nodes by name, a node's identity and metadata, its
/// item ids (with paging); whitelist nodes only to their members.
#[tokio::test(flavor = "multi_thread")]
async fn discovery_of_the_service_its_nodes_and_items() {
    let server = server().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let items = alice
        .iq(
            "<iq to='localhost' type='get' id='si'><query xmlns='http://jabber.org/protocol/disco#items'/></iq>",
            "si",
        )
        .await;
    assert!(
        items
            .get_child("query", ns::DISCO_ITEMS)
            .unwrap()
            .children()
            .any(|i| i.attr("jid") == Some(SVC) && i.attr("name") == Some("Publish-Subscribe")),
        "{items}"
    );
    let info = disco(&mut alice, ns::DISCO_INFO, None, "").await;
    let id = info.get_child("identity", ns::DISCO_INFO).unwrap();
    assert_eq!(
        (id.attr("category"), id.attr("type")),
        (Some("pubsub"), Some("service"))
    );
    let mut got: Vec<String> = info
        .children()
        .filter(|f| f.name() == "feature")
        .filter_map(|f| f.attr("var").map(str::to_owned))
        .collect();
    got.sort();
    let mut want: Vec<String> = FEATURES
        .iter()
        .map(|f| format!("{PUBSUB}#{f}"))
        .chain([
            PUBSUB.to_owned(),
            ns::DISCO_INFO.to_owned(),
            ns::DISCO_ITEMS.to_owned(),
        ])
        .collect();
    want.sort();
    assert_eq!(got, want);

    ok(&create(&mut alice, "news", &[("pubsub#title", "Daily news")]).await);
    ok(&create(
        &mut alice,
        "secret",
        &[("pubsub#access_model", "whitelist")],
    )
    .await);
    ok(&create(&mut alice, "blog", &[]).await);
    for i in 1..=5 {
        ok(&publish(&mut alice, "news", &format!("n{i}"), &entry("x")).await);
    }
    // §5.2: nodes by name; the whitelist node only for those it admits.
    let listed = |q: &Element| -> Vec<(String, Option<String>)> {
        q.children()
            .map(|i| {
                assert_eq!(i.attr("jid"), Some(SVC));
                (
                    i.attr("node").unwrap().to_owned(),
                    i.attr("name").map(str::to_owned),
                )
            })
            .collect()
    };
    let q = disco(&mut alice, ns::DISCO_ITEMS, None, "").await;
    assert_eq!(
        listed(&q),
        [
            ("blog".to_owned(), None),
            ("news".to_owned(), Some("Daily news".to_owned())),
            ("secret".to_owned(), None)
        ]
    );
    let q = disco(&mut bob, ns::DISCO_ITEMS, None, "").await;
    assert_eq!(listed(&q).len(), 2, "{q}");
    // §5.3, §5.4: identity leaf and the meta-data form.
    let q = disco(&mut bob, ns::DISCO_INFO, Some("news"), "").await;
    assert_eq!(q.attr("node"), Some("news"));
    let id = q.get_child("identity", ns::DISCO_INFO).unwrap();
    assert_eq!(
        (id.attr("category"), id.attr("type")),
        (Some("pubsub"), Some("leaf"))
    );
    assert_eq!(
        field(&q, "FORM_TYPE").unwrap(),
        ["http://jabber.org/protocol/pubsub#meta-data"]
    );
    assert_eq!(field(&q, "pubsub#title").unwrap(), ["Daily news"]);
    assert_eq!(field(&q, "pubsub#owner").unwrap(), ["alice@localhost"]);
    assert_eq!(field(&q, "pubsub#access_model").unwrap(), ["open"]);
    assert!(field(&q, "pubsub#creation_date").unwrap()[0].ends_with('Z'));
    let r = request(
        &mut bob,
        SVC,
        "get",
        "",
        &format!("<query xmlns='{}' node='secret'/>", ns::DISCO_INFO),
    )
    .await;
    is_err(&r, "not-allowed", Some("closed-node"));
    let r = request(
        &mut bob,
        SVC,
        "get",
        "",
        &format!("<query xmlns='{}' node='nope'/>", ns::DISCO_INFO),
    )
    .await;
    is_err(&r, "item-not-found", None);
    // §5.5: item ids as names, oldest first, pageable.
    let q = disco(&mut bob, ns::DISCO_ITEMS, Some("news"), "").await;
    let names: Vec<&str> = q.children().filter_map(|i| i.attr("name")).collect();
    assert_eq!(names, ["n1", "n2", "n3", "n4", "n5"]);
    assert!(q.children().all(|i| i.attr("node").is_none()), "{q}");
    let q = disco(
        &mut bob,
        ns::DISCO_ITEMS,
        Some("news"),
        &format!("<set xmlns='{RSM}'><max>2</max><before/></set>"),
    )
    .await;
    let names: Vec<&str> = q.children().filter_map(|i| i.attr("name")).collect();
    assert_eq!(names, ["n4", "n5"]);
    let set = q.get_child("set", RSM).unwrap();
    assert_eq!(set.get_child("count", RSM).unwrap().text(), "5");
    assert_eq!(
        set.get_child("first", RSM).unwrap().attr("index"),
        Some("3")
    );
    server.stop().await;
}

/// §8.1 (named, conflict, instant, create-and-configure, who may create),
/// §8.2 (configure get and set, errors), §8.3 (defaults), §8.4 (delete
/// with redirect, notified).
#[tokio::test(flavor = "multi_thread")]
async fn owners_create_configure_and_delete_nodes() {
    let server = server_with(|p| p.admins = vec!["root@localhost".into()]).await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let r = create(&mut alice, "princely_musings", &[]).await;
    ok(&r);
    assert_eq!(
        r.get_child("pubsub", PUBSUB)
            .and_then(|p| p.get_child("create", PUBSUB))
            .and_then(|c| c.attr("node")),
        Some("princely_musings")
    );
    // §8.1.1: an existing NodeID.
    is_err(
        &create(&mut bob, "princely_musings", &[]).await,
        "conflict",
        None,
    );
    // §8.1.1: instant nodes get a name made by the service.
    let r = ps(&mut alice, "set", "<create/>").await;
    ok(&r);
    let instant = r
        .get_child("pubsub", PUBSUB)
        .and_then(|p| p.get_child("create", PUBSUB))
        .and_then(|c| c.attr("node"))
        .unwrap()
        .to_owned();
    assert!(instant.len() >= 16, "{instant}");
    // §8.1.3: create and configure; an unsupported access model.
    ok(&create(
        &mut alice,
        "configured",
        &[
            ("pubsub#title", "Configured"),
            ("pubsub#max_items", "3"),
            ("pubsub#access_model", "whitelist"),
        ],
    )
    .await);
    is_err(
        &create(
            &mut alice,
            "authorized",
            &[("pubsub#access_model", "authorize")],
        )
        .await,
        "not-acceptable",
        Some("unsupported-access-model"),
    );
    is_err(
        &create(&mut alice, "weird", &[("pubsub#max_items", "100000")]).await,
        "not-acceptable",
        None,
    );
    is_err(
        &ps(
            &mut alice,
            "set",
            &format!(
                "<create node='x'/><configure node='x'>{}</configure>",
                form(NODE_CONFIG, &[])
            ),
        )
        .await,
        "bad-request",
        None,
    );
    // §8.2: the owner's form holds the configuration.
    let r = own(&mut alice, "get", "<configure node='configured'/>").await;
    ok(&r);
    assert_eq!(field(&r, "pubsub#title").unwrap(), ["Configured"]);
    assert_eq!(field(&r, "pubsub#max_items").unwrap(), ["3"]);
    assert_eq!(field(&r, "pubsub#access_model").unwrap(), ["whitelist"]);
    // §8.2.3: errors.
    is_err(
        &own(&mut bob, "get", "<configure node='configured'/>").await,
        "forbidden",
        None,
    );
    is_err(
        &own(&mut alice, "get", "<configure/>").await,
        "bad-request",
        Some("nodeid-required"),
    );
    is_err(
        &own(&mut alice, "get", "<configure node='nope'/>").await,
        "item-not-found",
        None,
    );
    // §8.2.4: lowering max_items trims to the newest.
    ok(&create(&mut alice, "trimmed", &[("pubsub#max_items", "max")]).await);
    for i in 1..=4 {
        ok(&publish(&mut alice, "trimmed", &format!("t{i}"), &entry("t")).await);
    }
    let r = own(
        &mut alice,
        "set",
        &format!(
            "<configure node='trimmed'>{}</configure>",
            form(NODE_CONFIG, &[("pubsub#max_items", "2")])
        ),
    )
    .await;
    ok(&r);
    assert_eq!(
        item_ids(&items(&mut alice, "trimmed", "", "").await),
        ["t3", "t4"]
    );
    // A cancelled form changes nothing; a bad value is not-acceptable.
    ok(&own(
        &mut alice,
        "set",
        "<configure node='trimmed'><x xmlns='jabber:x:data' type='cancel'/></configure>",
    )
    .await);
    is_err(
        &own(
            &mut alice,
            "set",
            &format!(
                "<configure node='trimmed'>{}</configure>",
                form(NODE_CONFIG, &[("pubsub#deliver_payloads", "perhaps")])
            ),
        )
        .await,
        "not-acceptable",
        None,
    );
    is_err(
        &own(
            &mut bob,
            "set",
            &format!(
                "<configure node='trimmed'>{}</configure>",
                form(NODE_CONFIG, &[("pubsub#title", "mine")])
            ),
        )
        .await,
        "forbidden",
        None,
    );
    // §8.3: the defaults: open, never the last item, 10 items.
    let r = own(&mut bob, "get", "<default/>").await;
    ok(&r);
    assert_eq!(field(&r, "pubsub#access_model").unwrap(), ["open"]);
    assert_eq!(field(&r, "pubsub#max_items").unwrap(), ["10"]);
    assert_eq!(
        field(&r, "pubsub#send_last_published_item").unwrap(),
        ["never"]
    );
    let r = own(&mut bob, "get", "<default type='collection'/>").await;
    is_err(&r, "feature-not-implemented", Some("unsupported"));
    // §8.4: delete, with redirect, subscribers told; others may not.
    ok(&subscribe(&mut bob, "princely_musings", "bob@localhost").await);
    is_err(
        &own(&mut bob, "set", "<delete node='princely_musings'/>").await,
        "forbidden",
        None,
    );
    is_err(
        &own(&mut alice, "set", "<delete node='nope'/>").await,
        "item-not-found",
        None,
    );
    ok(&own(
        &mut alice,
        "set",
        "<delete node='princely_musings'><redirect uri='xmpp:pubsub.localhost?;node=blog'/></delete>",
    )
    .await);
    let m = event(&mut bob).await;
    let d = m
        .get_child("event", EVENT)
        .and_then(|e| e.get_child("delete", EVENT))
        .unwrap_or_else(|| panic!("{m}"));
    assert_eq!(d.attr("node"), Some("princely_musings"));
    assert_eq!(
        d.get_child("redirect", EVENT).and_then(|r| r.attr("uri")),
        Some("xmpp:pubsub.localhost?;node=blog")
    );
    is_err(
        &items(&mut alice, "princely_musings", "", "").await,
        "item-not-found",
        None,
    );
    // A service admin owns every node.
    let mut root = server.login("root").await;
    ok(&own(&mut root, "get", "<configure node='configured'/>").await);
    ok(&own(&mut root, "set", "<delete node='configured'/>").await);
    server.stop().await;

    // create_nodes = "admins": only they create (§8.1.1 forbidden).
    let server = server_with(|p| {
        p.create_nodes = "admins".into();
        p.admins = vec!["root@localhost".into()];
    })
    .await;
    let mut alice = server.login("alice").await;
    let mut root = server.login("root").await;
    is_err(&create(&mut alice, "n", &[]).await, "forbidden", None);
    // No auto-create for them either: the node does not exist.
    is_err(
        &publish(&mut alice, "n", "1", &entry("x")).await,
        "item-not-found",
        None,
    );
    ok(&create(&mut root, "n", &[]).await);
    server.stop().await;
}

/// §6.1, §6.2, §7.1, §7.2, §8.5: subscribers with a bare or a full JID get
/// each publication once, from the service, with its payload; those who
/// unsubscribed or turned delivery off (§6.3) get nothing; retractions
/// and purges are notified.
#[tokio::test(flavor = "multi_thread")]
async fn subscribers_get_notifications_and_the_others_do_not() {
    let server = server().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let mut carol = server.login("carol").await;
    let mut dave = server.login("dave").await;
    let mut erin = server.login("erin").await;
    ok(&create(&mut alice, "feed", &[]).await);
    // §6.1.2: bare JID; the answer names the subscription with its subid.
    let r = subscribe(&mut bob, "feed", "bob@localhost").await;
    ok(&r);
    let s = subscription(&r);
    assert_eq!(
        (s.attr("node"), s.attr("jid"), s.attr("subscription")),
        (Some("feed"), Some("bob@localhost"), Some("subscribed"))
    );
    assert!(s.attr("subid").is_some_and(|i| !i.is_empty()), "{s}");
    // A full JID: only that resource.
    let carol_jid = carol.jid.clone();
    ok(&subscribe(&mut carol, "feed", &carol_jid).await);
    // Subscribed, then unsubscribed (§6.2).
    ok(&subscribe(&mut dave, "feed", "dave@localhost").await);
    let r = ps(
        &mut dave,
        "set",
        "<unsubscribe node='feed' jid='dave@localhost'/>",
    )
    .await;
    ok(&r);
    assert_eq!(subscription(&r).attr("subscription"), Some("none"));
    // Delivery off (§6.3.7 subscribe and configure).
    let r = ps(
        &mut erin,
        "set",
        &format!(
            "<subscribe node='feed' jid='erin@localhost'/><options>{}</options>",
            form(SUB_OPTIONS, &[("pubsub#deliver", "0")])
        ),
    )
    .await;
    ok(&r);
    assert_eq!(
        field(&r, "pubsub#deliver").unwrap(),
        ["0"],
        "the options come back: {r}"
    );
    // §7.1: publish without an id: the service makes one.
    let r = publish(&mut alice, "feed", "", &entry("Soliloquy")).await;
    ok(&r);
    let id = r
        .get_child("pubsub", PUBSUB)
        .and_then(|p| p.get_child("publish", PUBSUB))
        .and_then(|p| p.get_child("item", PUBSUB))
        .and_then(|i| i.attr("id"))
        .unwrap()
        .to_owned();
    for c in [&mut bob, &mut carol] {
        let m = event(c).await;
        assert_eq!(m.attr("type"), Some("headline"), "{m}");
        assert!(m.attr("id").is_some(), "{m}");
        let it = event_items(&m);
        assert_eq!(it.attr("node"), Some("feed"));
        let item = it.get_child("item", EVENT).unwrap();
        assert_eq!(item.attr("id"), Some(id.as_str()));
        assert!(item.to_string().contains("Soliloquy"), "{m}");
        assert!(subids(&m).is_empty(), "one subscription, no SHIM: {m}");
        no_event_after(&mut alice, c).await;
    }
    no_event_after(&mut alice, &mut dave).await;
    no_event_after(&mut alice, &mut erin).await;
    no_event(&mut alice).await;
    // §7.2: retract with notify.
    ok(&ps(
        &mut alice,
        "set",
        &format!("<retract node='feed' notify='true'><item id='{id}'/></retract>"),
    )
    .await);
    let m = event(&mut bob).await;
    assert_eq!(
        event_items(&m)
            .get_child("retract", EVENT)
            .and_then(|r| r.attr("id")),
        Some(id.as_str())
    );
    event(&mut carol).await;
    no_event_after(&mut alice, &mut erin).await;
    // §8.5: purge, one notification.
    ok(&publish(&mut alice, "feed", "p1", &entry("a")).await);
    ok(&publish(&mut alice, "feed", "p2", &entry("b")).await);
    event(&mut bob).await;
    event(&mut bob).await;
    ok(&own(&mut alice, "set", "<purge node='feed'/>").await);
    let m = event(&mut bob).await;
    assert_eq!(
        m.get_child("event", EVENT)
            .and_then(|e| e.get_child("purge", EVENT))
            .and_then(|p| p.attr("node")),
        Some("feed"),
        "{m}"
    );
    assert!(item_ids(&items(&mut bob, "feed", "", "").await).is_empty());
    is_err(
        &own(&mut bob, "set", "<purge node='feed'/>").await,
        "forbidden",
        None,
    );
    is_err(
        &own(&mut alice, "set", "<purge/>").await,
        "bad-request",
        Some("nodeid-required"),
    );
    // §6.3: erin turns delivery back on and gets the next one.
    let r = ps(
        &mut erin,
        "get",
        "<options node='feed' jid='erin@localhost'/>",
    )
    .await;
    ok(&r);
    assert_eq!(field(&r, "pubsub#deliver").unwrap(), ["0"]);
    ok(&ps(
        &mut erin,
        "set",
        &format!(
            "<options node='feed' jid='erin@localhost'>{}</options>",
            form(SUB_OPTIONS, &[("pubsub#deliver", "true")])
        ),
    )
    .await);
    ok(&publish(&mut alice, "feed", "p3", &entry("c")).await);
    let m = event(&mut erin).await;
    assert_eq!(
        event_items(&m)
            .get_child("item", EVENT)
            .and_then(|i| i.attr("id")),
        Some("p3")
    );
    // §6.4: the default subscription options.
    let r = ps(&mut erin, "get", "<default/>").await;
    ok(&r);
    assert_eq!(field(&r, "pubsub#deliver").unwrap(), ["1"]);
    is_err(
        &ps(&mut erin, "get", "<default node='nope'/>").await,
        "item-not-found",
        None,
    );
    server.stop().await;
}

/// §6.1.3, §6.2.3, §6.3.4 and §6.3.5: the subscriber's errors.
#[tokio::test(flavor = "multi_thread")]
async fn subscription_errors() {
    let server = server_with(|p| p.max_subscriptions_per_node = 2).await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let mut carol = server.login("carol").await;
    ok(&create(&mut alice, "feed", &[]).await);
    // §6.1.3.1: another's JID.
    is_err(
        &subscribe(&mut bob, "feed", "carol@localhost").await,
        "bad-request",
        Some("invalid-jid"),
    );
    is_err(
        &ps(&mut bob, "set", "<subscribe node='feed'/>").await,
        "bad-request",
        Some("invalid-jid"),
    );
    is_err(
        &ps(&mut bob, "set", "<subscribe jid='bob@localhost'/>").await,
        "bad-request",
        Some("nodeid-required"),
    );
    // §6.1.3.12: no such node.
    is_err(
        &subscribe(&mut bob, "nope", "bob@localhost").await,
        "item-not-found",
        None,
    );
    // §6.3.7: options with a node attribute.
    is_err(
        &ps(
            &mut bob,
            "set",
            &format!(
                "<subscribe node='feed' jid='bob@localhost'/><options node='feed'>{}</options>",
                form(SUB_OPTIONS, &[])
            ),
        )
        .await,
        "bad-request",
        None,
    );
    // §6.3.5: digests and bodies are refused.
    for (var, v) in [
        ("pubsub#digest", "1"),
        ("pubsub#include_body", "1"),
        ("pubsub#show-values", "away"),
    ] {
        is_err(
            &ps(
                &mut bob,
                "set",
                &format!(
                    "<subscribe node='feed' jid='bob@localhost'/><options>{}</options>",
                    form(SUB_OPTIONS, &[(var, v)])
                ),
            )
            .await,
            "bad-request",
            Some("invalid-options"),
        );
    }
    // §6.2.3.2: not subscribed; §6.2.3.3: another's subscription.
    let r = ps(
        &mut bob,
        "set",
        "<unsubscribe node='feed' jid='bob@localhost'/>",
    )
    .await;
    is_err(&r, "unexpected-request", Some("not-subscribed"));
    ok(&subscribe(&mut carol, "feed", "carol@localhost").await);
    is_err(
        &ps(
            &mut bob,
            "set",
            "<unsubscribe node='feed' jid='carol@localhost'/>",
        )
        .await,
        "forbidden",
        None,
    );
    is_err(
        &ps(
            &mut bob,
            "set",
            "<unsubscribe node='nope' jid='bob@localhost'/>",
        )
        .await,
        "item-not-found",
        None,
    );
    // §6.2.3.5: a subid that is not the subscription's.
    is_err(
        &ps(
            &mut carol,
            "set",
            "<unsubscribe node='feed' jid='carol@localhost' subid='bogus'/>",
        )
        .await,
        "not-acceptable",
        Some("invalid-subid"),
    );
    // §6.3.4: options errors.
    is_err(
        &ps(&mut bob, "get", "<options node='feed'/>").await,
        "bad-request",
        Some("jid-required"),
    );
    is_err(
        &ps(
            &mut bob,
            "get",
            "<options node='feed' jid='carol@localhost'/>",
        )
        .await,
        "forbidden",
        None,
    );
    is_err(
        &ps(
            &mut bob,
            "get",
            "<options node='feed' jid='bob@localhost'/>",
        )
        .await,
        "unexpected-request",
        Some("not-subscribed"),
    );
    is_err(
        &ps(
            &mut carol,
            "get",
            "<options node='feed' jid='carol@localhost' subid='bogus'/>",
        )
        .await,
        "not-acceptable",
        Some("invalid-subid"),
    );
    is_err(
        &ps(
            &mut carol,
            "get",
            "<options node='nope' jid='carol@localhost'/>",
        )
        .await,
        "item-not-found",
        None,
    );
    is_err(
        &ps(
            &mut carol,
            "set",
            "<options node='feed' jid='carol@localhost'/>",
        )
        .await,
        "bad-request",
        Some("invalid-options"),
    );
    // §6.1.3.9: too many subscriptions (the limit is 2 per node).
    ok(&subscribe(&mut bob, "feed", "bob@localhost").await);
    let mut dave = server.login("dave").await;
    let r = subscribe(&mut dave, "feed", "dave@localhost").await;
    is_err(&r, "policy-violation", Some("too-many-subscriptions"));
    assert_eq!(
        r.get_child("error", ns::CLIENT)
            .and_then(|e| e.attr("type")),
        Some("wait")
    );
    // §6.1.3.4: a whitelist node; §6.1.3.8: an outcast.
    ok(&create(
        &mut alice,
        "closed",
        &[("pubsub#access_model", "whitelist")],
    )
    .await);
    is_err(
        &subscribe(&mut dave, "closed", "dave@localhost").await,
        "not-allowed",
        Some("closed-node"),
    );
    ok(&create(&mut alice, "open", &[]).await);
    ok(&set_affiliation(&mut alice, "open", "dave@localhost", "outcast").await);
    is_err(
        &subscribe(&mut dave, "open", "dave@localhost").await,
        "forbidden",
        None,
    );
    is_err(&items(&mut dave, "open", "", "").await, "forbidden", None);
    server.stop().await;
}

/// §6.1.6 and §12.3: a second subscription with other options has its
/// own subid, the same options give the same subscription back; requests
/// then name the subid; notifications carry the delivering subids in SHIM
/// headers. §5.6: the account's subscriptions, full JIDs included; §5.7:
/// its affiliations.
#[tokio::test(flavor = "multi_thread")]
async fn multiple_subscriptions_have_subids_and_shim_headers() {
    let server = server().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    ok(&create(&mut alice, "feed", &[]).await);
    ok(&create(&mut alice, "other", &[]).await);
    let first = subscription(&subscribe(&mut bob, "feed", "bob@localhost").await);
    let again = subscription(&subscribe(&mut bob, "feed", "bob@localhost").await);
    assert_eq!(
        first.attr("subid"),
        again.attr("subid"),
        "same options, same subscription"
    );
    let quiet = subscription(
        &ps(
            &mut bob,
            "set",
            &format!(
                "<subscribe node='feed' jid='bob@localhost'/><options>{}</options>",
                form(SUB_OPTIONS, &[("pubsub#deliver", "false")])
            ),
        )
        .await,
    );
    assert_ne!(first.attr("subid"), quiet.attr("subid"));
    let (s1, s2) = (
        first.attr("subid").unwrap().to_owned(),
        quiet.attr("subid").unwrap().to_owned(),
    );
    // One notification, naming the subscription that delivers.
    ok(&publish(&mut alice, "feed", "i1", &entry("x")).await);
    let m = event(&mut bob).await;
    assert_eq!(subids(&m), std::slice::from_ref(&s1), "{m}");
    no_event_after(&mut alice, &mut bob).await;
    // §6.2.3.1, §6.3.4.4: the subid is required now.
    is_err(
        &ps(
            &mut bob,
            "set",
            "<unsubscribe node='feed' jid='bob@localhost'/>",
        )
        .await,
        "bad-request",
        Some("subid-required"),
    );
    is_err(
        &ps(
            &mut bob,
            "get",
            "<options node='feed' jid='bob@localhost'/>",
        )
        .await,
        "bad-request",
        Some("subid-required"),
    );
    let r = ps(
        &mut bob,
        "get",
        &format!("<options node='feed' jid='bob@localhost' subid='{s2}'/>"),
    )
    .await;
    ok(&r);
    assert_eq!(field(&r, "pubsub#deliver").unwrap(), ["0"]);
    // §5.6: bare and full JID subscriptions, on every node; a node filter.
    let bob_jid = bob.jid.clone();
    ok(&subscribe(&mut bob, "other", &bob_jid).await);
    let r = ps(&mut bob, "get", "<subscriptions/>").await;
    ok(&r);
    let subs: Vec<(String, String, String)> = r
        .get_child("pubsub", PUBSUB)
        .and_then(|p| p.get_child("subscriptions", PUBSUB))
        .unwrap()
        .children()
        .map(|s| {
            assert_eq!(s.attr("subscription"), Some("subscribed"));
            (
                s.attr("node").unwrap().to_owned(),
                s.attr("jid").unwrap().to_owned(),
                s.attr("subid").unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(subs.len(), 3, "{r}");
    assert!(subs.contains(&("other".into(), bob_jid.clone(), subs[2].2.clone())));
    let r = ps(&mut bob, "get", "<subscriptions node='other'/>").await;
    let n = r
        .get_child("pubsub", PUBSUB)
        .and_then(|p| p.get_child("subscriptions", PUBSUB))
        .unwrap()
        .children()
        .count();
    assert_eq!(n, 1);
    // Unsubscribing one by subid leaves the other.
    ok(&ps(
        &mut bob,
        "set",
        &format!("<unsubscribe node='feed' jid='bob@localhost' subid='{s1}'/>"),
    )
    .await);
    ok(&publish(&mut alice, "feed", "i2", &entry("y")).await);
    no_event_after(&mut alice, &mut bob).await;
    // §5.7: the requester's affiliations.
    let r = ps(&mut alice, "get", "<affiliations/>").await;
    ok(&r);
    let affs: Vec<(String, String)> = r
        .get_child("pubsub", PUBSUB)
        .and_then(|p| p.get_child("affiliations", PUBSUB))
        .unwrap()
        .children()
        .map(|a| {
            (
                a.attr("node").unwrap().to_owned(),
                a.attr("affiliation").unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        affs,
        [
            ("feed".to_owned(), "owner".to_owned()),
            ("other".to_owned(), "owner".to_owned())
        ]
    );
    let r = ps(&mut bob, "get", "<affiliations/>").await;
    ok(&r);
    assert_eq!(
        r.get_child("pubsub", PUBSUB)
            .and_then(|p| p.get_child("affiliations", PUBSUB))
            .unwrap()
            .children()
            .count(),
        0
    );
    server.stop().await;
}

/// §6.5: all items, the newest max_items, by id, XEP-0059 pages; a node
/// keeps its max_items newest; republishing an id replaces the item.
#[tokio::test(flavor = "multi_thread")]
async fn items_are_retrieved_whole_by_id_or_by_page() {
    let server = server().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    ok(&create(&mut alice, "log", &[("pubsub#max_items", "5")]).await);
    for i in 1..=7 {
        ok(&publish(
            &mut alice,
            "log",
            &format!("e{i}"),
            &entry(&format!("v{i}")),
        )
        .await);
    }
    assert_eq!(
        item_ids(&items(&mut bob, "log", "", "").await),
        ["e3", "e4", "e5", "e6", "e7"]
    );
    assert_eq!(
        item_ids(&items(&mut bob, "log", "max_items='2'", "").await),
        ["e6", "e7"]
    );
    let r = items(
        &mut bob,
        "log",
        "",
        "<item id='e7'/><item id='e4'/><item id='e1'/>",
    )
    .await;
    assert_eq!(item_ids(&r), ["e4", "e7"]);
    assert!(r.to_string().contains("v7"), "payloads come back: {r}");
    // Republishing an id replaces it (and makes it the newest).
    ok(&publish(&mut alice, "log", "e4", &entry("v4 again")).await);
    let r = items(&mut bob, "log", "", "").await;
    assert_eq!(item_ids(&r), ["e3", "e5", "e6", "e7", "e4"]);
    assert!(r.to_string().contains("v4 again"));
    // Pages, in publication order.
    let page = |inner: &str| format!("<set xmlns='{RSM}'>{inner}</set>");
    let r = ps(
        &mut bob,
        "get",
        &format!("<items node='log'/>{}", page("<max>2</max>")),
    )
    .await;
    assert_eq!(item_ids(&r), ["e3", "e5"]);
    let set = r
        .get_child("pubsub", PUBSUB)
        .unwrap()
        .get_child("set", RSM)
        .unwrap();
    assert_eq!(set.get_child("count", RSM).unwrap().text(), "5");
    assert_eq!(set.get_child("last", RSM).unwrap().text(), "e5");
    let r = ps(
        &mut bob,
        "get",
        &format!(
            "<items node='log'/>{}",
            page("<max>2</max><after>e5</after>")
        ),
    )
    .await;
    assert_eq!(item_ids(&r), ["e6", "e7"]);
    let r = ps(
        &mut bob,
        "get",
        &format!("<items node='log'/>{}", page("<max>2</max><before/>")),
    )
    .await;
    assert_eq!(item_ids(&r), ["e7", "e4"]);
    let r = ps(
        &mut bob,
        "get",
        &format!("<items node='log'/>{}", page("<max>0</max>")),
    )
    .await;
    assert!(item_ids(&r).is_empty());
    is_err(
        &ps(
            &mut bob,
            "get",
            &format!("<items node='log'/>{}", page("<after>gone</after>")),
        )
        .await,
        "item-not-found",
        None,
    );
    // §6.5.9: errors.
    is_err(
        &items(&mut bob, "nope", "", "").await,
        "item-not-found",
        None,
    );
    is_err(
        &ps(&mut bob, "get", "<items/>").await,
        "bad-request",
        Some("nodeid-required"),
    );
    is_err(
        &items(&mut bob, "log", "max_items='many'", "").await,
        "bad-request",
        None,
    );
    // §6.5.9.11: no such item: an empty list.
    assert!(item_ids(&items(&mut bob, "log", "", "<item id='nope'/>").await).is_empty());
    server.stop().await;
}

/// §4.5, §6.1.3, §6.5.9: the access models decide who subscribes and
/// retrieves; a changed access model removes the subscriptions it no
/// longer admits, telling the subscribers (§12.8).
#[tokio::test(flavor = "multi_thread")]
async fn access_models_decide_who_subscribes_and_reads() {
    use starling_testkit::roster::{self, Subscription};
    let server = server().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let mut carol = server.login("carol").await;
    // bob is subscribed to alice's presence, in her group Friends; carol
    // is in her roster without a subscription, in group Work.
    for (who, sub, group) in [
        ("bob", Subscription::From, "Friends"),
        ("carol", Subscription::None, "Work"),
    ] {
        roster::put(&server, "alice", who, sub, &[group]).await;
    }
    ok(&create(&mut alice, "p", &[("pubsub#access_model", "presence")]).await);
    ok(&publish(&mut alice, "p", "1", &entry("x")).await);
    ok(&subscribe(&mut bob, "p", "bob@localhost").await);
    assert_eq!(item_ids(&items(&mut bob, "p", "", "").await), ["1"]);
    is_err(
        &subscribe(&mut carol, "p", "carol@localhost").await,
        "not-authorized",
        Some("presence-subscription-required"),
    );
    is_err(
        &items(&mut carol, "p", "", "").await,
        "not-authorized",
        Some("presence-subscription-required"),
    );
    ok(&create(
        &mut alice,
        "r",
        &[
            ("pubsub#access_model", "roster"),
            ("pubsub#roster_groups_allowed", "Work"),
        ],
    )
    .await);
    ok(&items(&mut carol, "r", "", "").await);
    is_err(
        &items(&mut bob, "r", "", "").await,
        "not-authorized",
        Some("not-in-roster-group"),
    );
    // Whitelist: members (and publishers) in, others out.
    ok(&create(&mut alice, "w", &[("pubsub#access_model", "whitelist")]).await);
    ok(&publish(&mut alice, "w", "1", &entry("x")).await);
    is_err(
        &items(&mut bob, "w", "", "").await,
        "not-allowed",
        Some("closed-node"),
    );
    ok(&set_affiliation(&mut alice, "w", "bob@localhost", "member").await);
    assert_eq!(item_ids(&items(&mut bob, "w", "", "").await), ["1"]);
    ok(&subscribe(&mut bob, "w", "bob@localhost").await);
    // An open node turned whitelist: carol (not a member) loses her
    // subscription and is told; bob (a member) keeps his.
    ok(&create(&mut alice, "o", &[]).await);
    ok(&subscribe(&mut carol, "o", "carol@localhost").await);
    ok(&set_affiliation(&mut alice, "o", "bob@localhost", "member").await);
    ok(&subscribe(&mut bob, "o", "bob@localhost").await);
    ok(&own(
        &mut alice,
        "set",
        &format!(
            "<configure node='o'>{}</configure>",
            form(NODE_CONFIG, &[("pubsub#access_model", "whitelist")])
        ),
    )
    .await);
    let m = event(&mut carol).await;
    let s = m
        .get_child("event", EVENT)
        .and_then(|e| e.get_child("subscription", EVENT))
        .unwrap_or_else(|| panic!("{m}"));
    assert_eq!(
        (s.attr("node"), s.attr("jid"), s.attr("subscription")),
        (Some("o"), Some("carol@localhost"), Some("none"))
    );
    no_event_after(&mut alice, &mut bob).await;
    ok(&publish(&mut alice, "o", "1", &entry("x")).await);
    event(&mut bob).await;
    no_event_after(&mut alice, &mut carol).await;
    server.stop().await;
}

/// §8.8 and §8.9: owners list and change subscriptions and affiliations;
/// subscribers are told; publishers publish, publish-only entities
/// publish and retract their own items only, outcasts lose their
/// subscriptions; the last owner cannot leave; failed entries come back
/// in a not-acceptable error, the others are applied.
#[tokio::test(flavor = "multi_thread")]
async fn owners_manage_subscriptions_and_affiliations() {
    let server = server().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let mut carol = server.login("carol").await;
    let mut dave = server.login("dave").await;
    ok(&create(&mut alice, "n", &[]).await);
    ok(&subscribe(&mut bob, "n", "bob@localhost").await);
    // §8.8.1.
    let r = own(&mut alice, "get", "<subscriptions node='n'/>").await;
    ok(&r);
    let list = r
        .get_child("pubsub", OWNER)
        .and_then(|p| p.get_child("subscriptions", OWNER))
        .unwrap();
    assert_eq!(list.attr("node"), Some("n"));
    let subs: Vec<(Option<&str>, Option<&str>)> = list
        .children()
        .map(|s| (s.attr("jid"), s.attr("subscription")))
        .collect();
    assert_eq!(subs, [(Some("bob@localhost"), Some("subscribed"))]);
    is_err(
        &own(&mut bob, "get", "<subscriptions node='n'/>").await,
        "forbidden",
        None,
    );
    is_err(
        &own(&mut alice, "get", "<subscriptions node='nope'/>").await,
        "item-not-found",
        None,
    );
    // §8.8.2: carol subscribed, bob removed, one invalid entry.
    let r = own(
        &mut alice,
        "set",
        "<subscriptions node='n'><subscription jid='carol@localhost' subscription='subscribed'/><subscription jid='bob@localhost' subscription='none'/><subscription jid='dave@localhost' subscription='pending'/></subscriptions>",
    )
    .await;
    is_err(&r, "not-acceptable", None);
    let failed: Vec<(Option<&str>, Option<&str>)> = r
        .get_child("pubsub", OWNER)
        .and_then(|p| p.get_child("subscriptions", OWNER))
        .unwrap()
        .children()
        .map(|s| (s.attr("jid"), s.attr("subscription")))
        .collect();
    assert_eq!(failed, [(Some("dave@localhost"), Some("none"))], "{r}");
    for (c, state) in [(&mut carol, "subscribed"), (&mut bob, "none")] {
        let m = event(c).await;
        let s = m
            .get_child("event", EVENT)
            .and_then(|e| e.get_child("subscription", EVENT))
            .unwrap_or_else(|| panic!("{m}"));
        assert_eq!(
            (s.attr("node"), s.attr("subscription")),
            (Some("n"), Some(state))
        );
    }
    ok(&publish(&mut alice, "n", "1", &entry("x")).await);
    event(&mut carol).await;
    no_event_after(&mut alice, &mut bob).await;
    // §8.9.1, §8.9.2: affiliations.
    ok(&own(
        &mut alice,
        "set",
        "<affiliations node='n'><affiliation jid='bob@localhost' affiliation='publisher'/><affiliation jid='dave@localhost/laptop' affiliation='publish-only'/></affiliations>",
    )
    .await);
    let r = own(&mut alice, "get", "<affiliations node='n'/>").await;
    ok(&r);
    assert_eq!(
        affiliations(&r),
        [
            ("alice@localhost".to_owned(), "owner".to_owned()),
            ("bob@localhost".to_owned(), "publisher".to_owned()),
            ("dave@localhost".to_owned(), "publish-only".to_owned())
        ]
    );
    is_err(
        &own(&mut bob, "get", "<affiliations node='n'/>").await,
        "forbidden",
        None,
    );
    // Publishers publish and retract any item; they do not configure.
    ok(&publish(&mut bob, "n", "by-bob", &entry("b")).await);
    event(&mut carol).await;
    ok(&publish(&mut dave, "n", "by-dave", &entry("d")).await);
    event(&mut carol).await;
    is_err(
        &own(&mut bob, "get", "<configure node='n'/>").await,
        "forbidden",
        None,
    );
    // Publish-only: its own items, nothing to read.
    is_err(
        &ps(
            &mut dave,
            "set",
            "<retract node='n'><item id='by-bob'/></retract>",
        )
        .await,
        "forbidden",
        None,
    );
    ok(&ps(
        &mut dave,
        "set",
        "<retract node='n'><item id='by-dave'/></retract>",
    )
    .await);
    event(&mut carol).await;
    is_err(&items(&mut dave, "n", "", "").await, "forbidden", None);
    ok(&ps(
        &mut bob,
        "set",
        "<retract node='n'><item id='1'/></retract>",
    )
    .await);
    event(&mut carol).await;
    // Others may not publish (publish model: publishers).
    let mut erin = server.login("erin").await;
    is_err(
        &publish(&mut erin, "n", "e", &entry("e")).await,
        "forbidden",
        None,
    );
    // An outcast loses its subscription, and is told.
    ok(&set_affiliation(&mut alice, "n", "carol@localhost", "outcast").await);
    let m = event(&mut carol).await;
    assert_eq!(
        m.get_child("event", EVENT)
            .and_then(|e| e.get_child("subscription", EVENT))
            .and_then(|s| s.attr("subscription")),
        Some("none"),
        "{m}"
    );
    // §8.9.2.4: the last owner cannot leave; bad entries come back.
    let r = own(
        &mut alice,
        "set",
        "<affiliations node='n'><affiliation jid='alice@localhost' affiliation='none'/><affiliation jid='erin@localhost' affiliation='member'/><affiliation jid='frank@localhost' affiliation='king'/></affiliations>",
    )
    .await;
    is_err(&r, "not-acceptable", None);
    let failed: Vec<(String, String)> = r
        .get_child("pubsub", OWNER)
        .and_then(|p| p.get_child("affiliations", OWNER))
        .unwrap()
        .children()
        .map(|a| {
            (
                a.attr("jid").unwrap().to_owned(),
                a.attr("affiliation").unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        failed,
        [
            ("frank@localhost".to_owned(), "none".to_owned()),
            ("alice@localhost".to_owned(), "owner".to_owned())
        ]
    );
    let now = affiliations(&own(&mut alice, "get", "<affiliations node='n'/>").await);
    assert!(
        now.contains(&("erin@localhost".into(), "member".into())),
        "{now:?}"
    );
    assert!(
        now.contains(&("alice@localhost".into(), "owner".into())),
        "{now:?}"
    );
    is_err(
        &own(
            &mut alice,
            "set",
            "<affiliations node='n'><affiliation jid='erin@localhost' affiliation='member'/><affiliation jid='erin@localhost/x' affiliation='publisher'/></affiliations>",
        )
        .await,
        "bad-request",
        None,
    );
    // With a second owner, the first may leave.
    ok(&set_affiliation(&mut alice, "n", "bob@localhost", "owner").await);
    ok(&set_affiliation(&mut alice, "n", "alice@localhost", "none").await);
    is_err(
        &own(&mut alice, "get", "<configure node='n'/>").await,
        "forbidden",
        None,
    );
    ok(&own(&mut bob, "get", "<configure node='n'/>").await);
    server.stop().await;
}

/// §7.1.3, §7.1.4, §7.1.5, §7.2.3: the publisher's errors, auto-create,
/// publish-options, the publish models.
#[tokio::test(flavor = "multi_thread")]
async fn publishing_rules_and_errors() {
    let server = server_with(|p| p.max_item_bytes = 200).await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    // §7.1.4: auto-create, the publisher owns it.
    ok(&publish(&mut alice, "auto", "1", "<x xmlns='urn:x'/>").await);
    let r = own(&mut alice, "get", "<affiliations node='auto'/>").await;
    assert_eq!(
        affiliations(&r),
        [("alice@localhost".to_owned(), "owner".to_owned())]
    );
    // §7.1.3.1: not a publisher.
    is_err(
        &publish(&mut bob, "auto", "2", "<x xmlns='urn:x'/>").await,
        "forbidden",
        None,
    );
    // §7.1.3.6, §7.1.3.7: the item and its payload.
    is_err(
        &ps(&mut alice, "set", "<publish node='auto'/>").await,
        "bad-request",
        Some("item-required"),
    );
    is_err(
        &publish(
            &mut alice,
            "auto",
            "3",
            "<a xmlns='urn:x'/><b xmlns='urn:x'/>",
        )
        .await,
        "bad-request",
        Some("invalid-payload"),
    );
    is_err(
        &ps(
            &mut alice,
            "set",
            "<publish node='auto'><item id='a'/><item id='b'/></publish>",
        )
        .await,
        "bad-request",
        Some("invalid-payload"),
    );
    is_err(
        &publish(&mut alice, "auto", "4", "").await,
        "bad-request",
        Some("payload-required"),
    );
    is_err(
        &ps(&mut alice, "set", "<publish><item/></publish>").await,
        "bad-request",
        Some("nodeid-required"),
    );
    // §7.1.3.5: too big.
    let big = format!("<x xmlns='urn:x'>{}</x>", "a".repeat(300));
    is_err(
        &publish(&mut alice, "auto", "5", &big).await,
        "not-acceptable",
        Some("payload-too-big"),
    );
    // §7.1.5: preconditions.
    let opts = |fields: &[(&str, &str)]| {
        format!(
            "<publish-options>{}</publish-options>",
            form("http://jabber.org/protocol/pubsub#publish-options", fields)
        )
    };
    let r = ps(
        &mut alice,
        "set",
        &format!(
            "<publish node='auto'><item id='6'><x xmlns='urn:x'/></item></publish>{}",
            opts(&[("pubsub#access_model", "whitelist")])
        ),
    )
    .await;
    is_err(&r, "conflict", Some("precondition-not-met"));
    ok(&ps(
        &mut alice,
        "set",
        &format!(
            "<publish node='auto'><item id='6'><x xmlns='urn:x'/></item></publish>{}",
            opts(&[("pubsub#access_model", "open")])
        ),
    )
    .await);
    // Permission comes first: no configuration leaks to non-publishers.
    let r = ps(
        &mut bob,
        "set",
        &format!(
            "<publish node='auto'><item id='7'><x xmlns='urn:x'/></item></publish>{}",
            opts(&[("pubsub#access_model", "whitelist")])
        ),
    )
    .await;
    is_err(&r, "forbidden", None);
    // A node created by a publication takes the options as configuration.
    ok(&ps(
        &mut alice,
        "set",
        &format!(
            "<publish node='private'><item id='1'><x xmlns='urn:x'/></item></publish>{}",
            opts(&[("pubsub#access_model", "whitelist")])
        ),
    )
    .await);
    is_err(
        &items(&mut bob, "private", "", "").await,
        "not-allowed",
        Some("closed-node"),
    );
    is_err(
        &ps(
            &mut alice,
            "set",
            &format!(
                "<publish node='bad'><item id='1'><x xmlns='urn:x'/></item></publish>{}",
                opts(&[("pubsub#unknown", "1")])
            ),
        )
        .await,
        "not-acceptable",
        Some("invalid-options"),
    );
    // §7.2.3: retract errors.
    is_err(
        &ps(&mut alice, "set", "<retract node='auto'/>").await,
        "bad-request",
        Some("item-required"),
    );
    is_err(
        &ps(
            &mut alice,
            "set",
            "<retract node='auto'><item id='nope'/></retract>",
        )
        .await,
        "item-not-found",
        None,
    );
    is_err(
        &ps(&mut alice, "set", "<retract><item id='1'/></retract>").await,
        "bad-request",
        Some("nodeid-required"),
    );
    is_err(
        &ps(
            &mut alice,
            "set",
            "<retract node='nope'><item id='1'/></retract>",
        )
        .await,
        "item-not-found",
        None,
    );
    is_err(
        &ps(
            &mut bob,
            "set",
            "<retract node='auto'><item id='1'/></retract>",
        )
        .await,
        "forbidden",
        None,
    );
    // Publish models: subscribers, then anyone.
    ok(&create(
        &mut alice,
        "subs",
        &[("pubsub#publish_model", "subscribers")],
    )
    .await);
    is_err(
        &publish(&mut bob, "subs", "b", "<x xmlns='urn:x'/>").await,
        "forbidden",
        None,
    );
    ok(&subscribe(&mut bob, "subs", "bob@localhost").await);
    ok(&publish(&mut bob, "subs", "b", "<x xmlns='urn:x'/>").await);
    ok(&create(&mut alice, "wall", &[("pubsub#publish_model", "open")]).await);
    ok(&publish(&mut bob, "wall", "b", "<x xmlns='urn:x'/>").await);
    // A notification-only node (§7.1.2.2): items without payloads, an
    // empty item accepted.
    ok(&create(
        &mut alice,
        "bare",
        &[
            ("pubsub#deliver_payloads", "0"),
            ("pubsub#notification_type", "normal"),
        ],
    )
    .await);
    ok(&subscribe(&mut bob, "bare", "bob@localhost").await);
    ok(&publish(&mut alice, "bare", "e", "").await);
    let m = event(&mut bob).await;
    assert_eq!(m.attr("type"), Some("normal"));
    let item = event_items(&m).get_child("item", EVENT).unwrap().clone();
    assert_eq!(item.attr("id"), Some("e"));
    assert_eq!(item.children().count(), 0, "{m}");
    ok(&publish(&mut alice, "bare", "f", "<x xmlns='urn:x'>secret</x>").await);
    let m = event(&mut bob).await;
    assert!(!m.to_string().contains("secret"), "{m}");
    assert!(items(&mut bob, "bare", "", "")
        .await
        .to_string()
        .contains("secret"));
    server.stop().await;
}

/// §6.1.7: with send_last_published_item on_sub a new subscriber gets the
/// last item, delay-stamped; by default (never) it does not. §8.2.5.3:
/// notify_config tells subscribers of a configuration change.
#[tokio::test(flavor = "multi_thread")]
async fn the_last_item_on_subscription_and_configuration_notices() {
    let server = server().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    ok(&create(&mut alice, "quiet", &[]).await);
    ok(&publish(&mut alice, "quiet", "q", &entry("q")).await);
    ok(&subscribe(&mut bob, "quiet", "bob@localhost").await);
    no_event(&mut bob).await;
    ok(&create(
        &mut alice,
        "status",
        &[
            ("pubsub#send_last_published_item", "on_sub"),
            ("pubsub#notify_config", "1"),
        ],
    )
    .await);
    is_err(
        &create(
            &mut alice,
            "x",
            &[("pubsub#send_last_published_item", "on_sub_and_presence")],
        )
        .await,
        "not-acceptable",
        None,
    );
    ok(&publish(&mut alice, "status", "old", &entry("old")).await);
    ok(&publish(&mut alice, "status", "last", &entry("last")).await);
    ok(&subscribe(&mut bob, "status", "bob@localhost").await);
    let m = event(&mut bob).await;
    let listed = event_items(&m);
    let ids: Vec<&str> = listed.children().filter_map(|i| i.attr("id")).collect();
    assert_eq!(ids, ["last"]);
    let delay = m
        .get_child("delay", ns::DELAY)
        .unwrap_or_else(|| panic!("{m}"));
    assert_eq!(delay.attr("from"), Some(SVC));
    assert!(delay.attr("stamp").is_some());
    no_event(&mut bob).await;
    ok(&own(
        &mut alice,
        "set",
        &format!(
            "<configure node='status'>{}</configure>",
            form(NODE_CONFIG, &[("pubsub#title", "Status")])
        ),
    )
    .await);
    let m = event(&mut bob).await;
    let c = m
        .get_child("event", EVENT)
        .and_then(|e| e.get_child("configuration", EVENT))
        .unwrap_or_else(|| panic!("{m}"));
    assert_eq!(c.attr("node"), Some("status"));
    assert_eq!(field(c, "pubsub#title").unwrap(), ["Status"]);
    server.stop().await;
}

/// Nodes, items, subscriptions and affiliations are stored: a restarted
/// server has them.
#[tokio::test(flavor = "multi_thread")]
async fn everything_survives_a_restart() {
    let dir =
        std::env::temp_dir().join(format!("starling-pubsub-{}", starling_proto::random_id(10)));
    let d = dir.clone();
    let server = TestServer::start_with(|c| {
        c.server.data_dir = d;
        c.modules.get_mut::<Pubsub>().enabled = true;
    })
    .await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    ok(&create(
        &mut alice,
        "kept",
        &[("pubsub#title", "Kept"), ("pubsub#max_items", "20")],
    )
    .await);
    for i in 1..=3 {
        ok(&publish(
            &mut alice,
            "kept",
            &format!("k{i}"),
            &entry(&format!("v{i}")),
        )
        .await);
    }
    ok(&subscribe(&mut bob, "kept", "bob@localhost").await);
    ok(&set_affiliation(&mut alice, "kept", "bob@localhost", "publisher").await);
    server.server.shutdown().await; // keeps the data directory

    let d = dir.clone();
    let server = TestServer::start_with(|c| {
        c.server.data_dir = d;
        c.modules.get_mut::<Pubsub>().enabled = true;
    })
    .await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let r = items(&mut bob, "kept", "", "").await;
    assert_eq!(item_ids(&r), ["k1", "k2", "k3"]);
    assert!(r.to_string().contains("v3"));
    let r = own(&mut alice, "get", "<configure node='kept'/>").await;
    assert_eq!(field(&r, "pubsub#title").unwrap(), ["Kept"]);
    ok(&publish(&mut bob, "kept", "k4", &entry("v4")).await);
    let m = event(&mut bob).await;
    assert_eq!(
        event_items(&m)
            .get_child("item", EVENT)
            .and_then(|i| i.attr("id")),
        Some("k4")
    );
    server.stop().await;
}

/// A deleted account loses its subscriptions and affiliations; a node it
/// owned alone stays, for the service admins.
#[tokio::test(flavor = "multi_thread")]
async fn deleted_accounts_leave_their_nodes_to_the_admins() {
    use starling_proto::BareJid;
    let server = server_with(|p| p.admins = vec!["root@localhost".into()]).await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    ok(&create(&mut alice, "a", &[]).await);
    ok(&subscribe(&mut bob, "a", "bob@localhost").await);
    let bob_jid = bob.jid.clone();
    ok(&subscribe(&mut bob, "a", &bob_jid).await);
    ok(&set_affiliation(&mut alice, "a", "bob@localhost", "publisher").await);
    let env = &server.server.env;
    env.delete_account(&BareJid::new("bob@localhost").unwrap())
        .await
        .unwrap();
    let r = own(&mut alice, "get", "<subscriptions node='a'/>").await;
    ok(&r);
    assert_eq!(
        r.get_child("pubsub", OWNER)
            .and_then(|p| p.get_child("subscriptions", OWNER))
            .unwrap()
            .children()
            .count(),
        0,
        "{r}"
    );
    assert_eq!(
        affiliations(&own(&mut alice, "get", "<affiliations node='a'/>").await),
        [("alice@localhost".to_owned(), "owner".to_owned())]
    );
    env.delete_account(&BareJid::new("alice@localhost").unwrap())
        .await
        .unwrap();
    let mut root = server.login("root").await;
    let r = own(&mut root, "get", "<affiliations node='a'/>").await;
    assert!(affiliations(&r).is_empty(), "{r}");
    ok(&set_affiliation(&mut root, "a", "carol@localhost", "owner").await);
    ok(&own(&mut root, "set", "<delete node='a'/>").await);
    server.stop().await;
}

/// Bad input: names that look like SQL, very long names and ids, JID
/// addressing, other namespaces, messages, empty requests; and the
/// service is not there when the module is off (the default).
#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_refused_or_stored_as_given() {
    let server = server().await;
    let mut alice = server.login("alice").await;
    let sql = "x'); DROP TABLE pubsub_nodes; --";
    let esc = "x&apos;); DROP TABLE pubsub_nodes; --";
    ok(&create(&mut alice, esc, &[]).await);
    ok(&publish(
        &mut alice,
        esc,
        "it&apos; OR &apos;1&apos;=&apos;1",
        &entry("%_"),
    )
    .await);
    let r = items(&mut alice, esc, "", "").await;
    assert_eq!(item_ids(&r), ["it' OR '1'='1"]);
    let q = disco(&mut alice, ns::DISCO_ITEMS, None, "").await;
    assert!(q.children().any(|i| i.attr("node") == Some(sql)), "{q}");
    let long = "n".repeat(1025);
    is_err(
        &create(&mut alice, &long, &[]).await,
        "not-acceptable",
        None,
    );
    is_err(
        &items(&mut alice, &long, "", "").await,
        "not-acceptable",
        None,
    );
    let long_id = "i".repeat(1025);
    is_err(
        &publish(&mut alice, esc, &long_id, &entry("x")).await,
        "not-acceptable",
        None,
    );
    // JID addressing is not built; other namespaces are not served.
    let r = request(
        &mut alice,
        &format!("node@{SVC}"),
        "get",
        PUBSUB,
        "<items node='x'/>",
    )
    .await;
    assert_eq!(error_condition(&r).as_deref(), Some("service-unavailable"));
    let r = request(
        &mut alice,
        SVC,
        "get",
        "",
        "<query xmlns='jabber:iq:version'/>",
    )
    .await;
    assert_eq!(error_condition(&r).as_deref(), Some("service-unavailable"));
    is_err(&ps(&mut alice, "get", "").await, "bad-request", None);
    is_err(
        &ps(&mut alice, "set", "<items node='x'/>").await,
        "bad-request",
        None,
    );
    alice.send(&msg(SVC).id("m1").body("hi").to_string()).await;
    let m = alice
        .recv_until(|e| e.name() == "message" && e.attr("id") == Some("m1"))
        .await;
    assert_eq!(error_condition(&m).as_deref(), Some("service-unavailable"));
    server.stop().await;

    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let r = request(&mut alice, SVC, "get", "", &query(ns::DISCO_INFO, "")).await;
    assert_eq!(
        error_condition(&r).as_deref(),
        Some("remote-server-not-found"),
        "off by default: {r}"
    );
    server.stop().await;
}
