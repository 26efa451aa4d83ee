#!/usr/bin/env bash
# Install what cri-resmgr, its tests and its demo need on Debian 12 (run as root).
# Idempotent: installs only what is missing. Python packages go to ./.venv.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
# fuse3/libfuse3-3: the tests serve a resctrl filesystem with FUSE (this kernel has no RDT).
# chromium: the node picture is tested in a headless browser.
# libseccomp-dev: runc is built with seccomp support. containerd and runc themselves are built
# from the Go module proxy (scripts/build-runtime.sh), not taken from Debian.
for pkg in containernetworking-plugins iptables busybox-static gcc libc6-dev libseccomp-dev pkg-config curl fuse3 libfuse3-3 chromium; do
    have_pkg "$pkg" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${need[@]}"
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    if ! "$PY" -m venv .venv 2>/dev/null; then
        rm -rf .venv
        apt-get install -y -q --no-install-recommends python3-venv
        python3 -m venv .venv
    fi
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'

# containerd 2.x, runc, crictl and critest at the versions tools/go/*/go.mod pin.
bin=${CRI_RESMGR_CACHE:-$HOME/.cache/cri-resmgr}/bin
mkdir -p "$bin"
dirs=$(scripts/build-runtime.sh)  # an assignment, so a failed build stops setup (set -e)
for dir in $dirs; do
    for exe in "$dir"/*; do
        ln -sfn "$exe" "$bin/$(basename "$exe")"
    done
done
