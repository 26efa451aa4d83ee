"""CPU classes on a generated machine's sysfs (the kernel's own cpufreq, cpuidle and
intel_uncore_frequency files: no real frequency scaling runs here): what a class writes, what a
CPU gets back when it leaves, across a restart and a new configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from resmgr.controllers import ControllerError
from resmgr.controllers.cpu import CPUController, parse_classes
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.generate import generate, parse_spec
from tests.support.machines import tree

CLASSES = {"Classes": {"fast": {"MinFreq": 2000000, "MaxFreq": 3500000, "FreqGovernor": "performance",
                                "EnergyPerformancePreference": "performance", "UncoreMinFreq": 1800000},
                       "slow": {"maxFreq": 1200000, "disabledCstates": ["C6", "C1E"], "uncoreMaxFreq": 1000000}}}


def machine() -> Path:
    """Two sockets of 4 cores, 1 thread each: CPUs 0-3 on package 0, 4-7 on package 1."""
    return tree("sockets=2,cores=4,threads=1")


def read(root: Path, rel: str) -> str:
    return (root / "sys/devices/system/cpu" / rel).read_text().strip()


def freq(root: Path, cpu: int, name: str) -> str:
    return read(root, f"cpu{cpu}/cpufreq/{name}")


def controller(root: Path, state: Path, section: dict = CLASSES) -> CPUController:
    c = CPUController(str(root), str(state))
    c.prepare(section, "relaxed")()
    return c


def test_a_class_is_written_to_its_cpus_and_taken_back_when_they_leave(tmp_path):
    root = machine()
    c = controller(root, tmp_path)
    c.sync({"fast": CPUSet.parse("0-1"), "slow": CPUSet.parse("4")})
    assert (freq(root, 0, "scaling_min_freq"), freq(root, 0, "scaling_max_freq")) == ("2000000", "3500000")
    assert freq(root, 1, "scaling_governor") == "performance"
    assert freq(root, 1, "energy_performance_preference") == "performance"
    assert freq(root, 2, "scaling_governor") == "powersave"  # in no class: untouched
    assert freq(root, 4, "scaling_max_freq") == "1200000" and freq(root, 4, "scaling_min_freq") == "800000"
    assert [read(root, f"cpu4/cpuidle/state{i}/disable") for i in range(4)] == ["0", "0", "1", "1"]
    # Uncore: per die, the highest limit of the classes on it.
    assert read(root, "intel_uncore_frequency/package_00_die_00/min_freq_khz") == "1800000"
    assert read(root, "intel_uncore_frequency/package_01_die_00/max_freq_khz") == "1000000"

    c.sync({"fast": CPUSet.parse("0"), "slow": CPUSet.parse("1")})  # CPU 1 changes class, 4 leaves
    assert freq(root, 1, "scaling_governor") == "powersave" and freq(root, 1, "scaling_max_freq") == "1200000"
    assert freq(root, 1, "scaling_min_freq") == "800000"  # what fast set was put back first
    assert freq(root, 4, "scaling_max_freq") == "3900000"
    assert [read(root, f"cpu4/cpuidle/state{i}/disable") for i in range(4)] == ["0"] * 4
    assert read(root, "intel_uncore_frequency/package_01_die_00/max_freq_khz") == "2400000"
    assert read(root, "intel_uncore_frequency/package_00_die_00/max_freq_khz") == "1000000"  # slow is on die 0 now


def test_a_restart_puts_back_the_cpus_no_class_holds_any_more(tmp_path):
    root = machine()
    controller(root, tmp_path).sync({"slow": CPUSet.parse("0-1")})
    assert freq(root, 0, "scaling_max_freq") == "1200000"
    again = controller(root, tmp_path)  # a new process: what the files held before is in the state directory
    again.sync({"slow": CPUSet.parse("1")})
    assert freq(root, 0, "scaling_max_freq") == "3900000" and freq(root, 1, "scaling_max_freq") == "1200000"
    assert read(root, "cpu0/cpuidle/state3/disable") == "0"
    again.sync({})
    assert freq(root, 1, "scaling_max_freq") == "3900000"
    assert read(root, "intel_uncore_frequency/package_00_die_00/max_freq_khz") == "2400000"


def test_a_new_configuration_rewrites_or_puts_back_the_classes_cpus(tmp_path):
    root = machine()
    c = controller(root, tmp_path)
    c.sync({"fast": CPUSet.parse("0"), "slow": CPUSet.parse("1")})
    c.prepare({"Classes": {"fast": {"MaxFreq": 3000000}}}, "relaxed")()  # slow dropped, fast changed
    assert freq(root, 0, "scaling_max_freq") == "3000000" and freq(root, 0, "scaling_min_freq") == "800000"
    assert freq(root, 0, "scaling_governor") == "powersave"
    assert freq(root, 1, "scaling_max_freq") == "3900000"


@pytest.mark.parametrize("section, message", [
    ({"Classes": {"x": {"MinFreq": "fast"}}}, "MinFreq: 'fast' is not a frequency in kHz"),
    ({"Classes": {"x": {"MinFreq": 3000, "MaxFreq": 2000}}}, "MinFreq 3000 is above MaxFreq 2000"),
    ({"Classes": {"x": {"Turbo": True}}}, "unknown key 'Turbo'"),
    ({"Klasses": {}}, "unknown key 'Klasses'"),
])
def test_bad_classes_are_refused(section, message):
    with pytest.raises(ControllerError, match=message):
        parse_classes(section)


def test_a_node_without_frequency_scaling_refuses_classes_only_when_required(tmp_path):
    bare = generate(parse_spec("cores=2,threads=1"), tmp_path / "bare")
    for f in (bare / "sys/devices/system/cpu").glob("cpu*/cpufreq/scaling_max_freq"):
        f.unlink()
    with pytest.raises(ControllerError, match="required, but no cpufreq"):
        CPUController(str(bare), "").prepare(CLASSES, "required")
    relaxed = CPUController(str(bare), "")
    relaxed.prepare({"Classes": {"slow": {"MaxFreq": 1}}}, "relaxed")()
    assert relaxed.classes == {}
