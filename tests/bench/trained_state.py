#!/usr/bin/env python3
"""Tensors with a trained model's distributions, for the plane codec's
benchmark (tests/bench/codec_bench --dir) and issue 39's measurements: a
small decoder-only transformer built from torch.nn (no downloads) trained
on CPU with Adam for --steps steps on a synthetic language (a random
Markov chain over --vocab tokens, so that the loss falls and the weights
move as they do on text), then its state written as raw little-endian
bytes, one file per kind and dtype, every tensor of the kind one after
the other:

  weights.fp32   the trained parameters (fp32 training: the master copy)
  weights.bf16   the same cast to bf16 (what a bf16 model saves)
  adam_m.fp32    Adam's first moments (exp_avg)
  adam_v.fp32    Adam's second moments (exp_avg_sq)

and index.json (per tensor: kind, name, dtype, shape, offset, bytes;
with the steps, final loss and seconds taken).

    .venv-test/bin/python tests/bench/trained_state.py --out /tmp/trained
    build/tests/bench/codec_bench --dir /tmp/trained

Deterministic for a given --seed; about 2 minutes on a 2-core VM at the
defaults.
"""
import argparse
import json
import math
import os
import time

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, ff), nn.GELU(), nn.Linear(ff, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.ff(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, 4 * d) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        mask = torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        for b in self.blocks:
            x = b(x, self.mask[:t, :t])
        return self.head(self.ln(x))


def markov_batches(vocab, seq, batch, seed):
    """Sequences from a sparse random Markov chain: each token has 8
    likely successors, so the model has something to learn."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randint(0, vocab, (vocab, 8), generator=g)
    probs = torch.softmax(torch.randn(vocab, 8, generator=g) * 2, dim=1)
    while True:
        x = torch.empty(batch, seq + 1, dtype=torch.long)
        x[:, 0] = torch.randint(0, vocab, (batch,), generator=g)
        for i in range(seq):
            pick = torch.multinomial(probs[x[:, i]], 1, generator=g).squeeze(1)
            x[:, i + 1] = succ[x[:, i], pick]
        yield x[:, :-1], x[:, 1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--d", type=int, default=192)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(os.cpu_count() or 1)
    model = TinyGPT(a.vocab, a.d, a.layers, a.heads, a.seq)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    data = markov_batches(a.vocab, a.seq, a.batch, a.seed)
    t0 = time.monotonic()
    loss = float("nan")
    for step in range(a.steps):
        x, y = next(data)
        logits = model(x)
        l = nn.functional.cross_entropy(logits.reshape(-1, a.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        l.backward()
        opt.step()
        loss = l.item()
        if step % 50 == 0 or step == a.steps - 1:
            print(f"step {step}: loss {loss:.3f} (uniform {math.log(a.vocab):.3f})", flush=True)
    took = time.monotonic() - t0

    os.makedirs(a.out, exist_ok=True)
    files = {}
    index = []

    def put(kind, dtype, name, t):
        fname = f"{kind}.{dtype}"
        f = files.get(fname)
        if f is None:
            f = files[fname] = open(os.path.join(a.out, fname), "wb")
        t = t.detach().contiguous()
        # numpy has no bf16: its bits as int16, little-endian like the rest
        b = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        index.append({"kind": kind, "name": name, "dtype": dtype, "shape": list(t.shape), "offset": f.tell(), "bytes": len(b)})
        f.write(b)

    for name, p in model.named_parameters():
        put("weights", "fp32", name, p.float())
        put("weights", "bf16", name, p.to(torch.bfloat16))
        st = opt.state[p]
        put("adam_m", "fp32", name, st["exp_avg"].float())
        put("adam_v", "fp32", name, st["exp_avg_sq"].float())
    for f in files.values():
        f.close()
    with open(os.path.join(a.out, "index.json"), "w") as f:
        json.dump({"args": vars(a), "final_loss": loss, "train_s": took, "tensors": index}, f, indent=1)
    total = sum(e["bytes"] for e in index)
    print(f"trained {a.steps} steps in {took:.0f} s, loss {loss:.3f}; wrote {len(index)} tensors, "
          f"{total / 2**20:.1f} MiB, to {a.out}")


if __name__ == "__main__":
    main()
