#!/usr/bin/env python3
"""Structure check of the Helm chart's rendered manifests (packaging/check.sh).

Usage: check-manifests.py RENDERED.yaml [TOML_DIR]

Every document must parse and have apiVersion, kind and metadata.name (a
valid DNS-1123 name); the StatefulSet must carry the probes and the security
settings the chart promises; the per-node configuration files of the
ConfigMap (or Secret) are written to TOML_DIR, for `starling check-config`.
Needs PyYAML.
"""
import os
import re
import sys

import yaml

NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def fail(msg):
    print(f"check-manifests: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    path = sys.argv[1]
    toml_dir = sys.argv[2] if len(sys.argv) > 2 else None
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    if not docs:
        fail(f"{path}: no manifests")
    kinds = []
    for d in docs:
        for key in ("apiVersion", "kind", "metadata"):
            if key not in d:
                fail(f"a manifest without {key}: {str(d)[:200]}")
        name = (d["metadata"] or {}).get("name", "")
        if not name or len(name) > 63 or not NAME.match(name):
            fail(f"{d['kind']}: bad metadata.name {name!r}")
        kinds.append(f"{d['kind']}/{name}")
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)

    sts = (by_kind.get("StatefulSet") or [None])[0]
    if sts is None:
        fail("no StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    c = pod["containers"][0]
    psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
    checks = {
        "pod runAsNonRoot": psc.get("runAsNonRoot") is True,
        "pod runAsUser 10001": psc.get("runAsUser") == 10001,
        "readOnlyRootFilesystem": csc.get("readOnlyRootFilesystem") is True,
        "allowPrivilegeEscalation false": csc.get("allowPrivilegeEscalation") is False,
        "capabilities drop ALL": "ALL" in (csc.get("capabilities") or {}).get("drop", []),
        "readiness /health/ready": c.get("readinessProbe", {}).get("httpGet", {}).get("path") == "/health/ready",
        "liveness /health/live": c.get("livenessProbe", {}).get("httpGet", {}).get("path") == "/health/live",
        "STARLING_DATABASE_URL from a Secret": any(
            e.get("name") == "STARLING_DATABASE_URL" and "secretKeyRef" in (e.get("valueFrom") or {})
            for e in c.get("env", [])),
        "--config per pod name": "/etc/starling/nodes/$(POD_NAME).toml" in c.get("args", []),
        "headless serviceName": any(s["metadata"]["name"] == sts["spec"]["serviceName"]
                                    and s["spec"].get("clusterIP") == "None"
                                    for s in by_kind.get("Service", [])),
    }
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        fail("StatefulSet: " + ", ".join(bad))

    configs = [d for d in by_kind.get("ConfigMap", []) + by_kind.get("Secret", [])
               if d["metadata"]["name"].endswith("-config")]
    if len(configs) != 1:
        fail(f"expected one -config ConfigMap or Secret, found {len(configs)}")
    files = configs[0].get("data") or configs[0].get("stringData") or {}
    replicas = sts["spec"]["replicas"]
    want = {f"{sts['metadata']['name']}-{i}.toml" for i in range(replicas)}
    if set(files) != want:
        fail(f"configuration files {sorted(files)}, want one per pod {sorted(want)}")
    ids = [int(re.search(r"(?m)^node_id = (\d+)$", files[f]).group(1)) for f in sorted(files)]
    if len(set(ids)) != len(ids):
        fail(f"node ids not unique: {ids}")
    if toml_dir:
        os.makedirs(toml_dir, exist_ok=True)
        for fname, text in files.items():
            with open(os.path.join(toml_dir, fname), "w") as f:
                f.write(text)
    print(f"check-manifests: {len(docs)} manifests ok ({', '.join(kinds)}); "
          f"StatefulSet checks ok; node ids {ids}")


if __name__ == "__main__":
    main()
