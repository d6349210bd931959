#!/usr/bin/env bash
# One-to-one chat on 1 node against 2 nodes of a cluster (issue 11), on
# this machine: a throw-away PostgreSQL (scripts/pg-test.sh) and a
# nats-server on loopback, NODES Starling nodes (release build) with the
# routing-only configuration of bench/peers/starling.toml, USERS users
# spread over the nodes by index (user n on node n mod NODES), each sending
# to random partners' full JIDs: with 2 nodes half of the messages cross
# nodes. Prints starling-bench's table (its CPU column is node 1's) and the
# CPU of every node over the whole run, per delivered message.
#
#   NODES=1 bench/cluster-o2o.sh
#   NODES=2 bench/cluster-o2o.sh
#   IDLE=1 NODES=2 USERS=15000 bench/cluster-o2o.sh   # idle sessions instead:
#       all on node 1 (starling-bench idle: node 1's memory per session),
#       and what their registry entries cost node 2
#
# Environment (defaults in brackets): NODES [2]  USERS [1000]
#   RATES [5000,10000]  STEP_SECS [20]  PORT [16522] (node k: PORT+k-1)
#   NATS_PORT [16422]  STARLING_BIN, BENCH_BIN [target/release/…]
#   RUN_ROOT [/tmp/starling-cluster-o2o]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
NODES=${NODES:-2}
USERS=${USERS:-1000}
RATES=${RATES:-5000,10000}
STEP_SECS=${STEP_SECS:-20}
PORT=${PORT:-16522}
NATS_PORT=${NATS_PORT:-16422}
STARLING_BIN=${STARLING_BIN:-$target_dir/release/starling}
BENCH_BIN=${BENCH_BIN:-$target_dir/release/starling-bench}
RUN_ROOT=${RUN_ROOT:-/tmp/starling-cluster-o2o}
for b in "$STARLING_BIN" "$BENCH_BIN"; do
    [[ -x "$b" ]] || { echo "cluster-o2o: missing $b; run: cargo build --release -p starling-server -p starling-bench" >&2; exit 1; }
done
nats=$(command -v nats-server || echo /usr/sbin/nats-server)
[[ -x "$nats" ]] || { echo "cluster-o2o: nats-server not found (apt-get install nats-server)" >&2; exit 1; }
log() { echo "[cluster-o2o $(date +%H:%M:%S)] $*" >&2; }

rm -rf "$RUN_ROOT"
mkdir -p "$RUN_ROOT"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

admin=$("$root/scripts/pg-test.sh" start | tail -n 1)
db="starling_cluster_bench_$$"
psql "$admin" -qc "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
url="${admin%/*}/$db"
"$nats" -a 127.0.0.1 -p "$NATS_PORT" -m $((NATS_PORT + 1)) >"$RUN_ROOT/nats.log" 2>&1 &
pids+=($!)

config() { # node port
    sed -e "s#@RUN@#$RUN_ROOT/node$1#g" -e "s#@PORT@#$2#g" "$root/bench/peers/starling.toml"
    printf '\n[storage]\nbackend = "postgres"\nurl = "%s"\npool_size = 8\n' "$url"
    # The nodes share one host: no admin listener (its default port would
    # be taken by the first node).
    printf '\n[admin]\nlisten = []\n'
    if [[ "$NODES" -gt 1 ]]; then
        printf '\n[cluster]\nnats_url = "nats://127.0.0.1:%s"\nname = "bench"\n' "$NATS_PORT"
    fi
}
for k in $(seq 1 "$NODES"); do
    mkdir -p "$RUN_ROOT/node$k"
    config "$k" $((PORT + k - 1)) | sed -e "s/^\[server\]$/[server]\nnode_id = $k/" >"$RUN_ROOT/node$k/starling.toml"
done

log "importing $USERS accounts into PostgreSQL"
"$BENCH_BIN" provision --method starling-import --starling-bin "$STARLING_BIN" \
    --starling-config "$RUN_ROOT/node1/starling.toml" --iterations 4096 \
    --users "$USERS" --password 'pw{n}' --out "$RUN_ROOT/users.txt" >"$RUN_ROOT/provision.log" 2>&1

node_pids=()
extra=()
for k in $(seq 1 "$NODES"); do
    "$STARLING_BIN" --config "$RUN_ROOT/node$k/starling.toml" >"$RUN_ROOT/node$k/server.log" 2>&1 &
    pids+=($!)
    node_pids+=($!)
    p=$((PORT + k - 1))
    for _ in $(seq 1 300); do
        (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null && break
        sleep 0.2
    done
    [[ $k -gt 1 ]] && extra+=("$p")
done
sleep 1
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
before=()
for p in "${node_pids[@]}"; do before+=("$(cpu "$p")"); done
if [[ "${IDLE:-0}" == 1 ]]; then
    rss() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
    other_before=""
    [[ "$NODES" -gt 1 ]] && other_before=$(rss "${node_pids[1]}")
    "$BENCH_BIN" idle --port "$PORT" --users "$USERS" --password 'pw{n}' --settle-secs 10 \
        --concurrency 100 --server-pid "${node_pids[0]}" --hold-secs 5 --quiet &
    b=$!
    sleep 2
    while kill -0 "$b" 2>/dev/null; do
        [[ "$NODES" -gt 1 ]] && other_after=$(rss "${node_pids[1]}")
        sleep 1
    done
    wait "$b" || true
    if [[ "$NODES" -gt 1 ]]; then
        log "node 2 (no sessions of its own): VmRSS $other_before -> $other_after KiB: $(echo "scale=2; ($other_after - $other_before) / $USERS" | bc) KiB per registry entry of node 1's sessions"
    fi
    exit 0
fi
extra_arg=()
if [[ ${#extra[@]} -gt 0 ]]; then
    extra_arg=(--extra-ports "$(IFS=,; echo "${extra[*]}")")
fi
log "o2o: $NODES node(s), $USERS users, rates $RATES, ${STEP_SECS}s steps"
"$BENCH_BIN" o2o --port "$PORT" "${extra_arg[@]}" --users "$USERS" --password 'pw{n}' \
    --rates "$RATES" --step-secs "$STEP_SECS" --stop-after-fails 0 \
    --server-pid "${node_pids[0]}" --label "starling, $NODES node(s)" \
    --json-file "$RUN_ROOT/o2o.json"
total=0
for i in "${!node_pids[@]}"; do
    t=$(( $(cpu "${node_pids[$i]}") - ${before[$i]} ))
    total=$((total + t))
    log "node $((i + 1)): CPU $(echo "scale=1; $t / 100" | bc) s over the run"
done
delivered=$(python3 -c "import json,sys; d=json.load(open('$RUN_ROOT/o2o.json')); print(sum(s['delivered'] for s in d['o2o']['steps']))" 2>/dev/null || echo 0)
if [[ "$delivered" -gt 0 ]]; then
    log "all nodes: CPU $(echo "scale=1; $total / 100" | bc) s for $delivered delivered messages = $(echo "scale=1; $total * 10000 / $delivered" | bc) µs per message (connect phase included)"
fi
if [[ "$NODES" -gt 1 ]]; then
    "$STARLING_BIN" --config "$RUN_ROOT/node1/starling.toml" cluster status >&2 || true
    # The NATS server's own counters (monitoring port): bus traffic.
    python3 - "$((NATS_PORT + 1))" "$delivered" <<'PY' >&2 || true
import json, sys, urllib.request
v = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/varz"))
d = max(int(sys.argv[2]), 1)
print(f"[cluster-o2o] bus: {v['in_msgs']} NATS messages in, {v['in_bytes']} bytes in "
      f"({v['in_bytes'] / d:.0f} bytes and {v['in_msgs'] / d:.2f} NATS messages per delivered message, "
      f"heartbeats and registry included); nats-server CPU {v.get('cpu', 0)}%")
PY
fi
cleanup
trap - EXIT
psql "$admin" -qc "DROP DATABASE IF EXISTS $db" >/dev/null || true
