//! Local services (DESIGN.md "Sessions, connections and services"): a
//! service registered with the router owns a subdomain of every served
//! domain, or a fixed domain, and receives every stanza addressed to it or
//! to a JID in it; the server lists it in `disco#items` (XEP-0030 §4.3).
//! Group chat, pubsub and upload (issues 12, 13) plug in here; this test
//! registers a small service of its own.

use starling_core::hooks::{Service, ServiceAddress};
use starling_core::{async_trait, Env};
use starling_proto::Stanza;
use starling_testkit::stanza::iq_get;
use starling_testkit::stanza::msg;
use starling_testkit::{error_condition, ns, TestServer};
use std::sync::Arc;

/// Echoes messages back to their sender from the address they were sent
/// to, and answers disco#info with an identity.
struct Echo;

#[async_trait]
impl Service for Echo {
    async fn handle(&self, env: &Env, stanza: Stanza) {
        let (Some(from), Some(to)) = (stanza.from().cloned(), stanza.to().cloned()) else {
            return;
        };
        match stanza.element().name() {
            "message" => {
                let mut el = stanza.element().clone();
                el.set_attr("from", to.as_str());
                el.set_attr("to", from.as_str());
                env.route(Stanza::new(el, Some(to), Some(from))).await;
            }
            "iq" if stanza.is_iq_request() => {
                let identity = starling_proto::Element::builder("identity", ns::DISCO_INFO)
                    .attr("category", "component")
                    .attr("type", "generic")
                    .build();
                let query = starling_proto::Element::builder("query", ns::DISCO_INFO)
                    .append(identity)
                    .build();
                env.route(stanza.iq_result(Some(query))).await;
            }
            _ => {}
        }
    }
}

async fn start() -> TestServer {
    TestServer::start_with_hooks(
        |_| {},
        |reg| {
            reg.service(
                "echo-test",
                ServiceAddress::Subdomain("echo"),
                "Echo",
                Arc::new(Echo),
            );
            reg.service(
                "echo-test",
                ServiceAddress::Domain("fixed.example".into()),
                "",
                Arc::new(Echo),
            );
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_service_gets_the_stanzas_of_its_subdomain_and_jids_in_it() {
    let server = start().await;
    let mut alice = server.login("alice").await;
    for to in [
        "echo.localhost",
        "room@echo.localhost",
        "room@echo.localhost/nick",
        "fixed.example",
    ] {
        alice
            .send(
                &msg(to)
                    .chat()
                    .id("e1")
                    .body(&format!("ping {to}"))
                    .to_string(),
            )
            .await;
        let m = alice.recv().await;
        assert_eq!(m.attr("from"), Some(to), "{m}");
        assert_eq!(m.attr("to"), Some(alice.jid.as_str()), "{m}");
        assert_eq!(
            m.get_child("body", ns::CLIENT).map(|b| b.text()),
            Some(format!("ping {to}"))
        );
    }
    let info = alice
        .iq(
            "<iq type='get' to='room@echo.localhost' id='d1'><query xmlns='http://jabber.org/protocol/disco#info'/></iq>",
            "d1",
        )
        .await;
    assert_eq!(info.attr("type"), Some("result"), "{info}");
    assert_eq!(info.attr("from"), Some("room@echo.localhost"), "{info}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_server_lists_its_services_in_disco_items() {
    // XEP-0030 §4.3: the server's items are its services.
    let server = start().await;
    let mut alice = server.login("alice").await;
    let items = alice
        .iq(
            "<iq type='get' to='localhost' id='i1'><query xmlns='http://jabber.org/protocol/disco#items'/></iq>",
            "i1",
        )
        .await;
    assert_eq!(items.attr("type"), Some("result"), "{items}");
    let listed: Vec<(String, Option<String>)> = items
        .get_child("query", ns::DISCO_ITEMS)
        .expect("query")
        .children()
        .map(|i| {
            (
                i.attr("jid").unwrap_or("").to_owned(),
                i.attr("name").map(str::to_owned),
            )
        })
        .collect();
    // The fixed domain is not under localhost: not listed there.
    // (The group-chat module's service is listed beside it.)
    assert_eq!(
        listed,
        [
            (
                "conference.localhost".to_owned(),
                Some("Chatrooms".to_owned())
            ),
            ("echo.localhost".to_owned(), Some("Echo".to_owned()))
        ]
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn other_domains_are_still_remote() {
    // A subdomain of a domain this server does not serve, and a look-alike
    // label, are remote: remote-server-not-found (no s2s yet).
    let server = start().await;
    let mut alice = server.login("alice").await;
    for (i, to) in [
        "echo.elsewhere.example",
        "echoes.localhost",
        "x.echo.localhost",
    ]
    .iter()
    .enumerate()
    {
        let id = format!("r{i}");
        let r = alice
            .iq(
                &iq_get(
                    to,
                    &id,
                    "<query xmlns='http://jabber.org/protocol/disco#info'/>",
                ),
                &id,
            )
            .await;
        assert_eq!(
            error_condition(&r).as_deref(),
            Some("remote-server-not-found"),
            "{to}: {r}"
        );
    }
    server.stop().await;
}
