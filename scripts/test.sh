#!/usr/bin/env bash
# Install what is needed (Debian packages, and a Python venv with torch from
# PyPI), build twice (plain, and ASan+UBSan), run every suite, and end with
# "N passed, N failed[, N skipped]". The python suite runs in the plain
# build (libckpt under ASan cannot be loaded into an uninstrumented python).
# Arguments go to meson test (e.g. --suite unit). Exits non-zero when meson
# test fails or the summary does (scripts/test_summary.py: a failure, no
# pass, a declared case that did not run, no test matching the selection).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh" || exit 1
venv="$root/.venv-test"
"$root/scripts/venv.sh" "$venv" || { echo "cannot make the python test venv" >&2; exit 1; }
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
status=0
builds=()
for variant in plain asan; do
  build="$root/build-test-$variant"
  opts=(-Dtests=true "-Dtest_s3_python=$venv/bin/python")
  [ "$variant" = plain ] && opts+=("-Dtest_python=$venv/bin/python")
  [ "$variant" = asan ] && opts+=(-Db_sanitize=address,undefined -Db_lundef=false)
  if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" "$root" "${opts[@]}" || exit 1
  else
    meson setup --reconfigure "$build" "$root" "${opts[@]}" >/dev/null || exit 1
  fi
  ninja -C "$build" || exit 1
  echo "=== meson test ($variant) ==="
  # No log of an earlier run may be counted; the list is what this selection
  # declares, to compare with what ran.
  rm -f "$build"/meson-logs/testlog.* "$build/meson-logs/testlist.txt"
  meson test -C "$build" --list --no-rebuild "$@" > "$build/meson-logs/testlist.txt"
  meson test -C "$build" --print-errorlogs --num-processes 1 "$@" \
    || { echo "meson test ($variant) failed: exit status $?"; status=1; }
  builds+=("$build")
done
python3 "$root/scripts/test_summary.py" "${builds[@]}" || status=1
exit $status
