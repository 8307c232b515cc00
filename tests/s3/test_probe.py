"""The storage probe (daemon/store/probe.c): at start, and with
`ckptd --probe-storage`, ckptd asks the store, under a prefix of its own and
in a constant number of requests, whether it refuses a create-only write of
an existing object, honours byte ranges and pages its listings. A store that
ignores create-only writes (the fault proxy turning the server's 412 into a
200, as such stores answer) is refused at start, naming the check and the
guarantee, unless [storage] allow_unconditional accepts the loss. A store
that cannot be asked does not stop the start. Against moto and RGW."""
import subprocess

import pytest
from s3util import CKPTD, Daemon, keys, s3env, s3url


def probe(url, env):
    return subprocess.run([CKPTD, "--storage", url, "--probe-storage"], env=env, capture_output=True, text=True,
                          timeout=120)


def test_probe_passes_in_a_dozen_requests_and_leaves_nothing(moto, bucket, tmp_path, proxy):
    url = s3url(bucket, proxy.endpoint)
    r = probe(url, s3env(moto))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok: create-only PUT of an existing object refused; ranged GET gave its bytes; " \
           "a listing one name a page gave all 3 names" in r.stdout, r.stdout
    assert keys(moto, bucket) == []
    # 4 create-only PUTs (the refused one read back once: was it ours?),
    # 1 ranged GET, 3 LIST pages, 3 HEAD + DELETE: 15, whatever the job
    assert 12 <= len(proxy.log) <= 16, proxy.log
    assert proxy.count("PUT", ".ckptd-probe/", 412) == 1
    proxy.clear()
    d = Daemon(tmp_path, url, s3env(moto)).start()
    assert "storage probe: create-only PUT of an existing object refused" in d.log.read_text()
    d.example("p", steps=1, size_mb=2)
    d.stop()
    assert not [k for k in keys(moto, bucket) if ".ckptd-probe" in k]


def test_store_ignoring_create_only_writes_is_refused(moto, bucket, tmp_path, proxy):
    proxy.ignore_conditional = True
    url = s3url(bucket, proxy.endpoint)
    r = probe(url, s3env(moto))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAILED: the store accepted a create-only write" in r.stdout
    assert "left the old bytes (it only said it wrote)" in r.stdout
    assert "a complete step can be overwritten" in r.stdout
    with pytest.raises(RuntimeError, match="refused by the storage probe: .*FAILED: the store accepted a create-only"):
        Daemon(tmp_path, url, s3env(moto)).start()
    assert keys(moto, bucket) == []
    # Accepted outright: it starts, saying what is lost, and saves.
    d = Daemon(tmp_path, url, s3env(moto), conf="[storage]\nallow_unconditional = true\n").start()
    assert "allow_unconditional: starting on a store that ignores create-only writes" in d.log.read_text()
    d.example("u", steps=1, size_mb=2)
    d.stop()


def test_store_that_cannot_be_asked_does_not_stop_the_start(moto, bucket, tmp_path):
    url = s3url(bucket, "http://127.0.0.1:9", retry_max_attempts="1")
    r = probe(url, s3env(moto))
    assert r.returncode == 1 and "could not be asked" in r.stdout, r.stdout + r.stderr
    d = Daemon(tmp_path, url, s3env(moto)).start()
    assert "storage probe could not ask the store" in d.log.read_text()
    d.stop()
