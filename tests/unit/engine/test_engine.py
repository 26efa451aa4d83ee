"""Engine behaviour with a scripted runtime: locking, rollback, policy decisions."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from resmgr.controllers.cgroups import CpusetFiles
from resmgr.engine import Engine, NotReady, ledger, reconcile
from resmgr.engine import pusher as pushing
from resmgr.engine import start as starting
from resmgr.engine.store import StateStore
from resmgr.frontends.cri.lifecycle import CriLifecycle
from resmgr.frontends.cri.runtime import CriRuntime
from resmgr.generated.cri import api_pb2 as cri
from resmgr.model import ContainerEvent, ContainerState, Resources
from resmgr.policies import Decision, Policy
from resmgr.topology.cpuset import CPUSet
from tests.support.fakeruntime import FakeRuntime, RuntimeError_
from tests.support.helpers import container_config, pod_config


def front(engine: Engine) -> CriLifecycle:
    """The engine as the relay drives it: CRI requests through the CRI front end."""
    return CriLifecycle(engine)


class PinningPolicy(Policy):
    """Gives each new container CPU n (n = order of arrival) and re-pins everyone else."""

    name = "test-pinning"

    def allocate(self, container, pod, view):
        n = len(view.containers) - 1
        others = {k: Resources(cpuset_cpus=f"0-{n}") for k in view.containers if k != container.key}
        return Decision(resources=Resources(cpuset_cpus=str(n), cpu_shares=1024), updates=others,
                        classes={"rdt": "gold"})

    def update(self, container, requested, view):
        return Decision(resources=Resources(cpuset_cpus=container.resources.cpuset_cpus,
                                            cpu_shares=requested.cpu_shares))


@pytest.fixture
def engine(tmp_path):
    store = StateStore(tmp_path)
    store.prepare()
    return Engine(PinningPolicy(), store, CriRuntime(FakeRuntime()))


async def _run_pod(engine, name="p"):
    cfg = pod_config(name)

    async def send(req):
        return cri.RunPodSandboxResponse(pod_sandbox_id=f"pod-{name}")

    await front(engine).run_pod_sandbox(cri.RunPodSandboxRequest(config=cfg), send)
    return f"pod-{name}", cfg


async def _create(engine, pod_id, cfg, cid="c1", name="a"):
    async def send(req):
        return cri.CreateContainerResponse(container_id=cid)

    await front(engine).create_container(cri.CreateContainerRequest(
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
    await asyncio.gather(*(front(engine).create_container(r, send) for r in reqs))
    assert set(engine.state.containers) == {"c-a", "c-b"}


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
        await front(engine).create_container(req, send)
    assert sent[1].config.linux.resources.cpuset_cpus == "1"
    assert sent[1].config.linux.resources.cpu_shares == 1024
    assert engine.state.containers["c2"].requested.cpu_shares == 2
    assert engine.state.containers["c2"].classes["rdt"] == "gold"
    assert [(cid, r.cpuset_cpus) for cid, r in engine.state.runtime.client.updates] == [("c1", "0-1")]
    assert engine.state.containers["c1"].resources.cpuset_cpus == "0-1"


async def test_a_create_the_runtime_refused_rolls_back(engine):
    pod_id, cfg = await _run_pod(engine)

    async def send(req):
        raise RuntimeError_(grpc.StatusCode.INVALID_ARGUMENT, "runtime says no")

    with pytest.raises(RuntimeError_, match="runtime says no"):
        await front(engine).create_container(cri.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=container_config("a"), sandbox_config=cfg), send)
    assert engine.state.containers == {}


async def test_kubelet_update_is_forwarded_with_pinning_kept(engine):
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg)
    forwarded = []

    async def update(req):
        forwarded.append(req)
        return cri.UpdateContainerResourcesResponse()

    await front(engine).update_container_resources(cri.UpdateContainerResourcesRequest(
        container_id="c1", linux=cri.LinuxContainerResources(cpu_shares=300, cpuset_cpus="0-63")), update)
    assert len(forwarded) == 1
    assert forwarded[0].linux.cpuset_cpus == "0" and forwarded[0].linux.cpu_shares == 300
    assert engine.state.containers["c1"].requested.cpuset_cpus == "0-63"


async def test_failed_or_cancelled_stop_keeps_resources_until_the_runtime_says_stopped(engine, caplog):
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg)
    engine.state.runtime.client.pod(pod_id)
    engine.state.runtime.client.run("c1", pod_id)
    released = []
    engine.state.policy.release = lambda c, view: released.append(c.key) or Decision()

    async def stop(req):
        raise RuntimeError_(grpc.StatusCode.UNAVAILABLE, "runtime went away")

    with pytest.raises(RuntimeError_):
        await front(engine).stop_container(cri.StopContainerRequest(container_id="c1"), stop)

    async def stuck(req):
        await asyncio.sleep(3600)

    caplog.set_level(logging.WARNING, "cri-resmgr.engine")
    task = asyncio.create_task(front(engine).stop_container(cri.StopContainerRequest(container_id="c1"), stuck))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "stopping container c1 was cancelled by the caller" in caplog.text
    assert engine.state.containers["c1"].state != ContainerState.EXITED and released == []
    await engine.reconcile()  # the runtime still runs it
    assert released == []
    engine.state.runtime.client.run("c1", pod_id, state=cri.CONTAINER_EXITED)
    await engine.reconcile()
    assert released == ["c1"] and engine.state.containers["c1"].state == ContainerState.EXITED


async def test_a_created_container_of_a_stopped_pod_is_not_given_its_cpus_again(engine):
    """StopPodSandbox leaves a container that never started CREATED in the runtime, and it can never
    start. Granting it again sent an update while kubelet removed the pod, which containerd 2.3.7
    answers with a nil-pointer panic in its NRI code (seen under the relay): nothing is sent."""
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg)
    client = engine.state.runtime.client
    client.pod(pod_id)
    client.run("c1", pod_id, state=cri.CONTAINER_CREATED)

    async def stop(req):
        client.pods = [cri.PodSandbox(id=p.id, state=cri.SANDBOX_NOTREADY, metadata=p.metadata)
                       for p in client.pods]
        return cri.StopPodSandboxResponse()

    await front(engine).stop_pod_sandbox(cri.StopPodSandboxRequest(pod_sandbox_id=pod_id), stop)
    client.updates.clear()
    await engine.reconcile()
    await engine.reconcile()
    assert engine.state.containers["c1"].state == ContainerState.EXITED
    assert "c1" not in engine.state.ledger.unallocated
    assert client.updates == []


async def test_nothing_is_sent_to_a_container_while_its_pod_or_itself_is_removed(engine):
    """An update racing with a removal makes containerd 2.3 panic: pushes wait for the removal, and
    one already in flight ends before the removal is sent."""
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg)
    client = engine.state.runtime.client
    client.updates.clear()
    c = engine.state.containers["c1"]
    c.pending = True
    in_flight = asyncio.Event()
    release = asyncio.Event()
    sent = []

    async def slow_update(cid, res):
        in_flight.set()
        await release.wait()
        sent.append(cid)

    client.update_resources = slow_update
    push = asyncio.create_task(engine.state.pusher.push("c1"))
    await in_flight.wait()
    order = []

    async def remove(req):
        order.append(("removed", list(sent)))
        c.pending = True
        await engine.state.pusher.push("c1")  # reconciliation meanwhile: nothing goes out
        order.append(("pushed meanwhile", list(sent)))
        return cri.RemovePodSandboxResponse()

    removal = asyncio.create_task(front(engine).remove_pod_sandbox(
        cri.RemovePodSandboxRequest(pod_sandbox_id=pod_id), remove))
    await asyncio.sleep(0.05)
    assert order == []  # the removal waits for the push in flight
    release.set()
    await push
    await removal
    assert order == [("removed", ["c1"]), ("pushed meanwhile", ["c1"])]
    assert not engine.state.pusher.removing


class WideningPolicy(PinningPolicy):
    """PinningPolicy that gives the CPUs of a container released to every other one."""

    def release(self, container, view):
        return Decision(updates={k: Resources(cpuset_cpus="0-7") for k in view.containers if k != container.key})


@pytest.mark.parametrize("call", ["StopPodSandbox", "RemovePodSandbox"])
async def test_a_pod_stopped_or_removed_is_answered_without_waiting_for_the_cpus_it_gives_back_to_be_taken(
        tmp_path, call):
    """Kubelet deletes a pod (and unprepares its claims) only once StopPodSandbox is answered: when
    containerd stalled the others' updates that widen them onto the CPUs given back, the answer
    waited for them, past kubelet's deadline while containerd failed each on its own. Nobody has
    to wait for CPUs given back: they are pushed behind the answer, pending until they land."""
    store = StateStore(tmp_path)
    store.prepare()
    engine = Engine(WideningPolicy(), store, CriRuntime(FakeRuntime()))
    pod_p, cfg_p = await _run_pod(engine, "p")
    await _create(engine, pod_p, cfg_p, cid="c1", name="a")
    pod_q, cfg_q = await _run_pod(engine, "q")
    await _create(engine, pod_q, cfg_q, cid="c2", name="b")
    client = engine.state.runtime.client
    await engine.state.settle_updates()
    stalled = asyncio.Event()

    async def stalled_update(cid, res):
        await stalled.wait()
        client.cpusets[cid] = res.cpuset_cpus

    client.update_resources = stalled_update
    lifecycle = front(engine)

    async def answer(req):
        return cri.StopPodSandboxResponse() if call == "StopPodSandbox" else cri.RemovePodSandboxResponse()

    if call == "StopPodSandbox":
        request = lifecycle.stop_pod_sandbox(cri.StopPodSandboxRequest(pod_sandbox_id=pod_p), answer)
    else:
        request = lifecycle.remove_pod_sandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=pod_p), answer)
    async with asyncio.timeout(2.0):
        await request
    c2 = engine.state.containers["c2"]
    assert c2.resources.cpuset_cpus == "0-7" and c2.pending  # desired, and recorded as not taken yet
    stalled.set()
    await engine.state.settle_updates()
    assert client.cpusets["c2"] == "0-7" and not c2.pending


async def test_a_stopped_container_the_runtime_still_lists_running_for_a_while_is_not_granted_again(
        engine, monkeypatch):
    """containerd answers a StopContainer before it has handled the exit: on a starved node its
    list says running for seconds after. The container was granted its CPUs again (and sent them)
    as one "released but still runs"; it is only once that has lasted longer than any such lag."""
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg)
    client = engine.state.runtime.client
    client.pod(pod_id)
    client.run("c1", pod_id)  # still listed running after the stop returned

    async def stop(req):
        return cri.StopContainerResponse()

    await front(engine).stop_container(cri.StopContainerRequest(container_id="c1"), stop)
    client.updates.clear()
    await engine.reconcile()
    assert engine.state.containers["c1"].state == ContainerState.EXITED and client.updates == []
    monkeypatch.setattr(ledger, "RELEASE_LAG", 0.0)  # as if that long had passed
    await engine.reconcile()  # it really runs: it needs its grant
    assert engine.state.containers["c1"].state == ContainerState.RUNNING


async def test_failed_remove_keeps_the_container(engine):
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg)

    async def remove(req):
        raise RuntimeError_(grpc.StatusCode.DEADLINE_EXCEEDED, "too slow")

    with pytest.raises(RuntimeError_):
        await front(engine).remove_container(cri.RemoveContainerRequest(container_id="c1"), remove)
    assert engine.state.containers["c1"].state == ContainerState.CREATED
    await engine.reconcile()  # the runtime has no such container (and no such pod)
    assert "c1" not in engine.state.containers


async def test_unsettled_create_keeps_its_grant_and_is_adopted_or_released(engine, monkeypatch):
    pod_id, cfg = await _run_pod(engine)
    engine.state.runtime.client.pod(pod_id)
    released = []
    release = engine.state.policy.release
    engine.state.policy.release = lambda c, view: released.append(c.key) or release(c, view)

    async def lost(req):
        raise RuntimeError_(grpc.StatusCode.UNAVAILABLE, "connection lost")

    for name in ("made", "never"):
        with pytest.raises(RuntimeError_):
            await front(engine).create_container(cri.CreateContainerRequest(
                pod_sandbox_id=pod_id, config=container_config(name), sandbox_config=cfg), lost)
    assert set(engine.state.containers) == {f"pending:{pod_id}:made:0", f"pending:{pod_id}:never:0"}
    assert released == []
    engine.state.runtime.client.run("c-made", pod_id, name="made")
    engine.state.runtime.client.cpusets["c-made"] = "0"  # what its create request said
    allocations = []
    allocate = engine.state.policy.allocate
    engine.state.policy.allocate = lambda c, pod, view: allocations.append(c.key) or allocate(c, pod, view)
    await engine.reconcile()
    # Listed too soon after its call failed: the runtime may still be making it.
    assert released == [] and f"pending:{pod_id}:never:0" in engine.state.containers
    monkeypatch.setattr(reconcile, "SETTLE_GRACE", 0.0)
    await engine.reconcile()
    assert released == [f"pending:{pod_id}:never:0"]
    made = engine.state.containers["c-made"]
    assert allocations == [] and made.state == ContainerState.RUNNING  # adopted with its grant
    # "never"'s create had moved it to 0-1 meanwhile: that decision reaches the runtime now.
    assert [(cid, r.cpuset_cpus) for cid, r in engine.state.runtime.client.updates] == [("c-made", "0-1")]


async def test_a_retried_create_settles_the_unknown_one_first(engine):
    pod_id, cfg = await _run_pod(engine)
    engine.state.runtime.client.pod(pod_id)

    async def lost(req):
        engine.state.runtime.client.run("c-first", pod_id)  # it did get created
        raise RuntimeError_(grpc.StatusCode.UNAVAILABLE, "connection lost")

    async def reserved(req):
        raise RuntimeError_(grpc.StatusCode.ALREADY_EXISTS, "name is reserved")

    req = cri.CreateContainerRequest(pod_sandbox_id=pod_id, config=container_config("a"), sandbox_config=cfg)
    with pytest.raises(RuntimeError_):
        await front(engine).create_container(req, lost)
    with pytest.raises(RuntimeError_, match="reserved"):
        await front(engine).create_container(req, reserved)
    assert set(engine.state.containers) == {"c-first"}
    first = engine.state.containers["c-first"]
    assert first.state == ContainerState.RUNNING and first.resources.cpuset_cpus == "0"  # its grant stands


def _holding(engine, pod_id, cid="c1", cpus="0"):
    """The engine holds container cid (name "a", attempt 0) as created, and the runtime lists it."""
    engine.state.runtime.client.pod(pod_id)
    engine.state.runtime.client.run(cid, pod_id, state=cri.CONTAINER_CREATED)
    engine.state.runtime.client.cpusets[cid] = cpus


async def test_a_create_refused_for_a_held_name_leaves_the_holder_as_it_was(engine):
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg, cid="c1", name="a")
    _holding(engine, pod_id)
    holder = engine.state.containers["c1"]
    granted = holder.resources
    asked = []
    allocate = engine.state.policy.allocate
    engine.state.policy.allocate = lambda c, pod, view: asked.append(c.key) or allocate(c, pod, view)
    sent = []

    async def reserved(req):
        sent.append(req.config.linux.resources.cpuset_cpus)
        raise RuntimeError_(grpc.StatusCode.FAILED_PRECONDITION,
                            'failed to reserve container name "a_p": name "a_p" is reserved for "c1"')

    req = cri.CreateContainerRequest(pod_sandbox_id=pod_id, config=container_config("a"), sandbox_config=cfg)
    with pytest.raises(RuntimeError_, match="reserved"):
        await front(engine).create_container(req, reserved)
    assert asked == [] and sent == ["0"]  # nothing granted to it; it carried the holder's grant
    assert set(engine.state.containers) == {"c1"} and holder.state == ContainerState.CREATED
    assert holder.resources == granted and not holder.pending
    await engine.starting.start_container("c1", _ok)
    assert holder.state == ContainerState.RUNNING and holder.resources == granted


async def _ok():
    return None


async def test_a_create_the_runtime_takes_for_a_held_name_takes_over_the_grant(engine):
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg, cid="c1", name="a")
    granted = engine.state.containers["c1"].resources
    engine.state.runtime.client.pod(pod_id)
    engine.state.runtime.client.run("c1", pod_id, state=cri.CONTAINER_CREATED)
    asked = []
    allocate = engine.state.policy.allocate
    engine.state.policy.allocate = lambda c, pod, view: asked.append(c.key) or allocate(c, pod, view)
    engine.state.runtime.client.containers = []  # c1 was removed behind our back, after we last asked

    async def made(req):
        return cri.CreateContainerResponse(container_id="c2")

    engine.creating._confirm_older = _no_check  # the removal comes after the engine asked about c1
    await front(engine).create_container(cri.CreateContainerRequest(
        pod_sandbox_id=pod_id, config=container_config("a"), sandbox_config=cfg), made)
    assert asked == [] and set(engine.state.containers) == {"c2"}
    c2 = engine.state.containers["c2"]
    assert c2.resources == granted and c2.state == ContainerState.CREATED


async def _no_check(c):
    return None


async def test_a_create_in_flight_holds_its_name_against_a_second_one(engine):
    pod_id, cfg = await _run_pod(engine)
    req = cri.CreateContainerRequest(pod_sandbox_id=pod_id, config=container_config("a"), sandbox_config=cfg)
    first_sent, release_first = asyncio.Event(), asyncio.Event()

    async def slow(req):
        first_sent.set()
        await release_first.wait()
        return cri.CreateContainerResponse(container_id="c1")

    async def reserved(req):
        raise RuntimeError_(grpc.StatusCode.FAILED_PRECONDITION, 'name "a" is reserved for "c1"')

    first = asyncio.create_task(front(engine).create_container(req, slow))
    await first_sent.wait()
    with pytest.raises(RuntimeError_, match="reserved"):
        await front(engine).create_container(req, reserved)
    release_first.set()
    await first
    assert set(engine.state.containers) == {"c1"} and engine.state.containers["c1"].resources.cpuset_cpus == "0"


async def test_a_new_sandbox_of_a_pod_does_not_release_the_old_ones_containers(engine):
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg, cid="c1", name="a")

    async def again(req):
        return cri.RunPodSandboxResponse(pod_sandbox_id="pod-again")

    await front(engine).run_pod_sandbox(cri.RunPodSandboxRequest(config=cfg), again)  # same pod UID
    assert {pod_id, "pod-again"} <= set(engine.state.pods)
    assert engine.state.containers["c1"].state == ContainerState.CREATED


async def test_failed_updates_stay_pending_across_restarts_until_pushed(engine, tmp_path):
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg, cid="c1", name="a")
    engine.state.runtime.client.fail_updates = True
    await _create(engine, pod_id, cfg, cid="c2", name="b")  # moves c1 to 0-1; the push fails
    assert engine.state.containers["c1"].pending
    assert engine.state.store.load()["containers"][0]["pending"] is True
    # A restart: the pending update is pushed once the runtime is back.
    runtime = FakeRuntime()
    runtime.pod(pod_id)
    runtime.run("c1", pod_id, name="a")
    runtime.run("c2", pod_id, name="b")
    again = Engine(PinningPolicy(), StateStore(tmp_path), CriRuntime(runtime))
    again.state.restore(StateStore(tmp_path).load())
    await again.reconcile()
    assert ("c1", "0-1") in [(cid, r.cpuset_cpus) for cid, r in runtime.updates]
    assert not again.state.containers["c1"].pending


async def test_a_move_of_a_container_whose_processes_stopped_is_not_sent_again(engine):
    """containerd refuses an update of a container whose task has stopped while its record still
    says running (its stop under way, slow to end on a starved node). Nothing of it runs, so its
    move is as good as taken: sending it again every few seconds, as a call waiting for the move
    did, only loaded the runtime that was slow to end it."""
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg, cid="c1", name="a")
    rt = engine.state.runtime.client
    sent = []

    async def stopped(cid, res):
        sent.append(cid)
        raise RuntimeError_(grpc.StatusCode.UNKNOWN,
                            "failed to update resources: failed to update resources: cannot update a stopped container")

    rt.update_resources = stopped
    woken = []
    engine.state.pusher.wake = lambda: woken.append(1)
    await _create(engine, pod_id, cfg, cid="c2", name="b")  # moves c1 to 0-1
    assert sent == ["c1"] and not engine.state.containers["c1"].pending and woken == []
    assert engine.state.pusher.unconfirmed(["c1"]) == []  # nobody waits for it


async def test_reconcile_pushes_again_where_the_runtime_differs(engine):
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg, cid="c1", name="a")
    engine.state.runtime.client.pod(pod_id)
    engine.state.runtime.client.run("c1", pod_id)
    engine.state.runtime.client.cpusets["c1"] = "0"
    await engine.reconcile()
    assert engine.state.runtime.client.updates == []
    engine.state.runtime.client.cpusets["c1"] = "1"  # changed behind our back
    await engine.reconcile()
    assert [(cid, r.cpuset_cpus) for cid, r in engine.state.runtime.client.updates] == [("c1", "0")]


def _cgroup(root, parent, name, cpus, mems="0"):
    d = root / parent.strip("/") / name
    d.mkdir(parents=True)
    (d / "cpuset.cpus").write_text(cpus + "\n")
    (d / "cpuset.mems").write_text(mems + "\n")
    return d


def _cgroup_engine(tmp_path):
    """An engine that reads (and may write) container cgroups under tmp_path/cg."""
    engine = Engine(PinningPolicy(), StateStore(tmp_path / "state"), CriRuntime(FakeRuntime()),
                    cpusets=CpusetFiles(str(tmp_path / "cg")))
    engine.state.store.prepare()
    return engine


async def _lost_task(tmp_path):
    """Container c1 granted CPU 0, which the runtime's record has and its cgroup (the returned
    directory) does not: as after containerd lost the task of a container it was starting."""
    engine = _cgroup_engine(tmp_path)
    rt = engine.state.runtime.client
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg, cid="c1", name="a")
    rt.pod(pod_id)
    rt.run("c1", pod_id)
    rt.cpusets["c1"] = "0"  # the runtime's record has the update ...
    return engine, _cgroup(tmp_path / "cg", cfg.linux.cgroup_parent, "c1", "0-3")  # ... its task does not


async def test_a_cgroup_the_runtime_took_an_update_for_and_left_as_it_was_is_written(tmp_path):
    # containerd restarted while starting a container loses its task: it answers updates with
    # success and the container runs on as before, on CPUs that may be another's exclusive ones.
    engine, cg = await _lost_task(tmp_path)
    rt = engine.state.runtime.client
    await engine.reconcile()
    assert [(cid, r.cpuset_cpus) for cid, r in rt.updates] == [("c1", "0")]  # pushed again first
    assert (cg / "cpuset.cpus").read_text().strip() == "0-3"
    await engine.reconcile()
    assert (cg / "cpuset.cpus").read_text() == "0"
    await engine.reconcile()
    assert len(rt.updates) == 1 and not engine.state.containers["c1"].pending


async def test_a_cgroup_whose_update_the_runtime_failed_is_written_at_once(tmp_path):
    """NRI's UpdateContainers answers later: containerd on a busy node fails it on a deadline of its
    own ("failed to get task") for tens of seconds. The next round writes the cgroup rather than
    hand the same update to that runtime again."""
    engine, cg = await _lost_task(tmp_path)
    rt = engine.state.runtime.client
    rt.cpusets["c1"] = "0-3"  # the runtime's record: the update never landed
    granted = engine.state.containers["c1"].resources
    engine.state.runtime.failed_update = lambda cid: granted if cid == "c1" else None
    await engine.reconcile()
    assert rt.updates == [] and (cg / "cpuset.cpus").read_text() == "0"


async def test_a_cgroup_the_kernel_refuses_is_tried_every_round_and_reported_once(tmp_path, monkeypatch, caplog):
    engine, _ = await _lost_task(tmp_path)
    tried = []

    def refuse(*args):
        tried.append(args)
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(engine.state.cpusets, "write", refuse)
    with caplog.at_level(logging.DEBUG, logger="cri-resmgr.engine"):
        for _ in range(5):
            await engine.reconcile()
    assert len(tried) == 4  # from the second round on
    assert [r.levelno for r in caplog.records if "cannot be written" in r.getMessage()] == \
        [logging.ERROR] + [logging.DEBUG] * 3


async def test_a_written_scope_is_told_to_systemd(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    told = tmp_path / "told"
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$@" >> {told}\n')
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    engine = _cgroup_engine(tmp_path)
    rt = engine.state.runtime.client
    cfg = pod_config("p")
    cfg.linux.cgroup_parent = "kubepods-besteffort-podp.slice"  # the systemd driver's parent

    async def run(req):
        return cri.RunPodSandboxResponse(pod_sandbox_id="pod-p")

    await front(engine).run_pod_sandbox(cri.RunPodSandboxRequest(config=cfg), run)
    await _create(engine, "pod-p", cfg, cid="c1", name="a")
    rt.pod("pod-p")
    rt.run("c1", "pod-p")
    scope = _cgroup(tmp_path / "cg", "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podp.slice",
                    "cri-containerd-c1.scope", "0-3")
    for _ in range(2):
        await engine.reconcile()
    assert (scope / "cpuset.cpus").read_text() == "0"
    assert told.read_text().split() == ["set-property", "--runtime", "--", "cri-containerd-c1.scope",
                                        "AllowedCPUs=0"]


async def test_pods_removed_behind_our_back_release_their_containers(engine):
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg)
    released = []
    engine.state.policy.release = lambda c, view: released.append(c.key) or Decision()
    await engine.reconcile()  # the runtime has neither the pod nor its container
    assert engine.state.pods == {} and engine.state.containers == {} and released == ["c1"]


async def test_a_reconcile_does_not_drop_a_create_that_lands_while_it_lists(engine):
    pod_id, cfg = await _run_pod(engine)
    engine.state.runtime.client.pod(pod_id)
    listing = asyncio.Event()
    landed = asyncio.Event()
    original = engine.state.runtime.client.list_containers

    async def slow_list(pod_id=""):
        listing.set()
        result = await original(pod_id)
        await landed.wait()
        return result

    async def send(req):
        await listing.wait()  # decided before the round, created in the runtime after its listing
        engine.state.runtime.client.run("c-late", pod_id)
        return cri.CreateContainerResponse(container_id="c-late")

    engine.state.runtime.client.list_containers = slow_list
    round_ = asyncio.create_task(engine.reconcile())
    await front(engine).create_container(cri.CreateContainerRequest(
        pod_sandbox_id=pod_id, config=container_config("a"), sandbox_config=cfg), send)
    landed.set()
    await round_
    assert "c-late" in engine.state.containers


async def test_gated_engine_decides_nothing_before_reconciling(tmp_path, monkeypatch):
    monkeypatch.setattr("resmgr.engine.state.READY_WAIT", 0.05)
    eng = Engine(PinningPolicy(), StateStore(tmp_path), CriRuntime(FakeRuntime()), gated=True)
    pod_id, cfg = await _run_pod(eng)
    with pytest.raises(NotReady):
        await _create(eng, pod_id, cfg)
    eng.state.runtime.client.pod(pod_id)
    await eng.reconcile()
    await _create(eng, pod_id, cfg)
    assert "c1" in eng.state.containers


async def test_reconcile_tolerates_odd_runtime_data(engine):
    rt = engine.state.runtime.client
    rt.pods = [cri.PodSandbox(id="p1"), cri.PodSandbox(id="")]  # no metadata at all; no ID
    rt.containers = [cri.Container(id="x1", pod_sandbox_id="p1", state=cri.CONTAINER_RUNNING),
                     cri.Container(id="x2", pod_sandbox_id="no-such-pod", state=cri.CONTAINER_RUNNING),
                     cri.Container(id="x3", pod_sandbox_id="p1", state=cri.CONTAINER_UNKNOWN)]

    async def odd_status(cid, verbose=True):
        return cri.ContainerStatusResponse(info={"info": '["not", "an", "object"]'})

    async def odd_pod_status(pid):
        return cri.PodSandboxStatusResponse(info={"info": "{broken"})

    rt.container_status, rt.pod_status = odd_status, odd_pod_status
    await engine.reconcile()
    assert set(engine.state.pods) == {"p1"} and set(engine.state.containers) == {"x1"}


async def test_a_new_attempt_releases_the_old_one_only_once_the_runtime_shows_it_ended(engine):
    pod_id, cfg = await _run_pod(engine)
    rt = engine.state.runtime.client
    ids = iter(["c1", "c2", "c3"])

    async def create(req):
        cid = next(ids)
        rt.run(cid, pod_id, attempt=req.config.metadata.attempt, state=cri.CONTAINER_CREATED)
        return cri.CreateContainerResponse(container_id=cid)

    async def attempt(n):
        cc = container_config("a")
        cc.metadata.attempt = n
        await front(engine).create_container(cri.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=cc, sandbox_config=cfg), create)

    released = []
    release = engine.state.policy.release
    engine.state.policy.release = lambda c, view: released.append(c.key) or release(c, view)
    await attempt(0)
    rt.run("c1", pod_id, attempt=0, state=cri.CONTAINER_RUNNING)
    await attempt(1)  # the runtime still runs attempt 0: it keeps what it holds
    assert engine.state.containers["c1"].state == ContainerState.CREATED and released == []
    assert engine.state.containers["c2"].state == ContainerState.CREATED
    rt.run("c1", pod_id, attempt=0, state=cri.CONTAINER_EXITED)
    rt.containers = [c for c in rt.containers if c.id != "c2"]  # removed behind our back
    await attempt(2)
    assert engine.state.containers["c1"].state == ContainerState.EXITED  # exited: released, still known
    assert "c2" not in engine.state.containers  # removed: forgotten
    assert engine.state.containers["c3"].state == ContainerState.CREATED


async def test_reconcile_drops_vanished_adopts_new_and_keeps_fresh(engine):
    gone_pod, _ = await _run_pod(engine, "gone")
    rt = engine.state.runtime.client
    rt.pods = [cri.PodSandbox(id="pod-new", metadata=cri.PodSandboxMetadata(name="new", uid="u", namespace="ns"))]
    rt.containers = [cri.Container(id="c-new", pod_sandbox_id="pod-new", state=cri.CONTAINER_RUNNING,
                                   metadata=cri.ContainerMetadata(name="x"))]
    original_list = rt.list_containers

    async def list_and_race(pod_id=""):
        # A pod created through the relay while reconciliation is listing.
        await _run_pod(engine, "fresh")
        return await original_list(pod_id)

    rt.list_containers = list_and_race
    await engine.reconcile()
    assert set(engine.state.pods) == {"pod-new", "pod-fresh"}
    assert engine.state.pods["pod-new"].qos_class.value == "Burstable"
    assert engine.state.containers["c-new"].state == ContainerState.RUNNING
    # Adopted containers are allocated by the policy and pushed to the runtime.
    assert ("c-new", "0") in [(cid, r.cpuset_cpus) for cid, r in rt.updates]
    assert gone_pod not in engine.state.pods


async def test_state_round_trips_through_the_store(engine, tmp_path):
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg)
    again = Engine(PinningPolicy(), StateStore(tmp_path), CriRuntime(FakeRuntime()))
    again.state.restore(StateStore(tmp_path).load())
    assert again.state.pods == engine.state.pods
    assert again.state.containers == engine.state.containers


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

    task_a = asyncio.create_task(front(engine).create_container(req("a"), send))
    await asyncio.sleep(0)  # A has decided and is inside the runtime
    await front(engine).create_container(req("b"), send)
    release_a.set()
    await task_a
    pushed = [r.cpuset_cpus for cid, r in engine.state.runtime.client.updates if cid == "c1"]
    assert pushed[-1] == "0-2"  # B decided last: everyone else on 0-2
    assert engine.state.containers["c1"].resources.cpuset_cpus == "0-2"



async def _topology_aware_pod(tmp_path):
    """An engine on topology-aware over two NUMA nodes (node 0 = CPUs 0-1, node 1 = 2-3) with one
    Guaranteed pod, its fake runtime, the topology, and a maker of containers in that pod."""
    from resmgr.policies import create
    from tests.support.world import machine

    topo = machine("sockets=1,nodes=2,cores=2,threads=1")
    store = StateStore(tmp_path)
    store.prepare()
    runtime = FakeRuntime()
    eng = Engine(create("topology-aware", {"Active": "topology-aware"}, topo), store, CriRuntime(runtime))
    cfg = pod_config("p", qos="guaranteed")

    async def run(req):
        return cri.RunPodSandboxResponse(pod_sandbox_id="pod")

    await front(eng).run_pod_sandbox(cri.RunPodSandboxRequest(config=cfg), run)

    async def create_as(cid, name, resources):
        async def send(req):
            return cri.CreateContainerResponse(container_id=cid)

        await front(eng).create_container(cri.CreateContainerRequest(
            pod_sandbox_id="pod", config=container_config(name, resources=resources), sandbox_config=cfg), send)

    return eng, runtime, topo, create_as


async def test_reconfigure_and_rebalance_push_what_moved(tmp_path):
    from resmgr.policies import PolicyError

    eng, runtime, _, create_as = await _topology_aware_pod(tmp_path)
    await create_as("g", "big", cri.LinuxContainerResources(cpu_shares=2048, cpu_quota=200000, cpu_period=100000))
    await create_as("s", "small", cri.LinuxContainerResources(cpu_shares=512))
    assert eng.state.containers["g"].resources.cpuset_cpus == "0-1"
    assert eng.state.containers["s"].resources.cpuset_cpus == "2-3"
    # A reserved CPU under the exclusive grant is refused and nothing changes.
    with pytest.raises(PolicyError, match="grant of g"):
        await eng.state.reconfigure({"Active": "topology-aware", "ReservedResources": {"cpu": "cpuset:0"}})
    assert runtime.updates == []
    await eng.state.reconfigure({"Active": "topology-aware", "ReservedResources": {"cpu": "cpuset:3"}})
    assert [(cid, r.cpuset_cpus) for cid, r in runtime.updates] == [("s", "2")]
    assert eng.state.store.load()["policy"]["data"]["grants"]["g"]["exclusive"] == "0-1"

    async def removed(req):
        return cri.RemoveContainerResponse()

    await front(eng).remove_container(cri.RemoveContainerRequest(container_id="g"), removed)
    assert await eng.state.rebalance() == 1  # node 0 is free now and has more room
    assert runtime.updates[-1][0] == "s" and runtime.updates[-1][1].cpuset_cpus == "0-1"
    assert await eng.state.rebalance() == 0


async def test_create_records_device_topology_hints(tmp_path):
    store = StateStore(tmp_path)
    store.prepare()
    engine = Engine(PinningPolicy(), store, CriRuntime(FakeRuntime()),
                    device_hints=lambda paths: {p: [1] for p in paths if p.startswith("/dev/")})
    pod_id, cfg = await _run_pod(engine)

    async def send(req):
        return cri.CreateContainerResponse(container_id="c-dev")

    config = container_config("gpu")
    config.devices.add(container_path="/dev/nvidia0", host_path="/dev/nvidia0", permissions="rw")
    await front(engine).create_container(cri.CreateContainerRequest(pod_sandbox_id=pod_id, config=config,
                                                             sandbox_config=cfg), send)
    assert engine.state.containers["c-dev"].hints == {"/dev/nvidia0": [1]}
    assert engine.state.snapshot()["containers"][0]["hints"] == {"/dev/nvidia0": [1]}


async def test_a_container_made_while_down_is_accounted_before_anything_new_is_decided(tmp_path):
    from resmgr.policies import PolicyError, create
    from tests.support.world import machine

    topo = machine("sockets=1,cores=2,threads=1")  # CPUs 0-1: one exclusive grant fills it
    runtime = FakeRuntime()
    runtime.pods = [cri.PodSandbox(id="pod-g", state=cri.SANDBOX_READY, metadata=cri.PodSandboxMetadata(
        name="g", uid="g", namespace="default"))]
    runtime.run("made-while-down", "pod-g")

    async def guaranteed_status(cid, verbose=True):  # it runs with the exclusive CPU its create asked for
        return cri.ContainerStatusResponse(status=cri.ContainerStatus(id=cid, resources=cri.ContainerResources(
            linux=cri.LinuxContainerResources(cpu_shares=1024, cpu_quota=100000, cpu_period=100000,
                                              cpuset_cpus="0"))))

    async def guaranteed_pod(pid):
        return cri.PodSandboxStatusResponse(info={"info": '{"config": {"linux": {"cgroup_parent": "/kubepods/podg"}}}'})

    runtime.container_status, runtime.pod_status = guaranteed_status, guaranteed_pod
    eng = Engine(create("static", {"Active": "static"}, topo), StateStore(tmp_path), CriRuntime(runtime), gated=True)
    cfg = pod_config("next", qos="guaranteed")

    async def run(r):
        return cri.RunPodSandboxResponse(pod_sandbox_id="pod-next")

    await front(eng).run_pod_sandbox(cri.RunPodSandboxRequest(config=cfg), run)
    pod_id = "pod-next"
    runtime.pod(pod_id)
    req = cri.CreateContainerRequest(pod_sandbox_id=pod_id, sandbox_config=cfg, config=container_config(
        "g2", resources=cri.LinuxContainerResources(cpu_shares=1024, cpu_quota=100000, cpu_period=100000)))

    async def send(r):
        return cri.CreateContainerResponse(container_id="next")

    waiting = asyncio.create_task(front(eng).create_container(req, send))  # arrives before the first round
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await eng.reconcile()
    with pytest.raises(PolicyError, match="needs 1 exclusive"):
        await waiting
    assert str(eng.state.policy.cpus_of("made-while-down")) == "0"  # kept where it runs, accounted


@pytest.mark.parametrize("how", ["StopContainer", "event"])
async def test_a_release_while_a_round_observes_is_not_undone_by_it(engine, how):
    # A round that listed the container as running before it stopped must not "revive" it:
    # that would hand its CPUs out again while the container is gone.
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg, "c1")
    rt = engine.state.runtime.client
    rt.pod(pod_id)
    rt.run("c1", pod_id)
    original_list = rt.list_containers

    async def list_then_stop(pod_id=""):
        listed = await original_list(pod_id)  # still running here ...
        if how == "StopContainer":             # ... and stopped before the round commits
            async def send(req):
                return cri.StopContainerResponse()
            await front(engine).stop_container(cri.StopContainerRequest(container_id="c1"), send)
        else:
            await engine.stopping.container_event(ContainerEvent.STOPPED, "c1", pod_id)
        rt.list_containers = original_list
        return listed

    rt.list_containers = list_then_stop
    await engine.reconcile()
    assert engine.state.containers["c1"].state == ContainerState.EXITED
    assert "c1" not in engine.state.snapshot()["unallocated"]


async def test_hook_adjustments_outlive_moves_and_updates_that_change_nothing(engine):
    from resmgr.model import Adjustment

    pod_id, cfg = await _run_pod(engine)
    pod = engine.state.pods[pod_id]
    plan = await engine.creating.plan_create(pod, engine_container(pod_id, "a"))
    engine.creating.amend_create(plan, Adjustment(env={"X": "1"}, resources=Resources(cpu_quota=25000)))
    await engine.creating.commit_create(plan, "c1")
    await _create(engine, pod_id, cfg, cid="c2", name="b")  # the policy moves c1
    await engine.state.settle_updates()
    c1 = engine.state.containers["c1"]
    assert c1.resources.cpuset_cpus == "0-1" and c1.resources.cpu_quota == 25000 and c1.env == {"X": "1"}
    pushed = [res for cid, res in engine.state.runtime.client.updates if cid == "c1"]
    assert pushed and pushed[-1].cpu_quota == 25000
    # An update that changes nothing keeps what the plugins set.
    plan = await engine.updating.plan_update("c1", Resources(cpu_shares=c1.requested.cpu_shares), plain=True)
    assert plan.resources is None and plan.adjusted == Resources(cpu_quota=25000)
    await engine.updating.commit_update(plan, c1.resources)
    assert engine.state.containers["c1"].adjusted == Resources(cpu_quota=25000)


def engine_container(pod_id, name):
    from resmgr.frontends.cri import convert

    return convert.container_from_config(pod_id, container_config(name))


class TakingPolicy(Policy):
    """Gives each new container CPU n+1 of its own (n: containers before it) and moves every other to CPU 0."""

    name = "test-taking"

    def allocate(self, container, pod, view):
        n = len(view.containers)
        others = {k: Resources(cpuset_cpus="0") for k in view.containers if k != container.key}
        return Decision(resources=Resources(cpuset_cpus=str(n)), updates=others)


def taking_engine(tmp_path, policy: Policy | None = None) -> Engine:
    """An engine on a fresh state directory and a fake runtime (the policy: TakingPolicy)."""
    store = StateStore(tmp_path)
    store.prepare()
    return Engine(policy or TakingPolicy(), store, CriRuntime(FakeRuntime()))


async def test_a_start_waits_until_the_runtime_took_the_moves_off_its_cpus(tmp_path):
    engine = taking_engine(tmp_path)
    rt = engine.state.runtime.client
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg, cid="c1", name="a")
    started = []

    async def start():
        started.append(True)

    await engine.starting.start_container("c1", start)
    rt.fail_updates = True  # the runtime goes away while c2's create moves c1 off CPU 2
    await _create(engine, pod_id, cfg, cid="c2", name="b")
    await engine.state.settle_updates()
    assert engine.state.containers["c1"].pending and rt.cpusets.get("c1") != "0"
    with pytest.raises(NotReady, match="c1"):
        await engine.starting.start_container("c2", start)
    assert started == [True]  # c2 was not started while c1 may still run on its CPU
    rt.fail_updates = False
    await engine.starting.start_container("c2", start)
    assert started == [True, True] and rt.cpusets["c1"] == "0" and not engine.state.containers["c1"].pending


async def _taking_with_cgroups(tmp_path):
    """A TakingPolicy engine that reads (and may write) container cgroups under tmp_path/cg, and a pod."""
    engine = Engine(TakingPolicy(), StateStore(tmp_path / "state"), CriRuntime(FakeRuntime()),
                    cpusets=CpusetFiles(str(tmp_path / "cg")))
    engine.state.store.prepare()
    pod_id, cfg = await _run_pod(engine)
    return engine, engine.state.runtime.client, pod_id, cfg


async def test_a_container_whose_cgroup_still_holds_the_cpus_of_one_starting_is_moved_off_them_first(tmp_path):
    """The runtime's word is not the kernel's: containerd logs and ignores a failed update an NRI
    answer carries, and a lost task takes one without applying it. Before a container runs, the
    cgroups of those moved off its CPUs are read, and one still on them is written."""
    engine, rt, pod_id, cfg = await _taking_with_cgroups(tmp_path)
    await _create(engine, pod_id, cfg, cid="c1", name="a")
    await engine.starting.start_container("c1", _ok)
    cg = _cgroup(tmp_path / "cg", cfg.linux.cgroup_parent, "c1", "1")
    await _create(engine, pod_id, cfg, cid="c2", name="b")  # c2 on CPU 2, c1 moved to CPU 0
    await engine.state.settle_updates()
    assert rt.cpusets["c1"] == "0" and not engine.state.containers["c1"].pending  # taken, says the runtime
    (cg / "cpuset.cpus").write_text("0-3\n")  # ... and the kernel runs it where it ran
    other = _cgroup(tmp_path / "cg", cfg.linux.cgroup_parent, "c9", "0-3")  # not ours: left alone
    await engine.starting.start_container("c2", _ok)
    assert (cg / "cpuset.cpus").read_text() == "0" and (other / "cpuset.cpus").read_text() == "0-3\n"
    (cg / "cpuset.cpus").write_text("0\n")
    assert await engine.starting.off_its_cpus("c2") == []  # off them now: nothing written


async def test_a_container_whose_own_cgroup_holds_cpus_it_was_moved_off_is_written_before_it_runs(tmp_path):
    """containerd made c1's task from what c1 was created with, though c1's move off CPU 2 had
    reached it (under NRI, in c2's create answer while c1's own create was still under way: two
    creates at once after a node's reboot, c1 then started on c2's CPU). Before a container runs,
    its own cgroup is read too, and written with its grant where it holds more."""
    engine, rt, pod_id, cfg = await _taking_with_cgroups(tmp_path)
    await _create(engine, pod_id, cfg, cid="c1", name="a")
    await _create(engine, pod_id, cfg, cid="c2", name="b")  # c2 on CPU 2, c1 moved to CPU 0
    await engine.state.settle_updates()
    assert rt.cpusets["c1"] == "0" and not engine.state.containers["c1"].pending  # taken, says the runtime
    cg = _cgroup(tmp_path / "cg", cfg.linux.cgroup_parent, "c1", "0-3")  # ... its task made as created
    await engine.starting.start_container("c1", _ok)
    assert (cg / "cpuset.cpus").read_text() == "0"
    (cg / "cpuset.cpus").write_text("0\n")
    assert await engine.starting.off_its_cpus("c1") == []  # as granted now: nothing written


async def test_a_container_starting_whose_move_waits_keeps_of_where_it_runs_only_what_it_may(tmp_path):
    """Its move pending (the CPUs it goes to partly still held by another that is to leave them),
    a container whose task was made on CPUs it was moved off is narrowed before it runs: to those of
    its grant it runs on, and those of its grant nobody still holds; the push does the rest."""
    engine, rt, pod_id, cfg = await _taking_with_cgroups(tmp_path)
    await _create(engine, pod_id, cfg, cid="c1", name="a")
    await engine.state.settle_updates()
    c1 = engine.state.containers["c1"]
    c1.resources, c1.pending = c1.resources.with_cpus("0-2"), True
    engine.state.pusher.still_left = lambda key: CPUSet([0])  # another still runs on CPU 0, to leave it
    cg = _cgroup(tmp_path / "cg", cfg.linux.cgroup_parent, "c1", "2-3")
    assert await engine.reconciler.cgroups.own(c1)
    assert (cg / "cpuset.cpus").read_text() == "1-2"  # 3 it may not hold; 0 not yet
    assert (cg / "cpuset.mems").read_text() == "0\n"  # its memory nodes follow with the move
    engine.state.pusher.still_left = lambda key: CPUSet([0, 1, 2])
    (cg / "cpuset.cpus").write_text("3\n")
    assert not await engine.reconciler.cgroups.own(c1)  # nothing it may hold yet: left to the push


async def _held_back(tmp_path):
    """c1 runs and c2 is made on a CPU c1 must leave, with the runtime refusing c1's move."""
    engine = taking_engine(tmp_path)
    rt = engine.state.runtime.client
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg, cid="c1", name="a")
    rt.fail_updates = True
    await _create(engine, pod_id, cfg, cid="c2", name="b")
    return engine, rt, pod_id, cfg


async def test_a_runtime_that_never_takes_the_moves_does_not_keep_a_container_from_running(tmp_path, monkeypatch):
    engine, rt, pod_id, cfg = await _held_back(tmp_path)
    started = []

    async def start():
        started.append(True)

    with pytest.raises(NotReady):
        await engine.starting.start_container("c2", start)
    monkeypatch.setattr(starting, "HOLD_BACK_MAX", 0.0)  # refused for longer than that
    await engine.starting.start_container("c2", start)
    assert started == [True] and engine.state.containers["c1"].pending  # started all the same, logged


async def test_a_container_updated_while_the_runtime_starts_it_is_updated_again(tmp_path):
    """The runtime may start a container from what it held before an update that came meanwhile;
    whoever gets the CPUs it was moved off waits until it is started and updated again."""
    engine = taking_engine(tmp_path)
    rt = engine.state.runtime.client
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg, cid="c1", name="a")
    events = []
    in_runtime, finish = asyncio.Event(), asyncio.Event()

    async def slow_start():
        in_runtime.set()
        await finish.wait()
        events.append("c1 started")

    async def start():
        events.append("c2 started")

    first = asyncio.create_task(engine.starting.start_container("c1", slow_start))
    await in_runtime.wait()
    await _create(engine, pod_id, cfg, cid="c2", name="b")  # moves c1 off CPU 2 while it starts
    second = asyncio.create_task(engine.starting.start_container("c2", start))
    await asyncio.sleep(0.05)
    assert events == []  # c2 waits for c1's start
    finish.set()
    await asyncio.gather(first, second)
    assert events == ["c1 started", "c2 started"]
    # While starting (pushed again while its move is not taken), and once after.
    assert [cid for cid, _ in rt.updates].count("c1") >= 2
    # The push after the start reached the task the start made: its move is taken.
    c1 = engine.state.containers["c1"]
    assert "c1" not in engine.state.pusher.raced and not c1.pending
    assert engine.state.pusher.held["c1"] == c1.resources.cpuset_cpus


async def test_balloons_are_reconfigured_live_and_persisted(tmp_path):
    from resmgr.policies import create
    from tests.support.world import machine

    topo = machine("sockets=1,cores=4,threads=1")  # CPUs 0-3
    store = StateStore(tmp_path)
    store.prepare()
    runtime = FakeRuntime()
    types = {"BalloonTypes": [{"Name": "pair", "MinCPUs": 2, "Namespaces": ["*"]}]}
    config = {"Active": "balloons", "ReservedResources": {"cpu": "cpuset:0"}, "balloons": types}
    eng = Engine(create("balloons", config, topo), store, CriRuntime(runtime))
    cfg = pod_config("p", qos="burstable")

    async def run(req):
        return cri.RunPodSandboxResponse(pod_sandbox_id="pod")

    async def send(req):
        return cri.CreateContainerResponse(container_id="a")

    await front(eng).run_pod_sandbox(cri.RunPodSandboxRequest(config=cfg), run)
    await front(eng).create_container(cri.CreateContainerRequest(
        pod_sandbox_id="pod", config=container_config("a", resources=cri.LinuxContainerResources(cpu_shares=512)),
        sandbox_config=cfg), send)
    assert eng.state.containers["a"].resources.cpuset_cpus == "1-2"
    again = Engine(create("balloons", config, topo), StateStore(tmp_path), CriRuntime(FakeRuntime()))
    again.state.restore(StateStore(tmp_path).load())
    assert again.state.policy.export_state() == eng.state.policy.export_state()
    # A new configuration keeps the balloon and resizes it, pushing what moved.
    types["BalloonTypes"][0]["MinCPUs"] = 3
    await eng.state.reconfigure(config)
    assert [(cid, r.cpuset_cpus) for cid, r in runtime.updates] == [("a", "1-3")]
    # One that puts the container in another type re-places everyone (as the config manager does:
    # the policy says it cannot keep its balloons, and a new instance re-allocates every container).
    types["BalloonTypes"] = [{"Name": "solo", "MinCPUs": 1, "Namespaces": ["*"]}]
    with pytest.raises(NotImplementedError):
        await eng.state.reconfigure(config)
    await eng.state.switch_policy(create("balloons", config, topo))
    assert runtime.updates[-1][0] == "a" and eng.state.policy.describe_grant("a")["pool"] == "solo[0]"


async def test_the_reconciler_stops_when_cancelled_as_it_is_woken(engine):
    """A cancellation that lands as the reconciler is woken must end it (asyncio.wait_for in 3.11
    returns the woken result and drops the cancellation, so a daemon could hang on SIGTERM)."""
    for i in range(20):
        task = asyncio.create_task(engine.run_reconciler(10))
        for _ in range(i % 5):
            await asyncio.sleep(0)
        engine.state.wake()
        for _ in range(i % 3):
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=2)
        assert done, f"the reconciler went on after its cancellation (round {i})"


async def test_a_hint_the_policy_does_not_consult_is_named_in_a_warning(engine, caplog):
    """nri-plugins' and our hint annotations never go unheard: one the policy did not read for a
    container is named (class annotations are the controllers', and other containers' are theirs)."""
    from resmgr.frontends.cri import convert

    cfg = pod_config("hinted")
    cfg.annotations["prefer-isolated-cpus.resource-policy.nri.io"] = "true"
    cfg.annotations["rdtclass.cri-resource-manager.intel.com"] = "gold"
    cfg.annotations["hide-hyperthreads.cri-resource-manager.intel.com/container.other"] = "true"

    async def send(req):
        return cri.RunPodSandboxResponse(pod_sandbox_id="pod-hinted")

    await front(engine).run_pod_sandbox(cri.RunPodSandboxRequest(config=cfg), send)
    pod = engine.state.pods["pod-hinted"]
    container = convert.container_from_config("pod-hinted", container_config("a"))
    with caplog.at_level("WARNING", logger="cri-resmgr.engine"):
        await engine.creating.plan_create(pod, container)
    warned = [r.getMessage() for r in caplog.records if "have no effect" in r.getMessage()]
    assert warned == ["container default/hinted/a: annotation(s) prefer-isolated-cpus.resource-policy.nri.io have "
                      "no effect under policy test-pinning"]


async def test_a_full_disk_neither_fails_a_create_nor_keeps_the_engine_from_its_first_reconciliation(
        tmp_path, monkeypatch):
    import errno
    import os

    from resmgr.engine import store as store_mod

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store_mod.os, "write", full)
    eng = Engine(PinningPolicy(), StateStore(tmp_path), CriRuntime(FakeRuntime()), gated=True)
    eng.state.store.prepare()
    pod_id, cfg = await _run_pod(eng)
    eng.state.runtime.client.pod(pod_id)
    await eng.reconcile()  # its save fails: the round still counts
    assert eng.state.reconciled.is_set()
    await _create(eng, pod_id, cfg)  # the runtime made it: the answer is not an error
    assert "c1" in eng.state.containers
    assert eng.state.problems() and "No space left on device" in eng.state.problems()[0]


async def test_a_start_held_back_by_a_slow_runtime_waits_for_its_moves_within_the_callers_deadline(
        tmp_path, monkeypatch):
    """kubelet makes a container anew when its start is refused (a restart, as users see it): while
    the caller's deadline allows, the moves are pushed again instead, and the start goes out once the
    runtime takes them; only near the deadline is it refused."""
    import time

    monkeypatch.setattr(pushing, "ANSWER_MARGIN", 0.2)
    engine, rt, pod_id, cfg = await _held_back(tmp_path)
    started = []

    async def start():
        started.append(True)

    asyncio.get_running_loop().call_later(0.5, setattr, rt, "fail_updates", False)
    await engine.starting.start_container("c2", start, deadline=time.monotonic() + 10)
    assert started == [True] and rt.cpusets["c1"] == "0"

    rt.fail_updates = True
    await _create(engine, pod_id, cfg, cid="c3", name="c")
    began = time.monotonic()
    with pytest.raises(NotReady):
        await engine.starting.start_container("c3", start, deadline=time.monotonic() + 1.0)
    assert 0.5 < time.monotonic() - began < 1.0 and started == [True]


async def test_a_start_held_back_by_a_runtime_that_does_not_answer_is_refused_before_the_deadline(
        tmp_path, monkeypatch):
    """An update the runtime takes forever with: the refusal still reaches the caller in time."""
    import time

    monkeypatch.setattr(pushing, "ANSWER_MARGIN", 0.3)
    engine, rt, pod_id, cfg = await _held_back(tmp_path)
    hang = asyncio.Event()

    async def stuck(*args, **kwargs):
        await hang.wait()

    monkeypatch.setattr(engine.state.runtime, "update_resources", stuck)

    async def start():
        raise AssertionError("started while c1 may still run on its CPU")

    began = time.monotonic()
    with pytest.raises(NotReady):
        await engine.starting.start_container("c2", start, deadline=time.monotonic() + 1.5)
    assert time.monotonic() - began < 1.4 and engine.state.containers["c1"].pending
    hang.set()


async def test_a_pod_whose_sandbox_vanished_is_offered_its_cpus_when_kubelet_makes_it_anew(engine, tmp_path):
    """After a reboot the runtime has no sandbox left and reconciliation drops every pod, but kubelet
    makes them anew (same UID): their containers are offered the CPUs they ran on, also across a
    restart of cri-resmgr meanwhile; a pod kubelet removed is not remembered."""
    rt = engine.state.runtime.client
    pod_id, cfg = await _run_pod(engine, "kept")
    await _create(engine, pod_id, cfg, cid="c1", name="a")
    gone_id, gone_cfg = await _run_pod(engine, "removed")
    await _create(engine, gone_id, gone_cfg, cid="c2", name="a")
    cpus = engine.state.containers["c1"].resources.cpuset_cpus
    await front(engine).remove_pod_sandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=gone_id), _none)
    rt.pods, rt.containers = [], []  # the node rebooted
    await engine.reconcile()
    assert not engine.state.pods
    await engine.state.flush()
    again = Engine(PinningPolicy(), StateStore(tmp_path), CriRuntime(rt))  # cri-resmgr restarted
    again.state.restore(StateStore(tmp_path).load())
    await again.reconcile()

    async def send(req):
        return cri.RunPodSandboxResponse(pod_sandbox_id="pod-kept-2")

    await front(again).run_pod_sandbox(cri.RunPodSandboxRequest(config=cfg), send)
    await _create(again, "pod-kept-2", cfg, cid="c3", name="a")
    assert again.state.containers["c3"].previous == cpus
    assert not any(k.startswith(gone_cfg.metadata.uid) for k in again.state.ledger.previous)


async def _none(req):
    return None


async def test_a_vanished_pod_is_remembered_in_a_state_the_previous_release_reads(engine, tmp_path):
    # A rollback within the 15 minutes a vanished pod is remembered (pods removed while the
    # plugin was away during an upgrade) lost 0.1.0 the whole state, claims included: the file said
    # version 2. It stays version 1; 0.1.0 drops the entry "<uid>/" of previous as a pod it does
    # not know, and this version reads it back as the time the pod vanished.
    from resmgr.engine import statefile

    pod_id, cfg = await _run_pod(engine, "kept")
    await _create(engine, pod_id, cfg, cid="c1", name="a")
    engine.state.runtime.client.pods, engine.state.runtime.client.containers = [], []  # the node rebooted
    await engine.reconcile()
    snap = engine.state.snapshot()
    uid = cfg.metadata.uid
    assert "version" not in snap and "vanished" not in snap
    assert set(snap["previous"]) == {f"{uid}/a", f"{uid}/"}
    statefile.check({"version": 1, **snap})
    assert all(isinstance(v, str) for v in snap["previous"].values())  # 0.1.0's schema: strings
    when = engine.state.ledger.vanished[uid]
    again = Engine(PinningPolicy(), StateStore(tmp_path), CriRuntime(engine.state.runtime.client))
    again.state.restore(snap)
    assert again.state.ledger.vanished == {uid: when}
    assert set(again.state.ledger.previous) == {f"{uid}/a"}
    again.state.restore({**snap, "previous": {}, "version": 2, "vanished": {uid: when}})  # as written before
    assert again.state.ledger.vanished == {uid: when}


class ResizingPolicy(Policy):
    """Container "g" gets CPU 1, any other CPUs 2-3; g resized to 2 CPUs takes 1-2 and moves the others to 3."""

    name = "test-resizing"

    def allocate(self, container, pod, view):
        return Decision(resources=Resources(cpuset_cpus="1" if container.name == "g" else "2-3"))

    def resize(self, container, pod, requested, view):
        grow = requested.cpu_quota > 100000
        others = {k: Resources(cpuset_cpus="3" if grow else "2-3") for k in view.containers if k != container.key}
        return Decision(resources=Resources(cpuset_cpus="1-2" if grow else "1"), updates=others)


async def _resizing_pair(tmp_path):
    """An engine on ResizingPolicy with c1 ("g", on CPU 1) and c2 ("s", on 2-3) in one pod, and its runtime."""
    engine = taking_engine(tmp_path, ResizingPolicy())
    rt = engine.state.runtime.client
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg, cid="c1", name="g")
    await _create(engine, pod_id, cfg, cid="c2", name="s")
    rt.cpusets.update(c1="1", c2="2-3")
    return engine, rt


def _grow_c1() -> cri.UpdateContainerResourcesRequest:
    """c1 resized to 2 CPUs (ResizingPolicy gives it 1-2 and moves the others to 3)."""
    return cri.UpdateContainerResourcesRequest(container_id="c1", linux=cri.LinuxContainerResources(
        cpu_shares=2048, cpu_quota=200000, cpu_period=100000))


async def test_a_resize_goes_to_the_runtime_only_once_the_containers_it_moves_have_left_its_new_cpus(tmp_path):
    """A Guaranteed container resized from 1 to 2 CPUs takes CPU 2 from a shared one: the runtime
    takes the shared one's move first, and while it refuses that move the resize is refused (kubelet
    asks again) rather than sent, which would run both on CPU 2."""
    import time

    engine, rt = await _resizing_pair(tmp_path)
    seen = []

    async def send(req):
        seen.append((req.linux.cpuset_cpus, rt.cpusets["c2"]))
        return cri.UpdateContainerResourcesResponse()

    rt.fail_updates = True
    with pytest.raises(NotReady, match="c2"):
        await front(engine).update_container_resources(_grow_c1(), send, deadline=time.monotonic() + 1)
    assert seen == [] and engine.state.containers["c1"].resources.cpuset_cpus == "1"  # undone
    rt.fail_updates = False
    await front(engine).update_container_resources(_grow_c1(), send, deadline=time.monotonic() + 10)
    assert seen == [("1-2", "3")]  # c2 was on CPU 3 alone before c1 was sent CPUs 1-2
    assert engine.state.containers["c1"].resources.cpuset_cpus == "1-2" and not engine.state.containers["c2"].pending


class SwappingPolicy(Policy):
    """Container "g" gets CPU 1, any other CPUs 2-4; g resized to 2 CPUs takes 2-3 and the others
    take 1 and 4: a swap, the others onto the CPU g gives up."""

    name = "test-swapping"

    def allocate(self, container, pod, view):
        return Decision(resources=Resources(cpuset_cpus="1" if container.name == "g" else "2-4"))

    def resize(self, container, pod, requested, view):
        others = {k: Resources(cpuset_cpus="1,4") for k in view.containers if k != container.key}
        return Decision(resources=Resources(cpuset_cpus="2-3"), updates=others)


async def test_a_resize_that_moves_a_container_lets_no_other_onto_the_cpus_it_leaves_before_it_has_left(tmp_path):
    """g resized from CPU 1 to CPUs 2-3, s from 2-4 to 1,4 (topology-aware did so in a soak): s first
    steps aside onto 4, then g is sent 2-3, then s gets 1 as well. Sent at once, s would share CPU 1
    with g, or g CPUs 2-3 with s."""
    import time

    engine = taking_engine(tmp_path, SwappingPolicy())
    rt = engine.state.runtime.client
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg, cid="c1", name="g")
    await _create(engine, pod_id, cfg, cid="c2", name="s")
    rt.cpusets.update(c1="1", c2="2-4")
    seen = []

    async def send(req):
        seen.append((req.linux.cpuset_cpus, rt.cpusets["c2"]))
        rt.cpusets["c1"] = req.linux.cpuset_cpus
        return cri.UpdateContainerResourcesResponse()

    await front(engine).update_container_resources(_grow_c1(), send, deadline=time.monotonic() + 10)
    await engine.state.pusher.settle()
    assert seen == [("2-3", "4")]  # s aside on CPU 4 when g was sent 2-3
    assert rt.cpusets == {"c1": "2-3", "c2": "1,4"} and not engine.state.containers["c2"].pending


async def test_a_resize_waits_for_a_container_it_moves_that_the_runtime_is_starting(tmp_path):
    """The runtime answers an update of a container it is starting and may start it from what it
    held before: the move is not taken until the container runs and is updated again, so a resize
    that gains its CPUs goes to the runtime only then (it ran 2 s on a resized Guaranteed
    container's CPUs in a soak)."""
    import time

    engine, rt = await _resizing_pair(tmp_path)
    events = []
    in_runtime, finish = asyncio.Event(), asyncio.Event()

    async def slow_start():
        in_runtime.set()
        await finish.wait()
        rt.cpusets["c2"] = "2-3"  # started from what the runtime held when the start began
        events.append("c2 started")

    async def send(req):
        events.append(f"c1 sent {req.linux.cpuset_cpus} with c2 on {rt.cpusets['c2']}")
        return cri.UpdateContainerResourcesResponse()

    starting_c2 = asyncio.create_task(engine.starting.start_container("c2", slow_start))
    await in_runtime.wait()
    resize = asyncio.create_task(front(engine).update_container_resources(
        _grow_c1(), send, deadline=time.monotonic() + 10))
    await asyncio.sleep(0.3)
    assert events == []  # c2's move was answered, but c2 is still being started
    finish.set()
    await asyncio.gather(starting_c2, resize)
    assert events == ["c2 started", "c1 sent 1-2 with c2 on 3"]


async def test_of_many_pushes_none_moves_onto_cpus_a_refused_move_did_not_free(tmp_path):
    """A rebalance that moves c1 off CPU 0 and c2 onto it: when the runtime refuses c1's move, c2
    stays where it is (pending) until reconciliation pushes both again."""
    engine = taking_engine(tmp_path)
    rt = engine.state.runtime.client
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg, cid="c1", name="a")
    await _create(engine, pod_id, cfg, cid="c2", name="b")
    await engine.state.settle_updates()
    assert rt.cpusets == {"c1": "0"} and engine.state.containers["c2"].resources.cpuset_cpus == "2"
    async with engine.state.lock:
        engine.state.record({"c1": Resources(cpuset_cpus="1"), "c2": Resources(cpuset_cpus="0")})
    failing = engine.state.runtime.update_resources

    async def refuse_c1(cid, res):
        if cid == "c1":
            raise RuntimeError("runtime away")
        await failing(cid, res)

    engine.state.runtime.update_resources = refuse_c1
    await engine.state.apply_updates(Decision(updates={"c1": Resources(), "c2": Resources()}))
    assert rt.cpusets == {"c1": "0"} and engine.state.containers["c2"].pending  # c2 not sent onto CPU 0
    engine.state.runtime.update_resources = failing
    await engine.state.pusher.push_pending()
    assert rt.cpusets == {"c1": "1", "c2": "0"} and not engine.state.containers["c2"].pending


class ColdPolicy(Policy):
    """Every container starts on memory node 1 and is warmed (nodes 0-1) after 0.2 s."""

    name = "test-cold"

    def __init__(self, config=None, topology=None):
        super().__init__(config, topology)
        self.cold_keys: set[str] = set()

    def allocate(self, container, pod, view):
        self.cold_keys.add(container.key)
        return Decision(resources=Resources(cpuset_cpus="0", cpuset_mems="1"), warm_after=0.2)

    def rename(self, old_key, new_key):
        if old_key in self.cold_keys:
            self.cold_keys.discard(old_key)
            self.cold_keys.add(new_key)

    def warm(self, key, view):
        if key not in self.cold_keys:
            return Decision()
        self.cold_keys.discard(key)
        return Decision(updates={key: Resources(cpuset_cpus="0", cpuset_mems="0-1")})

    def cold(self):
        return sorted(self.cold_keys)

    def export_state(self):
        return {"cold": sorted(self.cold_keys)}

    def restore_state(self, data):
        self.cold_keys = set(data.get("cold") or [])


async def test_a_cold_start_ends_with_the_memory_pushed_and_a_restart_cuts_it_short(tmp_path):
    engine = taking_engine(tmp_path, ColdPolicy())
    rt = engine.state.runtime.client
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg, cid="c1", name="a")
    assert engine.state.containers["c1"].resources.cpuset_mems == "1"
    assert not rt.updates  # still cold
    async with asyncio.timeout(5):
        while not rt.updates:  # the policy's 0.2 s
            await asyncio.sleep(0.02)
    await engine.state.settle_updates()
    assert [(cid, r.cpuset_mems) for cid, r in rt.updates] == [("c1", "0-1")]
    assert engine.state.containers["c1"].resources.cpuset_mems == "0-1" and not engine.state.containers["c1"].pending

    await _create(engine, pod_id, cfg, cid="c2", name="b")  # cold, and the daemon restarts at once
    snapshot = engine.state.snapshot()
    again = Engine(ColdPolicy(), engine.state.store, CriRuntime(FakeRuntime()))
    again.state.restore(snapshot)
    c2 = again.state.containers["c2"]
    assert c2.pending and c2.resources.cpuset_mems == "0-1" and again.state.policy.cold() == []


async def test_write_behind_makes_a_burst_of_changes_one_write_and_misses_none(tmp_path, monkeypatch):
    # The runtime's calls for one container come milliseconds apart: each wrote a snapshot of every
    # container (7 writes a container, most of the NRI plugin's CPU). A change made while a write is
    # under way is written by the next one.
    from resmgr.engine.state import WRITE_BEHIND, EngineState

    store = StateStore(tmp_path)
    store.prepare()
    written = []
    real = store.write
    monkeypatch.setattr(store, "write", lambda data: written.append(data["policy"]["config"]) or real(data))
    state = EngineState(PinningPolicy(), store, runtime=None, write_behind=True)
    for n in range(10):
        state.policy.config = {"n": n}
        await state.save()
        await asyncio.sleep(0.001)
    await asyncio.sleep(WRITE_BEHIND * 3)
    assert written == [{"n": 9}]
    state.policy.config = {"n": 10}
    await state.save()
    await asyncio.sleep(WRITE_BEHIND + 0.01)  # its write is under way (in a thread) ...
    state.policy.config = {"n": 11}
    await state.save()                        # ... and this change comes meanwhile
    await asyncio.sleep(WRITE_BEHIND * 3)
    assert written[-1] == {"n": 11} and store.load()["policy"]["config"] == {"n": 11}


async def test_an_update_the_runtime_keeps_failing_is_retried_with_backoff_not_in_a_tight_loop(engine, monkeypatch):
    """A runtime that lists the container but fails its every update (one it is stopping, say):
    each failed push asked for a round at once, whose push failed and asked again, thousands of
    rounds a second, each logging. Retries in a row now wait longer each time, and once the
    runtime takes the update the next failure is retried at once again."""
    pod_id, cfg = await _run_pod(engine)
    await _create(engine, pod_id, cfg, cid="c1", name="a")
    rt = engine.state.runtime.client
    rt.pod(pod_id)
    rt.run("c1", pod_id)
    rt.cpusets["c1"] = "1"  # not what it was granted
    rounds = []
    real = engine.reconciler.reconcile

    async def counted(*args, **kwargs):
        rounds.append(asyncio.get_running_loop().time())
        return await real(*args, **kwargs)

    monkeypatch.setattr(engine.reconciler, "reconcile", counted)
    engine.state.retry.most = 1.0
    rt.fail_updates = True
    task = asyncio.create_task(engine.run_reconciler(10))
    try:
        engine.state.wake()
        await asyncio.sleep(2.0)
        assert 2 <= len(rounds) <= 6, f"{len(rounds)} rounds in 2 s"
        rt.fail_updates = False
        await asyncio.sleep(1.5)
        assert rt.cpusets["c1"] == "0" and not engine.state.containers["c1"].pending
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_retry_is_at_once_the_first_time_and_doubles_in_a_row():
    """Failures may be known after the round that retried them (NRI's UpdateContainers answers
    later): a run of retries ends with quiet, not with a round."""
    from resmgr.engine.retry import Retry

    woken = []
    loop = asyncio.get_running_loop()
    retry = Retry(lambda: woken.append(loop.time()), first=0.05, most=0.2)
    began = loop.time()
    retry()
    assert len(woken) == 1  # at once
    for _ in range(4):
        retry()
        retry()  # one already due covers it
        await asyncio.sleep(0.25)
    assert len(woken) == 5 and woken[-1] - began >= 0.05 + 0.1 + 0.2 + 0.2
    await asyncio.sleep(0.45)  # quiet for longer than twice the longest delay
    retry()
    assert retry.asked == 1 and len(woken) == 6  # at once again


async def test_the_nri_plugins_failed_updates_are_retried_by_the_engine_with_backoff(engine):
    from resmgr.frontends.nri.frontend import NriFrontEnd

    front = NriFrontEnd("/run/nri.sock", "cri-resmgr", "90")
    front.bind(engine, None)
    assert front.nri_runtime.on_failure is engine.state.retry


async def test_a_switch_to_a_policy_that_places_no_memory_lifts_the_memory_placed_before(tmp_path):
    """topology-aware confines a container's memory to its CPUs' NUMA node; static (kubelet's CPU
    manager) places CPUs only. The runtime leaves what an update does not name, so a switch that
    sent no memory nodes would leave the container on one node's memory, its CPUs on every node."""
    from resmgr.policies import create

    eng, runtime, topo, create_as = await _topology_aware_pod(tmp_path)
    await create_as("s", "one", cri.LinuxContainerResources(cpu_shares=1024, cpu_quota=100000, cpu_period=100000))
    assert eng.state.containers["s"].resources.cpuset_mems in ("0", "1")
    await eng.state.switch_policy(create("static", {"Active": "static"}, topo))
    assert eng.state.containers["s"].resources.cpuset_mems == "0-1"
    assert runtime.updates[-1][0] == "s" and runtime.updates[-1][1].cpuset_mems == "0-1"


async def test_a_container_adopted_with_memory_another_policy_placed_is_given_every_node_under_static(tmp_path):
    """A state file lost (cut by a crash) and a switch to static: the container is adopted from the
    runtime with the memory node topology-aware gave it, which is no request of kubelet's."""
    from resmgr.model import Container, Pod, QOSClass, View
    from resmgr.policies import create
    from tests.support.world import machine

    topo = machine("sockets=1,nodes=2,cores=2,threads=1")
    policy = create("static", {"Active": "static"}, topo)
    c = Container("c", "pod", "one", state=ContainerState.RUNNING,
                  requested=Resources(cpu_shares=1024, cpu_quota=100000, cpu_period=100000, cpuset_cpus="2",
                                      cpuset_mems="1"),
                  resources=Resources(cpu_shares=1024, cpu_quota=100000, cpu_period=100000, cpuset_cpus="2",
                                      cpuset_mems="1"))
    pod = Pod("pod", "uid", "p", "default", qos_class=QOSClass.GUARANTEED)
    decision = policy.adopt(c, pod, View({"pod": pod}, {"c": c}))
    assert decision.resources is not None and decision.resources.cpuset_mems == "0-1"


async def test_a_container_found_running_is_known_to_hold_its_cpus_until_its_move_is_taken(engine):
    """Adopted after the state file was lost: the CPUs the runtime runs it on are held until its
    move lands, so that a container placed onto them waits (they were taken as its new CPUs)."""
    rt = engine.state.runtime.client
    rt.pods = [cri.PodSandbox(id="pod-new", metadata=cri.PodSandboxMetadata(name="new", uid="u", namespace="ns"))]
    rt.containers = [cri.Container(id="c-new", pod_sandbox_id="pod-new", state=cri.CONTAINER_RUNNING,
                                   metadata=cri.ContainerMetadata(name="x"))]
    rt.cpusets["c-new"] = "2-3"
    held = []
    original = engine.state.pusher.push_all

    async def push_all(keys):
        held.append(dict(engine.state.pusher.held))
        await original(keys)

    engine.state.pusher.push_all = push_all
    await engine.reconcile()
    key = engine.state.containers["c-new"].key
    assert held and held[0].get(key) == "2-3"
