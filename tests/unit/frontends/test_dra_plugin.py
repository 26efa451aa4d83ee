"""cri-resmgr's DRA driver on real unix sockets, as kubelet calls it: registration, prepare and
unprepare through the engine (topology-aware on a generated machine), the CDI specs it writes,
the relay's reading of a container's claim from its CDI devices, and a restart keeping claims."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path

import grpc
import pytest

from resmgr import cdi, policies
from resmgr.engine import Engine
from resmgr.engine.store import StateStore
from resmgr.frontends.cri.lifecycle import CriLifecycle
from resmgr.frontends.cri.runtime import CriRuntime
from resmgr.frontends.dra.allocation import ClaimError, ClaimGone, claim
from resmgr.frontends.dra.plugin import DraPlugin, check_driver_name, claims_on_disk
from resmgr.generated.cri import api_pb2 as cri
from resmgr.generated.dra import api_pb2 as dra
from resmgr.generated.dra import api_pb2_grpc as dra_grpc
from resmgr.generated.dra import health_pb2 as health
from resmgr.generated.dra import health_pb2_grpc as health_grpc
from resmgr.generated.pluginregistration import api_pb2 as reg
from resmgr.generated.pluginregistration import api_pb2_grpc as reg_grpc
from resmgr.topology.cpuset import CPUSet
from tests.support.fakeruntime import FakeRuntime
from tests.support.helpers import container_config, pod_config
from tests.support.world import machine

DRIVER = "cpu.cri-resource-manager.intel.com"
SNC = machine("sockets=2,nodes=2,cores=4,threads=2")  # NUMA nodes of 8 CPUs


def claim_doc(uid: str, name: str, device: str, cpus: str | None = "2", driver: str = DRIVER) -> dict:
    result = {"request": "cpus", "driver": driver, "pool": "node-a", "device": device}
    if cpus is not None:
        result["consumedCapacity"] = {"cpu": cpus}
    return {"metadata": {"namespace": "default", "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": [result]}}}}


def test_a_claim_is_read_from_its_allocation() -> None:
    got = claim(claim_doc("u", "c", "numa-1", "1500m"), DRIVER, "u")
    assert (got.device, got.cpus, got.requests, got.pool) == ("numa-1", 2, ["cpus"], "node-a")
    assert claim(claim_doc("u", "c", "numa-1", None), DRIVER, "u").cpus == 0  # the whole device
    with pytest.raises(ClaimError, match="another object now"):
        claim(claim_doc("v", "c", "numa-1"), DRIVER, "u")
    with pytest.raises(ClaimError, match="no device of driver"):
        claim(claim_doc("u", "c", "numa-1", driver="gpu.example.com"), DRIVER, "u")
    two = claim_doc("u", "c", "numa-1")
    two["status"]["allocation"]["devices"]["results"].append({**two["status"]["allocation"]["devices"]["results"][0],
                                                              "device": "numa-2"})
    with pytest.raises(ClaimError, match="devices numa-1 and numa-2 of driver"):
        claim(two, DRIVER, "u")
    with pytest.raises(ClaimError, match="not a ResourceClaim"):
        claim({"metadata": {"uid": "u"}, "status": {"allocation": {"devices": {"results": ["x"]}}}}, DRIVER, "u")
    with pytest.raises(ValueError, match="DNS subdomain"):
        check_driver_name("CPU_driver")


class Node:
    """An engine on a state directory, and the driver on a kubelet directory (short paths: sockets)."""

    def __init__(self, root: Path, claims: dict[str, dict]) -> None:
        self.root, self.claims = root, claims
        store = StateStore(root / "state")
        store.prepare()
        self.runtime = FakeRuntime()
        self.engine = Engine(policies.create("topology-aware", {"Active": "topology-aware"}, SNC), store,
                             CriRuntime(self.runtime))
        self.engine.state.restore(store.load())

        async def fetch(namespace: str, name: str) -> dict:
            if name not in self.claims:  # as the agent's NOT_FOUND reads
                raise ClaimGone(f"claim {namespace}/{name}: not found")
            return self.claims[name]
        self.online = SNC.online
        self.plugin = DraPlugin(DRIVER, str(root / "kubelet"), str(root / "cdi"), self.engine, fetch,
                                online=lambda: self.online, health_interval=0.05)

    async def prepare(self, *names: str) -> dict[str, dra.NodePrepareResourceResponse]:
        async with grpc.aio.insecure_channel("unix://" + self.plugin.endpoint) as channel:
            asked = [dra.Claim(namespace="default", uid=self.claims.get(n, {}).get("metadata", {}).get("uid", n),
                               name=n) for n in names]
            reply = await dra_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra.NodePrepareResourcesRequest(claims=asked))
        return dict(reply.claims)


@pytest.fixture
def root():
    path = Path(tempfile.mkdtemp(prefix="crirm-dra-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_kubelet_prepares_claims_and_the_container_runs_on_their_cpus(root: Path) -> None:
    claims = {"two": claim_doc("u-two", "two", "numa-1", "2"), "big": claim_doc("u-big", "big", "numa-0", "9")}
    node = Node(root, claims)
    await node.plugin.start()
    try:
        async with grpc.aio.insecure_channel("unix://" + node.plugin.registry_socket) as channel:
            info = await reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest())
        assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == \
            ("DRAPlugin", DRIVER, node.plugin.endpoint, ["v1.DRAPlugin", "v1.DRAResourceHealth"])
        assert node.plugin.registry_socket == str(root / "kubelet" / "plugins_registry" / f"{DRIVER}-reg.sock")

        answers = await node.prepare("two", "big", "gone")
        device = answers["u-two"].devices[0]
        assert (list(device.request_names), device.pool_name, device.device_name, list(device.cdi_device_ids)) == \
            (["cpus"], "node-a", "numa-1", [cdi.device_id("u-two")])
        assert "device numa-0 can give 8 CPU(s), the claim asks for 9" in answers["u-big"].error
        assert "claim default/gone: not found" in answers["gone"].error
        held = node.engine.state.policy.describe_claim("u-two")["cpus"]
        assert CPUSet.parse(held) <= SNC.nodes[1].cpus and len(CPUSet.parse(held)) == 2
        spec = json.loads((root / "cdi" / cdi.spec_file("u-two")).read_text())
        assert spec["kind"] == cdi.KIND and spec["devices"][0]["containerEdits"]["env"] == \
            [f"{cdi.env_name('u-two')}={held}"]
        assert (await node.prepare("two"))["u-two"].devices[0].device_name == "numa-1"  # asked again: the same

        # The relay reads the claim from the container's CDI devices: the container runs on its CPUs.
        lifecycle = CriLifecycle(node.engine)
        cfg = pod_config("p")

        async def run_pod(req):
            return cri.RunPodSandboxResponse(pod_sandbox_id="pod-p")
        await lifecycle.run_pod_sandbox(cri.RunPodSandboxRequest(config=cfg), run_pod)
        sent = []

        async def create(req):
            sent.append(req)
            return cri.CreateContainerResponse(container_id="c1")
        config = container_config("app")
        config.CDI_devices.add(name=cdi.device_id("u-two"))
        config.CDI_devices.add(name="vendor.example.com/gpu=0")
        await lifecycle.create_container(cri.CreateContainerRequest(pod_sandbox_id="pod-p", config=config,
                                                                    sandbox_config=cfg), create)
        assert sent[0].config.linux.resources.cpuset_cpus == held
        assert sent[0].config.linux.resources.cpuset_mems == "1"
        assert [d.name for d in sent[0].config.CDI_devices] == [cdi.device_id("u-two"), "vendor.example.com/gpu=0"]
    finally:
        await node.plugin.stop()
        await node.engine.state.flush()

    # A restart keeps the claim: a spec lost meanwhile is written again, a stray one removed.
    (root / "cdi" / cdi.spec_file("u-two")).unlink()
    (root / "cdi" / cdi.spec_file("stray")).write_text("{}")
    again = Node(root, claims)
    await again.plugin.start()
    try:
        assert again.engine.state.policy.describe_claim("u-two")["cpus"] == held
        assert sorted(p.name for p in (root / "cdi").iterdir()) == [cdi.spec_file("u-two")]
        async with grpc.aio.insecure_channel("unix://" + again.plugin.endpoint) as channel:
            reply = await dra_grpc.DRAPluginStub(channel).NodeUnprepareResources(
                dra.NodeUnprepareResourcesRequest(claims=[dra.Claim(namespace="default", uid="u-two", name="two")]))
        assert reply.claims["u-two"].error == ""
        assert not list((root / "cdi").iterdir())
        # Its container still runs there: the CPUs go with it.
        assert again.engine.state.policy.describe_claim("u-two")["unprepared"]
        assert "u-two" not in again.engine.state.policy.prepared_claims()
    finally:
        await again.plugin.stop()


async def test_claims_prepared_before_a_state_lost_are_held_again_from_their_specs(root: Path) -> None:
    """The state file set aside (cut, say): kubelet takes its claims as prepared and will not ask
    again, so the claims the CDI specs record are held again before the first reconciliation."""
    claims = {n: claim_doc(f"u-{n}", n, "numa-1", "2") for n in ("a", "b")}
    node = Node(root, claims)
    await node.plugin.start()
    try:
        answers = await node.prepare(*claims)
        assert all(not a.error for a in answers.values()), answers
        recorded = cdi.spec_claim(json.loads((root / "cdi" / cdi.spec_file("u-a")).read_text()))
        assert recorded is not None and (recorded["namespace"], recorded["name"], recorded["device"],
                                         recorded["cpus"]) == ("default", "a", "numa-1", 2)
    finally:
        await node.plugin.stop()
        await node.engine.state.flush()
    shutil.rmtree(root / "state")  # what a state file set aside leaves
    (root / "cdi" / cdi.spec_file("u-old")).write_text(json.dumps(cdi.spec("u-old", "3")))  # records no claim
    again = Node(root, claims)
    assert again.engine.state.policy.prepared_claims() == {}
    held = again.engine.claiming.recover(claims_on_disk(root / "cdi"))
    assert sorted(c.uid for c in held) == ["u-a", "u-b"]
    cpus = [CPUSet.parse(again.engine.state.policy.describe_claim(u)["cpus"]) for u in ("u-a", "u-b")]
    assert all(len(c) == 2 and c <= SNC.nodes[1].cpus for c in cpus) and not cpus[0] & cpus[1]
    assert again.engine.claiming.recover(claims_on_disk(root / "cdi")) == []  # held already: nothing more
    await again.plugin.start()
    try:
        assert sorted(p.name for p in (root / "cdi").iterdir()) == [cdi.spec_file(u) for u in ("u-a", "u-b")]
    finally:
        await again.plugin.stop()


async def test_claims_nobody_will_unprepare_are_collected(root: Path) -> None:
    claims = {n: claim_doc(f"u-{n}", n, "numa-1", "1") for n in ("kept", "deleted", "deallocated", "unreadable")}
    node = Node(root, claims)
    await node.plugin.start()
    try:
        answers = await node.prepare(*claims)
        assert all(not a.error for a in answers.values()), answers
        del claims["deleted"]  # the fetch says: not found
        claims["deallocated"]["status"] = {}
        claims["unreadable"] = "not a claim"  # type: ignore[assignment]  # the agent answers nonsense: kept
        assert await node.plugin.collect_once() == ["u-deallocated", "u-deleted"]
        assert sorted(node.engine.state.policy.prepared_claims()) == ["u-kept", "u-unreadable"]
        assert not (root / "cdi" / cdi.spec_file("u-deallocated")).exists()
    finally:
        await node.plugin.stop()


async def test_a_pods_claims_are_read_together(root: Path) -> None:
    claims = {n: claim_doc(f"u-{n}", n, "numa-1", "1") for n in ("a", "b")}
    node = Node(root, claims)
    reading, most = 0, 0
    plain = node.plugin.node.fetch

    async def slow(namespace: str, name: str) -> dict:
        nonlocal reading, most
        reading += 1
        most = max(most, reading)
        await asyncio.sleep(0.05)
        reading -= 1
        return await plain(namespace, name)
    node.plugin.node.fetch = slow
    await node.plugin.start()
    try:
        answers = await node.prepare("a", "b", "gone")
        assert most == 3
        assert [answers[u].error for u in ("u-a", "u-b")] == ["", ""]
        assert "claim default/gone: not found" in answers["gone"].error
    finally:
        await node.plugin.stop()
        await node.engine.state.flush()


async def test_kubelet_hears_a_device_unhealthy_while_its_cpus_are_offline(root: Path) -> None:
    node = Node(root, {"two": claim_doc("u-two", "two", "numa-1", "2")})
    await node.plugin.start()
    try:
        async with grpc.aio.insecure_channel("unix://" + node.plugin.endpoint) as channel:
            stream = health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(health.NodeWatchResourcesRequest())
            first = await stream.read()
            assert list(first.devices) == []  # nothing prepared: no device of a pool kubelet knows
            await node.prepare("two")

            async def next_of(want: int) -> health.DeviceHealth:
                async with asyncio.timeout(5):
                    while True:
                        reply = await stream.read()
                        if reply.devices and reply.devices[0].health == want:
                            return reply.devices[0]
            now = await next_of(health.HEALTHY)
            assert (now.device.pool_name, now.device.device_name) == ("node-a", "numa-1")
            assert now.health_check_timeout_seconds >= 1 and now.last_updated_time > 0

            node.online = SNC.online - CPUSet.parse("5")  # a CPU of NUMA node 1 goes offline
            sick = await next_of(health.UNHEALTHY)
            assert sick.message == "CPUs 5 of device numa-1 are offline"
            node.online = SNC.online
            await next_of(health.HEALTHY)
            stream.cancel()
    finally:
        await node.plugin.stop()
        await node.engine.state.flush()


async def test_a_container_adopted_with_the_state_lost_runs_on_its_claim_held_again(root: Path) -> None:
    """The state set aside with a claim's container running: the claim is held again from its spec,
    and the container, adopted from the runtime, is its user on its CPUs (its CDI devices, in the
    runtime's verbose status, name the claim), not a shared container beside it."""
    claims = {"a": claim_doc("u-a", "a", "numa-1", "2")}
    node = Node(root, claims)
    await node.plugin.start()
    try:
        assert not (await node.prepare("a"))["u-a"].error
    finally:
        await node.plugin.stop()
        await node.engine.state.flush()
    held = node.engine.state.policy.describe_claim("u-a")["cpus"]
    shutil.rmtree(root / "state")
    again = Node(root, claims)
    again.runtime.pod("pod-p")
    again.runtime.run("c1", "pod-p", name="app")
    again.runtime.cpusets["c1"] = held
    again.runtime.cdi["c1"] = [cdi.device_id("u-a"), "vendor.example.com/gpu=0"]
    assert [c.uid for c in again.engine.claiming.recover(claims_on_disk(root / "cdi"))] == ["u-a"]
    await again.engine.reconcile()
    (c,) = again.engine.state.containers.values()
    assert c.claims == ["u-a"]
    claim = again.engine.state.policy.describe_claim("u-a")
    assert claim["users"] == [c.key]
    assert c.resources.cpuset_cpus == claim["cpus"]


async def test_an_unprepare_is_answered_without_waiting_for_the_cpus_it_gives_back_to_be_taken(root: Path) -> None:
    """Kubelet's NodeUnprepareResources has a deadline; the shared containers widened onto the
    claim's CPUs are pushed behind the answer, so a runtime stalling their updates cannot hold it."""
    claims = {"two": claim_doc("u-two", "two", "numa-0", "2")}  # where the shared container runs
    node = Node(root, claims)
    lifecycle = CriLifecycle(node.engine)
    cfg = pod_config("p")

    async def run_pod(req):
        return cri.RunPodSandboxResponse(pod_sandbox_id="pod-p")

    async def create(req):
        return cri.CreateContainerResponse(container_id="shared")
    await lifecycle.run_pod_sandbox(cri.RunPodSandboxRequest(config=cfg), run_pod)
    await lifecycle.create_container(cri.CreateContainerRequest(pod_sandbox_id="pod-p", config=container_config("app"),
                                                                sandbox_config=cfg), create)
    await node.plugin.start()
    try:
        assert not (await node.prepare("two"))["u-two"].error
        await node.engine.state.settle_updates()
        shared = node.engine.state.containers["shared"]
        narrowed = shared.resources.cpuset_cpus
        stalled = asyncio.Event()

        async def stalled_update(cid, res):
            await stalled.wait()
            node.runtime.cpusets[cid] = res.cpuset_cpus
        node.runtime.update_resources = stalled_update
        async with grpc.aio.insecure_channel("unix://" + node.plugin.endpoint) as channel:
            reply = await dra_grpc.DRAPluginStub(channel).NodeUnprepareResources(
                dra.NodeUnprepareResourcesRequest(claims=[dra.Claim(namespace="default", uid="u-two", name="two")]),
                timeout=2.0)
        assert reply.claims["u-two"].error == ""
        widened = shared.resources.cpuset_cpus
        assert CPUSet.parse(narrowed) <= CPUSet.parse(widened) != CPUSet.parse(narrowed) and shared.pending
        stalled.set()
        await node.engine.state.settle_updates()
        assert node.runtime.cpusets["shared"] == widened and not shared.pending
    finally:
        await node.plugin.stop()
