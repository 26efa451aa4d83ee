"""`cri-resmgr status`: what the running daemon has in force, where it came from, and its pools.

    cri-resmgr status [--config-socket PATH] [--address ADDR] [--output text|json]
    cri-resmgr status --probe [--config-socket PATH]

Asks the daemon over its config socket (root only). When the daemon serves its state
(--metrics-address), the pools and containers are read from there too: each pool's CPUs,
what its shared containers run on now, exclusive grants, containers, and the shared
milli-CPU requested and still free. Exit status 0 when the last pushed or reloaded
configuration was applied and the daemon reports no problem (its state directory cannot be
written, say), 3 when the configuration was rejected, 4 when a problem is reported, 5 when it
takes no runtime calls now (an NRI plugin not registered with the runtime), 1 when the daemon
cannot be reached.

--probe is for readiness and startup probes: silent, exit 0 while the daemon takes runtime
calls; else it says why and exits 1 (its configuration and problems are the agent's to report).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from resmgr.app.options import Options
from resmgr.app.text import columns
from resmgr.generated.config import status_pb2, status_pb2_grpc
from resmgr.options import add_to, from_args, opt, positive_duration


def tables(doc: dict[str, Any]) -> str:
    """Pools, then containers, of a state document (/api/v1/state)."""
    pools: list[tuple[str, ...]] = [("POOL", "PARENT", "CPUS", "SHARED NOW", "EXCL GRANTS", "CONTAINERS",
                                     "SHARED REQ (m)", "SHARED FREE (m)", "MEMS")]
    for p in doc["pools"]:
        st = p["stats"]
        pools.append((p["name"], p.get("parent") or "-", f"{p['cpus'] or '-'} ({st['cpus']})",
                      f"{p.get('shared') or '-'} ({st['shared_cpus']})", str(st["exclusive_grants"]),
                      str(st["containers"]), str(st["shared_milli_requested"]), str(st["shared_milli_free"]),
                      p.get("mems") or "-"))
    lines = columns(pools) if doc["pools"] else [f"the {doc['policy']} policy has no pools"]
    ctrs: list[tuple[str, ...]] = [("POD/CONTAINER", "STATE", "GRANT", "POOL", "CPUS", "MEMS", "RDT", "BLOCKIO")]
    for pod in doc["pods"]:
        for c in pod["containers"]:
            kind = f"{c['kind']} (on {c['fallback']} CPUs)" if c.get("fallback") else c["kind"]
            ctrs.append((f"{pod['namespace']}/{pod['name']}/{c['name']}", c["state"], kind or "-",
                         c["pool"] or "-", c["cpus"] or "-", c["mems"] or "-", c["rdt_class"] or "-",
                         c["blockio_class"] or "-"))
    roles: dict[str, int] = {}
    for cpu in doc["cpus"]:
        roles[cpu["role"]] = roles.get(cpu["role"], 0) + 1
    summary = ", ".join(f"{n} {role}" for role, n in sorted(roles.items()))
    notices = [f"note: {n}" for n in doc.get("notices", [])]
    return "\n".join([*lines, *notices, "", f"CPUs: {summary or 'none known'}", "", *columns(ctrs)])


@dataclass
class StatusOptions:
    config_socket: str = opt(Options.config_socket, "--config-socket", metavar="PATH",
                             help="the relay's config socket (default: %(default)s)")
    output: str = opt("text", "--output", choices=["text", "json"], help="(default: %(default)s)")
    timeout: float = opt(5.0, "--timeout", type=positive_duration, metavar="DURATION",
                         help="how long to wait for the relay (default: %(default)ss)")
    address: str = opt("", "--address", metavar="ADDR",
                       help="the daemon's --metrics-address, to read pools and containers from (default: the "
                            "address the daemon reports)")
    probe: bool = opt(False, "--probe", action="store_true",
                      help="only whether the daemon takes runtime calls (exit 0) or not (exit 1), for probes")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="cri-resmgr status", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_to(ap, StatusOptions)
    args = from_args(StatusOptions, ap.parse_args(argv))
    try:
        with grpc.insecure_channel("unix://" + args.config_socket) as channel:
            reply = status_pb2_grpc.StatusStub(channel).GetStatus(status_pb2.GetStatusRequest(),
                                                                 timeout=args.timeout)
    except grpc.RpcError as err:
        print(f"cri-resmgr status: cannot reach the relay on {args.config_socket}: {err.details()}",
              file=sys.stderr)
        return 1
    if args.probe:
        if reply.not_serving:
            print(f"cri-resmgr status: not serving: {reply.not_serving}", file=sys.stderr)
            return 1
        return 0
    from resmgr.view import client  # here: probes run the lines above every few seconds

    address = args.address or reply.http_address
    doc, why = None, "the daemon serves no state (start it with --metrics-address)"
    if address:
        try:
            doc = client.state(address, args.timeout)
        except (OSError, ValueError) as err:
            why = f"cannot read the state from {address}: {err}"
    if args.output == "json":
        out = MessageToDict(reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
        if doc is not None:
            out["state"] = doc
        print(json.dumps(out, indent=2))
    else:
        print(f"policy: {reply.policy}")
        print(f"source: {reply.source}")
        print(f"pods: {reply.pods}, containers: {reply.containers}")
        if reply.not_serving:
            print(f"not serving: {reply.not_serving}")
        if reply.last_error:
            print(f"last configuration rejected: {reply.last_error}")
        for problem in reply.problems:
            print(f"problem: {problem}")
        if doc is not None:
            print()
            print(tables(doc))
            print()
        else:
            print(f"pools: unknown; {why}")
        print("# effective configuration")
        print(reply.config, end="")
    return 5 if reply.not_serving else 3 if reply.last_error else 4 if reply.problems else 0
