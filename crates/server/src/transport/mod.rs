//! Transports: bytes in, XML events out, and back — framing, not XMPP.
//! Each kind of connection turns bytes into stream events (stream opened,
//! element, stream closed) and elements back into bytes; the session task
//! (`crate::c2s`) does the same negotiation and stanza handling over any
//! of them. Nothing here calls a session or a module: the listeners
//! (`crate::listen`) accept, and hand what they accepted to who serves it.
//!
//! - [`connection`]: the `Connection` type the session holds (or not, while
//!   a stream-management session is detached), with `XmlStream` (RFC 6120
//!   over [`tcp`] / [`tls`]; also the component protocol's stream, whose
//!   header its module writes).
//! - [`framing`]: what every kind of connection shares with its session
//!   (events, ends, the read budget).
//! - [`gate`]: the connection limits (total and per source address) every
//!   listener admits its connections through, from accept to close.
//! - [`tcp`]: binding, accepting with back-off, the TCP/TLS byte stream.
//! - [`tls`]: TLS on rustls' unbuffered API (no buffer held while idle).
//! - [`websocket`]: RFC 7395 XMPP over WebSocket.
//! - [`bosh`]: XEP-0124/0206 BOSH sessions shared with their HTTP requests.
//! - [`http`]: serving one HTTP connection (axum on hyper) within time
//!   bounds, and the routes modules mount ([`http::HttpRoutes`]).

pub(crate) mod bosh;
pub(crate) mod connection;
pub(crate) mod framing;
pub(crate) mod gate;
pub(crate) mod http;
pub(crate) mod tcp;
pub(crate) mod tls;
pub(crate) mod websocket;
