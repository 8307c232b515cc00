"""ckpt.jax and ckpt.orbax on CPU: pytrees of every dtype round trip
bit-exact through ckptd's memory and storage; a jax trainer SIGKILLed
mid-run resumes and ends bit-exact with an uninterrupted run, through
ckpt.jax and through an Orbax CheckpointManager; arrays sharded over four
(host) devices restore onto another mesh and onto one device."""
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")

import jax.numpy as jnp  # noqa: E402

import ckpt.jax  # noqa: E402
from conftest import ROOT  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def tree():
    """A nested pytree with every dtype ckpt.jax saves, NaNs, a 0-d and
    an empty array, NumPy arrays and plain values."""
    r = np.random.default_rng(3)
    f = r.standard_normal((4, 6)).astype(np.float32)
    f[0, 0] = np.nan
    return {
        "params": {"w": jnp.asarray(f), "b16": jnp.asarray(f, jnp.bfloat16), "h": jnp.asarray(f, jnp.float16),
                   "f8": jnp.asarray(f[:2], jnp.float8_e4m3fn), "f8b": jnp.asarray(f[:2], jnp.float8_e5m2)},
        "ints": [jnp.arange(-5, 5, dtype=jnp.int8), jnp.arange(7, dtype=jnp.uint8),
                 jnp.arange(-3, 3, dtype=jnp.int16), jnp.arange(9, dtype=jnp.int32) - 4,
                 jnp.asarray([0, 1, 2**32 - 1], jnp.uint32), jnp.asarray([True, False, True])],
        "host": (np.arange(5, dtype=np.float64) / 3, np.asarray([-(2**40), 2**40], np.int64),
                 np.asarray([2**64 - 1], np.uint64)),
        "scalar": jnp.float32(2.5), "empty": jnp.zeros((0, 3)), "count": 17, "name": "mlp", "none": None,
    }


def same(a, b):
    """Equal pytrees, arrays bit for bit (same type, dtype and shape)."""
    fa, ta = jax.tree_util.tree_flatten(a)
    fb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb, (ta, tb)
    for x, y in zip(fa, fb):
        if isinstance(x, (jax.Array, np.ndarray)):
            assert type(x) is type(y) or isinstance(y, jax.Array) and isinstance(x, jax.Array), (type(x), type(y))
            x, y = np.asarray(x), np.asarray(y)
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), (x, y)
        else:
            assert x == y, (x, y)
    return True


def test_round_trip_memory_and_storage(daemon):
    t = tree()
    with ckpt.jax.Checkpointer("rt", socket=daemon.sock) as cp:
        cp.save(t, 1).durable.result(30)
        cp.save(jax.tree.map(lambda x: x * 2 if isinstance(x, jax.Array) and x.dtype == jnp.float32 else x, t), 2)
        fut = cp.save(t, 3, tier="memory")
        assert fut.durable is None and fut.kept.result(30) > 0
        assert cp.latest_step() == 3
        step, back = cp.restore()
        assert step == 3 and cp.last_load["source"] == "memory"
        assert same(t, back)
        step, back = cp.restore(2)
        assert step == 2 and float(back["scalar"]) == 5.0 and back["count"] == 17
    # A new daemon holds nothing: step 3 (memory only) is gone, step 1
    # comes from storage.
    daemon.stop(signal.SIGKILL)
    daemon.start()
    with ckpt.jax.Checkpointer("rt", socket=daemon.sock) as cp:
        assert cp.latest_step() == 2
        step, back = cp.restore(1)
        assert step == 1 and cp.last_load["source"] == "storage"
        assert same(t, back)
        assert isinstance(back["host"][0], np.ndarray) and isinstance(back["params"]["w"], jax.Array)


def test_restore_into_a_target_checks_it(daemon):
    t = {"a": jnp.ones((3, 4)), "b": [jnp.arange(5)], "n": 1}
    with ckpt.jax.Checkpointer("tgt", socket=daemon.sock) as cp:
        cp.save(t, 1)
        # Shardings, ShapeDtypeStructs and NumPy arrays as the target's leaves.
        dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        _, back = cp.restore(1, target={"a": dev, "b": [np.zeros(5, np.int32)], "n": 0})
        assert isinstance(back["b"][0], np.ndarray) and back["n"] == 1 and back["a"].sharding == dev
        assert same({"a": t["a"], "b": [np.arange(5, dtype=np.int32)], "n": 1}, back)
        with pytest.raises(ValueError, match=r"array 'a' of step 1 of job 'tgt' was saved as float32 \[3, 4\]"):
            cp.restore(1, target={"a": jax.ShapeDtypeStruct((4, 3), jnp.float32), "b": [dev], "n": 0})
        with pytest.raises(ValueError, match="target has 2 leaves"):
            cp.restore(1, target={"a": dev, "n": 0})
        with pytest.raises(TypeError, match="complex64 is not supported"):
            cp.save({"c": jnp.ones(2, jnp.complex64)}, 2)


def run_trainer(daemon, tmp_path, name, job, mode, crash_at=-1):
    """Run jax_train.py to the end (or its crash); its stdout lines and
    the trained state (None after a crash)."""
    out = tmp_path / f"{name}.npz"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"), JAX_PLATFORMS="cpu")
    p = subprocess.run([sys.executable, os.path.join(HERE, "jax_train.py"), "--mode", mode, "--job", job,
                        "--socket", daemon.sock, "--dir", str(tmp_path / f"orbax-{job}"), "--out", str(out),
                        "--crash-at", str(crash_at)], env=env, capture_output=True, text=True, timeout=120)
    if crash_at >= 0:
        assert p.returncode == -signal.SIGKILL, p.stderr[-3000:]
        return p.stdout.split(), None
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.split("\n"), dict(np.load(out))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, daemon_module):
    """The state an uninterrupted run ends with."""
    _, ref = run_trainer(daemon_module, tmp_path_factory.mktemp("ref"), "ref", "ref", "plain")
    return ref


@pytest.fixture(scope="module")
def daemon_module():
    import shutil
    import tempfile

    from conftest import Daemon
    d = Daemon(tempfile.mkdtemp(prefix="ckpt-py-")).start()
    yield d
    d.stop(signal.SIGKILL)
    shutil.rmtree(d.dir, ignore_errors=True)


@pytest.mark.parametrize("mode", ["plain", "orbax"])
def test_trainer_killed_mid_run_resumes_bit_exact(daemon_module, tmp_path, reference, mode):
    job = f"train-{mode}"
    said, _ = run_trainer(daemon_module, tmp_path, "crash", job, mode, crash_at=25)
    assert said[-2:] == ["saved", "25"], said  # killed right after step 25's save went out
    lines, got = run_trainer(daemon_module, tmp_path, "resume", job, mode)
    resumed = [int(line.split()[1]) for line in lines if line.startswith("resumed")]
    # The latest step there is: ckptd may have finished step 25 after its
    # trainer died; Orbax had not finalized it (its step 20, then).
    assert resumed and resumed[0] in ((20, 25) if mode == "plain" else (20,)), lines
    assert got.keys() == reference.keys()
    for k in reference:
        assert got[k].dtype == reference[k].dtype and got[k].tobytes() == reference[k].tobytes(), k
    if mode == "orbax":
        steps = sorted(int(n) for n in os.listdir(tmp_path / f"orbax-{job}") if n.isdigit())
        assert steps == [35, 40], steps  # max_to_keep=2


SHARDED = textwrap.dedent(r"""
    import sys
    import numpy as np, jax, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import ckpt.jax
    sock = sys.argv[1]
    assert len(jax.devices()) == 4, jax.devices()
    rows = Mesh(np.array(jax.devices()), ("x",))
    grid = Mesh(np.array(jax.devices()).reshape(2, 2), ("x", "y"))
    a = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    tree = {"rows": jax.device_put(jnp.asarray(a), NamedSharding(rows, P("x"))),
            "cols": jax.device_put(jnp.asarray(a, jnp.bfloat16), NamedSharding(grid, P(None, "y"))),
            "rep": jax.device_put(jnp.arange(4), NamedSharding(rows, P()))}
    with ckpt.jax.Checkpointer("sharded", socket=sock) as cp:
        cp.save(tree, 1).durable.result(30)
        # Onto another mesh: each device holds its block of the saved array.
        want = {"rows": NamedSharding(grid, P("x", "y")), "cols": NamedSharding(rows, P("x")),
                "rep": NamedSharding(grid, P("y"))}
        _, back = cp.restore(1, target=want)
        for k in tree:
            assert back[k].sharding == want[k], (k, back[k].sharding)
            assert np.asarray(back[k]).tobytes() == np.asarray(tree[k]).tobytes(), k
            for s in back[k].addressable_shards:
                assert np.asarray(s.data).tobytes() == np.asarray(tree[k])[s.index].tobytes(), (k, s.index)
    print("ok")
""")


def test_sharded_arrays_restore_onto_other_meshes(daemon, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"), JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    p = subprocess.run([sys.executable, "-c", SHARDED, daemon.sock], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.split() == ["ok"], p.stderr[-3000:]
    # Here, with one device: the whole arrays, as saved.
    with ckpt.jax.Checkpointer("sharded", socket=daemon.sock) as cp:
        _, back = cp.restore(1)
    a = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    assert same({"rows": jnp.asarray(a), "cols": jnp.asarray(a, jnp.bfloat16), "rep": jnp.arange(4)}, back)


def test_orbax_new_run_does_not_remove_an_old_runs_steps(daemon_module, tmp_path):
    """A new run that reuses a job name with a new (empty) Orbax directory
    did not restore from the job: its first save fails with EEXIST, as
    ckpt.jax's, and the old run's ckptd steps stay (the handler removes
    steps Orbax never finalized only for a run that continues the job)."""
    job = "orbax-reused"
    said, _ = run_trainer(daemon_module, tmp_path, "first", job, "orbax", crash_at=10)
    assert said[-2:] == ["saved", "10"], said
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"), JAX_PLATFORMS="cpu")
    p = subprocess.run([sys.executable, os.path.join(HERE, "jax_train.py"), "--mode", "orbax", "--job", job,
                        "--socket", daemon_module.sock, "--dir", str(tmp_path / "orbax-new"), "--out",
                        str(tmp_path / "new.npz"), "--steps", "5"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0 and ("EEXIST" in p.stderr or "exist" in p.stderr), p.stderr[-3000:]
    # The handler let Orbax's directory thread finish before raising: one
    # that dies at the interpreter's exit leaves waiters that hang it.
    assert "interpreter shutdown" not in p.stderr, p.stderr[-3000:]
    import ckpt
    c = ckpt.Client(daemon_module.sock)
    try:
        steps = sorted(s["step"] for s in c.list(job) if s["complete"])
    finally:
        c.close()
    assert 5 in steps, steps


PROCESS = textwrap.dedent(r"""
    import os, sys
    pid, port, sock = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import ckpt.jax
    devs = np.array(jax.devices())
    assert len(devs) == 4 and len(jax.local_devices()) == 2, devs
    a = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    rows = NamedSharding(Mesh(devs, ("x",)), P("x"))
    arr = jax.make_array_from_callback(a.shape, rows, lambda idx: a[idx])
    with ckpt.jax.Checkpointer("procs", socket=sock) as cp:
        assert (cp.rank, cp.world_size) == (pid, 2)
        cp.save({"w": arr, "n": 3}, 1).durable.result(60)
        cp.wait_complete(1, timeout=60)  # ranks on two attempts: never complete
        # "latest": process 0 decides, every process restores that step,
        # each device its block of a transposed 2x2 mesh.
        want = NamedSharding(Mesh(devs.reshape(2, 2), ("x", "y")), P("y", "x"))
        step, back = cp.restore("latest", target={"w": want, "n": 0})
        assert step == 1 and back["n"] == 3
        for s in back["w"].addressable_shards:
            assert np.asarray(s.data).tobytes() == a[s.index].tobytes(), s.index
        attempt = cp.client.attempt_id
    print("attempt", attempt)
    print("ok", pid)
""")


def test_two_jax_processes_save_and_restore(daemon, tmp_path):
    """Two jax processes (2 host devices each, gloo collectives): each
    saves the box its devices hold as its rank, the step is complete, and
    both restore it onto another mesh; one process of one device then
    restores the whole array (2 ranks onto 1)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"), JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    ps = [subprocess.Popen([sys.executable, "-c", PROCESS, str(i), port, daemon.sock], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        outs = [p.communicate(timeout=180) for p in ps]
    finally:
        for p in ps:
            p.kill()
    for i, (p, (out, err)) in enumerate(zip(ps, outs)):
        assert p.returncode == 0 and out.split()[-2:] == ["ok", str(i)], err[-3000:]  # gloo talks on stdout too
    # One attempt for the launch, agreed through jax.distributed's store.
    from ckpt import _attempt
    attempts = {out.split()[-3] for out, _ in outs}
    assert len(attempts) == 1 and attempts.pop().startswith(_attempt._launcher_part() + "-"), outs
    with ckpt.jax.Checkpointer("procs", socket=daemon.sock) as cp:
        _, back = cp.restore(1)
    assert np.asarray(back["w"]).tobytes() == np.arange(8 * 6, dtype=np.float32).reshape(8, 6).tobytes()
