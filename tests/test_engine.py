"""Engine behaviour with a scripted runtime: locking, rollback, policy decisions."""

from __future__ import annotations

import asyncio

import pytest

from policies import Decision, Policy
from resmgr.cri import api_pb2 as cri
from resmgr.engine import Engine
from resmgr.model import ContainerState, Resources
from resmgr.store import StateStore
from tests.helpers import container_config, pod_config


class FakeRuntime:
    def __init__(self) -> None:
        self.pods: list[cri.PodSandbox] = []
        self.containers: list[cri.Container] = []
        self.updates: list[tuple[str, cri.LinuxContainerResources]] = []

    async def version(self):
        return cri.VersionResponse(runtime_name="containerd")

    async def list_pods(self):
        return list(self.pods)

    async def pod_status(self, pod_id):
        return cri.PodSandboxStatusResponse(info={"info": '{"config": {"linux": {"cgroup_parent": '
                                                          '"/kubepods/burstable/podx"}}}'})

    async def list_containers(self):
        return list(self.containers)

    async def container_status(self, cid):
        return cri.ContainerStatusResponse(status=cri.ContainerStatus(
            id=cid, resources=cri.ContainerResources(linux=cri.LinuxContainerResources(cpu_shares=2))))

    async def update_resources(self, cid, res):
        self.updates.append((cid, res))


class PinningPolicy(Policy):
    """Gives each new container CPU n (n = order of arrival) and re-pins everyone else."""

    name = "test-pinning"

    def allocate(self, container, pod, view):
        n = len(view.containers) - 1
        others = {k: Resources(cpuset_cpus=f"0-{n}") for k in view.containers if k != container.key}
        return Decision(resources=Resources(cpuset_cpus=str(n), cpu_shares=1024), updates=others,
                        rdt_class="gold")

    def update(self, container, requested, view):
        return Decision(resources=Resources(cpuset_cpus=container.resources.cpuset_cpus,
                                            cpu_shares=requested.cpu_shares))


@pytest.fixture
def engine(tmp_path):
    store = StateStore(tmp_path)
    store.prepare()
    return Engine(PinningPolicy(), store, FakeRuntime())


async def _run_pod(engine, name="p"):
    cfg = pod_config(name)

    async def send(req):
        return cri.RunPodSandboxResponse(pod_sandbox_id=f"pod-{name}")

    await engine.run_pod_sandbox(cri.RunPodSandboxRequest(config=cfg), send)
    return f"pod-{name}", cfg


async def _create(engine, pod_id, cfg, cid="c1", name="a"):
    async def send(req):
        return cri.CreateContainerResponse(container_id=cid)

    await engine.create_container(cri.CreateContainerRequest(
        pod_sandbox_id=pod_id, config=container_config(name), sandbox_config=cfg), send)


async def test_lock_is_not_held_across_runtime_calls(engine):
    pod_id, cfg = await _run_pod(engine)
    both_inside = asyncio.Event()
    inside = 0

    async def send(req):
        nonlocal inside
        inside += 1
        if inside == 2:
            both_inside.set()
        await asyncio.wait_for(both_inside.wait(), 2)  # deadlocks if calls are serialized
        return cri.CreateContainerResponse(container_id=f"c-{req.config.metadata.name}")

    reqs = [cri.CreateContainerRequest(pod_sandbox_id=pod_id, config=container_config(n), sandbox_config=cfg)
            for n in ("a", "b")]
    await asyncio.gather(*(engine.create_container(r, send) for r in reqs))
    assert set(engine.containers) == {"c-a", "c-b"}


async def test_create_rewrites_request_and_updates_others(engine):
    pod_id, cfg = await _run_pod(engine)
    sent = []

    async def send(req):
        sent.append(req)
        return cri.CreateContainerResponse(container_id=f"c{len(sent)}")

    for name in ("a", "b"):
        req = cri.CreateContainerRequest(pod_sandbox_id=pod_id, config=container_config(
            name, resources=cri.LinuxContainerResources(cpu_shares=2, memory_limit_in_bytes=1 << 20)),
            sandbox_config=cfg)
        await engine.create_container(req, send)
    assert sent[1].config.linux.resources.cpuset_cpus == "1"
    assert sent[1].config.linux.resources.cpu_shares == 1024
    assert engine.containers["c2"].requested.cpu_shares == 2
    assert engine.containers["c2"].rdt_class == "gold"
    assert [(cid, r.cpuset_cpus) for cid, r in engine.runtime.updates] == [("c1", "0-1")]
    assert engine.containers["c1"].resources.cpuset_cpus == "0-1"


async def test_failed_create_rolls_back(engine):
    pod_id, cfg = await _run_pod(engine)

    async def send(req):
        raise RuntimeError("runtime says no")

    with pytest.raises(RuntimeError, match="runtime says no"):
        await engine.create_container(cri.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=container_config("a"), sandbox_config=cfg), send)
    assert engine.containers == {}


async def test_kubelet_update_is_forwarded_with_pinning_kept(engine):
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg)
    forwarded = []

    async def update(req):
        forwarded.append(req)
        return cri.UpdateContainerResourcesResponse()

    await engine.update_container_resources(cri.UpdateContainerResourcesRequest(
        container_id="c1", linux=cri.LinuxContainerResources(cpu_shares=300, cpuset_cpus="0-63")), update)
    assert len(forwarded) == 1
    assert forwarded[0].linux.cpuset_cpus == "0" and forwarded[0].linux.cpu_shares == 300
    assert engine.containers["c1"].requested.cpuset_cpus == "0-63"


async def test_stop_releases_even_when_runtime_fails(engine):
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg)

    async def stop(req):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        await engine.stop_container(cri.StopContainerRequest(container_id="c1"), stop)
    assert engine.containers["c1"].state == ContainerState.EXITED


async def test_recreated_container_releases_the_old_one(engine):
    pod_id, cfg = await _run_pod(engine)
    ids = iter(["c1", "c2"])

    async def create(req):
        return cri.CreateContainerResponse(container_id=next(ids))

    for attempt in (0, 1):
        cc = container_config("a")
        cc.metadata.attempt = attempt
        await engine.create_container(cri.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=cc, sandbox_config=cfg), create)
    assert engine.containers["c1"].state == ContainerState.EXITED
    assert engine.containers["c2"].state == ContainerState.CREATED


async def test_reconcile_drops_vanished_adopts_new_and_keeps_fresh(engine):
    gone_pod, _ = await _run_pod(engine, "gone")
    rt = engine.runtime
    rt.pods = [cri.PodSandbox(id="pod-new", metadata=cri.PodSandboxMetadata(name="new", uid="u", namespace="ns"))]
    rt.containers = [cri.Container(id="c-new", pod_sandbox_id="pod-new", state=cri.CONTAINER_RUNNING,
                                   metadata=cri.ContainerMetadata(name="x"))]
    original_list = rt.list_containers

    async def list_and_race():
        # A pod created through the relay while reconciliation is listing.
        await _run_pod(engine, "fresh")
        return await original_list()

    rt.list_containers = list_and_race
    await engine.reconcile()
    assert set(engine.pods) == {"pod-new", "pod-fresh"}
    assert engine.pods["pod-new"].qos_class.value == "Burstable"
    assert engine.containers["c-new"].state == ContainerState.RUNNING
    # Adopted containers are allocated by the policy and pushed to the runtime.
    assert ("c-new", "0") in [(cid, r.cpuset_cpus) for cid, r in rt.updates]
    assert gone_pod not in engine.pods


async def test_state_round_trips_through_the_store(engine, tmp_path):
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg)
    again = Engine(PinningPolicy(), StateStore(tmp_path), FakeRuntime())
    again.restore(StateStore(tmp_path).load())
    assert again.pods == engine.pods
    assert again.containers == engine.containers


async def test_runtime_ends_with_the_latest_decision(engine):
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg, cid="c1", name="shared")
    release_a = asyncio.Event()

    async def send(req):
        name = req.config.metadata.name
        if name == "a":
            await release_a.wait()  # A's create lands after B's
        return cri.CreateContainerResponse(container_id=f"c-{name}")

    def req(name):
        return cri.CreateContainerRequest(pod_sandbox_id=pod_id, config=container_config(name), sandbox_config=cfg)

    task_a = asyncio.create_task(engine.create_container(req("a"), send))
    await asyncio.sleep(0)  # A has decided and is inside the runtime
    await engine.create_container(req("b"), send)
    release_a.set()
    await task_a
    pushed = [r.cpuset_cpus for cid, r in engine.runtime.updates if cid == "c1"]
    assert pushed[-1] == "0-2"  # B decided last: everyone else on 0-2
    assert engine.containers["c1"].resources.cpuset_cpus == "0-2"



async def test_reconfigure_and_rebalance_push_what_moved(tmp_path):
    from policies import PolicyError, create
    from tests.world import machine

    topo = machine("sockets=1,nodes=2,cores=2,threads=1")  # node 0 = CPUs 0-1, node 1 = 2-3
    store = StateStore(tmp_path)
    store.prepare()
    runtime = FakeRuntime()
    eng = Engine(create("topology-aware", {"Active": "topology-aware"}, topo), store, runtime)
    cfg = pod_config("p", qos="guaranteed")

    async def run(req):
        return cri.RunPodSandboxResponse(pod_sandbox_id="pod")

    await eng.run_pod_sandbox(cri.RunPodSandboxRequest(config=cfg), run)

    async def create_as(cid, name, resources):
        async def send(req):
            return cri.CreateContainerResponse(container_id=cid)

        await eng.create_container(cri.CreateContainerRequest(
            pod_sandbox_id="pod", config=container_config(name, resources=resources), sandbox_config=cfg), send)

    await create_as("g", "big", cri.LinuxContainerResources(cpu_shares=2048, cpu_quota=200000, cpu_period=100000))
    await create_as("s", "small", cri.LinuxContainerResources(cpu_shares=512))
    assert eng.containers["g"].resources.cpuset_cpus == "0-1"
    assert eng.containers["s"].resources.cpuset_cpus == "2-3"
    # A reserved CPU under the exclusive grant is refused and nothing changes.
    with pytest.raises(PolicyError, match="grant of g"):
        await eng.reconfigure({"Active": "topology-aware", "ReservedResources": {"cpu": "cpuset:0"}})
    assert runtime.updates == []
    await eng.reconfigure({"Active": "topology-aware", "ReservedResources": {"cpu": "cpuset:3"}})
    assert [(cid, r.cpuset_cpus) for cid, r in runtime.updates] == [("s", "2")]
    assert eng.store.load()["policy"]["data"]["grants"]["g"]["exclusive"] == "0-1"

    async def removed(req):
        return cri.RemoveContainerResponse()

    await eng.remove_container(cri.RemoveContainerRequest(container_id="g"), removed)
    assert await eng.rebalance() == 1  # node 0 is free now and has more room
    assert runtime.updates[-1][0] == "s" and runtime.updates[-1][1].cpuset_cpus == "0-1"
    assert await eng.rebalance() == 0


async def test_create_records_device_topology_hints(engine):
    engine.device_hints = lambda paths: {p: [1] for p in paths if p.startswith("/dev/")}
    pod_id, cfg = await _run_pod(engine)

    async def send(req):
        return cri.CreateContainerResponse(container_id="c-dev")

    config = container_config("gpu")
    config.devices.add(container_path="/dev/nvidia0", host_path="/dev/nvidia0", permissions="rw")
    await engine.create_container(cri.CreateContainerRequest(pod_sandbox_id=pod_id, config=config,
                                                             sandbox_config=cfg), send)
    assert engine.containers["c-dev"].hints == {"/dev/nvidia0": [1]}
    assert engine.snapshot()["containers"][0]["hints"] == {"/dev/nvidia0": [1]}
