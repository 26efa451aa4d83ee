#!/usr/bin/env bash
# Build the Go programs the tests run against - containerd, its runc shim, ctr, runc,
# crictl and critest; kubelet, kube-apiserver, kubectl and etcd; helm; kube-scheduler with the
# scheduler-plugins (NodeResourceTopologyMatch) - from the Go module proxy,
# at the versions pinned by the go.mod files under tools/go/. Nothing of their source lives
# in this repository.
#
# Binaries are cached under ~/.cache/cri-resmgr/go/<component>-<version>-<hash of go.mod
# and go.sum>/bin, so a second run builds nothing. Prints the bin directories, one per line
# (scripts/setup.sh links them into ~/.cache/cri-resmgr/bin).
#
#   build-runtime.sh [COMPONENT...]    build these (default: all) and print their bin directories
#   build-runtime.sh --cached COMPONENT  print its bin directory if it is built, else exit 1
#   build-runtime.sh --version COMPONENT print the version pinned
#
# Components: containerd runc critools kubernetes etcd helm schedulerplugins containerd-vm (the
# VM tier's node runs a later containerd than the tests on this host: tools/go/containerd-vm/go.mod).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${CRI_RESMGR_CACHE:-$HOME/.cache/cri-resmgr}
export GOFLAGS=-mod=readonly GOTOOLCHAIN=local
# Go is often installed outside the default PATH of non-interactive shells.
for d in /usr/local/go/bin "$HOME/go/bin" /usr/lib/go/bin; do
    command -v go >/dev/null || { [ -x "$d/go" ] && PATH="$d:$PATH"; }
done
command -v go >/dev/null || { echo "build-runtime: Go is needed (go 1.26 or newer, on PATH)" >&2; exit 1; }

# version of module $2 required by tools/go/$1/go.mod
TOOLS=$PWD/tools/go
pinned() { awk -v m="$2" '$1 == m { print $2; exit }' "$TOOLS/$1/go.mod"; }

# The programs each component's build makes (part of its cache key: a new one rebuilds it).
declare -A PROGRAMS=([containerd]="containerd containerd-shim-runc-v2 ctr" [runc]=runc [critools]="crictl critest"
                     [containerd-vm]="containerd containerd-shim-runc-v2 ctr"
                     [kubernetes]="kubelet kube-apiserver kubectl kube-controller-manager kube-scheduler"
                     [etcd]=etcd [helm]=helm [schedulerplugins]=kube-scheduler-plugins)

# out_dir COMPONENT MODULE: the cache directory for this pin
out_dir() {
    local key
    key=$(cat "tools/go/$1/go.mod" "tools/go/$1/go.sum" - <<<"${PROGRAMS[$1]}" | sha256sum | cut -c1-12)
    echo "$CACHE/go/$1-$(pinned "$1" "$2")-$key"
}

build() {  # COMPONENT MODULE: build into the cache unless it is there
    local comp=$1 mod=$2 out version
    out=$(out_dir "$comp" "$mod")
    version=$(pinned "$comp" "$mod")
    if [ -f "$out/.done" ]; then
        echo "$out/bin"
        return
    fi
    echo "build-runtime: building $comp $version (cached in $out)" >&2
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp/bin"
    (
        cd "tools/go/$comp"
        case $comp in
        containerd|containerd-vm)
            # Snapshotters the tests do not use and that need C headers are left out.
            go build -trimpath -tags "no_btrfs no_zfs no_devmapper" \
                -ldflags "-s -w -X $mod/version.Version=$version -X $mod/version.Package=$mod" \
                -o "$out.tmp/bin/" \
                "$mod/cmd/containerd" "$mod/cmd/containerd-shim-runc-v2" "$mod/cmd/ctr" ;;
        runc)
            CGO_ENABLED=1 go build -trimpath -tags seccomp \
                -ldflags "-s -w -X main.version=${version#v}" -o "$out.tmp/bin/runc" "$mod" ;;
        critools)
            go build -trimpath -ldflags "-s -w -X $mod/pkg/version.Version=$version" \
                -o "$out.tmp/bin/crictl" "$mod/cmd/crictl"
            # critest is a Go test binary (ginkgo), as cri-tools' own Makefile builds it.
            go test -c -trimpath -ldflags "-s -w -X $mod/pkg/version.Version=$version" \
                -o "$out.tmp/bin/critest" "$mod/cmd/critest" ;;
        kubernetes)
            # Built outside its own tree the version reads v0.0.0-master unless stamped.
            local minor=${version#v1.}
            minor=${minor%%.*}
            local v=k8s.io/component-base/version
            go build -trimpath -ldflags "-s -w -X $v.gitVersion=$version -X $v.gitMajor=1 -X $v.gitMinor=$minor" \
                -o "$out.tmp/bin/" $(printf "$mod/cmd/%s " ${PROGRAMS[kubernetes]}) ;;
        etcd)
            go build -trimpath -ldflags "-s -w" -o "$out.tmp/bin/etcd" "$mod" ;;
        helm)
            go build -trimpath -ldflags "-s -w -X $mod/internal/version.version=$version" \
                -o "$out.tmp/bin/helm" "$mod/cmd/helm" ;;
        schedulerplugins)
            # kube-scheduler with every plugin of the release compiled in, as its own image ships it.
            # It must say the Kubernetes version it is built on: its compatibility checks read that.
            local kube minor v=k8s.io/component-base/version
            kube=$(pinned schedulerplugins k8s.io/kubernetes)
            minor=${kube#v1.}
            minor=${minor%%.*}
            go build -trimpath -ldflags "-s -w -X $v.gitVersion=$kube -X $v.gitMajor=1 -X $v.gitMinor=$minor" \
                -o "$out.tmp/bin/kube-scheduler-plugins" "$mod/cmd/scheduler" ;;
        esac
    ) >&2
    touch "$out.tmp/.done"
    rm -rf "$out"
    mv "$out.tmp" "$out"
    echo "$out/bin"
}

declare -A MODULE=([containerd]=github.com/containerd/containerd/v2 [containerd-vm]=github.com/containerd/containerd/v2
                   [runc]=github.com/opencontainers/runc
                   [critools]=sigs.k8s.io/cri-tools [kubernetes]=k8s.io/kubernetes
                   [etcd]=go.etcd.io/etcd/server/v3 [helm]=helm.sh/helm/v4
                   [schedulerplugins]=sigs.k8s.io/scheduler-plugins)
ALL=(containerd runc critools kubernetes etcd helm schedulerplugins containerd-vm)
module() {
    [ -n "${MODULE[$1]:-}" ] || { echo "build-runtime: unknown component '$1' (${ALL[*]})" >&2; exit 2; }
    echo "${MODULE[$1]}"
}

case ${1:-} in
--cached)
    out=$(out_dir "$2" "$(module "$2")")
    [ -f "$out/.done" ] && echo "$out/bin" ;;
--version)
    pinned "$2" "$(module "$2")" ;;
*)
    [ $# -gt 0 ] || set -- "${ALL[@]}"
    for comp in "$@"; do
        build "$comp" "$(module "$comp")"
    done ;;
esac
