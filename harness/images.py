"""Build the pause and busybox test images as OCI image-layout tarballs.

Images cannot be pulled on the machines the project is tested on, so both are
built from local binaries: a static pause program compiled from pause.c and
Debian's busybox-static.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

PAUSE_IMAGE = "localhost/cri-resmgr/pause:test"
BUSYBOX_IMAGE = "localhost/cri-resmgr/busybox:test"
BUILD_VERSION = "1"  # bump to invalidate cached images

_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
PLATFORM = f"linux/{_ARCH}"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cri-resmgr" / "images" / BUILD_VERSION


def _add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 0
    tar.addfile(info)


def _add_symlink(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, 0
    tar.addfile(info)


def _blob(out: tarfile.TarFile, data: bytes, media_type: str) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _add_file(out, "blobs/sha256/" + digest.split(":", 1)[1], data)
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def write_oci_archive(path: Path, name: str, layer: bytes, config: dict) -> None:
    """Write a single-layer OCI image layout tarball that `ctr images import` accepts."""
    image_config = {
        "architecture": _ARCH,
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
    }
    tmp = path.with_suffix(f".{os.getpid()}.partial")  # the VM tier and the suite may build at once
    with tarfile.open(tmp, "w") as out:
        _add_file(out, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        layer_desc = _blob(out, layer, "application/vnd.oci.image.layer.v1.tar")
        config_desc = _blob(out, json.dumps(image_config).encode(),
                            "application/vnd.oci.image.config.v1+json")
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config_desc,
            "layers": [layer_desc],
        }
        manifest_desc = _blob(out, json.dumps(manifest).encode(),
                              "application/vnd.oci.image.manifest.v1+json")
        manifest_desc["platform"] = {"architecture": _ARCH, "os": "linux"}
        manifest_desc["annotations"] = {
            "io.containerd.image.name": name,
            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
        }
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": [manifest_desc]}
        _add_file(out, "index.json", json.dumps(index).encode())
    tmp.replace(path)


def _layer(build: Callable[[tarfile.TarFile], None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        build(tar)
    return buf.getvalue()


def build_pause(dest: Path) -> Path:
    path = dest / "pause.tar"
    if path.exists():
        return path
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise RuntimeError("building the pause image needs gcc (apt-get install gcc libc6-dev)")
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "pause"
        subprocess.run([cc, "-O2", "-static", "-o", str(binary),
                        str(Path(__file__).with_name("pause.c"))], check=True)
        data = binary.read_bytes()
    layer = _layer(lambda tar: _add_file(tar, "pause", data, 0o755))
    write_oci_archive(path, PAUSE_IMAGE, layer, {"Entrypoint": ["/pause"]})
    return path


def build_busybox(dest: Path) -> Path:
    path = dest / "busybox.tar"
    if path.exists():
        return path
    busybox = shutil.which("busybox")
    if not busybox:
        raise RuntimeError("building the busybox image needs busybox-static (apt-get install busybox-static)")
    data = Path(busybox).read_bytes()
    applets = subprocess.run([busybox, "--list"], check=True, capture_output=True,
                             text=True).stdout.split()

    def build(tar: tarfile.TarFile) -> None:
        for d in ("bin", "etc", "tmp", "proc", "sys", "dev", "root"):
            _add_dir(tar, d, 0o1777 if d == "tmp" else 0o755)
        _add_file(tar, "bin/busybox", data, 0o755)
        for applet in sorted(set(applets) - {"busybox"}):
            _add_symlink(tar, f"bin/{applet}", "busybox")
        _add_file(tar, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n")
        _add_file(tar, "etc/group", b"root:x:0:\nnogroup:x:65534:\n")

    write_oci_archive(path, BUSYBOX_IMAGE, _layer(build),
                      {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]})
    return path


def build_all() -> dict[str, Path]:
    """Build (or reuse from the cache) both images; returns name -> tarball."""
    dest = cache_dir()
    dest.mkdir(parents=True, exist_ok=True)
    return {PAUSE_IMAGE: build_pause(dest), BUSYBOX_IMAGE: build_busybox(dest)}
