"""OpenTelemetry export: the daemon in front of containerd sends traces of lifecycle calls (the
policy's decision a span of each) and its metrics over OTLP/gRPC to a collector that speaks the
published OTLP services (the opentelemetry-proto package's)."""

from __future__ import annotations

import subprocess
import sys
import threading
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from harness.relay import free_port, policy_relay
from tests.support.helpers import ONLINE, ROOT, Cri, cgroup_cpus, container_config, pod_config, resources, wait_until


class Collector(trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer):
    """An OTLP receiver that keeps every span and metric it is sent."""

    def __init__(self) -> None:
        self.spans: list = []
        self.metrics: dict[str, list] = {}
        self.resources: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self.port = free_port()
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        self.server.start()

    def Export(self, request, context):  # noqa: N802, ANN001, ANN201 - both services' one method
        with self.lock:
            if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
                for rs in request.resource_spans:
                    self.resources.append({a.key: a.value.string_value for a in rs.resource.attributes})
                    for ss in rs.scope_spans:
                        self.spans.extend(ss.spans)
                return trace_service_pb2.ExportTraceServiceResponse()
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        self.metrics.setdefault(m.name, []).append(m)
            return metrics_service_pb2.ExportMetricsServiceResponse()

    def named(self, name: str) -> list:
        with self.lock:
            return [s for s in self.spans if s.name == name]

    def points(self, name: str) -> list:
        with self.lock:
            found = self.metrics.get(name, [])
            if not found:
                return []
            m = found[-1]
            return list(getattr(m, m.WhichOneof("data")).data_points)


def attrs(span) -> dict:  # noqa: ANN001
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}


@pytest.fixture
def collector():
    c = Collector()
    yield c
    c.server.stop(0)


@pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs")
def test_lifecycle_calls_are_traced_and_metrics_exported(containerd, workdir, collector):
    relay = policy_relay(workdir, containerd.socket, "static", "--otlp-endpoint", f"127.0.0.1:{collector.port}",
                         "--otlp-interval", "0.5").start()
    via = Cri(relay.socket)
    try:
        cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
        pod = via.run_pod(cfg)
        cid = via.run_container(pod, cfg, container_config(resources=resources(1000, True)))
        mine = cgroup_cpus(cfg, cid)
        create = wait_until(lambda: collector.named("CreateContainer"), 20, what="a CreateContainer span")[0]
        children = {s.name: s for s in collector.named("policy decision") + collector.named("runtime")
                    if s.parent_span_id == create.span_id}
        assert set(children) == {"policy decision", "runtime"}
        decision = attrs(children["policy decision"])
        assert decision["policy"] == "static" and decision["grant"] == "exclusive"
        assert decision["cpuset.cpus"] == str(mine) and decision["exclusive"] == str(mine)
        assert attrs(create)["pod.name"] == cfg.metadata.name and attrs(create)["pod.qos"] == "Guaranteed"
        assert all(s.trace_id == create.trace_id for s in children.values())
        assert collector.resources[0]["service.name"] == "cri-resmgr"
        wait_until(lambda: collector.named("StartContainer") and collector.named("RunPodSandbox"), 20,
                   what="more spans")

        # The Prometheus metrics, the same names, as OTLP: counters of calls, gauges of pools.
        calls = wait_until(lambda: [p for p in collector.points("cri_resmgr_cri_requests")
                                    if {a.key: a.value.string_value for a in p.attributes}.get("method")
                                    == "CreateContainer"], 20, what="the CRI call counter")
        assert calls[0].as_double >= 1 or calls[0].as_int >= 1
        grants = wait_until(lambda: [p for p in collector.points("cri_resmgr_pool_exclusive_grants")
                                     if (p.as_double or p.as_int) >= 1], 20, what="the pool gauges")
        assert grants
        via.remove_pod(pod)
    finally:
        via.close()
        relay.stop()
    assert relay.proc.returncode == 0


def test_a_zero_export_interval_is_refused(workdir):
    out = subprocess.run([sys.executable, "-m", "resmgr", "--otlp-endpoint", "127.0.0.1:1", "--otlp-interval", "0",
                          "--relay-socket", str(workdir / "relay.sock"), "--relay-dir", str(workdir / "state"),
                          "--config-socket", "disabled"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode != 0 and "--otlp-interval 0.0: must be more than 0" in out.stderr
