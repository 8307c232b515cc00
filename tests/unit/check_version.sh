#!/usr/bin/env bash
# Every installed binary answers --version with its name, the project's
# version and the commit, and exits 0. Prints TAP.
#   check_version.sh VERSION BINARY...
version=$1; shift
echo "1..$#"
i=0; bad=0
for b in "$@"; do
  i=$((i + 1)); name=$(basename "$b")
  out=$("$b" --version 2>&1); rc=$?
  if [ $rc -eq 0 ] && [[ "$out" =~ ^$name\ $version\ \(commit\ ([0-9a-f]{7,}|unknown)[,\)] ]]; then
    echo "ok $i - $name --version: $out"
  else
    echo "not ok $i - $name --version (rc $rc): $out"; bad=1
  fi
done
exit $bad
