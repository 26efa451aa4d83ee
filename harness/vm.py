"""Boot the test node as a virtual machine and run commands in it.

The guest is shaped like a production node: systemd as init, cgroup v2 only, containerd with
the systemd cgroup driver, and the CPU and memory topology asked for (by default nri-plugins'
`n4c16` end-to-end machine: 2 packages x 2 NUMA nodes x 2 cores x 2 threads, memory split
over the nodes). qemu emulates it with TCG: nested KVM does not work on the machines the
project is tested on.

The host reaches the guest only through a virtio serial channel served by qemu-guest-agent
(commands and files); the guest has no network device at all. The disk is a copy-on-write
overlay of the cached image (harness/vmimage.py), and a second small disk carries the
project's code as it is now, mounted at /opt/cri-resmgr/src.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from harness import vmimage
from harness.kube import DIE_WITH_PARENT

ROOT = Path(__file__).resolve().parent.parent
HOST_ADDRESS = "10.0.2.100"  # where the guest finds the forwarded host ports


@dataclass(frozen=True)
class Shape:
    """CPU and memory topology of the guest. qemu numbers CPUs linearly (a core's threads
    adjacent) and gives each NUMA node an equal run of them."""

    sockets: int = 2
    nodes_per_socket: int = 2
    cores_per_node: int = 2
    threads: int = 2
    memory_per_node_mb: int = 768

    @property
    def nodes(self) -> int:
        return self.sockets * self.nodes_per_socket

    @property
    def cpus(self) -> int:
        return self.nodes * self.cores_per_node * self.threads

    def machine(self) -> str:
        """The same machine for `cri-resmgr simulate --machine`."""
        return (f"sockets={self.sockets},nodes={self.nodes_per_socket},cores={self.cores_per_node},"
                f"threads={self.threads},numbering=linear")

    def node_cpus(self, node: int) -> str:
        per = self.cores_per_node * self.threads
        return f"{node * per}-{node * per + per - 1}"

    def distance(self, a: int, b: int) -> int:
        # As resmgr.topology.generate writes them: 11 within a package, 21 across.
        if a == b:
            return 10
        return 11 if a // self.nodes_per_socket == b // self.nodes_per_socket else 21

    def qemu_args(self) -> list[str]:
        args = ["-smp", f"{self.cpus},sockets={self.sockets},cores={self.cpus // self.sockets // self.threads},"
                        f"threads={self.threads}",
                "-m", f"{self.memory_per_node_mb * self.nodes}M"]
        for n in range(self.nodes):
            args += ["-object", f"memory-backend-ram,id=mem{n},size={self.memory_per_node_mb}M",
                     "-numa", f"node,nodeid={n},cpus={self.node_cpus(n)},memdev=mem{n}"]
        for a, b in itertools.combinations(range(self.nodes), 2):
            args += ["-numa", f"dist,src={a},dst={b},val={self.distance(a, b)}"]
        return args


class GuestError(RuntimeError):
    pass


@dataclass
class Result:
    code: int
    out: str
    err: str

    def check(self, what: str) -> str:
        if self.code != 0:
            raise GuestError(f"{what}: exit {self.code}\n{self.out}{self.err}")
        return self.out


class Agent:
    """A client of qemu-guest-agent's JSON protocol on the virtio serial channel."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock: socket.socket | None = None
        self._buf = b""
        self._ids = itertools.count(int(time.time()) % 100000)
        self._lock = threading.Lock()  # one exchange at a time: threads share the channel

    def connect(self, timeout: float) -> None:
        """Wait until the agent in the guest answers (it starts late in boot)."""
        deadline = time.monotonic() + timeout
        while True:
            self.close()
            try:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.connect(str(self.path))
                sync = next(self._ids)
                # The agent answers a sync only once it runs; what came before is stale.
                self._send({"execute": "guest-sync-delimited", "arguments": {"id": sync}})
                if self._read(min(5.0, max(0.1, deadline - time.monotonic())), sync=sync) == sync:
                    return
            except (OSError, TimeoutError, GuestError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the guest agent did not answer within {timeout:.0f} s")
            time.sleep(1)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock, self._buf = None, b""

    def _send(self, msg: dict) -> None:
        assert self.sock is not None
        self.sock.sendall(json.dumps(msg).encode() + b"\n")

    def _read(self, timeout: float, sync: int | None = None) -> object:
        assert self.sock is not None
        deadline = time.monotonic() + timeout
        while True:
            if sync is not None and b"\xff" in self._buf:  # guest-sync-delimited's marker
                self._buf = self._buf[self._buf.rindex(b"\xff") + 1:]
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                if not line.strip():
                    continue
                reply = json.loads(line)
                if "error" in reply:
                    raise GuestError(reply["error"].get("desc", str(reply["error"])))
                if sync is None or reply.get("return") == sync:
                    return reply.get("return")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the guest agent did not answer")
            self.sock.settimeout(left)
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise GuestError("the guest agent closed the channel")
            self._buf += chunk

    def call(self, command: str, timeout: float = 30.0, **arguments: object) -> object:
        with self._lock:
            self._send({"execute": command, "arguments": arguments} if arguments else {"execute": command})
            return self._read(timeout)


def _compile(tree: Path, guest_path: str) -> None:
    """Bytecode for the guest's Python (Debian 12's 3.11), made here: the code's disk is read-only,
    so without it every command the tests run in the guest compiles the modules it imports anew,
    seconds each under emulation. Hash-checked, so it holds whatever the files' times."""
    python = shutil.which("python3.11") or "/usr/bin/python3.11"
    if not os.access(python, os.X_OK):
        return  # the guest compiles for itself, slowly
    subprocess.run([python, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "checked-hash",
                    "-s", str(tree), "-p", guest_path, str(tree)], check=True, capture_output=True)


class Vm:
    """One boot of the test node. Use as a context manager, or start() and stop()."""

    def __init__(self, image: vmimage.Image, shape: Shape | None = None, workdir: Path | None = None,
                 cmdline: str = "", forwards: dict[int, int] | None = None,
                 files: dict[str, Path] | None = None) -> None:
        """forwards: guest port -> host port; the guest reaches host_port on the host's loopback as
        HOST_ADDRESS:guest_port, and nothing else (qemu's restricted user-mode network).
        files: name -> host file, put beside the code in /opt/cri-resmgr/src."""
        self.image = image
        self.files = files or {}
        self.forwards = forwards or {}
        self.shape = shape or Shape()
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="crirm-vm-"))
        self.console = self.dir / "console.log"
        self.cmdline = cmdline
        self.proc: subprocess.Popen[bytes] | None = None
        self.agent = Agent(self.dir / "qga.sock")
        self.boot_seconds = 0.0

    def project_disk(self) -> Path:
        """A small ext4 disk with the project's code as it is now (seconds to make)."""
        src = self.dir / "src"
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(ROOT / "resmgr", src / "resmgr",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copytree(ROOT / "config", src / "config", ignore=shutil.ignore_patterns("__pycache__"))
        _compile(src / "resmgr", "/opt/cri-resmgr/src/resmgr")
        for name, path in self.files.items():
            shutil.copy2(path, src / name)
        size = 64 + sum(p.stat().st_size for p in self.files.values()) // (1 << 20)
        disk = self.dir / "src.img"
        subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "crirm-src", "-d", str(src), str(disk), f"{size}M"],
                       check=True, capture_output=True)
        return disk

    def start(self, timeout: float = 300.0) -> Vm:
        overlay = self.dir / "root.qcow2"
        if not overlay.exists():  # a second start() of the same Vm keeps its disk: a reboot
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(self.image.disk),
                            str(overlay)], check=True)
        src = self.project_disk()
        append = ("root=/dev/vda rw console=ttyS0 mitigations=off tsc=reliable panic=-1 "
                  "systemd.unified_cgroup_hierarchy=1 " + self.cmdline)
        cmd = ["qemu-system-x86_64", "-accel", "tcg,thread=single,tb-size=512", "-machine", "q35",
               "-cpu", "max,vendor=GenuineIntel", *self.shape.qemu_args(),
               "-kernel", str(self.image.kernel), "-initrd", str(self.image.initrd), "-append", append.strip(),
               "-drive", f"file={overlay},if=virtio,format=qcow2,cache=unsafe",
               "-drive", f"file={src},if=virtio,format=raw,readonly=on",
               *self._network(), "-display", "none", "-no-reboot", "-serial", f"file:{self.console}",
               "-monitor", "none", "-device", "virtio-serial",
               "-chardev", f"socket,path={self.agent.path},server=on,wait=off,id=qga0",
               "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0"]
        (self.dir / "qemu.cmd").write_text(" ".join(cmd) + "\n")
        started = time.monotonic()
        log = open(self.dir / "qemu.log", "ab")
        # -no-reboot: a reboot inside the guest ends qemu; reboot() starts it again on the same disk.
        self.proc = subprocess.Popen([*DIE_WITH_PARENT, *cmd], stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        try:
            deadline = time.monotonic() + timeout
            while not self.agent.path.exists():
                self._alive()
                if time.monotonic() > deadline:
                    raise TimeoutError("qemu made no agent socket")
                time.sleep(0.2)
            self.agent.connect(max(1.0, deadline - time.monotonic()))
            self.wait_system(max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        self.boot_seconds = time.monotonic() - started
        return self

    def _network(self) -> list[str]:
        if not self.forwards:
            return ["-nic", "none"]
        # A chardev target would carry one connection for qemu's whole life; cmd: spawns a relay per
        # connection (busybox nc, to the host's loopback only).
        nc = shutil.which("busybox") or "busybox"
        rules = ",".join(f"guestfwd=tcp:{HOST_ADDRESS}:{g}-cmd:{nc} nc 127.0.0.1 {h}" for g, h in self.forwards.items())
        return ["-nic", f"user,model=virtio-net-pci,restrict=on,{rules}"]

    def _alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise GuestError(f"qemu exited ({self.proc.returncode if self.proc else None}); "
                             f"see {self.dir / 'qemu.log'} and {self.console}:\n{self.console_tail()}")

    def console_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.console.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_system(self, timeout: float) -> None:
        """Until systemd has finished starting the units of the boot."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.run("systemctl is-system-running --wait", timeout=max(5.0, deadline - time.monotonic()))
            if state.out.strip() in ("running", "degraded"):
                if state.out.strip() == "degraded":
                    failed = self.run("systemctl --failed --no-legend --plain").out.strip()
                    raise GuestError(f"units failed at boot:\n{failed}")
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the guest did not finish booting: {state.out.strip()}")
            time.sleep(1)

    def run(self, command: str, timeout: float = 120.0, input: bytes | None = None) -> Result:
        """Run a shell command in the guest as root; its exit code and output."""
        self._alive()
        args: dict[str, object] = {"path": "/bin/sh", "arg": ["-c", command], "capture-output": True}
        if input is not None:
            args["input-data"] = base64.b64encode(input).decode()
        pid = self.agent.call("guest-exec", **args)["pid"]  # type: ignore[index]
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            status = self.agent.call("guest-exec-status", pid=pid)
            if status["exited"]:  # type: ignore[index]
                break
            if time.monotonic() > deadline:
                self.run(f"kill -9 {pid}", timeout=10)
                raise TimeoutError(f"in the guest, {command!r} ran over {timeout:.0f} s")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

        def text(key: str) -> str:
            return base64.b64decode(status.get(key, "")).decode(errors="replace")  # type: ignore[union-attr]

        return Result(status.get("exitcode", -status.get("signal", 1)), text("out-data"), text("err-data"))  # type: ignore[union-attr]

    def sh(self, command: str, timeout: float = 120.0) -> str:
        """Run and return the output; a failure raises with the output."""
        return self.run(command, timeout).check(command)

    def write(self, path: str, data: str | bytes) -> None:
        payload = data.encode() if isinstance(data, str) else data
        self.run(f"mkdir -p \"$(dirname {path})\" && cat > {path}", input=payload).check(f"writing {path}")

    def reboot(self, timeout: float = 300.0) -> None:
        """Reboot the guest as an operator would (systemd stops everything), then boot it again."""
        with contextlib.suppress(GuestError, OSError, TimeoutError):
            self.agent.call("guest-shutdown", mode="reboot")
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        self.stop()
        self.start(timeout)

    def stop(self) -> None:
        self.agent.close()
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None
        with contextlib.suppress(FileNotFoundError):
            self.agent.path.unlink()

    def __enter__(self) -> Vm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
