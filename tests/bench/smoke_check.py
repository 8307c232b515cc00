#!/usr/bin/env python3
"""The bench suite's sanity run (not a timed test): tests/bench/run --smoke
must finish, and its JSON must hold the documented fields with sane values.
Prints TAP."""
import json
import os
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
build = sys.argv[1]
out = tempfile.mkdtemp(prefix="ckpt-bench-smoke-")
p = subprocess.run([sys.executable, os.path.join(here, "run"), "--build", build, "--smoke", "--out", out],
                   capture_output=True, text=True)
checks = [("runner exits 0", p.returncode == 0)]
try:
    with open(os.path.join(out, "results.json")) as f:
        res = json.load(f)
    checks.append(("results.json parses", True))
except (OSError, ValueError):
    res = {}
    checks.append(("results.json parses", False))
runs = res.get("runs", [])
checks.append(("agent and direct runs for each size x ranks", len(runs) == 4))
for r in runs:
    R = r.get("results", {})
    mode = r.get("config", {}).get("mode")
    ok = all(k in R and R[k]["median"] > 0 and R[k]["p90"] >= R[k]["median"]
             for k in ("save_stall_s", "save_durable_s", "load_storage_s"))
    ok = ok and R.get("throughput_mb_s", 0) > 0 and "daemon_cpu_s" in R and "daemon_peak_rss_mb" in R
    if mode == "agent":
        ok = ok and R["load_memory_s"]["median"] > 0 and R["save_stall_s"]["median"] <= R["save_durable_s"]["median"]
    checks.append((f"{mode} run of {r.get('config', {}).get('ranks')} ranks has sane fields", ok))
checks.append(("a markdown table was printed", "| size | ranks |" in p.stdout))
print(f"1..{len(checks)}")
for i, (d, ok) in enumerate(checks, 1):
    print(f"{'ok' if ok else 'not ok'} {i} - {d}")
if p.returncode:
    print("# " + p.stderr.replace("\n", "\n# "))
sys.exit(0 if all(ok for _, ok in checks) else 1)
