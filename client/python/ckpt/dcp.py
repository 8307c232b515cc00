"""ckpt.dcp: torch.distributed.checkpoint through ckptd.

    import torch.distributed.checkpoint as dcp
    import ckpt.dcp
    fut = dcp.async_save(state_dict, storage_writer=ckpt.dcp.Writer("llama", step=1200))
    ...
    dcp.load(state_dict, storage_reader=ckpt.dcp.Reader("llama"))   # latest

Writer is a StorageWriter that is also DCP's AsyncStager: async_save calls
its stage(), which hands every tensor to ckptd (zero copy: the tensors'
storage is shared with the daemon, as in ckpt.torch) and returns once the
daemon has staged them. The trainer's stall is the daemon's copy; no copy
is made in the trainer. DCP's background save then only waits for durable.
dcp.save (synchronous) works too.

With Writer(..., async_staging=True), stage() does not wait: async_save
returns as soon as the save is handed to ckptd, and the daemon's copy
overlaps whatever the trainer does next (forward and backward). The
trainer must wait before it changes a saved tensor (optimizer.step(), or a
train-mode forward that updates BatchNorm statistics):
``resp.staging_completion.result()`` where async_save returns DCP's
AsyncSaveResponse (torch builds whose async_save accepts a Future from
stage()), else ``writer.synchronize_staging()``. DCP's own DefaultStager
calls this use_async_staging. A Writer keeps each staging under its step
until DCP's save thread takes it: give each save its own Writer (or its own
checkpoint_id) rather than changing .step while a save is in flight.

Reader is a StorageReader. The step's manifests are the metadata: every
saved tensor box becomes a DCP chunk, so DCP's own planner reshards (a step
saved by N ranks loads on M). Non-tensor values are stored as their
torch.save bytes under "__bytes__/<fqn>".

Tiers (docs/tiers.md "Tiers"): Writer(..., tier="memory") keeps each save in this
node's ckptd only (DCP's save completes once the daemon holds it);
Writer.persist(step) or ckptctl persist makes it durable. A Reader of
"latest" restores a memory step when every rank's daemon holds it.

checkpoint_id: a step number, or a path whose last part names one, as
torchtitan and the Hugging Face Trainer write them (step_of()):
``dcp.save(sd, checkpoint_id="outputs/checkpoint/step-100",
storage_writer=ckpt.dcp.Writer("llama"))`` saves step 100 of job "llama";
the rest of the path is not used (the job names the place).
"""
from __future__ import annotations

import concurrent.futures
import io
import os
import re
import threading
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.metadata import (STATE_DICT_TYPE, BytesStorageMetadata, ChunkStorageMetadata,
                                                   Metadata, MetadataIndex, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, ReadItem, SavePlan,
                                                  SavePlanner, WriteItem, WriteItemType)
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult

from .client import LATEST, SaveFuture, TensorSpec
from .torch import DTYPE_CODES, TORCH_DTYPES, Checkpointer, cuda_stream, resolve_rank

__all__ = ["Writer", "Reader", "step_of"]

# The last part of a path-style checkpoint_id: step-100 (torchtitan),
# step_100, step100, global_step100 (DeepSpeed), checkpoint-100 (Hugging
# Face), or the number alone.
_STEP_NAME = re.compile(r"^(?:(?:global_)?step|checkpoint|ckpt)?[-_]?(\d+)$")


# What a checkpoint_id may be here: DCP's (a str or a path), or a step.
CheckpointId = Union[int, str, "os.PathLike[str]", None]


def step_of(checkpoint_id: CheckpointId) -> int:
    """The step a DCP checkpoint_id names, as an int. checkpoint_id: an int
    of 0 or more (not a bool); or a str or os.PathLike (a path or a URL)
    whose last part, trailing '/' dropped, is N, or step, global_step,
    checkpoint or ckpt, then '-', '_' or nothing, then N (step-100,
    global_step100, checkpoint-100). Raises ValueError for anything else
    (a bool, a negative int, another type, another name)."""
    if isinstance(checkpoint_id, bool):
        raise ValueError(f"checkpoint_id {checkpoint_id!r} is not a step")
    if isinstance(checkpoint_id, int):
        if checkpoint_id < 0:
            raise ValueError(f"checkpoint_id {checkpoint_id}: a step is not negative")
        return checkpoint_id
    text = os.fspath(checkpoint_id) if isinstance(checkpoint_id, (str, os.PathLike)) else None
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    last = text.rstrip("/").rsplit("/", 1)[-1] if text else ""
    m = _STEP_NAME.match(last)
    if m is None:
        raise ValueError(f"checkpoint_id {checkpoint_id!r}: want a step number, or a path ending in step-N "
                         "(or step_N, global_stepN, checkpoint-N, N)")
    return int(m.group(1))

BYTES_PREFIX = "__bytes__/"

# What a Writer saves: (name, local tensor, global shape, offsets) ...
_Item = Tuple[str, torch.Tensor, Tuple[int, ...], Tuple[int, ...]]
# ... and a save of them: its future and {name: nbytes}.
_Staging = Tuple[SaveFuture, Dict[str, int]]

_cache_lock = threading.Lock()
_cache: "dict[tuple[Any, ...], Checkpointer]" = {}


def _identity(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """The launcher's rank and world size (torch.distributed, else
    RANK/WORLD_SIZE); ones given by hand must agree (resolve_rank)."""
    return resolve_rank(rank, world_size)[:2]


def _checkpointer(job: str, rank: int, world_size: int, socket: Optional[str], attempt_id: Optional[str],
                  policy: Optional[str], storage: Optional[str] = None) -> Checkpointer:
    """One Checkpointer per identity, shared by Writer/Reader objects, so the
    shared-memory registrations carry over from one save to the next."""
    key = (job, rank, world_size, socket, attempt_id, policy, storage)
    with _cache_lock:
        cp = _cache.get(key)
        if cp is None or cp.client is None:
            cp = _cache[key] = Checkpointer(job, rank=rank, world_size=world_size, socket=socket,
                                            attempt_id=attempt_id, policy=policy, storage=storage)
        return cp


def close_all() -> None:
    """Close the Checkpointers that Writer and Reader objects share (their
    connections to ckptd) and forget them: a later Writer or Reader
    connects anew (tests, process exit). Returns None."""
    with _cache_lock:
        for cp in _cache.values():
            cp.close()
        _cache.clear()


def _bytes_tensor(obj: Any) -> torch.Tensor:
    bio = io.BytesIO()
    torch.save(obj, bio)
    return torch.frombuffer(bytearray(bio.getvalue()), dtype=torch.uint8)


def _local_box(t: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, ...], Tuple[int, ...]]:
    """(local tensor, global shape, offsets) for plain tensors and DTensors."""
    try:
        from torch.distributed.tensor import DTensor
        if isinstance(t, DTensor):
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
            local = t.to_local()
            _, offsets = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
            return local, tuple(t.shape), tuple(offsets)
    except ImportError:
        pass
    return t, tuple(t.shape), (0,) * t.dim()


def _future_staging_supported() -> bool:
    """True when dcp.async_save accepts a Future from AsyncStager.stage()
    and returns an AsyncSaveResponse (newer torch)."""
    try:
        from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse  # noqa: F401
        return True
    except ImportError:
        return False


class Writer(StorageWriter, AsyncStager):
    """A DCP StorageWriter and AsyncStager that saves each rank's tensors
    (and its non-tensor values, as their torch.save bytes) to ckptd as step
    step of job (the module's text shows how).

    job: the job's name. step: the step to save, an int or a checkpoint_id
    step_of() reads; None: the checkpoint_id dcp.save gives (reset()).
    socket: ckptd's socket (default $CKPTD_SOCKET, else
    /run/ckptd/ckptd.sock; ckpt.DaemonUnavailable at the first save when
    ckptd is not there). rank, world_size: default the launcher's
    (resolve_rank: ones given that disagree raise ValueError at the first
    save). attempt_id, policy: as ckpt.torch.Checkpointer's. async_staging: stage() returns before ckptd has
    staged (the module's text). tier: "durable", "memory" or "replicated"
    (checked at the first save). compress: whether ckptd stores the shards
    compressed (docs/format.md "Pieces"): None as the job's configuration
    says, True or False (checked at the first save). exist_ok: save into a job that has steps
    though this process did not load from it (by default rank 0's first
    save then raises CkptError EEXIST, as ckpt.torch.Checkpointer's;
    loading through a Reader first continues the job). Writers and Readers
    of one identity share one Checkpointer, and so its connection and
    registrations. storage: where steps go when no ckptd runs on the node
    (this user's daemon is then started, as ckpt.torch.Checkpointer's
    storage=). Raises ValueError when step_of() reads no step from
    step."""

    # async_save never calls synchronize_staging() itself: with blocking
    # staging stage() has already waited, and with async_staging the
    # trainer waits where it chooses.
    _synchronize_after_execute = False

    def __init__(self, job: str, step: Optional[int] = None, socket: Optional[str] = None, rank: Optional[int] = None,
                 world_size: Optional[int] = None, attempt_id: Optional[str] = None, policy: Optional[str] = None,
                 async_staging: bool = False, tier: str = "durable", exist_ok: bool = False,
                 compress: Optional[bool] = None, storage: Optional[str] = None) -> None:
        super().__init__()
        self.exist_ok = exist_ok
        self.job, self.socket, self.storage = job, socket, storage
        self.step = None if step is None else step_of(step)
        self.tier = tier
        self.compress = compress
        self.rank, self.world_size = rank, world_size
        self.attempt_id, self.policy = attempt_id, policy
        self.async_staging = async_staging
        # step -> (SaveFuture, {name: nbytes}): staged by stage() on the
        # trainer's thread, taken by write_data() on DCP's save thread.
        self._staged: Dict[int, _Staging] = {}
        self._staged_lock = threading.Lock()
        self._last: Optional[SaveFuture] = None  # of the latest stage()

    # ---- AsyncStager ----

    def _cp(self) -> Checkpointer:
        rank, ws = _identity(self.rank, self.world_size)
        return _checkpointer(self.job, rank, ws, self.socket, self.attempt_id, self.policy, self.storage)

    def _step(self) -> int:
        """This Writer's step; ValueError without one."""
        if self.step is None:
            raise ValueError("ckpt.dcp.Writer needs step= (or checkpoint_id=N with dcp.save)")
        return self.step

    def _save(self, items: List[_Item]) -> _Staging:
        """Start the save of items as this Writer's step."""
        step = self._step()
        cp = self._cp()
        if not cp._fresh_checked:
            cp._check_fresh(self.exist_ok)
        cp._check_not_newer(step)
        client, regs, _ = cp._live()
        tensors = [(n, t) for n, t, _, _ in items]
        specs = regs.bind(tensors)
        regs.copy_in(tensors, specs)
        for s, (_, t, shape, offs) in zip(specs, items):
            s.shape, s.offsets, s.lengths = shape, offs, tuple(t.shape)
        stream = cuda_stream([t for _, t in tensors])  # as Checkpointer.save
        return (client.save(step, specs, b"", cuda_stream=stream, tier=self.tier, compress=self.compress),
                {s.name: s.nbytes for s in specs})

    def persist(self, step: Optional[int] = None) -> Any:
        """Make a memory or replicated step durable on this node's daemon;
        call it on every rank (ckpt.torch's Checkpointer.persist, which this
        calls). step: an int or a checkpoint_id step_of() reads; default
        this Writer's step, else the last step its shared Checkpointer saved
        (ValueError when there is none). Returns a ckpt.torch SaveFuture
        whose result() waits until the step is durable."""
        return self._cp().persist(self.step if step is None else step_of(step))

    @staticmethod
    def _items(state_dict: STATE_DICT_TYPE) -> List[_Item]:
        """[(name, local tensor, global shape, offsets)] of state_dict's
        values: each tensor's local box, each other value as its
        torch.save bytes (TypeError for a dtype ckptd lacks)."""
        flat, _ = flatten_state_dict(state_dict)
        items: List[_Item] = []
        for fqn, v in flat.items():
            if isinstance(v, torch.Tensor):
                local, shape, offs = _local_box(v)
                if local.dtype not in DTYPE_CODES:
                    raise TypeError(f"tensor '{fqn}': dtype {local.dtype} is not supported by ckptd")
                items.append((fqn, local, shape, offs))
            else:
                b = _bytes_tensor(v)
                items.append((BYTES_PREFIX + fqn, b, (b.numel(),), (0,)))
        return items

    def prepare(self, state_dict: Mapping[str, Any]) -> None:
        """Do now what the first save of state_dict would: move its CPU
        tensors into shared memory and register them with the daemon, with
        a buffer for its other values' bytes (Checkpointer.prepare's
        counterpart; Writers of one identity share the registrations). The
        first dcp.async_save of those tensors then stalls only as long as a
        later one: without prepare() it also pays one copy of the state
        into shared memory. Optional."""
        _, regs, _ = self._cp()._live()
        regs.bind([(n, t) for n, t, _, _ in self._items(dict(state_dict))])

    def stage(self, state_dict: STATE_DICT_TYPE
              ) -> Union[concurrent.futures.Future[STATE_DICT_TYPE], STATE_DICT_TYPE]:
        """AsyncStager.stage: hand state_dict's tensors to ckptd as a save of
        this Writer's step (ValueError without one, TypeError for a dtype
        ckptd lacks). Returns state_dict once staged; with async_staging at
        once, or a concurrent.futures.Future of it where torch takes one."""
        items = self._items(state_dict)
        step = self._step()  # refuses a Writer without step=
        fut, sizes = self._save(items)
        self._last = fut
        # DCP plans from state_dict; its data is never read again here.
        if not self.async_staging:
            fut.staged.result()  # a failed staging is not kept for write_data
            with self._staged_lock:
                self._staged[step] = (fut, sizes)
            return state_dict
        with self._staged_lock:
            self._staged[step] = (fut, sizes)

        def forget_failed(f):
            if f.exception() is not None:
                with self._staged_lock:
                    if self._staged.get(step, (None,))[0] is fut:
                        del self._staged[step]
        fut.staged.add_done_callback(forget_failed)
        if not _future_staging_supported():
            return state_dict  # the trainer calls synchronize_staging()
        out: concurrent.futures.Future[STATE_DICT_TYPE] = concurrent.futures.Future()

        def staged(f):
            e = f.exception()
            if e is not None:
                out.set_exception(e)
            else:
                out.set_result(state_dict)
        fut.staged.add_done_callback(staged)
        return out

    def synchronize_staging(self) -> None:
        """Wait until ckptd has staged the latest stage()'s tensors (they
        may change again after); raise its error if staging failed."""
        if self._last is not None:
            self._last.staged.result()

    # ---- StorageWriter ----

    def reset(self, checkpoint_id: CheckpointId = None) -> None:
        """StorageWriter.reset: a checkpoint_id (dcp.save's) sets the step
        (step_of(); ValueError if it names none); None keeps it."""
        if checkpoint_id is not None:
            self.step = step_of(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: CheckpointId) -> bool:
        """StorageWriter.validate_checkpoint_id: True when step_of() reads a
        step from checkpoint_id, else False."""
        try:
            step_of(checkpoint_id)
            return True
        except (TypeError, ValueError):
            return False

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """StorageWriter hook: records is_coordinator; nothing to set up."""
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """StorageWriter hook: returns plan unchanged."""
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        """StorageWriter hook: returns plans unchanged."""
        return plans

    def storage_meta(self) -> Optional[StorageMeta]:
        """StorageWriter.storage_meta: a StorageMeta whose checkpoint_id is
        the step as a str (None without a step)."""
        return StorageMeta(checkpoint_id=str(self.step) if self.step is not None else None)

    @staticmethod
    def _name(item: WriteItem) -> str:
        return item.index.fqn if item.type != WriteItemType.BYTE_IO else BYTES_PREFIX + item.index.fqn

    def _take_staged(self) -> Optional[_Staging]:
        """This step's staging from stage(), if it staged (or may still)."""
        with self._staged_lock:
            got = self._staged.pop(self._step(), None)
        if got is not None and got[0].staged.done() and got[0].staged.exception() is not None:
            return None
        return got

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> torch.futures.Future[List[WriteResult]]:
        """StorageWriter.write_data: take the save stage() made of this step,
        or start one now from the planner's data (dcp.save). Returns a torch
        Future of plan's WriteResults, set once the save is durable (tier
        durable) or kept in memory (memory, replicated), or failed."""
        staged = self._take_staged()
        if staged is None:
            # dcp.save without staging: hand the planner's data over now.
            items: List[_Item] = []
            for item in plan.items:
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    # As DCP's own FileSystemWriter, which takes nothing else.
                    if not isinstance(data, io.BytesIO):
                        raise TypeError(f"'{item.index.fqn}': a BYTE_IO item's data is a {type(data).__name__}, "
                                        "not an io.BytesIO")
                    b = torch.frombuffer(bytearray(data.getvalue()), dtype=torch.uint8)
                    items.append((self._name(item), b, (b.numel(),), (0,)))
                else:
                    td = item.tensor_data
                    if not isinstance(data, torch.Tensor) or td is None:
                        raise TypeError(f"'{item.index.fqn}': a tensor item without a tensor (or its tensor_data)")
                    items.append((item.index.fqn, data.detach(), tuple(td.size), tuple(td.chunk.offsets)))
            staged = self._save(items)
        fut, sizes = staged
        out: torch.futures.Future[List[WriteResult]] = torch.futures.Future()

        def done(f, fut=fut):  # keep the native future alive until durable
            try:
                f.result()
                out.set_result([WriteResult(index=item.index, size_in_bytes=sizes.get(self._name(item), 0),
                                            storage_data=self._name(item)) for item in plan.items])
            except Exception as e:  # the durable failure, as DCP expects
                out.set_exception(e)
        # The save's last phase at its tier: durable, or kept in memory.
        (fut.durable if fut.durable is not None else fut.kept).add_done_callback(done)
        return out

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        """StorageWriter.finish: nothing to write; the manifests are the
        metadata."""
        # The manifests ckptd writes are the metadata; nothing else to do.
        pass

    def close(self) -> None:
        """Nothing to release: the shared Checkpointer stays connected for
        later saves (close_all() closes it)."""
        pass


class Reader(StorageReader):
    """A DCP StorageReader that loads a step of job from ckptd; the step's
    manifests are DCP's metadata, so DCP's planner reshards (a step saved
    by N ranks loads on M).

    job: the job's name. step: "latest" (default; None and LATEST alike),
    the newest step every rank can restore, decided in read_metadata();
    else an int or a checkpoint_id step_of() reads (ValueError when it
    reads none). socket, rank, world_size, attempt_id, storage: as
    Writer's."""

    def __init__(self, job: str, step: Union[int, str] = "latest", socket: Optional[str] = None,
                 rank: Optional[int] = None, world_size: Optional[int] = None, attempt_id: Optional[str] = None,
                 storage: Optional[str] = None) -> None:
        super().__init__()
        self.job, self.socket, self.storage = job, socket, storage
        self.step = step if step in (None, "latest", LATEST) else step_of(step)
        self.rank, self.world_size, self.attempt_id = rank, world_size, attempt_id
        self._resolved: Optional[int] = None
        self._saved: Dict[str, Any] = {}  # name -> (dtype, global shape, nbytes)

    def _cp(self) -> Checkpointer:
        rank, ws = _identity(self.rank, self.world_size)
        return _checkpointer(self.job, rank, ws, self.socket, self.attempt_id, None, self.storage)

    def reset(self, checkpoint_id: CheckpointId = None) -> None:
        """StorageReader.reset: a checkpoint_id (dcp.load's) sets the step
        (step_of(); ValueError if it names none); the step resolved before
        is forgotten."""
        if checkpoint_id is not None:
            self.step = step_of(checkpoint_id)
        self._resolved = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: CheckpointId) -> bool:
        """StorageReader.validate_checkpoint_id: as Writer's."""
        return Writer.validate_checkpoint_id(checkpoint_id)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """StorageReader.read_metadata: resolve the step (pinned; "latest"
        agreed by every rank) and return DCP Metadata made from its
        manifests; ckptd's errors (no such step, ...) raise."""
        cp = self._cp()
        client = cp._live()[0]
        # Every rank reads the metadata: they must agree on "latest", which
        # rank 0 resolves once and broadcasts (Checkpointer._resolve_step).
        # A named step is resolved too: pinned before any rank shows it, so
        # the daemon reads each manifest once for all of its ranks (its
        # cache holds pinned steps only); the load would pin it anyway.
        # Rank 0 also shows the step before the broadcast: the first show
        # of a step writes its index (docs/scale.md "At scale"), so every other
        # rank, on every node, reads that one object, not every manifest.
        shown = {}

        def first(n: int) -> None:
            shown[n] = client.show(self.job, n)
        self._resolved = cp._resolve_step(self.step if self.step is not None else LATEST, pin=True, first=first)
        me = _identity(self.rank, self.world_size)[0]
        if getattr(cp, "_in_every_memory", False):
            # A step in memory only, on every rank's node and in no storage
            # (docs/tiers.md "Tiers"): no daemon holds every rank's manifest, so
            # each rank shows its own, from its daemon's memory, and the
            # ranks gather them (the size of DCP's own .metadata, as DCP
            # reads it). A rank's load may then need pieces that other
            # ranks saved (DCP saves replicated tensors once): its daemon
            # brings those copies from the peers that hold them ([peers]).
            mine = client.show(self.job, self._resolved, rank=me)[1]
            every: List[Any] = [None] * dist.get_world_size()  # each rank's, once gathered
            dist.all_gather_object(every, mine)
            tensors = [t for part in every for t in part]
        else:
            _, tensors = shown.get(self._resolved) or client.show(self.job, self._resolved)
        # This rank's own entries win (its pickled values may differ in size).
        tensors.sort(key=lambda t: (t["rank"] == me, t["rank"] == 0))
        md: Dict[str, Union[TensorStorageMetadata, BytesStorageMetadata]] = {}
        tmd: Dict[str, TensorStorageMetadata] = {}  # md's tensors
        storage: Dict[MetadataIndex, Any] = {}
        for t in tensors:
            name = t["name"]
            self._saved[name] = (t["dtype"], t["shape"], t["nbytes"])
            if name.startswith(BYTES_PREFIX):
                fqn = name[len(BYTES_PREFIX):]
                md[fqn] = BytesStorageMetadata()
                storage[MetadataIndex(fqn)] = name
                continue
            m = tmd.get(name)
            if m is None:
                m = md[name] = tmd[name] = TensorStorageMetadata(TensorProperties(dtype=TORCH_DTYPES[t["dtype"]]),
                                                     torch.Size(t["shape"]), [])
            chunk = ChunkStorageMetadata(offsets=torch.Size(t["offsets"]), sizes=torch.Size(t["lengths"]))
            if all(c.offsets != chunk.offsets or c.sizes != chunk.sizes for c in m.chunks):
                m.chunks.append(chunk)
            storage[MetadataIndex(name, torch.Size(t["offsets"]))] = name
        return Metadata(state_dict_metadata=md, storage_data=storage,
                        storage_meta=StorageMeta(checkpoint_id=str(self._resolved)))

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """StorageReader hook: keeps metadata, and takes the step from its
        checkpoint_id when read_metadata() did not resolve one here."""
        self.metadata = metadata
        if self._resolved is None:
            meta = metadata.storage_meta
            if meta is None or meta.checkpoint_id is None:
                raise ValueError("DCP metadata without a checkpoint_id: no step to load")
            self._resolved = step_of(meta.checkpoint_id)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """StorageReader hook: returns plan unchanged."""
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        """StorageReader hook: returns plans unchanged."""
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future[None]:
        """StorageReader.read_data: load plan's items from ckptd in one load
        and hand them to the planner. Each tensor lands in its target in
        place when it can (a contiguous tensor of the saved dtype: bound as
        Checkpointer.load binds, zero-copy), else in a tensor of its own,
        copied over after; bytes go to load_bytes. Returns a completed
        torch Future; errors raise."""
        client, regs, _ = self._cp()._live()
        step = self._resolved
        if step is None:
            raise ValueError("ckpt.dcp.Reader.read_data before read_metadata() or set_up_storage_reader(): "
                             "no step to load")
        # (item, name bound: unique per item, so two boxes of one tensor
        # never share a scratch buffer; tensor filled; target or None)
        fills: List[Tuple[ReadItem, str, torch.Tensor, Optional[torch.Tensor]]] = []
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:
                name = BYTES_PREFIX + item.storage_index.fqn
                fills.append((item, name, torch.empty(self._saved[name][2], dtype=torch.uint8), None))
                continue
            name = item.storage_index.fqn
            dtype = TORCH_DTYPES[self._saved[name][0]]
            dest = planner.resolve_tensor(item).detach()
            fill = dest if dest.dtype == dtype else torch.empty(tuple(dest.shape), dtype=dtype)
            fills.append((item, f"{name}@{_box_offsets(item)}", fill, dest))
        bound = [(n, f) for _, n, f, _ in fills]
        specs = regs.bind(bound)
        try:
            for (item, _, fill, _), s in zip(fills, specs):
                if item.type == LoadItemType.BYTE_IO:
                    s.name = BYTES_PREFIX + item.storage_index.fqn
                    s.shape = self._saved[s.name][1]
                    continue
                s.name = item.storage_index.fqn
                s.shape = self._saved[s.name][1]
                s.offsets = tuple(c + int(o) for c, o in zip(_box_offsets(item), item.storage_offsets))
                s.lengths = tuple(int(n) for n in item.lengths)
            client.load(specs, step).result()
            regs.copy_out(bound, specs)
        finally:
            # What only this read used goes: scratch (non-contiguous
            # targets) and the registrations of its own tensors (bytes,
            # another dtype), which would otherwise stay mapped in the
            # daemon until the next bind.
            for _, n, fill, target in fills:
                regs.forget(n, fill if fill is not target else None)
        for item, _, fill, target in fills:
            if target is None:
                planner.load_bytes(item, io.BytesIO(fill.numpy().tobytes()))
                continue
            if fill is not target:
                target.copy_(fill)
            planner.commit_tensor(item, target)
        out: torch.futures.Future[None] = torch.futures.Future()
        out.set_result(None)
        return out


def _box_offsets(item: ReadItem) -> Tuple[int, ...]:
    """The offsets of the saved box a tensor item reads from (its
    storage_index's: DCP's planner gives every tensor item one)."""
    offsets = item.storage_index.offset
    if offsets is None:
        raise ValueError(f"'{item.storage_index.fqn}': a tensor item without its box's offsets")
    return tuple(int(o) for o in offsets)
