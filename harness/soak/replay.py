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


def snapshots(path: Path) -> list[tuple[float, Snapshot]]:
    """The cgroup snapshots of a sampler's records (plain or gzipped JSON lines)."""
    opener: Any = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("kind") == "cg":
                out.append((float(rec["t"]), rec["c"]))
    return out


def expect_of_event(event: list[Any]) -> Expect:
    _, _, policy, reserved, max_balloon = event
    return Expect(policy, CPUSet.parse_or_empty(reserved), int(max_balloon))


def replay(stream: Iterable[tuple[float, Snapshot]], events: list[list[Any]], machine: Machine,
           **graces: float) -> Judge:
    """A judge fed the stream and the events in time order, as the soak fed its own; finished."""
    judge = Judge(machine, expect_of(TOPOLOGY_AWARE), **graces)
    pending = sorted(events, key=lambda e: e[0])
    for t, snap in stream:
        while pending and pending[0][0] <= t:
            event = pending.pop(0)
            if event[1] == "change":
                judge.change(expect_of_event(event), event[0])
            else:
                judge.applied(event[0])
        judge.feed(t, snap)
    judge.finish()
    return judge
