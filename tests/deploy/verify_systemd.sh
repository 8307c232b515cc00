#!/usr/bin/env bash
# systemd-analyze verify on the shipped units, with ExecStart pointing at
# the binary just built (verify checks that it exists). Prints TAP.
set -u
src=$1 ckptd=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s#/usr/sbin/ckptd#$ckptd#" "$src/deploy/systemd/ckptd.service" > "$tmp/ckptd.service"
cp "$src/deploy/systemd/ckptd.socket" "$tmp/ckptd.socket"
echo "1..3"
out=$(cd "$tmp" && systemd-analyze verify ./ckptd.socket ./ckptd.service 2>&1)
if [ $? -eq 0 ] && [ -z "$out" ]; then echo "ok 1 - systemd-analyze verify is clean"; else echo "not ok 1 - systemd-analyze verify"; echo "$out" | sed 's/^/# /'; fi
grep -q '^Type=notify' "$tmp/ckptd.service" && grep -q '^WatchdogSec=' "$tmp/ckptd.service" \
  && echo "ok 2 - Type=notify with a watchdog" || echo "not ok 2 - Type=notify with a watchdog"
grep -q '^LimitMEMLOCK=infinity' "$tmp/ckptd.service" && grep -q '^DeviceAllow=/dev/nvidiactl' "$tmp/ckptd.service" \
  && ! grep -q '^PrivateDevices=yes' "$tmp/ckptd.service" \
  && echo "ok 3 - LimitMEMLOCK, DeviceAllow for NVIDIA, no PrivateDevices" || echo "not ok 3 - hardening"
