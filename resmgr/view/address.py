"""Where the HTTP endpoint listens, parsed and checked without loading the server (aiohttp)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass


@dataclass(frozen=True)
class Address:
    """Where the endpoint listens: a unix socket path, or a host and TCP port."""

    path: str = ""
    host: str = ""
    port: int = 0

    @classmethod
    def parse(cls, text: str, allow_remote: bool = False) -> Address:
        """'unix:/run/x.sock', '/run/x.sock', '127.0.0.1:8891', '[::1]:8891', 'localhost:8891', or
        (allow_remote) any host, ':8891' for every interface. ValueError says what is wrong."""
        text = text.strip()
        if text.startswith("unix:") or text.startswith("/"):
            path = text[5:] if text.startswith("unix:") else text
            if not path.startswith("/"):
                raise ValueError(f"{text!r}: a unix socket path must be absolute")
            return cls(path=path)
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{text!r}: expected HOST:PORT, [IPv6]:PORT or unix:/PATH")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not allow_remote and not _loopback(host):
            raise ValueError(f"{text!r} is not a loopback address; the endpoint shows every pod and container "
                             "of the node, so serving it beyond loopback needs --metrics-allow-remote")
        return cls(host=host, port=int(port))

    def __str__(self) -> str:
        if self.path:
            return f"unix:{self.path}"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host or '*'}:{self.port}"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
