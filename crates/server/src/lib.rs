//! The Starling server: client connections, routing, the session table,
//! built-in modules, configuration and start-up.
//!
//! Code map:
//! - [`config`]: the TOML configuration and its validation.
//! - [`server`]: start-up, listeners, graceful shutdown.
//! - `c2s`: one task per client connection (RFC 6120 negotiation only).
//! - [`router`]: stanza routing (RFC 6120 §10, RFC 6121 §8.5).
//! - [`sessions`]: the sharded session table.
//! - [`modules`]: features, one module per file, on the hook API.
//! - [`accounts`]: account operations shared by CLI and modules.
//! - [`tls`]: certificates and channel bindings.

pub mod accounts;
mod c2s;
pub mod config;
mod http;
pub mod limiter;
pub mod modules;
pub mod router;
pub mod server;
pub mod sessions;
pub mod tls;
pub mod write_behind;

pub use config::Config;
pub use server::{start, start_with, RunningServer};
