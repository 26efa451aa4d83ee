"""A second DRA driver for the cluster tests: another kind of device (a "NIC") on chosen NUMA nodes,
so a claim can align it with cri-resmgr's CPUs by the standard attribute, as a GPU or NIC driver's
device would be. No such driver is served by the Go module proxy, so this one stands in, speaking
kubelet's real protocols (plugin registration, the DRA v1 node service) with the project's generated
stubs, and publishing its ResourceSlice through the API server.

    python -m tests.support.dradriver --driver nic.test.example.com --node N --kubelet-dir DIR \
        --kubeconfig F --device nic-0=1 [--device nic-1=0 ...]

Each device carries `resource.kubernetes.io/numaNode`; preparing a claim answers with the claim's
devices of this driver (read from the API server) and no CDI device. Each prepare and unprepare is
one line on stdout, which the tests read from the log."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client, config

from resmgr.generated.dra import api_pb2 as dra
from resmgr.generated.dra import api_pb2_grpc as dra_grpc
from resmgr.generated.pluginregistration import api_pb2 as reg
from resmgr.generated.pluginregistration import api_pb2_grpc as reg_grpc

NUMA_NODE = "resource.kubernetes.io/numaNode"
log = logging.getLogger("test-dra-driver")


class Registration(reg_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str) -> None:
        self.driver, self.endpoint = driver, endpoint
        self.registered = threading.Event()

    def GetInfo(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method names
        return reg.PluginInfo(type="DRAPlugin", name=self.driver, endpoint=self.endpoint,
                              supported_versions=["v1.DRAPlugin"])

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        print(f"registered {request.plugin_registered} {request.error}", flush=True)
        if request.plugin_registered:
            self.registered.set()
        return reg.RegistrationStatusResponse()


class Node(dra_grpc.DRAPluginServicer):
    def __init__(self, driver: str, api: client.ApiClient) -> None:
        self.driver = driver
        self.custom = client.CustomObjectsApi(api)

    def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        answers = {}
        for asked in request.claims:
            doc = self.custom.get_namespaced_custom_object("resource.k8s.io", "v1", asked.namespace,
                                                           "resourceclaims", asked.name)
            results = [r for r in doc["status"]["allocation"]["devices"]["results"] if r["driver"] == self.driver]
            print(f"prepare {asked.namespace}/{asked.name} {' '.join(r['device'] for r in results)}", flush=True)
            answers[asked.uid] = dra.NodePrepareResourceResponse(devices=[
                dra.Device(request_names=[r["request"]], pool_name=r["pool"], device_name=r["device"])
                for r in results])
        return dra.NodePrepareResourcesResponse(claims=answers)

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        for c in request.claims:
            print(f"unprepare {c.namespace}/{c.name}", flush=True)
        return dra.NodeUnprepareResourcesResponse(
            claims={c.uid: dra.NodeUnprepareResourceResponse() for c in request.claims})


def slice_body(driver: str, node: str, devices: dict[str, int]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                  "resourceSliceCount": 1},
                     "devices": [{"name": name, "attributes": {NUMA_NODE: {"int": numa}, "kind": {"string": "nic"}}}
                                 for name, numa in sorted(devices.items())]}}


def publish(custom: client.CustomObjectsApi, body: dict[str, Any], stop: threading.Event) -> None:
    """Keep the slice there: kubelet wipes a driver's slices when it (re)starts or loses the driver."""
    while not stop.is_set():
        try:
            custom.get_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", body["metadata"]["name"])
        except client.ApiException as err:
            if err.status != 404:
                log.warning("reading the slice: %s", err.reason)
            else:
                custom.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", body)
                print("published", flush=True)
        stop.wait(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--driver", required=True)
    ap.add_argument("--node", required=True)
    ap.add_argument("--kubelet-dir", required=True, help="kubelet's root directory")
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--device", action="append", default=[], help="NAME=NUMA, a device on that NUMA node")
    args = ap.parse_args()
    devices = {name: int(numa) for name, numa in (d.split("=", 1) for d in args.device)}
    api = config.new_client_from_config(args.kubeconfig)

    endpoint = os.path.join(args.kubelet_dir, "plugins", args.driver, "dra.sock")
    registry = os.path.join(args.kubelet_dir, "plugins_registry", f"{args.driver}-reg.sock")
    registration = Registration(args.driver, endpoint)
    servers = []
    for path, add, servicer in ((endpoint, dra_grpc.add_DRAPluginServicer_to_server, Node(args.driver, api)),
                                (registry, reg_grpc.add_RegistrationServicer_to_server, registration)):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        add(servicer, server)
        server.add_insecure_port("unix://" + path)
        server.start()
        servers.append((server, path))

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not registration.registered.wait(0.2):
        if stop.is_set():
            break
    publish(client.CustomObjectsApi(api), slice_body(args.driver, args.node, devices), stop)
    for server, path in reversed(servers):
        server.stop(1).wait()
        Path(path).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
