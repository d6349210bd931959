//! The extension API of Starling: the only crate a module depends on.
//!
//! A stanza arrives in a connection task (the c2s session, in the server
//! crate), which knows RFC 6120 negotiation and nothing else. Everything a
//! server *does* with stanzas lives in modules that subscribe to typed hooks:
//!
//! - [`hooks`]: one trait per hook point ([`hooks::UserSendHandler`],
//!   [`hooks::UserReceiveHandler`], …) and the [`hooks::HookRegistry`] in
//!   which modules register handlers with a priority. Hook names are Rust
//!   types, never strings (DESIGN.md invariant 4).
//! - [`SessionCtx`]: what a c2s hook handler sees of its session, and the
//!   accumulator of [`Action`]s it requests. Handlers never touch the socket;
//!   the session task applies the actions after the chain ran (invariant 3).
//! - [`Extensions`]: per-module per-session state, owned by the session task.
//! - [`Router`], [`SessionManager`]: the routing and session-table
//!   interfaces; the local implementations live in the server crate and a
//!   clustered one can be added beside them without touching modules.
//! - [`storage`]: per-concern storage traits; only backends see SQL.
//! - [`roster::SessionRoster`]: a session's roster cache, the contract
//!   between the roster and presence modules.
//! - [`module::Module`]: what a module declares (name, config, hooks).
//! - [`Metrics`]: the metrics registry and pre-resolved hot-path handles.
//! - [`forms`]: XEP-0004 data forms, read and built.
//!
//! Architecture invariant: this crate has no I/O of its own and no knowledge
//! of any XEP. It is small on purpose so module authors have a stable target.

pub mod disco;
mod env;
mod extensions;
pub mod forms;
mod handover;
pub mod hooks;
mod metrics;
pub mod module;
mod pressure;
pub mod roster;
mod routing;
pub mod storage;
pub mod throttle;

pub use env::{Env, Host, Hosts};
pub use extensions::Extensions;
pub use handover::{HandoverGate, HandoverGuard};
pub use hooks::{
    Action, Flow, HookError, HookResult, SessionCtx, SessionInfo, SessionState, TimerKey,
};
pub use metrics::{
    Held, LatencyHistogram, Metrics, ProcessStats, QueueMetrics, SessionTransport, StorageOp,
    WriteBehindMetrics,
};
pub use pressure::Pressure;
pub use routing::{
    mailbox, CloseReason, Handover, Mailbox, Router, SessionEntry, SessionHandle, SessionManager,
    SessionMsg, SessionRef, SessionSendError, TooManyResources,
};

/// Re-exported so modules do not need direct dependencies for these.
pub use async_trait::async_trait;
pub use starling_proto as proto;
pub use starling_xml as xml;
