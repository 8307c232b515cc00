"""Issue "Python adoption": ckpt.hf with the real transformers Trainer on
CPU. One run trains 12 steps straight; another is killed (SIGKILL) at step
9, after ckptd staged its step 8; a third process resumes from ckptd's
latest step (written back as a checkpoint-8 directory for
resume_from_checkpoint) and trains to 12. Both end with the same weights
and optimizer state; no run wrote a checkpoint directory of its own."""
import os
import re
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
import ckpt  # noqa: E402
import ckpt.torch  # noqa: E402
from conftest import same  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def run(daemon, job, outdir, out, *extra, env=None):
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "..", "client", "python"), **(env or {}))
    r = subprocess.run([sys.executable, os.path.join(HERE, "hf_train.py"), daemon.sock, job, str(outdir), "12",
                        str(out), *extra], env=env, capture_output=True, text=True, timeout=300)
    return r


def test_hf_trainer_resumes_from_ckptd_after_kill(daemon, tmp_path):
    r = run(daemon, "hf-straight", tmp_path / "a", tmp_path / "a.pt")
    assert r.returncode == 0, r.stderr[-4000:]
    straight = torch.load(tmp_path / "a.pt", weights_only=False)
    assert straight["dirs"] == [], straight["dirs"]  # ckptd took every save over
    r = run(daemon, "hf-killed", tmp_path / "b", tmp_path / "b.pt", "-", "9")
    assert r.returncode == -9, r.stderr[-4000:]
    with ckpt.Client(daemon.sock) as c:  # staged before the kill: ckptd makes it durable
        assert c.wait_complete(8, job="hf-killed", timeout=10)["world_size"] == 1
        assert [s["step"] for s in c.list("hf-killed") if s["complete"]] == [4, 8]
    r = run(daemon, "hf-killed", tmp_path / "b", tmp_path / "c.pt", "resume")
    assert r.returncode == 0, r.stderr[-4000:]
    resumed = torch.load(tmp_path / "c.pt", weights_only=False)
    assert resumed["resumed_from"].endswith("checkpoint-8")
    assert resumed["global_step"] == straight["global_step"] == 12
    assert same(resumed["weights"], straight["weights"]), "weights differ after resuming"
    assert same(resumed["optim"], straight["optim"]), "optimizer state differs after resuming"


def test_hf_second_run_of_the_same_job_fails_at_its_first_save(daemon, tmp_path):
    """Issue 32: reusing a job name without resuming fails at once, saying
    how to resume."""
    assert run(daemon, "hf-again", tmp_path / "a", tmp_path / "a.pt").returncode == 0
    r = run(daemon, "hf-again", tmp_path / "b", tmp_path / "b.pt")
    assert r.returncode == 1, r.stderr[-4000:]
    assert "job 'hf-again' already has 3 complete steps (4 to 12)" in r.stderr, r.stderr[-4000:]
    assert "ckpt.hf.checkpoint_dir" in r.stderr and "exist_ok=True" in r.stderr
    assert not os.path.exists(tmp_path / "b.pt")


def test_hf_failed_save_raises_in_the_trainer(daemon, tmp_path):
    """Issue 32: a save whose upload fails raises from trainer.train()."""
    r = run(daemon, "hf-fail", tmp_path / "a", tmp_path / "a.pt",
            env={"HF_BREAK_DIR": os.path.join(daemon.store, "hf-fail")})
    assert r.returncode == 1, r.stderr[-4000:]
    assert re.search(r"Trainer checkpoint step (4|8|12) of job 'hf-fail' was not saved", r.stderr), r.stderr[-4000:]
    os.remove(os.path.join(daemon.store, "hf-fail"))


def test_hf_resume_from_an_older_step_replaces_the_later_ones(daemon, tmp_path):
    """A run resumed from step 4 of a job that has 8 and 12 saves them
    again, as the Trainer writes checkpoint-N over an old one: loading 12
    gives this run's weights, not the first run's (the later steps are
    replaced, not saved beside them under a new attempt, never loaded)."""
    assert run(daemon, "hf-back", tmp_path / "a", tmp_path / "a.pt").returncode == 0
    r = run(daemon, "hf-back", tmp_path / "a", tmp_path / "b.pt", "resume=4", env={"HF_DATA_SEED": "2"})
    assert r.returncode == 0, r.stderr[-4000:]
    first, second = (torch.load(tmp_path / n, weights_only=False) for n in ("a.pt", "b.pt"))
    assert second["resumed_from"].endswith("checkpoint-4") and second["global_step"] == 12
    assert not same(first["weights"], second["weights"]), "other data made no difference"
    with ckpt.Client(daemon.sock) as c:
        assert sorted(s["step"] for s in c.list("hf-back") if s["complete"]) == [4, 8, 12]
    with ckpt.torch.Checkpointer("hf-back", socket=daemon.sock, alone=True) as cp:
        state: dict = {}
        cp.load(state, step=12)
    assert same(state["model"], second["weights"]), "step 12 is not the resumed run's"


def test_hf_exist_ok_adds_steps_and_refuses_a_complete_one(daemon):
    """CkptdCallback(exist_ok=True) without a resume adds steps to the job:
    a save of a step another run completed raises EEXIST (it would never
    be loaded); a new one saves."""
    import ckpt.hf
    with ckpt.torch.Checkpointer("hf-add", socket=daemon.sock, alone=True, attempt_id="earlier-run") as cp:
        cp.save({"w": torch.ones(4)}, 4).durable.result(60)
    cp = ckpt.hf.CkptdCallback("hf-add", socket=daemon.sock, exist_ok=True)._checkpointer()
    try:
        with pytest.raises(ckpt.CkptError, match=r"step 4 of job 'hf-add' is complete already, and this process adds"):
            cp.save({"w": torch.zeros(4)}, 4)
        cp.save({"w": torch.zeros(4)}, 8).durable.result(60)
    finally:
        cp.close()
