#!/usr/bin/env bash
# Run the whole test suite (lint, unit, integration against a private containerd).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
