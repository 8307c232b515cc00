import os
import sys
import uuid

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moto_harness import Moto  # noqa: E402
import rgw_harness  # noqa: E402
from fault_proxy import FaultProxy  # noqa: E402
from s3util import Daemon  # noqa: E402


@pytest.fixture(scope="session", params=["moto", "rgw"])
def moto(request, tmp_path_factory):
    """The S3 server a test talks to: every test that takes it runs
    against moto (in IAM mode) and against a real one, Ceph RGW
    (rgw_harness.py). Named moto for history."""
    if request.param == "rgw":
        why = rgw_harness.available()
        if why:
            pytest.skip(f"RGW: {why}")
        m = rgw_harness.Rgw(str(tmp_path_factory.mktemp("rgw")))
    else:
        m = Moto(str(tmp_path_factory.mktemp("moto")))
    yield m
    m.stop()


@pytest.fixture(scope="session")
def moto_plain(tmp_path_factory):
    """A second moto without IAM mode: the gs:// peer behind the fault proxy,
    which checks the OAuth bearer token itself."""
    m = Moto(str(tmp_path_factory.mktemp("moto-plain")), iam=False)
    yield m
    m.stop()


@pytest.fixture
def bucket(moto):
    name = "ckpt-" + uuid.uuid4().hex[:12]
    moto.client().create_bucket(Bucket=name)
    return name


@pytest.fixture
def proxy(moto):
    p = FaultProxy(moto.port)
    yield p
    p.stop()


@pytest.fixture(autouse=True)
def no_daemon_left():
    yield
    while Daemon.live:
        d = Daemon.live.pop()
        if d.proc and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
