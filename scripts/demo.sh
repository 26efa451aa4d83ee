#!/usr/bin/env bash
# Bring up a private containerd, put cri-resmgr in front of it, run sample pods
# through the relay and show what each container got.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh demo
exec .venv/bin/python -m harness.demo "$@"
