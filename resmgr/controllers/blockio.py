"""The block-I/O controller: a container's block-I/O class written to its cgroup.

`blockio.Classes.<name>` is a list of rules, each with device globs (`/dev/sd*`), a
weight (10-1000) and read/write throttles in bytes or operations per second. After a
container starts (and after a configuration change) its class's rules are written to its
cgroup: cgroup v1 `blkio.throttle.*_device` and `blkio[.bfq].weight[_device]`, or cgroup v2
`io.max` and `io[.bfq].weight`, whichever the node has. Throttles a class no longer sets
are lifted. The QoS class names (Guaranteed, Burstable, BestEffort) are the default
classes; a default class nobody configured means "no limits".
"""

from __future__ import annotations

import errno
import glob
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resmgr.controllers import ControllerError, cgroups
from resmgr.model import Container, Pod, QOSClass
from resmgr.requests import BLOCKIO_ANNOTATION, RequirementError, effective_annotation, parse_memory

log = logging.getLogger("cri-resmgr.blockio")

THROTTLES = {"ThrottleReadBps": ("read_bps", "rbps"), "ThrottleWriteBps": ("write_bps", "wbps"),
             "ThrottleReadIOPS": ("read_iops", "riops"), "ThrottleWriteIOPS": ("write_iops", "wiops")}


@dataclass(frozen=True)
class Rule:
    devices: tuple[str, ...]
    weight: int = 0  # 0: not set
    throttles: tuple[tuple[str, int], ...] = ()  # (v1 name, value)


@dataclass
class Settings:
    """What one container's cgroup should say: per device (major, minor)."""

    weight: int = 0
    device_weights: dict[tuple[int, int], int] = field(default_factory=dict)
    throttles: dict[tuple[int, int], dict[str, int]] = field(default_factory=dict)


def _rate(value: object, where: str) -> int:
    try:
        rate = parse_memory(value)
    except RequirementError as err:
        raise ControllerError(f"{where}: {err}") from None
    if rate < 0:
        raise ControllerError(f"{where}: must not be negative")
    return rate


def parse_classes(section: dict[str, Any]) -> dict[str, list[Rule]]:
    out: dict[str, list[Rule]] = {}
    for name, rules in (section.get("Classes") or {}).items():
        parsed = []
        for i, raw in enumerate(rules or []):
            where = f"class {name}, rule {i}"
            weight = int(raw.get("Weight") or 0)
            if weight and not 10 <= weight <= 1000:
                raise ControllerError(f"{where}: Weight {weight} is outside 10-1000")
            devices = tuple(raw.get("Devices") or ())
            throttles = tuple((v1, _rate(raw[key], f"{where}: {key}")) for key, (v1, _) in THROTTLES.items()
                              if raw.get(key) is not None)
            if throttles and not devices:
                raise ControllerError(f"{where}: throttles need Devices to apply to")
            parsed.append(Rule(devices, weight, throttles))
        out[str(name)] = parsed
    return out


def block_devices(pattern: str, dev_root: str = "/") -> list[tuple[int, int]]:
    """(major, minor) of the block devices matching a glob like /dev/sd*."""
    found = set()
    for path in glob.glob(os.path.join(dev_root, pattern.lstrip("/"))):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISBLK(st.st_mode):
            found.add((os.major(st.st_rdev), os.minor(st.st_rdev)))
    return sorted(found)


def settings_for(rules: list[Rule], dev_root: str = "/") -> Settings:
    s = Settings()
    for rule in rules:
        devices = [d for pattern in rule.devices for d in block_devices(pattern, dev_root)]
        if rule.weight:
            if rule.devices:
                for d in devices:
                    s.device_weights[d] = rule.weight
            else:
                s.weight = rule.weight
        for d in devices:
            s.throttles.setdefault(d, {}).update(dict(rule.throttles))
    return s


class BlockIOController:
    name = "blockio"

    def __init__(self, cgroup_root: str = "/sys/fs/cgroup", dev_root: str = "/") -> None:
        self.cgroup_root = Path(cgroup_root)
        self.dev_root = dev_root
        self.classes: dict[str, list[Rule]] = {}
        self.touched = False  # some configuration had classes: cgroups may hold limits to lift
        self.mode = "relaxed"
        self.v1 = (self.cgroup_root / "blkio").is_dir()
        self._warned: set[str] = set()

    # -- configuration ----------------------------------------------------------------------
    def available(self) -> str:
        """Why block-I/O control is impossible here, or ""."""
        if self.v1:
            return ""
        controllers = self.cgroup_root / "cgroup.controllers"
        try:
            if "io" in controllers.read_text().split():
                return ""
        except OSError:
            pass
        return f"no blkio cgroup hierarchy under {self.cgroup_root} and no io controller in {controllers}"

    def prepare(self, section: dict[str, Any], mode: str) -> Callable[[], None]:
        classes = parse_classes(section)
        problem = self.available() if mode != "disabled" else ""
        if problem and mode == "required" and classes:
            raise ControllerError(f"required, but {problem}")

        def commit() -> None:
            if problem and classes and mode == "relaxed":
                self._warn_once(f"block-I/O classes are configured but {problem}; they are not applied")
            self.classes, self.mode = classes, mode
            self.touched = self.touched or bool(classes)
        return commit

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("%s", message)

    # -- containers -----------------------------------------------------------------------------
    def check(self, container: Container, pod: Pod) -> None:
        if self.mode == "disabled":
            return
        named = effective_annotation({**container.annotations, **pod.annotations}, BLOCKIO_ANNOTATION,
                                     container.name)
        if named is not None and named not in self.classes:
            known = ", ".join(sorted(self.classes)) or "none configured"
            raise ControllerError(f"container {pod.namespace}/{pod.name}/{container.name}: block-I/O class "
                                  f"{named!r} does not exist (classes: {known})")

    def apply(self, container: Container, pod: Pod) -> None:
        if self.mode == "disabled" or not container.id or not self.touched or self.available():
            return  # no class was ever configured here: nothing to write, nothing to lift
        name = container.classes.get(self.name, "")
        rules = self.classes.get(name)
        if rules is None and name not in {q.value for q in QOSClass}:
            self._warn_once(f"block-I/O class {name!r} is not configured; containers in it are not limited")
        wanted = settings_for(rules or [], self.dev_root)
        self._write(pod.cgroup_parent, container.id, wanted)

    def _write(self, cgroup_parent: str, container_id: str, s: Settings) -> None:
        root = self.cgroup_root / "blkio" if self.v1 else self.cgroup_root
        found = cgroups.find(root, cgroup_parent, container_id)
        if found is None:
            raise ControllerError(f"no cgroup for container {container_id} under {root}")
        base = Path(found)
        wanted = {(dev, key) for dev, values in s.throttles.items() for key in values}
        before = _current_throttles(base, self.v1)  # read back, so lifting also works after a restart
        if self.v1:
            for (major, minor), values in s.throttles.items():
                for key, value in values.items():
                    _put(base / f"blkio.throttle.{key}_device", f"{major}:{minor} {value}")
            for (major, minor), key in sorted(before - wanted):  # 0 lifts a v1 throttle
                _put(base / f"blkio.throttle.{key}_device", f"{major}:{minor} 0")
            weight_file = next((base / f for f in ("blkio.bfq.weight", "blkio.weight") if (base / f).exists()), None)
        else:
            for major, minor in sorted({dev for dev, _ in wanted | before}):  # unset keys: max, no limit
                values = s.throttles.get((major, minor), {})
                limits = " ".join(f"{v2}={values.get(v1, 'max')}" for v1, v2 in THROTTLES.values())
                _put(base / "io.max", f"{major}:{minor} {limits}")
            weight_file = next((base / f for f in ("io.bfq.weight", "io.weight") if (base / f).exists()), None)
        if s.weight or s.device_weights:
            if weight_file is None:
                self._warn_once("block-I/O weights are configured but this node's I/O scheduler offers none "
                                "(no blkio.weight / io.weight files); only throttles are applied")
            else:
                try:
                    if s.weight:
                        _put(weight_file, str(s.weight) if self.v1 else f"default {s.weight}")
                    for (major, minor), w in s.device_weights.items():
                        _put(weight_file.with_name(weight_file.name + "_device") if self.v1 else weight_file,
                             f"{major}:{minor} {w}")
                except OSError as err:
                    if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    # A device's weight needs a policy weighing that device: bfq as its scheduler,
                    # or for io.weight iocost enabled on it (io.cost.qos).
                    how = "its I/O scheduler must be bfq" + (
                        ", or iocost enabled for it in io.cost.qos" if weight_file.name == "io.weight" else "")
                    self._warn_once(f"block-I/O weights cannot be set here ({weight_file.name}: {err.strerror}; "
                                    f"for a device's weight {how}); only throttles apply")


def _current_throttles(base: Path, v1: bool) -> set[tuple[tuple[int, int], str]]:
    """The ((major, minor), v1 throttle name) pairs a cgroup limits now."""
    out = set()
    if v1:
        for key, _ in THROTTLES.values():
            for line in (base / f"blkio.throttle.{key}_device").read_text().splitlines():
                dev, _, value = line.partition(" ")
                if value.strip() not in ("", "0"):
                    major, minor = dev.split(":")
                    out.add(((int(major), int(minor)), key))
        return out
    v1_name = {v2: v1 for v1, v2 in THROTTLES.values()}
    for line in (base / "io.max").read_text().splitlines():
        dev, *limits = line.split()
        major, minor = dev.split(":")
        for limit in limits:
            name, _, value = limit.partition("=")
            if value != "max" and name in v1_name:
                out.add(((int(major), int(minor)), v1_name[name]))
    return out


def _put(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)
