"""A Kubernetes on loopback, for tests: etcd, kube-apiserver and kubelets, and on request
kube-controller-manager and kube-scheduler.

All are real processes of the pinned releases (scripts/build-runtime.sh), each with its own
directory, ports and certificates made at start. The API server runs with RBAC and the Node
authorizer; the kubelet authenticates with a node certificate, a test client with an admin one,
and the agent with a ServiceAccount token. Without the controllers (most tests) pods name their
node, and the one object a controller would make that pods need (a namespace's default
ServiceAccount) the harness makes itself; with them (ControlPlane(controllers=True)) DaemonSets,
Deployments and the scheduler work as in a cluster. There is no kube-proxy: Services have no
ClusterIP routing (webhooks are called at their endpoints; pods that need the API server use the
host's network and its loopback address).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import itertools
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client, config

from harness.containerd import TOOLS_BIN
from harness.images import BUSYBOX_IMAGE
from harness.relay import free_port

SERVICE_RANGE = "10.0.0.0/24"
_KUBELETS = itertools.count()
LEGACY_LOGS = Path("/var/log/containers")
# cgroup v1 hierarchies (the kubelet checks that its cgroup root exists in each); cgroup v2 has one.
CGROUP_CONTROLLERS = ("",) if Path("/sys/fs/cgroup/cgroup.controllers").exists() else tuple(sorted(
    p.name for p in Path("/sys/fs/cgroup").iterdir() if p.is_dir() and p.name != "unified" and not p.is_symlink()))
ISSUER = "https://kubernetes.default.svc.cluster.local"


def missing_tools() -> list[str]:
    return [str(TOOLS_BIN / b) for b in ("etcd", "kube-apiserver", "kubelet", "kube-controller-manager",
                                         "kube-scheduler") if not os.access(TOOLS_BIN / b, os.X_OK)]


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


class Pki:
    """A private CA and the certificates it signs, as PEM files in one directory."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cri-resmgr test CA")])
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                      .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                      .not_valid_before(now - datetime.timedelta(minutes=5))
                      .not_valid_after(now + datetime.timedelta(days=2))
                      .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                      .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                   content_commitment=False, key_encipherment=False,
                                                   data_encipherment=False, key_agreement=False,
                                                   encipher_only=False, decipher_only=False), critical=True)
                      .sign(self._key, hashes.SHA256()))
        self.ca = self.dir / "ca.crt"
        self.ca.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, stem: str, common_name: str, orgs: tuple[str, ...] = (),
              hosts: tuple[str, ...] = ()) -> tuple[Path, Path]:
        """A certificate (client, and server for hosts if any) and its key: (crt, key) paths."""
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        now = datetime.datetime.now(datetime.UTC)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if hosts else [])
        builder = (x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(self._cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if hosts:
            names: list[x509.GeneralName] = []
            for h in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    names.append(x509.DNSName(h))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        crt, key_path = self.dir / f"{stem}.crt", self.dir / f"{stem}.key"
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(_key_pem(key))
        return crt, key_path

    def signing_key(self, stem: str) -> tuple[Path, Path]:
        """A bare key pair (the ServiceAccount token signer): (private, public) paths."""
        key = ec.generate_private_key(ec.SECP256R1())
        priv, pub = self.dir / f"{stem}.key", self.dir / f"{stem}.pub"
        priv.write_bytes(_key_pem(key))
        pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo))
        return priv, pub


def host_address() -> str:
    """An IPv4 address of this machine other than loopback, which the API server refuses in endpoints:
    the source of the default route, else the first global one."""
    route = json.loads(subprocess.run(["ip", "-j", "-4", "route", "get", "192.0.2.255"], capture_output=True,
                                      text=True).stdout or "[]")
    if route and route[0].get("prefsrc"):
        return route[0]["prefsrc"]
    for link in json.loads(subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True).stdout):
        for addr in link.get("addr_info", []):
            if addr.get("scope") == "global":
                return addr["local"]
    raise RuntimeError("no IPv4 address other than loopback")


def write_kubeconfig(path: Path, server: str, ca: Path, user: dict[str, str]) -> Path:
    """A kubeconfig for one user: {client-certificate, client-key} or {token}."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}]}))
    return path


# SIGKILL when the test process dies, however it dies, so no kubelet or API server outlives a
# killed test run. util-linux's setpriv sets it and execs the program: no Python code may run
# between fork and exec (a preexec_fn does), since gRPC's fork handlers in a test process with
# gRPC threads can abort the child there.
DIE_WITH_PARENT = ["setpriv", "--pdeathsig", "KILL", "--"]


class Process:
    """A child process with its log in a file; killed with its process group."""

    def __init__(self, name: str, args: list[str], log: Path) -> None:
        self.name, self.args, self.log_path = name, args, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([*DIE_WITH_PARENT, *self.args], stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()[-4000:]}")


def _wait(what: str, ready: Any, proc: Process, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        proc.check()
        try:
            if ready():
                return
        except Exception:  # not up yet: refused, TLS not ready, 5xx
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {timeout}s:\n{proc.log()[-4000:]}")
        time.sleep(0.2)


# Every controller but node IPAM (the CNI plugin hands out pod addresses) and certificate signing.
ALL_CONTROLLERS = "*,-nodeipam,-csrsigning,-bootstrapsigner,-tokencleaner"


class ControlPlane:
    """etcd and kube-apiserver (RBAC, Node authorizer), and an admin client of it."""

    def __init__(self, workdir: Path | None = None, controllers: bool = False, gates: str = "") -> None:
        """gates: feature gates (A=true,B=false) of the API server, controller manager and scheduler."""
        self._own = workdir is None
        self.gates = [f"--feature-gates={gates}"] if gates else []
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="crirm-k8s-"))
        self.pki = Pki(self.dir / "pki")
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        etcd_client, etcd_peer = free_port(), free_port()
        self.etcd = Process("etcd", [
            str(TOOLS_BIN / "etcd"), "--name", "test", "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{etcd_client}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_client}",
            "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-cluster", f"test=http://127.0.0.1:{etcd_peer}",
            "--unsafe-no-fsync", "--log-level", "warn"], self.dir / "etcd.log")
        crt, key = self.pki.issue("apiserver", "kube-apiserver", hosts=("127.0.0.1", "localhost"))
        to_kubelet = self.pki.issue("apiserver-kubelet", "kube-apiserver-kubelet-client", ("system:masters",))
        sa_key, sa_pub = self.pki.signing_key("service-accounts")
        audit_policy = self.dir / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump({"apiVersion": "audit.k8s.io/v1", "kind": "Policy",
                                                "omitStages": ["RequestReceived"], "rules": [{"level": "Metadata"}]}))
        self.audit_log = self.dir / "audit.log"
        self.apiserver = Process("kube-apiserver", [
            str(TOOLS_BIN / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{etcd_client}",
            "--bind-address=127.0.0.1", f"--secure-port={self.port}", "--advertise-address=127.0.0.1",
            # The "kubernetes" Service's endpoints: loopback addresses are refused there.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={self.dir / 'apiserver'}", f"--tls-cert-file={crt}", f"--tls-private-key-file={key}",
            f"--client-ca-file={self.pki.ca}", f"--kubelet-client-certificate={to_kubelet[0]}",
            f"--kubelet-client-key={to_kubelet[1]}", "--kubelet-preferred-address-types=InternalIP",
            f"--service-account-issuer={ISSUER}", f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}", f"--service-cluster-ip-range={SERVICE_RANGE}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            # As kubeadm sets it: node agents (cri-resmgr's NRI DaemonSet among them) run privileged.
            "--allow-privileged=true",
            # Webhooks are called at a Service's endpoints, as without kube-proxy there is no ClusterIP.
            "--enable-aggregator-routing=true", "--profiling=false", "--v=1",
            # Every request, who made it and its answer: what the tests check least privilege with.
            f"--audit-policy-file={audit_policy}", f"--audit-log-path={self.audit_log}",
            "--audit-log-mode=blocking", *self.gates], self.dir / "apiserver.log")
        self._admin = tuple(map(str, self.pki.issue("admin", "admin", ("system:masters",))))
        self.admin_kubeconfig = write_kubeconfig(self.dir / "admin.kubeconfig", self.server, self.pki.ca,
                                                 {"client-certificate": self._admin[0], "client-key": self._admin[1]})
        self._api: client.ApiClient | None = None
        self.controllers: list[Process] = self._controllers() if controllers else []

    def _controllers(self, which: str = ALL_CONTROLLERS) -> list[Process]:
        """kube-controller-manager running `which` controllers (its root CA is what pods'
        kube-root-ca.crt holds) and kube-scheduler, both as admin, without leader election or a
        serving port."""
        scheduler_config = self.scheduler_config("scheduler")
        sa_key = self.dir / "pki" / "service-accounts.key"
        return [
            Process("kube-controller-manager", [
                str(TOOLS_BIN / "kube-controller-manager"), f"--kubeconfig={self.admin_kubeconfig}",
                f"--root-ca-file={self.pki.ca}", f"--service-account-private-key-file={sa_key}",
                "--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=false",
                f"--controllers={which}",
                "--v=1", *self.gates], self.dir / "controller-manager.log"),
            Process("kube-scheduler", [
                str(TOOLS_BIN / "kube-scheduler"), f"--config={scheduler_config}", "--secure-port=0", "--v=1",
                *self.gates], self.dir / "scheduler.log"),
        ]

    def scheduler_config(self, name: str, **settings: Any) -> Path:
        """A kube-scheduler configuration file: as admin, without leader election, and settings."""
        path = self.dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(self.admin_kubeconfig)},
            "leaderElection": {"leaderElect": False}, **settings}))
        return path

    def start(self, timeout: float = 90) -> ControlPlane:
        if not self.etcd.alive():
            self.etcd.start()
        self.start_apiserver(timeout)
        self._start_controllers(timeout)
        return self

    def _start_controllers(self, timeout: float) -> None:
        for p in self.controllers:
            p.start()
        if self.controllers:  # up once the controller manager has published the cluster's CA
            _wait("kube-controller-manager", lambda: self.core().read_namespaced_config_map(
                "kube-root-ca.crt", "kube-system", _request_timeout=5), self.controllers[0], timeout)
            self.controllers[1].check()

    def start_controllers(self, which: str = ALL_CONTROLLERS, timeout: float = 90) -> None:
        """kube-controller-manager (running `which` controllers) and kube-scheduler on a control
        plane started without them."""
        if not self.controllers:
            self.controllers = self._controllers(which)
            self._start_controllers(timeout)

    def stop_controllers(self) -> None:
        for p in self.controllers:
            p.stop()
        self.controllers = []

    def start_apiserver(self, timeout: float = 90) -> None:
        self.apiserver.start()
        _wait("kube-apiserver", lambda: self.get("/readyz") == b"ok", self.apiserver, timeout)

    def get(self, path: str) -> bytes:
        """GET a path of the API server as admin (the body; HTTPError unless 2xx)."""
        ctx = ssl.create_default_context(cafile=str(self.pki.ca))
        ctx.load_cert_chain(*self._admin)
        try:
            with urllib.request.urlopen(self.server + path, context=ctx, timeout=5) as resp:
                return resp.read()
        except urllib.error.HTTPError as err:
            raise RuntimeError(f"GET {path}: {err.code} {err.read()[:500]!r}") from err

    def restart_apiserver(self) -> None:
        self.apiserver.stop()
        self.start_apiserver()

    def audit(self, user: str, since: datetime.datetime | None = None) -> list[dict[str, Any]]:
        """The audit records of one user's requests (verb, requestURI, responseStatus...), those
        received at or after since if given."""
        out = []
        for line in self.audit_log.read_text().splitlines() if self.audit_log.exists() else []:
            record = json.loads(line)
            if record.get("user", {}).get("username") != user:
                continue
            if since and datetime.datetime.fromisoformat(record["requestReceivedTimestamp"]) < since:
                continue
            out.append(record)
        return out

    def api_client(self) -> client.ApiClient:
        """An admin client (system:masters)."""
        if self._api is None:
            self._api = config.new_client_from_config(str(self.admin_kubeconfig))
        return self._api

    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api_client())

    def discovery(self) -> client.DiscoveryV1Api:
        return client.DiscoveryV1Api(self.api_client())

    def token(self, namespace: str, service_account: str, seconds: int = 3600) -> str:
        """A bound ServiceAccount token (TokenRequest), as a pod would get."""
        req = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[ISSUER], expiration_seconds=seconds))
        return self.core().create_namespaced_service_account_token(service_account, namespace, req).status.token

    def kubeconfig_for(self, namespace: str, service_account: str) -> Path:
        path = self.dir / f"{namespace}.{service_account}.kubeconfig"
        return write_kubeconfig(path, self.server, self.pki.ca, {"token": self.token(namespace, service_account)})

    def ensure_namespace(self, name: str) -> None:
        """A namespace and its default ServiceAccount (no token in pods: the controllers that would
        publish kube-root-ca.crt do not run here)."""
        core = self.core()
        try:
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        except client.ApiException as err:
            if err.status != 409:
                raise
        try:
            core.create_namespaced_service_account(name, client.V1ServiceAccount(
                metadata=client.V1ObjectMeta(name="default"), automount_service_account_token=False))
        except client.ApiException as err:
            if err.status != 409:
                raise

    def stop(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None
        for p in self.controllers:
            p.stop()
        self.apiserver.stop()
        self.etcd.stop()
        if self._own and not os.environ.get("CRIRM_KEEP_WORKDIR"):
            shutil.rmtree(self.dir, ignore_errors=True)


TOPOLOGY_SCHEDULER = "topology-aware-scheduler"


def start_topology_scheduler(control: ControlPlane, name: str = TOPOLOGY_SCHEDULER, timeout: float = 60) -> Process:
    """A second scheduler, kube-scheduler of kubernetes-sigs/scheduler-plugins: pods that
    name it (spec.schedulerName) are filtered and scored by NodeResourceTopologyMatch on the nodes'
    NodeResourceTopology objects, set up as the plugin's own manifests set it up (its reserve step
    off, no cache: each decision reads the objects as they are). It is of an older Kubernetes
    release than the API server (see tools/go/schedulerplugins/go.mod)."""
    config = control.scheduler_config(name, profiles=[{
        "schedulerName": name,
        "plugins": {"multiPoint": {"enabled": [{"name": "NodeResourceTopologyMatch"}]},
                    "reserve": {"disabled": [{"name": "NodeResourceTopologyMatch"}]}},
        "pluginConfig": [{"name": "NodeResourceTopologyMatch",
                          "args": {"scoringStrategy": {"type": "LeastAllocated"}}}]}])
    proc = Process(name, [str(TOOLS_BIN / "kube-scheduler-plugins"), f"--config={config}", "--secure-port=0",
                          "--v=4"], control.dir / f"{name}.log")
    proc.start()
    _wait(name, lambda: "Starting Kubernetes Scheduler" in proc.log(), proc, timeout)
    return proc


KUBELET_CONFIG: dict[str, Any] = {
    "apiVersion": "kubelet.config.k8s.io/v1beta1",
    "kind": "KubeletConfiguration",
    # These machines run cgroup v1, which kubelet 1.35+ refuses unless told.
    "failCgroupV1": False,
    "cgroupDriver": "cgroupfs",
    "failSwapOn": False,
    "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
    "authorization": {"mode": "AlwaysAllow"},
    "enforceNodeAllocatable": [],
    "readOnlyPort": 0,
    # A test machine's disk is what it is: never evict our pods or collect our imported images.
    "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
    "imageGCHighThresholdPercent": 100,
    "imageGCLowThresholdPercent": 99,
    "syncFrequency": "10s",
    "nodeStatusUpdateFrequency": "4s",
    "serializeImagePulls": False,
}


class Kubelet:
    """A kubelet of the control plane's cluster on a CRI socket (the relay's or containerd's)."""

    def __init__(self, control: ControlPlane, workdir: Path, runtime_socket: str, node: str = "crirm-node",
                 cpu_manager: str = "none", reserved_cpus: str = "0", **settings: Any) -> None:
        self.control, self.node, self.runtime_socket = control, node, runtime_socket
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.root = self.dir / "root"
        crt, key = control.pki.issue(f"kubelet-{node}", f"system:node:{node}", ("system:nodes",))
        kubeconfig = write_kubeconfig(self.dir / "kubelet.kubeconfig", control.server, control.pki.ca,
                                      {"client-certificate": str(crt), "client-key": str(key)})
        # Pods under a cgroup root of their own: a kubelet kills what runs in pod cgroups it does not know,
        # and other clients of this machine (other kubelets too) make theirs elsewhere.
        self.cgroup_root = f"/crirm-kube-{node}-{os.getpid()}-{next(_KUBELETS)}"
        for controller in CGROUP_CONTROLLERS:
            Path("/sys/fs/cgroup", controller, self.cgroup_root.lstrip("/")).mkdir(parents=True, exist_ok=True)
        cpuset = Path("/sys/fs/cgroup/cpuset")
        for name in ("cpuset.cpus", "cpuset.mems"):  # a new cpuset cgroup starts empty
            if (cpuset / name).exists():
                (cpuset / self.cgroup_root.lstrip("/") / name).write_text((cpuset / name).read_text())
        settings = {**KUBELET_CONFIG, "port": free_port(), "healthzPort": free_port(),
                    "cgroupRoot": self.cgroup_root,
                    "containerRuntimeEndpoint": "unix://" + runtime_socket,
                    "podLogsDir": str(self.dir / "pod-logs"), "cpuManagerPolicy": cpu_manager, **settings}
        if cpu_manager == "static":
            settings["reservedSystemCPUs"] = reserved_cpus
        cfg = self.dir / "kubelet.yaml"
        cfg.write_text(yaml.safe_dump(settings))
        flags = [f"--config={cfg}", f"--kubeconfig={kubeconfig}", f"--root-dir={self.root}",
                 f"--hostname-override={node}", "--v=2",
                 "--vmodule=evented=4"]  # each container event the kubelet receives (evented PLEG)
        self.proc = Process("kubelet", [str(TOOLS_BIN / "kubelet"), *flags], self.dir / "kubelet.log")

    def start(self, timeout: float = 90) -> Kubelet:
        _drop_log_links(lambda target: "/crirm-" in target and not os.path.exists(target))
        self.proc.start()
        self.wait_ready(timeout)
        return self

    def ready(self) -> bool:
        node = self.control.core().read_node(self.node, _request_timeout=5)
        ok = {c.type: c.status for c in node.status.conditions or []}
        return ok.get("Ready") == "True"

    def wait_ready(self, timeout: float = 90) -> None:
        _wait(f"node {self.node}", self.ready, self.proc, timeout)

    def kill(self) -> None:
        self.proc.stop(signal.SIGKILL)

    def stop(self) -> None:
        self.proc.stop()

    def log(self) -> str:
        return self.proc.log()

    def cleanup(self) -> None:
        """Stop the kubelet and remove what it leaves on the machine: mounts under its root (its pods'
        volumes), its links in /var/log/containers, its cgroup root (once its pods are gone)."""
        self.stop()
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
                  if line.split()[1].startswith(str(self.root))]
        for m in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)
        _drop_log_links(lambda target: target.startswith(str(self.dir) + "/"))
        for controller in CGROUP_CONTROLLERS:  # the empty ones (pods were removed before)
            top = Path("/sys/fs/cgroup", controller, self.cgroup_root.lstrip("/"))
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()


def _drop_log_links(whose: Any) -> None:
    """Remove the links a kubelet makes in /var/log/containers (a fixed place, shared by every kubelet
    of the machine) whose target whose(target) names. Left behind, each makes every later kubelet log an
    error at each garbage collection, asking its runtime about a container it never had."""
    if not LEGACY_LOGS.is_dir():
        return
    for link in LEGACY_LOGS.iterdir():
        if link.is_symlink() and whose(os.readlink(link)):
            with contextlib.suppress(OSError):
                link.unlink()


def pod_manifest(name: str, node: str, cpu: str = "", memory: str = "", limits: bool = False,
                 annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod of one container c0 on a named node: requests (and limits equal to them when limits) of
    cpu and memory. It stops at once on SIGTERM (busybox sh as PID 1 ignores it otherwise)."""
    resources: dict[str, Any] = {}
    req = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    if req:
        resources["requests"] = req
        if limits:
            resources["limits"] = dict(req)
    container = {"name": "c0", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                 "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"], "resources": resources}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"nodeName": node, "containers": [container], "terminationGracePeriodSeconds": 5,
                     "automountServiceAccountToken": False, "enableServiceLinks": False}}


def statuses(pod: Any, init: bool = False) -> list[Any]:
    """The statuses of a pod object's containers (with init: its init containers' first, a sidecar's too)."""
    return [*(pod.status.init_container_statuses or [] if init else []), *(pod.status.container_statuses or [])]


def container_ids(pod: Any, init: bool = False) -> dict[str, str]:
    """name -> runtime container ID of a pod object's running containers (with init: a running
    sidecar's too)."""
    out = {}
    for st in statuses(pod, init):
        if st.container_id and st.state and st.state.running:
            out[st.name] = st.container_id.split("://", 1)[-1]
    return out


def describe(pod: Any) -> str:
    """A pod's status, short enough for an assertion message."""
    return json.dumps(pod.status.to_dict(), default=str)[:2000]
