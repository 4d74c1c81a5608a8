#!/bin/sh
# Installs the Debian packages that the optional features need:
# * `cargo build -p weft-transport --features ofi`: libfabric 1.17 headers + library, its
#   utilities (fi_info, fi_pingpong), libclang for bindgen, and pkg-config;
# * `cargo build -p weft --features hwloc`: libhwloc-dev (hwloc 2.x, found through pkg-config);
# * `cargo build -p weft --features pmix`: libpmix-dev (PMIx 4.x, found through pkg-config),
#   and openmpi-bin, whose `mpirun` serves PMIx to the multi-process tests' ranks.
# Does nothing when they are already installed.
set -eu
PKGS="libfabric-dev libfabric-bin libclang-dev pkg-config libhwloc-dev libpmix-dev openmpi-bin"
missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
if [ -z "$missing" ]; then
    echo "ofi-deps: already installed: $PKGS"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "ofi-deps: installing:$missing"
$SUDO apt-get update
# shellcheck disable=SC2086
$SUDO apt-get install -y --no-install-recommends $missing
