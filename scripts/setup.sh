#!/usr/bin/env bash
# Install what cri-resmgr's demo, tests or VM tests need on Debian 12 (run as root), and nothing more:
#
#   scripts/setup.sh demo   Debian packages for pods, the Python venv, containerd and runc
#   scripts/setup.sh test   the demo's, plus cri-tools, Kubernetes, etcd, helm, the scheduler plugins and Chromium (default)
#   scripts/setup.sh vm     the tests', plus qemu and mmdebstrap, and the test node's disk image
#
# Idempotent: installs and builds only what is missing. Python packages go to ./.venv; Go programs
# are built from the Go module proxy at the versions tools/go/*/go.mod pin and cached under
# ~/.cache/cri-resmgr/. Each step is shown with the time it takes on a 2-core machine; the tools'
# own output goes to ~/.cache/cri-resmgr/setup.log, which a failure points to.
set -euo pipefail
cd "$(dirname "$0")/.."

part=${1:-test}
case $part in
demo|test|vm) ;;
-h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
*) echo "setup: unknown part '$part' (demo, test or vm)" >&2; exit 2 ;;
esac

CACHE=${CRI_RESMGR_CACHE:-$HOME/.cache/cri-resmgr}
mkdir -p "$CACHE/bin"
LOG=$CACHE/setup.log
echo "=== setup $part $(date -u +%FT%TZ)" >>"$LOG"

have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# The steps of this part, each "title|about how long|command", run in order when not done yet.
steps=()
add() { steps+=("$1|$2|$3"); }

# Debian packages: CNI plugins, iptables and busybox for pods (the busybox test image is made from
# busybox-static); gcc, libseccomp-dev and pkg-config to build runc with seccomp; fuse3 for the
# resctrl file system the tests serve (this kernel has no RDT); Chromium for the node picture's
# test; mmdebstrap, umoci and python3-venv for the container image (scripts/build-image.py) and
# the host package; qemu and e2fsprogs for the VM tests.
pkgs=(containernetworking-plugins iptables busybox-static gcc libc6-dev libseccomp-dev pkg-config curl)
[ "$part" = demo ] || pkgs+=(fuse3 libfuse3-3 chromium mmdebstrap umoci python3-venv)
[ "$part" = vm ] && pkgs+=(qemu-system-x86 qemu-utils e2fsprogs)
need=()
for pkg in "${pkgs[@]}"; do have_pkg "$pkg" || need+=("$pkg"); done
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && apt-get install -y -q --no-install-recommends "${need[@]}"
}
[ ${#need[@]} -eq 0 ] || add "Debian packages: ${need[*]}" "1-3 min" apt_install

PY=${PYTHON:-python3}
venv() {
    if [ ! -x .venv/bin/python ] && ! "$PY" -m venv .venv; then
        rm -rf .venv
        apt-get install -y -q --no-install-recommends python3-venv && python3 -m venv .venv
    fi
    .venv/bin/python -m pip install --disable-pip-version-check -e '.[test]'
}
# pip's own check is quick when everything is there, but it prints nothing worth a step then.
if [ -x .venv/bin/python ] && .venv/bin/python -c 'import resmgr, grpc_tools, pytest' 2>/dev/null \
        && [ .venv/.setup-stamp -nt pyproject.toml ]; then :; else
    add "Python packages into ./.venv" "1 min" venv
fi

# Go programs: name, about how long, modules (scripts/build-runtime.sh knows how).
components=(containerd runc)
[ "$part" = demo ] || components+=(critools kubernetes etcd helm schedulerplugins)
declare -A about=([containerd]="3 min" [runc]="1 min" [critools]="3 min" [kubernetes]="7 min"
                  [etcd]="1 min" [helm]="2 min" [schedulerplugins]="4 min")
build_one() {  # COMPONENT: build it and link its programs
    local dir exe
    dir=$(scripts/build-runtime.sh "$1") || return 1
    for exe in "$dir"/*; do ln -sfn "$exe" "$CACHE/bin/$(basename "$exe")"; done
}
for comp in "${components[@]}"; do
    if ! scripts/build-runtime.sh --cached "$comp" >/dev/null 2>&1; then
        add "building $comp $(scripts/build-runtime.sh --version "$comp") from the Go module proxy" "${about[$comp]}" \
            "build_one $comp"
    fi
done

# The VM node's containerd (a later release than the host's: NRI without the UpdateContainers
# deadlock) goes only into its disk image, so it is not linked beside the host's.
if [ "$part" = vm ] && ! scripts/build-runtime.sh --cached containerd-vm >/dev/null 2>&1; then
    add "building the VM node's containerd $(scripts/build-runtime.sh --version containerd-vm) from the Go module proxy" \
        "3 min" "scripts/build-runtime.sh containerd-vm"
fi

if [ "$part" != demo ] && ! python3 scripts/build-image.py --cached; then
    add "the container image's base layers (Debian 12 by mmdebstrap, the Python dependencies)" "2 min" \
        "python3 scripts/build-image.py $CACHE/image/out"
fi

vm_image() { link_built && .venv/bin/python -m harness.vmimage; }
if [ "$part" = vm ] && ! { [ -x .venv/bin/python ] && .venv/bin/python -m harness.vmimage --cached >/dev/null 2>&1; }; then
    add "the test node's disk image (Debian 12 by mmdebstrap, the Go programs, the Python venv)" "2-3 min" vm_image
fi

# Links of every cached Go build, also of builds made by an earlier run.
link_built() {
    local dir
    for comp in "${components[@]}"; do
        dir=$(scripts/build-runtime.sh --cached "$comp" 2>/dev/null) || continue
        for exe in "$dir"/*; do ln -sfn "$exe" "$CACHE/bin/$(basename "$exe")"; done
    done
}

link_built
total=${#steps[@]}
n=0
for s in "${steps[@]}"; do
    IFS='|' read -r title about fn <<<"$s"
    n=$((n + 1))
    echo "setup [$n/$total] $title (about $about here) ..." >&2
    echo "--- [$n/$total] $title" >>"$LOG"
    start=$SECONDS
    # shellcheck disable=SC2086 # the command is a function name and its arguments
    if ! $fn >>"$LOG" 2>&1; then
        echo "setup [$n/$total] failed: $title. The last lines of $LOG:" >&2
        tail -n 25 "$LOG" | sed 's/^/    /' >&2
        exit 1
    fi
    echo "setup [$n/$total] done in $((SECONDS - start)) s" >&2
    [ "$fn" = venv ] && touch .venv/.setup-stamp
done
link_built
[ "$total" -eq 0 ] || echo "setup: $part ready (log: $LOG)" >&2
