#!/usr/bin/env bash
# Side-by-side numbers for the Core issue's note: ckpt-example saving
# SIZE_MB (default 1024) through ckptd to file:// (sealed memfd, then a
# /dev/shm file staged with pread) against dd conv=fsync of the same size to
# the same filesystem, alternated ROUNDS times. Compare ratios, not absolute
# times: this machine is noisy.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
[ -f "$build/build.ninja" ] || meson setup "$build" "$root" >/dev/null
ninja -C "$build" >/dev/null
size=${SIZE_MB:-1024}
rounds=${ROUNDS:-3}
tmp=$(mktemp -d "${TMPDIR:-/var/tmp}/ckptd-measure.XXXXXX")
sock="$tmp/ckptd.sock"
"$build/daemon/ckptd" --socket "$sock" --storage "file://$tmp/store" \
  --staging-bytes "$((size + 128))M" --state-dir "$tmp/state" 2>"$tmp/ckptd.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 1 600); do [ -S "$sock" ] && break; sleep 0.1; done
grep pool "$tmp/ckptd.log" || true
for i in $(seq 1 "$rounds"); do
  for mode in memfd shm; do
    flag=""; [ $mode = shm ] && flag="--shm"
    line=$("$build/client/ckpt-example" --socket "$sock" --job "m$i$mode" --steps 1 \
             --size-mb "$size" --tensors 8 $flag | awk '$1 == "1" {print "stall_ms " $3 " durable_ms " $4}')
    echo "round $i ckptd ($mode): $line"
  done
  sync
  s=$(date +%s.%N)
  dd if=/dev/zero of="$tmp/dd.bin" bs=1M count="$size" conv=fsync status=none
  e=$(date +%s.%N)
  echo "round $i dd conv=fsync: $(python3 -c "print(f'{($e - $s) * 1000:.1f}')") ms"
  rm -f "$tmp/dd.bin"; rm -rf "$tmp/store"/*; sync
done
