"""Issue "Security": storage credentials never reach a log line, the status,
the metrics, the state directory or a core dump. A full save and restore
on S3 at debug level, then every byte the daemon wrote or answered is
searched for the secret key."""
import os
import pathlib
import shutil
import tempfile

import pytest

from s3util import Daemon, s3env, s3url


def everything_under(root):
    out = b""
    for p in pathlib.Path(root).rglob("*"):
        if p.is_file() and not p.is_socket():
            out += p.read_bytes()
    return out


def test_secret_reaches_no_log_status_metrics_or_state(moto, bucket, tmp_path, proxy):
    url, env = s3url(bucket, proxy.endpoint), s3env(moto)
    secret = moto.secret_key.encode()
    assert len(secret) >= 20
    d = Daemon(tmp_path, url, env, log_level="debug").start()
    d.example("sec", steps=2, size_mb=6)  # multipart uploads (part_size 5M)
    d.example("sec", steps=2, size_mb=6, restore_only=True)
    said = "".join([d.ctl("status"), d.ctl("--json", "status"), d.ctl("metrics"), d.ctl("ls"),
                    d.ctl("show", "sec", "2"), d.ctl("verify", "sec", "2")]).encode()
    environ = pathlib.Path(f"/proc/{d.proc.pid}/environ").read_bytes()
    d.stop()
    log = d.log.read_bytes()
    assert b"debug" in log.lower() or b"<7>" in log, "the daemon did not log at debug level"
    assert b"sec" in said and b"ckptd_bytes_staged_total" in said
    # The secret is really there to be leaked (the environment), and
    # nowhere the daemon wrote or answered.
    assert secret in environ
    for what, data in (("the log", log), ("ckptctl's answers", said),
                       ("the state directory and everything under the test's directory", everything_under(tmp_path))):
        assert secret not in data, f"the secret key is in {what}"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run ckptd as another uid")
def test_no_core_dump_holds_credentials(moto, bucket, proxy):
    """Run as a plain uid, a dumpable process owns its /proc/PID files; a
    non-dumpable one (no core dump, no ptrace by its uid) has them owned by
    root. With file:// (no credentials) it stays dumpable."""
    top = pathlib.Path(tempfile.mkdtemp(prefix="ckpt-dump-"))  # pytest's tmp_path is root's only
    try:
        prefix = ["setpriv", "--reuid=2005", "--regid=2005", "--clear-groups"]
        url, env = s3url(bucket, proxy.endpoint), s3env(moto)
        for sub in ("s3", "fs"):
            (top / sub).mkdir()
        for p in (top, top / "s3", top / "fs"):
            os.chmod(p, 0o777)
        d = Daemon(top / "s3", url, env, prefix=prefix).start()
        assert os.stat(f"/proc/{d.proc.pid}/status").st_uid == 0, "ckptd holding S3 credentials is dumpable"
        d.example("dump", steps=1, size_mb=1)
        d.stop()
        assert b"core dumps off" in d.log.read_bytes()
        d = Daemon(top / "fs", f"file://{top / 'fs' / 'store'}", env, prefix=prefix).start()
        assert os.stat(f"/proc/{d.proc.pid}/status").st_uid == 2005, "ckptd on file:// was made non-dumpable"
        d.stop()
    finally:
        shutil.rmtree(top, ignore_errors=True)
