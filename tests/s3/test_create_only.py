"""Create-only writes against moto (If-None-Match: * on PutObject, which
moto 5 honours with 412): what keeps a complete step and a rank's own
manifest from being overwritten, on any node, without reading any other
rank's manifest."""
import re

from s3util import Daemon, keys, s3env, s3url


def test_second_save_of_a_rank_is_refused(moto, bucket, tmp_path, proxy):
    d = Daemon(tmp_path, s3url(bucket, proxy.endpoint), s3env(moto)).start()
    d.example("o", steps=1, size_mb=2)
    first = keys(moto, bucket)
    # The restore pinned step 1: a save into it is refused on its commit.
    r = d.example("o", steps=1, size_mb=2, check=False)
    assert r.returncode != 0 and "is already complete (attempt 'default'" in r.stderr, r.stderr
    assert keys(moto, bucket) == first
    # Without the commit, the manifest's create-only PUT refuses it.
    commit, = [k for k in first if k.endswith("/commit")]
    moto.client().delete_object(Bucket=bucket, Key=commit)
    r = d.example("o", steps=1, size_mb=2, check=False)
    assert r.returncode != 0 and "already saved by rank 0 in attempt 'default'" in r.stderr, r.stderr
    assert proxy.count("PUT", ".manifest", 412) == 1
    assert all(h.get("if-none-match") == "*" for m, p, h in proxy.seen_headers
               if m == "PUT" and p.split("?")[0].endswith(".manifest"))
    d.stop()
    # The refused save removed its own shard: only the first remain.
    assert keys(moto, bucket) == [k for k in first if k != commit]


def test_lost_answer_to_a_create_only_put(moto, bucket, tmp_path, proxy):
    """The manifest's PUT takes effect but its answer is lost: the retry
    meets 412, ckptd finds its own bytes there, and the save is durable."""
    proxy.add_rule("PUT", ".manifest", ("lose_answer",), count=1)
    d = Daemon(tmp_path, s3url(bucket, proxy.endpoint), s3env(moto)).start()
    r = d.example("l", steps=1, size_mb=2)
    assert "verified OK" in r.stdout
    d.stop()
    assert proxy.count("PUT", ".manifest", "lost") == 1
    assert proxy.count("PUT", ".manifest", 412) == 1
    assert "met its own earlier attempt" in d.log.read_text()
    names = [re.sub(r"[0-9a-f]{16}", "N", k) for k in keys(moto, bucket)]
    assert names == ["runs/l/step-000000000001/commit", "runs/l/step-000000000001/rank-00000-of-00001.default.N.shard",
                     "runs/l/step-000000000001/rank-00000-of-00001.default.manifest"]


def test_conditional_request_conflict_is_retried(moto, bucket, tmp_path, proxy):
    """S3 answers a conditional PUT that raced another write of its key
    with 409 ConditionalRequestConflict and says to retry: the manifest's
    create-only PUT is retried and the save is durable."""
    proxy.add_rule("PUT", ".manifest", ("status", 409, "ConditionalRequestConflict"), count=1)
    d = Daemon(tmp_path, s3url(bucket, proxy.endpoint), s3env(moto)).start()
    r = d.example("c", steps=1, size_mb=2)
    assert "verified OK" in r.stdout
    d.stop()
    assert proxy.count("PUT", ".manifest", 409) == 1
    assert proxy.count("PUT", ".manifest", 200) == 1
