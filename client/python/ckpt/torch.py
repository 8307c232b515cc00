"""ckpt.torch: checkpoint PyTorch state dicts through ckptd.

    cp = ckpt.torch.Checkpointer("llama", rank=r, world_size=w)
    fut = cp.save({"model": model.state_dict(), "optim": opt.state_dict()}, step)
    fut.staged.result()   # the trainer may change its tensors again
    fut.durable.result()  # the step is in storage (or keep training)
    step, extra = cp.load(state_dict)          # in place, latest complete step

Zero copy: the first time a CPU tensor is saved (or loaded), its storage
moves into shared memory in place (every alias sees it, parameters and
optimizer state included) and that file is registered with the daemon:
for a save plan, every storage into one file (torch 2.15 and later:
Registrations.arena_move in ckpt/_regs.py), else each into its own
(``share_memory_()``). Later saves copy nothing in
the trainer: the daemon reads the shared memory directly.
Contiguous CUDA tensors are registered through the C API's CUDA path
(legacy IPC handles, or VMM fds for expandable segments) and copied by the
daemon D2H after an event on the current stream; when CUDA is off in this
process or in the daemon they are copied, like non-contiguous tensors,
into a registered scratch buffer on each save. A shared
storage cannot be resized afterwards (PyTorch's rule for shared memory), so
code that resize_()s parameter storages (FSDP-style) must not hand them to
a Checkpointer.

A save of a state dict whose shape and tensors are those of the last one
(model.state_dict() again: new tensor objects, the same storages) reuses
the last save's plan: names, pickled skeleton, registrations, and the
daemon's tensor table, so it sends a step and the non-tensor values
(docs/python.md "Python and PyTorch": about 1.5 us per tensor). prepare() makes
the plan ahead of the first save.

Non-tensor values (ints, floats, param_groups, ...) and the nesting of the
state dict travel pickled in the step's extra state; load puts them back,
and creates tensors the given state dict lacks (a fresh optimizer's state).
The extra state is unpickled on load: load only checkpoints you trust, as
with torch.load(weights_only=False).
"""
from __future__ import annotations

import concurrent.futures
import errno
import os
import pickle
import weakref
from typing import Any, Dict, List, Mapping, MutableMapping, Optional, Set, Tuple, Union

import torch

from . import _attempt, _node
from ._cuda import CudaRegistrations, cuda_stream  # noqa: F401 (cuda_stream: ckpt.torch's, for ckpt.dcp)
from ._fallback import Fallback
from ._plan import SavePlans, flatten
from ._regs import Registrations
from ._saving import _INFLIGHT, SaveFuture, SaveTracking, _failure, _finished, _phases, _resumed  # noqa: F401
from ._tree import DTYPE_CODES, TORCH_DTYPES, _materialize, _Ref, load_meta  # noqa: F401
from .client import LATEST, CkptError, Client, DaemonUnavailable, _compress, _setting

__all__ = ["Checkpointer", "DTYPE_CODES", "DaemonUnavailable"]


def _raise_nofile():
    """One fd per registered storage: lift the soft limit to the hard one."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass



def _launcher():
    """(rank, world size, local rank, who said so) from the launcher:
    torch.distributed when it is initialized, else torchrun's RANK,
    WORLD_SIZE and LOCAL_RANK; (None, None, None, None) without either."""
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        local = os.environ.get("LOCAL_RANK")
        return dist.get_rank(), dist.get_world_size(), int(local) if local else None, "torch.distributed"
    r, w = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if r is not None and w is not None:
        try:
            local = os.environ.get("LOCAL_RANK")
            return int(r), int(w), int(local) if local else None, "RANK/WORLD_SIZE"
        except ValueError:
            raise ValueError(f"RANK={r!r} WORLD_SIZE={w!r}: not numbers") from None
    return None, None, None, None


def resolve_rank(rank: Optional[int] = None, world_size: Optional[int] = None) -> Tuple[int, int, int]:
    """The rank and world size a checkpointer uses: the launcher's
    (torch.distributed, else RANK/WORLD_SIZE), or the ones given, or 0 of 1
    without a launcher. One given by hand that disagrees with the launcher
    is an error, never a silent collision of two ranks' saves. Returns
    (rank, world_size, local_rank)."""
    lr, lw, local, who = _launcher()
    if who is not None:
        if rank is not None and rank != lr or world_size is not None and world_size != lw:
            raise ValueError(f"rank={rank} world_size={world_size} given, but {who} says rank {lr} of {lw}; "
                             "leave them out (they come from the launcher) or fix the launch")
        rank, world_size = lr, lw
    rank = 0 if rank is None else int(rank)
    world_size = 1 if world_size is None else int(world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} of world size {world_size} is out of range")
    return rank, world_size, local if local is not None else 0


# Layers whose train-mode forward changes saved tensors in place (running
# statistics): with overlap=model, their forward waits for staged.
_STAT_LAYERS = (torch.nn.modules.batchnorm._NormBase,)


class Checkpointer(SaveTracking):
    """Saves and loads one job's state dicts through this node's ckptd.

        cp = ckpt.torch.Checkpointer("llama")      # socket: $CKPTD_SOCKET or /run/ckptd/ckptd.sock
        cp.save({"model": model.state_dict(), "optim": opt.state_dict()}, step)   # returns once staged
        opt.step()                                  # safe: ckptd has its own copy
        cp.close()                                  # waits until every save is durable; raises if one failed

    save() returns once ckptd holds its own copy of the tensors (staged),
    so the trainer may change them at once, and uploads in the background.
    With overlap=, save() returns as soon as the request is sent and
    ckptd's copy runs during the next forward and backward: see __init__.
    A save that fails after save() returned raises at the next save(),
    wait() or close().
    """

    _FALLBACK = "the torch.save fallback"

    def __init__(self, job: str, rank: Optional[int] = None, world_size: Optional[int] = None,
                 socket: Optional[str] = None, attempt_id: Optional[str] = None, policy: Optional[str] = None,
                 fallback_dir: Optional[str] = None, *, alone: bool = False, overlap: bool = False,
                 exist_ok: bool = False, compress: Optional[bool] = None,
                 incremental: Optional[bool] = None, storage: Optional[str] = None) -> None:
        """Connect to ckptd as one rank of job.

        job: the checkpoint's name, 1-128 characters of [A-Za-z0-9._-].
        socket: ckptd's Unix socket; default $CKPTD_SOCKET, else
        /run/ckptd/ckptd.sock. rank and world_size come from the launcher
        (torch.distributed when initialized, else RANK/WORLD_SIZE); given by
        hand they must agree with it (resolve_rank). If ckptd is not
        running, raise ckpt.DaemonUnavailable (saying whether the socket
        exists and how to start or find ckptd), or with fallback_dir, fall
        back to torch.save/torch.load of one file per step there
        (synchronous: staged and durable complete together). alone: this
        process saves its steps by itself, as rank 0 of 1, whatever the
        launcher says (a state every rank holds alike, which rank 0 alone
        writes: Lightning's and Hugging Face's checkpoints). attempt_id,
        policy: the session's attempt id, the same on every rank of a launch
        and never another launch's (default: the launcher's, from
        TORCHELASTIC_* or SLURM_*, and a nonce of this launch, agreed
        through torch.distributed's store: ckpt/_attempt.py, docs/format.md
        "Attempts") and admission policy ("block", "skip", "coalesce";
        docs/tiers.md "Admission").

        overlap: False (the default): save() returns once the state is
        staged; the trainer may change its tensors at once. True: save()
        returns once the request is sent, and the caller must wait for
        fut.staged before it changes any saved tensor. An optimizer, a
        module, or a list of them: as True, and the library waits for
        staged itself before each change it can see: every optimizer's
        step() (a step pre-hook) and the train-mode forward of every
        normalization layer with running statistics in the modules (a
        forward pre-hook); load() and close() wait too. Any other in-place
        change to a saved tensor (an EMA update, clipping weights by hand,
        load_state_dict, an optimizer not handed over) must still wait for
        fut.staged.

        exist_ok: by default the first save() into a job that already has
        complete steps (in storage or in ckptd's memory) raises CkptError(EEXIST)
        unless this process loaded from the job first (load(), or a
        ckpt.dcp.Reader): a new run that reuses a job name fails at once,
        not when its first step reaches storage. exist_ok=True saves
        anyway (a step that exists still fails: steps are never
        overwritten; a complete one raises at once, on rank 0, as it would
        never be loaded). Checked on rank 0 only: one listing per job.

        compress: whether ckptd stores each save's shard compressed
        (lossless byte planes and zstd; docs/format.md "Pieces"): None (the
        default) as its configuration says for the job ([pool] or
        [job.NAME] compress), True or False. The torch.save fallback
        ignores it.

        incremental: whether pieces (a tensor's whole rows, at most [pool] piece_bytes, 4 MiB by default)
        unchanged since this rank's previous durable step are stored as
        references to it (docs/format.md "Pieces"), as compress: a frozen
        base or an embedding table's untouched rows are then stored once.

        storage: where this job's steps go ("file:///abs/path",
        "s3://bucket/prefix", "gs://bucket/prefix") when no ckptd runs on
        the node: without socket= or $CKPTD_SOCKET, and with nothing at
        the system socket (which always wins), local rank 0 starts this
        user's daemon for that storage from the wheel and the other ranks
        wait for it (ckpt._node; docs/python.md "A daemon started on
        demand"). Ignored when a daemon answers: it has its own storage."""
        _compress(compress)  # a ValueError now, not at the first save
        _setting(incremental, "incremental")
        rank, world_size, local_rank = (0, 1, 0) if alone else resolve_rank(rank, world_size)
        self._guard_rollback = not alone  # Lightning's and HF's steps: their own pointer says which to resume
        if attempt_id is None:
            attempt_id = _attempt.default(world_size, _attempt.torch_agree)
        self.job, self.rank, self.world_size = job, rank, world_size
        self.fallback_dir: Optional[str] = None
        self.exist_ok = exist_ok
        self.compress = compress
        self.incremental = incremental
        self._inflight: List[Any] = []  # SaveFutures whose failures are not yet reported (_check_saves)
        self._unstaged: List[Any] = []  # SaveFutures saved with overlap, maybe not staged yet
        self._hooks: List[Any] = []  # overlap's hook handles, removed by close()
        self._fresh_checked = False
        self._max_inflight = 4    # the daemon's max_inflight_saves (default), or what its refusal said
        self._last_save: Optional[SaveFuture] = None  # of the last save (persist waits for it)
        # Its parts: with ckptd, the device registrations, the host ones,
        # and the save plan made through them; without, the fallback.
        self._fallback: Optional[Fallback] = None
        self._cuda: Optional[CudaRegistrations] = None
        self._regs: Optional[Registrations] = None
        self._plans: Optional[SavePlans] = None
        self.client: Optional[Client]
        try:
            self.client = _node.connect(lambda path: Client(path, job=job, rank=rank, world_size=world_size,
                                                            local_rank=local_rank, attempt_id=attempt_id,
                                                            policy=policy), socket, storage, local_rank)
        except DaemonUnavailable:
            if fallback_dir is None:
                raise
            self.client = None
            self.fallback_dir = fallback_dir
            self._fallback = Fallback(fallback_dir, job, rank)
        else:
            self._cuda = CudaRegistrations(self.client)
            # A registration released may be named in the plan's table:
            # the plan goes first (Registrations.release).
            # Through a weak reference: the parts must not keep the
            # Checkpointer (and so its client's session and buffers) alive
            # in a cycle that only the cyclic GC would free.
            drop = weakref.WeakMethod(self._drop_plan)

            def drop_plan() -> None:
                m = drop()
                if m is not None:
                    m()
            self._regs = Registrations(self.client, self._cuda, drop_plan=drop_plan)
            self._plans = SavePlans(self.client, self._regs, self._cuda)
        self.overlap = self._watch(overlap)
        _raise_nofile()

    # ---- overlap: waiting for staged where the library can see a change ----

    def _watch(self, overlap):
        """Hook the optimizers and modules overlap names (see __init__);
        returns whether save() overlaps."""
        if overlap is None or overlap is False:
            return False
        if overlap is True:
            return True
        objs = list(overlap) if isinstance(overlap, (list, tuple, set)) else [overlap]
        for o in objs:
            if isinstance(o, torch.optim.Optimizer):
                self._hooks.append(o.register_step_pre_hook(self._await_staged))
            elif isinstance(o, torch.nn.Module):
                for m in o.modules():
                    if isinstance(m, _STAT_LAYERS) and m.track_running_stats:
                        self._hooks.append(m.register_forward_pre_hook(self._await_staged_train))
            else:
                raise TypeError(f"overlap={o!r}: want True, False, a torch.optim.Optimizer, a torch.nn.Module "
                                "or a list of them")
        return True

    def _await_staged(self, *_):
        """Wait until every overlapped save is staged (its tensors may then
        change). A staging failure is not raised here, in the middle of
        the trainer's optimizer step or forward, but at the next save(),
        wait() or close()."""
        pending, self._unstaged = self._unstaged, []
        if pending:
            concurrent.futures.wait([f.staged for f in pending])

    def _await_staged_train(self, module, _args):
        if module.training and self._unstaged:
            self._await_staged()

    # ---- failures after save() returned ----

    # ---- its parts ----

    def _drop_plan(self) -> None:
        if self._plans is not None:
            self._plans.drop()

    def _live(self) -> Tuple[Client, Registrations, SavePlans]:
        """The client, and the parts that work through it, of a Checkpointer
        connected to ckptd (save() and load() ask once they know it is;
        ckpt.dcp binds its tensors through them). CkptError EBADF when it
        is closed or saves to its fallback directory."""
        if self.client is None or self._regs is None or self._plans is None:
            raise CkptError(errno.EBADF, "this Checkpointer is not connected to ckptd (closed, or saving to "
                            "its fallback directory)")
        return self.client, self._regs, self._plans

    def _check_open(self) -> None:
        if self.client is None and self.fallback_dir is None:
            raise CkptError(errno.EBADF, "this Checkpointer is closed")

    # ---- save ----

    def prepare(self, state_dict: Mapping[str, Any]) -> None:
        """Do now what the first save of state_dict would: move its CPU
        tensors into shared memory, register them, and declare their table
        with the daemon. The next save of a state dict with the same
        tensors (model.state_dict() again, say) then costs what a later
        save costs. Optional: call it once the state dict is complete (after
        the first optimizer step, for optimizers that make their state
        lazily), or the first save makes a new plan anyway."""
        self._check_open()
        if self._plans is not None:
            self._plans.plan_for(state_dict)

    def save(self, state_dict: Mapping[str, Any], step: int, extra: Any = None, tier: str = "durable") -> SaveFuture:
        """Save state_dict (a tree of dicts, lists and tensors, with other
        values pickled) as step, with extra (any picklable value, back from
        load()). Returns a SaveFuture once ckptd has staged the tensors
        (unless overlap: then once the request is sent; see __init__);
        the upload goes on in the background: fut.durable, wait() or
        close() say when it is in storage. Raises first the failure of an
        earlier save nobody saw (CkptError naming its step), and
        CkptError(EEXIST) at the first save into a job with steps that
        this process did not load (exist_ok), and for a step that was
        complete when this process loaded an earlier one by number, or
        added steps with exist_ok (it
        would never be loaded: docs/python.md "A rollback saves only steps
        that will load"). tier (docs/tiers.md "Tiers"):
        "durable" uploads it; "memory" keeps it in this node's ckptd only
        (cheap: no storage request; restored from there after a trainer
        crash; persist() makes it durable); "replicated" also in peer
        daemons' memory."""
        self._check_open()
        if self.client is None:
            if tier != "durable":
                raise ValueError(f"tier {tier!r} needs ckptd; the torch.save fallback is durable only")
            assert self._fallback is not None  # open, without a client
            return SaveFuture(self._fallback.save(state_dict, step, extra), step)
        self._check_saves()
        if not self._fresh_checked:
            self._check_fresh()
        self._check_not_newer(step)
        fut = self._submit(lambda: self._save(state_dict, step, extra, tier), bool(self.overlap))
        if self.overlap:
            self._unstaged.append(fut)
        return fut

    def _save(self, state_dict: Mapping[str, Any], step: int, extra: Any, tier: str) -> SaveFuture:
        client, regs, plans = self._live()
        p, tensors, leaves, fresh = plans.plan_for(state_dict)
        blob = pickle.dumps({"skeleton": p.skeleton, "leaves": leaves, "extra": extra},
                            protocol=pickle.HIGHEST_PROTOCOL)
        if p.cuda:
            named, specs = plans.cuda_specs(p, tensors, fresh)
            regs.copy_in(named, specs)
            return self._track(SaveFuture(client.save(step, specs, blob, cuda_stream=cuda_stream(tensors),
                                                      tier=tier, compress=self.compress,
                                                      incremental=self.incremental), step))
        plans.copy_scratch(p, tensors)
        if p.table is not None:
            return self._track(SaveFuture(client.save_table(step, p.table, blob, tier=tier, compress=self.compress,
                                                            incremental=self.incremental), step))
        return self._track(SaveFuture(client.save(step, p.specs, blob, tier=tier, compress=self.compress,
                                                  incremental=self.incremental), step))

    def _resolve_step(self, step, pin=False, first=None):
        """The one step every rank loads. "latest" is the newer of two: the
        latest step in storage, resolved once by the daemon (pinned:
        catalog.h) and, when torch.distributed is initialized, on rank 0
        alone and broadcast; and the newest step that every rank's own
        daemon holds in memory only for it (docs/tiers.md "Tiers": each rank asks
        its daemon, without storage, and the ranks gather the answers over
        torch.distributed; a world of one asks alone; ranks without a
        process group take storage's), so a memory-only step restores when
        every rank has it and no two ranks can restore different steps; a
        failure raises on every rank. A
        named step is taken as it is, or with pin=True resolved the same
        way (checked complete and pinned before any rank reads it). first(step),
        if given, runs on rank 0 before the broadcast (its errors are left
        to the other ranks' own calls)."""
        _resumed.add((self.client.socket, self.job))  # loading: saves continue the job
        latest = step in ("latest", LATEST)
        self._note_load(None if latest else int(step))
        if not latest and not pin:
            return int(step)
        want = LATEST if latest else int(step)
        held = self._held_steps()
        dist = torch.distributed
        # Whether every rank holds the step decided in memory only (the
        # same answer on every rank): ckpt.dcp then gathers its metadata
        # from the ranks, as no node's daemon holds every rank's manifest.
        self._in_every_memory = False
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            # Alone, its own copies decide; ranks without a process group
            # cannot agree on memory steps, so they take storage's.
            return self._decide(want, set(held) if self.world_size == 1 else set())
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, (held, self.client.attempt_id))
        _attempt.check_agreed([a for _, a in every], self.job)
        every = [h for h, _ in every]
        common = set(every[0]).intersection(*map(set, every[1:]))
        box = [None]
        if dist.get_rank() == 0:
            try:
                box[0] = ("ok", self._decide(want, common))
            except Exception as e:  # every rank must hear of it
                box[0] = ("err", getattr(e, "errno", None) or 5, str(e))
            if first is not None and box[0][0] == "ok":
                try:
                    first(box[0][1])
                except Exception:
                    pass
        dist.broadcast_object_list(box, src=0)
        if box[0][0] == "err":
            from .client import CkptError
            what = "the latest step" if latest else f"step {want}"
            raise CkptError(box[0][1], f"rank 0 could not decide {what}: {box[0][2]}")
        self._in_every_memory = box[0][1] in common
        return box[0][1]

    def load(self, state_dict: MutableMapping[str, Any], step: Union[int, str] = "latest") -> Tuple[int, Any]:
        """Load step (or the latest complete one) into state_dict, in place.
        Returns (step, extra). Tensors the dict lacks are created; non-tensor
        values and the nesting come from the checkpoint. self.last_load is
        then the load's result (ckpt.client.LoadFuture): its "source" and
        "peer" say where the bytes came from ("peer" and the peer's name
        for a copy a replacement node brought back from a peer, though
        the show that load runs first fetched it)."""
        self._check_open()
        if self.client is None:
            assert self._fallback is not None  # open, without a client
            return self._fallback.load(state_dict, step)
        # This Checkpointer's saves first: an overlapped one may still read
        # these tensors, and "latest" includes the steps it just saved.
        self._await_staged()
        concurrent.futures.wait([x for f in self._inflight for x in _phases(f)])
        _resumed.add((self.client.socket, self.job))
        number = self._resolve_step(step)
        if step in ("latest", LATEST):
            self._note_load(number, latest=True)
        # This rank's manifest only (rank 0's past the saved world size):
        # one manifest read, not world_size of them.
        _, mine = self.client.show(self.job, number, rank=self.rank)
        by_name: Dict[str, Dict[str, Any]] = {}
        for row in mine:
            by_name.setdefault(row["name"], row)
        present: List[Any] = []
        names: Set[str] = set()
        flatten(state_dict, [], present, names)
        have: Dict[str, Any] = dict(present)
        targets = []
        for name, info in by_name.items():
            t = have.get(name)
            want_dtype = TORCH_DTYPES[info["dtype"]]
            if t is None:
                t = torch.empty(info["lengths"], dtype=want_dtype)
            elif tuple(t.shape) != tuple(info["lengths"]) or t.dtype != want_dtype:
                raise ValueError(f"tensor '{name}' of step {number} of job '{self.job}' was saved as "
                                 f"{want_dtype} {list(info['lengths'])}, but the state dict's is {t.dtype} "
                                 f"{list(t.shape)}: load into a state dict of the saved model's shape (or "
                                 "without that key, to get a new tensor)")
            targets.append((name, t))
        _, regs, _ = self._live()
        specs = regs.bind(targets)
        for s, (name, _) in zip(specs, targets):
            info = by_name[name]
            s.offsets, s.lengths = info["offsets"], info["lengths"]
            s.shape = info["shape"]
        res = self.client.load(specs, number).result()
        regs.copy_out(targets, specs)
        self.last_load = res
        tree, extra = load_meta(res["extra"])
        made = dict(targets)
        if tree is not None:
            _merge(state_dict, tree, made)
        return res["step"], extra

    # ---- lifetime ----

    def close(self, wait: bool = True) -> None:
        """Wait until every save is safe at its tier (wait()), then
        disconnect; raise the first failure nobody saw, after
        disconnecting. wait=False disconnects at once: ckptd still
        finishes the staged saves, but their failures are not reported
        here. Tensors stay in (their own) shared memory."""
        err = None
        if self.client is not None:
            try:
                if wait:
                    self.wait()
                else:
                    self._await_staged()
            except CkptError as e:
                err = e
        for h in self._hooks:
            h.remove()
        self._hooks, self._unstaged, self._inflight = [], [], []
        self._close()
        if err is not None:
            raise err

    def _close(self) -> None:
        self._drop_plan()
        if self._regs is not None:
            self._regs.clear()
        self._plans = self._regs = self._cuda = None
        self.fallback_dir = None
        self._fallback = None
        if self.client is not None:
            self.client.close()
            self.client = None

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, etype: Any, *exc: Any) -> None:
        # Leaving on an exception: do not wait, nor hide it behind another.
        self.close(wait=etype is None)


def _merge(dst, tree, made):
    """Put the checkpoint's tree into dst: tensors from made (loaded in
    place or new), other values as saved."""
    if isinstance(tree, dict) and isinstance(dst, dict):
        for k, v in tree.items():
            if isinstance(v, _Ref):
                cur = dst.get(k)
                if cur is not made[v.name]:
                    dst[k] = made[v.name]
            elif isinstance(v, (dict, list)) and isinstance(dst.get(k), type(v)):
                _merge(dst[k], v, made)
            else:
                dst[k] = _materialize(v, made)
        return
    if isinstance(tree, list) and isinstance(dst, list):
        for i, v in enumerate(tree):
            if i >= len(dst):
                dst.append(_materialize(v, made))
            elif isinstance(v, _Ref):
                if dst[i] is not made[v.name]:
                    dst[i] = made[v.name]
            elif isinstance(v, (dict, list)) and isinstance(dst[i], type(v)):
                _merge(dst[i], v, made)
            else:
                dst[i] = _materialize(v, made)

