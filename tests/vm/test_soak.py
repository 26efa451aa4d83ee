"""The soak's short form (benchmarks/soak.py runs the hour): cri-resmgr from the Debian package on
the production-shaped node, under a churn of pods and configuration changes, struck once by each
fault a node sees; judged from the kernel, and whole again after each. It runs with `--vm-soak`;
`--vm-soak-seconds` sets the length, `--soak-seed` the choices."""

from __future__ import annotations

import random

import pytest

from harness.soak.report import text
from harness.soak.run import settings_for, soak_on

pytestmark = pytest.mark.timeout(2400)


def test_a_node_struck_by_every_fault_stays_whole(vm, kube, agent_proxy, request, capsys):
    if not request.config.getoption("--vm-soak"):
        pytest.skip("the soak runs with --vm-soak (as .ci/run asks)")
    seconds = request.config.getoption("--vm-soak-seconds")
    seed = request.config.getoption("--soak-seed") or random.randrange(1, 1 << 31)
    mode = request.config.getoption("--vm-soak-mode")
    report = soak_on(vm, kube, agent_proxy, settings_for(seconds, mode, seed, reboot=False))
    with capsys.disabled():  # the figures belong in the run's output, passed or not
        print("\n" + text(report), flush=True)
    again = f"again: .venv/bin/python benchmarks/soak.py --duration {seconds:.0f}s --mode {mode} --seed {seed}"
    assert report["violations"] == {}, "\n".join([*report["violation_examples"], again])
    assert all(row["whole"] == row["struck"] for row in report["faults"]), (report["faults"], again)
    assert report["notes"].get("whole at the end"), (report, again)
    assert any("policy switch" in what for what in report["config_changes"]), (report["config_changes"], again)
    assert report["planted"] and all(p.startswith("caught") for p in report["planted"]), (report["planted"], again)
