#!/usr/bin/env bash
# Install what is needed, build twice (plain, and ASan+UBSan), run every
# test suite in both builds, and end with "N passed, N failed[, N skipped]".
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh" || exit 1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
status=0
logs=()
for variant in plain asan; do
  build="$root/build-test-$variant"
  opts=(-Dtests=true)
  [ "$variant" = asan ] && opts+=(-Db_sanitize=address,undefined -Db_lundef=false)
  if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" "$root" "${opts[@]}" || exit 1
  fi
  ninja -C "$build" || exit 1
  echo "=== meson test ($variant) ==="
  meson test -C "$build" --print-errorlogs --num-processes 1 "$@" || status=1
  logs+=("$build/meson-logs/testlog.json")
done
python3 "$root/scripts/test_summary.py" "${logs[@]}" || status=1
exit $status
