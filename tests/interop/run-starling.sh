#!/usr/bin/env bash
# Start a short-lived Starling on loopback (fresh data dir, free ports,
# in-band registration on) and run the third-party-client interop suites
# (tests/interop/run.sh) against it. Stops the server whatever happens.
#
#   STARLING_BIN  the binary to test (default: target/debug/starling, built if missing)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${STARLING_BIN:-${CARGO_TARGET_DIR:-$root/target}/debug/starling}"
if [ ! -x "$bin" ]; then
  (cd "$root" && cargo build -q -p starling-server)
fi

# Three distinct free ports: the sockets are bound at once, so the kernel
# cannot hand out the same port twice.
read -r p1 p2 p3 < <(python3 -c 'import socket
s = [socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
work="$(mktemp -d)"
cat > "$work/starling.toml" <<CFG
[server]
data_dir = "$work/data"

[[listen]]
address = "127.0.0.1:$p1"
tls = "starttls"

[[listen]]
address = "127.0.0.1:$p2"
tls = "direct"

[[http.listen]]
address = "127.0.0.1:$p3"
tls = false

# No admin listener: its default port (5290) would collide with another
# suite's server (scripts/test-all.sh runs them at the same time).
[admin]
listen = []

[modules.register]
enabled = true
max_per_ip = 100000

[modules.upload]
enabled = true
CFG

"$bin" --config "$work/starling.toml" > "$work/server.log" 2>&1 &
pid=$!
cleanup() {
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
. "$root/scripts/ready.sh"
wait_ready "$work/server.log" "$pid" 60

# rustls offers no tls-unique (RFC 5929 §3, undefined for TLS 1.3), the only
# channel binding slixmpp implements: its -PLUS tests cannot apply here.
# Starling's -PLUS (tls-exporter, tls-server-end-point) is covered by
# crates/server/tests/scenarios/negotiation.rs.
rc=0
XMPP_HOST=127.0.0.1 XMPP_DOMAIN=localhost XMPP_STARTTLS_PORT="$p1" XMPP_TLS_PORT="$p2" \
  XMPP_WS_URL="ws://127.0.0.1:$p3/xmpp-websocket" \
  XMPP_SKIP_TLS_UNIQUE=1 XMPP_CA_FILE="$work/data/tls/cert.pem" \
  "$here/run.sh" || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "--- last server log lines ---" >&2
  tail -n 40 "$work/server.log" >&2
fi
exit "$rc"
