#!/usr/bin/env python3
"""Incremental steps against full saves, side by side in one run (issue 39):
bytes stored, storage requests and time to durable per step, for

  lora:      a frozen base (a trained model's fp32 weights from
             trained_state.py, --copies times) and small adapters (16 x
             [64, 1024] fp32) that change every step: the base is over 90%
             of the bytes;
  embedding: a table of [--rows, 512] fp32 of which --touch random rows
             change each step, and a dense part (8 MiB) that changes every
             step.

Each is saved --steps times through ckpt.torch.Checkpointer to two daemons
that differ only in [pool] incremental (compression off in both), taking
turns. They run in a network namespace whose veth to the S3 server is
shaped by htb to --rate both ways; the server is moto behind the counting
proxy (tests/s3/fault_proxy.py), which counts each save's requests.
"changed" is the bytes of the tensors or rows the step changed; the
target is bytes stored per step at most 1.1x that, plus the manifests.

    .venv-test/bin/python tests/bench/trained_state.py --out /tmp/trained --steps 400
    .venv-test/bin/python tests/bench/incremental.py --build build-test-plain --state /tmp/trained

--piece-bytes sets both daemons' [pool] piece_bytes (default 4M): with
64K, a changed row of the table costs 64 KiB, not 4 MiB.

Root only (ip netns, tc)."""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import ckpt.torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "s3"))
import compress_link as cl  # noqa: E402
from fault_proxy import FaultProxy  # noqa: E402
from moto_harness import Moto  # noqa: E402


def lora(state, copies, g):
    base = cl.state_dict(state, copies)
    base = {k: v for k, v in base.items() if ".weights." in k}  # the bf16 weights, frozen
    adapters = {f"lora.{i}.A": torch.randn(64, 1024, generator=g) for i in range(16)}

    def step(sd):
        for k in adapters:
            sd[k].add_(torch.randn(sd[k].shape, generator=g) * 1e-3)
        return sum(v.numel() * v.element_size() for v in adapters.values())

    return {**base, **adapters}, step


def embedding(rows, touch, g):
    sd = {"emb": torch.randn(rows, 512, generator=g) * 0.02, "dense": torch.randn(2048, 1024, generator=g) * 0.02}

    def step(s):
        idx = torch.randint(0, rows, (touch,), generator=g)
        s["emb"][idx] += torch.randn(touch, 512, generator=g) * 1e-3
        s["dense"].add_(torch.randn(s["dense"].shape, generator=g) * 1e-3)
        return len(set(idx.tolist())) * 512 * 4 + s["dense"].numel() * 4

    return sd, step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-test-plain")
    ap.add_argument("--state", required=True, help="trained_state.py's --out")
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--rows", type=int, default=131072)
    ap.add_argument("--touch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--only", default="lora,embedding")
    ap.add_argument("--piece-bytes", default="4M", help="[pool] piece_bytes of both daemons")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("root only: ip netns and tc")
    ckptd = os.path.join(a.build, "daemon", "ckptd")
    ctl = os.path.join(a.build, "client", "ckptctl")
    tmp = tempfile.mkdtemp(prefix="inc-bench-")
    procs, moto, proxy = [], None, None
    try:
        cl.link_up(a.rate)
        moto = Moto(tmp, iam=False)
        proxy = FaultProxy(moto.port, host=cl.HOST_IP)
        moto.client().create_bucket(Bucket="bench")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", HOME="/nonexistent")
        socks = {}
        for mode in ("full", "incremental"):
            d = os.path.join(tmp, mode)
            os.makedirs(d)
            conf = os.path.join(d, "ckptd.conf")
            with open(conf, "w") as f:
                f.write("[pool]\nincremental = %s\nmemory_tier = false\npiece_bytes = %s\n" %
                        ("true" if mode == "incremental" else "false", a.piece_bytes))
            sock = os.path.join(d, "ckptd.sock")
            url = (f"s3://bench/{mode}?endpoint={proxy.endpoint.replace('127.0.0.1', cl.HOST_IP)}"
                   "&region=us-east-1&path_style=1&part_size=16M&concurrency=8")
            p = subprocess.Popen(["ip", "netns", "exec", cl.NS, ckptd, "--socket", sock, "--storage", url,
                                  "--staging-bytes", "1200M", "--state-dir", os.path.join(d, "state"),
                                  "--config", conf, "--log-level", "info"],
                                 env=env, stderr=open(os.path.join(d, "ckptd.log"), "w"))
            procs.append(p)
            for _ in range(200):
                if os.path.exists(sock):
                    break
                time.sleep(0.05)
            socks[mode] = sock
        g = torch.Generator().manual_seed(39)
        for run in a.only.split(","):
            sd, change = lora(a.state, a.copies, g) if run == "lora" else embedding(a.rows, a.touch, g)
            total = sum(v.numel() * v.element_size() for v in sd.values())
            print(f"# {run}: {len(sd)} tensors, {total / 2**20:.1f} MiB; link {a.rate}; pieces of {a.piece_bytes}")
            cps = {m: ckpt.torch.Checkpointer(f"{run}-{m}", socket=socks[m], rank=0, world_size=1) for m in socks}
            res = {m: [] for m in socks}
            for step in range(1, a.steps + 1):
                changed = change(sd) if step > 1 else total
                for m in ("full", "incremental") if step % 2 else ("incremental", "full"):
                    b0 = cl.metric(ctl, socks[m], "ckptd_bytes_stored_total")
                    with proxy.lock:
                        proxy.log.clear()
                    t0 = time.perf_counter()
                    cps[m].save(sd, step).durable.result()
                    dt = time.perf_counter() - t0
                    with proxy.lock:
                        reqs = len(proxy.log)
                    stored = cl.metric(ctl, socks[m], "ckptd_bytes_stored_total") - b0
                    print(f"step {step} {m:12} changed {changed / 2**20:8.2f} MiB  stored {stored / 2**20:8.2f} MiB "
                          f"({stored / changed:6.2f}x changed)  {reqs:3d} requests  durable in {dt:.2f} s")
                    if step > 1:
                        res[m].append((stored, changed, reqs, dt))
            # The last step restored from storage (no memory tier): an
            # incremental step's pieces come from several shards.
            loads = {}
            for m in ("full", "incremental"):
                into = {k: torch.empty_like(v) for k, v in sd.items()}
                with proxy.lock:
                    proxy.log.clear()
                t0 = time.perf_counter()
                cps[m].load(into, a.steps)
                dt = time.perf_counter() - t0
                with proxy.lock:
                    reqs = len(proxy.log)
                assert all(torch.equal(into[k], sd[k]) for k in sd), m
                loads[m] = (reqs, dt)
            for cp in cps.values():
                cp.close()
            for m in ("full", "incremental"):
                r = res[m]
                print(f"{run} {m}: per step after the first, median: stored "
                      f"{statistics.median(x[0] for x in r) / 2**20:.2f} MiB = "
                      f"{statistics.median(x[0] / x[1] for x in r):.2f}x changed, "
                      f"{statistics.median(x[2] for x in r):.0f} requests, "
                      f"durable in {statistics.median(x[3] for x in r):.2f} s; restore of step {a.steps}: "
                      f"bit-exact, {loads[m][0]} requests, {loads[m][1]:.2f} s")
    finally:
        for p in procs[::-1]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
        if proxy:
            proxy.stop()
        if moto:
            moto.stop()
        cl.link_down()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    np.random.seed(0)
    main()
