#!/usr/bin/env bash
# Builds and checks Starling's container image where no registry is
# reachable and containers cannot run (docs/deployment.md, "What was verified
# here, and how"):
#
#  1. checks that packaging/Containerfile.local's runtime stage is the
#     Dockerfile's runtime stage (same instructions, with the builder stage's
#     /out/ read from a local rootfs/);
#  2. assembles that rootfs around an already-built binary (default
#     target/debug/starling; a dynamically linked one gets the shared
#     libraries and loader `ldd` lists), with the passwd/group entries and
#     directory layout the builder stage makes;
#  3. `podman build`s packaging/Containerfile.local (FROM scratch, no
#     network, throw-away storage under a temporary directory);
#  4. inspects the image (user 10001:10001, entrypoint, command, exposed
#     ports, volume, working directory, health check), extracts its
#     filesystem, and checks the layout (ownership of /data, no shell);
#  5. as root, chroots into that filesystem as user 10001:10001 and runs
#     `starling --version`, `starling --config … check-config`, then the
#     server itself on random loopback ports until `starling ctl status`
#     says it is ready, and stops it with SIGTERM (exit 0; everything it
#     wrote is under /data and owned by 10001).
#
# Usage: packaging/verify-image.sh [BINARY]      (as root; needs podman)
# Environment: STARLING_BIN (instead of BINARY), KEEP_TMP=1 to keep the
# temporary directory for a look afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

fail() { printf 'verify-image: FAILED: %s\n' "$*" >&2; exit 1; }
say() { printf 'verify-image: %s\n' "$*"; }

bin=${1:-${STARLING_BIN:-target/debug/starling}}
[ -x "$bin" ] || fail "no executable at $bin (build it: cargo build -p starling-server)"
bin=$(realpath "$bin")
[ "$(id -u)" = 0 ] || fail "run as root (podman storage in a temporary directory, chroot)"
command -v podman >/dev/null || fail "podman not found (Debian: apt-get install podman)"
chroot_bin=$(command -v chroot) || fail "chroot not found (coreutils)"
command -v python3 >/dev/null || fail "python3 not found"

tmp=$(mktemp -d /tmp/starling-image.XXXXXX)
image=localhost/starling:verify
# Every podman state directory under $tmp: nothing is left behind.
pod() { podman --root "$tmp/storage" --runroot "$tmp/run" --tmpdir "$tmp/libpod" \
  --network-config-dir "$tmp/networks" --volumepath "$tmp/volumes" --storage-driver vfs \
  --cgroup-manager cgroupfs --events-backend file "$@"; }
server_pid=
cleanup() {
  status=$?
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  pod image unmount --all >/dev/null 2>&1 || true
  pod rmi --all --force >/dev/null 2>&1 || true
  if [ "${KEEP_TMP:-0}" = 1 ]; then
    say "kept $tmp"
  else
    rm -rf "$tmp"
  fi
  exit $status
}
trap cleanup EXIT

# -- 1. Containerfile.local mirrors the Dockerfile's runtime stage ----------
# Instructions of the last stage (from its FROM), one per line: comments and
# blank lines dropped, continuations joined, whitespace collapsed; an
# instruction after a "# local only" comment is left out.
runtime_stage() {
  awk '
    /^[[:space:]]*#/ { if ($0 ~ /^[[:space:]]*# local only:/) skip = 1; next }
    /^[[:space:]]*$/ { next }
    { line = line $0
      if (line ~ /\\$/) { sub(/\\$/, " ", line); next }
      gsub(/[[:space:]]+/, " ", line); sub(/ $/, "", line)
      if (line ~ /^FROM /) n = 0
      if (skip) skip = 0; else out[++n] = line
      line = "" }
    END { for (i = 1; i <= n; i++) print out[i] }' "$1"
}
runtime_stage packaging/Dockerfile |
  sed -e 's/--from=builder //' -e 's# /out/# rootfs/#g' >"$tmp/dockerfile.stage"
runtime_stage packaging/Containerfile.local >"$tmp/local.stage"
if ! diff -u "$tmp/dockerfile.stage" "$tmp/local.stage"; then
  fail "packaging/Containerfile.local's runtime stage differs from packaging/Dockerfile's (diff above)"
fi
say "Containerfile.local mirrors the Dockerfile's runtime stage ($(wc -l <"$tmp/local.stage") instructions)"

# -- 2. the build context: what the builder stage puts under /out ----------
ctx=$tmp/ctx
root=$ctx/rootfs
mkdir -p "$root/etc/ssl/certs" "$root/etc/starling" "$root/data" "$root/usr/local/bin" "$root/dynlibs"
install -m 0755 "$bin" "$root/usr/local/bin/starling"
printf 'starling:x:10001:10001:Starling XMPP server:/data:/sbin/nologin\n' >"$root/etc/passwd"
printf 'starling:x:10001:\n' >"$root/etc/group"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
else
  say "note: no /etc/ssl/certs/ca-certificates.crt on this machine; the image gets an empty bundle"
  : >"$root/etc/ssl/certs/ca-certificates.crt"
fi
if readelf -l "$bin" 2>/dev/null | grep -q 'program interpreter' ||
  { ! command -v readelf >/dev/null && ! ldd "$bin" 2>&1 | grep -q 'statically linked'; }; then
  ldd "$bin" >"$tmp/ldd" 2>&1 || fail "ldd $bin: $(cat "$tmp/ldd")"
  # "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" and the loader
  # "/lib64/ld-linux-x86-64.so.2 (0x…)"; linux-vdso has no file.
  libs=$(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' "$tmp/ldd")
  [ -n "$libs" ] || fail "ldd $bin listed no libraries: $(cat "$tmp/ldd")"
  for lib in $libs; do
    cp -L --parents "$lib" "$root/dynlibs/"
  done
  say "dynamically linked: copied the shared libraries and loader ldd lists: $(tr "\n" " " <<<"$libs")"
else
  say "statically linked binary (no program interpreter): no libraries to copy"
fi

# -- 3. podman build -------------------------------------------------------
# --format docker keeps HEALTHCHECK (the OCI image format has no field for it).
say "podman build (FROM scratch, --network=none, storage in $tmp)"
pod build --quiet --network=none --pull=never --format docker \
  -f "$repo/packaging/Containerfile.local" -t "$image" "$ctx" >"$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log" >&2; fail "podman build"; }

# -- 4. the image's configuration and filesystem ----------------------------
pod image inspect "$image" >"$tmp/inspect.json" || fail "podman image inspect"
python3 - "$tmp/inspect.json" <<'EOF' || fail "image configuration (above)"
import json, sys
img = json.load(open(sys.argv[1]))[0]
cfg = img.get("Config") or {}
want = {
    "User": "10001:10001",
    "Entrypoint": ["/usr/local/bin/starling"],
    "Cmd": ["run"],
    "WorkingDir": "/",
    "ExposedPorts": {"5222/tcp": {}, "5223/tcp": {}, "5280/tcp": {}, "5443/tcp": {}},
    "Volumes": {"/data": {}},
    "StopSignal": "SIGTERM",
}
bad = [f"{k}: {cfg.get(k)!r}, want {v!r}" for k, v in want.items() if cfg.get(k) != v]
hc = img.get("Healthcheck") or img.get("HealthCheck") or cfg.get("Healthcheck") or {}
if hc.get("Test") != ["CMD", "/usr/local/bin/starling", "ctl", "status", "--timeout", "3"]:
    bad.append(f"HealthCheck: {hc!r}")
if not any(e.startswith("SSL_CERT_FILE=") for e in cfg.get("Env") or []):
    bad.append(f"Env: {cfg.get('Env')!r}")
for b in bad:
    print("  image config", b, file=sys.stderr)
if bad:
    sys.exit(1)
size = img.get("Size", 0)
print(f"verify-image: image config ok: User {cfg['User']}, Entrypoint {cfg['Entrypoint']}, "
      f"Cmd {cfg['Cmd']}, ports {' '.join(sorted(cfg['ExposedPorts']))}, volume /data, "
      f"health check `starling ctl status`; {len(img.get('RootFS', {}).get('Layers', []))} layers, "
      f"{size / 1e6:.1f} MB")
EOF

fs=$tmp/image-root
mkdir -p "$fs"
if mnt=$(pod image mount "$image" 2>"$tmp/mount.err"); then
  cp -a "$mnt/." "$fs/"
  pod image unmount "$image" >/dev/null
  say "image filesystem extracted with podman image mount"
else
  # Fallback: the layers of `podman save`, applied in order.
  pod save --format docker-archive -o "$tmp/image.tar" "$image" >/dev/null || fail "podman save"
  mkdir -p "$tmp/save" && tar -xf "$tmp/image.tar" -C "$tmp/save"
  python3 -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1]))[0]["Layers"]))' \
    "$tmp/save/manifest.json" | while read -r layer; do
    tar -xpf "$tmp/save/$layer" -C "$fs"
  done
  say "image filesystem extracted from podman save (podman image mount: $(cat "$tmp/mount.err"))"
fi

[ "$(stat -c %u:%g "$fs/data")" = 10001:10001 ] || fail "/data is owned by $(stat -c %u:%g "$fs/data"), want 10001:10001"
[ -x "$fs/usr/local/bin/starling" ] || fail "/usr/local/bin/starling missing or not executable"
grep -q '^starling:x:10001:10001:' "$fs/etc/passwd" || fail "/etc/passwd has no starling entry for 10001"
[ -s "$fs/etc/ssl/certs/ca-certificates.crt" ] || say "note: the CA bundle is empty"
[ ! -e "$fs/bin/sh" ] || fail "the image has a shell at /bin/sh; it should be FROM scratch"
say "image filesystem ok: $(find "$fs" -type f | wc -l) files, /data owned by 10001:10001, no shell"

# -- 5. run the binary inside the image's filesystem as user 10001 ----------
# The image's environment (its Env and HOME), not this shell's. There is no
# env(1) in the image, so the environment is set before chroot.
in_image=(env -i SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt HOME=/data
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  "$chroot_bin" --userspec=10001:10001 "$fs")
in_image() { "${in_image[@]}" "$@"; }
version=$(in_image /usr/local/bin/starling --version 2>&1) ||
  fail "starling --version inside the image: $version"
say "chroot as 10001:10001: $version"

# A configuration like the one an operator mounts at
# /etc/starling/starling.toml, on random loopback ports (this machine may be
# running other servers on the default ones).
base=$((20000 + RANDOM % 20000))
cat >"$fs/etc/starling/starling.toml" <<EOF
[server]
domains = ["localhost"]
data_dir = "/data"

[[listen]]
address = "127.0.0.1:$base"
tls = "starttls"

[[listen]]
address = "127.0.0.1:$((base + 1))"
tls = "direct"

[[http.listen]]
address = "127.0.0.1:$((base + 2))"
tls = false

[admin]
listen = ["127.0.0.1:$((base + 3))"]
EOF
out=$(in_image /usr/local/bin/starling --config /etc/starling/starling.toml check-config 2>&1) ||
  fail "starling check-config inside the image: $out"
say "chroot as 10001:10001: check-config ok ($(echo "$out" | tail -n 1))"

touch "$tmp/before-run"
sleep 1
# A simple command, so that $! is the server itself (env and chroot exec it).
"${in_image[@]}" /usr/local/bin/starling --config /etc/starling/starling.toml run >"$tmp/server.log" 2>&1 &
server_pid=$!
ready=
for _ in $(seq 1 60); do
  if in_image /usr/local/bin/starling ctl status --url "http://127.0.0.1:$((base + 3))" \
    --timeout 1 >"$tmp/status.out" 2>&1; then
    ready=1
    break
  fi
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.5
done
if [ -z "$ready" ]; then
  cat "$tmp/server.log" >&2
  fail "the server did not become ready inside the image (log above)"
fi
say "chroot as 10001:10001: server ready ($(tr -s '\n' ' ' <"$tmp/status.out"))"
kill -TERM "$server_pid"
stopped=
for _ in $(seq 1 60); do
  kill -0 "$server_pid" 2>/dev/null || { stopped=1; break; }
  sleep 0.5
done
[ -n "$stopped" ] || fail "the server did not stop within 30 s of SIGTERM"
code=0
wait "$server_pid" || code=$?
[ "$code" = 0 ] || { cat "$tmp/server.log" >&2; fail "the server exited with status $code after SIGTERM (log above)"; }
server_pid=
# A read-only root filesystem suffices: nothing was written outside /data.
outside=$(find "$fs" -path "$fs/data" -prune -o -newer "$tmp/before-run" -print | grep -vx "$fs" || true)
[ -z "$outside" ] || fail "the server wrote outside /data: $outside"
owner=$(find "$fs/data" -mindepth 1 ! -user 10001 -print -quit)
[ -z "$owner" ] || fail "$owner in /data is not owned by 10001"
say "chroot as 10001:10001: stopped cleanly on SIGTERM; nothing written outside /data; state in /data: $(cd "$fs/data" && find . -mindepth 1 -maxdepth 2 | sort | tr '\n' ' ')"
say "all checks passed"
