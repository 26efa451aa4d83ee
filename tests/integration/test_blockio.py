"""Block-I/O classes written to real container cgroups through the relay."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import grpc
import pytest

from resmgr.controllers import ControllerError
from resmgr.controllers.blockio import parse_classes
from resmgr.controllers.cgroups import cgroup_dirs, read_cpuset
from tests.support.helpers import Cri, container_config, pod_config, refused_create, relay_with_link


def a_block_device() -> str | None:
    for name in sorted(os.listdir("/sys/block")):
        path = f"/dev/{name}"
        if os.path.exists(path) and stat.S_ISBLK(os.stat(path).st_mode) and not name.startswith(("loop", "ram")):
            return path
    return None


DEVICE = a_block_device()
BLKIO = Path("/sys/fs/cgroup/blkio")


def throttle(pod: object, cid: str, name: str) -> dict[str, int]:
    text = (BLKIO / cgroup_dirs(pod.linux.cgroup_parent, cid)[0] / f"blkio.throttle.{name}_device").read_text()
    return {line.split()[0]: int(line.split()[1]) for line in text.splitlines() if line.strip()}


def classes(read_bps: str, iops: int | None) -> str:
    slow = f"    - Devices: [{DEVICE}]\n      ThrottleReadBps: {read_bps}\n      Weight: 200\n"
    if iops is not None:
        slow += f"      ThrottleWriteIOPS: {iops}\n"
    return f"Classes:\n  slow:\n{slow}  BestEffort:\n    - Devices: [{DEVICE}]\n      ThrottleWriteBps: 2M\n"


@pytest.mark.skipif(DEVICE is None or not BLKIO.is_dir(), reason="needs a block device and cgroup v1 blkio")
def test_block_io_classes_reach_the_cgroups(containerd, workdir):
    dev = os.stat(DEVICE).st_rdev
    key = f"{os.major(dev)}:{os.minor(dev)}"
    relay, link = relay_with_link(workdir, containerd)
    via = Cri(relay.socket)
    pods = []
    try:
        assert link.push({"blockio": classes("1M", 100)}) == ""
        slow_cfg = pod_config(qos="burstable", logdir=str(workdir / "logs"),
                              annotations={"blockioclass.cri-resource-manager.intel.com/pod": "slow"})
        pods.append(via.run_pod(slow_cfg))
        slow = via.run_container(pods[-1], slow_cfg, container_config())
        assert throttle(slow_cfg, slow, "read_bps") == {key: 1_000_000}  # Kubernetes units: M = 10^6
        assert throttle(slow_cfg, slow, "write_iops") == {key: 100}
        be_cfg = pod_config(qos="besteffort", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(be_cfg))
        be = via.run_container(pods[-1], be_cfg, container_config())
        assert throttle(be_cfg, be, "write_bps") == {key: 2_000_000}  # the QoS class is the default class
        assert throttle(be_cfg, be, "read_bps") == {}

        # A configuration change reaches running containers; throttles it drops are lifted.
        assert link.push({"blockio": classes("3M", None)}) == ""
        assert throttle(slow_cfg, slow, "read_bps") == {key: 3_000_000}
        assert throttle(slow_cfg, slow, "write_iops") == {}

        # An annotation naming a class that does not exist fails CreateContainer, clearly.
        err = refused_create(via, workdir, pods, {"blockioclass.cri-resource-manager.intel.com": "fast"})
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "block-I/O class 'fast' does not exist (classes: BestEffort, slow)" in err.details()

        # A bad class is refused with the class named, and nothing changes.
        error = link.push({"blockio": "Classes:\n  slow:\n    - Devices: [/dev/x]\n      ThrottleReadBps: lots\n"})
        assert "class slow, rule 0: ThrottleReadBps" in error
        assert throttle(slow_cfg, slow, "read_bps") == {key: 3_000_000}

        # No classes any more: every limit is lifted.
        assert link.push({"blockio": "Classes: {}\n"}) == ""
        assert throttle(slow_cfg, slow, "read_bps") == {} and throttle(be_cfg, be, "write_bps") == {}
    finally:
        for p in pods:
            via.remove_pod(p)
        via.close()
        link.close()
        relay.stop()


def test_cgroup_paths_for_both_drivers_and_runtimes():
    assert cgroup_dirs("/kubepods/burstable/pod1", "abc") == ["kubepods/burstable/pod1/abc"]
    slices = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice"
    assert cgroup_dirs("kubepods-burstable-pod1.slice", "abc") == \
        [f"{slices}/cri-containerd-abc.scope", f"{slices}/crio-abc.scope"]


@pytest.mark.parametrize("scope", ["cri-containerd-abc.scope", "crio-abc.scope"])
@pytest.mark.parametrize("v1", [True, False])
def test_a_systemd_scope_of_either_runtime_is_read(tmp_path, scope, v1):
    base = tmp_path / ("cpuset" if v1 else "") / "kubepods.slice/kubepods-pod1.slice" / scope
    base.mkdir(parents=True)
    (base / "cpuset.cpus").write_text("0-1\n")
    (base / "cpuset.mems").write_text("0\n")
    assert read_cpuset(str(tmp_path), "kubepods-pod1.slice", "abc") == ("0-1", "0")


@pytest.mark.parametrize("section, needle", [
    ({"Classes": {"x": [{"Weight": 5}]}}, "class x, rule 0: Weight 5 is outside 10-1000"),
    ({"Classes": {"x": [{"ThrottleReadBps": "1M"}]}}, "class x, rule 0: throttles need Devices"),
    ({"Classes": {"x": [{"Devices": ["/dev/a"], "ThrottleWriteIOPS": "fast"}]}}, "ThrottleWriteIOPS"),
])
def test_bad_classes_name_the_class(section, needle):
    with pytest.raises(ControllerError, match=needle):
        parse_classes(section)


def test_cgroup_v2_lines(tmp_path):
    """io.max is written one device per line with every limit spelled out (max: none)."""
    from resmgr.controllers.blockio import BlockIOController, Settings

    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    cg = tmp_path / "kubepods" / "pod1" / "c1"
    cg.mkdir(parents=True)
    (cg / "io.max").write_text("8:0 rbps=100 wbps=max riops=max wiops=max\n")
    (cg / "io.weight").write_text("default 100\n")
    ctl = BlockIOController(str(tmp_path))
    assert not ctl.v1 and ctl.available() == ""
    written = []
    import resmgr.controllers.blockio as blockio

    real_put = blockio._put
    blockio._put = lambda path, value: written.append((path.name, value))
    try:
        ctl._write("/kubepods/pod1", "c1", Settings(weight=300, throttles={(254, 0): {"write_iops": 50}}))
    finally:
        blockio._put = real_put
    assert ("io.max", "8:0 rbps=max wbps=max riops=max wiops=max") in written  # lifted
    assert ("io.max", "254:0 rbps=max wbps=max riops=max wiops=50") in written
    assert ("io.weight", "default 300") in written
