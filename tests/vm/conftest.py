"""The test node VM, booted once for the whole VM tier (its modules share it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness import releases, vmimage
from harness.soak.guest import AGENT_PORT
from harness.soak.proxy import CountingProxy
from harness.vm import Shape, Vm
from harness.vmnode import API_PORT

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def agent_proxy(kube):
    """The guest agent's way to the API server, counting its connections (harness/soak/proxy.py)."""
    proxy = CountingProxy(kube.port).start()
    yield proxy
    proxy.stop()


@pytest.fixture(scope="session")
def vm(kube, agent_proxy, tmp_path_factory):
    """The guest; its kubelet reaches the host's etcd and kube-apiserver (tests/conftest.py) through a
    forward, its agent through the counting proxy. The Debian package lies beside the code."""
    missing = vmimage.missing_tools()
    if missing:
        pytest.fail("the VM tests need: " + ", ".join(missing) + " (run scripts/setup.sh vm)")
    image = vmimage.build()
    deb = subprocess.run(["scripts/build-deb.sh", str(tmp_path_factory.mktemp("deb"))], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    files = {"cri-resmgr.deb": Path(deb)}
    previous = releases.previous_installed()  # the package upgrade and rollback test starts from it
    if previous is not None:
        files["cri-resmgr-previous.deb"] = releases.deb(previous)
    machine = Vm(image, Shape(), forwards={API_PORT: kube.port, AGENT_PORT: agent_proxy.port}, files=files)
    machine.start()
    print(f"the test node booted in {machine.boot_seconds:.0f} s ({machine.dir})")
    yield machine
    machine.stop()


def pytest_collection_modifyitems(config, items):
    """The soak last: it leaves the node as an operator's would be, where the other tests set it up afresh."""
    items.sort(key=lambda item: item.fspath.basename == "test_soak.py")
