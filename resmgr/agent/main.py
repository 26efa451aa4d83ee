"""`cri-resmgr-agent`: the only process on the node that talks to the Kubernetes API.

Watches this node's Node object and its configurations - ResourceManagerConfig resources
and ConfigMaps, node-specific > group > default, a resource before a ConfigMap at the same
level - pushes the one in force to cri-resmgr over the config link, records the outcome on
the Node and in the resource's status, optionally publishes the node's
NodeResourceTopology, and serves the Agent service cri-resmgr uses for cluster operations.

    NODE_NAME=$(hostname) cri-resmgr-agent [--kubeconfig FILE] [--config-ns kube-system]
    cri-resmgr-agent probe   # readiness: exit 0 when the last push was applied
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

import grpc
from kubernetes import client, config

from resmgr.agent.agent import ConfigAgent, Settings
from resmgr.agent.server import serve
from resmgr.generated.agent import api_pb2, api_pb2_grpc

log = logging.getLogger("cri-resmgr-agent")

DEFAULT_AGENT_SOCKET = "/var/run/cri-resmgr/cri-resmgr-agent.sock"


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    d = Settings(node_name="")
    p = argparse.ArgumentParser(prog="cri-resmgr-agent", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster credentials)")
    p.add_argument("--config-ns", default=d.namespace, help="namespace of the ConfigMaps (default: %(default)s)")
    p.add_argument("--configmap-name", default=d.configmap,
                   help="ConfigMap name prefix: NAME.node.<node>, NAME.group.<group>, NAME.default "
                        "(default: %(default)s)")
    p.add_argument("--label-name", default=d.label,
                   help="Node label that names the node's group (default: %(default)s)")
    p.add_argument("--cri-resmgr-socket", default=d.relay_socket,
                   help="cri-resmgr's config socket (default: %(default)s)")
    p.add_argument("--agent-socket", default=DEFAULT_AGENT_SOCKET,
                   help="socket to serve the Agent service on (default: %(default)s)")
    p.add_argument("--debounce", type=float, default=d.debounce, metavar="SECONDS",
                   help="let changes settle this long before pushing (default: %(default)s)")
    p.add_argument("--push-timeout", type=float, default=d.push_timeout, metavar="SECONDS",
                   help="how long one push may take (default: %(default)s)")
    p.add_argument("--resync-interval", type=float, default=d.resync, metavar="SECONDS",
                   help="push the configuration in force again this often, in case cri-resmgr restarted "
                        "without it (default: %(default)s)")
    p.add_argument("--retry-max", type=float, default=d.retry_most, metavar="SECONDS",
                   help="longest wait between retries of a failed watch or push (default: %(default)s)")
    p.add_argument("--custom-resources", choices=["on", "off"], default="on",
                   help="also read ResourceManagerConfig resources named node.<node>, group.<group> and default "
                        "in the config namespace (default: %(default)s; without their CRD none exist)")
    p.add_argument("--export-topology", choices=["on", "off"], default="off",
                   help="publish this node's NodeResourceTopology (topology.node.k8s.io/v1alpha2) as cri-resmgr "
                        "reports it (default: %(default)s)")
    p.add_argument("--topology-interval", type=positive, default=d.topology_interval, metavar="SECONDS",
                   help="shortest time between two NodeResourceTopology updates (default: %(default)s)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def probe(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="cri-resmgr-agent probe",
                                 description="Readiness probe: exit 0 when the agent is healthy and the last "
                                             "push was applied; print why not and exit 1 otherwise.")
    ap.add_argument("--agent-socket", default=DEFAULT_AGENT_SOCKET)
    args = ap.parse_args(argv)
    try:
        with grpc.insecure_channel("unix://" + args.agent_socket) as channel:
            reply = api_pb2_grpc.AgentStub(channel).HealthCheck(api_pb2.HealthCheckRequest(), timeout=5)
    except grpc.RpcError as err:
        print(f"agent not reachable on {args.agent_socket}: {err.details()}", file=sys.stderr)
        return 1
    if reply.error:
        print(reply.error, file=sys.stderr)
        return 1
    return 0


async def run(settings: Settings, api: client.CoreV1Api, agent_socket: str) -> int:
    agent = ConfigAgent(settings, api)
    server = await serve(agent, agent_socket)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = asyncio.create_task(agent.run())
    crs = f"ResourceManagerConfigs {{node.{settings.node_name},group.<group>,default}} and "
    log.info("watching %sConfigMaps %s.{node.%s,group.<group>,default} in %s for node %s",
             crs if settings.custom_resources else "", settings.configmap, settings.node_name, settings.namespace,
             settings.node_name)
    done, _ = await asyncio.wait([task, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    task.cancel()
    await server.stop(1.0)
    if os.path.exists(agent_socket):
        os.unlink(agent_socket)
    if task in done and task.exception() is not None:
        log.error("the agent stopped: %s", task.exception())
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["probe"]:
        return probe(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    node_name = os.environ.get("NODE_NAME", "")
    if not node_name:
        print("cri-resmgr-agent: NODE_NAME must name this node (in a DaemonSet: the downward API's "
              "spec.nodeName)", file=sys.stderr)
        return 2
    try:
        if args.kubeconfig:
            config.load_kube_config(args.kubeconfig)
        else:
            config.load_incluster_config()
    except Exception as err:  # the client raises several kinds for missing or broken credentials
        how = f"kubeconfig {args.kubeconfig}" if args.kubeconfig else "in-cluster credentials (or use --kubeconfig)"
        print(f"cri-resmgr-agent: cannot load {how}: {err}", file=sys.stderr)
        return 2
    settings = Settings(node_name=node_name, namespace=args.config_ns, configmap=args.configmap_name,
                        label=args.label_name, relay_socket=args.cri_resmgr_socket, debounce=args.debounce,
                        push_timeout=args.push_timeout, retry_most=args.retry_max, resync=args.resync_interval,
                        custom_resources=args.custom_resources == "on", export_topology=args.export_topology == "on",
                        topology_interval=args.topology_interval)
    return asyncio.run(run(settings, client.CoreV1Api(), args.agent_socket))


if __name__ == "__main__":
    sys.exit(main())
