"""The real-GPU scripts (tests/gpu: the pytest file run.sh runs there, and
the speed table's bench.py) run only where a GPU is lent, which CI never
is. So that a lent machine's few minutes are not spent on a script broken
since, both run here on CPU tensors (CKPT_GPU_TEST_DEVICE /
CKPT_GPU_BENCH_DEVICE=cpu): the same steps and checks, without the CUDA
path itself (the fake driver's suite covers that)."""
import json
import os
import subprocess
import sys

from conftest import ROOT

GPU = os.path.join(ROOT, "tests", "gpu")


def env(**kw):
    e = dict(os.environ, **kw)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "client", "python"), e.get("PYTHONPATH")) if p)
    return e


def test_gpu_pytest_file_runs_on_cpu():
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", GPU],
                       capture_output=True, text=True, env=env(CKPT_GPU_TEST_DEVICE="cpu"), timeout=900, cwd=GPU)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "5 passed" in p.stdout and "skipped" not in p.stdout, p.stdout


def test_gpu_bench_runs_on_cpu(daemon, tmp_path):
    p = subprocess.run([sys.executable, os.path.join(GPU, "bench.py"), "--socket", daemon.sock, "--dir",
                        str(tmp_path), "--gib", "0.0625", "--tensors", "60", "--rounds", "1", "--settle", "0",
                        "--only", "ckpt,torch_save,dcp"],
                       capture_output=True, text=True, env=env(CKPT_GPU_BENCH_DEVICE="cpu"), timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["tensors"] == 60 and set(out["stall_ms"]) == {"ckpt", "torch_save", "dcp"}, out
    assert out["load_sources"] == ["memory"] and out["d2h_ratio"] > 0 and out["h2d_ratio"] > 0, out
