"""ckpt.hf: Hugging Face Trainer checkpoints through ckptd.

    import ckpt.hf
    args = TrainingArguments(output_dir="out", save_strategy="steps", save_steps=500, ...)
    trainer = Trainer(model=model, args=args, ..., callbacks=[ckpt.hf.CkptdCallback("my-job")])
    trainer.train(resume_from_checkpoint=ckpt.hf.checkpoint_dir("my-job", "out"))  # None: from scratch

CkptdCallback takes the Trainer's saves over: when the Trainer decides to
save (save_strategy "steps" or "epoch"), the callback saves the model,
optimizer and scheduler state, the RNG states and the trainer state to
ckptd as step global_step and tells the Trainer not to write its own
checkpoint-N directory. The save returns once staged; training goes on
while ckptd makes it durable (train's end waits for that).

To resume, checkpoint_dir() writes the latest complete step (or a named
one) back as a Trainer checkpoint directory, output_dir/checkpoint-N with
the files Trainer reads (pytorch_model.bin, optimizer.pt, scheduler.pt,
rng_state.pth, trainer_state.json), and returns its path for
resume_from_checkpoint; None when the job has no complete step. The Trainer
then resumes with its own code: weights, optimizer, scheduler, RNG, and the
data it skips. Saves on the main process only (the state is the same on
every rank), as rank 0 of 1.
"""
from __future__ import annotations

import concurrent.futures
import errno
import json
import os
import random
import tempfile
from typing import Any, Dict, List, Optional, Union

import numpy as np
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from .client import CkptError
from .torch import Checkpointer, SaveFuture, _resumed

__all__ = ["CkptdCallback", "checkpoint_dir"]


def _rng() -> Dict[str, Any]:
    r: Dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                         "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        r["cuda"] = torch.cuda.random.get_rng_state_all()
    return r


def _state_json(state: TrainerState) -> str:
    """trainer_state.json's text, as TrainerState.save_to_json writes it."""
    with tempfile.TemporaryDirectory() as d:
        state.save_to_json(os.path.join(d, "s.json"))
        with open(os.path.join(d, "s.json")) as f:
            return f.read()


class CkptdCallback(TrainerCallback):
    """A Trainer callback that saves the Trainer's checkpoints to ckptd as
    step global_step of job, instead of checkpoint-N directories (module
    docstring)."""

    def __init__(self, job: str, socket: Optional[str] = None, attempt_id: Optional[str] = None,
                 exist_ok: bool = False, storage: Optional[str] = None) -> None:
        """job: the ckptd job; socket: ckptd's socket (default
        $CKPTD_SOCKET, else /run/ckptd/ckptd.sock); exist_ok: save into a
        job that has steps without resuming from it (by default the first
        save then raises, unless the training resumed: from
        checkpoint_dir(), or from any checkpoint with a global step); storage:
        where steps go when no ckptd runs on the node (this user's daemon is
        then started, as ckpt.torch.Checkpointer's storage=)."""
        self.job, self.socket, self.attempt_id, self.exist_ok = job, socket, attempt_id, exist_ok
        self.storage = storage
        self._cp: Optional[Checkpointer] = None
        self._futs: List[SaveFuture] = []
        self._resumed: Optional[int] = None  # the global step train() resumed from

    def _checkpointer(self) -> Checkpointer:
        if self._cp is None:
            cp = Checkpointer(self.job, socket=self.socket, attempt_id=self.attempt_id, alone=True,
                              exist_ok=self.exist_ok or self._resumed is not None, storage=self.storage)
            cp._guard_rollback = True  # exist_ok without a resume: a complete step raises
            if self._resumed is not None:
                # A step after the resumed one that ckptd holds complete
                # is replaced when saved again (removed, then saved), as
                # the Trainer writes a checkpoint-N directory over an old
                # one; kept, the save would be durable but never loaded.
                cp._replace_newer = lambda step: None
                cp._note_load(self._resumed)
            self._cp = cp
        return self._cp

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        """A Trainer resumed from a checkpoint starts past step 0: its saves
        continue the job."""
        self._resumed = state.global_step if state.global_step > 0 else None

    def _save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
              model: Optional[torch.nn.Module] = None, optimizer: Optional[torch.optim.Optimizer] = None,
              lr_scheduler: Any = None, **kwargs: Any) -> TrainerControl:
        if not control.should_save:
            return control
        control.should_save = False  # ckptd has it: no checkpoint-N directory
        if not state.is_world_process_zero:
            return control
        self._raise_failed()
        if model is None:
            raise ValueError("CkptdCallback: the Trainer gave no model to save")
        sd = {"model": model.state_dict()}
        if optimizer is not None:
            sd["optimizer"] = optimizer.state_dict()
        if lr_scheduler is not None:
            sd["scheduler"] = lr_scheduler.state_dict()
        extra = {"trainer_state": _state_json(state), "rng": _rng()}
        try:
            fut = self._checkpointer().save(sd, state.global_step, extra=extra)  # returns once staged
        except CkptError as e:
            if e.errno == errno.EEXIST and (self.exist_ok or self._resumed is not None):
                raise  # the rollback guard's, saying what to do
            if e.errno == errno.EEXIST:
                raise CkptError(e.errno, f"{e.strerror}. With the Trainer: train(resume_from_checkpoint="
                                "ckpt.hf.checkpoint_dir(job, output_dir)) resumes, or CkptdCallback(job, "
                                "exist_ok=True)") from None
            raise CkptError(e.errno, f"Trainer checkpoint step {state.global_step} of job '{self.job}' was not "
                            f"saved: {e.strerror}") from e
        self._futs.append(fut)
        return control

    def _raise_failed(self) -> None:
        """Raise the first failed save (one that did not become durable),
        in the Trainer, naming its step."""
        done = [f for f in self._futs if f.durable.done()]
        self._futs = [f for f in self._futs if not f.durable.done()]
        for f in done:
            e = f.durable.exception()
            if e is not None:
                raise CkptError(e.errno or errno.EIO, f"Trainer checkpoint step {f.step} of job '{self.job}' "
                                f"was not saved: {e.strerror or e}") from e

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> TrainerControl:
        """Save when the Trainer would (save_strategy "steps")."""
        return self._save(args, state, control, **kwargs)

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> TrainerControl:
        """Save when the Trainer would (save_strategy "epoch")."""
        return self._save(args, state, control, **kwargs)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        """Wait until every save is durable; raise the first failure."""
        try:
            concurrent.futures.wait([f.durable for f in self._futs])
            self._raise_failed()
        finally:
            self._futs = []
            if self._cp is not None:
                self._cp.close(wait=False)
                self._cp = None


def checkpoint_dir(job: str, output_dir: Union[str, "os.PathLike[str]"], step: Union[int, str] = "latest",
                   socket: Optional[str] = None, storage: Optional[str] = None) -> Optional[str]:
    """Write step (default: the latest complete one) of job as a Trainer
    checkpoint directory under output_dir; its path, or None when the job
    has no complete step (storage: as CkptdCallback's). A CkptdCallback of the same job in this process
    then continues the job (its first save does not raise EEXIST)."""
    with Checkpointer(job, socket=socket, alone=True, storage=storage) as cp:
        if step == "latest":
            client = cp._live()[0]
            done = [s["step"] for s in client.list(job) if s["complete"]]
            if not done:
                _resumed.add((client.socket, job))  # asked to resume: continue the job
                return None
        sd: Dict[str, Any] = {}
        got, extra = cp.load(sd, step=step)
    d = os.path.join(output_dir, f"checkpoint-{got}")
    os.makedirs(d, exist_ok=True)
    torch.save(sd["model"], os.path.join(d, "pytorch_model.bin"))
    if "optimizer" in sd:
        torch.save(sd["optimizer"], os.path.join(d, "optimizer.pt"))
    if "scheduler" in sd:
        torch.save(sd["scheduler"], os.path.join(d, "scheduler.pt"))
    torch.save(extra["rng"], os.path.join(d, "rng_state.pth"))
    with open(os.path.join(d, "trainer_state.json"), "w") as f:
        f.write(extra["trainer_state"])
    with open(os.path.join(d, "ckptd.json"), "w") as f:
        json.dump({"job": job, "step": got}, f)
    return d
