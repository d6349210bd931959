//! The load generator's command line, run as a user would run it.
//!
//! Also, being an integration test, this makes `cargo test --workspace`
//! build the `starling-bench` binary with the test build's features, which
//! `scripts/test-all.sh` then runs (bench/smoke.sh) without a second build.

use std::process::Command;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_starling-bench"))
}

#[test]
fn help_lists_every_scenario() {
    let out = bench().arg("--help").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    for scenario in [
        "connect",
        "idle",
        "o2o",
        "muc",
        "muc-light",
        "archive",
        "resume",
        "pep",
        "upload",
        "provision",
    ] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(&format!("{scenario} "))),
            "no `{scenario}` in --help:\n{text}"
        );
    }
}

#[test]
fn an_unknown_scenario_fails_and_points_to_help() {
    let out = bench().arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("frobnicate") && err.contains("--help"),
        "{err}"
    );
}
