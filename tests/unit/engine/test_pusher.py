"""The order of many pushes at once: what only gives CPUs up lands before what takes CPUs."""

from __future__ import annotations

import asyncio

from resmgr.engine.ledger import Ledger
from resmgr.engine.pusher import Pusher
from resmgr.model import Container, ContainerState, Resources
from resmgr.topology.cpuset import CPUSet


class SlowRuntime:
    """Each update takes a while; what every container holds is watched at each step."""

    def __init__(self, held: dict[str, str]) -> None:
        self.held = dict(held)
        self.overlaps: list[str] = []

    async def update_resources(self, container_id: str, res: Resources) -> None:
        await asyncio.sleep(0.01 if res.cpuset_cpus != "4-7" else 0.05)  # the shrink is the slow one
        self.held[container_id] = res.cpuset_cpus
        sets = {k: CPUSet.parse(v) for k, v in self.held.items()}
        for a in sets:
            for b in sets:
                if a < b and sets[a] & sets[b]:
                    self.overlaps.append(f"{a} {self.held[a]} / {b} {self.held[b]}")


def ledger_of(cpus: dict[str, str]) -> Ledger:
    ledger = Ledger(None)  # type: ignore[arg-type] - the pusher reads only containers
    for cid, cpuset in cpus.items():
        ledger.containers[cid] = Container(cid, "pod", cid, state=ContainerState.RUNNING,
                                           resources=Resources(cpuset_cpus=cpuset))
    return ledger


def test_a_switch_moves_nobody_onto_cpus_another_still_runs_on():
    # a runs on 0-7 and is narrowed to 4-7; b moves from 8-11 onto 0-3, which a gives up.
    before = {"a": "0-7", "b": "8-11"}
    ledger = ledger_of(before)
    runtime = SlowRuntime(before)
    pusher = Pusher(ledger, runtime, lambda: None)
    updates = {"b": Resources(cpuset_cpus="0-3"), "a": Resources(cpuset_cpus="4-7")}
    pusher.note_held(updates)
    for key, res in updates.items():  # as Ledger.record takes them
        ledger.containers[key].resources, ledger.containers[key].pending = res, True
    asyncio.run(pusher.push_all(updates))
    assert runtime.held == {"a": "4-7", "b": "0-3"}
    assert runtime.overlaps == []
    assert not any(c.pending for c in ledger.containers.values())


def test_containers_that_swap_cpus_never_share_one():
    # A policy switch: g takes CPU 1 (b's) for its own and b moves onto 0 (g's). Whichever goes
    # first would share a CPU with the other; b first gives up CPU 1, keeping only CPUs it keeps.
    before = {"g": "0", "b": "1-3"}
    ledger = ledger_of(before)
    runtime = SlowRuntime(before)
    pusher = Pusher(ledger, runtime, lambda: None)
    updates = {"g": Resources(cpuset_cpus="1", cpu_quota=100000), "b": Resources(cpuset_cpus="0,2-3")}
    pusher.note_held(updates)
    for key, res in updates.items():
        ledger.containers[key].resources, ledger.containers[key].pending = res, True
    asyncio.run(pusher.push_all(updates))
    assert runtime.held == {"g": "1", "b": "0,2-3"}
    assert runtime.overlaps == []
    assert not any(c.pending for c in ledger.containers.values())
    assert pusher.held == {"g": "1", "b": "0,2-3"}


def test_what_the_runtime_holds_is_forgotten_with_the_container():
    ledger = ledger_of({"a": "0-1"})
    pusher = Pusher(ledger, SlowRuntime({"a": "0-1"}), lambda: None)
    pusher.note_held({"a": Resources(cpuset_cpus="1")})
    assert pusher.held == {"a": "0-1"}
    del ledger.containers["a"]
    asyncio.run(pusher.push_all([]))
    assert pusher.held == {}


def test_a_pushed_container_leaves_nothing_behind_when_it_goes():
    # Every container ever pushed kept its push lock: the daemon grew with each one gone.
    ledger = ledger_of({"a": "0-1"})
    pusher = Pusher(ledger, SlowRuntime({"a": "0-1"}), lambda: None)
    ledger.containers["a"].resources, ledger.containers["a"].pending = Resources(cpuset_cpus="1"), True
    asyncio.run(pusher.push("a"))
    del ledger.containers["a"]
    pusher.forget("a")
    assert pusher._locks == {} and pusher.held == {}


def applied_without_overlap(before: dict[str, str], steps: list[tuple[str, CPUSet]],
                            shared_after: frozenset[tuple[str, str]] = frozenset()) -> bool:
    """Whether applying steps one after the other ever has two containers on one CPU that did not
    share it before (or, for the pairs of shared_after, do share some after)."""
    now = {k: CPUSet.parse(v) for k, v in before.items()}
    shared_before = {(a, b) for a in now for b in now if a < b and now[a] & now[b]} | shared_after
    for key, cpus in steps:
        now[key] = cpus
        if any(a < b and now[a] & now[b] and (a, b) not in shared_before for a in now for b in now):
            return False
    return True


def test_a_sequence_of_moves_gives_cpus_up_before_they_are_taken_and_breaks_swaps():
    from resmgr.engine.moves import sequence

    p = CPUSet.parse
    # b takes what a leaves: a first.
    steps = sequence({"b": (p("8-11"), p("0-3")), "a": (p("0-7"), p("4-7"))})
    assert steps == [("a", p("4-7")), ("b", p("0-3"))]
    # A swap: b first steps aside to the CPUs it keeps, g moves, then b takes g's old CPU.
    before = {"g": "0", "b": "1-3"}
    steps = sequence({"g": (p("0"), p("1")), "b": (p("1-3"), p("0,2-3"))})
    assert steps == [("b", p("2-3")), ("g", p("1")), ("b", p("0,2-3"))]
    assert applied_without_overlap(before, steps)
    # Without narrowing (one update per container), the swap goes as it is.
    assert sequence({"g": (p("0"), p("1")), "b": (p("1-3"), p("0,2-3"))}, narrow=False) == \
        [("g", p("1")), ("b", p("0,2-3"))]
    # Where the runtime's CPUs are not known, nothing is held back.
    assert sequence({"x": (CPUSet(), p("1")), "y": (p("1"), p("2"))}) == [("y", p("2")), ("x", p("1"))]


def test_a_cycle_in_which_no_container_keeps_a_cpu_is_broken_by_a_step_onto_cpus_nobody_leaves():
    """A switch to static: g leaves CPU 12 (exclusive) for CPU 1, where a shared container c runs
    that moves to the default set 0,6-15, and b (13-15) joins that set. Each waits for another and c
    keeps none of its CPUs: c and b first go to the default set but CPU 12, then g, then the rest."""
    from resmgr.engine.moves import sequence

    p = CPUSet.parse
    before = {"g": "12", "c": "1-3", "b": "13-15"}
    moves = {"g": (p("12"), p("1")), "c": (p("1-3"), p("0,6-15")), "b": (p("13-15"), p("0,6-15"))}
    steps = sequence(moves)
    assert steps[-1] in [("b", p("0,6-15")), ("c", p("0,6-15"))] and ("g", p("1")) in steps
    assert applied_without_overlap(before, steps, frozenset({("b", "c")})), steps
    # The relay's pusher, wave by wave, the same.
    ledger = ledger_of(before)
    runtime = SlowRuntime(before)
    pusher = Pusher(ledger, runtime, lambda: None)
    updates = {k: Resources(cpuset_cpus=str(new)) for k, (_, new) in moves.items()}
    pusher.note_held(updates)
    for key, res in updates.items():
        ledger.containers[key].resources, ledger.containers[key].pending = res, True
    asyncio.run(pusher.push_all(updates))
    assert runtime.held == {"g": "1", "c": "0,6-15", "b": "0,6-15"}
    assert [o for o in runtime.overlaps if "g" in o.split()[::3]] == [], runtime.overlaps


def test_a_push_whose_outcome_is_unknown_may_hold_the_old_cpus_or_the_new():
    """An update that failed on a deadline may have been taken: until a push is confirmed the
    container may run on either (a resize then waits for it to leave the new ones too)."""

    class Late:
        async def update_resources(self, container_id: str, res: Resources) -> None:
            raise TimeoutError("DEADLINE_EXCEEDED")

    ledger = ledger_of({"a": "0-1"})
    pusher = Pusher(ledger, Late(), lambda: None)
    pusher.note_held({"a": Resources(cpuset_cpus="2-3")})
    assert pusher.held == {"a": "0-1"}
    ledger.containers["a"].resources, ledger.containers["a"].pending = Resources(cpuset_cpus="2-3"), True
    asyncio.run(pusher.push("a"))
    assert pusher.held == {"a": "0-3"} and ledger.containers["a"].pending


def pushed(before: dict[str, str], desired: dict[str, str], keys: list[str],
           exclusive: frozenset[str] = frozenset()) -> tuple[SlowRuntime, Pusher]:
    """push_all(keys) from containers running on before and desiring desired (pending where they differ)."""
    ledger = ledger_of(before)
    runtime = SlowRuntime(before)
    pusher = Pusher(ledger, runtime, lambda: None, shares=lambda key: key not in exclusive)
    pusher.held.update(before)
    for key, cpus in desired.items():
        c = ledger.containers[key]
        c.resources, c.pending = Resources(cpuset_cpus=cpus, cpu_quota=100000 if key in exclusive else 0), True
    asyncio.run(pusher.push_all(keys))
    return runtime, pusher


def test_a_move_onto_cpus_a_container_outside_the_push_is_still_to_leave_takes_its_move_along():
    # An earlier decision moved b off CPU 2 (a resize refused half way, never pushed); g now moves
    # onto CPU 2 in a push that names only g: b goes first.
    runtime, _ = pushed({"g": "8", "b": "2,10"}, {"g": "2", "b": "10"}, ["g"])
    assert runtime.held == {"g": "2", "b": "10"}
    assert runtime.overlaps == []


def test_a_swap_with_no_cpu_to_spare_steps_aside_onto_the_cpus_it_keeps_that_nobody_takes():
    # g moves from 8 to 2 and b from 2,10 to 8: b first runs on 10 alone, then g moves, then b.
    runtime, _ = pushed({"g": "8", "b": "2,10"}, {"g": "2", "b": "8"}, ["g", "b"])
    assert runtime.held == {"g": "2", "b": "8"}
    assert runtime.overlaps == []


def test_nothing_moves_onto_cpus_a_resize_under_way_still_runs_on():
    # r's resize gives up CPU 3 and has not reached the runtime: b's move onto 3, which its decision
    # recorded, waits (pending) until the resize has landed.
    before = {"r": "3", "b": "5"}
    ledger = ledger_of(before)
    runtime = SlowRuntime(before)
    pusher = Pusher(ledger, runtime, lambda: None)
    pusher.held.update(before)
    pusher.resizing["r"] = CPUSet.parse("3")
    ledger.containers["b"].resources, ledger.containers["b"].pending = Resources(cpuset_cpus="3"), True
    asyncio.run(pusher.push_all(["b"]))
    assert runtime.held == before and ledger.containers["b"].pending
    del pusher.resizing["r"]
    runtime.held["r"] = "4"
    pusher.held["r"] = "4"
    asyncio.run(pusher.push_all(["b"]))
    assert runtime.held["b"] == "3" and not ledger.containers["b"].pending


def test_a_push_in_flight_counts_as_holding_both_sets_until_the_runtime_answers():
    ledger = ledger_of({"b": "8"})
    held_meanwhile: list[str] = []

    class Watching(SlowRuntime):
        async def update_resources(self, container_id: str, res: Resources) -> None:
            held_meanwhile.append(pusher.held["b"])
            await super().update_resources(container_id, res)

    pusher = Pusher(ledger, Watching({"b": "8"}), lambda: None)
    pusher.held["b"] = "8"
    ledger.containers["b"].resources, ledger.containers["b"].pending = Resources(cpuset_cpus="9"), True
    asyncio.run(pusher.push_all(["b"]))
    assert held_meanwhile == ["8-9"] and pusher.held["b"] == "9"


def test_a_container_under_resize_is_not_pushed_the_decision_before_it():
    # r's resize is under way; the ledger still holds its decision before the resize (CPU 4), onto
    # which the resize has moved b: a push of r sends nothing until its resize has landed.
    ledger = ledger_of({"r": "4", "b": "4"})
    runtime = SlowRuntime({"r": "2", "b": "4"})
    pusher = Pusher(ledger, runtime, lambda: None)
    pusher.held.update(runtime.held)
    pusher.resizing["r"] = CPUSet()
    ledger.containers["r"].pending = True
    asyncio.run(pusher.push_all(["r"]))
    assert runtime.held == {"r": "2", "b": "4"} and ledger.containers["r"].pending


def test_a_step_aside_takes_no_cpu_another_container_still_runs_on_and_is_to_leave():
    # g runs on 14 and is to leave it (its move to 11 has not landed); b steps aside from CPUs a
    # resize gives up (4, 12) onto what is left of its desired 4,12,14: not 14 while g runs there.
    ledger = ledger_of({"g": "11", "b": "4,12,14"})
    runtime = SlowRuntime({"g": "14", "b": "13"})
    pusher = Pusher(ledger, runtime, lambda: None)
    pusher.held.update(runtime.held)
    ledger.containers["g"].pending = ledger.containers["b"].pending = True
    assert asyncio.run(pusher.step_aside("b", CPUSet.parse("4,12"))) is False
    assert runtime.held == {"g": "14", "b": "13"}


def test_a_restart_takes_where_a_container_whose_move_has_not_landed_runs_from_what_is_seen():
    ledger = ledger_of({"g": "11"})
    pusher = Pusher(ledger, SlowRuntime({"g": "14"}), lambda: None)
    pusher.seen_pending("g", ["14", "14"])
    assert pusher.held == {"g": "14"}
    pusher.seen_pending("g", ["11"])  # known already: a push of this life tells
    assert pusher.held == {"g": "14"}


def test_the_policy_sees_a_container_being_created_where_a_later_decision_moved_it():
    # A create in flight carries CPUs 3,8,11; a decision since moved it to 2,8 (deferred until the
    # create answers). A policy deciding now must see 2,8: an undo that moves it back to 3,8,11
    # is then an update, not "no change", which would leave the deferred move to 2,8 in force.
    ledger = ledger_of({})
    c = Container("", "pod", "new", resources=Resources(cpuset_cpus="3,8,11"))
    ledger.containers[c.key] = c
    ledger.record({c.key: Resources(cpuset_cpus="2,8")})
    assert ledger.view().containers[c.key].resources.cpuset_cpus == "2,8"
    assert c.resources.cpuset_cpus == "3,8,11"  # what the runtime was asked to make


def test_a_swap_steps_aside_onto_no_cpu_a_container_outside_it_is_still_to_leave():
    # a and b swap (a: 7 -> 5,12; b: 5 -> 7); a's step aside would be CPU 12, which o, not in
    # this push (its move from 12 to 10 waits, say, for a resize's undo), still runs on.
    ledger = ledger_of({"a": "5,12", "b": "7", "o": "10"})
    runtime = SlowRuntime({"a": "7", "b": "5", "o": "12"})
    pusher = Pusher(ledger, runtime, lambda: None)
    pusher.held.update(runtime.held)
    for c in ledger.containers.values():
        c.pending = True
    asyncio.run(pusher.narrow("a", ["a", "b"]))
    assert runtime.held["a"] == "7" and runtime.overlaps == []


def test_a_step_aside_sent_while_the_runtime_starts_the_container_is_not_taken():
    # The runtime makes a task from the container's record as it reads it when the start begins;
    # a step aside that lands meanwhile may miss the task: it is not taken until sent again, started.
    ledger = ledger_of({"b": "2-3"})
    pusher = Pusher(ledger, SlowRuntime({"b": "2-3"}), lambda: None)
    pusher.held["b"] = "2-3"
    pusher.starting["b"] = asyncio.Event()
    assert not asyncio.run(pusher.step_aside("b", CPUSet.parse("2")))
    assert "b" in pusher.raced and CPUSet.parse(pusher.held["b"]) >= CPUSet.parse("2-3")
    del pusher.starting["b"]
    assert asyncio.run(pusher.step_aside("b", CPUSet.parse("2")))
    assert pusher.held["b"] == "3"


def test_a_narrowing_queued_behind_a_push_that_landed_the_move_sends_nothing():
    # Behind a frozen runtime many pushes of one container queue up; a narrowing decided before the
    # push that landed its move would move it back where it was, onto CPUs given away since.
    ledger = ledger_of({"a": "8", "b": "5,13"})
    runtime = SlowRuntime({"a": "5,12-13", "b": "8-9"})
    pusher = Pusher(ledger, runtime, lambda: None)
    pusher.held.update(runtime.held)
    ledger.containers["a"].pending = ledger.containers["b"].pending = True

    async def go() -> None:
        lock = pusher._locks.setdefault("a", asyncio.Lock())
        await lock.acquire()  # a push of a in flight
        narrowing = asyncio.create_task(pusher.narrow("a", ["a", "b"]))
        await asyncio.sleep(0.01)
        pusher.held["a"], ledger.containers["a"].pending = "8", False  # it landed a's move
        lock.release()
        await narrowing

    asyncio.run(go())
    assert runtime.held["a"] == "5,12-13" and pusher.held["a"] == "8"  # nothing sent, nothing recorded


def test_an_update_sent_under_the_containers_lock_lands_after_a_push_in_flight():
    """kubelet's resize of a goes to the runtime while a push of a is in flight: the resize, sent
    after it, must be what a runs with (the push landing after it would undo it, and the CPUs the
    resize gave up go to others)."""
    ledger = ledger_of({"a": "1,9"})
    ledger.containers["a"].pending = True
    order: list[str] = []
    pushing = asyncio.Event()

    class Runtime:
        async def update_resources(self, container_id: str, res: Resources) -> None:
            if res.cpuset_cpus == "1,9":
                pushing.set()
            await asyncio.sleep(0.05 if res.cpuset_cpus == "1,9" else 0.01)  # the push is the slow one
            order.append(res.cpuset_cpus)

    pusher = Pusher(ledger, Runtime(), lambda: None)

    async def resize() -> None:
        await pushing.wait()  # decided once the push is on its way
        async with pusher.sending("a"):
            await pusher.runtime.update_resources("a", Resources(cpuset_cpus="8"))

    async def both() -> None:
        await asyncio.gather(pusher.push("a"), resize())

    asyncio.run(both())
    assert order == ["1,9", "8"]


def test_shared_containers_that_swap_cpus_move_at_once_and_an_exclusive_one_never_shares():
    """Two shared containers swap their CPUs (a policy switch's decisions can ask for it): neither
    can step aside onto a CPU it keeps, and each move waits for the other. Shared containers may
    share a CPU while they move: both go at once. An exclusive container never: a swap with one
    waits, pending, no CPU shared (reconciliation tries again)."""
    runtime, pusher = pushed({"a": "0", "b": "1"}, {"a": "1", "b": "0"}, ["a", "b"])
    assert runtime.held == {"a": "1", "b": "0"}
    assert not any(c.pending for c in pusher.ledger.containers.values())
    # Three shared in a ring, and one of them with CPUs to keep: the same.
    runtime, pusher = pushed({"a": "0-1", "b": "2-3", "c": "4"}, {"a": "2-3", "b": "4", "c": "0-1"}, ["a", "b", "c"])
    assert runtime.held == {"a": "2-3", "b": "4", "c": "0-1"}
    assert not any(c.pending for c in pusher.ledger.containers.values())
    # An exclusive one in the swap: nobody moves onto its CPU while it runs there, nor it onto the other's.
    for exclusive in (frozenset({"a"}), frozenset({"a", "b"})):
        runtime, pusher = pushed({"a": "0", "b": "1"}, {"a": "1", "b": "0"}, ["a", "b"], exclusive)
        assert runtime.held == {"a": "0", "b": "1"} and runtime.overlaps == []
        assert all(c.pending for c in pusher.ledger.containers.values())
    # A shared container and an exclusive one it does not swap with: the shared pair moves, the
    # exclusive one keeps its CPU.
    runtime, pusher = pushed({"a": "0", "b": "1", "g": "2"}, {"a": "1", "b": "0"}, ["a", "b"], frozenset({"g"}))
    assert runtime.held == {"a": "1", "b": "0", "g": "2"}
