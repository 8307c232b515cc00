"""Issue 40: a trainer with only the wheel, and no ckptd service, saves and
restores. A fresh venv gets the manylinux wheel (scripts/wheel.sh) and
nothing else of ckptd (torch comes from the test venv through a .pth file,
behind the wheel's own package); Checkpointer(job, storage=...) then
starts this user's daemon from the wheel (ckpt/_node.py): under torchrun
with two ranks, for two jobs starting at once (one daemon), and for a
trainer SIGKILLed after staged, whose step still becomes durable. The
daemon leaves once idle ($CKPTD_IDLE_EXIT)."""
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time

import pytest

import ckpt._node

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WHEELS = sorted(glob.glob(os.path.join(ROOT, "build-wheel", "ckptd-*manylinux*.whl")))
pytestmark = [
    pytest.mark.skipif(not WHEELS, reason="no build-wheel/ckptd-*manylinux*.whl (scripts/venv.sh builds it)"),
    pytest.mark.skipif(ckpt._node.answers(ckpt._node.SYSTEM_SOCKET),
                       reason="a ckptd service answers at /run/ckptd/ckptd.sock: it would win"),
]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """A venv with only the wheel, and torch from the test venv behind it."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "--no-index", WHEELS[-1]],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "zz_test_venv.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    return venv


@pytest.fixture
def node(tmp_path, fresh):
    """(env, store URL) of a node with no daemon: the XDG directories in
    tmp_path; the daemons started there are killed at the end."""
    env = {k: v for k, v in os.environ.items() if k not in ("CKPTD_SOCKET", "CKPT_LIB", "PYTHONPATH")}
    for k in ("XDG_STATE_HOME", "XDG_CONFIG_HOME"):
        env[k] = str(tmp_path / k.lower())
        os.makedirs(env[k])
    # Short: a Unix socket's path has at most 107 bytes.
    env["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="ckn")
    env.update(CKPTD_STAGING_BYTES="256M", CKPTD_IDLE_EXIT="2", PATH=f"{fresh}/bin:{env['PATH']}")
    yield env, f"file://{tmp_path}/store"
    for pid in daemons(str(tmp_path)):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(env["XDG_RUNTIME_DIR"], ignore_errors=True)


def daemons(under):
    """Pids of the ckptd processes whose command line names a path under."""
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"ckptd") and any(under.encode() in a for a in argv):
            found.append(int(p))
    return found


def run(fresh, env, code, *args, timeout=180):
    r = subprocess.run([str(fresh / "bin" / "python"), "-c", code, *args], env=env, cwd="/",
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


TRAIN = r"""
import os, sys, torch, ckpt, ckpt.torch
assert os.path.realpath(ckpt.__file__).startswith(os.path.realpath(sys.prefix)), ckpt.__file__
store, mode = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
def weights(step):
    return {"w": torch.arange(4096, dtype=torch.float32) * (rank + 1) + step,
            "b": torch.full((7,), float(step * 10 + rank), dtype=torch.bfloat16)}
cp = ckpt.torch.Checkpointer("tr", storage=store)
if mode == "save":
    for step in (1, 2, 3):
        cp.save(weights(step), step)
    sock = cp.client.socket
    cp.close()
    print("socket", rank, sock)
else:
    state = {k: torch.zeros_like(v) for k, v in weights(0).items()}
    step, _ = cp.load(state)
    assert step == 3, step
    assert all(torch.equal(state[k], v) for k, v in weights(3).items())
    cp.close()
    print("loaded", rank, step)
"""


def test_torchrun_two_ranks_start_one_daemon_from_the_wheel(node, fresh, tmp_path):
    env, store = node
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = [str(fresh / "bin" / "python"), "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
                "2", "--master-addr", "127.0.0.1", "--master-port", str(port), str(script), store]
    r = subprocess.run(torchrun + ["save"], env=env, cwd="/", capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    socks = {line.split()[2] for line in r.stdout.splitlines() if line.startswith("socket ")}
    assert len(socks) == 1, r.stdout
    sock = socks.pop()
    assert sock.startswith(env["XDG_RUNTIME_DIR"] + "/ckptd/"), sock
    # One daemon, the wheel's, in a session of its own.
    pids = daemons(str(tmp_path))
    assert len(pids) == 1, pids
    exe = os.path.realpath(f"/proc/{pids[0]}/exe")
    assert exe.startswith(os.path.realpath(str(fresh))) and exe.endswith("/ckpt/_bin/ckptd"), exe
    assert os.getsid(pids[0]) != os.getsid(0)  # a session of its own: no terminal's or launcher's signal
    # Idle for $CKPTD_IDLE_EXIT (2 s): it leaves, and takes its socket.
    deadline = time.monotonic() + 30
    while daemons(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not daemons(str(tmp_path))
    assert not os.path.exists(sock)
    # A new run starts it again and restores from storage on both ranks.
    r = subprocess.run(torchrun + ["load"], env=env, cwd="/", capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(line for line in r.stdout.splitlines() if line.startswith("loaded")) == \
        ["loaded 0 3", "loaded 1 3"]


JOB = r"""
import sys, torch, ckpt.torch
cp = ckpt.torch.Checkpointer(sys.argv[2], storage=sys.argv[1], alone=True)
cp.save({"w": torch.ones(1000)}, 1)
sock = cp.client.socket
cp.close()
print(sock)
"""


def test_two_jobs_starting_together_share_one_daemon(node, fresh, tmp_path):
    env, store = node
    procs = [subprocess.Popen([str(fresh / "bin" / "python"), "-c", JOB, store, f"job{i}"], env=env, cwd="/",
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[0][0] == outs[1][0]
    log = glob.glob(f"{env['XDG_STATE_HOME']}/ckptd/*/ckptd.log")
    assert len(log) == 1
    with open(log[0]) as f:
        assert f.read().count("ckptd listening on") == 1
    assert len(daemons(str(tmp_path))) <= 1


KILLED = r"""
import os, signal, sys, torch, ckpt.torch
cp = ckpt.torch.Checkpointer("killed", storage=sys.argv[1])
g = torch.Generator().manual_seed(5)
cp.save({"w": torch.randint(0, 255, (8 << 20,), dtype=torch.uint8, generator=g)}, 1)   # returns once staged
print("staged", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""

RESTORE = r"""
import sys, torch, ckpt.torch
cp = ckpt.torch.Checkpointer("killed", storage=sys.argv[1])
g = torch.Generator().manual_seed(5)
want = torch.randint(0, 255, (8 << 20,), dtype=torch.uint8, generator=g)
state = {"w": torch.zeros_like(want)}
step, _ = cp.load(state)
assert step == 1 and torch.equal(state["w"], want)
print("restored", cp.last_load["source"])
"""


def test_trainer_killed_after_staged_still_gets_its_step_durable(node, fresh, tmp_path):
    env, store = node
    # Uploads of 1 MiB chunks, slowed in the middle: the trainer dies
    # while its step is still being written.
    conf = os.path.join(env["XDG_CONFIG_HOME"], "ckptd", "ckptd.conf")
    os.makedirs(os.path.dirname(conf))
    with open(conf, "w") as f:
        f.write("[pool]\nchunk_bytes = 1M\n[debug]\nstore_delay_ms = 2000\n")
    p = subprocess.run([str(fresh / "bin" / "python"), "-c", KILLED, store], env=env, cwd="/",
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == -signal.SIGKILL, p.stdout + p.stderr
    assert p.stdout.strip() == "staged"
    step_dir = tmp_path / "store" / "killed" / "step-000000000001"
    assert not glob.glob(f"{step_dir}/*.manifest"), "durable before the trainer died: the test proves nothing"
    deadline = time.monotonic() + 60
    while not glob.glob(f"{step_dir}/*.manifest") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert glob.glob(f"{step_dir}/*.manifest")
    assert run(fresh, env, RESTORE, store).split()[0] == "restored"


def test_a_daemon_that_answers_wins(daemon, monkeypatch, tmp_path):
    """socket= and $CKPTD_SOCKET are used as given; else the system
    socket when it answers (here a test daemon stands for it): nothing is
    started."""
    monkeypatch.delenv("CKPTD_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert ckpt._node.resolve("/given.sock", "file:///x", 0) == "/given.sock"
    monkeypatch.setattr(ckpt._node, "SYSTEM_SOCKET", daemon.sock)
    assert ckpt._node.resolve(None, f"file://{tmp_path}/s", 0) == daemon.sock
    assert not os.path.exists(tmp_path / "ckptd")
    monkeypatch.setenv("CKPTD_SOCKET", "/env.sock")
    assert ckpt._node.resolve(None, "file:///x", 0) is None  # the default: $CKPTD_SOCKET
    monkeypatch.delenv("CKPTD_SOCKET")
    assert ckpt._node.resolve(None, None, 0) is None


def test_a_shared_runtime_directory_is_refused(monkeypatch, tmp_path):
    """Another user's (or a world-writable) directory could hold their
    socket: the trainer's tensors would go to them."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    os.makedirs(tmp_path / "ckptd", mode=0o777)
    os.chmod(tmp_path / "ckptd", 0o777)
    with pytest.raises(ckpt.CkptError, match="alone"):
        ckpt._node.runtime_dir()


DCP = r"""
import sys, torch, torch.distributed.checkpoint as dcp, ckpt.dcp as cd
store = sys.argv[1]
sd = {"w": torch.arange(1000, dtype=torch.float32), "b": torch.ones(3, dtype=torch.bfloat16)}
dcp.save(sd, storage_writer=cd.Writer("dcpjob", step=1, storage=store))
cd.close_all()
got = {k: torch.zeros_like(v) for k, v in sd.items()}
dcp.load(got, storage_reader=cd.Reader("dcpjob", step=1, storage=store))
assert all(torch.equal(got[k], sd[k]) for k in sd)
print("dcp ok")
"""


def test_dcp_writer_and_reader_start_the_daemon_too(node, fresh, tmp_path):
    """storage= on ckpt.dcp's Writer and Reader (and ckpt.lightning's,
    ckpt.hf's, ckpt.jax's) reaches the Checkpointer's: the daemon is
    started for it."""
    env, store = node
    assert run(fresh, env, DCP, store).strip().endswith("dcp ok")
    assert glob.glob(f"{tmp_path}/store/dcpjob/step-000000000001/*.manifest")


def test_runtime_dir_others_can_write_is_not_used(monkeypatch, tmp_path):
    """$XDG_RUNTIME_DIR that is not this user's alone (inherited through
    sudo, or group-writable) is passed over for /tmp/ckptd-<uid>."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(shared))
    assert ckpt._node.runtime_dir() == f"/tmp/ckptd-{os.getuid()}"
    assert not (shared / "ckptd").exists()


def test_idle_exit_and_key(monkeypatch):
    """$CKPTD_IDLE_EXIT=0 is never (the config's 0), not 1 ms; a trailing
    slash names the same daemon; other storage credentials another one."""
    monkeypatch.setenv("CKPTD_IDLE_EXIT", "0")
    assert ckpt._node._idle_exit_ms() == 0
    monkeypatch.setenv("CKPTD_IDLE_EXIT", "2.5")
    assert ckpt._node._idle_exit_ms() == 2500
    monkeypatch.setenv("CKPTD_IDLE_EXIT", "-1")
    with pytest.raises(ValueError):
        ckpt._node._idle_exit_ms()
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    a = ckpt._node._key("s3://b/p?region=x")
    assert ckpt._node._key("s3://b/p/?region=x") == a
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "other")
    assert ckpt._node._key("s3://b/p?region=x") != a


def test_binary_is_never_the_console_command(monkeypatch, tmp_path):
    """Outside the wheel (no ckpt/_bin), ckptd is looked for on $PATH; the
    wheel's console command there is a Python script that would exec
    itself for ever: only a program is taken."""
    shim = tmp_path / "bin" / "ckptd"
    shim.parent.mkdir()
    shim.write_text("#!/usr/bin/env python3\nimport ckpt._node; ckpt._node.ckptd()\n")
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", str(shim.parent))
    monkeypatch.setattr(ckpt._node, "__file__", str(tmp_path / "src" / "ckpt" / "_node.py"))
    with pytest.raises(ckpt.DaemonUnavailable, match="nor on"):
        ckpt._node.binary("ckptd")
    real = tmp_path / "real"
    real.mkdir()
    shutil.copy(os.environ["CKPTD_BIN"], real / "ckptd")
    monkeypatch.setenv("PATH", f"{shim.parent}:{real}")
    assert ckpt._node.binary("ckptd") == str(real / "ckptd")
