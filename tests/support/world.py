"""Pods and containers as the engine would hold them, driving one policy without a runtime."""

from __future__ import annotations

from resmgr import policies
from resmgr.engine.ledger import Ledger
from resmgr.model import Container, ContainerState, Decision, Pod, QOSClass, Resources
from resmgr.policies import PolicyError
from resmgr.requests import milli_to_shares
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.model import Topology
from tests.support.machines import machine as machine  # where the tests have always found it


class World(Ledger):
    """The engine's ledger with helpers to make pods and containers."""

    def __init__(self, name: str, topology: Topology, **config) -> None:
        super().__init__(policies.create(name, {"Active": name, **config}, topology))
        self.n = 0

    def pod(self, qos: QOSClass, namespace: str = "default", annotations=None) -> Pod:
        self.n += 1
        return self.add_pod(Pod(id=f"pod{self.n}", uid=f"uid{self.n}", name=f"p{self.n}", namespace=namespace,
                                qos_class=qos, annotations=annotations or {}))

    def add(self, qos: QOSClass, milli: int, namespace: str = "default", annotations=None, memory: int = 0,
            pod: Pod | None = None, name: str = "app", running_on: str | None = None,
            limit: int | None = None) -> Container:
        """A container (in a new pod unless one is given) allocated by the policy; running_on: one found
        running on those CPUs, adopted; limit: its CPU limit in milli-CPU (default: the request, 0: none)."""
        new_pod = pod is None
        pod = pod or self.pod(qos, namespace, annotations)
        self.n += 1
        limit = milli if limit is None else limit
        res = Resources(cpu_shares=milli_to_shares(milli), cpu_quota=limit * 100,
                        cpu_period=100000, memory_limit_in_bytes=memory)
        # Being created (as the engine's create sees it), or found running (adopted); it runs once placed.
        c = Container(id=f"c{self.n}", pod_id=pod.id, name=name,
                      state=ContainerState.PENDING if running_on is None else ContainerState.RUNNING,
                      requested=res, resources=res if running_on is None else res.with_cpus(running_on))
        try:
            d = self.place(c, pod) if running_on is None else self._adopt(c, pod)
        except PolicyError:
            if new_pod:
                del self.pods[pod.id]
            raise
        c.state = ContainerState.RUNNING
        self.record(d.updates)
        return c

    def _adopt(self, c: Container, pod: Pod) -> Decision:
        """As reconciliation adopts a container found running: known first, then placed."""
        self.enter(c)
        self.unallocated.add(c.key)
        try:
            d = self.place_waiting(c, pod)
        except PolicyError:
            del self.containers[c.key]
            self.unallocated.discard(c.key)
            raise
        self.apply(c, d)
        return d

    def cpus(self, c: Container) -> CPUSet:
        return CPUSet.parse(self.containers[c.key].resources.cpuset_cpus)

    def mems(self, c: Container) -> CPUSet:
        return CPUSet.parse(self.containers[c.key].resources.cpuset_mems)
