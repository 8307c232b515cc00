"""Issue "Security": a tenant with storage and credentials of its own. The
daemon's own storage is file:// and its environment has no AWS credentials;
tenant team-s3 saves to S3 with the keys of a credentials file its URL
names (credentials_file, profile), under its prefix; the other tenant and
the admin listing see what they should, and a wrong profile is refused at
start naming the file."""
import os
import subprocess

from s3util import CKPTCTL, EXAMPLE, Daemon, keys, s3url


def no_aws_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["HOME"] = "/nonexistent"
    return env


def tenant_storage(bucket, proxy, creds, profile):
    """The tenant's storage keys: the URL, then each option on its own line
    (ini lines are short)."""
    url = s3url(bucket, proxy.endpoint)
    base, query = url.split("?", 1)
    lines = [f"storage = {base}"] + [kv.replace("=", " = ", 1) for kv in query.split("&")]
    lines += [f"credentials_file = {creds}", f"profile = {profile}"]
    return "\n".join(lines) + "\n"


def example(sock, job, restore_only=False):
    cmd = [EXAMPLE, "--socket", sock, "--job", job, "--steps", "1", "--size-mb", "2", "--tensors", "3"]
    if restore_only:
        cmd.append("--restore-only")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_tenant_with_its_own_s3_credentials(moto, bucket, tmp_path, proxy):
    creds = tmp_path / "team-s3.aws"
    creds.write_text(f"[other]\naws_access_key_id = nope\naws_secret_access_key = nope\n"
                     f"[team]\naws_access_key_id = {moto.access_key}\naws_secret_access_key = {moto.secret_key}\n")
    sock_s3, sock_fs = tmp_path / "s3.sock", tmp_path / "fs.sock"
    conf = (f"[tenant.team-s3]\nsocket = {sock_s3}\n" + tenant_storage(bucket, proxy, creds, "team") +
            f"[tenant.team-fs]\nsocket = {sock_fs}\n")
    d = Daemon(tmp_path, f"file://{tmp_path / 'store'}", no_aws_env(), conf=conf).start()
    # The tenant's store throttles twice: its retries are the daemon's
    # (ckptd_store_retries_total counts every store's, not only its own).
    proxy.add_rule("PUT", "/runs/team-s3/llama/", ("status", 503, "SlowDown"), count=2)
    example(str(sock_s3), "llama")
    assert proxy.count("PUT", "/runs/team-s3/llama/", 503) == 2
    retried = [l for l in d.ctl("metrics").splitlines() if l.startswith("ckptd_store_retries_total")]
    assert retried and int(retried[0].split()[-1]) >= 2, retried
    assert "verified OK" in example(str(sock_s3), "llama", restore_only=True)
    example(str(sock_fs), "llama")
    # team-s3's step is in the bucket under its prefix; team-fs's on disk.
    ks = keys(moto, bucket)
    assert ks and all(k.startswith("runs/team-s3/llama/step-000000000001/") for k in ks), ks
    assert (tmp_path / "store" / "team-fs" / "llama" / "step-000000000001").is_dir()
    assert not (tmp_path / "store" / "team-s3").exists()
    # Each sees its own; the admin both.
    def ls(sock):
        r = subprocess.run([CKPTCTL, "--socket", str(sock), "--json", "ls"], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout
    assert '"llama"' in ls(sock_s3) and "team-fs" not in ls(sock_s3)
    admin = ls(d.sock)
    assert "team-s3/llama" in admin and "team-fs/llama" in admin, admin
    d.stop()
    log = d.log.read_text()
    assert "credentials_file" in log and moto.secret_key not in log

    # A profile the file does not have: refused at start, naming the file.
    (tmp_path / "b").mkdir()
    d = Daemon(tmp_path / "b", f"file://{tmp_path / 'store'}", no_aws_env(),
               conf=f"[tenant.team-s3]\nsocket = {tmp_path / 'b' / 's3.sock'}\n" +
               tenant_storage(bucket, proxy, creds, "missing"))
    try:
        d.start()
        assert False, "a tenant's storage without its credentials started"
    except RuntimeError as e:
        assert f"credentials_file {creds} [missing]" in str(e), str(e)
