"""The conformance comparison: what counts as a difference between critest direct and a front end."""

from __future__ import annotations

from pathlib import Path

from harness.conformance import RETRIES, differences, retry_differences


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
    assert flaky == {"grpc": {"race": "failed"}}
    assert results["grpc"] == {"race": "passed", "broken": "failed"}
    assert calls == [("grpc", "broken|race")] * RETRIES
    assert differences(results) == {"grpc": {"broken"}}
