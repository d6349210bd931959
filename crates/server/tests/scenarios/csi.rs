//! XEP-0352 Client State Indication over real sockets: the feature (§5),
//! presence and chat states held while inactive (newest per sender), held
//! stanzas delivered before an important one and on `<active/>`, and the
//! bound on what is held.

use crate::im_common;

use im_common::{login_full, set_state, sync, St};
use starling_proto::sasl::Mechanism;
use starling_server::modules;
use starling_testkit::stanza::{empty, iq_get, msg, presence};
use starling_testkit::starling_xml::Element;
use starling_testkit::{ns, Client, TestServer};

const CSI: &str = "urn:xmpp:csi:0";
const CHATSTATES: &str = "http://jabber.org/protocol/chatstates";

async fn friends(server: &TestServer) {
    server.create_user("alice", "pw-alice").await;
    server.create_user("bob", "pw-bob").await;
    set_state(server, "alice", "bob", St::B).await;
}

fn show(p: &Element) -> Option<String> {
    p.get_child("show", ns::CLIENT).map(|s| s.text())
}

fn from_bob(els: &[Element]) -> Vec<&Element> {
    els.iter()
        .filter(|e| e.attr("from").is_some_and(|f| f.starts_with("bob@")))
        .collect()
}

const SM: &str = "urn:xmpp:sm:3";

/// Enables XEP-0198 so that [`quiet_sync`] can be used.
async fn enable_sm(c: &mut Client) {
    c.send(&format!("<enable xmlns='{SM}'/>")).await;
    c.recv_until(|e| e.is("enabled", SM)).await;
}

/// Like `sync`, without an iq: an iq reply is an important stanza that
/// would deliver what is held. `<r/>` is answered after the mailbox is
/// served, and its `<a/>` does not go through the receive hooks.
async fn quiet_sync(c: &mut Client) -> Vec<Element> {
    c.send(&format!("<r xmlns='{SM}'/>")).await;
    let mut got = Vec::new();
    loop {
        let el = c.recv().await;
        if el.is("a", SM) {
            return got;
        }
        if !el.is("r", SM) {
            got.push(el);
        }
    }
}

async fn chat_state(bob: &mut Client, to: &str, state: &str) {
    bob.send(&msg(to).chat().child(&empty(state, CHATSTATES)).to_string())
        .await;
}

#[tokio::test]
async fn csi_is_offered_after_authentication() {
    let server = TestServer::start().await;
    server.create_user("carol", "pw-carol").await;
    let mut c = Client::connect(server.starttls_addr()).await;
    let before = c.negotiate_tls().await;
    assert!(!before.has_child("csi", CSI), "{before}");
    c.auth(Mechanism::ScramSha256, "carol", "pw-carol")
        .await
        .unwrap();
    let after = c.features.clone().unwrap();
    assert!(after.has_child("csi", CSI), "{after}");
    server.stop().await;
}

#[tokio::test]
async fn inactive_holds_presence_and_chat_states_newest_per_sender() {
    let server = TestServer::start().await;
    friends(&server).await;
    let mut alice = login_full(&server, "alice").await;
    enable_sm(&mut alice).await;
    // §5: no reply.
    alice.send(&format!("<inactive xmlns='{CSI}'/>")).await;
    assert!(quiet_sync(&mut alice).await.is_empty());

    let mut bob = login_full(&server, "bob").await;
    for s in ["away", "dnd", "xa"] {
        bob.send(&presence().show(s).to_string()).await;
    }
    for st in ["composing", "paused", "composing"] {
        chat_state(&mut bob, "alice@localhost", st).await;
    }
    sync(&mut bob).await;
    let got = quiet_sync(&mut alice).await;
    assert!(from_bob(&got).is_empty(), "held while inactive: {got:?}");

    // A message with a body is delivered at once, after what was held.
    bob.send("<message to='alice@localhost' type='chat' id='b1'><body>hi</body></message>")
        .await;
    sync(&mut bob).await;
    let got = quiet_sync(&mut alice).await;
    let bobs = from_bob(&got);
    assert_eq!(
        bobs.len(),
        3,
        "one presence, one chat state, the message: {got:?}"
    );
    assert_eq!(bobs[0].name(), "presence");
    assert_eq!(show(bobs[0]).as_deref(), Some("xa"), "the newest presence");
    assert!(bobs[1].has_child("composing", CHATSTATES), "{}", bobs[1]);
    assert!(bobs[1].get_child("body", ns::CLIENT).is_none());
    assert_eq!(bobs[2].attr("id"), Some("b1"));

    // Still inactive: held again, and <active/> delivers it.
    bob.send("<presence><show>chat</show></presence>").await;
    sync(&mut bob).await;
    assert!(from_bob(&quiet_sync(&mut alice).await).is_empty());
    alice.send(&format!("<active xmlns='{CSI}'/>")).await;
    let got = quiet_sync(&mut alice).await;
    let bobs = from_bob(&got);
    assert_eq!(bobs.len(), 1, "{got:?}");
    assert_eq!(show(bobs[0]).as_deref(), Some("chat"));
    // Active again: delivered as it comes.
    chat_state(&mut bob, "alice@localhost", "paused").await;
    sync(&mut bob).await;
    assert_eq!(from_bob(&quiet_sync(&mut alice).await).len(), 1);
    server.stop().await;
}

#[tokio::test]
async fn iqs_are_never_held_and_what_is_held_is_bounded() {
    let server = TestServer::start_with(|c| c.modules.get_mut::<modules::Csi>().max_held = 2).await;
    friends(&server).await;
    let mut alice = login_full(&server, "alice").await;
    enable_sm(&mut alice).await;
    alice.send(&format!("<inactive xmlns='{CSI}'/>")).await;
    let mut bob = login_full(&server, "bob").await;
    sync(&mut bob).await;
    // Bob's available presence is held (one sender key).
    assert!(from_bob(&quiet_sync(&mut alice).await).is_empty());
    // An iq goes through at once, after the held presence.
    bob.send(&iq_get(
        &alice.jid,
        "v1",
        "<query xmlns='jabber:iq:version'/>",
    ))
    .await;
    sync(&mut bob).await;
    let got = quiet_sync(&mut alice).await;
    let names: Vec<&str> = from_bob(&got).iter().map(|e| e.name()).collect();
    assert_eq!(names, ["presence", "iq"], "{got:?}");
    // Two held keys reach max_held = 2: both are delivered.
    bob.send("<presence><show>away</show></presence>").await;
    sync(&mut bob).await;
    assert!(from_bob(&quiet_sync(&mut alice).await).is_empty());
    chat_state(&mut bob, "alice@localhost", "composing").await;
    sync(&mut bob).await;
    let got = quiet_sync(&mut alice).await;
    assert_eq!(from_bob(&got).len(), 2, "{got:?}");
    server.stop().await;
}
