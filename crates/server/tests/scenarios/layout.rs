//! The house rules that matter (ARCHITECTURE.md, "Who may import whom"),
//! checked over the source's `crate::` paths so that a change breaking
//! them fails here instead of in review:
//!
//! - no module imports another module: a feature's code under
//!   `src/modules/<name>` names `crate::modules::<other>` only for
//!   `common` (the shared home) — what two modules share lives there or
//!   behind a core trait;
//! - shared code does not reach back into a module: `src/modules/common`
//!   names no `crate::modules::<name>`.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module a file under `src/modules` belongs to (`None`: the
/// registry, `modules/mod.rs`).
fn owner(modules: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(modules).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
    if rel.components().count() == 1 {
        if first == "mod.rs" {
            return None;
        }
        return Some(first.trim_end_matches(".rs").to_owned());
    }
    Some(first)
}

/// `crate::modules::<name>` paths in `text` (and `super::<name>` when
/// `super` is `modules`: a file directly in `src/modules` or a module's
/// `mod.rs`), outside comments and the unit tests at the end of a file.
fn named_modules(text: &str, super_is_modules: bool) -> Vec<String> {
    let code = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = Vec::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or("");
        let prefixes: &[&str] = if super_is_modules {
            &["crate::modules::", "super::"]
        } else {
            &["crate::modules::"]
        };
        for prefix in prefixes {
            let mut rest = line;
            while let Some(i) = rest.find(prefix) {
                // `super::super::…` climbs above `modules`: not a module.
                let before = &rest[..i];
                rest = &rest[i + prefix.len()..];
                if *prefix == "super::" && (before.ends_with("::") || rest.starts_with("super")) {
                    continue;
                }
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        }
    }
    out
}

#[test]
fn no_module_imports_another_module() {
    let modules = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/modules");
    let mut files = Vec::new();
    rust_files(&modules, &mut files);
    assert!(files.len() > 20, "found only {} files", files.len());
    let mut broken = Vec::new();
    for f in &files {
        let Some(me) = owner(&modules, f) else {
            continue;
        };
        let text = std::fs::read_to_string(f).unwrap();
        let depth = f.strip_prefix(&modules).unwrap().components().count();
        let super_is_modules = depth == 1 || (depth == 2 && f.ends_with("mod.rs"));
        for other in named_modules(&text, super_is_modules) {
            let allowed = other == me || (other == "common" && me != "common");
            if !allowed {
                broken.push(format!(
                    "{} names crate::modules::{other}",
                    f.strip_prefix(&modules).unwrap().display()
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "a module imports another module (move what they share to modules/common/ or behind a core trait):\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_rule_sees_an_import() {
    assert_eq!(
        named_modules(
            "use crate::modules::pep::avatar; // crate::modules::x\n",
            false
        ),
        ["pep"]
    );
    assert!(named_modules("#[cfg(test)]\nuse crate::modules::pep;", false).is_empty());
    assert_eq!(named_modules("use super::pep::avatar;", true), ["pep"]);
    assert!(named_modules("use super::pep::avatar;", false).is_empty());
}

/// The `crate::<top>` paths of `text` (the first segment after `crate::`),
/// outside comments and the unit tests at the end of the file.
fn crate_paths(text: &str) -> Vec<String> {
    let code = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = Vec::new();
    for line in code.lines() {
        let mut rest = line.split("//").next().unwrap_or("");
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.push(name);
        }
    }
    out
}

/// Files above every layer: the node, the listeners, the binary and its
/// commands, the crate root, and the fuzzing harness (which reaches the
/// parsers wherever they are).
fn above(rel: &str) -> bool {
    rel.starts_with("listen/")
        || rel.starts_with("cli/")
        || ["server.rs", "main.rs", "lib.rs", "fuzzing.rs"].contains(&rel)
}

/// The layers (ARCHITECTURE.md, "The layers of the server crate"): the
/// transports turn bytes into XML events and back and call no session,
/// listener, module, admin code or configuration; the listeners and the
/// node (`listen/`, `server.rs`) are above everything else, so nothing
/// below imports them — except the two functions of `listen/mod.rs`
/// (bind, accept loop) that listening modules use; `config.rs` names the
/// modules' registry only (each module parses its own table).
#[test]
fn the_layers_import_downwards_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut broken = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(f).unwrap();
        let forbidden: &[&str] = if rel.starts_with("transport/") {
            &[
                "c2s", "listen", "modules", "admin", "config", "server", "cluster", "cli",
            ]
        } else if above(&rel) {
            &[]
        } else {
            &["server", "cli"]
        };
        for top in crate_paths(&text) {
            if forbidden.contains(&top.as_str()) {
                broken.push(format!("{rel} names crate::{top}"));
            }
            if top == "listen" && !above(&rel) {
                // Only `crate::listen::{bind, accept_loop, Accepted}`.
                let ok = text
                    .lines()
                    .filter(|l| l.contains("crate::listen"))
                    .all(|l| {
                        !l.contains("crate::listen::c2s")
                            && !l.contains("crate::listen::http")
                            && !l.contains("crate::listen::admin")
                    });
                if !ok {
                    broken.push(format!("{rel} names a listener of crate::listen"));
                }
            }
        }
        if rel == "config.rs" {
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            for line in code.lines().filter(|l| l.contains("crate::modules::")) {
                if !line.contains("crate::modules::ModulesSection") {
                    broken.push(format!("config.rs names a module: {}", line.trim()));
                }
            }
        }
    }
    broken.sort();
    broken.dedup();
    assert!(
        broken.is_empty(),
        "an import against the layers (ARCHITECTURE.md):\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_layer_rule_sees_an_import() {
    assert_eq!(
        crate_paths("use crate::c2s::{session, C2sShared}; // crate::x\n"),
        ["c2s"]
    );
    assert!(crate_paths("#[cfg(test)]\nuse crate::c2s;").is_empty());
}
