"""The project's own container image for the tests: built by scripts/build-image.py (cached
there) and imported into a test containerd under the name the chart pulls."""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from harness.containerd import tool

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = "docker.io/library/cri-resmgr"  # the chart's image.repository "cri-resmgr", normalised


@functools.cache
def builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_image", ROOT / "scripts" / "build-image.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("build_image", module)
    spec.loader.exec_module(module)
    return module


def build() -> Path:
    """The image archive of the code as it is now (its base layers come from the cache)."""
    b = builder()
    return b.build(b.CACHE / "out")


def build_release(src: Path) -> Path:
    """The image archive of a release's source tree (harness/releases.py), by its own build script."""
    from harness import releases

    out = builder().CACHE / "releases" / src.parent.name
    return releases.built(out, "cri-resmgr-*.oci.tar", [sys.executable, str(src / "scripts" / "build-image.py"),
                                                         str(out)], src, f"the image of {src}")


def load(archive: Path, containerd_socket: str, version: str = "") -> str:
    """Import the archive into containerd's CRI namespace, unpacked for the harness containerd's
    snapshotter; the image's name. (Unpacked for ctr's default instead, every first create of the
    image unpacks it: a loaded machine's creates of the chart's pods then outlast kubelet's timeout.)"""
    version = version or builder().version()
    subprocess.run([tool("ctr"), "--address", containerd_socket, "--namespace", "k8s.io", "images", "import",
                    "--base-name", REPOSITORY, "--local", "--snapshotter", "native", str(archive)],
                   check=True, capture_output=True, text=True)
    return f"{REPOSITORY}:{version}"
