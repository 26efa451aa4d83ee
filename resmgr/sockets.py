"""Unix sockets the daemons listen on: stale ones replaced, live ones refused, modes set."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc


class SocketInUse(Exception):
    pass


def prepare(path: str) -> None:
    """Create the socket's directory; remove a stale socket; refuse a live one."""
    p = Path(path)
    if not p.parent.exists():
        p.parent.mkdir(parents=True, mode=0o711)
    try:
        st = p.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketInUse(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError as err:
        if err.errno in (errno.ECONNREFUSED, errno.ENOENT):
            p.unlink(missing_ok=True)  # stale: nobody listens behind it
            return
        raise
    finally:
        probe.close()
    raise SocketInUse(f"{path} already exists and a live server answers on it "
                      "(another cri-resmgr running?)")


def match_runtime(path: str, runtime_socket: str) -> None:
    """Give the relay socket the owner, group and mode of the runtime socket (else 0660)."""
    try:
        st = os.stat(runtime_socket)
    except OSError:
        os.chmod(path, 0o660)
        return
    try:
        os.chown(path, st.st_uid, st.st_gid)
    except PermissionError:
        pass
    os.chmod(path, stat.S_IMODE(st.st_mode))


@contextlib.contextmanager
def private(path: str) -> Iterator[None]:
    """Around binding a root-only (0600) socket at path; its directory is created 0700 if missing."""
    Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    prepare(path)
    old = os.umask(0o177)  # the socket is born 0600: no window in which others can connect
    try:
        yield
    finally:
        os.umask(old)


async def start_private(server: grpc.aio.Server, path: str) -> None:
    """Start a gRPC server on a root-only (0600) socket."""
    with private(path):
        server.add_insecure_port("unix:" + path)
        await server.start()


def grant_group(path: str, gid: int) -> None:
    """Let members of the group connect to a private socket: the socket 0660 in that group, and its
    directory, when ours and closed to the group, opened to it for passing through (g+x) only."""
    os.chown(path, -1, gid)
    os.chmod(path, 0o660)
    directory = os.path.dirname(path)
    st = os.stat(directory)
    if st.st_uid == os.geteuid() and not st.st_mode & stat.S_IXOTH and \
            not (st.st_gid == gid and st.st_mode & stat.S_IXGRP):
        os.chown(directory, -1, gid)
        os.chmod(directory, stat.S_IMODE(st.st_mode) | stat.S_IXGRP)


def target(path: str) -> str:
    """A gRPC target for a unix socket path (or an endpoint that already is one)."""
    return path if path.startswith(("unix:", "unix-abstract:")) else "unix://" + path


def path_of(endpoint: str) -> str:
    """The socket path of an endpoint given as a path, unix:PATH or unix://PATH."""
    for prefix in ("unix://", "unix:"):
        if endpoint.startswith(prefix):
            return endpoint[len(prefix):]
    return endpoint
