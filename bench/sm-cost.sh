#!/usr/bin/env bash
# What stream management (XEP-0198) costs per message, for one or two
# server builds, in paired runs: two servers run side by side (ports PORT
# and PORT+1, each pinned to core 0, the load generator to core 1) and the
# runs alternate A-off, A-sm, B-off, B-sm, ROUNDS times; each run is a
# fresh set of 1,000 logged-in users at 10,000 msg/s for STEP_SECS. The
# cost is the median over rounds of (server CPU with --sm) / (server CPU
# without), so a machine whose speed drifts during the sitting (shared
# hosts do) compares runs taken a few seconds apart.
#
# usage: STARLING_A=… [STARLING_B=…] [ROUNDS=8] [BENCH_ARGS="--sm-ack-every 0"]
#        [EXTRA_A=toml] [EXTRA_B=toml] bench/sm-cost.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$root/target}
A=${STARLING_A:-$target_dir/release/starling}
B=${STARLING_B:-$A}
BENCH=${BENCH_BIN:-$target_dir/release/starling-bench}
ROUNDS=${ROUNDS:-8} USERS=${USERS:-1000} RATE=${RATE:-10000} STEP_SECS=${STEP_SECS:-10}
PORT=${PORT:-16222} RUN_ROOT=${RUN_ROOT:-/tmp/starling-sm-cost}
log() { echo "[sm-cost $(date +%H:%M:%S)] $*" >&2; }
rm -rf "$RUN_ROOT"; mkdir -p "$RUN_ROOT/tmpl"
sed -e "s#@RUN@#$RUN_ROOT/tmpl#g" -e "s#@PORT@#$PORT#g" "$root/bench/peers/starling.toml" >"$RUN_ROOT/tmpl/starling.toml"
log "importing $USERS accounts"
"$BENCH" provision --method starling-import --starling-bin "$A" --starling-config "$RUN_ROOT/tmpl/starling.toml" \
    --iterations 4096 --users "$USERS" --password 'pw{n}' --out "$RUN_ROOT/users.txt" >"$RUN_ROOT/provision.log" 2>&1
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT
start() { # name bin port extra
    local run=$RUN_ROOT/$1
    mkdir -p "$run"; cp -r "$RUN_ROOT/tmpl/data" "$run/data"
    sed -e "s#@RUN@#$run#g" -e "s#@PORT@#$3#g" "$root/bench/peers/starling.toml" >"$run/starling.toml"
    printf '\n[admin]\nlisten = []\n%s\n' "$4" >>"$run/starling.toml"
    taskset -c 0 "$2" --config "$run/starling.toml" >"$run/server.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 300); do (echo >"/dev/tcp/127.0.0.1/$3") 2>/dev/null && break; sleep 0.1; done
}
start A "$A" "$PORT" "${EXTRA_A:-}"
start B "$B" "$((PORT + 1))" "${EXTRA_B:-}"
one() { # name pid port mode
    local run=$RUN_ROOT/$1 sm=()
    [[ $4 == sm ]] && sm=(--sm)
    rm -f "$run/o2o.json"
    # shellcheck disable=SC2086
    taskset -c 1 "$BENCH" o2o --port "$3" --users "$USERS" --password 'pw{n}' --rates "$RATE" \
        --step-secs "$STEP_SECS" --server-pid "$2" "${sm[@]}" ${BENCH_ARGS:-} --quiet \
        --json-file "$run/o2o.json" >"$run/o2o.txt" 2>&1
    python3 -c "
import json
s = json.loads(open('$run/o2o.json').readline())['o2o']['steps'][0]
print('$1', '$4', round(s['server_cpu_pct'], 1), s['delivered'], s['latency']['p99_ms'])" | tee -a "$RUN_ROOT/runs.txt"
}
for r in $(seq 1 "$ROUNDS"); do
    log "round $r of $ROUNDS"
    one A "${pids[0]}" "$PORT" off; one A "${pids[0]}" "$PORT" sm
    one B "${pids[1]}" "$((PORT + 1))" off; one B "${pids[1]}" "$((PORT + 1))" sm
done
python3 - "$RUN_ROOT/runs.txt" <<'PY'
import statistics, sys
pairs, last = {"A": [], "B": []}, {}
for line in open(sys.argv[1]):
    name, mode, cpu = line.split()[:3]
    if mode == "off":
        last[name] = float(cpu)
    elif name in last:
        pairs[name].append(float(cpu) / last.pop(name))
for name, r in pairs.items():
    if r:
        print(f"{name}: stream management costs {100 * (statistics.median(r) - 1):+.0f}% server CPU per message "
              f"(median of {len(r)} pairs; each: {' '.join(f'{x:.2f}' for x in r)})")
PY
