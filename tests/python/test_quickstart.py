"""Issue 32: the README's quick start, run as written, saves every step's
own weights. The Python blocks marked <!-- quickstart:NAME --> in
README.md are taken from it and run against a real ckptd ($CKPTD_SOCKET,
which wins over the blocks' storage=: test_node.py starts daemons), with Checkpointer.save wrapped to record a clone
of every tensor at the moment of the call; each step is then loaded back
and compared bit for bit with what was saved. The same for the overlap
block, where opt.step() follows save() at once and must wait for staged
(the optimizer hook), and for a larger model whose copy takes long enough
to race opt.step() if nothing waited."""
import concurrent.futures
import os
import re

import pytest
import torch

import ckpt.torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme_blocks():
    """{name: source} of the README's ```python blocks after a
    <!-- quickstart:NAME ... --> line."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    found = re.findall(r"<!-- quickstart:(\w+)[^>]*-->\n```python\n(.*?)```", text, re.S)
    return dict(found)


def clone(tree):
    if isinstance(tree, torch.Tensor):
        return tree.detach().clone()
    if isinstance(tree, dict):
        return {k: clone(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(clone(v) for v in tree)
    return tree


def tensors(tree, path=""):
    if isinstance(tree, torch.Tensor):
        yield path, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from tensors(v, f"{path}/{k}")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from tensors(v, f"{path}/{i}")


@pytest.fixture
def recorded(monkeypatch):
    """Checkpointer.save wrapped: (job, step) -> (clone of the state at the
    call, whether staged was done when save returned, the future)."""
    seen = {}
    real = ckpt.torch.Checkpointer.save

    def save(self, state_dict, step, *a, **kw):
        before = clone(state_dict)
        fut = real(self, state_dict, step, *a, **kw)
        seen[(self.job, step)] = (before, fut.staged.done(), fut)
        return fut
    monkeypatch.setattr(ckpt.torch.Checkpointer, "save", save)
    return seen


def check_restores(sock, job, seen):
    """Every recorded step of job loads back bit-exact."""
    steps = sorted(s for j, s in seen if j == job)
    assert steps, f"nothing saved for {job}"
    with ckpt.torch.Checkpointer(job, socket=sock) as cp:
        for step in steps:
            got = {}
            cp.load(got, step=step)
            want = dict(tensors(seen[(job, step)][0]))
            have = dict(tensors(got))
            assert want.keys() <= have.keys(), (step, want.keys(), have.keys())
            for name, t in want.items():
                assert torch.equal(have[name], t), f"step {step} of {job}: {name} is not the step's own"


def test_readme_quickstart_as_written(daemon, recorded, monkeypatch):
    blocks = readme_blocks()
    assert {"save", "restore", "overlap"} <= blocks.keys(), blocks.keys()
    monkeypatch.setenv("CKPTD_SOCKET", daemon.sock)
    ns = {}
    exec(compile(blocks["save"], "README.md:quickstart:save", "exec"), ns)
    saved = {s: v for (j, s), v in recorded.items() if j == "quickstart"}
    assert sorted(saved) == [1, 2, 3, 4, 5]
    assert all(staged for _, staged, _ in saved.values()), "save() returned before staged"
    check_restores(daemon.sock, "quickstart", recorded)

    # Restore: the model gets step 5's weights back.
    final = {k: v.clone() for k, v in ns["model"].state_dict().items()}
    with torch.no_grad():
        for p in ns["model"].parameters():
            p.zero_()
    exec(compile(blocks["restore"], "README.md:quickstart:restore", "exec"), ns)
    assert ns["step"] == 5
    for k, v in ns["model"].state_dict().items():
        assert torch.equal(v, recorded[("quickstart", 5)][0]["model"][k])
    assert not torch.equal(final["weight"], recorded[("quickstart", 5)][0]["model"]["weight"])

    # Overlap, as written: opt.step() right after save() waits for staged.
    staged_at_step = []
    h = ns["opt"].register_step_post_hook(
        lambda *_: staged_at_step.append(all(f.staged.done() for _, _, f in recorded.values())))
    exec(compile(blocks["overlap"], "README.md:quickstart:overlap", "exec"), ns)
    h.remove()
    assert staged_at_step and all(staged_at_step)
    check_restores(daemon.sock, "quickstart-overlap", recorded)


def test_step_then_sleep_loop_saves_each_steps_weights(daemon, recorded):
    """The loop of the issue: save(), opt.step() at once, then other work;
    default mode, a model large enough that ckptd's copy takes a while."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(16)])  # 16 MiB of weights
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ckpt.torch.Checkpointer("loop-default", socket=daemon.sock) as cp:
        for step in range(1, 5):
            model(torch.randn(4, 512)).sum().backward()
            cp.save({"model": model.state_dict()}, step)
            opt.step()
            opt.zero_grad()
    assert all(staged for _, staged, _ in recorded.values())
    check_restores(daemon.sock, "loop-default", recorded)


def test_overlap_waits_before_optimizer_step_and_batchnorm(daemon, recorded):
    """overlap=[opt, model]: save() returns before staged; opt.step() and
    a train-mode BatchNorm forward wait for it; every step restores its
    own weights and running statistics."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.BatchNorm1d(1024),
                                *[torch.nn.Linear(1024, 1024) for _ in range(15)])  # 64 MiB
    opt = torch.optim.Adam(model.parameters())
    waited = []
    opt.register_step_post_hook(lambda *_: waited.append(cp._unstaged == []))
    cp = ckpt.torch.Checkpointer("loop-overlap", socket=daemon.sock, overlap=[opt, model])
    returned_early = 0
    for step in range(1, 5):
        x = torch.randn(8, 1024)
        fut = cp.save({"model": model.state_dict(), "optim": opt.state_dict()}, step)
        returned_early += not fut.staged.done()
        model(x).sum().backward()  # BatchNorm's forward waits for staged
        assert fut.staged.done()
        opt.step()
        opt.zero_grad()
    cp.close()
    assert all(waited) and len(waited) == 4
    assert returned_early >= 1, "save() with overlap never returned before staged"
    check_restores(daemon.sock, "loop-overlap", recorded)


def test_overlap_true_hooks_nothing(daemon):
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ckpt.torch.Checkpointer("ov-true", socket=daemon.sock, overlap=True) as cp:
        assert cp._hooks == []
        fut = cp.save({"model": model.state_dict()}, 1)
        fut.staged.result()
        opt.step()
    with pytest.raises(TypeError, match="overlap="):
        ckpt.torch.Checkpointer("ov-bad", socket=daemon.sock, overlap="yes")


def test_load_waits_for_an_overlapped_save(daemon):
    """load() into tensors an overlapped save still copies waits for
    staged first: step 2 keeps the values it was saved with."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)])  # 32 MiB
    sd = model.state_dict()
    with ckpt.torch.Checkpointer("ov-load", socket=daemon.sock, overlap=True) as cp:
        cp.save(sd, 1).durable.result(60)
        with torch.no_grad():
            for t in sd.values():
                t.add_(1.0)
        want = clone(sd)
        cp.save(sd, 2)
        cp.load(sd, step=1)  # writes step 1's values over the tensors step 2 is copying
        assert cp._unstaged == []
    got = {}
    with ckpt.torch.Checkpointer("ov-load", socket=daemon.sock) as cp:
        cp.load(got, step=2)
    for k, v in want.items():
        assert torch.equal(got[k], v), k
