#!/usr/bin/env bash
# Install the Debian 12 packages ckptd builds and tests with. Idempotent:
# does nothing when they are all present.
set -euo pipefail
pkgs=(meson ninja-build pkg-config gcc python3
      libuv1-dev libssl-dev libprotobuf-c-dev protobuf-c-compiler libsystemd-dev
      libcmocka-dev libcurl4-openssl-dev libisal-dev libjson-c-dev libexpat1-dev
      libinih-dev libzstd-dev libxxhash-dev systemd python3-yaml python3-venv gnuplot-nox clang-format clang
      fuse3 libfuse3-dev radosgw ceph-mon ceph-osd)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "installing: ${missing[*]}" >&2
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
