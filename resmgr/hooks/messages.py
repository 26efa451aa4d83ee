"""The engine's model to RuntimeHookService messages, and a plugin's answer back to an Adjustment."""

from __future__ import annotations

from resmgr.generated.hooks import api_pb2 as pb
from resmgr.model import Adjustment, Container, Pod, Resources


def resources(res: Resources) -> pb.LinuxContainerResources:
    msg = pb.LinuxContainerResources(
        cpu_period=res.cpu_period, cpu_quota=res.cpu_quota, cpu_shares=res.cpu_shares,
        memory_limit_in_bytes=res.memory_limit_in_bytes, oom_score_adj=res.oom_score_adj,
        cpuset_cpus=res.cpuset_cpus, cpuset_mems=res.cpuset_mems,
        memory_swap_limit_in_bytes=res.memory_swap_limit_in_bytes, unified=res.unified)
    for size, limit in res.hugepage_limits.items():
        msg.hugepage_limits.add(page_size=size, limit=limit)
    return msg


def set_fields(msg: pb.LinuxContainerResources) -> Resources | None:
    """The fields an answer sets, by koord-runtime-proxy's rules (None: it sets none).

    Numbers count when positive (CPU quota and OOM score adjustment when non-zero); an empty
    cpuset means "no change" rather than "no pinning", so an answer cannot clear one by accident.
    """
    out = Resources(
        cpu_period=max(msg.cpu_period, 0), cpu_quota=msg.cpu_quota, cpu_shares=max(msg.cpu_shares, 0),
        memory_limit_in_bytes=max(msg.memory_limit_in_bytes, 0), oom_score_adj=msg.oom_score_adj,
        cpuset_cpus=msg.cpuset_cpus.strip(), cpuset_mems=msg.cpuset_mems.strip(),
        memory_swap_limit_in_bytes=max(msg.memory_swap_limit_in_bytes, 0),
        hugepage_limits={h.page_size: h.limit for h in msg.hugepage_limits if h.page_size},
        unified=dict(msg.unified))
    return out if out.to_dict() else None


def _pod_meta(pod: Pod) -> pb.PodSandboxMetadata:
    return pb.PodSandboxMetadata(name=pod.name, uid=pod.uid, namespace=pod.namespace, attempt=pod.attempt)


def pod_request(pod: Pod) -> pb.PodSandboxHookRequest:
    return pb.PodSandboxHookRequest(
        pod_meta=_pod_meta(pod), runtime_handler=pod.runtime_handler, labels=pod.labels,
        annotations=pod.annotations, cgroup_parent=pod.cgroup_parent, overhead=resources(pod.overhead),
        resources=resources(pod.resources))


def text(value: str) -> str:
    """value as protobuf text: bytes that were not UTF-8 (kept as surrogates) become U+FFFD."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def container_request(pod: Pod, c: Container) -> pb.ContainerResourceHookRequest:
    return pb.ContainerResourceHookRequest(
        pod_meta=_pod_meta(pod),
        container_meta=pb.ContainerMetadata(name=c.name, attempt=c.attempt, id=c.id),
        container_annotations=c.annotations, container_resources=resources(c.resources),
        pod_resources=resources(pod.resources), pod_annotations=pod.annotations, pod_labels=pod.labels,
        pod_cgroup_parent=pod.cgroup_parent, container_envs={k: text(v) for k, v in c.env.items()})


def pod_adjustment(resp: pb.PodSandboxHookResponse) -> Adjustment:
    return Adjustment(labels=dict(resp.labels), annotations=dict(resp.annotations),
                      cgroup_parent=resp.cgroup_parent.strip(),
                      resources=set_fields(resp.resources) if resp.HasField("resources") else None)


def container_adjustment(resp: pb.ContainerResourceHookResponse) -> Adjustment:
    res = set_fields(resp.container_resources) if resp.HasField("container_resources") else None
    return Adjustment(annotations=dict(resp.container_annotations), env=dict(resp.container_envs),
                      cgroup_parent=resp.pod_cgroup_parent.strip(), resources=res)
