"""Issue 32, Lightning: with ckpt.lightning's example ModelCheckpoint(save_last=True),
top-k removals and last.ckpt moving on leave no unreferenced step in
ckptd; save_checkpoint to a path after fit writes its pointer; a second
run of the same script fails at its first save, not at teardown; a save
that fails raises in the trainer. In-process fits on CPU."""
import concurrent.futures
import os

import pytest
import torch

L = pytest.importorskip("lightning")
from lightning.pytorch.callbacks import Callback, ModelCheckpoint  # noqa: E402

import ckpt.lightning  # noqa: E402
import ckpt.torch  # noqa: E402
from faults import break_dir  # noqa: E402


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(daemon, job, ckdir, epochs=4, callbacks=(), ckpt_path=None, io_kw=None, **mc):
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)  # 8 steps per epoch
    io = ckpt.lightning.CkptdCheckpointIO(job, socket=daemon.sock, **(io_kw or {}))
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, plugins=[io],
                        callbacks=[ModelCheckpoint(dirpath=str(ckdir), save_last=True, **mc), *callbacks])
    trainer.fit(Model(), loader, ckpt_path=ckpt_path)
    return trainer


def steps_in_ckptd(daemon, job):
    with ckpt.Client(daemon.sock) as c:
        return sorted(s["step"] for s in c.list(job))


def pointed(ckdir):
    return {n: ckpt.lightning.read_pointer(os.path.join(ckdir, n)) for n in sorted(os.listdir(ckdir))}


def test_save_last_leaves_no_unreferenced_step(daemon, tmp_path):
    ckdir = tmp_path / "ck"
    trainer = fit(daemon, "lit-last", ckdir)
    ptrs = pointed(ckdir)
    assert ptrs["last.ckpt"] == ("lit-last", 32), ptrs
    assert all(p is not None for p in ptrs.values()), ptrs
    # Only what a pointer names is kept: 8, 16 and 24 were superseded.
    assert steps_in_ckptd(daemon, "lit-last") == sorted({p[1] for p in ptrs.values()}) == [32]

    # After fit, save_checkpoint to a path writes its pointer (the same step).
    trainer.save_checkpoint(str(tmp_path / "manual.ckpt"))
    assert ckpt.lightning.read_pointer(tmp_path / "manual.ckpt") == ("lit-last", 32)
    assert steps_in_ckptd(daemon, "lit-last") == [32]


def test_top_k_with_save_last_keeps_exactly_the_pointed_steps(daemon, tmp_path):
    ckdir = tmp_path / "ck"
    fit(daemon, "lit-topk", ckdir, epochs=5, save_top_k=2, monitor="step", mode="max")
    ptrs = pointed(ckdir)
    assert steps_in_ckptd(daemon, "lit-topk") == sorted({p[1] for p in ptrs.values()}) == [32, 40], ptrs


def test_second_run_of_the_same_job_fails_at_its_first_save(daemon, tmp_path):
    fit(daemon, "lit-again", tmp_path / "a", epochs=2)
    ckpt.torch._resumed.clear()  # as a new process
    seen = []

    class Steps(Callback):
        def on_train_batch_end(self, trainer, *a):
            seen.append(trainer.global_step)
    with pytest.raises(ckpt.CkptError) as e:
        fit(daemon, "lit-again", tmp_path / "b", epochs=4, callbacks=[Steps()])
    assert "already has" in str(e.value) and "ckpt_path" in str(e.value), str(e.value)
    assert max(seen) == 8, "raised at the first save (step 8), not at the end"
    # Resuming from last.ckpt continues the job.
    ckpt.torch._resumed.clear()
    fit(daemon, "lit-again", tmp_path / "a", epochs=3, ckpt_path=str(tmp_path / "a" / "last.ckpt"))
    assert ckpt.lightning.read_pointer(tmp_path / "a" / "last.ckpt") == ("lit-again", 24)


def test_a_failed_save_raises_in_the_trainer(daemon, tmp_path):
    job_dir = os.path.join(daemon.store, "lit-fail")

    class Break(Callback):
        def on_train_epoch_start(self, trainer, module):
            if trainer.current_epoch == 1:  # uploads from now on fail
                break_dir(job_dir)
            if trainer.current_epoch == 3:  # the failures are in (not looked at): step 32's save raises
                io = trainer.strategy.checkpoint_io
                concurrent.futures.wait([f.durable for f in io._saves.values()], 60)
    with pytest.raises(ckpt.CkptError, match=r"step (8|16|24|32) of job 'lit-fail' was not saved") as e:
        fit(daemon, "lit-fail", tmp_path / "ck", epochs=4, callbacks=[Break()])
    # Raised in the loop (at a later save, or at the removal of an older
    # checkpoint, whichever comes first once the failure is known), not
    # only at the end of fit; and the end of fit does not hide it.
    assert any(f.name in ("save_checkpoint", "remove_checkpoint") for f in e.traceback), e.traceback
    os.remove(job_dir)


def test_resume_replaces_a_step_the_dead_run_finished_without_its_pointer(daemon, tmp_path):
    """A run dies after ckptd staged its step 24 and before the pointer was
    written (one half-written, PATH.tmp.PID, is left); ckptd finishes the
    step. The run resumed from last.ckpt (16) saves 24 again: with
    remove_steps=False that raises (such steps are kept); else the step is
    replaced, so last.ckpt's 24 loads the resumed run's state, not the
    dead run's."""
    ckdir = tmp_path / "ck"
    fit(daemon, "lit-orphan", ckdir, epochs=2)
    assert ckpt.lightning.read_pointer(ckdir / "last.ckpt") == ("lit-orphan", 16)
    with ckpt.torch.Checkpointer("lit-orphan", socket=daemon.sock, alone=True, exist_ok=True,
                                 attempt_id="dead-run") as cp:
        cp.save({"dead": torch.zeros(3)}, 24).result()  # the dead run's, with no pointer
    with open(ckdir / "last.ckpt.tmp.999999", "w") as f:
        f.write('{"format": "ckptd-step", "job": "lit-orphan", "step": 24}')
    ckpt.torch._resumed.clear()  # as a new process
    with pytest.raises(ckpt.CkptError, match=r"step 24 .*no pointer names it .*remove_steps=False"):
        fit(daemon, "lit-orphan", ckdir, epochs=3, ckpt_path=str(ckdir / "last.ckpt"),
            io_kw={"remove_steps": False})
    assert steps_in_ckptd(daemon, "lit-orphan") == [16, 24]
    ckpt.torch._resumed.clear()
    fit(daemon, "lit-orphan", ckdir, epochs=3, ckpt_path=str(ckdir / "last.ckpt"))
    assert ckpt.lightning.read_pointer(ckdir / "last.ckpt") == ("lit-orphan", 24)
    state = ckpt.lightning.CkptdCheckpointIO("lit-orphan", socket=daemon.sock).load_checkpoint(ckdir / "last.ckpt")
    assert "dead" not in state and state["global_step"] == 24, sorted(state)
    assert steps_in_ckptd(daemon, "lit-orphan") == [24]


def test_resume_from_an_older_checkpoint_raises_at_a_later_named_step(daemon, tmp_path):
    """Resumed from step 8 while epoch=1-step=16.ckpt names 16: ckptd keeps
    one state per step (Lightning would version the new file's name), so
    the save of 16 raises, naming that file, and every step stays."""
    ckdir = tmp_path / "ck"
    fit(daemon, "lit-older", ckdir, epochs=3, save_top_k=-1)
    assert steps_in_ckptd(daemon, "lit-older") == [8, 16, 24]
    ckpt.torch._resumed.clear()
    with pytest.raises(ckpt.CkptError, match=r"step 16 of job 'lit-older' .*/epoch=1-step=16\.ckpt names it, after step 8") as e:
        fit(daemon, "lit-older", ckdir, epochs=3, ckpt_path=str(ckdir / "epoch=0-step=8.ckpt"))
    assert "ckptctl rm lit-older" in str(e.value)
    assert steps_in_ckptd(daemon, "lit-older") == [8, 16, 24]
    assert ckpt.lightning.read_pointer(ckdir / "epoch=1-step=16.ckpt") == ("lit-older", 16)
