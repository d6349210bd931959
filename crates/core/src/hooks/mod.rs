//! Typed hooks, the handler registry and the action accumulator.
//!
//! Each hook point is a trait. A module implements the traits of the hooks it
//! cares about and registers the implementations in the [`HookRegistry`]
//! with a priority (lower runs first). Hooks a module does not register cost
//! nothing: a disabled module runs no code (DESIGN.md invariant 1).
//!
//! Handlers of session hooks get a [`SessionCtx`]: read-only facts about the
//! session, the module's own per-session state, and an accumulator of
//! [`Action`]s. The session task applies the actions, in order, when the
//! chain has run; handlers never write to the socket themselves.
//!
//! A handler that returns an error is logged and skipped; the chain goes on
//! and the connection stays up (invariant 3).
//!
//! The files: this one the result types, the chains and the registry's
//! and the frozen set's state; `session.rs` what a session handler gets
//! ([`SessionCtx`], [`Action`]); `handlers.rs` the hook traits and their
//! argument types; `registry.rs` registration ([`HookRegistry`]);
//! `dispatch.rs` the lookups of the frozen [`Hooks`].

use crate::{disco::DiscoRegistry, Extensions};
use std::collections::HashMap;
use std::sync::Arc;

mod dispatch;
mod handlers;
mod registry;
mod session;
#[cfg(test)]
mod tests;

pub use handlers::{
    AccountRemovedHandler, Archived, ArchivedHandler, AttachHandler, BoundHandler, CacheHandler,
    ConnectionLostHandler, DurabilityHandler, ElementHandler, ElementStage, FeatureStage,
    InboundHandler, IqHandler, IqResponse, IqScope, OfflineCompanions, OfflineMessageHandler,
    Outgoing, OwnIqHandler, PreAuthHandler, PrivateFragmentHandler, Service, ServiceAddress,
    SessionClosedHandler, SessionLostHandler, SessionOpenedHandler, ShutdownHandler,
    StartedHandler, StreamFeatureProvider, TimerHandler, TrafficObserver, UserReceiveHandler,
    UserSendHandler,
};
pub use session::{Action, SessionCtx, SessionInfo, SessionState, TimerKey};

/// What a handler tells the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Run the next handler (and the default action at the end).
    Continue,
    /// The stanza was consumed: stop the chain and skip the default action.
    Stop,
}

/// A handler failure; logged with the module name, then the chain goes on.
pub type HookError = Box<dyn std::error::Error + Send + Sync>;

/// A handler's result.
pub type HookResult = Result<Flow, HookError>;

struct ServiceEntry {
    address: ServiceAddress,
    name: String,
    module: &'static str,
    bit: u64,
    service: Arc<dyn Service>,
}

struct OwnIqEntry {
    name: String,
    module: &'static str,
    bit: u64,
    handler: Arc<dyn OwnIqHandler>,
}

struct IqEntry {
    scope: IqScope,
    name: String,
    module: &'static str,
    bit: u64,
    handler: Arc<dyn IqHandler>,
}

struct ElementEntry {
    stage: ElementStage,
    ns: String,
    module: &'static str,
    bit: u64,
    handler: Arc<dyn ElementHandler>,
}

struct Registered<T: ?Sized> {
    priority: i32,
    module: &'static str,
    /// [`crate::module::module_bit`] of `module`.
    bit: u64,
    handler: Arc<T>,
}

/// A priority-ordered chain of handlers of one hook.
pub struct Chain<T: ?Sized> {
    handlers: Vec<Registered<T>>,
}

impl<T: ?Sized> Default for Chain<T> {
    fn default() -> Self {
        Chain {
            handlers: Vec::new(),
        }
    }
}

impl<T: ?Sized> Chain<T> {
    fn add(&mut self, priority: i32, module: &'static str, handler: Arc<T>) {
        self.handlers.push(Registered {
            priority,
            module,
            bit: crate::module::module_bit(module),
            handler,
        });
        // Stable sort: equal priorities keep registration order.
        self.handlers.sort_by_key(|r| r.priority);
    }

    /// True when no handler is registered.
    pub fn is_empty(&self) -> bool {
        self.handlers.is_empty()
    }

    /// The handlers in running order, with their module names.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &Arc<T>)> {
        self.handlers.iter().map(|r| (r.module, &r.handler))
    }

    /// [`Chain::iter`] without the modules switched off in `off` (a
    /// domain's [`crate::Host::modules_off`]).
    pub fn iter_on(&self, off: u64) -> impl Iterator<Item = (&'static str, &Arc<T>)> {
        self.handlers
            .iter()
            .filter(move |r| r.bit & off == 0)
            .map(|r| (r.module, &r.handler))
    }
}

/// Logs a handler failure; the chain continues.
pub fn log_failure(hook: &'static str, module: &'static str, err: &HookError) {
    tracing::error!(hook, module, error = %err, "hook handler failed; skipped");
}

/// Runs a chain; stops at the first [`Flow::Stop`]. Failed handlers are
/// logged and skipped.
#[macro_export]
macro_rules! run_chain {
    ($chain:expr, $hook:literal, |$h:ident| $call:expr) => {
        $crate::run_chain!($chain, $hook, off = 0, |$h| $call)
    };
    // `off`: the modules switched off for the domain concerned
    // ([`crate::Host::modules_off`]) are skipped.
    ($chain:expr, $hook:literal, off = $off:expr, |$h:ident| $call:expr) => {{
        let mut flow = $crate::Flow::Continue;
        for (module, $h) in $chain.iter_on($off) {
            match $call.await {
                Ok($crate::Flow::Continue) => {}
                Ok($crate::Flow::Stop) => {
                    flow = $crate::Flow::Stop;
                    break;
                }
                Err(e) => $crate::hooks::log_failure($hook, module, &e),
            }
        }
        flow
    }};
}

/// Where modules register their handlers. Frozen into [`Hooks`] once all
/// enabled modules are started.
#[derive(Default)]
pub struct HookRegistry {
    hooks: Hooks,
    /// The module being started ([`HookRegistry::begin_module`]): disco
    /// declarations and stream features are tagged with it.
    current: Option<&'static str>,
    /// Registries the embedding server defines and modules fill at start
    /// (see [`HookRegistry::provide`]).
    provided: Extensions,
}

/// All registered handlers, shared read-only by every session.
#[derive(Default)]
pub struct Hooks {
    /// [`UserSendHandler`]s.
    pub user_send: Chain<dyn UserSendHandler>,
    /// [`UserReceiveHandler`]s.
    pub user_receive: Chain<dyn UserReceiveHandler>,
    /// [`PreAuthHandler`]s.
    pub pre_auth: Chain<dyn PreAuthHandler>,
    /// [`SessionOpenedHandler`]s.
    pub session_opened: Chain<dyn SessionOpenedHandler>,
    /// [`SessionClosedHandler`]s.
    pub session_closed: Chain<dyn SessionClosedHandler>,
    /// [`SessionLostHandler`]s.
    pub session_lost: Chain<dyn SessionLostHandler>,
    /// [`CacheHandler`]s by module name.
    caches: HashMap<&'static str, Arc<dyn CacheHandler>>,
    /// [`BoundHandler`]s.
    pub bound: Chain<dyn BoundHandler>,
    /// [`OfflineMessageHandler`]s.
    pub offline_message: Chain<dyn OfflineMessageHandler>,
    /// [`InboundHandler`]s.
    pub inbound: Chain<dyn InboundHandler>,
    /// [`StreamFeatureProvider`]s with their modules' bits (see
    /// [`Hooks::stream_features_on`]).
    stream_features: Vec<(u64, Arc<dyn StreamFeatureProvider>)>,
    /// [`ShutdownHandler`]s.
    pub shutdown: Chain<dyn ShutdownHandler>,
    /// [`StartedHandler`]s.
    pub started: Vec<Arc<dyn StartedHandler>>,
    /// [`TrafficObserver`]s.
    pub traffic: Vec<Arc<dyn TrafficObserver>>,
    /// [`ConnectionLostHandler`]s.
    pub connection_lost: Vec<Arc<dyn ConnectionLostHandler>>,
    /// [`AttachHandler`]s.
    pub attached: Chain<dyn AttachHandler>,
    /// [`DurabilityHandler`]s.
    pub durability: Vec<Arc<dyn DurabilityHandler>>,
    /// [`AccountRemovedHandler`]s.
    pub account_removed: Vec<Arc<dyn AccountRemovedHandler>>,
    /// Private XML fragments served by modules, by `{ns}name`.
    pub private_fragments: Vec<(String, Arc<dyn PrivateFragmentHandler>)>,
    /// [`ArchivedHandler`]s.
    pub archived: Chain<dyn ArchivedHandler>,
    /// [`ElementHandler`]s by (stage, namespace).
    elements: Vec<ElementEntry>,
    timers: HashMap<&'static str, Arc<dyn TimerHandler>>,
    /// namespace → (scope, element name, module, handler); looked up by
    /// `&str` so routing an iq allocates nothing.
    iq: HashMap<String, Vec<IqEntry>>,
    /// namespace → own-account handlers.
    own_iq: HashMap<String, Vec<OwnIqEntry>>,
    /// Local services.
    services: Vec<ServiceEntry>,
    /// Features and identities for service discovery, declared by modules.
    pub disco: DiscoRegistry,
}
