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
loads as one. After a resume, a save of a later step that ckptd holds
complete replaces it when no pointer names it (a run that died before
writing the pointer) and raises EEXIST when one does (docs/python.md "A
rollback saves only steps that will load").

Lightning saves on global rank 0 only (the state is the same on every rank),
so the plugin saves as rank 0 of 1 whatever the launcher says.
"""
from __future__ import annotations

import errno
import json
import os
import re
import sys
import threading
import warnings
from concurrent.futures import Future
from typing import Any, Dict, Optional, Set, Tuple, Union

try:
    from lightning.pytorch.plugins.io import CheckpointIO
except ImportError:  # the older package name
    from pytorch_lightning.plugins.io import CheckpointIO  # type: ignore[assignment]

from .client import CkptError
from .torch import Checkpointer, SaveFuture, _failure

POINTER = "ckptd-step"
# A pointer being written (_write_pointer): PATH.tmp.PID, renamed over PATH.
_TMP = re.compile(r"\.tmp\.[0-9]+$")

__all__ = ["CkptdCheckpointIO", "read_pointer"]

# A path as Lightning hands it over (a str or a pathlib.Path).
_Path = Union[str, "os.PathLike[str]"]


def read_pointer(path: _Path) -> Optional[Tuple[str, int]]:
    """(job, step) of a pointer file, or None if path is not one (any
    file of a checkpoint directory is read: a malformed one is not a
    pointer, never an error)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
        p = json.loads(head)
        if isinstance(p, dict) and p.get("format") == POINTER and isinstance(p.get("job"), str):
            step = p.get("step")
            if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
                return p["job"], step
    except (OSError, ValueError, UnicodeDecodeError):
        pass
    return None


def _fsync_dir(d: str) -> None:
    """Make the directory's entries (a rename, a removal) durable."""
    fd = os.open(d or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _checkpoint_dirs(checkpoint: Dict[str, Any]) -> Set[str]:
    """Every ModelCheckpoint's dirpath, from the callbacks' state in a
    checkpoint Lightning saves (the plugin sees no trainer)."""
    dirs: Set[str] = set()
    callbacks = checkpoint.get("callbacks")
    for state in (callbacks.values() if isinstance(callbacks, dict) else ()):
        d = state.get("dirpath") if isinstance(state, dict) else None
        if isinstance(d, (str, os.PathLike)):
            dirs.add(os.path.abspath(os.fspath(d)))
    return dirs


class CkptdCheckpointIO(CheckpointIO):
    """Lightning's CheckpointIO through ckptd: each checkpoint is step
    global_step of job, and its path holds a pointer file once durable
    (module docstring)."""

    def __init__(self, job: str, socket: Optional[str] = None, attempt_id: Optional[str] = None,
                 remove_steps: bool = True, exist_ok: bool = False, storage: Optional[str] = None) -> None:
        """job: the ckptd job (its steps are the trainer's global steps);
        socket: ckptd's socket (default $CKPTD_SOCKET, else
        /run/ckptd/ckptd.sock); remove_steps: a step no pointer names any
        more (ModelCheckpoint's top-k removal, last.ckpt moving on) is
        removed from ckptd too; exist_ok: save into a job that has steps
        without resuming from it (by default the first save then raises:
        a second run of the same script must resume, with
        fit(ckpt_path=...), or use a new job name); storage: where steps go
        when no ckptd runs on the node (this user's daemon is then started,
        as ckpt.torch.Checkpointer's storage=)."""
        super().__init__()
        self.job, self.socket, self.attempt_id, self.storage = job, socket, attempt_id, storage
        self.remove_steps, self.exist_ok = remove_steps, exist_ok
        self._cp: Optional[Checkpointer] = None
        self._lock = threading.Lock()
        self._saves: Dict[int, SaveFuture] = {}  # of this process's saves, by step (kept past teardown)
        self._pointers: Dict[str, int] = {}  # path -> step its pointer names, or will once the step is durable
        self._dirs: Set[str] = set()      # directories holding this plugin's pointers (and ModelCheckpoint's)
        self._orphans: Set[int] = set()   # steps whose pointer went or was replaced: removed once none names them
        self._reported: Set[int] = set()  # steps whose failure was raised already
        self._resumed: Optional[int] = None  # the step load_checkpoint loaded from ckptd (until teardown)
        self._torn_down = False

    def _checkpointer(self) -> Checkpointer:
        if self._cp is None:
            cp = Checkpointer(self.job, socket=self.socket, attempt_id=self.attempt_id, alone=True,
                              exist_ok=self.exist_ok, storage=self.storage)
            # The rollback guard, with pointers deciding (_replace_unnamed).
            cp._guard_rollback, cp._replace_newer = True, self._replace_unnamed
            self._cp = cp
        return self._cp

    def _replace_unnamed(self, step: int) -> None:
        """Before a save of a step that ckptd holds complete already,
        after the step this process resumed from (the Checkpointer's
        rollback guard asks, listing once): return when no pointer names
        it, and the step is replaced (removed, then saved again). Such a
        step is a save of a run that died before its pointer was written
        (ckptd finishes a staged save without its trainer), which this
        run, resumed from the pointer before it, saves again; kept, this
        save would be durable but never loaded. A step a pointer names is
        a checkpoint of its own (a resume from an older one): ckptd keeps
        one state per step, where Lightning would version the new file's
        name, so the save raises EEXIST; so does any, with remove_steps
        False (steps no pointer names are kept then). The pointers looked
        at are those in the directory resumed from, in those saved to, and
        in every ModelCheckpoint's dirpath (save_checkpoint)."""
        self._flush_pointers()
        with self._lock:
            paths = sorted(p for p, s in self._pointer_files().items() if s == step)
        what = f"step {step} of job '{self.job}' is complete already"
        after = f"after step {self._resumed} that this run resumed from"
        if paths:
            raise CkptError(errno.EEXIST, f"{what} and {paths[0]} names it, {after}: ckptd keeps one state per "
                            f"step; resume from the newest checkpoint, or remove the later ones first (their "
                            f"files, and ckptctl rm {self.job} STEP)")
        if not self.remove_steps:
            raise CkptError(errno.EEXIST, f"{what}, {after}, and no pointer names it (a run that died before "
                            f"writing it); with remove_steps=False it is not removed: remove it (ckptctl rm "
                            f"{self.job} {step}) to save it again")

    def _write_pointer(self, path: str, step: int) -> None:
        """Write path's pointer to step (fsync'd, then renamed over the
        old one), unless path was removed or given another step since; the
        step the old pointer named becomes an orphan. Runs on libckpt's
        reader thread (the durable callback) or the trainer's."""
        with self._lock:
            if self._pointers.get(path) != step:
                return
            old = read_pointer(path)
            if old == (self.job, step):
                return  # written already (the callback, or _flush_pointers)
            tmp = f"{path}.tmp.{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump({"format": POINTER, "job": self.job, "step": step}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            # The rename reaches the disk before the old step can be
            # removed: after a power cut the pointer never names a step
            # that is gone.
            _fsync_dir(os.path.dirname(path))
            if old is not None and old[0] == self.job and old[1] != step:
                self._orphans.add(old[1])

    def _pointer_files(self) -> Dict[str, int]:
        """The pointer files of this job on disk, in this plugin's
        directories (each file read once): path -> step."""
        found: Dict[str, int] = {}
        for d in self._dirs:
            try:
                names = os.listdir(d)
            except OSError:
                continue
            for n in names:
                # A pointer being written, or left half-way by a run that
                # died: the step it names is not named yet.
                p = None if _TMP.search(n) else read_pointer(os.path.join(d, n))
                if p is not None and p[0] == self.job:
                    found[os.path.join(d, n)] = p[1]
        return found

    def _named_steps(self) -> Set[int]:
        """The steps of this job something still names: a pointer on
        disk, one still to be written, or a save in flight."""
        named = set(self._pointers.values())
        named.update(s for s, f in self._saves.items() if not f.durable.done())
        named.update(self._pointer_files().values())
        return named

    def _flush_pointers(self) -> None:
        """Write the pointers of durable steps whose durable callback has
        not run yet: a future's result() returns before its callbacks run,
        and what _settle decides must see every pointer of a durable step."""
        with self._lock:
            items = list(self._pointers.items())
        for path, step in items:
            f = self._saves.get(step)
            if f is not None and f.durable.done() and _failure(f.durable) is None:
                self._write_pointer(path, step)

    def _settle(self) -> None:
        """On the trainer's thread (a request to ckptd must not run on the
        reader thread): raise the first failed save not raised yet, and
        remove the orphan steps nothing names any more."""
        self._flush_pointers()
        with self._lock:
            # Orphans first: a save still in flight is named, so every
            # orphan's save is done before the failures are looked at (one
            # that failed meanwhile is reported, never dropped unseen).
            named = self._named_steps() if self._orphans else set()
            orphans = [s for s in self._orphans if s not in named]
            failed = [(s, f) for s, f in self._saves.items()
                      if s not in self._reported and f.durable.done() and f.durable.exception() is not None]
            self._reported.update(s for s, _ in failed)
            for s, _ in failed:
                self._saves.pop(s, None)
                for path in [p for p, st in self._pointers.items() if st == s]:
                    del self._pointers[path]
            self._orphans.difference_update(orphans)
            for s in orphans:
                self._saves.pop(s, None)  # a later save of it saves anew
        if self.remove_steps:
            for s in orphans:
                try:
                    self._checkpointer()._live()[0].delete(s)
                except OSError:
                    pass  # gone already (retention), or never reached storage
        if failed:
            s, f = failed[0]
            e = f.durable.exception()
            raise CkptError(e.errno or errno.EIO, f"Lightning checkpoint step {s} of job '{self.job}' was not "
                            f"saved: {e.strerror or e}") from e

    def save_checkpoint(self, checkpoint: Dict[str, Any], path: _Path, storage_options: Optional[Any] = None) -> None:
        """Save checkpoint as step global_step and return once staged (at
        once when that step is saved already: Lightning's last.ckpt of a
        step it just saved); the pointer at path is written once the step
        is durable. After fit (teardown), wait until durable. Raises an
        earlier save's failure first."""
        step = int(checkpoint.get("global_step", 0))
        path = os.path.abspath(os.fspath(path))
        d = os.path.dirname(path)
        os.makedirs(d, exist_ok=True)
        self._settle()
        with self._lock:
            fut = self._saves.get(step)
            self._dirs.add(d)
            self._dirs.update(_checkpoint_dirs(checkpoint))
        if fut is None:
            try:
                fut = self._checkpointer().save(checkpoint, step)
            except CkptError as e:
                if e.errno == errno.EEXIST and (self._resumed is not None or self.exist_ok):
                    raise  # the rollback guard's, saying what to do (_replace_unnamed, exist_ok)
                if e.errno == errno.EEXIST:
                    raise CkptError(e.errno, f"{e.strerror}. With Lightning: trainer.fit(model, ckpt_path=PATH "
                                    "of last.ckpt) resumes, or CkptdCheckpointIO(job, exist_ok=True)") from None
                raise CkptError(e.errno, f"Lightning checkpoint step {step} of job '{self.job}' was not saved: "
                                f"{e.strerror}") from e
            with self._lock:
                self._saves[step] = fut
        with self._lock:
            self._pointers[path] = step

        def durable(f: Future[Any]) -> None:  # on libckpt's reader thread
            if f.exception() is None:
                self._write_pointer(path, step)
        fut.durable.add_done_callback(durable)
        if self._torn_down:
            # Outside fit nothing waits for it later: now, and its error here.
            try:
                fut.durable.result()
            finally:
                self._settle()

    def load_checkpoint(self, path: _Path, map_location: Optional[Any] = None,
                        weights_only: Optional[bool] = None) -> Dict[str, Any]:
        """The checkpoint at path: the step its pointer names, loaded from
        ckptd (this process then continues the job), or a regular
        checkpoint file loaded with torch.load."""
        path = os.fspath(path)
        p = read_pointer(path)
        if p is None:  # a checkpoint written without ckptd
            import torch
            return torch.load(path, map_location=map_location, weights_only=bool(weights_only))
        job, step = p
        if job != self.job:
            raise ValueError(f"{path} is step {step} of job '{job}', not of '{self.job}'")
        state: Dict[str, Any] = {}
        self._checkpointer().load(state, step=step)
        with self._lock:
            self._resumed = step
            self._dirs.add(os.path.dirname(os.path.abspath(path)))
        return state

    def remove_checkpoint(self, path: _Path) -> None:
        """Remove path's pointer (or file); its step is removed from ckptd
        too once no pointer names it and it is durable (remove_steps)."""
        path = os.path.abspath(os.fspath(path))
        with self._lock:
            pending = self._pointers.pop(path, None)
            p = read_pointer(path)
            try:
                os.remove(path)
                _fsync_dir(os.path.dirname(path))  # gone for good before its step goes
            except FileNotFoundError:
                pass
            for s in (pending, p[1] if p is not None and p[0] == self.job else None):
                if s is not None:
                    self._orphans.add(s)
            self._dirs.add(os.path.dirname(path))
        self._settle()

    def teardown(self) -> None:
        """Wait until every step is durable (its pointers written), remove
        the orphan steps, and raise the first failure not raised yet; but
        when fit is ending on an exception already (Lightning tears down
        while handling it), only warn of it, so that the first error is
        the one the trainer sees."""
        unwinding = sys.exc_info()[1] is not None
        with self._lock:
            futs = list(self._saves.values())
        try:
            for f in futs:
                try:
                    f.durable.result()
                except CkptError:
                    pass  # raised by _settle, naming the step
            try:
                self._settle()
            except CkptError as e:
                if not unwinding:
                    raise
                warnings.warn(f"{e} (while fit was ending on an earlier error)", RuntimeWarning, stacklevel=2)
        finally:
            self._torn_down = True
            self._resumed = None  # a load for validate() or test() is not a resume of a later fit()
            if self._cp is not None:
                self._cp.close(wait=False)
                self._cp = None
