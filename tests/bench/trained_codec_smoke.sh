#!/bin/sh
# A tiny trained model (trained_state.py) through codec_bench --dir: that
# both run and that the bench reads what the script writes, with the row
# issue 39's target is about. usage: trained_codec_smoke.sh PYTHON CODEC_BENCH
set -eu
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
"$1" "$(dirname "$0")/trained_state.py" --out "$d" --steps 3 --vocab 256 --d 32 --layers 1 --heads 2 --seq 16 --batch 4
"$2" --dir "$d" --reps 1 --levels -500 >"$d/out"
cat "$d/out"
for f in weights.fp32 weights.bf16 adam_m.fp32 adam_v.fp32 "bf16 w + fp32 m, v"; do
	grep -q "planes .* $f " "$d/out" || { echo "no row for $f" >&2; exit 1; }
done
