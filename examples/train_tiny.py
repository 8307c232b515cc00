#!/usr/bin/env python3
"""Train a small MLP on CPU and checkpoint it through ckptd every K steps,
asynchronously: with overlap=opt, save() returns at once and the
optimizer's step() waits for "staged" (a step pre-hook), the first write to
the saved tensors, so ckptd's copy overlaps the next step's forward and
backward.

    python examples/train_tiny.py --socket /run/ckptd/ckptd.sock --job tiny --steps 50 --every 10
    python examples/train_tiny.py ... --resume      # continue from the latest checkpoint

Prints one line per step ("step S loss L") so runs can be compared; with
--resume it first prints "resumed from step S (source: memory|storage)".
"""
import argparse
import sys

import torch

import ckpt.torch


def batch(seed, step):
    g = torch.Generator().manual_seed(seed * 100003 + step)
    x = torch.randn(64, 32, generator=g)
    y = torch.sin(x.sum(dim=1, keepdim=True)) + 0.1 * torch.randn(64, 1, generator=g)
    return x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", default=None)
    ap.add_argument("--job", default="tiny")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--fallback-dir", default=None)
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    cp = ckpt.torch.Checkpointer(a.job, socket=a.socket, fallback_dir=a.fallback_dir, overlap=opt)
    start = 0
    if a.resume:
        state = {"model": model.state_dict(), "optim": opt.state_dict()}
        step, extra = cp.load(state)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        torch.set_rng_state(extra["rng"])
        start = step
        src = getattr(cp, "last_load", {}).get("source", "fallback")
        print(f"resumed from step {step} (source: {src})", flush=True)
    pending = None
    for step in range(start + 1, a.steps + 1):
        x, y = batch(a.seed, step)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()  # waits for the last save's staged first: the stall
        print(f"step {step} loss {loss.item():.9f}", flush=True)
        if step % a.every == 0:
            if pending is not None:
                pending.durable.result()  # at most one save in flight
                print(f"durable {pending.step}", flush=True)
            pending = cp.save({"model": model.state_dict(), "optim": opt.state_dict()}, step,
                                         extra={"rng": torch.get_rng_state()})
    if pending is not None:
        pending.durable.result()
        print(f"durable {pending.step}", flush=True)
    cp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
