"""The soak's short form (benchmarks/soak.py runs the hour): cri-resmgr from the Debian package on
the production-shaped node, under a churn of pods and configuration changes, struck once by each
fault a node sees; judged from the kernel, and whole again after each. It runs with `--vm-soak`;
`--vm-soak-seconds` sets the length, `--soak-seed` the choices and the form: the front end (relay
or NRI), the policy it starts in and whether the node reboots come from the seed in a fixed rotation
(harness/soak/run.py: ROTATION), and without a seed the seed is HEAD's commit count (its hash in
a shallow clone), so that one commit always runs one form and successive commits run them all."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.soak.report import text
from harness.soak.run import form_of, settings_for, soak_on

pytestmark = pytest.mark.timeout(2700)
ROOT = Path(__file__).resolve().parents[2]


def commit_seed() -> int:
    """HEAD's commit count; in a shallow clone (which counts only what it fetched), its hash."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    if git("rev-parse", "--is-shallow-repository") == "false" and (count := git("rev-list", "--count", "HEAD")):
        return int(count)
    return int(git("rev-parse", "HEAD")[:8] or "1", 16)


def test_a_node_struck_by_every_fault_stays_whole(vm, kube, agent_proxy, request, capsys):
    if not request.config.getoption("--vm-soak"):
        pytest.skip("the soak runs with --vm-soak (as .ci/run asks)")
    seconds = request.config.getoption("--vm-soak-seconds")
    seed = request.config.getoption("--soak-seed") or commit_seed()
    mode, policy, reboot = form_of(seed)
    report = soak_on(vm, kube, agent_proxy, settings_for(seconds, mode, seed, reboot, policy=policy))
    with capsys.disabled():  # the figures belong in the run's output, passed or not
        print("\n" + text(report), flush=True)
    again = "again: " + report["again"]
    assert report["violations"] == {}, "\n".join([*report["violation_examples"], again])
    assert all(row["whole"] == row["struck"] for row in report["faults"]), (report["faults"], again)
    assert report["notes"].get("whole at the end"), (report, again)
    assert any("policy switch" in what for what in report["config_changes"]), (report["config_changes"], again)
    assert report["planted"] and all(p.startswith("caught") for p in report["planted"]), (report["planted"], again)
    pods = report["pods"]  # pods of DRA claims that never run: the driver, the scheduler or the slices broken
    assert pods["claiming"] < 3 or pods["claiming_ran"], (pods, again)
    uncaused = report["notes"].get("nri window without the soak's kill")
    assert not uncaused, (uncaused, again)  # the plugin died of itself
    unstruck = report["notes"].get("nri window without the soak's restart")
    assert not unstruck, (unstruck, again)  # containerd started of itself
