#!/usr/bin/env bash
# Make (or reuse) the Python venv for the python and s3 suites: torch 2.x,
# numpy, pytest, boto3 and moto[server] from PyPI, and the project's own wheel,
# the distribution ckptd (import name ckpt; libckpt, ckptd and ckptctl
# inside it): built from the source tree with meson-python (pyproject.toml)
# and repaired into a manylinux wheel (scripts/wheel.sh) in build-wheel/,
# and installed, on every run, so that the python suite tests what pip
# installs.
# If PyPI torch cannot be installed, fall back to Debian's python3-torch
# (1.13): the suite then skips what needs DCP and says so.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/.venv-test}
ok() { "$venv/bin/python" -c "import torch, pytest, numpy, boto3, moto.server" 2>/dev/null; }
wheel() {
  # What the suite also tests with: ckpt.format's fast CRC32C (it falls back
  # to pure Python without it) and its zstd (for compressed steps), the
  # frameworks of ckpt's plugins (jax and orbax-checkpoint: ckpt.jax and
  # ckpt.orbax, tested on CPU), and the type checker the suite runs on the
  # package.
  "$venv/bin/python" -c "import google_crc32c, zstandard, lightning, transformers, accelerate, mypy, jax, orbax.checkpoint" 2>/dev/null ||
    "$venv/bin/pip" install -q google-crc32c zstandard lightning transformers accelerate mypy jax orbax-checkpoint >/dev/null || return 1
  "$venv/bin/pip" uninstall -q -y ckpt >/dev/null 2>&1 # the package's name before it became ckptd
  # The manylinux wheel (scripts/wheel.sh: auditwheel repair), as a user
  # installs it.
  local whl
  whl=$("$root/scripts/wheel.sh" "$venv/bin/python") &&
    "$venv/bin/pip" install -q --no-deps --force-reinstall "$whl" >/dev/null
}
if [ -x "$venv/bin/python" ] && ok; then
  wheel && exit 0
  echo "building or installing the ckptd wheel failed" >&2
  exit 1
fi
rm -rf "$venv"
python3 -m venv "$venv" || exit 1
if ! "$venv/bin/pip" install -q torch numpy; then
  echo "PyPI torch could not be installed; falling back to Debian's python3-torch" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q python3-torch python3-numpy || exit 1
  rm -rf "$venv"
  python3 -m venv --system-site-packages "$venv" || exit 1
fi
"$venv/bin/pip" install -q pytest boto3 "moto[server]" || exit 1
ok || exit 1
wheel || { echo "building or installing the ckptd wheel failed" >&2; exit 1; }
"$venv/bin/python" -c "import torch; print('python suite: torch', torch.__version__)"
