#!/usr/bin/env python3
"""Count the cases of a test run and print the closing line:
N passed, N failed[, N skipped]. Exit 1 on any failure or on zero passed.

Usage: test_summary.py BUILD_DIR...  Each build directory holds, in
meson-logs/, testlist.txt (`meson test --list` for this run's selection,
written before the run) and testlog.json (what meson ran). scripts/test.sh
writes both; the log is removed before each run.

Every case counts once, and only what ran and passed counts as passed:
- TAP, known by its output (a plan "1..N", then "ok"/"not ok" lines), not by
  meson's protocol (meson 1.0 does not log it): each line is a case. "# SKIP"
  is skipped, "not ok # TODO" skipped, "ok # TODO" failed (an unexpected
  pass). Cases the plan announces but the output lacks failed (a crash after
  some cases). "1..0 # SKIP why": the test is skipped.
- pytest, known by "collected N items" or its closing line "... in 1.2s":
  passed are passed; failed and errors failed; skipped and xfailed skipped
  (they prove nothing); xpassed failed (a stale xfail mark, as with
  xfail_strict); deselected are not counted (not selected to run). Collected
  items its closing line does not account for failed (no closing line: a
  crash or a timeout).
- anything else: one case, meson's verdict. SKIP (exit status 77, the
  stand-ins tests/meson.build defines for tests not built here) is skipped,
  with its first line of output as the reason.
- a test meson did not record as OK or SKIP (crash, sanitizer report, leak,
  timeout) whose cases all passed adds one failure.
- a declared test missing from the log failed; no log, a log older than the
  list (stale), or no test declared at all ("No suitable tests defined": a
  mistyped --suite) each add one failure.
"""
import json
import os
import re
import sys

TAP_PLAN = re.compile(r"1\.\.(\d+)\s*(?:#\s*skip\S*\s*(.*))?$", re.I)
TAP_CASE = re.compile(r"(ok|not ok)\b(.*?)(?:#\s*(skip|todo)\S*\s*(.*))?$", re.I)
PYTEST_COLLECTED = re.compile(r"collected (\d+) items?(?:.* (\d+) deselected)?")
PYTEST_END = re.compile(r"=*\s*((?:\d+ \w+(?:, )?)+|no tests ran) in [\d.]+s\b")
PYTEST_KINDS = {"passed": "passed", "failed": "failed", "error": "failed", "errors": "failed",
                "xpassed": "failed", "skipped": "skipped", "xfailed": "skipped"}


def tap(lines, plan, n, notes):
    """Count TAP case lines against the plan (the first "1..N" line)."""
    seen = 0
    for m in filter(None, map(TAP_CASE.match, lines)):
        seen += 1
        ok, desc = m.group(1) == "ok", m.group(2).strip(" -")
        directive, why = (m.group(3) or "").upper(), m.group(4)
        if directive == "SKIP" or (directive == "TODO" and not ok):
            n["skipped"] += 1
            notes.append(("SKIP", f"{desc}: {why or directive}"))
        elif ok and not directive:
            n["passed"] += 1
        else:
            n["failed"] += 1
            notes.append(("FAIL", desc + (" passed but is marked TODO" if ok else "")))
    planned = int(plan.group(1))
    if planned == 0 and seen == 0:
        n["skipped"] += 1
        notes.append(("SKIP", plan.group(2) or "plan 1..0"))
    elif seen < planned:
        n["failed"] += planned - seen
        notes.append(("FAIL", f"{planned - seen} of {planned} planned cases did not run"))


def pytest(lines, collected, end, n, notes):
    """Count pytest's closing line against what it collected."""
    for num, kind in re.findall(r"(\d+) (\w+)", end.group(1) if end else ""):
        if kind in PYTEST_KINDS:
            n[PYTEST_KINDS[kind]] += int(num)
            if kind != "passed":
                notes.append(("FAIL" if PYTEST_KINDS[kind] == "failed" else "SKIP", f"{num} {kind}"))
    notes += [("SKIP", l[len("SKIPPED "):]) for l in lines if l.startswith("SKIPPED ")]
    declared = int(collected.group(1)) - int(collected.group(2) or 0) if collected else 0
    if not end:
        n["failed"] += max(declared, 1)
        notes.append(("FAIL", f"no closing line (a crash or a timeout?): {declared} collected cases unaccounted for"))
    elif declared > sum(n.values()):
        notes.append(("FAIL", f"{declared - sum(n.values())} of {declared} collected cases not accounted for"))
        n["failed"] += declared - sum(n.values())


def count(test):
    """{passed, failed, skipped} for one test of testlog.json, and notes:
    ("FAIL" or "SKIP", why) for whatever did not simply pass."""
    n = {"passed": 0, "failed": 0, "skipped": 0}
    notes = []
    lines = (test.get("stdout") or "").splitlines()
    plans = [m for m in map(TAP_PLAN.match, lines) if m]
    collected = [m for m in map(PYTEST_COLLECTED.match, lines) if m]
    ends = [m for m in map(PYTEST_END.match, lines) if m]
    if plans:
        tap(lines, plans[0], n, notes)
    elif collected or ends:
        pytest(lines, collected[-1] if collected else None, ends[-1] if ends else None, n, notes)
    elif test.get("result") == "SKIP":
        n["skipped"] += 1
        notes.append(("SKIP", lines[0] if lines else "skipped"))
    elif test.get("result") in ("OK", "EXPECTEDFAIL"):
        n["passed"] += 1
    if test.get("result") not in ("OK", "SKIP", "EXPECTEDFAIL") and not n["failed"]:
        n["failed"] += 1
        notes.append(("FAIL", f"meson: {test.get('result')}, exit status {test.get('returncode')}"))
    return n, notes


def summarize(build):
    """Totals and notes for one build directory."""
    n = {"passed": 0, "failed": 0, "skipped": 0}
    notes = []

    def fail(name, why):
        n["failed"] += 1
        notes.append(("FAIL", name, why))

    listfile, logfile = (os.path.join(build, "meson-logs", f) for f in ("testlist.txt", "testlog.json"))
    if not os.path.exists(listfile):
        fail("", "no meson-logs/testlist.txt (meson test --list before the run; scripts/test.sh writes it)")
        return n, notes
    with open(listfile) as f:
        declared = [l.strip() for l in f if l.strip() not in ("", "No suitable tests defined.", "No tests defined.")]
    if not declared:
        fail("", "no tests match this selection (\"No suitable tests defined\": a mistyped --suite?)")
        return n, notes
    tests = []
    if not os.path.exists(logfile):
        fail("", "no meson-logs/testlog.json: meson test did not run")
    elif os.path.getmtime(logfile) < os.path.getmtime(listfile):
        fail("", "meson-logs/testlog.json is older than this run's test list: a stale log, not counted")
    else:
        with open(logfile) as f:
            tests = [json.loads(l) for l in f if l.strip()]
    for t in tests:
        if t["name"] not in declared:
            fail(t["name"], "in the log but not declared for this run (a stale log?), not counted")
            continue
        tn, tnotes = count(t)
        for k in n:
            n[k] += tn[k]
        notes += [(kind, t["name"], why) for kind, why in tnotes]
    for name in declared:
        if name not in {t["name"] for t in tests}:
            fail(name, "declared but did not run")
    return n, notes


def main(builds):
    total = {"passed": 0, "failed": 0, "skipped": 0}
    for build in builds:
        n, notes = summarize(build)
        for k in total:
            total[k] += n[k]
        for kind, name, why in sorted(notes, key=lambda note: note[0] == "FAIL"):
            print(f"{kind} {os.path.basename(os.path.abspath(build))}: {name + ': ' if name else ''}{why}")
    line = f"{total['passed']} passed, {total['failed']} failed"
    if total["skipped"]:
        line += f", {total['skipped']} skipped"
    print(line)
    return 1 if total["failed"] or not total["passed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]) if len(sys.argv) > 1 else "usage: test_summary.py BUILD_DIR...")
