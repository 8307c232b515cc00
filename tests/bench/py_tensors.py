#!/usr/bin/env python3
"""The control path's cost per tensor (issue "Python adoption"): the stall of
ckpt.torch.Checkpointer.save until staged, for --size-mb (default 512) MiB
of float32 split into N tensors (100, 2000, 10000 by default), side by side
in one run with the same bytes as one flat tensor. Per N:
  - the first save of a fresh Checkpointer (it moves the tensors into
    shared memory, registers them and declares their table);
  - prepare(), which does that ahead, and the first save after it;
  - the median of --rounds later saves;
  - the first save (without prepare()) over a later one: issue 40's
    goal is at most 2x at 10,000 tensors.
Every save gets a new dict of new tensor objects (as model.state_dict()
hands out), made before the clock starts. What a later save costs beyond
the flat one, divided by N, is the per-tensor cost; "of which in ckptd" is
the same difference in the daemon's own time to staged (SaveStaged's
stall_ns, SaveFuture.daemon_stall).

    python tests/bench/py_tensors.py --socket /tmp/ckptd.sock [--json OUT]

--breakdown N times the parts of one first save of N tensors instead
(the walk that names them, the skeleton's pickle, the bind, the arena's
new file and its copies, the table; docs/benchmarks.md "The first save
of a state dict").

ckptd's pool must hold a save and the copy in flight (--staging-bytes of
twice --size-mb or more). Each case is its own job; every save waits for
durable before the next, so uploads never overlap a measured stall.
"""
import argparse
import json
import statistics
import time

import torch

import ckpt.torch


def stall(cp, sd, step, daemon=None):
    """The trainer's stall; with a list, the daemon's own share goes in it."""
    t = time.perf_counter()
    f = cp.save(sd, step)
    f.staged.result()
    s = time.perf_counter() - t
    if daemon is not None:
        daemon.append(f.daemon_stall)
    f.durable.result()
    return s


def fresh(sd):
    return {k: v.detach() for k, v in sd.items()}


def case(sock, job, sd, rounds):
    """(first save, prepare, first save after prepare, median later, all
    later, median of the daemon's own share of the later ones)."""
    with ckpt.torch.Checkpointer(job + "-cold", socket=sock) as cp:
        first = stall(cp, fresh(sd), 1)
    with ckpt.torch.Checkpointer(job, socket=sock) as cp:
        t = time.perf_counter()
        cp.prepare(sd)
        prep = time.perf_counter() - t
        prepared = stall(cp, fresh(sd), 1)
        daemon = []
        later = [stall(cp, fresh(sd), 2 + r, daemon) for r in range(rounds)]
    return first, prep, prepared, statistics.median(later), later, statistics.median(daemon)


def breakdown(sock, size_mb, n):
    """The parts of a first save of n tensors, in ms: each function's
    total time inside that save (the bind holds arena_move, which holds
    posix_fallocate), and four later saves."""
    import functools
    import os

    import ckpt._plan as plan
    import ckpt._regs as regs
    import ckpt.client as client
    spent = {}

    def timed(owner, name):
        f = getattr(owner, name)

        @functools.wraps(f)
        def g(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        setattr(owner, name, g)
        return lambda: setattr(owner, name, f)
    undo = [timed(plan, "flatten"), timed(plan, "dump_skeleton"), timed(regs.Registrations, "bind"),
            timed(regs.Registrations, "arena_move"), timed(os, "posix_fallocate"), timed(client.Client, "table")]
    total = size_mb << 20
    sd = {f"layers.{i}.weight": torch.randn(total // 4 // n) for i in range(n)}
    try:
        with ckpt.torch.Checkpointer(f"bench-parts-{time.time_ns()}", socket=sock) as cp:
            first = stall(cp, fresh(sd), 1)
            got = dict(spent)
            later = [stall(cp, fresh(sd), 2 + r) for r in range(4)]
    finally:
        for u in undo:
            u()
    print(f"{size_mb} MiB in {n:,} tensors: first save {first * 1e3:.1f} ms; later saves "
          + ", ".join(f"{x * 1e3:.1f}" for x in later) + " ms")
    for k, v in got.items():
        print(f"  {k:16s} {v * 1e3:8.1f} ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--size-mb", type=int, default=512)
    ap.add_argument("--tensors", default="100,2000,10000")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--breakdown", type=int, metavar="N")
    a = ap.parse_args()
    if a.breakdown:
        breakdown(a.socket, a.size_mb, a.breakdown)
        return
    total = a.size_mb << 20
    torch.manual_seed(0)
    flat = {"flat": torch.randn(total // 4)}
    f_first, f_prep, f_prepared, f_med, f_all, f_dmn = case(a.socket, f"bench-flat-{time.time_ns()}", flat, a.rounds)
    rows = []
    for n in (int(x) for x in a.tensors.split(",")):
        sd = {f"layers.{i}.weight": torch.randn(total // 4 // n) for i in range(n)}
        first, prep, prepared, med, allv, dmn = case(a.socket, f"bench-{n}-{time.time_ns()}", sd, a.rounds)
        rows.append({"tensors": n, "first_ms": first * 1e3, "prepare_ms": prep * 1e3,
                     "first_prepared_ms": prepared * 1e3, "later_ms": med * 1e3,
                     "later_all_ms": [x * 1e3 for x in allv], "beyond_flat_ms": (med - f_med) * 1e3,
                     "per_tensor_us": (med - f_med) / n * 1e6, "first_over_later": prepared / med,
                     "unprepared_over_later": first / med,
                     "daemon_ms": dmn * 1e3, "daemon_beyond_flat_ms": (dmn - f_dmn) * 1e3})
        del sd
    print(f"{a.size_mb} MiB of float32; later saves: median of {a.rounds}; flat (one tensor): first "
          f"{f_first * 1e3:.0f} ms, prepare {f_prep * 1e3:.0f} ms, first after prepare {f_prepared * 1e3:.1f} ms, "
          f"later {f_med * 1e3:.1f} ms (in ckptd {f_dmn * 1e3:.1f} ms); first / later {f_first / f_med:.1f}x")
    print("| tensors | first save | prepare() | first save after prepare | later saves | beyond the flat copy "
          "| of which in ckptd | per tensor | first (prepared) / later | first / later |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['tensors']:,} | {r['first_ms']:.0f} ms | {r['prepare_ms']:.0f} ms | {r['first_prepared_ms']:.1f} ms "
              f"| {r['later_ms']:.1f} ms | {r['beyond_flat_ms']:.1f} ms | {r['daemon_beyond_flat_ms']:.1f} ms "
              f"| {r['per_tensor_us']:.2f} µs | {r['first_over_later']:.2f}x | {r['unprepared_over_later']:.1f}x |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"size_mb": a.size_mb, "flat_first_ms": f_first * 1e3, "flat_prepare_ms": f_prep * 1e3,
                       "flat_first_prepared_ms": f_prepared * 1e3, "flat_later_ms": f_med * 1e3,
                       "flat_daemon_ms": f_dmn * 1e3,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
