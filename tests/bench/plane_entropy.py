#!/usr/bin/env python3
"""How far any lossless byte-plane coder can go on a trained state
(trained_state.py's --out): the order-0 entropy of every byte plane of
each file, and of the sign and exponent taken together, with the ratio
each bound allows when the rest (the mantissa) is stored as it is. The
plane codec's measured ratios (codec_bench --dir) are to be read against
these: a ratio above the order-0 bound comes from zstd's longer matches
(zeros, repeated rows), not from the mantissa, whose planes hold 8 bits of
entropy per byte.

    .venv-test/bin/python tests/bench/plane_entropy.py /tmp/trained
"""
import sys

import numpy as np


def entropy(a):
    c = np.bincount(a).astype(np.float64)
    p = c[c > 0] / c.sum()
    return float(-(p * np.log2(p)).sum())


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "/tmp/trained"
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


if __name__ == "__main__":
    main()
