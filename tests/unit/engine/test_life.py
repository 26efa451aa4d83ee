"""A container's life (resmgr/engine/life.py): the steps the machine names, and none other."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from resmgr.engine import Engine, life
from resmgr.engine.store import StateStore
from resmgr.frontends.cri.lifecycle import CriLifecycle
from resmgr.frontends.cri.runtime import CriRuntime
from resmgr.generated.cri import api_pb2 as cri
from resmgr.model import Container, ContainerState, Resources
from resmgr.policies import Decision, Policy
from tests.support.fakeruntime import FakeRuntime
from tests.support.helpers import container_config, pod_config

STATES = [s for s in ContainerState if s != ContainerState.UNKNOWN]  # UNKNOWN: a listing's word only


@pytest.mark.parametrize(("now", "to"), [p for p in itertools.product(STATES, STATES) if p[0] != p[1]])
def test_a_step_is_taken_only_where_the_machine_names_it(now, to):
    c = Container(id="c1", pod_id="p", name="a", state=now)
    if (now, to) in life.STEPS:
        assert life.step(c, to) and c.state == to
    else:
        with pytest.raises(life.IllegalStep):
            life.step(c, to)
        assert c.state == now


def test_nothing_goes_back_to_pending_or_from_running_to_created():
    for now in STATES:
        assert (now, ContainerState.PENDING) not in life.STEPS
    assert (ContainerState.RUNNING, ContainerState.CREATED) not in life.STEPS


def test_every_state_is_in_the_architecture_table():
    doc = (Path(__file__).parents[3] / "docs" / "architecture.md").read_text()
    table = doc[doc.index("## A container's life"):]
    for state in STATES:
        assert f"| {state.name} " in table


class OneCpu(Policy):
    name = "test-one-cpu"

    def allocate(self, container, pod, view):
        return Decision(resources=Resources(cpuset_cpus="0"))


class SlowListing(FakeRuntime):
    """A runtime whose listing is taken at once and answered when the test says."""

    def __init__(self) -> None:
        super().__init__()
        self.listed = asyncio.Event()
        self.answer = asyncio.Event()
        self.hold = False

    async def list_containers(self, pod_id=""):
        out = await super().list_containers(pod_id)
        if self.hold:
            self.listed.set()
            await self.answer.wait()
        return out


async def test_a_listing_taken_before_a_start_does_not_set_the_container_back(tmp_path):
    """The round's listing says CREATED; the start answered while it was in flight is newer."""
    store = StateStore(tmp_path)
    store.prepare()
    rt = SlowListing()
    engine = Engine(OneCpu(), store, CriRuntime(rt))
    front = CriLifecycle(engine)

    async def made(req):
        return cri.CreateContainerResponse(container_id="c1")

    async def ran(req):
        return cri.RunPodSandboxResponse(pod_sandbox_id="pod-p")

    async def started():
        return None

    cfg = pod_config("p")
    await front.run_pod_sandbox(cri.RunPodSandboxRequest(config=cfg), ran)
    rt.pod("pod-p")
    await front.create_container(cri.CreateContainerRequest(pod_sandbox_id="pod-p", config=container_config("a"),
                                                            sandbox_config=cfg), made)
    rt.run("c1", "pod-p", state=cri.CONTAINER_CREATED)
    rt.hold = True
    round_ = asyncio.create_task(engine.reconcile())
    await rt.listed.wait()
    await engine.starting.start_container("c1", started)
    c = engine.state.containers["c1"]
    assert c.state == ContainerState.RUNNING
    rt.answer.set()
    await round_
    assert c.state == ContainerState.RUNNING
