"""What keeps the soak's node from being whole: kubelet's pod status catching up with the kernel
is not a finding; a container that runs with no pod, or a pod's that does not run, for long is."""

from __future__ import annotations

from harness.soak import run
from harness.soak.judge import Expect
from harness.soak.run import Soak, Timing

STATUS_LAG = 60.0  # kubelet's runtime request timeout in the short form


def _soak() -> Soak:
    soak = Soak.__new__(Soak)  # only the finding's bookkeeping: no node, no API server
    soak._found, soak.evidence = {}, []
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


def test_a_fault_step_that_raises_is_a_violation_and_restarts_are_counted_before_it():
    from types import SimpleNamespace

    soak = _soak()
    soak.violations, soak.strikes, soak._excused, soak._excused_restarts = [], [], False, []
    soak.started = 0.0
    soak.guest = SimpleNamespace(now=lambda: 5.0, free_state_fs=None)
    order: list[str] = []
    soak._restarts_before = lambda kind: order.append("restarts counted")

    def hangs(s: object) -> None:
        order.append("fault")
        raise TimeoutError("cri-resmgr status did not answer in 120 s")

    soak._kill_agent = hangs
    soak.wait_whole = lambda s: order.append("whole")
    soak.strike("kill-agent")
    assert order == ["restarts counted", "fault", "whole"]
    assert soak.violations == [("strike-error", "kill-agent: TimeoutError: cri-resmgr status did not answer in 120 s")]


def test_placements_a_reboot_moved_under_topology_aware_are_a_violation():
    from types import SimpleNamespace

    from harness.soak.report import Strike

    for policy, switching, counted in (("topology-aware", False, True), ("balloons", False, False),
                                       ("topology-aware", True, False)):
        soak = _soak()
        soak.violations = []
        soak.load = SimpleNamespace(spared={"x"})
        soak._switching_at_reboot = switching  # a change in flight when it struck: no verdict
        soak._before_reboot = {("g1-3", "main"): "2"}
        soak._placements = lambda: {("g1-3", "main"): "5"}
        s = Strike("reboot", 1000.0, whole=1100.0, notes={"policy": policy})
        soak._judge_reboot(s)
        assert [k for k, _ in soak.violations] == (["reboot-moved"] if counted else []), policy
        assert soak.load.spared == set()


def test_a_planted_violation_is_told_apart_caught_or_missed():
    from harness.soak.judge import Judge, Violation
    from harness.soak.run import Plant, judge_plants, machine_of, wrong_mems
    from harness.vm import Shape
    from resmgr.topology.cpuset import CPUSet

    machine = machine_of(Shape())
    assert wrong_mems(machine, CPUSet.parse("4-5")) == "0"
    assert wrong_mems(machine, CPUSet.parse("0-1")) == "1"
    assert wrong_mems(machine, machine.online) == "0"
    plant = Plant("memory", "c1", 100.0, 160.0, "c1 memory nodes 0")
    product = Violation("memory", "c2 wrong", 120.0, 200.0, "c2", ("c2",))
    planted = Violation("memory", "c1 wrong", 101.0, 160.0, "c1", ("c1",))
    assert judge_plants([plant], [product, planted]) == ([product], ["caught: memory: c1 memory nodes 0"])
    assert judge_plants([plant], [product]) == ([product], ["MISSED: memory: c1 memory nodes 0"])
    # The judge itself catches it: memory nodes rewritten for longer than its grace.
    judge = Judge(machine, Expect("topology-aware", CPUSet([0])), grace=30)
    for t in range(100, 162, 2):
        judge.feed(float(t), {"c1": ["kubepods-burstable-pod3_4.slice", "1-3", "1", "max 100000", "", "started"]})
    assert [p for p in judge_plants([plant], judge.violations)[1]] == ["caught: memory: c1 memory nodes 0"]


def test_cri_resmgrs_word_is_held_against_the_kernel():
    from harness.soak.run import disagree

    snap = {"a": ["kubepods-pod1.slice", "4", "1", "100000 100000", "", "started"],
            "b": ["kubepods-burstable-pod2.slice", "5-7", "1", "max 100000", "", "started"],
            "c": ["kubepods-burstable-pod2.slice", "5-7", "1", "max 100000", "", "started"],
            "d": ["kubepods-burstable-pod2.slice", "1-3", "0", "max 100000", "", "created"]}
    placed = {"a": ["4", "1", False], "b": ["5-6", "1", False], "c": ["1-3", "0", True], "d": ["9", "2", False]}
    assert disagree(placed, snap) == {"b": "CPUs 5-6 memory 1, the kernel CPUs 5-7 memory 1"}  # c: in flight
    assert disagree({"a": ["4", "0-1", False]}, snap) == {"a": "CPUs 4 memory 0-1, the kernel CPUs 4 memory 1"}
    assert disagree({"a": ["", "", False]}, snap) == {}  # nothing said: nothing held against it


def test_a_reboot_is_whole_only_once_kubelet_reports_the_containers_it_made_since():
    """Pods' statuses name the containers of before the reboot, running, until kubelet reports the
    new ones with their restart counts: whole before that, the counts would come after the reboot's
    strike and be restarts of no cause."""
    soak = _soak()
    soak._known = {"old1": "g1-0/c0", "new1": "g1-0/c0"}
    soak._expected = {"old1"}
    assert soak._unreported({"new1"}) == ["kubelet has not reported the containers made since the reboot: "
                                          "['g1-0/c0']"]
    soak._expected = {"new1"}
    assert soak._unreported({"new1"}) == []


class Crowded:
    """The API server of a node that runs `room` Guaranteed pods of 2 CPUs at once: the pods made
    after those are refused (CreateContainerError) until pods before them are deleted."""

    def __init__(self, room: int) -> None:
        self.room, self.pods, self.deleted = room, [], []

    def create_namespaced_pod(self, namespace: str, body: dict):
        from types import SimpleNamespace

        self.pods.append(body["metadata"]["name"])
        return SimpleNamespace(metadata=SimpleNamespace(uid=f"uid-{len(self.pods)}"))

    def delete_namespaced_pod(self, name: str, namespace: str) -> None:
        self.pods.remove(name)
        self.deleted.append(name)

    def list_namespaced_pod(self, namespace: str, **kw: object):
        from types import SimpleNamespace as NS

        def pod(name: str, runs: bool) -> NS:
            waiting = None if runs else NS(reason="CreateContainerError", message="needs 2 exclusive CPUs")
            st = NS(ready=runs, state=NS(running=NS() if runs else None, waiting=waiting))
            return NS(metadata=NS(name=name), status=NS(phase="Running" if runs else "Pending",
                                                         container_statuses=[st]))
        return NS(items=[pod(name, i < self.room) for i, name in enumerate(self.pods)])


def _crowding(monkeypatch, core: Crowded) -> tuple[Soak, list[float]]:
    import random
    from types import SimpleNamespace

    from harness.soak import load as soak_load
    from harness.soak.load import Load
    from resmgr.topology.cpuset import CPUSet

    now = [0.0]
    clock = SimpleNamespace(monotonic=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
                            strftime=lambda *a: "")
    monkeypatch.setattr(run, "time", clock)
    monkeypatch.setattr(soak_load, "time", clock)
    soak = _soak()
    soak.load, soak.violations = Load(core, "node", random.Random(1)), []
    soak.configs = SimpleNamespace(expect=lambda: Expect("topology-aware", CPUSet([0])))
    return soak, now


def test_the_crowd_makes_pods_until_one_is_refused_and_that_one_runs_in_the_room_the_others_leave(monkeypatch):
    from harness.soak.report import Strike

    core = Crowded(room=3)
    soak, _ = _crowding(monkeypatch, core)
    s = Strike("crowd", 0.0)
    soak._crowd(s)
    assert s.notes["pods made"] == 4 and s.notes["refused"] == "g2-3: needs 2 exclusive CPUs"
    assert core.deleted == ["g2-0", "g2-1", "g2-2"] and core.pods == ["g2-3"]
    assert s.notes["runs after room s"] == 5.0 and not soak.violations
    assert not soak.load.paused.is_set()  # the churn goes on


def test_a_refused_pod_that_never_runs_after_room_was_made_is_a_violation(monkeypatch):
    from harness.soak.report import Strike

    core = Crowded(room=2)
    core.delete_namespaced_pod = lambda name, namespace: core.deleted.append(name)  # nothing goes away
    soak, _ = _crowding(monkeypatch, core)
    s = Strike("crowd", 0.0)
    soak._crowd(s)
    assert s.notes["refused"].startswith("g2-2: ")
    assert [kind for kind, _ in soak.violations] == ["crowd"]


def test_a_crowd_kubelet_would_not_admit_more_of_ends_without_a_refusal(monkeypatch):
    from harness.soak.report import Strike

    core = Crowded(room=100)
    soak, _ = _crowding(monkeypatch, core)
    s = Strike("crowd", 0.0)
    soak._crowd(s)
    assert s.notes["pods made"] == 8 and s.notes["refused"] == "none (topology-aware)"  # 16 CPUs admitted
    assert not soak.violations and len(core.deleted) == 8  # the churn's budgets hold again


def test_the_crowd_waits_for_a_policy_with_exclusive_cpus_to_run_out_of_while_faults_are_left():
    from harness.soak.run import crowd_later

    plan = ["crowd", "kill-agent", "plant"]
    crowd_later(plan, "balloons")
    assert plan == ["kill-agent", "crowd", "plant"]
    plan = ["crowd"]
    crowd_later(plan, "podpools")
    assert plan == ["crowd"]  # the last: it strikes anyway
    plan = ["crowd", "plant"]
    crowd_later(plan, "static")
    assert plan == ["crowd", "plant"]


def test_the_plant_puts_back_the_memory_nodes_a_container_had_in_effect_where_its_cgroup_named_none():
    """Under static the runtime names no memory nodes (cpuset.mems empty, the parent's in effect); the
    kernel refuses an empty write, so the plant's undo writes the nodes that were in effect."""
    from harness.soak.guest import Guest

    class Vm:
        def __init__(self, mems: str) -> None:
            self.mems, self.commands = mems, []

        def sh(self, command: str, timeout: float = 120.0) -> str:
            self.commands.append(command)
            return f"{self.mems}\n0-3\n"

    for held, back in (("", "0-3"), ("1", "1")):
        vm = Vm(held)
        assert Guest(vm, "relay").set_mems("/sys/fs/cgroup/x.scope", "2") == back  # type: ignore[arg-type]
        assert vm.commands[0].endswith("echo '2' > /sys/fs/cgroup/x.scope/cpuset.mems")


class Claiming:
    """The API server of pods of claims: a pod deleted is gone at the next list."""

    def __init__(self) -> None:
        self.pods: list[str] = []

    def create_namespaced_pod(self, namespace: str, body: dict):
        from types import SimpleNamespace

        self.pods.append(body["metadata"]["name"])
        return SimpleNamespace(metadata=SimpleNamespace(uid=f"uid-{len(self.pods)}"))

    def delete_namespaced_pod(self, name: str, namespace: str) -> None:
        self.pods.remove(name)

    def list_namespaced_pod(self, namespace: str, **kw: object):
        from types import SimpleNamespace as NS

        return NS(items=[NS(metadata=NS(name=n), spec=NS(node_name="node"),
                            status=NS(phase="Running", container_statuses=[])) for n in self.pods])


def test_before_a_switch_to_a_policy_without_devices_the_claims_pods_go_and_their_claims_must_follow(monkeypatch):
    from types import SimpleNamespace

    core = Claiming()
    soak, now = _crowding(monkeypatch, core)  # type: ignore[arg-type]
    now[0] = 100.0
    prepared = [2]
    soak.guest = SimpleNamespace(inspect=lambda: {"state": {"claims": prepared[0]}})
    soak._claims_for("static")
    assert soak.load.claiming.is_set()
    soak.load.make("dc"), soak.load.make("dc")
    soak._before_switch("topology-aware")  # offers the devices: the claims stay
    assert len(core.pods) == 2 and soak.load.claiming.is_set()

    def unprepared(s: float) -> None:  # kubelet unprepares them 10 s later
        now[0] += s
        if now[0] >= 110:
            prepared[0] = 0
    run.time.sleep = unprepared
    soak._before_switch("balloons")
    assert core.pods == [] and not soak.load.claiming.is_set() and soak.violations == []

    # Claims kubelet never unprepares: the switch waits for them no longer than its bound, and says so.
    soak.load.claiming.set()
    soak.load.make("dc")
    prepared[0] = 1
    run.time.sleep = lambda s: now.__setitem__(0, now[0] + s)
    asked: list[tuple[list[str], float]] = []
    soak.guest.now = lambda: 1000.0
    soak.guest.lines_about = lambda names, since, until=None: asked.append((names, since)) or ["kubelet: mb-0 stuck"]
    soak._before_switch("podpools")
    assert [k for k, _ in soak.violations] == ["claims"]
    # What the step is stuck on, from the journals (a CI run's are not kept): the pods are gone
    # here, so the lines of claims.
    assert asked == [(["claim"], 1000.0 - run.CLAIMS_GONE - 60)]
    assert soak.evidence[-1] == "kubelet: mb-0 stuck"


def test_the_report_carries_what_cri_resmgr_warned_of_around_the_violations():
    """A CI run's journals are not kept: the daemon's warnings from a minute before the first
    violation to the end of the last are its evidence, and none are read for a clean run."""
    from types import SimpleNamespace

    from harness.soak.judge import Violation
    from harness.soak.report import text

    asked: list[tuple[str, float, float]] = []

    def warnings(unit: str, since: float, until: float) -> list[str]:
        asked.append((unit, since, until))
        return ["2026-12-06 11:05:01,2 ERROR cri-resmgr.engine: no room"]

    soak = _soak()
    soak.guest = SimpleNamespace(unit="cri-resmgr", warnings=warnings)
    assert soak._said([]) == [] and asked == []
    said = soak._said([Violation("exclusive-shared", "x", 1000.0, 1017.0, "k"),
                       Violation("exclusive-shared", "y", 1003.0, 1010.0, "k")])
    assert asked == [("cri-resmgr", 1000.0 - run.SAID_BEFORE, 1022.0)] and said[0].endswith("no room")
    report = {"mode": "relay", "duration_s": 60, "seed": 1, "pods": {"made": 0, "deleted": 0, "resized": 0},
              "config_changes": [],
              "faults": [], "violations": {"exclusive-shared": 2}, "violation_examples": [], "daemon_said": said,
              "slopes": {}, "state_max_bytes": 0, "notes": {}}
    assert "  2026-12-06 11:05:01,2 ERROR cri-resmgr.engine: no room" in text(report)

    def gone(unit: str, since: float, until: float) -> list[str]:
        raise TimeoutError("the guest agent did not answer")

    soak.guest = SimpleNamespace(unit="cri-resmgr", warnings=gone)
    assert "could not be read" in soak._said([Violation("exclusive-shared", "x", 1.0, 2.0, "k")])[0]


def test_the_report_carries_the_journals_lines_of_the_containers_of_the_first_violations():
    """INFO logs name the containers a move waits on and containerd each update: for the first few
    violations (by the containers they name), those lines from a minute before to the end."""
    from types import SimpleNamespace

    from harness.soak.judge import Violation
    from harness.soak.report import text

    asked: list[tuple[list[str], float, float | None]] = []

    def lines_about(names: list[str], since: float, until: float | None = None) -> list[str]:
        asked.append((names, since, until))
        return [f"containerd: UpdateContainerResources for {names[0]}"]

    soak = _soak()
    soak.guest = SimpleNamespace(unit="cri-resmgr", lines_about=lines_about)
    a, b = "a" * 64, "b" * 64
    lines = soak._lines_of([Violation("exclusive-shared", "x", 1000.0, 1017.0, "k", (a, b)),
                            Violation("pool", "y", 1003.0, 1010.0, "k", (a, b)),  # the same containers
                            Violation("memory", "z", 1100.0, 1110.0, "m", ("c" * 64,)),
                            Violation("not-whole", "w", 1200.0, 1200.0)], most=2)
    assert asked == [([a[:12], b[:12]], 1000.0 - run.SAID_BEFORE, 1022.0),
                     (["c" * 12], 1100.0 - run.SAID_BEFORE, 1115.0)]
    assert lines[0] == f"({a[:12]}, {b[:12]})" and len(lines) == 4
    report = {"mode": "relay", "duration_s": 60, "seed": 1, "pods": {"made": 0, "deleted": 0, "resized": 0},
              "config_changes": [], "faults": [], "violations": {"pool": 1}, "violation_examples": [],
              "evidence": lines, "slopes": {}, "state_max_bytes": 0, "notes": {}}
    assert f"  containerd: UpdateContainerResources for {a[:12]}" in text(report)
