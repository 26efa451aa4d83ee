"""The agent's API client against a small HTTP/1.1 server on a real socket, its kubeconfig reading,
and the tally's writes."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import tempfile
import time
from typing import Any

import pytest
import yaml

from resmgr.agent import apiclient
from resmgr.agent import resources as rs
from resmgr.agent.apiclient import ApiError, Client, Credentials
from resmgr.agent.tally import Tally


class Server:
    """Answers each request with the next of `answers` (status, headers, body), and keeps what came."""

    def __init__(self, answers: list[tuple[int, dict[str, str], dict[str, Any]]]) -> None:
        self.answers, self.seen = answers, []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        length = next((int(line.split(":")[1]) for line in head.split("\r\n")
                       if line.lower().startswith("content-length:")), 0)
        body = await reader.readexactly(length) if length else b""
        self.seen.append((head.split()[0], head.split()[1], body))
        status, headers, doc = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        data = json.dumps(doc).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(f"HTTP/1.1 {status} X\r\ncontent-length: {len(data)}\r\ncontent-type: application/json\r\n"
                     f"{extra}\r\n".encode() + data)
        await writer.drain()
        writer.close()


async def test_a_request_the_server_has_no_room_for_is_sent_again_after_the_wait_it_asks(monkeypatch):
    monkeypatch.setattr(apiclient, "BUSY_WAIT", 0.01)
    busy = (429, {"Retry-After": "0"}, {"kind": "Status", "reason": "TooManyRequests"})
    server = Server([busy, busy, (200, {}, {"ok": True})])
    api = Client(Credentials(server=await server.start(), token="t"))
    assert await api.request("PATCH", "/api/v1/nodes/n1", body={"a": 1}) == {"ok": True}
    assert [(m, p) for m, p, _ in server.seen] == [("PATCH", "/api/v1/nodes/n1")] * 3
    assert json.loads(server.seen[-1][2]) == {"a": 1}

    # Other refusals are the caller's to handle, at once.
    server.answers = [(403, {}, {"kind": "Status", "reason": "Forbidden"})]
    with pytest.raises(ApiError) as info:
        await api.request("GET", "/api/v1/nodes/n1")
    assert (info.value.status, info.value.reason, info.value.retry_after) == (403, "Forbidden", None)
    server.server.close()


async def test_a_server_that_is_not_there_is_an_api_error_of_status_0():
    api = Client(Credentials(server="http://127.0.0.1:9"))
    with pytest.raises(ApiError) as info:
        await api.request("GET", "/api/v1/nodes")
    assert info.value.status == 0


def test_kubeconfig_credentials_from_files_and_data(tmp_path):
    (tmp_path / "token").write_text("from-file\n")
    doc = {"current-context": "b",
           "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443/",
                                                  "certificate-authority-data": base64.b64encode(b"CA").decode()}}],
           "users": [{"name": "u", "user": {"tokenFile": "token"}}],
           "contexts": [{"name": "a", "context": {"cluster": "x", "user": "y"}},
                        {"name": "b", "context": {"cluster": "c", "user": "u"}}]}
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(doc))
    creds = apiclient.load_kubeconfig(str(tmp_path / "kubeconfig"))
    assert creds.server == "https://10.0.0.1:6443"
    assert creds.ca_data == b"CA" and creds.ca_file == ""  # in memory, not in a file
    assert creds.bearer() == "from-file"  # a relative token file, next to the kubeconfig
    doc["users"][0]["user"] = {"exec": {"command": "cloud-login"}}
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match="exec"):
        apiclient.load_kubeconfig(str(tmp_path / "kubeconfig"))


class Recording:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    async def request(self, method: str, path: str, query: Any = None, body: Any = None, **kw: Any) -> dict:
        self.calls.append((method, path, body))
        return {}


async def test_the_tally_writes_counts_only_when_they_change_and_warns_once_a_generation():
    api = Recording()
    tally = Tally(api, "kube-system", 1.0)  # type: ignore[arg-type]
    tally.configs.listed([{"metadata": {"name": "default", "generation": 2, "uid": "u1"},
                           "spec": {"policy": {"Active": "static"}}, "status": {"nodes": {"old": {}}}}])
    tally.nodes.listed([{"metadata": {"name": f"n{i}"}, "status": {"kind": rs.KIND, "name": "default",
                                                                    "generation": 2, "status": rs.SUCCESS}}
                        for i in range(3)])
    await tally.write()
    ((method, path, body),) = api.calls
    assert method == "PATCH"
    assert path == f"/apis/{rs.GROUP}/{rs.VERSION}/namespaces/kube-system/{rs.PLURAL}/default/status"
    # The counts, and the per-node map of earlier versions gone.
    assert body["status"] | {"failures": []} == {"observedGeneration": 2, "success": 3, "failure": 0, "pending": 0,
                                                 "failures": [], "nodes": None}
    await tally.write()
    assert len(api.calls) == 1  # nothing changed: nothing written

    tally.nodes.event("MODIFIED", {"metadata": {"name": "n1"}, "status": {
        "kind": rs.KIND, "name": "default", "generation": 2, "status": rs.FAILURE, "error": "spec.x: bad"}})
    tally.nodes.event("MODIFIED", {"metadata": {"name": "n2"}, "status": {
        "kind": rs.KIND, "name": "default", "generation": 2, "status": rs.FAILURE, "error": "spec.x: bad"}})
    await tally.write()
    await tally.write()
    patches = [c for c in api.calls if c[1].endswith("/status")]
    events = [c for c in api.calls if c[1].endswith("/events")]
    assert [p[2]["status"]["failure"] for p in patches] == [0, 2]
    assert len(events) == 1  # one Event for the generation, not one per node
    event = events[0][2]
    assert event["involvedObject"]["uid"] == "u1" and event["reason"] == "ConfigRejected"
    assert "node n1 and 1 other nodes rejected" in event["message"] and "spec.x: bad" in event["message"]


async def test_while_the_server_cannot_be_reached_its_watches_do_not_each_try_to_connect(monkeypatch):
    """Six watches retrying every 50 ms for a second would make 120 connections; one connection is
    tried now and then instead, further apart while they keep failing, and at once after a success."""
    monkeypatch.setattr(apiclient, "DIAL_FIRST", 0.2)
    tries = 0

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal tries
        tries += 1
        writer.close()  # as a server that is going away: the connection ends before any answer

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    api = Client(Credentials(server=f"https://127.0.0.1:{port}", insecure=True))

    async def watch() -> None:
        for _ in range(20):
            with pytest.raises(ApiError):
                await api.request("GET", "/api/v1/nodes")
            await asyncio.sleep(0.05)

    await asyncio.gather(*(watch() for _ in range(6)))
    assert 1 <= tries <= 4, tries
    server.close()


def test_key_material_from_a_kubeconfig_is_never_left_in_a_file(tmp_path, monkeypatch):
    from harness.kube import Pki

    pki = Pki(tmp_path / "pki")
    crt, key = pki.issue("agent", "system:node:n")
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    doc = {"current-context": "c",
           "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9",
                                                  "certificate-authority-data": base64.b64encode(
                                                      pki.ca.read_bytes()).decode()}}],
           "users": [{"name": "u", "user": {"client-certificate-data": base64.b64encode(crt.read_bytes()).decode(),
                                            "client-key-data": base64.b64encode(key.read_bytes()).decode()}}],
           "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(doc))
    creds = apiclient.load_kubeconfig(str(tmp_path / "kubeconfig"))
    assert (creds.cert_file, creds.key_file) == ("", "") and creds.key_data == key.read_bytes()
    ctx = creds.ssl_context()  # the chain is loaded, and its files are gone at once
    assert ctx.verify_mode.name == "CERT_REQUIRED"
    assert list(temp.iterdir()) == []


async def test_a_rotated_ca_or_client_certificate_is_used_by_the_next_connection(tmp_path):
    from harness.kube import Pki

    pki = Pki(tmp_path / "pki")
    crt, key = pki.issue("agent", "system:node:n")
    api = Client(Credentials(server="https://127.0.0.1:9", ca_file=str(pki.ca), cert_file=str(crt),
                             key_file=str(key)))
    first = api._ssl
    with pytest.raises(ApiError):
        await api.request("GET", "/api/v1/nodes")
    assert api._ssl is first  # nothing changed
    crt2, key2 = Pki(tmp_path / "pki2").issue("agent", "system:node:n")
    crt.write_bytes(crt2.read_bytes())
    key.write_bytes(key2.read_bytes())
    os.utime(crt, (time.time() + 5, time.time() + 5))  # a rotation within the file system's time resolution
    api._dial_again = 0.0
    with pytest.raises(ApiError):
        await api.request("GET", "/api/v1/nodes")
    assert api._ssl is not first
