#!/usr/bin/env python3
"""The documentation holds together (issue "Code and docs"). Prints TAP:

- every relative link in README.md and docs/ resolves: the file exists,
  and an #anchor names a heading of it;
- every reference `docs/FILE.md "Section"` in the tracked files (code
  comments, help texts, docs) names a file that exists and a heading or
  a **bold** paragraph name in it;
- no config key `ckptd --check-config` prints is an entry of its section
  in ckptd.conf(5) twice (check_man.py checks each is there); every command of
  `ckptctl --help` is an entry of ckptctl(1) exactly once;
- every metric ckptd exports (the names in daemon/ops/) is in the metrics
  list of docs/operations.md;
- the README stays a README: at most 400 lines.

    check_docs.py SOURCE_ROOT CKPTD CKPTCTL
"""
import os
import re
import subprocess
import sys

root, ckptd, ckptctl = sys.argv[1:4]
checks = []


def check(desc, ok):
    checks.append((desc, bool(ok)))


def read(rel):
    return open(os.path.join(root, rel), encoding="utf-8").read()


def slug(heading):
    """GitHub's anchor of a heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def headings(text):
    return [m.group(1) for m in re.finditer(r"^#+ (.+)$", text, re.M)]


tracked = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True).stdout.split()
if not tracked:  # a copy of the tree without git: walk it
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith((".", "build"))]
        tracked += [os.path.relpath(os.path.join(d, n), root) for n in names]

# 1. Relative links.
md = ["README.md"] + sorted(p for p in tracked if p.startswith("docs/") and p.endswith(".md"))
bad_links = []
for p in md:
    text = read(p)
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold no links
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(os.path.join(root, p)), path)) if path else \
            os.path.join(root, p)
        if not os.path.exists(full):
            bad_links.append(f"{p}: {target} (no such file)")
        elif anchor and full.endswith(".md") and anchor not in [slug(h) for h in headings(open(full).read())]:
            bad_links.append(f"{p}: {target} (no such heading)")
check(f"every relative link in README.md and docs/ resolves ({'; '.join(bad_links[:5])})", not bad_links)

# 2. docs/FILE.md "Section" references.
REF = re.compile(r'(docs/[a-z_/]+\.md)[\s*#/]*\\?"([^"\\]+)\\?"')
bad_refs, nrefs = [], 0
for p in tracked:
    if p.startswith(("tests/fuzz/corpus/", ".gpu")) or p == "tests/docs/check_docs.py" or \
            not os.path.isfile(os.path.join(root, p)):
        continue
    try:
        text = read(p)
    except (UnicodeDecodeError, OSError):
        continue
    for m in REF.finditer(text):
        f, name = m.group(1), re.sub(r"\s*\n\s*(\*|#|//)?\s*", " ", m.group(2)).strip()
        nrefs += 1
        if not os.path.exists(os.path.join(root, f)):
            bad_refs.append(f"{p}: {f} (no such file)")
            continue
        doc = read(f)
        names = [h for h in headings(doc)] + re.findall(r"\*\*([^*]+)\*\*", doc)
        if not any(n.startswith(name) or re.sub(r"[.:]$", "", n) == name for n in names):
            bad_refs.append(f'{p}: {f} "{name}"')
check(f"every docs/FILE.md \"Section\" reference resolves ({nrefs}; {'; '.join(bad_refs[:5])})",
      nrefs > 50 and not bad_refs)


# 3. Man pages: each key and command an entry once.
def entries(body):
    """The terms of a man page body's .TP entries."""
    out = []
    for m in re.finditer(r"^\.TP\n\.(?:B|BR|BI|I)? ?(.+)$", body, re.M):
        out += re.findall(r"[A-Za-z_][A-Za-z0-9_\\-]*", m.group(1).replace("\\-", "-"))
    return out


conf_page = read("docs/man/ckptd.conf.5")
secs = {m.group(1): m.group(2) for m in
        re.finditer(r"^\.SH \[([a-z.A-Z]+)\]\n(.*?)(?=^\.SH |\Z)", conf_page, re.M | re.S)}
conf = subprocess.run([ckptd, "--check-config", "--config", "/dev/null", "--storage", "file:///x"],
                      capture_output=True, text=True, check=True).stdout
# (That every key is described at all is tests/unit/check_man.py's.)
section, twice = None, []
for line in conf.splitlines():
    m = re.match(r"^\[([a-z]+)\]$", line)
    if m:
        section = m.group(1)
        continue
    m = re.match(r"^([a-z_]+) =", line)
    if m and section and entries(secs.get(section, "")).count(m.group(1)) > 1:
        twice.append(f"[{section}] {m.group(1)}")
check(f"no config key is an entry of ckptd.conf(5) twice ({'; '.join(twice[:5])})", not twice)
helptext = subprocess.run([ckptctl, "--help"], capture_output=True, text=True).stdout
cmds = re.findall(r"^  ([a-z]+)\b", helptext, re.M)
ctl = read("docs/man/ckptctl.1")
ctl_cmds = re.findall(r"^\.TP\n\.B[IR]? ([a-z]+)\b", ctl.split(".SH OPTIONS")[0], re.M)
wrong = [c for c in cmds if ctl_cmds.count(c) != 1]
check(f"each of ckptctl's {len(cmds)} commands is an entry of ckptctl(1) once ({', '.join(wrong)})",
      len(cmds) >= 8 and not wrong)

# 4. Metrics.
names = set()
for p in ("daemon/ops/status.c", "daemon/ops/metrics.c"):
    names |= set(re.findall(r'"(ckptd_[a-z_]+)"', read(p)))
ops = read("docs/operations.md")
undocumented = sorted(n for n in names if n not in ops)
check(f"each of the {len(names)} metrics is in docs/operations.md ({', '.join(undocumented[:6])})",
      len(names) > 20 and not undocumented)

# 5. The README.
n = read("README.md").count("\n")
check(f"README.md is at most 400 lines ({n})", n <= 400)

print(f"1..{len(checks)}")
for i, (d, ok) in enumerate(checks, 1):
    print(f"{'ok' if ok else 'not ok'} {i} - {d}")
sys.exit(0 if all(ok for _, ok in checks) else 1)
