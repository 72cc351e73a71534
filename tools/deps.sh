#!/bin/sh
# tools/deps.sh - installs the Debian packages dtrain's build and tests need, when they are missing.
# Run as root (or with sudo available). Extra package names may be given as arguments.
set -e
need="make gcc g++ libc6-dev clang clang-16 libclang-rt-14-dev libomp-dev zlib1g-dev libstb-dev dataset-fashion-mnist mpich libmpich-dev gnuplot-nox cmake pkg-config gcc-aarch64-linux-gnu libc6-dev-arm64-cross gcc-s390x-linux-gnu libc6-dev-s390x-cross qemu-user mingw-w64 wine64 musl-tools python3-torch $*"
missing=""
for p in $need; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "tools/deps.sh: installing$missing"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
