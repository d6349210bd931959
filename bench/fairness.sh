#!/usr/bin/env bash
# Fairness under overload (issue 33): HEAVY users flood each other at
# HEAVY_RATE msg/s in total, far past what the archive keeps up with,
# while NORMAL users chat at NORMAL_RATE msg/s in total, all on one
# Starling with archive + inbox on (bench/peers/starling-archive.toml,
# SQLite), every message to a random partner's bare JID over STARTTLS.
# Two starling-bench processes at the same time; the normal group's
# delivery ratio and latency percentiles are the result: a fair server
# slows the flooders, not the people beside them.
#
#   bench/fairness.sh
#   STARLING_BIN=/tmp/old/starling bench/fairness.sh
#
# Environment (defaults in brackets):
#   NORMAL [100]  NORMAL_RATE [100]  HEAVY [10]  HEAVY_RATE [40000]
#   SECS [30]  PORT [15523]
#   STARLING_BIN, BENCH_BIN [target/release/…]  RUN_ROOT [/tmp/starling-fairness]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$root/target}
STARLING_BIN=${STARLING_BIN:-$target_dir/release/starling}
BENCH_BIN=${BENCH_BIN:-$target_dir/release/starling-bench}
NORMAL=${NORMAL:-100}
NORMAL_RATE=${NORMAL_RATE:-100}
HEAVY=${HEAVY:-10}
HEAVY_RATE=${HEAVY_RATE:-40000}
SECS=${SECS:-30}
PORT=${PORT:-15523}
RUN_ROOT=${RUN_ROOT:-/tmp/starling-fairness}
for b in "$STARLING_BIN" "$BENCH_BIN"; do
    [[ -x "$b" ]] || { echo "fairness: missing $b; run: cargo build --release -p starling-server -p starling-bench" >&2; exit 1; }
done
rm -rf "$RUN_ROOT"
mkdir -p "$RUN_ROOT"
sed -e "s#@RUN@#$RUN_ROOT#g" -e "s#@PORT@#$PORT#g" "$root/bench/peers/starling-archive.toml" >"$RUN_ROOT/starling.toml"
log() { echo "[fairness $(date +%H:%M:%S)] $*" >&2; }
users=$((NORMAL + HEAVY))
log "importing $users accounts"
"$BENCH_BIN" provision --method starling-import --starling-bin "$STARLING_BIN" \
    --starling-config "$RUN_ROOT/starling.toml" --iterations 4096 \
    --users "$users" --password 'pw{n}' --out "$RUN_ROOT/users.txt" >"$RUN_ROOT/provision.log" 2>&1
"$STARLING_BIN" --config "$RUN_ROOT/starling.toml" >>"$RUN_ROOT/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
    (echo >"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    sleep 0.2
done
log "server pid $pid; $HEAVY heavy users offering $HEAVY_RATE msg/s beside $NORMAL normal users at $NORMAL_RATE msg/s, $SECS s"
common=(o2o --port "$PORT" --password 'pw{n}' --to-bare --step-secs "$SECS" --stop-after-fails 0)
"$BENCH_BIN" "${common[@]}" --users "$HEAVY" --first-user $((NORMAL + 1)) --rates "$HEAVY_RATE" \
    --label heavy --json-file "$RUN_ROOT/heavy.json" >"$RUN_ROOT/heavy.log" 2>&1 &
heavy=$!
# The flood first, then the normal users log in beside it.
sleep 3
"$BENCH_BIN" "${common[@]}" --users "$NORMAL" --first-user 1 --rates "$NORMAL_RATE" \
    --server-pid "$pid" --label normal --json-file "$RUN_ROOT/normal.json" >"$RUN_ROOT/normal.log" 2>&1 || log "normal run failed"
wait "$heavy" || log "heavy run failed"
echo "--- heavy users ($HEAVY, offering $HEAVY_RATE msg/s)"
grep -A3 "target/s" "$RUN_ROOT/heavy.log" || cat "$RUN_ROOT/heavy.log"
echo "--- normal users ($NORMAL, offering $NORMAL_RATE msg/s)"
grep -A3 "target/s" "$RUN_ROOT/normal.log" || cat "$RUN_ROOT/normal.log"
log "pressure episodes in the log: $(grep -c 'pressure' "$RUN_ROOT/server.log" || true)"
