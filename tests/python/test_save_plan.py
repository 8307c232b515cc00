"""Checkpointer's save plan (docs/python.md "Python and PyTorch": the per-tensor
cost): a state dict saved again with its tensors where they were reuses the
names, skeleton, registrations and the daemon's tensor table, and every
change that would make a reused plan save the wrong bytes, shape, dtype or
tree makes a new one instead. Each test restores and compares."""
import errno
import pickle

import pytest
import torch

import ckpt.format as ckpt_format
import ckpt._regs
import ckpt.client
import ckpt.torch
from ckpt.client import CkptError
from conftest import same


def restore(cp, template, step):
    out = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else v for k, v in template.items()}
    got_step, extra = cp.load(out, step)
    assert got_step == step
    return out, extra


def make_sd(n=40):
    torch.manual_seed(1)
    return {f"layers.{i}.weight": torch.randn(37 + i) for i in range(n)}


def test_later_saves_reuse_the_plan_and_see_new_values(daemon):
    sd = make_sd()
    with ckpt.torch.Checkpointer("plan-reuse", socket=daemon.sock) as cp:
        cp.save(sd, 1).durable.result()
        plan, table = cp._plans.last, cp._plans.last.table
        assert table is not None, "a host-only state dict is saved through a table"
        nbufs = len(cp.client._buffers)
        for step in (2, 3):
            with torch.no_grad():
                for t in sd.values():
                    t.mul_(2).add_(step)
            # model.state_dict() hands out new tensor objects each time:
            fresh = {k: v.detach() for k, v in sd.items()}
            fut = cp.save(fresh, step, extra={"step": step})
            fut.durable.result()
            assert 0 < fut.daemon_stall < 60, "the daemon's own time to staged"
            assert cp._plans.last is plan and plan.table is table, "unchanged tensors reuse the plan"
            assert len(cp.client._buffers) == nbufs, "no new registrations"
            with ckpt.torch.Checkpointer("plan-reuse", socket=daemon.sock) as reader:
                out, extra = restore(reader, sd, step)
            assert same(out, sd) and extra == {"step": step}


@pytest.mark.parametrize("change", ["new_tensor", "reshape", "dtype_view", "transpose", "new_key", "leaf_moved"])
def test_any_change_that_matters_makes_a_new_plan(daemon, change):
    torch.manual_seed(2)
    sd = {"a": torch.randn(8, 8), "b": torch.randn(64), "lr": 0.1, "groups": [torch.randn(3), 5]}
    with ckpt.torch.Checkpointer(f"plan-{change}", socket=daemon.sock) as cp:
        cp.save(sd, 1).durable.result()
        old = cp._plans.last
        if change == "new_tensor":
            sd["b"] = torch.randn(64)  # another storage: another address, the old one held
        elif change == "reshape":
            sd["b"] = sd["b"].view(8, 8)  # same bytes, same address, other shape
        elif change == "dtype_view":
            sd["b"] = sd["b"].view(torch.int32)
        elif change == "transpose":
            sd["a"] = sd["a"].t()  # same address and shape, other strides
        elif change == "new_key":
            sd["c"] = torch.randn(5)
        elif change == "leaf_moved":
            sd["groups"] = [5, sd["groups"][0]]  # same leaves, other places
        cp.save(sd, 2).durable.result()
        assert cp._plans.last is not old
        out = {}
        step, _ = cp.load(out, 2)
        assert step == 2
        assert same(out, sd), f"{change}: restored {out!r}"
        assert out["a"].shape == sd["a"].shape and out["b"].dtype == sd["b"].dtype


def test_leaves_change_without_a_new_plan(daemon):
    sd = {"w": torch.randn(100), "opt": {"lr": 0.1, "betas": (0.9, 0.99), "name": "adam"}}
    with ckpt.torch.Checkpointer("plan-leaves", socket=daemon.sock) as cp:
        cp.save(sd, 1).durable.result()
        plan = cp._plans.last
        sd["opt"]["lr"] = 0.05
        sd["opt"]["name"] = "adamw"
        cp.save(sd, 2).durable.result()
        assert cp._plans.last is plan
        for step, lr, name in ((1, 0.1, "adam"), (2, 0.05, "adamw")):
            out = {"w": torch.zeros(100), "opt": {}}
            cp.load(out, step)
            assert out["opt"] == {"lr": lr, "betas": (0.9, 0.99), "name": name}
            assert torch.equal(out["w"], sd["w"])


def test_prepare_makes_the_first_save_a_later_one(daemon):
    sd = make_sd()
    with ckpt.torch.Checkpointer("plan-prepare", socket=daemon.sock) as cp:
        cp.prepare(sd)
        plan, nbufs = cp._plans.last, len(cp.client._buffers)
        assert plan is not None and plan.table is not None
        fresh = {k: v.detach() for k, v in sd.items()}
        cp.save(fresh, 1).durable.result()
        assert cp._plans.last is plan and len(cp.client._buffers) == nbufs
        out, _ = restore(cp, sd, 1)
        assert same(out, sd)


def test_without_tables_the_specs_are_sent(daemon, monkeypatch):
    """An older ckptd (no tensor tables): every save carries its tensors."""
    def no_tables(self, specs):
        raise CkptError(errno.ENOTSUP, "this ckptd has no tensor tables")
    monkeypatch.setattr(ckpt.client.Client, "table", no_tables)
    sd = make_sd(5)
    with ckpt.torch.Checkpointer("plan-notable", socket=daemon.sock) as cp:
        for step in (1, 2):
            with torch.no_grad():
                sd["layers.0.weight"].add_(1)
            cp.save(sd, step).durable.result()
            assert cp._plans.last.table is None
            out, _ = restore(cp, sd, step)
            assert same(out, sd)


def test_loads_keep_or_drop_the_plan_and_saves_still_restore(daemon):
    sd = make_sd(6)
    with ckpt.torch.Checkpointer("plan-load", socket=daemon.sock) as cp:
        cp.save(sd, 1).durable.result()
        plan = cp._plans.last
        cp.load(sd, 1)  # in place: the same registrations
        assert cp._plans.last is plan
        with torch.no_grad():
            sd["layers.3.weight"].fill_(7)
        cp.save(sd, 2).durable.result()
        assert cp._plans.last is plan
        other = {k: torch.zeros_like(v) for k, v in sd.items()}
        cp.load(other, 2)  # other tensors: the plan's registrations go, and the plan
        assert cp._plans.last is None and same(other, sd)
        with torch.no_grad():
            sd["layers.1.weight"].fill_(3)
        cp.save(sd, 3).durable.result()
        out, _ = restore(cp, sd, 3)
        assert same(out, sd)


def test_extra_state_before_skeletons_still_loads(daemon):
    """A step whose extra state is the earlier {"tree": ..., "extra": ...}
    (saves before skeletons) restores through Checkpointer and ckpt.format."""
    from ckpt._tree import _Ref
    from ckpt.client import TensorSpec
    w = torch.arange(12, dtype=torch.float32)
    with ckpt.torch.Checkpointer("plan-v1", socket=daemon.sock) as cp:
        buf = cp.client.alloc(48)
        torch.frombuffer(buf.view, dtype=torch.float32, count=12).copy_(w)
        blob = pickle.dumps({"tree": {"w": _Ref("w", "f32", (12,)), "k": 3}, "extra": "old"})
        cp.client.save(1, [TensorSpec("w", "f32", (12,), buf, 0, 48)], blob).durable.result()
        out = {}
        assert cp.load(out, 1) == (1, "old")
        assert torch.equal(out["w"], w) and out["k"] == 3
    got = ckpt_format.load_step(daemon.url, "plan-v1", 1)
    assert torch.equal(got["w"], w) and got["k"] == 3


def test_format_reads_skeleton_steps(daemon):
    sd = {"w": torch.randn(10), "meta": {"epoch": 4, "tags": ["a", "b"]}, "list": [torch.ones(2), 1.5]}
    with ckpt.torch.Checkpointer("plan-format", socket=daemon.sock) as cp:
        cp.save(sd, 1).durable.result()
    assert same(ckpt_format.load_step(daemon.url, "plan-format", 1), sd)


def test_skeleton_with_a_bad_leaf_index_is_refused():
    from ckpt._tree import _Leaf, dump_skeleton, load_meta
    skel = dump_skeleton({"x": _Leaf(3)})
    with pytest.raises(pickle.UnpicklingError, match="leaf 3"):
        load_meta(pickle.dumps({"skeleton": skel, "leaves": [1], "extra": None}))


@pytest.mark.skipif(not ckpt._regs.CAN_SWAP, reason="this torch has no UntypedStorage._swap_data_ptr_")
def test_plan_tensors_share_one_file_in_place(daemon):
    """A plan's CPU storages move into one shared-memory file (one
    registration, the shard's layout), in place: a parameter, a view of it
    and the state dict's detached tensor stay one memory, tied weights stay
    tied, and a tensor that leaves the dict lets its file go once no
    tensor of the plan is in it."""
    torch.manual_seed(3)
    w = torch.nn.Parameter(torch.randn(7, 9))
    view = w.data[2]
    tied = {"emb": w, "head": w, "b": torch.randn(5), "odd": torch.randn(3, dtype=torch.float64)}
    with ckpt.torch.Checkpointer("plan-arena", socket=daemon.sock) as cp:
        cp.save({k: v.detach() for k, v in tied.items()}, 1).durable.result()
        bufs = {s.buffer for s in cp._plans.last.specs}
        assert len(bufs) == 1, "one registration for every storage of the plan"
        offs = [s.offset for s in cp._plans.last.specs]
        assert offs[0] == offs[1] and all(o % 64 == 0 for o in offs), offs
        with torch.no_grad():
            w.mul_(3)                      # through the parameter
        assert torch.equal(view, w.data[2]) and view.data_ptr() == w.data_ptr() + 2 * 9 * 4
        cp.save({k: v.detach() for k, v in tied.items()}, 2).durable.result()
        with ckpt.torch.Checkpointer("plan-arena", socket=daemon.sock) as reader:
            out, _ = restore(reader, {k: v.detach() for k, v in tied.items()}, 2)
        assert same(out, {k: v.detach() for k, v in tied.items()})
        arena = next(iter(cp._regs.arena.values())).arena
        nbufs = len(cp.client._buffers)
        # "b" leaves: a new plan; the file stays (the others are in it).
        cp.save({"emb": w.detach(), "odd": tied["odd"]}, 3).durable.result()
        assert arena.n == 2 and len(cp.client._buffers) == nbufs
        # Every tensor of the file leaves: it is unregistered.
        cp.save({"new": torch.randn(4)}, 4).durable.result()
        assert arena.n == 0 and arena.buf not in cp.client._buffers
    # The tensors outlive the checkpointer and its file's registration.
    assert torch.equal(view, w.detach()[2]) and torch.equal(w.detach().clone(), w.detach())


def test_a_torch_that_will_not_swap_falls_back(daemon, monkeypatch):
    """If this torch refuses to swap a storage's bytes, each storage is
    shared on its own (as with torch before 2.15), and saves still work."""
    def refuse(self, other):
        raise RuntimeError("no swap here")
    monkeypatch.setattr(torch.UntypedStorage, "_swap_data_ptr_", refuse, raising=False)
    monkeypatch.setattr(ckpt._regs, "CAN_SWAP", True)
    sd = make_sd(12)
    with ckpt.torch.Checkpointer("plan-noswap", socket=daemon.sock) as cp:
        cp.save(sd, 1).durable.result()
        assert cp._regs.no_arena and len({s.buffer for s in cp._plans.last.specs}) == 12
        with torch.no_grad():
            for t in sd.values():
                t.add_(1)
        cp.save({k: v.detach() for k, v in sd.items()}, 2).durable.result()
        with ckpt.torch.Checkpointer("plan-noswap", socket=daemon.sock) as reader:
            out, _ = restore(reader, sd, 2)
        assert same(out, sd)


def test_the_arena_is_registered_as_it_fills(daemon, monkeypatch):
    """A first save without prepare() (issue 40): the plan's file has its
    pages at once (fallocate) and is registered on another thread while
    the storages are copied into it, so the daemon maps it meanwhile; a
    registration that fails fails the save and leaves nothing registered
    (the next save makes the plan again), and a file that cannot have its
    pages up front is registered after the copies. Each restores."""
    import threading
    if not ckpt._regs.CAN_SWAP:
        pytest.skip("this torch has no UntypedStorage._swap_data_ptr_: no arena")
    real = ckpt.client.Client.register_fds
    seen = []

    def watch(self, fds, sizes):
        import os
        main = threading.current_thread() is threading.main_thread()
        seen.append((main, os.fstat(fds[0]).st_blocks * 512 >= sizes[0]))
        return real(self, fds, sizes)
    monkeypatch.setattr(ckpt.client.Client, "register_fds", watch)
    sd = make_sd(30)
    with ckpt.torch.Checkpointer("plan-fill", socket=daemon.sock) as cp:
        cp.save(sd, 1).durable.result()
        assert seen == [(False, True)], "registered off the trainer's thread, its pages allocated"
        assert len({s.buffer for s in cp._plans.last.specs}) == 1
        with ckpt.torch.Checkpointer("plan-fill", socket=daemon.sock) as reader:
            out, _ = restore(reader, sd, 1)
        assert same(out, sd)

    def refuse(self, fds, sizes):
        raise CkptError(errno.ENOMEM, "no room for the arena")
    monkeypatch.setattr(ckpt.client.Client, "register_fds", refuse)
    sd = make_sd(30)
    with ckpt.torch.Checkpointer("plan-fill-refused", socket=daemon.sock) as cp:
        with pytest.raises(CkptError, match="no room for the arena"):
            cp.save(sd, 1)
        assert not cp.client._buffers and cp._plans.last is None
        monkeypatch.setattr(ckpt.client.Client, "register_fds", watch)
        cp.save({k: v.detach() for k, v in sd.items()}, 2).durable.result()
        with ckpt.torch.Checkpointer("plan-fill-refused", socket=daemon.sock) as reader:
            out, _ = restore(reader, sd, 2)
        assert same(out, sd)

    def no_fallocate(fd, off, n):
        raise OSError(errno.EOPNOTSUPP, "no fallocate here")
    monkeypatch.setattr(ckpt._regs.os, "posix_fallocate", no_fallocate)
    seen.clear()
    sd = make_sd(30)
    with ckpt.torch.Checkpointer("plan-fill-sparse", socket=daemon.sock) as cp:
        cp.save(sd, 1).durable.result()
        assert [m for m, _ in seen] == [True], "registered after the copies, on the trainer's thread"
        with ckpt.torch.Checkpointer("plan-fill-sparse", socket=daemon.sock) as reader:
            out, _ = restore(reader, sd, 1)
        assert same(out, sd)
