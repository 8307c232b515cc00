#!/usr/bin/env python3
"""Checkpoint save and restore through ckptd against its peers, on the same
S3 server in one run: Ceph RGW 16.2 (tests/s3/rgw_harness.py, one
in-memory OSD) and moto (tests/s3/moto_harness.py), every contender in
turn, each rank a process of its own.

Contenders, for --size-mb MiB per rank (default 1024) and each world size
of --ranks (default 1,4), all ranks started together:

  ckptd          ckpt.torch.Checkpointer: stall (save -> staged), time to
                 durable; the daemon is restarted (its memory lost), then
                 Checkpointer.load from storage
  ckptd DCP      dcp.async_save with ckpt.dcp.Writer (returns -> done),
                 dcp.load with ckpt.dcp.Reader after a restart
  s3tc           s3torchconnector's S3Checkpoint: torch.save into its
                 writer, torch.load from its reader
  s3tc DCP       dcp.async_save with s3torchconnector's S3StorageWriter,
                 dcp.load with its S3StorageReader
  boto3          torch.save into memory, then upload_fileobj; download_fileobj,
                 then torch.load (boto3's default transfer threads)

Times are the slowest rank's, from the moment all ranks were told to go.
A contender that fails is reported with its error. Every restore is
checked bit for bit. Then, with --dcp-table, s3torchconnector's own DCP
benchmark (../shared/reference/002: dcp.save of a model every rank holds,
deduplicated by DCP's planner, save time and MiB/s by model and world
size) for ckptd and s3torchconnector; and what the server itself sustains
(--ceiling-procs boto3 processes of 8 threads, 16 MiB parts, --size-mb
MiB among them, up and down).

The ckptd contenders register the state before the clock starts
(Checkpointer.prepare, ckpt.dcp.Writer.prepare), as a trainer's later
saves find it; without that, the first save also moves the state into
shared memory once.

    .venv-test/bin/python tests/bench/s3_peers.py --server rgw,moto --dcp-table

needs s3torchconnector and tenacity in the venv (pip install
s3torchconnector==1.5.0 tenacity); without them its rows say so.
"""
import argparse
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
sys.path.insert(0, os.path.join(here, "..", "s3"))
sys.path.insert(0, os.path.join(root, "client", "python"))
from moto_harness import free_port  # noqa: E402

BUCKET = "bench"
REGION = "us-east-1"
TENSORS = 8
# s3torchconnector's DCP benchmark models (its models.py), as their
# parameter counts in float32: what matters to storage is the bytes and
# the number of tensors, not the layers' code.
MODELS = {"vit-base": (86_567_656, 200), "gpt2-medium": (354_823_168, 292)}


# ---------------------------------------------------------------- worker

def make_state(spec, zero=False):
    import torch
    if spec.get("model"):
        params, n = MODELS[spec["model"]]
        sizes = [params // n] * n
        prefix = ""
        seed0 = 0
    else:
        sizes = [(spec["size_mb"] << 20) // 4 // TENSORS] * TENSORS
        prefix = f"rank{spec['rank']}." if spec.get("distinct") else ""
        seed0 = 1000 * (spec["rank"] + 1)
    state = {}
    for i, n in enumerate(sizes):
        t = torch.empty(n)
        if zero:
            t.zero_()
        else:
            g = torch.Generator().manual_seed(seed0 + i)
            t.uniform_(generator=g)
        state[f"{prefix}layer{i}.weight"] = t
    return state, seed0


def check_state(state, seed0):
    import torch
    for i, (k, t) in enumerate(state.items()):
        g = torch.Generator().manual_seed(seed0 + i)
        want = torch.empty(t.numel()).uniform_(generator=g)
        if not torch.equal(t, want):
            raise RuntimeError(f"restored {k} differs from what was saved")


def s3tc_client(spec):
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client
    return S3Client(REGION, endpoint=spec["endpoint"], s3client_config=S3ClientConfig(force_path_style=True))


def dcp_wait(r):
    (r.upload_completion if hasattr(r, "upload_completion") else r).result()


def raw(spec):
    """The server alone: this rank's share of one --size-mb, as bytes,
    up then down through boto3 (8 threads, 16 MiB parts)."""
    import boto3
    from boto3.s3.transfer import TransferConfig
    cfg = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20, max_concurrency=8)
    s3 = boto3.client("s3", endpoint_url=spec["endpoint"], region_name=REGION)
    payload = os.urandom((spec["size_mb"] << 20) // spec["world"])
    key = f"raw/{spec['rank']}"
    print("ready", flush=True)
    sys.stdin.readline()
    out = {"rank": spec["rank"]}
    t0 = time.perf_counter()
    try:
        if spec["op"] == "raw_save":
            s3.upload_fileobj(io.BytesIO(payload), BUCKET, key, Config=cfg)
        else:
            s3.download_fileobj(BUCKET, key, io.BytesIO(), Config=cfg)
        out["done"] = time.perf_counter() - t0
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    print("result " + json.dumps(out), flush=True)


def worker(spec):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    op, rank, world = spec["op"], spec["rank"], spec["world"]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    load = op.endswith("_load")
    if op.startswith("raw"):
        return raw(spec)
    state, seed0 = make_state(spec, zero=load)
    if "dcp" in op and world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{spec['port']}", rank=rank, world_size=world)
    uri = f"s3://{BUCKET}/{spec['job']}"
    out = {"rank": rank}
    prep = None
    if op in ("ckpt_save", "ckpt_load"):
        import ckpt.torch
        cp = ckpt.torch.Checkpointer(spec["job"], rank=rank, world_size=world, socket=spec["socket"],
                                     exist_ok=True)
        if op == "ckpt_save":
            cp.prepare(state)  # registration, once per state (a trainer's first save)
    elif op == "ckpt_dcp_save":
        import ckpt.dcp
        prep = ckpt.dcp.Writer(spec["job"], step=1, socket=spec["socket"], exist_ok=True)
        prep.prepare(state)  # as Checkpointer.prepare: registration, once per state
    elif op.startswith("s3tc_dcp"):
        from s3torchconnector.dcp import S3StorageReader, S3StorageWriter
        prep = (S3StorageReader if load else S3StorageWriter)(REGION, uri)
        prep.fs._client = s3tc_client(spec)  # the DCP classes take no endpoint
    elif op.startswith("s3tc"):
        from s3torchconnector import S3Checkpoint, S3ClientConfig
        prep = S3Checkpoint(region=REGION, endpoint=spec["endpoint"],
                            s3client_config=S3ClientConfig(force_path_style=True))
    elif op.startswith("boto3"):
        import boto3
        prep = boto3.client("s3", endpoint_url=spec["endpoint"], region_name=REGION)
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    try:
        if op == "ckpt_save":
            f = cp.save(state, 1)
            f.staged.result()
            out["stall"] = time.perf_counter() - t0
            f.durable.result()
            out["done"] = time.perf_counter() - t0
            cp.close()
        elif op == "ckpt_load":
            cp.load(state, step=1)
            out["done"] = time.perf_counter() - t0
            cp.close()
        elif op in ("ckpt_dcp_save", "s3tc_dcp_save"):
            if spec.get("sync"):
                dcp.save(state, storage_writer=prep)
            else:
                r = dcp.async_save(state, storage_writer=prep)
                out["stall"] = time.perf_counter() - t0
                dcp_wait(r)
            out["done"] = time.perf_counter() - t0
        elif op in ("ckpt_dcp_load", "s3tc_dcp_load"):
            if op == "ckpt_dcp_load":
                import ckpt.dcp
                rd = ckpt.dcp.Reader(spec["job"], step=1, socket=spec["socket"])
            else:
                rd = prep
            dcp.load(state, storage_reader=rd)
            out["done"] = time.perf_counter() - t0
        elif op == "s3tc_save":
            with prep.writer(f"{uri}/rank{rank}.pt") as w:
                torch.save(state, w)
            out["done"] = out["stall"] = time.perf_counter() - t0  # the trainer waits for all of it
        elif op == "s3tc_load":
            with prep.reader(f"{uri}/rank{rank}.pt") as r:
                state = torch.load(r)
            out["done"] = time.perf_counter() - t0
        elif op == "boto3_save":
            buf = io.BytesIO()
            torch.save(state, buf)
            buf.seek(0)
            prep.upload_fileobj(buf, BUCKET, f"{spec['job']}/rank{rank}.pt")
            out["done"] = out["stall"] = time.perf_counter() - t0
        elif op == "boto3_load":
            buf = io.BytesIO()
            prep.download_fileobj(BUCKET, f"{spec['job']}/rank{rank}.pt", buf)
            buf.seek(0)
            state = torch.load(buf)
            out["done"] = time.perf_counter() - t0
        if load:
            check_state(state, seed0)
    except Exception as e:  # the table says what failed, and how
        out["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"
    if "dcp" in op and world > 1:
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    print("result " + json.dumps(out), flush=True)


# ---------------------------------------------------------------- driver

def ranks(op, world, base):
    """Start world workers of op, let them go together, and give the
    slowest rank's times (or the first error)."""
    port = free_port()
    procs = []
    for r in range(world):
        # The environment (credentials) goes as the environment, not in argv.
        spec = dict({k: v for k, v in base.items() if k != "env"}, op=op, rank=r, world=world, port=port)
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=base.get("env")))
    for p in procs:
        line = p.stdout.readline()
        if line.strip() != "ready":
            err = p.stderr.read().strip().splitlines()
            for q in procs:
                q.kill()
            return {"error": (err[-1] if err else "worker died")[:200]}
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    res = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=1800)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        line = [l for l in o.splitlines() if l.startswith("result ")]
        res.append(json.loads(line[0][7:]) if line else {"error": (e.strip().splitlines() or ["died"])[-1][:200]})
    errs = [r["error"] for r in res if "error" in r]
    if errs:  # "[rank0]: pkg.mod.S3Exception: ..." -> "S3Exception: ..."
        return {"error": re.sub(r"^(\[rank\d+\]:\s*)?([\w]+\.)*", "", errs[0])}
    return {k: max(r[k] for r in res) for k in ("stall", "done") if k in res[0]}


class Daemon:
    def __init__(self, a, tmp, m, staging):
        """ckptd on m's bucket, with the workers' environment (m's keys)."""
        self.a, self.tmp, self.staging = a, tmp, staging
        self.sock = os.path.join(tmp, "ckptd.sock")
        self.env = worker_env(a, m)
        self.url = f"s3://{BUCKET}/ckptd?endpoint={m.endpoint}&region={REGION}&path_style=1"
        self.p = None

    def start(self):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        self.p = subprocess.Popen([os.path.join(self.a.build, "daemon", "ckptd"), "--socket", self.sock,
                                   "--storage", self.url, "--staging-bytes", f"{self.staging}M",
                                   "--state-dir", os.path.join(self.tmp, "state")],
                                  env=self.env, stderr=open(os.path.join(self.tmp, "ckptd.log"), "a"))
        for _ in range(600):
            if os.path.exists(self.sock):
                return
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"ckptd did not start; see {self.tmp}/ckptd.log")

    def stop(self):
        if self.p:
            self.p.send_signal(signal.SIGTERM)
            self.p.wait(60)
            self.p = None


def empty_bucket(s3):
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            s3.delete_objects(Bucket=BUCKET, Delete={"Objects": keys})


def fmt(r, k):
    return f"{r[k]:.2f}" if k in r else "-"


def worker_env(a, m):
    return dict(os.environ, AWS_ACCESS_KEY_ID=m.access_key or "test", AWS_SECRET_ACCESS_KEY=m.secret_key or "test",
                PYTHONPATH=os.path.join(root, "client", "python"),
                CKPT_LIB=os.path.abspath(os.path.join(a.build, "client", "libckpt.so")))


def contenders(a, tmp, m, s3, world, job_n):
    """One row per contender for world ranks of a.size_mb MiB."""
    base = {"size_mb": a.size_mb, "endpoint": m.endpoint, "distinct": True,
            "env": worker_env(a, m)}
    rows = []
    d = Daemon(a, tmp, m, staging=world * a.size_mb + 256)
    for name, save, load in (("ckptd Checkpointer", "ckpt_save", "ckpt_load"),
                             ("ckptd DCP async_save", "ckpt_dcp_save", "ckpt_dcp_load"),
                             ("s3torchconnector S3Checkpoint", "s3tc_save", "s3tc_load"),
                             ("s3torchconnector DCP async_save", "s3tc_dcp_save", "s3tc_dcp_load"),
                             ("boto3 upload_fileobj", "boto3_save", "boto3_load")):
        if name.startswith("s3torch") and not a.s3tc:
            rows.append((name, {"error": "s3torchconnector not installed"}, {}))
            continue
        job_n[0] += 1
        spec = dict(base, job=f"j{job_n[0]}", socket=d.sock)
        daemon = save.startswith("ckpt")
        if daemon:
            d.start()
        sv = ranks(save, world, spec)
        ld = {}
        if "error" not in sv:
            if daemon:  # restore after a restart: from storage, not memory
                d.stop()
                d.start()
            ld = ranks(load, world, spec)
        if daemon:
            d.stop()
        rows.append((name, sv, ld))
        print(f"  {world} rank(s) {name:34} save {fmt(sv, 'stall'):>6} {fmt(sv, 'done'):>7}  load {fmt(ld, 'done'):>7} "
              f"{sv.get('error', '') or ld.get('error', '')}", flush=True)
        empty_bucket(s3)
        if m.name == "rgw":
            time.sleep(6)  # RGW's garbage collection frees the OSD's memory
    return rows


def dcp_table(a, tmp, m, s3, job_n):
    rows = []
    base = {"endpoint": m.endpoint, "sync": True,
            "env": worker_env(a, m)}
    for model in a.models.split(","):
        mib = MODELS[model][0] * 4 / (1 << 20)
        for world in [int(w) for w in a.dcp_worlds.split(",")]:
            for who, op in (("ckptd", "ckpt_dcp_save"), ("s3torchconnector", "s3tc_dcp_save")):
                if who == "s3torchconnector" and not a.s3tc:
                    continue
                d = Daemon(a, tmp, m, staging=int(mib) + 256)
                job_n[0] += 1
                spec = dict(base, job=f"j{job_n[0]}", socket=d.sock, model=model)
                if who == "ckptd":
                    d.start()
                r = ranks(op, world, spec)
                if who == "ckptd":
                    d.stop()
                rows.append((model, mib, world, who, r))
                print(f"  dcp.save {model} ({mib:.0f} MiB) world {world} {who:17} "
                      + (f"{r['done']:.2f} s {mib / r['done']:.0f} MiB/s" if "done" in r else r["error"]), flush=True)
                empty_bucket(s3)
                if m.name == "rgw":
                    time.sleep(6)
    return rows


def ceiling(a, m, s3, base):
    """What the server sustains: --ceiling-procs boto3 processes, 8 threads
    each, one --size-mb MiB split among them, up then down (MB/s)."""
    spec = dict(base, job="raw", size_mb=a.size_mb)
    up = ranks("raw_save", a.ceiling_procs, spec)
    down = ranks("raw_load", a.ceiling_procs, spec) if "done" in up else {}
    empty_bucket(s3)
    mb = (a.size_mb << 20) / 1e6
    return (mb / up["done"] if "done" in up else float("nan"), mb / down["done"] if "done" in down else float("nan"))


def serve(a, kind):
    from moto_harness import Moto
    from rgw_harness import Rgw
    tmp = tempfile.mkdtemp(prefix="s3peers-")
    worlds = [int(w) for w in a.ranks.split(",")]
    m = Rgw(tmp, memstore_bytes=(max(worlds) * a.size_mb + 2048) << 20) if kind == "rgw" else Moto(tmp, iam=False)
    job_n = [0]
    try:
        s3 = m.client()
        s3.create_bucket(Bucket=BUCKET)
        label = "Ceph RGW 16.2 (memstore)" if kind == "rgw" else "moto (plain)"
        print(f"{label}: {a.size_mb} MiB per rank", flush=True)
        out = {"server": label, "rows": {}, "dcp": [], "ceiling": None}
        for w in worlds:
            out["rows"][w] = contenders(a, tmp, m, s3, w, job_n)
        if a.dcp_table:
            out["dcp"] = dcp_table(a, tmp, m, s3, job_n)
        out["ceiling"] = ceiling(a, m, s3, {"endpoint": m.endpoint, "env": worker_env(a, m)})
        print(f"  server alone (boto3, {a.ceiling_procs} processes of 8 threads, {a.size_mb} MiB): "
              f"upload {out['ceiling'][0]:.0f} MB/s, download {out['ceiling'][1]:.0f} MB/s", flush=True)
        return out
    finally:
        m.stop()


def report(a, results):
    print("\n## Save and restore, " + f"{a.size_mb} MiB per rank (seconds, slowest rank)\n")
    print("| server | ranks | contender | stall | save done | restore |")
    print("|---|---|---|---|---|---|")
    for res in results:
        for w, rows in res["rows"].items():
            for name, sv, ld in rows:
                if "error" in sv or "error" in ld:
                    err = sv.get("error") or ld.get("error")
                    print(f"| {res['server']} | {w} | {name} | fails: {err} | | |")
                    continue
                print(f"| {res['server']} | {w} | {name} | {fmt(sv, 'stall')} | {fmt(sv, 'done')} | "
                      f"{fmt(ld, 'done')} |")
    if any(r["dcp"] for r in results):
        print("\n## s3torchconnector's DCP benchmark (dcp.save, model on every rank, deduplicated)\n")
        print("| server | model | MiB | world | ckptd s | ckptd MiB/s | s3torchconnector s | s3torchconnector MiB/s |")
        print("|---|---|---|---|---|---|---|---|")
        for res in results:
            by = {}
            for model, mib, world, who, r in res["dcp"]:
                by.setdefault((model, mib, world), {})[who] = r
            for (model, mib, world), w in by.items():
                cells = []
                for who in ("ckptd", "s3torchconnector"):
                    r = w.get(who, {"error": "not run"})
                    cells += [f"{r['done']:.2f}", f"{mib / r['done']:.0f}"] if "done" in r else [f"fails: {r['error']}", ""]
                print(f"| {res['server']} | {model} | {mib:.0f} | {world} | " + " | ".join(cells) + " |")
    print("\n## The server alone (boto3 processes)\n")
    for res in results:
        up, down = res["ceiling"]
        print(f"- {res['server']}: {a.ceiling_procs} processes of 8 threads, 16 MiB parts: upload {up:.0f} MB/s, "
              f"download {down:.0f} MB/s")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-test-plain")
    ap.add_argument("--server", default="rgw,moto")
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--ranks", default="1,4")
    ap.add_argument("--dcp-table", action="store_true")
    ap.add_argument("--models", default="vit-base,gpt2-medium")
    ap.add_argument("--dcp-worlds", default="1,2,4")
    ap.add_argument("--ceiling-procs", type=int, default=4)
    a = ap.parse_args()
    try:
        import s3torchconnector.dcp  # noqa: F401
        a.s3tc = True
    except ImportError:
        a.s3tc = False
    results = [serve(a, k) for k in a.server.split(",")]
    report(a, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
