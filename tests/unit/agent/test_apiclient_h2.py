"""The agent's HTTP/2 client against a real HTTP/2 server (the h2 library's state machine over TLS
on loopback): flow control, GOAWAY and a silent connection found dead by PING."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest

from harness.kube import Pki
from resmgr.agent import apiclient
from resmgr.agent.apiclient import ApiError, Client, Credentials

BODY = 4 << 20


class Finishing(h2.connection.H2ConnectionStateMachine):
    """A server that sends GOAWAY and still finishes the streams up to its last one, as
    kube-apiserver does (the h2 library alone would close the connection at once)."""

    _transitions = {**h2.connection.H2ConnectionStateMachine._transitions,
                    (h2.connection.ConnectionState.SERVER_OPEN, h2.connection.ConnectionInputs.SEND_GOAWAY):
                        (None, h2.connection.ConnectionState.SERVER_OPEN)}


class Server:
    """Answers every GET with BODY bytes, as fast as the client's windows let it."""

    def __init__(self, directory: Path) -> None:
        pki = Pki(directory)
        crt, key = pki.issue("server", "localhost", hosts=("127.0.0.1",))
        self.ca = pki.ca
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(crt, key)
        self.ctx.set_alpn_protocols(["h2"])
        self.sent = 0
        self.connections = 0
        self.goaway_after_first = False
        self.refuse_after_first = False  # the first connection: GOAWAY on its first request, the others unanswered
        self.goaway_mid_response = False  # the first connection: GOAWAY before the bodies of its first two requests
        self.stall = False  # stop reading (and so answering PINGs) after the first request
        self.ended_by_client = 0  # connections the client closed
        self.abort = False  # drop each connection at its first request, unanswered (a server killed)

    async def start(self) -> Client:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0, ssl=self.ctx)
        port = self.server.sockets[0].getsockname()[1]
        return Client(Credentials(server=f"https://127.0.0.1:{port}", ca_file=str(self.ca)))

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        pending: dict[int, int] = {}
        draining = self.goaway_mid_response and self.connections == 1
        if draining:
            conn.state_machine = Finishing()
            conn.state_machine.state = h2.connection.ConnectionState.SERVER_OPEN
        refusing, answered = self.refuse_after_first and self.connections == 1, 0
        try:
            while data := await reader.read(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        if self.abort:
                            writer.transport.abort()
                            return
                        if (refusing and answered) or (draining and answered >= 2):
                            continue  # above the (coming) GOAWAY's last stream: not processed
                        conn.send_headers(event.stream_id, [(b":status", b"200")])
                        pending[event.stream_id] = BODY
                        answered += 1
                        if draining and answered == 2:
                            conn.close_connection(last_stream_id=event.stream_id)
                    elif isinstance(event, h2.events.StreamReset):
                        pending.pop(event.stream_id, None)
                for sid, rest in list(pending.items()):
                    while rest and (n := min(rest, conn.local_flow_control_window(sid),
                                             conn.max_outbound_frame_size)) > 0:
                        conn.send_data(sid, b"x" * n)
                        self.sent += n
                        rest -= n
                    pending[sid] = rest
                    if not rest:
                        conn.end_stream(sid)
                        del pending[sid]
                        if self.goaway_after_first or refusing:
                            conn.close_connection(last_stream_id=sid)
                writer.write(conn.data_to_send())
                await writer.drain()
                if self.stall and self.connections == 1 and pending:
                    await asyncio.sleep(3600)
            self.ended_by_client += 1
        except (ConnectionError, asyncio.CancelledError, h2.exceptions.ProtocolError):
            pass  # (frames the client sent before it heard the GOAWAY)
        finally:
            writer.close()

    async def stop(self) -> None:
        self.server.close()


@pytest.fixture
async def server(tmp_path):
    s = Server(tmp_path / "pki")
    yield s
    await s.stop()


async def test_a_reader_that_does_not_read_holds_the_server_to_the_receive_window(server):
    api = await server.start()
    response = await api.open("GET", "/big")
    await asyncio.sleep(0.5)  # the body unread
    assert server.sent <= apiclient.WINDOW, server.sent  # not 4 MiB queued in the agent
    assert len(await response.body()) == BODY
    assert server.sent == BODY
    await api.close()


async def test_after_goaway_the_next_request_goes_on_a_new_connection(server):
    server.goaway_after_first = True
    api = await server.start()
    for _ in range(2):
        response = await api.open("GET", "/big")
        assert len(await response.body()) == BODY
    assert server.connections == 2
    await api.close()


async def test_requests_a_goaway_left_unprocessed_are_sent_again_on_a_new_connection(server):
    """kube-apiserver's --goaway-chance (as API servers behind load balancers run) refuses the
    streams above the GOAWAY's last one: they were not processed, so they are sent again, as
    client-go does, instead of failing (1 in 10 requests under 16 at once, measured)."""
    server.refuse_after_first = True
    api = await server.start()

    async def get() -> int:
        response = await api.open("GET", "/big")
        return len(await response.body())

    assert await asyncio.gather(get(), get(), get()) == [BODY] * 3
    assert server.connections == 2
    await api.close()


async def test_the_streams_a_goaway_keeps_are_finished_on_the_going_connection(server):
    """After a GOAWAY the API server still answers the streams up to its last one: their bodies are
    read to the end (the h2 library alone refused every frame after a GOAWAY, failing them), and the
    third request goes on a new connection."""
    server.goaway_mid_response = True
    api = await server.start()
    first = await api.open("GET", "/big")
    second = await api.open("GET", "/big")
    third = await api.open("GET", "/big")
    assert [len(await r.body()) for r in (first, second, third)] == [BODY] * 3
    assert server.connections == 2
    # The going connection's last stream done, the client closes it (the server would keep it).
    async with asyncio.timeout(5):
        while server.ended_by_client < 1:
            await asyncio.sleep(0.01)
    await api.close()


async def test_a_connection_that_stops_answering_is_found_dead_by_ping(server, monkeypatch):
    monkeypatch.setattr(apiclient, "PING_IDLE", 0.3)
    monkeypatch.setattr(apiclient, "PING_TIMEOUT", 0.3)
    server.stall = True
    api = await server.start()
    response = await api.open("GET", "/big")
    with pytest.raises(ApiError):
        async with asyncio.timeout(10):
            await response.body()
    await api.close()


def _client_tls_connections() -> int:
    """Client-side TLS connection objects in memory, garbage in reference cycles included."""
    import gc
    from asyncio import sslproto

    return sum(1 for o in gc.get_objects() if isinstance(o, sslproto.SSLProtocol) and not o._server_side)


async def test_connections_that_ended_do_not_wait_for_a_collection_to_free_their_memory(server, monkeypatch):
    """Each ended TLS connection's objects (a 256 KiB buffer among them) sit in reference cycles,
    which an agent at rest, allocating little, does not collect for hours: every API server
    restart kept one. They are collected shortly after the connection ends."""
    import gc

    monkeypatch.setattr(apiclient, "COLLECT_DELAY", 0.05, raising=False)
    server.abort = True  # every request on a new connection, which the server drops
    api = await server.start()
    gc.collect()
    before = _client_tls_connections()
    gc.disable()
    try:
        for _ in range(4):
            with pytest.raises((ConnectionError, ApiError)):
                await (await api.open("GET", "/big")).body()
        await asyncio.sleep(0.5)
        assert _client_tls_connections() - before <= 1  # the last one may still be closing
    finally:
        gc.enable()
        await api.close()
