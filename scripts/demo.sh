#!/usr/bin/env bash
# The main job: build, start ckptd on file:// storage in a temporary
# directory, run the example trainer (save 3 steps, restore, verify) and list
# what storage holds. Usage: [SIZE_MB=256] [STEPS=3] scripts/demo.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh"
build="$root/build"
[ -f "$build/build.ninja" ] || meson setup "$build" "$root" >/dev/null
ninja -C "$build" >/dev/null
tmp=$(mktemp -d /tmp/ckptd-demo.XXXXXX)
sock="$tmp/ckptd.sock"
size_mb=${SIZE_MB:-256}
steps=${STEPS:-3}
# Pool: room for two saves in flight plus slack.
"$build/daemon/ckptd" --socket "$sock" --storage "file://$tmp/store" \
  --staging-bytes "$(( (2 * size_mb + 128) ))M" --state-dir "$tmp/state" \
  2>"$tmp/ckptd.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 1 600); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { cat "$tmp/ckptd.log"; exit 1; }
"$build/client/ckpt-example" --socket "$sock" --job demo --steps "$steps" --size-mb "$size_mb"
echo
"$build/client/ckptctl" --socket "$sock" ls
echo
"$build/client/ckptctl" --socket "$sock" status
