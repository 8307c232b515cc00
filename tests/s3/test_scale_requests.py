"""Storage requests per rank do not grow with the world size: the core of
tests/bench/scale at W=8 (one daemon) and W=32 (four daemons, standing for
nodes) on moto, counted at the proxy. Before format 2 a restore read every
manifest of its step, W GETs per rank: that would show here as 24 more per
rank at W=32."""
import importlib.machinery
import importlib.util
import os

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "scale")


def bench():
    loader = importlib.machinery.SourceFileLoader("scale_bench", BENCH)
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader("scale_bench", loader))
    loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not os.environ.get("CKPT_LIB"),
                    reason="needs libckpt in python (CKPT_LIB; not in the ASan build)")
def test_requests_per_rank_are_flat(moto, proxy, tmp_path):
    b = bench()
    small, big = (b.measure(moto, proxy, tmp_path, w, log=lambda *a: None) for w in (8, 32))
    # A save: GET commit (none yet), PUT shard, create-only PUT manifest.
    assert {k: small["save"][k] / 8 for k in b.KINDS} == {"GET": 1, "HEAD": 0, "PUT": 2, "POST": 0, "DELETE": 0,
                                                          "LIST": 0}, small["save"]
    # Counts, not times: a retry or two is the only slack.
    for phase in ("save", "load"):
        assert abs(big[phase]["per_rank"] - small[phase]["per_rank"]) <= 0.25, (phase, small[phase], big[phase])
    # Waiting for the step on every rank (Client.wait_complete, while the
    # other ranks still save): the ranks of a node share one poll, so a
    # node lists the step a few times (more the longer the step takes:
    # the backoff's looks, capped at one per 2 s) whatever its ranks, and
    # one node pins it. Polling ckpt_list every 50 ms cost 25 per rank.
    for r, nodes in ((small, 1), (big, 4)):
        assert r["wait"]["per_rank"] <= 2, r["wait"]
        assert r["wait"]["LIST"] <= 16 * nodes and 1 <= r["wait"]["PUT"] <= nodes, r["wait"]
        assert r["whole"] <= 24, r
    # Every rank racing to pin the step costs a loser 2 requests more.
    assert abs(big["naive"]["per_rank"] - small["naive"]["per_rank"]) <= 2, (small["naive"], big["naive"])
    # Once per job, whatever W (below 500 ranks: one LIST page per step).
    assert big["resolve"]["total"] == small["resolve"]["total"] == 3, (small["resolve"], big["resolve"])
    assert big["ls"]["total"] == small["ls"]["total"] == 3, (small["ls"], big["ls"])
    assert big["restart"]["total"] == small["restart"]["total"] == 0
    # A daemon's start asks the store what it does (the storage probe):
    # 15 requests each, whatever the job.
    assert small["restart"]["probe"] == 15 and big["restart"]["probe"] == 15 * 4, (small["restart"],
                                                                                    big["restart"])
    # ckpt.dcp's read_metadata (every rank shows every manifest): once the
    # step has its index, a node GETs it once and no manifest, so per rank
    # it stays flat (W/8 manifests per rank without it: 3 more at W=32).
    # GETs: the commit per show, an index per node; the first time, rank
    # 0's node also GETs the W manifests and PUTs the index once.
    for r, w in ((small, 8), (big, 32)):
        assert r["meta2"]["GET"] == w + w // 8 and r["meta2"]["PUT"] == 1, (w, r["meta2"])
        assert r["meta"]["GET"] == 2 * w + w // 8 and r["meta"]["PUT"] == 2, (w, r["meta"])
    # Per rank it does not grow (the first time, rank 0's W manifests are
    # 1 per rank at any W, and its few other requests weigh less at 32).
    for phase in ("meta", "meta2"):
        assert big[phase]["per_rank"] - small[phase]["per_rank"] <= 0.25, (phase, small[phase], big[phase])


@pytest.mark.skipif(not os.environ.get("CKPT_LIB"),
                    reason="needs libckpt in python (CKPT_LIB; not in the ASan build)")
def test_a_restore_reads_neighbouring_tensors_in_one_request(moto, proxy, tmp_path):
    """33 small tensors in one shard cost a load the same requests as 2:
    neighbouring tensors of one shard come in one ranged GET (up to 16
    MiB), not one GET each."""
    b = bench()
    few, many = (b.measure(moto, proxy, tmp_path / str(t), 8, tensors=t, log=lambda *a: None) for t in (1, 32))
    assert many["load"]["GET"] == few["load"]["GET"], (few["load"], many["load"])
    assert many["load"]["per_rank"] == few["load"]["per_rank"], (few["load"], many["load"])
