//! Starling's scenario tests: a real server on loopback, driven over real
//! sockets by test clients (crates/testkit), or the real `starling` binary
//! run as a user runs it. One module per feature; run one with a filter on
//! its path, e.g. `cargo test --workspace --test scenarios -- muc::`.
//!
//! They are modules of one test binary rather than one binary each: each
//! binary links the whole server, and ~35 of them made the debug target
//! directory several gigabytes larger and the build minutes longer.

mod admin;
mod bad_input;
mod blocking;
mod bosh;
mod carbons;
mod cli;
mod cluster;
mod component;
mod csi;
mod docs;
mod domains;
mod im_common;
mod inbox;
mod killable;
mod layout;
mod limits;
mod listeners;
mod mam;
mod metrics;
mod muc;
mod muc_light;
mod negotiation;
mod offline;
mod pep;
mod preauth;
mod presence;
mod profile;
mod proxy65;
mod pubsub;
mod register;
mod roster;
mod routing;
mod sasl2;
mod server_info;
mod services;
mod shutdown;
mod stores;
mod stream_management;
mod upload;
mod web_client;
mod websocket;
