# shellcheck shell=bash
# Sourced by the scripts that start a Starling in the background:
#
#   . scripts/ready.sh
#   "$bin" --config ... >"$log" 2>&1 & pid=$!
#   wait_ready "$log" "$pid" [TIMEOUT_SECS]
#
# Readiness is the server's own "Starling is ready" log line (written after
# storage, TLS and every listener are up), not a port accepting a connection:
# the port may belong to something else, and the self-signed certificate is
# only on disk once the line is logged. Returns 0 when the line appears;
# otherwise prints the server's log and the reason (it exited, with its
# status, or TIMEOUT_SECS, default 60, passed) and returns 1. A function, not
# a script: only the shell that started the server can see it exit.
wait_ready() {
  local log="$1" pid="$2" timeout="${3:-60}" rc=0
  local deadline=$((SECONDS + timeout))
  while ! grep -q "Starling is ready" "$log" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid" 2>/dev/null || rc=$?
      echo "--- server log ($log) ---" >&2
      cat "$log" >&2 || true
      echo "wait_ready: the server (pid $pid) exited with status $rc before it was ready" >&2
      return 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "--- server log ($log) ---" >&2
      cat "$log" >&2 || true
      echo "wait_ready: the server (pid $pid) was not ready after ${timeout} s" >&2
      return 1
    fi
    sleep 0.1
  done
}
