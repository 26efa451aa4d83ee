"""`cri-resmgr status`: what the running relay has in force and where it came from.

    cri-resmgr status [--config-socket PATH] [--output text|json]

Asks the relay over its config socket (root only). Exit status 0 when the last pushed
or reloaded configuration was applied, 3 when it was rejected, 1 when the relay
cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import sys

import grpc
from google.protobuf.json_format import MessageToDict

from resmgr.app.daemon import Options
from resmgr.generated.config import status_pb2, status_pb2_grpc


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="cri-resmgr status", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config-socket", default=Options.config_socket,
                    help="the relay's config socket (default: %(default)s)")
    ap.add_argument("--output", choices=["text", "json"], default="text")
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the relay")
    args = ap.parse_args(argv)
    try:
        with grpc.insecure_channel("unix://" + args.config_socket) as channel:
            reply = status_pb2_grpc.StatusStub(channel).GetStatus(status_pb2.GetStatusRequest(),
                                                                 timeout=args.timeout)
    except grpc.RpcError as err:
        print(f"cri-resmgr status: cannot reach the relay on {args.config_socket}: {err.details()}",
              file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(MessageToDict(reply, preserving_proto_field_name=True,
                                       always_print_fields_with_no_presence=True), indent=2))
    else:
        print(f"policy: {reply.policy}")
        print(f"source: {reply.source}")
        print(f"pods: {reply.pods}, containers: {reply.containers}")
        if reply.last_error:
            print(f"last configuration rejected: {reply.last_error}")
        print("# effective configuration")
        print(reply.config, end="")
    return 3 if reply.last_error else 0
