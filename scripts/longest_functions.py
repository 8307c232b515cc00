#!/usr/bin/env python3
"""The longest C functions of daemon/, client/ and proto/ at a git revision
(lines from the opening brace at column 0 to the closing one, which is
where clang-format puts them), for before/after comparisons of a
restructuring:

    scripts/longest_functions.py b2b64e2
    scripts/longest_functions.py HEAD
    scripts/longest_functions.py HEAD 80     (every function over 80 lines, and how many)

and the size rules of the layout (docs/architecture.md "Source layout and
tests"), as TAP, on the working tree (the unit test `sizes`):

    scripts/longest_functions.py --check ROOT

no C file in daemon/ or client/ over MAX_FILE lines, and no function there
over MAX_FUNCTION lines.
"""
import os
import re
import subprocess
import sys

MAX_FILE, MAX_FUNCTION = 1000, 85


def functions(src):
    """(lines, name) of each function of a C file's lines."""
    start = name = None
    for i, line in enumerate(src):
        if start is None and line == "{" and i > 0:
            j = i - 1
            while j >= 0 and "(" not in src[j]:
                j -= 1
            m = re.search(r"(\w+)\s*\(", src[j]) if j >= 0 else None
            if m:
                start, name = i, m.group(1)
        elif start is not None and line == "}":
            yield i - start + 1, name
            start = None


def at_revision(rev, over):
    files = [f for f in subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "daemon/", "client/", "proto/"],
                                       capture_output=True, text=True, check=True).stdout.split() if f.endswith(".c")]
    out = []
    for f in files:
        src = subprocess.run(["git", "show", f"{rev}:{f}"], capture_output=True, text=True, check=True).stdout
        out += [(n, f"{f}:{name}") for n, name in functions(src.split("\n"))]
    out.sort(reverse=True)
    print(rev, "files", len(files))
    for n, fn in (out[:8] if over is None else [x for x in out if x[0] > over]):
        print(n, fn)
    if over is not None:
        print(sum(1 for x in out if x[0] > over), "functions over", over, "lines")
    return 0


def check(root):
    files = sorted(os.path.join(d, n) for top in ("daemon", "client") for d, _, names in os.walk(os.path.join(root, top))
                   for n in names if n.endswith(".c"))
    if len(files) < 50:
        print(f"Bail out! only {len(files)} C files under {root}")
        return 1
    print("1..2")
    sizes, fns = [], []
    for f in files:
        src = open(f, encoding="utf-8").read().split("\n")
        rel = os.path.relpath(f, root)
        sizes.append((len(src) - (src[-1] == ""), rel))
        fns += [(n, f"{rel}:{name}") for n, name in functions(src)]
    if len(fns) < 500:
        print(f"Bail out! only {len(fns)} functions found: are the braces still in column 0?")
        return 1
    rc = 0
    for i, (what, limit, rows) in enumerate((("C file", MAX_FILE, sizes), ("function", MAX_FUNCTION, fns)), 1):
        over = sorted((x for x in rows if x[0] > limit), reverse=True)
        n, where = max(rows)
        if over:
            rc = 1
            print(f"not ok {i} - {what}s over {limit} lines: " + ", ".join(f"{w} ({k})" for k, w in over))
        else:
            print(f"ok {i} - no {what} over {limit} lines of {len(rows)} (the largest: {where}, {n})")
    return rc


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        return check(sys.argv[2])
    return at_revision(sys.argv[1] if len(sys.argv) > 1 else "HEAD", int(sys.argv[2]) if len(sys.argv) > 2 else None)


if __name__ == "__main__":
    sys.exit(main())
