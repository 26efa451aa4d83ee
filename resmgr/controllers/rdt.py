"""The RDT controller: cache (L3) and memory-bandwidth classes through resctrl.

The `rdt` section gives partitions, each with a share of the L3 cache and of memory
bandwidth, and classes inside them:

    rdt:
      options: {mode: Full}           # Full, Discovery or Disabled
      partitions:
        default:
          l3Allocation: "100%"        # of the cache: a percentage, a range (20%-50%), a bitmask
          mbAllocation: ["100%"]
          classes:
            Guaranteed: {l3Allocation: "100%"}            # of the partition's share
            Burstable: {l3Allocation: "60%", mbAllocation: ["50%"]}
            BestEffort: {l3Allocation: "20%", mbAllocation: ["20%"]}

Percentages are taken from the low end of the partition's bits, partitions one after
the other; `{all: 50%, "1": 60%}` sets values per cache ID. In Full mode each class gets
a resctrl group `cri-resmgr.<class>` with the computed `schemata`; groups with that prefix
that no configuration names are removed. In Discovery mode the classes are the groups
that already exist. A container's threads are written to its class's `tasks` after it
starts and after updates; a class nobody configured means the root group (with a
warning). The QoS class names are the default classes. Allocations the discovered cache
cannot express (`cbm_mask`, `min_cbm_bits`, the number of CLOSes) are refused with the
class named.
"""

from __future__ import annotations

import errno
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resmgr.controllers import ControllerError, cgroups
from resmgr.model import Container, Pod, QOSClass
from resmgr.requests import RDT_ANNOTATION, effective_annotation

log = logging.getLogger("cri-resmgr.rdt")

PREFIX = "cri-resmgr."
_RANGE = re.compile(r"^\s*(\d+(?:\.\d+)?)%\s*(?:-\s*(\d+(?:\.\d+)?)%)?\s*$")


@dataclass(frozen=True)
class Info:
    """What the node's resctrl offers."""

    cbm_bits: int  # width of info/L3/cbm_mask (0: no L3 allocation)
    min_cbm_bits: int
    l3_ids: tuple[int, ...]
    mb_ids: tuple[int, ...]
    mb_gran: int
    mb_min: int
    closids: int  # groups possible, the root group included


@dataclass(frozen=True)
class ClassSpec:
    l3: dict[int, int]  # cache ID -> capacity bitmask
    mb: dict[int, int]  # cache ID -> percent

    def schemata(self) -> str:
        lines = []
        if self.l3:
            lines.append("L3:" + ";".join(f"{i}={m:x}" for i, m in sorted(self.l3.items())))
        if self.mb:
            lines.append("MB:" + ";".join(f"{i}={v}" for i, v in sorted(self.mb.items())))
        return "\n".join(lines) + "\n"


def _read(path: Path) -> str:
    return path.read_text().strip()


def discover(root: Path) -> Info:
    """Read info/ and the root schemata; OSError/ValueError when resctrl is not there."""
    schemata = {}
    for line in (root / "schemata").read_text().splitlines():
        name, _, values = line.strip().partition(":")
        if name:
            schemata[name] = tuple(int(v.split("=")[0]) for v in values.split(";") if v)
    closids = []
    cbm_bits = min_bits = 0
    if (root / "info" / "L3").is_dir():
        cbm_bits = int(_read(root / "info/L3/cbm_mask"), 16).bit_length()
        min_bits = int(_read(root / "info/L3/min_cbm_bits"))
        closids.append(int(_read(root / "info/L3/num_closids")))
    gran, mb_min = 10, 10
    if (root / "info" / "MB").is_dir():
        gran = int(_read(root / "info/MB/bandwidth_gran"))
        mb_min = int(_read(root / "info/MB/min_bandwidth"))
        closids.append(int(_read(root / "info/MB/num_closids")))
    if not closids:
        raise ValueError(f"{root / 'info'} lists neither L3 nor MB")
    return Info(cbm_bits, min_bits, schemata.get("L3", ()), schemata.get("MB", ()), gran, mb_min, min(closids))


def _per_cache(value: Any, ids: tuple[int, ...], where: str) -> dict[int, Any]:
    """{cache ID: value} from a plain value or {all: v, "<id>": v}."""
    if isinstance(value, list):
        if not value:
            raise ControllerError(f"{where}: empty list")
        value = value[0]  # [percent, (absolute rates, not supported)]
    if not isinstance(value, dict):
        return dict.fromkeys(ids, value)
    out = dict.fromkeys(ids, value["all"]) if "all" in value else {}
    for key, v in value.items():
        if key == "all":
            continue
        try:
            cache = int(key)
        except ValueError:
            raise ControllerError(f"{where}: {key!r} is not a cache ID or 'all'") from None
        if cache not in ids:
            raise ControllerError(f"{where}: cache ID {cache} does not exist (IDs: {list(ids)})")
        out[cache] = v[0] if isinstance(v, list) else v
    missing = set(ids) - set(out)
    if missing:
        raise ControllerError(f"{where}: no value for cache ID(s) {sorted(missing)} (use 'all')")
    return out


def _bits(value: Any, width: int, where: str) -> tuple[int, int] | int:
    """A bitmask (int) or a (start, end) fraction range in bits of width."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip()
    if text.lower().startswith("0x"):
        try:
            return int(text, 16)
        except ValueError:
            raise ControllerError(f"{where}: bad bitmask {text!r}") from None
    m = _RANGE.match(text)
    if not m:
        raise ControllerError(f"{where}: {text!r} is not a percentage, a percentage range or a 0x bitmask")
    lo, hi = (0.0, float(m.group(1))) if m.group(2) is None else (float(m.group(1)), float(m.group(2)))
    if not 0 <= lo < hi <= 100:
        raise ControllerError(f"{where}: {text!r} is not a range within 0%-100%")
    return math.floor(width * lo / 100), math.ceil(width * hi / 100)


def _contiguous(mask: int) -> bool:
    low = mask & -mask
    return mask != 0 and not (mask + low) & mask


class Plan:
    """Class name -> schemata, computed from the `rdt` section for one node."""

    def __init__(self, section: dict[str, Any], info: Info) -> None:
        self.info = info
        self.classes: dict[str, ClassSpec] = {}
        offset = dict.fromkeys(info.l3_ids, 0)  # next free bit per cache, for percentage partitions
        for pname, part in (section.get("partitions") or {}).items():
            where = f"partition {pname}"
            l3_part = self._partition_l3(part.get("l3Allocation", "100%"), offset, where)
            mb_part = {i: self._percent(v, f"{where}: mbAllocation")
                       for i, v in _per_cache(part.get("mbAllocation", "100%"), info.mb_ids, where).items()}
            for cname, spec in (part.get("classes") or {}).items():
                spec = spec or {}
                cwhere = f"class {cname} (partition {pname})"
                if cname in self.classes:
                    raise ControllerError(f"{cwhere}: a class of that name is in another partition")
                l3 = {}
                for cache, value in _per_cache(spec.get("l3Allocation", "100%"), info.l3_ids, cwhere).items():
                    l3[cache] = self._class_l3(value, l3_part[cache], f"{cwhere}: l3Allocation")
                mb = {}
                for cache, value in _per_cache(spec.get("mbAllocation", "100%"), info.mb_ids, cwhere).items():
                    mb[cache] = self._bandwidth(self._percent(value, f"{cwhere}: mbAllocation") * mb_part[cache] / 100)
                self.classes[str(cname)] = ClassSpec(l3 if info.cbm_bits else {}, mb)
        if len(self.classes) + 1 > info.closids:
            raise ControllerError(f"{len(self.classes)} classes need {len(self.classes) + 1} CLOSes with the root "
                                  f"group; this node has {info.closids}")

    def _partition_l3(self, value: Any, offset: dict[int, int], where: str) -> dict[int, int]:
        width = self.info.cbm_bits
        out = {}
        for cache, v in _per_cache(value, self.info.l3_ids, where).items():
            got = _bits(v, width, f"{where}: l3Allocation")
            if isinstance(got, tuple):
                start = offset[cache] + got[0]
                mask = ((1 << (got[1] - got[0])) - 1) << start
                offset[cache] = start + got[1] - got[0]
            else:
                mask = got
            if mask >> width:
                raise ControllerError(f"{where}: l3Allocation for cache {cache} needs more than the cache's "
                                      f"{width} bits")
            out[cache] = mask
        return out

    def _class_l3(self, value: Any, partition: int, where: str) -> int:
        base = (partition & -partition).bit_length() - 1
        width = partition.bit_length() - base
        got = _bits(value, width, where)
        if isinstance(got, tuple):
            lo, hi = got
            hi = max(hi, lo + self.info.min_cbm_bits)
            mask = ((1 << (hi - lo)) - 1) << (base + lo)
        else:
            mask = got << base
        if mask & ~partition:
            raise ControllerError(f"{where}: {value!r} reaches outside the partition's bits {partition:#x}")
        if not _contiguous(mask):
            raise ControllerError(f"{where}: bitmask {mask:#x} is not one contiguous run of bits")
        if bin(mask).count("1") < self.info.min_cbm_bits:
            raise ControllerError(f"{where}: bitmask {mask:#x} has fewer than {self.info.min_cbm_bits} bits "
                                  "(min_cbm_bits)")
        return mask

    @staticmethod
    def _percent(value: Any, where: str) -> float:
        m = _RANGE.match(str(value))
        if not m or m.group(2) is not None or not 0 < float(m.group(1)) <= 100:
            raise ControllerError(f"{where}: {value!r} is not a percentage in (0%, 100%]")
        return float(m.group(1))

    def _bandwidth(self, percent: float) -> int:
        gran = self.info.mb_gran
        return min(100, max(self.info.mb_min, math.ceil(percent / gran) * gran))


class RDTController:
    name = "rdt"

    def __init__(self, resctrl_root: str = "/sys/fs/resctrl", cgroup_root: str = "/sys/fs/cgroup") -> None:
        self.root = Path(resctrl_root)
        self.cgroup_root = Path(cgroup_root)
        self.mode = "relaxed"
        self.rdt_mode = "Disabled"
        self.groups: dict[str, Path] = {}  # class -> resctrl group directory
        self._warned: set[str] = set()

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("%s", message)

    def info(self) -> Info | None:
        try:
            return discover(self.root)
        except (OSError, ValueError):
            return None

    def prepare(self, section: dict[str, Any], mode: str) -> Callable[[], None]:
        rdt_mode = str((section.get("options") or {}).get("mode") or ("Full" if section.get("partitions")
                                                                     else "Disabled"))
        if mode == "disabled" or rdt_mode == "Disabled":
            return lambda: self._commit(mode, "Disabled", {})
        info = self.info()
        if info is None:
            why = f"no resctrl filesystem at {self.root} (no RDT in this kernel or CPU, or not mounted)"
            if mode == "required":
                raise ControllerError(f"required, but {why}")

            def off() -> None:
                self._warn_once(f"RDT is off: {why}")
                self._commit(mode, "Disabled", {})
            return off
        if rdt_mode == "Discovery":
            groups = {d.name.removeprefix(PREFIX): d for d in self._group_dirs()}
            return lambda: self._commit(mode, rdt_mode, groups)
        plan = Plan(section, info)
        others = [d.name for d in self._group_dirs() if not d.name.startswith(PREFIX)]
        if len(others) + len(plan.classes) + 1 > info.closids:
            raise ControllerError(f"{len(plan.classes)} classes do not fit: this node has {info.closids} CLOSes, "
                                  f"the root group and {len(others)} other group(s) ({', '.join(others)}) hold "
                                  f"{len(others) + 1}")
        return lambda: self._commit(mode, rdt_mode, self._create(plan))

    def _group_dirs(self) -> list[Path]:
        return [d for d in sorted(self.root.iterdir())
                if d.is_dir() and d.name not in ("info", "mon_groups", "mon_data")]

    def _create(self, plan: Plan) -> dict[str, Path]:
        """Our groups nobody names go (freeing their CLOSes), then a group per class with its schemata."""
        for d in self._group_dirs():
            if d.name.startswith(PREFIX) and d.name[len(PREFIX):] not in plan.classes:
                try:
                    d.rmdir()
                    log.info("removed resctrl group %s: no class names it", d)
                except OSError as err:
                    log.error("cannot remove resctrl group %s: %s", d, err.strerror)
        groups = {}
        for name, spec in plan.classes.items():
            group = self.root / f"{PREFIX}{name}"
            try:
                group.mkdir(exist_ok=True)
                (group / "schemata").write_text(spec.schemata())
            except OSError as err:
                status = self._status()
                log.error("RDT class %s: cannot set up resctrl group %s: %s%s; its containers stay in the root "
                          "group", name, group, err.strerror, f" ({status})" if status else "")
                continue
            groups[name] = group
        return groups

    def _status(self) -> str:
        try:
            status = (self.root / "info" / "last_cmd_status").read_text().strip()
        except OSError:
            return ""
        return "" if status == "ok" else status

    def _commit(self, mode: str, rdt_mode: str, groups: dict[str, Path]) -> None:
        self.mode, self.rdt_mode, self.groups = mode, rdt_mode, groups

    # -- containers -----------------------------------------------------------------------------
    def check(self, container: Container, pod: Pod) -> None:
        if self.rdt_mode == "Disabled":
            return
        named = effective_annotation({**container.annotations, **pod.annotations}, RDT_ANNOTATION, container.name)
        if named is not None and named not in self.groups:
            known = ", ".join(sorted(self.groups)) or "none configured"
            raise ControllerError(f"container {pod.namespace}/{pod.name}/{container.name}: RDT class {named!r} "
                                  f"does not exist (classes: {known})")

    def apply(self, container: Container, pod: Pod) -> None:
        if self.rdt_mode == "Disabled" or not container.id:
            return
        named = container.classes.get(self.name, "")
        group = self.groups.get(named)
        if group is None:
            if named not in {q.value for q in QOSClass} or self.groups:
                self._warn_once(f"RDT class {named!r} is not configured; its containers stay in "
                                "the root group")
            group = self.root
        tasks = group / "tasks"
        for tid in self.threads(pod.cgroup_parent, container.id):
            try:
                tasks.write_text(f"{tid}\n")
            except OSError as err:
                if err.errno != errno.ESRCH:  # a thread that exited meanwhile is fine
                    raise

    def threads(self, cgroup_parent: str, container_id: str) -> list[int]:
        """Every thread of the container, from its cgroup."""
        for hierarchy, name in (("cpuset", "tasks"), ("pids", "tasks"), ("cpu", "tasks"), ("", "cgroup.threads")):
            base = cgroups.find(self.cgroup_root / hierarchy, cgroup_parent, container_id, name)
            if base is None:
                continue
            try:
                return [int(t) for t in Path(base, name).read_text().split()]
            except FileNotFoundError:
                continue
        raise ControllerError(f"no cgroup for container {container_id} under {self.cgroup_root}")
