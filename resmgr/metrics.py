"""Prometheus metrics of the daemon, in one registry of its own.

Counters and histograms are recorded where things happen (front ends, hook plugins, the
state store, the configuration manager); nothing is recorded until `enable()` is called,
which the daemon does only when it serves an HTTP endpoint or exports over OTLP, so a daemon
without either pays a single flag test per call and never imports prometheus_client (the
registry and families are made at first use). Per-pool and per-state gauges are not kept up to
date at all: `StateCollector` (resmgr/metrics_state.py) reads them from a snapshot taken on the
event loop at scrape time.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

PREFIX = "cri_resmgr"
# Lifecycle calls take milliseconds through seconds (image pulls are not intercepted).
CALL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

_m: Any = None  # the registry and families, made at first use: a daemon without metrics never imports them


def _families() -> Any:
    global _m
    if _m is not None:
        return _m
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector

    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    m = SimpleNamespace(REGISTRY=registry)
    m.CRI_CALLS = Counter(f"{PREFIX}_cri_requests", "CRI calls that reached the relay, by how they were served: "
                          "engine (answered by the policy engine), relayed (parsed and forwarded, e.g. dumped), "
                          "passthrough (spliced through as bytes)", ["method", "route", "code"], registry=registry)
    m.CRI_SECONDS = Histogram(f"{PREFIX}_cri_request_duration_seconds", "Time from a CRI call's request to its answer",
                              ["method", "route"], buckets=CALL_BUCKETS, registry=registry)
    m.HOOK_CALLS = Counter(f"{PREFIX}_hook_requests", "Calls to runtime hook plugins", ["plugin", "hook", "code"],
                           registry=registry)
    m.HOOK_SECONDS = Histogram(f"{PREFIX}_hook_request_duration_seconds", "Time a runtime hook plugin took to answer",
                               ["plugin", "hook"], buckets=CALL_BUCKETS, registry=registry)
    m.NRI_EVENTS = Counter(f"{PREFIX}_nri_events", "NRI requests from the runtime, by event and outcome",
                           ["event", "code"], registry=registry)
    m.NRI_SECONDS = Histogram(f"{PREFIX}_nri_event_duration_seconds", "Time the plugin took to answer an NRI request",
                              ["event"], buckets=FAST_BUCKETS, registry=registry)
    m.CONFIG_APPLIED = Counter(f"{PREFIX}_config_applies", "Configurations put in force", ["source"],
                               registry=registry)
    m.CONFIG_REJECTED = Counter(f"{PREFIX}_config_rejections", "Configurations refused (the one in force was kept)",
                                ["source"], registry=registry)
    m.CONFIG_GENERATION = Gauge(f"{PREFIX}_config_generation", "How many configurations were put in force since "
                                "start (1: the start-up one)", registry=registry)
    m.STATE_SAVES = Counter(f"{PREFIX}_state_saves", "Writes of the state file", ["outcome"], registry=registry)
    m.STATE_FAILING = Gauge(f"{PREFIX}_state_write_failing", "1 while a file of the state directory cannot be "
                            "written (what it holds is kept in memory and written once it can be), else 0", ["file"],
                            registry=registry)
    m.STATE_SECONDS = Histogram(f"{PREFIX}_state_save_duration_seconds", "Time to write and fsync the state file",
                                buckets=FAST_BUCKETS, registry=registry)
    _m = m
    return m


def __getattr__(name: str) -> Any:
    """REGISTRY and the families by name: made (and prometheus_client imported) at first use."""
    if name.isupper():
        families = _families()
        if hasattr(families, name):
            return getattr(families, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


enabled = False


def enable() -> None:
    global enabled
    _families()
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
        children = _cri_children[key] = (_m.CRI_CALLS.labels(method, route, code), _m.CRI_SECONDS.labels(method, route))
    children[0].inc()
    children[1].observe(seconds)


def hook_call(plugin: str, hook: str, code: str, seconds: float) -> None:
    if enabled:
        _m.HOOK_CALLS.labels(plugin, hook, code).inc()
        _m.HOOK_SECONDS.labels(plugin, hook).observe(seconds)


def nri_event(event: str, code: str, seconds: float) -> None:
    if enabled:
        _m.NRI_EVENTS.labels(event, code).inc()
        _m.NRI_SECONDS.labels(event).observe(seconds)


def state_saved(seconds: float, ok: bool) -> None:
    if enabled:
        _m.STATE_SAVES.labels("ok" if ok else "error").inc()
        if ok:
            _m.STATE_SECONDS.observe(seconds)


def state_failing(file: str, failing: bool) -> None:
    if enabled:
        _m.STATE_FAILING.labels(file).set(1 if failing else 0)


def config_applied(source: str, generation: int) -> None:
    if enabled:
        _m.CONFIG_APPLIED.labels(source_kind(source)).inc()
        _m.CONFIG_GENERATION.set(generation)


def config_rejected(source: str) -> None:
    if enabled:
        _m.CONFIG_REJECTED.labels(source_kind(source)).inc()
