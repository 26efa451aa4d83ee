"""The balloons published as DRA devices (docs/dra.md, "Balloons as devices"): those made, and
those a claim may yet make (a type's MaxBalloons not reached)."""

from __future__ import annotations

from typing import Any

from resmgr.policies.balloons.fleet import Fleet
from resmgr.policies.balloons.model import Balloon
from resmgr.policies.balloons.types import BalloonType, Settings
from resmgr.topology.cpuset import EMPTY


class Devices:
    def __init__(self, fleet: Fleet, settings: Settings) -> None:
        self.fleet, self.settings = fleet, settings

    def made(self) -> dict[str, Balloon]:
        """The balloons published as DRA devices, by device name."""
        return {f"{b.type.dra}-{b.index}": b for b in self.fleet.balloons if b.type.dra}

    def to_come(self) -> dict[str, tuple[BalloonType, int]]:
        """The balloons a claim may yet make, by device name: the type and instance number each would have."""
        out = {}
        for t in self.settings.types:
            if t.dra and t.max_balloons:
                have = sum(1 for b in self.fleet.balloons if b.type is t)
                for index in self.fleet.free_indexes(t, max(t.max_balloons - have, 0)):
                    out[f"{t.dra}-{index}"] = (t, index)
        return out

    def listed(self) -> list[dict[str, Any]]:
        made = {name: (b.type, b.index, b.cpus) for name, b in self.made().items()}
        to_come = {name: (t, index, EMPTY) for name, (t, index) in self.to_come().items()}
        return [{"name": name, "attributes": {"kind": "balloon", "balloonType": t.name, "instance": index},
                 "cpus": t.max_cpus, "cpuset": str(cpus)}
                for name, (t, index, cpus) in sorted({**made, **to_come}.items())]
