"""A small Kubernetes API server for tests: the real REST and watch protocol over HTTP.

kmock's KubernetesEmulator (PyPI, 0.8) was evaluated first: it serves a fixed
resourceVersion, ignores fieldSelector and never answers 410 Gone, so a client's
list+watch-from-resourceVersion and relist logic cannot be exercised with it.

This server keeps Nodes, ConfigMaps and Events in memory with a global
resourceVersion counter and an event history; it serves list, get, watch (chunked
JSON lines, from a resourceVersion, filtered by `metadata.name` field selectors),
create, merge/strategic/JSON patch, and delete. `compact()` forgets history so
resuming watches get 410 Gone; `drop_watches()` cuts every open watch; `stop()` and
`start()` on the same port model a restart. Every request is recorded.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import jsonpatch

KINDS = {"nodes": "Node", "configmaps": "ConfigMap", "events": "Event"}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any = None


@dataclass
class Store:
    objects: dict[tuple[str, str, str], dict] = field(default_factory=dict)  # (resource, ns, name)
    history: list[tuple[int, str, str, dict]] = field(default_factory=list)  # (rv, resource, type, object)
    rv: int = 100
    compacted: int = 0  # watches from before this resourceVersion get 410 Gone
    cond: threading.Condition = field(default_factory=threading.Condition)

    def put(self, resource: str, obj: dict, event: str | None = None) -> dict:
        with self.cond:
            meta = obj.setdefault("metadata", {})
            key = (resource, meta.get("namespace", ""), meta["name"])
            existed = key in self.objects
            self.rv += 1
            meta["resourceVersion"] = str(self.rv)
            meta.setdefault("uid", self.objects[key]["metadata"]["uid"] if existed else str(uuid.uuid4()))
            obj.setdefault("apiVersion", "v1")
            obj.setdefault("kind", KINDS[resource])
            self.objects[key] = obj
            self.history.append((self.rv, resource, event or ("MODIFIED" if existed else "ADDED"), copy.deepcopy(obj)))
            self.cond.notify_all()
            return copy.deepcopy(obj)

    def delete(self, resource: str, namespace: str, name: str) -> dict | None:
        with self.cond:
            obj = self.objects.pop((resource, namespace, name), None)
            if obj is None:
                return None
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.history.append((self.rv, resource, "DELETED", copy.deepcopy(obj)))
            self.cond.notify_all()
            return obj


def _selector(query: dict[str, str]) -> str | None:
    """The name a `metadata.name=X` field selector asks for (None: no selector)."""
    sel = query.get("fieldSelector")
    if not sel:
        return None
    key, _, value = sel.partition("=")
    if key != "metadata.name" or "," in value:
        raise ValueError(f"unsupported field selector {sel!r}")
    return value


class KubeAPI:
    def __init__(self) -> None:
        self.store = Store()
        self.requests: list[Request] = []
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self._generation = 0  # bumped to cut open watches

    # -- test controls -----------------------------------------------------------------------
    def start(self) -> KubeAPI:
        api = self

        class Handler(_Handler):
            server_api = api

        self._server = _Server(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self.drop_watches()
            self._server.shutdown()
            self._server.server_close()
            # Watches that connected while shutting down go too: a stopped server serves nothing.
            self.drop_watches()
            self._server = None

    def drop_watches(self) -> None:
        with self.store.cond:
            self._generation += 1
            self.store.cond.notify_all()

    def compact(self) -> None:
        with self.store.cond:
            self.store.compacted = self.store.rv
            self.store.history.clear()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, path: str) -> str:
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "test",
               "clusters": [{"name": "test", "cluster": {"server": self.url}}],
               "users": [{"name": "test", "user": {"token": "test-token"}}],
               "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}]}
        with open(path, "w") as f:
            json.dump(doc, f)
        return path

    def node(self, name: str, labels: dict[str, str] | None = None) -> dict:
        return self.store.put("nodes", {"metadata": {"name": name, "labels": labels or {}, "annotations": {}},
                                        "status": {"capacity": {"cpu": "2"}}})

    def configmap(self, namespace: str, name: str, data: dict[str, str]) -> dict:
        return self.store.put("configmaps", {"metadata": {"name": name, "namespace": namespace}, "data": data})

    def get(self, resource: str, name: str, namespace: str = "") -> dict | None:
        obj = self.store.objects.get((resource, namespace, name))
        return copy.deepcopy(obj) if obj else None

    def events(self) -> list[dict]:
        return [copy.deepcopy(o) for (r, _, _), o in self.store.objects.items() if r == "events"]


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that hang up (a dropped watch, a stopped agent) are normal here


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_api: KubeAPI

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    # -- plumbing ------------------------------------------------------------------------------
    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: int, reason: str, message: str) -> None:
        self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                          "reason": reason, "code": code})

    def _route(self) -> tuple[str, str, str | None, str | None, dict[str, str]]:
        """(resource, namespace, name, subresource, query) of an /api/v1 path."""
        url = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        parts = [p for p in url.path.split("/") if p]
        if parts[:2] != ["api", "v1"]:
            raise LookupError(url.path)
        parts = parts[2:]
        namespace = ""
        if parts[:1] == ["namespaces"] and len(parts) >= 3:
            namespace, parts = parts[1], parts[2:]
        if not parts or parts[0] not in KINDS:
            raise LookupError(url.path)
        return parts[0], namespace, parts[1] if len(parts) > 1 else None, \
            parts[2] if len(parts) > 2 else None, query

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length)) if length else None

    def _handle(self, method: str) -> None:
        api = self.server_api
        try:
            resource, namespace, name, sub, query = self._route()
        except LookupError as err:
            self._status(404, "NotFound", f"no route for {err}")
            return
        body = self._body() if method in ("POST", "PATCH", "PUT") else None
        api.requests.append(Request(method, urlparse(self.path).path, query, body))
        try:
            wanted = _selector(query)
        except ValueError as err:
            self._status(400, "BadRequest", str(err))
            return
        store = api.store
        if method == "GET" and name is None:
            if query.get("watch") in ("true", "1"):
                self._watch(resource, namespace, wanted, query)
                return
            with store.cond:
                items = [copy.deepcopy(o) for (r, ns, n), o in sorted(store.objects.items())
                         if r == resource and (not namespace or ns == namespace) and wanted in (None, n)]
                rv = str(store.rv)
            self._send(200, {"kind": KINDS[resource] + "List", "apiVersion": "v1",
                             "metadata": {"resourceVersion": rv}, "items": items})
        elif method == "GET":
            obj = api.get(resource, name, namespace)
            if obj is None:
                self._status(404, "NotFound", f'{resource} "{name}" not found')
            else:
                self._send(200, obj)
        elif method == "POST":
            body.setdefault("metadata", {}).setdefault("namespace", namespace)
            if not body["metadata"].get("name"):
                body["metadata"]["name"] = body["metadata"].get("generateName", "obj-") + uuid.uuid4().hex[:5]
            self._send(201, store.put(resource, body))
        elif method == "PATCH":
            self._patch(resource, namespace, name, body)
        elif method == "DELETE":
            obj = store.delete(resource, namespace, name)
            if obj is None:
                self._status(404, "NotFound", f'{resource} "{name}" not found')
            else:
                self._send(200, obj)
        else:
            self._status(405, "MethodNotAllowed", method)

    def _patch(self, resource: str, namespace: str, name: str, body: Any) -> None:
        api = self.server_api
        with api.store.cond:
            obj = api.get(resource, name, namespace)
            if obj is None:
                self._status(404, "NotFound", f'{resource} "{name}" not found')
                return
            kind = self.headers.get("Content-Type", "")
            try:
                if "json-patch" in kind:
                    obj = jsonpatch.apply_patch(obj, body)
                else:  # merge and strategic merge: maps merge, null deletes
                    obj = _merge(obj, body)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as err:
                self._status(422, "Invalid", str(err))
                return
            out = api.store.put(resource, obj)
        self._send(200, out)

    def _watch(self, resource: str, namespace: str, wanted: str | None, query: dict[str, str]) -> None:
        api = self.server_api
        store = api.store
        since = int(query.get("resourceVersion") or 0)
        timeout = float(query.get("timeoutSeconds") or 60)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(event: dict) -> None:
            data = (json.dumps(event) + "\n").encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        try:
            with store.cond:
                generation = api._generation
                if since and since < store.compacted:
                    chunk({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                       "message": f"too old resource version: {since}",
                                                       "reason": "Expired", "code": 410}})
                    self.wfile.write(b"0\r\n\r\n")
                    return
                if not since:  # no resourceVersion: the current objects first, as ADDED
                    backlog = [{"type": "ADDED", "object": copy.deepcopy(o)} for (r, ns, n), o in
                               sorted(store.objects.items()) if r == resource
                               and (not namespace or ns == namespace) and wanted in (None, n)]
                    since = store.rv
                else:
                    backlog = []
            for event in backlog:
                chunk(event)
            sent = since
            deadline = _now() + timeout
            while True:
                with store.cond:
                    while True:
                        fresh = [(rv, t, o) for rv, r, t, o in store.history if rv > sent and r == resource]
                        if fresh or api._generation != generation or _now() >= deadline:
                            break
                        store.cond.wait(min(0.5, max(deadline - _now(), 0.01)))
                    if api._generation != generation:
                        self.close_connection = True
                        return  # dropped without the final chunk, like a broken connection
                for rv, kind, obj in fresh:
                    sent = rv
                    meta = obj["metadata"]
                    if (not namespace or meta.get("namespace", "") == namespace) and wanted in (None, meta["name"]):
                        chunk({"type": kind, "object": obj})
                if _now() >= deadline:
                    self.wfile.write(b"0\r\n\r\n")
                    return
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def do_PATCH(self) -> None:  # noqa: N802
        self._handle("PATCH")

    def do_DELETE(self) -> None:  # noqa: N802
        self._handle("DELETE")


def _merge(base: Any, patch: Any) -> Any:
    if not isinstance(patch, dict) or not isinstance(base, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


def _now() -> float:
    return time.monotonic()
