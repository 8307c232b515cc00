"""Helpers of the s3 suite: a ckptd process with object storage, URLs,
credentials environments, and listings through boto3."""
import os
import signal
import socket
import subprocess
import time

CKPTD = os.environ.get("CKPTD_BIN", "ckptd")
EXAMPLE = os.environ.get("CKPT_EXAMPLE_BIN", "ckpt-example")
CKPTCTL = os.environ.get("CKPTCTL_BIN", "ckptctl")
MIB = 1 << 20


class Daemon:
    live = []  # killed after each test (conftest), so a failed test leaves none behind

    def __init__(self, tmp, url, env, conf="", args=(), staging="96M", chunk="1M", log_level="debug", prefix=()):
        """args: more ckptd flags, after the defaults (so they win); prefix: a
        command that execs ckptd (setpriv ...), keeping its pid."""
        self.tmp = tmp
        self.prefix = list(prefix)
        self.args = list(args)
        self.pool = (staging, chunk)
        self.log_level = log_level
        self.sock = str(tmp / "ckptd.sock")
        self.url = url
        self.env = env
        self.conf = tmp / "ckptd.conf"
        self.conf.write_text(conf)
        self.log = tmp / "ckptd.log"
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [*self.prefix, CKPTD, "--socket", self.sock, "--storage", self.url, "--staging-bytes", self.pool[0],
             "--chunk-bytes", self.pool[1], "--state-dir", str(self.tmp / "state"), "--config", str(self.conf),
             "--log-level", self.log_level, *self.args],
            env=self.env, stderr=open(self.log, "a"))
        Daemon.live.append(self)
        for _ in range(200):
            # The socket file appears at bind(), before listen(): connect.
            if os.path.exists(self.sock):
                probe = socket.socket(socket.AF_UNIX)
                try:
                    probe.connect(self.sock)
                    return self
                except OSError:
                    pass
                finally:
                    probe.close()
            if self.proc.poll() is not None:
                raise RuntimeError("ckptd exited: " + self.log.read_text()[-2000:])
            time.sleep(0.05)
        raise RuntimeError("ckptd did not start")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(60) == 0, self.log.read_text()[-3000:]
        if os.path.exists(self.sock):
            os.unlink(self.sock)

    def kill(self):
        self.proc.kill()
        self.proc.wait()
        os.unlink(self.sock)

    def example(self, job, steps=2, size_mb=16, restore_only=False, check=True, extra=()):
        cmd = [EXAMPLE, "--socket", self.sock, "--job", job, "--steps", str(steps), "--size-mb", str(size_mb),
               "--tensors", "3", *extra]
        if restore_only:
            cmd.append("--restore-only")
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if check:
            assert r.returncode == 0, r.stdout + r.stderr + self.log.read_text()[-3000:]
        return r

    def ctl(self, *args):
        r = subprocess.run([CKPTCTL, "--socket", self.sock, *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout


def s3env(moto, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=moto.access_key, AWS_SECRET_ACCESS_KEY=moto.secret_key, HOME="/nonexistent")
    env.update(extra)
    return env


def s3url(bucket, endpoint, **opts):
    q = {"endpoint": endpoint, "region": "us-east-1", "path_style": "1", "part_size": "5M", "concurrency": "4",
         "retry_base_ms": "10", "retry_cap_ms": "200"}
    q.update(opts)
    return f"s3://{bucket}/runs?" + "&".join(f"{k}={v}" for k, v in q.items())


def keys(moto, bucket, prefix=""):
    out = []
    for page in moto.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out += [o["Key"] for o in page.get("Contents", [])]
    return sorted(out)


def open_uploads(moto, bucket):
    return moto.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])
