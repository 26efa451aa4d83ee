"""The CPU controller: CPU classes (frequency limits, governor, energy preference, uncore limits,
idle states) put on the CPUs the policy assigns to them.

A class is configured in the `cpu` section (cri-resource-manager's form; nri-plugins'
`control.cpu` is translated to it); a policy says which CPUs each class holds now
(`Policy.cpu_classes()`: a balloon's CPUs, the shared or reserved pool). On every change the
controller writes the sysfs files of the CPUs whose class changed: `cpufreq/scaling_min_freq`,
`scaling_max_freq` (kHz), `scaling_governor`, `energy_performance_preference`,
`cpuidle/state*/disable` for the idle states a class disables, and each die's
`intel_uncore_frequency/package_PP_die_DD/{min,max}_freq_khz` (the highest of the classes on the
die). What a file held before the controller first wrote it is kept in the state directory, so a
CPU leaving every class gets it back, also after a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resmgr.controllers import ControllerError
from resmgr.controllers.originals import Originals
from resmgr.model import Container, Pod
from resmgr.topology.cpuset import CPUSet

log = logging.getLogger("cri-resmgr.controllers.cpu")

STALE = "\0"  # a CPU whose files an earlier configuration or run wrote: written again or put back
KEYS = {"minfreq": "min_freq", "maxfreq": "max_freq", "energyperformancepreference": "epp",
        "uncoreminfreq": "uncore_min", "uncoremaxfreq": "uncore_max", "freqgovernor": "governor",
        "disabledcstates": "disabled_cstates"}


@dataclass(frozen=True)
class CPUClass:
    name: str
    min_freq: int = 0  # kHz; 0: left as it is
    max_freq: int = 0
    epp: str = ""  # energy_performance_preference: a name or a number
    uncore_min: int = 0  # kHz
    uncore_max: int = 0
    governor: str = ""
    disabled_cstates: tuple[str, ...] = ()  # idle state names (C6, C1E, ...)

    @property
    def uncore(self) -> bool:
        return bool(self.uncore_min or self.uncore_max)


def parse_classes(section: Mapping[str, Any]) -> dict[str, CPUClass]:
    """The classes of a `cpu` section (keys in any letter case); ControllerError naming a bad one."""
    classes = next((v for k, v in section.items() if str(k).lower() == "classes"), None) or {}
    unknown = [k for k in section if str(k).lower() != "classes"]
    if unknown:
        raise ControllerError(f"unknown key {unknown[0]!r} (known: Classes)")
    if not isinstance(classes, Mapping):
        raise ControllerError("Classes: expected a mapping of class names")
    out = {}
    for name, doc in classes.items():
        fields: dict[str, Any] = {}
        for key, value in (doc or {}).items():
            field = KEYS.get(str(key).lower())
            if field is None:
                raise ControllerError(f"class {name}: unknown key {key!r}")
            if field == "disabled_cstates":
                if not isinstance(value, list):
                    raise ControllerError(f"class {name}: {key} is a list of idle state names")
                fields[field] = tuple(str(v) for v in value)
            elif field in ("epp", "governor"):
                fields[field] = str(value)
            elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ControllerError(f"class {name}: {key}: {value!r} is not a frequency in kHz")
            else:
                fields[field] = value
        c = CPUClass(str(name), **fields)
        if c.min_freq and c.max_freq and c.min_freq > c.max_freq:
            raise ControllerError(f"class {name}: MinFreq {c.min_freq} is above MaxFreq {c.max_freq}")
        out[str(name)] = c
    return out


class CPUController:
    name = "cpu"

    def __init__(self, host_root: str = "/", state_dir: str = "") -> None:
        self.base = Path(host_root) / "sys" / "devices" / "system" / "cpu"
        self.originals = Originals(state_dir, "cpu-classes.json")
        self.classes: dict[str, CPUClass] = {}
        self.assigned: dict[str, CPUSet] = {}  # what the policy said last
        self.in_force: dict[int, str] = {}  # CPU -> the class its files hold
        self.saved: dict[str, str] = {}  # file (below base) -> what it held before we wrote it
        self._dies: dict[str, set[int]] | None = None  # uncore directory name -> its CPUs
        self._load()

    # -- the Controller protocol ----------------------------------------------------------
    def prepare(self, section: dict[str, Any], mode: str) -> Callable[[], None]:
        classes = {} if mode == "disabled" else parse_classes(section)
        if classes and not self._has_cpufreq():
            why = f"no cpufreq under {self.base} (no frequency scaling here)"
            if mode == "required":
                raise ControllerError(f"required, but {why}")
            log.warning("CPU classes are off: %s", why)
            classes = {}
        if any(c.uncore for c in classes.values()) and not (self.base / "intel_uncore_frequency").is_dir():
            raise ControllerError("uncore limits set, but there is no intel_uncore_frequency driver "
                                  f"under {self.base}")

        def commit() -> None:
            self.classes = classes
            # Every CPU a class held is written again with the new parameters, or put back.
            self.in_force = dict.fromkeys(self.in_force, STALE)
            self.sync(self.assigned)
        return commit

    def check(self, container: Container, pod: Pod) -> None:
        pass

    def apply(self, container: Container, pod: Pod) -> None:
        pass  # classes are the CPUs', not the containers'

    # -- the CPUs' classes ------------------------------------------------------------------
    def sync(self, assigned: Mapping[str, CPUSet]) -> None:
        """Make the CPUs' files say what the classes assigned to them say; CPUs in no class (or in
        one not configured) get back what they held before."""
        self.assigned = dict(assigned)
        if not self.classes and not self.in_force:
            return  # nothing configured, nothing to put back
        before = dict(self.saved)
        wanted: dict[int, str] = {}
        for name, cpus in sorted(assigned.items()):
            if name in self.classes:
                for cpu in cpus:
                    wanted[cpu] = name
        touched = False
        for cpu in sorted(set(wanted) | set(self.in_force)):
            name = wanted.get(cpu, "")
            if self.in_force.get(cpu, "") == name:
                continue
            if cpu in self.in_force:  # what another class (or none) set goes first
                self._restore(f"cpu{cpu}/")
            if name:
                self._put(cpu, self.classes[name])
                self.in_force[cpu] = name
            else:
                self.in_force.pop(cpu, None)
            touched = True
        if touched or any(c.uncore for c in self.classes.values()):
            self._uncore(wanted)
        if self.saved != before:
            self.originals.keep(self.saved)

    def _put(self, cpu: int, c: CPUClass) -> None:
        freq = f"cpu{cpu}/cpufreq"
        if c.governor:
            self._write(f"{freq}/scaling_governor", c.governor)
        # Raising both: max first, so min never goes above max; lowering: min first.
        order = ("scaling_max_freq", "scaling_min_freq")
        current_min = self._read(f"{freq}/scaling_min_freq")
        if c.max_freq and current_min.isdigit() and c.max_freq < int(current_min):
            order = ("scaling_min_freq", "scaling_max_freq")
        for file in order:
            value = c.max_freq if file == "scaling_max_freq" else c.min_freq
            if value:
                self._write(f"{freq}/{file}", str(value))
        if c.epp:
            self._write(f"{freq}/energy_performance_preference", c.epp)
        for state in sorted((self.base / f"cpu{cpu}" / "cpuidle").glob("state*")):
            rel = f"cpu{cpu}/cpuidle/{state.name}"
            if self._read(f"{rel}/name") in c.disabled_cstates:
                self._write(f"{rel}/disable", "1")
            elif f"{rel}/disable" in self.saved:
                self._restore(f"{rel}/disable")

    def _uncore(self, wanted: Mapping[int, str]) -> None:
        """Each die's uncore limits: the highest of its CPUs' classes, else what it held."""
        root = self.base / "intel_uncore_frequency"
        if not root.is_dir():
            return
        for die in sorted(root.glob("package_*_die_*")):
            cpus = self._die_cpus(die.name)
            classes = [self.classes[n] for cpu, n in wanted.items() if cpu in cpus]
            rel = f"intel_uncore_frequency/{die.name}"
            for file, attr in (("max_freq_khz", "uncore_max"), ("min_freq_khz", "uncore_min")):
                value = max((getattr(c, attr) for c in classes), default=0)
                if value:
                    self._write(f"{rel}/{file}", str(value))
                elif f"{rel}/{file}" in self.saved:
                    self._restore(f"{rel}/{file}")

    def _die_cpus(self, die: str) -> set[int]:
        """The CPUs of an uncore directory's package and die (read from sysfs once: the CPUs'
        packages and dies do not change under a running daemon)."""
        if self._dies is None:
            self._dies = {}
            for topo in self.base.glob("cpu[0-9]*/topology"):
                cpu = topo.parent.name
                package = self._read(f"{cpu}/topology/physical_package_id")
                number = self._read(f"{cpu}/topology/die_id") or "0"
                if package.isdigit() and number.isdigit():
                    key = f"package_{int(package):02d}_die_{int(number):02d}"
                    self._dies.setdefault(key, set()).add(int(cpu[3:]))
        return self._dies.get(die, set())

    # -- files ----------------------------------------------------------------------------
    def _read(self, rel: str) -> str:
        try:
            return (self.base / rel).read_text().strip()
        except OSError:
            return ""

    def _write(self, rel: str, value: str) -> None:
        if rel not in self.saved:
            before = self._read(rel)
            if not before:
                return  # not on this machine (no such driver, state or CPU)
            self.saved[rel] = before
        try:
            (self.base / rel).write_text(value + "\n")
        except OSError as err:
            log.error("CPU class: writing %s to %s: %s", value, self.base / rel, err.strerror)

    def _restore(self, prefix: str) -> None:
        for rel in sorted(r for r in self.saved if r.startswith(prefix)):
            value = self.saved.pop(rel)
            try:
                (self.base / rel).write_text(value + "\n")
            except OSError as err:
                log.error("CPU class: restoring %s to %s: %s", value, self.base / rel, err.strerror)

    def _has_cpufreq(self) -> bool:
        return any(self.base.glob("cpu[0-9]*/cpufreq/scaling_max_freq"))

    def _load(self) -> None:
        """What the files held before an earlier run changed them: those CPUs are put back on
        the first sync unless their class still holds them."""
        self.saved = self.originals.load()
        cpus = {r.split("/")[0][3:] for r in self.saved if r.startswith("cpu")}
        self.in_force = {int(k): STALE for k in cpus if k.isdigit()}
