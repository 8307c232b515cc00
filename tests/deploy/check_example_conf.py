#!/usr/bin/env python3
"""deploy/ckptd.conf.example says what ckptd does by default: the
configuration ckptd resolves from it (`ckptd --check-config`) equals the
one it resolves from no file at all, given the example's storage URL.
One TAP line per key; a key the example sets to anything but its default
fails, naming both values.

    check_example_conf.py SOURCE_ROOT CKPTD
"""
import os
import re
import subprocess
import sys
import tempfile

root, ckptd = sys.argv[1:3]
example = os.path.join(root, "deploy", "ckptd.conf.example")


def resolved(*args):
    r = subprocess.run([ckptd, "--check-config", *args], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        print("1..1\nnot ok 1 - ckptd --check-config " + " ".join(args) + ": " + r.stderr.strip())
        sys.exit(1)
    out, section = {}, ""
    for line in r.stdout.splitlines():
        m = re.match(r"^\[(.+)\]$", line)
        if m:
            section = m.group(1)
        elif " = " in line or line.endswith(" ="):
            k, _, v = line.partition(" =")
            out[(section, k.strip())] = v.strip()
    return out


ex = resolved("--config", example)
with tempfile.NamedTemporaryFile("w", suffix=".conf") as empty:
    default = resolved("--config", empty.name, "--storage", ex[("storage", "url")])
keys = sorted(set(ex) | set(default))
print(f"1..{len(keys)}")
bad = 0
for i, key in enumerate(keys, 1):
    a, b = ex.get(key), default.get(key)
    name = f"[{key[0]}] {key[1]}"
    if a == b:
        print(f"ok {i} - {name} = {a}")
    else:
        bad += 1
        print(f"not ok {i} - {name}: the example gives {a!r}, the default is {b!r}")
sys.exit(1 if bad else 0)
