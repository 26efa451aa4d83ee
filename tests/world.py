"""Pods and containers as the engine would hold them, driving one policy without a runtime."""

from __future__ import annotations

import tempfile

import policies
from policies import PolicyError, View
from resmgr.model import Container, ContainerState, Pod, QOSClass, Resources
from resmgr.requirements import milli_to_shares
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.generate import generate, parse_spec
from resmgr.topology.model import Topology
from resmgr.topology.sysfs import discover


def machine(spec: str) -> Topology:
    return discover(generate(parse_spec(spec), tempfile.mkdtemp(prefix="crirm-topo-")))


class World:
    def __init__(self, name: str, topology: Topology, **config) -> None:
        self.policy = policies.create(name, {"Active": name, **config}, topology)
        self.pods: dict[str, Pod] = {}
        self.containers: dict[str, Container] = {}
        self.n = 0

    def view(self) -> View:
        return View(self.pods, self.containers)

    def pod(self, qos: QOSClass, namespace: str = "default", annotations=None) -> Pod:
        self.n += 1
        pod = Pod(id=f"pod{self.n}", uid=f"uid{self.n}", name=f"p{self.n}", namespace=namespace, qos_class=qos,
                  annotations=annotations or {})
        self.pods[pod.id] = pod
        return pod

    def add(self, qos: QOSClass, milli: int, namespace: str = "default", annotations=None, memory: int = 0,
            pod: Pod | None = None, name: str = "app", running_on: str | None = None) -> Container:
        """A container (in a new pod unless one is given) allocated by the policy; running_on: one found
        running on those CPUs, adopted."""
        new_pod = pod is None
        pod = pod or self.pod(qos, namespace, annotations)
        self.n += 1
        res = Resources(cpu_shares=milli_to_shares(milli), cpu_quota=milli * 100 if milli else 0,
                        cpu_period=100000, memory_limit_in_bytes=memory)
        c = Container(id=f"c{self.n}", pod_id=pod.id, name=name, state=ContainerState.RUNNING,
                      requested=res, resources=res if running_on is None else res.with_cpus(running_on))
        self.containers[c.key] = c
        try:
            d = (self.policy.allocate if running_on is None else self.policy.adopt)(c, pod, self.view())
        except PolicyError:
            del self.containers[c.key]
            if new_pod:
                del self.pods[pod.id]
            raise
        c.resources = d.resources
        self.apply(d.updates)
        return c

    def apply(self, updates: dict[str, Resources]) -> None:
        for k, r in updates.items():
            self.containers[k].resources = r

    def remove(self, c: Container) -> None:
        d = self.policy.release(c, self.view())
        del self.containers[c.key]
        if not any(o.pod_id == c.pod_id for o in self.containers.values()):
            del self.pods[c.pod_id]
        self.apply(d.updates)

    def cpus(self, c: Container) -> CPUSet:
        return CPUSet.parse(self.containers[c.key].resources.cpuset_cpus)

    def mems(self, c: Container) -> CPUSet:
        return CPUSet.parse(self.containers[c.key].resources.cpuset_mems)
