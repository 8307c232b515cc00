#!/usr/bin/env bash
# The C sources are as clang-format (the repository's .clang-format) lays
# them out. Exit 77 (skipped, and counted so) without clang-format.
set -euo pipefail
cd "$1"
command -v clang-format >/dev/null || { echo "clang-format not installed"; exit 77; }
mapfile -t files < <(find daemon client proto common -name '*.[ch]' | sort)
[ "${#files[@]}" -gt 50 ] || { echo "only ${#files[@]} sources under $1"; exit 1; }
if ! clang-format --dry-run --Werror "${files[@]}"; then
  echo "not formatted: run clang-format -i on the files named above"
  exit 1
fi
echo "${#files[@]} files formatted"
