"""The soak's judge on snapshots as the sampler writes them: what each policy's invariants let
through and what they catch, moves in flight, and configuration changes."""

from __future__ import annotations

import math

from harness.soak.judge import Expect, Judge, findings, held, parse, unseen_claims
from harness.soak.run import machine_of
from harness.vm import Shape
from resmgr.topology.cpuset import CPUSet

MACHINE = machine_of(Shape())  # 4 NUMA nodes of 4 CPUs, 2 per socket
TA = Expect("topology-aware", CPUSet([0]))
BALLOONS = Expect("balloons", CPUSet([0]), 6)


def ctr(qos: str, cpus: str, mems: str, cpu: float | None = None, runs: str = "started") -> list[str]:
    pod = {"guaranteed": "kubepods-pod1_2.slice", "burstable": "kubepods-burstable-pod3_4.slice",
           "besteffort": "kubepods-besteffort-pod5_6.slice"}[qos]
    quota = "max 100000" if cpu is None else f"{int(cpu * 100000)} 100000"
    return [pod, cpus, mems, quota, "100", runs]


def kinds(snapshot: dict, expect: Expect = TA) -> list[str]:
    return sorted(f.kind for f in findings(parse(snapshot), expect, MACHINE, held(snapshot)))


def test_a_node_as_topology_aware_places_it_breaks_nothing():
    snap = {"g2": ctr("guaranteed", "4-5", "1", 2), "g1": ctr("guaranteed", "8", "2", 1),
            "b": ctr("burstable", "1-3", "0", 0.5), "be": ctr("besteffort", "6-7", "1"),
            "wide": ctr("burstable", "1-3,6-7", "0-1"),  # its socket's shared CPUs
            "sandbox": ctr("besteffort", "0-15", "0-3", runs="pause"),
            "new": ctr("guaranteed", "9", "2", 1, runs="created")}  # not started: its CPUs held already
    assert kinds(snap) == []


def test_an_exclusive_cpu_under_another_container_is_caught_at_once():
    judge = Judge(MACHINE, TA, grace=30)
    snap = {"g": ctr("guaranteed", "4", "1", 1), "b": ctr("burstable", "4-7", "1", 0.2)}
    assert "exclusive-shared" in {f.kind for f in judge.feed(100.0, snap)}
    assert [v.kind for v in judge.violations] == ["exclusive-shared"]


def test_a_shared_container_off_its_pool_is_excused_only_after_a_release_of_those_cpus():
    """CPUs given back reach the shared containers once the runtime confirms the stop: slowly, but
    only CPUs a container was seen to give up; anything else is a move and has the grace."""
    judge = Judge(MACHINE, TA, grace=30, slow_grace=120)
    moving = {"g": ctr("guaranteed", "4", "1", 1), "b": ctr("burstable", "5-6", "1", 0.2)}  # 7 left out
    judge.feed(90.0, {**moving, "g7": ctr("guaranteed", "7", "1", 1)})
    judge.feed(100.0, moving)  # g7 gone: CPU 7 released at 100
    judge.feed(190.0, moving)
    assert judge.violations == [] and not judge.clean()
    judge.feed(200.0, {"g": ctr("guaranteed", "4", "1", 1), "b": ctr("burstable", "5-7", "1", 0.2)})
    assert judge.violations == [] and judge.clean()
    judge.feed(219.0, moving)  # no release since 100, when 120 s ago: a move with 30 s
    judge.feed(251.0, moving)
    assert [v.kind for v in judge.violations] == ["pool"]


def test_a_release_of_other_cpus_excuses_nothing():
    judge = Judge(MACHINE, TA, grace=30, slow_grace=120)
    moving = {"g": ctr("guaranteed", "4", "1", 1), "b": ctr("burstable", "5-6", "1", 0.2)}
    judge.feed(90.0, {**moving, "g9": ctr("guaranteed", "9", "2", 1)})
    judge.feed(100.0, moving)  # CPU 9 released: not the 7 b lacks
    judge.feed(131.0, moving)
    assert [v.kind for v in judge.violations] == ["pool"]


def test_a_finding_that_clears_for_a_read_keeps_its_first_seen_time():
    """Memory nodes wrong 25 s of every 27: one violation within the first minute."""
    judge = Judge(MACHINE, TA, grace=30)
    wrong = {"b": ctr("burstable", "1-3", "0-1", 0.2)}
    right = {"b": ctr("burstable", "1-3", "0", 0.2)}
    t = 0.0
    while t < 600:
        for dt in range(0, 25, 2):
            judge.feed(t + dt, wrong)
        judge.feed(t + 26, right)
        t += 27
    assert [v.kind for v in judge.violations] == ["memory"] and judge.violations[0].first == 0.0
    # A move every 20 s that is over within a read or two stays a move.
    judge = Judge(MACHINE, TA, grace=30)
    for t in range(0, 600, 20):
        judge.feed(float(t), wrong)
        judge.feed(t + 2.0, right)
        judge.feed(t + 10.0, right)
    assert judge.violations == []


def test_a_created_exclusive_container_holds_its_cpus_before_it_starts():
    """A Guaranteed container created (its cgroup made on its CPUs) but not started: the shared
    containers are already off its CPUs, as cri-resmgr placed them."""
    judge = Judge(MACHINE, TA, grace=30)
    snap = {"g": ctr("guaranteed", "4", "1", 1, runs="created"), "b": ctr("burstable", "5-7", "1", 0.2)}
    assert kinds(snap) == []
    for t in range(0, 200, 10):
        judge.feed(float(t), snap)
    assert judge.violations == []


def test_an_older_attempt_kubelet_gave_up_on_waits_on_the_shared_cpus_and_holds_none():
    """A start cut by a fault: kubelet makes the next attempt and never starts the one created,
    which cri-resmgr moves onto the shared CPUs; its whole CPUs of cpu.max are nobody's."""
    static = Expect("static", CPUSet([0]))
    parked = {"old": ctr("guaranteed", "0-1,4-15", "0-3", 1, runs="created"),
              "g2": ctr("guaranteed", "2-3", "0-3", 2), "b": ctr("burstable", "0-1,4-15", "0-3", 0.3)}
    assert kinds(parked, static) == []
    in_pool = {"old": ctr("guaranteed", "1", "0", 1, runs="created"), "g2": ctr("guaranteed", "2", "0", 1),
               "g3": ctr("guaranteed", "3", "0", 1), "b": ctr("burstable", "1", "0", 0.3)}
    assert kinds(in_pool) == []
    judge = Judge(MACHINE, TA, grace=30)
    for t in range(0, 200, 10):
        judge.feed(float(t), in_pool)
    assert judge.violations == []
    # Started on the shared CPUs it waited on, it is an exclusive container beside another at once.
    started = {**in_pool, "old": ctr("guaranteed", "1", "0", 1)}
    assert "exclusive-shared" in kinds(started)


def test_memory_must_follow_the_cpus_and_the_reserved_cpus_stay_reserved():
    assert kinds({"b": ctr("burstable", "5-7", "0-1", 0.2)}) == ["memory", "pool"]
    assert kinds({"b": ctr("burstable", "0-3", "0", 0.2)}) == ["pool", "reserved"]


def test_balloons_are_disjoint_and_big_enough():
    ok = {"a": ctr("guaranteed", "4-5", "1", 2), "b": ctr("besteffort", "4-5", "1"),
          "c": ctr("guaranteed", "8-11", "2", 1)}
    assert kinds(ok, BALLOONS) == []
    assert kinds({**ok, "d": ctr("burstable", "5-6", "1")}, BALLOONS) == ["balloon-overlap"]
    assert kinds({**ok, "d": ctr("burstable", "4-6", "1")}, BALLOONS) == ["balloon-moving"]  # one grows
    assert kinds({"a": ctr("guaranteed", "4", "1", 2)}, BALLOONS) == ["balloon-size"]


def test_one_balloon_inside_another_counts_after_the_grace_while_pods_join_it():
    """The finding is the two CPU sets, whoever joins them; no container left, so no release: a
    balloon part-moved for longer than a move takes."""
    judge = Judge(MACHINE, BALLOONS, grace=30, slow_grace=180)
    snap = {"a": ctr("guaranteed", "4-5", "1", 2), "z": ctr("burstable", "4-6", "1")}
    for t in range(0, 600, 2):
        if t % 60 == 0:  # a pod joins each balloon, its ID first in order
            snap = {**snap, f"0{t}": ctr("besteffort", "4-5", "1"), f"1{t}": ctr("besteffort", "4-6", "1")}
        judge.feed(float(t), snap)
    assert [(v.kind, v.first) for v in judge.violations] == [("balloon-moving", 0.0)]


def test_a_configuration_change_is_in_flight_until_the_node_follows_it():
    judge = Judge(MACHINE, TA)
    topology = {"g": ctr("guaranteed", "4", "1", 1), "b": ctr("burstable", "1-3", "0", 0.2),
                "w": ctr("burstable", "1-3,5-7", "0-1")}  # pools that overlap: no balloons
    judge.feed(10.0, topology)
    judge.change(BALLOONS, 20.0)
    judge.feed(21.0, topology)  # not moved yet: as before, nothing counted
    mixed = {"g": ctr("guaranteed", "4-5", "1", 2), "b": ctr("burstable", "3-4", "0-1", 0.2)}
    judge.feed(22.0, mixed)
    assert judge.violations == []  # known once the change is done: do g and b share CPU 4 then?
    after = {"g": ctr("guaranteed", "4", "1", 1), "b": ctr("burstable", "5", "1", 0.2)}
    judge.feed(25.0, after)
    assert judge.previous is not None  # it suits balloons, and the node has not said it applied it
    judge.applied(26.0)
    judge.feed(56.0, after)  # ... and a grace has passed since
    assert judge.switches == [("balloons", 5.0)] and judge.previous is None
    assert [v.kind for v in judge.violations] == ["switch-balloon-overlap"]  # neither before nor after


def test_a_snapshot_taken_before_a_change_was_written_is_judged_by_the_configuration_before_it():
    """The sampler's snapshots reach the judge seconds after they are taken: one from before the
    change that happens to suit both configurations does not end the change."""
    judge = Judge(MACHINE, TA)
    both = {"g": ctr("guaranteed", "4-5", "1", 2), "be": ctr("besteffort", "6-7", "1")}  # either policy's
    judge.change(BALLOONS, 20.0)
    judge.feed(18.0, both)
    assert judge.previous is not None and judge.switches == []
    topology = {"g": ctr("guaranteed", "4", "1", 1), "b": ctr("burstable", "1-3", "0", 0.2),
                "w": ctr("burstable", "1-3,5-7", "0-1")}
    judge.feed(19.0, topology)  # topology-aware's, not balloons': not a finding
    judge.feed(24.0, topology)  # still before the switch lands
    assert judge.violations == [] and judge.previous is not None
    judge.feed(30.0, both)
    judge.applied(30.0)
    judge.feed(60.0, both)
    assert judge.switches == [("balloons", 10.0)] and judge.violations == []


def test_in_a_switch_containers_of_one_balloon_to_be_may_share_its_cpus_as_they_move():
    """topology-aware -> balloons: a Burstable container moved first into the balloon a Guaranteed
    one is to join shares CPUs the Guaranteed one held as its own; once both are in the balloon,
    they share them as the new policy has it: a move, not a violation. Had the switch not been
    done within its bound, it would count."""
    for done in (True, False):
        judge = Judge(MACHINE, TA, switch_bound=60)
        judge.feed(10.0, {"g": ctr("guaranteed", "12-15", "3", 4), "b": ctr("burstable", "4-7", "1", 0.2)})
        judge.change(BALLOONS, 20.0)
        judge.feed(22.0, {"g": ctr("guaranteed", "12-15", "3", 4), "b": ctr("burstable", "10-13", "2-3", 0.2)})
        assert judge.violations == []
        if done:
            one = {"g": ctr("guaranteed", "10-13", "2-3", 4), "b": ctr("burstable", "10-13", "2-3", 0.2)}
            judge.feed(24.0, one)
            judge.applied(24.0)
            judge.feed(54.0, one)
            assert judge.previous is None and judge.violations == []
        else:
            judge.feed(90.0, {"g": ctr("guaranteed", "12-15", "3", 4), "b": ctr("burstable", "10-13", "2-3", 0.2)})
            assert [v.kind for v in judge.violations] == ["switch-balloon-overlap", "balloon-overlap"]


def test_a_mix_of_a_change_the_run_ends_in_counts():
    judge = Judge(MACHINE, TA)
    judge.feed(10.0, {"g": ctr("guaranteed", "12-15", "3", 4), "b": ctr("burstable", "4-7", "1", 0.2)})
    judge.change(BALLOONS, 20.0)
    judge.feed(22.0, {"g": ctr("guaranteed", "12-15", "3", 4), "b": ctr("burstable", "10-13", "2-3", 0.2)})
    judge.finish()
    assert [v.kind for v in judge.violations] == ["switch-balloon-overlap"]


def test_before_a_switch_lands_the_old_policys_own_moves_are_judged_by_its_graces():
    """Written to the cluster, not yet applied: balloons still moving a balloon (a subset growing)
    breaks topology-aware's exclusivity, but as the balloons it still is, it is a move in flight."""
    judge = Judge(MACHINE, BALLOONS, grace=30)
    judge.feed(10.0, {"g": ctr("guaranteed", "8-10", "2", 2), "be": ctr("besteffort", "8-10", "2")})
    judge.change(TA, 20.0)
    growing = {"g": ctr("guaranteed", "8-10", "2", 2), "be": ctr("besteffort", "8-10", "2"),
               "b": ctr("burstable", "8-11", "2", 0.2)}
    assert kinds(growing, BALLOONS) == ["balloon-moving"] and "exclusive-shared" in kinds(growing)
    judge.feed(21.0, growing)
    assert judge.violations == []


def test_a_reboot_waits_for_the_change_in_flight_to_be_followed_for_settle_at_most(monkeypatch):
    import threading
    import time
    from types import SimpleNamespace

    from harness.soak import run

    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    judge = Judge(MACHINE, TA)
    followed_at = [1030.0]

    def sleep(s):
        now[0] += s
        if now[0] >= followed_at[0]:
            judge.previous = None  # a snapshot followed the change

    monkeypatch.setattr(time, "sleep", sleep)
    soak = SimpleNamespace(configs=SimpleNamespace(log=[(990.0, "policy switch to balloons")]),
                           _ending=threading.Event(), _lock=threading.Lock(), judge=judge)
    soak._in_flight = lambda: run.Soak._in_flight(soak)
    judge.previous = TA
    run.Soak._settle(soak)
    assert now[0] == 1030.0  # followed: no longer
    followed_at[0], judge.previous = math.inf, TA
    run.Soak._settle(soak)
    assert now[0] == 990.0 + run.SETTLE  # never followed: SETTLE at most
    run.Soak._settle(soak)
    assert now[0] == 990.0 + run.SETTLE  # long past: no wait


def test_placements_through_a_reboot_count_only_the_pods_that_lived_through_it_and_name_what_moved():
    from harness.soak.report import placements_kept

    before = {("g1-3", "main"): "2", ("g2-5", "main"): "4-5", ("g1-7", "main"): "3"}
    after = {("g1-3", "main"): "2", ("g2-5", "main"): "6-7", ("g1-9", "main"): "3"}  # g1-7 deleted meanwhile
    assert placements_kept(before, after) == {
        "placements kept": "1 of 2",
        "placements moved": ["g2-5/main 4-5 -> 6-7: its CPUs held by no Guaranteed container"],
        "pods not through the reboot": 1}
    # Who took a moved container's CPUs: a pod new since the reboot, or one that lived through it.
    taken = {**after, ("g1-9", "main"): "4", ("g1-3", "main"): "5"}
    assert placements_kept(before, taken)["placements moved"] == [
        "g1-3/main 2 -> 5: its CPUs held by no Guaranteed container",
        "g2-5/main 4-5 -> 6-7: its CPUs held by g1-3/main, g1-9/main (new)"]
    assert placements_kept(before, before) == {"placements kept": "3 of 3"}
    # A 1-CPU pod resized to 2 comes back from the reboot at its new size, where it was.
    grown = {**before, ("g1-3", "main"): "2-3"}
    assert placements_kept(before, grown) == {"placements kept": "3 of 3",
                                              "grown where they were": ["g1-3/main 2 -> 2-3"]}


JOURNAL = """\
1000.10 node ctrd: msg="closing plugin cri-resmgr, failed to handle CreateContainer request: ttrpc: closed"
1400.00 node ctrd: msg="failed to handle CreateContainer request: context deadline exceeded"
1030.50 node cri-resmgr[412]: NRI: synchronized 9 pods, 14 containers in 58.0 ms; 1 container(s) updated
1500.00 node cri-resmgr[412]: NRI: synchronized 9 pods, 14 containers in 61.0 ms; 0 container(s) updated
2000.00 node containerd[300]: level=error msg="closing plugin cri-resmgr, failed to handle CreateContainer request: EOF"
"""


def test_the_nri_window_runs_from_a_create_the_plugin_died_answering_to_its_next_synchronization():
    from harness.soak.judge import nri_windows

    # The last: no sync yet. A deadline (the plugin slow, not killed) opens nothing.
    assert nri_windows(JOURNAL, bound=300) == [(1000.10, 1030.50), (2000.0, 2300.0)]
    assert nri_windows("-- No entries --\n") == []


def test_an_upgrade_window_runs_from_the_soaks_install_to_the_plugins_next_synchronization():
    """The package's postinst restarts the plugin: what containerd makes meanwhile has no plugin to
    ask. The window opens at the soak's own dpkg -i, not at a synchronization before it."""
    from harness.soak.judge import upgrade_windows

    assert upgrade_windows(JOURNAL, [1020.0, 1450.0, 1600.0], bound=300) == [
        (1020.0, 1030.5), (1450.0, 1500.0), (1600.0, 1900.0)]
    assert upgrade_windows(JOURNAL, []) == []  # no install of the soak's: no window


def test_what_containerd_made_without_the_plugin_is_set_apart_and_nothing_else():
    """A Burstable container made in the window runs on every CPU until the plugin is back: set
    apart. One made before it, or a finding that outlasts the plugin's return, stays a violation."""
    judge = Judge(MACHINE, TA, grace=30)
    placed = {"g": ctr("guaranteed", "4", "1", 1), "old": ctr("burstable", "1-3", "0", 0.2)}
    judge.feed(990.0, placed)
    judge.feed(1010.0, {**placed, "new": ctr("burstable", "0-15", "0-3", 0.2)})  # made without the plugin
    judge.feed(1040.0, {**placed, "new": ctr("burstable", "5-7", "1", 0.2)})  # placed once the plugin is back
    judge.feed(1200.0, {**placed, "new": ctr("burstable", "5-7", "1", 0.2), "old": ctr("burstable", "1-4", "0-1")})
    judge.feed(1210.0, placed)
    judge.feed(1700.0, {**placed, "late": ctr("burstable", "0-15", "0-3", 0.2)})  # in no window
    judge.feed(2010.0, {**placed, "new2": ctr("burstable", "0-15", "0-3", 0.2)})
    judge.feed(2400.0, {**placed, "new2": ctr("burstable", "0-15", "0-3", 0.2)})  # past the window's bound
    judge.finish()
    apart = judge.set_apart([(1000.1, 1030.5), (2000.0, 2300.0)])
    assert [(v.kind, v.key) for v in apart] == [("exclusive-shared", "g/new")]
    assert [(v.kind, v.key) for v in judge.violations if v.kind == "exclusive-shared"] == [
        ("exclusive-shared", "g/old"), ("exclusive-shared", "g/late"), ("exclusive-shared", "g/new2")]
    assert {v.key for v in judge.violations} == {"g/old", "g/late", "g/new2", "new2"}  # and new2's lasting pool


def test_a_balloon_of_containers_all_made_without_the_plugin_is_set_apart_one_with_others_is_not():
    """A Guaranteed container containerd made while the plugin was down runs on every CPU: a
    balloon of one, too big. Set apart within the window; a too big balloon with a member made
    outside every window stays a violation."""
    judge = Judge(MACHINE, BALLOONS, grace=30)
    judge.feed(990.0, {"old": ctr("guaranteed", "8-10", "2", 3)})
    for t in (1010.0, 1030.0, 1050.0):
        judge.feed(t, {"old": ctr("guaranteed", "8-10", "2", 3), "new": ctr("guaranteed", "0-15", "0-3", 1)})
    judge.feed(1060.0, {"old": ctr("guaranteed", "8-10", "2", 3), "new": ctr("guaranteed", "11", "2", 1)})
    for t in (1100.0, 1120.0, 1140.0):  # old grows far past the type's bound: nobody made it apart
        judge.feed(t, {"old": ctr("guaranteed", "0-15", "0-3", 3), "new": ctr("guaranteed", "0-15", "0-3", 1)})
    judge.finish()
    apart = judge.set_apart([(1000.0, 1040.0)])
    assert ("balloon-size", "0-15") in [(v.kind, v.key) for v in apart]
    assert ("balloon-size", "0-15") in [(v.kind, v.key) for v in judge.violations]  # the later one


def test_a_switch_is_excused_until_the_node_reports_it_applied_and_a_grace_more():
    """After a switch to topology-aware, a BestEffort container left on a Guaranteed container's
    CPUs reads as one balloon of the old policy: in flight while the change lands, then counted."""
    for applied in (5.0, None):
        judge = Judge(MACHINE, BALLOONS, grace=30, switch_bound=120)
        one_balloon = {"g": ctr("guaranteed", "4", "1", 1), "be": ctr("besteffort", "4", "1")}
        judge.feed(0.0, one_balloon)
        judge.change(TA, 10.0)
        if applied is not None:
            judge.applied(10.0 + applied)
        for t in range(12, 140, 2):
            judge.feed(float(t), one_balloon)
        counted = [v.first for v in judge.violations if v.kind == "exclusive-shared"]
        assert counted == ([46.0] if applied else [130.0])  # applied + grace, or the bound


def test_a_freeze_of_containerd_during_a_switch_holds_its_moves_for_as_long_and_no_longer():
    """The switch's moves cannot reach the kernel while the soak holds containerd frozen: the bound
    grows by the freeze, the grace runs from the thaw; a freeze before the switch excuses nothing."""
    one_balloon = {"g": ctr("guaranteed", "4", "1", 1), "be": ctr("besteffort", "4", "1")}
    for stall, applied, first in (((14.0, 104.0), 15.0, 134.0), ((14.0, 104.0), None, 220.0),
                                  ((0.0, 8.0), 15.0, 46.0)):
        judge = Judge(MACHINE, BALLOONS, grace=30, switch_bound=120)
        judge.feed(0.0, one_balloon)
        judge.change(TA, 10.0)
        judge.stalled(stall[0])  # the thaw's time is known once it comes
        if applied is not None:
            judge.applied(applied)
        for t in range(12, 240, 2):
            if t == int(stall[1]) + 2 or (t == 12 and stall[1] < 12):
                judge.stalled(*stall)
            judge.feed(float(t), one_balloon)
        assert [v.first for v in judge.violations if v.kind == "exclusive-shared"] == [first], stall


def test_a_finding_keeps_its_first_seen_time_through_a_switch_and_counts_at_the_end():
    judge = Judge(MACHINE, TA, grace=30)
    wrong = {"g": ctr("guaranteed", "4", "1", 1), "b": ctr("burstable", "5-7", "0-1", 0.2)}
    judge.feed(0.0, wrong)
    judge.change(BALLOONS, 10.0)
    judge.feed(12.0, wrong)  # the old policy's too: in flight
    judge.feed(20.0, wrong)
    judge.applied(14.0)
    judge.feed(45.0, wrong)  # the switch's grace is over: memory wrong since 0
    assert [(v.kind, v.first) for v in judge.violations] == [("memory", 0.0)]
    # A finding open at the end counts once it has lasted the grace, excused or not.
    judge = Judge(MACHINE, TA, grace=30, slow_grace=180)
    moving = {"g": ctr("guaranteed", "4", "1", 1), "b": ctr("burstable", "5-6", "1", 0.2)}
    judge.feed(0.0, {**moving, "g7": ctr("guaranteed", "7", "1", 1)})
    judge.feed(2.0, moving)
    judge.feed(172.0, moving)
    assert judge.violations == []
    judge.finish()
    assert [v.kind for v in judge.violations] == ["pool"]


def test_a_finding_both_configurations_make_is_timed_from_its_first_sighting_in_a_switch():
    judge = Judge(MACHINE, TA, grace=30)
    right = {"g": ctr("guaranteed", "4", "1", 1), "b": ctr("burstable", "5-7", "1", 0.2)}
    judge.feed(0.0, right)
    judge.change(Expect("topology-aware", CPUSet([0, 1])), 10.0)  # an option of the same policy
    judge.applied(12.0)  # the switch excuse ends at 42
    wrong = {"g": ctr("guaranteed", "4", "1", 1), "b": ctr("burstable", "5-7", "0-1", 0.2)}
    for t in range(12, 50, 2):
        judge.feed(float(t), wrong)
    assert [(v.kind, v.first) for v in judge.violations] == [("memory", 12.0)]


def test_a_finding_back_after_a_long_dip_between_two_snapshots_is_a_new_one():
    """The sampler writes a snapshot only when something changes: one clean snapshot and the next,
    30 s later, with the finding again, is a dip of 30 s."""
    judge = Judge(MACHINE, TA, grace=30)
    wrong = {"b": ctr("burstable", "1-3", "0-1", 0.2)}
    right = {"b": ctr("burstable", "1-3", "0", 0.2)}
    judge.feed(0.0, wrong)
    judge.feed(20.0, right)
    judge.feed(50.0, wrong)
    judge.feed(60.0, wrong)
    assert judge.violations == []


def test_at_the_end_a_finding_that_lasted_the_grace_lingers_whatever_excused_it():
    judge = Judge(MACHINE, TA, grace=30, slow_grace=180)
    moving = {"g": ctr("guaranteed", "4", "1", 1), "b": ctr("burstable", "5-6", "1", 0.2)}
    judge.feed(0.0, {**moving, "g7": ctr("guaranteed", "7", "1", 1)})
    judge.feed(2.0, moving)  # CPU 7 released: the pool finding excused
    judge.feed(20.0, moving)
    assert judge.lingering() == []  # younger than the grace
    judge.feed(40.0, moving)
    assert [v.kind for v in judge.lingering()] == ["pool"] and judge.stuck() == []
    judge.feed(44.0, {"g": ctr("guaranteed", "4", "1", 1), "b": ctr("burstable", "5-7", "1", 0.2)})
    assert judge.lingering() == []  # cleared: nothing to count at the end


def test_an_exclusive_cpu_shared_only_in_reads_no_second_read_agreed_with_is_caught():
    """While containers move all the time no two reads agree and no snapshot is written: a short
    overlap is judged from the read that saw it, and counts once however often it is seen."""
    judge = Judge(MACHINE, TA)
    clean = {"g": ctr("guaranteed", "4", "1", 1), "b": ctr("burstable", "5-7", "1", 0.2)}
    judge.feed(10.0, clean)
    overlap = {"g": ctr("guaranteed", "4", "1", 1), "b": ctr("burstable", "4-7", "1", 0.2)}
    judge.glance(11.0, overlap)
    judge.glance(11.1, overlap)
    judge.feed(12.0, clean)
    assert [(v.kind, v.first) for v in judge.violations] == [("exclusive-shared", 11.0)]


def test_a_read_no_second_read_agreed_with_is_held_only_to_what_counts_at_once():
    judge = Judge(MACHINE, TA, grace=30)
    half_moved = {"g": ctr("guaranteed", "4", "1", 1), "b": ctr("burstable", "5", "0-1", 0.2)}  # memory, pool
    for t in range(0, 100, 2):
        judge.glance(float(t), half_moved)
    assert judge.violations == []


def test_in_a_switch_a_read_that_mixes_the_two_configurations_is_judged_once_the_switch_is_done():
    judge = Judge(MACHINE, BALLOONS)
    balloons = {"g": ctr("guaranteed", "4-5", "1", 2), "b": ctr("burstable", "6-7", "1", 0.2)}
    judge.feed(10.0, balloons)
    judge.change(TA, 20.0)
    # Neither configuration's: b moved onto CPU 5 of g's (balloons: two sets partly overlapping).
    judge.glance(22.0, {"g": ctr("guaranteed", "4-5", "1", 2), "b": ctr("burstable", "5-6", "1", 0.2)})
    assert judge.violations == []
    after = {"g": ctr("guaranteed", "4-5", "1", 2), "b": ctr("burstable", "1-3,6-7", "0-1", 0.2)}
    judge.feed(25.0, after)
    judge.applied(25.0)
    judge.feed(55.0, after)
    assert [v.kind for v in judge.violations] == ["switch-exclusive-shared"]  # shared neither before nor after


def test_a_layout_that_suits_both_configurations_does_not_end_a_switch_before_its_moves():
    """topology-aware's pools read as podpools' disjoint sets: the snapshots right after a switch
    to podpools suit it before anything moved. The moves that follow are judged as a switch's
    (two containers may share CPUs they share once it is done), not as a finding of their own."""
    judge = Judge(MACHINE, TA)
    topology = {"g": ctr("guaranteed", "4-5", "1", 2), "b": ctr("burstable", "1-3", "0", 0.2),
                "be": ctr("besteffort", "6-7", "1")}
    assert kinds(topology, PODPOOLS) == []
    judge.feed(10.0, topology)
    judge.change(PODPOOLS, 20.0)
    judge.feed(21.0, topology)  # followed, as far as a snapshot can tell, but not applied yet
    assert judge.previous is not None and judge.switches == [("podpools", 1.0)]
    judge.feed(23.0, {"g": ctr("guaranteed", "4-5", "1", 2), "b": ctr("burstable", "3-4", "0-1", 0.2),
                      "be": ctr("besteffort", "6-7", "1")})  # b on its way into g's pool
    judge.applied(24.0)
    pool = {"g": ctr("guaranteed", "4-7", "1", 2), "b": ctr("burstable", "4-7", "1", 0.2),
            "be": ctr("besteffort", "1-3", "0")}
    judge.feed(26.0, pool)
    judge.feed(56.0, pool)
    assert judge.previous is None and judge.violations == []


def test_once_a_switch_is_followed_its_findings_but_shared_cpus_are_judged_as_ever():
    """Until the node applied it and a grace more, a switch may still be moving containers; only
    two containers sharing CPUs are its moves' to explain. A wrong memory node counts after the
    grace, and a pair sharing CPUs neither before nor after counts once the switch is done."""
    judge = Judge(MACHINE, TA, grace=10)
    topology = {"g": ctr("guaranteed", "4-5", "1", 2), "b": ctr("burstable", "1-3", "0", 0.2)}
    judge.feed(10.0, topology)
    judge.change(PODPOOLS, 20.0)
    judge.feed(21.0, topology)
    wrong = {"g": ctr("guaranteed", "4-5", "1", 2), "b": ctr("burstable", "1-3", "1", 0.2)}
    for t in (23.0, 35.0):
        judge.feed(t, wrong)
    assert [v.kind for v in judge.violations] == ["memory"] and judge.previous is not None
    judge.feed(37.0, {"g": ctr("guaranteed", "4-5", "1", 2), "b": ctr("burstable", "3-4", "0-1", 0.2)})
    judge.applied(38.0)
    judge.feed(60.0, topology)
    assert judge.previous is None and [v.kind for v in judge.violations] == ["memory", "switch-balloon-overlap"]


def test_an_nri_window_excuses_only_where_the_soak_killed_the_plugin():
    from harness.soak.run import killed_windows

    windows = [(1000.1, 1030.5), (2000.0, 2300.0)]
    assert killed_windows(windows, [999.0]) == ([(1000.1, 1030.5)], [(2000.0, 2300.0)])
    assert killed_windows(windows, []) == ([], windows)  # the plugin died of itself: nothing excused
    assert killed_windows(windows, [1500.0]) == ([], windows)


def test_the_short_forms_rotation_covers_both_modes_in_both_policies_and_a_reboot_in_each():
    from harness.soak.config import START
    from harness.soak.run import ROTATION, form_of

    forms = {form_of(seed) for seed in range(len(ROTATION))}
    assert {(m, p) for m, p, _ in forms} == {(m, p) for m in ("relay", "nri") for p in START}
    assert {m for m, _, r in forms if r} == {"relay", "nri"} and {p for _, p, r in forms if r} == set(START)


STATIC = Expect("static", CPUSet([0]))
PODPOOLS = Expect("podpools", CPUSet([0]))


def test_a_node_as_static_places_it_breaks_nothing_and_what_it_must_not_do_is_caught():
    every = "0-3"
    ok = {"g": ctr("guaranteed", "4", every, 1), "g2": ctr("guaranteed", "8-9", every, 2),
          "b": ctr("burstable", "0-3,5-7,10-15", every, 0.5), "be": ctr("besteffort", "0-3,5-7,10-15", every)}
    assert kinds(ok, STATIC) == []  # the reserved CPU in the default set, memory on every node
    assert kinds({**ok, "be": ctr("besteffort", "1-3,5-7,10-15", every)}, STATIC) == ["pool"]
    assert kinds({**ok, "be": ctr("besteffort", "0-15", every)}, STATIC) == ["exclusive-shared"] * 2 + ["pool"]
    # Memory a policy before it placed, left in place: the container may use only node 1.
    assert kinds({**ok, "g": ctr("guaranteed", "4", "1", 1)}, STATIC) == ["memory"]


def test_a_node_as_podpools_places_it_breaks_nothing_and_overlapping_pools_are_caught():
    ok = {"p1": ctr("burstable", "14-15", "3", 0.3), "p2": ctr("besteffort", "14-15", "3"),
          "p3": ctr("besteffort", "12-13", "3"), "d": ctr("guaranteed", "1-9", "0-2", 1)}
    assert kinds(ok, PODPOOLS) == []
    assert kinds({**ok, "p3": ctr("besteffort", "13-14", "3")}, PODPOOLS) == ["balloon-overlap"]
    assert kinds({**ok, "p3": ctr("besteffort", "0,12-13", "0,3")}, PODPOOLS) == ["reserved"]
    # A pool's pods share its CPUs whatever they ask: Guaranteed pods a switch brought into the
    # default pool may ask for more than it has (balloons would grow it, podpools does not).
    crowded = {**ok, "d2": ctr("guaranteed", "1-9", "0-2", 4), "d3": ctr("guaranteed", "1-9", "0-2", 6)}
    assert kinds(crowded, PODPOOLS) == [] and kinds(crowded, Expect("balloons", CPUSet([0]))) == ["balloon-size"]


def test_every_configuration_the_soak_writes_makes_its_policy_on_the_soaks_node():
    """A configuration the policy refused would be a soak of the fallback, not of the policy."""
    from harness.soak.config import GROUPS, expect_of
    from resmgr import policies
    from tests.support.world import machine as topology

    node = topology("sockets=2,nodes=2,cores=2,threads=2")  # the VM tier's Shape: 4 nodes of 4 CPUs
    for group, spec in GROUPS.items():
        policy = policies.create(spec["policy"]["Active"], spec["policy"], node)
        assert policy.name == expect_of(spec).policy, group


def test_a_balloon_reshaped_while_read_is_not_two_balloons_that_overlap():
    """Two members of one balloon moved from 4-6 to 5-7, read apart: one on each set."""
    judge = Judge(MACHINE, BALLOONS)
    judge.feed(10.0, {"a": ctr("burstable", "4-6", "1"), "b": ctr("besteffort", "4-6", "1")})
    judge.glance(11.0, {"a": ctr("burstable", "4-6", "1"), "b": ctr("besteffort", "5-7", "1")})
    judge.feed(12.0, {"a": ctr("burstable", "5-7", "1"), "b": ctr("besteffort", "5-7", "1")})
    assert judge.violations == []


AWAY = """\
1000.00 node ctrd: level=info msg="starting containerd" revision= version=v2.4.2
1003.00 node ctrd: msg="CreateContainer within sandbox \\"s1\\" returns container id \\"a\\""
1004.00 node ctrd: msg="CreateContainer within sandbox \\"s2\\" returns container id \\"b\\""
1020.00 node cri-resmgr[412]: NRI: synchronized 9 pods, 14 containers in 58.0 ms; 2 container(s) updated
1030.00 node ctrd: msg="CreateContainer within sandbox \\"s3\\" returns container id \\"c\\""
2000.00 node containerd[301]: level=info msg="starting containerd" revision= version=v2.4.2
2010.00 node cri-resmgr[412]: NRI: synchronized 9 pods, 15 containers in 58.0 ms; 0 container(s) updated
2020.00 node containerd[301]: msg="CreateContainer within sandbox \\"s4\\" returns container id \\"d\\""
3000.00 node containerd[302]: level=info msg="starting containerd" revision= version=v2.4.2
3100.00 node containerd[302]: msg="CreateContainer within sandbox \\"s5\\" returns container id \\"e\\""
"""


def test_containers_made_before_the_plugin_was_back_after_containerd_started_open_a_window():
    """After a reboot kubelet's creates can reach containerd before the plugin has registered: they
    run on every CPU until its synchronization (NRI's design, docs/nri.md). A start the plugin was
    back from before any create opens nothing; creates after its synchronization are its own."""
    from harness.soak.judge import away_windows

    assert away_windows(AWAY, bound=300) == [(1000.0, 1003.0, 1020.0), (3000.0, 3100.0, 3400.0)]
    assert away_windows("-- No entries --\n") == []


def test_an_away_window_excuses_only_where_the_soak_restarted_containerd_or_rebooted_the_node():
    from harness.soak.judge import away_windows
    from harness.soak.run import restarted_windows

    windows = away_windows(AWAY, bound=300)
    # The reboot struck at 2890 (containerd up 110 s later); the first start was no doing of the soak's.
    assert restarted_windows(windows, [2890.0]) == ([(3100.0, 3400.0)], [(1003.0, 1020.0)])
    assert restarted_windows(windows, []) == ([], [(1003.0, 1020.0), (3100.0, 3400.0)])
    assert restarted_windows(windows, [500.0]) == ([], [(1003.0, 1020.0), (3100.0, 3400.0)])


CLAIMED = {"7-8": 2}  # the UID of the pod whose slice is kubepods-besteffort-pod7_8.slice -> its claim's CPUs


def claiming(cpus: str, mems: str, runs: str = "started") -> list[str]:
    return ["kubepods-besteffort-pod7_8.slice", cpus, mems, "max 100000", "100", runs]


def test_a_claimed_container_holds_its_claims_cpus_as_its_own():
    """A pod of a DRA claim: its container runs on the claim's CPUs, no other container there, and
    the shared containers of its pool run on the pool's others."""
    snap = {"dc": claiming("4-5", "1"), "b": ctr("burstable", "6-7", "1", 0.2)}
    assert sorted(f.kind for f in findings(parse(snap, CLAIMED), TA, MACHINE)) == []
    static = Expect("static", CPUSet([0]))
    wide = {"dc": claiming("4-5", "0-3"), "b": ctr("burstable", "0-3,6-15", "0-3", 0.2)}
    assert sorted(f.kind for f in findings(parse(wide, CLAIMED), static, MACHINE)) == []
    # Created, not started: its CPUs held already.
    waiting = {"dc": claiming("4-5", "1", runs="created"), "b": ctr("burstable", "6-7", "1", 0.2)}
    assert sorted(f.kind for f in findings(parse(waiting, CLAIMED), TA, MACHINE, held(waiting, CLAIMED))) == []
    # Without the claim known, the same container is a shared one off its pool: the claim is what
    # the judge holds it to.
    assert sorted(f.kind for f in findings(parse(snap), TA, MACHINE)) == ["pool", "pool"]


def test_a_claimed_container_on_other_cpus_than_its_claims_or_beside_another_is_caught():
    judge = Judge(MACHINE, TA, grace=30, claimed=dict(CLAIMED))
    judge.feed(100.0, {"dc": claiming("4-6", "1"), "b": ctr("burstable", "7", "1", 0.2)})  # 3 CPUs for a claim of 2
    judge.feed(131.0, {"dc": claiming("4-6", "1"), "b": ctr("burstable", "7", "1", 0.2)})
    assert [v.kind for v in judge.violations] == ["exclusive-count"]
    shared = Judge(MACHINE, TA, grace=30, claimed=dict(CLAIMED))
    shared.feed(100.0, {"dc": claiming("4-5", "1"), "b": ctr("burstable", "5-7", "1", 0.2)})
    assert "exclusive-shared" in [v.kind for v in shared.violations]  # at once
    unclaimed = Judge(MACHINE, TA, grace=30)
    unclaimed.feed(100.0, {"dc": claiming("4-5", "1"), "b": ctr("burstable", "5-7", "1", 0.2)})
    assert "exclusive-shared" not in [v.kind for v in unclaimed.violations]


def test_a_claim_prepared_before_its_pod_runs_anything_holds_as_many_cpus_as_it_claims():
    """kubelet prepares a claim before it makes the pod's sandbox, and cri-resmgr takes the claim's
    CPUs from the shared ones then: while the pod runs nothing of its own the kernel shows how many
    CPUs are gone from the default set, not which (a local run: 61 s during an upgrade)."""
    static = Expect("static", CPUSet([0]))
    narrowed = {"b": ctr("burstable", "0-1,4-15", "0-3", 0.2)}
    sandbox = {"dc-pause": claiming("0-15", "0-3", runs="pause")}
    assert [f.kind for f in findings(parse(narrowed, CLAIMED), static, MACHINE)] == ["pool"]  # no unseen given
    judge = Judge(MACHINE, static, grace=30, claimed=dict(CLAIMED))
    for t in range(0, 200, 10):
        judge.feed(float(t), {**narrowed, **sandbox})
    assert judge.violations == []
    # Short by more CPUs than the claim holds, or once its container runs: off the default set.
    wider = {"b": ctr("burstable", "0,4-15", "0-3", 0.2), **sandbox}
    assert [f.kind for f in findings(parse(wider, CLAIMED), static, MACHINE, unseen=2)] == ["pool"]
    running = {**narrowed, **sandbox, "dc": claiming("2-3", "0-3")}
    assert unseen_claims(running, CLAIMED) == 0
    assert unseen_claims({**narrowed, **sandbox}, CLAIMED) == 2
    assert unseen_claims({**narrowed, **sandbox}, {}) == 0
    # Before its sandbox too (kubelet prepares first), until the pod is deleted and gone.
    assert unseen_claims(narrowed, CLAIMED) == 2
    assert unseen_claims(narrowed, CLAIMED, unclaimed={"7-8"}) == 0
    assert unseen_claims({**narrowed, **sandbox}, CLAIMED, unclaimed={"7-8"}) == 2


A, B = "a" * 64, "b" * 64
REFUSED = f"""\
1000.00 node ctrd: level=info msg="UpdateContainerResources for \\"{A}\\" with Linux: cpuset_cpus:\\"8-15\\""
1030.00 node ctrd: msg="UpdateContainerResources for \\"{A}\\" failed" error="context deadline exceeded"
1031.00 node ctrd: level=info msg="UpdateContainerResources for \\"{A}\\" with Linux: cpuset_cpus:\\"8-15\\""
1061.00 node ctrd: msg="UpdateContainerResources for \\"{A}\\" failed" error="task: context deadline exceeded"
1070.00 node ctrd: level=info msg="UpdateContainerResources for \\"{A}\\" with Linux: cpuset_cpus:\\"8-15\\""
1071.00 node ctrd: level=info msg="UpdateContainerResources for \\"{A}\\" returns successfully"
1200.00 node ctrd: level=info msg="UpdateContainerResources for \\"{B}\\" with Linux: cpuset_cpus:\\"99\\""
1200.10 node ctrd: level=error msg="UpdateContainerResources for \\"{B}\\" failed" error="invalid cpuset 99"
1300.00 node ctrd: level=info msg="UpdateContainerResources for \\"{B}\\" with Linux: cpuset_cpus:\\"5\\""
1310.00 node ctrd: level=error msg="UpdateContainerResources for \\"{B}\\" failed" error="context canceled"
"""


def test_a_refused_window_runs_from_an_update_containerd_stalled_on_to_its_next_success():
    """Only a stall (a deadline) opens a window: containerd refusing an update as invalid is no
    excuse for where the container stays."""
    from harness.soak.judge import refused_windows

    assert refused_windows(REFUSED, bound=300) == {A: [(1000.0, 1071.0)], B: [(1300.0, 1600.0)]}
    assert refused_windows("-- No entries --\n") == {}


def test_a_container_left_where_it_was_while_containerd_stalled_on_its_update_is_excused_and_nothing_else():
    """A shared container narrower than its pool while containerd does not get to its update: set
    apart (refused). Longer than containerd's stall, of another container, or an exclusive CPU
    shared meanwhile: still violations."""
    judge = Judge(MACHINE, TA, grace=30)
    narrow = {"g": ctr("guaranteed", "4", "1", 1), A: ctr("burstable", "5-6", "1", 0.2)}  # 7 left out
    for t in (1010.0, 1050.0, 1090.0):
        judge.feed(t, narrow)
    judge.feed(1095.0, {"g": ctr("guaranteed", "4", "1", 1), A: ctr("burstable", "5-7", "1", 0.2)})
    for t in (1200.0, 1240.0, 1280.0):  # the same, past the stall's end: not excused
        judge.feed(t, narrow)
    judge.feed(1285.0, {"g": ctr("guaranteed", "4", "1", 1), A: ctr("burstable", "5-7", "1", 0.2)})
    for t in (1400.0, 1440.0):  # another container's finding, and an exclusive CPU shared
        judge.feed(t, {"g": ctr("guaranteed", "4", "1", 1), A: ctr("burstable", "5-7", "1", 0.2),
                       B: ctr("burstable", "4-7", "1", 0.2)})
    judge.finish()
    apart = judge.excuse_refused({A: [(1000.0, 1071.0), (1400.0, 1450.0)]})
    assert [(v.kind, v.first) for v in apart] == [("pool", 1010.0)]
    assert sorted((v.kind, v.first) for v in judge.violations) == [
        ("exclusive-shared", 1400.0), ("pool", 1200.0), ("pool", 1400.0)]
