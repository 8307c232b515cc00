#!/usr/bin/env python3
"""Time to durable with and without compression on upload over a link
throttled to --rate (default 1gbit), side by side in one run (issue 39).

A trained model's state (tests/bench/trained_state.py: bf16 weights, fp32
Adam first and second moments), repeated --copies times as separate
tensors, is saved through ckpt.torch.Checkpointer to two daemons that
differ only in [pool] compress. Both run in a network namespace whose one
link (a veth) to the S3 server (moto, in this namespace) is shaped by htb
to --rate both ways; they take turns, one save at a time, --reps times
each. Printed per save: raw and stored bytes (ckptd_bytes_uploaded_total,
ckptd_bytes_stored_total) and seconds to durable; then the medians and
their ratio.

    .venv-test/bin/python tests/bench/trained_state.py --out /tmp/trained --steps 400
    .venv-test/bin/python tests/bench/compress_link.py --build build-test-plain --state /tmp/trained

Root only (ip netns, tc). moto is a Python server: with the link at
1 Gbit/s it can be the slower side; --rate lower (500mbit) makes the link
the bound for certain. Leaves nothing behind (the namespace, the veth and
the processes go at the end, also on failure)."""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
import torch

import ckpt.torch

NS = "ckz-bench"
HOST_IP, NS_IP = "10.99.0.1", "10.99.0.2"


def sh(*cmd, check=True):
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True)


def link_up(rate):
    link_down()
    sh("ip", "netns", "add", NS)
    sh("ip", "link", "add", "ckz0", "type", "veth", "peer", "name", "ckz1")
    sh("ip", "link", "set", "ckz1", "netns", NS)
    sh("ip", "addr", "add", HOST_IP + "/24", "dev", "ckz0")
    sh("ip", "link", "set", "ckz0", "up")
    nx = ["ip", "netns", "exec", NS]
    sh(*nx, "ip", "addr", "add", NS_IP + "/24", "dev", "ckz1")
    sh(*nx, "ip", "link", "set", "ckz1", "up")
    sh(*nx, "ip", "link", "set", "lo", "up")
    for pre, dev in ((nx, "ckz1"), ([], "ckz0")):
        sh(*pre, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10")
        sh(*pre, "tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", rate, "ceil",
           rate)


def link_down():
    sh("ip", "link", "del", "ckz0", check=False)
    sh("ip", "netns", "del", NS, check=False)


def free_port():
    s = socket.socket()
    s.bind((HOST_IP, 0))
    p = s.getsockname()[1]
    s.close()
    return p


def state_dict(path, copies):
    """The trained state, copies times: bf16 weights and fp32 moments. A
    copy's tensors follow the whole of the copy before (the layout keeps
    the dict's order), so that no 4 MiB piece holds the same bytes twice
    and zstd cannot gain from the copies being alike."""
    idx = json.load(open(os.path.join(path, "index.json")))
    raw = {k: np.fromfile(os.path.join(path, k), dtype=np.uint8) for k in ("weights.bf16", "adam_m.fp32",
                                                                            "adam_v.fp32")}
    sd = {}
    for c in range(copies):
        for t in idx["tensors"]:
            f = t["kind"] + "." + t["dtype"]
            if f not in raw:
                continue
            b = torch.from_numpy(raw[f][t["offset"]:t["offset"] + t["bytes"]].copy())
            dt = torch.bfloat16 if t["dtype"] == "bf16" else torch.float32
            sd[f"c{c}.{t['kind']}.{t['name']}"] = b.view(dt).reshape(t["shape"])
    return sd


def metric(ctl, sock, name):
    out = sh(ctl, "--socket", sock, "metrics").stdout
    return sum(int(float(line.split()[-1])) for line in out.splitlines() if line.startswith(name))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-test-plain")
    ap.add_argument("--state", required=True, help="trained_state.py's --out")
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("root only: ip netns and tc")
    ckptd = os.path.join(a.build, "daemon", "ckptd")
    ctl = os.path.join(a.build, "client", "ckptctl")
    sd = state_dict(a.state, a.copies)
    raw = sum(t.numel() * t.element_size() for t in sd.values())
    print(f"# {len(sd)} tensors, {raw / 2**20:.1f} MiB; link {a.rate} both ways (htb on a veth)")
    tmp = tempfile.mkdtemp(prefix="ckz-bench-")
    procs = []
    try:
        link_up(a.rate)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", HOME="/nonexistent")
        moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", HOST_IP, "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(moto)
        endpoint = f"http://{HOST_IP}:{port}"
        for _ in range(300):
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        import boto3
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                     aws_secret_access_key="bench").create_bucket(Bucket="bench")
        socks = {}
        for mode in ("raw", "compressed"):
            d = os.path.join(tmp, mode)
            os.makedirs(d)
            conf = os.path.join(d, "ckptd.conf")
            with open(conf, "w") as f:
                f.write("[pool]\ncompress = %s\nmemory_tier = false\n" % ("true" if mode == "compressed" else
                                                                             "false"))
            sock = os.path.join(d, "ckptd.sock")
            url = (f"s3://bench/{mode}?endpoint={endpoint}&region=us-east-1&path_style=1&part_size=16M"
                   "&concurrency=8")
            p = subprocess.Popen(["ip", "netns", "exec", NS, ckptd, "--socket", sock, "--storage", url,
                                  "--staging-bytes", str(2 * raw + (256 << 20)), "--state-dir",
                                  os.path.join(d, "state"), "--config", conf, "--log-level", "debug"],
                                 env=env, stderr=open(os.path.join(d, "ckptd.log"), "w"))
            procs.append(p)
            for _ in range(200):
                if os.path.exists(sock):
                    break
                time.sleep(0.05)
            socks[mode] = sock
        cps = {m: ckpt.torch.Checkpointer("bench-" + m, socket=socks[m], rank=0, world_size=1) for m in socks}
        res = {m: [] for m in socks}
        order = ["raw", "compressed"]
        for rep in range(a.reps + 1):
            for m in order if rep % 2 == 0 else order[::-1]:
                b0 = metric(ctl, socks[m], "ckptd_bytes_stored_total")
                t0 = time.perf_counter()
                f = cps[m].save(sd, rep + 1)
                f.durable.result()
                dt = time.perf_counter() - t0
                stored = metric(ctl, socks[m], "ckptd_bytes_stored_total") - b0
                tag = "warm-up" if rep == 0 else f"rep {rep}"
                print(f"{tag:8} {m:10} {raw / 2**20:8.1f} MiB raw {stored / 2**20:8.1f} MiB stored "
                      f"({raw / stored:.3f}x)  durable in {dt:.2f} s")
                if rep > 0:
                    res[m].append((dt, stored))
        ms = [float(line.rsplit(" in ", 1)[1].split()[0])
              for line in open(os.path.join(tmp, "compressed", "ckptd.log")) if "coded) in" in line]
        print(f"compressing took {statistics.median(ms):.0f} ms per save (median of {len(ms)}; "
              f"{raw / statistics.median(ms) / 1e6:.2f} GB/s on [pool] copy_threads threads)")
        # Restores from storage over the same link (no memory tier): the
        # compressed step's fewer bytes, decoded on the copy threads.
        loads = {m: [] for m in socks}
        for rep in range(a.reps):
            for m in order if rep % 2 == 0 else order[::-1]:
                into = {k: torch.empty_like(v) for k, v in sd.items()}
                t0 = time.perf_counter()
                cps[m].load(into)
                dt = time.perf_counter() - t0
                assert all(torch.equal(into[k].view(torch.uint8), sd[k].view(torch.uint8)) for k in sd), m
                print(f"restore  {m:10} from storage, bit-exact, in {dt:.2f} s")
                loads[m].append(dt)
        for cp in cps.values():
            cp.close()
        mr = statistics.median(t for t, _ in res["raw"])
        mc = statistics.median(t for t, _ in res["compressed"])
        sc = statistics.median(s for _, s in res["compressed"])
        print(f"median time to durable: raw {mr:.2f} s, compressed {mc:.2f} s: {mc / mr:.2f} of raw; "
              f"bytes stored {raw / sc:.3f}x fewer")
        lr, lc = statistics.median(loads["raw"]), statistics.median(loads["compressed"])
        print(f"median restore from storage: raw {lr:.2f} s, compressed {lc:.2f} s: {lc / lr:.2f} of raw")
    finally:
        for p in procs[::-1]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
        link_down()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
