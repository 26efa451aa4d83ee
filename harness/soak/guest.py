"""The soak's node: the test VM set up as an operator sets up a production node - cri-resmgr from
the Debian package (the relay, or the NRI plugin), its agent as the package's unit with a
ServiceAccount token, the state directory on a small file system of its own (so that it can be
filled), kubelet - and the soak's own sampler beside them (harness/soak/sampler.py)."""

from __future__ import annotations

import json
import shlex
import threading
import time
from pathlib import Path

from harness.containerd import REQUIRE_CRI_RESMGR
from harness.kube import ControlPlane
from harness.vm import HOST_ADDRESS, Result, Vm
from harness.vmnode import CONTAINERD_SOCKET, NODE_NAME, RELAY_SOCKET, Kubelet, Node

HERE = Path(__file__).resolve().parent
STATE_IMG = "/var/lib/crirm-state.img"
STATE_DIR = "/var/lib/cri-resmgr"
STATE_SIZE_MB = 16
FILLER = f"{STATE_DIR}/.soak-fill"  # the sampler leaves it out of the directory's size
SAMPLES = "/var/log/crirm-soak/samples.jsonl"
AGENT_PORT = 6444  # the guest's port for the API server, through the host's counting proxy
SRC = "/opt/cri-resmgr/src"
PACKAGE = f"{SRC}/cri-resmgr.deb"
PREVIOUS = f"{SRC}/cri-resmgr-previous.deb"  # the previous release's package, where the host built it
DROPIN = "/etc/kubernetes/kubelet.conf.d/50-cri-resmgr.conf"  # the package's: kubelet on the relay
TOOLS = "/usr/local/lib/crirm-soak"  # the soak's own guest programs
ASIDE = ("/etc/systemd/system/cri-resmgr.service", "/etc/systemd/system/cri-resmgr-nri.service")
CONTAINERD_CONFIG = "/etc/containerd/config.toml"

SAMPLER_UNIT = f"""[Unit]
Description=the soak's sampler of container cgroups and daemon processes
After=local-fs.target

[Service]
ExecStart=/usr/bin/python3 {TOOLS}/sampler.py {SAMPLES} --interval 2
Restart=always
RestartSec=1
Nice=-5

[Install]
WantedBy=multi-user.target
"""
# Without dpkg's fsync of each of the package's 3,500 files: on the emulated disk they took minutes
# an install, and no fault strikes while dpkg unpacks.
DPKG_OPTIONS = "--force-confold --force-unsafe-io"


class Guest:
    """The node as the soak drives it."""

    def __init__(self, vm: Vm, mode: str) -> None:
        self.vm = vm
        self.mode = mode  # "relay" or "nri"
        self.node = Node(vm)
        self._lock = threading.Lock()
        self.kubelet: Kubelet | None = None

    @property
    def unit(self) -> str:
        return "cri-resmgr" if self.mode == "relay" else "cri-resmgr-nri"

    def run(self, command: str, timeout: float = 120.0) -> Result:
        return self.vm.run(command, timeout)

    def sh(self, command: str, timeout: float = 120.0) -> str:
        return self.vm.sh(command, timeout)

    def now(self) -> float:
        """The guest's clock (the sampler's timestamps are of it)."""
        return float(self.sh("date +%s.%N"))

    def inspect(self) -> dict:
        return json.loads(self.sh(f"/usr/bin/python3 {TOOLS}/inspect.py {self.unit}", timeout=120))

    # -- setting up -------------------------------------------------------------------------------
    def uninstall(self) -> None:
        """Back to a node with containerd alone (the package removed, the state directory's file system gone)."""
        self.sh("systemctl disable --now crirm-soak-sampler cri-resmgr-agent 2>/dev/null; "
                "dpkg -r cri-resmgr >/dev/null 2>&1; "
                f"for u in {' '.join(ASIDE)}; do [ -e $u.aside ] && mv $u.aside $u; done; "
                f"umount {STATE_DIR} 2>/dev/null; rm -rf {STATE_DIR} {STATE_IMG}; "
                f"sed -i '\\|{STATE_IMG}|d' /etc/fstab; systemctl daemon-reload; "
                f"if [ -e {CONTAINERD_CONFIG}.soak ]; then mv {CONTAINERD_CONFIG}.soak {CONTAINERD_CONFIG} && "
                "systemctl restart containerd; fi; true", timeout=300)

    def install(self, control: ControlPlane, fallback: str, kubelet_settings: dict[str, object],
                agent_options: str, daemon_options: str = "") -> None:
        """From a node that has only containerd (and maybe a kubelet) to one running the soak's stack."""
        began = time.monotonic()
        self.sh("systemctl disable --now kubelet cri-resmgr cri-resmgr-nri 2>/dev/null; "
                f"crictl --runtime-endpoint unix://{CONTAINERD_SOCKET} rmp -af >/dev/null 2>&1; "
                "rm -rf /var/log/crirm-soak; true", timeout=300)
        self.uninstall()
        self._took("cleared", began)
        # The checkout's own units give way to the package's.
        self.sh(f"for u in {' '.join(ASIDE)}; do [ -e $u ] && mv $u $u.aside; done; systemctl daemon-reload")
        # The state directory on a file system of its own, as a node with a separate /var would have.
        self.sh(f"truncate -s {STATE_SIZE_MB}M {STATE_IMG} && mkfs.ext4 -q -F -m 0 {STATE_IMG} && "
                f"mkdir -p {STATE_DIR} && echo '{STATE_IMG} {STATE_DIR} ext4 loop,noatime 0 0' >> /etc/fstab && "
                f"systemctl daemon-reload && mount {STATE_DIR} && chmod 700 {STATE_DIR}")
        for name in ("sampler.py", "inspect.py"):
            self.vm.write(f"{TOOLS}/{name}", (HERE / name).read_text())
        self.vm.write("/etc/systemd/system/crirm-soak-sampler.service", SAMPLER_UNIT)
        self.sh("systemctl daemon-reload && systemctl enable --now crirm-soak-sampler")
        self.vm.write("/etc/cri-resmgr/fallback.yaml", fallback)
        self.vm.write("/etc/default/cri-resmgr", "KUBELET_CONFIG_DIR=/etc/kubernetes/kubelet.conf.d\n"
                      f"CRI_RESMGR_OPTIONS=\"{daemon_options}\"\n")  # as configuration management would
        self.kubelet = Kubelet(self.node, control)
        # kubelet first (on containerd), as on a node that runs already; the package moves it to the relay.
        self.kubelet.start(CONTAINERD_SOCKET, **kubelet_settings)
        self._took("kubelet ready", began)
        self.sh(f"dpkg -i {DPKG_OPTIONS} {PACKAGE}", timeout=300)
        if self.mode == "nri":  # the package's other unit, kubelet back on containerd, which waits for it
            self.sh(f"[ -e {CONTAINERD_CONFIG}.soak ] || cp {CONTAINERD_CONFIG} {CONTAINERD_CONFIG}.soak; "
                    f"cp {CONTAINERD_CONFIG}.soak {CONTAINERD_CONFIG} && "
                    f"printf '%s' '{REQUIRE_CRI_RESMGR}' >> {CONTAINERD_CONFIG} && systemctl restart containerd")
            self.sh(f"rm -f {DROPIN} && "
                    "systemctl disable --now cri-resmgr && systemctl enable --now cri-resmgr-nri && "
                    "systemctl restart kubelet")
        self._took("package installed", began)
        self._agent(control, agent_options)
        self.kubelet.wait_ready()
        self._took("agent started", began)

    @staticmethod
    def _took(step: str, began: float) -> None:
        print(f"soak: install: {step} after {time.monotonic() - began:.0f} s", flush=True)

    def _agent(self, control: ControlPlane, options: str) -> None:
        """The package's agent unit, with a ServiceAccount token of the chart's RBAC, reaching the API
        server through the host's counting proxy."""
        token = control.token("kube-system", "cri-resmgr-agent", seconds=24 * 3600)
        self.vm.write("/etc/cri-resmgr/ca.crt", control.pki.ca.read_bytes())
        kubeconfig = {
            "apiVersion": "v1", "kind": "Config", "current-context": "agent",
            "clusters": [{"name": "soak", "cluster": {
                "server": f"https://{HOST_ADDRESS}:{AGENT_PORT}", "tls-server-name": "localhost",
                "certificate-authority": "/etc/cri-resmgr/ca.crt"}}],
            "users": [{"name": "agent", "user": {"token": token}}],
            "contexts": [{"name": "agent", "context": {"cluster": "soak", "user": "agent"}}]}
        self.vm.write("/etc/cri-resmgr/agent.kubeconfig", json.dumps(kubeconfig))
        self.vm.write("/etc/default/cri-resmgr-agent", "KUBECONFIG=/etc/cri-resmgr/agent.kubeconfig\n"
                      f"NODE_NAME={NODE_NAME}\nAGENT_OPTIONS=\"{options}\"\n")
        self.sh("chmod 600 /etc/cri-resmgr/agent.kubeconfig && systemctl enable --now cri-resmgr-agent")

    def wait_serving(self, timeout: float = 120) -> None:
        """Until cri-resmgr serves: the relay's socket, or NRI synchronized since its last start."""
        if self.mode == "relay":
            self.sh(f"for i in $(seq {int(timeout * 5)}); do [ -S {RELAY_SOCKET} ] && exit 0; sleep 0.2; done; "
                    "exit 1", timeout=timeout + 30)
        else:
            self.sh(f"for i in $(seq {int(timeout * 5)}); do journalctl -u {self.unit} --no-pager "
                    "--since \"$(systemctl show -p ActiveEnterTimestamp --value cri-resmgr-nri)\" | "
                    "grep -q 'NRI: synchronized' && exit 0; sleep 0.2; done; exit 1", timeout=timeout + 30)

    # -- what the faults do -----------------------------------------------------------------------
    def has_previous(self) -> bool:
        return self.run(f"test -e {PREVIOUS}").code == 0

    def install_package(self, deb: str) -> str:
        """dpkg -i of a package over the one installed (an upgrade or a rollback), as an operator
        does it with pods running; returns the version that then runs."""
        self.sh(f"dpkg -i {DPKG_OPTIONS} {deb}", timeout=600)
        self.wait_serving()
        return self.sh("/usr/bin/cri-resmgr --version").strip()

    def running(self) -> str:
        """What runs: the relay's, the NRI plugin's and the agent's units' states, and kubelet's drop-in."""
        units = self.run("systemctl is-active cri-resmgr cri-resmgr-nri cri-resmgr-agent").out.split()
        dropin = self.run(f"test -e {DROPIN}").code == 0
        return f"relay {units[0]}, nri {units[1]}, agent {units[2]}, kubelet on {'relay' if dropin else 'containerd'}"

    def should_run(self) -> str:
        """What running() says on a node of this mode."""
        if self.mode == "relay":
            return "relay active, nri inactive, agent active, kubelet on relay"
        return "relay inactive, nri active, agent active, kubelet on containerd"

    def fill_state_fs(self) -> None:
        self.run(f"dd if=/dev/zero of={FILLER} bs=64k 2>/dev/null; sync", timeout=120)

    def free_state_fs(self) -> None:
        self.sh(f"rm -f {FILLER}; sync")

    def scope(self, cid: str) -> str:
        """The cgroup directory of a container."""
        path = self.sh(f"find /sys/fs/cgroup/kubepods.slice -type d -name cri-containerd-{cid}.scope | head -1").strip()
        if not path:
            raise RuntimeError(f"no cgroup of container {cid[:12]}")
        return path

    def set_mems(self, scope: str, mems: str) -> str:
        """Write a container's cpuset.mems in its cgroup behind everyone's back (the soak's planted
        violation); returns what to write back: what it held before, or where it held nothing (its
        parent's nodes: a policy that names none) the nodes it had in effect, since the kernel
        refuses an empty write."""
        before = self.sh(f"cat {scope}/cpuset.mems {scope}/cpuset.mems.effective; "
                         f"echo '{mems}' > {scope}/cpuset.mems").split("\n")
        return before[0].strip() or before[1].strip()

    def main_pid(self, unit: str) -> int:
        return int(self.sh(f"systemctl show -p MainPID --value {unit}").strip() or 0)

    def journal(self, unit: str, since: float) -> str:
        """The unit's journal from since on (to the second before: journalctl takes whole seconds, and
        rounding up would drop what was logged in since's own second)."""
        return self.run(f"journalctl -u {unit} --no-pager -o cat --since @{int(since)}").out

    def warnings(self, unit: str, since: float, until: float, most: int = 30) -> list[str]:
        """The unit's warnings and errors from since to until (its own log levels), the last most."""
        res = self.run(f"journalctl -u {unit} --no-pager -o cat --since @{int(since)} --until @{int(until) + 1} "
                       f"| grep -E ' (WARNING|ERROR|CRITICAL) ' | tail -n {most}", timeout=60)
        return [line[:400] for line in res.out.splitlines()]

    def lines_about(self, names: list[str], since: float, until: float | None = None, most: int = 40) -> list[str]:
        """kubelet's, containerd's and cri-resmgr's lines naming any of names (pods, claims, containers)
        from since (to until), the last most: what a step that did not end (a pod not gone, a claim not
        unprepared) is stuck on, or what led to a violation, since a CI run's journals are not kept."""
        patterns = " ".join(f"-e {shlex.quote(n)}" for n in names)
        upto = f" --until @{int(until) + 1}" if until is not None else ""
        res = self.run(f"journalctl -u kubelet -u containerd -u {self.unit} --no-pager -o short-precise "
                       f"--since @{int(since)}{upto} | grep -F {patterns} | tail -n {most}", timeout=120)
        return [line[:400] for line in res.out.splitlines()]

    def nri_journal(self, since: float) -> str:
        """containerd's lines of its starts, its creates (made without the plugin, or answered) and the
        plugin's synchronizations, from since on (`-o short-unix`: harness.soak.judge.nri_windows and
        away_windows read them)."""
        return self.run(f"journalctl -u containerd -u {self.unit} --no-pager -o short-unix --since @{int(since)} | "
                        "grep -E 'failed to handle CreateContainer request|NRI: synchronized|starting containerd"
                        "|returns container id'", timeout=120).out

    def update_journal(self, since: float) -> str:
        """containerd's lines of its UpdateContainerResources calls from since on (`-o short-unix`:
        harness.soak.judge.refused_windows reads them)."""
        return self.run(f"journalctl -u containerd --no-pager -o short-unix --since @{int(since)} | "
                        "grep -F 'UpdateContainerResources for'", timeout=120).out

    def tail(self, path: str, offset: int) -> bytes:
        """A file's bytes from offset on (at most 4 MB at a time)."""
        res = self.run(f"tail -c +{offset + 1} {path} 2>/dev/null | head -c 4194304")
        return res.out.encode()
