//! Offline messages (XEP-0160, XEP-0203, XEP-0334; RFC 6121 §8.5.2.1.1)
//! over real sockets: storage, quota, hints, delivery at the next available
//! presence, durability across a restart and a SIGKILL, account deletion.

use starling_proto::datetime::xep0082_datetime;
use starling_proto::sasl::Mechanism;
use starling_proto::BareJid;
use starling_server::modules;
use starling_testkit::stanza::msg;
use starling_testkit::starling_xml::Element;
use starling_testkit::{
    error_condition, eventually, free_port, mam, ns, poll_for, write_binary_config, Client,
    TestServer,
};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const NS_DELAY: &str = "urn:xmpp:delay";

fn now_stamp() -> String {
    xep0082_datetime(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
}

fn bare(s: &str) -> BareJid {
    BareJid::new(s).unwrap()
}

async fn stored(server: &TestServer, user: &str) -> u64 {
    server
        .server
        .env
        .storage
        .offline
        .count(&bare(&format!("{user}@localhost")))
        .await
        .unwrap()
}

/// Waits until `user` has `n` stored messages (deletion after delivery
/// runs once the session flushed its writes).
async fn eventually_stored(server: &TestServer, user: &str, n: u64) {
    poll_for(Duration::from_secs(2), async || {
        (stored(server, user).await == n).then_some(())
    })
    .await;
    assert_eq!(stored(server, user).await, n);
}

/// Waits until `cond` holds (a server-side effect no client sees);
/// panics after 10 s.
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut cond: impl FnMut() -> F) {
    eventually(what, Duration::from_secs(10), async || {
        cond().await.then_some(())
    })
    .await;
}

fn body(m: &Element) -> String {
    m.get_child("body", ns::CLIENT)
        .map(|b| b.text())
        .unwrap_or_default()
}

/// Checks a XEP-0082 UTC DateTime with milliseconds, as we write it.
fn assert_datetime(s: &str) {
    let b = s.as_bytes();
    assert_eq!(b.len(), 24, "{s}");
    for (i, c) in b.iter().enumerate() {
        let ok = match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'.',
            23 => *c == b'Z',
            _ => c.is_ascii_digit(),
        };
        assert!(ok, "bad XEP-0082 DateTime {s}");
    }
    let month: u32 = s[5..7].parse().unwrap();
    let day: u32 = s[8..10].parse().unwrap();
    let hour: u32 = s[11..13].parse().unwrap();
    assert!(
        (1..=12).contains(&month) && (1..=31).contains(&day) && hour < 24,
        "{s}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_to_offline_user_are_delivered_at_next_login_in_order_with_delay() {
    // XEP-0160 §4 (storage, delivery on the next available presence),
    // §3 (normal and chat stored), XEP-0203 §3 (delay from the server).
    let server = TestServer::start().await;
    server.create_user("bob", "pw-bob").await;
    let mut alice = server.login("alice").await;
    let before = now_stamp();
    alice
        .send("<message to='bob@localhost' type='chat' id='m1'><body>one</body></message>")
        .await;
    alice
        .send("<message to='bob@localhost' id='m2'><body>two</body><x xmlns='urn:example:unknown'><y a='1'>deep</y></x></message>")
        .await;
    alice
        .send("<message to='bob@localhost/gone' type='normal' id='m3'><body>three</body></message>")
        .await;
    alice.expect_nothing().await; // no error before the answer: stored
    let after = now_stamp();
    assert_eq!(stored(&server, "bob").await, 3);

    let mut bob = server.login("bob").await;
    for (i, text) in ["one", "two", "three"].iter().enumerate() {
        let m = bob.recv_message().await;
        assert_eq!(body(&m), *text);
        assert_eq!(m.attr("id"), Some(format!("m{}", i + 1).as_str()));
        assert_eq!(m.attr("from"), Some(alice.jid.as_str()));
        assert_ne!(m.attr("type"), Some("error"));
        let d = m.get_child("delay", NS_DELAY).expect("XEP-0203 delay");
        assert_eq!(d.attr("from"), Some("localhost"));
        let stamp = d.attr("stamp").expect("stamp");
        assert_datetime(stamp);
        assert!(
            before.as_str() <= stamp && stamp <= after.as_str(),
            "{before} <= {stamp} <= {after}"
        );
    }
    eventually_stored(&server, "bob", 0).await; // delivered messages are deleted
    bob.barrier().await;
    alice.expect_nothing().await;
    bob.close().await;

    // Nothing is delivered twice. (Stored messages are written by a timer
    // due at the available presence, before the session reads more.)
    let mut bob = server.login("bob").await;
    bob.expect_nothing().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_payload_survives_storage() {
    // Invariant 5 through the offline store.
    let server = TestServer::start().await;
    server.create_user("bob", "pw-bob").await;
    let mut alice = server.login("alice").await;
    alice
        .send("<message to='bob@localhost' id='u'><body>x</body><x xmlns='urn:example:unknown'><y a='1'>deep</y></x></message>")
        .await;
    alice.expect_nothing().await;
    let mut bob = server.login("bob").await;
    let m = bob.recv_message().await;
    let x = m
        .get_child("x", "urn:example:unknown")
        .expect("payload kept");
    let y = x
        .get_child("y", "urn:example:unknown")
        .expect("nested kept");
    assert_eq!((y.attr("a"), y.text().as_str()), (Some("1"), "deep"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn full_quota_bounces_service_unavailable_and_changes_nothing() {
    // XEP-0160 §5 / RFC 6121 §8.5.2.1.1: not stored → error to the sender.
    let server = TestServer::start_with(|c| {
        c.modules
            .get_mut::<modules::Offline>()
            .max_messages_per_user = 2
    })
    .await;
    server.create_user("bob", "pw-bob").await;
    let mut alice = server.login("alice").await;
    for i in 1..=2 {
        alice
            .send(
                &msg("bob@localhost")
                    .chat()
                    .id(&format!("q{i}"))
                    .body(&i.to_string())
                    .to_string(),
            )
            .await;
    }
    alice.expect_nothing().await;
    alice
        .send("<message to='bob@localhost' type='chat' id='q3'><body>3</body></message>")
        .await;
    let e = alice.recv().await;
    assert_eq!(e.attr("type"), Some("error"));
    assert_eq!(e.attr("id"), Some("q3"));
    assert_eq!(e.attr("from"), Some("bob@localhost"));
    assert_eq!(error_condition(&e).as_deref(), Some("service-unavailable"));
    let text = e
        .get_child("error", ns::CLIENT)
        .and_then(|er| er.get_child("text", ns::STANZAS))
        .map(|t| t.text())
        .unwrap_or_default();
    assert!(text.contains("full"), "{text}");
    alice.expect_nothing().await; // exactly one error
    assert_eq!(stored(&server, "bob").await, 2);
    // Counted by the metric (the log line is throttled: issue 31, item 4).
    let metrics = server.server.env.metrics.encode();
    assert!(
        metrics
            .contains("starling_limit_refusals_total{limit=\"offline.max_messages_per_user\"} 1"),
        "{metrics}"
    );

    let mut bob = server.login("bob").await;
    assert_eq!(body(&bob.recv_message().await), "1");
    assert_eq!(body(&bob.recv_message().await), "2");
    // All stored messages are written at once, before the session reads on.
    bob.expect_nothing().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn hints_chat_states_and_headlines() {
    let server = TestServer::start().await;
    server.create_user("bob", "pw-bob").await;
    let mut alice = server.login("alice").await;
    // XEP-0334 §4.2 no-store: not stored, so (RFC 6121 §8.5.2.1.1) an error.
    alice
        .send("<message to='bob@localhost' type='chat' id='ns'><body>x</body><no-store xmlns='urn:xmpp:hints'/></message>")
        .await;
    let e = alice.recv().await;
    assert_eq!(e.attr("id"), Some("ns"));
    assert_eq!(error_condition(&e).as_deref(), Some("service-unavailable"));
    // XEP-0085 §5.5, XEP-0160 §3: standalone chat states are not stored
    // (and, being transient, not answered with an error).
    alice
        .send("<message to='bob@localhost' type='chat' id='cs'><composing xmlns='http://jabber.org/protocol/chatstates'/></message>")
        .await;
    // RFC 6121 §8.5.2.1.1, XEP-0160 §3: headlines are not stored.
    alice
        .send("<message to='bob@localhost' type='headline' id='h'><body>news</body></message>")
        .await;
    alice.expect_nothing().await;
    assert_eq!(stored(&server, "bob").await, 0);
    // XEP-0334 §3 (sensitive messages): no-permanent-store still allows
    // temporary storage for delivery; chat state plus body is stored.
    alice
        .send("<message to='bob@localhost' type='chat' id='np'><body>otr</body><no-permanent-store xmlns='urn:xmpp:hints'/></message>")
        .await;
    alice
        .send("<message to='bob@localhost' type='chat' id='cb'><body>hey</body><active xmlns='http://jabber.org/protocol/chatstates'/></message>")
        .await;
    alice.expect_nothing().await;
    assert_eq!(stored(&server, "bob").await, 2);
    let mut bob = server.login("bob").await;
    assert_eq!(bob.recv_message().await.attr("id"), Some("np"));
    assert_eq!(bob.recv_message().await.attr("id"), Some("cb"));
    bob.expect_nothing().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn negative_priority_stores_until_non_negative_presence() {
    // RFC 6121 §8.5.2.1.1: a negative-priority resource gets no bare-JID
    // messages; XEP-0160 §4: delivery when available presence with a
    // non-negative priority is sent.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let mut bob = server.login("bob").await;
    bob.send("<presence><priority>-1</priority></presence>")
        .await;
    bob.barrier().await; // the presence's echo
    alice
        .send("<message to='bob@localhost' type='chat' id='n'><body>later</body></message>")
        .await;
    alice.expect_nothing().await;
    assert_eq!(stored(&server, "bob").await, 1);
    bob.expect_nothing().await;
    bob.send("<presence><priority>1</priority></presence>")
        .await;
    let m = bob.recv_message().await;
    assert_eq!(body(&m), "later");
    assert!(m.has_child("delay", NS_DELAY));
    eventually_stored(&server, "bob", 0).await;
    // Another presence update delivers nothing more.
    bob.send("<presence><priority>2</priority></presence>")
        .await;
    bob.send("<iq type='get' id='b2' to='localhost'><ping xmlns='urn:xmpp:ping'/></iq>")
        .await;
    let e = bob.recv_until(|e| e.name() != "presence").await;
    assert_eq!(e.attr("id"), Some("b2"), "{e}");
    assert!(
        bob.barrier().await.is_empty(),
        "nothing after the presence echo"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn offline_feature_is_advertised() {
    // XEP-0160 §6: the msgoffline feature.
    let server = TestServer::start().await;
    let mut alice = server.login("alice").await;
    let vars = alice.disco_features("localhost").await;
    assert!(vars.iter().any(|v| v == "msgoffline"), "{vars:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn account_deletion_removes_offline_messages() {
    // XEP-0077 §3.2 in-band removal, and Storage::delete_account.
    let server = TestServer::start().await;
    server.create_user("bob", "pw-bob").await;
    server.create_user("carol", "pw-carol").await;
    let mut alice = server.login("alice").await;
    // Bob is connected but not available: messages are stored.
    let mut bob = Client::connect(server.starttls_addr()).await;
    bob.negotiate_tls().await;
    bob.auth(Mechanism::ScramSha256, "bob", "pw-bob")
        .await
        .unwrap();
    bob.bind(None).await;
    alice
        .send("<message to='bob@localhost' id='1'><body>a</body></message>")
        .await;
    alice
        .send("<message to='carol@localhost' id='2'><body>b</body></message>")
        .await;
    alice.expect_nothing().await;
    assert_eq!(stored(&server, "bob").await, 1);
    assert_eq!(stored(&server, "carol").await, 1);
    let r = bob
        .iq(
            "<iq type='set' id='rm'><query xmlns='jabber:iq:register'><remove/></query></iq>",
            "rm",
        )
        .await;
    assert_eq!(r.attr("type"), Some("result"), "{r}");
    assert_eq!(stored(&server, "bob").await, 0);
    assert!(server
        .server
        .env
        .storage
        .delete_account(&bare("carol@localhost"))
        .await
        .unwrap());
    assert_eq!(stored(&server, "carol").await, 0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stored_messages_survive_a_restart() {
    let dir = std::env::temp_dir().join(format!(
        "starling-offline-{}",
        starling_proto::random_id(10)
    ));
    let d = dir.clone();
    let server = TestServer::start_with(|c| c.server.data_dir = d).await;
    server.create_user("bob", "pw-bob").await;
    let mut alice = server.login("alice").await;
    alice
        .send("<message to='bob@localhost' type='chat' id='r'><body>persist</body></message>")
        .await;
    alice.expect_nothing().await;
    server.server.shutdown().await; // keeps the data directory

    let d = dir.clone();
    let server = TestServer::start_with(|c| c.server.data_dir = d).await;
    let mut bob = server.login("bob").await;
    let m = bob.recv_message().await;
    assert_eq!(body(&m), "persist");
    assert!(m.has_child("delay", NS_DELAY));
    server.stop().await;
}

// ---- the real binary, killed with SIGKILL ----

use crate::killable;
use killable::{add_user, connect, start_binary, KillOnDrop};

#[tokio::test(flavor = "multi_thread")]
async fn stored_message_survives_sigkill() {
    // The durability rule: a message the sender got no error for
    // is committed before it counts as accepted.
    let dir = std::env::temp_dir().join(format!("starling-kill-{}", starling_proto::random_id(10)));
    std::fs::create_dir_all(&dir).unwrap();
    let (p1, p2) = (free_port(), free_port());
    let cfg = write_binary_config(&dir, p1, p2);
    add_user(&cfg, "alice@localhost", "secret-a");
    add_user(&cfg, "bob@localhost", "secret-b");

    let mut server = start_binary(&cfg, p1).await;
    let mut alice = connect(p1, "alice", "secret-a").await;
    alice
        .send("<message to='bob@localhost' type='chat' id='k1'><body>before the crash</body></message>")
        .await;
    alice.expect_nothing().await;
    server.kill().unwrap(); // SIGKILL
    let status = tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(!status.success(), "killed: {status:?}");
    drop(alice);

    let mut server = start_binary(&cfg, p1).await;
    let mut bob = connect(p1, "bob", "secret-b").await;
    bob.send("<presence/>").await;
    let m = bob.recv_message().await;
    assert_eq!(body(&m), "before the crash");
    assert_eq!(m.attr("id"), Some("k1"));
    assert!(m.has_child("delay", NS_DELAY));
    server.kill().unwrap();
    let _ = tokio::task::spawn_blocking(move || server.wait()).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ids of the messages in the user's own archive (XEP-0313 §4), oldest
/// first, with the XEP-0359 stanza id each result carries.
async fn archive_ids(c: &mut Client) -> Vec<(String, String)> {
    mam::ok_query(c, "", "q", "")
        .await
        .items
        .iter()
        .map(|(id, m)| (id.clone(), m.attr("id").unwrap_or_default().to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn offline_message_and_its_archive_copy_survive_sigkill_together() {
    // Issue 9: after kill -9 the recipient got stored messages at the next
    // login, but their archive (what other devices sync from) lacked them.
    // The archive copy of a message stored offline is committed in the
    // offline store's transaction. The archive's write-behind window is
    // set to ten minutes here, so only that path can have written it.
    let dir = std::env::temp_dir().join(format!("starling-kill-{}", starling_proto::random_id(10)));
    std::fs::create_dir_all(&dir).unwrap();
    let (p1, p2) = (free_port(), free_port());
    let cfg = write_binary_config(&dir, p1, p2);
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str("\n[modules.mam]\nbatch_delay_ms = 600000\n");
    std::fs::write(&cfg, text).unwrap();
    add_user(&cfg, "alice@localhost", "secret-a");
    add_user(&cfg, "bob@localhost", "secret-b");

    let mut server = KillOnDrop(start_binary(&cfg, p1).await);
    let mut alice = connect(p1, "alice", "secret-a").await;
    for i in 0..3 {
        alice
            .send(
                &msg("bob@localhost")
                    .chat()
                    .id(&format!("a{i}"))
                    .body(&format!("offline {i}"))
                    .to_string(),
            )
            .await;
    }
    alice.expect_nothing().await;
    server.0.kill().unwrap(); // SIGKILL
    let _ = server.0.wait();
    drop(alice);

    server = KillOnDrop(start_binary(&cfg, p1).await);
    let mut bob = connect(p1, "bob", "secret-b").await;
    bob.send("<presence/>").await;
    let mut delivered = Vec::new();
    for _ in 0..3 {
        let m = bob.recv_message().await;
        let sid = m
            .children()
            .find(|c| c.is("stanza-id", "urn:xmpp:sid:0"))
            .and_then(|c| c.attr("id"))
            .expect("the stored copy carries the archive id")
            .to_owned();
        delivered.push((sid, m.attr("id").unwrap().to_owned()));
    }
    assert_eq!(
        archive_ids(&mut bob).await,
        delivered,
        "every message delivered from offline storage is in the archive, same ids"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Holds a message between the router's "no available resource" decision
/// and the offline store's commit, as a slow database would, until the test
/// lets it go.
struct Gate {
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

#[starling_core::async_trait]
impl starling_core::hooks::OfflineMessageHandler for Gate {
    async fn offline_message(
        &self,
        _env: &starling_core::Env,
        stanza: &starling_proto::Stanza,
        _companions: &mut starling_core::hooks::OfflineCompanions,
    ) -> starling_core::HookResult {
        if stanza.element().to_string().contains("held") {
            self.entered.notify_one();
            self.release.notified().await;
        }
        Ok(starling_core::Flow::Continue)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_stored_while_its_recipient_comes_online_is_still_delivered() {
    // XEP-0160 §4: stored messages are delivered when the recipient sends
    // available presence. Here the router decided "offline" before bob's
    // presence, and the store committed after bob's session read the
    // (empty) queue: the message must not wait for bob's next login.
    let gate = std::sync::Arc::new(Gate {
        entered: tokio::sync::Notify::new(),
        release: tokio::sync::Notify::new(),
    });
    let g = gate.clone();
    let server =
        TestServer::start_with_hooks(|_| {}, move |reg| reg.offline_message("test-gate", 10, g))
            .await;
    server.create_user("bob", "pw-bob").await;
    let mut alice = server.login("alice").await;
    alice
        .send("<message to='bob@localhost' type='chat' id='h1'><body>held</body></message>")
        .await;
    gate.entered.notified().await;
    let mut bob = server.login("bob").await; // available; the queue is empty
    bob.expect_nothing().await;
    gate.release.notify_one();
    let m = bob.recv_message().await;
    assert_eq!(body(&m), "held");
    assert!(m.get_child("delay", NS_DELAY).is_some(), "{m}");
    eventually_stored(&server, "bob", 0).await;
    // Alice's session has finished with the message (stored, then bob
    // told to read the queue again) once her ping is answered.
    alice.barrier().await;
    bob.expect_nothing().await; // exactly once
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stored_messages_come_before_live_ones_when_the_recipient_becomes_available() {
    // XEP-0160 §4 with RFC 6121's per-sender order: alice sends without a
    // pause while bob is not available for bare-JID messages (negative
    // priority), so hers are stored; bob then becomes available while she
    // is still sending, so the next ones are delivered live. Bob must see
    // every message once, the stored ones before the live ones (the live
    // ones wait in his session's mailbox until the stored ones are
    // written).
    let server = TestServer::start_with(|c| {
        c.modules
            .get_mut::<modules::Offline>()
            .max_messages_per_user = 100_000;
        c.c2s.mailbox_size = 1_000_000;
        c.c2s.mailbox_bytes = usize::MAX;
    })
    .await;
    for round in 0..5 {
        let mut bob = server.login("bob").await;
        bob.send("<presence><priority>-1</priority></presence>")
            .await;
        bob.barrier().await; // the presence's echo
        let alice = server.login("alice").await;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let count = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let sender = {
            let (stop, count) = (stop.clone(), count.clone());
            tokio::spawn(async move {
                let mut alice = alice;
                let mut n = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || n < 200 {
                    alice
                        .send(
                            &msg("bob@localhost")
                                .chat()
                                .body(&format!("{n:06}"))
                                .to_string(),
                        )
                        .await;
                    n += 1;
                    count.store(n, std::sync::atomic::Ordering::Relaxed);
                    if n.is_multiple_of(10) {
                        // sleep: pacing, not a wait.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                alice.expect_nothing().await;
                n
            })
        };
        // Some of hers are stored…
        until("messages are stored for bob", || async {
            stored(&server, "bob").await >= 20
        })
        .await;
        bob.send("<presence><priority>1</priority></presence>")
            .await;
        // …bob becomes available for bare-JID messages while she sends…
        let bob_jid = &bare("bob@localhost");
        until("bob is available", || async {
            server
                .server
                .env
                .sessions
                .resources(bob_jid)
                .iter()
                .any(|e| e.priority.is_some_and(|p| p >= 0))
        })
        .await;
        // …and she sends on for a while: those come live.
        let after = count.load(std::sync::atomic::Ordering::Relaxed) + 100;
        until("alice sent 100 more", || async {
            count.load(std::sync::atomic::Ordering::Relaxed) >= after
        })
        .await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // Her ping was answered: all her messages were routed.
        let sent = sender.await.unwrap();
        let mut got = Vec::new();
        while got.len() < sent as usize {
            match bob.next_event_within(Duration::from_secs(5)).await {
                Some(starling_testkit::Event::Element(el)) if el.name() == "message" => {
                    got.push(body(&el).parse::<u32>().unwrap())
                }
                Some(starling_testkit::Event::Element(_)) => {}
                _ => break,
            }
        }
        // No copy after them.
        for el in bob.barrier().await {
            if el.name() == "message" {
                got.push(body(&el).parse::<u32>().unwrap());
            }
        }
        let expected: Vec<u32> = (0..sent).collect();
        assert_eq!(
            got.len(),
            expected.len(),
            "round {round}: every message once"
        );
        let late: Vec<(u32, u32)> = got
            .windows(2)
            .filter(|w| w[0] > w[1])
            .map(|w| (w[0], w[1]))
            .collect();
        assert!(
            late.is_empty(),
            "round {round}: {} messages came before an older one, e.g. {:?}",
            late.len(),
            &late[..late.len().min(3)]
        );
        bob.close().await;
        eventually_stored(&server, "bob", 0).await;
    }
    server.stop().await;
}
