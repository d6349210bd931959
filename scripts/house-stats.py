#!/usr/bin/env python3
"""Figures of the code base's shape (issue 32): files and lines, the
largest files, import cycles between the server crate's files, and what
the scenario tests wait on.

    scripts/house-stats.py            # a Markdown report on stdout
    scripts/house-stats.py --json     # the same figures as JSON

Imports are read from `use crate::…` / `crate::…` paths and `super::`
paths in each file of crates/server/src (a file `a/b.rs` or `a/b/mod.rs`
is the module `a::b`); a path names the longest module prefix that exists.
A cycle is a strongly connected set of files (Tarjan) of more than one
file. Standard library only.
"""
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER = os.path.join(ROOT, "crates", "server", "src")
SCENARIOS = os.path.join(ROOT, "crates", "server", "tests", "scenarios")


def rust_files(top):
    for d, _, files in os.walk(top):
        for f in files:
            if f.endswith(".rs"):
                yield os.path.join(d, f)


def lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def module_of(path):
    rel = os.path.relpath(path, SERVER)[:-3].split(os.sep)
    if rel[-1] == "mod":
        rel = rel[:-1]
    if rel in (["lib"], ["main"]):
        return ()
    return tuple(rel)


def strip_tests(text):
    """The file without its `#[cfg(test)] mod tests { … }` block (a test
    may import anything)."""
    m = re.search(r"#\[cfg\(test\)\]\s*mod \w+\s*\{", text)
    return text[: m.start()] if m else text


def imports(path, modules):
    me = module_of(path)
    text = strip_tests(open(path, encoding="utf-8").read())
    text = re.sub(r"//[^\n]*", "", text)
    found = set()
    # crate::a::b::{c, d}: the longest existing prefix of each path.
    for m in re.finditer(r"\bcrate((?:::\w+)+)", text):
        parts = tuple(m.group(1).strip(":").split("::"))
        found.add(longest(parts, modules))
    for m in re.finditer(r"\b((?:super::)+)((?:\w+::)*\w+)", text):
        ups = m.group(1).count("super::")
        base = me if os.path.basename(path) == "mod.rs" else me[:-1]
        base = base[: len(base) - (ups - 1)] if ups > 1 else base
        if ups > len(me):
            continue
        parts = base + tuple(m.group(2).split("::"))
        found.add(longest(parts, modules))
    found.discard(None)
    found.discard(me)
    # A file's own submodules are its business.
    return {f for f in found if f[: len(me)] != me or not me}


def longest(parts, modules):
    for n in range(len(parts), 0, -1):
        if parts[:n] in modules:
            return parts[:n]
    return None


def cycles(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in graph:
        if v not in index:
            visit(v)
    return sorted(out, key=len, reverse=True)


def name(m):
    return "::".join(m) or "crate"


def main():
    files = {}
    for top in ("crates", "fuzz/fuzz_targets"):
        for p in rust_files(os.path.join(ROOT, top)):
            if "/target/" in p:
                continue
            files[os.path.relpath(p, ROOT)] = len(lines(p))
    # Source files: lines before the unit tests (`#[cfg(test)]`), which
    # the ~1,200-line rule does not count.
    src = {}
    for p in files:
        if "/tests/" in p or "/benches/" in p:
            continue
        text = open(os.path.join(ROOT, p), encoding="utf-8").read()
        src[p] = strip_tests(text).count("\n")
    modules = {module_of(p) for p in rust_files(SERVER)}
    graph = {module_of(p): imports(p, modules) for p in rust_files(SERVER)}
    cyc = cycles(graph)
    # Modules under modules/ that import another module's folder.
    cross = sorted(
        (name(a), name(b))
        for a, deps in graph.items()
        for b in deps
        if len(a) >= 2 and a[0] == "modules" and len(b) >= 2 and b[0] == "modules"
        and a[1] != b[1] and b[1] != "common"
    )
    waits = {"drain(": 0, "expect_silence(": 0, "sleep(": 0, "barrier(": 0}
    asserts, xml_format, tests = 0, 0, 0
    for p in rust_files(SCENARIOS):
        t = open(p, encoding="utf-8").read()
        for k in waits:
            waits[k] += t.count("." + k) + t.count("::" + k)
        asserts += len(re.findall(r"\bassert(?:_eq|_ne)?!", t))
        xml_format += len(re.findall(r"format!\(\s*\"<", t))
        tests += len(re.findall(r"#\[tokio::test", t)) + len(re.findall(r"#\[test\]", t))
    report = {
        "rust_files": len(files),
        "rust_lines": sum(files.values()),
        "source_files_over_1200_lines": sorted(
            ([p, n] for p, n in src.items() if n > 1200), key=lambda x: -x[1]),
        "largest_files": sorted(([p, n] for p, n in files.items()), key=lambda x: -x[1])[:10],
        "server_import_cycles": [[name(m) for m in c] for c in cyc],
        "module_imports_module": [f"{a} -> {b}" for a, b in cross],
        "scenario_tests": tests,
        "scenario_asserts": asserts,
        "scenario_waits": waits,
        "scenario_format_xml": xml_format,
    }
    if "--json" in sys.argv:
        json.dump(report, sys.stdout, indent=1)
        print()
        return
    print(f"- Rust files: {report['rust_files']}, lines: {report['rust_lines']}")
    print(f"- source files over 1,200 lines (unit tests not counted): "
          f"{len(report['source_files_over_1200_lines'])}")
    for p, n in report["source_files_over_1200_lines"]:
        print(f"  - {p}: {n}")
    print(f"- import cycles between server files: {len(cyc)}"
          + (f" (largest: {len(cyc[0])} files)" if cyc else ""))
    for c in report["server_import_cycles"]:
        print(f"  - {', '.join(c)}")
    print(f"- a module importing another module: {len(cross)}")
    for line in report["module_imports_module"]:
        print(f"  - {line}")
    print(f"- scenario tests: {tests}, assertions: {asserts}, format!(\"<…\") XML: {xml_format}")
    print("- scenario waits: " + ", ".join(f"{k}) {v}" for k, v in waits.items()))


if __name__ == "__main__":
    main()
