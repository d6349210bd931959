//! Fuzz the configuration file (crates/server/src/config.rs `Config::parse`: TOML, then
//! the typed configuration with every module's section, then validation). An operator's
//! mistake must be a `ConfigError` naming the key, never a panic. Beyond "no panic": a
//! configuration that passes validation passes it again (validation has no side effects),
//! and every error message is non-empty.
#![no_main]

use libfuzzer_sys::fuzz_target;
use starling_server::Config;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/nonexistent/fuzz/starling.toml");
    match Config::parse(text, path) {
        Ok(cfg) => {
            cfg.validate(path)
                .expect("a valid configuration stays valid");
            let _ = cfg.admin.exposed();
            let _ = cfg.storage_description();
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
