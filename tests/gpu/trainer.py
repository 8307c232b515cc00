#!/usr/bin/env python3
"""A trainer process for tests/gpu/test_torch_cuda.py: a model with CUDA
parameters and Adam state, saved and restored through ckpt.torch in a
process of its own, so that PYTORCH_CUDA_ALLOC_CONF (read once, at the
first CUDA allocation) can differ per run and a restore happens in a
process that never saw the saved tensors.

  trainer.py save SOCK JOB STEP REF DEVICE      train, save, write REF
  trainer.py hang SOCK JOB STEP MIB DEVICE      save MIB of state, say
                                                "staged", wait to be killed
  trainer.py load SOCK JOB STEP REF DEVICE      restore, compare with REF

Each prints one JSON line (the last line of its output) and exits 0 only if
its checks passed."""
import json
import sys
import time
import warnings

import torch

import ckpt.torch


def model_and_optim(device, seed):
    torch.manual_seed(seed)
    # About 20 MiB of parameters, several shapes, biases: 17 tensors, and
    # Adam's exp_avg and exp_avg_sq for each.
    layers = []
    for i, (a, b) in enumerate([(1024, 2048), (2048, 1024), (1024, 512), (512, 512), (512, 256), (256, 16)]):
        layers.append(torch.nn.Linear(a, b))
        if i < 5:
            layers.append(torch.nn.LayerNorm(b) if i % 2 else torch.nn.ReLU())
    model = torch.nn.Sequential(*layers).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, opt


def train(model, opt, device, steps, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(64, 1024, device=device, generator=g)
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def state_of(model, opt):
    return {"model": model.state_dict(), "optim": opt.state_dict()}


def flat(tree, prefix=""):
    """{path: tensor} of every tensor in tree."""
    out = {}
    if isinstance(tree, torch.Tensor):
        out[prefix] = tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flat(v, f"{prefix}/{k}"))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(flat(v, f"{prefix}/{i}"))
    return out


def to_cpu(tree):
    return {k: v.detach().to("cpu", copy=True) for k, v in flat(tree).items()}


def differences(got, want):
    """Paths whose tensor differs bitwise (dtype, shape or any byte)."""
    bad = sorted(set(got) ^ set(want))
    for k in set(got) & set(want):
        a, b = got[k], want[k]
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a.view(-1).view(torch.uint8),
                                                                         b.view(-1).view(torch.uint8)):
            bad.append(k)
    return bad


def expandable():
    """Whether this process's CUDA tensors live in expandable (VMM)
    segments, as the allocator's snapshot says; None if it does not say."""
    segs = torch.cuda.memory_snapshot()
    flags = {s.get("is_expandable") for s in segs}
    return None if flags == {None} else any(flags)


def report(**kw):
    print(json.dumps(kw), flush=True)


def cmd_save(sock, job, step, ref, device):
    model, opt = model_and_optim(device, 1)
    train(model, opt, device, 3, 2)
    cp = ckpt.torch.Checkpointer(job, socket=sock)
    state = state_of(model, opt)
    # No synchronisation: the save's event orders the daemon's copy after
    # the optimizer step still running on the stream.
    train(model, opt, device, 1, 3)
    t0 = time.perf_counter()
    f = cp.save(state, step)
    f.staged.result(120)
    staged_ms = (time.perf_counter() - t0) * 1e3
    want = to_cpu(state)  # what the save must hold: the state at staged
    torch.save(want, ref)
    # Changed right after staged, before durable: the saved step must not see it.
    with torch.no_grad():
        for t in flat(state).values():
            if t.is_floating_point():
                t.add_(1.0)
    train(model, opt, device, 1, 4)
    f.durable.result(300)
    report(staged_ms=staged_ms, cuda_registered=cp._cuda.works is True,
           expandable=expandable() if device == "cuda" else None,
           tensors=len(want), bytes=sum(t.numel() * t.element_size() for t in want.values()))
    cp.close()
    return 0 if (device != "cuda" or cp._cuda.works is True) else 1


def pattern(n, step, device):
    """MIB-sized deterministic tensors, made on the device."""
    return torch.arange(n, dtype=torch.float32, device=device).mul_(1.0001).add_(step)


def cmd_hang(sock, job, step, mib, device):
    n = (int(mib) << 20) // 4 // 4
    state = {f"t{i}": pattern(n, step + i, device) for i in range(4)}
    cp = ckpt.torch.Checkpointer(job, socket=sock)
    f = cp.save(state, step)
    f.staged.result(120)
    print("staged", flush=True)
    time.sleep(600)
    return 0


def cmd_load(sock, job, step, ref, device):
    model, opt = model_and_optim(device, 99)  # other values everywhere
    train(model, opt, device, 1, 5)            # so Adam has its state tensors
    state = state_of(model, opt)
    want = torch.load(ref)
    if not differences(to_cpu(state), want):
        report(error="the fresh model already equals the saved one: the test proves nothing")
        return 1
    with ckpt.torch.Checkpointer(job, socket=sock) as cp:
        got_step, _ = cp.load(state, step=step)
        source = cp.last_load["source"]
    # Loaded in place: the model's own parameters and Adam's own state.
    opt.load_state_dict(state["optim"])
    got = to_cpu(state_of(model, opt))
    bad = differences(got, want)
    on_device = all(t.device.type == device for t in flat(model.state_dict()).values())
    report(step=got_step, source=source, differing=bad[:10], n_differing=len(bad), on_device=on_device)
    return 0 if not bad and got_step == step and on_device else 1


def main(argv):
    # A CUDA tensor copied around a refused registration is a finding here,
    # not a slow path to accept quietly.
    warnings.filterwarnings("error", message="ckpt:", category=RuntimeWarning)
    cmd, sock, job, step, arg, device = argv[1:7]
    return {"save": cmd_save, "hang": cmd_hang, "load": cmd_load}[cmd](sock, job, int(step), arg, device)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
