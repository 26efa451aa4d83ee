"""Released versions of the project, built from git for upgrade and rollback tests.

A release is a commit named in CHANGELOG.md under its heading ("## 0.1.0 (commit 2674665)").
`previous()` is the newest release older than the working tree's version (or the newest one
while the tree's version is still that release's, before the next is cut); `install()` builds it
into a virtual environment of its own, cached by commit under ~/.cache/cri-resmgr/releases.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.containerd import TOOLS_BIN

ROOT = Path(__file__).resolve().parents[1]
HEADING = re.compile(r"^## (\d+\.\d+\.\d+) \(commit ([0-9a-f]{7,40})\)", re.MULTILINE)


@dataclass(frozen=True)
class Release:
    version: str
    commit: str
    home: Path  # its source tree and virtual environment

    @property
    def src(self) -> Path:
        return self.home / "src"

    @property
    def bin(self) -> Path:
        return self.home / "venv" / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"


def releases() -> list[tuple[str, str]]:
    """(version, commit) of every release in the changelog, newest first."""
    return HEADING.findall((ROOT / "CHANGELOG.md").read_text())


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def previous() -> tuple[str, str]:
    """The release to upgrade from: the newest one older than the tree, else the newest."""
    from resmgr import __version__

    found = releases()
    if not found:
        raise LookupError("CHANGELOG.md names no release")
    current = _key(__version__.split(".dev")[0].split("-")[0])
    older = [(v, c) for v, c in found if _key(v) < current]
    return older[0] if older else found[0]


def in_git(commit: str) -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True).returncode == 0


def install(version: str, commit: str) -> Release:
    """The release built from git into its own virtual environment (cached)."""
    full = subprocess.run(["git", "-C", str(ROOT), "rev-parse", f"{commit}^{{commit}}"], capture_output=True,
                          text=True, check=True).stdout.strip()
    rel = Release(version, full, TOOLS_BIN.parent / "releases" / f"{version}-{full[:12]}")
    if (rel.home / "done").exists():
        return rel
    shutil.rmtree(rel.home, ignore_errors=True)
    rel.src.mkdir(parents=True)
    with tempfile.TemporaryFile() as archive:
        subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", full], stdout=archive, check=True)
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            tar.extractall(rel.src, filter="data")
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run([str(base), "-m", "venv", str(rel.home / "venv")], check=True)
    subprocess.run([str(rel.python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(rel.src)],
                   check=True, timeout=1200)
    (rel.home / "done").write_text(full + "\n")
    return rel


def built(out: Path, pattern: str, cmd: list[str], cwd: Path, what: str) -> Path:
    """The file a release's own build script made in out (cached: made once); its path is the last
    line the script prints."""
    with _locked():
        found = sorted(out.glob(pattern))
        if found:
            return found[0]
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"building {what}: {done.stderr[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def deb(rel: Release) -> Path:
    """The release's Debian package, built by its own script (cached beside it)."""
    venv = rel.src / ".venv"  # the script builds the wheel with the tree's own environment
    if not venv.exists():
        venv.symlink_to(rel.home / "venv")
    out = rel.home / "deb"
    return built(out, "cri-resmgr_*.deb", ["scripts/build-deb.sh", str(out)], rel.src,
                 f"the package of {rel.version}")


def fetched(commit: str) -> bool:
    """The commit in this clone, fetched from its origin when the clone is shallow (as CI's may be)."""
    if in_git(commit):
        return True
    git = ["git", "-C", str(ROOT)]
    shallow = subprocess.run([*git, "rev-parse", "--is-shallow-repository"], capture_output=True, text=True)
    if shallow.stdout.strip() != "true":
        return False
    try:
        subprocess.run([*git, "fetch", "--quiet", "--unshallow"], capture_output=True, timeout=300)
    except subprocess.TimeoutExpired:
        return False
    return in_git(commit)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One process at a time fetches and builds releases (the VM tier runs beside the suite)."""
    where = TOOLS_BIN.parent / "releases"
    where.mkdir(parents=True, exist_ok=True)
    fd = os.open(where, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def previous_installed() -> Release | None:
    """The previous release built, or None when its commit cannot be had in this clone."""
    version, commit = previous()
    with _locked():
        return install(version, commit) if fetched(commit) else None
