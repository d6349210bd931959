//! Publish-subscribe (XEP-0060) and PEP (XEP-0163): nodes, items,
//! subscriptions, affiliations.

use super::{creds, jid};
use starling_core::storage::{Storage, StorageError};

/// Publish-subscribe (XEP-0060, PEP XEP-0163): nodes created (a second
/// creation a conflict), read, listed by name in byte order per service,
/// reconfigured and deleted with their items, subscriptions and
/// affiliations; writes to a missing node refused with nothing written;
/// items newest first (republishing an id replaces it and makes it the
/// newest), trimmed to `max_items` in the publication (the removed ids
/// oldest first), read with a maximum and by id, retracted, purged and
/// trimmed; the newest item of every node in one call; several
/// subscriptions per JID, replaced, removed one or all, listed per JID;
/// affiliations set, replaced and deleted by `none`, listed per JID;
/// account deletion: the account's PEP service, and its bare and full-JID
/// rows on other services, while JIDs that merely share a prefix (or that
/// a LIKE pattern of the JID would match) keep theirs. Names, ids and
/// payloads that look like SQL or are not ASCII are data.
pub async fn pubsub(s: &Storage) {
    use starling_core::storage::{PubsubSubscription, StoredItem, StoredNode};
    let p = s.pubsub.as_ref();
    let node = |service: &str, name: &str, config: &str, created_at| StoredNode {
        service: service.to_owned(),
        node: name.to_owned(),
        config: config.to_owned(),
        created_at,
    };
    let item = |id: &str, payload: &str, seq| StoredItem {
        id: id.to_owned(),
        publisher: "alice@example.org/phone".to_owned(),
        payload: payload.to_owned(),
        seq,
    };
    let sub = |j: &str, subid: &str, state: &str, options: &str| PubsubSubscription {
        jid: j.to_owned(),
        subid: subid.to_owned(),
        state: state.to_owned(),
        options: options.to_owned(),
    };
    let item_ids = |items: Vec<StoredItem>| -> Vec<String> {
        items.into_iter().map(|i| i.id).collect::<Vec<_>>()
    };
    let strings = |v: &[&str]| -> Vec<String> { v.iter().map(|x| (*x).to_owned()).collect() };
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    };
    let pep = "alice@example.org";
    let svc = "pubsub.example.org";
    let blog = "urn:xmpp:microblog:0";

    // Nothing yet; reads and deletions of a missing node are no errors.
    assert_eq!(p.node(pep, blog).await.unwrap(), None);
    assert!(p.nodes(pep).await.unwrap().is_empty());
    assert!(!p.set_node_config(pep, blog, "c").await.unwrap());
    assert!(!p.delete_node(pep, blog).await.unwrap());
    assert!(p.items(pep, blog, None).await.unwrap().is_empty());
    assert!(p.last_items(pep).await.unwrap().is_empty());
    assert!(!p.retract(pep, blog, "a").await.unwrap());
    assert_eq!(p.purge(pep, blog).await.unwrap(), 0);
    assert!(p.trim(pep, blog, 1).await.unwrap().is_empty());
    assert_eq!(
        p.remove_subscription(pep, blog, "bob@example.org", None)
            .await
            .unwrap(),
        0
    );
    // Writes to a missing node are refused, and write nothing.
    assert!(matches!(
        p.publish(pep, blog, &item("a", "<a/>", 1), None).await,
        Err(StorageError::Backend(_))
    ));
    assert!(matches!(
        p.set_subscription(pep, blog, &sub("bob@example.org", "s1", "subscribed", ""))
            .await,
        Err(StorageError::Backend(_))
    ));
    assert!(matches!(
        p.set_affiliation(pep, blog, "bob@example.org", "member")
            .await,
        Err(StorageError::Backend(_))
    ));
    assert!(p.items(pep, blog, None).await.unwrap().is_empty());
    assert!(p.subscriptions(pep, blog).await.unwrap().is_empty());
    assert!(p.affiliations(pep, blog).await.unwrap().is_empty());
    assert!(p
        .subscriptions_of(pep, "bob@example.org")
        .await
        .unwrap()
        .is_empty());
    assert!(p
        .affiliations_of(pep, "bob@example.org")
        .await
        .unwrap()
        .is_empty());

    // Create, conflict, read; the config is stored verbatim.
    let evil_config = "v1'); DROP TABLE pubsub_nodes; --\n{\"access\":\"presence\"}";
    let created = node(pep, blog, evil_config, 1_700_000_000_123);
    p.create_node(&created).await.unwrap();
    assert_eq!(p.node(pep, blog).await.unwrap().as_ref(), Some(&created));
    assert!(matches!(
        p.create_node(&node(pep, blog, "other", 5)).await,
        Err(StorageError::Conflict)
    ));
    assert_eq!(p.node(pep, blog).await.unwrap().as_ref(), Some(&created));
    // The same name on another service is another node.
    let svc_blog = node(svc, blog, "svc", 7);
    p.create_node(&svc_blog).await.unwrap();
    assert_eq!(p.node(svc, blog).await.unwrap().as_ref(), Some(&svc_blog));
    assert_eq!(p.node(pep, blog).await.unwrap().as_ref(), Some(&created));

    // Listing: by name in byte order (a locale would sort differently),
    // per service.
    let evil_node = "robert');DROP TABLE pubsub_items;--";
    for name in [
        "zebra",
        "ünïcødé ✓",
        "élan",
        "a-node",
        "ab",
        evil_node,
        "100%_sure",
    ] {
        p.create_node(&node(pep, name, name, 1)).await.unwrap();
    }
    let all = [
        "100%_sure",
        "a-node",
        "ab",
        evil_node,
        blog,
        "zebra",
        "élan",
        "ünïcødé ✓",
    ];
    let names = |nodes: Vec<StoredNode>| -> Vec<String> {
        nodes
            .into_iter()
            .map(|n| {
                assert_eq!(n.service, pep);
                n.node
            })
            .collect()
    };
    assert_eq!(names(p.nodes(pep).await.unwrap()), all);
    assert_eq!(p.nodes(svc).await.unwrap(), std::slice::from_ref(&svc_blog));
    assert!(p.nodes("alice2@example.org").await.unwrap().is_empty());

    // Reconfiguration: the config only.
    assert!(p
        .set_node_config(pep, "zebra", "new ' config")
        .await
        .unwrap());
    assert_eq!(
        p.node(pep, "zebra").await.unwrap(),
        Some(node(pep, "zebra", "new ' config", 1))
    );
    assert_eq!(p.node(svc, blog).await.unwrap().as_ref(), Some(&svc_blog));

    // Publication order; a republished id replaces its item and becomes
    // the newest.
    assert!(p
        .publish(pep, blog, &item("a", "<entry>1</entry>", 10), None)
        .await
        .unwrap()
        .is_empty());
    p.publish(pep, blog, &item("b", "<entry>2</entry>", 20), None)
        .await
        .unwrap();
    p.publish(pep, blog, &item("c", "<entry>3</entry>", 30), None)
        .await
        .unwrap();
    assert_eq!(
        p.items(pep, blog, None).await.unwrap(),
        [
            item("c", "<entry>3</entry>", 30),
            item("b", "<entry>2</entry>", 20),
            item("a", "<entry>1</entry>", 10)
        ]
    );
    assert_eq!(
        item_ids(p.items(pep, blog, Some(2)).await.unwrap()),
        ["c", "b"]
    );
    assert!(p.items(pep, blog, Some(0)).await.unwrap().is_empty());
    assert!(
        p.items(svc, blog, None).await.unwrap().is_empty(),
        "per service"
    );
    // The per-account quota's count: payload bytes (UTF-8, not
    // characters) of every node of the service, one item left out.
    assert_eq!(p.stored_bytes(pep, None).await.unwrap(), 3 * 16);
    assert_eq!(
        p.stored_bytes(pep, Some((blog, "b"))).await.unwrap(),
        2 * 16
    );
    assert_eq!(
        p.stored_bytes(pep, Some(("zebra", "b"))).await.unwrap(),
        3 * 16
    );
    assert_eq!(p.stored_bytes(svc, None).await.unwrap(), 0);
    p.publish(pep, "élan", &item("u", "<é/>", 1), None)
        .await
        .unwrap();
    assert_eq!(p.stored_bytes(pep, None).await.unwrap(), 3 * 16 + 5);
    assert!(p.retract(pep, "élan", "u").await.unwrap());
    assert_eq!(p.stored_bytes(pep, None).await.unwrap(), 3 * 16);
    // A pubsub service's per-owner count: the items of the nodes the JID
    // owns, whoever published them.
    let o = "owner@example.org";
    p.create_node(&node(svc, "owned", "c", 1)).await.unwrap();
    p.set_affiliation(svc, "owned", o, "owner").await.unwrap();
    p.set_affiliation(svc, "owned", "pub@example.org", "publisher")
        .await
        .unwrap();
    p.publish(svc, "owned", &item("a", "<entry>1</entry>", 1), None)
        .await
        .unwrap();
    p.publish(svc, "owned", &item("b", "<é/>", 2), None)
        .await
        .unwrap();
    assert_eq!(p.owned_bytes(svc, o, None).await.unwrap(), 16 + 5);
    assert_eq!(
        p.owned_bytes(svc, o, Some(("owned", "a"))).await.unwrap(),
        5
    );
    assert_eq!(
        p.owned_bytes(svc, "pub@example.org", None).await.unwrap(),
        0
    );
    assert_eq!(p.owned_bytes(pep, o, None).await.unwrap(), 0);
    assert!(p.delete_node(svc, "owned").await.unwrap());
    assert_eq!(p.owned_bytes(svc, o, None).await.unwrap(), 0);
    let mut republished = item("a", "<entry>1, edited</entry>", 40);
    republished.publisher = "alice@example.org/laptop".to_owned();
    assert!(p
        .publish(pep, blog, &republished, Some(3))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        p.items(pep, blog, None).await.unwrap(),
        [
            republished.clone(),
            item("c", "<entry>3</entry>", 30),
            item("b", "<entry>2</entry>", 20)
        ]
    );

    // max_items: the oldest go, in the publication's transaction, and
    // their ids come back oldest first.
    assert_eq!(
        p.publish(pep, blog, &item("d", "<d/>", 50), Some(3))
            .await
            .unwrap(),
        ["b"]
    );
    assert_eq!(
        item_ids(p.items(pep, blog, None).await.unwrap()),
        ["d", "a", "c"]
    );
    assert_eq!(
        p.publish(pep, blog, &item("e", "<e/>", 60), Some(1))
            .await
            .unwrap(),
        ["c", "a", "d"]
    );
    assert_eq!(item_ids(p.items(pep, blog, None).await.unwrap()), ["e"]);
    // Replacing the one item kept is no removal.
    assert!(p
        .publish(pep, blog, &item("e", "<e2/>", 61), Some(1))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        p.items(pep, blog, None).await.unwrap(),
        [item("e", "<e2/>", 61)]
    );
    // Some(0) keeps nothing, the new item included.
    assert_eq!(
        p.publish(pep, blog, &item("f", "<f/>", 70), Some(0))
            .await
            .unwrap(),
        ["e", "f"]
    );
    assert!(p.items(pep, blog, None).await.unwrap().is_empty());

    // Items by id: those that exist, newest first, each once.
    for (i, id) in ["x1", "x2", "x3", "x4", "x5"].into_iter().enumerate() {
        p.publish(pep, blog, &item(id, id, 100 * (i as i64 + 1)), None)
            .await
            .unwrap();
    }
    assert_eq!(
        item_ids(
            p.items_by_id(pep, blog, &strings(&["x2", "x4", "missing", "x2"]))
                .await
                .unwrap()
        ),
        ["x4", "x2"]
    );
    assert!(p.items_by_id(pep, blog, &[]).await.unwrap().is_empty());
    assert!(p
        .items_by_id(pep, "zebra", &strings(&["x1"]))
        .await
        .unwrap()
        .is_empty());
    assert!(p
        .items_by_id(svc, blog, &strings(&["x1"]))
        .await
        .unwrap()
        .is_empty());
    // More ids than one statement binds.
    let mut many: Vec<String> = (0..1200).map(|i| format!("nope-{i}")).collect();
    many.insert(700, "x1".to_owned());
    many.push("x5".to_owned());
    many.insert(3, "x3".to_owned());
    assert_eq!(
        item_ids(p.items_by_id(pep, blog, &many).await.unwrap()),
        ["x5", "x3", "x1"]
    );

    // Retract, trim, purge.
    assert!(p.retract(pep, blog, "x3").await.unwrap());
    assert!(!p.retract(pep, blog, "x3").await.unwrap());
    assert!(!p.retract(svc, blog, "x4").await.unwrap(), "per service");
    assert_eq!(
        item_ids(p.items(pep, blog, None).await.unwrap()),
        ["x5", "x4", "x2", "x1"]
    );
    assert_eq!(p.trim(pep, blog, 2).await.unwrap(), ["x1", "x2"]);
    assert_eq!(
        item_ids(p.items(pep, blog, None).await.unwrap()),
        ["x5", "x4"]
    );
    assert!(p.trim(pep, blog, 2).await.unwrap().is_empty());
    assert!(p.trim(pep, blog, 5).await.unwrap().is_empty());
    p.publish(svc, blog, &item("s", "<s/>", 1), None)
        .await
        .unwrap();
    assert_eq!(p.purge(pep, blog).await.unwrap(), 2);
    assert_eq!(p.purge(pep, blog).await.unwrap(), 0);
    assert!(p.items(pep, blog, None).await.unwrap().is_empty());
    assert_eq!(item_ids(p.items(svc, blog, None).await.unwrap()), ["s"]);

    // SQL-looking and non-ASCII names, ids and payloads are data.
    let evil_id = "'; DELETE FROM pubsub_items; --";
    let payload = "<x xmlns='urn:x'>ünïcødé ✓ 😀 \\ % _ \"q\" ' ; --</x>";
    let evil_item = item(evil_id, payload, 5);
    p.publish(pep, evil_node, &evil_item, Some(10))
        .await
        .unwrap();
    p.publish(pep, evil_node, &item("😀 id", "", 6), Some(10))
        .await
        .unwrap();
    assert_eq!(
        p.items(pep, evil_node, None).await.unwrap(),
        [item("😀 id", "", 6), evil_item.clone()]
    );
    assert_eq!(
        p.items_by_id(pep, evil_node, &strings(&[evil_id]))
            .await
            .unwrap(),
        [evil_item]
    );

    // The newest item of every node that has one, by node name: items
    // published out of seq order, a node without items, other services'
    // nodes and other accounts' PEP nodes are not mixed in.
    for (id, seq) in [("n1", 1), ("n3", 3), ("n2", 2)] {
        p.publish(pep, "a-node", &item(id, id, seq), None)
            .await
            .unwrap();
    }
    p.publish(pep, "ünïcødé ✓", &item("u", "<ü/>", 9), None)
        .await
        .unwrap();
    p.publish(pep, "élan", &item("old", "<old/>", 100), None)
        .await
        .unwrap();
    p.publish(pep, "élan", &item("new", "<new/>", 200), None)
        .await
        .unwrap();
    p.create_node(&node("alice2@example.org", "a-node", "", 1))
        .await
        .unwrap();
    p.publish("alice2@example.org", "a-node", &item("z", "", 999), None)
        .await
        .unwrap();
    assert_eq!(
        p.last_items(pep).await.unwrap(),
        [
            ("a-node".to_owned(), item("n3", "n3", 3)),
            (evil_node.to_owned(), item("😀 id", "", 6)),
            ("élan".to_owned(), item("new", "<new/>", 200)),
            ("ünïcødé ✓".to_owned(), item("u", "<ü/>", 9)),
        ]
    );
    assert_eq!(
        p.last_items(svc).await.unwrap(),
        [(blog.to_owned(), item("s", "<s/>", 1))]
    );
    // Republishing the oldest item makes it the last one.
    p.publish(pep, "élan", &item("old", "<old2/>", 300), None)
        .await
        .unwrap();
    assert_eq!(
        p.last_items(pep).await.unwrap()[2],
        ("élan".to_owned(), item("old", "<old2/>", 300))
    );

    // The last items of several services at once, with their nodes: the
    // same rows as per service; a service without nodes and a repeated
    // one add nothing.
    let mut expected = Vec::new();
    for service in [pep, svc, "alice2@example.org"] {
        let nodes = p.nodes(service).await.unwrap();
        for (n, it) in p.last_items(service).await.unwrap() {
            let node = nodes.iter().find(|x| x.node == n).unwrap().clone();
            expected.push((node, it));
        }
    }
    let key = |x: &(StoredNode, StoredItem)| (x.0.service.clone(), x.0.node.clone());
    expected.sort_by_key(key);
    let mut got = p
        .last_items_of(&strings(&[
            svc,
            pep,
            "nobody@example.org",
            "alice2@example.org",
            pep,
        ]))
        .await
        .unwrap();
    got.sort_by_key(key);
    assert_eq!(got, expected);
    assert_eq!(expected.len(), 6);
    assert!(p.last_items_of(&[]).await.unwrap().is_empty());

    // Subscriptions: several per JID (by subid), bare and full JIDs apart,
    // listed by JID then subid.
    let bob = "bob@example.org";
    let bob_laptop = "bob@example.org/laptop";
    for x in [
        sub(bob, "s2", "pending", "opts'; --"),
        sub("carol@example.org/phone", "s1", "unconfigured", ""),
        sub(bob_laptop, "s3", "subscribed", ""),
        sub(bob, "s1", "subscribed", ""),
    ] {
        p.set_subscription(pep, "a-node", &x).await.unwrap();
    }
    p.set_subscription(pep, "ab", &sub(bob, "s9", "subscribed", ""))
        .await
        .unwrap();
    p.set_subscription(svc, blog, &sub(bob, "s1", "subscribed", ""))
        .await
        .unwrap();
    assert_eq!(
        p.subscriptions(pep, "a-node").await.unwrap(),
        [
            sub(bob, "s1", "subscribed", ""),
            sub(bob, "s2", "pending", "opts'; --"),
            sub(bob_laptop, "s3", "subscribed", ""),
            sub("carol@example.org/phone", "s1", "unconfigured", ""),
        ]
    );
    // Replaced in place by (jid, subid).
    p.set_subscription(pep, "a-node", &sub(bob, "s2", "subscribed", "o2"))
        .await
        .unwrap();
    assert_eq!(
        p.subscriptions(pep, "a-node").await.unwrap()[1],
        sub(bob, "s2", "subscribed", "o2")
    );
    assert_eq!(p.subscriptions(pep, "a-node").await.unwrap().len(), 4);
    // A JID's subscriptions on a service, by node; JIDs compared as
    // stored (the full JID is another subscriber).
    assert_eq!(
        p.subscriptions_of(pep, bob).await.unwrap(),
        [
            ("a-node".to_owned(), sub(bob, "s1", "subscribed", "")),
            ("a-node".to_owned(), sub(bob, "s2", "subscribed", "o2")),
            ("ab".to_owned(), sub(bob, "s9", "subscribed", "")),
        ]
    );
    assert_eq!(
        p.subscriptions_of(pep, bob_laptop).await.unwrap(),
        [("a-node".to_owned(), sub(bob_laptop, "s3", "subscribed", ""))]
    );
    assert_eq!(
        p.subscriptions_of(svc, bob).await.unwrap(),
        [(blog.to_owned(), sub(bob, "s1", "subscribed", ""))]
    );
    // Removal: one subid, then all of a JID's; nobody else's.
    assert_eq!(
        p.remove_subscription(pep, "a-node", bob, Some("s1"))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        p.remove_subscription(pep, "a-node", bob, Some("s1"))
            .await
            .unwrap(),
        0
    );
    p.set_subscription(pep, "a-node", &sub(bob, "s4", "subscribed", ""))
        .await
        .unwrap();
    assert_eq!(
        p.remove_subscription(pep, "a-node", bob, None)
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        p.subscriptions(pep, "a-node").await.unwrap(),
        [
            sub(bob_laptop, "s3", "subscribed", ""),
            sub("carol@example.org/phone", "s1", "unconfigured", ""),
        ]
    );
    assert_eq!(
        p.subscriptions_of(pep, bob).await.unwrap(),
        [("ab".to_owned(), sub(bob, "s9", "subscribed", ""))]
    );
    assert_eq!(p.subscriptions(svc, blog).await.unwrap().len(), 1);

    // Affiliations: set, replaced, `none` deletes; by JID.
    p.set_affiliation(pep, "a-node", pep, "owner")
        .await
        .unwrap();
    p.set_affiliation(pep, "a-node", bob, "publisher")
        .await
        .unwrap();
    p.set_affiliation(pep, "a-node", "carol@example.org", "member")
        .await
        .unwrap();
    p.set_affiliation(pep, "ab", bob, "publish-only")
        .await
        .unwrap();
    p.set_affiliation(svc, blog, bob, "owner").await.unwrap();
    assert_eq!(
        p.affiliations(pep, "a-node").await.unwrap(),
        pairs(&[
            (pep, "owner"),
            (bob, "publisher"),
            ("carol@example.org", "member")
        ])
    );
    p.set_affiliation(pep, "a-node", bob, "outcast")
        .await
        .unwrap();
    p.set_affiliation(pep, "a-node", "carol@example.org", "none")
        .await
        .unwrap();
    p.set_affiliation(pep, "a-node", "nobody@example.org", "none")
        .await
        .unwrap();
    assert_eq!(
        p.affiliations(pep, "a-node").await.unwrap(),
        pairs(&[(pep, "owner"), (bob, "outcast")])
    );
    assert_eq!(
        p.affiliations_of(pep, bob).await.unwrap(),
        pairs(&[("a-node", "outcast"), ("ab", "publish-only")])
    );
    assert_eq!(
        p.affiliations_of(svc, bob).await.unwrap(),
        pairs(&[(blog, "owner")])
    );

    // Deleting a node deletes its items, subscriptions and affiliations,
    // nothing else; a node created again under its name starts empty.
    assert!(p.delete_node(pep, "a-node").await.unwrap());
    assert!(!p.delete_node(pep, "a-node").await.unwrap());
    assert_eq!(p.node(pep, "a-node").await.unwrap(), None);
    assert!(p.items(pep, "a-node", None).await.unwrap().is_empty());
    assert!(p.subscriptions(pep, "a-node").await.unwrap().is_empty());
    assert!(p.affiliations(pep, "a-node").await.unwrap().is_empty());
    assert_eq!(
        p.affiliations_of(pep, bob).await.unwrap(),
        pairs(&[("ab", "publish-only")])
    );
    assert!(p
        .subscriptions_of(pep, bob_laptop)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(p.subscriptions_of(pep, bob).await.unwrap().len(), 1);
    assert_eq!(p.items(pep, "élan", None).await.unwrap().len(), 2);
    assert_eq!(
        p.items("alice2@example.org", "a-node", None)
            .await
            .unwrap()
            .len(),
        1
    );
    p.create_node(&node(pep, "a-node", "again", 2))
        .await
        .unwrap();
    assert!(p.items(pep, "a-node", None).await.unwrap().is_empty());
    assert!(p.subscriptions(pep, "a-node").await.unwrap().is_empty());
    assert!(p.affiliations(pep, "a-node").await.unwrap().is_empty());
    assert_eq!(names(p.nodes(pep).await.unwrap()), all);

    // remove_user: the account's PEP service and what its bare and full
    // JIDs hold elsewhere; JIDs sharing a prefix keep theirs.
    let news = "news";
    p.create_node(&node(svc, news, "", 3)).await.unwrap();
    let gone = [
        pep,
        "alice@example.org/phone",
        "alice@example.org/",
        "alice@example.org/a/b",
    ];
    let kept = [
        "alice2@example.org",
        "alice@example.or",
        "alice@example.org.evil",
        "alice@example.org0",
        "alice@example.orgx",
        "alice@example.org.evil/phone",
        "alice@example.orgx/phone",
        "bob@example.org/alice@example.org",
        "example.org",
    ];
    for j in gone.iter().chain(&kept) {
        p.set_subscription(svc, news, &sub(j, "s", "subscribed", ""))
            .await
            .unwrap();
        p.set_affiliation(svc, news, j, "member").await.unwrap();
    }
    // On bob's PEP service too, beside bob's own rows.
    let bob_pep = bob;
    p.create_node(&node(bob_pep, "urn:xmpp:avatar:metadata", "", 4))
        .await
        .unwrap();
    p.publish(
        bob_pep,
        "urn:xmpp:avatar:metadata",
        &item("h", "<h/>", 1),
        None,
    )
    .await
    .unwrap();
    for j in ["alice@example.org/phone", pep, bob] {
        p.set_subscription(
            bob_pep,
            "urn:xmpp:avatar:metadata",
            &sub(j, "s", "subscribed", ""),
        )
        .await
        .unwrap();
        p.set_affiliation(bob_pep, "urn:xmpp:avatar:metadata", j, "member")
            .await
            .unwrap();
    }
    // Others' rows on alice's PEP service go with it.
    p.set_subscription(pep, "ab", &sub("carol@example.org", "s", "subscribed", ""))
        .await
        .unwrap();
    // An account's subscriptions on a service: its bare JID and its full
    // JIDs, by node then JID; not the JIDs that only share a prefix, nor
    // other services'.
    let mut gone_sorted = gone.to_vec();
    gone_sorted.sort_unstable();
    assert_eq!(
        p.subscriptions_of_account(svc, &jid(pep)).await.unwrap(),
        gone_sorted
            .iter()
            .map(|j| (news.to_owned(), sub(j, "s", "subscribed", "")))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        p.subscriptions_of_account(bob_pep, &jid(pep))
            .await
            .unwrap()
            .len(),
        2
    );
    p.remove_user(&jid(pep)).await.unwrap();
    assert!(p
        .subscriptions_of_account(svc, &jid(pep))
        .await
        .unwrap()
        .is_empty());
    assert!(p.nodes(pep).await.unwrap().is_empty());
    assert!(p.last_items(pep).await.unwrap().is_empty());
    for name in all {
        assert!(p.items(pep, name, None).await.unwrap().is_empty());
        assert!(p.subscriptions(pep, name).await.unwrap().is_empty());
        assert!(p.affiliations(pep, name).await.unwrap().is_empty());
    }
    assert!(p.subscriptions_of(pep, bob).await.unwrap().is_empty());
    assert!(p.affiliations_of(pep, bob).await.unwrap().is_empty());
    let mut kept_sorted = kept.to_vec();
    kept_sorted.sort_unstable();
    assert_eq!(
        p.subscriptions(svc, news).await.unwrap(),
        kept_sorted
            .iter()
            .map(|j| sub(j, "s", "subscribed", ""))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        p.affiliations(svc, news).await.unwrap(),
        kept_sorted
            .iter()
            .map(|j| ((*j).to_owned(), "member".to_owned()))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        p.subscriptions(bob_pep, "urn:xmpp:avatar:metadata")
            .await
            .unwrap(),
        [sub(bob, "s", "subscribed", "")]
    );
    assert_eq!(
        p.affiliations(bob_pep, "urn:xmpp:avatar:metadata")
            .await
            .unwrap(),
        pairs(&[(bob, "member")])
    );
    assert_eq!(
        item_ids(
            p.items(bob_pep, "urn:xmpp:avatar:metadata", None)
                .await
                .unwrap()
        ),
        ["h"]
    );
    assert_eq!(
        p.last_items("alice2@example.org").await.unwrap(),
        [("a-node".to_owned(), item("z", "", 999))]
    );
    assert_eq!(p.nodes(svc).await.unwrap().len(), 2);
    assert_eq!(p.subscriptions(svc, blog).await.unwrap().len(), 1);
    p.remove_user(&jid(pep)).await.unwrap();

    // LIKE wildcards in a JID match nothing else.
    let odd = "a_b%c@example.org";
    let lookalikes = [
        "axbyc@example.org",
        "axbyc@example.org/r",
        "a_b%cz@example.org/r",
        "a_b%c@example.orgz",
    ];
    for j in [odd, "a_b%c@example.org/r"].iter().chain(&lookalikes) {
        p.set_subscription(svc, news, &sub(j, "s", "subscribed", ""))
            .await
            .unwrap();
        p.set_affiliation(svc, news, j, "member").await.unwrap();
    }
    p.remove_user(&jid(odd)).await.unwrap();
    let mut kept_now: Vec<&str> = kept.iter().chain(&lookalikes).copied().collect();
    kept_now.sort_unstable();
    assert_eq!(
        p.subscriptions(svc, news)
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.jid)
            .collect::<Vec<_>>(),
        kept_now
    );
    assert_eq!(
        p.affiliations(svc, news)
            .await
            .unwrap()
            .into_iter()
            .map(|(j, _)| j)
            .collect::<Vec<_>>(),
        kept_now
    );

    // Account deletion removes them too.
    let dora = jid("dora@example.org");
    s.accounts.create(&dora, &creds("pw")).await.unwrap();
    p.create_node(&node("dora@example.org", "urn:xmpp:nick", "", 1))
        .await
        .unwrap();
    p.publish(
        "dora@example.org",
        "urn:xmpp:nick",
        &item("n", "<nick/>", 1),
        None,
    )
    .await
    .unwrap();
    p.set_subscription(
        svc,
        news,
        &sub("dora@example.org/tablet", "s", "subscribed", ""),
    )
    .await
    .unwrap();
    p.set_affiliation(svc, blog, "dora@example.org", "publisher")
        .await
        .unwrap();
    assert!(s.delete_account(&dora).await.unwrap());
    assert!(p.nodes("dora@example.org").await.unwrap().is_empty());
    assert!(p
        .items("dora@example.org", "urn:xmpp:nick", None)
        .await
        .unwrap()
        .is_empty());
    assert!(p
        .subscriptions_of(svc, "dora@example.org/tablet")
        .await
        .unwrap()
        .is_empty());
    assert!(p
        .affiliations_of(svc, "dora@example.org")
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        p.affiliations(svc, blog).await.unwrap(),
        pairs(&[(bob, "owner")])
    );

    // Concurrent publications to one node take turns: the max_items
    // newest stay, every other item is reported removed exactly once.
    let race = "race";
    p.create_node(&node(svc, race, "", 5)).await.unwrap();
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                s.pubsub
                    .publish(
                        "pubsub.example.org",
                        "race",
                        &StoredItem {
                            id: format!("r{i:02}"),
                            publisher: String::new(),
                            payload: String::new(),
                            seq: i,
                        },
                        Some(3),
                    )
                    .await
            })
        })
        .collect();
    let mut removed = Vec::new();
    for t in tasks {
        removed.extend(t.await.expect("publish task").unwrap());
    }
    removed.sort();
    assert_eq!(
        removed,
        (0..17).map(|i| format!("r{i:02}")).collect::<Vec<_>>()
    );
    assert_eq!(
        item_ids(p.items(svc, race, None).await.unwrap()),
        ["r19", "r18", "r17"]
    );
    // A node deleted while subscriptions and affiliations are written
    // leaves none of them behind.
    for round in 0..5 {
        let tasks: Vec<_> = (0..6)
            .map(|i| {
                let s = s.clone();
                tokio::spawn(async move {
                    let j = format!("user{i}@example.org");
                    let sub = PubsubSubscription {
                        jid: j.clone(),
                        subid: format!("{round}"),
                        state: "subscribed".to_owned(),
                        options: String::new(),
                    };
                    // Refused once the node is gone: either is fine.
                    let _ = s
                        .pubsub
                        .set_subscription("pubsub.example.org", "race", &sub)
                        .await;
                    let _ = s
                        .pubsub
                        .set_affiliation("pubsub.example.org", "race", &j, "member")
                        .await;
                })
            })
            .collect();
        assert!(p.delete_node(svc, race).await.unwrap());
        for t in tasks {
            t.await.expect("subscribe task");
        }
        assert!(p.subscriptions(svc, race).await.unwrap().is_empty());
        assert!(p.affiliations(svc, race).await.unwrap().is_empty());
        assert!(p.items(svc, race, None).await.unwrap().is_empty());
        p.create_node(&node(svc, race, "", 5)).await.unwrap();
    }
}
