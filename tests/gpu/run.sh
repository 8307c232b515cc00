#!/usr/bin/env bash
# Run the real-GPU test: build ckptd and libckpt, build gpu_roundtrip with
# nvcc (or take them from .gpu/, which tests/gpu/device-prepare made on a
# Debian machine: the GPU machine lacks ckptd's libraries), start a ckptd
# with a pool for 2 x SIZE_MB, run, stop.
#   tests/gpu/run.sh [SIZE_MB=1024] [ROUNDS=3]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
mib=${1:-1024}
rounds=${2:-3}
cuda=${CUDA_HOME:-/usr/local/cuda}
carried="$root/.gpu"
if [ -f "$carried/COMMIT" ]; then
  # Made by tests/gpu/device-prepare on a Debian machine and carried here:
  # the binaries and every library they need but the system's own.
  bin="$carried/bin"
  ckptd=("env" "LD_LIBRARY_PATH=$carried/lib" "$bin/ckptd")
  ckptctl=("env" "LD_LIBRARY_PATH=$carried/lib" "$bin/ckptctl")
  roundtrip=("env" "LD_LIBRARY_PATH=$carried/lib" "$bin/gpu_roundtrip")
  export CKPT_LIB="$carried/pylib/libckpt.so" PYTHONPATH="$carried/python${PYTHONPATH:+:$PYTHONPATH}"
  echo "run.sh: the carried build of $(cat "$carried/COMMIT")"
else
  build="$root/build-gpu"
  [ -f "$build/build.ninja" ] || meson setup "$build" "$root" -Dtests=false -Dcuda=enabled >/dev/null
  ninja -C "$build" >/dev/null
  "$cuda/bin/nvcc" -O2 -std=c++17 -o "$build/gpu_roundtrip" "$root/tests/gpu/gpu_roundtrip.cu" \
    -I"$root/client/include" -L"$build/client" -lckpt -L"$cuda/lib64/stubs" -lcuda -Xlinker -rpath="$build/client"
  ckptd=("$build/daemon/ckptd")
  ckptctl=("$build/client/ckptctl")
  roundtrip=("$build/gpu_roundtrip")
fi
work=$(mktemp -d)
trap 'kill $(cat "$work/pid" 2>/dev/null) 2>/dev/null || true; rm -rf "$work"' EXIT
"${ckptd[@]}" --socket "$work/ckptd.sock" --storage "file://$work/store" \
  --state-dir "$work/state" --staging-bytes "$((mib * 2 + 512))M" --chunk-bytes 64M \
  --log-level info 2>"$work/ckptd.log" &
echo $! >"$work/pid"
for _ in $(seq 100); do [ -S "$work/ckptd.sock" ] && break; sleep 0.2; done
"${ckptctl[@]}" --socket "$work/ckptd.sock" status | grep -E "^cuda" || true
rc=0
"${roundtrip[@]}" "$work/ckptd.sock" "$mib" "$rounds" || rc=$?
grep -E "CUDA|pool" "$work/ckptd.log" | head -5
exit $rc
