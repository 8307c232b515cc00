"""The attempt id of a Checkpointer that was given none (ckpt/_attempt.py,
docs/format.md "Attempts"): one per launch, the same on every rank of it,
so that a relaunch that saves again a step its dead predecessor saved on
some ranks completes it from its own saves alone."""
import errno
import os
import socket as socketlib
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ckpt
import ckpt.torch
from ckpt import _attempt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _port():
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(rank, world, port, sock, phase, out):
    """One rank of a launch of two. first: steps 3 (both ranks) and 5
    (rank 0 only: rank 1 dies before it). second: resumes from step 3 and
    saves step 5 again, on both ranks."""
    sys.path.insert(0, os.path.join(ROOT, "client", "python"))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import ckpt.torch as ct
    said = {}
    try:
        with ct.Checkpointer("relaunch", socket=sock, exist_ok=phase == "first") as cp:
            said["attempt"] = cp.client.attempt_id
            w = torch.full((256,), 10.0 * (phase == "second") + rank)
            if phase == "first":
                cp.save({"w": w}, 3).durable.result(60)
                dist.barrier()
                if rank == 0:
                    cp.save({"w": w}, 5).durable.result(60)
            else:
                got = {"w": torch.zeros(256)}
                said["resumed"] = cp.load(got)[0]
                try:
                    cp.save({"w": w}, 5).durable.result(60)
                    said["saved"] = "durable"
                except ckpt.CkptError as e:
                    said["saved"] = str(e)
            dist.barrier()
    finally:
        torch.save(said, f"{out}.{phase}.{rank}")
        dist.destroy_process_group()


def test_a_relaunch_completes_a_step_from_its_own_ranks_alone(daemon, tmp_path, monkeypatch):
    """Launch 1 (torchrun's run id "none" for both: a launcher id that does
    not change) saves step 5 on rank 0 only and dies; launch 2 resumes from
    step 3 and saves step 5 on both ranks: both durable, and step 5 is
    launch 2's, every rank of it (with one attempt for both launches, rank
    0 would fail with EEXIST and step 5 hold launch 1's rank 0)."""
    out = str(tmp_path / "said")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    for phase in ("first", "second"):
        mp.spawn(_launch, args=(2, _port(), daemon.sock, phase, out), nprocs=2, join=True)
    said = {(p, r): torch.load(f"{out}.{p}.{r}") for p in ("first", "second") for r in (0, 1)}
    assert all(said["second", r]["resumed"] == 3 and said["second", r]["saved"] == "durable" for r in (0, 1)), said
    for r in (0, 1):  # every rank's part of step 5 is launch 2's
        with ckpt.torch.Checkpointer("relaunch", rank=r, world_size=2, socket=daemon.sock) as cp:
            got = {"w": torch.zeros(256)}
            assert cp.load(got, step=5)[0] == 5
            assert torch.equal(got["w"], torch.full((256,), 10.0 + r)), (r, got["w"][0])
    a1, a2 = said["first", 0]["attempt"], said["second", 0]["attempt"]
    assert a1 and a2 and a1 != a2 and a1.startswith("none-0-"), said
    assert said["first", 1]["attempt"] == a1 and said["second", 1]["attempt"] == a2, said
    c = ckpt.Client(daemon.sock)
    try:
        steps = {s["step"]: s for s in c.list("relaunch")}
    finally:
        c.close()
    assert steps[5]["complete"] and steps[5]["attempt_id"] == a2, steps


def test_one_process_one_attempt(daemon):
    """World size 1: the Checkpointers of a process share an attempt, each
    process (a forked one too) its own; one given is kept."""
    with ckpt.torch.Checkpointer("solo-a", socket=daemon.sock) as a, \
            ckpt.torch.Checkpointer("solo-b", socket=daemon.sock) as b:
        mine = a.client.attempt_id
        assert mine and mine == b.client.attempt_id and mine.startswith(_attempt._launcher_part() + "-"), mine
    with ckpt.torch.Checkpointer("solo-c", socket=daemon.sock, attempt_id="given") as c:
        assert c.client.attempt_id == "given"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "SLURM_"))}
    env.update(PYTHONPATH=os.path.join(ROOT, "client", "python"), SLURM_JOB_ID="77", SLURM_RESTART_COUNT="2")
    code = ("import os; from ckpt import _attempt; print(_attempt.default(1), flush=True)\n"
            "if os.fork() == 0:\n    print(_attempt.default(1), flush=True); os._exit(0)\nos.wait()\n")
    said = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        said += p.stdout.split()
    assert len(said) == 4 and all(a.startswith("slurm-77-2-") for a in said), said
    assert len(set(said)) == 4, said  # two processes and their forked children: four attempts
    # Several ranks with no store to agree through: libckpt's default.
    assert _attempt.default(4, None) is None
    assert _attempt.default(4, lambda proposal: None) is None


def _earlier_launch(daemon, code):
    """Run code (sys.argv[1]: ckptd's socket) in another process: an
    earlier launch, with an attempt of its own."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"))
    p = subprocess.run([sys.executable, "-c", code, daemon.sock], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr


def test_a_rollback_does_not_save_a_step_that_would_never_load(daemon):
    """Steps 1 to 4 saved by an earlier launch (another process: another
    attempt). A process that loaded step 2: a save of 3 raises EEXIST at
    once, saying what to do (under this launch's attempt it would be
    durable and never loaded: the attempt that completed first is the
    step); a new step saves; once 3 is removed, 3 saves and loads. Loading
    the latest step, or saving past it, raises nothing."""
    _earlier_launch(daemon, (
        "import sys, torch, ckpt.torch\n"
        "with ckpt.torch.Checkpointer('rollback', socket=sys.argv[1]) as cp:\n"
        "    for s in (1, 2, 3, 4):\n"
        "        cp.save({'w': torch.full((64,), float(s))}, s).durable.result(60)\n"))
    with ckpt.torch.Checkpointer("rollback", socket=daemon.sock) as cp:
        got = {"w": torch.zeros(64)}
        assert cp.load(got, step=4)[0] == 4  # the latest, by number: nothing after it
        cp.save({"w": torch.full((64,), 40.0)}, 6).durable.result(60)
    with ckpt.torch.Checkpointer("rollback", socket=daemon.sock) as cp:
        got = {"w": torch.zeros(64)}
        assert cp.load(got, step=2)[0] == 2
        try:
            cp.save({"w": torch.full((64,), 30.0)}, 3)
            raise AssertionError("a save of step 3 went ahead")
        except ckpt.CkptError as e:
            assert e.errno == errno.EEXIST, e
            assert "step 3 of job 'rollback' is complete already" in str(e) and "ckptctl rm rollback" in str(e), e
        cp.save({"w": torch.full((64,), 50.0)}, 5).durable.result(60)  # past the latest: goes
        cp.client.delete(3)
        cp.save({"w": torch.full((64,), 30.0)}, 3).durable.result(60)
        got = {"w": torch.zeros(64)}
        assert cp.load(got, step=3)[0] == 3 and got["w"][0].item() == 30.0



def test_exist_ok_adds_steps_and_raises_for_a_complete_one(daemon):
    """exist_ok=True adds steps to a job another launch saved: a save of a
    step it completed raises EEXIST at once (durable, it would never be
    loaded), saying what to do; a new step saves."""
    _earlier_launch(daemon, (
        "import sys, torch, ckpt.torch\n"
        "with ckpt.torch.Checkpointer('adding', socket=sys.argv[1]) as cp:\n"
        "    cp.save({'w': torch.ones(64)}, 1).durable.result(60)\n"))
    with ckpt.torch.Checkpointer("adding", socket=daemon.sock, exist_ok=True) as cp:
        try:
            cp.save({"w": torch.zeros(64)}, 1)
            raise AssertionError("a save of complete step 1 went ahead")
        except ckpt.CkptError as e:
            assert e.errno == errno.EEXIST, e
            assert "step 1 of job 'adding' is complete already, and this process adds steps" in str(e), e
        cp.save({"w": torch.full((64,), 2.0)}, 2).durable.result(60)
        got = {"w": torch.zeros(64)}
        assert cp.load(got, step=1)[0] == 1 and got["w"][0].item() == 1.0

def test_ranks_that_disagree_on_the_attempt_raise_at_load():
    """The ranks gather their attempt ids at a load (torch.py _resolve_step):
    different ones (torchelastic's restart count differs between nodes
    after a restart) raise, naming them, on every rank."""
    _attempt.check_agreed(["x-1-ab", "x-1-ab"], "j")
    try:
        _attempt.check_agreed(["x-1-ab", "x-2-cd", "x-1-ab"], "j")
        raise AssertionError("no error")
    except ckpt.CkptError as e:
        assert e.errno == errno.EINVAL and "x-1-ab, x-2-cd" in str(e) and "attempt_id=" in str(e), e


def test_a_step_that_cannot_be_removed_fails_the_replacing_save(daemon):
    """The replacement Lightning and HF make after a resume (the guard's
    _replace_newer): a later step that cannot be removed, as incremental
    step 2 refers to step 1, fails the save of 1, saying why; nothing is
    lost."""
    g = torch.Generator().manual_seed(5)
    frozen = torch.randn(512, 1024, generator=g)  # 2 MiB, referred to by later steps
    _earlier_launch(daemon, (
        "import sys, torch, ckpt.torch\n"
        "g = torch.Generator().manual_seed(5); frozen = torch.randn(512, 1024, generator=g)\n"
        "with ckpt.torch.Checkpointer('unremovable', socket=sys.argv[1], incremental=True) as cp:\n"
        "    cp.save({'f': torch.zeros(512, 1024)}, 0).durable.result(60)\n"
        "    for s in (1, 2):\n"
        "        cp.save({'f': frozen}, s).durable.result(60)\n"))
    with ckpt.torch.Checkpointer("unremovable", socket=daemon.sock, alone=True) as cp:
        cp._guard_rollback, cp._replace_newer = True, lambda step: None  # as ckpt.hf does
        got = {"f": torch.zeros(512, 1024)}
        assert cp.load(got, step=0)[0] == 0
        try:
            cp.save({"f": frozen}, 1)
            raise AssertionError("step 1 was replaced while step 2 refers to it")
        except ckpt.CkptError as e:
            assert "step 1 of job 'unremovable', complete from an earlier run after step 0" in str(e), e
            assert "could not be removed" in str(e), e
        with ckpt.Client(daemon.sock) as c:
            assert sorted(s["step"] for s in c.list("unremovable") if s["complete"]) == [0, 1, 2]
        cp.save({"f": frozen + 1}, 2).durable.result(60)  # nothing refers to 2: replaced
        got = {"f": torch.zeros(512, 1024)}
        assert cp.load(got, step=2)[0] == 2 and torch.equal(got["f"], frozen + 1)


def test_a_step_a_dead_launch_completes_after_the_load_of_latest_is_replaced(daemon):
    """A relaunch loads "latest" (2) while the dead launch's save of 3 is
    still in flight; ckptd finishes it. The relaunch's save of 3 replaces
    it, with a warning, instead of being durable and never loaded: step 3
    loads the relaunch's values."""
    _earlier_launch(daemon, (
        "import sys, torch, ckpt.torch\n"
        "with ckpt.torch.Checkpointer('in-flight', socket=sys.argv[1]) as cp:\n"
        "    for s in (1, 2):\n"
        "        cp.save({'w': torch.full((64,), float(s))}, s).durable.result(60)\n"))
    with ckpt.torch.Checkpointer("in-flight", socket=daemon.sock) as cp:
        got = {"w": torch.zeros(64)}
        assert cp.load(got)[0] == 2
        with ckpt.torch.Checkpointer("in-flight", socket=daemon.sock, attempt_id="dead-launch") as dead:
            dead.save({"w": torch.full((64,), -3.0)}, 3).durable.result(60)  # finished after the load
        with pytest.warns(UserWarning, match=r"step 3 of job 'in-flight', complete from an earlier run after "
                                             r"step 2 that this process loaded, is replaced"):
            cp.save({"w": torch.full((64,), 3.0)}, 3).durable.result(60)
        got = {"w": torch.zeros(64)}
        assert cp.load(got, step=3)[0] == 3 and got["w"][0].item() == 3.0


def test_with_several_ranks_a_step_completed_after_the_load_of_latest_is_named_not_replaced(daemon):
    """Two ranks: the same race as above. Removing the step while the
    other ranks save it would meet their saves, so rank 0 only warns that
    its save is durable but the earlier launch's step is the one that
    loads; nothing is removed."""
    def cps(attempt):
        return [ckpt.torch.Checkpointer("in-flight-2", rank=r, world_size=2, socket=daemon.sock,
                                        attempt_id=attempt, exist_ok=True) for r in (0, 1)]
    first = cps("launch-1")
    for s in (1, 2):
        for r, cp in enumerate(first):
            cp.save({"w": torch.full((64,), float(10 * s + r))}, s).durable.result(60)
    again = ckpt.torch.Checkpointer("in-flight-2", rank=0, world_size=2, socket=daemon.sock, attempt_id="launch-2")
    got = {"w": torch.zeros(64)}
    assert again.load(got)[0] == 2
    for r, cp in enumerate(first):  # launch 1's save of 3, finished after the load
        cp.save({"w": torch.full((64,), float(30 + r))}, 3).durable.result(60)
        cp.close()
    with pytest.warns(UserWarning, match=r"step 3 of job 'in-flight-2' is complete already, from an earlier launch "
                                         r".* after this launch loaded step 2: with several ranks it is not replaced"):
        again.save({"w": torch.full((64,), -1.0)}, 3).durable.result(60)
    again.close()
    with ckpt.torch.Checkpointer("in-flight-2", rank=0, world_size=2, socket=daemon.sock) as cp:
        got = {"w": torch.zeros(64)}
        assert cp.load(got, step=3)[0] == 3 and got["w"][0].item() == 30.0
