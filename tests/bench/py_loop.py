#!/usr/bin/env python3
"""What a checkpoint costs a real training loop: an MLP (no BatchNorm)
with Adam, whose model plus optimizer state is about --state-mb MiB
(default 1024), trains --steps steps per run and checkpoints at the start
of every --every-th step. A run's extra time over a run without
checkpoints, divided by its checkpoints, is the cost per checkpoint; the
time the loop spent blocked in save calls and waits is printed too.

  none           no checkpoint (the baseline of each round)
  ckpt           Checkpointer.save, then staged.result() at once
  ckpt_overlap   Checkpointer.save at the start of the step; forward and
                 backward run while ckptd copies; staged.result() just
                 before optimizer.step() (the first write to saved state)
  ckpt_dcp       dcp.async_save(storage_writer=ckpt.dcp.Writer(...))
  ckpt_dcp_async ckpt.dcp.Writer(async_staging=True); staging_completion
                 waited just before optimizer.step()
  torch_save     torch.save to a file, fsync'd
  dcp_fs         dcp.async_save(storage_writer=FileSystemWriter(...))
  dcp_fs_async   the same with DCP's DefaultStager(use_async_staging=True)
                 (torch builds that have it): DCP copies the state in a
                 background thread; staging_completion is waited just
                 before optimizer.step()

Before a checkpoint each mode waits for its previous one to be durable
(uploaded), as DCP's documentation asks; that wait counts as blocked.
Modes are interleaved, in an order rotated every round; medians over
--rounds rounds. On a machine whose CPU cores also do the training (this
project's 2-core VM), ckptd's copy competes with forward and backward, so
overlapping hides less than it would on a GPU node.

    python tests/bench/py_loop.py --socket /tmp/ckptd.sock --dir /var/tmp/bench
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

MODES = ("none", "ckpt", "ckpt_overlap", "ckpt_dcp", "ckpt_dcp_async", "torch_save", "dcp_fs", "dcp_fs_async")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--dir", required=True, help="for torch.save and DCP's FileSystemWriter")
    ap.add_argument("--state-mb", type=int, default=1024, help="model + Adam state (3x the parameters)")
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default=",".join(MODES))
    a = ap.parse_args()
    modes = [m for m in MODES if m in a.only.split(",")]
    stager = None
    if "dcp_fs_async" in modes:
        try:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
            stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                                  use_async_staging=True, use_non_blocking_copy=False))
        except ImportError:
            print("dcp_fs_async: this torch has no DefaultStager; left out")
            modes.remove("dcp_fs_async")
    if "none" not in modes:
        modes.insert(0, "none")

    torch.manual_seed(0)
    layer_bytes = a.width * (a.width + 1) * 4
    layers = max(1, round(a.state_mb * (1 << 20) / 3 / layer_bytes))
    model = torch.nn.Sequential(*[torch.nn.Linear(a.width, a.width) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    x = torch.randn(a.batch, a.width)
    os.makedirs(a.dir, exist_ok=True)
    # Steps are unique per run (the clock): a job with steps is continued.
    cp = ckpt.torch.Checkpointer("bench-loop", socket=a.socket, exist_ok=True)
    counter = [int(time.time()) * 100]

    def state():
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    def fwd_bwd():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()

    # Each mode: start(step) -> a wait callable for "before optimizer.step()".
    pending = {}

    def wait_pending(mode):
        p = pending.pop(mode, None)
        if p is not None:
            p()

    def start_ckpt(mode):
        counter[0] += 1
        cp.overlap = mode != "ckpt"  # "ckpt": save() returns once staged (the default)
        f = cp.save(state(), counter[0])
        pending[mode] = f.durable.result
        if mode == "ckpt":
            f.staged.result()
            return None
        return f.staged.result

    def start_dcp(mode):
        counter[0] += 1
        w = ckpt.dcp.Writer("bench-loop-dcp", step=counter[0], socket=a.socket,
                            async_staging=(mode == "ckpt_dcp_async"))
        r = dcp.async_save(state(), storage_writer=w)
        up = r.upload_completion if hasattr(r, "upload_completion") else r
        pending[mode] = up.result
        if mode == "ckpt_dcp_async":
            return r.staging_completion.result if hasattr(r, "staging_completion") else w.synchronize_staging
        return None

    def start_torch_save(mode):
        with open(os.path.join(a.dir, "loop_torch_save.pt"), "wb") as fh:
            torch.save(state(), fh)
            fh.flush()
            os.fsync(fh.fileno())
        return None

    def start_dcp_fs(mode):
        path = os.path.join(a.dir, "loop_" + mode)
        shutil.rmtree(path, ignore_errors=True)
        if mode == "dcp_fs_async":
            r = dcp.async_save(state(), storage_writer=dcp.FileSystemWriter(path), async_stager=stager)
            pending[mode] = r.upload_completion.result
            return r.staging_completion.result
        r = dcp.async_save(state(), storage_writer=dcp.FileSystemWriter(path))
        up = r.upload_completion if hasattr(r, "upload_completion") else r
        pending[mode] = up.result
        return None

    starters = {"ckpt": start_ckpt, "ckpt_overlap": start_ckpt, "ckpt_dcp": start_dcp,
                "ckpt_dcp_async": start_dcp, "torch_save": start_torch_save, "dcp_fs": start_dcp_fs,
                "dcp_fs_async": start_dcp_fs}

    def run(mode):
        blocked, nck = 0.0, 0
        t_run = time.perf_counter()
        for s in range(a.steps):
            before = None
            if mode != "none" and s % a.every == 0:
                t0 = time.perf_counter()
                wait_pending(mode)
                before = starters[mode](mode)
                blocked += time.perf_counter() - t0
                nck += 1
            fwd_bwd()
            if before is not None:
                t0 = time.perf_counter()
                before()
                blocked += time.perf_counter() - t0
            opt.step()
        t0 = time.perf_counter()
        wait_pending(mode)  # not part of the loop: the last upload
        total = t0 - t_run
        return total, blocked, nck

    # Warm-up: Adam's state exists after a step; every mode registers or
    # allocates what it keeps.
    fwd_bwd()
    opt.step()
    for m in list(modes):
        try:
            run(m)
        except Exception as e:
            if m.startswith("ckpt"):
                raise
            # A baseline this torch cannot run (torch 2.11's DefaultStager
            # fails on CPU tensors): said, and left out.
            print(f"{m} failed, left out: {type(e).__name__}: {e}")
            modes.remove(m)
            pending.pop(m, None)
    res = {m: {"total": [], "blocked": [], "per_ckpt": []} for m in modes}
    for r in range(a.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        totals = {}
        for m in order:
            total, blocked, nck = run(m)
            totals[m] = total
            res[m]["total"].append(total)
            res[m]["blocked"].append(blocked / max(1, nck))
            res[m]["nck"] = nck
        for m in modes:
            if m != "none":
                res[m]["per_ckpt"].append((totals[m] - totals["none"]) / res[m]["nck"])
    nbytes = sum(t.numel() * t.element_size() for t in model.parameters()) * 3
    med = {m: {k: statistics.median(v) * 1e3 for k, v in res[m].items() if isinstance(v, list) and v}
           for m in modes}
    print(f"{layers} layers of {a.width}x{a.width}, model + Adam state {nbytes / (1 << 30):.2f} GiB, "
          f"{a.steps} steps per run, a checkpoint every {a.every}, {a.rounds} rounds, medians:")
    print(f"  none: {med['none']['total'] / a.steps:.0f} ms per step")
    print(f"  {'mode':16s} {'cost per checkpoint':>20s} {'blocked per checkpoint':>24s}")
    for m in modes:
        if m != "none":
            print(f"  {m:16s} {med[m]['per_ckpt']:17.0f} ms {med[m]['blocked']:21.0f} ms")
    if "torch_save" in modes:
        for m in modes:
            if m not in ("none", "torch_save") and med[m]["per_ckpt"] > 0:
                print(f"  torch_save / {m}: cost {med['torch_save']['per_ckpt'] / med[m]['per_ckpt']:.1f}x, "
                      f"blocked {med['torch_save']['blocked'] / max(med[m]['blocked'], 1e-3):.1f}x")
    cp.close()
    ckpt.dcp.close_all()
    if stager is not None:
        stager.close()
    for m in ("dcp_fs", "dcp_fs_async"):
        shutil.rmtree(os.path.join(a.dir, "loop_" + m), ignore_errors=True)
    try:
        os.unlink(os.path.join(a.dir, "loop_torch_save.pt"))
    except FileNotFoundError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
