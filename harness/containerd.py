"""Start and stop a private containerd with the CRI plugin, for tests and demos.

Everything lives in one temporary directory: config, root, state, socket, CNI
config and logs. Facts behind the config: the sandbox lacks CAP_SYS_RESOURCE
(so restrict_oom_score_adj), there is no overlayfs need (native snapshotter),
and images are imported from locally built OCI archives.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import grpc

from harness import images
from resmgr.generated.cri import api_pb2 as cri
from resmgr.generated.cri import api_pb2_grpc as cri_grpc

CNI_BIN_DIR = "/usr/lib/cni"
CNI_SUBNET = "10.88.77.0/24"
# containerd's NRI default validator told to make no container while cri-resmgr is away, as
# docs/nri.md tells an operator who wants no container on CPUs cri-resmgr did not choose.
REQUIRE_CRI_RESMGR = """
[plugins."io.containerd.nri.v1.nri".default_validator]
  enable = true
  required_plugins = ["cri-resmgr"]
  tolerate_missing_plugins_annotation = "tolerate-missing-plugins.cri-resource-manager.intel.com"
"""
# scripts/setup.sh builds the pinned containerd, runc, crictl and critest and links them here.
TOOLS_BIN = Path(os.environ.get("CRI_RESMGR_CACHE", Path.home() / ".cache" / "cri-resmgr")) / "bin"
# Another containerd (and the ctr and shim next to it) for the harness: CRIRM_CONTAINERD=/path.
CONTAINERD_ENV = "CRIRM_CONTAINERD"
RUNC_ENV = "CRIRM_RUNC"

# What every containerd version reads the same way: private root, state and sockets.
_HEAD = """\
version = {version}
root = "{root}"
state = "{state}"

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[debug]
  level = "info"
"""

# containerd 2.x (config version 3): the CRI plugin is split into images and runtime parts.
# runc's state root is private too, so this containerd shares nothing with another one.
CONFIG_V3 = _HEAD + """\

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "native"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{dir}/registries"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause}"

# ctr's image import goes through the transfer service, which unpacks only for listed snapshotters.
[[plugins."io.containerd.transfer.v1.local".unpack_config]]
  platform = "{platform}"
  snapshotter = "native"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  # CDI specs (a DRA driver's devices) from a directory of this containerd's own.
  cdi_spec_dirs = ["{dir}/cdi"]
  enable_unprivileged_ports = false
  enable_unprivileged_icmp = false
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{state}/runc"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.nri.v1.nri"]
  disable = false
  disable_connections = false
  socket_path = "{dir}/nri.sock"
  plugin_path = "{dir}/nri-plugins"
  plugin_config_path = "{dir}/nri-conf"
"""

# containerd 1.6 and 1.7 (config version 2), for CRIRM_CONTAINERD pointing at one.
CONFIG_V2 = _HEAD + """\

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_unprivileged_ports = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{state}/runc"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{dir}/registries"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
"""

CNI_CONFLIST = """\
{{
  "cniVersion": "0.4.0",
  "name": "cri-resmgr-test",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "{bridge}",
      "isGateway": true,
      "ipMasq": false,
      "ipam": {{
        "type": "host-local",
        "ranges": [[{{"subnet": "{subnet}"}}]],
        "dataDir": "{ipam_dir}"
      }}
    }},
    {{"type": "portmap", "capabilities": {{"portMappings": true}}}},
    {{"type": "loopback"}}
  ]
}}
"""


def tool(name: str) -> str:
    """Path of a harness binary: next to CRIRM_CONTAINERD if set, else the one setup built."""
    if name == "runc" and os.environ.get(RUNC_ENV):
        return os.environ[RUNC_ENV]
    chosen = os.environ.get(CONTAINERD_ENV)
    if chosen:
        if name == "containerd":
            return chosen
        beside = Path(chosen).parent / name
        return str(beside) if beside.exists() else (shutil.which(name) or str(beside))
    return str(TOOLS_BIN / name)


def missing_tools() -> list[str]:
    missing = [tool(b) for b in ("containerd", "containerd-shim-runc-v2", "ctr", "runc")
               if not os.access(tool(b), os.X_OK)]
    if not Path(CNI_BIN_DIR, "bridge").exists():
        missing.append(f"{CNI_BIN_DIR}/bridge (containernetworking-plugins)")
    return missing


def containerd_version(binary: str | None = None) -> tuple[int, ...]:
    """(major, minor, patch) of a containerd binary, from `containerd --version`."""
    out = subprocess.run([binary or tool("containerd"), "--version"], capture_output=True,
                         text=True, check=True).stdout
    for word in out.split():
        parts = word.lstrip("v").split("+")[0].split("~")[0].split("-")[0].split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts[:3]):
            return tuple(int(p) for p in parts[:3])
    raise RuntimeError(f"cannot read containerd's version from {out!r}")


class PrivateContainerd:
    """A containerd process owned by the caller, with its own temporary tree."""

    def __init__(self, workdir: str | Path | None = None, subnet: str = CNI_SUBNET, bridge: str = "crirm0",
                 extra_config: str = "") -> None:
        """subnet, bridge: its pods' network; containerds running at once need their own (each has
        an address allocator of its own, and a bridge holds one subnet). extra_config: TOML added
        to its configuration (tables of its own, e.g. the NRI default validator's)."""
        self._own_dir = workdir is None
        self.extra_config = extra_config
        self.subnet, self.bridge = subnet, bridge
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="crirm-ctrd-"))
        self.socket = str(self.dir / "containerd.sock")
        self.cdi_dir = self.dir / "cdi"
        self.log_path = self.dir / "containerd.log"
        self.proc: subprocess.Popen | None = None
        self._imported = False
        self.version = containerd_version() if not missing_tools() else (0,)

    # -- lifecycle ---------------------------------------------------------
    def start(self, timeout: float = 30.0) -> PrivateContainerd:
        missing = missing_tools()
        if missing:
            raise RuntimeError("containerd test harness needs: " + ", ".join(missing)
                               + " (run scripts/setup.sh)")
        archives = images.build_all()
        cni_conf = self.dir / "cni"
        cni_conf.mkdir(parents=True, exist_ok=True)
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-cri-resmgr-test.conflist").write_text(
            CNI_CONFLIST.format(subnet=self.subnet, bridge=self.bridge, ipam_dir=self.dir / "ipam"))
        config = self.dir / "config.toml"
        template, version = (CONFIG_V3, 3) if self.version >= (2,) else (CONFIG_V2, 2)
        config.write_text(template.format(
            version=version, dir=self.dir, root=self.dir / "root", state=self.dir / "state", socket=self.socket,
            pause=images.PAUSE_IMAGE, platform=images.PLATFORM, runc=tool("runc"), cni_bin=CNI_BIN_DIR,
            cni_conf=cni_conf) + self.extra_config)
        # containerd finds its shim on PATH: the one next to the chosen containerd comes first.
        env = dict(os.environ, PATH=f"{Path(tool('containerd')).parent}:{os.environ.get('PATH', '')}")
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([tool("containerd"), "--config", str(config)], stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True, env=env)
        log.close()
        self._wait_ready(timeout)
        if not self._imported:  # a restart finds them in its root
            for name, archive in archives.items():
                done = subprocess.run([tool("ctr"), "-a", self.socket, "-n", "k8s.io", "images",
                                       "import", "--snapshotter", "native", "--digests",
                                       "--platform", images.PLATFORM, str(archive)],
                                      capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"importing {archive} failed: {(done.stdout + done.stderr).strip()}")
                self._wait_image(name, timeout)
            self._imported = True
        return self

    def mirror(self, host: str, url: str) -> None:
        """Pull images of registry host from url instead (a plain-HTTP registry such as
        harness.registry); containerd reads this on every pull."""
        hosts = self.dir / "registries" / host
        hosts.mkdir(parents=True, exist_ok=True)
        (hosts / "hosts.toml").write_text(f'server = "https://{host}"\n\n[host."{url}"]\n'
                                          f'  capabilities = ["pull", "resolve"]\n')

    def kill(self) -> None:
        """SIGKILL containerd alone, as a crash would: its shims and containers keep running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self, timeout: float = 30.0) -> PrivateContainerd:
        """Start containerd again on the same root and state (after kill())."""
        self.kill()
        return self.start(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel("unix://" + self.socket) as ch:
            stub = cri_grpc.RuntimeServiceStub(ch)
            while True:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"containerd exited ({self.proc.returncode}); log: "
                                       + self.log_tail())
                try:
                    st = stub.Status(cri.StatusRequest(), timeout=1, wait_for_ready=True)
                    ready = {c.type: c.status for c in st.status.conditions}
                    if ready.get("RuntimeReady") and ready.get("NetworkReady"):
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("containerd did not become ready; log: " + self.log_tail())
                time.sleep(0.1)

    def _wait_image(self, name: str, timeout: float) -> None:
        # The CRI plugin learns about imported images asynchronously.
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel("unix://" + self.socket) as ch:
            stub = cri_grpc.ImageServiceStub(ch)
            while not stub.ImageStatus(cri.ImageStatusRequest(image=cri.ImageSpec(image=name)),
                                       timeout=5).HasField("image"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"image {name} not visible to the CRI plugin")
                time.sleep(0.1)

    def remove_all_pods(self) -> None:
        """Stop and remove every pod, so no shim or runc state outlives us."""
        with grpc.insecure_channel("unix://" + self.socket) as ch:
            stub = cri_grpc.RuntimeServiceStub(ch)
            for pod in stub.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=10).items:
                try:
                    stub.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=pod.id), timeout=30)
                    stub.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=pod.id),
                                          timeout=30)
                except grpc.RpcError:
                    pass

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.remove_all_pods()
            except grpc.RpcError:
                pass
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self._kill_leftover_shims()
        if self._own_dir:
            subprocess.run(["umount", "-R", str(self.dir / "state")], capture_output=True)
            shutil.rmtree(self.dir, ignore_errors=True)

    def _kill_leftover_shims(self) -> None:
        for pid_dir in Path("/proc").iterdir():
            if not pid_dir.name.isdigit():
                continue
            try:
                cmdline = (pid_dir / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmdline and cmdline[0].endswith(b"containerd-shim-runc-v2") and \
                    self.socket.encode() in b" ".join(cmdline):
                try:
                    os.kill(int(pid_dir.name), signal.SIGKILL)
                except OSError:
                    pass

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> PrivateContainerd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
