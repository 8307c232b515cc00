"""What ckpt.torch and the standalone reader ckpt.format share, with torch
and without libckpt: torch's dtypes by ckptd's names, the references a
saved state dict's pickled tree holds in place of its tensors, and the
step's extra state that carries the tree.

The extra state of a Checkpointer save is a pickled dict, one of:
  {"skeleton": bytes, "leaves": [...], "extra": ...}  (since the save plan: the tree
      pickled once with each non-tensor leaf as a persistent id, its index
      in leaves; a later save of the same tree pickles only the leaves)
  {"tree": tree, "extra": ...}                         (before)
"""
import io
import pickle

import torch

# torch dtype -> ckptd's dtype name ("f32", ...); TORCH_DTYPES: the reverse.
DTYPE_CODES = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
    torch.int8: "i8", torch.uint8: "u8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
    torch.bool: "bool",
}
for _n, _c in (("float8_e4m3fn", "f8e4m3"), ("float8_e5m2", "f8e5m2")):
    if hasattr(torch, _n):
        DTYPE_CODES[getattr(torch, _n)] = _c
TORCH_DTYPES = {v: k for k, v in DTYPE_CODES.items()}


class _Ref:
    """A tensor's place in the pickled tree."""

    def __init__(self, name, dtype, shape):
        self.name, self.dtype, self.shape = name, dtype, tuple(shape)


def _materialize(tree, made):
    if isinstance(tree, _Ref):
        return made[tree.name]
    if isinstance(tree, dict):
        return {k: _materialize(v, made) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_materialize(v, made) for v in tree]
    if isinstance(tree, tuple):
        return tuple(_materialize(v, made) for v in tree)
    return tree


class _Leaf:
    """A non-tensor leaf's place in a skeleton: its index in leaves."""
    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i


class _SkeletonPickler(pickle.Pickler):
    def persistent_id(self, obj):
        """pickle hook: a _Leaf's index as its persistent id; None (pickled
        as usual) for anything else."""
        return obj.i if type(obj) is _Leaf else None


def dump_skeleton(tree):
    """Pickle tree (a state dict's tree with _Ref in place of its tensors
    and _Leaf in place of its other leaves) with the highest protocol,
    each _Leaf as a persistent id (its index in the step's leaves).
    Returns the skeleton bytes; pickle's errors raise."""
    buf = io.BytesIO()
    _SkeletonPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(tree)
    return buf.getvalue()


class _Unpickler(pickle.Unpickler):
    """The tree's references by their old home too (ckpt.torch._Ref, before
    ckpt._tree), without importing ckpt.torch and so libckpt; a
    skeleton's leaves by their index."""

    def __init__(self, data, leaves=None):
        super().__init__(io.BytesIO(data))
        self._leaves = leaves

    def find_class(self, module, name):
        """pickle hook: ckpt.torch._Ref is this module's _Ref (no import of
        ckpt.torch); any other class as pickle finds it."""
        if module == "ckpt.torch" and name == "_Ref":
            return _Ref
        return super().find_class(module, name)

    def persistent_load(self, pid):
        """pickle hook: the leaf at index pid of the leaves given; raises
        pickle.UnpicklingError when none were given or pid is no index."""
        if self._leaves is None or not isinstance(pid, int) or not 0 <= pid < len(self._leaves):
            raise pickle.UnpicklingError(f"skeleton leaf {pid!r} is not in the step's leaves")
        return self._leaves[pid]


def load_meta(blob):
    """Decode a step's extra state: blob, the bytes a Checkpointer save
    stores (the module's text says what). Returns (tree, extra): the state
    dict's tree with _Ref in place of its tensors (_materialize puts them
    in) and the extra the save was given; (None, None) for an empty blob
    or one in no Checkpointer's layout (DCP saves carry none). A blob that
    does not unpickle raises pickle's errors (pickle.UnpicklingError for a
    skeleton leaf missing from leaves). Unpickles: read only checkpoints
    you trust."""
    if not blob:
        return None, None
    meta = _Unpickler(blob).load()
    if isinstance(meta, dict) and "skeleton" in meta:
        return _Unpickler(meta["skeleton"], list(meta.get("leaves") or [])).load(), meta.get("extra")
    if isinstance(meta, dict) and "tree" in meta:
        return meta["tree"], meta.get("extra")
    return None, None
