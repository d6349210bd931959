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
