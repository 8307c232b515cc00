import errno
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import ckpt
import ckpt.format
import ckpt.dcp
import ckpt.torch
import ckpt._cuda

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train_tiny.py")


def model_and_opt(seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    return m, opt


def train(m, opt, steps, seed=0):
    return train_from(m, opt, 0, steps, seed)


def assert_same(a, b, path=""):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            assert_same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}/{i}")
    else:
        assert a == b, path


def test_roundtrip_model_and_adam_bit_exact(daemon):
    m, opt = model_and_opt()
    train(m, opt, 3)
    sd = {"model": m.state_dict(), "optim": opt.state_dict(), "epoch": 4}
    with ckpt.torch.Checkpointer("rt", socket=daemon.sock) as cp:
        fut = cp.save(sd, 3, extra={"seen": [1, 2]})
        assert fut.staged.result(30) > 0
        fut.durable.result(30)
    ref = {"model": {k: v.clone() for k, v in m.state_dict().items()}, "optim": opt.state_dict(), "epoch": 4}
    # A fresh model and optimizer (empty Adam state) get everything back.
    m2, opt2 = model_and_opt(seed=1)
    sd2 = {"model": m2.state_dict(), "optim": opt2.state_dict()}
    with ckpt.torch.Checkpointer("rt", socket=daemon.sock) as cp:
        step, extra = cp.load(sd2)
        assert cp.last_load["source"] == "memory"
    assert step == 3 and extra == {"seen": [1, 2]}
    assert_same(ref["model"], sd2["model"])
    assert_same(ref["optim"], sd2["optim"])
    assert sd2["epoch"] == 4
    # Adam's step entries survive as they were (tensors here).
    assert all(isinstance(s["step"], torch.Tensor) for s in sd2["optim"]["state"].values())


def test_training_continues_identically(daemon):
    m, opt = model_and_opt()
    ref = train(m, opt, 10)
    m, opt = model_and_opt()
    first = train(m, opt, 5)
    with ckpt.torch.Checkpointer("cont", socket=daemon.sock) as cp:
        cp.save({"model": m.state_dict(), "optim": opt.state_dict()}, 5).durable.result(30)
    train(m, opt, 3)  # diverge the live objects; the checkpoint must not change
    m2, opt2 = model_and_opt(seed=7)
    sd = {"model": m2.state_dict(), "optim": opt2.state_dict()}
    with ckpt.torch.Checkpointer("cont", socket=daemon.sock) as cp:
        cp.load(sd, step=5)
    m2.load_state_dict(sd["model"])
    opt2.load_state_dict(sd["optim"])
    assert first + train_from(m2, opt2, 5, 10) == ref


def train_from(m, opt, start, end, seed=0):
    out = []
    for s in range(start, end):
        g = torch.Generator().manual_seed(seed * 1000 + s)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        opt.zero_grad()
        loss = ((m(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def losses(lines):
    return {int(l.split()[1]): l.split()[3] for l in lines if l.startswith("step ")}


def test_sigkill_trainer_restores_from_memory_then_storage(daemon):
    env_job = ["--seed", "3"]
    rc, ref = run_example_job(daemon, "tiny-ref", env_job)  # uninterrupted
    assert rc == 0
    ref_loss = losses(ref)
    rc, lines = run_example_job(daemon, "tiny-k", env_job, kill_after_durable=15)
    assert rc == -signal.SIGKILL
    rc, lines = run_example_job(daemon, "tiny-k", env_job + ["--resume"])
    assert rc == 0
    assert lines[0].startswith("resumed from step ")
    resumed = int(lines[0].split()[3])
    assert resumed >= 15
    assert "(source: memory)" in lines[0]
    got = losses(lines)
    assert got and all(got[s] == ref_loss[s] for s in got)
    # After a daemon restart the same resume reads storage.
    daemon.stop()
    daemon.start()
    rc, lines = run_example_job(daemon, "tiny-k", env_job + ["--resume"])
    assert rc == 0 and "(source: storage)" in lines[0]


def run_example_job(daemon, job, args, kill_after_durable=None):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"))
    cmd = [sys.executable, EXAMPLE, "--socket", daemon.sock, "--job", job, "--steps", "30", "--every", "5", *args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    lines = []
    for line in p.stdout:
        lines.append(line.strip())
        if kill_after_durable and line.strip() == f"durable {kill_after_durable}":
            p.send_signal(signal.SIGKILL)
            break
    p.wait(120)
    return p.returncode, lines


def test_save_while_previous_upload_runs(daemon_factory):
    d = daemon_factory("[debug]\nstore_delay_ms = 800\n")
    t = torch.arange(4 << 20, dtype=torch.float32)  # 16 MiB: several chunks, so the delay applies
    with ckpt.torch.Checkpointer("busy", socket=d.sock) as cp:
        f1 = cp.save({"t": t}, 1)
        f1.staged.result(30)
        t.add_(1)
        f2 = cp.save({"t": t}, 2)
        f2.staged.result(30)
        assert not f1.durable.done()  # the first upload is still running
        f1.durable.result(60)
        f2.durable.result(60)
        got = {"t": torch.zeros_like(t)}
        cp.load(got, step=1)
        assert torch.equal(got["t"], torch.arange(4 << 20, dtype=torch.float32))
        cp.load(got, step=2)
        assert torch.equal(got["t"], t)


def test_non_contiguous_tensor_is_copied(daemon):
    base = torch.arange(64, dtype=torch.float32).view(8, 8)
    nc = base.t()  # not contiguous
    with ckpt.torch.Checkpointer("nc", socket=daemon.sock) as cp:
        cp.save({"x": nc}, 1).durable.result(30)
        out = {"x": torch.zeros(8, 8)}
        cp.load(out)
    assert torch.equal(out["x"], nc.contiguous())


@pytest.mark.parametrize("code,stops", [(errno.EIO, True), (errno.ENODEV, True), (errno.E2BIG, False),
                                        (errno.EINVAL, False)])
def test_refused_cuda_registration_falls_back_to_a_copy(daemon, monkeypatch, code, stops):
    """A CUDA registration the daemon refuses (a handle it cannot open, a
    device it lacks, a VMM range over max_fds_per_frame pages, a fabric
    handle) costs speed, not the save: the tensor is copied, with one
    warning per reason. Refusals that would meet every tensor stop the
    tries; the others refuse that tensor only. torch here has no CUDA, so
    the registration is called as the save would, with a host tensor."""
    calls = []

    def refuse(self, ptr, nbytes):
        calls.append(nbytes)
        raise ckpt.CkptError(code, "refused for the test")
    monkeypatch.setattr(ckpt.Client, "register_cuda", refuse)
    # Not the driver: libckpt loads it once per process, and the fake
    # driver's tests (test_cuda_binding.py) need it loaded their way.
    monkeypatch.setattr(ckpt._cuda, "cuda_identity", lambda ptr, n: 1)

    def not_device_memory(ptr):
        raise ckpt.CkptError(errno.EINVAL, "not device memory here")
    monkeypatch.setattr(ckpt._cuda, "cuda_allocation", not_device_memory)
    with ckpt.torch.Checkpointer("cuda-refused", socket=daemon.sock) as cp:
        t = torch.ones(1024)
        with pytest.warns(RuntimeWarning, match="refused for the test"):
            assert cp._cuda.buffer(t, {}) is None
        assert cp._cuda.works is (False if stops else None)
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the same reason is not said twice
            assert cp._cuda.buffer(torch.ones(16), {}) is None
        assert calls == [4096, 64]
    # A daemon that went away is not worked around.
    monkeypatch.setattr(ckpt.Client, "register_cuda",
                        lambda self, p, n: (_ for _ in ()).throw(ckpt.CkptError(errno.EPIPE, "gone")))
    with ckpt.torch.Checkpointer("cuda-gone", socket=daemon.sock) as cp:
        with pytest.raises(ckpt.CkptError, match="gone"):
            cp._cuda.buffer(torch.ones(8), {})


def test_unsupported_dtype_is_a_clear_error(daemon):
    with ckpt.torch.Checkpointer("dt", socket=daemon.sock) as cp:
        with pytest.raises(TypeError, match="complex64.*not supported"):
            cp.save({"z": torch.zeros(3, dtype=torch.complex64)}, 1)


def test_daemon_down(tmp_path):
    with pytest.raises(ckpt.DaemonUnavailable) as e:
        ckpt.torch.Checkpointer("down", socket=str(tmp_path / "none.sock"))
    assert e.value.errno == errno.ENOENT
    msg = str(e.value)
    # Says what is wrong and what to do, with the errno once.
    assert "ckptd is not running at" in msg and "that socket does not exist" in msg, msg
    assert "socket=" in msg and "$CKPTD_SOCKET" in msg and "ckptd --socket" in msg, msg
    assert msg.count("[Errno") == 1, msg
    # The documented fallback: torch.save files in fallback_dir.
    m, opt = model_and_opt()
    cp = ckpt.torch.Checkpointer("down", socket=str(tmp_path / "none.sock"), fallback_dir=str(tmp_path / "fb"))
    f = cp.save({"model": m.state_dict()}, 7, extra={"a": 1})
    assert f.staged.done() and f.durable.result() > 0
    m2, _ = model_and_opt(seed=3)
    sd = {"model": m2.state_dict()}
    assert cp.load(sd) == (7, {"a": 1})
    assert_same(m.state_dict(), sd["model"])


def test_fallback_save_survives_power_cut(tmp_path):
    """A fallback save reported durable is there after a power cut: on
    powerfs, which keeps only what was fsync'd (tests/crash/README.md)."""
    exe = os.environ.get("POWERFS_BIN")
    if not exe or os.getuid() != 0 or not os.access("/dev/fuse", os.W_OK):
        pytest.skip("needs powerfs (POWERFS_BIN), root and /dev/fuse")
    disk, mnt, ctl = tmp_path / "disk", tmp_path / "mnt", str(tmp_path / "ctl")
    disk.mkdir()
    mnt.mkdir()

    def mount():
        dev = os.stat(mnt).st_dev
        p = subprocess.Popen([exe, str(disk), str(mnt), ctl])
        for _ in range(500):
            if os.stat(mnt).st_dev != dev:
                return p
            time.sleep(0.01)
        raise RuntimeError("powerfs did not mount")

    def unmount(p):
        subprocess.run(["umount", str(mnt)], check=False)
        p.wait(10)

    fs = mount()
    try:
        m, _ = model_and_opt()
        cp = ckpt.torch.Checkpointer("cut", socket=str(tmp_path / "none.sock"), fallback_dir=str(mnt / "fb"))
        assert cp.save({"model": m.state_dict()}, 3).durable.result() > 0
        subprocess.run([exe, "--ctl", ctl, "cut"], check=True, capture_output=True)
        unmount(fs)
        fs = mount()
        cp = ckpt.torch.Checkpointer("cut", socket=str(tmp_path / "none.sock"), fallback_dir=str(mnt / "fb"))
        m2, _ = model_and_opt(seed=3)
        sd = {"model": m2.state_dict()}
        assert cp.load(sd)[0] == 3
        assert_same(m.state_dict(), sd["model"])
    finally:
        unmount(fs)


def test_standalone_reader(daemon):
    m, opt = model_and_opt()
    train(m, opt, 2)
    sd = {"model": m.state_dict(), "optim": opt.state_dict(), "note": "hello"}
    with ckpt.torch.Checkpointer("fmt", socket=daemon.sock) as cp:
        cp.save(sd, 2).durable.result(30)
    daemon.stop()  # no daemon needed
    got = ckpt.format.load_step(daemon.url, "fmt")
    assert_same(sd["model"], got["model"])
    assert_same(sd["optim"], got["optim"])
    assert got["note"] == "hello"
    assert ckpt.format.list_steps(daemon.url, "fmt") == [(2, True)]
    daemon.start()


def test_raw_client(daemon):
    with ckpt.Client(daemon.sock, job="raw") as c:
        b = c.alloc(4096)
        b.view[:4] = b"abcd"
        spec = ckpt.TensorSpec("w", "u8", (4096,), b, 0, 4096)
        f = c.save(1, [spec], b"x")
        f.staged.result(10)
        f.durable.result(10)
        b.view[:4] = b"zzzz"
        r = c.load([spec], 1).result(10)
        assert bytes(b.view[:4]) == b"abcd" and r["extra"] == b"x" and r["sources"] == {"w": "memory"}
        assert c.list("raw")[0]["complete"] is True
        info, tensors = c.show("raw", 1)
        assert tensors[0]["name"] == "w" and tensors[0]["nbytes"] == 4096
        with pytest.raises(ckpt.CkptError) as e:
            c.load([spec], 99).result(10)
        assert e.value.errno == errno.ENOENT and "99" in str(e.value)


def test_futures_survive_garbage_collection(daemon):
    import gc
    with ckpt.torch.Checkpointer("gcf", socket=daemon.sock) as cp:
        durable = cp.save({"t": torch.ones(1024)}, 1).durable  # the SaveFuture is dropped
        gc.collect()
        assert durable.result(30) > 0


def test_recreated_tensors_are_not_confused_with_old_ones(daemon):
    with ckpt.torch.Checkpointer("reuse", socket=daemon.sock) as cp:
        for step, (va, vb) in enumerate([(0.0, 0.0), (1.0, 2.0), (3.0, 4.0)], 1):
            # fresh tensors each time (an optimizer rebuilt): freed storages'
            # addresses may come back for the new ones
            sd = {"a": torch.full((4096,), va), "b": torch.full((4096,), vb)}
            cp.save(sd, step).durable.result(30)
            del sd
        got = {"a": torch.zeros(4096), "b": torch.zeros(4096)}
        cp.load(got, step=3)
        assert got["a"].eq(3.0).all() and got["b"].eq(4.0).all()
        cp.load(got, step=2)
        assert got["a"].eq(1.0).all() and got["b"].eq(2.0).all()


def test_closed_checkpointer_is_a_clear_error(daemon):
    cp = ckpt.torch.Checkpointer("closed", socket=daemon.sock)
    cp.close()
    with pytest.raises(ckpt.CkptError, match="closed"):
        cp.save({"t": torch.ones(4)}, 1)


def test_resolve_pins_one_step_and_show_one_rank(daemon):
    """Client.resolve decides "latest" once (the daemon pins it with the
    step's commit object); show(rank=) reads one rank's manifest; an
    unknown job is ENOENT, not some other job's step."""
    sd = {"w": torch.arange(8, dtype=torch.float32)}
    with ckpt.torch.Checkpointer("rs", socket=daemon.sock) as cp:
        cp.save(sd, 5).durable.result(30)
        cp.save(sd, 7).durable.result(30)
        assert cp.client.resolve() == 7
        assert cp.client.resolve(5) == 5
        info, tensors = cp.client.show("rs", 7, rank=0)
        assert info["complete"] and [t["name"] for t in tensors] == ["w"]
        with pytest.raises(ckpt.CkptError) as e:
            cp.client.resolve(job="no-such-job")
        assert e.value.errno == errno.ENOENT
    assert os.path.exists(os.path.join(daemon.store, "rs", "step-000000000007", "commit"))
    assert os.path.exists(os.path.join(daemon.store, "rs", "step-000000000005", "commit"))


def test_format1_step_stays_readable(daemon):
    """A step in the layout before attempts were in names (rank-R-of-W.
    manifest, no commit) loads through the daemon from storage and through
    ckpt.format, whose catalogue reads its manifests to learn the attempt."""
    sd = {"w": torch.arange(64, dtype=torch.float32).reshape(8, 8)}
    with ckpt.torch.Checkpointer("old", socket=daemon.sock, attempt_id="default") as cp:
        cp.save(sd, 3).durable.result(30)
    daemon.stop()
    d = os.path.join(daemon.store, "old", "step-000000000003")
    os.rename(os.path.join(d, "rank-00000-of-00001.default.manifest"), os.path.join(d, "rank-00000-of-00001.manifest"))
    assert not os.path.exists(os.path.join(d, "commit"))
    assert ckpt.format.list_steps(daemon.url, "old") == [(3, True)]
    assert torch.equal(ckpt.format.load_step(daemon.url, "old")["w"], sd["w"])
    daemon.start()  # a new daemon: nothing in memory
    got = {"w": torch.zeros(8, 8)}
    with ckpt.torch.Checkpointer("old", socket=daemon.sock) as cp:
        step, _ = cp.load(got)
        assert step == 3 and cp.last_load["source"] == "storage"
    assert torch.equal(got["w"], sd["w"])


def test_rank_comes_from_the_launcher(daemon, monkeypatch):
    """Issue "Python adoption": under torchrun a forgotten rank= used to
    default to rank 0 of 1 and collide with the other ranks. The rank comes
    from RANK/WORLD_SIZE (or torch.distributed); a hand-given one that
    disagrees is an error, never a silent collision."""
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "2")
    with ckpt.torch.Checkpointer("launched", socket=daemon.sock) as cp:
        assert (cp.rank, cp.world_size) == (2, 4)
    with ckpt.torch.Checkpointer("launched", socket=daemon.sock, rank=2, world_size=4) as cp:
        assert (cp.rank, cp.world_size) == (2, 4)
    with pytest.raises(ValueError, match=r"rank=0 world_size=None given, but RANK/WORLD_SIZE says rank 2 of 4"):
        ckpt.torch.Checkpointer("launched", socket=daemon.sock, rank=0)
    with pytest.raises(ValueError, match="says rank 2 of 4"):
        ckpt.dcp._identity(1, 4)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    with ckpt.torch.Checkpointer("alone", socket=daemon.sock) as cp:
        assert (cp.rank, cp.world_size) == (0, 1)
    with pytest.raises(ValueError, match="out of range"):
        ckpt.torch.resolve_rank(4, 4)


def test_format_needs_no_libckpt_and_checks_crc_fast(daemon, tmp_path):
    """Issue "Python adoption": ckpt.format imports without libckpt (a
    CKPT_LIB that cannot load proves nothing tries), reads and verifies a
    step, and uses a CRC32C wheel when one is installed."""
    sd = {"w": torch.randn(256, 256), "n": torch.arange(7)}
    with ckpt.torch.Checkpointer("nolib", socket=daemon.sock) as cp:
        cp.save(sd, 1).durable.result(60)
    code = ("import sys, torch, ckpt.format as f\n"
            "assert 'ckpt._lib' not in sys.modules and 'ckpt.client' not in sys.modules\n"
            f"sd = f.load_step({daemon.url!r}, 'nolib', verify=True)\n"
            "print(f.CRC32C_IMPLEMENTATION, float(sd['w'].sum()), int(sd['n'].sum()))\n")
    env = dict(os.environ, CKPT_LIB="/nonexistent/libckpt.so",
               PYTHONPATH=os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                       "client", "python"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    impl, wsum, nsum = r.stdout.split()
    assert abs(float(wsum) - float(sd["w"].sum())) < 1e-3 and int(nsum) == 21
    data = os.urandom(1 << 16)
    assert ckpt.format.crc32c(data) == ckpt.format.crc32c_py(data)
    assert ckpt.format.crc32c(data[1000:], ckpt.format.crc32c(data[:1000])) == ckpt.format.crc32c_py(data)
    assert ckpt.format.crc32c(b"123456789") == 0xE3069283
    try:
        import google_crc32c  # noqa: F401
        assert impl == "google-crc32c", impl
    except ImportError:
        pass


def test_wait_complete_waits_for_every_rank(daemon, tmp_path):
    """Checkpointer.wait_complete returns once every rank's save of the
    step is in storage (not at this rank's own durable), times out saying
    how many ranks are there, and Client.wait_complete does the same for
    any step; the fallback has nothing to wait for."""
    sd = {"w": torch.arange(1024, dtype=torch.float32)}
    with ckpt.torch.Checkpointer("waitall", socket=daemon.sock, rank=0, world_size=2) as r0, \
            ckpt.torch.Checkpointer("waitall", socket=daemon.sock, rank=1, world_size=2) as r1:
        with pytest.raises(ValueError, match="nothing saved yet"):
            r0.wait_complete()
        r0.save(sd, 3)
        with pytest.raises(ckpt.CkptError) as e:
            r0.wait_complete(timeout=0.3)
        assert e.value.errno == errno.ETIMEDOUT and "1 of 2 ranks" in str(e.value), e.value
        got = {}
        t = threading.Thread(target=lambda: got.update(r0.wait_complete(3, timeout=60)))
        t.start()
        time.sleep(0.5)
        assert t.is_alive(), "answered before rank 1 saved"
        r1.save(sd, 3)
        t.join(60)
        assert got["step"] == 3 and got["complete"] and got["world_size"] == 2 and got["ranks_present"] == 2, got
        with ckpt.Client(daemon.sock) as c:
            assert c.wait_complete(3, job="waitall", timeout=0)["world_size"] == 2
            with pytest.raises(ValueError):
                c.wait_complete(3, job="waitall", timeout=-1)
            with pytest.raises(ckpt.CkptError) as e:
                c.wait_complete(4, job="waitall", timeout=0)
            assert e.value.errno == errno.ETIMEDOUT and "no manifest in storage yet" in str(e.value), e.value
    fb = ckpt.torch.Checkpointer("waitfb", socket=str(tmp_path / "none.sock"), fallback_dir=str(tmp_path / "fb"))
    fb.save(sd, 1)
    with pytest.raises(ValueError, match="needs ckptd"):
        fb.wait_complete(1)
    fb.close()


def test_a_dropped_checkpointer_goes_without_the_gc(daemon):
    """Its parts hold it weakly: a Checkpointer dropped without close()
    goes at once (refcount), not when the cyclic GC finds a cycle through
    its registrations. (Its Client stays in a cycle with its buffers and
    table, as it always has, until the GC or close().)"""
    import gc
    import weakref
    gc.collect()
    gc.disable()
    try:
        cp = ckpt.torch.Checkpointer("dropped", socket=daemon.sock)
        cp.save({"w": torch.arange(64, dtype=torch.float32)}, 1)
        cp.wait()
        ref_cp = weakref.ref(cp)
        del cp
        assert ref_cp() is None, "the Checkpointer is kept alive by a cycle"
    finally:
        gc.enable()
