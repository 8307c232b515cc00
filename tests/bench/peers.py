#!/usr/bin/env python3
"""Peer baselines for tests/bench/run: the same state (float32 tensors of
at most 64 MiB, --size-mb in all) through torch.save (fsync'd) and through
DCP async_save with its own FileSystemWriter, to --dir. Prints one JSON
line: size_mb, torch_save_s, dcp_fs_stall_s, dcp_fs_durable_s (medians)."""
import argparse
import json
import os
import shutil
import statistics
import time

import torch
import torch.distributed.checkpoint as dcp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    left, state, i = a.size_mb << 20, {}, 0
    while left:
        n = min(left, 64 << 20)
        state[f"t{i}"] = torch.randn(n // 4)
        left -= n
        i += 1
    ts, st, du = [], [], []
    for r in range(a.rounds + 1):  # the first is a warm-up
        path = os.path.join(a.dir, "torch.pt")
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        t1 = time.perf_counter()
        d = os.path.join(a.dir, "dcp")
        shutil.rmtree(d, ignore_errors=True)
        t2 = time.perf_counter()
        resp = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(d))
        t3 = time.perf_counter()
        (resp.upload_completion if hasattr(resp, "upload_completion") else resp).result()
        t4 = time.perf_counter()
        if r:
            ts.append(t1 - t0)
            st.append(t3 - t2)
            du.append(t4 - t2)
    shutil.rmtree(a.dir, ignore_errors=True)
    print(json.dumps({"size_mb": a.size_mb, "torch_save_s": statistics.median(ts),
                      "dcp_fs_stall_s": statistics.median(st), "dcp_fs_durable_s": statistics.median(du)}))


if __name__ == "__main__":
    main()
