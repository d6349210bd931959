//! Unit tests of the hooks: chain order, provided registries, duplicate
//! registrations, modules switched off.

use super::*;
use crate::storage::DomainSettings;
use crate::Env;
use async_trait::async_trait;
use starling_proto::Stanza;

struct Order(&'static str, Flow);
#[async_trait]
impl OfflineMessageHandler for Order {
    async fn offline_message(
        &self,
        _env: &Env,
        _s: &Stanza,
        _c: &mut OfflineCompanions,
    ) -> HookResult {
        if self.0 == "fail" {
            return Err("boom".into());
        }
        Ok(self.1)
    }
}

#[test]
fn chain_orders_by_priority_then_registration() {
    let mut reg = HookRegistry::new();
    reg.offline_message("b", 50, Arc::new(Order("b", Flow::Continue)));
    reg.offline_message("a", 10, Arc::new(Order("a", Flow::Continue)));
    reg.offline_message("c", 50, Arc::new(Order("c", Flow::Continue)));
    let hooks = reg.build();
    let names: Vec<_> = hooks.offline_message.iter().map(|(m, _)| m).collect();
    assert_eq!(names, ["a", "b", "c"]);
}

#[test]
fn provided_registries_are_lent_to_modules_and_taken_back() {
    struct Routes(Vec<&'static str>);
    let mut reg = HookRegistry::new();
    assert!(reg.provided::<Routes>().is_none(), "nothing provided yet");
    reg.provide(Routes(Vec::new()));
    reg.provided::<Routes>().unwrap().0.push("/upload");
    assert_eq!(reg.take_provided::<Routes>().unwrap().0, ["/upload"]);
    assert!(reg.provided::<Routes>().is_none());
}

#[test]
#[should_panic(expected = "both claim the service address")]
fn two_services_on_one_address_panic() {
    struct S;
    #[async_trait]
    impl Service for S {
        async fn handle(&self, _: &Env, _: Stanza) {}
    }
    let mut reg = HookRegistry::new();
    reg.service("a", ServiceAddress::Subdomain("muc"), "", Arc::new(S));
    reg.service("b", ServiceAddress::Subdomain("muc"), "", Arc::new(S));
}

#[test]
#[should_panic(expected = "both handle")]
fn iq_registry_duplicate_namespace_panics() {
    struct H;
    #[async_trait]
    impl IqHandler for H {
        async fn handle_iq(&self, _: &Env, _: IqScope, _: &Stanza) -> IqResponse {
            IqResponse::Handled
        }
    }
    let mut reg = HookRegistry::new();
    reg.iq("m1", IqScope::Server, "ping", "urn:xmpp:ping", Arc::new(H));
    reg.iq("m2", IqScope::Server, "ping", "urn:xmpp:ping", Arc::new(H));
}

#[test]
fn switched_off_modules_are_skipped_in_chains_services_and_lookups() {
    struct S;
    #[async_trait]
    impl Service for S {
        async fn handle(&self, _: &Env, _: Stanza) {}
    }
    let mut reg = HookRegistry::new();
    reg.offline_message("t_first", 10, Arc::new(Order("a", Flow::Continue)));
    reg.offline_message("t_second", 20, Arc::new(Order("b", Flow::Continue)));
    reg.service(
        "t_rooms",
        ServiceAddress::Subdomain("rooms"),
        "",
        Arc::new(S),
    );
    let hooks = reg.build();
    let off = crate::module::modules_mask(["t_first", "t_rooms"]);
    let names: Vec<_> = hooks.offline_message.iter_on(off).map(|(m, _)| m).collect();
    assert_eq!(names, ["t_second"]);
    assert_eq!(hooks.offline_message.iter_on(0).count(), 2);
    // The subdomain service exists under a served domain unless its
    // module is off there.
    let hosts = crate::Hosts::new(["a.example".to_owned()]);
    hosts.set(
        "b.example",
        DomainSettings {
            disabled_modules: Some(vec!["t_rooms".into()]),
            ..Default::default()
        },
    );
    let find = |d| hooks.service_for(d, |p| hosts.modules_off(p)).is_some();
    assert!(find("rooms.a.example"));
    assert!(!find("rooms.b.example"));
    assert!(!find("rooms.c.example"));
    assert_eq!(hooks.services_of("b.example", off).len(), 0);
    // A session's handle sees a settings change at once.
    let live = hosts.get("b.example").unwrap().modules_off_handle();
    hosts.set("b.example", DomainSettings::default());
    assert_eq!(live.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert!(find("rooms.b.example"));
}
