"""`cri-resmgr` itself: the daemon, and the options that act on its state and exit (--reset-config,
--reset-policy, --print-config, --list-policies)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Coroutine
from typing import Any

from resmgr import log, policies
from resmgr.app.daemon import Daemon, StartupError
from resmgr.app.options import Options
from resmgr.config import ConfigError
from resmgr.control.manager import Sources
from resmgr.engine.store import StateInUse, StateStore, StateTooNew
from resmgr.options import from_args
from resmgr.sockets import SocketInUse, prepare
from resmgr.view.address import Address


def _reset(args: Options, sources: Sources) -> int:
    """--reset-config / --reset-policy: only while no relay runs on this socket."""
    try:
        prepare(args.relay_socket)
        store = StateStore(args.state_dir)
        store.prepare()
        store.claim()  # an NRI plugin on this state has no relay socket
    except (SocketInUse, StateInUse) as err:
        print(f"cri-resmgr: cannot reset while cri-resmgr runs: {err}", file=sys.stderr)
        return 1
    if args.reset_config:
        done = sources.reset_pushed()
        print("pushed configuration removed" if done else "no pushed configuration to remove")
    if args.reset_policy:
        try:
            state = store.load() if store.path.exists() else None
        except StateTooNew as err:
            print(f"cri-resmgr: {err}", file=sys.stderr)
            return 1
        if state and state.pop("policy", None) is not None:
            store.write(state)  # in the format it was read in
            print("policy allocations dropped; containers are re-allocated at the next start")
        else:
            print("no policy allocations to drop")
    return 0


def _run(coro: Coroutine[Any, Any, int]) -> int:
    # uvloop's event loop trims roughly a tenth off the relay's per-call CPU cost.
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(parsed: argparse.Namespace) -> int:
    """The daemon, or one of its one-shot options, from the parsed command line."""
    args = from_args(Options, parsed)
    if args.list_policies:
        print(policies.describe())
        return 0
    if args.metrics_address:
        try:
            Address.parse(args.metrics_address, args.metrics_allow_remote)
        except ValueError as err:
            print(f"cri-resmgr: --metrics-address {err}", file=sys.stderr)
            return 2
    sources = Sources(args.force_config, args.fallback_config, args.state_dir)
    if args.reset_config or args.reset_policy:
        return _reset(args, sources)
    try:
        config = sources.effective()
    except ConfigError as err:
        print(f"cri-resmgr: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        print(f"# effective configuration, from {config.source}")
        print(config.to_yaml(), end="")
        return 0
    debug = [s.strip() for s in args.logger_debug.split(",") if s.strip()]
    log.setup(args.log_level, debug)
    log.set_debug(config.debug_sources)
    if config.source == "built-in defaults":
        log.logging.getLogger("cri-resmgr").warning(
            "no configuration given; using built-in defaults (or the policy that allocated the running containers)")
    try:
        return _run(Daemon(args, sources, config).run())
    except (SocketInUse, StartupError, ConfigError) as err:
        print(f"cri-resmgr: {err}", file=sys.stderr)
        return 1
    except ValueError as err:  # bad --dump rules and similar
        print(f"cri-resmgr: {err}", file=sys.stderr)
        return 2
