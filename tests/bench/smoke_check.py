#!/usr/bin/env python3
"""The bench suite's sanity run (not a timed test): tests/bench/run --smoke
must finish, and its JSON must hold the documented fields with sane values.
Then ckpt-bench run twice against one daemon and storage: both runs pass
(each saves as a fresh job), and a --job whose steps exist already fails
at once, saying what to do. Prints TAP."""
import importlib.machinery
import importlib.util
import json
import os
import shutil
import signal
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

# A new user runs ckpt-bench, then runs it again: both must work.
loader = importlib.machinery.SourceFileLoader("bench_run", os.path.join(here, "run"))
runner = importlib.util.module_from_spec(importlib.util.spec_from_loader("bench_run", loader))
loader.exec_module(runner)
again = tempfile.mkdtemp(prefix="ckpt-bench-again-")
bench = [os.path.join(build, "client", "ckpt-bench"), "--size-mb", "8", "--saves", "2", "--loads", "1"]
daemon = None
twice, mine = [], []
try:
    daemon, sock = runner.start_daemon(build, again, 128)
    for i in range(2):
        js = os.path.join(again, f"twice-{i}.json")
        twice.append((subprocess.run(bench + ["--socket", sock, "--json", js], capture_output=True, text=True,
                                     timeout=120), js))
    for i in range(2):
        mine.append(subprocess.run(bench + ["--socket", sock, "--job", "mine"], capture_output=True, text=True,
                                   timeout=120))
finally:
    if daemon:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
jobs = []
for i, (r, js) in enumerate(twice, 1):
    checks.append((f"ckpt-bench without --job, run {i} against the same daemon, exits 0", r.returncode == 0))
    try:
        with open(js) as f:
            jobs.append(json.load(f)["config"]["job"])
    except (OSError, ValueError, KeyError):
        jobs.append(None)
checks.append(("each run saved as a job of its own, bench-<unix time>-<pid>",
               len(set(jobs)) == 2 and all(j and j.startswith("bench-") for j in jobs)))
checks.append(("a first run with --job mine exits 0", mine[0].returncode == 0))
checks.append(("a second run with --job mine fails, naming the step and what to do",
               mine[1].returncode == 1 and "job 'mine' already has step 1" in mine[1].stderr
               and "Leave out --job" in mine[1].stderr and "ckptctl rm mine STEP" in mine[1].stderr))
checks.append(("... before saving anything (no table printed)", "| mode |" not in mine[1].stdout))
print(f"1..{len(checks)}")
for i, (d, ok) in enumerate(checks, 1):
    print(f"{'ok' if ok else 'not ok'} {i} - {d}")
if p.returncode:
    print("# " + p.stderr.replace("\n", "\n# "))
for r in [r for r, _ in twice] + mine[:1]:
    if r.returncode:
        print("# " + (r.stdout + r.stderr).replace("\n", "\n# "))
if all(ok for _, ok in checks):
    shutil.rmtree(again, ignore_errors=True)
else:
    print(f"# ckptd's log and storage: {again}")
sys.exit(0 if all(ok for _, ok in checks) else 1)
