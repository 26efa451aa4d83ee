"""How far the policy is from the socket: a CreateContainer from either front end reaches the
policy's decision in a few steps through a few modules (docs/architecture.md walks them). The
steps are the frames of the call's own task, from where the front end starts it to the policy."""

from __future__ import annotations

import inspect
from pathlib import Path

import grpc

from resmgr.engine import Engine
from resmgr.engine.store import StateStore
from resmgr.frontends.cri.runtime import CriRuntime
from resmgr.frontends.nri import transport
from resmgr.frontends.nri.plugin import SERVICE, NriPlugin
from resmgr.frontends.nri.runtime import NriRuntime
from resmgr.frontends.relay.dispatch import Dispatcher
from resmgr.frontends.relay.local import Call, LocalCalls
from resmgr.generated.cri import api_pb2 as cri
from resmgr.generated.nri import api_pb2 as nri
from resmgr.model import Decision, Resources
from resmgr.policies import Policy
from tests.support.fakeruntime import FakeRuntime
from tests.support.helpers import FakeBackend, container_config, pod_config

PACKAGE = Path(__file__).resolve().parents[3] / "resmgr"
MAX_STEPS, MAX_MODULES = 8, 7


class Probe(Policy):
    """Places every container on CPU 0 and keeps the frames it was asked from."""

    name = "probe"

    def __init__(self) -> None:
        super().__init__()
        self.stacks: list[list[tuple[str, str]]] = []

    def allocate(self, container, pod, view):
        self.stacks.append([(f.filename, f.function) for f in inspect.stack()])
        return Decision(resources=Resources(cpuset_cpus="0"))


def steps(probe: Probe, entry: str) -> list[tuple[str, str]]:
    """(module, function) from the front end's entry down to the policy, outermost first."""
    frames = [(str(Path(f).relative_to(PACKAGE.parent)), fn) for f, fn in reversed(probe.stacks[-1])
              if Path(f).is_relative_to(PACKAGE)]
    first = next(i for i, (_, fn) in enumerate(frames) if fn == entry)
    return frames[first:] + [("the policy", "allocate")]


def engine(tmp_path: Path, probe: Probe) -> Engine:
    store = StateStore(tmp_path)
    store.prepare()
    return Engine(probe, store, CriRuntime(FakeRuntime()))


async def test_through_the_relay(tmp_path):
    probe = Probe()
    backend = FakeBackend(str(tmp_path / "runtime.sock")).start()  # answers with the request's bytes
    try:
        async with grpc.aio.insecure_channel(f"unix:{tmp_path / 'runtime.sock'}") as channel:
            local = LocalCalls(Dispatcher(engine(tmp_path, probe), channel, channel), None, None,  # type: ignore[arg-type]
                               lambda: None, lambda: None, lambda: None)
            call = Call(1, "/runtime.v1.RuntimeService/CreateContainer", [])
            req = cri.CreateContainerRequest(pod_sandbox_id="p1", config=container_config("a"),
                                             sandbox_config=pod_config("p")).SerializeToString()
            call.body = bytearray(b"\0" + len(req).to_bytes(4, "big") + req)
            outcome = await local._outcome(call)
    finally:
        backend.stop()
    assert outcome.code == grpc.StatusCode.OK, outcome.details
    path = steps(probe, "_outcome")
    assert [m for m, _ in path][:2] == ["resmgr/frontends/relay/local.py", "resmgr/frontends/relay/dispatch.py"]
    # The call's task begins one frame above, in LocalCalls._run, which awaits _outcome.
    assert len(path) + 1 <= MAX_STEPS and len({m for m, _ in path}) <= MAX_MODULES, path


async def test_through_nri(tmp_path):
    probe = Probe()
    plugin = NriPlugin(engine(tmp_path, probe), NriRuntime())
    req = nri.CreateContainerRequest(pod=nri.PodSandbox(id="p1", name="p", namespace="default", uid="u1"),
                                     container=nri.Container(id="c1", pod_sandbox_id="p1", name="a"))
    configure = nri.ConfigureRequest(runtime_name="containerd", runtime_version="2.3.7")
    await plugin.handle(transport.Call(SERVICE, "Configure", configure.SerializeToString(), None))
    await plugin.handle(transport.Call(SERVICE, "CreateContainer", req.SerializeToString(), None))
    path = steps(probe, "handle")
    # The call's task begins one frame above, in the transport's _serve.
    assert len(path) + 1 <= MAX_STEPS and len({m for m, _ in path}) + 1 <= MAX_MODULES, path
