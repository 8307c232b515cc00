"""Issue "Python adoption": ckpt.lightning's CheckpointIO with the real
Lightning on CPU. One run trains 3 epochs straight; another trains 2 and is
killed (SIGKILL), then a third process resumes it from last.ckpt (a pointer
to a ckptd step) and trains the third epoch. The resumed run ends with the
same weights, optimizer state, step and best score as the straight one."""
import os
import subprocess
import sys

import pytest
import torch

L = pytest.importorskip("lightning")
import ckpt.lightning  # noqa: E402
from conftest import same  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def run(daemon, job, ckdir, epochs, out, resume=None):
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "..", "client", "python"))
    args = [sys.executable, os.path.join(HERE, "lit_train.py"), daemon.sock, job, str(ckdir), str(epochs), str(out)]
    r = subprocess.run(args + ([str(resume)] if resume else []), env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == -9, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-4000:]}"  # killed, as it asks
    return torch.load(out, weights_only=False)


def test_lightning_resume_after_kill(daemon, tmp_path):
    straight = run(daemon, "lit-straight", tmp_path / "a", 3, tmp_path / "a.pt")
    run(daemon, "lit-killed", tmp_path / "b", 2, tmp_path / "b.pt")
    last = tmp_path / "b" / "last.ckpt"
    assert ckpt.lightning.read_pointer(last) == ("lit-killed", 8)  # 2 epochs of 4 batches
    resumed = run(daemon, "lit-killed", tmp_path / "b", 3, tmp_path / "c.pt", resume=last)
    assert resumed["global_step"] == straight["global_step"] == 12
    assert resumed["epoch"] == straight["epoch"]
    assert same(resumed["weights"], straight["weights"]), "weights differ after resuming"
    assert same(resumed["optim"], straight["optim"]), "optimizer state differs after resuming"
    assert resumed["best"] == straight["best"]
    # The steps are in ckptd; top-k removal removed the ones Lightning dropped.
    with ckpt.Client(daemon.sock) as c:
        steps = [s["step"] for s in c.list("lit-killed") if s["complete"]]
    assert 12 in steps and 8 in steps, steps
    pointers = {n: ckpt.lightning.read_pointer(tmp_path / "b" / n) for n in os.listdir(tmp_path / "b")}
    assert all(p is not None for p in pointers.values()), pointers
    assert set(steps) == {p[1] for p in pointers.values()}, (steps, pointers)
