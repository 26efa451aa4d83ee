"""RDT classes: schemata planning, the controller against a FUSE resctrl, real containers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import yaml

from resmgr.controllers import ControllerError
from resmgr.controllers.rdt import Info, Plan, RDTController
from tests.support.helpers import ROOT, Cri, container_config, pod_config, refused_create, relay_with_link

INFO = Info(cbm_bits=12, min_cbm_bits=2, l3_ids=(0, 1), mb_ids=(0, 1), mb_gran=10, mb_min=10, closids=8)

QOS_CLASSES = {"partitions": {"default": {
    "l3Allocation": "100%", "mbAllocation": ["100%"],
    "classes": {"Guaranteed": {"l3Allocation": "100%"},
                "Burstable": {"l3Allocation": "50%", "mbAllocation": ["50%"]},
                "BestEffort": {"l3Allocation": "25%", "mbAllocation": ["25%"]}}}}}


# -- planning ------------------------------------------------------------------------------------


def test_plan_percentages_ranges_bitmasks_and_partitions():
    plan = Plan({"partitions": {
        "fast": {"l3Allocation": "50%", "mbAllocation": ["100%"],
                 "classes": {"gold": {"l3Allocation": "100%"}, "silver": {"l3Allocation": "50%-100%",
                                                                          "mbAllocation": ["50%"]}}},
        "slow": {"l3Allocation": "50%", "mbAllocation": ["40%"],
                 "classes": {"bronze": {"l3Allocation": {"all": "50%", "1": "0x3"}, "mbAllocation": ["50%"]}}},
    }}, INFO)
    assert plan.classes["gold"].l3 == {0: 0x03f, 1: 0x03f}  # the low half of 12 bits
    assert plan.classes["silver"].l3 == {0: 0x038, 1: 0x038}
    assert plan.classes["bronze"].l3 == {0: 0x1c0, 1: 0x0c0}  # the second partition starts at bit 6
    assert plan.classes["silver"].mb == {0: 50, 1: 50}
    assert plan.classes["bronze"].mb == {0: 20, 1: 20}  # 50% of the partition's 40%
    assert plan.classes["gold"].schemata() == "L3:0=3f;1=3f\nMB:0=100;1=100\n"


@pytest.mark.parametrize("section, needle", [
    ({"partitions": {"p": {"classes": {"c": {"l3Allocation": "0x5"}}}}}, "class c (partition p): l3Allocation: "
                                                                         "bitmask 0x5 is not one contiguous"),
    ({"partitions": {"p": {"classes": {"c": {"l3Allocation": "0x1"}}}}}, "fewer than 2 bits (min_cbm_bits)"),
    ({"partitions": {"p": {"l3Allocation": "0xff", "classes": {"c": {"l3Allocation": "0x1ff"}}}}},
     "class c (partition p): l3Allocation: '0x1ff' reaches outside the partition's bits 0xff"),
    ({"partitions": {"p": {"l3Allocation": "0x1fff"}}}, "partition p: l3Allocation for cache 0 needs more"),
    ({"partitions": {"p": {"classes": {"c": {"l3Allocation": {"7": "50%"}}}}}}, "cache ID 7 does not exist"),
    ({"partitions": {"p": {"classes": {"c": {"mbAllocation": ["150%"]}}}}}, "class c (partition p): mbAllocation"),
    ({"partitions": {"p": {"classes": {"c": {"l3Allocation": "lots"}}}}}, "'lots' is not a percentage"),
    ({"partitions": {"p": {"classes": {f"c{i}": {} for i in range(8)}}}}, "8 classes need 9 CLOSes"),
    ({"partitions": {"p": {"l3Allocation": "50%", "classes": {"c": {}}},
                     "q": {"l3Allocation": "50%", "classes": {"c": {}}}}}, "class c (partition q): a class"),
    ({"partitions": {"p": {"classes": {"c": {}}}, "q": {"classes": {"d": {}}}}},
     "partition q: l3Allocation for cache 0 needs more than the cache's 12 bits"),
])
def test_plans_the_cache_cannot_express_are_refused_naming_the_class(section, needle):
    with pytest.raises(ControllerError) as info:
        Plan(section, INFO)
    assert needle in str(info.value)


# -- the controller against a resctrl filesystem --------------------------------------------------


@pytest.fixture
def resctrl(tmp_path):
    """A FUSE-served resctrl (tests/support/resctrlfs.py) mounted at a temporary directory."""
    mount = tmp_path / "resctrl"
    mount.mkdir()
    proc = subprocess.Popen([sys.executable, "-W", "ignore", "-m", "tests.support.resctrlfs", str(mount)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while not (mount / "info").is_dir():
        if proc.poll() is not None or time.monotonic() > deadline:
            out = proc.stdout.read().decode(errors="replace") if proc.poll() is not None else ""
            proc.kill()
            pytest.fail(f"the FUSE resctrl did not come up (needs /dev/fuse and libfuse3): {out}")
        time.sleep(0.02)
    yield mount
    subprocess.run(["umount", str(mount)], check=False)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_the_fixture_keeps_the_kernels_rules(resctrl):
    group = resctrl / "g"
    group.mkdir()
    with pytest.raises(OSError) as info:
        (group / "schemata").write_text("L3:0=f0f\n")
    assert info.value.errno == 22 and "non-consecutive" in (resctrl / "info/last_cmd_status").read_text()
    with pytest.raises(OSError) as info:
        (group / "tasks").write_text("999999999\n")
    assert info.value.errno == 3  # ESRCH
    for i in range(6):
        (resctrl / f"x{i}").mkdir()
    with pytest.raises(OSError) as info:
        (resctrl / "x6").mkdir()
    assert info.value.errno == 28  # ENOSPC: 8 CLOSes, the root group included


def test_controller_creates_groups_and_removes_stale_ones(resctrl):
    (resctrl / "cri-resmgr.old").mkdir()
    ctl = RDTController(str(resctrl))
    ctl.prepare(QOS_CLASSES, "relaxed")()
    assert sorted(d.name for d in resctrl.iterdir() if d.name.startswith("cri-resmgr.")) == [
        "cri-resmgr.BestEffort", "cri-resmgr.Burstable", "cri-resmgr.Guaranteed"]
    assert "L3:0=3f;1=3f" in (resctrl / "cri-resmgr.Burstable" / "schemata").read_text()
    assert "MB:0=50;1=50" in (resctrl / "cri-resmgr.Burstable" / "schemata").read_text()
    # Groups of others count against the CLOSes: a plan that cannot fit is refused up front.
    for i in range(4):
        (resctrl / f"other{i}").mkdir()
    bigger = {"partitions": {"default": {"classes": {**QOS_CLASSES["partitions"]["default"]["classes"], "Extra": {}}}}}
    with pytest.raises(ControllerError, match="4 classes do not fit: this node has 8 CLOSes"):
        ctl.prepare(bigger, "relaxed")
    ctl.prepare(QOS_CLASSES, "relaxed")()  # the same three still fit
    assert ctl.groups["Guaranteed"] == resctrl / "cri-resmgr.Guaranteed"  # unchanged


def test_no_resctrl_is_said_once_and_required_refuses(tmp_path, caplog):
    ctl = RDTController(str(tmp_path / "missing"))
    with pytest.raises(ControllerError, match="required, but no resctrl filesystem at"):
        ctl.prepare(QOS_CLASSES, "required")
    ctl.prepare(QOS_CLASSES, "relaxed")()
    ctl.prepare(QOS_CLASSES, "relaxed")()
    assert caplog.text.count("RDT is off: no resctrl filesystem") == 1


# -- real containers ----------------------------------------------------------------------------


def container_threads(pod, cid: str) -> set[int]:
    from resmgr.controllers.cgroups import cgroup_dirs

    path = Path("/sys/fs/cgroup/cpuset") / cgroup_dirs(pod.linux.cgroup_parent, cid)[0] / "tasks"
    return {int(t) for t in path.read_text().split()}


def group_tasks(resctrl: Path, group: str) -> set[int]:
    return {int(t) for t in (resctrl / group / "tasks").read_text().split()}


def in_group(resctrl: Path, group: str, pod, cid: str) -> bool:
    threads = container_threads(pod, cid)
    return bool(threads) and threads <= group_tasks(resctrl, group)


def test_container_threads_join_their_class_also_across_restarts(containerd, workdir, resctrl, direct):
    config = workdir / "rdt.yaml"
    config.write_text(yaml.safe_dump({"policy": {"Active": "none"}, "rdt": QOS_CLASSES}))
    args = ("--force-config", str(config), "--resctrl-path", str(resctrl))
    relay, link = relay_with_link(workdir, containerd, *args)
    via = Cri(relay.socket)
    pods = []
    try:
        g_cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(g_cfg))
        g = via.run_container(pods[-1], g_cfg, container_config())
        assert in_group(resctrl, "cri-resmgr.Guaranteed", g_cfg, g)
        gold_cfg = pod_config(qos="burstable", logdir=str(workdir / "logs"),
                              annotations={"rdtclass.cri-resource-manager.intel.com/pod": "BestEffort"})
        pods.append(via.run_pod(gold_cfg))
        b = via.run_container(pods[-1], gold_cfg, container_config())
        assert in_group(resctrl, "cri-resmgr.BestEffort", gold_cfg, b)
        err = refused_create(via, workdir, pods, {"rdtclass.cri-resource-manager.intel.com": "platinum"})
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "RDT class 'platinum' does not exist" in err.details()

        # Started behind the relay's back while it is down: assigned once it is back.
        relay.stop(signal.SIGKILL)
        via.close()
        link.close()
        late_cfg = pod_config(qos="burstable", logdir=str(workdir / "logs"))
        pods.append(direct.run_pod(late_cfg))
        late = direct.run_container(pods[-1], late_cfg, container_config())
        relay, link = relay_with_link(workdir, containerd, *args, relay_dir=relay.relay_dir)
        via = Cri(relay.socket)
        assert in_group(resctrl, "cri-resmgr.Burstable", late_cfg, late)
        assert in_group(resctrl, "cri-resmgr.Guaranteed", g_cfg, g)
    finally:
        for p in pods:
            via.remove_pod(p)
        via.close()
        link.close()
        relay.stop()
    assert os.path.isdir(resctrl / "cri-resmgr.Guaranteed")
