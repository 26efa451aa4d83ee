"""Watching one named Kubernetes object, and the few writes the agent makes.

A Watcher follows a single object (a Node, or a ConfigMap in one namespace) through a
`metadata.name` field selector, never a cluster-wide list: list to learn the object
and the resourceVersion, then watch from there; relist when the server says 410 Gone;
reconnect with jittered exponential backoff when the connection drops or the server
is away. It runs in a thread (the kubernetes client blocks) and reports the object,
or None once it is gone, through a callback.
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import random
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.watch import Watch

from resmgr.agent import resources

log = logging.getLogger("cri-resmgr-agent.kube")

WATCH_SECONDS = 240  # the server ends each watch after this long; we watch again from where we were
EVENT_NAMESPACE = "default"  # where Events about cluster-scoped objects live
CONFLICT_TRIES = 8  # writes of a shared object tried again after a conflict


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


class Watcher:
    """Follows one object: kind is "node", "configmap", or "custom" (our configuration resource,
    whose absence of a CRD reads as "no such object", checked again now and then)."""

    def __init__(self, api: client.CoreV1Api, kind: str, name: str, namespace: str,
                 report: Callable[[dict[str, Any] | None], None], backoff: Backoff | None = None) -> None:
        if kind not in ("node", "configmap", "custom"):
            raise ValueError(kind)
        self.api, self.kind, self.name, self.namespace = api, kind, name, namespace
        self.report = report
        self.backoff = backoff or Backoff()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{kind}-{name}", daemon=True)
        self.error = ""  # the last problem reaching the API server, "" while all is well

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop reporting; the thread ends with its current request."""
        self._stop.set()

    @property
    def what(self) -> str:
        kind = resources.KIND if self.kind == "custom" else self.kind
        return f"{kind} {self.namespace + '/' if self.namespace else ''}{self.name}"

    def _lister(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        if self.kind == "node":
            return self.api.list_node, ()
        if self.kind == "configmap":
            return self.api.list_namespaced_config_map, (self.namespace,)
        custom = client.CustomObjectsApi(self.api.api_client)
        return custom.list_namespaced_custom_object, (resources.GROUP, resources.VERSION, self.namespace,
                                                      resources.PLURAL)

    def _list(self) -> tuple[dict[str, Any] | None, str]:
        func, args = self._lister()
        resp = func(*args, field_selector=f"metadata.name={self.name}", _preload_content=False,
                    _request_timeout=30)
        doc = json.loads(resp.data)
        items = doc.get("items") or []
        return (items[0] if items else None), doc["metadata"]["resourceVersion"]

    def _watch(self, rv: str) -> str:
        """Follow changes from rv until the server ends the watch; returns the last rv seen."""
        selector = f"metadata.name={self.name}"
        list_call, args = self._lister()

        @functools.wraps(list_call)  # the client reads the docstring to learn the result type
        def connect(*a: Any, **kw: Any) -> Any:
            resp = list_call(*a, **kw)
            self.error = ""  # the server answered the watch: all is well again
            self.backoff.reset()
            return resp

        w = Watch()
        for event in w.stream(connect, *args, field_selector=selector, resource_version=rv,
                              timeout_seconds=WATCH_SECONDS, _request_timeout=(10, WATCH_SECONDS + 30),
                              allow_watch_bookmarks=True):
            if self._stop.is_set():
                w.stop()
                break
            # The raw dict; the client's deserialize=False mode mishandles ERROR events (410 Gone).
            obj = event.get("raw_object") or {}
            rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
            kind = event.get("type")
            if kind in ("ADDED", "MODIFIED"):
                self.report(obj)
            elif kind == "DELETED":
                self.report(None)
        return rv

    def _run(self) -> None:
        rv = ""
        while not self._stop.is_set():
            listed = False
            try:
                if not rv:
                    obj, rv = self._list()
                    listed = True
                    self.error = ""
                    if self._stop.is_set():
                        break
                    self.report(obj)
                rv = self._watch(rv)
                self.error = ""
                continue
            except ApiException as err:
                if err.status == 404 and self.kind == "custom":
                    # No CRD (yet): the same as no such object; look again later, without alarm.
                    self.report(None)
                    rv, self.error = "", ""
                    self._stop.wait(self.backoff.most)
                    continue
                if err.status == 410:  # our resourceVersion is too old: start over
                    log.info("%s: watch expired (410 Gone), listing again", self.what)
                    rv = ""
                    if not listed:
                        continue
                    # Gone right after a list: the server is struggling; do not hammer it.
                self.error = f"{self.what}: API server answered {err.status} {err.reason}"
            except Exception as err:  # connection refused, reset, timed out, bad chunk...
                self.error = f"{self.what}: {type(err).__name__}: {err}"
            delay = self.backoff.next()
            log.warning("%s; retrying in %.1fs", self.error, delay)
            self._stop.wait(delay)


class Cluster:
    """The agent's writes: its Node's annotations, status capacity, JSON patches, and Events."""

    def __init__(self, api: client.CoreV1Api, node_name: str) -> None:
        self.api, self.node_name = api, node_name
        self.topology_version = ""  # resourceVersion of the NodeResourceTopology we last wrote

    def get_node(self) -> dict[str, Any]:
        resp = self.api.read_node(self.node_name, _preload_content=False, _request_timeout=10)
        return json.loads(resp.data)

    def annotate_node(self, annotations: dict[str, str | None]) -> None:
        self.api.patch_node(self.node_name, {"metadata": {"annotations": annotations}}, _request_timeout=10)

    def patch_node(self, patches: list[dict[str, Any]]) -> None:
        self.api.patch_node(self.node_name, patches, _request_timeout=10)

    def update_capacity(self, capacities: dict[str, str]) -> None:
        self.api.patch_node_status(self.node_name, {"status": {"capacity": capacities}}, _request_timeout=10)

    def warn(self, reason: str, message: str, node: dict[str, Any] | None) -> None:
        """A Warning Event about this Node, so `kubectl describe node` shows it. An Event about a
        cluster-scoped object lives in the default namespace (the API server refuses it elsewhere),
        where the kubelet's own Events about the node are too."""
        meta = (node or {}).get("metadata") or {}
        self.event(client.V1ObjectReference(kind="Node", name=self.node_name, uid=meta.get("uid"), api_version="v1"),
                   EVENT_NAMESPACE, reason, message)

    def warn_config(self, reason: str, message: str, obj: dict[str, Any]) -> None:
        """A Warning Event about a configuration resource, in its namespace (`kubectl describe`)."""
        meta = obj.get("metadata") or {}
        ref = client.V1ObjectReference(kind=resources.KIND, name=meta.get("name"), namespace=meta.get("namespace"),
                                       uid=meta.get("uid"), api_version=f"{resources.GROUP}/{resources.VERSION}")
        self.event(ref, meta.get("namespace") or "default", reason, message)

    def event(self, ref: client.V1ObjectReference, namespace: str, reason: str, message: str) -> None:
        now = datetime.datetime.now(datetime.UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{ref.name}.cri-resmgr.", namespace=namespace),
            involved_object=ref, reason=reason, message=message[:1024], type="Warning", count=1,
            first_timestamp=now, last_timestamp=now,
            source=client.V1EventSource(component="cri-resmgr-agent", host=self.node_name))
        self.api.create_namespaced_event(namespace, body, _request_timeout=10)

    # -- configuration resources and NodeResourceTopology ----------------------------------------
    def _custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api.api_client)

    def set_config_status(self, namespace: str, name: str, entry: dict[str, Any] | None) -> bool:
        """Write (or with None, drop) this node's entry in a configuration's status, and the
        counts the `kubectl get` columns show. Nodes write concurrently: each write names the
        resourceVersion it read and is tried again on a conflict. False: the object is gone."""
        custom = self._custom()
        for _ in range(CONFLICT_TRIES):
            try:
                obj = custom.get_namespaced_custom_object_status(resources.GROUP, resources.VERSION, namespace,
                                                                 resources.PLURAL, name, _request_timeout=10)
            except ApiException as err:
                if err.status == 404:
                    return False
                raise
            nodes = dict(((obj.get("status") or {}).get("nodes")) or {})
            if entry is None and self.node_name not in nodes:
                return True
            if entry is None:
                nodes.pop(self.node_name)
            else:
                nodes[self.node_name] = entry
            counts = {k: sum(1 for n in nodes.values() if n.get("status") == k)
                      for k in (resources.SUCCESS, resources.FAILURE)}
            patch = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                     # A merge patch merges the entry too: a field it lacks is named null to go.
                     "status": {"nodes": {self.node_name: None if entry is None else {"error": None, **entry}},
                                "success": counts[resources.SUCCESS], "failure": counts[resources.FAILURE]}}
            try:
                custom.patch_namespaced_custom_object_status(resources.GROUP, resources.VERSION, namespace,
                                                             resources.PLURAL, name, patch, _request_timeout=10)
                return True
            except ApiException as err:
                if err.status == 404:
                    return False
                if err.status != 409:
                    raise
        raise RuntimeError(f"{resources.KIND} {namespace}/{name}: status kept changing under {CONFLICT_TRIES} writes")

    def put_topology(self, body: dict[str, Any]) -> None:
        """Create or replace this node's NodeResourceTopology: one request while the object is as we
        last wrote it (its resourceVersion kept); a read first only when it is not, or unknown."""
        custom = self._custom()
        args = (resources.NRT_GROUP, resources.NRT_VERSION, resources.NRT_PLURAL)
        for _ in range(CONFLICT_TRIES):
            version = self.topology_version
            self.topology_version = ""
            if not version:
                try:
                    version = custom.get_cluster_custom_object(*args, self.node_name,
                                                               _request_timeout=10)["metadata"]["resourceVersion"]
                except ApiException as err:
                    if err.status != 404:
                        raise
                    try:
                        made = custom.create_cluster_custom_object(*args, body, _request_timeout=10)
                        self.topology_version = str(made["metadata"]["resourceVersion"])
                        return
                    except ApiException as err2:
                        if err2.status != 409:
                            raise
                        continue  # made meanwhile: replace it
            body = {**body, "metadata": {**body["metadata"], "resourceVersion": version}}
            try:
                done = custom.replace_cluster_custom_object(*args, self.node_name, body, _request_timeout=10)
                self.topology_version = str(done["metadata"]["resourceVersion"])
                return
            except ApiException as err:
                if err.status not in (404, 409):  # changed or gone meanwhile: read it again
                    raise
        raise RuntimeError(f"{resources.NRT_KIND} {self.node_name}: kept changing under {CONFLICT_TRIES} writes")
