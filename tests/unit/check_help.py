#!/usr/bin/env python3
"""Every tool takes its options through getopt_long, and its --help (exit
0) describes every long option it accepts: each name in the source's
struct option tables appears as --name in --help, on a line of its own
with words after it. Prints TAP.

    check_help.py SOURCE_ROOT ckptd=BINARY ckptctl=BINARY ...
"""
import re
import subprocess
import sys

SOURCES = {"ckptd": "daemon/main.c", "ckptctl": "client/ckptctl.c", "ckpt-example": "client/ckpt_example.c",
           "ckpt-bench": "client/ckpt_bench.c"}
root = sys.argv[1]
checks = []
for arg in sys.argv[2:]:
    name, binary = arg.split("=", 1)
    src = open(f"{root}/{SOURCES[name]}").read()
    checks.append((f"{name} parses its options with getopt_long", "getopt_long(" in src))
    longs = re.findall(r'\{\s*"([a-z][a-z-]*)",\s*(?:no_argument|required_argument|optional_argument)', src)
    r = subprocess.run([binary, "--help"], capture_output=True, text=True)
    checks.append((f"{name} --help exits 0", r.returncode == 0))
    lines = r.stdout.splitlines()
    for opt in sorted(set(longs)):
        # An option line: the option first (after its short form), then words.
        at = rf"^\s+(-\w, )?--{opt}\b"
        described = any(re.search(at + r"\S*( \S+)?\s+\S.*\S", l) or
                        (re.search(at, l) and i + 1 < len(lines) and lines[i + 1].startswith(" " * 20))
                        for i, l in enumerate(lines))
        checks.append((f"{name} --help describes --{opt}", described))
print(f"1..{len(checks)}")
for i, (d, ok) in enumerate(checks, 1):
    print(f"{'ok' if ok else 'not ok'} {i} - {d}")
sys.exit(0 if all(ok for _, ok in checks) else 1)
