"""What every Checkpointer (ckpt.torch, ckpt.jax) does with its saves
once they are sent, without torch or jax: their futures, the failures
nobody saw (raised at the next save, wait() or close()), backpressure
under the daemon's max_inflight_saves, the check of a reused job, persist,
wait_complete, and the choice of the step a load takes between storage
and this node's memory."""
from __future__ import annotations

import concurrent.futures
import errno
import re
import time
import warnings
from typing import Any, Callable, Dict, List, Optional

from .client import _CONNECTION_ERRNOS, LATEST, CkptError, Client, Superseded


class SaveFuture:
    """.staged, .kept, .replicated and .durable are concurrent.futures.Future
    objects, None for a phase the save's tier never reaches (ckpt.SaveFuture;
    docs/tiers.md "Tiers"); .step the step; .result() waits until the save is safe
    at its tier."""

    def __init__(self, inner: Any, step: int) -> None:
        self._inner = inner
        self.step = step
        self.tier = getattr(inner, "tier", "durable")
        self.staged = inner.staged
        self.kept = getattr(inner, "kept", None)
        self.replicated = getattr(inner, "replicated", None)
        self.durable = inner.durable

    def result(self, timeout: Optional[float] = None) -> Any:
        """Wait until the save is safe at its tier (durable, or kept);
        its bytes, or raise CkptError."""
        return self._inner.result(timeout)

    @property
    def daemon_stall(self) -> Optional[float]:
        """Seconds ckptd took from the request to staged (None before
        staged, and for fallback saves)."""
        return getattr(self._inner, "daemon_stall", None)


# ckptd's refusal of a save over max_inflight_saves (daemon/engine/save.c).
_INFLIGHT = re.compile(r"(\d+) saves of job .* are in flight \(max_inflight_saves")


def _phases(f):
    """The phases of SaveFuture f its tier reaches, but replicated (whose
    failure leaves the save kept): staged, then kept or durable."""
    return [x for x in (f.staged, f.kept, f.durable) if x is not None]


def _finished(f):
    """Whether every phase of SaveFuture f (but replicated) is done."""
    return all(x.done() for x in _phases(f))


def _failure(fut):
    """A completed future's exception, without marking it seen."""
    return None if fut.cancelled() else concurrent.futures.Future.exception(fut, 0)


# Jobs some Checkpointer of this process loaded (or tried to load) from,
# as (socket, job): saving into them continues them (Checkpointer exist_ok).
_resumed: "set[tuple[str, str]]" = set()


class SaveTracking:
    """The save bookkeeping a Checkpointer inherits. The subclass sets
    client (None once closed, or without ckptd), job, rank, world_size,
    exist_ok, _inflight (SaveFutures whose failures are not reported yet),
    _fresh_checked, _max_inflight (4, ckptd's default max_inflight_saves)
    and _last_save, and defines _check_open()."""

    client: Optional[Client]
    job: str
    rank: int
    world_size: int
    exist_ok: bool
    _inflight: List[Any]
    _fresh_checked: bool
    _max_inflight: int
    _last_save: Optional[SaveFuture]
    # What a Checkpointer without ckptd saves to, for the errors of what needs it.
    _FALLBACK = "the fallback"
    # After a load of a named step: that step, and (rank 0, listed at the
    # first save after it) the job's steps after it that are complete
    # (_note_load, _check_not_newer). Off for alone=True, unless the
    # framework that numbers the saves turns it on (ckpt.lightning, ckpt.hf).
    _guard_rollback = True
    _loaded_step: Optional[int] = None
    _loaded_latest = False  # _loaded_step was the latest complete step when loaded
    _newer: "Optional[frozenset[int]]" = None
    # How a framework that numbers its own steps (alone=True) replaces a
    # step after the loaded one instead of raising: called with the step,
    # it raises, or returns and the step is removed before it is saved
    # again (ckpt.lightning, ckpt.hf).
    _replace_newer: Optional[Callable[[int], None]] = None

    def _check_open(self) -> None:
        raise NotImplementedError

    def _submit(self, save_once: Callable[[], SaveFuture], overlap: bool = False) -> SaveFuture:
        """Send a save (save_once() sends it and returns its SaveFuture)
        and, unless overlap, wait until it is staged. A refusal over
        max_inflight_saves while this rank has saves in flight waits for
        one of them and sends again."""
        while True:
            self._make_room()
            fut = save_once()
            self._inflight.append(fut)
            if overlap:
                return fut
            try:
                fut.staged.result()  # staged: the trainer may change the tensors
                return fut
            except CkptError as e:
                self._inflight.pop()  # raised here: not again at the next call
                m = _INFLIGHT.search(str(e)) if e.errno == errno.EBUSY else None
                if m is None or not any(not _finished(f) for f in self._inflight):
                    raise
                # More saves in flight than the daemon takes: wait for ours.
                self._max_inflight = max(1, int(m.group(1)))

    def _check_saves(self):
        """Forget finished saves; raise the first failure of one nobody
        has seen (its futures' result() or exception() not called), naming
        the step. A save superseded under the coalesce policy, and one
        that is kept but not replicated, are not failures."""
        keep, failed = [], []
        for f in self._inflight:
            phases = _phases(f)
            bad = [x for x in phases if x.done() and _failure(x) is not None]
            if bad:
                err = _failure(bad[0])
                # Seen once (a phase's result() raised it) is seen.
                if not any(getattr(x, "seen", True) for x in bad) and not isinstance(err, Superseded):
                    failed.append((f, err))
                for x in phases:
                    x.seen = True
            elif not all(x.done() for x in phases):
                keep.append(f)
        self._inflight = keep
        if failed:
            f, err = failed[0]
            more = f" (and {len(failed) - 1} later save(s) failed too)" if len(failed) > 1 else ""
            raise CkptError(err.errno or errno.EIO,
                            f"step {f.step} of job '{self.job}' was not saved: {err.strerror or err}{more}") from err

    def wait(self, timeout: Optional[float] = None) -> None:
        """Wait until every save this Checkpointer started is safe at its
        tier (durable, or kept for a memory save) and raise the first
        failure nobody has seen (CkptError naming the step). TimeoutError
        after timeout seconds."""
        self._check_open()
        last = []
        for f in self._inflight:
            last += _phases(f)
        _, pending = concurrent.futures.wait(last, timeout)
        if pending:
            raise TimeoutError(f"{len({id(f) for f in self._inflight})} save(s) of job '{self.job}' not finished "
                               f"after {timeout} s")
        self._check_saves()

    def wait_complete(self, step: Optional[int] = None, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Wait until step (default: the last one this checkpointer saved)
        is complete in storage on every rank, and pin it as a restore
        would; its entry as Client.list gives it. This rank's save of the
        step is waited for first (and its failure raised). Call it on every
        rank instead of polling list() or a barrier: the ranks of a node
        share their daemon's one poll of storage. timeout: seconds (None:
        no limit; 0: look once); CkptError ETIMEDOUT, saying how many
        ranks are in storage, when it is not complete in time. A memory or
        replicated step reaches storage only once persisted (persist()).
        Without ckptd (ckpt.torch's fallback_dir) each rank's file is
        durable when save() returns and there is nothing to ask:
        ValueError."""
        self._check_open()
        if self.client is None:
            raise ValueError(f"wait_complete() needs ckptd; with {self._FALLBACK} each rank's file is "
                             "durable when save() returns")
        last = self._last_save
        if step is None:
            if last is None:
                raise ValueError("wait_complete(): nothing saved yet; name the step")
            step = last.step
        if timeout is not None and timeout == float("inf"):
            timeout = None
        end = None if timeout is None else time.monotonic() + timeout
        if last is not None and last.step == int(step) and last.tier == "durable":
            try:
                last.result(timeout)
            except concurrent.futures.TimeoutError:
                raise CkptError(errno.ETIMEDOUT, f"step {step} of job '{self.job}': this rank's save is not "
                                f"durable within the wait's timeout") from None
        left = None if end is None else max(0.0, end - time.monotonic())
        return self.client.wait_complete(int(step), timeout=left)

    def _note_load(self, step: Optional[int], latest: bool = False) -> None:
        """This process loads a named step (rolls back, maybe; None: the
        latest, not yet resolved, which forgets an earlier one; -1: none,
        a first save with exist_ok that did not load, _check_fresh), or
        with latest the step "latest" resolved to: a step after it that is
        complete by the first save was a dead launch's save in flight at
        the load, which ckptd finished since, and a save of it replaces it
        (_remove_newer); in a world of one process only: with several
        ranks the others' saves of that step would meet the removal (the
        step's lock on a node, a pinned step refusing them), so there rank
        0 warns that the earlier launch's step stays the step. At the first
        save after it, rank 0 lists the job's steps after it that are
        complete (one listing), and a save of one of them raises
        (_check_not_newer): ckptd never overwrites a complete step, and a
        save of it under this launch's attempt would be durable but never
        loaded (the attempt that completed first is the step;
        docs/format.md "Attempts"). Only rank 0 asks, as _check_fresh."""
        if self.rank == 0 and self._guard_rollback:
            self._loaded_step, self._newer, self._loaded_latest = step, None, latest

    def _check_not_newer(self, step: int) -> None:
        """Raise CkptError(EEXIST) for a save of a step that was complete
        after the step _note_load noted, unless it is gone since (a
        listing, on this path only)."""
        if self._loaded_step is None or self.client is None:
            return
        if self._newer is None:
            try:
                self._newer = frozenset(s["step"] for s in self.client.list(self.job)
                                        if s["job"] == self.job and s["complete"] and s["step"] > self._loaded_step)
            except CkptError as e:
                if e.errno in _CONNECTION_ERRNOS and e.errno != errno.ENOENT:
                    raise
                if e.errno == errno.ENOENT:  # a job with no step
                    self._newer = frozenset()
                return  # else not known (asked again at the next save): the daemon's own checks only
        if step not in self._newer:
            return
        still = any(s["step"] == step and s["complete"] for s in self.client.list(self.job) if s["job"] == self.job)
        if not still:
            self._newer = self._newer - {step}
            return
        if self._loaded_latest and self.world_size != 1:
            self._newer = self._newer - {step}
            warnings.warn(f"ckpt: step {step} of job '{self.job}' is complete already, from an earlier launch whose "
                          f"save ckptd finished after this launch loaded step {self._loaded_step}: with several ranks "
                          f"it is not replaced, so this save is durable but the earlier launch's step {step} is the "
                          f"one that loads", stacklevel=3)
            return
        if self._loaded_latest or (self._replace_newer is not None and self._loaded_step >= 0):
            if self._replace_newer is not None:
                self._replace_newer(step)
            self._remove_newer(step)
            return
        if self._loaded_step < 0:
            raise CkptError(errno.EEXIST,
                            f"step {step} of job '{self.job}' is complete already, and this process adds steps to "
                            f"the job (exist_ok) without loading from it: ckptd never overwrites a complete step, "
                            f"and this save would never be loaded; remove that step first (ckptctl rm {self.job} "
                            f"{step}, or Client.delete), load() to continue the job, or save under other step numbers")
        raise CkptError(errno.EEXIST,
                        f"step {step} of job '{self.job}' is complete already, after step {self._loaded_step} that "
                        f"this process loaded: ckptd never overwrites a complete step, and this save would never be "
                        f"loaded; to go on from step {self._loaded_step}, remove the job's steps after it first "
                        f"(ckptctl rm {self.job} STEP, or Client.delete) or save under other step numbers")

    def _remove_newer(self, step: int) -> None:
        """Remove complete step (an earlier run's, after the loaded one)
        so that this save replaces it; raise, saying so, if it stays
        complete (a later step refers to it, a load reads it). EBUSY that
        left only a young incomplete attempt (a save in flight elsewhere:
        docs/architecture.md "What a removal leaves") removed the step."""
        client = self.client
        assert client is not None  # _check_not_newer's caller has one
        try:
            client.delete(step)
        except CkptError as e:
            if e.errno != errno.ENOENT and any(s["step"] == step and s["complete"]
                                               for s in client.list(self.job) if s["job"] == self.job):
                raise CkptError(e.errno, f"step {step} of job '{self.job}', complete from an earlier run after step "
                                f"{self._loaded_step} that this process loaded, could not be removed to save it "
                                f"again: {e.strerror}") from e
        self._newer = (self._newer or frozenset()) - {step}
        warnings.warn(f"ckpt: step {step} of job '{self.job}', complete from an earlier run after step "
                      f"{self._loaded_step} that this process loaded, is replaced by this save", stacklevel=4)

    def _check_fresh(self, exist_ok: Optional[bool] = None) -> None:
        """The first save into a job with steps, by a process that did not
        load from it, raises (exist_ok: this Checkpointer's, or the
        caller's, a ckpt.dcp Writer's; rank 0 asks the daemon once it
        answered: a refusal, or a listing that failed, asks again at the
        next save)."""
        exist_ok = self.exist_ok if exist_ok is None else exist_ok
        client = self.client
        assert client is not None  # a save's caller has one
        if exist_ok or self.rank != 0 or (client.socket, self.job) in _resumed:
            self._fresh_checked = True
            if (exist_ok and self.rank == 0 and self._guard_rollback and self._loaded_step is None
                    and (client.socket, self.job) not in _resumed):
                # Steps added to a job with steps: a save of a complete one
                # raises too (as after a load of step -1; one listing).
                self._note_load(-1)
            return
        try:
            # Complete steps only: every rank's save of a step is in it, rank
            # 0's too, so none is this run's (the other ranks' first saves
            # may be listed already, incomplete).
            steps = sorted({s["step"] for s in client.list(self.job) if s["job"] == self.job and s["complete"]})
        except CkptError as e:
            if e.errno in _CONNECTION_ERRNOS and e.errno != errno.ENOENT:
                raise
            # A job never seen (nothing to collide with), or storage that
            # did not answer (not this save's to fail: asked again next time).
            self._fresh_checked = e.errno == errno.ENOENT
            return
        self._fresh_checked = not steps
        if steps:
            have = (f"complete step {steps[0]}" if len(steps) == 1
                    else f"{len(steps)} complete steps ({steps[0]} to {steps[-1]})")
            raise CkptError(errno.EEXIST,
                            f"job '{self.job}' already has {have} and this process has not loaded from it: "
                            f"to resume, call load() before saving; to start afresh, use a new job name or "
                            f"remove the old steps (ckptctl rm {self.job} STEP); to add steps anyway, "
                            "Checkpointer(..., exist_ok=True)")

    def _make_room(self):
        """Backpressure: while this rank has as many saves in flight as
        the daemon admits (max_inflight_saves: 4 by default, or what its
        refusal said), wait for the oldest to finish, rather than have
        ckptd refuse the next with EBUSY."""
        while True:
            busy = [f for f in self._inflight if not _finished(f)]
            if len(busy) < self._max_inflight:
                return
            concurrent.futures.wait(_phases(busy[0]))

    def _track(self, fut: SaveFuture) -> SaveFuture:
        self._last_save = fut
        return fut

    def persist(self, step: Optional[int] = None) -> SaveFuture:
        """Make a memory or replicated step durable (default: the last one
        this checkpointer saved), for example when the job is told to stop:
        this rank's save of it is waited for first, then this node's daemon
        uploads every copy of the step it holds in memory. Call it on every
        rank (each node persists its own ranks' copies; a copy persisted
        already is not written again). Returns a SaveFuture whose .durable
        and result() complete once they are durable."""
        self._check_open()
        last = getattr(self, "_last_save", None)
        if step is None:
            if last is None:
                raise ValueError("persist(): nothing saved yet; name the step")
            step = last.step
        if self.client is None:
            raise ValueError(f"persist() needs ckptd; {self._FALLBACK} is durable already")
        if last is not None and last.step == int(step):
            last.result()  # its copy must be kept before it can be persisted
        return SaveFuture(self.client.persist(int(step)), int(step))

    def _held_steps(self):
        """The steps this node's daemon holds in memory only for this rank
        (at this world size): restorable here, unknown to storage. Durable
        copies are storage's to count (its latest needs every rank)."""
        try:
            return sorted({h["step"] for h in self.client.held()
                           if h["world_size"] == self.world_size and not h["durable"]})
        except Exception:
            return []  # an older daemon: storage only

    def _decide(self, want, in_memory):
        """want (LATEST or a step) resolved by the daemon from storage, or
        from in_memory (the steps every rank's daemon holds for it): with
        LATEST, the newest of them when it is newer than storage's or
        storage has none; a named step held in memory by every rank when
        storage has not got it. A storage error other than none raises: it
        never falls back."""
        import errno as _errno
        from .client import CkptError
        newest = max(in_memory) if in_memory else None
        try:
            stored = self.client.resolve(want)
        except CkptError as e:
            if e.errno != _errno.ENOENT:
                raise
            if want == LATEST and newest is not None:
                return newest
            if want != LATEST and want in in_memory:
                return want
            raise
        if want == LATEST and newest is not None and newest > stored:
            return newest
        return stored
