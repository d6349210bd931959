//! Test kit: an in-process Starling on ephemeral loopback ports and a
//! scripted XMPP client that speaks over a real socket, so integration tests
//! read as conversations:
//!
//! ```no_run
//! # use starling_testkit::TestServer;
//! # async fn scenario() {
//! let server = TestServer::start().await;
//! let mut alice = server.login("alice").await;
//! let mut bob = server.login("bob").await;
//! alice.send(&format!("<message to='{}' type='chat'><body>hi</body></message>", bob.jid)).await;
//! let msg = bob.recv().await;
//! assert_eq!(msg.get_child("body", "jabber:client").unwrap().text(), "hi");
//! # }
//! ```
//!
//! The client panics with a readable message on anything unexpected; every
//! wait has a timeout, so a broken server fails a test instead of hanging it.

use starling_xml::Element;
use std::time::Duration;

pub use starling_server;
pub use starling_xml;

mod client;
mod http;
mod server;
mod tls;
mod wait;
mod ws;

pub mod mam;
pub mod muc;
pub mod pubsub;
pub mod roster;
pub mod stanza;

pub use client::*;
pub use http::*;
pub use server::*;
pub use tls::*;
pub use wait::*;
pub use ws::*;

/// Namespaces used in assertions.
pub mod ns {
    pub use starling_proto::ns::*;
}

/// How long any single expectation may wait.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The test domain.
pub const DOMAIN: &str = "localhost";

/// The defined condition of a stanza error element.
pub fn error_condition(stanza: &Element) -> Option<String> {
    stanza
        .get_child("error", ns::CLIENT)?
        .children()
        .find(|c| c.ns() == ns::STANZAS && c.name() != "text")
        .map(|c| c.name().to_owned())
}
