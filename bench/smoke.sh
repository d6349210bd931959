#!/usr/bin/env bash
# End-to-end smoke test of starling-bench against a short-lived Starling on
# loopback: a handful of users, a few seconds of one-to-one chat over TCP,
# WebSocket and BOSH, with and without stream management, users spread
# over three domains added at run time (--domains), a resumption
# run, a few seconds of multi-user chat (XEP-0045: rooms created, locked,
# configured, entered, messages to every occupant), the same with MUC Light
# (rooms created with their members, messages to every member's bare JID),
# a personal eventing login storm (XEP-0163: contacts subscribed and items
# published over XMPP, then logins with +notify caps, each counting the
# last items it gets), a small HTTP File Upload run (XEP-0363: slots, PUT
# and GET over the HTTP listener, bytes verified), and assertions that
# (nearly) every message was delivered.
#
#   STARLING_BIN=target/debug/starling BENCH_BIN=target/debug/starling-bench bench/smoke.sh
#
# Defaults: target/release/… if present, else target/debug/…. Exits non-zero
# on any failure. Takes about 30 seconds plus account creation.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$root/target}
pick() { # first existing of release/debug
    if [[ -x "$target_dir/release/$1" ]]; then echo "$target_dir/release/$1"; else echo "$target_dir/debug/$1"; fi
}
STARLING_BIN=${STARLING_BIN:-$(pick starling)}
BENCH_BIN=${BENCH_BIN:-$(pick starling-bench)}
USERS=${SMOKE_USERS:-8}
# The muc and muc-light runs: 4 rooms of 5.
MUC_USERS=20
ACCOUNTS=$(( USERS > MUC_USERS ? USERS : MUC_USERS ))
for b in "$STARLING_BIN" "$BENCH_BIN"; do
    [[ -x "$b" ]] || { echo "smoke: missing binary $b (build it first)" >&2; exit 1; }
done

# A free loopback port (the kernel picks it; tiny race window, fine for CI).
read -r port hport < <(python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
work=$(mktemp -d "${TMPDIR:-/tmp}/starling-smoke.XXXXXX")
pid=
cleanup() {
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/starling.toml" <<TOML
[server]
data_dir = "$work/data"
shutdown_timeout_secs = 2

[[listen]]
address = "127.0.0.1:$port"
tls = "starttls"

[[http.listen]]
address = "127.0.0.1:$hport"
tls = false

# No admin listener: its default port (5290) would collide with another
# suite's server (test-all.sh runs them at the same time).
[admin]
listen = []

[c2s]
require_tls = false
max_bytes_per_second = 0

[modules.ping]
interval_secs = 0

[modules.muc_light]
enabled = true

[modules.upload]
enabled = true
quota_per_user = 0
TOML

"$BENCH_BIN" provision --method starling-import --starling-bin "$STARLING_BIN" \
    --starling-config "$work/starling.toml" --iterations 4096 \
    --users "$ACCOUNTS" --password 'pw{n}' --domain localhost >"$work/provision.log" 2>&1 \
    || { cat "$work/provision.log" >&2; echo "smoke: account import failed" >&2; exit 1; }

# Three domains added at run time (docs/domains.md) and USERS accounts
# spread over them (user n on d<((n-1) mod 3)+1>.smoke), for the --domains run.
for d in d1.smoke d2.smoke d3.smoke; do
    "$STARLING_BIN" --config "$work/starling.toml" domain add "$d" >>"$work/provision.log" 2>&1 \
        || { cat "$work/provision.log" >&2; echo "smoke: domain add $d failed" >&2; exit 1; }
done
"$BENCH_BIN" provision --method starling-import --force --starling-bin "$STARLING_BIN" \
    --starling-config "$work/starling.toml" --iterations 4096 \
    --users "$USERS" --password 'pw{n}' --domains 3 --domain-pattern 'd{n}.smoke' >>"$work/provision.log" 2>&1 \
    || { cat "$work/provision.log" >&2; echo "smoke: account import over 3 domains failed" >&2; exit 1; }

"$STARLING_BIN" --config "$work/starling.toml" >"$work/server.log" 2>&1 &
pid=$!
. "$root/scripts/ready.sh"
wait_ready "$work/server.log" "$pid" 60 || { echo "smoke: the server did not start" >&2; exit 1; }

# STARTTLS + SCRAM-SHA-256, two short ramp steps; --require-ratio fails the
# run unless every session is up and >= 99 % of messages arrived.
"$BENCH_BIN" o2o --port "$port" --users "$USERS" --password 'pw{n}' \
    --tls starttls --mechanism SCRAM-SHA-256 \
    --rates 20,50 --step-secs 2 --drain-secs 1 --stop-after-fails 0 \
    --require-ratio 0.99 --json --quiet >"$work/result.json" 2>"$work/bench.log" \
    || { cat "$work/bench.log" "$work/server.log" >&2; echo "smoke: o2o run failed" >&2; exit 1; }

# Plain TCP (require_tls = false) with SCRAM-SHA-1: the connect scenario.
"$BENCH_BIN" connect --port "$port" --users "$USERS" --password 'pw{n}' \
    --tls plain --mechanism SCRAM-SHA-1 --require-ratio 1 --quiet >"$work/bench.log" 2>&1 \
    || { cat "$work/bench.log" "$work/server.log" >&2; echo "smoke: connect run failed" >&2; exit 1; }

# --domains: the same number of users spread over the three stored domains
# (stream 'to', SNI and JIDs per user; each message to its recipient's domain).
"$BENCH_BIN" o2o --port "$port" --users "$USERS" --password 'pw{n}' \
    --domains 3 --domain-pattern 'd{n}.smoke' --tls starttls --mechanism SCRAM-SHA-256 \
    --rates 20 --step-secs 2 --drain-secs 1 --stop-after-fails 0 \
    --require-ratio 0.99 --json --quiet >"$work/domains.json" 2>"$work/bench.log" \
    || { cat "$work/bench.log" "$work/server.log" >&2; echo "smoke: o2o over 3 domains failed" >&2; exit 1; }
python3 - "$work/domains.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["target"]["domain"] == "d{n}.smoke x 3", r["target"]
assert r["connect"]["established"] == r["users"], r["connect"]
s = r["o2o"]["steps"][0]
assert s["sent"] > 0 and s["delivered"] >= 0.99 * s["sent"], s
print(f"smoke: OK: --domains 3: {r['connect']['established']} sessions over 3 domains, "
      f"{s['delivered']}/{s['sent']} messages delivered")
PY

# RFC 7395 WebSocket on the HTTP listener: the o2o scenario again.
"$BENCH_BIN" o2o --port "$hport" --transport websocket --tls plain --users "$USERS" \
    --password 'pw{n}' --mechanism SCRAM-SHA-256 \
    --rates 20 --step-secs 2 --drain-secs 1 --stop-after-fails 0 \
    --require-ratio 0.99 --quiet >"$work/bench.log" 2>&1 \
    || { cat "$work/bench.log" "$work/server.log" >&2; echo "smoke: o2o over WebSocket failed" >&2; exit 1; }

# XEP-0124/0206 BOSH on the HTTP listener: the o2o scenario once more
# (two keep-alive connections per session, one long poll held).
"$BENCH_BIN" o2o --port "$hport" --transport bosh --tls plain --users "$USERS" \
    --password 'pw{n}' --mechanism SCRAM-SHA-256 \
    --rates 20 --step-secs 2 --drain-secs 1 --stop-after-fails 0 \
    --require-ratio 0.99 --quiet >"$work/bench.log" 2>&1 \
    || { cat "$work/bench.log" "$work/server.log" >&2; echo "smoke: o2o over BOSH failed" >&2; exit 1; }

# XEP-0198: o2o with stream management on (acks both ways), then the
# resume scenario (unacked messages, dropped connections, resumption).
"$BENCH_BIN" o2o --port "$port" --sm --sm-ack-every 5 --users "$USERS" --password 'pw{n}' \
    --tls starttls --mechanism SCRAM-SHA-256 \
    --rates 20 --step-secs 2 --drain-secs 1 --stop-after-fails 0 \
    --require-ratio 0.99 --json --quiet >"$work/sm.json" 2>"$work/bench.log" \
    || { cat "$work/bench.log" "$work/server.log" >&2; echo "smoke: o2o with --sm failed" >&2; exit 1; }
"$BENCH_BIN" resume --port "$port" --users "$USERS" --password 'pw{n}' \
    --tls starttls --mechanism SCRAM-SHA-256 --unacked 5 --settle-secs 0.5 \
    --require-ratio 1 --json --quiet >"$work/resume.json" 2>"$work/bench.log" \
    || { cat "$work/bench.log" "$work/server.log" >&2; echo "smoke: resume failed" >&2; exit 1; }
# The same, resuming inline in SASL2 (XEP-0388, XEP-0198 inline resumption).
"$BENCH_BIN" resume --sasl2 --port "$port" --users "$USERS" --password 'pw{n}' \
    --tls starttls --mechanism SCRAM-SHA-256 --unacked 5 --settle-secs 0.5 \
    --require-ratio 1 --json --quiet >"$work/resume2.json" 2>"$work/bench.log" \
    || { cat "$work/bench.log" "$work/server.log" >&2; echo "smoke: resume --sasl2 failed" >&2; exit 1; }
# And with a FAST token (XEP-0484) instead of SCRAM for the resumptions.
"$BENCH_BIN" resume --sasl2 --fast --port "$port" --users "$USERS" --password 'pw{n}' \
    --tls starttls --mechanism SCRAM-SHA-256 --unacked 5 --settle-secs 0.5 \
    --require-ratio 1 --json --quiet >"$work/resume3.json" 2>"$work/bench.log" \
    || { cat "$work/bench.log" "$work/server.log" >&2; echo "smoke: resume --sasl2 --fast failed" >&2; exit 1; }

# XEP-0045: 20 users in 4 rooms of 5 (each room created by its first
# member, locked until its instant-room form, then entered by the others),
# then 3 s of groupchat messages, each to be delivered to all 5 occupants.
"$BENCH_BIN" muc --port "$port" --users "$MUC_USERS" --room-size 5 --password 'pw{n}' \
    --tls starttls --mechanism SCRAM-SHA-256 \
    --rates 20 --step-secs 3 --drain-secs 1 --stop-after-fails 0 \
    --require-ratio 0.99 --json --quiet >"$work/muc.json" 2>"$work/bench.log" \
    || { cat "$work/bench.log" "$work/server.log" >&2; echo "smoke: muc failed" >&2; exit 1; }
python3 - "$work/muc.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["muc"]
j = m["join"]
assert j["joined"] == j["attempted"] == 20 and j["created"] == m["rooms"] == 4, j
s = m["steps"][0]
assert s["sent"] > 0 and s["expected_copies"] == 5 * s["sent"], s
assert s["delivered_copies"] >= 0.99 * s["expected_copies"], s
assert s["last_copy_latency"]["count"] == s["messages_complete"] > 0, s
print(f"smoke: OK: muc: {j['joined']} joined {m['rooms']} rooms ({j['created']} created), "
      f"{s['delivered_copies']}/{s['expected_copies']} copies delivered, "
      f"last-copy p99 {s['last_copy_latency']['p99_ms']:.1f} ms")
PY

# MUC Light (urn:xmpp:muclight:0 at muclight.localhost): the same 20 users
# in 4 rooms of 5 (a run id in every room node: new rooms each run), each
# created by its first member with the 4 others as members in one iq, no
# presence in rooms; then 3 s of groupchat messages, each delivered to the
# bare JIDs of all 5 members.
"$BENCH_BIN" muc-light --port "$port" --users "$MUC_USERS" --room-size 5 --password 'pw{n}' \
    --tls starttls --mechanism SCRAM-SHA-256 --settle-secs 0 \
    --rates 20 --step-secs 3 --drain-secs 1 --stop-after-fails 0 \
    --require-ratio 0.99 --json --quiet >"$work/muc-light.json" 2>"$work/bench.log" \
    || { cat "$work/bench.log" "$work/server.log" >&2; echo "smoke: muc-light failed" >&2; exit 1; }
python3 - "$work/muc-light.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["muc_light"]
c = m["creation"]
assert c["created"] == c["attempted"] == m["rooms"] == 4 and c["members"] == 20, c
assert c["notifications_received"] == c["notifications_expected"] == 20, c
s = m["steps"][0]
assert s["sent"] > 0 and s["expected_copies"] == 5 * s["sent"], s
assert s["delivered_copies"] >= 0.99 * s["expected_copies"], s
assert s["last_copy_latency"]["count"] == s["messages_complete"] > 0, s
assert m["unexpected_copies"] == 0 and not m["errors_by_condition"], m
print(f"smoke: OK: muc-light: {c['created']} rooms created ({c['members']} members, "
      f"{c['notifications_received']} notifications), "
      f"{s['delivered_copies']}/{s['expected_copies']} copies delivered, "
      f"last-copy p99 {s['last_copy_latency']['p99_ms']:.1f} ms")
PY

# XEP-0163: the same 20 users in 4 groups of 5 mutual contacts (subscribed
# over XMPP), each publishing 3 PEP items; then all log in at once with
# caps carrying the 3 nodes' +notify: each must get the last item of every
# node of its group, its own included (5 x 3), once. Then 3 publications
# (by a user of each of the first 3 groups) must each reach the 5 online
# sessions of its group, the publisher's own included.
"$BENCH_BIN" pep --port "$port" --users "$MUC_USERS" --contacts 4 --nodes 3 --password 'pw{n}' \
    --tls starttls --mechanism SCRAM-SHA-256 --quiet-ms 500 --settle-secs 0 \
    --publishes 3 --publish-interval-ms 100 \
    --require-ratio 1 --json --quiet >"$work/pep.json" 2>"$work/bench.log" \
    || { cat "$work/bench.log" "$work/server.log" >&2; echo "smoke: pep failed" >&2; exit 1; }
python3 - "$work/pep.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["pep"]
x = p["setup"]
assert x["contacts_both"] == x["contacts_expected"] == 80 and x["published"] == x["publish_expected"] == 60, x
assert p["logins"] == 20 and p["expected"] == p["received_expected"] == 300 and p["missing"] == 0, p
assert p["duplicates"] == 0 and p["unexpected"] == 0 and p["complete_logins"] == 20, p
assert p["latency"]["count"] == 20, p["latency"]
f = p["fanout"]
assert f["sent"] == 3 and f["errors"] == 0 and f["expected"] == f["delivered"] == 15, f
assert f["complete"] == 3 and f["duplicates"] == 0 and f["last_latency"]["count"] == 3, f
print(f"smoke: OK: pep: {x['contacts_both']} contacts subscribed and {x['published']} items published "
      f"in {x['total_s']:.1f} s; {p['received_expected']}/{p['expected']} notifications at login, "
      f"p99 until the last {p['latency']['p99_ms']:.1f} ms, {p['caps_queries']} caps queries; "
      f"fan-out {f['delivered']}/{f['expected']}, p99 to the last {f['last_latency']['p99_ms']:.1f} ms")
PY

# XEP-0363: the upload service discovered at upload.localhost, one 2 MiB
# file PUT and GET over the plain HTTP listener, then 5 files of 64 KiB at
# once; every downloaded byte must equal what was uploaded.
"$BENCH_BIN" upload --port "$port" --users 2 --password 'pw{n}' \
    --tls starttls --mechanism SCRAM-SHA-256 --big-mb 2 --parallel 5 --small-kb 64 \
    --require-ratio 1 --json --quiet >"$work/upload.json" 2>"$work/bench.log" \
    || { cat "$work/bench.log" "$work/server.log" >&2; echo "smoke: upload failed" >&2; exit 1; }
python3 - "$work/upload.json" <<'PY'
import json, sys
u = json.load(open(sys.argv[1]))["upload"]
assert u["service"] == "upload.localhost" and u["discovered"] and u["scheme"] == "http", u
big, par = u["phases"]
assert (big["name"], big["files"], big["file_bytes"]) == ("big", 1, 2 << 20), big
assert (par["name"], par["files"], par["file_bytes"]) == ("parallel", 5, 64 << 10), par
for p in (big, par):
    for d in ("upload", "download"):
        t = p[d]
        assert t["ok"] == t["files"] == p["files"] and not t["failures"], (p["name"], d, t)
        assert t["bytes"] == p["files"] * p["file_bytes"] and t["mib_per_s"] > 0, (p["name"], d, t)
        assert t["latency"]["count"] == p["files"], (p["name"], d, t["latency"])
        m = t.get("memory")
        assert m is None or m["max_kb"] >= m["before_kb"] > 0, m
    assert p["slots"]["granted"] == p["verified"] == p["files"], p
print(f"smoke: OK: upload: {big['file_bytes'] >> 20} MiB up {big['upload']['mib_per_s']:.0f} MiB/s, "
      f"down {big['download']['mib_per_s']:.0f} MiB/s; {par['files']} x {par['file_bytes'] >> 10} KiB "
      f"at once, p99 up {par['upload']['latency']['p99_ms']:.1f} ms; every byte verified")
PY

python3 - "$work/sm.json" "$work/resume.json" "$work/resume2.json" "$work/resume3.json" <<'PY'
import json, sys
sm = json.load(open(sys.argv[1]))["sm"]
assert sm["requests_sent"] > 0 and sm["acks_received"] > 0 and sm["acks_sent"] > 0, sm
for f in sys.argv[2:]:
    r = json.load(open(f))["resume"]
    assert r["resumes"]["established"] == r["detached"] > 0 and r["h_mismatch"] == 0, r
print(f"smoke: OK: --sm ({sm['acks_sent']} acks sent, {sm['acks_received']} received), "
      f"{r['resumes']['established']} sessions resumed (RFC 6120 SASL, inline in SASL2, and with FAST)")
PY

python3 - "$work/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
steps = r["o2o"]["steps"]
sent = sum(s["sent"] for s in steps)
delivered = sum(s["delivered"] for s in steps)
assert r["connect"]["established"] == r["users"], r["connect"]
assert sent > 0 and delivered >= 0.99 * sent, (sent, delivered)
assert all(s["latency"]["count"] == s["delivered"] for s in steps)
print(f"smoke: OK: {r['connect']['established']} sessions, {delivered}/{sent} messages delivered, "
      f"p99 {max(s['latency']['p99_ms'] for s in steps):.1f} ms")
PY
