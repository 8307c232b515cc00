"""The ctypes mirrors of ckpt.h's structs (ckpt/_lib.py) are checked against
libckpt's own layout (ckpt_abi_layout) when the library loads: a field of
another size or place, one missing, or one the C struct lacks is refused
with a sentence naming it."""
import ctypes

from ckpt import _lib


def rows():
    n = ctypes.c_size_t()
    p = _lib.lib.ckpt_abi_layout(ctypes.byref(n))
    return [(p[i].type.decode(), p[i].field.decode() if p[i].field else None, p[i].offset, p[i].size)
            for i in range(n.value)]


def test_the_mirrors_match_the_library():
    got = rows()
    assert {t for t, f, _, _ in got if f is None} == set(_lib.MIRRORS)
    assert _lib.layout_mismatches(got, _lib.MIRRORS) == []


def test_a_wrong_mirror_is_named():
    class Wrong(ctypes.Structure):  # ckpt_save_opts with tier as a 64-bit field and a field C lacks
        _fields_ = [("cuda_stream", ctypes.c_void_p), ("tier", ctypes.c_int64), ("extra", ctypes.c_int)]

    class Short(ctypes.Structure):  # ckpt_hello without policy
        _fields_ = [(f, t) for f, t in _lib._Hello._fields_ if f != "policy"]

    bad = _lib.layout_mismatches(rows(), {"ckpt_save_opts": Wrong, "ckpt_hello": Short})
    text = "; ".join(bad)
    assert "ckpt_save_opts.tier is at 8 (4 bytes) in libckpt, at 8 (8 bytes) in ckpt._lib" in text, text
    assert "ckpt_save_opts.extra is in ckpt._lib's mirror but not in libckpt" in text, text
    assert "ckpt_hello.policy is missing from ckpt._lib's mirror" in text, text
    assert "ckpt_hello is 40 bytes in libckpt, 32 in ckpt._lib" in text, text
