"""The daemon's options, declared once (resmgr/options.py): each field is its flags, its default
and its --help. Options the configuration file also sets name its key (`config`); the flag wins
over it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from resmgr.hooks import DEFAULT_DIR, SKIP_LABEL
from resmgr.options import LOG_LEVELS, duration, group_id, on_off, opt

RELAY = "CRI relay"
NRI = "NRI front end (instead of the CRI relay)"
HOOKS = "runtime hook plugins (koordinator RuntimeHookService)"
DRA = "a DRA driver for kubelet: CPUs as devices a ResourceClaim can be allocated (docs/dra.md)"
VIEW = "what an operator sees (off unless an address is given)"
STATE = ""  # listed with the program's own options
ONCE = "do one thing and exit"


@dataclass
class Options:
    # -- the CRI relay -------------------------------------------------------------------------
    relay_socket: str = opt("/var/run/cri-resmgr/cri-resmgr.sock", "--relay-socket", "--koord-runtimeproxy-endpoint",
                            group=RELAY, help="unix socket the relay serves CRI on (default: %(default)s)")
    runtime_socket: str = opt("/var/run/containerd/containerd.sock", "--runtime-socket",
                              "--remote-runtime-service-endpoint", group=RELAY,
                              help="container runtime's CRI socket (default: %(default)s)")
    image_socket: str = opt("", "--image-socket", "--remote-image-service-endpoint", group=RELAY,
                            help="CRI image service socket (default: the runtime socket)")
    relay_mode: str = opt("splice", "--relay-mode", group=RELAY, choices=["splice", "grpc"],
                          help="splice: forward HTTP/2 frames between paired connections, answering only "
                               "intercepted calls (fast); grpc: a grpc.aio server and client (default: %(default)s)")
    allow_untested_runtimes: bool = opt(False, "--allow-untested-runtimes", group=RELAY,
                                        help="relay to runtimes other than containerd and CRI-O")
    dump: str | None = opt(None, "--dump", group=RELAY, config="dump.Config", metavar="RULES",
                           help="CRI message dump rules, e.g. 'off:.*,full:Create.*' "
                                "(levels off/short/full, later rules win; overrides dump.Config)")
    dump_file: str | None = opt(None, "--dump-file", group=RELAY, config="dump.File", metavar="PATH",
                                help="write dumps to PATH ('-' for stdout; default: the log; overrides dump.File)")
    runtime_events: bool = opt(True, "--runtime-events", group=RELAY, type=on_off, metavar="on|off",
                               help="follow the runtime's container events (CRI GetContainerEvents), so an exited "
                                    "container's CPUs are given back at once rather than at the next "
                                    "reconciliation; runtimes without events fall back to reconciliation by "
                                    "themselves (default: on)")
    # -- NRI ------------------------------------------------------------------------------------
    nri: bool = opt(False, "--nri", group=NRI,
                    help="run as an NRI plugin of the runtime rather than as a CRI relay; the relay flags "
                         "are then unused. A plugin the runtime starts itself (from its plugin directory) "
                         "takes its socket, name and index from NRI_PLUGIN_SOCKET/NAME/IDX")
    nri_socket: str = opt("/var/run/nri/nri.sock", "--nri-socket", group=NRI, metavar="PATH",
                          help="the runtime's NRI socket (default: %(default)s)")
    nri_name: str = opt("cri-resmgr", "--nri-plugin-name", group=NRI, metavar="NAME",
                        help="name to register with ([a-zA-Z0-9_.+-]+; default: %(default)s)")
    nri_index: str = opt("90", "--nri-plugin-index", group=NRI, metavar="NN",
                         help="two-digit index: plugins are called in ascending order, so a high one runs after "
                              "device plugins and sees their changes (default: %(default)s)")
    # -- hook plugins -----------------------------------------------------------------------------
    hook_dir: str = opt(DEFAULT_DIR, "--hook-dir", group=HOOKS, metavar="DIR",
                        help="directory of plugin registration files (*.json), watched for changes "
                             "('disabled': no hook plugins; default: %(default)s)")
    hook_timeout: float = opt(2.0, "--hook-timeout", group=HOOKS, type=duration, metavar="DURATION",
                              help="time a plugin gets per call unless its file says otherwise; never beyond the "
                                   "lifecycle call's own deadline (default: %(default)ss)")
    hook_skip_key: str = opt(SKIP_LABEL[0], "--hook-skip-label-key", "--runtime-hook-server-key", group=HOOKS,
                             metavar="KEY", help="pods with this label (set to the value below) and their "
                                                 "containers are never sent to plugins (default: %(default)s)")
    hook_skip_value: str = opt(SKIP_LABEL[1], "--hook-skip-label-value", "--runtime-hook-server-val", group=HOOKS,
                               metavar="VALUE", help="(default: %(default)s)")
    # -- DRA ---------------------------------------------------------------------------------------
    dra_driver: str = opt("", "--dra-driver", group=DRA, metavar="NAME",
                          help="register with kubelet as the DRA driver NAME, e.g. "
                               "cpu.cri-resource-manager.intel.com (a DNS subdomain; default: not a driver)")
    kubelet_dir: str = opt("/var/lib/kubelet", "--kubelet-dir", group=DRA, metavar="DIR",
                           help="kubelet's root directory: the driver registers in DIR/plugins_registry and serves "
                                "in DIR/plugins/NAME (default: %(default)s)")
    cdi_dir: str = opt("/var/run/cdi", "--cdi-dir", group=DRA, metavar="DIR",
                       help="a CDI spec directory of the runtime, where each prepared claim's device is "
                            "written (default: %(default)s)")
    agent_socket: str = opt("/var/run/cri-resmgr/cri-resmgr-agent.sock", "--agent-socket", group=DRA,
                            metavar="PATH", help="the node agent's socket, through which the driver reads the "
                                                 "ResourceClaims it prepares (default: %(default)s)")
    # -- what an operator sees -------------------------------------------------------------------
    metrics_address: str = opt("", "--metrics-address", group=VIEW, metavar="ADDR",
                               help="serve Prometheus metrics at /metrics, the node's state as JSON at "
                                    "/api/v1/state and a live picture of CPUs and containers at / on ADDR: "
                                    "unix:/PATH, or HOST:PORT on loopback, e.g. 127.0.0.1:8891 (default: not served)")
    metrics_allow_remote: bool = opt(False, "--metrics-allow-remote", group=VIEW,
                                     help="allow a --metrics-address beyond loopback (e.g. :8891 or the node's IP); "
                                          "the endpoint has no authentication and shows every pod and container "
                                          "of the node")
    ready_file: str = opt("", "--ready-file", group=VIEW, metavar="PATH",
                          help="a file that exists, rewritten every 10 s, while the daemon takes runtime calls: "
                               "for a probe that starts no Python, e.g. find PATH -mmin -1 (default: none)")
    otlp_endpoint: str = opt("", "--otlp-endpoint", group=VIEW, metavar="ADDR",
                             help="export traces of lifecycle calls (the policy's decision a span of each) and the "
                                  "metrics over OpenTelemetry's OTLP/gRPC to ADDR: HOST:PORT, http(s)://HOST:PORT or "
                                  "unix:///PATH (default: off)")
    otlp_interval: float = opt(15.0, "--otlp-interval", group=VIEW, type=duration, metavar="DURATION",
                               help="how often metrics and batched traces are exported over OTLP "
                                    "(default: %(default)s seconds)")
    # -- state, configuration and the node -------------------------------------------------------
    state_dir: str = opt("/var/lib/cri-resmgr", "--state-dir", "--relay-dir", metavar="DIR",
                         help="directory for persisted state: placements, the pushed configuration "
                              "(default: %(default)s)")
    force_config: str | None = opt(None, "--force-config", exclusive="config", metavar="FILE",
                                   help="YAML configuration that overrides any other source; reloaded on SIGHUP")
    fallback_config: str | None = opt(None, "--fallback-config", exclusive="config", metavar="FILE",
                                      help="YAML configuration used when the node agent has not pushed one")
    log_level: str = opt("INFO", "--log-level", choices=LOG_LEVELS, help="log level (default: %(default)s)")
    logger_debug: str = opt("", "--logger-debug", metavar="SOURCES",
                            help="comma-separated log sources to debug (engine, relay, store, dump), '*' for all")
    backend_runtime_mode: str = opt("Containerd", "--backend-runtime-mode", choices=["Containerd"],
                                    help="accepted for koord-runtime-proxy compatibility; only a CRI runtime "
                                         "(Containerd, also CRI-O) is supported")
    pid_file: str = opt("", "--pid-file", help="write the daemon's PID here")
    host_root: str = opt("/", "--host-root", metavar="DIR",
                         help="root of the host filesystem; topology is read from DIR/sys (default: %(default)s)")
    config_socket: str = opt("/var/run/cri-resmgr/cri-resmgr-config.sock", "--config-socket",
                             help="socket the node agent pushes configuration to ('disabled': none; "
                                  "default: %(default)s)")
    config_socket_group: int = opt(-1, "--config-socket-group", type=group_id, metavar="GROUP",
                                   help="a group (name or GID) whose members may connect to the configuration "
                                        "socket too, e.g. the node agent's when it runs as an unprivileged user "
                                        "(default: root only)")
    disable_policy_switch: bool = opt(False, "--disable-policy-switch",
                                      help="refuse any change of the active policy, at start-up and from pushed "
                                           "configuration")
    shutdown_grace: float = opt(5.0, "--shutdown-grace", type=duration, metavar="DURATION",
                                help="time in-flight calls get to finish on SIGTERM (default: %(default)ss)")
    resctrl_root: str = opt("/sys/fs/resctrl", "--resctrl-path", metavar="DIR",
                            help="where the resctrl filesystem is mounted, for RDT classes (default: %(default)s)")
    cgroup_root: str = opt("", "--cgroup-root", metavar="DIR",
                           help="where the cgroup hierarchies are mounted (default: HOST_ROOT/sys/fs/cgroup)")
    rebalance_interval: float = opt(0.0, "--rebalance-interval", type=duration, metavar="DURATION",
                                    help="re-place shared containers for a better fit this often, e.g. 30s or 5m "
                                         "(policies that support it: topology-aware; default: off)")
    reconcile_interval: float = opt(10.0, "--reconcile-interval", "--exit-poll-interval", type=duration,
                                    metavar="DURATION",
                                    help="how often to compare the state with what the runtime runs and repair the "
                                         "difference: release containers that exited or vanished, adopt ones made "
                                         "behind our back, update containers whose CPUs or memory nodes differ from "
                                         "their grant (0: only after a failed runtime call; default: %(default)ss)")

    # -- do one thing and exit ------------------------------------------------------------------
    print_config: bool = opt(False, "--print-config", group=ONCE,
                             help="print the effective configuration and where it came from, then exit")
    reset_config: bool = opt(False, "--reset-config", group=ONCE,
                             help="forget the configuration the node agent pushed last, then exit")
    reset_policy: bool = opt(False, "--reset-policy", group=ONCE,
                             help="drop the persisted policy allocations (containers are re-allocated at the next "
                                  "start), then exit")
    list_policies: bool = opt(False, "--list-policies", group=ONCE, help="list the available policies and exit")

    def __post_init__(self) -> None:
        if not self.cgroup_root:
            self.cgroup_root = os.path.join(self.host_root, "sys/fs/cgroup")

    @property
    def hook_skip_label(self) -> tuple[str, str]:
        return self.hook_skip_key, self.hook_skip_value

