"""The judge proven by what it catches: recorded soak runs (the sampler's snapshots and the
configuration changes, under data/) replayed with violations planted of every kind the judge
knows, at moments spread over the run, inside and outside every excuse window, each lasting just
over the bound docs/benchmarks.md states for it there. Every plant is caught, and nothing else
is counted that the run without plants did not count."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.soak.judge import SLOW, STRICT, Judge, Violation, parse, released
from harness.soak.replay import Snapshot, expect_of_event, replay, snapshots
from harness.soak.run import machine_of, wrong_mems
from harness.vm import Shape
from resmgr.topology.cpuset import CPUSet

DATA = Path(__file__).parent / "data"
RUNS = sorted(p.name.removesuffix(".samples.jsonl.gz") for p in DATA.glob("*.samples.jsonl.gz"))
MACHINE = machine_of(Shape())
GRACE, SLOW_GRACE, SWITCH_BOUND = 30.0, 180.0, 120.0
READ = 2.0  # the sampler's interval: a plant lasts its bound and two reads more
EVERY = 15.0  # between two plants of a kind


@dataclass
class Plant:
    kind: str
    cid: str  # the container it is made in
    start: float
    end: float
    change: dict[str, list[str]]  # the container's fields as planted, by container


def load(run: str) -> tuple[list[tuple[float, Snapshot]], list[list[Any]]]:
    events = json.loads((DATA / f"{run}.events.json").read_text())
    return snapshots(DATA / f"{run}.samples.jsonl.gz"), events


def reads_of(run: str) -> list[tuple[float, Snapshot]]:
    """The reads no second read agreed with (runs recorded since the sampler keeps them)."""
    return snapshots(DATA / f"{run}.samples.jsonl.gz", "read")


def at(stream: list[tuple[float, Snapshot]], t: float) -> Snapshot:
    """The snapshot in force at t (the sampler writes one when anything changes)."""
    last: Snapshot = {}
    for when, snap in stream:
        if when > t:
            break
        last = snap
    return last


def policy_at(events: list[list[Any]], t: float) -> str:
    policy = "topology-aware"
    for e in events:
        if e[1] == "start" or e[1] == "change" and e[0] <= t:
            policy = expect_of_event(e).policy
    return policy


def switch_end(events: list[list[Any]], t: float) -> float:
    """When the excuse of a configuration change around t ends (t itself when none is open)."""
    end = t
    for e in events:
        if e[1] != "change" or e[0] > t:
            continue
        applied = next((a[0] for a in events if a[1] == "applied" and a[0] >= e[0]), None)
        bound = e[0] + SWITCH_BOUND if applied is None else min(e[0] + SWITCH_BOUND, applied + GRACE)
        end = max(end, bound)
    return end


def releases(stream: list[tuple[float, Snapshot]]) -> list[tuple[float, CPUSet]]:
    """CPUs given up, as the judge counts them."""
    out, last = [], {}
    for t, snap in stream:
        ctrs = parse(snap)
        if given_up := released(last, ctrs):
            out.append((t, given_up))
        last = {c.id: c.cpus for c in ctrs}
    return out


def steady(stream: list[tuple[float, Snapshot]], start: float, end: float) -> list[str]:
    """Containers started in every snapshot from start to end."""
    ids: set[str] | None = None
    for t, snap in stream:
        if start - 30 <= t <= end:
            got = {c.id for c in parse(snap)}
            ids = got if ids is None else ids & got
    return sorted(ids or ())


def place(stream: list[tuple[float, Snapshot]], events: list[list[Any]], kind: str, start: float) -> Plant | None:
    """A plant of kind at start, in a container that runs all along, or None where none fits."""
    inside = switch_end(events, start)
    strict = kind in STRICT
    end = max(start + (READ if strict else GRACE), inside) + 2 * READ
    if kind in SLOW:  # the release excuse: planted only on CPUs no container gave up around it
        end = max(end, start + GRACE + 2 * READ)
    snap, policy = at(stream, start), policy_at(events, start)
    ctrs = {c.id: c for c in parse(snap) if c.id in steady(stream, start, end)}
    if policy_at(events, end) != policy:
        return None
    shared = [c for c in ctrs.values() if not c.whole_cpus and c.qos != "guaranteed"]
    given_up = CPUSet()
    for t, cpus in releases(stream):
        if start - SLOW_GRACE <= t <= end:
            given_up |= cpus

    def fields(c: Any, cpus: CPUSet, mems: str | None = None) -> list[str]:
        row = list(snap[c.id])
        row[1], row[2] = str(cpus), mems or str(MACHINE.nodes_of(cpus))
        return row

    if kind == "memory" and ctrs:
        c = ctrs[sorted(ctrs)[0]]
        return Plant(kind, c.id, start, end, {c.id: fields(c, c.cpus, wrong_mems(MACHINE, c.cpus))})
    exclusive = policy in ("topology-aware", "static")  # the same exclusive CPUs and one shared set
    if kind == "pool" and exclusive:
        for c in shared:
            if len(c.cpus) > 1 and not c.cpus & given_up and not c.cpus <= CPUSet([0]):
                return Plant(kind, c.id, start, end, {c.id: fields(c, CPUSet(c.cpus.sorted()[1:]))})
    if kind == "reserved" and policy == "topology-aware":
        for c in shared:
            if 0 not in c.cpus:
                return Plant(kind, c.id, start, end, {c.id: fields(c, c.cpus | CPUSet([0]))})
    if kind == "exclusive-count" and exclusive:
        for g in (c for c in ctrs.values() if c.whole_cpus):
            spare = MACHINE.online - g.cpus - CPUSet([0])
            return Plant(kind, g.id, start, end, {g.id: fields(g, g.cpus | CPUSet(spare.sorted()[:1]))})
    if kind == "exclusive-shared" and exclusive:
        for g in (c for c in ctrs.values() if c.whole_cpus):
            for c in shared:
                if not c.cpus & g.cpus:
                    return Plant(kind, c.id, start, end, {c.id: fields(c, c.cpus | CPUSet(g.cpus.sorted()[:1]))})
    if kind == "balloon-overlap" and policy == "balloons":
        sets = sorted({c.cpus for c in ctrs.values() if not c.cpus <= CPUSet([0])}, key=lambda s: s.sorted())
        for a in sets:
            for b in sets:
                grown = b | CPUSet(a.sorted()[:1])
                if a != b and not a & b and not grown >= a and len(a) > 1:
                    c = next(c for c in ctrs.values() if c.cpus == b)
                    return Plant(kind, c.id, start, end, {c.id: fields(c, grown)})
    return None


def planted(stream: list[tuple[float, Snapshot]], plants: list[Plant]) -> list[tuple[float, Snapshot]]:
    """The stream with the plants in it: a snapshot every read while one is in place."""
    times = sorted({t for t, _ in stream} | {p.start + i * READ for p in plants
                                              for i in range(int((p.end - p.start) / READ) + 1)}
                   | {p.end + READ for p in plants})  # the sampler writes the snapshot that ends it too
    out = []
    for t in times:
        snap = dict(at(stream, t))
        for p in plants:
            if p.start <= t <= p.end:
                snap.update({cid: row for cid, row in p.change.items() if cid in snap})
        out.append((t, snap))
    return out


def caught(p: Plant, v: Violation) -> bool:
    return v.kind.removeprefix("switch-") == p.kind and p.cid in v.ids and p.start <= v.first <= p.end


def plan(stream: list[tuple[float, Snapshot]], events: list[list[Any]], kind: str) -> list[Plant]:
    """Plants of kind every EVERY s, none overlapping another (each judged on its own)."""
    first, last = stream[0][0] + 60, stream[-1][0] - 60
    out: list[Plant] = []
    t = first
    while t < last:
        p = place(stream, events, kind, t)
        if p is not None and p.end < last:
            out.append(p)
            t = p.end + EVERY
        else:
            t += EVERY / 3
    return out


def judge(stream: list[tuple[float, Snapshot]], events: list[list[Any]],
          reads: list[tuple[float, Snapshot]] | None = None) -> Judge:
    return replay(stream, events, MACHINE, reads or [], grace=GRACE, slow_grace=SLOW_GRACE,
                  switch_bound=SWITCH_BOUND)


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("kind", ["memory", "reserved", "pool", "exclusive-count", "exclusive-shared",
                                  "balloon-overlap"])
def test_every_violation_planted_in_a_recorded_run_is_caught_and_nothing_else(run, kind):
    stream, events = load(run)
    base = {(v.kind, v.key, v.first) for v in judge(stream, events, reads_of(run)).violations}
    plants = plan(stream, events, kind)
    if not plants:
        pytest.skip(f"{run}: no moment for a {kind} plant (the policy it needs never ran)")
    got = judge(planted(stream, plants), events, reads_of(run)).violations
    missed = [p for p in plants if not any(caught(p, v) for v in got)]
    assert not missed, f"{len(missed)} of {len(plants)} plants missed: {missed[:3]}"
    # Nothing beyond the run's own verdict but what a plant made, while it was in place (a planted
    # exclusive CPU takes its CPU out of the others' pool too).
    extra = [v for v in got if (v.kind, v.key, v.first) not in base
             and not any(p.start <= v.first <= p.end for p in plants)]
    assert not extra, extra[:3]


def test_the_recorded_runs_cover_both_policies_and_their_switches():
    policies, windows = set(), 0
    for run in RUNS:
        stream, events = load(run)
        policies |= {policy_at(events, t) for t, _ in stream}
        windows += sum(1 for e in events if e[1] == "change")
        assert len(stream) > 40, run
    assert policies >= {"topology-aware", "balloons", "static"} and windows >= 2


@pytest.mark.parametrize("run", RUNS)
def test_an_exclusive_cpu_shared_for_one_read_no_second_read_agreed_with_is_caught(run):
    """Exclusivity is judged on every read: an overlap seen once, in a read the sampler could not
    confirm (things moved while it read), counts; the recorded run's own verdict does not change."""
    stream, events = load(run)
    base = {(v.kind, v.key, v.first) for v in judge(stream, events, reads_of(run)).violations}
    plants = [p for p in plan(stream, events, "exclusive-shared") if switch_end(events, p.start) == p.start]
    if not plants:
        pytest.skip(f"{run}: no moment for the plant (no Guaranteed container that runs all along)")
    reads = [(p.start + READ / 2, {**at(stream, p.start), **p.change}) for p in plants]
    got = judge(stream, events, reads_of(run) + reads).violations
    missed = [p for p in plants if not any(caught(p, v) for v in got)]
    assert not missed, f"{len(missed)} of {len(plants)} plants missed: {missed[:3]}"
    assert {(v.kind, v.key, v.first) for v in got} - base == {(v.kind, v.key, v.first) for v in got
                                                             if any(caught(p, v) for p in plants)}
