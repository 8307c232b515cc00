"""ckpt.lightning: Lightning's CheckpointIO through ckptd.

    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint
    import ckpt.lightning
    trainer = Trainer(plugins=[ckpt.lightning.CkptdCheckpointIO("my-job")],
                      callbacks=[ModelCheckpoint(dirpath="ckpts", save_last=True)])
    trainer.fit(model, ckpt_path="ckpts/last.ckpt")     # resume, when it exists

Every checkpoint Lightning writes at a PATH goes to ckptd as step
global_step of the job (one save per step: Lightning's "last" checkpoint of
a step it saved already is the same step). save_checkpoint returns once
the step is staged, as Lightning's AsyncCheckpointIO returns once it
handed the write to a thread; teardown waits until every step is durable.
Once a step is durable, PATH gets a small pointer file (JSON: job and step)
so that Lightning's own bookkeeping works on paths as ever: ModelCheckpoint's
last.ckpt links and top-k removal, and resuming by path. remove_checkpoint
removes the pointer and, when no other pointer in its directory names the
same step, the step. A path that holds a regular checkpoint (torch.save's)
loads as one.

Lightning saves on global rank 0 only (the state is the same on every rank),
so the plugin saves as rank 0 of 1 whatever the launcher says.
"""
import json
import os
import threading

try:
    from lightning.pytorch.plugins.io import CheckpointIO
except ImportError:  # the older package name
    from pytorch_lightning.plugins.io import CheckpointIO

from .torch import Checkpointer

POINTER = "ckptd-step"

__all__ = ["CkptdCheckpointIO", "read_pointer"]


def read_pointer(path):
    """(job, step) of a pointer file, or None if path is not one."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
        p = json.loads(head)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if isinstance(p, dict) and p.get("format") == POINTER:
        return p["job"], int(p["step"])
    return None


class CkptdCheckpointIO(CheckpointIO):
    def __init__(self, job, socket=None, attempt_id=None, remove_steps=True):
        """job: the ckptd job (its steps are the trainer's global steps);
        remove_steps: remove_checkpoint also removes the step from ckptd
        (ModelCheckpoint's save_top_k) when no other pointer names it."""
        super().__init__()
        self.job, self.socket, self.attempt_id, self.remove_steps = job, socket, attempt_id, remove_steps
        self._cp = None
        self._saves = {}  # step -> SaveFuture
        self._lock = threading.Lock()

    def _checkpointer(self):
        if self._cp is None:
            self._cp = Checkpointer(self.job, socket=self.socket, attempt_id=self.attempt_id, alone=True)
        return self._cp

    def _write_pointer(self, path, step):
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump({"format": POINTER, "job": self.job, "step": step}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        step = int(checkpoint.get("global_step", 0))
        path = os.fspath(path)
        d = os.path.dirname(path)
        if d:
            os.makedirs(d, exist_ok=True)
        with self._lock:
            fut = self._saves.get(step)
            if fut is None:
                fut = self._checkpointer().save(checkpoint, step)
                self._saves[step] = fut
        fut.staged.result()  # the tensors may change again

        def durable(f):
            if f.exception() is None:
                self._write_pointer(path, step)

        fut.durable.add_done_callback(durable)

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        path = os.fspath(path)
        p = read_pointer(path)
        if p is None:  # a checkpoint written without ckptd
            import torch
            return torch.load(path, map_location=map_location, weights_only=bool(weights_only))
        job, step = p
        if job != self.job:
            raise ValueError(f"{path} is step {step} of job '{job}', not of '{self.job}'")
        state = {}
        self._checkpointer().load(state, step=step)
        return state

    def remove_checkpoint(self, path):
        path = os.fspath(path)
        p = read_pointer(path)
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        if p is None or not self.remove_steps or p[0] != self.job:
            return
        d = os.path.dirname(path) or "."
        for n in os.listdir(d):
            if read_pointer(os.path.join(d, n)) == p:
                return  # last.ckpt, or another name of the same step
        with self._lock:
            fut = self._saves.pop(p[1], None)
        if fut is not None and fut.durable.exception() is not None:
            return  # it never became durable: nothing in ckptd to remove
        try:
            self._checkpointer().client.delete(p[1])
        except OSError:
            pass  # gone already (retention)

    def teardown(self):
        with self._lock:
            futs = list(self._saves.values())
            self._saves = {}
        try:
            for f in futs:
                f.durable.result()
        finally:
            if self._cp is not None:
                self._cp.close()
                self._cp = None
