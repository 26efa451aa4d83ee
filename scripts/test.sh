#!/usr/bin/env bash
# Run the whole test suite: lint (code and the Helm chart), unit and integration tests against a private containerd,
# then CRI conformance (critest) directly and through the relay. Arguments go to pytest;
# naming tests (tests/...), choosing by marker (-m unit) or --no-critest (or CRIRM_CRITEST=0) leaves
# conformance out.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
critest=${CRIRM_CRITEST:-1}
args=()
for arg in "$@"; do
    case $arg in
    --no-critest) critest=0 ;;
    tests*|-m) critest=0; args+=("$arg") ;;
    *) args+=("$arg") ;;
    esac
done
.venv/bin/ruff check .
# The Helm chart: lint here, rendered and applied to a real API server by tests/test_chart.py.
"${CRI_RESMGR_CACHE:-$HOME/.cache/cri-resmgr}/bin/helm" lint --strict deployment/helm/cri-resmgr
.venv/bin/python -m pytest "${args[@]}"
if [ "$critest" != 0 ]; then
    .venv/bin/python -m harness.conformance
fi
