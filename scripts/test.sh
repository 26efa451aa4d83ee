#!/usr/bin/env bash
# Run the whole test suite: lint (code and the Helm chart), unit and integration tests against a private containerd,
# then CRI conformance (critest) directly and through the relay. Arguments go to pytest;
# naming tests (tests/...), choosing by marker (-m unit) or --no-critest (or CRIRM_CRITEST=0) leaves
# conformance out.
#
# --vm runs the VM tier instead: the test node booted as a virtual machine shaped like production
# (systemd, cgroup v2, the systemd cgroup driver, 2 sockets x 2 NUMA nodes; tests/vm/); with
# --vm-soak it ends with the soak's short form (tests/vm/test_soak.py; benchmarks/soak.py runs it
# for hours). --with-vm runs everything, the VM tier beside the conformance runs (those mostly
# wait on containers; the emulated node keeps one core busy).
set -euo pipefail
cd "$(dirname "$0")/.."
for arg in "$@"; do
    if [ "$arg" = --vm ]; then
        scripts/setup.sh vm
        args=()
        for a in "$@"; do [ "$a" = --vm ] || args+=("$a"); done
        exec .venv/bin/python -m pytest -m vm -p no:cacheprovider tests/vm/ "${args[@]}"
    fi
done
scripts/setup.sh test
critest=${CRIRM_CRITEST:-1}
with_vm=0
args=()
vm_args=()
for arg in "$@"; do
    case $arg in
    --no-critest) critest=0 ;;
    --with-vm) with_vm=1 ;;
    tests*|-m) critest=0; args+=("$arg") ;;
    -q|-v|--durations=*) args+=("$arg"); vm_args+=("$arg") ;;
    *) args+=("$arg") ;;
    esac
done
[ "$with_vm" = 0 ] || scripts/setup.sh vm
.venv/bin/ruff check .
# The Helm chart: lint here, rendered and applied to a real API server by tests/cluster/test_chart.py.
"${CRI_RESMGR_CACHE:-$HOME/.cache/cri-resmgr}/bin/helm" lint --strict deployment/helm/cri-resmgr
.venv/bin/python -m pytest "${args[@]}"
conformance=0
if [ "$critest" != 0 ]; then
    if [ "$with_vm" = 1 ]; then
        .venv/bin/python -m harness.conformance &
        conformance=$!
    else
        .venv/bin/python -m harness.conformance
    fi
fi
if [ "$with_vm" = 1 ]; then
    vm=0
    .venv/bin/python -m pytest -m vm -p no:cacheprovider tests/vm/ "${vm_args[@]}" || vm=$?
    if [ "$conformance" != 0 ]; then wait "$conformance"; fi
    exit "$vm"
fi
