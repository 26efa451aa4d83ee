#!/usr/bin/env bash
# Install what cri-resmgr, its tests and its demo need on Debian 12 (run as root).
# Idempotent: installs only what is missing. Python packages go to ./.venv.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
# fuse3/libfuse3-3: the tests serve a resctrl filesystem with FUSE (this kernel has no RDT).
for pkg in containerd runc containernetworking-plugins iptables busybox-static gcc libc6-dev curl fuse3 libfuse3-3; do
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
