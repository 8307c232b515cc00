"""The Python binding of the CUDA path against the fake driver
(tests/fakecuda; CKPT_FAKECUDA names it): Client.register_cuda, a save whose
daemon copy waits for an asynchronous write on the given stream, and a
restore into zeroed device memory. torch here has no CUDA, so device memory
comes from the fake driver through ctypes."""
import ctypes
import os

import pytest

FAKE = os.environ.get("CKPT_FAKECUDA")
pytestmark = pytest.mark.skipif(not FAKE, reason="no fake CUDA driver in this build (cuda.h not found)")


@pytest.fixture
def cuda(monkeypatch, daemon_factory):
    monkeypatch.setenv("CKPT_CUDA_LIBRARY", FAKE)
    d = daemon_factory()  # inherits CKPT_CUDA_LIBRARY
    cu = ctypes.CDLL(FAKE)
    assert cu.cuInit(0) == 0
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    cu.fakecuda_pattern.restype = ctypes.c_ubyte
    return d, cu


def test_register_save_restore(cuda):
    import ckpt
    d, cu = cuda
    ok, why = ckpt.cuda_available()
    assert ok, why
    n = 3 << 20
    ptr = ctypes.c_uint64()
    assert cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(n)) == 0
    stream = ctypes.c_void_p()
    assert cu.cuStreamCreate(ctypes.byref(stream), 1) == 0
    with ckpt.Client(d.sock, job="pycuda") as c:
        b = c.register_cuda(ptr.value, n)
        spec = ckpt.TensorSpec("dev", "u8", (n,), b, 0, n)
        # A slow asynchronous "kernel" on the stream, then save at once.
        assert cu.fakecuda_fill_async(ptr, ctypes.c_size_t(n), ctypes.c_ubyte(9), 200000, stream) == 0
        c.save(1, [spec], cuda_stream=stream.value).durable.result(30)
        assert cu.cuStreamSynchronize(stream) == 0
        assert cu.fakecuda_fill_async(ptr, ctypes.c_size_t(n), ctypes.c_ubyte(0), 0, None) == 0
        assert cu.cuStreamSynchronize(None) == 0
        c.load([spec], 1).result(30)
        host = (ctypes.c_ubyte * n)()
        assert cu.cuMemcpyDtoHAsync_v2(host, ptr, ctypes.c_size_t(n), None) == 0
        assert cu.cuStreamSynchronize(None) == 0
        bad = [i for i in range(0, n, 4099) if host[i] != cu.fakecuda_pattern(ctypes.c_ubyte(9), ctypes.c_size_t(i))]
        assert not bad, f"{len(bad)} sampled bytes differ"
        b.free()
    assert cu.cuMemFree_v2(ptr) == 0


class _DeviceTensor:
    """Just enough of a CUDA torch.Tensor for Registrations.bind: bytes of
    fake-driver device memory (torch here has no CUDA)."""

    class _Storage:
        def __init__(self, ptr, n):
            self.ptr, self.n = ptr, n

        def data_ptr(self):
            return self.ptr

        def nbytes(self):
            return self.n

    class _Dev:
        type = "cuda"

    def __init__(self, ptr, n):
        import torch
        self.dtype, self.shape, self.device = torch.uint8, (n,), self._Dev()
        self.storage = self._Storage(ptr, n)
        self.is_cuda = True

    def numel(self):
        return self.shape[0]

    def element_size(self):
        return 1

    def is_contiguous(self):
        return True

    def storage_offset(self):
        return 0

    def untyped_storage(self):
        return self.storage


def _mappings(d):
    with open(f"/proc/{d.proc.pid}/maps") as f:
        return len({line.split()[-1] for line in f if "fakecuda-mem" in line})


def test_checkpointer_keeps_registrations_while_the_allocation_is_the_same(cuda, monkeypatch):
    """ckpt.torch keeps a CUDA tensor's registration from one save to the
    next while ckpt_cuda_identity says its memory is the same allocation:
    no registration and no new mapping in the daemon per save. Freed and
    allocated again at the same address (the fake driver also gives the
    same handle bytes), it is registered again and the step holds the new
    bytes; the stale registration is dropped after the new one is made."""
    import ckpt
    import ckpt._cuda
    import ckpt.torch
    d, cu = cuda
    n = 1 << 20
    ptr = ctypes.c_uint64()
    assert cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(n)) == 0
    assert cu.fakecuda_fill_async(ptr, ctypes.c_size_t(n), ctypes.c_ubyte(3), 0, None) == 0
    assert cu.cuStreamSynchronize(None) == 0
    registered = []
    real = ckpt.Client.register_cuda

    def counting(self, p, nbytes):
        registered.append(p)
        return real(self, p, nbytes)
    monkeypatch.setattr(ckpt.Client, "register_cuda", counting)
    host = (ctypes.c_ubyte * n)()

    def saved_bytes(cp, step):
        """Save the tensor as step, wipe it, restore it, read it back."""
        t = _DeviceTensor(ptr.value, n)
        specs = cp._regs.bind([("w", t)])
        cp.client.save(step, specs, cuda_stream=0).durable.result(30)
        assert cu.fakecuda_fill_async(ptr, ctypes.c_size_t(n), ctypes.c_ubyte(0), 0, None) == 0
        assert cu.cuStreamSynchronize(None) == 0
        cp.client.load(cp._regs.bind([("w", t)]), step).result(30)
        assert cu.cuMemcpyDtoHAsync_v2(host, ptr, ctypes.c_size_t(n), None) == 0
        assert cu.cuStreamSynchronize(None) == 0
        return host

    with ckpt.torch.Checkpointer("pycuda-keep", socket=d.sock) as cp:
        got = saved_bytes(cp, 1)
        assert got[4099] == cu.fakecuda_pattern(ctypes.c_ubyte(3), ctypes.c_size_t(4099))
        assert registered == [ptr.value] and _mappings(d) == 1
        saved_bytes(cp, 2)
        assert registered == [ptr.value], "a later save registered the same allocation again"
        assert _mappings(d) == 1

        # A kept plan naming this registration holds while the allocation
        # is the same, and not once it is freed and made again.
        plan_regs = dict(cp._cuda.regs)
        assert cp._cuda.still_hold(plan_regs)
        old = ptr.value
        assert cu.cuMemFree_v2(ptr) == 0
        assert cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(n)) == 0
        assert ptr.value == old, "the fake driver gave another address: the test proves nothing"
        assert cu.fakecuda_fill_async(ptr, ctypes.c_size_t(n), ctypes.c_ubyte(7), 0, None) == 0
        assert cu.cuStreamSynchronize(None) == 0
        assert not cp._cuda.still_hold(plan_regs)
        got = saved_bytes(cp, 3)
        assert registered == [old, old], "the new allocation was not registered again"
        assert not cp._cuda.still_hold(plan_regs), "a plan naming the dropped registration still holds"
        bad = [i for i in range(0, n, 4099) if got[i] != cu.fakecuda_pattern(ctypes.c_ubyte(7), ctypes.c_size_t(i))]
        assert not bad, f"{len(bad)} sampled bytes are the freed allocation's"
        assert _mappings(d) == 1, "the stale registration's mapping was kept"
        # A bind that fails part way (a tensor of a dtype ckpt cannot
        # save) keeps what it had: the next one registers nothing again.
        import torch
        with pytest.raises(KeyError):
            cp._regs.bind([("z", torch.zeros(3, dtype=torch.complex64)), ("w", _DeviceTensor(ptr.value, n))])
        saved_bytes(cp, 4)
        assert registered == [old, old] and _mappings(d) == 1
    assert cu.cuMemFree_v2(ptr) == 0


def test_checkpointer_registers_a_segment_once_for_all_its_tensors(cuda, monkeypatch):
    """Tensors of one cudaMalloc allocation (a caching-allocator segment)
    share one registration of the whole allocation, at their offsets in
    it: a model's thousands of tensors cost a registration per segment,
    and stay far under the daemon's max_buffers."""
    import ckpt
    import ckpt._cuda
    import ckpt.torch
    d, cu = cuda
    n, k = 4 << 20, 8
    ptr = ctypes.c_uint64()
    assert cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(n)) == 0
    assert cu.fakecuda_fill_async(ptr, ctypes.c_size_t(n), ctypes.c_ubyte(5), 0, None) == 0
    assert cu.cuStreamSynchronize(None) == 0
    assert ckpt.cuda_allocation(ptr.value + 4096) == (ptr.value, n, True)
    registered = []
    real = ckpt.Client.register_cuda

    def counting(self, p, nbytes):
        registered.append((p, nbytes))
        return real(self, p, nbytes)
    monkeypatch.setattr(ckpt.Client, "register_cuda", counting)
    part = n // k
    tensors = [(f"t{i}", _DeviceTensor(ptr.value + i * part, part - 64)) for i in range(k)]
    with ckpt.torch.Checkpointer("pycuda-segment", socket=d.sock) as cp:
        specs = cp._regs.bind(tensors)
        assert registered == [(ptr.value, n)]
        assert len({id(s.buffer) for s in specs}) == 1
        assert [s.offset for s in specs] == [i * part for i in range(k)]
        cp.client.save(1, specs, cuda_stream=0).durable.result(30)
        assert cu.fakecuda_fill_async(ptr, ctypes.c_size_t(n), ctypes.c_ubyte(0), 0, None) == 0
        assert cu.cuStreamSynchronize(None) == 0
        # A later bind of the same tensors: one identity check for the
        # allocation, no lookup of where each tensor lies, no registration.
        calls = {"identity": 0, "allocation": 0}
        real_identity, real_allocation = ckpt._cuda.cuda_identity, ckpt._cuda.cuda_allocation

        def identity(*a):
            calls["identity"] += 1
            return real_identity(*a)

        def allocation(*a):
            calls["allocation"] += 1
            return real_allocation(*a)
        monkeypatch.setattr(ckpt._cuda, "cuda_identity", identity)
        monkeypatch.setattr(ckpt._cuda, "cuda_allocation", allocation)
        cp.client.load(cp._regs.bind(tensors), 1).result(30)
        assert registered == [(ptr.value, n)]
        assert calls == {"identity": 1, "allocation": 0}, calls
        host = (ctypes.c_ubyte * n)()
        assert cu.cuMemcpyDtoHAsync_v2(host, ptr, ctypes.c_size_t(n), None) == 0
        assert cu.cuStreamSynchronize(None) == 0
        for i in range(k):
            for off in (i * part, i * part + part - 65):
                assert host[off] == cu.fakecuda_pattern(ctypes.c_ubyte(5), ctypes.c_size_t(off)), (i, off)
            gap = i * part + part - 1  # between the tensors: not saved, so still the wipe's pattern
            assert host[gap] == cu.fakecuda_pattern(ctypes.c_ubyte(0), ctypes.c_size_t(gap)), i
    assert cu.cuMemFree_v2(ptr) == 0
