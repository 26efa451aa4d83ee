"""Build the disk image of the test node VM (harness/vm.py boots it).

A Debian 12 system made by mmdebstrap from Debian's packages (systemd as init, cgroup v2, the
Debian kernel), with the pinned containerd, runc, crictl and kubelet that scripts/build-runtime.sh
built (containerd the `containerd-vm` pin, a later release than the host's tests run), the
project's Python dependencies in a venv of their own at /opt/cri-resmgr/venv, the test images,
and the files under harness/guest/. The project's own code is not in it: each boot gets a small
second disk with the code as it is now (vm.project_disk), so a change of code does not rebuild
the image.

The image is cached under ~/.cache/cri-resmgr/vm/<key>, the key a hash of every input, and
rebuilt only when one changes. Run `python -m harness.vmimage` to build it ahead of the tests.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from harness import images
from harness.containerd import TOOLS_BIN

ROOT = Path(__file__).resolve().parent.parent
GUEST_FILES = Path(__file__).resolve().parent / "guest"
CACHE = Path(os.environ.get("CRI_RESMGR_CACHE", Path.home() / ".cache" / "cri-resmgr")) / "vm"
BUILD_VERSION = "1"  # bump to rebuild every cached image
SUITE = "bookworm"
DISK_SIZE = "4G"  # sparse: the file takes what the system uses (about 1.2 GB)

# What a kubeadm node has, and no more: systemd with D-Bus (runc's systemd cgroup driver talks to
# it), the kernel and a small initrd, Python for cri-resmgr, CNI plugins and iptables for pods,
# the guest agent the host runs commands through, numactl to read where memory lands.
PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "udev", "kmod", "linux-image-amd64", "initramfs-tools",
    "python3", "python3-venv", "iproute2", "iptables", "containernetworking-plugins",
    "qemu-guest-agent", "procps", "util-linux", "numactl", "ca-certificates",
)
GO_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "crictl", "kubelet")
# containerd 2.4 or later on the node: its NRI takes UpdateContainers without the deadlock of
# earlier releases (docs/nri.md), which production nodes running the NRI plugin need.
NODE_CONTAINERD = ("containerd", "containerd-shim-runc-v2", "ctr")


@dataclass(frozen=True)
class Image:
    disk: Path  # the root file system, ext4 (raw); boots use a copy-on-write overlay of it
    kernel: Path
    initrd: Path


def python_dependencies() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _inputs() -> dict[str, object]:
    """Everything the image is made of; its hash names the cache entry."""
    guest = {str(p.relative_to(GUEST_FILES)): _file_digest(p)
             for p in sorted(GUEST_FILES.rglob("*")) if p.is_file()}
    # The Go builds live in directories named by their pinned version and go.mod hash.
    binaries = {b: _binary(b).parent.parent.name for b in GO_BINARIES}
    return {"version": BUILD_VERSION, "suite": SUITE, "packages": PACKAGES, "python": python_dependencies(),
            "guest": guest, "binaries": binaries, "images": images.BUILD_VERSION,
            "builder": _file_digest(Path(__file__))}


def missing_tools() -> list[str]:
    need = ["mmdebstrap", "mkfs.ext4", "qemu-system-x86_64", "qemu-img"]
    missing = [t for t in need if shutil.which(t) is None and not Path("/usr/sbin", t).exists()]
    missing += [str(_binary(b)) for b in GO_BINARIES if not os.access(_binary(b), os.X_OK)]
    return missing


def _binary(name: str) -> Path:
    """The build of a Go program the guest gets."""
    if name in NODE_CONTAINERD:
        return _node_containerd() / name
    return Path(os.path.realpath(TOOLS_BIN / name))


@functools.cache
def _node_containerd() -> Path:
    """The bin directory of the containerd-vm build (asked once: every binary of it is there)."""
    done = subprocess.run([str(ROOT / "scripts" / "build-runtime.sh"), "--cached", "containerd-vm"],
                          capture_output=True, text=True)
    return Path(done.stdout.strip()) if done.returncode == 0 else Path("containerd-vm (not built)")


def cached() -> Image | None:
    out = CACHE / _key()
    return _image(out) if (out / ".done").exists() else None


def _key() -> str:
    return hashlib.sha256(json.dumps(_inputs(), sort_keys=True).encode()).hexdigest()[:16]


def _image(out: Path) -> Image:
    return Image(out / "disk.raw", out / "vmlinuz", out / "initrd.img")


def build(log: Path | None = None) -> Image:
    """The cached image, built first if any input changed (a few minutes: mostly downloads)."""
    missing = missing_tools()
    if missing:
        raise RuntimeError("the VM image needs: " + ", ".join(missing) + " (run scripts/setup.sh vm)")
    out = CACHE / _key()
    if (out / ".done").exists():
        return _image(out)
    CACHE.mkdir(parents=True, exist_ok=True)
    for old in CACHE.iterdir():  # one image at a time: each is about 1.2 GB
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix="crirm-vmimage-", dir=CACHE))
    logf = open(log or work / "build.log", "ab")
    try:
        _build_into(work, logf)
        out.mkdir()
        for name in ("disk.raw", "vmlinuz", "initrd.img"):
            os.replace(work / name, out / name)
        (out / "inputs.json").write_text(json.dumps(_inputs(), indent=1, sort_keys=True))
        (out / ".done").touch()
        return _image(out)
    finally:
        logf.close()
        shutil.rmtree(work, ignore_errors=True)


def _run(cmd: list[str], logf: object) -> None:
    logf.write(f"+ {' '.join(cmd)}\n".encode())  # type: ignore[attr-defined]
    logf.flush()  # type: ignore[attr-defined]
    done = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT)  # type: ignore[arg-type]
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed (exit {done.returncode}); its output is in {logf.name}")  # type: ignore[attr-defined]


def _build_into(work: Path, logf: object) -> None:
    root = work / "root"
    staging = work / "staging"  # what the customize hook copies in
    (staging / "bin").mkdir(parents=True)
    for b in GO_BINARIES:
        shutil.copy2(_binary(b), staging / "bin" / b)
    (staging / "images").mkdir()
    images.cache_dir().mkdir(parents=True, exist_ok=True)
    for archive in (images.build_pause(images.cache_dir()), images.build_busybox(images.cache_dir())):
        shutil.copy2(archive, staging / "images" / archive.name)
    (staging / "requirements.txt").write_text("\n".join(python_dependencies()) + "\n")
    # Wheels fetched here, installed offline in the guest: the guest's pip trusts only Debian's CAs.
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "-w", str(staging / "wheels"),
          "-r", str(staging / "requirements.txt")], logf)
    shutil.copytree(GUEST_FILES, staging / "files", symlinks=True)
    hook = f"""set -e
r="$1"
cp -a {staging}/files/. "$r"/
install -m 0755 {staging}/bin/* "$r"/usr/local/bin/
mkdir -p "$r"/var/lib/crirm-images "$r"/opt/cri-resmgr/src "$r"/etc/kubernetes/kubelet.conf.d
cp {staging}/images/*.tar "$r"/var/lib/crirm-images/
chroot "$r" python3 -m venv /opt/cri-resmgr/venv
cp -r {staging}/wheels {staging}/requirements.txt "$r"/tmp/
chroot "$r" /opt/cri-resmgr/venv/bin/pip install -q --disable-pip-version-check --no-index \
    --find-links /tmp/wheels -r /tmp/requirements.txt
rm -r "$r"/tmp/wheels "$r"/tmp/requirements.txt
echo /opt/cri-resmgr/src > "$r"/opt/cri-resmgr/venv/lib/python3.11/site-packages/cri-resmgr.pth
chroot "$r" systemctl enable containerd.service crirm-images.service systemd-networkd.service
chroot "$r" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer \
    systemd-timesyncd.service getty@tty1.service
chroot "$r" update-initramfs -u -k all
passwd --root "$r" -d root
"""
    (work / "customize.sh").write_text(hook)
    _run(["mmdebstrap", "--mode=root", "--variant=minbase", "--include=" + ",".join(PACKAGES),
          "--customize-hook=sh " + str(work / "customize.sh") + ' "$1"',
          "--aptopt=Acquire::Retries=3", "--dpkgopt=path-exclude=/usr/share/doc/*",
          "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/locale/*",
          SUITE, str(root)], logf)
    boot = root / "boot"
    kernel = next(boot.glob("vmlinuz-*"))
    shutil.copy2(kernel, work / "vmlinuz")
    shutil.copy2(boot / kernel.name.replace("vmlinuz", "initrd.img"), work / "initrd.img")
    _run(["mkfs.ext4", "-q", "-F", "-L", "crirm-root", "-d", str(root), str(work / "disk.raw"), DISK_SIZE], logf)
    shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    if sys.argv[1:] == ["--cached"]:  # is the image of these inputs built?
        image = cached() if not missing_tools() else None
        if image is not None:
            print(image.disk.parent)
        return 0 if image is not None else 1
    log = CACHE / "build.log"
    CACHE.mkdir(parents=True, exist_ok=True)
    if cached() is None:
        print(f"vmimage: building the test node image (log: {log})", file=sys.stderr)
    image = build(log)
    print(image.disk.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
