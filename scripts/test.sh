#!/usr/bin/env bash
# Run the whole test suite: lint (code and the Helm chart), unit and integration tests against a private containerd,
# then CRI conformance (critest) directly and through the relay. Arguments go to pytest;
# naming tests (tests/...), choosing by marker (-m unit) or --no-critest (or CRIRM_CRITEST=0) leaves
# conformance out.
#
# --vm runs the VM tier instead: the test node booted as a virtual machine shaped like production
# (systemd, cgroup v2, the systemd cgroup driver, 2 sockets x 2 NUMA nodes; tests/vm/); with
# --vm-soak it ends with the soak's short form (tests/vm/test_soak.py; benchmarks/soak.py runs it
# for hours). --with-vm runs everything at once in three lanes: the VM tier (and its soak with
# --vm-soak), the conformance runs and the suite, the last two a little below the emulator's
# priority (one host thread runs the whole emulated node, whose pace the soak's deadlines assume;
# the host's tests mostly wait on containers and kubelet).
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
    --vm-soak*) vm_args+=("$arg") ;;  # --vm-soak, --vm-soak-seconds=N, --vm-soak-mode=nri
    --soak-seed=*) args+=("$arg"); vm_args+=("$arg") ;;
    *) args+=("$arg") ;;
    esac
done
[ "$with_vm" = 0 ] || scripts/setup.sh vm
.venv/bin/ruff check .
# The Helm chart: lint here, rendered and applied to a real API server by tests/cluster/test_chart.py.
"${CRI_RESMGR_CACHE:-$HOME/.cache/cri-resmgr}/bin/helm" lint --strict deployment/helm/cri-resmgr
if [ "$with_vm" = 0 ]; then
    .venv/bin/python -m pytest "${args[@]}"
    [ "$critest" = 0 ] || .venv/bin/python -m harness.conformance
    exit 0
fi
# Three lanes from here: the VM tier, the conformance runs and the suite, the last in the
# foreground; the other two print their output after it.
vm_log=$(mktemp --suffix=.vm-tier.log)
started=$SECONDS
.venv/bin/python -m pytest -m vm -p no:cacheprovider tests/vm/ "${vm_args[@]}" >"$vm_log" 2>&1 &
vm=$!
conformance=0
if [ "$critest" != 0 ]; then
    critest_log=$(mktemp --suffix=.critest.log)
    nice -n 5 .venv/bin/python -m harness.conformance >"$critest_log" 2>&1 &
    conformance=$!
fi
trap 'kill "$vm" $( [ "$conformance" = 0 ] || echo "$conformance" ) 2>/dev/null || true' INT TERM
echo "the VM tier and the conformance runs go beside the suite; their output follows the suite's"
status=0
nice -n 5 .venv/bin/python -m pytest "${args[@]}" || status=$?
echo "----- the suite took $(( (SECONDS - started) / 60 )) min -----"
if [ "$conformance" != 0 ]; then
    wait "$conformance" || status=$?
    echo "----- the conformance runs ($critest_log) -----"
    cat "$critest_log"
fi
vm_status=0
wait "$vm" || vm_status=$?
echo "----- the VM tier ($vm_log), done $(( (SECONDS - started) / 60 )) min after the lanes started -----"
cat "$vm_log"
[ "$vm_status" = 0 ] || status=$vm_status
exit "$status"
