#!/usr/bin/env bash
# Everything CI runs, in one command: formatting, lints, the Rust test suite
# (unit, conformance, scenario tests over real sockets), the third-party
# client interop suites (slixmpp, @xmpp/client) against a real Starling, and
# the load generator's smoke run. Needs Rust, Python 3 and Node.js; Python and
# Node packages are installed on first use (tests/interop/run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo test (workspace)"
cargo test --workspace

target_dir="${CARGO_TARGET_DIR:-$PWD/target}"

step "interop: slixmpp and @xmpp/client against Starling"
cargo build -q -p starling-server
STARLING_BIN="$target_dir/debug/starling" tests/interop/run-starling.sh

step "load generator smoke run (starling-bench against a short-lived Starling)"
cargo build -q -p starling-server -p starling-bench
STARLING_BIN="$target_dir/debug/starling" BENCH_BIN="$target_dir/debug/starling-bench" bench/smoke.sh

step "all test suites passed"
