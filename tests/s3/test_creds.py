"""Each credential source of the chain (creds.h), and gs:// end to end:
GCS metadata-server tokens, a service-account key (RS256 JWT verified by
the fake token endpoint), HMAC keys through SigV4; AWS web identity (STS)
and IMDSv2. Tokens are cached and refreshed before they expire."""
import os
import urllib.parse
import uuid

import boto3
import pytest

from fake_metadata import FakeMetadata
from fault_proxy import FaultProxy
from s3util import Daemon, keys, open_uploads, s3url

NOWHERE = "http://127.0.0.1:9"  # nothing listens on the discard port


def base_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "GCE_", "GOOGLE_", "GCS_"))}
    env.update(HOME="/nonexistent", AWS_EC2_METADATA_SERVICE_ENDPOINT=NOWHERE)
    env.update(extra)
    return env


def gs_url(bucket, endpoint, **opts):
    return s3url(bucket, endpoint, **opts).replace("s3://", "gs://", 1).replace("&region=us-east-1", "")


@pytest.fixture
def plain_bucket(moto_plain):
    name = "gcs-" + uuid.uuid4().hex[:12]
    moto_plain.client().create_bucket(Bucket=name)
    return name


@pytest.fixture
def meta():
    """The fake metadata server; an AWS test gives it the S3 server's role
    credentials (aws_meta), so the GCS tests do not run once per server."""
    f = FakeMetadata()
    yield f
    f.stop()


@pytest.fixture
def aws_meta(meta, moto):
    meta.aws_creds = moto.role_credentials
    return meta


@pytest.fixture
def gcs_proxy(moto_plain, meta):
    p = FaultProxy(moto_plain.port, gcs_token=meta.valid)
    p.verify_checksums = True
    yield p
    p.stop()


def plain_client(moto_plain):
    return boto3.client("s3", endpoint_url=moto_plain.endpoint, region_name="us-east-1",
                        aws_access_key_id="x", aws_secret_access_key="x")


def test_gcs_metadata_token_multipart(moto_plain, plain_bucket, meta, gcs_proxy, tmp_path):
    env = base_env(GCE_METADATA_HOST=meta.host)
    d = Daemon(tmp_path, gs_url(plain_bucket, gcs_proxy.endpoint), env).start()
    d.example("g", steps=2)
    assert f"credentials: metadata server {meta.host}" in d.ctl("status")
    d.stop()
    # Parts and objects went with x-goog-hash (checked against the bodies),
    # never an x-amz-* header, always with an issued bearer token.
    assert gcs_proxy.count("PUT", "partNumber=4", 200) == 2
    assert gcs_proxy.count("PUT", "", 400) == 0 and gcs_proxy.count("GET", "", 401) == 0
    assert gcs_proxy.checked >= 10
    assert all("x-goog-hash" in h for m, p, h in gcs_proxy.seen_headers if m == "PUT")
    assert meta.counts["gce"] == 1  # cached: one token for every request
    assert gcs_proxy.open_uploads == {}
    assert not plain_client(moto_plain).list_multipart_uploads(Bucket=plain_bucket).get("Uploads")
    d.start()
    r = d.example("g", steps=2, restore_only=True)
    assert "source: storage" in r.stdout
    d.stop()


def test_gcs_incremental_and_compressed_steps(moto_plain, plain_bucket, meta, gcs_proxy, tmp_path):
    """gs:// with incremental steps and compression (test_compress_s3.py
    does the same on S3): later steps refer to step 1's shard through the
    refs names, retention keeps step 1 for step 3, every PUT carries an
    x-goog-hash the fake checked against the (compressed) body, and a
    fresh daemon restores step 3 bit-exact through the references."""
    env = base_env(GCE_METADATA_HOST=meta.host)
    url = gs_url(plain_bucket, gcs_proxy.endpoint)
    conf = "[pool]\nincremental = true\ncompress = true\n[job.inc]\nkeep_last = 1\n"
    (tmp_path / "a").mkdir()
    d = Daemon(tmp_path / "a", url, env, conf=conf).start()
    r = d.example("inc", steps=3, size_mb=12, extra=["--frozen", "2"])
    assert "verified OK" in r.stdout
    d.ctl("gc", "inc")
    d.stop()
    ks = keys(moto_plain, plain_bucket)
    assert any("/inc/refs/step-000000000003/step-000000000001/rank-00000-of-00001." in k for k in ks), ks
    assert sorted(k.split("/")[-2] for k in ks if k.endswith(".manifest")) == \
        ["step-000000000001", "step-000000000003"], ks
    c = plain_client(moto_plain)
    sizes = {k.split("/")[-2]: c.head_object(Bucket=plain_bucket, Key=k)["ContentLength"]
             for k in ks if k.endswith(".shard")}
    assert sizes["step-000000000003"] * 2 < sizes["step-000000000001"], sizes
    assert all("x-goog-hash" in h for m, p, h in gcs_proxy.seen_headers if m == "PUT")
    assert gcs_proxy.checked >= 4
    (tmp_path / "b").mkdir()
    d = Daemon(tmp_path / "b", url, env).start()
    r = d.example("inc", steps=3, size_mb=12, restore_only=True, extra=["--frozen", "2"])
    assert "verified OK" in r.stdout
    d.stop()


def test_gcs_token_refreshed_before_expiry(moto_plain, plain_bucket, meta, gcs_proxy, tmp_path):
    meta.expires_in = 60  # inside the 5-minute margin: every use refreshes
    env = base_env(GCE_METADATA_HOST=meta.host)
    d = Daemon(tmp_path, gs_url(plain_bucket, gcs_proxy.endpoint), env).start()
    d.example("t", steps=2, size_mb=2)
    d.stop()
    assert meta.counts["gce"] > 2


def test_gcs_service_account_jwt(moto_plain, plain_bucket, meta, gcs_proxy, tmp_path):
    sa = tmp_path / "sa.json"
    email = meta.sa_json(str(sa))
    env = base_env(GOOGLE_APPLICATION_CREDENTIALS=str(sa))
    d = Daemon(tmp_path, gs_url(plain_bucket, gcs_proxy.endpoint), env).start()
    d.example("s", steps=1, size_mb=2)
    status = d.ctl("status")
    assert f"credentials: service account {email}" in status
    assert "PRIVATE KEY" not in status and "PRIVATE KEY" not in d.log.read_text()
    d.stop()
    assert meta.counts["jwt"] == 1 and meta.jwt_claims[0]["iss"] == email


def test_gcs_bad_service_account_key_is_refused(meta, tmp_path, plain_bucket, gcs_proxy):
    other = FakeMetadata()
    sa = tmp_path / "sa.json"
    other.sa_json(str(sa))  # signed with a key meta does not know
    other.stop()
    import json
    j = json.loads(sa.read_text())
    j["token_uri"] = meta.url + "/token"
    sa.write_text(json.dumps(j))
    d = Daemon(tmp_path, gs_url(plain_bucket, gcs_proxy.endpoint), base_env(GOOGLE_APPLICATION_CREDENTIALS=str(sa)))
    with pytest.raises(RuntimeError, match="token exchange at .* refused"):
        d.start()


def exists(moto, path):
    bucket, _, key = urllib.parse.unquote(path).lstrip("/").partition("/")
    try:
        moto.client().head_object(Bucket=bucket, Key=key)
        return True
    except Exception:
        return False


def test_gcs_hmac_keys_sigv4(moto, bucket, tmp_path):
    # HMAC keys sign with SigV4: moto in IAM mode checks them; the proxy
    # refuses any AWS checksum header on the way, and answers GCS's
    # create-only PUT as GCS does (moto ignores it: the storage probe at
    # start would refuse the store).
    p = FaultProxy(moto.port, forbid_amz_checksum=True)
    p.verify_checksums = True
    p.object_exists = lambda path, host: exists(moto, path)
    try:
        env = base_env(GCS_HMAC_ACCESS_KEY_ID=moto.access_key, GCS_HMAC_SECRET=moto.secret_key)
        d = Daemon(tmp_path, gs_url(bucket, p.endpoint) + "&region=us-east-1", env).start()
        d.example("h", steps=1)
        assert "credentials: HMAC key" in d.ctl("status")
        d.stop()
        assert p.count("PUT", "partNumber=4", 200) == 1 and p.count("PUT", "", 400) == 0
        assert open_uploads(moto, bucket) == []
    finally:
        p.stop()


def test_aws_web_identity(moto, bucket, aws_meta, tmp_path):
    meta = aws_meta
    tok = tmp_path / "token"
    tok.write_text(meta.web_identity_token + "\n")
    env = base_env(AWS_WEB_IDENTITY_TOKEN_FILE=str(tok), AWS_ROLE_ARN="arn:aws:iam::123456789012:role/ckpt",
                   AWS_ENDPOINT_URL_STS=meta.url + "/")
    d = Daemon(tmp_path, s3url(bucket, moto.endpoint), env).start()
    d.example("w", steps=1, size_mb=2)
    assert "credentials: web identity (arn:aws:iam::123456789012:role/ckpt)" in d.ctl("status")
    d.stop()
    assert meta.counts["sts"] == 1
    assert len(keys(moto, bucket)) == 3  # shard, manifest, commit (the restore pinned it)


def test_aws_web_identity_wrong_token_fails_at_start(meta, bucket, moto, tmp_path):
    tok = tmp_path / "token"
    tok.write_text("not-the-token")
    env = base_env(AWS_WEB_IDENTITY_TOKEN_FILE=str(tok), AWS_ROLE_ARN="arn:aws:iam::1:role/x",
                   AWS_ENDPOINT_URL_STS=meta.url + "/")
    with pytest.raises(RuntimeError, match="AssumeRoleWithWebIdentity .* refused \\(HTTP 403\\)"):
        Daemon(tmp_path, s3url(bucket, moto.endpoint), env).start()


def test_aws_imdsv2(moto, bucket, aws_meta, tmp_path):
    meta = aws_meta
    env = base_env(AWS_EC2_METADATA_SERVICE_ENDPOINT=meta.url)
    d = Daemon(tmp_path, s3url(bucket, moto.endpoint), env).start()
    d.example("i", steps=1, size_mb=2)
    assert "credentials: IMDSv2 role ckpt-role" in d.ctl("status")
    d.stop()
    assert meta.counts["imds"] == 1


def test_gcs_manifests_are_create_only(moto_plain, plain_bucket, meta, gcs_proxy, tmp_path):
    """Manifests and commits go with x-goog-if-generation-match: 0 (GCS's
    create-only; XML multipart takes no precondition, so they are single
    PUTs), never If-None-Match; a second save of the same rank and attempt
    gets 412 and fails with EEXIST, leaving the first intact."""
    env = base_env(GCE_METADATA_HOST=meta.host)
    d = Daemon(tmp_path, gs_url(plain_bucket, gcs_proxy.endpoint), env).start()
    d.example("c", steps=1, size_mb=2)
    puts = [(p, h) for m, p, h in gcs_proxy.seen_headers if m == "PUT"]
    made = [p for p, h in puts if h.get("x-goog-if-generation-match") == "0"]
    assert any(p.split("?")[0].endswith(".manifest") for p in made), puts
    assert any(p.split("?")[0].endswith("/commit") for p in made), puts
    assert not any(p.split("?")[0].endswith(".shard") for p in made)
    client = plain_client(moto_plain)
    commit, = [k for k in keys_of(client, plain_bucket) if k.endswith("/commit")]
    client.delete_object(Bucket=plain_bucket, Key=commit)
    before = keys_of(client, plain_bucket)
    r = d.example("c", steps=1, size_mb=2, check=False)
    assert r.returncode != 0 and "already saved by rank 0 in attempt 'default'" in r.stderr, r.stderr
    assert gcs_proxy.count("PUT", ".manifest", 412) == 1
    d.stop()
    # The failed save's own shard went again; nothing else changed.
    assert keys_of(client, plain_bucket) == before


def keys_of(client, bucket):
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", []))
