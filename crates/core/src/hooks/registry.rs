//! Registration: what a module's `start` calls on the [`HookRegistry`]
//! (one method per hook point, priorities, iq namespaces, services,
//! element handlers, timers, disco declarations, provided registries),
//! and the registry frozen into [`Hooks`].

use super::{
    AccountRemovedHandler, ArchivedHandler, AttachHandler, BoundHandler, CacheHandler,
    ConnectionLostHandler, DurabilityHandler, ElementEntry, ElementHandler, ElementStage,
    HookRegistry, Hooks, InboundHandler, IqEntry, IqHandler, IqScope, OfflineMessageHandler,
    OwnIqEntry, OwnIqHandler, PreAuthHandler, PrivateFragmentHandler, Service, ServiceAddress,
    ServiceEntry, SessionClosedHandler, SessionLostHandler, SessionOpenedHandler, ShutdownHandler,
    StartedHandler, StreamFeatureProvider, TimerHandler, TrafficObserver, UserReceiveHandler,
    UserSendHandler,
};
use crate::disco::DiscoRegistry;
use std::sync::Arc;

impl HookRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a [`UserSendHandler`].
    pub fn user_send(&mut self, module: &'static str, priority: i32, h: Arc<dyn UserSendHandler>) {
        self.hooks.user_send.add(priority, module, h);
    }

    /// Registers a [`UserReceiveHandler`].
    pub fn user_receive(
        &mut self,
        module: &'static str,
        priority: i32,
        h: Arc<dyn UserReceiveHandler>,
    ) {
        self.hooks.user_receive.add(priority, module, h);
    }

    /// Registers a [`PreAuthHandler`].
    pub fn pre_auth(&mut self, module: &'static str, priority: i32, h: Arc<dyn PreAuthHandler>) {
        self.hooks.pre_auth.add(priority, module, h);
    }

    /// Registers a [`SessionOpenedHandler`].
    pub fn session_opened(
        &mut self,
        module: &'static str,
        priority: i32,
        h: Arc<dyn SessionOpenedHandler>,
    ) {
        self.hooks.session_opened.add(priority, module, h);
    }

    /// Registers a [`BoundHandler`].
    pub fn bound(&mut self, module: &'static str, priority: i32, h: Arc<dyn BoundHandler>) {
        self.hooks.bound.add(priority, module, h);
    }

    /// Registers a [`SessionClosedHandler`].
    pub fn session_closed(
        &mut self,
        module: &'static str,
        priority: i32,
        h: Arc<dyn SessionClosedHandler>,
    ) {
        self.hooks.session_closed.add(priority, module, h);
    }

    /// Registers `module`'s [`CacheHandler`].
    pub fn cache(&mut self, module: &'static str, h: Arc<dyn CacheHandler>) {
        self.hooks.caches.insert(module, h);
    }

    /// Registers a [`SessionLostHandler`].
    pub fn session_lost(
        &mut self,
        module: &'static str,
        priority: i32,
        h: Arc<dyn SessionLostHandler>,
    ) {
        self.hooks.session_lost.add(priority, module, h);
    }

    /// Registers an [`OfflineMessageHandler`].
    pub fn offline_message(
        &mut self,
        module: &'static str,
        priority: i32,
        h: Arc<dyn OfflineMessageHandler>,
    ) {
        self.hooks.offline_message.add(priority, module, h);
    }

    /// Registers an [`InboundHandler`].
    pub fn inbound(&mut self, module: &'static str, priority: i32, h: Arc<dyn InboundHandler>) {
        self.hooks.inbound.add(priority, module, h);
    }

    /// Registers a [`ShutdownHandler`].
    pub fn shutdown(&mut self, module: &'static str, priority: i32, h: Arc<dyn ShutdownHandler>) {
        self.hooks.shutdown.add(priority, module, h);
    }

    /// Registers a [`StartedHandler`].
    pub fn started(&mut self, h: Arc<dyn StartedHandler>) {
        self.hooks.started.push(h);
    }

    /// Registers a [`TrafficObserver`].
    pub fn traffic(&mut self, h: Arc<dyn TrafficObserver>) {
        self.hooks.traffic.push(h);
    }

    /// Registers a [`ConnectionLostHandler`].
    pub fn connection_lost(&mut self, h: Arc<dyn ConnectionLostHandler>) {
        self.hooks.connection_lost.push(h);
    }

    /// Registers an [`AttachHandler`].
    pub fn attached(&mut self, module: &'static str, priority: i32, h: Arc<dyn AttachHandler>) {
        self.hooks.attached.add(priority, module, h);
    }

    /// Registers the [`PrivateFragmentHandler`] of the fragment `{ns}name`.
    ///
    /// # Panics
    /// If another module serves that fragment.
    pub fn private_fragment(&mut self, name: &str, ns: &str, h: Arc<dyn PrivateFragmentHandler>) {
        let key = format!("{{{ns}}}{name}");
        assert!(
            !self.hooks.private_fragments.iter().any(|(k, _)| *k == key),
            "two modules serve the private fragment {key}"
        );
        self.hooks.private_fragments.push((key, h));
    }

    /// Registers an [`AccountRemovedHandler`].
    pub fn account_removed(&mut self, h: Arc<dyn AccountRemovedHandler>) {
        self.hooks.account_removed.push(h);
    }

    /// Registers a [`DurabilityHandler`].
    pub fn durability(&mut self, h: Arc<dyn DurabilityHandler>) {
        self.hooks.durability.push(h);
    }

    /// Registers an [`ArchivedHandler`].
    pub fn archived(&mut self, module: &'static str, priority: i32, h: Arc<dyn ArchivedHandler>) {
        self.hooks.archived.add(priority, module, h);
    }

    /// Registers the [`ElementHandler`] for namespace `ns` at `stage`.
    ///
    /// # Panics
    /// If another module already handles that namespace at that stage.
    pub fn element(
        &mut self,
        module: &'static str,
        stage: ElementStage,
        ns: &str,
        h: Arc<dyn ElementHandler>,
    ) {
        if let Some(other) = self
            .hooks
            .elements
            .iter()
            .find(|e| e.stage == stage && e.ns == ns)
        {
            panic!(
                "modules {} and {module} both handle {{{ns}}} elements at {stage:?}",
                other.module
            );
        }
        self.hooks.elements.push(ElementEntry {
            stage,
            ns: ns.to_owned(),
            module,
            bit: crate::module::module_bit(module),
            handler: h,
        });
    }

    /// Registers a [`StreamFeatureProvider`] of the module being started
    /// ([`HookRegistry::begin_module`]).
    pub fn stream_features(&mut self, h: Arc<dyn StreamFeatureProvider>) {
        let bit = self.current.map_or(0, crate::module::module_bit);
        self.hooks.stream_features.push((bit, h));
    }

    /// Says which module registers what follows (the server calls it
    /// before each module's `start`): the disco features and stream
    /// features declared next belong to `module`, and are hidden for the
    /// domains that switch it off.
    pub fn begin_module(&mut self, module: &'static str) {
        self.current = Some(module);
        self.hooks.disco.current_bit = crate::module::module_bit(module);
    }

    /// Ends [`HookRegistry::begin_module`]: what is declared next belongs
    /// to no module and is shown for every domain.
    pub fn end_module(&mut self) {
        self.current = None;
        self.hooks.disco.current_bit = 0;
    }

    /// Registers the [`TimerHandler`] for timers set with `module`'s name.
    pub fn timer(&mut self, module: &'static str, h: Arc<dyn TimerHandler>) {
        self.hooks.timers.insert(module, h);
    }

    /// Registers an [`IqHandler`] for payload `{ns}name` in `scope`.
    ///
    /// # Panics
    /// If another module already handles the same payload in the same scope:
    /// two enabled modules claiming one namespace is a configuration bug that
    /// must stop start-up, not be resolved silently.
    pub fn iq(
        &mut self,
        module: &'static str,
        scope: IqScope,
        name: &str,
        ns: &str,
        h: Arc<dyn IqHandler>,
    ) {
        let entries = self.hooks.iq.entry(ns.to_owned()).or_default();
        if let Some(other) = entries.iter().find(|e| e.scope == scope && e.name == name) {
            panic!(
                "modules {} and {module} both handle {{{ns}}}{name} in {scope:?} scope",
                other.module
            );
        }
        entries.push(IqEntry {
            scope,
            name: name.to_owned(),
            module,
            bit: crate::module::module_bit(module),
            handler: h,
        });
    }

    /// Registers a local [`Service`] at `address`, listed in the server's
    /// `disco#items` as `name`.
    ///
    /// # Panics
    /// If another service already owns that address.
    pub fn service(
        &mut self,
        module: &'static str,
        address: ServiceAddress,
        name: &str,
        service: Arc<dyn Service>,
    ) {
        if let Some(other) = self.hooks.services.iter().find(|e| e.address == address) {
            panic!(
                "modules {} and {module} both claim the service address {address:?}",
                other.module
            );
        }
        self.hooks.services.push(ServiceEntry {
            address,
            name: name.to_owned(),
            module,
            bit: crate::module::module_bit(module),
            service,
        });
    }

    /// Registers the [`OwnIqHandler`] for payload `{ns}name`.
    ///
    /// # Panics
    /// If another module already handles that payload.
    pub fn own_iq(&mut self, module: &'static str, name: &str, ns: &str, h: Arc<dyn OwnIqHandler>) {
        let entries = self.hooks.own_iq.entry(ns.to_owned()).or_default();
        if let Some(other) = entries.iter().find(|e| e.name == name) {
            panic!(
                "modules {} and {module} both handle own-account {{{ns}}}{name}",
                other.module
            );
        }
        entries.push(OwnIqEntry {
            name: name.to_owned(),
            module,
            bit: crate::module::module_bit(module),
            handler: h,
        });
    }

    /// Service discovery declarations.
    pub fn disco(&mut self) -> &mut DiscoRegistry {
        &mut self.hooks.disco
    }

    /// Lends modules a registry that the embedding server defines, for
    /// contributions this crate has no type for — the server's HTTP routes
    /// (`starling_server::HttpRoutes`), so that HTTP types stay out of the
    /// extension API. Keyed by type: the server provides an empty registry
    /// before it starts the modules, a module fills it through
    /// [`HookRegistry::provided`], and the server takes it back with
    /// [`HookRegistry::take_provided`] before [`HookRegistry::build`]
    /// (what is left is dropped there).
    pub fn provide<T: std::any::Any + Send>(&mut self, registry: T) {
        self.provided.insert(registry);
    }

    /// The provided registry of type `T`; `None` when the server running
    /// the module provides none (a module then says what it cannot do).
    pub fn provided<T: std::any::Any + Send>(&mut self) -> Option<&mut T> {
        self.provided.get_mut::<T>()
    }

    /// Takes back the provided registry of type `T`.
    pub fn take_provided<T: std::any::Any + Send>(&mut self) -> Option<T> {
        self.provided.remove::<T>()
    }

    /// Freezes the registry.
    pub fn build(self) -> Hooks {
        self.hooks
    }
}
