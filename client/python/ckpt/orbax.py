"""ckpt.orbax: an Orbax CheckpointHandler that saves and restores pytrees
of jax.Arrays through ckptd (ckpt.jax), for an Orbax CheckpointManager.

    handler = ckpt.orbax.Handler("mlp")
    mngr = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(max_to_keep=3),
                                 handler_registry=ckpt.orbax.handler_registry(handler, "state"))
    mngr.save(step, args=ocp.args.Composite(state=ckpt.orbax.Save(state)))
    restored = mngr.restore(mngr.latest_step(), args=ocp.args.Composite(state=ckpt.orbax.Restore(abstract)))

Why a handler: Orbax's CheckpointManager keeps its own directory of steps
(the step numbers, the atomic rename of a finished step, max_to_keep,
latest_step, other items such as JSON metadata next to it), and calls an
item's handler to write and read the item's bytes inside a step's
directory. Handler keeps that: the arrays go to ckptd as the same step
number (ckptctl ls shows the steps Orbax does), and the item's directory
holds only ckptd.json, which names the job and step. The handler is an
AsyncCheckpointHandler: async_save returns once ckptd has staged the
arrays (the trainer goes on), and its commit future completes once the
step is durable in ckptd's storage, so Orbax finalizes the step's
directory only then: a step directory Orbax lists is a step ckptd holds.

A run that died leaves ckptd steps Orbax never finalized (ckptd finishes
a staged save without its trainer); the resumed run's first save removes
those from its step on (ckptd never overwrites a step), and only those.

Not done: Orbax's removal of old steps (max_to_keep) removes their
directories only, not the ckptd steps: ckptd's own retention ([job.NAME]
keep) does that. The step a Save names defaults to the Orbax step, read
from the step directory's name (Orbax's default "<step>" or
"<prefix>_<step>"); give Save(step=...) otherwise.
"""
from __future__ import annotations

import dataclasses
import errno
import json
import re
from typing import Any, List, Optional, Set

import jax
import orbax.checkpoint as ocp
from etils import epath

from ._saving import _resumed
from .client import CkptError
from .jax import Checkpointer, SaveFuture

__all__ = ["Handler", "Save", "Restore", "handler_registry"]

METADATA = "ckptd.json"
# An Orbax step directory: "<step>" or "<prefix>_<step>", with Orbax's
# temporary suffix while it is written.
_STEP_DIR = re.compile(r"^(?:.*_)?(\d+)(?:\.orbax-checkpoint-tmp.*)?$")


def _finished_steps(root: epath.Path) -> Set[int]:
    """The steps of an Orbax root directory's finished step directories
    (without Orbax's temporary suffix)."""
    out = set()
    if root.exists():
        for child in root.iterdir():
            m = _STEP_DIR.match(child.name)
            if m and ".orbax-checkpoint-tmp" not in child.name:
                out.add(int(m.group(1)))
    return out


def _step_of(directory: epath.Path) -> int:
    """The Orbax step of an item's directory (its step directory's name,
    or its own). ValueError when no name says."""
    for part in (directory.parent.name, directory.name):
        m = _STEP_DIR.match(part)
        if m:
            return int(m.group(1))
    raise ValueError(f"no step number in '{directory}': give ckpt.orbax.Save(item, step=N)")


async def _nothing() -> None:
    """A commit with nothing to do."""


class Handler(ocp.handlers.AsyncCheckpointHandler):
    """Saves an item (a pytree) to ckptd as the Orbax step, and writes the
    job and step to ckptd.json in the item's directory (primary process
    only); restores from the step ckptd.json names."""

    def __init__(self, job: str, socket: Optional[str] = None, *, exist_ok: bool = False,
                 compress: Optional[bool] = None, incremental: Optional[bool] = None,
                 storage: Optional[str] = None) -> None:
        """Connect to ckptd as this process's rank of job (ckpt.jax.Checkpointer,
        with its exist_ok, compress, incremental and storage):
        ckpt.DaemonUnavailable when no ckptd answers."""
        self.job = job
        self._orphans_cleared = False
        self.checkpointer = Checkpointer(job, socket=socket, exist_ok=exist_ok, compress=compress,
                                         incremental=incremental, storage=storage)

    async def async_save(self, directory: epath.Path, args: Save) -> Optional[List[Any]]:
        """Save args.item as args.step (default: the Orbax step); returns
        once staged, with a commit future that completes once the step is
        durable and ckptd.json written."""
        step = args.step if args.step is not None else _step_of(directory)
        try:
            self._clear_orphans(directory, step)
            fut = self.checkpointer.save(args.item, step)
        except BaseException:
            # Orbax creates the step's directory on a thread of its own,
            # and waiters for it block the interpreter's exit if that
            # thread dies at shutdown: let it finish before raising (the
            # save's own error, whatever that wait says).
            try:
                ocp.future.CommitFutureAwaitingContractedSignals(_nothing(), name="ckptd_failed").result(timeout=60)
            except Exception:
                pass
            raise
        # Orbax may create the item's directory in the background: the
        # commit writes into it once the directory is there (its signal).
        return [ocp.future.CommitFutureAwaitingContractedSignals(self._commit(directory, fut), name="ckptd_commit")]

    async def _commit(self, directory: epath.Path, fut: SaveFuture) -> None:
        """Wait until the save is durable (raise if it failed), then write
        ckptd.json (on its own thread: Orbax's commit)."""
        fut.result()
        self._write(directory, fut.step)

    def save(self, directory: epath.Path, args: Save) -> None:
        """Save args.item and wait until it is durable."""
        step = args.step if args.step is not None else _step_of(directory)
        self._clear_orphans(directory, step)
        fut = self.checkpointer.save(args.item, step)
        fut.result()
        self._write(directory, fut.step)

    def _clear_orphans(self, directory: epath.Path, step: int) -> None:
        """Before this handler's first save, step, remove the job's ckptd
        steps from step on that have no finished Orbax step directory:
        saves of a run that died before Orbax finalized them (ckptd
        finishes a staged save without its trainer; Orbax does not), which
        the resumed run saves again, and ckptd never overwrites a step.
        Only a run that continues the job does so (it restored from it, or
        exist_ok), and only steps past the newest finished Orbax step: a
        new run with an empty or mistyped directory must get the
        Checkpointer's EEXIST, not remove the old run's steps. Process 0
        removes them; every process waits for it."""
        if self._orphans_cleared:
            return
        self._orphans_cleared = True
        client = self.checkpointer.client
        assert client is not None, "open"
        if not self.checkpointer.exist_ok and (client.socket, self.job) not in _resumed:
            return
        if jax.process_index() == 0:
            try:
                saved = {s["step"] for s in client.list(self.job) if s["job"] == self.job}
            except CkptError as e:
                if e.errno != errno.ENOENT:
                    raise
                saved = set()
            finished = _finished_steps(directory.parent.parent)
            newest = max(finished, default=-1)
            for n in sorted(s for s in saved if s >= step and s > newest and s not in finished):
                client.delete(n)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices("ckpt.orbax: orphan steps removed")

    def _write(self, directory: epath.Path, step: int) -> None:
        """ckptd.json, on the primary process."""
        if jax.process_index() == 0:
            (directory / METADATA).write_text(json.dumps({"job": self.job, "step": step}))

    def restore(self, directory: epath.Path, args: Optional[Restore] = None) -> Any:
        """Restore the step ckptd.json names (into args.item's shardings,
        when given: ckpt.jax.Checkpointer.restore's target)."""
        meta = self.metadata(directory)
        if meta["job"] != self.job:
            raise ValueError(f"'{directory}' holds job '{meta['job']}' of ckptd, this handler's is '{self.job}'")
        _, tree = self.checkpointer.restore(int(meta["step"]), target=args.item if args is not None else None)
        return tree

    def metadata(self, directory: epath.Path) -> Any:
        """ckptd.json of the item's directory: {"job": ..., "step": ...}."""
        return json.loads((directory / METADATA).read_text())

    def close(self) -> None:
        """Wait until every save is durable and disconnect."""
        self.checkpointer.close()


@ocp.args.register_with_handler(Handler, for_save=True)
@dataclasses.dataclass
class Save(ocp.args.CheckpointArgs):
    """Handler's save arguments: item, the pytree; step, the ckptd step
    (None: the Orbax step)."""
    item: Any
    step: Optional[int] = None


@ocp.args.register_with_handler(Handler, for_restore=True)
@dataclasses.dataclass
class Restore(ocp.args.CheckpointArgs):
    """Handler's restore arguments: item, None (the tree as saved) or a
    target (ckpt.jax.Checkpointer.restore's: arrays, ShapeDtypeStructs or
    shardings)."""
    item: Any = None


def handler_registry(handler: Handler, item: Optional[str] = None,
                     registry: Optional[Any] = None) -> Any:
    """registry (default: a new ocp.handlers.DefaultCheckpointHandlerRegistry)
    with handler for item's Save and Restore (item None: the manager's
    single, unnamed item); for CheckpointManager(handler_registry=...)."""
    reg = registry if registry is not None else ocp.handlers.DefaultCheckpointHandlerRegistry()
    reg.add(item, Save, handler)
    reg.add(item, Restore, handler)
    return reg
