//! Connections: framing, not XMPP. Each kind turns bytes into stream
//! events (stream opened, element, stream closed) and elements back into
//! bytes; the session task (`crate::c2s`) does the same negotiation and
//! stanza handling over any of them.
//!
//! - [`connection`]: the `Connection` type the session holds (or not, while
//!   a stream-management session is detached), with `XmlStream` (RFC 6120
//!   over [`tcp`] / [`tls`]).
//! - [`gate`]: the connection limits (total and per source address) every
//!   listener admits its connections through, from accept to close.
//! - [`tls`]: TLS on rustls' unbuffered API (no buffer held while idle).
//! - [`websocket`]: RFC 7395 XMPP over WebSocket.
//! - [`bosh`]: XEP-0124/0206 BOSH sessions shared with their HTTP requests.
//! - [`http`]: the HTTP listeners (axum on hyper) serving WebSocket, BOSH,
//!   XEP-0156 host-meta and the web client; later the admin API and metrics.

pub(crate) mod bosh;
pub(crate) mod connection;
pub(crate) mod gate;
pub(crate) mod http;
pub(crate) mod tcp;
pub(crate) mod tls;
pub(crate) mod websocket;
