"""The node agent's core: pick this node's configuration, push it to cri-resmgr, report back.

A configuration comes as a custom resource (ResourceManagerConfig, named `node.<NODE>`,
`group.<GROUP>` or `default`) or as a ConfigMap (`<name>.node.<NODE>`, `<name>.group.<GROUP>`,
`<name>.default`), all in the config namespace. The most specific wins: node, then group
(when the Node carries the group label), then default; at the same level the resource wins
over the ConfigMap. Each candidate is watched by name, and so is the Node (its group label
may change). Changes are debounced; the winner is pushed over the config link with a
timeout and retried until cri-resmgr answers. The answer is recorded on the Node (an
annotation) and in this node's ResourceManagerNodeStatus (the tally sums those into each
resource's status); a rejected ConfigMap also as a Warning Event on the Node. Without any
configuration nothing is pushed and cri-resmgr keeps what it has.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import grpc
import yaml

from resmgr.agent import resources
from resmgr.agent.apiclient import Client
from resmgr.agent.kube import Backoff, Cluster, Watcher, one
from resmgr.agent.publish import Publisher, SliceExporter, SliceShape, TopologyExporter
from resmgr.generated.config import api_pb2, api_pb2_grpc, status_pb2, status_pb2_grpc
from resmgr.options import duration, on_off, opt, positive_duration

log = logging.getLogger("cri-resmgr-agent")

STATUS_ANNOTATION = "cri-resource-manager.intel.com/config-status"


@dataclass
class Settings:
    """What the agent does, as its command line sets it (resmgr/options.py makes the flags)."""

    node_name: str = opt("", help="this node (from NODE_NAME)")
    config_namespace: str = opt("kube-system", "--config-namespace", "--config-ns", metavar="NAMESPACE",
                                help="namespace of the ConfigMaps and ResourceManagerConfigs (default: %(default)s)")
    configmap_name: str = opt("cri-resmgr-config", "--configmap-name", metavar="NAME",
                              help="ConfigMap name prefix: NAME.node.<node>, NAME.group.<group>, NAME.default "
                                   "(default: %(default)s)")
    group_label: str = opt("cri-resource-manager.intel.com/group", "--group-label", "--label-name", metavar="KEY",
                           help="Node label that names the node's group (default: %(default)s)")
    custom_resources: bool = opt(True, "--custom-resources", type=on_off, metavar="on|off",
                                 help="also read ResourceManagerConfig resources named node.<node>, group.<group> "
                                      "and default in the config namespace (default: on; without their CRD none "
                                      "exist)")
    export_topology: bool = opt(False, "--export-topology", type=on_off, metavar="on|off",
                                help="publish this node's NodeResourceTopology (topology.node.k8s.io/v1alpha2) as "
                                     "cri-resmgr reports it (default: off)")
    topology_interval: float = opt(2.0, "--topology-interval", type=positive_duration, metavar="DURATION",
                                   help="shortest time between two NodeResourceTopology updates "
                                        "(default: %(default)ss)")
    export_devices: bool = opt(False, "--export-devices", type=on_off, metavar="on|off",
                               help="publish this node's ResourceSlice (resource.k8s.io/v1): the DRA devices "
                                    "cri-resmgr offers as a DRA driver (--dra-driver), at most once per "
                                    "--topology-interval (default: off)")
    dra_node_allocatable: bool = opt(False, "--dra-node-allocatable", type=on_off, metavar="on|off",
                                     help="map the CPUs claimed of each published device to the node's allocatable "
                                          "cpu (nodeAllocatableResources, KEP-5517), so kubelet and the scheduler "
                                          "count them; for clusters with the alpha DRANodeAllocatableResources "
                                          "gate, where a claim cannot be shared by pods (default: off)")
    dra_numa_list: bool = opt(False, "--dra-numa-list", type=on_off, metavar="on|off",
                              help="publish resource.kubernetes.io/numaNode as an integer list, for clusters "
                                   "with the DRAListTypeAttributes gate (default: off, a scalar)")
    config_socket: str = opt("/var/run/cri-resmgr/cri-resmgr-config.sock", "--config-socket",
                             "--cri-resmgr-socket", metavar="PATH",
                             help="cri-resmgr's configuration socket, where configurations are pushed "
                                  "(default: %(default)s)")
    debounce: float = opt(0.5, "--debounce", type=duration, metavar="DURATION",
                          help="let a burst of changes settle this long before pushing (default: %(default)ss)")
    resync_interval: float = opt(60.0, "--resync-interval", type=positive_duration, metavar="DURATION",
                                 help="push the configuration in force again this often, in case cri-resmgr "
                                      "restarted without it (default: %(default)ss)")
    status_interval: float = opt(10.0, "--status-interval", type=positive_duration, metavar="DURATION",
                                 help="ask cri-resmgr this often whether it reports a problem (its state cannot be "
                                      "written, say), which the agent's probe and the node's status then show "
                                      "(default: %(default)ss)")
    push_timeout: float = opt(5.0, "--push-timeout", type=positive_duration, metavar="DURATION",
                              help="how long one push may take (default: %(default)ss)")
    retry_first: float = opt(0.2, help="first wait before retrying a failed watch or push")
    retry_max: float = opt(10.0, "--retry-max", type=positive_duration, metavar="DURATION",
                           help="longest wait between retries of a failed watch or push (default: %(default)ss)")


@dataclass(frozen=True)
class Choice:
    """The configuration in force for this node. Two choices are the same when they are the same
    version of the same object: a resource's generation (its status writes leave it alone), a
    ConfigMap's resourceVersion."""

    kind: str  # "ConfigMap" or resources.KIND
    name: str
    version: str
    data: dict[str, str]
    resource_version: str = field(default="", compare=False)
    obj: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    @property
    def custom(self) -> bool:
        return self.kind == resources.KIND

    def describe(self, namespace: str) -> str:
        return f"{self.kind} {namespace}/{self.name} ({'generation' if self.custom else 'resourceVersion'} " \
               f"{self.version})"


def spec_data(spec: dict[str, Any]) -> dict[str, str]:
    """A resource's spec in the config link's form: one YAML text per section."""
    return {str(section): yaml.safe_dump(value, sort_keys=False) for section, value in (spec or {}).items()}


def error_path(error: str, node_name: str, custom: bool) -> str:
    """cri-resmgr names what it rejected in the pushed data (`policy.static.X: ...`); in a resource
    that is under `spec`."""
    prefix = f"ConfigMap data for node {node_name}: "
    if not error.startswith(prefix):
        return error
    rest = error[len(prefix):]
    return f"spec.{rest}" if custom else rest


class NodeAgent:
    """The agent of one node: its configuration chosen and pushed to cri-resmgr and the outcome
    recorded, what cri-resmgr reports published (NodeResourceTopology, ResourceSlice), and the
    Agent service cri-resmgr asks for cluster objects (claims among them)."""

    def __init__(self, settings: Settings, api: Client) -> None:
        self.settings = settings
        self.api = api
        self.cluster = Cluster(api, settings.node_name)
        self.node: dict[str, Any] | None = None
        self.group: str | None = None
        self.maps: dict[str, dict[str, Any] | None] = {}  # ConfigMaps by slot: node, group, default
        self.reported: set[str] = set()  # slots whose watch has reported at least once
        self.watchers: dict[str, Watcher] = {}
        self.pushed: Choice | None = None  # what cri-resmgr last answered about
        self.push_error = ""  # its rejection, or why it could not be reached
        self.unrecorded = False  # the outcome of the last push is not all written yet
        self.record_error = ""  # why, when it is not
        self.relay_reachable: bool | None = None  # None: not tried yet
        self.problems: list[str] = []  # what cri-resmgr last reported wrong beyond its configuration
        self._recording = asyncio.Lock()
        self._changed = asyncio.Event()
        common = (self.cluster, settings.config_socket, settings.topology_interval, lambda: self.node, self._backoff)
        self.publishers: list[Publisher] = []
        if settings.export_topology:
            self.publishers.append(TopologyExporter(*common))
        if settings.export_devices:
            self.publishers.append(SliceExporter(*common, shape=SliceShape(
                node_allocatable=settings.dra_node_allocatable, numa_list=settings.dra_numa_list)))

    # -- watching ------------------------------------------------------------------------------
    def map_name(self, slot: str) -> str:
        """The object a slot watches: "node", "group", "default" (ConfigMaps), "cr:" and a level
        (resources)."""
        level = slot.removeprefix("cr:")
        name = {"node": f"node.{self.settings.node_name}", "group": f"group.{self.group}", "default": "default"}[level]
        return name if slot.startswith("cr:") else f"{self.settings.configmap_name}.{name}"

    def _levels(self) -> list[str]:
        return ["node", "group", "default"] if self.group else ["node", "default"]

    def _slots(self, level: str) -> list[str]:
        return [f"cr:{level}", level] if self.settings.custom_resources else [level]

    def _watch(self, slot: str) -> None:
        old = self.watchers.pop(slot, None)
        if old is not None:
            old.stop()
        self.maps.pop(slot, None)
        self.reported.discard(slot)
        backoff = self._backoff()
        if slot == "nodeobj":
            watcher = one(self.api, "node", self.settings.node_name, "", self._reporter(slot), backoff)
        else:
            watcher = one(self.api, "custom" if slot.startswith("cr:") else "configmap", self.map_name(slot),
                          self.settings.config_namespace, self._reporter(slot), backoff)
        self.watchers[slot] = watcher
        watcher.start()

    def _backoff(self) -> Backoff:
        return Backoff(self.settings.retry_first, self.settings.retry_max)

    def _reporter(self, slot: str) -> Any:
        return lambda obj: self._seen(slot, obj)

    def _seen(self, slot: str, obj: dict[str, Any] | None) -> None:
        # A stopped watcher's task is cancelled at its next wait, before it could report again.
        if slot not in self.watchers:
            return
        if slot == "nodeobj":
            self.node = obj
            labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
            group = labels.get(self.settings.group_label) or None
            if group != self.group:
                log.info("node %s is in group %s", self.settings.node_name, group or "(none)")
                self.group = group
                for gslot in self._slots("group"):
                    if group is None:
                        old = self.watchers.pop(gslot, None)
                        if old is not None:
                            old.stop()
                        self.maps.pop(gslot, None)
                        self.reported.discard(gslot)
                    else:
                        self._watch(gslot)
        else:
            self.maps[slot] = obj
        self.reported.add(slot)
        self._changed.set()

    def known(self) -> bool:
        """Every watch has reported at least once (so a missing map is really missing)."""
        slots = {"nodeobj", *(slot for level in self._levels() for slot in self._slots(level))}
        return slots <= self.reported

    def choice(self) -> Choice | None:
        for level in self._levels():
            for slot in self._slots(level):
                obj = self.maps.get(slot)
                if obj is None:
                    continue
                meta = obj.get("metadata") or {}
                name, rv = meta.get("name", self.map_name(slot)), str(meta.get("resourceVersion", ""))
                if slot.startswith("cr:"):
                    return Choice(resources.KIND, name, str(meta.get("generation", "")),
                                  spec_data(obj.get("spec") or {}), rv, obj)
                return Choice("ConfigMap", name, rv, {str(k): str(v) for k, v in (obj.get("data") or {}).items()},
                              rv, obj)
        return None

    # -- pushing -------------------------------------------------------------------------------
    async def run(self) -> None:
        self._watch("nodeobj")
        for level in ("node", "default"):
            for slot in self._slots(level):
                self._watch(slot)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._push_loop())
                tg.create_task(self._problems_loop())
                for publisher in self.publishers:
                    tg.create_task(publisher.run())
        finally:
            for watcher in self.watchers.values():
                watcher.stop()

    async def _push_loop(self) -> None:
        async with grpc.aio.insecure_channel("unix://" + self.settings.config_socket) as channel:
            stub = api_pb2_grpc.ConfigStub(channel)
            while True:
                try:
                    async with asyncio.timeout(self.settings.resync_interval):
                        await self._changed.wait()
                    await asyncio.sleep(self.settings.debounce)
                    resync = False
                except TimeoutError:
                    resync = True  # push the same again: cri-resmgr may have restarted without it
                self._changed.clear()
                if not self.known():
                    continue
                choice = self.choice()
                if choice is None:
                    if not resync:
                        log.info("no configuration applies to node %s; cri-resmgr keeps its configuration",
                                 self.settings.node_name)
                    continue
                if choice == self.pushed and not resync:
                    continue
                await self._push(stub, choice)

    async def _problems_loop(self) -> None:
        """Follow what cri-resmgr reports wrong beyond its configuration; a change is logged and
        written to the node's status (once a configuration was recorded there)."""
        async with grpc.aio.insecure_channel("unix://" + self.settings.config_socket) as channel:
            stub = status_pb2_grpc.StatusStub(channel)
            while True:
                try:
                    reply = await stub.GetStatus(status_pb2.GetStatusRequest(), timeout=self.settings.push_timeout)
                except grpc.aio.AioRpcError:
                    self.relay_reachable = False
                else:
                    self.relay_reachable = True
                    problems = list(reply.problems)
                    if problems != self.problems:
                        for problem in problems:
                            if problem not in self.problems:
                                log.error("cri-resmgr reports: %s", problem)
                        if not problems:
                            log.info("cri-resmgr reports no problem any more")
                        self.problems = problems
                        if self.pushed is not None:
                            self.unrecorded = not await self._record(None, "", event=False)
                await asyncio.sleep(self.settings.status_interval)

    async def _push(self, stub: api_pb2_grpc.ConfigStub, choice: Choice) -> None:
        """Push until cri-resmgr answers, or a newer change takes over."""
        backoff = self._backoff()
        request = api_pb2.SetConfigRequest(node_name=self.settings.node_name, config=choice.data)
        while True:
            try:
                reply = await stub.SetConfig(request, timeout=self.settings.push_timeout)
                break
            except grpc.aio.AioRpcError as err:
                self.relay_reachable = False
                delay = backoff.next()
                log.warning("pushing %s to cri-resmgr failed (%s: %s); retrying in %.1fs", choice.name,
                            err.code().name, err.details(), delay)
                try:
                    async with asyncio.timeout(delay):
                        await self._changed.wait()
                    return  # something changed meanwhile: the loop pushes the newer choice
                except TimeoutError:
                    continue
        self.relay_reachable = True
        error = error_path(reply.error, self.settings.node_name, choice.custom)
        if (choice, error) == (self.pushed, self.push_error) and not self.unrecorded:
            return  # a resync with the same outcome: nothing new to report
        if (choice, error) != (self.pushed, self.push_error):
            what = choice.describe(self.settings.config_namespace)
            if error:
                log.error("cri-resmgr rejected %s: %s", what, error)
            else:
                log.info("cri-resmgr applied %s", what)
        self.pushed = choice
        self.push_error = error
        self.unrecorded = not await self._record(choice, error)

    async def _record(self, choice: Choice | None, error: str, event: bool = True) -> bool:
        """The outcome on the Node and in this node's status object, and as an Event if a ConfigMap
        was rejected (a rejected resource's Event is the tally's, one for all nodes); False if some
        of it could not be written (the next resync tries again). choice None: the last push's, as
        it is when the writes begin (one outcome is written at a time, so the newest lands last)."""
        async with self._recording:
            if choice is None:
                if self.pushed is None:
                    return True
                choice, error = self.pushed, self.push_error
            return await self._write_outcome(choice, error, event)

    async def _write_outcome(self, choice: Choice, error: str, event: bool) -> bool:
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        where = f"{self.settings.config_namespace}/{choice.name}"
        status: dict[str, Any] = {"kind": choice.kind, "name": where, "resourceVersion": choice.resource_version,
                                  "applied": not error, "time": now}
        if choice.custom:
            status["generation"] = choice.version
        else:
            status["configMap"] = where
        if error:
            status["error"] = error
        outcome: dict[str, Any] = {"kind": choice.kind, "name": choice.name,
                                   "resourceVersion": choice.resource_version,
                                   "status": resources.FAILURE if error else resources.SUCCESS, "timestamp": now}
        if choice.custom:
            outcome["generation"] = int(choice.version or 0)
        if error:
            outcome["error"] = error[:4096]
        if self.problems:
            outcome["problems"] = [p[:1024] for p in self.problems[:8]]
        writes = [("the node's annotation",
                   self.cluster.annotate_node({STATUS_ANNOTATION: json.dumps(status, sort_keys=True)}))]
        if self.settings.custom_resources:
            writes.append((f"{resources.NODE_KIND} {self.settings.config_namespace}/{self.settings.node_name}",
                           self.cluster.put_node_status(self.settings.config_namespace, outcome, self.node)))
        if error and not choice.custom and event:
            message = (f"cri-resmgr on node {self.settings.node_name} rejected "
                       f"{choice.describe(self.settings.config_namespace)}: {error}")
            writes.append(("the Event", self.cluster.warn(resources.REJECTED_REASON, message, self.node)))
        done = await asyncio.gather(*(write for _, write in writes), return_exceptions=True)
        failed = []  # what could not be written, for the health check
        for (what, _), result in zip(writes, done, strict=True):
            if isinstance(result, BaseException):
                # The status is informative; the agent keeps working without it.
                log.error("recording the outcome of %s in %s failed: %s", choice.name, what, result)
                failed.append(f"{what}: {result}")
        self.record_error = "; ".join(failed)
        return not failed

    # -- health --------------------------------------------------------------------------------
    def health(self) -> str:
        """Why the agent is not healthy, or "" when it is."""
        problems = [w.error for w in self.watchers.values() if w.error]
        if self.relay_reachable is None:
            problems.append("cri-resmgr not reached yet on " + self.settings.config_socket)
        elif not self.relay_reachable:
            problems.append("cri-resmgr is not reachable on " + self.settings.config_socket)
        if not self.known():
            problems.append("the cluster's configuration for this node not read yet")
        elif self.pushed is None and self.choice() is not None:
            problems.append("the configuration not pushed to cri-resmgr yet")
        if self.push_error and self.pushed is not None:
            problems.append(f"cri-resmgr rejected {self.pushed.name}: {self.push_error}")
        if self.unrecorded and self.record_error:  # the cluster cannot see what this node did
            problems.append(f"the outcome for {self.pushed.name if self.pushed else 'the configuration'} is not "
                            f"recorded in the cluster ({self.record_error}); retried at the next resync")
        problems.extend(p.error for p in self.publishers if p.error)
        problems.extend(f"cri-resmgr reports: {p}" for p in self.problems)
        return "; ".join(problems)
