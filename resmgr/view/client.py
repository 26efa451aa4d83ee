"""Reading the daemon's HTTP endpoint (for `cri-resmgr status`), over TCP or a unix socket."""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any

from resmgr.view.address import Address


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.path)
        self.sock = sock


def get(address: str, path: str, timeout: float = 5.0) -> bytes:
    """The body of GET path; OSError when the endpoint cannot be reached or answers non-200."""
    addr = Address.parse(address, allow_remote=True)
    conn = _UnixConnection(addr.path, timeout) if addr.path else \
        http.client.HTTPConnection(addr.host or "localhost", addr.port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
    except http.client.HTTPException as err:
        raise OSError(f"{addr}{path}: {err}") from None
    finally:
        conn.close()
    if resp.status != 200:
        raise OSError(f"{addr}{path}: HTTP {resp.status} {resp.reason}")
    return body


def state(address: str, timeout: float = 5.0) -> dict[str, Any]:
    return json.loads(get(address, "/api/v1/state", timeout))
