"""The NRI transport over a real socket pair: the test plays the runtime, byte by byte.

The runtime side here is written from the wire format alone (trunk frames, ttrpc
messages), not with resmgr.frontends.nri.transport, so the two cannot share a mistake.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct

import pytest

from resmgr import policies
from resmgr.controllers import ControllerError
from resmgr.engine import Engine, NotReady
from resmgr.engine.store import StateStore
from resmgr.frontends.nri.plugin import NriPlugin
from resmgr.frontends.nri.runtime import NriRuntime
from resmgr.frontends.nri.transport import Call, Trunk
from resmgr.generated.nri import api_pb2 as nri
from resmgr.generated.ttrpc import request_pb2 as ttrpc
from resmgr.policies import PolicyError
from resmgr.topology.cpuset import CPUSet

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
MIB4 = 4 << 20


def message(sid: int, kind: int, data: bytes) -> bytes:
    return struct.pack(">IIBB", len(data), sid, kind, 0) + data


def frame(conn: int, payload: bytes) -> bytes:
    return struct.pack(">II", conn, len(payload)) + payload


def request(sid: int, method: str, payload: bytes = b"", service: str = PLUGIN) -> bytes:
    return message(sid, 1, ttrpc.Request(service=service, method=method, payload=payload,
                                         timeout_nano=2_000_000_000).SerializeToString())


class Runtime:
    """The runtime's end of the socket: frames in, frames out, messages reassembled per connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.buffers: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        self.frame_sizes: list[int] = []

    async def send(self, data: bytes, pieces: list[int] | None = None) -> None:
        """Write raw bytes, cut at the given offsets with a pause between the pieces."""
        cuts = [0, *(pieces or []), len(data)]
        for a, b in zip(cuts, cuts[1:], strict=False):
            self.writer.write(data[a:b])
            await self.writer.drain()
            await asyncio.sleep(0)

    async def message(self, conn: int, timeout: float = 5.0) -> tuple[int, int, bytes]:
        """The next whole ttrpc message on conn: (stream ID, type, data)."""
        async def read() -> tuple[int, int, bytes]:
            buf = self.buffers[conn]
            while True:
                if len(buf) >= 10:
                    length, sid, kind, _ = struct.unpack(">IIBB", buf[:10])
                    if len(buf) >= 10 + length:
                        data = bytes(buf[10:10 + length])
                        del buf[:10 + length]
                        return sid, kind, data
                head = await self.reader.readexactly(8)
                cid, size = struct.unpack(">II", head)
                self.frame_sizes.append(size)
                self.buffers.setdefault(cid, bytearray()).extend(await self.reader.readexactly(size))
        return await asyncio.wait_for(read(), timeout)

    async def response(self, sid: int) -> ttrpc.Response:
        got_sid, kind, data = await self.message(1)
        assert (got_sid, kind) == (sid, 2)
        return ttrpc.Response.FromString(data)


@pytest.fixture
async def pair(tmp_path):
    """(Trunk serving an echo handler, Runtime) over a real unix socket pair."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    calls: list[Call] = []

    async def echo(call: Call) -> bytes:
        calls.append(call)
        if call.method == "Slow":
            await asyncio.sleep(0.2)
        return call.method.encode() + b":" + call.payload

    r1, w1 = await asyncio.open_unix_connection(sock=a)
    r2, w2 = await asyncio.open_unix_connection(sock=b)
    trunk = Trunk(r1, w1, echo)
    task = asyncio.create_task(trunk.run())
    peer = Runtime(r2, w2)
    peer.calls = calls
    yield trunk, peer
    trunk.close()
    w2.close()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_request_split_at_every_byte_boundary_is_answered(pair):
    trunk, peer = pair
    data = frame(1, request(1, "Configure", b"xyz"))
    for cut in range(1, len(data)):
        await peer.send(data, [cut])
        resp = await peer.response(1)
        assert resp.payload == b"Configure:xyz" and not resp.status.code


async def test_a_message_spread_over_frames_cut_at_every_byte_is_answered(pair):
    trunk, peer = pair
    msg = request(3, "Synchronize", b"p" * 40)
    for cut in range(1, len(msg)):
        await peer.send(frame(1, msg[:cut]) + frame(1, msg[cut:]))
        assert (await peer.response(3)).payload == b"Synchronize:" + b"p" * 40
    # Two messages in one frame, and one frame holding the end of one and the start of the next.
    two = request(5, "A") + request(7, "B")
    await peer.send(frame(1, two[:7]) + frame(1, two[7:30]) + frame(1, two[30:]))
    assert (await peer.response(5)).payload == b"A:"
    assert (await peer.response(7)).payload == b"B:"


async def test_interleaved_connections_and_concurrent_streams(pair):
    trunk, peer = pair
    call = asyncio.create_task(trunk.call("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin", b"reg", 5.0))
    sid, kind, data = await peer.message(2)
    req = ttrpc.Request.FromString(data)
    assert (sid, kind, req.method, req.payload) == (1, 1, "RegisterPlugin", b"reg")
    assert 4.9e9 < req.timeout_nano <= 5e9
    answer = message(sid, 2, ttrpc.Response(payload=b"ok").SerializeToString())
    slow, fast = request(9, "Slow", b"s"), request(11, "Fast", b"f")
    # Frames of the three messages on two connections, shuffled together.
    await peer.send(frame(1, slow[:5]) + frame(2, answer[:3]) + frame(1, slow[5:]) + frame(1, fast[:12])
                    + frame(2, answer[3:]) + frame(1, fast[12:]))
    assert await call == b"ok"
    first = await peer.message(1)
    second = await peer.message(1)
    assert [first[0], second[0]] == [11, 9]  # the fast one did not wait for the slow one


async def test_messages_at_the_4mib_limit(pair):
    trunk, peer = pair
    # The largest request ttrpc allows: data of exactly 4 MiB.
    env = ttrpc.Request(service=PLUGIN, method="Big", payload=b"")
    room = MIB4 - len(env.SerializeToString()) - 5  # tag and 4-byte length of the payload field
    body = ttrpc.Request(service=PLUGIN, method="Big", payload=b"b" * room).SerializeToString()
    assert len(body) == MIB4
    msg = message(13, 1, body)
    await peer.send(b"".join(frame(1, msg[i:i + 65536]) for i in range(0, len(msg), 65536)))
    resp = await peer.response(13)
    assert not resp.status.code and len(resp.payload) == room + 4
    # One byte more is refused with RESOURCE_EXHAUSTED and the connection goes on.
    over = message(15, 1, b"x" * (MIB4 + 1))
    await peer.send(b"".join(frame(1, over[i:i + 65536]) for i in range(0, len(over), 65536)))
    assert (await peer.response(15)).status.code == 8
    await peer.send(frame(1, request(17, "After")))
    assert (await peer.response(17)).payload == b"After:"
    # Our answer of 4 MiB went out in frames the Go reader can take.
    assert max(peer.frame_sizes) <= 4096


async def test_garbage_is_answered_or_dropped_and_the_connection_goes_on(pair, caplog):
    trunk, peer = pair
    caplog.set_level(logging.WARNING, "cri-resmgr.nri")
    await peer.send(frame(7, b"who is connection 7?"))
    await peer.send(frame(1, message(19, 1, b"\xff\xff\xff garbage")))
    assert (await peer.response(19)).status.code == 3  # INVALID_ARGUMENT
    await peer.send(frame(1, request(21, "Fine")))
    assert (await peer.response(21)).payload == b"Fine:"
    assert "unknown connection 7" in caplog.text
    # An answer for a call nobody made is dropped.
    await peer.send(frame(2, message(99, 2, ttrpc.Response(payload=b"?").SerializeToString())))
    await peer.send(frame(1, request(23, "StillFine")))
    assert (await peer.response(23)).payload == b"StillFine:"
    assert not trunk.closed


@pytest.mark.parametrize("bad", [message(25, 2, b""), message(26, 1, b""), message(27, 3, b"")],
                         ids=["response-to-the-server", "even-stream", "stream-data"])
async def test_a_broken_protocol_closes_the_connection(pair, bad):
    trunk, peer = pair
    pending = asyncio.create_task(trunk.call("nri.pkg.api.v1alpha1.Runtime", "UpdateContainers", b"", 5.0))
    await asyncio.sleep(0.01)
    await peer.send(frame(1, bad))
    await asyncio.wait_for(trunk.wait_closed(), 2)
    with pytest.raises(ConnectionError):
        await pending


async def test_a_peer_that_goes_away_fails_pending_calls(pair):
    trunk, peer = pair
    pending = asyncio.create_task(trunk.call("nri.pkg.api.v1alpha1.Runtime", "UpdateContainers", b"", 5.0))
    await asyncio.sleep(0.01)
    peer.writer.write(frame(1, b"\x00\x00"))  # half a header, then gone
    peer.writer.close()
    with pytest.raises(ConnectionError):
        await pending
    assert trunk.closed


async def _plugin_on_a_socket(tmp_path, policy: str = "none") -> tuple[NriPlugin, Trunk, Runtime]:
    """The NRI plugin behind the transport on a socket pair (static: on 4 CPUs), and the runtime's end."""
    topology = None
    if policy != "none":
        from tests.support.world import machine

        topology = machine("sockets=1,cores=4,threads=1")
    engine = Engine(policies.create(policy, {"Active": policy}, topology), StateStore(tmp_path), NriRuntime())
    plugin = NriPlugin(engine, engine.state.runtime)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    r1, w1 = await asyncio.open_unix_connection(sock=a)
    r2, w2 = await asyncio.open_unix_connection(sock=b)
    return plugin, Trunk(r1, w1, plugin.handle), Runtime(r2, w2)


async def _ended(trunk: Trunk, peer: Runtime, tasks: list[asyncio.Task]) -> None:
    trunk.close()
    peer.writer.close()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture
async def plugin_pair(tmp_path):
    """The NRI plugin (none policy) behind the transport, and the runtime's end."""
    plugin, trunk, peer = await _plugin_on_a_socket(tmp_path)
    task = asyncio.create_task(trunk.run())
    yield plugin, peer
    await _ended(trunk, peer, [task])


async def _configure(peer: Runtime, version: str) -> nri.ConfigureResponse:
    """The runtime's Configure, as containerd of that version sends it, and the plugin's answer."""
    await peer.send(frame(1, request(1, "Configure", nri.ConfigureRequest(
        runtime_name="containerd", runtime_version=version).SerializeToString())))
    return nri.ConfigureResponse.FromString((await peer.response(1)).payload)


async def test_the_plugin_refuses_bad_calls_with_ttrpc_errors(plugin_pair, caplog):
    plugin, peer = plugin_pair
    caplog.set_level(logging.WARNING, "cri-resmgr.nri")
    events = (await _configure(peer, "v1.7.20")).events
    assert events and events <= 0x7FF  # an older runtime: nothing above REMOVE_CONTAINER
    await peer.send(frame(1, request(3, "Frobnicate")))
    assert (await peer.response(3)).status.code == 12  # UNIMPLEMENTED
    await peer.send(frame(1, request(5, "Configure", service="some.Other")))
    assert (await peer.response(5)).status.code == 12
    await peer.send(frame(1, request(7, "CreateContainer", b"\x0a\xff\xff\xff\xff")))  # broken protobuf
    assert (await peer.response(7)).status.code == 3
    unsubscribed = nri.StateChangeEvent(event=nri.POST_CREATE_CONTAINER).SerializeToString()
    await peer.send(frame(1, request(9, "StateChange", unsubscribed)))
    resp = await peer.response(9)
    assert resp.status.code == 9 and "POST_CREATE_CONTAINER" in resp.status.message
    assert "did not subscribe" in caplog.text and "unknown method" in caplog.text


async def test_a_new_runtime_gets_the_pod_update_event_too(plugin_pair):
    plugin, peer = plugin_pair
    events = (await _configure(peer, "v2.2.9")).events
    assert events & (1 << (nri.UPDATE_POD_SANDBOX - 1))
    assert not events & (1 << (nri.POST_CREATE_CONTAINER - 1))


@pytest.mark.parametrize("error, code", [
    (lambda: PolicyError("no room"), 8),  # RESOURCE_EXHAUSTED, as the relay answers it
    (lambda: NotReady("not yet"), 14),  # UNAVAILABLE
    (lambda: ControllerError("no such class"), 3),  # INVALID_ARGUMENT
])
async def test_a_refused_create_is_answered_with_the_status_the_relay_gives(plugin_pair, error, code):
    plugin, peer = plugin_pair

    def refuse(*args):
        raise error()

    plugin.engine.state.policy.allocate = refuse
    await _configure(peer, "v2.2.0")
    create = nri.CreateContainerRequest(pod=nri.PodSandbox(id="p1", name="pod", namespace="default", uid="u1"),
                                        container=nri.Container(id="c1", pod_sandbox_id="p1", name="ctr"))
    await peer.send(frame(1, request(3, "CreateContainer", create.SerializeToString())))
    resp = await peer.response(3)
    assert resp.status.code == code
    assert "c1" not in plugin.engine.state.containers and not plugin.engine.state.containers  # nothing granted


@pytest.fixture
def policy() -> str:
    return "none"


@pytest.fixture
async def dialled(tmp_path, monkeypatch, policy):
    """The plugin as it runs when it dials the runtime itself: it may end its connection, and its
    sender delivers queued updates."""
    from resmgr.frontends.nri import plugin as nri_plugin
    from resmgr.frontends.nri import runtime as nri_runtime
    from resmgr.frontends.nri.connect import update_sender

    monkeypatch.setattr(nri_runtime, "RESYNC_DELAY", 0.05)
    monkeypatch.setattr(nri_plugin, "RESYNC_IDLE", 0.2)
    plugin, trunk, peer = await _plugin_on_a_socket(tmp_path, policy)
    plugin.reset(update_sender(trunk), trunk.close)
    tasks = [asyncio.create_task(trunk.run()), asyncio.create_task(plugin.runtime.run_sender())]
    yield plugin, trunk, peer
    await _ended(trunk, peer, tasks)


async def _configured(peer: Runtime, version: str) -> nri.SynchronizeResponse:
    """Configured by containerd of that version and synchronized with one container, c1."""
    await _configure(peer, version)
    await peer.send(frame(1, request(3, "Synchronize", nri.SynchronizeRequest(
        containers=[nri.Container(id="c1", pod_sandbox_id="p1", name="ctr")]).SerializeToString())))
    return nri.SynchronizeResponse.FromString((await peer.response(3)).payload)


def _placing_c1(plugin: NriPlugin) -> None:
    """The engine's reconciliation gives c1 CPU 1, as it would a container it adopts."""
    from resmgr.model import Resources

    async def reconcile(limits: bool = False) -> None:
        await plugin.runtime.update_resources("c1", Resources(cpuset_cpus="1"))

    plugin.engine.reconcile = reconcile


async def test_a_runtime_whose_update_containers_can_deadlock_gets_updates_by_synchronizing_again(dialled):
    """containerd before 2.4.0 takes its NRI locks in the other order for UpdateContainers than for
    events, and hangs for good when the two meet: an update no event's answer carries ends the
    connection instead, so that the runtime synchronizes again, and is never sent on its own."""
    from resmgr.model import Resources

    plugin, trunk, peer = dialled
    await _configured(peer, "v2.3.7")
    await plugin.runtime.update_resources("c1", Resources(cpuset_cpus="1"))
    await asyncio.wait_for(trunk.wait_closed(), 5)
    assert plugin.resyncing
    with pytest.raises((asyncio.IncompleteReadError, ConnectionError, TimeoutError)):
        await peer.message(2, timeout=1)  # nothing but the end of the connection


async def test_a_runtime_with_safe_update_containers_gets_them_sent(dialled):
    from resmgr.model import Resources

    plugin, trunk, peer = dialled
    await _configured(peer, "v2.4.2")
    await plugin.runtime.update_resources("c1", Resources(cpuset_cpus="1"))
    sid, kind, data = await peer.message(2)  # the runtime's service: the plugin's own calls
    req = ttrpc.Request.FromString(data)
    assert kind == 1 and req.method == "UpdateContainers"
    assert nri.UpdateContainersRequest.FromString(req.payload).update[0].container_id == "c1"
    assert not trunk.closed and not plugin.resyncing


async def test_updates_a_synchronize_answer_carried_are_checked_by_synchronizing_again(dialled):
    """The runtime ignores the updates of a Synchronize answer it fails to apply and says nothing:
    where it can be synchronized again, one more synchronization shows where containers run."""
    plugin, trunk, peer = dialled
    await _configured(peer, "v2.3.7")
    plugin.runtime.synchronized(0)
    await asyncio.sleep(0.3)
    assert not trunk.closed  # nothing carried: nothing to check
    plugin.runtime.synchronized(2)
    await asyncio.wait_for(trunk.wait_closed(), 5)
    assert plugin.resyncing


async def test_queued_updates_ride_on_the_next_answer_that_carries_updates(dialled, monkeypatch):
    """Where the runtime's UpdateContainers is unsafe, a StopContainer answer delivers what waits."""
    from resmgr.frontends.nri import plugin as nri_plugin
    from resmgr.model import Resources

    monkeypatch.setattr(nri_plugin, "RESYNC_IDLE", 60.0)  # no resynchronization meanwhile
    plugin, trunk, peer = dialled
    await _configured(peer, "v2.3.7")
    await plugin.runtime.update_resources("c1", Resources(cpuset_cpus="1"))
    stop = nri.StopContainerRequest(pod=nri.PodSandbox(id="p2"), container=nri.Container(id="c2", pod_sandbox_id="p2"))
    await peer.send(frame(1, request(5, "StopContainer", stop.SerializeToString())))
    resp = nri.StopContainerResponse.FromString((await peer.response(5)).payload)
    assert [u.container_id for u in resp.update] == ["c1"]
    assert not trunk.closed


async def test_a_safe_runtime_gets_a_synchronizations_updates_by_update_containers(dialled):
    """containerd (2.4 too) drops the updates of a Synchronize answer it fails to apply and tells no
    one, so a container being made when the plugin registered kept the wrong CPUs for good. Where
    UpdateContainers is safe they go by it instead: what the runtime refuses is tried again."""
    plugin, trunk, peer = dialled
    failures = []
    plugin.runtime.on_failure = lambda: failures.append(1)
    _placing_c1(plugin)
    assert not (await _configured(peer, "v2.4.2")).update
    sid, kind, data = await peer.message(2)
    req = ttrpc.Request.FromString(data)
    assert kind == 1 and req.method == "UpdateContainers"
    update = nri.UpdateContainersRequest.FromString(req.payload).update[0]
    assert (update.container_id, update.linux.resources.cpu.cpus) == ("c1", "1")
    refused = nri.UpdateContainersResponse(failed=[update]).SerializeToString()
    await peer.send(frame(2, message(sid, 2, ttrpc.Response(payload=refused).SerializeToString())))
    for _ in range(100):
        if failures:
            break
        await asyncio.sleep(0.01)
    assert failures  # the engine is woken to repair it
    assert plugin.runtime.containers["c1"].linux.resources.cpu.cpus != "1"  # not taken as applied
    assert plugin.runtime.failed_update("c1").cpuset_cpus == "1"  # reconciliation writes the cgroup


async def test_an_unsafe_runtime_still_gets_them_in_the_synchronize_answer(dialled):
    plugin, trunk, peer = dialled
    _placing_c1(plugin)
    assert [u.container_id for u in (await _configured(peer, "v2.3.7")).update] == ["c1"]


def _guaranteed(cpus: int, state: int = nri.CONTAINER_RUNNING,
                cpuset: str = "") -> tuple[nri.PodSandbox, nri.Container]:
    """Pod p1 (Guaranteed) and its container c1 asking for whole CPUs, as the runtime lists them."""
    pod = nri.PodSandbox(id="p1", uid="u1", name="g", namespace="default")
    pod.linux.cgroup_parent = "/kubepods/podu1"
    c = nri.Container(id="c1", pod_sandbox_id="p1", name="ctr", state=state)
    cpu = c.linux.resources.cpu
    cpu.shares.value, cpu.quota.value, cpu.period.value = 1024 * cpus, 100000 * cpus, 100000
    c.linux.resources.memory.limit.value = 64 << 20
    cpu.cpus = cpuset
    return pod, c


async def _synchronized(peer: Runtime, sid: int, pod: nri.PodSandbox, c: nri.Container) -> None:
    await peer.send(frame(1, request(sid, "Synchronize", nri.SynchronizeRequest(
        pods=[pod], containers=[c]).SerializeToString())))
    await peer.response(sid)


async def _updates_of_c1(peer: Runtime) -> str:
    """The CPUs the next UpdateContainers gives c1, answered as taken."""
    while True:
        sid, kind, data = await peer.message(2)
        req = ttrpc.Request.FromString(data)
        assert kind == 1 and req.method == "UpdateContainers"
        await peer.send(frame(2, message(sid, 2, ttrpc.Response(
            payload=nri.UpdateContainersResponse().SerializeToString()).SerializeToString())))
        cpus = {u.container_id: u.linux.resources.cpu.cpus for u in nri.UpdateContainersRequest.FromString(
            req.payload).update}
        if "c1" in cpus:
            return cpus["c1"]


@pytest.mark.parametrize("policy", ["static"])
async def test_a_resize_while_the_plugin_was_away_is_placed_at_the_next_synchronization(dialled):
    """kubelet resized a Guaranteed container while the plugin was down: the runtime took the new
    limits alone. The next synchronization lists them, and the container gets CPUs for them."""
    plugin, trunk, peer = dialled
    await _configure(peer, "v2.4.2")
    pod, c = _guaranteed(1)
    await _synchronized(peer, 3, pod, c)
    one = await _updates_of_c1(peer)
    assert len(CPUSet.parse(one)) == 1
    pod, c = _guaranteed(2, cpuset=one)  # as the runtime holds it after kubelet's resize
    await _synchronized(peer, 5, pod, c)
    two = CPUSet.parse(await _updates_of_c1(peer))
    assert len(two) == 2 and set(CPUSet.parse(one)) <= set(two)
    held = plugin.engine.state.containers["c1"]
    assert held.requested.cpu_quota == 200000 and held.resources.cpu_quota == 200000


@pytest.mark.parametrize("policy", ["static"])
async def test_a_container_adopted_while_the_runtime_starts_it_is_updated_again_once_started(dialled):
    """A container the runtime was starting when the plugin registered: the update a synchronization
    sends may reach its record and not the task being made from the old one (containerd reports no
    failure), so once it has started it is updated again."""
    plugin, trunk, peer = dialled
    await _configure(peer, "v2.4.2")
    pod, c = _guaranteed(1, state=nri.CONTAINER_CREATED)
    await _synchronized(peer, 3, pod, c)
    granted = await _updates_of_c1(peer)
    c.state, c.linux.resources.cpu.cpus = nri.CONTAINER_RUNNING, granted
    started = nri.StateChangeEvent(event=nri.POST_START_CONTAINER, pod=pod, container=c)
    await peer.send(frame(1, request(5, "StateChange", started.SerializeToString())))
    await peer.response(5)
    assert await _updates_of_c1(peer) == granted


@pytest.mark.parametrize("policy", ["static"])
async def test_a_reconciliation_while_an_update_is_on_its_way_neither_warns_nor_sends_it_again(dialled, caplog):
    """A slow runtime has not yet answered the UpdateContainers that moves c1: c1 still runs where
    it was, and a reconciliation meanwhile is not to take that for a container gone astray."""
    plugin, trunk, peer = dialled
    await _configure(peer, "v2.4.2")
    pod, c = _guaranteed(1, cpuset="0-3")
    await _synchronized(peer, 3, pod, c)
    sid, kind, data = await peer.message(2)  # UpdateContainers, not answered yet
    granted = nri.UpdateContainersRequest.FromString(ttrpc.Request.FromString(data).payload).update[0]
    await plugin.engine.reconcile()
    assert "runs with other CPUs" not in caplog.text
    assert not plugin.engine.state.containers["c1"].pending
    await peer.send(frame(2, message(sid, 2, ttrpc.Response(
        payload=nri.UpdateContainersResponse().SerializeToString()).SerializeToString())))
    for _ in range(100):
        if plugin.runtime.containers["c1"].linux.resources.cpu.cpus == granted.linux.resources.cpu.cpus:
            break
        await asyncio.sleep(0.01)
    await plugin.engine.reconcile()
    assert "runs with other CPUs" not in caplog.text
    with pytest.raises(TimeoutError):
        await peer.message(2, timeout=0.3)  # nothing sent again


async def test_no_update_goes_out_while_the_runtime_has_not_answered_the_last(dialled, monkeypatch):
    """A stopped or busy runtime queues the UpdateContainers calls it has not read and runs them all
    once it goes on, in any order: a newer call must not be made while an older one is unanswered,
    or the stale one can land last. The newest value goes once the runtime answers."""
    from resmgr.frontends.nri import runtime as nri_runtime
    from resmgr.model import Resources

    monkeypatch.setattr(nri_runtime, "UPDATE_TIMEOUT", 0.1)
    plugin, trunk, peer = dialled
    await _configured(peer, "v2.4.2")
    await plugin.runtime.update_resources("c1", Resources(cpuset_cpus="1"))
    sid, kind, data = await peer.message(2)
    await asyncio.sleep(0.3)  # past the time the plugin waits before it says the runtime is slow
    await plugin.runtime.update_resources("c1", Resources(cpuset_cpus="2"))
    with pytest.raises(TimeoutError):
        await peer.message(2, timeout=0.5)  # nothing while the first is unanswered
    answer = nri.UpdateContainersResponse().SerializeToString()
    await peer.send(frame(2, message(sid, 2, ttrpc.Response(payload=answer).SerializeToString())))
    sid, kind, data = await peer.message(2)
    req = nri.UpdateContainersRequest.FromString(ttrpc.Request.FromString(data).payload)
    assert [(u.container_id, u.linux.resources.cpu.cpus) for u in req.update] == [("c1", "2")]


def _runtime_running(**cpus: str) -> NriRuntime:
    """An NriRuntime whose record has each container on its CPUs."""
    runtime = NriRuntime()
    runtime.replace([], [nri.Container(id=cid, linux=nri.LinuxContainer(resources=nri.LinuxResources(
                         cpu=nri.LinuxCPU(cpus=c)))) for cid, c in cpus.items()])
    return runtime


async def _until(check, tries: int = 100) -> None:
    for _ in range(tries):
        if check():
            return
        await asyncio.sleep(0.01)


async def test_update_containers_orders_a_swap_so_no_container_shares_a_cpu():
    """The updates go one a call, in an order in which none lands on a CPU another is still to
    leave (a swap: one steps aside first)."""
    from resmgr.model import Resources

    runtime = NriRuntime()
    runtime.replace([], [nri.Container(id="g", linux=nri.LinuxContainer(resources=nri.LinuxResources(
                         cpu=nri.LinuxCPU(cpus="0")))),
                         nri.Container(id="b", linux=nri.LinuxContainer(resources=nri.LinuxResources(
                             cpu=nri.LinuxCPU(cpus="1-3"))))])
    sent: list[list[tuple[str, str]]] = []

    async def send(updates: list[nri.ContainerUpdate]) -> list[nri.ContainerUpdate]:
        sent.append([(u.container_id, u.linux.resources.cpu.cpus) for u in updates])
        return []

    runtime.connected(send)
    sender = asyncio.create_task(runtime.run_sender())
    try:
        runtime.queue({"g": Resources(cpuset_cpus="1", cpu_quota=100000), "b": Resources(cpuset_cpus="0,2-3")})
        for _ in range(100):
            if len(sent) == 3:
                break
            await asyncio.sleep(0.01)
    finally:
        sender.cancel()
    assert sent == [[("b", "2-3")], [("g", "1")], [("b", "0,2-3")]]


async def test_each_update_has_a_call_of_its_own_and_a_failed_one_holds_back_the_moves_onto_its_cpus():
    """containerd gives an UpdateContainers call one deadline for all its updates: on a busy node the
    first used it up and every later one failed at once, call after call. One a call, a failure is
    the failed container's own; a move onto CPUs it was to leave is not sent (both would run there),
    a move elsewhere is."""
    from resmgr.frontends.nri.transport import RpcError
    from resmgr.model import Resources

    runtime = _runtime_running(a="0-1", b="2", c="3")
    sent: list[list[str]] = []

    async def send(updates: list[nri.ContainerUpdate]) -> list[nri.ContainerUpdate]:
        sent.append([u.container_id for u in updates])
        if updates[0].container_id == "a":
            raise RpcError(2, "NRI update of some containers failed")
        return []

    failures = []
    runtime.on_failure = lambda: failures.append(True)
    runtime.connected(send)
    # a leaves CPU 1 (and fails), b takes it, c moves elsewhere
    for cid, cpus in (("a", "0"), ("b", "1-2"), ("c", "3-4")):
        await runtime.update_resources(cid, Resources(cpuset_cpus=cpus))
    sender = asyncio.create_task(runtime.run_sender())
    try:
        await _until(lambda: failures)
    finally:
        sender.cancel()
    assert sorted(sent) == [["a"], ["c"]] and failures == [True]
    assert runtime.failed_update("a") is not None and runtime.failed_update("b") is not None
    assert runtime.failed_update("c") is None and runtime.containers["c"].linux.resources.cpu.cpus == "3-4"


async def test_a_move_onto_cpus_an_updated_container_gives_up_waits_until_the_runtime_has_updated_it(tmp_path):
    """kubelet resizes g from CPU 1 to CPUs 2-3 and the shared containers take CPU 1 instead. The
    runtime applies the other updates an UpdateContainer answer carries before g's own, so the
    answer narrows them to what they may hold now; CPU 1 follows once g is updated."""
    from resmgr.frontends.nri import plugin as nri_plugin
    from resmgr.frontends.nri.runtime import Collector
    from resmgr.model import Resources

    plugin, trunk, peer = await _plugin_on_a_socket(tmp_path, "static")
    g = nri.Container(id="g", pod_sandbox_id="p1", name="g")
    g.linux.resources.cpu.cpus = "1"
    plugin.runtime.containers["g"] = g
    collector = Collector(updates={"s": Resources(cpuset_cpus="0-1,8-15"), "t": Resources(cpuset_cpus="4-7")})
    plugin._defer_onto("g", Resources(cpuset_cpus="2-3"), collector)
    assert collector.updates["s"].cpuset_cpus == "0,8-15" and collector.updates["t"].cpuset_cpus == "4-7"
    queued: list[dict] = []
    plugin.runtime.queue = lambda updates: queued.append(updates) or len(updates)
    plugin._moves_after("g")
    assert [{k: r.cpuset_cpus for k, r in q.items()} for q in queued] == [{"s": "0-1,8-15"}]
    plugin._moves_after("g")  # the fallback after the event finds nothing left
    assert len(queued) == 1 and nri_plugin.AFTER_UPDATE_WAIT > 0
    trunk.close()
    peer.writer.close()


async def test_a_move_only_onto_cpus_an_updated_container_gives_up_waits_whole_and_so_do_those_onto_its_own(
        tmp_path):
    """kubelet resizes g from CPUs 4,12 to CPU 4; shared container s is given CPU 12 alone (its pool's
    shared CPUs), and t takes CPU 14, which s leaves. Narrowed, s would hold nothing: it stays on 14
    until g is updated, and t's move onto 14 waits with it (found by the simulated node in NRI mode:
    s on g's CPU 12 before g left it)."""
    from resmgr.frontends.nri.runtime import Collector
    from resmgr.model import Resources

    plugin, trunk, peer = await _plugin_on_a_socket(tmp_path, "static")
    for cid, cpus in (("g", "4,12"), ("s", "14"), ("t", "15")):
        c = nri.Container(id=cid, pod_sandbox_id="p1", name=cid)
        c.linux.resources.cpu.cpus = cpus
        plugin.runtime.containers[cid] = c
    collector = Collector(updates={"s": Resources(cpuset_cpus="12"), "t": Resources(cpuset_cpus="14-15"),
                                   "u": Resources(cpuset_cpus="0-3")})
    plugin._defer_onto("g", Resources(cpuset_cpus="4"), collector)
    assert {k: r.cpuset_cpus for k, r in collector.updates.items()} == {"t": "15", "u": "0-3"}
    queued: list[dict] = []
    plugin.runtime.queue = lambda updates: queued.append(updates) or len(updates)
    plugin._moves_after("g")
    assert [{k: r.cpuset_cpus for k, r in q.items()} for q in queued] == [{"s": "12", "t": "14-15"}]
    trunk.close()
    peer.writer.close()


async def test_the_runtimes_post_update_event_releases_the_moves_that_waited_for_it(dialled):
    from resmgr.model import Resources

    plugin, trunk, peer = dialled
    await _configured(peer, "v2.4.2")
    plugin._after_update["g"] = {"c1": Resources(cpuset_cpus="1")}
    event = nri.PostUpdateContainerRequest(container=nri.Container(id="g", pod_sandbox_id="p1", name="g"))
    await peer.send(frame(1, request(5, "PostUpdateContainer", event.SerializeToString())))
    assert (await peer.response(5)).status.code == 0
    assert await _updates_of_c1(peer) == "1"
    assert plugin._after_update == {}


async def test_a_new_container_answer_carries_the_update_of_one_still_on_its_cpus(tmp_path):
    """g was resized from CPUs 2-3 to CPU 3, and the runtime never took the update (frozen, the
    call failed): it still runs on 2-3. A new container given CPU 2 must not start there before g
    has left: its create's answer carries g's update, which the runtime applies first."""
    from resmgr.frontends.nri.runtime import Collector
    from resmgr.model import Container, ContainerState, Resources

    plugin, trunk, peer = await _plugin_on_a_socket(tmp_path, "static")
    for cid, cpus in (("g", "2-3"), ("s", "0-1")):
        known = nri.Container(id=cid, pod_sandbox_id="p1", name=cid)
        known.linux.resources.cpu.cpus = cpus
        plugin.runtime.containers[cid] = known
    ledger = plugin.engine.state.ledger
    ledger.containers["g"] = Container(id="g", pod_id="p1", name="g", state=ContainerState.RUNNING,
                                       resources=Resources(cpuset_cpus="3"), pending=True)
    ledger.containers["s"] = Container(id="s", pod_id="p1", name="s", state=ContainerState.RUNNING,
                                       resources=Resources(cpuset_cpus="0-1"))
    collector = Collector(updates={})
    plugin._clear_for("new", Resources(cpuset_cpus="1-2"), collector)
    assert {k: r.cpuset_cpus for k, r in collector.updates.items()} == {"g": "3"}  # s stays where it is
    plugin._clear_for("new", Resources(cpuset_cpus="0"), collector := Collector(updates={}))
    assert collector.updates == {}  # nothing g leaves
    trunk.close()
    peer.writer.close()


async def _plugin_with(tmp_path, *containers: tuple[str, str, str, bool]):
    """A static plugin whose runtime record runs each (id, runs_on, granted, pending) where it says."""
    from resmgr.model import Container, ContainerState, Resources

    plugin, trunk, peer = await _plugin_on_a_socket(tmp_path, "static")
    for cid, runs_on, dest, pending in containers:
        known = nri.Container(id=cid, pod_sandbox_id="p1", name=cid)
        known.linux.resources.cpu.cpus = runs_on
        plugin.runtime.containers[cid] = known
        plugin.engine.state.ledger.containers[cid] = Container(
            id=cid, pod_id="p1", name=cid, state=ContainerState.RUNNING, resources=Resources(cpuset_cpus=dest),
            pending=pending)
    return plugin, trunk, peer


async def test_a_new_container_answer_steps_one_whose_move_waits_only_off_its_cpus(tmp_path):
    """g runs on CPUs 2-3 and is to go to 4-5, which h still runs on and is to leave: carried whole
    in a new container's answer, g's update would put it on h's CPUs (found by the simulated node in
    NRI mode, after a restart that adopted both). The answer steps g off the new one's CPU 2 only."""
    from resmgr.frontends.nri.runtime import Collector
    from resmgr.model import Resources

    plugin, trunk, peer = await _plugin_with(tmp_path, ("g", "2-3", "4-5", True), ("h", "4-5", "6", True))
    collector = Collector(updates={})
    plugin._clear_for("new", Resources(cpuset_cpus="2"), collector)
    assert {k: r.cpuset_cpus for k, r in collector.updates.items()} == {"g": "3"}
    trunk.close()
    peer.writer.close()


async def test_an_update_answer_moves_off_first_a_container_the_runtime_still_runs_on_the_cpus_it_takes(tmp_path):
    """g is resized onto CPU 2, which a adopted after a restart still runs on, its move to 4 not
    delivered yet: the answer carries a's move, which containerd applies before g's own (found by
    the simulated node in NRI mode); b, on CPUs g does not take, is left to the queue."""
    from resmgr.frontends.nri.runtime import Collector
    from resmgr.model import Resources

    plugin, trunk, peer = await _plugin_with(tmp_path, ("g", "6", "2", False), ("a", "2", "4", True),
                                             ("b", "5", "7", True))
    collector = Collector(updates={})
    plugin._updated_answer("g", Resources(cpuset_cpus="2"), collector)
    assert {k: r.cpuset_cpus for k, r in collector.updates.items()} == {"a": "4"}
    trunk.close()
    peer.writer.close()


def test_a_failed_update_is_forgotten_with_its_container_and_by_a_synchronization_without_it():
    from resmgr.frontends.nri.runtime import NriRuntime
    from resmgr.model import Resources

    rt = NriRuntime()
    rt.replace([], [nri.Container(id="c1"), nri.Container(id="c2")])
    rt._failed.update({"c1": Resources(cpuset_cpus="1"), "c2": Resources(cpuset_cpus="2")})
    rt.gone_container("c1")
    assert rt.failed_update("c1") is None and rt.failed_update("c2") is not None
    rt.replace([], [])  # c2 went while the plugin was away
    assert rt.failed_update("c2") is None


async def test_an_update_an_event_answer_carried_meanwhile_is_not_undone_by_the_queue():
    """The queue's calls wait for containerd's plugin lock, which an event holds: an event's answer
    can carry a newer value for a container whose older one waits in the queue's batch (b: not sent
    any more), or is in the call in flight (a: it lands after the answer, so the runtime runs the
    older one; recorded as such, and the newer one is sent again)."""
    from resmgr.frontends.nri.runtime import collecting
    from resmgr.model import Resources

    runtime = _runtime_running(a="8-11", b="8-11")
    sent: list[tuple[str, str]] = []
    gate = asyncio.Event()

    async def send(updates: list[nri.ContainerUpdate]) -> list[nri.ContainerUpdate]:
        sent.append((updates[0].container_id, updates[0].linux.resources.cpu.cpus))
        if len(sent) == 1:
            await gate.wait()  # the runtime busy with an event
        return []

    runtime.connected(send)
    await runtime.update_resources("a", Resources(cpuset_cpus="4-5"))
    await runtime.update_resources("b", Resources(cpuset_cpus="1-3,6-7"))
    sender = asyncio.create_task(runtime.run_sender())
    try:
        await _until(lambda: sent)
        with collecting():  # the event's answer: a resized to CPU 4, b given CPU 5 it gives up
            await runtime.update_resources("a", Resources(cpuset_cpus="4"))
            await runtime.update_resources("b", Resources(cpuset_cpus="1-3,5-7"))
        gate.set()
        await _until(lambda: len(sent) == 2)
    finally:
        sender.cancel()
    assert sent == [("a", "4-5"), ("a", "4")]  # b's older value never goes; a's newer one goes again
