"""The scheduling controller on real threads in a real cgroup: a container's class put on every
thread its cgroup holds, read back from the kernel."""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from resmgr.controllers import ControllerError
from resmgr.controllers.sched import SYSCALLS, SchedController
from resmgr.model import Container, Pod, SchedulingClass

ROOT = Path("/sys/fs/cgroup")
IOPRIO_GET = {"x86_64": 252, "aarch64": 31}


def io_priority(pid: int) -> tuple[int, int]:
    libc = ctypes.CDLL(None, use_errno=True)
    value = libc.syscall(IOPRIO_GET[platform.machine()], 1, pid)
    assert value >= 0, os.strerror(ctypes.get_errno())
    return value >> 13, value & 0x1FFF


def threads_file() -> tuple[Path, str]:
    """Where a made cgroup lists its threads: v2's cgroup.threads, else v1's cpu hierarchy's tasks."""
    if (ROOT / "cgroup.controllers").exists():
        return ROOT, "cgroup.threads"
    return ROOT / "cpu", "tasks"


@pytest.fixture
def container() -> Iterator[tuple[Container, Pod, subprocess.Popen[bytes]]]:
    """A process in a cgroup of its own, at <parent>/<container ID> as the cgroupfs driver makes it."""
    if os.geteuid() != 0 or platform.machine() not in SYSCALLS:
        pytest.skip("needs root on x86_64 or aarch64")
    root, name = threads_file()
    parent, cid = f"crirm-test-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    group = root / parent / cid
    group.mkdir(parents=True)
    for level in (group.parent, group):  # v1 with real-time group scheduling: room for a real-time thread
        if (level / "cpu.rt_runtime_us").exists():
            (level / "cpu.rt_runtime_us").write_text("10000")
    proc = subprocess.Popen(["sleep", "60"])
    try:
        (group / "cgroup.procs").write_text(str(proc.pid))
        pod = Pod(id="p", uid="u", name="p", namespace="default", cgroup_parent=parent)
        yield Container(id=cid, pod_id="p", name="c"), pod, proc
    finally:
        proc.kill()
        proc.wait()
        group.rmdir()
        group.parent.rmdir()


def controller(*classes: SchedulingClass) -> SchedController:
    known = {c.name: c for c in classes}
    return SchedController(str(ROOT), known.get)


def test_a_containers_class_is_put_on_its_threads(container):
    c, pod, proc = container
    c.classes["sched"] = "batch"
    controller(SchedulingClass("batch", policy="batch", nice=7, io_class="be", io_priority=6)).apply(c, pod)
    assert os.sched_getscheduler(proc.pid) == os.SCHED_BATCH
    assert os.getpriority(os.PRIO_PROCESS, proc.pid) == 7
    assert io_priority(proc.pid) == (2, 6)

    c.classes["sched"] = "rt"  # real time, as root may set it
    controller(SchedulingClass("rt", policy="fifo", priority=10, io_class="rt", io_priority=0)).apply(c, pod)
    assert os.sched_getscheduler(proc.pid) == os.SCHED_FIFO
    assert os.sched_getparam(proc.pid).sched_priority == 10
    assert io_priority(proc.pid) == (1, 0)

    c.classes["sched"] = "nice"  # nice alone: the policy left as it is
    controller(SchedulingClass("nice", nice=-3)).apply(c, pod)
    assert os.sched_getscheduler(proc.pid) == os.SCHED_FIFO and os.getpriority(os.PRIO_PROCESS, proc.pid) == -3


def test_a_container_without_a_class_or_with_one_the_policy_has_not_is_left_alone(container):
    c, pod, proc = container
    before = os.sched_getscheduler(proc.pid), os.getpriority(os.PRIO_PROCESS, proc.pid)
    controller(SchedulingClass("batch", policy="batch")).apply(c, pod)
    c.classes["sched"] = "gone"
    controller(SchedulingClass("batch", policy="batch")).apply(c, pod)
    assert (os.sched_getscheduler(proc.pid), os.getpriority(os.PRIO_PROCESS, proc.pid)) == before


def test_a_thread_number_that_is_not_the_containers_is_never_touched(container, tmp_path):
    """The cgroup lists a number the kernel gave to another process since (or one of another PID
    namespace, as a plugin in a pod sees them): the controller checks each thread's own cgroup."""
    c, pod, proc = container
    fake = tmp_path / pod.cgroup_parent / c.id
    fake.mkdir(parents=True)
    (fake / "cgroup.threads").write_text(f"{os.getpid()}\n")  # this test's own process
    c.classes["sched"] = "idle"
    before = os.sched_getscheduler(os.getpid())
    SchedController(str(tmp_path), {"idle": SchedulingClass("idle", policy="idle")}.get).apply(c, pod)
    assert os.sched_getscheduler(os.getpid()) == before


def test_a_container_whose_cgroup_is_not_found_is_an_error(tmp_path):
    c = Container(id="nowhere", pod_id="p", name="c", classes={"sched": "b"})
    pod = Pod(id="p", uid="u", name="p", namespace="default", cgroup_parent="kubepods")
    with pytest.raises(ControllerError, match="no cgroup for container nowhere"):
        SchedController(str(tmp_path), {"b": SchedulingClass("b", policy="batch")}.get).apply(c, pod)


def test_in_nri_mode_the_class_goes_into_the_containers_oci_spec():
    """The runtime sets process.scheduler and process.ioPriority before the container's process
    starts: what the NRI adjustment carries."""
    from resmgr.frontends.nri import convert
    from resmgr.generated.nri import api_pb2 as nri
    from resmgr.model import Resources

    rt = SchedulingClass("rt", "rr", 20, flags=("reset-on-fork",), io_class="be", io_priority=2)
    adjust = convert.adjustment(Resources(), Resources(), None, sched=rt)
    assert adjust.linux.scheduler == nri.LinuxScheduler(policy=nri.SCHED_RR, priority=20,
                                                        flags=[nri.SCHED_FLAG_RESET_ON_FORK])
    assert getattr(adjust.linux.io_priority, "class") == nri.IOPRIO_CLASS_BE and adjust.linux.io_priority.priority == 2
    nice = convert.adjustment(Resources(), Resources(), None, sched=SchedulingClass("n", nice=5))
    assert nice.linux.scheduler == nri.LinuxScheduler(policy=nri.SCHED_OTHER, nice=5)  # a process starts under it
    assert not convert.adjustment(Resources(), Resources(), None).linux.HasField("scheduler")
