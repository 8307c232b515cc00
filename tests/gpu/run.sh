#!/usr/bin/env bash
# The real-GPU checks (docs/cuda.md "CUDA"), on a machine with a GPU:
#  1. gpu_roundtrip (C, nvcc): legacy IPC and VMM buffers, saved after a
#     kernel without synchronising, restored from memory and from storage
#     and checked on the GPU; D2H and H2D against cudaMemcpyAsync; a
#     buffer freed and allocated again;
#  2. pytest tests/gpu (needs python3 with torch and pytest): ckpt.torch
#     with a model and Adam on CUDA under both allocators, a second process
#     restoring bit-exact, a trainer SIGKILLed between staged and durable
#     (nvidia-smi's memory before and after), a freed and reallocated
#     tensor;
#  3. with --bench: tests/gpu/bench.py, the speed table (GIB=10 GiB state
#     dict in 2000 tensors: ckpt against torch.save and DCP async_save).
# Binaries come from .gpu/, which tests/gpu/device-prepare made on a
# Debian machine (the GPU machine lacks ckptd's libraries), or are built
# here when it is not there.
#   tests/gpu/run.sh [--bench] [SIZE_MB=1024] [ROUNDS=3]
# Environment: GIB (bench state, default 10), TENSORS (default 2000),
# BENCH_ROUNDS (default 3), ONLY (roundtrip,pytest,bench: a subset),
# STORE_ROOT (where the daemons' storage and the bench's files go, default
# a temporary folder; /dev/shm keeps a slow disk out of the timings),
# BENCH_ONLY (bench.py --only: ckpt,torch_save,dcp,...), BENCH_DAEMON_ARGS
# (more ckptd arguments for the bench's daemon: --set pool.verify_held=false).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bench=0
if [ "${1:-}" = "--bench" ]; then
  bench=1
  shift
fi
mib=${1:-1024}
rounds=${2:-3}
only=${ONLY:-roundtrip,pytest$([ $bench = 1 ] && echo ,bench)}
cuda=${CUDA_HOME:-/usr/local/cuda}
carried="$root/.gpu"
work=$(mktemp -d)
mkdir -p "$work/bin"
if [ -f "$carried/COMMIT" ]; then
  # Made by tests/gpu/device-prepare and carried here: the binaries and
  # every library they need but the system's own. Prepended, so that the
  # driver is still found where this machine's own path says.
  libs="$carried/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  for b in ckptd ckptctl gpu_roundtrip; do
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$libs" "$carried/bin/$b" >"$work/bin/$b"
    chmod +x "$work/bin/$b"
  done
  export CKPT_LIB="$carried/pylib/libckpt.so"
  # Python processes (pytest, the trainers, the bench) find libckpt's one
  # library there (this machine has no libprotobuf-c); pylib holds nothing
  # else, so torch keeps the machine's own libraries.
  export LD_LIBRARY_PATH="$carried/pylib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if [ "$(cd "$root" && tests/gpu/sources-digest)" != "$(cat "$carried/SOURCES" 2>/dev/null)" ]; then
    echo "run.sh: .gpu/ was built from other sources than these: run tests/gpu/device-prepare again" >&2
    exit 1
  fi
  echo "run.sh: the carried build of $(cat "$carried/COMMIT")"
else
  build="$root/build-gpu"
  [ -f "$build/build.ninja" ] || meson setup "$build" "$root" -Dtests=false -Dcuda=enabled >/dev/null || exit 1
  ninja -C "$build" >/dev/null || exit 1
  "$cuda/bin/nvcc" -O2 -std=c++17 -o "$build/gpu_roundtrip" "$root/tests/gpu/gpu_roundtrip.cu" \
    -I"$root/client/include" -L"$build/client" -lckpt -L"$cuda/lib64/stubs" -lcuda \
    -Xlinker -rpath="$build/client" || exit 1
  ln -s "$build/daemon/ckptd" "$build/client/ckptctl" "$build/gpu_roundtrip" "$work/bin/"
  export CKPT_LIB="$build/client/libckpt.so"
fi
export PYTHONPATH="$root/client/python${PYTHONPATH:+:$PYTHONPATH}"
daemon_pid=
stop_daemon() {
  if [ -n "$daemon_pid" ]; then
    kill "$daemon_pid" 2>/dev/null
    wait "$daemon_pid" 2>/dev/null
    daemon_pid=
  fi
}
trap 'stop_daemon; rm -rf "$work" ${STORE_ROOT:+"$STORE_ROOT/rt" "$STORE_ROOT/bench" "$STORE_ROOT/bench-files"}' EXIT
# start_daemon NAME STAGING [--set ...]: a ckptd on $work/NAME.sock, its
# storage in $STORE_ROOT/NAME (default $work)
start_daemon() {
  local name=$1 staging=$2 store="${STORE_ROOT:-$work}/$1/store"
  shift 2
  rm -rf "${work:?}/$name" "$store"
  mkdir -p "$work/$name" "$(dirname "$store")"
  "$work/bin/ckptd" --socket "$work/$name.sock" --storage "file://$store" \
    --state-dir "$work/$name/state" --staging-bytes "$staging" --chunk-bytes 64M --log-level info "$@" \
    2>"$work/$name.log" &
  daemon_pid=$!
  # (a large pool is pre-faulted before the socket appears)
  for _ in $(seq 900); do
    [ -S "$work/$name.sock" ] && break
    kill -0 "$daemon_pid" 2>/dev/null || { echo "ckptd exited:"; tail -5 "$work/$name.log"; break; }
    sleep 0.2
  done
  "$work/bin/ckptctl" --socket "$work/$name.sock" status | grep -E "^cuda" || true
}
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader 2>/dev/null || true
fail=()

if [[ ,$only, == *,roundtrip,* ]]; then
  echo "== gpu_roundtrip $mib MiB x 2, $rounds rounds"
  start_daemon rt "$((mib * 2 + 512))M"
  rc=0
  "$work/bin/gpu_roundtrip" "$work/rt.sock" "$mib" "$rounds" || rc=$?
  grep -E "CUDA|pool|error" "$work/rt.log" | head -8
  stop_daemon
  [ $rc = 0 ] || fail+=("gpu_roundtrip (exit $rc)")
fi

if [[ ,$only, == *,pytest,* ]]; then
  echo "== pytest tests/gpu"
  if ! python3 -c "import torch, pytest" 2>/dev/null; then
    fail+=("pytest: python3 has no torch or pytest")
  else
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
    rc=0
    CKPTD_BIN="$work/bin/ckptd" python3 -m pytest -q -s -rs -p no:cacheprovider "$root/tests/gpu" || rc=$?
    [ $rc = 0 ] || fail+=("pytest tests/gpu (exit $rc)")
  fi
fi

if [[ ,$only, == *,bench,* ]]; then
  gib=${GIB:-10}
  echo "== bench: ${gib} GiB in ${TENSORS:-2000} tensors"
  # shellcheck disable=SC2086 # BENCH_DAEMON_ARGS: several words
  start_daemon bench "$(python3 -c "print(int(($gib * 2 + 1) * 1024))")M" --set retention.keep_last=1 ${BENCH_DAEMON_ARGS:-}
  rc=0
  python3 "$root/tests/gpu/bench.py" --socket "$work/bench.sock" --dir "${STORE_ROOT:-$work}/bench-files" --gib "$gib" \
    --tensors "${TENSORS:-2000}" --rounds "${BENCH_ROUNDS:-3}" ${BENCH_ONLY:+--only "$BENCH_ONLY"} || rc=$?
  grep -E "CUDA|pool|error" "$work/bench.log" | head -8
  stop_daemon
  [ $rc = 0 ] || fail+=("bench (exit $rc)")
fi

if [ ${#fail[@]} -gt 0 ]; then
  printf 'run.sh: FAILED: %s\n' "${fail[@]}"
  exit 1
fi
echo "run.sh: all passed ($only)"
