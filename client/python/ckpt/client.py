"""The raw binding: ckpt.Client over libckpt. Futures are
concurrent.futures.Future objects completed from libckpt's reader thread;
callbacks added to them run on that thread, so they must be short and must
not wait for another future of the same client."""
from __future__ import annotations

import atexit
import concurrent.futures
import ctypes
import errno as _errno
import os
import struct
import threading
import weakref
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

from ._lib import (CKPT_COMPRESS_JOB, CKPT_COMPRESS_OFF, CKPT_COMPRESS_ON, CKPT_DURABLE, CKPT_KEPT, CKPT_LATEST,
                   CKPT_LOADED, CKPT_REPLICATED, CKPT_STAGED, FUTURE_CB, TIER_NAMES, TIERS, _HeldInfo, _Hello, _SaveOpts, _StepDetail, _StepInfo, _Tensor, lib, libc)

LATEST = CKPT_LATEST

from ._dtypes import DTYPE_NAMES, DTYPES  # noqa: E402,F401 (proto/ckpt.proto DType values)


class CkptError(OSError):
    """A libckpt or ckptd error: .errno and the daemon's message."""


class DaemonUnavailable(CkptError):
    """No ckptd answers on the socket (not running, or wrong path)."""


class Superseded(CkptError):
    """A save replaced by a newer one under the coalesce policy."""


class NotReplicated(CkptError):
    """A replicated save that no peer (or fewer than asked) holds; the save
    itself is kept in this node's daemon all the same."""


# A CkptError with one of these means the daemon is gone, not that one
# request was refused: raised, never worked around (ckpt.torch).
_CONNECTION_ERRNOS = frozenset((_errno.EPIPE, _errno.ECONNRESET, _errno.ENOTCONN, _errno.EBADF, _errno.ECONNREFUSED,
                                _errno.ENOENT, _errno.ECANCELED))


def _tier(tier):
    """"durable", "memory" or "replicated" (or its number) as ckpt_tier."""
    if isinstance(tier, str) and tier in TIERS:
        return TIERS[tier]
    if isinstance(tier, int) and tier in TIER_NAMES:
        return tier
    raise ValueError(f"tier {tier!r}: want one of {', '.join(TIERS)}")


def _setting(value: Optional[bool], name: str = "compress") -> int:
    """compress= or incremental= as ckpt_setting: None, the job's
    configuration; True, on; False, off."""
    if value is None:
        return CKPT_COMPRESS_JOB
    if value is True or value is False:
        return CKPT_COMPRESS_ON if value else CKPT_COMPRESS_OFF
    raise ValueError(f"{name}={value!r}: want None (as the job's configuration says), True or False")


def _compress(compress: Optional[bool]) -> int:
    """compress= as ckpt_setting."""
    return _setting(compress, "compress")


def _phases(tier):
    """The phases a save of tier reaches, its last one last."""
    return {0: (CKPT_STAGED, CKPT_DURABLE), 1: (CKPT_STAGED, CKPT_KEPT),
            2: (CKPT_STAGED, CKPT_KEPT, CKPT_REPLICATED)}[tier]


def _error(rc, msg=None, what=None):
    code = -rc if rc < 0 else rc
    text = lib.ckpt_strerror(rc).decode()
    if msg is None:
        m = lib.ckpt_errmsg()
        msg = m.decode() if m else ""
    full = f"{what}: {text}" if what else text
    if msg:
        full += f" ({msg})"
    if code == _errno.ECANCELED:
        return Superseded(code, full)
    return CkptError(code, full)


def cuda_available() -> Tuple[bool, str]:
    """(True, "") when this process can register CUDA memory with libckpt,
    else (False, why): no driver library, a stub library, no device ..."""
    why = ctypes.create_string_buffer(256)
    ok = lib.ckpt_cuda_available(why, len(why))
    return bool(ok), why.value.decode(errors="replace")


def cuda_identity(ptr: int, nbytes: int) -> int:
    """The identity of the device memory behind [ptr, ptr+nbytes): an int
    that changes when any allocation the range spans is freed and made
    again, even at the same address (ckpt_cuda_identity). CkptError(EINVAL)
    for memory that is not mapped device memory, ENOTSUP without CUDA."""
    out = ctypes.c_uint64()
    rc = lib.ckpt_cuda_identity(int(ptr), nbytes, ctypes.byref(out))
    if rc < 0:
        raise _error(rc, what="CUDA identity")
    return out.value


def cuda_allocation(ptr: int) -> Tuple[int, int, bool]:
    """(start, size, legacy) of the device allocation holding ptr
    (ckpt_cuda_allocation): legacy is True for cudaMalloc memory, which
    one registration of the whole allocation serves, False for VMM memory.
    CkptError(EINVAL) for memory that is not device memory."""
    start, size = ctypes.c_uint64(), ctypes.c_uint64()
    rc = lib.ckpt_cuda_allocation(int(ptr), ctypes.byref(start), ctypes.byref(size))
    if rc < 0:
        raise _error(rc, what="CUDA allocation")
    return start.value, size.value, rc == 1


class Buffer:
    """A host buffer registered with the daemon. For alloc()'d buffers,
    .view is a writable memoryview of its bytes."""

    def __init__(self, client: Client, handle: ctypes.c_void_p, nbytes: int, mapped: bool) -> None:
        self._client = client
        self._h: Optional[ctypes.c_void_p] = handle
        self.size = nbytes
        self.address = lib.ckpt_buffer_data(handle) if mapped else None
        self.view: Optional[memoryview] = None
        self._arr: Any = None
        if self.address:
            arr = (ctypes.c_uint8 * nbytes).from_address(self.address)
            self.view = memoryview(arr).cast("B")
            self._arr = arr

    def free(self) -> None:
        """Unregister the buffer (saves in flight keep the daemon's own
        reference) and unmap it; idempotent."""
        if self._h:
            self.view = None
            self._arr = None
            lib.ckpt_buffer_free(self._h)
            self._h = None
            self._client._buffers.discard(self)


class TensorSpec:
    """One tensor (or box of one) in a buffer, for save and load."""
    __slots__ = ("name", "dtype", "shape", "offsets", "lengths", "buffer", "offset", "nbytes")

    def __init__(self, name: str, dtype: Union[str, int], shape: Sequence[int], buffer: Buffer, offset: int,
                 nbytes: int, offsets: Optional[Sequence[int]] = None, lengths: Optional[Sequence[int]] = None) -> None:
        self.name, self.dtype, self.shape = name, dtype, tuple(map(int, shape))
        self.offsets = tuple(offsets) if offsets is not None else None
        self.lengths = tuple(lengths) if lengths is not None else None
        self.buffer, self.offset, self.nbytes = buffer, offset, nbytes


# ckpt_tensor's layout (ckpt.h), packed directly: building 10,000 ctypes
# structures and arrays one by one cost about 10 us each.
_TENSOR_ROW = struct.Struct("=QiIQQQQQQ")
assert _TENSOR_ROW.size == ctypes.sizeof(_Tensor), "ckpt_tensor changed: update _TENSOR_ROW"


def _tensor_array(specs):
    """A ckpt_tensor array for specs, and what must stay alive while libckpt
    reads it (the names and the dims it points into)."""
    n = len(specs)
    names = ctypes.create_string_buffer(b"".join(s.name.encode() + b"\0" for s in specs) or b"\0")
    dims = []
    for s in specs:
        nd = len(s.shape)
        dims += s.shape
        dims += s.offsets or (0,) * nd
        dims += s.lengths or s.shape
    dimarr = (ctypes.c_uint64 * max(1, len(dims)))(*dims)
    raw = bytearray(_TENSOR_ROW.size * max(1, n))
    name_at, dim_at = ctypes.addressof(names), ctypes.addressof(dimarr)
    pack = _TENSOR_ROW.pack_into
    for i, s in enumerate(specs):
        code = DTYPES[s.dtype] if isinstance(s.dtype, str) else int(s.dtype)
        nd = len(s.shape)
        pack(raw, i * _TENSOR_ROW.size, name_at, code, nd, dim_at, dim_at + 8 * nd, dim_at + 16 * nd,
             s.buffer._h.value, s.offset, s.nbytes)
        name_at += len(s.name.encode()) + 1
        dim_at += 24 * nd
    arr = (_Tensor * max(1, n)).from_buffer(raw)
    return arr, (names, dimarr, raw)


class Table:
    """A declared tensor table (ckpt_table_create): the daemon checked its
    tensors once; Client.save_table sends only a step. Its buffers must
    stay registered until free()."""

    def __init__(self, client: Client, handle: ctypes.c_void_p, n: int) -> None:
        self._client = client
        self._h: Optional[ctypes.c_void_p] = handle
        self.size = n

    def free(self) -> None:
        """Drop the table in the daemon (ckpt_table_free); idempotent."""
        if self._h:
            lib.ckpt_table_free(self._h)
            self._h = None
            self._client._tables.discard(self)


class PhaseFuture(concurrent.futures.Future):
    """One phase of a save or load (staged, kept, replicated, durable,
    loaded): a concurrent.futures.Future that also remembers whether its
    outcome was seen, that is whether result() or exception() was called
    once it had completed. ckpt.torch.Checkpointer raises, at the next
    save, wait() or close(), the failures that nobody saw."""

    seen = False

    def result(self, timeout: Optional[float] = None) -> Any:
        """concurrent.futures.Future.result, which also marks the outcome seen."""
        try:
            return super().result(timeout)
        finally:
            if self.done():
                self.seen = True

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """concurrent.futures.Future.exception, which also marks the outcome seen."""
        e = super().exception(timeout)
        self.seen = True
        return e


_live: Set[Any] = set()  # native futures not yet finished: they must outlive their callback
_live_lock = threading.Lock()


class _NativeFuture:
    """Owns one ckpt_future and completes Python futures from its callback.
    It stays referenced from _live until every phase is done, so neither the
    garbage collector nor a dropped SaveFuture can free the callback while
    libckpt's reader thread may still call it."""

    def __init__(self, handle, phases):
        self._h = handle
        self.futures = {p: PhaseFuture() for p in phases}
        for f in self.futures.values():
            f.set_running_or_notify_cancel()
        self._lock = threading.Lock()
        self._last = max(phases)
        self.stall_ns = None  # a save's, once staged: the daemon's own time to staged
        self._cb = FUTURE_CB(self._on_phase)
        with _live_lock:
            _live.add(self)
        rc = lib.ckpt_future_set_callback(handle, self._cb, None)
        if rc < 0:
            with _live_lock:
                _live.discard(self)
            raise _error(rc, what="set callback")

    def _value(self, phase):
        if phase == CKPT_LOADED:
            n = ctypes.c_size_t()
            p = lib.ckpt_future_extra(self._h, ctypes.byref(n))
            extra = ctypes.string_at(p, n.value) if p and n.value else b""
            src = (lib.ckpt_future_source(self._h) or b"").decode()
            per = {}
            i = 0
            while True:
                nm = ctypes.c_char_p()
                s = lib.ckpt_future_tensor_source(self._h, i, ctypes.byref(nm))
                if not s:
                    break
                per[nm.value.decode()] = s.decode()
                i += 1
            return {"step": lib.ckpt_future_step(self._h), "bytes": lib.ckpt_future_bytes(self._h),
                    "extra": extra, "source": src, "sources": per,
                    "peer": (lib.ckpt_future_peer(self._h) or b"").decode()}
        return lib.ckpt_future_bytes(self._h)

    def _on_phase(self, fut, phase, status, user):
        with self._lock:
            if phase == CKPT_REPLICATED and status < 0 and phase in self.futures:
                # Not replicated: only that phase fails; the save is kept.
                msg = (lib.ckpt_future_message(self._h) or b"").decode()
                code = -status
                f = self.futures[phase]
                if not f.done():
                    f.set_exception(NotReplicated(code, f"{lib.ckpt_strerror(status).decode()} ({msg})"))
            elif status < 0:
                msg = (lib.ckpt_future_message(self._h) or b"").decode()
                exc = _error(status, msg)
                for f in self.futures.values():
                    if not f.done():
                        f.set_exception(exc)
            elif phase in self.futures and not self.futures[phase].done():
                if phase == CKPT_STAGED:
                    self.stall_ns = lib.ckpt_future_stall_ns(self._h)
                self.futures[phase].set_result(self._value(phase))
            done = all(f.done() for f in self.futures.values())
        if done:
            self._release()
            with _live_lock:
                _live.discard(self)

    def _release(self):
        with self._lock:
            h, self._h = self._h, None
        if h:
            lib.ckpt_future_free(h)

    def __del__(self):
        # Completed futures free themselves; an abandoned one is freed here.
        try:
            self._release()
        except Exception:
            pass


class SaveFuture:
    """.staged, .kept, .replicated and .durable are concurrent.futures.Future
    objects, or None for a phase this save's tier never reaches (docs/tiers.md
    "Tiers"): a durable save is staged, then durable; a memory save staged,
    then kept (held by the daemon, restorable; persist() makes it
    durable); a replicated save staged, kept, then replicated (which fails
    with NotReplicated, and only it, when no peer holds a copy)."""

    def __init__(self, native: Any, step: int, tier: int = 0) -> None:
        self._native = native
        self.step = step
        self.tier = TIER_NAMES[tier]
        self.staged = native.futures.get(CKPT_STAGED)
        self.kept = native.futures.get(CKPT_KEPT)
        self.replicated = native.futures.get(CKPT_REPLICATED)
        self.durable = native.futures.get(CKPT_DURABLE)

    @property
    def daemon_stall(self) -> Optional[float]:
        """Seconds the daemon took from the request to staged (None before
        staged): the trainer's wait less this is the client's own share."""
        ns = self._native.stall_ns
        return None if ns is None else ns / 1e9

    def result(self, timeout: Optional[float] = None) -> int:
        """Wait until the save is safe at its tier (durable, or kept) and
        return its bytes; a replicated save also waits for its peers'
        answer (not being replicated does not raise here: .replicated
        says why)."""
        if self.durable is not None:
            return self.durable.result(timeout)
        n = self.kept.result(timeout)
        if self.replicated is not None:
            concurrent.futures.wait([self.replicated], timeout)
        return n


class LoadFuture:
    """.loaded, a concurrent.futures.Future of a load's result: a dict
    with step, bytes, extra (the step's extra bytes), source, sources (per
    tensor) and peer. source says where this load's bytes came from:
    "memory" (this node's ckptd), "peer" (a copy from a peer ckptd's
    memory, brought back for this load or by a show just before it, as
    Checkpointer.load runs one: the first load that reads the copy says
    "peer", later ones "memory"), "storage", or "mixed"; peer names the
    peer(s) ("HOST:PORT", comma-separated) when a source is "peer", else
    ""."""

    def __init__(self, native: Any) -> None:
        self._native = native
        self.loaded = native.futures[CKPT_LOADED]

    def result(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Wait for the load; its result dict, or raise CkptError."""
        return self.loaded.result(timeout)


# Open clients, closed at exit: before the interpreter finalizes, while
# libckpt's reader thread can still run a callback (one that wanted the GIL
# during finalization would never return, and a close from __del__ would
# then wait for it forever: a script that ends without close() hung).
_clients: weakref.WeakSet[Client] = weakref.WeakSet()


@atexit.register
def _close_clients():
    for c in list(_clients):
        try:
            c.close()
        except Exception:
            pass


def default_socket() -> str:
    """The socket a Client uses without socket=: $CKPTD_SOCKET, else
    /run/ckptd/ckptd.sock (the systemd unit's and the DaemonSet's)."""
    return os.environ.get("CKPTD_SOCKET") or "/run/ckptd/ckptd.sock"


def _connect_error(rc, path, job, given):
    """The error for a failed ckpt_connect, saying what is wrong and what
    to do: no daemon (DaemonUnavailable: whether the socket file exists,
    how to start one and how to point at another), no permission, or a
    job name the daemon refused (the name's fault, not the socket's)."""
    code = -rc
    m = lib.ckpt_errmsg()
    msg = m.decode() if m else ""
    where = ("given as socket=" if given else "from $CKPTD_SOCKET" if os.environ.get("CKPTD_SOCKET")
             else "the default path; $CKPTD_SOCKET is unset")
    point = (f"start one for this machine (ckptd --socket {path} --storage file:///DIR --staging-bytes 2G "
             "--state-dir DIR2) or point at a running one with socket=PATH or $CKPTD_SOCKET; "
             "Checkpointer(..., fallback_dir=DIR) saves with torch.save instead")
    if code in (_errno.ENOENT, _errno.ENOTDIR):
        return DaemonUnavailable(code, f"ckptd is not running at {path} ({where}): that socket does not exist; "
                                 + point)
    if code == _errno.ECONNREFUSED:
        return DaemonUnavailable(code, f"ckptd is not running at {path} ({where}): the socket file exists but "
                                 "nothing listens on it (the daemon stopped or crashed); " + point)
    if code == _errno.EINVAL and "job name" in msg:
        return CkptError(code, f"job {job!r} refused by ckptd: {msg}")
    if code == _errno.EACCES:
        return CkptError(code, f"ckptd at {path} refused this process: {msg or 'permission denied'} "
                         "(it admits its own uid and root unless allowed_uids/allowed_gids say more)")
    return _error(rc, msg, what=f"connect {path}")


def _step_dict(s: Any) -> Dict[str, Any]:
    """A ckpt_step_info as list() and wait_complete() give it."""
    return {"job": s.job.decode(), "step": s.step, "complete": bool(s.complete),
            "bytes": None if s.bytes_unlisted else s.bytes, "ranks_present": s.ranks_present,
            "world_size": s.world_size, "attempt_id": s.attempt_id.decode(),
            "saved_unix_ns": s.saved_unix_ns, "tier": s.tier.decode() or "durable",
            "where": s.where.decode() or "storage"}


class Client:
    """A connection to ckptd. job=None makes a control session (list, show)."""

    def __init__(self, socket: Optional[str] = None, job: Optional[str] = None, rank: int = 0, world_size: int = 1,
                 local_rank: int = 0, attempt_id: Optional[str] = None, policy: Optional[str] = None) -> None:
        """Connect to ckptd at socket (default $CKPTD_SOCKET, else
        /run/ckptd/ckptd.sock) as rank of world_size of job (None: a
        control session). Raises DaemonUnavailable when no ckptd listens
        there (saying whether the socket exists and how to start or find
        one), CkptError(EINVAL) for a job name the daemon refuses (naming
        the rule), CkptError(EACCES) for a process it does not admit."""
        self.socket = socket or default_socket()
        self.job, self.rank, self.world_size = job, rank, world_size
        self.attempt_id = attempt_id  # None: libckpt's default (its launcher's id)
        h = _Hello(job.encode() if job else None, rank, world_size, local_rank,
                   attempt_id.encode() if attempt_id else None, policy.encode() if policy else None)
        handle = ctypes.c_void_p()
        rc = lib.ckpt_connect(self.socket.encode(), ctypes.byref(h), ctypes.byref(handle))
        if rc < 0:
            raise _connect_error(rc, self.socket, job, socket is not None)
        self._h: Optional[ctypes.c_void_p] = handle
        self._buffers: Set[Buffer] = set()  # sets: 10,000 frees from a list cost 50 million compares
        self._tables: Set[Table] = set()
        _clients.add(self)

    def _handle(self):
        if not self._h:
            raise CkptError(_errno.EBADF, "client is closed")
        return self._h

    def alloc(self, nbytes: int) -> Buffer:
        """A new sealed memfd of nbytes, mapped here and registered with
        the daemon: a Buffer whose .view is writable."""
        out = ctypes.c_void_p()
        rc = lib.ckpt_buffer_alloc(self._handle(), nbytes, ctypes.byref(out))
        if rc < 0:
            raise _error(rc, what=f"allocate a {nbytes}-byte buffer")
        b = Buffer(self, out, nbytes, True)
        self._buffers.add(b)
        return b

    def register_fd(self, fd: int, nbytes: int) -> Buffer:
        """Register nbytes of a memfd or /dev/shm file the caller has (the
        daemon keeps its own dup): a Buffer."""
        out = ctypes.c_void_p()
        rc = lib.ckpt_buffer_register_fd(self._handle(), fd, nbytes, ctypes.byref(out))
        if rc < 0:
            raise _error(rc, what="register buffer")
        b = Buffer(self, out, nbytes, False)
        self._buffers.add(b)
        return b

    def register_fds(self, fds: Sequence[int], sizes: Sequence[int]) -> List[Buffer]:
        """register_fd for many files at once (ckpt_buffer_register_fds: one
        round trip per 128); all or none."""
        n = len(fds)
        if n == 0:
            return []
        out = (ctypes.c_void_p * n)()
        rc = lib.ckpt_buffer_register_fds(self._handle(), (ctypes.c_int * n)(*fds), (ctypes.c_size_t * n)(*sizes), n,
                                          out)
        if rc < 0:
            raise _error(rc, what=f"register {n} buffers")
        bufs = [Buffer(self, ctypes.c_void_p(out[i]), sizes[i], False) for i in range(n)]
        self._buffers.update(bufs)
        return bufs

    def register_cuda(self, ptr: int, nbytes: int) -> Buffer:
        """Register nbytes of device memory at ptr (an int: tensor.data_ptr(),
        cudaMalloc's pointer). CkptError(ENOTSUP) when CUDA is off here or in
        the daemon."""
        out = ctypes.c_void_p()
        rc = lib.ckpt_register_cuda(self._handle(), int(ptr), nbytes, ctypes.byref(out))
        if rc < 0:
            raise _error(rc, what="register CUDA buffer")
        b = Buffer(self, out, nbytes, False)
        self._buffers.add(b)
        return b

    def save(self, step: int, specs: Sequence[TensorSpec], extra: bytes = b"", cuda_stream: Optional[int] = None,
             tier: str = "durable", compress: Optional[bool] = None,
             incremental: Optional[bool] = None) -> SaveFuture:
        """cuda_stream: the CUstream (an int, torch's .cuda_stream) whose
        work the daemon's copies of CUDA buffers wait for; None: the legacy
        default stream. tier: "durable", "memory" or "replicated" (docs/tiers.md
        "Tiers"). compress: whether the daemon stores the shard compressed
        (lossless; docs/format.md "Pieces"): None as the job's
        configuration says ([pool] or [job.NAME] compress), True or False.
        incremental: whether pieces unchanged since this rank's previous
        durable step are stored as references to it (docs/format.md
        "Pieces"), as compress."""
        t = _tier(tier)
        z = _compress(compress)
        inc = _setting(incremental, "incremental")
        arr, keep = _tensor_array(specs)
        fut = ctypes.c_void_p()
        ex = ctypes.create_string_buffer(extra, len(extra)) if extra else None
        opts = _SaveOpts(ctypes.c_void_p(cuda_stream or None), t, z, inc)
        rc = lib.ckpt_save_ex(self._handle(), step, arr, len(specs), ex, len(extra or b""), ctypes.byref(opts),
                              ctypes.byref(fut))
        del keep
        if rc < 0:
            raise _error(rc, what=f"save step {step}")
        return SaveFuture(_NativeFuture(fut, _phases(t)), step, t)

    def table(self, specs: Sequence[TensorSpec]) -> Table:
        """Declare specs (host buffers only) as a table. CkptError(ENOTSUP)
        from a daemon without tables, or for CUDA buffers."""
        arr, keep = _tensor_array(specs)
        out = ctypes.c_void_p()
        rc = lib.ckpt_table_create(self._handle(), arr, len(specs), ctypes.byref(out))
        del keep
        if rc < 0:
            raise _error(rc, what=f"declare a table of {len(specs)} tensors")
        t = Table(self, out, len(specs))
        self._tables.add(t)
        return t

    def save_table(self, step: int, table: Table, extra: bytes = b"", tier: str = "durable",
                   compress: Optional[bool] = None, incremental: Optional[bool] = None) -> SaveFuture:
        """Save step from a table's tensors (Client.table); tier, compress
        and incremental as save's."""
        t = _tier(tier)
        z = _compress(compress)
        inc = _setting(incremental, "incremental")
        if not table._h:
            raise CkptError(_errno.EBADF, "the table was freed")
        fut = ctypes.c_void_p()
        ex = ctypes.create_string_buffer(extra, len(extra)) if extra else None
        opts = _SaveOpts(None, t, z, inc)
        rc = lib.ckpt_save_table_ex(self._handle(), step, table._h, ex, len(extra or b""), ctypes.byref(opts),
                                    ctypes.byref(fut))
        if rc < 0:
            raise _error(rc, what=f"save step {step}")
        return SaveFuture(_NativeFuture(fut, _phases(t)), step, t)

    def persist(self, step: int, job: Optional[str] = None, replicas: bool = False) -> SaveFuture:
        """Make step of job (default: this client's) durable: every copy of
        it this node's daemon holds in memory only is uploaded, and stays
        held. Returns a SaveFuture whose .durable (and result()) completes
        once all of them are, or raises (CkptError ENOENT when none is held
        here). Every node's ranks ask their own daemon. replicas=True also
        uploads the copies it holds for peers (a lost node's ranks); a rank
        already in storage counts as durable."""
        fut = ctypes.c_void_p()
        rc = lib.ckpt_persist_ex(self._handle(), job.encode() if job else None, int(step), 1 if replicas else 0,
                                 ctypes.byref(fut))
        if rc < 0:
            raise _error(rc, what=f"persist step {step}")
        return SaveFuture(_NativeFuture(fut, (CKPT_DURABLE,)), int(step))

    def held(self, job: Optional[str] = None, all_ranks: bool = False) -> List[Dict[str, Any]]:
        """The copies this node's daemon holds in memory of job (default:
        this client's), for this client's rank (or every rank): dicts with
        job, rank, world_size, step, bytes, attempt_id, tier ("durable",
        "memory", "replicated"), durable (in storage too) and peer ("", or
        the peer daemon that holds this node's replica of it, with peer
        replication). No storage request."""
        out = ctypes.POINTER(_HeldInfo)()
        n = ctypes.c_size_t()
        rc = lib.ckpt_held(self._handle(), job.encode() if job else None, 1 if all_ranks else 0,
                           ctypes.byref(out), ctypes.byref(n))
        if rc < 0:
            raise _error(rc, what="held")
        res = [{"job": out[i].job.decode(), "rank": out[i].rank, "world_size": out[i].world_size,
                "step": out[i].step, "bytes": out[i].bytes, "attempt_id": out[i].attempt_id.decode(),
                "tier": TIER_NAMES.get(out[i].tier, "?"), "durable": bool(out[i].durable),
                "peer": out[i].peer.decode()}
               for i in range(n.value)]
        if out:
            libc.free(ctypes.cast(out, ctypes.c_void_p))
        return res

    def load(self, specs: Sequence[TensorSpec], step: int = LATEST) -> LoadFuture:
        """Load step (default: the latest complete one) into the buffers
        the TensorSpecs name (their offsets and lengths: the box to read);
        a LoadFuture."""
        arr, keep = _tensor_array(specs)
        fut = ctypes.c_void_p()
        rc = lib.ckpt_load(self._handle(), step, arr, len(specs), ctypes.byref(fut))
        del keep
        if rc < 0:
            raise _error(rc, what="load")
        return LoadFuture(_NativeFuture(fut, (CKPT_LOADED,)))

    def list(self, job: Optional[str] = None) -> List[Dict[str, Any]]:
        """The steps of job (default: every job) in storage and in this
        daemon's memory: dicts with job, step, complete, bytes (None when
        the listing does not say), ranks_present, world_size, attempt_id,
        saved_unix_ns, tier and where ("storage" or "memory")."""
        out = ctypes.POINTER(_StepInfo)()
        n = ctypes.c_size_t()
        rc = lib.ckpt_list(self._handle(), job.encode() if job else None, ctypes.byref(out), ctypes.byref(n))
        if rc < 0:
            raise _error(rc, what="list")
        res = [_step_dict(out[i]) for i in range(n.value)]
        if out:
            libc.free(ctypes.cast(out, ctypes.c_void_p))
        return res

    def wait_complete(self, step: int, job: Optional[str] = None,
                      timeout: Optional[float] = None) -> Dict[str, Any]:
        """Wait until step of job (default: this client's) is complete in
        storage (every rank's manifest of one attempt), and pin it as
        resolve() does; its dict, as list() gives it. Every waiter of the
        step on one node shares the daemon's one poll of storage, so call
        this on every rank instead of polling list(). timeout: seconds
        (None: no limit; 0: look once); CkptError ETIMEDOUT when the step
        is not complete in time, saying how far it got."""
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be None or >= 0 seconds, not {timeout!r}")
        # No limit: None, or more than the daemon's 49 days.
        ms = -1 if timeout is None or timeout * 1000 >= 2**32 - 1 else int(timeout * 1000)
        info = _StepInfo()
        rc = lib.ckpt_wait_complete(self._handle(), job.encode() if job else None, int(step), ms,
                                    ctypes.byref(info))
        if rc < 0:
            raise _error(rc, what=f"wait for step {step}")
        return _step_dict(info)

    def delete(self, step: int, job: Optional[str] = None, force: bool = False) -> None:
        """Remove step of job (default: this client's) from storage, as
        ckptctl rm does. An incomplete attempt with an object younger than
        the job's in-flight window (incomplete_grace, else an hour) may be
        a save in flight on another node: it is left, and CkptError(EBUSY)
        says so, unless force (ckptctl rm --force)."""
        name = job or self.job
        if not name:
            raise CkptError(_errno.EINVAL, "delete needs a job (this client is a control session)")
        rc = lib.ckpt_delete_flags(self._handle(), name.encode(), int(step), 1 if force else 0)
        if rc < 0:
            raise _error(rc, what=f"delete step {step}")

    def resolve(self, step: int = LATEST, job: Optional[str] = None) -> int:
        """Decide once which step a restore loads: LATEST (the highest
        complete step) or a named one, of job (default: this client's). The
        daemon pins it, so every rank that loads the returned step loads
        the same bytes; call it on one rank and broadcast the number. A
        storage error raises (retry); it never falls back to an older
        step."""
        info = _StepInfo()
        rc = lib.ckpt_resolve(self._handle(), job.encode() if job else None,
                              LATEST if step in (LATEST, "latest") else int(step), ctypes.byref(info))
        if rc < 0:
            raise _error(rc, what="resolve")
        return info.step

    def show(self, job: str, step: int, rank: Optional[int] = None) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
        """Every rank's tensors of job/step (with rank=R, only rank R's, or
        rank 0's when the step has fewer ranks: one manifest read): dicts
        with rank, name, dtype, shape, offsets, lengths, nbytes."""
        out = ctypes.POINTER(_StepDetail)()
        if rank is None:
            rc = lib.ckpt_show(self._handle(), job.encode(), step, ctypes.byref(out))
        else:
            rc = lib.ckpt_show_rank(self._handle(), job.encode(), step, rank, ctypes.byref(out))
        if rc < 0:
            raise _error(rc, what=f"show {job} {step}")
        d = out.contents
        res = []
        for i in range(d.ntensors):
            t = d.tensors[i]
            nd = t.ndim
            res.append({"rank": t.rank, "name": t.name.decode(), "dtype": DTYPE_NAMES.get(t.dtype, "?"),
                        "shape": tuple(t.global_shape[:nd]), "offsets": tuple(t.box_offsets[:nd]),
                        "lengths": tuple(t.box_lengths[:nd]), "nbytes": t.nbytes})
        info = {"job": d.info.job.decode(), "step": d.info.step, "complete": bool(d.info.complete),
                "world_size": d.info.world_size, "tier": d.info.tier.decode() or "durable"}
        lib.ckpt_step_detail_free(ctypes.cast(out, ctypes.c_void_p))
        return info, res

    def close(self) -> None:
        """Disconnect. The session's end drops its tables and buffers in the
        daemon at once, so they are freed here after it (no request per
        buffer: a Checkpointer of 10,000 tensors closed in seconds)."""
        if self._h:
            lib.ckpt_close(self._h)
            for t in list(self._tables):
                t.free()
            self._tables = set()
            for b in list(self._buffers):
                b.free()
            self._buffers = set()
            self._h = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
