"""The scheduling controller: a container's scheduling class put on its threads.

A policy names each container's scheduling class (resmgr/policies/toolkit/scheduling.py); this
controller looks the class up in the policy in force and, once the container runs (and after
every update), sets every thread in the container's cgroup: the scheduling policy, priority and
nice value with sched_setattr(2), the I/O priority with ioprio_set(2). Threads and processes the
container starts later inherit both from their parent. In NRI mode the runtime also gets them in
the container's OCI spec, so its first process starts with them.
"""

from __future__ import annotations

import errno
import functools
import os
import struct
from collections.abc import Callable
from typing import Any

from resmgr.controllers import ControllerError, cgroups
from resmgr.model import Container, Pod, SchedulingClass

# (sched_setattr, ioprio_set) by machine
SYSCALLS = {"x86_64": (314, 251), "aarch64": (274, 30)}
POLICY = {"other": 0, "fifo": 1, "rr": 2, "batch": 3, "idle": 5, "deadline": 6}
FLAGS = {"reset-on-fork": 0x01, "reclaim": 0x02, "dl-overrun": 0x04, "keep-policy": 0x08, "keep-params": 0x10,
         "util-clamp-min": 0x20, "util-clamp-max": 0x40}
IO_CLASS = {"rt": 1, "be": 2, "idle": 3}
IOPRIO_CLASS_SHIFT = 13
IOPRIO_WHO_PROCESS = 1


# struct sched_attr, its first version (48 bytes): size, policy, flags, nice, priority, runtime,
# deadline, period.
SCHED_ATTR = struct.Struct("=IIQiIQQQ")


@functools.cache
def _libc() -> Any:
    import ctypes  # loaded where a class is first set, not at every start (it takes ~2 ms)

    return ctypes.CDLL(None, use_errno=True)


def _syscall(number: int, *args: Any) -> None:
    libc = _libc()
    if libc.syscall(number, *args) != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def set_scheduling(tid: int, cls: SchedulingClass) -> None:
    """Put one thread into the class's scheduling policy (or nice value alone)."""
    if cls.policy == "none":
        if cls.nice is not None:
            os.setpriority(os.PRIO_PROCESS, tid, cls.nice)  # PRIO_PROCESS of a thread ID: that thread
        return
    flags = 0
    for flag in cls.flags:
        flags |= FLAGS[flag]
    attr = SCHED_ATTR.pack(SCHED_ATTR.size, POLICY[cls.policy], flags, cls.nice or 0, cls.priority or 0,
                           cls.runtime * 1000, cls.deadline * 1000, (cls.period or cls.deadline) * 1000)
    _syscall(_numbers()[0], tid, attr, 0)  # bytes go to the kernel as a pointer to them


def set_io_priority(tid: int, cls: SchedulingClass) -> None:
    if cls.io_class == "none":
        return
    value = IO_CLASS[cls.io_class] << IOPRIO_CLASS_SHIFT | (cls.io_priority or 0)
    _syscall(_numbers()[1], IOPRIO_WHO_PROCESS, tid, value)


def _numbers() -> tuple[int, int]:
    machine = os.uname().machine
    numbers = SYSCALLS.get(machine)
    if numbers is None:
        raise ControllerError(f"scheduling classes are not supported on {machine}")
    return numbers


def _in_container(tid: int, container_id: str) -> bool:
    try:
        with open(f"/proc/{tid}/cgroup") as f:
            return container_id in f.read()
    except OSError:
        return False


class SchedController:
    name = "sched"

    def __init__(self, cgroup_root: str = "/sys/fs/cgroup",
                 lookup: Callable[[str], SchedulingClass | None] = lambda name: None) -> None:
        self.cgroup_root = cgroup_root
        self.lookup = lookup  # the policy in force's classes (the daemon sets it)

    def prepare(self, section: dict[str, Any], mode: str) -> Callable[[], None]:
        return lambda: None  # the classes are the policy's: checked when it is made

    def check(self, container: Container, pod: Pod) -> None:
        pass

    def apply(self, container: Container, pod: Pod) -> None:
        name = container.classes.get("sched", "")
        cls = self.lookup(name) if name else None
        if cls is None or not (cls.changes_scheduling or cls.changes_io):
            return
        for tid in self._threads(pod.cgroup_parent, container.id):
            if not _in_container(tid, container.id):
                continue  # ended and its number reused, or another PID namespace's (a plugin in a pod)
            try:
                set_scheduling(tid, cls)
                set_io_priority(tid, cls)
            except OSError as err:
                if err.errno == errno.ESRCH:  # ended meanwhile
                    continue
                raise ControllerError(f"scheduling class {cls.name} on thread {tid} of container {container.id}: "
                                      f"{err.strerror}") from None

    def _threads(self, cgroup_parent: str, container_id: str) -> list[int]:
        """Every thread in the container's cgroup (v2's cgroup.threads, v1's tasks)."""
        for sub, name in (("", "cgroup.threads"), ("cpu", "tasks"), ("cpuset", "tasks"), ("systemd", "tasks")):
            base = cgroups.find(os.path.join(self.cgroup_root, sub), cgroup_parent, container_id, name)
            if base is None:
                continue
            try:
                with open(os.path.join(base, name)) as f:
                    return [int(t) for t in f.read().split()]
            except OSError:
                continue
        raise ControllerError(f"no cgroup for container {container_id} under {self.cgroup_root}")
