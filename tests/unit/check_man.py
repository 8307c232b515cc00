#!/usr/bin/env python3
"""The man pages in docs/man say what the binaries do: every key that
`ckptd --check-config` prints is described under its section in
ckptd.conf(5), every flag of `ckptd --help` is in ckptd(8), and every
command of `ckptctl --help` is in ckptctl(1). Prints TAP.

    check_man.py SOURCE_ROOT CKPTD CKPTCTL
"""
import re
import subprocess
import sys

root, ckptd, ckptctl = sys.argv[1:4]


def man(name):
    return open(f"{root}/docs/man/{name}").read()


def sections(text):
    """{'server': body, ...} of the .SH [name] sections."""
    out = {}
    for m in re.finditer(r"^\.SH \[([a-z.A-Z]+)\]\n(.*?)(?=^\.SH |\Z)", text, re.M | re.S):
        out[m.group(1)] = m.group(2)
    return out


checks = []
conf = subprocess.run([ckptd, "--check-config", "--config", "/dev/null", "--storage", "file:///x"],
                      capture_output=True, text=True, check=True).stdout
secs = sections(man("ckptd.conf.5"))
section = None
for line in conf.splitlines():
    m = re.match(r"^\[([a-z]+)\]$", line)
    if m:
        section = m.group(1)
        continue
    m = re.match(r"^([a-z_]+) =", line)
    if m and section:
        key = m.group(1)
        body = secs.get(section, "")
        checks.append((f"ckptd.conf(5) [{section}] describes {key}", re.search(rf"\b{key}\b", body) is not None))

helptext = subprocess.run([ckptd, "--help"], capture_output=True, text=True).stdout
page = man("ckptd.8").replace("\\-", "-")
for flag in sorted(set(re.findall(r"(--[a-z][a-z-]+)", helptext))):
    checks.append((f"ckptd(8) describes {flag}", flag in page))

helptext = subprocess.run([ckptctl, "--help"], capture_output=True, text=True).stdout
page = man("ckptctl.1")
cmds = re.findall(r"^  ([a-z]+)\b", helptext, re.M)
checks.append((f"ckptctl --help lists its commands ({len(cmds)})", len(cmds) >= 8))
for cmd in cmds:
    checks.append((f"ckptctl(1) describes {cmd}", re.search(rf"^\.B[IR]? {cmd}\b", page, re.M) is not None))

print(f"1..{len(checks)}")
for i, (d, ok) in enumerate(checks, 1):
    print(f"{'ok' if ok else 'not ok'} {i} - {d}")
sys.exit(0 if checks and all(ok for _, ok in checks) else 1)
