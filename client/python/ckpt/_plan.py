"""ckpt.torch's save plans: what a save of one state dict's shape reuses
while its tensors stay where they are (names, pickled skeleton,
registrations, the daemon's tensor table), so that a later save sends a
step and the non-tensor values (docs/python.md "Python and PyTorch": about
1.5 us per tensor); and the walks of a state dict that make and check one."""
from __future__ import annotations

import errno
import gc
import operator
from typing import Any, Dict, List, Optional, Set, Tuple

import torch

from ._cuda import CudaRegistrations, Key, Reg
from ._regs import Named, Registrations
from ._tree import DTYPE_CODES, _Leaf, _Ref, dump_skeleton
from .client import CkptError, Client, Table, TensorSpec


def flatten(obj: Any, path: List[str], tensors: List[Tuple[str, torch.Tensor]], names: Set[str],
            leaves: Optional[List[Any]] = None) -> Any:
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
        return {k: flatten(v, path + [str(k)], tensors, names, leaves) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        seq = [flatten(v, path + [str(i)], tensors, names, leaves) for i, v in enumerate(obj)]
        return seq if isinstance(obj, list) else tuple(seq)
    if leaves is not None:
        leaves.append(obj)
        return _Leaf(len(leaves) - 1)
    return obj


def scan(root: Any) -> Tuple[List[torch.Tensor], List[Any], List[Any]]:
    """One walk of a state dict, in flatten's order and with its notion of
    a tensor, a container and a leaf: (tensors, other leaves, signature).
    The signature fixes the tree's shape: each container's type, keys and
    where it starts, and where each other leaf sits among the tensors. Two
    state dicts with equal signatures flatten to the same names and the
    same skeleton; only their tensors and leaf values can differ. About
    0.1 us per tensor: it runs on every save (tests/bench/py_tensors.py)."""
    tensors: List[torch.Tensor] = []
    others: List[Any] = []
    sig: List[Any] = []
    t_add, o_add, s_add = tensors.append, others.append, sig.append
    Tensor, Parameter = torch.Tensor, torch.nn.Parameter

    def walk(obj: Any) -> None:
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


def fingerprint(ts: List[torch.Tensor]) -> Tuple[List[Any], ...]:
    """What a registration and a table depend on, per tensor: where its
    bytes are, its shape, dtype and contiguity. Equal fingerprints of
    tensors whose storages the plan holds mean the same bytes in the same
    registered buffers (no other storage can have the address meanwhile)."""
    return (list(map(_data_ptr, ts)), list(map(_size, ts)), list(map(_dtype, ts)), list(map(_contig, ts)))


class Plan:
    """What a save of one state dict's shape reuses while its tensors stay
    where they are: the names and skeleton, the specs and registrations
    (holding the CPU storages, so no other tensor can take their
    addresses), and the daemon's tensor table (None for CUDA tensors, and
    from a daemon without tables). cuda_regs: the CUDA registrations the
    specs name, {key: (Buffer, identity)}; the caching allocator can free
    and remake a segment under a kept plan, so they are checked again at
    every save (SavePlans.cuda_specs)."""
    __slots__ = ("sig", "fp", "skeleton", "named", "specs", "table", "storages", "scratch", "cuda", "cuda_regs")

    sig: List[Any]
    fp: Tuple[List[Any], ...]
    skeleton: bytes
    named: List[Tuple[str, torch.Tensor]]
    specs: List[TensorSpec]
    table: Optional[Table]
    storages: List[torch.UntypedStorage]
    scratch: List[int]
    cuda: bool
    cuda_regs: Dict[Key, Reg]

    def drop(self) -> None:
        """Free the plan's table in the daemon (its registrations are the
        Checkpointer's, kept)."""
        if self.table is not None:
            try:
                self.table.free()
            except Exception:
                pass
            self.table = None


class SavePlans:
    """A Checkpointer's save plan: last, the plan of its last save (or of
    prepare()), kept while later saves have the same shape and tensors;
    made through the Checkpointer's registrations."""

    def __init__(self, client: Client, regs: Registrations, cuda: CudaRegistrations) -> None:
        self.client, self.regs, self.cuda = client, regs, cuda
        self.last: Optional[Plan] = None

    def drop(self) -> None:
        """Forget the last plan (and free its table)."""
        if self.last is not None:
            self.last.drop()
            self.last = None

    def make(self, state_dict: Any, sig: List[Any]) -> Plan:
        """Flatten, bind (share, register) and declare the table: what the
        first save of a state dict's shape pays, and prepare() ahead of it."""
        self.drop()
        named: List[Tuple[str, torch.Tensor]] = []
        leaves: List[Any] = []
        tree = flatten(state_dict, [], named, set(), leaves)
        p = Plan()
        p.sig, p.named, p.table = sig, named, None
        p.skeleton = dump_skeleton(tree)
        p.specs = self.regs.bind(named, plan=True)
        p.cuda_regs = dict(self.cuda.regs)
        ts = [t for _, t in named]
        # After the bind: sharing moved storages, and with them data_ptr.
        p.fp = fingerprint(ts)
        p.cuda = any(t.is_cuda for t in ts)
        p.storages = [t.untyped_storage() for t in ts if not t.is_cuda]
        p.scratch = [i for i, ((name, _), s) in enumerate(zip(named, p.specs)) if self.regs.is_scratch(name, s)]
        if not p.cuda:
            try:
                p.table = self.client.table(p.specs)
            except CkptError as e:
                if e.errno != errno.ENOTSUP:
                    raise
                # An older daemon: each save sends the specs.
        self.last = p
        return p

    def plan_for(self, state_dict: Any) -> Tuple[Plan, List[torch.Tensor], List[Any], bool]:
        """The plan for state_dict, its tensors and leaves now, and whether
        the plan is new: the last one while the tree's shape and its
        tensors' places are unchanged."""
        # The walk allocates a few objects per tensor: with the collector
        # on, a trainer's heap made it sweep every few saves (tens of ms).
        gc_was = gc.isenabled()
        gc.disable()
        try:
            tensors, others, sig = scan(state_dict)
            p = self.last
            same = p is not None and p.sig == sig and p.fp == fingerprint(tensors)
        finally:
            if gc_was:
                gc.enable()
        if same and p is not None:
            return p, tensors, others, False
        return self.make(state_dict, sig), tensors, others, True

    def cuda_specs(self, p: Plan, tensors: List[torch.Tensor], fresh: bool) -> Tuple[Named, List[TensorSpec]]:
        """A plan with CUDA tensors: its (name, tensor) pairs for this save's
        tensors, and its specs. Device registrations are checked at every
        save (the caching allocator reuses addresses): a kept plan whose
        registrations no longer hold binds again."""
        named = [(name, t) for (name, _), t in zip(p.named, tensors)]
        if not fresh and not self.cuda.still_hold(p.cuda_regs):
            p.specs = self.regs.bind(named, plan=True)
            p.cuda_regs = dict(self.cuda.regs)
        return named, p.specs

    def copy_scratch(self, p: Plan, tensors: List[torch.Tensor]) -> None:
        """A host plan: copy this save's tensors that have scratch buffers
        (non-contiguous ones) into them."""
        for i in p.scratch:
            s = p.specs[i]
            if s.nbytes:
                view = s.buffer.view
                assert view is not None, "a scratch buffer is alloc()'d: mapped here"
                dst = torch.frombuffer(view, dtype=torch.uint8, count=s.nbytes)
                dst.view(tensors[i].dtype).view(tensors[i].shape).copy_(tensors[i])
