#!/usr/bin/env bash
# Everything CI runs, in one command: formatting, lints, the Rust test suite
# (unit, conformance, scenario tests over real sockets); then, at the same
# time (independent suites, each with its own log, printed when it ends): a
# short fuzzing run of every parser of outside input (fuzz/run.sh short),
# the storage conformance suite and the storage-touching scenario tests
# again on PostgreSQL, the third-party client interop suites (slixmpp,
# @xmpp/client) against a real Starling, the web chat (Converse.js) in
# Debian's headless chromium, the load generator's smoke run, and the
# packaging checks (the container image built with podman and run in a
# chroot, the systemd unit, compose and Helm files; packaging/check.sh);
# last and alone, the abuse suite (tests/abuse: issue 31's attacks on a real
# Starling process, with measured bounds). Needs Rust, Python 3, Node.js,
# the PostgreSQL server binaries, nats-server and podman;
# Python and Node packages are installed on first use (tests/interop/run.sh,
# packaging/check.sh).
#
# PostgreSQL: a throw-away cluster from scripts/pg-test.sh (started here and
# stopped on exit, unless it was already running), or the server of an
# administrator URL given in STARLING_TEST_PG_URL.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> [%4ds] %s\n' "$SECONDS" "$*"; }

target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
logs="$target_dir/test-logs"
rm -rf "$logs"
mkdir -p "$logs"

step "cargo fmt --check"
cargo fmt --all -- --check

# The fuzz targets build in their own target directory (fuzz/target, its
# own flags), so they compile beside clippy and the test build below; the
# tests do not start until this build is done, so that no test shares the
# CPU with a compiler (on a fresh machine this build is the longest).
step "fuzz targets: building in the background (fuzz/run.sh build, log $logs/fuzz-build.log)"
fuzz/run.sh build >"$logs/fuzz-build.log" 2>&1 &
fuzz_build=$!

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

if [ -z "${STARLING_TEST_PG_URL:-}" ]; then
  step "PostgreSQL test cluster (scripts/pg-test.sh)"
  if ! scripts/pg-test.sh status 2>/dev/null; then
    trap 'scripts/pg-test.sh stop' EXIT
  fi
  STARLING_TEST_PG_URL=$(scripts/pg-test.sh start | tail -n 1)
fi
# PostgreSQL tests fail instead of skipping when the server is missing, and
# so do the cluster tests when nats-server is missing.
export STARLING_TEST_PG_URL STARLING_REQUIRE_PG=1 STARLING_REQUIRE_CLUSTER=1
# Six tests at a time, whatever the number of cores: a scenario test spends
# most of its time waiting on sockets and its server's timers, not on CPU
# (428 scenario tests: 101 s with 2 threads, 54 s with 6, on 2 cores;
# 89 s of CPU either way). A caller's own setting wins.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-6}"

step "cargo test: build"
cargo test --workspace --no-run

step "waiting for the fuzz targets' build"
if ! wait "$fuzz_build"; then
  cat "$logs/fuzz-build.log"
  echo "test-all: the fuzz targets did not build" >&2
  exit 1
fi
tail -n 1 "$logs/fuzz-build.log"

step "cargo test (workspace; scenario tests on SQLite)"
cargo test --workspace

# The binaries below (starling, starling-bench) are the ones the test build
# made for the integration tests (CARGO_BIN_EXE_*): building them with
# `cargo build` would resolve features without the dev-dependencies and
# compile the server a second time.
for bin in starling starling-bench; do
  [ -x "$target_dir/debug/$bin" ] || { echo "missing $target_dir/debug/$bin after cargo test" >&2; exit 1; }
done
export STARLING_BIN="$target_dir/debug/starling" BENCH_BIN="$target_dir/debug/starling-bench"

# The suites below are independent of each other (each starts its own
# Starling on free loopback ports — no default port, not even the admin
# listener's — with its own data directory, virtual environment and
# node_modules), so they run at the same time: most of
# their time is spent waiting on sockets, a browser or a container build,
# and the one that needs CPU (fuzzing) fills the gaps. Each writes to a
# log of its own, printed whole when it ends; the step fails if one fails,
# after all have ended.
names=()
pids=()
suite() {
  local name=$1
  shift
  (
    t0=$SECONDS
    rc=0
    "$@" || rc=$?
    echo "$((SECONDS - t0))" >"$logs/$name.secs"
    exit $rc
  ) >"$logs/$name.log" 2>&1 &
  names+=("$name")
  pids+=($!)
  printf '    started %s (%s)\n' "$name" "$logs/$name.log"
}

# Every parser of outside input under coverage-guided fuzzing for a few
# seconds each (fuzz/README.md): stable Rust and a C++ compiler (for
# libFuzzer) only; its own target directory (fuzz/target), built without
# debug info (above). A crash fails the step and names the command to
# reproduce it.
fuzz_short() { fuzz/run.sh short; }

# Every cargo command below selects the whole workspace, so that all of
# them resolve the same features and reuse the test build above: selecting
# one package (-p) resolves the dependencies' features differently and
# rebuilds every test binary a second time, which doubled the target
# directory and once ran a CI machine out of disk. The scenario modules
# that touch storage are filters on the test paths of the one scenario
# binary (crates/server/tests/scenarios/main.rs).
postgres_suites() {
  cargo test --workspace --test conformance_postgres &&
    STARLING_TEST_BACKEND=postgres cargo test --workspace --test scenarios -- \
      offline:: roster:: blocking:: profile:: register:: carbons:: presence:: \
      cli:: mam:: inbox:: shutdown:: muc:: muc_light:: pubsub:: stores::
}

step "in parallel: fuzzing, PostgreSQL, interop (slixmpp, @xmpp/client), browser (Converse.js in headless chromium), load generator smoke run, packaging (image build and checks)"
suite fuzz fuzz_short
suite postgres postgres_suites
suite interop tests/interop/run-starling.sh
suite browser tests/browser/run.sh
suite smoke bench/smoke.sh
suite packaging packaging/check.sh
failed=()
for i in "${!pids[@]}"; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  printf '\n==> [%4ds] %s: %s in %ss (log %s)\n' "$SECONDS" "${names[$i]}" \
    "$([ $rc -eq 0 ] && echo passed || echo "FAILED ($rc)")" \
    "$(cat "$logs/${names[$i]}.secs" 2>/dev/null || echo '?')" "$logs/${names[$i]}.log"
  cat "$logs/${names[$i]}.log"
  [ $rc -eq 0 ] || failed+=("${names[$i]}")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "test-all: failed: ${failed[*]} (logs in $logs)" >&2
  exit 1
fi

# The abuse suite (tests/abuse/README.md, docs/security.md): a real
# Starling attacked as in issue 31, with its memory, descriptors, log
# growth and a witness client checked during each attack; about 2
# minutes. Alone, last: its bounds (RSS while a flood is queued, the
# witness's round trip) are measured, and a busy machine would move them.
step "abuse suite: attacks on a real Starling (tests/abuse)"
tests/abuse/run.sh

step "all test suites passed"
