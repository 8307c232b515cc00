#!/usr/bin/env python3
"""How far any lossless byte-plane coder can go on a trained state
(trained_state.py's --out): the order-0 entropy of every byte plane of
each file, and of the sign and exponent taken together, with the ratio
each bound allows when the rest (the mantissa) is stored as it is. The
plane codec's measured ratios (codec_bench --dir) are to be read against
these: a ratio above the order-0 bound comes from zstd's longer matches
(zeros, repeated rows), not from the mantissa, whose planes hold 8 bits of
entropy per byte.

With --context, two bounds that go past order 0, for the set the issue's
1.3x target is about (bf16 weights, fp32 Adam m and v): the order-1
entropy of sign and exponent given the previous element's (the mantissa
at its order-0 entropy), and what zstd at level 19 (about 4 MB/s, far
too slow for the upload path) reaches on every plane, with the bytes as
they are and with each element rotated left by one bit so that the
exponent fills a byte of its own (the sign moves to the low byte). These
say how far a better context model could go on this data.

    .venv-test/bin/python tests/bench/plane_entropy.py /tmp/trained [--context]
"""
import sys

import numpy as np


def entropy(a):
    c = np.bincount(a).astype(np.float64)
    p = c[c > 0] / c.sum()
    return float(-(p * np.log2(p)).sum())


def cond_entropy(a, ctx):
    """H(a | ctx) of two integer arrays."""
    return entropy(ctx.astype(np.int64) * (int(a.max()) + 1) + a) - entropy(ctx)


def planes(x, e):
    return [np.ascontiguousarray(x.view(np.uint8).reshape(-1, e)[:, k]).tobytes() for k in range(e)]


def context_bounds(d):
    import zstandard
    raw = order1 = z_plain = z_rot = 0.0
    print(f"{'file':14} {'order-1 bits/elem':>18} {'zstd-19 planes':>15} {'rotated':>8}")
    for f, e in (("weights.bf16", 2), ("adam_m.fp32", 4), ("adam_v.fp32", 4)):
        b = np.fromfile(f"{d}/{f}", dtype=np.uint8)
        b = b[:len(b) // e * e]
        x = b.view(np.uint16 if e == 2 else np.uint32)
        mbits = 7 if e == 2 else 23
        xi = x.astype(np.int64)
        se = xi >> mbits
        # the mantissa at its order-0 entropy, byte by byte as stored
        m0 = sum(entropy(b.reshape(-1, e)[:, k]) for k in range(e)) - entropy(se)
        o1 = cond_entropy(se[1:], se[:-1]) + m0
        rot = ((x << 1) | (x >> (8 * e - 1))).astype(x.dtype)
        c = zstandard.ZstdCompressor(level=19)

        def zbits(y):
            return 8 * sum(len(c.compress(p[i:i + (4 << 20) // e]))
                           for p in planes(y, e) for i in range(0, len(p), (4 << 20) // e)) / len(y)
        zp, zr = zbits(x), zbits(rot)
        print(f"{f:14} {o1:18.3f} {zp:15.3f} {zr:8.3f}   (raw {8 * e})")
        raw += 8 * e * len(x)
        order1 += o1 * len(x)
        z_plain += zp * len(x)
        z_rot += zr * len(x)
    print(f"bf16 w + fp32 m, v ratio bounds: order-1 {raw / order1:.3f}, zstd-19 planes {raw / z_plain:.3f}, "
          f"rotated {raw / z_rot:.3f}")


def main():
    d = next((a for a in sys.argv[1:] if not a.startswith("--")), "/tmp/trained")
    mix_bits = mix_raw = 0.0
    print(f"{'file':14} {'plane entropies (bits of 8), low byte first':46} {'planes':>7} {'sign+exp':>9}")
    for f, e in (("weights.bf16", 2), ("weights.fp32", 4), ("adam_m.fp32", 4), ("adam_v.fp32", 4)):
        b = np.fromfile(f"{d}/{f}", dtype=np.uint8)
        b = b[:len(b) // e * e].reshape(-1, e)
        hs = [entropy(b[:, k]) for k in range(e)]
        planes = 8 * e / sum(hs)
        x = b.view(np.uint16 if e == 2 else np.uint32).reshape(-1).astype(np.int64)
        mbits = 7 if e == 2 else 23
        se = x >> mbits  # sign and exponent
        joint = 8 * e / (entropy(se) + mbits)
        print(f"{f:14} {str([round(h, 2) for h in hs]):46} {planes:7.3f} {joint:9.3f}")
        if f != "weights.fp32":
            mix_bits += sum(hs) * len(b)
            mix_raw += 8 * e * len(b)
    print(f"{'bf16 w + fp32 m, v':14} {'':46} {mix_raw / mix_bits:7.3f}")
    if "--context" in sys.argv:
        context_bounds(d)


if __name__ == "__main__":
    main()
