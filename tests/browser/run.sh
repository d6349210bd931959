#!/usr/bin/env bash
# The web chat in a real browser: starts a short-lived Starling on loopback
# (fresh data dir, free ports, the Converse.js web chat and HTTP file upload
# on), creates three accounts, and runs the playwright-core tests in test/
# against it with Debian's chromium (CHROMIUM, default /usr/bin/chromium; no
# browser is downloaded). Screenshots of failed tests, and the XMPP frames
# each page exchanged, are kept in ARTIFACTS (default
# tests/browser/artifacts). Stops the server whatever happens. The server's
# admin listener is on a free loopback port too, with an admin token made by
# `starling admin token create` (ADMIN_URL and ADMIN_TOKEN for
# test/admin.test.js, the web admin page).
#
#   STARLING_BIN  the binary to test (default: target/debug/starling, built if missing)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${STARLING_BIN:-${CARGO_TARGET_DIR:-$root/target}/debug/starling}"
if [ ! -x "$bin" ]; then
  (cd "$root" && cargo build -q -p starling-server)
fi
export CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
[ -x "$CHROMIUM" ] || { echo "browser tests: $CHROMIUM not found (apt-get install chromium)" >&2; exit 2; }
"$root/scripts/fetch-webclient.sh"
if [ ! -d "$here/node_modules/playwright-core" ]; then
  (cd "$here" && npm ci --no-audit --no-fund --ignore-scripts --silent)
fi

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

[http]
web_client_dir = "$root/web/node_modules/converse.js/dist"

[[http.listen]]
address = "127.0.0.1:$p2"
tls = false

# The web admin page for admin.test.js.
[admin]
listen = ["127.0.0.1:$p3"]

# XEP-0363 for upload.test.js: URLs default to this listener, the page's origin.
[modules.upload]
enabled = true
CFG
for u in alice bob carol; do
  echo "pw-$u" | "$bin" --config "$work/starling.toml" user add "$u@localhost" >/dev/null
done
ADMIN_TOKEN="$("$bin" --config "$work/starling.toml" admin token create --name browser-tests)"
export ADMIN_TOKEN
export ADMIN_URL="http://127.0.0.1:$p3"
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

export WEBCHAT_URL="http://localhost:$p2/"
export ARTIFACTS="${ARTIFACTS:-$here/artifacts}"
mkdir -p "$ARTIFACTS"
rc=0
(cd "$here" && npm test --silent) || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "--- last server log lines ---" >&2
  tail -n 40 "$work/server.log" >&2
  echo "screenshots: $ARTIFACTS" >&2
fi
exit "$rc"
