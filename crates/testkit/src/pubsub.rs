//! Publish-Subscribe (XEP-0060) for scenario tests, as the pubsub service
//! and Personal Eventing (XEP-0163, an account as its own service) speak
//! it: the namespaces, requests to a service (publish, create, subscribe,
//! retrieve items), the forms they carry, and reading what comes back
//! (item ids, application error conditions, event notifications and
//! their SHIM SubID headers). Section numbers are XEP-0060's.
//!
//! ```no_run
//! # use starling_testkit::{pubsub, TestServer};
//! # async fn scenario() {
//! let server = TestServer::start().await;
//! let mut alice = server.login("alice").await;
//! let svc = "pubsub.localhost";
//! pubsub::create(&mut alice, svc, "feed", &[]).await;
//! let r = pubsub::publish(&mut alice, svc, "feed", "i1", "<x xmlns='urn:example'/>", "").await;
//! assert_eq!(r.attr("type"), Some("result"));
//! let r = pubsub::items(&mut alice, svc, "feed", "", "").await;
//! assert_eq!(pubsub::item_ids(&r), ["i1"]);
//! # }
//! ```

use crate::{ns, Client};
use starling_xml::Element;

/// The base namespace (requests of entities, §5–§7).
pub const PUBSUB: &str = "http://jabber.org/protocol/pubsub";
/// Owners' requests (§8).
pub const OWNER: &str = "http://jabber.org/protocol/pubsub#owner";
/// Event notifications (§4.3, §7.1.2).
pub const EVENT: &str = "http://jabber.org/protocol/pubsub#event";
/// Application-specific error conditions (§7.1.3 and the other error
/// cases).
pub const ERRORS: &str = "http://jabber.org/protocol/pubsub#errors";
/// The node configuration form (§8.2).
pub const NODE_CONFIG: &str = "http://jabber.org/protocol/pubsub#node_config";
/// The subscription options form (§6.3).
pub const SUB_OPTIONS: &str = "http://jabber.org/protocol/pubsub#subscribe_options";
/// The publish options form (§7.1.5).
pub const PUBLISH_OPTIONS: &str = "http://jabber.org/protocol/pubsub#publish-options";
/// Stanza headers (XEP-0131): a notification's SubIDs (§12.3).
pub const SHIM: &str = "http://jabber.org/protocol/shim";

/// An iq of type `ty` to `to` (empty: no `to`, the own account, as PEP
/// requests go, XEP-0163 §4) with `inner` inside a `<pubsub/>` of
/// namespace `ns` (empty: `inner` is the iq's child itself); the answer.
pub async fn request(c: &mut Client, to: &str, ty: &str, ns: &str, inner: &str) -> Element {
    let id = format!("ps-{}", starling_proto::random_id(8));
    let to = if to.is_empty() {
        String::new()
    } else {
        format!(" to='{to}'")
    };
    let body = if ns.is_empty() {
        inner.to_owned()
    } else {
        format!("<pubsub xmlns='{ns}'>{inner}</pubsub>")
    };
    c.iq(&format!("<iq type='{ty}' id='{id}'{to}>{body}</iq>"), &id)
        .await
}

/// A submitted data form (XEP-0004 §3.1) of `form_type` (its hidden
/// `FORM_TYPE` field, XEP-0068) with `fields`.
pub fn form(form_type: &str, fields: &[(&str, &str)]) -> String {
    let mut x = format!("<x xmlns='jabber:x:data' type='submit'><field var='FORM_TYPE' type='hidden'><value>{form_type}</value></field>");
    for (var, v) in fields {
        x.push_str(&format!("<field var='{var}'><value>{v}</value></field>"));
    }
    x.push_str("</x>");
    x
}

/// §7.1: publishes `payload` as item `id` (empty: the service names it,
/// §7.1.1) to `node` of `to`; `options` are `<field/>`s of a publish
/// options form (§7.1.5), empty for none. The answer.
pub async fn publish(
    c: &mut Client,
    to: &str,
    node: &str,
    id: &str,
    payload: &str,
    options: &str,
) -> Element {
    let id = if id.is_empty() {
        String::new()
    } else {
        format!(" id='{id}'")
    };
    let opts = if options.is_empty() {
        String::new()
    } else {
        format!("<publish-options><x xmlns='jabber:x:data' type='submit'><field var='FORM_TYPE' type='hidden'><value>{PUBLISH_OPTIONS}</value></field>{options}</x></publish-options>")
    };
    request(
        c,
        to,
        "set",
        PUBSUB,
        &format!("<publish node='{node}'><item{id}>{payload}</item></publish>{opts}"),
    )
    .await
}

/// §8.1: creates `node` at `to`, configured with `config` (§8.1.3) if not
/// empty. The answer.
pub async fn create(c: &mut Client, to: &str, node: &str, config: &[(&str, &str)]) -> Element {
    let configure = if config.is_empty() {
        String::new()
    } else {
        format!("<configure>{}</configure>", form(NODE_CONFIG, config))
    };
    request(
        c,
        to,
        "set",
        PUBSUB,
        &format!("<create node='{node}'/>{configure}"),
    )
    .await
}

/// §6.1: subscribes `jid` to `node` of `to`. The answer.
pub async fn subscribe(c: &mut Client, to: &str, node: &str, jid: &str) -> Element {
    request(
        c,
        to,
        "set",
        PUBSUB,
        &format!("<subscribe node='{node}' jid='{jid}'/>"),
    )
    .await
}

/// §6.5: the items of `node` of `to`; `attrs` go on `<items/>`
/// (`max_items='2'`, §6.5.7) and `inner` inside it (`<item id='x'/>`,
/// §6.5.8). The answer.
pub async fn items(c: &mut Client, to: &str, node: &str, attrs: &str, inner: &str) -> Element {
    request(
        c,
        to,
        "get",
        PUBSUB,
        &format!("<items node='{node}' {attrs}>{inner}</items>"),
    )
    .await
}

/// The ids of the items of an items answer (§6.5.2), in order; panics
/// without an `<items/>`.
#[track_caller]
pub fn item_ids(r: &Element) -> Vec<String> {
    r.get_child("pubsub", PUBSUB)
        .and_then(|p| p.get_child("items", PUBSUB))
        .unwrap_or_else(|| panic!("no items in {r}"))
        .children()
        .filter_map(|c| c.attr("id").map(str::to_owned))
        .collect()
}

/// The application-specific condition (`pubsub#errors`) of an error
/// answer, if any.
pub fn app_error(r: &Element) -> Option<String> {
    r.get_child("error", ns::CLIENT)?
        .children()
        .find(|c| c.ns() == ERRORS)
        .map(|c| c.name().to_owned())
}

/// The next event notification message (§4.3) for `c`, skipping anything
/// else; panics unless it comes from `from`.
pub async fn next_event(c: &mut Client, from: &str) -> Element {
    let m = c
        .recv_until(|e| e.name() == "message" && e.has_child("event", EVENT))
        .await;
    assert_eq!(m.attr("from"), Some(from), "{m}");
    m
}

/// The `<items/>` of a notification (§7.1.2); panics without one.
#[track_caller]
pub fn event_items(m: &Element) -> Element {
    m.get_child("event", EVENT)
        .and_then(|e| e.get_child("items", EVENT))
        .unwrap_or_else(|| panic!("no items event: {m}"))
        .clone()
}

/// The SubIDs a notification names in its SHIM headers (§12.3), for a
/// subscriber with several subscriptions.
pub fn subids(m: &Element) -> Vec<String> {
    m.get_child("headers", SHIM)
        .map(|h| {
            h.children()
                .filter(|c| c.attr("name") == Some("SubID"))
                .map(|c| c.text())
                .collect()
        })
        .unwrap_or_default()
}

/// Asserts that no event notification reached `c` up to its
/// [`Client::barrier`]. Sound for what `c` itself sent, and for what
/// reached `c`'s mailbox before another client's answer: PEP notifies
/// before the publisher's answer (XEP-0163). For the pubsub service, which
/// answers first and notifies after, [`no_event_after`].
pub async fn no_event(c: &mut Client) {
    for el in c.barrier().await {
        assert!(
            !el.has_child("event", EVENT),
            "unexpected notification {el}"
        );
    }
}

/// Asserts that `c` got no notification from what `cause` sent to the
/// pubsub service (its answer already read). The service handles a
/// stanza in its sender's session and routes the answer, then the
/// notifications: once `cause` has the answer to a later ping (its
/// barrier), every one of them is in its recipient's mailbox, and `c`'s
/// barrier shows whether one was for `c`. The cause's barrier must not
/// swallow a notification of its own.
pub async fn no_event_after(cause: &mut Client, c: &mut Client) {
    for el in cause.barrier().await {
        assert!(
            !el.has_child("event", EVENT),
            "a notification to {} before its barrier: {el}",
            cause.jid
        );
    }
    no_event(c).await;
}
