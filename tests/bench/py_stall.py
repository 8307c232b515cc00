#!/usr/bin/env python3
"""The trainer-visible stall per save, side by side in one process, for a
state of --size-mb (default 1024) MiB in 8 float32 tensors:

  ckpt.torch.Checkpointer.save -> staged
  dcp.async_save(storage_writer=ckpt.dcp.Writer) -> returns
  torch.save to a file (blocking; fsync'd)
  dcp.async_save(storage_writer=FileSystemWriter) -> returns

Each is run --rounds times (after one warm-up save that registers or
allocates what it keeps), interleaved, in an order rotated every round;
medians are printed, and every round's value. After each call has
finished (durable, or its upload done) the bench waits --settle seconds
(default 2), so that what one path leaves running in the background
(reclaim, writeback, the allocator returning a GiB) is not charged to the
path measured next: a 50 ms stall is easily doubled by that, a 1 s one is
not. The files go to
--dir, on the same filesystem as ckptd's storage.

    python tests/bench/py_stall.py --socket /tmp/ckptd.sock --dir /var/tmp/bench
"""
import argparse
import os
import shutil
import statistics
import sys
import time

import torch
import torch.distributed.checkpoint as dcp

import ckpt.dcp
import ckpt.torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle", type=float, default=2.0,
                    help="seconds to wait after each finished call before the next")
    ap.add_argument("--only", default="ckpt,ckpt_dcp,torch_save,dcp_fs",
                    help="which paths, comma separated")
    a = ap.parse_args()
    n = a.size_mb * (1 << 20) // 4 // 8
    state = {f"layer{i}.weight": torch.randn(n) for i in range(8)}
    os.makedirs(a.dir, exist_ok=True)
    cp = ckpt.torch.Checkpointer("bench-py", socket=a.socket)
    res = {k: [] for k in ("ckpt", "ckpt_dcp", "torch_save", "dcp_fs")}
    pending = []
    step = 0

    def ckpt_save():
        nonlocal step
        step += 1
        t0 = time.perf_counter()
        f = cp.save(state, step)
        f.staged.result()
        dt = time.perf_counter() - t0
        f.durable.result()
        return dt

    def ckpt_dcp():
        nonlocal step
        step += 1
        t0 = time.perf_counter()
        r = dcp.async_save(state, storage_writer=ckpt.dcp.Writer("bench-dcp", step=step, socket=a.socket))
        dt = time.perf_counter() - t0
        (r.upload_completion if hasattr(r, "upload_completion") else r).result()
        return dt

    def torch_save():
        path = os.path.join(a.dir, "torch_save.pt")
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        return time.perf_counter() - t0

    def dcp_fs():
        path = os.path.join(a.dir, f"dcp_fs_{len(pending)}")
        shutil.rmtree(path, ignore_errors=True)
        t0 = time.perf_counter()
        r = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(path))
        dt = time.perf_counter() - t0
        (r.upload_completion if hasattr(r, "upload_completion") else r).result()
        pending.append(path)
        return dt

    runs = [(k, f) for k, f in (("ckpt", ckpt_save), ("ckpt_dcp", ckpt_dcp), ("torch_save", torch_save),
                                 ("dcp_fs", dcp_fs)) if k in a.only.split(",")]
    for name, fn in runs:  # warm-up: registration, allocation, imports
        fn()
    for r in range(a.rounds):
        # rotate the order each round: whatever runs right after a large
        # disk write pays for it, so no path always follows the same one
        for name, fn in runs[r % len(runs):] + runs[:r % len(runs)]:
            time.sleep(a.settle)
            res[name].append(fn())
    med = {k: statistics.median(v) * 1e3 if v else float("nan") for k, v in res.items()}
    gib = 8 * n * 4 / (1 << 30)
    print(f"state {gib:.2f} GiB in 8 tensors, {a.rounds} rounds, median stall per save (ms):")
    print(f"  ckpt Checkpointer.save -> staged       {med['ckpt']:9.1f}")
    print(f"  dcp.async_save + ckpt.dcp.Writer       {med['ckpt_dcp']:9.1f}")
    print(f"  torch.save (fsync)                     {med['torch_save']:9.1f}")
    print(f"  dcp.async_save + FileSystemWriter      {med['dcp_fs']:9.1f}")
    for k, v in res.items():
        if v:
            print(f"  {k} rounds (ms): " + " ".join(f"{x * 1e3:.0f}" for x in v))
    print(f"ratios: torch.save / Checkpointer = {med['torch_save'] / med['ckpt']:.1f}x, "
          f"torch.save / ckpt.dcp = {med['torch_save'] / med['ckpt_dcp']:.1f}x, "
          f"DCP FileSystemWriter / ckpt.dcp = {med['dcp_fs'] / med['ckpt_dcp']:.1f}x")
    cp.close()
    ckpt.dcp.close_all()
    for p in pending:
        shutil.rmtree(p, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
