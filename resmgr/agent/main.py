"""`cri-resmgr-agent`: the only process on the node that talks to the Kubernetes API.

Watches this node's Node object and its configurations - ResourceManagerConfig resources
and ConfigMaps, node-specific > group > default, a resource before a ConfigMap at the same
level - pushes the one in force to cri-resmgr over the config link, records the outcome on
the Node and in the resource's status, optionally publishes the node's
NodeResourceTopology, and serves the Agent service cri-resmgr uses for cluster operations.

    NODE_NAME=$(hostname) cri-resmgr-agent [--kubeconfig FILE] [--config-namespace kube-system]
    cri-resmgr-agent probe   # readiness: exit 0 when the last push was applied
    cri-resmgr-agent tally [--kubeconfig FILE] [--config-namespace kube-system]
                             # one per cluster: each ResourceManagerConfig's counts from the
                             # nodes' ResourceManagerNodeStatus objects
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from dataclasses import dataclass

import grpc

from resmgr import __version__
from resmgr.agent import apiclient
from resmgr.agent.agent import NodeAgent, Settings
from resmgr.agent.server import serve
from resmgr.agent.tally import Tally
from resmgr.generated.agent import api_pb2, api_pb2_grpc
from resmgr.options import LOG_LEVELS, add_to, from_args, opt, positive_duration
from resmgr.readyfile import ReadyFile

log = logging.getLogger("cri-resmgr-agent")

DEFAULT_AGENT_SOCKET = "/var/run/cri-resmgr/cri-resmgr-agent.sock"


@dataclass
class AgentOptions(Settings):
    """The agent's command line: what it does (Settings), and where it runs."""

    kubeconfig: str = opt("", "--kubeconfig", metavar="FILE", help="kubeconfig file (default: in-cluster credentials)")
    agent_socket: str = opt(DEFAULT_AGENT_SOCKET, "--agent-socket", metavar="PATH",
                            help="socket to serve the Agent service on (default: %(default)s)")
    ready_file: str = opt("", "--ready-file", metavar="PATH",
                          help="a file that exists, rewritten every 10 s, while `cri-resmgr-agent probe` would "
                               "pass: for a probe that starts no Python, e.g. find PATH -mmin -1 (default: none)")
    log_level: str = opt("INFO", "--log-level", choices=LOG_LEVELS, help="log level (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cri-resmgr-agent", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_to(p, AgentOptions)
    p.add_argument("--version", action="version", version=f"cri-resmgr-agent {__version__}")
    return p


def probe(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="cri-resmgr-agent probe",
                                 description="Readiness probe: exit 0 when the agent is healthy and the last "
                                             "push was applied; print why not and exit 1 otherwise.")
    ap.add_argument("--agent-socket", default=DEFAULT_AGENT_SOCKET, metavar="PATH",
                    help="the agent's socket (default: %(default)s)")
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


async def run(settings: Settings, creds: apiclient.Credentials, agent_socket: str, ready_file: str = "") -> int:
    api = apiclient.Client(creds)
    agent = NodeAgent(settings, api)
    server = await serve(agent, agent_socket)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = asyncio.create_task(agent.run())
    ready = asyncio.create_task(ReadyFile(ready_file, "the agent").keep(agent.health)) if ready_file else None
    crs = f"ResourceManagerConfigs {{node.{settings.node_name},group.<group>,default}} and "
    log.info("watching %sConfigMaps %s.{node.%s,group.<group>,default} in %s for node %s",
             crs if settings.custom_resources else "", settings.configmap_name, settings.node_name,
             settings.config_namespace,
             settings.node_name)
    done, _ = await asyncio.wait([task, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    task.cancel()
    if ready is not None:
        ready.cancel()
    await server.stop(1.0)
    if os.path.exists(agent_socket):
        os.unlink(agent_socket)
    await api.close()
    if task in done and task.exception() is not None:
        log.error("the agent stopped: %s", task.exception())
        return 1
    return 0


def credentials(kubeconfig: str) -> apiclient.Credentials | None:
    try:
        return apiclient.load_kubeconfig(kubeconfig) if kubeconfig else apiclient.in_cluster()
    except (OSError, ValueError, KeyError, TypeError) as err:
        how = f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster credentials (or use --kubeconfig)"
        print(f"cri-resmgr-agent: cannot load {how}: {err}", file=sys.stderr)
        return None


def tally_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="cri-resmgr-agent tally",
                                 description="Write each ResourceManagerConfig's counts (success, failure, "
                                             "pending, the nodes that rejected it) from the nodes' "
                                             "ResourceManagerNodeStatus objects. One per cluster.")
    ap.add_argument("--kubeconfig", default="", metavar="FILE",
                    help="kubeconfig file (default: in-cluster credentials)")
    ap.add_argument("--config-namespace", "--config-ns", default="kube-system", metavar="NAMESPACE",
                    help="namespace of the configurations and node statuses (default: %(default)s)")
    ap.add_argument("--interval", type=positive_duration, default=5.0, metavar="DURATION",
                    help="longest a node's report waits to be counted; the counts are written once the "
                         "reports are quiet for a second, or after this long (default: %(default)ss)")
    ap.add_argument("--ready-file", default="", metavar="PATH",
                    help="a file that exists while the tally has read the configurations and the nodes' status "
                         "and its last write went through, for a readiness probe (default: none)")
    ap.add_argument("--log-level", default="INFO", choices=LOG_LEVELS, help="log level (default: %(default)s)")
    return ap


def tally(argv: list[str]) -> int:
    args = tally_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    creds = credentials(args.kubeconfig)
    if creds is None:
        return 2

    async def go() -> None:
        api = apiclient.Client(creds, user_agent="cri-resmgr-agent-tally")
        task = asyncio.create_task(Tally(api, args.config_namespace, args.interval, ready_file=args.ready_file).run())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        log.info("tallying the nodes' status of the configurations in %s", args.config_namespace)
        try:
            await task
        except asyncio.CancelledError:
            pass
        finally:
            await api.close()

    asyncio.run(go())
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["probe"]:
        return probe(argv[1:])
    if argv[:1] == ["tally"]:
        return tally(argv[1:])
    node_name = os.environ.get("NODE_NAME", "")
    args = from_args(AgentOptions, build_parser().parse_args(argv), node_name=node_name)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not node_name:
        print("cri-resmgr-agent: NODE_NAME must name this node (in a DaemonSet: the downward API's "
              "spec.nodeName)", file=sys.stderr)
        return 2
    creds = credentials(args.kubeconfig)
    if creds is None:
        return 2
    return asyncio.run(run(args, creds, args.agent_socket, args.ready_file))


if __name__ == "__main__":
    sys.exit(main())
