"""ckpt.torch's registrations: the buffers a Checkpointer registered with
the daemon for its tensors, and the binding of tensors to them (a
TensorSpec per tensor). CPU storages are moved into shared memory in place
(every alias sees it), into one file per save plan (torch 2.15 and later:
arena_move) or each into its own (``share_memory_()``); CUDA tensors go
through the device registrations (ckpt._cuda); the rest are copied into
scratch buffers."""
from __future__ import annotations

import mmap
import os
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ._cuda import CudaRegistrations
from ._tree import DTYPE_CODES
from .client import Buffer, Client, TensorSpec

# Storages moved in place into one shared-memory file per plan (arena_move)
# need UntypedStorage._swap_data_ptr_ (torch 2.15 and later); without it,
# each storage is shared on its own (share_memory_()).
CAN_SWAP = hasattr(torch.UntypedStorage, "_swap_data_ptr_") and hasattr(os, "memfd_create")

# (name, tensor) pairs, as binds and copies take them.
Named = Sequence[Tuple[str, torch.Tensor]]


class Arena:
    """One shared-memory file holding storages, registered once: buf, and
    how many of the storages a plan still names."""
    __slots__ = ("buf", "n")

    def __init__(self, buf: Buffer, n: int) -> None:
        self.buf, self.n = buf, n


class Slot:
    """A storage in an arena: the storage (held, so that its address stays
    its own), its StorageImpl (to tell it from another at the address),
    the arena and its offset there."""
    __slots__ = ("st", "cdata", "arena", "off")

    def __init__(self, st: torch.UntypedStorage, cdata: int, arena: Arena, off: int) -> None:
        self.st, self.cdata, self.arena, self.off = st, cdata, arena, off


def _pending(name: str, code: str, t: torch.Tensor, offset: int, nbytes: int) -> TensorSpec:
    """A spec whose buffer is a registration still to be made: the bind
    sets it once its batch (or arena) is registered."""
    return TensorSpec(name, code, t.shape, None, offset, nbytes)  # type: ignore[arg-type]  # set by the bind


class Registrations:
    """A Checkpointer's registrations with the daemon, and the binding of
    tensors to them.

    shared: storage data_ptr -> (its registered Buffer, the file's inode),
    for storages shared each in its own file; arena: storage data_ptr ->
    Slot, for storages moved into an arena; scratch: name -> Buffer, for
    tensors copied on each save or load (non-contiguous ones, CUDA ones the
    daemon does not take). drop_plan: drops the Checkpointer's save plan,
    whose table may name a buffer about to be unregistered (release)."""

    def __init__(self, client: Client, cuda: CudaRegistrations, drop_plan: Callable[[], None]) -> None:
        self.client = client
        self.cuda = cuda
        self._drop_plan = drop_plan
        self.shared: Dict[int, Tuple[Buffer, int]] = {}
        self.arena: Dict[int, Slot] = {}
        self.no_arena = False  # arena_move failed once: share_memory_() only
        self.scratch: Dict[str, Buffer] = {}

    def bind(self, tensors: Named, plan: bool = False) -> List[TensorSpec]:
        """A TensorSpec per tensor. Contiguous CPU tensors are registered
        zero-copy: their storage is moved into shared memory in place
        (once; every alias, parameters included, sees it): with plan, into
        one file for them all (arena_move), else each on its own
        (``share_memory_()``), its fd registered once per storage. Others
        get a registered scratch buffer, filled by copy_in. Registrations
        not among tensors are dropped; when one goes or is replaced, so
        does the plan, unless plan (the plan is being made from these
        tensors)."""
        specs: List[TensorSpec] = []
        used = set()
        # Device registrations are kept from one bind to the next while the
        # memory behind them is the same allocation (CudaRegistrations):
        # those this bind does not take again are freed after its own are
        # made, so a segment both name stays open in the daemon.
        prev_cuda = self.cuda.begin()
        # Storages to register, in one batch after the walk (one round trip
        # per 128: ckpt_buffer_register_fds): key -> (fd, size, ino, specs).
        todo: Dict[int, Tuple[int, int, int, List[TensorSpec]]] = {}
        # With a plan, storages not in an arena yet go into a new one
        # (arena_move): key -> storage, and the specs waiting for it.
        to_arena: Dict[int, torch.UntypedStorage] = {}
        arena_specs: Dict[int, List[TensorSpec]] = {}
        arena_ok = plan and CAN_SWAP and not self.no_arena
        try:
            for name, t in tensors:
                code = DTYPE_CODES[t.dtype]
                nbytes = t.numel() * t.element_size()
                at = int(t.storage_offset()) * t.element_size()  # in the storage
                if t.device.type == "cuda" and t.is_contiguous() and nbytes and self.cuda.works is not False:
                    got = self.cuda.buffer(t, prev_cuda)
                    if got is not None:
                        buf, base = got
                        specs.append(TensorSpec(name, code, t.shape, buf, base + at, nbytes))
                        continue
                if t.device.type == "cpu" and t.is_contiguous() and nbytes:
                    st = t.untyped_storage()
                    key = st.data_ptr()
                    slot = self.arena.get(key)
                    if slot is not None and slot.cdata == st._cdata:
                        used.add(key)
                        specs.append(TensorSpec(name, code, t.shape, slot.arena.buf, slot.off + at, nbytes))
                        continue
                    if arena_ok:
                        spec = _pending(name, code, t, at, nbytes)
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
                    cached = self.shared.get(key)
                    used.add(key)
                    spec = _pending(name, code, t, at, nbytes)
                    specs.append(spec)
                    # A freed storage's address can be reused by a new one:
                    # the cache is valid only for the same file.
                    if key in todo:
                        todo[key][3].append(spec)
                    elif cached is None or cached[1] != ino or cached[0].size != size:
                        if cached is not None:
                            self.release(self.shared.pop(key)[0], plan)
                        todo[key] = (fd, size, ino, [spec])
                    else:
                        spec.buffer = cached[0]
                else:
                    buf = self.scratch_buffer(name, nbytes, plan)
                    specs.append(TensorSpec(name, code, t.shape, buf, 0, nbytes))
        except BaseException:
            self.cuda.abort(prev_cuda)
            raise
        if to_arena:
            try:
                placed = self.arena_move(to_arena)
            except RuntimeError:
                # This torch would not swap a storage's bytes: each storage
                # is shared on its own from now on (those moved already
                # are whole where they are, and move again).
                self.no_arena = True
                self.cuda.abort(prev_cuda)
                return self.bind(tensors, plan)
            for old, (key, slot) in zip(to_arena, placed.items()):
                self.arena[key] = slot
                used.add(key)
                for spec in arena_specs[old]:
                    spec.buffer = slot.arena.buf
                    spec.offset += slot.off
        self.cuda.end(prev_cuda)
        if todo:
            items = list(todo.items())
            bufs = self.client.register_fds([v[0] for _, v in items], [v[1] for _, v in items])
            for (key, (_, _, ino, waiting)), buf in zip(items, bufs):
                self.shared[key] = (buf, ino)
                for spec in waiting:
                    spec.buffer = buf
        # Storages no longer in the state dict: unregister (saves in
        # flight keep the daemon's own reference).
        for key in [k for k in self.shared if k not in used]:
            self.release(self.shared.pop(key)[0], plan)
        for key in [k for k in self.arena if k not in used]:
            arena = self.arena.pop(key).arena
            arena.n -= 1
            if arena.n == 0:
                self.release(arena.buf, plan)
        return specs

    def arena_move(self, storages: Dict[int, torch.UntypedStorage]) -> Dict[int, Slot]:
        """Move storages (a dict: key -> UntypedStorage, in the table's
        order) into one new shared-memory file, each at the offset the
        daemon's shard layout gives it (64-byte aligned, in order), in place:
        every alias sees it, as with share_memory_(), but the daemon maps one
        file, not one per storage, and copies neighbouring tensors as one
        run (10,000 files cost it about 1 us each per save). Registered
        once. Returns {key: Slot} under the storages' new addresses.

        Most of its time is the new file's pages (a first save's, without
        prepare(): issue 40). They are allocated in one call (fallocate),
        and the file is registered at once on another thread, so that the
        daemon maps and pre-faults its view (hostbuf.c) while the storages
        are copied here, not after."""
        slots, off = [], 0
        for st in storages.values():
            off = (off + 63) & ~63
            slots.append(off)
            off += st.nbytes()
        total = max(off, 64)
        fd = os.memfd_create("ckpt-arena", os.MFD_CLOEXEC)
        reg: Optional[threading.Thread] = None
        got: List[object] = []  # the Buffer, or what register_fds raised
        try:
            try:
                os.posix_fallocate(fd, 0, total)
            except OSError:
                os.ftruncate(fd, total)  # a sparse file: the daemon maps it as the copies fill it
            else:
                reg = threading.Thread(target=_register, args=(self.client, fd, total, got), daemon=True)
                reg.start()
            mm = mmap.mmap(fd, total)
            view = memoryview(mm)
            moved = []
            try:
                for st, at in zip(storages.values(), slots):
                    nb = st.nbytes()
                    dst = torch.frombuffer(view[at:at + nb], dtype=torch.uint8)
                    dst.copy_(torch.empty(0, dtype=torch.uint8).set_(st, 0, (nb,), (1,)))
                    # The storage takes the arena's bytes; its old ones go with dst.
                    # (torch 2.15's, missing from its stubs; CAN_SWAP said it is there)
                    st._swap_data_ptr_(dst.untyped_storage())  # type: ignore[attr-defined]
                    moved.append(st)
                del dst
            except BaseException:
                if reg is not None:
                    reg.join()
                for b in got:
                    if isinstance(b, Buffer):
                        b.free()
                raise
            if reg is not None:
                reg.join()
            else:
                _register(self.client, fd, total, got)
            buf = got[0]
            if isinstance(buf, BaseException):
                raise buf  # what register_fds raised
            assert isinstance(buf, Buffer)
        finally:
            os.close(fd)
        arena = Arena(buf, len(moved))
        return {st.data_ptr(): Slot(st, st._cdata, arena, at) for st, at in zip(moved, slots)}

    def release(self, buf: Buffer, plan: bool) -> None:
        """Unregister buf; a plan made from other tensors may name it in its
        table, which the daemon would not let go of it: the plan goes first
        (when this bind is not making one; SavePlans.make dropped the old)."""
        if not plan:
            self._drop_plan()
        buf.free()

    def scratch_buffer(self, name: str, nbytes: int, plan: bool = False) -> Buffer:
        """The registered scratch buffer of the tensor name, at least nbytes
        (a bigger one replaces a smaller: release)."""
        have = self.scratch.get(name)
        if have is None or have.size < max(nbytes, 1):
            if have is not None:
                self.release(have, plan)
            have = self.client.alloc(max(nbytes, 64))
            self.scratch[name] = have
        return have

    def is_scratch(self, name: str, spec: TensorSpec) -> bool:
        """Whether the bind put the tensor name in its scratch buffer (it is
        copied there on each save, and back on each load)."""
        return spec.buffer is self.scratch.get(name)

    def copy_in(self, tensors: Named, specs: Sequence[TensorSpec]) -> None:
        """Tensors not bound (non-contiguous, CUDA) are copied to scratch."""
        for (name, t), s in zip(tensors, specs):
            if self.is_scratch(name, s) and s.nbytes:
                _bytes(s).view(t.dtype).view(t.shape).copy_(t)

    def copy_out(self, tensors: Named, specs: Sequence[TensorSpec]) -> None:
        """Tensors loaded into scratch are copied from there into place."""
        for (name, t), s in zip(tensors, specs):
            if self.is_scratch(name, s) and s.nbytes:
                with torch.no_grad():
                    t.copy_(_bytes(s).view(t.dtype).view(t.shape))

    def forget(self, name: str, own: Optional[torch.Tensor] = None) -> None:
        """Unregister what a bind made for one load only, which would
        otherwise stay mapped in the daemon until the next bind: the
        scratch buffer of the tensor name; else, given own (a tensor the
        caller made for this load and keeps no longer), the registration
        of its storage's shared memory. ckpt.dcp's read_data."""
        buf = self.scratch.pop(name, None)
        if buf is not None:
            self.release(buf, False)
        elif own is not None and own.device.type == "cpu":
            got = self.shared.pop(own.untyped_storage().data_ptr(), None)
            if got is not None:
                self.release(got[0], False)

    def clear(self) -> None:
        """Forget the host registrations (the Checkpointer closes: its
        client frees them all)."""
        self.shared, self.arena, self.scratch = {}, {}, {}


def _register(client: Client, fd: int, nbytes: int, out: List[object]) -> None:
    """Register an arena's file: its Buffer into out, or what was raised."""
    try:
        out.append(client.register_fds([fd], [nbytes])[0])
    except BaseException as e:
        out.append(e)


def _bytes(spec: TensorSpec) -> torch.Tensor:
    """The bytes of a scratch buffer a spec names, as a uint8 tensor."""
    view = spec.buffer.view
    assert view is not None, "a scratch buffer is alloc()'d: mapped here"
    return torch.frombuffer(view, dtype=torch.uint8, count=spec.nbytes)
