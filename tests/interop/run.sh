#!/usr/bin/env bash
# Run the third-party-client interop tests (slixmpp + @xmpp/client) against
# an ALREADY RUNNING XMPP server.  This script never starts a server.
#
# Environment (defaults in parentheses), see README.md:
#   XMPP_HOST (127.0.0.1)  XMPP_DOMAIN (localhost)
#   XMPP_STARTTLS_PORT (5222)  XMPP_TLS_PORT (5223)
#   XMPP_CA_FILE (unset => TLS certificates are not verified)
#   XMPP_TEST_TIMEOUT (20 s per test)   XMPP_SKIP_TLS_UNIQUE (unset)
#   PYTHON (python3) interpreter used to create the venv
#
# Exit status: non-zero if either suite fails (both suites always run).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

export XMPP_HOST="${XMPP_HOST:-127.0.0.1}"
export XMPP_DOMAIN="${XMPP_DOMAIN:-localhost}"
export XMPP_STARTTLS_PORT="${XMPP_STARTTLS_PORT:-5222}"
export XMPP_TLS_PORT="${XMPP_TLS_PORT:-5223}"
export XMPP_TEST_TIMEOUT="${XMPP_TEST_TIMEOUT:-20}"
if [ -n "${XMPP_CA_FILE:-}" ]; then
  [ -r "$XMPP_CA_FILE" ] || { echo "run.sh: XMPP_CA_FILE=$XMPP_CA_FILE is not readable" >&2; exit 2; }
  XMPP_CA_FILE="$(cd "$(dirname "$XMPP_CA_FILE")" && pwd)/$(basename "$XMPP_CA_FILE")"
  export XMPP_CA_FILE
fi

# --- Python: venv in tests/interop/.venv, reinstalled only when the pins change
venv="$here/.venv"
req="$here/python/requirements.txt"
stamp="$venv/.requirements.sha256"
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
  echo "$want" > "$stamp"
fi

# --- Node: node_modules from the committed package-lock.json
if [ ! -d "$here/node/node_modules/@xmpp/client" ]; then
  (cd "$here/node" && npm ci --no-audit --no-fund --silent)
fi

echo "interop: server ${XMPP_HOST} domain=${XMPP_DOMAIN} starttls=${XMPP_STARTTLS_PORT} tls=${XMPP_TLS_PORT}" >&2

py_rc=0
(cd "$here/python" && "$venv/bin/python" -m pytest -q -rfEs) || py_rc=$?

node_rc=0
(cd "$here/node" && npm test --silent) || node_rc=$?

echo "interop: slixmpp suite exit=${py_rc}, @xmpp/client suite exit=${node_rc}" >&2
if [ "$py_rc" -ne 0 ] || [ "$node_rc" -ne 0 ]; then
  exit 1
fi
