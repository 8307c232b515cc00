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
