"""OpenTelemetry: traces of lifecycle calls and the Prometheus metrics, exported over OTLP.

Off unless the daemon is given --otlp-endpoint; this module is imported only then. `start`
installs the SDK's providers and hands the engine's tracer (resmgr/tracing.py) OpenTelemetry's.
Metrics are not recorded twice: each of the daemon's Prometheus families (resmgr/metrics.py)
becomes an observable OTLP instrument that reads the registry when the exporter collects
(counters as counters, gauges and info as gauges, histograms as their _count and _sum counters).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from prometheus_client import CollectorRegistry

from resmgr import tracing

log = logging.getLogger("cri-resmgr.telemetry")

SERVICE = "cri-resmgr"


@dataclass
class Telemetry:
    """The SDK providers in use; `shutdown` flushes what is pending."""

    tracer_provider: Any
    meter_provider: Any

    def shutdown(self) -> None:
        for provider in (self.tracer_provider, self.meter_provider):
            try:
                provider.shutdown()
            except Exception as err:  # a collector that is away must not hold up the daemon's exit
                log.warning("flushing OpenTelemetry data failed: %s", err)


class PrometheusBridge:
    """Observable instruments over a Prometheus registry, one per family known at creation."""

    def __init__(self, registry: CollectorRegistry, meter: otel_metrics.Meter, max_age: float = 0.5) -> None:
        self.registry, self.max_age = registry, max_age
        self._lock = threading.Lock()
        self._at = 0.0
        self._values: dict[str, list[tuple[float, dict[str, str]]]] = {}
        self.names: list[str] = []
        for kind, name, doc in self._instruments(registry.collect()):
            make = meter.create_observable_counter if kind == "counter" else meter.create_observable_gauge
            make(name, callbacks=[self._callback(name)], description=doc)
            self.names.append(name)

    @staticmethod
    def _instruments(families: Iterable[Any]) -> list[tuple[str, str, str]]:
        out = []
        for f in families:
            if f.type == "histogram" or f.type == "summary":
                out += [("counter", f"{f.name}_count", f.documentation), ("counter", f"{f.name}_sum", f.documentation)]
            elif f.type == "counter":
                out.append(("counter", f.name, f.documentation))
            else:  # gauge, info, stateset, unknown
                out.append(("gauge", f.name, f.documentation))
        return out

    def _refresh(self) -> None:
        values: dict[str, list[tuple[float, dict[str, str]]]] = {}
        for f in self.registry.collect():
            for s in f.samples:
                if s.name.endswith("_created") or s.name.endswith("_bucket"):
                    continue
                name = f.name if s.name in (f"{f.name}_total", f"{f.name}_info") else s.name
                values.setdefault(name, []).append((s.value, dict(s.labels)))
        self._values, self._at = values, time.monotonic()

    def _callback(self, name: str) -> Any:
        def observe(options: otel_metrics.CallbackOptions) -> Iterable[otel_metrics.Observation]:
            with self._lock:  # one registry read serves every instrument of an export
                if time.monotonic() - self._at > self.max_age:
                    self._refresh()
                values = self._values.get(name, [])
            return [otel_metrics.Observation(v, labels) for v, labels in values]
        return observe


def start(endpoint: str, interval: float, registry: CollectorRegistry, node: str = "") -> Telemetry:
    """Install the SDK's providers exporting to an OTLP/gRPC endpoint (HOST:PORT, or unix:///PATH)."""
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attrs = {"service.name": SERVICE, **({"host.name": node} if node else {})}
    resource = Resource.create(attrs)
    insecure = not endpoint.startswith("https://")
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=insecure),
                                                          schedule_delay_millis=int(interval * 1000)))
    trace.set_tracer_provider(tracer_provider)
    tracing.install(trace.get_tracer(SERVICE))
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=endpoint, insecure=insecure),
                                           export_interval_millis=int(interval * 1000))
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    otel_metrics.set_meter_provider(meter_provider)
    PrometheusBridge(registry, meter_provider.get_meter("cri-resmgr"))
    log.info("OpenTelemetry: traces and metrics go to %s every %.1fs", endpoint, interval)
    return Telemetry(tracer_provider, meter_provider)
