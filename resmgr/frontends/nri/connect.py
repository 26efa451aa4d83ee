"""Keep an NRI plugin connected to the runtime: dial, register, serve, and dial again.

A plugin the runtime started itself gets its connection as an inherited socket
(NRI_PLUGIN_SOCKET holds the descriptor number); when that connection ends the
runtime is gone or has dropped us, and it starts a new copy of the plugin when it
comes back, so this one exits. A plugin that dials the runtime's socket itself
never gives up: it dials again with backoff, and each new connection synchronizes
from scratch.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import time
from dataclasses import dataclass

from resmgr.frontends.nri.plugin import NriPlugin
from resmgr.frontends.nri.runtime import Send
from resmgr.frontends.nri.transport import Trunk
from resmgr.generated.nri import api_pb2 as nri

log = logging.getLogger("cri-resmgr.nri")

RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
REGISTER_TIMEOUT = 5.0
# The deadline containerd gets for one container's update: a busy node's shim can take over 10 s,
# and an update containerd gave up on may still land later, its record left saying otherwise.
UPDATE_DEADLINE = 30.0
BACKOFF_MIN, BACKOFF_MAX = 0.5, 30.0
NAME = re.compile(r"[a-zA-Z0-9_.+-]+")


@dataclass
class Endpoint:
    socket_path: str = "/var/run/nri/nri.sock"
    name: str = "cri-resmgr"
    index: str = "90"
    inherited_fd: int | None = None  # a connection the runtime handed us when it started us

    @classmethod
    def from_environment(cls, socket_path: str, name: str, index: str) -> Endpoint:
        """The runtime's NRI_PLUGIN_* variables, when it started us, win over the flags."""
        fd = os.environ.get("NRI_PLUGIN_SOCKET", "")
        ep = cls(socket_path, os.environ.get("NRI_PLUGIN_NAME") or name, os.environ.get("NRI_PLUGIN_IDX") or index,
                 int(fd) if fd.isdigit() else None)
        ep.check()
        return ep

    def check(self) -> None:
        if not NAME.fullmatch(self.name):
            raise ValueError(f"NRI plugin name {self.name!r} must match [a-zA-Z0-9_.+-]+")
        if not re.fullmatch(r"[0-9]{2}", self.index):
            raise ValueError(f"NRI plugin index {self.index!r} must be exactly two digits")


async def _dial(ep: Endpoint) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if ep.inherited_fd is not None:
        sock = socket.socket(fileno=ep.inherited_fd)
        ep.inherited_fd = -1  # used once
        return await asyncio.open_unix_connection(sock=sock)
    return await asyncio.open_unix_connection(ep.socket_path)


async def _register(trunk: Trunk, ep: Endpoint) -> None:
    req = nri.RegisterPluginRequest(plugin_name=ep.name, plugin_idx=ep.index)
    await trunk.call(RUNTIME_SERVICE, "RegisterPlugin", req.SerializeToString(), REGISTER_TIMEOUT)


def update_sender(trunk: Trunk) -> Send:
    """UpdateContainers over this connection, for the NriRuntime."""
    async def send(updates: list[nri.ContainerUpdate]) -> list[nri.ContainerUpdate]:
        req = nri.UpdateContainersRequest(update=updates)
        # The runtime's deadline; the answer is awaited for as long as it takes (NriRuntime._answer).
        raw = await trunk.call(RUNTIME_SERVICE, "UpdateContainers", req.SerializeToString(), UPDATE_DEADLINE,
                               until_answered=True)
        return list(nri.UpdateContainersResponse.FromString(raw).failed)
    return send


async def serve(plugin: NriPlugin, ep: Endpoint) -> int:
    """Serve the runtime until cancelled; returns 1 when a runtime-started plugin lost its connection."""
    backoff = BACKOFF_MIN
    failures = 0
    while True:
        launched = ep.inherited_fd is not None
        if ep.inherited_fd == -1:
            log.error("NRI: the runtime that started this plugin dropped its connection; exiting, it starts a "
                      "new one")
            return 1
        try:
            reader, writer = await _dial(ep)
        except OSError as err:
            failures += 1
            (log.warning if failures == 1 else log.debug)("NRI: cannot connect to %s (%s); retrying with backoff",
                                                          ep.socket_path, err)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)
            continue
        trunk = Trunk(reader, writer, plugin.handle)
        reading = asyncio.create_task(trunk.run())
        plugin.reset(update_sender(trunk), None if launched else trunk.close)
        connected = time.monotonic()
        try:
            await _register(trunk, ep)
            log.info("NRI: registered as %s-%s with the runtime on %s", ep.index, ep.name,
                     "an inherited socket" if launched else ep.socket_path)
            failures = 0
            await trunk.wait_closed()
        except Exception as err:
            log.warning("NRI: registration failed: %s", err)
        finally:
            trunk.close()
            refused = plugin.configured and not plugin.synchronized
            plugin.reset(None)
            await asyncio.gather(reading, return_exceptions=True)
        if refused and not plugin.old_runtime:
            log.warning("NRI: the runtime dropped us after configuration; asking for older runtimes' events next")
            plugin.old_runtime = True
        if plugin.resyncing:  # ended on purpose, to synchronize again: at once
            plugin.resyncing = False
            backoff = BACKOFF_MIN
            continue
        log.warning("NRI: connection to the runtime closed (%s); reconnecting", trunk.error or "closed")
        if time.monotonic() - connected > 10:
            backoff = BACKOFF_MIN
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, BACKOFF_MAX)
