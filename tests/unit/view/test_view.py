"""The view's pure parts: metrics and state addresses, the relay's tally of pass-through outcomes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from resmgr.view.address import Address
from tests.support.helpers import ROOT


def test_addresses_are_loopback_or_unix_unless_allowed():
    assert Address.parse("127.0.0.1:8891") == Address(host="127.0.0.1", port=8891)
    assert Address.parse("[::1]:8891") == Address(host="::1", port=8891)
    assert Address.parse("localhost:1") == Address(host="localhost", port=1)
    assert Address.parse("unix:/run/x.sock") == Address(path="/run/x.sock")
    assert Address.parse("/run/x.sock") == Address(path="/run/x.sock")
    for remote in ("0.0.0.0:8891", ":8891", "10.0.0.1:8891", "node1:8891"):
        with pytest.raises(ValueError, match="--metrics-allow-remote"):
            Address.parse(remote)
        assert Address.parse(remote, allow_remote=True).port == 8891
    for bad in ("8891", "127.0.0.1:", "127.0.0.1:99999", "unix:relative.sock", "127.0.0.1:x"):
        with pytest.raises(ValueError):
            Address.parse(bad)


def test_cli_refuses_a_remote_address_without_the_flag(tmp_path):
    out = subprocess.run([sys.executable, "-m", "resmgr", "--metrics-address", "0.0.0.0:8891",
                          "--relay-dir", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 2
    assert "not a loopback address" in out.stderr and "--metrics-allow-remote" in out.stderr


def test_pass_through_outcomes_follow_the_runtime_header_table():
    """The tally decodes every header block the runtime sends; cached blocks never go stale."""
    import hpack

    from resmgr import metrics
    from resmgr.frontends.relay import frames as h2
    from resmgr.frontends.relay.passmetrics import PassMetrics

    metrics.enable()
    enc = hpack.Encoder()
    tally = PassMetrics()
    path = "/runtime.v1.RuntimeService/ContainerStatus"
    before = {code: metrics.CRI_CALLS.labels("ContainerStatus", "passthrough", code)._value.get()
              for code in ("OK", "NOT_FOUND", "UNKNOWN")}
    # grpc-status 0 twice (literal, then indexed), 5 (literal: the table changes), 0 and 5 indexed.
    sequence = ["0", "0", "5", "0", "5", "5", "0"]
    for sid, status in zip(range(1, 30, 2), sequence, strict=False):
        tally.started(sid, path)
        tally.header_frame(h2.HEADERS, h2.END_HEADERS, sid, enc.encode([(":status", "200"),
                                                                        ("content-type", "application/grpc")]))
        block = enc.encode([("grpc-status", status), ("grpc-message", "" if status == "0" else "not found")])
        # trailers split over a HEADERS and a CONTINUATION frame
        tally.header_frame(h2.HEADERS, h2.END_STREAM, sid, block[:1])
        tally.header_frame(h2.CONTINUATION, h2.END_HEADERS, sid, block[1:])
    after = {code: metrics.CRI_CALLS.labels("ContainerStatus", "passthrough", code)._value.get() for code in before}
    assert after["OK"] - before["OK"] == 4 and after["NOT_FOUND"] - before["NOT_FOUND"] == 3
    assert after["UNKNOWN"] == before["UNKNOWN"] and not tally.calls
    # An undecodable block stops reading outcomes on that connection instead of guessing.
    tally.started(99, "/made/up")
    tally.header_frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 99, b"\xff\xff\xff\xff\xff\xff")
    assert tally.broken and metrics.CRI_CALLS.labels("unknown", "passthrough", "UNKNOWN")._value.get() >= 1


def test_the_endpoint_speaks_http_1_1_and_refuses_what_it_does_not_serve(tmp_path):
    """Keep-alive, HEAD, 404, 405, a malformed request and an oversized head, on a unix socket."""
    import asyncio

    from resmgr import metrics
    from resmgr.view.server import ViewServer

    metrics.enable()
    sock = tmp_path / "view.sock"

    async def exchange(data: bytes) -> bytes:
        reader, writer = await asyncio.open_unix_connection(str(sock))
        writer.write(data)
        await writer.drain()
        got = await asyncio.wait_for(reader.read(), 10)  # the server closes once it has answered
        writer.close()
        return got

    async def main() -> list[bytes]:
        server = ViewServer(lambda: {"pods": []}, Address(path=str(sock)))
        await server.start()
        try:
            return [
                await exchange(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                               b"GET /api/v1/state?x=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
                await exchange(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
                await exchange(b"GET /nowhere HTTP/1.0\r\n\r\n"),
                await exchange(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                               b"Connection: close\r\n\r\nhi"),
                await exchange(b"GARBAGE\r\n\r\n"),
                await exchange(b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000),  # a head with no end
            ]
        finally:
            await server.stop()

    both, head, missing, post, garbage, huge = asyncio.run(main())
    assert both.count(b"HTTP/1.1 200 OK") == 2 and b"ok\n" in both and b'{"pods": []}' in both
    assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")  # headers only
    assert b"text/plain; version=" in head
    assert missing.startswith(b"HTTP/1.1 404")
    assert post.startswith(b"HTTP/1.1 405") and b"Allow: GET, HEAD" in post
    assert garbage.startswith(b"HTTP/1.1 400")
    assert huge.startswith(b"HTTP/1.1 431")
    assert not sock.exists()


def test_a_failing_handler_is_answered_500_and_the_endpoint_goes_on(tmp_path, caplog):
    import asyncio

    from resmgr import metrics
    from resmgr.view.server import ViewServer

    metrics.enable()
    sock = tmp_path / "view.sock"

    def broken() -> dict:
        raise RuntimeError("a defect")

    async def get(path: str) -> bytes:
        reader, writer = await asyncio.open_unix_connection(str(sock))
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        got = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return got

    async def main() -> tuple[bytes, bytes]:
        server = ViewServer(broken, Address(path=str(sock)))
        await server.start()
        try:
            return await get("/api/v1/state"), await get("/healthz")
        finally:
            await server.stop()

    state, health = asyncio.run(main())
    assert state.startswith(b"HTTP/1.1 500") and health.startswith(b"HTTP/1.1 200")
    assert "serving /api/v1/state failed" in caplog.text


def test_the_endpoint_does_not_load_a_web_framework():
    out = subprocess.run([sys.executable, "-c", "import sys, resmgr.view.server; print(sorted(m for m in "
                          "sys.modules if m.split('.')[0] in ('aiohttp', 'yarl', 'multidict')))"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
