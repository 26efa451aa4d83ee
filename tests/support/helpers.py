"""Shared test helpers: CRI configs, a relay process, a fake backend speaking real gRPC."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from harness.images import BUSYBOX_IMAGE
from harness.relay import RelayProcess, policy_relay, wait_socket  # noqa: F401 - shared
from resmgr.generated.config import api_pb2, api_pb2_grpc, status_pb2, status_pb2_grpc
from resmgr.generated.cri import api_pb2 as cri
from resmgr.generated.cri import api_pb2_grpc as cri_grpc
from resmgr.requests import milli_to_shares
from resmgr.topology.cpuset import CPUSet

ROOT = Path(__file__).resolve().parents[2]
ONLINE = CPUSet.parse(Path("/sys/devices/system/cpu/online").read_text())


def run_main(main: Callable[[list[str]], int | None], *args: str) -> subprocess.CompletedProcess:
    """A command's main(argv) run in this process, reported as subprocess.run reports a process: for
    commands that exit before they start anything (a new interpreter costs more than the test)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args)) or 0
        except SystemExit as exit_:  # argparse: --help, bad arguments
            code = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def cgroup_cpuset(pod: cri.PodSandboxConfig | str, cid: str, name: str = "cpus") -> CPUSet:
    """A container's cpuset.cpus or cpuset.mems, read from its cgroup (v1 or v2); pod: config or cgroup parent."""
    parent = pod if isinstance(pod, str) else pod.linux.cgroup_parent
    base = Path("/sys/fs/cgroup/cpuset") / parent.lstrip("/") / cid / f"cpuset.{name}"
    if not base.exists():  # cgroup v2
        base = Path("/sys/fs/cgroup") / parent.lstrip("/") / cid / f"cpuset.{name}"
    return CPUSet.parse(base.read_text())


def cgroup_cpus(pod: cri.PodSandboxConfig | str, cid: str) -> CPUSet:
    return cgroup_cpuset(pod, cid, "cpus")


def fill(path: Path) -> None:
    """Write zeros to path until its file system takes no more (every block taken)."""
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def wait_until(check, timeout: float = 15.0, interval: float = 0.05, what: str = ""):
    """Poll check() until it returns something true; that value, or AssertionError after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout}s: {what or check}")
        time.sleep(interval)


def pod_config(name: str | None = None, namespace: str = "default", host_network: bool = True,
               qos: str = "besteffort", logdir: str = "/tmp/crirm-test-logs",
               annotations: dict[str, str] | None = None) -> cri.PodSandboxConfig:
    name = name or f"pod-{uuid.uuid4().hex[:8]}"
    uid = uuid.uuid4().hex
    parent = f"/kubepods/pod{uid}" if qos == "guaranteed" else f"/kubepods/{qos}/pod{uid}"
    ns = cri.NamespaceOption(network=cri.NODE if host_network else cri.POD)
    return cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name=name, uid=uid, namespace=namespace),
        hostname="" if host_network else name, log_directory=os.path.join(logdir, name),
        labels={"app": name}, annotations=annotations or {},
        linux=cri.LinuxPodSandboxConfig(
            cgroup_parent=parent,
            security_context=cri.LinuxSandboxSecurityContext(namespace_options=ns)))


def container_config(name: str = "main", command: list[str] | None = None,
                     resources: cri.LinuxContainerResources | None = None) -> cri.ContainerConfig:
    return cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name=name),
        image=cri.ImageSpec(image=BUSYBOX_IMAGE),
        command=command or ["sleep", "3600"], log_path=f"{name}.log",
        linux=cri.LinuxContainerConfig(resources=resources or cri.LinuxContainerResources()))


class Cri:
    """Thin typed client over one socket."""

    def __init__(self, path: str) -> None:
        self.channel = grpc.insecure_channel("unix://" + path)
        self.rt = cri_grpc.RuntimeServiceStub(self.channel)
        self.img = cri_grpc.ImageServiceStub(self.channel)

    def run_pod(self, config: cri.PodSandboxConfig) -> str:
        return self.rt.RunPodSandbox(cri.RunPodSandboxRequest(config=config), timeout=60).pod_sandbox_id

    def create(self, pod_id: str, pod: cri.PodSandboxConfig, config: cri.ContainerConfig) -> str:
        return self.rt.CreateContainer(cri.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=config, sandbox_config=pod), timeout=60).container_id

    def start(self, cid: str) -> None:
        self.rt.StartContainer(cri.StartContainerRequest(container_id=cid), timeout=60)

    def run_container(self, pod_id: str, pod: cri.PodSandboxConfig, config: cri.ContainerConfig) -> str:
        cid = self.create(pod_id, pod, config)
        self.start(cid)
        return cid

    def remove_pod(self, pod_id: str) -> None:
        self.rt.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
        self.rt.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)

    def close(self) -> None:
        self.channel.close()


class FakeBackend:
    """A real gRPC server with scripted behaviour, for what containerd cannot show.

    Methods: any unary method echoes the request bytes and sends back the caller's
    metadata (initial: x-echo-*, trailing: x-trail); `/test.Probe/Big` (or a request b"BIG:<size>")
    returns `size` bytes; `/test.Probe/Slow` sleeps the number of ms in the request; `/test.Probe/Fail`
    (or any request b"FAIL") aborts with the rich status carried in grpc-status-details-bin; `/test.Probe/Chat`
    is a bidi stream echoing each message; GetContainerEvents streams three events.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.seen_metadata: list[tuple[tuple[str, str], ...]] = []
        self.seen_requests: list[tuple[str, bytes]] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(16), options=[
            ("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)])
        self.server.add_generic_rpc_handlers([_FakeHandler(self)])
        self.server.add_insecure_port("unix:" + path)

    def start(self) -> FakeBackend:
        self.server.start()
        return self

    def wait_for_call(self, method: str, timeout: float = 10.0) -> None:
        """Block until a call of method has reached this backend."""
        deadline = time.monotonic() + timeout
        while not any(m == method for m, _ in self.seen_requests):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{method} never reached the backend")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.stop(0).wait()


class _FakeHandler(grpc.GenericRpcHandler):
    def __init__(self, owner: FakeBackend) -> None:
        self.owner = owner

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        if method == "/runtime.v1.RuntimeService/GetContainerEvents":
            def events(request, context):
                for i in range(3):
                    yield cri.ContainerEventResponse(container_id=f"c{i}", created_at=i).SerializeToString()
            return grpc.unary_stream_rpc_method_handler(events)
        if method == "/test.Probe/Chat":
            def chat(requests, context):
                yield from requests
            return grpc.stream_stream_rpc_method_handler(chat)

        def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
            md = tuple(context.invocation_metadata())
            self.owner.seen_metadata.append(md)
            self.owner.seen_requests.append((method, request))  # before any scripted delay
            if method == "/test.Probe/Slow":
                time.sleep(int(request or b"0") / 1000)
                return b"slow-done"
            if method == "/test.Probe/Big":
                return b"x" * int(request)
            if request.startswith(b"BIG:"):
                return b"y" * int(request[4:])
            if method == "/test.Probe/Fail" or request == b"FAIL":
                context.abort_with_status(_RichStatus())
            context.send_initial_metadata(tuple((k, v) for k, v in md if k.startswith("x-echo")))
            context.set_trailing_metadata((("x-trail", "t1"), ("x-trail-bin", b"\x00\x01")))
            return request

        return grpc.unary_unary_rpc_method_handler(unary)


class _RichStatus(grpc.Status):
    code = grpc.StatusCode.FAILED_PRECONDITION
    details = "rich failure"
    trailing_metadata = (("grpc-status-details-bin", b"\x08\x09\x12\x0crich failure"),)


def slow_call_in_thread(channel: grpc.Channel, ms: int, timeout: float = 10) -> tuple[threading.Thread, dict]:
    """Start a FakeBackend /test.Probe/Slow call; the dict gets 'reply' or 'code' when it ends."""
    result: dict = {}

    def call() -> None:
        try:
            result["reply"] = channel.unary_unary("/test.Probe/Slow")(str(ms).encode(), timeout=timeout)
        except grpc.RpcError as err:
            result["code"] = err.code()

    t = threading.Thread(target=call, daemon=True)
    t.start()
    return t, result


def refused_create(via: Cri, workdir: Path, pods: list[str], annotations: dict[str, str]) -> grpc.RpcError:
    """CreateContainer in a new pod with these annotations, which the relay must refuse."""
    import pytest

    cfg = pod_config(qos="burstable", logdir=str(workdir / "logs"), annotations=annotations)
    pods.append(via.run_pod(cfg))
    with pytest.raises(grpc.RpcError) as info:
        via.create(pods[-1], cfg, container_config())
    return info.value


GUARANTEED_CPU = cri.LinuxContainerResources(cpu_shares=1024, cpu_quota=100000, cpu_period=100000,
                                             memory_limit_in_bytes=64 << 20)
SHARED = cri.LinuxContainerResources(cpu_shares=2)


class Pods:
    """Pods made through one client, all removed at the end."""

    def __init__(self, client: Cri, workdir: Path) -> None:
        self.client, self.workdir, self.ids = client, workdir, []

    def run(self, qos: str, resources: cri.LinuxContainerResources, command: list[str] | None = None,
            annotations: dict[str, str] | None = None) -> tuple[cri.PodSandboxConfig, str, str]:
        cfg = pod_config(qos=qos, logdir=str(self.workdir / "logs"))
        pod = self.client.run_pod(cfg)
        self.ids.append(pod)
        config = container_config(command=command, resources=resources)
        config.annotations.update(annotations or {})
        return cfg, pod, self.client.run_container(pod, cfg, config)

    def remove_all(self, direct: Cri | None = None) -> None:
        """Remove every pod made, through the runtime itself (direct) where the client's relay is gone:
        a pod left running holds its CPUs in the next test's relay."""
        for pod in self.ids:
            for client in (self.client, direct):
                if client is None:
                    continue
                try:
                    client.remove_pod(pod)
                    break
                except grpc.RpcError:
                    pass


def container_cgroup(direct: Cri, cid: str) -> tuple[str, str]:
    """(cgroup parent, name) of a container, as the runtime reports it (OSError once it is gone)."""
    try:
        st = direct.rt.ContainerStatus(cri.ContainerStatusRequest(container_id=cid, verbose=True), timeout=10)
    except grpc.RpcError as err:
        raise FileNotFoundError(f"container {cid}: {err.details()}") from err
    path = json.loads(st.info.get("info", "{}")).get("runtimeSpec", {}).get("linux", {}).get("cgroupsPath", "")
    return os.path.dirname(path), os.path.basename(path)


def live_cgroups(direct: Cri, states: tuple[int, ...], selector: dict[str, str] | None = None):
    """(container, (cgroup parent, name)) of each container in states, as the runtime reports them."""
    listed = direct.rt.ListContainers(cri.ListContainersRequest(filter=cri.ContainerFilter(
        label_selector=selector or {})), timeout=10).containers
    for c in listed:
        if c.state not in states:
            continue
        try:
            yield c, container_cgroup(direct, c.id)
        except OSError:
            continue  # removed meanwhile


def live_cpusets(direct: Cri, states: tuple[int, ...], selector: dict[str, str] | None = None):
    """(container, cgroup cpuset.cpus) of each container in states, read from the runtime and the cgroups
    (a container that has not been started has no cgroup yet, and is left out)."""
    for c, cgroup in live_cgroups(direct, states, selector):
        try:
            yield c, cgroup_cpus(*cgroup)
        except OSError:
            continue


def still_running(direct: Cri, ids: list[str]) -> bool:
    try:
        return all(direct.rt.ContainerStatus(cri.ContainerStatusRequest(container_id=cid), timeout=10).status.state
                   == cri.CONTAINER_RUNNING for cid in ids)
    except grpc.RpcError:
        return False


def shared_at_once(direct: Cri, holder: tuple[str, str], other: tuple[str, str]) -> CPUSet:
    """The holder's CPUs that the other container has too, read in an order that proves both ran on them
    together: the holder's cgroup, then the other's, then both still running (a container that runs
    was started, and a start waits until the others are off its CPUs)."""
    try:
        mine = cgroup_cpus(*holder)
        theirs = cgroup_cpus(*other)
    except OSError:
        return CPUSet()
    both = mine & theirs
    return both if both and still_running(direct, [holder[1], other[1]]) else CPUSet()


def watch_exclusive(socket: str, holds: Callable[[Any, CPUSet], bool], kind: Callable[[Any], str],
                    violations: list[str], stop: threading.Event) -> None:
    """Until stop: a CPU held exclusively (holds(container, its CPUs)) is never under another running
    container, not even for a moment; each pair seen sharing one is added to violations once."""
    direct = Cri(socket)
    reported: set[tuple[str, str]] = set()
    while not stop.is_set():
        try:
            running = {c.id: (c, cgroup) for c, cgroup in live_cgroups(direct, (cri.CONTAINER_RUNNING,))}
            cpus = {}
            for cid, (_, cgroup) in running.items():
                try:
                    cpus[cid] = cgroup_cpus(*cgroup)
                except OSError:
                    continue
            for hid in [cid for cid in cpus if holds(running[cid][0], cpus[cid])]:
                for oid in cpus:
                    pair = (hid, oid)
                    if oid == hid or pair in reported or not cpus[hid] & cpus[oid]:
                        continue
                    both = shared_at_once(direct, running[hid][1], running[oid][1])
                    if both:
                        reported.add(pair)
                        violations.append(f"CPU {both} held exclusively by {hid[:12]} and used by "
                                          f"{kind(running[oid][0])} container {oid[:12]} at once")
        except grpc.RpcError:
            pass  # containerd is down or frozen: nothing to see
        stop.wait(0.1)
    direct.close()


def resmgr_status(config_socket: str, timeout: float = 10) -> status_pb2.GetStatusReply:
    """cri-resmgr's status (configuration, policy, pods and containers it knows) from its config socket."""
    with grpc.insecure_channel("unix://" + config_socket) as ch:
        return status_pb2_grpc.StatusStub(ch).GetStatus(status_pb2.GetStatusRequest(), timeout=timeout)


def resources(milli: int, guaranteed: bool) -> cri.LinuxContainerResources:
    return cri.LinuxContainerResources(cpu_shares=milli_to_shares(milli),
                                       cpu_quota=milli * 100 if guaranteed else 0, cpu_period=100000,
                                       memory_limit_in_bytes=64 << 20 if guaranteed else 0)


class Link:
    """The agent's side of the config link, plus the status service."""

    def __init__(self, path: str) -> None:
        self.channel = grpc.insecure_channel("unix://" + path)
        self.config = api_pb2_grpc.ConfigStub(self.channel)
        self.status_stub = status_pb2_grpc.StatusStub(self.channel)

    def push(self, data: dict[str, str], node: str = "node-1") -> str:
        return self.config.SetConfig(api_pb2.SetConfigRequest(node_name=node, config=data), timeout=30).error

    def status(self) -> status_pb2.GetStatusReply:
        return self.status_stub.GetStatus(status_pb2.GetStatusRequest(), timeout=10)

    def close(self) -> None:
        self.channel.close()


def relay_with_link(workdir, containerd, *extra, relay_dir=None) -> tuple[RelayProcess, Link]:
    """A relay with its config link, and the agent's side of the link."""
    relay = RelayProcess(workdir, containerd.socket, "--config-socket", str(workdir / "cfg" / "config.sock"),
                         *extra, relay_dir=relay_dir).start()
    wait_socket(str(workdir / "cfg" / "config.sock"), proc=relay.proc)  # not the file a killed one left
    return relay, Link(str(workdir / "cfg" / "config.sock"))
