"""ctypes declarations for libckpt (client/include/ckpt/ckpt.h).

libckpt is found, in order, from $CKPT_LIB (a path), next to this package
(libckpt.so*), or on the system library path.
"""
import ctypes
import ctypes.util
import glob
import os

CKPT_LATEST = -1
CKPT_STAGED, CKPT_DURABLE, CKPT_LOADED, CKPT_KEPT, CKPT_REPLICATED = 1, 2, 3, 4, 5
# ckpt_tier (docs/tiers.md "Tiers")
TIERS = {"durable": 0, "memory": 1, "replicated": 2}
TIER_NAMES = {v: k for k, v in TIERS.items()}
# ckpt_setting, of compress and incremental (docs/format.md "Pieces"): as
# the job's configuration says, on, off
CKPT_BY_JOB, CKPT_ON, CKPT_OFF = 0, 1, 2
CKPT_COMPRESS_JOB, CKPT_COMPRESS_ON, CKPT_COMPRESS_OFF = CKPT_BY_JOB, CKPT_ON, CKPT_OFF
CKPT_MAX_DIMS = 8


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_uint32),
        ("global_shape", ctypes.POINTER(ctypes.c_uint64)),
        ("box_offsets", ctypes.POINTER(ctypes.c_uint64)),
        ("box_lengths", ctypes.POINTER(ctypes.c_uint64)),
        ("buffer", ctypes.c_void_p),
        ("offset", ctypes.c_uint64),
        ("nbytes", ctypes.c_uint64),
    ]


class _SaveOpts(ctypes.Structure):
    _fields_ = [("cuda_stream", ctypes.c_void_p), ("tier", ctypes.c_int), ("compress", ctypes.c_int),
                ("incremental", ctypes.c_int)]


class _Hello(ctypes.Structure):
    _fields_ = [
        ("job", ctypes.c_char_p),
        ("rank", ctypes.c_uint32),
        ("world_size", ctypes.c_uint32),
        ("local_rank", ctypes.c_uint32),
        ("attempt_id", ctypes.c_char_p),
        ("policy", ctypes.c_char_p),
    ]


class _StepInfo(ctypes.Structure):
    _fields_ = [
        ("job", ctypes.c_char * 256),
        ("step", ctypes.c_uint64),
        ("complete", ctypes.c_int),
        ("bytes", ctypes.c_uint64),
        ("ranks_present", ctypes.c_uint32),
        ("world_size", ctypes.c_uint32),
        ("attempt_id", ctypes.c_char * 128),
        ("bytes_unlisted", ctypes.c_int),
        ("saved_unix_ns", ctypes.c_int64),
        ("tier", ctypes.c_char * 16),
        ("where", ctypes.c_char * 128),
    ]


class _HeldInfo(ctypes.Structure):
    _fields_ = [
        ("job", ctypes.c_char * 256),
        ("rank", ctypes.c_uint32),
        ("world_size", ctypes.c_uint32),
        ("step", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("attempt_id", ctypes.c_char * 128),
        ("tier", ctypes.c_int),
        ("durable", ctypes.c_int),
        ("peer", ctypes.c_char * 128),
    ]


class _TensorInfo(ctypes.Structure):
    _fields_ = [
        ("rank", ctypes.c_uint32),
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_uint32),
        ("global_shape", ctypes.c_uint64 * CKPT_MAX_DIMS),
        ("box_offsets", ctypes.c_uint64 * CKPT_MAX_DIMS),
        ("box_lengths", ctypes.c_uint64 * CKPT_MAX_DIMS),
        ("shard_offset", ctypes.c_uint64),
        ("nbytes", ctypes.c_uint64),
        ("crc32c", ctypes.c_uint32),
    ]


class _StepDetail(ctypes.Structure):
    _fields_ = [
        ("info", _StepInfo),
        ("ntensors", ctypes.c_size_t),
        ("tensors", ctypes.POINTER(_TensorInfo)),
    ]


FUTURE_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p)

# The C structs the classes above mirror (ckpt.h), checked against the
# library's own layout when it is loaded (ckpt_abi_layout).
MIRRORS = {"ckpt_hello": _Hello, "ckpt_tensor": _Tensor, "ckpt_save_opts": _SaveOpts, "ckpt_step_info": _StepInfo,
           "ckpt_held_info": _HeldInfo, "ckpt_tensor_info": _TensorInfo, "ckpt_step_detail": _StepDetail}


class _AbiField(ctypes.Structure):
    _fields_ = [("type", ctypes.c_char_p), ("field", ctypes.c_char_p), ("offset", ctypes.c_size_t),
                ("size", ctypes.c_size_t)]


def layout_mismatches(rows, mirrors):
    """What differs between C's layout (rows: (type, field or None,
    offset, size), as ckpt_abi_layout gives them) and the ctypes mirrors
    (type name -> Structure class): a list of sentences, empty when they
    agree. Every mirrored struct and field must be in rows, and every row
    of a mirrored struct in its mirror."""
    bad = []
    seen = {name: set() for name in mirrors}
    for type_, field, offset, size in rows:
        cls = mirrors.get(type_)
        if cls is None:
            continue
        if field is None:
            if ctypes.sizeof(cls) != size:
                bad.append(f"{type_} is {size} bytes in libckpt, {ctypes.sizeof(cls)} in ckpt._lib")
            continue
        seen[type_].add(field)
        desc = getattr(cls, field, None)
        if desc is None:
            bad.append(f"{type_}.{field} is missing from ckpt._lib's mirror")
        elif (desc.offset, desc.size) != (offset, size):
            bad.append(f"{type_}.{field} is at {offset} ({size} bytes) in libckpt, at {desc.offset} "
                       f"({desc.size} bytes) in ckpt._lib")
    for name, cls in mirrors.items():
        for f in cls._fields_:
            if f[0] not in seen[name]:
                bad.append(f"{name}.{f[0]} is in ckpt._lib's mirror but not in libckpt")
    return bad


def _check_layout(lib):
    """ImportError unless libckpt's structs are laid out as the mirrors say
    (a libckpt of another version than this package would read and write
    the wrong bytes)."""
    try:
        fn = lib.ckpt_abi_layout
    except AttributeError:
        raise ImportError("libckpt has no ckpt_abi_layout: it is older than this ckpt package; "
                          "install both from one build (or point CKPT_LIB at a matching one)") from None
    fn.restype = ctypes.POINTER(_AbiField)
    fn.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
    n = ctypes.c_size_t()
    p = fn(ctypes.byref(n))
    rows = [(p[i].type.decode(), p[i].field.decode() if p[i].field else None, p[i].offset, p[i].size)
            for i in range(n.value)]
    bad = layout_mismatches(rows, MIRRORS)
    if bad:
        raise ImportError("libckpt and the ckpt package disagree on the C structs' layout (install both from one "
                          "build): " + "; ".join(bad))


def _find():
    env = os.environ.get("CKPT_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for pat in ("libckpt.so", "libckpt.so.*"):
        hits = sorted(glob.glob(os.path.join(here, pat)))
        if hits:
            return hits[0]
    found = ctypes.util.find_library("ckpt")
    return found or "libckpt.so.2"


def _load():
    path = _find()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(
            f"cannot load libckpt ({path}): {e}; set CKPT_LIB to its path") from e
    vp, i, u64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_size_t
    sig = {
        "ckpt_connect": (i, [ctypes.c_char_p, ctypes.POINTER(_Hello), ctypes.POINTER(vp)]),
        "ckpt_delete": (i, [vp, ctypes.c_char_p, u64]),
        "ckpt_delete_flags": (i, [vp, ctypes.c_char_p, u64, ctypes.c_uint]),
        "ckpt_close": (None, [vp]),
        "ckpt_buffer_alloc": (i, [vp, sz, ctypes.POINTER(vp)]),
        "ckpt_buffer_register_fd": (i, [vp, i, sz, ctypes.POINTER(vp)]),
        "ckpt_buffer_register_fds": (i, [vp, ctypes.POINTER(i), ctypes.POINTER(sz), sz, ctypes.POINTER(vp)]),
        "ckpt_buffer_data": (vp, [vp]),
        "ckpt_buffer_size": (sz, [vp]),
        "ckpt_buffer_free": (None, [vp]),
        "ckpt_save": (i, [vp, u64, ctypes.POINTER(_Tensor), sz, vp, sz, ctypes.POINTER(vp)]),
        "ckpt_save_ex": (i, [vp, u64, ctypes.POINTER(_Tensor), sz, vp, sz, ctypes.POINTER(_SaveOpts),
                             ctypes.POINTER(vp)]),
        "ckpt_table_create": (i, [vp, ctypes.POINTER(_Tensor), sz, ctypes.POINTER(vp)]),
        "ckpt_save_table": (i, [vp, u64, vp, vp, sz, ctypes.POINTER(vp)]),
        "ckpt_save_table_ex": (i, [vp, u64, vp, vp, sz, ctypes.POINTER(_SaveOpts), ctypes.POINTER(vp)]),
        "ckpt_persist": (i, [vp, ctypes.c_char_p, u64, ctypes.POINTER(vp)]),
        "ckpt_persist_ex": (i, [vp, ctypes.c_char_p, u64, ctypes.c_uint, ctypes.POINTER(vp)]),
        "ckpt_held": (i, [vp, ctypes.c_char_p, i, ctypes.POINTER(ctypes.POINTER(_HeldInfo)), ctypes.POINTER(sz)]),
        "ckpt_future_replicas": (ctypes.c_uint32, [vp]),
        "ckpt_table_free": (None, [vp]),
        "ckpt_register_cuda": (i, [vp, u64, sz, ctypes.POINTER(vp)]),
        "ckpt_cuda_available": (i, [ctypes.c_char_p, sz]),
        "ckpt_cuda_identity": (i, [u64, sz, ctypes.POINTER(u64)]),
        "ckpt_cuda_allocation": (i, [u64, ctypes.POINTER(u64), ctypes.POINTER(u64)]),
        "ckpt_load": (i, [vp, ctypes.c_int64, ctypes.POINTER(_Tensor), sz, ctypes.POINTER(vp)]),
        "ckpt_future_wait": (i, [vp, i, i]),
        "ckpt_future_poll": (i, [vp, i]),
        "ckpt_future_message": (ctypes.c_char_p, [vp]),
        "ckpt_future_bytes": (u64, [vp]),
        "ckpt_future_stall_ns": (u64, [vp]),
        "ckpt_future_step": (u64, [vp]),
        "ckpt_future_extra": (vp, [vp, ctypes.POINTER(sz)]),
        "ckpt_future_source": (ctypes.c_char_p, [vp]),
        "ckpt_future_peer": (ctypes.c_char_p, [vp]),
        "ckpt_future_tensor_source": (ctypes.c_char_p, [vp, sz, ctypes.POINTER(ctypes.c_char_p)]),
        "ckpt_future_set_callback": (i, [vp, FUTURE_CB, vp]),
        "ckpt_future_free": (None, [vp]),
        "ckpt_list": (i, [vp, ctypes.c_char_p, ctypes.POINTER(ctypes.POINTER(_StepInfo)), ctypes.POINTER(sz)]),
        "ckpt_resolve": (i, [vp, ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(_StepInfo)]),
        "ckpt_wait_complete": (i, [vp, ctypes.c_char_p, u64, ctypes.c_int64, ctypes.POINTER(_StepInfo)]),
        "ckpt_show": (i, [vp, ctypes.c_char_p, u64, ctypes.POINTER(ctypes.POINTER(_StepDetail))]),
        "ckpt_show_rank": (i, [vp, ctypes.c_char_p, u64, ctypes.c_uint32, ctypes.POINTER(ctypes.POINTER(_StepDetail))]),
        "ckpt_step_detail_free": (None, [vp]),
        "ckpt_strerror": (ctypes.c_char_p, [i]),
        "ckpt_errmsg": (ctypes.c_char_p, []),
    }
    _check_layout(lib)
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [vp]
    libc.free.restype = None
    return lib, libc


lib, libc = _load()
