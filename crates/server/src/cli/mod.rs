//! The `starling` command's subcommands, one file each (the binary's
//! modules: `src/main.rs` declares them; the library does not). `main.rs`
//! keeps the command line's shape, logging, `run` and the helpers every
//! subcommand uses (opening storage, parsing account JIDs, passwords).

pub mod admin;
pub mod archive;
pub mod cluster;
pub mod room;
pub mod upload;
pub mod user;
