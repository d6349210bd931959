#!/usr/bin/env bash
# The sustained-load archive workload of issue 9, on one Starling build:
# USERS users online over STARTTLS, each sending chat messages to a random
# other user's *bare* JID, archive + inbox on (bench/peers/starling-archive.toml,
# SQLite), a ramp of RATES in STEP_SECS steps that does not stop at the
# first failed step (a server past its limit must hold its maximum).
# Prints starling-bench's table, the server's RSS before/after and the
# database size; the JSON result goes to $RUN_ROOT/o2o.json.
#
#   bench/archive-ramp.sh
#   STARLING_BIN=/tmp/old/starling RATES=10000,20000 bench/archive-ramp.sh
#   ROUNDS=3 bench/archive-ramp.sh    # the same ramp 3 times on a growing archive
#
# Environment (defaults in brackets):
#   USERS [2000]  RATES [5000,10000,12500,15000,20000,30000,40000]
#   STEP_SECS [10]  ROUNDS [1]  PORT [15522]
#   IDLE_SECS [0]: after each round, wait this long and print the RSS again
#   PREFILL [0]: start on an archive of this many messages between the same
#                users (bench/archive-prefill.sh), e.g. PREFILL=10000000
#   SEED_DB: start on a copy of this database instead (accounts user1..USERS
#            with passwords pw{n}, e.g. a prefilled one kept from an earlier
#            run): A/B runs on a 10 M archive without re-filling it each time
#   STARLING_BIN, BENCH_BIN [target/release/…]  RUN_ROOT [/tmp/starling-archive-ramp]
#   PEER_CONFIG    [bench/peers/starling-archive.toml]; bench/peers/starling.toml
#                  runs the same ramp with archive and inbox off (routing only)
#   TO_BARE        [1]; 0 addresses user@domain/resource instead
#   EXTRA_CONFIG   TOML appended to the configuration, e.g.
#                  $'[modules.mam]\nenabled = true\nbatch_size = 5000'
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$root/target}
STARLING_BIN=${STARLING_BIN:-$target_dir/release/starling}
BENCH_BIN=${BENCH_BIN:-$target_dir/release/starling-bench}
USERS=${USERS:-2000}
RATES=${RATES:-5000,10000,12500,15000,20000,30000,40000}
STEP_SECS=${STEP_SECS:-10}
ROUNDS=${ROUNDS:-1}
PORT=${PORT:-15522}
RUN_ROOT=${RUN_ROOT:-/tmp/starling-archive-ramp}

for b in "$STARLING_BIN" "$BENCH_BIN"; do
    [[ -x "$b" ]] || { echo "archive-ramp: missing $b; run: cargo build --release -p starling-server -p starling-bench" >&2; exit 1; }
done
rm -rf "$RUN_ROOT"
mkdir -p "$RUN_ROOT"
PEER_CONFIG=${PEER_CONFIG:-$root/bench/peers/starling-archive.toml}
sed -e "s#@RUN@#$RUN_ROOT#g" -e "s#@PORT@#$PORT#g" "$PEER_CONFIG" >"$RUN_ROOT/starling.toml"
if [[ -n "${EXTRA_CONFIG:-}" ]]; then
    # Later keys of a table must not repeat: drop the file's own
    # [modules.mam] table when EXTRA_CONFIG brings one.
    if grep -q '^\[modules.mam\]' <<<"$EXTRA_CONFIG"; then
        sed -i '/^\[modules.mam\]/,/^$/d' "$RUN_ROOT/starling.toml"
    fi
    printf '\n%s\n' "$EXTRA_CONFIG" >>"$RUN_ROOT/starling.toml"
fi
log() { echo "[archive-ramp $(date +%H:%M:%S)] $*" >&2; }

log "importing $USERS accounts"
"$BENCH_BIN" provision --method starling-import --starling-bin "$STARLING_BIN" \
    --starling-config "$RUN_ROOT/starling.toml" --iterations 4096 \
    --users "$USERS" --password 'pw{n}' --out "$RUN_ROOT/users.txt" >"$RUN_ROOT/provision.log" 2>&1
if [[ -n "${SEED_DB:-}" ]]; then
    log "copying $SEED_DB ($(du -sh "$SEED_DB" | cut -f1))"
    rm -f "$RUN_ROOT/data/starling.db-wal" "$RUN_ROOT/data/starling.db-shm"
    cp "$SEED_DB" "$RUN_ROOT/data/starling.db"
elif [[ "${PREFILL:-0}" != 0 ]]; then
    "$root/bench/archive-prefill.sh" "$RUN_ROOT/data/starling.db" "$USERS" "$PREFILL"
fi

"$STARLING_BIN" --config "$RUN_ROOT/starling.toml" >>"$RUN_ROOT/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
    (echo >"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    sleep 0.2
done
# RssAnon is the server's own memory; RssFile is mostly SQLite's mmap of
# the database (page cache the kernel can reclaim).
rss() { awk '/^(VmRSS|RssAnon|RssFile)/ {printf "%s %d MB ", $1, $2/1024}' "/proc/$pid/status"; }
log "server pid $pid, RSS $(rss)"
for round in $(seq 1 "$ROUNDS"); do
    log "round $round: o2o --to-bare, $USERS users, rates $RATES"
    to_bare=(--to-bare)
    [[ "${TO_BARE:-1}" == 0 ]] && to_bare=()
    "$BENCH_BIN" o2o --port "$PORT" --users "$USERS" --password 'pw{n}' "${to_bare[@]}" \
        --rates "$RATES" --step-secs "$STEP_SECS" --stop-after-fails 0 \
        --server-pid "$pid" --label "starling $(basename "$(dirname "$STARLING_BIN")")" \
        --json-file "$RUN_ROOT/o2o.json" || log "o2o run failed"
    log "after round $round: RSS $(rss); database $(du -sh "$RUN_ROOT/data" | cut -f1)"
    if [[ "${IDLE_SECS:-0}" != 0 ]]; then
        sleep "$IDLE_SECS"
        log "after $IDLE_SECS s idle: RSS $(rss)"
    fi
done
log "SIGTERM"
t0=$(date +%s.%N)
kill -TERM "$pid"
wait "$pid" || true
trap - EXIT
log "stopped in $(echo "$(date +%s.%N) - $t0" | bc) s; log lines with 'dropped' or 'closed pool': $(grep -cE 'dropped|closed pool' "$RUN_ROOT/server.log" || true)"
grep -E 'shutdown|drain|sessions still' "$RUN_ROOT/server.log" | tail -5 >&2 || true
