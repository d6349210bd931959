//! A lean XMPP client for load generation: one tokio task per connection,
//! small read buffers, no per-connection threads.
//!
//! [`establish`] runs the whole login (TCP, optional STARTTLS or direct TLS,
//! SASL PLAIN or SCRAM, resource binding, optional initial presence) and
//! classifies every failure by [`Cause`], so a connection storm can report
//! failures by cause instead of a single error count.
//!
//! This file holds the options and the failure causes; `transport.rs` the
//! byte stream (TCP, TLS, WebSocket), `tls.rs` TLS and what a device keeps
//! between connections, `stream.rs` the XML stream ([`Conn`]), `login.rs`
//! the negotiation, `resume.rs` stream management and FAST, `register.rs`
//! in-band registration.

mod login;
mod register;
mod resume;
mod stream;
mod tls;
mod transport;

pub use login::{connect_stream, connect_transport, establish};
pub(crate) use register::xml_escape;
pub use register::{register, Registered};
pub use resume::{resume, NS_SM};
pub use stream::{Conn, Event, Inbound};
pub use tls::{as_device, tls_connector};
pub use transport::{ws_messages, Transport, WsIo};

use serde::{Deserialize, Serialize};
use starling_proto::sasl::Mechanism;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio_rustls::TlsConnector;

const NS_STREAMS: &str = "http://etherx.jabber.org/streams";
const NS_TLS: &str = "urn:ietf:params:xml:ns:xmpp-tls";
const NS_SASL: &str = "urn:ietf:params:xml:ns:xmpp-sasl";
const NS_SASL2: &str = "urn:xmpp:sasl:2";
/// The `<user-agent id/>` sent with SASL2 (XEP-0388 §2.4: a UUID v4).
const USER_AGENT_ID: &str = "2b6b4c1e-4a5f-4d0e-9c43-8a1f0f6f7a10";
const NS_BIND: &str = "urn:ietf:params:xml:ns:xmpp-bind";
const NS_REGISTER: &str = "jabber:iq:register";
const NS_FRAMING: &str = "urn:ietf:params:xml:ns:xmpp-framing";

/// Size of the per-read scratch buffer. Kept small: a load generator holds
/// tens of thousands of connections.
pub const READ_CHUNK: usize = 2048;

/// How the connection is secured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// Plain TCP, no TLS at all (the server must allow SASL without TLS).
    Plain,
    /// Plain TCP upgraded with STARTTLS (RFC 6120 §5).
    Starttls,
    /// TLS from the first byte (XEP-0368).
    Direct,
}

/// How XML reaches the server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Carrier {
    /// An RFC 6120 XML stream over TCP (with `--tls`).
    #[default]
    Tcp,
    /// RFC 7395 XMPP over WebSocket at `/xmpp-websocket` (`--tls plain`:
    /// `ws:`, `--tls direct`: `wss:`).
    Websocket,
    /// XEP-0124/XEP-0206 BOSH at `/http-bind` (`--tls plain`: `http:`,
    /// `--tls direct`: `https:`), two keep-alive connections per session.
    Bosh,
}

/// The SASL mechanism to log in with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum Mech {
    /// `PLAIN`.
    #[value(name = "PLAIN")]
    #[serde(rename = "PLAIN")]
    Plain,
    /// `SCRAM-SHA-1`.
    #[value(name = "SCRAM-SHA-1")]
    #[serde(rename = "SCRAM-SHA-1")]
    ScramSha1,
    /// `SCRAM-SHA-256`.
    #[value(name = "SCRAM-SHA-256")]
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
}

impl Mech {
    fn mechanism(self) -> Mechanism {
        match self {
            Mech::Plain => Mechanism::Plain,
            Mech::ScramSha1 => Mechanism::ScramSha1,
            Mech::ScramSha256 => Mechanism::ScramSha256,
        }
    }
}

/// Why a session could not be established.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cause {
    /// TCP connect failed (refused, no ports left, too many open files…).
    Connect,
    /// TLS handshake failed.
    Tls,
    /// Stream negotiation failed (bad XML, stream error, missing features).
    Stream,
    /// SASL authentication was refused.
    Auth,
    /// Resource binding failed.
    Bind,
    /// Something took longer than the per-step timeout.
    Timeout,
    /// The server closed the connection during setup.
    Closed,
}

impl Cause {
    /// A short stable name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Cause::Connect => "connect",
            Cause::Tls => "tls",
            Cause::Stream => "stream",
            Cause::Auth => "auth",
            Cause::Bind => "bind",
            Cause::Timeout => "timeout",
            Cause::Closed => "closed",
        }
    }
}

/// A setup failure with its cause and a human detail.
#[derive(Debug)]
pub struct SetupError {
    /// The cause bucket.
    pub cause: Cause,
    /// What happened.
    pub detail: String,
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.cause.name(), self.detail)
    }
}

impl std::error::Error for SetupError {}

fn fail<T>(cause: Cause, detail: impl Into<String>) -> Result<T, SetupError> {
    Err(SetupError {
        cause,
        detail: detail.into(),
    })
}

/// Where and how to connect; shared by all connections.
#[derive(Clone)]
pub struct Target {
    /// Server address.
    pub addr: SocketAddr,
    /// XMPP domain (stream `to`, TLS SNI).
    pub domain: String,
    /// Transport security.
    pub tls: TlsMode,
    /// TCP stream or WebSocket.
    pub carrier: Carrier,
    /// SASL mechanism.
    pub mech: Mech,
    /// Local source addresses, used round-robin by connection index.
    pub sources: Vec<IpAddr>,
    /// More server ports (other nodes of a cluster): connection `i` goes
    /// to port `[addr's, extra_ports…][i % (1 + extra)]`.
    pub extra_ports: Vec<u16>,
    /// Timeout of each setup step.
    pub step_timeout: Duration,
    /// TLS client configuration (accepts any certificate).
    pub tls_connector: TlsConnector,
    /// BOSH: the `wait` asked for (seconds a request may be held).
    pub bosh_wait: u64,
    /// Enable XEP-0198 stream management (with resumption) after binding.
    pub sm: bool,
    /// Resume inline in SASL2 (XEP-0388) instead of after a SASL
    /// exchange and a stream restart.
    pub sasl2: bool,
    /// Log in over SASL2 asking for a FAST token (XEP-0484) and resume
    /// with it (HT-SHA-256-NONE) instead of SCRAM.
    pub fast: bool,
    /// After binding (and `<enable/>`), fetch what a client re-fetches at
    /// every fresh session before its initial presence (`resume
    /// --full-login`): see [`resume::sync_after_bind`].
    pub full_login: bool,
}

/// Where one connection comes from and goes to.
#[derive(Clone, Copy, Debug)]
pub struct Via {
    /// The local source address (None: the kernel's choice).
    pub source: Option<IpAddr>,
    /// The server address.
    pub addr: SocketAddr,
}

impl Target {
    /// The source and server addresses of connection number `i`.
    pub fn source_for(&self, i: u64) -> Via {
        let source = if self.sources.is_empty() {
            None
        } else {
            Some(self.sources[(i % self.sources.len() as u64) as usize])
        };
        let k = 1 + self.extra_ports.len() as u64;
        let addr = match (i % k) as usize {
            0 => self.addr,
            j => SocketAddr::new(self.addr.ip(), self.extra_ports[j - 1]),
        };
        Via { source, addr }
    }
}
