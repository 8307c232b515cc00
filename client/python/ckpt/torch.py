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
_arena_move), else each into its own (``share_memory_()``). Later saves copy nothing in
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
import gc
import mmap
import operator
import os
import pickle
import re
from typing import Any, Dict, List, Mapping, MutableMapping, Optional, Set, Tuple, Union

import torch

from ._fallback import Fallback
from ._tree import DTYPE_CODES, TORCH_DTYPES, _Leaf, _materialize, _Ref, dump_skeleton, load_meta  # noqa: F401
from .client import (LATEST, CkptError, Client, DaemonUnavailable, Superseded, TensorSpec, cuda_allocation,
                     cuda_identity)

def cuda_stream(tensors):
    """The stream a save of tensors names for its CUDA ones (an int, or
    None without any): the current stream of their device, the one the
    trainer wrote them on. The daemon's copies wait for the work queued on
    it; the legacy default stream would not order a non-blocking stream's
    writes."""
    dev = next((t.device for t in tensors if t.is_cuda), None)
    return torch.cuda.current_stream(dev).cuda_stream if dev is not None else None


def _cuda_identity_or_none(key):
    """ckpt_cuda_identity of a registration's range, or None when it is no
    longer mapped device memory (then nothing matches it)."""
    try:
        return cuda_identity(*key)
    except CkptError:
        return None


# A CkptError with one of these means the daemon is gone, not that one
# request was refused: raised, never worked around.
_CONNECTION_ERRNOS = frozenset((errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.EBADF, errno.ECONNREFUSED,
                                errno.ENOENT, errno.ECANCELED))

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


def _flatten(obj, path, tensors, names, leaves=None):
    """Replace tensors by _Ref in a copy of the tree; collect them. With
    leaves, other values are replaced by _Leaf and collected there too
    (a skeleton: _tree.dump_skeleton)."""
    if isinstance(obj, torch.Tensor):
        name = "/".join(path) or "tensor"
        base, k = name, 1
        while name in names:
            k += 1
            name = f"{base}#{k}"
        names.add(name)
        if obj.dtype not in DTYPE_CODES:
            raise TypeError(f"tensor '{name}': dtype {obj.dtype} is not supported by ckptd "
                            f"(supported: {', '.join(str(d) for d in DTYPE_CODES)})")
        tensors.append((name, obj))
        return _Ref(name, DTYPE_CODES[obj.dtype], obj.shape)
    if isinstance(obj, dict):
        return {k: _flatten(v, path + [str(k)], tensors, names, leaves) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        seq = [_flatten(v, path + [str(i)], tensors, names, leaves) for i, v in enumerate(obj)]
        return seq if isinstance(obj, list) else tuple(seq)
    if leaves is not None:
        leaves.append(obj)
        return _Leaf(len(leaves) - 1)
    return obj


def _scan(root):
    """One walk of a state dict, in _flatten's order and with its notion of
    a tensor, a container and a leaf: (tensors, other leaves, signature).
    The signature fixes the tree's shape: each container's type, keys and
    where it starts, and where each other leaf sits among the tensors. Two
    state dicts with equal signatures flatten to the same names and the
    same skeleton; only their tensors and leaf values can differ. About
    0.1 us per tensor: it runs on every save (tests/bench/py_tensors.py)."""
    tensors, others, sig = [], [], []
    t_add, o_add, s_add = tensors.append, others.append, sig.append
    Tensor, Parameter = torch.Tensor, torch.nn.Parameter

    def walk(obj):
        tp = type(obj)
        if tp is Tensor or tp is Parameter or isinstance(obj, Tensor):
            t_add(obj)
        elif isinstance(obj, dict):
            keys = tuple(obj)
            s_add((tp, keys, tuple(map(type, keys)), len(tensors), len(others)))
            for v in obj.values():
                tv = type(v)
                if tv is Tensor or tv is Parameter:
                    t_add(v)
                else:
                    walk(v)
        elif isinstance(obj, (list, tuple)):
            s_add((tp, len(obj), len(tensors), len(others)))
            for v in obj:
                tv = type(v)
                if tv is Tensor or tv is Parameter:
                    t_add(v)
                else:
                    walk(v)
        else:
            s_add(len(tensors))
            o_add(obj)
    walk(root)
    return tensors, others, sig


_data_ptr, _size, _contig = torch.Tensor.data_ptr, torch.Tensor.size, torch.Tensor.is_contiguous
_dtype = operator.attrgetter("dtype")


def _fingerprint(ts):
    """What a registration and a table depend on, per tensor: where its
    bytes are, its shape, dtype and contiguity. Equal fingerprints of
    tensors whose storages the plan holds mean the same bytes in the same
    registered buffers (no other storage can have the address meanwhile)."""
    return (list(map(_data_ptr, ts)), list(map(_size, ts)), list(map(_dtype, ts)), list(map(_contig, ts)))


# Storages moved in place into one shared-memory file per plan (_arena_move)
# need UntypedStorage._swap_data_ptr_ (torch 2.15 and later); without it,
# each storage is shared on its own (share_memory_()).
_CAN_SWAP = hasattr(torch.UntypedStorage, "_swap_data_ptr_") and hasattr(os, "memfd_create")


class _Arena:
    """One shared-memory file holding storages, registered once: buf, and
    how many of the storages a plan still names."""
    __slots__ = ("buf", "n")

    def __init__(self, buf, n):
        self.buf, self.n = buf, n


class _Slot:
    """A storage in an arena: the storage (held, so that its address stays
    its own), its StorageImpl (to tell it from another at the address),
    the arena and its offset there."""
    __slots__ = ("st", "cdata", "arena", "off")

    def __init__(self, st, cdata, arena, off):
        self.st, self.cdata, self.arena, self.off = st, cdata, arena, off


class _Plan:
    """What a save of one state dict's shape reuses while its tensors stay
    where they are: the names and skeleton, the specs and registrations
    (holding the CPU storages, so no other tensor can take their
    addresses), and the daemon's tensor table (None for CUDA tensors, and
    from a daemon without tables). cuda_regs: the CUDA registrations the
    specs name, {key: (Buffer, identity)}; the caching allocator can free
    and remake a segment under a kept plan, so they are checked again at
    every save (Checkpointer._cuda_plan_holds)."""
    __slots__ = ("sig", "fp", "skeleton", "named", "specs", "table", "storages", "scratch", "cuda", "cuda_regs")

    def drop(self):
        if self.table is not None:
            try:
                self.table.free()
            except Exception:
                pass
            self.table = None


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

# Layers whose train-mode forward changes saved tensors in place (running
# statistics): with overlap=model, their forward waits for staged.
_STAT_LAYERS = (torch.nn.modules.batchnorm._NormBase,)


class Checkpointer:
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

    def __init__(self, job: str, rank: Optional[int] = None, world_size: Optional[int] = None,
                 socket: Optional[str] = None, attempt_id: Optional[str] = None, policy: Optional[str] = None,
                 fallback_dir: Optional[str] = None, *, alone: bool = False, overlap: bool = False,
                 exist_ok: bool = False) -> None:
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
        policy: the session's attempt id (default from TORCHELASTIC_*) and
        admission policy ("block", "skip", "coalesce"; docs/tiers.md "Admission").

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
        overwritten). Checked on rank 0 only: one listing per job."""
        rank, world_size, local_rank = (0, 1, 0) if alone else resolve_rank(rank, world_size)
        self.job, self.rank, self.world_size = job, rank, world_size
        self.fallback_dir: Optional[str] = None
        self.exist_ok = exist_ok
        self._inflight: List[Any] = []  # SaveFutures whose failures are not yet reported (_check_saves)
        self._unstaged: List[Any] = []  # SaveFutures saved with overlap, maybe not staged yet
        self._hooks: List[Any] = []  # overlap's hook handles, removed by close()
        self._fresh_checked = False
        self._max_inflight = 4    # the daemon's max_inflight_saves (default), or what its refusal said
        self.client: Optional[Client]
        self._fallback: Optional[Fallback] = None  # without ckptd: torch.save files
        try:
            self.client = Client(socket, job=job, rank=rank, world_size=world_size, local_rank=local_rank,
                                 attempt_id=attempt_id, policy=policy)
        except DaemonUnavailable:
            if fallback_dir is None:
                raise
            self.client = None
            self.fallback_dir = fallback_dir
            self._fallback = Fallback(fallback_dir, job, rank)
        # shared storage data_ptr -> (its registered Buffer, the file's inode)
        self._shared: Dict[int, Any] = {}
        # storage data_ptr -> _Slot, for storages moved into an arena (_bind)
        self._arena: Dict[int, Any] = {}
        self._no_arena = False    # _arena_move failed once: share_memory_() only
        self._scratch: Dict[str, Any] = {}  # name -> Buffer for copied tensors
        self._cuda = None         # None: not tried; True: registering device memory works; False: copy
        self._cuda_regs: Dict[Any, Any] = {}  # device registrations: (start, nbytes) -> (Buffer, identity)
        self._cuda_where: Dict[Any, Any] = {}  # (storage data_ptr, nbytes) -> (its registration's key, offset in it)
        self._cuda_warned: Set[int] = set()  # errnos of refused CUDA registrations already warned about
        self._plan = None         # _Plan of the last save
        self._last_save = None    # SaveFuture of the last save (persist waits for it)
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

    def _check_fresh(self):
        """The first save into a job with steps, by a process that did not
        load from it, raises (exist_ok; rank 0 asks the daemon once it
        answered: a refusal, or a listing that failed, asks again at the
        next save)."""
        if self.exist_ok or self.rank != 0 or (self.client.socket, self.job) in _resumed:
            self._fresh_checked = True
            return
        try:
            # Complete steps only: every rank's save of a step is in it, rank
            # 0's too, so none is this run's (the other ranks' first saves
            # may be listed already, incomplete).
            steps = sorted({s["step"] for s in self.client.list(self.job) if s["job"] == self.job and s["complete"]})
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

    # ---- registration ----

    def _drop_plan(self):
        if self._plan is not None:
            self._plan.drop()
            self._plan = None

    def _arena_move(self, storages):
        """Move storages (a dict: key -> UntypedStorage, in the table's
        order) into one new shared-memory file, each at the offset the
        daemon's shard layout gives it (64-byte aligned, in order), in place:
        every alias sees it, as with share_memory_(), but the daemon maps one
        file, not one per storage, and copies neighbouring tensors as one
        run (10,000 files cost it about 1 us each per save). Registered
        once. Returns {key: _Slot} under the storages' new addresses."""
        slots, off = [], 0
        for st in storages.values():
            off = (off + 63) & ~63
            slots.append(off)
            off += st.nbytes()
        total = max(off, 64)
        fd = os.memfd_create("ckpt-arena", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, total)
            mm = mmap.mmap(fd, total)
            view = memoryview(mm)
            moved = []
            for st, at in zip(storages.values(), slots):
                nb = st.nbytes()
                dst = torch.frombuffer(view[at:at + nb], dtype=torch.uint8)
                dst.copy_(torch.empty(0, dtype=torch.uint8).set_(st, 0, (nb,), (1,)))
                # The storage takes the arena's bytes; its old ones go with dst.
                st._swap_data_ptr_(dst.untyped_storage())
                moved.append(st)
            del dst
            [buf] = self.client.register_fds([fd], [total])
        finally:
            os.close(fd)
        arena = _Arena(buf, len(moved))
        return {st.data_ptr(): _Slot(st, st._cdata, arena, at) for st, at in zip(moved, slots)}

    def _bind(self, tensors, plan=False):
        """A TensorSpec per tensor. Contiguous CPU tensors are registered
        zero-copy: their storage is moved into shared memory in place
        (once; every alias, parameters included, sees it): with plan, into
        one file for them all (_arena_move), else each on its own
        (``share_memory_()``), its fd registered once per storage. Others
        get a registered scratch buffer, filled by _copy_in. Registrations
        not among tensors are dropped; when one goes or is replaced, so
        does the plan, unless plan (the plan is being made from these
        tensors)."""
        specs, used = [], set()
        # Device registrations are kept from one bind to the next while the
        # memory behind them is the same allocation (_cuda_buffer): those
        # this bind does not take again are freed after its own are made,
        # so a segment both name stays open in the daemon.
        prev_cuda, self._cuda_regs = self._cuda_regs, {}
        # Storages to register, in one batch after the walk (one round trip
        # per 128: ckpt_buffer_register_fds): key -> [fd, size, ino, specs].
        todo = {}
        # With a plan, storages not in an arena yet go into a new one
        # (_arena_move): key -> storage, and the specs waiting for it.
        to_arena, arena_specs = {}, {}
        arena_ok = plan and _CAN_SWAP and not self._no_arena
        try:
            for name, t in tensors:
                code = DTYPE_CODES[t.dtype]
                nbytes = t.numel() * t.element_size()
                if t.device.type == "cuda" and t.is_contiguous() and nbytes and self._cuda is not False:
                    got = self._cuda_buffer(t, prev_cuda)
                    if got is not None:
                        buf, base = got
                        off = base + t.storage_offset() * t.element_size()
                        specs.append(TensorSpec(name, code, t.shape, buf, off, nbytes))
                        continue
                if t.device.type == "cpu" and t.is_contiguous() and nbytes:
                    st = t.untyped_storage()
                    key = st.data_ptr()
                    slot = self._arena.get(key)
                    if slot is not None and slot.cdata == st._cdata:
                        used.add(key)
                        specs.append(TensorSpec(name, code, t.shape, slot.arena.buf,
                                                slot.off + t.storage_offset() * t.element_size(), nbytes))
                        continue
                    if arena_ok:
                        spec = TensorSpec(name, code, t.shape, None, t.storage_offset() * t.element_size(), nbytes)
                        specs.append(spec)
                        if key not in to_arena:
                            to_arena[key] = st
                            arena_specs[key] = []
                        arena_specs[key].append(spec)
                        continue
                    # In place (every alias sees it); the fd names the file.
                    fd, size = st._share_fd_cpu_()[:2]
                    key = st.data_ptr()
                    ino = os.fstat(fd).st_ino
                    cached = self._shared.get(key)
                    used.add(key)
                    spec = TensorSpec(name, code, t.shape, None, t.storage_offset() * t.element_size(), nbytes)
                    specs.append(spec)
                    # A freed storage's address can be reused by a new one:
                    # the cache is valid only for the same file.
                    if key in todo:
                        todo[key][3].append(spec)
                    elif cached is None or cached[1] != ino or cached[0].size != size:
                        if cached is not None:
                            self._release(self._shared.pop(key)[0], plan)
                        todo[key] = [fd, size, ino, [spec]]
                    else:
                        spec.buffer = cached[0]
                else:
                    buf = self._scratch_buffer(name, nbytes, plan)
                    specs.append(TensorSpec(name, code, t.shape, buf, 0, nbytes))
        except BaseException:
            # Kept for the next bind (freed then if not taken again).
            self._cuda_regs.update(prev_cuda)
            raise
        if to_arena:
            try:
                placed = self._arena_move(to_arena)
            except RuntimeError:
                # This torch would not swap a storage's bytes: each storage
                # is shared on its own from now on (those moved already
                # are whole where they are, and move again).
                self._no_arena = True
                self._cuda_regs.update(prev_cuda)
                return self._bind(tensors, plan)
            for (old, _), (key, slot) in zip(to_arena.items(), placed.items()):
                self._arena[key] = slot
                used.add(key)
                for spec in arena_specs[old]:
                    spec.buffer = slot.arena.buf
                    spec.offset += slot.off
        for buf, _ in prev_cuda.values():
            buf.free()  # saves in flight keep the daemon's own reference
        if todo:
            items = list(todo.items())
            bufs = self.client.register_fds([v[0] for _, v in items], [v[1] for _, v in items])
            for (key, (_, _, ino, waiting)), buf in zip(items, bufs):
                self._shared[key] = (buf, ino)
                for spec in waiting:
                    spec.buffer = buf
        # Storages no longer in the state dict: unregister (saves in
        # flight keep the daemon's own reference).
        for key in [k for k in self._shared if k not in used]:
            self._release(self._shared.pop(key)[0], plan)
        for key in [k for k in self._arena if k not in used]:
            arena = self._arena.pop(key).arena
            arena.n -= 1
            if arena.n == 0:
                self._release(arena.buf, plan)
        return specs

    def _release(self, buf, plan):
        """Unregister buf; a plan made from other tensors may name it in its
        table, which the daemon would not let go of it: the plan goes first
        (when this bind is not making one; _make_plan dropped the old)."""
        if not plan:
            self._drop_plan()
        buf.free()

    def _cuda_buffer(self, t, prev):
        """(Buffer, offset of the tensor's storage in it) for a CUDA tensor:
        a registration with the daemon (C API: legacy IPC or VMM fds) of
        the whole cudaMalloc allocation holding the storage (one for every
        tensor of a caching-allocator segment: a model of 50,000 tensors
        stays far under max_buffers), or of the storage's own range for
        VMM memory (expandable segments map one allocation per page).
        Taken from the last bind (prev: key -> (Buffer, identity)) if the
        memory behind it is still the same allocation: ckpt_cuda_identity,
        which changes when the caching allocator frees a segment and makes
        another at the same address. So a later save of the same tensors
        costs no registration, and the daemon keeps its mappings open. None
        when CUDA is off here or in the daemon, or the daemon refuses this
        tensor: then it is copied."""
        st = t.untyped_storage()
        where = (st.data_ptr(), st.nbytes())
        # A later save: where this storage lay last time, and that
        # allocation's registration if it still holds (one identity check
        # per allocation, not per tensor). Else where it lies now.
        got = self._cuda_where.get(where)
        if got is None or not self._cuda_taken(got[0], prev):
            got = self._cuda_locate(where)
        key, base = got
        if self._cuda_taken(key, prev):
            return self._cuda_regs[key][0], base
        ident = _cuda_identity_or_none(key)
        try:
            buf = self.client.register_cuda(*key)
        except CkptError as e:
            if e.errno in _CONNECTION_ERRNOS:
                raise
            # The fast path is refused, the save is not: this tensor is
            # copied (D2H here, then as host memory). Said once per reason.
            # CUDA off here or in the daemon, a device the daemon lacks, or
            # a handle it cannot open (legacy IPC without a shared PID
            # namespace) would refuse every tensor: not tried again. A
            # range the daemon cannot take in one registration (VMM memory
            # over max_fds_per_frame pages, a fabric-handle allocation)
            # refuses this tensor only.
            if e.errno in (errno.ENOTSUP, errno.ENODEV, errno.EIO):
                self._cuda = False
            if e.errno != errno.ENOTSUP and e.errno not in self._cuda_warned:
                self._cuda_warned.add(e.errno)
                import warnings
                warnings.warn(f"ckpt: CUDA tensor {tuple(t.shape)} not registered with ckptd ({e}); "
                              f"copying {'every CUDA tensor' if self._cuda is False else 'such tensors'} "
                              "through host memory instead (slower)", RuntimeWarning, stacklevel=4)
            return None
        self._cuda = True
        # Without an identity the registration is not kept past this bind.
        self._cuda_regs[key] = (buf, ident if ident is not None else object())
        return buf, base

    def _cuda_locate(self, where):
        """(registration key, offset in it) for a storage (data_ptr,
        nbytes): its whole allocation for cudaMalloc memory, else its own
        range; remembered for the next bind."""
        ptr, n = where
        try:
            start, size, legacy = cuda_allocation(ptr)
            key = (start, size) if legacy else where
        except CkptError:
            key = where  # the registration says why, if it fails
        if len(self._cuda_where) > 4 * len(self._cuda_regs) + 4096:
            self._cuda_where.clear()  # storages long gone
        got = self._cuda_where[where] = (key, ptr - key[0])
        return got

    def _cuda_taken(self, key, prev):
        """Whether this bind has a registration for key: made already, or
        the last bind's (prev) taken again because ckpt_cuda_identity says
        the memory is still the same allocation. A stale one stays in prev,
        freed after this bind's own are made."""
        if key in self._cuda_regs:
            return True
        have = prev.pop(key, None)
        if have is None:
            return False
        if have[1] == _cuda_identity_or_none(key):
            self._cuda_regs[key] = have
            return True
        prev[(key, "stale")] = have
        return False

    def _cuda_plan_holds(self, p):
        """Whether a kept plan's CUDA registrations are still this
        Checkpointer's (no bind, a load's, dropped them) and still of the
        same allocations: one ckpt_cuda_identity per allocation, not one
        lookup per tensor (the plan's fingerprint already said that every
        tensor is where it was)."""
        for key, (buf, ident) in p.cuda_regs.items():
            now = self._cuda_regs.get(key)
            if now is None or now[0] is not buf or _cuda_identity_or_none(key) != ident:
                return False
        return True

    def _scratch_buffer(self, name, nbytes, plan=False):
        have = self._scratch.get(name)
        if have is None or have.size < max(nbytes, 1):
            if have is not None:
                self._release(have, plan)
            have = self.client.alloc(max(nbytes, 64))
            self._scratch[name] = have
        return have

    def _check_open(self):
        if self.client is None and self.fallback_dir is None:
            from .client import CkptError
            import errno
            raise CkptError(errno.EBADF, "this Checkpointer is closed")

    def _copy_in(self, tensors, specs):
        """Tensors not bound (non-contiguous, CUDA) are copied to scratch."""
        for (name, t), s in zip(tensors, specs):
            if s.buffer is self._scratch.get(name) and s.nbytes:
                dst = torch.frombuffer(s.buffer.view, dtype=torch.uint8, count=s.nbytes)
                dst.view(t.dtype).view(t.shape).copy_(t)

    def _copy_out(self, tensors, specs):
        for (name, t), s in zip(tensors, specs):
            if s.buffer is self._scratch.get(name) and s.nbytes:
                src = torch.frombuffer(s.buffer.view, dtype=torch.uint8, count=s.nbytes)
                with torch.no_grad():
                    t.copy_(src.view(t.dtype).view(t.shape))

    # ---- save ----

    def _make_plan(self, state_dict, sig):
        """Flatten, bind (share, register) and declare the table: what the
        first save of a state dict's shape pays, and prepare() ahead of it."""
        self._drop_plan()
        named, names, leaves = [], set(), []
        tree = _flatten(state_dict, [], named, names, leaves)
        p = _Plan()
        p.sig, p.named, p.table = sig, named, None
        p.skeleton = dump_skeleton(tree)
        p.specs = self._bind(named, plan=True)
        p.cuda_regs = dict(self._cuda_regs)
        ts = [t for _, t in named]
        # After _bind: sharing moved storages, and with them data_ptr.
        p.fp = _fingerprint(ts)
        p.cuda = any(t.is_cuda for t in ts)
        p.storages = [t.untyped_storage() for t in ts if not t.is_cuda]
        p.scratch = [i for i, ((name, _), s) in enumerate(zip(named, p.specs)) if s.buffer is self._scratch.get(name)]
        if not p.cuda:
            try:
                p.table = self.client.table(p.specs)
            except CkptError as e:
                if e.errno != errno.ENOTSUP:
                    raise
                # An older daemon: each save sends the specs.
        self._plan = p
        return p

    def _plan_for(self, state_dict):
        """The plan for state_dict, its tensors and leaves now, and whether
        the plan is new: the last one while the tree's shape and its
        tensors' places are unchanged."""
        # The walk allocates a few objects per tensor: with the collector
        # on, a trainer's heap made it sweep every few saves (tens of ms).
        gc_was = gc.isenabled()
        gc.disable()
        try:
            tensors, others, sig = _scan(state_dict)
            p = self._plan
            same = p is not None and p.sig == sig and p.fp == _fingerprint(tensors)
        finally:
            if gc_was:
                gc.enable()
        if same:
            return p, tensors, others, False
        return self._make_plan(state_dict, sig), tensors, others, True

    def prepare(self, state_dict: Mapping[str, Any]) -> None:
        """Do now what the first save of state_dict would: move its CPU
        tensors into shared memory, register them, and declare their table
        with the daemon. The next save of a state dict with the same
        tensors (model.state_dict() again, say) then costs what a later
        save costs. Optional: call it once the state dict is complete (after
        the first optimizer step, for optimizers that make their state
        lazily), or the first save makes a new plan anyway."""
        self._check_open()
        if self.client is not None:
            self._plan_for(state_dict)

    def save(self, state_dict: Mapping[str, Any], step: int, extra: Any = None, tier: str = "durable") -> SaveFuture:
        """Save state_dict (a tree of dicts, lists and tensors, with other
        values pickled) as step, with extra (any picklable value, back from
        load()). Returns a SaveFuture once ckptd has staged the tensors
        (unless overlap: then once the request is sent; see __init__);
        the upload goes on in the background: fut.durable, wait() or
        close() say when it is in storage. Raises first the failure of an
        earlier save nobody saw (CkptError naming its step), and
        CkptError(EEXIST) at the first save into a job with steps that
        this process did not load (exist_ok). tier (docs/tiers.md "Tiers"):
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
        while True:
            self._make_room()
            fut = self._save(state_dict, step, extra, tier)
            self._inflight.append(fut)
            if self.overlap:
                self._unstaged.append(fut)
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

    def _save(self, state_dict, step, extra, tier):
        p, tensors, leaves, fresh = self._plan_for(state_dict)
        blob = pickle.dumps({"skeleton": p.skeleton, "leaves": leaves, "extra": extra},
                            protocol=pickle.HIGHEST_PROTOCOL)
        if p.cuda:
            # Device registrations are checked at every save (the caching
            # allocator reuses addresses): a kept plan whose registrations
            # no longer hold binds again.
            named = [(name, t) for (name, _), t in zip(p.named, tensors)]
            if not fresh and not self._cuda_plan_holds(p):
                p.specs = self._bind(named, plan=True)
                p.cuda_regs = dict(self._cuda_regs)
            specs = p.specs
            self._copy_in(named, specs)
            return self._track(SaveFuture(self.client.save(step, specs, blob, cuda_stream=cuda_stream(tensors),
                                                           tier=tier), step))
        for i in p.scratch:
            s = p.specs[i]
            if s.nbytes:
                dst = torch.frombuffer(s.buffer.view, dtype=torch.uint8, count=s.nbytes)
                dst.view(tensors[i].dtype).view(tensors[i].shape).copy_(tensors[i])
        if p.table is not None:
            return self._track(SaveFuture(self.client.save_table(step, p.table, blob, tier=tier), step))
        return self._track(SaveFuture(self.client.save(step, p.specs, blob, tier=tier), step))

    def _track(self, fut):
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
            raise ValueError("persist() needs ckptd; the torch.save fallback is durable already")
        if last is not None and last.step == int(step):
            last.result()  # its copy must be kept before it can be persisted
        return SaveFuture(self.client.persist(int(step)), int(step))

    # ---- load ----

    def _held_steps(self):
        """The steps this node's daemon holds in memory only for this rank
        (at this world size): restorable here, unknown to storage. Durable
        copies are storage's to count (its latest needs every rank)."""
        try:
            return sorted({h["step"] for h in self.client.held()
                           if h["world_size"] == self.world_size and not h["durable"]})
        except Exception:
            return []  # an older daemon: storage only

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
        dist.all_gather_object(every, held)
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

    def load(self, state_dict: MutableMapping[str, Any], step: Union[int, str] = "latest") -> Tuple[int, Any]:
        """Load step (or the latest complete one) into state_dict, in place.
        Returns (step, extra). Tensors the dict lacks are created; non-tensor
        values and the nesting come from the checkpoint."""
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
        # This rank's manifest only (rank 0's past the saved world size):
        # one manifest read, not world_size of them.
        _, mine = self.client.show(self.job, number, rank=self.rank)
        by_name: Dict[str, Dict[str, Any]] = {}
        for row in mine:
            by_name.setdefault(row["name"], row)
        present: List[Any] = []
        names: Set[str] = set()
        _flatten(state_dict, [], present, names)
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
        specs = self._bind(targets)
        for s, (name, _) in zip(specs, targets):
            info = by_name[name]
            s.offsets, s.lengths = info["offsets"], info["lengths"]
            s.shape = info["shape"]
        res = self.client.load(specs, number).result()
        self._copy_out(targets, specs)
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

    def _close(self):
        self._drop_plan()
        self._shared = {}
        self._arena = {}
        self._scratch = {}
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

