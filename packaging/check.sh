#!/usr/bin/env bash
# Packaging checks (scripts/test-all.sh, "packaging: image build and checks";
# docs/deployment.md, "What was verified here, and how"):
#
#  - the container image: packaging/verify-image.sh around the debug binary
#    (podman build FROM scratch, image configuration and filesystem, the
#    binary run inside that filesystem as user 10001);
#  - every shipped Starling configuration (compose nodes, systemd example)
#    through `starling check-config`, nats.conf through `nats-server -t` and
#    haproxy.cfg through `haproxy -c` where those are installed;
#  - the systemd unit: `systemd-analyze verify` and its exposure score
#    (`systemd-analyze security --offline`), where systemd-analyze exists;
#  - compose.yaml against the compose-spec schema (check-jsonschema) and
#    yamllint, from PyPI in packaging/.venv (pinned, installed on first use);
#  - the Helm chart: `helm lint` and `helm template` checked by
#    check-manifests.py, yamllint and check-config when helm is on PATH;
#    otherwise Chart.yaml and values.yaml parse and every template names its
#    apiVersion and kind (CI does not build helm).
#
# Usage (as root): packaging/check.sh [BINARY]   (default target/debug/starling)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-${STARLING_BIN:-${CARGO_TARGET_DIR:-target}/debug/starling}}
[ -x "$bin" ] || { echo "check: no starling binary at $bin (cargo build -p starling-server)" >&2; exit 1; }
bin=$(realpath "$bin")
say() { printf 'packaging: %s\n' "$*"; }
tmp=$(mktemp -d /tmp/starling-packaging.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# -- the image
packaging/verify-image.sh "$bin"

# -- configuration files
for f in packaging/compose/node1.toml packaging/compose/node2.toml packaging/compose/node3.toml \
  packaging/systemd/starling.toml; do
  # The nodes take the database URL from the environment (compose.yaml).
  out=$(STARLING_DATABASE_URL=postgres://starling@postgres/starling "$bin" --config "$f" check-config 2>&1) ||
    { echo "$out" >&2; echo "check-config $f failed" >&2; exit 1; }
  # (the compose nodes' admin listener is on 0.0.0.0 on purpose: its warning is expected)
  say "check-config: $(echo "$out" | grep -v '^warning: \[admin\] listen 0.0.0.0:5290' | tail -n 1)"
done
nats=$(command -v nats-server || ls /usr/sbin/nats-server 2>/dev/null || true)
if [ -n "$nats" ]; then
  "$nats" -c packaging/compose/nats.conf -t
else
  say "nats-server not installed: compose/nats.conf not checked"
fi
if command -v haproxy >/dev/null; then
  # Warnings: the compose service names do not resolve outside compose.
  haproxy -c -q -f packaging/compose/haproxy.cfg && say "compose/haproxy.cfg valid (haproxy -c)"
else
  say "haproxy not installed: compose/haproxy.cfg not checked"
fi

# -- the systemd unit
if command -v systemd-analyze >/dev/null; then
  # verify wants ExecStart's binary to exist: point it at this one.
  sed "s#/usr/local/bin/starling#$bin#g" packaging/systemd/starling.service >"$tmp/starling.service"
  systemd-analyze verify "$tmp/starling.service"
  exposure=$(systemd-analyze security --offline=yes "$tmp/starling.service" 2>&1 |
    sed -n 's/.*Overall exposure level for starling.service: \([0-9.]*\).*/\1/p')
  [ -n "$exposure" ] || { echo "systemd-analyze security gave no exposure level" >&2; exit 1; }
  say "systemd unit verified; exposure level $exposure (systemd-analyze security --offline)"
  awk -v e="$exposure" 'BEGIN { exit !(e <= 2.0) }' ||
    { echo "systemd unit exposure $exposure is above 2.0: a hardening setting was lost" >&2; exit 1; }
else
  say "systemd-analyze not installed: the unit was not verified"
fi

# -- YAML: compose schema, yamllint, Helm
venv=packaging/.venv
if [ ! -x "$venv/bin/check-jsonschema" ] || [ ! -x "$venv/bin/yamllint" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check check-jsonschema==0.39.0 yamllint==1.38.0
fi
"$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec packaging/compose.yaml
"$venv/bin/yamllint" -c packaging/yamllint.yaml packaging/compose.yaml \
  packaging/helm/starling/Chart.yaml packaging/helm/starling/values.yaml
say "compose.yaml valid (compose-spec schema), YAML files pass yamllint"

chart=packaging/helm/starling
if command -v helm >/dev/null; then
  set_args=(--set database.url=postgres://starling:pw@postgres/starling --set nats.url=nats://nats:4222)
  helm lint --strict "$chart" "${set_args[@]}" >"$tmp/lint.log" || { cat "$tmp/lint.log"; exit 1; }
  helm template check "$chart" "${set_args[@]}" >"$tmp/rendered.yaml"
  "$venv/bin/yamllint" -c packaging/yamllint.yaml "$tmp/rendered.yaml"
  "$venv/bin/python" packaging/check-manifests.py "$tmp/rendered.yaml" "$tmp/nodes"
  for f in "$tmp"/nodes/*.toml; do
    STARLING_DATABASE_URL=postgres://x@db/x "$bin" --config "$f" check-config >/dev/null 2>&1 ||
      { "$bin" --config "$f" check-config; exit 1; }
  done
  say "Helm chart: helm lint --strict, helm template, manifests and node configurations ok"
else
  "$venv/bin/python" - "$chart" <<'PY'
import pathlib, re, sys, yaml
chart = pathlib.Path(sys.argv[1])
meta = yaml.safe_load((chart / "Chart.yaml").read_text())
assert meta["apiVersion"] == "v2" and meta["name"] == "starling", meta
values = yaml.safe_load((chart / "values.yaml").read_text())
for key in ("replicaCount", "image", "database", "nats", "service", "podSecurityContext", "securityContext"):
    assert key in values, f"values.yaml: no {key}"
n = 0
for t in sorted((chart / "templates").glob("*.yaml")):
    text = t.read_text()
    assert re.search(r"(?m)^apiVersion: ", text) and re.search(r"(?m)^kind: ", text), f"{t}: no apiVersion/kind"
    assert text.count("{{") == text.count("}}"), f"{t}: unbalanced template braces"
    n += 1
print(f"packaging: helm not installed: Chart.yaml and values.yaml parse, {n} templates name apiVersion and kind")
PY
fi
say "all packaging checks passed"
