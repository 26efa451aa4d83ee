from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from harness.containerd import PrivateContainerd, missing_tools
from harness.kube import ControlPlane
from harness.kube import missing_tools as kube_missing
from tests.support.helpers import Cri, RelayProcess


@pytest.fixture(scope="session")
def containerd():
    missing = missing_tools()
    if missing:
        pytest.fail("containerd harness tools missing: " + ", ".join(missing) + " (run scripts/setup.sh)")
    ctrd = PrivateContainerd().start()
    yield ctrd
    ctrd.stop()


@pytest.fixture(scope="session")
def kube():
    """etcd and kube-apiserver, shared by the tests that run kubelets and agents against them."""
    missing = missing_tools() + kube_missing()
    if missing:
        pytest.fail("Kubernetes harness tools missing: " + ", ".join(missing) + " (run scripts/setup.sh)")
    control = ControlPlane().start()
    yield control
    control.stop()


@pytest.fixture(scope="session")
def previous_release():
    """The release before this tree, built from git (harness/releases.py), for upgrade tests."""
    from harness import releases

    rel = releases.previous_installed()
    if rel is None:
        version, commit = releases.previous()
        pytest.skip(f"release {version}'s commit {commit} is not in this clone's history, nor could it be fetched")
    return rel


@pytest.fixture
def env(workdir, kube):
    """The node agent between the real API server (a Node of its own) and a cri-resmgr (tests/support/agentenv.py)."""
    from tests.support.agentenv import Env, RealCluster

    e = Env(workdir, RealCluster(kube, f"node-{uuid.uuid4().hex[:6]}"))
    yield e
    e.close()


@pytest.fixture
def workdir():
    # Short paths: unix socket paths are limited to 108 bytes. CRIRM_KEEP_WORKDIR=1 keeps them (logs).
    d = tempfile.mkdtemp(prefix="crirm-")
    yield Path(d)
    if not os.environ.get("CRIRM_KEEP_WORKDIR"):
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(params=["splice", "grpc"])
def relay_mode(request):
    """Both relay front ends must behave the same."""
    return request.param


@pytest.fixture
def relay(containerd, workdir, relay_mode):
    proc = RelayProcess(workdir, containerd.socket, "--relay-mode", relay_mode).start()
    yield proc
    proc.stop()


@pytest.fixture
def direct(containerd):
    client = Cri(containerd.socket)
    yield client
    client.close()


@pytest.fixture
def via(relay):
    client = Cri(relay.socket)
    yield client
    client.close()


def pytest_addoption(parser):
    parser.addoption("--soak-seconds", type=float, default=90.0,
                     help="how long each soak test churns pods while killing cri-resmgr and containerd "
                          "(default: %(default)s)")
    parser.addoption("--vm-soak", action="store_true",
                     help="run the VM tier's soak too (tests/vm/test_soak.py, 12-17 minutes; .ci/run "
                          "asks for it)")
    parser.addoption("--vm-soak-seconds", type=float, default=300.0,
                     help="how long the VM tier's soak churns pods and strikes faults (default: %(default)s)")
    parser.addoption("--soak-seed", type=int, default=0,
                     help="seed of the soak tests' choices; the VM tier's soak takes its front end, first "
                          "policy and reboot from it in a fixed rotation (default: the integration soaks a "
                          "new one each run, the VM soak the commit count of HEAD; printed)")


TESTS = Path(__file__).resolve().parent
# The tier of a test is its directory's: unit/<layer>/ (no containerd, no daemon processes, in
# seconds), integration/ (a private containerd, real daemons), cluster/ (a Kubernetes on loopback
# too), vm/ (boots the test node VM).
TIERS = {"unit": "unit", "integration": "integration", "cluster": "integration", "vm": "vm"}
SPEEDS = ("unit", "integration", "vm")


def _speed(item: pytest.Item) -> str | None:
    """A test's speed class: the tier of its directory."""
    parts = Path(str(item.fspath)).resolve().relative_to(TESTS).parts
    return TIERS.get(parts[0]) if len(parts) > 1 else None


def pytest_collection_modifyitems(config, items):
    # A soak runs as long as it is asked to: its time limit follows --soak-seconds.
    limit = config.getoption("--soak-seconds") * 1.5 + 240
    # The VM tier boots a virtual machine for minutes: only `-m vm` (scripts/test.sh --vm) runs it.
    if "vm" not in (config.getoption("markexpr") or ""):
        vm = [item for item in items if _speed(item) == "vm"]
        if vm:
            config.hook.pytest_deselected(items=vm)
            items[:] = [item for item in items if _speed(item) != "vm"]
    for item in items:
        if item.get_closest_marker("soak") is not None:
            item.add_marker(pytest.mark.timeout(limit))
        # Every test is in a tier's directory; `pytest -m unit` (or `pytest tests/unit`) runs in seconds.
        speed = _speed(item)
        if speed not in SPEEDS:
            raise pytest.UsageError(f"{item.nodeid} is in no tier: put it under tests/unit/<layer>/ (no containerd, "
                                    "no daemon processes), tests/integration/, tests/cluster/ or tests/vm/")
        if speed == "unit" and ("containerd" in getattr(item, "fixturenames", ()) or item.get_closest_marker("soak")):
            raise pytest.UsageError(f"{item.nodeid} is a unit test but needs the containerd harness")
        if item.get_closest_marker(speed) is None:
            item.add_marker(getattr(pytest.mark, speed))
