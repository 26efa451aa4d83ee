#!/usr/bin/env python3
"""Build the cri-resmgr container image without a container engine or a registry.

    scripts/build-image.py [OUTDIR]     writes OUTDIR/cri-resmgr-<version>.oci.tar (default: dist/)
    scripts/build-image.py --cached     exit 0 if the base layers are built already

The image is the one the Containerfile describes, made from Debian's packages and PyPI only:

1. the base: Debian 12 minbase with the final stage's packages (mmdebstrap), its RUN command
   without the apt-get parts (the user) run in it;
2. the Python dependencies in /opt/cri-resmgr/venv, binary wheels only, made with Debian's
   python3.11 where the image has it (a private mount namespace shows the venv at
   /opt/cri-resmgr), with pip and setuptools removed;
3. the project itself, installed into that venv.

umoci writes the layers and the configuration (the final stage's USER, ENV, LABEL and CMD) as an
OCI image layout, archived as a tar that `ctr images import` and `skopeo copy oci-archive:` read,
tagged with the project's version. Layers 1 and 2 are cached under
~/.cache/cri-resmgr/image/<hash of their inputs>; a change of code rebuilds layer 3 only.
Needs root, mmdebstrap, umoci and Debian's python3.11 with python3-venv (scripts/setup.sh test).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONTAINERFILE = ROOT / "Containerfile"
CACHE = Path(os.environ.get("CRI_RESMGR_CACHE", Path.home() / ".cache" / "cri-resmgr")) / "image"
SUITE = "bookworm"
VENV = "/opt/cri-resmgr/venv"
PYTHON = "/usr/bin/python3.11"  # Debian 12's, the one the image has
TAG = "base"


class BuildError(RuntimeError):
    pass


def final_stage(text: str) -> list[tuple[str, str]]:
    """(instruction, arguments) of the Containerfile's last stage, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    steps: list[tuple[str, str]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            steps = []
        steps.append((word.upper(), rest.strip()))
    return steps


def packages(stage: list[tuple[str, str]]) -> list[str]:
    """The packages the stage's `apt-get install` commands name."""
    out: list[str] = []
    for word, rest in stage:
        if word != "RUN":
            continue
        for part in rest.split("&&"):
            args = shlex.split(part)
            if args[:2] == ["apt-get", "install"]:
                out += [a for a in args[2:] if not a.startswith("-")]
    return out


def setup_commands(stage: list[tuple[str, str]]) -> list[str]:
    """The stage's RUN commands but apt-get's: mmdebstrap installed the packages already."""
    return [part.strip() for word, rest in stage if word == "RUN" for part in rest.split("&&")
            if not part.strip().startswith("apt-get")]


def config_args(stage: list[tuple[str, str]]) -> list[str]:
    """umoci config arguments for the stage's USER, ENV, LABEL and CMD (exec form)."""
    args = ["--clear=config.env", "--clear=config.labels", "--clear=config.cmd", "--clear=config.entrypoint"]
    for word, rest in stage:
        if word == "USER":
            args.append(f"--config.user={rest}")
        elif word == "ENV":
            for item in shlex.split(rest):
                args.append(f"--config.env={item}")
        elif word == "LABEL":
            for item in shlex.split(rest):
                args.append(f"--config.label={item}")
        elif word == "CMD":
            args += [f"--config.cmd={a}" for a in json.loads(rest)]
    return args


def dependencies() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def base_key(stage: list[tuple[str, str]]) -> str:
    inputs = {"suite": SUITE, "packages": packages(stage), "setup": setup_commands(stage),
              "python": dependencies(), "builder": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def run(cmd: list[str], log: Path, **kwargs: object) -> None:
    with open(log, "ab") as f:
        f.write(f"+ {shlex.join(cmd)}\n".encode())
        f.flush()
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise BuildError(f"{cmd[0]} failed (exit {done.returncode}); its output is in {log}")


def in_venv(venv_root: Path, script: str, log: Path, *args: str) -> None:
    """Run a shell script with venv_root/opt/cri-resmgr shown at /opt/cri-resmgr (private mount namespace)."""
    Path("/opt/cri-resmgr").mkdir(parents=True, exist_ok=True)
    try:
        # Without the caller's PYTHONPATH: a source tree on it (with the egg-info a wheel build leaves)
        # reads to pip as the project installed already, and it would install nothing.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        run(["unshare", "--mount", "--propagation", "private", "sh", "-euc",
             f'mount --bind "$1" /opt/cri-resmgr; shift; {script}', "sh",
             str(venv_root / "opt" / "cri-resmgr"), *args], log, env=env)
    finally:
        try:
            Path("/opt/cri-resmgr").rmdir()
        except OSError:
            pass


def build_base(stage: list[tuple[str, str]], out: Path, log: Path) -> None:
    """Layers 1 and 2 as the OCI layout out/oci (tag base), and the venv beside it in out/venv."""
    work = Path(tempfile.mkdtemp(prefix="crirm-image-", dir=out.parent))
    try:
        rootfs = work / "rootfs"
        setup = " && ".join(setup_commands(stage)) or "true"
        # The merged-usr hook makes /bin etc. links itself, as Debian's own images are made, instead
        # of installing usrmerge (which pulls in Perl).
        run(["mmdebstrap", "--mode=root", "--variant=minbase", "--include=" + ",".join(packages(stage)),
             "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
             "--aptopt=Acquire::Retries=3", "--dpkgopt=path-exclude=/usr/share/doc/*",
             "--dpkgopt=path-include=/usr/share/doc/*/copyright", "--dpkgopt=path-exclude=/usr/share/man/*",
             "--dpkgopt=path-exclude=/usr/share/locale/*", "--dpkgopt=path-exclude=/usr/share/info/*",
             f"--customize-hook=chroot \"$1\" sh -euc {shlex.quote(setup)}",
             "--customize-hook=rm -rf \"$1\"/var/cache/apt/* \"$1\"/var/lib/apt/lists/* \"$1\"/var/log/*",
             SUITE, str(rootfs)], log)
        venv_root = work / "venv"
        (venv_root / "opt" / "cri-resmgr").mkdir(parents=True)
        requirements = work / "requirements.txt"
        requirements.write_text("\n".join(dependencies()) + "\n")
        in_venv(venv_root, f'{PYTHON} -m venv {VENV}; '
                f'{VENV}/bin/pip install -q --disable-pip-version-check --no-cache-dir --only-binary=:all: -r "$1"; '
                f'{VENV}/bin/pip uninstall -q -y pip setuptools', log, str(requirements))
        oci = work / "oci"
        run(["umoci", "init", "--layout", str(oci)], log)
        run(["umoci", "new", "--image", f"{oci}:{TAG}"], log)
        run(["umoci", "insert", "--image", f"{oci}:{TAG}", str(rootfs), "/"], log)
        run(["umoci", "insert", "--image", f"{oci}:{TAG}", str(venv_root / "opt"), "/opt"], log)
        shutil.rmtree(rootfs)
        out.mkdir()
        os.replace(oci, out / "oci")
        os.replace(venv_root, out / "venv")
        (out / ".done").touch()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def cached_base(stage: list[tuple[str, str]], log: Path) -> Path:
    out = CACHE / base_key(stage)
    if (out / ".done").exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    for old in CACHE.iterdir():  # one base at a time
        if old.is_dir() and old.name not in ("tools", "out"):
            shutil.rmtree(old, ignore_errors=True)
    print(f"build-image: building the base layers (a few minutes; log: {log})", file=sys.stderr)
    build_base(stage, out, log)
    return out


def tool_python(log: Path) -> str:
    """A Python with pip and setuptools for building the project's wheel: a venv of Debian's
    python3.11 in the cache (its bundled pip: no download), whatever Python runs this script."""
    venv = CACHE / "tools"
    if not (venv / "bin" / "pip").exists():
        shutil.rmtree(venv, ignore_errors=True)
        run([PYTHON, "-m", "venv", str(venv)], log)
    return str(venv / "bin" / "python")


def build(outdir: Path, log: Path | None = None) -> Path:
    """The image archive outdir/cri-resmgr-<version>.oci.tar; returns its path."""
    for tool in ("mmdebstrap", "umoci", "unshare"):
        if shutil.which(tool) is None:
            raise BuildError(f"build-image: {tool} is needed (scripts/setup.sh test installs it)")
    if not os.access(PYTHON, os.X_OK):
        raise BuildError(f"build-image: Debian's {PYTHON} is needed (apt-get install python3-venv)")
    stage = final_stage(CONTAINERFILE.read_text())
    CACHE.mkdir(parents=True, exist_ok=True)
    log = log or CACHE / "build.log"
    base = cached_base(stage, log)
    outdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="crirm-image-", dir=CACHE))
    try:
        oci = work / "oci"
        shutil.copytree(base / "oci", oci)
        wheels, stage_root = work / "wheel", work / "project"
        python = tool_python(log)
        # setuptools builds in the tree (build/, *.egg-info): one wheel build of a tree at a time
        # (scripts/build-deb.sh takes the same lock, on the tree's directory).
        run(["flock", str(ROOT), python, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
             "-w", str(wheels), str(ROOT)], log)
        wheel = next(wheels.glob("*.whl"))
        # The project into the cached venv's place, written under stage_root only; this pip runs
        # under the venv's interpreter (--python), so paths and script lines are the image's.
        in_venv(base / "venv", f'"$3" -m pip --python {VENV}/bin/python install -q --disable-pip-version-check '
                f'--no-deps --no-index --no-warn-script-location --root "$1" "$2"',
                log, str(stage_root), str(wheel), python)
        version_tag = version()
        run(["umoci", "tag", "--image", f"{oci}:{TAG}", version_tag], log)
        run(["umoci", "rm", "--image", f"{oci}:{TAG}"], log)
        run(["umoci", "insert", "--image", f"{oci}:{version_tag}", str(stage_root / "opt"), "/opt"], log)
        run(["umoci", "config", "--image", f"{oci}:{version_tag}", "--os=linux", "--architecture=amd64",
             *config_args(stage)], log)
        run(["umoci", "gc", "--layout", str(oci)], log)
        archive = outdir / f"cri-resmgr-{version_tag}.oci.tar"
        partial = archive.with_suffix(".partial")
        run(["tar", "-C", str(oci), "-cf", str(partial), "oci-layout", "index.json", "blobs"], log)
        os.replace(partial, archive)
        return archive
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if sys.argv[1:] == ["--cached"]:  # are the base layers of these inputs built?
        return 0 if (CACHE / base_key(final_stage(CONTAINERFILE.read_text())) / ".done").exists() else 1
    outdir = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "dist").resolve()
    try:
        print(build(outdir))
    except BuildError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
