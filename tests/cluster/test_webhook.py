"""cri-resmgr-webhook as a real process over TLS: AdmissionReview bodies in, JSON patches out,
and a pod annotated by it placed by the relay."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import signal
import ssl
import subprocess
import sys
import uuid
from pathlib import Path

import jsonpatch
import pytest
from kubernetes import client, utils

from harness import helm
from harness.kube import host_address
from harness.relay import free_port
from resmgr.generated.cri import api_pb2 as cri
from resmgr.model import Container, Pod, QOSClass
from resmgr.requests import RESOURCES_ANNOTATION, requirements
from resmgr.topology.cpuset import CPUSet
from resmgr.webhook import review
from tests.support.helpers import ONLINE, ROOT, Cri, cgroup_cpus, container_config, pod_config, policy_relay, wait_until
from tests.support.kubenode import KubeNode


def pod(containers: list[dict], init: list[dict] | None = None, annotations: dict | None = None) -> dict:
    meta: dict = {"name": "web", "namespace": "default", "uid": str(uuid.uuid4())}
    if annotations is not None:
        meta["annotations"] = annotations
    spec: dict = {"containers": containers}
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def ctr(name: str, requests: dict | None = None, limits: dict | None = None) -> dict:
    res = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    return {"name": name, "image": "busybox", **({"resources": res} if res else {})}


def admission(obj: dict, operation: str = "CREATE", kind: str = "Pod", resource: str = "pods",
              group: str = "") -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": group, "version": "v1", "kind": kind},
        "resource": {"group": group, "version": "v1", "resource": resource}, "operation": operation,
        "namespace": "default", "name": "web",
        "userInfo": {"username": "kubernetes-admin"}, "object": obj, "dryRun": False}}


class Webhook:
    """The webhook on a port of its own, with a certificate for its Service in namespace and for localhost."""

    def __init__(self, workdir: Path, namespace: str = "default", host: str = "127.0.0.1") -> None:
        self.certs = workdir / "certs"
        subprocess.run(["bash", str(ROOT / "scripts/webhook-certs.sh"), str(self.certs), namespace, "DNS:localhost",
                        "IP:127.0.0.1"], check=True, capture_output=True)
        self.port = free_port()
        self.log = workdir / "webhook.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "resmgr.webhook", "--listen", f"{host}:{self.port}",
                                          "--tls-cert-file", str(self.certs / "tls.crt"), "--tls-private-key-file",
                                          str(self.certs / "tls.key"), "--log-level", "DEBUG",
                                          "--cert-check-interval", "0.2"],
                                         stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        wait_until(self._up, what="the webhook serving https")

    def _up(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        try:
            return self.post_raw(b"", path="/healthz", method="GET")[0] == 200
        except OSError:
            return False

    def post_raw(self, body: bytes, content_type: str = "application/json", path: str = "/mutate",
                 method: str = "POST") -> tuple[int, bytes]:
        context = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))
        conn = http.client.HTTPSConnection("localhost", self.port, context=context, timeout=10)
        try:
            conn.request(method, path, body=body if method == "POST" else None,
                         headers={"Content-Type": content_type})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def review(self, body: dict) -> dict:
        status, raw = self.post_raw(json.dumps(body).encode())
        assert status == 200, raw
        out = json.loads(raw)
        assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
        assert out["response"]["uid"] == body["request"]["uid"] and out["response"]["allowed"] is True
        return out["response"]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(10) == 0


@pytest.fixture
def webhook(tmp_path):
    w = Webhook(tmp_path)
    yield w
    w.stop()


def patched(obj: dict, response: dict) -> dict:
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    return jsonpatch.apply_patch(copy.deepcopy(obj), ops)


def read_back(obj: dict, name: str, qos: QOSClass):
    """What the engine reads from the annotated pod (resmgr/requests.py)."""
    p = Pod(id="p", uid="u", name="web", namespace="default", qos_class=qos,
            annotations=obj["metadata"]["annotations"])
    return requirements(Container(id="c", pod_id="p", name=name), p)


def test_valid_pods_get_the_annotation(webhook):
    obj = pod([ctr("app", {"cpu": "2", "memory": "1Gi"}, {"cpu": "2", "memory": "1Gi"}),
               ctr("sidecar", {"cpu": "250m", "memory": "64Mi"}, {"cpu": "500m"}), ctr("plain")],
              annotations={"team": "a", RESOURCES_ANNOTATION: '{"app": {"requests": {"cpu": "64"}}}'})
    out = patched(obj, webhook.review(admission(obj)))
    ann = out["metadata"]["annotations"]
    assert ann["team"] == "a"  # other annotations untouched; a hand-made value replaced
    assert json.loads(ann[RESOURCES_ANNOTATION]) == {
        "app": {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}},
        "sidecar": {"requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"cpu": "500m"}}}
    app = read_back(out, "app", QOSClass.GUARANTEED)
    assert (app.cpu_request, app.cpu_limit, app.memory_request) == (2000, 2000, 1 << 30)
    side = read_back(out, "sidecar", QOSClass.BURSTABLE)
    assert (side.cpu_request, side.cpu_limit, side.memory_request) == (250, 500, 64 << 20)

    # A pod without annotations gets the whole map; curl, a second TLS client, sees the same answer.
    bare = pod([ctr("app", {"cpu": "1"}, {"cpu": "1"})])
    body = json.dumps(admission(bare))
    curl = subprocess.run(["curl", "-sS", "--cacert", str(webhook.certs / "ca.crt"), "-H",
                           "Content-Type: application/json", "--data-binary", "@-",
                           f"https://localhost:{webhook.port}/mutate"], input=body, capture_output=True, text=True,
                          timeout=30)
    assert curl.returncode == 0, curl.stderr
    ops = json.loads(base64.b64decode(json.loads(curl.stdout)["response"]["patch"]))
    assert ops == [{"op": "add", "path": "/metadata/annotations",
                    "value": {RESOURCES_ANNOTATION: '{"app":{"limits":{"cpu":"1"},"requests":{"cpu":"1"}}}'}}]


def test_init_containers_pods_without_resources_and_other_objects(webhook):
    obj = pod([ctr("app", {"cpu": "1"}, {"cpu": "1"})], init=[ctr("migrate", {"cpu": "3"}, {"cpu": "3"})],
              annotations={})
    ann = json.loads(patched(obj, webhook.review(admission(obj)))["metadata"]["annotations"][RESOURCES_ANNOTATION])
    assert set(ann) == {"app", "migrate"} and ann["migrate"]["requests"] == {"cpu": "3"}

    nothing = pod([ctr("app"), ctr("other", {}, {})])  # BestEffort: kubelet's own values say it all
    resp = webhook.review(admission(nothing))
    assert "patch" not in resp and "patchType" not in resp

    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                  "spec": {"template": pod([ctr("app", {"cpu": "1"})])}}
    resp = webhook.review(admission(deployment, kind="Deployment", resource="deployments", group="apps"))
    assert "patch" not in resp
    resp = webhook.review(admission(pod([ctr("app", {"cpu": "1"})]), operation="UPDATE"))
    assert "patch" not in resp
    binding = admission(pod([ctr("app", {"cpu": "1"})]))
    binding["request"]["subResource"] = "binding"
    assert "patch" not in webhook.review(binding)


def test_malformed_bodies_are_refused(webhook):
    assert webhook.post_raw(b"{not json")[0] == 400
    assert webhook.post_raw(b"[1, 2]")[0] == 400
    assert webhook.post_raw(b"[" * 100000)[0] == 400  # nesting deeper than the decoder takes
    assert webhook.post_raw(json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1",
                                        "request": {"uid": "x"}}).encode())[0] == 400
    no_uid = admission(pod([ctr("app", {"cpu": "1"})]))
    del no_uid["request"]["uid"]
    status, body = webhook.post_raw(json.dumps(no_uid).encode())
    assert status == 400 and b"uid" in body
    assert webhook.post_raw(b"{}", content_type="text/plain")[0] == 415
    assert webhook.post_raw(b"x" * (9 << 20))[0] == 413
    weird = admission({"metadata": "nope", "spec": {"containers": [{"name": 5}, "x", {"name": "a", "resources": 1}]}})
    assert "patch" not in webhook.review(weird)  # odd shapes are not the webhook's to judge
    # It still answers properly afterwards.
    ok = pod([ctr("app", {"cpu": "1"})])
    assert "patch" in webhook.review(admission(ok))


def test_huge_pods(webhook):
    many = pod([ctr(f"c{i:04d}", {"cpu": "100m", "memory": "16Mi"}, {"cpu": "200m", "memory": "32Mi"})
                for i in range(2000)])
    for c in many["spec"]["containers"]:  # a big environment each: the body is over 2 MB
        c["env"] = [{"name": f"VAR_{j}", "value": "x" * 100} for j in range(10)]
    body = admission(many)
    assert len(json.dumps(body)) > 2_000_000
    ann = json.loads(patched(many, webhook.review(body))["metadata"]["annotations"][RESOURCES_ANNOTATION])
    assert len(ann) == 2000 and ann["c1999"]["limits"] == {"cpu": "200m", "memory": "32Mi"}

    # Annotations the API server would refuse: the pod is let through unchanged, with a warning.
    crowded = pod([ctr("app", {"cpu": "1"})], annotations={"big": "x" * (review.MAX_ANNOTATIONS - 10)})
    resp = webhook.review(admission(crowded))
    assert "patch" not in resp and "262144" in resp["warnings"][0]
    assert "not written" in webhook.log.read_text()


def test_a_rotated_certificate_is_taken_without_a_restart(webhook, tmp_path):
    old_ca = tmp_path / "old-ca.crt"
    old_ca.write_bytes((webhook.certs / "ca.crt").read_bytes())
    fresh = tmp_path / "fresh"
    subprocess.run(["bash", str(ROOT / "scripts/webhook-certs.sh"), str(fresh), "default", "DNS:localhost"],
                   check=True, capture_output=True)
    for name in ("ca.crt", "tls.key", "tls.crt"):  # as a Secret update lands: new files in place
        (webhook.certs / name).write_bytes((fresh / name).read_bytes())
    obj = pod([ctr("app", {"cpu": "1"})])
    wait_until(lambda: "TLS certificate reloaded" in webhook.log.read_text(), what="the new certificate loaded")
    assert "patch" in webhook.review(admission(obj))  # trusted through the new CA
    (webhook.certs / "ca.crt").write_bytes(old_ca.read_bytes())
    with pytest.raises(ssl.SSLCertVerificationError):
        webhook.review(admission(obj))
    assert webhook.proc.poll() is None


def test_annotated_pod_gets_its_cpus_through_the_relay(containerd, workdir, webhook):
    """The pod spec's request reaches the policy through the annotation alone."""
    relay = policy_relay(workdir, containerd.socket, "static").start()
    via = Cri(relay.socket)
    pods = []
    # The CPU request and limit travel only in the annotation: the CRI request carries no CPU
    # shares or quota (as for a kubelet run with --cpu-cfs-quota=false and a lost shares value).
    no_cpu = cri.LinuxContainerResources(memory_limit_in_bytes=64 << 20)
    try:
        spec = pod([ctr("main", {"cpu": "1", "memory": "64Mi"}, {"cpu": "1", "memory": "64Mi"})])
        annotated = patched(spec, webhook.review(admission(spec)))["metadata"]["annotations"]
        cfg = pod_config(name="annotated", qos="guaranteed", logdir=str(workdir / "logs"), annotations=annotated)
        pods.append(via.run_pod(cfg))
        cid = via.run_container(pods[-1], cfg, container_config(resources=no_cpu))
        assert len(cgroup_cpus(cfg, cid)) == 1  # exclusive, as the pod spec asked

        plain_cfg = pod_config(name="plain", qos="guaranteed", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(plain_cfg))
        plain = via.run_container(pods[-1], plain_cfg, container_config(resources=no_cpu))
        mine = cgroup_cpus(cfg, cid)
        wait_until(lambda: cgroup_cpus(plain_cfg, plain) == ONLINE - mine,
                   what="the unannotated container in the shared pool")
    finally:
        for p in pods:
            via.remove_pod(p)
        via.close()
        relay.stop()


def test_the_api_server_calls_the_webhook_the_shipped_manifest_registers(kube, workdir):
    """A pod made through the real API server gets the annotation from the webhook (registered by
    the Helm chart's webhook.yaml, TLS verified against the Service's name) and runs with the CPUs it
    asks for through the relay under a real kubelet."""
    ns = "cri-resmgr"
    hook = Webhook(workdir / "hook", namespace=ns, host="0.0.0.0")
    # The manifest's Deployment needs an image of this project, which is not built here: the webhook runs
    # on the host, and an EndpointSlice puts it behind the manifest's Service, as the Deployment's pods
    # would be (the API server calls webhooks at a Service's endpoints with aggregator routing).
    ca = base64.b64encode((hook.certs / "ca.crt").read_bytes()).decode()
    docs = [d for d in helm.render({"webhook.enabled": True, "webhook.secretName": "mine", "webhook.caBundle": ca,
                                    "config": {}}, namespace=ns, only="templates/webhook.yaml")
            if d["kind"] != "Deployment"]
    api = kube.api_client()
    kube.ensure_namespace(ns)
    utils.create_from_yaml(api, yaml_objects=docs, namespace=ns)
    kube.discovery().create_namespaced_endpoint_slice(ns, {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "cri-resmgr-webhook-host", "labels": {"kubernetes.io/service-name": "cri-resmgr-webhook"}},
        "addressType": "IPv4", "endpoints": [{"addresses": [host_address()], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": hook.port, "protocol": "TCP"}]})
    node = KubeNode(kube, workdir / "node")
    try:
        node.start()
        running = node.run("annotated", cpu="1", memory="64Mi", limits=True)
        annotation = json.loads(running.metadata.annotations[RESOURCES_ANNOTATION])
        assert annotation == {"c0": {"requests": {"cpu": "1", "memory": "64Mi"},
                                     "limits": {"cpu": "1", "memory": "64Mi"}}}
        assert ": patched" in hook.log.read_text()  # by the webhook, as the API server called it
        assert node.cpus("annotated")["c0"] == ONLINE - CPUSet([0])  # exclusive; CPU 0 is reserved
    finally:
        node.stop()
        client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration("cri-resmgr-webhook")
        hook.stop()
