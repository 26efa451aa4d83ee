"""The conformance comparison: what counts as a difference between critest direct and a front end."""

from __future__ import annotations

import json
from pathlib import Path

from harness.conformance import RETRIES, differences, retry_differences

CID = "8034e83d2adb26453fe2c894bc6d08a20e7f4fb7fa271174e8e9598c577e6c1a"
RACE = (f'rpc error: code = Unknown desc = failed to set removing state for container "{CID}": '
        "container is still running, to stop first")
FORCED = f'level=info msg="Forcibly stopping container \\"{CID}\\""'
KILLED = f'level=info msg="Kill container \\"{CID}\\""'
REFUSED = f'level=error msg="RemoveContainer for \\"{CID}\\" failed" error="{RACE}"'


def critest_run(here: Path, failed: dict[str, str], log: list[str]) -> None:
    """What one critest run leaves: its ginkgo report of the failed specs and containerd's log."""
    (here / "containerd").mkdir(parents=True)
    (here / "containerd" / "containerd.log").write_text("\n".join(log) + "\n")
    reports = [{"LeafNodeType": "It", "ContainerHierarchyTexts": [], "LeafNodeText": name, "State": "failed",
                "Failure": {"Message": why, "Location": {"FileName": "x.go", "LineNumber": 1}}}
               for name, why in failed.items()]
    (here / "critest.json").write_text(json.dumps([{"SpecReports": reports}]))


def test_a_difference_is_a_spec_one_side_passes_and_the_other_does_not() -> None:
    results = {
        "direct": {"a": "passed", "b": "failed", "c": "passed", "d": "skipped"},
        "grpc": {"a": "failed", "b": "failed", "c": "passed", "d": "skipped"},
        "nri": {"a": "passed", "b": "passed", "c": "passed", "d": "skipped"},
    }
    assert differences(results) == {"grpc": {"a"}, "direct": {"b"}}


def test_a_spec_that_passes_every_retry_is_flaky_and_one_that_fails_again_stays_a_difference(tmp_path: Path) -> None:
    results = {"direct": {"race": "passed", "broken": "passed"}, "grpc": {"race": "failed", "broken": "failed"}}
    calls: list[tuple[str, str]] = []

    def run(target: str, focus: str, here: Path) -> dict[str, str]:
        calls.append((target, focus))
        here.mkdir()
        return {"race": "passed", "broken": "failed"}

    flaky = retry_differences(results, run, tmp_path)
    assert flaky == {"grpc": {"race": f"failed once, passed {RETRIES} retries\n      failed"}}
    assert results["grpc"] == {"race": "passed", "broken": "failed"}
    assert calls == [("grpc", "broken|race")] * RETRIES
    assert differences(results) == {"grpc": {"broken"}}


def runs_failing_with(tmp_path: Path, logs: list[list[str]], messages: list[str]) -> tuple[dict, dict]:
    """retry_differences over a spec that fails through nri in every run, with these logs and messages."""
    results = {"direct": {"spec": "passed"}, "nri": {"spec": "failed"}}
    critest_run(tmp_path / "nri", {"spec": messages[0]}, logs[0])
    tries = iter(zip(logs[1:], messages[1:], strict=True))

    def run(target: str, focus: str, here: Path) -> dict[str, str]:
        log, message = next(tries)
        critest_run(here, {"spec": message}, log)
        return {"spec": "failed"}

    return retry_differences(results, run, tmp_path), results


def test_containerds_removal_race_in_every_failing_run_is_excused_with_its_cause(tmp_path: Path) -> None:
    excused, results = runs_failing_with(tmp_path, [[FORCED, REFUSED]] * (RETRIES + 1), [RACE] * (RETRIES + 1))
    assert results["nri"]["spec"] == "passed"
    assert "every time on containerd's own removal race" in excused["nri"]["spec"]
    assert CID[:12] in excused["nri"]["spec"]


def test_the_same_refusal_after_a_kill_is_a_difference(tmp_path: Path) -> None:
    # containerd killed the container and waited for its exit: not the race, so our doing until shown otherwise.
    logs = [[FORCED, REFUSED]] * RETRIES + [[FORCED, KILLED, REFUSED]]
    excused, results = runs_failing_with(tmp_path, logs, [RACE] * (RETRIES + 1))
    assert excused == {} and differences(results) == {"nri": {"spec"}}


def test_one_failure_of_another_kind_among_races_is_a_difference(tmp_path: Path) -> None:
    messages = [RACE] * RETRIES + ["Expected <int>: 2 to equal <int>: 1"]
    excused, results = runs_failing_with(tmp_path, [[FORCED, REFUSED]] * (RETRIES + 1), messages)
    assert excused == {} and differences(results) == {"nri": {"spec"}}
