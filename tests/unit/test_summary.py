#!/usr/bin/env python3
"""scripts/test_summary.py against made-up build directories (a test list
and a testlog.json each, as scripts/test.sh leaves them) and one real meson
1.0 log (summary/testlog.json). Prints TAP, one case per check."""
import json
import os
import subprocess
import sys
import tempfile
import traceback

here = os.path.dirname(os.path.realpath(__file__))
summary = os.path.join(here, "..", "..", "scripts", "test_summary.py")


def entry(name, stdout, result="OK", returncode=0):
    return {"name": name, "stdout": stdout, "result": result, "returncode": returncode,
            "starttime": 0, "duration": 0, "env": {}, "command": ["x"]}


def tap(n_ok, plan=None, extra=""):
    return f"1..{n_ok if plan is None else plan}\n" + "".join(f"ok {i} - case{i}\n" for i in range(1, n_ok + 1)) + extra


PASSING = entry("ckptd:unit / pool", tap(3))


def run(*builds, stale=False):
    """Lay out each build as (list lines or None, log entries or None) and run
    the summary on them all: (exit status, output lines)."""
    with tempfile.TemporaryDirectory() as tmp:
        dirs = []
        for i, (listed, tests) in enumerate(builds):
            d = os.path.join(tmp, f"build{i}")
            os.makedirs(os.path.join(d, "meson-logs"))
            dirs.append(d)
            listfile, logfile = (os.path.join(d, "meson-logs", f) for f in ("testlist.txt", "testlog.json"))
            if listed is not None:
                with open(listfile, "w") as f:
                    f.write("".join(l + "\n" for l in listed))
            if tests is not None:
                with open(logfile, "w") as f:
                    f.write("".join(json.dumps(t) + "\n" for t in tests))
                if stale:
                    t = os.path.getmtime(listfile) - 60
                    os.utime(logfile, (t, t))
        p = subprocess.run([sys.executable, summary] + dirs, capture_output=True, text=True)
        return p.returncode, p.stdout.splitlines()


def ran(*tests):
    """A build whose list declares exactly the tests in its log."""
    return [t["name"] for t in tests], list(tests)


def check(result, status, closing, *notes):
    rc, out = result
    assert out and out[-1] == closing, f"closing line {out[-1:]!r}, want {closing!r}\n" + "\n".join(out)
    assert (rc != 0) == (status != 0), f"exit status {rc}, want {status}\n" + "\n".join(out)
    for n in notes:
        assert any(n in l for l in out[:-1]), f"no line with {n!r} in\n" + "\n".join(out)


def test_real_meson_log():
    # meson 1.0: no protocol field; k8s, systemd and smoke print TAP without
    # CMOCKA_MESSAGE_OUTPUT; pytest with and without -q.
    with open(os.path.join(here, "summary", "testlog.json")) as f:
        tests = [json.loads(l) for l in f]
    # pool 8, multinode 5, memtier 8, data_path 11, k8s 20, systemd 3,
    # smoke 8, pytest 25, pytest-s3 33
    check(run(ran(*tests)), 0, "121 passed, 0 failed")


def test_tap_without_tap_env():
    k8s = entry("ckptd:deploy / k8s", tap(20))
    systemd = entry("ckptd:deploy / systemd", "1..3\nok 1 - a\nnot ok 2 - b\n# why\nok 3 - c # SKIP no systemd-analyze\n",
                    result="FAIL", returncode=1)
    check(run(ran(k8s, systemd)), 1, "21 passed, 1 failed, 1 skipped",
          "FAIL build0: ckptd:deploy / systemd: 2 - b", "SKIP build0: ckptd:deploy / systemd: 3 - c: no systemd-analyze")


def test_tap_todo_and_skipped_plan():
    todo = entry("ckptd:unit / todo", "1..2\nnot ok 1 - known # TODO later\nok 2 - fixed # TODO later\n",
                 result="UNEXPECTEDPASS", returncode=0)
    empty = entry("ckptd:unit / empty", "1..0 # SKIP nothing to do here\n", result="SKIP")
    check(run(ran(PASSING, todo, empty)), 1, "3 passed, 1 failed, 2 skipped",
          "SKIP build0: ckptd:unit / empty: nothing to do here", "FAIL build0: ckptd:unit / todo: 2 - fixed passed but is marked TODO")


def test_crash_after_cases():
    crash = entry("ckptd:integration / data_path", tap(4, plan=10), result="FAIL", returncode=-11)
    check(run(ran(crash)), 1, "4 passed, 6 failed", "6 of 10 planned cases did not run")


def test_failure_after_all_cases():
    # every case passed, then ASan reported a leak at exit
    leak = entry("ckptd:unit / pool", tap(3), result="FAIL", returncode=1)
    check(run(ran(leak)), 1, "3 passed, 1 failed", "FAIL build0: ckptd:unit / pool: meson: FAIL, exit status 1")


def test_pytest_all_skipped():
    out = "collected 5 items\n\nt.py sssss\n\n=== short test summary info ===\nSKIPPED [5] t.py:3: no gpu\n===== 5 skipped in 1.20s =====\n"
    skipped = entry("ckptd:python / pytest", out)
    check(run(ran(skipped)), 1, "0 passed, 0 failed, 5 skipped", "SKIP build0: ckptd:python / pytest: [5] t.py:3: no gpu")
    check(run(ran(PASSING, skipped)), 0, "3 passed, 0 failed, 5 skipped")


def test_pytest_xfail_deselected_xpass_error():
    xfail = entry("ckptd:python / pytest",
                  "collected 15 items / 10 deselected / 5 selected\n== 2 passed, 3 xfailed, 10 deselected, 4 warnings in 0.50s ==\n")
    check(run(ran(xfail)), 0, "2 passed, 0 failed, 3 skipped", "3 xfailed")
    quiet = entry("ckptd:s3 / pytest-s3", "..X.E\n2 passed, 1 xpassed, 3 warnings, 1 error in 1.0s\n", result="FAIL", returncode=1)
    check(run(ran(quiet)), 1, "2 passed, 2 failed", "1 xpassed", "1 error")
    none = entry("ckptd:python / pytest", "collected 4 items / 4 deselected / 0 selected\n== 4 deselected in 0.01s ==\n",
                 result="FAIL", returncode=5)
    check(run(ran(PASSING, none)), 1, "3 passed, 1 failed", "exit status 5")


def test_pytest_shortfall():
    short = entry("ckptd:python / pytest", "collected 10 items\n\n== 8 passed in 2.00s ==\n")
    check(run(ran(short)), 1, "8 passed, 2 failed", "2 of 10 collected cases not accounted for")
    killed = entry("ckptd:python / pytest", "collected 10 items\n\nt.py ......", result="TIMEOUT", returncode=-15)
    check(run(ran(killed)), 1, "0 passed, 10 failed", "no closing line")


def test_declared_test_did_not_run():
    check(run((["ckptd:unit / pool", "ckptd:unit / crc32c"], [PASSING])), 1, "3 passed, 1 failed",
          "FAIL build0: ckptd:unit / crc32c: declared but did not run")


def test_undeclared_test_in_log():
    check(run((["ckptd:unit / pool"], [PASSING, entry("ckptd:unit / old", tap(7))])), 1, "3 passed, 1 failed",
          "ckptd:unit / old: in the log but not declared")


def test_missing_suite_with_reason():
    cuda = entry("ckptd:cuda / cuda", "no cuda.h in /usr/local/cuda/include\n", result="SKIP", returncode=77)
    check(run(ran(PASSING, cuda)), 0, "3 passed, 0 failed, 1 skipped",
          "SKIP build0: ckptd:cuda / cuda: no cuda.h in /usr/local/cuda/include")


def test_stale_log():
    check(run(ran(PASSING), stale=True), 1, "0 passed, 2 failed",
          "a stale log, not counted", "ckptd:unit / pool: declared but did not run")


def test_mistyped_suite():
    # meson prints "No suitable tests defined.", exits 0 and writes no log;
    # an earlier run's log must not be counted either
    for log in (None, [PASSING]):
        check(run((["No suitable tests defined."], log)), 1, "0 passed, 1 failed", "mistyped --suite")
    check(run(ran(PASSING), (["No suitable tests defined."], None)), 1, "3 passed, 1 failed", "build1: no tests match")


def test_no_log_or_no_list():
    check(run((["ckptd:unit / pool"], None)), 1, "0 passed, 2 failed", "meson test did not run")
    check(run((None, [PASSING])), 1, "0 passed, 1 failed", "no meson-logs/testlist.txt")


def test_zero_passed_fails():
    check(run(ran(entry("ckptd:cuda / cuda", "no cuda.h\n", result="SKIP", returncode=77))), 1, "0 passed, 0 failed, 1 skipped")


cases = [f for name, f in list(globals().items()) if name.startswith("test_")]
print(f"1..{len(cases)}")
failed = 0
for i, case in enumerate(cases, 1):
    try:
        case()
        print(f"ok {i} - {case.__name__}")
    except Exception:
        failed += 1
        print(f"not ok {i} - {case.__name__}")
        print("".join("# " + l + "\n" for l in traceback.format_exc().splitlines()), end="")
sys.exit(1 if failed else 0)
