"""[storage] layout = spread on S3 (moto): a step's shards go under
job/shards/<rank % 256 as 2 hex>/step-N/, key prefixes that stay the same
from step to step, while manifests and the commit stay in the step's
directory, so one LIST still decides completeness. Saved, listed, restored
after a restart and deleted through the same requests as the step layout."""
import re
import subprocess

from s3util import EXAMPLE, Daemon, keys, s3env, s3url

SPREAD = "[storage]\nlayout = spread\n"


def ranks(d, job, world, steps, restore_only=False):
    procs = [subprocess.Popen([EXAMPLE, "--socket", d.sock, "--job", job, "--rank", str(r), "--world-size", str(world),
                               "--steps", str(steps), "--size-mb", "1", "--tensors", "2"]
                              + (["--restore-only"] if restore_only else []),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, out + err + d.log.read_text()[-3000:]


def test_spread_keys_restore_and_delete(moto, bucket, tmp_path, proxy):
    d = Daemon(tmp_path, s3url(bucket, proxy.endpoint), s3env(moto), conf=SPREAD).start()
    ranks(d, "sp", 3, steps=2)
    names = [re.sub(r"[0-9a-f]{16}\.shard$", "N.shard", k) for k in keys(moto, bucket)]
    for step in (1, 2):
        for r in range(3):
            assert f"runs/sp/shards/{r:02x}/step-{step:012d}/rank-{r:05d}-of-00003.default.N.shard" in names
            assert f"runs/sp/step-{step:012d}/rank-{r:05d}-of-00003.default.manifest" in names
    assert not [k for k in names if "/step-" in k and k.split("/")[1].startswith("step-") and k.endswith(".shard")]
    ls = d.ctl("ls", "sp")
    # Size "-" (the listing has no shard sizes), the time saved and age from
    # the manifests' listing, and step 2 marked the latest.
    assert re.search(r"sp +2\* yes +durable +3/3 +- +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d +\d+s +default", ls), ls
    show = d.ctl("show", "sp", "2")
    # show reads the manifests, so it has the bytes the listing lacks.
    assert re.match(r"sp step 2: complete, 3/3 ranks, [0-9.]+ MiB, attempt default", show), show
    d.stop()

    # A fresh daemon (empty memory tier) restores from the spread shards,
    # reading one manifest and one shard per rank.
    d = Daemon(tmp_path, s3url(bucket, proxy.endpoint), s3env(moto), conf=SPREAD).start()
    proxy.clear()
    ranks(d, "sp", 3, steps=2, restore_only=True)
    shard_gets = [p for m, p, s in proxy.log if m == "GET" and ".shard" in p.split("?")[0]]
    assert len(shard_gets) >= 3, proxy.log
    assert all("/runs/sp/shards/0" in p for p in shard_gets), shard_gets
    assert proxy.count("GET", ".manifest") == 3, proxy.log

    d.ctl("rm", "sp", "1")
    left = keys(moto, bucket)
    assert not [k for k in left if "step-000000000001" in k], left
    assert len([k for k in left if re.match(r"runs/sp/shards/0[0-2]/step-000000000002/", k)]) == 3, left
    d.stop()
