"""Following Kubernetes objects, and the few writes the agent makes.

A Watcher follows one object (a Node, a ConfigMap or a resource in one namespace, through a
`metadata.name` field selector) or, for the tally, a whole collection: list to learn the
objects and the resourceVersion, then watch from there; relist when the server says 410
Gone; watch again when the server ends a watch (after 5 to 10 minutes, spread as client-go
spreads them, so a fleet started together does not come back together); reconnect with
jittered exponential backoff when the connection drops or the server is away.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import random
from collections.abc import Callable
from typing import Any

from resmgr.agent import resources
from resmgr.agent.apiclient import ApiError, Client

log = logging.getLogger("cri-resmgr-agent.kube")

WATCH_SECONDS = 300  # the shortest watch asked for; each asks for up to twice as long
EVENT_NAMESPACE = "default"  # where Events about cluster-scoped objects live
FIELD_MANAGER = "cri-resmgr-agent"
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


class Backoff:
    """Full-jitter exponential backoff."""

    def __init__(self, first: float = 0.2, most: float = 10.0) -> None:
        self.first, self.most, self.tries = first, most, 0

    def next(self) -> float:
        delay = min(self.most, self.first * (2 ** self.tries))
        self.tries += 1
        return random.uniform(delay / 2, delay)

    def reset(self) -> None:
        self.tries = 0


def collection(kind: str, namespace: str = "", plural: str = resources.PLURAL) -> str:
    """The API path of a kind: "node", "configmap" or "custom" (one of our resources, by plural)."""
    if kind == "node":
        return "/api/v1/nodes"
    if kind == "configmap":
        return f"/api/v1/namespaces/{namespace}/configmaps"
    return f"/apis/{resources.GROUP}/{resources.VERSION}/namespaces/{namespace}/{plural}"


class Watcher:
    """Follows the objects at `path` (those named `name`, or all): `listed` gets them all after
    each list, `changed` each ADDED, MODIFIED or DELETED event after it. A custom resource
    whose CRD is missing reads as no objects, and is looked for again now and then."""

    def __init__(self, api: Client, path: str, what: str, listed: Callable[[list[dict[str, Any]]], None],
                 changed: Callable[[str, dict[str, Any]], None], name: str = "",
                 backoff: Backoff | None = None) -> None:
        self.api, self.path, self.what, self.name = api, path, what, name
        self.listed, self.changed = listed, changed
        self.backoff = backoff or Backoff()
        self.error = ""  # the last problem reaching the API server, "" while all is well
        self._task: asyncio.Task[None] | None = None

    def start(self) -> Watcher:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"watch {self.what}")
        return self

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _query(self) -> dict[str, str]:
        return {"fieldSelector": f"metadata.name={self.name}"} if self.name else {}

    async def _list(self) -> str:
        # From the API server's watch cache (resourceVersion 0), as client-go's reflectors list: a
        # fleet relisting at once does not read etcd; the watch that follows brings anything newer.
        doc = await self.api.request("GET", self.path, {**self._query(), "resourceVersion": "0"}, timeout=60)
        self.listed(doc.get("items") or [])
        return str(doc["metadata"]["resourceVersion"])

    async def _watch(self, rv: str) -> str:
        """Follow changes from rv until the server ends the watch; returns the last rv seen."""
        seconds = int(WATCH_SECONDS * random.uniform(1, 2))
        query = {**self._query(), "watch": "true", "resourceVersion": rv, "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(seconds)}
        async with asyncio.timeout(seconds + 30):  # the server's end, or a dead connection
            resp = await self.api.open("GET", self.path, query)
            try:
                if resp.status >= 400:
                    raise await resp.error()
                self.error = ""  # the server answered the watch: all is well again
                self.backoff.reset()
                async for line in resp.lines():
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    kind = event.get("type")
                    if kind == "ERROR":
                        raise ApiError(int(obj.get("code") or 500), obj.get("reason") or "", obj.get("message", ""))
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self.changed(kind, obj)
            finally:
                resp.close()
        return rv

    async def _run(self) -> None:
        rv = ""
        while True:
            listed, least = False, 0.0
            try:
                if not rv:
                    rv = await self._list()
                    listed = True
                    self.error = ""
                rv = await self._watch(rv)
                continue
            except ApiError as err:
                if err.status == 404 and "/apis/" in self.path:
                    # No CRD (yet): the same as no such object; look again later, without alarm.
                    self.listed([])
                    rv, self.error = "", ""
                    await asyncio.sleep(self.backoff.most)
                    continue
                if err.status == 410:  # our resourceVersion is too old: start over
                    log.info("%s: watch expired (410 Gone), listing again", self.what)
                    rv = ""
                    if not listed:
                        continue
                    # Gone right after a list: the server is struggling; do not hammer it.
                self.error = f"{self.what}: API server answered {err}" if err.status else f"{self.what}: {err.reason}"
                if err.retry_after is not None:  # no room for us now: wait at least as long as asked
                    least = err.retry_after * random.uniform(1, 2)
            except (TimeoutError, ValueError, KeyError) as err:  # a silent connection, a broken line
                self.error = f"{self.what}: {type(err).__name__}: {err}"
            delay = max(self.backoff.next(), least)
            log.warning("%s; retrying in %.1fs", self.error, delay)
            await asyncio.sleep(delay)


def one(api: Client, kind: str, name: str, namespace: str, report: Callable[[dict[str, Any] | None], None],
        backoff: Backoff | None = None) -> Watcher:
    """A Watcher of one named object, reporting it (or None once it is gone or missing)."""
    what = f"{resources.KIND if kind == 'custom' else kind} {namespace + '/' if namespace else ''}{name}"
    return Watcher(api, collection(kind, namespace), what, lambda items: report(items[0] if items else None),
                   lambda event, obj: report(None if event == "DELETED" else obj), name, backoff)


class Cluster:
    """The agent's writes: its Node's annotations, status capacity, JSON patches, its status
    object, its NodeResourceTopology, and Events."""

    def __init__(self, api: Client, node_name: str) -> None:
        self.api, self.node_name = api, node_name

    @property
    def _node(self) -> str:
        return f"/api/v1/nodes/{self.node_name}"

    async def get_node(self) -> dict[str, Any]:
        return await self.api.request("GET", self._node)

    async def annotate_node(self, annotations: dict[str, str | None]) -> None:
        await self.api.request("PATCH", self._node, body={"metadata": {"annotations": annotations}},
                               content_type=MERGE)

    async def patch_node(self, patches: list[dict[str, Any]]) -> None:
        await self.api.request("PATCH", self._node, body=patches, content_type="application/json-patch+json")

    async def update_capacity(self, capacities: dict[str, str]) -> None:
        await self.api.request("PATCH", self._node + "/status", body={"status": {"capacity": capacities}},
                               content_type=MERGE)

    async def warn(self, reason: str, message: str, node: dict[str, Any] | None) -> None:
        """A Warning Event about this Node, so `kubectl describe node` shows it. An Event about a
        cluster-scoped object lives in the default namespace (the API server refuses it elsewhere),
        where the kubelet's own Events about the node are too."""
        meta = (node or {}).get("metadata") or {}
        await event(self.api, {"kind": "Node", "name": self.node_name, "uid": meta.get("uid"), "apiVersion": "v1"},
                    EVENT_NAMESPACE, reason, message, self.node_name)

    async def apply(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create or update an object we own in one request (server-side apply)."""
        return await self.api.request("PATCH", path, {"fieldManager": FIELD_MANAGER, "force": "true"}, body,
                                      content_type=APPLY)

    def owner(self, node: dict[str, Any] | None) -> list[dict[str, Any]]:
        """The Node as the owner of an object, so the object goes with it."""
        uid = ((node or {}).get("metadata") or {}).get("uid")
        return [{"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": uid}] if uid else []

    async def put_node_status(self, namespace: str, status: dict[str, Any], node: dict[str, Any] | None) -> None:
        """This node's ResourceManagerNodeStatus: what it runs and whether it took it. Without its
        CRD (an apply answered 404: no such kind) there is nowhere to write it, and that is no error."""
        meta: dict[str, Any] = {"name": self.node_name, "namespace": namespace,
                                "labels": {resources.STATUS_LABEL: status["status"]}}
        if owners := self.owner(node):
            meta["ownerReferences"] = owners
        try:
            await self.apply(f"{collection('custom', namespace, resources.NODE_PLURAL)}/{self.node_name}",
                             {"apiVersion": f"{resources.GROUP}/{resources.VERSION}", "kind": resources.NODE_KIND,
                              "metadata": meta, "status": status})
        except ApiError as err:
            if err.status != 404:
                raise
            log.info("no %s kind on the API server (its CRD is not installed): this node's status is on the "
                     "Node alone", resources.NODE_KIND)

    async def put_topology(self, body: dict[str, Any]) -> None:
        """Create or replace this node's NodeResourceTopology, in one request."""
        await self.apply(f"/apis/{resources.NRT_GROUP}/{resources.NRT_VERSION}/{resources.NRT_PLURAL}/"
                         f"{self.node_name}", body)

    async def put_slice(self, body: dict[str, Any]) -> None:
        """Create or replace one of this node's ResourceSlices, in one request."""
        await self.apply(f"/apis/{resources.DRA_GROUP}/{resources.DRA_VERSION}/resourceslices/"
                         f"{body['metadata']['name']}", body)


async def get_claim(api: Client, namespace: str, name: str) -> dict[str, Any]:
    """A ResourceClaim, as the API server has it now."""
    return await api.request("GET", f"/apis/{resources.DRA_GROUP}/{resources.DRA_VERSION}/namespaces/{namespace}/"
                                    f"resourceclaims/{name}")


async def event(api: Client, ref: dict[str, Any], namespace: str, reason: str, message: str, host: str) -> None:
    """A Warning Event about the object `ref` names."""
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    body = {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{ref['name']}.cri-resmgr.", "namespace": namespace},
            "involvedObject": {k: v for k, v in ref.items() if v}, "reason": reason, "message": message[:1024],
            "type": "Warning", "count": 1, "firstTimestamp": now, "lastTimestamp": now,
            "source": {"component": "cri-resmgr-agent", **({"host": host} if host else {})}}
    await api.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)


def config_ref(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {"kind": resources.KIND, "name": meta.get("name"), "namespace": meta.get("namespace"),
            "uid": meta.get("uid"), "apiVersion": f"{resources.GROUP}/{resources.VERSION}"}
