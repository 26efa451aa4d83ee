"""A read-only OCI distribution registry on loopback, serving images built here.

Nothing can be pulled on the test machines, but the CRI conformance suite (critest) pulls
the images it uses. A private containerd is pointed at this registry as the mirror of the
registries those images name (containerd's hosts.toml), so its own pull path runs for real
against images made from local binaries (harness.images).

It speaks the pull half of the distribution API: GET /v2/, HEAD/GET of manifests by tag or
digest and of blobs by digest.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"
_PATH = re.compile(r"^/v2/(?P<repo>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)$")


def _layer(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Base:
    """An image read from an OCI archive: its config and its layers (descriptors and bytes)."""

    config: dict[str, Any]
    layers: list[tuple[dict[str, Any], bytes]]

    @classmethod
    def from_archive(cls, path: Path) -> Base:
        with tarfile.open(path) as tar:
            def blob(digest: str) -> bytes:
                member = tar.extractfile("blobs/sha256/" + digest.split(":", 1)[1])
                assert member is not None
                return member.read()

            index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
            manifest = json.loads(blob(index["manifests"][0]["digest"]))
            config = json.loads(blob(manifest["config"]["digest"]))
            layers = [(d, blob(d["digest"])) for d in manifest["layers"]]
        return cls(config, layers)


class Registry:
    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[tuple[str, str], bytes] = {}  # (repository, tag or digest)
        self._server: ThreadingHTTPServer | None = None

    def add(self, reference: str, base: Base, files: dict[str, bytes] | None = None, **config: Any) -> str:
        """Serve base as reference (host/repository:tag) with its image config's "config" part
        updated from config (User, Cmd, Labels, ...) and files in one more layer; returns the
        manifest digest."""
        image = json.loads(json.dumps(base.config))
        image.setdefault("config", {}).update(config)
        layers = list(base.layers)
        if files:
            layer = _layer(files)
            layers.append(({"mediaType": LAYER, "digest": _digest(layer), "size": len(layer)}, layer))
            image["rootfs"]["diff_ids"] = image["rootfs"]["diff_ids"] + [_digest(layer)]
        base = Base(image, layers)
        config_bytes = json.dumps(base.config, sort_keys=True).encode()
        for desc, data in base.layers:
            self.blobs[desc["digest"]] = data
        self.blobs[_digest(config_bytes)] = config_bytes
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": _digest(config_bytes), "size": len(config_bytes)},
            "layers": [desc for desc, _ in base.layers],
        }, sort_keys=True).encode()
        digest = _digest(manifest)
        host_repo, _, tag = reference.rpartition(":")
        repo = host_repo.split("/", 1)[1]
        self.manifests[(repo, tag)] = manifest
        self.manifests[(repo, digest)] = manifest
        return digest

    def start(self) -> str:
        """Serve on 127.0.0.1 (a free port); returns the base URL."""
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
                self._answer(body=False)

            def do_GET(self) -> None:  # noqa: N802
                self._answer(body=True)

            def _answer(self, body: bool) -> None:
                path = self.path.split("?", 1)[0]
                if path in ("/v2", "/v2/"):
                    return self._send(200, b"{}", "application/json", body)
                m = _PATH.match(path)
                if m is None:
                    return self._send(404, b'{"errors":[{"code":"UNSUPPORTED"}]}', "application/json", body)
                repo, kind, ref = m["repo"], m["kind"], m["ref"]
                if kind == "manifests":
                    data, code, media = registry.manifests.get((repo, ref)), "MANIFEST_UNKNOWN", MANIFEST
                else:
                    data, code, media = registry.blobs.get(ref), "BLOB_UNKNOWN", "application/octet-stream"
                if data is None:
                    return self._send(404, json.dumps({"errors": [{"code": code}]}).encode(), "application/json",
                                      body)
                self._send(200, data, media, body, digest=_digest(data))

            def _send(self, status: int, data: bytes, media: str, body: bool, digest: str = "") -> None:
                self.send_response(status)
                self.send_header("Content-Type", media)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                if digest:
                    self.send_header("Docker-Content-Digest", digest)
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
