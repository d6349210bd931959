#!/usr/bin/env bash
# Logins across many domains against one domain, and /metrics at that
# scale (issue 14), on this machine: one Starling (release build, SQLite,
# bench/peers/starling.toml plus an admin listener) serving DOMAINS stored
# domains d1.example … d<DOMAINS>.example and one.example.
#
# Setup (skipped with SKIP_SETUP=1 when RUN_ROOT holds an earlier one):
#   - `starling domain add one.example` (creates the database and that
#     domain's self-signed certificate as the CLI does);
#   - the DOMAINS other rows inserted in one SQLite transaction, exactly
#     what DomainStore::add_domain writes (state 'enabled', settings
#     '{"v":1}', created_at in ms, the change counter bumped once and
#     stamped on every row): 0.1 s instead of ~18 ms per `domain add`;
#   - accounts user<n>@d<((n-1) mod DOMAINS)+1>.example and
#     user<n>@one.example, password pw<n> (starling-bench provision
#     --method starling-import --force: `starling user import` accepts only
#     [server] domains without --force);
#   - a certificate warm-up: the rows above have no certificate yet, so
#     one login per domain makes the server write each one at its first
#     handshake (as for a domain added on another node); reported as
#     `certgen`. Afterwards every domain has its certificate on disk, as
#     after `starling domain add`.
#
# Measured, a fresh server process for each run, the two sides alternated
# (A B B A …), the load average before each run recorded:
#   - `main`: USERS logins (STARTTLS, SCRAM-SHA-1, bind, presence;
#     starling-bench idle) spread over the DOMAINS domains (`spread`) or all
#     on one.example (`one`); sessions/s, server CPU per login, setup
#     latency, memory per session; then, with the USERS sessions online,
#     SCRAPES scrapes of /metrics (time, body size, server CPU per scrape,
#     and `starling_c2s_sessions_by_domain` series);
#   - `pair`: the first login of each domain against later ones: on a fresh
#     server, DOMAINS logins (spread: one per domain, each loading its
#     certificate at its first handshake), then DOMAINS more on the same
#     server (spread: each domain's second login, certificate cached); the
#     same two storms on one.example as the control.
# Prints one line per run and writes results/summary.tsv under RUN_ROOT.
#
#   bench/domains.sh
#   SKIP_SETUP=1 ROUNDS=3 bench/domains.sh
#
# Environment (defaults in brackets): DOMAINS [10000]  USERS [18000]
#   ROUNDS [2]  PAIRS [1: run the pairs]  SCRAPES [10]  PORT [15222]
#   ADMIN_PORT [15290]  CONCURRENCY [100]  STARLING_BIN, BENCH_BIN
#   [target/release/…]  RUN_ROOT [/tmp/starling-domains]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
DOMAINS=${DOMAINS:-10000}
USERS=${USERS:-18000}
ROUNDS=${ROUNDS:-2}
PAIRS=${PAIRS:-1}
SCRAPES=${SCRAPES:-10}
PORT=${PORT:-15222}
ADMIN_PORT=${ADMIN_PORT:-15290}
CONCURRENCY=${CONCURRENCY:-100}
STARLING_BIN=${STARLING_BIN:-$target_dir/release/starling}
BENCH_BIN=${BENCH_BIN:-$target_dir/release/starling-bench}
RUN_ROOT=${RUN_ROOT:-/tmp/starling-domains}
for b in "$STARLING_BIN" "$BENCH_BIN"; do
    [[ -x "$b" ]] || { echo "domains: missing $b; run: cargo build --release -p starling-server -p starling-bench" >&2; exit 1; }
done
command -v sqlite3 >/dev/null || { echo "domains: needs the sqlite3 command (apt-get install sqlite3)" >&2; exit 1; }
log() { echo "[domains $(date -u +%H:%M:%S)] $*" >&2; }

cfg="$RUN_ROOT/starling.toml"
res="$RUN_ROOT/results"
accounts=$(( USERS > 2 * DOMAINS ? USERS : 2 * DOMAINS ))
common=(--port "$PORT" --tls starttls --mechanism SCRAM-SHA-1 --password 'pw{n}'
    --concurrency "$CONCURRENCY" --quiet)
spread=(--domains "$DOMAINS" --domain-pattern 'd{n}.example')
one=(--domain one.example)

pid=
stop_server() {
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    pid=
}
trap stop_server EXIT
start_server() { # log file; ready when /health/ready says so (the log is at warn level)
    "$STARLING_BIN" --config "$cfg" run >"$1" 2>&1 &
    pid=$!
    local deadline=$((SECONDS + 120))
    until curl -sf -o /dev/null "http://127.0.0.1:$ADMIN_PORT/health/ready"; do
        kill -0 "$pid" 2>/dev/null && (( SECONDS < deadline )) \
            || { cat "$1" >&2; echo "domains: the server did not start" >&2; exit 1; }
        sleep 0.1
    done
}

if [[ "${SKIP_SETUP:-0}" != 1 ]]; then
    rm -rf "$RUN_ROOT"
    mkdir -p "$RUN_ROOT" "$res"
    sed -e "s#@RUN@#$RUN_ROOT#g" -e "s#@PORT@#$PORT#g" "$root/bench/peers/starling.toml" >"$cfg"
    printf '\n[admin]\nlisten = ["127.0.0.1:%s"]\n' "$ADMIN_PORT" >>"$cfg"
    "$STARLING_BIN" --config "$cfg" domain add one.example >/dev/null 2>&1
    db="$RUN_ROOT/data/starling.db"
    t0=$(date +%s.%N)
    sqlite3 -bail "$db" <<SQL
BEGIN IMMEDIATE;
UPDATE domains_version SET version = version + 1 WHERE id = 1;
WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < $DOMAINS)
INSERT INTO domains (name, state, settings, created_at, version)
SELECT 'd' || i || '.example', 'enabled', '{"v":1}',
       CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
       (SELECT version FROM domains_version WHERE id = 1)
FROM seq;
COMMIT;
SQL
    log "inserted $DOMAINS domains in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }') s; $(sqlite3 "$db" 'SELECT count(*) FROM domains') stored"
    for side in spread one; do
        if [[ $side == spread ]]; then d=("${spread[@]}"); else d=("${one[@]}"); fi
        "$BENCH_BIN" provision --method starling-import --force --starling-bin "$STARLING_BIN" \
            --starling-config "$cfg" --iterations 4096 --users "$accounts" --password 'pw{n}' \
            "${d[@]}" --out "$RUN_ROOT/users-$side.txt" 2>&1 | tail -n 1 >&2
    done
    start_server "$RUN_ROOT/server-certgen.log"
    log "certificate warm-up: one login per domain"
    "$BENCH_BIN" connect "${common[@]}" "${spread[@]}" --users "$DOMAINS" --server-pid "$pid" \
        --label certgen --json-file "$res/certgen.json" >/dev/null
    stop_server
    log "$(find "$RUN_ROOT/data/tls/domains" -name cert.pem | wc -l) domain certificates on disk"
fi
mkdir -p "$res"
summary="$res/summary.tsv"
[[ -s "$summary" ]] || printf 'run\tside\tround\tload\tusers\tsessions_per_s\tserver_ms_per_login\tclient_ms_per_login\tp50_ms\tp99_ms\tkib_per_session\tscrape_p50_ms\tscrape_max_ms\tscrape_bytes\tscrape_cpu_ms\tdomain_series\n' >"$summary"

# SCRAPES scrapes of /metrics, 0.5 s apart: "p50_ms max_ms bytes cpu_ms_per_scrape series".
scrape() {
    local url="http://127.0.0.1:$ADMIN_PORT/metrics" times=() c0 c1 bytes
    c0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    for _ in $(seq "$SCRAPES"); do
        times+=("$(curl -s -o "$RUN_ROOT/metrics.txt" -w '%{time_total}' "$url")")
        sleep 0.5
    done
    c1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    bytes=$(wc -c <"$RUN_ROOT/metrics.txt")
    printf '%s\n' "${times[@]}" | sort -g | awk -v b="$bytes" -v cpu="$(( (c1 - c0) * 1000 / $(getconf CLK_TCK) ))" \
        -v n="$SCRAPES" -v s="$(grep -c '^starling_c2s_sessions_by_domain{' "$RUN_ROOT/metrics.txt")" \
        '{t[NR] = $1 * 1000} END {printf "%.1f %.1f %d %.1f %d\n", t[int((NR + 1) / 2)], t[NR], b, cpu / n, s}'
}

# One storm: run side round first-user users [scrape]; appends to the summary.
storm() {
    local run=$1 side=$2 round=$3 first=$4 n=$5 do_scrape=${6:-0} d load json base sc="- - - - -"
    if [[ $side == spread ]]; then d=("${spread[@]}"); else d=("${one[@]}"); fi
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    json="$res/$run-$side-$round-$first.json"
    rm -f "$json"
    base=$(ls "/proc/$pid/fd" | wc -l)
    local hold=0
    [[ $do_scrape == 1 ]] && hold=$(( SCRAPES + 10 ))
    "$BENCH_BIN" idle "${common[@]}" "${d[@]}" --users "$n" --first-user "$first" \
        --settle-secs 2 --hold-secs "$hold" --server-pid "$pid" \
        --label "$run $side" --json-file "$json" >/dev/null &
    local bench=$!
    if [[ $do_scrape == 1 ]]; then
        while kill -0 "$bench" 2>/dev/null && (( $(ls "/proc/$pid/fd" | wc -l) < base + n )); do sleep 1; done
        sleep 4 # the idle scenario's memory reading (--settle-secs 2) comes first
        sc=$(scrape)
    fi
    wait "$bench"
    python3 - "$json" "$summary" "$run" "$side" "$round" "$load" $sc <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
c, i = r["connect"], r.get("idle") or {}
run, side, rnd, load = sys.argv[3:7]
p50, pmax, size, cpu, series = sys.argv[7:12]
est = max(c["established"], 1)
row = [run, side, rnd, load, str(c["established"]), f'{c["sessions_per_s"]:.0f}',
       f'{1000 * (c.get("server_cpu_s") or 0) / est:.3f}', f'{1000 * (c.get("client_cpu_s") or 0) / est:.3f}',
       f'{c["setup_latency"]["p50_ms"]:.1f}', f'{c["setup_latency"]["p99_ms"]:.1f}',
       f'{i.get("kb_per_session", 0):.1f}', p50, pmax, size, cpu, series]
assert c["failed"] == 0, (c["failures"], c.get("first_error"))
open(sys.argv[2], "a").write("\t".join(row) + "\n")
print("  ".join(row))
PY
}

idle_scrape() { # side: /metrics of the fresh server before any session
    local sc
    sc=$(scrape)
    printf 'fresh\t%s\t-\t%s\t0\t-\t-\t-\t-\t-\t-\t%s\n' "$1" "$(cut -d' ' -f1-3 /proc/loadavg)" "$(tr ' ' '\t' <<<"$sc")" | tee -a "$summary"
}

for r in $(seq "$ROUNDS"); do
    if (( r % 2 )); then order=(spread one); else order=(one spread); fi
    for side in "${order[@]}"; do
        start_server "$RUN_ROOT/server-main-$side-$r.log"
        [[ $r == 1 ]] && idle_scrape "$side"
        log "main $side round $r: $USERS logins"
        storm main "$side" "$r" 1 "$USERS" 1
        stop_server
    done
done
if [[ "$PAIRS" == 1 ]]; then
    for r in $(seq "$ROUNDS"); do
        if (( r % 2 )); then order=(one spread); else order=(spread one); fi
        for side in "${order[@]}"; do
            start_server "$RUN_ROOT/server-pair-$side-$r.log"
            log "pair $side round $r: $DOMAINS first logins, then $DOMAINS more"
            storm first "$side" "$r" 1 "$DOMAINS"
            sleep 5 # the server's clean-up of the first storm's sessions, not counted in the second
            storm second "$side" "$r" $(( DOMAINS + 1 )) "$DOMAINS"
            stop_server
        done
    done
fi
log "summary: $summary"
column -t -s $'\t' "$summary"
