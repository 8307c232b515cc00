#!/usr/bin/env bash
# systemd-analyze verify on the shipped units, with ExecStart pointing at
# the binary just built (verify checks that it exists). Prints TAP.
set -u
src=$1 ckptd=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s#/usr/sbin/ckptd#$ckptd#" "$src/deploy/systemd/ckptd.service" > "$tmp/ckptd.service"
cp "$src/deploy/systemd/ckptd.socket" "$tmp/ckptd.socket"
echo "1..5"
out=$(cd "$tmp" && systemd-analyze verify ./ckptd.socket ./ckptd.service 2>&1)
if [ $? -eq 0 ] && [ -z "$out" ]; then echo "ok 1 - systemd-analyze verify is clean"; else echo "not ok 1 - systemd-analyze verify"; echo "$out" | sed 's/^/# /'; fi
grep -q '^Type=notify' "$tmp/ckptd.service" && grep -q '^WatchdogSec=' "$tmp/ckptd.service" \
  && echo "ok 2 - Type=notify with a watchdog" || echo "not ok 2 - Type=notify with a watchdog"
grep -q '^LimitMEMLOCK=infinity' "$tmp/ckptd.service" && grep -q '^DeviceAllow=/dev/nvidiactl' "$tmp/ckptd.service" \
  && ! grep -q '^PrivateDevices=yes' "$tmp/ckptd.service" \
  && echo "ok 3 - LimitMEMLOCK, DeviceAllow for NVIDIA, no PrivateDevices" || echo "not ok 3 - hardening"
# Issue "Security": exposure 2.0 or less, files private, syscalls filtered.
if command -v systemd-analyze >/dev/null && systemd-analyze security --help 2>&1 | grep -q -- --offline; then
  sec=$(cd "$tmp" && systemd-analyze security --offline=true --threshold=20 ./ckptd.service 2>&1)
  rc=$?
  level=$(echo "$sec" | grep -o 'exposure level for ckptd.service: [0-9.]*' | grep -o '[0-9.]*$')
  [ $rc -eq 0 ] && [ -n "$level" ] && echo "ok 4 - systemd-analyze security: exposure $level (at most 2.0)" \
    || { echo "not ok 4 - systemd-analyze security: exposure ${level:-?} (want at most 2.0)"; echo "$sec" | grep '✗' | sed 's/^/# /'; }
else
  echo "ok 4 # SKIP systemd-analyze security --offline needs systemd 250 or later"
fi
grep -q '^UMask=0077' "$tmp/ckptd.service" && grep -q '^SystemCallFilter=@system-service' "$tmp/ckptd.service" \
  && grep -q '^User=ckptd' "$tmp/ckptd.service" && grep -q '^u ckptd ' "$src/deploy/systemd/ckptd.sysusers" \
  && echo "ok 5 - UMask=0077, @system-service, its own user (sysusers.d)" || echo "not ok 5 - UMask, SystemCallFilter, User"
