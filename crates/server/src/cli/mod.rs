//! The `starling` command's subcommands that belong to no module, one file each
//! (a module's own subcommands are in its folder: `modules/<name>/cli.rs`) (the binary's
//! modules: `src/main.rs` declares them; the library does not). `main.rs`
//! keeps the command line's shape, logging, `run` and the helpers every
//! subcommand uses (opening storage, parsing account JIDs, passwords).

pub mod admin;
pub mod cluster;
pub mod user;
