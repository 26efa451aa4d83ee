"""What node files held before a controller first wrote them (CPU classes' sysfs files,
interrupts' affinity), kept in the state directory so a restart can still put them back."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("cri-resmgr.controllers")


class Originals:
    def __init__(self, state_dir: str, name: str) -> None:
        self.path = Path(state_dir) / name if state_dir else None

    def load(self) -> dict[str, str]:
        """What an earlier run kept ({} when nothing, or nothing readable)."""
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        saved = data.get("saved") if isinstance(data, dict) else None
        return {str(k): str(v) for k, v in saved.items()} if isinstance(saved, dict) else {}

    def keep(self, saved: Mapping[str, str]) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            tmp.write_text(json.dumps({"saved": dict(saved)}, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as err:
            log.error("cannot keep what node files held before they were written in %s: %s", self.path, err)
