"""ckpt.torch's CUDA registrations: device memory registered with the
daemon (the C API's CUDA path: legacy IPC handles, or VMM fds for
expandable segments), so that it copies CUDA tensors D2H itself, and kept
from one bind to the next while the memory behind them is the same
allocation."""
from __future__ import annotations

import errno
import warnings
from typing import Dict, Iterable, List, Optional, Set, Tuple

import torch

from .client import _CONNECTION_ERRNOS, Buffer, CkptError, Client, cuda_allocation, cuda_identity

# A registration's key: the device range it covers, (start, nbytes).
Key = Tuple[int, int]
# A registration and the identity of the allocation it was made of
# (ckpt_cuda_identity; an object equal to nothing when there was none).
Reg = Tuple[Buffer, object]


def cuda_stream(tensors: Iterable[torch.Tensor]) -> Optional[int]:
    """The stream a save of tensors names for its CUDA ones (an int, or
    None without any): the current stream of their device, the one the
    trainer wrote them on. The daemon's copies wait for the work queued on
    it; the legacy default stream would not order a non-blocking stream's
    writes."""
    dev = next((t.device for t in tensors if t.is_cuda), None)
    return torch.cuda.current_stream(dev).cuda_stream if dev is not None else None


def identity_or_none(key: Key) -> Optional[int]:
    """ckpt_cuda_identity of a registration's range, or None when it is no
    longer mapped device memory (then nothing matches it)."""
    try:
        return cuda_identity(*key)
    except CkptError:
        return None


class CudaRegistrations:
    """A Checkpointer's registrations of device memory.

    works: None (not tried yet), True (registering device memory works),
    False (CUDA is off here or in the daemon: every CUDA tensor is copied
    through host memory). regs: this bind's registrations, {key: (Buffer,
    identity)}. A bind takes the last bind's from begin(), takes again
    those whose allocation is the same (buffer()), and frees the others
    once its own are made (end()), so that a segment both name stays open
    in the daemon."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.works: Optional[bool] = None
        self.regs: Dict[Key, Reg] = {}
        # (storage data_ptr, nbytes) -> (its registration's key, offset in it)
        self._where: Dict[Key, Tuple[Key, int]] = {}
        self._warned: Set[Optional[int]] = set()  # errnos of refused registrations already warned about
        # Registrations of allocations that are gone, freed by the next end().
        self._stale: List[Buffer] = []

    def begin(self) -> Dict[Key, Reg]:
        """Start a bind: the last bind's registrations (prev), which
        buffer() takes again and end() frees if it did not."""
        prev, self.regs = self.regs, {}
        return prev

    def abort(self, prev: Dict[Key, Reg]) -> None:
        """A bind that failed: the last bind's registrations it did not
        take are kept for the next (freed then if not taken again)."""
        self.regs.update(prev)

    def end(self, prev: Dict[Key, Reg]) -> None:
        """A bind's registrations are made: free the last bind's it did not
        take again, and the stale ones (saves in flight keep the daemon's
        own reference)."""
        for buf, _ in prev.values():
            buf.free()
        stale, self._stale = self._stale, []
        for buf in stale:
            buf.free()

    def buffer(self, t: torch.Tensor, prev: Dict[Key, Reg]) -> Optional[Tuple[Buffer, int]]:
        """(Buffer, offset of the tensor's storage in it) for a CUDA tensor:
        a registration with the daemon (C API: legacy IPC or VMM fds) of
        the whole cudaMalloc allocation holding the storage (one for every
        tensor of a caching-allocator segment: a model of 50,000 tensors
        stays far under max_buffers), or of the storage's own range for
        VMM memory (expandable segments map one allocation per page).
        Taken from the last bind (prev) if the memory behind it is still
        the same allocation: ckpt_cuda_identity, which changes when the
        caching allocator frees a segment and makes another at the same
        address. So a later save of the same tensors costs no registration,
        and the daemon keeps its mappings open. None when CUDA is off here
        or in the daemon, or the daemon refuses this tensor: then it is
        copied."""
        st = t.untyped_storage()
        where = (st.data_ptr(), st.nbytes())
        # A later save: where this storage lay last time, and that
        # allocation's registration if it still holds (one identity check
        # per allocation, not per tensor). Else where it lies now.
        got = self._where.get(where)
        if got is None or not self._taken(got[0], prev):
            got = self._locate(where)
        key, base = got
        if self._taken(key, prev):
            return self.regs[key][0], base
        ident = identity_or_none(key)
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
                self.works = False
            if e.errno != errno.ENOTSUP and e.errno not in self._warned:
                self._warned.add(e.errno)
                warnings.warn(f"ckpt: CUDA tensor {tuple(t.shape)} not registered with ckptd ({e}); "
                              f"copying {'every CUDA tensor' if self.works is False else 'such tensors'} "
                              "through host memory instead (slower)", RuntimeWarning, stacklevel=4)
            return None
        self.works = True
        # Without an identity the registration is not kept past this bind.
        self.regs[key] = (buf, ident if ident is not None else object())
        return buf, base

    def _locate(self, where: Key) -> Tuple[Key, int]:
        """(registration key, offset in it) for a storage (data_ptr,
        nbytes): its whole allocation for cudaMalloc memory, else its own
        range; remembered for the next bind."""
        ptr, _ = where
        try:
            start, size, legacy = cuda_allocation(ptr)
            key = (start, size) if legacy else where
        except CkptError:
            key = where  # the registration says why, if it fails
        if len(self._where) > 4 * len(self.regs) + 4096:
            self._where.clear()  # storages long gone
        got = self._where[where] = (key, ptr - key[0])
        return got

    def _taken(self, key: Key, prev: Dict[Key, Reg]) -> bool:
        """Whether this bind has a registration for key: made already, or
        the last bind's (prev) taken again because ckpt_cuda_identity says
        the memory is still the same allocation. A stale one is freed
        after this bind's own are made."""
        if key in self.regs:
            return True
        have = prev.pop(key, None)
        if have is None:
            return False
        if have[1] == identity_or_none(key):
            self.regs[key] = have
            return True
        self._stale.append(have[0])
        return False

    def still_hold(self, regs: Dict[Key, Reg]) -> bool:
        """Whether a kept plan's registrations (regs, as the bind that made
        it left them) are still this Checkpointer's (no bind, a load's,
        dropped them) and still of the same allocations: one
        ckpt_cuda_identity per allocation, not one lookup per tensor (the
        plan's fingerprint already said that every tensor is where it
        was)."""
        for key, (buf, ident) in regs.items():
            now = self.regs.get(key)
            if now is None or now[0] is not buf or identity_or_none(key) != ident:
                return False
        return True
