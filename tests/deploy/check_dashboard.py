#!/usr/bin/env python3
"""deploy/grafana/ckptd-dashboard.json is built only from metrics that
exist: a real ckptd is started on a temporary socket, its exposition read
with `ckptctl metrics`, and every ckptd_ name in every panel expression
and template query must be one of its families (a histogram's _bucket,
_sum and _count included). Prints TAP.

    check_dashboard.py SOURCE_ROOT CKPTD CKPTCTL
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

root, ckptd, ckptctl = sys.argv[1:4]
tmp = tempfile.mkdtemp(prefix="ckpt-dash-")
sock = os.path.join(tmp, "ckptd.sock")
p = subprocess.Popen([ckptd, "--config", "/dev/null", "--socket", sock, "--storage", f"file://{tmp}/store",
                      "--state-dir", f"{tmp}/state", "--staging-bytes", "64M", "--chunk-bytes", "4M"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    text = ""
    for _ in range(200):
        r = subprocess.run([ckptctl, "--socket", sock, "metrics"], capture_output=True, text=True)
        if r.returncode == 0:
            text = r.stdout
            break
        time.sleep(0.05)
finally:
    p.terminate()
    p.wait(30)
    shutil.rmtree(tmp, ignore_errors=True)

families = {}
for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.M):
    families[m.group(1)] = m.group(2)
names = set(families)
for f, kind in families.items():
    if kind == "histogram":
        names |= {f + "_bucket", f + "_sum", f + "_count"}

dash = json.load(open(os.path.join(root, "deploy", "grafana", "ckptd-dashboard.json")))
exprs = []
for panel in dash.get("panels", []):
    for t in panel.get("targets", []):
        exprs.append((panel["title"], t["expr"]))
for v in dash.get("templating", {}).get("list", []):
    if isinstance(v.get("query"), str) and "ckptd_" in v["query"]:
        exprs.append((f"variable {v['name']}", v["query"]))

checks = [("ckptd exported its metrics", len(families) > 20), ("the dashboard has panels", len(exprs) > 10)]
for title, e in exprs:
    used = set(re.findall(r"\bckptd_[a-z0-9_]+", e))
    missing = sorted(used - names)
    checks.append((f"{title}: {', '.join(sorted(used)) or 'no ckptd metric'}"
                   + (f" (not exported: {', '.join(missing)})" if missing else ""), used and not missing))
print(f"1..{len(checks)}")
for i, (d, ok) in enumerate(checks, 1):
    print(f"{'ok' if ok else 'not ok'} {i} - {d}")
sys.exit(0 if all(ok for _, ok in checks) else 1)
