"""Wire-level behaviour against a scripted gRPC backend: metadata, details, sizes,
unknown methods, unavailability, shutdown."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import grpc
import pytest

from resmgr.generated.cri import api_pb2 as cri
from tests.support.helpers import FakeBackend, RelayProcess, slow_call_in_thread, wait_socket


@pytest.fixture
def backend(workdir):
    fake = FakeBackend(str(workdir / "backend.sock")).start()
    yield fake
    fake.stop()


@pytest.fixture
def relay_to_fake(backend, workdir, relay_mode):
    proc = RelayProcess(workdir, backend.path, "--allow-untested-runtimes", "--relay-mode", relay_mode).start()
    yield proc
    proc.stop()


def test_metadata_travels_both_ways(backend, relay_to_fake):
    with relay_to_fake.channel() as ch:
        reply, call = ch.unary_unary("/runtime.v1.RuntimeService/Version").with_call(
            b"\x0a\x02v1", metadata=(("x-echo-id", "42"), ("x-echo-bin", b"\x01\x02")), timeout=5)
    assert reply == b"\x0a\x02v1"
    seen = [dict(md) for md in backend.seen_metadata if "x-echo-id" in dict(md)][-1]
    assert seen["x-echo-id"] == "42" and seen["x-echo-bin"] == b"\x01\x02"
    initial = dict(call.initial_metadata())
    assert initial["x-echo-id"] == "42" and initial["x-echo-bin"] == b"\x01\x02"
    trailing = dict(call.trailing_metadata())
    assert trailing["x-trail"] == "t1" and trailing["x-trail-bin"] == b"\x00\x01"


def test_rich_error_details_survive(relay_to_fake, backend):
    with relay_to_fake.channel() as ch:
        with pytest.raises(grpc.RpcError) as info:
            ch.unary_unary("/test.Probe/Fail")(b"", timeout=5)
    err = info.value
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert err.details() == "rich failure"
    assert dict(err.trailing_metadata())["grpc-status-details-bin"] == b"\x08\x09\x12\x0crich failure"


def test_unknown_methods_are_relayed_raw(relay_to_fake):
    with relay_to_fake.channel() as ch:
        assert ch.unary_unary("/runtime.v2.FutureService/Frobnicate")(b"\x00raw\xff", timeout=5) == b"\x00raw\xff"
        chat = ch.stream_stream("/test.Probe/Chat")
        assert list(chat(iter([b"a", b"bb", b"ccc"]), timeout=5)) == [b"a", b"bb", b"ccc"]


def test_event_stream_is_relayed(relay_to_fake):
    from resmgr.generated.cri import api_pb2_grpc as cri_grpc

    with relay_to_fake.channel() as ch:
        events = list(cri_grpc.RuntimeServiceStub(ch).GetContainerEvents(cri.GetEventsRequest(), timeout=5))
    assert [e.container_id for e in events] == ["c0", "c1", "c2"]


def test_large_messages_both_ways(relay_to_fake):
    size = 20 * 1024 * 1024
    with grpc.insecure_channel("unix://" + relay_to_fake.socket, options=[
            ("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]) as ch:
        assert len(ch.unary_unary("/test.Probe/Big")(str(size).encode(), timeout=20)) == size
        payload = os.urandom(size)
        assert ch.unary_unary("/runtime.v1.RuntimeService/Version")(payload, timeout=20) == payload


def test_deadline_is_enforced_through_the_relay(relay_to_fake):
    with relay_to_fake.channel() as ch:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            ch.unary_unary("/test.Probe/Slow")(b"3000", timeout=0.3)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 1.0


def wait_for_echo(call, payload: bytes, timeout: float = 5) -> None:
    """Retry until the relay reaches the (restarted) backend again and the call echoes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            assert call(payload, timeout=2) == payload
            return
        except grpc.RpcError:
            assert time.monotonic() < deadline, "relay did not recover"
            time.sleep(0.1)


def test_runtime_down_fails_fast_then_recovers(workdir, relay_mode):
    runtime = str(workdir / "later.sock")
    relay = RelayProcess(workdir, runtime, "--allow-untested-runtimes", "--relay-mode", relay_mode).start()
    try:
        with relay.channel() as ch:
            version = ch.unary_unary("/runtime.v1.RuntimeService/Version")
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                version(b"", timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert runtime in info.value.details()
            assert time.monotonic() - started < 2.0
            # Intercepted calls fail the same way.
            with pytest.raises(grpc.RpcError) as info:
                ch.unary_unary("/runtime.v1.RuntimeService/StartContainer")(
                    cri.StartContainerRequest(container_id="x").SerializeToString(), timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            fake = FakeBackend(runtime).start()
            try:
                wait_for_echo(version, b"\x0a\x01x")
            finally:
                fake.stop()
    finally:
        assert relay.stop() == 0


def test_sigterm_lets_inflight_calls_finish(relay_to_fake, backend):
    with relay_to_fake.channel() as ch:
        t, result = slow_call_in_thread(ch, 1000)
        backend.wait_for_call("/test.Probe/Slow")
        assert relay_to_fake.stop(signal.SIGTERM) == 0
        t.join(5)
    assert result == {"reply": b"slow-done"}
    assert not os.path.exists(relay_to_fake.socket)


def test_sigint_exits_cleanly(relay_to_fake):
    assert relay_to_fake.stop(signal.SIGINT) == 0
    assert not os.path.exists(relay_to_fake.socket)


def test_stale_socket_is_replaced(backend, workdir):
    import socket as pysocket
    stale = pysocket.socket(pysocket.AF_UNIX)
    stale.bind(str(workdir / "relay.sock"))
    stale.close()  # the file stays, nobody listens
    relay = RelayProcess(workdir, backend.path, "--allow-untested-runtimes").start()
    try:
        with relay.channel() as ch:
            assert ch.unary_unary("/x.Y/Z")(b"ok", timeout=5) == b"ok"
    finally:
        relay.stop()


def test_live_socket_is_refused(relay_to_fake, backend, workdir):
    second = subprocess.run([sys.executable, "-m", "resmgr", "--relay-socket", relay_to_fake.socket,
                             "--runtime-socket", backend.path, "--relay-dir", str(workdir / "s2"),
                             "--config-socket", str(workdir / "s2.sock")],
                            capture_output=True, text=True, timeout=20)
    assert second.returncode == 1
    assert "already exists" in second.stderr and relay_to_fake.socket in second.stderr
    with relay_to_fake.channel() as ch:  # the first relay still serves
        assert ch.unary_unary("/x.Y/Z")(b"ok", timeout=5) == b"ok"


def test_socket_copies_runtime_socket_permissions(backend, workdir):
    os.chmod(backend.path, 0o600)
    os.chown(backend.path, 0, 4242)
    nested = workdir / "new" / "dir"
    relay = RelayProcess(workdir, backend.path, "--allow-untested-runtimes")
    relay.socket = str(nested / "relay.sock")
    relay.args[relay.args.index("--relay-socket") + 1] = relay.socket
    relay.start()
    try:
        st = os.stat(relay.socket)
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert (st.st_uid, st.st_gid) == (0, 4242)
    finally:
        relay.stop()


def test_socket_mode_0660_when_runtime_socket_unknown(workdir):
    relay = RelayProcess(workdir, str(workdir / "absent.sock"), "--allow-untested-runtimes").start()
    try:
        assert stat.S_IMODE(os.stat(relay.socket).st_mode) == 0o660
    finally:
        relay.stop()


def test_startup_is_fast(backend, workdir):
    relay = RelayProcess(workdir, backend.path, "--allow-untested-runtimes")
    started = time.monotonic()
    relay.start(wait=False)
    wait_socket(relay.socket, proc=relay.proc)
    elapsed = time.monotonic() - started
    relay.stop()
    # Reported, not asserted tightly: the benchmark measures start-up; this only
    # catches a start-up that waits on something it must not.
    assert elapsed < 5, elapsed


def test_runtime_lost_mid_call_then_back(workdir, relay_mode):
    runtime = str(workdir / "rt.sock")
    fake = FakeBackend(runtime).start()
    relay = RelayProcess(workdir, runtime, "--allow-untested-runtimes", "--relay-mode", relay_mode).start()
    try:
        with relay.channel() as ch:
            assert ch.unary_unary("/x.Y/Z")(b"1", timeout=5) == b"1"
            t, result = slow_call_in_thread(ch, 3000)
            fake.wait_for_call("/test.Probe/Slow")
            fake.server.stop(None)  # the runtime goes away with the call in flight
            t.join(10)
            assert result.get("code") == grpc.StatusCode.UNAVAILABLE, result
            fake = FakeBackend(runtime).start()
            wait_for_echo(ch.unary_unary("/x.Y/Z"), b"2")
    finally:
        fake.stop()
        relay.stop()


def test_dump_shows_passthrough_and_errors(backend, workdir, relay_mode):
    dump_file = workdir / "dump.txt"
    relay = RelayProcess(workdir, backend.path, "--allow-untested-runtimes", "--relay-mode", relay_mode,
                         "--dump", "full:.*,short:Fail", "--dump-file", str(dump_file)).start()
    try:
        with relay.channel() as ch:
            req = cri.ContainerStatusRequest(container_id="dumped-id").SerializeToString()
            reply, call = ch.unary_unary("/runtime.v1.RuntimeService/ContainerStatus").with_call(
                req, metadata=(("x-echo-a", "b"),), timeout=5)
            assert reply == req  # dumping does not change what passes
            assert dict(call.trailing_metadata())["x-trail"] == "t1"
            with pytest.raises(grpc.RpcError) as info:
                ch.unary_unary("/runtime.v1.RuntimeService/ListContainers")(b"FAIL", timeout=5)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert dict(info.value.trailing_metadata())["grpc-status-details-bin"].endswith(b"rich failure")
            # A large reply on a call the relay answers itself must respect flow control.
            with grpc.insecure_channel("unix://" + relay.socket, options=[
                    ("grpc.max_receive_message_length", 64 << 20)]) as big_ch:
                big = big_ch.unary_unary("/runtime.v1.RuntimeService/ListContainers")(b"BIG:5000000", timeout=20)
            assert big == b"y" * 5000000
    finally:
        relay.stop()
    text = dump_file.read_text()
    assert "method: /runtime.v1.RuntimeService/ContainerStatus" in text
    assert "container_id: dumped-id" in text and "kind: passthrough" in text
    assert "code: FAILED_PRECONDITION" in text and "message: rich failure" in text


def test_intercepted_requests_keep_fields_our_schema_lacks(backend, relay_to_fake):
    # A newer kubelet may send fields this schema does not know; rewriting must keep them.
    req = cri.CreateContainerRequest(pod_sandbox_id="pod-x", config=cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name="c")))
    unknown = b"\xb8\x06\x2a"  # field 103, varint 42
    raw = req.SerializeToString() + unknown
    with relay_to_fake.channel() as ch:
        ch.unary_unary("/runtime.v1.RuntimeService/CreateContainer")(raw, timeout=5)
    seen = [r for m, r in backend.seen_requests if m == "/runtime.v1.RuntimeService/CreateContainer"][-1]
    assert unknown in seen
    assert cri.CreateContainerRequest.FromString(seen).pod_sandbox_id == "pod-x"
