#!/usr/bin/env python3
"""The include structure of daemon/, client/, proto/ and common/, by module
(foo.c and foo.h are one module), at a git revision or in the working tree.

  scripts/include_graph.py [REV]          folders, their edges, and every circle
  scripts/include_graph.py --check [DIR]  exit 1 on a circle between modules, or
                                          on a daemon/ folder that includes a
                                          folder listed after it in
                                          daemon/meson.build (the layer order)

A module that includes another can call it, so a circle of includes is the
upper bound of a circle of calls; the layer check is what the per-folder
include paths of daemon/*/meson.build enforce at build time, said once more
where a reader can run it.
"""
import os
import re
import subprocess
import sys

ROOTS = ("daemon/", "client/", "proto/", "common/")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read_tree(rev, top):
    """{path: text} of the C sources under ROOTS."""
    out = {}
    if rev is None:
        for root in ROOTS:
            for dirpath, _, names in os.walk(os.path.join(top, root)):
                for n in names:
                    if n.endswith((".c", ".h")):
                        p = os.path.join(dirpath, n)
                        out[os.path.relpath(p, top)] = open(p, encoding="utf-8", errors="replace").read()
        return out
    names = subprocess.run(["git", "-C", top, "ls-tree", "-r", "--name-only", rev] + list(ROOTS),
                           capture_output=True, text=True, check=True).stdout.split()
    for p in names:
        if p.endswith((".c", ".h")):
            out[p] = subprocess.run(["git", "-C", top, "show", f"{rev}:{p}"], capture_output=True,
                                    text=True, errors="replace", check=True).stdout
    return out


def module(path):
    return os.path.splitext(path)[0]


def graph(files):
    """{module: set(modules it includes)}, within the tree."""
    by_suffix = {}
    for p in files:
        parts = p.split("/")
        for i in range(len(parts)):
            by_suffix.setdefault("/".join(parts[i:]), []).append(p)
    g = {module(p): set() for p in files}
    for p, text in files.items():
        for inc in INCLUDE.findall(text):
            cands = by_suffix.get(inc, [])
            # Prefer a header in the same top folder (daemon/ or client/).
            same = [c for c in cands if c.split("/")[0] == p.split("/")[0]]
            for c in (same or cands)[:1]:
                if module(c) != module(p):
                    g[module(p)].add(module(c))
    return g


def circles(g):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
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

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def folder(m):
    return os.path.dirname(m)


def layer_order(top):
    """daemon/ folders in the order daemon/meson.build adds them (lowest first)."""
    text = open(os.path.join(top, "daemon/meson.build")).read()
    return ["daemon/" + d for d in re.findall(r"^subdir\('([^']+)'\)", text, re.M)]


def upward(g, order):
    rank = {f: i for i, f in enumerate(order)}
    bad = []
    for m, deps in g.items():
        fm = folder(m)
        if fm not in rank:
            continue
        for d in deps:
            fd = folder(d)
            if fd == "daemon" or (fd in rank and rank[fd] > rank[fm]):
                bad.append((m, d))
    return sorted(bad)


def main(argv):
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                         text=True).stdout.strip() or "."
    if argv and argv[0] == "--check":
        top = argv[1] if len(argv) > 1 else top
        g = graph(read_tree(None, top))
        bad = False
        for c in circles(g):
            print("circle: " + " -> ".join(c))
            bad = True
        for m, d in upward(g, layer_order(top)):
            print(f"upward include: {m} includes {d}")
            bad = True
        if len(g) < 20:
            print(f"only {len(g)} modules found under {top}: wrong directory?")
            bad = True
        print("include structure: " + ("BROKEN" if bad else f"{len(g)} modules, no circle, no upward include"))
        return 1 if bad else 0
    rev = argv[0] if argv else None
    files = read_tree(rev, top)
    g = graph(files)
    edges = {}
    for m, deps in g.items():
        for d in deps:
            if folder(m) != folder(d):
                edges.setdefault((folder(m), folder(d)), 0)
                edges[(folder(m), folder(d))] += 1
    sizes = {}
    for p, text in files.items():
        sizes.setdefault(os.path.dirname(p), [0, 0])
        sizes[os.path.dirname(p)][0] += 1
        sizes[os.path.dirname(p)][1] += text.count("\n")
    print(f"revision {rev or 'working tree'}: {len(g)} modules")
    print("folders (files, lines):")
    for f in sorted(sizes):
        print(f"  {f:20} {sizes[f][0]:3} {sizes[f][1]:6}")
    print("includes between folders (module pairs):")
    for (a, b), n in sorted(edges.items()):
        print(f"  {a:20} -> {b:20} {n}")
    cs = circles(g)
    print(f"circles: {len(cs)}")
    for c in cs:
        print(f"  {len(c)} modules: " + " ".join(os.path.basename(m) for m in c))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
