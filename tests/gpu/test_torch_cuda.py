"""ckpt.torch on a real GPU (issue: the CUDA path on a real driver). Run by
tests/gpu/run.sh, which sets CKPTD_BIN and CKPT_LIB; they need torch with
CUDA and a GPU, and skip without one. CKPT_GPU_TEST_DEVICE=cpu runs the
same steps on CPU tensors (checked where there is no GPU: the scripts'
logic, not the CUDA path).

- A model with CUDA parameters and Adam state, with the default caching
  allocator (legacy IPC) and with expandable segments (VMM fds), is saved
  without synchronising after an optimizer step, changed right after
  staged, and restored bit-exact by a second process: from the daemon's
  memory, and from storage after a daemon restart.
- A trainer SIGKILLed between staged and durable: the step still becomes
  durable and restores bit-exact, and the daemon holds none of the dead
  trainer's GPU memory (nvidia-smi's used memory is back where it was).
- A cudaMalloc allocation freed and allocated again at the same address
  between two saves: each step holds what its tensor held then, not what a
  stale IPC mapping shows."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

import ckpt.client  # noqa: E402
import ckpt.torch  # noqa: E402
from conftest import ROOT  # noqa: E402

DEVICE = os.environ.get("CKPT_GPU_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else None)
pytestmark = [pytest.mark.skipif(DEVICE is None, reason="no GPU (CKPT_GPU_TEST_DEVICE=cpu runs the logic on CPU)"),
              # a CUDA tensor copied around a refused registration fails the test, to be seen
              pytest.mark.filterwarnings("error:ckpt:RuntimeWarning")]
HERE = os.path.dirname(os.path.abspath(__file__))
TRAINER = os.path.join(HERE, "trainer.py")


def trainer(*args, env=None, timeout=600):
    """Run trainer.py; its last output line, parsed, and the whole output."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "client", "python"), e.get("PYTHONPATH")) if p)
    e.update(env or {})
    p = subprocess.run([sys.executable, TRAINER, *map(str, args)], capture_output=True, text=True, env=e,
                       timeout=timeout)
    lines = p.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1])
    except (IndexError, ValueError):
        out = None
    return p.returncode, out, p.stdout + p.stderr


@pytest.mark.parametrize("alloc", ["default", "expandable_segments"])
def test_model_and_adam_restore_bit_exact_in_another_process(daemon_factory, tmp_path, alloc):
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} if alloc != "default" else {}
    d = daemon_factory(staging="1G")
    job, ref = f"gpu-adam-{alloc}", str(tmp_path / "ref.pt")
    rc, out, log = trainer("save", d.sock, job, 5, ref, DEVICE, env=env)
    assert rc == 0, log
    print(f"{alloc}: save {out}")
    if DEVICE == "cuda":
        assert out["cuda_registered"], "the CUDA tensors were copied, not registered: " + log
        if out["expandable"] is not None:
            assert out["expandable"] == (alloc != "default"), out
    # The restore happens in a process that never saw the tensors.
    rc, out, log = trainer("load", d.sock, job, 5, ref, DEVICE, env=env)
    assert rc == 0, log
    assert out["source"] == "memory", out
    d.stop()
    d.start()  # the memory tier is gone: from storage
    rc, out, log = trainer("load", d.sock, job, 5, ref, DEVICE, env=env)
    assert rc == 0, log
    assert out["source"] == "storage", out


def gpu_used_mib():
    """The GPU's used memory (MiB) as nvidia-smi says, or None."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                           capture_output=True, text=True, timeout=60)
        return int(p.stdout.split()[0]) if p.returncode == 0 else None
    except (OSError, ValueError, IndexError):
        return None


def step_complete(sock, job, step):
    c = ckpt.client.Client(socket=sock)
    try:
        return any(s["step"] == step and s["complete"] for s in c.list(job))
    finally:
        c.close()


def test_sigkill_between_staged_and_durable(daemon_factory):
    # 2 GiB of trainer state on a GPU; less for the CPU check of the logic.
    mib, step, job = (2048 if DEVICE == "cuda" else 256), 9, "gpu-death"
    # The upload takes at least 3 s, so the kill lands before durable.
    d = daemon_factory("[debug]\nstore_delay_ms = 3000\n", staging=f"{mib + 1024}M")
    # A first trainer gives the daemon its CUDA context (hundreds of MiB it
    # keeps): the baseline is taken after it.
    with ckpt.torch.Checkpointer("gpu-warm", socket=d.sock) as cp:
        cp.save({"w": torch.ones(1 << 20, device=DEVICE)}, 1).durable.result(60)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    base = gpu_used_mib()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "client", "python"), env.get("PYTHONPATH"))
                                        if p)
    p = subprocess.Popen([sys.executable, TRAINER, "hang", d.sock, job, str(step), str(mib), DEVICE],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = p.stdout.readline().strip()
        assert line == "staged", f"trainer said {line!r}: {p.stderr.read() if p.poll() is not None else ''}"
        during = gpu_used_mib()
        assert not step_complete(d.sock, job, step), "durable before the kill: the test proves nothing"
        p.send_signal(signal.SIGKILL)
        assert p.wait(60) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    end = time.time() + 120
    while not step_complete(d.sock, job, step):
        assert time.time() < end, "the dead trainer's save never became durable"
        time.sleep(0.2)
    after = gpu_used_mib()
    # The driver frees a dead process's memory once no one maps it: the
    # daemon must have closed every mapping of it.
    end = time.time() + 30
    while base is not None and after - base > 256 and time.time() < end:
        time.sleep(0.5)
        after = gpu_used_mib()
    print(f"GPU memory used (MiB): before the trainer {base}, at staged {during}, after the kill {after}")
    if base is not None:
        assert during - base >= mib // 2, "the trainer's state did not show in nvidia-smi: the check proves nothing"
        assert after - base <= 256, f"{after - base} MiB still held after the trainer died"
    # Bit-exact, from memory, then from storage.
    n = (mib << 20) // 4 // 4
    sys.path.insert(0, HERE)
    from trainer import pattern
    for source in ("memory", "storage"):
        got = {f"t{i}": torch.zeros(n, dtype=torch.float32, device=DEVICE) for i in range(4)}
        with ckpt.torch.Checkpointer(job, socket=d.sock) as cp:
            cp.load(got, step=step)
            assert cp.last_load["source"] == source, cp.last_load
        for i in range(4):
            assert torch.equal(got[f"t{i}"], pattern(n, step + i, DEVICE)), f"t{i} from {source}"
        del got
        d.stop()
        d.start()


@pytest.mark.parametrize("alloc", ["default", "expandable_segments"] if DEVICE == "cuda" else ["default"])
def test_freed_and_reallocated_at_the_same_address(daemon_factory, alloc):
    """default: cudaFree and cudaMalloc again (an H100 with driver 580 gave
    another address 8 times in 8: then there is nothing to check, and the
    test says so). expandable_segments: the allocator unmaps the segment's
    pages at empty_cache and maps new ones at the same addresses later."""
    n = (64 << 20) // 4  # above the caching allocator's 10 MiB: a cudaMalloc of its own
    d = daemon_factory(staging="1G")
    if alloc != "default":
        torch.cuda.empty_cache()
        _set_allocator("expandable_segments:True")
    try:
        _freed_and_reallocated(d, n, alloc)
    finally:
        if alloc != "default":
            torch.cuda.empty_cache()
            _set_allocator("expandable_segments:False")


def _set_allocator(conf):
    """The caching allocator's settings, in this process (torch 2.11 names
    the function anew and warns at the old name)."""
    f = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or torch.cuda.memory._set_allocator_settings
    f(conf)


def _freed_and_reallocated(d, n, alloc):
    import warnings
    # A registration refused on the way (the driver will not open the new
    # allocation's handle beside the old one's mapping, say) would be
    # copied around, with a warning: here it fails the test, to be seen.
    with ckpt.torch.Checkpointer(f"gpu-realloc-{alloc}", socket=d.sock) as cp, warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        t = torch.full((n,), 1.0, device=DEVICE)
        addr = t.data_ptr()
        cp.save({"t": t}, 1).durable.result(60)
        same = False
        for value in range(2, 10):
            del t
            if DEVICE == "cuda":
                torch.cuda.empty_cache()  # cudaFree: the address goes back to the driver
            t = torch.full((n,), float(value), device=DEVICE)
            if t.data_ptr() == addr:
                same = True
                break
        print(f"{alloc}: address {addr:#x} {'reused' if same else 'not reused'} after {value - 1} tries")
        if not same and DEVICE == "cuda":
            pytest.skip(f"{alloc}: the allocator never gave the same address back in 8 tries: nothing to check")
        cp.save({"t": t}, 2).durable.result(60)
        for step, want in ((1, 1.0), (2, float(value))):
            got = {"t": torch.zeros(n, device=DEVICE)}
            cp.load(got, step=step)
            # The pool keeps the newest durable step: step 1 is read back from storage.
            assert cp.last_load["source"] == ("memory" if step == 2 else "storage"), (step, cp.last_load)
            assert torch.equal(got["t"], torch.full((n,), want, device=DEVICE)), f"step {step}"
        assert cp._cuda.works is (True if DEVICE == "cuda" else None), "CUDA registration was given up"


def test_dcp_async_save_of_tensors_written_on_a_side_stream(daemon_factory):
    """DCP async_save through ckpt.dcp.Writer, of CUDA tensors that kernels
    on a non-default stream are still writing when async_save is called:
    the daemon's copy waits for that stream (the current one at stage()),
    and a DCP load restores every byte."""
    import contextlib

    import torch.distributed.checkpoint as dcp

    import ckpt.dcp
    d = daemon_factory(staging="1G")
    n = (64 << 20) // 4
    state = {f"w{i}": torch.zeros(n, device=DEVICE) for i in range(4)}
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    side = torch.cuda.Stream() if DEVICE == "cuda" else None
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        for i, t in enumerate(state.values()):
            for _ in range(20):  # enough queued work to be running still
                t.add_(1.0)
            t.mul_(i + 1)
        r = dcp.async_save(state, storage_writer=ckpt.dcp.Writer("gpu-dcp", step=1, socket=d.sock))
    (r.upload_completion if hasattr(r, "upload_completion") else r).result(300)
    got = {k: torch.zeros(n, device=DEVICE) for k in state}
    dcp.load(got, storage_reader=ckpt.dcp.Reader("gpu-dcp", step=1, socket=d.sock))
    for i, k in enumerate(state):
        assert torch.equal(got[k].cpu(), torch.full((n,), 20.0 * (i + 1))), k
    ckpt.dcp.close_all()
