"""ckptd's s3:// backend end to end against moto in IAM mode (every SigV4
signature checked by botocore), through the fault proxy (fault_proxy.py).

The trainer is ckpt-example (C, deterministic data it verifies itself), so
the suite runs in the ASan build too."""
import json
import re
import subprocess
import time

import pytest

from fault_proxy import FaultProxy
from s3util import EXAMPLE, MIB, Daemon, keys, open_uploads, s3env, s3url


def test_save_restore_multipart_and_readback(moto, bucket, tmp_path):
    """16 MiB shards in 5 MiB parts (4 parts), restore from memory and,
    after a restart, from storage; the shard read back with boto3 equals
    the file:// shard byte for byte."""
    d = Daemon(tmp_path, s3url(bucket, moto.endpoint), s3env(moto)).start()
    r = d.example("j", steps=2)
    assert "source: memory" in r.stdout
    status = d.ctl("status")
    assert "credentials: environment" in status
    assert moto.secret_key not in status and moto.secret_key not in d.log.read_text()
    d.stop()
    # Attempts in the names (format 2); step 2, which the restore read,
    # is pinned by its commit object.
    names = [re.sub(r"\.[0-9a-f]{16}\.shard$", ".NONCE.shard", k) for k in keys(moto, bucket)]
    assert names == [
        "runs/j/step-000000000001/rank-00000-of-00001.default.NONCE.shard",
        "runs/j/step-000000000001/rank-00000-of-00001.default.manifest",
        "runs/j/step-000000000002/commit",
        "runs/j/step-000000000002/rank-00000-of-00001.default.NONCE.shard",
        "runs/j/step-000000000002/rank-00000-of-00001.default.manifest"], names
    assert open_uploads(moto, bucket) == []
    log = d.log.read_text()
    assert "part size 5 MiB" in log
    d.start()
    r = d.example("j", steps=2, restore_only=True)
    assert "source: storage" in r.stdout and "verified OK" in r.stdout
    ls = json.loads(d.ctl("--json", "ls"))
    steps = ls["steps"] if isinstance(ls, dict) else ls
    assert [(s["step"], s["complete"]) for s in steps] == [(1, True), (2, True)]
    d.stop()

    fdir = tmp_path / "file"
    fdir.mkdir()
    f = Daemon(fdir, f"file://{fdir}/store", s3env(moto)).start()
    f.example("j", steps=2)
    f.stop()
    key, = [k for k in keys(moto, bucket) if k.startswith("runs/j/step-000000000002/") and k.endswith(".shard")]
    body = moto.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    assert len(body) > 3 * 5 * MIB
    local, = (fdir / "store" / "j" / "step-000000000002").glob("rank-00000-of-00001.*.shard")
    assert body == local.read_bytes()


def test_every_upload_carries_its_crc32c(moto, bucket, tmp_path, proxy):
    """The proxy recomputes each PUT body's CRC32C (parts and single PUTs)
    and rejects a mismatch, as S3 does."""
    proxy.verify_checksums = True
    d = Daemon(tmp_path, s3url(bucket, proxy.endpoint), s3env(moto)).start()
    d.example("crc", steps=1, size_mb=11)
    d.stop()
    assert proxy.count("PUT", "partNumber=3", 200) == 1 and proxy.count("PUT", "partNumber=4") == 0
    # 3 parts, the manifest, the commit the restore wrote, and the storage
    # probe's create-only PUTs at start
    assert proxy.checked == 5 + proxy.count("PUT", ".ckptd-probe/")
    assert proxy.count("PUT", "", 400) == 0
    # Create-only objects go as one conditional PUT, never as a multipart
    # upload, whose completion RGW 16.2 does not make conditional.
    assert proxy.count("PUT", ".manifest", 200) == 1 and proxy.count("POST", ".manifest") == 0
    assert proxy.count("POST", "/commit") == 0


def test_tls_is_verified_and_ca_bundle_works(moto, bucket, tmp_path):
    p = FaultProxy(moto.port, tls_dir=str(tmp_path))
    try:
        d = Daemon(tmp_path, s3url(bucket, p.endpoint), s3env(moto)).start()
        r = d.example("tls", steps=1, size_mb=2, check=False)
        assert r.returncode != 0 and "certificate" in r.stderr, r.stderr
        d.stop()
        d.url = s3url(bucket, p.endpoint, ca_bundle=p.ca_file)
        d.start()
        d.example("tls", steps=1, size_mb=2)
        d.stop()
        assert len(keys(moto, bucket)) == 3  # shard, manifest, commit (the restore pinned it)
        # No ca_bundle in the URL: $SSL_CERT_FILE names the bundle (as on a
        # system whose bundle is not where the wheel's libcurl looks).
        d.url = s3url(bucket, p.endpoint)
        d.env = dict(d.env, SSL_CERT_FILE=p.ca_file)
        d.start()
        d.example("tls2", steps=1, size_mb=2)
        d.stop()
    finally:
        p.stop()


def test_ls_paginates_and_rm_deletes(moto, bucket, tmp_path):
    d = Daemon(tmp_path, s3url(bucket, moto.endpoint, list_page="1"), s3env(moto)).start()
    d.example("p", steps=3, size_mb=2)
    out = d.ctl("ls", "p")
    assert out.count(" yes ") == 3, out
    d.ctl("rm", "p", "1")
    assert not any("step-000000000001" in k for k in keys(moto, bucket))
    assert sum("step-000000000002" in k for k in keys(moto, bucket)) == 2
    d.stop()


def test_options_from_the_config_file(moto, bucket, tmp_path):
    conf = (f"[storage]\nendpoint = {moto.endpoint}\nregion = us-east-1\npath_style = 1\npart_size = 6M\n"
            "concurrency = 2\n")
    d = Daemon(tmp_path, f"s3://{bucket}/cfg", s3env(moto), conf=conf).start()
    d.example("o", steps=1, size_mb=13)
    d.stop()
    assert "part size 6 MiB, 2 connections" in d.log.read_text()
    assert len(keys(moto, bucket, "cfg/o/")) == 3  # shard, manifest, commit


def test_bad_option_is_a_clear_start_error(moto, bucket, tmp_path):
    with pytest.raises(RuntimeError, match="part_size must be 5M..5G"):
        Daemon(tmp_path, s3url(bucket, moto.endpoint, part_size="1M"), s3env(moto)).start()


def test_wrong_secret_fails_with_the_servers_error(moto, bucket, tmp_path):
    d = Daemon(tmp_path, s3url(bucket, moto.endpoint), s3env(moto, AWS_SECRET_ACCESS_KEY="wrong")).start()
    r = d.example("w", steps=1, size_mb=2, check=False)
    assert r.returncode != 0
    # the server's own error, whatever it calls it (RGW 16.2: AccessDenied)
    code = "AccessDenied" if moto.name == "rgw" else "SignatureDoesNotMatch"
    assert f"HTTP 403 {code}" in r.stderr, r.stderr
    d.stop()
    assert keys(moto, bucket) == [] and open_uploads(moto, bucket) == []


def test_shared_credentials_file(moto, bucket, tmp_path):
    cred = tmp_path / "credentials"
    cred.write_text(f"[other]\naws_access_key_id = nope\naws_secret_access_key = nope\n\n"
                    f"[ckpt]\naws_access_key_id = {moto.access_key}\naws_secret_access_key = {moto.secret_key}\n")
    env = s3env(moto, AWS_SHARED_CREDENTIALS_FILE=str(cred), AWS_PROFILE="ckpt")
    del env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
    d = Daemon(tmp_path, s3url(bucket, moto.endpoint), env).start()
    d.example("c", steps=1, size_mb=2)
    assert f"credentials: shared file {cred} [ckpt]" in d.ctl("status")
    d.stop()


def test_no_credentials_is_a_clear_start_error(moto, bucket, tmp_path):
    env = s3env(moto, AWS_EC2_METADATA_SERVICE_ENDPOINT="http://127.0.0.1:9")
    del env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
    d = Daemon(tmp_path, s3url(bucket, moto.endpoint), env)
    with pytest.raises(RuntimeError, match="no AWS credentials"):
        d.start()


def test_503_and_resets_are_retried(moto, bucket, tmp_path, proxy):
    proxy.add_rule("PUT", "partNumber=2", ("status", 503, "SlowDown"), count=2)
    proxy.add_rule("PUT", "partNumber=3", ("reset", 100000), count=1)
    proxy.add_rule("POST", "uploadId=", ("status", 500, "InternalError"), count=1)
    proxy.add_rule("PUT", "partNumber=1", ("status", 429, "TooManyRequests"), count=1)
    proxy.add_rule("PUT", "partNumber=4", ("delay", 1.0), count=1)
    proxy.add_rule("GET", "list-type=2", ("status", 504, "GatewayTimeout"), count=1)
    d = Daemon(tmp_path, s3url(bucket, proxy.endpoint), s3env(moto)).start()
    d.example("r", steps=1)
    assert proxy.count("PUT", "partNumber=2", 503) == 2
    assert proxy.count("PUT", "partNumber=3", "reset") == 1
    assert proxy.count("PUT", "partNumber=2", 200) == 1
    assert proxy.count("POST", "uploadId=", 500) == 1
    assert proxy.count("PUT", "partNumber=1", 429) == 1 and proxy.count("GET", "list-type=2", 504) == 1
    assert proxy.count("PUT", "partNumber=4", 200) == 1  # the slow one was not retried
    assert proxy.open_uploads == {} and open_uploads(moto, bucket) == []
    d.stop()
    proxy.add_rule("GET", ".shard", ("status", 503, "SlowDown"), count=2)
    d.start()
    r = d.example("r", steps=1, restore_only=True)
    assert "source: storage" in r.stdout
    metrics = d.ctl("metrics")
    retried = [l for l in metrics.splitlines() if l.startswith("ckptd_store_retries_total")]
    assert retried and int(retried[0].split()[-1]) >= 2, metrics
    d.stop()


def test_persistent_403_fails_and_aborts(moto, bucket, tmp_path, proxy):
    proxy.add_rule("PUT", "partNumber=3", ("status", 403, "AccessDenied"), count=-1)
    d = Daemon(tmp_path, s3url(bucket, proxy.endpoint), s3env(moto)).start()
    r = d.example("x", steps=1, check=False)
    assert r.returncode != 0
    assert "HTTP 403 AccessDenied: injected by the fault proxy" in r.stderr, r.stderr
    assert proxy.count("PUT", "partNumber=3", 403) == 1  # not retried
    d.stop()
    assert proxy.open_uploads == {}, proxy.open_uploads
    assert open_uploads(moto, bucket) == []
    assert not any(k.endswith(".manifest") for k in keys(moto, bucket))


def test_sigkill_mid_upload_aborts_after_restart(moto, bucket, tmp_path, proxy):
    d = Daemon(tmp_path, s3url(bucket, proxy.endpoint), s3env(moto), conf="[debug]\nstore_delay_ms = 30000\n").start()
    p = subprocess.Popen([EXAMPLE, "--socket", d.sock, "--job", "k", "--steps", "1", "--size-mb", "16",
                          "--tensors", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for _ in range(300):
        if proxy.count("PUT", "partNumber=4", 200):
            break
        time.sleep(0.05)
    assert len(open_uploads(moto, bucket)) == 1
    d.kill()
    p.kill()
    p.wait()
    d.conf.write_text("")
    d.start()
    status = d.ctl("status")
    assert open_uploads(moto, bucket) == []
    assert proxy.open_uploads == {}
    # The journal had the upload id: aborted by id at start.
    assert "multipart upload" in status and re.search(r"rank-00000-of-00001\.[^ ]*\.shard \(aborted\)", status), status
    assert not any(k.endswith(".manifest") for k in keys(moto, bucket))
    d.stop()


def test_failed_abort_is_retried_at_the_next_start(moto, bucket, tmp_path, proxy):
    """A crash leaves an upload open; the first restart cannot abort it
    (DELETE gets 500 every time), so the journal keeps its id; the next
    restart aborts it."""
    d = Daemon(tmp_path, s3url(bucket, proxy.endpoint, retry_max_attempts="2"), s3env(moto),
               conf="[debug]\nstore_delay_ms = 30000\n").start()
    p = subprocess.Popen([EXAMPLE, "--socket", d.sock, "--job", "a", "--steps", "1", "--size-mb", "16",
                          "--tensors", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for _ in range(300):
        if proxy.count("PUT", "partNumber=4", 200):
            break
        time.sleep(0.05)
    d.kill()
    p.kill()
    p.wait()
    d.conf.write_text("")
    proxy.add_rule("DELETE", "uploadId=", ("status", 500, "InternalError"), count=-1)
    d.start()
    assert "(aborted)" not in d.ctl("status")
    d.stop()
    assert len(open_uploads(moto, bucket)) == 1
    proxy.clear()
    d.start()
    assert "(aborted)" in d.ctl("status")
    d.stop()
    assert open_uploads(moto, bucket) == []


def test_lost_complete_answer(moto, bucket, tmp_path, proxy):
    """CompleteMultipartUpload takes effect but its answer is lost: the
    retry gets NoSuchUpload, and ckptd finds the object whole (HEAD)."""
    proxy.add_rule("POST", "uploadId=", ("lose_answer",), count=1)
    # moto would answer a repeated Complete with 200; GCS and MinIO say:
    proxy.add_rule("POST", "uploadId=", ("status", 404, "NoSuchUpload"), count=1)
    d = Daemon(tmp_path, s3url(bucket, proxy.endpoint), s3env(moto)).start()
    d.example("l", steps=1)
    d.stop()
    assert proxy.count("POST", "uploadId=", "lost") == 1
    assert proxy.count("POST", "uploadId=", 404) == 1
    assert "answered NoSuchUpload, but the object is there" in d.log.read_text()
    assert len(keys(moto, bucket, "runs/l/")) == 3 and open_uploads(moto, bucket) == []
