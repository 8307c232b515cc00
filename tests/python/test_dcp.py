"""torch.distributed.checkpoint through ckptd, on 2 CPU processes over gloo."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

dcp = pytest.importorskip("torch.distributed.checkpoint")
if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 4):
    pytest.skip("ckpt.dcp needs the StorageWriter and AsyncStager API of torch>=2.4 "
                f"(this is torch {torch.__version__})", allow_module_level=True)


def _state(seed):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 4))
    opt = torch.optim.Adam(m.parameters())
    m(torch.randn(2, 16)).sum().backward()
    opt.step()
    return m, opt


def _worker(rank, world, port, sock, phase, out):
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "client", "python"))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import ckpt.dcp as cd
    try:
        m, opt = _state(0)
        if phase == "save":
            sd = {"model": m.state_dict(), "extra": {"epoch": 5, "tag": "x"}}
            resp = dcp.async_save(sd, storage_writer=cd.Writer("dcp", step=10, socket=sock))
            up = resp.upload_completion if hasattr(resp, "upload_completion") else resp
            up.result()
            dcp.save(sd, storage_writer=cd.Writer("dcp", step=11, socket=sock))
        elif phase == "meta":
            md = cd.Reader("dcp", step=11, socket=sock).read_metadata()
            want = set(m.state_dict()) | {"extra"}
            got = {k.split(".", 1)[1] if k.startswith("model.") else k.split(".", 1)[0]
                   for k in md.state_dict_metadata}
            torch.save({"ok": got == want, "keys": sorted(md.state_dict_metadata)}, f"{out}.{rank}")
        else:
            m2, _ = _state(1)
            sd = {"model": m2.state_dict(), "extra": {"epoch": 0, "tag": ""}}
            dcp.load(sd, storage_reader=cd.Reader("dcp", step=phase, socket=sock))
            ok = all(torch.equal(sd["model"][k], v) for k, v in m.state_dict().items())
            torch.save({"ok": ok, "extra": sd["extra"]}, f"{out}.{rank}")
    finally:
        cd.close_all()
        dist.destroy_process_group()


def _free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def test_dcp_save_world2_load_world1_and_2(daemon, tmp_path):
    mp.spawn(_worker, args=(2, _free_port(), daemon.sock, "save", str(tmp_path / "r")), nprocs=2)
    import ckpt
    with ckpt.Client(daemon.sock) as c:
        steps = {s["step"]: s for s in c.list("dcp")}
    assert steps[10]["complete"] and steps[10]["world_size"] == 2
    assert steps[11]["complete"]
    for world, step in ((1, 10), (2, 11), (1, 11)):
        out = tmp_path / f"w{world}s{step}"
        mp.spawn(_worker, args=(world, _free_port(), daemon.sock, step, str(out)), nprocs=world)
        for r in range(world):
            res = torch.load(f"{out}.{r}")
            assert res["ok"], (world, step, r)
            assert res["extra"] == {"epoch": 5, "tag": "x"}


def _metric(port, name):
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    vals = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(name + " ") or line.startswith(name + "{")]
    assert vals, name
    return vals[0]


def test_dcp_read_metadata_reads_each_manifest_once_per_node(daemon_factory, tmp_path):
    """Saved by 2 ranks, loaded by 4 on one daemon after a restart: every
    rank's read_metadata shows every manifest and every rank's load plans
    from them, yet the daemon reads each manifest from storage once."""
    port = _free_port()
    d = daemon_factory(f"[metrics]\nlisten = 127.0.0.1:{port}\n")
    mp.spawn(_worker, args=(2, _free_port(), d.sock, "save", str(tmp_path / "r")), nprocs=2)
    d.stop()
    d.start()  # nothing in memory
    out = tmp_path / "w4"
    mp.spawn(_worker, args=(4, _free_port(), d.sock, 11, str(out)), nprocs=4)
    for r in range(4):
        res = torch.load(f"{out}.{r}")
        assert res["ok"] and res["extra"] == {"epoch": 5, "tag": "x"}, r
    assert _metric(port, "ckptd_manifest_reads_total") == 2
    assert _metric(port, "ckptd_manifest_cache_misses_total") == 2
    assert _metric(port, "ckptd_manifest_cache_hits_total") >= 4  # the loads' plans
    # Rank 0's read_metadata showed the step first and wrote its index
    # (docs/scale.md "At scale"); ranks 1-3 read that, once.
    assert _metric(port, "ckptd_step_index_writes_total") == 1
    assert _metric(port, "ckptd_step_index_reads_total") == 1
    # After a restart, read_metadata on every rank is one GET of the index,
    # no manifest; at most N (2) even were the index not there.
    assert os.path.exists(os.path.join(d.store, "dcp", "step-000000000011", "index"))
    d.stop()
    d.start()
    out = tmp_path / "m4"
    mp.spawn(_worker, args=(4, _free_port(), d.sock, "meta", str(out)), nprocs=4)
    for r in range(4):
        res = torch.load(f"{out}.{r}")
        assert res["ok"], (r, res["keys"])
    assert _metric(port, "ckptd_manifest_reads_total") == 0
    assert _metric(port, "ckptd_step_index_reads_total") == 1
    assert _metric(port, "ckptd_step_index_writes_total") == 0
    # ckpt.format reads a step with an index (it lists the directory).
    from ckpt import format as fmt
    assert (11, True) in [(s, c) for s, c in fmt.list_steps(d.url, "dcp")]
    assert fmt.load_step(d.url, "dcp", 11)


def _async_staging_roundtrip(d, legacy, monkeypatch):
    """async_staging: async_save returns before ckptd has staged; the trainer
    waits (staging_completion, or synchronize_staging() where async_save
    cannot take a Future), then mutates; the step holds the old values."""
    import ckpt.dcp as cd
    import ckpt.torch
    if legacy:
        monkeypatch.setattr(cd, "_future_staging_supported", lambda: False)
    mib = 1 << 20
    # 144 MiB of a 256 MiB pool is uploading slowly: the next 144 MiB save
    # cannot be admitted (staged) until that upload ends.
    elems = 144 * mib // 4  # float32: 144 MiB, 36 chunks of 4 MiB each
    blocker = torch.ones(elems, dtype=torch.float32).share_memory_()
    t = torch.arange(elems, dtype=torch.float32).share_memory_()
    want = t.clone()
    try:
        with ckpt.torch.Checkpointer("blocker", socket=d.sock) as cp:
            f0 = cp.save({"b": blocker}, 1)
            f0.staged.result(30)
            w = cd.Writer("dcpa", step=1, socket=d.sock, async_staging=True)
            resp = dcp.async_save({"t": t}, storage_writer=w)
            if legacy:
                assert not hasattr(resp, "staging_completion")
                assert not w._last.staged.done()  # it did not wait for staging
                w.synchronize_staging()
                up = resp
            else:
                # it did not wait for staging
                assert not resp.staging_completion.done(), open(os.path.join(d.dir, "ckptd.log")).read()
                resp.staging_completion.result(60)
                up = resp.upload_completion
            t.add_(1)  # the trainer goes on: the saved step must not see this
            up.result(60)
            f0.durable.result(60)
        got = {"t": torch.zeros_like(t)}
        dcp.load(got, storage_reader=cd.Reader("dcpa", step=1, socket=d.sock))
        assert torch.equal(got["t"], want)
    finally:
        cd.close_all()


@pytest.mark.skipif(not hasattr(__import__("torch.distributed.checkpoint.state_dict_saver",
                                           fromlist=["x"]), "AsyncSaveResponse"),
                    reason="this torch's async_save does not take a Future from stage()")
def test_dcp_async_staging_returns_before_staged(daemon_factory, monkeypatch):
    _async_staging_roundtrip(daemon_factory("[debug]\nstore_delay_ms = 5000\n"), False, monkeypatch)


def test_dcp_async_staging_synchronize_staging(daemon_factory, monkeypatch):
    _async_staging_roundtrip(daemon_factory("[debug]\nstore_delay_ms = 5000\n"), True, monkeypatch)


def test_dcp_async_staging_failure_reaches_the_trainer(daemon):
    """A save ckptd refuses (larger than the 256 MiB pool) fails the
    writer's staging wait and the upload. (DCP's staging_completion is not
    checked: when the stager's future has already failed, async_save
    completes it with None.)"""
    import ckpt.dcp as cd
    t = torch.zeros(300 << 18, dtype=torch.float32)  # 300 MiB
    try:
        w = cd.Writer("dcpf", step=1, socket=daemon.sock, async_staging=True)
        resp = dcp.async_save({"t": t}, storage_writer=w)
        up = resp.upload_completion if hasattr(resp, "upload_completion") else resp
        with pytest.raises(OSError, match="never fit the staging pool"):
            w.synchronize_staging()
        with pytest.raises(OSError, match="never fit the staging pool"):
            up.result(60)
    finally:
        cd.close_all()


def test_dcp_retry_after_failed_staging(daemon):
    """A save that fails in staging leaves nothing behind in the Writer: the
    same Writer then saves that step with dcp.save."""
    import ckpt.dcp as cd
    try:
        w = cd.Writer("dcpr", step=3, socket=daemon.sock)
        with pytest.raises(OSError, match="never fit the staging pool"):
            dcp.async_save({"t": torch.zeros(300 << 18, dtype=torch.float32)}, storage_writer=w)
        small = torch.arange(1000, dtype=torch.float32)
        dcp.save({"t": small}, storage_writer=w)
        got = {"t": torch.zeros(1000, dtype=torch.float32)}
        dcp.load(got, storage_reader=cd.Reader("dcpr", step=3, socket=daemon.sock))
        assert torch.equal(got["t"], small)
    finally:
        cd.close_all()


def test_dcp_reused_job_fails_at_first_save_unless_loaded(daemon):
    """Issue 32: a new run whose Writer saves into a job with complete steps
    fails at its first save, saying what to do; after a Reader loaded from
    the job, or with exist_ok=True, it saves."""
    import ckpt
    import ckpt.dcp as cd
    import ckpt.torch
    small = torch.arange(1000, dtype=torch.float32)
    try:
        dcp.save({"t": small}, storage_writer=cd.Writer("dcpagain", step=1, socket=daemon.sock))
        cd.close_all()
        ckpt.torch._resumed.clear()  # as a new process
        # async_save stages on the trainer's thread: the CkptError itself.
        with pytest.raises(ckpt.CkptError, match="job 'dcpagain' already has complete step 1") as e:
            dcp.async_save({"t": small}, storage_writer=cd.Writer("dcpagain", step=2, socket=daemon.sock))
        assert "exist_ok=True" in str(e.value)
        # dcp.save reports it inside DCP's CheckpointException.
        with pytest.raises(BaseException, match="dcpagain. already has complete step 1"):  # not an Exception
            dcp.save({"t": small}, storage_writer=cd.Writer("dcpagain", step=2, socket=daemon.sock))
        dcp.save({"t": small}, storage_writer=cd.Writer("dcpagain", step=2, socket=daemon.sock, exist_ok=True))
        # exist_ok adds steps: one complete already raises (it would never load).
        with pytest.raises(ckpt.CkptError, match="step 1 of job 'dcpagain' is complete already, and this process adds"):
            dcp.async_save({"t": small}, storage_writer=cd.Writer("dcpagain", step=1, socket=daemon.sock, exist_ok=True))
        cd.close_all()
        ckpt.torch._resumed.clear()
        got = {"t": torch.zeros(1000, dtype=torch.float32)}
        dcp.load(got, storage_reader=cd.Reader("dcpagain", socket=daemon.sock))
        dcp.save({"t": small}, storage_writer=cd.Writer("dcpagain", step=3, socket=daemon.sock))
    finally:
        cd.close_all()


def test_dcp_writer_prepare_makes_the_first_save_a_later_one(daemon):
    """Writer.prepare() shares and registers the state's tensors ahead of the
    first async_save, which then registers nothing (its stall is a later
    save's); the step restores bit for bit."""
    import ckpt.dcp as cd
    torch.manual_seed(4)
    sd = {"w": torch.randn(1 << 16), "b": torch.randn(100), "epoch": 3}
    try:
        w = cd.Writer("dcpprep", step=1, socket=daemon.sock)
        w.prepare(sd)
        cp = w._cp()
        nbufs = len(cp.client._buffers)
        assert nbufs >= 2 and sd["w"].is_shared() and sd["b"].is_shared()
        resp = dcp.async_save(sd, storage_writer=w)
        (resp.upload_completion if hasattr(resp, "upload_completion") else resp).result()
        assert len(cp.client._buffers) == nbufs, "prepare() left nothing for the first save to register"
        got = {"w": torch.zeros(1 << 16), "b": torch.zeros(100), "epoch": 0}
        dcp.load(got, storage_reader=cd.Reader("dcpprep", step=1, socket=daemon.sock))
        assert torch.equal(got["w"], sd["w"]) and torch.equal(got["b"], sd["b"]) and got["epoch"] == 3
    finally:
        cd.close_all()


def test_dcp_load_into_other_dtype_and_non_contiguous_targets(daemon):
    """Reader.read_data loads a contiguous target of the saved dtype in
    place, and anything else (another dtype, a transposed view) through a
    tensor of its own; what only the read used is unregistered after."""
    import ckpt.dcp as cd
    torch.manual_seed(5)
    sd = {"same": torch.randn(300), "wider": torch.randn(64), "t": torch.randn(4, 8), "epoch": 7}
    try:
        dcp.save(sd, storage_writer=cd.Writer("dcptargets", step=2, socket=daemon.sock))
        got = {"same": torch.zeros(300), "wider": torch.zeros(64, dtype=torch.float64),
               "t": torch.zeros(8, 4).t(), "epoch": 0}
        assert not got["t"].is_contiguous()
        rd = cd.Reader("dcptargets", step=2, socket=daemon.sock)
        dcp.load(got, storage_reader=rd)
        assert torch.equal(got["same"], sd["same"]) and got["same"].is_shared(), "loaded in place"
        assert got["wider"].dtype == torch.float64 and torch.equal(got["wider"], sd["wider"].double())
        assert torch.equal(got["t"], sd["t"]) and got["epoch"] == 7
        cp = rd._cp()
        assert not any("@" in n for n in cp._regs.scratch), "the read's scratch buffers are gone"
        assert len(cp._regs.shared) == 1, "only the in-place target stays registered"
    finally:
        cd.close_all()
