//! The frozen hook set's lookups: element handlers, stream features,
//! private fragments, timers, caches, services and iq handlers, each
//! without the modules a domain switched off.

use super::{
    Archived, CacheHandler, ElementHandler, ElementStage, Hooks, IqHandler, IqScope, OwnIqHandler,
    PrivateFragmentHandler, Service, ServiceAddress, SessionCtx, StreamFeatureProvider,
    TimerHandler,
};
use crate::Env;
use std::sync::Arc;

impl Hooks {
    /// The handler of non-stanza elements in namespace `ns` at `stage`,
    /// with its module's name.
    /// `off`: the modules switched off for the session's domain
    /// ([`crate::Host::modules_off`]); theirs are not found.
    pub fn element_handler(
        &self,
        stage: ElementStage,
        ns: &str,
        off: u64,
    ) -> Option<(&'static str, &Arc<dyn ElementHandler>)> {
        // Few entries: a linear scan, no key to allocate.
        self.elements
            .iter()
            .find(|e| e.stage == stage && e.ns == ns && e.bit & off == 0)
            .map(|e| (e.module, &e.handler))
    }

    /// The stream feature providers of the modules not switched off in
    /// `off`.
    pub fn stream_features_on(
        &self,
        off: u64,
    ) -> impl Iterator<Item = &Arc<dyn StreamFeatureProvider>> {
        self.stream_features
            .iter()
            .filter(move |(bit, _)| bit & off == 0)
            .map(|(_, p)| p)
    }

    /// The namespaces with a handler at `stage`, in registration order,
    /// without those of modules switched off in `off`.
    pub fn element_namespaces(&self, stage: ElementStage, off: u64) -> impl Iterator<Item = &str> {
        self.elements
            .iter()
            .filter(move |e| e.stage == stage && e.bit & off == 0)
            .map(|e| e.ns.as_str())
    }

    /// The module serving private fragment `key` (`{ns}name`), if any.
    pub fn private_fragment(&self, key: &str) -> Option<&Arc<dyn PrivateFragmentHandler>> {
        self.private_fragments
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, h)| h)
    }

    /// Waits until every [`DurabilityHandler`] says its queued writes are
    /// committed.
    pub async fn durable(&self, env: &Env) {
        for h in &self.durability {
            h.durable(env).await;
        }
    }

    /// [`Hooks::durable`] for an acknowledgement to the session of `cx`
    /// ([`DurabilityHandler::durable_for`]).
    pub async fn durable_for(&self, cx: &mut SessionCtx<'_>) {
        for h in &self.durability {
            h.durable_for(cx).await;
        }
    }

    /// Tells every [`ArchivedHandler`] about an archived copy (not those
    /// of modules switched off for the owner's domain).
    pub async fn archived(&self, env: &Env, msg: &Archived<'_>) {
        let off = env
            .hosts
            .modules_off(msg.owner.domain().as_str())
            .unwrap_or(0);
        for (_, h) in self.archived.iter_on(off) {
            h.archived(env, msg).await;
        }
    }

    /// The timer handler of `module`.
    pub fn timer(&self, module: &str) -> Option<&Arc<dyn TimerHandler>> {
        self.timers.get(module)
    }

    /// The cache handler of `module` (a name read off the wire).
    pub fn cache(&self, module: &str) -> Option<&Arc<dyn CacheHandler>> {
        self.caches.get(module)
    }

    /// The registered name of a module with a timer handler (a name read
    /// off the wire, back to the `'static` one a [`TimerKey`] holds).
    pub fn timer_module(&self, module: &str) -> Option<&'static str> {
        self.timers.get_key_value(module).map(|(k, _)| *k)
    }

    /// The service owning `domain`, if any. `modules_off` says which
    /// domains are served (a subdomain service exists under each of them)
    /// and which modules each switches off
    /// ([`crate::Hosts::modules_off`]): a subdomain service whose module
    /// is off for the parent domain does not exist there.
    pub fn service_for(
        &self,
        domain: &str,
        modules_off: impl Fn(&str) -> Option<u64>,
    ) -> Option<&Arc<dyn Service>> {
        self.services
            .iter()
            .find(|e| match &e.address {
                ServiceAddress::Domain(d) => d == domain,
                ServiceAddress::Subdomain(label) => domain
                    .strip_prefix(label)
                    .and_then(|r| r.strip_prefix('.'))
                    .and_then(&modules_off)
                    .is_some_and(|off| off & e.bit == 0),
            })
            .map(|e| &e.service)
    }

    /// The services under served domain `domain` with their names
    /// (`disco#items` of the server, XEP-0030 §4), without those of
    /// modules switched off in `off` (the domain's
    /// [`crate::Host::modules_off`]).
    pub fn services_of(&self, domain: &str, off: u64) -> Vec<(String, &str)> {
        self.services
            .iter()
            .filter(|e| e.bit & off == 0)
            .filter_map(|e| {
                let jid = match &e.address {
                    ServiceAddress::Subdomain(label) => format!("{label}.{domain}"),
                    ServiceAddress::Domain(d)
                        if d.strip_suffix(domain).is_some_and(|p| p.ends_with('.')) =>
                    {
                        d.clone()
                    }
                    ServiceAddress::Domain(_) => return None,
                };
                Some((jid, e.name.as_str()))
            })
            .collect()
    }

    /// The own-account handler for a payload `{ns}name`, unless its
    /// module is switched off in `off` (the account's domain's
    /// [`crate::Host::modules_off`]).
    pub fn own_iq_handler(&self, name: &str, ns: &str, off: u64) -> Option<&Arc<dyn OwnIqHandler>> {
        self.own_iq
            .get(ns)?
            .iter()
            .find(|e| e.name == name && e.bit & off == 0)
            .map(|e| &e.handler)
    }

    /// The iq handler for a payload `{ns}name` in `scope`, unless its
    /// module is switched off in `off` (the addressed domain's).
    pub fn iq_handler(
        &self,
        scope: IqScope,
        name: &str,
        ns: &str,
        off: u64,
    ) -> Option<&Arc<dyn IqHandler>> {
        self.iq
            .get(ns)?
            .iter()
            .find(|e| e.scope == scope && e.name == name && e.bit & off == 0)
            .map(|e| &e.handler)
    }
}
