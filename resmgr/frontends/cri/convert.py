"""CRI messages to the engine's model and back."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from resmgr import cdi
from resmgr.generated.cri import api_pb2 as cri
from resmgr.model import (
    Container,
    ContainerEvent,
    ContainerState,
    Pod,
    PodState,
    Resources,
    qos_class_from_cgroup_parent,
)

_STATES = {cri.CONTAINER_CREATED: ContainerState.CREATED, cri.CONTAINER_RUNNING: ContainerState.RUNNING,
           cri.CONTAINER_EXITED: ContainerState.EXITED}
EVENTS = {cri.CONTAINER_CREATED_EVENT: ContainerEvent.CREATED, cri.CONTAINER_STARTED_EVENT: ContainerEvent.STARTED,
          cri.CONTAINER_STOPPED_EVENT: ContainerEvent.STOPPED, cri.CONTAINER_DELETED_EVENT: ContainerEvent.DELETED}


def resources(msg: cri.LinuxContainerResources | None) -> Resources:
    if msg is None:
        return Resources()
    return Resources(
        cpu_period=msg.cpu_period, cpu_quota=msg.cpu_quota, cpu_shares=msg.cpu_shares,
        memory_limit_in_bytes=msg.memory_limit_in_bytes, oom_score_adj=msg.oom_score_adj,
        cpuset_cpus=msg.cpuset_cpus, cpuset_mems=msg.cpuset_mems,
        memory_swap_limit_in_bytes=msg.memory_swap_limit_in_bytes,
        hugepage_limits={h.page_size: h.limit for h in msg.hugepage_limits},
        unified=dict(msg.unified),
    )


def to_linux(res: Resources, msg: cri.LinuxContainerResources | None = None) -> cri.LinuxContainerResources:
    """Fill msg (or a new message) with res, keeping the fields the model does not hold."""
    msg = msg if msg is not None else cri.LinuxContainerResources()
    msg.cpu_period, msg.cpu_quota, msg.cpu_shares = res.cpu_period, res.cpu_quota, res.cpu_shares
    msg.memory_limit_in_bytes, msg.oom_score_adj = res.memory_limit_in_bytes, res.oom_score_adj
    msg.cpuset_cpus, msg.cpuset_mems = res.cpuset_cpus, res.cpuset_mems
    msg.memory_swap_limit_in_bytes = res.memory_swap_limit_in_bytes
    del msg.hugepage_limits[:]
    for size, limit in res.hugepage_limits.items():
        msg.hugepage_limits.add(page_size=size, limit=limit)
    msg.unified.clear()
    msg.unified.update(res.unified)
    return msg


def only_modelled(msg: cri.LinuxContainerResources) -> bool:
    """Whether the message holds nothing but fields the model holds (no unknown ones either)."""
    again = to_linux(resources(msg)).SerializeToString(deterministic=True)
    return again == msg.SerializeToString(deterministic=True)


def pod_from_config(pod_id: str, config: cri.PodSandboxConfig, runtime_handler: str = "") -> Pod:
    linux = config.linux
    cgroup_parent = linux.cgroup_parent
    return Pod(
        id=pod_id, uid=config.metadata.uid, name=config.metadata.name,
        namespace=config.metadata.namespace, cgroup_parent=cgroup_parent,
        qos_class=qos_class_from_cgroup_parent(cgroup_parent),
        labels=dict(config.labels), annotations=dict(config.annotations),
        runtime_handler=runtime_handler, attempt=config.metadata.attempt,
        overhead=resources(linux.overhead if linux.HasField("overhead") else None),
        resources=resources(linux.resources if linux.HasField("resources") else None),
    )


def container_from_config(pod_id: str, config: cri.ContainerConfig) -> Container:
    res = resources(config.linux.resources if config.linux.HasField("resources") else None)
    return Container(
        id="", pod_id=pod_id, name=config.metadata.name, attempt=config.metadata.attempt,
        image=config.image.image, command=list(config.command), args=list(config.args),
        labels=dict(config.labels), annotations=dict(config.annotations),
        requested=res, resources=dataclasses.replace(res), env=envs(config),
        claims=cdi.claim_uids(d.name for d in config.CDI_devices),
    )


def envs(config: cri.ContainerConfig) -> dict[str, str]:
    """The environment as text; bytes that are not UTF-8 survive the round trip (surrogateescape)."""
    return {e.key: e.value.decode("utf-8", "surrogateescape") for e in config.envs}


def set_envs(config: cri.ContainerConfig, env: dict[str, str]) -> None:
    """Make config's environment env, in env's order."""
    del config.envs[:]
    for key, value in env.items():
        config.envs.add(key=key, value=value.encode("utf-8", "surrogateescape"))


_INT_FIELDS = ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes", "oom_score_adj",
               "memory_swap_limit_in_bytes")


def json_resources(doc: Any) -> Resources:
    """Resources from the runtime's verbose JSON of a LinuxContainerResources (odd values skipped)."""
    if not isinstance(doc, dict):
        return Resources()
    res = Resources()
    for name in _INT_FIELDS:
        if isinstance(doc.get(name), int):
            setattr(res, name, doc[name])
    for name in ("cpuset_cpus", "cpuset_mems"):
        if isinstance(doc.get(name), str):
            setattr(res, name, doc[name])
    if isinstance(doc.get("unified"), dict):
        res.unified = {str(k): str(v) for k, v in doc["unified"].items()}
    return res


def listed_pod(p: cri.PodSandbox) -> Pod:
    """A pod as ListPodSandbox shows it (its cgroup parent needs the verbose status)."""
    return Pod(id=p.id, uid=p.metadata.uid, name=p.metadata.name, namespace=p.metadata.namespace,
               attempt=p.metadata.attempt, state=PodState.READY if p.state == cri.SANDBOX_READY else PodState.NOT_READY,
               labels=dict(p.labels), annotations=dict(p.annotations), runtime_handler=p.runtime_handler)


def listed_container(c: cri.Container) -> Container:
    """A container as ListContainers shows it (its resources need the status)."""
    return Container(id=c.id, pod_id=c.pod_sandbox_id, name=c.metadata.name, attempt=c.metadata.attempt,
                     state=_STATES.get(c.state, ContainerState.UNKNOWN), image=c.image.image,
                     labels=dict(c.labels), annotations=dict(c.annotations))


def verbose_info(info: Any) -> dict[str, Any]:
    """The runtime's verbose status JSON (containerd's "info" key); {} when absent or unreadable."""
    try:
        doc = json.loads(info.get("info", "") or "{}")
    except (ValueError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}


def dig(doc: Any, *keys: str) -> Any:
    for key in keys:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def status_resources(st: cri.ContainerStatusResponse) -> Resources:
    return resources(st.status.resources.linux if st.status.resources.HasField("linux") else None)
