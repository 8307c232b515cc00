"""Compression on upload against an object store (docs/format.md "Pieces"):
the shard object holds the pieces' stored bytes, smaller than the raw
shard, uploaded as one object (multipart where it is large enough); a
fresh daemon with compression off restores it bit-exact from storage; a
flipped byte in the object fails the load loudly, and the step restores
again once the object is put back. The integration suite checks the
same on file:// (compress)."""
import re

from s3util import Daemon, keys, s3env, s3url

COMPRESS = "[pool]\ncompress = true\n"


def test_compressed_shard_round_trip_and_damage(moto, bucket, tmp_path, proxy):
    url, env = s3url(bucket, proxy.endpoint), s3env(moto)
    (tmp_path / "a").mkdir()
    d = Daemon(tmp_path / "a", url, env, conf=COMPRESS).start()
    # 12 MiB in 3 tensors: parts of 5 MiB and more (the URL's part_size),
    # pieces across 1 MiB pool chunks.
    d.example("cz", steps=1, size_mb=12)
    d.stop()
    shard, = [k for k in keys(moto, bucket) if k.endswith(".shard")]
    c = moto.client()
    good = c.get_object(Bucket=bucket, Key=shard)["Body"].read()
    raw = 12 << 20
    # ckpt-example's floats are whole numbers below 2**24: their exponent
    # plane is a handful of values.
    assert len(good) < raw * 0.9, (len(good), raw)

    (tmp_path / "b").mkdir()
    d = Daemon(tmp_path / "b", url, env).start()
    r = d.example("cz", steps=1, size_mb=12, restore_only=True)
    assert "verified OK" in r.stdout

    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x40
    c.put_object(Bucket=bucket, Key=shard, Body=bytes(bad))
    (tmp_path / "c").mkdir()
    d2 = Daemon(tmp_path / "c", url, env).start()
    r = d2.example("cz", steps=1, size_mb=12, restore_only=True, check=False)
    assert r.returncode != 0, r.stdout
    assert re.search(r"(checksum mismatch in tensor|does not decode)", r.stderr), r.stderr
    assert "verified OK" not in r.stdout
    c.put_object(Bucket=bucket, Key=shard, Body=good)
    r = d2.example("cz", steps=1, size_mb=12, restore_only=True)
    assert "verified OK" in r.stdout
    d2.stop()
    d.stop()
