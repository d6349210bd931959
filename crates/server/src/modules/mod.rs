//! Built-in modules, one file per module. Each file's top comment lists the
//! specifications it implements, the hooks it handles, the storage it needs
//! and its configuration keys. A module that is not enabled registers
//! nothing and runs no code.

pub mod blocking;
pub mod carbons;
pub mod csi;
pub mod disco;
pub mod inbox;
pub mod last;
pub mod mam;
pub mod offline;
pub mod ping;
pub mod presence;
pub mod private;
pub mod register;
pub mod roster;
pub mod sm;
pub mod time;
pub mod vcard;
pub mod version;

use crate::config::Config;
use starling_core::hooks::{HookRegistry, Hooks};
use starling_core::storage::Storage;
use starling_core::{Metrics, Pressure};
use std::sync::Arc;

/// Registers every enabled module and freezes the hooks. Modules with
/// background writers (archive, inbox) start them here, so this runs inside
/// the Tokio runtime.
pub async fn build_hooks(
    cfg: &Config,
    storage: &Storage,
    metrics: &Metrics,
    pressure: &Arc<Pressure>,
) -> Hooks {
    let mut reg = HookRegistry::new();
    let m = &cfg.modules;
    // Subscriptions, probes and roster-based presence fan-out need the
    // roster module; without it presence covers own resources and directed
    // presence only.
    if m.presence.enabled {
        presence::Presence::register(m.roster.enabled, &mut reg);
    }
    if m.roster.enabled {
        roster::Roster::register(&m.roster, &mut reg);
    }
    if m.ping.enabled {
        ping::Ping::register(&m.ping, &mut reg);
    }
    if m.disco.enabled {
        disco::Disco::register(&m.disco, &mut reg);
    }
    register::Register::register(&m.register, cfg.auth.scram_iterations, &mut reg);
    if m.blocking.enabled {
        blocking::Blocking::register(&mut reg);
    }
    if m.vcard.enabled {
        vcard::Vcard::register(&m.vcard, &mut reg);
    }
    if m.private.enabled {
        private::Private::register(&m.private, &mut reg);
    }
    if m.last.enabled {
        last::Last::register(&mut reg);
    }
    if m.offline.enabled {
        offline::Offline::register(&m.offline, &mut reg);
    }
    if m.csi.enabled {
        csi::Csi::register(&m.csi, &mut reg);
    }
    if m.stream_management.enabled {
        sm::StreamManagement::register(&m.stream_management, &mut reg);
    }
    if m.carbons.enabled {
        carbons::Carbons::register(&mut reg);
    }
    if m.mam.enabled {
        mam::Mam::register(
            &m.mam,
            &cfg.server.domains,
            cfg.server.node_id,
            storage,
            metrics,
            pressure,
            &mut reg,
        )
        .await;
        if m.inbox.enabled {
            inbox::Inbox::register(
                &m.inbox,
                mam::queue_config(&m.mam),
                storage,
                metrics,
                pressure,
                &mut reg,
            );
        }
    }
    if m.version.enabled {
        version::Version::register(&m.version, &mut reg);
    }
    if m.time.enabled {
        time::Time::register(&mut reg);
    }
    reg.build()
}
