"""The HTTP endpoint of a running daemon: Prometheus metrics, /api/v1/state and `cri-resmgr status`."""

from __future__ import annotations

import signal
import subprocess
import sys

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.relay import NriProcess, free_port
from resmgr.generated.cri import api_pb2 as cri
from resmgr.generated.cri import api_pb2_grpc as cri_grpc
from resmgr.topology.cpuset import CPUSet
from resmgr.view import client
from tests.support.helpers import (
    ONLINE,
    ROOT,
    Cri,
    RelayProcess,
    cgroup_cpus,
    container_config,
    pod_config,
    policy_relay,
    resources,
    wait_until,
)
from tests.support.hookplugin import Plugin


def scrape(address: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of /metrics, parsed by Prometheus' own text parser."""
    text = client.get(address, "/metrics").decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def matching(samples: dict, name: str, **labels: str) -> dict[frozenset, float]:
    want = set(labels.items())
    return {lbls: v for (n, lbls), v in samples.items() if n == name and want <= lbls}


@pytest.mark.parametrize("mode", ["splice", "grpc"])
def test_metrics_of_a_running_relay(containerd, workdir, mode):
    """CRI calls by route and outcome, pools, configuration, state saves: scraped and parsed."""
    address = f"127.0.0.1:{free_port()}"
    config = workdir / "static.yaml"
    config.write_text("policy:\n  Active: static\n")
    relay = RelayProcess(workdir, containerd.socket, "--force-config", str(config), "--relay-mode", mode,
                         "--metrics-address", address).start()
    via = Cri(relay.socket)
    pods = []
    try:
        wait_until(lambda: "HELP cri_resmgr_pool_cpus" in client.get(address, "/metrics").decode(),
                   what="pool gauges once the relay has reconciled")
        stub = cri_grpc.RuntimeServiceStub(relay.channel())
        for _ in range(3):
            stub.Version(cri.VersionRequest())
        with pytest.raises(grpc.RpcError) as err:
            stub.ContainerStatus(cri.ContainerStatusRequest(container_id="no-such-container"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        shared_cfg = pod_config(qos="burstable", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(shared_cfg))
        via.run_container(pods[-1], shared_cfg, container_config(resources=resources(200, False)))
        g_cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(g_cfg))
        g = via.run_container(pods[-1], g_cfg, container_config(resources=resources(1000, True)))
        mine = cgroup_cpus(g_cfg, g)

        # A bad forced file is rejected on SIGHUP; a good one is applied.
        config.write_text("policy:\n  Active: static\n  NoSuchOption: 1\n")
        relay.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "rejected" in relay.log(), what="the bad file rejected")
        config.write_text("policy:\n  Active: static\n  static:\n    RelaxedIsolation: false\n")
        relay.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: relay.log().count("applied (policy static)") >= 1, what="the good file applied")

        m = scrape(address)
        calls = "cri_resmgr_cri_requests_total"
        assert value(m, calls, method="Version", route="passthrough", code="OK") >= 3
        assert value(m, calls, method="ContainerStatus", route="passthrough", code="NOT_FOUND") == 1
        assert value(m, calls, method="CreateContainer", route="engine", code="OK") == 2
        assert value(m, calls, method="RunPodSandbox", route="engine", code="OK") == 2
        assert value(m, calls, method="StartContainer", route="engine", code="OK") == 2
        hist = "cri_resmgr_cri_request_duration_seconds"
        assert value(m, f"{hist}_count", method="CreateContainer", route="engine") == 2
        assert value(m, f"{hist}_bucket", method="CreateContainer", route="engine", le="+Inf") == 2
        assert value(m, f"{hist}_sum", method="CreateContainer", route="engine") > 0
        assert value(m, f"{hist}_count", method="Version", route="passthrough") >= 3

        pool = {"policy": "static", "pool": "default"}
        assert value(m, "cri_resmgr_pool_cpus", **pool) == len(ONLINE)
        assert value(m, "cri_resmgr_pool_shared_cpus", **pool) == len(ONLINE) - 1
        assert value(m, "cri_resmgr_pool_exclusive_grants", **pool) == 1
        assert value(m, "cri_resmgr_pool_containers", **pool) == 2
        assert value(m, "cri_resmgr_pool_shared_requested_millicpus", **pool) == 200
        assert value(m, "cri_resmgr_pool_shared_free_millicpus", **pool) == 1000 * (len(ONLINE) - 1) - 200
        assert value(m, "cri_resmgr_pool_memory_bytes", **pool, type="dram") > 0
        assert value(m, "cri_resmgr_containers", state="running") == 2
        assert value(m, "cri_resmgr_pods", qos_class="Guaranteed") == 1
        assert value(m, "cri_resmgr_policy_info", policy="static", source=f"forced config file {config}") == 1

        assert value(m, "cri_resmgr_config_rejections_total", source="forced") == 1
        assert value(m, "cri_resmgr_config_applies_total", source="forced") == 2  # start-up, then SIGHUP
        assert value(m, "cri_resmgr_config_generation") == 2
        # A background save may land between a counter and its histogram while the text is
        # rendered in another thread: scrape until one scrape sees both agree.
        def saves_agree() -> bool:
            m = scrape(address)
            saves = value(m, "cri_resmgr_state_saves_total", outcome="ok")
            return saves >= 4 and value(m, "cri_resmgr_state_save_duration_seconds_count") == saves

        wait_until(saves_agree, what="state saves counted with their latency")
        assert value(m, "process_resident_memory_bytes") > 0

        doc = client.state(address)
        assert doc["policy"] == "static" and doc["config"]["generation"] == 2
        ctr = next(c for p in doc["pods"] for c in p["containers"] if c["id"] == g)
        assert CPUSet.parse(ctr["exclusive"]) == mine and ctr["kind"] == "exclusive" and ctr["pool"] == "default"
        roles = {c["id"]: c for c in doc["cpus"]}
        (cpu,) = mine
        assert roles[cpu]["role"] == "exclusive" and roles[cpu]["holders"][0].endswith("/main")
        assert all(roles[c]["role"] == "shared" for c in ONLINE - mine)
    finally:
        for p in pods:
            via.remove_pod(p)
        via.close()
        relay.stop()


def test_state_on_a_unix_socket_and_status_table(containerd, workdir):
    """`cri-resmgr status` finds the endpoint through the config socket and prints the pools."""
    address = f"unix:{workdir}/view.sock"
    relay = policy_relay(workdir, containerd.socket, "topology-aware", "--metrics-address", address).start()
    via = Cri(relay.socket)
    pods = []
    try:
        cfg = pod_config(name="web", qos="guaranteed", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(cfg))
        cid = via.run_container(pods[-1], cfg, container_config(resources=resources(1000, True)))
        doc = client.state(address)
        topo = doc["topology"]
        assert sum(len(core["cpus"]) for s in topo["sockets"] for d in s["dies"] for n in d["nodes"]
                   for core in n["cores"]) == len(ONLINE)
        assert topo["nodes"] and topo["nodes"][0]["memory"] > 0
        assert doc["pools"][0]["name"] == "root" or doc["pools"][0]["parent"] == ""
        ctr = doc["pods"][0]["containers"][0]
        assert ctr["id"] == cid and CPUSet.parse(ctr["cpus"]) == cgroup_cpus(cfg, cid)
        assert doc["config"]["source"].startswith("forced config file") and "topology-aware" in doc["config"]["yaml"]

        out = subprocess.run([sys.executable, "-m", "resmgr", "status", "--config-socket",
                              str(workdir / "config.sock")], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        header = next(i for i, line in enumerate(lines) if line.startswith("POOL"))
        pool = doc["pools"][0]
        row = lines[header + 1].split()
        assert row[0] == pool["name"].split()[0] and f"({pool['stats']['cpus']})" in lines[header + 1]
        assert any(line.startswith(f"default/{doc['pods'][0]['name']}/main") and "exclusive" in line
                   for line in lines)
    finally:
        for p in pods:
            via.remove_pod(p)
        via.close()
        relay.stop()
    assert not (workdir / "view.sock").exists()


def test_hook_and_nri_metrics(containerd, workdir):
    """Hook plugin calls by plugin, hook and outcome; NRI events, in NRI mode."""
    hookdir = workdir / "hookserver.d"
    hookdir.mkdir()
    good = Plugin(workdir, "h1").start()
    bad = Plugin(workdir, "h2", "--mode", "error").start()
    good.register(hookdir, ["PreCreateContainer", "PostStartContainer"])
    bad.register(hookdir, ["PreCreateContainer"])
    address = f"127.0.0.1:{free_port()}"
    config = workdir / "static.yaml"
    config.write_text("policy:\n  Active: static\n")
    plugin = NriProcess(workdir, str(containerd.dir / "nri.sock"), "--force-config", str(config),
                        "--hook-dir", str(hookdir), "--metrics-address", address).start()
    direct = Cri(containerd.socket)
    pods = []
    try:
        cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
        pods.append(direct.run_pod(cfg))
        direct.run_container(pods[-1], cfg, container_config(resources=resources(1000, True)))
        # The plugin records a call before it answers: wait for the daemon's count, not the record.
        hooks = "cri_resmgr_hook_requests_total"
        wait_until(lambda: value(scrape(address), hooks, plugin="h1", hook="PostStartContainer", code="OK") == 1,
                   what="PostStart answered and counted")
        m = scrape(address)
        assert value(m, hooks, plugin="h1", hook="PreCreateContainer", code="OK") == 1
        assert value(m, hooks, plugin="h1", hook="PostStartContainer", code="OK") == 1
        failed = matching(m, hooks, plugin="h2", hook="PreCreateContainer")
        assert sum(failed.values()) == 1 and ("code", "OK") not in next(iter(failed))
        assert value(m, "cri_resmgr_hook_request_duration_seconds_count", plugin="h1",
                     hook="PreCreateContainer") == 1
        events = "cri_resmgr_nri_events_total"
        for event in ("Configure", "Synchronize", "CreateContainer", "RunPodSandbox", "StartContainer"):
            assert value(m, events, event=event, code="OK") >= 1, event
        assert value(m, "cri_resmgr_nri_event_duration_seconds_count", event="CreateContainer") == 1
        assert value(m, "cri_resmgr_pool_exclusive_grants", policy="static", pool="default") == 1
    finally:
        for p in pods:
            direct.remove_pod(p)
        direct.close()
        plugin.stop()
        good.stop()
        bad.stop()


