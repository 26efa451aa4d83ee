"""A soak run judged again from what it recorded: the sampler's snapshots (samples.jsonl, kept by
benchmarks/soak.py with the node's journals) and the configuration changes as the judge had them
(the report's judge_events). The unit tests replay recorded runs with violations planted in them."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness.soak.config import TOPOLOGY_AWARE, expect_of
from harness.soak.judge import Expect, Judge, Machine
from resmgr.topology.cpuset import CPUSet

Snapshot = dict[str, list[str]]


def snapshots(path: Path, kind: str = "cg") -> list[tuple[float, Snapshot]]:
    """The cgroup snapshots of a sampler's records (plain or gzipped JSON lines); kind "read": the
    reads no second read agreed with."""
    opener: Any = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("kind") == kind:
                out.append((float(rec["t"]), rec["c"]))
    return out


def expect_of_event(event: list[Any]) -> Expect:
    _, _, policy, reserved, max_balloon = event
    return Expect(policy, CPUSet.parse_or_empty(reserved), int(max_balloon))


def replay(stream: Iterable[tuple[float, Snapshot]], events: list[list[Any]], machine: Machine,
           reads: Iterable[tuple[float, Snapshot]] = (), **graces: float) -> Judge:
    """A judge fed the stream (and the reads no second read agreed with) and the events in time
    order, as the soak fed its own; finished."""
    start = [e for e in events if e[1] == "start"]  # runs recorded before it started in topology-aware
    judge = Judge(machine, expect_of_event(start[0]) if start else expect_of(TOPOLOGY_AWARE), **graces)
    frozen = [[e[2], "frozen", e[2]] for e in events if e[1] == "stalled"]  # the freeze, as the soak told it
    pending = sorted([e for e in events if e[1] != "start"] + frozen, key=lambda e: e[0])
    merged = sorted([(t, True, snap) for t, snap in stream] + [(t, False, snap) for t, snap in reads],
                    key=lambda r: (r[0], r[1]))
    for t, confirmed, snap in merged:
        while pending and pending[0][0] <= t:
            event = pending.pop(0)
            if event[1] == "change":
                judge.change(expect_of_event(event), event[0])
            elif event[1] == "frozen":
                judge.stalled(event[0])
            elif event[1] == "stalled":  # [thaw, "stalled", freeze]
                judge.stalled(event[2], event[0])
            else:
                judge.applied(event[0])
        if confirmed:
            judge.feed(t, snap)
        else:
            judge.glance(t, snap)
    judge.finish()
    return judge
