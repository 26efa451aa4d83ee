"""Assemble and run the daemon: a front end (the CRI relay or NRI), the core it runs on (state,
engine, hook plugins, configuration, view), its loops under one task group, signals, shutdown."""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resmgr import metrics, policies, sockets
from resmgr.app.options import Options
from resmgr.config import Config, ConfigError, validate
from resmgr.control import cgroupcpus
from resmgr.control.manager import ConfigManager, Rejected, Sources
from resmgr.controllers import ControllerError, Controllers, follow
from resmgr.controllers.blockio import BlockIOController
from resmgr.controllers.cgroups import CpusetFiles
from resmgr.controllers.cpu import CPUController
from resmgr.controllers.irq import IRQController
from resmgr.controllers.rdt import RDTController
from resmgr.controllers.sched import SchedController
from resmgr.engine import Engine, statefile
from resmgr.engine.state import Runtime
from resmgr.engine.store import StateInUse, StateStore, StateTooNew, boot_time
from resmgr.frontends import DumpSink, FrontEnd, StartupError
from resmgr.hooks import Hooks
from resmgr.policies import PolicyError
from resmgr.readyfile import ReadyFile
from resmgr.topology.hints import hints as device_hints
from resmgr.topology.model import Topology
from resmgr.topology.sysfs import TopologyError, discover, online_cpus
from resmgr.view import nrt
from resmgr.view import state as statedoc
from resmgr.view.address import Address
from resmgr.view.feed import StateFeed

if TYPE_CHECKING:  # loaded only when asked for: each costs memory and start-up time (OpenTelemetry,
    # the front end not run, the DRA driver's protocols)
    from resmgr import telemetry
    from resmgr.control import link as configlink
    from resmgr.frontends.dra.plugin import AgentClaims, DraPlugin
    from resmgr.metrics_state import StateCollector
    from resmgr.view.server import ViewServer

log = logging.getLogger("cri-resmgr")

# How long the config link waits for the front end to take runtime calls before it is served anyway:
# loading its HTTP/2 stack (about 20 ms) then does not hold up the runtime's first synchronization.
LINK_WAIT = 1.0



@dataclass
class Core:
    """What every front end runs on: the engine (with its state), hook plugins, configuration, the view."""

    engine: Engine
    hooks: Hooks | None
    control: ConfigManager
    view: ViewServer | None
    telemetry: telemetry.Telemetry | None = None
    state_gauges: StateCollector | None = None  # refreshed for OTLP exports


class Daemon:
    def __init__(self, opts: Options, sources: Sources, config: Config) -> None:
        self.opts = opts
        self.sources = sources
        self.config = config
        self._stop = asyncio.Event()
        self.hooks: Hooks | None = None
        self.topology: Topology | None = None
        self.rebooted = False  # the node booted since the state file was written
        self.dra: DraPlugin | None = None
        self.link: configlink.Link | None = None  # the config link, once served
        self.agent_claims: AgentClaims | None = None  # the DRA driver's channel to the agent
        # CPU classes and interrupts: what the policy wants of the node (made with the engine)
        self.cpu_classes = CPUController()
        self.interrupts = IRQController()

    def front_end(self) -> FrontEnd:
        o = self.opts
        if o.nri:
            from resmgr.frontends.nri.frontend import NriFrontEnd
            return NriFrontEnd(sockets.path_of(o.nri_socket), o.nri_name, o.nri_index)
        from resmgr.frontends.relay.frontend import RelayFrontEnd
        return RelayFrontEnd(o.relay_socket, o.runtime_socket, o.image_socket, o.relay_mode,
                             o.allow_untested_runtimes, o.runtime_events)

    async def run(self) -> int:
        """Prepare the front end, build the core on it, run until stopped, shut down."""
        front = self.front_end()
        front.prepare()
        try:
            core = await self.build_core(front)
            await front.start()
            self.dra = await self._start_dra(core.engine)
            self._handle_signals(core.control)
            if self._links() and not front.serving():  # it takes calls already (the relay): the link too
                await self._serve_link(core, front)
            if self.opts.pid_file:
                Path(self.opts.pid_file).write_text(f"{os.getpid()}\n")
            log.info("%s, policy %s", front.describe(), core.engine.policy.name)
            code = await self._run_loops(core, front)
            await self._stop_dra()  # kubelet calls no more: nothing is prepared while shutting down
            await self._shut_down(core, front)
        finally:
            await self._stop_dra()
            if self.opts.pid_file:
                Path(self.opts.pid_file).unlink(missing_ok=True)
            await front.close()
            if self.hooks is not None:
                await self.hooks.close()
        return code

    async def build_core(self, front: FrontEnd) -> Core:
        """The state claimed and loaded, the engine on the front end's runtime, hook plugins, the
        configuration in force and the view."""
        store, state = self._load_state()
        engine = self._make_engine(store, state, front.runtime(), front.write_behind)
        self.hooks = self._make_hooks()
        control = self._make_control(engine, front.bind(engine, self.hooks))
        view = await self._serve_view(engine, control)
        core = Core(engine, self.hooks, control, view)
        self._start_telemetry(core)
        return core

    def _start_telemetry(self, core: Core) -> None:
        """OpenTelemetry export, when an endpoint is given: traces, and the metrics the view serves."""
        if not self.opts.otlp_endpoint:
            return
        if self.opts.otlp_interval <= 0:
            raise StartupError(f"--otlp-interval {self.opts.otlp_interval}: must be more than 0")
        from resmgr import telemetry

        metrics.enable()
        if core.view is not None:
            core.state_gauges = core.view.collector
        else:
            from resmgr.metrics_state import StateCollector
            core.state_gauges = StateCollector(self._snapshot(core.engine, core.control))
            metrics.REGISTRY.register(core.state_gauges)
        core.state_gauges.refresh()
        try:
            core.telemetry = telemetry.start(self.opts.otlp_endpoint, self.opts.otlp_interval, metrics.REGISTRY,
                                             socket.gethostname())
        except Exception as err:  # a malformed endpoint: the exporters refuse it at once
            raise StartupError(f"--otlp-endpoint {self.opts.otlp_endpoint}: {err}") from None

    async def _refresh_gauges(self, gauges: StateCollector) -> None:
        """The exporter runs in its own thread: it reads a snapshot the event loop took."""
        while True:
            gauges.refresh()
            await asyncio.sleep(max(0.5, self.opts.otlp_interval / 2))

    async def _run_loops(self, core: Core, front: FrontEnd) -> int:
        """Every loop under one task group until a signal or the front end's main loop ends; a loop that
        fails ends the daemon."""
        engine = core.engine
        code = 0
        try:
            async with asyncio.TaskGroup() as tg:
                loops = [tg.create_task(engine.run_reconciler(self.opts.reconcile_interval)),
                         tg.create_task(engine.state.keep_written()),
                         tg.create_task(core.control.keep_written()),
                         tg.create_task(follow(engine.state.changes.after, lambda: engine.state.changes.count,
                                               lambda: engine.policy.cpu_classes(), self.cpu_classes.sync)),
                         tg.create_task(follow(engine.state.changes.after, lambda: engine.state.changes.count,
                                               lambda: engine.policy.irq_plan(), self.interrupts.sync)),
                         *(tg.create_task(loop) for loop in front.loops())]
                if self.opts.rebalance_interval > 0:
                    loops.append(tg.create_task(self._rebalance(engine)))
                if core.hooks is not None:
                    loops.append(tg.create_task(core.hooks.watch()))
                if self._links() and self.link is None:
                    loops.append(tg.create_task(self._serve_link(core, front)))
                if self.dra is not None:
                    loops.append(tg.create_task(self.dra.collect()))
                if core.state_gauges is not None:
                    loops.append(tg.create_task(self._refresh_gauges(core.state_gauges)))
                if self.opts.ready_file:
                    loops.append(tg.create_task(ReadyFile(self.opts.ready_file, "cri-resmgr").keep(front.serving)))
                main = tg.create_task(front.run())
                main.add_done_callback(lambda _: self._stop.set())
                await self._stop.wait()
                for task in [*loops, main]:
                    task.cancel()
            if main.done() and not main.cancelled():
                code = main.result()
        except* Exception as failed:
            for err in failed.exceptions:
                log.critical("%s failed: %s", type(err).__name__, err, exc_info=err)
            code = 1
        return code

    async def _rebalance(self, engine: Engine) -> None:
        while True:
            await asyncio.sleep(self.opts.rebalance_interval)
            try:
                moved = await engine.state.rebalance()
            except Exception:  # a failed round must not stop the next one
                log.exception("rebalancing failed")
                continue
            if moved:
                log.info("rebalanced: %d container(s) moved", moved)

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

    def _load_state(self) -> tuple[StateStore, dict | None]:
        store = StateStore(self.opts.state_dir)
        store.prepare()
        try:
            store.claim()
        except StateInUse as err:
            raise StartupError(str(err)) from None
        try:
            state = store.load(statefile.check)
        except StateTooNew as err:
            raise StartupError(str(err)) from None
        self.rebooted = state is not None and store.written_before(boot_time())
        if self.rebooted:
            log.info("the node booted since the state was written: the exclusive CPUs of the containers found "
                     "ended are kept for them until kubelet makes them again")
        self._keep_persisted_policy(state, store)
        return store, state

    def _make_engine(self, store: StateStore, state: dict | None, runtime: Runtime, write_behind: bool) -> Engine:
        """The topology, the policy, the controllers and the engine restored from the state file."""
        try:
            try:
                self.topology = discover(self.opts.host_root)
            except TopologyError as err:
                if self.config.policy_name != "none":
                    raise
                log.warning("no topology (%s); the none policy does not need one", err)
                self.topology = None
            section = cgroupcpus.resolve(self.config.data["policy"], self.opts.cgroup_root)
            policy = policies.create(self.config.policy_name, section, self.topology)
        except (TopologyError, PolicyError, ConfigError) as err:
            raise StartupError(f"{self.config.policy_name} policy ({self.config.source}): {err}") from None
        sched = SchedController(self.opts.cgroup_root)
        self.cpu_classes = CPUController(self.opts.host_root, self.opts.state_dir)
        self.interrupts = IRQController(self.opts.host_root, self.opts.state_dir)
        controllers = Controllers([BlockIOController(self.opts.cgroup_root),
                                   RDTController(self.opts.resctrl_root, self.opts.cgroup_root), sched,
                                   self.cpu_classes])
        try:
            controllers.prepare(self.config.data)()
        except ControllerError as err:
            raise StartupError(f"{self.config.source}: {err}") from None
        engine = Engine(policy, store, runtime, controllers, cpusets=CpusetFiles(self.opts.cgroup_root), gated=True,
                        device_hints=functools.partial(device_hints, host_root=self.opts.host_root),
                        write_behind=write_behind)
        sched.lookup = engine.state.scheduling_class
        persisted = ((state or {}).get("policy") or {}).get("name")
        if self.opts.disable_policy_switch and persisted and persisted != policy.name:
            raise StartupError(f"the containers were allocated by the {persisted} policy and {self.config.source} "
                               f"asks for {policy.name}; policy switching is disabled (--disable-policy-switch; "
                               "--reset-policy drops the old allocations)")
        engine.state.restore(state, self.rebooted)
        if self.opts.dra_driver:  # before the first reconciliation adopts the claims' containers
            from resmgr.frontends.dra.plugin import claims_on_disk
            engine.claiming.recover(claims_on_disk(self.opts.cdi_dir))
        return engine

    def _make_hooks(self) -> Hooks | None:
        if self.opts.hook_dir in ("", "disabled"):
            return None
        hooks = Hooks(self.opts.hook_dir, self.opts.hook_skip_label, self.opts.hook_timeout)
        hooks.configure(self.config.data.get("hooks") or {})
        hooks.registry.scan()  # registered before the first call; then kept current by the watch
        return hooks

    async def _stop_dra(self) -> None:
        if self.dra is not None:
            dra, self.dra = self.dra, None
            await dra.stop()
        if self.agent_claims is not None:
            claims, self.agent_claims = self.agent_claims, None
            await claims.close()

    async def _start_dra(self, engine: Engine) -> DraPlugin | None:
        """kubelet's DRA driver, when a driver name is given."""
        o = self.opts
        if not o.dra_driver:
            return None
        from resmgr.frontends.dra.plugin import AgentClaims, DraPlugin
        try:
            self.agent_claims = AgentClaims(sockets.path_of(o.agent_socket))
            dra = DraPlugin(o.dra_driver, o.kubelet_dir, o.cdi_dir, engine, self.agent_claims,
                            online=lambda: online_cpus(o.host_root))
            await dra.start()
        except (ValueError, OSError, sockets.SocketInUse) as err:
            raise StartupError(f"--dra-driver {o.dra_driver}: {err}") from None
        return dra

    def _make_control(self, engine: Engine, dumps: DumpSink | None) -> ConfigManager:
        control = ConfigManager(self.sources, self.config, engine, self.topology, dumps,
                                self.opts.disable_policy_switch, (self.opts.dump, self.opts.dump_file),
                                self.opts.cgroup_root, self.hooks)
        try:
            control.dumps.use(control.dumper_for(self.config))
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
        from resmgr.view.server import ViewServer

        metrics.enable()
        metrics.config_applied(control.config.source, control.generation)
        view = ViewServer(self._snapshot(engine, control), address)
        try:
            await view.start()
        except OSError as err:
            raise StartupError(f"--metrics-address {address}: {err}") from None
        control.http_address = str(address)
        return view

    def _snapshot(self, engine: Engine, control: ConfigManager) -> Callable[[], dict[str, Any]]:
        """The state document (resmgr/view/state.py) of this moment, as a function."""
        topo = statedoc.topology_doc(self.topology)

        def snapshot() -> dict[str, Any]:
            return statedoc.build(self.topology, engine.policy, engine.state.pods, engine.state.containers,
                                  control.describe(), topo, engine.policy.prepared_claims())
        return snapshot

    def _handle_signals(self, control: ConfigManager) -> None:
        """SIGTERM and SIGINT stop the daemon; SIGHUP reloads the forced configuration file."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        reloads: set[asyncio.Task] = set()

        def reload() -> None:
            task = asyncio.create_task(control.reload_forced())
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        loop.add_signal_handler(signal.SIGHUP, reload)

    def _links(self) -> bool:
        return bool(self.opts.config_socket) and self.opts.config_socket != "disabled"

    async def _serve_link(self, core: Core, front: FrontEnd) -> None:
        """The node agent's config link, served once the front end takes runtime calls (the NRI plugin:
        once the runtime synchronized it), or after LINK_WAIT, so a runtime that is away does not
        keep the agent out."""
        loop = asyncio.get_running_loop()
        until = loop.time() + LINK_WAIT
        while front.serving() and loop.time() < until:
            await asyncio.sleep(0.01)
        # Loaded only now, and in a thread: its HTTP/2 stack takes about 20 ms (seconds on a slow node),
        # which on the event loop would hold the runtime's dial, or its first Synchronize, back.
        links = await asyncio.to_thread(importlib.import_module, "resmgr.control.link")

        feed = devices = None
        engine = core.engine
        if self.topology is not None:
            snapshot = self._snapshot(engine, core.control)
            feed = StateFeed(lambda: nrt.build(snapshot()), engine.state.changes)
        if self.opts.dra_driver:
            devices = links.Devices(self.opts.dra_driver,
                                    StateFeed(lambda: engine.policy.devices(), engine.state.changes))
        self.link = await links.serve(core.control, sockets.path_of(self.opts.config_socket), feed,
                                      self.opts.config_socket_group, devices, front.serving)

    async def _shut_down(self, core: Core, front: FrontEnd) -> None:
        """The one way down: no new calls, in-flight ones finish, updates pushed, the state written."""
        log.info("shutting down: letting in-flight calls finish (grace %.1fs)", self.opts.shutdown_grace)
        await front.stop(self.opts.shutdown_grace)
        if self.link is not None:
            await self.link.stop(1.0)
            Path(sockets.path_of(self.opts.config_socket)).unlink(missing_ok=True)
        try:  # updates still being pushed: finish them (what does not finish stays pending)
            async with asyncio.timeout(self.opts.shutdown_grace):
                await core.engine.state.settle_updates()
        except TimeoutError:
            log.warning("shutting down with container updates still pending; they are pushed after restart")
        await core.engine.state.flush()
        if core.view is not None:
            await core.view.stop()
        if core.telemetry is not None:
            await asyncio.to_thread(core.telemetry.shutdown)
