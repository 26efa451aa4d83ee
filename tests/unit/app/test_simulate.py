"""`cri-resmgr simulate` and the CRI-to-requirements estimation it relies on."""

from __future__ import annotations

import importlib.util
import json

import pytest

from resmgr.app import cli
from resmgr.model import Container, Pod, QOSClass, Resources
from resmgr.requests import (
    RequirementError,
    milli_to_shares,
    parse_cpu,
    parse_memory,
    requirements,
    shares_to_milli,
)
from resmgr.topology.cpuset import CPUSet
from tests.support.helpers import ROOT, run_main

PODS = """\
- name: system
  namespace: kube-system
  containers:
    - name: dns
      requests: {cpu: 100m, memory: 70Mi}
      limits: {memory: 170Mi}
- name: db
  containers:
    - name: postgres
      requests: {cpu: 4, memory: 8Gi}
      limits: {cpu: 4, memory: 8Gi}
- name: web
  containers:
    - name: nginx
      requests: {cpu: 500m}
- name: batch
  annotations:
    rdtclass.cri-resource-manager.intel.com/pod: gold
"""


def simulate(tmp_path, *args, pods=PODS, config="policy:\n  Active: static-plus\n  ReservedResources:\n    cpu: 2\n"):
    (tmp_path / "pods.yaml").write_text(pods)
    (tmp_path / "config.yaml").write_text(config)
    return run_main(cli.main, "simulate", "--config", str(tmp_path / "config.yaml"),
                    "--pods", str(tmp_path / "pods.yaml"), *args)


def test_simulate_json(tmp_path):
    out = simulate(tmp_path, "--machine", "sockets=2,nodes=2,cores=14,threads=2", "--output", "json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["policy"] == "static-plus"
    pools = {p["name"]: p for p in result["pools"]}
    assert pools["reserved"]["cpus"] == "0,56"
    by_name = {c["name"]: c for c in result["containers"]}
    assert by_name["dns"]["cpus"] == "0,56" and by_name["dns"]["pool"] == "reserved"
    assert by_name["postgres"]["pool"] == "exclusive" and by_name["postgres"]["cpus"] == "1-2,57-58"
    # cpus: all of the pool's CPUs; shared: what is left to its shared containers now
    assert pools["shared"]["cpus"] == "1-55,57-111" and pools["shared"]["exclusive_grants"] == 1
    assert by_name["nginx"]["cpus"] == pools["shared"]["shared"]
    assert by_name["batch"]["rdt_class"] == "gold" and by_name["batch"]["blockio_class"] == "BestEffort"
    assert set(by_name["postgres"]) == {"pod", "name", "cpus", "mems", "rdt_class", "blockio_class", "pool"}


def test_simulate_topology_aware_json(tmp_path):
    config = "policy:\n  Active: topology-aware\n  ReservedResources:\n    cpu: 1\n"
    out = simulate(tmp_path, "--machine", "sockets=2,nodes=2,cores=14,threads=2,pmem=2x512G", "--output", "json",
                   config=config)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["policy"] == "topology-aware"
    pools = {p["name"]: p for p in result["pools"]}
    assert len(pools) == 7 and pools["root"]["cpus"] == "0-111"
    assert {len(p["cpus"].split(",")) for n, p in pools.items() if n.startswith("NUMA")} == {2}
    assert pools["NUMA node #0"]["mems"] == "0,4" and pools["NUMA node #0"]["parent"] == "socket #0"
    by_name = {c["name"]: c for c in result["containers"]}
    assert by_name["dns"]["cpus"] == "0"  # kube-system on the reserved CPU
    postgres = by_name["postgres"]
    assert postgres["pool"].startswith("NUMA node #") and len(postgres["cpus"].split(",")) == 2
    # Burstable without a CPU limit: no deeper than a socket (UnlimitedBurstable's default).
    assert by_name["nginx"]["pool"].startswith("socket #")
    assert "topology-aware" in out.stdout


GUARANTEED_1 = "- name: {}\n  containers:\n    - name: main\n      limits: {{cpu: 1, memory: 64Mi}}\n"
BEST_EFFORT = "- name: {}\n  containers:\n    - name: main\n"


@pytest.mark.parametrize("best_effort_first", [False, True])
def test_simulate_best_effort_after_every_shared_cpu_went_exclusive(tmp_path, best_effort_first):
    """7 CPUs allocatable, 7 Guaranteed 1-CPU pods and a best-effort one: all of them run."""
    config = "policy:\n  Active: topology-aware\n  ReservedResources:\n    cpu: cpuset:0\n"
    pods = "".join(GUARANTEED_1.format(f"g{i}") for i in range(7))
    pods = BEST_EFFORT.format("be") + pods if best_effort_first else pods + BEST_EFFORT.format("be")
    out = simulate(tmp_path, "--machine", "sockets=1,nodes=1,cores=8,threads=1", config=config, pods=pods)
    assert out.returncode == 0, out.stderr
    assert "note: exclusive grants hold every shared CPU of pool socket #0: its shared containers run on the " \
           "reserved CPUs 0" in out.stdout
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line.startswith("default/")}
    assert rows["default/be"][4] == "0"  # pod, container, "socket", "#0", CPUs
    assert sorted(int(rows[f"default/g{i}"][4]) for i in range(7)) == list(range(1, 8))


def test_simulate_table_from_a_host_root(tmp_path):
    from resmgr.topology.generate import MachineSpec, generate

    generate(MachineSpec(cores_per_node=4, threads=2), tmp_path / "host")
    out = simulate(tmp_path, "--host-root", str(tmp_path / "host"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "policy: static-plus"
    assert "default/db" in out.stdout and "POOL" in out.stdout


@pytest.mark.parametrize("config,pods,needle", [
    ("policy:\n  Active: fastest\n", PODS, "unknown policy 'fastest'"),
    ("policy:\n  Active: static\n  ReservedResources:\n    cpu: cpuset:0,99\n", PODS, "CPUs 99 are not available"),
    ("policy:\n  Active: static\n",
     "- name: huge\n  containers:\n    - name: c\n      limits: {cpu: 64, memory: 1Gi}\n",
     "default/huge/c needs 64 exclusive CPUs"),
    ("policy:\n  Active: static\n", "- name: bad\n  containers:\n    - name: c\n      requests: {cpu: lots}\n",
     "pod default/bad container c: bad CPU quantity"),
    ("policy:\n  Active: topology-aware\n",
     "- name: huge\n  containers:\n    - name: c\n      limits: {cpu: 64, memory: 1Gi}\n",
     "container default/huge/c: no pool can take 64 exclusive CPU(s)"),
    ("policy:\n  Active: topology-aware\n  topology-aware:\n    PinCPUs: true\n", PODS,
     "policy.topology-aware.PinCPUs: unknown"),
    ("policy:\n  Active: static\n", "name: not-a-list\n", "expected a YAML list"),
])
def test_simulate_bad_input_names_what_is_wrong(tmp_path, config, pods, needle):
    out = simulate(tmp_path, "--machine", "sockets=1,cores=4,threads=2", config=config, pods=pods)
    assert out.returncode != 0
    assert needle in out.stderr
    assert "Traceback" not in out.stderr


def test_shares_round_trip():
    for milli in (0, 100, 250, 500, 1000, 1500, 2000, 64000):
        assert shares_to_milli(milli_to_shares(milli)) == milli
    assert shares_to_milli(2) == 0 and milli_to_shares(0) == 2


def test_quantities():
    assert parse_cpu("500m") == 500 and parse_cpu("2") == 2000 and parse_cpu(1.5) == 1500
    assert parse_memory("1Gi") == 1 << 30 and parse_memory("1G") == 10**9 and parse_memory(123) == 123
    for bad in ("1.5.5", "ten", "5x"):
        with pytest.raises(RequirementError):
            parse_cpu(bad)


def _ctr(res: Resources, annotations=None) -> Container:
    return Container(id="c", pod_id="p", name="app", requested=res, annotations=annotations or {})


def test_requirements_from_cri_and_annotation():
    pod = Pod(id="p", uid="u", name="n", namespace="ns", qos_class=QOSClass.BURSTABLE)
    req = requirements(_ctr(Resources(cpu_shares=512, cpu_quota=150000, cpu_period=100000,
                                      memory_limit_in_bytes=1 << 30)), pod)
    assert (req.cpu_request, req.cpu_limit, req.memory_limit, req.memory_request) == (500, 1500, 1 << 30, 0)
    gpod = Pod(id="p", uid="u", name="n", namespace="ns", qos_class=QOSClass.GUARANTEED)
    greq = requirements(_ctr(Resources(cpu_shares=2048, cpu_quota=200000, cpu_period=100000,
                                       memory_limit_in_bytes=1 << 30)), gpod)
    assert (greq.cpu_request, greq.cpu_limit, greq.memory_request) == (2000, 2000, 1 << 30)
    annotated = Pod(id="p", uid="u", name="n", namespace="ns", qos_class=QOSClass.BURSTABLE, annotations={
        "intel.com/resources": json.dumps({"app": {"requests": {"cpu": "3"}, "limits": {"memory": "2Gi"}}})})
    areq = requirements(_ctr(Resources(cpu_shares=2)), annotated)
    assert (areq.cpu_request, areq.memory_limit) == (3000, 2 << 30)
    broken = Pod(id="p", uid="u", name="n", namespace="ns", annotations={"intel.com/resources": "{nope"})
    with pytest.raises(RequirementError, match="not JSON"):
        requirements(_ctr(Resources()), broken)


def test_simulate_balloons_with_the_picture(tmp_path):
    # The nri-plugins documentation's example, in our policy section.
    config = """policy:
  Active: balloons
  balloons:
    reservedResources: {cpu: 1000m}
    pinCPU: true
    pinMemory: true
    allocatorTopologyBalancing: true
    idleCPUClass: lowpower
    balloonTypes:
      - name: quad
        maxCPUs: 4
        cpuClass: dynamic
        namespaces: ["*"]
"""
    out = simulate(tmp_path, "--machine", "sockets=2,nodes=2,cores=4,threads=2", "--output", "json",
                   "--html", str(tmp_path / "picture.html"), config=config)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    pools = {p["name"]: p for p in result["pools"]}
    assert set(pools) == {"reserved[0]", "default[0]", "quad[0]", "quad[1]"}
    by_name = {c["name"]: c for c in result["containers"]}
    assert by_name["dns"]["pool"] == "reserved[0]" and by_name["dns"]["cpus"] == pools["reserved[0]"]["cpus"]
    assert by_name["postgres"]["pool"] == "quad[0]" and len(CPUSet.parse(by_name["postgres"]["cpus"])) == 4
    # allocatorTopologyBalancing: the next balloon goes where most CPUs are free, the other socket
    assert by_name["nginx"]["pool"] == "quad[1]"
    assert by_name["nginx"]["mems"] != by_name["postgres"]["mems"]
    assert "quad[1]" in (tmp_path / "picture.html").read_text()


def test_declared_policy_options_are_the_schema():
    spec = importlib.util.spec_from_file_location("policy_schema", ROOT / "scripts" / "policy-schema.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.generated() == module.PATH.read_text(), "run scripts/policy-schema.py"


def test_simulate_reads_an_nri_plugins_balloons_resource(tmp_path, caplog):
    config = """apiVersion: config.nri/v1alpha1
kind: BalloonsPolicy
metadata: {name: default, namespace: kube-system}
spec:
  agent: {nodeResourceTopology: true}
  reservedResources: {cpu: 1000m}
  pinMemory: false
  balloonTypes:
  - name: ai-inference
    minCPUs: 16
    minBalloons: 2
    preferNewBalloons: true
  - name: default
    maxCPUs: 16
    namespaces: ["*"]
  instrumentation: {httpEndpoint: ":8891"}
"""
    out = simulate(tmp_path, "--machine", "sockets=2,cores=16,threads=2", "--output", "json", config=config)
    assert out.returncode == 0, out.stderr
    assert "agent, instrumentation left out" in caplog.text  # a warning in the log
    result = json.loads(out.stdout)
    pools = {p["name"]: p for p in result["pools"]}
    assert [len(CPUSet.parse(pools[f"ai-inference[{i}]"]["cpus"])) for i in (0, 1)] == [16, 16]
    by_name = {c["name"]: c for c in result["containers"]}
    assert by_name["postgres"]["pool"] == by_name["nginx"]["pool"] == "default[0]"
    assert all(not c["mems"] for c in result["containers"])  # pinMemory: false
    bad = simulate(tmp_path, "--machine", "cores=4", config="apiVersion: config.nri/v1alpha1\nkind: MemtierdPolicy\n")
    assert bad.returncode == 1 and "kind MemtierdPolicy of config.nri/v1alpha1 is not a policy" in bad.stderr


def test_a_generated_machine_is_removed_once_simulated(tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    assert simulate(tmp_path, "--machine", "sockets=1,cores=8,threads=1").returncode == 0
    assert simulate(tmp_path, "--machine", "cores=4", pods="- {containers: 1}\n").returncode == 1
    assert simulate(tmp_path, "--machine", "cores=x").returncode == 1
    assert list(scratch.iterdir()) == []


STORY = """\
- name: red1
  labels: {team: red}
  containers: [{name: c0, requests: {cpu: 1}, limits: {cpu: 1}}]
- name: blue1
  labels: {team: blue}
  containers: [{name: c0, requests: {cpu: 1}, limits: {cpu: 1}}]
- name: red2
  labels: {team: red}
  containers: [{name: c0, requests: {cpu: 1}, limits: {cpu: 1}}]
- delete: red1
- config:
    policy:
      Active: balloons
      ReservedResources: {cpu: 1}
      balloons:
        BalloonTypes: [{Name: team, Namespaces: ["*"], MinCPUs: 2}]
- name: late
  containers: [{name: c0, requests: {cpu: 1}, limits: {cpu: 1}}]
"""
GROUPED = ("policy:\n  Active: balloons\n  ReservedResources: {cpu: 1}\n  balloons:\n    BalloonTypes:\n"
           "      - {Name: team, Namespaces: ['*'], GroupBy: '${pod/labels/team}'}\n")


def test_simulate_steps_tell_a_placement_story(tmp_path):
    """Pod labels (groupBy), a deletion and a new configuration in the middle, as nri-plugins' end-to-end
    scenarios need them; with --output json the placement after each step."""
    out = simulate(tmp_path, "--machine", "sockets=1,cores=8,threads=1", "--output", "json", pods=STORY,
                   config=GROUPED)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    steps = result["steps"]
    assert [s["step"] for s in steps] == ["create default/red1", "create default/blue1", "create default/red2",
                                          "delete red1", "config (balloons)", "create default/late"]
    pool = {c["pod"]: c["pool"] for c in steps[2]["containers"]}
    assert pool["default/red1"] == pool["default/red2"] != pool["default/blue1"]  # grouped by label
    assert [c["pod"] for c in steps[3]["containers"]] == ["default/blue1", "default/red2"]
    after = {c["pod"]: c for c in steps[4]["containers"]}
    assert all(len(CPUSet.parse(c["cpus"])) == 2 for c in after.values())  # MinCPUs 2 under the new one
    assert [c["pod"] for c in result["containers"]] == ["default/blue1", "default/red2", "default/late"]
    assert "steps" not in json.loads(simulate(tmp_path, "--machine", "sockets=1,cores=8,threads=1",
                                              "--output", "json").stdout)  # only where there are steps


@pytest.mark.parametrize("entry, message", [
    ("- delete: nobody\n", "delete nobody: no such pod"),
    ("- delete: []\n", "delete: expected a pod name or a list of them"),
    ("- config: {policy: {Active: nosuch}}\n", "config"),
    ("- {color: blue}\n", "entry 0 needs at least a name"),
])
def test_simulate_refuses_a_bad_step_naming_it(tmp_path, entry, message):
    out = simulate(tmp_path, "--machine", "sockets=1,cores=4,threads=1", pods=entry)
    assert out.returncode == 1 and message in out.stderr, out.stderr
