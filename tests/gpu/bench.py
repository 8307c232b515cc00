#!/usr/bin/env python3
"""The GPU speed table (docs/cuda.md "CUDA"), side by side in one run on one GPU:

- D2H staging: the bytes of a CUDA state dict over the trainer's stall
  (Checkpointer.save -> staged), against cudaMemcpyAsync of the same
  tensors into one pinned buffer (goal: at least 90%);
- the stall of one save of the state dict (--gib GiB in --tensors CUDA
  tensors of mixed sizes, as a model's layers and their biases):
  ckpt.torch.Checkpointer, torch.save (to a file, fsync'd), DCP async_save
  with FileSystemWriter as it comes, with pinned staging kept between
  saves (FileSystemWriter(cache_staged_state_dict=True), the recipe in the
  PyTorch async_save tutorial), and with DefaultStager(pinned, async) where
  this torch has it (its stall: until staging_completion, since the
  tensors may change only then);
- restore: Checkpointer.load from the daemon's memory into the same CUDA
  tensors (H2D), against cudaMemcpyAsync from pinned memory;
- each path's first save against its later ones (IPC opens and pool
  pinning for ckpt, the pinned buffer's allocation for DCP).

Each path saves once to warm up (that time is reported as "first"), then
--rounds times, interleaved in an order rotated every round, waiting for
each save to finish (durable) and --settle seconds before the next.

    python3 tests/gpu/bench.py --socket /run/ckptd.sock --dir /var/tmp/bench
    CKPT_GPU_BENCH_DEVICE=cpu ... --gib 0.25   (the logic, where no GPU is)

Prints a table and, last, one JSON line of every number."""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

import torch
import torch.distributed.checkpoint as dcp

import ckpt.torch

PATHS = ("ckpt", "torch_save", "dcp", "dcp_pinned", "dcp_stager")


def sizes(total, n):
    """n tensor sizes (bytes, multiples of 4 KiB) summing to about total:
    a layer's weights in three shapes and a small bias or norm after each."""
    pattern = [12, 0, 4, 0, 8, 0]  # relative sizes; 0: a small tensor
    small = 16 << 10
    big = [pattern[i % len(pattern)] for i in range(n)]
    unit = max(4096, (total - small * big.count(0)) // max(1, sum(big)) // 4096 * 4096)
    return [unit * b if b else small for b in big]


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--dir", required=True, help="torch.save's and DCP's files")
    ap.add_argument("--gib", type=float, default=10.0)
    ap.add_argument("--tensors", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle", type=float, default=2.0)
    ap.add_argument("--only", default=",".join(PATHS))
    a = ap.parse_args()
    dev = os.environ.get("CKPT_GPU_BENCH_DEVICE", "cuda")
    paths = [p for p in PATHS if p in a.only.split(",")]
    os.makedirs(a.dir, exist_ok=True)

    torch.manual_seed(0)
    sz = sizes(int(a.gib * (1 << 30)), a.tensors)
    state = {f"layers.{i // 2}.{'weight' if i % 2 == 0 else 'bias'}.{i}": torch.randn(s // 4, device=dev)
             for i, s in enumerate(sz)}
    total = sum(sz)
    gib = total / (1 << 30)
    print(f"state: {gib:.2f} GiB in {len(sz)} {dev} tensors "
          f"({min(sz) >> 10} KiB to {max(sz) >> 20} MiB); torch {torch.__version__}", flush=True)

    # Baselines: the same tensors into (and back from) one pinned buffer.
    host = torch.empty(total, dtype=torch.uint8, pin_memory=(dev == "cuda"))
    views, off = [], 0
    for t in state.values():
        n = t.numel() * t.element_size()
        views.append(host[off:off + n].view(t.dtype))
        off += n
    d2h_base, h2d_base = [], []
    for _ in range(3):
        sync(dev)
        t0 = time.perf_counter()
        for v, t in zip(views, state.values()):
            v.copy_(t, non_blocking=True)
        sync(dev)
        d2h_base.append(total / (time.perf_counter() - t0) / 1e9)
        t0 = time.perf_counter()
        for v, t in zip(views, state.values()):
            t.copy_(v, non_blocking=True)
        sync(dev)
        h2d_base.append(total / (time.perf_counter() - t0) / 1e9)
    del views, host
    print(f"cudaMemcpyAsync into pinned memory: D2H {max(d2h_base):.1f} GB/s, H2D {max(h2d_base):.1f} GB/s",
          flush=True)

    cp = ckpt.torch.Checkpointer("gpu-bench", socket=a.socket)
    # (pinned needs a driver: off in the CPU check of this script)
    pinned_writer = dcp.FileSystemWriter(os.path.join(a.dir, "dcp_pinned"), cache_staged_state_dict=(dev == "cuda"))
    stager = None
    if "dcp_stager" in paths:
        try:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
            stager = DefaultStager(StagingOptions(use_pinned_memory=(dev == "cuda"), use_shared_memory=False,
                                                  use_async_staging=True, use_non_blocking_copy=(dev == "cuda")))
        except ImportError:
            print("dcp_stager: this torch has no DefaultStager; left out")
            paths.remove("dcp_stager")
    step = 0
    daemon_stall = []

    def ckpt_save():
        nonlocal step
        step += 1
        t0 = time.perf_counter()
        f = cp.save(state, step)
        f.staged.result()
        dt = time.perf_counter() - t0
        daemon_stall.append(f.daemon_stall)
        f.durable.result()
        return dt

    def torch_save():
        path = os.path.join(a.dir, "torch_save.pt")
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        dt = time.perf_counter() - t0
        os.unlink(path)
        return dt

    def finish(r):
        (r.upload_completion if hasattr(r, "upload_completion") else r).result()

    def fresh(name):
        path = os.path.join(a.dir, name)
        shutil.rmtree(path, ignore_errors=True)
        return path

    def dcp_save(name, make_writer=None, **kw):
        """One DCP async_save into a fresh folder; its stall: until it
        returns, and with asynchronous staging until staging_completion
        (the tensors may change only then)."""
        path = fresh(name)
        if make_writer is not None:
            kw["storage_writer"] = make_writer(path)
        t0 = time.perf_counter()
        r = dcp.async_save(state, checkpoint_id=path, **kw)
        if hasattr(r, "staging_completion"):
            r.staging_completion.result()
        dt = time.perf_counter() - t0
        finish(r)
        return dt

    def dcp_plain():
        return dcp_save("dcp")

    def dcp_pinned():
        return dcp_save("dcp_pinned_step", make_writer=lambda _: pinned_writer)

    def dcp_stager():
        return dcp_save("dcp_stager", make_writer=dcp.FileSystemWriter, async_stager=stager)

    fns = {"ckpt": ckpt_save, "torch_save": torch_save, "dcp": dcp_plain, "dcp_pinned": dcp_pinned,
           "dcp_stager": dcp_stager}
    runs = [(p, fns[p]) for p in paths]
    first, res = {}, {p: [] for p in paths}

    def attempt(name, fn):
        """fn's stall, or None after dropping a baseline this torch cannot
        run (said in the output)."""
        try:
            return fn()
        except Exception as e:
            print(f"  {name} failed, left out: {type(e).__name__}: {e}", flush=True)
            runs.remove((name, fns[name]))
            paths.remove(name)
            res.pop(name)
            first.pop(name, None)
            if name == "ckpt":
                raise
            return None

    for name, fn in list(runs):
        first[name] = attempt(name, fn)
        if first[name] is not None:
            print(f"  first {name}: {first[name] * 1e3:.1f} ms", flush=True)
        time.sleep(a.settle)
    for r in range(a.rounds):
        for name, fn in runs[r % len(runs):] + runs[:r % len(runs)]:
            dt = attempt(name, fn)
            if dt is not None:
                res[name].append(dt)
                print(f"  round {r} {name}: {dt * 1e3:.1f} ms", flush=True)
            time.sleep(a.settle)
    med = {p: statistics.median(v) for p, v in res.items() if v}

    load_gbs, sources = [], set()
    if "ckpt" in paths:
        for _ in range(3):
            sync(dev)
            t0 = time.perf_counter()
            cp.load(state, step=step)
            sync(dev)
            load_gbs.append(total / (time.perf_counter() - t0) / 1e9)
            sources.add(cp.last_load["source"])
    cp.close()
    for p in ("dcp", "dcp_pinned_step", "dcp_stager", "dcp_pinned"):
        shutil.rmtree(os.path.join(a.dir, p), ignore_errors=True)

    print(f"\nstate {gib:.2f} GiB in {len(sz)} tensors on {dev}; stall per save, median of {a.rounds} "
          f"(first save in brackets):")
    labels = {"ckpt": "ckpt Checkpointer.save -> staged", "torch_save": "torch.save (fsync)",
              "dcp": "DCP async_save, FileSystemWriter", "dcp_pinned": "DCP async_save, pinned cache",
              "dcp_stager": "DCP async_save, DefaultStager pinned"}
    for p in paths:
        print(f"  {labels[p]:38s} {med[p] * 1e3:9.1f} ms  ({first[p] * 1e3:.1f} ms)")
    out = {"gib": gib, "tensors": len(sz), "device": dev, "torch": torch.__version__,
           "stall_ms": {p: med[p] * 1e3 for p in paths}, "first_ms": {p: first[p] * 1e3 for p in paths},
           "rounds_ms": {p: [x * 1e3 for x in v] for p, v in res.items()},
           "d2h_base_gbs": max(d2h_base), "h2d_base_gbs": max(h2d_base)}
    if "ckpt" in paths:
        stage_gbs = total / med["ckpt"] / 1e9
        out.update(ckpt_stage_gbs=stage_gbs, d2h_ratio=stage_gbs / max(d2h_base),
                   daemon_stall_ms=statistics.median(daemon_stall[1:] or daemon_stall) * 1e3,
                   first_over_later=first["ckpt"] / med["ckpt"],
                   load_gbs=max(load_gbs), h2d_ratio=max(load_gbs) / max(h2d_base), load_sources=sorted(sources))
        print(f"D2H staging: {stage_gbs:.1f} GB/s seen by the trainer, cudaMemcpyAsync {max(d2h_base):.1f} GB/s: "
              f"{out['d2h_ratio']:.0%} (goal 90%); the daemon's share of the stall {out['daemon_stall_ms']:.1f} ms")
        print(f"H2D restore from the daemon's memory: {max(load_gbs):.1f} GB/s, cudaMemcpyAsync "
              f"{max(h2d_base):.1f} GB/s: {out['h2d_ratio']:.0%} (from {', '.join(sorted(sources))})")
        print(f"first ckpt save {first['ckpt'] * 1e3:.1f} ms, later {med['ckpt'] * 1e3:.1f} ms: "
              f"{out['first_over_later']:.2f}x")
        for p in paths:
            if p != "ckpt":
                print(f"  {labels[p]} / ckpt: {med[p] / med['ckpt']:.1f}x")
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
