"""cri-resmgr command line."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Coroutine
from typing import Any

from resmgr import __version__, log, policies
from resmgr.app.daemon import Daemon, Options, StartupError
from resmgr.config import ConfigError
from resmgr.config.manager import Sources
from resmgr.engine.store import StateInUse, StateStore
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


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}


def duration(text: str) -> float:
    """Seconds from '30', '30s', '500ms', '5m' or '1h'."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad duration {text!r} (use e.g. 30s, 500ms, 5m)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def build_parser() -> argparse.ArgumentParser:
    d = Options()
    p = argparse.ArgumentParser(prog="cri-resmgr", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--relay-socket", "--koord-runtimeproxy-endpoint", dest="relay_socket", default=d.relay_socket,
                   help="unix socket the relay serves CRI on (default: %(default)s)")
    p.add_argument("--runtime-socket", "--remote-runtime-service-endpoint", dest="runtime_socket",
                   default=d.runtime_socket, help="container runtime's CRI socket (default: %(default)s)")
    p.add_argument("--image-socket", "--remote-image-service-endpoint", dest="image_socket", default="",
                   help="CRI image service socket (default: the runtime socket)")
    p.add_argument("--backend-runtime-mode", choices=["Containerd"], default="Containerd",
                   help="accepted for koord-runtime-proxy compatibility; only a CRI runtime (Containerd, "
                        "also CRI-O) is supported")
    nri = p.add_argument_group("NRI front end (instead of the CRI relay)")
    nri.add_argument("--nri", action="store_true",
                     help="run as an NRI plugin of the runtime rather than as a CRI relay; the relay flags "
                          "are then unused. A plugin the runtime starts itself (from its plugin directory) "
                          "takes its socket, name and index from NRI_PLUGIN_SOCKET/NAME/IDX")
    nri.add_argument("--nri-socket", default=d.nri_socket, metavar="PATH",
                     help="the runtime's NRI socket (default: %(default)s)")
    nri.add_argument("--nri-plugin-name", default=d.nri_name, metavar="NAME",
                     help="name to register with ([a-zA-Z0-9_.+-]+; default: %(default)s)")
    nri.add_argument("--nri-plugin-index", default=d.nri_index, metavar="NN",
                     help="two-digit index: plugins are called in ascending order, so a high one runs after "
                          "device plugins and sees their changes (default: %(default)s)")
    hooks = p.add_argument_group("runtime hook plugins (koordinator RuntimeHookService)")
    hooks.add_argument("--hook-dir", default=d.hook_dir, metavar="DIR",
                       help="directory of plugin registration files (*.json), watched for changes "
                            "('disabled': no hook plugins; default: %(default)s)")
    hooks.add_argument("--hook-timeout", type=duration, default=d.hook_timeout, metavar="DURATION",
                       help="time a plugin gets per call unless its file says otherwise; never beyond the "
                            "lifecycle call's own deadline (default: %(default)ss)")
    hooks.add_argument("--hook-skip-label-key", "--runtime-hook-server-key", dest="hook_skip_key",
                       default=d.hook_skip_label[0], metavar="KEY",
                       help="pods with this label (set to the value below) and their containers are never sent "
                            "to plugins (default: %(default)s)")
    hooks.add_argument("--hook-skip-label-value", "--runtime-hook-server-val", dest="hook_skip_value",
                       default=d.hook_skip_label[1], metavar="VALUE", help="(default: %(default)s)")
    view = p.add_argument_group("what an operator sees (off unless an address is given)")
    view.add_argument("--metrics-address", default=d.metrics_address, metavar="ADDR",
                      help="serve Prometheus metrics at /metrics, the node's state as JSON at /api/v1/state and "
                           "a live picture of CPUs and containers at / on ADDR: unix:/PATH, or HOST:PORT on "
                           "loopback, e.g. 127.0.0.1:8891 (default: not served)")
    view.add_argument("--metrics-allow-remote", action="store_true",
                      help="allow a --metrics-address beyond loopback (e.g. :8891 or the node's IP); the endpoint "
                           "has no authentication and shows every pod and container of the node")
    p.add_argument("--relay-dir", default=d.relay_dir,
                   help="directory for persisted state (default: %(default)s)")
    p.add_argument("--pid-file", default="", help="write the daemon's PID here")
    p.add_argument("--host-root", default=d.host_root, metavar="DIR",
                   help="root of the host filesystem; topology is read from DIR/sys (default: %(default)s)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--force-config", metavar="FILE",
                     help="YAML configuration that overrides any other source; reloaded on SIGHUP")
    src.add_argument("--fallback-config", metavar="FILE",
                     help="YAML configuration used when the node agent has not pushed one")
    p.add_argument("--print-config", action="store_true",
                   help="print the effective configuration and where it came from, then exit")
    p.add_argument("--reset-config", action="store_true",
                   help="forget the configuration the node agent pushed last, then exit")
    p.add_argument("--reset-policy", action="store_true",
                   help="drop the persisted policy allocations (containers are re-allocated at the next "
                        "start), then exit")
    p.add_argument("--disable-policy-switch", action="store_true",
                   help="refuse any change of the active policy, at start-up and from pushed configuration")
    p.add_argument("--config-socket", default=d.config_socket,
                   help="socket the node agent pushes configuration to ('disabled': none; default: %(default)s)")
    p.add_argument("--list-policies", action="store_true", help="list the available policies and exit")
    p.add_argument("--dump", metavar="RULES",
                   help="CRI message dump rules, e.g. 'off:.*,full:Create.*' "
                        "(levels off/short/full, later rules win; overrides dump.Config)")
    p.add_argument("--dump-file", metavar="PATH",
                   help="write dumps to PATH ('-' for stdout; default: the log)")
    p.add_argument("--allow-untested-runtimes", action="store_true",
                   help="relay to runtimes other than containerd and CRI-O")
    p.add_argument("--shutdown-grace", type=float, default=d.shutdown_grace, metavar="SECONDS",
                   help="time in-flight calls get to finish on SIGTERM (default: %(default)s)")
    p.add_argument("--relay-mode", choices=["splice", "grpc"], default=d.relay_mode,
                   help="splice: forward HTTP/2 frames between paired connections, answering only "
                        "intercepted calls (fast); grpc: a grpc.aio server and client (default: %(default)s)")
    p.add_argument("--resctrl-path", default=d.resctrl_root, metavar="DIR",
                   help="where the resctrl filesystem is mounted, for RDT classes (default: %(default)s)")
    p.add_argument("--cgroup-root", metavar="DIR",
                   help="where the cgroup hierarchies are mounted (default: HOST_ROOT/sys/fs/cgroup)")
    p.add_argument("--rebalance-interval", type=duration, default=d.rebalance_interval, metavar="DURATION",
                   help="re-place shared containers for a better fit this often, e.g. 30s or 5m "
                        "(policies that support it: topology-aware; default: off)")
    p.add_argument("--reconcile-interval", "--exit-poll-interval", type=duration, default=d.reconcile_interval,
                   metavar="DURATION", dest="reconcile_interval",
                   help="how often to compare the state with what the runtime runs and repair the difference: "
                        "release containers that exited or vanished, adopt ones made behind our back, update "
                        "containers whose CPUs or memory nodes differ from their grant (0: only after a failed "
                        "runtime call; default: %(default)ss)")
    p.add_argument("--runtime-events", choices=["on", "off"], default="on",
                   help="follow the runtime's container events (CRI GetContainerEvents), so an exited "
                        "container's CPUs are given back at once rather than at the next reconciliation; "
                        "runtimes without events fall back to reconciliation by themselves (default: %(default)s)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="log level (default: %(default)s)")
    p.add_argument("--logger-debug", metavar="SOURCES", default="",
                   help="comma-separated log sources to debug (engine, relay, store, dump), '*' for all")
    p.add_argument("--version", action="version", version=f"cri-resmgr {__version__}")
    return p


def _reset(args: argparse.Namespace, sources: Sources) -> int:
    """--reset-config / --reset-policy: only while no relay runs on this socket."""
    try:
        prepare(args.relay_socket)
        store = StateStore(args.relay_dir)
        store.prepare()
        store.claim()  # an NRI plugin on this state has no relay socket
    except (SocketInUse, StateInUse) as err:
        print(f"cri-resmgr: cannot reset while cri-resmgr runs: {err}", file=sys.stderr)
        return 1
    if args.reset_config:
        done = sources.reset_pushed()
        print("pushed configuration removed" if done else "no pushed configuration to remove")
    if args.reset_policy:
        state = store.load() if store.path.exists() else None
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
    args = build_parser().parse_args(argv)
    if args.list_policies:
        print(policies.describe())
        return 0
    if args.metrics_address:
        try:
            Address.parse(args.metrics_address, args.metrics_allow_remote)
        except ValueError as err:
            print(f"cri-resmgr: --metrics-address {err}", file=sys.stderr)
            return 2
    sources = Sources(args.force_config, args.fallback_config, args.relay_dir)
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
    opts = Options(relay_socket=args.relay_socket, runtime_socket=args.runtime_socket,
                   image_socket=args.image_socket, relay_dir=args.relay_dir, pid_file=args.pid_file,
                   allow_untested_runtimes=args.allow_untested_runtimes, dump=args.dump,
                   dump_file=args.dump_file, shutdown_grace=args.shutdown_grace,
                   relay_mode=args.relay_mode, host_root=args.host_root,
                   rebalance_interval=args.rebalance_interval, reconcile_interval=args.reconcile_interval,
                   runtime_events=args.runtime_events == "on",
                   config_socket=args.config_socket,
                   disable_policy_switch=args.disable_policy_switch,
                   resctrl_root=args.resctrl_path, hook_dir=args.hook_dir, hook_timeout=args.hook_timeout,
                   hook_skip_label=(args.hook_skip_key, args.hook_skip_value),
                   nri=args.nri, nri_socket=args.nri_socket, nri_name=args.nri_plugin_name,
                   nri_index=args.nri_plugin_index, metrics_address=args.metrics_address,
                   metrics_allow_remote=args.metrics_allow_remote,
                   cgroup_root=args.cgroup_root or os.path.join(args.host_root, "sys/fs/cgroup"))
    try:
        return _run(Daemon(opts, sources, config).run())
    except (SocketInUse, StartupError, ConfigError) as err:
        print(f"cri-resmgr: {err}", file=sys.stderr)
        return 1
    except ValueError as err:  # bad --dump rules and similar
        print(f"cri-resmgr: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
