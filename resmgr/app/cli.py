"""cri-resmgr command line."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Coroutine
from typing import Any

from resmgr import __version__, log, policies
from resmgr.app.daemon import Daemon, StartupError
from resmgr.app.options import Options
from resmgr.config import ConfigError
from resmgr.control.manager import Sources
from resmgr.engine.store import StateInUse, StateStore, StateTooNew
from resmgr.options import add_to, from_args
from resmgr.sockets import SocketInUse, prepare
from resmgr.view.server import Address

DESCRIPTION = """\
CRI resource manager: a CRI relay between kubelet and the container runtime.
Point kubelet's --container-runtime-endpoint at the relay socket; pod and container
lifecycle calls are handed to the active policy and to the runtime hook plugins
registered in the hook directory, everything else passes through. It accepts
koord-runtime-proxy's flags, so it can take that binary's place on a node.

With --nri it runs instead as an NRI plugin inside the runtime (containerd >= 1.7,
CRI-O >= 1.26 with NRI enabled): no kubelet reconfiguration, the same policies, state
and hook plugins.

`cri-resmgr simulate --help` runs a policy over a list of pods without a runtime;
`cri-resmgr status --help` shows what a running relay has in force."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cri-resmgr", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_to(p, Options)
    p.add_argument("--version", action="version", version=f"cri-resmgr {__version__}")
    return p


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
            state.pop("version", None)
            store.write(state)
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["simulate"]:
        from resmgr.app import simulate

        return simulate.main(argv[1:])
    if argv[:1] == ["status"]:
        from resmgr.app import status

        return status.main(argv[1:])
    args = from_args(Options, build_parser().parse_args(argv))
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


if __name__ == "__main__":
    sys.exit(main())
