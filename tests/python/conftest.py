"""Fixtures: a real ckptd on a temporary socket (CKPTD_BIN), libckpt from
CKPT_LIB, and the package from client/python."""
import os
import shutil
import signal
import socket as socketlib
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))


class Daemon:
    def __init__(self, tmp, conf="", staging="256M"):
        self.dir = tmp
        self.staging = staging
        self.sock = os.path.join(tmp, "run", "ckptd.sock")
        self.store = os.path.join(tmp, "store")
        self.url = "file://" + self.store
        self.conf = os.path.join(tmp, "ckptd.conf")
        with open(self.conf, "w") as f:
            f.write(conf)
        self.proc = None

    def start(self):
        log = open(os.path.join(self.dir, "ckptd.log"), "a")
        self.proc = subprocess.Popen(
            [os.environ["CKPTD_BIN"], "--socket", self.sock, "--storage", self.url, "--staging-bytes", self.staging,
             "--chunk-bytes", "4M", "--state-dir", os.path.join(self.dir, "state"), "--config", self.conf],
            stdout=log, stderr=log)
        for _ in range(600):
            if os.path.exists(self.sock):
                s = socketlib.socket(socketlib.AF_UNIX)
                try:
                    s.connect(self.sock)
                    return self
                except OSError:
                    pass
                finally:
                    s.close()
            if self.proc.poll() is not None:
                raise RuntimeError(f"ckptd exited: {self.proc.returncode}")
            time.sleep(0.05)
        raise RuntimeError("ckptd did not start")

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(60)
        rc = self.proc.returncode if self.proc else None
        self.proc = None
        return rc


@pytest.fixture
def daemon_factory():
    made = []

    def make(conf="", staging="256M"):
        d = Daemon(tempfile.mkdtemp(prefix="ckpt-py-"), conf, staging)
        made.append(d)
        return d.start()
    yield make
    for d in made:
        d.stop(signal.SIGKILL)
        shutil.rmtree(d.dir, ignore_errors=True)


@pytest.fixture
def daemon(daemon_factory):
    return daemon_factory()


def same(a, b):
    """Equal trees of tensors, dicts, lists and plain values."""
    import torch
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b
