#!/usr/bin/env bash
# The abuse suite (tests/abuse/README.md): starts a short-lived Starling on
# loopback with small limits, attacks it, asserts the bounds, and writes the
# table to target/abuse-report.md. Python 3 standard library only.
#
#   STARLING_BIN  the binary to test (default: target/debug/starling)
#   tests/abuse/run.sh [--long] [--soak MINUTES] [--only NAME,...] [--list]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
export STARLING_BIN="${STARLING_BIN:-$target_dir/debug/starling}"
if [ ! -x "$STARLING_BIN" ]; then
  echo "abuse: no server binary at $STARLING_BIN: run 'cargo build --workspace' or set STARLING_BIN" >&2
  exit 2
fi
exec python3 "$here/abuse.py" --report "$target_dir/abuse-report.md" "$@"
