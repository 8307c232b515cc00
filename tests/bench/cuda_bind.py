#!/usr/bin/env python3
"""What ckpt.torch's binding of CUDA tensors costs per save, with the fake
driver (tests/fakecuda; torch here has no CUDA): --tensors tensors in
--allocations cudaMalloc allocations, bound --rounds times as successive
saves bind them (ckpt._regs.Registrations.bind), with the registrations each made.

    CKPT_CUDA_LIBRARY=build/tests/fakecuda/libfakecuda.so \\
      python3 tests/bench/cuda_bind.py --socket S     (ckptd started with the same variable)
"""
import argparse
import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from test_cuda_binding import _DeviceTensor  # noqa: E402

import ckpt  # noqa: E402
import ckpt.torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--tensors", type=int, default=10000)
    ap.add_argument("--allocations", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    cu = ctypes.CDLL(os.environ["CKPT_CUDA_LIBRARY"])
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
    per, size = a.tensors // a.allocations, 4096
    tensors = []
    for i in range(a.allocations):
        p = ctypes.c_uint64()
        assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(per * size)) == 0
        tensors += [(f"t{i}.{j}", _DeviceTensor(p.value + j * size, size)) for j in range(per)]
    registered = []
    real = ckpt.Client.register_cuda

    def counting(self, ptr, n):
        registered.append(ptr)
        return real(self, ptr, n)
    ckpt.Client.register_cuda = counting
    with ckpt.torch.Checkpointer("cuda-bind-bench", socket=a.socket) as cp:
        for r in range(a.rounds):
            before = len(registered)
            t0 = time.perf_counter()
            cp._regs.bind(tensors)
            dt = time.perf_counter() - t0
            print(f"bind {r}: {len(tensors)} CUDA tensors in {a.allocations} allocations: {dt * 1e3:.1f} ms, "
                  f"{len(registered) - before} registrations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
