"""Assemble and run the relay daemon: state, engine, relay server, signals."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from resmgr import metrics, policies, sockets
from resmgr.config import Config, ConfigError, cpus, validate
from resmgr.config import link as configlink
from resmgr.config.manager import ConfigManager, Rejected, Sources
from resmgr.controllers import ControllerError, Controllers
from resmgr.controllers.blockio import BlockIOController
from resmgr.controllers.rdt import RDTController
from resmgr.engine import Engine, statefile
from resmgr.engine.lifecycle import Runtime
from resmgr.engine.store import StateInUse, StateStore
from resmgr.frontends.cri import events
from resmgr.frontends.cri.runtime import CriRuntime, RuntimeClient
from resmgr.frontends.nri import connect
from resmgr.frontends.nri.connect import Endpoint
from resmgr.frontends.nri.plugin import NriPlugin
from resmgr.frontends.nri.runtime import NriRuntime
from resmgr.frontends.relay import memory
from resmgr.frontends.relay.dispatch import Dispatcher
from resmgr.frontends.relay.dump import DumpSink
from resmgr.frontends.relay.proxy import CHANNEL_OPTIONS, SERVER_OPTIONS, Relay
from resmgr.frontends.relay.splice import SpliceServer
from resmgr.hooks import DEFAULT_DIR, SKIP_LABEL, Hooks
from resmgr.policies import PolicyError
from resmgr.topology.hints import hints as device_hints
from resmgr.topology.sysfs import TopologyError, discover
from resmgr.view import state as statedoc
from resmgr.view.server import Address, ViewServer

log = logging.getLogger("cri-resmgr")

TESTED_RUNTIMES = ("containerd", "cri-o")
RETRY_INTERVAL = 1.0


@dataclass
class Options:
    relay_socket: str = "/var/run/cri-resmgr/cri-resmgr.sock"
    runtime_socket: str = "/var/run/containerd/containerd.sock"
    image_socket: str = ""
    relay_dir: str = "/var/lib/cri-resmgr"
    pid_file: str = ""
    allow_untested_runtimes: bool = False
    dump: str | None = None
    dump_file: str | None = None
    shutdown_grace: float = 5.0
    relay_mode: str = "splice"
    host_root: str = "/"
    config_socket: str = "/var/run/cri-resmgr/cri-resmgr-config.sock"
    disable_policy_switch: bool = False
    cgroup_root: str = "/sys/fs/cgroup"
    resctrl_root: str = "/sys/fs/resctrl"
    rebalance_interval: float = 0.0  # seconds; 0: off
    reconcile_interval: float = 10.0  # seconds; 0: only when something failed
    runtime_events: bool = True  # follow GetContainerEvents when the runtime serves it
    hook_dir: str = DEFAULT_DIR  # "disabled": no hook plugins
    hook_timeout: float = 2.0
    hook_skip_label: tuple[str, str] = SKIP_LABEL
    nri: bool = False  # serve as an NRI plugin instead of relaying CRI
    nri_socket: str = "/var/run/nri/nri.sock"
    nri_name: str = "cri-resmgr"
    nri_index: str = "90"
    metrics_address: str = ""  # "": no HTTP endpoint
    metrics_allow_remote: bool = False


class StartupError(Exception):
    pass


def _target(path: str) -> str:
    return path if path.startswith(("unix:", "unix-abstract:")) else "unix://" + path


def _path(endpoint: str) -> str:
    for prefix in ("unix://", "unix:"):
        if endpoint.startswith(prefix):
            return endpoint[len(prefix):]
    return endpoint


class Daemon:
    def __init__(self, opts: Options, sources: Sources, config: Config) -> None:
        self.opts = opts
        self.sources = sources
        self.config = config
        self.relay_socket = _path(opts.relay_socket)
        self.runtime_socket = _path(opts.runtime_socket)
        image = opts.image_socket
        self.image_socket = _path(image) if image and image != "default" else self.runtime_socket
        self._stop = asyncio.Event()
        self.hooks: Hooks | None = None

    async def _check_runtime(self, engine: Engine) -> None:
        version = await self.client.version()
        name = version.runtime_name
        if name not in TESTED_RUNTIMES:
            msg = f"runtime {name!r} {version.runtime_version} is not a tested runtime " \
                  f"({', '.join(TESTED_RUNTIMES)}); use --allow-untested-runtimes to proceed"
            if not self.opts.allow_untested_runtimes:
                raise StartupError(msg)
            log.warning("%s", msg)
        log.info("runtime %s %s (CRI %s) on %s", name, version.runtime_version,
                 version.runtime_api_version, self.runtime_socket)
        await engine.reconcile()

    async def _reconcile_until_done(self, engine: Engine) -> None:
        while not self._stop.is_set():
            try:
                await self._check_runtime(engine)
                return
            except StartupError as err:
                log.error("%s", err)
                self._stop.set()
                return
            except grpc.aio.AioRpcError as err:
                log.debug("runtime not ready yet: %s", err.details())
            except Exception:
                log.exception("reconciliation with the runtime failed; retrying")
            await asyncio.sleep(RETRY_INTERVAL)

    async def _rebalance(self, engine: Engine) -> None:
        while True:
            await asyncio.sleep(self.opts.rebalance_interval)
            try:
                moved = await engine.rebalance()
            except Exception:  # a failed round must not stop the next one
                log.exception("rebalancing failed")
                continue
            if moved:
                log.info("rebalanced: %d container(s) moved", moved)

    @staticmethod
    async def _watch_runtime(channel: grpc.aio.Channel, engine: Engine) -> None:
        """Reconcile as soon as the runtime is back after its connection was lost (a restart)."""
        lost = False
        state = channel.get_state(try_to_connect=True)
        while True:
            if state == grpc.ChannelConnectivity.READY:
                if lost:
                    log.info("runtime connection is back; reconciling")
                    engine.wake()
                lost = False
            elif state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.IDLE):
                lost = True
            await channel.wait_for_state_change(state)
            state = channel.get_state(try_to_connect=True)

    def _keep_persisted_policy(self, state: dict | None, store: StateStore) -> None:
        """Without any configuration, keep the policy (and its settings) that allocated the running
        containers rather than silently switching to the default one."""
        persisted = (state or {}).get("policy") or {}
        name, section = persisted.get("name"), persisted.get("config")
        if self.config.source != "built-in defaults" or not name or name == self.config.policy_name:
            return
        try:
            kept = validate({"policy": section or {"Active": name}}, f"policy kept from {store.path}")
        except ConfigError as err:
            log.error("no configuration given, and the persisted %s policy settings are unusable (%s); "
                      "re-allocating every container under the %s policy", name, err, self.config.policy_name)
            return
        log.warning("no configuration given; keeping the %s policy and its settings that allocated the running "
                    "containers (from %s)", name, store.path)
        self.config = kept

    async def run(self) -> int:
        if self.opts.nri:
            return await self._run_nri()
        memory.tune()
        sockets.prepare(self.relay_socket)
        store, state = self._load_state()
        self._open_channels()
        try:
            engine = self._make_engine(store, state, CriRuntime(self.client))
            self.hooks = self._make_hooks()
            dispatcher = Dispatcher(engine, self.runtime_ch, self.image_ch, None, self.runtime_socket,
                                    self.image_socket, self.hooks)
            control = self._make_control(engine, dispatcher)
            view = await self._serve_view(engine, control)
            background = await self._first_reconcile(engine)
            stop_server = await self._serve(dispatcher)
            config_server = await self._serve_config(control)
            log.info("relaying %s -> runtime %s, images %s, policy %s, %s front end", self.relay_socket,
                     self.runtime_socket, self.image_socket, engine.policy.name, self.opts.relay_mode)
            relay_loops = [self._watch_runtime(self.runtime_ch, engine)]
            if self.opts.runtime_events:
                relay_loops.append(events.follow(engine, self.client))
            loops = self._start_loops(engine, *relay_loops)
            await self._stop.wait()
            for task in [*loops, *([background] if background else [])]:
                task.cancel()
            await self._shut_down(engine, stop_server, config_server, view)
        finally:
            Path(self.relay_socket).unlink(missing_ok=True)
            if self.opts.pid_file:
                Path(self.opts.pid_file).unlink(missing_ok=True)
            if self.dispatcher is not None and self.dispatcher.dumper is not None:
                self.dispatcher.dumper.close()
            if self.hooks is not None:
                await self.hooks.close()
            await self.runtime_ch.close()
            if self.image_ch is not self.runtime_ch:
                await self.image_ch.close()
        return 0

    async def _run_nri(self) -> int:
        """The NRI front end: the same engine, state and hook plugins, as a plugin of the runtime."""
        try:
            endpoint = Endpoint.from_environment(_path(self.opts.nri_socket), self.opts.nri_name, self.opts.nri_index)
        except ValueError as err:
            raise StartupError(str(err)) from None
        store, state = self._load_state()
        runtime = NriRuntime()
        engine = self._make_engine(store, state, runtime)
        runtime.on_failure = engine.wake
        engine.write_behind = True  # the runtime waits for every answer; Synchronize heals a lost write
        self.hooks = self._make_hooks()
        plugin = NriPlugin(engine, runtime, self.hooks)
        control = self._make_control(engine, None)
        view = await self._serve_view(engine, control)
        config_server = await self._serve_config(control)
        if self.opts.pid_file:
            Path(self.opts.pid_file).write_text(f"{os.getpid()}\n")
        log.info("NRI plugin %s-%s for the runtime on %s, policy %s", endpoint.index, endpoint.name,
                 "an inherited socket" if endpoint.inherited_fd is not None else endpoint.socket_path,
                 engine.policy.name)
        loops = self._start_loops(engine, runtime.run_sender())
        serving = asyncio.create_task(connect.serve(plugin, endpoint))
        stopping = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait([serving, stopping], return_when=asyncio.FIRST_COMPLETED)
            for task in [*loops, serving, stopping]:
                task.cancel()
            await asyncio.gather(*loops, serving, return_exceptions=True)
            await self._shut_down(engine, None, config_server, view)
        finally:
            if self.opts.pid_file:
                Path(self.opts.pid_file).unlink(missing_ok=True)
            if self.hooks is not None:
                await self.hooks.close()
        return serving.result() if serving.done() and not serving.cancelled() else 0

    def _load_state(self) -> tuple[StateStore, dict | None]:
        store = StateStore(self.opts.relay_dir)
        store.prepare()
        try:
            store.claim()
        except StateInUse as err:
            raise StartupError(str(err)) from None
        state = store.load(statefile.check)
        self._keep_persisted_policy(state, store)
        return store, state

    def _open_channels(self) -> None:
        self.runtime_ch = grpc.aio.insecure_channel(_target(self.runtime_socket), options=CHANNEL_OPTIONS)
        self.image_ch = self.runtime_ch if self.image_socket == self.runtime_socket else \
            grpc.aio.insecure_channel(_target(self.image_socket), options=CHANNEL_OPTIONS)
        self.client = RuntimeClient(self.runtime_ch)
        self.dispatcher: Dispatcher | None = None

    def _make_engine(self, store: StateStore, state: dict | None, runtime: Runtime) -> Engine:
        """The topology, the policy, the controllers and the engine restored from the state file."""
        try:
            try:
                self.topology = discover(self.opts.host_root)
            except TopologyError as err:
                if self.config.policy_name != "none":
                    raise
                log.warning("no topology (%s); the none policy does not need one", err)
                self.topology = None
            section = cpus.resolve(self.config.data["policy"], self.opts.cgroup_root)
            policy = policies.create(self.config.policy_name, section, self.topology)
        except (TopologyError, PolicyError, ConfigError) as err:
            raise StartupError(f"{self.config.policy_name} policy ({self.config.source}): {err}") from None
        controllers = Controllers([BlockIOController(self.opts.cgroup_root),
                                   RDTController(self.opts.resctrl_root, self.opts.cgroup_root)])
        try:
            controllers.prepare(self.config.data)()
        except ControllerError as err:
            raise StartupError(f"{self.config.source}: {err}") from None
        engine = Engine(policy, store, runtime, controllers, cgroup_root=self.opts.cgroup_root,
                        gated=True)
        engine.device_hints = functools.partial(device_hints, host_root=self.opts.host_root)
        persisted = ((state or {}).get("policy") or {}).get("name")
        if self.opts.disable_policy_switch and persisted and persisted != policy.name:
            raise StartupError(f"the containers were allocated by the {persisted} policy and {self.config.source} "
                               f"asks for {policy.name}; policy switching is disabled (--disable-policy-switch; "
                               "--reset-policy drops the old allocations)")
        engine.restore(state)
        return engine

    def _make_hooks(self) -> Hooks | None:
        if self.opts.hook_dir in ("", "disabled"):
            return None
        hooks = Hooks(self.opts.hook_dir, self.opts.hook_skip_label, self.opts.hook_timeout)
        hooks.configure(self.config.data.get("hooks") or {})
        hooks.registry.scan()  # registered before the first call; then kept current by the watch
        return hooks

    def _make_control(self, engine: Engine, dispatcher: Dispatcher | None) -> ConfigManager:
        self.dispatcher = dispatcher

        dumps = DumpSink(dispatcher)
        control = ConfigManager(self.sources, self.config, engine, self.topology, dumps,
                                self.opts.disable_policy_switch, (self.opts.dump, self.opts.dump_file),
                                self.opts.cgroup_root, self.hooks)
        try:
            dumps.use(control.dumper_for(self.config))
        except Rejected as err:
            raise StartupError(str(err)) from None
        return control

    async def _serve_view(self, engine: Engine, control: ConfigManager) -> ViewServer | None:
        """The HTTP endpoint (metrics, state, picture), when an address is given."""
        if not self.opts.metrics_address:
            return None
        try:
            address = Address.parse(self.opts.metrics_address, self.opts.metrics_allow_remote)
        except ValueError as err:
            raise StartupError(f"--metrics-address {err}") from None
        metrics.enable()
        metrics.config_applied(control.config.source, control.generation)
        topo = statedoc.topology_doc(self.topology)

        def snapshot() -> dict[str, Any]:
            return statedoc.build(self.topology, engine.policy, engine.pods, engine.containers,
                                  control.describe(), topo)

        view = ViewServer(snapshot, address)
        try:
            await view.start()
        except OSError as err:
            raise StartupError(f"--metrics-address {address}: {err}") from None
        control.http_address = str(address)
        return view

    async def _first_reconcile(self, engine: Engine) -> asyncio.Task | None:
        """Check the runtime and reconcile once; if it is away or slow, go on doing so in the background."""
        try:
            await asyncio.wait_for(self._check_runtime(engine), timeout=2.0)
            return None
        except StartupError:
            raise
        except Exception as err:  # whatever the runtime holds or does, start-up goes on
            detail = err.details() if isinstance(err, grpc.aio.AioRpcError) else str(err) or "timed out"
            log.warning("runtime on %s not reachable, slow or odd (%s); serving anyway, lifecycle calls wait "
                        "until it is reconciled", self.runtime_socket, detail)
            return asyncio.create_task(self._reconcile_until_done(engine))

    async def _serve(self, dispatcher: Dispatcher) -> Callable[[float], Awaitable[None]]:
        """Start the relay front end; returns what stops it."""
        if self.opts.relay_mode == "grpc":
            server = grpc.aio.server(options=SERVER_OPTIONS)
            server.add_generic_rpc_handlers([Relay(dispatcher)])
            server.add_insecure_port("unix:" + self.relay_socket)
            await server.start()
            stop_server = server.stop
        else:
            splice = SpliceServer(dispatcher, self.runtime_socket, self.image_socket)
            await splice.start(self.relay_socket)
            stop_server = splice.stop
        sockets.match_runtime(self.relay_socket, self.runtime_socket)
        if self.opts.pid_file:
            Path(self.opts.pid_file).write_text(f"{os.getpid()}\n")
        return stop_server

    async def _serve_config(self, control: ConfigManager) -> grpc.aio.Server | None:
        """Signals (SIGHUP reloads the forced file) and the node agent's config link."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        reloads: set[asyncio.Task] = set()

        def reload() -> None:
            task = asyncio.create_task(control.reload_forced())
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        loop.add_signal_handler(signal.SIGHUP, reload)
        if self.opts.config_socket and self.opts.config_socket != "disabled":
            return await configlink.serve(control, _path(self.opts.config_socket))
        return None

    def _start_loops(self, engine: Engine, *front_end: Coroutine[Any, Any, None]) -> list[asyncio.Task]:
        """The loops every front end runs, and the front end's own."""
        loops = [asyncio.create_task(engine.run_reconciler(self.opts.reconcile_interval)),
                 *(asyncio.create_task(coro) for coro in front_end)]
        if self.opts.rebalance_interval > 0:
            loops.append(asyncio.create_task(self._rebalance(engine)))
        if self.hooks is not None:
            loops.append(asyncio.create_task(self.hooks.watch()))
        return loops

    async def _shut_down(self, engine: Engine, stop_server: Callable[[float], Awaitable[None]] | None,
                         config_server: grpc.aio.Server | None, view: ViewServer | None) -> None:
        log.info("shutting down: letting in-flight calls finish (grace %.1fs)", self.opts.shutdown_grace)
        if stop_server is not None:
            await stop_server(self.opts.shutdown_grace)
        if config_server is not None:
            await config_server.stop(1.0)
            Path(_path(self.opts.config_socket)).unlink(missing_ok=True)
        try:  # updates still being pushed: finish them (what does not finish stays pending)
            await asyncio.wait_for(engine.settle_updates(), self.opts.shutdown_grace)
        except TimeoutError:
            log.warning("shutting down with container updates still pending; they are pushed after restart")
        await engine.flush()
        if view is not None:
            await view.stop()
