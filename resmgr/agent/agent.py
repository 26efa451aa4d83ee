"""The node agent's core: pick this node's ConfigMap, push it to cri-resmgr, report back.

Three ConfigMaps may apply, in the config namespace: `<name>.node.<NODE_NAME>` (always
wins when it exists), `<name>.group.<GROUP>` when the Node carries the group label, and
`<name>.default`. Each is watched by name, and so is the Node (its group label may
change, which switches the group map). Changes are debounced; the winner's data is
pushed over the config link with a timeout and retried until cri-resmgr answers. The
answer is recorded on the Node (an annotation) and a rejection also as a Warning
Event, so `kubectl describe node` says what happened. Without any ConfigMap nothing
is pushed and cri-resmgr keeps what it has.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
from dataclasses import dataclass
from typing import Any

import grpc
from kubernetes import client

from resmgr.agent.kube import Backoff, Cluster, Watcher
from resmgr.generated.config import api_pb2, api_pb2_grpc

log = logging.getLogger("cri-resmgr-agent")

STATUS_ANNOTATION = "cri-resource-manager.intel.com/config-status"
REJECTED_REASON = "ConfigRejected"


@dataclass
class Settings:
    node_name: str
    namespace: str = "kube-system"
    configmap: str = "cri-resmgr-config"
    label: str = "cri-resource-manager.intel.com/group"
    relay_socket: str = "/var/run/cri-resmgr/cri-resmgr-config.sock"
    debounce: float = 0.5  # seconds to let a burst of changes settle before pushing
    resync: float = 60.0  # push the configuration in force again this often
    push_timeout: float = 5.0
    retry_first: float = 0.2
    retry_most: float = 10.0


@dataclass(frozen=True)
class Choice:
    """The ConfigMap in force for this node."""

    name: str
    resource_version: str
    data: dict[str, str]


class ConfigAgent:
    def __init__(self, settings: Settings, api: client.CoreV1Api) -> None:
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
        self.relay_reachable = True
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- watching ------------------------------------------------------------------------------
    def map_name(self, slot: str) -> str:
        base = self.settings.configmap
        if slot == "node":
            return f"{base}.node.{self.settings.node_name}"
        if slot == "group":
            return f"{base}.group.{self.group}"
        return f"{base}.default"

    def _watch(self, slot: str) -> None:
        old = self.watchers.pop(slot, None)
        if old is not None:
            old.stop()
        self.maps.pop(slot, None)
        self.reported.discard(slot)
        backoff = Backoff(self.settings.retry_first, self.settings.retry_most)
        if slot == "nodeobj":
            watcher = Watcher(self.api, "node", self.settings.node_name, "", self._reporter(slot), backoff)
        else:
            watcher = Watcher(self.api, "configmap", self.map_name(slot), self.settings.namespace,
                              self._reporter(slot), backoff)
        self.watchers[slot] = watcher
        watcher.start()

    def _reporter(self, slot: str) -> Any:
        def report(obj: dict[str, Any] | None) -> None:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._seen, slot, obj, report)
        return report

    def _seen(self, slot: str, obj: dict[str, Any] | None, report: Any) -> None:
        watcher = self.watchers.get(slot)
        if watcher is None or watcher.report is not report:
            return  # a watcher we have replaced
        if slot == "nodeobj":
            self.node = obj
            labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
            group = labels.get(self.settings.label) or None
            if group != self.group:
                log.info("node %s is in group %s", self.settings.node_name, group or "(none)")
                self.group = group
                if group is None:
                    old = self.watchers.pop("group", None)
                    if old is not None:
                        old.stop()
                    self.maps.pop("group", None)
                    self.reported.discard("group")
                else:
                    self._watch("group")
        else:
            self.maps[slot] = obj
        self.reported.add(slot)
        self._changed.set()

    def known(self) -> bool:
        """Every watch has reported at least once (so a missing map is really missing)."""
        slots = {"nodeobj", "node", "default"} | ({"group"} if self.group else set())
        return slots <= self.reported

    def choice(self) -> Choice | None:
        for slot in ("node", "group", "default"):
            if slot == "group" and not self.group:
                continue
            obj = self.maps.get(slot)
            if obj is not None:
                meta = obj.get("metadata") or {}
                return Choice(meta.get("name", self.map_name(slot)), str(meta.get("resourceVersion", "")),
                              {str(k): str(v) for k, v in (obj.get("data") or {}).items()})
        return None

    # -- pushing -------------------------------------------------------------------------------
    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._watch("nodeobj")
        self._watch("node")
        self._watch("default")
        try:
            await self._push_loop()
        finally:
            for watcher in self.watchers.values():
                watcher.stop()

    async def _push_loop(self) -> None:
        async with grpc.aio.insecure_channel("unix://" + self.settings.relay_socket) as channel:
            stub = api_pb2_grpc.ConfigStub(channel)
            while True:
                try:
                    await asyncio.wait_for(self._changed.wait(), self.settings.resync)
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
                        log.info("no ConfigMap applies to node %s; cri-resmgr keeps its configuration",
                                 self.settings.node_name)
                    continue
                if choice == self.pushed and not resync:
                    continue
                await self._push(stub, choice)

    async def _push(self, stub: api_pb2_grpc.ConfigStub, choice: Choice) -> None:
        """Push until cri-resmgr answers, or a newer change takes over."""
        backoff = Backoff(self.settings.retry_first, self.settings.retry_most)
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
                    await asyncio.wait_for(self._changed.wait(), delay)
                    return  # something changed meanwhile: the loop pushes the newer choice
                except TimeoutError:
                    continue
        self.relay_reachable = True
        if (choice, reply.error) == (self.pushed, self.push_error):
            return  # a resync with the same outcome: nothing new to report
        self.pushed = choice
        self.push_error = reply.error
        if reply.error:
            log.error("cri-resmgr rejected %s (resourceVersion %s): %s", choice.name, choice.resource_version,
                      reply.error)
        else:
            log.info("cri-resmgr applied %s (resourceVersion %s)", choice.name, choice.resource_version)
        await asyncio.to_thread(self._record, choice, reply.error)

    def _record(self, choice: Choice, error: str) -> None:
        status = {"configMap": f"{self.settings.namespace}/{choice.name}",
                  "resourceVersion": choice.resource_version, "applied": not error,
                  "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        if error:
            status["error"] = error
        try:
            self.cluster.annotate_node({STATUS_ANNOTATION: json.dumps(status, sort_keys=True)})
            if error:
                self.cluster.warn(REJECTED_REASON,
                                  f"cri-resmgr rejected ConfigMap {self.settings.namespace}/{choice.name} "
                                  f"(resourceVersion {choice.resource_version}): {error}", self.node)
        except Exception as err:  # the status is informative; the agent keeps working without it
            log.error("recording the configuration status on node %s failed: %s", self.settings.node_name, err)

    # -- health --------------------------------------------------------------------------------
    def health(self) -> str:
        """Why the agent is not healthy, or "" when it is."""
        problems = [w.error for w in self.watchers.values() if w.error]
        if not self.relay_reachable:
            problems.append("cri-resmgr is not reachable on " + self.settings.relay_socket)
        if self.push_error and self.pushed is not None:
            problems.append(f"cri-resmgr rejected {self.pushed.name}: {self.push_error}")
        return "; ".join(problems)
