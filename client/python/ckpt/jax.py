"""ckpt.jax: checkpoint pytrees of jax.Arrays through ckptd.

    cp = ckpt.jax.Checkpointer("mlp")
    fut = cp.save({"params": params, "opt": opt_state, "step": i}, i)   # returns once staged
    fut.durable.result()                              # in storage (or keep training)
    step, state = cp.restore()                        # the latest step, on the default device
    step, state = cp.restore(target=abstract_state)   # into target's shardings, dtypes checked

A pytree's arrays (jax.Array, and NumPy arrays, which come back as NumPy)
are the step's tensors, named by their key paths ("params/w", "opt/0/mu");
its other leaves (ints, strings, ...) and its structure (the PyTreeDef)
travel pickled in the step's extra state, so a restore without a target
gives back the tree as saved. Restore unpickles: restore only checkpoints
you trust.

Host arrays: np.asarray of a CPU jax.Array is its own buffer, without a
copy, but ckptd reads only memory it has a file descriptor for and XLA's
heap is not such memory, so a save copies each array once into a
shared-memory buffer registered with the daemon (kept from one save to the
next while the tree's layout is the same), which the daemon stages from.
jax.Arrays are immutable, so the trainer may go on at once; save() returns
once ckptd has staged its copy (as ckpt.torch), and the upload goes on in
the background. A restore loads into a new shared-memory mapping of its
own and hands NumPy views of it to jax.device_put: on CPU jax takes them
without a copy (the arrays keep the mapping alive), on an accelerator it
copies them to the device.

Device arrays: an array whose part in this process is one shard on a CUDA
device is registered through the C API's CUDA path
(jax.Array.unsafe_buffer_pointer() and ckpt_register_cuda) and copied by
the daemon D2H once the array is ready; when CUDA is off here or in the
daemon, or the runtime gives no pointer, it is copied to host first. Not
tested on a GPU yet (CI has none): the path is guarded, and any refusal
falls back to the host copy.

Sharding: each process saves, as rank jax.process_index() of
jax.process_count(), the box of every array its addressable shards hold
(replica 0 only: a replicated array is saved once), so the shards of one
process must tile one box (a ValueError says when they do not). restore()
reads, per addressable device of the target sharding, the box that device
holds (ckptd reshards between the saved boxes and the asked ones), so a
step restores onto another mesh or process count. NumPy leaves are saved
by every rank (each gets its own back). With several processes the step a
restore takes is decided by process 0 (from storage; steps held in
memory only restore in a world of one) and broadcast.

dtypes: float32, float16, bfloat16, float64, float8_e4m3fn, float8_e5m2,
int8-64, uint8, bool; uint16, uint32 and uint64 are stored as the signed
integers of their width (their bits unchanged; ckpt.format sees those) and
come back as saved. Typed PRNG keys: save jax.random.key_data(key).
"""
from __future__ import annotations

import concurrent.futures
import errno
import mmap
import os
import pickle
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import jax
import numpy as np

from . import _attempt, _node
from ._saving import SaveFuture, SaveTracking, _phases, _resumed
from .client import LATEST, Buffer, CkptError, Client, DaemonUnavailable, TensorSpec, cuda_allocation, cuda_identity

__all__ = ["Checkpointer", "DaemonUnavailable", "SaveFuture"]

# NumPy dtype name -> ckptd's dtype; unsigned ints wider than a byte are
# stored as the signed ones of their width.
DTYPE_CODES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int8": "i8",
               "uint8": "u8", "int16": "i16", "int32": "i32", "int64": "i64", "bool": "bool",
               "float8_e4m3fn": "f8e4m3", "float8_e5m2": "f8e5m2", "uint16": "i16", "uint32": "i32",
               "uint64": "i64"}

# The extra state of a ckpt.jax save: a pickled dict
#   {"format": FORMAT, "treedef": PyTreeDef, "leaves": [...]}
# with a leaf per tree leaf: ("array", name, dtype name, global shape,
# "jax" or "numpy"), or ("value", the leaf itself).
FORMAT = "ckpt.jax/1"
_ALIGN = 64  # every box's offset in a buffer: jax takes 64-byte aligned host memory without a copy


def _dtype(name: str) -> np.dtype:
    """The NumPy dtype of a saved dtype name (bfloat16 and float8 through
    jax's ml_dtypes)."""
    return np.dtype(jax.numpy.dtype(name))


def _name(path: Tuple[Any, ...], taken: set) -> str:
    """A leaf's tensor name: its key path joined by "/" ("tensor" for the
    root), "#2", "#3", ... added when two paths print alike."""
    name = jax.tree_util.keystr(path, simple=True, separator="/") or "tensor"
    base, k = name, 1
    while name in taken:
        k += 1
        name = f"{base}#{k}"
    taken.add(name)
    return name


def _is_array(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic))


def _box(index: Tuple[slice, ...], shape: Sequence[int]) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """(offsets, lengths) of a shard's index (a tuple of slices) in an
    array of shape."""
    starts, lens = [], []
    for sl, n in zip(index, shape):
        a, b, _ = sl.indices(n)
        starts.append(a)
        lens.append(b - a)
    return tuple(starts), tuple(lens)


class _Local:
    """One array's part in this process: the tensor name, dtype name,
    global shape, and its box (offsets, lengths), with the pieces that fill
    it: (offsets within the box, NumPy-able data); or a CUDA pointer."""
    __slots__ = ("name", "dtype", "shape", "offsets", "lengths", "pieces", "cuda_ptr")

    def __init__(self, name: str, dtype: str, shape: Tuple[int, ...], offsets: Tuple[int, ...],
                 lengths: Tuple[int, ...], pieces: List[Tuple[Tuple[int, ...], Any]]) -> None:
        self.name, self.dtype, self.shape = name, dtype, shape
        self.offsets, self.lengths, self.pieces = offsets, lengths, pieces
        self.cuda_ptr: Optional[int] = None

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.lengths, dtype=np.int64)) * _dtype(self.dtype).itemsize

    def key(self) -> Tuple[Any, ...]:
        return (self.name, self.dtype, self.shape, self.offsets, self.lengths)


def _local(name: str, leaf: Any) -> Optional[_Local]:
    """The part of array leaf this process saves, or None when another
    process holds its replica 0. ValueError when this process's shards do
    not tile one box."""
    dtype = np.dtype(leaf.dtype).name
    if dtype not in DTYPE_CODES:
        raise TypeError(f"array '{name}': dtype {leaf.dtype} is not supported by ckptd (supported: "
                        f"{', '.join(DTYPE_CODES)}; typed PRNG keys: save jax.random.key_data(key))")
    shape = tuple(int(n) for n in leaf.shape)
    if not isinstance(leaf, jax.Array):
        return _Local(name, dtype, shape, (0,) * len(shape), shape, [((0,) * len(shape), np.asarray(leaf))])
    shards = [s for s in leaf.addressable_shards if s.replica_id == 0]
    if not shards:
        return None
    boxes = [_box(s.index, shape) for s in shards]
    lo = tuple(min(b[0][d] for b in boxes) for d in range(len(shape)))
    hi = tuple(max(b[0][d] + b[1][d] for b in boxes) for d in range(len(shape)))
    lengths = tuple(h - s for s, h in zip(lo, hi))
    if sum(int(np.prod(b[1], dtype=np.int64)) for b in boxes) != int(np.prod(lengths, dtype=np.int64)):
        raise ValueError(f"array '{name}': the shards process {jax.process_index()} holds, "
                         f"{[b[0] for b in boxes]}, do not tile one box; ckpt.jax saves one box per process "
                         "(shard it so that each process's devices hold a contiguous block)")
    pieces = [(tuple(o - s for o, s in zip(b[0], lo)), sh.data) for b, sh in zip(boxes, shards)]
    return _Local(name, dtype, shape, lo, lengths, pieces)


def _flatten(tree: Any) -> Tuple[List[_Local], bytes]:
    """This process's parts of tree's arrays, and the step's extra state
    (the module's text says what it holds)."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    taken: set = set()
    parts: List[_Local] = []
    leaves: List[Any] = []
    for path, leaf in flat:
        if not _is_array(leaf):
            leaves.append(("value", leaf))
            continue
        name = _name(path, taken)
        part = _local(name, leaf)
        if part is not None:
            parts.append(part)
        leaves.append(("array", name, np.dtype(leaf.dtype).name, tuple(int(n) for n in leaf.shape),
                       "jax" if isinstance(leaf, jax.Array) else "numpy"))
    meta = pickle.dumps({"format": FORMAT, "treedef": treedef, "leaves": leaves}, protocol=pickle.HIGHEST_PROTOCOL)
    return parts, meta


def _view(base: Any, at: int, dtype: str, lengths: Sequence[int]) -> np.ndarray:
    """An array of dtype and shape lengths over base's bytes at offset at."""
    n = int(np.prod(lengths, dtype=np.int64))
    return np.frombuffer(base, dtype=_dtype(dtype), count=n, offset=at).reshape(tuple(lengths))


def _offsets(sizes: Sequence[int]) -> Tuple[List[int], int]:
    """Each size's offset in one buffer (_ALIGN-aligned, in order), and its
    total size (at least _ALIGN)."""
    out, off = [], 0
    for n in sizes:
        off = (off + _ALIGN - 1) // _ALIGN * _ALIGN
        out.append(off)
        off += n
    return out, max(off, _ALIGN)


class _Layout:
    """What saves of one layout (names, dtypes and boxes) reuse: a
    registered scratch buffer holding every host box, the specs, and the
    daemon's table of them (None with CUDA boxes, or from a daemon without
    tables)."""

    def __init__(self, client: Client, parts: List[_Local], cuda: Dict[str, Tuple[Buffer, int]]) -> None:
        self.key = [p.key() for p in parts]
        self.on_device = frozenset(cuda)
        host = [p for p in parts if p.name not in cuda]
        offsets, total = _offsets([p.nbytes for p in host])
        self.buffer = client.alloc(total)
        self.at = dict(zip((p.name for p in host), offsets))
        self.specs: List[TensorSpec] = []
        for p in parts:
            buf, off = cuda[p.name] if p.name in cuda else (self.buffer, self.at[p.name])
            self.specs.append(TensorSpec(p.name, DTYPE_CODES[p.dtype], p.shape, buf, off, p.nbytes,
                                         p.offsets, p.lengths))
        self.table = None
        if not cuda:
            try:
                self.table = client.table(self.specs)
            except CkptError as e:
                if e.errno != errno.ENOTSUP:
                    raise

    def fill(self, parts: List[_Local]) -> None:
        """Copy this save's host arrays into the scratch buffer."""
        view = self.buffer.view
        assert view is not None, "alloc()'d: mapped here"
        for p in parts:
            if p.name not in self.at or not p.nbytes:
                continue
            box = _view(view, self.at[p.name], p.dtype, p.lengths)
            for rel, data in p.pieces:
                src = np.asarray(data)
                box[tuple(slice(o, o + n) for o, n in zip(rel, src.shape))] = src

    def free(self) -> None:
        if self.table is not None:
            self.table.free()
            self.table = None
        self.buffer.free()


class _Cuda:
    """Device memory registered with the daemon (the C API's CUDA path),
    kept per allocation while its identity holds. works: None (untried),
    True, or False (CUDA off here or in the daemon: host copies)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.works: Optional[bool] = None
        self.regs: Dict[Tuple[int, int], Tuple[Buffer, int]] = {}

    def place(self, ptr: int) -> Optional[Tuple[Buffer, int]]:
        """(registered buffer, offset) of device pointer ptr, or None when
        the CUDA path does not take it."""
        if self.works is False:
            return None
        try:
            start, size, _ = cuda_allocation(ptr)
            key = (start, size)
            have = self.regs.get(key)
            ident = cuda_identity(start, size)
            if have is None or have[1] != ident:
                if have is not None:
                    have[0].free()
                have = (self.client.register_cuda(start, size), ident)
                self.regs[key] = have
            self.works = True
            return have[0], ptr - start
        except CkptError:
            self.works = False if self.works is None else self.works
            return None


def _device_pointer(part: _Local) -> Optional[int]:
    """The device pointer of a part held whole by one shard on a CUDA
    device, once its computation is done; None for anything else."""
    if len(part.pieces) != 1 or not part.nbytes:
        return None
    data = part.pieces[0][1]
    dev = next(iter(getattr(data, "devices", lambda: set())()), None)
    if dev is None or getattr(dev, "platform", "") not in ("gpu", "cuda"):
        return None
    try:
        data.block_until_ready()
        return int(data.unsafe_buffer_pointer())
    except Exception:  # no pointer from this runtime (or a layout it will not give one for)
        return None


def _process_rank(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """jax's process index and count; ones given by hand must agree."""
    pr, pw = jax.process_index(), jax.process_count()
    if rank is not None and rank != pr or world_size is not None and world_size != pw:
        raise ValueError(f"rank={rank} world_size={world_size} given, but jax says process {pr} of {pw}; leave "
                         "them out (they come from jax.process_index() and jax.process_count())")
    return pr, pw


class Checkpointer(SaveTracking):
    """Saves and restores one job's pytrees through this node's ckptd, as
    process jax.process_index() of jax.process_count().

        cp = ckpt.jax.Checkpointer("mlp")          # socket: $CKPTD_SOCKET or /run/ckptd/ckptd.sock
        cp.save(state, step)                       # returns once staged
        cp.close()                                 # waits until every save is durable; raises if one failed

    A save that fails after save() returned raises at the next save(),
    wait() or close(), as ckpt.torch's.
    """

    _FALLBACK = "no daemon"

    def __init__(self, job: str, rank: Optional[int] = None, world_size: Optional[int] = None,
                 socket: Optional[str] = None, attempt_id: Optional[str] = None, policy: Optional[str] = None,
                 *, exist_ok: bool = False, compress: Optional[bool] = None,
                 incremental: Optional[bool] = None, storage: Optional[str] = None) -> None:
        """Connect to ckptd as this process's rank of job. job, socket,
        attempt_id, policy, exist_ok, compress, incremental and storage
        (this user's daemon started on demand when none runs; local rank 0
        is $LOCAL_RANK's, else 0) as ckpt.torch.Checkpointer's; rank and
        world_size are jax's process index and count (given by hand they
        must agree). Raises ckpt.DaemonUnavailable when no ckptd answers."""
        rank, world_size = _process_rank(rank, world_size)
        if attempt_id is None:
            attempt_id = _attempt.default(world_size, _attempt.jax_agree)
        self.job, self.rank, self.world_size = job, rank, world_size
        self.exist_ok, self.compress, self.incremental = exist_ok, compress, incremental
        self._inflight: List[Any] = []
        self._fresh_checked = False
        self._max_inflight = 4
        self._last_save: Optional[SaveFuture] = None
        self.last_load: Optional[Dict[str, Any]] = None
        local_rank = int(os.environ.get("LOCAL_RANK") or 0)
        self.client: Optional[Client] = _node.connect(
            lambda path: Client(path, job=job, rank=rank, world_size=world_size, local_rank=local_rank,
                                attempt_id=attempt_id, policy=policy), socket, storage, local_rank)
        self._layout: Optional[_Layout] = None
        self._cuda = _Cuda(self.client)

    def _check_open(self) -> None:
        if self.client is None:
            raise CkptError(errno.EBADF, "this Checkpointer is closed")

    # ---- save ----

    def save(self, tree: Any, step: int, tier: str = "durable") -> SaveFuture:
        """Save tree (a pytree of jax.Arrays, NumPy arrays and picklable
        leaves) as step. Returns a SaveFuture once ckptd has staged this
        process's arrays: .staged, .kept, .durable, result() as
        ckpt.torch's. tier: "durable", "memory" (kept in this node's ckptd
        only; persist() makes it durable) or "replicated" (docs/tiers.md
        "Tiers"). Raises first the failure of an earlier save nobody saw,
        and CkptError(EEXIST) at the first save into a job with steps that
        this process did not restore from (exist_ok), or of a step that was
        complete when it restored an earlier one by number, as ckpt.torch's."""
        self._check_open()
        self._check_saves()
        if not self._fresh_checked:
            self._check_fresh()
        self._check_not_newer(step)
        parts, meta = _flatten(tree)
        return self._track(self._submit(lambda: self._save(parts, meta, step, tier)))

    def _save(self, parts: List[_Local], meta: bytes, step: int, tier: str) -> SaveFuture:
        assert self.client is not None, "open: _check_open"
        cuda: Dict[str, Tuple[Buffer, int]] = {}
        for p in parts:
            ptr = _device_pointer(p)
            placed = self._cuda.place(ptr) if ptr is not None else None
            if placed is not None:
                cuda[p.name] = placed
        layout = self._layout
        if layout is None or layout.key != [p.key() for p in parts] or layout.on_device != frozenset(cuda):
            if layout is not None:
                layout.free()
            layout = self._layout = _Layout(self.client, parts, cuda)
        elif cuda:
            for s in layout.specs:  # a kept layout: this save's device places
                if s.name in cuda:
                    s.buffer, s.offset = cuda[s.name]
        layout.fill(parts)
        if layout.table is not None:
            return SaveFuture(self.client.save_table(step, layout.table, meta, tier=tier, compress=self.compress,
                                                     incremental=self.incremental), step)
        return SaveFuture(self.client.save(step, layout.specs, meta, tier=tier, compress=self.compress,
                                           incremental=self.incremental), step)

    # ---- restore ----

    def latest_step(self) -> Optional[int]:
        """The step restore() would take (the newest complete one, in
        storage or, in a world of one, in this node's memory), or None when
        the job has none. Marks the job as resumed (exist_ok)."""
        self._check_open()
        try:
            return self._resolve_step("latest")
        except CkptError as e:
            if e.errno != errno.ENOENT:
                raise
            return None

    def _resolve_step(self, step: Union[int, str]) -> int:
        """The step every process restores: a named one as it is; "latest"
        decided by process 0 (storage's, or in a world of one also this
        node's memory-only steps: _decide) and broadcast."""
        assert self.client is not None, "open: _check_open"
        _resumed.add((self.client.socket, self.job))
        self._note_load(None if step in ("latest", LATEST) else int(step))
        if step not in ("latest", LATEST):
            return int(step)
        if jax.process_count() == 1:
            return self._decide(LATEST, set(self._held_steps()) if self.world_size == 1 else set())
        from jax.experimental import multihost_utils
        got = np.zeros(2, np.int64)
        if jax.process_index() == 0:
            try:
                got[:] = (1, self._decide(LATEST, set()))
            except CkptError as e:
                got[:] = (0, e.errno or errno.EIO)
        got = np.asarray(multihost_utils.broadcast_one_to_all(got))
        if not got[0]:
            raise CkptError(int(got[1]), f"process 0 could not decide the latest step of job '{self.job}'")
        return int(got[1])

    def _meta(self, step: int) -> Dict[str, Any]:
        """The step's extra state (this rank's, or rank 0's past the saved
        world), unpickled: one load of no tensors."""
        assert self.client is not None, "open: _check_open"
        res = self.client.load([], step).result()
        meta = pickle.loads(res["extra"]) if res["extra"] else None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise CkptError(errno.EINVAL, f"step {step} of job '{self.job}' was not saved by ckpt.jax")
        return meta

    def restore(self, step: Union[int, str] = "latest", target: Any = None) -> Tuple[int, Any]:
        """Restore step (default: the latest complete one). Returns (step,
        tree). Without target, the tree comes back as saved, its jax.Arrays
        on the default device. target: a pytree of the saved structure
        whose array leaves say where each array goes: a jax.Array or a
        jax.ShapeDtypeStruct (its sharding; shape and dtype must match the
        saved ones), a jax.sharding.Sharding, or a NumPy array (a NumPy
        array comes back); the tree comes back in target's structure (its
        node types), with the saved non-array leaves. Only the boxes this
        process's devices hold are read."""
        self._check_open()
        assert self.client is not None, "open: _check_open"
        concurrent.futures.wait([x for f in self._inflight for x in _phases(f)])  # "latest" includes them
        number = self._resolve_step(step)
        if step in ("latest", LATEST):
            self._note_load(number, latest=True)
        meta = self._meta(number)
        saved = meta["leaves"]
        if target is None:
            wants: List[Any] = [None] * len(saved)
            treedef = meta["treedef"]
        else:
            wants, treedef = _targets(target, saved, number, self.job)
        plans = [_plan(leaf, want) if leaf[0] == "array" else None for leaf, want in zip(saved, wants)]
        boxes = [b for p in plans if p is not None for b in p.boxes]
        sizes = [int(np.prod(b[2], dtype=np.int64)) * _dtype(b[1]).itemsize for b in boxes]
        offsets, total = _offsets(sizes)
        fd, mapping = _shared(total)
        try:
            buf = self.client.register_fd(fd, total)
        finally:
            os.close(fd)
        try:
            specs = [TensorSpec(b[0], DTYPE_CODES[b[1]], b[3], buf, at, n, b[4], b[2])
                     for b, at, n in zip(boxes, offsets, sizes)]
            res = self.client.load(specs, number).result()
        finally:
            buf.free()
        views = iter(_view(mapping, at, b[1], b[2]) for b, at in zip(boxes, offsets))
        out = [leaf[1] if p is None else p.make(views) for leaf, p in zip(saved, plans)]
        jax.block_until_ready([x for x in out if isinstance(x, jax.Array)])
        res.pop("extra", None)
        self.last_load = res
        return res["step"], jax.tree_util.tree_unflatten(treedef, out)

    # ---- lifetime ----

    def close(self, wait: bool = True) -> None:
        """Wait until every save is safe at its tier (wait()), then
        disconnect; raise the first failure nobody saw, after
        disconnecting. wait=False disconnects at once (ckptd still finishes
        the staged saves)."""
        err = None
        if self.client is not None and wait:
            try:
                self.wait()
            except CkptError as e:
                err = e
        self._inflight = []
        self._layout = None  # the client's close frees its buffer, table and device registrations
        self._cuda.regs = {}
        if self.client is not None:
            self.client.close()
            self.client = None
        if err is not None:
            raise err

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, etype: Any, *exc: Any) -> None:
        self.close(wait=etype is None)


def _shared(nbytes: int) -> Tuple[int, mmap.mmap]:
    """A new shared-memory file of nbytes and its mapping here: the fd (the
    caller closes it) and the mmap, which the NumPy views a restore hands
    to jax keep alive."""
    fd = os.memfd_create("ckpt-jax-restore", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        return fd, mmap.mmap(fd, nbytes)
    except BaseException:
        os.close(fd)
        raise


def _targets(target: Any, saved: List[Any], step: int, job: str) -> Tuple[List[Any], Any]:
    """target's leaf for each saved leaf (the same structure: in the same
    order, arrays under the same names), and target's PyTreeDef.
    ValueError when they differ."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(target, is_leaf=_is_target_leaf)
    if len(flat) != len(saved):
        raise ValueError(f"target has {len(flat)} leaves, step {step} of job '{job}' {len(saved)}: restore into a "
                         "target of the saved structure (or without one)")
    taken: set = set()
    for (path, want), leaf in zip(flat, saved):
        if leaf[0] != "array":
            continue
        name = _name(path, taken)
        if name != leaf[1]:
            raise ValueError(f"target's leaf '{name}' is where step {step} of job '{job}' has array '{leaf[1]}': "
                             "restore into a target of the saved structure (or without one)")
        if isinstance(want, jax.sharding.Sharding):
            continue
        shape, dtype = tuple(getattr(want, "shape", ())), getattr(want, "dtype", None)
        if shape != tuple(leaf[3]) or dtype is None or np.dtype(dtype) != _dtype(leaf[2]):
            raise ValueError(f"array '{leaf[1]}' of step {step} of job '{job}' was saved as {leaf[2]} "
                             f"{list(leaf[3])}, but target's is {dtype} {list(shape)}")
    return [w if leaf[0] == "array" else None for (_, w), leaf in zip(flat, saved)], treedef


def _is_target_leaf(x: Any) -> bool:
    return isinstance(x, (jax.sharding.Sharding, jax.ShapeDtypeStruct))


class _Plan:
    """How one saved array is restored: the boxes to read, as (name, dtype,
    lengths, global shape, offsets), and make(views) to build the array
    from their views, in that order."""

    def __init__(self, name: str, dtype: str, shape: Tuple[int, ...], sharding: Any, kind: str) -> None:
        self.name, self.dtype, self.shape, self.sharding, self.kind = name, dtype, shape, sharding, kind
        if sharding is None:
            self.index: Dict[Any, Tuple[Tuple[int, ...], Tuple[int, ...]]] = {}
            self.boxes = [(name, dtype, shape, shape, (0,) * len(shape))]
            return
        self.index = {d: _box(ix, shape) for d, ix in sharding.addressable_devices_indices_map(shape).items()}
        unique = list(dict.fromkeys(self.index.values()))
        self.boxes = [(name, dtype, lens, shape, offs) for offs, lens in unique]

    def make(self, views: Any) -> Any:
        got = {(b[4], b[2]): next(views) for b in self.boxes}
        if self.sharding is None:
            whole = got[((0,) * len(self.shape), self.shape)]
            return whole if self.kind == "numpy" else jax.device_put(whole)
        arrays = [jax.device_put(got[box], d) for d, box in self.index.items()]
        return jax.make_array_from_single_device_arrays(self.shape, self.sharding, arrays)


def _plan(leaf: Any, want: Any) -> _Plan:
    """The _Plan of saved array leaf into want (target's leaf, or None)."""
    _, name, dtype, shape, kind = leaf
    shape = tuple(shape)
    if want is None:
        return _Plan(name, dtype, shape, None, kind)
    if isinstance(want, np.ndarray):
        return _Plan(name, dtype, shape, None, "numpy")
    sharding = want if isinstance(want, jax.sharding.Sharding) else getattr(want, "sharding", None)
    return _Plan(name, dtype, shape, sharding, "jax")
