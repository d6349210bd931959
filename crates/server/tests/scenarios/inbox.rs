//! Inbox (XEP-0430) over real sockets: conversations with last message and
//! unread count, updated as messages flow, reset by chat markers
//! (XEP-0333) and by MongooseIM's reset iq, filters, paging and totals,
//! corrections, retractions, and the errors for bad requests.

use starling_testkit::mam;
use starling_testkit::stanza::{empty, iq_get, iq_set, msg};
use starling_testkit::starling_xml::Element;
use starling_testkit::{error_condition, ns, Client, TestServer};

const INBOX: &str = "urn:xmpp:inbox:1";
const MAM: &str = "urn:xmpp:mam:2";
const RSM: &str = "http://jabber.org/protocol/rsm";
const CONV: &str = "erlang-solutions.com:xmpp:inbox:0#conversation";

fn bare_of(c: &Client) -> String {
    c.jid.split('/').next().unwrap().to_owned()
}

#[derive(Debug)]
struct Entry {
    jid: String,
    unread: u32,
    id: String,
    body: Option<String>,
}

struct Inbox {
    entries: Vec<Entry>,
    fin: Element,
}

impl Inbox {
    fn fin_attr(&self, name: &str) -> Option<String> {
        self.fin
            .get_child("fin", INBOX)?
            .attr(name)
            .map(str::to_owned)
    }
    fn rsm(&self, name: &str) -> Option<String> {
        self.fin
            .get_child("fin", INBOX)?
            .get_child("set", RSM)?
            .get_child(name, RSM)
            .map(|e| e.text())
    }
    fn summary(&self) -> Vec<(String, u32)> {
        self.entries
            .iter()
            .map(|e| (e.jid.clone(), e.unread))
            .collect()
    }
}

async fn inbox(c: &mut Client, id: &str, attrs: &str, inner: &str) -> Inbox {
    c.send(&iq_get(
        "",
        id,
        &format!("<inbox xmlns='{INBOX}' {attrs}>{inner}</inbox>"),
    ))
    .await;
    let mut entries = Vec::new();
    loop {
        let el = c.recv().await;
        if el.name() == "iq" && el.attr("id") == Some(id) {
            return Inbox { entries, fin: el };
        }
        if let Some(e) = el.get_child("entry", INBOX) {
            let body = el
                .get_child("result", MAM)
                .and_then(|r| r.get_child("forwarded", "urn:xmpp:forward:0"))
                .and_then(|f| f.get_child("message", ns::CLIENT))
                .and_then(|m| m.get_child("body", ns::CLIENT))
                .map(|b| b.text());
            if let Some(r) = el.get_child("result", MAM) {
                assert_eq!(
                    r.attr("id"),
                    e.attr("id"),
                    "§3: entry id is the result's MAM id"
                );
                assert_eq!(r.attr("queryid"), Some(id));
            }
            entries.push(Entry {
                jid: e.attr("jid").unwrap().to_owned(),
                unread: e.attr("unread").unwrap().parse().unwrap(),
                id: e.attr("id").unwrap().to_owned(),
                body,
            });
        }
    }
}

async fn ok_inbox(c: &mut Client, id: &str, attrs: &str, inner: &str) -> Inbox {
    let i = inbox(c, id, attrs, inner).await;
    assert_eq!(i.fin.attr("type"), Some("result"), "{}", i.fin);
    i
}

async fn say(from: &mut Client, to: &mut Client, id: &str, body: &str) -> Element {
    from.send(
        &msg(&bare_of(to))
            .chat()
            .id(id)
            .body(body)
            .child("<markable xmlns='urn:xmpp:chat-markers:0'/>")
            .to_string(),
    )
    .await;
    to.recv_message().await
}

#[tokio::test]
async fn unread_counts_follow_messages_and_markers() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    let mut carol = server.login("carol").await;
    let features = alice.disco_features(&bare_of(&alice)).await;
    assert!(features.iter().any(|f| f == INBOX), "{features:?}");
    let empty = ok_inbox(&mut alice, "e", "", "").await;
    assert!(empty.entries.is_empty());
    assert_eq!(empty.fin_attr("total").as_deref(), Some("0"));

    for i in 0..3 {
        say(&mut bob, &mut alice, &format!("b{i}"), &format!("bob {i}")).await;
    }
    say(&mut carol, &mut alice, "c0", "carol 0").await;
    let i = ok_inbox(&mut alice, "i1", "", "").await;
    // Newest conversation first, with the last message.
    assert_eq!(i.summary(), [(bare_of(&carol), 1), (bare_of(&bob), 3)]);
    assert_eq!(i.entries[1].body.as_deref(), Some("bob 2"));
    assert_eq!(i.fin_attr("total").as_deref(), Some("2"));
    assert_eq!(i.fin_attr("unread").as_deref(), Some("2"));
    assert_eq!(i.fin_attr("all-unread").as_deref(), Some("4"));
    // The sender's own inbox has the conversation with nothing unread.
    let b = ok_inbox(&mut bob, "b1", "", "").await;
    assert_eq!(b.summary(), [(bare_of(&alice), 0)]);
    assert_eq!(b.entries[0].body.as_deref(), Some("bob 2"));

    // XEP-0333 displayed for the middle message: one unread remains (§4).
    alice
        .send(
            &msg(&bare_of(&bob))
                .chat()
                .child("<displayed xmlns='urn:xmpp:chat-markers:0' id='b1'/>")
                .to_string(),
        )
        .await;
    bob.recv_message().await;
    let i = ok_inbox(&mut alice, "i2", "", "").await;
    assert_eq!(i.summary(), [(bare_of(&carol), 1), (bare_of(&bob), 1)]);
    // Displayed for the newest: zero. Receipts change nothing.
    alice
        .send(
            &msg(&bare_of(&bob))
                .chat()
                .child("<received xmlns='urn:xmpp:receipts' id='b2'/>")
                .to_string(),
        )
        .await;
    alice
        .send(
            &msg(&bare_of(&bob))
                .chat()
                .child("<displayed xmlns='urn:xmpp:chat-markers:0' id='b2'/>")
                .to_string(),
        )
        .await;
    let i = ok_inbox(&mut alice, "i3", "", "").await;
    assert_eq!(i.summary(), [(bare_of(&carol), 1), (bare_of(&bob), 0)]);
    // unread-only and messages='false'.
    let u = ok_inbox(&mut alice, "u", "unread-only='true' messages='false'", "").await;
    assert_eq!(u.summary(), [(bare_of(&carol), 1)]);
    assert_eq!(u.entries[0].body, None);
    // A reply resets the replier's count; a new message counts again.
    say(&mut alice, &mut carol, "a0", "hi carol").await;
    say(&mut bob, &mut alice, "b3", "bob 3").await;
    let i = ok_inbox(&mut alice, "i4", "", "").await;
    assert_eq!(i.summary(), [(bare_of(&bob), 1), (bare_of(&carol), 0)]);
    assert_eq!(i.entries[1].body.as_deref(), Some("hi carol"));
    // MongooseIM's explicit reset.
    let r = alice
        .iq(
            &iq_set(
                "",
                "rs",
                &format!("<reset xmlns='{CONV}' jid='{}'/>", bare_of(&bob)),
            ),
            "rs",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    let i = ok_inbox(&mut alice, "i5", "", "").await;
    assert_eq!(i.fin_attr("all-unread").as_deref(), Some("0"));
    server.stop().await;
}

#[tokio::test]
async fn corrections_retractions_paging_and_errors() {
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    say(&mut bob, &mut alice, "o1", "helo").await;
    // XEP-0308: the correction becomes the last message, not a new unread.
    bob.send(
        &msg(&bare_of(&alice))
            .chat()
            .id("o2")
            .body("hello")
            .child("<replace xmlns='urn:xmpp:message-correct:0' id='o1'/>")
            .to_string(),
    )
    .await;
    alice.recv_message().await;
    let i = ok_inbox(&mut alice, "c", "", "").await;
    assert_eq!(i.summary(), [(bare_of(&bob), 1)]);
    assert_eq!(i.entries[0].body.as_deref(), Some("hello"));
    // XEP-0424: retracting the last message leaves its tombstone in the inbox.
    bob.send(
        &msg(&bare_of(&alice))
            .chat()
            .id("r")
            .child("<retract xmlns='urn:xmpp:message-retract:1' id='o2'/>")
            .body("retracted")
            .to_string(),
    )
    .await;
    alice.recv_message().await;
    let i = ok_inbox(&mut alice, "r", "", "").await;
    assert_eq!(i.entries[0].body, None, "the retracted text is gone");

    // Paging over 5 conversations, newest first.
    let mut others = Vec::new();
    for n in 0..5 {
        let mut c = server.login(&format!("user{n}")).await;
        say(&mut c, &mut alice, &format!("u{n}"), &format!("from {n}")).await;
        others.push(c);
    }
    let p1 = ok_inbox(&mut alice, "p1", "", &mam::max(2, "")).await;
    assert_eq!(
        p1.entries
            .iter()
            .map(|e| e.jid.as_str())
            .collect::<Vec<_>>(),
        ["user4@localhost", "user3@localhost"]
    );
    assert_eq!(p1.rsm("count").as_deref(), Some("6"));
    assert_eq!(p1.rsm("last").as_deref(), Some(p1.entries[1].id.as_str()));
    let p2 = ok_inbox(
        &mut alice,
        "p2",
        "",
        &mam::max(10, &format!("<after>{}</after>", p1.rsm("last").unwrap())),
    )
    .await;
    assert_eq!(
        p2.entries
            .iter()
            .map(|e| e.jid.as_str())
            .collect::<Vec<_>>(),
        [
            "user2@localhost",
            "user1@localhost",
            "user0@localhost",
            "bob@localhost"
        ]
    );
    // Bad requests.
    for (id, attrs, inner, cond) in [
        ("x1", "", mam::rsm("<after>nope</after>"), "item-not-found"),
        ("x2", "", mam::rsm("<max>many</max>"), "bad-request"),
        ("x3", "unread-only='maybe'", String::new(), "bad-request"),
        (
            "x4",
            "",
            mam::rsm("<index>1</index>"),
            "feature-not-implemented",
        ),
    ] {
        let r = inbox(&mut alice, id, attrs, &inner).await;
        assert_eq!(
            error_condition(&r.fin).as_deref(),
            Some(cond),
            "{id}: {}",
            r.fin
        );
    }
    let r = alice
        .iq(&iq_set("", "rb", &empty("reset", CONV)), "rb")
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("bad-request"));
    // Someone else's inbox.
    let r = bob
        .iq(&iq_get(&bare_of(&alice), "o", &empty("inbox", INBOX)), "o")
        .await;
    assert_eq!(error_condition(&r).as_deref(), Some("forbidden"), "{r}");
    server.stop().await;
}
