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


def round_trip_in_venv(python, wheel, daemon, venv):
    """A fresh venv of python with only wheel in it saves and restores
    through daemon, with the package from the venv."""
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "--no-index", wheel],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    r = subprocess.run([str(venv / "bin" / "python"), "-c", ROUND_TRIP, daemon.sock], env=clean_env(), cwd="/",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert str(venv) in r.stdout


@pytest.mark.skipif(not WHEELS, reason="no build-wheel/ckptd-*.whl (scripts/venv.sh builds it)")
def test_wheel_into_a_fresh_venv(daemon, tmp_path):
    round_trip_in_venv(sys.executable, WHEELS[-1], daemon, tmp_path / "venv")


MANYLINUX = sorted(glob.glob(os.path.join(ROOT, "build-wheel", "ckptd-*manylinux*.whl")))
# What ckptd and libckpt link that no manylinux system provides: the wheel
# must carry its own copies (ckptd.libs/).
GRAFTED = ("libprotobuf-c.so.1", "libuv.so.1", "libisal.so.2", "libinih.so.1", "libjson-c.so.5", "libxxhash.so.0",
           "libcurl.so.4", "libsystemd.so.0")


@pytest.mark.skipif(not MANYLINUX, reason="no build-wheel/ckptd-*manylinux*.whl (scripts/venv.sh builds it)")
def test_the_wheel_is_manylinux_and_carries_the_daemon():
    """auditwheel show proves the tag scripts/wheel.sh gave it; the wheel
    holds ckptd, ckptctl and the libraries they need."""
    r = subprocess.run([sys.executable, "-m", "auditwheel", "show", MANYLINUX[-1]], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    said = " ".join(r.stdout.split())
    assert 'consistent with the following platform tag: "manylinux_2_34_x86_64"' in said, said
    assert MANYLINUX[-1].endswith("-py3-none-manylinux_2_34_x86_64.whl")  # any Python 3: no extension module
    import zipfile
    names = zipfile.ZipFile(MANYLINUX[-1]).namelist()
    for want in ("ckpt/_bin/ckptd", "ckpt/_bin/ckptctl", "ckpt/libckpt.so"):
        assert want in names
    libs = [n for n in names if n.startswith("ckptd.libs/")]
    for so in GRAFTED:
        stem = so.split(".so")[0]
        assert any(os.path.basename(n).startswith(stem + "-") for n in libs), (so, libs)


HIDDEN = r"""
set -e
for so in $LIBS; do
  f=$(readlink -f /lib/x86_64-linux-gnu/$so 2>/dev/null || true)
  [ -f "$f" ] && mount --bind /dev/null "$f"
done
# The system's copies are gone for this namespace ...
if "$PY" -c "import ctypes; ctypes.CDLL('libprotobuf-c.so.1')" 2>/dev/null; then
  echo "the system's libprotobuf-c is still there"; exit 1
fi
# ... and the wheel installs and runs without them.
"$PY" -m venv "$T/venv"
"$T/venv/bin/pip" install -q --no-deps --no-index "$WHEEL"
"$T/venv/bin/ckptd" --version
if ldd "$T"/venv/lib/python3*/site-packages/ckpt/_bin/ckptd | grep 'not found'; then exit 1; fi
"$T/venv/bin/ckptctl" --version
"$T/venv/bin/ckptd" --socket "$T/s.sock" --storage "file://$T/store" --state-dir "$T/state" \
    --staging-bytes 64M --set server.idle_exit_ms=2000 2> "$T/ckptd.log" &
for i in $(seq 100); do [ -S "$T/s.sock" ] && break; sleep 0.1; done
cd / && "$T/venv/bin/python" -c "$ROUND_TRIP" "$T/s.sock"
"""


@pytest.mark.skipif(not MANYLINUX, reason="no build-wheel/ckptd-*manylinux*.whl (scripts/venv.sh builds it)")
def can_unshare_mounts():
    """Root, and allowed a mount namespace (not in every container)."""
    if os.geteuid() != 0:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not can_unshare_mounts(), reason="hiding the system's libraries takes a mount namespace "
                    "(root, and a kernel or container that allows one)")
def test_the_wheel_works_where_its_libraries_are_absent(tmp_path):
    """In a mount namespace where protobuf-c, libuv, curl and the rest of
    what ckptd links are hidden (/dev/null bound over them), pip installs
    the wheel into a fresh venv, and its ckptd and libckpt save and
    restore."""
    env = clean_env()
    env.update(LIBS=" ".join(GRAFTED), PY=sys.executable, T=str(tmp_path), WHEEL=MANYLINUX[-1],
               ROUND_TRIP=ROUND_TRIP)
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", HIDDEN], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr + (tmp_path / "ckptd.log").read_text(errors="replace") \
        if (tmp_path / "ckptd.log").exists() else r.stdout + r.stderr
    assert "ok " in r.stdout


def other_pythons():
    """Python 3 interpreters here other than this one (pyenv's, or on
    $PATH), newest of each minor version: the trainer images' 3.10 and 3.12
    among them where present."""
    import shutil
    found = {}
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for minor in ("3.9", "3.10", "3.12", "3.13"):
        if minor == mine:
            continue
        cands = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{minor}.*/bin/python3")))
        path = cands[-1] if cands else shutil.which(f"python{minor}")
        if path:
            found[minor] = path
    return found


@pytest.mark.skipif(not MANYLINUX, reason="no build-wheel/ckptd-*manylinux*.whl (scripts/venv.sh builds it)")
@pytest.mark.skipif(not other_pythons(), reason="no Python 3 here but the suite's")
@pytest.mark.parametrize("minor", sorted(other_pythons()) or ["none"])
def test_one_wheel_for_every_python(daemon, tmp_path, minor):
    """The wheel is py3-none: the same file installs into a venv of
    another Python 3 and saves and restores there."""
    round_trip_in_venv(other_pythons()[minor], MANYLINUX[-1], daemon, tmp_path / "venv")
