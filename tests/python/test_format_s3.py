"""ckpt.format reads a step straight from s3:// (boto3), without the daemon:
a Checkpointer save through a ckptd with s3:// storage on moto (IAM mode),
then load_step and list_steps from the bucket."""
import os
import sys
import tempfile

import pytest
import torch

import ckpt.format
import ckpt.torch
from conftest import Daemon

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "s3"))
moto_harness = pytest.importorskip("moto_harness")


@pytest.fixture(params=["step", "spread"])
def s3daemon(monkeypatch, request):
    tmp = tempfile.mkdtemp(prefix="ckpt-py-s3-")
    m = moto_harness.Moto(tmp)
    m.client().create_bucket(Bucket="pyfmt")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", m.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", m.secret_key)
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:9")
    d = Daemon(tmp, conf=f"[storage]\nlayout = {request.param}\n")
    d.layout = request.param
    d.url = f"s3://pyfmt/ck?endpoint={m.endpoint}&region=us-east-1&path_style=1&part_size=5M"
    d.moto = m
    d.start()
    yield d
    d.stop()
    m.stop()


def boto3_keys(d):
    return d.moto.client().list_objects_v2(Bucket="pyfmt").get("Contents", [])


def test_load_step_from_s3(s3daemon):
    torch.manual_seed(0)
    sd = {"w": torch.randn(1500, 1024), "b": torch.arange(10, dtype=torch.int64), "note": "s3"}
    with ckpt.torch.Checkpointer("fs3", socket=s3daemon.sock) as cp:
        cp.save(sd, 3).durable.result(60)
        w3 = sd["w"].clone()
        sd["w"].add_(1)
        cp.save(sd, 4).durable.result(60)
    s3daemon.stop()  # no daemon needed
    spread = [k["Key"] for k in boto3_keys(s3daemon) if "/shards/" in k["Key"]]
    assert len(spread) == (2 if s3daemon.layout == "spread" else 0), spread
    assert ckpt.format.list_steps(s3daemon.url, "fs3") == [(3, True), (4, True)]
    got = ckpt.format.load_step(s3daemon.url, "fs3")
    assert torch.equal(got["w"], sd["w"]) and torch.equal(got["b"], sd["b"]) and got["note"] == "s3"
    old = ckpt.format.load_step(s3daemon.url, "fs3", step=3)
    assert torch.equal(old["w"], w3)
    # The same objects through gs:// (GCS's XML API, an HMAC key): moto
    # stands in for storage.googleapis.com.
    gs = s3daemon.url.replace("s3://", "gs://", 1)
    with pytest.raises(ValueError, match="GCS_HMAC_ACCESS_KEY_ID"):
        ckpt.format.load_step(gs, "fs3")
    os.environ["GCS_HMAC_ACCESS_KEY_ID"], os.environ["GCS_HMAC_SECRET"] = s3daemon.moto.access_key, \
        s3daemon.moto.secret_key
    try:
        assert ckpt.format.list_steps(gs, "fs3") == [(3, True), (4, True)]
        got = ckpt.format.load_step(gs, "fs3", verify=True)
        assert torch.equal(got["w"], sd["w"])
    finally:
        del os.environ["GCS_HMAC_ACCESS_KEY_ID"], os.environ["GCS_HMAC_SECRET"]
    with pytest.raises(FileNotFoundError):
        ckpt.format.load_step(s3daemon.url, "nosuchjob")
