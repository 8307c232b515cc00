"""Core guarantees, defended here through the Python layer a second time
(the C integration suite is the first): the per-rank cap on saves in
flight (test_memtier.c / test_data_path.c), the agreed latest step, which
is never a newer step that some rank has not saved (test_multinode.c), and
a complete step never overwritten (test_data_path.c)."""
import errno

import pytest

torch = pytest.importorskip("torch")

import ckpt.client  # noqa: E402
import ckpt.torch  # noqa: E402


def test_per_rank_cap_refuses_a_save_beyond_it(daemon_factory):
    # Uploads take 1.5 s, so the first save is still in flight.
    d = daemon_factory("[limits]\nmax_inflight_saves = 1\n[debug]\nstore_delay_ms = 1500\n")
    t = torch.arange(4 << 20, dtype=torch.float32)  # 16 MiB: several chunks, so the delay applies
    # overlap=True sends at once: the daemon refuses the second save.
    with ckpt.torch.Checkpointer("cap", socket=d.sock, overlap=True) as cp:
        f1 = cp.save({"t": t}, 1)
        f1.staged.result(30)
        f2 = cp.save({"t": t}, 2)
        with pytest.raises(ckpt.client.CkptError) as e:
            f2.staged.result(30)
        assert e.value.errno == errno.EBUSY
        assert "max_inflight_saves" in str(e.value)
        f1.durable.result(60)
        # Once the first is durable, the rank may save again.
        cp.save({"t": t}, 3).durable.result(60)
    # By default save() waits for room instead (backpressure), and learns
    # the cap from the refusal: every save succeeds, one in flight at a time.
    with ckpt.torch.Checkpointer("cap-wait", socket=d.sock) as cp:
        futs = [cp.save({"t": t}, s) for s in (1, 2, 3)]
        assert futs[0].durable.done() and futs[1].durable.done(), "save 3 was sent before 1 and 2 were durable"
        assert cp._max_inflight == 1
        assert [f.durable.result(60) for f in futs] == [t.nbytes] * 3
    # Another rank of the same job has a cap of its own.
    with ckpt.torch.Checkpointer("cap2", socket=d.sock, rank=0, world_size=2) as r0, \
            ckpt.torch.Checkpointer("cap2", socket=d.sock, rank=1, world_size=2) as r1:
        a = r0.save({"t": t}, 1)
        b = r1.save({"t": t}, 1)
        a.staged.result(30)
        b.staged.result(30)
        a.durable.result(60)
        b.durable.result(60)


def test_latest_is_the_newest_step_every_rank_saved(daemon):
    ranks = [ckpt.torch.Checkpointer("agree", socket=daemon.sock, rank=r, world_size=2) for r in range(2)]
    try:
        for step in (1, 2):
            fs = [cp.save({"w": torch.full((1024,), float(10 * step + r))}, step) for r, cp in enumerate(ranks)]
            for f in fs:
                f.durable.result(60)
        # Step 3: rank 0 only, so incomplete: never the latest.
        ranks[0].save({"w": torch.full((1024,), 30.0)}, 3).durable.result(60)
        for r, cp in enumerate(ranks):
            got = {"w": torch.zeros(1024)}
            step, _ = cp.load(got)
            assert step == 2, f"rank {r} loaded step {step}"
            assert torch.equal(got["w"], torch.full((1024,), float(20 + r)))
        c = ckpt.client.Client(socket=daemon.sock, job="agree")
        try:
            assert c.resolve() == 2
            # The step that latest pinned stays what every rank loads.
            assert c.resolve("latest") == 2
        finally:
            c.close()
        # Once rank 1 saves step 3 too, it is the latest for both.
        ranks[1].save({"w": torch.full((1024,), 31.0)}, 3).durable.result(60)
        for r, cp in enumerate(ranks):
            got = {"w": torch.zeros(1024)}
            step, _ = cp.load(got)
            assert step == 3 and torch.equal(got["w"], torch.full((1024,), float(30 + r)))
    finally:
        for cp in ranks:
            cp.close()


def test_a_complete_step_is_never_overwritten(daemon):
    """A complete step, once a restore has pinned it, refuses another save
    of the same step from any attempt (EEXIST), and what it held is what
    loads (test_data_path.c is the C side)."""
    with ckpt.torch.Checkpointer("keep", socket=daemon.sock, attempt_id="a1") as cp:
        cp.save({"w": torch.full((4096,), 1.0)}, 5).durable.result(60)
        got = {"w": torch.zeros(4096)}
        assert cp.load(got)[0] == 5  # resolves "latest": pins step 5
    with ckpt.torch.Checkpointer("keep", socket=daemon.sock, attempt_id="a2") as cp:
        f = cp.save({"w": torch.full((4096,), 2.0)}, 5)
        with pytest.raises(ckpt.client.CkptError) as e:
            f.durable.result(60)
        assert e.value.errno == errno.EEXIST
        assert "never overwritten" in str(e.value)
        got = {"w": torch.zeros(4096)}
        assert cp.load(got, step=5)[0] == 5
        assert torch.equal(got["w"], torch.full((4096,), 1.0))


def test_a_corrupt_copy_in_memory_never_reaches_the_model(daemon_factory):
    """A restore from the daemon's memory is CRC-checked like one from
    storage: with a byte flipped in the held copy ([debug] corrupt_held),
    the load reads the step from storage at once and gets the saved
    bytes; the copy is dropped (test_memtier.c is the C side)."""
    d = daemon_factory("[debug]\ncorrupt_held = true\n")
    w = torch.arange(1 << 20, dtype=torch.float32)
    with ckpt.torch.Checkpointer("badmem", socket=d.sock) as cp:
        cp.save({"w": w}, 4).durable.result(60)
        got = {"w": torch.zeros(1 << 20)}
        assert cp.load(got, step=4)[0] == 4
        assert torch.equal(got["w"], w)
        assert cp.last_load["source"] == "storage"
        assert not [h for h in cp.client.held() if h["step"] == 4]
