"""One contract for every front end: the CRI relay and the NRI plugin driven through the same scenarios.

Each driver speaks its own protocol to the front end's real entry point (the relay's
Dispatcher.call with serialized CRI requests; the NRI plugin's handle() with ttrpc calls)
and reports, in model terms, what the runtime is told: each container's CPUs and the
status code of a refused call. The scenarios hold both to the same answers.
"""

from __future__ import annotations

import asyncio
import itertools

import grpc
import pytest

from resmgr import policies
from resmgr.engine import Engine
from resmgr.engine.store import StateStore
from resmgr.frontends import errors
from resmgr.frontends.cri.runtime import CriRuntime
from resmgr.frontends.nri import plugin as nriplugin
from resmgr.frontends.nri.plugin import NriPlugin
from resmgr.frontends.nri.runtime import NriRuntime
from resmgr.frontends.nri.transport import Call, RpcError
from resmgr.frontends.relay.dispatch import Dispatcher
from resmgr.frontends.relay.methods import KNOWN
from resmgr.generated.cri import api_pb2 as cri
from resmgr.generated.nri import api_pb2 as nri
from resmgr.model import ContainerState
from resmgr.requests import milli_to_shares
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.generate import generate, parse_spec
from resmgr.topology.sysfs import discover
from tests.support.fakeruntime import FakeRuntime
from tests.support.helpers import container_config, pod_config

CONFIG = {"Active": "static", "ReservedResources": {"cpu": 1}}
CRI_BASE = "/runtime.v1.RuntimeService/"


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    root = tmp_path_factory.mktemp("machine")
    generate(parse_spec("sockets=1,cores=4,threads=1"), root)
    return discover(str(root))


class _Call:
    """What grpc.aio's unary call gives the relay: awaitable, with metadata."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply

    def __await__(self):
        yield from []
        return self.reply

    async def initial_metadata(self):
        return ()

    async def trailing_metadata(self):
        return ()


class _Channel:
    """The runtime behind the relay: makes pods and containers, and records what it was told."""

    def __init__(self, driver: CriDriver) -> None:
        self.driver = driver

    def unary_unary(self, path, request_serializer=None, response_deserializer=None):
        def call(msg, timeout=None, metadata=None):
            return _Call(self.driver.runtime_call(path, msg))
        return call


class CriDriver:
    name = "cri"

    def __init__(self, policy, store: StateStore) -> None:
        self.runtime = FakeRuntime()  # the engine's own calls: listing, updates of other containers
        self.engine = Engine(policy, store, CriRuntime(self.runtime))
        channel = _Channel(self)
        self.dispatcher = Dispatcher(self.engine, channel, channel)
        self.ids = itertools.count(1)
        self.told: dict[str, str] = {}
        self.configs: dict[str, cri.PodSandboxConfig] = {}

    def runtime_call(self, path: str, msg) -> bytes:
        method = path.rsplit("/", 1)[1]
        if method == "RunPodSandbox":
            pod_id = f"pod-{next(self.ids)}"
            self.configs[pod_id] = msg.config
            self.runtime.pod(pod_id)
            return cri.RunPodSandboxResponse(pod_sandbox_id=pod_id).SerializeToString()
        if method == "CreateContainer":
            cid = f"ctr-{next(self.ids)}"
            self.told[cid] = msg.config.linux.resources.cpuset_cpus
            self.runtime.run(cid, msg.pod_sandbox_id, msg.config.metadata.name, state=cri.CONTAINER_CREATED)
            return cri.CreateContainerResponse(container_id=cid).SerializeToString()
        return KNOWN[path].response().SerializeToString()

    async def _call(self, method: str, req) -> tuple[str, bytes | None]:
        outcome = await self.dispatcher.call(CRI_BASE + method, req.SerializeToString(), None, None)
        await self.engine.state.settle_updates()
        return outcome.code.name, outcome.reply

    async def run_pod(self, name: str, qos: str) -> str:
        _, reply = await self._call("RunPodSandbox", cri.RunPodSandboxRequest(config=pod_config(name, qos=qos)))
        return cri.RunPodSandboxResponse.FromString(reply).pod_sandbox_id

    async def create(self, pod_id: str, name: str, milli: int, guaranteed: bool) -> tuple[str, str]:
        res = cri.LinuxContainerResources(cpu_shares=milli_to_shares(milli), cpu_period=100000,
                                          cpu_quota=milli * 100 if guaranteed else 0,
                                          memory_limit_in_bytes=64 << 20 if guaranteed else 0)
        req = cri.CreateContainerRequest(pod_sandbox_id=pod_id, config=container_config(name, resources=res),
                                         sandbox_config=self.configs[pod_id])
        code, reply = await self._call("CreateContainer", req)
        return code, cri.CreateContainerResponse.FromString(reply).container_id if reply else ""

    async def start(self, cid: str) -> str:
        code, _ = await self._call("StartContainer", cri.StartContainerRequest(container_id=cid))
        return code

    async def stop(self, cid: str) -> str:
        code, _ = await self._call("StopContainer", cri.StopContainerRequest(container_id=cid))
        self.runtime.run(cid, self.engine.state.containers[cid].pod_id, state=cri.CONTAINER_EXITED)
        return code

    def cpus(self, cid: str) -> str:
        pushed = [res.cpuset_cpus for c, res in self.runtime.updates if c == cid]
        return pushed[-1] if pushed else self.told[cid]


class NriDriver:
    name = "nri"

    def __init__(self, policy, store: StateStore) -> None:
        self.runtime = NriRuntime()
        self.engine = Engine(policy, store, self.runtime)
        self.plugin = NriPlugin(self.engine, self.runtime)
        self.plugin.events = nriplugin.mask(nriplugin.EVENTS)
        self.runtime.connected(self._update_containers)
        self.ids = itertools.count(1)
        self.pods: dict[str, nri.PodSandbox] = {}
        self.containers: dict[str, nri.Container] = {}
        self.told: dict[str, str] = {}

    async def _update_containers(self, updates: list[nri.ContainerUpdate]) -> list[nri.ContainerUpdate]:
        self._record(updates)
        return []

    def _record(self, updates) -> None:
        for u in updates:
            if u.linux.resources.cpu.cpus:
                self.told[u.container_id] = u.linux.resources.cpu.cpus

    async def _call(self, method: str, req, answer) -> tuple[str, object | None]:
        try:
            raw = await self.plugin.handle(Call(nriplugin.SERVICE, method, req.SerializeToString(), None))
        except RpcError as err:
            return nriplugin.CODE_NAMES[err.code], None
        await self.engine.state.settle_updates()
        return "OK", answer.FromString(raw)

    async def run_pod(self, name: str, qos: str) -> str:
        cfg = pod_config(name, qos=qos)
        pod = nri.PodSandbox(id=f"pod-{next(self.ids)}", name=name, uid=cfg.metadata.uid,
                             namespace=cfg.metadata.namespace, labels=dict(cfg.labels))
        pod.linux.cgroup_parent = cfg.linux.cgroup_parent
        self.pods[pod.id] = pod
        await self._call("RunPodSandbox", nri.RunPodSandboxRequest(pod=pod), nri.RunPodSandboxResponse)
        return pod.id

    async def create(self, pod_id: str, name: str, milli: int, guaranteed: bool) -> tuple[str, str]:
        c = nri.Container(id=f"ctr-{next(self.ids)}", pod_sandbox_id=pod_id, name=name)
        cpu = c.linux.resources.cpu
        cpu.shares.value, cpu.period.value = milli_to_shares(milli), 100000
        if guaranteed:
            cpu.quota.value = milli * 100
            c.linux.resources.memory.limit.value = 64 << 20
        code, resp = await self._call("CreateContainer", nri.CreateContainerRequest(pod=self.pods[pod_id],
                                                                                    container=c),
                                      nri.CreateContainerResponse)
        if resp is None:
            return code, ""
        self.containers[c.id] = c
        self.told[c.id] = resp.adjust.linux.resources.cpu.cpus
        self._record(resp.update)
        return code, c.id

    async def start(self, cid: str) -> str:
        c, pod = self.containers[cid], self.pods[self.containers[cid].pod_sandbox_id]
        code, _ = await self._call("StartContainer", nri.StartContainerRequest(pod=pod, container=c),
                                   nri.StartContainerResponse)
        c.state = nri.CONTAINER_RUNNING
        await self._call("PostStartContainer", nri.PostStartContainerRequest(pod=pod, container=c),
                         nri.PostStartContainerResponse)
        return code

    async def stop(self, cid: str) -> str:
        c, pod = self.containers[cid], self.pods[self.containers[cid].pod_sandbox_id]
        code, resp = await self._call("StopContainer", nri.StopContainerRequest(pod=pod, container=c),
                                      nri.StopContainerResponse)
        if resp is not None:
            self._record(resp.update)
        return code

    def cpus(self, cid: str) -> str:
        return self.told[cid]


@pytest.fixture
def drivers(machine, tmp_path):
    """Both front ends, each on an engine of its own with the same policy and machine."""
    out = []
    for cls in (CriDriver, NriDriver):
        store = StateStore(tmp_path / cls.name)
        store.prepare()
        out.append(cls(policies.create("static", CONFIG, machine), store))
    return out


async def _exclusive(driver) -> dict[str, object]:
    shared_pod = await driver.run_pod("shared", "besteffort")
    code, shared = await driver.create(shared_pod, "app", 0, False)
    seen: dict[str, object] = {"shared created": code, "shared cpus": driver.cpus(shared)}
    seen["shared started"] = await driver.start(shared)
    g_pod = await driver.run_pod("exclusive", "guaranteed")
    code, g = await driver.create(g_pod, "app", 2000, True)
    seen["exclusive created"] = code
    seen["exclusive started"] = await driver.start(g)
    seen["exclusive cpus"], seen["shared cpus after"] = driver.cpus(g), driver.cpus(shared)
    seen["exclusive stopped"] = await driver.stop(g)
    seen["shared cpus at the end"] = driver.cpus(shared)
    return seen


async def test_a_guaranteed_container_gets_cpus_of_its_own_and_gives_them_back(drivers):
    cri_seen, nri_seen = [await _exclusive(d) for d in drivers]
    assert cri_seen == nri_seen  # the same answers whichever front end asked
    seen = cri_seen
    assert all(v == "OK" for k, v in seen.items() if not k.endswith("cpus") and "cpus " not in k)
    mine, theirs = CPUSet.parse(seen["exclusive cpus"]), CPUSet.parse(seen["shared cpus after"])
    assert len(mine) == 2 and mine.isdisjoint(theirs) and theirs  # moved off them, through each one's own way
    assert seen["shared cpus at the end"] == seen["shared cpus"]  # given back


async def test_a_container_that_does_not_fit_is_refused_with_the_same_status(drivers):
    for driver in drivers:
        pod = await driver.run_pod("big", "guaranteed")
        code, cid = await driver.create(pod, "app", 8000, True)
        assert (driver.name, code, cid) == (driver.name, "RESOURCE_EXHAUSTED", "")
        assert not driver.engine.state.containers  # nothing granted


def test_the_status_table_speaks_grpc_codes():
    for _, code, _ in errors.TABLE:
        assert grpc.StatusCode[code].value[0] == errors.CODES[code]



async def _create_with_a_round_in_between(driver, monkeypatch) -> tuple[str, str, bool]:
    """Create a Guaranteed container of 2 CPUs with a reconciliation round run at the first save
    after the engine learned its ID; (status, container ID, whether the round ran)."""
    state = driver.engine.state
    g_pod = await driver.run_pod("exclusive", "guaranteed")
    save, rounds = state.save, []

    async def save_with_a_round_in_between() -> None:
        if not rounds and any(c.id for c in state.containers.values()):
            rounds.append(True)
            await driver.engine.reconcile()
        await save()

    monkeypatch.setattr(state, "save", save_with_a_round_in_between)
    code, g = await driver.create(g_pod, "app", 2000, True)
    monkeypatch.setattr(state, "save", save)
    return code, g, bool(rounds)


async def test_a_reconciliation_as_a_create_lands_keeps_the_new_container(drivers, monkeypatch):
    """A round that lists the runtime between the engine learning a new container's ID and the
    front end answering the create must see it: in NRI mode the record of what the runtime runs
    is the plugin's own, and a container missing from it is dropped and its CPUs given away."""
    for driver in drivers:
        state = driver.engine.state
        code, g, rounds = await _create_with_a_round_in_between(driver, monkeypatch)
        assert (driver.name, code, rounds) == (driver.name, "OK", True)
        assert g in state.containers and state.containers[g].state.live, driver.name
        assert len(CPUSet.parse(driver.cpus(g))) == 2, driver.name
        shared_pod = await driver.run_pod("shared", "besteffort")
        _, shared = await driver.create(shared_pod, "app", 0, False)
        assert CPUSet.parse(driver.cpus(shared)).isdisjoint(CPUSet.parse(driver.cpus(g))), driver.name


async def test_a_create_that_fails_after_the_runtime_was_answered_leaves_no_record_behind(drivers, monkeypatch):
    """The NRI plugin puts a new container in its record of the runtime before the engine commits
    it; a create that fails there must take it out again, or a reconciliation would adopt a
    container the runtime never made."""
    driver = drivers[1]
    pod = await driver.run_pod("shared", "besteffort")

    async def fail(plan, container_id):
        raise RuntimeError("commit failed")

    monkeypatch.setattr(driver.engine.creating, "commit_create", fail)
    with pytest.raises(RuntimeError):
        await driver.create(pod, "app", 0, False)
    assert not driver.runtime.containers


def _eight_cpus(tmp_path):
    """A machine of 8 CPUs and a state directory for the relay's driver (static, 1 CPU reserved)."""
    generate(parse_spec("sockets=1,cores=8,threads=1"), tmp_path / "sys")
    store = StateStore(tmp_path / "state")
    store.prepare()
    return discover(str(tmp_path / "sys")), store


async def test_after_a_reboot_a_new_pod_takes_none_of_the_cpus_of_a_pod_kubelet_makes_again(tmp_path):
    """containerd keeps a pod's sandbox through a node reboot, not ready, with its containers
    exited; kubelet makes the pod a new sandbox. A Guaranteed pod new to the node made first must
    not take the old pod's CPUs, as kubelet's CPU manager keeps them for it."""
    machine, store = _eight_cpus(tmp_path)
    driver = CriDriver(policies.create("static", CONFIG, machine), store)
    old_pod = await driver.run_pod("old", "guaranteed")
    _, old = await driver.create(old_pod, "app", 2000, True)
    await driver.start(old)
    held = CPUSet.parse(driver.cpus(old))
    rt = driver.runtime
    rt.pods = [cri.PodSandbox(id=p.id, state=cri.SANDBOX_NOTREADY, metadata=p.metadata) for p in rt.pods]
    rt.run(old, old_pod, "app", state=cri.CONTAINER_EXITED)  # the node rebooted
    await driver.engine.reconcile()
    assert driver.engine.state.containers[old].state == ContainerState.EXITED
    newcomer_pod = await driver.run_pod("new", "guaranteed")
    _, newcomer = await driver.create(newcomer_pod, "app", 2000, True)
    assert CPUSet.parse(driver.cpus(newcomer)).isdisjoint(held)
    code, reply = await driver._call("RunPodSandbox", cri.RunPodSandboxRequest(config=driver.configs[old_pod]))
    again_pod = cri.RunPodSandboxResponse.FromString(reply).pod_sandbox_id
    driver.configs[again_pod] = driver.configs[old_pod]
    _, again = await driver.create(again_pod, "app", 2000, True)
    assert CPUSet.parse(driver.cpus(again)) == held


async def test_after_a_reboot_a_restart_keeps_the_cpus_of_pods_the_runtime_still_lists_as_ready(tmp_path):
    """The NRI plugin is not told whether a sandbox runs: after a reboot it sees the old pods and
    none of their containers. A state file older than the boot says the node rebooted."""
    machine, store = _eight_cpus(tmp_path)
    driver = CriDriver(policies.create("static", CONFIG, machine), store)
    old_pod = await driver.run_pod("old", "guaranteed")
    _, old = await driver.create(old_pod, "app", 2000, True)
    await driver.start(old)
    held = CPUSet.parse(driver.cpus(old))
    snapshot = driver.engine.state.snapshot()
    for rebooted in (False, True):
        again = CriDriver(policies.create("static", CONFIG, machine), store)
        again.runtime.pods, again.runtime.containers = list(driver.runtime.pods), []  # ready, but empty
        again.configs, again.ids = dict(driver.configs), itertools.count(100)
        again.engine.state.restore({"version": 1, **snapshot}, rebooted=rebooted)
        await again.engine.reconcile()
        newcomer_pod = await again.run_pod("new", "guaranteed")
        _, newcomer = await again.create(newcomer_pod, "app", 2000, True)
        assert CPUSet.parse(again.cpus(newcomer)).isdisjoint(held) == rebooted


async def test_nri_a_container_moved_between_its_create_and_its_start_is_moved_again_once_started(drivers):
    """containerd reads a container's spec when its start begins and starts the task from it: an
    update that an answer carried meanwhile (another container's create took its CPUs) reaches the
    record, not the task. Once started, it is sent again."""
    driver = drivers[1]
    shared_pod = await driver.run_pod("shared", "besteffort")
    _, shared = await driver.create(shared_pod, "app", 0, False)
    first = driver.cpus(shared)
    g_pod = await driver.run_pod("exclusive", "guaranteed")
    _, g = await driver.create(g_pod, "app", 2000, True)  # its answer moves the shared one
    moved = driver.cpus(shared)
    assert moved != first and CPUSet.parse(moved).isdisjoint(CPUSet.parse(driver.cpus(g)))
    driver.told[shared] = first  # the task started with what the spec held when the start began
    sender = asyncio.create_task(driver.runtime.run_sender())
    try:
        await driver.start(shared)
        for _ in range(50):  # the sender delivers the queue
            if driver.cpus(shared) == moved:
                break
            await asyncio.sleep(0.01)
    finally:
        sender.cancel()
    assert driver.cpus(shared) == moved


async def test_nri_a_create_given_cpus_a_resized_container_has_not_left_moves_it_off_first(drivers):
    """A resize to fewer CPUs whose update the runtime never took (frozen: the call failed) leaves the
    container on its old CPUs; a container made next on the CPUs it gave up must not start beside it."""
    driver = drivers[1]
    g_pod = await driver.run_pod("resized", "guaranteed")
    _, g = await driver.create(g_pod, "app", 2000, True)
    await driver.start(g)
    before = driver.runtime.containers[g].linux.resources.cpu.cpus
    c = driver.containers[g]
    req = nri.UpdateContainerRequest(pod=driver.pods[g_pod], container=c)
    cpu = req.linux_resources.cpu
    cpu.shares.value, cpu.quota.value, cpu.period.value = milli_to_shares(1000), 100000, 100000
    req.linux_resources.memory.limit.value = 64 << 20
    code, _ = await driver._call("UpdateContainer", req, nri.UpdateContainerResponse)
    assert code == "OK" and len(CPUSet.parse(driver.engine.state.containers[g].resources.cpuset_cpus)) == 1
    driver.runtime.containers[g].linux.resources.cpu.cpus = before  # the runtime did not take it
    n_pod = await driver.run_pod("next", "guaranteed")
    _, n = await driver.create(n_pod, "app", 1000, True)
    still = CPUSet.parse(driver.runtime.containers[g].linux.resources.cpu.cpus)
    assert CPUSet.parse(driver.cpus(n)).isdisjoint(still), (before, driver.cpus(n), still)
