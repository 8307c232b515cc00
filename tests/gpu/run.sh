#!/usr/bin/env bash
# Run the real-GPU test: build ckptd and libckpt, build gpu_roundtrip with
# nvcc, start a ckptd with a pool for 2 x SIZE_MB, run, stop.
#   tests/gpu/run.sh [SIZE_MB=1024] [ROUNDS=3]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
mib=${1:-1024}
rounds=${2:-3}
cuda=${CUDA_HOME:-/usr/local/cuda}
build="$root/build-gpu"
[ -f "$build/build.ninja" ] || meson setup "$build" "$root" -Dtests=false -Dcuda=enabled >/dev/null
ninja -C "$build" >/dev/null
"$cuda/bin/nvcc" -O2 -std=c++17 -o "$build/gpu_roundtrip" "$root/tests/gpu/gpu_roundtrip.cu" \
  -I"$root/client/include" -L"$build/client" -lckpt -L"$cuda/lib64/stubs" -lcuda -Xlinker -rpath="$build/client"
work=$(mktemp -d)
trap 'kill $(cat "$work/pid" 2>/dev/null) 2>/dev/null || true; rm -rf "$work"' EXIT
"$build/daemon/ckptd" --socket "$work/ckptd.sock" --storage "file://$work/store" \
  --state-dir "$work/state" --staging-bytes "$((mib * 2 + 512))M" --chunk-bytes 64M \
  --log-level info 2>"$work/ckptd.log" &
echo $! >"$work/pid"
for _ in $(seq 100); do [ -S "$work/ckptd.sock" ] && break; sleep 0.2; done
"$build/client/ckptctl" --socket "$work/ckptd.sock" status | grep -E "^cuda" || true
rc=0
"$build/gpu_roundtrip" "$work/ckptd.sock" "$mib" "$rounds" || rc=$?
grep -E "CUDA|pool" "$work/ckptd.log" | head -5
exit $rc
