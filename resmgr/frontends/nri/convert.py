"""NRI messages to the engine's model and back."""

from __future__ import annotations

from collections.abc import Mapping

from resmgr import cdi
from resmgr.generated.nri import api_pb2 as nri
from resmgr.model import (
    Adjustment,
    Container,
    ContainerState,
    Pod,
    Resources,
    SchedulingClass,
    qos_class_from_cgroup_parent,
)

_STATES = {nri.CONTAINER_CREATED: ContainerState.CREATED, nri.CONTAINER_RUNNING: ContainerState.RUNNING,
           nri.CONTAINER_PAUSED: ContainerState.RUNNING, nri.CONTAINER_STOPPED: ContainerState.EXITED}
RESTART_COUNT = "io.kubernetes.container.restartCount"


def resources(msg: nri.LinuxResources | None) -> Resources:
    if msg is None:
        return Resources()
    cpu, mem = msg.cpu, msg.memory
    return Resources(
        cpu_period=cpu.period.value, cpu_quota=cpu.quota.value, cpu_shares=cpu.shares.value,
        memory_limit_in_bytes=mem.limit.value, memory_swap_limit_in_bytes=mem.swap.value,
        cpuset_cpus=cpu.cpus, cpuset_mems=cpu.mems,
        hugepage_limits={h.page_size: h.limit for h in msg.hugepage_limits},
        unified=dict(msg.unified),
    )


def to_nri(res: Resources, base: Resources | None = None,
           classes: Mapping[str, str] | None = None) -> nri.LinuxResources:
    """res as NRI resources; with base, only what differs from it (and the cpuset, always): a
    plugin owns every field it sets, so it sets no more than it changes."""
    def wanted(name: str) -> bool:
        value = getattr(res, name)
        return bool(value) and (base is None or value != getattr(base, name))

    out = nri.LinuxResources()
    if res.cpuset_cpus:
        out.cpu.cpus = res.cpuset_cpus
    if res.cpuset_mems:
        out.cpu.mems = res.cpuset_mems
    if wanted("cpu_shares"):
        out.cpu.shares.value = res.cpu_shares
    if wanted("cpu_quota"):
        out.cpu.quota.value = res.cpu_quota
    if wanted("cpu_period"):
        out.cpu.period.value = res.cpu_period
    if wanted("memory_limit_in_bytes"):
        out.memory.limit.value = res.memory_limit_in_bytes
    if wanted("memory_swap_limit_in_bytes"):
        out.memory.swap.value = res.memory_swap_limit_in_bytes
    if wanted("hugepage_limits"):
        for size, limit in res.hugepage_limits.items():
            out.hugepage_limits.add(page_size=size, limit=limit)
    if wanted("unified"):
        out.unified.update(res.unified if base is None else
                           {k: v for k, v in res.unified.items() if base.unified.get(k) != v})
    classes = classes or {}
    if classes.get("rdt"):
        out.rdt_class.value = classes["rdt"]
    if classes.get("blockio"):
        out.blockio_class.value = classes["blockio"]
    return out


def pod(p: nri.PodSandbox) -> Pod:
    linux = p.linux
    parent = linux.cgroup_parent
    return Pod(id=p.id, uid=p.uid, name=p.name, namespace=p.namespace, cgroup_parent=parent,
               qos_class=qos_class_from_cgroup_parent(parent), labels=dict(p.labels),
               annotations=dict(p.annotations), runtime_handler=p.runtime_handler,
               overhead=resources(linux.pod_overhead if linux.HasField("pod_overhead") else None),
               resources=resources(linux.pod_resources if linux.HasField("pod_resources") else None))


def env(entries: list[str]) -> dict[str, str]:
    out = {}
    for entry in entries:
        name, _, value = entry.partition("=")
        if name:
            out[name] = value
    return out


def container(c: nri.Container) -> Container:
    res = resources(c.linux.resources if c.linux.HasField("resources") else None)
    if c.linux.HasField("oom_score_adj"):
        res.oom_score_adj = c.linux.oom_score_adj.value
    try:
        attempt = int(c.annotations.get(RESTART_COUNT, "0"))
    except ValueError:
        attempt = 0
    return Container(id=c.id, pod_id=c.pod_sandbox_id, name=c.name, attempt=attempt,
                     state=_STATES.get(c.state, ContainerState.UNKNOWN), args=list(c.args),
                     labels=dict(c.labels), annotations=dict(c.annotations), requested=res,
                     resources=Resources.from_dict(res.to_dict()), env=env(list(c.env)),
                     claims=cdi.claim_uids(d.name for d in c.CDI_devices))


def adjustment(res: Resources, requested: Resources, adj: Adjustment | None,
               classes: Mapping[str, str] | None = None,
               sched: SchedulingClass | None = None) -> nri.ContainerAdjustment:
    """What a create changes: the resources that differ from the request, the hook plugins'
    annotations and environment, and the scheduling class's parameters (the runtime sets them
    before the container's process starts)."""
    out = nri.ContainerAdjustment()
    linux = to_nri(res, requested, classes)
    if linux.ByteSize():
        out.linux.resources.CopyFrom(linux)
    if sched is not None:
        scheduling(sched, out.linux)
    if adj is not None:
        out.annotations.update(adj.annotations)
        for key, value in adj.env.items():
            out.env.add(key=key, value=value)
    return out


_POLICIES = {"other": nri.SCHED_OTHER, "fifo": nri.SCHED_FIFO, "rr": nri.SCHED_RR, "batch": nri.SCHED_BATCH,
             "idle": nri.SCHED_IDLE, "deadline": nri.SCHED_DEADLINE}
_FLAGS = {"reset-on-fork": nri.SCHED_FLAG_RESET_ON_FORK, "reclaim": nri.SCHED_FLAG_RECLAIM,
          "dl-overrun": nri.SCHED_FLAG_DL_OVERRUN, "keep-policy": nri.SCHED_FLAG_KEEP_POLICY,
          "keep-params": nri.SCHED_FLAG_KEEP_PARAMS, "util-clamp-min": nri.SCHED_FLAG_UTIL_CLAMP_MIN,
          "util-clamp-max": nri.SCHED_FLAG_UTIL_CLAMP_MAX}
_IO = {"rt": nri.IOPRIO_CLASS_RT, "be": nri.IOPRIO_CLASS_BE, "idle": nri.IOPRIO_CLASS_IDLE}


def scheduling(sched: SchedulingClass, linux: nri.LinuxContainerAdjustment) -> None:
    """A scheduling class as the OCI spec's process.scheduler and process.ioPriority."""
    if sched.changes_scheduling:
        # A nice value alone: a container's process starts under SCHED_OTHER, which keeps it.
        linux.scheduler.policy = _POLICIES["other" if sched.policy == "none" else sched.policy]
        linux.scheduler.priority = sched.priority or 0
        linux.scheduler.nice = sched.nice or 0
        linux.scheduler.flags.extend(_FLAGS[f] for f in sched.flags)
        linux.scheduler.runtime = sched.runtime * 1000  # nanoseconds, as the kernel takes them
        linux.scheduler.deadline = sched.deadline * 1000
        linux.scheduler.period = (sched.period or sched.deadline) * 1000
    if sched.io_class != "none":
        linux.io_priority.CopyFrom(nri.LinuxIOPriority(**{"class": _IO[sched.io_class]},
                                                       priority=sched.io_priority or 0))


def update(container_id: str, res: Resources, base: Resources | None = None) -> nri.ContainerUpdate:
    u = nri.ContainerUpdate(container_id=container_id)
    u.linux.resources.CopyFrom(to_nri(res, base))
    return u
