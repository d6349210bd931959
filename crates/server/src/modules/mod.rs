//! Built-in modules, one file per module. Each file's top comment lists the
//! specifications it implements, the hooks it handles, the storage it needs
//! and its configuration keys. A module that is not enabled registers
//! nothing and runs no code.

pub mod disco;
pub mod ping;
pub mod presence;
pub mod register;

use crate::config::Config;
use starling_core::hooks::{HookRegistry, Hooks};

/// Registers every enabled module and freezes the hooks.
pub fn build_hooks(cfg: &Config) -> Hooks {
    let mut reg = HookRegistry::new();
    let m = &cfg.modules;
    if m.presence.enabled {
        presence::Presence::register(&mut reg);
    }
    if m.ping.enabled {
        ping::Ping::register(&m.ping, &mut reg);
    }
    if m.disco.enabled {
        disco::Disco::register(&m.disco, &mut reg);
    }
    register::Register::register(&m.register, cfg.auth.scram_iterations, &mut reg);
    reg.build()
}
