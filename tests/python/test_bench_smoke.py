"""The Python benchmarks still run (not timed): tests/bench/py_stall.py,
tests/bench/py_loop.py and tests/bench/py_tensors.py on a tiny state
against a real ckptd, and tests/bench/s3_peers.py against moto."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "tests", "bench")


def _run(script, daemon, tmp_path, *args):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"))
    p = subprocess.run([sys.executable, os.path.join(BENCH, script), "--socket", daemon.sock,
                        "--dir", str(tmp_path / "d"), *args], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_py_stall_runs(daemon, tmp_path):
    out = _run("py_stall.py", daemon, tmp_path, "--size-mb", "8", "--rounds", "2", "--settle", "0")
    for label in ("Checkpointer.save -> staged", "ckpt.dcp.Writer", "torch.save (fsync)", "FileSystemWriter"):
        m = re.search(re.escape(label) + r"\s+([0-9.]+)", out)
        assert m and float(m.group(1)) > 0, out
    assert "ratios: torch.save / Checkpointer = " in out


def test_py_loop_runs(daemon, tmp_path):
    out = _run("py_loop.py", daemon, tmp_path, "--state-mb", "8", "--width", "256", "--batch", "4",
               "--steps", "4", "--every", "2", "--rounds", "1")
    modes = ["ckpt", "ckpt_overlap", "ckpt_dcp", "ckpt_dcp_async", "torch_save", "dcp_fs"]
    # DCP's own asynchronous staging, where this torch has it and it works
    # (torch 2.11's DefaultStager fails on CPU tensors: the bench says so).
    if "dcp_fs_async: this torch has no DefaultStager" not in out and "dcp_fs_async failed, left out" not in out:
        modes.append("dcp_fs_async")
    for m in modes:
        row = re.search(r"^\s+" + m + r"\s+(-?\d+) ms\s+(\d+) ms$", out, re.M)
        assert row, (m, out)
        assert int(row.group(2)) >= 0


def test_py_tensors_runs(daemon, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"))
    out_json = tmp_path / "t.json"
    p = subprocess.run([sys.executable, os.path.join(BENCH, "py_tensors.py"), "--socket", daemon.sock,
                        "--size-mb", "8", "--tensors", "10,200", "--rounds", "2", "--json", str(out_json)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    for n in ("10", "200"):
        assert re.search(r"^\| " + n + r" \| \d+ ms \| \d+ ms \| [0-9.]+ ms \| [0-9.]+ ms \|", p.stdout, re.M), p.stdout
    import json
    rows = json.loads(out_json.read_text())["rows"]
    assert [r["tensors"] for r in rows] == [10, 200]
    assert all(r["daemon_ms"] > 0 and r["later_ms"] > 0 for r in rows)
    # --breakdown: the parts of one first save, each timed inside it.
    p = subprocess.run([sys.executable, os.path.join(BENCH, "py_tensors.py"), "--socket", daemon.sock,
                        "--size-mb", "8", "--breakdown", "100"], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"^8 MiB in 100 tensors: first save [0-9.]+ ms; later saves", p.stdout, re.M), p.stdout
    for part in ("flatten", "dump_skeleton", "bind", "arena_move", "table"):
        assert re.search(r"^  " + part + r" +[0-9.]+ ms$", p.stdout, re.M), p.stdout


def test_s3_peers_runs(tmp_path):
    """Every ckptd and boto3 contender saves and restores (bit for bit,
    checked by the bench) through moto; s3torchconnector's rows run where
    it is installed, else say so."""
    build = os.path.dirname(os.path.dirname(os.environ["CKPTD_BIN"]))
    p = subprocess.run([sys.executable, os.path.join(BENCH, "s3_peers.py"), "--build", build, "--server", "moto",
                        "--size-mb", "4", "--ranks", "2", "--ceiling-procs", "1"],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python")))
    assert p.returncode == 0, p.stdout + p.stderr
    for ranks in (2,):
        for who in ("ckptd Checkpointer", "ckptd DCP async_save", "boto3 upload_fileobj"):
            row = re.search(r"^\| moto \(plain\) \| " + str(ranks) + r" \| " + re.escape(who)
                            + r" \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|$", p.stdout, re.M)
            assert row, (ranks, who, p.stdout)
            assert float(row.group(2)) > 0 and float(row.group(3)) > 0
    assert re.search(r"moto \(plain\): 1 processes of 8 threads, 16 MiB parts: upload \d+ MB/s", p.stdout), p.stdout
