"""A shard changed in storage after it was written (bit rot, a hostile
writer) is never restored: the load fails with the checksum mismatch,
naming the tensor and the object, and the step still reads as it was
once the object is put back. The integration suite checks the same on
file:// (data_path); this is the object-store side, through a fresh
daemon, so the bytes can only come from storage."""
import re

from s3util import Daemon, keys, s3env, s3url


def test_flipped_byte_in_a_shard_fails_the_load(moto, bucket, tmp_path, proxy):
    url, env = s3url(bucket, proxy.endpoint), s3env(moto)
    (tmp_path / "a").mkdir()
    d = Daemon(tmp_path / "a", url, env).start()
    d.example("rot", steps=1, size_mb=2)
    d.stop()
    shard, = [k for k in keys(moto, bucket) if k.endswith(".shard")]
    c = moto.client()
    good = c.get_object(Bucket=bucket, Key=shard)["Body"].read()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x40
    c.put_object(Bucket=bucket, Key=shard, Body=bytes(bad))

    (tmp_path / "b").mkdir()
    d = Daemon(tmp_path / "b", url, env).start()
    r = d.example("rot", steps=1, size_mb=2, restore_only=True, check=False)
    assert r.returncode != 0, r.stdout
    assert re.search(r"checksum mismatch in tensor '[^']+' of rot/step-000000000001/rank-00000-of-00001\.", r.stderr), \
        r.stderr
    assert "verified OK" not in r.stdout
    # The same bytes back: the step restores again.
    c.put_object(Bucket=bucket, Key=shard, Body=good)
    r = d.example("rot", steps=1, size_mb=2, restore_only=True)
    assert "verified OK" in r.stdout
    d.stop()
