"""Issue "Python adoption": the distribution ckptd installs and works with
no environment variable. scripts/venv.sh builds the wheel from the source
tree (meson-python) into build-wheel/ and installs it into the test venv;
here it is imported from there with a clean environment (no CKPT_LIB, no
PYTHONPATH), and installed again into a fresh venv, and each saves and
restores a step through a real daemon."""
import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WHEELS = sorted(glob.glob(os.path.join(ROOT, "build-wheel", "ckptd-*.whl")))

ROUND_TRIP = r"""
import os, sys, ckpt, ckpt._lib
here = os.path.dirname(ckpt.__file__)
assert "site-packages" in here, here
assert ckpt._lib._find() == os.path.join(here, "libckpt.so"), ckpt._lib._find()
c = ckpt.Client(sys.argv[1], job=f"wheel-{os.getpid()}", rank=0, world_size=1)
b = c.alloc(4096)
b.view[:] = bytes(range(256)) * 16
spec = ckpt.TensorSpec("w", "u8", (4096,), b, 0, 4096)
c.save(1, [spec]).durable.result(60)
b.view[:] = bytes(4096)
c.load([spec], 1).result(60)
assert bytes(b.view) == bytes(range(256)) * 16
print("ok", here)
"""


def clean_env():
    env = {k: v for k, v in os.environ.items() if k not in ("CKPT_LIB", "PYTHONPATH")}
    return env


@pytest.mark.skipif(not WHEELS, reason="no build-wheel/ckptd-*.whl (scripts/venv.sh builds it)")
def test_installed_wheel_works_without_environment(daemon):
    r = subprocess.run([sys.executable, "-c", ROUND_TRIP, daemon.sock], env=clean_env(), cwd="/",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok ")


@pytest.mark.skipif(not WHEELS, reason="no build-wheel/ckptd-*.whl (scripts/venv.sh builds it)")
def test_wheel_into_a_fresh_venv(daemon, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "--no-index", WHEELS[-1]],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    r = subprocess.run([str(venv / "bin" / "python"), "-c", ROUND_TRIP, daemon.sock], env=clean_env(), cwd="/",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert str(venv) in r.stdout
