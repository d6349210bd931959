#!/usr/bin/env bash
# Dev aid: run a throw-away Prosody (Debian package `prosody`) in the
# foreground on 127.0.0.1:15222 (STARTTLS) and 127.0.0.1:15223 (direct TLS)
# with IBR enabled and a fresh self-signed certificate for "localhost".
# All state lives in a temp dir that is removed on exit.
#
#   apt-get install -y prosody   # once
#   tests/interop/dev/run-prosody.sh          # Ctrl-C (or kill its pid) to stop
#
# Then, in another shell:
#   XMPP_STARTTLS_PORT=15222 XMPP_TLS_PORT=15223 tests/interop/run.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v prosody >/dev/null || { echo "prosody not installed (apt-get install -y prosody)" >&2; exit 1; }

dir="$(mktemp -d /tmp/starling-interop-prosody.XXXXXX)"
export STARLING_PROSODY_DIR="$dir"
mkdir -p "$dir/data"
openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=localhost" \
  -addext "subjectAltName=DNS:localhost" \
  -keyout "$dir/localhost.key" -out "$dir/localhost.crt" 2>/dev/null
cp "$dir/localhost.crt" "$dir/ca.crt"

# Prosody refuses to run as root unless it can drop privileges; in a root
# dev container make the temp dir owned by the prosody user and run as it.
if [ "$(id -u)" = 0 ] && id prosody >/dev/null 2>&1; then
  chown -R prosody:prosody "$dir"
  chmod 755 "$dir"
  run=(runuser -u prosody --preserve-environment --)
else
  run=()
fi
echo "prosody dir: $dir (CA/cert: $dir/ca.crt, log: $dir/prosody.log)" >&2
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 0' INT TERM
"${run[@]}" prosody --config "$here/prosody.cfg.lua" -F &
pid=$!
wait "$pid"
