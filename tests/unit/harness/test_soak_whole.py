"""What keeps the soak's node from being whole: kubelet's pod status catching up with the kernel
is not a finding; a container that runs with no pod, or a pod's that does not run, for long is."""

from __future__ import annotations

from harness.soak import run
from harness.soak.run import Soak, Timing

STATUS_LAG = 60.0  # kubelet's runtime request timeout in the short form


def _soak() -> Soak:
    soak = Soak.__new__(Soak)  # only the finding's bookkeeping: no node, no API server
    soak._found = {}
    soak.timing = Timing(runtime_timeout=STATUS_LAG)
    return soak


def test_a_container_found_in_every_look_for_longer_than_the_status_lag_is_a_finding(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(run.time, "monotonic", lambda: now[0])
    soak = _soak()
    assert soak._lasting("stray", {"a", "b"}) == []
    now[0] += STATUS_LAG / 2
    assert soak._lasting("stray", {"a", "c"}) == []  # b gone: its status caught up
    now[0] += STATUS_LAG / 2
    assert soak._lasting("stray", {"a", "b", "c"}) == [("a", STATUS_LAG)]  # b found anew
    assert soak._lasting("missing", {"a"}) == []  # each kind on its own


def test_containers_that_keep_changing_under_churn_are_never_a_finding(monkeypatch):
    """On a slow node under churn some container is always between kubelet's status and the
    kernel; none of them stays there."""
    now = [0.0]
    monkeypatch.setattr(run.time, "monotonic", lambda: now[0])
    soak = _soak()
    for i in range(30):
        assert soak._lasting("missing", {f"c{i}", f"c{i + 1}"}) == []
        now[0] += 10
