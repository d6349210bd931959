#!/usr/bin/env bash
# A throw-away PostgreSQL cluster for the test suite, on loopback only.
#
#   scripts/pg-test.sh start   # initdb on first use, start, wait until ready (idempotent)
#   scripts/pg-test.sh stop    # stop it (the data directory is removed)
#   scripts/pg-test.sh url     # print the admin URL for STARLING_TEST_PG_URL
#   scripts/pg-test.sh status  # exit 0 when it accepts connections
#
# Environment: STARLING_PG_DIR (default /tmp/starling-pg-test), STARLING_PG_PORT
# (default 55432), STARLING_PG_BIN (default: the newest
# /usr/lib/postgresql/*/bin, else the directory of pg_ctl on PATH),
# STARLING_PG_DURABLE=1 (benchmarks: keep fsync, full_page_writes and
# synchronous_commit on, as a real deployment would, with 1 GB of
# shared_buffers; applies when the cluster is created).
#
# Authentication is `trust` for 127.0.0.1 only and the server listens on
# 127.0.0.1 only: never point this at a data directory you care about.
set -euo pipefail

dir="${STARLING_PG_DIR:-/tmp/starling-pg-test}"
port="${STARLING_PG_PORT:-55432}"
data="$dir/data"
log="$dir/postgres.log"

find_bin() {
  if [ -n "${STARLING_PG_BIN:-}" ]; then
    echo "$STARLING_PG_BIN"
    return
  fi
  local newest
  newest=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -n "$newest" ] && [ -x "$newest/initdb" ]; then
    echo "$newest"
    return
  fi
  if command -v pg_ctl >/dev/null 2>&1; then
    dirname "$(command -v pg_ctl)"
    return
  fi
  echo "pg-test.sh: no PostgreSQL binaries found (install the postgresql package, or set STARLING_PG_BIN)" >&2
  exit 1
}

# PostgreSQL refuses to run as root: run its tools as `postgres` then.
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then
    if command -v runuser >/dev/null 2>&1; then
      runuser -u postgres -- "$@"
    else
      su postgres -s /bin/sh -c "$(printf '%q ' "$@")"
    fi
  else
    "$@"
  fi
}

url() { echo "postgres://postgres@127.0.0.1:$port/postgres"; }

ready() { as_pg "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -d postgres; }

start() {
  if [ ! -f "$data/PG_VERSION" ]; then
    mkdir -p "$dir"
    if [ "$(id -u)" -eq 0 ]; then
      chown postgres: "$dir"
    fi
    as_pg "$bin/initdb" -D "$data" -U postgres -E UTF8 --locale=C \
      --auth=trust --auth-local=trust >/dev/null
    # Test-only settings. fsync, full_page_writes and synchronous_commit are
    # off: a crash of this cluster may lose or corrupt its data, which is
    # fine for throw-away test databases and makes them much faster. Never
    # copy these settings to a real deployment.
    cat >>"$data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
max_connections = 300
log_min_messages = warning
log_checkpoints = off
EOF
    if [ "${STARLING_PG_DURABLE:-0}" = 1 ]; then
      cat >>"$data/postgresql.conf" <<EOF
shared_buffers = 1GB
max_wal_size = 4GB
EOF
    else
      cat >>"$data/postgresql.conf" <<EOF
shared_buffers = 128MB
fsync = off
full_page_writes = off
synchronous_commit = off
EOF
    fi
    # TLS with a throw-away self-signed certificate, so tests can check
    # sslmode=require (plain connections keep working).
    if command -v openssl >/dev/null 2>&1; then
      as_pg openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=127.0.0.1 \
        -keyout "$data/server.key" -out "$data/server.crt" >/dev/null 2>&1
      echo "ssl = on" >>"$data/postgresql.conf"
    fi
    # Only loopback TCP, no password (trust): a test cluster.
    cat >"$data/pg_hba.conf" <<EOF
local all all trust
host  all all 127.0.0.1/32 trust
EOF
  fi
  if ready; then
    return 0
  fi
  as_pg "$bin/pg_ctl" -D "$data" -l "$log" -w -t 60 -o "-p $port" start >/dev/null
  for _ in $(seq 1 100); do
    ready && return 0
    sleep 0.1
  done
  echo "pg-test.sh: PostgreSQL did not become ready; see $log" >&2
  exit 1
}

stop() {
  if [ -f "$data/postmaster.pid" ]; then
    as_pg "$bin/pg_ctl" -D "$data" -m fast -w stop >/dev/null || true
  fi
  rm -rf "$dir"
}

bin=$(find_bin)
case "${1:-}" in
  start) start; url ;;
  stop) stop ;;
  url) url ;;
  status) ready ;;
  *) echo "usage: $0 start|stop|url|status" >&2; exit 2 ;;
esac
