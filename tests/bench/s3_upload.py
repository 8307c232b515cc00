#!/usr/bin/env python3
"""Upload throughput to S3 through ckptd against boto3's managed transfer,
against the same server in the same run: moto (tests/s3/moto_harness.py)
or, with --server rgw, a real one, Ceph RGW 16.2 (tests/s3/rgw_harness.py,
objects in the OSD's memory), with the same part size and concurrency; and
ckptd's CPU seconds per GiB uploaded (from ckptctl status, which reports
the daemon's own CPU time).

    .venv-test/bin/python tests/bench/s3_upload.py --build build-test-plain --size-mb 256 --rounds 3
    .venv-test/bin/python tests/bench/s3_upload.py --server rgw --size-mb 1024 --rounds 3

moto is a Python server, so every side is bounded by it: this measures
whether ckptd's uploader keeps up with boto3's, not S3's speed. They
alternate within each round. s3torchconnector's writer (AWS CRT, same part
size; it sizes its own concurrency) joins when it is installed
(`pip install s3torchconnector` into the venv; the test venv does not have
it)."""
import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "s3"))
from moto_harness import Moto  # noqa: E402
from rgw_harness import Rgw  # noqa: E402
from boto3.s3.transfer import TransferConfig  # noqa: E402

try:
    from s3torchconnector import S3Checkpoint, S3ClientConfig
except ImportError:
    S3Checkpoint = None


def status(ctl, sock):
    r = subprocess.run([ctl, "--socket", sock, "--json", "status"], check=True, capture_output=True, text=True)
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-test-plain")
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--part-mb", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--iam", action="store_true", help="moto in IAM mode (checks every signature; slower)")
    ap.add_argument("--server", choices=("moto", "rgw"), default="moto")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="s3bench-")
    m = Rgw(tmp, memstore_bytes=min(16 << 30, (3 * a.rounds + 1) * (a.size_mb << 20))) if a.server == "rgw" \
        else Moto(tmp, iam=a.iam)
    try:
        run(a, tmp, m)
    finally:
        m.stop()


def run(a, tmp, m):
    ak, sk = m.access_key or "test", m.secret_key or "test"
    s3 = m.client()
    s3.create_bucket(Bucket="bench")
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ak, AWS_SECRET_ACCESS_KEY=sk)
    url = (f"s3://bench/ckptd?endpoint={m.endpoint}&region=us-east-1&path_style=1&part_size={a.part_mb}M"
           f"&concurrency={a.concurrency}")
    sock = os.path.join(tmp, "ckptd.sock")
    ckptd = os.path.join(a.build, "daemon", "ckptd")
    ctl = os.path.join(a.build, "client", "ckptctl")
    example = os.path.join(a.build, "client", "ckpt-example")
    d = subprocess.Popen([ckptd, "--socket", sock, "--storage", url, "--staging-bytes", f"{a.size_mb * 2 + 64}M",
                          "--chunk-bytes", f"{a.part_mb}M", "--state-dir", os.path.join(tmp, "state")],
                         env=env, stderr=open(os.path.join(tmp, "ckptd.log"), "w"))
    for _ in range(400):
        if os.path.exists(sock):
            break
        time.sleep(0.05)
    payload = os.urandom(a.size_mb << 20)
    cfg = TransferConfig(multipart_threshold=a.part_mb << 20, multipart_chunksize=a.part_mb << 20,
                         max_concurrency=a.concurrency, use_threads=True)
    print(f"{a.size_mb} MiB per upload, {a.part_mb} MiB parts, {a.concurrency} in parallel, " +
          ("Ceph RGW 16.2 (memstore)" if a.server == "rgw" else f"moto {'IAM mode' if a.iam else 'plain'}"))
    s3tc = None
    if S3Checkpoint:
        os.environ.update(AWS_ACCESS_KEY_ID=ak, AWS_SECRET_ACCESS_KEY=sk)
        s3tc = S3Checkpoint(region="us-east-1", endpoint=m.endpoint,
                            s3client_config=S3ClientConfig(part_size=a.part_mb << 20, force_path_style=True))
    print(f"{'round':>5} {'ckptd MB/s':>11} {'boto3 MB/s':>11} {'ratio':>6} {'s3tc MB/s':>10} {'ratio':>6} "
          f"{'ckptd CPU s/GiB':>16}")
    ratios = []
    for rnd in range(a.rounds):
        before = status(ctl, sock)
        t0 = time.monotonic()
        r = subprocess.run([example, "--socket", sock, "--job", f"bench{rnd}", "--steps", "1", "--size-mb",
                            str(a.size_mb), "--tensors", "1"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("ckpt-example failed: " + r.stdout + r.stderr)
        # durable_ms of the one step: the upload (staging is ~1% of it)
        line = [l for l in r.stdout.splitlines() if l.strip().startswith("1 ")][0].split()
        durable_s = float(line[3]) / 1e3
        after = status(ctl, sock)
        up = after["bytes_durable"] - before["bytes_durable"]
        cpu = (after["cpu_ns"] - before["cpu_ns"]) / 1e9
        ours = up / durable_s / 1e6
        t0 = time.monotonic()
        s3.upload_fileobj(io.BytesIO(payload), "bench", f"boto3/{rnd}", Config=cfg)
        theirs = len(payload) / (time.monotonic() - t0) / 1e6
        ratios.append(ours / theirs)
        tc = float("nan")
        if s3tc:
            t0 = time.monotonic()
            try:
                with s3tc.writer(f"s3://bench/s3tc/{rnd}") as w:
                    w.write(payload)
                tc = len(payload) / (time.monotonic() - t0) / 1e6
            except Exception as e:  # s3torchconnector cannot write to RGW 16.2 (its empty ETag)
                print(f"s3torchconnector failed: {str(e).splitlines()[0][:200]}")
        print(f"{rnd:>5} {ours:>11.1f} {theirs:>11.1f} {ours / theirs:>6.2f} {tc:>10.1f} {ours / tc:>6.2f} "
              f"{cpu / (up / 2**30):>16.2f}")
        # RGW keeps objects in memory: drop this round's
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket="bench"):
            for o in page.get("Contents", []):
                s3.delete_object(Bucket="bench", Key=o["Key"])
    print(f"median ratio {sorted(ratios)[len(ratios) // 2]:.2f} (goal >= 1.0)")
    d.terminate()
    d.wait()


if __name__ == "__main__":
    main()
