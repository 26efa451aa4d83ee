"""Scheduling classes on real containers through the relay: the kernel's view of the container's
own process after containerd started it."""

from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path

import pytest

from harness.relay import NriProcess
from resmgr.controllers.cgroups import cgroup_dirs
from resmgr.generated.cri import api_pb2 as cri
from tests.support.helpers import Cri, Pods, container_config, pod_config, relay_with_link, wait_until

POLICY = """Active: topology-aware
topology-aware:
  SchedulingClasses:
  - {Name: background, Policy: batch, Nice: 10, IOClass: idle}
  - {Name: kind, Nice: 5, IOClass: be, IOPriority: 2}
  PodQoSSchedulingClasses: {BestEffort: background}
"""


def io_priority(pid: int) -> tuple[int, int]:
    libc = ctypes.CDLL(None, use_errno=True)
    value = libc.syscall({"x86_64": 252, "aarch64": 31}[platform.machine()], 1, pid)
    assert value >= 0
    return value >> 13, value & 0x1FFF


def main_pid(cfg: object, cid: str) -> int:
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpu")):
        procs = root / cgroup_dirs(cfg.linux.cgroup_parent, cid)[0] / "cgroup.procs"
        if procs.exists():
            return min(int(p) for p in procs.read_text().split())
    raise AssertionError(f"no cgroup for {cid}")


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="x86_64 or aarch64")
def test_a_containers_scheduling_class_reaches_its_process(containerd, workdir):
    relay, link = relay_with_link(workdir, containerd)
    via = Cri(relay.socket)
    pods = []
    try:
        assert link.push({"policy": POLICY}) == ""
        be_cfg = pod_config(qos="besteffort", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(be_cfg))
        be = via.run_container(pods[-1], be_cfg, container_config())  # by its QoS class
        pid = main_pid(be_cfg, be)
        assert os.sched_getscheduler(pid) == os.SCHED_BATCH
        assert os.getpriority(os.PRIO_PROCESS, pid) == 10 and io_priority(pid)[0] == 3  # idle

        kind_cfg = pod_config(qos="burstable", logdir=str(workdir / "logs"),
                              annotations={"scheduling-class.resource-policy.nri.io": "kind"})
        pods.append(via.run_pod(kind_cfg))
        kind = via.run_container(pods[-1], kind_cfg, container_config(command=["sh", "-c", "sleep 3600 & wait"]))
        pid = main_pid(kind_cfg, kind)
        assert os.sched_getscheduler(pid) == os.SCHED_OTHER
        assert os.getpriority(os.PRIO_PROCESS, pid) == 5 and io_priority(pid) == (2, 2)
        # The shell forks its child once it runs: on a busy machine, after the start has returned.
        children = wait_until(lambda: [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()],
                              what="the container's shell to fork its child")
        assert all(os.getpriority(os.PRIO_PROCESS, c) == 5 for c in children)  # inherited
    finally:
        for p in pods:
            via.remove_pod(p)
        relay.stop()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="x86_64 or aarch64")
def test_in_nri_mode_containerd_takes_the_class_in_the_answer_and_the_process_has_it(containerd, workdir):
    config = workdir / "sched.yaml"
    config.write_text("policy:\n" + "".join(f"  {line}\n" for line in POLICY.splitlines()))
    plugin = NriProcess(workdir, str(containerd.dir / "nri.sock"), "--force-config", str(config),
                        "--hook-dir", "disabled").start()
    pods = Pods(Cri(containerd.socket), workdir)
    try:
        cfg, _, cid = pods.run("besteffort", cri.LinuxContainerResources(cpu_shares=2))
        pid = main_pid(cfg, cid)
        assert os.sched_getscheduler(pid) == os.SCHED_BATCH and os.getpriority(os.PRIO_PROCESS, pid) == 10
    finally:
        pods.remove_all()
        pods.client.close()
        plugin.stop()

