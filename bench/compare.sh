#!/usr/bin/env bash
# Side-by-side benchmark of Starling, ejabberd and Prosody on this machine.
#
# For each server, one at a time: start it on loopback with the committed
# configuration from bench/peers/ (own port, own data dir under $RUN_ROOT),
# create the accounts, run the same starling-bench scenarios, stop it.
# Then append a dated Markdown section with a ratio table to
# docs/benchmarks.md (created if missing).
#
#   bench/compare.sh                       # everything, defaults below
#   SERVERS="starling" USERS=2000 bench/compare.sh
#   ARCHIVE=1 SERVERS="ejabberd prosody" bench/compare.sh   # archives on
#   TRANSPORT=websocket bench/compare.sh   # the scenarios over WebSocket
#   MUC=1 bench/compare.sh                 # multi-user chat (XEP-0045)
#   PEP=1 bench/compare.sh                 # personal eventing at login (XEP-0163)
#   UPLOAD=1 bench/compare.sh              # HTTP File Upload (XEP-0363)
#
# ARCHIVE=1: every server runs with its message archive (XEP-0313) on,
# from bench/peers/*-archive.* (ejabberd mod_mam on SQLite, Prosody mod_mam
# on SQLite, Starling [modules.mam] + [modules.inbox]); the idle run is
# skipped; the o2o ramp runs on a fresh server, then the `archive` scenario
# (ARCHIVE_USERS users, --fill ARCHIVE_FILL, ARCHIVE_SECS of queries) on
# the same server. Results are appended as an "archive on" section.
#
# TRANSPORT=websocket: every server also gets an HTTP listener on its own
# loopback port (HPORT: Starling 15280, ejabberd 15380, Prosody 15480) with
# XMPP over WebSocket (RFC 7395) at /xmpp-websocket, added to the generated
# config (Starling: [[http.listen]]; ejabberd: ejabberd_http with
# ejabberd_http_ws; Prosody: mod_websocket, consider_websocket_secure), and
# the scenarios run with starling-bench --transport websocket on that port.
# TLS is then plain (ws:, the default) or direct (wss:, each server's
# self-signed certificate). Accounts are still created over the c2s TCP
# port (ejabberd's in-band registration over STARTTLS). Results are
# appended as a "WebSocket" section.
#
# MUC=1: multi-user chat (XEP-0045) at conference.localhost instead of the
# idle and o2o runs (every server's bench/peers/ config has its MUC service
# on): on a fresh server, the `muc` scenario with O2O_USERS users in rooms
# of ROOM_SIZE (join storm, then the MUC_RATES ramp of messages sent per
# second, each delivered to every occupant); then on another fresh server
# one room of all O2O_USERS users (the join storm into one room, then the
# BIG_RATES ramp: fan-out to every occupant). Results are appended as a
# "multi-user chat" section.
#
# PEP=1: personal eventing (XEP-0163) at login instead of the idle and o2o
# runs: rosters, entity capabilities and PEP are added to each server's
# generated config (ejabberd: mod_roster, mod_caps, mod_pubsub with the pep
# plugin and ignore_pep_from_offline: false; Prosody: roster, pep;
# Starling: on by default), then the `pep` scenario with PEP_USERS users in
# groups of PEP_CONTACTS + 1 mutual contacts, each publishing PEP_NODES
# items, a caps warm-up login (the server learns the storm's caps `ver`, as
# a production server knows its clients'), and the login storm at PEP_RATE
# logins/s (0: all at once), every login waiting up to PEP_WINDOW_SECS for
# the last items it expects. The mutual subscriptions are set up over XMPP
# (one handshake per pair), except for Prosody, whose rosters are written
# into its data files with the accounts (`provision --method prosody-files
# --contacts`: the same final rosters, all `both`; over XMPP its file
# storage rewrites a whole roster file at every handshake step, ~40,000
# rewrites at 101 × 100, minutes of full CPU here); the publications are
# over XMPP for every server. Results are appended as a "personal
# eventing" section.
#
# UPLOAD=1: HTTP File Upload (XEP-0363) instead of the idle and o2o runs:
# each server gets an HTTP listener on its HPORT (plain http:) and its
# upload service at upload.localhost (Starling: [modules.upload] of
# bench/peers/starling.toml turned on; ejabberd: mod_http_upload at
# /upload; Prosody: Component "upload.localhost" "http_file_share"), with
# a 100 MiB size limit and no quota that a few runs could reach; then the
# `upload` scenario: one file of BIG_MB MiB, then PARALLEL files of
# SMALL_KB KiB at once, uploaded and downloaded (every byte verified),
# every PUT and GET sent to 127.0.0.1:HPORT whatever host the URLs name.
# Results are appended as an "HTTP File Upload" section.
#
# Environment (defaults in brackets):
#   SERVERS        servers to run, in order        [starling ejabberd prosody]
#   USERS          idle sessions (memory, conn rate) [15000]
#   O2O_USERS      users online in the o2o ramp    [1000]
#   RATES          o2o ramp (starling-bench --rates) [1000,2000,5000,10000,…,100000]
#   STEP_SECS      seconds per ramp step           [10]
#   P99_BOUND_MS   saturation p99 bound            [100]
#   TRANSPORT      tcp|websocket (above)           [tcp]
#   TLS            plain|starttls|direct           [starttls; websocket: plain]
#   MECH           SASL mechanism (all three servers do SCRAM-SHA-1) [SCRAM-SHA-1]
#   CONCURRENCY    session setups in flight        [100]
#   HOURLY_PRICE   instance price per hour for the cost metric [0.0832]
#                  (an assumed on-demand price of a 2-vCPU VM; pass your own)
#   STARLING_BIN, BENCH_BIN   binaries [target/release/starling, target/release/starling-bench]
#   STARLING_PG_URL  run Starling on this PostgreSQL database instead of
#                  SQLite (dropped and re-created for each run; e.g. from
#                  STARLING_PG_DURABLE=1 STARLING_PG_PORT=55433
#                  STARLING_PG_DIR=/tmp/starling-pg-bench scripts/pg-test.sh start,
#                  with /starling_bench instead of /postgres)
#   RUN_ROOT       scratch dir for data/logs/results [/tmp/starling-bench-compare]
#   OUT            Markdown output                 [docs/benchmarks.md]
#   NO_INSTALL=1   do not apt-get install missing peers
#   ARCHIVE=1      archive-on mode (above); then also:
#     ARCHIVE_USERS  users running MAM queries     [10]
#     ARCHIVE_FILL   messages per user before the queries [1000]
#     ARCHIVE_SECS   seconds of queries            [30]
#     PAGE_SIZE      RSM page size                 [50]
#   In ARCHIVE mode USERS defaults to O2O_USERS + 2 (the accounts needed)
#   and RATES starts lower (50 msg/s): archiving servers saturate early.
#   MUC=1          multi-user chat mode (above); then also:
#     ROOM_SIZE      members per room              [5]
#     MUC_RATES      messages sent/s, rooms of ROOM_SIZE [1000,2000,5000,7500,10000,15000,20000]
#     BIG_RATES      messages sent/s, one room of O2O_USERS [5,10,20,50,100,200]
#   In MUC mode USERS defaults to O2O_USERS.
#   PEP=1          personal eventing mode (above); then also:
#     PEP_USERS      users                         [O2O_USERS]
#     PEP_CONTACTS   contacts per user             [49]
#     PEP_NODES      items each user publishes (1-8) [3]
#     PEP_RATE       logins started per second, 0 = all at once [0]
#     PEP_WINDOW_SECS  a login's longest wait for its last items, s [60]
#     PEP_SETUP_TIMEOUT  the setup's subscriptions and publications, s [600]
#     PEP_EJABBERD_ROSTERS  xmpp: ejabberd's rosters set up over XMPP like
#                    Starling's; ctl: pushed with `ejabberdctl
#                    push_roster_all` (mod_admin_extra) per group, all
#                    `both` — for big layouts (at 501 × 500, 125,250
#                    handshakes over XMPP take ejabberd far too long) [xmpp]
#   In PEP mode USERS defaults to PEP_USERS.
#   UPLOAD=1       HTTP File Upload mode (above); then also:
#     UPLOAD_USERS   users requesting the slots    [2]
#     BIG_MB         the big file, MiB             [100]
#     PARALLEL       files uploaded at once        [100]
#     SMALL_KB       size of each of those, KiB    [1024]
#   In UPLOAD mode USERS defaults to UPLOAD_USERS.
#
# Requires root for apt-get and to run the peers as their system users.
# The open-file limit of this shell is inherited by every server (raise it
# with ulimit -n before running more than ~19,000 sessions).
# Every server this script starts is stopped on exit (also on error/^C).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
peers="$root/bench/peers"
target_dir=${CARGO_TARGET_DIR:-$root/target}
SERVERS=${SERVERS:-"starling ejabberd prosody"}
ARCHIVE=${ARCHIVE:-}
MUC=${MUC:-}
PEP=${PEP:-}
UPLOAD=${UPLOAD:-}
UPLOAD_USERS=${UPLOAD_USERS:-2}
BIG_MB=${BIG_MB:-100}
PARALLEL=${PARALLEL:-100}
SMALL_KB=${SMALL_KB:-1024}
O2O_USERS=${O2O_USERS:-1000}
PEP_USERS=${PEP_USERS:-$O2O_USERS}
PEP_CONTACTS=${PEP_CONTACTS:-49}
PEP_NODES=${PEP_NODES:-3}
PEP_RATE=${PEP_RATE:-0}
PEP_WINDOW_SECS=${PEP_WINDOW_SECS:-60}
PEP_SETUP_TIMEOUT=${PEP_SETUP_TIMEOUT:-600}
PEP_EJABBERD_ROSTERS=${PEP_EJABBERD_ROSTERS:-xmpp}
[[ $PEP_EJABBERD_ROSTERS == xmpp || $PEP_EJABBERD_ROSTERS == ctl ]] || { echo "compare: PEP_EJABBERD_ROSTERS must be xmpp or ctl" >&2; exit 1; }
ROOM_SIZE=${ROOM_SIZE:-5}
MUC_RATES=${MUC_RATES:-"1000,2000,5000,7500,10000,15000,20000"}
BIG_RATES=${BIG_RATES:-"5,10,20,50,100,200"}
[[ -n "$ARCHIVE" && -n "$MUC" ]] && { echo "compare: ARCHIVE=1 and MUC=1 are separate runs" >&2; exit 1; }
[[ -n "$PEP" && -n "$ARCHIVE$MUC" ]] && { echo "compare: PEP=1 is a separate run (not with ARCHIVE=1 or MUC=1)" >&2; exit 1; }
[[ -n "$UPLOAD" && -n "$ARCHIVE$MUC$PEP" ]] && { echo "compare: UPLOAD=1 is a separate run (not with ARCHIVE=1, MUC=1 or PEP=1)" >&2; exit 1; }
[[ -n "$UPLOAD" && ${TRANSPORT:-tcp} != tcp ]] && { echo "compare: UPLOAD=1 runs over TCP (its HTTP listener is the WebSocket one's port)" >&2; exit 1; }
if [[ -n "$MUC" ]]; then
    sfx=
    USERS=${USERS:-$O2O_USERS}
    RATES=${RATES:-}
elif [[ -n "$PEP" ]]; then
    sfx=
    USERS=${USERS:-$PEP_USERS}
    RATES=${RATES:-}
elif [[ -n "$UPLOAD" ]]; then
    sfx=
    USERS=${USERS:-$UPLOAD_USERS}
    RATES=${RATES:-}
elif [[ -n "$ARCHIVE" ]]; then
    sfx=-archive   # peer config variant: bench/peers/<server>-archive.*
    USERS=${USERS:-$((O2O_USERS + 2))}
    RATES=${RATES:-"50,100,200,500,1000,2000,5000,10000,15000,20000,30000,40000,60000,80000,100000"}
else
    sfx=
    USERS=${USERS:-15000}
    RATES=${RATES:-"1000,2000,5000,10000,15000,20000,25000,30000,40000,50000,60000,70000,80000,100000"}
fi
ARCHIVE_USERS=${ARCHIVE_USERS:-10}
ARCHIVE_FILL=${ARCHIVE_FILL:-1000}
ARCHIVE_SECS=${ARCHIVE_SECS:-30}
PAGE_SIZE=${PAGE_SIZE:-50}
STEP_SECS=${STEP_SECS:-10}
P99_BOUND_MS=${P99_BOUND_MS:-100}
TRANSPORT=${TRANSPORT:-tcp}
case $TRANSPORT in
tcp) TLS=${TLS:-starttls}; PROV_TLS=$TLS ;;
websocket)
    TLS=${TLS:-plain}
    PROV_TLS=starttls   # in-band registration (ejabberd) over the c2s port
    [[ $TLS == plain || $TLS == direct ]] || { echo "compare: TRANSPORT=websocket needs TLS=plain (ws:) or TLS=direct (wss:), not $TLS" >&2; exit 1; }
    ;;
*) echo "compare: TRANSPORT must be tcp or websocket, not $TRANSPORT" >&2; exit 1 ;;
esac
MECH=${MECH:-SCRAM-SHA-1}
CONCURRENCY=${CONCURRENCY:-100}
HOURLY_PRICE=${HOURLY_PRICE:-0.0832}
STARLING_BIN=${STARLING_BIN:-$target_dir/release/starling}
BENCH_BIN=${BENCH_BIN:-$target_dir/release/starling-bench}
RUN_ROOT=${RUN_ROOT:-/tmp/starling-bench-compare}
OUT=${OUT:-$root/docs/benchmarks.md}
PASSWORD='pw{n}'
declare -A PORT=([starling]=15222 [ejabberd]=15322 [prosody]=15422)
# HTTP ports, used with TRANSPORT=websocket (WebSocket) and UPLOAD=1.
declare -A HPORT=([starling]=15280 [ejabberd]=15380 [prosody]=15480)

for b in "$STARLING_BIN" "$BENCH_BIN"; do
    [[ -x "$b" ]] || { echo "compare: missing $b; run: cargo build --release -p starling-server -p starling-bench" >&2; exit 1; }
done

mkdir -p "$RUN_ROOT/results"
: >"$RUN_ROOT/commands.txt"
: >"$RUN_ROOT/load.txt"
log() { echo "[compare $(date +%H:%M:%S)] $*" >&2; }
# Runs a command and records it (for the "exact commands" section).
run() {
    printf '%q ' "$@" >>"$RUN_ROOT/commands.txt"
    echo >>"$RUN_ROOT/commands.txt"
    "$@"
}

# ---------------------------------------------------------------- install
installed_now=()
if [[ -z "${NO_INSTALL:-}" ]]; then
    # The archive mode's SQLite drivers: Erlang's for ejabberd, LuaDBI's
    # for Prosody.
    declare -A extra=([ejabberd]=erlang-p1-sqlite3 [prosody]=lua-dbi-sqlite3)
    for s in ejabberd prosody; do
        [[ " $SERVERS " == *" $s "* ]] || continue
        pkgs=$s
        [[ -n "$ARCHIVE" ]] && pkgs="$s ${extra[$s]}"
      for pkg in $pkgs; do
        if ! dpkg -s "$pkg" >/dev/null 2>&1; then
            log "installing $pkg from Debian"
            DEBIAN_FRONTEND=noninteractive apt-get install -y "$pkg" >"$RUN_ROOT/apt-$pkg.log" 2>&1
            installed_now+=("$pkg")
        fi
      done
    done
fi
# Package installation may start the system-wide daemons; they are not ours
# to benchmark and would compete for CPU: stop them.
for pkg in "${installed_now[@]}"; do
    service "$pkg" stop >/dev/null 2>&1 || true
done

# ---------------------------------------------------------------- servers
started=""   # the server currently running, for cleanup
epmd_was_running=0
pgrep -x epmd >/dev/null 2>&1 && epmd_was_running=1

wait_port() { # port pid-or-empty
    for _ in $(seq 1 300); do
        (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.2
    done
    echo "compare: nothing listens on $1" >&2
    return 1
}

fill() { # template run port -> stdout
    sed -e "s#@RUN@#$2#g" -e "s#@PORT@#$3#g" "$1"
}

self_signed() { # dir owner
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
        -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost" \
        -keyout "$1/key.pem" -out "$1/cert.pem" >/dev/null 2>&1
    cat "$1/cert.pem" "$1/key.pem" >"$1/combined.pem"
}

# The peers run as their system users via setpriv, not su/runuser: those go
# through PAM, which lowers the open-file soft limit to 1024 (ejabberd then
# refuses connections past ~990 sessions). setpriv keeps this shell's limit.
ejctl() {
    local r="$RUN_ROOT/ejabberd"
    setpriv --reuid=ejabberd --regid=ejabberd --init-groups env HOME=/var/lib/ejabberd \
        ejabberdctl --config-dir "$r" --config "$r/ejabberd.yml" --ctl-config "$r/ejabberdctl.cfg" \
        --spool "$r/spool" --logs "$r/logs" "$@"
}

# Starts server $1 on its existing data (configs and accounts in place).
launch_server() {
    local s=$1 p=${PORT[$1]} r="$RUN_ROOT/$1"
    case $s in
    starling)
        "$STARLING_BIN" --config "$r/starling.toml" >>"$r/server.log" 2>&1 &
        echo $! >"$r/pid"
        ;;
    ejabberd)
        ejctl start
        ejctl started
        ;;
    prosody)
        setpriv --reuid=prosody --regid=prosody --init-groups prosody -F --config "$r/prosody.cfg.lua" >>"$r/server.log" 2>&1 &
        ;;
    esac
    started=$s
    wait_port "$p"
    if [[ $TRANSPORT == websocket || -n "$UPLOAD" ]]; then wait_port "${HPORT[$s]}"; fi
}

# TRANSPORT=websocket: adds an HTTP listener with XMPP over WebSocket at
# /xmpp-websocket on HPORT to server $1's generated config file $2 (plain
# for TLS=plain, HTTPS for TLS=direct). Nothing for TCP.
add_websocket() {
    local s=$1 f=$2 hp=${HPORT[$1]} tls_on=false
    [[ $TRANSPORT == websocket ]] || return 0
    [[ $TLS == direct ]] && tls_on=true
    case $s in
    starling)
        # The [http] section of bench/peers/starling*.toml has `listen = []`;
        # replaced by one listener (the web client is not served).
        grep -q '^listen = \[\]$' "$f" || { echo "compare: no 'listen = []' line in $f to replace" >&2; return 1; }
        sed -i "s|^listen = \[\]$|listen = [{ address = \"127.0.0.1:$hp\", tls = $tls_on }]\nweb_client = false|" "$f"
        ;;
    ejabberd)
        # Appended to the top-level `listen:` list. WebSocket sessions take
        # access, shaper and max_stanza_size from the first ejabberd_c2s
        # listener (ejabberd_c2s_config:get_c2s_limits/0).
        python3 - "$f" "$hp" "$tls_on" <<'PY'
import sys
f, port, tls = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(f).read()
block = f'''  -
    port: {port}
    ip: "127.0.0.1"
    module: ejabberd_http
    backlog: 4096
''' + ('''    tls: true
    protocol_options: TLS_OPTS
''' if tls == "true" else "") + '''    request_handlers:
      /xmpp-websocket: ejabberd_http_ws
'''
lines = text.splitlines(keepends=True)
start = lines.index("listen:\n")
end = next(i for i in range(start + 1, len(lines)) if lines[i][:1] not in (" ", "\n"))
open(f, "w").write("".join(lines[:end]) + block + "".join(lines[end:]))
PY
        ;;
    prosody)
        # Global options, before the VirtualHost line (mod_websocket is
        # served at /xmpp-websocket by default; no Origin check applies to
        # a client that sends no Origin header: cross_domain_websocket is
        # deprecated in 0.12 and unneeded here).
        local opts k=http
        [[ $tls_on == true ]] && k=https
        opts="${k}_interfaces = { \"127.0.0.1\" }\nconsider_websocket_secure = true"
        [[ $tls_on == true ]] && opts="$opts\nhttps_ssl = { certificate = \"$(dirname "$f")/cert.pem\"; key = \"$(dirname "$f")/key.pem\"; }"
        if ! { grep -q '^modules_enabled = {.*}$' "$f" && grep -q "^${k}_ports = { }$" "$f" && grep -q '^VirtualHost ' "$f"; }; then
            echo "compare: unexpected layout of $f" >&2
            return 1
        fi
        sed -i -e "s|^${k}_ports = { }$|${k}_ports = { $hp }|" \
            -e 's|^\(modules_enabled = {.*\) }$|\1, "websocket" }|' \
            -e "s|^VirtualHost |$opts\n&|" "$f"
        ;;
    esac
}

# PEP=1: rosters, entity capabilities and PEP in server $1's generated
# config $2 (Starling has them on by default). Nothing otherwise.
add_pep() {
    local s=$1 f=$2
    [[ -n "$PEP" ]] || return 0
    case $s in
    ejabberd)
        # Appended to `modules:`, the file's last section. ejabberd by
        # default sends a login the last items of online contacts only;
        # ignore_pep_from_offline: false is meant to change that, but in
        # 23.01 the code using it is commented out in
        # mod_pubsub:send_last_items/1 ("pep_from_offline hack can not work
        # anymore"): a login gets the last items of the contacts whose
        # sessions answer its presence probes (mod_pubsub:presence_probe/3)
        # and its own, whatever the option says. Kept as the documented
        # intent. mnesia (the default db_type) allocates node ids from one
        # record, so many first publications at once abort some
        # transactions (cyclic lock, answered item-not-found): the `pep`
        # scenario retries those (see crates/bench/src/pep.rs).
        tail -n 1 "$f" | grep -q '^    ' || { echo "compare: modules: is not the last section of $f" >&2; return 1; }
        printf '  mod_roster: {}\n  mod_caps: {}\n  mod_pubsub:\n    plugins: [flat, pep]\n    ignore_pep_from_offline: false\n' >>"$f"
        # For `ejabberdctl push_roster_all` (PEP_EJABBERD_ROSTERS=ctl).
        [[ $PEP_EJABBERD_ROSTERS == ctl ]] && printf '  mod_admin_extra: {}\n' >>"$f"
        ;;
    prosody)
        grep -q '^modules_enabled = {.*}$' "$f" || { echo "compare: unexpected layout of $f" >&2; return 1; }
        sed -i 's|^\(modules_enabled = {.*\) }$|\1, "roster", "pep" }|' "$f"
        ;;
    esac
}

# UPLOAD=1: an HTTP listener on HPORT (plain http:) and the XEP-0363
# service at upload.localhost in server $1's generated config $2, 100 MiB
# per file, no quota a few runs could reach. Nothing otherwise.
add_upload() {
    local s=$1 f=$2 hp=${HPORT[$1]} r
    [[ -n "$UPLOAD" ]] || return 0
    r=$(dirname "$f")
    case $s in
    starling)
        grep -q '^listen = \[\]$' "$f" && grep -q '^\[modules.upload\]$' "$f" \
            || { echo "compare: no 'listen = []' or [modules.upload] in $f" >&2; return 1; }
        sed -i -e "s|^listen = \[\]$|listen = [{ address = \"127.0.0.1:$hp\", tls = false }]\nweb_client = false|" \
            -e '/^\[modules.upload\]$/,/^enabled/ s/^enabled = false$/enabled = true/' "$f"
        ;;
    ejabberd)
        # A listener appended to `listen:`, the module to `modules:` (the
        # file's last section); mod_http_upload serves upload.@HOST@.
        tail -n 1 "$f" | grep -q '^    ' || { echo "compare: modules: is not the last section of $f" >&2; return 1; }
        mkdir -p "$r/upload"
        python3 - "$f" "$hp" <<'PY'
import sys
f, port = sys.argv[1], sys.argv[2]
lines = open(f).read().splitlines(keepends=True)
start = lines.index("listen:\n")
end = next(i for i in range(start + 1, len(lines)) if lines[i][:1] not in (" ", "\n"))
block = f'''  -
    port: {port}
    ip: "127.0.0.1"
    module: ejabberd_http
    backlog: 4096
    request_handlers:
      /upload: mod_http_upload
'''
open(f, "w").write("".join(lines[:end]) + block + "".join(lines[end:]))
PY
        # access: its default is the access rule `local`, which
        # bench/peers/ejabberd.yml does not define (every slot refused).
        printf '  mod_http_upload:\n    put_url: "http://localhost:%s/upload"\n    docroot: "%s/upload"\n    max_size: 104857600\n    access: all\n' "$hp" "$r" >>"$f"
        ;;
    prosody)
        # The HTTP server on loopback (bodies up to the size limit), and
        # the component, its URLs on localhost (the component's own name
        # does not resolve; starling-bench --http-addr connects anyway).
        grep -q '^http_ports = { }$' "$f" && grep -q '^VirtualHost ' "$f" \
            || { echo "compare: unexpected layout of $f" >&2; return 1; }
        sed -i -e "s|^http_ports = { }$|http_ports = { $hp }|" \
            -e "s|^VirtualHost |http_interfaces = { \"127.0.0.1\" }\nhttp_max_content_size = 110*1024*1024\n&|" "$f"
        printf '\nComponent "upload.localhost" "http_file_share"\n  http_host = "localhost"\n  http_file_share_size_limit = 100*1024*1024\n  http_file_share_daily_quota = 1000*1024*1024*1024\n' >>"$f"
        ;;
    esac
}

# Whether this Starling build accepts bench/peers/starling$sfx.toml; if not,
# says which key it does not know (e.g. [modules.mam] before the archive
# work is merged) instead of failing later with a bare error.
starling_config_ok() {
    local r="$RUN_ROOT/starling" key
    mkdir -p "$r"
    fill "$peers/starling$sfx.toml" "$r" "${PORT[starling]}" >"$r/check.toml"
    add_websocket starling "$r/check.toml"
    add_upload starling "$r/check.toml"
    "$STARLING_BIN" check-config "$r/check.toml" >"$r/check.log" 2>&1 && return 0
    key=$(grep -o 'unknown field `[^`]*`' "$r/check.log" | head -1 || true)
    echo "compare: $STARLING_BIN rejects bench/peers/starling$sfx.toml${key:+: $key}" >&2
    if [[ -n "$ARCHIVE" ]]; then
        echo "compare: this build has no [modules.mam]/[modules.inbox]; build one with the archive work" >&2
    fi
    sed 's/^/  /' "$r/check.log" >&2
    return 1
}

# Fresh data dir and config for server $1, accounts created, server running.
start_server() {
    local s=$1 p=${PORT[$1]} r="$RUN_ROOT/$1"
    rm -rf "$r"
    mkdir -p "$r"
    case $s in
    starling)
        fill "$peers/starling$sfx.toml" "$r" "$p" >"$r/starling.toml"
        add_websocket starling "$r/starling.toml"
        add_upload starling "$r/starling.toml"
        if [[ -n "${STARLING_PG_URL:-}" ]]; then
            psql -q "${STARLING_PG_URL%/*}/postgres" -c "DROP DATABASE IF EXISTS ${STARLING_PG_URL##*/}" \
                -c "CREATE DATABASE ${STARLING_PG_URL##*/}"
            printf '\n[storage]\nbackend = "postgres"\nurl = "%s"\npool_size = 8\n' "$STARLING_PG_URL" >>"$r/starling.toml"
        fi
        log "starling: importing $USERS accounts"
        run "$BENCH_BIN" provision --method starling-import --starling-bin "$STARLING_BIN" \
            --starling-config "$r/starling.toml" --iterations 4096 \
            --users "$USERS" --password "$PASSWORD" --out "$r/users.txt" >"$r/provision.log" 2>&1
        launch_server starling
        ;;
    ejabberd)
        fill "$peers/ejabberd$sfx.yml" "$r" "$p" >"$r/ejabberd.yml"
        add_websocket ejabberd "$r/ejabberd.yml"
        add_pep ejabberd "$r/ejabberd.yml"
        add_upload ejabberd "$r/ejabberd.yml"
        if [[ -n "$ARCHIVE" ]]; then
            # ejabberd would create the SQLite file itself (rollback
            # journal, several fsyncs per archived message: ~40 msg/s here).
            # Created in WAL mode instead (persistent in the file), as
            # Starling's store runs; ejabberd's connection keeps SQLite's
            # default synchronous=FULL (one fsync per commit).
            sqlite3 "$r/ejabberd.db" </usr/share/ejabberd/sql/lite.sql
            sqlite3 "$r/ejabberd.db" "PRAGMA journal_mode=WAL;" >/dev/null
        fi
        cp "$peers/ejabberdctl.cfg" "$r/ejabberdctl.cfg"
        cp /etc/ejabberd/inetrc "$r/inetrc" 2>/dev/null || true
        self_signed "$r"
        cp "$r/combined.pem" "$r/ejabberd.pem"
        mkdir -p "$r/spool" "$r/logs"
        chown -R ejabberd:ejabberd "$r"
        launch_server ejabberd
        log "ejabberd: registering $USERS accounts in-band"
        run "$BENCH_BIN" provision --method ibr --port "$p" --tls "$PROV_TLS" \
            --users "$USERS" --password "$PASSWORD" --concurrency 50 >"$r/provision.log" 2>&1
        if [[ -n "$PEP" && $PEP_EJABBERD_ROSTERS == ctl ]]; then
            # The `pep` layout's rosters (groups of PEP_CONTACTS + 1
            # consecutive users, each other's contacts, `both`): one file
            # per group, pushed to every user of the file (not to itself).
            log "ejabberd: pushing the rosters with ejabberdctl push_roster_all"
            python3 - "$r" "$PEP_USERS" "$PEP_CONTACTS" <<'PY'
import sys
r, users, contacts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
size = contacts + 1
for g, lo in enumerate(range(1, users + 1, size)):
    members = range(lo, min(lo + size, users + 1))
    with open(f"{r}/roster-{g}.txt", "w") as f:
        f.write("[" + ",\n".join(f'{{"user{n}", "localhost", "bench", "user{n}"}}' for n in members) + "].\n")
PY
            chown ejabberd:ejabberd "$r"/roster-*.txt
            # --no-timeout: 250,000 items (501 × 500) take over the 60 s
            # ejabberdctl otherwise waits.
            for f in "$r"/roster-*.txt; do
                printf '%q ' ejabberdctl --no-timeout push_roster_all "$f" >>"$RUN_ROOT/commands.txt"; echo >>"$RUN_ROOT/commands.txt"
                ejctl --no-timeout push_roster_all "$f"
            done
        fi
        ;;
    prosody)
        fill "$peers/prosody$sfx.cfg.lua" "$r" "$p" >"$r/prosody.cfg.lua"
        add_websocket prosody "$r/prosody.cfg.lua"
        add_pep prosody "$r/prosody.cfg.lua"
        add_upload prosody "$r/prosody.cfg.lua"
        self_signed "$r"
        mkdir -p "$r/data"
        if [[ -n "$ARCHIVE" ]]; then
            # As for ejabberd: the archive database in WAL mode (Prosody
            # creates its tables in it; synchronous stays at SQLite's FULL).
            sqlite3 "$r/data/archive.sqlite" "PRAGMA journal_mode=WAL;" >/dev/null
        fi
        log "prosody: writing $USERS account files${PEP:+ and rosters}"
        # PEP=1: the rosters too (see the top of this file).
        run "$BENCH_BIN" provision --method prosody-files --prosody-data "$r/data" \
            --iterations 4096 --users "$USERS" --password "$PASSWORD" \
            ${PEP:+--contacts "$PEP_CONTACTS"} >"$r/provision.log" 2>&1
        chown -R prosody:prosody "$r"
        launch_server prosody
        ;;
    esac
}

stop_server() {
    local s=$started r
    [[ -n "$s" ]] || return 0
    r="$RUN_ROOT/$s"
    log "stopping $s"
    case $s in
    starling)
        local pid
        pid=$(cat "$r/pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        ;;
    ejabberd)
        ejctl stop >/dev/null 2>&1 || true
        ejctl stopped >/dev/null 2>&1 || true
        if [[ $epmd_was_running == 0 ]]; then epmd -kill >/dev/null 2>&1 || true; fi
        ;;
    prosody)
        local pid
        pid=$(cat "$r/prosody.pid" 2>/dev/null || true)
        if [[ -n "$pid" ]]; then
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -9 "$pid" 2>/dev/null || true
        fi
        ;;
    esac
    started=""
}
trap stop_server EXIT
trap 'exit 130' INT TERM

version_of() {
    case $1 in
    starling) echo "$("$STARLING_BIN" --version 2>/dev/null | head -1) (git $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo ?), built $(date -u -r "$STARLING_BIN" +%Y-%m-%dT%H:%MZ))${STARLING_PG_URL:+ on PostgreSQL $(psql -tA "${STARLING_PG_URL%/*}/postgres" -c 'SHOW server_version' 2>/dev/null)}" ;;
    ejabberd) echo "ejabberd $(dpkg-query -W -f='${Version}' ejabberd), Erlang/OTP $(dpkg-query -W -f='${Version}' erlang-base)" ;;
    prosody) echo "Prosody $(dpkg-query -W -f='${Version}' prosody), $(dpkg-query -W -f='${Package} ${Version}' 'lua5.4' 2>/dev/null || dpkg-query -W -f='${Package} ${Version}' 'lua5.2' 2>/dev/null || echo lua)" ;;
    esac
}

# ---------------------------------------------------------------- runs
common=(--tls "$TLS" --mechanism "$MECH" --password "$PASSWORD" --concurrency "$CONCURRENCY" --quiet)
[[ $TRANSPORT == websocket ]] && common=(--transport websocket "${common[@]}")
ran=""
for s in $SERVERS; do
    log "=== $s${ARCHIVE:+ (archive on)}"
    if [[ $s == starling ]] && ! starling_config_ok; then
        log "starling: skipped (configuration rejected, see above)"
        continue
    fi
    start_server "$s"
    ran="$ran $s"
    p=${PORT[$s]}
    [[ $TRANSPORT == websocket ]] && p=${HPORT[$s]}
    label=$(version_of "$s")
    rm -f "$RUN_ROOT/results/$s-"*.json
    if [[ -n "$PEP" ]]; then
        sleep 3
        echo "$s pep: load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$RUN_ROOT/load.txt"
        log "$s: pep, $PEP_USERS users, $PEP_CONTACTS contacts each, $PEP_NODES nodes"
        run "$BENCH_BIN" pep --port "$p" --users "$PEP_USERS" --contacts "$PEP_CONTACTS" \
            --nodes "$PEP_NODES" --rate "$PEP_RATE" --window-secs "$PEP_WINDOW_SECS" \
            --setup-timeout-secs "$PEP_SETUP_TIMEOUT" --label "$label" "${common[@]}" \
            --json-file "$RUN_ROOT/results/$s-pep.json" || log "$s: pep run failed (see above)"
        stop_server
        continue
    fi
    if [[ -n "$UPLOAD" ]]; then
        sleep 3
        echo "$s upload: load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$RUN_ROOT/load.txt"
        log "$s: upload, one file of $BIG_MB MiB, $PARALLEL files of $SMALL_KB KiB at once"
        run "$BENCH_BIN" upload --port "$p" --users "$UPLOAD_USERS" --big-mb "$BIG_MB" \
            --parallel "$PARALLEL" --small-kb "$SMALL_KB" --http-addr "127.0.0.1:${HPORT[$s]}" \
            --label "$label" "${common[@]}" --json-file "$RUN_ROOT/results/$s-upload.json" \
            || log "$s: upload run failed (see above)"
        stop_server
        continue
    fi
    if [[ -n "$MUC" ]]; then
        sleep 3
        echo "$s muc, rooms of $ROOM_SIZE: load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$RUN_ROOT/load.txt"
        log "$s: muc, $O2O_USERS users in rooms of $ROOM_SIZE"
        run "$BENCH_BIN" muc --port "$p" --users "$O2O_USERS" --room-size "$ROOM_SIZE" \
            --rates "$MUC_RATES" --step-secs "$STEP_SECS" --p99-bound-ms "$P99_BOUND_MS" \
            --label "$label" "${common[@]}" --json-file "$RUN_ROOT/results/$s-muc.json" \
            || log "$s: muc run failed (see above)"
        # A fresh process for the big room (nothing left of 200 rooms).
        stop_server
        launch_server "$s"
        sleep 3
        echo "$s muc, one room of $O2O_USERS: load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$RUN_ROOT/load.txt"
        log "$s: muc, one room of $O2O_USERS"
        run "$BENCH_BIN" muc --port "$p" --users "$O2O_USERS" --room-size "$O2O_USERS" \
            --rates "$BIG_RATES" --step-secs "$STEP_SECS" --p99-bound-ms "$P99_BOUND_MS" \
            --label "$label" "${common[@]}" --json-file "$RUN_ROOT/results/$s-muc-big.json" \
            || log "$s: muc (one big room) run failed (see above)"
        stop_server
        continue
    fi
    if [[ -z "$ARCHIVE" ]]; then
        sleep 2
        echo "$s idle: load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$RUN_ROOT/load.txt"
        log "$s: idle, $USERS sessions"
        run "$BENCH_BIN" idle --port "$p" --users "$USERS" --settle-secs 10 --label "$label" \
            "${common[@]}" --json-file "$RUN_ROOT/results/$s-idle.json" \
            || log "$s: idle run failed (see above)"
        # A fresh process for the ramp: what the idle run left behind (garbage,
        # allocator caches, sessions still closing) must not count against it.
        stop_server
        launch_server "$s"
    fi
    sleep 3
    echo "$s o2o$sfx: load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$RUN_ROOT/load.txt"
    log "$s: o2o ramp, $O2O_USERS users${ARCHIVE:+, archive on}"
    run "$BENCH_BIN" o2o --port "$p" --users "$O2O_USERS" --rates "$RATES" \
        --step-secs "$STEP_SECS" --p99-bound-ms "$P99_BOUND_MS" --hourly-price "$HOURLY_PRICE" \
        --label "$label" "${common[@]}" --json-file "$RUN_ROOT/results/$s-o2o.json" \
        || log "$s: o2o run failed (see above)"
    if [[ -n "$ARCHIVE" ]]; then
        # Archives as the ramp left them, in a fresh server process: a
        # server past saturation may still be working through its backlog
        # (Prosody: tens of seconds). Partners are the two accounts after
        # the measured users.
        stop_server
        launch_server "$s"
        sleep 3
        echo "$s archive: load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$RUN_ROOT/load.txt"
        log "$s: archive queries, $ARCHIVE_USERS users, fill $ARCHIVE_FILL"
        run "$BENCH_BIN" archive --port "$p" --users "$ARCHIVE_USERS" --partners 2 \
            --fill "$ARCHIVE_FILL" --duration-secs "$ARCHIVE_SECS" --page-size "$PAGE_SIZE" \
            --label "$label" "${common[@]}" --json-file "$RUN_ROOT/results/$s-archive.json" \
            || log "$s: archive run failed (see above)"
    fi
    stop_server
done
[[ -n "$ran" ]] || { echo "compare: no server could be benchmarked" >&2; exit 1; }
SERVERS=${ran# }

# ---------------------------------------------------------------- report
mkdir -p "$(dirname "$OUT")"
python3 - "$RUN_ROOT" "$OUT" "$SERVERS" "$ARCHIVE" "$TRANSPORT" "$TLS" "$MUC" "$PEP" "$UPLOAD" <<'PY'
import json, os, platform, subprocess, sys, datetime
run_root, out, servers, archive = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4] != ""
websocket, tls = sys.argv[5] == "websocket", sys.argv[6]
muc = sys.argv[7] != ""
pep = sys.argv[8] != ""
upload = sys.argv[9] != ""

def load(s, kind):
    p = os.path.join(run_root, "results", f"{s}-{kind}.json")
    try:
        with open(p) as f:
            lines = [l for l in f if l.strip()]
        return json.loads(lines[-1]) if lines else None
    except FileNotFoundError:
        return None

rows = {}
labels = {}
notes = []
for s in servers:
    idle, o2o = load(s, "idle"), load(s, "o2o")
    r = {}
    if idle:
        labels[s] = idle["target"]["label"]
        c = idle["connect"]
        if idle.get("idle"):
            r["mem"] = idle["idle"]["kb_per_session"]
        r["sessions"] = c["established"]
        r["rate"] = c["sessions_per_s"]
        r["setup_p99"] = c["setup_latency"]["p99_ms"]
        if c.get("server_cpu_s") is not None and c["established"]:
            r["cpu_per_session"] = c["server_cpu_s"] * 1000 / c["established"]
        if c["failed"]:
            notes.append(f"{s}: {c['failed']} of {c['attempted']} idle sessions failed {c['failures']} e.g. {c.get('first_error')}")
    if o2o and o2o.get("o2o"):
        labels.setdefault(s, o2o["target"]["label"])
        sat = o2o["o2o"]["saturation"]
        r["sat"] = sat["delivered_per_s"]
        r["sat_reached"] = sat["reached"]
        r["sat_note"] = sat["note"]
        ok = [st for st in o2o["o2o"]["steps"] if st["ok"]]
        r["sat_p99"] = ok[-1]["latency"]["p99_ms"] if ok else None
        if ok and ok[-1].get("server_cpu_pct") is not None:
            r["sat_cpu"] = ok[-1]["server_cpu_pct"]
            if ok[-1]["delivered_per_s"]:
                r["us_per_msg"] = ok[-1]["server_cpu_pct"] / 100 / ok[-1]["delivered_per_s"] * 1e6
            r["sat_cli_cpu"] = ok[-1].get("client_cpu_pct")
        if o2o.get("cost"):
            r["cost"] = o2o["cost"]["cost_per_billion"]
    arch = load(s, "archive")
    if arch and arch.get("archive") and not arch["archive"]["users"]:
        notes.append(f"{s}: archive scenario: no session established ({arch['connect'].get('first_error')})")
    elif arch and arch.get("archive"):
        labels.setdefault(s, arch["target"]["label"])
        a = arch["archive"]
        if a.get("fill"):
            r["fill_rate"] = a["fill"]["delivered_per_s"]
            if not a["fill"]["complete"]:
                notes.append(f"{s}: archive fill incomplete: {a['fill']['delivered']} of {a['fill']['per_user'] * a['users']} delivered")
        r["q_total"] = a["queries_per_s"]
        for k in a["kinds"]:
            r[f"q_{k['kind']}_p50"] = k["latency"]["p50_ms"] if k["ok"] else None
            r[f"q_{k['kind']}_p99"] = k["latency"]["p99_ms"] if k["ok"] else None
            r[f"q_{k['kind']}_qps"] = k["queries_per_s"]
            failed = sum(k["errors"].values())
            if failed:
                notes.append(f"{s}: {failed} of {k['queries']} `{k['kind']}` queries failed {k['errors']} e.g. {k.get('first_error')}")
            if k["capped"]:
                notes.append(f"{s}: {k['capped']} `{k['kind']}` pages were capped below the page size by the server")
        if a["warmup"]["errors"]:
            notes.append(f"{s}: {a['warmup']['errors']} warm-up queries failed, e.g. {a['warmup'].get('first_error')}")
        r["archive_users"], r["archive_page"], r["archive_fill"] = a["users"], a["page_size"], (a.get("fill") or {}).get("per_user", 0)
    for kind in ("muc", "muc-big"):
        res = load(s, kind)
        if not res or not res.get("muc"):
            continue
        labels.setdefault(s, res["target"]["label"])
        m, k = res["muc"], kind.replace("-", "_")
        j = m["join"]
        r[f"{k}_size"], r[f"{k}_rooms"] = m["room_size"], m["rooms"]
        r[f"{k}_joins"] = j["joins_per_s"]
        if j["joined"]:
            r[f"{k}_join_p50"], r[f"{k}_join_p99"] = j["latency"]["p50_ms"], j["latency"]["p99_ms"]
        if j.get("server_cpu_s") is not None and j["joined"]:
            r[f"{k}_join_cpu"] = j["server_cpu_s"] * 1000 / j["joined"]
        if j["failed"]:
            notes.append(f"{s}: {kind}: {j['failed']} of {j['attempted']} joins failed {j['failures']} e.g. {j.get('first_error')}")
        ok = [st for st in m["steps"] if st["ok"]]
        if ok:
            st = ok[-1]
            r[f"{k}_sat"], r[f"{k}_sat_copies"] = st["target_rate"], st["delivered_per_s"]
            r[f"{k}_p99"], r[f"{k}_last_p99"] = st["latency"]["p99_ms"], st["last_copy_latency"]["p99_ms"]
            r[f"{k}_us"], r[f"{k}_cpu"] = st.get("server_cpu_us_per_copy"), st.get("server_cpu_pct")
            r[f"{k}_sat_reached"] = m["saturation"]["reached"]
        r[f"{k}_note"] = m["saturation"]["note"]
    res = load(s, "pep")
    if res and res.get("pep"):
        labels.setdefault(s, res["target"]["label"])
        p, c = res["pep"], res["connect"]
        r["pep_layout"] = f"{res['users']} users, {p['contacts']} contacts each, {len(p['nodes'])} nodes"
        r["pep_rate"], r["pep_kib"] = c["sessions_per_s"], p["bytes_per_login"] / 1024
        r["pep_recv"], r["pep_exp"] = p["received_per_login"], p["expected_per_login"]
        if p["latency"]["count"]:
            r["pep_p50"], r["pep_p99"] = p["latency"]["p50_ms"], p["latency"]["p99_ms"]
        r["pep_cpu"] = p.get("server_cpu_ms_per_login")
        if p.get("memory"):
            r["pep_mem"] = p["memory"]["kb_per_session"]
        r["pep_complete"] = f"{p['complete_logins']} / {p['logins']}"
        if p.get("setup"):
            x = p["setup"]
            r["pep_setup"] = x["total_s"]
            # Rosters provisioned from files (Prosody): nothing subscribed
            # over XMPP, only published.
            r["pep_setup_files"] = x["contacts_expected"] > 0 and x["contacts_already"] == x["contacts_expected"] and x["subscribes_sent"] == 0
            if r["pep_setup_files"]:
                how = {"prosody": "written into its data files with the accounts (provision --method prosody-files --contacts)",
                       "ejabberd": "pushed with ejabberdctl push_roster_all (PEP_EJABBERD_ROSTERS=ctl)"}.get(s, "provisioned before the run")
                notes.append(f"{s}: pep setup: rosters {how}, all {x['contacts_already']} items both; only the publications over XMPP")
            if x["contacts_both"] < x["contacts_expected"] or x["published"] < x["publish_expected"]:
                notes.append(f"{s}: pep setup incomplete: {x['contacts_both']}/{x['contacts_expected']} contacts, {x['published']}/{x['publish_expected']} items {x['failures']} e.g. {x.get('first_error')}")
            if x.get("publish_retries"):
                notes.append(f"{s}: pep setup: {x['publish_retries']} refused publications sent again ({x['published']}/{x['publish_expected']} published in the end)")
        if not p.get("caps_warmed_up", False):
            notes.append(f"{s}: pep: no caps warm-up (the storm's caps ver was new to the server)")
        if c["failed"]:
            notes.append(f"{s}: pep: {c['failed']} of {c['attempted']} logins failed {c['failures']} e.g. {c.get('first_error')}")
        if p["missing"] or p["duplicates"] or p["unexpected"] or p["after_window"]:
            notes.append(f"{s}: pep: {p['missing']} expected notifications missing after a window of up to {p.get('window_secs', 0):.0f} s ({p.get('missing_online_first', 0)} of publishers online first, {p.get('missing_later', 0)} of publishers that logged in after the login), {p['duplicates']} duplicates, {p['unexpected']} unexpected, {p['after_window']} after the login's window")
    res = load(s, "upload")
    if res and res.get("upload"):
        labels.setdefault(s, res["target"]["label"])
        for p in res["upload"]["phases"]:
            k = f"up_{p['name']}"
            b = p["file_bytes"]
            size = f"{b / 1048576:g} MiB" if b >= 1048576 else f"{b / 1024:g} KiB"
            r[f"{k}_what"] = f"one file of {size}" if p["name"] == "big" else f"{p['files']} files of {size} at once"
            for d in ("upload", "download"):
                t, dk = p[d], f"{k}_{d}"
                if t["ok"]:
                    r[f"{dk}_mibs"] = t["mib_per_s"]
                    r[f"{dk}_p50"], r[f"{dk}_p99"] = t["latency"]["p50_ms"], t["latency"]["p99_ms"]
                if t.get("memory"):
                    r[f"{dk}_rss"] = t["memory"]["growth_kb"] / 1024
                if t.get("server_cpu_s") is not None and t["bytes"]:
                    r[f"{dk}_cpu"] = t["server_cpu_s"] * 1000 / (t["bytes"] / 1048576)
                if t["failures"]:
                    notes.append(f"{s}: upload {p['name']}: {sum(t['failures'].values())} of {t['files']} {d}s failed {t['failures']} e.g. {t.get('first_error')}")
            if p["slots"]["failures"]:
                notes.append(f"{s}: upload {p['name']}: {p['slots']['requested'] - p['slots']['granted']} slot requests refused {p['slots']['failures']} e.g. {p['slots'].get('first_error')}")
    rows[s] = r

base = servers[0]
def cell(s, key, fmt, lower_better=False):
    v = rows.get(s, {}).get(key)
    if v is None:
        return "n/a"
    text = fmt.format(v)
    b = rows.get(base, {}).get(key)
    if s != base and b:
        text += f" ({v / b:.2f}×)"
    return text

names = {"starling": "Starling", "ejabberd": "ejabberd", "prosody": "Prosody"}
meminfo = open("/proc/meminfo").read().split("\n")[0].split()
ram_gib = int(meminfo[1]) / 1024 / 1024
cpu = ""
for l in open("/proc/cpuinfo"):
    if l.startswith("model name"):
        cpu = l.split(":", 1)[1].strip(); break
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
o = []
ws_title = f" — over WebSocket (RFC 7395, {'wss:' if tls == 'direct' else 'ws:'})" if websocket else ""
o.append(f"\n## {now} — {', '.join(names.get(s, s) for s in servers)}{' — archive on (XEP-0313)' if archive else ''}{' — multi-user chat (XEP-0045)' if muc else ''}{' — personal eventing at login (XEP-0163)' if pep else ''}{' — HTTP File Upload (XEP-0363)' if upload else ''}{ws_title}\n")
o.append(f"Machine: {os.cpu_count()} CPUs ({cpu}), {ram_gib:.1f} GiB RAM, kernel {platform.release()}; "
         "client and server on the same machine over loopback. "
         f"Versions: " + "; ".join(f"{names.get(s, s)}: {labels.get(s, '?')}" for s in servers) + ".\n")
if websocket:
    o.append("Every scenario ran over XMPP over WebSocket (`starling-bench --transport websocket`, "
             f"`{'wss:' if tls == 'direct' else 'ws:'}//127.0.0.1:<HTTP port>/xmpp-websocket`, "
             "one HTTP listener per server added to its bench/peers/ config by `TRANSPORT=websocket bench/compare.sh`); "
             "accounts were created over the c2s TCP port.\n")
o.append(f"Ratios in parentheses are relative to {names.get(base, base)} (for memory and latency lower is better, for rates higher is better).\n")
hdr = "| Metric | " + " | ".join(names.get(s, s) for s in servers) + " |"
o.append(hdr)
o.append("|" + "---|" * (len(servers) + 1))
if muc:
    some = next((rows[s] for s in servers if rows.get(s, {}).get("muc_size")), {})
    big = next((rows[s] for s in servers if rows.get(s, {}).get("muc_big_size")), {})
    for k, what in (("muc", f"{some.get('muc_rooms', '?')} rooms of {some.get('muc_size', '?')}"),
                    ("muc_big", f"one room of {big.get('muc_big_size', '?')}")):
        o.append(f"| Join storm, {what} (joins/s) | " + " | ".join(cell(s, f"{k}_joins", "{:,.0f}") for s in servers) + " |")
        o.append(f"| Join p50 / p99, {what} (ms; presence → subject) | " + " | ".join(
            (f"{rows[s][f'{k}_join_p50']:.1f} / {rows[s][f'{k}_join_p99']:.1f}" if rows.get(s, {}).get(f"{k}_join_p99") is not None else "n/a") for s in servers) + " |")
        o.append(f"| Server CPU per join, {what} (ms) | " + " | ".join(cell(s, f"{k}_join_cpu", "{:.2f}") for s in servers) + " |")
        o.append(f"| Saturation, {what} (messages sent/s, p99 per copy ≤ bound) | " + " | ".join(
            (cell(s, f"{k}_sat", "{:,.0f}") + (" (≥: ramp end)" if rows.get(s, {}).get(f"{k}_sat") and not rows[s].get(f"{k}_sat_reached", True) else "")) for s in servers) + " |")
        o.append(f"| Copies delivered/s at that rate, {what} | " + " | ".join(cell(s, f"{k}_sat_copies", "{:,.0f}") for s in servers) + " |")
        o.append(f"| p99 per copy / p99 until the last occupant got it, {what} (ms) | " + " | ".join(
            (f"{rows[s][f'{k}_p99']:.1f} / {rows[s][f'{k}_last_p99']:.1f}" if rows.get(s, {}).get(f"{k}_p99") is not None else "n/a") for s in servers) + " |")
        o.append(f"| Server CPU at that rate, {what} (% of one core; µs per copy) | " + " | ".join(
            (f"{rows[s][f'{k}_cpu']:.0f}% ({rows[s][f'{k}_us']:.1f} µs)" if rows.get(s, {}).get(f"{k}_cpu") is not None and rows[s].get(f"{k}_us") is not None else "n/a") for s in servers) + " |")
elif pep:
    some = next((rows[s] for s in servers if rows.get(s, {}).get("pep_layout")), {})
    o.append(f"| Login storm, {some.get('pep_layout', '?')} (logins/s) | " + " | ".join(cell(s, "pep_rate", "{:,.0f}") for s in servers) + " |")
    o.append("| Notifications per login, received / expected | " + " | ".join(
        (f"{rows[s]['pep_recv']:.1f} / {rows[s]['pep_exp']:.1f}" if rows.get(s, {}).get("pep_exp") is not None else "n/a") for s in servers) + " |")
    o.append("| Logins that got every expected item | " + " | ".join(rows.get(s, {}).get("pep_complete", "n/a") for s in servers) + " |")
    o.append("| Connect → last notification p50 / p99 (ms) | " + " | ".join(
        (f"{rows[s]['pep_p50']:.1f} / {rows[s]['pep_p99']:.1f}" if rows.get(s, {}).get("pep_p99") is not None else "n/a") for s in servers) + " |")
    o.append("| Server CPU per login, notifications included (ms) | " + " | ".join(cell(s, "pep_cpu", "{:.2f}") for s in servers) + " |")
    o.append("| KiB received per login after binding | " + " | ".join(cell(s, "pep_kib", "{:.1f}") for s in servers) + " |")
    o.append("| Memory per session (KiB RSS) | " + " | ".join(cell(s, "pep_mem", "{:.1f}") for s in servers) + " |")
    o.append("| Setup: subscriptions and publications over XMPP (s) | " + " | ".join(
        (f"{rows[s]['pep_setup']:.1f} (publications only: rosters provisioned)" if rows.get(s, {}).get("pep_setup_files") else cell(s, "pep_setup", "{:.1f}")) for s in servers) + " |")
elif upload:
    def pair(s, a, b, fmt):
        v = rows.get(s, {})
        return f"{fmt.format(v[a])} / {fmt.format(v[b])}" if v.get(a) is not None and v.get(b) is not None else "n/a"
    for k in ("up_big", "up_parallel"):
        some = next((rows[s][f"{k}_what"] for s in servers if rows.get(s, {}).get(f"{k}_what")), None)
        if some is None:
            continue
        what = some
        o.append(f"| {what}: MiB/s up / down | " + " | ".join(pair(s, f"{k}_upload_mibs", f"{k}_download_mibs", "{:,.1f}") for s in servers) + " |")
        o.append(f"| {what}: per-file p50 / p99 up (ms) | " + " | ".join(pair(s, f"{k}_upload_p50", f"{k}_upload_p99", "{:,.0f}") for s in servers) + " |")
        o.append(f"| {what}: per-file p50 / p99 down (ms) | " + " | ".join(pair(s, f"{k}_download_p50", f"{k}_download_p99", "{:,.0f}") for s in servers) + " |")
        o.append(f"| {what}: server RSS growth, max − before, up / down (MiB) | " + " | ".join(pair(s, f"{k}_upload_rss", f"{k}_download_rss", "{:.1f}") for s in servers) + " |")
        o.append(f"| {what}: server CPU per MiB up / down (ms) | " + " | ".join(pair(s, f"{k}_upload_cpu", f"{k}_download_cpu", "{:.1f}") for s in servers) + " |")
elif not archive:
    o.append("| Idle sessions held | " + " | ".join(cell(s, "sessions", "{:,}") for s in servers) + " |")
    o.append("| Memory per idle session (KiB RSS) | " + " | ".join(cell(s, "mem", "{:.1f}") for s in servers) + " |")
    setup = {"plain": "plain TCP", "starttls": "STARTTLS", "direct": "direct TLS"}.get(tls, tls)
    if websocket:
        setup = "WebSocket upgrade" + (" over TLS" if tls == "direct" else "")
    o.append(f"| Connection rate (sessions/s, {setup} + SASL + bind + presence) | " + " | ".join(cell(s, "rate", "{:,.0f}") for s in servers) + " |")
    o.append("| Server CPU per session setup (ms) | " + " | ".join(cell(s, "cpu_per_session", "{:.2f}") for s in servers) + " |")
    o.append("| Session setup p99 during the storm (ms) | " + " | ".join(cell(s, "setup_p99", "{:.0f}") for s in servers) + " |")
if not muc and not pep and not upload:
    o.append("| o2o saturation (delivered msg/s, p99 ≤ bound) | " + " | ".join(
    (cell(s, "sat", "{:,.0f}") + (" (≥: ramp end)" if rows.get(s, {}).get("sat") and not rows[s].get("sat_reached", True) else "")) for s in servers) + " |")
    o.append("| p99 latency at that rate (ms) | " + " | ".join(cell(s, "sat_p99", "{:.1f}") for s in servers) + " |")
    o.append("| Server CPU at that rate (% of one core; load generator in brackets) | " + " | ".join(
    (f"{rows[s]['sat_cpu']:.0f}% [{rows[s].get('sat_cli_cpu') or 0:.0f}%]" if rows.get(s, {}).get("sat_cpu") is not None else "n/a") for s in servers) + " |")
    o.append("| Server CPU per delivered message at that rate (µs) | " + " | ".join(cell(s, "us_per_msg", "{:.1f}") for s in servers) + " |")
    o.append("| Cost per billion delivered messages | " + " | ".join(cell(s, "cost", "{:.3f}") for s in servers) + " |")
if archive:
    any_row = next((rows[s] for s in servers if rows.get(s, {}).get("archive_users")), {})
    o.append("| Archive fill (delivered msg/s, " + f"{any_row.get('archive_fill', 0)} per user) | " + " | ".join(cell(s, "fill_rate", "{:,.0f}") for s in servers) + " |")
    for kind in ("latest", "by-id", "with"):
        if not any(f"q_{kind}_qps" in rows.get(s, {}) for s in servers):
            continue
        o.append(f"| MAM `{kind}` page p50 / p99 (ms) | " + " | ".join(
            (f"{rows[s][f'q_{kind}_p50']:.1f} / {rows[s][f'q_{kind}_p99']:.1f}" if rows.get(s, {}).get(f"q_{kind}_p99") is not None else "n/a") for s in servers) + " |")
    o.append(f"| MAM queries/s ({any_row.get('archive_users', '?')} users, closed loop, page {any_row.get('archive_page', '?')}) | " + " | ".join(cell(s, "q_total", "{:,.0f}") for s in servers) + " |")
o.append("")
for s in servers:
    if rows.get(s, {}).get("sat_note"):
        o.append(f"- {names.get(s, s)} o2o: {rows[s]['sat_note']}.")
    for k, what in (("muc", "rooms"), ("muc_big", "one big room")):
        if rows.get(s, {}).get(f"{k}_note"):
            o.append(f"- {names.get(s, s)} muc, {what}: {rows[s][f'{k}_note']}.")
for n in notes:
    o.append(f"- {n}")
o.append("\nLoad average before each run (other jobs shared this machine):\n")
o.append("```")
o.append(open(os.path.join(run_root, "load.txt")).read().rstrip())
o.append("```")
o.append("\nExact commands (run by `bench/compare.sh`):\n")
o.append("```")
o.append(open(os.path.join(run_root, "commands.txt")).read().rstrip())
o.append("```")
o.append(f"\nRaw JSON results: `{run_root}/results/`.\n")

if not os.path.exists(out):
    with open(out, "w") as f:
        f.write("# Benchmarks\n\nMeasured with `starling-bench` (crates/bench) and `bench/compare.sh`. "
                "Each section is one dated run; newest last.\n")
with open(out, "a") as f:
    f.write("\n".join(o) + "\n")
print("\n".join(o))
PY
log "appended results to $OUT"
