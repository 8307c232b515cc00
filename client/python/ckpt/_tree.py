"""What ckpt.torch and the standalone reader ckpt.format share, with torch
and without libckpt: torch's dtypes by ckptd's names, and the references a
saved state dict's pickled tree holds in place of its tensors."""
import torch

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
