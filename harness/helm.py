"""The Helm chart under deployment/helm, linted and rendered by the helm scripts/build-runtime.sh builds."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from harness.containerd import TOOLS_BIN

CHART = Path(__file__).resolve().parent.parent / "deployment" / "helm" / "cri-resmgr"
HELM = TOOLS_BIN / "helm"


def _sets(values: dict[str, Any]) -> list[str]:
    """--set-json for each value: types survive (a --set of "true" would be a string here and there)."""
    import json

    return [arg for key, value in values.items() for arg in ("--set-json", f"{key}={json.dumps(value)}")]


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120)


def lint(values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    return helm("lint", "--strict", str(CHART), *_sets(values or {}))


def render(values: dict[str, Any] | None = None, namespace: str = "kube-system", crds: bool = False,
           only: str = "") -> list[dict[str, Any]]:
    """The chart's objects as `helm template` renders them (RuntimeError with helm's words if it fails)."""
    args = ["template", "cri-resmgr", str(CHART), "--namespace", namespace, *_sets(values or {})]
    if crds:
        args.append("--include-crds")
    if only:
        args += ["--show-only", only]
    out = helm(*args)
    if out.returncode != 0:
        raise RuntimeError(f"helm template: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]
