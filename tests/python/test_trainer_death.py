"""A trainer process SIGKILLed at each point of a save, through the Python
layer: right after the request went out (before staged, or racing it),
between staged and durable, and after durable (test_checkpointer.py's
resume test). The C side of the same guarantee is test_memtier.c's
test_trainer_sigkill_after_staged; these are its second, independent
defence. In every case the step is either complete and bit-exact or
absent, never partial, and the daemon goes on serving saves."""
import errno
import os
import signal
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import ckpt.client  # noqa: E402
import ckpt.torch  # noqa: E402
from conftest import ROOT  # noqa: E402

STEP = 7
N = 4 << 20  # 16 MiB of float32: several 4 MiB chunks

TRAINER = r"""
import sys, time, torch
import ckpt.torch
sock, job, phase = sys.argv[1:4]
t = torch.arange(%d, dtype=torch.float32) + %d
cp = ckpt.torch.Checkpointer(job, socket=sock)
f = cp.save({"t": t}, %d)
if phase == "staged":
    f.staged.result(60)
elif phase == "durable":
    f.durable.result(60)
print(phase, flush=True)
time.sleep(600)
""" % (N, STEP, STEP)


def kill_trainer_at(daemon, job, phase):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"))
    p = subprocess.Popen([sys.executable, "-c", TRAINER, daemon.sock, job, phase], stdout=subprocess.PIPE,
                         text=True, env=env)
    try:
        line = p.stdout.readline().strip()
        assert line == phase, f"trainer said {line!r} (rc {p.poll()})"
        p.send_signal(signal.SIGKILL)
        assert p.wait(60) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def step_state(daemon, job):
    """The job's step STEP as the daemon lists it: None, or the list entry."""
    c = ckpt.client.Client(socket=daemon.sock)
    try:
        return next((s for s in c.list(job) if s["step"] == STEP), None)
    finally:
        c.close()


def wait_complete(daemon, job, timeout):
    """Wait (Client.wait_complete) until the step is complete or timeout
    passes; the step's entry, or the last listing's when it is not."""
    c = ckpt.client.Client(socket=daemon.sock)
    try:
        return c.wait_complete(STEP, job=job, timeout=timeout)
    except ckpt.client.CkptError as e:
        if e.errno != errno.ETIMEDOUT:
            raise
    finally:
        c.close()
    return step_state(daemon, job)


def check_bit_exact(daemon, job):
    want = torch.arange(N, dtype=torch.float32) + STEP
    got = {"t": torch.zeros(N, dtype=torch.float32)}
    with ckpt.torch.Checkpointer(job, socket=daemon.sock) as cp:
        cp.load(got, step=STEP)
    assert torch.equal(got["t"], want)


def check_daemon_serves(daemon, job):
    """A new save of the same job works after the death."""
    with ckpt.torch.Checkpointer(job, socket=daemon.sock) as cp:
        cp.save({"t": torch.ones(1024)}, STEP + 1).durable.result(60)


def test_killed_between_staged_and_durable_becomes_durable(daemon_factory):
    # The upload takes at least 1.5 s, so the kill lands before durable.
    d = daemon_factory("[debug]\nstore_delay_ms = 1500\n")
    kill_trainer_at(d, "death-staged", "staged")
    s = step_state(d, "death-staged")
    assert s is None or not s["complete"], "durable before the kill: the test proves nothing"
    s = wait_complete(d, "death-staged", 60)
    assert s and s["complete"], f"the daemon did not finish the save of a dead trainer: {s}"
    check_bit_exact(d, "death-staged")
    # From storage as well, after a daemon restart.
    d.stop()
    d.start()
    check_bit_exact(d, "death-staged")
    check_daemon_serves(d, "death-staged")


def test_killed_right_after_the_request_is_all_or_nothing(daemon_factory):
    d = daemon_factory("[debug]\nstore_delay_ms = 300\n")
    kill_trainer_at(d, "death-early", "sent")
    s = wait_complete(d, "death-early", 15)
    if s is not None and s["complete"]:
        check_bit_exact(d, "death-early")
    else:
        # Nothing half-there is offered as latest.
        c = ckpt.client.Client(socket=d.sock, job="death-early")
        try:
            with pytest.raises(ckpt.client.CkptError):
                c.resolve()
        finally:
            c.close()
    check_daemon_serves(d, "death-early")


def test_killed_after_durable_keeps_the_step(daemon):
    kill_trainer_at(daemon, "death-durable", "durable")
    s = step_state(daemon, "death-durable")
    assert s and s["complete"]
    check_bit_exact(daemon, "death-durable")
    daemon.stop()  # and from storage
    daemon.start()
    check_bit_exact(daemon, "death-durable")
    check_daemon_serves(daemon, "death-durable")
