#!/usr/bin/env python3
"""A/B the trainer-visible stall of two ckptd builds side by side: the same
state (--size-mb, default 1024, in 8 float32 tensors) saved through
ckpt.torch.Checkpointer to daemon A and daemon B alternately (the order
flips every round; round 0 registers and is not counted), waiting for
durable after each. Prints medians, minima and B/A.

    git worktree add /tmp/base HEAD~1 && meson setup /tmp/base-build /tmp/base
    ninja -C /tmp/base-build daemon/ckptd
    ckptd --socket /tmp/a.sock ... &  /tmp/base-build/daemon/ckptd --socket /tmp/b.sock ... &
    python tests/bench/py_ab.py --a /tmp/a.sock --b /tmp/b.sock --rounds 16
"""
import argparse
import statistics
import sys
import time

import torch

import ckpt.torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="socket of daemon A")
    ap.add_argument("--b", required=True, help="socket of daemon B")
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--job", default="py-ab")
    a = ap.parse_args()
    n = a.size_mb * (1 << 20) // 4 // 8
    state = {f"layer{i}.weight": torch.randn(n) for i in range(8)}
    cps = {"A": ckpt.torch.Checkpointer(a.job, socket=a.a, exist_ok=True),
           "B": ckpt.torch.Checkpointer(a.job, socket=a.b, exist_ok=True)}
    res = {k: [] for k in cps}
    step = int(time.time())  # a fresh step number per run
    for r in range(a.rounds + 1):
        for k in (("A", "B") if r % 2 == 0 else ("B", "A")):
            step += 1
            t0 = time.perf_counter()
            f = cps[k].save(state, step)
            f.staged.result()
            dt = time.perf_counter() - t0
            f.durable.result()
            if r > 0:
                res[k].append(dt * 1e3)
    for k, v in res.items():
        print(f"{k}: median {statistics.median(v):.1f} ms, min {min(v):.1f} ms, rounds: "
              + " ".join(f"{x:.0f}" for x in v))
    print(f"B/A median stall: {statistics.median(res['B']) / statistics.median(res['A']):.3f}")
    for cp in cps.values():
        cp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
