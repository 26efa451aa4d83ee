"""The Helm chart (deployment/helm/cri-resmgr): linted, rendered in each mode, its commands ones the
daemons accept, and its objects applied to the real kube-apiserver with least-privilege RBAC."""

from __future__ import annotations

import base64
import json
import subprocess
import tempfile

import pytest
import yaml
from cryptography import x509
from kubernetes import client

from harness import helm
from harness.containerd import TOOLS_BIN
from resmgr.agent import resources as rs
from tests.support.agentenv import NS, wait_for

EVERYTHING = {"mode": "nri", "webhook.enabled": True, "nodeResourceTopology.export": True, "dra.enabled": True}


def by_kind(docs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_the_chart_lints_and_refuses_bad_values():
    for values in ({}, {**EVERYTHING, "nodeResourceTopology.installCRD": True},
                   {"agent.customResources": False, "config": {}}):
        out = helm.lint(values)
        assert out.returncode == 0, out.stdout + out.stderr
    # values.schema.json: bad values fail before anything reaches a cluster.
    for bad, where in (({"mode": "sideways"}, "/mode"), ({"config": {"policy": {"Active": "topology-awre"}}},
                                                          "/config/policy/Active"),
                       ({"tally.interval": -5}, "/tally/interval"), ({"nri.stateDir": "var/lib/x"}, "/nri/stateDir"),
                       ({"agent.logLevel": "LOUD"}, "/agent/logLevel"), ({"nri.socekt": "/x"}, "/nri"),
                       ({"agent.resources": {"limits": {"memory": "lots"}}}, "/agent/resources/limits/memory")):
        out = helm.lint(bad)
        assert out.returncode != 0 and f"at '{where}'" in out.stdout + out.stderr, (bad, out.stdout + out.stderr)
        with pytest.raises(RuntimeError, match=f"at '{where}'"):
            helm.render(bad)
    with pytest.raises(RuntimeError, match="needs webhook.caBundle"):
        helm.render({"webhook.enabled": True, "webhook.secretName": "mine"})


def test_rendered_commands_are_ones_the_daemons_accept():
    from resmgr.agent.main import build_parser as agent_parser
    from resmgr.app.cli import build_parser as daemon_parser
    from resmgr.webhook.main import build_parser as webhook_parser
    from resmgr.webhook.review import API_VERSION

    relay = by_kind(helm.render())
    assert ("DaemonSet", "cri-resmgr-nri") not in relay and ("Deployment", "cri-resmgr-webhook") not in relay
    objs = by_kind(helm.render(EVERYTHING))

    agent = objs[("DaemonSet", "cri-resmgr-agent")]["spec"]["template"]["spec"]
    (container,) = agent["containers"]
    args = agent_parser().parse_args(container["command"][1:])
    assert args.config_namespace == NS and args.export_topology is True and args.custom_resources is True
    assert args.export_devices is True
    agent_socket, volumes = args.agent_socket, {v["name"]: v for v in agent["volumes"]}
    assert container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert args.config_socket.startswith(mounts["sockets"] + "/")
    assert args.agent_socket.startswith(mounts["own"] + "/")
    # The agent is unprivileged; the plugin lets its group onto the configuration socket.
    assert container["securityContext"]["runAsUser"] == 65532 and container["securityContext"]["runAsNonRoot"]

    # One tally per cluster, with an account of its own.
    tally = objs[("Deployment", "cri-resmgr-tally")]
    assert tally["spec"]["replicas"] == 1
    assert tally["spec"]["template"]["spec"]["serviceAccountName"] == "cri-resmgr-tally"
    (container,) = tally["spec"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["cri-resmgr-agent", "tally"]
    from resmgr.agent.main import tally_parser
    assert tally_parser().parse_args(container["command"][2:]).config_namespace == NS
    assert ("Deployment", "cri-resmgr-tally") not in by_kind(helm.render({"agent.customResources": False}))

    nri = objs[("DaemonSet", "cri-resmgr-nri")]["spec"]["template"]["spec"]
    (container,) = nri["containers"]
    args = daemon_parser().parse_args(container["command"][1:])
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    assert args.nri and any(args.nri_socket.startswith(m + "/") for m in mounts)
    assert args.state_dir in mounts and args.host_root + "/sys" in mounts
    # The DRA driver: kubelet's directories and containerd's CDI directory mounted where it uses them,
    # the agent's socket where the agent's pod puts it on the host.
    assert args.dra_driver == "cpu.cri-resource-manager.intel.com"
    assert {f"{args.kubelet_dir}/plugins_registry", f"{args.kubelet_dir}/plugins", args.cdi_dir} <= set(mounts)
    host_dir = volumes["own"]["hostPath"]["path"]
    assert args.agent_socket == f"{host_dir}/{agent_socket.rsplit('/', 1)[1]}" and host_dir in mounts
    (init,) = agent["initContainers"]  # the host directory made the agent's, as root
    assert init["securityContext"]["capabilities"]["add"] == ["CHOWN", "FOWNER"]
    assert objs[("DeviceClass", args.dra_driver)]["spec"]["selectors"][0]["cel"]["expression"] == \
        f'device.driver == "{args.dra_driver}"'
    assert args.config_socket == agent_parser().parse_args(
        agent["containers"][0]["command"][1:]).config_socket  # the agent finds it
    assert nri["automountServiceAccountToken"] is False  # only the agent talks to the API server
    assert args.config_socket_group == 65532

    deployment = objs[("Deployment", "cri-resmgr-webhook")]
    service = objs[("Service", "cri-resmgr-webhook")]
    (hook,) = objs[("MutatingWebhookConfiguration", "cri-resmgr-webhook")]["webhooks"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = webhook_parser().parse_args(container["command"][1:])
    mount = container["volumeMounts"][0]["mountPath"]
    assert args.tls_cert_file.startswith(mount + "/") and args.tls_private_key_file.startswith(mount + "/")
    assert container["ports"][0]["containerPort"] == args.listen[1]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert hook["failurePolicy"] == "Ignore" and hook["admissionReviewVersions"] == [API_VERSION.split("/")[1]]
    ref = hook["clientConfig"]["service"]
    assert (ref["name"], ref["namespace"], ref["path"]) == ("cri-resmgr-webhook", NS, "/mutate")
    (expr,) = hook["namespaceSelector"]["matchExpressions"]
    assert expr["operator"] == "NotIn" and NS in expr["values"]

    # The certificate the chart makes is the one the API server is told to trust, for the Service.
    secret = objs[("Secret", "cri-resmgr-webhook-tls")]["data"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(hook["clientConfig"]["caBundle"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"cri-resmgr-webhook.{NS}.svc" in names

    # The chart's configuration is one the daemon accepts.
    from resmgr.agent.agent import spec_data
    from resmgr.config.document import from_map

    config = objs[("ResourceManagerConfig", "default")]
    assert from_map(spec_data(config["spec"])).policy_name == "topology-aware"


def kubectl(kube, *args: str, stdin: str = "") -> str:
    out = subprocess.run([str(TOOLS_BIN / "kubectl"), "--kubeconfig", str(kube.admin_kubeconfig), *args],
                         input=stdin, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def can(kube, verb: str, resource: str, namespace: str = "", group: str = "", sub: str = "",
        who: str = "cri-resmgr-agent") -> bool:
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=f"system:serviceaccount:{NS}:{who}", groups=["system:serviceaccounts"],
        resource_attributes=client.V1ResourceAttributes(verb=verb, resource=resource, namespace=namespace or None,
                                                        group=group, subresource=sub or None)))
    return client.AuthorizationV1Api(kube.api_client()).create_subject_access_review(review).status.allowed


def test_the_rendered_chart_applies_to_the_api_server(kube):
    docs = helm.render({**EVERYTHING, "nodeResourceTopology.installCRD": True}, namespace=NS, crds=True)
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
    assert {d["metadata"]["name"] for d in crds} == {f"{rs.PLURAL}.{rs.GROUP}", f"{rs.NODE_PLURAL}.{rs.GROUP}",
                                                     f"{rs.NRT_PLURAL}.{rs.NRT_GROUP}"}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump_all(crds, f)
        f.flush()
        kubectl(kube, "apply", "--server-side", "--force-conflicts", "-f", f.name)
        kubectl(kube, "wait", "--for=condition=Established", "--timeout=60s", "-f", f.name)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump_all(rest, f)
        f.flush()
        try:
            kubectl(kube, "apply", "--server-side", "--force-conflicts", "-f", f.name)
            # Every object is there, as rendered.
            for d in rest:
                ns = ["-n", d["metadata"]["namespace"]] if d["metadata"].get("namespace") else []
                got = json.loads(kubectl(kube, "get", d["kind"].lower() + "." + d["apiVersion"].split("/")[0]
                                         if "/" in d["apiVersion"] else d["kind"].lower(),
                                         d["metadata"]["name"], *ns, "-o", "json"))
                assert got["metadata"]["labels"]["app.kubernetes.io/part-of"] == "cri-resmgr", d["kind"]
            config = json.loads(kubectl(kube, "-n", NS, "get", "rmconfig", "default", "-o", "json"))
            assert config["spec"]["policy"]["Active"] == "topology-aware" and config["metadata"]["generation"] == 1
            ds = json.loads(kubectl(kube, "-n", NS, "get", "daemonset", "cri-resmgr-nri", "-o", "json"))
            assert ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] is True

            # Least privilege: what the agent does, and nothing more.
            allowed = [("list", "configmaps", NS, "", ""), ("watch", rs.PLURAL, NS, rs.GROUP, ""),
                       ("create", rs.NODE_PLURAL, NS, rs.GROUP, ""), ("patch", rs.NODE_PLURAL, NS, rs.GROUP, ""),
                       ("create", "events", "default", "", ""), ("patch", "nodes", "", "", ""),
                       ("create", rs.NRT_PLURAL, "", rs.NRT_GROUP, ""), ("patch", rs.NRT_PLURAL, "", rs.NRT_GROUP, ""),
                       # DRA: its node's ResourceSlice, and the claims kubelet asks cri-resmgr to prepare
                       ("create", "resourceslices", "", "resource.k8s.io", ""),
                       ("patch", "resourceslices", "", "resource.k8s.io", ""),
                       ("get", "resourceclaims", "default", "resource.k8s.io", "")]
            # No node writes a shared object: the configurations' status is the tally's alone.
            denied = [("patch", rs.PLURAL, NS, rs.GROUP, "status"), ("list", rs.NODE_PLURAL, NS, rs.GROUP, ""),
                      ("create", "events", NS, "", ""), ("delete", rs.NODE_PLURAL, NS, rs.GROUP, ""),
                      ("update", rs.PLURAL, NS, rs.GROUP, ""), ("delete", rs.PLURAL, NS, rs.GROUP, ""),
                      ("delete", "configmaps", NS, "", ""), ("list", "configmaps", "default", "", ""),
                      ("get", "secrets", NS, "", ""), ("create", "pods", NS, "", ""),
                      ("delete", rs.NRT_PLURAL, "", rs.NRT_GROUP, ""), ("delete", "nodes", "", "", ""),
                      ("create", "events", "kube-public", "", ""),
                      ("delete", "resourceslices", "", "resource.k8s.io", ""),
                      ("list", "resourceclaims", "default", "resource.k8s.io", ""),
                      ("patch", "resourceclaims", "default", "resource.k8s.io", "status")]
            assert [a for a in allowed if not can(kube, *a)] == []
            assert [d for d in denied if can(kube, *d)] == []
            tally = [("watch", rs.NODE_PLURAL, NS, rs.GROUP, ""), ("list", rs.PLURAL, NS, rs.GROUP, ""),
                     ("patch", rs.PLURAL, NS, rs.GROUP, "status"), ("create", "events", NS, "", "")]
            assert [a for a in tally if not can(kube, *a, who="cri-resmgr-tally")] == []
            assert [d for d in [("patch", rs.PLURAL, NS, rs.GROUP, ""), ("patch", rs.NODE_PLURAL, NS, rs.GROUP, ""),
                                ("patch", "nodes", "", "", ""), ("get", "secrets", NS, "", "")]
                    if can(kube, *d, who="cri-resmgr-tally")] == []
        finally:
            # The shared API server keeps its CRDs; what else the chart made goes.
            kubectl(kube, "delete", "--ignore-not-found", "--wait=false", "-f", f.name)
    wait_for(lambda: subprocess.run([str(TOOLS_BIN / "kubectl"), "--kubeconfig", str(kube.admin_kubeconfig), "-n",
                                     NS, "get", "rmconfig", "default"], capture_output=True).returncode != 0,
             30, "the chart's configuration gone")
