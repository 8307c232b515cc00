#!/usr/bin/env python3
"""The container image can start what it ships, checked without Docker.

For every binary the image installs (ckptd, ckptctl, libckpt), each NEEDED
entry (readelf -d) is mapped to the Debian package that holds it on this
machine (dpkg -S), and that package must be installed by the runtime stage
of deploy/Dockerfile (or be in the base image: libc6). The build stage must
compile the CUDA driver API in (-Dcuda=enabled with cuda.h copied in), so
the image's ckptd can stage GPU buffers.

    check_image_libs.py SOURCE_ROOT BINARY...

Prints TAP."""
import os
import re
import shutil
import subprocess
import sys

BASE = {"libc6"}  # in debian:12-slim already
OURS = {"libckpt.so.2"}


def stages(dockerfile):
    """[(from line, text)] of each stage."""
    text = open(dockerfile).read()
    # Join continued lines.
    text = re.sub(r"\\\n", " ", text)
    parts = re.split(r"(?m)^FROM ", text)
    return [("FROM " + p.splitlines()[0], p) for p in parts[1:]]


def apt_packages(stage_text):
    pkgs = set()
    for m in re.finditer(r"apt-get install ([^&\n]*)", stage_text):
        for w in m.group(1).split():
            if not w.startswith("-"):
                pkgs.add(w)
    return pkgs


def needed(binary):
    out = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def package_of(lib):
    """The Debian package holding lib on this machine, or None."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"  # not on a user's PATH on Debian
    out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
    paths = []
    for line in out.splitlines():
        parts = line.strip().split(" => ")
        if len(parts) == 2 and parts[0].split(" ")[0] == lib:
            paths.append(parts[1])
    cands = []
    for p in paths:
        real = os.path.realpath(p)
        for q in (p, real):
            cands += [q, q.replace("/usr/lib/", "/lib/", 1), q.replace("/lib/", "/usr/lib/", 1)]
    for c in cands:
        r = subprocess.run(["dpkg", "-S", c], capture_output=True, text=True)
        if r.returncode == 0 and r.stdout:
            return r.stdout.split(":")[0].strip()
    return None


def main():
    root, binaries = sys.argv[1], sys.argv[2:]
    checks = []
    st = stages(os.path.join(root, "deploy", "Dockerfile"))
    build = [t for f, t in st if "meson setup" in t]
    runtime_pkgs = apt_packages(st[-1][1])
    checks.append(("the Dockerfile has a build stage and a runtime stage", len(st) >= 2 and build))
    b = build[0] if build else ""
    checks.append(("the build stage compiles CUDA in (-Dcuda=enabled)", "-Dcuda=enabled" in b))
    m = re.search(r"-Dcudah_dir=(\S+)", b)
    checks.append(("the build stage names cudah_dir and puts cuda.h there",
                   m is not None and re.search(r"cuda\.h\s+" + re.escape(m.group(1)), b) is not None))
    for binary in binaries:
        name = os.path.basename(binary)
        for lib in needed(binary):
            # The image is built without sanitizers; a sanitizer build of the
            # suite links their runtimes, which the image never needs.
            if lib in OURS or lib.startswith(("ld-linux", "libasan.", "libubsan.", "liblsan.", "libtsan.")):
                continue
            pkg = package_of(lib)
            ok = pkg is not None and (pkg in runtime_pkgs or pkg in BASE)
            checks.append((f"{name} needs {lib}, from {pkg or 'no package found'}: "
                           f"{'installed by' if ok else 'NOT installed by'} the runtime stage", ok))
    print(f"1..{len(checks)}")
    for i, (desc, ok) in enumerate(checks, 1):
        print(f"{'ok' if ok else 'not ok'} {i} - {desc}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
