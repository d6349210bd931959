#!/usr/bin/env bash
# Coverage-guided fuzzing of every parser that reads outside input (see
# fuzz/README.md). Stable Rust only: the targets are libfuzzer-sys binaries
# built with plain cargo and the sanitizer-coverage flags cargo-fuzz would
# pass with `-s none`, so neither nightly nor cargo-fuzz is needed.
#
#   fuzz/run.sh short              build every target, run each for
#                                  FUZZ_SHORT_SECONDS (default 10) — CI's step
#   fuzz/run.sh long [SECONDS]     run each target SECONDS (default 3600), one
#                                  after another, and print the totals
#   fuzz/run.sh build              build only
#   fuzz/run.sh run TARGET [SECONDS]   one target
#   fuzz/run.sh repro TARGET FILE  run one input (a crash under fuzz/artifacts/)
#   fuzz/run.sh list               the targets
#
# Seeds are fuzz/corpus/<target>/ (in the repository, hand-written); what a
# run learns goes to $FUZZ_WORK/corpus/<target>/ (default
# fuzz/target/work, not in the repository) and is reused by the next run.
# A crash is saved as fuzz/artifacts/<target>/crash-*, and the script
# fails naming the command that reproduces it.
#
# Environment: CARGO_TARGET_DIR (default fuzz/target: its own, so the main
# build's flags and cache are untouched), FUZZ_JOBS (cargo build jobs),
# FUZZ_SHORT_SECONDS, FUZZ_LONG_SECONDS.
set -euo pipefail
fuzz_dir=$(cd "$(dirname "$0")" && pwd)
cd "$fuzz_dir"

targets=(stream websocket bosh http upload sasl jid forms mam datetime config)
host=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$fuzz_dir/target}"
work="${FUZZ_WORK:-$CARGO_TARGET_DIR/work}"
bin_dir="$CARGO_TARGET_DIR/$host/release"
artifacts="$fuzz_dir/artifacts"

build() {
  # What `cargo fuzz build -s none` passes (cargo-fuzz 0.12), and the
  # explicit --target, so that build scripts and proc macros are built
  # without instrumentation. Debug assertions and overflow checks come
  # from fuzz/Cargo.toml's release profile.
  local flags=(
    -Cpasses=sancov-module
    -Cllvm-args=-sanitizer-coverage-level=4
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
    -Cllvm-args=-sanitizer-coverage-pc-table
    -Cllvm-args=-sanitizer-coverage-trace-compares
    -Cllvm-args=-sanitizer-coverage-stack-depth
    --cfg fuzzing
  )
  local start=$SECONDS
  RUSTFLAGS="${flags[*]}" CARGO_INCREMENTAL=0 cargo build --release --locked \
    --manifest-path "$fuzz_dir/Cargo.toml" --target "$host" --bins \
    ${FUZZ_JOBS:+--jobs "$FUZZ_JOBS"}
  echo "fuzz: built ${#targets[@]} targets in $((SECONDS - start)) s"
}

# run TARGET SECONDS: fuzz one target; its libFuzzer log goes to
# $work/log/TARGET.log. Returns non-zero when a crash was found.
run() {
  local t=$1 secs=$2
  mkdir -p "$work/corpus/$t" "$work/log" "$artifacts/$t"
  local log="$work/log/$t.log" status=0
  # -timeout: one input taking longer is a hang (a finding);
  # -rss_limit_mb: a parser that allocates without bound is a finding too.
  "$bin_dir/$t" "$work/corpus/$t" "$fuzz_dir/corpus/$t" \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
    -print_final_stats=1 -artifact_prefix="$artifacts/$t/" >"$log" 2>&1 || status=$?
  local runs execs_per_s corpus
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  execs_per_s=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  corpus=$(find "$work/corpus/$t" -type f | wc -l)
  printf 'fuzz: %-10s %6s s  %10s runs  %7s/s  corpus %5s  ' \
    "$t" "$secs" "${runs:-?}" "${execs_per_s:-?}" "$corpus"
  local found
  found=$(find "$artifacts/$t" -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) | sort)
  if [ "$status" -ne 0 ] || [ -n "$found" ]; then
    echo "FAILED (exit $status)"
    grep -m 5 -E 'panicked at|ERROR: libFuzzer|SUMMARY' "$log" | sed 's/^/    /' || true
    for f in $found; do
      echo "    reproduce: fuzz/run.sh repro $t ${f#"$fuzz_dir/"}"
    done
    echo "    log: $log"
    return 1
  fi
  echo ok
}

check_artifacts() {
  local left
  left=$(find "$artifacts" -type f 2>/dev/null | sort || true)
  if [ -n "$left" ]; then
    echo "fuzz: crashes saved under fuzz/artifacts/ (fix them, add a regression test, then delete them):" >&2
    for f in $left; do
      local rel=${f#"$artifacts/"}
      echo "    fuzz/run.sh repro ${rel%%/*} fuzz/artifacts/$rel" >&2
    done
    return 1
  fi
}

run_all() {
  local secs=$1 failed=0 start=$SECONDS
  for t in "${targets[@]}"; do
    run "$t" "$secs" || failed=1
  done
  echo "fuzz: ran ${#targets[@]} targets in $((SECONDS - start)) s"
  check_artifacts || failed=1
  return $failed
}

case "${1:-}" in
  short)
    check_artifacts
    build
    run_all "${FUZZ_SHORT_SECONDS:-10}"
    ;;
  long)
    check_artifacts
    build
    run_all "${2:-${FUZZ_LONG_SECONDS:-3600}}"
    ;;
  build) build ;;
  run)
    [ -n "${2:-}" ] || { echo "usage: $0 run TARGET [SECONDS]" >&2; exit 2; }
    build
    run "$2" "${3:-60}"
    ;;
  repro)
    [ -n "${2:-}" ] && [ -n "${3:-}" ] || { echo "usage: $0 repro TARGET FILE" >&2; exit 2; }
    build
    file=$3
    [ -e "$file" ] || file="$fuzz_dir/../$3"
    RUST_BACKTRACE=1 "$bin_dir/$2" "$file"
    ;;
  list) printf '%s\n' "${targets[@]}" ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
