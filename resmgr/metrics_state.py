"""The daemon's per-pool and per-state gauges, read from a state document at scrape time (made
only when the daemon serves or exports metrics: it needs prometheus_client)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from resmgr.metrics import PREFIX


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)


class StateCollector(Collector):
    """Gauges of pools, pods and containers from a state document (see resmgr/view/state.py).

    `refresh` is called on the event loop before each scrape, so the collector, which runs in
    the exporter's thread, only ever reads a finished snapshot.
    """

    def __init__(self, snapshot: Callable[[], Mapping[str, Any]]) -> None:
        self._snapshot = snapshot
        self._doc: Mapping[str, Any] = {}

    def refresh(self) -> None:
        self._doc = self._snapshot()

    def collect(self) -> Iterator[Any]:
        doc = self._doc
        if not doc:
            return
        policy = str(doc.get("policy", ""))
        info = InfoMetricFamily(f"{PREFIX}_policy", "The active policy and the source of the configuration",
                                labels=[])
        info.add_metric([], {"policy": policy, "source": str(doc.get("config", {}).get("source", ""))})
        yield info
        yield from self._pools(policy, doc.get("pools", []))
        pods = _gauge("pods", "Pods the engine knows", ["qos_class"])
        containers = _gauge("containers", "Containers the engine knows", ["state"])
        by_qos: dict[str, int] = {}
        by_state: dict[str, int] = {}
        for pod in doc.get("pods", []):
            by_qos[pod["qos_class"]] = by_qos.get(pod["qos_class"], 0) + 1
            for c in pod["containers"]:
                by_state[c["state"]] = by_state.get(c["state"], 0) + 1
        for qos, n in sorted(by_qos.items()):
            pods.add_metric([qos], n)
        for state, n in sorted(by_state.items()):
            containers.add_metric([state], n)
        yield pods
        yield containers

    @staticmethod
    def _pools(policy: str, pools: list[Mapping[str, Any]]) -> Iterator[GaugeMetricFamily]:
        labels = ["policy", "pool"]
        families = {
            "cpus": _gauge("pool_cpus", "CPUs below the pool (isolated and reserved ones included)", labels),
            "shared_cpus": _gauge("pool_shared_cpus", "CPUs the pool's shared containers run on now", labels),
            "exclusive_grants": _gauge("pool_exclusive_grants", "Containers holding CPUs of the pool exclusively",
                                       labels),
            "containers": _gauge("pool_containers", "Containers placed in the pool", labels),
            "shared_milli_requested": _gauge("pool_shared_requested_millicpus",
                                             "Milli-CPU requested by the pool's shared containers", labels),
            "shared_milli_free": _gauge("pool_shared_free_millicpus",
                                        "Milli-CPU of the pool's shared CPUs not requested (negative: "
                                        "overcommitted)", labels),
            "shared_elsewhere": _gauge("pool_shared_elsewhere_containers",
                                       "Shared containers of the pool running on a parent pool's or the reserved "
                                       "CPUs, as exclusive grants hold all of the pool's own", labels),
        }
        memory = _gauge("pool_memory_bytes", "Memory of the pool's NUMA nodes by type", [*labels, "type"])
        for p in pools:
            values = [policy, p["name"]]
            stats = p.get("stats") or {}
            for key, family in families.items():
                family.add_metric(values, stats.get(key, 0))
            for kind, size in sorted((p.get("memory") or {}).items()):
                memory.add_metric([*values, kind], size)
        yield from families.values()
        yield memory
