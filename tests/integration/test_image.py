"""The container image: built as the Containerfile describes it (scripts/build-image.py, no
container engine), run by a real containerd as the chart runs it: the agent and the webhook as an
unprivileged user on a read-only root file system, the NRI plugin as root with the host's files."""

from __future__ import annotations

import json
import tarfile
import time
import uuid
from pathlib import Path

import grpc
import pytest

from harness import productimage
from resmgr.generated.cri import api_pb2 as cri
from tests.support.helpers import ONLINE, Cri, Pods, cgroup_cpus, resources, wait_until

ROOT = Path(__file__).resolve().parents[2]


def test_the_local_build_reads_the_containerfiles_final_stage():
    b = productimage.builder()
    stage = b.final_stage((ROOT / "Containerfile").read_text())
    assert b.packages(stage) == ["python3"]
    assert any(c.startswith("useradd --system --uid 65532") for c in b.setup_commands(stage))
    args = b.config_args(stage)
    assert "--config.user=65532:65532" in args
    assert [a for a in args if a.startswith("--config.cmd=")] == ["--config.cmd=cri-resmgr", "--config.cmd=--help"]
    assert any(a.startswith("--config.env=PATH=/opt/cri-resmgr/venv/bin:") for a in args)


@pytest.fixture(scope="module")
def image(containerd):
    started = time.monotonic()
    archive = productimage.build()
    built = time.monotonic() - started
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        layers = [m for m in tar.getmembers() if m.name.startswith("blobs/") and m.size > 4096]
    assert [m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]] == \
        [productimage.builder().version()]
    name = productimage.load(archive, containerd.socket)
    print(f"image {name}: {archive.stat().st_size / 1e6:.0f} MB archived, "
          f"{sum(m.size for m in layers) / 1e6:.0f} MB of compressed layers, built in {built:.0f} s")
    return name


def sandbox(name: str, privileged: bool = False) -> cri.PodSandboxConfig:
    uid = uuid.uuid4().hex
    ns = cri.NamespaceOption(network=cri.NODE, pid=cri.CONTAINER, ipc=cri.POD)
    return cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name=name, uid=uid, namespace="kube-system"),
        log_directory=f"/tmp/crirm-test-logs/{name}-{uid}",
        linux=cri.LinuxPodSandboxConfig(cgroup_parent=f"/kubepods/besteffort/pod{uid}",
                                        security_context=cri.LinuxSandboxSecurityContext(
                                            namespace_options=ns, privileged=privileged)))


def run_once(client: Cri, image: str, command: list[str], timeout: float = 60) -> tuple[int, str]:
    """Run command in the image as the chart runs the agent (its user, a read-only root, no
    capabilities, no privilege escalation); its exit code and output."""
    pod = sandbox("image-check")
    pod_id = client.run_pod(pod)
    try:
        config = cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name="check"), image=cri.ImageSpec(image=image),
            command=command, log_path="check.log",
            linux=cri.LinuxContainerConfig(security_context=cri.LinuxContainerSecurityContext(
                readonly_rootfs=True, no_new_privs=True,
                capabilities=cri.Capability(drop_capabilities=["ALL"]))))
        cid = client.run_container(pod_id, pod, config)
        status = wait_until(lambda: (s := client.rt.ContainerStatus(cri.ContainerStatusRequest(container_id=cid),
                                                                    timeout=10).status).state == cri.CONTAINER_EXITED
                            and s, timeout=timeout, what=f"{command} to exit")
        return status.exit_code, Path(status.log_path).read_text()
    finally:
        client.remove_pod(pod_id)


def test_the_image_runs_as_an_unprivileged_user_without_compilers(containerd, image):
    client = Cri(containerd.socket)
    try:
        code, out = run_once(client, image, [
            "sh", "-c", "id -u; id -g; cri-resmgr-agent --help >/dev/null && cri-resmgr-webhook --help >/dev/null "
            "&& cri-resmgr --help >/dev/null && echo helps; "
            "python3 -c 'import resmgr.app.daemon, resmgr.agent.main, resmgr.webhook.main; print(\"imports\")'; "
            "for t in gcc cc g++ make pip pip3 apt-get; do command -v $t; done; "
            "touch /opt/x 2>/dev/null || echo read-only"])
    finally:
        client.close()
    lines = [line.split(" ", 3)[-1] for line in out.splitlines()]  # CRI log lines: time stream tag text
    assert code == 0, out
    assert lines == ["65532", "65532", "helps", "imports", "/usr/bin/apt-get", "read-only"], lines


@pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs")
def test_the_nri_plugin_runs_from_the_image_and_places_containers(containerd, image, workdir):
    """The chart's NRI DaemonSet container, made through the CRI: root, the host's sysfs read-only,
    its cgroups, the NRI socket and a state directory; a Guaranteed container made afterwards gets
    an exclusive CPU."""
    state, sockets = workdir / "state", workdir / "sockets"
    state.mkdir()
    sockets.mkdir()
    (workdir / "config.yaml").write_text("policy:\n  Active: static\n")
    nri_dir = str(Path(containerd.socket).parent)
    client = Cri(containerd.socket)
    pods = Pods(client, workdir)
    pod = sandbox("cri-resmgr-nri", privileged=True)
    pod_id = client.run_pod(pod)
    try:
        config = cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name="cri-resmgr"), image=cri.ImageSpec(image=image),
            command=["cri-resmgr", "--nri", f"--nri-socket={nri_dir}/nri.sock", "--state-dir=/var/lib/cri-resmgr",
                     "--config-socket=/var/run/cri-resmgr/cri-resmgr-config.sock", "--host-root=/host",
                     "--resctrl-path=/host/sys/fs/resctrl", "--force-config=/etc/cri-resmgr/config.yaml",
                     "--hook-dir=disabled"],
            log_path="plugin.log",
            mounts=[cri.Mount(container_path=nri_dir, host_path=nri_dir),
                    cri.Mount(container_path="/var/lib/cri-resmgr", host_path=str(state)),
                    cri.Mount(container_path="/var/run/cri-resmgr", host_path=str(sockets)),
                    cri.Mount(container_path="/etc/cri-resmgr/config.yaml", host_path=str(workdir / "config.yaml"),
                              readonly=True),
                    cri.Mount(container_path="/host/sys", host_path="/sys", readonly=True),
                    cri.Mount(container_path="/host/sys/fs", host_path="/sys/fs")],
            linux=cri.LinuxContainerConfig(security_context=cri.LinuxContainerSecurityContext(
                privileged=True, run_as_user=cri.Int64Value(value=0), readonly_rootfs=True)))
        plugin = client.run_container(pod_id, pod, config)
        log = Path(pod.log_directory) / "plugin.log"
        try:
            wait_until(lambda: log.exists() and "NRI: synchronized" in log.read_text(), timeout=60,
                       what="the plugin from the image to register with containerd")
            g_cfg, _, g = pods.run("guaranteed", resources(1000, True))
            b_cfg, _, b = pods.run("burstable", resources(200, False))
            mine = cgroup_cpus(g_cfg, g)
            assert len(mine) == 1 and cgroup_cpus(b_cfg, b) == ONLINE - mine
            assert json.loads((state / "cache").read_text())["policy"]["name"] == "static"
        except BaseException:
            print(log.read_text()[-3000:] if log.exists() else "no plugin log")
            raise
        # A DaemonSet pod's end: SIGTERM, and the plugin leaves at once rather than after the grace period.
        started = time.monotonic()
        client.rt.StopContainer(cri.StopContainerRequest(container_id=plugin, timeout=20), timeout=60)
        assert time.monotonic() - started < 15 and "shutting down" in log.read_text(), log.read_text()[-1500:]
    finally:
        pods.remove_all()
        try:
            client.remove_pod(pod_id)
        except grpc.RpcError:
            pass
        client.close()
