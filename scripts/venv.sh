#!/usr/bin/env bash
# Make (or reuse) the Python venv for the python and s3 suites: torch 2.x,
# numpy, pytest, boto3 and moto[server] from PyPI, and the ckpt package itself (pip install ./client/python).
# If PyPI torch cannot be installed, fall back to Debian's python3-torch
# (1.13): the suite then skips what needs DCP and says so.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/.venv-test}
ok() { "$venv/bin/python" -c "import torch, pytest, numpy, boto3, moto.server" 2>/dev/null; }
if [ -x "$venv/bin/python" ] && ok; then
  "$venv/bin/pip" install -q --no-deps --force-reinstall "$root/client/python" >/dev/null && exit 0
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
"$venv/bin/pip" install -q --no-deps "$root/client/python" >/dev/null || exit 1
"$venv/bin/python" -c "import torch; print('python suite: torch', torch.__version__)"
