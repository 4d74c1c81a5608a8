#!/bin/sh
# Installs the Debian packages that `cargo build -p weft-transport --features ofi` needs:
# libfabric 1.17 headers + library, its utilities (fi_info, fi_pingpong), libclang for
# bindgen, and pkg-config. Does nothing when they are already installed.
set -eu
PKGS="libfabric-dev libfabric-bin libclang-dev pkg-config"
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
