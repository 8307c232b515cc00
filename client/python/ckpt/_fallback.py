"""ckpt.torch's fallback when no daemon runs: torch.save / torch.load of
one file per step and rank in a directory (Checkpointer(...,
fallback_dir=)), synchronous: staged and durable complete together."""
from __future__ import annotations

import concurrent.futures
import os
from typing import Any, MutableMapping, Tuple, Union

import torch

from .client import LATEST


def fsync_dir(path: str) -> None:
    """Make the names in directory path durable (its fsync)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Done:
    """A fallback save, done when made: what ckpt.torch.SaveFuture wraps
    (staged and durable: one completed future of the file's size)."""

    def __init__(self, size: int) -> None:
        f: concurrent.futures.Future[int] = concurrent.futures.Future()
        f.set_result(size)
        self.staged = self.durable = f
        self.result = f.result


class Fallback:
    """The steps of one rank of job as torch.save files in directory."""

    def __init__(self, directory: str, job: str, rank: int) -> None:
        self.directory, self.job, self.rank = directory, job, rank
        os.makedirs(directory, exist_ok=True)
        fsync_dir(os.path.dirname(os.path.abspath(directory)))  # its name durable

    def path(self, step: int) -> str:
        """The file of step (of this rank)."""
        return os.path.join(self.directory, f"{self.job}-step-{int(step):012d}-rank-{self.rank:05d}.pt")

    def save(self, state_dict: Any, step: int, extra: Any) -> Done:
        """Write step's file, durable when it returns."""
        path = self.path(step)
        tmp = path + ".tmp"
        # Durable as ckptd's own file:// writes are: the bytes fsync'd
        # before the rename, and the directory after it, so that a power
        # cut leaves the old step or the new one, never a torn or empty
        # file under the step's name (docs/architecture.md "What is on disk").
        with open(tmp, "wb") as f:
            torch.save({"state": state_dict, "extra": extra}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(self.directory)
        return Done(os.path.getsize(path))

    def load(self, state_dict: MutableMapping[str, Any], step: Union[int, str]) -> Tuple[int, Any]:
        """Load step (or the latest this rank has) into state_dict, in
        place; (step, extra). FileNotFoundError without one."""
        if step in ("latest", LATEST):
            pre = f"{self.job}-step-"
            steps = sorted(int(n[len(pre):len(pre) + 12]) for n in os.listdir(self.directory)
                           if n.startswith(pre) and n.endswith(f"-rank-{self.rank:05d}.pt"))
            if not steps:
                raise FileNotFoundError(f"no fallback checkpoint of '{self.job}' in {self.directory}")
            step = steps[-1]
        obj = torch.load(self.path(int(step)), weights_only=False)
        _copy_into(state_dict, obj["state"])
        return int(step), obj["extra"]


def _copy_into(dst: Any, src: Any) -> None:
    """Put a loaded tree into dst: tensors copied into dst's own where they
    match, other values as loaded."""
    if isinstance(src, dict):
        for k, v in src.items():
            if isinstance(v, torch.Tensor) and isinstance(dst.get(k), torch.Tensor) and \
                    dst[k].shape == v.shape:
                with torch.no_grad():
                    dst[k].copy_(v)
            elif isinstance(v, (dict, list)) and isinstance(dst.get(k), type(v)):
                _copy_into(dst[k], v)
            else:
                dst[k] = v
    elif isinstance(src, list):
        for i, v in enumerate(src):
            if i < len(dst) and isinstance(v, torch.Tensor) and isinstance(dst[i], torch.Tensor):
                with torch.no_grad():
                    dst[i].copy_(v)
            elif i < len(dst) and isinstance(v, (dict, list)) and isinstance(dst[i], type(v)):
                _copy_into(dst[i], v)
            elif i < len(dst):
                dst[i] = v
            else:
                dst.append(v)
