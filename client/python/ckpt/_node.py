"""This node's ckptd when no service runs one: started on demand from the
wheel, and the wheel's commands ckptd and ckptctl.

Checkpointer(job, storage="s3://..." or "file:///...") on a node where no
ckptd answers (no socket= and no $CKPTD_SOCKET; nothing at the system
socket /run/ckptd/ckptd.sock, which always wins when it answers) uses a
daemon of this user for that storage:

- its socket is $XDG_RUNTIME_DIR/ckptd/<key>.sock, else
  /tmp/ckptd-<uid>/<key>.sock (a 0700 directory of this user's), where
  <key> names the storage URL (a trailing "/" aside), this host, and the
  storage credentials in the environment (AWS_*, GOOGLE_*, GCE_*): jobs
  of one user that save to one place with the same credentials share one
  daemon and its pool; others get a daemon of their own. A daemon found
  there must run as this user (SO_PEERCRED), or it is refused;
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
  ckptd.log there; the daemon holds that directory's lock for life, so a
  new one waits for an old one still draining;
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
import stat
import struct
import subprocess
import sys
import time
from typing import Callable, NoReturn, Optional, TypeVar

from .client import CkptError, DaemonUnavailable

T = TypeVar("T")

SYSTEM_SOCKET = "/run/ckptd/ckptd.sock"
IDLE_EXIT_S = 600
START_WAIT_S = 120.0
GIB = 1 << 30


def _elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def binary(name: str) -> str:
    """The package's own ckptd or ckptctl (ckpt/_bin, in the wheel), else
    the one on $PATH (a program, never the wheel's console command, which
    would exec itself)."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", name)
    if os.access(here, os.X_OK):
        return here
    for d in os.environ.get("PATH", "").split(os.pathsep):
        cand = os.path.join(d or ".", name)
        if os.access(cand, os.X_OK) and _elf(cand):
            return cand
    raise DaemonUnavailable(_errno.ENOENT, f"no {name} in this package ({here}) nor on $PATH: "
                            "install the ckptd wheel, or ckptd itself")


def _exec(name: str) -> NoReturn:
    path = binary(name)
    os.execv(path, [name] + sys.argv[1:])


def ckptd() -> NoReturn:
    """The console command ckptd: the daemon the wheel carries."""
    _exec("ckptd")


def ckptctl() -> NoReturn:
    """The console command ckptctl."""
    _exec("ckptctl")


def answers(path: str, uid: Optional[int] = None) -> bool:
    """Whether something accepts connections on the Unix socket path (and,
    with uid, runs as that user: SO_PEERCRED)."""
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.settimeout(5)
        s.connect(path)
        if uid is not None:
            _pid, peer_uid, _gid = struct.unpack("3i", s.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED,
                                                                   struct.calcsize("3i")))
            if peer_uid != uid:
                raise CkptError(_errno.EPERM, f"the ckptd at {path} runs as uid {peer_uid}, not this user's "
                                f"{uid}: refusing to hand it this job's tensors")
        return True
    except CkptError:
        raise
    except OSError:
        return False
    finally:
        s.close()


# The environment a daemon started here serves with: its storage
# credentials are part of its key (a job with other credentials gets a
# daemon of its own).
_CRED_PREFIXES = ("AWS_", "GOOGLE_", "GCE_", "GCS_")


def _key(storage: str) -> str:
    url, _, query = storage.partition("?")
    url = url.rstrip("/") + ("?" + query if query else "")
    creds = sorted((k, v) for k, v in os.environ.items() if k.startswith(_CRED_PREFIXES))
    h = hashlib.sha256(repr((url, _socket.gethostname(), creds)).encode())
    return h.hexdigest()[:16]


def _private_dir(path: str) -> str:
    """path, made if missing, and checked to be this user's alone: a
    directory another user could write into could hold a socket of theirs
    that this user's trainers would hand their tensors to."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        try:
            import pwd
            owner = pwd.getpwuid(st.st_uid).pw_name
        except (KeyError, ImportError):
            owner = str(st.st_uid)
        raise CkptError(_errno.EPERM, f"{path} (owner {owner}, mode {stat.S_IMODE(st.st_mode):o}) is not a "
                        "directory of this user's alone (mode 0700): refusing to use a ckptd socket there; "
                        "set $XDG_RUNTIME_DIR to a directory of yours, or name a daemon with socket=")
    return path


def _owned(path: str) -> bool:
    """Whether path is a directory of this user's that no one else can
    write into (a runtime directory inherited through sudo is not)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def runtime_dir() -> str:
    """Where this user's daemons' sockets and locks are."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and _owned(xdg):
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
    path = os.path.join(runtime_dir(), _key(storage) + ".sock")
    if len(path.encode()) > 107:
        raise CkptError(_errno.ENAMETOOLONG, f"{path} is too long for a Unix socket (107 bytes): set "
                        "$XDG_RUNTIME_DIR to a shorter directory")
    return path


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
    """$CKPTD_IDLE_EXIT in ms: seconds, 0 for never (the config's 0)."""
    s = os.environ.get("CKPTD_IDLE_EXIT")
    try:
        v = float(s) if s else IDLE_EXIT_S
    except ValueError:
        v = -1
    if v < 0:
        raise ValueError(f"$CKPTD_IDLE_EXIT={s!r}: want seconds, 0 for never")
    return 0 if v == 0 else max(1, int(v * 1000))


def _tail(path: str, n: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _wait_state_lock(sd: str, deadline: float) -> None:
    """Wait until no daemon holds sd's lock (one still draining its
    uploads after an idle exit or a SIGTERM): the next one would refuse
    to start on the same journal."""
    fd = os.open(os.path.join(sd, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise DaemonUnavailable(_errno.ETIMEDOUT, f"the ckptd of {sd} is still draining; try again "
                                            "later") from None
                time.sleep(0.1)
    finally:
        os.close(fd)  # unlocked: the new daemon takes it


def _start(storage: str, path: str, deadline: float) -> None:
    """Start ckptd for storage on path, detached (a session of its own,
    reparented to init: nothing to reap here), and wait until it answers
    (or exits, or the deadline passes)."""
    sd = state_dir(storage)
    log = os.path.join(sd, "ckptd.log")
    _wait_state_lock(sd, deadline)
    argv = [binary("ckptd"), "--config", user_config() or "/dev/null", "--socket", path, "--storage", storage,
            "--state-dir", sd, "--staging-bytes", staging_bytes(), "--set", f"server.idle_exit_ms={_idle_exit_ms()}"]
    # The daemon serves every rank of the node: not one rank's device
    # subset (it finds devices by UUID), nor a library one rank preloads.
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_VISIBLE_DEVICES", "CKPTD_SOCKET", "LD_PRELOAD")}
    # sh starts it in the background and exits at once, saying its pid.
    sh = subprocess.run(["/bin/sh", "-c", 'log=$1; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!', "sh", log]
                        + argv, env=env, cwd="/", start_new_session=True, capture_output=True, text=True,
                        timeout=30)
    pid = int(sh.stdout.strip() or 0)
    while time.monotonic() < deadline:
        if answers(path, os.getuid()):
            return
        if pid <= 0 or not os.path.exists(f"/proc/{pid}") or _zombie(pid):
            raise DaemonUnavailable(_errno.ECONNREFUSED, f"ckptd started for {storage} exited: {_tail(log)} "
                                    f"(its log: {log})")
        time.sleep(0.05)
    raise DaemonUnavailable(_errno.ETIMEDOUT, f"ckptd started for {storage} did not answer on {path} "
                            f"in time (its log: {log})")


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def ensure(storage: str, local_rank: int, wait_s: float = START_WAIT_S) -> str:
    """The socket of this user's daemon for storage, started if none
    answers: by local rank 0 under the lock; the other local ranks wait
    for it."""
    path = socket_for(storage)
    uid = os.getuid()
    deadline = time.monotonic() + wait_s
    if answers(path, uid):
        return path
    if local_rank != 0:
        while time.monotonic() < deadline:
            time.sleep(0.1)
            if answers(path, uid):
                return path
        raise DaemonUnavailable(_errno.ETIMEDOUT, f"no ckptd answered on {path} within {wait_s:.0f} s: local rank 0 "
                                f"starts it (its log: {os.path.join(state_dir(storage), 'ckptd.log')})")
    lock = os.path.join(runtime_dir(), _key(storage) + ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not answers(path, uid):
            _start(storage, path, max(deadline, time.monotonic() + START_WAIT_S))
        return path
    finally:
        os.close(fd)


def connect(make: Callable[[Optional[str]], T], socket: Optional[str], storage: Optional[str],
            local_rank: int) -> T:
    """make(the socket resolve() gives); once more when this user's daemon
    went away between the look and the connection (an idle exit's last
    moment): then it is started again."""
    path = resolve(socket, storage, local_rank)
    try:
        return make(path)
    except (DaemonUnavailable, CkptError) as e:
        if not storage or path is None or path == SYSTEM_SOCKET or path == socket or \
                e.errno not in (_errno.ENOENT, _errno.ECONNREFUSED, _errno.ECONNRESET, _errno.EPIPE):
            raise
    return make(ensure(storage, local_rank))


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
