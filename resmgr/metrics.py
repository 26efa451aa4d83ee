"""Prometheus metrics of the daemon, in one registry of its own.

Counters and histograms are recorded where things happen (front ends, hook plugins, the
state store, the configuration manager); nothing is recorded until `enable()` is called,
which the daemon does only when it serves an HTTP endpoint, so a daemon without one pays
a single flag test per call. Per-pool and per-state gauges are not kept up to date at
all: `StateCollector` reads them from a snapshot taken on the event loop at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

PREFIX = "cri_resmgr"
# Lifecycle calls take milliseconds through seconds (image pulls are not intercepted).
CALL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

CRI_CALLS = Counter(f"{PREFIX}_cri_requests", "CRI calls that reached the relay, by how they were served: "
                    "engine (answered by the policy engine), relayed (parsed and forwarded, e.g. dumped), "
                    "passthrough (spliced through as bytes)", ["method", "route", "code"], registry=REGISTRY)
CRI_SECONDS = Histogram(f"{PREFIX}_cri_request_duration_seconds", "Time from a CRI call's request to its answer",
                        ["method", "route"], buckets=CALL_BUCKETS, registry=REGISTRY)
HOOK_CALLS = Counter(f"{PREFIX}_hook_requests", "Calls to runtime hook plugins", ["plugin", "hook", "code"],
                     registry=REGISTRY)
HOOK_SECONDS = Histogram(f"{PREFIX}_hook_request_duration_seconds", "Time a runtime hook plugin took to answer",
                         ["plugin", "hook"], buckets=CALL_BUCKETS, registry=REGISTRY)
NRI_EVENTS = Counter(f"{PREFIX}_nri_events", "NRI requests from the runtime, by event and outcome",
                     ["event", "code"], registry=REGISTRY)
NRI_SECONDS = Histogram(f"{PREFIX}_nri_event_duration_seconds", "Time the plugin took to answer an NRI request",
                        ["event"], buckets=FAST_BUCKETS, registry=REGISTRY)
CONFIG_APPLIED = Counter(f"{PREFIX}_config_applies", "Configurations put in force", ["source"], registry=REGISTRY)
CONFIG_REJECTED = Counter(f"{PREFIX}_config_rejections", "Configurations refused (the one in force was kept)",
                          ["source"], registry=REGISTRY)
CONFIG_GENERATION = Gauge(f"{PREFIX}_config_generation", "How many configurations were put in force since start "
                          "(1: the start-up one)", registry=REGISTRY)
STATE_SAVES = Counter(f"{PREFIX}_state_saves", "Writes of the state file", ["outcome"], registry=REGISTRY)
STATE_FAILING = Gauge(f"{PREFIX}_state_write_failing", "1 while a file of the state directory cannot be written "
                      "(what it holds is kept in memory and written once it can be), else 0", ["file"],
                      registry=REGISTRY)
STATE_SECONDS = Histogram(f"{PREFIX}_state_save_duration_seconds", "Time to write and fsync the state file",
                          buckets=FAST_BUCKETS, registry=REGISTRY)

enabled = False


def enable() -> None:
    global enabled
    enabled = True


def source_kind(source: str) -> str:
    """A bounded label value for a configuration source ('agent (node x)' -> 'agent')."""
    for kind in ("agent", "forced", "fallback", "built-in"):
        if source.startswith(kind):
            return kind
    return "other"


_cri_children: dict[tuple[str, str, str], tuple[Any, Any]] = {}


def cri_call(method: str, route: str, code: str, seconds: float) -> None:
    if not enabled:
        return
    # labels() takes a lock and builds a key each time; the relay's hot path keeps the children.
    key = (method, route, code)
    children = _cri_children.get(key)
    if children is None:
        children = _cri_children[key] = (CRI_CALLS.labels(method, route, code), CRI_SECONDS.labels(method, route))
    children[0].inc()
    children[1].observe(seconds)


def hook_call(plugin: str, hook: str, code: str, seconds: float) -> None:
    if enabled:
        HOOK_CALLS.labels(plugin, hook, code).inc()
        HOOK_SECONDS.labels(plugin, hook).observe(seconds)


def nri_event(event: str, code: str, seconds: float) -> None:
    if enabled:
        NRI_EVENTS.labels(event, code).inc()
        NRI_SECONDS.labels(event).observe(seconds)


def state_saved(seconds: float, ok: bool) -> None:
    if enabled:
        STATE_SAVES.labels("ok" if ok else "error").inc()
        if ok:
            STATE_SECONDS.observe(seconds)


def state_failing(file: str, failing: bool) -> None:
    if enabled:
        STATE_FAILING.labels(file).set(1 if failing else 0)


def config_applied(source: str, generation: int) -> None:
    if enabled:
        CONFIG_APPLIED.labels(source_kind(source)).inc()
        CONFIG_GENERATION.set(generation)


def config_rejected(source: str) -> None:
    if enabled:
        CONFIG_REJECTED.labels(source_kind(source)).inc()


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
