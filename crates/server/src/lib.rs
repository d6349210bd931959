//! The Starling server: client connections, routing, the session table,
//! built-in modules, configuration and start-up.
//!
//! Code map:
//! - [`config`]: the TOML configuration and its validation.
//! - [`server`]: start-up, listeners, graceful shutdown.
//! - `transport`: connections — TCP/TLS XML streams, WebSocket, BOSH, and
//!   the HTTP listeners; framing only.
//! - `c2s`: the session task, the same for every transport (RFC 6120
//!   negotiation only; it may outlive its connection).
//! - [`routing`]: stanza routing (RFC 6120 §10, RFC 6121 §8.5, local
//!   services) and the sharded session table.
//! - [`modules`]: features, one module per file, each a
//!   `starling_core::module::Module`, on the hook API.
//! - [`admin`]: the admin listener (API, metrics, health) and `starling ctl`.
//! - [`accounts`]: account operations shared by CLI and modules.
//! - [`domains`]: domains added, disabled and removed at run time.
//! - `archive_query`: XEP-0313 query parsing and result rendering, shared
//!   by the archives modules answer for (users' own, rooms').
//! - [`tls`]: certificates and channel bindings.
//! - `fuzzing` (hidden): entry points of the private parsers that read
//!   outside input, for the fuzz targets in `fuzz/`; not an API.

pub mod accounts;
pub mod admin;
mod c2s;
pub mod cluster;
pub mod command;
pub mod config;
pub mod domains;
#[doc(hidden)]
pub mod fuzzing;
pub mod limiter;
pub(crate) mod listen;
pub mod modules;
pub mod routing;
pub mod server;
pub mod tls;
mod transport;

pub use routing::{router, sessions};

pub use config::Config;
pub use server::{start, start_with, RunningServer};
pub use transport::http::HttpRoutes;
