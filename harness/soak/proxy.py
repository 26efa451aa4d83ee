"""A TCP relay on the host's loopback that counts the connections made through it: the soak puts
one between the guest's agent and the API server, to see how often the agent knocks while the
server is away (a storm of reconnects is what a fleet's API server cannot take)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class CountingProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.attempts: list[float] = []  # when each connection came (monotonic)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="soak-proxy", daemon=True)

    def start(self) -> CountingProxy:
        self._thread.start()
        return self

    def between(self, start: float, end: float) -> int:
        return sum(1 for t in self.attempts if start <= t < end)

    def _accept(self) -> None:
        self.listener.settimeout(0.5)
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.attempts.append(time.monotonic())
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            client.close()  # the server is away: the client sees its connection end
            return
        server.settimeout(None)

        def pipe(src: socket.socket, dst: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while chunk := src.recv(1 << 16):
                    dst.sendall(chunk)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)  # the other side sees the end too

        back = threading.Thread(target=pipe, args=(server, client), daemon=True)
        back.start()
        pipe(client, server)
        back.join(30)
        for s in (client, server):
            with contextlib.suppress(OSError):
                s.close()

    def stop(self) -> None:
        self._stop.set()
        self.listener.close()
