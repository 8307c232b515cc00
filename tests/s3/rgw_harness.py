"""A real S3 server for the s3 suite: Ceph's RADOS Gateway (Debian 12's
radosgw 16.2, Pacific) on 127.0.0.1, over a one-node cluster made in a
temporary directory: one monitor, one OSD keeping its objects in memory
(memstore), pools of size 1, no cephx. Up in about 2 s; stopped by PID.

What it takes (each learnt the hard way):
  - Pacific has no cluster-less RGW backend (dbstore came with Quincy), so
    a monitor and an OSD it is, with osd objectstore = memstore;
  - with auth none every ms_*_mode must be crc, or radosgw loops on
    "get_initial_auth_request returned -13"; the monitor speaks msgr v2;
  - paxos propose interval = 0.05 makes the monitor commit at once;
  - the monitor shuts itself down when its disk has under 5% free (mon
    data avail crit), as a full CI machine's has: then every command
    timed out; it keeps nothing on disk worth guarding, so crit = 0;
  - radosgw takes seconds to exit on SIGTERM: stop() kills it.

Same interface as moto_harness.Moto (endpoint, port, access_key,
secret_key, client()), so a test runs against either."""
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
import uuid

import boto3
from moto_harness import free_port

REGION = "us-east-1"
BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "monmaptool", "ceph-authtool", "ceph")


def available():
    """Why RGW cannot run here, or None."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    return f"no {', '.join(missing)} (Debian: radosgw ceph-mon ceph-osd; scripts/deps.sh)" if missing else None


class Rgw:
    name = "rgw"

    def __init__(self, logdir, memstore_bytes=4 << 30):
        """memstore_bytes: what the OSD may hold (RAM, taken as written;
        RGW frees deleted objects' data later, in its garbage collection)."""
        self.dir = tempfile.mkdtemp(prefix="ckpt-rgw-")
        self.logdir = logdir
        self.procs = []
        mon_port, self.port = free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        fsid = str(uuid.uuid4())
        d = self.dir
        for sub in ("run", "log", "mon", "osd", "rgw"):
            os.makedirs(os.path.join(d, sub))
        self.conf = os.path.join(d, "ceph.conf")
        with open(self.conf, "w") as f:
            f.write(f"""[global]
fsid = {fsid}
mon host = v2:127.0.0.1:{mon_port}
auth cluster required = none
auth service required = none
auth client required = none
ms bind ipv6 = false
ms_cluster_mode = crc
ms_service_mode = crc
ms_client_mode = crc
ms_mon_cluster_mode = crc
ms_mon_service_mode = crc
ms_mon_client_mode = crc
osd objectstore = memstore
memstore device bytes = {memstore_bytes}
osd pool default size = 1
osd pool default min size = 1
osd crush chooseleaf type = 0
osd pool default pg autoscale mode = off
osd pool default pg num = 8
osd pool default pgp num = 8
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0
paxos propose interval = 0.05
run dir = {d}/run
log file = {d}/log/$name.log
admin socket = {d}/run/$name.asok
mon data = {d}/mon/$cluster-$id
osd data = {d}/osd/$cluster-$id
keyring = {d}/keyring
[client.rgw]
rgw frontends = beast endpoint=127.0.0.1:{self.port}
rgw data = {d}/rgw
rgw gc obj min wait = 1
rgw gc processor period = 5
rgw s3 auth use sts = true
rgw sts key = {uuid.uuid4().hex[:16]}
""")
        try:
            self._run("ceph-authtool", "--create-keyring", f"{d}/keyring", "--gen-key", "-n", "mon.", "--cap", "mon",
                      "allow *")
            self._run("monmaptool", "--create", "--addv", "a", f"[v2:127.0.0.1:{mon_port}]", "--fsid", fsid,
                      f"{d}/monmap")
            self._run("ceph-mon", "-c", self.conf, "--mkfs", "-i", "a", "--monmap", f"{d}/monmap", "--keyring",
                      f"{d}/keyring")
            self._start("mon", "ceph-mon", "-c", self.conf, "-i", "a", "-f")
            self._wait(lambda: self._run("ceph", "-c", self.conf, "--connect-timeout", "5", "mon", "stat"),
                       "the monitor")
            osd_uuid = str(uuid.uuid4())
            osd_id = self._run("ceph", "-c", self.conf, "--connect-timeout", "20", "osd", "new", osd_uuid).strip()
            os.makedirs(f"{d}/osd/ceph-{osd_id}", exist_ok=True)
            self._run("ceph-osd", "-c", self.conf, "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid)
            self._start("osd", "ceph-osd", "-c", self.conf, "-i", osd_id, "-f")
            self._wait(lambda: "1 up" in self._run("ceph", "-c", self.conf, "osd", "stat"), "the OSD")
            self._start("rgw", "radosgw", "-c", self.conf, "-n", "client.rgw", "-f")
            self._wait(self._answers, "radosgw")
            self.access_key, self.secret_key = "CKPTDRGWKEY", "ckptd-rgw-secret-" + uuid.uuid4().hex
            self._run("radosgw-admin", "-c", self.conf, "user", "create", "--uid=ckptd", "--display-name=ckptd",
                      f"--access-key={self.access_key}", f"--secret={self.secret_key}")
        except Exception:
            self.stop()
            raise

    def _run(self, *argv):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()[-800:]}")
        return r.stdout

    def _start(self, name, *argv):
        log = open(os.path.join(self.logdir, f"rgw-{name}.out"), "a")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=log))

    def _answers(self):
        try:
            urllib.request.urlopen(self.endpoint, timeout=1).close()
            return True
        except OSError:
            return False

    def _wait(self, ready, what):
        deadline = time.time() + 60
        while time.time() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited with {p.returncode}: {self._errors()}")
            try:
                if ready():
                    return
            except RuntimeError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{what} did not come up in 60 s: {self._errors()}")

    def _errors(self):
        """The last error lines the daemons logged (Ceph's own logs, at
        level -1, and their stderr): the temporary directory goes at
        stop(), so an error carries them."""
        found = []
        logs = [os.path.join(self.dir, "log", n) for n in sorted(os.listdir(os.path.join(self.dir, "log")))]
        logs += [os.path.join(self.logdir, n) for n in sorted(os.listdir(self.logdir)) if n.startswith("rgw-")]
        for path in logs:
            with open(path, errors="replace") as f:
                found += [f"{os.path.basename(path)}: {line.strip()[-300:]}" for line in f
                          if " -1 " in line or "error" in line.lower()][-2:]
        return " | ".join(found) or f"no error logged in {self.dir}/log"

    def role_credentials(self):
        """Temporary credentials (with a session token) of a role allowed
        s3:*, from RGW's STS AssumeRole: what STS web identity and IMDSv2
        hand out."""
        if not getattr(self, "_role_arn", None):
            trust = ('{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":'
                     '["arn:aws:iam:::user/ckptd"]},"Action":["sts:AssumeRole"]}]}')
            policy = '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:*"],"Resource":"*"}]}'
            self._run("radosgw-admin", "-c", self.conf, "caps", "add", "--uid=ckptd", "--caps=roles=*")
            out = self._run("radosgw-admin", "-c", self.conf, "role", "create", "--role-name=ckptd-role",
                            "--path=/", f"--assume-role-policy-doc={trust}")
            self._run("radosgw-admin", "-c", self.conf, "role-policy", "put", "--role-name=ckptd-role",
                      "--policy-name=s3", f"--policy-doc={policy}")
            import json
            self._role_arn = json.loads(out)["Arn"]
        sts = boto3.client("sts", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=self.access_key,
                           aws_secret_access_key=self.secret_key)
        c = sts.assume_role(RoleArn=self._role_arn, RoleSessionName="ckptd")["Credentials"]
        return c["AccessKeyId"], c["SecretAccessKey"], c["SessionToken"]

    def client(self, access_key=None, secret_key=None):
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=access_key or self.access_key,
                            aws_secret_access_key=secret_key or self.secret_key)

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(10)
        self.procs = []
        shutil.rmtree(self.dir, ignore_errors=True)
