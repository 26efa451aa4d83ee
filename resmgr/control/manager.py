"""Which configuration is in force, and applying a new one atomically.

Sources, first that exists: the forced file (reloaded on SIGHUP; pushes are refused
while it is in force) > the configuration last pushed by the node agent (persisted
under the relay directory, so it is used again at the next start) > the fallback file
> built-in defaults. A new configuration is validated first, then offered to the
policy (a reconfiguration, or a switch to another policy that re-allocates every
container); if anything refuses it, nothing changes and the caller gets the reason.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from resmgr import log as logsetup
from resmgr import metrics, policies
from resmgr.config import Config, ConfigError, dumprules, from_map, load_file
from resmgr.control import cgroupcpus
from resmgr.controllers import ControllerError
from resmgr.engine import Engine
from resmgr.engine.store import StateStore, StateTooNew
from resmgr.frontends import Closable, DumpSink
from resmgr.hooks import Hooks
from resmgr.policies import PolicyError
from resmgr.topology.model import Topology

log = logging.getLogger("cri-resmgr.config")

PUSHED = "agent-config"  # file name under the relay directory


class Rejected(Exception):
    """A configuration that was not applied; the message says why."""


def _check_pushed(data: Any) -> None:
    config = data.get("config")
    if not isinstance(data.get("node_name", ""), str) or not isinstance(config, dict) or \
            not all(isinstance(k, str) and isinstance(v, str) for k, v in config.items()):
        raise ValueError("expected {node_name: text, config: {key: YAML text}}")


@dataclass
class Sources:
    forced: str | None = None
    fallback: str | None = None
    state_dir: str = "/var/lib/cri-resmgr"

    def pushed_store(self) -> StateStore:
        return StateStore(self.state_dir, PUSHED, "starting without it until the node agent pushes again")

    def load_pushed(self) -> Config | None:
        store = self.pushed_store()
        if not store.path.exists():
            return None
        try:
            data = store.load(_check_pushed)  # a broken file is moved aside and logged
        except StateTooNew as err:  # the agent pushes again; the file is left for the newer daemon
            log.error("%s; starting without it until the node agent pushes again", err)
            return None
        if data is None:
            return None
        try:
            cfg = from_map(data.get("config") or {}, f"configuration pushed for node {data.get('node_name', '?')}")
        except ConfigError as err:
            log.error("persisted agent configuration is no longer valid (%s); ignoring it", err)
            return None
        cfg.source = f"agent (node {data.get('node_name', '?')}, persisted in {store.path})"
        return cfg

    def effective(self) -> Config:
        """The configuration to start with (ConfigError for a bad file)."""
        if self.forced:
            cfg = load_file(self.forced)
            cfg.source = f"forced config file {self.forced}"
            return cfg
        pushed = self.load_pushed()
        if pushed is not None:
            return pushed
        if self.fallback:
            cfg = load_file(self.fallback)
            cfg.source = f"fallback config file {self.fallback}"
            return cfg
        return Config()

    def reset_pushed(self) -> bool:
        store = self.pushed_store()
        existed = store.path.exists()
        store.remove()
        return existed


class _NoDumps:
    """No front end that dumps: the rules are still checked, so a bad configuration is refused alike."""

    def open(self, rules: str, path: str | None) -> Closable:
        dumprules.parse_rules(rules)
        return self

    def use(self, dumper: Closable) -> None:
        pass

    def close(self) -> None:
        pass


class ConfigManager:
    """Owns the configuration in force and applies new ones."""

    def __init__(self, sources: Sources, config: Config, engine: Engine, topology: Topology | None,
                 dumps: DumpSink | None = None, disable_policy_switch: bool = False,
                 dump_override: tuple[str | None, str | None] = (None, None),
                 cgroup_root: str = "/sys/fs/cgroup", hooks: Hooks | None = None) -> None:
        self.sources = sources
        self.hooks = hooks
        self.config = config
        self.engine = engine
        self.topology = topology
        self.dumps: DumpSink = dumps or _NoDumps()
        self.disable_policy_switch = disable_policy_switch
        self.dump_override = dump_override  # --dump / --dump-file win over the config
        self.cgroup_root = cgroup_root  # where cgroup: CPU values are read
        self.last_error = ""
        self.generation = 1  # configurations put in force; 1: the start-up one
        self.http_address = ""  # where the daemon serves its state, if it does
        self._yaml: tuple[Config | None, str] = (None, "")
        self._lock = asyncio.Lock()
        # The last pushed configuration, for the next start; beside the engine's state, on the same disk.
        self._pushed = sources.pushed_store()

    def dumper_for(self, config: Config) -> Closable:
        rules, path = self.dump_override
        rules = rules if rules is not None else config.dump_rules
        path = path if path is not None else config.dump_file
        try:
            return self.dumps.open(rules, path or None)
        except (OSError, ValueError) as err:
            raise Rejected(f"dump: {err}") from None

    async def apply(self, config: Config) -> None:
        """Put config in force, or raise Rejected and leave everything as it was."""
        async with self._lock:
            await self._apply_now(config)

    def _reject(self, source: str, reason: str) -> Rejected:
        self.last_error = reason
        metrics.config_rejected(source)
        log.error("configuration from %s rejected: %s", source, reason)
        return Rejected(reason)

    async def _apply_now(self, config: Config) -> None:
        try:
            await self._apply(config)
        except Rejected as err:
            raise self._reject(config.source, str(err)) from None
        self.last_error = ""
        self.generation += 1
        metrics.config_applied(config.source, self.generation)
        log.info("configuration from %s applied (policy %s)", config.source, config.policy_name)

    async def _apply(self, config: Config) -> None:
        try:
            commit_controllers = self.engine.state.controllers.prepare(config.data)
        except ControllerError as err:
            raise Rejected(str(err)) from None
        dumper = self.dumper_for(config)
        try:
            await self._apply_policy(config)
        except BaseException:
            dumper.close()
            raise
        self.dumps.use(dumper)
        logsetup.set_debug(config.debug_sources)
        commit_controllers()
        if self.hooks is not None:
            self.hooks.configure(config.data.get("hooks") or {})
        await self.engine.state.reapply()
        self.config = config

    async def _apply_policy(self, config: Config) -> None:
        """Reconfigure the policy in place, or switch to a new instance that re-allocates everyone."""
        current, wanted, section = self.engine.policy.name, config.policy_name, config.data["policy"]
        if wanted != current and self.disable_policy_switch:
            raise Rejected(f"switching the policy from {current} to {wanted} is disabled (--disable-policy-switch)")
        try:
            if wanted == current:
                if section == self.config.data["policy"]:
                    return
                try:
                    await self.engine.state.reconfigure(cgroupcpus.resolve(section, self.cgroup_root))
                    return
                except NotImplementedError:
                    pass  # the policy cannot keep its grants: re-allocate under the new settings
            await self.engine.state.switch_policy(policies.create(wanted, cgroupcpus.resolve(section, self.cgroup_root),
                                                            self.topology))
        except (PolicyError, ConfigError) as err:
            raise Rejected(f"policy {wanted}: {err}") from None

    async def push(self, node_name: str, data: dict[str, str]) -> None:
        """A configuration pushed by the agent: validated, applied, persisted (Rejected if not)."""
        if self.sources.forced:
            raise Rejected(f"the configuration is forced by {self.sources.forced}; pushed configuration ignored")
        source = f"agent (node {node_name})"
        async with self._lock:  # attempts are judged and reported in the order they came
            try:
                config = from_map(data, f"ConfigMap data for node {node_name}")
            except ConfigError as err:
                raise self._reject(source, str(err)) from None
            config.source = source
            if (config.source, config.data) == (self.config.source, self.config.data) and not self.last_error:
                # The agent's resync: the same again, in case this daemon restarted without it.
                log.debug("configuration from %s unchanged", source)
                return
            await self._apply_now(config)
            # Not written (the disk full, say): in force anyway, reported, written once it can be.
            await self._pushed.save(lambda: {"node_name": node_name, "config": data})

    def problems(self) -> list[str]:
        """What an operator should know beyond the configuration (the engine's, and the pushed file's)."""
        pushed = [self._pushed.problem] if self._pushed.problem else []
        return [*self.engine.state.problems(), *pushed]

    async def keep_written(self) -> None:
        """Runs for the daemon's life: the pushed configuration written once a failed write can be."""
        await self._pushed.keep_written()

    async def reload_forced(self) -> None:
        """SIGHUP: read the forced file again; a bad file keeps the configuration in force."""
        if not self.sources.forced:
            log.info("SIGHUP: no forced configuration file to reload")
            return
        source = f"forced config file {self.sources.forced}"
        async with self._lock:
            try:
                config = load_file(self.sources.forced)
                config.source = source
                await self._apply_now(config)
            except ConfigError as err:
                self._reject(source, str(err))
            except Rejected:
                pass  # logged

    def describe(self) -> dict[str, Any]:
        """The configuration in force for the state document."""
        if self._yaml[0] is not self.config:  # rendered once per configuration, not per scrape
            self._yaml = (self.config, self.config.to_yaml())
        return {"source": self.config.source, "generation": self.generation, "last_error": self.last_error,
                "policy": self.engine.policy.name, "yaml": self._yaml[1], "problems": self.problems()}

    def status(self) -> dict[str, Any]:
        return {"config": self.config.to_yaml(), "source": self.config.source, "policy": self.engine.policy.name,
                "last_error": self.last_error, "pods": len(self.engine.state.pods),
                "containers": len(self.engine.state.containers), "http_address": self.http_address,
                "problems": self.problems()}

