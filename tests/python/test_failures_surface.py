"""Issue 32: failures where the user is. A save that fails after save()
returned raises in the trainer at the next save(), wait() or close(),
naming its step, once; a new run that reuses a job name fails at its first
save(); load into another shape raises; connection and job-name errors say
what is wrong."""
import concurrent.futures
import errno
import os

import pytest
import torch

import ckpt.torch
from faults import break_dir


def state(seed=0):
    torch.manual_seed(seed)
    return {"w": torch.randn(64, 64), "b": torch.randn(64)}


def test_duplicate_step_raises_at_next_save_naming_it(daemon):
    sd = state()
    cp = ckpt.torch.Checkpointer("dup", socket=daemon.sock)
    cp.save(sd, 1).durable.result(30)
    again = cp.save(sd, 1)  # staged; refused once it reaches storage
    concurrent.futures.wait([again.durable], 30)  # not looking at its outcome
    with pytest.raises(ckpt.CkptError) as e:
        cp.save(sd, 2)
    assert e.value.errno == errno.EEXIST
    assert "step 1 of job 'dup' was not saved" in str(e.value), str(e.value)
    assert str(e.value).count("[Errno") == 1
    # Raised once: the next save and close go on.
    cp.save(sd, 2)
    cp.close()
    with ckpt.Client(daemon.sock) as c:
        assert sorted(s["step"] for s in c.list("dup") if s["complete"]) == [1, 2]


def test_close_and_wait_raise_an_unseen_failure(daemon):
    sd = state()
    cp = ckpt.torch.Checkpointer("dup-close", socket=daemon.sock)
    cp.save(sd, 1).durable.result(30)
    cp.save(sd, 1)  # ckptd refuses it (never overwritten): a failure nobody saw
    with pytest.raises(ckpt.CkptError, match="step 1 of job 'dup-close' was not saved"):
        cp.wait(30)
    cp.save(sd, 1)
    with pytest.raises(ckpt.CkptError, match="step 1 of job 'dup-close' was not saved"):
        cp.close()
    assert cp.client is None  # closed all the same


def test_a_failure_seen_is_not_raised_again(daemon):
    sd = state()
    with ckpt.torch.Checkpointer("dup-seen", socket=daemon.sock) as cp:
        cp.save(sd, 1).durable.result(30)
        fut = cp.save(sd, 1)
        with pytest.raises(ckpt.CkptError):
            fut.durable.result(30)  # the caller saw it
        cp.save(sd, 2)  # does not raise it again
        cp.wait(30)


def test_storage_error_raises_in_the_trainer(daemon):
    sd = state()
    with ckpt.torch.Checkpointer("broken", socket=daemon.sock) as cp:
        cp.save(sd, 1).durable.result(30)
        # The job's directory becomes a file: every later upload fails.
        job_dir = os.path.join(daemon.store, "broken")
        break_dir(job_dir)
        fut = cp.save(sd, 2)
        concurrent.futures.wait([fut.durable], 60)
        with pytest.raises(ckpt.CkptError, match="step 2 of job 'broken' was not saved"):
            cp.save(sd, 3)
        # Storage repaired: saving goes on.
        os.remove(job_dir)
        cp.save(sd, 3).durable.result(60)


def test_reused_job_name_fails_at_first_save(daemon):
    sd = state()
    with ckpt.torch.Checkpointer("reuse", socket=daemon.sock) as cp:
        for step in (1, 2, 3):
            cp.save(sd, step)
    # A new run, same job, no load: refused at once, saying what to do.
    ckpt.torch._resumed.clear()  # as a new process
    cp = ckpt.torch.Checkpointer("reuse", socket=daemon.sock)
    with pytest.raises(ckpt.CkptError) as e:
        cp.save(sd, 1)
    msg = str(e.value)
    assert e.value.errno == errno.EEXIST
    assert "job 'reuse' already has 3 complete steps (1 to 3)" in msg, msg
    assert "load()" in msg and "new job name" in msg and "ckptctl rm reuse" in msg and "exist_ok=True" in msg
    with pytest.raises(ckpt.CkptError, match="already has"):
        cp.save(sd, 1)  # asked again: a refusal is not forgotten
    cp.close()
    # Resuming (load first) continues the job.
    ckpt.torch._resumed.clear()
    with ckpt.torch.Checkpointer("reuse", socket=daemon.sock) as cp:
        got = state(1)
        assert cp.load(got)[0] == 3
        cp.save(got, 4)
    # exist_ok=True adds steps without loading.
    ckpt.torch._resumed.clear()
    with ckpt.torch.Checkpointer("reuse", socket=daemon.sock, exist_ok=True) as cp:
        cp.save(sd, 5)
    with ckpt.Client(daemon.sock) as c:
        assert sorted(s["step"] for s in c.list("reuse") if s["complete"]) == [1, 2, 3, 4, 5]


def test_load_into_another_shape_raises_naming_the_tensor(daemon):
    with ckpt.torch.Checkpointer("shape", socket=daemon.sock) as cp:
        cp.save({"model": torch.nn.Linear(4, 2).state_dict()}, 1)
        other = {"model": torch.nn.Linear(5, 2).state_dict()}
        before = other["model"]["weight"].clone()
        with pytest.raises(ValueError) as e:
            cp.load(other)
        assert "'model/weight'" in str(e.value) and "[2, 4]" in str(e.value) and "[2, 5]" in str(e.value)
        assert torch.equal(other["model"]["weight"], before)  # nothing replaced
        wrong_dtype = {"model": {k: v.double() for k, v in torch.nn.Linear(4, 2).state_dict().items()}}
        with pytest.raises(ValueError, match="torch.float64"):
            cp.load(wrong_dtype)


def test_job_name_errors_blame_the_name(daemon):
    for job in (".hidden", "a" * 300, "team/llama"):
        with pytest.raises(ckpt.CkptError) as e:
            ckpt.torch.Checkpointer(job, socket=daemon.sock)
        msg = str(e.value)
        assert e.value.errno == errno.EINVAL
        assert "refused by ckptd" in msg and "[A-Za-z0-9._-]" in msg, msg
        assert "connect" not in msg and msg.count("[Errno") == 1, msg


def test_stale_socket_says_nothing_listens(tmp_path, monkeypatch):
    import socket as socketlib
    path = str(tmp_path / "stale.sock")
    s = socketlib.socket(socketlib.AF_UNIX)
    s.bind(path)
    s.close()
    monkeypatch.setenv("CKPTD_SOCKET", path)
    with pytest.raises(ckpt.DaemonUnavailable) as e:
        ckpt.torch.Checkpointer("x")
    msg = str(e.value)
    assert e.value.errno == errno.ECONNREFUSED
    assert "nothing listens" in msg and "from $CKPTD_SOCKET" in msg, msg


def test_delete_leaves_a_save_in_flight_unless_forced(daemon):
    """Client.delete of a step whose only objects are a young attempt's
    refs (a save of it may be writing on another node; no manifest yet):
    CkptError EBUSY naming the attempt, the refs stay; force=True removes
    them (ckptctl rm --force)."""
    from ckpt.client import CkptError, Client
    refs = os.path.join(daemon.store, "fl", "refs", "step-000000000007", "step-000000000005")
    os.makedirs(refs)
    open(os.path.join(refs, "rank-00000-of-00001.new"), "w").close()
    with Client(daemon.sock) as c:
        with pytest.raises(CkptError) as e:
            c.delete(7, job="fl")
        assert e.value.errno == errno.EBUSY
        assert "attempt 'new' of step 7" in str(e.value)
        assert os.listdir(refs) == ["rank-00000-of-00001.new"]
        c.delete(7, job="fl", force=True)
    assert not os.path.exists(os.path.join(daemon.store, "fl", "refs", "step-000000000007"))


def test_slurm_launch_is_its_own_attempt(daemon, tmp_path):
    """Under Slurm (no torchelastic), libckpt's default attempt id is the
    job's and its requeue count; a Checkpointer's adds a nonce of its launch
    (ckpt/_attempt.py), since srun run twice in one allocation keeps both."""
    import subprocess
    import sys
    code = ("import torch, ckpt, ckpt.torch\n"
            f"with ckpt.torch.Checkpointer('slurmjob', socket={daemon.sock!r}) as cp:\n"
            "    cp.save({'w': torch.ones(4)}, 1).durable.result(60)\n"
            f"with ckpt.Client({daemon.sock!r}, job='slurmraw') as c:\n"
            "    b = c.alloc(64)\n"
            "    c.save(1, [ckpt.TensorSpec('w', 'u8', (64,), b, 0, 64)]).durable.result(60)\n"
            f"with ckpt.Client({daemon.sock!r}) as cl:\n"
            "    print(cl.list('slurmjob')[0]['attempt_id'], cl.list('slurmraw')[0]['attempt_id'])\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "SLURM_"))}
    env.update(SLURM_JOB_ID="4242", SLURM_RESTART_COUNT="3")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    checkpointer, raw = p.stdout.split()
    assert checkpointer.startswith("slurm-4242-3-") and len(checkpointer) > len("slurm-4242-3-"), checkpointer
    assert raw == "slurm-4242-3"
