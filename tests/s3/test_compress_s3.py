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


def test_incremental_steps_on_s3(moto, bucket, tmp_path, proxy):
    """Incremental steps against the object store: two frozen tensors of
    three are stored once, later steps refer to step 1's shard (the refs
    names in the bucket), retention (keep_last 1) keeps step 1 for step 3
    and drops step 2, and a fresh daemon restores step 3 bit-exact
    through the references."""
    url, env = s3url(bucket, proxy.endpoint), s3env(moto)
    conf = "[pool]\nincremental = true\ncompress = true\n[job.inc]\nkeep_last = 1\n"
    (tmp_path / "a").mkdir()
    d = Daemon(tmp_path / "a", url, env, conf=conf).start()
    cmd_frozen = ["--frozen", "2"]
    r = d.example("inc", steps=3, size_mb=12, extra=cmd_frozen)
    assert "verified OK" in r.stdout
    d.ctl("gc", "inc")  # what retention's pass after step 3 does, now
    d.stop()
    ks = keys(moto, bucket)
    assert any("/inc/refs/step-000000000003/step-000000000001/rank-00000-of-00001." in k for k in ks), ks
    manifests = sorted(k for k in ks if k.endswith(".manifest"))
    assert [m.split("/")[-2] for m in manifests] == ["step-000000000001", "step-000000000003"], manifests
    c = moto.client()
    sizes = {k.split("/")[-2]: c.head_object(Bucket=bucket, Key=k)["ContentLength"]
             for k in ks if k.endswith(".shard")}
    # Step 3 stores one tensor of three (4 MiB, compressed), step 1 all.
    assert sizes["step-000000000003"] * 2 < sizes["step-000000000001"], sizes
    (tmp_path / "b").mkdir()
    d = Daemon(tmp_path / "b", url, env).start()
    r = d.example("inc", steps=3, size_mb=12, restore_only=True, extra=cmd_frozen)
    assert "verified OK" in r.stdout
    d.stop()
