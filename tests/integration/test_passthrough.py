"""Pass-through calls against the real containerd: the relay must be invisible."""

from __future__ import annotations

import time

import grpc
import pytest

from harness.images import BUSYBOX_IMAGE, PAUSE_IMAGE
from resmgr.generated.cri import api_pb2 as cri
from tests.support.helpers import container_config, pod_config


def outcome(fn, *args, **kw):
    """(code, details) of a call, or ('OK', reply)."""
    try:
        return "OK", fn(*args, **kw)
    except grpc.RpcError as err:
        return err.code().name, err.details()


def test_version_status_and_images_match(direct, via):
    assert via.rt.Version(cri.VersionRequest()) == direct.rt.Version(cri.VersionRequest())
    assert via.rt.Status(cri.StatusRequest()).status == direct.rt.Status(cri.StatusRequest()).status
    d_images = direct.img.ListImages(cri.ListImagesRequest())
    # containerd lists images in map order, which differs from call to call.
    v_images = via.img.ListImages(cri.ListImagesRequest())
    assert sorted(i.SerializeToString() for i in v_images.images) == \
        sorted(i.SerializeToString() for i in d_images.images)
    tags = {t for i in d_images.images for t in i.repo_tags}
    assert {BUSYBOX_IMAGE, PAUSE_IMAGE} <= tags
    req = cri.ImageStatusRequest(image=cri.ImageSpec(image=BUSYBOX_IMAGE), verbose=True)
    assert via.img.ImageStatus(req) == direct.img.ImageStatus(req)
    missing = cri.ImageStatusRequest(image=cri.ImageSpec(image="localhost/no/such:image"))
    assert via.img.ImageStatus(missing) == direct.img.ImageStatus(missing)
    fs_direct = direct.img.ImageFsInfo(cri.ImageFsInfoRequest())
    fs_via = via.img.ImageFsInfo(cri.ImageFsInfoRequest())
    assert [f.fs_id for f in fs_via.image_filesystems] == [f.fs_id for f in fs_direct.image_filesystems]


@pytest.mark.parametrize("method,request_msg", [
    ("ContainerStatus", cri.ContainerStatusRequest(container_id="no-such-container")),
    ("PodSandboxStatus", cri.PodSandboxStatusRequest(pod_sandbox_id="no-such-pod")),
    ("StartContainer", cri.StartContainerRequest(container_id="no-such-container")),
    ("StopContainer", cri.StopContainerRequest(container_id="no-such-container")),
    ("UpdateContainerResources", cri.UpdateContainerResourcesRequest(
        container_id="no-such-container", linux=cri.LinuxContainerResources(cpu_shares=512))),
    ("CreateContainer", cri.CreateContainerRequest(pod_sandbox_id="no-such-pod",
                                                   config=container_config("x"))),
    ("ExecSync", cri.ExecSyncRequest(container_id="no-such-container", cmd=["true"])),
])
def test_errors_reach_caller_unchanged(direct, via, method, request_msg):
    d = outcome(getattr(direct.rt, method), request_msg, timeout=10)
    v = outcome(getattr(via.rt, method), request_msg, timeout=10)
    # containerd 2.x answers StopContainer of an unknown container with success (CRI: idempotent).
    assert d[0] != "OK" or method == "StopContainer"
    assert v == d


def test_malformed_passthrough_request_gets_the_runtime_answer(containerd, relay):
    path = "/runtime.v1.RuntimeService/ContainerStatus"
    garbage = b"\xff\xff\xff\xff\x0f"
    with grpc.insecure_channel("unix://" + containerd.socket) as d, relay.channel() as v:
        d_out = outcome(d.unary_unary(path), garbage, timeout=10)
        v_out = outcome(v.unary_unary(path), garbage, timeout=10)
    assert v_out == d_out


@pytest.mark.parametrize("method", ["CreateContainer", "RunPodSandbox", "StopContainer"])
def test_malformed_lifecycle_request_is_refused(relay, method):
    with relay.channel() as v:
        code, details = outcome(v.unary_unary(f"/runtime.v1.RuntimeService/{method}"), b"\xff\xff\xff\xff\x0f",
                                timeout=10)
    assert code == "INVALID_ARGUMENT" and f"{method} request is not a valid protobuf message" in details


def test_lifecycle_request_with_text_that_is_not_utf8_never_reaches_the_runtime(direct, relay, tmp_path):
    cfg = pod_config(qos="guaranteed", logdir=str(tmp_path / "logs"))
    pod = direct.run_pod(cfg)
    try:
        req = cri.CreateContainerRequest(pod_sandbox_id=pod, config=container_config("bad"), sandbox_config=cfg)
        req.config.annotations["note"] = "MARKER"
        raw = req.SerializeToString().replace(b"MARKER", b"\xff\xfe\xc3\x28xx")
        with relay.channel() as v:
            code, details = outcome(v.unary_unary("/runtime.v1.RuntimeService/CreateContainer"), raw, timeout=10)
        assert code == "INVALID_ARGUMENT"
        assert "not UTF-8 in config.annotations[0].value" in details
        listed = direct.rt.ListContainers(cri.ListContainersRequest(filter=cri.ContainerFilter(pod_sandbox_id=pod)))
        assert list(listed.containers) == []
    finally:
        direct.remove_pod(pod)


def test_lifecycle_through_relay_matches_direct(direct, via, relay, tmp_path):
    for host_network in (True, False):
        pod = pod_config(host_network=host_network, logdir=str(tmp_path))
        pod_id = via.run_pod(pod)
        status = direct.rt.PodSandboxStatus(cri.PodSandboxStatusRequest(pod_sandbox_id=pod_id))
        assert status.status.state == cri.SANDBOX_READY
        if not host_network:
            assert status.status.network.ip.startswith("10.88.77."), status.status.network
        cid = via.run_container(pod_id, pod, container_config(command=["sh", "-c", "echo hello-log; sleep 3600"]))
        req = cri.ContainerStatusRequest(container_id=cid)
        assert via.rt.ContainerStatus(req) == direct.rt.ContainerStatus(req)
        assert via.rt.ContainerStatus(req).status.state == cri.CONTAINER_RUNNING
        out = via.rt.ExecSync(cri.ExecSyncRequest(container_id=cid, cmd=["echo", "exec-ok"], timeout=10))
        assert out.stdout == b"exec-ok\n" and out.exit_code == 0
        failing = via.rt.ExecSync(cri.ExecSyncRequest(container_id=cid, cmd=["sh", "-c", "exit 3"], timeout=10))
        assert failing.exit_code == 3
        log_file = tmp_path / pod.metadata.name / "main.log"
        deadline = time.monotonic() + 10
        while "hello-log" not in (log_file.read_text() if log_file.exists() else ""):
            assert time.monotonic() < deadline, "container log never appeared"
            time.sleep(0.05)
        listed = via.rt.ListContainers(cri.ListContainersRequest(
            filter=cri.ContainerFilter(pod_sandbox_id=pod_id)))
        assert [c.id for c in listed.containers] == [cid]
        via.rt.StopContainer(cri.StopContainerRequest(container_id=cid, timeout=1), timeout=30)
        via.rt.RemoveContainer(cri.RemoveContainerRequest(container_id=cid), timeout=30)
        via.remove_pod(pod_id)
        assert outcome(direct.rt.PodSandboxStatus, cri.PodSandboxStatusRequest(pod_sandbox_id=pod_id))[0] \
            == "NOT_FOUND"


def test_many_lifecycle_calls_on_one_connection(direct, via, tmp_path):
    # Calls answered by the relay alone must not upset the runtime's view of the
    # connection (gRPC servers GOAWAY clients whose pings come with no calls).
    pods = []
    try:
        for i in range(6):
            cfg = pod_config(f"many-{i}", logdir=str(tmp_path))
            pods.append(via.run_pod(cfg))
            via.run_container(pods[-1], cfg, container_config())
        listed = {p.id for p in direct.rt.ListPodSandbox(cri.ListPodSandboxRequest()).items}
        assert set(pods) <= listed
        names = [c.metadata.name for c in direct.rt.ListContainers(cri.ListContainersRequest()).containers
                 if c.pod_sandbox_id in pods]
        assert len(names) == 6  # each created exactly once
    finally:
        for p in pods:
            via.remove_pod(p)


def test_deadline_reaches_runtime_and_caller(direct, via, tmp_path):
    pod = pod_config(logdir=str(tmp_path))
    pod_id = via.run_pod(pod)
    try:
        cid = via.run_container(pod_id, pod, container_config())
        req = cri.ExecSyncRequest(container_id=cid, cmd=["sleep", "5"])
        started = time.monotonic()
        code, _ = outcome(via.rt.ExecSync, req, timeout=0.5)
        assert code == "DEADLINE_EXCEEDED"
        assert time.monotonic() - started < 2.0
    finally:
        via.remove_pod(pod_id)


def test_events_stream_is_relayed(direct, via, tmp_path):
    def first_event(client):
        stream = client.rt.GetContainerEvents(cri.GetEventsRequest(), timeout=20)
        return stream

    d_stream, v_stream = first_event(direct), first_event(via)
    pod = pod_config(logdir=str(tmp_path))
    pod_id = via.run_pod(pod)
    try:
        def next_or_error(stream):
            try:
                while True:  # the runtime is shared: skip what earlier tests' clean-up still reports
                    event = next(stream)
                    if event.pod_sandbox_status.id == pod_id:
                        return "OK", pod_id
            except grpc.RpcError as err:
                return err.code().name, err.details()

        d, v = next_or_error(d_stream), next_or_error(v_stream)
        assert v == d
        if d[0] == "OK":
            assert d[1] == pod_id
    finally:
        d_stream.cancel()
        v_stream.cancel()
        via.remove_pod(pod_id)


def test_separate_image_socket(containerd, direct, workdir, relay_mode):
    from tests.support.helpers import Cri, RelayProcess

    image_sock = workdir / "images.sock"
    image_sock.symlink_to(containerd.socket)  # another path to the image service
    relay = RelayProcess(workdir, containerd.socket, "--image-socket", str(image_sock),
                         "--relay-mode", relay_mode).start()
    via = Cri(relay.socket)
    try:
        req = cri.ImageStatusRequest(image=cri.ImageSpec(image=BUSYBOX_IMAGE))
        assert via.img.ImageStatus(req) == direct.img.ImageStatus(req)
        assert via.rt.Version(cri.VersionRequest()) == direct.rt.Version(cri.VersionRequest())
        assert f"images {image_sock}" in relay.log()
    finally:
        via.close()
        relay.stop()
