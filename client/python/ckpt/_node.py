"""This node's ckptd when no service runs one: started on demand from the
wheel, and the wheel's commands ckptd and ckptctl.

Checkpointer(job, storage="s3://..." or "file:///...") on a node where no
ckptd answers (no socket= and no $CKPTD_SOCKET; nothing at the system
socket /run/ckptd/ckptd.sock, which always wins when it answers) uses a
daemon of this user for that storage:

- its socket is $XDG_RUNTIME_DIR/ckptd/<key>.sock, else
  /tmp/ckptd-<uid>/<key>.sock (a 0700 directory of this user's), where
  <key> names the storage URL: jobs of one user that save to one place
  share one daemon and its pool; another storage gets a daemon of its own;
- local rank 0 of each job starts it, under an flock on <key>.lock beside
  the socket, so that two jobs starting together agree on one daemon;
  the other local ranks wait for its socket;
- it runs in a session of its own, so it outlives the trainer (a trainer
  killed after staged still gets its step durable), and leaves once no
  session is connected and nothing is in flight for $CKPTD_IDLE_EXIT
  seconds (600 by default: [server] idle_exit_ms);
- its pool ([pool] staging_bytes) is $CKPTD_STAGING_BYTES, else an eighth
  of the node's memory, between 1 GiB and 16 GiB; its journal is in
  $XDG_STATE_HOME/ckptd/<key> (else ~/.local/state/ckptd/<key>), its log
  ckptd.log there;
- its other settings come from $XDG_CONFIG_HOME/ckptd/ckptd.conf (else
  ~/.config/ckptd/ckptd.conf) when that file exists (ckptd.conf(5)),
  never from /etc/ckptd/ckptd.conf, which is the system service's.

docs/python.md "A daemon started on demand" says what the node's memory
budget becomes with several jobs.
"""
import errno as _errno
import fcntl
import hashlib
import os
import socket as _socket
import subprocess
import sys
import time
from typing import NoReturn, Optional

from .client import CkptError, DaemonUnavailable

SYSTEM_SOCKET = "/run/ckptd/ckptd.sock"
IDLE_EXIT_S = 600
START_WAIT_S = 120.0
GIB = 1 << 30


def binary(name: str) -> str:
    """The package's own ckptd or ckptctl (ckpt/_bin, in the wheel), else
    the one on $PATH."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", name)
    if os.access(here, os.X_OK):
        return here
    import shutil
    found = shutil.which(name)
    if found is None:
        raise DaemonUnavailable(_errno.ENOENT, f"no {name} in this package ({here}) nor on $PATH: "
                                "install the ckptd wheel, or ckptd itself")
    return found


def _exec(name: str) -> NoReturn:
    path = binary(name)
    os.execv(path, [name] + sys.argv[1:])


def ckptd() -> NoReturn:
    """The console command ckptd: the daemon the wheel carries."""
    _exec("ckptd")


def ckptctl() -> NoReturn:
    """The console command ckptctl."""
    _exec("ckptctl")


def answers(path: str) -> bool:
    """Whether something accepts connections on the Unix socket path."""
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.settimeout(5)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _key(storage: str) -> str:
    return hashlib.sha256(storage.encode()).hexdigest()[:16]


def _private_dir(path: str) -> str:
    """path, made if missing, and checked to be this user's alone: a
    directory another user could write into could hold a socket of theirs
    that this user's trainers would hand their tensors to."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    import stat
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise CkptError(_errno.EPERM, f"{path} is not a directory of this user's alone (mode 0700): "
                        "refusing to use a ckptd socket there")
    return path


def runtime_dir() -> str:
    """Where this user's daemons' sockets and locks are."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return _private_dir(os.path.join(xdg, "ckptd"))
    return _private_dir(f"/tmp/ckptd-{os.getuid()}")


def state_dir(storage: str) -> str:
    """The journal's directory of the daemon for storage."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    d = os.path.join(base, "ckptd", _key(storage))
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d


def user_config() -> Optional[str]:
    """This user's ckptd.conf for the daemons started here, if it exists."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    path = os.path.join(base, "ckptd", "ckptd.conf")
    return path if os.path.isfile(path) else None


def socket_for(storage: str) -> str:
    """The socket of this user's daemon for storage."""
    return os.path.join(runtime_dir(), _key(storage) + ".sock")


def staging_bytes() -> str:
    """The pool of a daemon started here: $CKPTD_STAGING_BYTES (as ckptd's
    --staging-bytes reads it), else an eighth of the memory, 1-16 GiB."""
    given = os.environ.get("CKPTD_STAGING_BYTES")
    if given:
        return given
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = 8 * GIB
    return str(min(max(mem // 8, GIB), 16 * GIB) // (1 << 20) * (1 << 20))


def _idle_exit_ms() -> int:
    s = os.environ.get("CKPTD_IDLE_EXIT")
    try:
        v = float(s) if s else IDLE_EXIT_S
    except ValueError:
        raise ValueError(f"$CKPTD_IDLE_EXIT={s!r}: want seconds") from None
    return max(1, int(v * 1000))


def _tail(path: str, n: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _start(storage: str, path: str, deadline: float) -> None:
    """Start ckptd for storage on path, in a session of its own, and wait
    until it answers (or exits, or the deadline passes)."""
    sd = state_dir(storage)
    log = os.path.join(sd, "ckptd.log")
    argv = [binary("ckptd"), "--config", user_config() or "/dev/null", "--socket", path, "--storage", storage,
            "--state-dir", sd,
            "--staging-bytes", staging_bytes(), "--set", f"server.idle_exit_ms={_idle_exit_ms()}"]
    # The daemon serves every rank of the node: not one rank's device
    # subset (it finds devices by UUID).
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "CKPTD_SOCKET")}
    with open(log, "ab") as out:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd="/", env=env,
                             start_new_session=True, close_fds=True)
    while time.monotonic() < deadline:
        if answers(path):
            return
        rc = p.poll()
        if rc is not None:
            raise DaemonUnavailable(_errno.ECONNREFUSED, f"ckptd started for {storage} exited with status {rc}: "
                                    f"{_tail(log)} (its log: {log})")
        time.sleep(0.05)
    raise DaemonUnavailable(_errno.ETIMEDOUT, f"ckptd started for {storage} did not answer on {path} "
                            f"within {START_WAIT_S:.0f} s (its log: {log})")


def ensure(storage: str, local_rank: int, wait_s: float = START_WAIT_S) -> str:
    """The socket of this user's daemon for storage, started if none
    answers: by local rank 0 under the lock; the other local ranks wait
    for it."""
    path = socket_for(storage)
    deadline = time.monotonic() + wait_s
    if answers(path):
        return path
    if local_rank != 0:
        while time.monotonic() < deadline:
            time.sleep(0.1)
            if answers(path):
                return path
        raise DaemonUnavailable(_errno.ETIMEDOUT, f"no ckptd answered on {path} within {wait_s:.0f} s: local rank 0 "
                                f"starts it (its log: {os.path.join(state_dir(storage), 'ckptd.log')})")
    lock = os.path.join(runtime_dir(), _key(storage) + ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not answers(path):
            _start(storage, path, deadline)
        return path
    finally:
        os.close(fd)


def resolve(socket: Optional[str], storage: Optional[str], local_rank: int) -> Optional[str]:
    """The socket a Checkpointer connects to: socket= or $CKPTD_SOCKET as
    given; else the system daemon when it answers; else, with storage,
    this user's daemon for it (started if need be); else None (the
    default, whose absence DaemonUnavailable reports)."""
    if socket or os.environ.get("CKPTD_SOCKET") or not storage:
        return socket
    if answers(SYSTEM_SOCKET):
        return SYSTEM_SOCKET
    return ensure(storage, local_rank)
