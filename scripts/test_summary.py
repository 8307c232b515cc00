#!/usr/bin/env python3
"""Count test cases across meson test logs (TAP subtests count one each) and
print the closing line: N passed, N failed[, N skipped]. Exit 1 on failure."""
import json
import re
import sys

passed = failed = skipped = 0
for path in sys.argv[1:]:
    with open(path) as f:
        for line in f:
            t = json.loads(line)
            result = t.get("result", "")
            cases = []
            if t.get("protocol") == "tap" or "TAP" in str(t.get("env", {})):
                for l in (t.get("stdout") or "").splitlines():
                    m = re.match(r"^(not ok|ok)\b.*?(# (SKIP|skip|TODO).*)?$", l)
                    if m:
                        if m.group(2) and m.group(3).upper() == "SKIP":
                            cases.append("SKIP")
                        else:
                            cases.append("OK" if m.group(1) == "ok" else "FAIL")
            if not cases:
                # pytest: its closing line, "3 failed, 10 passed, 1 skipped in 4.2s"
                last = [l for l in (t.get("stdout") or "").splitlines() if re.search(r"\d+ (passed|failed)", l)]
                if last:
                    for n, kind in re.findall(r"(\d+) (passed|failed|skipped|error|errors)", last[-1]):
                        cases += [{"passed": "OK", "skipped": "SKIP"}.get(kind, "FAIL")] * int(n)
                    if result not in ("OK", "EXPECTEDFAIL") and "FAIL" not in cases:
                        cases.append("FAIL")
            if not cases:
                cases = ["SKIP" if result == "SKIP" else "OK" if result in ("OK", "EXPECTEDFAIL") else "FAIL"]
            elif result not in ("OK", "EXPECTEDFAIL", "SKIP") and "FAIL" not in cases:
                # the binary failed (crash, sanitizer, leak) after its cases
                cases.append("FAIL")
            for c in cases:
                if c == "OK":
                    passed += 1
                elif c == "SKIP":
                    skipped += 1
                else:
                    failed += 1
line = f"{passed} passed, {failed} failed"
if skipped:
    line += f", {skipped} skipped"
print(line)
sys.exit(1 if failed or passed == 0 else 0)
