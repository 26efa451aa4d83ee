"""`cri-resmgr-agent tally`: each ResourceManagerConfig's counts, from the nodes' own reports.

Every node writes only its own ResourceManagerNodeStatus. One tally per cluster (a
Deployment of one replica) follows those and the configurations, and writes into each
configuration's status how many nodes run its current generation, how many rejected it,
how many have not judged it yet, and the first nodes that rejected it with their errors.
The counts are written once the nodes' reports have been quiet for a second (or at the
latest one interval after the first unwritten report), and only when they changed, so a
change rolled out to a thousand nodes costs one or two writes to the configuration (each
of which every agent watching it receives), not one per node. A configuration's first
rejection at a generation also becomes one Warning Event on it.

The writes are functions of what the API server holds, without preconditions: two
tallies running for a moment during a rollout write the same counts.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from resmgr.agent import resources
from resmgr.agent.apiclient import ApiError, Client
from resmgr.agent.kube import Backoff, Watcher, collection, config_ref, event
from resmgr.readyfile import ReadyFile

log = logging.getLogger("cri-resmgr-agent.tally")

SETTLE = 1.0  # seconds without a new report before the counts are written


def kept(obj: dict[str, Any]) -> dict[str, Any]:
    """What the tally needs of an object: its name, generation and status (not its spec or managed
    fields), so a fleet's statuses take little memory."""
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "uid", "generation") if k in meta},
            "status": obj.get("status") or {}}


class Mirror:
    """The objects of one collection by name, as a Watcher reports them."""

    def __init__(self, changed: asyncio.Event) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.changed = changed
        self.synced = False

    def listed(self, items: list[dict[str, Any]]) -> None:
        self.objects = {o["metadata"]["name"]: kept(o) for o in items}
        self.synced = True
        self.changed.set()

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.objects.pop(name, None)
        else:
            self.objects[name] = kept(obj)
        self.changed.set()


def counts(config: dict[str, Any], nodes: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """A configuration's status from the status of the nodes that run it: (node, status) pairs."""
    generation = int((config.get("metadata") or {}).get("generation") or 0)
    success = failure = pending = 0
    failures = []
    for node, st in sorted(nodes):
        if int(st.get("generation") or 0) != generation:
            pending += 1
        elif st.get("status") == resources.SUCCESS:
            success += 1
        else:
            failure += 1
            if len(failures) < resources.FAILURES_LISTED:
                failures.append({"node": node, "generation": generation, "status": resources.FAILURE,
                                 "error": str(st.get("error") or "")[:1024], "timestamp": st.get("timestamp", "")})
    return {"observedGeneration": generation, "success": success, "failure": failure, "pending": pending,
            "failures": failures}


class Tally:
    def __init__(self, api: Client, namespace: str, interval: float, retry_first: float = 0.2,
                 retry_max: float = 10.0, ready_file: str = "") -> None:
        self.api, self.namespace, self.interval = api, namespace, interval
        # Fresh while the tally has read both collections and its last write went through (a probe reads it).
        self.ready_file = ReadyFile(ready_file, "the tally") if ready_file else None
        self.why_not = "the configurations and the nodes' status not read yet"
        self.changed = asyncio.Event()
        self.configs, self.nodes = Mirror(self.changed), Mirror(self.changed)
        self.backoff = (retry_first, retry_max)
        self.warned: dict[str, int] = {}  # configuration -> the generation whose rejection has its Event

    def watchers(self) -> list[Watcher]:
        return [Watcher(self.api, collection("custom", self.namespace, plural), f"{kind}s in {self.namespace}",
                        mirror.listed, mirror.event, backoff=Backoff(*self.backoff))
                for kind, plural, mirror in ((resources.KIND, resources.PLURAL, self.configs),
                                             (resources.NODE_KIND, resources.NODE_PLURAL, self.nodes))]

    async def _settle(self) -> None:
        """Wait until no report came for SETTLE seconds, or for the interval at most."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.interval
        while True:
            self.changed.clear()
            quiet = min(SETTLE, deadline - loop.time())
            if quiet <= 0:
                return
            try:
                async with asyncio.timeout(quiet):
                    await self.changed.wait()
            except TimeoutError:
                return

    def wanted(self) -> dict[str, dict[str, Any]]:
        """Every configuration's status as the nodes' reports make it."""
        by_config: dict[str, list[tuple[str, dict[str, Any]]]] = {name: [] for name in self.configs.objects}
        for node, obj in self.nodes.objects.items():
            st = obj.get("status") or {}
            if st.get("kind") == resources.KIND and st.get("name") in by_config:
                by_config[st["name"]].append((node, st))
        return {name: counts(self.configs.objects[name], nodes) for name, nodes in by_config.items()}

    async def run(self) -> None:
        watchers = [w.start() for w in self.watchers()]
        ready = asyncio.create_task(self.ready_file.keep(lambda: self.why_not)) if self.ready_file else None
        try:
            backoff = Backoff(*self.backoff)
            while True:
                await self.changed.wait()
                await self._settle()
                if not (self.configs.synced and self.nodes.synced):
                    continue
                try:
                    await self.write()
                    backoff.reset()
                    self._judge("")
                except ApiError as err:
                    self._judge(f"writing the counts: {err}")
                    delay = backoff.next()
                    log.warning("writing the counts: %s; retrying in %.1fs", err, delay)
                    self.changed.set()
                    await asyncio.sleep(delay)
        finally:
            if ready is not None:
                ready.cancel()
            for w in watchers:
                w.stop()

    def _judge(self, why_not: str) -> None:
        """Readiness as it changes; the file's own loop keeps it fresh in between."""
        if why_not != self.why_not and self.ready_file is not None:
            self.ready_file.set(why_not)
        self.why_not = why_not

    async def write(self) -> None:
        for name, status in self.wanted().items():
            config = self.configs.objects.get(name)
            if config is None:
                continue
            have = config.get("status") or {}
            if {k: have.get(k) for k in status} != status or "nodes" in have:
                # A merge patch; `nodes` was the per-node map of earlier versions, dropped.
                path = f"{collection('custom', self.namespace)}/{name}/status"
                try:
                    await self.api.request("PATCH", path, body={"status": {**status, "nodes": None}},
                                           content_type="application/merge-patch+json")
                except ApiError as err:
                    if err.status != 404:  # deleted meanwhile
                        raise
                config["status"] = status  # as written, until the watch says otherwise
            await self.warn(name, config, status)

    async def warn(self, name: str, config: dict[str, Any], status: dict[str, Any]) -> None:
        generation = status["observedGeneration"]
        if not status["failures"] or self.warned.get(name) == generation:
            return
        first = status["failures"][0]
        others = status["failure"] - 1
        message = (f"cri-resmgr on node {first['node']}{f' and {others} other nodes' if others else ''} rejected "
                   f"{resources.KIND} {self.namespace}/{name} (generation {generation}): {first['error']}")
        await event(self.api, config_ref(config), self.namespace, resources.REJECTED_REASON, message, "")
        self.warned[name] = generation
